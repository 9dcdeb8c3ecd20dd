//! Offline jbd2 recovery: the kernel's `jbd2_journal_recover` (the same
//! `recovery.c` e2fsck uses), as a pure function from the device's bytes to
//! a list of home writes.
//!
//! [`Journal::open`] reads the ext4 superblock and the journal inode, maps
//! the inode's blocks (extents or ext2/3 block maps, every block checked
//! against the filesystem's bounds) and validates the journal superblock.
//! [`recover`] runs the three passes (SCAN finds the end of the log with the
//! checksum rules, REVOKE builds the block -> highest-tid table, REPLAY
//! collects every unrevoked tagged block with the escape undone) without
//! writing anything. [`apply`] writes the result home, flushes, then resets
//! the journal and clears `needs_recovery` as `e2fsck -E journal_only` does.
//!
//! Where the kernel's code has a quirk that decides which blocks are
//! replayed (a `break` that only leaves the `switch`, tid 0 meaning "not
//! set", a single subtraction in `wrap`), it is kept on purpose: the goal is
//! the same home bytes as the kernel and e2fsck, not a cleaner reading.

use std::collections::{BTreeMap, HashMap};

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::Csum;
use ext4kit_format::checksum::{self, jbd2 as jcsum};
use ext4kit_format::extent::{EXTENT_MAGIC, Extent, ExtentHeader, ExtentIndex};
use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::inode::{self, EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};
use ext4kit_format::jbd2::*;
use ext4kit_format::superblock::{
    EXT4_MAGIC, STATE_ERROR, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use zerocopy::{FromBytes, IntoBytes};

use super::fast_commit::{self, FcLog};

/// Why a journal could not be read or replayed. Each message is one line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoverError {
    /// Not an ext4 filesystem at all.
    #[error("not an ext2/3/4 filesystem (superblock magic is {0:#06x}, expected 0xef53)")]
    NotExt4(u16),
    /// The filesystem has no journal.
    #[error("the filesystem has no journal")]
    NoJournal,
    /// The journal is on another device: not given, or not the right
    /// one (the message says which and how to name it).
    #[error("{0}")]
    ExternalJournal(String),
    /// A valid setup this code does not handle (fast
    /// commits, an unknown journal feature...).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The ext4 superblock, descriptor or journal inode is damaged.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// The journal superblock is damaged.
    #[error("corrupt journal superblock: {0}")]
    BadJournalSuperblock(String),
    /// The log cannot be replayed (the kernel's -EFSBADCRC/-EIO/-EINVAL
    /// cases, or a tag that points outside the filesystem).
    #[error("journal block {block}: {detail}")]
    Log { block: u64, detail: String },
    /// A read, write or flush failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

fn corrupt(what: &'static str, detail: impl Into<String>) -> RecoverError {
    RecoverError::Corrupt {
        what,
        detail: detail.into(),
    }
}

fn bad_jsb(detail: impl Into<String>) -> RecoverError {
    RecoverError::BadJournalSuperblock(detail.into())
}

fn log_err(block: u64, detail: impl Into<String>) -> RecoverError {
    RecoverError::Log {
        block,
        detail: detail.into(),
    }
}

/// Largest journal accepted, in blocks (mke2fs' limit for `-J size=`).
pub const MAX_JOURNAL_BLOCKS: u32 = JBD2_MIN_JOURNAL_BLOCKS * 10000;

/// A contiguous run of the journal inode: logical `lblk..lblk+len` at
/// physical `pblk..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub lblk: u32,
    pub pblk: u64,
    pub len: u32,
}

/// An opened internal journal: where its blocks are and what its
/// superblock says.
#[derive(Clone)]
pub struct Journal {
    /// Filesystem (and journal) block size.
    pub block_size: u32,
    /// Blocks in the filesystem.
    pub fs_blocks: u64,
    /// The ext4 superblock as read.
    pub sb: Superblock,
    /// The journal superblock as read.
    pub jsb: JournalSuperblock,
    /// Which checksums and tag forms the log uses.
    pub fmt: LogFormat,
    /// The journal inode's block runs, sorted, covering `0..s_maxlen`.
    pub runs: Vec<Run>,
    seed: u32,
    first: u32,
    last: u32,
    maxlen: u32,
    jsb_block: u64,
    external: bool,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("block_size", &self.block_size)
            .field("fmt", &self.fmt)
            .field("first", &self.first)
            .field("last", &self.last)
            .field("runs", &self.runs)
            .finish_non_exhaustive()
    }
}

fn read_block(dev: &dyn Device, bs: u32, block: u64) -> Result<Vec<u8>, RecoverError> {
    let mut buf = vec![0u8; bs as usize];
    let off = block
        .checked_mul(u64::from(bs))
        .ok_or_else(|| corrupt("block number", format!("{block} overflows")))?;
    dev.read_at(&mut buf, off)?;
    Ok(buf)
}

/// A UUID as `blkid` prints it.
pub fn fmt_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..].concat()
    )
}

fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Read and sanity-check the primary ext4 superblock.
pub fn read_superblock(dev: &dyn Device) -> Result<Superblock, RecoverError> {
    read_superblock_with(dev, true)
}

/// [`read_superblock`], optionally without the metadata_csum checksum
/// check (for replaying a log over a superblock whose in-place write was
/// torn: the log holds a whole copy of it).
pub fn read_superblock_with(
    dev: &dyn Device,
    check_csum: bool,
) -> Result<Superblock, RecoverError> {
    if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Err(corrupt(
            "superblock",
            format!("the device has only {} bytes", dev.size()),
        ));
    }
    let mut raw = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
    let sb = Superblock::parse(&raw).ok_or_else(|| corrupt("superblock", "short read"))?;
    if sb.s_magic.get() != EXT4_MAGIC {
        return Err(RecoverError::NotExt4(sb.s_magic.get()));
    }
    let ro = RoCompat(sb.s_feature_ro_compat.get());
    if check_csum && ro.contains(RoCompat::METADATA_CSUM) && !sb.checksum_ok() {
        return Err(corrupt(
            "superblock",
            format!(
                "checksum {:#010x} does not match the computed {:#010x}",
                sb.s_checksum.get(),
                sb.compute_checksum()
            ),
        ));
    }
    Ok(sb)
}

impl Journal {
    /// Open the filesystem's internal journal on `dev`.
    pub fn open(dev: &dyn Device) -> Result<Journal, RecoverError> {
        Self::open_with(dev, true)
    }

