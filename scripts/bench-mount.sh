#!/usr/bin/env bash
# Benchmark the FUSE mount (`ext4kit mount`) against the kernel's ext4 (a
# loop mount of the same image) and fuse2fs, side by side in one run on
# this machine.
#
# Every run gets a fresh copy (cp --sparse=always) of one base image made by
#   E2FSPROGS_FAKE_TIME=... mke2fs -F -q -t ext4 -U UUID \
#       -E lazy_itable_init=0,lazy_journal_init=0,nodiscard,hash_seed=SEED IMG 16G
# (every group ITABLE_ZEROED: no lazy init thread runs in sections 1-6), so
# every contender starts from the same bytes. Contenders:
#   kernel   losetup + mount -t ext4 (defaults)
#   ext4kit  ext4kit mount -f IMG MNT (defaults; served in the background)
#   ext4kit-wb  the same with -o writeback_cache (FUSE's writeback cache)
#   fuse2fs  fuse2fs -f IMG MNT -o fakeroot (as the notes ran it)
#   base, base-wb  ext4kit and ext4kit-wb with the binary EXT4KIT_BASE (an
#            earlier build: before/after of a change in one interleaved run)
# Mount and unmount are not timed (except where a column says so); after
# every run the image is unmounted (for FUSE: until the daemon exited) and
# checked with `e2fsck -fn`.
#
# Sections:
#   1. postmark, the seed's parameters (number 50000, transactions 50000,
#      read/write 4096, bias read 5, bias create 5, size 1000 200000,
#      buffering false)
#   2. postmark 2000/2000 (the same, number and transactions 2000)
#   3. dd if=/dev/zero of=MNT/f bs=1M count=1024 conv=fsync
#   4. tar -xf of a generated source tree (BENCH_TAR_FILES files, sizes
#      like a source tree), then sync; and until the unmount is complete
#      (FUSE's `sync` does not reach the daemon: the durable figure is the
#      one with the unmount)
#   5. fio 4 KiB random writes, buffered, psync, BENCH_FIO_SECS seconds on a
#      512 MiB file
#   6. fio 4 KiB sequential writes, fsync after each, BENCH_FIO_SECS seconds
#   7. online lazy init, idle 1 TiB sparse lazy image: `ext4kit mount` with
#      init_itable=10 (the default) and init_itable=0 until `ext4kit status`
#      says done, against the kernel's mount -o init_itable=10 (group
#      descriptors polled through the loop device every 50 ms)
#   8. postmark (seed parameters) on a 1 TiB lazy image attached to a loop
#      device with discard off (lazy init writes real zeros, 16 GiB), with
#      lazy init running (init_itable=10) and without (noinit_itable), for
#      ext4kit and the kernel; groups zeroed by the end of the postmark
#
# Runs are interleaved (the contenders' order rotates every round). Every
# ratio is of time per unit of work (seconds, or 1/IOPS): ext4kit/kernel
# > 1 means ext4kit is slower than the kernel, fuse2fs/ext4kit > 1 means
# ext4kit is faster than fuse2fs. Ratios are of medians. The load average
# is printed at the start and the end: the machine may be shared, and
# ratios side by side in one run are what counts.
#
# The report (markdown) goes to stdout, progress to stderr.
#
# Environment:
#   BENCH_RUNS          runs per contender and case (default 3)
#   BENCH_PM_SEED_RUNS  runs of section 1 for the kernel and ext4kit
#                       (default 2)
#   BENCH_F2_SEED_RUNS  runs of section 1 for fuse2fs (default 1: slow)
#   BENCH_F2_TIMEOUT    seconds before a FUSE run (fuse2fs, ext4kit) is
#                       given up (default 240; shown as "> N"; the
#                       contender's later runs of that case are skipped)
#   BENCH_FIO_SECS      seconds per fio run (default 10)
#   BENCH_TAR_FILES     files in the generated tree (default 20000)
#   BENCH_LI_RUNS       runs of section 7 per ext4kit pace (default 3; the
#                       kernel runs once: ~70 s idle, minutes under load)
#   BENCH_NO_KPACE=1    skip section 7's kernel run
#   BENCH_LI8_RUNS      runs of section 8 per contender and case (default 1)
#   BENCH_LI8_PM        postmark number = transactions of section 8
#                       (default 50000, the seed's)
#   BENCH_SECTIONS      which sections to run (default "1 2 3 4 5 6 7 8")
#   BENCH_SYSTEMS       contenders of sections 1-6 (default "kernel ext4kit
#                       ext4kit-wb fuse2fs")
#   BENCH_THREADS       ext4kit mount --threads (default: the mount's)
#   BENCH_EXT4KIT_OPTS  extra -o options for ext4kit in sections 1-6
#   EXT4KIT             ext4kit binary (default target/release/ext4kit)
#   EXT4KIT_BASE        a second ext4kit binary for the contenders base and
#                       base-wb (add them to BENCH_SYSTEMS); the report then
#                       has a before/after table of ext4kit against it
#
# Needs root, loop devices and /dev/fuse (and installs postmark, fio and
# fuse2fs with apt-get when missing); otherwise it says so and exits 0.
# Only loop devices this script attached are used (always detached on
# exit); mounts are only under the temp work dir (always unmounted).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ext4kit=${EXT4KIT:-$repo/target/release/ext4kit}
runs=${BENCH_RUNS:-3}
pm_seed_runs=${BENCH_PM_SEED_RUNS:-2}
f2_seed_runs=${BENCH_F2_SEED_RUNS:-1}
f2_timeout=${BENCH_F2_TIMEOUT:-240}
fio_secs=${BENCH_FIO_SECS:-10}
tar_files=${BENCH_TAR_FILES:-20000}
li_runs=${BENCH_LI_RUNS:-3}
li8_runs=${BENCH_LI8_RUNS:-1}
li8_n=${BENCH_LI8_PM:-50000}
no_kpace=${BENCH_NO_KPACE:-0}
sections=" ${BENCH_SECTIONS:-1 2 3 4 5 6 7 8} "
systems=${BENCH_SYSTEMS:-kernel ext4kit ext4kit-wb fuse2fs}
threads=${BENCH_THREADS:-}
ours_opts=${BENCH_EXT4KIT_OPTS:-}
BENCH_NAME=bench-mount
# shellcheck source=scripts/bench-lib.sh
source "$repo/scripts/bench-lib.sh"
bench_preflight

