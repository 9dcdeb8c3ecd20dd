//! The fast-commit replay (issue 20): [`replay`] applies the records of a
//! valid fast-commit log, in the kernel's order and per tag as
//! `ext4_fc_replay` does, to an overlay of the full commits' replay, and
//! returns the changed home blocks, which [`super::apply`] makes durable
//! through `fast_commit::commit_as_full` (docs/ARCHITECTURE.md,
//! "Fast-commit replay"). Its pieces:
//!
//! - [`Overlay`]: the image after the full commits' replay (the device
//!   under [`super::Recovery::writes`]) plus the replay's own changes,
//!   nothing written in place; [`Overlay::changes`] is what
//!   [`super::fast_commit::commit_as_full`] makes durable.
//! - [`OverlayTree`]: an [`ExtentTree`]'s block I/O on an overlay, new
//!   tree nodes taken from blocks the caller vouches for (free after the
//!   replay *and* outside every ADD_RANGE of the log, the kernel's
//!   `ext4_fc_replay_check_excluded`).
//! - [`add_range`] / [`del_range`]: the ADD_RANGE and DEL_RANGE steps
//!   (`ext4_fc_replay_add_range`, `_del_range`) on an extent tree, with
//!   the kernel's rule of which physical blocks change state in the block
//!   bitmap.
//! - [`mark_bits`] / [`free_bits`]: a bitmap block edited and counted
//!   (`ext4_mb_mark_bb`, and the counts `ext4_fc_set_bitmaps_and_counters`
//!   leaves).

use std::collections::BTreeMap;
use std::sync::Mutex;

use ext4kit_device::Device;

use ext4kit_format::dir::FT_REG_FILE;
use ext4kit_format::features::RoCompat;
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT, GroupDesc};
use ext4kit_format::inode::{
    EXT4_EXTENTS_FL, EXT4_HUGE_FILE_FL, EXT4_INDEX_FL, EXT4_INLINE_DATA_FL, S_IFDIR, S_IFLNK,
    S_IFMT, S_IFREG,
};
use ext4kit_format::superblock::{SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock};
use zerocopy::IntoBytes;

use super::fast_commit::{EXT4_FC_TAG_CREAT, EXT4_FC_TAG_LINK, FcTag, replay_inode_bytes};
use super::recover::{Journal, RecoverError, Recovery};
use crate::dir_write::{DirBlocks, DirParams, DirWriter};
use crate::extent::Mapping;
use crate::extent_write::{ExtentTree, TreeIo, TreeParams};
use crate::groups::Layout;
use crate::rw::{Geometry, locate_inode, summary_counts};
use crate::sb::{Fs, FsInfo};
use crate::{BlockRead, FsError};

/// The filesystem as the full commits' replay leaves it, with the fast
/// commits' replay written on top in memory.
pub struct Overlay<'a> {
    dev: &'a dyn Device,
    block_size: u32,
    blocks: u64,
    /// The full commits' home writes ([`super::Recovery::writes`]).
    full: &'a BTreeMap<u64, Vec<u8>>,
    /// What the fast-commit replay wrote.
    changed: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl<'a> Overlay<'a> {
    pub fn new(
        dev: &'a dyn Device,
        block_size: u32,
        blocks: u64,
        full: &'a BTreeMap<u64, Vec<u8>>,
    ) -> Overlay<'a> {
        Overlay {
            dev,
            block_size,
            blocks,
            full,
            changed: Mutex::new(BTreeMap::new()),
        }
    }

    fn check(&self, blk: u64, len: usize) -> Result<(), FsError> {
        crate::run_in_range(blk, 1, self.blocks)?;
        if len != self.block_size as usize {
            return Err(FsError::InvalidRequest(format!(
                "a write of {len} bytes to block {blk} (blocks are {} bytes)",
                self.block_size
            )));
        }
        Ok(())
    }

    /// The block as the full commits' replay leaves it.
    fn under(&self, blk: u64, buf: &mut [u8]) -> Result<(), FsError> {
        if let Some(d) = self.full.get(&blk) {
            buf.copy_from_slice(d);
            return Ok(());
        }
        self.dev.read_at(buf, blk * u64::from(self.block_size))?;
        Ok(())
    }

    /// Replace block `blk` (a whole block) in the overlay.
    pub fn write(&self, blk: u64, data: &[u8]) -> Result<(), FsError> {
        self.check(blk, data.len())?;
        self.changed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(blk, data.to_vec());
        Ok(())
    }

    /// The blocks the fast-commit replay changed (home block -> final
    /// bytes), those it rewrote with what the full replay left dropped:
    /// what `commit_as_full` writes as one more full transaction.
    pub fn changes(&self) -> Result<BTreeMap<u64, Vec<u8>>, FsError> {
        let changed = self.changed.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = BTreeMap::new();
        let mut buf = vec![0u8; self.block_size as usize];
        for (&b, d) in changed.iter() {
            self.under(b, &mut buf)?;
            if buf != *d {
                out.insert(b, d.clone());
            }
        }
        Ok(out)
    }
}

impl BlockRead for Overlay<'_> {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read_block(&self, blk: u64, buf: &mut [u8]) -> Result<(), FsError> {
        self.check(blk, buf.len())?;
        if let Some(d) = self
            .changed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&blk)
        {
            buf.copy_from_slice(d);
            return Ok(());
        }
        self.under(blk, buf)
    }
}

/// An extent tree's blocks on an [`Overlay`]. New nodes come from
/// `spare` (lowest first); the blocks the edits allocated and freed are
/// recorded for the bitmap step.
pub struct OverlayTree<'o, 'a> {
    pub ov: &'o Overlay<'a>,
    /// Blocks a new tree node may take: free once the replay is done and
    /// outside every ADD_RANGE of the log (the caller's promise).
    pub spare: Vec<u64>,
    pub allocated: Vec<u64>,
    pub freed: Vec<u64>,
}

impl<'o, 'a> OverlayTree<'o, 'a> {
    pub fn new(ov: &'o Overlay<'a>, mut spare: Vec<u64>) -> Self {
        spare.sort_unstable_by(|a, b| b.cmp(a));
        spare.dedup();
        OverlayTree {
            ov,
            spare,
            allocated: Vec::new(),
            freed: Vec::new(),
        }
    }
}

