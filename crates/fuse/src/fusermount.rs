//! The mount of a user who is not root, as libfuse makes it: the
//! setuid-root `fusermount3` mounts, and passes the `/dev/fuse` fd of
//! the mount back over a socket (`_FUSE_COMMFD`, `SCM_RIGHTS`).
//!
//! fuser 0.18 has this path too (`mnt/fuse_pure.rs`), but reaches it
//! only after its direct mount returned EPERM: when `/dev/fuse` cannot
//! be opened (mode 0600, as here), `fuse_mount_sys` returns the open's
//! EACCES and never tries `fusermount3`; and its `auto_unmount` is
//! refused without `allow_other` (`Session::new`). So the mount is made
//! here and handed to `fuser::Session::from_fd`.
//!
//! `auto_unmount` is always asked for: `fusermount3` then stays running
//! until our end of the socket closes (the session ended, or the server
//! died, even by SIGKILL) and unmounts then if the mount point is still
//! a FUSE mount. fusermount3 3.14 checks that by opening it as root,
//! which a mount without `allow_other` refuses (EACCES): there a killed
//! server's mount stays, to clear with `fusermount3 -u`. Unmounting by
//! hand is `fusermount3 -u MOUNTPOINT` (a user cannot umount(2)).

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;

use fuser::MountOption;

/// The helper's name (libfuse 3's).
pub const FUSERMOUNT: &str = "fusermount3";

/// The mount `fusermount3` made: the `/dev/fuse` fd and what keeps its
/// `auto_unmount` waiting. Dropping [`Helper`] unmounts the mount if it
/// is still there.
pub(crate) struct Mounted {
    pub fd: OwnedFd,
    pub helper: Helper,
}

/// `fusermount3` waiting for the socket to close (`auto_unmount`).
pub(crate) struct Helper {
    sock: Option<UnixStream>,
    child: Option<Child>,
}

impl Helper {
    /// The socket fusermount3 watches (its close starts the
    /// `auto_unmount`), for a place that closes it later than this
    /// process's exit would (the io_uring rings: `Session::hold`).
    pub(crate) fn take_socket(&mut self) -> Option<UnixStream> {
        self.sock.take()
    }

    /// Give the socket back (nothing took it over).
    pub(crate) fn put_socket(&mut self, sock: UnixStream) {
        self.sock = Some(sock);
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.sock.take());
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

/// Where `fusermount3` is, if it is usable by this user: on `PATH` (or
/// `/bin`, `/usr/bin`, `/sbin`, `/usr/sbin`), owned by root and set-user-ID,
/// and `/dev/fuse` open to the user. Else one line saying what is missing.
pub(crate) fn locate() -> Result<PathBuf, String> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in ["/bin", "/usr/bin", "/sbin", "/usr/sbin"] {
        dirs.push(PathBuf::from(d));
    }
    let Some((bin, md)) = dirs.iter().find_map(|d| {
        let p = d.join(FUSERMOUNT);
        let md = std::fs::metadata(&p).ok()?;
        md.is_file().then_some((p, md))
    }) else {
        return Err(format!(
            "{FUSERMOUNT} is not installed (install the fuse3 package, or mount as root)"
        ));
    };
    if md.uid() != 0 || md.mode() & 0o4000 == 0 {
        return Err(format!(
            "{} is not set-user-ID root (chown root and chmod u+s it, or mount as root)",
            bin.display()
        ));
    }
    // fusermount3 opens /dev/fuse as the user (its privileges dropped).
    let dev = Path::new("/dev/fuse");
    if nix::unistd::access(
        dev,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    )
    .is_err()
    {
        let mode = std::fs::metadata(dev).map_or_else(
            |_| "missing".to_string(),
            |m| format!("mode {:04o}", m.mode() & 0o7777),
        );
        return Err(format!(
            "/dev/fuse ({mode}) is not readable and writable by uid {} ({FUSERMOUNT} opens it as the user; it is normally mode 0666)",
            nix::unistd::getuid()
        ));
    }
    Ok(bin)
}

