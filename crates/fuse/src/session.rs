//! Our own FUSE session loop (`-o transport=ext4kit`, experimental; see
//! ARCHITECTURE "Our own FUSE transport", step 3): on the `/dev/fuse` fd
//! the mount code got (our own mount(2) as root, `fusermount3`
//! otherwise), INIT negotiated as [`crate::mount::negotiate`] does for
//! fuser, then N workers, each on its own clone of the fd
//! (`FUSE_DEV_IOC_CLONE`): each reads one request into its own buffer (max_write + a page), decodes it ([`Request::parse`]),
//! calls the `op_*` method ([`crate::ops`]) and writes the reply with
//! one write(2). FORGET/BATCH_FORGET and INTERRUPT get no reply (an
//! interrupted request is simply answered when done); opcodes not served
//! are ENOSYS; a request that does not decode is EIO (when its header
//! does). ENODEV on read: the mount is gone, the loop ends. The notifies
//! ([`Notify`]) are writes of an out header with `unique` 0.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileType};
use zerocopy::{FromBytes, IntoBytes};

use crate::ops::{Caller, Entry, FuseFs, Opened, SetAttrIn, SetTime, TTL, XattrReply};
use crate::proto::abi::{
    self, GetxattrOut, InHeader, InitIn, InitOut, IoctlOut, LseekOut, SetattrIn, WriteOut, fattr,
    opcode,
};
use crate::proto::codec::{self, Operation, Request};
use crate::shared::{Backend, Notify, Shared};

/// The largest WRITE offered (fuser's; the kernel caps it at
/// `fs.fuse.max_pages_limit` pages).
pub(crate) const MAX_WRITE: u32 = 16 * 1024 * 1024;
/// A request buffer: the largest WRITE and its headers.
const BUF_SIZE: usize = MAX_WRITE as usize + 4096;
/// The oldest protocol served (the decoder takes the current layouts).
const MIN_MINOR: u32 = 31;
/// Background requests (readahead, writeback) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;

/// `FUSE_*` INIT flags (`flags`, and `flags2` shifted by 32).
pub(crate) mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
}

/// INIT's answer as plain data: what `negotiate` asks of fuser's
/// `KernelConfig`, with fuser's own defaults (async reads, big writes,
/// max_pages, 16 MiB writes, 1 ns times, the kernel's readahead).
pub(crate) fn init_reply(shared: &Shared, init: &InitIn, uring: bool) -> (InitOut, bool, bool) {
    let rw = matches!(shared.backend, Backend::Rw(_));
    let mut kernel = u64::from(init.flags);
    if kernel & init::INIT_EXT != 0 {
        kernel |= u64::from(init.flags2) << 32;
    }
    let mut want = init::ASYNC_READ
        | init::BIG_WRITES
        | init::MAX_PAGES
        | init::POSIX_ACL
        | init::DONT_MASK
        | init::PARALLEL_DIROPS
        | init::CACHE_SYMLINKS
        | init::DO_READDIRPLUS
        | init::READDIRPLUS_AUTO;
    if rw {
        want |= init::HANDLE_KILLPRIV_V2;
    }
    if shared.opts.writeback_cache && rw {
        want |= init::WRITEBACK_CACHE;
    }
    if uring {
        want |= crate::uring::OVER_IO_URING;
    }
    let mut got = want & kernel;
    if kernel & init::INIT_EXT != 0 {
        got |= init::INIT_EXT;
    }
    let page = 4096u32;
    let max_readahead = init.max_readahead;
    let max_pages = ((MAX_WRITE.max(max_readahead) - 1) / page + 1).min(u32::from(u16::MAX));
    let out = InitOut {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION,
        max_readahead,
        flags: got as u32,
        max_background: MAX_BACKGROUND,
        congestion_threshold: MAX_BACKGROUND * 3 / 4,
        max_write: MAX_WRITE,
        time_gran: 1,
        max_pages: max_pages as u16,
        flags2: (got >> 32) as u32,
        ..InitOut::default()
    };
    (
        out,
        got & init::WRITEBACK_CACHE != 0,
        got & init::HANDLE_KILLPRIV_V2 != 0,
    )
}

/// The notifies of our own session: one write of the message each.
pub(crate) struct DevNotifier(pub Arc<File>);

impl Notify for DevNotifier {
    fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        send(&self.0, &codec::notify_inval_inode(ino, off, len))
    }

    fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        send(&self.0, &codec::notify_inval_entry(parent, name))
    }
}

/// One message to the kernel, in one write(2) (the kernel takes a
/// message only whole).
fn send(fd: &File, msg: &[u8]) -> io::Result<()> {
    let n = (&*fd).write(msg)?;
    if n != msg.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short write"));
    }
    Ok(())
}

/// A reply: a request interrupted or aborted meanwhile (ENOENT) is not
/// an error of ours.
fn answer(fd: &File, msg: &[u8]) {
    if let Err(e) = send(fd, msg)
        && e.raw_os_error() != Some(libc::ENOENT)
    {
        tracing::debug!("FUSE reply: {e}");
    }
}

/// What one read(2) of the device brought.
enum Got {
    Request(usize),
    /// Nothing this time (EINTR, EAGAIN, ENOENT: a request gone before
    /// it was read).
    Again,
    /// The connection ended (ENODEV): unmounted or aborted.
    Gone,
}

