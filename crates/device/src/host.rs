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

/// The extended attributes of `path` itself (`llistxattr` + `lgetxattr`),
/// as (name, value) pairs; none when the filesystem has no xattrs.
pub fn xattrs(path: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let p = cpath(path)?;
    let mut names = vec![0u8; 4096];
    let n = loop {
        // SAFETY: `p` is NUL-terminated; `names` is valid for its length.
        let r = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if names.len() < 1 << 20 => names.resize(names.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&c| c == 0).filter(|s| !s.is_empty()) {
        let cn = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        let mut val = vec![0u8; 65536];
        // SAFETY: `p` and `cn` are NUL-terminated; `val` is valid for its
        // length.
        let r =
            unsafe { libc::lgetxattr(p.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if r < 0 {
            continue; // vanished or not readable: skipped, as cp -a does
        }
        val.truncate(r as usize);
        out.push((name.to_vec(), val));
    }
    Ok(out)
}

/// Seconds since the epoch as `time(2)` and the kernel's superblock
/// stamps (`ktime_get_real_seconds`) see them: the coarse real-time clock,
/// which lags the fine one by up to a tick. A superblock stamped from the
/// fine clock just after a second turns can read as "in the future" to an
/// e2fsck started a millisecond later.
pub fn realtime_coarse_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if r == 0 && ts.tv_sec >= 0 {
        ts.tv_sec as u64
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

/// `renameat2(from, to, flags)` with `RENAME_NOREPLACE` (1) and/or
/// `RENAME_EXCHANGE` (2), which `std::fs::rename` cannot pass (tests of
/// the FUSE mount).
pub fn rename_with_flags(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (f, t) = (cpath(from)?, cpath(to)?);
    // SAFETY: `f` and `t` are NUL-terminated and live across the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags as libc::c_uint,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Write `data` at `offset` of `file` through a shared writable mapping
/// (mmap, copy, msync, munmap): the page-cache write path, for tests of
/// filesystems that must handle it. `file` must be open read-write and
/// at least `offset + data.len()` bytes long.
pub fn write_through_mmap(file: &std::fs::File, offset: u64, data: &[u8]) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if data.is_empty() {
        return Ok(());
    }
    let page = crate::page_size() as u64;
    let start = offset - offset % page;
    let len = (offset - start) as usize + data.len();
    let off = libc::off_t::try_from(start)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: a fresh mapping chosen by the kernel (no fixed address), of
    // `len` bytes of an open file descriptor; failure is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the mapping is `len` bytes long and writable; the copy ends
    // at `(offset - start) + data.len() == len`; source and destination
    // cannot overlap (`data` is not in this new mapping).
    unsafe {
        std::ptr::copy_nonoverlapping(
            data.as_ptr(),
            p.cast::<u8>().add((offset - start) as usize),
            data.len(),
        );
    }
    // SAFETY: `p`/`len` are exactly the mapping made above.
    let synced = unsafe { libc::msync(p, len, libc::MS_SYNC) };
    let err = (synced != 0).then(io::Error::last_os_error);
    // SAFETY: as above; the mapping is not used after this.
    unsafe { libc::munmap(p, len) };
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `lsetxattr(path, name, value, flags)` (`XATTR_CREATE` 1, `XATTR_REPLACE`
/// 2) or, with `value` `None`, `lremovexattr(path, name)`.
pub fn set_xattr_flags(
    path: &Path,
    name: &[u8],
    value: Option<&[u8]>,
    flags: i32,
) -> io::Result<()> {
    let p = cpath(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL"))?;
    let r = match value {
        // SAFETY: `p` and `n` are NUL-terminated and live across the call;
        // `v` is valid for `v.len()` bytes.
        Some(v) => unsafe {
            libc::lsetxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags)
        },
        // SAFETY: `p` and `n` are NUL-terminated and live across the call.
        None => unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) },
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `lgetxattr(path, name)`: the value (up to 64 KiB).
pub fn get_xattr(path: &Path, name: &[u8]) -> io::Result<Vec<u8>> {
    let p = cpath(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL"))?;
    let mut val = vec![0u8; 65536];
    // SAFETY: `p` and `n` are NUL-terminated; `val` is valid for its length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    val.truncate(r as usize);
    Ok(val)
}

/// `fsetxattr(file, name, value, flags)` or, with `value` `None`,
/// `fremovexattr(file, name)`: through a descriptor (an unlinked open
/// file too).
pub fn fset_xattr_flags(
    file: &std::fs::File,
    name: &[u8],
    value: Option<&[u8]>,
    flags: i32,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL"))?;
    let fd = file.as_raw_fd();
    let r = match value {
        // SAFETY: `fd` is open for the call; `n` is NUL-terminated and
        // lives across it; `v` is valid for `v.len()` bytes.
        Some(v) => unsafe { libc::fsetxattr(fd, n.as_ptr(), v.as_ptr().cast(), v.len(), flags) },
        // SAFETY: `fd` is open for the call; `n` is NUL-terminated.
        None => unsafe { libc::fremovexattr(fd, n.as_ptr()) },
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fgetxattr(file, name)`: the value (up to 64 KiB).
pub fn fget_xattr(file: &std::fs::File, name: &[u8]) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "xattr name with a NUL"))?;
    let mut val = vec![0u8; 65536];
    // SAFETY: the descriptor is open for the call; `n` is NUL-terminated;
    // `val` is valid for its length.
    let r = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            n.as_ptr(),
            val.as_mut_ptr().cast(),
            val.len(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    val.truncate(r as usize);
    Ok(val)
}

/// `flistxattr(file)`: the names, in the order listed.
pub fn flist_xattrs(file: &std::fs::File) -> io::Result<Vec<Vec<u8>>> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 65536];
    // SAFETY: the descriptor is open for the call; `buf` is valid for its
    // length.
    let r = unsafe { libc::flistxattr(file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// `lseek(file, offset, whence)` with `SEEK_DATA` (3) or `SEEK_HOLE` (4).
pub fn seek_data_hole(file: &std::fs::File, offset: i64, whence: i32) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; no memory involved.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// `copy_file_range(src, &off_in, dst, &off_out, len, 0)`: the bytes
/// copied (the offsets are explicit; the descriptors' own are untouched).
pub fn copy_file_range(
    src: &std::fs::File,
    off_in: u64,
    dst: &std::fs::File,
    off_out: u64,
    len: usize,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "offset too large");
    let mut i = libc::loff_t::try_from(off_in).map_err(|_| bad())?;
    let mut o = libc::loff_t::try_from(off_out).map_err(|_| bad())?;
    // SAFETY: both descriptors are open; `i` and `o` are valid `loff_t`s
    // that live across the call (the kernel updates them).
    let r =
        unsafe { libc::copy_file_range(src.as_raw_fd(), &mut i, dst.as_raw_fd(), &mut o, len, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `fallocate(file, mode, offset, len)` (mode bits as the kernel's:
/// `FALLOC_FL_KEEP_SIZE` 1, `PUNCH_HOLE` 2, `ZERO_RANGE` 0x10, ...).
pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let bad = || io::Error::new(io::ErrorKind::InvalidInput, "range too large");
    let off = libc::off_t::try_from(offset).map_err(|_| bad())?;
    let len = libc::off_t::try_from(len).map_err(|_| bad())?;
    // SAFETY: fallocate takes only integers and an open descriptor.
    let r = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `struct fstrim_range` of `<linux/fs.h>`.
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// `FITRIM`: `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: libc::Ioctl = libc::_IOWR::<FstrimRange>(b'X' as u32, 121);

/// `ioctl(file, FITRIM, {start, len, minlen})` on a file or directory of
/// a mounted filesystem (what util-linux `fstrim MOUNTPOINT` does):
/// discard the free space in `[start, start + len)` in extents of at
/// least `minlen` bytes. Returns the bytes the filesystem says it
/// trimmed (the range's `len` on return).
pub fn fitrim(file: &std::fs::File, start: u64, len: u64, minlen: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let mut r = FstrimRange { start, len, minlen };
    // SAFETY: FITRIM reads and writes one `struct fstrim_range` through
    // the pointer, which points to a live, properly laid out (repr(C),
    // three u64) local for the duration of the call.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), FITRIM, &mut r as *mut FstrimRange) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r.len)
    }
}

/// `syncfs(2)` of the filesystem `file` is on: the kernel writes its
/// dirty pages and inodes of it back (and waits).
pub fn syncfs(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: syncfs takes only an open descriptor.
    if unsafe { libc::syncfs(file.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `ioctl(file, cmd)` for a command without an argument (`_IO(type, nr)`).
pub fn ioctl_no_arg(file: &std::fs::File, cmd: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a command of size 0 passes no memory; the third argument
    // is a null pointer the command does not read.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            cmd as libc::Ioctl,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `access(path, W_OK) == 0`: may this process write to `path` (with the
/// real uid, as mke2fs checks its undo directory)?
pub fn access_writable(path: &Path) -> bool {
    let Ok(p) = cpath(path) else {
        return false;
    };
    // SAFETY: `p` is NUL-terminated and lives across the call; access only
    // reads it.
    unsafe { libc::access(p.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[test]
    fn fitrim_number_matches_linux_headers() {
        assert_eq!(super::FITRIM, 0xc018_5879);
        assert_eq!(std::mem::size_of::<super::FstrimRange>(), 24);
    }
}
