//! Multiple mount protection (INCOMPAT_MMP) at a read-write open, as the
//! kernel's fs/ext4/mmp.c (`ext4_multi_mount_protect`, `kmmpd`) and
//! e2fsprogs' lib/ext2fs/mmp.c (`ext2fs_mmp_start`/`_stop`) do it:
//!
//! - **Start** ([`Mmp::start`], before the journal is replayed): read the
//!   MMP block (magic and, with metadata_csum, checksum checked). Its
//!   sequence `EXT4_MMP_SEQ_FSCK` refuses at once (e2fsck has it). A
//!   sequence other than `EXT4_MMP_SEQ_CLEAN` may be a live node: wait
//!   `min(2 * check + 1, check + 60)` seconds (`check`: the superblock's
//!   update interval, at least 5, or the block's check interval when
//!   larger) and refuse if it changed. Then write a new random sequence
//!   (at most `EXT4_MMP_SEQ_MAX`) with our node and device name and the
//!   time; when the block was not clean, wait the same time again and
//!   refuse if someone else wrote since (the kernel's `wait_time` is
//!   still 0 on the clean path: a clean open does not wait). A refusal is one line
//!   ([`FsError::InUse`]) naming the node, and writes nothing (the
//!   second check's refusal leaves the other node's sequence).
//! - **While open**: a thread (`kmmpd`) writes sequence + 1 and the time
//!   every `s_mmp_update_interval` seconds (at least 1), first checking
//!   that the block still holds what it wrote last; if not, another node
//!   has the device: the thread stops and the filesystem becomes
//!   read-only ([`Mmp::lost`]), nothing more goes to the MMP block.
//! - **Close** ([`Mmp::stop`]): the thread stops and
//!   `EXT4_MMP_SEQ_CLEAN` is written. A drop without `stop` after the
//!   open's in-use marks went to disk leaves the live sequence (a power
//!   cut or a kill does the same: the next open waits it out); before
//!   them (an open that gave up) it writes the clean sequence.
//!
//! The wait is real time. `EXT4KIT_MMP_WAIT_MS` (a test hook) replaces
//! the computed wait of both checks with that many milliseconds; it must
//! stay above the update interval of a live node for the check to see
//! it.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ext4kit_device::Device;
use ext4kit_format::Csum;
use ext4kit_format::features::{Incompat, RoCompat};
use ext4kit_format::mmp::{
    self, MMP_CHECK_INTERVAL_OFFSET, MMP_MAGIC, MMP_SEQ_CLEAN, MMP_SEQ_FSCK, MMP_SEQ_MAX,
    MMP_STRUCT_SIZE,
};
use ext4kit_format::superblock::Superblock;

use crate::FsError;

/// The test hook's environment variable (see the module docs).
pub const WAIT_ENV: &str = "EXT4KIT_MMP_WAIT_MS";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A random live sequence number (`mmp_new_seq`).
fn new_seq() -> u32 {
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        let s = h.finish() as u32;
        if s != 0 && s <= MMP_SEQ_MAX {
            return s;
        }
    }
}

fn nodename() -> Vec<u8> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim_end_matches('\n').as_bytes().to_vec())
        .unwrap_or_default()
}

fn now() -> u64 {
    ext4kit_device::host::realtime_coarse_secs()
}

struct State {
    /// The block as we last wrote it.
    buf: Vec<u8>,
    stop: bool,
    /// Why the device is no longer ours (another node wrote the block).
    lost: Option<String>,
}

struct Shared {
    dev: Arc<dyn Device>,
    offset: u64,
    seed: Option<u32>,
    interval: Duration,
    st: Mutex<State>,
    cv: Condvar,
}

impl Shared {
    fn read(&self) -> Result<Vec<u8>, FsError> {
        let mut b = vec![0u8; lock(&self.st).buf.len()];
        self.dev.read_at(&mut b, self.offset)?;
        Ok(b)
    }

    fn write(&self, b: &mut [u8]) -> Result<(), FsError> {
        if let Some(seed) = self.seed {
            mmp::set_checksum(seed, b);
        }
        self.dev.write_at(b, self.offset)?;
        self.dev.flush()?;
        Ok(())
    }

