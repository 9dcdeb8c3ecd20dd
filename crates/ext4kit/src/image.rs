//! An existing ext4 filesystem opened through a [`Device`]: the primary
//! superblock, the primary group descriptor table and the geometry derived
//! from them, all validated before anything else looks at them.
//!
//! [`Image::open`] refuses anything that is not a plausible ext4 filesystem
//! with a precise, one-line reason ([`ImageError`]): no magic, a bad
//! superblock or descriptor checksum, counts that contradict each other, a
//! device shorter than the filesystem, features whose layout this module
//! does not understand (external journal devices). With `meta_bg` the
//! descriptor blocks from `s_first_meta_bg` on are read from the first
//! group of their meta group (e2fsprogs' `ext2fs_descriptor_block_loc2`).
//!
//! [`Image::open_for_update`] additionally refuses what must not be written
//! to without a full check first: a filesystem that needs journal recovery
//! (the journal may hold newer descriptors), one not cleanly unmounted or
//! marked as having errors, `mmp`, unknown read-only-compatible features.
//!
//! The only write this module offers is [`Image::write_desc_block`]: it
//! recomputes the checksum of every descriptor held by one block of the
//! primary table and writes that block. Backup tables are never touched.

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::layout::{Backups, DescLayout};
use ext4kit_format::superblock::{
    EXT4_MAGIC, STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use ext4kit_format::{Csum, Features};

/// Offset of `bg_flags` inside a descriptor.
const DESC_FLAGS_OFF: usize = 0x12;
/// Offset of `bg_checksum` inside a descriptor.
const DESC_CSUM_OFF: usize = 0x1E;
/// First inode number usable by files on a revision-0 filesystem.
const GOOD_OLD_FIRST_INO: u32 = 11;
/// Inode size on a revision-0 filesystem.
const GOOD_OLD_INODE_SIZE: u32 = 128;

/// Incompatible features whose on-disk layout this module understands.
const KNOWN_INCOMPAT: u32 = Incompat::FILETYPE.bits()
    | Incompat::RECOVER.bits()
    | Incompat::EXTENTS.bits()
    | Incompat::BIT64.bits()
    | Incompat::META_BG.bits()
    | Incompat::MMP.bits()
    | Incompat::FLEX_BG.bits()
    | Incompat::EA_INODE.bits()
    | Incompat::DIRDATA.bits()
    | Incompat::CSUM_SEED.bits()
    | Incompat::LARGEDIR.bits()
    | Incompat::INLINE_DATA.bits()
    | Incompat::ENCRYPT.bits()
    | Incompat::CASEFOLD.bits();

/// Read-only-compatible features known to the kernel today.
const KNOWN_RO_COMPAT: u32 = RoCompat::SPARSE_SUPER.bits()
    | RoCompat::LARGE_FILE.bits()
    | RoCompat::BTREE_DIR.bits()
    | RoCompat::HUGE_FILE.bits()
    | RoCompat::GDT_CSUM.bits()
    | RoCompat::DIR_NLINK.bits()
    | RoCompat::EXTRA_ISIZE.bits()
    | RoCompat::QUOTA.bits()
    | RoCompat::BIGALLOC.bits()
    | RoCompat::METADATA_CSUM.bits()
    | RoCompat::READONLY.bits()
    | RoCompat::PROJECT.bits()
    | RoCompat::VERITY.bits()
    | RoCompat::ORPHAN_PRESENT.bits();

/// Why a filesystem could not be opened or updated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// No ext4 superblock magic at byte 1080.
    #[error("not an ext2/3/4 filesystem (superblock magic is {magic:#06x}, expected 0xef53)")]
    NotExt4 { magic: u16 },
    /// On-disk metadata contradicts itself; `what` names the structure or
    /// field, `detail` the values.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// A valid filesystem this code does not (yet) handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The filesystem is fine but must not be modified as it is.
    #[error("refusing to modify: {0}")]
    NotWritable(String),
    /// The device is shorter than the filesystem claims to be.
    #[error(
        "truncated image: the filesystem needs {need} bytes ({blocks} blocks of {block_size}) but the device has {have}"
    )]
    Truncated {
        need: u64,
        have: u64,
        blocks: u64,
        block_size: u32,
    },
    /// A primary descriptor block on disk no longer holds what was read at
    /// open time (someone else is writing to the filesystem).
    #[error(
        "group descriptor block {block} changed on disk since it was read (is the filesystem in use?)"
    )]
    ChangedUnderUs { block: u64 },
    /// The image was opened read-only.
    #[error("filesystem was opened read-only")]
    ReadOnly,
    /// A read, write or flush failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

fn corrupt(what: &'static str, detail: impl Into<String>) -> ImageError {
    ImageError::Corrupt {
        what,
        detail: detail.into(),
    }
}

/// Which group-descriptor checksum the filesystem uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescChecksum {
    /// `metadata_csum`: low 16 bits of crc32c.
    MetadataCsum,
    /// `uninit_bg` (`gdt_csum`): crc16.
    GdtCsum,
    /// Neither: descriptors carry no checksum (and no `itable_unused`).
    None,
}

impl DescChecksum {
    /// The e2fsprogs feature name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            DescChecksum::MetadataCsum => "metadata_csum",
            DescChecksum::GdtCsum => "uninit_bg",
            DescChecksum::None => "none",
        }
    }
}

