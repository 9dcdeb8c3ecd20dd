#!/usr/bin/env bash
# Benchmark the read-write engine (`ext4kit fallocate`, `ext4kit cp -r`)
# against the kernel's ext4 through a loop mount, and e2tools' e2cp where
# installable, side by side in one run on this machine.
#
# Every image is made once per configuration by
#   E2FSPROGS_FAKE_TIME=... mke2fs -F -q -t ext4 -U UUID \
#       -E lazy_itable_init=1,nodiscard,hash_seed=SEED IMG
# on a fresh sparse file and copied (cp --sparse=always) before each run,
# so every contender starts from the same bytes.
#
# Sections:
#   1. fallocate: `ext4kit fallocate -l 50G IMG:/f` (the whole command:
#      open, allocate, commit, close; /f is created empty beforehand by
#      `ext4kit cp`, untimed) on a 1 TiB and a 16 TiB − 4 KiB image, against
#      the kernel's `fallocate -l 50G MNT/f` + `sync -f` (syncfs) on the
#      mounted image (mount -o noinit_itable, so its lazy-init thread does
#      not compete; mount and umount untimed, as in the issue's numbers).
#   2. copy: `ext4kit cp -r SRC IMG:/` of a tree of 100 000 small files
#      (100 directories × 1000 files, 1–4096 bytes) and of one 4 GiB file
#      (incompressible, no zeros) into a fresh 16 GiB image, against the
#      kernel (mount, cp -a SRC MNT/, umount: all timed) and e2tools'
#      `e2cp -a` (one e2cp for all files, names read from stdin; -a makes
#      the directories).
# Wall time (around the command, `date +%s.%N`), peak RSS (/usr/bin/time
# %M; not for the kernel), and `e2fsck -fn` after every run. Runs alternate
# the contenders' order; ratios are per run (same run's contenders),
# reported as median (min–max). The load average is printed before and
# after: the machine is shared, ratios side by side are what counts.
#
# The report (markdown) goes to stdout, progress to stderr.
#
# Environment:
#   BENCH_QUICK=1     small sizes to try the script in about a minute
#                     (fallocate 1G on 16 GiB / 256 GiB, 2000 files, a
#                     256 MiB file, 1 run)
#   BENCH_RUNS        runs per contender (default 3; quick 1)
#   BENCH_SECTIONS    which sections to run (default "1 2")
#   BENCH_E2CP_RUNS   e2cp runs per case (default 1: e2cp is slow)
#   BENCH_E2CP_TIMEOUT  seconds before an e2cp run is given up (default 300)
#   EXT4KIT           ext4kit binary (default target/release/ext4kit)
#
# Needs root and loop devices; otherwise it says so and exits 0.
# Only loop devices this script attached are used (always detached on exit);
# mounts are only under the temp work dir (always unmounted).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ext4kit=${EXT4KIT:-$repo/target/release/ext4kit}
quick=${BENCH_QUICK:-0}
if [[ $quick == 1 ]]; then runs=${BENCH_RUNS:-1}; else runs=${BENCH_RUNS:-3}; fi
sections=" ${BENCH_SECTIONS:-1 2} "
e2cp_runs=${BENCH_E2CP_RUNS:-1}
e2cp_timeout=${BENCH_E2CP_TIMEOUT:-300}
BENCH_NAME=bench-engine
# shellcheck source=scripts/bench-lib.sh
source "$repo/scripts/bench-lib.sh"
bench_preflight

