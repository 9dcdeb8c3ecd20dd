//! The geometry planner: a pure function from resolved parameters to the
//! complete layout of a new filesystem: where every block goes and what
//! every counter holds. No I/O happens here.
//!
//! It follows libext2fs's `ext2fs_initialize`, `ext2fs_allocate_tables`,
//! and mke2fs's allocation order (root, lost+found, resize inode, journal,
//! orphan file) so that the result is the layout mke2fs 1.47 produces.

use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT, BG_INODE_ZEROED};
use ext4kit_format::layout::Backups;
use ext4kit_format::{Features, extent::EXT_INIT_MAX_LEN};

use super::blockset::BlockSet;

/// Parameters after option parsing and profile resolution: every number
/// the planner needs, nothing left to look up.
#[derive(Clone, Debug)]
pub struct FsParams {
    /// Requested size in filesystem blocks (before last-group trimming).
    pub blocks_count: u64,
    pub block_size: u32,
    pub inode_size: u16,
    /// Requested inode count (`-N`, or size / inode_ratio).
    pub inodes_count: u64,
    pub features: Features,
    /// log2 of the flex_bg size (0 when flex_bg is off).
    pub log_groups_per_flex: u8,
    /// `-g`: blocks per group (0 = default).
    pub blocks_per_group: u32,
    /// Reserved blocks as requested before trimming (`reserved_ratio` ×
    /// blocks / 100).
    pub r_blocks_count: u64,
    /// `s_reserved_gdt_blocks` override (`-E resize=`); `None` = computed.
    pub reserved_gdt_blocks: Option<u32>,
    /// `-E desc_size=` with 64bit (0 = the default, 64).
    pub desc_size: u32,
    /// `s_first_meta_bg` (`MKE2FS_FIRST_META_BG` with `-O meta_bg`).
    pub first_meta_bg: u32,
    /// Journal size request in blocks (`-J size=`), `None` = default.
    pub journal_blocks: Option<u32>,
    /// Orphan file size in blocks, `None` = default.
    pub orphan_file_blocks: Option<u32>,
    /// RAID stride, in blocks (affects nothing in flex_bg table placement).
    pub stride: u32,
    /// `-E packed_meta_blocks`: bitmaps, tables and journal at the start.
    pub packed_meta_blocks: bool,
    /// Root directory owner.
    pub root_uid: u32,
    pub root_gid: u32,
    /// The inode tables will read as zero (`ITABLE_ZEROED` may be claimed).
    pub itable_zeroed: bool,
    /// Lazy inode table init (only used blocks of each table are written).
    pub lazy_itable_init: bool,
    /// sparse_super2: `s_backup_bgs` as mke2fs asks for them (1 and !0
    /// for two backups), clamped to the group count by the planner.
    pub backup_bgs: [u32; 2],
    /// `-J fast_commit_size=` in blocks (with fast_commit), `None` = the
    /// default (1/64 of the default journal size).
    pub journal_fc_blocks: Option<u32>,
    /// `-S`: only the superblock and descriptors; the plan stops after
    /// the group tables (no directories, journal or special inodes).
    pub super_only: bool,
    /// bigalloc: log2 of the blocks per cluster (`s_log_cluster_size -
    /// s_log_block_size`); with bigalloc, `blocks_per_group` counts
    /// clusters (mke2fs's `-g`).
    pub cluster_bits: u32,
    /// `-O quota`: the quota files to create ([`super::quota::USR`] |
    /// `GRP` | `PRJ`, from `-E quotatype=`).
    pub quota_types: u8,
    /// `-J device=`: the journal is on another device (no journal inode;
    /// has_journal stays).
    pub external_journal: bool,
    /// `-J location=` (or mke2fs.conf's `journal_location`): the journal's
    /// goal block instead of the middle of the filesystem.
    pub journal_location: Option<u64>,
    /// mke2fs.conf's `make_hugefiles` and its settings.
    pub hugefiles: Option<super::hugefiles::HugeParams>,
    /// `-l FILE` / `-c`: the bad block numbers as read (unchecked).
    pub bad_blocks: Option<Vec<u64>>,
}

/// Errors the planner reports: all are the user's parameters being
/// impossible, never I/O.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GeometryError {
    #[error("filesystem too small: {0}")]
    TooSmall(String),
    /// mke2fs's message (libext2fs's EXT2_ET_TOO_MANY_INODES), then why.
    #[error(
        "Cannot create filesystem with requested number of inodes: too many inodes ({0}), raise the inode ratio (-i) or lower the count (-N)"
    )]
    TooManyInodes(String),
    #[error("could not allocate {0}: the filesystem is too small or too full")]
    NoSpace(&'static str),
    #[error("invalid parameters: {0}")]
    Invalid(String),
}

/// One group's final descriptor contents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupPlan {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub flags: u16,
    pub itable_unused: u32,
}

/// A contiguous run of a file: logical block, physical block, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub lblk: u32,
    pub pblk: u64,
    pub len: u32,
}

/// A file laid out by extents, possibly with one leaf block (depth 1), or
/// by block pointers with indirect blocks when extents are off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileMap {
    pub runs: Vec<Run>,
    /// Leaf block holding the extents when they do not fit in the inode.
    pub leaf: Option<u64>,
    /// Block-mapped layout (no extents feature).
    pub blockmap: Option<BlockMap>,
}

/// One step of a block-mapped allocation, in the order libext2fs makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapStep {
    /// An indirect block; `parent` is the double-indirect block holding it.
    Meta { block: u64, parent: Option<u64> },
    /// A data block, with the indirect block mapping it and, below the
    /// double-indirect level, that block too.
    Data {
        block: u64,
        ind: Option<u64>,
        dind: Option<u64>,
    },
}

/// Pointers of a block-mapped file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockMap {
    /// `i_block[0..15]`: 12 direct pointers, IND, DIND, TIND.
    pub i_block: [u32; 15],
    /// Every indirect block (IND, DIND, and DIND's children) with the
    /// pointers it holds.
    pub indirect: Vec<(u64, Vec<u32>)>,
    pub steps: Vec<MapStep>,
}

impl FileMap {
    /// Metadata blocks of the mapping (extent leaf or indirect blocks).
    pub fn meta_blocks(&self) -> u64 {
        u64::from(self.leaf.is_some())
            + self
                .blockmap
                .as_ref()
                .map_or(0, |b| b.indirect.len() as u64)
    }
    pub fn blocks(&self) -> u64 {
        self.runs.iter().map(|r| u64::from(r.len)).sum()
    }
    /// Physical block of logical block `l`.
    pub fn pblk(&self, l: u32) -> Option<u64> {
        self.runs
            .iter()
            .find(|r| l >= r.lblk && l < r.lblk + r.len)
            .map(|r| r.pblk + u64::from(l - r.lblk))
    }
}

/// The complete plan of a new filesystem.
#[derive(Clone, Debug)]
pub struct Layout {
    pub block_size: u32,
    pub blocks_count: u64,
    pub r_blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub group_count: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: u16,
    pub inode_blocks_per_group: u32,
    pub desc_size: u16,
    pub desc_blocks: u32,
    pub reserved_gdt_blocks: u32,
    /// `s_first_meta_bg`: with meta_bg, the descriptor blocks before this
    /// one keep the classic layout (after each superblock copy).
    pub first_meta_bg: u32,
    pub log_groups_per_flex: u8,
    pub features: Features,
    pub groups: Vec<GroupPlan>,
    /// Every used block once the filesystem is made.
    pub used: BlockSet,
    pub free_blocks: u64,
    pub free_inodes: u32,
    /// `s_overhead_clusters`.
    pub overhead: u64,
    pub root: FileMap,
    pub lost_found: FileMap,
    /// Resize inode's double-indirect block.
    pub resize_dind: Option<u64>,
    pub journal: Option<FileMap>,
    /// Journal length in blocks, fast-commit area included.
    pub journal_blocks: u32,
    /// Fast-commit blocks at the end of the journal (`s_num_fc_blks`).
    pub journal_fc_blocks: u32,
    /// sparse_super2: the groups holding the two backups (0 = none).
    pub backup_bgs: [u32; 2],
    /// The MMP block (`-O mmp`).
    pub mmp_block: Option<u64>,
    /// Planned for `-S` (see [`FsParams::super_only`]).
    pub super_only: bool,
    /// Orphan file (inode 12 when orphan_file is on, 13 after a project
    /// quota file).
    pub orphan: Option<(u32, FileMap)>,
    pub first_ino: u32,
    /// bigalloc: log2 of blocks per cluster (0 without bigalloc).
    pub cluster_bits: u32,
    /// Quota files (`-O quota`), in the order mke2fs writes them.
    pub quota: Vec<super::quota::QuotaFile>,
    /// mke2fs.conf's huge files (made last, after the orphan file).
    pub hugefiles: Option<super::hugefiles::HugePlan>,
    /// `-l`/`-c`: the bad blocks and the bad block inode's mapping.
    pub bad_blocks: Option<super::badblocks::BadBlocks>,
    /// `-d`: the copied tree's inodes and root directory (set by
    /// [`super::populate::populate`] after the plan).
    pub populated: Option<super::populate::Populated>,
}

/// Where one group's superblock copy and descriptor blocks lie.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupMeta {
    /// The superblock (copy) at the group's first block.
    pub super_blk: Option<u64>,
    /// The classic descriptor table (and reserved GDT blocks) after it.
    pub old_desc: Option<u64>,
    /// meta_bg: this group holds its meta group's descriptor block.
    pub new_desc: Option<u64>,
    /// Blocks these take in the group.
    pub used: u64,
}