/// Everything about the layout that the superblock determines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Block size in bytes (1 KiB .. 64 KiB).
    pub block_size: u32,
    /// `s_blocks_count`.
    pub blocks_count: u64,
    /// `s_first_data_block` (1 for 1 KiB blocks, else 0).
    pub first_data_block: u64,
    /// `s_blocks_per_group`.
    pub blocks_per_group: u32,
    /// `s_inodes_per_group`.
    pub inodes_per_group: u32,
    /// `s_inodes_count`.
    pub inodes_count: u32,
    /// On-disk inode size in bytes.
    pub inode_size: u32,
    /// Inodes per block of the inode table.
    pub inodes_per_block: u32,
    /// Blocks of one group's inode table.
    pub itable_blocks: u32,
    /// Number of block groups.
    pub group_count: u32,
    /// Descriptor size in bytes (32, or `s_desc_size` with 64bit).
    pub desc_size: u32,
    /// Descriptors per block.
    pub descs_per_block: u32,
    /// Blocks of the primary descriptor table.
    pub desc_blocks: u32,
    /// Block number of the first primary descriptor block.
    pub gdt_start: u64,
    /// First inode number not reserved (`s_first_ino`).
    pub first_ino: u32,
    /// Block holding the primary superblock (1 with 1 KiB blocks, else 0).
    pub sb_block: u64,
    /// `s_reserved_gdt_blocks`: blocks reserved after every descriptor
    /// table copy for online growth.
    pub reserved_gdt_blocks: u32,
    /// Blocks per cluster (1 without bigalloc).
    pub cluster_ratio: u32,
    /// `s_first_meta_bg` with the meta_bg feature (`None` without it):
    /// descriptor blocks from this index on live in their meta groups.
    pub first_meta_bg: Option<u32>,
    /// Block number of every primary descriptor block, by index (with
    /// meta_bg not contiguous; see [`descriptor_locations`]).
    pub desc_locs: Vec<u64>,
}

impl Geometry {
    /// Index (within the descriptor table) of the block holding `group`'s
    /// descriptor.
    pub fn desc_block_index(&self, group: u32) -> u32 {
        group / self.descs_per_block
    }

    /// Block number of primary descriptor-table block `index`.
    pub fn desc_block(&self, index: u32) -> u64 {
        self.desc_locs
            .get(index as usize)
            .copied()
            .unwrap_or(self.gdt_start + u64::from(index))
    }

    /// Descriptor blocks right after the superblock (and its backups):
    /// all of them, or with meta_bg the `s_first_meta_bg` before the meta
    /// groups. The reserved GDT blocks follow these.
    pub fn table_blocks(&self) -> u32 {
        match self.first_meta_bg {
            Some(f) => f.min(self.desc_blocks),
            None => self.desc_blocks,
        }
    }

    /// The groups whose descriptors live in descriptor block `index`.
    pub fn groups_in_desc_block(&self, index: u32) -> std::ops::Range<u32> {
        let first = index
            .saturating_mul(self.descs_per_block)
            .min(self.group_count);
        let end = first
            .saturating_add(self.descs_per_block)
            .min(self.group_count);
        first..end
    }

    /// Byte offset of block `block`.
    pub fn byte_offset(&self, block: u64) -> u64 {
        block.saturating_mul(u64::from(self.block_size))
    }

    /// Size of the filesystem in bytes.
    pub fn fs_bytes(&self) -> u64 {
        self.blocks_count.saturating_mul(u64::from(self.block_size))
    }

    /// Bytes of one group's inode table.
    pub fn itable_bytes(&self) -> u64 {
        u64::from(self.itable_blocks) * u64::from(self.block_size)
    }
}

/// Open for reading only, or for updating descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    Update,
}

/// An opened, validated ext4 filesystem.
pub struct Image<'d> {
    dev: &'d dyn Device,
    access: Access,
    sb: Superblock,
    features: Features,
    csum: Csum,
    desc_csum: DescChecksum,
    geom: Geometry,
    /// The primary descriptor table as we want it on disk.
    gdt: Vec<u8>,
    /// The primary descriptor table as last read from / written to disk.
    gdt_disk: Vec<u8>,
}

impl std::fmt::Debug for Image<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("device", &self.dev.name())
            .field("access", &self.access)
            .field("geometry", &self.geom)
            .field("desc_csum", &self.desc_csum)
            .finish_non_exhaustive()
    }
}

impl<'d> Image<'d> {
    /// Open read-only: validate the superblock and every descriptor.
    pub fn open(dev: &'d dyn Device) -> Result<Self, ImageError> {
        Self::open_with(dev, Access::ReadOnly)
    }

    /// Open for updating descriptors: everything [`Image::open`] checks,
    /// plus the conditions under which writing is unsafe.
    pub fn open_for_update(dev: &'d dyn Device) -> Result<Self, ImageError> {
        Self::open_with(dev, Access::Update)
    }