    /// `kmmpd`: one update every interval until told to stop.
    fn run(&self) {
        let mut st = lock(&self.st);
        loop {
            let until = Instant::now() + self.interval;
            while !st.stop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = self
                    .cv
                    .wait_timeout(st, left)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            if st.stop {
                return;
            }
            let mine = seq_of(&st.buf);
            drop(st);
            let disk = self.read();
            st = lock(&self.st);
            match disk {
                Ok(d) if seq_of(&d) != mine => {
                    let why = format!(
                        "the MMP block was written by another node ({}): the filesystem seems to be mounted twice",
                        describe(&d)
                    );
                    tracing::error!("{}: {why}", self.dev.name());
                    st.lost = Some(why);
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("{}: error reading the MMP block: {e}", self.dev.name());
                    continue;
                }
            }
            let next = if mine >= MMP_SEQ_MAX { 1 } else { mine + 1 };
            let mut b = st.buf.clone();
            b[4..8].copy_from_slice(&next.to_le_bytes());
            b[8..16].copy_from_slice(&now().to_le_bytes());
            match self.write(&mut b) {
                Ok(()) => st.buf = b,
                Err(e) => tracing::warn!("{}: error writing the MMP block: {e}", self.dev.name()),
            }
        }
    }
}

fn seq_of(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[4], b[5], b[6], b[7]])
}

fn describe(b: &[u8]) -> String {
    match mmp::parse(b) {
        Some(v) => {
            let node = if v.nodename.is_empty() {
                "?".into()
            } else {
                v.nodename
            };
            if v.bdevname.is_empty() {
                format!("node {node}")
            } else {
                format!("node {node}, device {}", v.bdevname)
            }
        }
        None => "node ?".into(),
    }
}

/// Multiple mount protection held by one read-write open (see the module
/// docs).
pub struct Mmp {
    sh: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Cleared once the open's in-use marks are on disk: a drop then
    /// leaves the live sequence.
    clean_on_drop: AtomicBool,
    stopped: AtomicBool,
}

