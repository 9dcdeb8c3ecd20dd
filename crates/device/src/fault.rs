//! [`FaultDevice`]: a wrapper that injects I/O errors and power cuts, for
//! crash-safety tests.

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ranges::{subtract, union};
use crate::{Device, DeviceError, DiscardOutcome, Result, check_range};

const NO_LIMIT: u64 = u64::MAX;

const RUNNING: u8 = 0;
const FAILED: u8 = 1;
const POWER_LOST: u8 = 2;

/// Shared controls and counters of a [`FaultDevice`].
///
/// Hold it (an `Arc`) while the device itself is boxed away. Mutating
/// operations are `write_at`, `zeroout`, `discard` and `flush`; only
/// successful ones are counted. Limits are relative to the count at the
/// moment they are set.
#[derive(Debug)]
pub struct FaultControl {
    ops: AtomicU64,
    flushes: AtomicU64,
    fail_at: AtomicU64,
    power_cut_at: AtomicU64,
    state: AtomicU8,
    cut_mode: Mutex<CutMode>,
}

/// What a power cut does to the writes buffered since the last flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CutMode {
    /// Every unflushed write, zeroout and discard is lost.
    #[default]
    DropAll,
    /// A disk's volatile cache: an arbitrary subset of the unflushed
    /// operations survives, applied in an arbitrary order, both chosen by
    /// `seed`. With `torn`, each surviving write is cut into 512-byte
    /// sectors (of the device's address space) of which again an arbitrary
    /// subset survives.
    Subset { seed: u64, torn: bool },
}

/// Sector size at which [`CutMode::Subset`] tears writes.
pub const TEAR_SECTOR: u64 = 512;

/// A small deterministic PRNG (splitmix64): no dependency, same sequence
/// on every platform.
#[derive(Clone, Debug)]
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

impl Default for FaultControl {
    fn default() -> Self {
        FaultControl {
            ops: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            fail_at: AtomicU64::new(NO_LIMIT),
            power_cut_at: AtomicU64::new(NO_LIMIT),
            state: AtomicU8::new(RUNNING),
            cut_mode: Mutex::new(CutMode::DropAll),
        }
    }
}

impl FaultControl {
    /// A fresh control: no limits, counters at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A fresh control whose operation counter starts at `ops`, as if
    /// that many operations had happened already: a device continuing a
    /// recorded run (`crate::CutReplay`) then counts, and seeds its
    /// [`CutMode::Subset`] choices, exactly as one that ran the whole of
    /// it.
    pub fn starting_at(ops: u64) -> Arc<Self> {
        let c = Self::default();
        c.ops.store(ops, Ordering::SeqCst);
        Arc::new(c)
    }

    /// After `n` more successful mutating operations, every further
    /// operation (reads included) fails with [`DeviceError::Injected`].
    /// Unflushed writes stay buffered (not applied to the inner device).
    pub fn fail_after(&self, n: u64) {
        let now = self.ops();
        self.fail_at.store(now.saturating_add(n), Ordering::SeqCst);
    }

    /// After `n` more successful mutating operations the device loses
    /// power: every write, zeroout and discard since the last successful
    /// flush is dropped (never reaches the inner device), or with
    /// [`CutMode::Subset`] an arbitrary part of them reaches it, and every
    /// further operation fails with [`DeviceError::Injected`]. `n = 0`
    /// cuts at the next operation.
    pub fn power_cut_after(&self, n: u64) {
        let now = self.ops();
        self.power_cut_at
            .store(now.saturating_add(n), Ordering::SeqCst);
    }

