#!/usr/bin/env bash
# Real work on the FUSE mount (`ext4kit mount`, default options) against
# the kernel's ext4 (a loop mount of the same image) and fuse2fs, side by
# side in one run on this machine: what a user does with a filesystem,
# not a synthetic load.
#
# Every contender gets a fresh copy (cp --sparse=always) of one base image:
#   E2FSPROGS_FAKE_TIME=... mke2fs -F -q -t ext4 -U UUID \
#       -E lazy_itable_init=0,lazy_journal_init=0,nodiscard,hash_seed=SEED IMG 16G
# Contenders (BENCH_SYSTEMS):
#   kernel      losetup + mount -t ext4 (defaults)
#   ext4kit     ext4kit mount -f IMG MNT (defaults)
#   ext4kit-wb  the same with -o writeback_cache
#   ext4kit-own the same with -o transport=ext4kit (our own FUSE transport,
#               crates/fuse/src/session.rs; the default since session 17)
#   ext4kit-fuser the same with -o transport=fuser (fuser 0.18's session)
#   ext4kit-devfuse the same with -o nouring (our own transport on /dev/fuse,
#               where io_uring is the default: as root since session 18)
#   ext4kit-noidle the default mount with the idle commit off
#               (EXT4KIT_IDLE_COMMIT=0: what committing once the mount is
#               quiet, for sync(1)'s sake, costs; issue 23)
#   ext4kit-uring the same with -o uring (our own transport over FUSE over
#               io_uring; as root the mount turns fuse.enable_uring on)
#   fuse2fs     fuse2fs -f IMG MNT -o fakeroot
#   base        ext4kit with the binary EXT4KIT_BASE (before/after a change)
#
# Rows. The "session" rows run one after the other on one mount of a fresh
# image (each starts where the previous one left the tree):
#   untar       tar -xf of a tarball of real files (BENCH_REAL_SRC, by
#               default parts of this machine's /usr), then sync
#   find+stat   find MNT -printf of size, mode, owner, mtime of every entry
#               (the tree just written: warm caches)
#   md5 cold    drop the caches (sync; echo 3 > drop_caches), md5sum every
#               file
#   sqlite rollback / WAL   100 transactions of 1000 inserts each
#               (journal_mode DELETE, then WAL), sqlite3's defaults
#               otherwise (synchronous FULL / NORMAL: fsyncs reach the disk)
#   rsync       rsync -aHAX of the untarred tree to a second directory
#   rsync rerun the same rsync again (nothing to copy: lookups, stats)
#   git clone   git clone --no-local of BENCH_REAL_GIT (default: this
#               repository) into the mount
#   git status  git status in the clone, twice (the second is timed: a
#               warm rerun should not ask the filesystem twice)
#   build       make -j$(nproc) of a generated C project (BENCH_REAL_CFILES
#               files of gcc -O1), in the mount
#   rm -rf      of everything written above, then sync
#   unmount     until the image is closed (FUSE: the daemon exited)
# The fresh-image rows each run on their own fresh image:
#   postmark 2000/2000, postmark 50000/50000 (the seed's parameters; skip
#               with BENCH_REAL_PM_SEED=0)
#   fio 4k randread / randwrite, 1 and 4 jobs: psync, buffered, 256 MiB
#               per job, BENCH_FIO_SECS seconds; IOPS of all jobs together
#
# Runs are interleaved (the contenders' order rotates every round), every
# image is checked with `e2fsck -fn` after every run. Ratios are of medians
# of time per unit of work: ext4kit/kernel > 1 means ext4kit is slower
# than the kernel, fuse2fs/ext4kit > 1 means ext4kit is faster than
# fuse2fs. The goal column is issue 18's: every row ≤ 2× the kernel, and
# ext4kit's 4 fio jobs ≥ 1.6× its 1 job. The load average is printed at
# the start and the end: the machine may be shared.
#
# The report (markdown) goes to stdout, progress to stderr.
#
# Environment:
#   BENCH_RUNS          runs per contender (default 3)
#   BENCH_SYSTEMS       contenders (default "kernel ext4kit fuse2fs")
#   BENCH_ROWS          which groups run (default "session postmark fio")
#   BENCH_REAL_SRC      directories to tar for the untar row (default
#                       "/usr/include /usr/lib/x86_64-linux-gnu /usr/lib/python3",
#                       the ones that exist)
#   BENCH_REAL_GIT      a git repository to clone (default: this one)
#   BENCH_REAL_CFILES   files of the generated C project (default 200)
#   BENCH_REAL_PM_SEED  1 (default) or 0: run postmark 50000/50000
#   BENCH_FIO_SECS      seconds per fio run (default 10)
#   BENCH_TIMEOUT       seconds before a FUSE contender's row is given up
#                       (default 600; shown as "> N", its later runs of
#                       that row skipped)
#   BENCH_THREADS       ext4kit mount --threads (default: the mount's)
#   BENCH_EXT4KIT_OPTS  extra -o options for every ext4kit contender
#   EXT4KIT             ext4kit binary (default target/release/ext4kit)
#   EXT4KIT_BASE        a second ext4kit binary for the contender base
#
# Needs root, loop devices and /dev/fuse (installs postmark, fio, rsync,
# sqlite3 and fuse2fs with apt-get when missing); otherwise it says so and
# exits 0. Only loop devices this script attached are used (always
# detached on exit); mounts are only under the temp work dir (always
# unmounted).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ext4kit=${EXT4KIT:-$repo/target/release/ext4kit}
runs=${BENCH_RUNS:-3}
systems=${BENCH_SYSTEMS:-kernel ext4kit fuse2fs}
rows=" ${BENCH_ROWS:-session postmark fio} "
src_dirs=${BENCH_REAL_SRC:-/usr/include /usr/lib/x86_64-linux-gnu /usr/lib/python3}
git_src=${BENCH_REAL_GIT:-$repo}
cfiles=${BENCH_REAL_CFILES:-200}
pm_seed=${BENCH_REAL_PM_SEED:-1}
fio_secs=${BENCH_FIO_SECS:-10}
timeout_s=${BENCH_TIMEOUT:-600}
threads=${BENCH_THREADS:-}
ours_opts=${BENCH_EXT4KIT_OPTS:-}
BENCH_NAME=bench-real
sections=" "
# shellcheck source=scripts/bench-lib.sh
source "$repo/scripts/bench-lib.sh"
bench_preflight

