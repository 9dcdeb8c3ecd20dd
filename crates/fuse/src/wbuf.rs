//! The write-behind buffer of the default (write-through) mount.
//!
//! Without FUSE's writeback cache the kernel sends every `write(2)` as
//! one WRITE request and waits for its reply; answered by one engine
//! call each (its own journal handle, extent lookup, ordered data write,
//! inode update, group rendering) a 4 KiB write cost ~60 µs of daemon
//! CPU on the reply's path. Here a WRITE copies its bytes into the
//! buffer (merged with adjacent and overlapping ranges) and is answered
//! at once; the buffer reaches the engine as a few large `write_at`
//! calls when
//! - its inode holds [`INODE_BOUND`] bytes, or all inodes together hold
//!   more than [`TOTAL_BOUND`] (then the inode buffered longest goes);
//! - a request reads or changes that inode's data or attributes (READ,
//!   GETATTR, an entry reply carrying its attributes, SETATTR, LSEEK,
//!   FALLOCATE, COPY_FILE_RANGE, FSYNC, FLUSH, the flag ioctls, xattr
//!   changes, link/unlink/rename);
//! - **any** request that changes the filesystem other than a buffered
//!   WRITE (create, mkdir, unlink, rename, setattr, xattrs, fallocate,
//!   copies, ioctls, a freed orphan, a write-through write), STATFS and
//!   FITRIM flush every inode first;
//! - a thread's buffered WRITE of another inode than its last one flushes
//!   that last one first;
//! - the mount's one-second timer (before the journal's `commit=` tick),
//!   the idle commit, `ext4kit sync` and the unmount.
//!
//! **Several inodes, one lock each** ([`Slot`]): writers of different
//! files buffer in parallel and do not evict each other; the table that
//! finds the slots and counts the bytes is locked only briefly, never
//! across an engine call. Order: a buffered write is answered only after
//! every change of the filesystem before it reached the engine or the
//! buffer, every other change flushes the whole buffer first, and one
//! thread's writes of two inodes reach the engine in its order. So a
//! crash (power cut, `kill -9` of the daemon) loses only acknowledged,
//! not-fsynced writes younger than the last flush of their inode (at most
//! a second, then the `commit=` interval as before), never a
//! metadata change younger than a kept write, and of one thread's writes
//! never an older one while a younger survives (stronger than ext4's
//! delayed allocation, which orders nothing that was not fsynced).
//! Writes of different inodes by different threads (the kernel's FUSE
//! gives them no order either) may reach the engine in either order.
//!
//! What stays exact: reads, `stat` (size, `st_blocks`: the inode is
//! flushed before its attributes are answered), SEEK_DATA/SEEK_HOLE, and
//! mtime/ctime: a buffered write records its time when it is answered
//! and the flush writes that time back (the kernel's ext4 sets them at
//! `write(2)` time). Errors the kernel gives at write time are still given
//! then: EFBIG (checked before buffering), EPERM on an immutable inode
//! (such writes are not buffered; a `chattr +i` flushes first), ENOSPC
//! and EROFS (buffered only while free space exceeds twice everything
//! buffered plus a margin, [`room`], and the journal is not aborted;
//! otherwise the write goes through and gets the engine's answer). The
//! set-user-ID/set-group-ID clearing of killpriv v2 happens at once
//! (buffer flushed, mode changed, then the write buffered). A flush that
//! fails after its writes were answered keeps the error for that inode:
//! the next fsync or FLUSH of it returns it, as the kernel's writeback
//! errors are. Writes with O_DIRECT, O_SYNC or O_DSYNC (also RWF_DSYNC
//! and `-o sync`, which the kernel passes as O_DSYNC) and writes of
//! [`BIG_WRITE`] bytes or more go through (after a flush).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ext4kit_fs::inode::Timestamp;
use fuser::Errno;