fn receive(fd: &File, buf: &mut [u8]) -> io::Result<Got> {
    match (&*fd).read(buf) {
        Ok(0) => Ok(Got::Gone),
        Ok(n) => Ok(Got::Request(n)),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENODEV) => Ok(Got::Gone),
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => Ok(Got::Again),
            _ => Err(e),
        },
    }
}

/// A session on `fd` (mounted, INIT not read yet).
pub(crate) struct Session {
    fd: Arc<File>,
    fs: FuseFs,
    /// FUSE over io_uring: the ring threads per queue and entries per
    /// ring wanted, and whether `-o uring` insists (then a fallback says
    /// why on stderr).
    uring: Option<(usize, usize, bool)>,
    /// The rings, when INIT granted FUSE over io_uring.
    rings: Option<crate::uring::Rings>,
}

/// A reply made after `dispatch` returned (LSEEK's completion).
pub(crate) type Later = Box<dyn FnOnce(Vec<u8>) + Send>;

/// A [`Later`] that answers in any case: dropped uncalled (the
/// completion lost on a path that never called it), it sends EIO for
/// its request, so the kernel's request ends and, on io_uring, the
/// ring entry goes back to the kernel.
pub(crate) struct Deferred {
    unique: u64,
    send: Option<Later>,
}

impl Deferred {
    pub(crate) fn new(unique: u64, send: Later) -> Deferred {
        Deferred {
            unique,
            send: Some(send),
        }
    }

    pub(crate) fn send(mut self, msg: Vec<u8>) {
        if let Some(f) = self.send.take() {
            f(msg);
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if let Some(f) = self.send.take() {
            tracing::debug!("request {}: completion dropped; EIO", self.unique);
            f(codec::reply_error(self.unique, libc::EIO));
        }
    }
}

impl Session {
    pub(crate) fn new(fd: OwnedFd, shared: Arc<Shared>) -> Session {
        Session {
            fd: Arc::new(File::from(fd)),
            fs: FuseFs::new(shared),
            uring: None,
            rings: None,
        }
    }

    /// Ask for FUSE over io_uring at INIT, with `per_queue` ring threads
    /// per kernel queue (see [`crate::uring`]).
    pub(crate) fn want_uring(&mut self, per_queue: usize, depth: usize, insist: bool) {
        self.uring = Some((per_queue.max(1), depth.max(1), insist));
    }

    /// INIT granted FUSE over io_uring and the rings were made.
    pub(crate) fn over_uring(&self) -> bool {
        self.rings.is_some()
    }

    /// The rings for INIT's answer, or why not (one line on stderr).
    fn make_rings(&mut self, init: &InitIn, out: &InitOut) {
        let Some((per_queue, depth, insist)) = self.uring else {
            return;
        };
        let mut kernel = u64::from(init.flags);
        if kernel & init::INIT_EXT != 0 {
            kernel |= u64::from(init.flags2) << 32;
        }
        if kernel & crate::uring::OVER_IO_URING == 0 {
            if insist {
                eprintln!(
                    "ext4kit mount: the kernel did not offer FUSE over io_uring at INIT; serving on /dev/fuse"
                );
            } else {
                tracing::debug!("no FUSE over io_uring at INIT; serving on /dev/fuse");
            }
            return;
        }
        let queues = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|l| crate::uring::possible_cpus(&l));
        let Some(queues) = queues else {
            eprintln!("ext4kit mount: io_uring: no CPU list; serving on /dev/fuse");
            return;
        };
        let payload = (out.max_write as usize).max(usize::from(out.max_pages) * 4096);
        match crate::uring::Rings::new(&self.fd, queues, per_queue, depth, payload) {
            Ok(r) => self.rings = Some(r),
            Err(e) => eprintln!("ext4kit mount: io_uring: {e}; serving on /dev/fuse"),
        }
    }

    /// Hold `file` until the io_uring rings are torn down, if there
    /// are rings; else (or when it cannot) it is given back.
    pub(crate) fn hold(&self, file: std::os::fd::OwnedFd) -> Result<(), std::os::fd::OwnedFd> {
        match &self.rings {
            Some(r) => r.hold(file),
            None => Err(file),
        }
    }

    pub(crate) fn notifier(&self) -> Arc<dyn Notify> {
        Arc::new(DevNotifier(self.fd.clone()))
    }

