//! Read-write open and close of a filesystem, around the journal writer.
//!
//! [`RwFs::open`]: refuse what the writer can't do (one line naming the
//! feature), replay a dirty journal first (the kernel's rule: only when
//! `needs_recovery` is set *and* the journal's `s_start` is nonzero; with
//! the flag clear a nonempty log is thrown away, as `jbd2_journal_wipe`
//! does), set the journal features the kernel sets at mount while the log
//! is empty (in memory: the journal superblock goes to disk with the first
//! commit or the clean close), then set `needs_recovery` (and the mount
//! count and time) in the primary superblock and flush before any commit.
//!
//! [`RwFs::close`]: commit, checkpoint everything, mark the journal empty
//! (`s_start = 0`, `s_sequence` = next tid), flush, then clear
//! `needs_recovery` and stamp `s_wtime`/`s_kbytes_written` as the kernel's
//! unmount does, flush. Dropping an [`RwFs`] without `close` (or
//! [`RwFs::crash`]) writes nothing more: the device is left as after a
//! power cut right after the last commit's flush, which is what the
//! replay tests need.
//!
//! After open, the superblock and every other metadata block change only
//! through transaction handles; [`RwFs::modify_superblock`] is the one
//! place the superblock checksum is computed.
//!
//! The small metadata client ([`RwFs::set_label`]) exists to prove the
//! journal against the real tools. Inode attributes change through
//! `Filesystem::set_inode_attrs`, under the inode's call lock: a change
//! to an inode's slot past the operations' locks could be overwritten by
//! an operation that read the inode before it (so there is no public
//! way to make one on an `RwFs`):
//!
//! ```compile_fail
//! fn chmod(fs: &ext4kit_fs::rw::RwFs) {
//!     let a = ext4kit_fs::rw::InodeAttrs { perm: Some(0o700), ..Default::default() };
//!     let _ = fs.set_inode_attrs(2, &a);
//! }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ext4kit_device::Device;
use ext4kit_format::Csum;
use ext4kit_format::features::{Compat, Features, Incompat, RoCompat, Word};
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_format::inode;
use ext4kit_format::superblock::{
    STATE_ERROR, STATE_VALID, SUPERBLOCK_OFFSET, SUPERBLOCK_SIZE, Superblock,
};
use zerocopy::IntoBytes;

use crate::cache::BlockCache;
use crate::journal::recover::{
    self, Journal, analyze, apply, read_superblock, read_superblock_with,
};
use crate::journal::{Handle, JournalOptions, JournalWriter};
use crate::mmp::Mmp;
use crate::{BlockRead, DeviceBlocks, FsError};

/// incompat features the read-write engine handles.
pub const RW_INCOMPAT: u32 = Incompat::FILETYPE.bits()
    | Incompat::RECOVER.bits()
    | Incompat::META_BG.bits()
    | Incompat::EXTENTS.bits()
    | Incompat::BIT64.bits()
    | Incompat::FLEX_BG.bits()
    | Incompat::CSUM_SEED.bits()
    | Incompat::MMP.bits()
    | Incompat::LARGEDIR.bits()
    | Incompat::INLINE_DATA.bits()
    | Incompat::EA_INODE.bits()
    | Incompat::CASEFOLD.bits()
    // Per file, not per image: what needs a key is refused per operation
    // (`fs/crypt.rs`).
    | Incompat::ENCRYPT.bits();

/// ro_compat features the read-write engine handles.
pub const RW_RO_COMPAT: u32 = RoCompat::SPARSE_SUPER.bits()
    | RoCompat::LARGE_FILE.bits()
    | RoCompat::HUGE_FILE.bits()
    | RoCompat::GDT_CSUM.bits()
    | RoCompat::DIR_NLINK.bits()
    | RoCompat::EXTRA_ISIZE.bits()
    | RoCompat::METADATA_CSUM.bits()
    | RoCompat::ORPHAN_PRESENT.bits()
    | RoCompat::QUOTA.bits()
    | RoCompat::PROJECT.bits()
    | RoCompat::BIGALLOC.bits()
    // fs-verity files are read-only per file (`fs/crypt.rs`).
    | RoCompat::VERITY.bits();

