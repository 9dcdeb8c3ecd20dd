//! What every FUSE worker thread shares: the engine (read-write, or the
//! read side for `ro` mounts) and the mount's bookkeeping (lookup counts,
//! open files, orphans, directory snapshots, the tid of each inode's last
//! change).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use ext4kit_format::jbd2::tid_gt;
use ext4kit_fs::FsError;
use ext4kit_fs::fs::Filesystem;
use ext4kit_fs::inode::InodeInfo;
use ext4kit_fs::sb::{Fs, Volume};
use fuser::{Errno, FileType};

use crate::attr::errno;
use crate::idle::IdleCommit;
use crate::options::MountOptions;
use crate::wbuf::{Sink, WriteBuffer};

/// The engine behind the mount (one per mount, never moved around: the
/// size difference of the variants does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    /// Read-write: the operations layer (journaled); shared with the
    /// online lazy-init worker.
    Rw(Arc<Filesystem>),
    /// Read-only (`-o ro`): the read side over the device, a dirty
    /// journal replayed in memory (or not at all with `norecovery`).
    /// The device lives as long as the process (leaked on purpose: a
    /// read-only mount has nothing to close).
    Ro(Volume<'static>),
}

impl Backend {
    /// Run `f` over the read side (the newest images when read-write).
    pub fn read<R>(&self, f: impl FnOnce(&Fs<'_>) -> R) -> R {
        match self {
            Backend::Rw(fs) => fs.read(f),
            Backend::Ro(v) => f(&v.fs()),
        }
    }

    /// Run `f` over the read side with inode `ino` read and its tree,
    /// directory and xattr blocks stable (read-write: under the engine's
    /// shared content lock, so a change in progress is never seen half
    /// done).
    pub fn read_inode<R>(
        &self,
        ino: u32,
        f: impl FnOnce(&Fs<'_>, &InodeInfo) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        match self {
            Backend::Rw(fs) => fs.read_locked(ino, f),
            Backend::Ro(v) => {
                let fs = v.fs();
                let i = fs.inode(ino)?;
                f(&fs, &i)
            }
        }
    }

    /// The read-write engine, or EROFS.
    pub fn rw(&self) -> Result<&Filesystem, Errno> {
        match self {
            Backend::Rw(fs) => Ok(fs),
            Backend::Ro(_) => Err(Errno::EROFS),
        }
    }

    /// The filesystem block size.
    pub fn block_size(&self) -> u32 {
        self.read(|f| f.info.block_size)
    }
}

/// One directory entry of a readdir snapshot.
#[derive(Clone, Debug)]
pub struct DirItem {
    pub ino: u32,
    pub name: Vec<u8>,
    pub kind: FileType,
}

/// An open file or directory.
#[derive(Debug)]
pub enum Handle {
    File {
        ino: u32,
        /// O_APPEND: every write goes to the end of the file.
        append: bool,
        /// Opened for writing: with the writeback cache the kernel may
        /// hold dirty pages of `ino` while such a handle is open (its
        /// close writes them back before the RELEASE).
        write: bool,
    },
    Dir {
        ino: u32,
        /// The entries as they were at the first readdir (offset 0):
        /// offsets are positions in it, so they stay valid however the
        /// directory changes meanwhile (POSIX leaves it open whether
        /// names added or removed after opendir/rewinddir show up).
        snap: Option<Arc<Vec<DirItem>>>,
    },
}

/// The mount's bookkeeping, behind one mutex.
#[derive(Debug, Default)]
pub struct State {
    /// FUSE lookup count per inode (entries replied minus forgets).
    pub lookups: HashMap<u32, u64>,
    /// Open handles per inode.
    pub open: HashMap<u32, u32>,
    /// Inodes unlinked while open (link count 0, on the orphan list):
    /// freed when neither an open handle nor a kernel reference is left,
    /// or at unmount.
    pub orphans: HashSet<u32>,
    pub handles: HashMap<u64, Handle>,
    pub next_fh: u64,
    /// The tid of each inode's last change (what fsync commits).
    pub tids: HashMap<u32, u32>,
    /// Every change is noted here for the idle commit (also
    /// [`Shared::idle`]).
    pub idle: Arc<IdleCommit>,
}

impl State {
    /// A new handle number.
    pub fn add_handle(&mut self, h: Handle) -> u64 {
        self.next_fh = self.next_fh.wrapping_add(1).max(1);
        while self.handles.contains_key(&self.next_fh) {
            self.next_fh = self.next_fh.wrapping_add(1).max(1);
        }
        let fh = self.next_fh;
        if let Handle::File { ino, .. } = &h {
            *self.open.entry(*ino).or_insert(0) += 1;
        }
        self.handles.insert(fh, h);
        fh
    }