if [[ ! -c /dev/fuse ]]; then
    echo "bench-real: no /dev/fuse; skipped."
    exit 0
fi
for v in runs cfiles fio_secs timeout_s; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $pm_seed == 0 || $pm_seed == 1 ]] || die "BENCH_REAL_PM_SEED must be 0 or 1"
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] || die "BENCH_THREADS must be a positive integer"
for g in $rows; do
    [[ $g == session || $g == postmark || $g == fio ]] || die "BENCH_ROWS: unknown '$g' (session, postmark, fio)"
done
for s in $systems; do
    [[ $s == kernel || $s == ext4kit || $s == ext4kit-wb || $s == ext4kit-own || $s == ext4kit-fuser || $s == ext4kit-uring || $s == ext4kit-noidle || $s == ext4kit-devfuse || $s == fuse2fs || $s == base ]] || die "BENCH_SYSTEMS: unknown '$s'"
    if [[ $s == base && ! -x ${EXT4KIT_BASE:-} ]]; then die "BENCH_SYSTEMS has base: EXT4KIT_BASE must name an ext4kit binary"; fi
done
need_pkg() { # command package
    command -v "$1" >/dev/null && return 0
    log "installing $2"
    apt-get install -y -q "$2" >&2 || true
    command -v "$1" >/dev/null
}
for t in mke2fs e2fsck python3 findmnt tar timeout md5sum git gcc make; do
    command -v $t >/dev/null || die "$t is required"
done
if [[ $rows == *" session "* ]]; then
    need_pkg rsync rsync || die "rsync is not installable"
    need_pkg sqlite3 sqlite3 || die "sqlite3 is not installable"
    git -C "$git_src" rev-parse --git-dir >/dev/null 2>&1 || die "BENCH_REAL_GIT=$git_src is not a git repository"
fi
if [[ $rows == *" postmark "* ]]; then need_pkg postmark postmark || die "postmark is not installable"; fi
if [[ $rows == *" fio "* ]]; then need_pkg fio fio || die "fio is not installable"; fi
if [[ " $systems " == *" fuse2fs "* ]]; then need_pkg fuse2fs fuse2fs || die "fuse2fs is not installable"; fi

if [[ ! -x $ext4kit ]]; then
    [[ -z ${EXT4KIT:-} ]] || die "EXT4KIT=$ext4kit is not executable"
    log "building ext4kit (cargo build --release -p ext4kit-cli)"
    (cd "$repo" && cargo build --release -p ext4kit-cli >&2) || die "build failed"
