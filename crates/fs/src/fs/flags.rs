//! Inode flags as `lsattr`/`chattr` see them (`FS_IOC_GETFLAGS`,
//! `FS_IOC_SETFLAGS`), with ext4's rules (`ext4_fileattr_set`,
//! `ext4_ioctl_setflags`), and the checks the kernel makes for the
//! immutable and append-only flags before an operation changes anything.
//!
//! The caller's permission (owner or `CAP_FOWNER`, `CAP_LINUX_IMMUTABLE`
//! for `i`/`a`) is the VFS's check, made by the kernel before the FUSE
//! request; the engine applies what ext4 itself decides. Flags the
//! engine cannot honour are refused with EOPNOTSUPP: data journaling
//! (`j`), a change of the extent flag (`e`: the kernel migrates the
//! mapping). casefold (`F`) changes only on an empty directory of a
//! casefold filesystem, as ext4. The others are stored and reported; immutable and
//! append-only are enforced here, `noatime`, `sync`, `dirsync`, `nodump`
//! and the rest are kept as ext4 keeps them (the engine never updates
//! atime and commits only on sync anyway).

use super::*;

/// `EXT4_SECRM_FL` ... the bits of `i_flags` (kernel `ext4.h`).
pub const SYNC_FL: u32 = 0x0000_0008;
pub const IMMUTABLE_FL: u32 = 0x0000_0010;
pub const APPEND_FL: u32 = 0x0000_0020;
pub const NODUMP_FL: u32 = 0x0000_0040;
pub const NOATIME_FL: u32 = 0x0000_0080;
pub const JOURNAL_DATA_FL: u32 = 0x0000_4000;
pub const DIRSYNC_FL: u32 = 0x0001_0000;
pub const TOPDIR_FL: u32 = 0x0002_0000;
pub const DAX_FL: u32 = 0x0200_0000;
pub const PROJINHERIT_FL: u32 = 0x2000_0000;
pub const CASEFOLD_FL: u32 = 0x4000_0000;
use ext4kit_format::fscrypt::{ENCRYPT_FL, VERITY_FL};
/// `EXT4_FL_USER_VISIBLE`: what GETFLAGS shows (EXTENTS, INDEX,
/// INLINE_DATA, HUGE_FILE included).
pub const FL_USER_VISIBLE: u32 = 0x725B_DFFF;
/// `EXT4_FL_USER_MODIFIABLE`: what SETFLAGS may change.
pub const FL_USER_MODIFIABLE: u32 = 0x624B_C0FF;
/// `EXT4_REG_FLMASK`: flags a regular file may have.
const REG_FLMASK: u32 = !(DIRSYNC_FL | TOPDIR_FL | CASEFOLD_FL | PROJINHERIT_FL);
/// `EXT4_OTHER_FLMASK`: flags other non-directories may have.
const OTHER_FLMASK: u32 = NODUMP_FL | NOATIME_FL;

/// `ext4_mask_flags`: the flags an inode of this type may carry.
fn mask_flags(mode: u16, flags: u32) -> u32 {
    match mode & S_IFMT {
        S_IFDIR => flags,
        ext4kit_format::inode::S_IFREG => flags & REG_FLMASK,
        _ => flags & OTHER_FLMASK,
    }
}

/// The new `i_flags` when SETFLAGS asks for `flags` on an inode of type
/// `mode` with `old` flags, as `ext4_fileattr_set` decides: unknown bits
/// and bits wrong for the type are EOPNOTSUPP, visible but fixed bits
/// (EXTENTS aside, INDEX, INLINE_DATA, HUGE_FILE, ...) are silently kept
/// as they are, an immutable inode may only lose its immutable flag
/// (EPERM otherwise).
pub fn setflags_result(mode: u16, old: u32, flags: u32) -> Result<u32, FsError> {
    if flags & !FL_USER_VISIBLE != 0 {
        return Err(FsError::Unsupported(format!(
            "inode flags {:#x}",
            flags & !FL_USER_VISIBLE
        )));
    }
    let flags = flags & FL_USER_MODIFIABLE;
    if mask_flags(mode, flags) != flags {
        return Err(FsError::Unsupported(format!(
            "inode flags {:#x} on this file type",
            flags & !mask_flags(mode, flags)
        )));
    }
    // ext4_ioctl_check_immutable.
    if old & IMMUTABLE_FL != 0
        && flags & IMMUTABLE_FL != 0
        && old & !IMMUTABLE_FL != flags & !IMMUTABLE_FL
    {
        return Err(FsError::NotPermitted("the file is immutable"));
    }
    let changed = old ^ flags;
    if changed & JOURNAL_DATA_FL != 0 {
        return Err(FsError::Unsupported("data journaling (chattr +j)".into()));
    }
    if changed & EXT4_EXTENTS_FL != 0 {
        return Err(FsError::Unsupported(
            "migrating between block maps and extents (chattr -e)".into(),
        ));
    }
    if changed & CASEFOLD_FL != 0 {
        // Filesystem::set_flags checks the directory and clears the bit
        // from what it asks here.
        return Err(FsError::Unsupported("casefold".into()));
    }
    let set = FL_USER_MODIFIABLE & !(JOURNAL_DATA_FL | EXT4_EXTENTS_FL);
    Ok((old & !set) | (flags & set))
}