    /// Open with the given access.
    pub fn open_with(dev: &'d dyn Device, access: Access) -> Result<Self, ImageError> {
        let dev_size = dev.size();
        let sb_end = SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64;
        if dev_size < sb_end {
            return Err(ImageError::Truncated {
                need: sb_end,
                have: dev_size,
                blocks: 0,
                block_size: 0,
            });
        }
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
        let sb = Superblock::parse(&raw).ok_or_else(|| corrupt("superblock", "short read"))?;
        let (features, csum, desc_csum) = check_superblock(&sb, access)?;
        let geom = geometry(&sb, &features)?;

        let need = geom.fs_bytes();
        if dev_size < need {
            return Err(ImageError::Truncated {
                need,
                have: dev_size,
                blocks: geom.blocks_count,
                block_size: geom.block_size,
            });
        }

        let gdt_len = usize::try_from(u64::from(geom.desc_blocks) * u64::from(geom.block_size))
            .map_err(|_| corrupt("descriptor table", "too large"))?;
        let mut gdt = vec![0u8; gdt_len];
        // The contiguous table in one read, each meta_bg block on its own.
        let bs = geom.block_size as usize;
        let contiguous = geom.table_blocks() as usize * bs;
        dev.read_at(&mut gdt[..contiguous], geom.byte_offset(geom.gdt_start))?;
        for index in geom.table_blocks()..geom.desc_blocks {
            let at = index as usize * bs;
            dev.read_at(
                &mut gdt[at..at + bs],
                geom.byte_offset(geom.desc_block(index)),
            )?;
        }

        let img = Image {
            dev,
            access,
            sb,
            features,
            csum,
            desc_csum,
            geom,
            gdt_disk: gdt.clone(),
            gdt,
        };
        img.check_descriptors()?;
        Ok(img)
    }

    /// The device this image lives on.
    pub fn device(&self) -> &'d dyn Device {
        self.dev
    }

    /// How the image was opened.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The primary superblock as read.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Feature words.
    pub fn features(&self) -> Features {
        self.features
    }

    /// The checksum context.
    pub fn csum(&self) -> &Csum {
        &self.csum
    }

    /// Which descriptor checksum is in use.
    pub fn desc_checksum(&self) -> DescChecksum {
        self.desc_csum
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geom
    }

    /// Does the filesystem need journal recovery?
    pub fn needs_recovery(&self) -> bool {
        self.features.incompat.contains(Incompat::RECOVER)
    }

    fn desc_range(&self, group: u32) -> std::ops::Range<usize> {
        let ds = self.geom.desc_size as usize;
        let start = group as usize * ds;
        start..start + ds
    }

    /// The raw on-disk bytes of `group`'s descriptor (as it will be
    /// written; the checksum field is refreshed only when written).
    ///
    /// # Panics
    /// If `group >= group_count`.
    pub fn desc_bytes(&self, group: u32) -> &[u8] {
        assert!(group < self.geom.group_count, "group {group} out of range");
        &self.gdt[self.desc_range(group)]
    }

    /// `group`'s descriptor, parsed.
    ///
    /// # Panics
    /// If `group >= group_count`.
    pub fn desc(&self, group: u32) -> GroupDesc {
        GroupDesc::parse(self.desc_bytes(group)).unwrap_or_default()
    }

    /// `bg_flags` of `group`.
    ///
    /// # Panics
    /// If `group >= group_count`.
    pub fn desc_flags(&self, group: u32) -> u16 {
        let r = self.desc_range(group);
        let b = &self.gdt[r.start + DESC_FLAGS_OFF..r.start + DESC_FLAGS_OFF + 2];
        u16::from_le_bytes([b[0], b[1]])
    }

    /// Set `bg_flags` of `group` in memory; [`Image::write_desc_block`]
    /// makes it (and its checksum) reach the disk.
    ///
    /// # Panics
    /// If `group >= group_count`.
    pub fn set_desc_flags(&mut self, group: u32, flags: u16) {
        let r = self.desc_range(group);
        self.gdt[r.start + DESC_FLAGS_OFF..r.start + DESC_FLAGS_OFF + 2]
            .copy_from_slice(&flags.to_le_bytes());
    }

    fn block_range(&self, index: u32) -> std::ops::Range<usize> {
        let bs = self.geom.block_size as usize;
        let start = index as usize * bs;
        start..start + bs
    }

    /// Check that descriptor block `index` on disk still holds what we last
    /// read or wrote there.
    pub fn verify_desc_block_unchanged(&self, index: u32) -> Result<(), ImageError> {
        if index >= self.geom.desc_blocks {
            return Err(corrupt(
                "descriptor block index",
                format!("{index} out of range"),
            ));
        }
        let block = self.geom.desc_block(index);
        let mut buf = vec![0u8; self.geom.block_size as usize];
        self.dev.read_at(&mut buf, self.geom.byte_offset(block))?;
        if buf[..] != self.gdt_disk[self.block_range(index)] {
            return Err(ImageError::ChangedUnderUs { block });
        }
        Ok(())
    }

    /// Recompute the checksum of every descriptor held by primary
    /// descriptor block `index` and write the block (not flushed). Bytes of
    /// the block past the last descriptor are written back as read. Fails
    /// with [`ImageError::ChangedUnderUs`], writing nothing, if the block on
    /// disk is no longer what was read.
    pub fn write_desc_block(&mut self, index: u32) -> Result<(), ImageError> {
        if self.access != Access::Update {
            return Err(ImageError::ReadOnly);
        }
        self.verify_desc_block_unchanged(index)?;
        if self.desc_csum != DescChecksum::None {
            for g in self.geom.groups_in_desc_block(index) {
                let r = self.desc_range(g);
                let c = self.csum.group_desc(g, &self.gdt[r.clone()]);
                self.gdt[r.start + DESC_CSUM_OFF..r.start + DESC_CSUM_OFF + 2]
                    .copy_from_slice(&c.to_le_bytes());
            }
        }
        let br = self.block_range(index);
        let block = self.geom.desc_block(index);
        self.dev
            .write_at(&self.gdt[br.clone()], self.geom.byte_offset(block))?;
        self.gdt_disk[br.clone()].copy_from_slice(&self.gdt[br]);
        Ok(())
    }

    /// Flush the device.
    pub fn flush(&self) -> Result<(), ImageError> {
        self.dev.flush()?;
        Ok(())
    }

    /// Validate every descriptor: checksum, table locations, counts.
    fn check_descriptors(&self) -> Result<(), ImageError> {
        let g = &self.geom;
        let gdt_end = g.gdt_start + u64::from(g.table_blocks());
        let itb = u64::from(g.itable_blocks);
        // meta_bg descriptor blocks (sorted: one per meta group, in order):
        // no bitmap or inode table may cover one.
        let meta_blocks = &g.desc_locs[(g.table_blocks() as usize).min(g.desc_locs.len())..];
        let covers_meta = |b: u64, n: u64| {
            let i = meta_blocks.partition_point(|&m| m < b);
            meta_blocks.get(i).is_some_and(|&m| m < b.saturating_add(n))
        };
        let mut tables: Vec<(u64, u32)> = Vec::with_capacity(g.group_count as usize);
        for group in 0..g.group_count {
            let raw = self.desc_bytes(group);
            let d = self.desc(group);
            if self.desc_csum != DescChecksum::None {
                let want = self.csum.group_desc(group, raw);
                let have = d.bg_checksum.get();
                if want != have {
                    return Err(corrupt(
                        "group descriptor",
                        format!(
                            "group {group}: checksum {have:#06x} does not match computed {want:#06x}"
                        ),
                    ));
                }
            }
            let it = d.inode_table();
            let in_fs = |b: u64, n: u64| {
                b >= gdt_end && b.checked_add(n).is_some_and(|e| e <= g.blocks_count)
            };
            if !in_fs(it, itb) || covers_meta(it, itb) {
                return Err(corrupt(
                    "group descriptor",
                    format!(
                        "group {group}: inode table at block {it} ({itb} blocks) is not inside the filesystem past the descriptor table (blocks {gdt_end}..{}) or covers a meta_bg descriptor block",
                        g.blocks_count
                    ),
                ));
            }
            for (name, b) in [
                ("block bitmap", d.block_bitmap()),
                ("inode bitmap", d.inode_bitmap()),
            ] {
                if !in_fs(b, 1) || covers_meta(b, 1) {
                    return Err(corrupt(
                        "group descriptor",
                        format!(
                            "group {group}: {name} at block {b} is outside the filesystem or on a descriptor block"
                        ),
                    ));
                }
            }
            if self.desc_csum != DescChecksum::None {
                let ipg = g.inodes_per_group;
                if d.free_inodes() > ipg {
                    return Err(corrupt(
                        "group descriptor",
                        format!(
                            "group {group}: free inodes count {} > inodes per group {ipg}",
                            d.free_inodes()
                        ),
                    ));
                }
                if d.itable_unused() > ipg {
                    return Err(corrupt(
                        "group descriptor",
                        format!(
                            "group {group}: unused inodes count {} > inodes per group {ipg}",
                            d.itable_unused()
                        ),
                    ));
                }
            }
            tables.push((it, group));
        }
        tables.sort_unstable();
        for w in tables.windows(2) {
            let ((a, ga), (b, gb)) = (w[0], w[1]);
            if a + itb > b {
                return Err(corrupt(
                    "group descriptor",
                    format!("inode tables of groups {ga} (block {a}) and {gb} (block {b}) overlap"),
                ));
            }
        }
        Ok(())
    }
}