    /// Read and answer INIT (before it the kernel sends nothing else).
    /// An INIT older than 7.31, or of another major, is refused (EPROTO).
    pub(crate) fn handshake(&mut self) -> io::Result<()> {
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let n = match receive(&self.fd, &mut buf)? {
                Got::Request(n) => n,
                Got::Again => continue,
                Got::Gone => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "the FUSE connection ended before INIT",
                    ));
                }
            };
            let req = Request::parse(&buf[..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let unique = req.header.unique;
            let Operation::Init(init) = req.op else {
                answer(&self.fd, &codec::reply_error(unique, libc::EIO));
                continue;
            };
            if init.major > abi::KERNEL_VERSION {
                // The kernel asks again with our major.
                let out = InitOut {
                    major: abi::KERNEL_VERSION,
                    minor: abi::KERNEL_MINOR_VERSION,
                    ..InitOut::default()
                };
                answer(&self.fd, &codec::reply_struct(unique, &out));
                continue;
            }
            if init.major < abi::KERNEL_VERSION || init.minor < MIN_MINOR {
                answer(&self.fd, &codec::reply_error(unique, libc::EPROTO));
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "FUSE protocol {}.{} is older than 7.{MIN_MINOR}",
                        init.major, init.minor
                    ),
                ));
            }
            let (out, ..) = init_reply(&self.fs.s, &init, false);
            self.make_rings(&init, &out);
            let (out, writeback, killpriv) = init_reply(&self.fs.s, &init, self.rings.is_some());
            self.fs.set_negotiated(writeback, killpriv);
            send(&self.fd, &codec::reply_struct(unique, &out))?;
            return Ok(());
        }
    }

    /// A worker's own fd: a clone of the session's (`FUSE_DEV_IOC_CLONE`:
    /// the kernel keeps a processing queue per fd, so the workers do not
    /// share one), or the session's own where cloning fails (not a
    /// `/dev/fuse` fd, as in the unit tests).
    fn worker_fd(&self) -> Arc<File> {
        match ext4kit_device::fuse_clone(self.fd.as_fd()) {
            Ok(fd) => Arc::new(File::from(fd)),
            Err(e) => {
                tracing::debug!("FUSE_DEV_IOC_CLONE: {e}; the worker shares the fd");
                self.fd.clone()
            }
        }
    }

    /// Serve with `threads` workers until the connection ends; DESTROY
    /// (or the end of the connection without it) calls `op_destroy` once.
    pub(crate) fn run(mut self, threads: usize) -> io::Result<()> {
        let destroyed = Arc::new(AtomicBool::new(false));
        // The rings first: the kernel holds every request until all its
        // queues have an entry.
        let (rings, stopper) = match self.rings.take() {
            Some(r) => {
                let n = r.len();
                let (t, s) = r.start(&self.fs, &destroyed)?;
                tracing::debug!("FUSE over io_uring: {n} rings");
                (t, Some(s))
            }
            None => (Vec::new(), None),
        };
        let workers: Vec<_> = (0..threads.max(1))
            .map(|i| {
                let fd = if i == 0 {
                    self.fd.clone()
                } else {
                    self.worker_fd()
                };
                let (fs, destroyed) = (self.fs.clone(), destroyed.clone());
                thread::Builder::new()
                    .name(format!("ext4kit-fuse-{i}"))
                    .spawn(move || worker(&fd, &fs, &destroyed))
            })
            .collect::<io::Result<_>>()?;
        let mut result = Ok(());
        let mut join = |w: thread::JoinHandle<io::Result<()>>| match w.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => result = Err(e),
            Err(_) => result = Err(io::Error::other("a FUSE worker panicked")),
        };
        for w in workers {
            join(w);
        }
        // The connection ended: the kernel tore its queues down (each
        // entry ENOTCONN); end the rings that still wait.
        if let Some(s) = stopper {
            s.stop();
        }
        for r in rings {
            join(r);
        }
        if !destroyed.swap(true, Ordering::SeqCst) {
            self.fs.op_destroy();
        }
        result
    }
}

fn worker(fd: &Arc<File>, fs: &FuseFs, destroyed: &AtomicBool) -> io::Result<()> {
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        match receive(fd, &mut buf)? {
            Got::Request(n) => {
                let later = || -> Later {
                    let fd = fd.clone();
                    Box::new(move |msg| answer(&fd, &msg))
                };
                if let Some(msg) = dispatch(fs, &buf[..n], destroyed, later) {
                    answer(fd, &msg);
                }
            }
            Got::Again => {}
            Got::Gone => return Ok(()),
        }
    }
}

fn caller(h: &InHeader) -> Caller {
    Caller {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    }
}

fn err(unique: u64, e: Errno) -> Vec<u8> {
    codec::reply_error(unique, e.code())
}

fn entry(unique: u64, r: Result<Entry, Errno>) -> Vec<u8> {
    match r {
        Ok(e) => codec::reply_struct(unique, &codec::entry_out(&e, TTL)),
        Err(e) => err(unique, e),
    }
}

fn empty(unique: u64, r: Result<(), Errno>) -> Vec<u8> {
    match r {
        Ok(()) => codec::reply(unique, &[]),
        Err(e) => err(unique, e),
    }
}

fn opened(unique: u64, r: Result<Opened, Errno>) -> Vec<u8> {
    match r {
        Ok(o) => codec::reply_struct(unique, &codec::open_out(&o)),
        Err(e) => err(unique, e),
    }
}

fn xattr(unique: u64, r: Result<XattrReply, Errno>) -> Vec<u8> {
    match r {
        Ok(XattrReply::Size(size)) => {
            codec::reply_struct(unique, &GetxattrOut { size, padding: 0 })
        }
        Ok(XattrReply::Data(v)) => codec::reply(unique, &[&v]),
        Err(e) => err(unique, e),
    }
}

fn written(unique: u64, r: Result<u32, Errno>) -> Vec<u8> {
    match r {
        Ok(size) => codec::reply_struct(unique, &WriteOut { size, padding: 0 }),
        Err(e) => err(unique, e),
    }
}