impl Layout {
    /// Where inode `ino` lives: its group and its slot in that group's
    /// table, `((ino - 1) / ipg, (ino - 1) % ipg)`. Every table write,
    /// bitmap bit and per-group count of mkfs goes through this (with
    /// fewer than 11 inodes per group the reserved inodes and lost+found
    /// spread over several groups).
    pub fn inode_loc(&self, ino: u32) -> (u32, u32) {
        let ipg = self.inodes_per_group;
        ((ino - 1) / ipg, (ino - 1) % ipg)
    }
    /// The inode-table block holding inode `ino`.
    pub fn inode_block(&self, ino: u32) -> u64 {
        let (g, i) = self.inode_loc(ino);
        self.groups[g as usize].inode_table
            + u64::from(i) * u64::from(self.inode_size) / u64::from(self.block_size)
    }
    /// Blocks per cluster (1 without bigalloc).
    pub fn cluster_ratio(&self) -> u64 {
        1 << self.cluster_bits
    }
    /// `s_clusters_per_group`.
    pub fn clusters_per_group(&self) -> u32 {
        self.blocks_per_group >> self.cluster_bits
    }
    /// Block of the primary superblock (1 with 1 KiB blocks, also with
    /// bigalloc, where the first data block is 0).
    pub fn sb_block(&self) -> u64 {
        if self.first_data_block == 0 && self.block_size == 1024 {
            1
        } else {
            self.first_data_block
        }
    }
    /// The highest inode number in use (inodes 1..=this are all used).
    pub fn last_used_ino(&self) -> u32 {
        let mut last = self.first_ino;
        if let Some(p) = &self.populated {
            last = last.max(p.last_ino);
        }
        for q in &self.quota {
            last = last.max(q.ino);
        }
        if let Some((o, _)) = &self.orphan {
            last = last.max(*o);
        }
        if let Some(h) = &self.hugefiles {
            for d in &h.dirs {
                last = last.max(d.ino);
            }
            for f in &h.files {
                last = last.max(f.ino);
            }
        }
        last
    }
    /// `i_blocks` (512-byte units) of a file mapped by `fm`: every
    /// cluster it touches, and each mapping block in a cluster of its own
    /// (`ext2fs_iblk_add_blocks` counts clusters).
    pub fn i_blocks_512(&self, fm: &FileMap) -> u64 {
        let bits = self.cluster_bits;
        let mut clusters = 0u64;
        let mut last: Option<u64> = None;
        for r in &fm.runs {
            if r.len == 0 {
                continue;
            }
            let first = r.pblk >> bits;
            let end = (r.pblk + u64::from(r.len) - 1) >> bits;
            let first = match last {
                Some(l) if l == first => first + 1,
                _ => first,
            };
            if end >= first {
                clusters += end - first + 1;
            }
            last = Some(end);
        }
        (clusters + fm.meta_blocks()) * (u64::from(self.block_size) << bits) / 512
    }
    /// Does group `g` hold a superblock (and GDT) backup?
    pub fn group_has_super(&self, g: u32) -> bool {
        has_super(&self.features, &self.backup_bgs, g)
    }
    pub fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }
    pub fn group_last_block(&self, g: u32) -> u64 {
        if g + 1 == self.group_count {
            self.blocks_count - 1
        } else {
            self.group_first_block(g) + u64::from(self.blocks_per_group) - 1
        }
    }
    pub fn group_of_block(&self, b: u64) -> u32 {
        ((b - self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }
    /// Blocks in group `g`.
    pub fn group_blocks(&self, g: u32) -> u64 {
        self.group_last_block(g) - self.group_first_block(g) + 1
    }
    /// Descriptor size in bytes (32 without 64bit).
    pub fn desc_bytes(&self) -> u32 {
        if self.desc_size == 0 {
            32
        } else {
            u32::from(self.desc_size)
        }
    }
    /// Descriptors per block: also the number of groups in a meta_bg.
    pub fn desc_per_block(&self) -> u32 {
        self.block_size / self.desc_bytes()
    }
    fn meta_bg(&self) -> bool {
        self.features.incompat.contains(Incompat::META_BG)
    }
    /// Blocks reserved after a classic superblock copy
    /// (`old_desc_blocks` of `ext2fs_reserve_super_and_bgd`).
    fn old_desc_reserved(&self) -> u64 {
        if self.meta_bg() {
            u64::from(self.first_meta_bg)
        } else {
            u64::from(self.desc_blocks) + u64::from(self.reserved_gdt_blocks)
        }
    }
    /// Descriptor blocks written after a classic superblock copy
    /// (`old_desc_blocks` of `ext2fs_flush`).
    pub fn old_desc_written(&self) -> u64 {
        if self.meta_bg() {
            u64::from(self.first_meta_bg.min(self.desc_blocks))
        } else {
            u64::from(self.desc_blocks)
        }
    }
    /// `ext2fs_super_and_bgd_loc2`: where group `g`'s superblock copy and
    /// descriptor blocks are.
    pub fn group_meta(&self, g: u32) -> GroupMeta {
        let mut group_block = self.group_first_block(g);
        if group_block == 0 && self.block_size == 1024 {
            // 1 KiB blocks with bigalloc: the superblock is block 1.
            group_block = 1;
        }
        let has_super = self.group_has_super(g);
        let mut m = GroupMeta::default();
        if has_super {
            m.super_blk = Some(group_block);
            m.used += 1;
        }
        let dpb = self.desc_per_block();
        let meta_bg = g / dpb;
        if !self.meta_bg() || meta_bg < self.first_meta_bg {
            if has_super {
                m.old_desc = Some(group_block + 1);
                m.used += self.old_desc_reserved();
            }
        } else {
            let r = g % dpb;
            if r == 0 || r == 1 || r == dpb - 1 {
                m.new_desc = Some(group_block + u64::from(has_super));
                m.used += 1;
            }
        }
        m
    }
    /// Where group `g`'s superblock backup lives (first block of group;
    /// the primary is always at byte 1024).
    pub fn super_block_of_group(&self, g: u32) -> u64 {
        self.group_first_block(g)
    }
    /// Groups holding superblock backups (not group 0), ascending.
    pub fn backup_groups(&self) -> Box<dyn Iterator<Item = u32> + '_> {
        if self.features.compat.contains(Compat::SPARSE_SUPER2) {
            let [a, b] = self.backup_bgs;
            Box::new([a, b].into_iter().filter(|&g| g != 0))
        } else if self.features.ro_compat.contains(RoCompat::SPARSE_SUPER) {
            Box::new(BackupGroups::new(self.group_count))
        } else {
            Box::new(1..self.group_count)
        }
    }
}

/// `ext2fs_bg_has_super`; `bgs` is `s_backup_bgs` (sparse_super2).
fn has_super(features: &Features, bgs: &[u32; 2], g: u32) -> bool {
    Backups {
        sparse_super: features.ro_compat.contains(RoCompat::SPARSE_SUPER),
        sparse_super2: features.compat.contains(Compat::SPARSE_SUPER2),
        backup_bgs: *bgs,
    }
    .has_super(g)
}

/// Iterates the sparse_super backup groups 1, 3, 5, 7, 9, 25, 27, ... in
/// ascending order below `count` (all groups >= 1 without sparse_super is
/// handled by callers through [`Layout::group_has_super`]).
struct BackupGroups {
    count: u32,
    next: [u64; 3],
    first: bool,
}

impl BackupGroups {
    fn new(count: u32) -> Self {
        Self {
            count,
            next: [3, 5, 7],
            first: true,
        }
    }
}

impl Iterator for BackupGroups {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        if self.first {
            self.first = false;
            return (self.count > 1).then_some(1);
        }
        let (i, &m) = self.next.iter().enumerate().min_by_key(|(_, v)| **v)?;
        if m >= u64::from(self.count) {
            return None;
        }
        self.next[i] = m * [3, 5, 7][i];
        Some(m as u32)
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// `calc_reserved_gdt_blocks` from libext2fs initialize.c.
fn calc_reserved_gdt_blocks(
    blocks: u64,
    first_data: u64,
    bpg: u32,
    block_size: u32,
    desc_size: u32,
    desc_blocks: u32,
) -> u32 {
    let gdpb = u64::from(block_size / desc_size);
    let max_blocks: u64 = if blocks < (1u64 << 32) / 1024 * 1024 {
        (blocks * 1024).min(u64::from(u32::MAX))
    } else {
        u64::from(u32::MAX)
    };
    let max_blocks = if blocks > u64::from(u32::MAX) / 1024 {
        u64::from(u32::MAX)
    } else {
        max_blocks
    };
    let rsv_groups = div_ceil(max_blocks - first_data, u64::from(bpg));
    let mut rsv_gdb = div_ceil(rsv_groups, gdpb) as i64 - i64::from(desc_blocks);
    let apb = i64::from(block_size / 4);
    if rsv_gdb > apb {
        rsv_gdb = apb;
    }
    rsv_gdb.max(0) as u32
}

/// Default journal size in blocks for a filesystem of `blocks` blocks
/// (`ext2fs_default_journal_size`); `None` = too small for a journal.
pub fn default_journal_blocks(blocks: u64) -> Option<u32> {
    Some(match blocks {
        b if b < 2048 => return None,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    })
}

/// Default orphan file size (`ext2fs_default_orphan_file_blocks`).
pub fn default_orphan_blocks(blocks: u64) -> u32 {
    if blocks < 128 * 1024 {
        32
    } else if blocks < 2 * 1024 * 1024 {
        (blocks / 4096) as u32
    } else {
        512
    }
}

/// Mutable planning state while allocations proceed.
pub(super) struct Planner {
    pub(super) l: Layout,
    stride: u32,
    /// bigalloc, after the tables: the block bitmap is a cluster bitmap
    /// (`ext2fs_convert_subcluster_bitmap`), allocations take clusters.
    clustered: bool,
}

impl Planner {
    fn blocks(&self) -> u64 {
        self.l.blocks_count
    }
    fn fdb(&self) -> u64 {
        self.l.first_data_block
    }

