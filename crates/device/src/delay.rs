//! [`DelayDevice`]: a wrapper that adds latency to mutating operations and
//! counts them, for the discard tests and benchmarks (a device whose
//! discards take a few milliseconds each, as the seed's eMMC did).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::{Device, DiscardOutcome, Result};

/// Delays and counters of a [`DelayDevice`], shared (an `Arc`) so a test
/// can change the delays and read the counters while the device is boxed
/// away inside a filesystem.
#[derive(Debug, Default)]
pub struct DelayControl {
    discard_ns: AtomicU64,
    write_ns: AtomicU64,
    flush_ns: AtomicU64,
    discards: AtomicU64,
    discard_bytes: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Every discard: (offset, len, when it completed).
    log: Mutex<Vec<DiscardRecord>>,
}

/// One discard a [`DelayDevice`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiscardRecord {
    pub offset: u64,
    pub len: u64,
    /// When it started (after any wait for the caller) and completed.
    pub started: Instant,
    pub completed: Instant,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn sleep_ns(ns: u64) {
    if ns > 0 {
        std::thread::sleep(Duration::from_nanos(ns));
    }
}

impl DelayControl {
    /// No delays, counters at zero.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Every discard takes `d` (slept before the inner discard).
    pub fn set_discard_delay(&self, d: Duration) {
        self.discard_ns.store(nanos(d), Ordering::SeqCst);
    }

    /// Every write takes `d`.
    pub fn set_write_delay(&self, d: Duration) {
        self.write_ns.store(nanos(d), Ordering::SeqCst);
    }

    /// Every flush takes `d`.
    pub fn set_flush_delay(&self, d: Duration) {
        self.flush_ns.store(nanos(d), Ordering::SeqCst);
    }

    /// Discards completed so far.
    pub fn discards(&self) -> u64 {
        self.discards.load(Ordering::SeqCst)
    }

    /// Bytes of the discards completed so far.
    pub fn discard_bytes(&self) -> u64 {
        self.discard_bytes.load(Ordering::SeqCst)
    }

    /// Writes completed so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::SeqCst)
    }

    /// Flushes completed so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    /// Discards running right now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The most discards ever running at the same time.
    pub fn max_in_flight(&self) -> u64 {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Every completed discard, in completion order.
    pub fn discard_log(&self) -> Vec<DiscardRecord> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counters (and the log) back to zero; delays are kept.
    pub fn reset_counters(&self) {
        for c in [
            &self.discards,
            &self.discard_bytes,
            &self.writes,
            &self.flushes,
            &self.max_in_flight,
        ] {
            c.store(0, Ordering::SeqCst);
        }
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A device wrapper that sleeps before each discard, write and flush (per
/// [`DelayControl`]) and counts them, including the most discards that
/// were in flight at once. Reads are not delayed.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ext4kit_device::{DelayDevice, Device, MemDevice};
///
/// let dev = DelayDevice::new(MemDevice::new(1 << 20));
/// let ctl = dev.control();
/// ctl.set_discard_delay(Duration::from_millis(1));
/// dev.discard(0, 4096).unwrap();
/// assert_eq!((ctl.discards(), ctl.discard_bytes()), (1, 4096));
/// ```
pub struct DelayDevice<D> {
    inner: D,
    control: Arc<DelayControl>,
}

impl<D: Device> fmt::Debug for DelayDevice<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayDevice")
            .field("inner", &self.inner.name())
            .field("control", &self.control)
            .finish()
    }
}

impl<D: Device> DelayDevice<D> {
    /// Wrap `inner` with a fresh [`DelayControl`] (no delays).
    pub fn new(inner: D) -> Self {
        Self::with_control(inner, DelayControl::new())
    }

    /// Wrap `inner`, driven by an existing control.
    pub fn with_control(inner: D, control: Arc<DelayControl>) -> Self {
        DelayDevice { inner, control }
    }

    /// The shared control handle.
    pub fn control(&self) -> Arc<DelayControl> {
        Arc::clone(&self.control)
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }
}

/// Decrements the in-flight count however the discard ends.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<D: Device> Device for DelayDevice<D> {
    crate::forward_device!(inner; write_at, flush, discard, name);

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        sleep_ns(self.control.write_ns.load(Ordering::SeqCst));
        self.inner.write_at(buf, offset)?;
        self.control.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        sleep_ns(self.control.flush_ns.load(Ordering::SeqCst));
        self.inner.flush()?;
        self.control.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        let c = &self.control;
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let _guard = InFlight(&c.in_flight);
        c.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let started = Instant::now();
        sleep_ns(c.discard_ns.load(Ordering::SeqCst));
        let r = self.inner.discard(offset, len)?;
        c.discards.fetch_add(1, Ordering::SeqCst);
        c.discard_bytes.fetch_add(len, Ordering::SeqCst);
        c.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(DiscardRecord {
                offset,
                len,
                started,
                completed: Instant::now(),
            });
        Ok(r)
    }
    fn name(&self) -> String {
        format!("delay({})", self.inner.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    #[test]
    fn counts_and_concurrency() {
        let dev = Arc::new(DelayDevice::new(MemDevice::new(1 << 20)));
        let ctl = dev.control();
        ctl.set_discard_delay(Duration::from_millis(30));
        dev.write_at(&[1u8; 8192], 0).unwrap();
        dev.flush().unwrap();
        let t = Instant::now();
        std::thread::scope(|s| {
            for i in 0..4u64 {
                let d = dev.clone();
                s.spawn(move || d.discard(i * 4096, 4096).unwrap());
            }
        });
        // Four 30 ms discards at once take about 30 ms, not 120.
        assert!(
            t.elapsed() < Duration::from_millis(110),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(ctl.discards(), 4);
        assert_eq!(ctl.discard_bytes(), 4 * 4096);
        assert!(ctl.max_in_flight() > 1, "{}", ctl.max_in_flight());
        assert_eq!(ctl.in_flight(), 0);
        assert_eq!((ctl.writes(), ctl.flushes()), (1, 1));
        let log = ctl.discard_log();
        assert_eq!(log.len(), 4);
        assert!(
            log.iter()
                .all(|r| r.completed >= r.started + Duration::from_millis(30))
        );
        // The discards reached the inner device.
        let mut b = [9u8; 8192];
        dev.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        ctl.reset_counters();
        assert_eq!((ctl.discards(), ctl.max_in_flight()), (0, 0));
        assert!(ctl.discard_log().is_empty());
    }
}
