//! Per-inode locks of the operations layer (the lock order is in the
//! module docs of `fs.rs`, "Locking", and in `docs/ARCHITECTURE.md`).
//!
//! Two locks per inode, kept in one table (an entry exists only while
//! someone holds or waits for a lock of that inode, so memory follows the
//! inodes in use, not the filesystem's size):
//!
//! - the **call lock** ([`InodeLocks::call`]): exclusive, reentrant for
//!   the thread that holds it, held by a changing public call for its
//!   whole length (every handle of a write in chunks, every step of a
//!   truncate or a delete). The kernel's `i_rwsem` taken for writing.
//! - the **content lock** ([`InodeLocks::read`], [`InodeLocks::write`]):
//!   shared by readers of an inode's mapped structures (extent tree,
//!   directory blocks, xattr block) for one read, exclusive for a writer
//!   for one handle, so a reader sees the tree either before or after a
//!   handle's edits, never half of them, and waits at most for one handle,
//!   never for a whole long call. The kernel's `i_data_sem`. A writer
//!   waiting blocks new readers (no starvation); the thread holding the
//!   write side may read too.
//!
//! Both are plain waits on one condition variable: few threads (the
//! mount's workers), short critical sections. A release wakes the
//! condition variable only when a thread waits on it (counted under the
//! table's mutex): std's `notify_all` is a futex system call even with
//! nobody waiting, and nearly every release has nobody waiting (an untar
//! on the mount made ~5 of them per SETATTR).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::{self, ThreadId};

#[derive(Default)]
struct Entry {
    /// Holder of the call lock and its depth.
    call: Option<(ThreadId, u32)>,
    /// Readers of the content (thread, depth: a nested read by a reader
    /// never waits behind a queued writer, which waits for it).
    readers: Vec<(ThreadId, u32)>,
    /// Writer of the content and its depth.
    writer: Option<(ThreadId, u32)>,
    /// Writers waiting for the content (new readers wait behind them).
    writers_waiting: u32,
}

impl Entry {
    fn idle(&self) -> bool {
        self.call.is_none()
            && self.readers.is_empty()
            && self.writer.is_none()
            && self.writers_waiting == 0
    }
}

/// The lock table of one filesystem.
#[derive(Default)]
pub(crate) struct InodeLocks {
    map: Mutex<HashMap<u32, Entry>>,
    cv: Condvar,
    /// Threads in [`InodeLocks::wait`]; changed and read only with `map`
    /// locked (the atomic only makes it `Sync`), so a release that reads
    /// 0 has no waiter to miss: a waiter counts itself before the wait
    /// unlocks `map`.
    waiting: AtomicUsize,
}

impl std::fmt::Debug for InodeLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeLocks").finish_non_exhaustive()
    }
}

/// A held call lock of one inode (released on drop).
#[must_use = "the lock is released when the guard is dropped"]
pub struct InodeLock<'a> {
    locks: &'a InodeLocks,
    ino: u32,
    /// Held and released by one thread (the depth is per thread).
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for InodeLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InodeLock").field("ino", &self.ino).finish()
    }
}

/// How a [`ContentLock`] holds its inode.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    Read,
    /// A read by the thread that holds the write side: nothing taken.
    Nested,
    Write,
}

/// A held content lock (released on drop).
pub(crate) struct ContentLock<'a> {
    locks: &'a InodeLocks,
    ino: u32,
    hold: Hold,
    _not_send: PhantomData<*const ()>,
}