    /// `ext2fs_block_alloc_stats2(+1)` for a range. With bigalloc the
    /// group counters move as libext2fs moves them (one per single block
    /// before the bitmap is converted, clusters after; the totals are
    /// recomputed by [`fix_cluster_counts`] anyway).
    pub(super) fn take(&mut self, start: u64, len: u64) {
        let bits = self.l.cluster_bits;
        let mask = (1u64 << bits) - 1;
        let (start, end) = if self.clustered {
            (start & !mask, (start + len + mask) & !mask)
        } else {
            (start, start + len)
        };
        let single = end - start == 1;
        self.l.used.insert(start, end - start);
        let mut b = start;
        while b < end {
            let g = self.l.group_of_block(b);
            let gl = self.l.group_last_block(g);
            let n = (gl + 1).min(end) - b;
            let dec = if single { 1 } else { n >> bits };
            let gp = &mut self.l.groups[g as usize];
            gp.free_blocks = gp.free_blocks.saturating_sub(dec as u32);
            gp.flags &= !BG_BLOCK_UNINIT;
            self.l.free_blocks = self.l.free_blocks.saturating_sub(n);
            b += n;
        }
    }

    /// `ext2fs_new_block2` + alloc stats (a whole cluster with bigalloc,
    /// the goal rounded down to its cluster).
    pub(super) fn alloc_block(
        &mut self,
        goal: u64,
        what: &'static str,
    ) -> Result<u64, GeometryError> {
        let goal = if self.clustered {
            goal & !(self.l.cluster_ratio() - 1)
        } else {
            goal
        };
        let b = self
            .l
            .used
            .new_block(goal, self.fdb(), self.blocks())
            .ok_or(GeometryError::NoSpace(what))?;
        self.take(b, 1);
        Ok(b)
    }

    /// `ext2fs_inode_alloc_stats2(+1)`.
    pub(super) fn use_inode(&mut self, ino: u32, is_dir: bool) {
        let ipg = self.l.inodes_per_group;
        let (g, _) = self.l.inode_loc(ino);
        let gp = &mut self.l.groups[g as usize];
        gp.free_inodes -= 1;
        if is_dir {
            gp.used_dirs += 1;
        }
        gp.flags &= !BG_INODE_UNINIT;
        let first_unused = ipg - gp.itable_unused + g * ipg + 1;
        if ino >= first_unused {
            gp.itable_unused = g * ipg + ipg - ino;
        }
        self.l.free_inodes -= 1;
    }

    /// `ext2fs_new_inode` searching from `start` (at least `s_first_ino`)
    /// and finding `ino`: every group its search
    /// visits goes through `check_inode_uninit`, which clears
    /// `INODE_UNINIT` and also `BLOCK_UNINIT` ("mimics what the kernel
    /// does"). With fewer than 11 inodes per group lost+found's search
    /// starts in a group the reserved inodes have not touched yet.
    /// (Each step covers `ipg - slot` inodes plus one, as libext2fs's
    /// `upto` does.)
    pub(super) fn new_inode_scan(&mut self, start: u32, ino: u32) {
        let csum = self.l.features.has_group_csum();
        let ipg = self.l.inodes_per_group;
        let mut i = start.max(self.l.first_ino);
        while i <= ino && i <= self.l.inodes_count {
            let (g, slot) = self.l.inode_loc(i);
            if let Some(gp) = self.l.groups.get_mut(g as usize)
                && csum
                && gp.flags & BG_INODE_UNINIT != 0
            {
                gp.flags &= !(BG_INODE_UNINIT | BG_BLOCK_UNINIT);
            }
            let upto = i + (ipg - slot);
            if ino <= upto {
                break;
            }
            i = upto + 1;
        }
    }

    /// Goal for a new file's first block (`ext2fs_find_inode_goal`).
    pub(super) fn inode_goal(&self, ino: u32) -> u64 {
        let (mut g, _) = self.l.inode_loc(ino);
        if self.l.log_groups_per_flex > 0 {
            g &= !((1u32 << self.l.log_groups_per_flex) - 1);
        }
        self.l.group_first_block(g)
    }

    /// Allocate `n` blocks one at a time, each at the first free block
    /// after the previous one (how ext2fs_mkdir/expand_dir and the orphan
    /// file's block iterator allocate), merging into runs. With bigalloc
    /// the next block of the same cluster is taken without an allocation
    /// (libext2fs's implied cluster allocation).
    pub(super) fn alloc_sequential(
        &mut self,
        goal: u64,
        n: u32,
        what: &'static str,
    ) -> Result<FileMap, GeometryError> {
        self.alloc_sequential_after(goal, n, what, false)
    }

    /// [`Self::alloc_sequential`]; `continues`: the file's block before
    /// `goal` is already mapped, so with bigalloc `goal` itself may be the
    /// next block of that block's cluster.
    pub(super) fn alloc_sequential_after(
        &mut self,
        goal: u64,
        n: u32,
        what: &'static str,
        continues: bool,
    ) -> Result<FileMap, GeometryError> {
        let mut fm = FileMap::default();
        let mut g = goal;
        let mask = self.l.cluster_ratio() - 1;
        for i in 0..n {
            let b = if self.clustered && (i > 0 || continues) && g & mask != 0 {
                g
            } else {
                self.alloc_block(g, what)?
            };
            match fm.runs.last_mut() {
                Some(r) if r.pblk + u64::from(r.len) == b && r.len < EXT_INIT_MAX_LEN => r.len += 1,
                _ => fm.runs.push(Run {
                    lblk: i,
                    pblk: b,
                    len: 1,
                }),
            }
            g = b + 1;
        }
        Ok(fm)
    }

    /// Pick the flex_bg table slot (`flexbg_offset` in alloc_tables.c).
    fn flexbg_offset(&self, group: u32, start_blk: u64, rem_grp: u32, elem_size: u64) -> u64 {
        let flexbg_size = 1u32 << self.l.log_groups_per_flex;
        let flexbg = group / flexbg_size;
        let mut size = u64::from(rem_grp) * elem_size;
        let quarter = u64::from(self.l.blocks_per_group / 4);
        if size > quarter {
            size = quarter;
        }
        let (fdb, blocks) = (self.fdb(), self.blocks());
        if start_blk != 0
            && start_blk < blocks
            && let Some(b) =
                self.l
                    .used
                    .get_free_blocks(start_blk, start_blk + size, elem_size, fdb, blocks)
        {
            return b;
        }
        let start = self.l.group_first_block(flexbg_size * flexbg);
        let last_grp = (group | (flexbg_size - 1)).min(self.l.group_count - 1);
        let last_blk = self.l.group_last_block(last_grp);
        if let Some(b) = self
            .l
            .used
            .get_free_blocks(start, last_blk, size, fdb, blocks)
        {
            return b;
        }
        if let Some(b) = self
            .l
            .used
            .get_free_blocks(start, last_blk, elem_size, fdb, blocks)
        {
            return b;
        }
        if let Some(b) = self
            .l
            .used
            .get_free_blocks(0, last_blk, elem_size, fdb, blocks)
        {
            return b;
        }
        0
    }

    /// A free block from `start` to `last`, else from `group_blk` to
    /// `last` (the two searches `ext2fs_allocate_group_table` makes for a
    /// bitmap).
    fn free_block_in(
        &self,
        start: u64,
        group_blk: u64,
        last: u64,
        what: &'static str,
    ) -> Result<u64, GeometryError> {
        let (fdb, blocks) = (self.fdb(), self.blocks());
        self.l
            .used
            .get_free_blocks(start, last, 1, fdb, blocks)
            .or_else(|| self.l.used.get_free_blocks(group_blk, last, 1, fdb, blocks))
            .ok_or(GeometryError::NoSpace(what))
    }

    /// Account a flex_bg metadata block placed in some group.
    fn take_meta(&mut self, start: u64, len: u64, flex: bool) {
        if flex {
            self.take(start, len);
        } else {
            self.l.used.insert(start, len);
        }
    }

