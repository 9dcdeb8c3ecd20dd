//! Reading inodes: location in the group's table, the unused-area rule,
//! checksum, `i_extra_isize`, and the decoded fields (32-bit ids, 64-bit
//! sizes, huge_file block counts, timestamps with nanoseconds and epoch
//! bits, crtime).

use ext4kit_format::features::{Incompat, RoCompat};
use ext4kit_format::group_desc::BG_INODE_UNINIT;
use ext4kit_format::inode::{self as di, *};

use crate::FsError;
use crate::sb::Fs;

/// A timestamp: seconds since the epoch (may be negative or past 2038)
/// and nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

/// Earliest time an inode holds (`EXT4_TIMESTAMP_MIN`: the signed 32-bit
/// seconds' minimum, 1901-12-13 20:45:52 UTC).
pub const TIME_MIN: i64 = i32::MIN as i64;
/// Latest time an inode without the extra time fields holds
/// (`EXT4_NON_EXTRA_TIMESTAMP_MAX`, 2038-01-19 03:14:07 UTC).
pub const TIME_MAX_NO_EXTRA: i64 = i32::MAX as i64;
/// Latest time with the extra fields' two epoch bits
/// (`EXT4_EXTRA_TIMESTAMP_MAX`, 2446-05-10 22:38:55 UTC).
pub const TIME_MAX_EXTRA: i64 = (1i64 << 34) - 1 + TIME_MIN;

impl Timestamp {
    /// The time as the kernel's ext4 stores it (`timestamp_truncate` with
    /// ext4's `s_time_min`/`s_time_max`, then `EXT4_INODE_SET_XTIME`):
    /// seconds clamped to the range the field holds, which is
    /// [`TIME_MIN`]..=[`TIME_MAX_EXTRA`] when the inode has the extra
    /// field (`extra`) and the signed 32-bit range otherwise; a time
    /// clamped to a bound, or without an extra field, has no nanoseconds.
    pub fn clamped(self, extra: bool) -> Timestamp {
        let max = if extra {
            TIME_MAX_EXTRA
        } else {
            TIME_MAX_NO_EXTRA
        };
        let sec = self.sec.clamp(TIME_MIN, max);
        let nsec = if !extra || sec == TIME_MIN || sec == max {
            0
        } else {
            self.nsec.min(999_999_999)
        };
        Timestamp { sec, nsec }
    }
}

/// File types (from `i_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    CharDev,
    BlockDev,
    Fifo,
    Socket,
    Unknown,
}

impl FileType {
    pub fn from_mode(mode: u16) -> FileType {
        match mode & S_IFMT {
            S_IFREG => FileType::Regular,
            S_IFDIR => FileType::Directory,
            S_IFLNK => FileType::Symlink,
            S_IFCHR => FileType::CharDev,
            S_IFBLK => FileType::BlockDev,
            S_IFIFO => FileType::Fifo,
            S_IFSOCK => FileType::Socket,
            _ => FileType::Unknown,
        }
    }
    /// The `ls -l` type letter.
    pub fn letter(self) -> char {
        match self {
            FileType::Regular => '-',
            FileType::Directory => 'd',
            FileType::Symlink => 'l',
            FileType::CharDev => 'c',
            FileType::BlockDev => 'b',
            FileType::Fifo => 'p',
            FileType::Socket => 's',
            FileType::Unknown => '?',
        }
    }
    /// The directory entry `file_type` this inode type should have.
    pub fn dirent_type(self) -> u8 {
        use ext4kit_format::dir::*;
        match self {
            FileType::Regular => FT_REG_FILE,
            FileType::Directory => FT_DIR,
            FileType::Symlink => FT_SYMLINK,
            FileType::CharDev => FT_CHRDEV,
            FileType::BlockDev => FT_BLKDEV,
            FileType::Fifo => FT_FIFO,
            FileType::Socket => FT_SOCK,
            FileType::Unknown => FT_UNKNOWN,
        }
    }
}

