//! The operations layer: one [`Filesystem`] that ties the engine together.
//!
//! - **Open** ([`Filesystem::open`], [`Filesystem::open_checked`]):
//!   [`RwFs::open_deferred`] (replay first), then the superblock, then one
//!   streamed, checked pass over the descriptor table that builds both
//!   allocators (no bitmap read); only then, after the caller's check,
//!   `needs_recovery` goes to disk ([`RwFs::mark_in_use`]) and the orphans
//!   of a crash are processed. A freed-extent hook hands every durable
//!   commit's tid to [`BlockAlloc::committed`], so blocks freed by a
//!   transaction become allocatable only after it is durable. Close
//!   writes the allocators' free totals to the superblock.
//! - **Operations** run inside one journal handle each and end with
//!   [`Filesystem::finish`], which renders the groups the allocators
//!   changed (block/inode bitmaps, descriptors with their checksums, the
//!   superblock's free counts) *into the same handle* before it ends, so
//!   the transaction that commits an allocation always holds its bitmaps.
//!   A failure after a change fails the handle ([`Handle::fail`]): the
//!   journal aborts and nothing of the half operation commits.
//! - **Locking**: the API is `&self` and thread-safe; every public call
//!   is atomic with respect to the inodes it reads and writes, also when
//!   it takes several handles. Three kinds of locks, always taken in this
//!   order (a thread never waits for an earlier one while holding a later
//!   one):
//!   1. `renames`: a cross-directory rename (the kernel's
//!      `s_vfs_rename_mutex`): the tree's shape above the two parents
//!      cannot change while it decides their order.
//!   2. **call locks** (`locks.call`, reentrant per thread), held for the
//!      whole public call, every handle of it: the directories first
//!      (one parent; two parents of a rename ancestor first, else by
//!      inode number), then the other inodes the call changes (the
//!      target of an unlink/rmdir/link, a rename's moved inode and the
//!      replaced one, in ascending number; the inode of a file
//!      operation). A call lock is never taken inside a handle. Inodes
//!      are read *after* their locks are held, and every inode that a
//!      handle stores is read inside that handle.
//!   3. `ops`, **shared** from [`Filesystem::begin`] to
//!      [`Filesystem::finish`]: handles of different inodes run side by
//!      side in the running transaction, as jbd2's do. Exclusive only
//!      for a handle that may take an inode off the *old* orphan list
//!      (it stores the neighbour pointing at it, an inode no lock of the
//!      call covers). Then the journal's (a handle that does not fit the
//!      running transaction waits for its commit, which waits for the
//!      open handles) and the allocators' own locks; inside a handle the
//!      **content locks** (`locks.write`) of the inodes whose tree,
//!      directory or xattr blocks the handle edits, and three leaf locks
//!      held briefly, never two at once: `orphans` (the orphan list and
//!      file), `xattr_blocks` (a shared xattr block's refcount),
//!      `inode_init` (a new inode's allocation and slot write), and at
//!      the end `render_lock`.
//!
//!   The allocators record which groups changed **per thread** (the
//!   thread running the operation), and `finish` renders that
//!   operation's groups only, into its own handle with its own credits,
//!   under `render_lock` (images of one group go into the transaction in
//!   the order they were made, so the last is the newest). Every
//!   allocation is rendered before its handle ends, and a transaction
//!   commits only when all its handles ended, so a commit never holds
//!   an allocation without its bitmap.
//!
//!   Reads ([`Filesystem::read_at`], [`Filesystem::lookup`],
//!   [`Filesystem::xattrs`], [`Filesystem::read_locked`]) take only the
//!   content lock of the one inode they read, shared: they see the inode
//!   and its blocks as a handle left them and wait at most for one
//!   handle, never for a long call, a commit or `ops`.
//! - **Reads** see the newest images through [`Filesystem::read`] (the
//!   read side's [`Fs`] over the cache, with descriptors kept current).
//!
//! Inodes ([`Filesystem::create_inode`], [`Filesystem::delete_inode`]) are
//! initialized as `__ext4_new_inode` does (mode, ids, times with
//! nanoseconds and epoch bits, crtime, `i_extra_isize`, a generation,
//! `EXTENTS_FL` with an empty extent root for files, directories and
//! symlinks). Extent writes ([`Filesystem::write_at`],
//! [`Filesystem::truncate`], [`Filesystem::fallocate`]) edit the tree in
//! place through [`ExtentTree`] (`extent_write`): a root-to-leaf path per
//! change, inserts that merge with neighbours or split leaves and grow the
//! root, removals that trim, free emptied nodes and shrink the tree, and
//! unwritten conversions as a remove plus an insert, so a change costs
//! O(depth) whatever the tree's size. A handle asks for the credits of a
//! few single-extent edits at the tree's depth and stops early (the next
//! handle goes on) when they or its group budget run short; truncates and
//! punches plan each handle's range from the end by the tree blocks and
//! groups it touches. New files, directories and symlinks get their
//! one-extent root written whole (`write_tree`, also used to
//! release a whole tree and, for now, by directory appends).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use ext4kit_device::Device;
use ext4kit_format::extent::{
    ENTRIES_IN_INODE, EXT_INIT_MAX_LEN, Extent as DiskExtent, ExtentHeader, ExtentIndex,
    entries_per_block, set_block_checksum,
};
use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::inode::{
    EXT4_EXTENTS_FL, EXTRA_ISIZE, FAST_SYMLINK_MAX, Inode, S_IFBLK, S_IFCHR, S_IFDIR, S_IFLNK,
    S_IFMT, device_i_block, fast_symlink_i_block, new_inode_uses_extents, set_checksum,
    slow_symlink_block,
};
use ext4kit_format::superblock::STATE_ERROR;
use zerocopy::IntoBytes;

use crate::balloc::cluster::{Clusters, Run};
use crate::balloc::{AllocRequest, BlockAlloc};
use crate::discard::{DiscardStats, Discarder, ReconcileStats, TrimReport, TrimRequest};
use crate::extent::{Mapping, NodeInfo};
use crate::extent_write::{
    ExtentTree, LBLK_END, TreeIo, TreeParams, UNWRITTEN_MAX, single_extent_credits,
};
use crate::groups::{DescTable, DirtySet, Layout};
use crate::ialloc::{InodeAlloc, InodeStateBuilder};
use crate::inode::{InodeInfo, Timestamp};
use crate::journal::Handle;
use crate::orphan_file::OrphanFile;
use crate::rw::{RwFs, RwOptions};
use crate::sb::{Fs, FsInfo};
use crate::xattr::Xattr;
use crate::xattr_write::{self as xw, SetMode, XattrBlocks, XattrError, XattrGeometry};
use crate::{BlockRead, FsError};

/// Blocks one write handle allocates at most (larger writes are split
/// into several handles, as the kernel's writeback splits them).
pub const WRITE_CHUNK: u64 = 2048;
/// Groups whose bitmaps/descriptor one allocation may change before it is
/// retried smaller (keeps a handle's credits bounded).
const MAX_GROUPS: usize = 6;
/// Blocks one fallocate handle covers at most.
pub const FALLOC_CHUNK: u64 = 1 << 20;
/// Groups one fallocate handle may change.
const FALLOC_GROUPS: usize = 40;
/// Tree blocks one truncate or punch handle plans to touch at most (the
/// credits allowing).
const REMOVE_BLOCKS: u32 = 64;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The current time (seconds, nanoseconds).
pub fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// `ext4_encode_extra_time`: (32-bit seconds, extra word), the time
/// first clamped to what an inode with the extra field holds
/// ([`Timestamp::clamped`]): past 2446 or before 1901 it would wrap.
pub fn encode_time(t: Timestamp) -> (u32, u32) {
    encode_time_in(t, true)
}

/// [`encode_time`] for an inode that has the extra time field (`extra`)
/// or not (then the seconds are clamped to the signed 32-bit range and
/// the extra word, not stored, is 0), as the kernel's
/// `EXT4_INODE_SET_XTIME` does.
pub fn encode_time_in(t: Timestamp, extra: bool) -> (u32, u32) {
    let t = t.clamped(extra);
    if !extra {
        return (t.sec as i32 as u32, 0);
    }
    let epoch = ((t.sec - i64::from(t.sec as i32)) >> 32) as u32 & 3;
    (t.sec as u32, epoch | (t.nsec << 2))
}

/// What a new inode gets ([`Filesystem::create_inode`]).
#[derive(Clone, Copy, Debug)]
pub struct NewInode {
    /// Type and permission bits (`S_IF*` | perm).
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub links: u16,
    /// atime = mtime = ctime = crtime; `None`: now.
    pub time: Option<Timestamp>,
    /// (major, minor) of a character or block device.
    pub rdev: Option<(u32, u32)>,
}

impl NewInode {
    /// A new inode of `mode` owned by `uid:gid` with one link, times now.
    pub fn new(mode: u16, uid: u32, gid: u32) -> NewInode {
        NewInode {
            mode,
            uid,
            gid,
            links: 1,
            time: None,
            rdev: None,
        }
    }
}

/// `fallocate(2)` mode bits (util-linux `-n`, `-p`, `-z`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Falloc {
    /// `FALLOC_FL_KEEP_SIZE`.
    pub keep_size: bool,
    /// `FALLOC_FL_PUNCH_HOLE` (needs `keep_size`).
    pub punch_hole: bool,
    /// `FALLOC_FL_ZERO_RANGE`.
    pub zero_range: bool,
}

/// Which times [`Filesystem::set_times`] sets.
#[derive(Clone, Copy, Debug, Default)]
pub struct Times {
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    pub ctime: Option<Timestamp>,
    pub crtime: Option<Timestamp>,
}

/// What [`Filesystem::setattr`] changes (`None`: unchanged).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// Permission bits (0o7777).
    pub mode: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub times: Option<Times>,
}

/// A filesystem open for reading and writing (see the module docs).
pub struct Filesystem {
    rw: RwFs,
    info: RwLock<FsInfo>,
    descs: Arc<DescTable>,
    balloc: Arc<BlockAlloc>,
    ialloc: Arc<InodeAlloc>,
    /// Taken shared by every operation's handle, exclusive by the few
    /// that edit the old orphan list's neighbours (see "Locking").
    ops: RwLock<()>,
    /// Operations between `begin` and their end (for the space kept for
    /// tree edits: [`Filesystem::tree_reserve`]).
    active: AtomicU32,
    /// Rendering of allocator state into a handle (bitmaps, descriptor
    /// blocks, superblock counts): one at a time, so that a later render
    /// always journals a newer state of a group than an earlier one.
    render_lock: Mutex<()>,
    /// Edits of xattr blocks (inside a handle): a block may be shared by
    /// several inodes (`h_refcount`), which no inode lock covers.
    xattr_blocks: Mutex<()>,
    /// Inode allocation through the write of the new slot (see
    /// [`Filesystem::create_inode`]).
    inode_init: Mutex<()>,
    /// Per-inode call and content locks.
    locks: InodeLocks,
    /// Cross-directory renames.
    renames: Mutex<()>,
    /// Edits of the orphan list and the orphan file (inside a handle).
    orphans: Mutex<()>,
    gen_seed: AtomicU32,
    /// Inodes whose extent tree an edit left at depth 2 or more: looked at
    /// by [`Filesystem::tidy_trees`] at the next sync or close.
    deep_trees: Mutex<BTreeSet<u32>>,
    /// The orphan file, with the orphan_file feature.
    orphan_file: Option<OrphanFile>,
    /// The quota files, with the quota feature (`fs/quota.rs`).
    quota: Option<quota::Quotas>,
    /// The discard pool with `-o discard` (declared last: dropped after
    /// the journal, whose hook feeds it).
    discard: Option<Discarder>,
}

impl std::fmt::Debug for Filesystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filesystem").finish_non_exhaustive()
    }
}

/// An operation in progress: the handle, the content locks it holds and
/// the operations lock (dropped in that order).
pub struct Op<'a> {
    pub h: Handle<'a>,
    locks: &'a InodeLocks,
    content: Vec<ContentLock<'a>>,
    /// Extent tree blocks (inode, block) this handle has checked or
    /// written, as they are now: the inodes' content locks keep them
    /// so until the handle ends, so a second visit needs no checksum
    /// or entry check (a write's range, remove and insert walk the
    /// same leaf several times).
    tree_memo: RefCell<HashMap<(u32, u64), Vec<u8>>>,
    /// `ops` is held exclusive (no other handle runs).
    exclusive: bool,
    /// Quota deltas of this handle: (type, id, bytes, inodes), added to
    /// the quota files by `finish` (`fs/quota.rs`).
    quota: Vec<(u8, u32, i64, i64)>,
    _guard: OpSlot<'a>,
}

/// How an operation holds `ops`, and its place in the `active` count.
struct OpSlot<'a> {
    _shared: Option<RwLockReadGuard<'a, ()>>,
    _exclusive: Option<RwLockWriteGuard<'a, ()>>,
    active: &'a AtomicU32,
}

impl Drop for OpSlot<'_> {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Op<'_> {
    /// Own inode `ino`'s content (its tree, directory and xattr blocks)
    /// until the handle ends, so that readers never see half of the
    /// handle's edits. Taken right after [`Filesystem::begin`], before
    /// the inode is read.
    pub(crate) fn own(&mut self, ino: u32) {
        let l = self.locks.write(ino);
        self.content.push(l);
    }
}

impl Filesystem {
    /// Open `dev` for writing: replay, validate, open the allocators.
    pub fn open(dev: Arc<dyn Device>, opts: RwOptions) -> Result<Filesystem, FsError> {
        Self::open_checked(dev, opts, |_| Ok::<(), FsError>(()))
    }

    /// [`Filesystem::open`] that runs `check` on the validated filesystem
    /// (superblock, journal, the whole descriptor table) before anything
    /// of this open is written: an `Err` from it gives up with nothing
    /// written (unless a dirty journal had to be replayed first, as every
    /// open does). Then the in-use marks go to the superblock and the
    /// orphans of a crash are processed. The command-line tools check
    /// their targets here, so the table is read and checked once.
    pub fn open_checked<E: From<FsError>>(
        dev: Arc<dyn Device>,
        opts: RwOptions,
        check: impl FnOnce(&Filesystem) -> Result<(), E>,
    ) -> Result<Filesystem, E> {
        let fs = Self::open_unmarked(dev, &opts)?;
        check(&fs)?;
        fs.rw.mark_in_use()?;
        // Unlinked-while-open inodes and unfinished deletes of a crash.
        fs.process_orphans()?;
        fs.rw.set_orphans_left(fs.orphans_left());
        if let (Some(d), Some(o)) = (&fs.discard, &opts.discard) {
            d.start_reconciler(o.reconcile, o.reconcile_pace)?;
        }
        Ok(fs)
    }

