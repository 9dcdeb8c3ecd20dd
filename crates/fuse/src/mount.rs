//! Open the device, mount, serve until unmounted (or SIGTERM/SIGINT/
//! SIGHUP), close cleanly.
//!
//! 1. The device is opened as the image tools open it: read-write and
//!    exclusive (a mounted or busy device is refused; a dirty journal is
//!    replayed as the kernel replays it), or for `ro` read-only with the
//!    read side (a dirty journal replayed in memory, or not at all with
//!    `norecovery`). Nothing is mounted before this succeeded.
//! 2. `start_session` mounts (as root `fuser::Session::new`, mount(2) on
//!    `/dev/fuse`; otherwise `fusermount3`, see `fusermount.rs`)
//!    and completes the INIT handshake: from here
//!    the mount is live and `ready` is called (the CLI detaches then).
//! 3. Worker threads serve requests; a timer thread calls the journal's
//!    `tick()` every second (`commit=SEC`), a committer thread commits
//!    once the mount is quiet ([`crate::idle`]); a signal thread turns
//!    SIGTERM/SIGINT/SIGHUP into an unmount (a busy mount is detached and
//!    its connection aborted, so the daemon always gets to close).
//! 4. When the kernel ends the session (umount, fusermount3 -u, the
//!    signal), orphans still on the list are freed and the engine closes:
//!    commit, checkpoint, `needs_recovery` cleared.
//!
//! Online lazy init (`noinit_itable`, `init_itable=N`, `lazyinit=`) runs
//! its worker ([`ext4kit::lazyinit::online`]) from the mount being live
//! until the session ends, on `Backend::Rw` only; discard at commit
//! (`opts.discard`) is the engine's [`DiscardOptions`], set where
//! [`RwOptions`] is built in `open_backend`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use ext4kit::lazyinit::{
    self, DeviceKind, LazyInitHandle, OnlineOptions, Pace, StatusSource, SysfsLoad,
};
use ext4kit_device::{Device, DeviceError, OpenOptions, check_not_mounted, mounts, open_device};
use ext4kit_format::superblock::{SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock};
use ext4kit_fs::discard::DiscardOptions;
use ext4kit_fs::fs::Filesystem;
use ext4kit_fs::journal::JournalOptions;
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::sb::{FsInfo, Volume};
use ext4kit_fs::{DeviceBlocks, FsError};
use fuser::{Config, InitFlags, KernelConfig, MountOption, SessionACL};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::fusermount;
use crate::ops::FuseFs;
use crate::options::{LazyinitPace, MountOptions, Uring};
use crate::shared::{Backend, Shared};

/// Why a mount failed or did not end cleanly. One line each.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MountError {
    #[error("{}: {source}", path.display())]
    Device { path: PathBuf, source: DeviceError },
    #[error("{}: {source}", path.display())]
    Fs { path: PathBuf, source: FsError },
    #[error("mounting on {}: {source}", path.display())]
    Mount { path: PathBuf, source: io::Error },
    #[error("{}: closing: {source}", path.display())]
    Close { path: PathBuf, source: FsError },
    #[error("{0}")]
    Other(String),
}

/// What to mount where.
#[derive(Clone, Debug)]
pub struct MountRequest {
    pub device: PathBuf,
    pub mountpoint: PathBuf,
    pub opts: MountOptions,
    /// FUSE worker threads (at least 1).
    pub threads: usize,
}

/// How a mount ended.
#[derive(Clone, Debug, Default)]
pub struct MountReport {
    /// Journal transactions replayed at mount.
    pub replayed: u32,
    /// The signal that asked for the unmount, if one did.
    pub signal: Option<i32>,
}

/// Worker threads by default: the machine's CPUs, at least 2 (a worker
/// waiting in an fsync's commit must not stop lookups and reads) and at
/// most 16. The engine runs the handles of different inodes side by
/// side and reads without waiting for them, so every worker can do
/// useful work; changes of one inode are serialized by its locks.
pub fn default_threads() -> usize {
    thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 16)
}

fn dev_err(path: &Path) -> impl FnOnce(DeviceError) -> MountError + '_ {
    move |source| MountError::Device {
        path: path.to_path_buf(),
        source,
    }
}

fn fs_err(path: &Path) -> impl FnOnce(FsError) -> MountError + '_ {
    move |source| MountError::Fs {
        path: path.to_path_buf(),
        source,
    }
}

