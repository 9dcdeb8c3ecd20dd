//! The inode allocator, and the rendering of a changed group (bitmaps and
//! descriptor) for the transaction layer.
//!
//! Placement follows the kernel's `ialloc.c` in simplified form:
//! directories spread with Orlov (`find_group_orlov`: top-level ones to a
//! flex group with above-average free inodes and blocks and the fewest
//! directories; others stay in the parent's flex group unless it has too
//! many directories or too little free space), files stay near their
//! parent (`find_group_other`: the parent's flex group, then a hashed
//! quadratic probe, then a linear one). Within a group the lowest free
//! inode is taken.
//!
//! Inodes come only from the initialized part of a table: the lowest free
//! inode is at most at the `bg_itable_unused` watermark (`ipg - unused`),
//! which then moves up past it, as the kernel keeps it; a group whose
//! lowest free inode lies past the watermark of a table that is not
//! `ITABLE_ZEROED` is skipped. `INODE_UNINIT` groups are used without
//! reading their bitmap (all free); `BLOCK_UNINIT` is cleared in a group
//! whose inodes start being used, as `__ext4_new_inode` does.
//!
//! **Lazy-init interlock** (the kernel's `alloc_sem`).
//! [`InodeAlloc::lock_group_for_zeroing`] marks a group as being zeroed,
//! after waiting for an allocation in it to finish (the claim of an inode
//! and the move of the watermark happen under the group's lock, which
//! the lock takes): the range it returns starts past the watermark as it
//! is then, and while the guard lives allocation skips the group, so no
//! inode is handed out in a range being zeroed. An allocation that finds
//! free inodes nowhere but in groups being zeroed waits for them instead
//! of failing with ENOSPC (the guard must therefore never be held while
//! waiting for the operations mutex). [`ZeroingGuard::mark_zeroed`] records
//! `ITABLE_ZEROED` (once the zeros are written: the commit that carries
//! the flag flushes them first) and releases the group.
//!
//! **Memory.** Per group one packed word (free inodes, directories,
//! `bg_itable_unused`, flags: 8 bytes); an inode bitmap is held only for
//! groups touched. Group locks are striped (`g % 64`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED, GroupDesc};

use crate::balloc::BlockAlloc;
use crate::groups::{DescTable, DirtySet, GroupDirty, Layout, for_each_descriptor_checked_before};
use crate::{BlockRead, FsError};

const ROOT_INO: u32 = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Group lock stripes.
const STRIPES: usize = 64;
const M20: u64 = (1 << 20) - 1;

/// A group's inode-side numbers, packed into one word (20 bits per
/// count: groups hold at most 2^19 inodes). Changed only under the
/// group's lock; read without it by the placement heuristics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IState {
    free: u32,
    dirs: u32,
    unused: u32,
    inode_uninit: bool,
    zeroed: bool,
    /// Online lazy init is zeroing this group's table.
    zeroing: bool,
    /// The inode side changed (the bitmap must be rewritten).
    changed: bool,
}

impl IState {
    fn pack(self) -> u64 {
        (u64::from(self.free) & M20)
            | (u64::from(self.dirs) & M20) << 20
            | (u64::from(self.unused) & M20) << 40
            | u64::from(self.inode_uninit) << 60
            | u64::from(self.zeroed) << 61
            | u64::from(self.zeroing) << 62
            | u64::from(self.changed) << 63
    }

    fn unpack(w: u64) -> Self {
        IState {
            free: (w & M20) as u32,
            dirs: (w >> 20 & M20) as u32,
            unused: (w >> 40 & M20) as u32,
            inode_uninit: w >> 60 & 1 != 0,
            zeroed: w >> 61 & 1 != 0,
            zeroing: w >> 62 & 1 != 0,
            changed: w >> 63 & 1 != 0,
        }
    }
}