/// EPERM when `i`'s data may not change (immutable): write, fallocate.
pub fn may_write_data(i: &InodeInfo) -> Result<(), FsError> {
    if i.flags & IMMUTABLE_FL != 0 {
        return Err(FsError::NotPermitted("the file is immutable"));
    }
    Ok(())
}

/// EPERM when `i` may not be changed otherwise, renamed, linked or
/// removed (immutable or append-only: the VFS's `may_delete`,
/// `vfs_link`, `notify_change`, `xattr_permission`).
pub(crate) fn may_change(i: &InodeInfo) -> Result<(), FsError> {
    may_write_data(i)?;
    if i.flags & APPEND_FL != 0 {
        return Err(FsError::NotPermitted("the file is append-only"));
    }
    Ok(())
}

/// `ext4_setattr`'s flag checks: nothing changes on an immutable inode;
/// an append-only one keeps its mode, owner and size (`attrs`), times
/// may change (`touch`; ext4 refuses explicitly given times there too,
/// which the engine cannot tell from "now").
pub(crate) fn may_setattr(i: &InodeInfo, attrs: bool) -> Result<(), FsError> {
    may_write_data(i)?;
    if attrs && i.flags & APPEND_FL != 0 {
        return Err(FsError::NotPermitted("the file is append-only"));
    }
    Ok(())
}

/// EPERM when nothing may be added to directory `d` (immutable; an
/// append-only directory takes new entries).
pub(crate) fn may_add_entry(d: &InodeInfo) -> Result<(), FsError> {
    if d.flags & IMMUTABLE_FL != 0 {
        return Err(FsError::NotPermitted("the directory is immutable"));
    }
    Ok(())
}

/// ENOKEY for a new inode or name in encrypted directory `d`
/// (`fscrypt_prepare_new_inode`, `fscrypt_prepare_link`: both need the
/// directory's key, which the engine never has).
pub fn may_create_in(d: &InodeInfo) -> Result<(), FsError> {
    if d.flags & ENCRYPT_FL != 0 {
        return Err(FsError::NoKey(
            "a new name in an encrypted directory needs its key",
        ));
    }
    Ok(())
}

/// ENOKEY for a rename out of `sd` into `dd` when either is encrypted
/// (`fscrypt_prepare_rename` needs both keys, also within one directory).
pub fn may_rename_between(sd: &InodeInfo, dd: &InodeInfo) -> Result<(), FsError> {
    if (sd.flags | dd.flags) & ENCRYPT_FL != 0 {
        return Err(FsError::NoKey(
            "a rename in or out of an encrypted directory needs its key",
        ));
    }
    Ok(())
}

/// The contents of `i` may be written, truncated or allocated: ENOKEY for
/// an encrypted regular file (`fscrypt_file_open`, `fscrypt_prepare_setattr`
/// with a size: even truncating to 0 needs the key), EPERM for an
/// fs-verity file (`fsverity_file_open` for writing,
/// `fsverity_prepare_setattr`), EPERM when immutable.
pub fn may_write_contents(i: &InodeInfo) -> Result<(), FsError> {
    if i.flags & VERITY_FL != 0 {
        return Err(FsError::NotPermitted("the file has fs-verity"));
    }
    if i.flags & ENCRYPT_FL != 0 && i.is_regular() {
        return Err(FsError::NoKey("the file's contents are encrypted"));
    }
    may_write_data(i)
}

/// EPERM when `victim`'s entry may not leave directory `d`
/// (`may_delete`: either immutable or append-only).
pub(crate) fn may_remove_entry(d: &InodeInfo, victim: &InodeInfo) -> Result<(), FsError> {
    if d.flags & (IMMUTABLE_FL | APPEND_FL) != 0 {
        return Err(FsError::NotPermitted(
            "the directory is immutable or append-only",
        ));
    }
    may_change(victim)
}

impl Filesystem {
    /// The flags `lsattr` shows (`FS_IOC_GETFLAGS`: `i_flags` masked to
    /// ext4's user-visible set).
    pub fn get_flags(&self, ino: u32) -> Result<u32, FsError> {
        self.guard("get_flags", ino, || {
            Ok(self.inode_any(ino)?.flags & FL_USER_VISIBLE)
        })
    }

