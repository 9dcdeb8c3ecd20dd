//! The block allocator (issue 7 item 5, seed 003).
//!
//! It never writes to the device. It keeps, per group, the exact free
//! ranges once they are known and tells its caller (the transaction layer)
//! which groups changed ([`Allocation::dirty`], [`BlockAlloc::take_dirty`]);
//! the caller renders their bitmap blocks and descriptors
//! ([`crate::ialloc::InodeAlloc::render_group`]) and journals them.
//!
//! **Free space without I/O.** At open, a `BLOCK_UNINIT` group, and a group
//! whose free count equals its blocks minus the metadata placed in it, is
//! known exactly from the layout ([`layout`]); only other groups ("unread")
//! need their bitmap, and it is read (checksum verified) only when a search
//! wants that group.
//!
//! **Index.** Ready groups sit in per-order sets by their longest free
//! range (`floor(log2(len))`, the kernel's `bb_largest_free_order` lists of
//! `mb_optimize_scan`); unread groups in per-order sets by their free count.
//! A search looks at one ordered set per order (`O(orders × log groups)`),
//! never at every group, and reads no bitmap of a group whose free count
//! is below the request.
//!
//! **Criteria ladder** per extent: (0) the goal block itself, (1) the goal
//! group (its bitmap read if needed), (2) the ready group nearest the goal
//! (in group order, so the goal's flex group first) whose longest range
//! fits, (3) unread groups whose free count fits (bitmap read), (4) the
//! longest range anywhere (the request is then split).
//!
//! **Busy extents.** Freed blocks are free on disk at once (the freeing
//! transaction's bitmap shows them free) but not allocatable until
//! [`BlockAlloc::committed`] for their transaction and, with discard on,
//! until [`BlockAlloc::discarded`]. When only busy space could satisfy a
//! request the error is [`FsError::SpaceBusy`], not [`FsError::NoSpace`];
//! with discards in flight [`BlockAlloc::alloc`] first waits for them (a
//! condition variable signalled by [`BlockAlloc::discarded`]) and retries.
//! [`BlockAlloc::claim_for_discard`] takes allocatable ranges out of use
//! for a discard that is not a commit's (the reconciler, fstrim).
//!
//! **Memory.** Per group the allocator keeps one packed word (free count
//! on disk, allocatable count, longest range, flags: 8 bytes) and its
//! entry in the index; the free ranges themselves exist only for groups
//! a search, an allocation or a free has touched (a group known from the
//! layout is materialized from it then). Group descriptors are read
//! through the [`DescTable`] when needed, not kept. So memory grows with
//! the groups used, not with the filesystem's size.
//!
//! Locks: group locks are striped (group `g` takes stripe `g % 64`; two
//! groups are locked in ascending stripe order), then the index, then the
//! busy log; the map of materialized ranges is taken only briefly; searches
//! hold only the index.

pub mod cluster;
pub mod extents;
pub mod groupset;
pub mod layout;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, GroupDesc};
use ext4kit_format::jbd2::tid_geq;

use crate::groups::{DescTable, DirtySet, GroupDirty, Layout, for_each_descriptor};
use crate::{BlockRead, FsError};
use extents::ExtentSet;
use groupset::GroupSet;

/// Orders kept in the index (block groups hold at most 2^19 blocks).
const ORDERS: usize = 32;
/// Groups of the "maybe" order probed before moving to sure fits.
const PROBE: usize = 16;
/// Group lock stripes.
const STRIPES: usize = 64;

fn order(x: u32) -> usize {
    debug_assert!(x > 0);
    (31 - x.leading_zeros()) as usize
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One block allocation request.
#[derive(Clone, Copy, Debug)]
pub struct AllocRequest {
    /// Blocks wanted (all of them, or an error).
    pub len: u64,
    /// Preferred first block: the block after the file's last allocation.
    pub goal: Option<u64>,
    /// Preferred group when there is no goal block: the inode's group.
    pub goal_group: u32,
    /// Longest extent to hand out: 32768 (`EXT_INIT_MAX_LEN`) for
    /// initialized extents, 32767 for unwritten ones.
    pub max_extent: u32,
    /// Blocks that must stay allocatable afterwards: the superblock's
    /// reserved blocks (`s_r_blocks_count`) for an unprivileged caller, as
    /// the kernel's `ext4_has_free_clusters`; 0 for root.
    pub keep_free: u64,
}

impl AllocRequest {
    pub fn new(len: u64, goal_group: u32) -> Self {
        AllocRequest {
            len,
            goal: None,
            goal_group,
            max_extent: ext4kit_format::extent::EXT_INIT_MAX_LEN,
            keep_free: 0,
        }
    }
}

/// The result of [`BlockAlloc::alloc`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// `(first block, length)`, in allocation order; physically adjacent
    /// pieces are merged up to `max_extent`.
    pub extents: Vec<(u64, u32)>,
    /// Groups whose block bitmap and descriptor this allocation changed.
    pub dirty: Vec<u32>,
}

/// Counters for benchmarks and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Block bitmaps read from the [`BlockRead`].
    pub bitmap_reads: u64,
    /// Groups locked and examined by searches.
    pub groups_visited: u64,
    /// Groups known without I/O at open.
    pub groups_from_layout: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    None,
    Ready(usize),
    Unread(usize),
}

/// A group's numbers, packed into one word per group (20 bits per count:
/// groups hold at most 2^19 blocks). Changed only under the group's lock;
/// read without it by the searches and heuristics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GState {
    /// Free count on disk: the descriptor's while unread.
    disk_free: u32,
    /// Allocatable blocks (free on disk and not busy); `disk_free` while
    /// unread.
    avail: u32,
    /// Longest allocatable range (0 while unread).
    largest: u32,
    /// Free ranges known (from the layout or a read bitmap).
    ready: bool,
    /// The descriptor still says BLOCK_UNINIT.
    block_uninit: bool,
    /// Known from the layout by the BLOCK_UNINIT rule (only the group's
    /// own bitmaps and table are in use).
    own_only: bool,
}

const M20: u64 = (1 << 20) - 1;

impl GState {
    fn pack(self) -> u64 {
        (u64::from(self.disk_free) & M20)
            | (u64::from(self.avail) & M20) << 20
            | (u64::from(self.largest) & M20) << 40
            | u64::from(self.ready) << 60
            | u64::from(self.block_uninit) << 61
            | u64::from(self.own_only) << 62
    }