/// A `d_type` of a dirent.
fn dtype(k: FileType) -> u32 {
    match k {
        FileType::NamedPipe => 1,
        FileType::CharDevice => 2,
        FileType::Directory => 4,
        FileType::BlockDevice => 6,
        FileType::RegularFile => 8,
        FileType::Symlink => 10,
        FileType::Socket => 12,
    }
}

/// A SETATTR time as the op layer takes it: in fuser 0.18.0's form,
/// which `attr::setattr_time` inverts (before 1970 `EPOCH - (|sec| +
/// nsec)`, see there), so both transports pass the same value.
fn time(sec: u64, nsec: u32) -> SystemTime {
    let s = sec as i64;
    let n = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    if s >= 0 {
        UNIX_EPOCH + Duration::from_secs(s as u64) + n
    } else {
        UNIX_EPOCH - (Duration::from_secs(s.unsigned_abs()) + n)
    }
}

/// SETATTR's `valid` bits as the op layer's fields.
fn setattr_in(a: &SetattrIn) -> SetAttrIn {
    let has = |b: u32| a.valid & b != 0;
    let t = |now: u32, at: u32, sec: u64, nsec: u32| {
        if has(now) {
            Some(SetTime::Now)
        } else if has(at) {
            Some(SetTime::At(time(sec, nsec)))
        } else {
            None
        }
    };
    SetAttrIn {
        mode: has(fattr::MODE).then_some(a.mode),
        uid: has(fattr::UID).then_some(a.uid),
        gid: has(fattr::GID).then_some(a.gid),
        size: has(fattr::SIZE).then_some(a.size),
        atime: t(fattr::ATIME_NOW, fattr::ATIME, a.atime, a.atimensec),
        mtime: t(fattr::MTIME_NOW, fattr::MTIME, a.mtime, a.mtimensec),
        ctime: has(fattr::CTIME).then(|| time(a.ctime, a.ctimensec)),
    }
}