/// A locked group: its numbers and (once read or materialized) its inode
/// bitmap (`ipg` bits), taken out of the shared map while locked.
struct IGroup<'a> {
    ia: &'a InodeAlloc,
    g: u32,
    st: IState,
    bitmap: Option<Vec<u8>>,
    _stripe: MutexGuard<'a, ()>,
}

impl std::ops::Deref for IGroup<'_> {
    type Target = IState;
    fn deref(&self) -> &IState {
        &self.st
    }
}

impl std::ops::DerefMut for IGroup<'_> {
    fn deref_mut(&mut self) -> &mut IState {
        &mut self.st
    }
}

impl Drop for IGroup<'_> {
    fn drop(&mut self) {
        self.ia.state[self.g as usize].store(self.st.pack(), Ordering::Relaxed);
        if let Some(b) = self.bitmap.take() {
            lock(&self.ia.bitmaps).insert(self.g, b);
        }
    }
}

/// One allocated inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InodeAllocation {
    pub ino: u32,
    pub group: u32,
    /// The inode-table block holding the inode lay entirely past the old
    /// watermark: its bytes are undefined, start from a zeroed block
    /// instead of reading it.
    pub fresh_block: bool,
}

/// What [`InodeAlloc::render_group`] produces for one changed group.
#[derive(Clone, Debug, Default)]
pub struct GroupImages {
    /// `(block number, image)` of the block bitmap, if it is to be written.
    pub block_bitmap: Option<(u64, Vec<u8>)>,
    /// `(block number, image)` of the inode bitmap, if it is to be written.
    pub inode_bitmap: Option<(u64, Vec<u8>)>,
    /// The new descriptor (already stored in the [`DescTable`]).
    pub desc: GroupDesc,
    /// Index of the descriptor block holding it
    /// ([`DescTable::block_image`]).
    pub desc_block: u32,
}

/// The inode side of every group, from descriptors given in group order
/// (see [`InodeAlloc::from_state`]).
#[derive(Debug, Default)]
pub struct InodeStateBuilder {
    state: Vec<AtomicU64>,
    free: u64,
    dirs: u64,
}

impl InodeStateBuilder {
    /// The next group's descriptor (checked by the caller's pass).
    pub fn add(&mut self, layout: &Layout, d: &GroupDesc) {
        let csum = layout.group_csum;
        let st = IState {
            free: d.free_inodes().min(layout.inodes_per_group),
            dirs: d.used_dirs().min(layout.inodes_per_group),
            unused: if csum {
                d.itable_unused().min(layout.inodes_per_group)
            } else {
                0
            },
            inode_uninit: csum && d.flags() & BG_INODE_UNINIT != 0,
            zeroed: d.flags() & BG_INODE_ZEROED != 0,
            zeroing: false,
            changed: false,
        };
        self.free += u64::from(st.free);
        self.dirs += u64::from(st.dirs);
        self.state.push(AtomicU64::new(st.pack()));
    }
}

/// The inode allocator; also the one place that renders a group's
/// descriptor from both allocators' state.
#[derive(Debug)]
pub struct InodeAlloc {
    layout: Layout,
    descs: Arc<DescTable>,
    balloc: Arc<BlockAlloc>,
    dirty: Arc<DirtySet>,
    /// [`IState`] of each group, packed.
    state: Vec<AtomicU64>,
    stripes: Vec<Mutex<()>>,
    /// Inode bitmaps of the groups touched so far.
    bitmaps: Mutex<HashMap<u32, Vec<u8>>>,
    free_total: AtomicU64,
    dirs_total: AtomicU64,
    bitmap_reads: AtomicU64,
    /// Spreads top-level directories (the kernel hashes the name or takes a
    /// random start).
    spread: AtomicU32,
    /// Groups being zeroed now and releases so far, and the wake-up for
    /// allocations waiting for them.
    zeroing: Mutex<(u32, u64)>,
    zeroing_done: Condvar,
    /// Allocation attempts that skipped a group because it was being
    /// zeroed, and allocations that had to wait for one.
    zeroing_skips: AtomicU64,
    zeroing_waits: AtomicU64,
}

