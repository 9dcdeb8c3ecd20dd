//! Request decoding and reply encoding. Decoding only borrows from the
//! buffer read from `/dev/fuse`; every malformed request (short,
//! a length that is not the buffer's, a name without its NUL, a batch
//! longer than the request) is a [`ProtoError`], never a panic.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::attr::{Attr, decode_rdev};
use crate::ops::{Entry, Opened, Statfs};

use super::abi::{
    AccessIn, AttrOut, BatchForgetIn, CopyFileRangeIn, CreateIn, Dirent, EntryOut, FallocateIn,
    FlushIn, ForgetIn, ForgetOne, FsyncIn, FuseAttr, GetattrIn, GetxattrIn, INIT_IN_COMPAT_SIZE,
    InHeader, InitIn, InterruptIn, IoctlIn, Kstatfs, LinkIn, LseekIn, MkdirIn, MknodIn,
    NotifyInvalEntryOut, NotifyInvalInodeOut, OpenIn, OpenOut, OutHeader, ReadIn, ReleaseIn,
    Rename2In, RenameIn, SetattrIn, SetxattrCompatIn, Statx, StatxIn, StatxOut, SxTime, WriteIn,
    notify, opcode,
};

/// A request the transport cannot decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("FUSE request of {0} bytes is shorter than its header")]
    ShortHeader(usize),
    #[error("FUSE request says {said} bytes, {got} were read")]
    BadLength { said: u32, got: usize },
    #[error("FUSE request {opcode}: its arguments are cut short")]
    ShortArgs { opcode: u32 },
    #[error("FUSE request {opcode}: a name without its terminating NUL")]
    BadName { opcode: u32 },
    #[error("FUSE request {opcode}: extensions longer than the request")]
    BadExtensions { opcode: u32 },
}

/// A decoded request: its header and its operation.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub header: InHeader,
    pub op: Operation<'a>,
}

/// The operations decoded so far (the rest come with the session loop).
#[derive(Debug, PartialEq, Eq)]
pub enum Operation<'a> {
    Init(InitIn),
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    BatchForget(Vec<ForgetOne>),
    Getattr(GetattrIn),
    Setattr(SetattrIn),
    Mknod {
        arg: MknodIn,
        name: &'a [u8],
    },
    Mkdir {
        arg: MkdirIn,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    /// RENAME and RENAME2 (flags 0 for RENAME).
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        name: &'a [u8],
    },
    Open(OpenIn),
    Create {
        arg: CreateIn,
        name: &'a [u8],
    },
    /// TMPFILE: CREATE's layout; the name is the VFS's placeholder.
    Tmpfile {
        arg: CreateIn,
        name: &'a [u8],
    },
    Read(ReadIn),
    Write {
        arg: WriteIn,
        data: &'a [u8],
    },
    /// RELEASE and RELEASEDIR.
    Release(ReleaseIn),
    Flush(FlushIn),
    /// FSYNC and FSYNCDIR.
    Fsync(FsyncIn),
    Statfs,
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Access {
        mask: u32,
    },
    Lseek(LseekIn),
    Fallocate(FallocateIn),
    CopyFileRange(CopyFileRangeIn),
    Ioctl {
        arg: IoctlIn,
        data: &'a [u8],
    },
    Statx(StatxIn),
    Syncfs,
    Interrupt {
        unique: u64,
    },
    Destroy,
    /// An opcode not decoded here (answered ENOSYS), with its bytes.
    Other {
        opcode: u32,
        args: &'a [u8],
    },
}

/// A cursor over a request's argument bytes.
struct Args<'a> {
    rest: &'a [u8],
    opcode: u32,
}

impl<'a> Args<'a> {
    fn take<T: FromBytes + KnownLayout + Immutable>(&mut self) -> Result<T, ProtoError> {
        let (v, rest) = T::read_from_prefix(self.rest).map_err(|_| ProtoError::ShortArgs {
            opcode: self.opcode,
        })?;
        self.rest = rest;
        Ok(v)
    }