    /// `ext2fs_allocate_group_table` for one group.
    fn allocate_group_table(&mut self, group: u32) -> Result<(), GeometryError> {
        let fdb = self.fdb();
        let blocks = self.blocks();
        let itb = u64::from(self.l.inode_blocks_per_group);
        let mut group_blk = self.l.group_first_block(group);
        let mut last_blk = self.l.group_last_block(group);
        let flex =
            self.l.features.incompat.contains(Incompat::FLEX_BG) && self.l.log_groups_per_flex > 0;
        let mut flexbg_size = 0u32;
        let mut last_grp = 0u32;
        let mut rem_grps = 0u32;
        let mut table_offset = 0u64;
        if flex {
            flexbg_size = 1 << self.l.log_groups_per_flex;
            last_grp = (group | (flexbg_size - 1)).min(self.l.group_count - 1);
            rem_grps = last_grp - group + 1;
        }
        let stride = u64::from(self.stride);
        let mut start_blk;
        if stride > 0 && !flex {
            start_blk = self
                .l
                .used
                .get_free_blocks(group_blk, last_blk, 1, fdb, blocks)
                .ok_or(GeometryError::NoSpace("block bitmap"))?;
            start_blk += itb;
            start_blk += (stride * u64::from(group)) % (last_blk - start_blk + 1);
            if start_blk >= last_blk {
                start_blk = group_blk;
            }
        } else {
            start_blk = group_blk;
        }
        if flex {
            let mut prev_block = 0;
            table_offset = u64::from(flexbg_size);
            if !group.is_multiple_of(flexbg_size) {
                prev_block = self.l.groups[group as usize - 1].block_bitmap + 1;
            } else if last_grp == self.l.group_count - 1 {
                let t = last_grp & (flexbg_size - 1);
                table_offset = if t == 0 {
                    u64::from(flexbg_size)
                } else {
                    u64::from(t) + 1
                };
            }
            start_blk = self.flexbg_offset(group, prev_block, rem_grps, 1);
            last_blk = self.l.group_last_block(last_grp);
        }
        // Block bitmap.
        let bb = self.free_block_in(start_blk, group_blk, last_blk, "block bitmap")?;
        self.take_meta(bb, 1, flex);
        self.l.groups[group as usize].block_bitmap = bb;
        // Inode bitmap.
        if flex {
            let prev_block = if !group.is_multiple_of(flexbg_size) {
                self.l.groups[group as usize - 1].inode_bitmap + 1
            } else {
                bb + table_offset
            };
            start_blk = self.flexbg_offset(group, prev_block, rem_grps, 1);
            last_blk = self.l.group_last_block(last_grp);
        }
        let ib = self.free_block_in(start_blk, group_blk, last_blk, "inode bitmap")?;
        self.take_meta(ib, 1, flex);
        self.l.groups[group as usize].inode_bitmap = ib;
        // Inode table.
        if flex {
            let prev_block = if !group.is_multiple_of(flexbg_size) {
                self.l.groups[group as usize - 1].inode_table + itb
            } else {
                ib + table_offset
            };
            group_blk = self.flexbg_offset(group, prev_block, rem_grps, itb);
            last_blk = self.l.group_last_block(last_grp);
        }
        let it = self
            .l
            .used
            .get_free_blocks(group_blk, last_blk, itb, fdb, blocks)
            .ok_or(GeometryError::NoSpace("inode table"))?;
        self.take_meta(it, itb, flex);
        self.l.groups[group as usize].inode_table = it;
        Ok(())
    }
}

impl std::ops::Deref for Planner {
    type Target = Layout;
    fn deref(&self) -> &Layout {
        &self.l
    }
}

/// Build the complete layout.
pub fn plan(p: &FsParams) -> Result<Layout, GeometryError> {
    let bs = p.block_size;
    if !(1024..=65536).contains(&bs) || !bs.is_power_of_two() {
        return Err(GeometryError::Invalid(format!("block size {bs}")));
    }
    if p.features.incompat.contains(Incompat::JOURNAL_DEV) {
        return super::journal_dev::plan(p);
    }
    let features = p.features;
    let bit64 = features.incompat.contains(Incompat::BIT64);
    let bigalloc = features.ro_compat.contains(RoCompat::BIGALLOC);
    let cluster_bits = if bigalloc { p.cluster_bits } else { 0 };
    let first_data_block: u64 = if bs == 1024 && !bigalloc { 1 } else { 0 };
    let mut bpg: u32 = if bigalloc {
        // ext2fs_initialize: -g counts clusters; the default is a bitmap
        // block's worth, at most EXT2_MAX_CLUSTERS_PER_GROUP.
        let log_cluster = (bs / 1024).trailing_zeros() + cluster_bits;
        let mut cpg = if p.blocks_per_group != 0 {
            u64::from(p.blocks_per_group)
        } else if log_cluster + 15 < 32 {
            u64::from(bs) * 8
        } else {
            (u64::from(bs) - 1) * 8
        };
        cpg = cpg.min(65528);
        let bpg = cpg << cluster_bits;
        if bpg >= 1 << 32 {
            return Err(GeometryError::Invalid(format!(
                "{bpg} blocks per group (clusters of {} blocks)",
                1u64 << cluster_bits
            )));
        }
        bpg as u32
    } else if p.blocks_per_group != 0 {
        p.blocks_per_group
    } else {
        bs * 8
    };
    let max_bpg = 8 * bs; // EXT2_MAX_BLOCKS_PER_GROUP = (1<<16 - 8) * (cluster/bs) ... capped below
    let max_bpg = max_bpg.min(65528);
    if bpg > max_bpg && !bigalloc {
        bpg = max_bpg;
    }
    let cluster_mask = (1u64 << cluster_bits) - 1;
    let desc_size: u32 = match (bit64, p.desc_size) {
        (false, _) => 32,
        (true, 0) => 64,
        (true, d) => d,
    };
    if !(32..=1024).contains(&desc_size) || !desc_size.is_power_of_two() || desc_size > bs {
        return Err(GeometryError::Invalid(format!(
            "descriptor size {desc_size}"
        )));
    }
    let isz = u32::from(p.inode_size);
    let mut blocks = p.blocks_count & !cluster_mask;
    let mut r_blocks = p.r_blocks_count;
    if r_blocks >= blocks {
        return Err(GeometryError::Invalid(
            "reserved blocks exceed the filesystem size".into(),
        ));
    }
    let mut features = features;
    let (groups, desc_blocks, ipg, itb, rsv_gdt) = 'retry: loop {
        let groups64 = div_ceil(blocks - first_data_block, u64::from(bpg));
        if groups64 == 0 {
            return Err(GeometryError::TooSmall("no block groups".into()));
        }
        if groups64 > u64::from(u32::MAX) {
            return Err(GeometryError::Invalid("too many block groups".into()));
        }
        let groups = groups64 as u32;
        let desc_blocks = div_ceil(groups64, u64::from(bs / desc_size)) as u32;
        // s_inodes_count from the request (already computed by the caller).
        let mut inodes = p.inodes_count.min(u64::from(u32::MAX));
        if inodes < 12 {
            inodes = 12; // EXT2_FIRST_INO + 1
        }
        let mut ipg = div_ceil(inodes, groups64);
        if ipg > u64::from(bs) * 8 {
            if !bigalloc && bpg >= 256 {
                bpg -= 8;
                blocks = p.blocks_count;
                continue 'retry;
            }
            return Err(GeometryError::TooManyInodes(inodes.to_string()));
        }
        let max_ipg = u64::from(bs) * 8; // EXT2_MAX_INODES_PER_GROUP = (1<<16) - inodes_per_block; bitmap limit smaller
        let max_ipg = max_ipg.min(65536 - u64::from(bs / isz));
        if ipg > max_ipg {
            ipg = max_ipg;
        }
        let (ipg_final, itb) = loop {
            let mut itb = div_ceil(ipg * u64::from(isz), u64::from(bs));
            let mut ipg2 = itb * u64::from(bs) / u64::from(isz);
            if ipg2 < 8 {
                ipg2 = 8;
            }
            ipg2 &= !7;
            itb = div_ceil(ipg2 * u64::from(isz), u64::from(bs));
            if ipg2 * groups64 > u64::from(u32::MAX) {
                ipg -= 1;
                continue;
            }
            break (ipg2 as u32, itb as u32);
        };
        let mut rsv_gdt = if features.compat.contains(Compat::RESIZE_INODE) {
            match p.reserved_gdt_blocks {
                Some(r) => r,
                None => calc_reserved_gdt_blocks(
                    blocks,
                    first_data_block,
                    bpg,
                    bs,
                    desc_size,
                    desc_blocks,
                ),
            }
        } else {
            0
        };
        if rsv_gdt > bs / 4 {
            return Err(GeometryError::Invalid(format!(
                "{rsv_gdt} reserved GDT blocks is more than {}",
                bs / 4
            )));
        }
        if u64::from(rsv_gdt) + u64::from(desc_blocks) > u64::from(bpg) * 3 / 4 {
            if let Some(r) = p.reserved_gdt_blocks {
                // -E resize=: ext2fs_initialize turns meta_bg on but keeps
                // the requested s_reserved_gdt_blocks (set_field), then
                // counts them in the group overhead.
                if 4 + u64::from(itb) + u64::from(r) > u64::from(bpg) {
                    return Err(GeometryError::TooManyInodes(format!(
                        "{ipg_final} per group with {r} reserved GDT blocks (-E resize=)"
                    )));
                }
                return Err(GeometryError::Invalid(format!(
                    "-E resize= needs {r} reserved GDT blocks, more than 3/4 of a block group with the descriptors: mke2fs 1.47.0 then makes a meta_bg filesystem with s_reserved_gdt_blocks {r}, which e2fsck rejects"
                )));
            }
            features.incompat.insert(Incompat::META_BG);
            features.compat.remove(Compat::RESIZE_INODE);
            rsv_gdt = 0;
        }
        let mut overhead = 3 + u64::from(itb) + u64::from(rsv_gdt);
        if features.incompat.contains(Incompat::META_BG) {
            overhead += 1;
        } else {
            overhead += u64::from(desc_blocks);
        }
        if overhead > u64::from(bpg) {
            return Err(GeometryError::TooManyInodes(format!(
                "{} per group",
                ipg_final
            )));
        }
        let mut overhead = 2 + u64::from(itb);
        // sparse_super2: s_backup_bgs is not clamped yet; initialize.c
        // looks at the requested values.
        let last_has_super = if features.compat.contains(Compat::SPARSE_SUPER2) {
            if groups == 2 {
                p.backup_bgs[0] != 0
            } else {
                p.backup_bgs[1] != 0
            }
        } else {
            has_super(&features, &[0, 0], groups - 1)
        };
        if last_has_super {
            overhead += 1 + u64::from(desc_blocks) + u64::from(rsv_gdt);
        }
        let rem = (blocks - first_data_block) % u64::from(bpg);
        if groups == 1 && rem != 0 && rem < overhead {
            return Err(GeometryError::TooSmall(format!(
                "{blocks} blocks cannot hold the metadata of one group"
            )));
        }
        if rem != 0 && rem < overhead + 50 {
            blocks -= rem;
            let ratio = 100.0 * p.r_blocks_count as f64 / p.blocks_count as f64;
            r_blocks = (ratio * blocks as f64 / 100.0) as u64;
            continue 'retry;
        }
        break (groups, desc_blocks, ipg_final, itb, rsv_gdt);
    };
    let first_meta_bg = if features.incompat.contains(Incompat::META_BG) {
        p.first_meta_bg
    } else {
        0
    };
    if first_meta_bg > desc_blocks {
        // mke2fs writes it, and e2fsck then rejects the superblock
        // ("First_meta_bg is too big").
        return Err(GeometryError::Invalid(format!(
            "first meta block group {first_meta_bg} is past the {desc_blocks} descriptor blocks"
        )));
    }
    if u64::from(ipg) * u64::from(groups) < 11 {
        return Err(GeometryError::TooSmall(format!(
            "only {} inodes fit; at least 11 are needed",
            u64::from(ipg) * u64::from(groups)
        )));
    }
    // The backup locations, now that the group count is known.
    let mut backup_bgs = [0u32; 2];
    if features.compat.contains(Compat::SPARSE_SUPER2) {
        backup_bgs = p.backup_bgs.map(|b| b.min(groups - 1));
        if backup_bgs[0] == backup_bgs[1] {
            backup_bgs[1] = 0;
        }
        if backup_bgs[0] > backup_bgs[1] {
            backup_bgs.swap(0, 1);
        }
    }
    let csum = features.has_group_csum();
    // mke2fs packs the tables whenever flex_bg is on, whatever its size.
    let packed = p.packed_meta_blocks && features.incompat.contains(Incompat::FLEX_BG);
    let log_flex = if features.incompat.contains(Incompat::FLEX_BG) {
        p.log_groups_per_flex
    } else {
        0
    };
    let mut l = Layout {
        block_size: bs,
        blocks_count: blocks,
        r_blocks_count: r_blocks,
        first_data_block,
        blocks_per_group: bpg,
        group_count: groups,
        inodes_per_group: ipg,
        inodes_count: ipg * groups,
        inode_size: p.inode_size,
        inode_blocks_per_group: itb,
        desc_size: if bit64 { desc_size as u16 } else { 0 },
        desc_blocks,
        reserved_gdt_blocks: rsv_gdt,
        first_meta_bg,
        log_groups_per_flex: log_flex,
        features,
        groups: Vec::with_capacity(groups as usize),
        used: BlockSet::new(),
        free_blocks: 0,
        free_inodes: ipg * groups,
        overhead: 0,
        root: FileMap::default(),
        lost_found: FileMap::default(),
        resize_dind: None,
        journal: None,
        journal_blocks: 0,
        journal_fc_blocks: 0,
        backup_bgs,
        mmp_block: None,
        super_only: p.super_only,
        orphan: None,
        first_ino: 11,
        cluster_bits,
        quota: Vec::new(),
        hugefiles: None,
        bad_blocks: None,
        populated: None,
    };
    // Group accounting as ext2fs_initialize leaves it.
    let mut reserved_inos = l.first_ino;
    for g in 0..groups {
        let mut gp = GroupPlan::default();
        if csum {
            if g != groups - 1 {
                gp.flags |= BG_BLOCK_UNINIT;
            }
            gp.flags |= BG_INODE_UNINIT;
            let mut n = ipg;
            if reserved_inos > 0 {
                if n > reserved_inos {
                    n -= reserved_inos;
                    reserved_inos = 0;
                } else {
                    reserved_inos -= n;
                    n = 0;
                }
            }
            gp.itable_unused = n;
        }
        // ext2fs_reserve_super_and_bgd: mark sb + gdt + reserved gdt (or
        // the meta_bg descriptor block).
        if g == 0 && bs == 1024 {
            // Block 0 of a 1 KiB filesystem is outside the groups (or,
            // with bigalloc, in group 0) but used.
            l.used.insert(0, 1);
        }
        let m = l.group_meta(g);
        if let Some(sb) = m.super_blk {
            l.used.insert(sb, 1);
        }
        if let Some(od) = m.old_desc {
            let n = l.old_desc_reserved().min(l.blocks_count.saturating_sub(od));
            if n > 0 {
                l.used.insert(od, n);
            }
        }
        if let Some(nd) = m.new_desc {
            l.used.insert(nd, 1);
        }
        let mut free = l.group_blocks(g) as i64 - m.used as i64 - 2 - i64::from(itb);
        // ext2fs_initialize leaves a group's tables out of its free count
        // only with flex_bg groups; packed_meta_blocks moves them out of
        // every group even with a flex_bg size of 1, where mke2fs 1.47.0
        // still subtracts them (its free counts are then wrong: e2fsck
        // fixes them). The counts here follow the blocks.
        if log_flex > 0 || packed {
            free += 2 + i64::from(itb);
        }
        if free < 0 {
            return Err(GeometryError::TooSmall(format!(
                "group {g} cannot hold its metadata"
            )));
        }
        gp.free_blocks = free as u32;
        gp.free_inodes = ipg;
        l.free_blocks += free as u64;
        l.groups.push(gp);
    }
    l.free_blocks &= !cluster_mask;
    // figure_journal_size runs on the freshly initialized filesystem.
    // (Not with an external journal: mke2fs skips it then.)
    let (journal_request, fc_blocks) = if p.external_journal {
        (None, 0)
    } else {
        figure_journal_size(p, &l)?
    };
    let mut pl = Planner {
        l,
        stride: p.stride,
        clustered: false,
    };
    // handle_bad_blocks: marked before the tables are placed.
    if let Some(list) = &p.bad_blocks {
        super::badblocks::mark(&mut pl, list)?;
    }
    // Tables.
    if packed {
        packed_allocate_tables(&mut pl)?;
    } else {
        for g in 0..groups {
            pl.allocate_group_table(g)?;
        }
    }
    // bigalloc: ext2fs_convert_subcluster_bitmap; from now on blocks are
    // allocated in clusters.
    if cluster_bits > 0 {
        pl.l.used = pl.l.used.round_out(cluster_bits);
        pl.clustered = true;
    }
    // Overhead as mke2fs counts it right after table allocation (clusters).
    let mut overhead = pl.l.used.count_in(first_data_block, pl.l.blocks_count) >> cluster_bits;
    // mke2fs unmarks the bad blocks while it counts.
    if let Some(bb) = &pl.l.bad_blocks {
        overhead -= bb.blocks.len() as u64;
    }
    // The journal, fast-commit area included.
    let journal_blocks = journal_request.map(|j| j + fc_blocks);
    pl.l.journal_fc_blocks = if journal_blocks.is_some() {
        fc_blocks
    } else {
        0
    };
    if p.super_only {
        // mke2fs -S stops here: no inode table zeroing, directories,
        // reserved inodes, resize inode, journal ("Skipping journal
        // creation in super-only mode", s_journal_inum is still set) or
        // MMP block; s_overhead_clusters stays 0. (The writer zeroes
        // every group's itable_unused, as mke2fs does after the
        // descriptor checksums were computed.)
        pl.l.journal_fc_blocks = 0;
        return Ok(pl.l);
    }
    // Inode tables zeroed flags.
    if !p.lazy_itable_init || p.itable_zeroed {
        for gp in &mut pl.l.groups {
            gp.flags |= BG_INODE_ZEROED;
        }
    }
    // Root directory (inode 2), then lost+found (11).
    pl.use_inode(2, true);
    let goal = pl.inode_goal(2);
    pl.l.root = pl.alloc_sequential(goal, 1, "root directory")?;
    // ext2fs_mkdir allocates lost+found's inode with ext2fs_new_inode.
    pl.new_inode_scan(0, 11);
    pl.use_inode(11, true);
    let lpf_blocks = lost_found_blocks(bs);
    pl.l.lost_found = if pl.l.features.incompat.contains(Incompat::INLINE_DATA) {
        // ext2fs_mkdir makes lost+found an inline directory; the first
        // ext2fs_expand_dir converts it into one block found from the
        // first data block (ext2fs_new_block2 with goal 0), the others
        // follow it: one block fewer than without inline_data.
        let first = pl.alloc_block(0, "lost+found")?;
        // (With bigalloc the next ones fill the first one's cluster.)
        let mut fm = pl.alloc_sequential_after(first + 1, lpf_blocks - 2, "lost+found", true)?;
        match fm.runs.first_mut() {
            Some(r) if r.pblk == first + 1 => {
                r.pblk = first;
                r.len += 1;
                for r in fm.runs.iter_mut().skip(1) {
                    r.lblk += 1;
                }
            }
            _ => {
                for r in &mut fm.runs {
                    r.lblk += 1;
                }
                fm.runs.insert(
                    0,
                    Run {
                        lblk: 0,
                        pblk: first,
                        len: 1,
                    },
                );
            }
        }
        fm
    } else {
        let goal = pl.inode_goal(11);
        pl.alloc_sequential(goal, lpf_blocks, "lost+found")?
    };
    // Reserved inodes 3..first_ino-1, then the bad blocks inode.
    for ino in 3..pl.l.first_ino {
        pl.use_inode(ino, false);
    }
    pl.use_inode(1, false);
    let it0 = pl.l.groups[0].inode_table;
    super::badblocks::make_inode(&mut pl, it0)?;
    // Resize inode.
    if pl.l.features.compat.contains(Compat::RESIZE_INODE) {
        let sb_blk = pl.l.sb_block(); // group 0's superblock block
        let goal = sb_blk
            + u64::from(pl.l.desc_blocks)
            + u64::from(pl.l.reserved_gdt_blocks)
            + 2
            + u64::from(itb);
        let dind = pl.alloc_block(goal, "resize inode")?;
        pl.l.resize_dind = Some(dind);
        note_file_size(&mut pl.l, resize_inode_size(bs));
    }
    // Journal.
    match journal_blocks {
        Some(jb) => {
            overhead += u64::from(jb).div_ceil(1 << cluster_bits);
            let goal = if p.packed_meta_blocks {
                0
            } else if let Some(g) = p.journal_location {
                g
            } else {
                midpoint_journal_goal(&pl.l)
            };
            let fm = if pl.l.features.incompat.contains(Incompat::EXTENTS) {
                allocate_extent_file(&mut pl, goal, jb, "journal")?
            } else {
                // ext2fs_fallocate's slow path ignores the goal: blocks
                // come from the inode's own group, in logical order.
                let g = pl.inode_goal(8);
                allocate_block_mapped(&mut pl, g, jb, "journal")?
            };
            pl.l.journal = Some(fm);
            pl.l.journal_blocks = jb;
            note_file_size(&mut pl.l, u64::from(jb) * u64::from(bs));
        }
        None if p.external_journal => {}
        None => {
            pl.l.features.compat.remove(Compat::HAS_JOURNAL);
            pl.l.features.compat.remove(Compat::ORPHAN_FILE);
        }
    }
    // MMP: ext2fs_mmp_init allocates its block right after the journal,
    // from the first data block on (not counted in the overhead).
    if pl.l.features.incompat.contains(Incompat::MMP) {
        pl.l.mmp_block = Some(pl.alloc_block(0, "MMP block")?);
    }
    overhead += first_data_block;
    pl.l.overhead = overhead;
    // Quota files (after fix_cluster_bg_counts, before the orphan file).
    if pl.l.features.ro_compat.contains(RoCompat::QUOTA) {
        super::quota::plan_quota(&mut pl, p)?;
    }
    // Orphan file.
    if pl.l.features.compat.contains(Compat::ORPHAN_FILE) {
        let ino = first_free_inode(&pl.l);
        if ino > pl.l.inodes_count {
            return Err(GeometryError::TooSmall(format!(
                "no inode left for the orphan file ({} inodes)",
                pl.l.inodes_count
            )));
        }
        pl.new_inode_scan(0, ino);
        pl.use_inode(ino, false);
        // The default is rounded up to whole clusters (bigalloc).
        let cmask = (1u32 << cluster_bits) - 1;
        let n = p
            .orphan_file_blocks
            .unwrap_or_else(|| (default_orphan_blocks(pl.l.blocks_count) + cmask) & !cmask);
        // mkorphan_proc starts from goal 0 (its last_blk), not from the
        // inode's group: the first free block of the filesystem.
        let fm = if pl.l.features.incompat.contains(Incompat::EXTENTS) {
            pl.alloc_sequential(0, n, "orphan file")?
        } else {
            allocate_block_mapped(&mut pl, 0, n, "orphan file")?
        };
        if fm.runs.len() > 4 && fm.blockmap.is_none() {
            return Err(GeometryError::Invalid(
                "orphan file too fragmented for this planner".into(),
            ));
        }
        pl.l.orphan = Some((ino, fm));
        note_file_size(&mut pl.l, u64::from(n) * u64::from(bs));
    }
    // mk_hugefiles, last (after fix_cluster_bg_counts: it starts from the
    // recounted free blocks).
    if let Some(hp) = &p.hugefiles {
        if cluster_bits > 0 {
            fix_cluster_counts(&mut pl.l);
        }
        super::hugefiles::plan_hugefiles(&mut pl, hp, p.itable_zeroed)?;
    }
    if cluster_bits > 0 {
        fix_cluster_counts(&mut pl.l);
    }
    Ok(pl.l)
}

