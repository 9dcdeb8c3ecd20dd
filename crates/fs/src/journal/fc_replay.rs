//! Pieces of the fast-commit replay (issue 20), built behind the refusal
//! in [`super::apply`]: nothing here is called by a recovery yet (see
//! "Toward fast-commit replay" in docs/ARCHITECTURE.md for the plan and
//! what is missing).
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

use crate::extent::Mapping;
use crate::extent_write::{ExtentTree, TreeIo};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extent_write::{LBLK_END, TreeParams};
    use ext4kit_device::MemDevice;
    use ext4kit_format::Csum;
    use ext4kit_format::extent::{ENTRIES_IN_INODE, ExtentHeader};
    use zerocopy::IntoBytes;

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