impl TreeIo for OverlayTree<'_, '_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.ov.block(blk)
    }

    fn write(&mut self, blk: u64, data: &[u8], _new: bool) -> Result<(), FsError> {
        self.ov.write(blk, data)
    }

    fn alloc(&mut self, _goal: u64) -> Result<u64, FsError> {
        let b = self.spare.pop().ok_or(FsError::NoSpace {
            wanted: 1,
            available: 0,
        })?;
        self.allocated.push(b);
        Ok(b)
    }

    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        if let Some(i) = self.allocated.iter().position(|&b| b == blk) {
            // A node this replay made and dropped again: spare again.
            self.allocated.swap_remove(i);
            self.spare.push(blk);
        } else {
            self.freed.push(blk);
        }
        Ok(())
    }
}

/// What a range step does to the block bitmap: `used` physical ranges
/// become in use, `freed` ones free (start, length). The kernel frees the
/// old blocks of a remapped or deleted range even when another inode (or
/// another part of this one) maps them after the replay: its last step,
/// `ext4_fc_set_bitmaps_and_counters`, marks every block of every
/// replayed inode in use again, which the caller must do too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeEffect {
    pub used: Vec<(u64, u64)>,
    pub freed: Vec<(u64, u64)>,
}

/// `[s, e)` minus `[cs, ce)`: up to two pieces.
fn subtract(s: u64, e: u64, cs: u64, ce: u64) -> Vec<(u64, u64)> {
    if ce <= s || cs >= e {
        return vec![(s, e - s)];
    }
    let mut out = Vec::new();
    if s < cs {
        out.push((s, cs - s));
    }
    if ce < e {
        out.push((ce, e - ce));
    }
    out
}

/// The ADD_RANGE step (`ext4_fc_replay_add_range`): logical
/// `m.lblk..m.end()` ends up mapped to `m.pblk..` in `m`'s state. What was
/// unmapped is inserted; what pointed elsewhere is remapped and its old
/// blocks freed; what already pointed there only takes `m`'s written or
/// unwritten state. The new blocks are in use.
pub fn add_range(tree: &mut ExtentTree<'_>, m: &Mapping) -> Result<RangeEffect, FsError> {
    let removed = tree.remove(m.lblk, m.end())?;
    tree.insert(m)?;
    let (ms, me) = (m.pblk, m.pblk + u64::from(m.len));
    let mut freed = Vec::new();
    for p in removed {
        let (s, e) = (p.pblk, p.pblk + u64::from(p.len));
        freed.extend(subtract(s, e, ms, me));
    }
    freed.sort_unstable();
    Ok(RangeEffect {
        used: vec![(ms, u64::from(m.len))],
        freed,
    })
}

/// The DEL_RANGE step (`ext4_fc_replay_del_range`): logical
/// `lblk..lblk+len` is unmapped and the blocks it mapped are free.
pub fn del_range(tree: &mut ExtentTree<'_>, lblk: u64, len: u64) -> Result<RangeEffect, FsError> {
    let removed = tree.remove(lblk, lblk.saturating_add(len))?;
    let mut freed: Vec<(u64, u64)> = removed.iter().map(|p| (p.pblk, u64::from(p.len))).collect();
    freed.sort_unstable();
    Ok(RangeEffect {
        used: Vec::new(),
        freed,
    })
}

/// Set (`used`) or clear the bits of blocks `start..start+len` that fall
/// in the bitmap `bitmap` of a group whose first block is `first` and
/// which has `nbits` blocks; returns how many bits changed (what the
/// group's free count moves by).
pub fn mark_bits(
    bitmap: &mut [u8],
    first: u64,
    nbits: u64,
    start: u64,
    len: u64,
    used: bool,
) -> u64 {
    let nbits = nbits.min(bitmap.len() as u64 * 8);
    let lo = start.max(first);
    let hi = start.saturating_add(len).min(first + nbits);
    let mut flipped = 0;
    for b in lo..hi {
        let bit = (b - first) as usize;
        let (byte, mask) = (bit / 8, 1u8 << (bit % 8));
        let was = bitmap[byte] & mask != 0;
        if was != used {
            bitmap[byte] ^= mask;
            flipped += 1;
        }
    }
    flipped
}

/// Free (clear) bits among the first `nbits` of `bitmap`: a group's free
/// count as `ext4_fc_set_bitmaps_and_counters` leaves it.
pub fn free_bits(bitmap: &[u8], nbits: u64) -> u64 {
    let nbits = nbits.min(bitmap.len() as u64 * 8) as usize;
    let full = nbits / 8;
    let mut used: u64 = bitmap[..full]
        .iter()
        .map(|b| u64::from(b.count_ones()))
        .sum();
    if !nbits.is_multiple_of(8) {
        let mask = (1u8 << (nbits % 8)) - 1;
        used += u64::from((bitmap[full] & mask).count_ones());
    }
    nbits as u64 - used
}

// ---------------------------------------------------------------------
// The replay: the records of a valid fast-commit log applied in order to
// an overlay of the full replay.

/// Offsets in `struct ext4_inode` the replay reads and writes.
const I_MODE: usize = 0;
const I_SIZE_LO: usize = 4;
const I_LINKS: usize = 26;
const I_BLOCKS_LO: usize = 28;
const I_FLAGS: usize = 32;
const I_BLOCK: usize = 40;
const I_GENERATION: usize = 100;
const I_FILE_ACL_LO: usize = 104;
const I_SIZE_HI: usize = 108;
const I_BLOCKS_HI: usize = 116;
const I_FILE_ACL_HI: usize = 118;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

/// What the replay refuses: one line naming why (the caller then keeps
/// the journal as it is, nothing written).
fn refuse(why: impl std::fmt::Display) -> RecoverError {
    RecoverError::Unsupported(format!(
        "the journal holds fast commits that ext4kit cannot replay: {why} (run e2fsck -fy, or mount it with the kernel)"
    ))
}

fn fs_err(e: FsError) -> RecoverError {
    match e {
        FsError::Recover(r) => r,
        FsError::Device(d) => RecoverError::from(d),
        e => RecoverError::Corrupt {
            what: "fast-commit replay",
            detail: e.to_string(),
        },
    }
}

