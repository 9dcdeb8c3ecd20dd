//! Discard at commit, durable (issue 8 item 3; seed 002), and fstrim.
//!
//! **Per commit.** After a transaction is durable, the freed-extent hook
//! gets its freed ranges from [`BlockAlloc::committed`] (merged where
//! adjacent, still busy) and hands them to [`DiscardQueue::submit`], which
//! only queues them (split at [`DiscardOptions::max_request_blocks`]) and
//! wakes the workers: the commit path never waits for a discard, so
//! commit latency does not depend on discard latency. A pool of
//! [`DiscardOptions::workers`] threads issues the queued requests, several
//! in flight at once (the seed's parallel bios, XFS's
//! `xfs_discard_extents`); each finished request (done, failed or not
//! supported: a discard is advisory) goes to [`BlockAlloc::discarded`], so
//! its blocks become allocatable only then. An allocation short of space
//! because of them waits in [`BlockAlloc::alloc`].
//!
//! **Durable without new on-disk state.** Discards still queued at a
//! crash or kill are lost, like the kernel's; what they would have done is
//! derived again instead of stored: free space (bitmaps) that the device
//! still holds (not a hole to `SEEK_DATA`, [`Device::known_zero_ranges`]).
//! The **reconciler** ([`Discarder::start_reconciler`], at open with
//! discard on) walks the groups in the background, one group at a time:
//! free ranges from the allocator, the device's holes over the group in
//! one query, the difference claimed ([`BlockAlloc::claim_for_discard`]:
//! busy while the discard runs, so no allocation races with it) and
//! discarded through the same pool; after each group it sleeps
//! `reconcile_pace` times as long as the group took. It also gives back
//! space freed by the kernel without `-o discard`, or by ext4kit without
//! discard. Devices that cannot report allocation (block devices:
//! [`Device::reports_allocation`] is false) get nothing from
//! [`Reconcile::Auto`]; [`Reconcile::Full`] trims all their free space once
//! per open instead (thin LVs).
//!
//! **fstrim** ([`Discarder::trim`]): the same group walk over a byte range
//! with a minimum extent length (FITRIM's `start`/`len`/`minlen`); groups
//! whose free space is already unallocated on the device are skipped, so a
//! second run costs one `SEEK_DATA` walk per group. On devices that cannot
//! report allocation, groups trimmed before (in this session, with no
//! larger minimum) that have freed nothing since are skipped, as the
//! kernel's in-memory `EXT4_MB_GRP_WAS_TRIMMED` does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ext4kit_device::{Device, DiscardOutcome};

use crate::balloc::BlockAlloc;
use crate::{BlockRead, DeviceBlocks, FsError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the reconciler does at open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reconcile {
    /// Nothing (pending discards of an earlier crash stay undone).
    Off,
    /// On devices that report allocation ([`Device::reports_allocation`]:
    /// image files, memory), discard free space the device still holds;
    /// nothing on others.
    #[default]
    Auto,
    /// Discard all free space once, whether or not the device holds it
    /// (for thin block devices that cannot report allocation).
    Full,
}

/// Options of discard at commit (`-o discard`).
#[derive(Clone, Debug)]
pub struct DiscardOptions {
    /// Discards in flight at most (worker threads), at least 1.
    pub workers: usize,
    /// Longest single discard request in blocks; longer ranges are split
    /// so that one large delete also goes out in parallel.
    pub max_request_blocks: u32,
    /// The reconciler at open.
    pub reconcile: Reconcile,
    /// After each group the reconciler sleeps this many times as long as
    /// the group took (0: full speed), like `init_itable=N`.
    pub reconcile_pace: u32,
}

impl Default for DiscardOptions {
    fn default() -> Self {
        DiscardOptions {
            workers: 8,
            max_request_blocks: 32768,
            reconcile: Reconcile::Auto,
            reconcile_pace: 1,
        }
    }
}

/// Counters of the discard queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscardStats {
    /// Commits that handed freed ranges over.
    pub batches: u64,
    /// Requests queued so far.
    pub queued: u64,
    /// Requests finished (discarded, failed or not supported).
    pub completed: u64,
    /// Bytes discarded successfully.
    pub bytes: u64,
    /// Requests the device failed (their blocks are released anyway).
    pub failed: u64,
    /// The device said it does not support discard (later requests are
    /// released without being issued).
    pub unsupported: bool,
    /// Requests running now.
    pub in_flight: u64,
    /// The most requests that ran at once.
    pub max_in_flight: u64,
    /// Requests queued or running now.
    pub pending: u64,
}