/// Validate the superblock fields that decide how everything else is read.
fn check_superblock(
    sb: &Superblock,
    access: Access,
) -> Result<(Features, Csum, DescChecksum), ImageError> {
    let magic = sb.s_magic.get();
    if magic != EXT4_MAGIC {
        return Err(ImageError::NotExt4 { magic });
    }
    let features = Features {
        compat: Compat(sb.s_feature_compat.get()),
        incompat: Incompat(sb.s_feature_incompat.get()),
        ro_compat: RoCompat(sb.s_feature_ro_compat.get()),
    };
    let metadata_csum = features.ro_compat.contains(RoCompat::METADATA_CSUM);
    if metadata_csum {
        if sb.s_checksum_type != 1 {
            return Err(corrupt(
                "superblock",
                format!(
                    "unknown checksum type {} (expected 1, crc32c)",
                    sb.s_checksum_type
                ),
            ));
        }
        if !sb.checksum_ok() {
            return Err(corrupt(
                "superblock",
                format!(
                    "checksum {:#010x} does not match computed {:#010x}",
                    sb.s_checksum.get(),
                    sb.compute_checksum()
                ),
            ));
        }
    }
    if features.incompat.contains(Incompat::JOURNAL_DEV) {
        return Err(ImageError::Unsupported(
            "this is an external journal device, not a filesystem".into(),
        ));
    }
    let unknown_incompat = features.incompat.bits() & !KNOWN_INCOMPAT;
    if unknown_incompat != 0 {
        let names = Features {
            incompat: Incompat(unknown_incompat),
            ..Features::default()
        }
        .names();
        return Err(ImageError::Unsupported(format!(
            "incompatible feature(s) {}",
            names.join(", ")
        )));
    }
    if access == Access::Update {
        let unknown_ro = features.ro_compat.bits() & !KNOWN_RO_COMPAT;
        if unknown_ro != 0 {
            let names = Features {
                ro_compat: RoCompat(unknown_ro),
                ..Features::default()
            }
            .names();
            return Err(ImageError::Unsupported(format!(
                "read-only-compatible feature(s) {}",
                names.join(", ")
            )));
        }
        if features.incompat.contains(Incompat::RECOVER) {
            return Err(ImageError::NotWritable(
                "the journal needs recovery (mount it once or run e2fsck first)".into(),
            ));
        }
        if sb.s_state.get() & STATE_VALID == 0 {
            // Without a journal the kernel clears VALID while mounted: the
            // descriptors on disk may be older than the inode table.
            return Err(ImageError::NotWritable(
                "the filesystem was not cleanly unmounted (run e2fsck first)".into(),
            ));
        }
        if sb.s_state.get() & STATE_ERROR != 0 {
            return Err(ImageError::NotWritable(
                "the filesystem is marked as having errors (run e2fsck first)".into(),
            ));
        }
        if features.incompat.contains(Incompat::MMP) {
            return Err(ImageError::Unsupported(
                "multi-mount protection (mmp) is not supported for writing".into(),
            ));
        }
    }
    let csum = Csum::from_superblock(sb);
    let desc_csum = if metadata_csum {
        DescChecksum::MetadataCsum
    } else if features.ro_compat.contains(RoCompat::GDT_CSUM) {
        DescChecksum::GdtCsum
    } else {
        DescChecksum::None
    };
    Ok((features, csum, desc_csum))
}