impl InodeLocks {
    fn table(&self) -> MutexGuard<'_, HashMap<u32, Entry>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'g>(
        &self,
        g: MutexGuard<'g, HashMap<u32, Entry>>,
    ) -> MutexGuard<'g, HashMap<u32, Entry>> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        g
    }

    /// Drop `ino`'s entry if nobody uses it any more, wake the waiters
    /// (if any).
    fn release(&self, mut g: MutexGuard<'_, HashMap<u32, Entry>>, ino: u32) {
        if g.get(&ino).is_some_and(Entry::idle) {
            g.remove(&ino);
        }
        let wake = self.waiting.load(Ordering::Relaxed) > 0;
        drop(g);
        if wake {
            self.cv.notify_all();
        }
    }

    /// Take `ino`'s call lock (waits; reentrant for this thread).
    pub(crate) fn call(&self, ino: u32) -> InodeLock<'_> {
        let me = thread::current().id();
        let mut g = self.table();
        loop {
            let e = g.entry(ino).or_default();
            match &mut e.call {
                None => {
                    e.call = Some((me, 1));
                    break;
                }
                Some((t, n)) if *t == me => {
                    *n += 1;
                    break;
                }
                Some(_) => g = self.wait(g),
            }
        }
        InodeLock {
            locks: self,
            ino,
            _not_send: PhantomData,
        }
    }

    /// Take the call locks of `inos` in ascending order (duplicates once).
    pub(crate) fn call_sorted(&self, inos: &[u32]) -> Vec<InodeLock<'_>> {
        let mut v = inos.to_vec();
        v.sort_unstable();
        v.dedup();
        v.into_iter().map(|i| self.call(i)).collect()
    }

    /// Share `ino`'s content for one read.
    pub(crate) fn read(&self, ino: u32) -> ContentLock<'_> {
        let me = thread::current().id();
        let mut g = self.table();
        loop {
            let e = g.entry(ino).or_default();
            match e.writer {
                Some((t, _)) if t == me => {
                    return ContentLock {
                        locks: self,
                        ino,
                        hold: Hold::Nested,
                        _not_send: PhantomData,
                    };
                }
                None => {
                    if let Some((_, n)) = e.readers.iter_mut().find(|(t, _)| *t == me) {
                        *n += 1;
                    } else if e.writers_waiting == 0 {
                        e.readers.push((me, 1));
                    } else {
                        g = self.wait(g);
                        continue;
                    }
                    return ContentLock {
                        locks: self,
                        ino,
                        hold: Hold::Read,
                        _not_send: PhantomData,
                    };
                }
                Some(_) => g = self.wait(g),
            }
        }
    }

    /// Own `ino`'s content (inside one handle; reentrant for this
    /// thread). The caller must not hold a read of it.
    pub(crate) fn write(&self, ino: u32) -> ContentLock<'_> {
        let me = thread::current().id();
        let mut g = self.table();
        let mut waiting = false;
        loop {
            let e = g.entry(ino).or_default();
            if let Some((t, n)) = &mut e.writer
                && *t == me
            {
                *n += 1;
                break;
            }
            if e.writer.is_none() && e.readers.is_empty() {
                e.writer = Some((me, 1));
                if waiting {
                    e.writers_waiting -= 1;
                }
                break;
            }
            if !waiting {
                e.writers_waiting += 1;
                waiting = true;
            }
            g = self.wait(g);
        }
        ContentLock {
            locks: self,
            ino,
            hold: Hold::Write,
            _not_send: PhantomData,
        }
    }

    /// Is `ino`'s call lock held by this thread? (debug checks)
    #[cfg(test)]
    pub(crate) fn holds_call(&self, ino: u32) -> bool {
        let me = thread::current().id();
        self.table()
            .get(&ino)
            .and_then(|e| e.call)
            .is_some_and(|(t, _)| t == me)
    }

    /// Entries in the table (tests: nothing is left behind).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table().len()
    }
}

impl Drop for InodeLock<'_> {
    fn drop(&mut self) {
        let mut g = self.locks.table();
        if let Some(e) = g.get_mut(&self.ino)
            && let Some((_, n)) = &mut e.call
        {
            *n -= 1;
            if *n == 0 {
                e.call = None;
            }
        }
        self.locks.release(g, self.ino);
    }
}

impl Drop for ContentLock<'_> {
    fn drop(&mut self) {
        if self.hold == Hold::Nested {
            return;
        }
        let mut g = self.locks.table();
        if let Some(e) = g.get_mut(&self.ino) {
            match self.hold {
                Hold::Read => {
                    let me = thread::current().id();
                    if let Some(k) = e.readers.iter().position(|(t, _)| *t == me) {
                        e.readers[k].1 -= 1;
                        if e.readers[k].1 == 0 {
                            e.readers.swap_remove(k);
                        }
                    }
                }
                Hold::Write => {
                    if let Some((_, n)) = &mut e.writer {
                        *n -= 1;
                        if *n == 0 {
                            e.writer = None;
                        }
                    }
                }
                Hold::Nested => {}
            }
        }
        self.locks.release(g, self.ino);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn call_lock_is_exclusive_and_reentrant() {
        let l = InodeLocks::default();
        let inside = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let _a = l.call(12);
                        let _b = l.call(12);
                        assert!(l.holds_call(12));
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn content_readers_share_writers_exclude() {
        let l = InodeLocks::default();
        let state = AtomicU32::new(0); // readers, or u32::MAX for a writer
        std::thread::scope(|s| {
            for t in 0..4 {
                let (l, state) = (&l, &state);
                s.spawn(move || {
                    for k in 0..300 {
                        if (k + t) % 3 == 0 {
                            let _w = l.write(5);
                            let _again = l.write(5);
                            let _nested = l.read(5);
                            assert_eq!(state.swap(u32::MAX, Ordering::SeqCst), 0);
                            std::thread::yield_now();
                            state.store(0, Ordering::SeqCst);
                        } else {
                            let _r = l.read(5);
                            let v = state.fetch_add(1, Ordering::SeqCst);
                            assert_ne!(v, u32::MAX);
                            std::thread::yield_now();
                            state.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn a_waiting_writer_is_not_starved_by_readers() {
        let l = InodeLocks::default();
        let r = l.read(7);
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let _w = l.write(7);
            });
            // Wait until the writer is queued, then a new reader must wait
            // behind it (it would starve it otherwise).
            while l.table().get(&7).is_none_or(|e| e.writers_waiting == 0) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let late = s.spawn(|| {
                let _r = l.read(7);
            });
            std::thread::sleep(Duration::from_millis(20));
            assert!(!late.is_finished());
            drop(r);
            w.join().unwrap();
            late.join().unwrap();
        });
        assert_eq!(l.len(), 0);
    }
}
