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

/// Ranges of absolute blocks `[start, end)` used by any group's bitmaps
/// and inode table, sorted and merged.
pub fn metadata_runs(layout: &Layout, descs: &[GroupDesc]) -> Vec<(u64, u64)> {
    let itb = u64::from(layout.itable_blocks);
    let mut v: Vec<(u64, u64)> = Vec::with_capacity(descs.len() * 3);
    // Three runs that are each sorted on usual layouts: a stable sort
    // merges natural runs in linear time.
    v.extend(
        descs
            .iter()
            .map(|d| (d.block_bitmap(), d.block_bitmap().saturating_add(1))),
    );
    v.extend(
        descs
            .iter()
            .map(|d| (d.inode_bitmap(), d.inode_bitmap().saturating_add(1))),
    );
    v.extend(
        descs
            .iter()
            .map(|d| (d.inode_table(), d.inode_table().saturating_add(itb))),
    );
    v.sort();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len() / 4 + 1);
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
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
    set
}
