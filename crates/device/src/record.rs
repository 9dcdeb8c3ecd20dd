//! [`RecordingDevice`]: a pass-through wrapper that logs every mutating
//! operation in order ([`Trace`]), and [`CutReplay`], which rebuilds from
//! such a log what a [`crate::FaultDevice`] would have left after a power
//! cut at any point of it.
//!
//! Record once, cut many: a workload that is too slow to run once per cut
//! point (a FUSE mount driven by several threads) runs once on a
//! recording device; the image after a power cut following each operation
//! `k` is then built offline, in each [`CutMode`], and checked. Operation
//! indexes are the ones [`crate::FaultControl::power_cut_after`] counts
//! (successful writes, zeroouts, discards and flushes), so "cut after `k`"
//! means the same for both.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{CutMode, Device, DiscardOutcome, FaultControl, FaultDevice, MemDevice, Result};

/// One recorded mutating operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceOp {
    Write { offset: u64, data: Vec<u8> },
    Zeroout { offset: u64, len: u64 },
    Discard { offset: u64, len: u64 },
    Flush,
}

impl TraceOp {
    /// Perform the operation on `dev`.
    pub fn apply(&self, dev: &dyn Device) -> Result<()> {
        match self {
            TraceOp::Write { offset, data } => dev.write_at(data, *offset),
            TraceOp::Zeroout { offset, len } => dev.zeroout(*offset, *len),
            TraceOp::Discard { offset, len } => {
                let outcome = dev.discard(*offset, *len)?;
                // What the recorded device said it did is what it did:
                // keep a replay that reads zeros reading zeros.
                if outcome != DiscardOutcome::Zeroed && dev.discard_zeroes_data() {
                    dev.zeroout(*offset, *len)?;
                }
                Ok(())
            }
            TraceOp::Flush => dev.flush(),
        }
    }
}

/// The ordered log of a [`RecordingDevice`], shared (an `Arc`) with
/// whoever watches the workload: [`Trace::len`] taken after an `fsync`
/// returned is a cut point from which that fsync's data must survive.
#[derive(Default)]
pub struct Trace {
    ops: Mutex<Vec<TraceOp>>,
    len: AtomicU64,
}

impl fmt::Debug for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace").field("ops", &self.len()).finish()
    }
}

impl Trace {
    /// An empty log.
    pub fn new() -> Arc<Trace> {
        Arc::new(Trace::default())
    }

    /// Operations recorded so far (every one of them completed).
    pub fn len(&self) -> u64 {
        self.len.load(Ordering::SeqCst)
    }

    /// Nothing recorded yet?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the log so far.
    pub fn ops(&self) -> Vec<TraceOp> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<TraceOp>> {
        // Only ever pushed to: a panic elsewhere cannot leave it half done.
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A device wrapper that records every successful mutating operation
/// (write, zeroout, discard, flush) in a [`Trace`], in the order they
/// happened, and otherwise passes everything through.
///
/// Mutating operations are serialized (the log's lock is held across the
/// inner call), so the log's order is the order the inner device saw:
/// a flush in the log comes after every write that completed before it
/// started. Reads are not recorded and not serialized. A failed
/// operation is not recorded.
///
/// ```
/// use std::sync::Arc;
/// use ext4kit_device::{CutMode, CutReplay, Device, MemDevice, RecordingDevice};
///
/// let base = MemDevice::new(8192);
/// let dev = RecordingDevice::new(Arc::new(base.snapshot()));
/// let trace = dev.trace();
/// dev.write_at(b"a", 0).unwrap();
/// dev.flush().unwrap();
/// dev.write_at(b"b", 1).unwrap();
/// let ops = trace.ops();
/// let mut r = CutReplay::new(&base, &ops);
/// // After the flush "a" is durable; "b" was never flushed.
/// assert_eq!(&r.cut(3, CutMode::DropAll).to_bytes()[..2], b"a\0");
/// assert_eq!(&r.cut(1, CutMode::DropAll).to_bytes()[..2], b"\0\0");
/// ```
pub struct RecordingDevice<D> {
    inner: D,
    trace: Arc<Trace>,
}

impl<D: Device> fmt::Debug for RecordingDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingDevice")
            .field("inner", &self.inner.name())
            .field("trace", &self.trace)
            .finish()
    }
}

impl<D: Device> RecordingDevice<D> {
    /// Wrap `inner` with a fresh [`Trace`].
    pub fn new(inner: D) -> Self {
        Self::with_trace(inner, Trace::new())
    }