    /// A NUL-terminated name (the NUL not included).
    fn name(&mut self) -> Result<&'a [u8], ProtoError> {
        let opcode = self.opcode;
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(ProtoError::BadName { opcode })?;
        let (name, rest) = self.rest.split_at(end);
        self.rest = &rest[1..];
        Ok(name)
    }
}

impl<'a> Request<'a> {
    /// Decode one request: `buf` is exactly what one read(2) of
    /// `/dev/fuse` returned.
    pub fn parse(buf: &'a [u8]) -> Result<Request<'a>, ProtoError> {
        let (header, rest) =
            InHeader::read_from_prefix(buf).map_err(|_| ProtoError::ShortHeader(buf.len()))?;
        if header.len as usize != buf.len() {
            return Err(ProtoError::BadLength {
                said: header.len,
                got: buf.len(),
            });
        }
        let opcode = header.opcode;
        // The extensions (security context, supplementary groups) come
        // last; they are not used yet.
        let ext = usize::from(header.total_extlen) * 8;
        let Some(body) = rest.len().checked_sub(ext).map(|n| &rest[..n]) else {
            return Err(ProtoError::BadExtensions { opcode });
        };
        let mut a = Args { rest: body, opcode };
        let op = match opcode {
            opcode::INIT => {
                // A kernel before 7.36 sends only the first four fields.
                if body.len() < INIT_IN_COMPAT_SIZE {
                    return Err(ProtoError::ShortArgs { opcode });
                }
                let mut full = [0u8; size_of::<InitIn>()];
                let n = body.len().min(full.len());
                full[..n].copy_from_slice(&body[..n]);
                let mut b = Args {
                    rest: &full,
                    opcode,
                };
                Operation::Init(b.take()?)
            }
            opcode::LOOKUP => Operation::Lookup { name: a.name()? },
            opcode::FORGET => Operation::Forget {
                nlookup: a.take::<ForgetIn>()?.nlookup,
            },
            opcode::BATCH_FORGET => {
                let n = a.take::<BatchForgetIn>()?.count as usize;
                // Bounded by the request's length before anything is
                // allocated.
                if a.rest.len() / size_of::<ForgetOne>() < n {
                    return Err(ProtoError::ShortArgs { opcode });
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(a.take::<ForgetOne>()?);
                }
                Operation::BatchForget(v)
            }
            opcode::GETATTR => Operation::Getattr(a.take()?),
            opcode::SETATTR => Operation::Setattr(a.take()?),
            opcode::MKNOD => Operation::Mknod {
                arg: a.take()?,
                name: a.name()?,
            },
            opcode::MKDIR => Operation::Mkdir {
                arg: a.take()?,
                name: a.name()?,
            },
            opcode::UNLINK => Operation::Unlink { name: a.name()? },
            opcode::RMDIR => Operation::Rmdir { name: a.name()? },
            opcode::SYMLINK => Operation::Symlink {
                name: a.name()?,
                target: a.name()?,
            },
            opcode::RENAME => Operation::Rename {
                newdir: a.take::<RenameIn>()?.newdir,
                flags: 0,
                name: a.name()?,
                newname: a.name()?,
            },
            opcode::RENAME2 => {
                let r: Rename2In = a.take()?;
                Operation::Rename {
                    newdir: r.newdir,
                    flags: r.flags,
                    name: a.name()?,
                    newname: a.name()?,
                }
            }
            opcode::LINK => Operation::Link {
                oldnodeid: a.take::<LinkIn>()?.oldnodeid,
                name: a.name()?,
            },
            opcode::OPEN | opcode::OPENDIR => Operation::Open(a.take()?),
            opcode::CREATE => Operation::Create {
                arg: a.take()?,
                name: a.name()?,
            },
            opcode::TMPFILE => Operation::Tmpfile {
                arg: a.take()?,
                name: a.name()?,
            },
            opcode::READ | opcode::READDIR | opcode::READDIRPLUS => Operation::Read(a.take()?),
            opcode::WRITE => {
                let arg: WriteIn = a.take()?;
                let n = arg.size as usize;
                // The data is exactly what the header says it is.
                if a.rest.len() != n {
                    return Err(ProtoError::ShortArgs { opcode });
                }
                Operation::Write { arg, data: a.rest }
            }
            opcode::RELEASE | opcode::RELEASEDIR => Operation::Release(a.take()?),
            opcode::FLUSH => Operation::Flush(a.take()?),
            opcode::FSYNC | opcode::FSYNCDIR => Operation::Fsync(a.take()?),
            opcode::STATFS => Operation::Statfs,
            opcode::SETXATTR => {
                let x: SetxattrCompatIn = a.take()?;
                let name = a.name()?;
                if a.rest.len() != x.size as usize {
                    return Err(ProtoError::ShortArgs { opcode });
                }
                Operation::Setxattr {
                    flags: x.flags,
                    name,
                    value: a.rest,
                }
            }
            opcode::GETXATTR => Operation::Getxattr {
                size: a.take::<GetxattrIn>()?.size,
                name: a.name()?,
            },
            opcode::LISTXATTR => Operation::Listxattr {
                size: a.take::<GetxattrIn>()?.size,
            },
            opcode::REMOVEXATTR => Operation::Removexattr { name: a.name()? },
            opcode::ACCESS => Operation::Access {
                mask: a.take::<AccessIn>()?.mask,
            },
            opcode::LSEEK => Operation::Lseek(a.take()?),
            opcode::FALLOCATE => Operation::Fallocate(a.take()?),
            opcode::COPY_FILE_RANGE => Operation::CopyFileRange(a.take()?),
            opcode::IOCTL => {
                let arg: IoctlIn = a.take()?;
                if a.rest.len() < arg.in_size as usize {
                    return Err(ProtoError::ShortArgs { opcode });
                }
                Operation::Ioctl {
                    arg,
                    data: &a.rest[..arg.in_size as usize],
                }
            }
            opcode::STATX => Operation::Statx(a.take()?),
            opcode::SYNCFS => Operation::Syncfs,
            opcode::INTERRUPT => Operation::Interrupt {
                unique: a.take::<InterruptIn>()?.unique,
            },
            opcode::DESTROY => Operation::Destroy,
            _ => Operation::Other { opcode, args: body },
        };
        Ok(Request { header, op })
    }
}

/// A reply to request `unique`: the out header, then `body`.
pub fn reply(unique: u64, body: &[&[u8]]) -> Vec<u8> {
    let len: usize = size_of::<OutHeader>() + body.iter().map(|b| b.len()).sum::<usize>();
    let h = OutHeader {
        len: len as u32,
        error: 0,
        unique,
    };
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(h.as_bytes());
    for b in body {
        out.extend_from_slice(b);
    }
    out
}

/// A reply carrying one struct.
pub fn reply_struct<T: IntoBytes + Immutable>(unique: u64, v: &T) -> Vec<u8> {
    reply(unique, &[v.as_bytes()])
}

/// An error reply: `errno` positive (sent negated), no body.
pub fn reply_error(unique: u64, errno: i32) -> Vec<u8> {
    let h = OutHeader {
        len: size_of::<OutHeader>() as u32,
        error: -errno.abs(),
        unique,
    };
    h.as_bytes().to_vec()
}

/// A time as seconds since the epoch (negative before it) and
/// nanoseconds (always forward, as `struct timespec`).
pub fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => (-secs, 0),
                n => (-secs - 1, 1_000_000_000 - n),
            }
        }
    }
}