fn feature_names(word: Word, bits: u32) -> String {
    (0..32)
        .filter(|b| bits & (1 << b) != 0)
        .map(|b| Features::name_of(word, 1 << b))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Can the engine write this filesystem? `Err` names the first reason.
pub fn check_writable(sb: &Superblock) -> Result<(), FsError> {
    let inc = sb.s_feature_incompat.get() & !RW_INCOMPAT;
    if inc != 0 {
        return Err(FsError::Unsupported(format!(
            "incompatible feature {}",
            feature_names(Word::Incompat, inc)
        )));
    }
    let ro = sb.s_feature_ro_compat.get() & !RW_RO_COMPAT;
    if ro != 0 {
        return Err(FsError::Unsupported(format!(
            "read-only compatible feature {}",
            feature_names(Word::RoCompat, ro)
        )));
    }
    // fast_commit: our commits are full jbd2 commits outside the
    // fast-commit area (JournalWriter::new); a log holding fast commits
    // to replay is refused by recover::apply.
    let compat = Compat(sb.s_feature_compat.get());
    if !compat.contains(Compat::HAS_JOURNAL)
        && Incompat(sb.s_feature_incompat.get()).contains(Incompat::RECOVER)
    {
        // The kernel refuses it too ("fs needs recovery but has no
        // journal"); e2fsck clears the flag.
        return Err(FsError::corrupt(
            "superblock",
            "needs_recovery is set but the filesystem has no journal (run e2fsck)",
        ));
    }
    Ok(())
}

/// Options of a read-write open.
#[derive(Clone, Debug, Default)]
pub struct RwOptions {
    pub journal: JournalOptions,
    /// Discard at commit (`-o discard`) and the reconciler at open
    /// ([`crate::discard`]); `None`: nodiscard. Used by
    /// [`crate::fs::Filesystem::open`].
    pub discard: Option<crate::discard::DiscardOptions>,
    /// What a corrupt structure met during an operation does (the mount's
    /// `-o errors=`); `None`: the superblock's `s_errors`.
    pub errors: Option<ErrorBehavior>,
}

/// ext4's `errors=` behaviour. Every one of them fails the operation that
/// met the corruption and records it in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorBehavior {
    /// `errors=continue` (`s_errors` 1, mke2fs's default): later
    /// operations go on. A corruption met after the operation changed
    /// blocks still aborts the journal (its half change must not
    /// commit), and then the filesystem is read-only as with
    /// [`ErrorBehavior::RemountRo`].
    Continue,
    /// `errors=remount-ro` (`s_errors` 2): the journal is aborted (what
    /// committed before stays in the log for the next open), later writes
    /// fail with EROFS ([`FsError::ReadOnly`]), reads keep working.
    RemountRo,
    /// `errors=panic` (`s_errors` 3): a library does not panic; treated
    /// as [`ErrorBehavior::RemountRo`].
    Panic,
}

impl ErrorBehavior {
    /// From `s_errors` (the kernel's default for other values:
    /// remount-ro).
    pub fn from_s_errors(v: u16) -> ErrorBehavior {
        match v {
            1 => ErrorBehavior::Continue,
            3 => ErrorBehavior::Panic,
            _ => ErrorBehavior::RemountRo,
        }
    }
}

/// One error as the superblock records it (`save_error_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorRecord {
    /// Seconds since the epoch.
    pub time: u64,
    pub ino: u32,
    pub block: u64,
    /// The function that met the error (at most 32 bytes are kept).
    pub func: String,
    pub line: u32,
    /// `EXT4_ERR_*` ([`FsError::ext4_errcode`]).
    pub code: u8,
}

impl ErrorRecord {
    /// A record of `e` met by `func` (line `line`) working on inode
    /// `ino`, stamped now; the inode and block named by the error win.
    pub fn of(e: &FsError, func: &str, line: u32, ino: u32) -> ErrorRecord {
        let (i, block) = e.location();
        ErrorRecord {
            time: now(),
            ino: if i != 0 { i } else { ino },
            block,
            func: func.to_string(),
            line,
            code: e.ext4_errcode(),
        }
    }

    /// The one line the error is logged with, as the kernel's
    /// `__ext4_error_inode` prints it ("func:line: inode #N: block N:
    /// the error"), then what happens now (`action`).
    pub fn message(&self, why: &FsError, action: &str) -> String {
        let mut m = format!("{}:{}: ", self.func, self.line);
        if self.ino != 0 {
            m += &format!("inode #{}: ", self.ino);
        }
        if self.block != 0 {
            m += &format!("block {}: ", self.block);
        }
        format!("{m}{why}; {action}")
    }
}

/// Record `r` in `sb` as `ext4_update_super` does: the error state, the
/// first error (only when none is recorded), the last error, the count.
pub fn apply_error(sb: &mut Superblock, r: &ErrorRecord) {
    let func = {
        let mut f = [0u8; 32];
        let b = r.func.as_bytes();
        let n = b.len().min(32);
        f[..n].copy_from_slice(&b[..n]);
        f
    };
    sb.s_state.set(sb.s_state.get() | STATE_ERROR);
    if sb.s_first_error_time.get() == 0 && sb.s_first_error_time_hi == 0 {
        stamp(
            &mut sb.s_first_error_time,
            &mut sb.s_first_error_time_hi,
            r.time,
        );
        sb.s_first_error_func = func;
        sb.s_first_error_line.set(r.line);
        sb.s_first_error_ino.set(r.ino);
        sb.s_first_error_block.set(r.block);
        sb.s_first_error_errcode = r.code;
    }
    stamp(
        &mut sb.s_last_error_time,
        &mut sb.s_last_error_time_hi,
        r.time,
    );
    sb.s_last_error_func = func;
    sb.s_last_error_line.set(r.line);
    sb.s_last_error_ino.set(r.ino);
    sb.s_last_error_block.set(r.block);
    sb.s_last_error_errcode = r.code;
    sb.s_error_count
        .set(sb.s_error_count.get().saturating_add(1));
}

/// The superblock's error fields (`EXT4_S_ERR_START..EXT4_S_ERR_END`,
/// plus the four `_hi`/errcode bytes), which the kernel keeps across a
/// journal replay (`ext4_load_journal`): a logged superblock copy is
/// older than an error written directly after the journal aborted.
#[derive(Clone)]
struct ErrorFields {
    main: Vec<u8>,
    tail: Vec<u8>,
    state_error: bool,
}

const ERR_MAIN: std::ops::Range<usize> =
    std::mem::offset_of!(Superblock, s_error_count)..std::mem::offset_of!(Superblock, s_mount_opts);
const ERR_TAIL: std::ops::Range<usize> = std::mem::offset_of!(Superblock, s_first_error_time_hi)
    ..std::mem::offset_of!(Superblock, s_encoding);