    /// [`Journal::open`], optionally accepting a primary superblock whose
    /// checksum does not match (see [`read_superblock_with`]).
    pub fn open_with(dev: &dyn Device, check_sb_csum: bool) -> Result<Journal, RecoverError> {
        let sb = read_superblock_with(dev, check_sb_csum)?;
        let compat = Compat(sb.s_feature_compat.get());
        let incompat = Incompat(sb.s_feature_incompat.get());
        if incompat.contains(Incompat::JOURNAL_DEV) {
            return Err(RecoverError::Unsupported(
                "this is an external journal device, not a filesystem".into(),
            ));
        }
        let ino = sb.s_journal_inum.get();
        // A journal device is named by its UUID (and the device number
        // hint, which the kernel's journal_path= replaces).
        let names_device = sb.s_journal_dev.get() != 0 || sb.s_journal_uuid != [0; 16];
        if !compat.contains(Compat::HAS_JOURNAL) || (ino == 0 && !names_device) {
            return Err(RecoverError::NoJournal);
        }
        if ino != 0 && names_device {
            // ext4_load_journal: "filesystem has both journal inode and
            // journal device!"
            return Err(corrupt(
                "superblock",
                format!(
                    "it names both a journal inode ({ino}) and a journal device (UUID {}, device {:#06x})",
                    fmt_uuid(&sb.s_journal_uuid),
                    sb.s_journal_dev.get()
                ),
            ));
        }
        if ino == 0 {
            return Self::open_external(dev, sb);
        }
        if dev.journal_base().is_some() {
            return Err(RecoverError::ExternalJournal(format!(
                "the filesystem's journal is internal (inode {ino}): journal_path= names no journal device"
            )));
        }
        let bs = sb
            .block_size()
            .ok_or_else(|| corrupt("superblock", "block size out of range"))?;
        let fs_blocks = sb.blocks_count();
        if fs_blocks == 0 || fs_blocks.saturating_mul(u64::from(bs)) > dev.size() {
            return Err(corrupt(
                "superblock",
                format!(
                    "{fs_blocks} blocks of {bs} bytes do not fit the device ({} bytes)",
                    dev.size()
                ),
            ));
        }
        let csum = Csum::from_superblock(&sb);
        let raw_inode = read_inode(dev, &sb, bs, fs_blocks, ino)?;
        if csum.metadata && !inode::checksum_ok(&raw_inode, ino, &csum) {
            return Err(corrupt(
                "journal inode",
                format!("inode {ino} checksum does not match"),
            ));
        }
        let node = ext4kit_format::Inode::parse(&raw_inode)
            .ok_or_else(|| corrupt("journal inode", "short inode"))?;
        let flags = node.i_flags.get();
        if flags & EXT4_INLINE_DATA_FL != 0 {
            return Err(corrupt("journal inode", "it has inline data"));
        }
        let size_blocks = node.size() / u64::from(bs);
        if size_blocks < 2 {
            return Err(corrupt(
                "journal inode",
                format!("size {} is too small", node.size()),
            ));
        }
        let i_block = node.i_block.as_bytes().to_vec();
        let mapper = Mapper {
            dev,
            bs,
            fs_blocks,
            first_data_block: u64::from(sb.s_first_data_block.get()),
        };
        let map = |limit: u32| -> Result<Vec<Run>, RecoverError> {
            let mut runs = Vec::new();
            if flags & EXT4_EXTENTS_FL != 0 {
                mapper.extents(&i_block, limit, 0, &mut runs)?;
            } else {
                mapper.block_map(&i_block, limit, &mut runs)?;
            }
            runs.sort_by_key(|r| r.lblk);
            Ok(runs)
        };
        // Block 0 first (the journal superblock), then the whole log.
        let runs0 = map(1)?;
        let jsb_blk = lookup(&runs0, 0).ok_or_else(|| {
            corrupt(
                "journal inode",
                "its first block (the journal superblock) is not mapped",
            )
        })?;
        let raw = read_block(dev, bs, jsb_blk)?;
        let jsb = JournalSuperblock::parse(&raw).ok_or_else(|| bad_jsb("short block"))?;
        let fmt = validate_jsb(&jsb, &raw, bs, size_blocks)?;
        let maxlen = jsb.s_maxlen.get();
        let runs = map(maxlen)?;
        check_coverage(&runs, maxlen)?;
        // No two logical blocks may share a physical block.
        let mut phys: Vec<(u64, u64)> = runs
            .iter()
            .map(|r| (r.pblk, r.pblk + u64::from(r.len)))
            .collect();
        phys.sort_unstable();
        if phys.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err(corrupt("journal inode", "two of its blocks overlap"));
        }
        let seed = jcsum::seed(&jsb.s_uuid);
        Ok(Journal {
            block_size: bs,
            fs_blocks,
            first: jsb.s_first.get(),
            last: maxlen - jsb.fc_area_blocks(),
            maxlen,
            sb,
            jsb,
            fmt,
            runs,
            seed,
            jsb_block: jsb_blk,
            external: false,
        })
    }

    /// The journal of a filesystem whose journal is on another device
    /// (`s_journal_inum` 0, `s_journal_uuid`/`s_journal_dev` set): `dev`
    /// must be a [`ext4kit_device::WithJournal`] joining the journal
    /// device ([`Device::journal_base`]). Checked as the kernel's
    /// `ext4_get_dev_journal` and jbd2's superblock load check it: the
    /// device is a journal device (ext4 superblock with incompat
    /// JOURNAL_DEV), its UUID is the filesystem's `s_journal_uuid`, the
    /// block sizes are equal, the jbd2 superblock (at block
    /// `ext2fs_journal_sb_start`) is valid, has one user and that user is
    /// this filesystem. Log block `n` is block `n` of the journal device
    /// (jbd2's `bmap` of a device journal is the identity; `s_first` is
    /// the block after the jbd2 superblock).
    fn open_external(dev: &dyn Device, sb: Superblock) -> Result<Journal, RecoverError> {
        let want = sb.s_journal_uuid;
        let Some(base) = dev.journal_base() else {
            return Err(RecoverError::ExternalJournal(format!(
                "the journal is on another device (UUID {}, device {:#06x}): name it with journal_path=PATH (--journal-path PATH)",
                fmt_uuid(&want),
                sb.s_journal_dev.get()
            )));
        };
        let bs = sb
            .block_size()
            .ok_or_else(|| corrupt("superblock", "block size out of range"))?;
        let fs_blocks = sb.blocks_count();
        if fs_blocks == 0 || fs_blocks.saturating_mul(u64::from(bs)) > base {
            return Err(corrupt(
                "superblock",
                format!("{fs_blocks} blocks of {bs} bytes do not fit the device ({base} bytes)"),
            ));
        }
        if base % u64::from(bs) != 0 {
            return Err(corrupt(
                "journal device",
                format!("offset {base} is not a multiple of the block size"),
            ));
        }
        let jsize = dev.size() - base;
        let bad_dev = |why: String| RecoverError::ExternalJournal(format!("journal device: {why}"));
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        if jsize < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
            return Err(bad_dev(format!(
                "not an external journal device (only {jsize} bytes)"
            )));
        }
        dev.read_at(&mut raw, base + SUPERBLOCK_OFFSET)?;
        let jsb_ext4 =
            Superblock::parse(&raw).ok_or_else(|| corrupt("superblock", "short read"))?;
        if jsb_ext4.s_magic.get() != EXT4_MAGIC
            || !Incompat(jsb_ext4.s_feature_incompat.get()).contains(Incompat::JOURNAL_DEV)
        {
            return Err(bad_dev(
                "not an external journal device (no ext4 superblock with the journal_dev feature)"
                    .into(),
            ));
        }
        if RoCompat(jsb_ext4.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM)
            && !jsb_ext4.checksum_ok()
        {
            return Err(bad_dev("its superblock checksum does not match".into()));
        }
        if jsb_ext4.s_uuid != want {
            return Err(bad_dev(format!(
                "UUID {} is not the filesystem's journal UUID {}",
                fmt_uuid(&jsb_ext4.s_uuid),
                fmt_uuid(&want)
            )));
        }
        let jbs = jsb_ext4.block_size().unwrap_or(0);
        if jbs != bs {
            return Err(bad_dev(format!(
                "block size {jbs} differs from the filesystem's {bs}"
            )));
        }
        let jblocks = jsb_ext4.blocks_count().min(jsize / u64::from(bs));
        let start: u64 = if bs == 1024 { 2 } else { 1 };
        let base_blk = base / u64::from(bs);
        let jsb_blk = base_blk + start;
        if start >= jblocks {
            return Err(bad_dev(format!("only {jblocks} blocks")));
        }
        let rawj = read_block(dev, bs, jsb_blk)?;
        let jsb = JournalSuperblock::parse(&rawj).ok_or_else(|| bad_jsb("short block"))?;
        let fmt = validate_jsb(&jsb, &rawj, bs, jblocks)?;
        let nr = jsb.s_nr_users.get();
        if nr == 0 || !jsb.s_users[..16].eq(&sb.s_uuid[..]) {
            return Err(bad_dev(format!(
                "the filesystem (UUID {}) is not among its users",
                fmt_uuid(&sb.s_uuid)
            )));
        }
        let maxlen = jsb.s_maxlen.get();
        let first = jsb.s_first.get();
        if u64::from(first) <= start {
            return Err(bad_jsb(format!(
                "s_first {first} is not after the journal superblock (block {start})"
            )));
        }
        let seed = jcsum::seed(&jsb.s_uuid);
        Ok(Journal {
            block_size: bs,
            fs_blocks,
            first,
            last: maxlen - jsb.fc_area_blocks(),
            maxlen,
            sb,
            jsb,
            fmt,
            runs: vec![Run {
                lblk: 0,
                pblk: base_blk,
                len: maxlen,
            }],
            seed,
            jsb_block: jsb_blk,
            external: true,
        })
    }

    /// Physical block of the journal superblock (log block 0 of an
    /// internal journal; block 1 or 2 of an external journal device).
    pub fn jsb_block(&self) -> u64 {
        self.jsb_block
    }

    /// Is the journal on another device ([`ext4kit_device::WithJournal`])?
    pub fn is_external(&self) -> bool {
        self.external
    }

    /// `j_csum_seed`: crc32c of the journal UUID.
    pub fn csum_seed(&self) -> u32 {
        self.seed
    }

    /// First log block (`s_first`).
    pub fn first(&self) -> u32 {
        self.first
    }

    /// End of the full-commit log (the kernel's `j_last`): log blocks
    /// are `first()..last()`, wrapping at `last()`. It is `s_maxlen`, or
    /// `s_maxlen - num_fc_blks` when the journal has the fast-commit
    /// feature (the fast-commit area follows, [`Journal::fc_area`]).
    pub fn last(&self) -> u32 {
        self.last
    }

    /// `s_maxlen`: the journal's length in blocks.
    pub fn maxlen(&self) -> u32 {
        self.maxlen
    }

    /// Log blocks the kernel writes fast commits to (`j_fc_first..
    /// s_maxlen`, `j_fc_first = j_last + 1`), when the journal superblock
    /// has the fast-commit feature.
    pub fn fc_area(&self) -> Option<std::ops::Range<u32>> {
        self.fmt
            .fast_commit()
            .then(|| self.last.saturating_add(1).min(self.maxlen)..self.maxlen)
    }

    /// Physical block of log block `lblk`.
    pub fn phys(&self, lblk: u64) -> Option<u64> {
        u32::try_from(lblk).ok().and_then(|l| lookup(&self.runs, l))
    }

    /// Is physical block `pblk` one of the journal's own blocks?
    pub fn contains_phys(&self, pblk: u64) -> bool {
        self.runs
            .iter()
            .any(|r| pblk >= r.pblk && pblk < r.pblk + u64::from(r.len))
    }

    /// The kernel's `jread`: log block `offset`, refused past `s_maxlen`.
    pub(crate) fn jread(&self, dev: &dyn Device, offset: u64) -> Result<Vec<u8>, RecoverError> {
        if offset >= u64::from(self.maxlen) {
            return Err(log_err(
                offset,
                format!("past the end of the log ({} blocks)", self.maxlen),
            ));
        }
        let p = self
            .phys(offset)
            .ok_or_else(|| log_err(offset, "not mapped"))?;
        read_block(dev, self.block_size, p)
    }

    /// The kernel's `wrap()` macro: one subtraction, no modulo.
    fn wrap(&self, v: &mut u64) {
        let last = u64::from(self.last);
        if *v >= last {
            *v -= last - u64::from(self.first);
        }
    }

    fn tail_ok(&self, block: &[u8]) -> bool {
        if !self.fmt.csum_v2or3() {
            return true;
        }
        let n = block.len();
        jcsum::block_tail(self.seed, block) == be32(block, n - 4)
    }

    fn commit_ok(&self, block: &[u8]) -> bool {
        if !self.fmt.csum_v2or3() {
            return true;
        }
        jcsum::commit(self.seed, block) == be32(block, 16)
    }

    fn tag_ok(&self, tag: &Tag, data: &[u8], tid: u32) -> bool {
        if !self.fmt.csum_v2or3() {
            return true;
        }
        let c = jcsum::tag(self.seed, tid, data);
        if self.fmt.csum_v3() {
            tag.checksum == c
        } else {
            tag.checksum == c & 0xFFFF
        }
    }

    /// The tags of a descriptor block as the kernel walks them
    /// (`count_tags`): offset of each tag in the block and the tag.
    fn tags(&self, block: &[u8]) -> Vec<(usize, Tag)> {
        let tb = self.fmt.tag_bytes();
        let size = block.len() - self.fmt.tail_bytes();
        let mut pos = size_of::<JournalHeader>();
        let mut out = Vec::new();
        while pos + tb <= size {
            let Some(tag) = Tag::parse(&block[pos..], self.fmt) else {
                break;
            };
            out.push((pos, tag));
            pos += tb;
            if tag.flags & JBD2_FLAG_SAME_UUID == 0 {
                pos += 16;
            }
            if tag.flags & JBD2_FLAG_LAST_TAG != 0 {
                break;
            }
        }
        out
    }
}

fn lookup(runs: &[Run], lblk: u32) -> Option<u64> {
    let i = runs.partition_point(|r| r.lblk <= lblk);
    let r = runs.get(i.checked_sub(1)?)?;
    (lblk - r.lblk < r.len).then(|| r.pblk + u64::from(lblk - r.lblk))
}

fn check_coverage(runs: &[Run], maxlen: u32) -> Result<(), RecoverError> {
    let mut next = 0u32;
    for r in runs {
        if r.lblk > next {
            break;
        }
        if r.lblk < next {
            return Err(corrupt(
                "journal inode",
                format!("logical block {} is mapped twice", r.lblk),
            ));
        }
        next = r.lblk.saturating_add(r.len);
        if next >= maxlen {
            return Ok(());
        }
    }
    Err(corrupt(
        "journal inode",
        format!("log block {next} (of {maxlen}) is not mapped"),
    ))
}

fn read_inode(
    dev: &dyn Device,
    sb: &Superblock,
    bs: u32,
    fs_blocks: u64,
    ino: u32,
) -> Result<Vec<u8>, RecoverError> {
    let ipg = sb.s_inodes_per_group.get();
    let bpg = sb.s_blocks_per_group.get();
    if ipg == 0 || bpg == 0 || ino > sb.s_inodes_count.get() {
        return Err(corrupt(
            "superblock",
            format!("inode {ino} is outside the inode tables"),
        ));
    }
    let inode_size = if sb.s_rev_level.get() == 0 {
        128
    } else {
        u32::from(sb.s_inode_size.get())
    };
    if !(128..=bs).contains(&inode_size) || !inode_size.is_power_of_two() {
        return Err(corrupt(
            "superblock",
            format!("inode size {inode_size} is invalid"),
        ));
    }
    let group = (ino - 1) / ipg;
    let desc_size = u32::from(sb.desc_size());
    if desc_size < 32 || desc_size > bs || !desc_size.is_power_of_two() {
        return Err(corrupt(
            "superblock",
            format!("descriptor size {desc_size} is invalid"),
        ));
    }
    // The block after the superblock's (block 2 with 1 KiB blocks also
    // when bigalloc makes s_first_data_block 0).
    let gdt = ext4kit_format::layout::gdt_start(bs);
    let byte = u64::from(group) * u64::from(desc_size);
    let dblk = gdt + byte / u64::from(bs);
    if dblk >= fs_blocks {
        return Err(corrupt(
            "group descriptor",
            format!("group {group}'s descriptor is outside the filesystem"),
        ));
    }
    let blk = read_block(dev, bs, dblk)?;
    let off = (byte % u64::from(bs)) as usize;
    let gd = GroupDesc::parse(&blk[off..off + desc_size as usize])
        .ok_or_else(|| corrupt("group descriptor", "short"))?;
    let mut table = gd.inode_table();
    if desc_size < 64 {
        table &= 0xFFFF_FFFF;
    }
    let index = u64::from((ino - 1) % ipg);
    let ipb = u64::from(bs / inode_size);
    let iblk = table + index / ipb;
    if table == 0 || iblk >= fs_blocks {
        return Err(corrupt(
            "group descriptor",
            format!("group {group}'s inode table (block {table}) is outside the filesystem"),
        ));
    }
    let b = read_block(dev, bs, iblk)?;
    let o = ((index % ipb) * u64::from(inode_size)) as usize;
    Ok(b[o..o + inode_size as usize].to_vec())
}

