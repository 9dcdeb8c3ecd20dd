//! Hash-indexed directories (htree): the dx_root block (fake `.` and `..`
//! entries, `dx_root_info`, count/limit, entries), interior dx_node blocks
//! (one empty entry covering the block), `dx_entry` and the `dx_tail`
//! checksum of metadata_csum filesystems.
//!
//! Layout (kernel `fs/ext4/namei.c`): the first `dx_entry` of a node is the
//! count/limit pair followed by that entry's block number; its hash is
//! implicitly 0. Offsets of the count/limit pair: 0x20 in the root, 8 in a
//! node. With metadata_csum the `dx_tail` (reserved, checksum) follows the
//! `limit` entries, which is why `limit` is one smaller.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Offset of count/limit in the root block.
pub const ROOT_COUNT_OFFSET: usize = 0x20;
/// Offset of count/limit in an interior node.
pub const NODE_COUNT_OFFSET: usize = 8;
/// Size of one index entry.
pub const DX_ENTRY_SIZE: usize = 8;
/// Size of the checksum tail.
pub const DX_TAIL_SIZE: usize = 8;
/// Levels of interior nodes below the root (`indirect_levels`): at most
/// 1 without large_dir, 2 with it (3 levels of index in all).
pub const MAX_LEVELS_LARGEDIR: u8 = 3;
pub const MAX_LEVELS: u8 = 2;

/// `struct dx_root_info` (at offset 0x18 of the root block).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DxRootInfo {
    pub reserved_zero: U32,
    pub hash_version: u8,
    pub info_length: u8,
    pub indirect_levels: u8,
    pub unused_flags: u8,
}

/// `struct dx_countlimit`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DxCountLimit {
    pub limit: U16,
    pub count: U16,
}

/// `struct dx_entry`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DxEntry {
    pub hash: U32,
    pub block: U32,
}

/// `struct dx_tail`.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DxTail {
    pub dt_reserved: U32,
    pub dt_checksum: U32,
}

const _: () = assert!(size_of::<DxRootInfo>() == 8);
const _: () = assert!(size_of::<DxCountLimit>() == 4);
const _: () = assert!(size_of::<DxEntry>() == DX_ENTRY_SIZE);
const _: () = assert!(size_of::<DxTail>() == DX_TAIL_SIZE);

/// Offset of `dx_root_info` in the root block.
pub const ROOT_INFO_OFFSET: usize = 0x18;

/// The `limit` a node with its count/limit at `count_offset` has in a
/// block of `block_size` bytes (one entry less with the checksum tail).
pub fn limit(block_size: usize, count_offset: usize, metadata_csum: bool) -> usize {
    let tail = if metadata_csum { DX_TAIL_SIZE } else { 0 };
    (block_size - count_offset - tail) / DX_ENTRY_SIZE
}

/// A parsed index node (root or interior): its entries with the first
/// one's hash reported as 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DxNode {
    pub count: u16,
    pub limit: u16,
    pub entries: Vec<(u32, u32)>,
}

/// Why an index block is malformed (one short phrase).
pub type DxProblem = &'static str;

/// Parse the count/limit and entries at `count_offset`. `expect_limit` is
/// the value [`limit`] gives; a different limit is refused (the kernel's
/// `dx_probe` check).
pub fn parse_node(
    block: &[u8],
    count_offset: usize,
    expect_limit: usize,
) -> Result<DxNode, DxProblem> {
    let cl = DxCountLimit::read_from_prefix(block.get(count_offset..).ok_or("short block")?)
        .map_err(|_| "short block")?
        .0;
    let (count, lim) = (cl.count.get(), cl.limit.get());
    if usize::from(lim) != expect_limit {
        return Err("index limit does not match the block size");
    }
    if count == 0 || count > lim {
        return Err("index count is 0 or above its limit");
    }
    let mut entries = Vec::with_capacity(usize::from(count));
    for i in 0..usize::from(count) {
        let off = count_offset + i * DX_ENTRY_SIZE;
        let e = DxEntry::read_from_prefix(block.get(off..).ok_or("short block")?)
            .map_err(|_| "short block")?
            .0;
        let hash = if i == 0 { 0 } else { e.hash.get() };
        entries.push((hash, e.block.get()));
    }
    Ok(DxNode {
        count,
        limit: lim,
        entries,
    })
}

