//! The operations of the mount: every FUSE request turned into engine
//! calls, with the errno kernel ext4 would return. One `op_*` method of
//! [`FuseFs`] per request, with plain arguments and answers (no
//! transport's reply types): [`crate::fuser_fs`] adapts fuser to them.
//!
//! Permissions are checked by the kernel (`default_permissions`, and
//! POSIX ACLs with `FUSE_POSIX_ACL`), as for a local filesystem; new
//! inodes get their owner, group (`S_ISGID` directories) and mode/ACLs
//! (`posix_acl_create`, umask only without a default ACL) here, as
//! `ext4_new_inode` gives them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ext4kit_format::acl;
use ext4kit_format::inode::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG};
use ext4kit_format::xattr as fx;
use ext4kit_fs::FsError;
use ext4kit_fs::file::Content;
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode, RenameFlags as EngineRename, SetAttr, Times};
use ext4kit_fs::inode::InodeInfo;
use ext4kit_fs::rw::InodeAttrs;
use ext4kit_fs::xattr_write::{self as xw, SetMode};
use fuser::{Errno, FileType, FopenFlags, INodeNo};

pub use crate::attr::Attr;
use crate::attr::{
    attr_of, decode_rdev, dirent_type, errno, ext4_ino, file_type, fuse_ino, setattr_time,
    xattr_errno,
};
use crate::shared::{Backend, DirItem, Handle, RequestCounts, Shared};
use crate::wbuf::{self, InodeBuf};

/// How long the kernel may cache attributes and names. The mount is the
/// only writer of the image (the device is open exclusively, and nothing
/// the daemon does on its own changes a name or an attribute the kernel
/// caches: online lazy init, discards and orphan freeing touch no linked
/// inode), and the kernel invalidates what its own requests change (the
/// inode and directory of a create, unlink, rename or link, the attributes
/// after a write, setattr, setxattr, fallocate or copy), so a cached entry
/// stays right until the kernel drops it. A long TTL saves a LOOKUP for
/// every open of a name last looked up more than the TTL ago, and a
/// GETATTR per stat. (One thing it can show late: `st_blocks` of a file
/// whose deep extent tree a sync repacked, `Filesystem::tidy_trees`.)
pub const TTL: Duration = Duration::from_secs(3600);

const S_ISGID: u16 = 0o2000;
const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;
const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;
const SEEK_DATA: i32 = 3;
const SEEK_HOLE: i32 = 4;
/// `EXT4_NAME_LEN`.
const NAME_MAX: usize = 255;
/// copy_file_range moves data through the engine in pieces of this size.
const COPY_CHUNK: u64 = 8 << 20;
/// The most one copy_file_range answers (the reply's count is 32 bits;
/// the caller loops for the rest, as after a short write).
const COPY_MAX: u64 = (u32::MAX as u64) & !0xfff;

/// The filesystem served to the kernel.
#[derive(Clone)]
pub struct FuseFs {
    pub(crate) s: Arc<Shared>,
    /// The kernel's writeback cache is on (negotiated at INIT): it keeps
    /// size and times and turns `O_APPEND` writes into positioned ones,
    /// so the offset of a WRITE is always where the data goes.
    writeback: bool,
    /// `FUSE_HANDLE_KILLPRIV_V2` is on (negotiated at INIT): set-user-ID
    /// and set-group-ID are cleared here (see [`FuseFs::kill_suid_sgid`]).
    killpriv: bool,
}

impl FuseFs {
    pub fn new(s: Arc<Shared>) -> FuseFs {
        FuseFs {
            s,
            writeback: false,
            killpriv: false,
        }
    }
}

type R<T> = Result<T, Errno>;

/// What a new inode is.
#[derive(Clone, Copy)]
/// What [`Ops::buffer_write`] did with a write.
enum Buffered {
    /// Buffered: the bytes answered as written.
    Done(u32),
    /// To be written through, at this offset (O_APPEND resolved).
    Through(u64),
}

enum Make<'a> {
    Node { mode: u32, rdev: u32 },
    Dir { mode: u32 },
    Symlink { target: &'a [u8] },
}

fn name_ok(name: &OsStr) -> R<&[u8]> {
    let n = name.as_bytes();
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok(n)
}

/// Run an engine change; a shortage of space that only blocks freed by
/// a transaction still committing explain is retried after a commit.
pub(crate) fn retry<T>(
    fs: &Filesystem,
    mut f: impl FnMut() -> Result<T, FsError>,
) -> Result<T, FsError> {
    for _ in 0..2 {
        match f() {
            Err(FsError::SpaceBusy { .. }) => fs.sync()?,
            r => return r,
        }
    }
    f()
}

impl FuseFs {
    fn attr(&self, i: &InodeInfo) -> Attr {
        let mut a = attr_of(i, self.s.block_size);
        // A lazytime atime not written yet is the inode's atime.
        if self.s.opts.lazytime
            && let Some(t) = self.s.atimes.get(i.ino, i.generation)
        {
            a.atime = crate::attr::system_time(t);
        }
        a
    }

    /// A LOOKUP-like answer: one more kernel reference to `i`.
    fn entry(&self, i: &InodeInfo) -> Entry {
        self.s.state().looked_up(i.ino);
        self.entry_of(i)
    }

    fn entry_of(&self, i: &InodeInfo) -> Entry {
        Entry {
            attr: self.attr(i),
            generation: u64::from(i.generation),
            volatile: false,
        }
    }

    /// `e`, named in directory `parent` (see [`Entry::volatile`]).
    fn in_dir(&self, e: Entry, parent: u64) -> Entry {
        Entry {
            volatile: self.volatile_names(parent),
            ..e
        }
    }

    /// Whether names in directory `dir` are casefolded. The kernel's
    /// dcache compares names byte for byte (FUSE has no casefolding
    /// dentry operations), so each spelling is a dentry of its own: a
    /// cached "a" would outlive the rename or unlink of "A", a negative
    /// "a" the create of "A". Their entries are valid for 0 s (their
    /// attributes for the usual TTL).
    fn volatile_names(&self, dir: u64) -> bool {
        if !self.s.backend.read(|f| f.info.casefold.is_some()) {
            return false;
        }
        ext4_ino(INodeNo(dir))
            .and_then(|d| self.s.inode(d))
            .is_ok_and(|d| d.flags & ext4kit_fs::fs::flags::CASEFOLD_FL != 0)
    }

    /// The flags of an open file: the page cache kept across opens (the
    /// mount is the only writer), and no FLUSH at close: it would do
    /// nothing here (close(2) does not sync on ext4 either), and without
    /// the writeback cache the kernel then skips the round trip (with it,
    /// close writes dirty pages back anyway and sends the FLUSH).
    fn open_flags(&self) -> FopenFlags {
        FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
    }

    /// The flags of a file opened (OPEN, CREATE) with open(2) `flags`:
    /// [`Self::open_flags`], plus `FOPEN_DIRECT_IO` for a write-only
    /// open ([`Self::direct_write`]).
    fn file_flags(&self, flags: i32) -> FopenFlags {
        if self.direct_write(flags) {
            self.open_flags() | FopenFlags::FOPEN_DIRECT_IO
        } else {
            self.open_flags()
        }
    }

    /// A file opened write-only (`flags`: open(2)'s, or a WRITE's, which
    /// carry the file's) is served with `FOPEN_DIRECT_IO` under killpriv
    /// v2 without the writeback cache. Why: the kernel's cached write
    /// path (`fuse_cache_write_iter` → `kiocb_modified` →
    /// `file_remove_privs`) asks a GETXATTR of `security.capability`
    /// unless the inode is `S_NOSEC`, and every attribute refresh (the
    /// CREATE's reply among them, `fuse_change_attributes_common`)
    /// clears `S_NOSEC`: one GETXATTR per file that tar writes. The
    /// direct path (`fuse_direct_write_iter`) makes no such check; it
    /// marks the WRITE `FUSE_WRITE_KILL_SUIDGID` for a caller without
    /// CAP_FSETID and leaves the rest to the server, so a WRITE of such a
    /// handle removes `security.capability` here
    /// ([`Self::kill_capability`]) and commits when it carries O_DSYNC
    /// (the direct path sends no FSYNC for O_SYNC, O_DSYNC, RWF_DSYNC or
    /// a `sync` mount). Write-only only: such a handle reads nothing and
    /// cannot be mmapped (mmap needs read access), so the page cache
    /// loses nothing but the written pages (the direct write drops them
    /// for other opens, `invalidate_inode_pages2_range`).
    fn direct_write(&self, flags: i32) -> bool {
        self.killpriv && !self.writeback && flags & libc::O_ACCMODE == libc::O_WRONLY
    }