/// A read-only view of `dev` without replaying its journal
/// (`norecovery`): what is on the disk, as the kernel's `noload` shows it.
fn volume_without_replay(dev: &'static dyn Device) -> Result<Volume<'static>, FsError> {
    let corrupt = |d: String| FsError::corrupt("superblock", d);
    if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Err(corrupt(format!("the device has only {} bytes", dev.size())));
    }
    let mut raw = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
    let sb = Superblock::parse(&raw).ok_or_else(|| corrupt("short read".into()))?;
    let bs = sb.block_size().filter(|&b| b <= 65536).unwrap_or(1024);
    let pre = FsInfo::from_superblock(sb, dev.size() / u64::from(bs))?;
    let blocks = DeviceBlocks::new(dev, pre.block_size, pre.blocks_count);
    let info = FsInfo::load(&blocks)?;
    Ok(Volume { blocks, info })
}

/// Open the engine for `opts` (see the module docs, step 1).
pub fn open_backend(path: &Path, opts: &MountOptions) -> Result<Backend, MountError> {
    open_backend_wrapped(path, opts, &|d| d)
}

/// [`open_backend`] with the read-write device passed through `wrap`
/// before the engine opens it (see [`serve_wrapped`]).
fn open_backend_wrapped(
    path: &Path,
    opts: &MountOptions,
    wrap: &dyn Fn(Arc<dyn Device>) -> Arc<dyn Device>,
) -> Result<Backend, MountError> {
    if opts.read_only {
        check_not_mounted(path).map_err(dev_err(path))?;
        let o = OpenOptions {
            write: false,
            exclusive: true,
        };
        let dev = with_journal(open_device(path, o).map_err(dev_err(path))?, opts, o)?;
        let dev: &'static dyn Device = Box::leak(dev);
        let vol = if opts.norecovery {
            volume_without_replay(dev)
        } else {
            Volume::open(dev)
        }
        .map_err(fs_err(path))?;
        return Ok(Backend::Ro(vol));
    }
    let dev: Arc<dyn Device> = wrap(Arc::from(with_journal(
        open_device(path, OpenOptions::read_write()).map_err(dev_err(path))?,
        opts,
        OpenOptions::read_write(),
    )?));
    // -o discard: the per-commit discard batch and, at open, the
    // reconciler that gives back what an earlier crash or kill lost.
    let ro = RwOptions {
        journal: JournalOptions {
            commit_interval: opts.commit,
            ..JournalOptions::default()
        },
        discard: opts.discard.then(DiscardOptions::default),
        errors: opts.errors,
    };
    let fs = Filesystem::open(dev, ro).map_err(fs_err(path))?;
    Ok(Backend::Rw(Arc::new(fs)))
}

/// `dev` joined with its external journal device when `-o journal_path=`
/// names one (opened as `o`: exclusive, refusing a mounted device).
fn with_journal(
    dev: Box<dyn Device>,
    opts: &MountOptions,
    o: OpenOptions,
) -> Result<Box<dyn Device>, MountError> {
    let Some(jp) = &opts.journal_path else {
        return Ok(dev);
    };
    let j: Arc<dyn Device> = Arc::from(open_device(jp, o).map_err(dev_err(jp))?);
    Ok(Box::new(ext4kit_device::WithJournal::new(
        Arc::from(dev),
        j,
    )))
}

fn fuser_config(req: &MountRequest) -> Config {
    let o = &req.opts;
    let mut mo = vec![
        // fuser 0.18.0 splits FSName at commas (a listed bug): keep them out.
        MountOption::FSName(req.device.to_string_lossy().replace(',', "_")),
        MountOption::Subtype("ext4kit".into()),
        MountOption::DefaultPermissions,
    ];
    for (on, opt) in [
        (o.read_only, MountOption::RO),
        (o.sync, MountOption::Sync),
        (o.noatime, MountOption::NoAtime),
        (o.nosuid, MountOption::NoSuid),
        (o.nodev, MountOption::NoDev),
        (o.noexec, MountOption::NoExec),
        // fuser makes the mount nosuid,nodev unless told otherwise.
        (!o.nosuid, MountOption::Suid),
        (!o.nodev, MountOption::Dev),
    ] {
        if on {
            mo.push(opt);
        }
    }
    let mut c = Config::default();
    c.mount_options = mo;
    c.acl = if o.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    // The workers share the session's `/dev/fuse` fd. fuser's
    // `clone_fd` (an fd per worker, FUSE_DEV_IOC_CLONE) made no
    // measurable difference here, and a failed clone would end the
    // session before it serves anything: left off.
    c.n_threads = Some(req.threads.max(1));
    c
}

