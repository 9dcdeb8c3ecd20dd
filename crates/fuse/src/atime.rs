//! Access times as the kernel's VFS keeps them for ext4 (`touch_atime`,
//! `atime_needs_update`, `relatime_need_update` in fs/inode.c), done by
//! the mount because the kernel's FUSE never updates an atime itself (its
//! inodes are `S_NOATIME`): a READ, READDIR(PLUS) or READLINK request
//! is an access of its inode.
//!
//! - `relatime` (default): updated when the atime is not newer than the
//!   mtime or the ctime, or is a day old; `strictatime`: at every access;
//!   `noatime`: never; `nodiratime`: never for directories; an inode with
//!   `chattr +A` (`EXT4_NOATIME_FL`) never; a read-only mount never.
//! - Each update is one engine transaction (`set_inode_attrs`, the atime
//!   only: no ctime change), as the kernel's `ext4_dirty_inode`; with
//!   `lazytime` the new atime is kept in memory (shown in every attribute
//!   reply) and written when the inode is fsynced, after
//!   [`LAZY_EXPIRE`] (the kernel's `dirtytime_expire_interval`), when
//!   [`LAZY_MAX`] inodes wait, and at unmount.
//!
//! What the kernel's FUSE page cache means for it: a read served from
//! cached pages sends no READ, so it is no access here. The mount keeps
//! a file's pages across opens (`FOPEN_KEEP_CACHE`) except when an open
//! for reading finds an atime update due: then the pages are dropped, so
//! the first read of that open reaches the mount and updates the atime.
//! What stays weaker than ext4: later reads through the same open file
//! that hit the cache (strictatime), a read of an empty file or at its
//! end (the kernel sends no READ), symlinks (the kernel caches their
//! targets: one READLINK), and with `-o writeback_cache` any read of
//! cached pages (the kernel keeps them at open there: seen on 6.18),
//! while the READ that fills a page for a partial write counts.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ext4kit_fs::fs::flags::NOATIME_FL;
use ext4kit_fs::inode::{InodeInfo, Timestamp};
use ext4kit_fs::rw::InodeAttrs;
use fuser::FopenFlags;

use crate::ops::FuseFs;
use crate::shared::Backend;

/// Which accesses update the atime (`relatime`, `strictatime`,
/// `noatime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    #[default]
    Relatime,
    Strict,
    Never,
}

/// The kernel's relatime window: an atime a day old is updated.
pub const RELATIME_WINDOW_SECS: i64 = 24 * 60 * 60;
/// How long a lazytime atime waits in memory at most (the kernel's
/// `dirtytime_expire_interval`, 12 hours).
pub const LAZY_EXPIRE: Duration = Duration::from_secs(12 * 60 * 60);
/// Inodes whose lazytime atime waits in memory at most (then all are
/// written): bounds the memory.
pub const LAZY_MAX: usize = 16_384;

/// Should an access at `now` of an inode with these times and flags
/// update its atime? (`atime_needs_update` with `relatime_need_update`.)
pub fn needs_update(mode: AtimeMode, nodiratime: bool, i: &InodeInfo, now: Timestamp) -> bool {
    if mode == AtimeMode::Never || i.flags & NOATIME_FL != 0 || (nodiratime && i.is_dir()) {
        return false;
    }
    if mode == AtimeMode::Relatime
        && i.mtime < i.atime
        && i.ctime < i.atime
        && now.sec.saturating_sub(i.atime.sec) < RELATIME_WINDOW_SECS
    {
        return false;
    }
    i.atime != now
}

/// Lazytime atimes not written yet: inode -> (generation, atime).
#[derive(Default)]
pub struct Pending {
    inner: Mutex<PendingInner>,
}

