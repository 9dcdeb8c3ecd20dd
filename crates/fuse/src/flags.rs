//! `lsattr`/`chattr` on the mount (and `lsattr -v`'s generation). The kernel turns `FS_IOC_GETFLAGS`/
//! `FS_IOC_SETFLAGS` (and `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR`) on a
//! FUSE file into its `fileattr_get`/`fileattr_set`, which open the file
//! and send the daemon these commands with a 4-byte flags word (or the
//! 28-byte `struct fsxattr`) as a restricted ioctl (`fuse_priv_ioctl`).
//! The VFS has checked the caller first (owner or CAP_FOWNER,
//! CAP_LINUX_IMMUTABLE to change `i` or `a`), so what is left is ext4's
//! own decision ([`ext4kit_fs::fs::flags::setflags_result`]) and one
//! transaction. A read-only mount reports flags and answers EROFS to a
//! change.

use ext4kit_fs::fs::flags::{
    APPEND_FL, DAX_FL, FL_USER_VISIBLE, IMMUTABLE_FL, NOATIME_FL, NODUMP_FL, PROJINHERIT_FL,
    SYNC_FL,
};
use ext4kit_fs::inode::InodeInfo;
use fuser::Errno;

use crate::attr::errno;
use crate::shared::Shared;

/// `FS_IOC_GETFLAGS`: `_IOR('f', 1, long)`.
pub const FS_IOC_GETFLAGS: u32 = 0x8008_6601;
/// `FS_IOC_SETFLAGS`: `_IOW('f', 2, long)`.
pub const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
/// The 32-bit forms (`_IOR('f', 1, int)`, `_IOW('f', 2, int)`).
pub const FS_IOC32_GETFLAGS: u32 = 0x8004_6601;
pub const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR`: `_IOR('X', 31, struct fsxattr)`.
pub const FS_IOC_FSGETXATTR: u32 = 0x801C_581F;
/// `FS_IOC_FSSETXATTR`: `_IOW('X', 32, struct fsxattr)`.
pub const FS_IOC_FSSETXATTR: u32 = 0x401C_5820;
/// `FS_IOC_GETVERSION`: `_IOR('v', 1, long)` (and its 32-bit form):
/// `i_generation` (`lsattr -v`), an `int` as ext4 writes it.
pub const FS_IOC_GETVERSION: u32 = 0x8008_7601;
pub const FS_IOC32_GETVERSION: u32 = 0x8004_7601;
/// Size of `struct fsxattr`.
const FSXATTR_SIZE: usize = 28;

/// `FS_XFLAG_*` and the inode flag each stands for (`fileattr_fill_flags`).
const XFLAGS: [(u32, u32); 7] = [
    (0x0000_0008, IMMUTABLE_FL),
    (0x0000_0010, APPEND_FL),
    (0x0000_0020, SYNC_FL),
    (0x0000_0040, NOATIME_FL),
    (0x0000_0080, NODUMP_FL),
    (0x0000_0200, PROJINHERIT_FL),
    (0x0000_8000, DAX_FL),
];

fn to_xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(_, f)| flags & f != 0)
        .fold(0, |x, (xf, _)| x | xf)
}

/// Is `cmd` one of the flag commands?
pub fn is_flags_ioctl(cmd: u32) -> bool {
    matches!(
        cmd,
        FS_IOC_GETFLAGS
            | FS_IOC_SETFLAGS
            | FS_IOC32_GETFLAGS
            | FS_IOC32_SETFLAGS
            | FS_IOC_FSGETXATTR
            | FS_IOC_FSSETXATTR
            | FS_IOC_GETVERSION
            | FS_IOC32_GETVERSION
    )
}

fn word(b: &[u8], i: usize) -> Result<u32, Errno> {
    b.get(i * 4..i * 4 + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(Errno::EINVAL)
}

/// Answer flag command `cmd` on inode `ino`: the reply's data.
pub fn ioctl(s: &Shared, ino: u32, cmd: u32, in_data: &[u8]) -> Result<Vec<u8>, Errno> {
    let i = s.inode(ino)?;
    let visible = i.flags & FL_USER_VISIBLE;
    match cmd {
        FS_IOC_GETFLAGS | FS_IOC32_GETFLAGS => Ok(visible.to_ne_bytes().to_vec()),
        FS_IOC_GETVERSION | FS_IOC32_GETVERSION => Ok(i.generation.to_ne_bytes().to_vec()),
        FS_IOC_FSGETXATTR => {
            let mut out = vec![0u8; FSXATTR_SIZE];
            out[0..4].copy_from_slice(&to_xflags(visible).to_ne_bytes());
            out[12..16].copy_from_slice(&i.projid.to_ne_bytes());
            Ok(out)
        }
        FS_IOC_SETFLAGS | FS_IOC32_SETFLAGS => {
            let flags = word(in_data, 0)?;
            let fs = s.backend.rw()?;
            fs.set_flags(ino, flags).map_err(|e| errno(&e))?;
            Ok(Vec::new())
        }
        FS_IOC_FSSETXATTR => {
            let (xflags, projid) = (word(in_data, 0)?, word(in_data, 3)?);
            let known = XFLAGS.iter().fold(0, |x, (xf, _)| x | xf);
            if xflags & !known != 0 {
                return Err(Errno::EOPNOTSUPP);
            }
            // The VFS keeps the flags fsxattr does not carry
            // (vfs_fileattr_set with fsx_valid).
            let common = XFLAGS.iter().fold(0, |x, (_, f)| x | f);
            let from_x = XFLAGS
                .iter()
                .filter(|(xf, _)| xflags & xf != 0)
                .fold(0, |x, (_, f)| x | f);
            let fs = s.backend.rw()?;
            fs.set_flags(ino, (visible & !common) | from_x)
                .map_err(|e| errno(&e))?;
            // Then the project id (ext4_fileattr_set's order): its quota
            // usage moves with it; EOPNOTSUPP without the project feature
            // (ext4_ioctl_setproject).
            if projid != i.projid {
                fs.set_projid(ino, projid).map_err(|e| errno(&e))?;
            }
            Ok(Vec::new())
        }
        _ => Err(Errno::ENOTTY),
    }
}

/// `may_open`'s flag checks (the kernel makes them on an ext4 inode,
/// not on a FUSE one): EPERM for opening an immutable file for writing,
/// an append-only one for writing without `O_APPEND` or with `O_TRUNC`.
///
/// Without keys (`fscrypt_file_open`, `fsverity_file_open`): ENOKEY for an
/// encrypted regular file, EPERM for an fs-verity file opened for writing.
pub fn may_open(i: &InodeInfo, oflags: i32) -> Result<(), Errno> {
    let write = oflags & libc::O_ACCMODE != libc::O_RDONLY;
    if i.is_regular() && i.flags & ext4kit_format::fscrypt::ENCRYPT_FL != 0 {
        return Err(Errno::from_i32(libc::ENOKEY));
    }
    if (write || oflags & libc::O_TRUNC != 0) && i.flags & ext4kit_format::fscrypt::VERITY_FL != 0 {
        return Err(Errno::EPERM);
    }
    if write && i.flags & IMMUTABLE_FL != 0 {
        return Err(Errno::EPERM);
    }
    if i.flags & APPEND_FL != 0
        && ((write && oflags & libc::O_APPEND == 0) || oflags & libc::O_TRUNC != 0)
    {
        return Err(Errno::EPERM);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xflags_map_both_ways() {
        assert_eq!(to_xflags(IMMUTABLE_FL | NODUMP_FL | 0x8_0000), 0x88);
        assert!(is_flags_ioctl(FS_IOC_GETFLAGS) && !is_flags_ioctl(crate::trim::FITRIM));
    }
}
