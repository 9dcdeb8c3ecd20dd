//! Lazy inode-table initialization, as the kernel's `ext4lazyinit` thread
//! does it, from user space, for unmounted filesystems.
//!
//! # Contract (kernel `ext4_init_inode_table`, format notes §6)
//!
//! * Only groups without `ITABLE_ZEROED` are touched, only on filesystems
//!   with group-descriptor checksums (`metadata_csum` or `uninit_bg`),
//!   since only then is `bg_itable_unused` meaningful.
//! * In such a group, the inode table is zeroed from the first block past
//!   the used inodes (`ceil((ipg − bg_itable_unused) / inodes_per_block)`;
//!   the whole table with `INODE_UNINIT`) to its end. A block holding a used
//!   inode is never touched. Groups whose counts are inconsistent are
//!   refused (see [`plan::plan_group`]) and the whole filesystem with them,
//!   before anything is written.
//! * Order, per batch of groups: the zeros are made durable (flush), then
//!   `ITABLE_ZEROED` is set, the descriptor checksums recomputed, the
//!   primary descriptor blocks holding them written and flushed.
//!   A crash at any point leaves a consistent filesystem: a group either
//!   has its flag with a zeroed table, or no flag (and is redone). Backup
//!   descriptor tables are not updated, as the kernel does not update them.
//!
//! # Shape
//!
//! The steps are separate so that the same engine can later run online
//! (inside a FUSE mount, where descriptors live in the mount's cache):
//!
//! 1. **plan** ([`plan::plan_group`]): pure, descriptor → [`GroupWork`];
//! 2. **zero** ([`zero::Zeroer::zero_range`]): one byte range, with zero
//!    detection;
//! 3. **commit** ([`commit_zeroed`]): flush, set the flags, write the
//!    descriptor blocks, flush;
//! 4. **pace** ([`pacing::Pacer`]): how long to wait before the next unit.
//!
//! [`Engine`] strings them together for any number of filesystems with a
//! single worker: it always serves the filesystem whose next unit is due
//! first, round-robin among equals, one batch at a time, as the kernel's
//! single thread serves all mounts. Time comes from a [`Clock`], load from
//! a [`LoadSignal`], both injectable; progress goes to an [`Observer`].
//!
//! # Batches
//!
//! A unit of work is a batch of consecutive pending groups, closed after
//! [`Options::max_batch_groups`] groups, after [`Options::max_batch_time`]
//! of work, or when a stop is requested; each descriptor block it enters
//! is checked unchanged on disk first. The two flushes are per batch, not
//! per group or per descriptor block: on a sparse 1 TiB image (8192
//! groups, 128 descriptor blocks, most groups known zero and skipped) that
//! was 256 flushes with one descriptor block per batch, and is a few now
//! (each batch's 100 ms), against 16384 per group.
//!
//! # Pacing
//!
//! HZ-free, on a monotonic nanosecond clock. Fixed pacing (the default,
//! like the kernel's `init_itable=10`): after each unit, wait `mult ×` the
//! EWMA of the measured unit durations. Adaptive pacing: the multiplier
//! follows the strongest contention signal (disk, CPU and stall shares in
//! our idle windows, foreign requests and the rise of our own unit cost
//! during our work), from 0 when idle to `max_mult` (100) under load.
//! Details in [`pacing::Pacer`].
//!
//! # Zero detection
//!
//! Before zeroing, ranges the device proves to be zero (holes of a sparse
//! image file) are skipped. The rest is zeroed with `Device::zeroout`,
//! which punches holes in files (so a sparse image stays sparse, and an
//! image full of old data gets sparser) and issues `BLKZEROOUT` on block
//! devices (which unmaps on thin storage that supports it). Read-compare
//! (read first, zero only non-zero runs) is chosen by [`VerifyZero`]:
//! `auto` reads on non-rotational block devices only. For files `auto`
//! does not read: the hole map is exact, and punching an allocated range
//! costs no data write and frees space even if it held zeros.

pub mod engine;
pub mod load;
pub mod online;
pub mod pacing;
pub mod plan;
pub mod safety;
pub mod zero;

use std::collections::VecDeque;

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::group_desc::{BG_INODE_UNINIT, BG_INODE_ZEROED};

use crate::image::{DescChecksum, Image, ImageError};