if [[ ! -c /dev/fuse ]]; then
    echo "bench-mount: no /dev/fuse; skipped."
    exit 0
fi
for t in mke2fs dumpe2fs e2fsck python3 findmnt tar timeout; do
    command -v $t >/dev/null || die "$t is required"
done
for x in $sections; do [[ $x =~ ^[1-8]$ ]] || die "BENCH_SECTIONS: '$x' is not a section (1-8)"; done
for v in runs pm_seed_runs f2_seed_runs f2_timeout fio_secs tar_files li_runs li8_runs li8_n; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for s in $systems; do
    [[ $s == kernel || $s == ext4kit || $s == ext4kit-wb || $s == fuse2fs || $s == base || $s == base-wb ]] || die "BENCH_SYSTEMS: unknown '$s'"
    if [[ $s == base* && ! -x ${EXT4KIT_BASE:-} ]]; then die "BENCH_SYSTEMS has $s: EXT4KIT_BASE must name an ext4kit binary"; fi
done
[[ -z $threads || $threads =~ ^[1-9][0-9]*$ ]] || die "BENCH_THREADS must be a positive integer"
need_pkg() { # command package
    command -v "$1" >/dev/null && return 0
    log "installing $2"
    apt-get install -y -q "$2" >&2 || true
    command -v "$1" >/dev/null
}
if want 1 || want 2 || want 8; then need_pkg postmark postmark || die "postmark is not installable"; fi
if want 5 || want 6; then need_pkg fio fio || die "fio is not installable"; fi
if [[ " $systems " == *" fuse2fs "* ]]; then need_pkg fuse2fs fuse2fs || die "fuse2fs is not installable"; fi

if [[ ! -x $ext4kit ]]; then
    [[ -z ${EXT4KIT:-} ]] || die "EXT4KIT=$ext4kit is not executable"
    log "building ext4kit (cargo build --release -p ext4kit-cli)"
    (cd "$repo" && cargo build --release -p ext4kit-cli >&2) || die "build failed"
fi

work=$(mktemp -d /tmp/ext4kit-bench-mount.XXXXXX)
[[ $(findmnt -no FSTYPE -T "$work") == ext4 ]] || { rm -rf -- "$work"; die "$work is not on ext4"; }