    /// Remove `security.capability` of `ino` before a write of a direct
    /// handle ([`Self::direct_write`]), as ext4's write does
    /// (`file_remove_privs`: any caller, root too). One read of the
    /// inode's xattrs when there is none.
    fn kill_capability(&self, ino: u32) -> R<()> {
        const CAPS: &[u8] = b"security.capability";
        let has = self
            .s
            .backend
            .read_inode(ino, |f, i| f.xattrs(i))
            .map_err(|e| errno(&e))?
            .iter()
            .any(|a| a.name == CAPS);
        if has {
            match self.xattr_set(ino, CAPS, None, 0) {
                Ok(()) | Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The flags of an open directory: the kernel keeps the listing it
    /// read (`FOPEN_CACHE_DIR`, kept across opens with
    /// `FOPEN_KEEP_CACHE`) and answers the next readdir of the directory
    /// from it, without a READDIR(PLUS). It drops the listing itself
    /// when it changes the directory (create, unlink, rename, link, mkdir,
    /// rmdir, symlink, mknod bump its i_version) or sees another mtime;
    /// the daemon is the only writer and changes no name on its own, and
    /// the one change the kernel does not see as a change of the directory,
    /// the ".." of a directory moved to another parent, is notified
    /// (`do_rename`). Besides the READDIRPLUS saved, a cached listing does
    /// not refresh its entries' attributes, and with them forget their
    /// POSIX ACLs the kernel cached (`fuse_direntplus_link`): a second
    /// `rsync -A` asks no GETXATTR.
    ///
    /// A listing answered from the cache reaches no `accessed` here, so
    /// when a readdir would update the directory's atime now (always
    /// with `strictatime`; with `relatime` when the atime is older than
    /// the mtime or ctime, or a day old) the listing is dropped instead of
    /// kept (no `FOPEN_KEEP_CACHE`: the kernel invalidates it at this
    /// open), and this open's readdir reaches the daemon and its atime.
    fn dir_flags(&self, ino: u32) -> FopenFlags {
        if self.atime_due(ino).is_some() {
            FopenFlags::FOPEN_CACHE_DIR
        } else {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        }
    }

    fn fs(&self) -> R<&Filesystem> {
        self.s.backend.rw()
    }

    /// Before `ino`'s data or attributes are answered: its buffered
    /// writes go to the engine (a failure is its next fsync's).
    fn settle(&self, ino: u32) {
        let _ = self.s.flush_ino(ino);
    }

    fn dir(&self, ino: u32) -> R<InodeInfo> {
        let d = self.s.inode(ino)?;
        if !d.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(d)
    }

    fn do_lookup(&self, parent: INodeNo, name: &OsStr) -> R<InodeInfo> {
        let name = name_ok(name)?;
        let d = self.dir(ext4_ino(parent)?)?;
        let e = self
            .s
            .backend
            .read_inode(d.ino, |f, d| f.lookup(d, name))
            .map_err(|e| errno(&e))?
            .ok_or(Errno::ENOENT)?;
        self.settle(e.ino);
        self.s.inode(e.ino)
    }

    fn fire_orphan(&self, ino: Option<u32>) {
        let Some(ino) = ino else { return };
        self.s.flush_all();
        if let Backend::Rw(fs) = &self.s.backend
            && let Err(e) = fs.release_orphan(ino)
        {
            tracing::warn!("freeing unlinked inode {ino}: {e}");
        }
        self.s.idle.note();
    }

    /// Create an inode `name` in `parent` as `ext4_new_inode` would:
    /// owner from the caller, group from an `S_ISGID` parent, mode and
    /// ACLs from the parent's default ACL (else the umask).
    /// Mode, owner and group of a new inode of `mode` in directory `p`
    /// (`pino`), and the ACLs it inherits from `p`'s default ACL (else the
    /// umask applies): the caller's uid, the group of a set-group-ID
    /// parent (a directory inheriting the bit), else the caller's gid.
    #[allow(clippy::too_many_arguments)]
    fn new_inode(
        &self,
        req: &Caller,
        pino: u32,
        p: &InodeInfo,
        mode: u16,
        is_dir: bool,
        is_link: bool,
        umask: u32,
    ) -> R<(NewInode, acl::Inherited)> {
        let default = if p.file_acl != 0 || p.extra_isize > 0 {
            let attrs = self
                .s
                .backend
                .read_inode(pino, |f, p| f.xattrs(p))
                .map_err(|e| errno(&e))?;
            xw::get_acl(&attrs, xw::AclKind::Default).map_err(|e| xattr_errno(&e))?
        } else {
            None
        };
        let inh = acl::inherit(
            default.as_deref(),
            mode,
            is_dir,
            is_link,
            umask as u16 & 0o777,
        );
        let mut mode = inh.mode;
        let gid = if p.mode & S_ISGID != 0 {
            if is_dir {
                mode |= S_ISGID;
            }
            p.gid
        } else {
            req.gid
        };
        Ok((NewInode::new(mode, req.uid, gid), inh))
    }

    fn make(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        umask: u32,
        what: Make<'_>,
    ) -> R<InodeInfo> {
        let fs = self.fs()?;
        self.s.flush_all();
        let name = name_ok(name)?;
        let pino = ext4_ino(parent)?;
        let p = self.dir(pino)?;
        let (mode, is_dir, is_link) = match what {
            Make::Node { mode, .. } => {
                let m = mode as u16;
                let m = if m & S_IFMT == 0 { m | S_IFREG } else { m };
                (m, false, false)
            }
            Make::Dir { mode } => (S_IFDIR | (mode as u16 & 0o7777), true, false),
            Make::Symlink { .. } => (S_IFLNK | 0o777, false, true),
        };
        let (mut spec, inh) = self.new_inode(req, pino, &p, mode, is_dir, is_link, umask)?;
        let mode = spec.mode;
        if let Make::Node { rdev, .. } = what
            && matches!(mode & S_IFMT, S_IFCHR | S_IFBLK)
        {
            spec.rdev = Some(decode_rdev(rdev));
        }
        let made = retry(fs, || match what {
            Make::Node { .. } => fs.create(pino, name, &spec),
            Make::Dir { .. } => fs.mkdir(pino, name, &spec),
            Make::Symlink { target } => fs.symlink(pino, name, target, &spec),
        });
        let (mut i, tid) = made.map_err(|e| errno(&e))?;
        let mut st_tid = tid;
        let mut acl_set = false;
        for (xname, entries) in [
            (&b"system.posix_acl_access"[..], inh.access),
            (b"system.posix_acl_default", inh.default),
        ] {
            let Some(entries) = entries else { continue };
            acl_set = true;
            let v = acl::to_xattr(&entries);
            match fs.set_xattr(i.ino, xname, Some(&v), SetMode::Any) {
                Ok(t) => st_tid = t,
                Err(e) => {
                    // As ext4, which makes the inode and its ACLs in one
                    // transaction: no inode without its inherited ACL.
                    let undo = if is_dir {
                        fs.rmdir(pino, name)
                    } else {
                        fs.unlink(pino, name)
                    };
                    if let Err(u) = undo {
                        tracing::warn!("removing {:?} after a failed ACL: {u}", i.ino);
                    }
                    return Err(xattr_errno(&e));
                }
            }
        }
        if acl_set {
            // Setting the ACL changed the ctime (often in the same
            // transaction): the reply must carry the inode as it is now,
            // or the kernel caches (and with the writeback cache writes
            // back) the older ctime.
            i = self.s.inode(i.ino)?;
        }
        let mut st = self.s.state();
        st.changed(i.ino, st_tid);
        st.changed(pino, tid);
        Ok(i)
    }

    fn do_setattr(&self, ino: INodeNo, a: SetArgs) -> R<InodeInfo> {
        let fs = self.fs()?;
        self.s.flush_all();
        let ino = ext4_ino(ino)?;
        if let Some(size) = a.size
            && size > self.s.max_file
        {
            return Err(Errno::EFBIG);
        }
        let conv = |t: Option<SetTime>| {
            t.map(|t| match t {
                SetTime::At(t) => setattr_time(t),
                SetTime::Now => ext4kit_fs::fs::now(),
            })
        };
        let times = Times {
            atime: conv(a.atime),
            mtime: conv(a.mtime),
            ctime: a.ctime.map(setattr_time),
            crtime: None,
        };
        let any_time = times.atime.is_some() || times.mtime.is_some() || times.ctime.is_some();
        let mut sa = SetAttr {
            mode: a.mode.map(|m| m as u16 & 0o7777),
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            times: any_time.then_some(times),
        };
        // The mode read for `kill` and the change are one change of `ino`.
        let _g = fs.lock_inode(ino);
        if a.kill {
            sa.mode = killed_perm(self.s.inode(ino)?.mode);
        }
        // An unlinked open file (link count 0) too: fchmod, fchown,
        // futimens on it work on ext4 (and a chmod keeps its ACL in step).
        let tid = retry(fs, || fs.setattr(ino, &sa)).map_err(|e| errno(&e))?;
        self.s.state().changed(ino, tid);
        self.s.inode(ino)
    }

    /// Clear set-user-ID, and set-group-ID when group-executable, of
    /// regular file `ino` (ctime now), where the kernel leaves it to the
    /// mount (`FUSE_HANDLE_KILLPRIV_V2`): a WRITE with
    /// `FUSE_WRITE_KILL_SUIDGID` (a caller without CAP_FSETID), and a
    /// fallocate or copy_file_range into it by a caller other than root
    /// (the kernel's `file_modified` asks for it there too, and leaves it
    /// undone under killpriv). One inode read when no bit is set.
    fn kill_suid_sgid(&self, ino: u32) -> R<()> {
        if !self.killpriv {
            return Ok(());
        }
        let fs = self.fs()?;
        // The mode read and its change are one change of `ino`.
        let _g = fs.lock_inode(ino);
        let Some(perm) = killed_perm(self.s.inode(ino)?.mode) else {
            return Ok(());
        };
        let now = ext4kit_fs::fs::now();
        let attrs = InodeAttrs {
            perm: Some(perm),
            ctime: Some((now.sec, now.nsec)),
            ..InodeAttrs::default()
        };
        let tid = fs.set_inode_attrs(ino, &attrs).map_err(|e| errno(&e))?;
        self.s.state().changed(ino, tid);
        Ok(())
    }

    fn read_data(&self, ino: u32, off: u64, size: u32) -> R<Vec<u8>> {
        self.settle(ino);
        let i = self.s.inode(ino)?;
        if i.is_dir() {
            return Err(Errno::EISDIR);
        }
        if off >= i.size {
            return Ok(Vec::new());
        }
        let len = (i.size - off).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        let n = match &self.s.backend {
            Backend::Rw(fs) => fs.read_at(ino, off, &mut buf),
            Backend::Ro(v) => {
                let f = v.fs();
                f.content(&i).and_then(|c| f.read_at(&i, &c, off, &mut buf))
            }
        }
        .map_err(|e| errno(&e))?;
        buf.truncate(n);
        Ok(buf)
    }

    /// A WRITE: into the write-behind buffer ([`crate::wbuf`]) when it
    /// may be, else to the engine. `kill`: the kernel asks for
    /// set-user-ID/set-group-ID to be cleared (killpriv v2); `flags`: the
    /// file's open flags as the kernel passes them (O_DSYNC also for
    /// RWF_DSYNC and a `sync` mount).
    #[allow(clippy::too_many_arguments)]
    fn do_write(
        &self,
        ino: u32,
        fh: u64,
        off: u64,
        data: &[u8],
        kill: bool,
        flags: i32,
        pid: Option<u32>,
    ) -> R<u32> {
        let _ = self.fs()?;
        let through = self.writeback
            || self.s.opts.sync
            || flags & (libc::O_DIRECT | libc::O_DSYNC) != 0
            || data.len() >= wbuf::BIG_WRITE;
        if through {
            // What is buffered was answered first: it goes first.
            self.s.flush_all();
            if kill {
                self.kill_suid_sgid(ino)?;
            }
            return self.write_through(ino, fh, off, data);
        }
        // One thread's writes reach the engine in its order: its buffered
        // writes of another inode go first.
        if let Some(prev) = pid.and_then(|p| self.s.wbuf.last_of(p))
            && prev != ino
        {
            let _ = self.s.flush_ino(prev);
        }
        let slot = self.s.wbuf.slot(ino);
        let mut g = slot.lock();
        let r = self.buffer_write(&mut g, ino, fh, off, data, kill);
        // A buffer that took no write is dropped (it must not keep a size
        // for later writes).
        if g.as_ref().is_some_and(|b| b.writes() == 0) {
            *g = None;
        }
        let over = self.s.wbuf.note(ino, &g, pid);
        drop(g);
        self.s.wbuf.release(slot);
        if over {
            self.s.evict();
        }
        match r? {
            Buffered::Done(n) => Ok(n),
            Buffered::Through(off) => {
                // Everything buffered was answered first: it goes first
                // (and a shortage of space is then this write's).
                self.s.flush_all();
                self.write_through(ino, fh, off, data)
            }
        }
    }

    /// [`Self::do_write`] under `ino`'s slot lock `g`: buffered, or to be
    /// written through (at the offset given) once the lock is dropped.
    fn buffer_write(
        &self,
        g: &mut Option<InodeBuf>,
        ino: u32,
        fh: u64,
        off: u64,
        data: &[u8],
        kill: bool,
    ) -> R<Buffered> {
        let fs = self.fs()?;
        // The inode as the buffer starts from: an immutable one, or a
        // journal that refuses changes, gets the engine's answer.
        let fresh = |g: &mut Option<InodeBuf>| -> R<bool> {
            if g.is_none() {
                let i = self.s.inode(ino)?;
                if i.flags & ext4kit_fs::fs::flags::IMMUTABLE_FL != 0
                    || !i.is_regular()
                    || fs.rw().journal().aborted().is_some()
                {
                    return Ok(false);
                }
                *g = Some(InodeBuf::new(ino, i.size, i.mode));
            }
            Ok(true)
        };
        if !fresh(g)? {
            if kill {
                self.kill_suid_sgid(ino)?;
            }
            return Ok(Buffered::Through(off));
        }
        if kill && g.as_ref().is_some_and(|b| killed_perm(b.mode).is_some()) {
            // At once: the buffered writes, then the mode, then this
            // write into a buffer that starts from the new mode (a failed
            // flush is the next fsync's error, not this write's).
            let _ = self.s.flush_locked(g);
            self.kill_suid_sgid(ino)?;
            if !fresh(g)? {
                return Ok(Buffered::Through(off));
            }
        }
        let append = matches!(
            self.s.state().handles.get(&fh),
            Some(Handle::File { append: true, .. })
        );
        let (bytes, ranges) = self.s.wbuf.totals();
        let Some(buf) = g.as_mut() else {
            return Err(Errno::EIO);
        };
        let off = if append { buf.size } else { off };
        if off >= self.s.max_file && !data.is_empty() {
            return Err(Errno::EFBIG);
        }
        let n = data.len().min((self.s.max_file - off) as usize);
        let avail = fs.block_alloc().available_blocks();
        let bs = u64::from(self.s.block_size);
        if !wbuf::room(avail, bs, bytes, ranges, n) {
            // Near full: the engine answers (ENOSPC at write time).
            let _ = self.s.flush_locked(g);
            return Ok(Buffered::Through(off));
        }
        buf.add(off, &data[..n], ext4kit_fs::fs::now());
        let full = buf.bytes() >= wbuf::INODE_BOUND;
        self.s.wbuf.count_buffered();
        self.s.idle.note();
        if full {
            // This write is in the buffer and answered as written; a
            // failure is the next fsync's.
            let _ = self.s.flush_locked(g);
        }
        Ok(Buffered::Done(n as u32))
    }

    /// A WRITE straight to the engine.
    fn write_through(&self, ino: u32, fh: u64, off: u64, data: &[u8]) -> R<u32> {
        let fs = self.fs()?;
        // O_APPEND's "size, then write there" is one change of `ino`.
        let _g = fs.lock_inode(ino);
        let append = matches!(
            self.s.state().handles.get(&fh),
            Some(Handle::File { append: true, .. })
        );
        let off = if append { self.s.inode(ino)?.size } else { off };
        if off >= self.s.max_file && !data.is_empty() {
            return Err(Errno::EFBIG);
        }
        let n = data.len().min((self.s.max_file - off) as usize);
        // Out of space part way: the bytes written (a short write, as
        // ext4's); ENOSPC only when none could be.
        let (tid, n) =
            retry(fs, || fs.write_partial(ino, off, &data[..n])).map_err(|e| errno(&e))?;
        self.s.state().changed(ino, tid);
        Ok(n as u32)
    }

    fn snapshot(&self, ino: u32) -> R<Arc<Vec<DirItem>>> {
        self.dir(ino)?;
        let entries = self
            .s
            .backend
            .read_inode(ino, |f, d| f.read_dir_user(d))
            .map_err(|e| errno(&e))?;
        let mut items = Vec::with_capacity(entries.len());
        for e in entries {
            let kind = match dirent_type(e.file_type) {
                Some(k) => k,
                None => match self.s.inode(e.ino) {
                    Ok(i) => file_type(i.mode),
                    Err(_) => continue,
                },
            };
            items.push(DirItem {
                ino: e.ino,
                name: e.name,
                kind,
            });
        }
        Ok(Arc::new(items))
    }

    fn do_readdir(&self, ino: u32, fh: u64, offset: u64) -> R<Arc<Vec<DirItem>>> {
        let cached = match self.s.state().handles.get(&fh) {
            Some(Handle::Dir { snap, .. }) => snap.clone(),
            _ => return Err(Errno::EBADF),
        };
        match cached {
            Some(s) if offset != 0 => Ok(s),
            _ => {
                let snap = self.snapshot(ino)?;
                if let Some(Handle::Dir { snap: slot, .. }) = self.s.state().handles.get_mut(&fh) {
                    *slot = Some(snap.clone());
                }
                Ok(snap)
            }
        }
    }

    fn do_unlink(&self, parent: INodeNo, name: &OsStr) -> R<()> {
        let fs = self.fs()?;
        self.s.flush_all();
        let name = name_ok(name)?;
        let p = ext4_ino(parent)?;
        // Whether the inode stays (still open) or goes is decided inside
        // the engine, under its locks of the directory and the inode; an
        // open holds the inode's lock too (see `open`), so it cannot slip
        // in between the answer and the unlink. The orphan is recorded
        // before the engine changes anything: a close racing with the
        // unlink frees it (after it, under the same lock).
        let mut kept = None;
        let r = fs.unlink_keep_if(p, name, |ino| {
            let mut st = self.s.state();
            let open = st.is_open(ino);
            if open {
                st.orphans.insert(ino);
                kept = Some(ino);
            }
            open
        });
        let (tid, ino, _) = match r {
            Ok(v) => v,
            Err(e) => {
                if let Some(k) = kept {
                    self.s.state().orphans.remove(&k);
                }
                return Err(errno(&e));
            }
        };
        let mut st = self.s.state();
        st.changed(p, tid);
        st.changed(ino, tid);
        Ok(())
    }

    fn do_rename(
        &self,
        req: &Caller,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: u32,
    ) -> R<()> {
        let fs = self.fs()?;
        self.s.flush_all();
        let (name, newname) = (name_ok(name)?, name_ok(newname)?);
        let (sd, dd) = (ext4_ino(parent)?, ext4_ino(newparent)?);
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE | libc::RENAME_WHITEOUT;
        if flags & !known != 0 {
            return Err(Errno::EINVAL);
        }
        // RENAME_WHITEOUT (the VFS checked CAP_MKNOD and refused it with
        // EXCHANGE): the whiteout is the caller's, its group the
        // directory's when that is set-group-ID (ext4's inode_init_owner).
        let whiteout = if flags & libc::RENAME_WHITEOUT != 0 {
            let p = self.dir(sd)?;
            let gid = if p.mode & S_ISGID != 0 {
                p.gid
            } else {
                req.gid
            };
            Some((req.uid, gid))
        } else {
            None
        };
        let rf = EngineRename {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
            whiteout,
        };
        // The kernel holds both directories locked: these names stay put
        // (they only say which inodes' tids the rename sets).
        let src = fs
            .lookup(sd, name)
            .map_err(|e| errno(&e))?
            .ok_or(Errno::ENOENT)?;
        let dst = fs.lookup(dd, newname).map_err(|e| errno(&e))?;
        // A replaced file that is still open outlives the rename as an
        // orphan, in the rename's transaction (as ext4); decided inside
        // the engine under its locks (see `do_unlink`).
        let mut kept = None;
        let r = retry(fs, || {
            fs.rename_keep_if(sd, name, dd, newname, rf, |ino| {
                let mut st = self.s.state();
                let open = st.is_open(ino);
                if open {
                    st.orphans.insert(ino);
                    kept = Some(ino);
                }
                open
            })
        });
        let t = match r {
            Ok((t, _)) => t,
            Err(e) => {
                if let Some(k) = kept {
                    self.s.state().orphans.remove(&k);
                }
                return Err(errno(&e));
            }
        };
        let mut st = self.s.state();
        st.changed(sd, t);
        st.changed(dd, t);
        st.changed(src.ino, t);
        if let Some(d) = &dst {
            st.changed(d.ino, t);
        }
        drop(st);
        // A directory moved to another parent has a new "..", and the
        // kernel does not count that as a change of the moved directory
        // (its mtime stays, as ext4's): its cached listing (FOPEN_CACHE_DIR,
        // see `opendir`) would keep the old "..". An inval notify drops it
        // (and the attributes). Sent before the reply: the kernel holds the
        // moved directory locked for the rename, so no readdir of it is
        // filling the cache meanwhile, and a directory has no dirty pages
        // to wait for.
        if sd != dd {
            let moved = [Some(&src), dst.as_ref().filter(|_| rf.exchange)];
            for d in moved.into_iter().flatten().filter(|d| d.is_dir()) {
                self.drop_listing(d.ino);
            }
        }
        Ok(())
    }

    /// Have the kernel drop its cached listing of directory `ino`.
    fn drop_listing(&self, ino: u32) {
        if let Some(n) = self.s.notifier.get()
            && let Err(e) = n.inval_inode(fuse_ino(ino).0, 0, 0)
        {
            tracing::debug!("inval of directory {ino}'s listing: {e}");
        }
    }

    fn statfs_values(&self) -> R<[u64; 5]> {
        self.s.flush_all();
        let (blocks, bfree, reserved, files, ffree) = match &self.s.backend {
            Backend::Rw(fs) => {
                let sb = fs.rw().superblock().map_err(|e| errno(&e))?;
                (
                    sb.blocks_count(),
                    fs.block_alloc().free_blocks(),
                    sb.r_blocks_count(),
                    u64::from(sb.s_inodes_count.get()),
                    fs.inode_alloc().free_inodes(),
                )
            }
            Backend::Ro(v) => {
                let sb = &v.info.sb;
                // Read-only: the descriptors' counts (read per call; the
                // read side holds no table).
                let (bfree, ffree) = self
                    .s
                    .backend
                    .read(|f| -> Result<(u64, u64), FsError> {
                        let mut b = 0u64;
                        let mut i = 0u64;
                        for g in 0..f.info.groups {
                            let d = f.group_desc(g)?;
                            b += u64::from(d.free_blocks());
                            i += u64::from(d.free_inodes());
                        }
                        Ok((b, i))
                    })
                    .map_err(|e| errno(&e))?;
                let bits = sb
                    .s_log_cluster_size
                    .get()
                    .saturating_sub(sb.s_log_block_size.get())
                    .min(31);
                (
                    sb.blocks_count(),
                    bfree << bits,
                    sb.r_blocks_count(),
                    u64::from(sb.s_inodes_count.get()),
                    ffree,
                )
            }
        };
        // Bigalloc: the descriptors and s_overhead_clusters count
        // clusters; statfs reports blocks, as ext4_statfs (EXT4_C2B).
        let cbits = self.s.backend.read(|f| {
            let sb = &f.info.sb;
            sb.s_log_cluster_size
                .get()
                .saturating_sub(sb.s_log_block_size.get())
                .min(31)
        });
        let overhead = self
            .s
            .backend
            .read(|f| u64::from(f.info.sb.s_overhead_clusters.get()));
        // None recorded (images from older mke2fs): as the kernel computes it.
        let overhead = if overhead != 0 {
            overhead << cbits
        } else {
            self.computed_overhead()
        };
        let total = blocks.saturating_sub(overhead);
        let bfree = bfree.min(total);
        // As ext4_statfs: the reserved-clusters pool is held back too.
        let resv = self.s.backend.read(|f| {
            let sb = &f.info.sb;
            let bits = sb
                .s_log_cluster_size
                .get()
                .saturating_sub(sb.s_log_block_size.get())
                .min(31);
            let extents = f
                .info
                .features
                .incompat
                .contains(ext4kit_format::features::Incompat::EXTENTS);
            ext4kit_fs::statfs::resv_clusters(sb.blocks_count(), bits, extents) << bits
        });
        let bavail = ext4kit_fs::statfs::bavail(bfree, reserved, resv);
        Ok([total, bfree, bavail, files, ffree])
    }

    /// `ext4_calculate_overhead` for a superblock without
    /// `s_overhead_clusters` (0 with bigalloc: not computed).
    fn computed_overhead(&self) -> u64 {
        use ext4kit_format::features::{Compat, RoCompat};
        self.s.backend.read(|f| {
            let sb = &f.info.sb;
            if f.info.features.ro_compat.contains(RoCompat::BIGALLOC) {
                return 0;
            }
            let Ok(l) = ext4kit_fs::groups::Layout::from_superblock(sb) else {
                return 0;
            };
            let inum = sb.s_journal_inum.get();
            let journal = if f.info.features.compat.contains(Compat::HAS_JOURNAL) && inum != 0 {
                f.inode(inum)
                    .map(|i| i.size / u64::from(f.info.block_size))
                    .unwrap_or(0)
            } else {
                0
            };
            ext4kit_fs::statfs::overhead_blocks(&l, journal)
        })
    }

    fn do_lseek(&self, ino: u32, offset: i64, whence: i32) -> R<i64> {
        if whence != SEEK_DATA && whence != SEEK_HOLE {
            return Err(Errno::EINVAL);
        }
        let off = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
        self.settle(ino);
        let i = self.s.inode(ino)?;
        if off >= i.size {
            return Err(Errno::ENXIO);
        }
        let content = self
            .s
            .backend
            .read_inode(ino, |f, i| f.content(i))
            .map_err(|e| errno(&e))?;
        let maps = match content {
            // Inline data is all data.
            Content::Inline(_) => {
                return Ok(if whence == SEEK_DATA { off } else { i.size } as i64);
            }
            Content::Blocks(m) => m,
        };
        let bs = u64::from(self.s.block_size);
        // Unwritten extents read as zeros: holes, as ext4 reports them
        // when no page cache holds data for them.
        let data: Vec<(u64, u64)> = maps
            .iter()
            .filter(|m| !m.unwritten)
            .map(|m| (m.lblk * bs, m.end() * bs))
            .collect();
        let pos = if whence == SEEK_DATA {
            match data.iter().find(|(_, e)| *e > off) {
                Some((s, _)) if (*s).max(off) < i.size => (*s).max(off),
                _ => return Err(Errno::ENXIO),
            }
        } else {
            let mut at = off;
            for (s, e) in &data {
                if *s > at {
                    break;
                }
                if *e > at {
                    at = *e;
                }
            }
            at.min(i.size)
        };
        Ok(pos as i64)
    }

    fn do_fallocate(&self, ino: u32, offset: u64, length: u64, mode: i32) -> R<()> {
        let fs = self.fs()?;
        self.s.flush_all();
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        if length == 0 {
            return Err(Errno::EINVAL);
        }
        let f = Falloc {
            keep_size: mode & FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & FALLOC_FL_ZERO_RANGE != 0,
        };
        if f.punch_hole && (!f.keep_size || f.zero_range) {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        if end > self.s.max_file {
            return Err(Errno::EFBIG);
        }
        let i = self.s.inode(ino)?;
        if !i.is_regular() {
            return Err(if i.is_dir() {
                Errno::EISDIR
            } else {
                Errno::ENODEV
            });
        }
        if f.punch_hole && offset >= i.size {
            return Ok(());
        }
        let tid = retry(fs, || fs.fallocate(ino, offset, length, f)).map_err(|e| errno(&e))?;
        self.s.state().changed(ino, tid);
        Ok(())
    }

    fn fsync_ino(&self, ino: u32) -> R<()> {
        let Backend::Rw(fs) = &self.s.backend else {
            return Ok(());
        };
        // A lazytime atime is written by the fsync (the kernel's too).
        self.write_pending_atime(ino);
        // Buffered writes first; a flush that failed since the last
        // fsync is this one's error (as a writeback error is).
        let flushed = self.s.flush_ino(ino);
        if let Some(e) = self.s.wbuf.take_error(ino) {
            return Err(e);
        }
        flushed?;
        let tid = self.s.state().tids.get(&ino).copied();
        match tid {
            Some(t) => fs.commit_tid(t).map_err(|e| errno(&e)),
            None => match fs.rw().journal().aborted() {
                Some(_) => Err(Errno::EIO),
                None => Ok(()),
            },
        }
    }

    fn xattr_list(&self, req: &Caller, ino: u32) -> R<Vec<u8>> {
        self.s.inode(ino)?;
        let attrs = self
            .s
            .backend
            .read_inode(ino, |f, i| f.xattrs(i))
            .map_err(|e| errno(&e))?;
        let mut out = Vec::new();
        for a in attrs {
            // trusted.* is listed to CAP_SYS_ADMIN only (root here).
            if a.name.starts_with(b"trusted.") && req.uid != 0 {
                continue;
            }
            if fx::split_name(&a.name).is_none() && a.name != b"system.data" {
                continue;
            }
            out.extend_from_slice(&a.name);
            out.push(0);
        }
        Ok(out)
    }

    fn xattr_get(&self, ino: u32, name: &[u8]) -> R<Vec<u8>> {
        if fx::split_name(name).is_none() && name != b"system.data" {
            return Err(Errno::EOPNOTSUPP);
        }
        self.s.inode(ino)?;
        let attrs = self
            .s
            .backend
            .read_inode(ino, |f, i| f.xattrs(i))
            .map_err(|e| errno(&e))?;
        attrs
            .into_iter()
            .find(|a| a.name == name)
            .map(|a| a.value)
            .ok_or(Errno::ENODATA)
    }

    fn xattr_set(&self, ino: u32, name: &[u8], value: Option<&[u8]>, flags: i32) -> R<()> {
        let fs = self.fs()?;
        self.s.flush_all();
        let mode = match flags & (XATTR_CREATE | XATTR_REPLACE) {
            0 => SetMode::Any,
            XATTR_CREATE => SetMode::Create,
            XATTR_REPLACE => SetMode::Replace,
            _ => return Err(Errno::EINVAL),
        };
        // A linked inode or an orphan (still open), never a freed one.
        self.s.inode(ino)?;
        let tid = fs
            .set_xattr(ino, name, value, mode)
            .map_err(|e| xattr_errno(&e))?;
        self.s.state().changed(ino, tid);
        Ok(())
    }

    /// The file handle `fh` of `ino`, or EBADF; its O_APPEND flag.
    fn file_handle(&self, fh: u64, ino: u32) -> R<bool> {
        match self.s.state().handles.get(&fh) {
            Some(Handle::File { ino: i, append, .. }) if *i == ino => Ok(*append),
            _ => Err(Errno::EBADF),
        }
    }

    /// `copy_file_range(2)` inside the mount, with the checks of the
    /// kernel's `generic_copy_file_checks` (the VFS makes them first; they
    /// are repeated here against the engine's sizes): the length is cut
    /// at the source's end, EFBIG at or past the largest file (the rest
    /// cut to it), EINVAL for overlapping ranges of one file, EBADF for a
    /// handle that is not the file's or is O_APPEND. The data goes through
    /// the engine in large pieces; the source's holes and unwritten
    /// extents become holes (punched where the destination had data
    /// inside its size, nothing written past it), so a sparse file stays
    /// sparse. Size and mtime/ctime change as a write would change them.
    /// An error after some bytes were copied answers the bytes copied.
    fn do_copy_file_range(
        &self,
        (ino_in, fh_in, off_in): (u32, u64, u64),
        (ino_out, fh_out, off_out): (u32, u64, u64),
        len: u64,
        flags: u64,
    ) -> R<u64> {
        if flags != 0 {
            return Err(Errno::EINVAL);
        }
        self.s.flush_all();
        self.file_handle(fh_in, ino_in)?;
        if self.file_handle(fh_out, ino_out)? {
            return Err(Errno::EBADF);
        }
        let fs = self.fs()?;
        let src = self.s.inode(ino_in)?;
        let dst = self.s.inode(ino_out)?;
        for i in [&src, &dst] {
            if i.is_dir() {
                return Err(Errno::EISDIR);
            }
            if !i.is_regular() {
                return Err(Errno::EINVAL);
            }
        }
        off_in.checked_add(len).ok_or(Errno::EOVERFLOW)?;
        off_out.checked_add(len).ok_or(Errno::EOVERFLOW)?;
        let mut len = if off_in >= src.size {
            0
        } else {
            len.min(src.size - off_in)
        };
        if len == 0 {
            return Ok(0);
        }
        if off_out >= self.s.max_file {
            return Err(Errno::EFBIG);
        }
        len = len.min(self.s.max_file - off_out).min(COPY_MAX);
        if ino_in == ino_out && off_out + len > off_in && off_out < off_in + len {
            return Err(Errno::EINVAL);
        }
        // The source's data ranges (bytes); the rest reads as zeros.
        let bs = u64::from(self.s.block_size);
        let content = self
            .s
            .backend
            .read(|f| f.content(&src))
            .map_err(|e| errno(&e))?;
        let data: Vec<(u64, u64)> = match content {
            Content::Inline(_) => vec![(0, src.size)],
            Content::Blocks(maps) => {
                let mut v: Vec<(u64, u64)> = Vec::new();
                for m in maps.iter().filter(|m| !m.unwritten) {
                    let (a, b) = (m.lblk * bs, m.end() * bs);
                    match v.last_mut() {
                        Some(last) if last.1 == a => last.1 = b,
                        _ => v.push((a, b)),
                    }
                }
                v
            }
        };
        // Pieces of [off_in, off_in + len): (start, end, is data).
        let end_in = off_in + len;
        let mut pieces = Vec::new();
        let mut at = off_in;
        for &(a, b) in &data {
            if b <= at {
                continue;
            }
            if a >= end_in {
                break;
            }
            if a > at {
                pieces.push((at, a, false));
            }
            let e = b.min(end_in);
            pieces.push((at.max(a), e, true));
            at = e;
        }
        if at < end_in {
            pieces.push((at, end_in, false));
        }
        let mut done = 0u64;
        let mut wrote = false;
        let mut buf = Vec::new();
        let r = (|| -> R<()> {
            for (a, b, is_data) in pieces {
                let out = off_out + (a - off_in);
                if is_data {
                    let mut pos = a;
                    while pos < b {
                        let n = (b - pos).min(COPY_CHUNK) as usize;
                        buf.resize(n, 0);
                        let got = fs.read_at(ino_in, pos, &mut buf).map_err(|e| errno(&e))?;
                        // A short read: the source shrank meanwhile.
                        buf[got..].fill(0);
                        let o = out + (pos - a);
                        let tid =
                            retry(fs, || fs.write_at(ino_out, o, &buf)).map_err(|e| errno(&e))?;
                        self.s.state().changed(ino_out, tid);
                        wrote = true;
                        pos += n as u64;
                        done = pos - off_in;
                    }
                } else {
                    // Zeros: a hole where the destination has bytes
                    // (size read and punch under the inode's call lock).
                    let _g = fs.lock_inode(ino_out);
                    let size = self.s.inode(ino_out)?.size;
                    let stop = (out + (b - a)).min(size);
                    if out < stop {
                        let punch = Falloc {
                            keep_size: true,
                            punch_hole: true,
                            zero_range: false,
                        };
                        let tid = retry(fs, || fs.fallocate(ino_out, out, stop - out, punch))
                            .map_err(|e| errno(&e))?;
                        self.s.state().changed(ino_out, tid);
                    }
                    done = b - off_in;
                }
            }
            Ok(())
        })();
        if done == 0 {
            r?;
            return Ok(0);
        }
        if let Err(e) = r {
            tracing::debug!("copy_file_range to inode {ino_out} stopped after {done} bytes: {e:?}");
        }
        // The size covers what was copied (a copy ending in a hole writes
        // nothing there); mtime/ctime change when nothing was written.
        let _g = fs.lock_inode(ino_out);
        let end = off_out + done;
        let size = self.s.inode(ino_out)?.size;
        if size < end {
            let tid = retry(fs, || fs.truncate(ino_out, end)).map_err(|e| errno(&e))?;
            self.s.state().changed(ino_out, tid);
        }
        if !wrote {
            let now = ext4kit_fs::fs::now();
            let attrs = InodeAttrs {
                mtime: Some((now.sec, now.nsec)),
                ctime: Some((now.sec, now.nsec)),
                ..InodeAttrs::default()
            };
            let tid = fs.set_inode_attrs(ino_out, &attrs).map_err(|e| errno(&e))?;
            self.s.state().changed(ino_out, tid);
        }
        Ok(done)
    }
}

/// The permission bits of a regular file of `mode` once set-user-ID, and
/// set-group-ID when group-executable, are cleared (the rule the kernel's
/// FUSE applies for a filesystem without killpriv, `fuse_setattr`);
/// `None` when nothing changes.
fn killed_perm(mode: u16) -> Option<u16> {
    const S_ISUID: u16 = 0o4000;
    const S_IXGRP: u16 = 0o010;
    if mode & S_IFMT != S_IFREG {
        return None;
    }
    let mut perm = mode & 0o7777;
    perm &= !S_ISUID;
    if perm & S_IXGRP != 0 {
        perm &= !S_ISGID;
    }
    (perm != mode & 0o7777).then_some(perm)
}

/// setattr's arguments that the engine takes.
struct SetArgs {
    /// Clear set-user-ID/set-group-ID too (killpriv: a chown, or a
    /// truncate by a caller other than root).
    kill: bool,
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<SetTime>,
    mtime: Option<SetTime>,
    ctime: Option<SystemTime>,
}

/// Who sent a request (the request header's uid, gid, pid).
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The answer to LOOKUP, MKNOD, MKDIR, SYMLINK, LINK (and the entry part
/// of CREATE and READDIRPLUS): valid for [`TTL`], one more kernel
/// reference to the inode (counted before the answer is returned).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub attr: Attr,
    pub generation: u64,
    /// The name is in a casefolded directory: the entry is valid for 0 s
    /// (`FuseFs::volatile_names`).
    pub volatile: bool,
}

/// The answer to OPEN, OPENDIR: the handle and the `FOPEN_*` bits.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub fh: u64,
    pub flags: u32,
}

/// The answer to STATFS.
#[derive(Clone, Copy, Debug)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// The answer to GETXATTR, LISTXATTR: the size asked for with a size of
/// 0, else the bytes (ERANGE when they do not fit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

impl XattrReply {
    fn of(data: Vec<u8>, size: u32) -> R<XattrReply> {
        if size == 0 {
            Ok(XattrReply::Size(data.len() as u32))
        } else if data.len() > size as usize {
            Err(Errno::ERANGE)
        } else {
            Ok(XattrReply::Data(data))
        }
    }
}

/// A time SETATTR sets.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// SETATTR's fields (each `None` when its `FATTR_*` bit is clear).
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
}

/// One READDIR entry: the d_type kind, its position for the next request.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    pub ino: u64,
    pub offset: u64,
    pub kind: FileType,
    pub name: &'a [u8],
}

/// One READDIRPLUS entry.
#[derive(Clone, Copy, Debug)]
pub struct DirEntryPlus<'a> {
    pub offset: u64,
    pub name: &'a [u8],
    pub entry: Entry,
}

