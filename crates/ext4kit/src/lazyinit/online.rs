//! Online lazy init: one background thread zeroes the inode tables of an
//! open, in-use [`Filesystem`], as the kernel's `ext4lazyinit` thread does
//! for a mounted ext4, with the offline engine's steps: [`plan_group`]
//! (the kernel's arithmetic and count checks), [`Zeroer`] (holes skipped,
//! `zeroout`, read-compare by [`VerifyZero`]) and [`Pacer`] (HZ-free,
//! re-measured after every group; fixed `init_itable=N` or adaptive).
//!
//! # One group
//!
//! 1. [`Filesystem::lock_group_for_zeroing`]: waits for an allocation in
//!    the group to finish, then keeps allocation out of it (the kernel's
//!    `down_write(&grp->alloc_sem)`); the range starts past the
//!    `bg_itable_unused` watermark as it is now, and no inode in use may
//!    lie in it (checked against the bitmap).
//! 2. The descriptor is planned again ([`plan_group`]): inconsistent
//!    counts stop the worker; the guard's range must lie inside the
//!    planned one (the watermark only rises).
//! 3. The range is zeroed through the device (the kernel's
//!    `sb_issue_zeroout`), not flushed: the commit that carries the flag
//!    of step 4 flushes the device before its commit block, which makes
//!    the zeros durable first (the kernel's `blkdev_issue_flush` here
//!    costs a cache flush; ours, on an image file, would be an fdatasync
//!    writing back every dirty page of the whole image, the mount's data
//!    included, after every group).
//! 4. [`Filesystem::mark_itable_zeroed`]: `ITABLE_ZEROED` in the
//!    allocator's state, the group released, the descriptor journaled
//!    through a handle (checksum by the render path). The flag reaches the
//!    disk with the next commit; a crash before it only means the group is
//!    zeroed again next time.
//! 5. The pacer says how long to wait before the next group. Short waits
//!    overshoot (timer slack, scheduling: a 100 µs wait may take twice
//!    that); what a wait overslept is taken off the next ones, so that the
//!    waits add up to what the pacer asked for.
//!
//! # Locking
//!
//! The guard of step 1 is held only while zeroing (steps 2-3), never while
//! waiting for the operations mutex: an allocation that finds free inodes
//! only in the group being zeroed waits for the guard while holding that
//! mutex. Step 4 releases the group before it begins its operation.
//!
//! # Control
//!
//! [`start`] plans (refusing inconsistent descriptors before anything is
//! written) and spawns the thread; [`LazyInitHandle`] has
//! [`status`](LazyInitHandle::status) (serde-serializable for `--json`,
//! `Display` for text), [`pause`](LazyInitHandle::pause)/
//! [`resume`](LazyInitHandle::resume) and [`stop`](LazyInitHandle::stop)
//! (joins; the group in progress is finished first). Dropping the handle
//! stops the thread.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use ext4kit_fs::fs::Filesystem;
use ext4kit_fs::groups::Layout;

use super::LazyError;
use super::load::{LoadSignal, SysfsLoad};
use super::pacing::{Clock, MonotonicClock, Pace, Pacer};
use super::plan::{PlanError, plan_group};
use super::zero::{DeviceKind, VerifyZero, ZeroStats, Zeroer};
use crate::image::Geometry;

/// Most oversleeping carried over to the next waits.
const MAX_LAG: Duration = Duration::from_millis(100);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Settings of the online worker.
pub struct OnlineOptions {
    /// Pacing: `Fixed { mult: 10 }` is the kernel's default
    /// `init_itable=10`; `Fixed { mult: 0 }` full speed.
    pub pace: Pace,
    /// Read before zeroing (see [`VerifyZero::read_compare`]).
    pub verify_zero: VerifyZero,
    /// What the device is, for [`VerifyZero::Auto`].
    pub device_kind: DeviceKind,
    /// Contention counters for adaptive pacing (without them adaptive
    /// pacing uses its fallback multiplier).
    pub load: Option<Box<dyn LoadSignal>>,
    /// Time source; `None`: the monotonic clock, and waits that a stop or
    /// pause interrupts at once. A given clock is slept on in slices of
    /// [`OnlineOptions::sleep_slice`] (tests use a fake clock).
    pub clock: Option<Arc<dyn Clock>>,
    /// Work through the groups starting at this one (wrapping around).
    pub start_group: u32,
    /// Longest single sleep on a given clock between checks for stop.
    pub sleep_slice: Duration,
}

