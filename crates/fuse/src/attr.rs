//! Conversions between the engine's inodes and FUSE's view: inode
//! numbers (FUSE's root is 1, ext4's is 2), attributes, times, device
//! numbers, errno values.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ext4kit_format::inode::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFSOCK};
use ext4kit_fs::FsError;
use ext4kit_fs::inode::{InodeInfo, Timestamp};
use ext4kit_fs::xattr_write::XattrError;
use fuser::{Errno, FileAttr, FileType, INodeNo};

/// The ext4 root directory.
pub const EXT4_ROOT: u32 = 2;

/// FUSE node id of ext4 inode `ino`.
pub fn fuse_ino(ino: u32) -> INodeNo {
    if ino == EXT4_ROOT {
        INodeNo::ROOT
    } else {
        INodeNo(u64::from(ino))
    }
}

/// ext4 inode number of FUSE node id `n`.
pub fn ext4_ino(n: INodeNo) -> Result<u32, Errno> {
    if n == INodeNo::ROOT {
        return Ok(EXT4_ROOT);
    }
    match u32::try_from(n.0) {
        // 2 is never handed out (the root is 1 to the kernel).
        Ok(i) if i > EXT4_ROOT => Ok(i),
        _ => Err(Errno::ENOENT),
    }
}

/// A timestamp as a `SystemTime` (before 1970 too).
pub fn system_time(t: Timestamp) -> SystemTime {
    let nsec = Duration::new(0, t.nsec.min(999_999_999));
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.sec as u64) + nsec
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + nsec
    }
}

/// A time that fuser 0.18.0 decoded from a setattr request, back to the
/// kernel's (seconds, nanoseconds). fuser 0.18.0 turns `(sec < 0, nsec)`
/// into `EPOCH - (|sec| + nsec)` instead of `EPOCH - |sec| + nsec` (a
/// bug its changelog lists as fixed after 0.18.0); this is the exact
/// inverse of what it does, so times before 1970 with a fraction survive
/// a `touch -d`. Times at or after 1970 are converted normally.
pub fn setattr_time(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            Timestamp {
                sec: -i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nsec: d.subsec_nanos(),
            }
        }
    }
}