    fn unpack(w: u64) -> Self {
        GState {
            disk_free: (w & M20) as u32,
            avail: (w >> 20 & M20) as u32,
            largest: (w >> 40 & M20) as u32,
            ready: w >> 60 & 1 != 0,
            block_uninit: w >> 61 & 1 != 0,
            own_only: w >> 62 & 1 != 0,
        }
    }
}

/// The free ranges of a group that has been touched.
#[derive(Debug, Default)]
struct Sets {
    /// Allocatable ranges (free on disk and not busy).
    avail: ExtentSet,
    /// Free on disk but waiting for a commit or a discard.
    busy: ExtentSet,
}

/// A locked group: its numbers and (once materialized) its ranges, taken
/// out of the shared map while the lock is held and put back on drop.
struct GroupGuard<'a> {
    ba: &'a BlockAlloc,
    g: u32,
    st: GState,
    /// The numbers the index files the group under.
    filed: GState,
    sets: Option<Sets>,
    _stripe: Option<MutexGuard<'a, ()>>,
}

impl GroupGuard<'_> {
    /// The ranges (empty if never materialized: callers materialize first
    /// with [`BlockAlloc::ensure`]).
    fn sets(&mut self) -> &mut Sets {
        self.sets.get_or_insert_with(Sets::default)
    }

    /// Recompute the counts the ranges determine.
    fn refresh(&mut self) {
        if !self.st.ready {
            self.st.avail = self.st.disk_free;
            self.st.largest = 0;
        } else if let Some(s) = &self.sets {
            self.st.avail = s.avail.total() as u32;
            self.st.largest = s.avail.largest();
        }
    }
}

impl Drop for GroupGuard<'_> {
    fn drop(&mut self) {
        self.ba.state[self.g as usize].store(self.st.pack(), Ordering::Relaxed);
        if let Some(s) = self.sets.take() {
            lock(&self.ba.sets).insert(self.g, s);
        }
    }
}

#[derive(Debug)]
struct Index {
    ready: Vec<GroupSet>,
    unread: Vec<GroupSet>,
}

/// A freed range waiting for its commit (or its discard).
#[derive(Debug, Default)]
struct BusyLog {
    /// tid → ranges freed by it.
    by_tid: BTreeMap<u32, Vec<(u64, u32)>>,
    /// Committed ranges whose discard is in flight: start → len.
    discarding: BTreeMap<u64, u32>,
    /// Blocks in `discarding`.
    discarding_blocks: u64,
    /// Bumped by every [`BlockAlloc::discarded`] (waiters' progress test).
    released: u64,
}

/// How long an allocation short of space waits for one discard to finish
/// before it gives up with [`FsError::SpaceBusy`].
const DISCARD_WAIT: Duration = Duration::from_secs(30);

/// The block allocator of one filesystem. Shared between threads (`&self`).
#[derive(Debug)]
pub struct BlockAlloc {
    layout: Layout,
    descs: Arc<DescTable>,
    /// Every group's bitmaps and inode table, merged (a group known from
    /// the layout is materialized from them).
    runs: Vec<(u64, u64)>,
    /// [`GState`] of each group, packed.
    state: Vec<AtomicU64>,
    stripes: Vec<Mutex<()>>,
    /// Ranges of the groups touched so far.
    sets: Mutex<HashMap<u32, Sets>>,
    /// Trimmed and nothing freed since (the kernel's in-memory
    /// `EXT4_MB_GRP_WAS_TRIMMED`); cleared by [`BlockAlloc::free`].
    trimmed: Vec<AtomicBool>,
    /// minlen (blocks) of the last whole trim (the kernel's
    /// `s_last_trim_minblks`): a trim with a smaller one does not skip
    /// the trimmed groups.
    last_trim_minlen: AtomicU64,
    index: Mutex<Index>,
    busy: Mutex<BusyLog>,
    /// Signalled when a discard finishes (see [`BlockAlloc::alloc`]).
    discard_done: Condvar,
    dirty: Arc<DirtySet>,
    discard: bool,
    avail_total: AtomicU64,
    busy_total: AtomicU64,
    bitmap_reads: AtomicU64,
    groups_visited: AtomicU64,
    from_layout: u64,
}

impl std::fmt::Debug for GroupGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupGuard")
            .field("g", &self.g)
            .field("st", &self.st)
            .finish_non_exhaustive()
    }
}

impl BlockAlloc {
    /// Build the allocator from the descriptor table: one streaming pass
    /// over it (checksums checked), no bitmap read, nothing per group but
    /// its packed word and index entry. `discard`: freed ranges stay busy
    /// after their commit until [`BlockAlloc::discarded`].
    pub fn open(
        rd: &dyn BlockRead,
        descs: Arc<DescTable>,
        dirty: Arc<DirtySet>,
        discard: bool,
    ) -> Result<Self, FsError> {
        Self::open_with(rd, descs, dirty, discard, |_, _| {})
    }