pub use engine::{Engine, Event, JobReport, Observer, Options, Summary};
pub use load::{LoadSample, LoadSignal, SysfsLoad};
pub use online::{LazyInitHandle, OnlineOptions, OnlineState, OnlineStatus, StatusSource};
pub use pacing::{Clock, FakeClock, MonotonicClock, Pace, Pacer};
pub use plan::{GroupWork, PlanError, plan_group};
pub use zero::{DeviceKind, VerifyZero, ZeroStats, Zeroer};

/// Why lazy init refused a filesystem or stopped working on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LazyError {
    /// The filesystem could not be opened for update.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A group's counts contradict each other.
    #[error("inconsistent group descriptor: {0}")]
    Inconsistent(#[from] PlanError),
    /// The cross-check before the first write found a conflict
    /// ([`safety`]).
    #[error("refusing to zero anything: {0}")]
    Unsafe(#[from] safety::Conflict),
    /// I/O failed while working.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The read-write engine refused or failed (online lazy init).
    #[error(transparent)]
    Fs(#[from] ext4kit_fs::FsError),
    /// The online worker's thread could not be started.
    #[error("cannot start the lazy-init thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// One filesystem to initialize: the opened image and its pending groups.
pub struct Job<'d> {
    name: String,
    image: Image<'d>,
    no_group_checksums: bool,
    pending: VecDeque<GroupWork>,
    zeroed_before: u32,
    read_compare: bool,
    load: Option<Box<dyn LoadSignal + 'd>>,
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("pending", &self.pending.len())
            .field("zeroed_before", &self.zeroed_before)
            .field("read_compare", &self.read_compare)
            .field("load_signal", &self.load.is_some())
            .finish_non_exhaustive()
    }
}

impl<'d> Job<'d> {
    /// Open `dev` for update, plan every group and cross-check the plan
    /// against the filesystem ([`safety::check`]). Nothing is written.
    /// Refuses (with the reason) anything lazy init must not touch.
    ///
    /// A filesystem without group-descriptor checksums has nothing left
    /// for lazy init (mke2fs zeroes its tables itself): the job is empty
    /// ([`Job::no_group_checksums`]).
    pub fn prepare(dev: &'d dyn Device) -> Result<Self, LazyError> {
        let image = Image::open_for_update(dev)?;
        let (pending, zeroed_before) = plan_all(&image)?;
        if !pending.is_empty() {
            check_plan(&image, pending.as_slices().0)?;
        }
        Ok(Job {
            name: dev.name(),
            no_group_checksums: image.desc_checksum() == DescChecksum::None,
            image,
            pending,
            zeroed_before,
            read_compare: false,
            load: None,
        })
    }

    /// The filesystem has no group-descriptor checksums, so nothing was
    /// ever left for lazy init.
    pub fn no_group_checksums(&self) -> bool {
        self.no_group_checksums
    }

    /// The name used in events and reports (the device's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Rename (e.g. to the path the user gave).
    pub fn set_name(&mut self, name: impl Into<String>) {
        self.name = name.into();
    }

    /// Read ranges before zeroing them (see [`VerifyZero`]).
    pub fn set_read_compare(&mut self, on: bool) {
        self.read_compare = on;
    }

    /// The load signal for adaptive pacing.
    pub fn set_load_signal(&mut self, load: Box<dyn LoadSignal + 'd>) {
        self.load = Some(load);
    }

    /// The image.
    pub fn image(&self) -> &Image<'d> {
        &self.image
    }

    /// Groups still to do, in order.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = &GroupWork> {
        self.pending.iter()
    }

    /// Number of groups in the filesystem.
    pub fn groups_total(&self) -> u32 {
        self.image.geometry().group_count
    }

    /// Groups that had `ITABLE_ZEROED` when prepared.
    pub fn groups_zeroed_before(&self) -> u32 {
        self.zeroed_before
    }

    /// Bytes of inode table still to be made zero (an upper bound of what
    /// will be written).
    pub fn pending_bytes(&self) -> u64 {
        let g = self.image.geometry();
        self.pending.iter().map(|w| w.byte_range(g).1).sum()
    }
}

/// Plan every group: the pending work, in group order, and the number of
/// groups already done. Without group-descriptor checksums nothing is
/// pending and every group counts as done.
fn plan_all(image: &Image<'_>) -> Result<(VecDeque<GroupWork>, u32), LazyError> {
    let geom = image.geometry();
    if image.desc_checksum() == DescChecksum::None {
        return Ok((VecDeque::new(), geom.group_count));
    }
    let mut pending = VecDeque::new();
    let mut zeroed_before = 0;
    for g in 0..geom.group_count {
        match plan_group(geom, &image.desc(g), g)? {
            Some(w) => pending.push_back(w),
            None => zeroed_before += 1,
        }
    }
    // One contiguous slice for the cross-check.
    pending.make_contiguous();
    Ok((pending, zeroed_before))
}

