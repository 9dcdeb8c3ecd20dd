#!/usr/bin/env bash
# Benchmark `ext4kit lazyinit` against the kernel's ext4lazyinit thread,
# side by side, in one run on this machine.
#
# Every image is made by the same command with a fixed identity
#   E2FSPROGS_FAKE_TIME=... mke2fs -F -q -t ext4 -U UUID \
#       -E lazy_itable_init=1,nodiscard,hash_seed=SEED IMG
# on a freshly truncated sparse file, so every contender starts from a
# byte-identical filesystem with no group flagged ITABLE_ZEROED.
#
# Kernel: the image is attached to a loop device (losetup -f --show), mounted
# under the work dir, and the group descriptors are polled every 50 ms
# through the loop device (buffered reads share the page cache with the
# mounted filesystem) until every group has ITABLE_ZEROED; the time counts
# from just before `mount` to that moment. After umount, dumpe2fs confirms
# the count and `e2fsck -fn` must be clean.
# ext4kit: `ext4kit lazyinit --json ...` on the image file (or on a loop
# device where said); time is wall time around the command, and the JSON
# summary gives work_ms / slept_ms; `e2fsck -fn` must be clean.
#
# Sections:
#   1. full speed, 1 TiB sparse lazy image: kernel init_itable=0 (its zeroout
#      becomes a hole punch through the loop device) vs --mult 0
#   2. real writes: the kernel with discard_max_bytes=0 on its loop device
#      (blkdev_issue_zeroout then writes zeros), ours on the file and on a
#      loop device set up the same way; plus an image file full of old data
#   3. pacing: kernel init_itable=10 vs ours --mult 10 / 4 / 0, on cheap
#      groups (holes) and on costly ones (real writes, old data)
#   4. foreground cost: postmark on another image's mount (same disk) alone,
#      with ours (--mult 10) and with ours (--pace adaptive) running; the
#      same with a direct-I/O dd writing to the disk as the foreground; the
#      share of disk busy time (io_ticks) our runs take alone; and the idle
#      completion time of --pace adaptive vs --mult 0 on the same job
#   5. online: the worker of `ext4kit::lazyinit::online` inside an open
#      read-write Filesystem (example binary `online_lazyinit`), idle 1 TiB
#      sparse lazy image, at the default pace (x10) and at full speed,
#      against the kernel's `mount -o init_itable=10`
#
# The report (markdown) goes to stdout, progress to stderr.
#
# Environment:
#   BENCH_FULL=1      1 TiB for the real-writes row (default 256 GiB) and an
#                     8 GiB old-data image (default 4 GiB); ~+5 minutes
#   BENCH_RUNS        runs per contender for section 1 (default 3)
#   BENCH_PM_RUNS     postmark and dd runs per case in section 4 (default 5)
#   BENCH_DD_MIB      MiB the dd foreground of section 4 writes (default 2048)
#   BENCH_IDLE_RUNS   runs per contender of the idle completion (default 3)
#   BENCH_IDLE_SIZE   image size of the idle completion job (default 1T, the
#                     foreground cases' job; smaller only for a quick try)
#   BENCH_SECTIONS    which sections to run (default "1 2 3 4 5"), e.g. "4"
#   BENCH_NO_KPACE=1  skip the kernel init_itable=10 run (~70 s)
#   EXT4KIT           ext4kit binary (default target/release/ext4kit)
#   EXT4KIT_ONLINE    online_lazyinit example binary (default
#                     target/release/examples/online_lazyinit)
#
# Needs root and loop devices; otherwise it says so and exits 0.
# Only loop devices this script attached are used (always detached on exit);
# mounts are only under the temp work dir (always unmounted).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ext4kit=${EXT4KIT:-$repo/target/release/ext4kit}
full=${BENCH_FULL:-0}
runs=${BENCH_RUNS:-3}
pm_runs=${BENCH_PM_RUNS:-5}
dd_mib=${BENCH_DD_MIB:-2048}
idle_runs=${BENCH_IDLE_RUNS:-3}
idle_size=${BENCH_IDLE_SIZE:-1T}
sections=" ${BENCH_SECTIONS:-1 2 3 4 5} "
BENCH_NAME=bench-lazyinit
# shellcheck source=scripts/bench-lib.sh
source "$repo/scripts/bench-lib.sh"
bench_preflight

for t in mke2fs dumpe2fs e2fsck python3 findmnt; do
    command -v $t >/dev/null || die "$t is required"
done
if ! command -v postmark >/dev/null; then
    log "installing postmark"
    apt-get install -y -q postmark >&2 || true