/// Mount and complete INIT (step 2). As root, fuser mounts (mount(2)
/// on `/dev/fuse`). Otherwise through `fusermount3` ([`fusermount`]):
/// a user's mount(2) of a FUSE filesystem fails with EPERM, so
/// libfuse's "directly, else fusermount3" comes to fusermount3; only
/// when that is not usable (not installed, not set-user-ID root) is
/// the direct mount tried (a process with CAP_SYS_ADMIN), and if it
/// fails too the error says both why.
fn start_session(
    shared: &Arc<Shared>,
    req: &MountRequest,
    mnt: &Path,
) -> io::Result<(fuser::Session<FuseFs>, Option<fusermount::Helper>)> {
    let config = fuser_config(req);
    if nix::unistd::geteuid().is_root() {
        return Ok((
            fuser::Session::new(FuseFs::new(shared.clone()), mnt, &config)?,
            None,
        ));
    }
    match fusermount::locate() {
        Ok(bin) => {
            let opts =
                fusermount::option_string(&config.mount_options, config.acl != SessionACL::Owner);
            let m = fusermount::mount(&bin, mnt, &opts)?;
            // A failed INIT drops the helper: fusermount3 unmounts.
            let s = fuser::Session::from_fd(FuseFs::new(shared.clone()), m.fd, config.acl, config)?;
            Ok((s, Some(m.helper)))
        }
        Err(why) => match fuser::Session::new(FuseFs::new(shared.clone()), mnt, &config) {
            Ok(s) => Ok((s, None)),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!(
                    "{e}: not root, and {why}",
                    e = e.to_string().trim_end_matches(['\n', '.'])
                ),
            )),
        },
    }
}

/// The session serving the mount: fuser's (default) or our own
/// (`-o transport=ext4kit`, [`crate::session`]).
enum Served {
    Fuser(Box<fuser::Session<FuseFs>>),
    Own(crate::session::Session),
}

impl Served {
    fn notifier(&self) -> Arc<dyn crate::shared::Notify> {
        match self {
            Served::Fuser(s) => Arc::new(s.notifier()),
            Served::Own(s) => s.notifier(),
        }
    }

    /// The transport in use, for the status file: `io_uring`,
    /// `/dev/fuse` (our own session) or `fuser` (fuser's, on `/dev/fuse`).
    fn transport(&self) -> &'static str {
        match self {
            Served::Fuser(_) => "fuser",
            Served::Own(s) if s.over_uring() => "io_uring",
            Served::Own(_) => "/dev/fuse",
        }
    }

    fn run(self, threads: usize) -> io::Result<()> {
        match self {
            Served::Fuser(s) => s.run(),
            Served::Own(s) => s.run(threads),
        }
    }
}