fi

work=$(mktemp -d /tmp/ext4kit-bench-real.XXXXXX)
mounts=()
pids=()
cleanup() {
    set +e
    local m l p
    for m in "${mounts[@]}"; do [[ -n $m ]] && mountpoint -q "$m" && umount "$m"; done
    for p in "${pids[@]}"; do [[ -n $p ]] && { kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; }; done
    for l in "${loops[@]}"; do losetup "$l" >/dev/null 2>&1 && detach "$l"; done
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

snapshot_binaries

export E2FSPROGS_FAKE_TIME=1700000000
uuid=8e1f4c2a-6b3d-4f70-9a5e-0c7d2b8f1e64
hash_seed=2f6a9c1e-4d8b-4e3f-a7c0-5b1e9d2f6a38
mnt=$work/mnt
mkdir -p "$mnt"
base=$work/base.img
img=$work/run.img
log "base image: mke2fs 16G (lazy_itable_init=0)"
truncate -s 16G "$base"
mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=0,lazy_journal_init=0,nodiscard,hash_seed=$hash_seed" "$base"
fresh() {
    rm -f -- "$img"
    cp --sparse=always -- "$base" "$img"
    sync -f "$img"
}
order() { # R -> the contenders rotated by R
    echo $systems | awk -v r="$1" '{n = NF; for (i = 0; i < n; i++) printf "%s ", $(((i + r) % n) + 1)}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "-"}'; }
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# ---- inputs, made once ---------------------------------------------------
if [[ $rows == *" session "* ]]; then
    tar_in=()
    for d in $src_dirs; do [[ -d $d ]] && tar_in+=("${d#/}"); done
    ((${#tar_in[@]})) || die "none of BENCH_REAL_SRC exists: $src_dirs"
    log "tarball of ${tar_in[*]}"
    tar -cf "$work/src.tar" -C / --exclude='*/__pycache__' "${tar_in[@]}" 2>"$work/tar.err" || {
        # a file vanishing under a live /usr is not a reason to stop
        [[ $? -eq 1 ]] || { cat "$work/tar.err" >&2; die "tar of the source failed"; }
    }
    tar_bytes=$(stat -c %s "$work/src.tar")
    tar_entries=$(tar -tf "$work/src.tar" | wc -l)
    log "  $((tar_bytes / 1048576)) MiB, $tar_entries entries"
    git clone -q --mirror --no-local "$git_src" "$work/git-src.git"
    git_objs=$(git -C "$work/git-src.git" count-objects -v | awk '/^size-pack/{print $2}')
    log "git source: $git_src (${git_objs} KiB packed)"
    python3 - "$work/csrc" "$cfiles" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(18)
os.makedirs(root)
objs = []
for i in range(n):
    with open(os.path.join(root, f"m{i:04}.c"), "w") as f:
        f.write("#include <stdio.h>\n#include <string.h>\n#include <stdlib.h>\n")
        for j in range(40):
            a, b = rnd.randint(1, 99), rnd.randint(1, 99)
            f.write(f"int m{i}_f{j}(int x) {{ int s = 0; for (int k = 0; k < x; k++) "
                    f"s += (k * {a}) ^ (s >> {b % 7 + 1}); return s + (int)strlen(\"{i}-{j}\"); }}\n")
        f.write(f"int m{i}(void) {{ return m{i}_f0(3) + m{i}_f39(5); }}\n")
    objs.append(f"m{i:04}.o")
with open(os.path.join(root, "main.c"), "w") as f:
    f.write("".join(f"int m{i}(void);\n" for i in range(n)))
    f.write("int main(void) { long s = 0;\n" + "".join(f" s += m{i}();\n" for i in range(n)) + " return (int)(s & 1); }\n")
with open(os.path.join(root, "Makefile"), "w") as f:
    f.write("CFLAGS = -O1\nprog: main.o " + " ".join(objs) + "\n\t$(CC) -o $@ $^\n")
PY
fi
sqlite_sql() { # MODE -> SQL script on stdout
    echo "PRAGMA journal_mode=$1;"
    echo "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b INTEGER);"
    local i
    for ((i = 0; i < 100; i++)); do
        echo "BEGIN;"
        echo "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000) INSERT INTO t (a, b) SELECT hex(randomblob(32)), x FROM c;"
        echo "COMMIT;"
    done
}
sqlite_sql DELETE >"$work/rollback.sql"
sqlite_sql WAL >"$work/wal.sql"
pm_cfg() { # file location number transactions
    cat >"$1" <<EOF
set location $2
set number $3
set transactions $4
set read 4096
set write 4096
set bias read 5
set bias create 5
set report terse
set size 1000 200000
set buffering false
run
quit
EOF
}

# ---- results: T[row|system] = "v1 v2 ...", TO[row|system] = timed out ----
declare -A T=() TO=() F=()
row_names=()
add_row() { [[ " ${row_names[*]} " == *" $1 "* ]] || row_names+=("$1"); }
fsck_all=clean
up_sys() { # SYSTEM
    local opts=""
    [[ $1 == ext4kit || $1 == base ]] && opts=$ours_opts
    [[ $1 == ext4kit-wb ]] && opts=writeback_cache${ours_opts:+,$ours_opts}
    [[ $1 == ext4kit-own ]] && opts=transport=ext4kit${ours_opts:+,$ours_opts}
    [[ $1 == ext4kit-fuser ]] && opts=transport=fuser${ours_opts:+,$ours_opts}
    [[ $1 == ext4kit-uring ]] && opts=uring${ours_opts:+,$ours_opts}
    [[ $1 == ext4kit-devfuse ]] && opts=nouring${ours_opts:+,$ours_opts}
    if [[ $1 == base ]]; then
        local keep=$ext4kit
        ext4kit=$base_bin
        up ext4kit "$img" "$opts"
        ext4kit=$keep
    elif [[ $1 == ext4kit-own || $1 == ext4kit-fuser || $1 == ext4kit-uring || $1 == ext4kit-devfuse ]]; then
        up ext4kit "$img" "$opts"
    elif [[ $1 == ext4kit-noidle ]]; then
        EXT4KIT_IDLE_COMMIT=0 up ext4kit "$img" "$ours_opts"
    else
        up "$1" "$img" "$opts"
    fi
}
check() { # SYSTEM ROWNAME
    local f
    f=$(fsck_ok "$img")
    F[$2|$1]+="$f "
    [[ $f == clean ]] || fsck_all=UNCLEAN
    log "   e2fsck: $f"
}
# timed SYSTEM ROW CMD...: run CMD (with a timeout for FUSE contenders),
# record its seconds under ROW; returns CMD's status (124: timed out)
timed() {
    local sys=$1 row=$2 t0 t1 rc=0
    shift 2
    add_row "$row"
    if [[ -n ${TO[$row|$sys]:-} ]]; then return 124; fi
    local to=()
    [[ $sys != kernel ]] && to=(timeout "$timeout_s")
    # a shell function (exported below) runs under timeout through bash -c
    [[ ${#to[@]} -gt 0 && $(type -t "$1") == function ]] && to+=(bash -c '"$@"' _)
    t0=$(now)
    "${to[@]}" "$@" >"$work/out" 2>&1 || rc=$?
    t1=$(now)
    if [[ $rc -eq 124 ]]; then
        TO[$row|$sys]=1
        log "   $row: timed out after ${timeout_s}s"
        return 124
    fi
    if [[ $rc -ne 0 ]]; then
        tail -20 "$work/out" >&2
        log "   $row on $sys failed ($rc)"
        return "$rc"
    fi
    T[$row|$sys]+="$(sub "$t1" "$t0") "
    log "   $row: $(sub "$t1" "$t0")s"
}
in_dir() { local d=$1; shift; (cd "$d" && "$@"); }
untar_sync() { tar -xf "$work/src.tar" -C "$mnt/src" && sync; }
find_stat() { find "$mnt" -printf '%s %m %u %T@ %p\n' >/dev/null; }
md5_all() { find "$mnt/src" -type f -print0 | xargs -0 -r md5sum >/dev/null; }
rm_all() { rm -rf -- "$mnt"/{src,copy,db,repo,csrc} && sync; } # lost+found stays
git_status2() { in_dir "$mnt/repo" git status --porcelain >/dev/null; }
export mnt work
export -f in_dir untar_sync find_stat md5_all rm_all git_status2

session() { # SYSTEM: the session rows on one mount of a fresh image
    local sys=$1
    fresh
    up_sys "$sys"
    log " session on $sys"
    mkdir -p "$mnt/src"
    timed "$sys" "untar" untar_sync || { down_fuse "$sys"; return; }
    timed "$sys" "find+stat" find_stat || true
    drop_caches
    timed "$sys" "md5 cold" md5_all || true
    mkdir -p "$mnt/db"
    timed "$sys" "sqlite rollback" sqlite3 "$mnt/db/rollback.db" ".read $work/rollback.sql" || true
    timed "$sys" "sqlite WAL" sqlite3 "$mnt/db/wal.db" ".read $work/wal.sql" || true
    timed "$sys" "rsync -aHAX" rsync -aHAX "$mnt/src/" "$mnt/copy/" || true
    timed "$sys" "rsync rerun" rsync -aHAX "$mnt/src/" "$mnt/copy/" || true
    timed "$sys" "git clone" git clone -q --no-local "$work/git-src.git" "$mnt/repo" || true
    if [[ -d $mnt/repo ]]; then
        in_dir "$mnt/repo" git status --porcelain >/dev/null 2>&1 || true
        timed "$sys" "git status (rerun)" git_status2 || true
    fi
    cp -r -- "$work/csrc" "$mnt/csrc"
    timed "$sys" "build (make -j$(nproc))" make -s -C "$mnt/csrc" -j"$(nproc)" || true
    timed "$sys" "rm -rf" rm_all || true
    add_row "unmount"
    local t0 t1
    t0=$(now)
    down_fuse "$sys"
    t1=$(now)
    T[unmount|$sys]+="$(sub "$t1" "$t0") "
    check "$sys" "session"
}
down_fuse() { # SYSTEM: unmount, and for FUSE wait until the image is closed
    if [[ $1 == base || $1 == ext4kit-own || $1 == ext4kit-fuser || $1 == ext4kit-uring || $1 == ext4kit-noidle || $1 == ext4kit-devfuse ]]; then down ext4kit; else down "$1"; fi
    sync -f "$img"
}

one_fresh() { # SYSTEM ROW KIND ARGS...: a fresh-image row
    local sys=$1 row=$2 kind=$3
    shift 3
    add_row "$row"
    [[ -n ${TO[$row|$sys]:-} ]] && return
    fresh
    up_sys "$sys"
    log " $row on $sys"
    case $kind in
    postmark)
        pm_cfg "$work/pm.cfg" "$mnt" "$1" "$1"
        timed "$sys" "$row" postmark "$work/pm.cfg" || true
        ;;
    fio)
        local rw=$1 jobs=$2 rc=0
        local to=()
        [[ $sys != kernel ]] && to=(timeout "$timeout_s")
        "${to[@]}" fio --name=bench --directory="$mnt" --bs=4k --ioengine=psync --direct=0 \
            --rw="$rw" --size=256m --numjobs="$jobs" --group_reporting \
            --runtime="$fio_secs" --time_based --output-format=json \
            >"$work/out" 2>"$work/out.err" || rc=$?
        if [[ $rc -eq 0 ]]; then
            local iops
            iops=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(j["read"]["iops"] + j["write"]["iops"])' "$work/out")
            # stored as seconds per 1000 ops, so that ratios read as times
            T[$row|$sys]+="$(awk -v i="$iops" 'BEGIN{printf "%.6f", (i > 0 ? 1000 / i : 0)}') "
            IOPS[$row|$sys]+="$iops "
            log "   $row: $iops IOPS"
        else
            [[ $rc -eq 124 ]] && TO[$row|$sys]=1
            tail -5 "$work/out.err" >&2
            log "   $row on $sys failed ($rc)"
        fi
        ;;
    esac
    down_fuse "$sys"
    check "$sys" "$row"
}
declare -A IOPS=()

load0=$(loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
for ((r = 0; r < runs; r++)); do
    log "round $((r + 1))/$runs"
    for sys in $(order "$r"); do
        [[ $rows == *" session "* ]] && session "$sys"
        if [[ $rows == *" postmark "* ]]; then
            one_fresh "$sys" "postmark 2000/2000" postmark 2000
            [[ $pm_seed == 1 ]] && one_fresh "$sys" "postmark 50000/50000" postmark 50000
        fi
        if [[ $rows == *" fio "* ]]; then
            for rw in randread randwrite; do
                for j in 1 4; do one_fresh "$sys" "fio 4k $rw, $j job$([[ $j == 1 ]] || echo s)" fio "$rw" "$j"; done
            done
        fi
    done
done
load1=$(loadavg)

# ---- report --------------------------------------------------------------
cell() { # ROW SYSTEM -> "median (min–max)" or "> N"
    local v=${T[$1|$2]:-}
    if [[ $1 == fio* ]]; then v=${IOPS[$1|$2]:-}; fi
    if [[ -n ${TO[$1|$2]:-} && -z $v ]]; then echo "> $timeout_s"; return; fi
    # shellcheck disable=SC2086
    med $v
}
medv() { [[ -n ${T[$1|$2]:-} ]] && median ${T[$1|$2]} || echo ""; }
ours=ext4kit
[[ " $systems " == *" ext4kit "* ]] || ours=$(echo $systems | awk '{for (i = 1; i <= NF; i++) if ($i != "kernel" && $i != "fuse2fs") {print $i; exit}}')
echo "### Real work: ext4kit mount vs the kernel's ext4 vs fuse2fs ($started)"
echo
echo "ext4kit $ext4kit_rev; $runs run(s) per contender, interleaved; median (min–max);"
echo "seconds, fio rows in IOPS. Load average at the start: $load0, at the end: $load1."
if [[ $rows == *" session "* ]]; then
    echo "Untar source: ${tar_in[*]/#//} ($((tar_bytes / 1048576)) MiB, $tar_entries entries); git: $(basename "$git_src") (${git_objs} KiB packed); build: $cfiles C files."
fi
echo
hdr="| row |"
sep="|---|"
for s in $systems; do hdr+=" $s |"; sep+="---|"; done
[[ " $systems " == *" kernel "* && -n $ours ]] && { hdr+=" $ours/kernel (goal ≤ 2) |"; sep+="---|"; }
[[ " $systems " == *" fuse2fs "* && -n $ours ]] && { hdr+=" fuse2fs/$ours |"; sep+="---|"; }
own_col=
[[ " $systems " == *" ext4kit-own "* && $ours != ext4kit-own ]] && { own_col=1; hdr+=" ext4kit-own/$ours |"; sep+="---|"; }
variant_cols=()
for v in ext4kit-fuser ext4kit-uring ext4kit-devfuse ext4kit-noidle; do
    [[ " $systems " == *" $v "* && $ours != "$v" ]] && { variant_cols+=("$v"); hdr+=" $v/$ours |"; sep+="---|"; }
done
echo "$hdr"
echo "$sep"
for row in "${row_names[@]}"; do
    line="| $row |"
    for s in $systems; do line+=" $(cell "$row" "$s") |"; done
    if [[ " $systems " == *" kernel "* && -n $ours ]]; then
        k=$(medv "$row" kernel); o=$(medv "$row" "$ours")
        if [[ -n ${TO[$row|$ours]:-} && -z $o ]]; then
            line+=" > $(ratio "$timeout_s" "$k"), **missed** |"
        else
            rt=$(ratio "$o" "$k")
            goal=""
            [[ $rt != - ]] && goal=$(awk -v r="$rt" 'BEGIN{print (r <= 2 ? "met" : "**missed**")}')
            line+=" $rt${goal:+, $goal} |"
        fi
    fi
    if [[ " $systems " == *" fuse2fs "* && -n $ours ]]; then
        f=$(medv "$row" fuse2fs); o=$(medv "$row" "$ours")
        if [[ -n ${TO[$row|fuse2fs]:-} && -z $f ]]; then line+=" ≥ $(ratio "$timeout_s" "$o") |"; else line+=" $(ratio "$f" "$o") |"; fi
    fi
    [[ -n $own_col ]] && line+=" $(ratio "$(medv "$row" ext4kit-own)" "$(medv "$row" "$ours")") |"
    for v in "${variant_cols[@]}"; do line+=" $(ratio "$(medv "$row" "$v")" "$(medv "$row" "$ours")") |"; done
    echo "$line"
done
echo
if [[ $rows == *" fio "* && -n $ours ]]; then
    for rw in randread randwrite; do
        one=$(medv "fio 4k $rw, 1 job" "$ours"); four=$(medv "fio 4k $rw, 4 jobs" "$ours")
        sc=$(ratio "$one" "$four")
        goal=$(awk -v r="$sc" 'BEGIN{print (r != "-" && r >= 1.6 ? "met" : "**missed**")}')
        echo "- $ours fio 4k $rw: 4 jobs give ${sc}× the IOPS of 1 job (goal ≥ 1.6: $goal)."
    done
fi
echo "- e2fsck -fn after every run: $fsck_all."
[[ $fsck_all == clean ]] || exit 1