    /// Wrap `inner`, recording into `trace`.
    pub fn with_trace(inner: D, trace: Arc<Trace>) -> Self {
        RecordingDevice { inner, trace }
    }

    /// The shared log.
    pub fn trace(&self) -> Arc<Trace> {
        Arc::clone(&self.trace)
    }

    /// The inner device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Run `f` on the inner device and record `op` if it succeeded.
    fn record<T>(
        &self,
        op: impl FnOnce() -> TraceOp,
        f: impl FnOnce(&D) -> Result<T>,
    ) -> Result<T> {
        let mut log = self.trace.lock();
        let r = f(&self.inner)?;
        log.push(op());
        self.trace.len.store(log.len() as u64, Ordering::SeqCst);
        Ok(r)
    }
}

impl<D: Device> Device for RecordingDevice<D> {
    crate::forward_device!(inner; write_at, flush, zeroout, discard, name);

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.record(
            || TraceOp::Write {
                offset,
                data: buf.to_vec(),
            },
            |d| d.write_at(buf, offset),
        )
    }

    fn flush(&self) -> Result<()> {
        self.record(|| TraceOp::Flush, |d| d.flush())
    }

    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        self.record(
            || TraceOp::Zeroout { offset, len },
            |d| d.zeroout(offset, len),
        )
    }

    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        // An unsupported discard changed nothing: not an operation.
        let mut log = self.trace.lock();
        let outcome = self.inner.discard(offset, len)?;
        if outcome != DiscardOutcome::Unsupported {
            log.push(TraceOp::Discard { offset, len });
            self.trace.len.store(log.len() as u64, Ordering::SeqCst);
        }
        Ok(outcome)
    }

    fn name(&self) -> String {
        format!("recording({})", self.inner.name())
    }
}

/// Builds the device content after a power cut at any point of a
/// recorded [`Trace`], starting from the content the recording started
/// on (`base`), exactly as a [`FaultDevice`] over `base` running the
/// same operations with `power_cut_after(k)` would leave it.
///
/// Incremental: what was flushed before the cut is kept applied between
/// calls, so cutting at increasing `k` costs each operation once plus the
/// unflushed tail per call (a smaller `k` than the last one starts over
/// from `base`).
pub struct CutReplay<'a> {
    base: &'a MemDevice,
    ops: &'a [TraceOp],
    /// `base` with `ops[..applied]` applied; `applied` is 0 or just past
    /// a flush.
    durable: MemDevice,
    applied: usize,
}

impl fmt::Debug for CutReplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CutReplay")
            .field("ops", &self.ops.len())
            .field("applied", &self.applied)
            .finish()
    }
}

impl<'a> CutReplay<'a> {
    /// Replay `ops` (recorded on a device that held `base`).
    pub fn new(base: &'a MemDevice, ops: &'a [TraceOp]) -> Self {
        CutReplay {
            base,
            ops,
            durable: base.snapshot(),
            applied: 0,
        }
    }

    /// Operations in the trace.
    pub fn len(&self) -> u64 {
        self.ops.len() as u64
    }