    /// Everything of an open that only reads (after a replay).
    fn open_unmarked(dev: Arc<dyn Device>, opts: &RwOptions) -> Result<Filesystem, FsError> {
        let discard_opts = opts.discard.clone();
        let rw = RwFs::open_deferred(dev.clone(), opts.clone())?;
        // The superblock here; the descriptors are checked (in large
        // sequential reads, never held) by the allocators' pass below.
        let info = FsInfo::load_superblock(rw.blocks())?;
        // bigalloc is unknown to the read side's list; the engine
        // writes it (clusters: ARCHITECTURE, "bigalloc").
        if let Some(f) = info
            .unknown_ro_compat
            .iter()
            .find(|f| f.as_str() != "bigalloc")
        {
            return Err(FsError::Unsupported(format!(
                "read-only compatible feature {f}"
            )));
        }
        let orphan_file = OrphanFile::load(&Fs {
            blocks: rw.blocks(),
            info: &info,
        })
        .inspect_err(|e| {
            // ext4_init_orphan_info: ext4_error, and the mount fails.
            if e.is_corruption() {
                let rec = crate::rw::ErrorRecord::of(e, "orphan_file_load", line!(), 0);
                rw.record_error(&rec, e);
            }
        })?;
        let quota = Self::load_quotas(&Fs {
            blocks: rw.blocks(),
            info: &info,
        })?;
        let layout = Layout::from_superblock(&info.sb)?;
        let descs = Arc::new(DescTable::new(layout.clone()));
        let dirty = Arc::new(DirtySet::default());
        let rd = rw.blocks();
        // One pass over the descriptor table in all: the inode side is
        // built during the block allocator's.
        let mut inodes = InodeStateBuilder::default();
        let balloc = Arc::new(BlockAlloc::open_with(
            rd,
            descs.clone(),
            dirty.clone(),
            discard_opts.is_some(),
            |_, d| inodes.add(&layout, d),
        )?);
        let ialloc = Arc::new(InodeAlloc::from_state(
            descs.clone(),
            balloc.clone(),
            dirty,
            inodes,
        ));
        let discard = match &discard_opts {
            Some(o) => Some(Discarder::new(
                dev,
                balloc.clone(),
                descs.layout().block_size,
                descs.layout().blocks_count,
                o,
            )?),
            None => None,
        };
        let b = balloc.clone();
        let q = discard.as_ref().map(Discarder::queue);
        // After every durable commit: its frees become allocatable, or
        // with discard they are queued (never waited for here).
        rw.journal().add_freed_hook(Box::new(move |tid, _| {
            let ranges = b.committed(tid);
            if let Some(q) = &q {
                q.submit(&ranges);
            }
        }));
        let t = now();
        let fs = Filesystem {
            rw,
            info: RwLock::new(info),
            descs,
            balloc,
            ialloc,
            ops: RwLock::new(()),
            active: AtomicU32::new(0),
            render_lock: Mutex::new(()),
            xattr_blocks: Mutex::new(()),
            inode_init: Mutex::new(()),
            locks: InodeLocks::default(),
            renames: Mutex::new(()),
            orphans: Mutex::new(()),
            deep_trees: Mutex::new(BTreeSet::new()),
            gen_seed: AtomicU32::new((t.nsec ^ (t.sec as u32)).wrapping_mul(0x9E37_79B9) | 1),
            orphan_file,
            quota,
            discard,
        };
        Ok(fs)
    }

    /// Commit, checkpoint and close cleanly (`orphan_present` is cleared
    /// unless the orphan file still holds inodes: unlinked files not
    /// released before the close, which the next open frees). With
    /// discard on, the reconciler stops (what it did not reach is found at
    /// the next open), the last commit's discards and every queued one are
    /// issued and waited for, and the device is flushed.
    pub fn close(self) -> Result<(), FsError> {
        if self.rw.read_only().is_none() && self.rw.journal().aborted().is_none() {
            self.tidy_trees()?;
        }
        self.rw.set_orphans_left(self.orphans_left());
        if let Some(d) = &self.discard {
            d.stop_reconciler();
        }
        let dev = self.rw.journal().device().clone();
        // The allocators' totals, as the kernel's unmount writes its
        // counters (no second pass over the descriptor table).
        let counts = (
            self.balloc.disk_free_total(),
            u32::try_from(self.ialloc.free_inodes()).unwrap_or(u32::MAX),
        );
        let Filesystem { rw, discard, .. } = self;
        let r = rw.close_with_counts(Some(counts));
        if let Some(d) = discard {
            d.finish();
            if r.is_ok() {
                dev.flush()?;
            }
        }
        r
    }

    fn orphans_left(&self) -> bool {
        self.orphan_file.as_ref().is_some_and(|o| !o.is_empty())
    }

    /// The orphan file, with the orphan_file feature.
    pub fn orphan_file(&self) -> Option<&OrphanFile> {
        self.orphan_file.as_ref()
    }

    /// Stop without writing anything more (tests: a power cut after the
    /// last commit). Queued discards are dropped (the discards in hand
    /// finish first), as a kill would lose them.
    pub fn crash(self) {
        let Filesystem { rw, discard, .. } = self;
        if let Some(d) = discard {
            d.abandon();
        }
        rw.crash()
    }

    /// The discard queue's counters (`None` without discard).
    pub fn discard_stats(&self) -> Option<DiscardStats> {
        self.discard.as_ref().map(Discarder::stats)
    }

    /// The reconciler's progress (`None` without discard).
    pub fn reconcile_stats(&self) -> Option<ReconcileStats> {
        self.discard.as_ref().map(Discarder::reconcile_stats)
    }

    /// Wait until every queued discard has finished.
    pub fn wait_discards(&self) {
        if let Some(d) = &self.discard {
            d.wait_idle();
        }
    }

    /// Wait for the reconciler to finish (or stop).
    pub fn wait_reconciled(&self) -> Option<ReconcileStats> {
        self.discard.as_ref().map(Discarder::wait_reconciled)
    }

    /// FITRIM (online `fstrim`): discard the free space in `req`'s range
    /// that the device still holds (all of it on devices that cannot
    /// tell), through the discard pool (a temporary one without
    /// `-o discard`). Blocks being discarded are busy meanwhile.
    pub fn trim(&self, req: &TrimRequest) -> Result<TrimReport, FsError> {
        let tmp;
        let d = match &self.discard {
            Some(d) => d,
            None => {
                tmp = Discarder::new(
                    self.rw.journal().device().clone(),
                    self.balloc.clone(),
                    self.rw.geometry().block_size,
                    self.descs.layout().blocks_count,
                    &crate::discard::DiscardOptions::default(),
                )?;
                &tmp
            }
        };
        let r = d.trim(self.rw.blocks(), req);
        if self.discard.is_none() {
            d.finish();
        }
        r
    }

    /// The read-write core (journal, cache, superblock).
    pub fn rw(&self) -> &RwFs {
        &self.rw
    }

    /// The block allocator.
    pub fn block_alloc(&self) -> &BlockAlloc {
        &self.balloc
    }

    /// The inode allocator.
    pub fn inode_alloc(&self) -> &InodeAlloc {
        &self.ialloc
    }

    /// Commit the running transaction (sync), deep extent trees edited
    /// since the last sync repacked first ([`Filesystem::tidy_trees`]).
    pub fn sync(&self) -> Result<(), FsError> {
        self.tidy_trees()?;
        self.rw.journal().commit().map(|_| ())
    }

    /// fsync of a change that returned `tid`.
    pub fn commit_tid(&self, tid: u32) -> Result<(), FsError> {
        self.rw.journal().commit_tid(tid)
    }

    /// Run `f` over the read side (newest images, current descriptors).
    pub fn read<R>(&self, f: impl FnOnce(&Fs<'_>) -> R) -> R {
        let info = self.info.read().unwrap_or_else(|e| e.into_inner());
        f(&Fs {
            blocks: self.rw.blocks(),
            info: &info,
        })
    }

    fn block_size(&self) -> u64 {
        u64::from(self.rw.geometry().block_size)
    }

    /// Start an operation: `ops` shared (operations of different inodes
    /// run their handles side by side), then a handle with `credits` plus
    /// room for rendering `groups` groups and the superblock.
    pub fn begin(&self, credits: u32, groups: u32) -> Result<Op<'_>, FsError> {
        self.begin_as(credits, groups, false)
    }