/// The block and inode bitmaps of the groups the replay touches, edited
/// in memory and written (with the descriptors' counts) at the end.
struct Bitmaps {
    layout: Layout,
    blocks: BTreeMap<u32, Vec<u8>>,
    inodes: BTreeMap<u32, Vec<u8>>,
}

impl Bitmaps {
    fn desc(&self, ov: &Overlay<'_>, g: u32) -> Result<(u64, usize, GroupDesc), RecoverError> {
        let l = &self.layout;
        if g >= l.group_count {
            return Err(RecoverError::Corrupt {
                what: "fast-commit replay",
                detail: format!("group {g} does not exist"),
            });
        }
        let blk = l.desc_block(l.desc_block_of(g));
        let off = (g % l.desc_per_block) as usize * l.desc_size;
        let b = ov.block(blk).map_err(fs_err)?;
        let d = b
            .get(off..off + l.desc_size)
            .and_then(GroupDesc::parse)
            .ok_or_else(|| RecoverError::Corrupt {
                what: "group descriptor",
                detail: format!("group {g}"),
            })?;
        Ok((blk, off, d))
    }

    fn block_bitmap(&mut self, ov: &Overlay<'_>, g: u32) -> Result<&mut Vec<u8>, RecoverError> {
        if !self.blocks.contains_key(&g) {
            let (_, _, d) = self.desc(ov, g)?;
            if self.layout.group_csum && d.flags() & BG_BLOCK_UNINIT != 0 {
                return Err(refuse(format!(
                    "it changes blocks of group {g}, whose block bitmap was never initialized"
                )));
            }
            let bm = ov.block(d.block_bitmap()).map_err(fs_err)?;
            self.blocks.insert(g, bm);
        }
        Ok(self.blocks.get_mut(&g).expect("inserted above"))
    }

    fn mark_blocks(
        &mut self,
        ov: &Overlay<'_>,
        start: u64,
        len: u64,
        used: bool,
    ) -> Result<(), RecoverError> {
        let end = start.saturating_add(len);
        let (first, count) = (self.layout.first_data_block, self.layout.blocks_count);
        if start < first || end > count {
            return Err(RecoverError::Corrupt {
                what: "fast-commit replay",
                detail: format!("blocks {start}..{end} lie outside the filesystem"),
            });
        }
        let mut s = start;
        while s < end {
            let g = self.layout.group_of(s);
            let gs = self.layout.group_start(g);
            let n = u64::from(self.layout.blocks_in_group(g));
            let e = end.min(gs + n);
            let bm = self.block_bitmap(ov, g)?;
            mark_bits(bm, gs, n, s, e - s, used);
            s = e;
        }
        Ok(())
    }

    fn mark_inode(&mut self, ov: &Overlay<'_>, ino: u32, used: bool) -> Result<(), RecoverError> {
        let ipg = self.layout.inodes_per_group;
        let g = (ino - 1) / ipg;
        if !self.inodes.contains_key(&g) {
            let (_, _, d) = self.desc(ov, g)?;
            let bm = if self.layout.group_csum && d.flags() & BG_INODE_UNINIT != 0 {
                // An uninitialized inode bitmap reads as all free.
                let mut v = vec![0xFFu8; self.layout.block_size as usize];
                v[..self.layout.inode_bitmap_bytes()].fill(0);
                v
            } else {
                ov.block(d.inode_bitmap()).map_err(fs_err)?
            };
            self.inodes.insert(g, bm);
        }
        let bm = self.inodes.get_mut(&g).expect("inserted above");
        let first = u64::from(g) * u64::from(ipg) + 1;
        mark_bits(bm, first, u64::from(ipg), u64::from(ino), 1, used);
        Ok(())
    }

    /// Write the bitmaps and the descriptors with their counts as the
    /// bitmaps say (`ext4_fc_set_bitmaps_and_counters`; the directory
    /// count from the group's in-use inodes).
    fn write(self, ov: &Overlay<'_>, geo: &Geometry) -> Result<(), RecoverError> {
        let l = &self.layout;
        let mut groups: Vec<u32> = self
            .blocks
            .keys()
            .chain(self.inodes.keys())
            .copied()
            .collect();
        groups.sort_unstable();
        groups.dedup();
        for g in groups {
            let (dblk, off, mut d) = self.desc(ov, g)?;
            if let Some(bm) = self.blocks.get(&g) {
                let n = u64::from(l.blocks_in_group(g));
                d.set_free_blocks(free_bits(bm, n) as u32);
                if l.csum.metadata {
                    d.set_block_bitmap_csum(l.bitmap_csum(&bm[..l.block_bitmap_bytes()]));
                }
                ov.write(d.block_bitmap(), bm).map_err(fs_err)?;
            }
            if let Some(bm) = self.inodes.get(&g) {
                let ipg = l.inodes_per_group;
                d.set_free_inodes(free_bits(bm, u64::from(ipg)) as u32);
                // The last inode in use decides the unused tail.
                let last = (0..ipg)
                    .rev()
                    .find(|&i| bm[i as usize / 8] & (1 << (i % 8)) != 0);
                let mut dirs = 0;
                for i in 0..=last.unwrap_or(0) {
                    if last.is_none() || bm[i as usize / 8] & (1 << (i % 8)) == 0 {
                        continue;
                    }
                    let slot = raw_slot(ov, geo, g * ipg + i + 1)?;
                    if le16(&slot, I_MODE) & S_IFMT == S_IFDIR {
                        dirs += 1;
                    }
                }
                d.set_used_dirs(dirs);
                if l.group_csum {
                    let unused = ipg - last.map_or(0, |i| i + 1);
                    d.set_itable_unused(unused.min(d.itable_unused()));
                    d.set_flags(d.flags() & !BG_INODE_UNINIT);
                }
                if l.csum.metadata {
                    d.set_inode_bitmap_csum(l.bitmap_csum(&bm[..l.inode_bitmap_bytes()]));
                }
                ov.write(d.inode_bitmap(), bm).map_err(fs_err)?;
            }
            if l.group_csum {
                d.update_checksum(&l.csum, g, l.desc_size);
            }
            let mut b = ov.block(dblk).map_err(fs_err)?;
            b[off..off + l.desc_size].copy_from_slice(d.on_disk(l.desc_size));
            ov.write(dblk, &b).map_err(fs_err)?;
        }
        Ok(())
    }
}