/// The FUSE file type of an inode mode.
pub fn file_type(mode: u16) -> FileType {
    match mode & S_IFMT {
        S_IFDIR => FileType::Directory,
        S_IFLNK => FileType::Symlink,
        S_IFCHR => FileType::CharDevice,
        S_IFBLK => FileType::BlockDevice,
        S_IFIFO => FileType::NamedPipe,
        S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The FUSE file type of a directory entry's `file_type` byte (`None`
/// when the entry does not say: filesystems without `filetype`).
pub fn dirent_type(ft: u8) -> Option<FileType> {
    use ext4kit_format::dir::*;
    Some(match ft {
        FT_REG_FILE => FileType::RegularFile,
        FT_DIR => FileType::Directory,
        FT_CHRDEV => FileType::CharDevice,
        FT_BLKDEV => FileType::BlockDevice,
        FT_FIFO => FileType::NamedPipe,
        FT_SOCK => FileType::Socket,
        FT_SYMLINK => FileType::Symlink,
        _ => return None,
    })
}

/// The kernel's `new_encode_dev` (what FUSE carries in `rdev`).
pub fn encode_rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The kernel's `new_decode_dev`: (major, minor).
pub fn decode_rdev(dev: u32) -> (u32, u32) {
    ((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

/// An inode's attributes as a transport answers them (fuser's
/// `FileAttr`, the kernel's `fuse_attr`/`fuse_statx`): no transport's
/// type, so every transport encodes the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The FUSE node id (root 1).
    pub ino: u64,
    pub size: u64,
    /// 512-byte units.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    /// `i_crtime` (ctime for an inode too small to hold it).
    pub crtime: SystemTime,
    /// Type and permission bits (`st_mode`).
    pub mode: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// The kernel's `new_encode_dev` form.
    pub rdev: u32,
    pub blksize: u32,
}

impl Attr {
    /// As fuser's type.
    pub fn to_fuser(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino),
            size: self.size,
            blocks: self.blocks,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.crtime,
            kind: file_type(self.mode),
            perm: self.mode & 0o7777,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            blksize: self.blksize,
            flags: 0,
        }
    }
}

/// The attributes the kernel sees for inode `i`.
pub fn attr_of(i: &InodeInfo, block_size: u32) -> Attr {
    let rdev = match i.mode & S_IFMT {
        S_IFCHR | S_IFBLK => {
            let (ma, mi) = i.rdev();
            encode_rdev(ma, mi)
        }
        _ => 0,
    };
    let ctime = system_time(i.ctime);
    Attr {
        ino: fuse_ino(i.ino).0,
        size: i.size,
        blocks: i.blocks_512,
        atime: system_time(i.atime),
        mtime: system_time(i.mtime),
        ctime,
        crtime: i.crtime.map(system_time).unwrap_or(ctime),
        mode: i.mode,
        nlink: u32::from(i.links),
        uid: i.uid,
        gid: i.gid,
        rdev,
        blksize: block_size,
    }
}

/// The attributes of a negative entry (a LOOKUP's "no such name" with a
/// TTL: node id 0, which the kernel caches as a negative dentry; the
/// rest it ignores).
pub fn negative_attr() -> Attr {
    let t = UNIX_EPOCH;
    Attr {
        ino: 0,
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        mode: 0o100000,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
    }
}

/// The errno kernel ext4 returns for an engine error.
pub fn errno(e: &FsError) -> Errno {
    match e {
        // ext4 after errors=remount-ro: the filesystem is read-only now.
        FsError::Aborted(_) => Errno::EROFS,
        FsError::InvalidRequest(_) => Errno::EINVAL,
        // EFSCORRUPTED.
        FsError::BlockOutOfRange { .. } => Errno::from_i32(libc::EUCLEAN),
        _ => Errno::from_i32(e.errno()),
    }
}

/// The errno for an xattr error (ENODATA, ERANGE, E2BIG, ...).
pub fn xattr_errno(e: &XattrError) -> Errno {
    match e {
        XattrError::Fs(f) => errno(f),
        _ => Errno::from_i32(e.errno()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers() {
        assert_eq!(fuse_ino(2), INodeNo::ROOT);
        assert_eq!(fuse_ino(11), INodeNo(11));
        assert_eq!(ext4_ino(INodeNo::ROOT), Ok(2));
        assert_eq!(ext4_ino(INodeNo(12)), Ok(12));
        assert_eq!(ext4_ino(INodeNo(2)), Err(Errno::ENOENT));
        assert_eq!(ext4_ino(INodeNo(1 << 40)), Err(Errno::ENOENT));
    }

    /// fuser 0.18.0's decoding of a setattr time (its
    /// `system_time_from_time`), to test the inverse against.
    fn fuser_decode(secs: i64, nsecs: u32) -> SystemTime {
        if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nsecs)
        } else {
            UNIX_EPOCH - Duration::new((-secs) as u64, nsecs)
        }
    }

    #[test]
    fn times_before_and_after_1970() {
        for (sec, nsec) in [
            (0i64, 0u32),
            (1_700_000_000, 123_456_789),
            (-1, 500_000_000),
            (-86_400 * 365 * 30, 1),
            (-5, 0),
            (4_000_000_000, 999_999_999),
        ] {
            let t = Timestamp { sec, nsec };
            assert_eq!(setattr_time(fuser_decode(sec, nsec)), t, "{sec}.{nsec}");
            // The reply direction: what the kernel gets back.
            let st = system_time(t);
            let back = match st.duration_since(UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
                Err(e) => {
                    let d = e.duration();
                    if d.subsec_nanos() == 0 {
                        (-(d.as_secs() as i64), 0)
                    } else {
                        (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                    }
                }
            };
            assert_eq!(back, (sec, nsec));
        }
    }

    #[test]
    fn device_numbers() {
        for (ma, mi) in [(8, 1), (259, 70000), (0, 0), (4095, 0xfffff)] {
            assert_eq!(decode_rdev(encode_rdev(ma, mi)), (ma, mi));
        }
        assert_eq!(encode_rdev(8, 1), 0x801);
    }

    #[test]
    fn errnos_as_ext4() {
        assert_eq!(errno(&FsError::NotFound), Errno::ENOENT);
        assert_eq!(errno(&FsError::Exists), Errno::EEXIST);
        assert_eq!(errno(&FsError::NotEmpty), Errno::ENOTEMPTY);
        assert_eq!(errno(&FsError::NameTooLong), Errno::ENAMETOOLONG);
        assert_eq!(errno(&FsError::TooManyLinks), Errno::EMLINK);
        assert_eq!(
            errno(&FsError::NoSpace {
                wanted: 1,
                available: 0
            }),
            Errno::ENOSPC
        );
        assert_eq!(errno(&FsError::Aborted("x".into())), Errno::EROFS);
        assert_eq!(
            errno(&FsError::corrupt("inode", "x")),
            Errno::from_i32(libc::EUCLEAN)
        );
        assert_eq!(xattr_errno(&XattrError::NoData), Errno::ENODATA);
        assert_eq!(xattr_errno(&XattrError::NameTooLong), Errno::ERANGE);
    }
}