mounts=()  # mount points we mounted
pids=()    # FUSE daemons we started
cleanup() {
    set +e
    local m l p
    for m in "${mounts[@]}"; do mountpoint -q "$m" && umount "$m"; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
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

# med v1 v2 ... -> "median (min–max)"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else print "-"}'; }

# A loop device whose discard_max_bytes was set to 0 keeps that setting
# after losetup -d; such devices are removed and re-created through
# /dev/loop-control once detached (as scripts/bench-lazyinit.sh does).
fsck_all=clean
unclean=""   # contenders with an unclean image (sections 1-6)
zeroed_groups() { # image or device -> "zeroed/total"
    dumpe2fs "$1" 2>/dev/null | awk '/^Group [0-9]+:/{t++; if ($0 ~ /ITABLE_ZEROED/) z++} END{print z+0 "/" t+0}'
}

mnt=$work/mnt
mkdir -p "$mnt"

base=$work/base.img
img=$work/run.img
mkbase() {
    log "base image: mke2fs 16G (lazy_itable_init=0)"
    rm -f -- "$base"
    truncate -s 16G "$base"
    mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=0,lazy_journal_init=0,nodiscard,hash_seed=$hash_seed" "$base"
}
fresh() { # -> $img, a copy of the base image, its pages written back
    rm -f -- "$img"
    cp --sparse=always -- "$base" "$img"
    sync -f "$img"
}
# order R: the contenders of sections 1-6 rotated by R
order() {
    echo $systems | awk -v r="$1" '{n = NF; for (i = 0; i < n; i++) printf "%s ", $(((i + r) % n) + 1)}'
}
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

# Results: T[section.system] = "v1 v2 ...", F[section.system] = fsck words.
declare -A T=() T2=() F=() TO=()
note_fsck() { # key result
    F[$1]+="$2 "
    [[ $2 == clean ]] || fsck_all=UNCLEAN
    [[ $2 == clean ]] || unclean+=" ${1#*.}"
}

# run_case SECTION SYSTEM: one timed run on a fresh image; appends to T.
run_case() {
    local s=$1 sys=$2 t0 t1 rc=0 v extra="" opts=""
    fresh
    [[ $sys == ext4kit || $sys == base ]] && opts=$ours_opts
    [[ $sys == ext4kit-wb || $sys == base-wb ]] && opts=writeback_cache${ours_opts:+,$ours_opts}
    up "$sys" "$img" "$opts"
    local to=()
    [[ $sys != kernel ]] && to=(timeout "$f2_timeout")
    case $s in
    1|2)
        pm_cfg "$work/pm.cfg" "$mnt" "$pm_n" "$pm_n"
        t0=$(now)
        "${to[@]}" postmark "$work/pm.cfg" >"$work/out" 2>&1 || rc=$?
        t1=$(now)
        v=$(sub "$t1" "$t0")
        ;;
    3)
        t0=$(now)
        "${to[@]}" dd if=/dev/zero of="$mnt/f" bs=1M count=1024 conv=fsync >"$work/out" 2>&1 || rc=$?
        t1=$(now)
        v=$(sub "$t1" "$t0")
        ;;
    4)
        t0=$(now)
        "${to[@]}" tar -xf "$work/src.tar" -C "$mnt" >"$work/out" 2>&1 || rc=$?
        [[ $rc -ne 0 ]] || sync
        t1=$(now)
        v=$(sub "$t1" "$t0")
        ;;
    5|6)
        local mode=(--rw=randwrite --size=512m)
        [[ $s == 6 ]] && mode=(--rw=write --fsync=1 --size=256m)
        "${to[@]}" fio --name=bench --directory="$mnt" --bs=4k --ioengine=psync --direct=0 \
            "${mode[@]}" --runtime="$fio_secs" --time_based --output-format=json \
            >"$work/out" 2>"$work/out.err" || rc=$?
        v=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["iops"])' "$work/out" 2>/dev/null || echo 0)
        ;;
    esac
    if [[ $rc -eq 124 && $sys != kernel ]]; then
        TO[$s.$sys]=1
        log "   $s $sys: timed out after ${f2_timeout}s"
        down "$sys"
        note_fsck "$s.$sys" "$(fsck_ok "$img")"
        return
    fi
    [[ $rc -eq 0 ]] || { cat "$work/out" "$work/out.err" 2>/dev/null | tail -20 >&2; down "$sys"; die "section $s on $sys failed ($rc)"; }
    if [[ $s == 4 ]]; then
        # The rest of the way to a durable image: unmount (FUSE: until the
        # daemon closed the image) and, for everyone, the image file
        # written back (the loop device's and the daemons' page cache).
        down "$sys"
        sync -f "$img"
        t1=$(now)
        T2[$s.$sys]+="$(sub "$t1" "$t0") "
        extra=", until unmounted and on disk $(sub "$t1" "$t0")s"
    else
        down "$sys"
    fi
    T[$s.$sys]+="$v "
    local f
    f=$(fsck_ok "$img")
    note_fsck "$s.$sys" "$f"
    log "   $s $sys: $v$([[ $s == 5 || $s == 6 ]] && echo " IOPS" || echo s)$extra, fsck $f"
}

