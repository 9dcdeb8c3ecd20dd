#!/usr/bin/env bash
# mkfs and lazyinit over NBD (issue 21): ext4kit against an export of
# BENCH_SIZE (default 1T) served by qemu-nbd on a sparse file and by nbdkit's
# file plugin, with and without the delay filter (1 ms on every read,
# write, zero, trim and block status), against mke2fs on the exported file
# and ext4kit on the file itself. Per row: wall time, requests and bytes
# written (nbdkit's stats filter; qemu-nbd counts nothing: "-"), and the
# server's allocation (the file's allocated bytes afterwards).
#
# Then the pipelining check: mkfs -E lazy_itable_init=0 over nbdkit with
# 1 ms latency and neither WRITE_ZEROES nor BLOCK_STATUS (nozero,
# noextents), so that the inode tables of a BENCH_PIPE_SIZE export
# (default 8G) go over the wire as 1 MiB writes: the default window of
# requests in flight against EXT4KIT_NBD_WINDOW=1 (one at a time).
#
# Then the latency-bound check: the default mkfs of BENCH_SIZE over nbdkit
# with 1 ms latency (many small metadata writes and BLOCK_STATUS requests),
# the default window (with write-behind) against EXT4KIT_NBD_WINDOW=1.
#
# Goals: pipelined throughput ≥ 8× one at a time; mkfs over NBD (1 ms)
# ≤ 1.2× ext4kit mkfs on the file.
#
# BENCH_NBD_LAZYINIT=0 leaves out the lazyinit rows (minutes at 1 TiB
# with 1 ms: lazyinit's default pacing).
#
#   BENCH_SIZE=1T BENCH_PIPE_SIZE=8G BENCH_RUNS=1 scripts/bench-nbd.sh
#
# Needs qemu-nbd (qemu-utils) and nbdkit (with the delay, stats, nozero and
# noextents filters); a row whose server is missing is left out. Builds
# the release binary unless EXT4KIT is set. Files go to BENCH_DIR (default
# a new directory under /var/tmp), removed at the end.
set -euo pipefail
BENCH_NAME=bench-nbd.sh
sections=" "
# shellcheck source=scripts/bench-lib.sh
source "$(dirname "$0")/bench-lib.sh"

SIZE=${BENCH_SIZE:-1T}
PIPE_SIZE=${BENCH_PIPE_SIZE:-8G}
RUNS=${BENCH_RUNS:-1}
UUID=01234567-89ab-cdef-0123-456789abcdef
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z ${EXT4KIT:-} ]]; then
    (cd "$root" && cargo build --release -q -p ext4kit-cli)
    EXT4KIT=$root/target/release/ext4kit
fi
command -v mke2fs >/dev/null || die "mke2fs missing"
have_qemu=0; command -v qemu-nbd >/dev/null && have_qemu=1
have_kit=0; command -v nbdkit >/dev/null && have_kit=1
[[ $have_qemu$have_kit != 00 ]] || { echo "$BENCH_NAME: neither qemu-nbd nor nbdkit; skipped."; exit 0; }