/// Derive and cross-check the geometry.
fn geometry(sb: &Superblock, features: &Features) -> Result<Geometry, ImageError> {
    let block_size = sb.block_size().ok_or_else(|| {
        corrupt(
            "superblock",
            format!(
                "log block size {} (block size above 64 KiB)",
                sb.s_log_block_size.get()
            ),
        )
    })?;
    let bs = u64::from(block_size);
    let blocks_count = blocks_count(sb, features);
    let first_data_block = u64::from(sb.s_first_data_block.get());
    let bigalloc = features.ro_compat.contains(RoCompat::BIGALLOC);
    if blocks_count == 0 {
        return Err(corrupt("superblock", "blocks count is 0"));
    }
    if first_data_block >= blocks_count {
        return Err(corrupt(
            "superblock",
            format!("first data block {first_data_block} >= blocks count {blocks_count}"),
        ));
    }
    // e2fsck's rule: block 1 with 1 KiB blocks and no clusters, else 0.
    let log_cluster = sb.s_log_cluster_size.get();
    let log_block = sb.s_log_block_size.get();
    let cluster_ratio = if bigalloc {
        if log_cluster < log_block || log_cluster - log_block > 16 {
            return Err(corrupt(
                "superblock",
                format!("log cluster size {log_cluster} with log block size {log_block}"),
            ));
        }
        1u32 << (log_cluster - log_block)
    } else {
        if log_cluster != log_block {
            return Err(corrupt(
                "superblock",
                format!(
                    "log cluster size {log_cluster} != log block size {log_block} without bigalloc"
                ),
            ));
        }
        1
    };
    let want_fdb = u64::from(block_size == 1024 && cluster_ratio == 1);
    if first_data_block != want_fdb {
        return Err(corrupt(
            "superblock",
            format!(
                "first data block is {first_data_block} with {block_size}-byte blocks (expected {want_fdb})"
            ),
        ));
    }
    let bpg = sb.s_blocks_per_group.get();
    let cpg = if bigalloc {
        sb.s_clusters_per_group.get()
    } else {
        bpg
    };
    if bpg == 0
        || cpg == 0
        || u64::from(cpg) > 8 * bs
        || u64::from(cpg) * u64::from(cluster_ratio) != u64::from(bpg)
        || !cpg.is_multiple_of(8)
    {
        return Err(corrupt(
            "superblock",
            format!(
                "blocks per group {bpg} (clusters per group {cpg}, {cluster_ratio} blocks per cluster) with {block_size}-byte blocks"
            ),
        ));
    }
    let rev = sb.s_rev_level.get();
    if rev > 1 {
        return Err(ImageError::Unsupported(format!("revision level {rev}")));
    }
    if rev == 0
        && (features.compat.bits() | features.incompat.bits() | features.ro_compat.bits()) != 0
    {
        return Err(corrupt(
            "superblock",
            format!(
                "revision 0 (fixed 128-byte inodes) but features are set: {}",
                features.names().join(", ")
            ),
        ));
    }
    let (inode_size, first_ino) = if rev == 0 {
        (GOOD_OLD_INODE_SIZE, GOOD_OLD_FIRST_INO)
    } else {
        (u32::from(sb.s_inode_size.get()), sb.s_first_ino.get())
    };
    if !inode_size.is_power_of_two() || inode_size < 128 || inode_size > block_size {
        return Err(corrupt("superblock", format!("inode size {inode_size}")));
    }
    // The extra inode fields the superblock promises must fit the inode.
    let room = inode_size - GOOD_OLD_INODE_SIZE;
    let min_extra = u32::from(sb.s_min_extra_isize.get());
    let want_extra = u32::from(sb.s_want_extra_isize.get());
    if min_extra > room || want_extra > room {
        return Err(corrupt(
            "superblock",
            format!(
                "inode size {inode_size} has no room for the extra fields it promises (min {min_extra}, wanted {want_extra} bytes)"
            ),
        ));
    }
    if features.incompat.contains(Incompat::FLEX_BG) && sb.s_log_groups_per_flex > 31 {
        return Err(corrupt(
            "superblock",
            format!("log groups per flex {}", sb.s_log_groups_per_flex),
        ));
    }
    let ipb = block_size / inode_size;
    let ipg = sb.s_inodes_per_group.get();
    if ipg < ipb || u64::from(ipg) > 8 * bs || !ipg.is_multiple_of(ipb) || !ipg.is_multiple_of(8) {
        return Err(corrupt(
            "superblock",
            format!(
                "inodes per group {ipg} with {block_size}-byte blocks and {inode_size}-byte inodes (not a whole number of table blocks)"
            ),
        ));
    }
    let itable_blocks = ipg / ipb;
    let groups64 = (blocks_count - first_data_block).div_ceil(u64::from(bpg));
    let group_count = u32::try_from(groups64)
        .map_err(|_| corrupt("superblock", format!("{groups64} block groups")))?;
    let inodes_count = sb.s_inodes_count.get();
    if u64::from(inodes_count) != u64::from(ipg) * groups64 {
        return Err(corrupt(
            "superblock",
            format!("inodes count {inodes_count} != {ipg} inodes per group x {group_count} groups"),
        ));
    }
    if first_ino < GOOD_OLD_FIRST_INO || first_ino > inodes_count {
        return Err(corrupt("superblock", format!("first inode {first_ino}")));
    }
    if u64::from(sb.s_free_inodes_count.get()) > u64::from(inodes_count) {
        return Err(corrupt(
            "superblock",
            format!(
                "free inodes count {} > inodes count {inodes_count}",
                sb.s_free_inodes_count.get()
            ),
        ));
    }
    let free_blocks = free_blocks_count(sb, features);
    if free_blocks > blocks_count {
        return Err(corrupt(
            "superblock",
            format!("free blocks count {free_blocks} > blocks count {blocks_count}"),
        ));
    }
    let desc_size = u32::from(sb.desc_size());
    if features.incompat.contains(Incompat::BIT64)
        && (!desc_size.is_power_of_two() || !(64..=1024).contains(&desc_size))
    {
        return Err(corrupt(
            "superblock",
            format!("descriptor size {desc_size}"),
        ));
    }
    if desc_size > block_size {
        return Err(corrupt(
            "superblock",
            format!("descriptor size {desc_size} > block size {block_size}"),
        ));
    }
    let descs_per_block = block_size / desc_size;
    let desc_blocks = group_count.div_ceil(descs_per_block);
    // The table follows the block holding the superblock (block 2 with
    // 1 KiB blocks even when bigalloc makes block 0 the first).
    let sb_block = SUPERBLOCK_OFFSET / bs;
    let gdt_start = ext4kit_format::layout::gdt_start(block_size);
    let reserved_gdt_blocks = u32::from(sb.s_reserved_gdt_blocks.get());
    if reserved_gdt_blocks > block_size / 4 {
        return Err(corrupt(
            "superblock",
            format!(
                "{reserved_gdt_blocks} reserved descriptor blocks (at most {})",
                block_size / 4
            ),
        ));
    }
    let first_meta_bg = features
        .incompat
        .contains(Incompat::META_BG)
        .then(|| sb.s_first_meta_bg.get());
    if let Some(f) = first_meta_bg
        && f > desc_blocks
    {
        // e2fsck: "First_meta_bg is too big".
        return Err(corrupt(
            "superblock",
            format!("first meta block group {f} is past the {desc_blocks} descriptor blocks"),
        ));
    }
    let table_blocks = first_meta_bg.map_or(desc_blocks, |f| f.min(desc_blocks));
    if gdt_start + u64::from(table_blocks) + u64::from(reserved_gdt_blocks) > blocks_count {
        return Err(corrupt(
            "superblock",
            format!(
                "{table_blocks} descriptor blocks and {reserved_gdt_blocks} reserved ones do not fit in {blocks_count} blocks"
            ),
        ));
    }
    let desc_locs = descriptor_locations(
        sb,
        gdt_start,
        first_data_block,
        bpg,
        descs_per_block,
        desc_blocks,
        first_meta_bg,
    );
    if let Some((i, &b)) = desc_locs
        .iter()
        .enumerate()
        .find(|&(_, &b)| b >= blocks_count)
    {
        return Err(corrupt(
            "superblock",
            format!("descriptor block {i} would be at block {b}, past the {blocks_count} blocks"),
        ));
    }
    Ok(Geometry {
        block_size,
        blocks_count,
        first_data_block,
        blocks_per_group: bpg,
        inodes_per_group: ipg,
        inodes_count,
        inode_size,
        inodes_per_block: ipb,
        itable_blocks,
        group_count,
        desc_size,
        descs_per_block,
        desc_blocks,
        gdt_start,
        first_ino,
        sb_block,
        reserved_gdt_blocks,
        cluster_ratio,
        first_meta_bg,
        desc_locs,
    })
}