section_runs() { # SECTION RUNS [FUSE2FS_RUNS]
    local s=$1 n=$2 nf=${3:-$2} r sys
    for ((r = 0; r < n; r++)); do
        for sys in $(order "$r"); do
            [[ $sys == fuse2fs ]] && ((r >= nf)) && continue
            [[ -n ${TO[$s.$sys]:-} ]] && continue
            run_case "$s" "$sys"
        done
    done
}

make_tar() {
    log "4. making the source tree ($tar_files files) and its tarball"
    python3 - "$work/src" "$tar_files" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(8)
words = [bytes(rnd.choice(b"abcdefghijklmnopqrstuvwxyz_") for _ in range(rnd.randint(2, 12))) for _ in range(4000)]
blob = b" ".join(rnd.choice(words) + (b"\n" if rnd.random() < 0.1 else b"") for _ in range(200000))
dirs = [root]
os.makedirs(root)
made = 0
while made < n:
    # A directory per ~20 files, nested up to 4 deep, as source trees are.
    parent = rnd.choice(dirs[-50:] if rnd.random() < 0.7 else dirs)
    d = os.path.join(parent, f"d{len(dirs):05}")
    if d.count(os.sep) - root.count(os.sep) > 4:
        d = os.path.join(root, f"d{len(dirs):05}")
    os.makedirs(d)
    dirs.append(d)
    for _ in range(min(n - made, rnd.randint(5, 35))):
        size = min(int(rnd.lognormvariate(8.0, 1.3)), 256 * 1024)
        o = rnd.randint(0, len(blob) - size - 1)
        with open(os.path.join(d, f"f{made:06}.rs"), "wb") as fh:
            fh.write(blob[o:o + size])
        made += 1
PY
    tar -cf "$work/src.tar" -C "$work" src
    rm -rf -- "$work/src"
    tar_bytes=$(stat -c %s "$work/src.tar")
}

# =========================================================================
# Sections 7 and 8: online lazy init.
cat >"$work/poll.py" <<'PY'
# poll.py DEV INTERVAL TIMEOUT: wait until every group descriptor of the
# (mounted) block device has ITABLE_ZEROED; print "END FIRST" (epoch s).
# poll.py DEV count: print "zeroed/total" now.
import os, struct, sys, time
dev = sys.argv[1]
fd = os.open(dev, os.O_RDONLY)
def state():
    sb = os.pread(fd, 1024, 1024)
    u32 = lambda o: struct.unpack_from('<I', sb, o)[0]
    blocks = u32(0x4) | (u32(0x150) << 32 if u32(0x60) & 0x80 else 0)
    first, bs, bpg = u32(0x14), 1024 << u32(0x18), u32(0x20)
    ds = struct.unpack_from('<H', sb, 0xFE)[0] if u32(0x60) & 0x80 else 32
    ng = (blocks - first + bpg - 1) // bpg
    gdt = os.pread(fd, ng * ds, (first + 1) * bs)
    return sum(1 for g in range(ng) if struct.unpack_from('<H', gdt, g * ds + 0x12)[0] & 4), ng
if sys.argv[2] == "count":
    z, n = state()
    print(f"{z}/{n}")
    sys.exit()
interval, timeout = float(sys.argv[2]), float(sys.argv[3])
t0 = time.time()
z0, _ = state()
first = None
while True:
    z, n = state()
    if first is None and z > z0:
        first = time.time()
    if z == n:
        now = time.time()
        print(f"{now:.3f} {first if first is not None else now:.3f}")
        break
    if time.time() - t0 > timeout:
        print(f"{time.time():.3f} timeout {z}/{n}")
        sys.exit(1)
    time.sleep(interval)
PY
# ext4kit status of the mount, as "state groups_done/groups_total elapsed work slept"
ours_status() {
    "$ext4kit" status --json "$mnt" 2>/dev/null | python3 -c '
import json, sys
try:
    v = json.load(sys.stdin)["lazyinit"]["status"]
    print(v["state"], "%d/%d" % (v["groups_done"], v["groups_total"]), v["elapsed_secs"], v["work_secs"], v["slept_secs"])
except Exception:
    print("none - 0 0 0")'
}
lazyimg() { # path size
    rm -f -- "$1"
    truncate -s "$2" "$1"
    mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=1,nodiscard,hash_seed=$hash_seed" "$1"
    sync -f "$1"
}

