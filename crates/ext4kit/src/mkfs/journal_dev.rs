//! External journals, as mke2fs 1.47.0 makes and uses them.
//!
//! * `-O journal_dev` makes a journal device: `ext2fs_initialize` stops
//!   after the superblock basics (no groups, no inodes), mke2fs's
//!   `create_journal_dev` zeroes every block (unless `lazy_journal_init`)
//!   and writes the jbd2 superblock at the block after the ext2 superblock
//!   (`s_nr_users` 0, `s_first` after it), and the close writes the ext2
//!   superblock only. `plan` gives the [`Layout`] (0 groups), [`write`]
//!   the bytes, [`kbytes_written`] the `s_kbytes_written` mke2fs leaves.
//! * `-J device=` formats a filesystem that uses one: the caller reads the
//!   device with [`inspect`] (mke2fs's `ext2fs_open(JOURNAL_DEV_OK)` and the
//!   checks of `ext2fs_add_journal_device`) before anything is written,
//!   the filesystem gets `s_journal_uuid`/`s_journal_dev` and no journal
//!   inode, and [`add_user`] then records the filesystem's UUID in the
//!   journal's user list (and, as mke2fs's close of the journal device
//!   does, bumps its `s_kbytes_written`).

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::features::{Incompat, RoCompat};
use ext4kit_format::jbd2::{
    JBD2_MAGIC, JBD2_MIN_JOURNAL_BLOCKS, JBD2_SUPERBLOCK_V2, JournalSuperblock,
};
use ext4kit_format::superblock::{self, Superblock};
use zerocopy::IntoBytes;

use super::blockset::BlockSet;
use super::geometry::{FileMap, FsParams, GeometryError, Layout};
use super::writer::{Out, WriteError, WriteStats, Writer};

/// `JBD2_USERS_MAX`: the user list of a journal superblock holds 48 UUIDs.
pub const USERS_MAX: u32 = 48;

/// `ext2fs_journal_sb_start`: the block of a journal device's jbd2
/// superblock (right after the ext2 superblock).
pub fn jsb_block(block_size: u32) -> u64 {
    if block_size == 1024 { 2 } else { 1 }
}

/// The journal device a filesystem is formatted to use (`-J device=`), as
/// the caller read it with [`inspect`] before resolving the options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalJournal {
    /// The device (after `UUID=`/`LABEL=` resolution), for messages.
    pub path: String,
    /// Its block size (mke2fs takes it when `-b` does not give one).
    pub block_size: u32,
    /// The jbd2 superblock's UUID: the filesystem's `s_journal_uuid`.
    pub uuid: [u8; 16],
    /// The device number (`st_rdev`): the filesystem's `s_journal_dev`.
    pub rdev: u32,
}

/// A journal device as read from disk.
#[derive(Clone)]
pub struct JournalDevice {
    pub sb: Superblock,
    pub jsb: JournalSuperblock,
    pub block_size: u32,
}

impl std::fmt::Debug for JournalDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalDevice")
            .field("block_size", &self.block_size)
            .field("blocks", &self.sb.blocks_count())
            .field("uuid", &self.jsb.s_uuid)
            .field("nr_users", &self.jsb.s_nr_users.get())
            .finish()
    }
}

impl JournalDevice {
    /// What the filesystem records about it.
    pub fn external(&self, path: &str, rdev: u32) -> ExternalJournal {
        ExternalJournal {
            path: path.to_string(),
            block_size: self.block_size,
            uuid: self.jsb.s_uuid,
            rdev,
        }
    }
    /// Is `uuid` in the user list already?
    pub fn has_user(&self, uuid: &[u8; 16]) -> bool {
        let n = self.jsb.s_nr_users.get().min(USERS_MAX) as usize;
        self.jsb.s_users[..n * 16]
            .chunks(16)
            .any(|u| u == uuid.as_slice())
    }
}

/// A journal device that cannot be used; the message names the device and
/// says what is wrong with it, with libext2fs's words where mke2fs fails.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalDevError {
    #[error("journal device {path}: {why}")]
    Invalid { path: String, why: String },
    #[error(transparent)]
    Device(#[from] DeviceError),
}

fn invalid<T>(path: &str, why: impl Into<String>) -> Result<T, JournalDevError> {
    Err(JournalDevError::Invalid {
        path: path.to_string(),
        why: why.into(),
    })
}