/// Where each primary descriptor block lives (e2fsprogs'
/// `ext2fs_descriptor_block_loc2` for the primary copy): right after the
/// superblock (`gdt_start`, contiguous), or with meta_bg, from index
/// `first_meta_bg` on, block `i` in the first group of meta group `i`
/// (group `i × descs_per_block`), after that group's superblock backup if
/// it has one.
pub fn descriptor_locations(
    sb: &Superblock,
    gdt_start: u64,
    first_data_block: u64,
    blocks_per_group: u32,
    descs_per_block: u32,
    desc_blocks: u32,
    first_meta_bg: Option<u32>,
) -> Vec<u64> {
    let layout = DescLayout {
        gdt_start,
        first_data_block,
        blocks_per_group,
        descs_per_block,
        first_meta_bg,
        backups: Backups::of(sb),
    };
    (0..desc_blocks).map(|i| layout.primary(i)).collect()
}

/// Where the backup of primary descriptor block `index` is read from, as
/// e2fsprogs reads the backup descriptors (`ext2fs_descriptor_block_loc2`
/// with a backup superblock at `backup_sb`): after that superblock for the
/// contiguous table; with meta_bg, in the second group of the meta group
/// (after its superblock backup, if any), or `None` where the meta group
/// has no second group.
pub fn backup_descriptor_location(
    sb: &Superblock,
    geom: &Geometry,
    backup_sb: u64,
    index: u32,
) -> Option<u64> {
    DescLayout {
        gdt_start: geom.gdt_start,
        first_data_block: geom.first_data_block,
        blocks_per_group: geom.blocks_per_group,
        descs_per_block: geom.descs_per_block,
        first_meta_bg: geom.first_meta_bg,
        backups: Backups::of(sb),
    }
    .backup(backup_sb, geom.blocks_count, index)
}