/// The kernel mount options of our own transport's mount(2), as fuser
/// passes them: `fd=N,rootmode=,user_id=,group_id=`, then
/// `default_permissions` and `allow_other` (see [`fuser_config`]).
fn own_mount_data(fd: i32, rootmode: u32, config: &Config) -> String {
    let mut data = format!(
        "fd={fd},rootmode={rootmode:o},user_id={},group_id={}",
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if config
        .mount_options
        .contains(&MountOption::DefaultPermissions)
    {
        data.push_str(",default_permissions");
    }
    if config.acl != SessionACL::Owner {
        data.push_str(",allow_other");
    }
    data
}

/// The VFS flags of the mount: nosuid,nodev unless asked otherwise (as
/// fuser), ro, sync, noatime, noexec.
fn own_mount_flags(config: &Config) -> nix::mount::MsFlags {
    use nix::mount::MsFlags;
    let o = &config.mount_options;
    let mut f = MsFlags::empty();
    for (opt, flag) in [
        (MountOption::RO, MsFlags::MS_RDONLY),
        (MountOption::Sync, MsFlags::MS_SYNCHRONOUS),
        (MountOption::NoAtime, MsFlags::MS_NOATIME),
        (MountOption::NoExec, MsFlags::MS_NOEXEC),
    ] {
        if o.contains(&opt) {
            f |= flag;
        }
    }
    if !o.contains(&MountOption::Suid) {
        f |= MsFlags::MS_NOSUID;
    }
    if !o.contains(&MountOption::Dev) {
        f |= MsFlags::MS_NODEV;
    }
    f
}

/// Our own transport's step 2: as root our own mount(2) of
/// `fuse.ext4kit` on a `/dev/fuse` fd, otherwise `fusermount3`; then
/// INIT ([`crate::session::Session::handshake`]).
fn start_own_session(
    shared: &Arc<Shared>,
    req: &MountRequest,
    mnt: &Path,
) -> io::Result<(Served, Option<fusermount::Helper>)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    let config = fuser_config(req);
    // FUSE over io_uring (by default where the kernel offers it, see
    // [`Uring`]): the kernel's switch on (as root) before INIT, which
    // offers it only while the switch is on.
    let insist = req.opts.uring == Uring::On;
    let uring = req.opts.uring != Uring::Off
        && match crate::uring::enable(insist) {
            Ok(_) => true,
            Err(why) if insist => {
                eprintln!("ext4kit mount: -o uring: {why}; serving on /dev/fuse");
                false
            }
            Err(why) => {
                tracing::debug!("FUSE over io_uring: {why}; serving on /dev/fuse");
                false
            }
        };
    let (fd, helper) = if nix::unistd::geteuid().is_root() {
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/fuse: {e}")))?;
        let rootmode = std::fs::metadata(mnt)?.permissions().mode();
        let data = own_mount_data(dev.as_raw_fd(), rootmode, &config);
        let source = req.device.to_string_lossy().replace(',', "_");
        nix::mount::mount(
            Some(source.as_str()),
            mnt,
            Some("fuse.ext4kit"),
            own_mount_flags(&config),
            Some(data.as_str()),
        )
        .map_err(io::Error::from)?;
        (std::os::fd::OwnedFd::from(dev), None)
    } else {
        let bin = fusermount::locate().map_err(io::Error::other)?;
        let opts =
            fusermount::option_string(&config.mount_options, config.acl != SessionACL::Owner);
        let m = fusermount::mount(&bin, mnt, &opts)?;
        (m.fd, Some(m.helper))
    };
    let mut s = crate::session::Session::new(fd, shared.clone());
    if uring {
        // `-o threads` spread over the kernel's queues (one per CPU).
        let cpus = thread::available_parallelism().map_or(1, |n| n.get());
        s.want_uring(
            req.threads.div_ceil(cpus),
            usize::from(req.opts.uring_depth),
            insist,
        );
    }
    if let Err(e) = s.handshake() {
        // Not served: take the mount down again (fusermount3 does it
        // when its helper is dropped).
        if helper.is_none() {
            let _ = nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH);
        }
        return Err(e);
    }
    // With io_uring, fusermount3's socket goes into the rings: a killed
    // server's rings are torn down after its /dev/fuse descriptors are
    // closed, and fusermount3 decides whether to unmount when the socket
    // closes, by looking at the mount point; during the teardown the
    // kernel answers ECONNABORTED, which it does not take for a dead
    // server (mount_user.rs with `-o uring`).
    let mut helper = helper;
    if let Some(h) = helper.as_mut()
        && let Some(sock) = h.take_socket()
        && let Err(back) = s.hold(std::os::fd::OwnedFd::from(sock))
    {
        h.put_socket(std::os::unix::net::UnixStream::from(back));
    }
    Ok((Served::Own(s), helper))
}

/// What INIT settled on (see [`negotiate`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Negotiated {
    /// FUSE's writeback cache is on.
    pub writeback: bool,
    /// `FUSE_HANDLE_KILLPRIV_V2` is on: the mount clears set-user-ID and
    /// set-group-ID where the kernel asks (see `FuseFs::kill_suid_sgid`).
    pub killpriv: bool,
}