struct Mapper<'a> {
    dev: &'a dyn Device,
    bs: u32,
    fs_blocks: u64,
    first_data_block: u64,
}

impl Mapper<'_> {
    fn check_phys(&self, pblk: u64, len: u64, what: &str) -> Result<(), RecoverError> {
        let end = pblk.checked_add(len);
        if pblk < self.first_data_block.max(1) || end.is_none_or(|e| e > self.fs_blocks) {
            return Err(corrupt(
                "journal inode",
                format!(
                    "{what} at block {pblk} (+{len}) is outside the filesystem ({} blocks)",
                    self.fs_blocks
                ),
            ));
        }
        Ok(())
    }

    /// Walk an extent node (`node` = header + entries), collecting runs for
    /// logical blocks below `limit`.
    fn extents(
        &self,
        node: &[u8],
        limit: u32,
        level: u32,
        out: &mut Vec<Run>,
    ) -> Result<(), RecoverError> {
        let hdr = ExtentHeader::read_from_prefix(node)
            .map(|(h, _)| h)
            .map_err(|_| corrupt("journal inode", "short extent node"))?;
        if hdr.eh_magic.get() != EXTENT_MAGIC {
            return Err(corrupt("journal inode", "bad extent header magic"));
        }
        let entries = usize::from(hdr.eh_entries.get());
        let max = usize::from(hdr.eh_max.get());
        let depth = u32::from(hdr.eh_depth.get());
        let room = (node.len() - 12) / 12;
        if entries > max || max > room || depth > 5 || level > 5 || (level > 0 && depth >= level) {
            return Err(corrupt(
                "journal inode",
                format!("extent node: {entries} entries, max {max}, depth {depth}"),
            ));
        }
        for i in 0..entries {
            let e = &node[12 + i * 12..24 + i * 12];
            if depth == 0 {
                let Ok(x) = Extent::read_from_bytes(e) else {
                    continue;
                };
                let lblk = x.ee_block.get();
                if lblk >= limit {
                    continue;
                }
                let len = x.len();
                self.check_phys(x.start(), u64::from(len), "an extent")?;
                if len > 0 {
                    out.push(Run {
                        lblk,
                        pblk: x.start(),
                        len,
                    });
                }
            } else {
                let Ok(ix) = ExtentIndex::read_from_bytes(e) else {
                    continue;
                };
                if ix.ei_block.get() >= limit {
                    continue;
                }
                self.check_phys(ix.leaf(), 1, "an extent index block")?;
                let child = read_block(self.dev, self.bs, ix.leaf())?;
                let child_depth = u16::from_le_bytes([child[6], child[7]]);
                if u32::from(child_depth) + 1 != depth {
                    return Err(corrupt(
                        "journal inode",
                        format!("extent block {} has the wrong depth", ix.leaf()),
                    ));
                }
                self.extents(&child, limit, depth, out)?;
            }
            if out.len() > MAX_JOURNAL_BLOCKS as usize {
                return Err(corrupt("journal inode", "too many extents"));
            }
        }
        Ok(())
    }

    /// Walk an ext2/3 block map (12 direct, indirect, double, triple).
    fn block_map(
        &self,
        i_block: &[u8],
        limit: u32,
        out: &mut Vec<Run>,
    ) -> Result<(), RecoverError> {
        let mut push = |lblk: u32, pblk: u64| {
            if let Some(r) = out.last_mut()
                && r.lblk + r.len == lblk
                && r.pblk + u64::from(r.len) == pblk
            {
                r.len += 1;
                return;
            }
            out.push(Run { lblk, pblk, len: 1 });
        };
        let per = u64::from(self.bs / 4);
        let mut lblk: u64 = 0;
        for i in 0..12 {
            if lblk >= u64::from(limit) {
                return Ok(());
            }
            let p = u64::from(le32(i_block, i * 4));
            if p != 0 {
                self.check_phys(p, 1, "a data block")?;
                push(lblk as u32, p);
            }
            lblk += 1;
        }
        for level in 1..=3u32 {
            if lblk >= u64::from(limit) {
                return Ok(());
            }
            let p = u64::from(le32(i_block, (11 + level as usize) * 4));
            let span = per.pow(level);
            if p != 0 {
                self.indirect(p, level, lblk, limit, &mut push)?;
            }
            lblk += span;
        }
        Ok(())
    }

    fn indirect(
        &self,
        p: u64,
        level: u32,
        base: u64,
        limit: u32,
        push: &mut dyn FnMut(u32, u64),
    ) -> Result<(), RecoverError> {
        self.check_phys(p, 1, "an indirect block")?;
        let b = read_block(self.dev, self.bs, p)?;
        let per = u64::from(self.bs / 4);
        let span = per.pow(level - 1);
        for i in 0..per {
            let lblk = base + i * span;
            if lblk >= u64::from(limit) {
                break;
            }
            let c = u64::from(le32(&b, i as usize * 4));
            if c == 0 {
                continue;
            }
            if level == 1 {
                self.check_phys(c, 1, "a data block")?;
                push(lblk as u32, c);
            } else {
                self.indirect(c, level - 1, lblk, limit, push)?;
            }
        }
        Ok(())
    }
}

/// The checks of the kernel's and e2fsck's journal load.
fn validate_jsb(
    jsb: &JournalSuperblock,
    raw: &[u8],
    bs: u32,
    size_blocks: u64,
) -> Result<LogFormat, RecoverError> {
    if jsb.h_magic.get() != JBD2_MAGIC {
        return Err(bad_jsb(format!(
            "magic {:#010x}, expected {JBD2_MAGIC:#010x}",
            jsb.h_magic.get()
        )));
    }
    match jsb.h_blocktype.get() {
        JBD2_SUPERBLOCK_V2 => {}
        JBD2_SUPERBLOCK_V1 => {
            return Err(RecoverError::Unsupported(
                "version 1 journal superblocks".into(),
            ));
        }
        t => return Err(bad_jsb(format!("block type {t} is not a superblock"))),
    }
    let fmt = LogFormat::of(jsb);
    if jsb.s_nr_users.get() > 1 {
        return Err(RecoverError::Unsupported(
            "journals shared by several filesystems".into(),
        ));
    }
    let unknown = fmt.incompat & !JBD2_KNOWN_INCOMPAT_FEATURES;
    if unknown != 0 {
        return Err(RecoverError::Unsupported(format!(
            "journal incompat features {unknown:#x}"
        )));
    }
    let ro = jsb.s_feature_ro_compat.get() & !JBD2_KNOWN_ROCOMPAT_FEATURES;
    if ro != 0 {
        return Err(RecoverError::Unsupported(format!(
            "journal ro_compat features {ro:#x}"
        )));
    }
    if fmt.csum_v2() && fmt.csum_v3() {
        return Err(bad_jsb("both csum_v2 and csum_v3 are set"));
    }
    if fmt.csum_v2or3() && fmt.csum_v1() {
        return Err(bad_jsb("checksum v1 and v2/v3 are both set"));
    }
    if fmt.csum_v2or3() {
        if jsb.s_checksum_type != JBD2_CRC32C_CHKSUM {
            return Err(bad_jsb(format!(
                "checksum type {}, expected 4 (crc32c)",
                jsb.s_checksum_type
            )));
        }
        let c = jcsum::superblock(raw);
        if c != jsb.s_checksum.get() {
            return Err(bad_jsb(format!(
                "checksum {:#010x} does not match the computed {c:#010x}",
                jsb.s_checksum.get()
            )));
        }
    }
    if jsb.s_blocksize.get() != bs {
        return Err(bad_jsb(format!(
            "block size {} differs from the filesystem's {bs}",
            jsb.s_blocksize.get()
        )));
    }
    let maxlen = jsb.s_maxlen.get();
    if u64::from(maxlen) > size_blocks {
        return Err(bad_jsb(format!(
            "s_maxlen {maxlen} is larger than the journal inode ({size_blocks} blocks)"
        )));
    }
    if maxlen > MAX_JOURNAL_BLOCKS {
        return Err(RecoverError::Unsupported(format!(
            "journals larger than {MAX_JOURNAL_BLOCKS} blocks"
        )));
    }
    let first = jsb.s_first.get();
    if first == 0 || first >= maxlen {
        return Err(bad_jsb(format!(
            "s_first {first} is outside the log (s_maxlen {maxlen})"
        )));
    }
    // e2fsck_journal_load: the full-commit log must keep at least the
    // minimum journal size besides the fast-commit area.
    let fc = jsb.fc_area_blocks();
    if fc != 0 && maxlen.saturating_sub(fc) < JBD2_MIN_JOURNAL_BLOCKS.max(first + 1) {
        return Err(bad_jsb(format!(
            "incorrect fast commit blocks ({fc} of s_maxlen {maxlen})"
        )));
    }
    let last = maxlen - fc;
    let start = jsb.s_start.get();
    if start != 0 && (start < first || start >= last) {
        return Err(bad_jsb(format!(
            "s_start {start} is outside the log ({first}..{last})"
        )));
    }
    Ok(fmt)
}

/// One tag as the dump shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagInfo {
    /// Home block.
    pub block: u64,
    /// Log block holding its copy.
    pub log_block: u64,
    /// Tag flags (escape, same_uuid, deleted, last_tag).
    pub flags: u16,
}

/// What one log block in the live part of the log is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogBlock {
    Descriptor {
        tags: Vec<TagInfo>,
        checksum_ok: bool,
    },
    Revoke {
        blocks: Vec<u64>,
        checksum_ok: bool,
    },
    Commit {
        sec: u64,
        nsec: u32,
        checksum_ok: bool,
    },
}

/// A log block found by the scan pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// Position in the log.
    pub log_block: u64,
    /// Transaction id in its header.
    pub tid: u32,
    pub kind: LogBlock,
}

/// One home write of the replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeWrite {
    pub block: u64,
    pub data: Vec<u8>,
}

/// The result of a recovery: what the log holds and what replay writes.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// Was there anything to replay (`s_start != 0`)?
    pub dirty: bool,
    /// First transaction in the log (`s_sequence`).
    pub start_tid: u32,
    /// First transaction *not* replayed (the kernel's `end_transaction`).
    pub end_tid: u32,
    /// `s_sequence` after recovery (`end_tid + 1`, or `s_sequence + 1`
    /// for an empty log, as jbd2 and e2fsck set it).
    pub next_sequence: u32,
    /// A transaction whose commit checksum failed (the kernel's
    /// `j_failed_commit`), if any: the log ends before it and the
    /// filesystem is marked in error.
    pub failed_commit: Option<u32>,
    /// Blocks of the live log in log order (scan pass).
    pub entries: Vec<LogEntry>,
    /// Tagged blocks written (counting repeats), revoke records, and
    /// tags skipped because revoked.
    pub nr_replays: u64,
    pub nr_revokes: u64,
    pub nr_revoke_hits: u64,
    /// Final content of every block replay writes, by home block (a later
    /// transaction's copy replaces an earlier one, as the writes would).
    pub writes: BTreeMap<u64, Vec<u8>>,
    /// What the fast-commit area holds for `end_tid` (journals with the
    /// fast-commit feature). Anything but [`FcLog::Empty`] makes
    /// [`apply`] refuse: `writes` alone would be half the replay. A
    /// read-only overlay of `writes` shows the state of the full commits.
    pub fast_commit: FcLog,
}