impl ErrorFields {
    fn of(sb: &Superblock) -> ErrorFields {
        let b = sb.as_bytes();
        ErrorFields {
            main: b[ERR_MAIN].to_vec(),
            tail: b[ERR_TAIL].to_vec(),
            state_error: sb.s_state.get() & STATE_ERROR != 0,
        }
    }

    /// Put the saved fields back, unless the replayed superblock counts
    /// more errors (errors=continue journals its records).
    fn restore(&self, sb: &mut Superblock) {
        let saved = u32::from_le_bytes([self.main[0], self.main[1], self.main[2], self.main[3]]);
        if saved < sb.s_error_count.get() {
            return;
        }
        let b = sb.as_mut_bytes();
        b[ERR_MAIN].copy_from_slice(&self.main);
        b[ERR_TAIL].copy_from_slice(&self.tail);
        if self.state_error {
            sb.s_state.set(sb.s_state.get() | STATE_ERROR);
        }
    }
}

/// What [`RwFs::open`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Transactions replayed from a dirty journal.
    pub replayed: u32,
    /// A nonempty log was discarded because `needs_recovery` was clear.
    pub discarded_log: bool,
}

/// Where things are (from the superblock at open).
#[derive(Clone)]
pub struct Geometry {
    pub block_size: u32,
    pub blocks: u64,
    pub first_data_block: u64,
    pub inodes_count: u32,
    pub inodes_per_group: u32,
    pub inode_size: u32,
    pub desc_size: u32,
    pub csum: Csum,
    /// The superblock the descriptor locations come from (meta_bg,
    /// sparse_super2).
    sb: Superblock,
}

impl std::fmt::Debug for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Geometry")
            .field("block_size", &self.block_size)
            .field("blocks", &self.blocks)
            .field("inodes_count", &self.inodes_count)
            .field("inode_size", &self.inode_size)
            .field("desc_size", &self.desc_size)
            .finish_non_exhaustive()
    }
}

impl Geometry {
    /// Where primary descriptor block `i` lives: after the superblock,
    /// or with meta_bg (from `s_first_meta_bg` on) in the first group of
    /// its meta group, after that group's superblock backup if it has
    /// one (libext2fs's `ext2fs_descriptor_block_loc2`).
    pub fn desc_block(&self, i: u32) -> u64 {
        let sb = &self.sb;
        let meta_bg = Incompat(sb.s_feature_incompat.get()).contains(Incompat::META_BG);
        ext4kit_format::layout::DescLayout {
            gdt_start: ext4kit_format::layout::gdt_start(self.block_size),
            first_data_block: self.first_data_block,
            blocks_per_group: sb.s_blocks_per_group.get(),
            descs_per_block: self.block_size / self.desc_size,
            first_meta_bg: meta_bg.then(|| sb.s_first_meta_bg.get()),
            backups: ext4kit_format::layout::Backups::of(sb),
        }
        .primary(i)
    }

    /// From a superblock already checked for its block size and count.
    pub fn of(sb: &Superblock, block_size: u32, blocks: u64) -> Result<Geometry, FsError> {
        let geo = Geometry {
            block_size,
            blocks,
            first_data_block: u64::from(sb.s_first_data_block.get()),
            inodes_count: sb.s_inodes_count.get(),
            inodes_per_group: sb.s_inodes_per_group.get(),
            inode_size: if sb.s_rev_level.get() == 0 {
                128
            } else {
                u32::from(sb.s_inode_size.get())
            },
            desc_size: u32::from(sb.desc_size()),
            csum: Csum::from_superblock(sb),
            sb: sb.clone(),
        };
        if geo.inodes_per_group == 0
            || !(128..=block_size).contains(&geo.inode_size)
            || !geo.inode_size.is_power_of_two()
            || !(32..=block_size).contains(&geo.desc_size)
            || !geo.desc_size.is_power_of_two()
        {
            return Err(FsError::corrupt(
                "superblock",
                "inode or descriptor geometry out of range",
            ));
        }
        Ok(geo)
    }
}

/// Block and byte offset of inode `ino`'s slot, read through `blocks`
/// (group descriptor checksum and bounds checked).
pub fn locate_inode(
    blocks: &dyn BlockRead,
    g: &Geometry,
    ino: u32,
) -> Result<(u64, usize), FsError> {
    if ino == 0 || ino > g.inodes_count {
        return Err(FsError::corrupt(
            "inode number",
            format!("{ino} is outside 1..={}", g.inodes_count),
        ));
    }
    let group = (ino - 1) / g.inodes_per_group;
    let index = (ino - 1) % g.inodes_per_group;
    let per = g.block_size / g.desc_size;
    let dblk = g.desc_block(group / per);
    let doff = ((group % per) * g.desc_size) as usize;
    let b = blocks.block(dblk)?;
    let raw = &b[doff..doff + g.desc_size as usize];
    let gd = GroupDesc::parse(raw)
        .ok_or_else(|| FsError::corrupt("group descriptor", format!("group {group}")))?;
    if (g.csum.metadata || g.csum.gdt) && !gd.checksum_ok(&g.csum, group, g.desc_size as usize) {
        return Err(FsError::corrupt(
            "group descriptor",
            format!("group {group}: checksum does not match"),
        ));
    }
    let (blk, off) =
        crate::inode::slot_location(gd.inode_table(), index, g.inode_size, g.block_size);
    if blk >= g.blocks {
        return Err(FsError::corrupt(
            "group descriptor",
            format!("group {group}: inode table outside the filesystem"),
        ));
    }
    Ok((blk, off))
}