/// The `-o` string for `fusermount3`: the kernel and fusermount options
/// of `opts` (`suid`/`dev` left out: fusermount3 refuses them to users
/// and mounts nosuid,nodev), `allow_other`, `auto_unmount`.
pub(crate) fn option_string(opts: &[MountOption], allow_other: bool) -> String {
    let mut v: Vec<String> = opts
        .iter()
        .filter_map(|o| {
            Some(match o {
                MountOption::FSName(n) => format!("fsname={n}"),
                MountOption::Subtype(s) => format!("subtype={s}"),
                MountOption::CUSTOM(c) => c.clone(),
                MountOption::AutoUnmount => return None,
                MountOption::DefaultPermissions => "default_permissions".into(),
                MountOption::Dev | MountOption::Suid => return None,
                MountOption::NoDev => "nodev".into(),
                MountOption::NoSuid => "nosuid".into(),
                MountOption::RO => "ro".into(),
                MountOption::RW => "rw".into(),
                MountOption::Exec => "exec".into(),
                MountOption::NoExec => "noexec".into(),
                MountOption::Atime => "atime".into(),
                MountOption::NoAtime => "noatime".into(),
                MountOption::DirSync => "dirsync".into(),
                MountOption::Sync => "sync".into(),
                MountOption::Async => "async".into(),
            })
        })
        .collect();
    if allow_other {
        v.push("allow_other".into());
    }
    v.push("auto_unmount".into());
    v.join(",")
}

/// Run `bin -o OPTS -- MNT` with `_FUSE_COMMFD` and receive the mount's
/// `/dev/fuse` fd. A refusal is an error carrying fusermount3's own
/// message (one line: "option allow_other only allowed if
/// 'user_allow_other' is set in /etc/fuse.conf", "user has no write
/// access to mountpoint ...").
pub(crate) fn mount(bin: &Path, mnt: &Path, opts: &str) -> io::Result<Mounted> {
    let (ours, theirs) = UnixStream::pair()?;
    // The child's end must survive exec (std makes sockets close-on-exec).
    nix::fcntl::fcntl(
        theirs.as_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )?;
    let fd_num = {
        use std::os::fd::AsRawFd;
        theirs.as_raw_fd().to_string()
    };
    let mut child = Command::new(bin)
        .arg("-o")
        .arg(opts)
        .arg("--")
        .arg(mnt)
        .env("_FUSE_COMMFD", OsStr::new(&fd_num))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("running {}: {e}", bin.display())))?;
    drop(theirs);
    // Read its stderr aside: with auto_unmount it stays open while the
    // helper waits, so only a failed mount's is read to the end here.
    let stderr = child.stderr.take().map(|mut s| {
        thread::spawn(move || {
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    });
    let got = ext4kit_device::recv_fd(&ours);
    match got {
        Ok(Some(fd)) => Ok(Mounted {
            fd,
            helper: Helper {
                sock: Some(ours),
                child: Some(child),
            },
        }),
        other => {
            drop(ours);
            let status = child.wait().ok();
            let text = stderr
                .and_then(|h| h.join().ok())
                .unwrap_or_default()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            let msg = match (other, text.is_empty()) {
                (Err(e), _) => format!("receiving the fd from {}: {e}", bin.display()),
                (_, false) => text,
                (_, true) => format!(
                    "{} failed ({}) without sending the /dev/fuse fd",
                    bin.display(),
                    status.map_or_else(|| "?".to_string(), |s| s.to_string())
                ),
            };
            let kind = if msg.contains("user_allow_other") || msg.contains("access") {
                io::ErrorKind::PermissionDenied
            } else {
                io::ErrorKind::Other
            };
            Err(io::Error::new(kind, msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_sent_with_scm_rights_is_received_and_eof_is_none() {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        use std::os::fd::AsRawFd;
        let f = tempfile::tempfile().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let fds = [f.as_raw_fd()];
        let iov = [std::io::IoSlice::new(b"\0")];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(a.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
        let got = ext4kit_device::recv_fd(&b).unwrap().expect("an fd");
        let got = std::fs::File::from(got);
        assert_eq!(got.metadata().unwrap().ino(), f.metadata().unwrap().ino());
        drop(a);
        assert!(ext4kit_device::recv_fd(&b).unwrap().is_none());
    }

    #[test]
    fn options_leave_out_suid_and_dev_and_ask_for_auto_unmount() {
        let o = [
            MountOption::FSName("img".into()),
            MountOption::Subtype("ext4kit".into()),
            MountOption::DefaultPermissions,
            MountOption::RO,
            MountOption::Suid,
            MountOption::Dev,
        ];
        assert_eq!(
            option_string(&o, false),
            "fsname=img,subtype=ext4kit,default_permissions,ro,auto_unmount"
        );
        assert!(option_string(&[], true).starts_with("allow_other,"));
    }
}