dir=${BENCH_DIR:-$(mktemp -d -p /var/tmp ext4kit-bench-nbd.XXXXXX)}
mkdir -p "$dir"
server=""
cleanup() {
    [[ -n $server ]] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
export E2FSPROGS_FAKE_TIME=1700000000
img=$dir/exported.img
sock=$dir/nbd.sock
stats=$dir/stats.txt

fresh() { rm -f "$img"; truncate -s "$1" "$img"; }
alloc() { echo $(( $(stat -c %b "$img") * 512 )); }
human() { numfmt --to=iec --suffix=B "$1"; }

wait_sock() {
    local i
    for i in $(seq 1 500); do [[ -S $sock ]] && return 0; sleep 0.01; done
    die "the server did not start"
}
# start qemu|kit|kit-delay [extra filters...]: sets $uri, $server
start() {
    local kind=$1; shift
    rm -f "$sock" "$stats"
    case $kind in
    qemu)
        qemu-nbd -f raw -x ex --persistent --discard=unmap -k "$sock" "$img" >/dev/null 2>&1 &
        uri="nbd+unix:///ex?socket=$sock" ;;
    kit|kit-delay)
        local f=(--filter=stats) a=()
        for x in "$@"; do f+=("--filter=$x"); done
        if [[ $kind == kit-delay ]]; then
            f+=(--filter=delay)
            a+=(rdelay=1ms wdelay=1ms delay-extents=1ms)
        fi
        nbdkit -f -U "$sock" "${f[@]}" file "$img" "${a[@]}" statsfile="$stats" >/dev/null 2>&1 &
        uri="nbd+unix:///?socket=$sock" ;;
    esac
    server=$!
    wait_sock
}
stop() {
    [[ -n $server ]] || return 0
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=""
}
# "N requests, W bytes written" from the stats file (after stop)
counts() {
    if [[ ! -s $stats ]]; then echo "- | -"; return; fi
    python3 - "$stats" <<'PY'
import re, sys
ops = 0; wbytes = 0.0; zbytes = 0.0
units = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
for line in open(sys.argv[1]):
    m = re.match(r"^(\w+): (\d+) ops, [\d.]+ s, ([\d.]+) (\w+)", line)
    if not m: continue
    kind, n, size, unit = m.group(1), int(m.group(2)), float(m.group(3)), m.group(4)
    if kind == "total": ops = n
    if kind == "write": wbytes = size * units.get(unit, 1)
    if kind == "zero": zbytes = size * units.get(unit, 1)
z = f" (+ {zbytes / (1 << 20):.0f} MiB WRITE_ZEROES)" if zbytes else ""
print(f"{ops} | {wbytes / (1 << 20):.2f} MiB{z}")
PY
}
timed() { # command... -> sets $secs (median of RUNS is taken by the caller)
    local t0; t0=$(now)
    "$@" >/dev/null
    secs=$(sub "$(now)" "$t0")
}

echo "# $BENCH_NAME: export $SIZE, pipelining $PIPE_SIZE, $(date -u +%FT%TZ), $(nproc) cores, load $(loadavg)"
echo "# ext4kit $("$EXT4KIT" --version | head -1); $(mke2fs -V 2>&1 | head -1); $(qemu-nbd --version 2>/dev/null | head -1); $(nbdkit --version 2>/dev/null)"
echo
mkfs_ek=("$EXT4KIT" mkfs -q -U "$UUID" -E "hash_seed=$UUID")
mkfs_eager=("$EXT4KIT" mkfs -q -U "$UUID" -E "hash_seed=$UUID,lazy_itable_init=0,nodiscard")

# --- mkfs --------------------------------------------------------------
echo "## mkfs of $SIZE"
echo
echo "| target | wall s | requests | written | server allocation |"
echo "|---|---|---|---|---|"
declare -A wall
row() { # label kind(file|qemu|kit|kit-delay) command-prefix...
    local label=$1 kind=$2; shift 2
    local t=() c="- | -" a=0 r
    for r in $(seq 1 "$RUNS"); do
        fresh "$SIZE"
        if [[ $kind == file ]]; then
            timed "$@" "$img"
        else
            start "$kind"
            timed "$@" "$uri"
            stop
            c=$(counts)
        fi
        t+=("$secs")
        a=$(alloc)
    done
    wall[$label]=$(median "${t[@]}")
    echo "| $label | $(med "${t[@]}") | $c | $(human "$a") |"
}
row "mke2fs on the file" file mke2fs -q -F -t ext4 -U "$UUID" -E "hash_seed=$UUID"
row "ext4kit on the file" file "${mkfs_ek[@]}"
((have_qemu)) && row "ext4kit over qemu-nbd" qemu "${mkfs_ek[@]}"
((have_kit)) && row "ext4kit over nbdkit" kit "${mkfs_ek[@]}"
((have_kit)) && row "ext4kit over nbdkit, 1 ms" kit-delay "${mkfs_ek[@]}"
echo
if [[ -n ${wall["ext4kit over nbdkit, 1 ms"]:-} ]]; then
    echo "mkfs over NBD with 1 ms / ext4kit on the file: $(awk -v a="${wall["ext4kit over nbdkit, 1 ms"]}" -v b="${wall["ext4kit on the file"]}" 'BEGIN{printf "%.2f", a / b}')× (goal ≤ 1.2×)"
    echo
fi

