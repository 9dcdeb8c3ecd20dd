//! The group-descriptor table and the static layout of block groups, as the
//! allocators need them: where each group starts, which blocks of it the
//! superblock/descriptor backups take (`ext4_num_base_meta_clusters`), where
//! descriptor blocks live (meta_bg included), and a descriptor-checksummed
//! read of the whole table through [`BlockRead`].
//!
//! Small and self-contained on purpose: the mount and the transaction layer
//! can take [`Layout`] and [`read_descriptors`] as they are, or replace them
//! with their own table and keep the allocators.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::thread::{self, ThreadId};

use ext4kit_format::features::{Incompat, RoCompat};
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::layout::{Backups, DescLayout};
use ext4kit_format::{Csum, Superblock};

use crate::{BlockRead, FsError};

/// Static numbers of a filesystem, derived once from its superblock.
#[derive(Clone, Debug)]
pub struct Layout {
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: u32,
    pub first_ino: u32,
    pub group_count: u32,
    /// Bytes per descriptor (32 or 64).
    pub desc_size: usize,
    pub desc_per_block: u32,
    /// Blocks of the descriptor table (`s_gdb_count`).
    pub desc_blocks: u32,
    pub reserved_gdt_blocks: u32,
    /// Blocks of one inode table.
    pub itable_blocks: u32,
    /// Groups per flex group (1 without flex_bg).
    pub flex_size: u32,
    pub meta_bg: bool,
    pub first_meta_bg: u32,
    backups: Backups,
    /// Descriptor checksums (metadata_csum or gdt_csum) are kept, and with
    /// them `bg_itable_unused` and the UNINIT flags.
    pub group_csum: bool,
    pub csum: Csum,
    /// Bigalloc: `s_log_cluster_size - s_log_block_size` (0 without it).
    /// The allocator keeps blocks; its bitmaps and descriptor counts on
    /// disk are in clusters of `1 << cluster_bits` blocks.
    pub cluster_bits: u32,
}

fn bad_sb(detail: impl Into<String>) -> FsError {
    FsError::corrupt("superblock", detail)
}