/// Serve one request (exactly what one read returned); the reply, or
/// `None` for the requests without one. LSEEK may answer from a thread
/// of its own (see `FuseFs::op_lseek`): its reply goes to the sink
/// `later` makes (the transport's: a write on the worker's fd, a commit
/// into the ring entry), and `dispatch` returns `None`.
pub(crate) fn dispatch(
    fs: &FuseFs,
    buf: &[u8],
    destroyed: &AtomicBool,
    later: impl FnOnce() -> Later,
) -> Option<Vec<u8>> {
    let req = match Request::parse(buf) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("FUSE request not decoded: {e}");
            // Answer it if its header says which it was (not a FORGET).
            let (h, _) = InHeader::read_from_prefix(buf).ok()?;
            return (h.opcode != opcode::FORGET && h.opcode != opcode::BATCH_FORGET)
                .then(|| codec::reply_error(h.unique, libc::EIO));
        }
    };
    let h = req.header;
    let (u, ino) = (h.unique, h.nodeid);
    let msg = match req.op {
        Operation::Init(_) => codec::reply_error(u, libc::EIO),
        Operation::Lookup { name } => entry(u, fs.op_lookup(ino, name)),
        Operation::Forget { nlookup } => {
            fs.op_forget(ino, nlookup);
            return None;
        }
        Operation::BatchForget(v) => {
            for f in v {
                fs.op_forget(f.nodeid, f.nlookup);
            }
            return None;
        }
        Operation::Interrupt { .. } => return None,
        Operation::Getattr(_) => match fs.op_getattr(ino) {
            Ok(a) => codec::reply_struct(u, &codec::attr_out(&a, TTL)),
            Err(e) => err(u, e),
        },
        Operation::Setattr(a) => {
            let kill = Some(a.valid & fattr::KILL_SUIDGID != 0);
            match fs.op_setattr(&caller(&h), ino, setattr_in(&a), kill) {
                Ok(a) => codec::reply_struct(u, &codec::attr_out(&a, TTL)),
                Err(e) => err(u, e),
            }
        }
        Operation::Mknod { arg, name } => entry(
            u,
            fs.op_mknod(&caller(&h), ino, name, arg.mode, arg.umask, arg.rdev),
        ),
        Operation::Mkdir { arg, name } => {
            entry(u, fs.op_mkdir(&caller(&h), ino, name, arg.mode, arg.umask))
        }
        Operation::Unlink { name } => empty(u, fs.op_unlink(ino, name)),
        Operation::Rmdir { name } => empty(u, fs.op_rmdir(ino, name)),
        Operation::Symlink { name, target } => {
            entry(u, fs.op_symlink(&caller(&h), ino, name, target))
        }
        Operation::Rename {
            newdir,
            flags,
            name,
            newname,
        } => empty(
            u,
            fs.op_rename(&caller(&h), ino, name, newdir, newname, flags),
        ),
        Operation::Link { oldnodeid, name } => entry(u, fs.op_link(oldnodeid, ino, name)),
        Operation::Open(_) if h.opcode == opcode::OPENDIR => opened(u, fs.op_opendir(ino)),
        Operation::Open(o) => opened(u, fs.op_open(ino, o.flags as i32)),
        Operation::Create { arg, name } => {
            match fs.op_create(
                &caller(&h),
                ino,
                name,
                arg.mode,
                arg.umask,
                arg.flags as i32,
            ) {
                Ok((e, o)) => codec::reply(
                    u,
                    &[
                        codec::entry_out(&e, TTL).as_bytes(),
                        codec::open_out(&o).as_bytes(),
                    ],
                ),
                Err(e) => err(u, e),
            }
        }
        Operation::Tmpfile { arg, name: _ } => {
            match fs.op_tmpfile(&caller(&h), ino, arg.mode, arg.umask, arg.flags as i32) {
                Ok((e, o)) => codec::reply(
                    u,
                    &[
                        codec::entry_out(&e, TTL).as_bytes(),
                        codec::open_out(&o).as_bytes(),
                    ],
                ),
                Err(e) => err(u, e),
            }
        }
        Operation::Read(r) if h.opcode == opcode::READDIR => {
            let max = r.size as usize;
            let mut out = Vec::with_capacity(max.min(1 << 20));
            let res = fs.op_readdir(ino, r.fh, r.offset, &mut |e| {
                !codec::push_dirent(&mut out, max, e.ino, e.offset, dtype(e.kind), e.name)
            });
            match res {
                Ok(()) => codec::reply(u, &[&out]),
                Err(e) => err(u, e),
            }
        }
        Operation::Read(r) if h.opcode == opcode::READDIRPLUS => {
            let max = r.size as usize;
            let mut out = Vec::with_capacity(max.min(1 << 20));
            let res = fs.op_readdirplus(ino, r.fh, r.offset, &mut |e| {
                let kind = dtype(crate::attr::file_type(e.entry.attr.mode));
                let eo = codec::entry_out(&e.entry, TTL);
                !codec::push_direntplus(&mut out, max, &eo, e.offset, kind, e.name)
            });
            match res {
                Ok(()) => codec::reply(u, &[&out]),
                Err(e) => err(u, e),
            }
        }
        Operation::Read(r) => match fs.op_read(ino, r.offset, r.size) {
            Ok(d) => codec::reply(u, &[&d]),
            Err(e) => err(u, e),
        },
        Operation::Write { arg, data } => written(
            u,
            fs.op_write(
                &caller(&h),
                ino,
                arg.fh,
                arg.offset,
                data,
                arg.write_flags & abi::WRITE_KILL_SUIDGID != 0,
                arg.write_flags & WRITE_CACHE != 0,
                arg.flags as i32,
            ),
        ),
        Operation::Release(r) => {
            if h.opcode == opcode::RELEASEDIR {
                fs.op_releasedir(r.fh);
            } else {
                fs.op_release(r.fh);
            }
            codec::reply(u, &[])
        }
        Operation::Flush(_) => empty(u, fs.op_flush(ino)),
        Operation::Fsync(_) => empty(u, fs.op_fsync(ino)),
        Operation::Statfs => match fs.op_statfs() {
            Ok(s) => codec::reply_struct(u, &codec::statfs_out(&s)),
            Err(e) => err(u, e),
        },
        Operation::Setxattr { flags, name, value } => {
            empty(u, fs.op_setxattr(ino, name, value, flags as i32))
        }
        Operation::Getxattr { size, name } => xattr(u, fs.op_getxattr(ino, name, size)),
        Operation::Listxattr { size } => xattr(u, fs.op_listxattr(&caller(&h), ino, size)),
        Operation::Removexattr { name } => empty(u, fs.op_removexattr(ino, name)),
        Operation::Access { mask } => empty(u, fs.op_access(&caller(&h), ino, mask as i32)),
        Operation::Lseek(l) => {
            let send = Deferred::new(u, later());
            fs.op_lseek(ino, l.offset as i64, l.whence as i32, move |r| {
                let msg = match r {
                    Ok(offset) => codec::reply_struct(
                        u,
                        &LseekOut {
                            offset: offset as u64,
                        },
                    ),
                    Err(e) => err(u, e),
                };
                send.send(msg);
            });
            return None;
        }
        Operation::Fallocate(f) => empty(
            u,
            fs.op_fallocate(&caller(&h), ino, f.offset, f.length, f.mode as i32),
        ),
        Operation::CopyFileRange(c) => written(
            u,
            fs.op_copy_file_range(
                &caller(&h),
                (ino, c.fh_in, c.off_in),
                (c.nodeid_out, c.fh_out, c.off_out),
                c.len,
                c.flags,
            ),
        ),
        Operation::Ioctl { arg, data } => {
            match fs.op_ioctl(&caller(&h), ino, arg.cmd, data, arg.out_size) {
                Ok(d) => {
                    let o = IoctlOut::default();
                    codec::reply(u, &[o.as_bytes(), &d])
                }
                Err(e) => err(u, e),
            }
        }
        Operation::Statx(_) => match fs.op_getattr(ino) {
            Ok(a) => codec::reply_struct(u, &codec::statx_out(&a, TTL)),
            Err(e) => err(u, e),
        },
        Operation::Destroy => {
            if !destroyed.swap(true, Ordering::SeqCst) {
                fs.op_destroy();
            }
            codec::reply(u, &[])
        }
        Operation::Other {
            opcode: opcode::READLINK,
            ..
        } => match fs.op_readlink(ino) {
            Ok(d) => codec::reply(u, &[&d]),
            Err(e) => err(u, e),
        },
        Operation::Syncfs => empty(u, fs.op_syncfs()),
        Operation::Other { .. } => codec::reply_error(u, libc::ENOSYS),
    };
    Some(msg)
}