# --- lazyinit ----------------------------------------------------------
# The image mke2fs made (nodiscard: inode tables left to lazy init), copied sparsely
# for each row. Over an export that reports zeros (BLOCK_STATUS) the
# groups are skipped; with noextents every table is zeroed by WRITE_ZEROES.
echo "## lazyinit of $SIZE (mke2fs's image)"
echo
echo "| target | wall s | requests | written | server allocation |"
echo "|---|---|---|---|---|"
ref=$dir/ref.img
rm -f "$ref"; truncate -s "$SIZE" "$ref"
mke2fs -q -F -t ext4 -U "$UUID" -E "hash_seed=$UUID,lazy_itable_init=1,nodiscard" "$ref"
lrow() { # label kind [filters...]
    local label=$1 kind=$2; shift 2
    local t=() c="- | -" a=0 r
    for r in $(seq 1 "$RUNS"); do
        rm -f "$img"; cp --sparse=always "$ref" "$img"
        if [[ $kind == file ]]; then
            timed "$EXT4KIT" lazyinit -q "$img"
        else
            start "$kind" "$@"
            timed "$EXT4KIT" lazyinit -q "$uri"
            stop
            c=$(counts)
        fi
        t+=("$secs")
        a=$(alloc)
    done
    echo "| $label | $(med "${t[@]}") | $c | $(human "$a") |"
}
if [[ ${BENCH_NBD_LAZYINIT:-1} != 0 ]]; then
    lrow "ext4kit on the file" file
    ((have_qemu)) && lrow "ext4kit over qemu-nbd" qemu
    ((have_kit)) && lrow "ext4kit over nbdkit, 1 ms" kit-delay
    ((have_kit)) && lrow "ext4kit over nbdkit, 1 ms, no BLOCK_STATUS" kit-delay noextents
else
    echo "| (left out: BENCH_NBD_LAZYINIT=0) | | | | |"
fi
echo

# --- pipelining --------------------------------------------------------
if ((have_kit)); then
    echo "## pipelining: $PIPE_SIZE, inode tables written as data, 1 ms latency"
    echo
    echo "| requests in flight | wall s | requests | written | MiB/s |"
    echo "|---|---|---|---|---|"
    declare -A tput
    for w in default 1; do
        t=(); c=""
        for r in $(seq 1 "$RUNS"); do
            fresh "$PIPE_SIZE"
            start kit-delay nozero noextents
            if [[ $w == 1 ]]; then
                timed env EXT4KIT_NBD_WINDOW=1 "${mkfs_eager[@]}" "$uri"
            else
                timed "${mkfs_eager[@]}" "$uri"
            fi
            stop
            c=$(counts)
            t+=("$secs")
        done
        s=$(median "${t[@]}")
        mib=$(echo "$c" | sed -n 's/.*| \([0-9.]*\) MiB.*/\1/p')
        tput[$w]=$(awk -v m="$mib" -v s="$s" 'BEGIN{printf "%.1f", m / s}')
        echo "| $w | $(med "${t[@]}") | $c | ${tput[$w]} |"
    done
    echo
    echo "pipelined / one at a time: $(awk -v a="${tput[default]}" -v b="${tput[1]}" 'BEGIN{printf "%.1f", a / b}')× (goal ≥ 8×)"
fi

# --- latency-bound: the default mkfs, window default vs 1 ----------------
if ((have_kit)); then
    echo
    echo "## latency-bound: mkfs of $SIZE over nbdkit, 1 ms latency"
    echo
    echo "| requests in flight | wall s | requests | written |"
    echo "|---|---|---|---|"
    declare -A lat
    for w in default 1; do
        t=(); c=""
        for r in $(seq 1 "$RUNS"); do
            fresh "$SIZE"
            start kit-delay
            if [[ $w == 1 ]]; then
                timed env EXT4KIT_NBD_WINDOW=1 "${mkfs_ek[@]}" "$uri"
            else
                timed "${mkfs_ek[@]}" "$uri"
            fi
            stop
            c=$(counts)
            t+=("$secs")
        done
        lat[$w]=$(median "${t[@]}")
        echo "| $w | $(med "${t[@]}") | $c |"
    done
    echo
    echo "one at a time / default: $(awk -v a="${lat[1]}" -v b="${lat[default]}" 'BEGIN{printf "%.1f", a / b}')× (goal ≥ 8×)"
fi