    /// [`BlockAlloc::open`], also handing every (checked) descriptor to
    /// `also` in group order during its pass (the inode allocator's state
    /// is built there: the table is read once for both).
    ///
    /// A `BLOCK_UNINIT` group's numbers come from its own descriptor
    /// alone; any other group's need every group's metadata (with
    /// flex_bg, one group holds the bitmaps and tables of the others), so
    /// they are finished after the pass from a small temporary (group,
    /// descriptor free count) instead of a second pass over the table.
    pub fn open_with(
        rd: &dyn BlockRead,
        descs: Arc<DescTable>,
        dirty: Arc<DirtySet>,
        discard: bool,
        mut also: impl FnMut(u32, &GroupDesc),
    ) -> Result<Self, FsError> {
        let layout = descs.layout().clone();
        let mut rb = layout::RunsBuilder::default();
        let n = layout.group_count as usize;
        let mut state = Vec::with_capacity(n);
        let mut ready = vec![GroupSet::new(layout.group_count); ORDERS];
        let mut unread = vec![GroupSet::new(layout.group_count); ORDERS];
        let mut total = 0u64;
        let mut from_layout = 0;
        let mut file = |g: u32, st: GState, total: &mut u64| {
            match key_of(&st) {
                Key::Ready(o) => {
                    ready[o].insert(g);
                }
                Key::Unread(o) => {
                    unread[o].insert(g);
                }
                Key::None => {}
            }
            *total += u64::from(st.avail);
        };
        // Groups that need the whole table's metadata runs.
        let mut later: Vec<(u32, u32)> = Vec::new();
        for_each_descriptor(&layout, rd, |g, d| {
            rb.add(&layout, d);
            also(g, d);
            let uninit = layout.group_csum && d.flags() & BG_BLOCK_UNINIT != 0;
            if uninit {
                let (free, largest) = layout::layout_stats(&layout, g, d, &[], true);
                from_layout += 1;
                let st = GState {
                    disk_free: free,
                    avail: free,
                    largest,
                    ready: true,
                    block_uninit: true,
                    own_only: true,
                };
                file(g, st, &mut total);
                state.push(AtomicU64::new(st.pack()));
            } else {
                // Bigalloc: the descriptor counts clusters; the
                // allocator keeps blocks of whole clusters.
                later.push((g, d.free_blocks() << layout.cluster_bits));
                state.push(AtomicU64::new(0));
            }
            Ok(())
        })?;
        let runs = rb.finish();
        let none = GroupDesc::default();
        for (g, disk) in later {
            let (free, largest) = layout::layout_stats(&layout, g, &none, &runs, false);
            let st = if free == disk {
                from_layout += 1;
                GState {
                    disk_free: free,
                    avail: free,
                    largest,
                    ready: true,
                    block_uninit: false,
                    own_only: false,
                }
            } else {
                GState {
                    disk_free: disk,
                    avail: disk,
                    largest: 0,
                    ready: false,
                    block_uninit: false,
                    own_only: false,
                }
            };
            file(g, st, &mut total);
            state[g as usize].store(st.pack(), Ordering::Relaxed);
        }
        let index = Index { ready, unread };
        Ok(BlockAlloc {
            layout,
            descs,
            runs,
            state,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            sets: Mutex::new(HashMap::new()),
            trimmed: (0..n).map(|_| AtomicBool::new(false)).collect(),
            last_trim_minlen: AtomicU64::new(0),
            index: Mutex::new(index),
            busy: Mutex::new(BusyLog::default()),
            discard_done: Condvar::new(),
            dirty,
            discard,
            avail_total: AtomicU64::new(total),
            busy_total: AtomicU64::new(0),
            bitmap_reads: AtomicU64::new(0),
            groups_visited: AtomicU64::new(0),
            from_layout,
        })
    }

