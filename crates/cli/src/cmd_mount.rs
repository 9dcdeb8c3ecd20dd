//! `ext4kit mount [-o OPTS] [-f] DEVICE MOUNTPOINT`: serve an ext4 image
//! or block device through FUSE (`crates/fuse`).
//!
//! Without `-f` the command returns once the mount is live: it starts
//! itself again as a detached child (`--daemon-child`, its own process
//! group, working directory `/`, no terminal) and waits for one line on
//! the child's stdout: `ready` when the mount is live, else the child
//! exits and its one-line error (on its stderr) is printed here with its
//! exit status. No fork of a threaded process, no unsafe code.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, anyhow, bail};
use ext4kit_fuse::{MountOptions, MountRequest, default_threads, serve};

/// `ext4kit mount --help` (set on the subcommand in main.rs: the
/// variant's doc comment would replace a long_about given here).
pub const LONG_ABOUT: &str = "Mount an ext4 image file or block device through FUSE: journaled \
                  read-write (a dirty journal is replayed first, as the kernel does), or \
                  read-only with -o ro. Needs /dev/fuse; as root the mount is made directly, \
                  otherwise through the set-user-ID fusermount3 (package fuse3; /dev/fuse \
                  must be open to the user, allow_other needs user_allow_other in \
                  /etc/fuse.conf; a user unmounts with fusermount3 -u). \
                  Without -f the command returns once the \
                  mount is live and the filesystem is served in the background.\n\n\
                  Unmount with `umount MOUNTPOINT` or `fusermount3 -u MOUNTPOINT`, or send \
                  SIGTERM/SIGINT to the serving process: the journal is committed and \
                  checkpointed and the filesystem is left clean (e2fsck -fn finds nothing, \
                  no needs_recovery). fsync makes data durable (one journal commit); \
                  changes are otherwise committed every commit=SEC seconds, and about 10 ms \
                  after the mount went quiet. That idle commit is what a bare `sync` gets: \
                  the kernel does not forward sync(2)/syncfs(2) to a FUSE server, so unlike \
                  on kernel ext4 `sync` returns before the commit and a kill within a few \
                  milliseconds of it (up to ~0.1 s while commits follow each other) can \
                  still lose those changes; `ext4kit sync MOUNTPOINT` (or `sync FILE`, an \
                  fsync) returns only when they are durable. A filesystem \
                  without a journal (-O ^has_journal) is written in place as the kernel \
                  writes it: \"not clean\" in the superblock while mounted, \"clean\" again \
                  at the unmount; after a crash run e2fsck -fy before using it. `ext4kit status \
                  MOUNTPOINT` shows lazy init and, with -o discard, the discard queue and \
                  the reconciler.\n\n\
                  Options (-o, comma-separated, may be repeated; later ones win):\n  \
                  ro, rw                  read-only (served from the read side; nothing is \
                  written) or read-write (default)\n  \
                  commit=SEC              commit the running transaction after SEC seconds \
                  (default 5; 0 = default)\n  \
                  errors=remount-ro|continue  on corrupt metadata: record it in the \
                  superblock and refuse further changes (EROFS), or go on (default: the \
                  superblock's setting, tune2fs -e)\n  \
                  norecovery, noload      with ro only: do not replay a dirty journal, not \
                  even in memory\n  \
                  journal_path=PATH       the external journal device of a filesystem made \
                  with -J device= (also --journal-path PATH)\n  \
                  data=ordered            the only data mode (the default)\n  \
                  discard, nodiscard      discard the blocks each commit freed, together and \
                  in parallel after the commit; at mount, discard what a crash lost \
                  (default nodiscard)\n  \
                  init_itable=N, noinit_itable, lazyinit=adaptive|fixed\n                          \
                  online lazy init: a background worker zeroes the inode tables mkfs left, \
                  waiting N times its work after each group (default 10), adaptively (full \
                  speed when the disk is idle, up to x100 under load), or not at all\n  \
                  allow_other             let other users in (the kernel checks \
                  permissions and ACLs)\n  \
                  default_permissions     always in effect (accepted)\n  \
                  writeback_cache         FUSE's writeback cache (default off): small writes \
                  go to the kernel's page cache and reach the filesystem merged, at writeback, \
                  close or fsync (fsync keeps its promise); SEEK_DATA/SEEK_HOLE have the \
                  kernel write the file's dirty pages back first, st_blocks counts data once \
                  written back (exact after fsync and close); ENOSPC and EFBIG come from \
                  fsync or close, not write\n  \
                  sync, async             a synchronous mount (each write is fsynced, as \
                  ext4's sync); by default (async) small writes are answered from a \
                  write-behind buffer and reach the filesystem merged, within a second or \
                  at the next request that needs them (fsync keeps its promise)\n  \
                  relatime, strictatime, noatime, atime\n                          \
                  atime updates as the kernel's ext4 makes them, each written in the \
                  journal: relatime (default) updates the atime of a file read or a \
                  directory listed when it is not newer than the mtime or ctime, or is a \
                  day old; strictatime at every access; noatime never; atime undoes \
                  noatime. A read the kernel serves from its page cache reaches no server: \
                  the first read of an open counts, later cached ones of the same open \
                  do not (with writeback_cache no cached read counts)\n  \
                  nodiratime, diratime    no atime updates of directories (or again)\n  \
                  lazytime, nolazytime    keep atime updates in memory until the file's \
                  fsync, 12 hours or the unmount (default nolazytime)\n  \
                  suid, nosuid, dev, nodev, exec, noexec\n                          \
                  the kernel mount's flags, as mount(8); the default is nosuid,nodev,exec \
                  (set-user-ID bits and device nodes of the image are not honoured); suid \
                  and dev need root\n  \
                  defaults                ext4kit's defaults (rw, relatime, nosuid, nodev, \
                  exec, async)\n  \
                  transport=ext4kit|fuser the FUSE session: ext4kit's own loop on \
                  io_uring or /dev/fuse (the default, see uring; it serves O_TMPFILE and the statx birth time) or \
                  fuser's (O_TMPFILE fails with EOPNOTSUPP, no statx birth time)\n  \
                  uring, nouring          ext4kit's own loop over FUSE over io_uring (kernel \
                  6.14+), by default where the kernel offers it: \
                  /sys/module/fuse/parameters/enable_uring Y, or N and the mount runs as \
                  root (it sets it to Y, saying so on stderr); otherwise, or where the \
                  kernel lacks it, /dev/fuse. uring insists (where it cannot, /dev/fuse \
                  with one line why); nouring serves on /dev/fuse only. `ext4kit status` \
                  shows the transport in use\n  \
                  uring_depth=N           ring entries per io_uring thread (1 to 64, default \
                  4): requests the kernel can hand a ring before it answers one\n\n\
                  A mounted or busy device is refused; an unknown option is refused with \
                  one line before anything is opened.";