impl std::fmt::Debug for IGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IGroup")
            .field("g", &self.g)
            .field("st", &self.st)
            .finish_non_exhaustive()
    }
}

impl InodeAlloc {
    /// From the descriptor table: one streaming pass over it, no bitmap
    /// read, no descriptor checksum (`balloc`'s open checked them).
    /// `dirty` must be the set the block allocator was opened with.
    pub fn open(
        rd: &dyn BlockRead,
        descs: Arc<DescTable>,
        balloc: Arc<BlockAlloc>,
        dirty: Arc<DirtySet>,
    ) -> Result<Self, FsError> {
        let layout = descs.layout().clone();
        let mut b = InodeStateBuilder::default();
        for_each_descriptor_checked_before(&layout, rd, |_, d| {
            b.add(&layout, d);
            Ok(())
        })?;
        Ok(Self::from_state(descs, balloc, dirty, b))
    }

    /// From per-group state built during another pass over the table
    /// (the block allocator's, [`BlockAlloc::open_with`]): one pass less.
    pub fn from_state(
        descs: Arc<DescTable>,
        balloc: Arc<BlockAlloc>,
        dirty: Arc<DirtySet>,
        b: InodeStateBuilder,
    ) -> Self {
        InodeAlloc {
            layout: descs.layout().clone(),
            descs,
            balloc,
            dirty,
            state: b.state,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            bitmaps: Mutex::new(HashMap::new()),
            free_total: AtomicU64::new(b.free),
            dirs_total: AtomicU64::new(b.dirs),
            bitmap_reads: AtomicU64::new(0),
            spread: AtomicU32::new(0),
            zeroing: Mutex::new((0, 0)),
            zeroing_done: Condvar::new(),
            zeroing_skips: AtomicU64::new(0),
            zeroing_waits: AtomicU64::new(0),
        }
    }

    /// Allocation attempts that skipped a group because online lazy init
    /// was zeroing it.
    pub fn zeroing_skips(&self) -> u64 {
        self.zeroing_skips.load(Ordering::Relaxed)
    }

    /// Allocations that waited for a group to be zeroed (no free inode
    /// anywhere else).
    pub fn zeroing_waits(&self) -> u64 {
        self.zeroing_waits.load(Ordering::Relaxed)
    }

    /// Releases of zeroed groups so far.
    fn zeroing_releases(&self) -> u64 {
        lock(&self.zeroing).1
    }

    /// No inode was found by a search that started after `releases`
    /// releases: if a group was released since, or groups are being
    /// zeroed (then after waiting a while for one), search again (`true`).
    fn wait_for_zeroing(&self, releases: u64) -> bool {
        let z = lock(&self.zeroing);
        if z.1 != releases {
            return true;
        }
        if z.0 == 0 {
            return false;
        }
        self.zeroing_waits.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .zeroing_done
            .wait_timeout(z, Duration::from_millis(50))
            .unwrap_or_else(|e| e.into_inner());
        true
    }

    /// Lock-free numbers of group `g`.
    fn peek(&self, g: u32) -> IState {
        IState::unpack(self.state[g as usize].load(Ordering::Relaxed))
    }

    /// Free inodes of group `g` (lock-free).
    fn free_in(&self, g: u32) -> u32 {
        self.peek(g).free
    }

    /// Groups whose inode bitmap is held (touched so far).
    pub fn materialized_groups(&self) -> usize {
        lock(&self.bitmaps).len()
    }

    /// Free inodes (the superblock's count).
    pub fn free_inodes(&self) -> u64 {
        self.free_total.load(Ordering::Relaxed)
    }

    /// Directories in use.
    pub fn used_dirs(&self) -> u64 {
        self.dirs_total.load(Ordering::Relaxed)
    }