/// The on-disk slot of inode `ino` read through `blocks`, checksum
/// checked.
pub fn read_inode(blocks: &dyn BlockRead, g: &Geometry, ino: u32) -> Result<Vec<u8>, FsError> {
    let (blk, off) = locate_inode(blocks, g, ino)?;
    let b = blocks.block(blk)?;
    let slot = b[off..off + g.inode_size as usize].to_vec();
    if !inode::checksum_ok(&slot, ino, &g.csum) {
        return Err(FsError::corrupt(
            "inode",
            format!("inode {ino}: checksum does not match"),
        ));
    }
    Ok(slot)
}

/// Free blocks and free inodes summed over the group descriptors (what
/// the kernel's counters hold and its unmount writes to the superblock),
/// read where the descriptors are (meta_bg included).
pub fn summary_counts(blocks: &dyn BlockRead, sb: &Superblock) -> Result<(u64, u32), FsError> {
    let bs = u64::from(blocks.block_size());
    let bpg = u64::from(sb.s_blocks_per_group.get());
    let first = u64::from(sb.s_first_data_block.get());
    let desc = u64::from(sb.desc_size());
    if bpg == 0 || desc == 0 || desc > bs || sb.blocks_count() <= first {
        return Err(FsError::corrupt(
            "superblock",
            "group geometry out of range",
        ));
    }
    let geo = Geometry {
        block_size: blocks.block_size(),
        blocks: sb.blocks_count(),
        first_data_block: first,
        inodes_count: sb.s_inodes_count.get(),
        inodes_per_group: sb.s_inodes_per_group.get(),
        inode_size: u32::from(sb.s_inode_size.get()),
        desc_size: desc as u32,
        csum: Csum::from_superblock(sb),
        sb: sb.clone(),
    };
    let groups = (sb.blocks_count() - first).div_ceil(bpg);
    let per_block = bs / desc;
    let (mut fb, mut fi) = (0u64, 0u64);
    let nblocks = u32::try_from(groups.div_ceil(per_block))
        .map_err(|_| FsError::corrupt("superblock", format!("{groups} block groups")))?;
    // One large read per run of the table, not one per block.
    crate::groups::scan_desc_blocks(
        blocks,
        nblocks,
        |i| geo.desc_block(i),
        |gdt, _, b| {
            for k in 0..per_block {
                let g = u64::from(gdt) * per_block + k;
                if g >= groups {
                    break;
                }
                let o = (k * desc) as usize;
                let gd = GroupDesc::parse(&b[o..o + desc as usize])
                    .ok_or_else(|| FsError::corrupt("group descriptor", format!("group {g}")))?;
                fb += u64::from(gd.free_blocks());
                fi += u64::from(gd.free_inodes());
            }
            Ok(())
        },
    )?;
    Ok((fb, u32::try_from(fi).unwrap_or(u32::MAX)))
}

/// A filesystem open for writing (see the module docs).
pub struct RwFs {
    w: JournalWriter,
    geo: Geometry,
    sb_block: u64,
    sb_off: usize,
    metadata_csum: bool,
    report: OpenReport,
    errors: ErrorBehavior,
    /// Why writes are refused (errors=remount-ro after an error).
    read_only: Mutex<Option<String>>,
    /// Serializes error records.
    err_lock: Mutex<()>,
    /// Errors recorded under errors=continue, not yet in a superblock
    /// image: the next handle that changes the superblock carries them
    /// (the kernel's `s_sb_upd_work`), or the close.
    pending_errors: Mutex<Vec<ErrorRecord>>,
    /// The orphan file may hold inodes: `orphan_present` stays set at
    /// close (as found at open until the operations layer says).
    orphans_left: AtomicBool,
    /// What [`RwFs::mark_in_use`] still has to write (`None` once done).
    mark: Mutex<Option<OpenMark>>,
    marked: AtomicBool,
    /// Without a journal: `s_state` had `VALID_FS` at open. The open
    /// clears it on disk (the kernel's `ext4_setup_super`) and a clean
    /// close puts back what was found (`ext4_put_super` writes
    /// `s_mount_state`): an unchecked filesystem stays unchecked.
    valid_at_open: Option<bool>,
    /// Multiple mount protection, with the mmp feature ([`crate::mmp`]).
    mmp: Option<Mmp>,
}

/// The superblock changes of a read-write open, kept until they are
/// written ([`RwFs::mark_in_use`]).
struct OpenMark {
    saved_errors: Option<ErrorFields>,
    journal_error: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn fs_err(e: recover::RecoverError) -> FsError {
    FsError::Recover(e)
}

/// Seconds for the superblock's stamps: the coarse clock, as the kernel
/// and e2fsck's `time(2)` read it.
fn now() -> u64 {
    ext4kit_device::host::realtime_coarse_secs()
}

fn stamp(lo: &mut zerocopy::little_endian::U32, hi: &mut u8, t: u64) {
    lo.set(t as u32);
    *hi = (t >> 32) as u8;
}

/// Write the primary superblock directly (only at open and close, when
/// the journal holds nothing for it).
fn write_sb_direct(dev: &dyn Device, f: impl FnOnce(&mut Superblock)) -> Result<(), FsError> {
    let mut raw = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut raw, SUPERBLOCK_OFFSET)?;
    let mut sb =
        Superblock::parse(&raw).ok_or_else(|| FsError::corrupt("superblock", "short read"))?;
    f(&mut sb);
    if RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM) {
        sb.update_checksum();
    }
    dev.write_at(sb.as_bytes(), SUPERBLOCK_OFFSET)?;
    dev.flush()?;
    Ok(())
}