/// The operations, one method per FUSE request, with no transport's
/// types in them (but fuser's `Errno` and `FileType`, plain values): the
/// `fuser::Filesystem` adapter ([`crate::fuser_fs`]) calls them, and so
/// can another transport. Node ids are FUSE's (root 1).
impl FuseFs {
    /// After INIT: what was negotiated.
    pub fn set_negotiated(&mut self, writeback: bool, killpriv: bool) {
        self.writeback = writeback;
        self.killpriv = killpriv;
    }

    /// DESTROY, at the end of the session (before the engine is closed):
    /// the lazytime atimes still in memory are written.
    pub fn op_destroy(&self) {
        self.write_pending_atimes();
    }

    pub fn op_lookup(&self, parent: u64, name: &[u8]) -> R<Entry> {
        RequestCounts::bump(&self.s.requests.lookup);
        match self.do_lookup(INodeNo(parent), OsStr::from_bytes(name)) {
            Ok(i) => Ok(self.in_dir(self.entry(&i), parent)),
            // A name that is not there is a negative entry the kernel
            // keeps for the TTL (as the kernel's ext4 keeps a negative
            // dentry), not an ENOENT it would ask again at every open or
            // stat: `rsync` stats a name, creates a temporary beside it and
            // renames it over, `git` and `make` probe names that are not
            // there. The mount is the only writer, and every name it
            // creates is created by a kernel request that replaces the
            // negative dentry with the new inode.
            Err(e) if e == Errno::ENOENT => Ok(Entry {
                attr: crate::attr::negative_attr(),
                generation: 0,
                volatile: self.volatile_names(parent),
            }),
            Err(e) => Err(e),
        }
    }

