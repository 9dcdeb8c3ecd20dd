//! Extent tree nodes: header, index entries and leaf extents (12 bytes each).

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const EXTENT_MAGIC: u16 = 0xF30A;
/// Largest length of an initialized extent.
pub const EXT_INIT_MAX_LEN: u32 = 32768;

#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExtentHeader {
    pub eh_magic: U16,
    pub eh_entries: U16,
    pub eh_max: U16,
    pub eh_depth: U16,
    pub eh_generation: U32,
}

#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Extent {
    pub ee_block: U32,
    pub ee_len: U16,
    pub ee_start_hi: U16,
    pub ee_start_lo: U32,
}

#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExtentIndex {
    pub ei_block: U32,
    pub ei_leaf_lo: U32,
    pub ei_leaf_hi: U16,
    pub ei_unused: U16,
}

const _: () = assert!(size_of::<ExtentHeader>() == 12);
const _: () = assert!(size_of::<Extent>() == 12);
const _: () = assert!(size_of::<ExtentIndex>() == 12);

impl ExtentHeader {
    pub fn new(entries: u16, max: u16, depth: u16) -> Self {
        Self {
            eh_magic: EXTENT_MAGIC.into(),
            eh_entries: entries.into(),
            eh_max: max.into(),
            eh_depth: depth.into(),
            eh_generation: 0.into(),
        }
    }
}

impl Extent {
    pub fn new(lblk: u32, len: u16, pblk: u64) -> Self {
        Self {
            ee_block: lblk.into(),
            ee_len: len.into(),
            ee_start_hi: ((pblk >> 32) as u16).into(),
            ee_start_lo: (pblk as u32).into(),
        }
    }
    pub fn start(&self) -> u64 {
        u64::from(self.ee_start_lo.get()) | (u64::from(self.ee_start_hi.get()) << 32)
    }
    /// Length in blocks; lengths above 32768 mark unwritten extents.
    pub fn len(&self) -> u32 {
        let l = u32::from(self.ee_len.get());
        if l > EXT_INIT_MAX_LEN {
            l - EXT_INIT_MAX_LEN
        } else {
            l
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_unwritten(&self) -> bool {
        u32::from(self.ee_len.get()) > EXT_INIT_MAX_LEN
    }
}

impl ExtentIndex {
    pub fn new(lblk: u32, leaf: u64) -> Self {
        Self {
            ei_block: lblk.into(),
            ei_leaf_lo: (leaf as u32).into(),
            ei_leaf_hi: ((leaf >> 32) as u16).into(),
            ei_unused: 0.into(),
        }
    }
    pub fn leaf(&self) -> u64 {
        u64::from(self.ei_leaf_lo.get()) | (u64::from(self.ei_leaf_hi.get()) << 32)
    }
}

/// Number of entries an extent block of `block_size` bytes holds (room is
/// kept for the 4-byte checksum tail).
pub fn entries_per_block(block_size: u32) -> u16 {
    ((block_size as usize - 12 - 4) / 12) as u16
}

/// Number of entries that fit in the inode's 60-byte `i_block`.
pub const ENTRIES_IN_INODE: u16 = 4;

/// Store the checksum of an extent block (`buf` = the whole block).
pub fn set_block_checksum(buf: &mut [u8], ino: u32, generation: u32, csum: &crate::Csum) {
    let max = usize::from(u16::from_le_bytes([buf[4], buf[5]]));
    let end = 12 + max * 12;
    if end + 4 > buf.len() {
        return;
    }
    let c = csum.extent_block(ino, generation, &buf[..end]);
    buf[end..end + 4].copy_from_slice(&c.to_le_bytes());
}