/// The cross-check, with its errors sorted into [`LazyError`].
fn check_plan(image: &Image<'_>, pending: &[GroupWork]) -> Result<(), LazyError> {
    match safety::check(image, pending) {
        Ok(()) => Ok(()),
        Err(safety::CheckError::Conflict(c)) => Err(LazyError::Unsafe(c)),
        Err(safety::CheckError::Image(e)) => Err(LazyError::Image(e)),
    }
}

/// Why `ext4kit lazyinit` would refuse `image` (counts, or the
/// cross-check), if it would; `None` also when nothing is pending.
pub fn refusal(image: &Image<'_>) -> Option<String> {
    match plan_all(image) {
        Err(e) => Some(e.to_string()),
        Ok((pending, _)) if pending.is_empty() => None,
        Ok((pending, _)) => check_plan(image, pending.as_slices().0)
            .err()
            .map(|e| e.to_string()),
    }
}

/// Step 3: make the zeroes of `groups` durable, then set their
/// `ITABLE_ZEROED` flags and write the primary descriptor blocks holding
/// them, then flush. A crash between the block writes leaves some groups
/// flagged (their tables zeroed and flushed) and the others not (redone).
/// On failure the in-memory flags are restored.
pub fn commit_zeroed(image: &mut Image<'_>, groups: &[u32]) -> Result<(), LazyError> {
    let geom = image.geometry();
    if let Some(&g) = groups.iter().find(|&&g| g >= geom.group_count) {
        return Err(LazyError::Image(ImageError::Corrupt {
            what: "commit",
            detail: format!("group {g} out of range"),
        }));
    }
    let mut blocks: Vec<u32> = groups.iter().map(|&g| geom.desc_block_index(g)).collect();
    blocks.sort_unstable();
    blocks.dedup();
    image.flush()?;
    let old: Vec<u16> = groups.iter().map(|&g| image.desc_flags(g)).collect();
    for &g in groups {
        let f = image.desc_flags(g);
        image.set_desc_flags(g, f | BG_INODE_ZEROED);
    }
    let r = blocks
        .iter()
        .try_for_each(|&b| image.write_desc_block(b))
        .and_then(|()| image.flush());
    if let Err(e) = r {
        for (&g, &f) in groups.iter().zip(&old) {
            image.set_desc_flags(g, f);
        }
        return Err(e.into());
    }
    Ok(())
}

/// Lazy-init state of a filesystem, for `info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// Groups in the filesystem.
    pub groups: u32,
    /// Groups without `ITABLE_ZEROED`.
    pub groups_not_zeroed: u32,
    /// Of those, groups with `INODE_UNINIT`.
    pub groups_inode_uninit: u32,
    /// Bytes of inode table that lazy init would zero (for groups whose
    /// counts are consistent).
    pub bytes_to_zero: u64,
    /// Groups whose counts lazy init would refuse.
    pub groups_inconsistent: u32,
    /// Why `ext4kit lazyinit` would refuse the filesystem (see
    /// [`refusal`]), if it would.
    pub refusal: Option<String>,
}

/// Count what lazy init has left to do on `image`: the same groups and
/// bytes that [`Job::prepare`] plans (none without group-descriptor
/// checksums, whatever the flags say there).
pub fn status(image: &Image<'_>) -> Status {
    let g = image.geometry();
    let mut st = Status {
        groups: g.group_count,
        ..Status::default()
    };
    if image.desc_checksum() == DescChecksum::None {
        return st;
    }
    st.refusal = refusal(image);
    for group in 0..g.group_count {
        let d = image.desc(group);
        if d.flags() & BG_INODE_ZEROED != 0 {
            continue;
        }
        st.groups_not_zeroed += 1;
        if d.flags() & BG_INODE_UNINIT != 0 {
            st.groups_inode_uninit += 1;
        }
        match plan_group(g, &d, group) {
            Ok(Some(w)) => st.bytes_to_zero += w.byte_range(g).1,
            Ok(None) => {}
            Err(_) => st.groups_inconsistent += 1,
        }
    }
    st
}