/// `FUSE_WRITE_CACHE` in `write_flags`: a write-back of cached pages.
const WRITE_CACHE: u32 = 1 << 0;

#[cfg(test)]
mod tests {
    #[test]
    fn a_deferred_reply_dropped_uncalled_answers_eio() {
        use std::sync::{Arc, Mutex};
        let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let sink = |g: &Arc<Mutex<Vec<Vec<u8>>>>| -> super::Later {
            let g = g.clone();
            Box::new(move |m| g.lock().unwrap().push(m))
        };
        // Called: its own reply, once.
        super::Deferred::new(5, sink(&got)).send(codec::reply(5, &[b"x"]));
        // Dropped uncalled: EIO for its unique.
        drop(super::Deferred::new(6, sink(&got)));
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], codec::reply(5, &[b"x"]));
        let (h, rest) = OutHeader::read_from_prefix(&got[1]).unwrap();
        assert_eq!((h.unique, h.error, rest.len()), (6, -libc::EIO, 0));
    }

    use super::*;
    use crate::options::MountOptions;
    use crate::proto::abi::{AttrOut, Dirent, EntryOut, MkdirIn, OpenOut, OutHeader, ReadIn};
    use ext4kit::testing::MemImage;
    use ext4kit_fs::fs::Filesystem;
    use ext4kit_fs::rw::RwOptions;

    fn shared(opts: MountOptions) -> Arc<Shared> {
        let dev = MemImage::new(16 << 20, 1024, 16384).make().unwrap();
        let fs = Filesystem::open(Arc::new(dev), RwOptions::default()).unwrap();
        Arc::new(Shared::new(Backend::Rw(Arc::new(fs)), opts))
    }

    fn request(opcode: u32, unique: u64, nodeid: u64, args: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (size_of::<InHeader>() + args.len()) as u32,
            opcode,
            unique,
            nodeid,
            uid: 0,
            gid: 0,
            pid: 42,
            total_extlen: 0,
            padding: 0,
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(args);
        v
    }

    /// Serve `req`; the reply's header (checked: its length is the
    /// reply's, the unique echoed) and body.
    fn serve(fs: &FuseFs, req: &[u8]) -> Option<(OutHeader, Vec<u8>)> {
        let msg = dispatch(fs, req, &AtomicBool::new(false), || Box::new(|_| {}))?;
        let (h, body) = OutHeader::read_from_prefix(&msg).unwrap();
        assert_eq!(h.len as usize, msg.len());
        let (ih, _) = InHeader::read_from_prefix(req).unwrap();
        assert_eq!(h.unique, ih.unique);
        Some((h, body.to_vec()))
    }

    fn mkdir(name: &str) -> Vec<u8> {
        let mut a = MkdirIn {
            mode: 0o40755,
            umask: 0o022,
        }
        .as_bytes()
        .to_vec();
        a.extend_from_slice(name.as_bytes());
        a.push(0);
        a
    }

    #[test]
    fn init_reply_asks_what_negotiate_asks() {
        let all = InitIn {
            major: 7,
            minor: 43,
            max_readahead: 128 << 10,
            flags: u32::MAX,
            flags2: u32::MAX,
            unused: [0; 11],
        };
        let s = shared(MountOptions::default());
        let (out, writeback, killpriv) = init_reply(&s, &all, false);
        let f = u64::from(out.flags) | u64::from(out.flags2) << 32;
        for want in [
            init::ASYNC_READ,
            init::BIG_WRITES,
            init::MAX_PAGES,
            init::POSIX_ACL,
            init::DONT_MASK,
            init::PARALLEL_DIROPS,
            init::CACHE_SYMLINKS,
            init::DO_READDIRPLUS,
            init::READDIRPLUS_AUTO,
            init::HANDLE_KILLPRIV_V2,
            init::INIT_EXT,
        ] {
            assert_ne!(f & want, 0, "{want:#x}");
        }
        // Nothing else: no writeback cache unless asked, no
        // FUSE_SETXATTR_EXT (bit 29: the decoder takes the 8-byte form).
        assert_eq!(f & init::WRITEBACK_CACHE, 0);
        assert_eq!(f & (1 << 29), 0);
        assert!(!writeback && killpriv);
        assert_eq!((out.major, out.minor), (7, 43));
        assert_eq!(out.max_write, MAX_WRITE);
        assert_eq!(out.max_pages, 4096);
        assert_eq!(out.max_readahead, 128 << 10);
        assert_eq!((out.max_background, out.congestion_threshold), (64, 48));
        assert_eq!(out.time_gran, 1);
        // A kernel without a capability does not get it; with the
        // writeback cache asked for it is on.
        let o = MountOptions {
            writeback_cache: true,
            ..MountOptions::default()
        };
        let few = InitIn {
            flags: (init::ASYNC_READ | init::WRITEBACK_CACHE) as u32,
            ..all
        };
        let (out, writeback, killpriv) = init_reply(&shared(o), &few, false);
        assert_eq!(
            u64::from(out.flags),
            init::ASYNC_READ | init::WRITEBACK_CACHE
        );
        assert_eq!(out.flags2, 0);
        assert!(writeback && !killpriv);
    }

    #[test]
    fn dispatch_answers_byte_fixtures() {
        let fs = FuseFs::new(shared(MountOptions::default()));
        // LOOKUP: an entry (lost+found is inode 11), then a negative
        // one (node 0: the kernel caches the name's absence).
        let (h, b) = serve(&fs, &request(opcode::LOOKUP, 1, 1, b"lost+found\0")).unwrap();
        assert_eq!(h.error, 0);
        let (e, rest) = EntryOut::read_from_prefix(&b).unwrap();
        assert!(rest.is_empty());
        assert_eq!((e.nodeid, e.attr.mode & 0o170000), (11, 0o040000));
        let (h, b) = serve(&fs, &request(opcode::LOOKUP, 2, 1, b"nope\0")).unwrap();
        let (e, _) = EntryOut::read_from_prefix(&b).unwrap();
        assert_eq!((h.error, e.nodeid), (0, 0));
        // GETATTR of the root.
        let (h, b) = serve(&fs, &request(opcode::GETATTR, 3, 1, &[0; 16])).unwrap();
        assert_eq!(h.error, 0);
        let (a, _) = AttrOut::read_from_prefix(&b).unwrap();
        assert_eq!((a.attr.ino, a.attr.mode & 0o170000), (1, 0o040000));
        // MKDIR, then READDIR of the root lists it.
        let (h, b) = serve(&fs, &request(opcode::MKDIR, 4, 1, &mkdir("sub"))).unwrap();
        assert_eq!(h.error, 0);
        let (sub, _) = EntryOut::read_from_prefix(&b).unwrap();
        let (h, b) = serve(&fs, &request(opcode::OPENDIR, 5, 1, &[0; 8])).unwrap();
        assert_eq!(h.error, 0);
        let (o, _) = OpenOut::read_from_prefix(&b).unwrap();
        let rd = ReadIn {
            fh: o.fh,
            size: 4096,
            ..ReadIn::default()
        };
        let (h, b) = serve(&fs, &request(opcode::READDIR, 6, 1, rd.as_bytes())).unwrap();
        assert_eq!(h.error, 0);
        let mut names = Vec::new();
        let mut rest = &b[..];
        while !rest.is_empty() {
            let (d, tail) = Dirent::read_from_prefix(rest).unwrap();
            names.push((
                String::from_utf8_lossy(&tail[..d.namelen as usize]).into_owned(),
                d.ino,
                d.typ,
            ));
            let len = (size_of::<Dirent>() + d.namelen as usize).next_multiple_of(8);
            rest = &rest[len..];
        }
        assert!(names.contains(&("sub".into(), sub.nodeid, 4)), "{names:?}");
        assert!(names.iter().any(|n| n.0 == "lost+found"));
        // A READDIR of 40 bytes holds one entry at most.
        let small = ReadIn { size: 40, ..rd };
        let (_, b) = serve(&fs, &request(opcode::READDIR, 7, 1, small.as_bytes())).unwrap();
        assert!(!b.is_empty() && b.len() <= 40);
        // No reply: FORGET, BATCH_FORGET, INTERRUPT.
        let forget = request(opcode::FORGET, 8, sub.nodeid, &1u64.to_le_bytes());
        assert!(serve(&fs, &forget).is_none());
        let mut bf = 1u32.to_le_bytes().to_vec();
        bf.extend_from_slice(&[0; 4]);
        bf.extend_from_slice(&11u64.to_le_bytes());
        bf.extend_from_slice(&1u64.to_le_bytes());
        assert!(serve(&fs, &request(opcode::BATCH_FORGET, 9, 0, &bf)).is_none());
        let intr = request(opcode::INTERRUPT, 10, 0, &6u64.to_le_bytes());
        assert!(serve(&fs, &intr).is_none());
        // SYNCFS commits: the mkdir is in a committed transaction.
        let Backend::Rw(e) = &fs.s.backend else {
            unreachable!()
        };
        let before = e.rw().journal().last_committed();
        let (h, _) = serve(&fs, &request(opcode::SYNCFS, 15, 1, &[0; 8])).unwrap();
        assert_eq!(h.error, 0);
        assert!(e.rw().journal().last_committed() > before);
        // STATX: the birth time (i_crtime) in the mask.
        let (h, b) = serve(&fs, &request(opcode::STATX, 16, sub.nodeid, &[0; 24])).unwrap();
        assert_eq!(h.error, 0);
        let (sx, _) = crate::proto::abi::StatxOut::read_from_prefix(&b).unwrap();
        assert_ne!(sx.stat.mask & 0x800, 0);
        // TMPFILE: CREATE's answer, an inode without links; LINK names it.
        let mut t = Vec::new();
        for v in [libc::O_RDWR as u32, 0o100_600, 0o022, 0] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        t.extend_from_slice(b"/\0");
        let (h, b) = serve(&fs, &request(opcode::TMPFILE, 17, sub.nodeid, &t)).unwrap();
        assert_eq!(h.error, 0);
        let (te, rest) = EntryOut::read_from_prefix(&b).unwrap();
        let (to, rest) = OpenOut::read_from_prefix(rest).unwrap();
        assert!(rest.is_empty());
        assert_eq!((te.attr.nlink, te.attr.mode), (0, 0o100_600));
        let mut l = te.nodeid.to_le_bytes().to_vec();
        l.extend_from_slice(b"named\0");
        let (h, b) = serve(&fs, &request(opcode::LINK, 18, sub.nodeid, &l)).unwrap();
        assert_eq!(h.error, 0);
        let (le, _) = EntryOut::read_from_prefix(&b).unwrap();
        assert_eq!((le.nodeid, le.attr.nlink), (te.nodeid, 1));
        fs.op_release(to.fh);
        // Not served: ENOSYS (an unknown opcode).
        let (h, _) = serve(&fs, &request(99, 11, 1, &[0; 8])).unwrap();
        assert_eq!(h.error, -libc::ENOSYS);
        // Malformed (a LOOKUP name without its NUL): EIO, no panic; a
        // header that does not even say its length: no reply.
        let (h, _) = serve(&fs, &request(opcode::LOOKUP, 12, 1, b"abc")).unwrap();
        assert_eq!(h.error, -libc::EIO);
        let mut bad = request(opcode::GETATTR, 13, 1, &[0; 16]);
        bad.truncate(20);
        assert!(dispatch(&fs, &bad, &AtomicBool::new(false), || Box::new(|_| {})).is_none());
        // A second INIT: EIO.
        let (h, _) = serve(&fs, &request(opcode::INIT, 14, 0, &[0; 64])).unwrap();
        assert_eq!(h.error, -libc::EIO);
    }

    #[test]
    fn setattr_times_before_1970_reach_the_op_layer_as_fusers() {
        // -1.999999999 s: fuser 0.18.0's form, which `setattr_time`
        // turns back into (-1, 999999999).
        let t = time((-1i64) as u64, 999_999_999);
        let ts = crate::attr::setattr_time(t);
        assert_eq!((ts.sec, ts.nsec), (-1, 999_999_999));
        let ts = crate::attr::setattr_time(time(5, 7));
        assert_eq!((ts.sec, ts.nsec), (5, 7));
    }

    /// A stand-in for `/dev/fuse`: a SEQPACKET socket pair keeps each
    /// write one message and each read one request, as the device does.
    fn fake_dev() -> (OwnedFd, File) {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        (a, File::from(b))
    }

    fn init_req(unique: u64, minor: u32) -> Vec<u8> {
        let i = InitIn {
            major: 7,
            minor,
            max_readahead: 1 << 17,
            flags: u32::MAX,
            flags2: 0,
            unused: [0; 11],
        };
        request(opcode::INIT, unique, 0, i.as_bytes())
    }

    fn read_reply(k: &File) -> (OutHeader, Vec<u8>) {
        let mut buf = vec![0u8; 1 << 16];
        let n = (&*k).read(&mut buf).unwrap();
        let (h, body) = OutHeader::read_from_prefix(&buf[..n]).unwrap();
        assert_eq!(h.len as usize, n);
        (h, body.to_vec())
    }

    #[test]
    fn an_init_older_than_7_31_is_refused() {
        let (fd, kernel) = fake_dev();
        let mut s = Session::new(fd, shared(MountOptions::default()));
        (&kernel).write_all(&init_req(1, 30)).unwrap();
        assert!(s.handshake().is_err());
        let (h, _) = read_reply(&kernel);
        assert_eq!((h.unique, h.error), (1, -libc::EPROTO));
    }

    #[test]
    fn the_loop_serves_until_the_connection_ends() {
        let (fd, kernel) = fake_dev();
        let mut s = Session::new(fd, shared(MountOptions::default()));
        (&kernel).write_all(&init_req(1, 43)).unwrap();
        s.handshake().unwrap();
        let (h, b) = read_reply(&kernel);
        assert_eq!(h.error, 0);
        let (out, _) = InitOut::read_from_prefix(&b).unwrap();
        assert_eq!((out.major, out.minor, out.max_write), (7, 43, MAX_WRITE));
        // A notify: unique 0, the code as error.
        s.notifier().inval_inode(1, -1, 0).unwrap();
        let (h, _) = read_reply(&kernel);
        assert_eq!((h.unique, h.error), (0, 2));
        let t = thread::spawn(move || s.run(2));
        // Requests to two workers: a FORGET (no reply), then LOOKUPs.
        (&kernel)
            .write_all(&request(opcode::FORGET, 2, 11, &1u64.to_le_bytes()))
            .unwrap();
        for u in 3..7u64 {
            (&kernel)
                .write_all(&request(opcode::LOOKUP, u, 1, b"lost+found\0"))
                .unwrap();
        }
        let mut seen: Vec<u64> = (0..4).map(|_| read_reply(&kernel).0.unique).collect();
        seen.sort();
        assert_eq!(seen, [3, 4, 5, 6]);
        // The end of the connection (ENODEV on the device, EOF here)
        // ends every worker.
        drop(kernel);
        t.join().unwrap().unwrap();
    }
}
