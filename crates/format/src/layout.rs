//! Where the superblock backups and the group descriptor blocks are: pure
//! functions of superblock fields (libext2fs's `ext2fs_bg_has_super` and
//! `ext2fs_descriptor_block_loc2`), shared by mkfs, lazy init, the image
//! reader and the read-write engine so that the rule is written once.

use crate::features::{Compat, RoCompat};
use crate::superblock::Superblock;

/// The features and fields that decide which groups hold a superblock
/// backup (and, without meta_bg, a descriptor-table copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backups {
    /// `sparse_super`: backups in groups 1 and powers of 3, 5 and 7.
    pub sparse_super: bool,
    /// `sparse_super2`: backups only in the (non-zero) `backup_bgs`.
    pub sparse_super2: bool,
    /// `s_backup_bgs` (read only with `sparse_super2`).
    pub backup_bgs: [u32; 2],
}

impl Backups {
    /// From the superblock's feature words and `s_backup_bgs`.
    pub fn of(sb: &Superblock) -> Backups {
        Backups {
            sparse_super: RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::SPARSE_SUPER),
            sparse_super2: Compat(sb.s_feature_compat.get()).contains(Compat::SPARSE_SUPER2),
            backup_bgs: [sb.s_backup_bgs[0].get(), sb.s_backup_bgs[1].get()],
        }
    }

    /// Does group `g` hold a superblock (the primary for group 0, else a
    /// backup)? `ext2fs_bg_has_super`.
    pub fn has_super(&self, g: u32) -> bool {
        if g == 0 {
            return true;
        }
        if self.sparse_super2 {
            return self.backup_bgs.contains(&g);
        }
        if g <= 1 || !self.sparse_super {
            return true;
        }
        if g.is_multiple_of(2) {
            return false;
        }
        is_power_of(g, 3) || is_power_of(g, 5) || is_power_of(g, 7)
    }
}

/// Is `n` a positive power (`base`, `base²`, ...) of `base`?
fn is_power_of(n: u32, base: u32) -> bool {
    let mut p = base;
    while p < n {
        match p.checked_mul(base) {
            Some(next) => p = next,
            None => return false,
        }
    }
    p == n
}

/// Does group `g` hold a superblock (primary or backup)?
pub fn group_has_super(sb: &Superblock, g: u32) -> bool {
    Backups::of(sb).has_super(g)
}

/// Block of the first primary descriptor block: the block after the one
/// holding the primary superblock (byte 1024). That is block 1 for blocks
/// of 2 KiB and more, and block 2 for 1 KiB blocks whatever
/// `s_first_data_block` says: with 1 KiB blocks and bigalloc group 0
/// starts at block 0 (`s_first_data_block` 0) yet the superblock is still
/// block 1 and the table block 2. The kernel's `ext4_fill_super` reads the
/// table from `logical_sb_block + 1` (`descriptor_loc`, which also adds one
/// for meta_bg block 0 in that case) and libext2fs's
/// `ext2fs_descriptor_block_loc2`/`ext2fs_open2` add `group_zero_adjust`
/// for the same reason. Every reader and writer takes it from here.
pub fn gdt_start(block_size: u32) -> u64 {
    crate::superblock::SUPERBLOCK_OFFSET / u64::from(block_size.max(1)) + 1
}

/// What the placement of the descriptor blocks depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DescLayout {
    /// Block of the first primary descriptor block (the block after the
    /// primary superblock's).
    pub gdt_start: u64,
    /// `s_first_data_block`.
    pub first_data_block: u64,
    /// `s_blocks_per_group`.
    pub blocks_per_group: u32,
    /// Descriptors per block (block size / descriptor size).
    pub descs_per_block: u32,
    /// `s_first_meta_bg` with the meta_bg feature, `None` without it.
    pub first_meta_bg: Option<u32>,
    /// Which groups hold superblock backups.
    pub backups: Backups,
}

