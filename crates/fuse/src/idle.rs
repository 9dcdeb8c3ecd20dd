//! The idle commit: what `sync(1)` cannot ask for.
//!
//! The kernel does not forward `sync(2)`/`syncfs(2)` to a `/dev/fuse`
//! server (`fuse_sync_fs` sends `FUSE_SYNCFS` only where `fc->sync_fs` is
//! set, i.e. virtiofs). What it does do is write its dirty pages back and
//! wait for the replies before `sync` returns, so when `sync` returns
//! every change it covers has reached the daemon. The mount therefore
//! commits as soon as it goes quiet: every change notes its end here
//! ([`IdleCommit::note`], an atomic store; the mutex only for the first
//! change after a commit), and the committer thread (`mount.rs`) sleeps
//! on the condvar until a change is pending and none came for
//! [`IDLE`], then flushes the write-behind buffer and commits; after a
//! commit it waits [`MIN_GAP`] before the next one. A steady stream of
//! requests (untar, postmark, a build) never pauses for 10 ms, so it
//! commits on the `commit=` timer and the log-space rule as before; a
//! workload that pauses gets at most one extra commit per pause, and at
//! most ten a second.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `ext4kit sync MOUNTPOINT`'s ioctl on a file or directory of the mount:
/// `_IO(0xE4, 1)`, ext4kit's own number (no argument; the kernel forwards
/// an ioctl it does not know to the FUSE server as a restricted one, its
/// size and direction taken from the number). The mount flushes the
/// write-behind buffer and commits before it replies.
pub const SYNC_IOCTL: u32 = 0xE4 << 8 | 1;

/// How long the mount must be quiet (no change ended) before it commits.
pub const IDLE: Duration = Duration::from_millis(10);

/// Least time between two idle commits.
pub const MIN_GAP: Duration = Duration::from_millis(100);

/// Changes noted since the last idle commit, and the committer's wake-up.
#[derive(Debug)]
pub struct IdleCommit {
    base: Instant,
    /// Nanoseconds from `base` to the end of the last change.
    last: AtomicU64,
    /// A change was noted since the committer last took them.
    pending: AtomicBool,
    /// Set by [`IdleCommit::stop`].
    stopped: Mutex<bool>,
    cv: Condvar,
    /// Idle commits made (status file).
    commits: AtomicU64,
    /// `ext4kit sync` requests served (status file).
    syncs: AtomicU64,
}

impl Default for IdleCommit {
    fn default() -> IdleCommit {
        IdleCommit {
            base: Instant::now(),
            last: AtomicU64::new(0),
            pending: AtomicBool::new(false),
            stopped: Mutex::new(false),
            cv: Condvar::new(),
            commits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        }
    }
}

impl IdleCommit {
    fn lock(&self) -> MutexGuard<'_, bool> {
        self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A change of the filesystem ended (it is in the engine, or in the
    /// write-behind buffer).
    pub fn note(&self) {
        self.last.store(self.now(), Ordering::Release);
        if !self.pending.swap(true, Ordering::AcqRel) {
            // The committer may be waiting for the first change: the
            // lock orders this wake-up after its check of `pending`.
            let _g = self.lock();
            self.cv.notify_all();
        }
    }

    /// Block until a change is pending and nothing changed for `idle`
    /// (then the pending changes are taken: the caller commits them), or
    /// until [`IdleCommit::stop`]. Whether to commit (false: stop).
    pub fn wait_idle(&self, idle: Duration) -> bool {
        let mut g = self.lock();
        loop {
            if *g {
                return false;
            }
            if !self.pending.load(Ordering::Acquire) {
                g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let quiet =
                Duration::from_nanos(self.now().saturating_sub(self.last.load(Ordering::Acquire)));
            if quiet >= idle {
                self.pending.store(false, Ordering::Release);
                self.commits.fetch_add(1, Ordering::Relaxed);
                return true;
            }
            g = self
                .cv
                .wait_timeout(g, idle - quiet)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sleep up to `d`; whether to stop.
    pub fn pause(&self, d: Duration) -> bool {
        let g = self.lock();
        let (g, _) = self
            .cv
            .wait_timeout_while(g, d, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }

    /// End the committer's waits.
    pub fn stop(&self) {
        *self.lock() = true;
        self.cv.notify_all();
    }

    /// Idle commits taken so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// An `ext4kit sync` ([`SYNC_IOCTL`]) was served.
    pub fn note_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// `ext4kit sync` requests served so far.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::thread;

    #[test]
    fn nothing_pending_waits_until_stopped() {
        let i = Arc::new(IdleCommit::default());
        let j = i.clone();
        let t = thread::spawn(move || j.wait_idle(Duration::ZERO));
        i.stop();
        assert!(!t.join().unwrap());
        assert_eq!(i.commits(), 0);
    }

    #[test]
    fn a_note_is_taken_once() {
        let i = Arc::new(IdleCommit::default());
        i.note();
        assert!(i.wait_idle(Duration::ZERO));
        assert_eq!(i.commits(), 1);
        // Taken: the next wait blocks until a new note (or stop).
        let j = i.clone();
        let t = thread::spawn(move || j.wait_idle(Duration::ZERO));
        i.note();
        assert!(t.join().unwrap());
        assert_eq!(i.commits(), 2);
        i.stop();
        assert!(!i.wait_idle(Duration::ZERO));
        assert!(i.pause(Duration::from_secs(60)));
    }
}
