//! Opening a filesystem for reading: the superblock and the group
//! descriptors, validated (checksums, bounds, features), with a dirty
//! journal replayed in memory (never written).
//!
//! [`FsInfo`] is what every other module needs to know about the
//! filesystem; [`Fs`] pairs it with a [`BlockRead`] (the device, the device
//! plus replayed journal blocks, or later a transaction's block cache) and
//! carries the read operations (`inode.rs`, `extent.rs`, `blockmap.rs`,
//! `file.rs`, `dir.rs`, `xattr.rs`, `path.rs`).

use ext4kit_device::Device;
use ext4kit_format::features::{Compat, Features, Incompat, RoCompat, Word};
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::superblock::{
    EXT4_MAGIC, FLAG_UNSIGNED_HASH, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use ext4kit_format::{Csum, Inode};

use crate::journal::recover::{self, Journal};
use crate::{BlockRead, DeviceBlocks, FsError};

/// Incompat features the read side handles.
pub const READ_INCOMPAT: u32 = Incompat::FILETYPE.bits()
    | Incompat::RECOVER.bits()
    | Incompat::META_BG.bits()
    | Incompat::EXTENTS.bits()
    | Incompat::BIT64.bits()
    | Incompat::MMP.bits()
    | Incompat::FLEX_BG.bits()
    | Incompat::EA_INODE.bits()
    | Incompat::CSUM_SEED.bits()
    | Incompat::LARGEDIR.bits()
    | Incompat::INLINE_DATA.bits()
    | Incompat::CASEFOLD.bits()
    | Incompat::ENCRYPT.bits();

/// ENOKEY for the contents of an encrypted regular file (what
/// `fscrypt_file_open` refuses without the key). An encrypted directory's
/// entries are read (their names as no-key names, see [`crate::dir`]), an
/// encrypted symlink's target as a no-key name ([`Fs::read_link`]).
pub fn need_key_for_contents(inode: &crate::inode::InodeInfo) -> Result<(), FsError> {
    if inode.flags & ext4kit_format::fscrypt::ENCRYPT_FL != 0 && inode.is_regular() {
        return Err(FsError::NoKey("the file's contents are encrypted"));
    }
    Ok(())
}

/// ro_compat features the engine knows (others open read-only).
pub const KNOWN_RO_COMPAT: u32 = RoCompat::SPARSE_SUPER.bits()
    | RoCompat::LARGE_FILE.bits()
    | RoCompat::HUGE_FILE.bits()
    | RoCompat::GDT_CSUM.bits()
    | RoCompat::DIR_NLINK.bits()
    | RoCompat::EXTRA_ISIZE.bits()
    | RoCompat::METADATA_CSUM.bits()
    | RoCompat::ORPHAN_PRESENT.bits()
    | RoCompat::QUOTA.bits()
    | RoCompat::PROJECT.bits()
    | RoCompat::VERITY.bits();

fn corrupt(what: &'static str, detail: impl Into<String>) -> FsError {
    FsError::corrupt(what, detail)
}

/// The validated geometry and settings of a filesystem.
#[derive(Clone)]
pub struct FsInfo {
    /// The primary superblock (after an in-memory journal replay, if any).
    pub sb: Superblock,
    pub features: Features,
    pub csum: Csum,
    pub block_size: u32,
    pub blocks_count: u64,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: u16,
    pub first_ino: u32,
    pub desc_size: u16,
    /// Block groups. Their descriptors are checked at load and then read
    /// when needed ([`FsInfo::group_desc`], [`Fs::group_desc`]): nothing
    /// per group is held, so memory does not grow with the filesystem.
    pub groups: u32,
    /// `s_hash_seed`.
    pub hash_seed: [u8; 16],
    /// `s_def_hash_version`.
    pub def_hash_version: u8,
    /// The directory hash uses unsigned chars (`s_flags`).
    pub unsigned_hash: bool,
    /// casefold: `s_encoding_flags` (the encoding is utf8-12.1, the only
    /// one there is); `None` without the feature. Directories with
    /// `EXT4_CASEFOLD_FL` then hash and compare folded names
    /// (`ext4kit_format::casefold`).
    pub casefold: Option<u16>,
    /// Names of ro_compat features the engine does not know (the
    /// filesystem must then be opened read-only).
    pub unknown_ro_compat: Vec<String>,
    /// Journal transactions replayed in memory at open.
    pub replayed_transactions: u32,
}

impl std::fmt::Debug for FsInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsInfo")
            .field("block_size", &self.block_size)
            .field("blocks_count", &self.blocks_count)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

/// Does group `g` hold a superblock backup (libext2fs's
/// `ext2fs_bg_has_super`)? With sparse_super2 only the two groups of
/// `s_backup_bgs` do, else the sparse_super rule applies.
pub use ext4kit_format::layout::group_has_super;
use ext4kit_format::layout::{Backups, DescLayout};

impl FsInfo {
    /// Read and validate the superblock and descriptors through `blocks`.
    pub fn load(blocks: &dyn BlockRead) -> Result<FsInfo, FsError> {
        let info = Self::load_superblock(blocks)?;
        Self::with_descriptors(info, blocks)
    }

    /// Read and validate the superblock through `blocks`; the descriptors
    /// are not read (the caller checks them its own way).
    pub fn load_superblock(blocks: &dyn BlockRead) -> Result<FsInfo, FsError> {
        let bs = blocks.block_size();
        let sb_blk = SUPERBLOCK_OFFSET / u64::from(bs);
        let off = (SUPERBLOCK_OFFSET % u64::from(bs)) as usize;
        let raw = blocks.block(sb_blk)?;
        let sb = Superblock::parse(raw.get(off..off + SUPERBLOCK_SIZE).unwrap_or(&[]))
            .ok_or_else(|| corrupt("superblock", "short block"))?;
        Self::from_superblock(sb, blocks.block_count())
    }

    /// Validate the superblock alone (no descriptors yet); `dev_blocks` is
    /// how many blocks the device holds.
    pub fn from_superblock(sb: Superblock, dev_blocks: u64) -> Result<FsInfo, FsError> {
        if sb.s_magic.get() != EXT4_MAGIC {
            return Err(corrupt(
                "superblock",
                format!(
                    "magic is {:#06x}, not 0xef53 (not an ext2/3/4 filesystem)",
                    sb.s_magic.get()
                ),
            ));
        }
        let features = Features {
            compat: Compat(sb.s_feature_compat.get()),
            incompat: Incompat(sb.s_feature_incompat.get()),
            ro_compat: RoCompat(sb.s_feature_ro_compat.get()),
        };
        if features.metadata_csum() {
            if sb.s_checksum_type != 1 {
                return Err(corrupt(
                    "superblock",
                    format!("unknown checksum type {}", sb.s_checksum_type),
                ));
            }
            if !sb.checksum_ok() {
                return Err(corrupt(
                    "superblock",
                    format!(
                        "checksum {:#010x} does not match the computed {:#010x}",
                        sb.s_checksum.get(),
                        sb.compute_checksum()
                    ),
                ));
            }
        }
        let unknown = features.incompat.bits() & !READ_INCOMPAT;
        if unknown != 0 {
            let bit = 1u32 << unknown.trailing_zeros();
            return Err(FsError::Unsupported(format!(
                "the filesystem has the incompatible feature {}, which ext4kit cannot read",
                Features::name_of(Word::Incompat, bit)
            )));
        }
        let casefold = if features.incompat.contains(Incompat::CASEFOLD) {
            let enc = sb.s_encoding.get();
            if enc != ext4kit_format::casefold::ENC_UTF8_12_1 {
                return Err(FsError::Unsupported(format!(
                    "casefold encoding {enc} (only utf8-12.1, 1, exists)"
                )));
            }
            Some(sb.s_encoding_flags.get())
        } else {
            None
        };
        let unknown_ro = features.ro_compat.bits() & !KNOWN_RO_COMPAT;
        let unknown_ro_compat = (0..32)
            .filter(|b| unknown_ro & (1 << b) != 0)
            .map(|b| Features::name_of(Word::RoCompat, 1 << b))
            .collect();
        let block_size = sb.block_size().filter(|&b| b <= 65536).ok_or_else(|| {
            corrupt(
                "superblock",
                format!("block size 2^{} KiB", sb.s_log_block_size.get()),
            )
        })?;
        let blocks_count = if features.incompat.contains(Incompat::BIT64) {
            sb.blocks_count()
        } else {
            u64::from(sb.s_blocks_count_lo.get())
        };
        let first_data_block = u64::from(sb.s_first_data_block.get());
        // bigalloc starts at block 0 whatever the block size.
        let bigalloc = features.ro_compat.contains(RoCompat::BIGALLOC);
        let expect_first = u64::from(block_size == 1024 && !bigalloc);
        if first_data_block != expect_first {
            return Err(corrupt(
                "superblock",
                format!("first data block {first_data_block} with {block_size}-byte blocks"),
            ));
        }
        if blocks_count <= first_data_block || blocks_count > dev_blocks {
            return Err(corrupt(
                "superblock",
                format!(
                    "{blocks_count} blocks do not fit the device ({dev_blocks} blocks of {block_size} bytes)"
                ),
            ));
        }
        let bpg = sb.s_blocks_per_group.get();
        let ipg = sb.s_inodes_per_group.get();
        // With bigalloc the bitmap limit is on clusters per group.
        let cpg = if bigalloc {
            let cbits = sb
                .s_log_cluster_size
                .get()
                .checked_sub(sb.s_log_block_size.get())
                .filter(|&c| c < 32)
                .ok_or_else(|| corrupt("superblock", "cluster size below the block size"))?;
            if u64::from(sb.s_clusters_per_group.get()) << cbits != u64::from(bpg) {
                return Err(corrupt(
                    "superblock",
                    format!(
                        "{bpg} blocks per group are not {} clusters of 2^{cbits} blocks",
                        sb.s_clusters_per_group.get()
                    ),
                ));
            }
            sb.s_clusters_per_group.get()
        } else {
            bpg
        };
        if bpg == 0 || cpg == 0 || cpg > 8 * block_size || ipg == 0 || ipg > 8 * block_size {
            return Err(corrupt(
                "superblock",
                format!("{bpg} blocks or {ipg} inodes per group"),
            ));
        }
        let rev = sb.s_rev_level.get();
        let (inode_size, first_ino) = if rev == 0 {
            (128u16, 11u32)
        } else {
            (sb.s_inode_size.get(), sb.s_first_ino.get())
        };
        if inode_size < 128 || !inode_size.is_power_of_two() || u32::from(inode_size) > block_size {
            return Err(corrupt("superblock", format!("inode size {inode_size}")));
        }
        let groups64 = (blocks_count - first_data_block).div_ceil(u64::from(bpg));
        let groups = u32::try_from(groups64)
            .map_err(|_| corrupt("superblock", format!("{groups64} groups")))?;
        let inodes_count = sb.s_inodes_count.get();
        if u64::from(inodes_count) != u64::from(ipg) * u64::from(groups) {
            return Err(corrupt(
                "superblock",
                format!("{inodes_count} inodes is not {ipg} per group x {groups} groups"),
            ));
        }
        if first_ino < 11 || first_ino > inodes_count {
            return Err(corrupt("superblock", format!("first inode {first_ino}")));
        }
        let desc_size = if features.incompat.contains(Incompat::BIT64) {
            let d = sb.s_desc_size.get();
            if !(64..=1024).contains(&d) || !d.is_power_of_two() {
                return Err(corrupt("superblock", format!("descriptor size {d}")));
            }
            d
        } else {
            32
        };
        Ok(FsInfo {
            csum: Csum::from_superblock(&sb),
            features,
            block_size,
            blocks_count,
            first_data_block,
            blocks_per_group: bpg,
            inodes_per_group: ipg,
            inodes_count,
            inode_size,
            first_ino,
            desc_size,
            groups,
            hash_seed: sb.s_hash_seed,
            def_hash_version: sb.s_def_hash_version,
            unsigned_hash: sb.s_flags.get() & FLAG_UNSIGNED_HASH != 0,
            casefold,
            unknown_ro_compat,
            replayed_transactions: 0,
            sb,
        })
    }

    /// Descriptors per descriptor block.
    pub fn descs_per_block(&self) -> u32 {
        self.block_size / u32::from(self.desc_size)
    }

    /// First block of group `g`.
    pub fn group_first_block(&self, g: u32) -> u64 {
        self.first_data_block + u64::from(g) * u64::from(self.blocks_per_group)
    }

    /// Where descriptor block `index` lives (meta_bg aware).
    pub fn desc_block(&self, index: u32) -> u64 {
        DescLayout {
            gdt_start: ext4kit_format::layout::gdt_start(self.block_size),
            first_data_block: self.first_data_block,
            blocks_per_group: self.blocks_per_group,
            descs_per_block: self.descs_per_block(),
            first_meta_bg: (self.features.incompat.contains(Incompat::META_BG))
                .then(|| self.sb.s_first_meta_bg.get()),
            backups: Backups::of(&self.sb),
        }
        .primary(index)
    }

    /// Check every descriptor (checksum, locations inside the
    /// filesystem), reading the table in large sequential requests.
    fn with_descriptors(self, blocks: &dyn BlockRead) -> Result<FsInfo, FsError> {
        let per = self.descs_per_block();
        let nblocks = self.groups.div_ceil(per);
        let ds = usize::from(self.desc_size);
        let itb = u64::from(self.inodes_per_group) * u64::from(self.inode_size)
            / u64::from(self.block_size);
        crate::groups::scan_desc_blocks(
            blocks,
            nblocks,
            |i| self.desc_block(i),
            |i, blk, raw| {
                for j in 0..per {
                    let g = i * per + j;
                    if g >= self.groups {
                        break;
                    }
                    let bytes = &raw[j as usize * ds..(j as usize + 1) * ds];
                    self.check_desc(g, blk, bytes, itb)?;
                }
                Ok(())
            },
        )?;
        Ok(self)
    }

    fn check_desc(&self, g: u32, blk: u64, bytes: &[u8], itb: u64) -> Result<GroupDesc, FsError> {
        let d = GroupDesc::parse(bytes)
            .ok_or_else(|| corrupt("group descriptor", format!("group {g}")))?;
        // The checksum covers the whole s_desc_size bytes.
        let ok = !(self.csum.metadata || self.csum.gdt)
            || self.csum.group_desc(g, bytes) == d.bg_checksum.get();
        if !ok {
            return Err(corrupt(
                "group descriptor",
                format!("group {g} (block {blk}): checksum does not match"),
            ));
        }
        let lo = self.first_data_block;
        let hi = self.blocks_count;
        let bad = |b: u64, n: u64| b < lo || b.checked_add(n).is_none_or(|e| e > hi);
        if bad(d.block_bitmap(), 1) || bad(d.inode_bitmap(), 1) || bad(d.inode_table(), itb) {
            return Err(corrupt(
                "group descriptor",
                format!(
                    "group {g}: bitmap or inode table outside the filesystem \
                     (block bitmap {}, inode bitmap {}, table {})",
                    d.block_bitmap(),
                    d.inode_bitmap(),
                    d.inode_table()
                ),
            ));
        }
        Ok(d)
    }

    /// Group `g`'s descriptor as `blocks` has it now, checked as at load.
    pub fn group_desc(&self, blocks: &dyn BlockRead, g: u32) -> Result<GroupDesc, FsError> {
        if g >= self.groups {
            return Err(corrupt(
                "group number",
                format!("{g} is outside 0..{}", self.groups),
            ));
        }
        let per = self.descs_per_block();
        let ds = usize::from(self.desc_size);
        let blk = self.desc_block(g / per);
        let raw = blocks.block(blk)?;
        let off = (g % per) as usize * ds;
        let bytes = raw
            .get(off..off + ds)
            .ok_or_else(|| corrupt("group descriptor", format!("group {g}")))?;
        let itb = u64::from(self.inodes_per_group) * u64::from(self.inode_size)
            / u64::from(self.block_size);
        self.check_desc(g, blk, bytes, itb)
    }

    /// Is `blk..blk+len` inside the filesystem's data area?
    pub fn range_ok(&self, blk: u64, len: u64) -> bool {
        blk >= self.first_data_block && blk.checked_add(len).is_some_and(|e| e <= self.blocks_count)
    }

    /// Both group-descriptor checksum flavours use `bg_itable_unused`.
    pub fn has_group_csum(&self) -> bool {
        self.features.has_group_csum()
    }
}

/// A filesystem opened for reading on a device: its blocks (with a dirty
/// journal replayed in memory) and its validated settings.
pub struct Volume<'d> {
    pub blocks: DeviceBlocks<'d>,
    pub info: FsInfo,
}