impl DescLayout {
    /// First block of group `g`.
    fn group_start(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Where primary descriptor block `index` lives: contiguous from
    /// `gdt_start`, or with meta_bg, from `first_meta_bg` on, in the first
    /// group of its meta group (group `index × descs_per_block`), after that
    /// group's superblock backup if it has one.
    pub fn primary(&self, index: u32) -> u64 {
        match self.first_meta_bg {
            Some(f) if index >= f && index > 0 => {
                let g = index.saturating_mul(self.descs_per_block);
                self.group_start(g) + u64::from(self.backups.has_super(g))
            }
            _ => self.gdt_start + u64::from(index),
        }
    }

    /// Where the backup of primary descriptor block `index` is, as
    /// e2fsprogs reads the backup descriptors with a backup superblock at
    /// `backup_sb`: right after that superblock for the contiguous table;
    /// with meta_bg in the second group of the meta group (after its
    /// superblock backup, if any), or `None` where the meta group has no
    /// second group within `blocks_count`.
    pub fn backup(&self, backup_sb: u64, blocks_count: u64, index: u32) -> Option<u64> {
        match self.first_meta_bg {
            Some(f) if index >= f => {
                let g = index.saturating_mul(self.descs_per_block);
                let bpg = u64::from(self.blocks_per_group);
                let first = self.group_start(g);
                let sup = u64::from(self.backups.has_super(g));
                (first + sup + bpg < blocks_count)
                    .then(|| first + bpg + u64::from(self.backups.has_super(g + 1)))
            }
            _ => Some(backup_sb + 1 + u64::from(index)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPARSE: Backups = Backups {
        sparse_super: true,
        sparse_super2: false,
        backup_bgs: [0, 0],
    };

    /// Groups with a superblock, as dumpe2fs listed them for a 4 KiB
    /// image of 160 groups (mke2fs 1.47, sparse_super).
    #[test]
    fn sparse_super_groups_match_dumpe2fs() {
        let got: Vec<u32> = (0..160).filter(|&g| SPARSE.has_super(g)).collect();
        assert_eq!(got, [0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125]);
        let all = Backups {
            sparse_super: false,
            ..SPARSE
        };
        assert!((0..160).all(|g| all.has_super(g)));
        // No overflow near u32::MAX (3^20 = 3486784401).
        assert!(SPARSE.has_super(3_486_784_401));
        assert!(!SPARSE.has_super(u32::MAX));
    }

    /// sparse_super2 with `s_backup_bgs` = [1, 19] (mke2fs -O sparse_super2,
    /// 20 groups of 1 KiB blocks): only groups 0, 1 and 19; the contiguous
    /// two-block table is at 2-3 and after the backups at 1025 and 19457.
    #[test]
    fn sparse_super2_matches_dumpe2fs() {
        let b = Backups {
            sparse_super: true,
            sparse_super2: true,
            backup_bgs: [1, 19],
        };
        let got: Vec<u32> = (0..20).filter(|&g| b.has_super(g)).collect();
        assert_eq!(got, [0, 1, 19]);
        let l = DescLayout {
            gdt_start: 2,
            first_data_block: 1,
            blocks_per_group: 1024,
            descs_per_block: 16,
            first_meta_bg: None,
            backups: b,
        };
        assert_eq!([l.primary(0), l.primary(1)], [2, 3]);
        assert_eq!(l.backup(1025, 20480, 1), Some(1027));
        assert_eq!(l.backup(19457, 20480, 0), Some(19458));
        // From the superblock fields.
        let mut sb = Superblock::zeroed();
        sb.s_feature_compat.set(Compat::SPARSE_SUPER2.bits());
        sb.s_feature_ro_compat.set(RoCompat::SPARSE_SUPER.bits());
        sb.s_backup_bgs[0].set(1);
        sb.s_backup_bgs[1].set(19);
        assert_eq!(Backups::of(&sb), b);
        assert!(group_has_super(&sb, 19) && !group_has_super(&sb, 3));
    }

    /// meta_bg, 1 KiB blocks, 32-byte descriptors (32 a block), 64 groups
    /// of 256 blocks, `s_first_meta_bg` 0: dumpe2fs puts the descriptor
    /// blocks at 2 (group 0) and 8193 (group 32), their backups at 258 and
    /// 8449 (groups 1 and 33; also 7937 and 16129 in the last groups).
    #[test]
    fn meta_bg_1k_32_byte_matches_dumpe2fs() {
        let l = DescLayout {
            gdt_start: 2,
            first_data_block: 1,
            blocks_per_group: 256,
            descs_per_block: 32,
            first_meta_bg: Some(0),
            backups: SPARSE,
        };
        assert_eq!([l.primary(0), l.primary(1)], [2, 8193]);
        assert_eq!(l.backup(257, 16384, 0), Some(258));
        assert_eq!(l.backup(257, 16384, 1), Some(8449));
        // A meta group without a second group has no backup.
        assert_eq!(l.backup(257, 8193 + 256, 1), None);
    }

    /// The table's first block: 2 for 1 KiB blocks with s_first_data_block
    /// 1 and with 0 (bigalloc; dumpe2fs of `mke2fs -b 1024 -O bigalloc -C
    /// 4096` says "Group descriptors at 2-2"), 1 for larger blocks.
    #[test]
    fn gdt_start_follows_the_superblock_block() {
        assert_eq!(gdt_start(1024), 2);
        assert_eq!(gdt_start(2048), 1);
        assert_eq!(gdt_start(4096), 1);
        assert_eq!(gdt_start(65536), 1);
        // meta_bg with s_first_meta_bg 0, bigalloc 1 KiB: block 0 of the
        // table is still at 2 (the kernel's descriptor_loc has_super++),
        // later ones after their group's superblock backup.
        let l = DescLayout {
            gdt_start: gdt_start(1024),
            first_data_block: 0,
            blocks_per_group: 8192,
            descs_per_block: 32,
            first_meta_bg: Some(0),
            backups: SPARSE,
        };
        assert_eq!([l.primary(0), l.primary(1)], [2, 32 * 8192]);
    }

    /// meta_bg, 4 KiB blocks, 64-byte descriptors (64 a block), 160 groups
    /// of 512 blocks: descriptor blocks at 1, 32768 and 65536 (groups 0, 64
    /// and 128), backups at 513, 33280 and 66048.
    #[test]
    fn meta_bg_4k_64_byte_matches_dumpe2fs() {
        let l = DescLayout {
            gdt_start: 1,
            first_data_block: 0,
            blocks_per_group: 512,
            descs_per_block: 64,
            first_meta_bg: Some(0),
            backups: SPARSE,
        };
        let got: Vec<u64> = (0..3).map(|i| l.primary(i)).collect();
        assert_eq!(got, [1, 32768, 65536]);
        let got: Vec<Option<u64>> = (0..3).map(|i| l.backup(512, 81920, i)).collect();
        assert_eq!(got, [Some(513), Some(33280), Some(66048)]);
        // With s_first_meta_bg 2 the first two blocks are contiguous.
        let l = DescLayout {
            first_meta_bg: Some(2),
            ..l
        };
        let got: Vec<u64> = (0..3).map(|i| l.primary(i)).collect();
        assert_eq!(got, [1, 2, 65536]);
        assert_eq!(l.backup(512, 81920, 1), Some(514));
    }
}