/// `s_blocks_count`: the high word only with `64bit` (without it the field
/// is padding that a stray write may have filled).
pub fn blocks_count(sb: &Superblock, features: &Features) -> u64 {
    if features.incompat.contains(Incompat::BIT64) {
        sb.blocks_count()
    } else {
        u64::from(sb.s_blocks_count_lo.get())
    }
}

/// `s_free_blocks_count`, the high word only with `64bit`.
pub fn free_blocks_count(sb: &Superblock, features: &Features) -> u64 {
    if features.incompat.contains(Incompat::BIT64) {
        sb.free_blocks_count()
    } else {
        u64::from(sb.s_free_blocks_count_lo.get())
    }
}

/// Synthetic filesystems for unit tests (just what the image and lazy-init
/// code read: superblock, descriptors, tables).
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use ext4kit_device::MemDevice;

    /// Inodes per group of [`synthetic`].
    pub(crate) const IPG: u32 = 64;
    /// Inode-table blocks per group of [`synthetic`] (1 KiB blocks).
    pub(crate) const ITB: u64 = 16;

    /// `groups` groups of 1 KiB blocks, 64-byte descriptors, 256-byte
    /// inodes, 64 inodes (16 table blocks) per group. Group 0 has 11 used
    /// inodes, the others are INODE_UNINIT; no group is ITABLE_ZEROED.
    /// Inode table `g` starts at block `table_start(groups) + g × 16`.
    pub(crate) fn synthetic(metadata_csum: bool, groups: u32) -> MemDevice {
        let bs = 1024u64;
        let bpg = 1024u32;
        let ipg = IPG;
        let blocks = 1 + u64::from(groups) * u64::from(bpg);
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        let put32 = |raw: &mut Vec<u8>, off: usize, v: u32| {
            raw[off..off + 4].copy_from_slice(&v.to_le_bytes());
        };
        put32(&mut raw, 0x00, ipg * groups);
        put32(&mut raw, 0x04, blocks as u32);
        put32(&mut raw, 0x14, 1);
        put32(&mut raw, 0x18, 0);
        put32(&mut raw, 0x20, bpg);
        put32(&mut raw, 0x24, bpg);
        put32(&mut raw, 0x28, ipg);
        raw[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
        raw[0x3A..0x3C].copy_from_slice(&1u16.to_le_bytes()); // s_state: valid
        put32(&mut raw, 0x4C, 1);
        put32(&mut raw, 0x54, 11);
        raw[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        put32(
            &mut raw,
            0x60,
            Incompat::BIT64.bits() | Incompat::FLEX_BG.bits(),
        );
        if metadata_csum {
            put32(&mut raw, 0x64, RoCompat::METADATA_CSUM.bits());
            raw[0x175] = 1;
        } else {
            put32(&mut raw, 0x64, RoCompat::GDT_CSUM.bits());
        }
        raw[0x68..0x78].copy_from_slice(&[7; 16]);
        // sparse_super2 without backups: the cross-check has no backup
        // superblock to compare with.
        put32(&mut raw, 0x5C, Compat::SPARSE_SUPER2.bits());
        raw[0xFE..0x100].copy_from_slice(&64u16.to_le_bytes());
        let sb = Superblock::parse(&raw).expect("parse");
        let c = sb.compute_checksum();
        put32(&mut raw, 0x3FC, c);
        let sb = Superblock::parse(&raw).expect("parse");
        assert!(sb.checksum_ok());
        let dev = MemDevice::new(blocks * bs);
        dev.write_at(&raw, 1024).expect("write sb");
        let csum = Csum::from_superblock(&sb);
        let g64 = u64::from(groups);
        let tables = table_start(groups);
        for g in 0..groups {
            let gg = u64::from(g);
            let mut d = GroupDesc::default();
            d.set_block_bitmap(tables - 2 * g64 + gg);
            d.set_inode_bitmap(tables - g64 + gg);
            d.set_inode_table(tables + gg * ITB);
            d.set_free_inodes(if g == 0 { ipg - 11 } else { ipg });
            d.set_itable_unused(if g == 0 { ipg - 11 } else { ipg });
            d.set_flags(if g == 0 { 0 } else { 1 });
            d.update_checksum(&csum, g, 64);
            dev.write_at(d.on_disk(64), 2048 + gg * 64)
                .expect("write desc");
        }
        // Group 0's block bitmap: every metadata block (1 ..= the last
        // table block) in use.
        let meta_end = tables + g64 * ITB;
        let mut bm = vec![0u8; bs as usize];
        for b in 1..meta_end {
            let i = (b - 1) as usize;
            bm[i / 8] |= 1 << (i % 8);
        }
        dev.write_at(&bm, (tables - 2 * g64) * bs).expect("bitmap");
        // Only inodes 1 and 2 are marked in use: the tests fill the other
        // reserved slots with noise.
        let mut ibm = vec![0u8; bs as usize];
        ibm[0] = 0x03;
        dev.write_at(&ibm, (tables - g64) * bs)
            .expect("inode bitmap");
        // The root directory (inode 2).
        let mut root = vec![0u8; 256];
        root[0..2].copy_from_slice(&0o040755u16.to_le_bytes());
        root[0x1A..0x1C].copy_from_slice(&2u16.to_le_bytes());
        root[0x80..0x82].copy_from_slice(&32u16.to_le_bytes());
        ext4kit_format::inode::set_checksum(&mut root, 2, &csum);
        dev.write_at(&root, tables * bs + 256).expect("root inode");
        dev
    }

    /// First inode-table block of [`synthetic`].
    pub(crate) fn table_start(groups: u32) -> u64 {
        let desc_blocks = u64::from(groups).div_ceil(16);
        2 + desc_blocks + 2 * u64::from(groups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;
    use ext4kit_format::group_desc::BG_INODE_ZEROED;

    fn synthetic(metadata_csum: bool) -> MemDevice {
        test_support::synthetic(metadata_csum, 4)
    }

    #[test]
    fn opens_and_rewrites_synthetic() {
        for mc in [true, false] {
            let dev = synthetic(mc);
            let mut img = Image::open_for_update(&dev).expect("open");
            let g = img.geometry().clone();
            assert_eq!(g.group_count, 4);
            assert_eq!(g.itable_blocks, 16);
            assert_eq!(g.gdt_start, 2);
            assert_eq!(g.descs_per_block, 16);
            assert_eq!(
                img.desc_checksum(),
                if mc {
                    DescChecksum::MetadataCsum
                } else {
                    DescChecksum::GdtCsum
                }
            );
            let f = img.desc_flags(2);
            img.set_desc_flags(2, f | BG_INODE_ZEROED);
            img.write_desc_block(0).expect("write");
            let again = Image::open(&dev).expect("reopen");
            assert_eq!(again.desc_flags(2), f | BG_INODE_ZEROED);
        }
    }

    #[test]
    fn read_only_refuses_write() {
        let dev = synthetic(true);
        let mut img = Image::open(&dev).expect("open");
        assert!(matches!(img.write_desc_block(0), Err(ImageError::ReadOnly)));
    }

    #[test]
    fn detects_change_under_us() {
        let dev = synthetic(true);
        let mut img = Image::open_for_update(&dev).expect("open");
        dev.write_at(&[0xAA], 2048 + 64 * 3 + 0x3C).expect("poke");
        assert!(matches!(
            img.write_desc_block(0),
            Err(ImageError::ChangedUnderUs { block: 2 })
        ));
    }

    #[test]
    fn refusals() {
        // No magic.
        let dev = MemDevice::new(1 << 20);
        assert!(matches!(
            Image::open(&dev),
            Err(ImageError::NotExt4 { magic: 0 })
        ));
        // Too small for a superblock.
        let dev = MemDevice::new(1500);
        assert!(matches!(
            Image::open(&dev),
            Err(ImageError::Truncated { .. })
        ));
        // Superblock checksum.
        let dev = synthetic(true);
        dev.write_at(&[0x55], 1024 + 0x60).expect("poke");
        let e = Image::open(&dev).expect_err("bad sb csum");
        assert!(e.to_string().contains("superblock"), "{e}");
        // Descriptor checksum.
        let dev = synthetic(false);
        dev.write_at(&[0x55], 2048 + 64 + 0x0C).expect("poke");
        let e = Image::open(&dev).expect_err("bad desc csum");
        assert!(e.to_string().contains("group 1: checksum"), "{e}");
        // Truncated: copy into a shorter device.
        let full = synthetic(true).to_bytes();
        let short = MemDevice::from_bytes(full[..full.len() - 1024].to_vec());
        assert!(matches!(
            Image::open(&short),
            Err(ImageError::Truncated { .. })
        ));
    }
}