#[derive(Default)]
struct PendingInner {
    map: HashMap<u32, (u32, Timestamp)>,
    /// When the oldest waiting atime was set.
    since: Option<Instant>,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, PendingInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The waiting atime of inode `ino` of generation `generation` (never
    /// that of another inode that reuses the number).
    pub fn get(&self, ino: u32, generation: u32) -> Option<Timestamp> {
        match self.lock().map.get(&ino) {
            Some(&(g, t)) if g == generation => Some(t),
            _ => None,
        }
    }

    /// Keep `t` as the atime of `ino`; true when the waiting atimes
    /// should be written now (too many, or the oldest has waited long).
    fn set(&self, ino: u32, generation: u32, t: Timestamp) -> bool {
        let mut g = self.lock();
        g.map.insert(ino, (generation, t));
        let since = *g.since.get_or_insert_with(Instant::now);
        g.map.len() >= LAZY_MAX || since.elapsed() >= LAZY_EXPIRE
    }

    /// Forget the waiting atime of `ino` (an explicit one replaces it).
    pub fn discard(&self, ino: u32) {
        self.take(ino);
    }

    fn take(&self, ino: u32) -> Option<(u32, Timestamp)> {
        let mut g = self.lock();
        let v = g.map.remove(&ino);
        if g.map.is_empty() {
            g.since = None;
        }
        v
    }

    fn take_all(&self) -> Vec<(u32, u32, Timestamp)> {
        let mut g = self.lock();
        g.since = None;
        g.map
            .drain()
            .map(|(ino, (gen_, t))| (ino, gen_, t))
            .collect()
    }
}

impl FuseFs {
    /// The atime mode of the mount (`noatime` wins, then `strictatime`).
    fn atime_mode(&self) -> AtimeMode {
        let o = &self.s.opts;
        if o.noatime {
            AtimeMode::Never
        } else if o.strictatime {
            AtimeMode::Strict
        } else {
            AtimeMode::Relatime
        }
    }

    /// Is an atime update of `ino` due at an access now? (`None`: no
    /// read-write engine, or the inode is gone.)
    pub(crate) fn atime_due(&self, ino: u32) -> Option<(InodeInfo, Timestamp)> {
        if !matches!(self.s.backend, Backend::Rw(_)) || self.atime_mode() == AtimeMode::Never {
            return None;
        }
        let mut i = self.s.inode(ino).ok()?;
        if self.s.opts.lazytime
            && let Some(t) = self.s.atimes.get(ino, i.generation)
        {
            i.atime = t;
        }
        let now = ext4kit_fs::fs::now();
        needs_update(self.atime_mode(), self.s.opts.nodiratime, &i, now).then_some((i, now))
    }

    /// An access of `ino` (a READ, READDIR or READLINK about to be
    /// answered: a stat after it sees the new atime): its atime updated as
    /// the kernel's ext4 would. A failure is logged, never the request's.
    pub(crate) fn accessed(&self, ino: u32) {
        let Some((i, now)) = self.atime_due(ino) else {
            return;
        };
        if self.s.opts.lazytime {
            if self.s.atimes.set(ino, i.generation, now) {
                self.write_pending_atimes();
            }
            return;
        }
        self.write_atime(ino, now);
    }

    fn write_atime(&self, ino: u32, t: Timestamp) {
        let Backend::Rw(fs) = &self.s.backend else {
            return;
        };
        let attrs = InodeAttrs {
            atime: Some((t.sec, t.nsec)),
            ..InodeAttrs::default()
        };
        match fs.set_inode_attrs(ino, &attrs) {
            Ok(tid) => self.s.state().changed(ino, tid),
            Err(e) => tracing::debug!("atime of inode {ino}: {e}"),
        }
    }

    /// The waiting lazytime atime of `ino`, written (before its fsync).
    pub(crate) fn write_pending_atime(&self, ino: u32) {
        if let Some((g, t)) = self.s.atimes.take(ino) {
            self.write_if_same(ino, g, t);
        }
    }

    /// Every waiting lazytime atime, written (at unmount, on expiry).
    pub(crate) fn write_pending_atimes(&self) {
        for (ino, g, t) in self.s.atimes.take_all() {
            self.write_if_same(ino, g, t);
        }
    }

    /// Write `t` if `ino` is still the inode of generation `g` (not freed,
    /// not reused) and its atime is older.
    fn write_if_same(&self, ino: u32, g: u32, t: Timestamp) {
        match self.s.inode(ino) {
            Ok(i) if i.generation == g && i.atime < t => self.write_atime(ino, t),
            _ => {}
        }
    }