/// Our attributes as `fuse_attr`.
pub fn fuse_attr(a: &Attr) -> FuseAttr {
    let (atime, atimensec) = split_time(a.atime);
    let (mtime, mtimensec) = split_time(a.mtime);
    let (ctime, ctimensec) = split_time(a.ctime);
    FuseAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: atime as u64,
        mtime: mtime as u64,
        ctime: ctime as u64,
        atimensec,
        mtimensec,
        ctimensec,
        mode: u32::from(a.mode),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// An entry answer valid for `ttl` (names and attributes alike).
pub fn entry_out(e: &Entry, ttl: Duration) -> EntryOut {
    let name_ttl = if e.volatile { Duration::ZERO } else { ttl };
    EntryOut {
        nodeid: e.attr.ino,
        generation: e.generation,
        entry_valid: name_ttl.as_secs(),
        attr_valid: ttl.as_secs(),
        entry_valid_nsec: name_ttl.subsec_nanos(),
        attr_valid_nsec: ttl.subsec_nanos(),
        attr: fuse_attr(&e.attr),
    }
}

/// A GETATTR/SETATTR answer valid for `ttl`.
pub fn attr_out(a: &Attr, ttl: Duration) -> AttrOut {
    AttrOut {
        attr_valid: ttl.as_secs(),
        attr_valid_nsec: ttl.subsec_nanos(),
        dummy: 0,
        attr: fuse_attr(a),
    }
}

/// An OPEN/OPENDIR/CREATE answer's open part.
pub fn open_out(o: &Opened) -> OpenOut {
    OpenOut {
        fh: o.fh,
        open_flags: o.flags,
        backing_id: 0,
    }
}

/// A STATFS answer.
pub fn statfs_out(s: &Statfs) -> Kstatfs {
    Kstatfs {
        blocks: s.blocks,
        bfree: s.bfree,
        bavail: s.bavail,
        files: s.files,
        ffree: s.ffree,
        bsize: s.bsize,
        namelen: s.namelen,
        frsize: s.frsize,
        ..Default::default()
    }
}

/// A STATX answer valid for `ttl`.
pub fn statx_out(a: &Attr, ttl: Duration) -> StatxOut {
    StatxOut {
        attr_valid: ttl.as_secs(),
        attr_valid_nsec: ttl.subsec_nanos(),
        stat: statx(a),
        ..Default::default()
    }
}

/// A notify message: the header (`unique` 0, the code as `error`), then
/// the parts.
fn notify_msg(code: i32, body: &[&[u8]]) -> Vec<u8> {
    let mut m = reply(0, body);
    m[4..8].copy_from_slice(&code.to_ne_bytes());
    m
}

/// `FUSE_NOTIFY_INVAL_INODE` of node `ino`'s pages from `off`, `len`
/// bytes (0: to the end).
pub fn notify_inval_inode(ino: u64, off: i64, len: i64) -> Vec<u8> {
    let n = NotifyInvalInodeOut { ino, off, len };
    notify_msg(notify::INVAL_INODE, &[n.as_bytes()])
}

/// `FUSE_NOTIFY_INVAL_ENTRY` of `name` in directory node `parent`.
pub fn notify_inval_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let n = NotifyInvalEntryOut {
        parent,
        namelen: name.len() as u32,
        flags: 0,
    };
    notify_msg(notify::INVAL_ENTRY, &[n.as_bytes(), name, &[0]])
}