    /// An empty trace?
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Where the last flush among the first `k` operations ends (0 when
    /// there is none): the operations before it are durable after a cut
    /// at `k`, the ones from it to `k` are in the volatile cache.
    pub fn durable_prefix(&self, k: u64) -> usize {
        let k = usize::try_from(k).unwrap_or(usize::MAX).min(self.ops.len());
        self.ops[..k]
            .iter()
            .rposition(|op| *op == TraceOp::Flush)
            .map_or(0, |i| i + 1)
    }

    /// The content after a power cut following the first `k` operations
    /// (all of them when `k` is past the end) in `mode`.
    pub fn cut(&mut self, k: u64, mode: CutMode) -> MemDevice {
        let k = usize::try_from(k).unwrap_or(usize::MAX).min(self.ops.len());
        let f = self.durable_prefix(k as u64);
        if f < self.applied {
            self.durable = self.base.snapshot();
            self.applied = 0;
        }
        for op in &self.ops[self.applied..f] {
            // Flushed operations reach the platter in order; a failure
            // here is a trace that does not fit `base` (a harness bug).
            if let Err(e) = op.apply(&self.durable) {
                panic!("CutReplay: replaying a recorded operation: {e}");
            }
        }
        self.applied = f;
        let after = Arc::new(self.durable.snapshot());
        let pending = &self.ops[f..k];
        if pending.is_empty() {
            return unwrap_mem(after);
        }
        // Counting from `f` on, the tail's fault device chooses the same
        // survivors as one that ran the whole trace.
        let ctl = FaultControl::starting_at(f as u64);
        let fault = FaultDevice::with_control(Arc::clone(&after), Arc::clone(&ctl));
        ctl.set_cut_mode(mode);
        ctl.power_cut_after(pending.len() as u64);
        for op in pending {
            if let Err(e) = op.apply(&fault) {
                panic!("CutReplay: buffering a recorded operation: {e}");
            }
        }
        debug_assert!(ctl.is_power_lost());
        drop(fault);
        unwrap_mem(after)
    }
}

fn unwrap_mem(m: Arc<MemDevice>) -> MemDevice {
    Arc::try_unwrap(m).unwrap_or_else(|m| m.snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(dev: &dyn Device) -> Result<()> {
        dev.write_at(b"journal", 0)?;
        dev.flush()?;
        dev.write_at(b"data", 100)?;
        dev.discard(4096, 4096)?;
        dev.zeroout(8192, 10)?;
        dev.flush()?;
        dev.write_at(b"commit", 200)?;
        dev.write_at(b"later", 300)?;
        dev.flush()
    }

    fn base() -> MemDevice {
        MemDevice::from_bytes(vec![0x55; 16384])
    }

    #[test]
    fn records_in_order_and_passes_through() {
        let b = base();
        let inner = Arc::new(b.snapshot());
        let dev = RecordingDevice::new(Arc::clone(&inner));
        let trace = dev.trace();
        workload(&dev).unwrap();
        assert_eq!(trace.len(), 9);
        let ops = trace.ops();
        assert_eq!(ops[1], TraceOp::Flush);
        assert_eq!(
            ops[3],
            TraceOp::Discard {
                offset: 4096,
                len: 4096
            }
        );
        // The inner device got everything.
        let mut buf = [0u8; 7];
        inner.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"journal");
        // A failed write is not recorded.
        assert!(dev.write_at(b"x", 16384).is_err());
        assert_eq!(trace.len(), 9);
    }

    /// A cut after every k in every mode equals a FaultDevice run of the
    /// same workload with `power_cut_after(k)`, byte for byte; also when
    /// k goes back.
    #[test]
    fn cut_matches_a_fault_device_run() {
        let b = base();
        let dev = RecordingDevice::new(Arc::new(b.snapshot()));
        let trace = dev.trace();
        workload(&dev).unwrap();
        let ops = trace.ops();
        let mut r = CutReplay::new(&b, &ops);
        let modes = [
            CutMode::DropAll,
            CutMode::Subset {
                seed: 3,
                torn: false,
            },
            CutMode::Subset {
                seed: 9,
                torn: true,
            },
        ];
        for mode in modes {
            let ks: Vec<u64> = (0..=ops.len() as u64 + 1).chain([2, 0, 7]).collect();
            for k in ks {
                let got = r.cut(k, mode).to_bytes();
                let mem = Arc::new(b.snapshot());
                let fd = FaultDevice::new(Arc::clone(&mem));
                let ctl = fd.control();
                ctl.set_cut_mode(mode);
                ctl.power_cut_after(k);
                let _ = workload(&fd);
                assert_eq!(got, mem.to_bytes(), "{mode:?} k={k}");
            }
        }
    }

    #[test]
    fn cut_points_say_what_is_durable() {
        let b = base();
        let dev = RecordingDevice::new(Arc::new(b.snapshot()));
        let trace = dev.trace();
        workload(&dev).unwrap();
        let ops = trace.ops();
        let mut r = CutReplay::new(&b, &ops);
        let has = |m: &MemDevice, off: usize, s: &[u8]| {
            let v = m.to_bytes();
            &v[off..off + s.len()] == s
        };
        assert!(!has(&r.cut(1, CutMode::DropAll), 0, b"journal"));
        assert!(has(&r.cut(2, CutMode::DropAll), 0, b"journal"));
        assert!(!has(&r.cut(5, CutMode::DropAll), 100, b"data"));
        assert!(has(&r.cut(6, CutMode::DropAll), 100, b"data"));
        let all = r.cut(9, CutMode::DropAll);
        assert!(has(&all, 200, b"commit") && has(&all, 300, b"later"));
        assert!(all.to_bytes()[4096..8192].iter().all(|&x| x == 0));
        assert_eq!(r.durable_prefix(5), 2);
        assert_eq!(r.durable_prefix(6), 6);
        assert_eq!(r.durable_prefix(100), 9);
    }
}
