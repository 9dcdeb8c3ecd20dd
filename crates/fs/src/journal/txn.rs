//! Transactions: the running compound transaction, handles that join it,
//! and the [`JournalWriter`] that owns the block cache and the log.
//!
//! One transaction runs at a time (jbd2's model). [`JournalWriter::start`]
//! returns a [`Handle`] that reserves block credits in it; through the
//! handle a caller changes block images ([`Handle::modify`]), writes
//! ordered data ([`Handle::write_data`]), records freed extents
//! ([`Handle::free_extent`]) and revokes ([`Handle::revoke`]). Every
//! change of one handle lands in one transaction, so an API call made of
//! one handle is atomic. A commit ([`JournalWriter::commit`], see
//! `commit.rs`) waits for the open handles, freezes the transaction and
//! opens the next one at once.
//!
//! Rules for callers:
//! - a thread holds at most one handle at a time (starting a second one
//!   can wait for a commit that waits for the first: a deadlock);
//! - the closure given to [`Handle::modify`] must not call back into the
//!   journal or the cache (read what it needs first: two closures reading
//!   each other's blocks would deadlock);
//! - data blocks are written with [`Handle::write_data`] (or written by
//!   the caller and declared with [`Handle::ordered`]) only into blocks
//!   allocated in this transaction or already owned by the file; freed
//!   blocks are reused only after the commit that freed them (the
//!   [`FreedHook`] tells when).
//!
//! Commit triggers: explicit ([`JournalWriter::commit`],
//! [`JournalWriter::commit_tid`] for fsync), a handle that would push the
//! running transaction past its limit (1/4 of the log by default), and the
//! `commit=` interval through [`JournalWriter::tick`], which the caller
//! drives (the mount calls it from its own timer thread; the image tools
//! commit explicitly). There is no background thread in the library.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ext4kit_device::Device;
use ext4kit_format::checksum::jbd2 as jcsum;
use ext4kit_format::jbd2::*;
use zerocopy::{FromZeros, IntoBytes};

use super::log::{LogCodec, LogRing};
use super::recover::Journal;
use crate::cache::{BlockCache, DEFAULT_CLEAN_LIMIT};
use crate::{BlockRead, FsError};

/// `-EIO` as jbd2 stores it in `s_errno`.
pub const JBD2_EIO: u32 = (-5i32) as u32;

/// The largest transaction (in blocks) of a writer without a journal
/// when [`JournalOptions::max_transaction`] does not say: what a 128 MiB
/// journal of 4 KiB blocks allows (a quarter of it).
pub const NO_JOURNAL_MAX_TRANSACTION: u32 = 8192;

/// Called after each durable commit with its tid and the extents
/// (start, length in blocks) its handles freed: they may now be reused or
/// discarded.
pub type FreedHook = Box<dyn Fn(u32, &[(u64, u64)]) + Send + Sync>;

/// Which journal checksum the writer uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JournalCsum {
    /// What the kernel's ext4 sets at mount: csum v3 with metadata_csum,
    /// else no journal checksum at all (v1/v2 flags cleared).
    #[default]
    Kernel,
    /// Keep whatever the journal superblock says (v1, v2, v3 or none);
    /// for testing the other log forms.
    Keep,
}

/// Tunables of the writer.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// The `commit=` interval [`JournalWriter::tick`] commits after.
    pub commit_interval: Duration,
    /// Largest transaction in logged blocks (default: 1/4 of the log, the
    /// kernel's `j_max_transaction_buffers`).
    pub max_transaction: Option<u32>,
    /// Clean blocks the cache keeps.
    pub cache_blocks: usize,
    pub csum: JournalCsum,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions {
            commit_interval: Duration::from_secs(5),
            max_transaction: None,
            cache_blocks: DEFAULT_CLEAN_LIMIT,
            csum: JournalCsum::Kernel,
        }
    }
}

/// The running (or committing) transaction's bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct Transaction {
    pub(crate) tid: u32,
    /// Blocks with a running copy in this transaction.
    pub(crate) buffers: BTreeSet<u64>,
    /// Freed metadata blocks to revoke (never also in `buffers`).
    pub(crate) revokes: BTreeSet<u64>,
    /// Ordered data ranges (start, len) written before the commit.
    pub(crate) ordered: Vec<(u64, u64)>,
    /// Freed extents for the hook.
    pub(crate) freed: Vec<(u64, u64)>,
    /// Open handles.
    pub(crate) updates: u32,
    /// Credits reserved by open handles and not used yet.
    pub(crate) outstanding: u32,
    /// When the first handle joined.
    pub(crate) started: Option<Instant>,
}

impl Transaction {
    fn new(tid: u32) -> Self {
        Transaction {
            tid,
            ..Default::default()
        }
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.buffers.is_empty() && self.revokes.is_empty() && self.freed.is_empty()
    }
}