impl Mmp {
    /// Start protection if `sb` has the mmp feature (`Ok(None)` if not).
    pub fn start(dev: Arc<dyn Device>, sb: &Superblock) -> Result<Option<Mmp>, FsError> {
        let wait = std::env::var(WAIT_ENV)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis);
        Self::start_with_wait(dev, sb, wait)
    }

    /// [`Mmp::start`] with the wait given (`None`: the kernel's rule).
    pub fn start_with_wait(
        dev: Arc<dyn Device>,
        sb: &Superblock,
        wait: Option<Duration>,
    ) -> Result<Option<Mmp>, FsError> {
        if !Incompat(sb.s_feature_incompat.get()).contains(Incompat::MMP) {
            return Ok(None);
        }
        let bs = sb
            .block_size()
            .ok_or_else(|| FsError::corrupt("superblock", "block size out of range"))?;
        let block = sb.s_mmp_block.get();
        let blocks = sb.blocks_count();
        if block < u64::from(sb.s_first_data_block.get()) || block >= blocks {
            return Err(FsError::corrupt(
                "MMP block",
                format!("block number {block} is outside the filesystem"),
            ));
        }
        let seed = RoCompat(sb.s_feature_ro_compat.get())
            .contains(RoCompat::METADATA_CSUM)
            .then(|| Csum::from_superblock(sb).seed);
        let update = sb.s_mmp_interval.get();
        let sh = Arc::new(Shared {
            dev,
            offset: block * u64::from(bs),
            seed,
            interval: Duration::from_secs(u64::from(update.max(1))),
            st: Mutex::new(State {
                buf: vec![0u8; (bs as usize).max(MMP_STRUCT_SIZE)],
                stop: false,
                lost: None,
            }),
            cv: Condvar::new(),
        });
        let check = |b: &[u8]| -> Result<(), FsError> {
            let v = mmp::parse(b).ok_or_else(|| FsError::corrupt("MMP block", "short"))?;
            if v.magic != MMP_MAGIC {
                return Err(FsError::corrupt(
                    "MMP block",
                    format!("bad magic {:#x} (run e2fsck)", v.magic),
                ));
            }
            if let Some(s) = seed
                && v.checksum != mmp::checksum(s, b)
            {
                return Err(FsError::corrupt(
                    "MMP block",
                    "checksum does not match (run e2fsck)",
                ));
            }
            Ok(())
        };
        let b = sh.read()?;
        check(&b)?;
        let block_check = u16::from_le_bytes([
            b[MMP_CHECK_INTERVAL_OFFSET],
            b[MMP_CHECK_INTERVAL_OFFSET + 1],
        ]);
        let wait = match wait {
            Some(w) => w,
            None => Duration::from_secs(u64::from(mmp::wait_secs(mmp::check_interval(
                update,
                block_check,
            )))),
        };
        let seq = seq_of(&b);
        if seq == MMP_SEQ_FSCK {
            return Err(FsError::InUse(format!(
                "{}: device is in use by {} (mmp: fsck is running)",
                sh.dev.name(),
                describe(&b)
            )));
        }
        if seq != MMP_SEQ_CLEAN {
            tracing::info!(
                "{}: MMP block in use (sequence {seq:#x}), waiting {} ms",
                sh.dev.name(),
                wait.as_millis()
            );
            std::thread::sleep(wait);
            let again = sh.read()?;
            check(&again)?;
            if seq_of(&again) != seq {
                return Err(FsError::InUse(format!(
                    "{}: device is in use by {} (mmp)",
                    sh.dev.name(),
                    describe(&again)
                )));
            }
        }
        let mine = new_seq();
        let mut nb = b.clone();
        mmp::set_fields(&mut nb, mine, now(), &nodename(), sh.dev.name().as_bytes());
        // kmmpd's starting check interval: 2 * update, at least 5.
        let ci = (2 * update).max(ext4kit_format::mmp::MMP_MIN_CHECK_INTERVAL);
        nb[MMP_CHECK_INTERVAL_OFFSET..MMP_CHECK_INTERVAL_OFFSET + 2]
            .copy_from_slice(&ci.to_le_bytes());
        sh.write(&mut nb)?;
        // The kernel's second wait is `wait_time`, still 0 when the
        // block was clean (measured: a clean mmp mount takes
        // milliseconds); e2fsprogs waits here always.
        if seq != MMP_SEQ_CLEAN {
            std::thread::sleep(wait);
        }
        let after = sh.read()?;
        if seq_of(&after) != mine {
            return Err(FsError::InUse(format!(
                "{}: device is in use by {} (mmp)",
                sh.dev.name(),
                describe(&after)
            )));
        }
        lock(&sh.st).buf = nb;
        let t = sh.clone();
        let thread = std::thread::Builder::new()
            .name("ext4kit-kmmpd".into())
            .spawn(move || t.run())
            .map_err(|e| FsError::InvalidRequest(format!("cannot start the MMP thread: {e}")))?;
        Ok(Some(Mmp {
            sh,
            thread: Mutex::new(Some(thread)),
            clean_on_drop: AtomicBool::new(true),
            stopped: AtomicBool::new(false),
        }))
    }

    /// The open's marks are on disk: from now on a drop leaves the live
    /// sequence (as a crash would).
    pub fn keep_on_drop(&self) {
        self.clean_on_drop.store(false, Ordering::Release);
    }

    /// `Some(why)` once another node took the device.
    pub fn lost(&self) -> Option<String> {
        lock(&self.sh.st).lost.clone()
    }

    fn halt(&self) {
        lock(&self.sh.st).stop = true;
        self.sh.cv.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// Stop the updates and write the clean sequence (not if another
    /// node took the device). Idempotent.
    pub fn stop(&self) -> Result<(), FsError> {
        self.halt();
        if self.stopped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let mut b = {
            let st = lock(&self.sh.st);
            if st.lost.is_some() {
                return Ok(());
            }
            st.buf.clone()
        };
        b[4..8].copy_from_slice(&MMP_SEQ_CLEAN.to_le_bytes());
        b[8..16].copy_from_slice(&now().to_le_bytes());
        self.sh.write(&mut b)
    }

    /// Stop the updates without writing anything (a crash).
    pub fn abandon(&self) {
        self.halt();
        self.stopped.store(true, Ordering::Release);
    }
}

impl Drop for Mmp {
    fn drop(&mut self) {
        if self.clean_on_drop.load(Ordering::Acquire) {
            let _ = self.stop();
        } else {
            self.abandon();
        }
    }
}
