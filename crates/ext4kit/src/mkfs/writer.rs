//! The mkfs writer: turns a [`Layout`] plus the superblock settings into
//! device operations, in a crash-sensible order (old superblock area wiped
//! first, primary superblock written last after a flush).
//!
//! Thin-aware: every range mke2fs would zero is zeroed only when the
//! device cannot prove it already reads as zero, and zeroing punches holes
//! on files, so a sparse image stays sparse.

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::dir;
use ext4kit_format::extent::{self, Extent, ExtentHeader, ExtentIndex};
use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ext4kit_format::inode::{self, EXT4_EXTENTS_FL, EXTRA_ISIZE, Inode, S_IFDIR, S_IFREG};
use ext4kit_format::jbd2::JournalSuperblock;
use ext4kit_format::superblock::{self, Superblock};
use ext4kit_format::{Csum, GroupDesc, orphan};
use zerocopy::IntoBytes;

use super::geometry::{FileMap, Layout};

/// `EXT2_FLAGS_TEST_FILESYS`: ext4 code in development may mount it.
const FLAG_TEST_FILESYS: u32 = 0x0004;

/// Superblock settings that are not geometry.
#[derive(Clone, Debug)]
pub struct SuperSettings {
    pub uuid: [u8; 16],
    pub hash_seed: [u8; 16],
    pub now: u32,
    pub label: [u8; 16],
    pub last_mounted: [u8; 64],
    pub def_hash_version: u8,
    pub default_mount_opts: u32,
    pub errors: u16,
    pub creator_os: u32,
    pub max_mnt_count: u16,
    pub checkinterval: u32,
    pub raid_stride: u16,
    pub raid_stripe_width: u32,
    pub root_uid: u32,
    pub root_gid: u32,
    /// Zero the whole inode tables / journal (false = lazy).
    pub lazy_itable_init: bool,
    pub lazy_journal_init: bool,
    /// The tables were proven zero (discard zeroes, or the user said so).
    pub itable_zeroed: bool,
    /// Write `s_kbytes_written` as mke2fs would.
    pub kbytes_written: u64,
    /// `s_rev_level`: 1, or 0 with `-r 0`.
    pub rev_level: u32,
    /// `-E test_fs`: `EXT2_FLAGS_TEST_FILESYS` in `s_flags`.
    pub test_fs: bool,
    /// casefold: `s_encoding` and `s_encoding_flags` (0 without it).
    pub encoding: u16,
    pub encoding_flags: u16,
    /// `-E mmp_update_interval=` as given (0 = the default; mke2fs stores
    /// it even without mmp).
    pub mmp_update_interval: u16,
    /// The host part of the MMP block (`-O mmp`; see [`super::mmp`]).
    pub mmp_host: super::mmp::MmpHost,
    /// `-J device=`: the external journal (`s_journal_uuid`,
    /// `s_journal_dev`; no journal inode).
    pub external_journal: Option<super::journal_dev::ExternalJournal>,
}

/// `EXT4_ENCRYPTION_MODE_AES_256_XTS` and `_AES_256_CTS`: the default
/// contents and file name modes mke2fs records with `-O encrypt`.
const ENCRYPT_ALGOS: [u8; 4] = [1, 4, 0, 0];
/// `EXT2_ERROR_FS`: mke2fs -S marks the filesystem for a check.
const STATE_ERROR: u16 = 0x0002;
/// The in-inode extended attribute header magic (`EXT2_EXT_ATTR_MAGIC`).
const XATTR_MAGIC: u32 = 0xEA02_0000;

/// Statistics of one run, for reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WriteStats {
    pub bytes_written: u64,
    pub bytes_zeroed: u64,
    pub bytes_already_zero: u64,
    pub write_calls: u64,
}

impl WriteStats {
    /// Add another run's numbers.
    pub fn add(&mut self, o: &WriteStats) {
        self.bytes_written += o.bytes_written;
        self.bytes_zeroed += o.bytes_zeroed;
        self.bytes_already_zero += o.bytes_already_zero;
        self.write_calls += o.write_calls;
    }
}

/// Errors while writing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Buffers writes and coalesces adjacent ones into large `pwrite`s.
pub(super) struct Out<'a> {
    dev: &'a dyn Device,
    bs: u64,
    pending_off: u64,
    pending: Vec<u8>,
    pub(super) stats: WriteStats,
}

const MAX_PENDING: usize = 8 << 20;
const WRITEBACK_THRESHOLD: usize = 1 << 20;