/// An inode's buffer holding this many bytes is flushed.
pub const INODE_BOUND: usize = 4 << 20;
/// The buffer over all inodes holds at most this many bytes: past it, the
/// inode buffered longest is flushed.
pub const TOTAL_BOUND: usize = 16 << 20;
/// Writes of this size or more go to the engine directly (they are
/// large enough to be efficient there; a copy would only cost).
pub const BIG_WRITE: usize = 256 << 10;
/// Blocks kept free beyond twice what is buffered (directories, tree
/// blocks and other requests' allocations meanwhile).
pub const MARGIN_BLOCKS: u64 = 256;

/// Whether a write of `more` bytes may be buffered next to `buffered`
/// bytes in `ranges` ranges, with `avail` allocatable blocks of
/// `block_size`: free space must exceed twice what the buffer could
/// need (every byte in a new block, two edge blocks per range, tree
/// blocks) plus [`MARGIN_BLOCKS`]. Otherwise the write goes through, so
/// ENOSPC comes at write time.
pub fn room(avail: u64, block_size: u64, buffered: usize, ranges: usize, more: usize) -> bool {
    let bytes = (buffered as u64).saturating_add(more as u64);
    let need = bytes
        .div_ceil(block_size.max(1))
        .saturating_add(2 * (ranges as u64 + 1));
    avail >= need.saturating_mul(2).saturating_add(MARGIN_BLOCKS)
}

/// The buffered writes of one inode: disjoint, non-adjacent byte ranges.
#[derive(Debug)]
pub struct InodeBuf {
    pub ino: u32,
    /// The file's size with the buffered writes (O_APPEND writes here).
    pub size: u64,
    /// The inode's mode when buffering started (killpriv's check; any
    /// change of it flushes the buffer first).
    pub mode: u16,
    /// The time of the last buffered write: the file's mtime and ctime
    /// once flushed.
    pub mtime: Timestamp,
    ranges: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    writes: u64,
}