pub(crate) struct TxnState {
    pub(crate) running: Transaction,
    /// The running transaction is being frozen: new handles wait.
    pub(crate) locked: bool,
    pub(crate) aborted: Option<String>,
    /// Newest durable tid (`running.tid - 1` when nothing is committing).
    pub(crate) last_committed: u32,
    /// Threads waiting on `JournalWriter::cond` (see [`TxnState::wait`]):
    /// a notify with nobody waiting is skipped, since std's `notify_all`
    /// is a futex system call even then and every handle's end would
    /// make one.
    pub(crate) waiters: u32,
}

impl TxnState {
    /// Wait on `cond` (which must be the journal's `cond`, paired with
    /// this state's mutex), counted in `waiters`.
    pub(crate) fn wait<'a>(
        mut st: MutexGuard<'a, TxnState>,
        cond: &Condvar,
    ) -> MutexGuard<'a, TxnState> {
        st.waiters += 1;
        let mut st = cond.wait(st).unwrap_or_else(PoisonError::into_inner);
        st.waiters -= 1;
        st
    }

    /// Wake the waiters of `cond`, if there are any. Called with the
    /// state locked, so no waiter can be between its count and its wait.
    pub(crate) fn notify(&self, cond: &Condvar) {
        if self.waiters > 0 {
            cond.notify_all();
        }
    }
}

/// The log's state, behind the commit lock (commits and checkpoints are
/// serialized by it).
pub(crate) struct LogState {
    pub(crate) ring: LogRing,
    pub(crate) jsb: JournalSuperblock,
    /// Physical block of the journal superblock.
    pub(crate) jsb_block: u64,
    /// The jsb on disk says `s_start = 0`: the next commit must write it
    /// (with `s_start`/`s_sequence` of that transaction) before its
    /// commit block.
    pub(crate) jsb_empty: bool,
    /// The jsb in memory differs from the disk's (features).
    pub(crate) jsb_dirty: bool,
    pub(crate) codec: LogCodec,
}

/// Counters, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub commits: u64,
    pub checkpoints: u64,
    pub log_blocks_written: u64,
    pub home_blocks_written: u64,
}