/// What the mount asks of the kernel at FUSE INIT. Each capability is
/// optional: a kernel without one still mounts.
/// - POSIX ACLs checked by the kernel, no umask applied by it (the
///   engine applies the parent's default ACL or the umask), parallel
///   lookups and readdirs in one directory, cached symlink targets;
/// - READDIRPLUS (adaptive: the kernel asks for it when the entries'
///   attributes are wanted, `ls -l`, `find`, `rm -r`), so a listing
///   needs no LOOKUP per name;
/// - `FUSE_HANDLE_KILLPRIV_V2` (read-write mounts): without it the
///   kernel asks for `security.capability` with a GETXATTR before every
///   `write(2)` (its `file_remove_privs`), a round trip per write; with
///   it the superblock is `SB_NOSEC`, so it asks once per inode and then
///   trusts `S_NOSEC`, and the mount clears set-user-ID/set-group-ID on
///   writes, truncates and chowns itself (the capability xattr is still
///   removed by the kernel, but for write-only opens, which are served
///   with `FOPEN_DIRECT_IO` and clear it here: `ops.rs::direct_write`);
/// - the writeback cache (`writeback_cache`, read-write mounts only);
/// - more background requests in flight than fuser's 16 (readahead and
///   writeback of several files at once keep the worker threads busy).
///
/// Requests of up to 1 MiB need nothing here: fuser offers 16 MiB and
/// the kernel caps it at `fs.fuse.max_pages_limit` (256 pages here).
pub(crate) fn negotiate(shared: &Shared, config: &mut KernelConfig) -> Negotiated {
    let mut got = Negotiated::default();
    let rw = matches!(shared.backend, Backend::Rw(_));
    let mut caps = vec![
        InitFlags::FUSE_POSIX_ACL,
        InitFlags::FUSE_DONT_MASK,
        InitFlags::FUSE_PARALLEL_DIROPS,
        InitFlags::FUSE_CACHE_SYMLINKS,
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_READDIRPLUS_AUTO,
    ];
    if rw {
        caps.push(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
    }
    if shared.opts.writeback_cache && rw {
        caps.push(InitFlags::FUSE_WRITEBACK_CACHE);
    }
    for cap in caps {
        match config.add_capabilities(cap) {
            Ok(()) => {
                got.writeback |= cap == InitFlags::FUSE_WRITEBACK_CACHE;
                got.killpriv |= cap == InitFlags::FUSE_HANDLE_KILLPRIV_V2;
            }
            Err(_) => tracing::debug!("kernel lacks {cap:?}"),
        }
    }
    let _ = config.set_max_background(MAX_BACKGROUND);
    let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
    got
}

/// Background requests (readahead, writeback) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;

/// The FUSE connection id of the mount at `mnt` (its `st_dev`, as named
/// under `/sys/fs/fuse/connections`), read from the mount table (a stat
/// of the mount point would be a request to ourselves).
fn connection_id(mnt: &Path) -> Option<u32> {
    let want = mnt.to_string_lossy();
    mounts()
        .ok()?
        .into_iter()
        .rfind(|m| m.mount_point == want && m.fs_type.starts_with("fuse"))
        .map(|m| (m.major << 20) | m.minor)
}

/// Unmount `mnt` for a signal: a plain unmount; if the mount is busy,
/// detach it and abort the connection so the session ends now (open
/// files then fail with ENOTCONN; the filesystem is still closed
/// cleanly). Without root, `fusermount3 -u -z`.
fn unmount(mnt: &Path, conn: Option<u32>) {
    use nix::errno::Errno;
    use nix::mount::{MntFlags, umount2};
    match umount2(mnt, MntFlags::empty()) {
        Ok(()) => {}
        Err(Errno::EBUSY) => {
            if let Err(e) = umount2(mnt, MntFlags::MNT_DETACH) {
                tracing::warn!("detaching {}: {e}", mnt.display());
            }
            if let Some(id) = conn {
                abort_connection(id);
            }
        }
        Err(Errno::EPERM) => {
            for helper in ["fusermount3", "fusermount"] {
                let ok = std::process::Command::new(helper)
                    .args(["-u", "-z", "--"])
                    .arg(mnt)
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    break;
                }
            }
        }
        Err(e) => tracing::warn!("unmounting {}: {e}", mnt.display()),
    }
}

/// Abort FUSE connection `id` through fusectl (mounted for the moment
/// and unmounted again if it was not mounted: systemd usually has it at
/// `/sys/fs/fuse/connections`).
fn abort_connection(id: u32) {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let ctl = Path::new("/sys/fs/fuse/connections");
    let abort = ctl.join(id.to_string()).join("abort");
    let mut mounted_here = false;
    if !abort.exists() {
        match mount(
            Some("fusectl"),
            ctl,
            Some("fusectl"),
            MsFlags::empty(),
            None::<&str>,
        ) {
            Ok(()) => mounted_here = true,
            Err(e) => tracing::warn!("mounting fusectl on {}: {e}", ctl.display()),
        }
    }
    if let Err(e) = std::fs::write(&abort, "1") {
        tracing::warn!("{}: {e}", abort.display());
    }
    if mounted_here && let Err(e) = umount2(ctl, MntFlags::empty()) {
        tracing::warn!("unmounting {}: {e}", ctl.display());
    }
}