impl Recovery {
    /// The home writes in block order.
    pub fn home_writes(&self) -> impl Iterator<Item = HomeWrite> + '_ {
        self.writes.iter().map(|(&block, data)| HomeWrite {
            block,
            data: data.clone(),
        })
    }
    /// Number of transactions replayed.
    pub fn transactions(&self) -> u32 {
        if self.dirty {
            self.end_tid.wrapping_sub(self.start_tid)
        } else {
            0
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pass {
    Scan,
    Revoke,
    Replay,
}

#[derive(Default)]
struct Info {
    /// The kernel's `end_transaction`; 0 means "not found yet".
    end: u32,
    failed_commit: u32,
}

/// Run the kernel's recovery over the journal and return what it would
/// write. Nothing is written. `Err` is returned where the kernel's
/// recovery fails (then neither the kernel nor ext4kit writes anything
/// sensible; e2fsck would write what it could and mark the fs for a check).
pub fn recover(dev: &dyn Device, j: &Journal) -> Result<Recovery, RecoverError> {
    let (rec, res) = analyze(dev, j);
    res.map(|()| rec)
}

/// Like [`recover`], but also returns what the scan found when the
/// recovery fails (for `journal dump`).
pub fn analyze(dev: &dyn Device, j: &Journal) -> (Recovery, Result<(), RecoverError>) {
    let mut rec = Recovery {
        start_tid: j.jsb.s_sequence.get(),
        ..Recovery::default()
    };
    if j.jsb.s_start.get() == 0 {
        rec.end_tid = rec.start_tid;
        rec.next_sequence = rec.start_tid.wrapping_add(1);
        return (rec, Ok(()));
    }
    rec.dirty = true;
    let mut info = Info::default();
    let mut revoked: HashMap<u64, u32> = HashMap::new();
    let mut res = do_one_pass(dev, j, Pass::Scan, &mut info, &mut revoked, &mut rec);
    if res.is_ok() {
        res = do_one_pass(dev, j, Pass::Revoke, &mut info, &mut revoked, &mut rec);
    }
    if res.is_ok() {
        res = do_one_pass(dev, j, Pass::Replay, &mut info, &mut revoked, &mut rec);
    }
    rec.end_tid = info.end;
    rec.next_sequence = info.end.wrapping_add(1);
    rec.failed_commit = (info.failed_commit != 0).then_some(info.failed_commit);
    if res.is_ok() {
        // do_one_pass: after the full-commit scan, the fast-commit area
        // is scanned for end_transaction.
        match fast_commit::scan(dev, j, info.end) {
            Ok(fc) => rec.fast_commit = fc,
            Err(e) => res = Err(e),
        }
    }
    if res.is_ok() {
        // Refuse home writes that no sane log has: outside the
        // filesystem, or into the journal itself (the replay would then
        // read back its own writes).
        for &b in rec.writes.keys() {
            if b >= j.fs_blocks {
                res = Err(log_err(
                    0,
                    format!(
                        "a tag points at block {b}, beyond the filesystem ({} blocks)",
                        j.fs_blocks
                    ),
                ));
                break;
            }
            if j.contains_phys(b) {
                res = Err(log_err(
                    0,
                    format!("a tag points at block {b}, inside the journal"),
                ));
                break;
            }
        }
    }
    (rec, res)
}

fn do_one_pass(
    dev: &dyn Device,
    j: &Journal,
    pass: Pass,
    info: &mut Info,
    revoked: &mut HashMap<u64, u32>,
    rec: &mut Recovery,
) -> Result<(), RecoverError> {
    let mut next_commit = j.jsb.s_sequence.get();
    let mut next_block = u64::from(j.jsb.s_start.get());
    let mut success: Option<RecoverError> = None;
    let mut crc32_sum: u32 = !0;
    let mut need_check_commit_time = false;
    let mut last_commit_time: u64 = 0;
    let mut block_error = false;
    let tail = j.fmt.tail_bytes();
    let tb = j.fmt.tag_bytes();
    let mut steps: u64 = 0;

    'log: loop {
        // A log can't hold more blocks than s_maxlen per pass; a loop that
        // goes on is a corrupt log the kernel would also walk forever on
        // (it can't: tids differ), so stop it.
        steps += 1;
        if steps > 4 * u64::from(j.last) + 16 {
            return Err(log_err(next_block, "the log does not end"));
        }
        if pass != Pass::Scan && tid_geq(next_commit, info.end) {
            break;
        }
        let this_block = next_block;
        let buf = j.jread(dev, next_block)?;
        next_block += 1;
        j.wrap(&mut next_block);

        let hdr = JournalHeader::parse(&buf).ok_or_else(|| log_err(this_block, "short block"))?;
        if hdr.h_magic.get() != JBD2_MAGIC {
            break;
        }
        let blocktype = hdr.h_blocktype.get();
        let sequence = hdr.h_sequence.get();
        if sequence != next_commit {
            break;
        }

        match blocktype {
            JBD2_DESCRIPTOR_BLOCK => {
                let csum_ok = j.tail_ok(&buf);
                if !csum_ok {
                    if pass != Pass::Scan {
                        return Err(log_err(
                            this_block,
                            "invalid checksum in a descriptor block",
                        ));
                    }
                    need_check_commit_time = true;
                }
                let tags = j.tags(&buf);
                if pass == Pass::Scan {
                    let mut lb = next_block;
                    let mut infos = Vec::with_capacity(tags.len());
                    for (_, t) in &tags {
                        infos.push(TagInfo {
                            block: t.blocknr,
                            log_block: lb,
                            flags: t.flags,
                        });
                        lb += 1;
                        j.wrap(&mut lb);
                    }
                    rec.entries.push(LogEntry {
                        log_block: this_block,
                        tid: sequence,
                        kind: LogBlock::Descriptor {
                            tags: infos,
                            checksum_ok: csum_ok,
                        },
                    });
                }
                if pass != Pass::Replay {
                    if pass == Pass::Scan
                        && j.fmt.csum_v1()
                        && !need_check_commit_time
                        && info.end == 0
                    {
                        // calc_chksums: crc32_be over the descriptor and
                        // the blocks it describes. A read error only
                        // leaves the `switch` in the kernel.
                        crc32_sum = checksum::crc32_be(crc32_sum, &buf);
                        for _ in 0..tags.len() {
                            let io = next_block;
                            next_block += 1;
                            j.wrap(&mut next_block);
                            match j.jread(dev, io) {
                                Ok(b) => crc32_sum = checksum::crc32_be(crc32_sum, &b),
                                Err(_) => continue 'log,
                            }
                        }
                        continue;
                    }
                    next_block += tags.len() as u64;
                    j.wrap(&mut next_block);
                    continue;
                }
                // PASS_REPLAY: the walk of the replay loop (same bounds as
                // count_tags).
                let size = buf.len() - tail;
                let mut pos = size_of::<JournalHeader>();
                while pos + tb <= size {
                    let Some(tag) = Tag::parse(&buf[pos..], j.fmt) else {
                        break;
                    };
                    let io = next_block;
                    next_block += 1;
                    j.wrap(&mut next_block);
                    match j.jread(dev, io) {
                        Err(e) => {
                            success.get_or_insert(e);
                        }
                        Ok(mut data) => {
                            let blocknr = tag.blocknr;
                            let is_revoked = revoked
                                .get(&blocknr)
                                .is_some_and(|&r| !tid_gt(next_commit, r));
                            if is_revoked {
                                rec.nr_revoke_hits += 1;
                            } else if !j.tag_ok(&tag, &data, sequence) {
                                success.get_or_insert(log_err(
                                    io,
                                    format!("invalid checksum of the copy of block {blocknr}"),
                                ));
                                block_error = true;
                            } else {
                                if tag.flags & JBD2_FLAG_ESCAPE != 0 {
                                    data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
                                }
                                rec.nr_replays += 1;
                                rec.writes.insert(blocknr, data);
                            }
                        }
                    }
                    pos += tb;
                    if tag.flags & JBD2_FLAG_SAME_UUID == 0 {
                        pos += 16;
                    }
                    if tag.flags & JBD2_FLAG_LAST_TAG != 0 {
                        break;
                    }
                }
                continue;
            }
            JBD2_COMMIT_BLOCK => {
                let commit_time = u64::from_be_bytes(buf[48..56].try_into().unwrap_or([0; 8]));
                if need_check_commit_time {
                    if commit_time >= last_commit_time {
                        return Err(log_err(
                            this_block,
                            format!("invalid checksum found in transaction {next_commit}"),
                        ));
                    }
                    // Stale blocks of an older log: the log ends here.
                    break 'log;
                }
                let mut chksum_err = false;
                if pass == Pass::Scan && j.fmt.csum_v1() {
                    let ch = CommitHeader::parse(&buf)
                        .ok_or_else(|| log_err(this_block, "short block"))?;
                    let found = ch.h_chksum[0].get();
                    if info.end != 0 {
                        info.failed_commit = info.end;
                        continue;
                    }
                    let matches = crc32_sum == found
                        && ch.h_chksum_type == JBD2_CRC32_CHKSUM
                        && ch.h_chksum_size == JBD2_CRC32_CHKSUM_SIZE;
                    let unused = ch.h_chksum_type == 0 && ch.h_chksum_size == 0 && found == 0;
                    if matches || unused {
                        crc32_sum = !0;
                    } else {
                        chksum_err = true;
                    }
                }
                // v1 failure jumps straight to the error handling, like
                // the kernel's `goto chksum_error`.
                let bad = pass == Pass::Scan && (chksum_err || !j.commit_ok(&buf));
                if pass == Pass::Scan {
                    rec.entries.push(LogEntry {
                        log_block: this_block,
                        tid: sequence,
                        kind: LogBlock::Commit {
                            sec: commit_time,
                            nsec: be32(&buf, 56),
                            checksum_ok: !bad,
                        },
                    });
                }
                if bad {
                    if commit_time < last_commit_time {
                        break 'log;
                    }
                    info.end = next_commit;
                    if !j.fmt.async_commit() {
                        info.failed_commit = next_commit;
                        continue;
                    }
                }
                if pass == Pass::Scan {
                    last_commit_time = commit_time;
                }
                next_commit = next_commit.wrapping_add(1);
                continue;
            }
            JBD2_REVOKE_BLOCK => {
                let csum_ok = j.tail_ok(&buf);
                if pass == Pass::Scan {
                    if !csum_ok {
                        need_check_commit_time = true;
                    }
                    rec.entries.push(LogEntry {
                        log_block: this_block,
                        tid: sequence,
                        kind: LogBlock::Revoke {
                            blocks: revoke_records(j, &buf).unwrap_or_default(),
                            checksum_ok: csum_ok,
                        },
                    });
                }
                if pass != Pass::Revoke {
                    continue;
                }
                let recs = revoke_records(j, &buf).ok_or_else(|| {
                    log_err(this_block, "revoke block count is larger than the block")
                })?;
                for b in recs {
                    rec.nr_revokes += 1;
                    revoked
                        .entry(b)
                        .and_modify(|t| {
                            if tid_gt(next_commit, *t) {
                                *t = next_commit;
                            }
                        })
                        .or_insert(next_commit);
                }
                continue;
            }
            _ => break 'log,
        }
    }

    if pass == Pass::Scan {
        if info.end == 0 {
            info.end = next_commit;
        }
    } else if info.end != next_commit && success.is_none() {
        success = Some(log_err(
            next_block,
            format!(
                "recovery pass ended at transaction {next_commit}, expected {}",
                info.end
            ),
        ));
    }
    if block_error && success.is_none() {
        success = Some(log_err(next_block, "I/O error"));
    }
    match success {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The block numbers of a revoke block, or `None` when `r_count` is larger
/// than the block allows (the kernel's -EINVAL).
fn revoke_records(j: &Journal, buf: &[u8]) -> Option<Vec<u64>> {
    let rcount = be32(buf, 12) as usize;
    if rcount > buf.len() - j.fmt.tail_bytes() {
        return None;
    }
    let rl = j.fmt.revoke_record_bytes();
    let mut off = size_of::<RevokeHeader>();
    let mut out = Vec::new();
    while off + rl <= rcount {
        let b = if rl == 4 {
            u64::from(be32(buf, off))
        } else {
            u64::from_be_bytes(buf[off..off + 8].try_into().unwrap_or([0; 8]))
        };
        out.push(b);
        off += rl;
    }
    Some(out)
}

/// What [`apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Home blocks written.
    pub blocks_written: u64,
    /// The filesystem was marked in error (journal `s_errno` or a failed
    /// commit), as e2fsck does.
    pub marked_error: bool,
}

/// The fast commits of `rec` replayed (`fast_commit::records`, then
/// `fc_replay::replay` on an overlay of the full replay, nothing written
/// in place) and made durable as one more full transaction of their tid
/// (`fast_commit::commit_as_full`); returns the recovery of the log as it
/// is then (the full commits and that transaction, no fast commits). What
/// the replay does not cover is refused with one line before anything is
/// written; a cut before the new commit block is durable leaves the log
/// as it was, so the next open computes the same replay again.
pub fn replay_fast_commits(
    dev: &dyn Device,
    j: &Journal,
    rec: &Recovery,
) -> Result<Recovery, RecoverError> {
    let blocks = fast_commit_result(dev, j, rec)?;
    super::fast_commit::commit_as_full(dev, j, rec, &blocks)?;
    let again = recover(dev, j)?;
    if again.fast_commit != FcLog::Empty {
        return Err(corrupt(
            "fast-commit replay",
            "the log still holds fast commits after their replay was committed",
        ));
    }
    Ok(again)
}

/// What replaying the fast commits of `rec` changes (home block -> final
/// bytes), computed without writing anything: empty when there are none.
pub fn fast_commit_result(
    dev: &dyn Device,
    j: &Journal,
    rec: &Recovery,
) -> Result<BTreeMap<u64, Vec<u8>>, RecoverError> {
    if let FcLog::Bad { .. } = rec.fast_commit
        && let Some(why) = rec.fast_commit.refusal()
    {
        return Err(RecoverError::Unsupported(why));
    }
    let tags = super::fast_commit::records(dev, j, &rec.fast_commit)?;
    if tags.is_empty() {
        return Ok(BTreeMap::new());
    }
    super::fc_replay::replay(dev, j, rec, &tags)
}

/// Write a recovery home, then release the journal as e2fsck does: flush,
/// journal superblock `s_start = 0`, `s_sequence = next`, `s_errno = 0`
/// (checksum when v2/v3), ext4 superblock without `needs_recovery` (and
/// with the error state when the journal recorded an error, `s_wtime` =
/// now), flush.
///
/// A valid fast-commit log is replayed first ([`replay_fast_commits`]):
/// its result becomes one more full transaction, and the log then
/// recovers like any other.
pub fn apply(dev: &dyn Device, j: &Journal, rec: &Recovery) -> Result<Applied, RecoverError> {
    if matches!(rec.fast_commit, FcLog::Valid { .. }) {
        let rec = replay_fast_commits(dev, j, rec)?;
        return apply(dev, j, &rec);
    }
    if let Some(why) = rec.fast_commit.refusal() {
        return Err(RecoverError::Unsupported(why));
    }
    let bs = u64::from(j.block_size);
    for (&b, data) in &rec.writes {
        dev.write_at(data, b * bs)?;
    }
    dev.flush()?;

    let jblk = j.jsb_block();
    let mut raw = read_block(dev, j.block_size, jblk)?;
    let mut jsb = JournalSuperblock::parse(&raw).ok_or_else(|| bad_jsb("short block"))?;
    let had_errno = jsb.s_errno.get() != 0 || rec.failed_commit.is_some();
    jsb.s_sequence.set(rec.next_sequence);
    jsb.s_start.set(0);
    jsb.s_errno.set(0);
    if j.fmt.csum_v2or3() {
        jsb.s_checksum.set(0);
        let c = jcsum::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
    }
    raw[..1024].copy_from_slice(jsb.as_bytes());
    dev.write_at(&raw[..1024], jblk * bs)?;

    // The superblock as replay left it (the log may hold its block).
    let mut sbraw = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut sbraw, SUPERBLOCK_OFFSET)?;
    let mut sb = Superblock::parse(&sbraw).ok_or_else(|| corrupt("superblock", "short read"))?;
    if sb.s_magic.get() != EXT4_MAGIC {
        return Err(RecoverError::NotExt4(sb.s_magic.get()));
    }
    let inc = sb.s_feature_incompat.get() & !Incompat::RECOVER.bits();
    sb.s_feature_incompat.set(inc);
    let mut state = sb.s_state.get() | (j.sb.s_state.get() & STATE_ERROR);
    if had_errno {
        state |= STATE_ERROR;
    }
    sb.s_state.set(state);
    let kb = sb.s_kbytes_written.get();
    if kb != 0 {
        let written = (rec.nr_replays.saturating_add(1)).saturating_mul(bs) >> 10;
        sb.s_kbytes_written.set(kb.saturating_add(written));
    }
    // e2fsck stamps the write time when it writes the superblock.
    if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        let t = now.as_secs();
        sb.s_wtime.set(t as u32);
        sb.s_wtime_hi = (t >> 32) as u8;
    }
    if RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM) {
        sb.update_checksum();
    }
    dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET)?;
    dev.flush()?;
    Ok(Applied {
        blocks_written: rec.writes.len() as u64,
        marked_error: state & STATE_ERROR != 0,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ext4kit::testing::MemImage;
    use ext4kit_device::MemDevice;
    use proptest::prelude::*;
    use std::sync::Arc;
    use zerocopy::FromZeros;

    /// A fresh 32 MiB ext4 (4 KiB blocks, 1024-block journal) in memory.
    pub(crate) fn image() -> MemDevice {
        MemImage::new(32 << 20, 4096, 16384).make().unwrap()
    }

    /// One transaction to put in the log.
    struct Txn {
        tid: u32,
        blocks: Vec<(u64, Vec<u8>)>,
        revokes: Vec<u64>,
        commit_time: u64,
        commit: bool,
    }

    /// Write `txns` into the log from log block `start` (csum v3, 64bit),
    /// set the jsb (s_start, s_sequence) and needs_recovery.
    fn write_log(dev: &MemDevice, start: u32, txns: &[Txn]) -> Journal {
        let j = Journal::open(dev).unwrap();
        let bs = j.block_size as usize;
        let fmt = LogFormat {
            compat: 0,
            incompat: JBD2_FEATURE_INCOMPAT_CSUM_V3
                | JBD2_FEATURE_INCOMPAT_64BIT
                | JBD2_FEATURE_INCOMPAT_REVOKE,
        };
        let seed = jcsum::seed(&j.jsb.s_uuid);
        let mut pos = u64::from(start);
        let put = |pos: &mut u64, block: &[u8]| {
            let p = j.phys(*pos).unwrap();
            dev.write_at(block, p * bs as u64).unwrap();
            *pos += 1;
            j.wrap(pos);
        };
        for t in txns {
            if !t.revokes.is_empty() {
                let mut b = vec![0u8; bs];
                b[..12].copy_from_slice(JournalHeader::new(JBD2_REVOKE_BLOCK, t.tid).as_bytes());
                let mut off = 16;
                for r in &t.revokes {
                    b[off..off + 8].copy_from_slice(&r.to_be_bytes());
                    off += 8;
                }
                b[12..16].copy_from_slice(&(off as u32).to_be_bytes());
                let c = jcsum::block_tail(seed, &b);
                b[bs - 4..].copy_from_slice(&c.to_be_bytes());
                put(&mut pos, &b);
            }
            if !t.blocks.is_empty() {
                let mut d = vec![0u8; bs];
                d[..12]
                    .copy_from_slice(JournalHeader::new(JBD2_DESCRIPTOR_BLOCK, t.tid).as_bytes());
                let mut off = 12;
                let mut copies = Vec::new();
                for (i, (home, data)) in t.blocks.iter().enumerate() {
                    let mut copy = data.clone();
                    let mut flags = if i == 0 { 0 } else { JBD2_FLAG_SAME_UUID };
                    if copy[..4] == JBD2_MAGIC.to_be_bytes() {
                        copy[..4].fill(0);
                        flags |= JBD2_FLAG_ESCAPE;
                    }
                    if i + 1 == t.blocks.len() {
                        flags |= JBD2_FLAG_LAST_TAG;
                    }
                    let tag = Tag {
                        blocknr: *home,
                        flags,
                        checksum: jcsum::tag(seed, t.tid, &copy),
                    };
                    tag.write(&mut d[off..], fmt);
                    off += 16;
                    if i == 0 {
                        d[off..off + 16].copy_from_slice(&j.jsb.s_uuid);
                        off += 16;
                    }
                    copies.push(copy);
                }
                let c = jcsum::block_tail(seed, &d);
                d[bs - 4..].copy_from_slice(&c.to_be_bytes());
                put(&mut pos, &d);
                for c in copies {
                    put(&mut pos, &c);
                }
            }
            if t.commit {
                let mut c = vec![0u8; bs];
                let mut h = CommitHeader::new_zeroed();
                h.h_header = JournalHeader::new(JBD2_COMMIT_BLOCK, t.tid);
                h.h_commit_sec.set(t.commit_time);
                c[..size_of::<CommitHeader>()].copy_from_slice(h.as_bytes());
                let s = jcsum::commit(seed, &c);
                c[16..20].copy_from_slice(&s.to_be_bytes());
                put(&mut pos, &c);
            }
        }
        let mut jsb = j.jsb.clone();
        let keep = j.jsb.s_feature_incompat.get() & JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
        jsb.s_feature_incompat.set(fmt.incompat | keep);
        jsb.s_checksum_type = JBD2_CRC32C_CHKSUM;
        jsb.s_start.set(start);
        jsb.s_sequence.set(txns.first().map_or(1, |t| t.tid));
        jsb.s_checksum.set(0);
        let c = jcsum::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
        dev.write_at(jsb.as_bytes(), j.phys(0).unwrap() * bs as u64)
            .unwrap();
        let mut sb = j.sb.clone();
        sb.s_feature_incompat
            .set(sb.s_feature_incompat.get() | Incompat::RECOVER.bits());
        sb.update_checksum();
        dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET).unwrap();
        Journal::open(dev).unwrap()
    }

    fn block(fill: u8) -> Vec<u8> {
        vec![fill; 4096]
    }

    fn txn(tid: u32, blocks: &[(u64, u8)], time: u64) -> Txn {
        Txn {
            tid,
            blocks: blocks.iter().map(|&(b, f)| (b, block(f))).collect(),
            revokes: vec![],
            commit_time: time,
            commit: true,
        }
    }

    #[test]
    fn runs_lookup_and_coverage() {
        let runs = [
            Run {
                lblk: 0,
                pblk: 100,
                len: 4,
            },
            Run {
                lblk: 4,
                pblk: 200,
                len: 2,
            },
        ];
        assert_eq!(lookup(&runs, 0), Some(100));
        assert_eq!(lookup(&runs, 3), Some(103));
        assert_eq!(lookup(&runs, 5), Some(201));
        assert_eq!(lookup(&runs, 6), None);
        assert!(check_coverage(&runs, 6).is_ok());
        assert!(check_coverage(&runs, 7).is_err());
        assert!(check_coverage(&runs[1..], 6).is_err());
    }

    #[test]
    fn log_wraps_at_maxlen_and_escapes_are_restored() {
        let dev = image();
        let j0 = Journal::open(&dev).unwrap();
        let maxlen = j0.jsb.s_maxlen.get();
        let mut magic = block(0x11);
        magic[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let mut t = txn(7, &[(3000, 1), (3001, 2), (3002, 3), (3003, 4)], 100);
        t.blocks[1].1 = magic.clone();
        let j = write_log(&dev, maxlen - 3, &[t, txn(8, &[(3000, 9)], 101)]);
        let rec = recover(&dev, &j).unwrap();
        assert_eq!((rec.start_tid, rec.end_tid, rec.next_sequence), (7, 9, 10));
        assert_eq!(rec.writes.len(), 4);
        assert_eq!(rec.writes[&3000], block(9), "the newer transaction wins");
        assert_eq!(rec.writes[&3001], magic);
        assert_eq!(rec.writes[&3003], block(4));
        // The second transaction sits after the wrap.
        assert!(rec.entries.iter().any(|e| e.tid == 8 && e.log_block < 10));
        let done = apply(&dev, &j, &rec).unwrap();
        assert_eq!(done.blocks_written, 4);
        let after = Journal::open(&dev).unwrap();
        assert_eq!(after.jsb.s_start.get(), 0);
        assert_eq!(after.jsb.s_sequence.get(), 10);
        assert_eq!(
            after.sb.s_feature_incompat.get() & Incompat::RECOVER.bits(),
            0
        );
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, 3001 * 4096).unwrap();
        assert_eq!(b, magic);
    }

    #[test]
    fn revokes_hide_older_copies_only() {
        let dev = image();
        let mut t2 = txn(2, &[(3001, 5)], 11);
        t2.revokes = vec![3000, 3001];
        let j = write_log(
            &dev,
            1,
            &[
                txn(1, &[(3000, 1), (3001, 1)], 10),
                t2,
                txn(3, &[(3000, 7)], 12),
            ],
        );
        let rec = recover(&dev, &j).unwrap();
        // 3001 logged in tid 2 is hidden by its own tid's revoke (the
        // kernel never writes that); 3000 comes back in tid 3.
        assert_eq!(rec.writes.keys().copied().collect::<Vec<_>>(), vec![3000]);
        assert_eq!(rec.writes[&3000], block(7));
        assert_eq!((rec.nr_revokes, rec.nr_revoke_hits), (2, 3));
    }

    #[test]
    fn stale_descriptor_rule() {
        for (later_time, ok) in [(5, true), (50, false)] {
            let dev = image();
            let j = write_log(
                &dev,
                1,
                &[txn(1, &[(3000, 1)], 10), txn(2, &[(3001, 2)], later_time)],
            );
            // Break the second descriptor's tail (log block 4).
            let p = j.phys(4).unwrap() * 4096 + 4095;
            dev.write_at(&[0x5A], p).unwrap();
            let res = recover(&dev, &j);
            if ok {
                let rec = res.unwrap();
                assert_eq!(rec.end_tid, 2, "a stale block ends the log");
                assert_eq!(rec.writes.keys().copied().collect::<Vec<_>>(), vec![3000]);
            } else {
                assert!(matches!(res, Err(RecoverError::Log { .. })), "{res:?}");
            }
        }
    }

    #[test]
    fn bad_commit_checksum_ends_the_log_and_marks_the_error() {
        let dev = image();
        let j = write_log(
            &dev,
            1,
            &[txn(1, &[(3000, 1)], 10), txn(2, &[(3001, 2)], 11)],
        );
        // Log: desc 1, data 2, commit 3 (tid 1), desc 4, data 5, commit 6.
        dev.write_at(&[0x5A], j.phys(6).unwrap() * 4096 + 100)
            .unwrap();
        let rec = recover(&dev, &j).unwrap();
        assert_eq!(rec.failed_commit, Some(2));
        assert_eq!(rec.writes.keys().copied().collect::<Vec<_>>(), vec![3000]);
        assert!(apply(&dev, &j, &rec).unwrap().marked_error);
    }

    #[test]
    fn bad_tag_checksum_fails_the_recovery() {
        let dev = image();
        let j = write_log(&dev, 1, &[txn(1, &[(3000, 1), (3001, 1)], 10)]);
        dev.write_at(&[0x5A], j.phys(3).unwrap() * 4096 + 7)
            .unwrap();
        assert!(matches!(recover(&dev, &j), Err(RecoverError::Log { .. })));
    }

    #[test]
    fn tags_outside_the_filesystem_or_into_the_journal_are_refused() {
        let dev = image();
        let j0 = Journal::open(&dev).unwrap();
        let inside = j0.phys(10).unwrap();
        for home in [j0.fs_blocks, inside] {
            let dev = image();
            let j = write_log(&dev, 1, &[txn(1, &[(home, 1)], 10)]);
            assert!(matches!(recover(&dev, &j), Err(RecoverError::Log { .. })));
        }
    }

    /// A 32 MiB fast_commit image (1024 + 16 journal blocks) whose
    /// journal superblock has the fast-commit feature, as the kernel
    /// leaves it.
    pub(crate) fn fc_image() -> MemDevice {
        let mut m = MemImage::new(32 << 20, 4096, 16384);
        m.features = vec!["fast_commit".into()];
        let dev = m.make().unwrap();
        let j = Journal::open(&dev).unwrap();
        let mut jsb = j.jsb.clone();
        jsb.s_feature_incompat
            .set(jsb.s_feature_incompat.get() | JBD2_FEATURE_INCOMPAT_FAST_COMMIT);
        jsb.s_checksum.set(0);
        let c = jcsum::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
        dev.write_at(jsb.as_bytes(), j.phys(0).unwrap() * 4096)
            .unwrap();
        dev
    }

    /// Fast-commit blocks: `tags` as tlv records from the area's first
    /// block on (the rest of the area zeroed); a TAIL with a `None`
    /// value gets `tail_tid` and the crc of the records since the last
    /// TAIL, other values are written as given.
    fn write_fc(dev: &MemDevice, j: &Journal, tail_tid: u32, tags: &[(u16, Option<Vec<u8>>)]) {
        let area = j.fc_area().unwrap();
        let mut blk = vec![0u8; 4096];
        let mut at = 0usize;
        let mut lblk = area.start;
        let mut crc = 0u32;
        for l in area.clone() {
            dev.write_at(&blk, j.phys(u64::from(l)).unwrap() * 4096)
                .unwrap();
        }
        for (tag, given) in tags {
            let val = given.clone().unwrap_or_else(|| vec![0; 8]);
            if at + 4 + val.len() > 4095 - 4 {
                // The rest of the block is a PAD, as the kernel's
                // ext4_fc_reserve_space writes it.
                let pad = 4095 - (at + 4);
                blk[at..at + 2].copy_from_slice(&fast_commit::EXT4_FC_TAG_PAD.to_le_bytes());
                blk[at + 2..at + 4].copy_from_slice(&(pad as u16).to_le_bytes());
                crc = ext4kit_format::checksum::crc32c_raw(crc, &blk[at..at + 4 + pad]);
                dev.write_at(&blk, j.phys(u64::from(lblk)).unwrap() * 4096)
                    .unwrap();
                blk.fill(0);
                at = 0;
                lblk += 1;
            }
            blk[at..at + 2].copy_from_slice(&tag.to_le_bytes());
            blk[at + 2..at + 4].copy_from_slice(&(val.len() as u16).to_le_bytes());
            blk[at + 4..at + 4 + val.len()].copy_from_slice(&val);
            if *tag == fast_commit::EXT4_FC_TAG_TAIL && given.is_none() {
                blk[at + 4..at + 8].copy_from_slice(&tail_tid.to_le_bytes());
                crc = ext4kit_format::checksum::crc32c_raw(crc, &blk[at..at + 8]);
                blk[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
                crc = 0;
            } else {
                crc = ext4kit_format::checksum::crc32c_raw(crc, &blk[at..at + 4 + val.len()]);
            }
            at += 4 + val.len();
        }
        dev.write_at(&blk, j.phys(u64::from(lblk)).unwrap() * 4096)
            .unwrap();
    }

    fn head(tid: u32) -> (u16, Option<Vec<u8>>) {
        let mut v = vec![0u8; 8];
        v[4..].copy_from_slice(&tid.to_le_bytes());
        (fast_commit::EXT4_FC_TAG_HEAD, Some(v))
    }

    fn tail() -> (u16, Option<Vec<u8>>) {
        (fast_commit::EXT4_FC_TAG_TAIL, None)
    }

    fn add_range() -> (u16, Option<Vec<u8>>) {
        (fast_commit::EXT4_FC_TAG_ADD_RANGE, Some(vec![7; 16]))
    }

    #[test]
    fn fast_commit_journals_keep_the_full_log_before_the_fc_area() {
        let dev = fc_image();
        let j = Journal::open(&dev).unwrap();
        assert_eq!(j.jsb.s_num_fc_blks.get(), 16);
        assert_eq!(j.maxlen(), 1040);
        assert_eq!(j.last(), 1024);
        assert_eq!(j.fc_area(), Some(1025..1040));
        // A log that wraps at j_last, not at s_maxlen (the kernel since
        // "jbd2: correct the end of the journal recovery scan range").
        let t = txn(7, &[(3000, 1), (3001, 2), (3002, 3), (3003, 4)], 100);
        let j = write_log(&dev, j.last() - 3, &[t, txn(8, &[(3000, 9)], 101)]);
        let rec = recover(&dev, &j).unwrap();
        assert_eq!((rec.end_tid, rec.writes.len()), (9, 4));
        assert_eq!(rec.writes[&3000], block(9));
        assert_eq!(rec.fast_commit, FcLog::Empty, "a zeroed area is empty");
        apply(&dev, &j, &rec).unwrap();
        // An fc area too big for the journal is refused as e2fsck does.
        let dev = fc_image();
        let j = Journal::open(&dev).unwrap();
        let mut jsb = j.jsb.clone();
        jsb.s_num_fc_blks.set(100);
        jsb.s_checksum.set(0);
        let c = jcsum::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
        dev.write_at(jsb.as_bytes(), j.phys(0).unwrap() * 4096)
            .unwrap();
        let e = Journal::open(&dev).unwrap_err().to_string();
        assert!(e.contains("incorrect fast commit blocks"), "{e}");
    }

    #[test]
    fn valid_fast_commits_are_found_and_never_half_replayed() {
        let dev = fc_image();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        // Fast commits of tid 6 (the first one not fully committed), two
        // of them, the second one spilling into the next block.
        let mut tags = vec![head(6), add_range(), tail()];
        for _ in 0..300 {
            tags.push(add_range());
        }
        tags.push(tail());
        write_fc(&dev, &j0, 6, &tags);
        let before = dev.to_bytes();
        let rec = recover(&dev, &j).unwrap();
        assert_eq!(rec.writes.len(), 1, "the full log still reads");
        match &rec.fast_commit {
            FcLog::Valid {
                tid,
                tags,
                blocks,
                per_tag,
            } => {
                assert_eq!((*tid, *tags, *blocks), (6, 305, 2), "with the PAD");
                assert_eq!(
                    per_tag[usize::from(fast_commit::EXT4_FC_TAG_ADD_RANGE)],
                    301
                );
            }
            other => panic!("{other:?}"),
        }
        // Its ADD_RANGEs name an inode outside the filesystem: the replay
        // refuses the image, before writing anything.
        let e = apply(&dev, &j, &rec).unwrap_err().to_string();
        assert!(e.contains("fast commits that ext4kit cannot replay"), "{e}");
        assert!(e.contains("names inode 117901063"), "{e}");
        assert_eq!(e.lines().count(), 1);
        assert!(dev.to_bytes() == before, "a refusal writes nothing");

        // A broken second fast commit: the first one is still valid.
        let mut tags = vec![head(6), add_range(), tail(), add_range()];
        tags.push((
            fast_commit::EXT4_FC_TAG_TAIL,
            Some(vec![6, 0, 0, 0, 1, 2, 3, 4]),
        ));
        write_fc(&dev, &j0, 6, &tags);
        let rec = recover(&dev, &j).unwrap();
        assert!(
            matches!(rec.fast_commit, FcLog::Valid { tags: 3, .. }),
            "{:?}",
            rec.fast_commit
        );
    }

    /// An INODE record's value: inode `ino`, 160 bytes (128 + an
    /// `i_extra_isize` of 32) with `mode`, `size`, `links`, EXTENTS_FL.
    fn fc_inode(ino: u32, mode: u16, size: u32, links: u16) -> (u16, Option<Vec<u8>>) {
        let mut v = ino.to_le_bytes().to_vec();
        let mut raw = vec![0u8; 160];
        raw[0..2].copy_from_slice(&mode.to_le_bytes());
        raw[4..8].copy_from_slice(&size.to_le_bytes());
        raw[26..28].copy_from_slice(&links.to_le_bytes());
        raw[32..36].copy_from_slice(&EXT4_EXTENTS_FL.to_le_bytes());
        raw[128..130].copy_from_slice(&32u16.to_le_bytes());
        v.extend(raw);
        (fast_commit::EXT4_FC_TAG_INODE, Some(v))
    }

    fn fc_range(ino: u32, lblk: u32, len: u16, pblk: u32) -> (u16, Option<Vec<u8>>) {
        let mut v = ino.to_le_bytes().to_vec();
        v.extend(lblk.to_le_bytes());
        v.extend(len.to_le_bytes());
        v.extend(0u16.to_le_bytes());
        v.extend(pblk.to_le_bytes());
        (fast_commit::EXT4_FC_TAG_ADD_RANGE, Some(v))
    }

    fn fc_dentry(tag: u16, parent: u32, ino: u32, name: &[u8]) -> (u16, Option<Vec<u8>>) {
        let mut v = parent.to_le_bytes().to_vec();
        v.extend(ino.to_le_bytes());
        v.extend(name);
        (tag, Some(v))
    }

    /// A hand-made log of the kernel's shape (a new file: INODE,
    /// ADD_RANGE, CREAT, INODE; then a hard link) is replayed by `apply`:
    /// the file reads back with its name, size, links and bytes, the
    /// journal ends clean with no fast commits left; an INODE record of a
    /// directory is refused with one line and nothing written.
    #[test]
    fn fast_commits_of_files_are_replayed_and_other_kinds_refused() {
        use crate::sb::Volume;
        let dev = fc_image();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut blocks = data.clone();
        blocks.resize(8192, 0);
        dev.write_at(&blocks, 4000 * 4096).unwrap();
        write_fc(
            &dev,
            &j0,
            6,
            &[
                head(6),
                fc_inode(12, 0o100644, 5000, 1),
                fc_range(12, 0, 2, 4000),
                fc_dentry(fast_commit::EXT4_FC_TAG_CREAT, 2, 12, b"new"),
                fc_inode(12, 0o100644, 5000, 1),
                tail(),
                fc_dentry(fast_commit::EXT4_FC_TAG_LINK, 2, 12, b"hard"),
                fc_inode(12, 0o100644, 5000, 2),
                tail(),
            ],
        );
        let rec = recover(&dev, &j).unwrap();
        assert!(matches!(rec.fast_commit, FcLog::Valid { tags: 9, .. }));
        apply(&dev, &j, &rec).unwrap();
        let j = Journal::open(&dev).unwrap();
        assert_eq!(j.jsb.s_start.get(), 0, "the journal is clean");
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        for name in [&b"/new"[..], b"/hard"] {
            let ino = fs.resolve(name, false).unwrap();
            assert_eq!((ino.ino, ino.size, ino.links), (12, 5000, 2));
            assert_eq!(ino.blocks_512, 16, "two blocks, recounted");
            assert!(fs.read_all(&ino, 1 << 20).unwrap() == data);
        }
        // A second replay finds nothing more.
        let rec = recover(&dev, &j).unwrap();
        assert!(!rec.dirty && rec.fast_commit == FcLog::Empty);

        // lost+found is a directory: its INODE record is refused.
        let dev = fc_image();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        write_fc(
            &dev,
            &j0,
            6,
            &[head(6), fc_inode(11, 0o040700, 16384, 2), tail()],
        );
        let before = dev.to_bytes();
        let rec = recover(&dev, &j).unwrap();
        let e = apply(&dev, &j, &rec).unwrap_err().to_string();
        assert!(e.contains("cannot replay: inode 11 is a directory"), "{e}");
        assert_eq!(e.lines().count(), 1);
        assert!(dev.to_bytes() == before, "a refusal writes nothing");

        // With quota the usage would go stale: refused.
        let mut m = MemImage::new(32 << 20, 4096, 16384);
        m.features = vec!["fast_commit".into(), "quota".into()];
        let dev = m.make().unwrap();
        let j0 = Journal::open(&dev).unwrap();
        let mut jsb = j0.jsb.clone();
        jsb.s_feature_incompat
            .set(jsb.s_feature_incompat.get() | JBD2_FEATURE_INCOMPAT_FAST_COMMIT);
        jsb.s_checksum.set(0);
        let c = jcsum::superblock(jsb.as_bytes());
        jsb.s_checksum.set(c);
        dev.write_at(jsb.as_bytes(), j0.phys(0).unwrap() * 4096)
            .unwrap();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        write_fc(
            &dev,
            &j0,
            6,
            &[head(6), fc_inode(12, 0o100644, 0, 1), tail()],
        );
        let before = dev.to_bytes();
        let rec = recover(&dev, &j).unwrap();
        assert!(
            matches!(rec.fast_commit, FcLog::Valid { .. }),
            "{:?}",
            rec.fast_commit
        );
        let e = apply(&dev, &j, &rec).unwrap_err().to_string();
        assert!(e.contains("cannot replay: quota"), "{e}");
        assert!(dev.to_bytes() == before, "a refusal writes nothing");
    }

    /// Every tag decodes into its `ext4_fc_*` fields, in log order, up
    /// to the last valid TAIL (the PAD written at a block's end too).
    #[test]
    fn fast_commit_records_decode_every_tag() {
        use fast_commit::FcTag;
        let dev = fc_image();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        let mut add = Vec::new();
        add.extend_from_slice(&12u32.to_le_bytes()); // ino
        add.extend_from_slice(&3u32.to_le_bytes()); // ee_block
        add.extend_from_slice(&(32768u16 + 5).to_le_bytes()); // unwritten, 5
        add.extend_from_slice(&1u16.to_le_bytes()); // ee_start_hi
        add.extend_from_slice(&7000u32.to_le_bytes()); // ee_start_lo
        let mut del = Vec::new();
        for v in [12u32, 9, 4] {
            del.extend_from_slice(&v.to_le_bytes());
        }
        let dentry = |parent: u32, ino: u32, name: &[u8]| {
            let mut v = parent.to_le_bytes().to_vec();
            v.extend_from_slice(&ino.to_le_bytes());
            v.extend_from_slice(name);
            v
        };
        let mut inode = 12u32.to_le_bytes().to_vec();
        inode.extend((0..256u32).map(|i| i as u8));
        let mut tags = vec![
            head(6),
            (fast_commit::EXT4_FC_TAG_CREAT, Some(dentry(2, 12, b"a"))),
            (fast_commit::EXT4_FC_TAG_INODE, Some(inode.clone())),
            (fast_commit::EXT4_FC_TAG_ADD_RANGE, Some(add)),
            tail(),
            (fast_commit::EXT4_FC_TAG_LINK, Some(dentry(2, 12, b"bb"))),
            (fast_commit::EXT4_FC_TAG_UNLINK, Some(dentry(2, 12, b"a"))),
        ];
        // Enough DEL_RANGEs that the second fast commit spills over a
        // block (a PAD ends its first block).
        for _ in 0..300 {
            tags.push((fast_commit::EXT4_FC_TAG_DEL_RANGE, Some(del.clone())));
        }
        tags.push(tail());
        // A third fast commit without its TAIL is not part of the log.
        tags.push((fast_commit::EXT4_FC_TAG_LINK, Some(dentry(2, 12, b"c"))));
        write_fc(&dev, &j0, 6, &tags);
        let rec = recover(&dev, &j).unwrap();
        let recs = fast_commit::records(&dev, &j, &rec.fast_commit).unwrap();
        assert!(matches!(rec.fast_commit, FcLog::Valid { tags: 309, .. }));
        assert_eq!(recs.len(), 309);
        assert_eq!(
            recs[0],
            FcTag::Head {
                features: 0,
                tid: 6
            }
        );
        assert_eq!(
            recs[1],
            FcTag::Dentry {
                tag: fast_commit::EXT4_FC_TAG_CREAT,
                parent: 2,
                ino: 12,
                name: b"a".to_vec()
            }
        );
        assert_eq!(
            recs[2],
            FcTag::Inode {
                ino: 12,
                raw: inode[4..].to_vec()
            }
        );
        assert_eq!(
            recs[3],
            FcTag::AddRange {
                ino: 12,
                lblk: 3,
                len: 5,
                unwritten: true,
                pblk: (1 << 32) | 7000
            }
        );
        assert!(matches!(recs[4], FcTag::Tail { tid: 6, .. }));
        assert!(matches!(
            &recs[6],
            FcTag::Dentry { tag: fast_commit::EXT4_FC_TAG_UNLINK, name, .. } if name == b"a"
        ));
        assert_eq!(
            recs[7],
            FcTag::DelRange {
                ino: 12,
                lblk: 9,
                len: 4
            }
        );
        assert!(recs.contains(&FcTag::Pad));
        assert!(matches!(recs[308], FcTag::Tail { tid: 6, .. }));
        // Nothing to decode in an empty or damaged log.
        assert!(
            fast_commit::records(&dev, &j, &FcLog::Empty)
                .unwrap()
                .is_empty()
        );
        // The area changed under a scan's result: an error, no panic.
        write_fc(&dev, &j0, 6, &[head(6), tail()]);
        let e = fast_commit::records(&dev, &j, &rec.fast_commit).unwrap_err();
        assert!(e.to_string().contains("no longer reads"), "{e}");
    }

    /// The replayed state of fast commits, committed as one full
    /// transaction of their tid: a power cut at every write leaves either
    /// the log as it was (fast commits still valid) or the log with the
    /// new transaction (no fast commits left), and the next recovery
    /// writes the replayed blocks either way.
    #[test]
    fn fast_commit_results_commit_as_one_full_transaction_at_every_cut() {
        use ext4kit_device::FaultDevice;
        let base = fc_image();
        let j0 = Journal::open(&base).unwrap();
        let j = write_log(
            &base,
            1,
            &[
                txn(5, &[(3000, 1), (3001, 2)], 10),
                txn(6, &[(3001, 3)], 11),
            ],
        );
        write_fc(&base, &j0, 7, &[head(7), add_range(), tail()]);
        let rec = recover(&base, &j).unwrap();
        assert!(matches!(rec.fast_commit, FcLog::Valid { tid: 7, .. }));
        let mut result = BTreeMap::new();
        result.insert(3001u64, block(8));
        result.insert(3002u64, block(9));
        let mut cut = 1u64;
        loop {
            let mem = Arc::new(MemDevice::from_bytes(base.to_bytes()));
            let fault = FaultDevice::new(mem.clone());
            let ctl = fault.control();
            ctl.power_cut_after(cut);
            let done = fast_commit::commit_as_full(&fault, &j, &rec, &result);
            let cut_hit = ctl.is_power_lost();
            drop(fault);
            let j2 = Journal::open(&*mem).unwrap();
            let r2 = recover(&*mem, &j2).unwrap();
            if r2.end_tid == 7 {
                assert!(cut_hit, "cut {cut}: {done:?}");
                assert_eq!(r2.fast_commit, rec.fast_commit, "cut {cut}");
                assert_eq!(r2.writes, rec.writes, "cut {cut}");
            } else {
                assert_eq!(r2.end_tid, 8, "cut {cut}");
                assert_eq!(r2.fast_commit, FcLog::Empty, "cut {cut}");
                assert_eq!(r2.writes[&3000], block(1));
                assert_eq!(r2.writes[&3001], block(8));
                assert_eq!(r2.writes[&3002], block(9));
                apply(&*mem, &j2, &r2).unwrap();
                let j3 = Journal::open(&*mem).unwrap();
                assert_eq!(j3.jsb.s_start.get(), 0);
                assert_eq!(j3.jsb.s_sequence.get(), 9);
                let mut b = vec![0u8; 4096];
                mem.read_at(&mut b, 3002 * 4096).unwrap();
                assert_eq!(b, block(9));
            }
            if !cut_hit {
                assert_eq!(done.unwrap(), 4, "descriptor, 2 copies, commit");
                break;
            }
            cut += 1;
        }
        assert!(cut > 2, "cut at {cut} writes");
        // A home block the filesystem does not have: refused, nothing
        // written.
        let mem = MemDevice::from_bytes(base.to_bytes());
        let mut bad = BTreeMap::new();
        bad.insert(j.fs_blocks, block(1));
        let e = fast_commit::commit_as_full(&mem, &j, &rec, &bad).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
        assert!(mem.to_bytes() == base.to_bytes());
    }

    #[test]
    fn stale_and_damaged_fast_commit_areas() {
        let dev = fc_image();
        let j0 = Journal::open(&dev).unwrap();
        let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
        // Fast commits of an older transaction (5 committed fully after
        // them): the kernel ignores them, so does the replay.
        write_fc(&dev, &j0, 5, &[head(5), add_range(), tail()]);
        let rec = recover(&dev, &j).unwrap();
        assert_eq!(rec.fast_commit, FcLog::Empty);
        // No HEAD in the first block: nothing.
        write_fc(&dev, &j0, 6, &[add_range(), tail()]);
        assert_eq!(recover(&dev, &j).unwrap().fast_commit, FcLog::Empty);
        // The only fast commit's tail fails its checksum: the kernel's
        // scan fails (-EFSBADCRC), we refuse to write.
        let mut tags = vec![head(6), add_range()];
        tags.push((
            fast_commit::EXT4_FC_TAG_TAIL,
            Some(vec![6, 0, 0, 0, 1, 2, 3, 4]),
        ));
        write_fc(&dev, &j0, 6, &tags);
        let rec = recover(&dev, &j).unwrap();
        assert!(
            matches!(rec.fast_commit, FcLog::Bad { .. }),
            "{:?}",
            rec.fast_commit
        );
        let e = apply(&dev, &j, &rec).unwrap_err().to_string();
        assert!(e.contains("damaged") && e.contains("checksum"), "{e}");
        // Unknown head features (-EOPNOTSUPP), a tag of a wrong length.
        let mut h = head(6);
        if let Some(v) = h.1.as_mut() {
            v[0] = 1;
        }
        write_fc(&dev, &j0, 6, &[h, tail()]);
        assert!(matches!(
            recover(&dev, &j).unwrap().fast_commit,
            FcLog::Bad { .. }
        ));
        write_fc(
            &dev,
            &j0,
            6,
            &[
                head(6),
                (fast_commit::EXT4_FC_TAG_ADD_RANGE, Some(vec![0; 15])),
                tail(),
            ],
        );
        assert!(matches!(
            recover(&dev, &j).unwrap().fast_commit,
            FcLog::Bad { .. }
        ));
    }

    #[test]
    fn external_journals_are_refused() {
        let dev = image();
        let j = write_log(&dev, 1, &[txn(1, &[(3000, 1)], 10)]);
        let mut sb = j.sb.clone();
        sb.s_journal_dev.set(0x0801);
        sb.update_checksum();
        dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET).unwrap();
        let e = Journal::open(&dev).unwrap_err().to_string();
        assert!(e.contains("both a journal inode"), "{e}");
        // Only the device: the option is named, with the UUID.
        sb.s_journal_inum.set(0);
        sb.s_journal_uuid = [0xAB; 16];
        sb.update_checksum();
        dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET).unwrap();
        let e = Journal::open(&dev).unwrap_err().to_string();
        assert!(
            e.contains("journal_path=") && e.contains("abababab-abab-abab-abab-abababababab"),
            "{e}"
        );
        // A device that is not a journal device.
        let other = Arc::new(MemDevice::new(4 << 20));
        let joined = ext4kit_device::WithJournal::new(Arc::new(dev.snapshot()), other);
        let e = Journal::open(&joined).unwrap_err().to_string();
        assert!(e.contains("not an external journal device"), "{e}");
    }

    /// A filesystem whose journal is on another device (UUID `[0x11;
    /// 16]`) and that device (4 MiB of 4 KiB blocks, the jbd2 superblock
    /// at block 1, `s_first` 2, this filesystem its one user); `edit`
    /// changes the device's ext4 and jbd2 superblocks before they are
    /// written.
    fn external_pair(
        edit: impl FnOnce(&mut Superblock, &mut JournalSuperblock),
    ) -> (Arc<MemDevice>, Arc<MemDevice>) {
        let fs = image();
        let mut sb = read_superblock(&fs).unwrap();
        sb.s_journal_inum.set(0);
        sb.s_journal_uuid = [0x11; 16];
        sb.update_checksum();
        fs.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET).unwrap();
        let jdev = MemDevice::new(4 << 20);
        let mut jsb_ext4 = Superblock::new_zeroed();
        jsb_ext4.s_magic.set(EXT4_MAGIC);
        jsb_ext4
            .s_feature_incompat
            .set(Incompat::JOURNAL_DEV.bits());
        jsb_ext4.s_uuid = [0x11; 16];
        jsb_ext4.s_log_block_size.set(2);
        jsb_ext4.s_blocks_count_lo.set(1024);
        let mut jsb = JournalSuperblock::new(4096, 1024, [0x11; 16]);
        jsb.s_first.set(2);
        jsb.s_users[..16].copy_from_slice(&sb.s_uuid);
        edit(&mut jsb_ext4, &mut jsb);
        jdev.write_at(jsb_ext4.as_bytes(), SUPERBLOCK_OFFSET)
            .unwrap();
        jdev.write_at(jsb.as_bytes(), 4096).unwrap();
        (Arc::new(fs), Arc::new(jdev))
    }

    #[test]
    fn an_external_journal_device_is_checked_as_the_kernel_checks_it() {
        let (fs, jdev) = external_pair(|_, _| {});
        let joined = ext4kit_device::WithJournal::new(fs.clone(), jdev.clone());
        let j = Journal::open(&joined).unwrap();
        let base = joined.journal_base().unwrap() / 4096;
        assert!(j.is_external());
        assert_eq!((j.jsb_block(), j.first(), j.maxlen()), (base + 1, 2, 1024));
        assert_eq!(j.phys(2), Some(base + 2));
        let refused = |edit: fn(&mut Superblock, &mut JournalSuperblock), want: &str| {
            let (fs, jdev) = external_pair(edit);
            let joined = ext4kit_device::WithJournal::new(fs, jdev);
            let e = Journal::open(&joined).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{want}: {e}");
        };
        refused(
            |s, _| s.s_feature_incompat.set(0),
            "not an external journal device",
        );
        refused(
            |s, _| s.s_uuid = [0x22; 16],
            "is not the filesystem's journal UUID",
        );
        refused(|s, _| s.s_log_block_size.set(0), "block size 1024 differs");
        refused(|_, j| j.s_users[0] ^= 1, "is not among its users");
        refused(|_, j| j.s_nr_users.set(0), "is not among its users");
        refused(|_, j| j.s_nr_users.set(2), "shared by several filesystems");
        refused(|_, j| j.s_first.set(1), "s_first 1 is not after");
        refused(|_, j| j.h_magic.set(0), "magic");
    }

    #[test]
    fn the_engine_commits_to_an_external_journal_device() {
        let (fs, jdev) = external_pair(|_, _| {});
        let ext4_sb = {
            let mut b = vec![0u8; 1024];
            jdev.read_at(&mut b, SUPERBLOCK_OFFSET).unwrap();
            b
        };
        let joined: Arc<dyn Device> =
            Arc::new(ext4kit_device::WithJournal::new(fs.clone(), jdev.clone()));
        let rw =
            crate::fs::Filesystem::open(joined.clone(), crate::rw::RwOptions::default()).unwrap();
        let spec = crate::fs::NewInode::new(inode::S_IFDIR | 0o755, 0, 0);
        rw.mkdir(2, b"d", &spec).unwrap();
        rw.sync().unwrap();
        // Committed, not checkpointed: the log on the journal device
        // holds it and the filesystem says needs_recovery.
        let j = Journal::open(&*joined).unwrap();
        assert_ne!(j.jsb.s_start.get(), 0);
        assert!(Incompat(j.sb.s_feature_incompat.get()).contains(Incompat::RECOVER));
        assert!(recover(&*joined, &j).unwrap().transactions() >= 1);
        rw.close().unwrap();
        let j = Journal::open(&*joined).unwrap();
        assert_eq!(j.jsb.s_start.get(), 0);
        assert!(j.jsb.s_sequence.get() > 1);
        assert!(!Incompat(j.sb.s_feature_incompat.get()).contains(Incompat::RECOVER));
        // The device's own ext4 superblock is never written.
        let mut b = vec![0u8; 1024];
        jdev.read_at(&mut b, SUPERBLOCK_OFFSET).unwrap();
        assert_eq!(b, ext4_sb);
        // And the filesystem reads back without the journal device.
        let vol = crate::sb::Volume::open(&*fs).unwrap();
        assert!(vol.fs().resolve(b"/d", true).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Random bytes in a valid fast-commit log: the scan classifies
        /// it, the decoder reads what the scan accepted or gives an
        /// error, the replay replays or refuses, never a panic; a
        /// refusal stays one line.
        #[test]
        fn fast_commit_corruption_never_panics(muts in proptest::collection::vec((any::<u16>(), any::<u8>(), any::<bool>()), 1..12)) {
            let dev = fc_image();
            let j0 = Journal::open(&dev).unwrap();
            let j = write_log(&dev, 1, &[txn(5, &[(3000, 1)], 10)]);
            let mut inode = 12u32.to_le_bytes().to_vec();
            inode.extend([0u8; 256]);
            let mut dentry = 2u32.to_le_bytes().to_vec();
            dentry.extend(12u32.to_le_bytes());
            dentry.extend(b"name");
            write_fc(&dev, &j0, 6, &[
                head(6),
                (fast_commit::EXT4_FC_TAG_INODE, Some(inode)),
                (fast_commit::EXT4_FC_TAG_CREAT, Some(dentry)),
                add_range(),
                tail(),
                add_range(),
                tail(),
            ]);
            let area = j0.fc_area().unwrap();
            for (off, v, second) in muts {
                let l = u64::from(area.start) + u64::from(second);
                let at = j0.phys(l).unwrap() * 4096 + u64::from(off % 4096);
                dev.write_at(&[v], at).unwrap();
            }
            if let Ok(rec) = recover(&dev, &j) {
                let _ = fast_commit::records(&dev, &j, &rec.fast_commit);
                if let Some(why) = rec.fast_commit.refusal() {
                    prop_assert_eq!(why.lines().count(), 1);
                }
                // The replay of whatever decodes: a result or one line.
                if let Err(e) = apply(&dev, &j, &rec) {
                    prop_assert_eq!(e.to_string().lines().count(), 1);
                }
            }
        }

        /// Random bytes anywhere in the jsb, the log, the superblock, the
        /// descriptor table or the journal inode: no panic, ever.
        #[test]
        fn corruption_never_panics(muts in proptest::collection::vec((0u8..6, any::<u32>(), any::<u8>()), 1..8)) {
            let dev = image();
            let mut t1 = txn(1, &[(3000, 1), (3001, 2)], 10);
            t1.revokes = vec![2999];
            let j = write_log(&dev, 1, &[t1, txn(2, &[(3000, 3)], 11)]);
            let inode_at = {
                // Inode 8 in group 0's table.
                let mut d = vec![0u8; 64];
                dev.read_at(&mut d, 4096).unwrap();
                let gd = GroupDesc::parse(&d).unwrap();
                gd.inode_table() * 4096 + 7 * 256
            };
            for (area, off, v) in muts {
                let at = match area {
                    0 => SUPERBLOCK_OFFSET + u64::from(off % 1024),
                    1 => 4096 + u64::from(off % 4096),
                    2 => inode_at + u64::from(off % 256),
                    3 => j.phys(0).unwrap() * 4096 + u64::from(off % 1024),
                    _ => j.phys(1 + u64::from(off % 8)).unwrap() * 4096 + u64::from(off % 4096),
                };
                dev.write_at(&[v], at).unwrap();
            }
            if let Ok(j) = Journal::open(&dev) {
                let (_rec, _res) = analyze(&dev, &j);
            }
        }
    }
}