/// Progress of the reconciler.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    /// The mode it runs in; `Off` also when the device cannot report
    /// allocation and the mode was `Auto`.
    pub mode: Reconcile,
    pub groups: u32,
    pub groups_done: u32,
    /// Bytes it discarded.
    pub bytes: u64,
    /// It went through every group.
    pub finished: bool,
    /// It stopped on this error (the next open tries again).
    pub error: Option<String>,
}

/// A FITRIM request, in bytes (util-linux `fstrim -o -l -m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimRequest {
    pub start: u64,
    /// Length from `start`; `u64::MAX`: to the end.
    pub len: u64,
    /// Free extents shorter than this are left alone.
    pub minlen: u64,
}

impl Default for TrimRequest {
    fn default() -> Self {
        TrimRequest {
            start: 0,
            len: u64::MAX,
            minlen: 0,
        }
    }
}

impl TrimRequest {
    /// Refuse what FITRIM refuses (EINVAL): a start past the end, a
    /// length shorter than a block, a minimum longer than a group.
    pub fn check(&self, l: &crate::groups::Layout) -> Result<(), FsError> {
        let bs = u64::from(l.block_size);
        if self.start / bs >= l.blocks_count {
            return Err(FsError::InvalidRequest(format!(
                "trim offset {} is past the end of the filesystem ({} bytes)",
                self.start,
                l.blocks_count * bs
            )));
        }
        if self.len < bs {
            return Err(FsError::InvalidRequest(format!(
                "trim length {} is shorter than a block ({bs} bytes)",
                self.len
            )));
        }
        if self.minlen / bs > u64::from(l.blocks_per_group) {
            return Err(FsError::InvalidRequest(format!(
                "minimum length {} is larger than a block group",
                self.minlen
            )));
        }
        Ok(())
    }
}

/// What [`Discarder::trim`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Groups in the range.
    pub groups: u32,
    /// Groups with free space (≥ minlen) in the range that the device
    /// already held none of (skipped without a discard).
    pub groups_skipped: u32,
    /// Free bytes in the range in extents of at least `minlen`.
    pub free_bytes: u64,
    /// Discard requests issued.
    pub requests: u64,
    /// Bytes discarded (the part of `free_bytes` the device still held,
    /// or all of it when the device cannot tell).
    pub bytes: u64,
    /// Requests that failed.
    pub failed: u64,
    /// The device does not support discard.
    pub unsupported: bool,
    /// The device reported which free space it holds.
    pub allocation_known: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Run,
    /// Finish the queue, then exit.
    Drain,
    /// Exit after the request in hand (a crash: the queue is lost).
    Abandon,
}

/// A group of requests someone waits for (a reconciler or trim step).
#[derive(Debug, Default)]
struct Batch {
    left: Mutex<usize>,
    cv: Condvar,
    bytes: AtomicU64,
    failed: AtomicU64,
}

impl Batch {
    fn done(&self, bytes: u64, failed: bool) {
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        if failed {
            self.failed.fetch_add(1, Ordering::SeqCst);
        }
        let mut l = lock(&self.left);
        *l = l.saturating_sub(1);
        if *l == 0 {
            self.cv.notify_all();
        }
    }

