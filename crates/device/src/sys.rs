//! Thin, checked wrappers around the raw system calls this crate needs
//! (fallocate, lseek, flock, block-device ioctls). All non-test `unsafe` of
//! the crate lives here.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Linux `dev_t` major number (glibc encoding, as `st_dev`/`st_rdev` use).
pub(crate) fn major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}

/// Linux `dev_t` minor number.
pub(crate) fn minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn to_off(v: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
}

/// Is this error "the operation is not supported here"?
pub(crate) fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::ENOTTY)
    )
}

/// `fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)`: deallocate the
/// range; it reads back as zeros. Works on regular files and block devices.
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let off = to_off(offset)?;
    let len = to_off(len)?;
    // SAFETY: fallocate only takes integers; the descriptor is owned by
    // `file`, which is borrowed for the duration of the call, so it is open.
    let ret = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    cvt(ret).map(drop)
}

/// `lseek(SEEK_DATA)` or `lseek(SEEK_HOLE)`; `Ok(None)` on `ENXIO` (no more
/// data at or after `offset`).
fn seek(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let off = to_off(offset)?;
    // SAFETY: lseek only takes integers; the descriptor is owned by `file`,
    // borrowed for the call. (It moves the file offset, which is harmless:
    // the devices only use positional I/O.)
    let ret = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if ret < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    // ret >= 0 was checked above.
    Ok(Some(ret as u64))
}

/// Next byte at or after `offset` that belongs to data, `None` if only a
/// hole follows.
pub(crate) fn seek_data(file: &File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_DATA)
}

/// Next hole at or after `offset` (end of file counts as a hole).
pub(crate) fn seek_hole(file: &File, offset: u64) -> io::Result<Option<u64>> {
    seek(file, offset, libc::SEEK_HOLE)
}

/// Non-blocking exclusive `flock`. `Ok(false)` if someone else holds a lock.
pub(crate) fn try_flock_exclusive(file: &File) -> io::Result<bool> {
    // SAFETY: flock only takes integers; the descriptor is owned by `file`.
    let ret = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    match cvt(ret) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

// Block-device ioctls from <linux/fs.h>; libc only defines some of them.
const BLKSSZGET: libc::Ioctl = libc::_IO(0x12, 104);
const BLKGETSIZE64: libc::Ioctl = libc::_IOR::<libc::size_t>(0x12, 114);
const BLKDISCARD: libc::Ioctl = libc::_IO(0x12, 119);
const BLKDISCARDZEROES: libc::Ioctl = libc::_IO(0x12, 124);
const BLKPBSZGET: libc::Ioctl = libc::_IO(0x12, 123);
const BLKIOMIN: libc::Ioctl = libc::_IO(0x12, 120);
const BLKIOOPT: libc::Ioctl = libc::_IO(0x12, 121);
const BLKALIGNOFF: libc::Ioctl = libc::_IO(0x12, 122);
const BLKZEROOUT: libc::Ioctl = libc::_IO(0x12, 127);

/// `BLKGETSIZE64`: device size in bytes.
pub(crate) fn blk_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer (the kernel
    // uses put_u64 whatever size the request number encodes), which points
    // to a live, writable, aligned u64 on our stack. The descriptor is owned
    // by `file`, borrowed for the call.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    cvt(ret)?;
    Ok(size)
}

/// `BLKSSZGET`: logical block (sector) size in bytes.
pub(crate) fn blk_logical_block_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one C int through the pointer, which points
    // to a live, writable, aligned c_int. The descriptor is owned by `file`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut size as *mut libc::c_int) };
    cvt(ret)?;
    u32::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two() && *s >= 512)
        .ok_or_else(|| io::Error::other(format!("bogus logical block size {size}")))
}

/// `BLKPBSZGET`: physical block (sector) size in bytes.
pub(crate) fn blk_physical_block_size(file: &File) -> io::Result<u32> {
    let mut size: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, which
    // points to a live, writable, aligned c_uint. The descriptor is owned by
    // `file`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKPBSZGET, &mut size as *mut libc::c_uint) };
    cvt(ret)?;
    Some(size)
        .filter(|s| s.is_power_of_two() && *s >= 512)
        .ok_or_else(|| io::Error::other(format!("bogus physical block size {size}")))
}

/// An ioctl that writes one unsigned int (`BLKIOMIN`, `BLKIOOPT`).
fn blk_get_uint(file: &File, req: libc::Ioctl) -> io::Result<u32> {
    let mut v: libc::c_uint = 0;
    // SAFETY: BLKIOMIN and BLKIOOPT write one unsigned int through the
    // pointer, which points to a live, writable, aligned c_uint. The
    // descriptor is owned by `file`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut libc::c_uint) };
    cvt(ret)?;
    Ok(v)
}

/// `BLKIOMIN`: minimum I/O size in bytes.
pub(crate) fn blk_io_min(file: &File) -> io::Result<u32> {
    blk_get_uint(file, BLKIOMIN)
}

/// `BLKIOOPT`: optimal I/O size in bytes (0: none).
pub(crate) fn blk_io_opt(file: &File) -> io::Result<u32> {
    blk_get_uint(file, BLKIOOPT)
}

