#!/usr/bin/env bash
# Benchmark `ext4kit mkfs -d SOURCE` against `mke2fs -d SOURCE` (issue 19).
#
# Two source trees:
#   small  100 000 small files (1 B – 8 KiB, in 100 directories of 1000),
#          generated in the temp dir
#   tree   a host directory, by default this machine's /usr (BENCH_TREE)
# Two formatters, on freshly truncated sparse files of the same size:
#   mke2fs   mke2fs -F -q -t ext4 -d SOURCE IMG
#   ext4kit  ext4kit mkfs -F -q -t ext4 -d SOURCE IMG
# each run BENCH_RUNS times, interleaved (the order alternates each round),
# after one untimed read of the source so that both find it in the page
# cache.
#
# Measured per run: wall time (date +%s.%N around the run), max RSS (GNU
# time %M, or wait4's ru_maxrss), the image's allocation afterwards
# (du --block-size=1 of the sparse file, = stat %b × 512), and the time of
# `e2fsck -fn IMG` on it (whose result must be clean).
#
# The report (markdown) goes to stdout, progress to stderr.
#
# Environment:
#   BENCH_DIR      where the images and the small tree go (default /tmp)
#   BENCH_RUNS     runs per (source, tool), default 3
#   BENCH_SOURCES  which sources, default "small tree"
#   BENCH_TREE     the host directory of `tree` (default /usr)
#   BENCH_FILES    number of files of `small` (default 100000)
#   EXT4KIT        ext4kit binary (default target/release/ext4kit; built
#                  if missing); copied before the runs
#   MKE2FS, E2FSCK override the e2fsprogs binaries
#
# Needs no root (reading all of /usr may: unreadable files fail both
# tools). Example:
#   BENCH_RUNS=3 scripts/bench-mkfs-d.sh > /tmp/bench-mkfs-d.md
set -euo pipefail
BENCH_NAME=bench-mkfs-d
sections=" "
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench-lib.sh
source "$repo/scripts/bench-lib.sh"

runs=${BENCH_RUNS:-3}
sources=${BENCH_SOURCES:-"small tree"}
tree=${BENCH_TREE:-/usr}
nfiles=${BENCH_FILES:-100000}
ext4kit=${EXT4KIT:-$repo/target/release/ext4kit}
mke2fs=${MKE2FS:-$(command -v mke2fs || echo /sbin/mke2fs)}
e2fsck=${E2FSCK:-$(command -v e2fsck || echo /sbin/e2fsck)}
gnu_time=/usr/bin/time

[[ $runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_RUNS must be a positive integer"
[[ $nfiles =~ ^[1-9][0-9]*$ ]] || die "BENCH_FILES must be a positive integer"
command -v python3 >/dev/null || die "python3 is required"
[[ -x $mke2fs ]] || die "mke2fs not found"
[[ -x $e2fsck ]] || die "e2fsck not found"
if [[ ! -x $ext4kit ]]; then
    [[ -z ${EXT4KIT:-} ]] || die "EXT4KIT=$ext4kit is not executable"
    log "building ext4kit (cargo build --release -p ext4kit-cli)"
    (cd "$repo" && cargo build --release -p ext4kit-cli >&2) || die "build failed"
fi

work=$(mktemp -d "${BENCH_DIR:-/tmp}/ext4kit-bench-mkfs-d.XXXXXX")
cleanup() { rm -rf -- "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
snapshot_binaries

rss_mode=gnu
"$gnu_time" -f %M true >/dev/null 2>&1 || rss_mode=python
cat >"$work/rss.py" <<'PY'
import os, sys
out, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(f"{ru.ru_maxrss}\n")
sys.exit(os.waitstatus_to_exitcode(status))
PY

# --- the sources ---------------------------------------------------------------

make_small() { # dir: nfiles files of 1 B – 8 KiB, 1000 per directory
    python3 - "$1" "$nfiles" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
blob = os.urandom(8192)
for i in range(n):
    d = os.path.join(root, f"d{i // 1000:04d}")
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    size = 1 + (i * 2654435761) % 8192
    with open(os.path.join(d, f"f{i:06d}"), "wb") as f:
        f.write(blob[:size])
PY
}

src_path() { case $1 in small) echo "$work/small" ;; tree) echo "$tree" ;; esac; }

# --- the runs --------------------------------------------------------------------

results=$work/results.tsv
: >"$results"
tool_cmd() { # tool source image -> argv in `cmd`
    case $1 in
        mke2fs) cmd=("$mke2fs" -F -q -t ext4 -d "$2" "$3") ;;
        ext4kit) cmd=("$ext4kit" mkfs -F -q -t ext4 -d "$2" "$3") ;;
    esac
}
run_one() { # source-label source size tool run
    local label=$1 src=$2 size=$3 tool=$4 run=$5 img=$work/img
    rm -f -- "$img"
    truncate -s "$size" "$img"
    sync -f "$work" 2>/dev/null || sync
    tool_cmd "$tool" "$src" "$img"
    local t0 t1 rc=0
    t0=$(now)
    if [[ $rss_mode == gnu ]]; then
        "$gnu_time" -f %M -o "$work/rss" "${cmd[@]}" >"$work/out" 2>&1 || rc=$?
    else
        python3 "$work/rss.py" "$work/rss" "${cmd[@]}" >"$work/out" 2>&1 || rc=$?
    fi
    t1=$(now)
    if [[ $rc -ne 0 ]]; then
        cat "$work/out" >&2
        die "FAILED ($rc): ${cmd[*]}"
    fi
    local rss alloc f0 f1 fsck=clean
    rss=$(tail -n 1 "$work/rss")
    alloc=$(du --block-size=1 "$img" | cut -f1)
    f0=$(now)
    "$e2fsck" -fn "$img" >"$work/fsck.out" 2>&1 || fsck=UNCLEAN
    f1=$(now)
    [[ $fsck == clean ]] || tail -20 "$work/fsck.out" >&2
    # The inodes e2fsck saw in use (its summary: "IMG: USED/TOTAL files ...").
    local inodes
    inodes=$(sed -n 's|.*: \([0-9]*\)/[0-9]* files.*|\1|p' "$work/fsck.out" | tail -n 1)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$tool" "$run" "$(sub "$t1" "$t0")" \
        "$rss" "$alloc" "$(sub "$f1" "$f0")" "$fsck" "${inodes:-?}" >>"$results"
    log "  $label $tool run $run: $(sub "$t1" "$t0") s, rss ${rss} KiB, alloc $alloc B, e2fsck $(sub "$f1" "$f0") s $fsck"
    rm -f -- "$img"
}