/// The slot of inode `ino` as it is in the overlay (no checksum check:
/// a slot the replay is about to overwrite may be anything).
fn raw_slot(ov: &Overlay<'_>, geo: &Geometry, ino: u32) -> Result<Vec<u8>, RecoverError> {
    let (blk, off) = locate_inode(ov, geo, ino).map_err(fs_err)?;
    let b = ov.block(blk).map_err(fs_err)?;
    Ok(b[off..off + geo.inode_size as usize].to_vec())
}

fn put_slot(
    ov: &Overlay<'_>,
    geo: &Geometry,
    ino: u32,
    slot: &mut [u8],
) -> Result<(), RecoverError> {
    ext4kit_format::inode::set_checksum(slot, ino, &geo.csum);
    let (blk, off) = locate_inode(ov, geo, ino).map_err(fs_err)?;
    let mut b = ov.block(blk).map_err(fs_err)?;
    b[off..off + slot.len()].copy_from_slice(slot);
    ov.write(blk, &b).map_err(fs_err)
}

/// Does the kernel's `ext4_iget` find inode `slot` (a live inode)?
fn live(slot: &[u8]) -> bool {
    le16(slot, I_LINKS) != 0 && le16(slot, I_MODE) != 0
}

fn size_of(slot: &[u8]) -> u64 {
    u64::from(le32(slot, I_SIZE_LO)) | (u64::from(le32(slot, I_SIZE_HI)) << 32)
}

/// The inode kinds the replay covers: a regular file mapped by extents.
fn check_kind(ino: u32, slot: &[u8]) -> Result<(), RecoverError> {
    let mode = le16(slot, I_MODE);
    let flags = le32(slot, I_FLAGS);
    if mode & S_IFMT != S_IFREG {
        let kind = match mode & S_IFMT {
            S_IFDIR => "a directory",
            S_IFLNK => "a symlink",
            _ => "a special file",
        };
        return Err(refuse(format!("inode {ino} is {kind}")));
    }
    if flags & EXT4_INLINE_DATA_FL != 0 {
        return Err(refuse(format!("inode {ino} has inline data")));
    }
    if flags & EXT4_EXTENTS_FL == 0 {
        return Err(refuse(format!(
            "inode {ino} is mapped by blocks, not extents"
        )));
    }
    if flags & EXT4_HUGE_FILE_FL != 0 {
        return Err(refuse(format!("inode {ino} is a huge_file inode")));
    }
    Ok(())
}

struct Replay<'o, 'a> {
    ov: &'o Overlay<'a>,
    geo: Geometry,
    info: FsInfo,
    bm: Bitmaps,
    /// Blocks no ADD_RANGE of the log names, free after the full replay:
    /// where new tree nodes and directory blocks go.
    spare: Vec<u64>,
    /// Inodes an INODE, ADD_RANGE, DEL_RANGE or CREAT touched (the
    /// kernel's `fc_modified_inodes`).
    modified: std::collections::BTreeSet<u32>,
}

impl Replay<'_, '_> {
    fn params(&self, ino: u32, slot: &[u8]) -> TreeParams {
        let bs = u64::from(self.geo.block_size);
        TreeParams {
            ino,
            generation: le32(slot, I_GENERATION),
            csum: self.geo.csum,
            block_size: self.geo.block_size,
            first_data_block: self.geo.first_data_block,
            blocks_count: self.geo.blocks,
            eof_block: size_of(slot).div_ceil(bs),
        }
    }

    fn root(slot: &[u8]) -> [u8; 60] {
        let mut r = [0u8; 60];
        r.copy_from_slice(&slot[I_BLOCK..I_BLOCK + 60]);
        r
    }

    /// The data mappings and the tree node blocks of an extent inode.
    fn tree_of(&self, ino: u32, slot: &[u8]) -> Result<(Vec<Mapping>, Vec<u64>), RecoverError> {
        let fs = Fs {
            blocks: self.ov,
            info: &self.info,
        };
        // The slot may be mid-edit: checksum a copy for the reader.
        let mut raw = slot.to_vec();
        ext4kit_format::inode::set_checksum(&mut raw, ino, &self.geo.csum);
        let inode = fs.decode_inode(ino, raw).map_err(fs_err)?;
        let (maps, nodes) = fs.extent_tree(&inode).map_err(fs_err)?;
        Ok((
            maps,
            nodes.iter().map(|n| n.pblk).filter(|&p| p != 0).collect(),
        ))
    }