    /// `FS_IOC_SETFLAGS` with ext4's rules ([`setflags_result`]): the new
    /// flags and ctime in one transaction. Returns the tid.
    pub fn set_flags(&self, ino: u32, flags: u32) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("set_flags", ino, || self.set_flags_op(ino, flags))
    }

    fn set_flags_op(&self, ino: u32, flags: u32) -> Result<u32, FsError> {
        let mut op = self.begin(1, 0)?;
        op.own(ino);
        // Refusals before any change end the empty handle.
        let mut inode = self.inode_any(ino)?;
        // casefold (`chattr +F`/`-F`): ext4_ioctl_setflags' checks, then
        // the rest of the rules on the other bits.
        let cf = (inode.flags ^ flags) & CASEFOLD_FL != 0;
        if cf {
            self.casefold_change_ok(&inode)?;
        }
        let asked = if cf { flags ^ CASEFOLD_FL } else { flags };
        let mut new = setflags_result(inode.mode, inode.flags, asked)?;
        if cf {
            new ^= CASEFOLD_FL;
        }
        let r = (|| {
            let t = now();
            self.edit_inode(&mut inode, |n| {
                n.i_flags.set(new);
                set_node_times(n, &Times::default(), t);
            })?;
            self.store_inode(&mut op, &inode)
        })();
        match r {
            Ok(()) => self.finish(op),
            Err(e) => Err(self.fail(op, e)),
        }
    }
}

impl Filesystem {
    /// Whether `inode`'s casefold flag may change: a casefold filesystem
    /// (EOPNOTSUPP), a directory (ENOTDIR), empty (ENOTEMPTY), as
    /// `ext4_ioctl_setflags`; an encrypted one is refused (its names would
    /// hash with SipHash under the directory's key).
    fn casefold_change_ok(&self, inode: &InodeInfo) -> Result<(), FsError> {
        if self.read(|fs| fs.info.casefold.is_none()) {
            return Err(FsError::Unsupported(
                "casefold (chattr +F) without the casefold feature".into(),
            ));
        }
        if !inode.is_dir() {
            return Err(FsError::NotADirectory);
        }
        if inode.flags & ENCRYPT_FL != 0 {
            return Err(FsError::Unsupported(
                "casefold on an encrypted directory".into(),
            ));
        }
        let entries = self.read(|f| f.read_dir(inode))?;
        if entries.iter().any(|e| e.name != b"." && e.name != b"..") {
            return Err(FsError::NotEmpty);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_format::inode::S_IFREG;

    const REG: u16 = S_IFREG | 0o644;
    const DIR: u16 = S_IFDIR | 0o755;
    const INDEX_FL: u32 = 0x1000;

    #[test]
    fn ext4_setflags_rules() {
        let ext = EXT4_EXTENTS_FL;
        // chattr +i +a +A +d +S: stored; EXTENTS kept.
        let all = IMMUTABLE_FL | APPEND_FL | NOATIME_FL | NODUMP_FL | SYNC_FL;
        assert_eq!(setflags_result(REG, ext, ext | all).unwrap(), ext | all);
        // Fixed visible bits are kept as they are, whatever is asked.
        assert_eq!(
            setflags_result(DIR, ext | INDEX_FL, ext | NODUMP_FL).unwrap(),
            ext | INDEX_FL | NODUMP_FL
        );
        // Unknown bits, directory-only bits on a file: EOPNOTSUPP.
        assert_eq!(
            setflags_result(REG, ext, ext | 0x8000_0000)
                .unwrap_err()
                .errno(),
            95
        );
        assert_eq!(
            setflags_result(REG, ext, ext | TOPDIR_FL)
                .unwrap_err()
                .errno(),
            95
        );
        assert_eq!(
            setflags_result(DIR, ext, ext | TOPDIR_FL).unwrap(),
            ext | TOPDIR_FL
        );
        // Devices and symlinks take only d and A.
        let chr = ext4kit_format::inode::S_IFCHR | 0o600;
        assert_eq!(setflags_result(chr, 0, NODUMP_FL).unwrap(), NODUMP_FL);
        assert_eq!(
            setflags_result(chr, 0, IMMUTABLE_FL).unwrap_err().errno(),
            95
        );
        // Immutable: only its own removal.
        let imm = ext | IMMUTABLE_FL;
        assert_eq!(setflags_result(REG, imm, ext).unwrap(), ext);
        assert_eq!(setflags_result(REG, imm, imm).unwrap(), imm);
        assert_eq!(
            setflags_result(REG, imm, imm | NODUMP_FL)
                .unwrap_err()
                .errno(),
            1
        );
        // Not honoured: data journaling, extent migration.
        assert_eq!(
            setflags_result(REG, ext, ext | JOURNAL_DATA_FL)
                .unwrap_err()
                .errno(),
            95
        );
        assert_eq!(setflags_result(REG, ext, 0).unwrap_err().errno(), 95);
    }
}