    /// Groups whose free ranges are held (touched so far).
    pub fn materialized_groups(&self) -> usize {
        lock(&self.sets).len()
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Bigalloc: [`BlockAlloc::alloc`] and [`BlockAlloc::free`] work in
    /// blocks, which a bigalloc filesystem must never be given or taken
    /// piecemeal; its callers use [`BlockAlloc::alloc_clusters`] and
    /// [`BlockAlloc::free_clusters`] (the engine's `place_block`,
    /// `alloc_meta_block`, `free_data`). A guard against a caller that
    /// does not: refused before anything changes.
    fn refuse_clusters(&self, what: &str) -> Result<(), FsError> {
        if self.layout.cluster_bits > 0 {
            return Err(FsError::InvalidRequest(format!(
                "bigalloc: {what} one by one instead of in whole clusters"
            )));
        }
        Ok(())
    }

    /// The goal block for an inode's first data block (the kernel's
    /// `ext4_inode_to_goal_block` with delalloc): the start of its group;
    /// with flex groups of 4 or more, the first group of the flex group is
    /// left to directories and special files, regular files start in the
    /// second.
    pub fn goal_for_inode(&self, inode_group: u32, regular: bool) -> u64 {
        let l = &self.layout;
        let mut g = inode_group.min(l.group_count - 1);
        if l.flex_size >= 4 {
            g -= g % l.flex_size;
            if regular && g + 1 < l.group_count {
                g += 1;
            }
        }
        l.group_start(g)
    }

    /// Counters so far.
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            bitmap_reads: self.bitmap_reads.load(Ordering::Relaxed),
            groups_visited: self.groups_visited.load(Ordering::Relaxed),
            groups_from_layout: self.from_layout,
        }
    }

    /// Free blocks as the superblock counts them (busy ones included).
    pub fn free_blocks(&self) -> u64 {
        self.avail_total.load(Ordering::Relaxed) + self.busy_total.load(Ordering::Relaxed)
    }

    /// Free blocks as the descriptors count them: the sum of every
    /// group's free count on disk (what the superblock gets at close).
    /// O(groups) over the packed words, no I/O.
    pub fn disk_free_total(&self) -> u64 {
        self.state
            .iter()
            .map(|w| u64::from(GState::unpack(w.load(Ordering::Relaxed)).disk_free))
            .sum()
    }

    /// Blocks that can be allocated now.
    pub fn available_blocks(&self) -> u64 {
        self.avail_total.load(Ordering::Relaxed)
    }

    /// Blocks freed but waiting for a commit or a discard.
    pub fn busy_blocks(&self) -> u64 {
        self.busy_total.load(Ordering::Relaxed)
    }

    /// Allocatable blocks of group `g` (the descriptor's count while its
    /// bitmap is unread). Lock-free, for the inode allocator's heuristics.
    pub fn group_available(&self, g: u32) -> u32 {
        self.state
            .get(g as usize)
            .map_or(0, |a| GState::unpack(a.load(Ordering::Relaxed)).avail)
    }

    /// Lock-free numbers of group `g`.
    fn peek(&self, g: u32) -> GState {
        GState::unpack(self.state[g as usize].load(Ordering::Relaxed))
    }

    /// Take (and clear) the groups changed since the last call, block and
    /// inode side together.
    pub fn take_dirty(&self) -> Vec<GroupDirty> {
        self.dirty.take()
    }

    /// Whether a group changed since the last [`BlockAlloc::take_dirty`].
    pub fn has_dirty(&self) -> bool {
        !self.dirty.peek().is_empty()
    }

    /// [`BlockAlloc::take_dirty`] of the calling thread's changes only
    /// (its operation's: see [`DirtySet`]).
    pub fn take_dirty_mine(&self) -> Vec<GroupDirty> {
        self.dirty.take_mine()
    }

    /// Whether the calling thread changed a group it has not rendered.
    pub fn has_dirty_mine(&self) -> bool {
        self.dirty.has_mine()
    }

    fn guard<'a>(&'a self, g: u32, stripe: Option<MutexGuard<'a, ()>>) -> GroupGuard<'a> {
        let st = GState::unpack(self.state[g as usize].load(Ordering::Relaxed));
        let sets = lock(&self.sets).remove(&g);
        GroupGuard {
            ba: self,
            g,
            st,
            filed: st,
            sets,
            _stripe: stripe,
        }
    }

    fn check_group(&self, g: u32) -> Result<(), FsError> {
        if g >= self.layout.group_count {
            return Err(FsError::InvalidRequest(format!("group {g} does not exist")));
        }
        Ok(())
    }

    fn group(&self, g: u32) -> Result<GroupGuard<'_>, FsError> {
        self.check_group(g)?;
        let stripe = lock(&self.stripes[g as usize % STRIPES]);
        Ok(self.guard(g, Some(stripe)))
    }

    /// Groups `g` and `g + 1`, their stripes locked in ascending order.
    fn group_pair(&self, g: u32) -> Result<(GroupGuard<'_>, GroupGuard<'_>), FsError> {
        self.check_group(g + 1)?;
        let (sa, sb) = (g as usize % STRIPES, (g as usize + 1) % STRIPES);
        let (la, lb) = if sa < sb {
            let a = lock(&self.stripes[sa]);
            (a, lock(&self.stripes[sb]))
        } else {
            let b = lock(&self.stripes[sb]);
            (lock(&self.stripes[sa]), b)
        };
        Ok((self.guard(g, Some(la)), self.guard(g + 1, Some(lb))))
    }

    /// Re-file the group in the index and refresh its lock-free numbers.
    /// Called with the group locked.
    fn reindex(&self, bg: &mut GroupGuard<'_>) {
        bg.refresh();
        self.state[bg.g as usize].store(bg.st.pack(), Ordering::Relaxed);
        let (old, key) = (key_of(&bg.filed), key_of(&bg.st));
        bg.filed = bg.st;
        if key == old {
            return;
        }
        let g = bg.g;
        let mut ix = lock(&self.index);
        match old {
            Key::Ready(o) => {
                ix.ready[o].remove(g);
            }
            Key::Unread(o) => {
                ix.unread[o].remove(g);
            }
            Key::None => {}
        }
        match key {
            Key::Ready(o) => {
                ix.ready[o].insert(g);
            }
            Key::Unread(o) => {
                ix.unread[o].insert(g);
            }
            Key::None => {}
        }
    }

    /// Make the group's free ranges present: read and check its block
    /// bitmap if unread, or build them from the layout if it is known from
    /// it but untouched so far (group locked).
    fn ensure(&self, rd: &dyn BlockRead, bg: &mut GroupGuard<'_>) -> Result<(), FsError> {
        if bg.st.ready {
            if bg.sets.is_none() {
                let d = if bg.st.own_only {
                    self.descs.get(rd, bg.g)?
                } else {
                    GroupDesc::default()
                };
                let avail = layout::layout_free(&self.layout, bg.g, &d, &self.runs, bg.st.own_only);
                bg.sets = Some(Sets {
                    avail,
                    busy: ExtentSet::new(),
                });
            }
            return Ok(());
        }
        self.load(rd, bg)
    }

    /// The ranges of a group changed by a path without a [`BlockRead`]
    /// (give-backs, releases): such a group was materialized when its
    /// blocks were allocated or freed. `None` if not (nothing to change).
    fn sets_held<'g>(&self, bg: &'g mut GroupGuard<'_>) -> Option<&'g mut Sets> {
        if bg.sets.is_none() && bg.st.ready && !bg.st.own_only {
            let avail =
                layout::layout_free(&self.layout, bg.g, &GroupDesc::default(), &self.runs, false);
            bg.sets = Some(Sets {
                avail,
                busy: ExtentSet::new(),
            });
        }
        bg.sets.as_mut()
    }

    /// Read and check the group's block bitmap (group locked, unread).
    fn load(&self, rd: &dyn BlockRead, bg: &mut GroupGuard<'_>) -> Result<(), FsError> {
        if bg.st.ready {
            return Ok(());
        }
        let l = &self.layout;
        let g = bg.g;
        // The checksum of the current descriptor: an unread group's block
        // side has never been rendered, so that is still the disk's.
        let d = self.descs.get(rd, g)?;
        let blk = d.block_bitmap();
        let buf = rd.block(blk)?;
        self.bitmap_reads.fetch_add(1, Ordering::Relaxed);
        let stored = d.block_bitmap_csum();
        if !l.bitmap_csum_ok(stored, &buf[..l.block_bitmap_bytes()]) {
            return Err(FsError::corrupt(
                "block bitmap",
                format!("group {g} (block {blk}): checksum mismatch"),
            ));
        }
        // Bigalloc: one bit per cluster, kept as the cluster's blocks.
        let n = l.blocks_in_group(g);
        let free = ExtentSet::from_clear_bits(&buf, n.div_ceil(1 << l.cluster_bits))
            .expand_clusters(l.cluster_bits, n);
        if free.total() != u64::from(bg.st.disk_free) {
            return Err(FsError::corrupt(
                "block bitmap",
                format!(
                    "group {g} (block {blk}): {} free blocks, the descriptor says {}",
                    free.total(),
                    bg.st.disk_free
                ),
            ));
        }
        bg.sets = Some(Sets {
            avail: free,
            busy: ExtentSet::new(),
        });
        bg.st.ready = true;
        self.reindex(bg);
        Ok(())
    }

    /// Allocate `req.len` blocks, or nothing. Short of space only because
    /// blocks wait for their discard, it waits for discards to finish
    /// (XFS's `xfs_extent_busy_flush`) and retries; [`FsError::SpaceBusy`]
    /// when only uncommitted frees (or a discard that makes no progress
    /// for 30 s) stand in the way, [`FsError::NoSpace`] when the space is
    /// not there.
    pub fn alloc(&self, rd: &dyn BlockRead, req: &AllocRequest) -> Result<Allocation, FsError> {
        self.refuse_clusters("allocating blocks")?;
        self.alloc_any(rd, req)
    }

    /// Bigalloc: allocate whole clusters covering `req.len` blocks, the goal taken
    /// down to its cluster's first block and the longest extent to a
    /// whole number of clusters. Every extent returned starts and ends on
    /// a cluster boundary (free space is kept in whole clusters, so the
    /// search never cuts one); a caller maps logical block `l` of a file
    /// to `c2b(cluster) + (l & mask)` and owns the cluster's other blocks
    /// (`cluster::Clusters::implied`). Without bigalloc it is
    /// [`BlockAlloc::alloc`].
    pub fn alloc_clusters(
        &self,
        rd: &dyn BlockRead,
        req: &AllocRequest,
    ) -> Result<Allocation, FsError> {
        let mask = (1u64 << self.layout.cluster_bits) - 1;
        let mut r = *req;
        r.len = req.len.div_ceil(mask + 1) * (mask + 1);
        r.goal = req.goal.map(|g| g & !mask);
        r.max_extent = req.max_extent & !(mask as u32);
        if r.max_extent == 0 {
            return Err(FsError::InvalidRequest(format!(
                "longest extent {} is shorter than a cluster",
                req.max_extent
            )));
        }
        let a = self.alloc_any(rd, &r)?;
        if a.extents
            .iter()
            .any(|&(s, n)| s & mask != 0 || u64::from(n) & mask != 0)
        {
            self.give_back(rd, &a.extents)?;
            return Err(FsError::corrupt(
                "block allocator",
                format!(
                    "a cluster allocation was not cluster aligned: {:?}",
                    a.extents
                ),
            ));
        }
        Ok(a)
    }

    /// Bigalloc: free whole clusters
    /// (`start` and `len` on cluster boundaries, else `InvalidRequest`
    /// and nothing freed); what to release is the caller's
    /// (`cluster::Clusters::released`). Without bigalloc it is
    /// [`BlockAlloc::free`].
    pub fn free_clusters(
        &self,
        rd: &dyn BlockRead,
        tid: u32,
        start: u64,
        len: u32,
    ) -> Result<(), FsError> {
        let mask = (1u64 << self.layout.cluster_bits) - 1;
        if start & mask != 0 || u64::from(len) & mask != 0 {
            return Err(FsError::InvalidRequest(format!(
                "free of blocks {start}+{len}: not whole clusters of {}",
                mask + 1
            )));
        }
        self.free_any(rd, tid, start, len)
    }

    fn alloc_any(&self, rd: &dyn BlockRead, req: &AllocRequest) -> Result<Allocation, FsError> {
        loop {
            match self.alloc_once(rd, req) {
                Err(FsError::SpaceBusy { .. }) if self.wait_for_discard() => continue,
                r => return r,
            }
        }
    }

    /// Wait until a discard in flight finishes; `false` if none is in
    /// flight (waiting cannot help) or none finished in [`DISCARD_WAIT`].
    fn wait_for_discard(&self) -> bool {
        let log = lock(&self.busy);
        if log.discarding.is_empty() {
            return false;
        }
        let seen = log.released;
        let (log, _) = self
            .discard_done
            .wait_timeout_while(log, DISCARD_WAIT, |l| l.released == seen)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.released != seen
    }

    /// Ranges and blocks whose discard is in flight (committed frees with
    /// discard on, and claims of [`BlockAlloc::claim_for_discard`]).
    pub fn discards_pending(&self) -> (usize, u64) {
        let log = lock(&self.busy);
        (log.discarding.len(), log.discarding_blocks)
    }

    fn alloc_once(&self, rd: &dyn BlockRead, req: &AllocRequest) -> Result<Allocation, FsError> {
        if req.len == 0 {
            return Ok(Allocation::default());
        }
        if req.max_extent == 0 {
            return Err(FsError::InvalidRequest("max extent length 0".into()));
        }
        let need = req.len.saturating_add(req.keep_free);
        if self.available_blocks() < need {
            return Err(self.space_error(need));
        }
        let mut out: Vec<(u64, u32)> = Vec::new();
        let mut dirty = BTreeSet::new();
        let mut remaining = req.len;
        let mut goal = req
            .goal
            .filter(|&b| b >= self.layout.first_data_block && b < self.layout.blocks_count);
        let mut goal_group = req.goal_group.min(self.layout.group_count - 1);
        while remaining > 0 {
            let want = remaining
                .min(u64::from(req.max_extent))
                .min(u64::from(self.layout.blocks_per_group)) as u32;
            let piece = match self.alloc_piece(rd, goal, goal_group, want) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    self.undo(&out);
                    return Err(self.space_error(need));
                }
                Err(e) => {
                    self.undo(&out);
                    return Err(e);
                }
            };
            remaining -= u64::from(piece.1);
            dirty.insert(self.layout.group_of(piece.0));
            dirty.insert(self.layout.group_of(piece.0 + u64::from(piece.1) - 1));
            goal = Some(piece.0 + u64::from(piece.1)).filter(|&b| b < self.layout.blocks_count);
            goal_group = self.layout.group_of(piece.0);
            match out.last_mut() {
                Some(last)
                    if last.0 + u64::from(last.1) == piece.0
                        && u64::from(last.1) + u64::from(piece.1) <= u64::from(req.max_extent) =>
                {
                    last.1 += piece.1
                }
                _ => out.push(piece),
            }
        }
        Ok(Allocation {
            extents: out,
            dirty: dirty.into_iter().collect(),
        })
    }

    fn space_error(&self, len: u64) -> FsError {
        let avail = self.available_blocks();
        let busy = self.busy_blocks();
        if avail + busy >= len && busy > 0 {
            FsError::SpaceBusy {
                wanted: len,
                available: avail,
                busy,
            }
        } else {
            FsError::NoSpace {
                wanted: len,
                available: avail,
            }
        }
    }

    /// Return blocks allocated by a handle that failed before anything on
    /// disk pointed at them (its transaction never referenced them, so no
    /// busy period is needed): they are allocatable again at once. Every
    /// block must be in use.
    pub fn give_back(&self, rd: &dyn BlockRead, extents: &[(u64, u32)]) -> Result<(), FsError> {
        for &(s, n) in extents {
            for (g, rel, m) in self.pieces(s, n)? {
                let mut bg = self.group(g)?;
                self.ensure(rd, &mut bg)?;
                let st = bg.sets();
                if st.avail.overlaps(rel, m) || st.busy.overlaps(rel, m) {
                    return Err(FsError::InvalidRequest(format!(
                        "giving back blocks {s}..{} that are not all in use",
                        s + u64::from(n)
                    )));
                }
            }
        }
        self.undo(extents);
        for &(s, n) in extents {
            for (g, _, _) in self.pieces(s, n)? {
                self.dirty.mark(g, true, false);
            }
        }
        Ok(())
    }

    /// Give back pieces of a failed allocation (never visible to anyone).
    fn undo(&self, pieces: &[(u64, u32)]) {
        for &(s, n) in pieces {
            let mut b = s;
            let end = s + u64::from(n);
            while b < end {
                let g = self.layout.group_of(b);
                let ge = self.layout.group_start(g) + u64::from(self.layout.blocks_in_group(g));
                let part = (end.min(ge) - b) as u32;
                if let Ok(mut bg) = self.group(g) {
                    let rel = (b - self.layout.group_start(g)) as u32;
                    if self
                        .sets_held(&mut bg)
                        .is_some_and(|st| st.avail.insert(rel, part))
                    {
                        bg.st.disk_free += part;
                        self.avail_total
                            .fetch_add(u64::from(part), Ordering::Relaxed);
                        self.reindex(&mut bg);
                    }
                }
                b += u64::from(part);
            }
        }
    }

    fn alloc_piece(
        &self,
        rd: &dyn BlockRead,
        goal: Option<u64>,
        goal_group: u32,
        want: u32,
    ) -> Result<Option<(u64, u32)>, FsError> {
        // (0), (1): the goal block (also across the end of its group), then
        // the goal group.
        if let Some(b) = goal
            && let Some(p) = self.try_span(rd, b, want)?
        {
            return Ok(Some(p));
        }
        let g0 = goal.map_or(goal_group, |b| self.layout.group_of(b));
        let rel = goal.map(|b| (b - self.layout.group_start(g0)) as u32);
        if let Some(p) = self.try_group(rd, g0, want, rel, true, false)? {
            return Ok(Some(p));
        }
        // (2): a ready group whose longest range fits, nearest the goal.
        let mut tried = 0;
        while let Some(g) = self.find(want, g0, false) {
            if let Some(p) = self.try_group(rd, g, want, None, false, false)? {
                return Ok(Some(p));
            }
            tried += 1;
            if tried > 64 {
                break;
            }
        }
        // (3): unread groups with enough free blocks: read their bitmaps.
        while let Some(g) = self.find(want, g0, true) {
            if let Some(p) = self.try_group(rd, g, want, None, true, false)? {
                return Ok(Some(p));
            }
        }
        // (4): the longest range anywhere; the request gets split.
        loop {
            let (best_ready, best_unread) = {
                let ix = lock(&self.index);
                (top(&ix.ready, g0), top(&ix.unread, g0))
            };
            let pick = match (best_ready, best_unread) {
                (Some((o, g)), Some((ou, gu))) => {
                    if ou > o {
                        (gu, true)
                    } else {
                        (g, false)
                    }
                }
                (Some((_, g)), None) => (g, false),
                (None, Some((_, gu))) => (gu, true),
                (None, None) => return Ok(None),
            };
            if pick.1 {
                let mut bg = self.group(pick.0)?;
                self.groups_visited.fetch_add(1, Ordering::Relaxed);
                self.load(rd, &mut bg)?;
                continue;
            }
            if let Some(p) = self.try_group(rd, pick.0, want, None, false, true)? {
                return Ok(Some(p));
            }
        }
    }

    /// `want` blocks from `goal` on when the free range at `goal` runs to
    /// the end of its group and the next group's first range continues it
    /// (physically contiguous, e.g. flex_bg data groups): the piece spans
    /// the two groups. Locks them in ascending order.
    fn try_span(
        &self,
        rd: &dyn BlockRead,
        goal: u64,
        want: u32,
    ) -> Result<Option<(u64, u32)>, FsError> {
        let l = &self.layout;
        let g = l.group_of(goal);
        if g + 1 >= l.group_count {
            return Ok(None);
        }
        let rel = (goal - l.group_start(g)) as u32;
        let n = l.blocks_in_group(g);
        // Cheap tests first, without locks: both groups' ranges known, the
        // goal group's free space reaching its end.
        if !self.peek(g).ready || !self.peek(g + 1).ready {
            return Ok(None);
        }
        let (mut a, mut b) = self.group_pair(g)?;
        if !a.st.ready || !b.st.ready {
            return Ok(None);
        }
        self.ensure(rd, &mut a)?;
        let Some(r) = a.sets().avail.range_at(rel) else {
            return Ok(None);
        };
        let have = r.0 + r.1 - rel;
        if have >= want || r.0 + r.1 != n {
            return Ok(None);
        }
        self.ensure(rd, &mut b)?;
        let rest = want - have;
        if b.sets().avail.range_at(0).is_none_or(|r2| r2.1 < rest) {
            return Ok(None);
        }
        self.groups_visited.fetch_add(2, Ordering::Relaxed);
        for (bg, s, len) in [(&mut a, rel, have), (&mut b, 0, rest)] {
            if !bg.sets().avail.remove(s, len) {
                return Ok(None);
            }
            bg.st.disk_free -= len;
            bg.st.block_uninit = false;
            self.avail_total
                .fetch_sub(u64::from(len), Ordering::Relaxed);
            self.reindex(bg);
            self.dirty.mark(bg.g, true, false);
        }
        Ok(Some((goal, want)))
    }

    /// Nearest group (at or after `from`, wrapping) in the ready (or
    /// unread) index that can hold `want` blocks.
    fn find(&self, want: u32, from: u32, unread: bool) -> Option<u32> {
        let ix = lock(&self.index);
        let sets = if unread { &ix.unread } else { &ix.ready };
        let number = |g: u32| {
            let st = self.peek(g);
            if unread { st.avail } else { st.largest }
        };
        let lo = order(want);
        let ngroups = self.layout.group_count;
        let dist =
            |g: u32| (u64::from(g) + u64::from(ngroups) - u64::from(from)) % u64::from(ngroups);
        let mut best: Option<u32> = None;
        let mut consider = |g: u32| {
            if best.is_none_or(|b| dist(g) < dist(b)) {
                best = Some(g);
            }
        };
        let start = if want.is_power_of_two() {
            lo
        } else {
            // Groups of order `lo` fit only if their exact number does.
            let set = &sets[lo];
            if let Some(g) = set
                .iter_wrapping(from)
                .take(PROBE)
                .find(|&g| number(g) >= want)
            {
                consider(g);
            }
            lo + 1
        };
        for set in &sets[start.min(ORDERS)..] {
            if let Some(g) = set.next_from(from).or_else(|| set.first()) {
                consider(g);
            }
        }
        best
    }

    /// Try to take `want` blocks (or, with `any`, the longest range up to
    /// `want`) from group `g`; near `rel` when given.
    fn try_group(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        want: u32,
        rel: Option<u32>,
        may_load: bool,
        any: bool,
    ) -> Result<Option<(u64, u32)>, FsError> {
        self.groups_visited.fetch_add(1, Ordering::Relaxed);
        let mut bg = self.group(g)?;
        if !bg.st.ready && (!may_load || bg.st.disk_free < want) {
            return Ok(None);
        }
        self.ensure(rd, &mut bg)?;
        let avail = &bg.sets().avail;
        let (start, len) = if any {
            match avail.largest_range() {
                Some((s, n)) => (s, n.min(want)),
                None => return Ok(None),
            }
        } else {
            let at_goal = rel
                .and_then(|r| avail.range_at(r).map(|x| (r, x)))
                .filter(|(r, x)| x.0 + x.1 - r >= want)
                .map(|(r, _)| r);
            match at_goal.or_else(|| avail.first_fit(rel.unwrap_or(0), want).map(|x| x.0)) {
                Some(s) => (s, want),
                None => return Ok(None),
            }
        };
        if !bg.sets().avail.remove(start, len) {
            return Ok(None);
        }
        bg.st.disk_free -= len;
        bg.st.block_uninit = false;
        self.avail_total
            .fetch_sub(u64::from(len), Ordering::Relaxed);
        self.reindex(&mut bg);
        self.dirty.mark(g, true, false);
        Ok(Some((self.layout.group_start(g) + u64::from(start), len)))
    }

    /// Split `[start, start+len)` into per-group pieces `(g, rel, n)`,
    /// refusing ranges outside the groups.
    fn pieces(&self, start: u64, len: u32) -> Result<Vec<(u32, u32, u32)>, FsError> {
        let l = &self.layout;
        let end = start.saturating_add(u64::from(len));
        if len == 0 || start < l.first_data_block || end > l.blocks_count {
            return Err(FsError::InvalidRequest(format!(
                "blocks {start}..{end} are outside the filesystem's groups"
            )));
        }
        let mut v = Vec::new();
        let mut b = start;
        while b < end {
            let g = l.group_of(b);
            let gs = l.group_start(g);
            let ge = gs + u64::from(l.blocks_in_group(g));
            let n = (end.min(ge) - b) as u32;
            v.push((g, (b - gs) as u32, n));
            b += u64::from(n);
        }
        Ok(v)
    }

    /// Free `[start, start+len)` in transaction `tid`. The blocks must be
    /// in use; they become free on disk now and allocatable after
    /// [`BlockAlloc::committed`]`(tid)` (and their discard, if on).
    pub fn free(&self, rd: &dyn BlockRead, tid: u32, start: u64, len: u32) -> Result<(), FsError> {
        self.refuse_clusters("freeing blocks")?;
        self.free_any(rd, tid, start, len)
    }

    fn free_any(&self, rd: &dyn BlockRead, tid: u32, start: u64, len: u32) -> Result<(), FsError> {
        let parts = self.pieces(start, len)?;
        // Check everything before changing anything.
        for &(g, rel, n) in &parts {
            let mut bg = self.group(g)?;
            self.ensure(rd, &mut bg)?;
            let st = bg.sets();
            if st.avail.overlaps(rel, n) || st.busy.overlaps(rel, n) {
                return Err(FsError::InvalidRequest(format!(
                    "freeing blocks {start}..{} that are not all in use",
                    start + u64::from(len)
                )));
            }
            if rel < self.layout.base_meta_blocks(g) {
                return Err(FsError::InvalidRequest(format!(
                    "freeing group {g}'s superblock/descriptor blocks"
                )));
            }
        }
        let mut log = Vec::with_capacity(parts.len());
        for (g, rel, n) in parts {
            let mut bg = self.group(g)?;
            self.ensure(rd, &mut bg)?;
            if !bg.sets().busy.insert(rel, n) {
                continue;
            }
            bg.st.disk_free += n;
            bg.st.block_uninit = false;
            self.busy_total.fetch_add(u64::from(n), Ordering::Relaxed);
            self.reindex(&mut bg);
            self.dirty.mark(g, true, false);
            log.push((self.layout.group_start(g) + u64::from(rel), n));
            self.trimmed[g as usize].store(false, Ordering::Relaxed);
        }
        lock(&self.busy).by_tid.entry(tid).or_default().extend(log);
        Ok(())
    }

    /// Transaction `tid` (and every earlier one) is durable. Returns the
    /// ranges they freed, merged: the per-commit discard hook's input.
    /// Without discard they are allocatable now; with it they stay busy
    /// until [`BlockAlloc::discarded`].
    pub fn committed(&self, tid: u32) -> Vec<(u64, u32)> {
        let mut ranges: Vec<(u64, u32)> = {
            let mut log = lock(&self.busy);
            let done: Vec<u32> = log
                .by_tid
                .keys()
                .copied()
                .filter(|&t| tid_geq(tid, t))
                .collect();
            let mut v = Vec::new();
            for t in done {
                v.extend(log.by_tid.remove(&t).unwrap_or_default());
            }
            v
        };
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u32)> = Vec::with_capacity(ranges.len());
        for (s, n) in ranges {
            match merged.last_mut() {
                Some(last)
                    if last.0 + u64::from(last.1) == s
                        && u64::from(last.1) + u64::from(n) <= u64::from(u32::MAX) =>
                {
                    last.1 += n
                }
                _ => merged.push((s, n)),
            }
        }
        if self.discard {
            let mut log = lock(&self.busy);
            for &(s, n) in &merged {
                log.discarding.insert(s, n);
                log.discarding_blocks += u64::from(n);
            }
        } else {
            for &(s, n) in &merged {
                self.release(s, n);
            }
        }
        merged
    }

    /// The discard of a committed range finished (or was given up): its
    /// blocks become allocatable. `[start, start+len)` must lie inside one
    /// range returned by [`BlockAlloc::committed`].
    pub fn discarded(&self, start: u64, len: u32) -> Result<(), FsError> {
        {
            let mut log = lock(&self.busy);
            let (&s, &n) = log
                .discarding
                .range(..=start)
                .next_back()
                .filter(|(s, n)| start + u64::from(len) <= **s + u64::from(**n))
                .ok_or_else(|| {
                    FsError::InvalidRequest(format!(
                        "blocks {start}..{} are not waiting for a discard",
                        start + u64::from(len)
                    ))
                })?;
            log.discarding.remove(&s);
            if start > s {
                log.discarding.insert(s, (start - s) as u32);
            }
            let end = start + u64::from(len);
            let rend = s + u64::from(n);
            if rend > end {
                log.discarding.insert(end, (rend - end) as u32);
            }
            log.discarding_blocks -= u64::from(len);
        }
        self.release(start, len);
        lock(&self.busy).released += 1;
        self.discard_done.notify_all();
        Ok(())
    }

    /// Take the allocatable parts of `[start, start+len)` out of use for a
    /// discard that no commit asked for (the reconciler, fstrim): they
    /// become busy, as a committed free waiting for its discard, so no
    /// allocation can hand them out while the discard runs. Returns them
    /// (absolute, sorted); each must end with [`BlockAlloc::discarded`].
    /// Groups whose bitmap was never read are read through `rd`.
    pub fn claim_for_discard(
        &self,
        rd: &dyn BlockRead,
        start: u64,
        len: u32,
    ) -> Result<Vec<(u64, u32)>, FsError> {
        let mut out = Vec::new();
        for (g, rel, n) in self.pieces(start, len)? {
            let mut bg = self.group(g)?;
            self.ensure(rd, &mut bg)?;
            let parts = bg.sets().avail.intersect(rel, n);
            if parts.is_empty() {
                continue;
            }
            let gs = self.layout.group_start(g);
            let mut log = lock(&self.busy);
            for (s, m) in parts {
                let sets = bg.sets();
                if sets.avail.remove(s, m) && sets.busy.insert(s, m) {
                    self.avail_total.fetch_sub(u64::from(m), Ordering::Relaxed);
                    self.busy_total.fetch_add(u64::from(m), Ordering::Relaxed);
                    let abs = gs + u64::from(s);
                    log.discarding.insert(abs, m);
                    log.discarding_blocks += u64::from(m);
                    out.push((abs, m));
                }
            }
            drop(log);
            self.reindex(&mut bg);
        }
        Ok(out)
    }

    /// Busy → allocatable.
    fn release(&self, start: u64, len: u32) {
        let Ok(parts) = self.pieces(start, len) else {
            return;
        };
        for (g, rel, n) in parts {
            let Ok(mut bg) = self.group(g) else { continue };
            if self
                .sets_held(&mut bg)
                .is_some_and(|st| st.busy.remove(rel, n) && st.avail.insert(rel, n))
            {
                self.busy_total.fetch_sub(u64::from(n), Ordering::Relaxed);
                self.avail_total.fetch_add(u64::from(n), Ordering::Relaxed);
                self.reindex(&mut bg);
            }
        }
    }

    /// Has group `g` been trimmed with nothing freed since?
    pub fn was_trimmed(&self, g: u32) -> bool {
        self.trimmed
            .get(g as usize)
            .is_some_and(|t| t.load(Ordering::Relaxed))
    }

    /// Record that group `g`'s free space was all trimmed (fstrim), until
    /// the next [`BlockAlloc::free`] in it.
    pub fn mark_trimmed(&self, g: u32) {
        if let Some(t) = self.trimmed.get(g as usize) {
            t.store(true, Ordering::Relaxed);
        }
    }

    /// The minimum length (blocks) of the last trim of the whole
    /// filesystem, 0 before the first.
    pub fn last_trim_minlen(&self) -> u64 {
        self.last_trim_minlen.load(Ordering::Relaxed)
    }

    /// Record the minimum length (blocks) of a trim of the whole
    /// filesystem.
    pub fn set_last_trim_minlen(&self, blocks: u64) {
        self.last_trim_minlen.store(blocks, Ordering::Relaxed);
    }

    /// Clear `BLOCK_UNINIT` of group `g` (the inode allocator does, as the
    /// kernel's `__ext4_new_inode` does, before using a group's inodes).
    pub fn init_group(&self, g: u32) -> Result<(), FsError> {
        let mut bg = self.group(g)?;
        if bg.st.block_uninit {
            bg.st.block_uninit = false;
            self.dirty.mark(g, true, false);
        }
        Ok(())
    }

    /// Is block `b` allocatable now? (Tests and checkers.)
    pub fn is_available(&self, rd: &dyn BlockRead, b: u64) -> Result<bool, FsError> {
        let l = &self.layout;
        if b < l.first_data_block || b >= l.blocks_count {
            return Ok(false);
        }
        let g = l.group_of(b);
        let mut bg = self.group(g)?;
        self.ensure(rd, &mut bg)?;
        Ok(bg.sets().avail.contains((b - l.group_start(g)) as u32, 1))
    }

    /// Group `g`'s free ranges on disk (allocatable and busy), absolute,
    /// sorted; reads the bitmap if the group is unread.
    pub fn free_ranges(&self, rd: &dyn BlockRead, g: u32) -> Result<Vec<(u64, u32)>, FsError> {
        let mut bg = self.group(g)?;
        self.ensure(rd, &mut bg)?;
        let st = bg.sets();
        let mut all = st.avail.clone();
        for (s, n) in st.busy.iter() {
            all.insert(s, n);
        }
        let gs = self.layout.group_start(g);
        Ok(all.iter().map(|(s, n)| (gs + u64::from(s), n)).collect())
    }

    /// Group `g`'s block side as it must be written: the bitmap block
    /// (`None` while the group is still `BLOCK_UNINIT`: nothing to write),
    /// its free count and whether `BLOCK_UNINIT` stays set.
    /// Without `with_bitmap` (the block side did not change) nothing is
    /// read or rendered: only the counts are returned.
    pub fn render(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        with_bitmap: bool,
    ) -> Result<BlockSide, FsError> {
        let mut bg = self.group(g)?;
        // Bigalloc: the descriptor counts clusters.
        let cb = self.layout.cluster_bits;
        if !with_bitmap {
            return Ok(BlockSide {
                free_blocks: bg.st.disk_free >> cb,
                block_uninit: bg.st.block_uninit,
                bitmap: None,
            });
        }
        self.ensure(rd, &mut bg)?;
        let l = &self.layout;
        let bitmap = if bg.st.block_uninit {
            None
        } else {
            let at = self.descs.get(rd, g)?.block_bitmap();
            let mut buf = vec![0xFFu8; l.block_size as usize];
            let st = bg.sets();
            if cb == 0 {
                st.avail.clear_bits(&mut buf);
                st.busy.clear_bits(&mut buf);
            } else {
                // A cluster's bit is clear only when all its blocks are
                // free (avail and busy together: one cluster may be split
                // between them).
                let mut all = st.avail.clone();
                for (s, n) in st.busy.iter() {
                    all.insert(s, n);
                }
                all.whole_clusters(cb).clear_bits(&mut buf);
            }
            let csum = l.bitmap_csum(&buf[..l.block_bitmap_bytes()]);
            Some((at, buf, csum))
        };
        Ok(BlockSide {
            free_blocks: bg.st.disk_free >> cb,
            block_uninit: bg.st.block_uninit,
            bitmap,
        })
    }
}

/// See [`BlockAlloc::render`].
#[derive(Clone, Debug)]
pub struct BlockSide {
    pub free_blocks: u32,
    pub block_uninit: bool,
    /// `(block number, block image, checksum)`.
    pub bitmap: Option<(u64, Vec<u8>, u32)>,
}

fn key_of(st: &GState) -> Key {
    if st.ready {
        match st.largest {
            0 => Key::None,
            n => Key::Ready(order(n)),
        }
    } else {
        match st.disk_free {
            0 => Key::None,
            n => Key::Unread(order(n)),
        }
    }
}

/// Highest nonempty order and its group nearest `from`.
fn top(sets: &[GroupSet], from: u32) -> Option<(usize, u32)> {
    sets.iter()
        .enumerate()
        .rev()
        .find_map(|(o, s)| s.next_from(from).or_else(|| s.first()).map(|g| (o, g)))
}

#[cfg(test)]
pub(crate) mod tests;