section7() {
    local m r t0 t1 st g el wk sl
    declare -gA L7=()
    log "7. online lazy init, idle 1 TiB sparse lazy image"
    for ((r = 0; r < li_runs; r++)); do
        for m in 10 0; do
            lazyimg "$img" 1T
            t0=$(now)
            up ext4kit "$img" "init_itable=$m"
            while :; do
                read -r st g el wk sl < <(ours_status)
                [[ $st == done || $st == failed || $st == stopped ]] && break
                awk -v a="$(now)" -v b="$t0" 'BEGIN{exit !(a - b > 900)}' && die "7: ext4kit x$m not done after 900 s"
                sleep 0.05
            done
            t1=$(now)
            down ext4kit
            [[ $st == done ]] || die "7: ext4kit lazy init ended $st"
            L7[$m.wall]+="$(sub "$t1" "$t0") "; L7[$m.el]+="$el "; L7[$m.work]+="$wk "; L7[$m.slept]+="$sl "
            L7[$m.groups]=$(zeroed_groups "$img")
            local f; f=$(fsck_ok "$img"); L7[$m.fsck]+="$f "; [[ $f == clean ]] || fsck_all=UNCLEAN
            log "   ext4kit init_itable=$m: worker ${el}s (work ${wk}s, slept ${sl}s), seen done $(sub "$t1" "$t0")s after the mount started, groups ${L7[$m.groups]}, fsck $f"
        done
    done
    L7[k.secs]="not run"; L7[k.active]=-; L7[k.groups]=-; L7[k.fsck]=-
    if [[ $no_kpace == 1 ]]; then rm -f -- "$img"; return; fi
    log "   kernel init_itable=10 (about 70 s idle)"
    lazyimg "$img" 1T
    attach "$img"; local l=$loop out
    t0=$(now)
    mount -t ext4 -o init_itable=10 "$l" "$mnt"; mounts+=("$mnt")
    out=$(python3 "$work/poll.py" "$l" 0.05 900) || die "7: kernel lazy init timed out: $out"
    local k_end k_first
    read -r k_end k_first <<<"$out"
    umount "$mnt"; mounts=("${mounts[@]/$mnt/}")
    detach "$l"
    L7[k.secs]=$(sub "$k_end" "$t0"); L7[k.active]=$(sub "$k_end" "$k_first")
    L7[k.groups]=$(zeroed_groups "$img"); L7[k.fsck]=$(fsck_ok "$img")
    [[ ${L7[k.fsck]} == clean ]] || fsck_all=UNCLEAN
    log "   kernel init_itable=10: ${L7[k.secs]}s from mount (first→last group ${L7[k.active]}s), groups ${L7[k.groups]}, fsck ${L7[k.fsck]}"
    rm -f -- "$img"
}

section8() {
    local sys c r t0 t1 rc opts st g el wk sl z
    declare -gA L8=()
    log "8. postmark (seed) on a 1 TiB lazy image, loop device with discard off"
    pm_cfg "$work/pm8.cfg" "$mnt" "$li8_n" "$li8_n"
    for ((r = 0; r < li8_runs; r++)); do
        for sys in kernel ext4kit; do
            for c in on off; do
                lazyimg "$img" 1T
                attach "$img"; local l=$loop
                no_discard "$l"
                if [[ $c == on ]]; then opts=init_itable=10; else opts=noinit_itable; fi
                up "$sys" "$l" "$opts"
                t0=$(now); rc=0
                postmark "$work/pm8.cfg" >"$work/out" 2>&1 || rc=$?
                t1=$(now)
                [[ $rc -eq 0 ]] || { tail "$work/out" >&2; die "8: postmark on $sys failed"; }
                if [[ $sys == ext4kit ]]; then
                    read -r st z el wk sl < <(ours_status)
                    [[ $c == on ]] || z="-"
                else
                    z=$([[ $c == on ]] && python3 "$work/poll.py" "$l" count || echo -)
                fi
                down "$sys"
                detach "$l"
                local f; f=$(fsck_ok "$img"); [[ $f == clean ]] || fsck_all=UNCLEAN
                L8[$sys.$c]+="$(sub "$t1" "$t0") "; L8[$sys.$c.z]+="$z "; L8[$sys.$c.f]+="$f "
                log "   $sys $opts: postmark $(sub "$t1" "$t0")s, groups zeroed by its end: $z, fsck $f"
                rm -f -- "$img"
            done
        done
    done
}