/// `BLKALIGNOFF`: alignment offset in bytes (-1: misaligned).
pub(crate) fn blk_alignment_offset(file: &File) -> io::Result<i64> {
    let mut v: libc::c_int = 0;
    // SAFETY: BLKALIGNOFF writes one C int through the pointer, which
    // points to a live, writable, aligned c_int. The descriptor is owned
    // by `file`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKALIGNOFF, &mut v as *mut libc::c_int) };
    cvt(ret)?;
    Ok(i64::from(v))
}

/// `BLKDISCARDZEROES`: does the kernel promise zeros after discard?
pub(crate) fn blk_discard_zeroes(file: &File) -> io::Result<bool> {
    let mut v: libc::c_uint = 0;
    // SAFETY: BLKDISCARDZEROES writes one unsigned int through the pointer,
    // which points to a live, writable, aligned c_uint. The descriptor is
    // owned by `file`.
    let ret = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKDISCARDZEROES,
            &mut v as *mut libc::c_uint,
        )
    };
    cvt(ret)?;
    Ok(v != 0)
}

/// Issue an ioctl that takes a `uint64_t range[2] = { start, len }`.
fn blk_range_ioctl(file: &File, req: libc::Ioctl, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD and BLKZEROOUT read two u64 (start, length) through
    // the pointer, which points to a live, aligned [u64; 2]. The kernel does
    // not write through it. The descriptor is owned by `file`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), req, range.as_ptr()) };
    cvt(ret).map(drop)
}

/// `BLKDISCARD` on `[offset, offset+len)` (must be 512-byte aligned).
pub(crate) fn blk_discard(file: &File, offset: u64, len: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKDISCARD, offset, len)
}

/// `BLKZEROOUT` on `[offset, offset+len)` (must be 512-byte aligned).
pub(crate) fn blk_zeroout(file: &File, offset: u64, len: u64) -> io::Result<()> {
    blk_range_ioctl(file, BLKZEROOUT, offset, len)
}

/// Write zeros over `[offset, offset+len)` with positional writes in large
/// chunks (the last-resort way to zero a range).
pub(crate) fn write_zeros(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut pos = offset;
    let end = offset + len;
    while pos < end {
        let n = (end - pos).min(CHUNK) as usize;
        file.write_all_at(&zeros[..n], pos)?;
        pos += n as u64;
    }
    Ok(())
}

/// Receive one file descriptor passed with `SCM_RIGHTS` on `sock` (what
/// `fusermount3` sends back on `_FUSE_COMMFD`: the `/dev/fuse` fd of the
/// mount it made). `Ok(None)` when the peer closed the socket without
/// sending one (fusermount3 failed; its stderr says why).
pub fn recv_fd(sock: &std::os::unix::net::UnixStream) -> io::Result<Option<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    let mut byte = [0u8; 1];
    // Room for one cmsghdr carrying one int, aligned as the kernel wants.
    let mut ctl = [0u64; 8];
    loop {
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: byte.len(),
        };
        // SAFETY: an all-zero msghdr is a valid empty header; the pointers
        // set below point at `iov` and `ctl`, which outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&ctl) as _;
        // SAFETY: `msg` describes buffers owned by this frame; the fd is a
        // valid socket borrowed for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        // SAFETY: the kernel filled `msg_control` (bounded by
        // `msg_controllen`); CMSG_FIRSTHDR/CMSG_NXTHDR stay within it.
        let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        let mut got = None;
        while !c.is_null() {
            // SAFETY: `c` is a header inside the control buffer (above).
            let h = unsafe { &*c };
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                // SAFETY: an SCM_RIGHTS payload is an array of ints; read
                // the first, unaligned as CMSG_DATA may be.
                let fd: libc::c_int =
                    unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
                if fd >= 0 && got.is_none() {
                    // SAFETY: the kernel just installed `fd` in this process
                    // for us; nothing else owns it.
                    got = Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
                }
            }
            // SAFETY: as CMSG_FIRSTHDR above.
            c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
        }
        return Ok(got);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        // makedev(254, 1) and a large one.
        assert_eq!((major(0xfe01), minor(0xfe01)), (254, 1));
        let dev = libc::makedev(4095, 1_048_575);
        assert_eq!((major(dev), minor(dev)), (4095, 1_048_575));
    }

    #[cfg(all(
        target_os = "linux",
        target_env = "gnu",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    #[test]
    fn ioctl_numbers_match_linux_headers() {
        assert_eq!(BLKSSZGET, 0x1268);
        assert_eq!(BLKGETSIZE64, 0x8008_1272);
        assert_eq!(BLKDISCARD, 0x1277);
        assert_eq!(BLKDISCARDZEROES, 0x127c);
        assert_eq!(BLKPBSZGET, 0x127b);
        assert_eq!(BLKIOMIN, 0x1278);
        assert_eq!(BLKIOOPT, 0x1279);
        assert_eq!(BLKALIGNOFF, 0x127a);
        assert_eq!(BLKZEROOUT, 0x127f);
    }
}