/// See the module documentation.
pub struct JournalWriter {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) cache: BlockCache,
    /// `None`: a filesystem without a journal (`^has_journal`): a commit
    /// writes its blocks home in place (see `commit.rs`).
    pub(crate) journal: Option<Journal>,
    pub(crate) max_txn: u32,
    pub(crate) revokes_per_block: usize,
    pub(crate) opts: JournalOptions,
    pub(crate) state: Mutex<TxnState>,
    pub(crate) cond: Condvar,
    pub(crate) log: Mutex<LogState>,
    pub(crate) hooks: Mutex<Vec<FreedHook>>,
    pub(crate) stats: Mutex<JournalStats>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // State changes are made so that a panicking thread leaves them
    // consistent; the abort flag covers failed I/O.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl JournalWriter {
    /// Start writing an empty journal (`s_start == 0`: replay first).
    /// Sets the journal features the kernel sets at mount (csum v3 with
    /// `metadata_csum`, 64bit with `64bit`) in memory; the journal
    /// superblock goes to disk with the first commit or the shutdown. The
    /// next transaction is `s_sequence`, logged from `s_first`.
    pub fn new(
        dev: Arc<dyn Device>,
        journal: Journal,
        opts: JournalOptions,
    ) -> Result<JournalWriter, FsError> {
        let mut jsb = journal.jsb.clone();
        if jsb.s_start.get() != 0 {
            return Err(FsError::Unsupported(
                "the journal holds transactions: replay it before writing".into(),
            ));
        }
        let sb = &journal.sb;
        let metadata_csum = sb.s_feature_ro_compat.get()
            & ext4kit_format::features::RoCompat::METADATA_CSUM.bits()
            != 0;
        let is64 =
            sb.s_feature_incompat.get() & ext4kit_format::features::Incompat::BIT64.bits() != 0;
        let old = (
            jsb.s_feature_compat.get(),
            jsb.s_feature_incompat.get(),
            jsb.s_checksum_type,
        );
        let mut compat = old.0;
        let mut incompat = old.1;
        if opts.csum == JournalCsum::Kernel {
            // set_journal_csum_feature_set() without journal_checksum.
            compat &= !JBD2_FEATURE_COMPAT_CHECKSUM;
            incompat &= !(JBD2_FEATURE_INCOMPAT_CSUM_V2 | JBD2_FEATURE_INCOMPAT_CSUM_V3);
            if metadata_csum {
                incompat |= JBD2_FEATURE_INCOMPAT_CSUM_V3;
            }
        }
        if is64 {
            incompat |= JBD2_FEATURE_INCOMPAT_64BIT;
        }
        // journal_reset clears the fast-commit feature after recovery and
        // ext4 sets it again when the filesystem has fast_commit
        // (jbd2_journal_set_features -> jbd2_journal_initialize_fast_commit,
        // which refuses a journal too small for its area). Our commits
        // are always full ones and stay in s_first..j_last; the
        // fast-commit area after j_last is never written.
        let fast_commit =
            sb.s_feature_compat.get() & ext4kit_format::features::Compat::FAST_COMMIT.bits() != 0;
        let maxlen = journal.maxlen();
        let last = if fast_commit {
            let fc = jsb.num_fc_blocks();
            if maxlen.saturating_sub(fc) < JBD2_MIN_JOURNAL_BLOCKS.max(journal.first() + 2) {
                return Err(FsError::Unsupported(format!(
                    "the journal ({maxlen} blocks) is too small for its fast-commit area of {fc} blocks (the kernel refuses it too)"
                )));
            }
            incompat |= JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
            maxlen - fc
        } else {
            incompat &= !JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
            maxlen
        };
        jsb.s_feature_compat.set(compat);
        jsb.s_feature_incompat.set(incompat);
        let fmt = LogFormat { compat, incompat };
        // jbd2_journal_set_features sets the type with v2/v3; clearing
        // the features leaves it alone.
        if fmt.csum_v2or3() {
            jsb.s_checksum_type = JBD2_CRC32C_CHKSUM;
        }
        // ext4_clear_journal_err: the caller (rw open) has marked the
        // filesystem in error; the journal's record is cleared.
        let had_errno = jsb.s_errno.get() != 0;
        jsb.s_errno.set(0);
        let jsb_dirty = (compat, incompat, jsb.s_checksum_type) != old || had_errno;
        let jsb_block = journal.jsb_block();
        let capacity = last - journal.first();
        // jbd2_journal_get_max_txn_bufs: a quarter of the journal without
        // the fast-commit area.
        let max_txn = opts
            .max_transaction
            .unwrap_or(last / 4)
            .clamp(1, capacity / 2);
        let codec = LogCodec {
            fmt,
            seed: jcsum::seed(&jsb.s_uuid),
            block_size: journal.block_size as usize,
            uuid: jsb.s_uuid,
        };
        let tid = jsb.s_sequence.get();
        let cache = BlockCache::new(
            dev.clone(),
            journal.block_size,
            journal.fs_blocks,
            opts.cache_blocks,
        );
        // JBD2_CYCLE_RECORD (ext4 always sets it): continue logging where
        // the last clean unmount stopped (`s_head`), else from `s_first`
        // (e2fsprogs leaves `s_head` 0). Any start is valid because tids
        // only grow.
        let ring = LogRing::new(journal.first(), last, jsb.s_head.get());
        let w = JournalWriter {
            dev,
            cache,
            max_txn,
            revokes_per_block: codec.revokes_per_block().max(1),
            opts,
            state: Mutex::new(TxnState {
                running: Transaction::new(tid),
                locked: false,
                aborted: None,
                last_committed: tid.wrapping_sub(1),
                waiters: 0,
            }),
            cond: Condvar::new(),
            log: Mutex::new(LogState {
                ring,
                jsb,
                jsb_block,
                jsb_empty: true,
                jsb_dirty,
                codec,
            }),
            hooks: Mutex::new(Vec::new()),
            stats: Mutex::new(JournalStats::default()),
            journal: Some(journal),
        };
        // A changed journal superblock is written by the first commit
        // (before its commit block) or the clean shutdown, not here: an
        // open that gives up before its first handle writes nothing, and
        // the error state the open found reaches the filesystem's
        // superblock (the in-use marks) before the journal's record of
        // it is cleared.
        Ok(w)
    }

    /// A writer for a filesystem without a journal (`^has_journal`, as
    /// the kernel's ext4 runs one): transactions are kept exactly as with
    /// a journal (handles, credits, freezing, the freed-extent hooks), but
    /// a commit writes the transaction's blocks home in place after its
    /// ordered data is flushed, then flushes (`commit.rs`); nothing is
    /// logged, there is no checkpoint and nothing to replay. A crash in
    /// the middle of a commit may leave part of it home: e2fsck repairs
    /// that, as after a crash of the kernel's no-journal ext4. The largest
    /// transaction is [`JournalOptions::max_transaction`] or
    /// [`NO_JOURNAL_MAX_TRANSACTION`] blocks (it bounds the memory the
    /// running copies take).
    pub fn without_journal(
        dev: Arc<dyn Device>,
        block_size: u32,
        fs_blocks: u64,
        tid: u32,
        opts: JournalOptions,
    ) -> JournalWriter {
        let max_txn = opts
            .max_transaction
            .unwrap_or(NO_JOURNAL_MAX_TRANSACTION)
            .max(1);
        let cache = BlockCache::new(dev.clone(), block_size, fs_blocks, opts.cache_blocks);
        let codec = LogCodec {
            fmt: LogFormat {
                compat: 0,
                incompat: 0,
            },
            seed: 0,
            block_size: block_size as usize,
            uuid: [0; 16],
        };
        JournalWriter {
            dev,
            cache,
            max_txn,
            revokes_per_block: codec.revokes_per_block().max(1),
            opts,
            state: Mutex::new(TxnState {
                running: Transaction::new(tid),
                locked: false,
                aborted: None,
                last_committed: tid.wrapping_sub(1),
                waiters: 0,
            }),
            cond: Condvar::new(),
            log: Mutex::new(LogState {
                ring: LogRing::new(0, 0, 0),
                jsb: JournalSuperblock::new_zeroed(),
                jsb_block: 0,
                jsb_empty: true,
                jsb_dirty: false,
                codec,
            }),
            hooks: Mutex::new(Vec::new()),
            stats: Mutex::new(JournalStats::default()),
            journal: None,
        }
    }

    /// Whether this writer logs into a journal (`false`: a filesystem
    /// without one, see [`JournalWriter::without_journal`]).
    pub fn has_journal(&self) -> bool {
        self.journal.is_some()
    }

    /// The block cache: every metadata read goes through it
    /// ([`BlockRead`]).
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// The device underneath.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// The journal mapping this writer logs into (`None` without a
    /// journal).
    pub fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// The log format in use.
    pub fn format(&self) -> LogFormat {
        lock(&self.log).codec.fmt
    }

    /// The log block the next transaction starts at.
    pub fn log_head(&self) -> u32 {
        lock(&self.log).ring.head
    }

    /// Largest transaction, in logged blocks.
    pub fn max_transaction(&self) -> u32 {
        self.max_txn
    }

    /// Counters so far.
    pub fn stats(&self) -> JournalStats {
        *lock(&self.stats)
    }

    /// Add a hook called with each durable commit's freed extents (the
    /// allocator's "busy extents are free now", the mount's discard);
    /// hooks run in the order added, on the committing thread, and must
    /// not start handles or commit.
    pub fn add_freed_hook(&self, hook: FreedHook) {
        lock(&self.hooks).push(hook);
    }

    /// The tid the next handle joins.
    pub fn running_tid(&self) -> u32 {
        lock(&self.state).running.tid
    }

    /// Newest durable tid.
    pub fn last_committed(&self) -> u32 {
        lock(&self.state).last_committed
    }

    /// The error that aborted the journal, if any.
    pub fn aborted(&self) -> Option<String> {
        lock(&self.state).aborted.clone()
    }

    /// Abort the journal (ext4's errors=remount-ro): the running
    /// transaction is never committed, every later handle and commit
    /// fails. What was committed stays in the log for the next open. As
    /// `jbd2_journal_abort`, -EIO is recorded in the journal superblock's
    /// `s_errno` (best effort). The caller must not hold a handle.
    pub fn abort_journal(&self, why: &FsError) -> FsError {
        let e = self.abort(why);
        self.record_errno(&mut lock(&self.log));
        e
    }

    pub(crate) fn abort(&self, why: &FsError) -> FsError {
        let msg = why.to_string();
        let mut st = lock(&self.state);
        st.aborted.get_or_insert(msg.clone());
        st.notify(&self.cond);
        FsError::Aborted(msg)
    }

    /// Join the running transaction with `credits` block credits (the
    /// most distinct blocks this handle will modify). If the transaction
    /// would grow past its limit it is committed first.
    pub fn start(&self, credits: u32) -> Result<Handle<'_>, FsError> {
        if credits > self.max_txn {
            return Err(FsError::TooBig {
                wanted: credits,
                max: self.max_txn,
            });
        }
        loop {
            let mut st = lock(&self.state);
            if let Some(a) = &st.aborted {
                return Err(FsError::Aborted(a.clone()));
            }
            if st.locked {
                let _st = TxnState::wait(st, &self.cond);
                continue;
            }
            let r = &st.running;
            // Revoke records take log blocks too (jbd2's revoke credits).
            let revoke_blocks = r.revokes.len().div_ceil(self.revokes_per_block) as u32;
            let want = r.buffers.len() as u32 + revoke_blocks + r.outstanding + credits;
            if want > self.max_txn && !(r.buffers.is_empty() && r.updates == 0) {
                drop(st);
                self.commit()?;
                continue;
            }
            let r = &mut st.running;
            r.updates += 1;
            r.outstanding += credits;
            r.started.get_or_insert_with(Instant::now);
            return Ok(Handle {
                w: self,
                tid: r.tid,
                credits,
                reserved: credits,
                open: true,
                changed: false,
            });
        }
    }

    /// The `commit=` timer: commit the running transaction if it is older
    /// than the interval (the caller calls this every second or so).
    pub fn tick(&self) -> Result<Option<u32>, FsError> {
        let due = {
            let st = lock(&self.state);
            !st.running.is_empty()
                && st
                    .running
                    .started
                    .is_some_and(|t| t.elapsed() >= self.opts.commit_interval)
        };
        if due { self.commit() } else { Ok(None) }
    }

    /// fsync: make transaction `tid` durable (commit it if it is still
    /// running; return at once if it already is).
    pub fn commit_tid(&self, tid: u32) -> Result<(), FsError> {
        {
            let st = lock(&self.state);
            if let Some(a) = &st.aborted {
                return Err(FsError::Aborted(a.clone()));
            }
            if tid_geq(st.last_committed, tid) {
                return Ok(());
            }
        }
        self.commit().map(|_| ())
    }

    /// jbd2_journal_abort: record -EIO in the journal superblock's
    /// `s_errno` (best effort: the device may be what failed), so the next
    /// open marks the filesystem in error.
    pub(crate) fn record_errno(&self, log: &mut LogState) {
        if self.journal.is_none() || self.aborted().is_none() || log.jsb.s_errno.get() != 0 {
            return;
        }
        log.jsb.s_errno.set(JBD2_EIO);
        if self.write_jsb(log).is_ok() {
            let _ = self.dev.flush();
        }
    }

    pub(crate) fn write_jsb(&self, log: &mut LogState) -> Result<(), FsError> {
        if self.journal.is_none() {
            return Ok(());
        }
        let jsb = &mut log.jsb;
        if log.codec.fmt.csum_v2or3() {
            jsb.s_checksum.set(0);
            let c = jcsum::superblock(jsb.as_bytes());
            jsb.s_checksum.set(c);
        }
        let bs = u64::from(self.cache.block_size());
        self.dev.write_at(jsb.as_bytes(), log.jsb_block * bs)?;
        log.jsb_dirty = false;
        Ok(())
    }

    fn end_handle(&self, credits: u32) {
        let mut st = lock(&self.state);
        let r = &mut st.running;
        r.updates -= 1;
        r.outstanding -= credits;
        if r.updates == 0 {
            st.notify(&self.cond);
        }
    }
}