impl<'a> Out<'a> {
    pub(super) fn new(dev: &'a dyn Device, bs: u32) -> Self {
        Self {
            dev,
            bs: u64::from(bs),
            pending_off: 0,
            pending: Vec::new(),
            stats: WriteStats::default(),
        }
    }
    pub(super) fn write(&mut self, off: u64, data: &[u8]) -> Result<(), WriteError> {
        if !self.pending.is_empty()
            && self.pending_off + self.pending.len() as u64 == off
            && self.pending.len() < MAX_PENDING
        {
            self.pending.extend_from_slice(data);
            return Ok(());
        }
        self.flush_pending()?;
        if data.len() >= WRITEBACK_THRESHOLD {
            // Large buffers (GDT copies) go out directly, without a copy.
            self.dev.write_at(data, off)?;
            self.dev.start_writeback(off, data.len() as u64)?;
            self.stats.bytes_written += data.len() as u64;
            self.stats.write_calls += 1;
            return Ok(());
        }
        self.pending_off = off;
        self.pending.extend_from_slice(data);
        Ok(())
    }
    /// Is `[off, off+len)` known to read as zero, with no buffered write
    /// over it? (Then writing zeros there changes no byte.)
    pub(super) fn known_zero(&self, off: u64, len: u64) -> Result<bool, WriteError> {
        let (p, pl) = (self.pending_off, self.pending.len() as u64);
        if pl > 0 && p < off + len && off < p + pl {
            return Ok(false);
        }
        Ok(self.dev.is_known_zero(off, len)?)
    }
    pub(super) fn block(&mut self, blk: u64, data: &[u8]) -> Result<(), WriteError> {
        self.write(blk * self.bs, data)
    }
    pub(super) fn flush_pending(&mut self) -> Result<(), WriteError> {
        if !self.pending.is_empty() {
            self.dev.write_at(&self.pending, self.pending_off)?;
            if self.pending.len() >= WRITEBACK_THRESHOLD {
                // Let the device work on large runs while we produce the
                // rest; the final flush then waits for less.
                self.dev
                    .start_writeback(self.pending_off, self.pending.len() as u64)?;
            }
            self.stats.bytes_written += self.pending.len() as u64;
            self.stats.write_calls += 1;
            self.pending.clear();
        }
        Ok(())
    }
    /// Make `[off, off+len)` read as zero, touching only what is not known
    /// to be zero already.
    pub(super) fn zero(&mut self, off: u64, len: u64) -> Result<(), WriteError> {
        if len == 0 {
            return Ok(());
        }
        self.flush_pending()?;
        let known = self.dev.known_zero_ranges(off, len)?;
        let mut cur = off;
        let end = off + len;
        let zero_range = |s: u64, e: u64, st: &mut WriteStats| -> Result<(), WriteError> {
            if e > s {
                self.dev.zeroout(s, e - s)?;
                st.bytes_zeroed += e - s;
            }
            Ok(())
        };
        for (s, e) in known {
            let s = s.max(off);
            let e = e.min(end);
            if s >= e {
                continue;
            }
            zero_range(cur, s, &mut self.stats)?;
            self.stats.bytes_already_zero += e - s;
            cur = cur.max(e);
        }
        zero_range(cur, end, &mut self.stats)?;
        Ok(())
    }
    pub(super) fn zero_blocks(&mut self, blk: u64, n: u64) -> Result<(), WriteError> {
        self.zero(blk * self.bs, n * self.bs)
    }
    /// Zero the block runs `(first block, count)` in order, physically
    /// adjacent ones as one range: one known-zero question per range
    /// instead of per run (over NBD each is a round trip); the result is
    /// the same bytes.
    pub(super) fn zero_runs(
        &mut self,
        runs: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<(), WriteError> {
        let mut span: Option<(u64, u64)> = None;
        for (p, n) in runs {
            match span.as_mut() {
                Some((sp, sn)) if *sp + *sn == p => *sn += n,
                _ => {
                    if let Some((sp, sn)) = span.replace((p, n)) {
                        self.zero_blocks(sp, sn)?;
                    }
                }
            }
        }
        match span {
            Some((sp, sn)) => self.zero_blocks(sp, sn),
            None => Ok(()),
        }
    }
}

/// The checksum context of the filesystem `l` with `settings`.
pub(crate) fn layout_csum(l: &Layout, settings: &SuperSettings) -> Csum {
    let metadata = l.features.ro_compat.contains(RoCompat::METADATA_CSUM);
    let seed_feature = l.features.incompat.contains(Incompat::CSUM_SEED);
    let seed = ext4kit_format::checksum::crc32c_raw(!0, &settings.uuid);
    Csum::new(
        metadata,
        l.features.ro_compat.contains(RoCompat::GDT_CSUM),
        seed_feature,
        seed,
        settings.uuid,
    )
}

/// Everything needed to write the filesystem.
pub struct Writer<'a> {
    pub layout: &'a Layout,
    pub settings: &'a SuperSettings,
}