impl InodeBuf {
    pub fn new(ino: u32, size: u64, mode: u16) -> InodeBuf {
        InodeBuf {
            ino,
            size,
            mode,
            mtime: Timestamp::default(),
            ranges: BTreeMap::new(),
            bytes: 0,
            writes: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Ranges held.
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Writes merged in.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// The ranges in file order.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.ranges.iter().map(|(o, v)| (*o, v.as_slice()))
    }

    /// Add a write of `data` at `off` made at time `t`: merged with every
    /// range it overlaps or touches (the newest bytes win).
    pub fn add(&mut self, off: u64, data: &[u8], t: Timestamp) {
        if data.is_empty() {
            return;
        }
        let (a, b) = (off, off + data.len() as u64);
        // The ranges touching [a, b]: a run ending at the last one that
        // starts at or before b (ends grow with starts: disjoint).
        let touching: Vec<u64> = self
            .ranges
            .range(..=b)
            .rev()
            .take_while(|(s, v)| **s + v.len() as u64 >= a)
            .map(|(s, _)| *s)
            .collect();
        let end = touching
            .iter()
            .filter_map(|s| self.ranges.get(s).map(|v| s + v.len() as u64))
            .fold(b, u64::max);
        // The first range becomes the merged one when it starts first
        // (an append extends it in place).
        let (start, mut merged) = match touching.last() {
            Some(&s) if s <= a => (s, self.ranges.remove(&s).unwrap_or_default()),
            _ => (a, Vec::new()),
        };
        self.bytes -= merged.len();
        merged.resize((end - start) as usize, 0);
        for s in touching {
            if let Some(v) = self.ranges.remove(&s) {
                self.bytes -= v.len();
                let o = (s - start) as usize;
                merged[o..o + v.len()].copy_from_slice(&v);
            }
        }
        let o = (a - start) as usize;
        merged[o..o + data.len()].copy_from_slice(data);
        self.bytes += merged.len();
        self.ranges.insert(start, merged);
        self.size = self.size.max(b);
        self.mtime = t;
        self.writes += 1;
    }
}

/// Where a flush goes (the engine; a recorder in the unit tests).
pub trait Sink {
    /// Write `data` at `off` of `ino`; the tid of the change.
    fn write(&self, ino: u32, off: u64, data: &[u8]) -> Result<u32, Errno>;
    /// Set `ino`'s mtime and ctime to `t`; the tid.
    fn set_times(&self, ino: u32, t: Timestamp) -> Result<u32, Errno>;
    /// `ino` changed in transaction `tid` (what its fsync commits).
    fn changed(&self, ino: u32, tid: u32);
    /// Write every range of `buf` (file order) and then its time; the
    /// number of engine writes made. By default one [`Sink::write`] per
    /// range and one [`Sink::set_times`]; the engine does them in as few
    /// handles as its journal allows.
    fn write_buf(&self, buf: &InodeBuf) -> Result<u64, Errno> {
        let mut n = 0;
        for (off, data) in buf.ranges() {
            let tid = self.write(buf.ino, off, data)?;
            self.changed(buf.ino, tid);
            n += 1;
        }
        if n > 0 {
            let tid = self.set_times(buf.ino, buf.mtime)?;
            self.changed(buf.ino, tid);
        }
        Ok(n)
    }
}

/// One inode's place in the buffer: its writes behind its own lock (held
/// across a buffered write of it and across its flush).
#[derive(Debug)]
pub struct Slot {
    pub ino: u32,
    buf: Mutex<Option<InodeBuf>>,
}

/// A locked [`Slot`]: its writes, `None` when it holds none.
pub type SlotGuard<'a> = MutexGuard<'a, Option<InodeBuf>>;

impl Slot {
    /// Its lock. Taken before the table's (brief) lock, before any engine
    /// lock of the mount (`lock_inode`) and `state`; never while holding
    /// another slot's lock.
    pub fn lock(&self) -> SlotGuard<'_> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What one non-empty slot holds, as the table counts it.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// When its oldest buffered write came (eviction takes the oldest).
    seq: u64,
    bytes: usize,
    ranges: usize,
}

/// The buffer's table, behind a brief lock (never held across an engine
/// call or while waiting for a slot).
#[derive(Debug, Default)]
struct Table {
    slots: HashMap<u32, Arc<Slot>>,
    held: HashMap<u32, Held>,
    bytes: usize,
    ranges: usize,
    seq: u64,
    /// The inode each writing thread's (request pid's) buffered writes
    /// are in: a thread's writes of another inode flush that one first.
    last: HashMap<u32, u32>,
}

/// Counts since the mount (published in the status file).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Writes answered from the buffer.
    pub buffered: u64,
    /// Flushes that wrote something.
    pub flushes: u64,
    /// Ranges the flushes wrote.
    pub ranges: u64,
    /// Flushes made to keep the buffer under [`TOTAL_BOUND`].
    pub evictions: u64,
}

/// The mount's write-behind buffer (see the module docs).
#[derive(Debug, Default)]
pub struct WriteBuffer {
    /// Inodes holding buffered writes: read without a lock by every
    /// request that only needs to know whether anything is buffered.
    held: AtomicUsize,
    table: Mutex<Table>,
    /// Flush errors not yet returned by an fsync/FLUSH of their inode.
    errors: Mutex<HashMap<u32, Errno>>,
    counts: Mutex<Counts>,
}

impl WriteBuffer {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Whether any inode is buffered (a hint outside the locks).
    pub fn any(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }

    /// Whether `ino` holds buffered writes (a hint: a flush of it locks).
    pub fn holds(&self, ino: u32) -> bool {
        self.any() && self.table().held.contains_key(&ino)
    }

    /// Inodes and bytes buffered.
    pub fn held(&self) -> (usize, usize) {
        let t = self.table();
        (t.held.len(), t.bytes)
    }

    /// Bytes and ranges buffered over every inode (the space rule).
    pub fn totals(&self) -> (usize, usize) {
        let t = self.table();
        (t.bytes, t.ranges)
    }