    /// Inode bitmaps read so far.
    pub fn bitmap_reads(&self) -> u64 {
        self.bitmap_reads.load(Ordering::Relaxed)
    }

    fn group(&self, g: u32) -> Result<IGroup<'_>, FsError> {
        if g >= self.layout.group_count {
            return Err(FsError::InvalidRequest(format!("group {g} does not exist")));
        }
        let stripe = lock(&self.stripes[g as usize % STRIPES]);
        let st = IState::unpack(self.state[g as usize].load(Ordering::Relaxed));
        let bitmap = lock(&self.bitmaps).remove(&g);
        Ok(IGroup {
            ia: self,
            g,
            st,
            bitmap,
            _stripe: stripe,
        })
    }

    fn group_of(&self, ino: u32) -> Result<(u32, u32), FsError> {
        if ino == 0 || ino > self.layout.inodes_count {
            return Err(FsError::InvalidRequest(format!(
                "inode {ino} does not exist"
            )));
        }
        let ipg = self.layout.inodes_per_group;
        Ok(((ino - 1) / ipg, (ino - 1) % ipg))
    }

    /// Read (or materialize) group `g`'s inode bitmap; group locked.
    fn load(&self, rd: &dyn BlockRead, g: u32, ig: &mut IGroup<'_>) -> Result<(), FsError> {
        if ig.bitmap.is_some() {
            return Ok(());
        }
        let n = self.layout.inode_bitmap_bytes();
        if ig.inode_uninit {
            ig.bitmap = Some(vec![0u8; n]);
            return Ok(());
        }
        let d = self.descs.get(rd, g)?;
        let buf = rd.block(d.inode_bitmap())?;
        self.bitmap_reads.fetch_add(1, Ordering::Relaxed);
        if !self.layout.bitmap_csum_ok(d.inode_bitmap_csum(), &buf[..n]) {
            return Err(FsError::corrupt(
                "inode bitmap",
                format!("group {g} (block {}): checksum mismatch", d.inode_bitmap()),
            ));
        }
        let used: u32 = buf[..n].iter().map(|b| b.count_ones()).sum();
        if self.layout.inodes_per_group - used != ig.free {
            return Err(FsError::corrupt(
                "inode bitmap",
                format!(
                    "group {g}: {} free inodes, the descriptor says {}",
                    self.layout.inodes_per_group - used,
                    ig.free
                ),
            ));
        }
        ig.bitmap = Some(buf[..n].to_vec());
        Ok(())
    }

    /// Allocate an inode for a new file (`is_dir`: a directory) whose
    /// parent directory is `parent`.
    pub fn alloc(
        &self,
        rd: &dyn BlockRead,
        parent: u32,
        is_dir: bool,
    ) -> Result<InodeAllocation, FsError> {
        if self.free_inodes() == 0 {
            return Err(FsError::NoSpace {
                wanted: 1,
                available: 0,
            });
        }
        let (pg, _) = self.group_of(parent)?;
        let order = if is_dir {
            self.orlov(parent, pg)
        } else {
            self.near(parent, pg)
        };
        for g in order {
            if let Some(a) = self.try_group(rd, g, is_dir)? {
                return Ok(a);
            }
        }
        // Every group, in order from the parent's (skipped ones may have
        // been busy or raced); while groups are being zeroed, again once
        // one is released (their free inodes may be the only ones).
        let n = self.layout.group_count;
        loop {
            let releases = self.zeroing_releases();
            for i in 0..n {
                if let Some(a) = self.try_group(rd, (pg + i) % n, is_dir)? {
                    return Ok(a);
                }
            }
            if !self.wait_for_zeroing(releases) {
                break;
            }
        }
        Err(FsError::NoSpace {
            wanted: 1,
            available: self.free_inodes(),
        })
    }

    fn flex_stats(&self, f: u32) -> (u64, u64, u64) {
        let fs = self.layout.flex_size;
        let (mut fi, mut fb, mut dirs) = (0, 0, 0);
        for g in f * fs..((f + 1) * fs).min(self.layout.group_count) {
            let st = self.peek(g);
            fi += u64::from(st.free);
            dirs += u64::from(st.dirs);
            fb += u64::from(self.balloc.group_available(g));
        }
        (fi, fb, dirs)
    }

    /// Groups of flex group `f` with free inodes, in order.
    fn flex_members(&self, f: u32) -> impl Iterator<Item = u32> + '_ {
        let fs = self.layout.flex_size;
        (f * fs..((f + 1) * fs).min(self.layout.group_count)).filter(|&g| self.free_in(g) > 0)
    }

    /// Candidate groups for a directory (simplified `find_group_orlov`).
    fn orlov(&self, parent: u32, pg: u32) -> Vec<u32> {
        let l = &self.layout;
        let nflex = u64::from(l.flex_count());
        let freei = self.free_inodes();
        let freeb = self.balloc.available_blocks();
        let ndirs = self.used_dirs();
        let avefreei = freei / nflex;
        let avefreeb = freeb / nflex;
        let per_flex_inodes = u64::from(l.inodes_per_group) * u64::from(l.flex_size);
        let per_flex_blocks = u64::from(l.blocks_per_group) * u64::from(l.flex_size);
        let nf = l.flex_count();
        if parent == ROOT_INO {
            let start = self
                .spread
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(2_654_435_761)
                % nf;
            let mut best: Option<(u64, u32)> = None;
            for i in 0..nf {
                let f = (start + i) % nf;
                let (fi, fb, dirs) = self.flex_stats(f);
                if fi < avefreei.max(1) || fb < avefreeb {
                    continue;
                }
                if best.is_none_or(|(d, _)| dirs < d) {
                    best = Some((dirs, f));
                }
            }
            if let Some((_, f)) = best {
                return self.flex_members(f).collect();
            }
        } else {
            let max_dirs = ndirs / nflex + per_flex_inodes / 16;
            let min_inodes = avefreei.saturating_sub(per_flex_inodes / 4).max(1);
            let min_blocks = avefreeb.saturating_sub(per_flex_blocks / 4);
            let pf = l.flex_of(pg);
            for i in 0..nf {
                let f = (pf + i) % nf;
                let (fi, fb, dirs) = self.flex_stats(f);
                if dirs >= max_dirs || fi < min_inodes || fb < min_blocks {
                    continue;
                }
                return self.flex_members(f).collect();
            }
        }
        // Fallback: the first group from the parent's with at least the
        // average free inodes.
        let n = l.group_count;
        let avg = freei / u64::from(n);
        (0..n)
            .map(|i| (pg + i) % n)
            .filter(|&g| {
                let f = u64::from(self.free_in(g));
                f > 0 && f >= avg
            })
            .take(4)
            .collect()
    }

    /// Candidate groups for a non-directory (simplified
    /// `find_group_other`).
    fn near(&self, parent: u32, pg: u32) -> Vec<u32> {
        let l = &self.layout;
        let n = l.group_count;
        let mut v: Vec<u32> = Vec::new();
        if l.flex_size > 1 {
            let first = pg - pg % l.flex_size;
            let last = (first + l.flex_size).min(n);
            v.extend((pg..last).chain(first..pg).filter(|&g| self.free_in(g) > 0));
            if !v.is_empty() {
                return v;
            }
            // The next flex group with room, Orlov-style.
            return self.orlov(parent.max(ROOT_INO + 1), last % n);
        }
        let has = |g: u32| self.free_in(g) > 0 && self.balloc.group_available(g) > 0;
        if has(pg) {
            v.push(pg);
        }
        let mut g = (pg + parent % n) % n;
        let mut i = 1u32;
        while i < n {
            g = (g + i) % n;
            if has(g) {
                v.push(g);
                break;
            }
            i <<= 1;
        }
        v
    }

    /// Take the lowest free inode of group `g`, if allowed.
    fn try_group(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        is_dir: bool,
    ) -> Result<Option<InodeAllocation>, FsError> {
        let l = &self.layout;
        let mut ig = self.group(g)?;
        if ig.free == 0 {
            return Ok(None);
        }
        if ig.zeroing {
            self.zeroing_skips.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        self.load(rd, g, &mut ig)?;
        let ipg = l.inodes_per_group;
        let watermark = if ig.inode_uninit {
            0
        } else {
            ipg.saturating_sub(ig.unused)
        };
        // The lowest free slot that is a usable inode number (the reserved
        // inodes 1..first_ino-1 may reach past group 0 when a group has
        // fewer inodes).
        let first = (l.first_ino - 1).saturating_sub(g.saturating_mul(ipg));
        let bm = ig.bitmap.as_deref().unwrap_or(&[]);
        let Some(i) = lowest_clear(bm, first, ipg) else {
            return Ok(None);
        };
        if l.group_csum && i > watermark && !ig.zeroed {
            // Past the initialized part of a table nobody zeroed.
            return Ok(None);
        }
        let ino = g * ipg + i + 1;
        if ino > l.inodes_count {
            return Ok(None);
        }
        if let Some(bm) = ig.bitmap.as_mut() {
            bm[(i / 8) as usize] |= 1 << (i % 8);
        }
        ig.free -= 1;
        if is_dir {
            ig.dirs += 1;
            self.dirs_total.fetch_add(1, Ordering::Relaxed);
        }
        let ipb = l.inodes_per_block();
        let fresh_block = l.group_csum && (i - i % ipb) >= watermark;
        if l.group_csum && i >= watermark {
            ig.unused = ipg - i - 1;
        }
        ig.inode_uninit = false;
        ig.changed = true;
        self.free_total.fetch_sub(1, Ordering::Relaxed);
        drop(ig);
        if l.group_csum {
            self.balloc.init_group(g)?;
        }
        self.dirty.mark(g, false, true);
        Ok(Some(InodeAllocation {
            ino,
            group: g,
            fresh_block,
        }))
    }

    /// Free inode `ino` (its bit is clear from this transaction on; inodes
    /// need no busy period: their table block is journaled).
    pub fn free(&self, rd: &dyn BlockRead, ino: u32, is_dir: bool) -> Result<(), FsError> {
        let (g, i) = self.group_of(ino)?;
        if ino < self.layout.first_ino {
            return Err(FsError::InvalidRequest(format!("inode {ino} is reserved")));
        }
        let mut ig = self.group(g)?;
        self.load(rd, g, &mut ig)?;
        if is_dir && ig.dirs == 0 {
            return Err(FsError::InvalidRequest(format!(
                "freeing directory inode {ino} in group {g} with no directories"
            )));
        }
        let Some(bm) = ig.bitmap.as_mut() else {
            return Ok(());
        };
        let (byte, bit) = ((i / 8) as usize, 1u8 << (i % 8));
        if bm[byte] & bit == 0 {
            return Err(FsError::InvalidRequest(format!(
                "freeing inode {ino}, which is not in use"
            )));
        }
        bm[byte] &= !bit;
        ig.free += 1;
        if is_dir {
            ig.dirs -= 1;
            self.dirs_total.fetch_sub(1, Ordering::Relaxed);
        }
        ig.changed = true;
        self.free_total.fetch_add(1, Ordering::Relaxed);
        drop(ig);
        self.dirty.mark(g, false, true);
        Ok(())
    }

    /// Is inode `ino` in use? (Tests and checkers.)
    pub fn in_use(&self, rd: &dyn BlockRead, ino: u32) -> Result<bool, FsError> {
        let (g, i) = self.group_of(ino)?;
        let mut ig = self.group(g)?;
        self.load(rd, g, &mut ig)?;
        Ok(ig
            .bitmap
            .as_ref()
            .is_some_and(|b| b[(i / 8) as usize] & (1 << (i % 8)) != 0))
    }

    /// Keep allocation out of group `g` while its inode table is zeroed by
    /// the online lazy initializer. Waits for an allocation in the group to
    /// finish; the guard's range starts at the first table block past the
    /// watermark as it is then (the kernel's zeroing start: every block
    /// holding or having held an inode lies before it) and ends with the
    /// table. Allocation skips the group until the guard is dropped or
    /// [`ZeroingGuard::mark_zeroed`] is called. A group that already has
    /// `ITABLE_ZEROED` says so ([`ZeroingGuard::already_zeroed`]).
    pub fn lock_group_for_zeroing(
        &self,
        rd: &dyn BlockRead,
        g: u32,
    ) -> Result<ZeroingGuard<'_>, FsError> {
        let table = self.descs.get(rd, g)?.inode_table();
        let mut ig = self.group(g)?;
        if ig.zeroing {
            return Err(FsError::InvalidRequest(format!(
                "group {g} is already being zeroed"
            )));
        }
        let l = &self.layout;
        let used = if ig.inode_uninit {
            0
        } else {
            l.inodes_per_group.saturating_sub(ig.unused)
        };
        let used_blocks = used.div_ceil(l.inodes_per_block()).min(l.itable_blocks);
        ig.zeroing = true;
        let already_zeroed = ig.zeroed;
        lock(&self.zeroing).0 += 1;
        drop(ig);
        Ok(ZeroingGuard {
            ia: self,
            group: g,
            zero_from: table + u64::from(used_blocks),
            zero_end: table + u64::from(l.itable_blocks),
            first_slot: used_blocks * l.inodes_per_block(),
            already_zeroed,
        })
    }

    /// The first inode of group `g` in use (per its bitmap) at or past
    /// slot `slot` (0-based within the group), if any. Reads the bitmap
    /// when it was not read yet; an `INODE_UNINIT` group has none in use
    /// (and nothing is read or kept for it).
    pub fn first_used_from(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        slot: u32,
    ) -> Result<Option<u32>, FsError> {
        let mut ig = self.group(g)?;
        if ig.inode_uninit {
            return Ok(None);
        }
        self.load(rd, g, &mut ig)?;
        let ipg = self.layout.inodes_per_group;
        let bm = ig.bitmap.as_deref().unwrap_or(&[]);
        let mut i = slot;
        while i < ipg {
            let byte = bm.get((i / 8) as usize).copied().unwrap_or(0);
            if byte == 0 {
                i = (i / 8 + 1) * 8;
                continue;
            }
            if byte & (1 << (i % 8)) != 0 {
                return Ok(Some(g * ipg + i + 1));
            }
            i += 1;
        }
        Ok(None)
    }

    /// Release a group locked for zeroing (with or without the flag).
    fn end_zeroing(&self, g: u32, zeroed: bool) {
        if let Ok(mut ig) = self.group(g) {
            ig.zeroing = false;
            if zeroed {
                ig.zeroed = true;
            }
        }
        if zeroed {
            self.dirty.mark(g, false, false);
        }
        let mut z = lock(&self.zeroing);
        z.0 = z.0.saturating_sub(1);
        z.1 = z.1.wrapping_add(1);
        drop(z);
        self.zeroing_done.notify_all();
    }

    /// Group `g` as it must be written now: bitmaps that changed and the
    /// new descriptor (free counts, flags, bitmap checksums,
    /// `bg_itable_unused`, descriptor checksum), which is also stored in
    /// the [`DescTable`]. Call it for each group of
    /// [`BlockAlloc::take_dirty`], then journal the bitmaps and the
    /// descriptor blocks ([`DescTable::block_image`]) of those groups.
    pub fn render_group(&self, rd: &dyn BlockRead, g: u32) -> Result<GroupImages, FsError> {
        self.render_sides(rd, g, true, true)
    }

    /// [`InodeAlloc::render_group`] limited to the sides `d` says changed:
    /// an inode-only change in a group whose block bitmap was never read
    /// reads and rewrites no block bitmap (and the reverse).
    pub fn render(&self, rd: &dyn BlockRead, d: &GroupDirty) -> Result<GroupImages, FsError> {
        self.render_sides(rd, d.group, d.block_bitmap, d.inode_bitmap)
    }

    fn render_sides(
        &self,
        rd: &dyn BlockRead,
        g: u32,
        block_side: bool,
        inode_side: bool,
    ) -> Result<GroupImages, FsError> {
        let l = &self.layout;
        let mut d = self.descs.get(rd, g)?;
        let bs = self.balloc.render(rd, g, block_side)?;
        let mut flags = d.flags();
        d.set_free_blocks(bs.free_blocks);
        let mut block_bitmap = None;
        if !bs.block_uninit {
            flags &= !BG_BLOCK_UNINIT;
            if let Some((blk, img, csum)) = bs.bitmap {
                if l.csum.metadata {
                    d.set_block_bitmap_csum(csum);
                }
                block_bitmap = Some((blk, img));
            }
        }
        let mut inode_bitmap = None;
        {
            let ig = self.group(g)?;
            d.set_free_inodes(ig.free);
            d.set_used_dirs(ig.dirs);
            if l.group_csum {
                d.set_itable_unused(ig.unused);
            }
            if !ig.inode_uninit {
                flags &= !BG_INODE_UNINIT;
            }
            if ig.zeroed {
                flags |= BG_INODE_ZEROED;
            }
            if inode_side
                && ig.changed
                && let Some(bm) = &ig.bitmap
            {
                let mut img = vec![0xFFu8; l.block_size as usize];
                img[..bm.len()].copy_from_slice(bm);
                if l.csum.metadata {
                    d.set_inode_bitmap_csum(l.bitmap_csum(bm));
                }
                inode_bitmap = Some((d.inode_bitmap(), img));
            }
        }
        d.set_flags(flags);
        if l.group_csum {
            d.update_checksum(&l.csum, g, l.desc_size);
        }
        self.descs.set(g, d.clone());
        Ok(GroupImages {
            block_bitmap,
            inode_bitmap,
            desc: d,
            desc_block: l.desc_block_of(g),
        })
    }
}

