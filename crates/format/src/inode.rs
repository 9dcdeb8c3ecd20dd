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
/// `EXT2_IMMUTABLE_FL` (mke2fs's quota files).
pub const EXT2_IMMUTABLE_FL: u32 = 0x0000_0010;
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

/// Longest target a fast symlink holds: the target and its NUL must fit
/// the 60 bytes of `i_block` (kernel `ext4_symlink`: `len + 1 <=
/// EXT4_N_BLOCKS * 4`).
pub const FAST_SYMLINK_MAX: usize = 59;

/// `i_block` of a fast symlink as the kernel leaves it: on an extents
/// filesystem the new inode's empty extent root header (magic, 0 entries,
/// max 4, depth 0) overwritten by the target and its NUL (so a short
/// target leaves the header's tail behind, e.g. `eh_max`), else zeros
/// under the target and NUL. The inode has no EXTENTS flag and `i_size`
/// = target length. `None` when the target is longer than
/// [`FAST_SYMLINK_MAX`].
pub fn fast_symlink_i_block(target: &[u8], extents: bool) -> Option<[u8; 60]> {
    if target.len() > FAST_SYMLINK_MAX {
        return None;
    }
    let mut b = [0u8; 60];
    if extents {
        b[..12].copy_from_slice(&EMPTY_EXTENT_ROOT);
    }
    b[..target.len()].copy_from_slice(target);
    b[target.len()] = 0;
    Some(b)
}

/// The 12-byte extent header `ext4_ext_tree_init` puts in a new inode's
/// `i_block`: magic 0xF30A, no entries, room for 4, depth 0.
pub const EMPTY_EXTENT_ROOT: [u8; 12] = [0x0A, 0xF3, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0];

/// The one data block of a slow symlink: the target, its NUL, zeros
/// (`i_size` = target length). `None` when the target and its NUL do not
/// fit one block (the kernel's ENAMETOOLONG).
pub fn slow_symlink_block(target: &[u8], block_size: usize) -> Option<Vec<u8>> {
    if target.len() + 1 > block_size {
        return None;
    }
    let mut b = vec![0u8; block_size];
    b[..target.len()].copy_from_slice(target);
    Some(b)
}