impl<'d> Volume<'d> {
    /// Open `dev` read-only. A dirty journal (needs_recovery with a live
    /// log) is replayed into an overlay: reads see the recovered state,
    /// the device is never written.
    pub fn open(dev: &'d dyn Device) -> Result<Volume<'d>, FsError> {
        if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(corrupt(
                "superblock",
                format!("the device has only {} bytes", dev.size()),
            ));
        }
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
        let sb = Superblock::parse(&raw).ok_or_else(|| corrupt("superblock", "short read"))?;
        let bs = sb.block_size().filter(|&b| b <= 65536).unwrap_or(1024);
        let dev_blocks = dev.size() / u64::from(bs);
        // Validate before touching the journal (feature refusal first).
        let pre = FsInfo::from_superblock(sb, dev_blocks)?;
        let mut blocks = DeviceBlocks::new(dev, pre.block_size, pre.blocks_count);
        let mut replayed = 0;
        if pre.features.incompat.contains(Incompat::RECOVER)
            && pre.features.compat.contains(Compat::HAS_JOURNAL)
        {
            let j = Journal::open(dev)?;
            let rec = recover::recover(dev, &j)?;
            replayed = rec.transactions();
            // Fast commits the replay covers are overlaid too (computed,
            // never written); one it refuses leaves the full commits'
            // state, as before the replay existed.
            let fc = recover::fast_commit_result(dev, &j, &rec).unwrap_or_default();
            for (blk, data) in rec.writes.into_iter().chain(fc) {
                blocks.overlay(blk, data);
            }
        }
        let mut info = FsInfo::load(&blocks)?;
        info.replayed_transactions = replayed;
        Ok(Volume { blocks, info })
    }