impl RwFs {
    /// Open `dev` for writing (see the module docs).
    pub fn open(dev: Arc<dyn Device>, opts: RwOptions) -> Result<RwFs, FsError> {
        let rw = Self::open_deferred(dev, opts)?;
        rw.mark_in_use()?;
        Ok(rw)
    }

    /// [`RwFs::open`] without putting the in-use marks on disk yet
    /// ([`RwFs::mark_in_use`], done by the first handle at the latest):
    /// a caller can check the rest of the filesystem (the descriptor
    /// table, what it was asked to change) and give up without having
    /// written anything, unless the journal had to be replayed (which the
    /// kernel's mount writes too) or the mmp feature asks for its block
    /// to be claimed. Closing an unmarked filesystem writes nothing.
    pub fn open_deferred(dev: Arc<dyn Device>, opts: RwOptions) -> Result<RwFs, FsError> {
        let mmp;
        {
            let sb = read_superblock_with(&*dev, false).map_err(fs_err)?;
            // Multiple mount protection first, before anything is
            // written (the replay included), as ext4_fill_super.
            check_writable(&sb)?;
            mmp = Mmp::start(dev.clone(), &sb)?;
            if !Compat(sb.s_feature_compat.get()).contains(Compat::HAS_JOURNAL) {
                return Self::open_without_journal(dev, opts, mmp);
            }
        }
        let (sb, sb_ok) = match read_superblock(&*dev) {
            Ok(sb) => (sb, true),
            Err(e) => {
                // A torn in-place write of the superblock (its checksum
                // spans two sectors) is repaired by the replay when the
                // log holds a copy of it; otherwise it is refused.
                let sb = read_superblock_with(&*dev, false).map_err(|_| fs_err(e))?;
                (sb, false)
            }
        };
        // (check_writable ran on these bytes above, before the mmp.)
        // The error fields survive the replay (ext4_load_journal).
        let saved_errors = sb_ok.then(|| ErrorFields::of(&sb));
        let j = Journal::open_with(&*dev, sb_ok).map_err(fs_err)?;
        let mut report = OpenReport::default();
        let dirty = j.jsb.s_start.get() != 0
            && Incompat(sb.s_feature_incompat.get()).contains(Incompat::RECOVER);
        if !sb_ok {
            let holds_sb = dirty
                && recover::recover(&*dev, &j).is_ok_and(|r| {
                    r.writes
                        .contains_key(&(SUPERBLOCK_OFFSET / u64::from(j.block_size)))
                });
            if !holds_sb {
                return Err(fs_err(read_superblock(&*dev).err().unwrap_or(
                    recover::RecoverError::Corrupt {
                        what: "superblock",
                        detail: "checksum does not match".into(),
                    },
                )));
            }
        }
        if j.jsb.s_start.get() != 0 {
            if dirty {
                let rec = recover::recover(&*dev, &j).map_err(fs_err)?;
                apply(&*dev, &j, &rec).map_err(fs_err)?;
                report.replayed = rec.transactions();
            } else {
                // jbd2_journal_wipe: skip the log, keep tids growing.
                let (rec, _) = analyze(&*dev, &j);
                let mut jsb = j.jsb.clone();
                jsb.s_start.set(0);
                jsb.s_sequence.set(rec.next_sequence);
                if j.fmt.csum_v2or3() {
                    jsb.s_checksum.set(0);
                    let c = ext4kit_format::checksum::jbd2::superblock(jsb.as_bytes());
                    jsb.s_checksum.set(c);
                }
                let p = j.jsb_block();
                dev.write_at(jsb.as_bytes(), p * u64::from(j.block_size))?;
                dev.flush()?;
                report.discarded_log = true;
            }
        }
        // Everything below reads the replayed state.
        let j = Journal::open(&*dev).map_err(fs_err)?;
        // An error the journal recorded (a previous abort): the filesystem
        // is marked in error, as ext4_clear_journal_err does; the writer
        // clears s_errno.
        let journal_error = j.jsb.s_errno.get() != 0;
        let sb = j.sb.clone();
        check_writable(&sb)?;
        let bs = j.block_size;
        let geo = Geometry::of(&sb, bs, j.fs_blocks)?;
        let metadata_csum =
            RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM);
        let w = JournalWriter::new(dev.clone(), j, opts.journal)?;
        let errors = opts
            .errors
            .unwrap_or_else(|| ErrorBehavior::from_s_errors(sb.s_errors.get()));
        Ok(RwFs {
            w,
            sb_block: SUPERBLOCK_OFFSET / u64::from(bs),
            sb_off: (SUPERBLOCK_OFFSET % u64::from(bs)) as usize,
            geo,
            metadata_csum,
            report,
            errors,
            read_only: Mutex::new(None),
            err_lock: Mutex::new(()),
            pending_errors: Mutex::new(Vec::new()),
            orphans_left: AtomicBool::new(
                RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::ORPHAN_PRESENT),
            ),
            mark: Mutex::new(Some(OpenMark {
                saved_errors,
                journal_error,
            })),
            marked: AtomicBool::new(false),
            valid_at_open: None,
            mmp,
        })
    }

    /// [`RwFs::open_deferred`] of a filesystem without a journal: nothing
    /// to replay, a writer that commits in place
    /// ([`JournalWriter::without_journal`]); the caller checked the
    /// features and started the mmp.
    fn open_without_journal(
        dev: Arc<dyn Device>,
        opts: RwOptions,
        mmp: Option<Mmp>,
    ) -> Result<RwFs, FsError> {
        let sb = read_superblock(&*dev).map_err(fs_err)?;
        let bs = sb
            .block_size()
            .ok_or_else(|| FsError::corrupt("superblock", "block size out of range"))?;
        let blocks = sb.blocks_count();
        if blocks == 0 || blocks.saturating_mul(u64::from(bs)) > dev.size() {
            return Err(FsError::corrupt(
                "superblock",
                format!(
                    "{blocks} blocks of {bs} bytes do not fit the device ({} bytes)",
                    dev.size()
                ),
            ));
        }
        let geo = Geometry::of(&sb, bs, blocks)?;
        let valid = sb.s_state.get() & STATE_VALID != 0;
        if !valid {
            // ext4_setup_super's warning; the kernel mounts it all the same.
            tracing::warn!(
                "{}: warning: writing an unchecked filesystem (not clean), running e2fsck is recommended",
                dev.name()
            );
        }
        let metadata_csum =
            RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::METADATA_CSUM);
        let w = JournalWriter::without_journal(dev, bs, blocks, 1, opts.journal);
        let errors = opts
            .errors
            .unwrap_or_else(|| ErrorBehavior::from_s_errors(sb.s_errors.get()));
        Ok(RwFs {
            w,
            sb_block: SUPERBLOCK_OFFSET / u64::from(bs),
            sb_off: (SUPERBLOCK_OFFSET % u64::from(bs)) as usize,
            geo,
            metadata_csum,
            report: OpenReport::default(),
            errors,
            read_only: Mutex::new(None),
            err_lock: Mutex::new(()),
            pending_errors: Mutex::new(Vec::new()),
            orphans_left: AtomicBool::new(
                RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::ORPHAN_PRESENT),
            ),
            mark: Mutex::new(Some(OpenMark {
                saved_errors: None,
                journal_error: false,
            })),
            marked: AtomicBool::new(false),
            valid_at_open: Some(valid),
            mmp,
        })
    }

    /// Whether the filesystem has a journal (`false`: its transactions
    /// commit in place, see [`JournalWriter::without_journal`]).
    pub fn has_journal(&self) -> bool {
        self.w.has_journal()
    }

    /// Put the in-use marks on disk if [`RwFs::open_deferred`] left them
    /// out: `needs_recovery` (with the error state the replay must not
    /// lose), the mount count and the mount and write times, flushed
    /// before any commit (ext4_setup_super). Idempotent; the first handle
    /// calls it anyway.
    pub fn mark_in_use(&self) -> Result<(), FsError> {
        if self.marked.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut m = lock(&self.mark);
        let Some(mark) = m.as_ref() else {
            return Ok(());
        };
        let t = now();
        let journaled = self.valid_at_open.is_none();
        write_sb_direct(&**self.w.device(), |sb| {
            if journaled {
                let inc = sb.s_feature_incompat.get() | Incompat::RECOVER.bits();
                sb.s_feature_incompat.set(inc);
            } else {
                // Without a journal the filesystem is not clean while it
                // is open for writing (ext4_setup_super): a crash leaves
                // it for e2fsck.
                sb.s_state.set(sb.s_state.get() & !STATE_VALID);
            }
            if let Some(saved) = &mark.saved_errors {
                saved.restore(sb);
            }
            if mark.journal_error {
                sb.s_state.set(sb.s_state.get() | STATE_ERROR);
            }
            sb.s_mnt_count.set(sb.s_mnt_count.get().wrapping_add(1));
            stamp(&mut sb.s_mtime, &mut sb.s_mtime_hi, t);
            stamp(&mut sb.s_wtime, &mut sb.s_wtime_hi, t);
        })?;
        // The open read the superblock through the cache before this: its
        // copy must not be the base of a logged superblock (it lacks
        // needs_recovery).
        self.blocks().invalidate_clean(self.sb_block);
        if let Some(p) = &self.mmp {
            p.keep_on_drop();
        }
        *m = None;
        self.marked.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether the orphan file holds inodes at close (`orphan_present`
    /// is kept set then, else cleared, as the kernel's unmount clears it).
    pub fn set_orphans_left(&self, left: bool) {
        self.orphans_left.store(left, Ordering::Relaxed);
    }

    /// The `errors=` behaviour in force.
    pub fn error_behavior(&self) -> ErrorBehavior {
        self.errors
    }

    /// `Some(why)` once an error made the filesystem read-only.
    pub fn read_only(&self) -> Option<String> {
        if let Some(why) = self.mmp.as_ref().and_then(Mmp::lost) {
            return Some(why);
        }
        lock(&self.read_only).clone()
    }

    /// Record a corruption (or other error) an operation met, as ext4's
    /// `ext4_handle_error` does: with remount-ro (or when the journal is
    /// aborted anyway) the journal is aborted, writes are refused from now
    /// on and the record goes straight to the superblock's home (with its
    /// checksum, flushed: the journal may be aborted); with continue it
    /// goes into the next handle that changes the superblock (the
    /// kernel's deferred `s_sb_upd_work`), or the close, and writes go
    /// on. Never starts a handle (safe while the caller holds one). Best
    /// effort: a failing superblock write is not reported (the
    /// operation's error is).
    pub fn record_error(&self, rec: &ErrorRecord, why: &FsError) {
        let _g = lock(&self.err_lock);
        let dev = &**self.w.device();
        if self.errors == ErrorBehavior::Continue && self.w.aborted().is_none() {
            tracing::error!(
                "ext4 error ({}): {}",
                dev.name(),
                rec.message(why, "errors=continue: going on")
            );
            lock(&self.pending_errors).push(rec.clone());
            return;
        }
        tracing::error!(
            "ext4 error ({}): {}",
            dev.name(),
            rec.message(
                why,
                "the journal is aborted, the filesystem is read-only from now on"
            )
        );
        self.w.abort_journal(why);
        lock(&self.read_only).get_or_insert_with(|| why.to_string());
        let pending = std::mem::take(&mut *lock(&self.pending_errors));
        let _ = write_sb_direct(dev, |sb| {
            for p in pending.iter().chain([rec]) {
                apply_error(sb, p);
            }
        });
        self.blocks().invalidate_clean(self.sb_block);
    }

    /// What open did.
    pub fn open_report(&self) -> OpenReport {
        self.report
    }

    /// The journal writer (handles, commit, checkpoint).
    pub fn journal(&self) -> &JournalWriter {
        &self.w
    }

    /// The block cache ([`BlockRead`] with the newest images).
    pub fn blocks(&self) -> &BlockCache {
        self.w.cache()
    }

    /// The geometry read at open.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// Start a handle (see [`JournalWriter::start`]); refused with
    /// [`FsError::ReadOnly`] after an error made the filesystem read-only.
    pub fn start(&self, credits: u32) -> Result<Handle<'_>, FsError> {
        if let Some(why) = self.read_only() {
            return Err(FsError::ReadOnly(why));
        }
        self.mark_in_use()?;
        self.w.start(credits)
    }

    /// The newest superblock (running transaction included).
    pub fn superblock(&self) -> Result<Superblock, FsError> {
        let b = self.blocks().block(self.sb_block)?;
        Superblock::parse(&b[self.sb_off..])
            .ok_or_else(|| FsError::corrupt("superblock", "short block"))
    }

    /// Change the primary superblock inside `h`'s transaction; its
    /// checksum is recomputed here (the one place).
    pub fn modify_superblock<R>(
        &self,
        h: &mut Handle<'_>,
        f: impl FnOnce(&mut Superblock) -> R,
    ) -> Result<R, FsError> {
        let off = self.sb_off;
        let csum = self.metadata_csum;
        // Errors recorded under errors=continue ride along.
        let pending = std::mem::take(&mut *lock(&self.pending_errors));
        let r = h.modify(self.sb_block, |buf| {
            let raw = &mut buf[off..off + SUPERBLOCK_SIZE];
            let mut sb = Superblock::parse(raw).unwrap_or_else(Superblock::zeroed);
            for p in &pending {
                apply_error(&mut sb, p);
            }
            let r = f(&mut sb);
            if csum {
                sb.update_checksum();
            }
            raw.copy_from_slice(sb.as_bytes());
            r
        });
        if r.is_err() {
            lock(&self.pending_errors).extend(pending);
        }
        r
    }

    /// Clean close (see the module docs). After an error made the
    /// filesystem read-only nothing more is written (the journal is
    /// aborted; the next open replays what committed, as after the
    /// kernel's unmount of an aborted filesystem).
    pub fn close(self) -> Result<(), FsError> {
        self.close_with_counts(None)
    }

    /// [`RwFs::close`] writing `counts` (free blocks, free inodes: the
    /// allocators' totals, as the kernel's unmount writes its counters)
    /// into the superblock instead of summing the descriptor table again.
    pub fn close_with_counts(mut self, counts: Option<(u64, u32)>) -> Result<(), FsError> {
        if let Some(why) = self.mmp.as_ref().and_then(Mmp::lost) {
            // Another node has the device: nothing more is written.
            tracing::error!("{}: not closed: {why}", self.w.device().name());
            return Ok(());
        }
        let mmp = self.mmp.take();
        let r = self.close_inner(counts);
        // The clean sequence last, also after a failed close (the
        // kernel's kmmpd writes it at every unmount).
        let m = mmp.map_or(Ok(()), |m| m.stop());
        r.and(m)
    }

    fn close_inner(self, counts: Option<(u64, u32)>) -> Result<(), FsError> {
        if self.read_only().is_some() || !self.marked.load(Ordering::Acquire) {
            // Read-only after an error, or never marked in use: nothing
            // of this open reached the disk, nothing more is written.
            return Ok(());
        }
        if self.w.aborted().is_some() {
            // The close will fail; errors recorded under continue go
            // straight to the superblock first.
            let pending = std::mem::take(&mut *lock(&self.pending_errors));
            if !pending.is_empty() {
                let _ = write_sb_direct(&**self.w.device(), |sb| {
                    pending.iter().for_each(|p| apply_error(sb, p))
                });
            }
        }
        let bs = u64::from(self.geo.block_size);
        self.w.shutdown()?;
        let st = self.w.stats();
        let written_kb = ((st.log_blocks_written + st.home_blocks_written + 2) * bs) >> 10;
        let t = now();
        // Everything is home now: the summary counts come from the group
        // descriptors, as the kernel's unmount writes its counters.
        let dev = &**self.w.device();
        let (free_blocks, free_inodes) = match counts {
            Some(c) => c,
            None => {
                let sb = self.superblock_on_disk()?;
                summary_counts(
                    &DeviceBlocks::new(dev, self.geo.block_size, self.geo.blocks),
                    &sb,
                )?
            }
        };
        let pending = std::mem::take(&mut *lock(&self.pending_errors));
        let orphans_left = self.orphans_left.load(Ordering::Relaxed);
        let valid_at_open = self.valid_at_open;
        write_sb_direct(dev, |sb| {
            for p in &pending {
                apply_error(sb, p);
            }
            sb.set_free_blocks_count(free_blocks);
            sb.s_free_inodes_count.set(free_inodes);
            let inc = sb.s_feature_incompat.get() & !Incompat::RECOVER.bits();
            sb.s_feature_incompat.set(inc);
            if valid_at_open == Some(true) {
                sb.s_state.set(sb.s_state.get() | STATE_VALID);
            }
            if !orphans_left {
                let ro = sb.s_feature_ro_compat.get() & !RoCompat::ORPHAN_PRESENT.bits();
                sb.s_feature_ro_compat.set(ro);
            }
            stamp(&mut sb.s_wtime, &mut sb.s_wtime_hi, t);
            let kb = sb.s_kbytes_written.get();
            if kb != 0 {
                sb.s_kbytes_written.set(kb.saturating_add(written_kb));
            }
        })
    }

    fn superblock_on_disk(&self) -> Result<Superblock, FsError> {
        let mut raw = vec![0u8; SUPERBLOCK_SIZE];
        self.w.device().read_at(&mut raw, SUPERBLOCK_OFFSET)?;
        Superblock::parse(&raw).ok_or_else(|| FsError::corrupt("superblock", "short read"))
    }

    /// Stop without writing anything more (a test hook: the device stays
    /// as after a power cut following the last commit's flush).
    pub fn crash(self) {
        if let Some(m) = &self.mmp {
            m.abandon();
        }
    }

    // ------------------------------------------------------------------
    // The metadata-only client.

    /// Set the volume label (at most 16 bytes) in one transaction;
    /// returns its tid.
    pub fn set_label(&self, label: &str) -> Result<u32, FsError> {
        let bytes = label.as_bytes();
        if bytes.len() > 16 {
            return Err(FsError::Unsupported(format!(
                "label {label:?} is longer than 16 bytes"
            )));
        }
        let mut h = self.start(1)?;
        self.modify_superblock(&mut h, |sb| {
            sb.s_volume_name = [0; 16];
            sb.s_volume_name[..bytes.len()].copy_from_slice(bytes);
        })?;
        Ok(h.tid())
    }

    /// Block and byte offset of inode `ino`'s slot (descriptor checked).
    pub fn inode_location(&self, ino: u32) -> Result<(u64, usize), FsError> {
        locate_inode(self.blocks(), &self.geo, ino)
    }

    /// The on-disk slot of inode `ino` (newest image, checksum checked).
    pub fn read_inode(&self, ino: u32) -> Result<Vec<u8>, FsError> {
        read_inode(self.blocks(), &self.geo, ino)
    }

    /// Change inode `ino`'s attributes in its slot inside `h` (checksum
    /// updated). Crate-private: the caller holds the inode's call lock
    /// (`Filesystem::set_inode_attrs`).
    pub(crate) fn set_inode_attrs_in(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        a: &InodeAttrs,
    ) -> Result<(), FsError> {
        let (blk, off) = self.inode_location(ino)?;
        let isz = self.geo.inode_size as usize;
        let csum = self.geo.csum;
        h.modify(blk, |buf| {
            let slot = &mut buf[off..off + isz];
            a.apply(slot);
            if csum.metadata {
                inode::set_checksum(slot, ino, &csum);
            }
        })
    }
}

