//! On-disk inodes (128-byte base plus the large-inode extra fields).

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Reserved inode numbers.
pub const BAD_INO: u32 = 1;
pub const ROOT_INO: u32 = 2;
pub const USR_QUOTA_INO: u32 = 3;
pub const GRP_QUOTA_INO: u32 = 4;
pub const BOOT_LOADER_INO: u32 = 5;
pub const UNDEL_DIR_INO: u32 = 6;
pub const RESIZE_INO: u32 = 7;
pub const JOURNAL_INO: u32 = 8;
pub const EXCLUDE_INO: u32 = 9;
pub const REPLICA_INO: u32 = 10;
pub const GOOD_OLD_FIRST_INO: u32 = 11;

/// `i_mode` type bits.
pub const S_IFREG: u16 = 0o100000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFMT: u16 = 0o170000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFIFO: u16 = 0o010000;
pub const S_IFSOCK: u16 = 0o140000;

/// `i_flags` bits.
pub const EXT4_EXTENTS_FL: u32 = 0x0008_0000;
pub const EXT4_HUGE_FILE_FL: u32 = 0x0004_0000;
pub const EXT4_INDEX_FL: u32 = 0x0000_1000;
pub const EXT4_INLINE_DATA_FL: u32 = 0x1000_0000;
pub const EXT4_EA_INODE_FL: u32 = 0x0020_0000;

/// Byte offsets of the extra fields (each present when
/// `128 + i_extra_isize` reaches past its end).
pub const OFF_EXTRA_ISIZE: usize = 0x80;
pub const OFF_CTIME_EXTRA: usize = 0x84;
pub const OFF_MTIME_EXTRA: usize = 0x88;
pub const OFF_ATIME_EXTRA: usize = 0x8C;
pub const OFF_CRTIME: usize = 0x90;
pub const OFF_CRTIME_EXTRA: usize = 0x94;
pub const OFF_VERSION_HI: usize = 0x98;
pub const OFF_PROJID: usize = 0x9C;

/// Decode a timestamp: the signed 32-bit seconds plus, when the extra
/// field is present, its two epoch bits (<< 32) and 30 bits of
/// nanoseconds (the kernel's `ext4_decode_extra_time`).
pub fn decode_time(secs: u32, extra: Option<u32>) -> (i64, u32) {
    let mut s = i64::from(secs as i32);
    let mut ns = 0;
    if let Some(x) = extra {
        s += i64::from(x & 3) << 32;
        ns = x >> 2;
    }
    (s, ns)
}

/// Size of the fields past the 128-byte base that ext4 knows about.
pub const EXTRA_ISIZE: u16 = 32;

/// The first 160 bytes of an inode (128 base + 32 extra).
#[derive(Clone, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Inode {
    pub i_mode: U16,
    pub i_uid: U16,
    pub i_size_lo: U32,
    pub i_atime: U32,
    pub i_ctime: U32,
    pub i_mtime: U32,
    pub i_dtime: U32,
    pub i_gid: U16,
    pub i_links_count: U16,
    pub i_blocks_lo: U32,
    pub i_flags: U32,
    pub l_i_version: U32,
    pub i_block: [U32; 15],
    pub i_generation: U32,
    pub i_file_acl_lo: U32,
    pub i_size_high: U32,
    pub i_obso_faddr: U32,
    pub l_i_blocks_high: U16,
    pub l_i_file_acl_high: U16,
    pub l_i_uid_high: U16,
    pub l_i_gid_high: U16,
    pub l_i_checksum_lo: U16,
    pub l_i_reserved: U16,
    pub i_extra_isize: U16,
    pub i_checksum_hi: U16,
    pub i_ctime_extra: U32,
    pub i_mtime_extra: U32,
    pub i_atime_extra: U32,
    pub i_crtime: U32,
    pub i_crtime_extra: U32,
    pub i_version_hi: U32,
    pub i_projid: U32,
}

const _: () = assert!(size_of::<Inode>() == 160);

impl Default for Inode {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl Inode {
    pub fn size(&self) -> u64 {
        u64::from(self.i_size_lo.get()) | (u64::from(self.i_size_high.get()) << 32)
    }
    pub fn set_size(&mut self, v: u64) {
        self.i_size_lo.set(v as u32);
        self.i_size_high.set((v >> 32) as u32);
    }
    /// `i_blocks` in 512-byte units (no HUGE_FILE scaling).
    pub fn blocks_512(&self) -> u64 {
        u64::from(self.i_blocks_lo.get()) | (u64::from(self.l_i_blocks_high.get()) << 32)
    }
    pub fn set_blocks_512(&mut self, v: u64) {
        self.i_blocks_lo.set(v as u32);
        self.l_i_blocks_high.set((v >> 32) as u16);
    }
    /// The 60-byte `i_block` area as bytes.
    pub fn i_block_bytes_mut(&mut self) -> &mut [u8] {
        self.i_block.as_mut_bytes()
    }
    /// Parse from the on-disk bytes (at least 128).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 128 {
            return None;
        }
        let mut i = Self::default();
        let n = bytes.len().min(160);
        i.as_mut_bytes()[..n].copy_from_slice(&bytes[..n]);
        Some(i)
    }

    /// Serialize into an `inode_size`-byte on-disk slot, computing the
    /// checksum when `csum.metadata` is on.
    pub fn write_to(&self, slot: &mut [u8], ino: u32, csum: &crate::Csum) {
        slot.fill(0);
        let n = slot.len().min(160);
        slot[..n].copy_from_slice(&self.as_bytes()[..n]);
        if slot.len() <= 128 {
            // A 128-byte inode has no extra fields at all.
        }
        if csum.metadata {
            set_checksum(slot, ino, csum);
        }
    }
}

/// Compute and store the inode checksum in an on-disk inode slot.
pub fn set_checksum(slot: &mut [u8], ino: u32, csum: &crate::Csum) {
    let generation = u32::from_le_bytes([slot[0x64], slot[0x65], slot[0x66], slot[0x67]]);
    let c = csum.inode(ino, generation, slot);
    slot[0x7C..0x7E].copy_from_slice(&(c as u16).to_le_bytes());
    if slot.len() > 128 {
        let extra = u16::from_le_bytes([slot[0x80], slot[0x81]]);
        if extra >= 4 {
            slot[0x82..0x84].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
        }
    }
}

/// Verify an on-disk inode slot's checksum.
pub fn checksum_ok(slot: &[u8], ino: u32, csum: &crate::Csum) -> bool {
    if !csum.metadata {
        return true;
    }
    let generation = u32::from_le_bytes([slot[0x64], slot[0x65], slot[0x66], slot[0x67]]);
    let c = csum.inode(ino, generation, slot);
    let lo = u16::from_le_bytes([slot[0x7C], slot[0x7D]]);
    let mut ok = lo == c as u16;
    if slot.len() > 128 && u16::from_le_bytes([slot[0x80], slot[0x81]]) >= 4 {
        ok &= u16::from_le_bytes([slot[0x82], slot[0x83]]) == (c >> 16) as u16;
    }
    ok
}