impl Default for OnlineOptions {
    fn default() -> Self {
        OnlineOptions {
            pace: Pace::default(),
            verify_zero: VerifyZero::default(),
            device_kind: DeviceKind::Other,
            load: None,
            clock: None,
            start_group: 0,
            sleep_slice: Duration::from_millis(20),
        }
    }
}

impl fmt::Debug for OnlineOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnlineOptions")
            .field("pace", &self.pace)
            .field("verify_zero", &self.verify_zero)
            .field("device_kind", &self.device_kind)
            .field("load", &self.load.is_some())
            .field("clock", &self.clock.is_some())
            .field("start_group", &self.start_group)
            .field("sleep_slice", &self.sleep_slice)
            .finish()
    }
}

impl OnlineOptions {
    /// Options for the filesystem on `path` (an image file or a block
    /// device): its kind for `verify_zero`, and for adaptive pacing the
    /// counters of the disk beneath it when there are any.
    pub fn for_path(path: impl AsRef<Path>, pace: Pace, verify_zero: VerifyZero) -> Self {
        let path = path.as_ref();
        let load: Option<Box<dyn LoadSignal>> = match pace {
            Pace::Adaptive { .. } => {
                SysfsLoad::for_path(path).map(|l| Box::new(l) as Box<dyn LoadSignal>)
            }
            Pace::Fixed { .. } => None,
        };
        OnlineOptions {
            pace,
            verify_zero,
            device_kind: DeviceKind::of_path(path),
            load,
            ..OnlineOptions::default()
        }
    }
}

/// What the worker is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnlineState {
    /// Zeroing a group.
    Running,
    /// Waiting before the next group (pacing).
    Waiting,
    /// Paused by [`LazyInitHandle::pause`].
    Paused,
    /// Every group has `ITABLE_ZEROED`.
    Done,
    /// Stopped before the end ([`LazyInitHandle::stop`]).
    Stopped,
    /// Stopped on an error ([`OnlineStatus::error`]).
    Failed,
}

impl fmt::Display for OnlineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnlineState::Running => "running",
            OnlineState::Waiting => "waiting",
            OnlineState::Paused => "paused",
            OnlineState::Done => "done",
            OnlineState::Stopped => "stopped",
            OnlineState::Failed => "failed",
        })
    }
}

/// Progress of the online worker (`ext4kit status`, text or `--json`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct OnlineStatus {
    pub state: OnlineState,
    /// Groups in the filesystem.
    pub groups_total: u32,
    /// Groups with `ITABLE_ZEROED` (set in memory; durable with the next
    /// commit).
    pub groups_done: u32,
    /// Groups still to do.
    pub groups_left: u32,
    /// Groups this worker flagged.
    pub groups_zeroed_now: u32,
    /// The group being zeroed or next in line.
    pub current_group: Option<u32>,
    /// Bytes of inode table still to be made zero (an upper bound).
    pub bytes_left: u64,
    /// Bytes handed to `zeroout`, found zero already, read by
    /// read-compare; device requests.
    pub bytes_zeroed: u64,
    pub bytes_skipped_already_zero: u64,
    pub bytes_read: u64,
    pub requests: u64,
    /// Seconds since the start, spent working, spent waiting.
    pub elapsed_secs: f64,
    pub work_secs: f64,
    pub slept_secs: f64,
    /// Inode-table bytes made zero (written or found zero) per second of
    /// wall time, and groups per second.
    pub rate_bytes_per_sec: f64,
    pub groups_per_sec: f64,
    /// The pace asked for ("fixed x10", "adaptive, up to x100").
    pub pace: String,
    /// The multiplier in effect (wait = multiplier × smoothed work time).
    pub multiplier: f64,
    /// Adaptive pacing's pressure estimate, 0..1.
    pub load: f64,
    /// Seconds to the end at the rate so far.
    pub eta_secs: Option<f64>,
    /// Why the worker failed.
    pub error: Option<String>,
}