    /// The inode whose writes thread `pid` buffered last, if still held.
    pub fn last_of(&self, pid: u32) -> Option<u32> {
        if !self.any() {
            return None;
        }
        self.table().last.get(&pid).copied()
    }

    /// `ino`'s slot (made when missing). Give it back with
    /// [`WriteBuffer::release`] once its guard is dropped.
    pub fn slot(&self, ino: u32) -> Arc<Slot> {
        self.table()
            .slots
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(Slot {
                    ino,
                    buf: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Counts since the mount.
    pub fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record what the locked slot `g` of `ino` holds now (after a write
    /// into it by thread `pid`, if any). Returns whether the buffer is over
    /// [`TOTAL_BOUND`] (the caller evicts once it dropped `g`).
    pub fn note(&self, ino: u32, g: &Option<InodeBuf>, pid: Option<u32>) -> bool {
        let mut t = self.table();
        let old = t.held.remove(&ino);
        if let Some(h) = old {
            t.bytes -= h.bytes;
            t.ranges -= h.ranges;
        }
        match g.as_ref().filter(|b| b.writes() > 0) {
            Some(b) => {
                // The first write of a buffer places it in the order.
                let seq = match old {
                    Some(h) => h.seq,
                    None => {
                        t.seq += 1;
                        t.seq
                    }
                };
                t.held.insert(
                    ino,
                    Held {
                        seq,
                        bytes: b.bytes(),
                        ranges: b.range_count(),
                    },
                );
                t.bytes += b.bytes();
                t.ranges += b.range_count();
                if let Some(p) = pid {
                    t.last.insert(p, ino);
                }
            }
            None => t.last.retain(|_, i| *i != ino),
        }
        self.held.store(t.held.len(), Ordering::Release);
        t.bytes > TOTAL_BOUND
    }

    /// One write answered from the buffer.
    pub fn count_buffered(&self) {
        self.count(|c| c.buffered += 1);
    }

    /// Done with `slot` (its guard dropped first): forget it if it is
    /// empty and nobody else holds it. The `Arc` is dropped here, under
    /// the table's lock, as every other holder's is, and a slot is only
    /// handed out under that lock: of several threads done with one slot
    /// the last one sees that it is the last (checked before dropping
    /// the guard, two threads could each count the other and both leave
    /// an empty slot behind).
    pub fn release(&self, slot: Arc<Slot>) {
        let mut t = self.table();
        // The table's and ours: nobody else has it or can get it now, so
        // nobody holds its lock either.
        if Arc::strong_count(&slot) == 2
            && t.slots
                .get(&slot.ino)
                .is_some_and(|s| Arc::ptr_eq(s, &slot))
        {
            let empty = match slot.buf.try_lock() {
                Ok(b) => b.is_none(),
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().is_none(),
                Err(std::sync::TryLockError::WouldBlock) => false,
            };
            if empty {
                t.slots.remove(&slot.ino);
            }
        }
        drop(slot);
    }

    /// Write what the locked slot `g` holds to `sink` (ranges in file
    /// order, then the time of the last write) and empty it. An error is
    /// kept for the inode ([`WriteBuffer::take_error`]) and returned; the
    /// rest of its writes are dropped (as the kernel drops pages whose
    /// writeback failed).
    pub fn flush_locked(&self, g: &mut Option<InodeBuf>, sink: &dyn Sink) -> Result<(), Errno> {
        let Some(buf) = g.take() else {
            return Ok(());
        };
        let r = sink.write_buf(&buf);
        self.note(buf.ino, g, None);
        match r {
            Ok(n) => {
                if n > 0 {
                    self.count(|c| {
                        c.flushes += 1;
                        c.ranges += n;
                    });
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    "inode {}: writing {} buffered bytes: {e:?} (returned by its next fsync)",
                    buf.ino,
                    buf.bytes
                );
                self.errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(buf.ino, e);
                Err(e)
            }
        }
    }

    /// Flush `ino` if it is buffered (waits for a flush of it under way).
    pub fn flush_ino(&self, ino: u32, sink: &dyn Sink) -> Result<(), Errno> {
        let slot = match self.table().slots.get(&ino) {
            Some(s) => s.clone(),
            None => return Ok(()),
        };
        let mut g = slot.lock();
        let r = self.flush_locked(&mut g, sink);
        drop(g);
        self.release(slot);
        r
    }

    /// Flush every buffered inode, oldest first (the first error is
    /// returned, every inode is flushed).
    pub fn flush_all(&self, sink: &dyn Sink) -> Result<(), Errno> {
        if !self.any() {
            return Ok(());
        }
        let mut order: Vec<(u64, u32)> = {
            let t = self.table();
            t.held.iter().map(|(i, h)| (h.seq, *i)).collect()
        };
        order.sort_unstable();
        let mut r = Ok(());
        for (_, ino) in order {
            if let Err(e) = self.flush_ino(ino, sink) {
                r = r.and(Err(e));
            }
        }
        r
    }

    /// While the buffer is over [`TOTAL_BOUND`]: flush the inode buffered
    /// longest (call without holding any slot's lock).
    pub fn evict(&self, sink: &dyn Sink) {
        loop {
            let victim = {
                let t = self.table();
                if t.bytes <= TOTAL_BOUND {
                    return;
                }
                t.held.iter().min_by_key(|(_, h)| h.seq).map(|(i, _)| *i)
            };
            let Some(ino) = victim else { return };
            self.count(|c| c.evictions += 1);
            let _ = self.flush_ino(ino, sink);
        }
    }

    /// The error of a failed flush of `ino` not returned yet (cleared).
    pub fn take_error(&self, ino: u32) -> Option<Errno> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn t(sec: i64) -> Timestamp {
        Timestamp { sec, nsec: 7 }
    }

    fn model(b: &InodeBuf) -> Vec<(u64, Vec<u8>)> {
        b.ranges().map(|(o, d)| (o, d.to_vec())).collect()
    }

    #[test]
    fn appends_merge_into_one_range() {
        let mut b = InodeBuf::new(12, 100, 0o100644);
        for k in 0..10u64 {
            b.add(100 + k * 4096, &[k as u8; 4096], t(k as i64));
        }
        assert_eq!(b.range_count(), 1);
        assert_eq!(b.bytes(), 40960);
        assert_eq!(b.size, 100 + 40960);
        assert_eq!(b.writes(), 10);
        assert_eq!(b.mtime, t(9));
        let r = model(&b);
        assert_eq!(r[0].0, 100);
        assert_eq!(r[0].1[4096 * 3], 3);
    }

    #[test]
    fn overlaps_and_gaps_merge_as_a_byte_model() {
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut b = InodeBuf::new(12, 0, 0o100644);
        let mut m: Vec<Option<u8>> = vec![None; 1 << 16];
        for k in 0..400u64 {
            let off = next() % 60000;
            let len = 1 + next() % 3000;
            let len = len.min(m.len() as u64 - off);
            let byte = (k % 251) as u8;
            b.add(off, &vec![byte; len as usize], t(k as i64));
            for x in &mut m[off as usize..(off + len) as usize] {
                *x = Some(byte);
            }
        }
        // Ranges are disjoint, not adjacent, and hold the newest bytes.
        let mut got: Vec<Option<u8>> = vec![None; m.len()];
        let mut last_end = None;
        let mut bytes = 0;
        for (o, d) in b.ranges() {
            if let Some(e) = last_end {
                assert!(o > e, "range at {o} touches the one ending at {e}");
            }
            for (i, x) in d.iter().enumerate() {
                got[o as usize + i] = Some(*x);
            }
            last_end = Some(o + d.len() as u64);
            bytes += d.len();
        }
        assert_eq!(got, m);
        assert_eq!(bytes, b.bytes());
    }

    #[test]
    fn a_write_spanning_several_ranges_joins_them() {
        let mut b = InodeBuf::new(12, 0, 0o100644);
        b.add(0, b"aaaa", t(1));
        b.add(10, b"bbbb", t(2));
        b.add(20, b"cccc", t(3));
        assert_eq!(b.range_count(), 3);
        b.add(2, &[b'x'; 20], t(4));
        assert_eq!(model(&b), vec![(0, b"aaxxxxxxxxxxxxxxxxxxxxcc".to_vec())]);
        assert_eq!(b.bytes(), 24);
        // Adjacent on the left: joined too.
        b.add(30, b"dd", t(5));
        b.add(24, b"eeeeee", t(6));
        assert_eq!(b.range_count(), 1);
        assert_eq!(b.size, 32);
    }

    #[derive(Default)]
    struct Rec {
        calls: RefCell<Vec<String>>,
        fail_at: Option<u64>,
    }

    impl Sink for Rec {
        fn write(&self, ino: u32, off: u64, data: &[u8]) -> Result<u32, Errno> {
            if self.fail_at == Some(off) {
                return Err(Errno::EIO);
            }
            self.calls
                .borrow_mut()
                .push(format!("write {ino} {off} {}", data.len()));
            Ok(5)
        }
        fn set_times(&self, ino: u32, t: Timestamp) -> Result<u32, Errno> {
            self.calls
                .borrow_mut()
                .push(format!("times {ino} {}", t.sec));
            Ok(6)
        }
        fn changed(&self, ino: u32, tid: u32) {
            self.calls.borrow_mut().push(format!("tid {ino} {tid}"));
        }
    }

    /// A buffered write of `data` at `off` of `ino` by thread `pid`, as
    /// the mount makes it.
    fn put(w: &WriteBuffer, ino: u32, off: u64, data: &[u8], sec: i64, pid: u32) -> bool {
        let slot = w.slot(ino);
        let mut g = slot.lock();
        g.get_or_insert_with(|| InodeBuf::new(ino, 0, 0o100644))
            .add(off, data, t(sec));
        let over = w.note(ino, &g, Some(pid));
        drop(g);
        w.release(slot);
        over
    }

    #[test]
    fn flush_writes_ranges_then_times_and_empties() {
        let w = WriteBuffer::default();
        let sink = Rec::default();
        assert!(!w.any());
        w.flush_all(&sink).unwrap();
        assert!(sink.calls.borrow().is_empty(), "nothing buffered");
        put(&w, 12, 8192, &[1; 100], 3, 40);
        put(&w, 12, 0, &[2; 4096], 4, 40);
        assert!(w.holds(12));
        assert_eq!(w.last_of(40), Some(12));
        // Another inode's trigger does nothing.
        w.flush_ino(13, &sink).unwrap();
        assert!(sink.calls.borrow().is_empty());
        w.flush_ino(12, &sink).unwrap();
        assert_eq!(
            *sink.calls.borrow(),
            [
                "write 12 0 4096",
                "tid 12 5",
                "write 12 8192 100",
                "tid 12 5",
                "times 12 4",
                "tid 12 6"
            ]
        );
        assert!(!w.any());
        assert!(!w.holds(12));
        assert_eq!(w.last_of(40), None);
        assert_eq!(w.held(), (0, 0));
        assert!(w.table().slots.is_empty(), "an empty slot is forgotten");
        assert_eq!(
            w.counts(),
            Counts {
                buffered: 0,
                flushes: 1,
                ranges: 2,
                evictions: 0,
            }
        );
        // Flushed once: a second trigger writes nothing.
        w.flush_all(&sink).unwrap();
        assert_eq!(sink.calls.borrow().len(), 6);
    }

    #[test]
    fn several_inodes_are_held_and_flushed_oldest_first() {
        let w = WriteBuffer::default();
        let sink = Rec::default();
        put(&w, 20, 0, &[1; 10], 1, 1);
        put(&w, 21, 0, &[2; 20], 2, 2);
        put(&w, 22, 0, &[3; 30], 3, 3);
        // A later write does not move an inode back in the order.
        put(&w, 20, 100, &[1; 10], 4, 1);
        assert_eq!(w.held(), (3, 70));
        assert_eq!(w.totals(), (70, 4));
        // One inode's flush leaves the others buffered.
        w.flush_ino(21, &sink).unwrap();
        assert_eq!(w.held(), (2, 50));
        assert_eq!(w.last_of(2), None);
        assert_eq!(w.last_of(1), Some(20));
        sink.calls.borrow_mut().clear();
        w.flush_all(&sink).unwrap();
        let order: Vec<String> = sink
            .calls
            .borrow()
            .iter()
            .filter(|c| c.starts_with("write"))
            .cloned()
            .collect();
        assert_eq!(order, ["write 20 0 10", "write 20 100 10", "write 22 0 30"]);
        assert_eq!(w.held(), (0, 0));
    }

    #[test]
    fn past_the_total_bound_the_oldest_inode_is_evicted() {
        let w = WriteBuffer::default();
        let sink = Rec::default();
        let chunk = vec![7u8; TOTAL_BOUND / 4];
        for ino in 30..34u32 {
            assert!(!put(&w, ino, 0, &chunk, 1, ino), "at the bound, not over");
        }
        assert!(put(&w, 34, 0, &[1; 4096], 2, 34), "over the bound");
        w.evict(&sink);
        assert_eq!(w.held(), (4, TOTAL_BOUND / 4 * 3 + 4096));
        assert!(!w.holds(30), "the oldest went");
        assert!(w.holds(31) && w.holds(34));
        assert_eq!(w.counts().evictions, 1);
        assert_eq!(
            sink.calls.borrow()[0],
            format!("write 30 0 {}", TOTAL_BOUND / 4)
        );
    }

    /// A sink for several threads: the bytes of each inode as the engine
    /// would hold them, and a gate that holds flushes of one inode.
    #[derive(Default)]
    struct Disk {
        files: Mutex<HashMap<u32, Vec<u8>>>,
        hold: Mutex<Option<u32>>,
        held_now: std::sync::Condvar,
    }

    impl Sink for Disk {
        fn write(&self, ino: u32, off: u64, data: &[u8]) -> Result<u32, Errno> {
            let mut h = self.hold.lock().unwrap();
            while *h == Some(ino) {
                h = self.held_now.wait(h).unwrap();
            }
            drop(h);
            let mut f = self.files.lock().unwrap();
            let v = f.entry(ino).or_default();
            let end = off as usize + data.len();
            if v.len() < end {
                v.resize(end, 0);
            }
            v[off as usize..end].copy_from_slice(data);
            Ok(1)
        }
        fn set_times(&self, _ino: u32, _t: Timestamp) -> Result<u32, Errno> {
            Ok(1)
        }
        fn changed(&self, _ino: u32, _tid: u32) {}
    }

    #[test]
    fn threads_writing_several_inodes_interleaved_match_a_model() {
        let w = WriteBuffer::default();
        let disk = Disk::default();
        const FILE: usize = 1 << 20;
        // Each of 4 threads writes 2 inodes of its own, interleaved, plus
        // one inode all share (disjoint quarters), flushing now and then.
        let models: Vec<Vec<(u32, Vec<u8>)>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4u32)
                .map(|k| {
                    let (w, disk) = (&w, &disk);
                    sc.spawn(move || {
                        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(k);
                        let mut next = move || {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            rng
                        };
                        let own = [40 + 2 * k, 41 + 2 * k];
                        let mut m = vec![vec![0u8; FILE], vec![0u8; FILE], vec![0u8; FILE / 4]];
                        for step in 0..3000u64 {
                            let which = (next() % 3) as usize;
                            let (ino, base, span) = match which {
                                2 => (60, u64::from(k) * (FILE as u64 / 4), FILE as u64 / 4),
                                i => (own[i], 0, FILE as u64),
                            };
                            let len = 1 + next() % 8192;
                            let off = next() % (span - len);
                            let byte = (step % 251) as u8 + 1;
                            let data = vec![byte; len as usize];
                            if put(w, ino, base + off, &data, step as i64, k) {
                                w.evict(disk);
                            }
                            m[which][off as usize..(off + len) as usize].fill(byte);
                            match next() % 64 {
                                0 => w.flush_ino(ino, disk).unwrap(),
                                1 => w.flush_all(disk).unwrap(),
                                _ => {}
                            }
                        }
                        let shared = m.pop().unwrap_or_default();
                        let mut out: Vec<(u32, Vec<u8>)> = own.iter().copied().zip(m).collect();
                        out.push((60, shared));
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        w.flush_all(&disk).unwrap();
        assert!(!w.any());
        assert_eq!(w.held(), (0, 0));
        assert!(w.table().slots.is_empty());
        let files = disk.files.lock().unwrap();
        for (k, m) in models.iter().enumerate() {
            for (ino, want) in m {
                // Never written bytes read as zeros, as a hole does.
                let mut got = files.get(ino).cloned().unwrap_or_default();
                got.resize(FILE, 0);
                if *ino == 60 {
                    let q = FILE / 4;
                    assert!(
                        got[k * q..(k + 1) * q] == want[..],
                        "shared inode, quarter {k}"
                    );
                } else {
                    assert!(got == *want, "inode {ino}");
                }
            }
        }
    }

    #[test]
    fn a_flush_of_one_inode_does_not_block_writes_of_another() {
        let w = WriteBuffer::default();
        let disk = Disk::default();
        put(&w, 70, 0, &[1; 100], 1, 1);
        *disk.hold.lock().unwrap() = Some(70);
        std::thread::scope(|sc| {
            let flusher = sc.spawn(|| w.flush_ino(70, &disk));
            // The flush of 70 is held in the engine (its slot locked);
            // inode 71 is written, buffered and flushed meanwhile.
            while disk.files.lock().unwrap().contains_key(&70) {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            put(&w, 71, 0, &[2; 100], 2, 2);
            w.flush_ino(71, &disk).unwrap();
            assert_eq!(disk.files.lock().unwrap()[&71], vec![2; 100]);
            assert!(!disk.files.lock().unwrap().contains_key(&70));
            *disk.hold.lock().unwrap() = None;
            disk.held_now.notify_all();
            flusher.join().unwrap().unwrap();
        });
        assert_eq!(disk.files.lock().unwrap()[&70], vec![1; 100]);
        assert!(!w.any());
    }

    #[test]
    fn a_failed_flush_is_returned_once_by_the_next_fsync() {
        let w = WriteBuffer::default();
        let sink = Rec {
            fail_at: Some(4096),
            ..Rec::default()
        };
        put(&w, 12, 0, &[1; 10], 1, 1);
        put(&w, 12, 4096, &[1; 10], 2, 1);
        put(&w, 13, 0, &[1; 10], 3, 2);
        // A GETATTR's flush fails: the request goes on, the error waits.
        assert_eq!(w.flush_ino(12, &sink), Err(Errno::EIO));
        assert!(!w.holds(12));
        assert!(w.holds(13), "another inode stays buffered");
        assert_eq!(w.take_error(13), None);
        assert_eq!(w.take_error(12), Some(Errno::EIO));
        assert_eq!(w.take_error(12), None, "returned once");
    }

    #[test]
    fn room_keeps_twice_the_buffer_free() {
        let bs = 4096;
        // 4 MiB buffered in one range needs 1024 + 4 blocks, twice, plus
        // the margin.
        let need = 2 * (1024 + 4) + MARGIN_BLOCKS;
        assert!(room(need, bs, 4 << 20, 1, 0));
        assert!(!room(need - 1, bs, 4 << 20, 1, 0));
        assert!(!room(0, bs, 0, 0, 1));
        assert!(room(10_000, bs, 0, 0, 4096));
        // Many small ranges count their edge blocks.
        assert!(!room(
            2 * (1000 + 2002) + MARGIN_BLOCKS - 1,
            bs,
            0,
            1000,
            1000 * 4096
        ));
    }
}