    fn wait(&self) {
        let mut l = lock(&self.left);
        while *l > 0 {
            l = self.cv.wait(l).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[derive(Debug)]
struct Job {
    start: u64,
    len: u32,
    batch: Option<Arc<Batch>>,
}

#[derive(Debug)]
struct Queue {
    jobs: VecDeque<Job>,
    stop: Stop,
    stats: DiscardStats,
}

struct Inner {
    dev: Arc<dyn Device>,
    alloc: Arc<BlockAlloc>,
    block_size: u32,
    blocks: u64,
    max_req: u32,
    q: Mutex<Queue>,
    /// Jobs queued or a stop requested (workers wait here).
    work: Condvar,
    /// A job finished (idle waiters wait here).
    idle: Condvar,
    stop_reconcile: AtomicBool,
    rec: Mutex<ReconcileStats>,
}

/// The handle the freed-extent hook holds: queue a commit's ranges.
#[derive(Clone)]
pub struct DiscardQueue(Arc<Inner>);

impl std::fmt::Debug for DiscardQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscardQueue").finish_non_exhaustive()
    }
}

impl DiscardQueue {
    /// Queue the ranges a durable commit freed (`BlockAlloc::committed`'s
    /// result: busy until discarded). Never waits for a discard.
    pub fn submit(&self, ranges: &[(u64, u32)]) {
        if !ranges.is_empty() {
            self.0.enqueue(ranges, None, true);
        }
    }
}

impl Inner {
    /// Queue `ranges` (split at `max_req`); returns the request count.
    fn enqueue(&self, ranges: &[(u64, u32)], batch: Option<Arc<Batch>>, commit: bool) -> usize {
        let mut jobs = Vec::new();
        for &(s, n) in ranges {
            let mut off = 0u32;
            while off < n {
                let len = (n - off).min(self.max_req.max(1));
                jobs.push((s + u64::from(off), len));
                off += len;
            }
        }
        if let Some(b) = &batch {
            *lock(&b.left) += jobs.len();
        }
        let count = jobs.len();
        let mut q = lock(&self.q);
        if commit {
            q.stats.batches += 1;
        }
        q.stats.queued += count as u64;
        q.stats.pending += count as u64;
        for (start, len) in jobs {
            q.jobs.push_back(Job {
                start,
                len,
                batch: batch.clone(),
            });
        }
        drop(q);
        self.work.notify_all();
        count
    }