/// The lowest clear bit of `bm` in `from..end`, skipping full bytes.
fn lowest_clear(bm: &[u8], from: u32, end: u32) -> Option<u32> {
    let mut i = from;
    while i < end {
        let byte = *bm.get((i / 8) as usize)?;
        if byte == 0xFF && i.is_multiple_of(8) {
            i += 8;
            continue;
        }
        if byte & (1 << (i % 8)) == 0 {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// See [`InodeAlloc::lock_group_for_zeroing`].
#[derive(Debug)]
pub struct ZeroingGuard<'a> {
    ia: &'a InodeAlloc,
    group: u32,
    /// First inode-table block to zero.
    pub zero_from: u64,
    /// End (exclusive) of the inode table.
    pub zero_end: u64,
    /// First inode slot (0-based in the group) of the range.
    pub first_slot: u32,
    /// The group had `ITABLE_ZEROED` already when it was locked.
    pub already_zeroed: bool,
}

impl ZeroingGuard<'_> {
    /// The group.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The zeros are written: record `ITABLE_ZEROED` (the group becomes
    /// dirty; the next rendered handle journals its descriptor) and
    /// release the group.
    pub fn mark_zeroed(self) {
        let this = std::mem::ManuallyDrop::new(self);
        this.ia.end_zeroing(this.group, true);
    }
}

impl Drop for ZeroingGuard<'_> {
    fn drop(&mut self) {
        self.ia.end_zeroing(self.group, false);
    }
}