/// `figure_journal_size` over `ext2fs_get_journal_params`: the journal
/// blocks and the fast-commit blocks, or `None` when the filesystem has
/// no journal (or is too small for one: < 2048 blocks, whatever `-J
/// size=` asked for). A requested size (journal or fast commit) must make
/// a total of 1024..=10240000 blocks and at most half of the blocks free
/// after `ext2fs_initialize` (`l` as it is then).
fn figure_journal_size(p: &FsParams, l: &Layout) -> Result<(Option<u32>, u32), GeometryError> {
    if !l.features.compat.contains(Compat::HAS_JOURNAL) {
        return Ok((None, 0));
    }
    let Some(default) = default_journal_blocks(l.blocks_count) else {
        return Ok((None, 0));
    };
    let fast_commit = l.features.compat.contains(Compat::FAST_COMMIT);
    let mut journal = default;
    let mut fc = if fast_commit { default / 64 } else { 0 };
    let fc_request = p.journal_fc_blocks.filter(|_| fast_commit);
    if p.journal_blocks.is_some() || fc_request.is_some() {
        if let Some(j) = p.journal_blocks {
            journal = j;
        }
        if let Some(f) = fc_request {
            fc = f;
        }
        // In C int arithmetic, as mke2fs adds them (a wrapped request
        // shows as negative).
        let total = (journal as i32).wrapping_add(fc as i32);
        if !(1024..=10_240_000).contains(&total) {
            return Err(GeometryError::Invalid(format!(
                "the total requested journal size is {total} blocks; it must be between 1024 and 10240000 blocks"
            )));
        }
        if u64::from(total as u32) > l.free_blocks / 2 {
            return Err(GeometryError::TooSmall(format!(
                "total journal size too big for filesystem ({total} blocks requested, {} free)",
                l.free_blocks
            )));
        }
    }
    Ok((Some(journal), fc))
}