fi
have_postmark=0
command -v postmark >/dev/null && have_postmark=1
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_RUNS must be a positive integer"
[[ $pm_runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_PM_RUNS must be a positive integer"
[[ $dd_mib =~ ^[1-9][0-9]*$ ]] || die "BENCH_DD_MIB must be a positive integer"
[[ $idle_runs =~ ^[1-9][0-9]*$ ]] || die "BENCH_IDLE_RUNS must be a positive integer"
for x in $sections; do [[ $x =~ ^[1-5]$ ]] || die "BENCH_SECTIONS: '$x' is not a section (1-5)"; done

if [[ ! -x $ext4kit ]]; then
    [[ -z ${EXT4KIT:-} ]] || die "EXT4KIT=$ext4kit is not executable"
    log "building ext4kit (cargo build --release -p ext4kit-cli)"
    (cd "$repo" && cargo build --release -p ext4kit-cli >&2) || die "build failed"
fi

online=${EXT4KIT_ONLINE:-$repo/target/release/examples/online_lazyinit}
if want 5 && [[ ! -x $online ]]; then
    [[ -z ${EXT4KIT_ONLINE:-} ]] || die "EXT4KIT_ONLINE=$online is not executable"
    log "building the online_lazyinit example (cargo build --release -p ext4kit --example online_lazyinit)"
    (cd "$repo" && cargo build --release -p ext4kit --example online_lazyinit >&2) || die "build failed"
fi

if [[ $full == 1 ]]; then
    rw_size=1T; old_gib=8
else
    rw_size=256G; old_gib=4
fi

work=$(mktemp -d /tmp/ext4kit-bench-lazyinit.XXXXXX)
[[ $(findmnt -no FSTYPE -T "$work") == ext4 ]] || { rm -rf -- "$work"; die "$work is not on ext4"; }

mounts=()  # mount points we mounted
bgpids=()  # background processes we started
cleanup() {
    set +e
    local p m l
    for p in "${bgpids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    for m in "${mounts[@]}"; do mountpoint -q "$m" && umount "$m"; done
    for l in "${loops[@]}"; do losetup "$l" >/dev/null 2>&1 && detach "$l"; done
    for l in $tainted; do loop_reset "${l#/dev/loop}"; done
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Snapshot the binary: others may rebuild target/ meanwhile.
cp -- "$ext4kit" "$work/ext4kit"
if want 5; then cp -- "$online" "$work/online_lazyinit"; online=$work/online_lazyinit; fi
ext4kit_rev=$(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
ext4kit=$work/ext4kit

export E2FSPROGS_FAKE_TIME=1700000000
uuid=3b8f0c1e-5a7d-4e2b-9c6f-1d4a7e0b2c58
hash_seed=a1c4e7f0-2b5d-4f8a-8c3e-6d9b0e1f4a27

# The disk beneath the work dir (for io_ticks).
disk_dir() {
    local d maj min p
    d=$(stat -c %d "$work")
    maj=$((d >> 8)); min=$((d & 0xff))
    p=$(readlink -f "/sys/dev/block/$maj:$min")
    [[ -e $p/partition ]] && p=$(dirname "$p")
    echo "$p"
}
disk=$(disk_dir)
disk_name=$(basename "$disk")
io_ticks() { awk '{print $10}' "$disk/stat"; }

alloc() { echo $(( $(stat -c %b "$1") * 512 )); }
mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b / 1048576}'; }
gib() { awk -v b="$1" 'BEGIN{printf "%.2f GiB", b / 1073741824}'; }
growth() { # before after -> signed human
    awk -v a="$1" -v b="$2" 'BEGIN{d = b - a; s = d < 0 ? "−" : "+"; if (d < 0) d = -d;
        if (d >= 1073741824) printf "%s%.2f GiB", s, d / 1073741824;
        else printf "%s%.1f MiB", s, d / 1048576}'
}
mkimg() { # path size
    rm -f -- "$1"
    truncate -s "$2" "$1"
    mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=1,nodiscard,hash_seed=$hash_seed" "$1"
}
zeroed_groups() { # image or device -> "zeroed total"
    dumpe2fs "$1" 2>/dev/null | awk '/^Group [0-9]+:/{t++; if ($0 ~ /ITABLE_ZEROED/) z++} END{print z+0, t+0}'
}
fsck_ok() { if e2fsck -fn "$1" >"$work/fsck.out" 2>&1; then echo clean; else echo "UNCLEAN"; cat "$work/fsck.out" >&2; fi; }

# Poll the group descriptors of a (mounted) block device until every group
# has ITABLE_ZEROED; print the wall time (epoch seconds) of that moment.
cat >"$work/poll.py" <<'PY'
import os, struct, sys, time
dev, interval, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
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

# kernel IMG MOUNTOPTS [nodiscard] -> sets k_secs, k_active, k_before, k_after, k_fsck, k_groups
kernel_run() {
    local img=$1 opts=$2 nd=${3:-} l t0 out mnt=$work/mnt
    mkdir -p "$mnt"
    sync -f "$work"
    k_before=$(alloc "$img")
    attach "$img"; l=$loop
    if [[ -n $nd ]]; then
        no_discard "$l"
    elif [[ $(cat "/sys/block/$(basename "$l")/queue/discard_max_bytes") == 0 ]]; then
        die "$l came with discard disabled (left so by another program); cannot measure the hole-punch case"
    fi
    t0=$(now)
    mount -t ext4 -o "$opts" "$l" "$mnt"
    mounts+=("$mnt")
    out=$(python3 "$work/poll.py" "$l" 0.05 900) || die "kernel lazyinit timed out: $out"
    read -r k_end k_first <<<"$out"
    k_secs=$(sub "$k_end" "$t0")
    k_active=$(sub "$k_end" "$k_first")
    umount "$mnt"
    detach "$l"
    sync -f "$work"
    k_after=$(alloc "$img")
    k_groups=$(zeroed_groups "$img")
    k_fsck=$(fsck_ok "$img")
    log "    kernel -o $opts${nd:+ (discard off)}: ${k_secs}s (first to last group ${k_active}s), $(growth "$k_before" "$k_after"), groups zeroed $k_groups, fsck $k_fsck"
}

# ours TARGET ARGS... -> sets o_secs, o_work, o_slept, o_elapsed, o_zeroed, o_skipped, o_groups
# (TARGET is a file or a loop device; sizes are measured by the caller)
ours_run() {
    local target=$1 t0 t1 rc=0
    shift
    t0=$(now)
    "$ext4kit" lazyinit --json "$@" "$target" >"$work/ours.json" 2>"$work/ours.err" || rc=$?
    t1=$(now)
    [[ $rc -eq 0 ]] || { cat "$work/ours.err" >&2; die "ext4kit lazyinit $* $target failed ($rc)"; }
    o_secs=$(sub "$t1" "$t0")
    read -r o_elapsed o_work o_slept o_zeroed o_skipped o_groups < <(summary "$work/ours.json")
    log "    ours $* $(basename "$target"): ${o_secs}s (work ${o_work} ms, slept ${o_slept} ms), zeroed $(mib "$o_zeroed"), skipped $(mib "$o_skipped"), groups $o_groups"
}
summary() { # json-lines file -> elapsed_ms work_ms slept_ms bytes_zeroed bytes_skipped groups_done/total
    python3 - "$1" <<'PY'
import json, sys
s = None
for line in open(sys.argv[1]):
    try: v = json.loads(line)
    except ValueError: continue
    if v.get("event") == "summary": s = v
if s is None: print("0 0 0 0 0 none"); sys.exit()
d = s["devices"]
print(s["elapsed_ms"], sum(x["work_ms"] for x in d), s["slept_ms"],
      sum(x["bytes_zeroed"] for x in d), sum(x["bytes_skipped_already_zero"] for x in d),
      f'{sum(x["groups_done"] for x in d)}/{sum(x["groups_total"] for x in d)}')
PY
}
batch_mult() { # json-lines file -> time-weighted median multiplier and load of the batches
    python3 - "$1" <<'PY'
import json, sys
# Each batch weighs its work plus the wait after it: the multiplier that
# was in effect for half of the run's time, not of its batches (short
# batches at full speed would outnumber the long waits of a paced phase).
b = []
for line in open(sys.argv[1]):
    try: v = json.loads(line)
    except ValueError: continue
    if v.get("event") == "batch":
        b.append((v["work_us"] + v["wait_us"], v["mult"], v["load"]))
def wmedian(pairs):
    pairs = sorted(pairs, key=lambda p: p[1])
    half, acc = sum(w for w, _ in pairs) / 2, 0
    for w, x in pairs:
        acc += w
        if acc >= half: return x
    return pairs[-1][1]
if b and sum(x[0] for x in b) > 0:
    print(f"{wmedian([(w, m) for w, m, _ in b]):.2f} {wmedian([(w, l) for w, _, l in b]):.3f} {len(b)}")
else:
    print("- - 0")
PY
}

batch_ratio() { # json-lines file -> sum(wait)/sum(work) over all batches but the last, batch count
    python3 - "$1" <<'PY'
import json, sys
b = []
for line in open(sys.argv[1]):
    try: v = json.loads(line)
    except ValueError: continue
    if v.get("event") == "batch": b.append((v["work_us"], v["wait_us"]))
w = sum(x[0] for x in b[:-1])
print(f"{sum(x[1] for x in b[:-1]) / w:.2f}" if w else "n/a", len(b))
PY
}

facts_kernel=$(uname -r)
facts_cpus=$(nproc)
facts_cpu=$(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)
facts_mem=$(awk '/MemTotal/{printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
facts_model=$(cat "$disk/device/model" 2>/dev/null || true)
facts_model=$(echo $facts_model)
[[ -n $facts_model ]] || facts_model="no model string ($(basename "$(readlink -f "$disk/device/driver" 2>/dev/null || echo unknown)") driver)"
facts_disk="$disk_name ($(($(cat "$disk/size") * 512 / 1073741824)) GiB, rotational=$(cat "$disk/queue/rotational" 2>/dev/null || echo ?), $facts_model)"
facts_fs="$(findmnt -no SOURCE,FSTYPE,OPTIONS -T "$work" | awk '{print $1, $2, $3}')"
facts_e2fs=$(mke2fs -V 2>&1 | sed -n 1p)  # sed reads it all: no SIGPIPE under pipefail
facts_date=$(date -u '+%Y-%m-%d %H:%M UTC')

img=$work/lazy.img
# =========================================================================
if want 1; then
log "1. full speed, 1 TiB sparse lazy image (x$runs, interleaved)"
k1=(); k1a=(); o1=(); k1g=(); o1g=(); k1f=clean; o1f=clean; k1z=; o1z=
for r in $(seq "$runs"); do
    mkimg "$img" 1T
    kernel_run "$img" init_itable=0
    k1+=("$k_secs"); k1a+=("$k_active"); k1g+=("$((k_after - k_before))"); [[ $k_fsck == clean ]] || k1f=$k_fsck; k1z=$k_groups
    mkimg "$img" 1T
    sync -f "$work"; b=$(alloc "$img")
    ours_run "$img" --mult 0
    sync -f "$work"; a=$(alloc "$img")
    o1+=("$o_secs"); o1g+=("$((a - b))"); o1z=$(zeroed_groups "$img")
    f=$(fsck_ok "$img"); [[ $f == clean ]] || o1f=$f
    o1work=$o_work; o1mult0_secs=$o_secs
done
k1med=$(median "${k1[@]}"); o1med=$(median "${o1[@]}")
ratio1=$(awk -v o="$o1med" -v k="$k1med" 'BEGIN{printf "%.3f", o / k}')
fi

# =========================================================================
if want 2; then
log "2. real writes ($rw_size sparse image; old-data ${old_gib} GiB image)"
mkimg "$img" "$rw_size"
kernel_run "$img" init_itable=0 nodiscard
k2=("$k_secs" "$k_before" "$k_after" "$k_fsck" "$k_groups" "$k_active")
mkimg "$img" "$rw_size"
sync -f "$work"; b=$(alloc "$img")
ours_run "$img" --mult 0
sync -f "$work"; a=$(alloc "$img")
o2f=("$o_secs" "$b" "$a" "$(fsck_ok "$img")" "$(zeroed_groups "$img")")
mkimg "$img" "$rw_size"
sync -f "$work"; b=$(alloc "$img")
attach "$img"; l=$loop; no_discard "$l"
ours_run "$l" --mult 0
detach "$l"
sync -f "$work"; a=$(alloc "$img")
o2l=("$o_secs" "$b" "$a" "$(fsck_ok "$img")" "$(zeroed_groups "$img")")
rm -f -- "$img"

# Old data: a file full of a non-zero pattern, then a lazy mke2fs on it.
oldimg() { # path
    python3 - "$1" "$old_gib" <<'PY'
import os, sys
path, gib = sys.argv[1], int(sys.argv[2])
chunk = os.urandom(1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(gib * 1024):
    os.write(fd, chunk)
os.fsync(fd)
os.close(fd)
PY
    mke2fs -F -q -t ext4 -U "$uuid" -E "lazy_itable_init=1,nodiscard,hash_seed=$hash_seed" "$1"
    sync -f "$work"
}
old=$work/old.img
log "  old data: kernel (loop discard off: writes zeros)"
oldimg "$old"
kernel_run "$old" init_itable=0 nodiscard
k3n=("$k_secs" "$k_before" "$k_after" "$k_fsck" "$k_groups" "$k_active")
log "  old data: kernel (loop default: punches holes)"
oldimg "$old"
kernel_run "$old" init_itable=0
k3d=("$k_secs" "$k_before" "$k_after" "$k_fsck" "$k_groups" "$k_active")
log "  old data: ours"
oldimg "$old"
b=$(alloc "$old")
ours_run "$old" --mult 0
sync -f "$work"; a=$(alloc "$old")
o3=("$o_secs" "$b" "$a" "$(fsck_ok "$old")" "$(zeroed_groups "$old")")
o3work=$o_work
old_itable=$((o_zeroed + o_skipped))
rm -f -- "$old"
fi

# =========================================================================
if want 3; then
log "3. pacing"
pace_rows=()
for kind in file1t loop; do
    declare -A P=()
    reps=1; [[ $kind == file1t ]] && reps=3   # sub-second runs: median of 3
    for m in 0 4 10; do
        ss=(); ww=(); sl=(); bb=()
        for _ in $(seq $reps); do
            case $kind in
                file1t) mkimg "$img" 1T; t=$img ;;
                loop) mkimg "$img" 128G; attach "$img"; t=$loop; no_discard "$t" ;;
            esac
            ours_run "$t" --mult "$m"
            read -r br nb < <(batch_ratio "$work/ours.json")
            [[ $kind == loop ]] && detach "$t"
            ss+=("$o_secs"); ww+=("$o_work"); sl+=("$o_slept"); bb+=("$br")
        done
        P[$m.secs]=$(median "${ss[@]}"); P[$m.work]=$(median "${ww[@]}"); P[$m.slept]=$(median "${sl[@]}")
        P[$m.groups]=${o_groups#*/}; P[$m.nb]=$nb
        P[$m.br]=$( [[ $m == 0 ]] && echo 0 || median "${bb[@]}")
    done
    pace_rows+=("$kind ${P[0.secs]} ${P[0.work]} ${P[4.secs]} ${P[4.work]} ${P[4.slept]} ${P[10.secs]} ${P[10.work]} ${P[10.slept]} ${P[0.groups]} ${P[0.nb]} ${P[4.br]} ${P[10.br]}")
    unset P
done
rm -f -- "$img"
if [[ ${BENCH_NO_KPACE:-0} != 1 ]] && want 1; then
    log "  kernel init_itable=10 on 1 TiB (about 70 s)"
    mkimg "$img" 1T
    kernel_run "$img" init_itable=10
    kpace=("$k_secs" "$k_fsck" "$k_groups" "$k_active")
fi
fi

# =========================================================================
pm_done=0
if want 4 && [[ $have_postmark == 0 ]]; then
    log "4. skipped: postmark is not installed"
fi
if want 4 && [[ $have_postmark == 1 ]]; then
    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
    log "4. foreground cost: postmark and dd x$pm_runs per case, interleaved (load average $load_before)"
    pmimg=$work/postmark.img
    truncate -s 32G "$pmimg"
    mke2fs -F -q -t ext4 -E lazy_itable_init=0,lazy_journal_init=0 "$pmimg"
    attach "$pmimg"; pml=$loop
    pmmnt=$work/pm
    mkdir -p "$pmmnt"
    mount -t ext4 "$pml" "$pmmnt"
    mounts+=("$pmmnt")
    cat >"$work/pm.cfg" <<EOF
set location $pmmnt
set number 50000
set transactions 50000
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
    # Our job: a fresh 1 TiB lazy image on a loop device with discard off,
    # so ours writes 16 GiB of real zeros (on the image file it would only
    # skip holes and finish in a fraction of a second).
    bg_start() { # args... -> bg_pid, bg_loop, bg_json
        mkimg "$img" 1T
        attach "$img"; bg_loop=$loop; no_discard "$bg_loop"
        sync   # mke2fs's writeback is not the foreground
        bg_json=$work/bg.json
        "$ext4kit" lazyinit --json "$@" "$bg_loop" >"$bg_json" 2>"$work/bg.err" &
        bg_pid=$!
        bgpids+=("$bg_pid")
    }
    bg_stop() { # -> bg_alive (1 if it was still running), bg_rc
        bg_alive=0; bg_rc=0
        if kill -0 "$bg_pid" 2>/dev/null; then bg_alive=1; kill -INT "$bg_pid"; fi
        wait "$bg_pid" || bg_rc=$?
        detach "$bg_loop"
        rm -f -- "$img"
    }
    # The foregrounds (output in $work/fg.out, last line shown in the log).
    fg_postmark() {
        postmark "$work/pm.cfg" >"$work/fg.out" 2>&1 || die "postmark failed: $(cat "$work/fg.out")"
    }
    fg_dd() { # direct I/O to a new file next to the images (same disk)
        rm -f -- "$work/dd.out"
        dd if=/dev/zero of="$work/dd.out" bs=1M count="$dd_mib" oflag=direct conv=fsync \
            >"$work/fg.out" 2>&1 || die "dd failed: $(cat "$work/fg.out")"
        rm -f -- "$work/dd.out"
    }
    # fg_cases KIND FUNCTION: (a) alone, (b) with --mult 10, (c) with
    # --pace adaptive, interleaved a b c a b c ...; results in FT, FB, FO,
    # FM keyed "KIND.CASE".
    declare -A FT=() FB=() FO=() FM=()
    fg_cases() {
        local kind=$1 fn=$2 r c i0 t0 i1 t1 secs extra bm bl bn
        for r in $(seq "$pm_runs"); do
            for c in a b c; do
                sync; sleep 1
                case $c in
                    b) bg_start --mult 10; sleep 1 ;;
                    c) bg_start --pace adaptive; sleep 1 ;;
                esac
                i0=$(io_ticks); t0=$(now)
                $fn
                t1=$(now); i1=$(io_ticks)
                secs=$(sub "$t1" "$t0")
                FT[$kind.$c]+="$secs "
                FB[$kind.$c]+="$(awk -v d=$((i1 - i0)) -v t="$secs" 'BEGIN{printf "%.1f", d / 10 / t}') "
                extra=
                if [[ $c != a ]]; then
                    bg_stop
                    [[ $bg_alive == 1 ]] || extra=" (ours FINISHED before the foreground!)"
                    [[ $bg_alive == 0 || $bg_rc == 130 ]] || die "ext4kit lazyinit exited $bg_rc: $(cat "$work/bg.err")"
                    FO[$kind.$c]+="$bg_alive "
                    read -r bm bl bn < <(batch_mult "$bg_json")
                    FM[$kind.$c]+="$bm/$bl "
                    extra+=" ours: median mult $bm, load $bl over $bn batches"
                fi
                log "    $kind run $r case $c: ${secs}s, disk busy $(echo ${FB[$kind.$c]} | awk '{print $NF}')%$extra"
                log "      $(tail -n 1 "$work/fg.out")"
            done
        done
    }
    fg_cases postmark fg_postmark
    fg_cases dd fg_dd
    # Ours alone: share of disk busy time over 15 s.
    alone() { # label args...
        local label=$1; shift
        bg_start "$@"
        local i0 t0 i1 t1
        i0=$(io_ticks); t0=$(now)
        sleep 15
        i1=$(io_ticks); t1=$(now)
        bg_stop
        read -r _ al_work al_slept al_zeroed _ al_groups < <(summary "$bg_json")
        al_busy=$(awk -v d=$((i1 - i0)) -v t="$(sub "$t1" "$t0")" 'BEGIN{printf "%.1f", d / 10 / t}')
        log "    ours alone $label: disk busy ${al_busy}% of 15 s, work ${al_work} ms, slept ${al_slept} ms, zeroed $(mib "$al_zeroed"), groups $al_groups"
    }
    sync; sleep 1
    i0=$(io_ticks); t0=$(now); sleep 10; idle_busy=$(awk -v d=$(($(io_ticks) - i0)) -v t="$(sub "$(now)" "$t0")" 'BEGIN{printf "%.1f", d / 10 / t}')
    alone "--mult 10" --mult 10
    alone10=("$al_busy" "$al_work" "$al_slept" "$al_zeroed" "$al_groups")
    alone "--pace adaptive" --pace adaptive
    aloneA=("$al_busy" "$al_work" "$al_slept" "$al_zeroed" "$al_groups")
    alone "--mult 0" --mult 0
    alone0=("$al_busy" "$al_work" "$al_slept" "$al_zeroed" "$al_groups")
    umount "$pmmnt"
    detach "$pml"
    # Idle completion: the same job to the end, --mult 0 vs --pace adaptive,
    # interleaved; nothing else runs.
    log "  idle completion: --mult 0 vs --pace adaptive x$idle_runs, interleaved"
    ic0=(); icA=(); icAm=(); ic_fsck=clean
    for r in $(seq "$idle_runs"); do
        for m in 0 A; do
            mkimg "$img" "$idle_size"
            attach "$img"; l=$loop; no_discard "$l"
            sync; sleep 2   # mke2fs's writeback is not ours to measure
            if [[ $m == 0 ]]; then ours_run "$l" --mult 0; else ours_run "$l" --pace adaptive; fi
            read -r bm bl bn < <(batch_mult "$work/ours.json")
            detach "$l"
            [[ ${o_groups%/*} == "${o_groups#*/}" ]] || die "idle completion: groups $o_groups"
            if [[ $r == "$idle_runs" ]]; then f=$(fsck_ok "$img"); [[ $f == clean ]] || ic_fsck=$f; fi
            ic_bytes=$o_zeroed
            if [[ $m == 0 ]]; then ic0+=("$o_secs"); else icA+=("$o_secs"); icAm+=("$bm/$bl"); fi
            rm -f -- "$img"
        done
    done
    load_after=$(cut -d' ' -f1-3 /proc/loadavg)
    pm_done=1
fi

# =========================================================================
if want 5; then
log "5. online lazy init, idle 1 TiB sparse lazy image (x$runs per pace)"
load5_before=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A O5=()
for m in 10 0; do
    ss=(); ww=(); sl=(); f5=clean; z5=
    for _ in $(seq "$runs"); do
        mkimg "$img" 1T
        t0=$(now)
        "$online" "$img" "$m" >"$work/online.json" 2>"$work/online.err" || { cat "$work/online.err" >&2; die "online_lazyinit $m failed"; }
        t1=$(now)
        read -r w s g < <(python3 - "$work/online.json" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
print(v["work_secs"], v["slept_secs"], f'{v["groups_done"]}/{v["groups_total"]}')
PY
)
        f=$(fsck_ok "$img"); [[ $f == clean ]] || f5=$f
        z5=$(zeroed_groups "$img")
        ss+=("$(sub "$t1" "$t0")"); ww+=("$w"); sl+=("$s")
        log "    online x$m: $(sub "$t1" "$t0") s (worker: work $w s, slept $s s), groups $g, zeroed per dumpe2fs ${z5/ //}, fsck $f"
    done
    O5[$m.secs]=$(med "${ss[@]}"); O5[$m.med]=$(median "${ss[@]}")
    O5[$m.work]=$(med "${ww[@]}"); O5[$m.slept]=$(med "${sl[@]}")
    O5[$m.fsck]=$f5; O5[$m.groups]=$z5
done
if [[ -z ${kpace[0]:-} && ${BENCH_NO_KPACE:-0} != 1 ]]; then
    log "  kernel init_itable=10 on 1 TiB (about 70 s)"
    mkimg "$img" 1T
    kernel_run "$img" init_itable=10
    kpace=("$k_secs" "$k_fsck" "$k_groups" "$k_active")
fi
rm -f -- "$img"
load5_after=$(cut -d' ' -f1-3 /proc/loadavg)
fi

# =========================================================================
# Report
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if (b > 0) printf "%.2f", a / b; else print "n/a"}'; }
cat <<EOF
## lazyinit

Produced by \`scripts/bench-lazyinit.sh\`$( [[ $full == 1 ]] && echo " (BENCH_FULL=1)" ) on $facts_date.

| machine | |
|---|---|
| kernel | $facts_kernel |
| CPUs | $facts_cpus × $facts_cpu |
| memory | $facts_mem |
| disk under the images | $facts_disk |
| filesystem holding the images | $facts_fs |
| e2fsprogs | $facts_e2fs |
| ext4kit | $ext4kit_rev |

Images: \`mke2fs -F -q -t ext4 -E lazy_itable_init=1,nodiscard\` with a fixed
UUID, hash seed and \`E2FSPROGS_FAKE_TIME\` on a fresh sparse file, so every
contender starts from the same bytes (no group ITABLE_ZEROED). Kernel time:
from \`mount\` of the image's loop device until every group descriptor (read
through the loop device every 50 ms) has ITABLE_ZEROED. ext4kit time: wall
time of \`ext4kit lazyinit\`. Allocation: \`stat -c %b\` × 512 before/after.
Every result was checked with \`e2fsck -fn\` and dumpe2fs's group flags.
EOF
if want 1; then
    cat <<EOF

### 1. Full speed, 1 TiB sparse lazy image ($runs runs each, median (min–max))

| contender | seconds | of which zeroing (first→last group) | file growth | groups zeroed | e2fsck |
|---|---|---|---|---|---|
| kernel, \`mount -o init_itable=0\` (zeroout = hole punch via loop) | $(med "${k1[@]}") | $(med "${k1a[@]}") | $(growth 0 "$(median "${k1g[@]}")") | ${k1z/ //} | $k1f |
| \`ext4kit lazyinit --mult 0 IMG\` | $(med "${o1[@]}") | (all) | $(growth 0 "$(median "${o1g[@]}")") | ${o1z/ //} | $o1f |

ext4kit / kernel time: **$ratio1** (goal ≤ 0.5); against the kernel's zeroing
phase alone: **$(awk -v o="$o1med" -v k="$(median "${k1a[@]}")" 'BEGIN{printf "%.3f", o / k}')**; ext4kit growth: **$(growth 0 "$(median "${o1g[@]}")")** (goal 0).
The kernel's time from mount includes the random start delay of its lazyinit
request (\`lr_next_sched\` = now + up to \`EXT4_DEF_LI_MAX_START_DELAY\` = 5 s),
hence the second column.
EOF
fi
if want 2; then
    cat <<EOF

### 2. Real writes

$rw_size sparse lazy image$( [[ $full == 1 ]] || echo " (256 GiB by default to keep the run short; \`BENCH_FULL=1\` uses 1 TiB)" ); the kernel's loop device has
\`queue/discard_max_bytes\` = 0, so its \`blkdev_issue_zeroout\` writes zeros.

| contender | seconds (kernel: from mount / first→last group) | allocated before | after | growth | groups | e2fsck |
|---|---|---|---|---|---|---|
| kernel, init_itable=0, loop discard off | ${k2[0]} / ${k2[5]} | $(gib "${k2[1]}") | $(gib "${k2[2]}") | $(growth "${k2[1]}" "${k2[2]}") | ${k2[4]/ //} | ${k2[3]} |
| ext4kit --mult 0 on the image file | ${o2f[0]} | $(gib "${o2f[1]}") | $(gib "${o2f[2]}") | $(growth "${o2f[1]}" "${o2f[2]}") | ${o2f[4]/ //} | ${o2f[3]} |
| ext4kit --mult 0 on a loop device, discard off (BLKZEROOUT, real writes) | ${o2l[0]} | $(gib "${o2l[1]}") | $(gib "${o2l[2]}") | $(growth "${o2l[1]}" "${o2l[2]}") | ${o2l[4]/ //} | ${o2l[3]} |

Image file full of old data: ${old_gib} GiB of a non-zero pattern, then the same lazy
mke2fs on it (the inode tables, $(mib "$old_itable") of them, keep the old bytes).

| contender | seconds (kernel: from mount / first→last group) | allocated before | after | growth | groups | e2fsck |
|---|---|---|---|---|---|---|
| kernel, init_itable=0, loop discard off | ${k3n[0]} / ${k3n[5]} | $(gib "${k3n[1]}") | $(gib "${k3n[2]}") | $(growth "${k3n[1]}" "${k3n[2]}") | ${k3n[4]/ //} | ${k3n[3]} |
| kernel, init_itable=0, loop default (punch) | ${k3d[0]} / ${k3d[5]} | $(gib "${k3d[1]}") | $(gib "${k3d[2]}") | $(growth "${k3d[1]}" "${k3d[2]}") | ${k3d[4]/ //} | ${k3d[3]} |
| ext4kit --mult 0 on the image file | ${o3[0]} | $(gib "${o3[1]}") | $(gib "${o3[2]}") | $(growth "${o3[1]}" "${o3[2]}") | ${o3[4]/ //} | ${o3[3]} |
EOF
fi
if want 3; then
    cat <<EOF

### 3. Pacing

ext4kit, fixed pacing, on two kinds of per-group cost. "sleep/work: summary"
is slept_ms / work_ms of the \`--json\` summary; "per batch" is Σwait_us /
Σwork_us of the batch events except the last batch (nothing is waited after
the last one); "(T−T₀)/T₀" uses the \`--mult 0\` run's wall time T₀ as the
work time. The sparse-file row is the median of 3 runs per multiplier. ext4kit works a batch of up to 64 groups (one descriptor block)
between waits; the kernel waits after every group.

| target | groups (batches) | T₀ (--mult 0) | per group | --mult 4: T | T/T₀ | sleep/work: summary, per batch | --mult 10: T | (T−T₀)/T₀ | sleep/work: summary, per batch |
|---|---|---|---|---|---|---|---|---|---|
EOF
for row in "${pace_rows[@]}"; do
    read -r kind s0 w0 s4 w4 sl4 s10 w10 sl10 g nb br4 br10 <<<"$row"
    case $kind in
        file1t) name="1 TiB sparse file (holes skipped)" ;;
        loop) name="128 GiB on a loop device, discard off (2 MiB of real zero writes per group)" ;;
    esac
    pg=$(awk -v t="$s0" -v g="$g" 'BEGIN{printf "%.3f ms", t * 1000 / g}')
    echo "| $name | $g ($nb) | ${s0} s | $pg | ${s4} s | $(ratio "$s4" "$s0") | $(ratio "$sl4" "$w4"), $br4 | ${s10} s | $(awk -v a="$s10" -v b="$s0" 'BEGIN{printf "%.2f", (a - b) / b}') | $(ratio "$sl10" "$w10"), $br10 |"
done
fi
if [[ -n ${kpace[0]:-} ]] && want 1 && want 3; then
    cat <<EOF

Kernel, 1 TiB sparse image, \`mount -o init_itable=10\` (the default):
**${kpace[0]} s** from mount, ${kpace[3]} s from the first to the last group
($(awk -v t="${kpace[3]}" 'BEGIN{printf "%.2f", t * 1000 / 8192}') ms per group; groups ${kpace[2]/ //}; e2fsck ${kpace[1]});
its (T−T₀)/T₀ on the zeroing phases, against section 1's init_itable=0 median
($(median "${k1a[@]}") s), is $(awk -v a="${kpace[3]}" -v b="$(median "${k1a[@]}")" 'BEGIN{printf "%.1f", (a - b) / b}').
ext4kit --mult 10 on the same image: see the first row of the table above.
EOF
fi

# fg_table KIND: the rows of one foreground's table
fg_table() {
    local kind=$1 c name mc ma alive mm
    ma=$(median ${FT[$kind.a]})
    for c in a b c; do
        case $c in
            a) name="(a) $kind alone" ;;
            b) name="(b) + ext4kit lazyinit (--mult 10)" ;;
            c) name="(c) + ext4kit lazyinit --pace adaptive" ;;
        esac
        mc=$(median ${FT[$kind.$c]})
        alive=-; mm=-
        if [[ $c != a ]]; then
            alive="$(echo ${FO[$kind.$c]} | tr ' ' '\n' | grep -c 1)/$pm_runs"
            mm=$(echo ${FM[$kind.$c]} | tr ' ' ',')
        fi
        echo "| $name | $(med ${FT[$kind.$c]}) | $(awk -v a="$mc" -v b="$ma" 'BEGIN{printf "%+.1f%%", (a / b - 1) * 100}') | $(med ${FB[$kind.$c]}) | $alive | $mm |"
    done
}
if [[ $pm_done == 1 ]]; then
    cat <<EOF

### 4. Foreground cost

Load average (1, 5, 15 min) when this section started: $load_before; at its end: $load_after.
Ours works on a fresh 1 TiB lazy image attached to a loop device with
discard off, so it writes 16 GiB of real zeros (on the image file itself it
only skips holes: ~0.1 s in total, nothing to overlap); it is started 1 s
before the foreground and stopped (SIGINT) when the foreground ends. Each
foreground runs $pm_runs times per case, interleaved (a b c a b c ...); median
(min–max). Disk busy = Δio_ticks of /sys/block/$disk_name/stat ÷ wall time.
"vs (a)" compares medians.

#### postmark

postmark on a 32 GiB ext4 image (non-lazy mkfs) mounted through its own loop
device, image in the same directory (same disk, $disk_name). Parameters: the seed
thread's, unchanged (\`number 50000\`, \`transactions 50000\`,
\`read/write 4096\`, \`bias read 5\`, \`bias create 5\`, \`size 1000 200000\`,
\`buffering false\`).

| case | postmark seconds | vs (a) | disk busy % | ours still running at the end | ours' time-weighted median multiplier/load per run |
|---|---|---|---|---|---|
EOF
    fg_table postmark
    cat <<EOF

#### dd, direct I/O

\`dd if=/dev/zero of=FILE bs=1M count=$dd_mib oflag=direct conv=fsync\`, FILE a new
file next to the images (same disk, $disk_name).

| case | dd seconds | vs (a) | disk busy % | ours still running at the end | ours' time-weighted median multiplier/load per run |
|---|---|---|---|---|---|
EOF
    fg_table dd
    cat <<EOF

#### Idle completion

The same job ($idle_size lazy image on a loop device, discard off: $(mib "$ic_bytes") of
zeros) to the end with nothing else running, $idle_runs runs each, interleaved;
wall time of \`ext4kit lazyinit\`, median (min–max); e2fsck of the last images: $ic_fsck.

| contender | seconds | vs --mult 0 | time-weighted median multiplier/load, per run |
|---|---|---|---|
| --mult 0 | $(med "${ic0[@]}") | 1.00 | - |
| --pace adaptive | $(med "${icA[@]}") | $(ratio "$(median "${icA[@]}")" "$(median "${ic0[@]}")") | $(echo "${icAm[@]}" | tr ' ' ',') |

Ours alone on the foreground cases' job (15 s, then SIGINT); disk idle baseline: ${idle_busy}% busy.

| ours alone | disk busy % | work ms | slept ms | sleep/work | zeroed in 15 s |
|---|---|---|---|---|---|
| --mult 10 | ${alone10[0]} | ${alone10[1]} | ${alone10[2]} | $(ratio "${alone10[2]}" "${alone10[1]}") | $(mib "${alone10[3]}") |
| --pace adaptive | ${aloneA[0]} | ${aloneA[1]} | ${aloneA[2]} | $(ratio "${aloneA[2]}" "${aloneA[1]}") | $(mib "${aloneA[3]}") |
| --mult 0 | ${alone0[0]} | ${alone0[1]} | ${alone0[2]} | $(ratio "${alone0[2]}" "${alone0[1]}") | $(mib "${alone0[3]}") |
EOF
elif want 4; then
    printf '\n### 4. Foreground cost\n\nSkipped: postmark is not installed.\n'
fi
if want 5; then
    cat <<EOF

### 5. Online lazy init: the worker inside an open filesystem, idle 1 TiB

\`online_lazyinit IMG MULT\` (\`crates/ext4kit/examples/online_lazyinit.rs\`):
\`Filesystem::open\` of the image file, \`lazyinit::online::start\` at
\`Pace::Fixed { mult }\`, wait until every group is flagged, clean
\`close\` (the flags committed); time is wall time from before the open to
after the close ($runs runs each, median (min–max)). The worker does one
group per unit (the kernel's granularity), each through the allocator's
zeroing lock and one journal handle; on this sparse image every table is a
hole, so a unit is a lock, a SEEK_DATA and a handle. Kernel: as in
section 1, \`mount -o init_itable=10\`.

| contender | seconds | worker: work s | worker: slept s | groups zeroed | e2fsck |
|---|---|---|---|---|---|
| kernel, \`mount -o init_itable=10\` | ${kpace[0]:-not run} | - | - | ${kpace[2]:-} | ${kpace[1]:-} |
| ext4kit online, x10 (default) | ${O5[10.secs]} | ${O5[10.work]} | ${O5[10.slept]} | ${O5[10.groups]/ //} | ${O5[10.fsck]} |
| ext4kit online, x0 (full speed) | ${O5[0.secs]} | ${O5[0.work]} | ${O5[0.slept]} | ${O5[0.groups]/ //} | ${O5[0.fsck]} |

ext4kit online x10 / kernel init_itable=10: **$( [[ -n ${kpace[0]:-} ]] && ratio "${O5[10.med]}" "${kpace[0]}" || echo n/a)**.
Load average (1, 5, 15 min) when this section started: $load5_before; at its end: $load5_after.
EOF
fi
log "done"