/// Read and check the journal device `dev` (named `path`) as mke2fs does
/// before it adds it to a filesystem: the ext2 superblock as
/// `ext2fs_open(EXT2_FLAG_JOURNAL_DEV_OK)` checks it (magic, checksum,
/// revision, geometry), the journal_dev feature (a filesystem is not a
/// journal device: mke2fs then fails with "Journal superblock not found"),
/// and the jbd2 superblock as `ext2fs_add_journal_device` checks it (magic
/// and v2, block size, at most 48 users). Nothing is written.
pub fn inspect(dev: &dyn Device, path: &str) -> Result<JournalDevice, JournalDevError> {
    if dev.size() < 2048 {
        return invalid(path, "too small to hold a superblock");
    }
    let mut buf = vec![0u8; superblock::SUPERBLOCK_SIZE];
    dev.read_at(&mut buf, superblock::SUPERBLOCK_OFFSET)?;
    let Some(sb) = Superblock::parse(&buf) else {
        return invalid(path, "short superblock");
    };
    if sb.s_magic.get() != superblock::EXT4_MAGIC {
        return invalid(path, "Bad magic number in super-block");
    }
    let ro = RoCompat(sb.s_feature_ro_compat.get());
    if ro.contains(RoCompat::METADATA_CSUM) {
        if sb.s_checksum_type != 1 {
            return invalid(path, "Unknown checksum algorithm");
        }
        if !sb.checksum_ok() {
            return invalid(path, "Superblock checksum does not match superblock");
        }
    }
    if sb.s_rev_level.get() > 1 {
        return invalid(path, "Filesystem revision too high");
    }
    let Some(bs) = sb.block_size().filter(|_| {
        sb.s_log_cluster_size.get() == sb.s_log_block_size.get()
            && sb.s_blocks_per_group.get() == sb.s_clusters_per_group.get()
    }) else {
        return invalid(path, "The ext2 superblock is corrupt");
    };
    let isz = if sb.s_rev_level.get() == 0 {
        128
    } else {
        u32::from(sb.s_inode_size.get())
    };
    if isz < 128 || isz > bs || !isz.is_power_of_two() {
        return invalid(path, "The ext2 superblock is corrupt");
    }
    if !Incompat(sb.s_feature_incompat.get()).contains(Incompat::JOURNAL_DEV) {
        return invalid(
            path,
            "not an external journal device (no journal_dev feature; Journal superblock not found)",
        );
    }
    let jblk = jsb_block(bs);
    if dev.size() < (jblk + 1) * u64::from(bs) {
        return invalid(path, "Journal superblock not found");
    }
    let mut jbuf = vec![0u8; 1024];
    dev.read_at(&mut jbuf, jblk * u64::from(bs))?;
    let Some(jsb) = JournalSuperblock::parse(&jbuf) else {
        return invalid(path, "Journal superblock not found");
    };
    if jsb.h_magic.get() != JBD2_MAGIC || jsb.h_blocktype.get() != JBD2_SUPERBLOCK_V2 {
        return invalid(path, "Journal superblock not found");
    }
    if jsb.s_blocksize.get() != bs {
        return invalid(
            path,
            format!(
                "Filesystem has unexpected block size (the journal superblock says {}, the device {bs})",
                jsb.s_blocksize.get()
            ),
        );
    }
    if jsb.s_nr_users.get() > USERS_MAX {
        return invalid(
            path,
            format!(
                "The journal superblock is corrupt ({} users, at most {USERS_MAX})",
                jsb.s_nr_users.get()
            ),
        );
    }
    Ok(JournalDevice {
        sb,
        jsb,
        block_size: bs,
    })
}

/// `ext2fs_add_journal_device`'s write, then what mke2fs's close of the
/// journal device writes: `fs_uuid` joins the user list unless it is there
/// already (the 1024-byte jbd2 superblock is rewritten either way); when
/// the device's superblock counts kilobytes written (mke2fs made it with
/// one of the features that turn the counter on), `ext2fs_close2` adds the
/// 1 KiB just written and the superblock block (1 KiB blocks only), stamps
/// `s_wtime` with `now` and rewrites it. `jd` is the device as [`inspect`]
/// read it. A journal superblock with checksums (which mke2fs leaves
/// stale) gets its checksum recomputed.
pub fn add_user(
    dev: &dyn Device,
    jd: &JournalDevice,
    fs_uuid: [u8; 16],
    now: u32,
) -> Result<(), JournalDevError> {
    let bs = jd.block_size;
    let mut jsb = jd.jsb.clone();
    if !jd.has_user(&fs_uuid) {
        let n = jsb.s_nr_users.get().min(USERS_MAX - 1) as usize;
        jsb.s_users[n * 16..n * 16 + 16].copy_from_slice(&fs_uuid);
        jsb.s_nr_users.set(n as u32 + 1);
    }
    use ext4kit_format::jbd2::{JBD2_FEATURE_INCOMPAT_CSUM_V2, JBD2_FEATURE_INCOMPAT_CSUM_V3};
    if jsb.s_feature_incompat.get()
        & (JBD2_FEATURE_INCOMPAT_CSUM_V2 | JBD2_FEATURE_INCOMPAT_CSUM_V3)
        != 0
    {
        let c = ext4kit_format::checksum::jbd2::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
    }
    dev.write_at(jsb.as_bytes(), jsb_block(bs) * u64::from(bs))?;
    dev.flush()?;
    let kb = jd.sb.s_kbytes_written.get();
    if kb != 0 {
        let mut sb = jd.sb.clone();
        sb.s_kbytes_written.set(kb + 1 + u64::from(1 / (bs / 1024)));
        sb.s_wtime.set(now);
        sb.s_block_group_nr.set(0);
        if RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM) {
            sb.update_checksum();
        }
        dev.write_at(sb.as_bytes(), superblock::SUPERBLOCK_OFFSET)?;
        dev.flush()?;
    }
    Ok(())
}

