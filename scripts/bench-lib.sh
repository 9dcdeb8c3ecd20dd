# Helpers shared by scripts/bench-{engine,lazyinit,mount}.sh. Source it
# (after `set -euo pipefail`, with BENCH_NAME set to the script's name and
# `sections` to " 1 2 ... ") and call bench_preflight. Loop devices
# attached with `attach` are recorded in `loops` (the caller's cleanup
# detaches them); a device whose discard was turned off with
# `no_discard` is removed and re-created when detached, so that nothing
# on the machine is left changed.

log() { printf '%s\n' "$*" >&2; }
die() { log "$BENCH_NAME: $*"; exit 1; }
want() { [[ $sections == *" $1 "* ]]; }

now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a - b}'; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
# "median (min–max)" of the arguments, 3 significant digits (whole numbers
# from 1000 on: IOPS), "-" when there are none.
med() { python3 - "$@" <<'PY'
import sys, statistics
v = [float(x) for x in sys.argv[1:]]
f = lambda x: f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
if not v: print("-")
elif len(v) == 1: print(f(v[0]))
else: print(f"{f(statistics.median(v))} ({f(min(v))}–{f(max(v))})")
PY
}

# Root and a free loop device, or say why not and exit 0 (a skip).
bench_preflight() {
    if [[ $(id -u) -ne 0 ]]; then
        echo "$BENCH_NAME: needs root (loop devices, mounts); skipped."
        exit 0
    fi
    if ! command -v losetup >/dev/null || [[ ! -e /dev/loop-control ]] || ! losetup -f >/dev/null 2>&1; then
        echo "$BENCH_NAME: no free loop device; skipped."
        exit 0
    fi
}

loops=()     # loop devices we attached
tainted=" "  # ... and those whose discard we turned off
attach() { # file -> sets $loop (recorded for cleanup); never in a subshell
    loop=$(losetup -f --show "$1")
    loops+=("$loop")
}
detach() {
    losetup -d "$1"
    local l keep=()
    for l in "${loops[@]}"; do [[ $l == "$1" ]] || keep+=("$l"); done
    loops=("${keep[@]}")
    if [[ $tainted == *" $1 "* ]]; then
        tainted=${tainted/ $1 / }
        loop_reset "${1#/dev/loop}"
    fi
}
loop_reset() { # loop number: remove + add (retry while udev still holds it)
    python3 - "$1" <<'PY' || log "warning: could not reset /dev/loop$1 (discard stays off until it is re-created)"
import fcntl, os, sys, time
n = int(sys.argv[1])
fd = os.open("/dev/loop-control", os.O_RDWR)
for _ in range(50):
    try:
        fcntl.ioctl(fd, 0x4C81, n)   # LOOP_CTL_REMOVE
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit(1)
fcntl.ioctl(fd, 0x4C80, n)           # LOOP_CTL_ADD
PY
}
no_discard() {
    echo 0 >"/sys/block/$(basename "$1")/queue/discard_max_bytes"
    tainted+="$1 "
}