/// Attributes `Filesystem::set_inode_attrs` sets (`None`: unchanged).
/// Times are (seconds since the epoch, nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeAttrs {
    /// Permission bits (0o7777); the file type is kept.
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime: Option<(i64, u32)>,
    pub mtime: Option<(i64, u32)>,
    pub ctime: Option<(i64, u32)>,
}

fn put16(s: &mut [u8], off: usize, v: u16) {
    s[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(s: &mut [u8], off: usize, v: u32) {
    s[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn get16(s: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([s[off], s[off + 1]])
}

impl InodeAttrs {
    /// Apply to an on-disk inode slot (checksum not updated).
    pub fn apply(&self, slot: &mut [u8]) {
        if let Some(p) = self.perm {
            let mode = (get16(slot, 0x00) & !0o7777) | (p & 0o7777);
            put16(slot, 0x00, mode);
        }
        if let Some(u) = self.uid {
            put16(slot, 0x02, u as u16);
            put16(slot, 0x78, (u >> 16) as u16);
        }
        if let Some(g) = self.gid {
            put16(slot, 0x18, g as u16);
            put16(slot, 0x7A, (g >> 16) as u16);
        }
        let extra = if slot.len() > 128 {
            usize::from(get16(slot, 0x80))
        } else {
            0
        };
        // (field, its _extra field offset)
        for (t, off, xoff) in [
            (self.ctime, 0x0C, 0x84),
            (self.mtime, 0x10, 0x88),
            (self.atime, 0x08, 0x8C),
        ] {
            let Some((sec, nsec)) = t else { continue };
            let has_extra = 128 + extra >= xoff + 4 && slot.len() >= xoff + 4;
            // Clamped to the field's range (as the kernel's
            // EXT4_INODE_SET_XTIME), then ext4_encode_extra_time.
            let (s, x) =
                crate::fs::encode_time_in(crate::inode::Timestamp { sec, nsec }, has_extra);
            put32(slot, off, s);
            if has_extra {
                put32(slot, xoff, x);
            }
        }
    }
}