/// A stop flag a sleeping thread can be woken from.
#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl Stop {
    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Sleep up to `d`; whether to stop.
    fn wait(&self, d: Duration) -> bool {
        let g = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .cv
            .wait_timeout_while(g, d, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }
}

/// Close the engine of `shared` (all other references dropped).
fn close(shared: Arc<Shared>, path: &Path) -> Result<(), MountError> {
    shared.flush_all();
    let failed = shared.release_orphans();
    if let Some((ino, e)) = failed.first() {
        tracing::warn!("freeing unlinked inode {ino}: {e}");
    }
    let shared = Arc::try_unwrap(shared).map_err(|_| {
        MountError::Other(format!(
            "{}: the filesystem is still in use at unmount; it was not closed cleanly",
            path.display()
        ))
    })?;
    match shared.backend {
        Backend::Rw(fs) => {
            let fs = Arc::try_unwrap(fs).map_err(|_| {
                MountError::Other(format!(
                    "{}: the filesystem is still in use at unmount; it was not closed cleanly",
                    path.display()
                ))
            })?;
            fs.close().map_err(|source| MountError::Close {
                path: path.to_path_buf(),
                source,
            })
        }
        Backend::Ro(_) => Ok(()),
    }
}

/// Online lazy init on a read-write mount (the kernel's `ext4lazyinit`
/// thread): unless `noinit_itable`, one worker zeroes the inode tables
/// left unzeroed, paced at `init_itable=N` or adaptively
/// (`lazyinit=adaptive`, backing off up to x100 from the counters of the
/// disk beneath the device), while the filesystem is in use. A worker that
/// cannot start is a warning, not a failed mount (the kernel's too).
fn start_lazyinit(shared: &Arc<Shared>, req: &MountRequest) -> Option<LazyInitHandle> {
    let Backend::Rw(fs) = &shared.backend else {
        return None;
    };
    let o = &req.opts;
    if o.noinit_itable {
        return None;
    }
    let mut opts = OnlineOptions {
        device_kind: DeviceKind::of_path(&req.device),
        ..OnlineOptions::default()
    };
    opts.pace = match o.lazyinit {
        LazyinitPace::Fixed => Pace::Fixed {
            mult: o.init_itable,
        },
        LazyinitPace::Adaptive => {
            if let Some(l) = SysfsLoad::for_path(&req.device) {
                opts.load = Some(Box::new(l));
            }
            Pace::Adaptive {
                max_mult: 100,
                fallback_mult: o.init_itable,
            }
        }
    };
    match lazyinit::online::start(fs.clone(), opts) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(
                "{}: online lazy init not started: {e}",
                req.device.display()
            );
            None
        }
    }
}

/// Where a mount serving `mountpoint` (canonical) publishes its status for
/// `ext4kit status`: `/run/ext4kit/` as root, else a per-user directory
/// under `$XDG_RUNTIME_DIR` or the temporary directory; one JSON file per
/// mountpoint (named by a hash of its path), rewritten every second and
/// removed at unmount.
pub fn status_path(mountpoint: &Path) -> PathBuf {
    let dir = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/ext4kit")
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(d).join("ext4kit")
    } else {
        std::env::temp_dir().join(format!("ext4kit-{}", nix::unistd::geteuid()))
    };
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in mountpoint.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    dir.join(format!("mount-{h:016x}.json"))
}

/// `1.5 GiB` (binary units, one decimal, as `ext4kit fstrim -v`).
fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        let s = format!("{v:.1}");
        format!("{} {}", s.strip_suffix(".0").unwrap_or(&s), UNITS[u])
    }
}