/// Append one `fuse_dirent` to a READDIR reply of at most `max` bytes;
/// false (nothing added) when it does not fit.
pub fn push_dirent(
    out: &mut Vec<u8>,
    max: usize,
    ino: u64,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let len = (size_of::<Dirent>() + name.len()).next_multiple_of(8);
    if out.len() + len > max {
        return false;
    }
    let d = Dirent {
        ino,
        off,
        namelen: name.len() as u32,
        typ,
    };
    let start = out.len();
    out.extend_from_slice(d.as_bytes());
    out.extend_from_slice(name);
    out.resize(start + len, 0);
    true
}

/// Append one `fuse_direntplus` (entry, then dirent) to a READDIRPLUS
/// reply of at most `max` bytes; false when it does not fit.
pub fn push_direntplus(
    out: &mut Vec<u8>,
    max: usize,
    entry: &EntryOut,
    off: u64,
    typ: u32,
    name: &[u8],
) -> bool {
    let len = size_of::<EntryOut>() + (size_of::<Dirent>() + name.len()).next_multiple_of(8);
    if out.len() + len > max {
        return false;
    }
    out.extend_from_slice(entry.as_bytes());
    push_dirent(out, usize::MAX, entry.nodeid, off, typ, name)
}

/// `STATX_BASIC_STATS | STATX_BTIME`.
pub const STATX_MASK: u32 = 0x7ff | 0x800;

