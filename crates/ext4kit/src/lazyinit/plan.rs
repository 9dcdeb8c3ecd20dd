//! Step 1, pure: which blocks of a group's inode table may be zeroed.
//!
//! This mirrors the kernel's `ext4_init_inode_table` exactly: a group that
//! already has `ITABLE_ZEROED` needs nothing; otherwise the used part of the
//! table is `ceil((ipg - bg_itable_unused) / inodes_per_block)` blocks (none
//! with `INODE_UNINIT`), and everything from there to the end of the table
//! is zeroed. The counts are checked first, as the kernel does, and a group
//! whose counts contradict each other is an error, never a guess.

use ext4kit_format::group_desc::{BG_INODE_UNINIT, BG_INODE_ZEROED, GroupDesc};

use crate::image::Geometry;

/// The work lazy init has to do on one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupWork {
    /// The group.
    pub group: u32,
    /// First block of the group's inode table.
    pub itable: u64,
    /// Leading table blocks that hold (or may hold) used inodes: never
    /// touched.
    pub used_blocks: u32,
    /// Blocks to zero, from `itable + used_blocks` to the end of the table.
    /// Zero when the table is full: the flag is then set without zeroing.
    pub zero_blocks: u32,
}

impl GroupWork {
    /// First block to zero.
    pub fn zero_start(&self) -> u64 {
        self.itable.saturating_add(u64::from(self.used_blocks))
    }

    /// `(byte offset, byte length)` of the range to zero.
    pub fn byte_range(&self, geom: &Geometry) -> (u64, u64) {
        let bs = u64::from(geom.block_size);
        (
            self.zero_start().saturating_mul(bs),
            u64::from(self.zero_blocks).saturating_mul(bs),
        )
    }
}

/// Why a group cannot be planned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("group {group}: {detail}")]
pub struct PlanError {
    pub group: u32,
    pub detail: String,
}

/// Plan `group` from its descriptor: `Ok(None)` when it already has
/// `ITABLE_ZEROED`.
pub fn plan_group(
    geom: &Geometry,
    desc: &GroupDesc,
    group: u32,
) -> Result<Option<GroupWork>, PlanError> {
    let flags = desc.flags();
    if flags & BG_INODE_ZEROED != 0 {
        return Ok(None);
    }
    let err = |detail: String| PlanError { group, detail };
    let ipg = geom.inodes_per_group;
    let unused = desc.itable_unused();
    let free = desc.free_inodes();
    if unused > ipg {
        return Err(err(format!(
            "unused inodes count {unused} > inodes per group {ipg}"
        )));
    }
    if free > ipg {
        return Err(err(format!(
            "free inodes count {free} > inodes per group {ipg}"
        )));
    }
    let used_inodes = if flags & BG_INODE_UNINIT != 0 {
        if free != ipg {
            return Err(err(format!(
                "INODE_UNINIT is set but only {free} of {ipg} inodes are free"
            )));
        }
        0
    } else {
        if unused > free {
            return Err(err(format!(
                "unused inodes count {unused} > free inodes count {free}"
            )));
        }
        ipg - unused
    };
    let used_blocks = used_inodes.div_ceil(geom.inodes_per_block);
    if used_blocks > geom.itable_blocks {
        return Err(err(format!(
            "{used_blocks} used inode-table blocks > {} table blocks",
            geom.itable_blocks
        )));
    }
    // The kernel's check (ext4_init_inode_table): unless the table is full,
    // the inodes counted as used must reach s_first_ino, so that no
    // reserved inode can lie in the zeroed area.
    let last_used_ino = u64::from(group) * u64::from(ipg) + u64::from(used_inodes);
    if used_blocks != geom.itable_blocks && last_used_ino < u64::from(geom.first_ino) {
        return Err(err(format!(
            "only {last_used_ino} inodes counted as used up to this group, fewer than the first non-reserved inode {} (unused inodes count {unused} too large)",
            geom.first_ino
        )));
    }
    Ok(Some(GroupWork {
        group,
        itable: desc.inode_table(),
        used_blocks,
        zero_blocks: geom.itable_blocks - used_blocks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom() -> Geometry {
        Geometry {
            block_size: 4096,
            blocks_count: 1 << 20,
            first_data_block: 0,
            blocks_per_group: 32768,
            inodes_per_group: 8192,
            inodes_count: 8192 * 32,
            inode_size: 256,
            inodes_per_block: 16,
            itable_blocks: 512,
            group_count: 32,
            desc_size: 64,
            descs_per_block: 64,
            desc_blocks: 1,
            gdt_start: 1,
            first_ino: 11,
            sb_block: 0,
            reserved_gdt_blocks: 0,
            cluster_ratio: 1,
            first_meta_bg: None,
            desc_locs: vec![1],
        }
    }

    fn desc(flags: u16, free: u32, unused: u32) -> GroupDesc {
        let mut d = GroupDesc::default();
        d.set_inode_table(1000);
        d.set_flags(flags);
        d.set_free_inodes(free);
        d.set_itable_unused(unused);
        d
    }

    #[test]
    fn kernel_arithmetic() {
        let g = geom();
        // Group 0 as mke2fs leaves it: 11 used inodes -> 1 block kept.
        let w = plan_group(&g, &desc(0, 8181, 8181), 0).unwrap().unwrap();
        assert_eq!(
            (w.used_blocks, w.zero_blocks, w.zero_start()),
            (1, 511, 1001)
        );
        assert_eq!(w.byte_range(&g), (1001 * 4096, 511 * 4096));
        // 17 used inodes -> 2 blocks.
        let w = plan_group(&g, &desc(0, 8175, 8175), 3).unwrap().unwrap();
        assert_eq!(w.used_blocks, 2);
        // INODE_UNINIT: whole table, whatever itable_unused says.
        let w = plan_group(&g, &desc(BG_INODE_UNINIT, 8192, 100), 5)
            .unwrap()
            .unwrap();
        assert_eq!((w.used_blocks, w.zero_blocks), (0, 512));
        // Full table: nothing to zero, flag still to be set.
        let w = plan_group(&g, &desc(0, 0, 0), 5).unwrap().unwrap();
        assert_eq!((w.used_blocks, w.zero_blocks), (512, 0));
        // Already zeroed.
        assert_eq!(
            plan_group(&g, &desc(BG_INODE_ZEROED, 0, 8192), 5).unwrap(),
            None
        );
    }

    #[test]
    fn refuses_inconsistent_counts() {
        let g = geom();
        let bad = [
            (
                desc(0, 8192, 8193),
                1,
                "unused inodes count 8193 > inodes per group",
            ),
            (
                desc(0, 100, 200),
                1,
                "unused inodes count 200 > free inodes count 100",
            ),
            (desc(BG_INODE_UNINIT, 8000, 8192), 1, "INODE_UNINIT"),
            (desc(0, 8192, 8192), 0, "first non-reserved inode 11"),
            (
                desc(BG_INODE_UNINIT, 8192, 8192),
                0,
                "first non-reserved inode",
            ),
            (
                desc(0, 8182, 8182),
                0,
                "fewer than the first non-reserved inode",
            ),
        ];
        for (d, group, want) in bad {
            let e = plan_group(&g, &d, group).unwrap_err();
            assert_eq!(e.group, group);
            assert!(e.to_string().contains(want), "{e}");
        }
        // Inodes 1..=11 counted as used is what mke2fs leaves: fine.
        assert!(plan_group(&g, &desc(0, 8181, 8181), 0).is_ok());
    }
}