/// Mount an ext4 image or block device with FUSE.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  ext4kit mkfs disk.img 1G\n  ext4kit mount disk.img /mnt\n  \
                  cp -a ~/src /mnt/ && umount /mnt\n  ext4kit mount -f -o ro,noload disk.img /mnt"
)]
pub struct MountArgs {
    /// Mount options, comma-separated (see above); may be repeated.
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
    /// Stay in the foreground until unmounted (do not detach).
    #[arg(short = 'f', long = "foreground")]
    pub foreground: bool,
    /// FUSE worker threads (default: CPUs, 2 to 16).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: Option<u16>,
    /// The detached child of a background mount (internal).
    #[arg(long = "daemon-child", hide = true)]
    pub daemon_child: bool,
    /// ext4 image file, block device, or NBD export (nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH).
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
    /// Directory to mount on.
    #[arg(value_name = "MOUNTPOINT")]
    pub mountpoint: PathBuf,
}

/// The child's "the mount is live" line.
const READY: &str = "ready";

fn absolute(p: &Path, what: &str) -> anyhow::Result<PathBuf> {
    p.canonicalize()
        .with_context(|| format!("{what} {}", p.display()))
}

/// A FUSE mount whose server died (kill -9, a crash) stays in the mount
/// table and answers every stat with ENOTCONN (ECONNABORTED after io_uring): say so, and how to clear
/// it, instead of "Not a directory".
fn stale_mount_check(mp: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(mp) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => {
            let d = mp.display();
            bail!(
                "mount point {d}: a stale FUSE mount (its server is gone: {e}); \
                 clear it with `fusermount3 -u {d}` or `umount -l {d}`, then mount again"
            )
        }
        _ => Ok(()),
    }
}