impl Layout {
    /// Derive the layout from a parsed superblock (bigalloc: clusters of
    /// `1 << cluster_bits` blocks); refuses what the allocators do not
    /// handle and impossible numbers.
    pub fn from_superblock(sb: &Superblock) -> Result<Self, FsError> {
        let block_size = sb
            .block_size()
            .ok_or_else(|| bad_sb("block size out of range"))?;
        let ro = RoCompat(sb.s_feature_ro_compat.get());
        let inc = Incompat(sb.s_feature_incompat.get());
        let mut cluster_bits = 0;
        if ro.contains(RoCompat::BIGALLOC) {
            let (lc, lb) = (sb.s_log_cluster_size.get(), sb.s_log_block_size.get());
            if lc < lb || lc - lb > 16 {
                return Err(bad_sb(format!("log cluster size {lc}")));
            }
            cluster_bits = lc - lb;
        }
        let bpg = sb.s_blocks_per_group.get();
        let ipg = sb.s_inodes_per_group.get();
        if cluster_bits > 0 {
            let cpg = sb.s_clusters_per_group.get();
            // The allocator's packed counts hold 2^19 blocks per group.
            if cpg == 0
                || cpg > block_size * 8
                || !cpg.is_multiple_of(8)
                || u64::from(cpg) << cluster_bits != u64::from(bpg)
                || bpg > 1 << 19
            {
                return Err(bad_sb(format!(
                    "clusters per group {cpg}, blocks per group {bpg}"
                )));
            }
            if sb.s_first_data_block.get() != 0
                || !sb.blocks_count().is_multiple_of(1 << cluster_bits)
            {
                return Err(bad_sb("bigalloc groups not cluster aligned"));
            }
        } else if bpg == 0 || bpg > block_size * 8 || !bpg.is_multiple_of(8) {
            return Err(bad_sb(format!("blocks per group {bpg}")));
        }
        if ipg == 0 || ipg > block_size * 8 || !ipg.is_multiple_of(8) {
            return Err(bad_sb(format!("inodes per group {ipg}")));
        }
        let blocks_count = sb.blocks_count();
        let first_data_block = u64::from(sb.s_first_data_block.get());
        if blocks_count <= first_data_block {
            return Err(bad_sb(format!("blocks count {blocks_count}")));
        }
        let groups = (blocks_count - first_data_block).div_ceil(u64::from(bpg));
        let group_count =
            u32::try_from(groups).map_err(|_| bad_sb(format!("{groups} block groups")))?;
        if u64::from(group_count) * u64::from(ipg) != u64::from(sb.s_inodes_count.get()) {
            return Err(bad_sb(format!(
                "inodes count {} != {group_count} groups x {ipg}",
                sb.s_inodes_count.get()
            )));
        }
        let desc_size = usize::from(sb.desc_size());
        if !(32..=1024).contains(&desc_size) || !desc_size.is_power_of_two() {
            return Err(bad_sb(format!("descriptor size {desc_size}")));
        }
        let desc_per_block = block_size / desc_size as u32;
        let desc_blocks = group_count.div_ceil(desc_per_block);
        let inode_size = u32::from(sb.s_inode_size.get());
        if inode_size < 128 || inode_size > block_size || !inode_size.is_power_of_two() {
            return Err(bad_sb(format!("inode size {inode_size}")));
        }
        let itable_blocks = (ipg * inode_size).div_ceil(block_size);
        let flex_size = if inc.contains(Incompat::FLEX_BG) {
            let log = sb.s_log_groups_per_flex;
            if log > 31 {
                return Err(bad_sb(format!("log groups per flex {log}")));
            }
            1u32 << log
        } else {
            1
        };
        Ok(Layout {
            block_size,
            blocks_count,
            first_data_block,
            blocks_per_group: bpg,
            inodes_per_group: ipg,
            inodes_count: sb.s_inodes_count.get(),
            inode_size,
            first_ino: sb.s_first_ino.get().max(11),
            group_count,
            desc_size,
            desc_per_block,
            desc_blocks,
            reserved_gdt_blocks: u32::from(sb.s_reserved_gdt_blocks.get()),
            itable_blocks,
            flex_size,
            meta_bg: inc.contains(Incompat::META_BG),
            first_meta_bg: sb.s_first_meta_bg.get(),
            backups: Backups::of(sb),
            group_csum: ro.contains(RoCompat::METADATA_CSUM) || ro.contains(RoCompat::GDT_CSUM),
            csum: Csum::from_superblock(sb),
            cluster_bits,
        })
    }

