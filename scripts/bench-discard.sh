#!/usr/bin/env bash
# Seed 002's experiment on ext4kit's engine: worst-case commit latency after
# deleting many fragmented files on a device whose discards take a few ms
# each (a latency-injecting DelayDevice over a sparse image file), with the
# freed extents discarded
#   - not at all (nodiscard, the baseline commit),
#   - one by one on the commit path (the kernel before seed 002),
#   - all at once on N threads and waited for at commit (seed 002's patch),
#   - by ext4kit's -o discard: queued at commit, issued by N threads,
#     never waited for (plus the time until the last discard finished).
# Modes are interleaved run by run; medians are reported. The machine's
# load is printed first (other builds may share the CPUs).
#
# The report (markdown) goes to stdout.
#
# Environment:
#   BENCH_DIR      where the image goes (default /dev/shm, else $TMPDIR)
#   BENCH_FILES    files written interleaved (default 64; half deleted)
#   BENCH_BLOCKS   blocks per file (default 64: 2048 single-block discards)
#   BENCH_DELAY_MS per-discard latency (default 5)
#   BENCH_WORKERS  discards in flight (default 8)
#   BENCH_RUNS     runs per mode (default 3)
#   BENCH_FLUSH_MS latency of each device flush (default 2; two per commit)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BENCH_DIR:-}
if [[ -z $dir ]]; then
    if [[ -d /dev/shm && -w /dev/shm ]]; then dir=/dev/shm; else dir=${TMPDIR:-/tmp}; fi
fi
img=$(mktemp "$dir/ext4kit-discard-bench.XXXXXX")
mnt=
lo=
cleanup() {
    if [[ -n $mnt ]]; then umount "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true; fi
    if [[ -n $lo ]]; then losetup -d "$lo" 2>/dev/null || true; fi
    rm -f "$img"
}
trap cleanup EXIT
cargo build --release -q -p ext4kit-fs --example discard_bench >&2
echo "## machine"
echo
echo "- $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; image in $dir"
echo
target/release/examples/discard_bench "$img" \
    "${BENCH_FILES:-64}" "${BENCH_BLOCKS:-64}" "${BENCH_DELAY_MS:-5}" \
    "${BENCH_WORKERS:-8}" "${BENCH_RUNS:-3}" "${BENCH_FLUSH_MS:-2}"
echo
echo "- load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"

# Thin space given back after a delete and an immediate unmount: the
# kernel with -o discard on a loop device (root only) against ext4kit's
# -o discard on the image file (close at once; crash + reopen).
mib=${BENCH_THIN_MIB:-1024}
echo
echo "## space given back after deleting $mib MiB and unmounting at once"
echo
target/release/examples/discard_bench thin "$img" "$mib"
if [[ $(id -u) == 0 ]] && command -v losetup >/dev/null; then
    mnt=$(mktemp -d)
    truncate -s 0 "$img"
    truncate -s $((mib * 2))M "$img"
    mke2fs -F -q -t ext4 -b 4096 -E nodiscard "$img"
    empty=$(( $(stat -c %b "$img") * 512 / 1048576 ))
    lo=$(losetup -f --show "$img")
    mount -o discard "$lo" "$mnt"
    dd if=/dev/urandom of="$mnt/big" bs=4M count=$((mib / 4)) conv=fsync status=none
    sync
    full=$(( $(stat -c %b "$img") * 512 / 1048576 ))
    rm "$mnt/big"
    sync
    umount "$mnt"
    rmdir "$mnt"
    mnt=
    losetup -d "$lo"
    lo=
    after=$(( $(stat -c %b "$img") * 512 / 1048576 ))
    fsck=$(e2fsck -fn "$img" >/dev/null 2>&1 && echo clean || echo NOT clean)
    echo
    echo "| kernel $(uname -r) -o discard, loop | empty MiB | with data MiB | after rm, sync, umount MiB |"
    echo "|---|---:|---:|---:|"
    echo "| rm, sync, umount at once (e2fsck $fsck) | $empty | $full | $after |"
else
    echo
    echo "(kernel comparison skipped: needs root and losetup)"
fi