    /// [`Filesystem::begin`], with `ops` held exclusive when `exclusive`:
    /// no other handle runs until this one ends. For the edits of the old
    /// orphan list, which store a neighbour inode that no lock of this
    /// call covers (see [`Filesystem::orphan_del`]).
    fn begin_as(&self, credits: u32, groups: u32, exclusive: bool) -> Result<Op<'_>, FsError> {
        let (shared, excl) = if exclusive {
            (
                None,
                Some(self.ops.write().unwrap_or_else(|e| e.into_inner())),
            )
        } else {
            (
                Some(self.ops.read().unwrap_or_else(|e| e.into_inner())),
                None,
            )
        };
        self.active.fetch_add(1, Ordering::Relaxed);
        let guard = OpSlot {
            _shared: shared,
            _exclusive: excl,
            active: &self.active,
        };
        let max = self.rw.journal().max_transaction();
        let want = credits
            .saturating_add(groups.saturating_mul(3))
            .saturating_add(2)
            .saturating_add(self.quota_credits());
        let h = self.rw.start(want.min(max.max(1)))?;
        Ok(Op {
            h,
            locks: &self.locks,
            content: Vec::new(),
            tree_memo: RefCell::new(HashMap::new()),
            exclusive,
            quota: Vec::new(),
            _guard: guard,
        })
    }

    /// Hold inode `ino`'s call lock (see "Locking" in the module docs):
    /// no other changing call on `ino` runs until the guard is dropped.
    /// Reentrant: the engine's calls made by the holder go on. For a
    /// caller that makes several calls one (an `O_APPEND` write reads the
    /// size, then writes there; an open checked against a concurrent
    /// unlink). Take at most this one lock, or follow the documented
    /// order (directories first), and never inside a handle.
    pub fn lock_inode(&self, ino: u32) -> InodeLock<'_> {
        self.locks.call(ino)
    }

    /// Run `f` over the read side with inode `ino` (also an orphan) read
    /// under its shared content lock: the inode and its tree, directory
    /// and xattr blocks are as a handle left them (readdir, readlink,
    /// getxattr, lseek's map). Waits at most for one handle.
    pub fn read_locked<R>(
        &self,
        ino: u32,
        f: impl FnOnce(&Fs<'_>, &InodeInfo) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        self.guard("read_locked", ino, || {
            let _r = self.locks.read(ino);
            let inode = self.inode_any_op(ino)?;
            self.read(|fs| f(fs, &inode))
        })
    }

    /// End an operation: render the allocators' changes into its handle,
    /// end it; returns the tid (for [`Filesystem::commit_tid`]). On an
    /// error the handle fails (journal aborted).
    pub fn finish(&self, mut op: Op<'_>) -> Result<u32, FsError> {
        // Quota first: an entry for a new id may allocate a block, which
        // the rendering below then journals.
        if let Err(e) = self.quota_flush(&mut op) {
            return Err(self.fail(op, e));
        }
        let Op {
            mut h,
            content,
            _guard,
            ..
        } = op;
        let r = match self.render(&mut h) {
            Ok(()) => {
                let tid = h.tid();
                drop(h);
                Ok(tid)
            }
            Err(e) => Err(h.fail(e)),
        };
        drop(content);
        r
    }

    /// Fail an operation whose handle may have changed blocks.
    pub fn fail(&self, op: Op<'_>, e: FsError) -> FsError {
        // Allocations of the failed operation stay out of use until the
        // journal is reopened (it is aborted anyway): its groups are not
        // rendered.
        let Op {
            h, content, _guard, ..
        } = op;
        drop(self.balloc.take_dirty_mine());
        let e = h.fail(e);
        drop(content);
        e
    }

    fn render(&self, h: &mut Handle<'_>) -> Result<(), FsError> {
        // This thread's (this operation's) groups only: another running
        // operation renders its own, with its own credits. Under
        // `render_lock`, so a group's images go into the transaction in
        // the order they were made (the last one is the newest state); a
        // group two operations changed is rendered by both, the second
        // time in blocks already joined (no credit).
        let dirty = self.balloc.take_dirty_mine();
        if dirty.is_empty() {
            return Ok(());
        }
        let _r = lock(&self.render_lock);
        let rd = self.rw.blocks();
        let mut desc_blocks = BTreeSet::new();
        let mut images = Vec::with_capacity(dirty.len());
        for d in &dirty {
            let im = self.ialloc.render(rd, d)?;
            images.push(im);
        }
        // The read side reads descriptors through the cache: it sees the
        // new ones once their blocks are changed below.
        for im in images {
            for (blk, img) in [im.block_bitmap, im.inode_bitmap].into_iter().flatten() {
                h.modify(blk, |b| b.copy_from_slice(&img))?;
            }
            desc_blocks.insert(im.desc_block);
        }
        for i in desc_blocks {
            let (blk, img) = self.descs.block_image(rd, i)?;
            h.modify(blk, |b| b.copy_from_slice(&img))?;
        }
        let fb = self.balloc.free_blocks();
        let fi = u32::try_from(self.ialloc.free_inodes()).unwrap_or(u32::MAX);
        self.rw.modify_superblock(h, |sb| {
            sb.set_free_blocks_count(fb);
            sb.s_free_inodes_count.set(fi);
        })?;
        Ok(())
    }

    // ------------------------------------------------------------------
    // Inodes.

    /// Block and byte offset of inode `ino`'s slot (current descriptors).
    pub fn inode_location(&self, ino: u32) -> Result<(u64, usize), FsError> {
        let l = self.descs.layout();
        if ino == 0 || ino > l.inodes_count {
            return Err(FsError::corrupt(
                "inode number",
                format!("inode {ino} is outside 1..={}", l.inodes_count),
            ));
        }
        let g = (ino - 1) / l.inodes_per_group;
        let d = self.descs.get(self.rw.blocks(), g)?;
        Ok(crate::inode::slot_location(
            d.inode_table(),
            (ino - 1) % l.inodes_per_group,
            l.inode_size,
            l.block_size,
        ))
    }

    /// Read and check inode `ino` (newest image).
    pub fn inode(&self, ino: u32) -> Result<InodeInfo, FsError> {
        self.guard("inode", ino, || self.inode_op(ino))
    }

    fn inode_op(&self, ino: u32) -> Result<InodeInfo, FsError> {
        let (blk, off) = self.inode_location(ino)?;
        let isz = self.descs.layout().inode_size as usize;
        let b = self.read(|fs| fs.meta_block(blk, "inode table"))?;
        let raw = b[off..off + isz].to_vec();
        self.read(|fs| fs.decode_inode(ino, raw))
    }

    /// Read inode `ino` also when its link count is 0 (an orphan, or an
    /// inode being deleted); checksum checked.
    pub fn inode_any(&self, ino: u32) -> Result<InodeInfo, FsError> {
        self.guard("inode_any", ino, || self.inode_any_op(ino))
    }

    fn inode_any_op(&self, ino: u32) -> Result<InodeInfo, FsError> {
        let (blk, off) = self.inode_location(ino)?;
        let isz = self.descs.layout().inode_size as usize;
        let b = self.read(|fs| fs.meta_block(blk, "inode table"))?;
        self.decode_any(ino, b[off..off + isz].to_vec())
    }

    /// Inode `ino` as a call through an open file sees it: linked, or an
    /// orphan (link count 0, still in use: unlinked while open, or being
    /// deleted), which `fchmod`, `fchown`, `futimens` and `fsetxattr`
    /// change on ext4 as any inode; a freed one is `NotFound` (a stale
    /// number, not a corruption).
    fn inode_open(&self, ino: u32) -> Result<InodeInfo, FsError> {
        let i = self.inode_any_op(ino)?;
        if i.links == 0 && !self.ialloc.in_use(self.rw.blocks(), ino)? {
            return Err(FsError::NotFound);
        }
        Ok(i)
    }

    /// `decode_inode` that accepts a link count of 0.
    fn decode_any(&self, ino: u32, raw: Vec<u8>) -> Result<InodeInfo, FsError> {
        if raw.len() < 128 || u16::from_le_bytes([raw[0x1A], raw[0x1B]]) != 0 {
            return self.read(|fs| fs.decode_inode(ino, raw));
        }
        let csum = self.rw.geometry().csum;
        if csum.metadata && !ext4kit_format::inode::checksum_ok(&raw, ino, &csum) {
            return Err(FsError::corrupt(
                "inode",
                format!("inode {ino}: checksum does not match"),
            ));
        }
        let mut copy = raw.clone();
        copy[0x1A..0x1C].copy_from_slice(&1u16.to_le_bytes());
        if csum.metadata {
            set_checksum(&mut copy, ino, &csum);
        }
        let mut i = self.read(|fs| fs.decode_inode(ino, copy))?;
        i.links = 0;
        i.raw = raw;
        Ok(i)
    }

    /// The next `i_generation` (the kernel takes a random number): one
    /// step of xorshift32 taken atomically, so two callers never get the
    /// same value (a load then a store let two threads step from the
    /// same state).
    pub(crate) fn next_generation(&self) -> u32 {
        let step = |mut x: u32| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let prev = self
            .gen_seed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x)))
            .unwrap_or_else(|x| x);
        step(prev)
    }

    /// Allocate and initialize an inode near `parent` inside `op`.
    pub fn create_inode(
        &self,
        op: &mut Op<'_>,
        parent: u32,
        spec: &NewInode,
    ) -> Result<InodeInfo, FsError> {
        let kind = spec.mode & S_IFMT;
        let rd = self.rw.blocks();
        // Project id: the parent's with PROJINHERIT (which a directory
        // inherits too), else 0, as `__ext4_new_inode`.
        let isz = self.descs.layout().inode_size as usize;
        let project = self.read(|fs| fs.info.features.ro_compat.contains(RoCompat::PROJECT));
        let mut inherit = None;
        if project && isz > 128 && parent != 0 {
            let p = self.inode_any_op(parent)?;
            if p.flags & flags::PROJINHERIT_FL != 0 {
                let fl = if kind == S_IFDIR {
                    flags::PROJINHERIT_FL
                } else {
                    0
                };
                inherit = Some((p.projid, fl));
            }
        }
        // A directory made in a casefolded one is casefolded too (the
        // kernel's EXT4_FL_INHERITED, masked for the type: only
        // directories carry the flag).
        let casefold = kind == S_IFDIR
            && parent != 0
            && self.read(|fs| fs.info.casefold.is_some())
            && self.inode_any_op(parent)?.flags & flags::CASEFOLD_FL != 0;
        // From the allocation to the slot's write: a slot that starts a
        // fresh table block is written into a zeroed block (no read),
        // which must not wipe a neighbour slot another create was handed
        // meanwhile (the kernel zeroes such a buffer under its lock).
        let _fresh = lock(&self.inode_init);
        let a = self.ialloc.alloc(rd, parent, kind == S_IFDIR)?;
        let l = self.descs.layout();
        let isz = l.inode_size as usize;
        let mut slot = vec![0u8; isz];
        let mut node = Inode::default();
        node.i_mode.set(spec.mode);
        node.i_uid.set(spec.uid as u16);
        node.l_i_uid_high.set((spec.uid >> 16) as u16);
        node.i_gid.set(spec.gid as u16);
        node.l_i_gid_high.set((spec.gid >> 16) as u16);
        node.i_links_count.set(spec.links);
        node.i_generation.set(self.next_generation());
        let t = spec.time.unwrap_or_else(now);
        let (s, x) = encode_time_in(t, isz > 128);
        node.i_atime.set(s);
        node.i_mtime.set(s);
        node.i_ctime.set(s);
        if isz > 128 {
            node.i_extra_isize.set(EXTRA_ISIZE.min((isz - 128) as u16));
            node.i_atime_extra.set(x);
            node.i_mtime_extra.set(x);
            node.i_ctime_extra.set(x);
            node.i_crtime.set(s);
            node.i_crtime_extra.set(x);
        }
        if let Some((projid, fl)) = inherit {
            node.i_projid.set(projid);
            node.i_flags.set(node.i_flags.get() | fl);
        }
        if casefold {
            node.i_flags.set(node.i_flags.get() | flags::CASEFOLD_FL);
        }
        let extents = self.read(|fs| fs.info.features.incompat.contains(Incompat::EXTENTS));
        // A symlink made here is a slow one; create_symlink turns short
        // targets into fast ones.
        if extents && new_inode_uses_extents(spec.mode, FAST_SYMLINK_MAX + 1) {
            node.i_flags.set(node.i_flags.get() | EXT4_EXTENTS_FL);
            let h = ExtentHeader::new(0, ENTRIES_IN_INODE, 0);
            node.i_block_bytes_mut()[..12].copy_from_slice(h.as_bytes());
        }
        if let Some((major, minor)) = spec.rdev
            && matches!(kind, S_IFCHR | S_IFBLK)
        {
            node.i_block_bytes_mut()
                .copy_from_slice(&device_i_block(major, minor));
        }
        let n = slot.len().min(160);
        slot[..n].copy_from_slice(&node.as_bytes()[..n]);
        let csum = self.rw.geometry().csum;
        if csum.metadata {
            set_checksum(&mut slot, a.ino, &csum);
        }
        let (blk, off) = self.inode_location(a.ino)?;
        if a.fresh_block {
            op.h.modify_new(blk, |b| b[off..off + isz].copy_from_slice(&slot))?;
        } else {
            op.h.modify(blk, |b| b[off..off + isz].copy_from_slice(&slot))?;
        }
        self.quota_note_alloc(op, a.ino, &slot, true);
        // An O_TMPFILE inode has no link from the start.
        self.decode_any(a.ino, slot)
    }

    /// Make a symlink inode to `target` inside `op`: a fast symlink (the
    /// target in `i_block`, no extents flag) below 60 bytes, else one data
    /// block (ordered data) mapped by an extent, as `ext4_symlink` does.
    /// The caller links it.
    pub fn create_symlink(
        &self,
        op: &mut Op<'_>,
        parent: u32,
        target: &[u8],
        spec: &NewInode,
    ) -> Result<InodeInfo, FsError> {
        let bs = self.block_size();
        if target.is_empty() || target.len() as u64 >= bs.min(4096) {
            return Err(FsError::InvalidRequest(format!(
                "symlink target of {} bytes (File name too long)",
                target.len()
            )));
        }
        let spec = NewInode {
            mode: S_IFLNK | 0o777,
            ..*spec
        };
        let mut inode = self.create_inode(op, parent, &spec)?;
        let extents = inode.has_extents();
        if let Some(ib) = fast_symlink_i_block(target, extents) {
            let len = target.len() as u64;
            self.edit_inode(&mut inode, |n| {
                n.i_flags.set(n.i_flags.get() & !EXT4_EXTENTS_FL);
                n.i_block_bytes_mut().copy_from_slice(&ib);
                n.set_size(len);
            })?;
        } else {
            let data = slow_symlink_block(target, bs as usize)
                .ok_or_else(|| FsError::InvalidRequest("symlink target too long".into()))?;
            let group = self.inode_group(inode.ino);
            let mut req = AllocRequest::new(1, group);
            req.goal = Some(self.balloc.goal_for_inode(group, false));
            let (p, held) = self.place_block(&[], 0, &req)?;
            op.h.write_data(p, &data)?;
            let len = target.len() as u64;
            let per512 = held * (bs / 512);
            if extents {
                let m = Mapping {
                    lblk: 0,
                    pblk: p,
                    len: 1,
                    unwritten: false,
                };
                self.write_tree(op, &mut inode, &[], &[m])?;
            } else {
                self.edit_inode(&mut inode, |n| n.i_block[0].set(p as u32))?;
            }
            self.edit_inode(&mut inode, |n| {
                n.set_size(len);
                n.set_blocks_512(per512);
            })?;
        }
        self.store_inode(op, &inode)?;
        Ok(inode)
    }

    /// Change `inode`'s fixed fields (its `raw` and decoded copy are
    /// updated; nothing is written until [`Filesystem::store_inode`]).
    pub fn edit_inode(
        &self,
        inode: &mut InodeInfo,
        f: impl FnOnce(&mut Inode),
    ) -> Result<(), FsError> {
        let mut node = Inode::parse(&inode.raw)
            .ok_or_else(|| FsError::corrupt("inode", format!("inode {}: short", inode.ino)))?;
        f(&mut node);
        // The in-inode xattr area after i_extra_isize is kept.
        let mut raw = std::mem::take(&mut inode.raw);
        node.update_slot(&mut raw, inode.ino, &self.rw.geometry().csum);
        *inode = self.decode_any(inode.ino, raw)?;
        Ok(())
    }

    /// Write `inode.raw` to its slot inside `op`.
    pub fn store_inode(&self, op: &mut Op<'_>, inode: &InodeInfo) -> Result<(), FsError> {
        self.quota_note_store(op, inode.ino, &inode.raw)?;
        let (blk, off) = self.inode_location(inode.ino)?;
        let raw = &inode.raw;
        op.h.modify(blk, |b| b[off..off + raw.len()].copy_from_slice(raw))
    }

    /// `setattr`: permission bits (the type is kept), owner, size (a
    /// truncate or sparse growth first) and times, in that order; ctime is
    /// now unless given. Returns the last tid.
    pub fn setattr(&self, ino: u32, a: &SetAttr) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("setattr", ino, || self.setattr_op(ino, a))
    }

    fn setattr_op(&self, ino: u32, a: &SetAttr) -> Result<u32, FsError> {
        let attrs = a.mode.is_some() || a.uid.is_some() || a.gid.is_some() || a.size.is_some();
        flags::may_setattr(&self.inode_any(ino)?, attrs)?;
        let mut tid = self.rw.journal().running_tid();
        if let Some(size) = a.size {
            tid = self.truncate(ino, size)?;
        }
        if a.mode.is_none() && a.uid.is_none() && a.gid.is_none() && a.times.is_none() {
            return Ok(tid);
        }
        let mut op = self.begin(4, 1)?;
        op.own(ino);
        let read: Result<_, FsError> = (|| {
            let inode = self.inode_open(ino)?;
            // A stored access ACL follows a chmod (posix_acl_chmod).
            let access = match a.mode {
                Some(_) => {
                    let attrs = self.read(|fs| fs.xattrs(&inode))?;
                    xw::get_acl(&attrs, xw::AclKind::Access).map_err(xattr_fs)?
                }
                None => None,
            };
            Ok((inode, access))
        })();
        // Nothing changed yet: a refusal ends the empty handle.
        let (mut inode, access) = read?;
        let r = (|| {
            if let (Some(m), Some(acl)) = (a.mode, access.as_deref()) {
                let geo = self.xattr_geometry();
                let mut slot = inode.raw.clone();
                let mut io = self.xattr_io(&mut op);
                xw::chmod(&geo, &mut io, ino, &mut slot, m, Some(acl)).map_err(xattr_fs)?;
                inode = self.decode_any(ino, slot)?;
            }
            let t = a.times.unwrap_or_default();
            let c = t.ctime.unwrap_or_else(now);
            self.edit_inode(&mut inode, |n| {
                if let Some(m) = a.mode {
                    n.i_mode.set((n.i_mode.get() & S_IFMT) | (m & 0o7777));
                }
                if let Some(u) = a.uid {
                    n.i_uid.set(u as u16);
                    n.l_i_uid_high.set((u >> 16) as u16);
                }
                if let Some(g) = a.gid {
                    n.i_gid.set(g as u16);
                    n.l_i_gid_high.set((g >> 16) as u16);
                }
                set_node_times(n, &t, c);
            })?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Set times (ctime is set to now unless given), in one transaction.
    pub fn set_times(&self, ino: u32, t: &Times) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("set_times", ino, || self.set_times_op(ino, t))
    }

    fn set_times_op(&self, ino: u32, t: &Times) -> Result<u32, FsError> {
        let mut op = self.begin(1, 0)?;
        let mut inode = self.inode_open(ino)?;
        flags::may_setattr(&inode, false)?;
        let r = (|| {
            let c = t.ctime.unwrap_or_else(now);
            self.edit_inode(&mut inode, |n| set_node_times(n, t, c))?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Permission bits, owner and times written into inode `ino`'s slot
    /// in one handle under its call lock (no ACL sync: the mount's
    /// suid/sgid kill and copy_file_range's mode), also for an orphan
    /// (link count 0, still open).
    pub fn set_inode_attrs(&self, ino: u32, a: &crate::rw::InodeAttrs) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("set_inode_attrs", ino, || {
            let mut op = self.begin(1, 0)?;
            // Checked before the change (a corrupt inode changes nothing).
            let attrs = a.perm.is_some() || a.uid.is_some() || a.gid.is_some();
            flags::may_setattr(&self.inode_open(ino)?, attrs)?;
            let r = self.set_inode_attrs_in(&mut op, ino, a);
            match r {
                Ok(()) => self.finish(op),
                Err(e) => Err(self.fail(op, e)),
            }
        })
    }

    /// `RwFs::set_inode_attrs_in` with the owner change noted for quota.
    fn set_inode_attrs_in(
        &self,
        op: &mut Op<'_>,
        ino: u32,
        a: &crate::rw::InodeAttrs,
    ) -> Result<(), FsError> {
        if self.quota.is_some() && (a.uid.is_some() || a.gid.is_some()) {
            let mut new = self.rw.read_inode(ino)?;
            a.apply(&mut new);
            self.quota_note_store(op, ino, &new)?;
        }
        self.rw.set_inode_attrs_in(&mut op.h, ino, a)
    }

    /// Free an inode whose last link is gone, in one transaction after
    /// its blocks are released (large files in several, each leaving a
    /// consistent file): `i_dtime`, link count 0, inode bitmap, counts.
    /// An inode without links is on the orphan list (or in the orphan
    /// file) from the unlink that dropped its last name until this last
    /// handle takes it off: a crash between the steps leaves an orphan
    /// the next open (or e2fsck, or the kernel) finishes freeing.
    pub fn delete_inode(&self, ino: u32) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("delete_inode", ino, || self.delete_inode_op(ino))
    }

    fn delete_inode_op(&self, ino: u32) -> Result<u32, FsError> {
        // Unchecked: an inode freed with its last link goes whatever its
        // flags (ext4_evict_inode).
        self.truncate_with(ino, 0, true)?;
        // Taking an orphan off the old list may store its neighbour.
        let walk = self.inode_any(ino)?.links == 0 && self.on_orphan_list(ino);
        let (ec, eg) = self.ea_release_cost(&self.inode_any(ino)?)?;
        let mut op = self.begin_as(6 + ec, 2 + eg, walk)?;
        op.own(ino);
        let mut inode = self.inode_any(ino)?;
        let orphan = inode.links == 0;
        let r = (|| {
            if orphan {
                self.orphan_del(&mut op, &mut inode)?;
            }
            self.release_blocks_all(&mut op, &mut inode)?;
            let geo = self.xattr_geometry();
            if inode.file_acl != 0 || geo.ea_inode {
                let mut slot = inode.raw.clone();
                let mut io = self.xattr_io(&mut op);
                let (_, i) = xw::ea_charge(&geo, &io, ino, &slot).map_err(xattr_fs)?;
                xw::release_xattr_block(&geo, &mut io, ino, &mut slot).map_err(xattr_fs)?;
                drop(io);
                // The values' blocks leave with i_blocks (quota_note_alloc).
                self.quota_note_ea(&mut op, ino, &slot, 0, -(i as i64));
                // Link count 0 here (an orphan, or its last link gone).
                inode = self.decode_any(ino, slot)?;
            }
            let t = now();
            self.edit_inode(&mut inode, |n| {
                n.i_dtime.set(t.sec as u32);
                n.i_links_count.set(0);
                n.i_size_lo.set(0);
                n.i_size_high.set(0);
            })?;
            self.store_inode(&mut op, &inode)?;
            self.quota_note_alloc(&mut op, ino, &inode.raw, false);
            self.ialloc
                .free(self.rw.blocks(), ino, inode.mode & S_IFMT == S_IFDIR)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Whether taking `ino` off the orphans would walk the old orphan list
    /// (it is not in the orphan file), storing the neighbour that points
    /// at it: a handle that may do so runs alone (`begin_as`).
    fn on_orphan_list(&self, ino: u32) -> bool {
        !self.orphan_file.as_ref().is_some_and(|o| o.contains(ino))
    }

    /// Put `inode` (link count already 0, or a truncate in steps) in the
    /// orphan file (with orphan_file, while it has a free slot) or on the
    /// orphan list (`s_last_orphan`, chained through `i_dtime`), which the
    /// kernel and e2fsck process at mount, inside `op`; `inode` is stored.
    pub fn orphan_add(&self, op: &mut Op<'_>, inode: &mut InodeInfo) -> Result<(), FsError> {
        let _o = lock(&self.orphans);
        if let Some(of) = &self.orphan_file
            && of.add(&mut op.h, inode.ino, &self.rw.geometry().csum)?
        {
            self.set_orphan_present(op, true)?;
            return self.store_inode(op, inode);
        }
        let head = self.rw.superblock()?.s_last_orphan.get();
        if head == inode.ino {
            return Ok(());
        }
        self.edit_inode(inode, |n| n.i_dtime.set(head))?;
        self.store_inode(op, inode)?;
        let ino = inode.ino;
        self.rw
            .modify_superblock(&mut op.h, |sb| sb.s_last_orphan.set(ino))
    }

    /// Set or clear `orphan_present` inside `op` (where the kernel sets it
    /// at mount, it is set here in the transaction that puts the first
    /// inode in the orphan file and cleared in the one that empties it:
    /// a crash without orphans leaves nothing for e2fsck to clear).
    fn set_orphan_present(&self, op: &mut Op<'_>, on: bool) -> Result<(), FsError> {
        let bit = RoCompat::ORPHAN_PRESENT.bits();
        let ro = self.rw.superblock()?.s_feature_ro_compat.get();
        if (ro & bit != 0) == on {
            return Ok(());
        }
        self.rw.modify_superblock(&mut op.h, |sb| {
            let ro = sb.s_feature_ro_compat.get();
            sb.s_feature_ro_compat
                .set(if on { ro | bit } else { ro & !bit });
        })
    }

    /// Take `inode` off the orphan list inside `op` (its `i_dtime` is
    /// cleared; the caller stores `inode`).
    pub fn orphan_del(&self, op: &mut Op<'_>, inode: &mut InodeInfo) -> Result<(), FsError> {
        // The list's neighbours change here without their call locks: the
        // handle holds `ops` exclusive when the inode is on the old list
        // (callers check [`Filesystem::on_orphan_list`] before `begin`),
        // and every inode a handle stores is read inside it, so no other
        // handle holds a copy of a neighbour to store over this edit.
        let _o = lock(&self.orphans);
        let in_file = match &self.orphan_file {
            Some(of) => of.del(&mut op.h, inode.ino, &self.rw.geometry().csum)?,
            None => false,
        };
        if in_file && self.orphan_file.as_ref().is_some_and(|o| o.is_empty()) {
            self.set_orphan_present(op, false)?;
        }
        let next = inode.dtime;
        let ino = inode.ino;
        let head = self.rw.superblock()?.s_last_orphan.get();
        if in_file && head != ino {
            return Ok(());
        }
        if head == ino {
            self.rw
                .modify_superblock(&mut op.h, |sb| sb.s_last_orphan.set(next))?;
        } else {
            let mut cur = head;
            let limit = self.descs.layout().inodes_count;
            for _ in 0..limit {
                if cur == 0 {
                    break;
                }
                let mut c = self.inode_any(cur)?;
                if c.dtime == ino {
                    debug_assert!(op.exclusive, "orphan list edit in a shared handle");
                    self.edit_inode(&mut c, |n| n.i_dtime.set(next))?;
                    self.store_inode(op, &c)?;
                    break;
                }
                cur = c.dtime;
            }
        }
        self.edit_inode(inode, |n| n.i_dtime.set(0))
    }

    /// Finish what the orphan list holds (the kernel's
    /// `ext4_orphan_cleanup`): inodes without links are freed, others
    /// truncated to their size. Returns how many were processed.
    pub fn process_orphans(&self) -> Result<u32, FsError> {
        self.guard("process_orphans", 0, || self.process_orphans_op())
    }

    fn process_orphans_op(&self) -> Result<u32, FsError> {
        // As ext4_orphan_cleanup: not on a filesystem with errors (the
        // list and the file can't be trusted; e2fsck's full check frees
        // what is unlinked).
        if self.rw.superblock()?.s_state.get() & STATE_ERROR != 0 {
            return Ok(0);
        }
        let limit = self.descs.layout().inodes_count;
        let mut done = 0;
        for _ in 0..limit {
            let head = self.rw.superblock()?.s_last_orphan.get();
            if head == 0 {
                break;
            }
            self.process_orphan(head)?;
            done += 1;
        }
        // Then the orphan file, slot by slot (the kernel's order).
        for ino in self
            .orphan_file
            .as_ref()
            .map(|o| o.entries())
            .unwrap_or_default()
        {
            self.process_orphan(ino)?;
            done += 1;
        }
        Ok(done)
    }

    /// Free orphan `ino` (no links) or truncate it to its size and take it
    /// off the list or file.
    fn process_orphan(&self, ino: u32) -> Result<(), FsError> {
        let _c = self.locks.call(ino);
        let inode = self.inode_any(ino)?;
        if inode.links == 0 {
            self.delete_inode(ino)?;
            return Ok(());
        }
        if inode.is_regular() {
            // Already on the list: the truncate must not add it again.
            self.truncate_with(ino, inode.size, false)?;
        }
        let mut op = self.begin_as(2, 0, self.on_orphan_list(ino))?;
        let mut inode = self.inode_any(ino)?;
        let r = (|| {
            self.orphan_del(&mut op, &mut inode)?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op).map(|_| ()),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Release what is left of an inode's tree after a truncate to 0
    /// (an empty root needs nothing).
    fn release_blocks_all(&self, op: &mut Op<'_>, inode: &mut InodeInfo) -> Result<(), FsError> {
        if !inode.has_extents() {
            return Ok(());
        }
        let (maps, nodes) = self.read(|fs| fs.extent_tree(inode))?;
        if !maps.is_empty() {
            return Err(FsError::InvalidRequest(format!(
                "inode {} still maps blocks after truncate",
                inode.ino
            )));
        }
        self.write_tree(op, inode, &nodes, &[])
    }

    // ------------------------------------------------------------------
    // Extended attributes (through `xattr_write`).

    /// The settings the xattr writer needs.
    pub fn xattr_geometry(&self) -> XattrGeometry {
        self.read(|fs| XattrGeometry::new(fs.info))
    }

    /// The attributes of inode `ino` (ACLs in getxattr's form).
    pub fn xattrs(&self, ino: u32) -> Result<Vec<Xattr>, FsError> {
        self.guard("xattrs", ino, || self.xattrs_op(ino))
    }

    fn xattrs_op(&self, ino: u32) -> Result<Vec<Xattr>, FsError> {
        let _r = self.locks.read(ino);
        let inode = self.inode_open(ino)?;
        self.read(|fs| fs.xattrs(&inode))
    }

    /// setxattr (`value` `None`: removexattr), ACLs included
    /// (`system.posix_acl_*` in getxattr's form, the mode kept in sync):
    /// one transaction; ctime set; the `ext_attr` feature set when
    /// missing. A refusal (EEXIST, ENODATA, ENOSPC, ...) changes nothing.
    pub fn set_xattr(
        &self,
        ino: u32,
        name: &[u8],
        value: Option<&[u8]>,
        mode: SetMode,
    ) -> Result<u32, XattrError> {
        let _c = self.locks.call(ino);
        self.guard("set_xattr", ino, || {
            self.set_xattr_op(ino, name, value, mode)
        })
    }

    fn set_xattr_op(
        &self,
        ino: u32,
        name: &[u8],
        value: Option<&[u8]>,
        mode: SetMode,
    ) -> Result<u32, XattrError> {
        let geo = self.xattr_geometry();
        // With ea_inode: a new EA inode, the old one's release, and the
        // references a shared block's copy takes (one inode block each).
        let credits = if geo.ea_inode {
            4 + 2 * ea_inode::ea_inode_credits(geo.block_size as u64) + 16
        } else {
            4
        };
        let mut op = self.begin(credits, 2)?;
        op.own(ino);
        // Nothing changed yet: a refusal ends the empty handle.
        let mut inode = self.inode_open(ino)?;
        flags::may_change(&inode)?;
        let mut slot = inode.raw.clone();
        let r = {
            let mut io = self.xattr_io(&mut op);
            let before = xw::ea_charge(&geo, &io, ino, &slot);
            let r = before.and_then(|before| {
                let c = xw::set_xattr(&geo, &mut io, ino, &mut slot, name, value, mode)?;
                let after = xw::ea_charge(&geo, &io, ino, &slot)?;
                Ok((c, before, after))
            });
            drop(io);
            r.map(|(c, b, a)| {
                // The values' blocks count in the inode's i_blocks (and so
                // in its quota through store_inode); the EA inodes count
                // as inodes of its owner.
                let (db, di) = (a.0 as i64 - b.0 as i64, a.1 as i64 - b.1 as i64);
                xw::charge_ea_blocks(&geo, ino, &mut slot, db);
                self.quota_note_ea(&mut op, ino, &slot, 0, di);
                c
            })
        };
        let changed = match r {
            Ok(c) => c,
            Err(XattrError::Fs(e)) => return Err(XattrError::Fs(self.fail(op, e))),
            Err(e) if op.h.changed() => {
                // ENOSPC after an EA inode was made and released again:
                // the handle's (balanced) changes are committed.
                self.finish(op).map_err(XattrError::Fs)?;
                return Err(e);
            }
            Err(e) => {
                // Nothing changed: end the (empty) handle.
                drop(op);
                return Err(e);
            }
        };
        if !changed {
            return self.finish(op).map_err(XattrError::Fs);
        }
        let r = (|| {
            inode = self.decode_any(ino, slot)?;
            let t = now();
            self.edit_inode(&mut inode, |n| set_node_times(n, &Times::default(), t))?;
            self.store_inode(&mut op, &inode)?;
            let compat = Compat(self.rw.superblock()?.s_feature_compat.get());
            if !compat.contains(Compat::EXT_ATTR) {
                self.rw.modify_superblock(&mut op.h, |sb| {
                    let c = sb.s_feature_compat.get() | Compat::EXT_ATTR.bits();
                    sb.s_feature_compat.set(c);
                })?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => self.finish(op).map_err(XattrError::Fs),
            Err(e) => Err(XattrError::Fs(self.fail(op, e))),
        }
    }

    // ------------------------------------------------------------------
    // Extent trees.

    fn mapping(&self, inode: &InodeInfo) -> Result<(Vec<Mapping>, Vec<NodeInfo>), FsError> {
        if !inode.has_extents() {
            return Err(FsError::Unsupported(format!(
                "writing block-mapped inode {} (no extents)",
                inode.ino
            )));
        }
        self.read(|fs| fs.extent_tree(inode))
    }

    /// Tree blocks a tree of `n` extents needs (outside the inode).
    fn tree_blocks(&self, n: usize) -> usize {
        let per = usize::from(entries_per_block(self.rw.geometry().block_size));
        let mut total = 0;
        let mut count = n;
        while count > usize::from(ENTRIES_IN_INODE) {
            count = count.div_ceil(per);
            total += count;
        }
        total
    }

    /// Write `exts` (sorted, non-overlapping) as `inode`'s tree, reusing
    /// `old` tree blocks; `i_block` and `i_blocks` of `inode` are updated
    /// (the caller stores the inode).
    fn write_tree(
        &self,
        op: &mut Op<'_>,
        inode: &mut InodeInfo,
        old: &[NodeInfo],
        exts: &[Mapping],
    ) -> Result<(), FsError> {
        // Tree blocks are rewritten here, not through `TreeOp`.
        op.tree_memo.get_mut().clear();
        let bs = self.rw.geometry().block_size;
        let per = usize::from(entries_per_block(bs));
        let csum = self.rw.geometry().csum;
        let mut pool: Vec<u64> = old.iter().filter(|n| n.pblk != 0).map(|n| n.pblk).collect();
        let old_count = pool.len();
        let need = self.tree_blocks(exts.len());
        let rd = self.rw.blocks();
        if need > pool.len() {
            let goal = exts
                .first()
                .map(|m| m.pblk.saturating_sub(1))
                .filter(|&g| g > 0);
            let mut req =
                AllocRequest::new((need - pool.len()) as u64, self.inode_group(inode.ino));
            req.goal = goal;
            let cl = self.clusters();
            if cl.ratio() > 1 {
                // A cluster per tree block, the block its first.
                req.len *= cl.ratio();
                let a = self.balloc.alloc_clusters(rd, &req)?;
                for (s, n) in a.extents {
                    pool.extend((s..s + u64::from(n)).step_by(cl.ratio() as usize));
                }
            } else {
                let a = self.balloc.alloc(rd, &req)?;
                for (s, n) in a.extents {
                    pool.extend(s..s + u64::from(n));
                }
            }
        }
        while pool.len() > need {
            let b = pool.pop().unwrap_or_default();
            self.free_meta_block(op, b)?;
        }
        // Build level by level: entries of (first lblk, 12 bytes).
        let mut level: Vec<(u64, [u8; 12])> = exts
            .iter()
            .map(|m| {
                let len = m.len as u16
                    + if m.unwritten {
                        EXT_INIT_MAX_LEN as u16
                    } else {
                        0
                    };
                let e = DiskExtent::new(m.lblk as u32, len, m.pblk);
                let mut b = [0u8; 12];
                b.copy_from_slice(e.as_bytes());
                (m.lblk, b)
            })
            .collect();
        let mut depth = 0u16;
        let mut next = pool.into_iter();
        let eof = inode.size.div_ceil(u64::from(bs));
        while level.len() > usize::from(ENTRIES_IN_INODE) {
            let mut up = Vec::with_capacity(level.len().div_ceil(per));
            // Leaves: none starting past i_size's blocks when avoidable
            // (e2fsck's bounds of a deep tree's index entries).
            let bounds = if depth == 0 {
                let keys: Vec<u64> = level.iter().map(|(k, _)| *k).collect();
                crate::extent_write::pack_bounds(&keys, per, eof)
            } else {
                (0..level.len().div_ceil(per))
                    .map(|i| (i * per, ((i + 1) * per).min(level.len())))
                    .collect()
            };
            for chunk in bounds.iter().map(|&(s, e)| &level[s..e]) {
                let blk = next
                    .next()
                    .ok_or_else(|| FsError::InvalidRequest("extent tree block count".into()))?;
                let (ino, generation) = (inode.ino, inode.generation);
                op.h.modify_new(blk, |b| {
                    let h = ExtentHeader::new(chunk.len() as u16, per as u16, depth);
                    b[..12].copy_from_slice(h.as_bytes());
                    for (i, (_, e)) in chunk.iter().enumerate() {
                        b[12 + 12 * i..24 + 12 * i].copy_from_slice(e);
                    }
                    if csum.metadata {
                        set_block_checksum(b, ino, generation, &csum);
                    }
                })?;
                let first = chunk[0].0;
                let x = ExtentIndex::new(first as u32, blk);
                let mut e = [0u8; 12];
                e.copy_from_slice(x.as_bytes());
                up.push((first, e));
            }
            level = up;
            depth += 1;
        }
        let mut root = [0u8; 60];
        root[..12].copy_from_slice(
            ExtentHeader::new(level.len() as u16, ENTRIES_IN_INODE, depth).as_bytes(),
        );
        for (i, (_, e)) in level.iter().enumerate() {
            root[12 + 12 * i..24 + 12 * i].copy_from_slice(e);
        }
        // A cluster per tree block with bigalloc.
        let delta = (need as i64 - old_count as i64) * self.clusters().ratio() as i64;
        let per512 = i64::from(bs / 512);
        let blocks = (inode.blocks_512 as i64 + delta * per512).max(0) as u64;
        self.edit_inode(inode, |n| {
            n.i_block_bytes_mut().copy_from_slice(&root);
            n.set_blocks_512(blocks);
        })
    }

    /// One metadata block (an extent-tree block): with bigalloc it takes
    /// a whole cluster of its own (`ext4_new_meta_blocks`), the block
    /// being the cluster's first.
    fn alloc_meta_block(&self, req: &AllocRequest) -> Result<u64, FsError> {
        let a = if self.clusters().ratio() > 1 {
            self.balloc.alloc_clusters(self.rw.blocks(), req)?
        } else {
            self.balloc.alloc(self.rw.blocks(), req)?
        };
        a.extents.first().map(|e| e.0).ok_or(FsError::NoSpace {
            wanted: 1,
            available: 0,
        })
    }

    /// Free a block of [`Filesystem::alloc_meta_block`] (its cluster with
    /// bigalloc) and revoke it.
    fn free_meta_block(&self, op: &mut Op<'_>, blk: u64) -> Result<(), FsError> {
        let cl = self.clusters();
        let tid = op.h.tid();
        if cl.ratio() > 1 {
            let c = cl.c2b(cl.b2c(blk));
            self.balloc
                .free_clusters(self.rw.blocks(), tid, c, cl.ratio() as u32)?;
            op.h.free_extent(c, cl.ratio());
        } else {
            self.balloc.free(self.rw.blocks(), tid, blk, 1)?;
            op.h.free_extent(blk, 1);
        }
        op.h.revoke(blk)
    }

    /// Free the data blocks of `removed` (pieces of one unmapped range of
    /// a file), `left` and `right` the extents that stay around it; the
    /// blocks given back (whole clusters with bigalloc, only those no
    /// remaining extent uses: [`Clusters::released_all`]).
    pub(crate) fn free_data(
        &self,
        op: &mut Op<'_>,
        removed: &[Mapping],
        left: Option<&Mapping>,
        right: Option<&Mapping>,
    ) -> Result<u64, FsError> {
        let rd = self.rw.blocks();
        let tid = op.h.tid();
        let cl = self.clusters();
        let mut released = 0u64;
        if cl.ratio() == 1 {
            for f in removed {
                self.balloc.free(rd, tid, f.pblk, f.len)?;
                op.h.free_extent(f.pblk, u64::from(f.len));
                released += u64::from(f.len);
            }
            return Ok(released);
        }
        let runs: Vec<Run> = removed.iter().filter_map(as_run).collect();
        if runs.len() != removed.len() {
            return Err(FsError::corrupt(
                "extent tree",
                "an extent past 32-bit logical blocks".to_string(),
            ));
        }
        for r in cl.released_all(&runs, left.and_then(as_run), right.and_then(as_run)) {
            let (s, e) = (cl.c2b(r.start), cl.c2b(r.end));
            let mut at = s;
            while at < e {
                let n = (e - at).min(1 << 30);
                self.balloc.free_clusters(rd, tid, at, n as u32)?;
                op.h.free_extent(at, n);
                at += n;
            }
            released += e - s;
        }
        Ok(released)
    }

    /// Where block `lblk` of a file goes, `maps` being its extents in
    /// logical order (at least those around `lblk`): with bigalloc the
    /// cluster an extent next to it already holds for its logical
    /// cluster (nothing allocated, `Clusters::implied`), else a new
    /// cluster with the block at `lblk`'s offset in it; without, a new
    /// block. Returns the block and how many blocks the file newly holds
    /// (for `i_blocks`: 0, 1 or a cluster).
    pub(crate) fn place_block(
        &self,
        maps: &[Mapping],
        lblk: u64,
        req: &AllocRequest,
    ) -> Result<(u64, u64), FsError> {
        let cl = self.clusters();
        let none = || FsError::NoSpace {
            wanted: 1,
            available: 0,
        };
        if cl.ratio() == 1 {
            let a = self.balloc.alloc(self.rw.blocks(), req)?;
            return Ok((a.extents.first().map(|e| e.0).ok_or_else(none)?, 1));
        }
        let left = maps.iter().rfind(|m| m.end() <= lblk).and_then(as_run);
        let right = maps.iter().find(|m| m.lblk > lblk).and_then(as_run);
        let l32 = u32::try_from(lblk)
            .map_err(|_| FsError::InvalidRequest(format!("logical block {lblk} past 2^32")))?;
        if let Some((p, _)) = cl.implied(l32, left, right) {
            return Ok((p, 0));
        }
        let mut r = *req;
        r.len = cl.ratio();
        let a = self.balloc.alloc_clusters(self.rw.blocks(), &r)?;
        let c = a.extents.first().map(|e| e.0).ok_or_else(none)?;
        Ok((c + (lblk & cl.mask()), cl.ratio()))
    }

    /// Cluster arithmetic (bigalloc; ratio 1 without it).
    pub(crate) fn clusters(&self) -> Clusters {
        Clusters::new(self.descs.layout().cluster_bits).unwrap_or(Clusters::ONE)
    }

    fn inode_group(&self, ino: u32) -> u32 {
        (ino.saturating_sub(1)) / self.descs.layout().inodes_per_group
    }

    /// The facts the extent editor needs about `inode`.
    fn tree_params(&self, inode: &InodeInfo) -> TreeParams {
        let g = self.rw.geometry();
        TreeParams {
            ino: inode.ino,
            generation: inode.generation,
            csum: g.csum,
            block_size: g.block_size,
            first_data_block: g.first_data_block,
            blocks_count: g.blocks,
            eof_block: inode.size.div_ceil(u64::from(g.block_size)),
        }
    }

    /// Run `f` on `inode`'s extent tree whose root is `root` (updated),
    /// inside `op`; `delta` gathers the tree blocks added minus freed.
    fn tree_edit<R>(
        &self,
        op: &mut Op<'_>,
        inode: &InodeInfo,
        root: &mut [u8; 60],
        delta: &mut i64,
        f: impl FnOnce(&mut ExtentTree<'_>) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let mut io = TreeOp {
            fs: self,
            op,
            ino: inode.ino,
            group: self.inode_group(inode.ino),
        };
        let mut t = ExtentTree::new(&mut io, self.tree_params(inode), root)?;
        let r = f(&mut t)?;
        if t.depth() >= 2 {
            lock(&self.deep_trees).insert(inode.ino);
        }
        *root = *t.root();
        *delta += t.blocks_delta;
        Ok(r)
    }

    /// Repack the extent trees of depth 2 or more edited since the last
    /// call that e2fsck's pass 1E would offer to rebuild ("could be
    /// narrower/shallower", [`crate::extent_write::tree_wants_rebuild`]):
    /// each is written again whole, packed as e2fsck rebuilds it, in one
    /// handle of its own (atomic). Incremental edits keep depth 0 and 1
    /// trees packed themselves; a deeper level can't be packed at O(depth)
    /// per edit, so it is done here, at sync and close, once per tree.
    /// A tree too large for one transaction, or no space for it, is left
    /// as it is (it is consistent, only not packed).
    pub fn tidy_trees(&self) -> Result<u32, FsError> {
        let inos = std::mem::take(&mut *lock(&self.deep_trees));
        let mut done = 0;
        for ino in inos {
            match self.guard("tidy_tree", ino, || self.tidy_tree(ino)) {
                Ok(true) => done += 1,
                Ok(false) => {}
                Err(FsError::NoSpace { .. } | FsError::SpaceBusy { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    fn tidy_tree(&self, ino: u32) -> Result<bool, FsError> {
        // No other changing call on `ino` until the rewrite is done: the
        // tree read here is the one the handle below replaces.
        let _c = self.locks.call(ino);
        let mut inode = self.inode_any(ino)?;
        if !inode.has_extents() || inode.mode == 0 || (inode.links == 0 && inode.dtime != 0) {
            return Ok(false);
        }
        let (maps, nodes) = self.mapping(&inode)?;
        let bs = self.rw.geometry().block_size;
        if !crate::extent_write::tree_wants_rebuild(&nodes, bs) {
            return Ok(false);
        }
        let l = self.descs.layout();
        let old: BTreeSet<u32> = nodes
            .iter()
            .filter(|n| n.pblk != 0)
            .map(|n| l.group_of(n.pblk))
            .collect();
        let credits = (nodes.len() + self.tree_blocks(maps.len()) + 4) as u32;
        let groups = old.len() as u32 + 2;
        let max = self.rw.journal().max_transaction();
        if credits.saturating_add(groups.saturating_mul(3) + 2) > max {
            return Ok(false);
        }
        let mut op = self.begin(credits, groups)?;
        op.own(ino);
        let r = (|| {
            self.write_tree(&mut op, &mut inode, &nodes, &maps)?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op).map(|_| true),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Start a handle for an extent edit: `want` credits, at most what the
    /// log allows next to the rendering of `groups` groups.
    fn begin_edit(&self, want: u32, groups: u32) -> Result<Op<'_>, FsError> {
        self.begin_edit_as(want, groups, false)
    }

    fn begin_edit_as(&self, want: u32, groups: u32, exclusive: bool) -> Result<Op<'_>, FsError> {
        let max = self.rw.journal().max_transaction();
        let room = max.saturating_sub(groups.saturating_mul(3).saturating_add(2));
        self.begin_as(want.min(room).max(1), groups, exclusive)
    }

    /// Write `data` at byte `off` of regular file `ino` (allocating holes,
    /// converting unwritten extents); returns the tid of the last handle.
    /// Split into handles of at most [`WRITE_CHUNK`] blocks (fewer when a
    /// handle runs out of credits or groups for its tree edits).
    /// A shortage of space fails the call (what was written before it
    /// stays, i_size covering it); [`Filesystem::write_partial`] counts it.
    pub fn write_at(&self, ino: u32, off: u64, data: &[u8]) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("write_at", ino, || {
            match self.write_at_op(ino, off, data)? {
                (_, _, Some(short)) => Err(short),
                (tid, _, None) => Ok(tid),
            }
        })
    }

    /// [`Filesystem::write_at`] as write(2) on ext4 meets a shortage of
    /// space: the bytes written before the space ran out stay (i_size
    /// and i_blocks covering them, every allocated block holding its
    /// data) and are counted, a short write; the error (ENOSPC) only
    /// when nothing could be written. Returns the last tid and the bytes
    /// written.
    pub fn write_partial(&self, ino: u32, off: u64, data: &[u8]) -> Result<(u32, usize), FsError> {
        let _c = self.locks.call(ino);
        self.guard("write_partial", ino, || {
            match self.write_at_op(ino, off, data)? {
                (_, 0, Some(short)) => Err(short),
                (tid, n, _) => Ok((tid, n)),
            }
        })
    }

    /// Write several byte ranges of regular file `ino` (`ranges`: each
    /// `(offset, data)`) and then, if given, set its mtime and ctime to
    /// `times`, in as few handles as the journal allows: ranges that
    /// allocate nothing (overwrites in place, conversions of unwritten
    /// extents) share one handle; a range that allocates ends its handle
    /// (so no handle dirties more groups than one [`Filesystem::write_at`]
    /// chunk). The write-behind buffer's flush. Returns the last tid. A
    /// shortage of space fails the call (the ranges before it stay
    /// written, i_size covering them), as [`Filesystem::write_at`].
    pub fn write_ranges(
        &self,
        ino: u32,
        ranges: &[(u64, &[u8])],
        times: Option<(i64, u32)>,
    ) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("write_ranges", ino, || {
            self.write_ranges_op(ino, ranges, times)
        })
    }

    fn write_ranges_op(
        &self,
        ino: u32,
        ranges: &[(u64, &[u8])],
        times: Option<(i64, u32)>,
    ) -> Result<u32, FsError> {
        let bs = self.block_size();
        for &(off, data) in ranges {
            off.checked_add(data.len() as u64)
                .filter(|&e| e.div_ceil(bs) <= u64::from(u32::MAX))
                .ok_or_else(|| {
                    FsError::InvalidRequest(format!("write past the largest file at {off}"))
                })?;
        }
        let inode = self.inode_any(ino)?;
        flags::may_write_contents(&inode)?;
        if inode.is_regular() && !ranges.iter().all(|r| r.1.is_empty()) {
            self.uninline(ino, true)?;
        }
        let inode = self.inode_any(ino)?;
        data_inode_writable(ino, &inode)?;
        let begin = || {
            let d = root_depth(&self.inode_any(ino)?.i_block);
            let want = 4 * single_extent_credits(d + 1) + 4;
            let mut op = self.begin_edit(want, MAX_GROUPS as u32 + 2)?;
            op.own(ino);
            Ok::<_, FsError>(op)
        };
        let mut op: Option<Op<'_>> = None;
        // Whether the open handle has written anything yet.
        let mut fresh = true;
        let mut tid = self.rw.journal().running_tid();
        for &(off, data) in ranges {
            let end = off + data.len() as u64;
            let mut pos = off;
            while pos < end {
                let mut o = match op.take() {
                    Some(o) => o,
                    None => {
                        fresh = true;
                        begin()?
                    }
                };
                let lb0 = pos / bs;
                let lb1 = (end.div_ceil(bs)).min(lb0 + WRITE_CHUNK);
                let stop = (lb1 * bs).min(end);
                let piece = &data[(pos - off) as usize..(stop - off) as usize];
                let before = self.inode_any(ino)?.blocks_512;
                let fill = Fill::Write {
                    off: pos,
                    data: piece,
                };
                let r = self.fill_in(&mut o, ino, lb0, lb1, &fill, MAX_GROUPS);
                match r {
                    Ok((done, _)) if done > lb0 => {
                        pos = (done * bs).min(stop);
                        fresh = false;
                        let after = self.inode_any(ino)?.blocks_512;
                        // An allocation (or a full handle) ends the handle.
                        if after != before || done < lb1 {
                            tid = self.finish(o)?;
                        } else {
                            op = Some(o);
                        }
                    }
                    // Out of space before this handle changed anything.
                    Ok((_, Some(short))) => {
                        self.finish(o)?;
                        return Err(short);
                    }
                    // No room left in a handle that wrote: a new one.
                    Ok(_) if !fresh => tid = self.finish(o)?,
                    Ok(_) => {
                        let e = FsError::InvalidRequest(format!(
                            "inode {ino}: the journal is too small for one extent edit"
                        ));
                        return Err(self.fail(o, e));
                    }
                    Err(e) => return Err(self.fail(o, e)),
                }
            }
        }
        if let Some(t) = times {
            let mut o = match op.take() {
                Some(o) => o,
                None => begin()?,
            };
            let a = crate::rw::InodeAttrs {
                mtime: Some(t),
                ctime: Some(t),
                ..Default::default()
            };
            if let Err(e) = self.set_inode_attrs_in(&mut o, ino, &a) {
                return Err(self.fail(o, e));
            }
            op = Some(o);
        }
        if let Some(o) = op {
            tid = self.finish(o)?;
        }
        Ok(tid)
    }

    /// The write: (last tid, bytes written, the shortage of space that
    /// stopped it early).
    fn write_at_op(
        &self,
        ino: u32,
        off: u64,
        data: &[u8],
    ) -> Result<(u32, usize, Option<FsError>), FsError> {
        let bs = self.block_size();
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e.div_ceil(bs) <= u64::from(u32::MAX))
            .ok_or_else(|| {
                FsError::InvalidRequest(format!("write past the largest file at {off}"))
            })?;
        flags::may_write_contents(&self.inode_any(ino)?)?;
        if data.is_empty() {
            return Ok((self.rw.journal().running_tid(), 0, None));
        }
        if self.inode_any(ino)?.is_regular() {
            self.uninline(ino, true)?;
        }
        let mut tid = 0;
        let mut pos = off;
        while pos < end {
            let lb0 = pos / bs;
            let lb1 = (end.div_ceil(bs)).min(lb0 + WRITE_CHUNK);
            let stop = (lb1 * bs).min(end);
            let piece = &data[(pos - off) as usize..(stop - off) as usize];
            let r = self.fill_chunk(
                ino,
                lb0,
                lb1,
                Fill::Write {
                    off: pos,
                    data: piece,
                },
            );
            let (t, done) = match r {
                // Out of space at the start of a handle that changed
                // nothing (the journal goes on): `pos - off` bytes are
                // written and the size covers them.
                Err(e @ (FsError::NoSpace { .. } | FsError::SpaceBusy { .. }))
                    if self.rw.journal().aborted().is_none() =>
                {
                    return Ok((tid, (pos - off) as usize, Some(e)));
                }
                r => r?,
            };
            tid = t;
            pos = (done * bs).min(stop);
        }
        Ok((tid, data.len(), None))
    }

    /// One handle of a write or an allocating fallocate over blocks
    /// `[l0, l1)`; returns the tid and the first block not done.
    fn fill_chunk(
        &self,
        ino: u32,
        l0: u64,
        l1: u64,
        mode: Fill<'_>,
    ) -> Result<(u32, u64), FsError> {
        let inode = self.inode_any(ino)?;
        data_inode_writable(ino, &inode)?;
        let groups = match mode {
            Fill::Write { .. } => MAX_GROUPS,
            Fill::Alloc { .. } => FALLOC_GROUPS,
        };
        let d = root_depth(&inode.i_block);
        let want = 4 * single_extent_credits(d + 1) + 4;
        let mut op = self.begin_edit(want, groups as u32 + 2)?;
        op.own(ino);
        match self.fill_in(&mut op, ino, l0, l1, &mode, groups) {
            Ok((done, _)) if done > l0 => Ok((self.finish(op)?, done)),
            // Out of space before this handle changed anything: the
            // error, not an aborted journal (ext4 fails the call with
            // ENOSPC and goes on).
            Ok((_, Some(short))) => {
                self.finish(op)?;
                Err(short)
            }
            Ok(_) => {
                let e = FsError::InvalidRequest(format!(
                    "inode {ino}: the journal is too small for one extent edit"
                ));
                Err(self.fail(op, e))
            }
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// The blocks of one [`Filesystem::fill_chunk`] handle: the first block
    /// not done and, when the space ran out, the shortage (then fewer
    /// blocks are done; none, and nothing changed, when it ran out at
    /// `l0`).
    fn fill_in(
        &self,
        op: &mut Op<'_>,
        ino: u32,
        l0: u64,
        l1: u64,
        mode: &Fill<'_>,
        group_budget: usize,
    ) -> Result<(u64, Option<FsError>), FsError> {
        let bs = self.block_size();
        let mut inode = self.inode_any(ino)?;
        let mut root = inode.i_block;
        let mut delta = 0i64;
        let existing = self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.range(l0, l1))?;
        let write = matches!(mode, Fill::Write { .. });
        let unwritten_new = !write;
        let zero = matches!(mode, Fill::Alloc { zero: true });
        let l = self.descs.layout();
        let cl = self.clusters();
        let ig = self.inode_group(ino);
        let mut groups: BTreeSet<u32> = BTreeSet::new();
        let mut allocated = 0u64;
        let mut goal: Option<u64> = None;
        let mut at = l0;
        let mut short = None;
        let mut ex = existing.iter().peekable();
        // Room for `ops` more tree edits (and the inode block)?
        let room = |op: &Op<'_>, root: &[u8; 60], ops: u32| {
            op.h.credits() > ops * single_extent_credits(root_depth(root) + 1)
        };
        'outer: while at < l1 {
            while ex.peek().is_some_and(|e| e.end() <= at) {
                ex.next();
            }
            let next = ex.peek().copied();
            if let Some(e) = next.filter(|e| e.lblk <= at) {
                let piece = clip(e, at, e.end().min(l1)).unwrap_or(*e);
                let convert = if write {
                    piece.unwritten
                } else {
                    zero && !piece.unwritten
                };
                if convert && !room(op, &root, 3) {
                    break;
                }
                // The conversion's tree edits may split: refused before
                // they start when the blocks for that are gone (ENOSPC,
                // not a split failing in the middle of the handle).
                let avail = self.balloc.available_blocks();
                if convert && avail < self.tree_reserve(&root) {
                    let e = FsError::NoSpace {
                        wanted: self.tree_reserve(&root),
                        available: avail,
                    };
                    if at == l0 {
                        return Ok((l0, Some(e)));
                    }
                    short = Some(e);
                    break;
                }
                if let Fill::Write { off, data } = mode {
                    self.write_piece(op, &piece, !piece.unwritten, *off, data)?;
                }
                if convert {
                    // A written extent of 32768 blocks is two unwritten ones.
                    let max = if piece.unwritten {
                        EXT_INIT_MAX_LEN
                    } else {
                        UNWRITTEN_MAX
                    };
                    self.tree_edit(op, &inode, &mut root, &mut delta, |t| {
                        t.remove(piece.lblk, piece.end())?;
                        let mut done = 0;
                        while done < piece.len {
                            let n = (piece.len - done).min(max);
                            t.insert(&Mapping {
                                lblk: piece.lblk + u64::from(done),
                                pblk: piece.pblk + u64::from(done),
                                len: n,
                                unwritten: !piece.unwritten,
                            })?;
                            done += n;
                        }
                        Ok(())
                    })?;
                }
                goal = Some(piece.pblk + u64::from(piece.len));
                at = piece.end();
                continue;
            }
            // A hole up to the next extent.
            let h1 = next.map_or(l1, |e| e.lblk.min(l1));
            while at < h1 {
                if !room(op, &root, 1) || (at > l0 && groups.len() + 1 >= group_budget) {
                    break 'outer;
                }
                let g = match goal {
                    Some(g) => g,
                    None => self
                        .tree_edit(op, &inode, &mut root, &mut delta, |t| t.goal_for(at))?
                        .unwrap_or_else(|| self.balloc.goal_for_inode(ig, true)),
                };
                // Bigalloc: a logical cluster another extent of this file
                // holds already maps into that extent's cluster (no
                // allocation); new ones take whole clusters, from the
                // first block of `at`'s logical cluster, and stop before
                // a last cluster a later extent holds.
                let mut lbase = at;
                let mut hend = h1;
                if cl.ratio() > 1 {
                    let c0 = cl.c2b(cl.b2c(at));
                    let near = self.tree_edit(op, &inode, &mut root, &mut delta, |t| {
                        t.range(c0, c0 + cl.ratio())
                    })?;
                    let left = near.iter().rfind(|e| e.end() <= at).and_then(as_run);
                    let right = near.iter().find(|e| e.lblk > at).and_then(as_run);
                    let l32 = u32::try_from(at).map_err(|_| {
                        FsError::InvalidRequest(format!("logical block {at} past 2^32"))
                    })?;
                    if let Some((p, n)) = cl.implied(l32, left, right) {
                        let n = (u64::from(n).min(h1 - at)) as u32;
                        let m = Mapping {
                            lblk: at,
                            pblk: p,
                            len: n,
                            unwritten: unwritten_new,
                        };
                        if let Fill::Write { off, data } = mode {
                            self.write_piece(op, &m, false, *off, data)?;
                        }
                        self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.insert(&m))?;
                        groups.insert(l.group_of(p));
                        at += u64::from(n);
                        goal = Some(p + u64::from(n));
                        continue;
                    }
                    let ce = cl.c2b(cl.b2c(h1 - 1));
                    if ce > at && h1 & cl.mask() != 0 {
                        let tail = self.tree_edit(op, &inode, &mut root, &mut delta, |t| {
                            t.range(h1, ce + cl.ratio())
                        })?;
                        if !tail.is_empty() {
                            hend = ce;
                        }
                    }
                    lbase = c0;
                }
                let mut req = AllocRequest::new(hend - lbase, ig);
                req.goal = Some(g);
                if unwritten_new {
                    req.max_extent = UNWRITTEN_MAX;
                }
                // The data leaves the blocks the tree edits mapping it may
                // take (a split at every level and a new root, twice):
                // out of space is then an ENOSPC before the edit, never a
                // failed split in the middle of the handle (which aborts
                // the journal).
                req.keep_free = self.tree_reserve(&root);
                let left = group_budget.saturating_sub(groups.len()).max(1);
                let pieces = match self.alloc_bounded(&req, left, &groups) {
                    Ok(p) => p,
                    Err(e @ (FsError::NoSpace { .. } | FsError::SpaceBusy { .. })) => {
                        // Short of space: what there is (the next handle
                        // meets the shortage), or the error while nothing
                        // has changed.
                        let room = self.balloc.available_blocks().saturating_sub(req.keep_free)
                            & !cl.mask();
                        let smaller = (room > 0 && room < req.len).then(|| {
                            let mut r = req;
                            r.len = room;
                            self.alloc_bounded(&r, left, &groups)
                        });
                        match smaller {
                            Some(Ok(p)) => p,
                            _ if at > l0 => {
                                short = Some(e);
                                break 'outer;
                            }
                            _ => return Ok((l0, Some(e))),
                        }
                    }
                    Err(e) => return Err(e),
                };
                for (k, &(s, n)) in pieces.iter().enumerate() {
                    if k > 0 && !room(op, &root, 1) {
                        self.balloc.give_back(self.rw.blocks(), &pieces[k..])?;
                        break 'outer;
                    }
                    groups.extend(l.group_of(s)..=l.group_of(s + u64::from(n) - 1));
                    // Bigalloc: the piece is whole clusters from logical
                    // `lbase` (a cluster boundary); the blocks mapped are
                    // those from `at` to the hole's end, at the same
                    // offsets (the rest of a first or last cluster is
                    // held unmapped). Without bigalloc `lbase` is `at`.
                    let skip = at - lbase;
                    let len = (u64::from(n) - skip).min(hend - at) as u32;
                    let m = Mapping {
                        lblk: at,
                        pblk: s + skip,
                        len,
                        unwritten: unwritten_new,
                    };
                    if let Fill::Write { off, data } = mode {
                        self.write_piece(op, &m, false, *off, data)?;
                    }
                    self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.insert(&m))?;
                    allocated += u64::from(n);
                    at += u64::from(len);
                    lbase = at;
                    goal = Some(s + u64::from(n));
                }
            }
        }
        let per512 = bs / 512;
        // Tree blocks take a cluster each (the ratio is 1 without bigalloc).
        let delta = delta * cl.ratio() as i64;
        let blocks =
            (inode.blocks_512 as i64 + (allocated as i64 + delta) * per512 as i64).max(0) as u64;
        let size = match mode {
            Fill::Write { off, data } => inode.size.max((off + data.len() as u64).min(at * bs)),
            Fill::Alloc { .. } => inode.size,
        };
        let t = now();
        self.edit_inode(&mut inode, |n| {
            n.i_block_bytes_mut().copy_from_slice(&root);
            n.set_size(size);
            n.set_blocks_512(blocks);
            let (s, x) = encode_time(t);
            n.i_ctime.set(s);
            if inode_has_extra(n) {
                n.i_ctime_extra.set(x);
            }
            if write || zero {
                n.i_mtime.set(s);
                if inode_has_extra(n) {
                    n.i_mtime_extra.set(x);
                }
            }
        })?;
        self.store_inode(op, &inode)?;
        Ok((at, short))
    }

    /// Write the part of `data` (at byte `off` of the file) that falls in
    /// `m`'s blocks, as ordered data; partial edge blocks keep their old
    /// bytes when `old_written`, else read as zeros around the data.
    fn write_piece(
        &self,
        op: &mut Op<'_>,
        m: &Mapping,
        old_written: bool,
        off: u64,
        data: &[u8],
    ) -> Result<(), FsError> {
        let bs = self.block_size();
        let first = m.lblk * bs;
        let last = m.end() * bs;
        let dend = off + data.len() as u64;
        let s = off.max(first);
        let e = dend.min(last);
        if s >= e {
            return Ok(());
        }
        let mut buf = vec![0u8; (last - first) as usize];
        if old_written {
            for (k, lb) in [(0usize, m.lblk), (buf.len() - bs as usize, m.end() - 1)] {
                let bstart = lb * bs;
                if bstart < off || bstart + bs > dend {
                    let p = m.pblk + (lb - m.lblk);
                    self.rw
                        .blocks()
                        .read_block(p, &mut buf[k..k + bs as usize])?;
                }
            }
        }
        buf[(s - first) as usize..(e - first) as usize]
            .copy_from_slice(&data[(s - off) as usize..(e - off) as usize]);
        op.h.write_data(m.pblk, &buf)
    }

    /// Allocate, retrying smaller while the allocation would touch more
    /// than `groups` groups outside `have`.
    fn alloc_bounded(
        &self,
        req: &AllocRequest,
        groups: usize,
        have: &BTreeSet<u32>,
    ) -> Result<Vec<(u64, u32)>, FsError> {
        let rd = self.rw.blocks();
        let mut r = *req;
        loop {
            // Whole clusters with bigalloc (`alloc` refuses there).
            let a = if self.clusters().ratio() > 1 {
                self.balloc.alloc_clusters(rd, &r)?
            } else {
                self.balloc.alloc(rd, &r)?
            };
            let new = a.dirty.iter().filter(|g| !have.contains(g)).count();
            if new <= groups || r.len == 1 {
                return Ok(a.extents);
            }
            self.balloc.give_back(rd, &a.extents)?;
            r.len = r.len.div_ceil(2);
        }
    }

    /// Set the size of regular file `ino`: blocks past the new end are
    /// freed (in several handles for large files, from the end, each
    /// leaving a consistent file), the tail of a partial last block is
    /// zeroed; growing is sparse. Returns the last tid.
    ///
    /// A shrink that takes more than one handle is protected as the
    /// kernel's `ext4_setattr` + `ext4_truncate` protect it: the first
    /// handle puts the inode on the orphan list (or in the orphan file)
    /// and sets `i_size` to the new size, the last one takes it off, so
    /// a crash in between leaves an orphan that the next open (ours,
    /// the kernel's, e2fsck's) truncates to the new size: the file is
    /// seen at its old size or its new one, never in between. An inode
    /// without links is on the orphan list already (unlinked while open,
    /// or being deleted) and is left there.
    pub fn truncate(&self, ino: u32, size: u64) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("truncate", ino, || self.truncate_op(ino, size))
    }

    fn truncate_op(&self, ino: u32, size: u64) -> Result<u32, FsError> {
        let inode = self.inode_any(ino)?;
        flags::may_setattr(&inode, true)?;
        if !inode.is_dir() {
            flags::may_write_contents(&inode)?;
        }
        self.truncate_with(ino, size, true)
    }

    /// [`Filesystem::truncate`]; `protect`: put a linked inode on the
    /// orphan list for a truncate in several handles (false when the
    /// caller has it there already: orphan processing).
    fn truncate_with(&self, ino: u32, size: u64, protect: bool) -> Result<u32, FsError> {
        let bs = self.block_size();
        let inode = self.inode_any(ino)?;
        if inode.is_dir() {
            return Err(FsError::IsADirectory);
        }
        if inode.is_regular() && inode.has_inline_data() {
            // Out of the inode first (to nothing for a truncate to 0).
            let tid = self.uninline(ino, size != 0)?;
            if size == 0 {
                return Ok(tid.unwrap_or_else(|| self.rw.journal().running_tid()));
            }
            return self.truncate_with(ino, size, protect);
        }
        if !inode.has_extents() && inode.blocks_512 == 0 {
            // Nothing mapped (devices, fifos, fast symlinks, empty files).
            return self.set_size_only(ino, size);
        }
        if !inode.has_extents() {
            return Err(FsError::Unsupported(format!(
                "writing block-mapped inode {ino} (no extents)"
            )));
        }
        let protect = protect && inode.links > 0;
        self.unmap(ino, size.div_ceil(bs), LBLK_END, Some(size), protect)
    }

    /// Unmap blocks `[a, b)` of `ino` in handles from the end, each a
    /// consistent file: a truncate to `size` (set by the last handle, the
    /// size follows the cut in between; a partial last block's tail is
    /// zeroed) or, with `None`, a punched hole. With `orphan` (a
    /// truncate), a cut that takes several handles puts the inode on the
    /// orphan list in the first with `size` already set, and takes it
    /// off in the last (see [`Filesystem::truncate`]). Returns the last
    /// tid.
    fn unmap(
        &self,
        ino: u32,
        a: u64,
        b: u64,
        size: Option<u64>,
        orphan: bool,
    ) -> Result<u32, FsError> {
        let orphan = orphan && size.is_some();
        // Whether this cut has put the inode on the orphan list.
        let mut listed = false;
        loop {
            let d = root_depth(&self.inode_any(ino)?.i_block);
            let groups = MAX_GROUPS * 4;
            // The orphan file's block or the previous head, and slack.
            let extra = if orphan { 4 } else { 0 };
            let want = 2 * REMOVE_BLOCKS + 2 * single_extent_credits(d + 1) + 4 + extra;
            // A step that may take the inode off the old orphan list (it
            // may be the last) runs alone: see `orphan_del`.
            let walk = listed && self.on_orphan_list(ino);
            let mut op = self.begin_edit_as(want, groups as u32 + 2, walk)?;
            op.own(ino);
            let step = Cut {
                a,
                b,
                size,
                group_budget: groups,
                orphan: match (orphan, listed) {
                    (false, _) => CutOrphan::No,
                    (true, false) => CutOrphan::First,
                    (true, true) => CutOrphan::Listed,
                },
            };
            match self.unmap_in(&mut op, ino, &step) {
                Ok((last, now_listed)) => {
                    let tid = self.finish(op)?;
                    listed = now_listed;
                    if last {
                        return Ok(tid);
                    }
                }
                // Refused before anything changed: end the empty handle.
                Err(e @ FsError::NoSpace { .. })
                    if !op.h.changed() && !self.balloc.has_dirty_mine() =>
                {
                    drop(op);
                    return Err(e);
                }
                Err(e) => return Err(self.fail(op, e)),
            }
        }
    }

    /// One step of [`Filesystem::unmap`]: (was it the last, is the inode
    /// on the orphan list for this cut now).
    fn unmap_in(&self, op: &mut Op<'_>, ino: u32, step: &Cut) -> Result<(bool, bool), FsError> {
        let Cut {
            a,
            b,
            size,
            group_budget,
            ..
        } = *step;
        let bs = self.block_size();
        let rd = self.rw.blocks();
        let mut inode = self.inode_any(ino)?;
        let mut root = inode.i_block;
        let mut delta = 0i64;
        // Plan: from the end, as many extents as the credits (two per
        // tree block read: the block and a sibling it may merge with)
        // and the groups allow.
        let d = root_depth(&root);
        let spare =
            op.h.credits()
                .saturating_sub(2 * single_extent_credits(d + 1) + 2);
        let max_blocks = (spare / 2).max(1) as usize;
        let (plan, complete) = self.tree_edit(op, &inode, &mut root, &mut delta, |t| {
            t.range_back(a, b, max_blocks)
        })?;
        let l = self.descs.layout();
        let mut groups = BTreeSet::new();
        let mut s = if complete {
            a
        } else {
            plan.last().map_or(a, |(m, _)| m.lblk.max(a))
        };
        for (m, _) in &plan {
            let Some(c) = clip(m, a, b) else { continue };
            let mut next = groups.clone();
            next.extend(l.group_of(c.pblk)..=l.group_of(c.pblk + u64::from(c.len) - 1));
            if next.len() > group_budget && !groups.is_empty() {
                s = c.end();
                break;
            }
            groups = next;
        }
        // A punch inside an extent splits it (one more entry, maybe a
        // split node): refused before any change when the blocks for that
        // are gone (ENOSPC; the kernel takes them from its reserve).
        let avail = self.balloc.available_blocks();
        if avail < self.tree_reserve(&root) && plan.iter().any(|(m, _)| m.lblk < s && m.end() > b) {
            return Err(FsError::NoSpace {
                wanted: self.tree_reserve(&root),
                available: avail,
            });
        }
        let removed = self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.remove(s, b))?;
        // Bigalloc: the extents that stay on either side of the cut, in
        // the cut's first and last logical clusters (only those can share
        // a cluster with what was removed).
        let cl = self.clusters();
        let (left, right) = if cl.ratio() > 1 && !removed.is_empty() {
            let c0 = cl.c2b(cl.b2c(s));
            let left = if c0 < s {
                let v = self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.range(c0, s))?;
                v.last().copied()
            } else {
                None
            };
            let ce = cl.c2b(cl.b2c(b.saturating_sub(1)) + 1);
            let right = if b < ce {
                let v = self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.range(b, ce))?;
                v.first().copied()
            } else {
                None
            };
            (left, right)
        } else {
            (None, None)
        };
        let released = self.free_data(op, &removed, left.as_ref(), right.as_ref())?;
        let last = s <= a;
        // The orphan list around a cut in several handles: on it from the
        // first (with the new size: orphan processing truncates to
        // i_size), off it in the last.
        let listed = match step.orphan {
            CutOrphan::No => false,
            CutOrphan::First if last => false,
            CutOrphan::First => {
                self.orphan_add(op, &mut inode)?;
                true
            }
            CutOrphan::Listed if last => {
                self.orphan_del(op, &mut inode)?;
                false
            }
            CutOrphan::Listed => true,
        };
        let new_size = match size {
            Some(sz) if last || listed => sz,
            Some(_) => inode.size.min(s * bs),
            None => inode.size,
        };
        // Zero the tail of a partial last block (later growth reads zeros).
        if let Some(sz) = size.filter(|&sz| last && !sz.is_multiple_of(bs) && sz < inode.size) {
            let lb = sz / bs;
            let m = self.tree_edit(op, &inode, &mut root, &mut delta, |t| t.lookup(lb))?;
            if let Some(m) = m.filter(|m| !m.unwritten) {
                let p = m.pblk + (lb - m.lblk);
                let mut buf = vec![0u8; bs as usize];
                rd.read_block(p, &mut buf)?;
                buf[(sz % bs) as usize..].fill(0);
                op.h.write_data(p, &buf)?;
            }
        }
        let per512 = (bs / 512) as i64;
        let delta = delta * cl.ratio() as i64;
        let blocks =
            (inode.blocks_512 as i64 - released as i64 * per512 + delta * per512).max(0) as u64;
        let t = now();
        self.edit_inode(&mut inode, |n| {
            n.i_block_bytes_mut().copy_from_slice(&root);
            n.set_size(new_size);
            n.set_blocks_512(blocks);
            set_node_times(n, &Times::default(), t);
            let (s, x) = encode_time(t);
            n.i_mtime.set(s);
            if inode_has_extra(n) {
                n.i_mtime_extra.set(x);
            }
        })?;
        self.store_inode(op, &inode)?;
        Ok((last, listed))
    }

    fn set_size_only(&self, ino: u32, size: u64) -> Result<u32, FsError> {
        let mut op = self.begin(1, 0)?;
        let mut inode = self.inode_any(ino)?;
        let r = (|| {
            let t = now();
            self.edit_inode(&mut inode, |n| {
                n.set_size(size);
                set_node_times(n, &Times::default(), t);
            })?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// `fallocate(2)` on regular file `ino` over `[off, off+len)`:
    /// default and [`Falloc::keep_size`] allocate the holes as unwritten
    /// extents (reading as zeros); [`Falloc::punch_hole`] frees the whole
    /// blocks of the range and zeroes the partial ones (size kept);
    /// [`Falloc::zero_range`] turns the whole blocks into unwritten extents
    /// (allocating holes) and zeroes the partial ones. Returns the last
    /// tid. Large ranges take several handles. An orphan (unlinked while
    /// open, link count 0) is taken too, as ext4 takes it through the
    /// descriptor.
    pub fn fallocate(&self, ino: u32, off: u64, len: u64, mode: Falloc) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("fallocate", ino, || self.fallocate_op(ino, off, len, mode))
    }

    fn fallocate_op(&self, ino: u32, off: u64, len: u64, mode: Falloc) -> Result<u32, FsError> {
        let bs = self.block_size();
        let end = off
            .checked_add(len)
            .filter(|&e| len > 0 && e.div_ceil(bs) <= u64::from(u32::MAX))
            .ok_or_else(|| FsError::InvalidRequest(format!("fallocate range {off}+{len}")))?;
        if mode.punch_hole && !mode.keep_size {
            return Err(FsError::InvalidRequest(
                "punching a hole needs keep_size (FALLOC_FL_KEEP_SIZE)".into(),
            ));
        }
        if mode.punch_hole && mode.zero_range {
            return Err(FsError::InvalidRequest(
                "punch_hole and zero_range together".into(),
            ));
        }
        let inode = self.inode_any(ino)?;
        if inode.is_regular() {
            flags::may_write_contents(&inode)?;
        }
        // vfs_fallocate: nothing on an immutable file, only plain
        // allocation on an append-only one.
        if mode.punch_hole || mode.zero_range {
            flags::may_change(&inode)?;
        } else {
            flags::may_write_data(&inode)?;
        }
        if !inode.is_regular() {
            return Err(if inode.is_dir() {
                FsError::IsADirectory
            } else {
                FsError::InvalidRequest(format!("inode {ino} is not a regular file"))
            });
        }
        self.uninline(ino, true)?;
        // Whole blocks of the range (punch/zero), all touched ones (alloc).
        let (w0, w1) = if mode.punch_hole || mode.zero_range {
            (off.div_ceil(bs), end / bs)
        } else {
            (off / bs, end.div_ceil(bs))
        };
        let mut tid = self.rw.journal().running_tid();
        // Partial edge blocks first (zeroed in place).
        if mode.punch_hole || mode.zero_range {
            let mut edges = Vec::new();
            if !off.is_multiple_of(bs) {
                edges.push((off, end.min((off / bs + 1) * bs)));
            }
            if !end.is_multiple_of(bs) && (off.is_multiple_of(bs) || end / bs != off / bs) {
                edges.push(((end / bs) * bs, end));
            }
            for (a, b) in edges {
                tid = self.zero_in_block(ino, a, b)?;
            }
        }
        if mode.punch_hole {
            if w0 < w1 {
                tid = self.unmap(ino, w0, w1, None, false)?;
            }
        } else {
            let mut l = w0;
            while l < w1 {
                let e = (l + FALLOC_CHUNK).min(w1);
                let (t, done) = self.fill_chunk(
                    ino,
                    l,
                    e,
                    Fill::Alloc {
                        zero: mode.zero_range,
                    },
                )?;
                tid = t;
                l = done;
            }
        }
        if !mode.keep_size && self.inode_any(ino)?.size < end {
            tid = self.set_size_only(ino, end)?;
        }
        Ok(tid)
    }

    /// Zero bytes `[a, b)` (inside one block) of a file where written.
    fn zero_in_block(&self, ino: u32, a: u64, b: u64) -> Result<u32, FsError> {
        let bs = self.block_size();
        let mut op = self.begin(0, 0)?;
        op.own(ino);
        let inode = self.inode_any(ino)?;
        let lb = a / bs;
        let m = self.read(|fs| fs.extent_at(&inode, lb))?;
        let Some(m) = m.filter(|m| !m.unwritten) else {
            return Ok(op.h.tid());
        };
        let p = m.pblk + (lb - m.lblk);
        let r = (|| {
            let mut buf = vec![0u8; bs as usize];
            self.rw.blocks().read_block(p, &mut buf)?;
            buf[(a - lb * bs) as usize..(b - lb * bs) as usize].fill(0);
            op.h.write_data(p, &buf)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// Read up to `buf.len()` bytes at `off` of inode `ino`.
    pub fn read_at(&self, ino: u32, off: u64, buf: &mut [u8]) -> Result<usize, FsError> {
        self.guard("read_at", ino, || self.read_at_op(ino, off, buf))
    }

    fn read_at_op(&self, ino: u32, off: u64, buf: &mut [u8]) -> Result<usize, FsError> {
        let _r = self.locks.read(ino);
        let inode = self.inode_any(ino)?;
        self.read(|fs| {
            let c = fs.content(&inode)?;
            fs.read_at(&inode, &c, off, buf)
        })
    }
}

/// What one [`Filesystem::fill_chunk`] handle does over its blocks.
enum Fill<'d> {
    /// Write `data` (at byte `off` of the file): holes allocated, unwritten
    /// blocks converted.
    Write { off: u64, data: &'d [u8] },
    /// Allocate holes as unwritten extents; `zero` (ZERO_RANGE) also turns
    /// written blocks unwritten.
    Alloc { zero: bool },
}

/// Depth of the tree whose root is `i_block`.
/// One handle's part of [`Filesystem::unmap`].
#[derive(Clone, Copy, Debug)]
struct Cut {
    a: u64,
    b: u64,
    size: Option<u64>,
    group_budget: usize,
    orphan: CutOrphan,
}

/// Where a multi-handle truncate stands with the orphan list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutOrphan {
    /// Not protected (a punch, or the inode is an orphan already).
    No,
    /// Protected, not listed yet: this handle lists it unless it is the
    /// only one.
    First,
    /// Listed by an earlier handle: the last one takes it off.
    Listed,
}

fn root_depth(i_block: &[u8; 60]) -> u16 {
    u16::from_le_bytes([i_block[6], i_block[7]])
}

/// Blocks kept free for the tree edits of a handle changing the tree
/// whose root is `i_block`: a split at every level and a new root, for
/// two inserts (a conversion's); data allocations leave them.
fn tree_reserve(i_block: &[u8; 60]) -> u64 {
    2 * (u64::from(root_depth(i_block)) + 2)
}

impl Filesystem {
    /// [`tree_reserve`] for this operation, plus a deepest tree's (depth
    /// 5) for every other operation running now: each of them may take
    /// its reserve after this one allocated (handles run side by side).
    /// In blocks; with bigalloc every tree block takes a cluster.
    fn tree_reserve(&self, i_block: &[u8; 60]) -> u64 {
        let others = u64::from(self.active.load(Ordering::Relaxed).saturating_sub(1));
        (tree_reserve(i_block) + others * 2 * (5 + 2)) * self.clusters().ratio()
    }
}

/// [`TreeIo`] on an operation's handle and the block allocator.
struct TreeOp<'a, 'b> {
    fs: &'a Filesystem,
    op: &'a mut Op<'b>,
    ino: u32,
    /// The inode's group (the allocator's fallback goal).
    group: u32,
}

impl TreeIo for TreeOp<'_, '_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.fs.read(|f| f.meta_block(blk, "extent tree"))
    }

    fn write(&mut self, blk: u64, data: &[u8], new: bool) -> Result<(), FsError> {
        if new {
            self.op.h.modify_new(blk, |b| b.copy_from_slice(data))
        } else {
            self.op.h.modify(blk, |b| b.copy_from_slice(data))
        }
    }

    fn alloc(&mut self, goal: u64) -> Result<u64, FsError> {
        let mut req = AllocRequest::new(1, self.group);
        req.goal = (goal != 0).then_some(goal);
        self.fs.alloc_meta_block(&req)
    }

    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        self.op.tree_memo.borrow_mut().remove(&(self.ino, blk));
        self.fs.free_meta_block(self.op, blk)
    }

    fn checked(&self, blk: u64) -> Option<Vec<u8>> {
        self.op.tree_memo.borrow().get(&(self.ino, blk)).cloned()
    }

    fn note_checked(&self, blk: u64, data: &[u8]) {
        let mut m = self.op.tree_memo.borrow_mut();
        match m.get_mut(&(self.ino, blk)) {
            Some(v) => v.copy_from_slice(data),
            None => {
                m.insert((self.ino, blk), data.to_vec());
            }
        }
    }
}

/// [`XattrBlocks`] on an operation's handle and the block allocator.
struct XattrIo<'a, 'b> {
    fs: &'a Filesystem,
    op: &'a mut Op<'b>,
    /// `xattr_blocks`: a shared block's refcount is read and written back
    /// by one edit at a time.
    _x: MutexGuard<'a, ()>,
}

impl Filesystem {
    fn xattr_io<'a, 'b>(&'a self, op: &'a mut Op<'b>) -> XattrIo<'a, 'b> {
        XattrIo {
            fs: self,
            op,
            _x: lock(&self.xattr_blocks),
        }
    }
}

impl XattrBlocks for XattrIo<'_, '_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.fs.read(|f| f.meta_block(blk, "xattr block"))
    }

    fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
        self.op.h.modify(blk, |b| b.copy_from_slice(data))
    }

    fn alloc(&mut self, goal: u64) -> Result<Option<u64>, FsError> {
        let l = self.fs.descs.layout();
        let mut req = AllocRequest::new(1, l.group_of(goal));
        req.goal = Some(goal);
        // A cluster of its own with bigalloc.
        match self.fs.alloc_meta_block(&req) {
            Ok(b) => Ok(Some(b)),
            Err(FsError::NoSpace { .. } | FsError::SpaceBusy { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        self.fs.free_meta_block(self.op, blk)
    }

    fn ea_inode_create(
        &mut self,
        owner: u32,
        uid: u32,
        gid: u32,
        value: &[u8],
        hash: u32,
    ) -> Result<Option<u32>, FsError> {
        self.fs
            .ea_inode_create_in(self.op, owner, uid, gid, value, hash)
    }

    fn ea_inode_ref(&mut self, inum: u32, delta: i64) -> Result<(), FsError> {
        self.fs.ea_inode_ref_in(self.op, inum, delta)
    }
}

fn xattr_fs(e: XattrError) -> FsError {
    match e {
        XattrError::Fs(e) => e,
        other => FsError::InvalidRequest(other.to_string()),
    }
}

fn inode_has_extra(n: &Inode) -> bool {
    n.i_extra_isize.get() >= 16
}

fn set_node_times(n: &mut Inode, t: &Times, ctime: Timestamp) {
    let extra = inode_has_extra(n);
    let (s, x) = encode_time_in(ctime, extra);
    n.i_ctime.set(s);
    if extra {
        n.i_ctime_extra.set(x);
    }
    if let Some(a) = t.atime {
        let (s, x) = encode_time_in(a, extra);
        n.i_atime.set(s);
        if extra {
            n.i_atime_extra.set(x);
        }
    }
    if let Some(m) = t.mtime {
        let (s, x) = encode_time_in(m, extra);
        n.i_mtime.set(s);
        if extra {
            n.i_mtime_extra.set(x);
        }
    }
    if let Some(c) = t.crtime
        && n.i_extra_isize.get() >= 24
    {
        let (s, x) = encode_time(c);
        n.i_crtime.set(s);
        n.i_crtime_extra.set(x);
    }
}

/// The part of `m` inside `[a, b)`.
fn clip(m: &Mapping, a: u64, b: u64) -> Option<Mapping> {
    let s = m.lblk.max(a);
    let e = m.end().min(b);
    (s < e).then(|| Mapping {
        lblk: s,
        pblk: m.pblk + (s - m.lblk),
        len: (e - s) as u32,
        unwritten: m.unwritten,
    })
}

/// Split `maps` into what lies outside `[a, b)` and what lies inside.
#[cfg(test)]
pub(crate) fn cut(maps: &[Mapping], a: u64, b: u64) -> (Vec<Mapping>, Vec<Mapping>) {
    let mut out = Vec::with_capacity(maps.len() + 1);
    let mut inside = Vec::new();
    for m in maps {
        if m.end() <= a || m.lblk >= b {
            out.push(*m);
            continue;
        }
        if let Some(l) = clip(m, 0, a) {
            out.push(l);
        }
        if let Some(i) = clip(m, a, b) {
            inside.push(i);
        }
        if let Some(r) = clip(m, b, u64::MAX) {
            out.push(r);
        }
    }
    (out, inside)
}

/// Sort and merge neighbours (contiguous logically and physically, same
/// state, within the longest extent of that state).
pub(crate) fn normalize(mut v: Vec<Mapping>) -> Vec<Mapping> {
    v.sort_by_key(|m| m.lblk);
    let mut out: Vec<Mapping> = Vec::with_capacity(v.len());
    for m in v {
        if let Some(last) = out.last_mut() {
            let max = if m.unwritten {
                UNWRITTEN_MAX
            } else {
                EXT_INIT_MAX_LEN
            };
            if last.end() == m.lblk
                && last.pblk + u64::from(last.len) == m.pblk
                && last.unwritten == m.unwritten
                && last.len + m.len <= max
            {
                last.len += m.len;
                continue;
            }
        }
        out.push(m);
    }
    out
}

mod ea_inode;
mod errors;
pub mod flags;
mod inline;
mod lazy;
mod locks;
mod ns;
mod quota;
pub use errors::OpError;
pub use locks::InodeLock;
use locks::{ContentLock, InodeLocks};
pub use ns::*;

#[cfg(test)]
mod tests;

/// A write of file data needs a regular file with an extent tree (the
/// engine does not write block-mapped files).
fn data_inode_writable(ino: u32, inode: &InodeInfo) -> Result<(), FsError> {
    if !inode.is_regular() {
        return Err(if inode.is_dir() {
            FsError::IsADirectory
        } else {
            FsError::InvalidRequest(format!("inode {ino} is not a regular file"))
        });
    }
    if !inode.has_extents() {
        return Err(FsError::Unsupported(format!(
            "writing block-mapped inode {ino} (no extents)"
        )));
    }
    Ok(())
}

/// An extent as the cluster rules see it (`None` past 32-bit logical
/// blocks or lengths, which no extent has).
pub(crate) fn as_run(m: &Mapping) -> Option<Run> {
    Some(Run {
        lblk: u32::try_from(m.lblk).ok()?,
        pblk: m.pblk,
        len: m.len,
    })
}