impl fmt::Display for OnlineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lazy init: {}, {}/{} groups zeroed ({} left",
            self.state, self.groups_done, self.groups_total, self.groups_left
        )?;
        if self.bytes_left > 0 {
            write!(f, ", {} of inode tables", human_bytes(self.bytes_left))?;
        }
        write!(
            f,
            "), {}/s, pace {} (now x{:.1})",
            human_bytes(self.rate_bytes_per_sec as u64),
            self.pace,
            self.multiplier
        )?;
        if let Some(eta) = self.eta_secs
            && self.groups_left > 0
        {
            write!(f, ", ETA {}", human_secs(eta))?;
        }
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn human_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

fn pace_name(p: Pace) -> String {
    match p {
        Pace::Fixed { mult: 0 } => "full speed".into(),
        Pace::Fixed { mult } => format!("fixed x{mult}"),
        Pace::Adaptive { max_mult, .. } => format!("adaptive, up to x{max_mult}"),
    }
}

/// The offline planner's geometry for an open filesystem.
fn geometry(l: &Layout) -> Geometry {
    Geometry {
        block_size: l.block_size,
        blocks_count: l.blocks_count,
        first_data_block: l.first_data_block,
        blocks_per_group: l.blocks_per_group,
        inodes_per_group: l.inodes_per_group,
        inodes_count: l.inodes_count,
        inode_size: l.inode_size,
        inodes_per_block: l.inodes_per_block(),
        itable_blocks: l.itable_blocks,
        group_count: l.group_count,
        desc_size: l.desc_size as u32,
        descs_per_block: l.desc_per_block,
        desc_blocks: l.desc_blocks,
        gdt_start: l.desc_block(0),
        first_ino: l.first_ino,
        sb_block: u64::from(l.block_size == 1024),
        reserved_gdt_blocks: l.reserved_gdt_blocks,
        cluster_ratio: 1,
        first_meta_bg: l.meta_bg.then_some(l.first_meta_bg),
        desc_locs: (0..l.desc_blocks).map(|i| l.desc_block(i)).collect(),
    }
}

#[derive(Default)]
struct Ctl {
    stop: bool,
    paused: bool,
}

struct Shared {
    ctl: Mutex<Ctl>,
    cv: Condvar,
    status: Mutex<OnlineStatus>,
}

impl Shared {
    fn status(&self) -> OnlineStatus {
        lock(&self.status).clone()
    }
    fn update(&self, f: impl FnOnce(&mut OnlineStatus)) {
        f(&mut lock(&self.status))
    }
}

/// A cheap, cloneable view of a worker's status, for a mount to hand to
/// whatever answers `ext4kit status` (it keeps answering after the worker
/// ended).
#[derive(Clone)]
pub struct StatusSource(Arc<Shared>);

impl StatusSource {
    pub fn get(&self) -> OnlineStatus {
        self.0.status()
    }
}

impl fmt::Debug for StatusSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StatusSource").field(&self.get()).finish()
    }
}

/// The running worker (see the module docs). Dropping it stops it.
pub struct LazyInitHandle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for LazyInitHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyInitHandle")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl LazyInitHandle {
    /// Progress now.
    pub fn status(&self) -> OnlineStatus {
        self.shared.status()
    }

    /// A view of the status that outlives borrowing the handle.
    pub fn status_source(&self) -> StatusSource {
        StatusSource(self.shared.clone())
    }

    /// Pause after the group in progress.
    pub fn pause(&self) {
        lock(&self.shared.ctl).paused = true;
        self.shared.cv.notify_all();
    }

    /// Go on after [`LazyInitHandle::pause`].
    pub fn resume(&self) {
        lock(&self.shared.ctl).paused = false;
        self.shared.cv.notify_all();
    }

    /// Has the thread ended (done, stopped or failed)?
    pub fn is_finished(&self) -> bool {
        lock(&self.thread).as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stop (the group in progress is finished and flagged first) and wait
    /// for the thread; the final status. Safe at any moment and more than
    /// once.
    pub fn stop(&self) -> OnlineStatus {
        lock(&self.shared.ctl).stop = true;
        self.shared.cv.notify_all();
        self.join()
    }

    /// Wait until the worker ends by itself (every group done, or an
    /// error); the final status.
    pub fn wait(&self) -> OnlineStatus {
        self.join()
    }

    fn join(&self) -> OnlineStatus {
        let t = lock(&self.thread).take();
        if let Some(t) = t
            && t.join().is_err()
        {
            self.shared.update(|st| {
                st.state = OnlineState::Failed;
                st.error = Some("the lazy-init worker panicked".into());
            });
        }
        self.status()
    }
}