    /// The read operations over this volume.
    pub fn fs(&self) -> Fs<'_> {
        Fs {
            blocks: &self.blocks,
            info: &self.info,
        }
    }
}

/// Read operations over some [`BlockRead`] and the filesystem's settings.
#[derive(Clone, Copy)]
pub struct Fs<'a> {
    pub blocks: &'a dyn BlockRead,
    pub info: &'a FsInfo,
}

impl<'a> Fs<'a> {
    /// Read block `blk`, refusing numbers outside the filesystem (`what`
    /// names the structure for the error).
    pub fn meta_block(&self, blk: u64, what: &'static str) -> Result<Vec<u8>, FsError> {
        if !self.info.range_ok(blk, 1) {
            return Err(corrupt(
                what,
                format!(
                    "block {blk} is outside the filesystem ({} blocks)",
                    self.info.blocks_count
                ),
            ));
        }
        self.blocks.block(blk)
    }

    /// Group `g`'s current descriptor (checked).
    pub fn group_desc(&self, g: u32) -> Result<GroupDesc, FsError> {
        self.info.group_desc(self.blocks, g)
    }

    /// A parsed copy of the on-disk inode (for writers that need it).
    pub fn disk_inode(&self, raw: &[u8]) -> Option<Inode> {
        Inode::parse(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::recover::tests::image;

    #[test]
    fn fresh_filesystem_reads() {
        let dev = image();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let root = fs.root().unwrap();
        assert_eq!(root.links, 3);
        assert_eq!(root.mtime.sec, 1_700_000_000);
        let names: Vec<Vec<u8>> = fs
            .read_dir(&root)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            vec![b".".to_vec(), b"..".to_vec(), b"lost+found".to_vec()]
        );
        let lf = fs.resolve(b"/lost+found/../lost+found/.", false).unwrap();
        assert_eq!(lf.ino, 11);
        assert!(matches!(
            fs.resolve(b"/nope", false),
            Err(FsError::NotFound)
        ));
        assert!(matches!(
            fs.resolve(b"/lost+found/x/y", false),
            Err(FsError::NotFound)
        ));
        assert!(fs.xattrs(&root).unwrap().is_empty());
        // The journal inode: one extent of 1024 blocks.
        let j = fs.inode(8).unwrap();
        let maps = fs.extents(&j).unwrap();
        assert_eq!(
            maps.iter().map(|m| u64::from(m.len)).sum::<u64>(),
            j.size / 4096
        );
        // An inode past the table's used part is refused.
        assert!(matches!(fs.inode(5000), Err(FsError::Corrupt { .. })));
        assert!(matches!(fs.inode(0), Err(FsError::Corrupt { .. })));
    }

    #[test]
    fn damage_is_named() {
        let dev = image();
        let vol = Volume::open(&dev).unwrap();
        let table = vol.fs().group_desc(0).unwrap().inode_table();
        let bs = u64::from(vol.info.block_size);
        let root_dir_blk = vol.fs().file_map(&vol.fs().root().unwrap()).unwrap()[0].pblk;
        drop(vol);
        // The root inode's checksum.
        let d2 = dev.snapshot();
        let mut b = [0u8; 1];
        let off = table * bs + 256 + 0x20; // inode 2, i_mtime
        d2.read_at(&mut b, off).unwrap();
        d2.write_at(&[b[0] ^ 1], off).unwrap();
        let vol = Volume::open(&d2).unwrap();
        let e = vol.fs().root().unwrap_err().to_string();
        assert!(e.contains("inode 2") && e.contains("checksum"), "{e}");
        // A directory block's checksum.
        let d3 = dev.snapshot();
        d3.write_at(b"X", root_dir_blk * bs + 24 + 8).unwrap();
        let vol = Volume::open(&d3).unwrap();
        let fs = vol.fs();
        let e = fs.read_dir(&fs.root().unwrap()).unwrap_err().to_string();
        assert!(
            e.contains("inode 2 block 0") && e.contains("checksum"),
            "{e}"
        );
        // A group descriptor's checksum.
        let d4 = dev.snapshot();
        d4.write_at(&[0x5a], bs + 0x0C).unwrap();
        let e = Volume::open(&d4).err().unwrap().to_string();
        assert!(e.contains("group 0") && e.contains("checksum"), "{e}");
    }

    #[test]
    fn sparse_super_groups() {
        use zerocopy::FromZeros;
        let mut sb = Superblock::new_zeroed();
        assert!(group_has_super(&sb, 4));
        sb.s_feature_ro_compat.set(RoCompat::SPARSE_SUPER.bits());
        let with: Vec<u32> = (0..130).filter(|&g| group_has_super(&sb, g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125]);
        // sparse_super2: the primary and the two s_backup_bgs only (a
        // meta_bg descriptor block follows the backup in group 64).
        sb.s_feature_compat.set(Compat::SPARSE_SUPER2.bits());
        sb.s_backup_bgs[0].set(1);
        sb.s_backup_bgs[1].set(64);
        let with: Vec<u32> = (0..130).filter(|&g| group_has_super(&sb, g)).collect();
        assert_eq!(with, vec![0, 1, 64]);
    }
}