/// A caller's part of the running transaction (see the module docs).
/// Dropping it (or [`Handle::stop`]) ends it; the changes stay in the
/// transaction until it commits.
pub struct Handle<'a> {
    w: &'a JournalWriter,
    tid: u32,
    credits: u32,
    reserved: u32,
    open: bool,
    /// Has this handle changed a block, written data, freed or revoked?
    changed: bool,
}

impl std::fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("tid", &self.tid)
            .field("credits", &self.credits)
            .finish()
    }
}

impl Handle<'_> {
    /// The transaction this handle belongs to (for [`JournalWriter::commit_tid`]).
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Credits left.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Whether this handle has changed anything yet (a block joined,
    /// ordered data, a freed extent, a revoke): an operation that fails
    /// before it has can end the handle instead of failing it.
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// The cache, to read blocks (their newest images) while changing
    /// others.
    pub fn blocks(&self) -> &BlockCache {
        &self.w.cache
    }

    /// Join `blk` to the transaction (one credit the first time).
    fn join(&mut self, blk: u64, zeroed: bool) -> Result<crate::cache::RunningCopy, FsError> {
        let mut st = lock(&self.w.state);
        if let Some(a) = &st.aborted {
            return Err(FsError::Aborted(a.clone()));
        }
        self.changed = true;
        let in_txn = st.running.buffers.contains(&blk);
        if !in_txn && self.credits == 0 {
            return Err(FsError::NoCredits(self.reserved));
        }
        let (copy, _) = if zeroed {
            self.w.cache.running_zeroed(blk)?
        } else {
            self.w.cache.running_copy(blk)?
        };
        if !in_txn {
            self.credits -= 1;
            let r = &mut st.running;
            r.outstanding -= 1;
            r.buffers.insert(blk);
            // Re-logging a block cancels its revoke.
            r.revokes.remove(&blk);
        }
        Ok(copy)
    }

    /// Change block `blk`: `f` gets its newest image and changes it in
    /// place; the change is part of this handle's transaction.
    pub fn modify<R>(&mut self, blk: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, FsError> {
        let copy = self.join(blk, false)?;
        let mut data = lock(&copy);
        Ok(f(&mut data))
    }

    /// Like [`Handle::modify`] for a newly allocated metadata block whose
    /// old content does not matter: `f` gets zeros (no device read).
    pub fn modify_new<R>(
        &mut self,
        blk: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, FsError> {
        let copy = self.join(blk, true)?;
        let mut data = lock(&copy);
        data.fill(0);
        Ok(f(&mut data))
    }

    /// Write ordered data: `data` (whole blocks) goes to `blk..` on the
    /// device now, unjournaled; the commit's first flush makes it durable
    /// before the commit block. Only for blocks that were free in the last
    /// durable state or already belong to the file.
    pub fn write_data(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
        let bs = u64::from(self.w.cache.block_size());
        let n = (data.len() as u64).div_ceil(bs);
        if data.len() as u64 != n * bs
            || blk
                .checked_add(n)
                .is_none_or(|e| e > self.w.cache.block_count())
        {
            return Err(FsError::BlockOutOfRange {
                block: blk.saturating_add(n),
                count: self.w.cache.block_count(),
            });
        }
        self.w.dev.write_at(data, blk * bs)?;
        for b in blk..blk + n {
            self.w.cache.invalidate_clean(b);
        }
        self.ordered(blk, n);
        Ok(())
    }

    /// Declare `len` blocks from `blk` as ordered data the caller wrote
    /// (or will write before this handle ends).
    pub fn ordered(&mut self, blk: u64, len: u64) {
        self.changed = true;
        lock(&self.w.state).running.ordered.push((blk, len));
    }

    /// Record a freed extent: handed to the [`FreedHook`] once this
    /// transaction is durable.
    pub fn free_extent(&mut self, blk: u64, len: u64) {
        self.changed = true;
        lock(&self.w.state).running.freed.push((blk, len));
    }

    /// Revoke a freed metadata block (extent, directory, xattr block): a
    /// replay will not write an older logged copy of it over what the
    /// block holds next. A change to it in this transaction is dropped;
    /// changing it again later (re-allocation) cancels the revoke.
    pub fn revoke(&mut self, blk: u64) -> Result<(), FsError> {
        if blk >= self.w.cache.block_count() {
            return Err(FsError::BlockOutOfRange {
                block: blk,
                count: self.w.cache.block_count(),
            });
        }
        self.changed = true;
        let mut st = lock(&self.w.state);
        if st.running.buffers.remove(&blk) {
            // Give the credit back and drop the running copy.
            st.running.outstanding += 1;
            self.credits += 1;
            self.w.cache.drop_running(blk);
        }
        st.running.revokes.insert(blk);
        Ok(())
    }

    /// The operation this handle belongs to failed after it may have
    /// changed blocks: abort the journal so that none of its changes ever
    /// commit (a partial operation must not become durable), and return
    /// the error to pass up.
    pub fn fail(mut self, err: FsError) -> FsError {
        let e = self.w.abort(&err);
        // End the handle before taking the log lock: a commit holding it
        // may be waiting for this handle.
        self.close();
        self.w.record_errno(&mut lock(&self.w.log));
        match e {
            FsError::Aborted(_) => err,
            other => other,
        }
    }

    /// End the handle.
    pub fn stop(mut self) {
        self.close();
    }

    fn close(&mut self) {
        if self.open {
            self.open = false;
            self.w.end_handle(self.credits);
        }
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::recover::{self, tests::image};
    use ext4kit_device::MemDevice;

    /// A writer over a fresh 32 MiB ext4 (4 KiB blocks, 1024-block log).
    fn writer(opts: JournalOptions) -> (Arc<MemDevice>, JournalWriter) {
        let mem = Arc::new(image());
        let j = Journal::open(&*mem).unwrap();
        let dev: Arc<dyn Device> = mem.clone();
        (mem, JournalWriter::new(dev, j, opts).unwrap())
    }

    /// Free blocks near the end of the image.
    fn free(k: u64) -> u64 {
        (32 << 20) / 4096 - 1 - k
    }

    fn replayed(mem: &MemDevice) -> recover::Recovery {
        let j = Journal::open(mem).unwrap();
        recover::recover(mem, &j).unwrap()
    }

    /// fast_commit: the writer sets the journal's fast-commit feature, as
    /// the kernel's mount does, and its full commits wrap at j_last: the
    /// fast-commit area is never written (filled with 0xEE here to see).
    #[test]
    fn fast_commit_area_is_never_written_and_the_log_wraps_before_it() {
        for kernel_used in [false, true] {
            let mem = if kernel_used {
                Arc::new(recover::tests::fc_image())
            } else {
                let mut m = ext4kit::testing::MemImage::new(32 << 20, 4096, 16384);
                m.features = vec!["fast_commit".into()];
                Arc::new(m.make().unwrap())
            };
            let j = Journal::open(&*mem).unwrap();
            assert_eq!(j.fmt.fast_commit(), kernel_used);
            let area: Vec<u64> = (1024..1040).map(|l| j.phys(l).unwrap()).collect();
            for &p in &area {
                mem.write_at(&[0xEE; 4096], p * 4096).unwrap();
            }
            let dev: Arc<dyn Device> = mem.clone();
            let w = JournalWriter::new(dev, j, JournalOptions::default()).unwrap();
            assert!(w.format().fast_commit());
            // 700 transactions of 2 blocks + descriptor + commit: the
            // 1023-block ring wraps about three times.
            let mut highest = 0;
            for i in 0..700u64 {
                let mut h = w.start(2).unwrap();
                h.modify(free(i % 50), |d| d[0] = i as u8).unwrap();
                h.modify(free(50 + i % 7), |d| d[1] = i as u8).unwrap();
                drop(h);
                w.commit().unwrap();
                highest = highest.max(lock(&w.log).ring.head);
            }
            assert!(highest < 1024 && highest > 1000, "{highest}");
            for &p in &area {
                let mut b = vec![0u8; 4096];
                mem.read_at(&mut b, p * 4096).unwrap();
                assert!(b.iter().all(|&x| x == 0xEE), "fc area block {p} written");
            }
            // The log as written reads back (wrap at 1024), the feature
            // is on disk.
            let j = Journal::open(&*mem).unwrap();
            assert!(j.fmt.fast_commit());
            assert_eq!(j.last(), 1024);
            let rec = recover::recover(&*mem, &j).unwrap();
            assert!(rec.transactions() > 0);
            assert_eq!(rec.writes[&free(699 % 50)][0], (699 % 256) as u8);
            assert_eq!(rec.fast_commit, crate::journal::FcLog::Empty);
        }
    }

    #[test]
    fn handles_join_one_transaction_and_commit_makes_it_replayable() {
        let (mem, w) = writer(JournalOptions::default());
        assert!(w.format().csum_v3());
        let tid = w.running_tid();
        let mut a = w.start(2).unwrap();
        let mut b = w.start(1).unwrap();
        a.modify(free(0), |d| d[0] = 1).unwrap();
        b.modify(free(1), |d| d[0] = 2).unwrap();
        a.modify(free(0), |d| d[1] = 3).unwrap(); // same block: no credit
        assert_eq!(a.credits(), 1);
        assert!(matches!(
            b.modify(free(2), |_| ()),
            Err(FsError::NoCredits(1))
        ));
        assert_eq!((a.tid(), b.tid()), (tid, tid));
        drop((a, b));
        // Nothing reaches the device before the commit.
        assert_eq!(mem.to_bytes()[(free(0) * 4096) as usize], 0);
        assert_eq!(w.cache().block(free(0)).unwrap()[..2], [1, 3]);
        assert_eq!(w.commit().unwrap(), Some(tid));
        assert_eq!(w.commit().unwrap(), None);
        assert_eq!(w.last_committed(), tid);
        // Still not home (no checkpoint), but replay writes it.
        assert_eq!(mem.to_bytes()[(free(0) * 4096) as usize], 0);
        let rec = replayed(&mem);
        assert_eq!(rec.transactions(), 1);
        assert_eq!(rec.writes[&free(0)][..2], [1, 3]);
        assert_eq!(rec.writes[&free(1)][0], 2);
        w.checkpoint().unwrap();
        assert_eq!(mem.to_bytes()[(free(0) * 4096) as usize], 1);
        assert!(replayed(&mem).writes.is_empty());
    }

    #[test]
    fn revokes_hide_older_copies_and_relogging_cancels_them() {
        let (mem, w) = writer(JournalOptions::default());
        for (blk, v) in [(free(0), 7u8), (free(1), 8)] {
            let mut h = w.start(1).unwrap();
            h.modify(blk, |d| d.fill(v)).unwrap();
        }
        w.commit().unwrap();
        let mut h = w.start(1).unwrap();
        h.revoke(free(0)).unwrap();
        h.revoke(free(1)).unwrap();
        h.modify(free(1), |d| d[0] = 9).unwrap(); // re-logged: revoke cancelled
        drop(h);
        let freed = Arc::new(Mutex::new(Vec::new()));
        let f2 = freed.clone();
        w.add_freed_hook(Box::new(move |tid, ext| {
            lock(&f2).push((tid, ext.to_vec()));
        }));
        let mut h = w.start(0).unwrap();
        h.free_extent(free(0), 1);
        let tid = h.tid();
        drop(h);
        assert!(
            lock(&freed).is_empty(),
            "the hook runs only after the commit"
        );
        w.commit().unwrap();
        assert_eq!(*lock(&freed), vec![(tid, vec![(free(0), 1)])]);
        assert!(w.format().incompat & JBD2_FEATURE_INCOMPAT_REVOKE != 0);
        let rec = replayed(&mem);
        assert_eq!(rec.nr_revokes, 1);
        assert!(!rec.writes.contains_key(&free(0)));
        assert_eq!(rec.writes[&free(1)][..2], [9, 8]);
        // The revoked block's committed image is never checkpointed.
        w.checkpoint().unwrap();
        assert_eq!(mem.to_bytes()[(free(0) * 4096) as usize], 0);
    }

    #[test]
    fn a_full_transaction_commits_before_the_next_handle_and_tick_honours_the_interval() {
        let (_mem, w) = writer(JournalOptions {
            max_transaction: Some(8),
            commit_interval: Duration::from_millis(50),
            ..JournalOptions::default()
        });
        assert!(matches!(
            w.start(9),
            Err(FsError::TooBig { wanted: 9, max: 8 })
        ));
        let first = w.running_tid();
        {
            let mut h = w.start(6).unwrap();
            for k in 0..6 {
                h.modify(free(k), |d| d[0] = 1).unwrap();
            }
        }
        // 6 + 3 > 8: the running transaction is committed first.
        let h = w.start(3).unwrap();
        assert_eq!(h.tid(), first.wrapping_add(1));
        assert_eq!(w.last_committed(), first);
        drop(h);
        let mut h = w.start(1).unwrap();
        h.modify(free(10), |d| d[0] = 1).unwrap();
        drop(h);
        assert_eq!(w.tick().unwrap(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(w.tick().unwrap(), Some(first.wrapping_add(1)));
        w.commit_tid(first).unwrap();
        assert_eq!(w.stats().commits, 2);
    }

    #[test]
    fn a_write_error_aborts_the_journal_and_nothing_goes_home() {
        use ext4kit_device::FaultDevice;
        let mem = Arc::new(image());
        let before = mem.to_bytes();
        let fault = FaultDevice::new(mem.clone());
        let ctl = fault.control();
        let dev: Arc<dyn Device> = Arc::new(fault);
        let j = Journal::open(&*dev).unwrap();
        let w = JournalWriter::new(dev, j, JournalOptions::default()).unwrap();
        let mut h = w.start(1).unwrap();
        h.modify(free(0), |d| d[0] = 1).unwrap();
        drop(h);
        ctl.fail_after(1); // the log write succeeds, the flush fails
        let e = w.commit().unwrap_err();
        assert!(matches!(e, FsError::Aborted(_)), "{e}");
        assert!(matches!(w.start(1), Err(FsError::Aborted(_))));
        assert!(matches!(w.checkpoint(), Err(FsError::Aborted(_))));
        assert!(w.shutdown().is_err());
        drop(w);
        // Only the jsb features may have been flushed at open; no home
        // block and no commit block reached the device.
        let after = mem.to_bytes();
        let b = (free(0) * 4096) as usize;
        assert_eq!(after[b], before[b]);
        let rec = replayed(&mem);
        assert_eq!(rec.transactions(), 0);
    }

    #[test]
    fn a_failed_operation_never_commits_half_of_itself() {
        let (mem, w) = writer(JournalOptions::default());
        let mut h = w.start(1).unwrap();
        h.modify(free(0), |d| d[0] = 1).unwrap();
        drop(h);
        w.commit().unwrap();
        let mut h = w.start(1).unwrap();
        h.modify(free(1), |d| d[0] = 2).unwrap();
        let e = h.modify(free(2), |_| ()).unwrap_err();
        let e = h.fail(e);
        assert!(matches!(e, FsError::NoCredits(1)), "{e}");
        assert!(matches!(w.commit(), Err(FsError::Aborted(_))));
        assert!(matches!(w.start(1), Err(FsError::Aborted(_))));
        let rec = replayed(&mem);
        assert_eq!(rec.transactions(), 1);
        assert!(rec.writes.contains_key(&free(0)) && !rec.writes.contains_key(&free(1)));
        assert_eq!(Journal::open(&*mem).unwrap().jsb.s_errno.get(), JBD2_EIO);
    }

    #[test]
    fn without_a_journal_a_commit_writes_home_after_the_ordered_data() {
        use ext4kit_device::FaultDevice;
        let mem = Arc::new(image());
        let fault = FaultDevice::new(mem.clone());
        let ctl = fault.control();
        let dev: Arc<dyn Device> = Arc::new(fault);
        let w = JournalWriter::without_journal(
            dev,
            4096,
            (32 << 20) / 4096,
            1,
            JournalOptions::default(),
        );
        assert!(!w.has_journal() && w.journal().is_none());
        assert_eq!(w.max_transaction(), NO_JOURNAL_MAX_TRANSACTION);
        let mut h = w.start(2).unwrap();
        h.write_data(free(5), &[7u8; 4096]).unwrap();
        h.modify(free(0), |d| d[0] = 1).unwrap();
        h.modify(free(1), |d| d[0] = 2).unwrap();
        let tid = h.tid();
        drop(h);
        assert_eq!(mem.to_bytes()[(free(0) * 4096) as usize], 0);
        let (ops, flushes) = (ctl.ops(), ctl.flushes());
        assert_eq!(w.commit().unwrap(), Some(tid));
        // flush (the data), the two neighbours in one write, flush.
        assert_eq!((ctl.ops() - ops, ctl.flushes() - flushes), (3, 2));
        let img = mem.to_bytes();
        assert_eq!(img[(free(0) * 4096) as usize], 1);
        assert_eq!(img[(free(1) * 4096) as usize], 2);
        assert_eq!(img[(free(5) * 4096) as usize], 7);
        assert_eq!(w.stats().log_blocks_written, 0);
        // Nothing committed is left unwritten: checkpoint and shutdown
        // write nothing more.
        w.checkpoint().unwrap();
        let ops = ctl.ops();
        w.shutdown().unwrap();
        assert_eq!(ctl.ops(), ops);
        assert!(w.start(1).is_err());
    }

    #[test]
    fn many_threads_and_many_commits_wrap_the_log() {
        let (mem, w) = writer(JournalOptions::default());
        let w = Arc::new(w);
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let w = w.clone();
            threads.push(std::thread::spawn(move || {
                for i in 0..150u64 {
                    let mut h = w.start(4).unwrap();
                    for k in 0..4 {
                        let blk = free(t * 4 + k);
                        h.modify(blk, |d| {
                            let v = u64::from_le_bytes(d[..8].try_into().unwrap()) + 1;
                            d[..8].copy_from_slice(&v.to_le_bytes());
                        })
                        .unwrap();
                    }
                    let tid = h.tid();
                    drop(h);
                    if i % 2 == 0 {
                        w.commit_tid(tid).unwrap();
                    }
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        w.commit().unwrap();
        assert!(w.stats().checkpoints >= 1, "{:?}", w.stats());
        let rec = replayed(&mem);
        let home = mem.to_bytes();
        for b in 0..16 {
            let blk = free(b);
            let img = rec
                .writes
                .get(&blk)
                .cloned()
                .unwrap_or_else(|| home[(blk * 4096) as usize..][..4096].to_vec());
            assert_eq!(
                u64::from_le_bytes(img[..8].try_into().unwrap()),
                150,
                "block {b}"
            );
        }
        w.shutdown().unwrap();
        assert!(w.start(1).is_err());
        let j = Journal::open(&*mem).unwrap();
        assert_eq!(j.jsb.s_start.get(), 0);
    }
}