    /// First block of group `g`.
    pub fn group_start(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Blocks in group `g` (the last group may be short).
    pub fn blocks_in_group(&self, g: u32) -> u32 {
        let start = self.group_start(g);
        self.blocks_count
            .saturating_sub(start)
            .min(u64::from(self.blocks_per_group)) as u32
    }

    /// The group holding block `blk` (`blk >= first_data_block`).
    pub fn group_of(&self, blk: u64) -> u32 {
        (blk.saturating_sub(self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }

    /// The flex group of `g`.
    pub fn flex_of(&self, g: u32) -> u32 {
        g / self.flex_size
    }

    /// Number of flex groups.
    pub fn flex_count(&self) -> u32 {
        self.group_count.div_ceil(self.flex_size)
    }

    /// Does group `g` hold a superblock backup (`ext4_bg_has_super`)?
    pub fn has_super(&self, g: u32) -> bool {
        self.backups.has_super(g)
    }

    /// Blocks at the start of group `g` taken by the superblock backup, the
    /// descriptor blocks and the reserved GDT blocks: the kernel's
    /// `ext4_num_base_meta_clusters`.
    pub fn base_meta_blocks(&self, g: u32) -> u32 {
        let sup = u32::from(self.has_super(g));
        if !self.meta_bg
            || u64::from(g) < u64::from(self.first_meta_bg) * u64::from(self.desc_per_block)
        {
            if sup == 0 {
                return 0;
            }
            let gdb = if self.meta_bg {
                self.first_meta_bg
            } else {
                self.desc_blocks
            };
            sup + gdb + self.reserved_gdt_blocks
        } else {
            let r = g % self.desc_per_block;
            let meta = u32::from(r == 0 || r == 1 || r == self.desc_per_block - 1);
            sup + meta
        }
    }

    /// Block number of primary descriptor block `i` (`descriptor_loc`).
    pub fn desc_block(&self, i: u32) -> u64 {
        DescLayout {
            gdt_start: ext4kit_format::layout::gdt_start(self.block_size),
            first_data_block: self.first_data_block,
            blocks_per_group: self.blocks_per_group,
            descs_per_block: self.desc_per_block,
            first_meta_bg: self.meta_bg.then_some(self.first_meta_bg),
            backups: self.backups,
        }
        .primary(i)
    }

    /// Index of the descriptor block holding group `g`'s descriptor.
    pub fn desc_block_of(&self, g: u32) -> u32 {
        g / self.desc_per_block
    }

    /// Inodes per inode-table block.
    pub fn inodes_per_block(&self) -> u32 {
        self.block_size / self.inode_size
    }

    /// Bytes of a block bitmap that its checksum covers.
    pub fn block_bitmap_bytes(&self) -> usize {
        (self.blocks_per_group >> self.cluster_bits) as usize / 8
    }

    /// Bytes of an inode bitmap that its checksum covers.
    pub fn inode_bitmap_bytes(&self) -> usize {
        self.inodes_per_group as usize / 8
    }

    /// Store a bitmap checksum as the kernel does: the high half only with
    /// 64-byte descriptors.
    pub fn bitmap_csum(&self, bytes: &[u8]) -> u32 {
        let c = self.csum.bitmap(bytes);
        if self.desc_size >= 64 { c } else { c & 0xFFFF }
    }

    /// Does a stored bitmap checksum match `bytes`? Always true without
    /// metadata_csum.
    pub fn bitmap_csum_ok(&self, stored: u32, bytes: &[u8]) -> bool {
        !self.csum.metadata || self.bitmap_csum(bytes) == stored
    }
}

/// Descriptor blocks read per request when the table is scanned.
const SCAN_BLOCKS: u32 = 256;

/// Visit descriptor blocks `0..nblocks` (block `i` lives at `loc(i)`),
/// reading each physically contiguous run in large requests through
/// [`BlockRead::read_blocks`] (at most `SCAN_BLOCKS` blocks, so memory
/// stays bounded): `f(i, block number, bytes)`.
pub fn scan_desc_blocks(
    rd: &dyn BlockRead,
    nblocks: u32,
    loc: impl Fn(u32) -> u64,
    mut f: impl FnMut(u32, u64, &[u8]) -> Result<(), FsError>,
) -> Result<(), FsError> {
    let bs = rd.block_size() as usize;
    let mut buf = Vec::new();
    let mut i = 0;
    while i < nblocks {
        let first = loc(i);
        let mut n = 1;
        while i + n < nblocks && n < SCAN_BLOCKS && loc(i + n) == first + u64::from(n) {
            n += 1;
        }
        buf.resize(n as usize * bs, 0);
        rd.read_blocks(first, &mut buf)?;
        for (k, raw) in buf.chunks(bs).enumerate() {
            f(i + k as u32, first + k as u64, raw)?;
        }
        i += n;
    }
    Ok(())
}

/// Check one descriptor (checksum unless `csum` is false, locations inside
/// the filesystem, counts that fit the group).
fn check_desc(layout: &Layout, g: u32, d: &GroupDesc, csum: bool) -> Result<(), FsError> {
    if csum && !d.checksum_ok(&layout.csum, g, layout.desc_size) {
        return Err(FsError::corrupt(
            "group descriptor",
            format!("group {g}: checksum mismatch"),
        ));
    }
    let itb = u64::from(layout.itable_blocks);
    for (what, s, n) in [
        ("block bitmap", d.block_bitmap(), 1),
        ("inode bitmap", d.inode_bitmap(), 1),
        ("inode table", d.inode_table(), itb),
    ] {
        if s < layout.first_data_block || s.saturating_add(n) > layout.blocks_count {
            return Err(FsError::corrupt(
                "group descriptor",
                format!("group {g}: {what} at block {s} is outside the filesystem"),
            ));
        }
    }
    if d.free_blocks() > layout.blocks_in_group(g) {
        return Err(FsError::corrupt(
            "group descriptor",
            format!("group {g}: free blocks count {}", d.free_blocks()),
        ));
    }
    if d.free_inodes() > layout.inodes_per_group || d.itable_unused() > layout.inodes_per_group {
        return Err(FsError::corrupt(
            "group descriptor",
            format!("group {g}: free or unused inodes count too large"),
        ));
    }
    Ok(())
}

/// Visit every group descriptor of the primary table in group order,
/// each checked (checksum, locations inside the filesystem, counts); the
/// table is read in large sequential requests and never held whole.
pub fn for_each_descriptor(
    layout: &Layout,
    rd: &dyn BlockRead,
    f: impl FnMut(u32, &GroupDesc) -> Result<(), FsError>,
) -> Result<(), FsError> {
    scan_descriptors(layout, rd, true, f)
}

/// [`for_each_descriptor`] without the checksums, for a further pass over
/// a table the caller has just checked (locations and counts are still
/// checked: they are cheap and keep the numbers in range).
pub fn for_each_descriptor_checked_before(
    layout: &Layout,
    rd: &dyn BlockRead,
    f: impl FnMut(u32, &GroupDesc) -> Result<(), FsError>,
) -> Result<(), FsError> {
    scan_descriptors(layout, rd, false, f)
}

fn scan_descriptors(
    layout: &Layout,
    rd: &dyn BlockRead,
    csum: bool,
    mut f: impl FnMut(u32, &GroupDesc) -> Result<(), FsError>,
) -> Result<(), FsError> {
    let ds = layout.desc_size;
    let per = layout.desc_per_block;
    scan_desc_blocks(
        rd,
        layout.desc_blocks,
        |i| layout.desc_block(i),
        |i, _, raw| {
            for k in 0..per {
                let g = i * per + k;
                if g >= layout.group_count {
                    break;
                }
                let off = k as usize * ds;
                let d = GroupDesc::parse(&raw[off..off + ds])
                    .ok_or_else(|| FsError::corrupt("group descriptor", format!("group {g}")))?;
                check_desc(layout, g, &d, csum)?;
                f(g, &d)?;
            }
            Ok(())
        },
    )
}

/// Read and check every group descriptor of the primary table (see
/// [`for_each_descriptor`]; this one holds them all: tests and tools).
pub fn read_descriptors(layout: &Layout, rd: &dyn BlockRead) -> Result<Vec<GroupDesc>, FsError> {
    let mut out = Vec::with_capacity(layout.group_count as usize);
    for_each_descriptor(layout, rd, |_, d| {
        out.push(d.clone());
        Ok(())
    })?;
    Ok(out)
}

/// What changed in one group since the caller last took the dirty set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupDirty {
    pub group: u32,
    /// The block bitmap must be rewritten (render it).
    pub block_bitmap: bool,
    /// The inode bitmap must be rewritten.
    pub inode_bitmap: bool,
}

/// Groups whose bitmaps or descriptor changed. Every entry implies that
/// the group's descriptor changed too.
///
/// Kept **per thread**: a change is recorded for the thread that made it,
/// which is the thread running the operation (an [`crate::fs::Op`] never
/// leaves its thread), so [`DirtySet::take_mine`] at the end of an
/// operation renders the groups *that* operation changed, into its own
/// handle, however many other operations run at the same time (their
/// groups are theirs to render, with their own credits).
/// [`DirtySet::take`] takes every thread's (tests and tools with one
/// thread).
#[derive(Debug, Default)]
pub struct DirtySet {
    inner: Mutex<HashMap<ThreadId, Marks>>,
}

/// Dirty groups -> (block bitmap, inode bitmap) changed.
type Marks = BTreeMap<u32, (bool, bool)>;

fn listed(m: Marks) -> Vec<GroupDirty> {
    m.into_iter()
        .map(|(group, (b, i))| GroupDirty {
            group,
            block_bitmap: b,
            inode_bitmap: i,
        })
        .collect()
}

impl DirtySet {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ThreadId, Marks>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Group `group` changed (for the calling thread's operation).
    pub fn mark(&self, group: u32, block_bitmap: bool, inode_bitmap: bool) {
        let mut m = self.map();
        let e = m
            .entry(thread::current().id())
            .or_default()
            .entry(group)
            .or_default();
        e.0 |= block_bitmap;
        e.1 |= inode_bitmap;
    }

    /// Take (and clear) every thread's dirty groups, in group order.
    pub fn take(&self) -> Vec<GroupDirty> {
        let all = std::mem::take(&mut *self.map());
        let mut merged = Marks::new();
        for (g, (b, i)) in all.into_values().flatten() {
            let e = merged.entry(g).or_default();
            e.0 |= b;
            e.1 |= i;
        }
        listed(merged)
    }

    /// Take (and clear) the calling thread's dirty groups, in group order.
    pub fn take_mine(&self) -> Vec<GroupDirty> {
        let mine = self.map().remove(&thread::current().id());
        listed(mine.unwrap_or_default())
    }

    /// Whether the calling thread changed a group it has not taken yet.
    pub fn has_mine(&self) -> bool {
        self.map()
            .get(&thread::current().id())
            .is_some_and(|m| !m.is_empty())
    }

    /// Every thread's dirty groups without clearing them.
    pub fn peek(&self) -> Vec<GroupDirty> {
        let m = self.map();
        let mut merged = Marks::new();
        for (&g, &(b, i)) in m.values().flatten() {
            let e = merged.entry(g).or_default();
            e.0 |= b;
            e.1 |= i;
        }
        listed(merged)
    }
}

/// Descriptor blocks whose parsed bytes [`DescTable`] keeps for
/// untouched groups.
const MEMO_BLOCKS: usize = 64;

/// The current group descriptors. Only descriptors changed since open
/// are held (the allocators' rendering,
/// [`crate::ialloc::InodeAlloc::render_group`], stores each changed
/// group's new descriptor here); an untouched group's descriptor is the
/// one in the table on disk, read through the caller's [`BlockRead`]
/// (the descriptors of a few recently read blocks are kept: they never
/// change). Memory is bounded by the groups changed, not by the
/// filesystem's size. [`DescTable::block_image`] serializes a whole
/// descriptor block for the journal.
#[derive(Debug)]
pub struct DescTable {
    layout: Layout,
    changed: std::sync::RwLock<BTreeMap<u32, GroupDesc>>,
    /// Descriptor block index -> its bytes as opened (untouched groups
    /// only are ever taken from it).
    memo: Mutex<std::collections::HashMap<u32, std::sync::Arc<[u8]>>>,
}

impl DescTable {
    /// Check the primary descriptor table (see [`for_each_descriptor`]);
    /// nothing of it is kept.
    pub fn read(layout: Layout, rd: &dyn BlockRead) -> Result<Self, FsError> {
        for_each_descriptor(&layout, rd, |_, _| Ok(()))?;
        Ok(Self::new(layout))
    }

    /// Without reading anything: the caller has checked the table.
    pub fn new(layout: Layout) -> Self {
        DescTable {
            layout,
            changed: std::sync::RwLock::new(BTreeMap::new()),
            memo: Mutex::new(std::collections::HashMap::new()),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn base_block(&self, rd: &dyn BlockRead, i: u32) -> Result<std::sync::Arc<[u8]>, FsError> {
        if let Some(b) = self.memo.lock().unwrap_or_else(|e| e.into_inner()).get(&i) {
            return Ok(b.clone());
        }
        let b: std::sync::Arc<[u8]> = rd.block(self.layout.desc_block(i))?.into();
        let mut m = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= MEMO_BLOCKS {
            m.clear();
        }
        m.insert(i, b.clone());
        Ok(b)
    }

    /// Group `g`'s current descriptor.
    pub fn get(&self, rd: &dyn BlockRead, g: u32) -> Result<GroupDesc, FsError> {
        let l = &self.layout;
        if g >= l.group_count {
            return Err(FsError::InvalidRequest(format!("group {g} does not exist")));
        }
        if let Some(d) = self
            .changed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&g)
        {
            return Ok(d.clone());
        }
        let i = l.desc_block_of(g);
        let b = self.base_block(rd, i)?;
        let off = (g % l.desc_per_block) as usize * l.desc_size;
        b.get(off..off + l.desc_size)
            .and_then(GroupDesc::parse)
            .ok_or_else(|| FsError::corrupt("group descriptor", format!("group {g}")))
    }

    /// Replace group `g`'s descriptor (the caller has set its checksum).
    pub fn set(&self, g: u32, d: GroupDesc) {
        if g < self.layout.group_count {
            self.changed
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(g, d);
        }
    }

    /// Number of descriptors held (changed since open).
    pub fn changed_count(&self) -> usize {
        self.changed.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Descriptor block `i` as it must be written: `(block number,
    /// bytes)`: the block as `rd` has it with every changed descriptor
    /// of it put in.
    pub fn block_image(&self, rd: &dyn BlockRead, i: u32) -> Result<(u64, Vec<u8>), FsError> {
        let l = &self.layout;
        let blk = l.desc_block(i);
        let mut buf = rd.block(blk)?;
        let first = i * l.desc_per_block;
        let v = self.changed.read().unwrap_or_else(|e| e.into_inner());
        for (&g, d) in v.range(first..first.saturating_add(l.desc_per_block)) {
            let off = (g - first) as usize * l.desc_size;
            let n = l.desc_size.min(64);
            buf[off..off + n].copy_from_slice(d.on_disk(l.desc_size));
        }
        Ok((blk, buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sb::Volume;
    use ext4kit::testing::MemImage;
    use ext4kit_format::features::RoCompat;

    /// 1 KiB blocks with bigalloc (s_first_data_block 0): the loader
    /// ([`crate::sb::FsInfo::desc_block`]) and this layout both put the
    /// descriptor table at block 2, where mkfs wrote it (group 0's
    /// descriptor there checks). They disagreed before (block 1 here).
    #[test]
    fn bigalloc_1k_descriptor_table_at_block_2() {
        let mut m = MemImage::new(32 << 20, 1024, 16384);
        m.features = vec!["bigalloc".into()];
        // 8192-block groups (-g counts clusters with bigalloc), within
        // this layout's bitmap bound.
        m.blocks_per_group = Some(512);
        let dev = m.make().unwrap();
        let vol = Volume::open(&dev).unwrap();
        assert_eq!(vol.info.first_data_block, 0);
        assert_eq!(vol.info.desc_block(0), 2);
        // The layout numbers are the same without the flag.
        let mut sb = vol.info.sb.clone();
        let ro = sb.s_feature_ro_compat.get() & !RoCompat::BIGALLOC.bits();
        sb.s_feature_ro_compat.set(ro);
        let l = Layout::from_superblock(&sb).unwrap();
        assert_eq!(l.first_data_block, 0);
        assert_eq!(l.desc_block(0), vol.info.desc_block(0));
        // And group 0's descriptor read from there is the checked one.
        assert!(vol.fs().group_desc(0).is_ok());
    }
}