/// Offset of the dx_tail of a node with `limit` entries.
pub fn tail_offset(count_offset: usize, limit: usize) -> usize {
    count_offset + limit * DX_ENTRY_SIZE
}

/// Verify the dx_tail checksum of an index block (`inode_seed` from
/// [`crate::Csum::inode_seed`] of the directory).
pub fn checksum_ok(block: &[u8], count_offset: usize, node: &DxNode, inode_seed: u32) -> bool {
    let t = tail_offset(count_offset, usize::from(node.limit));
    let Some(tail) = block.get(t..t + DX_TAIL_SIZE) else {
        return false;
    };
    let covered = count_offset + usize::from(node.count) * DX_ENTRY_SIZE;
    let stored = u32::from_le_bytes([tail[4], tail[5], tail[6], tail[7]]);
    crate::checksum::dx_node(inode_seed, &block[..covered], &tail[..4]) == stored
}

/// Store the dx_tail checksum (for writers and tests).
pub fn set_checksum(block: &mut [u8], count_offset: usize, node: &DxNode, inode_seed: u32) {
    let t = tail_offset(count_offset, usize::from(node.limit));
    let covered = count_offset + usize::from(node.count) * DX_ENTRY_SIZE;
    let c = crate::checksum::dx_node(inode_seed, &block[..covered], &block[t..t + 4]);
    block[t + 4..t + 8].copy_from_slice(&c.to_le_bytes());
}

/// Does this directory block look like an interior dx node (one empty
/// entry with inode 0 covering the whole block)? `rec_len` decoding is the
/// caller's (64 KiB blocks).
pub fn is_node_block(block: &[u8], block_size: usize) -> bool {
    if block.len() < 8 {
        return false;
    }
    let ino = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    let rl = crate::dir::rec_len_from_disk(u16::from_le_bytes([block[4], block[5]]), block_size);
    ino == 0 && rl == block_size && block[6] == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits() {
        assert_eq!(limit(4096, ROOT_COUNT_OFFSET, true), 507);
        assert_eq!(limit(4096, ROOT_COUNT_OFFSET, false), 508);
        assert_eq!(limit(1024, NODE_COUNT_OFFSET, true), 126);
        assert_eq!(limit(1024, NODE_COUNT_OFFSET, false), 127);
    }

    #[test]
    fn parse_and_checksum_roundtrip() {
        let mut b = vec![0u8; 1024];
        let lim = limit(1024, NODE_COUNT_OFFSET, true);
        b[4..6].copy_from_slice(&1024u16.to_le_bytes());
        b[8..10].copy_from_slice(&(lim as u16).to_le_bytes());
        b[10..12].copy_from_slice(&2u16.to_le_bytes());
        b[12..16].copy_from_slice(&1u32.to_le_bytes());
        b[16..20].copy_from_slice(&0x1000u32.to_le_bytes());
        b[20..24].copy_from_slice(&2u32.to_le_bytes());
        let n = parse_node(&b, NODE_COUNT_OFFSET, lim).unwrap();
        assert_eq!(n.entries, vec![(0, 1), (0x1000, 2)]);
        set_checksum(&mut b, NODE_COUNT_OFFSET, &n, 1234);
        assert!(checksum_ok(&b, NODE_COUNT_OFFSET, &n, 1234));
        assert!(!checksum_ok(&b, NODE_COUNT_OFFSET, &n, 1235));
        assert!(is_node_block(&b, 1024));
        assert!(parse_node(&b, NODE_COUNT_OFFSET, lim + 1).is_err());
    }
}