/// The layout of a journal device (`-O journal_dev`): what
/// `ext2fs_initialize` leaves when it returns early for one. No groups, no
/// inodes, no free counts; the whole device is the journal.
pub(super) fn plan(p: &FsParams) -> Result<Layout, GeometryError> {
    let bs = p.block_size;
    if p.blocks_count < u64::from(JBD2_MIN_JOURNAL_BLOCKS) {
        return Err(GeometryError::TooSmall(format!(
            "Journal must be at least {JBD2_MIN_JOURNAL_BLOCKS} blocks ({} blocks for the journal device)",
            p.blocks_count
        )));
    }
    if p.blocks_count > u64::from(u32::MAX) {
        return Err(GeometryError::Invalid(format!(
            "a journal device holds at most {} blocks (the jbd2 superblock's length is 32 bits), not {}",
            u32::MAX,
            p.blocks_count
        )));
    }
    if p.super_only {
        return Err(GeometryError::Invalid(
            "-S with -O journal_dev: mke2fs 1.47.0 would zero the whole journal device".into(),
        ));
    }
    let bpg = if p.blocks_per_group != 0 {
        p.blocks_per_group
    } else {
        bs.saturating_mul(8)
    }
    .min(65528);
    Ok(Layout {
        block_size: bs,
        blocks_count: p.blocks_count,
        r_blocks_count: p.r_blocks_count,
        first_data_block: u64::from(bs == 1024),
        blocks_per_group: bpg,
        group_count: 0,
        inodes_per_group: 0,
        inodes_count: 0,
        inode_size: p.inode_size,
        inode_blocks_per_group: 0,
        desc_size: 0,
        desc_blocks: 0,
        reserved_gdt_blocks: 0,
        first_meta_bg: 0,
        log_groups_per_flex: p.log_groups_per_flex,
        features: p.features,
        groups: Vec::new(),
        used: BlockSet::new(),
        free_blocks: 0,
        free_inodes: 0,
        overhead: 0,
        root: FileMap::default(),
        lost_found: FileMap::default(),
        resize_dind: None,
        journal: None,
        journal_blocks: p.blocks_count as u32,
        journal_fc_blocks: 0,
        backup_bgs: p.backup_bgs,
        mmp_block: None,
        super_only: false,
        orphan: None,
        first_ino: 11,
        cluster_bits: 0,
        quota: Vec::new(),
        hugefiles: None,
        bad_blocks: None,
        populated: None,
    })
}

/// Is this layout a journal device?
pub fn is_journal_dev(l: &Layout) -> bool {
    l.features.incompat.contains(Incompat::JOURNAL_DEV)
}

/// `s_kbytes_written` of a new journal device: mke2fs starts the counter
/// at 1 when one of the features that turn it on is left (only
/// metadata_csum survives `-O journal_dev`'s feature mask), and its close
/// adds the bytes its I/O channel wrote directly by then: the 3 KiB of
/// `zap_sector(2, 6)` (the zeroing is a zero-out, the jbd2 superblock is
/// still in the write-back cache), plus the superblock block with 1 KiB
/// blocks.
pub fn kbytes_written(l: &Layout) -> u64 {
    let f = &l.features;
    let counted = f.incompat.contains(Incompat::FLEX_BG)
        || f.ro_compat.contains(RoCompat::HUGE_FILE)
        || f.ro_compat.contains(RoCompat::GDT_CSUM)
        || f.ro_compat.contains(RoCompat::DIR_NLINK)
        || f.ro_compat.contains(RoCompat::METADATA_CSUM)
        || f.ro_compat.contains(RoCompat::EXTRA_ISIZE);
    if !counted {
        return 0;
    }
    1 + 3 + u64::from(1 / (l.block_size / 1024))
}