/// mke2fs's `fix_cluster_bg_counts`: the free clusters of every group
/// and the free blocks of the filesystem, counted on the cluster bitmap.
/// mke2fs runs it after the journal; the quota and orphan files allocated
/// after it move the counters by whole clusters, so counting at the end
/// gives the same numbers.
fn fix_cluster_counts(l: &mut Layout) {
    let bits = l.cluster_bits;
    let mut total = 0u64;
    for g in 0..l.group_count {
        let first = l.group_first_block(g);
        let end = l.group_last_block(g) + 1;
        let free = (end - first - l.used.count_in(first, end)) >> bits;
        l.groups[g as usize].free_blocks = free as u32;
        total += free << bits;
    }
    l.free_blocks = total;
}

/// `i_size` of the resize inode: the largest file its double-indirect
/// map can describe, as `ext2fs_create_resize_inode` sets it.
pub fn resize_inode_size(block_size: u32) -> u64 {
    let bs = u64::from(block_size);
    let apb = bs / 4;
    (apb * apb + apb + 12) * bs
}

/// A regular file of `size` bytes is being created: like
/// `ext2fs_inode_size_set`, turn on `large_file` once a file reaches
/// 2 GiB (the resize inode of a 4 KiB-block filesystem, a journal of
/// 2 GiB or more), whatever the options asked for.
fn note_file_size(l: &mut Layout, size: u64) {
    if size >= 0x8000_0000 {
        l.features.ro_compat.insert(RoCompat::LARGE_FILE);
    }
}

/// A block-mapped file allocated the way libext2fs's `ext2fs_bmap2`
/// (BMAP_ALLOC) and block iterator do it: each block at the first free
/// block after the previous one, every indirect block just before the
/// first data block it maps.
fn allocate_block_mapped(
    pl: &mut Planner,
    goal: u64,
    n: u32,
    what: &'static str,
) -> Result<FileMap, GeometryError> {
    let apb = u64::from(pl.l.block_size / 4);
    let mut fm = FileMap::default();
    let mut bm = BlockMap::default();
    let mut last = goal;
    let mut next = |pl: &mut Planner| -> Result<u64, GeometryError> {
        let b = pl.alloc_block(last, what)?;
        last = b;
        Ok(b)
    };
    let mut ind: Option<(u64, usize)> = None; // current IND block, index in `indirect`
    let mut dind: Option<(u64, usize)> = None;
    for lblk in 0..u64::from(n) {
        let b;
        if lblk < 12 {
            b = next(pl)?;
            bm.i_block[lblk as usize] = b as u32;
            bm.steps.push(MapStep::Data {
                block: b,
                ind: None,
                dind: None,
            });
        } else if lblk < 12 + apb {
            if lblk == 12 {
                let i = next(pl)?;
                bm.i_block[12] = i as u32;
                bm.indirect.push((i, Vec::new()));
                ind = Some((i, bm.indirect.len() - 1));
                bm.steps.push(MapStep::Meta {
                    block: i,
                    parent: None,
                });
            }
            b = next(pl)?;
            let (i, idx) = ind.ok_or(GeometryError::NoSpace(what))?;
            bm.indirect[idx].1.push(b as u32);
            bm.steps.push(MapStep::Data {
                block: b,
                ind: Some(i),
                dind: None,
            });
        } else if lblk < 12 + apb + apb * apb {
            if lblk == 12 + apb {
                let d = next(pl)?;
                bm.i_block[13] = d as u32;
                bm.indirect.push((d, Vec::new()));
                dind = Some((d, bm.indirect.len() - 1));
                bm.steps.push(MapStep::Meta {
                    block: d,
                    parent: None,
                });
            }
            let (d, didx) = dind.ok_or(GeometryError::NoSpace(what))?;
            if (lblk - 12 - apb) % apb == 0 {
                let i = next(pl)?;
                bm.indirect[didx].1.push(i as u32);
                bm.indirect.push((i, Vec::new()));
                ind = Some((i, bm.indirect.len() - 1));
                bm.steps.push(MapStep::Meta {
                    block: i,
                    parent: Some(d),
                });
            }
            b = next(pl)?;
            let (i, idx) = ind.ok_or(GeometryError::NoSpace(what))?;
            bm.indirect[idx].1.push(b as u32);
            bm.steps.push(MapStep::Data {
                block: b,
                ind: Some(i),
                dind: Some(d),
            });
        } else {
            return Err(GeometryError::Invalid(format!(
                "{what} too large for a block-mapped file"
            )));
        }
        match fm.runs.last_mut() {
            Some(r) if r.pblk + u64::from(r.len) == b => r.len += 1,
            _ => fm.runs.push(Run {
                lblk: lblk as u32,
                pblk: b,
                len: 1,
            }),
        }
    }
    fm.blockmap = Some(bm);
    Ok(fm)
}

/// `ext2fs_new_inode` right after mke2fs's own inodes: inodes
/// 1..=`last_used_ino` are the only ones in use.
pub(super) fn first_free_inode(l: &Layout) -> u32 {
    l.last_used_ino() + 1
}

/// lost+found size in blocks: grow until >= 16 KiB and >= 2 blocks, at
/// most 12 blocks (`create_lost_and_found`).
pub fn lost_found_blocks(bs: u32) -> u32 {
    let mut size = 0u32;
    let mut n = 1u32; // the block from mkdir
    for _ in 1..12 {
        size += bs;
        if size >= 16 * 1024 && size >= 2 * bs {
            break;
        }
        n += 1;
    }
    n
}