    /// Choose what the next power cuts do to unflushed writes (default
    /// [`CutMode::DropAll`]).
    pub fn set_cut_mode(&self, mode: CutMode) {
        *self.cut_mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// The current [`CutMode`].
    pub fn cut_mode(&self) -> CutMode {
        *self.cut_mode.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cut the power now (takes effect at the device's next operation,
    /// which is indistinguishable since unflushed data never reached the
    /// inner device).
    pub fn cut_power(&self) {
        self.state.store(POWER_LOST, Ordering::SeqCst);
    }

    /// Remove both limits and clear a tripped failure or power cut, so that
    /// the device works again (writes dropped by a power cut stay lost;
    /// writes buffered when `fail_after` tripped can still be flushed).
    /// Counters are kept.
    pub fn reset(&self) {
        self.fail_at.store(NO_LIMIT, Ordering::SeqCst);
        self.power_cut_at.store(NO_LIMIT, Ordering::SeqCst);
        self.state.store(RUNNING, Ordering::SeqCst);
    }

    /// Successful mutating operations so far (writes, zeroouts, discards,
    /// flushes).
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Successful flushes so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Has a `fail_after` limit tripped?
    pub fn is_failed(&self) -> bool {
        self.state.load(Ordering::SeqCst) == FAILED
    }

    /// Has the power been cut?
    pub fn is_power_lost(&self) -> bool {
        self.state.load(Ordering::SeqCst) == POWER_LOST
    }
}

/// A mutating operation not yet flushed to the inner device.
#[derive(Debug, Clone)]
enum Pending {
    Write {
        offset: u64,
        data: Vec<u8>,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    /// `zeroed`: the caller was told [`DiscardOutcome::Zeroed`].
    Discard {
        offset: u64,
        len: u64,
        zeroed: bool,
    },
}

impl Pending {
    /// `(offset, len)` of the affected bytes.
    fn span(&self) -> (u64, u64) {
        match self {
            Pending::Write { offset, data } => (*offset, data.len() as u64),
            Pending::Zero { offset, len } | Pending::Discard { offset, len, .. } => (*offset, *len),
        }
    }

    /// `(start, end)` of the affected bytes; only for operations that passed
    /// the range check (so the end does not overflow).
    fn range(&self) -> (u64, u64) {
        let (offset, len) = self.span();
        (offset, offset + len)
    }
}

/// A device wrapper for crash-safety tests.
///
/// Writes, zeroouts and discards are buffered in an ordered log inside the
/// wrapper ("volatile cache") and reach the inner device only at
/// [`Device::flush`], in order; reads see the buffered operations overlaid
/// on the inner content. Dropping the wrapper (or a power cut) loses the
/// buffer, so the inner device always holds exactly what was flushed; with
/// [`CutMode::Subset`] a power cut instead lets an arbitrary subset of the
/// buffer reach the inner device in an arbitrary order, optionally torn at
/// [`TEAR_SECTOR`] granularity (what a disk's volatile write cache may do).
///
/// Faults are driven through the shared [`FaultControl`]:
///
/// ```
/// use std::sync::Arc;
/// use ext4kit_device::{Device, FaultDevice, MemDevice};
///
/// let mem = Arc::new(MemDevice::new(1 << 20));
/// let dev = FaultDevice::new(mem.clone());
/// let ctl = dev.control();
/// ctl.power_cut_after(2);
/// dev.write_at(b"a", 0).unwrap();
/// dev.flush().unwrap();
/// dev.write_at(b"b", 1).unwrap_err(); // third op: the power is out
/// assert_eq!(&mem.to_bytes()[..2], b"a\0");
/// ```
///
/// Discards are reported as [`DiscardOutcome::Zeroed`] when the inner device
/// says discards zero data, else [`DiscardOutcome::Discarded`]; either way
/// they read back as zeros until flushed.
pub struct FaultDevice<D> {
    inner: D,
    control: Arc<FaultControl>,
    log: Mutex<Vec<Pending>>,
}

impl<D: Device> fmt::Debug for FaultDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultDevice")
            .field("inner", &self.inner.name())
            .field("control", &self.control)
            .field("pending", &self.lock().len())
            .finish()
    }
}

impl<D: Device> FaultDevice<D> {
    /// Wrap `inner` with a fresh [`FaultControl`].
    pub fn new(inner: D) -> Self {
        Self::with_control(inner, FaultControl::new())
    }

    /// Wrap `inner`, driven by an existing control.
    pub fn with_control(inner: D, control: Arc<FaultControl>) -> Self {
        FaultDevice {
            inner,
            control,
            log: Mutex::new(Vec::new()),
        }
    }

    /// The shared control handle.
    pub fn control(&self) -> Arc<FaultControl> {
        Arc::clone(&self.control)
    }

    /// The inner device (holding only flushed data).
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Unwrap, dropping every unflushed operation.
    pub fn into_inner(self) -> D {
        self.inner
    }

    /// Number of buffered, unflushed operations.
    pub fn pending_ops(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Pending>> {
        // The log is only ever pushed to or drained from the front; a panic
        // elsewhere cannot leave it inconsistent.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gate every operation: fail if a fault has tripped or trips now.
    fn gate(&self, log: &mut Vec<Pending>) -> Result<()> {
        let c = &self.control;
        let ops = c.ops();
        if c.state.load(Ordering::SeqCst) == POWER_LOST
            || ops >= c.power_cut_at.load(Ordering::SeqCst)
        {
            self.lose_power(log);
            return Err(DeviceError::Injected("power cut"));
        }
        if c.state.load(Ordering::SeqCst) == FAILED || ops >= c.fail_at.load(Ordering::SeqCst) {
            c.state.store(FAILED, Ordering::SeqCst);
            return Err(DeviceError::Injected("I/O error (fail_after)"));
        }
        Ok(())
    }

    /// Count a successful mutating operation; cut the power right away if
    /// that was the last one allowed.
    fn count(&self, log: &mut Vec<Pending>) {
        let c = &self.control;
        let ops = c.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if ops >= c.power_cut_at.load(Ordering::SeqCst) {
            self.lose_power(log);
        }
    }

    /// The power goes out: the volatile cache (`log`) is lost, except
    /// what [`CutMode::Subset`] lets survive. Idempotent: a second call
    /// finds the log empty.
    fn lose_power(&self, log: &mut Vec<Pending>) {
        let c = &self.control;
        c.state.store(POWER_LOST, Ordering::SeqCst);
        let pending = std::mem::take(log);
        let CutMode::Subset { seed, torn } = c.cut_mode() else {
            return;
        };
        let mut rng = SplitMix(seed ^ (c.ops() << 32) ^ pending.len() as u64);
        let mut survivors: Vec<Pending> = Vec::new();
        for op in pending {
            if !rng.coin() {
                continue;
            }
            match op {
                Pending::Write { offset, data } if torn => {
                    // Cut at sector boundaries of the address space.
                    let mut pos = offset;
                    let end = offset + data.len() as u64;
                    while pos < end {
                        let next = ((pos / TEAR_SECTOR) + 1) * TEAR_SECTOR;
                        let next = next.min(end);
                        if rng.coin() {
                            let a = (pos - offset) as usize;
                            let b = (next - offset) as usize;
                            survivors.push(Pending::Write {
                                offset: pos,
                                data: data[a..b].to_vec(),
                            });
                        }
                        pos = next;
                    }
                }
                op => survivors.push(op),
            }
        }
        // Fisher-Yates: any order.
        for i in (1..survivors.len()).rev() {
            let j = rng.below(i + 1);
            survivors.swap(i, j);
        }
        for op in &survivors {
            // The inner device is what "the platter" holds; a failure to
            // write it is a test-harness problem, not the device's fault
            // model, so it is ignored like the rest of the lost cache.
            let _ = self.apply(op);
        }
    }

    fn buffer(&self, op: Pending) -> Result<()> {
        let (offset, len) = op.span();
        check_range(offset, len, self.inner.size())?;
        let mut log = self.lock();
        self.gate(&mut log)?;
        log.push(op);
        self.count(&mut log);
        Ok(())
    }

    /// Apply one buffered operation to the inner device.
    fn apply(&self, op: &Pending) -> Result<()> {
        match op {
            Pending::Write { offset, data } => self.inner.write_at(data, *offset),
            Pending::Zero { offset, len } => self.inner.zeroout(*offset, *len),
            Pending::Discard {
                offset,
                len,
                zeroed,
            } => {
                let outcome = self.inner.discard(*offset, *len)?;
                if *zeroed && outcome != DiscardOutcome::Zeroed {
                    self.inner.zeroout(*offset, *len)?;
                }
                Ok(())
            }
        }
    }
}

impl<D: Device> Device for FaultDevice<D> {
    // start_writeback and is_known_zero: the defaults (writes are
    // buffered here; the known-zero ranges include them).
    crate::forward_device!(inner; read_at, write_at, flush, start_writeback, zeroout, discard, known_zero_ranges, is_known_zero, name);

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut log = self.lock();
        self.gate(&mut log)?;
        self.inner.read_at(buf, offset)?;
        let rs = offset;
        let re = offset + buf.len() as u64;
        for op in log.iter() {
            let (s, e) = op.range();
            let (is, ie) = (s.max(rs), e.min(re));
            if is >= ie {
                continue;
            }
            let dst = &mut buf[(is - rs) as usize..(ie - rs) as usize];
            match op {
                Pending::Write { data, .. } => {
                    dst.copy_from_slice(&data[(is - s) as usize..(ie - s) as usize])
                }
                Pending::Zero { .. } | Pending::Discard { .. } => dst.fill(0),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.buffer(Pending::Write {
            offset,
            data: buf.to_vec(),
        })
    }

    /// Apply the buffered operations to the inner device in order, then
    /// flush it.
    fn flush(&self) -> Result<()> {
        let mut log = self.lock();
        self.gate(&mut log)?;
        let mut applied = 0;
        let result = log.iter().try_for_each(|op| {
            self.apply(op)?;
            applied += 1;
            Ok(())
        });
        log.drain(..applied);
        result?;
        self.inner.flush()?;
        self.control.flushes.fetch_add(1, Ordering::SeqCst);
        self.count(&mut log);
        Ok(())
    }

    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        self.buffer(Pending::Zero { offset, len })
    }

    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        let zeroed = self.inner.discard_zeroes_data();
        self.buffer(Pending::Discard {
            offset,
            len,
            zeroed,
        })?;
        Ok(if zeroed {
            DiscardOutcome::Zeroed
        } else {
            DiscardOutcome::Discarded
        })
    }

    /// The inner device's known-zero ranges with the buffered operations
    /// applied in order (writes remove, zeroouts and discards add).
    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut log = self.lock();
        self.gate(&mut log)?;
        let mut ranges = self.inner.known_zero_ranges(offset, len)?;
        let qe = offset.saturating_add(len);
        for op in log.iter() {
            let (s, e) = op.range();
            let (s, e) = (s.max(offset), e.min(qe));
            match op {
                Pending::Write { .. } => subtract(&mut ranges, s, e),
                Pending::Zero { .. } | Pending::Discard { .. } => union(&mut ranges, s, e),
            }
        }
        Ok(ranges)
    }

    fn name(&self) -> String {
        format!("fault({})", self.inner.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn setup(
        size: u64,
    ) -> (
        Arc<MemDevice>,
        FaultDevice<Arc<MemDevice>>,
        Arc<FaultControl>,
    ) {
        let mem = Arc::new(MemDevice::new(size));
        let dev = FaultDevice::new(Arc::clone(&mem));
        let ctl = dev.control();
        (mem, dev, ctl)
    }

    fn injected<T: fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(DeviceError::Injected(_)))
    }

    #[test]
    fn writes_are_buffered_until_flush() {
        let (mem, dev, ctl) = setup(16384);
        dev.write_at(b"hello", 10).unwrap();
        dev.zeroout(12, 1).unwrap();
        let mut b = [0u8; 5];
        dev.read_at(&mut b, 10).unwrap();
        assert_eq!(&b, b"he\0lo");
        assert_eq!(mem.to_bytes()[10..15], [0; 5]);
        assert_eq!(dev.pending_ops(), 2);
        dev.flush().unwrap();
        assert_eq!(&mem.to_bytes()[10..15], b"he\0lo");
        assert_eq!(dev.pending_ops(), 0);
        assert_eq!((ctl.ops(), ctl.flushes()), (3, 1));
        // Out-of-range writes fail at once and are not counted.
        assert!(matches!(
            dev.write_at(b"x", 16384),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.zeroout(1, u64::MAX),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert_eq!(ctl.ops(), 3);
    }

    #[test]
    fn fail_after_n_ops() {
        let (mem, dev, ctl) = setup(8192);
        ctl.fail_after(3);
        dev.write_at(b"a", 0).unwrap();
        dev.flush().unwrap();
        dev.write_at(b"b", 1).unwrap();
        assert!(!ctl.is_failed());
        assert!(injected(dev.write_at(b"c", 2)));
        assert!(ctl.is_failed());
        assert!(injected(dev.flush()));
        assert!(injected(dev.read_at(&mut [0u8; 1], 0)));
        assert!(injected(dev.zeroout(0, 1)));
        assert_eq!(ctl.ops(), 3);
        assert_eq!(&mem.to_bytes()[..3], b"a\0\0");
        // After a reset the buffered write can still be flushed.
        ctl.reset();
        dev.flush().unwrap();
        assert_eq!(&mem.to_bytes()[..3], b"ab\0");
    }

    #[test]
    fn power_cut_drops_exactly_the_unflushed_writes() {
        let (mem, dev, ctl) = setup(8192);
        ctl.power_cut_after(4);
        dev.write_at(b"a", 0).unwrap();
        dev.write_at(b"b", 1).unwrap();
        dev.flush().unwrap();
        dev.write_at(b"c", 2).unwrap(); // 4th op: power goes out after it
        assert!(ctl.is_power_lost());
        assert_eq!(dev.pending_ops(), 0);
        assert!(injected(dev.read_at(&mut [0u8; 1], 0)));
        assert!(injected(dev.flush()));
        assert_eq!(&mem.to_bytes()[..3], b"ab\0");
        assert_eq!((ctl.ops(), ctl.flushes()), (4, 1));
        // Reset: the device works again but "c" is gone for good.
        ctl.reset();
        dev.flush().unwrap();
        assert_eq!(&mem.to_bytes()[..3], b"ab\0");
    }

    #[test]
    fn power_cut_sweep() {
        // The intended pattern: run a workload with a power cut after k ops
        // for every k, then inspect the inner device.
        fn workload(dev: &dyn Device) -> Result<()> {
            dev.write_at(b"journal", 0)?;
            dev.flush()?;
            dev.write_at(b"data", 100)?;
            dev.discard(4096, 4096)?;
            dev.flush()?;
            dev.write_at(b"commit", 200)?;
            dev.flush()
        }
        let total = {
            let (_, dev, ctl) = setup(16384);
            workload(&dev).unwrap();
            ctl.ops()
        };
        assert_eq!(total, 7);
        for k in 0..=total {
            let mem = Arc::new(MemDevice::from_bytes(vec![0x55; 16384]));
            let dev = FaultDevice::new(Arc::clone(&mem));
            dev.control().power_cut_after(k);
            let boxed: Box<dyn Device> = Box::new(dev);
            let r = workload(&*boxed);
            assert_eq!(r.is_ok(), k == total, "k={k}");
            let b = mem.to_bytes();
            let has = |off: usize, s: &[u8]| &b[off..off + s.len()] == s;
            assert_eq!(has(0, b"journal"), k >= 2, "k={k}");
            assert_eq!(has(100, b"data"), k >= 5, "k={k}");
            assert_eq!(b[4096..8192].iter().all(|&x| x == 0), k >= 5, "k={k}");
            assert_eq!(has(200, b"commit"), k >= 7, "k={k}");
        }
    }

    /// Run 8 unflushed one-sector-aligned 1 KiB writes after a flushed
    /// base, cut the power in `mode`, and return the inner bytes.
    fn cut_with(mode: CutMode) -> Vec<u8> {
        let (mem, dev, ctl) = setup(16384);
        dev.write_at(&[0xAA; 16384], 0).unwrap();
        dev.flush().unwrap();
        ctl.set_cut_mode(mode);
        for i in 0..8u8 {
            dev.write_at(&[i + 1; 1024], u64::from(i) * 1024).unwrap();
        }
        // Overlapping rewrite of the first write: order matters.
        dev.write_at(&[0x77; 1024], 0).unwrap();
        ctl.cut_power();
        assert!(injected(dev.read_at(&mut [0u8; 1], 0)));
        assert_eq!(dev.pending_ops(), 0);
        mem.to_bytes()
    }

    #[test]
    fn subset_cut_keeps_an_arbitrary_subset_in_any_order() {
        // DropAll: only the flushed base.
        assert!(cut_with(CutMode::DropAll).iter().all(|&b| b == 0xAA));
        let mut seen_some = false;
        let mut seen_partial = false;
        let mut seen_old_over_new = false;
        let mut outcomes = std::collections::HashSet::new();
        for seed in 0..64 {
            let b = cut_with(CutMode::Subset { seed, torn: false });
            // Deterministic for a seed.
            assert_eq!(b, cut_with(CutMode::Subset { seed, torn: false }));
            // The flushed part past the writes is intact.
            assert!(b[8192..].iter().all(|&x| x == 0xAA));
            let mut kept = 0;
            for i in 0..8usize {
                let chunk = &b[i * 1024..(i + 1) * 1024];
                let v = chunk[0];
                // Untorn: each write is all there or not at all.
                assert!(chunk.iter().all(|&x| x == v), "seed {seed} chunk {i}");
                let ok = v == 0xAA || v == i as u8 + 1 || (i == 0 && v == 0x77);
                assert!(ok, "seed {seed} chunk {i}: {v:#x}");
                if v != 0xAA {
                    kept += 1;
                }
                if i == 0 && v == 1 {
                    seen_old_over_new |= true;
                }
            }
            seen_some |= kept > 0;
            seen_partial |= kept > 0 && kept < 8;
            outcomes.insert(b);
        }
        assert!(seen_some && seen_partial);
        assert!(outcomes.len() > 16, "only {} outcomes", outcomes.len());
        // Some seed applied the old write of block 0 after the newer one
        // (or dropped the newer one): arbitrary order.
        assert!(seen_old_over_new);
    }

    #[test]
    fn torn_cut_tears_at_sector_granularity() {
        let mut seen_torn = false;
        for seed in 0..32 {
            let b = cut_with(CutMode::Subset { seed, torn: true });
            for i in 0..8usize {
                let mut sectors = Vec::new();
                for s in 0..2 {
                    let off = i * 1024 + s * 512;
                    let sec = &b[off..off + 512];
                    assert!(sec.iter().all(|&x| x == sec[0]), "seed {seed}");
                    sectors.push(sec[0]);
                }
                seen_torn |= sectors[0] != sectors[1];
            }
        }
        assert!(seen_torn);
    }

    #[test]
    fn subset_cut_never_touches_flushed_or_unwritten_bytes_and_reset_works() {
        let (mem, dev, ctl) = setup(8192);
        ctl.set_cut_mode(CutMode::Subset {
            seed: 7,
            torn: true,
        });
        dev.write_at(b"durable", 0).unwrap();
        dev.flush().unwrap();
        ctl.power_cut_after(3);
        dev.write_at(b"x", 4096).unwrap();
        dev.write_at(b"y", 4097).unwrap();
        dev.write_at(b"z", 4098).unwrap(); // third op: cut after it
        assert!(ctl.is_power_lost());
        let b = mem.to_bytes();
        assert_eq!(&b[..7], b"durable");
        assert!(b[4099..].iter().all(|&x| x == 0));
        for (i, c) in [b'x', b'y', b'z'].into_iter().enumerate() {
            assert!(b[4096 + i] == 0 || b[4096 + i] == c);
        }
        ctl.reset();
        dev.write_at(b"again", 100).unwrap();
        dev.flush().unwrap();
        assert_eq!(&mem.to_bytes()[100..105], b"again");
    }

    #[test]
    fn known_zero_overlay() {
        let (_mem, dev, _ctl) = setup(16384);
        assert_eq!(dev.known_zero_ranges(0, 16384).unwrap(), vec![(0, 16384)]);
        dev.write_at(&[1u8; 10], 4096).unwrap();
        assert_eq!(
            dev.known_zero_ranges(0, 16384).unwrap(),
            vec![(0, 4096), (4106, 16384)]
        );
        dev.zeroout(4096, 5).unwrap();
        assert_eq!(
            dev.known_zero_ranges(0, 16384).unwrap(),
            vec![(0, 4101), (4106, 16384)]
        );
        dev.flush().unwrap();
        // After the flush the inner device only knows about whole chunks.
        assert_eq!(
            dev.known_zero_ranges(0, 16384).unwrap(),
            vec![(0, 4096), (8192, 16384)]
        );
        assert_eq!(dev.discard(4096, 4096).unwrap(), DiscardOutcome::Zeroed);
        assert!(dev.is_known_zero(0, 16384).unwrap());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        const SIZE: u64 = 6 * 4096;

        #[derive(Debug, Clone)]
        enum Op {
            Write(u64, Vec<u8>),
            Zero(u64, u64),
            Discard(u64, u64),
            Flush,
            Read(u64, u64),
            KnownZero(u64, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            let span = (0..SIZE).prop_flat_map(|o| (Just(o), 0..=(SIZE - o).min(9000)));
            prop_oneof![
                (0..SIZE, proptest::collection::vec(0u8..3, 0..6000)).prop_map(|(o, d)| {
                    let n = d.len().min((SIZE - o) as usize);
                    Op::Write(o, d[..n].to_vec())
                }),
                span.clone().prop_map(|(o, l)| Op::Zero(o, l)),
                span.clone().prop_map(|(o, l)| Op::Discard(o, l)),
                Just(Op::Flush),
                span.clone().prop_map(|(o, l)| Op::Read(o, l)),
                span.prop_map(|(o, l)| Op::KnownZero(o, l)),
            ]
        }

        proptest! {
            /// FaultDevice over MemDevice behaves like a flat byte array,
            /// known-zero ranges are truthful, and the inner device holds
            /// exactly the state as of the last flush.
            #[test]
            fn matches_flat_model(ops in proptest::collection::vec(op(), 1..40)) {
                let mem = Arc::new(MemDevice::new(SIZE));
                let dev = FaultDevice::new(Arc::clone(&mem));
                let mut model = vec![0u8; SIZE as usize];
                let mut flushed = model.clone();
                for op in ops {
                    match op {
                        Op::Write(o, d) => {
                            dev.write_at(&d, o).unwrap();
                            model[o as usize..o as usize + d.len()].copy_from_slice(&d);
                        }
                        Op::Zero(o, l) => {
                            dev.zeroout(o, l).unwrap();
                            model[o as usize..(o + l) as usize].fill(0);
                        }
                        Op::Discard(o, l) => {
                            prop_assert_eq!(dev.discard(o, l).unwrap(), DiscardOutcome::Zeroed);
                            model[o as usize..(o + l) as usize].fill(0);
                        }
                        Op::Flush => {
                            dev.flush().unwrap();
                            flushed.clone_from(&model);
                        }
                        Op::Read(o, l) => {
                            let mut b = vec![0xffu8; l as usize];
                            dev.read_at(&mut b, o).unwrap();
                            prop_assert_eq!(&b[..], &model[o as usize..(o + l) as usize]);
                        }
                        Op::KnownZero(o, l) => {
                            let r = dev.known_zero_ranges(o, l).unwrap();
                            for w in r.windows(2) {
                                prop_assert!(w[0].1 < w[1].0, "{:?}", r);
                            }
                            for (s, e) in r {
                                prop_assert!(s >= o && e <= o + l && s < e);
                                prop_assert!(model[s as usize..e as usize].iter().all(|&b| b == 0));
                            }
                        }
                    }
                    prop_assert_eq!(mem.to_bytes(), flushed.clone());
                }
            }
        }
    }
}