    pub fn op_forget(&self, ino: u64, nlookup: u64) {
        let Ok(ino) = ext4_ino(INodeNo(ino)) else {
            return;
        };
        let free = self.s.state().forget(ino, nlookup);
        self.fire_orphan(free);
    }

    pub fn op_getattr(&self, ino: u64) -> R<Attr> {
        RequestCounts::bump(&self.s.requests.getattr);
        let i = ext4_ino(INodeNo(ino))?;
        self.settle(i);
        Ok(self.attr(&self.s.inode(i)?))
    }

    /// `kill_suidgid`: the kernel's `FATTR_KILL_SUIDGID`; `None` when the
    /// transport cannot tell (fuser 0.18 does not pass it on): then the
    /// kernel's rule is applied here, with root standing for CAP_FSETID.
    pub fn op_setattr(
        &self,
        req: &Caller,
        ino: u64,
        a: SetAttrIn,
        kill_suidgid: Option<bool>,
    ) -> R<Attr> {
        // With killpriv the kernel asks the filesystem to clear the bits
        // on every chown of a non-directory and on a truncate by a caller
        // without CAP_FSETID.
        let rule = a.mode.is_none()
            && (a.uid.is_some() || a.gid.is_some() || (a.size.is_some() && req.uid != 0));
        let kill = self.killpriv && kill_suidgid.unwrap_or(rule);
        // An explicit atime replaces a lazytime one not written yet.
        if a.atime.is_some()
            && let Ok(i) = ext4_ino(INodeNo(ino))
        {
            self.s.atimes.discard(i);
        }
        let a = SetArgs {
            kill,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
        };
        let i = self.do_setattr(INodeNo(ino), a)?;
        Ok(self.attr(&i))
    }