    /// Close a handle; for a file, whether that was the last handle of an
    /// orphan the kernel no longer references (free it now).
    pub fn close_handle(&mut self, fh: u64) -> Option<u32> {
        let Some(Handle::File { ino, .. }) = self.handles.remove(&fh) else {
            return None;
        };
        let left = match self.open.get_mut(&ino) {
            Some(n) if *n > 1 => {
                *n -= 1;
                *n
            }
            _ => {
                self.open.remove(&ino);
                0
            }
        };
        (left == 0 && self.orphan_unreferenced(ino)).then_some(ino)
    }

    /// One more kernel reference to `ino` (an entry reply).
    pub fn looked_up(&mut self, ino: u32) {
        *self.lookups.entry(ino).or_insert(0) += 1;
    }

    /// The kernel dropped `n` references; whether `ino` is an orphan that
    /// nothing refers to any more (free it now).
    pub fn forget(&mut self, ino: u32, n: u64) -> Option<u32> {
        match self.lookups.get_mut(&ino) {
            Some(c) if *c > n => *c -= n,
            _ => {
                self.lookups.remove(&ino);
            }
        }
        (!self.open.contains_key(&ino) && self.orphan_unreferenced(ino)).then_some(ino)
    }

    fn orphan_unreferenced(&mut self, ino: u32) -> bool {
        if self.orphans.contains(&ino) && !self.lookups.contains_key(&ino) {
            self.orphans.remove(&ino);
            true
        } else {
            false
        }
    }

    /// Is `ino` open?
    pub fn is_open(&self, ino: u32) -> bool {
        self.open.contains_key(&ino)
    }

    /// Is `ino` open for writing (with the writeback cache: may the
    /// kernel hold dirty pages of it)? A walk of the handles: asked only
    /// by LSEEK with the writeback cache.
    pub fn is_open_for_writing(&self, ino: u32) -> bool {
        self.open.contains_key(&ino)
            && self
                .handles
                .values()
                .any(|h| matches!(h, Handle::File { ino: i, write: true, .. } if *i == ino))
    }

    /// Remember that `ino` changed in transaction `tid`.
    pub fn changed(&mut self, ino: u32, tid: u32) {
        self.tids.insert(ino, tid);
        self.idle.note();
    }

    /// Forget the tids that are durable already.
    pub fn prune_tids(&mut self, last_committed: u32) {
        self.tids.retain(|_, t| tid_gt(*t, last_committed));
    }
}

/// Requests of the kinds whose number the mount tries to keep low (the
/// round trips a workload pays for besides its own data), counted since
/// the mount; published in the status file (`ext4kit status --json`).
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub lookup: AtomicU64,
    pub getattr: AtomicU64,
    pub getxattr: AtomicU64,
    pub readdir: AtomicU64,
    pub readdirplus: AtomicU64,
}

impl RequestCounts {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts as JSON, with the write-behind buffer's (`wbuf`:
    /// writes answered from it, flushes, engine writes they made).
    pub fn to_json(&self, wbuf: &WriteBuffer) -> serde_json::Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let w = wbuf.counts();
        serde_json::json!({
            "lookup": g(&self.lookup),
            "getattr": g(&self.getattr),
            "getxattr": g(&self.getxattr),
            "readdir": g(&self.readdir),
            "readdirplus": g(&self.readdirplus),
            "wbuf": {
                "buffered_writes": w.buffered,
                "flushes": w.flushes,
                "flushed_ranges": w.ranges,
                "evictions": w.evictions,
            },
        })
    }
}