/// A decoded inode.
#[derive(Clone, Debug)]
pub struct InodeInfo {
    pub ino: u32,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub links: u16,
    pub flags: u32,
    pub generation: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Creation time, when the inode has room for it.
    pub crtime: Option<Timestamp>,
    pub dtime: u32,
    /// Allocated space in 512-byte units (huge_file scaling applied).
    pub blocks_512: u64,
    /// Extended-attribute block (`i_file_acl`), 0 for none.
    pub file_acl: u64,
    /// `i_block` (60 bytes: extent root, block map, fast symlink, device
    /// number or inline data).
    pub i_block: [u8; 60],
    /// `i_extra_isize` (0 for 128-byte inodes).
    pub extra_isize: u16,
    /// `l_i_version | i_version_hi << 32` (as far as present).
    pub version: u64,
    /// Project id (0 when absent).
    pub projid: u32,
    /// The whole on-disk inode (`s_inode_size` bytes).
    pub raw: Vec<u8>,
}

impl InodeInfo {
    pub fn file_type(&self) -> FileType {
        FileType::from_mode(self.mode)
    }
    pub fn is_dir(&self) -> bool {
        self.file_type() == FileType::Directory
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type() == FileType::Symlink
    }
    pub fn is_regular(&self) -> bool {
        self.file_type() == FileType::Regular
    }
    /// Permission bits (with setuid/setgid/sticky).
    pub fn perm(&self) -> u16 {
        self.mode & 0o7777
    }
    pub fn has_extents(&self) -> bool {
        self.flags & EXT4_EXTENTS_FL != 0
    }
    pub fn has_inline_data(&self) -> bool {
        self.flags & EXT4_INLINE_DATA_FL != 0
    }
    pub fn is_htree(&self) -> bool {
        self.flags & EXT4_INDEX_FL != 0
    }
    /// `i_block` as 15 little-endian words.
    pub fn block_words(&self) -> [u32; 15] {
        let mut w = [0u32; 15];
        for (i, x) in w.iter_mut().enumerate() {
            *x = u32::from_le_bytes(self.i_block[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]));
        }
        w
    }
    /// Device number (major, minor) of a character or block device: the
    /// old 16-bit encoding in `i_block[0]`, else the new one in
    /// `i_block[1]` (kernel `ext4_iget`).
    pub fn rdev(&self) -> (u32, u32) {
        let w = self.block_words();
        if w[0] != 0 {
            ((w[0] >> 8) & 0xff, w[0] & 0xff)
        } else {
            let d = w[1];
            ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00))
        }
    }
}

/// Block and byte offset of the slot of the inode at `index` in a group
/// whose inode table starts at `inode_table` (one rule for the read side,
/// [`crate::rw`] and [`crate::fs`]).
pub fn slot_location(
    inode_table: u64,
    index: u32,
    inode_size: u32,
    block_size: u32,
) -> (u64, usize) {
    let byte = u64::from(index) * u64::from(inode_size);
    let bs = u64::from(block_size);
    (inode_table.saturating_add(byte / bs), (byte % bs) as usize)
}

