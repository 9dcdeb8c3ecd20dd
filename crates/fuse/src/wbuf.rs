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
//! - it holds [`INODE_BOUND`] bytes;
//! - a request reads or changes that inode's data or attributes (READ,
//!   GETATTR, an entry reply carrying its attributes, SETATTR, LSEEK,
//!   FALLOCATE, COPY_FILE_RANGE, FSYNC, FLUSH, the flag ioctls, xattr
//!   changes, link/unlink/rename);
//! - **any** other request changes the filesystem (create, mkdir,
//!   unlink, rename, setattr, xattrs, fallocate, copies, ioctls, a freed
//!   orphan, a WRITE of another inode, a write-through write), STATFS
//!   and FITRIM;
//! - the mount's one-second timer (before the journal's `commit=` tick)
//!   and the unmount.
//!
//! **One inode at a time**: a WRITE of another inode flushes the buffer
//! first, and so does every other change. So the engine receives every
//! change in the order the kernel was told it was done, and a crash
//! (power cut, `kill -9` of the daemon) loses a suffix of the
//! acknowledged, not-fsynced changes: those younger than the last flush
//! (at most a second, then the `commit=` interval as before), never an
//! older one while a younger survives (stronger than ext4's delayed
//! allocation, which orders nothing that was not fsynced). The cost is
//! that writers of several files at once take turns and get little
//! merging; single writers (postmark, fio, tar, cp) get all of it.
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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use ext4kit_fs::inode::Timestamp;
use fuser::Errno;

/// A buffer holding this many bytes is flushed.
pub const INODE_BOUND: usize = 4 << 20;
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
}

/// What the buffer holds, behind its lock.
#[derive(Debug, Default)]
pub struct Inner {
    /// The buffered inode's writes.
    pub cur: Option<InodeBuf>,
    /// Flush errors not yet returned by an fsync/FLUSH of their inode.
    errors: HashMap<u32, Errno>,
}

/// Counts since the mount (published in the status file).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Writes answered from the buffer.
    pub buffered: u64,
    /// Flushes that wrote something.
    pub flushes: u64,
    /// Engine writes the flushes made (one per range).
    pub ranges: u64,
}

/// The mount's write-behind buffer (see the module docs).
#[derive(Debug, Default)]
pub struct WriteBuffer {
    /// The buffered inode, 0 for none: read without the lock by every
    /// request that only needs to know whether its inode is buffered.
    /// Set under the lock, cleared under it once a flush has finished.
    ino: AtomicU32,
    inner: Mutex<Inner>,
    counts: Mutex<Counts>,
}

impl WriteBuffer {
    /// The buffered inode, if any (a hint outside the lock).
    pub fn buffered(&self) -> Option<u32> {
        match self.ino.load(Ordering::Acquire) {
            0 => None,
            i => Some(i),
        }
    }

    /// The lock (held across a buffered write and across a flush). Take
    /// it before any engine lock of the mount (`lock_inode`) and before
    /// the bookkeeping's `state`, never while holding them.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts since the mount.
    pub fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make `buf` the buffered inode (under the lock `g`).
    pub fn put(&self, g: &mut Inner, buf: InodeBuf) {
        self.ino.store(buf.ino, Ordering::Release);
        g.cur = Some(buf);
    }

    /// One write answered from the buffer.
    pub fn count_buffered(&self) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .buffered += 1;
    }

    /// Write what `g` holds to `sink` (ranges in file order, then the
    /// times of the last write) and empty it. An error is kept for the
    /// inode ([`WriteBuffer::take_error`]) and returned; the rest of its
    /// writes are dropped (as the kernel drops pages whose writeback
    /// failed).
    pub fn flush_locked(&self, g: &mut Inner, sink: &dyn Sink) -> Result<(), Errno> {
        let Some(buf) = g.cur.take() else {
            return Ok(());
        };
        let r = (|| {
            let mut n = 0;
            for (off, data) in buf.ranges() {
                let tid = sink.write(buf.ino, off, data)?;
                sink.changed(buf.ino, tid);
                n += 1;
            }
            if n > 0 {
                let tid = sink.set_times(buf.ino, buf.mtime)?;
                sink.changed(buf.ino, tid);
            }
            Ok(n)
        })();
        self.ino.store(0, Ordering::Release);
        match r {
            Ok(n) => {
                if n > 0 {
                    let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
                    c.flushes += 1;
                    c.ranges += n;
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    "inode {}: writing {} buffered bytes: {e:?} (returned by its next fsync)",
                    buf.ino,
                    buf.bytes
                );
                g.errors.insert(buf.ino, e);
                Err(e)
            }
        }
    }

    /// Flush if `ino` is the buffered inode.
    pub fn flush_ino(&self, ino: u32, sink: &dyn Sink) -> Result<(), Errno> {
        if self.buffered() != Some(ino) {
            return Ok(());
        }
        let mut g = self.lock();
        if g.cur.as_ref().is_some_and(|b| b.ino == ino) {
            self.flush_locked(&mut g, sink)?;
        }
        Ok(())
    }

    /// Flush whatever is buffered.
    pub fn flush_all(&self, sink: &dyn Sink) -> Result<(), Errno> {
        if self.buffered().is_none() {
            return Ok(());
        }
        let mut g = self.lock();
        self.flush_locked(&mut g, sink)
    }

    /// The error of a failed flush of `ino` not returned yet (cleared).
    pub fn take_error(&self, ino: u32) -> Option<Errno> {
        self.lock().errors.remove(&ino)
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

    #[test]
    fn flush_writes_ranges_then_times_and_empties() {
        let w = WriteBuffer::default();
        let sink = Rec::default();
        assert_eq!(w.buffered(), None);
        w.flush_all(&sink).unwrap();
        assert!(sink.calls.borrow().is_empty(), "nothing buffered");
        let mut g = w.lock();
        let mut b = InodeBuf::new(12, 0, 0o100644);
        b.add(8192, &[1; 100], t(3));
        b.add(0, &[2; 4096], t(4));
        w.put(&mut g, b);
        drop(g);
        assert_eq!(w.buffered(), Some(12));
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
        assert_eq!(w.buffered(), None);
        assert!(w.lock().cur.is_none());
        assert_eq!(
            w.counts(),
            Counts {
                buffered: 0,
                flushes: 1,
                ranges: 2
            }
        );
        // Flushed once: a second trigger writes nothing.
        w.flush_all(&sink).unwrap();
        assert_eq!(sink.calls.borrow().len(), 6);
    }

    #[test]
    fn a_failed_flush_is_returned_once_by_the_next_fsync() {
        let w = WriteBuffer::default();
        let sink = Rec {
            fail_at: Some(4096),
            ..Rec::default()
        };
        let mut g = w.lock();
        let mut b = InodeBuf::new(12, 0, 0o100644);
        b.add(0, &[1; 10], t(1));
        b.add(4096, &[1; 10], t(2));
        w.put(&mut g, b);
        drop(g);
        // A GETATTR's flush fails: the request goes on, the error waits.
        assert_eq!(w.flush_ino(12, &sink), Err(Errno::EIO));
        assert_eq!(w.buffered(), None);
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