load_before=$(loadavg)
tools=(mke2fs ext4kit)
declare -A src_desc
for label in $sources; do
    case $label in
        small)
            log "generating $nfiles small files in $work/small"
            make_small "$work/small"
            ;;
        tree) [[ -d $tree ]] || die "BENCH_TREE=$tree is not a directory" ;;
        *) die "unknown source $label (small, tree)" ;;
    esac
    src=$(src_path "$label")
    # Room for the tree twice over and an inode (one per 16 KiB, mke2fs's
    # default ratio) for each entry with 25 % to spare; at least 1 GiB.
    bytes=$(du -s --block-size=1 --apparent-size "$src" 2>/dev/null | cut -f1 || true)
    entries=$(find "$src" -xdev 2>/dev/null | wc -l)
    size=$(python3 -c 'import sys; b=int(sys.argv[1]); g=1<<30; n=int(sys.argv[2]); print(max(g, (max(2*b, n*20480) + g - 1)//g*g))' "${bytes:-0}" "$entries")
    src_desc[$label]="$src: $entries entries, $(python3 -c "print(f'{$bytes/2**20:.0f}')") MiB apparent; image $((size >> 20)) MiB"
    log "source $label: ${src_desc[$label]}"
    log "  warming the page cache"
    tar -C "$src" -cf - . 2>/dev/null | cat >/dev/null || true
    for ((r = 1; r <= runs; r++)); do
        for ((k = 0; k < ${#tools[@]}; k++)); do
            run_one "$label" "$src" "$size" "${tools[$(((k + r - 1) % ${#tools[@]}))]}" "$r"
        done
    done
    [[ $label != small ]] || rm -rf -- "$work/small"
done
load_after=$(loadavg)

# --- the report ------------------------------------------------------------------

backing=$(findmnt -n -o FSTYPE,SOURCE -T "$work" 2>/dev/null || echo "?")
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
mem=$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null || true)
e2v=$("$mke2fs" -V 2>&1 || true)
e2v=${e2v%%$'\n'*}
cat <<EOF
### Machine

- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')
- nproc: $(nproc); CPU: ${cpu:-?}; memory: ${mem:-?}; kernel: $(uname -sr)
- backing fs of the images: $backing
- e2fsprogs: $e2v; ext4kit: git $ext4kit_rev
- max RSS via: $([[ $rss_mode == gnu ]] && echo "GNU time %M" || echo "wait4 ru_maxrss")
- runs per (source, tool): $runs, interleaved; load average before: $load_before, after: $load_after
EOF
for label in $sources; do echo "- $label: ${src_desc[$label]}"; done
echo

python3 - "$results" <<'PY'
import sys, statistics
from collections import defaultdict
rows, order = defaultdict(list), []
for line in open(sys.argv[1]):
    label, tool, run, wall, rss, alloc, fsck_s, fsck, inodes = line.rstrip("\n").split("\t")
    if label not in order:
        order.append(label)
    rows[(label, tool)].append((float(wall), int(rss) / 1024, int(alloc) / 2**20, float(fsck_s), f"{fsck}, {inodes} inodes"))
def med(v):
    f = lambda x: f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"
    return f(statistics.median(v)) if len(v) == 1 else f"{f(statistics.median(v))} ({f(min(v))}–{f(max(v))})"
print("| source | tool | wall s | max RSS MiB | allocated MiB | e2fsck -fn s | e2fsck -fn |")
print("|---|---|--:|--:|--:|--:|---|")
for label in order:
    for tool in ("mke2fs", "ext4kit"):
        rs = rows[(label, tool)]
        col = lambda i: [r[i] for r in rs]
        fs = sorted(set(col(4)))
        print(f"| {label} | {tool} | {med(col(0))} | {med(col(1))} | {med(col(2))} | {med(col(3))} | {', '.join(fs)} |")
print()
print("Ratios ext4kit / mke2fs of the medians:")
print()
print("| source | wall | max RSS | allocated | e2fsck -fn time |")
print("|---|--:|--:|--:|--:|")
for label in order:
    m = lambda t, i: statistics.median(r[i] for r in rows[(label, t)])
    print(f"| {label} | " + " | ".join(f"{m('ext4kit', i) / m('mke2fs', i):.2f}" for i in range(4)) + " |")
PY