/// Everything the workers, the commit timer and the mount share.
pub struct Shared {
    pub backend: Backend,
    /// The mount's own bookkeeping. Held only briefly and never across
    /// an engine call, except inside the engine's `keep` callbacks of
    /// unlink and rename (lock order: the engine's inode locks, then
    /// `state`). Changing engine calls need no lock of the mount: each is
    /// atomic in the engine (its per-inode locks), also against the
    /// requests the kernel does not serialize (mmap writeback, release,
    /// forget).
    pub state: Mutex<State>,
    pub opts: MountOptions,
    /// Requests counted since the mount.
    pub requests: RequestCounts,
    pub block_size: u32,
    /// Largest file size (`ext4_max_size` for extent files: 2^32 - 1
    /// blocks).
    pub max_file: u64,
    /// The write-behind buffer of the default mount ([`crate::wbuf`]).
    pub wbuf: WriteBuffer,
    /// `lazytime` atimes not written yet ([`crate::atime`]).
    pub atimes: crate::atime::Pending,
    /// Changes waiting for the idle commit ([`crate::idle`]).
    pub idle: Arc<IdleCommit>,
    /// The session's notifier (set once the session is up): with the
    /// writeback cache, LSEEK has the kernel write back dirty pages
    /// through it first (see `FuseFs::lseek`).
    pub notifier: OnceLock<Arc<dyn Notify>>,
}

/// What the mount asks of the kernel unprompted, whichever transport
/// carries it (fuser's `Notifier`, or our own session's notify writes on
/// `/dev/fuse`, `crate::session`). Node ids are FUSE's (root 1).
pub trait Notify: Send + Sync {
    /// `FUSE_NOTIFY_INVAL_INODE`: drop the cached attributes of `ino`
    /// and its pages from `off` for `len` bytes (0: to the end; `off` < 0:
    /// the attributes only).
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> std::io::Result<()>;
    /// `FUSE_NOTIFY_INVAL_ENTRY`: drop the dentry `name` of `parent`.
    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()>;
}

impl Notify for fuser::Notifier {
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> std::io::Result<()> {
        fuser::Notifier::inval_inode(self, fuser::INodeNo(ino), off, len)
    }

    fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        fuser::Notifier::inval_entry(
            self,
            fuser::INodeNo(parent),
            std::ffi::OsStr::from_bytes(name),
        )
    }
}

/// The engine as the write-behind buffer's [`Sink`].
struct EngineSink<'a> {
    s: &'a Shared,
    fs: &'a Filesystem,
}

impl Sink for EngineSink<'_> {
    fn write(&self, ino: u32, off: u64, data: &[u8]) -> Result<u32, Errno> {
        crate::ops::retry(self.fs, || self.fs.write_at(ino, off, data)).map_err(|e| errno(&e))
    }

    fn set_times(&self, ino: u32, t: ext4kit_fs::inode::Timestamp) -> Result<u32, Errno> {
        let attrs = ext4kit_fs::rw::InodeAttrs {
            mtime: Some((t.sec, t.nsec)),
            ctime: Some((t.sec, t.nsec)),
            ..Default::default()
        };
        self.fs.set_inode_attrs(ino, &attrs).map_err(|e| errno(&e))
    }

    fn changed(&self, ino: u32, tid: u32) {
        self.s.state().changed(ino, tid);
    }

    /// Every range and the time in as few handles as the engine allows
    /// ([`Filesystem::write_ranges`]).
    fn write_buf(&self, buf: &crate::wbuf::InodeBuf) -> Result<u64, Errno> {
        let ranges: Vec<(u64, &[u8])> = buf.ranges().collect();
        if ranges.is_empty() {
            return Ok(0);
        }
        let t = Some((buf.mtime.sec, buf.mtime.nsec));
        let tid = crate::ops::retry(self.fs, || self.fs.write_ranges(buf.ino, &ranges, t))
            .map_err(|e| errno(&e))?;
        self.changed(buf.ino, tid);
        Ok(ranges.len() as u64)
    }
}

impl Shared {
    pub fn new(backend: Backend, opts: MountOptions) -> Shared {
        let block_size = backend.block_size();
        let state = State::default();
        let idle = state.idle.clone();
        Shared {
            backend,
            state: Mutex::new(state),
            opts,
            requests: RequestCounts::default(),
            block_size,
            max_file: (u64::from(u32::MAX)) * u64::from(block_size),
            wbuf: WriteBuffer::default(),
            atimes: crate::atime::Pending::default(),
            idle,
            notifier: OnceLock::new(),
        }
    }

