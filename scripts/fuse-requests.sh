#!/usr/bin/env bash
# Count the FUSE requests a command makes on one mount, by opcode, with
# the time each kind spends between the kernel sending it and the reply
# (the kernel's fuse:fuse_request_send / fuse:fuse_request_end
# tracepoints, recorded with `perf record`).
#
#   scripts/fuse-requests.sh MOUNTPOINT COMMAND [ARGS...]
#
# Only the requests of MOUNTPOINT's connection are counted (other FUSE
# mounts on the machine are left out). Needs root and perf. The table
# (markdown) goes to stdout: opcode, count, per cent of all, mean and
# total µs from send to reply (that includes the wait for a worker
# thread and the daemon's work, not the caller's wake-up after it).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 MOUNTPOINT COMMAND [ARGS...]" >&2
    exit 2
fi
mnt=$1
shift
command -v perf >/dev/null || { echo "fuse-requests: perf is required" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "fuse-requests: needs root" >&2; exit 1; }
# The connection id is the mount's st_dev (major << 20 | minor).
dev=$(findmnt -no MAJ:MIN -M "$mnt") || { echo "fuse-requests: $mnt is not a mount point" >&2; exit 1; }
conn=$(( (${dev%%:*} << 20) | ${dev##*:} ))

tmp=$(mktemp -d /tmp/fuse-requests.XXXXXX)
trap 'rm -rf -- "$tmp"' EXIT
perf record -q -a -m 1024 -o "$tmp/perf.data" \
    -e fuse:fuse_request_send -e fuse:fuse_request_end >/dev/null 2>&1 &
perf_pid=$!
sleep 1
rc=0
"$@" || rc=$?
sleep 0.5
kill -INT "$perf_pid"
wait "$perf_pid" || true
perf script -i "$tmp/perf.data" -F time,event,trace 2>/dev/null | python3 -c '
import re, sys
conn = int(sys.argv[1])
send = re.compile(r"([\d.]+):\s+fuse:fuse_request_send:\s+connection (\d+) req (\d+) opcode \d+ \((\w+)\)")
end = re.compile(r"([\d.]+):\s+fuse:fuse_request_end:\s+connection (\d+) req (\d+)")
pending, count, total = {}, {}, {}
for line in sys.stdin:
    m = send.search(line)
    if m:
        if int(m.group(2)) == conn:
            op = m.group(4).removeprefix("FUSE_")
            pending[m.group(3)] = (float(m.group(1)), op)
            count[op] = count.get(op, 0) + 1
        continue
    m = end.search(line)
    if m and int(m.group(2)) == conn and m.group(3) in pending:
        t0, op = pending.pop(m.group(3))
        total[op] = total.get(op, 0.0) + float(m.group(1)) - t0
n = sum(count.values())
print(f"| opcode | requests | % | mean µs | total s |")
print(f"|---|---|---|---|---|")
for op, c in sorted(count.items(), key=lambda kv: -kv[1]):
    t = total.get(op, 0.0)
    print(f"| {op} | {c} | {100 * c / max(n, 1):.1f} | {1e6 * t / c:.0f} | {t:.2f} |")
print(f"| all | {n} | 100 | {1e6 * sum(total.values()) / max(n, 1):.0f} | {sum(total.values()):.2f} |")
' "$conn"
exit "$rc"