for t in mke2fs e2fsck python3 findmnt fallocate /usr/bin/time; do
    command -v $t >/dev/null || die "$t is required"
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_RUNS must be a positive integer"
[[ $e2cp_runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_E2CP_RUNS must be a positive integer"
[[ $e2cp_timeout =~ ^[1-9][0-9]*$ ]] || die "BENCH_E2CP_TIMEOUT must be a positive integer"
for x in $sections; do [[ $x =~ ^[12]$ ]] || die "BENCH_SECTIONS: '$x' is not a section (1-2)"; done
e2tools_note=""
if want 2 && ! command -v e2cp >/dev/null; then
    log "installing e2tools"
    apt-get install -y -q e2tools >&2 || true
fi
have_e2cp=0
if command -v e2cp >/dev/null; then
    have_e2cp=1
else
    e2tools_note="e2tools not installable here (apt-get install -y e2tools failed): no e2cp column"
fi

if [[ ! -x $ext4kit ]]; then
    [[ -z ${EXT4KIT:-} ]] || die "EXT4KIT=$ext4kit is not executable"
    log "building ext4kit (cargo build --release -p ext4kit-cli)"
    (cd "$repo" && cargo build --release -p ext4kit-cli >&2) || die "build failed"
fi

if [[ $quick == 1 ]]; then
    f_sizes=(16G 256G); f_names=("16 GiB" "256 GiB"); f_len=1G
    n_dirs=2; n_per=1000; big_mib=256; cp_size=4G
else
    f_sizes=(1T $(( (16 << 40) - 4096 ))); f_names=("1 TiB" "16 TiB − 4 KiB"); f_len=50G
    n_dirs=100; n_per=1000; big_mib=4096; cp_size=16G
fi
n_files=$((n_dirs * n_per))

work=$(mktemp -d /tmp/ext4kit-bench-engine.XXXXXX)
[[ $(findmnt -no FSTYPE -T "$work") == ext4 ]] || { rm -rf -- "$work"; die "$work is not on ext4"; }

mounts=()  # mount points we mounted
cleanup() {
    set +e
    local m l
    for m in "${mounts[@]}"; do mountpoint -q "$m" && umount "$m"; done
    for l in "${loops[@]}"; do losetup "$l" >/dev/null 2>&1 && losetup -d "$l"; done
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Snapshot the binary: others may rebuild target/ meanwhile.
cp -- "$ext4kit" "$work/ext4kit"
ext4kit_rev=$(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
ext4kit=$work/ext4kit

export E2FSPROGS_FAKE_TIME=1700000000
uuid=5c2e8a14-7b3f-4d61-9e0a-2f8c4b6d1e37
hash_seed=9d4b1f6a-3e8c-4a27-b5d0-7c1e2f9a8b63

# ratios "a1 a2 ..." "b1 b2 ..." -> a_i / b_i, one per line
ratios() { python3 - "$1" "$2" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
for x, y in zip(a, b): print(f"{x / y:.4f}" if y > 0 else "inf")
PY
}

mkimg() { # path size
    rm -f -- "$1"
    truncate -s "$2" "$1"
    mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=1,nodiscard,hash_seed=$hash_seed" "$1"
}
fsck_ok() {
    if e2fsck -fn "$1" >"$work/fsck.out" 2>&1; then
        echo clean
    else
        echo UNCLEAN
        tail -20 "$work/fsck.out" >&2
    fi
}
fsck_all=clean
note_fsck() { [[ $1 == clean ]] || fsck_all=UNCLEAN; }
# timed_rss OUTVAR_SECS OUTVAR_RSS cmd... : wall seconds and peak RSS (KiB)
timed_rss() {
    local -n _s=$1 _r=$2
    shift 2
    local t0 t1 rc=0
    t0=$(now)
    /usr/bin/time -f %M -o "$work/rss" "$@" >"$work/cmd.out" 2>"$work/cmd.err" || rc=$?
    t1=$(now)
    if [[ $rc -eq 124 && $1 == timeout ]]; then
        return 1
    fi
    if [[ $rc -ne 0 ]]; then
        cat "$work/cmd.err" >&2
        die "$* failed ($rc)"
    fi
    _s=$(sub "$t1" "$t0")
    _r=$(tail -1 "$work/rss")
}
mnt=$work/mnt
mkdir -p "$mnt"
: >"$work/empty"

report_head() {
    echo "Produced by \`scripts/bench-engine.sh\`$([[ $quick == 1 ]] && echo " (BENCH_QUICK=1)") on $(date -u '+%Y-%m-%d %H:%M') UTC."
    echo
    echo "| machine | |"
    echo "|---|---|"
    echo "| kernel | $(uname -r) |"
    echo "| CPUs | $(nproc) |"
    echo "| memory | $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) |"
    echo "| filesystem holding the images | $(findmnt -no SOURCE,FSTYPE -T "$work") |"
    echo "| e2fsprogs | $(mke2fs -V 2>&1 | head -1) |"
    echo "| e2tools | $([[ $have_e2cp == 1 ]] && (dpkg-query -W -f '${Version}' e2tools 2>/dev/null || echo installed) || echo "not installed") |"
    echo "| ext4kit | $ext4kit_rev |"
    echo "| load average at start | $(loadavg) |"
    echo
}

# ---------------------------------------------------------------------------
# 1. fallocate
section1() {
    local i size name base img r order c secs rss k_secs=() o_secs=() o_rss=() fsck f_k f_o
    echo "### 1. \`fallocate -l $f_len\` right after a lazy mkfs ($runs runs each, median (min–max))"
    echo
    echo "| image | kernel fallocate + syncfs, s | \`ext4kit fallocate\` (whole command), s | ext4kit / kernel | ext4kit peak RSS | e2fsck |"
    echo "|---|---|---|---|---|---|"
    local all_o=()
    for i in "${!f_sizes[@]}"; do
        size=${f_sizes[$i]}; name=${f_names[$i]}
        base=$work/falloc-base.img; img=$work/falloc.img
        log "1. $name: mke2fs"
        mkimg "$base" "$size"
        k_secs=(); o_secs=(); o_rss=(); f_k=clean; f_o=clean
        for ((r = 0; r < runs; r++)); do
            if ((r % 2 == 0)); then order="kernel ours"; else order="ours kernel"; fi
            for c in $order; do
                cp --sparse=always -- "$base" "$img"
                # The copy's dirty pages must not be flushed inside the
                # timed command (ext4kit's first fdatasync would pay it).
                sync -f "$img"
                if [[ $c == kernel ]]; then
                    attach "$img"
                    mount -t ext4 -o noinit_itable "$loop" "$mnt"
                    mounts+=("$mnt")
                    local t0 t1
                    t0=$(now)
                    fallocate -l "$f_len" "$mnt/f"
                    sync -f "$mnt/f"
                    t1=$(now)
                    umount "$mnt"
                    detach "$loop"
                    secs=$(sub "$t1" "$t0")
                    k_secs+=("$secs")
                    fsck=$(fsck_ok "$img"); [[ $fsck == clean ]] || f_k=UNCLEAN
                    log "   run $r kernel: ${secs}s, fsck $fsck"
                else
                    "$ext4kit" cp "$work/empty" "$img:/f" || die "ext4kit cp (creating /f) failed"
                    sync -f "$img"
                    timed_rss secs rss "$ext4kit" fallocate -l "$f_len" "$img:/f"
                    o_secs+=("$secs"); o_rss+=("$rss")
                    fsck=$(fsck_ok "$img"); [[ $fsck == clean ]] || f_o=UNCLEAN
                    log "   run $r ext4kit: ${secs}s, RSS ${rss} KiB, fsck $fsck"
                fi
                note_fsck "$fsck"
                rm -f -- "$img"
            done
        done
        rm -f -- "$base"
        all_o+=("${o_secs[*]}")
        echo "| $name | $(med "${k_secs[@]}") | $(med "${o_secs[@]}") | $(med $(ratios "${o_secs[*]}" "${k_secs[*]}")) | $(med $(printf '%s\n' "${o_rss[@]}" | awk '{print $1/1024}')) MiB | kernel $f_k, ext4kit $f_o |"
    done
    echo
    if ((${#all_o[@]} == 2)); then
        echo "ext4kit ${f_names[1]} / ${f_names[0]} (per run): **$(med $(ratios "${all_o[1]}" "${all_o[0]}"))** (goal ≤ 1.5)."
        echo
    fi
}

# ---------------------------------------------------------------------------
# 2. copy
make_sources() {
    log "2. making the source tree ($n_files files) and the ${big_mib} MiB file"
    python3 - "$work/src/tree" "$n_dirs" "$n_per" <<'PY'
import os, random, sys
root, nd, npd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(42)
blob = bytes(rnd.getrandbits(8) for _ in range(8192))
for d in range(nd):
    p = os.path.join(root, f"d{d:03}")
    os.makedirs(p)
    for f in range(npd):
        n = rnd.randint(1, 4096)
        o = rnd.randint(0, 4096)
        with open(os.path.join(p, f"f{f:04}"), "wb") as fh:
            fh.write(blob[o:o + n])
PY
    mkdir -p "$work/src/big"
    # Incompressible and without zero blocks (zeros would become holes).
    head -c "$((big_mib << 20))" /dev/urandom >"$work/src/big/file"
    sync -f "$work/src/big/file"
}

# copy_case NAME SRC: one table row per contender
copy_case() {
    local what=$1 src=$2 base=$work/cp-base.img img=$work/cp.img r order c secs rss
    local k=() o=() e=() o_rss=() e_rss=() f_k=clean f_o=clean f_e=clean fsck t0 t1 e_to=0
    local contenders
    for ((r = 0; r < runs; r++)); do
        contenders="kernel ours"
        if [[ $have_e2cp == 1 ]] && ((r < e2cp_runs)); then contenders+=" e2cp"; fi
        # Rotate the order so no contender always runs first.
        order=$(echo $contenders | awk -v r="$r" '{n = NF; for (i = 0; i < n; i++) printf "%s ", $(((i + r) % n) + 1)}')
        for c in $order; do
            cp --sparse=always -- "$base" "$img"
            sync -f "$img"
            case $c in
            kernel)
                attach "$img"
                t0=$(now)
                mount -t ext4 -o noinit_itable "$loop" "$mnt"
                mounts+=("$mnt")
                cp -a -- "$src" "$mnt/"
                umount "$mnt"
                t1=$(now)
                detach "$loop"
                secs=$(sub "$t1" "$t0"); k+=("$secs")
                fsck=$(fsck_ok "$img"); [[ $fsck == clean ]] || f_k=UNCLEAN
                log "   run $r kernel: ${secs}s, fsck $fsck"
                ;;
            ours)
                timed_rss secs rss "$ext4kit" cp -r "$src" "$img:/"
                o+=("$secs"); o_rss+=("$rss")
                fsck=$(fsck_ok "$img"); [[ $fsck == clean ]] || f_o=UNCLEAN
                log "   run $r ext4kit: ${secs}s, RSS ${rss} KiB, fsck $fsck"
                ;;
            e2cp)
                # e2cp copies files, not trees: every file in one e2cp
                # reading the relative names from stdin; -a creates the
                # directories on the way (the trees have no empty ones).
                local here=$PWD top
                top=$(basename "$src")
                cd "$(dirname "$src")"
                find "$top" -type f >"$work/files"
                if ! timed_rss secs rss timeout "$e2cp_timeout" sh -c "e2cp -a -d '$img:/' <'$work/files'"; then
                    cd "$here"
                    e_to=1
                    log "   run $r e2cp: timed out after ${e2cp_timeout}s"
                    rm -f -- "$img"
                    continue
                fi
                cd "$here"
                e+=("$secs"); e_rss+=("$rss")
                fsck=$(fsck_ok "$img"); [[ $fsck == clean ]] || f_e=UNCLEAN
                log "   run $r e2cp: ${secs}s, RSS ${rss} KiB, fsck $fsck"
                ;;
            esac
            note_fsck "$fsck"
            rm -f -- "$img"
        done
    done
    local kib2mib='{print $1/1024}'
    echo "| $what | kernel (mount, \`cp -a\`, umount) | $(med "${k[@]}") | — | 1 | $f_k |"
    echo "| $what | \`ext4kit cp -r\` | $(med "${o[@]}") | $(med $(printf '%s\n' "${o_rss[@]}" | awk "$kib2mib")) MiB | **$(med $(ratios "${o[*]}" "${k[*]}"))** | $f_o |"
    if [[ $have_e2cp == 1 ]]; then
        local lbl="e2tools \`e2cp -a\` (names on stdin; $e2cp_runs run$( ((e2cp_runs > 1)) && echo s))"
        if ((${#e[@]} == 0)); then
            echo "| $what | $lbl | > $e2cp_timeout (timed out) | — | > $(awk -v t="$e2cp_timeout" -v k="$(median "${k[@]}")" 'BEGIN{printf "%.3g", t / k}') | — |"
        else
            echo "| $what | $lbl | $(med "${e[@]}") | $(med $(printf '%s\n' "${e_rss[@]}" | awk "$kib2mib")) MiB | $(med $(ratios "${e[*]}" "${k[*]:0:${#e[@]}}")) | $f_e |"
        fi
    fi
}

section2() {
    make_sources
    log "2. mke2fs $cp_size"
    mkimg "$work/cp-base.img" "$cp_size"
    echo "### 2. Copy into a fresh $cp_size image ($runs runs each, median (min–max))"
    echo
    echo "| source | contender | seconds | peak RSS | / kernel | e2fsck |"
    echo "|---|---|---|---|---|---|"
    log "2. tree of $n_files files"
    copy_case "$n_files files ($n_dirs dirs)" "$work/src/tree"
    log "2. one ${big_mib} MiB file"
    copy_case "one ${big_mib} MiB file" "$work/src/big"
    echo
    [[ -z $e2tools_note ]] || { echo "$e2tools_note."; echo; }
}

report_head
want 1 && section1
want 2 && section2
echo "Load average at the end: $(loadavg). Every image e2fsck -fn: $fsck_all."