    /// The engine as a flush target (`None` read-only: nothing is ever
    /// buffered there).
    fn sink(&self) -> Option<EngineSink<'_>> {
        match &self.backend {
            Backend::Rw(fs) => Some(EngineSink { s: self, fs }),
            Backend::Ro(_) => None,
        }
    }

    /// Flush `ino`'s buffered writes, if any (a request reads or changes
    /// its data or attributes). A failure is kept for the next
    /// fsync/FLUSH of `ino` and returned.
    pub fn flush_ino(&self, ino: u32) -> Result<(), Errno> {
        match self.sink() {
            Some(k) if self.wbuf.any() => self.wbuf.flush_ino(ino, &k),
            _ => Ok(()),
        }
    }

    /// Flush every buffered inode (any other change of the filesystem).
    /// A failure is kept for the inode's next fsync and not returned
    /// here: it is not this request's.
    pub fn flush_all(&self) {
        if !self.wbuf.any() {
            return;
        }
        if let Some(k) = self.sink() {
            let _ = self.wbuf.flush_all(&k);
        }
    }

    /// Flush the oldest buffered inodes while the buffer is over its
    /// total bound (holding no slot's lock).
    pub fn evict(&self) {
        if let Some(k) = self.sink() {
            self.wbuf.evict(&k);
        }
    }

    /// Make every change answered so far durable: the write-behind buffer
    /// to the engine, then a commit of the running transaction (the idle
    /// commit, FITRIM, `ext4kit sync`). Nothing to do read-only.
    pub fn commit_all(&self) -> Result<(), FsError> {
        let Backend::Rw(fs) = &self.backend else {
            return Ok(());
        };
        self.flush_all();
        fs.rw().journal().commit()?;
        let last = fs.rw().journal().last_committed();
        self.state().prune_tids(last);
        Ok(())
    }

    /// [`WriteBuffer::flush_locked`] on the engine, under a slot's lock.
    pub fn flush_locked(&self, g: &mut Option<crate::wbuf::InodeBuf>) -> Result<(), Errno> {
        match self.sink() {
            Some(k) => self.wbuf.flush_locked(g, &k),
            None => Ok(()),
        }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inode `ino` as the kernel may ask for it: also an orphan (link
    /// count 0, still open), never a freed inode.
    pub fn inode(&self, ino: u32) -> Result<InodeInfo, Errno> {
        match &self.backend {
            Backend::Rw(fs) => {
                let i = fs.inode_any(ino).map_err(|e| errno(&e))?;
                if i.links == 0 && !self.state().orphans.contains(&ino) {
                    return Err(Errno::ENOENT);
                }
                Ok(i)
            }
            Backend::Ro(v) => v.fs().inode(ino).map_err(|e| errno(&e)),
        }
    }

    /// Free the orphans still on the list (unmount: the kernel sends no
    /// forgets then). Returns how many failed.
    pub fn release_orphans(&self) -> Vec<(u32, FsError)> {
        let orphans: Vec<u32> = self.state().orphans.drain().collect();
        let mut failed = Vec::new();
        if let Backend::Rw(fs) = &self.backend {
            for ino in orphans {
                if let Err(e) = fs.release_orphan(ino) {
                    failed.push((ino, e));
                }
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_freed_after_last_close_and_forget() {
        let mut s = State::default();
        let a = s.add_handle(Handle::File {
            ino: 12,
            append: false,
            write: true,
        });
        let b = s.add_handle(Handle::File {
            ino: 12,
            append: false,
            write: true,
        });
        s.looked_up(12);
        s.orphans.insert(12);
        assert_eq!(s.close_handle(a), None);
        // Last close, but the kernel still holds the inode.
        assert_eq!(s.close_handle(b), None);
        assert_eq!(s.forget(12, 1), Some(12));
        assert!(s.orphans.is_empty());

        // Forget first, then the last close.
        let c = s.add_handle(Handle::File {
            ino: 13,
            append: false,
            write: true,
        });
        s.looked_up(13);
        s.orphans.insert(13);
        assert_eq!(s.forget(13, 1), None);
        assert_eq!(s.close_handle(c), Some(13));
        // Not an orphan: nothing to free.
        let d = s.add_handle(Handle::File {
            ino: 14,
            append: false,
            write: true,
        });
        assert_eq!(s.close_handle(d), None);
        assert!(s.open.is_empty() && s.handles.is_empty());
    }

    #[test]
    fn tids_pruned_when_durable() {
        let mut s = State::default();
        s.changed(12, 5);
        s.changed(13, 7);
        s.prune_tids(5);
        assert!(!s.tids.contains_key(&12));
        assert_eq!(s.tids.get(&13), Some(&7));
    }
}