/// Our attributes as `fuse_statx`, the birth time (`i_crtime`) included.
pub fn statx(a: &Attr) -> Statx {
    let t = |t: SystemTime| {
        let (tv_sec, tv_nsec) = split_time(t);
        SxTime {
            tv_sec,
            tv_nsec,
            reserved: 0,
        }
    };
    let (rdev_major, rdev_minor) = decode_rdev(a.rdev);
    Statx {
        mask: STATX_MASK,
        blksize: a.blksize,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        mode: a.mode,
        ino: a.ino,
        size: a.size,
        blocks: a.blocks,
        atime: t(a.atime),
        btime: t(a.crtime),
        ctime: t(a.ctime),
        mtime: t(a.mtime),
        rdev_major,
        rdev_minor,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::abi::InitOut;
    use super::*;

    fn request(opcode: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (size_of::<InHeader>() + args.len()) as u32,
            opcode,
            unique,
            nodeid,
            uid: 1000,
            gid: 100,
            pid: 42,
            total_extlen: 0,
            padding: 0,
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(args);
        v
    }

    #[test]
    fn header_is_little_endian_at_the_kernels_offsets() {
        let b = request(opcode::LOOKUP, 0x1122, 1, b"a\0");
        assert_eq!(&b[0..4], &42u32.to_le_bytes());
        assert_eq!(&b[4..8], &1u32.to_le_bytes());
        assert_eq!(&b[8..16], &0x1122u64.to_le_bytes());
        assert_eq!(&b[32..36], &42u32.to_le_bytes());
    }

    #[test]
    fn lookup_init_forget_decode() {
        let b = request(opcode::LOOKUP, 7, 1, b"name\0");
        let r = Request::parse(&b).unwrap();
        assert_eq!(r.header.unique, 7);
        assert_eq!((r.header.uid, r.header.gid, r.header.pid), (1000, 100, 42));
        assert_eq!(r.op, Operation::Lookup { name: b"name" });

        // An old kernel's 16-byte INIT, and a 7.36+ one with flags2.
        let mut init = Vec::new();
        for v in [7u32, 31, 131072, 0x8000_0001] {
            init.extend_from_slice(&v.to_le_bytes());
        }
        let b = request(opcode::INIT, 1, 0, &init);
        let Operation::Init(i) = Request::parse(&b).unwrap().op else {
            panic!("not INIT");
        };
        assert_eq!(
            (i.major, i.minor, i.flags, i.flags2),
            (7, 31, 0x8000_0001, 0)
        );
        init.extend_from_slice(&3u32.to_le_bytes());
        init.resize(64, 0);
        let b = request(opcode::INIT, 1, 0, &init);
        let Operation::Init(i) = Request::parse(&b).unwrap().op else {
            panic!("not INIT");
        };
        assert_eq!(i.flags2, 3);

        let b = request(opcode::FORGET, 2, 9, &5u64.to_le_bytes());
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::Forget { nlookup: 5 }
        );
        let mut bf = Vec::new();
        bf.extend_from_slice(&2u32.to_le_bytes());
        bf.extend_from_slice(&0u32.to_le_bytes());
        for (n, l) in [(9u64, 1u64), (10, 3)] {
            bf.extend_from_slice(&n.to_le_bytes());
            bf.extend_from_slice(&l.to_le_bytes());
        }
        let b = request(opcode::BATCH_FORGET, 3, 0, &bf);
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::BatchForget(vec![
                ForgetOne {
                    nodeid: 9,
                    nlookup: 1
                },
                ForgetOne {
                    nodeid: 10,
                    nlookup: 3
                },
            ])
        );
        // An opcode not decoded (SETUPMAPPING, virtiofs only).
        let b = request(48, 4, 1, &[0; 8]);
        assert!(matches!(
            Request::parse(&b).unwrap().op,
            Operation::Other { opcode: 48, .. }
        ));
    }

    #[test]
    fn name_and_payload_requests_decode() {
        let mut m = Vec::new();
        for v in [0o100644u32, 0, 0o022, 0] {
            m.extend_from_slice(&v.to_le_bytes());
        }
        m.extend_from_slice(b"f\0");
        let b = request(opcode::MKNOD, 1, 1, &m);
        let Operation::Mknod { arg, name } = Request::parse(&b).unwrap().op else {
            panic!("not MKNOD");
        };
        assert_eq!((arg.mode, arg.umask, name), (0o100644, 0o022, &b"f"[..]));

        let b = request(opcode::SYMLINK, 1, 1, b"l\0/t/x\0");
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::Symlink {
                name: b"l",
                target: b"/t/x"
            }
        );
        let mut r = 9u64.to_le_bytes().to_vec();
        r.extend_from_slice(&2u32.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(b"a\0b\0");
        let b = request(opcode::RENAME2, 1, 1, &r);
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::Rename {
                newdir: 9,
                flags: 2,
                name: b"a",
                newname: b"b"
            }
        );
        let w = WriteIn {
            fh: 4,
            offset: 8192,
            size: 3,
            ..Default::default()
        };
        let mut wb = w.as_bytes().to_vec();
        wb.extend_from_slice(b"xyz");
        let b = request(opcode::WRITE, 1, 5, &wb);
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::Write {
                arg: w,
                data: b"xyz"
            }
        );
        // A write whose data is not the size it says.
        wb.push(b'!');
        let b = request(opcode::WRITE, 1, 5, &wb);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::ShortArgs { .. })
        ));
        // A rename with one name only.
        let b = request(opcode::RENAME, 1, 1, &[9, 0, 0, 0, 0, 0, 0, 0, b'a', 0]);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::BadName { .. })
        ));
        // Every truncation of a SETATTR is an error.
        let sa = SetattrIn::default();
        for n in 0..size_of::<SetattrIn>() {
            let b = request(opcode::SETATTR, 1, 1, &sa.as_bytes()[..n]);
            assert!(Request::parse(&b).is_err());
        }
    }

    #[test]
    fn xattr_and_file_requests_decode() {
        let mut x = 3u32.to_le_bytes().to_vec();
        x.extend_from_slice(&1u32.to_le_bytes());
        x.extend_from_slice(b"user.a\0val");
        let b = request(opcode::SETXATTR, 1, 5, &x);
        assert_eq!(
            Request::parse(&b).unwrap().op,
            Operation::Setxattr {
                flags: 1,
                name: b"user.a",
                value: b"val"
            }
        );
        x.push(0);
        let b = request(opcode::SETXATTR, 1, 5, &x);
        assert!(Request::parse(&b).is_err());
        let io = IoctlIn {
            cmd: 0xc018_6679,
            in_size: 24,
            ..Default::default()
        };
        let mut ib = io.as_bytes().to_vec();
        ib.extend_from_slice(&[7; 10]);
        let b = request(opcode::IOCTL, 1, 5, &ib);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::ShortArgs { .. })
        ));
        let b = request(opcode::SYNCFS, 1, 1, &[0; 8]);
        assert_eq!(Request::parse(&b).unwrap().op, Operation::Syncfs);
        let sx = StatxIn {
            sx_mask: 0x800,
            ..Default::default()
        };
        let b = request(opcode::STATX, 1, 5, sx.as_bytes());
        assert_eq!(Request::parse(&b).unwrap().op, Operation::Statx(sx));
    }

    #[test]
    fn tmpfile_decodes_as_create() {
        // fuse_create_in (flags, mode, umask, open_flags), then the VFS's
        // placeholder name (`fuse_create_open(..., FUSE_TMPFILE)`).
        let mut a = Vec::new();
        for v in [0o102_002u32, 0o100_640, 0o022, 0] {
            a.extend_from_slice(&v.to_le_bytes());
        }
        a.extend_from_slice(b"/\0");
        let b = request(opcode::TMPFILE, 3, 9, &a);
        let r = Request::parse(&b).unwrap();
        assert_eq!(r.header.nodeid, 9);
        let Operation::Tmpfile { arg, name } = r.op else {
            panic!("not a TMPFILE: {:?}", r.op);
        };
        assert_eq!(
            (arg.flags, arg.mode, arg.umask),
            (0o102_002, 0o100_640, 0o022)
        );
        assert_eq!(name, b"/");
        // Malformed: no NUL after the name, a short fuse_create_in.
        let b = request(opcode::TMPFILE, 3, 9, &a[..a.len() - 1]);
        assert!(Request::parse(&b).is_err());
        let b = request(opcode::TMPFILE, 3, 9, &a[..12]);
        assert!(Request::parse(&b).is_err());
    }

    #[test]
    fn notifies_and_reply_bodies_encode() {
        let m = notify_inval_entry(1, b"ab");
        assert_eq!(m.len(), 16 + 16 + 3);
        assert_eq!(&m[0..4], &35u32.to_ne_bytes());
        assert_eq!(&m[4..8], &3i32.to_ne_bytes());
        assert_eq!(&m[8..16], &0u64.to_ne_bytes());
        assert_eq!(&m[32..35], b"ab\0");
        let m = notify_inval_inode(9, -1, 0);
        assert_eq!(m.len(), 40);
        assert_eq!(&m[4..8], &2i32.to_ne_bytes());
        assert_eq!(&m[24..32], &(-1i64).to_ne_bytes());
        let o = open_out(&Opened { fh: 5, flags: 3 });
        assert_eq!((o.fh, o.open_flags), (5, 3));
    }

    #[test]
    fn dirents_are_padded_and_stop_when_full() {
        let mut out = Vec::new();
        assert!(push_dirent(&mut out, 64, 5, 1, 4, b"abc"));
        assert_eq!(out.len(), 32);
        assert_eq!(&out[16..20], &3u32.to_le_bytes());
        assert_eq!(&out[24..27], b"abc");
        assert_eq!(&out[27..32], &[0; 5]);
        // 24 + 9 = 33, padded to 40: does not fit in the 32 left.
        assert!(!push_dirent(&mut out, 64, 6, 2, 8, b"123456789"));
        assert_eq!(out.len(), 32);
        let e = EntryOut {
            nodeid: 7,
            ..Default::default()
        };
        let mut p = Vec::new();
        assert!(push_direntplus(&mut p, 160, &e, 1, 8, b"x"));
        assert_eq!(p.len(), 128 + 32);
        assert_eq!(&p[128..136], &7u64.to_le_bytes());
        assert!(!push_direntplus(&mut p, 200, &e, 2, 8, b"y"));
    }

    #[test]
    fn every_malformed_request_is_an_error() {
        assert_eq!(Request::parse(&[0; 10]), Err(ProtoError::ShortHeader(10)));
        let mut b = request(opcode::LOOKUP, 1, 1, b"x\0");
        b.push(0);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::BadLength { .. })
        ));
        let b = request(opcode::LOOKUP, 1, 1, b"no-nul");
        assert_eq!(Request::parse(&b), Err(ProtoError::BadName { opcode: 1 }));
        let b = request(opcode::INIT, 1, 0, &[0; 12]);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::ShortArgs { .. })
        ));
        let b = request(opcode::FORGET, 1, 1, &[0; 7]);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::ShortArgs { .. })
        ));
        // A batch claiming more entries than the request holds.
        let mut bf = u32::MAX.to_le_bytes().to_vec();
        bf.extend_from_slice(&[0; 4 + 16]);
        let b = request(opcode::BATCH_FORGET, 1, 0, &bf);
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::ShortArgs { .. })
        ));
        // Extensions longer than the request.
        let mut b = request(opcode::GETATTR, 1, 1, &[0; 16]);
        b[36..38].copy_from_slice(&100u16.to_le_bytes());
        assert!(matches!(
            Request::parse(&b),
            Err(ProtoError::BadExtensions { .. })
        ));
        // Every opcode with argument bytes of every length up to 300
        // (a pattern with NULs, and none): an answer, never a panic.
        for op in 0..=60 {
            for n in 0..300 {
                for fill in [|i: usize| (i * 37 % 11) as u8, |_: usize| 0xffu8] {
                    let args: Vec<u8> = (0..n).map(fill).collect();
                    let _ = Request::parse(&request(op, 1, 1, &args));
                }
            }
        }
        // Every prefix of a valid request, and every byte value at
        // every position of it, decodes or fails without a panic.
        let valid = request(opcode::BATCH_FORGET, 1, 0, &bf[..8]);
        for n in 0..valid.len() {
            let _ = Request::parse(&valid[..n]);
        }
        for i in 0..valid.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut m = valid.clone();
                m[i] = v;
                let _ = Request::parse(&m);
            }
        }
    }

    #[test]
    fn replies_encode_header_and_body() {
        let out = InitOut {
            major: 7,
            minor: 43,
            ..Default::default()
        };
        let r = reply_struct(9, &out);
        assert_eq!(r.len(), 16 + 64);
        assert_eq!(&r[0..4], &80u32.to_le_bytes());
        assert_eq!(&r[4..8], &0i32.to_le_bytes());
        assert_eq!(&r[8..16], &9u64.to_le_bytes());
        assert_eq!(&r[16..20], &7u32.to_le_bytes());
        let e = reply_error(5, libc::ENOSYS);
        assert_eq!(e.len(), 16);
        assert_eq!(&e[4..8], &(-libc::ENOSYS).to_le_bytes());
    }

    #[test]
    fn attributes_encode_with_times_before_1970() {
        assert_eq!(split_time(UNIX_EPOCH + Duration::new(5, 7)), (5, 7));
        assert_eq!(
            split_time(UNIX_EPOCH - Duration::new(1, 250_000_000)),
            (-2, 750_000_000)
        );
        assert_eq!(split_time(UNIX_EPOCH - Duration::from_secs(3)), (-3, 0));
        let t = UNIX_EPOCH + Duration::new(100, 1);
        let a = Attr {
            ino: 12,
            size: 4096,
            blocks: 8,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: UNIX_EPOCH - Duration::new(0, 1),
            mode: 0o20644,
            nlink: 1,
            uid: 1,
            gid: 2,
            rdev: crate::attr::encode_rdev(8, 300),
            blksize: 4096,
        };
        let e = entry_out(
            &Entry {
                attr: a,
                generation: 3,
                volatile: false,
            },
            Duration::from_millis(1500),
        );
        assert_eq!((e.nodeid, e.generation), (12, 3));
        assert_eq!((e.entry_valid, e.entry_valid_nsec), (1, 500_000_000));
        // A casefolded directory's name: 0 s, its attributes the TTL.
        let v = entry_out(
            &Entry {
                attr: a,
                generation: 3,
                volatile: true,
            },
            Duration::from_millis(1500),
        );
        assert_eq!((v.entry_valid, v.entry_valid_nsec), (0, 0));
        assert_eq!((v.attr_valid, v.attr_valid_nsec), (1, 500_000_000));
        assert_eq!(
            (e.attr.mtime, e.attr.mtimensec, e.attr.mode),
            (100, 1, 0o20644)
        );
        let s = statx(&a);
        assert_eq!((s.btime.tv_sec, s.btime.tv_nsec), (-1, 999_999_999));
        assert_eq!((s.rdev_major, s.rdev_minor), (8, 300));
        assert_eq!(s.mask & 0x800, 0x800);
        assert_eq!(attr_out(&a, Duration::ZERO).attr, e.attr);
    }
}
