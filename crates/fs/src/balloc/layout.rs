//! Free space of a group computed from the layout alone, the way the
//! kernel's `ext4_init_block_bitmap` (and libext2fs) build the bitmap of a
//! `BLOCK_UNINIT` group: everything is free except the superblock/GDT/
//! reserved-GDT blocks at the group's start and the bitmaps and inode
//! table that lie inside the group.

use ext4kit_format::group_desc::GroupDesc;

use super::extents::ExtentSet;
use crate::groups::Layout;

/// Remove every part of `[s, s+n)` that is in `set`.
fn subtract(set: &mut ExtentSet, s: u32, n: u32) {
    for (a, m) in set.intersect(s, n) {
        set.remove(a, m);
    }
}

/// Append `[s, e)` to `v`, merging it into the last range when they
/// touch or overlap.
fn push_merge(v: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    match v.last_mut() {
        Some(last) if s >= last.0 && s <= last.1 => last.1 = last.1.max(e),
        _ => v.push((s, e)),
    }
}

/// Sort and merge `v` in place.
fn sort_merge(v: &mut Vec<(u64, u64)>) {
    // Each source is sorted on usual layouts: a stable sort merges natural
    // runs in linear time.
    v.sort();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for &(s, e) in v.iter() {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    *v = out;
}

/// Builds [`metadata_runs`] from descriptors seen one at a time (the
/// table is streamed at open, never held): block bitmaps, inode bitmaps
/// and inode tables each merge into their own list as they come (with
/// flex_bg, one range per flex group each), folded into the result
/// whenever the lists grow.
#[derive(Debug, Default)]
pub struct RunsBuilder {
    lists: [Vec<(u64, u64)>; 3],
    acc: Vec<(u64, u64)>,
}

/// Pending ranges folded into the result at a time.
const FOLD: usize = 3 * 4096;

impl RunsBuilder {
    pub fn add(&mut self, layout: &Layout, d: &GroupDesc) {
        let itb = u64::from(layout.itable_blocks);
        let [bb, ib, it] = &mut self.lists;
        push_merge(bb, d.block_bitmap(), d.block_bitmap().saturating_add(1));
        push_merge(ib, d.inode_bitmap(), d.inode_bitmap().saturating_add(1));
        push_merge(it, d.inode_table(), d.inode_table().saturating_add(itb));
        if bb.len() + ib.len() + it.len() >= FOLD {
            self.fold();
        }
    }

    fn fold(&mut self) {
        for l in &mut self.lists {
            self.acc.append(l);
        }
        sort_merge(&mut self.acc);
    }

    /// The runs, sorted and merged.
    pub fn finish(mut self) -> Vec<(u64, u64)> {
        self.fold();
        self.acc.shrink_to_fit();
        self.acc
    }
}

/// Ranges of absolute blocks `[start, end)` used by any group's bitmaps
/// and inode table, sorted and merged.
pub fn metadata_runs(layout: &Layout, descs: &[GroupDesc]) -> Vec<(u64, u64)> {
    let mut b = RunsBuilder::default();
    for d in descs {
        b.add(layout, d);
    }
    b.finish()
}

/// `(free blocks, longest free range)` of group `g` by the rule of
/// [`layout_free`], without building the set (no allocation: this runs
/// for every group at open).
pub fn layout_stats(
    layout: &Layout,
    g: u32,
    desc: &GroupDesc,
    runs: &[(u64, u64)],
    own_only: bool,
) -> (u32, u32) {
    if layout.cluster_bits > 0 {
        // Bigalloc: whole clusters only; the set is built (few groups on
        // the images bigalloc is used for, and never on the plain path).
        let set = layout_free(layout, g, desc, runs, own_only);
        return (set.total() as u32, set.largest());
    }
    let n = layout.blocks_in_group(g);
    let gs = layout.group_start(g);
    let ge = gs + u64::from(n);
    let mut cursor = layout.base_meta_blocks(g).min(n);
    let (mut free, mut largest) = (0u32, 0u32);
    // Cuts in ascending order of their start: the base metadata starts
    // the group, then the runs (sorted) or the group's own three ranges.
    let mut cut = |s: u64, e: u64| {
        let a = s.max(gs);
        let b = e.min(ge);
        if a >= b {
            return;
        }
        let (a, b) = ((a - gs) as u32, (b - gs) as u32);
        if a > cursor {
            free += a - cursor;
            largest = largest.max(a - cursor);
        }
        cursor = cursor.max(b);
    };
    if own_only {
        let itb = u64::from(layout.itable_blocks);
        let mut own = [
            (desc.block_bitmap(), desc.block_bitmap().saturating_add(1)),
            (desc.inode_bitmap(), desc.inode_bitmap().saturating_add(1)),
            (desc.inode_table(), desc.inode_table().saturating_add(itb)),
        ];
        own.sort_unstable();
        for (s, e) in own {
            cut(s, e);
        }
    } else {
        let i = runs.partition_point(|r| r.1 <= gs);
        for &(s, e) in &runs[i..] {
            if s >= ge {
                break;
            }
            cut(s, e);
        }
    }
    if n > cursor {
        free += n - cursor;
        largest = largest.max(n - cursor);
    }
    (free, largest)
}

/// Free blocks of group `g` if only its static metadata were in use.
/// `own_only`: count only `g`'s own bitmaps/table (the kernel's rule for a
/// `BLOCK_UNINIT` group); otherwise every run of `runs` inside the group.
pub fn layout_free(
    layout: &Layout,
    g: u32,
    desc: &GroupDesc,
    runs: &[(u64, u64)],
    own_only: bool,
) -> ExtentSet {
    let n = layout.blocks_in_group(g);
    let gs = layout.group_start(g);
    let ge = gs + u64::from(n);
    let mut set = ExtentSet::from_sorted([(0, n)]);
    subtract(&mut set, 0, layout.base_meta_blocks(g).min(n));
    let mut cut = |s: u64, e: u64| {
        let a = s.max(gs);
        let b = e.min(ge);
        if a < b {
            subtract(&mut set, (a - gs) as u32, (b - a) as u32);
        }
    };
    if own_only {
        let itb = u64::from(layout.itable_blocks);
        cut(desc.block_bitmap(), desc.block_bitmap() + 1);
        cut(desc.inode_bitmap(), desc.inode_bitmap() + 1);
        cut(desc.inode_table(), desc.inode_table() + itb);
    } else {
        let i = runs.partition_point(|r| r.1 <= gs);
        for &(s, e) in &runs[i..] {
            if s >= ge {
                break;
            }
            cut(s, e);
        }
    }
    if layout.cluster_bits > 0 {
        // Bigalloc: metadata placed block by block takes its whole
        // cluster (a cluster is free only when all its blocks are).
        set = set
            .whole_clusters(layout.cluster_bits)
            .expand_clusters(layout.cluster_bits, n);
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceBlocks;
    use crate::balloc::tests::image;
    use crate::groups::read_descriptors;
    use ext4kit_device::Device;
    use ext4kit_format::Superblock;

    /// The streamed runs and the allocation-free counts agree with the
    /// set-building rule, group by group, with and without flex_bg.
    #[test]
    fn stats_match_the_sets() {
        for extra in [
            &[][..],
            &["^flex_bg"][..],
            &["^metadata_csum", "^uninit_bg"][..],
        ] {
            let dev = image(600 << 20, extra);
            let mut sbuf = vec![0u8; 1024];
            dev.read_at(&mut sbuf, 1024).unwrap();
            let l = Layout::from_superblock(&Superblock::parse(&sbuf).unwrap()).unwrap();
            let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
            let descs = read_descriptors(&l, &rd).unwrap();
            // The builder folds in pieces: same as all at once.
            let mut all: Vec<(u64, u64)> = Vec::new();
            let itb = u64::from(l.itable_blocks);
            for d in &descs {
                all.push((d.block_bitmap(), d.block_bitmap() + 1));
                all.push((d.inode_bitmap(), d.inode_bitmap() + 1));
                all.push((d.inode_table(), d.inode_table() + itb));
            }
            sort_merge(&mut all);
            let runs = metadata_runs(&l, &descs);
            assert_eq!(runs, all, "{extra:?}");
            for (g, d) in descs.iter().enumerate() {
                for own in [false, true] {
                    let s = layout_free(&l, g as u32, d, &runs, own);
                    assert_eq!(
                        layout_stats(&l, g as u32, d, &runs, own),
                        (s.total() as u32, s.largest()),
                        "{extra:?} group {g} own {own}"
                    );
                }
            }
        }
    }
}