impl Writer<'_> {
    fn csum(&self) -> Csum {
        layout_csum(self.layout, self.settings)
    }

    /// The superblock as mke2fs leaves it (primary copy).
    pub fn superblock(&self) -> Superblock {
        let l = self.layout;
        let s = self.settings;
        let mut sb = Superblock::zeroed();
        sb.s_inodes_count.set(l.inodes_count);
        sb.set_blocks_count(l.blocks_count);
        sb.set_r_blocks_count(l.r_blocks_count);
        sb.set_free_blocks_count(l.free_blocks);
        sb.s_free_inodes_count.set(l.free_inodes);
        sb.s_first_data_block.set(l.first_data_block as u32);
        let log = (l.block_size / 1024).trailing_zeros();
        sb.s_log_block_size.set(log);
        sb.s_log_cluster_size.set(log + l.cluster_bits);
        sb.s_blocks_per_group.set(l.blocks_per_group);
        sb.s_clusters_per_group.set(l.clusters_per_group());
        sb.s_inodes_per_group.set(l.inodes_per_group);
        sb.s_wtime.set(s.now);
        sb.s_max_mnt_count.set(s.max_mnt_count);
        sb.s_magic.set(superblock::EXT4_MAGIC);
        sb.s_state.set(superblock::STATE_VALID);
        sb.s_errors.set(s.errors);
        sb.s_lastcheck.set(s.now);
        sb.s_checkinterval.set(s.checkinterval);
        sb.s_creator_os.set(s.creator_os);
        sb.s_rev_level.set(s.rev_level);
        sb.s_first_ino.set(l.first_ino);
        sb.s_inode_size.set(l.inode_size);
        sb.s_feature_compat.set(l.features.compat.bits());
        sb.s_feature_incompat.set(l.features.incompat.bits());
        sb.s_feature_ro_compat.set(l.features.ro_compat.bits());
        sb.s_uuid = s.uuid;
        sb.s_volume_name = s.label;
        sb.s_last_mounted = s.last_mounted;
        sb.s_reserved_gdt_blocks.set(l.reserved_gdt_blocks as u16);
        sb.s_first_meta_bg.set(l.first_meta_bg);
        sb.s_hash_seed = s.hash_seed;
        sb.s_def_hash_version = s.def_hash_version;
        sb.s_desc_size.set(l.desc_size);
        sb.s_default_mount_opts.set(s.default_mount_opts);
        sb.s_mkfs_time.set(s.now);
        if l.inode_size >= 160 {
            sb.s_min_extra_isize.set(EXTRA_ISIZE);
            sb.s_want_extra_isize.set(EXTRA_ISIZE);
        }
        // ext2fs_initialize returns before the hash flag for a journal
        // device.
        let hash_flag = if super::journal_dev::is_journal_dev(l) {
            0
        } else {
            superblock::FLAG_SIGNED_HASH
        };
        sb.s_flags
            .set(hash_flag | if s.test_fs { FLAG_TEST_FILESYS } else { 0 });
        sb.s_raid_stride.set(s.raid_stride);
        sb.s_raid_stripe_width.set(s.raid_stripe_width);
        sb.s_log_groups_per_flex = l.log_groups_per_flex;
        sb.s_kbytes_written.set(s.kbytes_written);
        sb.s_overhead_clusters.set(l.overhead as u32);
        if let Some(j) = &l.journal {
            sb.s_journal_inum.set(inode::JOURNAL_INO);
            let ino = self.journal_inode(j);
            for (i, w) in ino.i_block.iter().enumerate() {
                sb.s_jnl_blocks[i] = *w;
            }
            sb.s_jnl_blocks[15].set(ino.i_size_high.get());
            sb.s_jnl_blocks[16].set(ino.i_size_lo.get());
            sb.s_jnl_backup_type = 1;
        }
        if let Some(ej) = &s.external_journal {
            // ext2fs_add_journal_device.
            sb.s_journal_uuid = ej.uuid;
            sb.s_journal_dev.set(ej.rdev);
        }
        if l.features.ro_compat.contains(RoCompat::METADATA_CSUM) {
            sb.s_checksum_type = 1;
        }
        if l.features.incompat.contains(Incompat::CSUM_SEED) {
            sb.s_checksum_seed
                .set(ext4kit_format::checksum::crc32c_raw(!0, &s.uuid));
        }
        if let Some((ino, _)) = &l.orphan {
            sb.s_orphan_file_inum.set(*ino);
        }
        self.feature_fields(&mut sb);
        for q in &l.quota {
            match q.qtype {
                0 => sb.s_usr_quota_inum.set(q.ino),
                1 => sb.s_grp_quota_inum.set(q.ino),
                _ => sb.s_prj_quota_inum.set(q.ino),
            }
        }
        if l.features.ro_compat.contains(RoCompat::METADATA_CSUM) {
            sb.update_checksum();
        }
        sb
    }

    /// The superblock fields of sparse_super2, casefold, encrypt, mmp and
    /// of -S.
    fn feature_fields(&self, sb: &mut Superblock) {
        let l = self.layout;
        let s = self.settings;
        for (k, g) in l.backup_bgs.iter().enumerate() {
            sb.s_backup_bgs[k].set(*g);
        }
        sb.s_encoding.set(s.encoding);
        sb.s_encoding_flags.set(s.encoding_flags);
        if l.features.incompat.contains(Incompat::ENCRYPT) {
            sb.s_encrypt_algos = ENCRYPT_ALGOS;
        }
        let mut interval = s.mmp_update_interval;
        if let Some(b) = l.mmp_block {
            interval = super::mmp::effective_interval(interval).unwrap_or(interval);
            sb.s_mmp_block.set(b);
        }
        sb.s_mmp_interval.set(interval);
        if l.super_only {
            sb.s_state.set(sb.s_state.get() | STATE_ERROR);
            if l.features.compat.contains(Compat::HAS_JOURNAL) && s.external_journal.is_none() {
                sb.s_journal_inum.set(inode::JOURNAL_INO);
            }
        }
    }

    fn base_inode(&self, mode: u16, links: u16) -> Inode {
        let now = self.settings.now;
        let mut i = Inode::default();
        i.i_mode.set(mode);
        i.i_links_count.set(links);
        i.i_atime.set(now);
        i.i_ctime.set(now);
        i.i_mtime.set(now);
        if self.layout.inode_size > 128 {
            i.i_extra_isize.set(EXTRA_ISIZE);
            i.i_crtime.set(now);
        }
        i
    }

    fn extents_enabled(&self) -> bool {
        self.layout.features.incompat.contains(Incompat::EXTENTS)
    }

    /// Fill `i_block` with an extent root (or block pointers) for `fm`.
    fn map_file(&self, ino: &mut Inode, fm: &FileMap) {
        // i_blocks: clusters with bigalloc (which needs extents).
        let i_blocks = self.layout.i_blocks_512(fm);
        if let Some(bm) = &fm.blockmap {
            for (k, p) in bm.i_block.iter().enumerate() {
                ino.i_block[k].set(*p);
            }
            ino.set_blocks_512(i_blocks);
            return;
        }
        if !self.extents_enabled() {
            // Direct block pointers (only small files reach here).
            let mut n = 0;
            for r in &fm.runs {
                for k in 0..r.len {
                    if n < 12 {
                        ino.i_block[n].set((r.pblk + u64::from(k)) as u32);
                    }
                    n += 1;
                }
            }
            ino.set_blocks_512(i_blocks);
            return;
        }
        ino.i_flags.set(ino.i_flags.get() | EXT4_EXTENTS_FL);
        let area = ino.i_block_bytes_mut();
        if let Some(leaf) = fm.leaf {
            let h = ExtentHeader::new(1, extent::ENTRIES_IN_INODE, 1);
            area[..12].copy_from_slice(h.as_bytes());
            area[12..24].copy_from_slice(ExtentIndex::new(0, leaf).as_bytes());
            // libext2fs moves the four in-inode extents into the new leaf
            // and leaves the stale copies of extents 1..3 in slots 2..4.
            for (k, r) in fm.runs.iter().enumerate().take(4).skip(1) {
                let e = Extent::new(r.lblk, r.len as u16, r.pblk);
                area[12 + 12 * k..24 + 12 * k].copy_from_slice(e.as_bytes());
            }
        } else {
            let h = ExtentHeader::new(fm.runs.len() as u16, extent::ENTRIES_IN_INODE, 0);
            area[..12].copy_from_slice(h.as_bytes());
            for (k, r) in fm.runs.iter().enumerate() {
                let e = Extent::new(r.lblk, r.len as u16, r.pblk);
                area[12 + 12 * k..24 + 12 * k].copy_from_slice(e.as_bytes());
            }
        }
        ino.set_blocks_512(i_blocks);
    }

    fn journal_inode(&self, j: &FileMap) -> Inode {
        let l = self.layout;
        let mut i = self.base_inode(S_IFREG | 0o600, 1);
        i.set_size(u64::from(l.journal_blocks) * u64::from(l.block_size));
        self.map_file(&mut i, j);
        i
    }

    /// Leaf block of a depth-1 extent tree.
    fn leaf_block(&self, ino: u32, fm: &FileMap, csum: &Csum) -> Vec<u8> {
        let bs = self.layout.block_size as usize;
        let mut buf = vec![0u8; bs];
        let max = extent::entries_per_block(bs as u32);
        let h = ExtentHeader::new(fm.runs.len() as u16, max, 0);
        buf[..12].copy_from_slice(h.as_bytes());
        for (k, r) in fm.runs.iter().enumerate() {
            let e = Extent::new(r.lblk, r.len as u16, r.pblk);
            buf[12 + 12 * k..24 + 12 * k].copy_from_slice(e.as_bytes());
        }
        if csum.metadata {
            extent::set_block_checksum(&mut buf, ino, 0, csum);
        }
        buf
    }

    /// Inode table block 0.. contents for the special inodes, as
    /// `(inode number, on-disk bytes)`.
    fn special_inodes(&self, csum: &Csum) -> Vec<(u32, Vec<u8>)> {
        let l = self.layout;
        let s = self.settings;
        let isz = usize::from(l.inode_size);
        let bs = u64::from(l.block_size);
        let mut out: Vec<(u32, Vec<u8>)> = Vec::new();
        let put = |ino: u32, i: &Inode, out: &mut Vec<(u32, Vec<u8>)>| {
            let mut slot = vec![0u8; isz];
            i.write_to(&mut slot, ino, csum);
            out.push((ino, slot));
        };
        // Reserved inodes: zeroed with a checksum (metadata_csum only),
        // bad-blocks inode with its times.
        for ino in 1..l.first_ino {
            if ino == 2
                || (ino == 7 && l.resize_dind.is_some())
                || (ino == 8 && l.journal.is_some())
            {
                continue;
            }
            let mut i = Inode::default();
            if ino == 1 {
                i.i_atime.set(s.now);
                i.i_ctime.set(s.now);
                i.i_mtime.set(s.now);
                if let Some(bb) = l.bad_blocks.as_ref().filter(|b| !b.blocks.is_empty()) {
                    // ext2fs_update_bb_inode: i_blocks counts the bad
                    // blocks, not the indirect ones.
                    let n = bb.blocks.len() as u64;
                    i.set_size(n * bs);
                    if let Some(bm) = &bb.map.blockmap {
                        for (k, p) in bm.i_block.iter().enumerate() {
                            i.i_block[k].set(*p);
                        }
                    }
                    i.set_blocks_512(n * bs / 512);
                }
            } else if !csum.metadata {
                continue;
            }
            put(ino, &i, &mut out);
        }
        // Root (with the huge files' entries and directories, if any).
        let hroot = l.hugefiles.as_ref().and_then(|h| h.root());
        let root_map = hroot.map_or(&l.root, |d| &d.map);
        let links = match &l.populated {
            Some(p) => p.root_links,
            None => hroot.map_or(3, |d| d.links),
        };
        let mut root = self.base_inode(S_IFDIR | 0o755, links);
        if l.populated.as_ref().is_some_and(|p| p.root_indexed) {
            root.i_flags.set(root.i_flags.get() | inode::EXT4_INDEX_FL);
        }
        root.i_uid.set(s.root_uid as u16);
        root.l_i_uid_high.set((s.root_uid >> 16) as u16);
        root.i_gid.set(s.root_gid as u16);
        root.l_i_gid_high.set((s.root_gid >> 16) as u16);
        root.set_size(bs * root_map.blocks());
        self.map_file(&mut root, root_map);
        put(2, &root, &mut out);
        // mk_hugefiles' directories and files.
        if let Some(h) = &l.hugefiles {
            let owner = |i: &mut Inode, uid: u32, gid: u32| {
                i.i_uid.set(uid as u16);
                i.l_i_uid_high.set((uid >> 16) as u16);
                i.i_gid.set(gid as u16);
                i.l_i_gid_high.set((gid >> 16) as u16);
            };
            for d in h.dirs.iter().filter(|d| d.ino != 2) {
                let mut i = self.base_inode(d.mode, d.links);
                owner(&mut i, d.uid, d.gid);
                if let Some(ents) = &d.inline {
                    // Still inline: `..` and the entries in i_block.
                    i.set_size(60);
                    i.i_flags.set(i.i_flags.get() | inode::EXT4_INLINE_DATA_FL);
                    let area = i.i_block_bytes_mut();
                    area[..4].copy_from_slice(&d.parent.to_le_bytes());
                    let filetype = l.features.incompat.contains(Incompat::FILETYPE);
                    let mut off = 4;
                    for e in ents {
                        let ft = if filetype { e.ft } else { 0 };
                        dir::put_entry(area, off, e.ino, e.rec_len as u16, &e.name, ft);
                        off += e.rec_len as usize;
                    }
                } else {
                    i.set_size(bs * d.map.blocks());
                    self.map_file(&mut i, &d.map);
                }
                put(d.ino, &i, &mut out);
                if d.was_inline {
                    self.inline_dir_xattr(out.last_mut(), d.ino, d.inline.is_some(), csum);
                }
            }
            for f in &h.files {
                let mut i = self.base_inode(f.mode, 1);
                owner(&mut i, f.uid, f.gid);
                i.set_size(f.size);
                i.i_flags.set(i.i_flags.get() | EXT4_EXTENTS_FL);
                i.i_block_bytes_mut().copy_from_slice(&f.i_block);
                i.set_blocks_512(f.counted_blocks * bs / 512);
                put(f.ino, &i, &mut out);
            }
        }
        // Resize inode.
        if let Some(dind) = l.resize_dind {
            let mut r = self.base_inode(S_IFREG | 0o600, 1);
            r.set_size(super::geometry::resize_inode_size(l.block_size));
            r.i_block[13].set(dind as u32);
            let backups = self.backup_group_list().len() as u64;
            let blocks = 1 + u64::from(l.reserved_gdt_blocks) * (1 + backups);
            // ext2fs_iblk_add_blocks: a cluster for each block.
            r.set_blocks_512(((blocks * bs) << l.cluster_bits) / 512);
            put(7, &r, &mut out);
        }
        if let Some(j) = &l.journal {
            put(8, &self.journal_inode(j), &mut out);
        }
        // lost+found.
        let mut lpf = self.base_inode(S_IFDIR | 0o700, 2);
        lpf.set_size(bs * l.lost_found.blocks());
        self.map_file(&mut lpf, &l.lost_found);
        put(11, &lpf, &mut out);
        if self.inline_data() {
            // lost+found was an inline directory: its emptied in-inode
            // attribute area keeps the header magic.
            if let Some((_, slot)) = out.last_mut() {
                let at = 128 + usize::from(EXTRA_ISIZE);
                if slot.len() >= at + 4 {
                    slot[at..at + 4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
                    if csum.metadata {
                        inode::set_checksum(slot, 11, csum);
                    }
                }
            }
        }
        if let Some((ino, fm)) = &l.orphan {
            let mut o = self.base_inode(S_IFREG | 0o600, 1);
            o.set_size(bs * fm.blocks());
            self.map_file(&mut o, fm);
            put(*ino, &o, &mut out);
        }
        // Quota files (quota_inode_init_new): immutable regular files.
        for q in &l.quota {
            let mut i = self.base_inode(S_IFREG | 0o600, 1);
            i.i_flags.set(inode::EXT2_IMMUTABLE_FL);
            i.set_size(q.data.len() as u64);
            self.map_file(&mut i, &q.map);
            out.retain(|(n, _)| *n != q.ino);
            put(q.ino, &i, &mut out);
        }
        // (mkfs -d's inodes are copied from `Populated::table` by
        // write_body, not held here a second time.)
        out.sort_by_key(|(i, _)| *i);
        out
    }

    /// The in-inode attribute area of a directory ext2fs_mkdir made
    /// inline: the empty `system.data` attribute while it is inline, only
    /// the header magic once ext2fs_inline_data_ea_remove has run.
    fn inline_dir_xattr(
        &self,
        slot: Option<&mut (u32, Vec<u8>)>,
        ino: u32,
        inline: bool,
        csum: &Csum,
    ) {
        let Some((_, slot)) = slot else {
            return;
        };
        let at = 128 + usize::from(EXTRA_ISIZE);
        if slot.len() < at + 4 + 24 {
            return;
        }
        slot[at..at + 4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
        if inline {
            // e_name_len, e_name_index (system), e_value_offs (an empty
            // value at the end of the area), inum, size and hash 0, "data".
            let e = at + 4;
            let room = slot.len() - e;
            slot[e] = 4;
            slot[e + 1] = 7;
            slot[e + 2..e + 4].copy_from_slice(&(room as u16).to_le_bytes());
            slot[e + 16..e + 20].copy_from_slice(b"data");
        }
        if csum.metadata {
            inode::set_checksum(slot, ino, csum);
        }
    }

    fn backup_group_list(&self) -> Vec<u32> {
        self.layout.backup_groups().collect()
    }

    fn inline_data(&self) -> bool {
        self.layout
            .features
            .incompat
            .contains(Incompat::INLINE_DATA)
    }

    fn dir_block(&self, entries: &[(u32, &[u8], u8)], dir_ino: u32, csum: &Csum) -> Vec<u8> {
        let bs = self.layout.block_size as usize;
        let mut buf = vec![0u8; bs];
        let limit = if csum.metadata {
            bs - dir::TAIL_SIZE
        } else {
            bs
        };
        let mut off = 0;
        for (k, (ino, name, ft)) in entries.iter().enumerate() {
            let rl = if k + 1 == entries.len() {
                limit - off
            } else {
                dir::rec_len(name.len())
            };
            let ft = if self.layout.features.incompat.contains(Incompat::FILETYPE) {
                *ft
            } else {
                0
            };
            off = dir::put_entry(&mut buf, off, *ino, rl as u16, name, ft);
        }
        if entries.is_empty() {
            dir::put_entry(&mut buf, 0, 0, limit as u16, b"", 0);
        }
        if csum.metadata {
            dir::put_tail(&mut buf, dir_ino, 0, csum);
        }
        buf
    }

    /// A directory block of the huge files' model (entries with their
    /// record lengths, as `ext2fs_link` left them).
    fn render_dir(&self, ents: &[super::hugefiles::Dirent], dir_ino: u32, csum: &Csum) -> Vec<u8> {
        let bs = self.layout.block_size as usize;
        let mut buf = vec![0u8; bs];
        let filetype = self.layout.features.incompat.contains(Incompat::FILETYPE);
        let mut off = 0;
        for e in ents {
            let ft = if filetype { e.ft } else { 0 };
            let rl = dir::rec_len_to_disk(e.rec_len as usize, bs);
            dir::put_entry(&mut buf, off, e.ino, rl, &e.name, ft);
            off += e.rec_len as usize;
        }
        if csum.metadata {
            dir::put_tail(&mut buf, dir_ino, 0, csum);
        }
        buf
    }

    /// Write the whole filesystem (with -S, only its superblocks and
    /// descriptors).
    pub fn write(&self, dev: &dyn Device) -> Result<WriteStats, WriteError> {
        let l = self.layout;
        if super::journal_dev::is_journal_dev(l) {
            return super::journal_dev::write(self, dev);
        }
        if l.super_only {
            return self.write_super_only(dev);
        }
        let mut stats = self.write_head(dev)?;
        let body = self.write_body(dev)?;
        stats.add(&body);
        Ok(stats)
    }

    /// Steps 1 and 2 of [`Writer::write`]: the old superblock area wiped
    /// (durably when there was one) and the device tail zeroed. `mkfs -d`
    /// copies its tree between this and [`Writer::write_body`].
    pub fn write_head(&self, dev: &dyn Device) -> Result<WriteStats, WriteError> {
        let l = self.layout;
        let bs = u64::from(l.block_size);
        let mut out = Out::new(dev, l.block_size);

        // 1. Wipe the old superblock area (bytes 0..4096, as mke2fs's
        //    zap_sector does) so a half-written image is never mistaken for
        //    the old filesystem.
        out.zero(0, 4096)?;
        out.flush_pending()?;
        if out.stats.bytes_zeroed > 0 {
            // An old superblock was there: make its removal durable before
            // any new metadata, so that a crash never leaves the old
            // superblock in front of half-written new tables.
            dev.flush()?;
        }
        // 2. Zero the tail of the device (old MD RAID superblocks).
        let rsv = 65536 / bs;
        let mut start = l.blocks_count & !(rsv - 1);
        if start > rsv {
            start -= rsv;
        }
        if start > 0 {
            out.zero_blocks(start, l.blocks_count - start)?;
        }
        out.flush_pending()?;
        Ok(out.stats)
    }

    /// Steps 3 to 9 of [`Writer::write`]: everything after the head.
    pub fn write_body(&self, dev: &dyn Device) -> Result<WriteStats, WriteError> {
        let l = self.layout;
        let s = self.settings;
        let bs = u64::from(l.block_size);
        let csum = self.csum();
        let mut out = Out::new(dev, l.block_size);
        // 3. Inode tables.
        if !s.itable_zeroed {
            let isz = u64::from(l.inode_size);
            // (A flex group's tables are adjacent: zeroed as one range.)
            out.zero_runs(l.groups.iter().map(|gp| {
                let n = if s.lazy_itable_init {
                    (u64::from(l.inodes_per_group - gp.itable_unused) * isz).div_ceil(bs)
                } else {
                    u64::from(l.inode_blocks_per_group)
                };
                (gp.inode_table, n)
            }))?;
        }
        // 4. Special inodes (and huge files) into their groups' tables.
        let isz = u64::from(l.inode_size);
        // (sorted by number, so each group's inodes are consecutive; with
        // fewer than 11 inodes per group they span several groups)
        let specials = self.special_inodes(&csum);
        // mkfs -d: its inodes, consecutive from `first_ino` to `last`.
        let pop = l
            .populated
            .as_ref()
            .filter(|p| !p.table.is_empty())
            .map(|p| {
                let last = p.first_ino + (p.table.len() / usize::from(l.inode_size)) as u32 - 1;
                (p, last)
            });
        let mut groups: std::collections::BTreeSet<u32> =
            specials.iter().map(|(i, _)| l.inode_loc(*i).0).collect();
        if let Some((p, last)) = pop {
            groups.extend(l.inode_loc(p.first_ino).0..=l.inode_loc(last).0);
        }
        let ipg = l.inodes_per_group;
        let mut k = 0;
        for g in groups {
            let end = k + specials[k..]
                .iter()
                .take_while(|(i, _)| l.inode_loc(*i).0 == g)
                .count();
            // The populated inodes in this group: [a, b].
            let part = pop.and_then(|(p, last)| {
                let (a, b) = (p.first_ino.max(g * ipg + 1), last.min((g + 1) * ipg));
                (a <= b).then_some((p, a, b))
            });
            let last_slot = specials[k..end]
                .last()
                .map(|(i, _)| l.inode_loc(*i).1)
                .max(part.map(|(_, _, b)| l.inode_loc(b).1));
            let Some(last_slot) = last_slot else {
                continue;
            };
            let nblocks = (u64::from(last_slot + 1) * isz).div_ceil(bs);
            let mut table = vec![0u8; (nblocks * bs) as usize];
            let start = l.groups[g as usize].inode_table;
            // Whole blocks are written. mke2fs writes each inode through
            // its cache (read, change the slot, write back), so the slots
            // between them keep what the table held: zeros once step 3
            // zeroed it; with the tables taken as zero (discarded, or
            // assume_storage_prezeroed) whatever the device holds, which
            // is zero unless that promise was wrong.
            if s.itable_zeroed {
                dev.read_at(&mut table, start * bs)?;
            }
            for (ino, bytes) in &specials[k..end] {
                let off = (u64::from(l.inode_loc(*ino).1) * isz) as usize;
                table[off..off + bytes.len()].copy_from_slice(bytes);
            }
            if let Some((p, a, b)) = part {
                let off = (u64::from(l.inode_loc(a).1) * isz) as usize;
                let from = (u64::from(a - p.first_ino) * isz) as usize;
                let len = (u64::from(b - a + 1) * isz) as usize;
                table[off..off + len].copy_from_slice(&p.table[from..from + len]);
            }
            out.block(start, &table)?;
            k = end;
        }
        // 5. Directories.
        let root_blk = self.dir_block(
            &[
                (2, b".", dir::FT_DIR),
                (2, b"..", dir::FT_DIR),
                (11, b"lost+found", dir::FT_DIR),
            ],
            2,
            &csum,
        );
        if l.populated.is_none() {
            // (mkfs -d wrote the root's blocks with its entries.)
            out.block(l.root.runs[0].pblk, &root_blk)?;
        }
        if let Some(h) = &l.hugefiles {
            for d in &h.dirs {
                for (lb, ents) in d.blocks.iter().enumerate() {
                    if let Some(p) = d.map.pblk(lb as u32) {
                        out.block(p, &self.render_dir(ents, d.ino, &csum))?;
                    }
                }
                // A directory grown past the four extents of its inode.
                if let Some(leaf) = d.map.leaf {
                    out.block(leaf, &self.leaf_block(d.ino, &d.map, &csum))?;
                }
            }
        }
        let lpf0 = if self.inline_data() {
            // ext2fs_inline_data_convert_dir: '.', '..', then the empty
            // entry of the inline directory spanning the rest.
            self.dir_block(
                &[
                    (11, b".", dir::FT_DIR),
                    (2, b"..", dir::FT_DIR),
                    (0, b"", 0),
                ],
                11,
                &csum,
            )
        } else {
            self.dir_block(
                &[(11, b".", dir::FT_DIR), (2, b"..", dir::FT_DIR)],
                11,
                &csum,
            )
        };
        let lpf_empty = self.dir_block(&[], 11, &csum);
        for lb in 0..l.lost_found.blocks() as u32 {
            if let Some(p) = l.lost_found.pblk(lb) {
                out.block(p, if lb == 0 { &lpf0 } else { &lpf_empty })?;
            }
        }
        // 5b. The bad block inode's indirect blocks.
        if let Some(bb) = &l.bad_blocks {
            self.write_indirect(&mut out, &bb.map)?;
        }
        // 6. Resize inode: DIND and primary reserved GDT blocks.
        if let Some(dind) = l.resize_dind {
            let apb = bs / 4;
            let mut dbuf = vec![0u8; bs as usize];
            let backups = self.backup_group_list();
            let mut gbuf = vec![0u8; bs as usize];
            for k in 0..u64::from(l.reserved_gdt_blocks) {
                let pblk = l.sb_block() + 1 + u64::from(l.desc_blocks) + k;
                let slot = ((u64::from(l.desc_blocks) + k) % apb) as usize;
                dbuf[slot * 4..slot * 4 + 4].copy_from_slice(&(pblk as u32).to_le_bytes());
                gbuf.fill(0);
                for (n, g) in backups.iter().enumerate() {
                    if n as u64 >= apb {
                        break;
                    }
                    let b = pblk + u64::from(*g) * u64::from(l.blocks_per_group);
                    gbuf[n * 4..n * 4 + 4].copy_from_slice(&(b as u32).to_le_bytes());
                }
                out.block(pblk, &gbuf)?;
            }
            out.block(dind, &dbuf)?;
        }
        // 7. Journal: leaf or indirect blocks, superblock, and zeroing
        //    unless lazy.
        if let Some(j) = &l.journal {
            self.write_indirect(&mut out, j)?;
            if let Some(leaf) = j.leaf {
                out.block(leaf, &self.leaf_block(inode::JOURNAL_INO, j, &csum))?;
            }
            let mut jbuf = vec![0u8; bs as usize];
            let mut jsb = JournalSuperblock::new(l.block_size, l.journal_blocks, s.uuid);
            jsb.s_num_fc_blks.set(l.journal_fc_blocks);
            jbuf[..1024].copy_from_slice(jsb.as_bytes());
            if let Some(first) = j.pblk(0) {
                out.block(first, &jbuf)?;
            }
            if !s.lazy_journal_init {
                // (Its extents are at most 128 MiB: adjacent ones are
                // asked and zeroed as one range.)
                out.zero_runs(j.runs.iter().map(|r| {
                    let skip = u64::from(r.lblk == 0);
                    (r.pblk + skip, u64::from(r.len) - skip)
                }))?;
            }
        }
        // 8. Orphan file blocks.
        if let Some((ino, fm)) = &l.orphan {
            self.write_indirect(&mut out, fm)?;
            let mut obuf = vec![0u8; bs as usize];
            for lb in 0..fm.blocks() as u32 {
                if let Some(p) = fm.pblk(lb) {
                    orphan::init_block(&mut obuf, *ino, 0, p, &csum);
                    out.block(p, &obuf)?;
                }
            }
        }
        // 8a. Huge files: their extent blocks, their data zeroed.
        if let Some(h) = &l.hugefiles {
            for f in &h.files {
                for (p, node) in &f.nodes {
                    let mut buf = node.clone();
                    if csum.metadata {
                        extent::set_block_checksum(&mut buf, f.ino, 0, &csum);
                    }
                    out.block(*p, &buf)?;
                }
                if h.zero {
                    for r in &f.data {
                        out.zero_blocks(r.pblk, u64::from(r.len))?;
                    }
                }
            }
        }
        // 8b. The MMP block: zeroed, then the MMP structure.
        if let Some(b) = l.mmp_block {
            let interval = super::mmp::effective_interval(s.mmp_update_interval)
                .unwrap_or(s.mmp_update_interval);
            let seed = csum.metadata.then_some(csum.seed);
            let buf = super::mmp::mmp_block(bs as usize, interval, &s.mmp_host, seed);
            out.block(b, &buf)?;
        }
        // 8b. Quota files.
        for q in &l.quota {
            let mut qbuf = vec![0u8; bs as usize];
            for (lb, chunk) in q.data.chunks(bs as usize).enumerate() {
                if let Some(p) = q.map.pblk(lb as u32) {
                    qbuf.fill(0);
                    qbuf[..chunk.len()].copy_from_slice(chunk);
                    out.block(p, &qbuf)?;
                }
            }
        }
        // 9. Bitmaps, and the descriptors with their checksums.
        let gdt = self.bitmaps_and_descs(&mut out, &csum, true)?;
        self.supers_and_descs(dev, &mut out, &gdt)?;
        Ok(out.stats)
    }

    /// `mke2fs -S`: what it writes over an existing filesystem. The old
    /// superblock sectors (bytes 1024..4096, zap_sector(2, 6); not the
    /// boot sectors), then the superblock backups, the descriptor blocks
    /// (whose bitmap checksums stay 0: the bitmaps are not written) and
    /// the primary superblock. Inode tables, bitmaps, directories, the
    /// journal and the reserved GDT blocks are not touched.
    fn write_super_only(&self, dev: &dyn Device) -> Result<WriteStats, WriteError> {
        let l = self.layout;
        let csum = self.csum();
        let mut out = Out::new(dev, l.block_size);
        out.zero(1024, 3072)?;
        out.flush_pending()?;
        if out.stats.bytes_zeroed > 0 {
            dev.flush()?;
        }
        let gdt = self.bitmaps_and_descs(&mut out, &csum, false)?;
        self.supers_and_descs(dev, &mut out, &gdt)?;
        Ok(out.stats)
    }

    /// Steps 10 and 11: the superblock backups and descriptor blocks,
    /// flush, the primary superblock, flush.
    fn supers_and_descs(
        &self,
        dev: &dyn Device,
        out: &mut Out<'_>,
        gdt: &[u8],
    ) -> Result<(), WriteError> {
        let l = self.layout;
        let bs = u64::from(l.block_size);
        // 10. Backup superblocks and the descriptor blocks, where
        //     ext2fs_flush puts them (classic tables after each superblock
        //     copy; with meta_bg one block in the first, second and last
        //     group of each meta group).
        let sb = self.superblock();
        let old_n = (l.old_desc_written() * bs) as usize;
        let dpb = l.desc_per_block();
        for g in 0..l.group_count {
            let m = l.group_meta(g);
            if g > 0
                && let Some(first) = m.super_blk
            {
                let mut b = sb.clone();
                b.s_block_group_nr.set(g.min(65535) as u16);
                b.s_state.set(b.s_state.get() & !superblock::STATE_VALID);
                if l.features.ro_compat.contains(RoCompat::METADATA_CSUM) {
                    b.update_checksum();
                }
                // mke2fs writes just the 1024-byte superblock at the group
                // start. Where the descriptors follow in the next block
                // and the rest of this one is known zero, the whole block
                // goes out (the same bytes): one write with the
                // descriptors instead of two (over NBD, a request each).
                let sbb = b.as_bytes();
                let next =
                    (m.old_desc == Some(first + 1) && old_n > 0) || m.new_desc == Some(first + 1);
                let rest = bs.saturating_sub(sbb.len() as u64);
                if next && rest > 0 && out.known_zero(first * bs + sbb.len() as u64, rest)? {
                    let mut blk = vec![0u8; bs as usize];
                    blk[..sbb.len()].copy_from_slice(sbb);
                    out.write(first * bs, &blk)?;
                } else {
                    out.write(first * bs, sbb)?;
                }
            }
            if let Some(od) = m.old_desc
                && old_n > 0
            {
                out.block(od, &gdt[..old_n])?;
            }
            if let Some(nd) = m.new_desc {
                let k = (g / dpb) as usize * bs as usize;
                out.block(nd, &gdt[k..k + bs as usize])?;
            }
        }
        out.flush_pending()?;
        dev.flush()?;
        // 11. Primary superblock last.
        out.write(superblock::SUPERBLOCK_OFFSET, sb.as_bytes())?;
        out.flush_pending()?;
        dev.flush()?;
        Ok(())
    }

    /// Write the initialized bitmaps; return the descriptor table bytes.
    /// Indirect blocks of a block-mapped file.
    fn write_indirect(&self, out: &mut Out<'_>, fm: &FileMap) -> Result<(), WriteError> {
        let Some(bm) = &fm.blockmap else {
            return Ok(());
        };
        let mut buf = vec![0u8; self.layout.block_size as usize];
        for (blk, ptrs) in &bm.indirect {
            buf.fill(0);
            for (k, p) in ptrs.iter().enumerate() {
                buf[k * 4..k * 4 + 4].copy_from_slice(&p.to_le_bytes());
            }
            out.block(*blk, &buf)?;
        }
        Ok(())
    }

    /// With `write_bitmaps` false (-S) nothing is written and the bitmap
    /// checksums stay 0.
    fn bitmaps_and_descs(
        &self,
        out: &mut Out<'_>,
        csum: &Csum,
        write_bitmaps: bool,
    ) -> Result<Vec<u8>, WriteError> {
        let l = self.layout;
        let bs = l.block_size as usize;
        let has_csum = l.features.has_group_csum();
        let dsz = if l.desc_size == 0 {
            32
        } else {
            usize::from(l.desc_size)
        };
        let bb_bytes = (l.clusters_per_group() / 8) as usize;
        let bits = l.cluster_bits;
        let ib_bytes = (l.inodes_per_group as usize).div_ceil(8);
        let mut gdt = vec![0u8; l.desc_blocks as usize * bs];
        let mut bbuf = vec![0u8; bs];
        let mut ibuf = vec![0u8; bs];
        let used_inodes: u32 = l.last_used_ino();
        for (g, gp) in l.groups.iter().enumerate() {
            let g32 = g as u32;
            let mut d = GroupDesc::default();
            d.set_block_bitmap(gp.block_bitmap);
            d.set_inode_bitmap(gp.inode_bitmap);
            d.set_inode_table(gp.inode_table);
            d.set_free_blocks(gp.free_blocks);
            d.set_free_inodes(gp.free_inodes);
            d.set_used_dirs(gp.used_dirs);
            d.set_flags(gp.flags);
            d.set_itable_unused(gp.itable_unused);
            if write_bitmaps && !(has_csum && gp.flags & BG_BLOCK_UNINIT != 0) {
                bbuf.fill(0xFF);
                bbuf[..bb_bytes].fill(0);
                let first = l.group_first_block(g32);
                let gend = first + u64::from(l.blocks_per_group);
                for (s, e) in l.used.ranges_in(first, gend.min(l.blocks_count)) {
                    // A cluster bitmap with bigalloc (used ranges are whole
                    // clusters by then).
                    let from = ((s - first) >> bits) as usize;
                    let to = ((e - first).div_ceil(1 << bits)) as usize;
                    set_bits(&mut bbuf, from, to);
                }
                if g32 + 1 == l.group_count {
                    let nbits = (((l.blocks_count - l.first_data_block)
                        % u64::from(l.blocks_per_group))
                        >> bits) as usize;
                    if nbits != 0 {
                        set_bits(&mut bbuf, nbits, bs * 8);
                    }
                }
                if csum.metadata {
                    d.set_block_bitmap_csum(csum.bitmap(&bbuf[..bb_bytes]));
                }
                out.block(gp.block_bitmap, &bbuf)?;
            }
            if write_bitmaps && !(has_csum && gp.flags & BG_INODE_UNINIT != 0) {
                ibuf.fill(0xFF);
                ibuf[..ib_bytes].fill(0);
                // Inodes 1..=used_inodes are in use, wherever inode_loc
                // puts them.
                let first_ino = g32 * l.inodes_per_group + 1;
                for ino in first_ino..=used_inodes.min(first_ino + l.inodes_per_group - 1) {
                    let (ig, slot) = l.inode_loc(ino);
                    debug_assert_eq!(ig, g32);
                    ibuf[slot as usize / 8] |= 1 << (slot % 8);
                }
                if csum.metadata {
                    d.set_inode_bitmap_csum(csum.bitmap(&ibuf[..ib_bytes]));
                }
                out.block(gp.inode_bitmap, &ibuf)?;
            }
            // Descriptors larger than 64 bytes (-E desc_size=) are zero
            // past the fields, and their checksum covers those zeros.
            let slot = &mut gdt[g * dsz..(g + 1) * dsz];
            let n = dsz.min(64);
            slot[..n].copy_from_slice(&d.as_bytes()[..n]);
            let c = csum.group_desc(g32, slot);
            d.bg_checksum.set(c);
            if l.super_only {
                // mke2fs -S zeroes itable_unused (so that e2fsck looks at
                // every inode) after the checksums were computed, and
                // leaves them as they were.
                d.set_itable_unused(0);
            }
            slot[..n].copy_from_slice(&d.as_bytes()[..n]);
        }
        Ok(gdt)
    }
}

/// Set bits `[from, to)` of a little-endian bitmap, whole bytes at once.
fn set_bits(buf: &mut [u8], from: usize, to: usize) {
    let mut b = from;
    while b < to && !b.is_multiple_of(8) {
        buf[b / 8] |= 1 << (b % 8);
        b += 1;
    }
    let full_end = to - to % 8;
    if b < full_end {
        buf[b / 8..full_end / 8].fill(0xFF);
        b = full_end;
    }
    while b < to {
        buf[b / 8] |= 1 << (b % 8);
        b += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;
    use std::sync::Mutex;

    /// Records the known-zero questions and zeroouts asked of it.
    struct Asked {
        inner: MemDevice,
        log: Mutex<Vec<(&'static str, u64, u64)>>,
    }

    impl Device for Asked {
        ext4kit_device::forward_device!(inner; known_zero_ranges, zeroout);
        fn known_zero_ranges(&self, o: u64, l: u64) -> ext4kit_device::Result<Vec<(u64, u64)>> {
            self.log.lock().unwrap().push(("known", o, l));
            self.inner.known_zero_ranges(o, l)
        }
        fn zeroout(&self, o: u64, l: u64) -> ext4kit_device::Result<()> {
            self.log.lock().unwrap().push(("zeroout", o, l));
            self.inner.zeroout(o, l)
        }
    }

    /// Counts write calls; `zeros` false: nothing shorter than a block
    /// is known zero (only the backup superblock's question is: the rest
    /// of mkfs asks about whole blocks).
    struct Counted {
        inner: MemDevice,
        zeros: bool,
        writes: Mutex<u64>,
    }

    impl Device for Counted {
        ext4kit_device::forward_device!(inner; is_known_zero, write_at);
        fn is_known_zero(&self, o: u64, l: u64) -> ext4kit_device::Result<bool> {
            if self.zeros || l.is_multiple_of(4096) {
                self.inner.is_known_zero(o, l)
            } else {
                Ok(false)
            }
        }
        fn write_at(&self, b: &[u8], o: u64) -> ext4kit_device::Result<()> {
            *self.writes.lock().unwrap() += 1;
            self.inner.write_at(b, o)
        }
    }

    #[test]
    fn backup_superblocks_join_their_descriptors_byte_identical() {
        let mut img = crate::testing::MemImage::new(256 << 20, 4096, 16384);
        // 8 groups: backups in groups 1, 3, 5 and 7.
        img.blocks_per_group = Some(8192);
        img.extended = vec!["hash_seed=6f1e5d4c-3b2a-4918-8776-655443322110".into()];
        let run = |zeros| {
            let dev = Counted {
                inner: MemDevice::new(256 << 20),
                zeros,
                writes: Mutex::new(0),
            };
            img.make_on(&dev).unwrap();
            let n = *dev.writes.lock().unwrap();
            (dev.inner.to_bytes(), n)
        };
        let (known, n_known) = run(true);
        let (blind, n_blind) = run(false);
        assert!(known == blind, "the same bytes either way");
        // Four backups, each one write fewer.
        assert_eq!(n_known + 4, n_blind);
    }

    #[test]
    fn adjacent_runs_are_zeroed_as_one_range() {
        let dev = Asked {
            inner: MemDevice::new(1 << 20),
            log: Mutex::new(Vec::new()),
        };
        dev.inner.write_at(&[0xAA; 4096 * 8], 0).unwrap();
        let mut out = Out::new(&dev, 4096);
        // Runs 0..2, 2..5 and 5..6 adjacent; 8..9 apart; an empty one.
        out.zero_runs([(0, 2), (2, 3), (5, 1), (8, 1), (9, 0)])
            .unwrap();
        let log = dev.log.lock().unwrap().clone();
        let known: Vec<_> = log.iter().filter(|e| e.0 == "known").collect();
        assert_eq!(
            known,
            [&("known", 0, 6 * 4096), &("known", 8 * 4096, 4096)],
            "{log:?}"
        );
        let mut b = vec![0u8; 4096 * 10];
        dev.inner.read_at(&mut b, 0).unwrap();
        assert!(b[..6 * 4096].iter().all(|&x| x == 0));
        assert!(b[6 * 4096..8 * 4096].iter().all(|&x| x == 0xAA));
        assert_eq!(
            out.stats.bytes_zeroed + out.stats.bytes_already_zero,
            7 * 4096
        );
    }
}