    /// Edit inode `ino`'s extent tree with `f`, then apply what it did to
    /// the bitmaps and store the new root.
    fn edit_tree(
        &mut self,
        ino: u32,
        f: impl FnOnce(&mut ExtentTree<'_>) -> Result<RangeEffect, FsError>,
    ) -> Result<(), RecoverError> {
        let mut slot = raw_slot(self.ov, &self.geo, ino)?;
        if !live(&slot) {
            // ext4_iget fails: the kernel skips the record.
            return Ok(());
        }
        check_kind(ino, &slot)?;
        self.modified.insert(ino);
        let p = self.params(ino, &slot);
        let mut io = OverlayTree::new(self.ov, std::mem::take(&mut self.spare));
        let (eff, root) = {
            let mut t = ExtentTree::new(&mut io, p, &Self::root(&slot)).map_err(fs_err)?;
            let eff = f(&mut t).map_err(|e| match e {
                FsError::NoSpace { .. } => {
                    refuse("its extent trees need more new blocks than are free")
                }
                e => fs_err(e),
            })?;
            (eff, *t.root())
        };
        for &(s, n) in &eff.freed {
            self.bm.mark_blocks(self.ov, s, n, false)?;
        }
        for &(s, n) in &eff.used {
            self.bm.mark_blocks(self.ov, s, n, true)?;
        }
        for &b in &io.freed {
            self.bm.mark_blocks(self.ov, b, 1, false)?;
        }
        for &b in &io.allocated {
            self.bm.mark_blocks(self.ov, b, 1, true)?;
        }
        self.spare = io.spare;
        slot[I_BLOCK..I_BLOCK + 60].copy_from_slice(&root);
        put_slot(self.ov, &self.geo, ino, &mut slot)
    }

    /// `i_blocks` from the mapping (data, tree nodes, the xattr block),
    /// as `ext4_ext_replay_set_iblocks` / `ext2fs_count_blocks`.
    fn set_iblocks(
        &self,
        ino: u32,
        slot: &mut [u8],
    ) -> Result<(Vec<Mapping>, Vec<u64>), RecoverError> {
        let (maps, nodes) = self.tree_of(ino, slot)?;
        let acl =
            u64::from(le32(slot, I_FILE_ACL_LO)) | (u64::from(le16(slot, I_FILE_ACL_HI)) << 32);
        let blocks: u64 = maps.iter().map(|m| u64::from(m.len)).sum::<u64>()
            + nodes.len() as u64
            + u64::from(acl != 0);
        let v = blocks * u64::from(self.geo.block_size / 512);
        put32(slot, I_BLOCKS_LO, v as u32);
        put16(slot, I_BLOCKS_HI, (v >> 32) as u16);
        Ok((maps, nodes))
    }

    /// INODE (`ext4_fc_replay_inode`).
    fn inode(&mut self, ino: u32, raw: &[u8]) -> Result<(), RecoverError> {
        self.modified.insert(ino);
        let mut slot = raw_slot(self.ov, &self.geo, ino)?;
        // The old inode's blocks are free first (ext4_ext_clear_bb).
        if live(&slot) && le32(&slot, I_FLAGS) & EXT4_EXTENTS_FL != 0 {
            let (maps, nodes) = self.tree_of(ino, &slot)?;
            for m in maps {
                self.bm
                    .mark_blocks(self.ov, m.pblk, u64::from(m.len), false)?;
            }
            for b in nodes {
                self.bm.mark_blocks(self.ov, b, 1, false)?;
            }
        }
        let mut len = 128;
        if self.geo.inode_size > 128 {
            let extra = usize::from(le16(raw, 128.min(raw.len().saturating_sub(2))));
            len += extra;
            if raw.len() < 130 || extra < 4 || len > self.geo.inode_size as usize {
                return Err(RecoverError::Corrupt {
                    what: "fast-commit inode",
                    detail: format!("inode {ino}: i_extra_isize {extra} does not fit"),
                });
            }
        }
        if raw.len() < len || !replay_inode_bytes(&mut slot, &raw[..len]) {
            return Err(RecoverError::Corrupt {
                what: "fast-commit inode",
                detail: format!("inode {ino}: {} bytes", raw.len()),
            });
        }
        if live(&slot) {
            check_kind(ino, &slot)?;
            self.set_iblocks(ino, &mut slot)?;
        }
        put_slot(self.ov, &self.geo, ino, &mut slot)?;
        self.bm.mark_inode(self.ov, ino, live(&slot))
    }

    /// The directory `parent` as DirBlocks on the overlay.
    fn dir(&mut self, parent: u32) -> Result<OverlayDir<'_, '_>, RecoverError> {
        let slot = raw_slot(self.ov, &self.geo, parent)?;
        let flags = le32(&slot, I_FLAGS);
        if !live(&slot) || le16(&slot, I_MODE) & S_IFMT != S_IFDIR {
            return Err(refuse(format!(
                "the parent {parent} of a name is not a directory"
            )));
        }
        if flags & EXT4_INLINE_DATA_FL != 0 || flags & EXT4_EXTENTS_FL == 0 {
            return Err(refuse(format!(
                "directory {parent} is not mapped by extents"
            )));
        }
        let fs = Fs {
            blocks: self.ov,
            info: &self.info,
        };
        let inode = fs.decode_inode(parent, slot.clone()).map_err(fs_err)?;
        let params = DirParams::new(&self.info, &inode);
        let maps = fs.extents(&inode).map_err(fs_err)?;
        Ok(OverlayDir {
            ov: self.ov,
            geo: &self.geo,
            bm: &mut self.bm,
            spare: &mut self.spare,
            ino: parent,
            slot,
            params,
            maps,
        })
    }

    /// CREAT and LINK (`ext4_fc_replay_create`, `_link`): the name is
    /// added unless it exists (-EEXIST is ignored), the link count grows
    /// by one, a CREAT makes it 1.
    fn link(
        &mut self,
        creat: bool,
        parent: u32,
        ino: u32,
        name: &[u8],
    ) -> Result<(), RecoverError> {
        let mut slot = raw_slot(self.ov, &self.geo, ino)?;
        if creat {
            self.modified.insert(ino);
            self.bm.mark_inode(self.ov, ino, true)?;
        } else if !live(&slot) {
            return Ok(());
        }
        if le16(&slot, I_MODE) == 0 {
            return Ok(());
        }
        check_kind(ino, &slot)?;
        let added = {
            let mut d = self.dir(parent)?;
            let mut w = DirWriter::new(&mut d);
            if w.find(name).map_err(fs_err)?.is_some() {
                false
            } else {
                w.add(name, ino, FT_REG_FILE).map_err(fs_err)?;
                true
            }
        };
        // The directory's blocks and inode may have changed: read again.
        slot = raw_slot(self.ov, &self.geo, ino)?;
        let links = if creat {
            1
        } else {
            le16(&slot, I_LINKS).saturating_add(u16::from(added))
        };
        put16(&mut slot, I_LINKS, links);
        put_slot(self.ov, &self.geo, ino, &mut slot)
    }

    /// UNLINK (`ext4_fc_replay_unlink`): the name goes if it names `ino`
    /// (-ENOENT is ignored), the link count drops by one.
    fn unlink(&mut self, parent: u32, ino: u32, name: &[u8]) -> Result<(), RecoverError> {
        let slot = raw_slot(self.ov, &self.geo, ino)?;
        if !live(&slot) {
            return Ok(());
        }
        let removed = {
            let mut d = self.dir(parent)?;
            let mut w = DirWriter::new(&mut d);
            match w.find(name).map_err(fs_err)? {
                Some(s) if s.ino == ino => {
                    w.remove(name).map_err(fs_err)?;
                    true
                }
                _ => false,
            }
        };
        if removed {
            let mut slot = raw_slot(self.ov, &self.geo, ino)?;
            let links = le16(&slot, I_LINKS).saturating_sub(1);
            put16(&mut slot, I_LINKS, links);
            put_slot(self.ov, &self.geo, ino, &mut slot)?;
        }
        Ok(())
    }

    /// `ext4_fc_set_bitmaps_and_counters`: every block of every live
    /// replayed inode (data and tree nodes) in use, its inode bit set,
    /// `i_blocks` recounted; a replayed inode without links is free
    /// (bit and blocks), as e2fsck's replay leaves it.
    fn finish(mut self) -> Result<(), RecoverError> {
        for ino in std::mem::take(&mut self.modified) {
            let mut slot = raw_slot(self.ov, &self.geo, ino)?;
            let is_live = live(&slot);
            if le32(&slot, I_FLAGS) & EXT4_EXTENTS_FL != 0 && le16(&slot, I_MODE) != 0 {
                let (maps, nodes) = if is_live {
                    let before = slot.clone();
                    let r = self.set_iblocks(ino, &mut slot)?;
                    if slot != before {
                        put_slot(self.ov, &self.geo, ino, &mut slot)?;
                    }
                    r
                } else {
                    self.tree_of(ino, &slot)?
                };
                for m in maps {
                    self.bm
                        .mark_blocks(self.ov, m.pblk, u64::from(m.len), is_live)?;
                }
                for b in nodes {
                    self.bm.mark_blocks(self.ov, b, 1, is_live)?;
                }
            }
            self.bm.mark_inode(self.ov, ino, is_live)?;
        }
        self.bm.write(self.ov, &self.geo)?;
        // The superblock's free counts follow the descriptors.
        let bs = u64::from(self.geo.block_size);
        let sb_blk = SUPERBLOCK_OFFSET / bs;
        let off = (SUPERBLOCK_OFFSET % bs) as usize;
        let mut b = self.ov.block(sb_blk).map_err(fs_err)?;
        let mut sb = Superblock::parse(&b[off..off + SUPERBLOCK_SIZE]).ok_or_else(|| {
            RecoverError::Corrupt {
                what: "superblock",
                detail: "short block".into(),
            }
        })?;
        let (free_blocks, free_inodes) = summary_counts(self.ov, &sb).map_err(fs_err)?;
        sb.set_free_blocks_count(free_blocks);
        sb.s_free_inodes_count.set(free_inodes);
        if self.geo.csum.metadata {
            sb.update_checksum();
        }
        b[off..off + SUPERBLOCK_SIZE].copy_from_slice(sb.as_bytes());
        self.ov.write(sb_blk, &b).map_err(fs_err)
    }
}

/// A directory's blocks on the overlay for [`DirWriter`]; a new block
/// comes from the spare blocks.
struct OverlayDir<'x, 'a> {
    ov: &'x Overlay<'a>,
    geo: &'x Geometry,
    bm: &'x mut Bitmaps,
    spare: &'x mut Vec<u64>,
    ino: u32,
    slot: Vec<u8>,
    params: DirParams,
    maps: Vec<Mapping>,
}

impl OverlayDir<'_, '_> {
    fn pblk(&self, lblk: u32) -> Result<u64, FsError> {
        let l = u64::from(lblk);
        self.maps
            .iter()
            .find(|m| m.lblk <= l && l < m.end() && !m.unwritten)
            .map(|m| m.pblk + (l - m.lblk))
            .ok_or_else(|| {
                FsError::corrupt(
                    "directory",
                    format!("directory {}: block {lblk} is a hole", self.ino),
                )
            })
    }