/// Run `ext4kit mount`.
pub fn run(args: &MountArgs) -> anyhow::Result<i32> {
    let mut opts =
        MountOptions::parse(args.options.iter().map(String::as_str)).map_err(|e| anyhow!("{e}"))?;
    // --journal-path is -o journal_path= (an -o given wins).
    if opts.journal_path.is_none() {
        opts.journal_path = crate::extjournal::path().map(Into::into);
    }
    // As mount(8): only root may mount with suid or dev (fusermount3
    // makes every user mount nosuid,nodev).
    if (!opts.nosuid || !opts.nodev) && !nix::unistd::geteuid().is_root() {
        bail!("mount options suid and dev need root (a user's FUSE mount is always nosuid,nodev)");
    }
    stale_mount_check(&args.mountpoint)?;
    let mountpoint = absolute(&args.mountpoint, "mount point")?;
    if !mountpoint.is_dir() {
        bail!("mount point {}: Not a directory", args.mountpoint.display());
    }
    // An NBD URI is passed on as given (its socket path is used as
    // written, so a background mount wants an absolute one).
    let device = if ext4kit_device::is_device_uri(&args.device) {
        args.device.clone()
    } else {
        absolute(&args.device, "device")?
    };
    let threads = args
        .threads
        .map(usize::from)
        .unwrap_or_else(default_threads);
    if !args.foreground && !args.daemon_child {
        return detach(args, &device, &mountpoint);
    }
    let req = MountRequest {
        device,
        mountpoint,
        opts,
        threads,
    };
    let child = args.daemon_child;
    serve(&req, || {
        if child {
            // Tell the parent, then let go of its pipes.
            outln!("{READY}");
            if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
                let _ = nix::unistd::dup2_stdout(&null);
                let _ = nix::unistd::dup2_stderr(&null);
            }
        }
    })?;
    Ok(0)
}

/// Start the serving child and wait until its mount is live or it failed.
fn detach(args: &MountArgs, device: &Path, mountpoint: &Path) -> anyhow::Result<i32> {
    let exe = std::env::current_exe().context("finding the ext4kit binary")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("--daemon-child");
    for o in &args.options {
        cmd.arg("-o").arg(o);
    }
    // The journal device, absolute (the child runs in /), last so that
    // it wins.
    let jp = MountOptions::parse(args.options.iter().map(String::as_str))
        .ok()
        .and_then(|o| o.journal_path)
        .or_else(|| crate::extjournal::path().map(Into::into));
    if let Some(jp) = jp {
        let abs = if ext4kit_device::is_device_uri(&jp) {
            jp
        } else {
            std::path::absolute(&jp).unwrap_or(jp)
        };
        let mut o = std::ffi::OsString::from("journal_path=");
        o.push(abs.as_os_str());
        cmd.arg("-o").arg(o);
    }
    if let Some(t) = args.threads {
        cmd.arg("--threads").arg(t.to_string());
    }
    cmd.arg("--").arg(device).arg(mountpoint);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .current_dir("/")
        .process_group(0);
    let mut child = cmd.spawn().context("starting the mount process")?;
    let mut line = String::new();
    if let Some(mut so) = child.stdout.take() {
        let _ = so.read_to_string(&mut line);
    }
    if line.lines().next() == Some(READY) {
        return Ok(0);
    }
    let status = child.wait().context("waiting for the mount process")?;
    let mut err = String::new();
    if let Some(mut se) = child.stderr.take() {
        let _ = se.read_to_string(&mut err);
    }
    let err = err.trim();
    if err.is_empty() {
        bail!("the mount process ended ({status}) before the mount was live");
    }
    // The child's own one-line message ("ext4kit: ...").
    eprintln!("{err}");
    Ok(status.code().filter(|&c| c != 0).unwrap_or(1))
}