/// The discard pool's and the reconciler's state for the status file:
/// `None` without `-o discard` (or on a read-only mount). `text` is the
/// line `ext4kit status` prints; `reconcile.state` is `reconciling`,
/// `done`, `off` (a device that cannot report its allocation, with
/// `Reconcile::Auto`) or `stopped` (an error, in `reconcile.error`).
pub fn discard_status(fs: &Filesystem) -> Option<serde_json::Value> {
    use ext4kit_fs::discard::Reconcile;
    let d = fs.discard_stats()?;
    let r = fs.reconcile_stats()?;
    let mode = match r.mode {
        Reconcile::Off => "off",
        Reconcile::Auto => "auto",
        Reconcile::Full => "full",
    };
    let state = if r.error.is_some() {
        "stopped"
    } else if r.mode == Reconcile::Off {
        "off"
    } else if r.finished {
        "done"
    } else {
        "reconciling"
    };
    let rec = match state {
        "reconciling" => format!(
            "reconciling, {}/{} groups, {} given back so far",
            r.groups_done,
            r.groups,
            human(r.bytes)
        ),
        "done" => format!("done, {} groups, {} given back", r.groups, human(r.bytes)),
        "stopped" => format!(
            "stopped at group {}/{}: {}",
            r.groups_done,
            r.groups,
            r.error.as_deref().unwrap_or("?")
        ),
        _ => "off (the device cannot tell which free blocks it still holds)".to_string(),
    };
    let mut text = format!(
        "discard: on, {} requests done ({}), {} pending; reconciler: {rec}",
        d.completed,
        human(d.bytes),
        d.pending
    );
    if d.unsupported {
        text.push_str("; the device does not support discard");
    }
    Some(serde_json::json!({
        "text": text,
        "queued": d.queued,
        "completed": d.completed,
        "pending": d.pending,
        "in_flight": d.in_flight,
        "bytes": d.bytes,
        "failed": d.failed,
        "unsupported": d.unsupported,
        "reconcile": {
            "state": state,
            "mode": mode,
            "groups": r.groups,
            "groups_done": r.groups_done,
            "bytes": r.bytes,
            "finished": r.finished,
            "error": r.error,
        },
    }))
}

/// Write the status file of a mount (atomically: a temporary file
/// renamed over it). Failures are not the mount's: ignored.
fn publish_status(
    path: &Path,
    mnt: &Path,
    device: &Path,
    lazy: Option<&StatusSource>,
    shared: &Shared,
    transport: &str,
) {
    let lazy = lazy.map(|s| {
        let st = s.get();
        serde_json::json!({ "text": st.to_string(), "status": st })
    });
    let discard = match &shared.backend {
        Backend::Rw(fs) => discard_status(fs),
        Backend::Ro(_) => None,
    };
    let v = serde_json::json!({
        "mountpoint": mnt.display().to_string(),
        "device": device.display().to_string(),
        "pid": std::process::id(),
        "transport": transport,
        "lazyinit": lazy,
        "discard": discard,
        "requests": shared.requests.to_json(&shared.wbuf),
        "commits": serde_json::json!({
            "text": format!(
                "commits: {} when the mount went idle, {} by ext4kit sync",
                shared.idle.commits(),
                shared.idle.syncs()
            ),
            "idle": shared.idle.commits(),
            "sync": shared.idle.syncs(),
        }),
    });
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, v.to_string()).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Mount `req` and serve it until it is unmounted (see the module docs).
/// `ready` runs once the mount is live.
pub fn serve(req: &MountRequest, ready: impl FnOnce()) -> Result<MountReport, MountError> {
    serve_wrapped(req, &|d| d, ready)
}