/// `get_midpoint_journal_block`.
fn midpoint_journal_goal(l: &Layout) -> u64 {
    let mut group = l.group_of_block((l.blocks_count - l.first_data_block) / 2);
    let log_flex = 1u32 << l.log_groups_per_flex;
    let start;
    if l.log_groups_per_flex > 0 && group > log_flex {
        group &= !(log_flex - 1);
        while group < l.group_count && l.groups[group as usize].free_blocks == 0 {
            group += 1;
        }
        if group == l.group_count {
            group = 0;
        }
        start = group;
    } else {
        start = group.saturating_sub(1);
    }
    let end = if group + 1 < l.group_count {
        group + 1
    } else {
        group
    };
    let mut best = start;
    for i in start + 1..=end {
        if l.groups[i as usize].free_blocks > l.groups[best as usize].free_blocks {
            best = i;
        }
    }
    l.group_first_block(best)
}

/// `ext2fs_fallocate` of a fresh extent-mapped file: contiguous free runs
/// from `goal`, extents of at most 32768 blocks; when a fifth extent is
/// needed the in-inode root is split into one leaf block whose goal is the
/// block before the first extent.
fn allocate_extent_file(
    pl: &mut Planner,
    goal: u64,
    n: u32,
    what: &'static str,
) -> Result<FileMap, GeometryError> {
    let mut fm = FileMap::default();
    let mut lblk: u32 = 0;
    let mut g = goal;
    let (fdb, blocks) = (pl.fdb(), pl.blocks());
    let mask = if pl.clustered {
        pl.l.cluster_ratio() - 1
    } else {
        0
    };
    while lblk < n {
        let start =
            pl.l.used
                .new_block(g & !mask, fdb, blocks)
                .ok_or(GeometryError::NoSpace(what))?;
        let next_used = pl.l.used.next_used(start).unwrap_or(blocks).min(blocks);
        let len = (next_used - start).min(u64::from(n - lblk)) as u32;
        if let Some(r) = fm.runs.last_mut()
            && r.pblk + u64::from(r.len) == start
            && r.len < EXT_INIT_MAX_LEN
        {
            let add = len.min(EXT_INIT_MAX_LEN - r.len);
            r.len += add;
            pl.take(start, u64::from(add));
            lblk += add;
            g = start + u64::from(add);
            continue;
        }
        let add = len.min(EXT_INIT_MAX_LEN);
        fm.runs.push(Run {
            lblk,
            pblk: start,
            len: add,
        });
        pl.take(start, u64::from(add));
        if fm.runs.len() == 5 && fm.leaf.is_none() {
            // The in-inode root is full: inserting the fifth extent (whose
            // blocks ext2fs_fallocate has already claimed) splits it into
            // one leaf block, at the first free block from the one before
            // the first extent.
            let lgoal = fm.runs[0].pblk.saturating_sub(1);
            fm.leaf = Some(pl.alloc_block(lgoal, what)?);
        }
        lblk += add;
        g = start + u64::from(add);
    }
    Ok(fm)
}