    pub fn op_readlink(&self, ino: u64) -> R<Vec<u8>> {
        let ino = ext4_ino(INodeNo(ino))?;
        self.s.inode(ino)?;
        let t = self
            .s
            .backend
            .read_inode(ino, |f, i| f.read_link(i))
            .map_err(|e| errno(&e))?;
        self.accessed(ino);
        Ok(t)
    }

    pub fn op_mknod(
        &self,
        req: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> R<Entry> {
        let name = OsStr::from_bytes(name);
        let i = self.make(req, INodeNo(parent), name, umask, Make::Node { mode, rdev })?;
        Ok(self.in_dir(self.entry(&i), parent))
    }

    pub fn op_mkdir(
        &self,
        req: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> R<Entry> {
        let name = OsStr::from_bytes(name);
        let i = self.make(req, INodeNo(parent), name, umask, Make::Dir { mode })?;
        Ok(self.in_dir(self.entry(&i), parent))
    }

    pub fn op_unlink(&self, parent: u64, name: &[u8]) -> R<()> {
        self.do_unlink(INodeNo(parent), OsStr::from_bytes(name))
    }

    pub fn op_rmdir(&self, parent: u64, name: &[u8]) -> R<()> {
        let fs = self.fs()?;
        self.s.flush_all();
        let name = name_ok(OsStr::from_bytes(name))?;
        let p = ext4_ino(INodeNo(parent))?;
        let tid = fs.rmdir(p, name).map_err(|e| errno(&e))?;
        self.s.state().changed(p, tid);
        Ok(())
    }

    pub fn op_symlink(&self, req: &Caller, parent: u64, name: &[u8], target: &[u8]) -> R<Entry> {
        let name = OsStr::from_bytes(name);
        let i = self.make(req, INodeNo(parent), name, 0, Make::Symlink { target })?;
        Ok(self.in_dir(self.entry(&i), parent))
    }

    /// `flags`: `RENAME_NOREPLACE`/`EXCHANGE`/`WHITEOUT` (RENAME2).
    pub fn op_rename(
        &self,
        req: &Caller,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> R<()> {
        self.do_rename(
            req,
            INodeNo(parent),
            OsStr::from_bytes(name),
            INodeNo(newparent),
            OsStr::from_bytes(newname),
            flags,
        )
    }

    pub fn op_link(&self, ino: u64, newparent: u64, newname: &[u8]) -> R<Entry> {
        let fs = self.fs()?;
        self.s.flush_all();
        let name = name_ok(OsStr::from_bytes(newname))?;
        let (ino, p) = (ext4_ino(INodeNo(ino))?, ext4_ino(INodeNo(newparent))?);
        // A linked inode or an O_TMPFILE orphan (the kernel refuses to
        // link an inode unlinked while open: no I_LINKABLE), never a
        // freed one.
        self.s.inode(ino)?;
        let tid = retry(fs, || fs.link(ino, p, name)).map_err(|e| errno(&e))?;
        let mut st = self.s.state();
        // Named now: no longer an orphan to free at the last close.
        st.orphans.remove(&ino);
        st.changed(ino, tid);
        st.changed(p, tid);
        drop(st);
        let i = self.s.inode(ino)?;
        Ok(self.in_dir(self.entry(&i), newparent))
    }

    /// `flags`: the open(2) flags.
    pub fn op_open(&self, ino: u64, flags: i32) -> R<Opened> {
        let ino = ext4_ino(INodeNo(ino))?;
        let fh = {
            // Under the inode's engine lock: an unlink decides "open or
            // not" under it too, so it sees this handle, or this open
            // sees the inode gone.
            let _g = match &self.s.backend {
                Backend::Rw(fs) => Some(fs.lock_inode(ino)),
                Backend::Ro(_) => None,
            };
            let i = self.s.inode(ino)?;
            if i.is_dir() {
                return Err(Errno::EISDIR);
            }
            crate::flags::may_open(&i, flags)?;
            let h = self.open_handle(ino, flags);
            self.s.state().add_handle(h)
        };
        let f = self.atime_open_flags(ino, flags, self.file_flags(flags));
        Ok(Opened {
            fh,
            flags: f.bits(),
        })
    }

    /// The handle of a file opened with `flags` (OPEN, CREATE, TMPFILE):
    /// O_APPEND is ours only without the writeback cache (with it the
    /// kernel places appends itself).
    fn open_handle(&self, ino: u32, flags: i32) -> Handle {
        Handle::File {
            ino,
            append: flags & libc::O_APPEND != 0 && !self.writeback,
            write: flags & libc::O_ACCMODE != libc::O_RDONLY,
        }
    }

    pub fn op_read(&self, ino: u64, offset: u64, size: u32) -> R<Vec<u8>> {
        // The atime is updated before the reply, as the kernel's read
        // does it: a stat after the read sees it.
        let i = ext4_ino(INodeNo(ino))?;
        let d = self.read_data(i, offset, size)?;
        self.accessed(i);
        Ok(d)
    }

    /// `kill`: `FUSE_WRITE_KILL_SUIDGID`; `flags`: the open(2) flags.
    #[allow(clippy::too_many_arguments)]
    pub fn op_write(
        &self,
        req: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill: bool,
        cached: bool,
        flags: i32,
    ) -> R<u32> {
        let pid = Some(req.pid).filter(|&p| p != 0);
        let i = ext4_ino(INodeNo(ino))?;
        let direct = self.direct_write(flags) && !cached;
        if direct {
            self.kill_capability(i)?;
        }
        let n = self.do_write(i, fh, offset, data, kill, flags, pid)?;
        if direct && flags & libc::O_DSYNC != 0 {
            // What the kernel's generic_write_sync would have asked with
            // an FSYNC (O_SYNC includes O_DSYNC's bit).
            self.fsync_ino(i)?;
        }
        if (n as usize) < data.len() && cached {
            // A write-back of pages (`FUSE_WRITE_CACHE`: writeback cache,
            // mmap): the kernel looks only at the error of the reply, not
            // at the count (`fuse_writepage_end`), so a short write would
            // lose the rest while fsync succeeds. An error is kept in the
            // mapping (`mapping_set_error`) and returned by the next fsync
            // or close; what fitted is written.
            let end = offset.saturating_add(u64::from(n));
            return Err(if end >= self.s.max_file {
                Errno::EFBIG
            } else {
                Errno::ENOSPC
            });
        }
        Ok(n)
    }

    pub fn op_flush(&self, ino: u64) -> R<()> {
        // close(2) does not sync on ext4 either (and the opens ask for no
        // FLUSH); the buffered writes reach the engine, and a flush error
        // not returned yet is returned here.
        let i = ext4_ino(INodeNo(ino))?;
        let flushed = self.s.flush_ino(i);
        if let Some(e) = self.s.wbuf.take_error(i) {
            return Err(e);
        }
        flushed
    }

    pub fn op_release(&self, fh: u64) {
        let free = self.s.state().close_handle(fh);
        self.fire_orphan(free);
    }

    /// FSYNC and FSYNCDIR.
    pub fn op_fsync(&self, ino: u64) -> R<()> {
        self.fsync_ino(ext4_ino(INodeNo(ino))?)?;
        if self.writeback {
            // The kernel's FUSE does not keep i_blocks with the cache: its
            // close invalidates the cached STATX_BLOCKS (`fuse_flush`), its
            // fsync does not. An inval notify of the attributes only
            // (offset < 0: no page is touched, nothing waits) before the
            // reply has the next stat ask, so after fsync/fdatasync
            // st_blocks is what the write-back allocated, as on ext4.
            if let Some(n) = self.s.notifier.get()
                && let Err(e) = n.inval_inode(ino, -1, 0)
            {
                tracing::debug!("attribute inval after fsync of {ino}: {e}");
            }
        }
        Ok(())
    }

    pub fn op_opendir(&self, ino: u64) -> R<Opened> {
        let ino = ext4_ino(INodeNo(ino))?;
        self.dir(ino)?;
        let fh = self.s.state().add_handle(Handle::Dir { ino, snap: None });
        Ok(Opened {
            fh,
            flags: self.dir_flags(ino).bits(),
        })
    }

    /// READDIR from `offset`: `add` takes each entry and says whether
    /// the reply is full (that entry not taken).
    pub fn op_readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> R<()> {
        RequestCounts::bump(&self.s.requests.readdir);
        let d = ext4_ino(INodeNo(ino))?;
        let snap = self.do_readdir(d, fh, offset)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (k, item) in snap.iter().enumerate().skip(start) {
            let e = DirEntry {
                ino: fuse_ino(item.ino).0,
                offset: k as u64 + 1,
                kind: item.kind,
                name: &item.name,
            };
            if add(e) {
                break;
            }
        }
        self.accessed(d);
        Ok(())
    }

    /// READDIRPLUS: the entries of READDIR ([`FuseFs::op_readdir`]) with
    /// their inodes' attributes, so a listing that stats its entries
    /// (`ls -l`, `find`, `rm -r`) needs no LOOKUP per name. Every entry
    /// `add` takes but "." and ".." is one more kernel reference to its
    /// inode (the kernel links it as a dentry). The snapshot's names are
    /// what the directory holds when the snapshot is taken by this
    /// request (offset 0: the kernel holds the directory locked for the
    /// whole request, so nothing is created, removed or renamed in it
    /// meanwhile); at a later offset each name is looked up again, so an
    /// entry never names an inode the name no longer has (a name gone
    /// since is left out, one that now names another inode is answered
    /// with that one). The references are counted before this returns
    /// (before the reply: a FORGET may follow it at once), so a
    /// transport must send what `add` took.
    pub fn op_readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        add: &mut dyn FnMut(DirEntryPlus<'_>) -> bool,
    ) -> R<()> {
        RequestCounts::bump(&self.s.requests.readdirplus);
        let dir = ext4_ino(INodeNo(ino))?;
        let snap = self.do_readdir(dir, fh, offset)?;
        let volatile = self.volatile_names(ino);
        let fresh = offset == 0;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let mut linked = Vec::new();
        for (k, item) in snap.iter().enumerate().skip(start) {
            let dots = item.name == b"." || item.name == b"..";
            let now = if fresh || dots {
                Some(item.ino)
            } else {
                self.s
                    .backend
                    .read_inode(dir, |f, d| f.lookup(d, &item.name))
                    .map_err(|e| errno(&e))?
                    .map(|e| e.ino)
            };
            let Some(cur) = now else { continue };
            self.settle(cur);
            let i = match self.s.inode(cur) {
                Ok(i) => i,
                // Gone since (an orphan freed, a ".." of a removed
                // directory): left out.
                Err(_) => continue,
            };
            let e = DirEntryPlus {
                offset: k as u64 + 1,
                name: &item.name,
                entry: Entry {
                    volatile,
                    ..self.entry_of(&i)
                },
            };
            if add(e) {
                break;
            }
            if !dots {
                linked.push(cur);
            }
        }
        {
            let mut st = self.s.state();
            for i in linked {
                st.looked_up(i);
            }
        }
        self.accessed(dir);
        Ok(())
    }

    pub fn op_releasedir(&self, fh: u64) {
        self.s.state().handles.remove(&fh);
    }

    /// SYNCFS (our own transport; the kernel sends it only where
    /// `fc->sync_fs` is set): every change answered so far made durable,
    /// as `ext4kit sync` does.
    pub fn op_syncfs(&self) -> R<()> {
        self.s.commit_all().map_err(|e| errno(&e))
    }

    pub fn op_statfs(&self) -> R<Statfs> {
        let [blocks, bfree, bavail, files, ffree] = self.statfs_values()?;
        let bs = self.s.block_size;
        Ok(Statfs {
            blocks,
            bfree,
            bavail,
            files,
            ffree,
            bsize: bs,
            namelen: NAME_MAX as u32,
            frsize: bs,
        })
    }

    pub fn op_setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> R<()> {
        self.xattr_set(ext4_ino(INodeNo(ino))?, name, Some(value), flags)
    }

    pub fn op_getxattr(&self, ino: u64, name: &[u8], size: u32) -> R<XattrReply> {
        RequestCounts::bump(&self.s.requests.getxattr);
        let v = self.xattr_get(ext4_ino(INodeNo(ino))?, name)?;
        XattrReply::of(v, size)
    }

    pub fn op_listxattr(&self, req: &Caller, ino: u64, size: u32) -> R<XattrReply> {
        let v = self.xattr_list(req, ext4_ino(INodeNo(ino))?)?;
        XattrReply::of(v, size)
    }

    pub fn op_removexattr(&self, ino: u64, name: &[u8]) -> R<()> {
        self.xattr_set(ext4_ino(INodeNo(ino))?, name, None, 0)
    }

    /// `mask`: access(2)'s `R_OK|W_OK|X_OK` (0: `F_OK`).
    pub fn op_access(&self, req: &Caller, ino: u64, mask: i32) -> R<()> {
        // Only reached without default_permissions (never, as mounted
        // here); answer with the classic mode-bit check anyway.
        let i = self.s.inode(ext4_ino(INodeNo(ino))?)?;
        if mask == libc::F_OK || req.uid == 0 {
            return Ok(());
        }
        let bits = if req.uid == i.uid {
            i.mode >> 6
        } else if req.gid == i.gid {
            i.mode >> 3
        } else {
            i.mode
        } & 7;
        let want = (mask & 7) as u16;
        if bits & want == want {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// CREATE: the entry (one more kernel reference) and the open file.
    pub fn op_create(
        &self,
        req: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> R<(Entry, Opened)> {
        let rdev = 0;
        let mode = (mode & !u32::from(S_IFMT)) | u32::from(S_IFREG);
        let name = OsStr::from_bytes(name);
        let i = self.make(req, INodeNo(parent), name, umask, Make::Node { mode, rdev })?;
        let h = self.open_handle(i.ino, flags);
        let fh = {
            let mut st = self.s.state();
            st.looked_up(i.ino);
            st.add_handle(h)
        };
        let opened = Opened {
            fh,
            flags: self.file_flags(flags).bits(),
        };
        Ok((self.in_dir(self.entry_of(&i), parent), opened))
    }

    /// TMPFILE (open with O_TMPFILE): a regular file without a name
    /// (link count 0, an orphan of the engine and of the mount, as an
    /// unlinked-open file), the entry (one more kernel reference) and
    /// the open file. The last close frees it unless LINK named it.
    /// Owner, group, mode and ACL as CREATE's (the caller, a set-group-ID
    /// parent's group, the parent's default ACL, else the umask).
    pub fn op_tmpfile(
        &self,
        req: &Caller,
        parent: u64,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> R<(Entry, Opened)> {
        let fs = self.fs()?;
        self.s.flush_all();
        let pino = ext4_ino(INodeNo(parent))?;
        let p = self.dir(pino)?;
        let (spec, inh) = self.new_inode(
            req,
            pino,
            &p,
            S_IFREG | (mode as u16 & 0o7777),
            false,
            false,
            umask,
        )?;
        // On the mount's orphan list before anyone can see the inode, its
        // handle with it: the last close (or FORGET) frees it.
        let (mut i, mut tid) =
            retry(fs, || fs.create_tmpfile(pino, &spec)).map_err(|e| errno(&e))?;
        if let Some(entries) = inh.access {
            let v = acl::to_xattr(&entries);
            match fs.set_xattr(i.ino, b"system.posix_acl_access", Some(&v), SetMode::Any) {
                Ok(t) => tid = t,
                Err(e) => {
                    // No tmpfile without its inherited ACL (see `make`).
                    if let Err(u) = fs.release_orphan(i.ino) {
                        tracing::warn!("freeing tmpfile {} after a failed ACL: {u}", i.ino);
                    }
                    return Err(xattr_errno(&e));
                }
            }
            // The ACL changed the ctime: the reply carries the inode now.
            i = fs.inode_any(i.ino).map_err(|e| errno(&e))?;
        }
        let fh = {
            let mut st = self.s.state();
            st.orphans.insert(i.ino);
            st.looked_up(i.ino);
            st.changed(i.ino, tid);
            st.add_handle(self.open_handle(i.ino, flags))
        };
        let opened = Opened {
            fh,
            flags: self.open_flags().bits(),
        };
        Ok((self.entry_of(&i), opened))
    }

    pub fn op_fallocate(
        &self,
        req: &Caller,
        ino: u64,
        offset: u64,
        length: u64,
        mode: i32,
    ) -> R<()> {
        let i = ext4_ino(INodeNo(ino))?;
        self.do_fallocate(i, offset, length, mode)?;
        if req.uid != 0 {
            self.kill_suid_sgid(i)?;
        }
        Ok(())
    }

    /// LSEEK: `done` gets the answer, on this thread or (SEEK_DATA/HOLE
    /// with the writeback cache and the file open for writing) on a
    /// thread of its own, after the kernel wrote dirty pages back.
    pub fn op_lseek(
        &self,
        ino: u64,
        offset: i64,
        whence: i32,
        done: impl FnOnce(R<i64>) + Send + 'static,
    ) {
        let i = match ext4_ino(INodeNo(ino)) {
            Ok(i) => i,
            Err(e) => return done(Err(e)),
        };
        if self.writeback && self.s.state().is_open_for_writing(i) {
            // The kernel may hold dirty pages of the file that are still
            // holes in the engine's extent map, and it does not write them
            // back before asking. An inval notify of the range from
            // `offset` on does: the kernel launders each dirty page (a
            // WRITE, served by the other workers) and waits for it before
            // dropping the page, and its LSEEK holds the inode lock, so no
            // write(2) dirties the range again meanwhile. The notify
            // blocks this thread until then, so it is sent from a thread
            // of its own: every worker stays free to serve the WRITEs
            // (also with `--threads 1`, or several such LSEEKs at once).
            // Nothing of the mount is locked while it waits.
            if let Some(n) = self.s.notifier.get().cloned() {
                let me = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("ext4kit-lseek".into())
                    .spawn(move || {
                        if let Err(e) = n.inval_inode(ino, offset.max(0), 0) {
                            tracing::debug!("inval before lseek of {i}: {e}");
                        }
                        done(me.do_lseek(i, offset, whence));
                    });
                if let Err(e) = spawned {
                    // The answer went with the closure (dropped: the
                    // transport's EIO).
                    tracing::warn!("lseek thread: {e}");
                }
                return;
            }
            // No notifier (not expected): the kernel's own answer.
            return done(Err(Errno::ENOSYS));
        }
        done(self.do_lseek(i, offset, whence))
    }

    /// `FITRIM` (on any file or directory of the mount, as ext4; see
    /// [`crate::trim`]), the inode flags of lsattr/chattr
    /// ([`crate::flags`]), `ext4kit sync`; every other command is
    /// ENOTTY, as ext4 answers commands it does not know. The answer is
    /// the out data (the result is always 0).
    pub fn op_ioctl(
        &self,
        req: &Caller,
        ino: u64,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
    ) -> R<Vec<u8>> {
        // Flag changes (chattr +i must refuse the writes after it) and
        // FITRIM (free space exact) come after the buffered writes.
        self.s.flush_all();
        if cmd == crate::idle::SYNC_IOCTL {
            // `ext4kit sync`: everything answered before it, durable,
            // lazytime atimes included (the kernel's sync(2) writes
            // I_DIRTY_TIME inodes too; its journal commits do not, nor
            // does the idle commit).
            self.write_pending_atimes();
            self.s.idle.note_sync();
            return self
                .s
                .commit_all()
                .map(|()| Vec::new())
                .map_err(|e| errno(&e));
        }
        if crate::flags::is_flags_ioctl(cmd) {
            let r =
                ext4_ino(INodeNo(ino)).and_then(|i| crate::flags::ioctl(&self.s, i, cmd, in_data));
            self.s.idle.note();
            return r;
        }
        if cmd != crate::trim::FITRIM {
            return Err(Errno::ENOTTY);
        }
        let range = crate::trim::fitrim(&self.s, req.uid, in_data, out_size)?;
        Ok(range.to_bytes().to_vec())
    }

    /// `(ino, fh, offset)` of each side; the bytes copied.
    pub fn op_copy_file_range(
        &self,
        req: &Caller,
        (ino_in, fh_in, offset_in): (u64, u64, u64),
        (ino_out, fh_out, offset_out): (u64, u64, u64),
        len: u64,
        flags: u64,
    ) -> R<u32> {
        let i = ext4_ino(INodeNo(ino_in))?;
        let o = ext4_ino(INodeNo(ino_out))?;
        let n =
            self.do_copy_file_range((i, fh_in, offset_in), (o, fh_out, offset_out), len, flags)?;
        if n > 0 && req.uid != 0 {
            self.kill_suid_sgid(o)?;
        }
        Ok(n as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::EXT4_ROOT;

    #[test]
    fn killed_perm_as_the_kernel() {
        assert_eq!(killed_perm(S_IFREG | 0o6755), Some(0o0755));
        assert_eq!(killed_perm(S_IFREG | 0o6745), Some(0o2745));
        assert_eq!(killed_perm(S_IFREG | 0o2745), None);
        assert_eq!(killed_perm(S_IFREG | 0o0755), None);
        assert_eq!(killed_perm(S_IFDIR | 0o6755), None);
    }

    #[test]
    fn root_maps_both_ways() {
        assert_eq!(fuse_ino(EXT4_ROOT), INodeNo::ROOT);
        assert_eq!(ext4_ino(INodeNo::ROOT), Ok(EXT4_ROOT));
    }
}