impl Fs<'_> {
    /// Read and check inode `ino`. A free (deleted) inode is an error: it
    /// is only ever met through a damaged reference.
    pub fn inode(&self, ino: u32) -> Result<InodeInfo, FsError> {
        let info = self.info;
        if ino == 0 || ino > info.inodes_count {
            return Err(FsError::corrupt(
                "inode number",
                format!("inode {ino} is outside 1..={}", info.inodes_count),
            ));
        }
        let g = (ino - 1) / info.inodes_per_group;
        let idx = (ino - 1) % info.inodes_per_group;
        let desc = self.group_desc(g)?;
        if info.has_group_csum()
            && (desc.flags() & BG_INODE_UNINIT != 0
                || idx >= info.inodes_per_group.saturating_sub(desc.itable_unused()))
        {
            return Err(FsError::corrupt(
                "inode",
                format!("inode {ino} is in the never-used part of group {g}'s inode table"),
            ));
        }
        let isz = usize::from(info.inode_size);
        let (blk, off) = slot_location(
            desc.inode_table(),
            idx,
            u32::from(info.inode_size),
            info.block_size,
        );
        let block = self.meta_block(blk, "inode table")?;
        let raw = block[off..off + isz].to_vec();
        self.decode_inode(ino, raw)
    }

    /// Decode (and check) the on-disk bytes of inode `ino`.
    pub fn decode_inode(&self, ino: u32, raw: Vec<u8>) -> Result<InodeInfo, FsError> {
        let info = self.info;
        let bad = |d: String| FsError::corrupt("inode", format!("inode {ino}: {d}"));
        let isz = raw.len();
        let extra = if isz > 128 {
            u16::from_le_bytes([raw[OFF_EXTRA_ISIZE], raw[OFF_EXTRA_ISIZE + 1]])
        } else {
            0
        };
        if 128 + usize::from(extra) > isz || extra % 4 != 0 {
            return Err(bad(format!(
                "i_extra_isize {extra} does not fit a {isz}-byte inode"
            )));
        }
        if info.csum.metadata && !di::checksum_ok(&raw, ino, &info.csum) {
            return Err(bad("checksum does not match".into()));
        }
        let node = di::Inode::parse(&raw).ok_or_else(|| bad("short inode".into()))?;
        let has = |off: usize, len: usize| off + len <= 128 + usize::from(extra);
        let word = |off: usize| -> Option<u32> {
            has(off, 4).then(|| u32::from_le_bytes(raw[off..off + 4].try_into().unwrap_or([0; 4])))
        };
        let links = node.i_links_count.get();
        let mode = node.i_mode.get();
        if links == 0 && ino >= info.first_ino {
            return Err(bad("deleted inode referenced (link count 0)".into()));
        }
        let flags = node.i_flags.get();
        let huge = info.features.ro_compat.contains(RoCompat::HUGE_FILE);
        let blocks_512 = if huge {
            let b = node.blocks_512();
            if flags & EXT4_HUGE_FILE_FL != 0 {
                b.saturating_mul(u64::from(info.block_size / 512))
            } else {
                b
            }
        } else {
            u64::from(node.i_blocks_lo.get())
        };
        let file_acl = u64::from(node.i_file_acl_lo.get())
            | if info.features.incompat.contains(Incompat::BIT64) {
                u64::from(node.l_i_file_acl_high.get()) << 32
            } else {
                0
            };
        let t = |secs: u32, extra_off: usize| {
            let (sec, nsec) = decode_time(secs, word(extra_off));
            Timestamp { sec, nsec }
        };
        let crtime = word(OFF_CRTIME).map(|s| {
            let (sec, nsec) = decode_time(s, word(OFF_CRTIME_EXTRA));
            Timestamp { sec, nsec }
        });
        let mut i_block = [0u8; 60];
        i_block.copy_from_slice(&raw[0x28..0x28 + 60]);
        Ok(InodeInfo {
            ino,
            mode,
            uid: u32::from(node.i_uid.get()) | (u32::from(node.l_i_uid_high.get()) << 16),
            gid: u32::from(node.i_gid.get()) | (u32::from(node.l_i_gid_high.get()) << 16),
            size: node.size(),
            links,
            flags,
            generation: node.i_generation.get(),
            atime: t(node.i_atime.get(), OFF_ATIME_EXTRA),
            mtime: t(node.i_mtime.get(), OFF_MTIME_EXTRA),
            ctime: t(node.i_ctime.get(), OFF_CTIME_EXTRA),
            crtime,
            dtime: node.i_dtime.get(),
            blocks_512,
            file_acl,
            i_block,
            extra_isize: extra,
            version: u64::from(node.l_i_version.get())
                | (u64::from(word(OFF_VERSION_HI).unwrap_or(0)) << 32),
            projid: word(OFF_PROJID).unwrap_or(0),
            raw,
        })
    }
}