/// `packed_allocate_tables` (mke2fs -E packed_meta_blocks).
fn packed_allocate_tables(pl: &mut Planner) -> Result<(), GeometryError> {
    let (fdb, blocks) = (pl.fdb(), pl.blocks());
    let mut goal = pl.l.used.next_free(fdb);
    let groups = pl.l.group_count;
    for g in 0..groups {
        let b =
            pl.l.used
                .new_block(goal, fdb, blocks)
                .ok_or(GeometryError::NoSpace("block bitmap"))?;
        pl.take(b, 1);
        pl.l.groups[g as usize].block_bitmap = b;
        goal = b;
    }
    for g in 0..groups {
        let b =
            pl.l.used
                .new_block(goal, fdb, blocks)
                .ok_or(GeometryError::NoSpace("inode bitmap"))?;
        pl.take(b, 1);
        pl.l.groups[g as usize].inode_bitmap = b;
        goal = b;
    }
    let itb = u64::from(pl.l.inode_blocks_per_group);
    for g in 0..groups {
        let end = pl.l.used.next_used(goal).unwrap_or(blocks);
        let b = if end - goal >= itb {
            goal
        } else {
            pl.l.used
                .get_free_blocks(goal, 0, itb, fdb, blocks)
                .ok_or(GeometryError::NoSpace("inode table"))?
        };
        pl.take(b, itb);
        pl.l.groups[g as usize].inode_table = b;
        goal = b + itb;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_groups_sequence() {
        let v: Vec<u32> = BackupGroups::new(100).collect();
        assert_eq!(v, vec![1, 3, 5, 7, 9, 25, 27, 49, 81]);
        let f = Features {
            ro_compat: RoCompat::SPARSE_SUPER,
            ..Default::default()
        };
        for g in 0..1000 {
            let expect = g == 0 || BackupGroups::new(1000).any(|x| x == g);
            assert_eq!(has_super(&f, &[0, 0], g), expect, "group {g}");
        }
    }

    #[test]
    fn lost_found_sizes() {
        assert_eq!(lost_found_blocks(4096), 4);
        assert_eq!(lost_found_blocks(2048), 8);
        assert_eq!(lost_found_blocks(1024), 12);
        assert_eq!(lost_found_blocks(65536), 2);
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use proptest::prelude::*;

    fn ext4_features(csum: bool, flex: bool, bit64: bool, resize: bool, journal: bool) -> Features {
        let mut f = Features {
            compat: Compat::EXT_ATTR | Compat::DIR_INDEX,
            ..Default::default()
        };
        if resize {
            f.compat.insert(Compat::RESIZE_INODE);
        }
        if journal {
            f.compat.insert(Compat::HAS_JOURNAL);
        }
        f.incompat = Incompat::FILETYPE | Incompat::EXTENTS;
        if flex {
            f.incompat.insert(Incompat::FLEX_BG);
        }
        if bit64 {
            f.incompat.insert(Incompat::BIT64);
        }
        f.ro_compat = RoCompat::SPARSE_SUPER
            | RoCompat::LARGE_FILE
            | RoCompat::HUGE_FILE
            | RoCompat::DIR_NLINK
            | RoCompat::EXTRA_ISIZE;
        if csum {
            f.ro_compat.insert(RoCompat::METADATA_CSUM);
        }
        f
    }

    fn params(bytes: u64, bs: u32, ratio: u64, f: Features) -> FsParams {
        let blocks = bytes / u64::from(bs);
        FsParams {
            blocks_count: blocks,
            block_size: bs,
            inode_size: 256,
            inodes_count: bytes / ratio,
            features: f,
            log_groups_per_flex: if f.incompat.contains(Incompat::FLEX_BG) {
                4
            } else {
                0
            },
            blocks_per_group: 0,
            r_blocks_count: blocks / 20,
            reserved_gdt_blocks: None,
            desc_size: 0,
            first_meta_bg: 0,
            journal_blocks: None,
            orphan_file_blocks: None,
            stride: 0,
            packed_meta_blocks: false,
            root_uid: 0,
            root_gid: 0,
            itable_zeroed: true,
            lazy_itable_init: true,
            backup_bgs: [0, 0],
            journal_fc_blocks: None,
            super_only: false,
            cluster_bits: 0,
            quota_types: 0,
            external_journal: false,
            journal_location: None,
            hugefiles: None,
            bad_blocks: None,
        }
    }

    /// figure_journal_size: a requested journal larger than half the free
    /// blocks of the initialized filesystem is refused, as mke2fs does.
    #[test]
    fn requested_journal_at_most_half_the_free_blocks() {
        let f = ext4_features(true, true, true, true, true);
        let mut p = params(8 << 20, 1024, 4096, f);
        p.journal_blocks = Some(4096);
        let e = plan(&p).unwrap_err().to_string();
        assert!(e.contains("journal size too big"), "{e}");
        p.journal_blocks = Some(3000);
        assert_eq!(plan(&p).expect("plan").journal_blocks, 3000);
    }

    /// `large_file` appears when a file reaches 2 GiB, as
    /// `ext2fs_inode_size_set` turns it on: the resize inode with 4 KiB
    /// blocks (4 GiB + ...), a journal of 2 GiB; not with smaller ones.
    #[test]
    fn large_file_follows_file_sizes() {
        let mut f = ext4_features(false, true, true, true, false);
        f.ro_compat.remove(RoCompat::LARGE_FILE);
        let has = |l: &Layout| l.features.ro_compat.contains(RoCompat::LARGE_FILE);
        assert_eq!(resize_inode_size(4096), 4_299_210_752);
        assert!(has(&plan(&params(1 << 30, 4096, 16384, f)).expect("plan")));
        assert!(!has(&plan(&params(1 << 30, 2048, 16384, f)).expect("plan")));
        f.compat.remove(Compat::RESIZE_INODE);
        assert!(!has(&plan(&params(1 << 30, 4096, 16384, f)).expect("plan")));
        f.compat.insert(Compat::HAS_JOURNAL);
        let mut p = params(10 << 30, 4096, 16384, f);
        p.journal_blocks = Some(524_287);
        assert!(!has(&plan(&p).expect("plan")));
        p.journal_blocks = Some(524_288);
        assert!(has(&plan(&p).expect("plan")));
    }

    /// Values read off `mke2fs -t ext4` (Debian config) on a 1 GiB file.
    #[test]
    fn one_gib_matches_mke2fs() {
        let l = plan(&params(
            1 << 30,
            4096,
            16384,
            ext4_features(true, true, true, true, true),
        ))
        .expect("plan");
        assert_eq!(l.group_count, 8);
        assert_eq!(l.inodes_per_group, 8192);
        assert_eq!(l.reserved_gdt_blocks, 127);
        assert_eq!(l.groups[0].block_bitmap, 129);
        assert_eq!(l.groups[0].inode_bitmap, 137);
        assert_eq!(l.groups[0].inode_table, 145);
        assert_eq!(l.root.runs[0].pblk, 4241);
        assert_eq!(l.lost_found.runs[0].pblk, 4242);
        assert_eq!(l.resize_dind, Some(4246));
        assert_eq!(l.journal_blocks, 8192);
        assert_eq!(l.journal.as_ref().map(|j| j.runs[0].pblk), Some(131072));
        assert_eq!(l.free_blocks, 249189);
        assert_eq!(l.free_inodes, 65525);
    }

    /// meta_bg: descriptor blocks in groups 0, 1 and the last of each
    /// meta group (after the superblock copy where there is one); none
    /// after the other backups; `s_first_meta_bg` keeps the first ones in
    /// the classic table, and one past the descriptor blocks is refused
    /// (mke2fs writes it; e2fsck rejects the superblock).
    #[test]
    fn meta_bg_descriptor_locations() {
        let mut f = ext4_features(true, true, true, false, true);
        f.incompat.insert(Incompat::META_BG);
        let mut p = params(1 << 30, 1024, 16384, f);
        let l = plan(&p).expect("plan");
        assert_eq!((l.desc_per_block(), l.desc_blocks), (16, 8));
        let m = |l: &Layout, g: u32| l.group_meta(g);
        assert_eq!(m(&l, 0).new_desc, Some(2));
        assert_eq!(m(&l, 0).old_desc, None);
        assert_eq!(m(&l, 1).new_desc, Some(8193 + 1));
        assert_eq!(m(&l, 15).new_desc, Some(1 + 15 * 8192));
        assert_eq!(m(&l, 3).new_desc, None);
        assert_eq!(m(&l, 3).super_blk, Some(1 + 3 * 8192));
        assert_eq!(m(&l, 16).new_desc, Some(1 + 16 * 8192));
        assert_eq!(l.reserved_gdt_blocks, 0);
        p.first_meta_bg = 3;
        let l = plan(&p).expect("plan");
        assert_eq!(m(&l, 0).old_desc, Some(2));
        assert_eq!(m(&l, 1).used, 1 + 3);
        assert_eq!(l.old_desc_written(), 3);
        assert_eq!(m(&l, 47).new_desc, None, "meta group 2 is classic");
        assert_eq!(m(&l, 48).new_desc, Some(1 + 48 * 8192));
        p.first_meta_bg = 9;
        assert!(plan(&p).is_err());
        // Too many descriptor blocks for the group: meta_bg by itself.
        let f = ext4_features(true, true, true, true, true);
        let mut p = params(64 << 20, 1024, 16384, f);
        p.blocks_per_group = 256;
        let l = plan(&p).expect("plan");
        assert!(l.features.incompat.contains(Incompat::META_BG));
        assert!(!l.features.compat.contains(Compat::RESIZE_INODE));
    }

    /// sparse_super2: s_backup_bgs clamped to the last group (and sorted,
    /// a duplicate dropped), superblock copies only there, and the resize
    /// inode's backups follow them.
    #[test]
    fn sparse_super2_backups() {
        let mut f = ext4_features(true, true, true, true, true);
        f.compat.insert(Compat::SPARSE_SUPER2);
        let mut p = params(1 << 30, 4096, 16384, f);
        p.backup_bgs = [1, !0];
        let l = plan(&p).expect("plan");
        assert_eq!(l.backup_bgs, [1, 7]);
        assert_eq!(l.backup_groups().collect::<Vec<_>>(), vec![1, 7]);
        assert!(l.group_meta(3).super_blk.is_none());
        assert_eq!(l.group_meta(7).super_blk, Some(7 * 32768));
        p.backup_bgs = [1, 0];
        let l = plan(&p).expect("plan");
        assert_eq!(l.backup_bgs, [0, 1]);
        assert_eq!(l.backup_groups().collect::<Vec<_>>(), vec![1]);
        p.backup_bgs = [0, 0];
        let l = plan(&p).expect("plan");
        assert_eq!(l.backup_groups().count(), 0);
        // One group: both requests clamp to group 0, i.e. none.
        let mut p = params(64 << 20, 4096, 16384, f);
        p.backup_bgs = [1, !0];
        let l = plan(&p).expect("plan");
        assert_eq!((l.group_count, l.backup_bgs), (1, [0, 0]));
    }

    /// fast_commit: 1/64 of the default journal size on top of the
    /// journal, also when the journal size is given; fast_commit_size
    /// replaces it; both count against the limits.
    #[test]
    fn fast_commit_journal_size() {
        let mut f = ext4_features(true, true, true, true, true);
        f.compat.insert(Compat::FAST_COMMIT);
        let mut p = params(1 << 30, 4096, 16384, f);
        let l = plan(&p).expect("plan");
        assert_eq!((l.journal_blocks, l.journal_fc_blocks), (8192 + 128, 128));
        p.journal_blocks = Some(16384);
        let l = plan(&p).expect("plan");
        assert_eq!((l.journal_blocks, l.journal_fc_blocks), (16384 + 128, 128));
        p.journal_fc_blocks = Some(25);
        let l = plan(&p).expect("plan");
        assert_eq!((l.journal_blocks, l.journal_fc_blocks), (16384 + 25, 25));
        p.journal_fc_blocks = Some(200_000);
        assert!(plan(&p).is_err(), "more than half the free blocks");
        f.compat.remove(Compat::FAST_COMMIT);
        let mut p = params(1 << 30, 4096, 16384, f);
        p.journal_fc_blocks = Some(25);
        let l = plan(&p).expect("plan");
        assert_eq!((l.journal_blocks, l.journal_fc_blocks), (8192, 0));
    }

    /// -S: the plan stops after the group tables.
    #[test]
    fn super_only_plan() {
        let f = ext4_features(true, true, true, true, true);
        let mut p = params(1 << 30, 4096, 16384, f);
        let full = plan(&p).expect("plan");
        p.super_only = true;
        let l = plan(&p).expect("plan");
        assert!(l.super_only && l.journal.is_none() && l.resize_dind.is_none());
        assert_eq!(l.free_inodes, l.inodes_count);
        assert_eq!(l.overhead, 0);
        assert!(l.free_blocks > full.free_blocks);
        assert!(l.features.compat.contains(Compat::HAS_JOURNAL));
        let tables: Vec<_> = l.groups.iter().map(|g| g.inode_table).collect();
        let full_tables: Vec<_> = full.groups.iter().map(|g| g.inode_table).collect();
        assert_eq!(tables, full_tables);
    }

    /// 262244 blocks: the 100-block last group is dropped (notes §1.3).
    #[test]
    fn short_last_group_is_trimmed() {
        let l = plan(&params(
            262_244 * 4096,
            4096,
            16384,
            ext4_features(true, true, true, true, true),
        ))
        .expect("plan");
        assert_eq!(l.blocks_count, 262_144);
    }

    #[test]
    fn one_k_blocks_start_at_block_one() {
        let l = plan(&params(
            256 << 20,
            1024,
            4096,
            ext4_features(true, true, true, true, true),
        ))
        .expect("plan");
        assert_eq!(l.first_data_block, 1);
        assert_eq!(l.reserved_gdt_blocks, 256);
        // Group 15's table jumps over group 1's backup (notes §3.3).
        assert_eq!(l.groups[15].inode_table, 8452);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the size and features, the plan is self-consistent:
        /// counts add up, metadata lies inside the filesystem without
        /// overlaps, and group accounting matches the used-block set.
        #[test]
        fn plan_is_consistent(
            mib in 2u64..200_000,
            bs_log in 0u32..3,
            csum: bool, flex: bool, journal: bool, resize: bool,
        ) {
            let bs = 1024u32 << bs_log;
            let f = ext4_features(csum, flex, true, resize, journal);
            let Ok(l) = plan(&params(mib << 20, bs, 16384, f)) else { return Ok(()); };
            prop_assert_eq!(l.inodes_count, l.inodes_per_group * l.group_count);
            prop_assert_eq!(l.inodes_per_group % 8, 0);
            prop_assert!(l.blocks_count <= (mib << 20) / u64::from(bs));
            let sum_free: u64 = l.groups.iter().map(|g| u64::from(g.free_blocks)).sum();
            prop_assert_eq!(sum_free, l.free_blocks);
            let sum_ifree: u64 = l.groups.iter().map(|g| u64::from(g.free_inodes)).sum();
            prop_assert_eq!(sum_ifree, u64::from(l.free_inodes));
            for g in 0..l.group_count {
                let first = l.group_first_block(g);
                let last = l.group_last_block(g);
                let used = l.used.count_in(first, last + 1);
                prop_assert_eq!(u64::from(l.groups[g as usize].free_blocks), last + 1 - first - used, "group {}", g);
                let gp = &l.groups[g as usize];
                prop_assert!(gp.inode_table + u64::from(l.inode_blocks_per_group) <= l.blocks_count);
                prop_assert!(gp.block_bitmap < l.blocks_count && gp.inode_bitmap < l.blocks_count);
                if !flex {
                    prop_assert!(gp.inode_table >= first && gp.inode_table + u64::from(l.inode_blocks_per_group) <= last + 1);
                }
                if csum {
                    prop_assert!(gp.itable_unused <= gp.free_inodes);
                }
            }
            prop_assert_eq!(l.groups[l.group_count as usize - 1].flags & BG_BLOCK_UNINIT, 0);
            // Tables never overlap each other.
            let mut spans: Vec<(u64, u64)> = l.groups.iter().flat_map(|g| [
                (g.block_bitmap, g.block_bitmap + 1),
                (g.inode_bitmap, g.inode_bitmap + 1),
                (g.inode_table, g.inode_table + u64::from(l.inode_blocks_per_group)),
            ]).collect();
            spans.sort();
            for w in spans.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "overlap {:?}", w);
            }
        }
    }
}