/// Write a journal device: the old superblock sectors (bytes 1024..4096,
/// mke2fs's `zap_sector(2, 6)`), every block zeroed unless
/// `lazy_journal_init` (only where the device does not prove zeros), the
/// jbd2 superblock at the block after the ext2 superblock, flush, the ext2
/// superblock, flush.
pub(super) fn write(w: &Writer<'_>, dev: &dyn Device) -> Result<WriteStats, WriteError> {
    let l = w.layout;
    let s = w.settings;
    let bs = u64::from(l.block_size);
    let mut out = Out::new(dev, l.block_size);
    out.zero(1024, 3072)?;
    out.flush_pending()?;
    if out.stats.bytes_zeroed > 0 {
        dev.flush()?;
    }
    if !s.lazy_journal_init {
        out.zero_blocks(0, l.blocks_count)?;
    }
    let mut jsb = JournalSuperblock::new(l.block_size, l.blocks_count as u32, s.uuid);
    jsb.s_nr_users.set(0);
    jsb.s_first.set(jsb_block(l.block_size) as u32 + 1);
    let mut jbuf = vec![0u8; bs as usize];
    jbuf[..1024].copy_from_slice(jsb.as_bytes());
    out.block(l.first_data_block + 1, &jbuf)?;
    out.flush_pending()?;
    dev.flush()?;
    let sb = w.superblock();
    out.write(superblock::SUPERBLOCK_OFFSET, sb.as_bytes())?;
    out.flush_pending()?;
    dev.flush()?;
    Ok(out.stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;

    fn jdev(bs: u32, users: u32) -> MemDevice {
        let mem = MemDevice::new(8 << 20);
        let mut sb = Superblock::zeroed();
        sb.s_magic.set(superblock::EXT4_MAGIC);
        sb.s_log_block_size.set((bs / 1024).trailing_zeros());
        sb.s_log_cluster_size.set((bs / 1024).trailing_zeros());
        sb.s_blocks_per_group.set(bs * 8);
        sb.s_clusters_per_group.set(bs * 8);
        sb.s_rev_level.set(1);
        sb.s_inode_size.set(256);
        sb.s_feature_incompat.set(Incompat::JOURNAL_DEV.bits());
        sb.s_feature_ro_compat.set(RoCompat::METADATA_CSUM.bits());
        sb.s_checksum_type = 1;
        sb.s_kbytes_written.set(5);
        sb.s_uuid = [7; 16];
        sb.update_checksum();
        mem.write_at(sb.as_bytes(), 1024).unwrap();
        let mut jsb = JournalSuperblock::new(bs, (8 << 20) / bs, [7; 16]);
        jsb.s_nr_users.set(users);
        mem.write_at(jsb.as_bytes(), jsb_block(bs) * u64::from(bs))
            .unwrap();
        mem
    }

    #[test]
    fn inspect_and_add_user() {
        for bs in [1024, 4096] {
            let mem = jdev(bs, 0);
            let jd = inspect(&mem, "j").unwrap();
            assert_eq!(jd.block_size, bs);
            assert_eq!(jd.external("j", 0x707).uuid, [7; 16]);
            add_user(&mem, &jd, [9; 16], 42).unwrap();
            let jd2 = inspect(&mem, "j").unwrap();
            assert_eq!(jd2.jsb.s_nr_users.get(), 1);
            assert!(jd2.has_user(&[9; 16]));
            assert_eq!(
                jd2.sb.s_kbytes_written.get(),
                5 + 1 + u64::from(bs == 1024),
                "{bs}"
            );
            assert_eq!(jd2.sb.s_wtime.get(), 42);
            // Adding the same filesystem again does not add a user.
            add_user(&mem, &jd2, [9; 16], 43).unwrap();
            assert_eq!(inspect(&mem, "j").unwrap().jsb.s_nr_users.get(), 1);
        }
    }

    #[test]
    fn inspect_refuses_like_mke2fs() {
        let msg = |mem: &MemDevice| inspect(mem, "j").unwrap_err().to_string();
        let mem = jdev(4096, 49);
        assert!(
            msg(&mem).contains("journal superblock is corrupt"),
            "{}",
            msg(&mem)
        );
        let mem = jdev(4096, 0);
        mem.write_at(&[0; 4], 4096).unwrap();
        assert!(msg(&mem).contains("Journal superblock not found"));
        let mem = jdev(4096, 0);
        mem.write_at(&[0; 2], 1024 + 0x38).unwrap();
        assert!(msg(&mem).contains("Bad magic"));
        let mem = jdev(4096, 0);
        mem.write_at(&[1], 1024 + 0x10).unwrap();
        assert!(
            msg(&mem).contains("checksum does not match"),
            "{}",
            msg(&mem)
        );
        let mem = MemDevice::new(1024);
        assert!(msg(&mem).starts_with("journal device j: "));
    }
}
