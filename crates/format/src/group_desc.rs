//! Block group descriptors (32 bytes, or 64 with the 64bit feature).

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `bg_flags` bits.
pub const BG_INODE_UNINIT: u16 = 0x0001;
pub const BG_BLOCK_UNINIT: u16 = 0x0002;
pub const BG_INODE_ZEROED: u16 = 0x0004;

/// A 64-byte group descriptor. With 32-byte descriptors only the first half
/// is stored on disk; the `_hi` fields are then zero.
#[derive(Clone, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct GroupDesc {
    pub bg_block_bitmap_lo: U32,
    pub bg_inode_bitmap_lo: U32,
    pub bg_inode_table_lo: U32,
    pub bg_free_blocks_count_lo: U16,
    pub bg_free_inodes_count_lo: U16,
    pub bg_used_dirs_count_lo: U16,
    pub bg_flags: U16,
    pub bg_exclude_bitmap_lo: U32,
    pub bg_block_bitmap_csum_lo: U16,
    pub bg_inode_bitmap_csum_lo: U16,
    pub bg_itable_unused_lo: U16,
    pub bg_checksum: U16,
    pub bg_block_bitmap_hi: U32,
    pub bg_inode_bitmap_hi: U32,
    pub bg_inode_table_hi: U32,
    pub bg_free_blocks_count_hi: U16,
    pub bg_free_inodes_count_hi: U16,
    pub bg_used_dirs_count_hi: U16,
    pub bg_itable_unused_hi: U16,
    pub bg_exclude_bitmap_hi: U32,
    pub bg_block_bitmap_csum_hi: U16,
    pub bg_inode_bitmap_csum_hi: U16,
    pub bg_reserved: U32,
}

const _: () = assert!(size_of::<GroupDesc>() == 64);

fn join32(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}
fn join16(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

impl GroupDesc {
    /// Parse a descriptor of `desc_size` bytes (32 or 64).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let mut d = Self::default();
        let n = bytes.len().min(64);
        d.as_mut_bytes()[..n].copy_from_slice(&bytes[..n]);
        Some(d)
    }
    /// The first `desc_size` bytes, as stored on disk.
    pub fn on_disk(&self, desc_size: usize) -> &[u8] {
        &self.as_bytes()[..desc_size.min(64)]
    }

    pub fn block_bitmap(&self) -> u64 {
        join32(self.bg_block_bitmap_lo.get(), self.bg_block_bitmap_hi.get())
    }
    pub fn inode_bitmap(&self) -> u64 {
        join32(self.bg_inode_bitmap_lo.get(), self.bg_inode_bitmap_hi.get())
    }
    pub fn inode_table(&self) -> u64 {
        join32(self.bg_inode_table_lo.get(), self.bg_inode_table_hi.get())
    }
    pub fn free_blocks(&self) -> u32 {
        join16(
            self.bg_free_blocks_count_lo.get(),
            self.bg_free_blocks_count_hi.get(),
        )
    }
    pub fn free_inodes(&self) -> u32 {
        join16(
            self.bg_free_inodes_count_lo.get(),
            self.bg_free_inodes_count_hi.get(),
        )
    }
    pub fn used_dirs(&self) -> u32 {
        join16(
            self.bg_used_dirs_count_lo.get(),
            self.bg_used_dirs_count_hi.get(),
        )
    }
    pub fn itable_unused(&self) -> u32 {
        join16(
            self.bg_itable_unused_lo.get(),
            self.bg_itable_unused_hi.get(),
        )
    }
    pub fn flags(&self) -> u16 {
        self.bg_flags.get()
    }

    pub fn set_block_bitmap(&mut self, v: u64) {
        self.bg_block_bitmap_lo.set(v as u32);
        self.bg_block_bitmap_hi.set((v >> 32) as u32);
    }
    pub fn set_inode_bitmap(&mut self, v: u64) {
        self.bg_inode_bitmap_lo.set(v as u32);
        self.bg_inode_bitmap_hi.set((v >> 32) as u32);
    }
    pub fn set_inode_table(&mut self, v: u64) {
        self.bg_inode_table_lo.set(v as u32);
        self.bg_inode_table_hi.set((v >> 32) as u32);
    }
    pub fn set_free_blocks(&mut self, v: u32) {
        self.bg_free_blocks_count_lo.set(v as u16);
        self.bg_free_blocks_count_hi.set((v >> 16) as u16);
    }
    pub fn set_free_inodes(&mut self, v: u32) {
        self.bg_free_inodes_count_lo.set(v as u16);
        self.bg_free_inodes_count_hi.set((v >> 16) as u16);
    }
    pub fn set_used_dirs(&mut self, v: u32) {
        self.bg_used_dirs_count_lo.set(v as u16);
        self.bg_used_dirs_count_hi.set((v >> 16) as u16);
    }
    pub fn set_itable_unused(&mut self, v: u32) {
        self.bg_itable_unused_lo.set(v as u16);
        self.bg_itable_unused_hi.set((v >> 16) as u16);
    }
    pub fn set_flags(&mut self, v: u16) {
        self.bg_flags.set(v);
    }
    pub fn set_block_bitmap_csum(&mut self, v: u32) {
        self.bg_block_bitmap_csum_lo.set(v as u16);
        self.bg_block_bitmap_csum_hi.set((v >> 16) as u16);
    }
    pub fn set_inode_bitmap_csum(&mut self, v: u32) {
        self.bg_inode_bitmap_csum_lo.set(v as u16);
        self.bg_inode_bitmap_csum_hi.set((v >> 16) as u16);
    }
    pub fn block_bitmap_csum(&self) -> u32 {
        join16(
            self.bg_block_bitmap_csum_lo.get(),
            self.bg_block_bitmap_csum_hi.get(),
        )
    }
    pub fn inode_bitmap_csum(&self) -> u32 {
        join16(
            self.bg_inode_bitmap_csum_lo.get(),
            self.bg_inode_bitmap_csum_hi.get(),
        )
    }

    /// Compute and store `bg_checksum` for `group` with `desc_size` bytes.
    pub fn update_checksum(&mut self, csum: &crate::Csum, group: u32, desc_size: usize) {
        let c = csum.group_desc(group, self.on_disk(desc_size));
        self.bg_checksum.set(c);
    }
    /// Does the stored checksum match?
    pub fn checksum_ok(&self, csum: &crate::Csum, group: u32, desc_size: usize) -> bool {
        !(csum.metadata || csum.gdt)
            || csum.group_desc(group, self.on_disk(desc_size)) == self.bg_checksum.get()
    }
}
