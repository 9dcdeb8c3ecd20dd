//! The `fuser::Filesystem` adapter: each request's fuser types turned
//! into the plain arguments of [`FuseFs`]'s `op_*` methods
//! ([`crate::ops`]), their answers into fuser's replies. Nothing else
//! happens here, so another transport calling the same methods serves
//! the same filesystem.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::ops::{Caller, Entry, FuseFs, Opened, SetAttrIn, SetTime, TTL, XattrReply};

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
        TimeOrNow::Now => SetTime::Now,
    }
}

/// fuser takes one TTL for the name and the attributes: 0 s for both of a
/// volatile entry (a casefolded directory's).
fn ttl(e: &Entry) -> std::time::Duration {
    if e.volatile {
        std::time::Duration::ZERO
    } else {
        TTL
    }
}

fn reply_entry(r: Result<Entry, Errno>, reply: ReplyEntry) {
    match r {
        Ok(e) => reply.entry(&ttl(&e), &e.attr.to_fuser(), Generation(e.generation)),
        Err(e) => reply.error(e),
    }
}

fn reply_open(r: Result<Opened, Errno>, reply: ReplyOpen) {
    match r {
        Ok(o) => reply.opened(FileHandle(o.fh), FopenFlags::from_bits_retain(o.flags)),
        Err(e) => reply.error(e),
    }
}

fn reply_xattr(r: Result<XattrReply, Errno>, reply: ReplyXattr) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(v)) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(r: Result<(), Errno>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_data(r: Result<Vec<u8>, Errno>, reply: ReplyData) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for FuseFs {
    fn destroy(&mut self) {
        self.op_destroy();
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let got = crate::mount::negotiate(&self.s, config);
        self.set_negotiated(got.writeback, got.killpriv);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply_entry(self.op_lookup(parent.0, name.as_bytes()), reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.op_forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.op_getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a.to_fuser()),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = SetAttrIn {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime,
        };
        // fuser 0.18 does not pass FATTR_KILL_SUIDGID on.
        match self.op_setattr(&caller(req), ino.0, a, None) {
            Ok(a) => reply.attr(&TTL, &a.to_fuser()),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        reply_data(self.op_readlink(ino.0), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.op_mknod(&caller(req), parent.0, name.as_bytes(), mode, umask, rdev);
        reply_entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let r = self.op_mkdir(&caller(req), parent.0, name.as_bytes(), mode, umask);
        reply_entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.op_unlink(parent.0, name.as_bytes()), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.op_rmdir(parent.0, name.as_bytes()), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        let r = self.op_symlink(&caller(req), parent.0, link_name.as_bytes(), target);
        reply_entry(r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.op_rename(
            &caller(req),
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        reply_empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply_entry(self.op_link(ino.0, newparent.0, newname.as_bytes()), reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply_open(self.op_open(ino.0, flags.0), reply);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        reply_data(self.op_read(ino.0, offset, size), reply);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let cached = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        match self.op_write(
            &caller(req),
            ino.0,
            fh.0,
            offset,
            data,
            kill,
            cached,
            flags.0,
        ) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.op_flush(ino.0), reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.op_release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.op_fsync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply_open(self.op_opendir(ino.0), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.op_readdir(ino.0, fh.0, offset, &mut |e| {
            reply.add(INodeNo(e.ino), e.offset, e.kind, OsStr::from_bytes(e.name))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let r = self.op_readdirplus(ino.0, fh.0, offset, &mut |e| {
            reply.add(
                INodeNo(e.entry.attr.ino),
                e.offset,
                OsStr::from_bytes(e.name),
                &ttl(&e.entry),
                &e.entry.attr.to_fuser(),
                Generation(e.entry.generation),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.op_releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_empty(self.op_fsync(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.op_statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply_empty(
            self.op_setxattr(ino.0, name.as_bytes(), value, flags),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply_xattr(self.op_getxattr(ino.0, name.as_bytes(), size), reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_xattr(self.op_listxattr(&caller(req), ino.0, size), reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.op_removexattr(ino.0, name.as_bytes()), reply);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply_empty(self.op_access(&caller(req), ino.0, mask.bits()), reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.op_create(&caller(req), parent.0, name.as_bytes(), mode, umask, flags) {
            Ok((e, o)) => reply.created(
                &ttl(&e),
                &e.attr.to_fuser(),
                Generation(e.generation),
                FileHandle(o.fh),
                FopenFlags::from_bits_retain(o.flags),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let r = self.op_fallocate(&caller(req), ino.0, offset, length, mode);
        reply_empty(r, reply);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.op_lseek(ino.0, offset, whence, move |r| match r {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        });
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        match self.op_ioctl(&caller(req), ino.0, cmd, in_data, out_size) {
            Ok(d) => reply.ioctl(0, &d),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let r = self.op_copy_file_range(
            &caller(req),
            (ino_in.0, fh_in.0, offset_in),
            (ino_out.0, fh_out.0, offset_out),
            len,
            flags.bits(),
        );
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }
}