    fn store(&mut self) -> Result<(), FsError> {
        put_slot(self.ov, self.geo, self.ino, &mut self.slot).map_err(FsError::Recover)
    }
}

impl DirBlocks for OverlayDir<'_, '_> {
    fn params(&self) -> DirParams {
        self.params
    }

    fn block_size(&self) -> u32 {
        self.geo.block_size
    }

    fn nblocks(&self) -> u32 {
        (size_of(&self.slot) / u64::from(self.geo.block_size)) as u32
    }

    fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
        self.ov.block(self.pblk(lblk)?)
    }

    fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
        let p = self.pblk(lblk)?;
        self.ov.write(p, data)
    }

    fn append(&mut self) -> Result<u32, FsError> {
        let lblk = self.nblocks();
        let bs = self.geo.block_size;
        let pblk = self.spare.pop().ok_or(FsError::NoSpace {
            wanted: 1,
            available: 0,
        })?;
        let m = Mapping {
            lblk: u64::from(lblk),
            pblk,
            len: 1,
            unwritten: false,
        };
        let p = TreeParams {
            ino: self.ino,
            generation: le32(&self.slot, I_GENERATION),
            csum: self.geo.csum,
            block_size: bs,
            first_data_block: self.geo.first_data_block,
            blocks_count: self.geo.blocks,
            eof_block: u64::from(lblk) + 1,
        };
        let mut io = OverlayTree::new(self.ov, std::mem::take(self.spare));
        let (root, delta) = {
            let mut t = ExtentTree::new(&mut io, p, &Replay::root(&self.slot))?;
            t.insert(&m)?;
            (*t.root(), t.blocks_delta)
        };
        *self.spare = io.spare;
        let rec = |e: RecoverError| FsError::Recover(e);
        self.bm.mark_blocks(self.ov, pblk, 1, true).map_err(rec)?;
        for &b in &io.allocated {
            self.bm.mark_blocks(self.ov, b, 1, true).map_err(rec)?;
        }
        for &b in &io.freed {
            self.bm.mark_blocks(self.ov, b, 1, false).map_err(rec)?;
        }
        self.ov.write(pblk, &vec![0u8; bs as usize])?;
        self.slot[I_BLOCK..I_BLOCK + 60].copy_from_slice(&root);
        let size = size_of(&self.slot) + u64::from(bs);
        put32(&mut self.slot, I_SIZE_LO, size as u32);
        put32(&mut self.slot, I_SIZE_HI, (size >> 32) as u32);
        let per = i64::from(bs / 512);
        let old = i64::from(le32(&self.slot, I_BLOCKS_LO));
        put32(
            &mut self.slot,
            I_BLOCKS_LO,
            (old + per * (1 + delta)).max(0) as u32,
        );
        self.maps.push(m);
        self.store()?;
        Ok(lblk)
    }

    fn indexed(&self) -> bool {
        le32(&self.slot, I_FLAGS) & EXT4_INDEX_FL != 0
    }

    fn set_indexed(&mut self) -> Result<(), FsError> {
        let f = le32(&self.slot, I_FLAGS) | EXT4_INDEX_FL;
        put32(&mut self.slot, I_FLAGS, f);
        self.store()
    }
}