    /// The open flags for an open of `ino` with `flags`: the cached pages
    /// are dropped (no `FOPEN_KEEP_CACHE`) when the open may read and an
    /// atime update is due, so that the first read reaches the mount.
    pub(crate) fn atime_open_flags(&self, ino: u32, flags: i32, f: FopenFlags) -> FopenFlags {
        if flags & libc::O_ACCMODE == libc::O_WRONLY
            || !f.contains(FopenFlags::FOPEN_KEEP_CACHE)
            || self.atime_mode() == AtimeMode::Never
            || !matches!(self.s.backend, Backend::Rw(_))
        {
            return f;
        }
        // Buffered writes first: their mtime decides relatime.
        let _ = self.s.flush_ino(ino);
        match self.atime_due(ino) {
            Some(_) => f - FopenFlags::FOPEN_KEEP_CACHE,
            None => f,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(atime: i64, mtime: i64, ctime: i64, dir: bool, flags: u32) -> InodeInfo {
        let t = |sec| Timestamp { sec, nsec: 0 };
        InodeInfo {
            ino: 12,
            mode: if dir { 0o040755 } else { 0o100644 },
            uid: 0,
            gid: 0,
            size: 0,
            links: 1,
            flags,
            generation: 1,
            atime: t(atime),
            mtime: t(mtime),
            ctime: t(ctime),
            crtime: None,
            dtime: 0,
            blocks_512: 0,
            file_acl: 0,
            i_block: [0; 60],
            extra_isize: 32,
            version: 0,
            projid: 0,
            raw: Vec::new(),
        }
    }

    #[test]
    fn the_kernels_rules() {
        use AtimeMode::*;
        let now = Timestamp {
            sec: 1_000_000,
            nsec: 0,
        };
        let day = RELATIME_WINDOW_SECS;
        for (what, mode, nodir, i, want) in [
            (
                "atime older than mtime",
                Relatime,
                false,
                node(10, 20, 5, false, 0),
                true,
            ),
            (
                "atime equal to mtime",
                Relatime,
                false,
                node(20, 20, 5, false, 0),
                true,
            ),
            (
                "atime older than ctime",
                Relatime,
                false,
                node(10, 5, 20, false, 0),
                true,
            ),
            (
                "newer, recent",
                Relatime,
                false,
                node(999_000, 5, 5, false, 0),
                false,
            ),
            (
                "newer, a day old",
                Relatime,
                false,
                node(1_000_000 - day, 5, 5, false, 0),
                true,
            ),
            (
                "newer, just under a day",
                Relatime,
                false,
                node(1_000_001 - day, 5, 5, false, 0),
                false,
            ),
            (
                "in the future",
                Relatime,
                false,
                node(2_000_000, 5, 5, false, 0),
                false,
            ),
            (
                "strict, recent",
                Strict,
                false,
                node(999_000, 5, 5, false, 0),
                true,
            ),
            (
                "strict, in the future",
                Strict,
                false,
                node(2_000_000, 5, 5, false, 0),
                true,
            ),
            (
                "strict, equal to now",
                Strict,
                false,
                node(1_000_000, 5, 5, false, 0),
                false,
            ),
            ("noatime", Never, false, node(10, 20, 20, false, 0), false),
            (
                "nodiratime, a directory",
                Relatime,
                true,
                node(10, 20, 20, true, 0),
                false,
            ),
            (
                "nodiratime, a file",
                Relatime,
                true,
                node(10, 20, 20, false, 0),
                true,
            ),
            (
                "chattr +A",
                Strict,
                false,
                node(10, 20, 20, false, NOATIME_FL),
                false,
            ),
        ] {
            assert_eq!(needs_update(mode, nodir, &i, now), want, "{what}");
        }
    }

    #[test]
    fn pending_atimes_follow_the_generation() {
        let p = Pending::default();
        let t = Timestamp { sec: 50, nsec: 1 };
        assert!(!p.set(12, 7, t));
        assert_eq!(p.get(12, 7), Some(t));
        // Another inode reusing the number does not see it.
        assert_eq!(p.get(12, 8), None);
        assert_eq!(p.take(12), Some((7, t)));
        assert_eq!(p.take(12), None);
        for n in 0..LAZY_MAX as u32 - 1 {
            assert!(!p.set(n, 1, t));
        }
        assert!(p.set(u32::MAX, 1, t), "full: written");
        assert_eq!(p.take_all().len(), LAZY_MAX);
    }
}
