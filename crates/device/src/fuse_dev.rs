//! The FUSE device's ioctl: `FUSE_DEV_IOC_CLONE` (`include/uapi/linux/fuse.h`)
//! binds a fresh open of `/dev/fuse` to the connection of an existing one,
//! so each worker of a FUSE session reads its own fd (the kernel keeps a
//! processing queue per fd: a reply goes to the fd its request was read
//! from).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// `_IOR(229, 0, uint32_t)`.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;

/// A new `/dev/fuse` fd on the connection of `fd` (close-on-exec).
pub fn fuse_clone(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let new = File::options().read(true).write(true).open("/dev/fuse")?;
    let old: u32 = fd.as_raw_fd() as u32;
    // SAFETY: `new` is an open fd owned here; the ioctl reads one u32
    // (the fd to clone) through the pointer, which points to `old`, alive
    // across the call; it writes nothing back.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), FUSE_DEV_IOC_CLONE as _, &old as *const u32) };
    if r == 0 {
        Ok(OwnedFd::from(new))
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_ioctl_number_is_fuse_h_s() {
        // _IOR(type 229, nr 0, size 4): dir 2 << 30 | size << 16 | type << 8 | nr.
        assert_eq!(FUSE_DEV_IOC_CLONE, (2 << 30) | (4 << 16) | (229 << 8));
    }

    #[test]
    fn cloning_a_non_fuse_fd_fails_cleanly() {
        if !std::path::Path::new("/dev/fuse").exists() {
            eprintln!("skipped: no /dev/fuse");
            return;
        }
        let f = File::open("/dev/null").unwrap();
        assert!(fuse_clone(f.as_fd()).is_err());
    }
}