/// Replay the fast commits `tags` (from [`super::fast_commit::records`]
/// of `rec.fast_commit`) over the full commits' replay `rec.writes`:
/// returns the home blocks that change (block -> final bytes), for
/// [`super::fast_commit::commit_as_full`]. Nothing is written to `dev`.
/// What the replay does not cover (a directory, symlink or special inode,
/// inline data, block maps, bigalloc, quota, a group whose block bitmap
/// was never initialized) is [`RecoverError::Unsupported`] with one line.
pub fn replay(
    dev: &dyn Device,
    j: &Journal,
    rec: &Recovery,
    tags: &[FcTag],
) -> Result<BTreeMap<u64, Vec<u8>>, RecoverError> {
    let ov = Overlay::new(dev, j.block_size, j.fs_blocks, &rec.writes);
    let info = FsInfo::load(&ov).map_err(fs_err)?;
    if info.features.ro_compat.contains(RoCompat::BIGALLOC) {
        return Err(refuse("bigalloc"));
    }
    if info.features.ro_compat.contains(RoCompat::QUOTA)
        || info.features.ro_compat.contains(RoCompat::PROJECT)
    {
        return Err(refuse("quota (the replay does not recount usage)"));
    }
    // Every inode a record names is an ordinary one (a parent may be the
    // root), inside the filesystem.
    for t in tags {
        let (ino, parent) = match t {
            FcTag::Inode { ino, .. }
            | FcTag::AddRange { ino, .. }
            | FcTag::DelRange { ino, .. } => (*ino, None),
            FcTag::Dentry { ino, parent, .. } => (*ino, Some(*parent)),
            _ => continue,
        };
        let ok = |i: u32, root_ok: bool| {
            i <= info.inodes_count
                && (i >= info.first_ino || (root_ok && i == ext4kit_format::inode::ROOT_INO))
        };
        if !ok(ino, false) || parent.is_some_and(|p| !ok(p, true)) {
            return Err(refuse(format!(
                "a record names inode {} (the ordinary inodes are {}..={})",
                if ok(ino, false) {
                    parent.unwrap_or(ino)
                } else {
                    ino
                },
                info.first_ino,
                info.inodes_count
            )));
        }
    }
    let geo = Geometry::of(&info.sb, info.block_size, info.blocks_count).map_err(fs_err)?;
    let layout = Layout::from_superblock(&info.sb).map_err(fs_err)?;
    // Blocks an ADD_RANGE names are the log's: no new node may take one
    // (ext4_fc_replay_check_excluded).
    let mut excluded: Vec<(u64, u64)> = tags
        .iter()
        .filter_map(|t| match t {
            FcTag::AddRange { pblk, len, .. } => Some((*pblk, *pblk + u64::from(*len))),
            _ => None,
        })
        .collect();
    excluded.sort_unstable();
    let bm = Bitmaps {
        layout: layout.clone(),
        blocks: BTreeMap::new(),
        inodes: BTreeMap::new(),
    };
    let mut spare = Vec::new();
    const SPARE: usize = 64;
    for g in 0..layout.group_count {
        if spare.len() >= SPARE {
            break;
        }
        let (_, _, d) = bm.desc(&ov, g)?;
        if layout.group_csum && d.flags() & BG_BLOCK_UNINIT != 0 {
            continue;
        }
        let img = ov.block(d.block_bitmap()).map_err(fs_err)?;
        let gs = layout.group_start(g);
        for i in 0..u64::from(layout.blocks_in_group(g)) {
            if spare.len() >= SPARE {
                break;
            }
            let b = gs + i;
            if img[(i / 8) as usize] & (1 << (i % 8)) == 0
                && !excluded.iter().any(|&(s, e)| s <= b && b < e)
            {
                spare.push(b);
            }
        }
    }
    spare.sort_unstable_by(|a, b| b.cmp(a));
    let mut r = Replay {
        ov: &ov,
        geo,
        info,
        bm,
        spare,
        modified: std::collections::BTreeSet::new(),
    };
    for t in tags {
        match t {
            FcTag::Head { .. } | FcTag::Pad | FcTag::Tail { .. } => {}
            FcTag::Inode { ino, raw } => r.inode(*ino, raw)?,
            FcTag::AddRange {
                ino,
                lblk,
                len,
                unwritten,
                pblk,
            } => {
                let m = Mapping {
                    lblk: u64::from(*lblk),
                    pblk: *pblk,
                    len: u32::from(*len),
                    unwritten: *unwritten,
                };
                if m.len == 0 {
                    continue;
                }
                r.edit_tree(*ino, |t| add_range(t, &m))?
            }
            FcTag::DelRange { ino, lblk, len } => {
                let (a, n) = (u64::from(*lblk), u64::from(*len));
                r.edit_tree(*ino, |t| del_range(t, a, n))?
            }
            FcTag::Dentry {
                tag,
                parent,
                ino,
                name,
            } => match *tag {
                EXT4_FC_TAG_CREAT => r.link(true, *parent, *ino, name)?,
                EXT4_FC_TAG_LINK => r.link(false, *parent, *ino, name)?,
                _ => r.unlink(*parent, *ino, name)?,
            },
        }
    }
    r.finish()?;
    ov.changes().map_err(fs_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent_write::LBLK_END;
    use ext4kit_device::MemDevice;
    use ext4kit_format::Csum;
    use ext4kit_format::extent::{ENTRIES_IN_INODE, ExtentHeader};

    const BS: u32 = 1024;

    fn params() -> TreeParams {
        TreeParams {
            ino: 12,
            generation: 3,
            csum: Csum {
                metadata: true,
                gdt: false,
                seed: 0x5eed,
                uuid: [0; 16],
            },
            block_size: BS,
            first_data_block: 1,
            blocks_count: 4096,
            eof_block: LBLK_END,
        }
    }

    fn empty_root() -> [u8; 60] {
        let mut r = [0u8; 60];
        r[..12].copy_from_slice(ExtentHeader::new(0, ENTRIES_IN_INODE, 0).as_bytes());
        r
    }

    fn m(lblk: u64, pblk: u64, len: u32, unwritten: bool) -> Mapping {
        Mapping {
            lblk,
            pblk,
            len,
            unwritten,
        }
    }

    #[test]
    fn overlay_reads_the_full_replay_under_its_own_writes() {
        let dev = MemDevice::new(64 * u64::from(BS));
        dev.write_at(&[1u8; BS as usize], 5 * u64::from(BS))
            .unwrap();
        dev.write_at(&[2u8; BS as usize], 6 * u64::from(BS))
            .unwrap();
        let mut full = BTreeMap::new();
        full.insert(6u64, vec![3u8; BS as usize]);
        let before = dev.to_bytes();
        let ov = Overlay::new(&dev, BS, 64, &full);
        assert_eq!(ov.block(5).unwrap(), vec![1u8; BS as usize]);
        assert_eq!(
            ov.block(6).unwrap(),
            vec![3u8; BS as usize],
            "the full replay's"
        );
        ov.write(5, &[9u8; BS as usize]).unwrap();
        ov.write(6, &[3u8; BS as usize]).unwrap(); // what is there already
        ov.write(7, &[4u8; BS as usize]).unwrap();
        assert_eq!(ov.block(5).unwrap(), vec![9u8; BS as usize]);
        let ch = ov.changes().unwrap();
        assert_eq!(ch.keys().copied().collect::<Vec<_>>(), vec![5, 7]);
        assert!(dev.to_bytes() == before, "nothing written in place");
        assert!(ov.block(64).is_err(), "past the end");
        assert!(ov.write(3, &[0u8; 10]).is_err(), "a short write");
    }

    #[test]
    fn add_range_inserts_remaps_and_converts_as_the_kernel() {
        let dev = MemDevice::new(4096 * u64::from(BS));
        let full = BTreeMap::new();
        let ov = Overlay::new(&dev, BS, 4096, &full);
        let mut io = OverlayTree::new(&ov, (3000..3100).collect());
        let mut t = ExtentTree::new(&mut io, params(), &empty_root()).unwrap();
        // Unmapped: inserted, in use.
        let e = add_range(&mut t, &m(0, 100, 8, false)).unwrap();
        assert_eq!(e.used, vec![(100, 8)]);
        assert!(e.freed.is_empty());
        // Blocks 2..4 now point elsewhere: the old ones are freed.
        let e = add_range(&mut t, &m(2, 500, 2, false)).unwrap();
        assert_eq!(e.freed, vec![(102, 2)]);
        assert_eq!(
            t.all().unwrap(),
            vec![
                m(0, 100, 2, false),
                m(2, 500, 2, false),
                m(4, 104, 4, false)
            ]
        );
        // Same blocks, another state: nothing freed, the state flips.
        let e = add_range(&mut t, &m(4, 104, 4, true)).unwrap();
        assert!(e.freed.is_empty());
        assert_eq!(t.all().unwrap()[2], m(4, 104, 4, true));
        // A range over a hole and a remap at once.
        let e = add_range(&mut t, &m(6, 900, 6, false)).unwrap();
        assert_eq!(e.freed, vec![(106, 2)]);
        assert_eq!(t.all().unwrap().last(), Some(&m(6, 900, 6, false)));
        // DEL_RANGE: unmapped and freed, splitting an extent.
        let e = del_range(&mut t, 1, 2).unwrap();
        assert_eq!(e.freed, vec![(101, 1), (500, 1)]);
        assert_eq!(
            t.all().unwrap()[..2],
            [m(0, 100, 1, false), m(3, 501, 1, false)]
        );
        // Deleting a hole frees nothing.
        assert!(del_range(&mut t, 100, 10).unwrap().freed.is_empty());
    }

    #[test]
    fn a_deep_replay_takes_its_tree_nodes_from_the_spare_blocks() {
        let dev = MemDevice::new(4096 * u64::from(BS));
        let full = BTreeMap::new();
        let ov = Overlay::new(&dev, BS, 4096, &full);
        let mut io = OverlayTree::new(&ov, vec![3001, 3000]);
        let root = {
            let mut t = ExtentTree::new(&mut io, params(), &empty_root()).unwrap();
            // Five unmergeable extents do not fit in the inode.
            for i in 0..5u64 {
                add_range(&mut t, &m(i * 2, 100 + i * 10, 1, false)).unwrap();
            }
            assert_eq!(t.depth(), 1);
            *t.root()
        };
        assert_eq!(io.allocated, vec![3000], "the lowest spare block");
        assert!(ov.changes().unwrap().contains_key(&3000));
        // With no spare block left, a split is refused, not improvised.
        let mut io = OverlayTree::new(&ov, Vec::new());
        let mut t = ExtentTree::new(&mut io, params(), &root).unwrap();
        let mut err = None;
        for i in 5..200u64 {
            if let Err(e) = add_range(&mut t, &m(i * 2, 100 + i * 10, 1, false)) {
                err = Some(e);
                break;
            }
        }
        assert!(matches!(err, Some(FsError::NoSpace { .. })), "{err:?}");
    }

    #[test]
    fn bitmap_bits_are_flipped_and_counted_inside_the_group() {
        let mut bm = vec![0u8; 16]; // 128 bits, the group has 100
        assert_eq!(mark_bits(&mut bm, 1000, 100, 990, 20, true), 10);
        assert_eq!(bm[0], 0xFF);
        assert_eq!(bm[1], 0x03);
        assert_eq!(
            mark_bits(&mut bm, 1000, 100, 1005, 10, true),
            5,
            "5 were set"
        );
        assert_eq!(free_bits(&bm, 100), 100 - 15);
        assert_eq!(mark_bits(&mut bm, 1000, 100, 1095, 50, true), 5, "clipped");
        assert_eq!(free_bits(&bm, 100), 80);
        assert_eq!(mark_bits(&mut bm, 1000, 100, 1000, 3, false), 3);
        assert_eq!(free_bits(&bm, 100), 83);
        assert_eq!(
            mark_bits(&mut bm, 1000, 100, 0, 10, true),
            0,
            "another group"
        );
    }
}