# =========================================================================
load_start=$(loadavg)
date_start=$(date -u '+%Y-%m-%d %H:%M UTC')
log "load average at start: $load_start"
if want 1 || want 2 || want 3 || want 4 || want 5 || want 6; then mkbase; fi
if want 1; then log "1. postmark seed parameters (50000/50000)"; pm_n=50000; section_runs 1 "$pm_seed_runs" "$f2_seed_runs"; fi
if want 2; then log "2. postmark 2000/2000"; pm_n=2000; section_runs 2 "$runs"; fi
if want 3; then log "3. dd 1 GiB conv=fsync"; section_runs 3 "$runs"; fi
if want 4; then make_tar; log "4. untar + sync"; section_runs 4 "$runs"; fi
if want 5; then log "5. fio 4k randwrite buffered"; section_runs 5 "$runs"; fi
if want 6; then log "6. fio 4k write + fsync"; section_runs 6 "$runs"; fi
want 7 && section7
want 8 && section8
load_end=$(loadavg)

# =========================================================================
# Report
kernel_v() { uname -r; }
f2ver=$(dpkg-query -W -f '${Version}' fuse2fs 2>/dev/null || echo "?")
cat <<EOF
## mount

Produced by \`scripts/bench-mount.sh\` on $date_start.

| machine | |
|---|---|
| kernel | $(uname -r) |
| CPUs | $(nproc) × $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo) |
| memory | $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) |
| filesystem holding the images | $(findmnt -no SOURCE,FSTYPE -T "$work" | awk '{print $1, $2}') |
| e2fsprogs / fuse2fs | $(mke2fs -V 2>&1 | sed -n 1p) / fuse2fs $f2ver |
| ext4kit | $ext4kit_rev$([[ -n $threads ]] && echo ", --threads $threads")$([[ -n $ours_opts ]] && echo ", -o $ours_opts") |
| load average (1, 5, 15 min) | start $load_start, end $load_end |

EOF

# row SECTION NAME UNIT(s|iops): one table row per section
met() { # value op limit -> met/missed
    awk -v v="$1" -v op="$2" -v l="$3" 'BEGIN{if (v == "-" || v == "") {print "-"; exit}
        ok = (op == "le") ? (v <= l) : (v >= l); print ok ? "met" : "**missed**"}'
}
# per-system median of time per unit of work -> M[sys]
row() {
    local s=$1 name=$2 unit=$3 sys out fs goal lim op
    declare -A M=() C=()
    for sys in kernel ext4kit ext4kit-wb fuse2fs; do
        M[$sys]=""; C[$sys]="-"
        if [[ -n ${T[$s.$sys]:-} ]]; then
            if [[ $unit == iops ]]; then
                M[$sys]=$(python3 -c 'import sys,statistics; print(1/statistics.median(float(x) for x in sys.argv[1:]))' ${T[$s.$sys]})
            else
                M[$sys]=$(median ${T[$s.$sys]})
            fi
            C[$sys]=$(med ${T[$s.$sys]})
        fi
        if [[ -n ${TO[$s.$sys]:-} ]]; then
            # Given up: at least the timeout.
            if [[ -z ${T[$s.$sys]:-} ]]; then C[$sys]="> $f2_timeout"; M[$sys]=$f2_timeout; else C[$sys]+=", a run > $f2_timeout"; fi
        fi
    done
    case $s in
    1|2) lim=2; op=le ;;
    3) lim=1.25; op=le ;;
    *) lim=; op= ;;
    esac
    out="| $name | ${C[kernel]} | ${C[ext4kit]} | ${C[ext4kit-wb]} | ${C[fuse2fs]}"
    # A contender given up with no run finished has only a lower bound.
    bound() { [[ -n ${TO[$s.$1]:-} && -z ${T[$s.$1]:-} ]]; }
    for sys in ext4kit ext4kit-wb; do
        local r g; r=$(ratio "${M[$sys]}" "${M[kernel]}")
        g=$(met "$r" "$op" "$lim")
        if bound "$sys" && [[ $r != - ]]; then
            [[ $g == met ]] && g="unknown"
            r="≥ $r"
        fi
        if [[ -n $lim ]]; then out+=" | $r, $g"; else out+=" | $r"; fi
    done
    for sys in ext4kit ext4kit-wb; do
        local r g; r=$(ratio "${M[fuse2fs]}" "${M[$sys]}")
        g=$(met "$r" ge 2)
        if bound "$sys" && [[ $r != - ]]; then
            # Both given up, or only ours: nothing to compare.
            r="-"; g="unknown"
        elif bound fuse2fs && [[ $r != - ]]; then
            [[ $g == met ]] || g="unknown"
            r="≥ $r"
        fi
        out+=" | $r, $g"
    done
    fs=""
    for sys in kernel ext4kit ext4kit-wb fuse2fs; do
        [[ -n ${F[$s.$sys]:-} ]] || continue
        if [[ ${F[$s.$sys]} == *UNCLEAN* ]]; then fs+="$sys UNCLEAN, "; else fs+="$sys clean, "; fi
    done
    echo "$out | ${fs%, } |"
}
# base_row SECTION NAME UNIT: ext4kit against EXT4KIT_BASE (same run)
base_row() {
    local s=$1 name=$2 unit=$3 sys
    declare -A M=() C=()
    for sys in base ext4kit base-wb ext4kit-wb; do
        M[$sys]=""; C[$sys]="-"
        [[ -n ${T[$s.$sys]:-} ]] || continue
        if [[ $unit == iops ]]; then
            M[$sys]=$(python3 -c 'import sys,statistics; print(1/statistics.median(float(x) for x in sys.argv[1:]))' ${T[$s.$sys]})
        else
            M[$sys]=$(median ${T[$s.$sys]})
        fi
        C[$sys]=$(med ${T[$s.$sys]})
    done
    echo "| $name | ${C[base]} | ${C[ext4kit]} | ${C[base-wb]} | ${C[ext4kit-wb]} | $(ratio "${M[ext4kit]}" "${M[base]}") | $(ratio "${M[ext4kit-wb]}" "${M[base-wb]}") |"
}
if want 1 || want 2 || want 3 || want 4 || want 5 || want 6; then
    cat <<EOF
### Workloads (median (min–max) of the runs; runs interleaved)

Runs per contender: $runs (section 1: kernel and ext4kit $pm_seed_runs, fuse2fs $f2_seed_runs, given up after $f2_timeout s).
Image: a fresh copy of one 16 GiB \`mke2fs -t ext4 -E lazy_itable_init=0\` image per run.
Ratios are of medians of time per unit of work (seconds, or 1/IOPS):
ext4kit/kernel > 1: ext4kit slower; fuse2fs/ext4kit > 1: ext4kit faster.

Goals (from the issue): postmark ext4kit/kernel ≤ 2; streaming writes (dd)
≥ 0.8× the kernel's throughput, i.e. ext4kit/kernel ≤ 1.25; fuse2fs/ext4kit
≥ 2 everywhere. "ext4kit wb" is \`ext4kit mount -o writeback_cache\`.

| test | kernel | ext4kit | ext4kit wb | fuse2fs | ext4kit/kernel | wb/kernel | fuse2fs/ext4kit | fuse2fs/wb | e2fsck -fn |
|---|---|---|---|---|---|---|---|---|---|
EOF
    want 1 && row 1 "postmark 50000/50000 (seed), s" s
    want 2 && row 2 "postmark 2000/2000, s" s
    want 3 && row 3 "dd 1 GiB conv=fsync, s" s
    want 4 && row 4 "untar $tar_files files ($(awk -v b="${tar_bytes:-0}" 'BEGIN{printf "%.0f MiB", b / 1048576}')) + sync, s" s
    want 5 && row 5 "fio 4k randwrite buffered psync ${fio_secs} s, IOPS" iops
    want 6 && row 6 "fio 4k write + fsync each ${fio_secs} s, IOPS" iops
    if [[ " $systems " == *" base"* ]]; then
        cat <<EOF

Before/after (base: EXT4KIT_BASE, an earlier build, in the same interleaved run; ratio = time per unit of work of ext4kit / base, < 1: faster now):

| test | base | ext4kit | base wb | ext4kit wb | ext4kit/base | wb/base wb |
|---|---|---|---|---|---|---|
EOF
        want 1 && base_row 1 "postmark 50000/50000 (seed), s" s
        want 2 && base_row 2 "postmark 2000/2000, s" s
        want 3 && base_row 3 "dd 1 GiB conv=fsync, s" s
        want 4 && base_row 4 "untar $tar_files files + sync, s" s
        want 5 && base_row 5 "fio 4k randwrite buffered psync, IOPS" iops
        want 6 && base_row 6 "fio 4k write + fsync each, IOPS" iops
    fi
    if want 4; then
        echo
        echo "Untar until the unmount is complete and the image file is written back (FUSE's \`sync\` does not reach the daemon), s: kernel $(med ${T2[4.kernel]:-}), ext4kit $(med ${T2[4.ext4kit]:-}), ext4kit wb $(med ${T2[4.ext4kit-wb]:-}), fuse2fs $(med ${T2[4.fuse2fs]:-})."
    fi
    if want 3; then
        echo
        mibs() { [[ -n ${T[3.$1]:-} ]] && ratio 1024 "$(median ${T[3.$1]})" || echo -; }
        echo "dd throughput (MiB/s, from the medians): kernel $(mibs kernel), ext4kit $(mibs ext4kit), ext4kit wb $(mibs ext4kit-wb), fuse2fs $(mibs fuse2fs)."
    fi
    echo
fi
if want 7; then
    cat <<EOF
### Online lazy init, idle 1 TiB sparse lazy image (8192 groups)

ext4kit: \`ext4kit mount -f -o init_itable=N IMG MNT\`; worker time from
\`ext4kit status --json\` (its \`elapsed_secs\` when \`state\` is done), and
the wall time from starting the mount until the status (rewritten every
second) said done; $li_runs runs each. Kernel: \`mount -o init_itable=10\`
of the image's loop device, from mount until every descriptor has
ITABLE_ZEROED (polled every 50 ms), one run. Groups: dumpe2fs after the
unmount.

| contender | worker s | from mount s | work s | slept s | groups zeroed | e2fsck |
|---|---|---|---|---|---|---|
| kernel, init_itable=10 | - | ${L7[k.secs]} (first→last group ${L7[k.active]}) | - | - | ${L7[k.groups]} | ${L7[k.fsck]} |
| ext4kit mount, init_itable=10 (default) | $(med ${L7[10.el]}) | $(med ${L7[10.wall]}) | $(med ${L7[10.work]}) | $(med ${L7[10.slept]}) | ${L7[10.groups]} | $([[ ${L7[10.fsck]} == *UNCLEAN* ]] && echo UNCLEAN || echo clean) |
| ext4kit mount, init_itable=0 | $(med ${L7[0.el]}) | $(med ${L7[0.wall]}) | $(med ${L7[0.work]}) | $(med ${L7[0.slept]}) | ${L7[0.groups]} | $([[ ${L7[0.fsck]} == *UNCLEAN* ]] && echo UNCLEAN || echo clean) |

ext4kit init_itable=10 worker / kernel init_itable=10 from mount: **$([[ $no_kpace == 1 ]] && echo "n/a (kernel not run)" || ratio "$(median ${L7[10.el]})" "${L7[k.secs]}")**.

EOF
fi
if want 8; then
    cat <<EOF
### postmark (seed parameters) while online lazy init runs

A fresh 1 TiB lazy image per run, attached to a loop device with
\`queue/discard_max_bytes\` = 0 (zeroing writes real zeros: 16 GiB of
inode tables), mounted by the contender (ext4kit on the loop device) with
\`init_itable=10\` or \`noinit_itable\`; postmark with the seed's
parameters on it (number = transactions = $li8_n). Groups zeroed by the end of the postmark: ext4kit's
status, the kernel's descriptors through the loop device. $li8_runs run(s) per case.

| contender | postmark s, lazy init off | postmark s, init_itable=10 | slowdown | groups zeroed during it | e2fsck |
|---|---|---|---|---|---|
EOF
    for sys in kernel ext4kit; do
        off=$(median ${L8[$sys.off]}); on=$(median ${L8[$sys.on]})
        echo "| $sys | $(med ${L8[$sys.off]}) | $(med ${L8[$sys.on]}) | $(awk -v a="$on" -v b="$off" 'BEGIN{printf "%+.1f%%", (a / b - 1) * 100}') | ${L8[$sys.on.z]} | $([[ "${L8[$sys.on.f]}${L8[$sys.off.f]}" == *UNCLEAN* ]] && echo UNCLEAN || echo clean) |"
    done
    echo
fi
echo "Every image e2fsck -fn: $fsck_all$([[ -n $unclean ]] && echo " (unclean: $(echo $unclean | tr ' ' '\n' | sort | uniq -c | awk '{printf "%s%s ×%s", (NR > 1 ? ", " : ""), $2, $1}'))"). Load average at the end: $load_end."
log "done"