    fn worker(&self) {
        loop {
            let (job, unsupported) = {
                let mut q = lock(&self.q);
                loop {
                    if q.stop == Stop::Abandon {
                        return;
                    }
                    if let Some(j) = q.jobs.pop_front() {
                        q.stats.in_flight += 1;
                        q.stats.max_in_flight = q.stats.max_in_flight.max(q.stats.in_flight);
                        break (j, q.stats.unsupported);
                    }
                    if q.stop == Stop::Drain {
                        return;
                    }
                    q = self.work.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let bs = u64::from(self.block_size);
            let (bytes, failed, unsup) = if unsupported {
                (0, false, true)
            } else {
                match self.dev.discard(job.start * bs, u64::from(job.len) * bs) {
                    Ok(DiscardOutcome::Unsupported) => (0, false, true),
                    Ok(_) => (u64::from(job.len) * bs, false, false),
                    Err(_) => (0, true, false),
                }
            };
            // Done or given up: the blocks are allocatable again. (An
            // error here means the range was not ours, which cannot be.)
            let _ = self.alloc.discarded(job.start, job.len);
            {
                let mut q = lock(&self.q);
                let s = &mut q.stats;
                s.in_flight -= 1;
                s.pending -= 1;
                s.completed += 1;
                s.bytes += bytes;
                s.failed += u64::from(failed);
                s.unsupported |= unsup;
            }
            self.idle.notify_all();
            if let Some(b) = &job.batch {
                b.done(bytes, failed);
            }
        }
    }

    fn wait_idle(&self) {
        let mut q = lock(&self.q);
        while q.stats.pending > 0 && q.stop != Stop::Abandon {
            q = self.idle.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Trim the free space of group `g` inside blocks `[lo, hi)` in
    /// extents of at least `minlen` blocks; with `holes`, only what the
    /// device still holds. Waits for its discards.
    fn trim_group(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        lo: u64,
        hi: u64,
        minlen: u64,
        holes: bool,
    ) -> Result<GroupTrim, FsError> {
        let mut out = GroupTrim::default();
        let cand: Vec<(u64, u64)> = self
            .alloc
            .free_ranges(rd, g)?
            .into_iter()
            .filter_map(|(s, n)| {
                let a = s.max(lo);
                let b = (s + u64::from(n)).min(hi);
                (b > a && b - a >= minlen.max(1)).then_some((a, b - a))
            })
            .collect();
        if cand.is_empty() {
            out.complete = true;
            return Ok(out);
        }
        out.free_blocks = cand.iter().map(|r| r.1).sum();
        let held = if holes {
            let l = self.alloc.layout();
            let bs = u64::from(self.block_size);
            let gs = l.group_start(g);
            let ge = gs + u64::from(l.blocks_in_group(g));
            let zero = self.dev.known_zero_ranges(gs * bs, (ge - gs) * bs)?;
            // Whole blocks inside holes.
            let hole_blocks: Vec<(u64, u64)> = zero
                .into_iter()
                .map(|(s, e)| (s.div_ceil(bs), e / bs))
                .filter(|(s, e)| e > s)
                .collect();
            subtract(&cand, &hole_blocks)
        } else {
            cand
        };
        if held.is_empty() {
            out.skipped = true;
            out.complete = true;
            return Ok(out);
        }
        let held_blocks: u64 = held.iter().map(|r| r.1).sum();
        let mut claimed = Vec::new();
        for (s, n) in held {
            claimed.extend(self.alloc.claim_for_discard(rd, s, n as u32)?);
        }
        // Everything was claimable: no free block of the group waits for a
        // commit (it would be freed later without a discard).
        out.complete = claimed.iter().map(|r| u64::from(r.1)).sum::<u64>() == held_blocks;
        if claimed.is_empty() {
            return Ok(out);
        }
        let batch = Arc::new(Batch::default());
        out.requests = self.enqueue(&claimed, Some(batch.clone()), false) as u64;
        batch.wait();
        out.bytes = batch.bytes.load(Ordering::SeqCst);
        out.failed = batch.failed.load(Ordering::SeqCst);
        Ok(out)
    }

    fn reconcile(&self, mode: Reconcile, pace: u32) {
        let holes = mode == Reconcile::Auto;
        let rd = DeviceBlocks::new(&*self.dev, self.block_size, self.blocks);
        let groups = self.alloc.layout().group_count;
        let blocks = self.blocks;
        for g in 0..groups {
            if self.stop_reconcile.load(Ordering::SeqCst) {
                return;
            }
            let t0 = Instant::now();
            match self.trim_group(&rd, g, 0, blocks, 1, holes) {
                Ok(t) => {
                    let mut r = lock(&self.rec);
                    r.groups_done = g + 1;
                    r.bytes += t.bytes;
                }
                Err(e) => {
                    lock(&self.rec).error = Some(e.to_string());
                    return;
                }
            }
            if pace > 0 {
                let nap = t0.elapsed().saturating_mul(pace);
                let until = Instant::now() + nap;
                while !self.stop_reconcile.load(Ordering::SeqCst) {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    std::thread::sleep((until - now).min(Duration::from_millis(20)));
                }
            }
        }
        lock(&self.rec).finished = true;
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct GroupTrim {
    free_blocks: u64,
    skipped: bool,
    /// All its free space in the range is discarded (or already was).
    complete: bool,
    requests: u64,
    bytes: u64,
    failed: u64,
}

/// `ranges` (start, len) minus `holes` (start, end), both sorted.
fn subtract(ranges: &[(u64, u64)], holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut h = 0;
    for &(s, n) in ranges {
        let end = s + n;
        let mut pos = s;
        while h < holes.len() && holes[h].1 <= pos {
            h += 1;
        }
        let mut k = h;
        while pos < end {
            match holes.get(k) {
                Some(&(hs, he)) if hs < end => {
                    if hs > pos {
                        out.push((pos, hs - pos));
                    }
                    pos = pos.max(he);
                    k += 1;
                }
                _ => {
                    out.push((pos, end - pos));
                    pos = end;
                }
            }
        }
    }
    out
}

/// The discard worker pool (and reconciler) of one open filesystem.
pub struct Discarder {
    inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    reconciler: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Discarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discarder")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Discarder {
    /// Start `opts.workers` threads discarding on `dev` for `alloc`'s
    /// filesystem (`block_size`, `blocks` as in the superblock).
    pub fn new(
        dev: Arc<dyn Device>,
        alloc: Arc<BlockAlloc>,
        block_size: u32,
        blocks: u64,
        opts: &DiscardOptions,
    ) -> Result<Discarder, FsError> {
        let inner = Arc::new(Inner {
            dev,
            alloc,
            block_size,
            blocks,
            max_req: opts.max_request_blocks.max(1),
            q: Mutex::new(Queue {
                jobs: VecDeque::new(),
                stop: Stop::Run,
                stats: DiscardStats::default(),
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            stop_reconcile: AtomicBool::new(false),
            rec: Mutex::new(ReconcileStats::default()),
        });
        let d = Discarder {
            inner,
            workers: Mutex::new(Vec::new()),
            reconciler: Mutex::new(None),
        };
        for i in 0..opts.workers.max(1) {
            let inner = d.inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("ext4kit-discard-{i}"))
                .spawn(move || inner.worker())
                .map_err(|e| FsError::Unsupported(format!("starting a discard thread: {e}")))?;
            lock(&d.workers).push(h);
        }
        Ok(d)
    }

    /// The handle for the freed-extent hook.
    pub fn queue(&self) -> DiscardQueue {
        DiscardQueue(self.inner.clone())
    }

    /// Counters now.
    pub fn stats(&self) -> DiscardStats {
        lock(&self.inner.q).stats
    }

    /// The reconciler's progress.
    pub fn reconcile_stats(&self) -> ReconcileStats {
        lock(&self.inner.rec).clone()
    }

    /// Wait until nothing is queued or running.
    pub fn wait_idle(&self) {
        self.inner.wait_idle()
    }

    /// Start the reconciler in the background (see the module docs);
    /// `Auto` on a device that cannot report allocation does nothing.
    pub fn start_reconciler(&self, mode: Reconcile, pace: u32) -> Result<(), FsError> {
        let mode = if mode == Reconcile::Auto && !self.inner.dev.reports_allocation() {
            Reconcile::Off
        } else {
            mode
        };
        {
            let mut r = lock(&self.inner.rec);
            *r = ReconcileStats {
                mode,
                groups: self.inner.alloc.layout().group_count,
                finished: mode == Reconcile::Off,
                ..ReconcileStats::default()
            };
        }
        if mode == Reconcile::Off {
            return Ok(());
        }
        let inner = self.inner.clone();
        let h = std::thread::Builder::new()
            .name("ext4kit-reconcile".into())
            .spawn(move || inner.reconcile(mode, pace))
            .map_err(|e| FsError::Unsupported(format!("starting the reconciler: {e}")))?;
        *lock(&self.reconciler) = Some(h);
        Ok(())
    }

    /// Wait for the reconciler to go through every group (or stop).
    pub fn wait_reconciled(&self) -> ReconcileStats {
        if let Some(h) = lock(&self.reconciler).take() {
            let _ = h.join();
        }
        self.reconcile_stats()
    }

    /// Stop the reconciler at its next group (what it has not reached is
    /// found again at the next open) and wait for it.
    pub fn stop_reconciler(&self) {
        self.inner.stop_reconcile.store(true, Ordering::SeqCst);
        if let Some(h) = lock(&self.reconciler).take() {
            let _ = h.join();
        }
    }

    /// FITRIM over `rd` (see the module docs). Every group's bitmap in
    /// the range is read and checked before the first discard.
    pub fn trim(&self, rd: &dyn BlockRead, req: &TrimRequest) -> Result<TrimReport, FsError> {
        let inner = &self.inner;
        let l = inner.alloc.layout();
        req.check(l)?;
        let bs = u64::from(inner.block_size);
        let first = req.start / bs;
        let minlen = req.minlen / bs;
        let lo = first.max(l.first_data_block);
        let hi = req.start.saturating_add(req.len).min(inner.blocks * bs) / bs;
        let mut rep = TrimReport {
            allocation_known: inner.dev.reports_allocation(),
            ..TrimReport::default()
        };
        if hi <= lo {
            return Ok(rep);
        }
        let (g0, g1) = (l.group_of(lo), l.group_of(hi - 1));
        for g in g0..=g1 {
            inner.alloc.free_ranges(rd, g)?;
        }
        // Kept by the allocator, not here: a mount without `-o discard`
        // trims through a new Discarder each time.
        let last_minlen = inner.alloc.last_trim_minlen();
        for g in g0..=g1 {
            rep.groups += 1;
            // A device that cannot tell what it holds: skip groups trimmed
            // before (with no larger minimum) that freed nothing since, as
            // the kernel's FITRIM does.
            if !rep.allocation_known && inner.alloc.was_trimmed(g) && minlen >= last_minlen {
                rep.groups_skipped += 1;
                continue;
            }
            let t = inner.trim_group(rd, g, lo, hi, minlen, rep.allocation_known)?;
            let gs = l.group_start(g);
            if t.complete
                && lo <= gs.max(l.first_data_block)
                && hi >= gs + u64::from(l.blocks_in_group(g))
            {
                inner.alloc.mark_trimmed(g);
            }
            rep.groups_skipped += u32::from(t.skipped);
            rep.free_bytes += t.free_blocks * bs;
            rep.requests += t.requests;
            rep.bytes += t.bytes;
            rep.failed += t.failed;
        }
        rep.unsupported = lock(&inner.q).stats.unsupported;
        if g0 == 0 && g1 + 1 == l.group_count {
            inner.alloc.set_last_trim_minlen(minlen);
        }
        Ok(rep)
    }

    /// Close: stop the reconciler, finish every queued discard, stop the
    /// workers.
    pub fn finish(&self) {
        self.stop_reconciler();
        lock(&self.inner.q).stop = Stop::Drain;
        self.inner.work.notify_all();
        self.join_workers();
    }

    /// A crash: stop the reconciler and the workers after the requests in
    /// hand; the queue is dropped (the reconciler of the next open finds
    /// what it would have discarded).
    pub fn abandon(&self) {
        self.stop_reconciler();
        lock(&self.inner.q).stop = Stop::Abandon;
        self.inner.work.notify_all();
        self.inner.idle.notify_all();
        self.join_workers();
    }

    fn join_workers(&self) {
        let hs: Vec<JoinHandle<()>> = lock(&self.workers).drain(..).collect();
        for h in hs {
            let _ = h.join();
        }
    }
}

impl Drop for Discarder {
    fn drop(&mut self) {
        if !lock(&self.workers).is_empty() {
            self.abandon();
        }
    }
}

#[cfg(test)]
#[path = "discard_tests.rs"]
mod fs_tests;

#[cfg(test)]
mod tests {
    use super::subtract;

    #[test]
    fn subtract_holes() {
        assert_eq!(subtract(&[(0, 10)], &[]), vec![(0, 10)]);
        assert!(subtract(&[(0, 10)], &[(0, 10)]).is_empty());
        assert_eq!(
            subtract(&[(0, 10)], &[(2, 4), (6, 7)]),
            vec![(0, 2), (4, 2), (7, 3)]
        );
        assert_eq!(
            subtract(&[(0, 4), (10, 10)], &[(3, 12), (15, 30)]),
            vec![(0, 3), (12, 3)]
        );
        assert_eq!(subtract(&[(5, 5)], &[(0, 6), (9, 100)]), vec![(6, 3)]);
    }
}
