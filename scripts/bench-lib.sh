# Helpers shared by scripts/bench-{engine,lazyinit,mount,real}.sh. Source it
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

# The mount helpers of scripts/bench-{mount,real}.sh. They use the
# caller's globals: $mnt (the mount point), $work (the temp dir, holding
# daemon.log and fsck.out), $ext4kit and $base_bin (binaries), $threads
# (ext4kit mount --threads, may be empty), and record what they start in
# `mounts` and `pids` (the caller's cleanup undoes them); `up` sets
# $cur_loop / $cur_pid for `down`.
fsck_ok() {
    if e2fsck -fn "$1" >"$work/fsck.out" 2>&1; then
        echo clean
    else
        echo UNCLEAN
        tail -20 "$work/fsck.out" >&2
    fi
}
# wait_mounted NAME PID: until MNT is a FUSE mount (the daemon alive)
wait_mounted() {
    local i
    for ((i = 0; i < 600; i++)); do
        if [[ $(findmnt -no FSTYPE "$mnt" 2>/dev/null) == fuse* ]]; then return 0; fi
        kill -0 "$2" 2>/dev/null || { cat "$work/daemon.log" >&2; die "the $1 daemon exited before the mount was live"; }
        sleep 0.05
    done
    die "$1: not mounted after 30 s"
}
# up SYSTEM TARGET [OPTS]: mount TARGET (image or block device) on $mnt
up() {
    local sys=$1 target=$2 opts=${3:-}
    case $sys in
    kernel)
        if [[ -b $target ]]; then
            cur_loop=
            mount -t ext4 ${opts:+-o "$opts"} "$target" "$mnt"
        else
            attach "$target"; cur_loop=$loop
            mount -t ext4 ${opts:+-o "$opts"} "$cur_loop" "$mnt"
        fi
        mounts+=("$mnt")
        ;;
    ext4kit|ext4kit-wb|base|base-wb)
        local args=(mount -f) bin=$ext4kit
        [[ $sys == base* ]] && bin=$base_bin
        [[ -n $threads ]] && args+=(--threads "$threads")
        [[ -n $opts ]] && args+=(-o "$opts")
        "$bin" "${args[@]}" "$target" "$mnt" >"$work/daemon.log" 2>&1 &
        cur_pid=$!; pids+=("$cur_pid"); mounts+=("$mnt")
        wait_mounted ext4kit "$cur_pid"
        ;;
    fuse2fs)
        fuse2fs -f "$target" "$mnt" -o fakeroot${opts:+,$opts} >"$work/daemon.log" 2>&1 &
        cur_pid=$!; pids+=("$cur_pid"); mounts+=("$mnt")
        wait_mounted fuse2fs "$cur_pid"
        ;;
    esac
}
# down SYSTEM: unmount; for FUSE wait until the daemon closed the image
down() {
    local sys=$1 rc=0
    umount "$mnt" || { sleep 1; umount "$mnt"; }
    mounts=("${mounts[@]/$mnt/}")
    case $sys in
    kernel) [[ -z $cur_loop ]] || detach "$cur_loop" ;;
    *)
        wait "$cur_pid" || rc=$?
        pids=("${pids[@]/$cur_pid/}")
        [[ $rc -eq 0 ]] || { cat "$work/daemon.log" >&2; log "warning: $sys daemon exited $rc"; }
        ;;
    esac
}


# Copy $ext4kit (and $EXT4KIT_BASE, if set) into $work, since others may
# rebuild target/ meanwhile; sets ext4kit, base_bin and ext4kit_rev (the
# commit of $repo, marked when crates/ has uncommitted changes).
snapshot_binaries() {
    cp -- "$ext4kit" "$work/ext4kit"
    ext4kit_rev=$(cd "$repo" && git rev-parse --short HEAD 2>/dev/null || echo unknown)
    if [[ -n $(cd "$repo" && git status --porcelain -- crates 2>/dev/null) ]]; then ext4kit_rev+=" (+ uncommitted changes)"; fi
    ext4kit=$work/ext4kit
    base_bin=
    if [[ -n ${EXT4KIT_BASE:-} ]]; then
        cp -- "$EXT4KIT_BASE" "$work/ext4kit-base"
        base_bin=$work/ext4kit-base
    fi
}
