//! Host file operations std has no safe API for, used by `ext4kit cp` to
//! write what it copies out of an image: extended attributes, special
//! files, and times of a path without following a symlink.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
}

/// `lsetxattr(path, name, value, 0)`.
pub fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let p = cpath(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL"))?;
    // SAFETY: `p` and `n` are NUL-terminated and live across the call;
    // `value` is valid for `value.len()` bytes.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mknod(path, mode, makedev(major, minor))` (fifos, sockets, devices).
pub fn mknod(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let p = cpath(path)?;
    let dev = libc::makedev(major, minor);
    // SAFETY: `p` is NUL-terminated and lives across the call.
    let r = unsafe { libc::mknod(p.as_ptr(), mode as libc::mode_t, dev) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Set atime and mtime (seconds, nanoseconds) of `path` itself (a
/// symlink is not followed).
pub fn set_times_nofollow(path: &Path, atime: (i64, u32), mtime: (i64, u32)) -> io::Result<()> {
    let p = cpath(path)?;
    let ts = |(s, n): (i64, u32)| libc::timespec {
        tv_sec: s as libc::time_t,
        tv_nsec: n as libc::c_long,
    };
    let times = [ts(atime), ts(mtime)];
    // SAFETY: `p` is NUL-terminated; `times` is a two-element array that
    // lives across the call.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