/// [`serve`], with the device of a read-write mount passed through
/// `wrap` before the engine opens it (the device is opened, checked and
/// locked as always; `ro` mounts are not wrapped). For tests, which put a
/// recording or fault-injecting device ([`ext4kit_device::RecordingDevice`])
/// under a real mount; not reachable from the command line.
#[doc(hidden)]
pub fn serve_wrapped(
    req: &MountRequest,
    wrap: &dyn Fn(Arc<dyn Device>) -> Arc<dyn Device>,
    ready: impl FnOnce(),
) -> Result<MountReport, MountError> {
    let mnt = req
        .mountpoint
        .canonicalize()
        .map_err(|source| MountError::Mount {
            path: req.mountpoint.clone(),
            source,
        })?;
    if !mnt.is_dir() {
        return Err(MountError::Mount {
            path: req.mountpoint.clone(),
            source: io::Error::from_raw_os_error(libc::ENOTDIR),
        });
    }
    // Registered before the mount, so a signal that comes right after
    // the mount is live is not lost.
    let mut signals =
        Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|source| MountError::Mount {
            path: mnt.clone(),
            source,
        })?;
    let backend = open_backend_wrapped(&req.device, &req.opts, wrap)?;
    let replayed = match &backend {
        Backend::Rw(fs) => fs.rw().open_report().replayed,
        Backend::Ro(v) => v.info.replayed_transactions,
    };
    if replayed > 0 {
        tracing::info!(
            "{}: replayed {replayed} journal transactions",
            req.device.display()
        );
    }
    let shared = Arc::new(Shared::new(backend, req.opts.clone()));
    let started = match req.opts.transport {
        crate::options::Transport::Fuser => {
            start_session(&shared, req, &mnt).map(|(s, h)| (Served::Fuser(Box::new(s)), h))
        }
        crate::options::Transport::Ext4kit => start_own_session(&shared, req, &mnt),
    };
    let (session, helper) = match started {
        Ok(s) => s,
        Err(source) => {
            close(shared, &req.device)?;
            return Err(MountError::Mount { path: mnt, source });
        }
    };
    // LSEEK with the writeback cache has dirty pages written back first
    // through it (`FuseFs::lseek`).
    let _ = shared.notifier.set(session.notifier());
    let conn = connection_id(&mnt);
    ready();

    let sig_handle = signals.handle();
    let sig_mnt = mnt.clone();
    let sig_thread = thread::spawn(move || {
        let sig = signals.forever().next();
        if sig.is_some() {
            unmount(&sig_mnt, conn);
        }
        sig
    });
    let lazy = start_lazyinit(&shared, req);
    let status_file = status_path(&mnt);
    let source = lazy.as_ref().map(LazyInitHandle::status_source);
    let transport = session.transport();
    publish_status(
        &status_file,
        &mnt,
        &req.device,
        source.as_ref(),
        &shared,
        transport,
    );
    let stop = Arc::new(Stop::default());
    let timer = {
        let (stop, shared) = (stop.clone(), shared.clone());
        let (status_file, mnt, device) = (status_file.clone(), mnt.clone(), req.device.clone());
        thread::spawn(move || {
            while !stop.wait(Duration::from_secs(1)) {
                publish_status(
                    &status_file,
                    &mnt,
                    &device,
                    source.as_ref(),
                    &shared,
                    transport,
                );
                let Backend::Rw(fs) = &shared.backend else {
                    continue;
                };
                // Buffered writes join the transaction the tick commits
                // (at most a second behind their reply).
                shared.flush_all();
                if let Err(e) = fs.rw().journal().tick() {
                    tracing::warn!("commit: {e}");
                }
                let last = fs.rw().journal().last_committed();
                shared.state().prune_tids(last);
            }
        })
    };
    // The idle commit ([`crate::idle`]): what `sync(1)` waited for is
    // committed once the mount is quiet.
    let committer = {
        let shared = shared.clone();
        thread::spawn(move || {
            if !matches!(shared.backend, Backend::Rw(_)) {
                return;
            }
            // For measuring what the idle commit costs (scripts/
            // bench-real.sh's ext4kit-noidle contender): off, `sync(1)`
            // is as weak as without it (commits on the timer only).
            if std::env::var_os("EXT4KIT_IDLE_COMMIT").is_some_and(|v| v == "0") {
                tracing::info!("idle commit off (EXT4KIT_IDLE_COMMIT=0)");
                return;
            }
            while shared.idle.wait_idle(crate::idle::IDLE) {
                if let Err(e) = shared.commit_all() {
                    tracing::warn!("idle commit: {e}");
                }
                if shared.idle.pause(crate::idle::MIN_GAP) {
                    break;
                }
            }
        })
    };
    let served = session.run(req.threads);
    // fusermount3's auto_unmount sees its socket close (the mount is
    // gone already) and exits.
    drop(helper);
    // The worker first (it holds the engine), then the commit timer.
    if let Some(h) = lazy {
        let st = h.stop();
        if let Some(e) = &st.error {
            tracing::warn!("{}: online lazy init stopped: {e}", req.device.display());
        } else {
            tracing::debug!(
                "{}: online lazy init: {} of {} groups zeroed",
                req.device.display(),
                st.groups_done,
                st.groups_total
            );
        }
    }
    stop.stop();
    let _ = timer.join();
    shared.idle.stop();
    let _ = committer.join();
    let _ = std::fs::remove_file(&status_file);
    sig_handle.close();
    let signal = sig_thread.join().ok().flatten();
    let closed = close(shared, &req.device);
    if let Err(e) = served {
        tracing::warn!("FUSE session: {e}");
    }
    closed?;
    Ok(MountReport { replayed, signal })
}