impl Drop for LazyInitHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Plan every group of `fs` and start the worker. Refuses (before
/// anything is written) a filesystem whose descriptors lazy init must not
/// trust ([`plan_group`]'s checks). Without group-descriptor checksums
/// there is nothing to do: the worker ends at once, done.
pub fn start(fs: Arc<Filesystem>, opts: OnlineOptions) -> Result<LazyInitHandle, LazyError> {
    let layout = fs.layout().clone();
    let geom = geometry(&layout);
    let n = layout.group_count;
    let mut pending = VecDeque::new();
    let mut bytes_left = 0u64;
    if layout.group_csum && n > 0 {
        let first = opts.start_group % n;
        for i in 0..n {
            let g = (first + i) % n;
            if let Some(w) = plan_group(&geom, &fs.group_desc(g)?, g)? {
                let bytes = w.byte_range(&geom).1;
                bytes_left += bytes;
                pending.push_back((g, bytes));
            }
        }
    }
    let groups_left = pending.len() as u32;
    let pacer = Pacer::new(opts.pace);
    let status = OnlineStatus {
        state: if pending.is_empty() {
            OnlineState::Done
        } else {
            OnlineState::Running
        },
        groups_total: n,
        groups_done: n - groups_left,
        groups_left,
        groups_zeroed_now: 0,
        current_group: pending.front().map(|p| p.0),
        bytes_left,
        bytes_zeroed: 0,
        bytes_skipped_already_zero: 0,
        bytes_read: 0,
        requests: 0,
        elapsed_secs: 0.0,
        work_secs: 0.0,
        slept_secs: 0.0,
        rate_bytes_per_sec: 0.0,
        groups_per_sec: 0.0,
        pace: pace_name(opts.pace),
        multiplier: pacer.multiplier(),
        load: 0.0,
        eta_secs: None,
        error: None,
    };
    let shared = Arc::new(Shared {
        ctl: Mutex::new(Ctl::default()),
        cv: Condvar::new(),
        status: Mutex::new(status),
    });
    if pending.is_empty() {
        return Ok(LazyInitHandle {
            shared,
            thread: Mutex::new(None),
        });
    }
    let read_compare = opts
        .verify_zero
        .read_compare(opts.device_kind, fs.device().is_rotational());
    let (clock, given_clock): (Arc<dyn Clock>, bool) = match opts.clock {
        Some(c) => (c, true),
        None => (Arc::new(MonotonicClock::new()), false),
    };
    let worker = Worker {
        fs,
        geom,
        pending,
        pacer,
        zeroer: Zeroer::new(read_compare),
        load: opts.load,
        clock,
        given_clock,
        sleep_slice: opts.sleep_slice.max(Duration::from_micros(100)),
        shared: shared.clone(),
        stats: ZeroStats::default(),
        work: Duration::ZERO,
        slept: Duration::ZERO,
        zeroed_now: 0,
        lag: Duration::ZERO,
    };
    let thread = std::thread::Builder::new()
        .name("ext4kit-lazyinit".into())
        .spawn(move || worker.run())
        .map_err(LazyError::Spawn)?;
    Ok(LazyInitHandle {
        shared,
        thread: Mutex::new(Some(thread)),
    })
}

struct Worker {
    fs: Arc<Filesystem>,
    geom: Geometry,
    /// Groups to do and the bytes planned for each at the start.
    pending: VecDeque<(u32, u64)>,
    pacer: Pacer,
    zeroer: Zeroer,
    load: Option<Box<dyn LoadSignal>>,
    clock: Arc<dyn Clock>,
    given_clock: bool,
    sleep_slice: Duration,
    shared: Arc<Shared>,
    stats: ZeroStats,
    work: Duration,
    slept: Duration,
    zeroed_now: u32,
    /// How much later than due the worker woke, not yet taken off a wait.
    lag: Duration,
}

/// What one group took.
struct Unit {
    stats: ZeroStats,
    /// Device requests (zeroouts, reads).
    requests: u64,
    /// This worker set the flag (not someone before it).
    flagged: bool,
}

impl Worker {
    fn run(mut self) {
        let t_start = self.clock.now();
        let mut next_due = t_start;
        while let Some(&(g, planned)) = self.pending.front() {
            if !self.gate(next_due) {
                self.finish(t_start, OnlineState::Stopped, None);
                return;
            }
            self.shared.update(|st| {
                st.state = OnlineState::Running;
                st.current_group = Some(g);
            });
            let t0 = self.clock.now();
            let s0 = self.load.as_mut().and_then(|l| l.sample());
            self.pacer.before_work(t0, s0);
            let r = self.zero_group(g);
            let t1 = self.clock.now();
            let elapsed = t1.saturating_sub(t0);
            self.work += elapsed;
            let unit = match r {
                Ok(u) => u,
                Err(e) => {
                    self.finish(t_start, OnlineState::Failed, Some(e.to_string()));
                    return;
                }
            };
            self.pending.pop_front();
            self.zeroed_now += u32::from(unit.flagged);
            self.stats += unit.stats;
            let s1 = self.load.as_mut().and_then(|l| l.sample());
            let bytes = unit.stats.bytes_zeroed + unit.stats.bytes_read;
            let wait = self.pacer.after_work(t1, elapsed, unit.requests, bytes, s1);
            // A wait of a few hundred microseconds overshoots by about as
            // much (timer slack, scheduling): what the last ones overslept
            // is taken off this one, so that the waits add up to what the
            // pacer asked for.
            let credit = self.lag.min(wait);
            self.lag -= credit;
            next_due = t1 + (wait - credit);
            let next = self.pending.front().map(|p| p.0);
            self.publish(t_start, t1, planned, next);
        }
        self.finish(t_start, OnlineState::Done, None);
    }

    /// Status after a group.
    fn publish(&self, t_start: Duration, now: Duration, planned: u64, next: Option<u32>) {
        let elapsed = now.saturating_sub(t_start).as_secs_f64();
        let left = self.pending.len() as u32;
        let (stats, work, slept, done_now) = (self.stats, self.work, self.slept, self.zeroed_now);
        let (mult, load) = (self.pacer.multiplier(), self.pacer.load());
        self.shared.update(|st| {
            st.groups_left = left;
            st.groups_done = st.groups_total - left;
            st.groups_zeroed_now = done_now;
            st.current_group = next;
            st.bytes_left = st.bytes_left.saturating_sub(planned);
            st.bytes_zeroed = stats.bytes_zeroed;
            st.bytes_skipped_already_zero = stats.bytes_skipped_already_zero;
            st.bytes_read = stats.bytes_read;
            st.requests = stats.requests;
            st.elapsed_secs = elapsed;
            st.work_secs = work.as_secs_f64();
            st.slept_secs = slept.as_secs_f64();
            if elapsed > 0.0 {
                st.rate_bytes_per_sec =
                    (stats.bytes_zeroed + stats.bytes_skipped_already_zero) as f64 / elapsed;
                st.groups_per_sec = f64::from(done_now) / elapsed;
            }
            st.eta_secs = (st.groups_per_sec > 0.0).then(|| f64::from(left) / st.groups_per_sec);
            st.multiplier = mult;
            st.load = load;
        });
    }

    fn finish(&self, t_start: Duration, state: OnlineState, error: Option<String>) {
        let elapsed = self.clock.now().saturating_sub(t_start).as_secs_f64();
        let (work, slept) = (self.work.as_secs_f64(), self.slept.as_secs_f64());
        self.shared.update(|st| {
            st.state = state;
            st.error = error;
            st.elapsed_secs = elapsed;
            st.work_secs = work;
            st.slept_secs = slept;
            if state == OnlineState::Done {
                st.current_group = None;
                st.bytes_left = 0;
                st.eta_secs = Some(0.0);
            }
        });
    }

    /// Wait until `due` (and while paused); `false` when a stop was asked.
    fn gate(&mut self, due: Duration) -> bool {
        let mut ctl = lock(&self.shared.ctl);
        // Oversleeping counts only for a wait of ours, not after a pause.
        let mut slept = false;
        loop {
            if ctl.stop {
                return false;
            }
            if ctl.paused {
                self.shared.update(|st| st.state = OnlineState::Paused);
                ctl = self.shared.cv.wait(ctl).unwrap_or_else(|e| e.into_inner());
                slept = false;
                self.lag = Duration::ZERO;
                continue;
            }
            let now = self.clock.now();
            if now >= due {
                if slept {
                    self.lag = (self.lag + (now - due)).min(MAX_LAG);
                }
                return true;
            }
            self.shared.update(|st| st.state = OnlineState::Waiting);
            let d = due - now;
            slept = true;
            if self.given_clock {
                let d = d.min(self.sleep_slice);
                drop(ctl);
                self.clock.sleep(d);
                self.slept += self.clock.now().saturating_sub(now);
                ctl = lock(&self.shared.ctl);
            } else {
                ctl = self
                    .shared
                    .cv
                    .wait_timeout(ctl, d)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                self.slept += self.clock.now().saturating_sub(now);
            }
        }
    }

    /// Steps 1-4 of the module docs for group `g`.
    fn zero_group(&mut self, g: u32) -> Result<Unit, LazyError> {
        let fs = &*self.fs;
        let geom = &self.geom;
        let guard = fs.lock_group_for_zeroing(g)?;
        let mut unit = Unit {
            stats: ZeroStats::default(),
            requests: 0,
            flagged: false,
        };
        if guard.already_zeroed {
            return Ok(unit);
        }
        let Some(w) = plan_group(geom, &fs.group_desc(g)?, g)? else {
            // Flagged meanwhile (another worker): nothing to zero.
            return Ok(unit);
        };
        let table_end = w.itable + u64::from(geom.itable_blocks);
        if guard.zero_from < w.zero_start() || guard.zero_end != table_end {
            return Err(PlanError {
                group: g,
                detail: format!(
                    "the allocator's inode-table range {}..{} is not inside the descriptor's {}..{}",
                    guard.zero_from,
                    guard.zero_end,
                    w.zero_start(),
                    table_end
                ),
            }
            .into());
        }
        let bs = u64::from(geom.block_size);
        let dev = fs.device().clone();
        let len = (guard.zero_end - guard.zero_from) * bs;
        let st = self
            .zeroer
            .zero_range(&*dev, guard.zero_from * bs, len, geom.block_size)?;
        unit.stats = st;
        unit.requests = st.requests;
        // No flush: the flag of mark_itable_zeroed reaches the disk only in
        // a commit, and every commit flushes the device before its commit
        // block, after these writes (module docs, step 3).
        fs.mark_itable_zeroed(guard)?;
        unit.flagged = true;
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use ext4kit_device::{Device, DiscardOutcome, MemDevice};
    use ext4kit_format::group_desc::BG_INODE_ZEROED;
    use ext4kit_format::inode::S_IFREG;
    use ext4kit_fs::fs::NewInode;
    use ext4kit_fs::rw::RwOptions;

    use super::*;
    use crate::image::Image;
    use crate::lazyinit::pacing::FakeClock;
    use crate::testing::MemImage;

    /// A fresh lazy ext4 in memory with 1 KiB blocks and `bpg` blocks per
    /// group, every table range lazy init will zero filled with 0xAA.
    fn image(size: u64, bpg: u32) -> MemDevice {
        let mut m = MemImage::new(size, 1024, 4096);
        m.blocks_per_group = Some(bpg);
        let dev = m.make().unwrap();
        {
            let img = Image::open(&dev).unwrap();
            let geom = img.geometry().clone();
            for g in 0..geom.group_count {
                let w = plan_group(&geom, &img.desc(g), g).unwrap().expect("lazy");
                let (off, len) = w.byte_range(&geom);
                dev.write_at(&vec![0xAA; len as usize], off).unwrap();
            }
        }
        dev
    }

    /// Every flagged group's table is zero past its watermark; the count.
    fn check_zeroed(dev: &dyn Device) -> u32 {
        let img = Image::open(dev).unwrap();
        let geom = img.geometry().clone();
        let mut flagged = 0;
        for g in 0..geom.group_count {
            let d = img.desc(g);
            if d.flags() & BG_INODE_ZEROED == 0 {
                continue;
            }
            flagged += 1;
            let mut d2 = d.clone();
            d2.set_flags(d.flags() & !BG_INODE_ZEROED);
            let w = plan_group(&geom, &d2, g).unwrap().unwrap();
            let (off, len) = w.byte_range(&geom);
            let mut buf = vec![1u8; len as usize];
            dev.read_at(&mut buf, off).unwrap();
            assert!(buf.iter().all(|&b| b == 0), "group {g} flagged, not zero");
        }
        flagged
    }

    /// A device on which only zeroing takes (fake) time: 1 ms per 16 KiB.
    struct Slow {
        inner: Arc<MemDevice>,
        clock: Arc<FakeClock>,
    }
    impl Device for Slow {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, b: &mut [u8], o: u64) -> ext4kit_device::Result<()> {
            self.inner.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> ext4kit_device::Result<()> {
            self.inner.write_at(b, o)
        }
        fn flush(&self) -> ext4kit_device::Result<()> {
            Ok(())
        }
        fn zeroout(&self, o: u64, l: u64) -> ext4kit_device::Result<()> {
            self.clock.advance(Duration::from_micros(l * 1000 / 16384));
            self.inner.zeroout(o, l)
        }
        fn discard(&self, o: u64, l: u64) -> ext4kit_device::Result<DiscardOutcome> {
            self.inner.discard(o, l)
        }
        fn known_zero_ranges(&self, o: u64, l: u64) -> ext4kit_device::Result<Vec<(u64, u64)>> {
            self.inner.known_zero_ranges(o, l)
        }
        fn name(&self) -> String {
            "slow".into()
        }
    }

    fn open(dev: Arc<dyn Device>) -> Arc<Filesystem> {
        Arc::new(Filesystem::open(dev, RwOptions::default()).unwrap())
    }

    fn close(fs: Arc<Filesystem>) {
        Arc::try_unwrap(fs)
            .unwrap_or_else(|_| panic!("filesystem still shared"))
            .close()
            .unwrap();
    }

    #[test]
    fn fixed_pace_waits_mult_times_the_work() {
        // 64 groups of 1 MiB, 64 KiB of inode table each.
        let mem = Arc::new(image(64 << 20, 1024));
        let clock = Arc::new(FakeClock::new());
        let dev = Arc::new(Slow {
            inner: mem.clone(),
            clock: clock.clone(),
        });
        let fs = open(dev);
        let l = fs.layout().clone();
        assert_eq!(l.group_count, 64);
        let table = u64::from(l.itable_blocks) * u64::from(l.block_size);
        let h = start(
            fs.clone(),
            OnlineOptions {
                pace: Pace::Fixed { mult: 10 },
                clock: Some(clock.clone()),
                ..OnlineOptions::default()
            },
        )
        .unwrap();
        let st = h.wait();
        assert_eq!(st.state, OnlineState::Done, "{st:?}");
        assert_eq!((st.groups_left, st.groups_zeroed_now), (0, 64));
        assert_eq!(st.groups_done, st.groups_total);
        // Measured in nanoseconds on the (fake) monotonic clock: the waits
        // are 10x the smoothed work of every group but the last (nothing
        // is waited after it); the first group's table is a bit shorter.
        let per_group = table as f64 / 16384.0 / 1000.0;
        assert!(
            (st.work_secs - 64.0 * per_group).abs() < 2.0 * per_group,
            "{st:?}"
        );
        let want = 10.0 * 63.0 * per_group;
        assert!(
            (st.slept_secs - want).abs() < want * 0.03,
            "slept {} want {want}",
            st.slept_secs
        );
        assert!((clock.total_slept().as_secs_f64() - st.slept_secs).abs() < 1e-9);
        // Sleeps in slices, so that a stop is seen soon.
        assert!(
            clock
                .sleeps()
                .iter()
                .all(|&d| d <= OnlineOptions::default().sleep_slice)
        );
        drop(h);
        close(fs);
        assert_eq!(check_zeroed(&*mem), 64);
    }

    /// A clock whose sleeps take half as long again as asked.
    struct Oversleeping(Arc<FakeClock>);
    impl Clock for Oversleeping {
        fn now(&self) -> Duration {
            self.0.now()
        }
        fn sleep(&self, d: Duration) {
            self.0.sleep(d + d / 2);
        }
    }

    #[test]
    fn oversleeping_is_taken_off_the_next_waits() {
        let mem = Arc::new(image(64 << 20, 1024));
        let fake = Arc::new(FakeClock::new());
        let dev = Arc::new(Slow {
            inner: mem.clone(),
            clock: fake.clone(),
        });
        let fs = open(dev);
        let h = start(
            fs.clone(),
            OnlineOptions {
                pace: Pace::Fixed { mult: 10 },
                clock: Some(Arc::new(Oversleeping(fake.clone()))),
                ..OnlineOptions::default()
            },
        )
        .unwrap();
        let st = h.wait();
        assert_eq!(st.state, OnlineState::Done, "{st:?}");
        // 63 waits of ~10x the work of one group: what they really took.
        let want = 10.0 * st.work_secs * 63.0 / 64.0;
        assert!(
            (st.slept_secs - want).abs() < want * 0.05,
            "slept {} want {want}",
            st.slept_secs
        );
        drop(h);
        close(fs);
    }

    #[test]
    fn stop_pause_resume_and_restart() {
        let mem = Arc::new(image(32 << 20, 1024));
        let fs = open(mem.clone());
        // The real clock, paced so slowly that the worker waits seconds
        // after its first group: stop and pause must not wait for that.
        let h = start(
            fs.clone(),
            OnlineOptions {
                pace: Pace::Fixed { mult: 1_000_000 },
                ..OnlineOptions::default()
            },
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        while h.status().state != OnlineState::Waiting {
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", h.status());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(h.status().groups_zeroed_now, 1);
        h.pause();
        while h.status().state != OnlineState::Paused {
            assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", h.status());
            std::thread::sleep(Duration::from_millis(1));
        }
        h.resume();
        let t1 = std::time::Instant::now();
        let st = h.stop();
        assert!(t1.elapsed() < Duration::from_secs(1));
        assert_eq!(st.state, OnlineState::Stopped, "{st:?}");
        assert_eq!(st.groups_zeroed_now, 1, "{st:?}");
        assert!(h.is_finished());
        // The status says it in text too.
        let text = st.to_string();
        assert!(text.starts_with("lazy init: stopped, "), "{text}");
        assert!(text.contains("pace fixed x1000000"), "{text}");
        // stop() twice is fine, and so is dropping the handle.
        assert_eq!(h.stop().state, OnlineState::Stopped);
        drop(h);
        close(fs);
        assert_eq!(check_zeroed(&*mem), 1);
        // Reopen, restart at full speed: finishes.
        let fs = open(mem.clone());
        let h = start(
            fs.clone(),
            OnlineOptions {
                pace: Pace::Fixed { mult: 0 },
                ..OnlineOptions::default()
            },
        )
        .unwrap();
        let st2 = h.wait();
        assert_eq!(st2.state, OnlineState::Done, "{st2:?}");
        assert_eq!(st2.groups_zeroed_now, st.groups_total - 1);
        drop(h);
        close(fs);
        assert_eq!(check_zeroed(&*mem), st.groups_total);
        // Nothing left: a new worker is done at once.
        let fs = open(mem.clone());
        let h = start(fs.clone(), OnlineOptions::default()).unwrap();
        assert_eq!(h.status().state, OnlineState::Done);
        assert!(h.is_finished());
        drop(h);
        close(fs);
    }

    #[test]
    fn allocation_waits_for_the_only_group_with_free_inodes() {
        // Two groups; fill group 1 (and what group 0 has) so that while
        // group 0 is locked for zeroing nothing else is free.
        let mem = Arc::new(image(16 << 20, 8192));
        let fs = open(mem.clone());
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        let ipg = fs.layout().inodes_per_group;
        let guard = fs.lock_group_for_zeroing(0).unwrap();
        let mut made = 0;
        loop {
            let (i, _) = fs.create(2, format!("f{made}").as_bytes(), &spec).unwrap();
            made += 1;
            assert_eq!(
                (i.ino - 1) / ipg,
                1,
                "allocation went into the locked group"
            );
            if fs.inode_alloc().free_inodes() == u64::from(ipg - 11) {
                break;
            }
            if made > ipg {
                panic!("group 1 never filled");
            }
        }
        // Group 0's free inodes are the only ones left: the next create
        // waits for the guard instead of failing with ENOSPC.
        let t = std::thread::scope(|s| {
            let h = s.spawn(|| fs.create(2, b"last", &spec));
            std::thread::sleep(Duration::from_millis(150));
            assert!(!h.is_finished(), "create did not wait");
            assert!(fs.inode_alloc().zeroing_waits() > 0);
            fs.mark_itable_zeroed(guard).unwrap();
            h.join().unwrap()
        });
        let (i, _) = t.unwrap();
        assert_eq!((i.ino - 1) / ipg, 0);
        close(fs);
    }
}