/// `i_block` of a character or block device (kernel
/// `ext4_do_update_inode`): the old 16-bit encoding in word 0 when major
/// and minor are below 256, else the new 32-bit encoding in word 1.
pub fn device_i_block(major: u32, minor: u32) -> [u8; 60] {
    let mut b = [0u8; 60];
    if major < 256 && minor < 256 {
        b[0..4].copy_from_slice(&((major << 8) | minor).to_le_bytes());
    } else {
        let d = (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12);
        b[4..8].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// Does a new inode of this type get an extent tree (EXTENTS flag and an
/// empty extent header in `i_block`) on an extents filesystem? The kernel
/// gives one to directories, regular files and slow symlinks only
/// (`ext4_new_inode`; `ext4_symlink` clears it again for fast ones).
pub fn new_inode_uses_extents(mode: u16, symlink_len: usize) -> bool {
    match mode & S_IFMT {
        S_IFDIR | S_IFREG => true,
        S_IFLNK => symlink_len > FAST_SYMLINK_MAX,
        _ => false,
    }
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

    /// Serialize a *new* inode into an `inode_size`-byte on-disk slot:
    /// everything past the 160 known bytes is zeroed (an old occupant's
    /// in-inode xattrs included), the checksum computed when
    /// `csum.metadata` is on. To change an existing inode use
    /// [`Inode::update_slot`], which keeps its in-inode xattrs.
    pub fn write_to(&self, slot: &mut [u8], ino: u32, csum: &crate::Csum) {
        slot.fill(0);
        let n = slot.len().min(160);
        slot[..n].copy_from_slice(&self.as_bytes()[..n]);
        if csum.metadata {
            set_checksum(slot, ino, csum);
        }
    }

    /// Write the fields of an existing inode back into its on-disk slot:
    /// the 128-byte base and the extra fields the slot's own
    /// `i_extra_isize` covers (at most the 32 known bytes); the bytes
    /// after `128 + i_extra_isize` (the in-inode xattr area: the kernel's
    /// `security.*`, `user.*`, `system.data`, ACLs) are kept as they are.
    /// The checksum is recomputed when `csum.metadata` is on.
    pub fn update_slot(&self, slot: &mut [u8], ino: u32, csum: &crate::Csum) {
        let extra = if slot.len() > 128 {
            usize::from(u16::from_le_bytes([slot[0x80], slot[0x81]]))
        } else {
            0
        };
        let n = (128 + extra).min(160).min(slot.len());
        slot[..n].copy_from_slice(&self.as_bytes()[..n]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_bodies() {
        // Old encoding (major, minor < 256) in word 0, new one in word 1.
        assert_eq!(device_i_block(4, 64)[..4], 0x0440u32.to_le_bytes());
        let n = device_i_block(300, 70000);
        assert_eq!(n[..4], [0; 4]);
        let d = u32::from_le_bytes(n[4..8].try_into().unwrap());
        assert_eq!(
            ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00)),
            (300, 70000)
        );
        let f = fast_symlink_i_block(b"x", true).unwrap();
        assert_eq!(f[..6], [b'x', 0, 0, 0, 4, 0]);
        assert_eq!(
            fast_symlink_i_block(b"x", false).unwrap()[..6],
            [b'x', 0, 0, 0, 0, 0]
        );
        assert!(fast_symlink_i_block(&[b'a'; 59], true).is_some());
        assert!(fast_symlink_i_block(&[b'a'; 60], true).is_none());
        let s = slow_symlink_block(&[b'a'; 1023], 1024).unwrap();
        assert_eq!(s[1023], 0);
        assert!(slow_symlink_block(&[b'a'; 1024], 1024).is_none());
        assert!(new_inode_uses_extents(S_IFLNK | 0o777, 60));
        assert!(!new_inode_uses_extents(S_IFLNK | 0o777, 59));
        assert!(!new_inode_uses_extents(S_IFCHR | 0o600, 0));
        assert!(new_inode_uses_extents(S_IFDIR | 0o755, 0));
    }

    /// `update_slot` keeps what follows `128 + i_extra_isize` (an in-inode
    /// xattr area: magic 0xEA020000, entries, values); `write_to` is for
    /// new inodes and clears it.
    #[test]
    fn update_slot_keeps_in_inode_xattrs() {
        let csum = crate::Csum {
            metadata: true,
            gdt: false,
            seed: 0x1234_5678,
            uuid: [0; 16],
        };
        let mut slot = vec![0u8; 256];
        let mut node = Inode::default();
        node.i_mode.set(S_IFREG | 0o644);
        node.i_extra_isize.set(EXTRA_ISIZE);
        node.write_to(&mut slot, 12, &csum);
        // An xattr area as the kernel leaves it after the 32 extra bytes.
        slot[160..164].copy_from_slice(&0xEA02_0000u32.to_le_bytes());
        slot[164..176].copy_from_slice(b"entry+values");
        slot[250..256].copy_from_slice(b"value!");
        let before = slot.clone();
        let mut changed = Inode::parse(&slot).unwrap();
        changed.i_mode.set(S_IFREG | 0o600);
        changed.set_size(4096);
        changed.update_slot(&mut slot, 12, &csum);
        assert_eq!(slot[160..], before[160..]);
        assert_eq!(Inode::parse(&slot).unwrap().size(), 4096);
        assert_eq!(u16::from_le_bytes([slot[0], slot[1]]), S_IFREG | 0o600);
        assert!(checksum_ok(&slot, 12, &csum));
        // A 28-byte extra area: the xattr area starts at 156 and is kept.
        slot[0x80..0x82].copy_from_slice(&28u16.to_le_bytes());
        slot[156..160].copy_from_slice(&0xEA02_0000u32.to_le_bytes());
        let before = slot.clone();
        let mut c = Inode::parse(&slot).unwrap();
        c.i_projid.set(7); // past the slot's extra fields: not written
        c.update_slot(&mut slot, 12, &csum);
        assert_eq!(slot[156..], before[156..]);
        // write_to (a new inode) starts from zeros.
        c.write_to(&mut slot, 12, &csum);
        assert!(slot[160..].iter().all(|&b| b == 0));
    }
}
