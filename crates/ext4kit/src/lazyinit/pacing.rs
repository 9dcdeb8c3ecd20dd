//! Step 4: how long to wait after a unit of work. HZ-free: every duration
//! is measured on a monotonic nanosecond clock.
//!
//! * [`Pace::Fixed`] (the kernel's `init_itable=n`): after each unit of
//!   work, wait `mult ×` the smoothed work time. The work time is measured
//!   for every unit and smoothed with an EWMA (α = [`WORK_EWMA_ALPHA`]), so
//!   one slow outlier does not turn into one huge pause, while over a long
//!   run the total pause stays ≈ `mult ×` the total work.
//! * [`Pace::Adaptive`]: the multiplier itself moves between 0 (full speed)
//!   and `max_mult` with the load other programs put on the same disk; see
//!   [`Pacer`] for the algorithm.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::load::LoadSample;

/// EWMA weight of the newest work-time measurement.
pub const WORK_EWMA_ALPHA: f64 = 0.3;
/// Foreign load (fraction of time the disk is busy without us, or share of
/// its requests that are not ours) below which the disk counts as idle.
pub const LOAD_IDLE: f64 = 0.05;
/// Foreign load at and above which the multiplier reaches `max_mult`.
pub const LOAD_BUSY: f64 = 0.5;
/// Step towards a higher multiplier (backing off is fast).
pub const BACKOFF_GAIN: f64 = 0.5;
/// Step towards a lower multiplier (recovering is slow).
pub const RECOVER_GAIN: f64 = 0.15;
/// An idle window quieter than this calibrates our own request count.
pub const QUIET: f64 = 0.01;
/// Time constant (of idle time) of the foreign-busy estimate: older idle
/// windows weigh `exp(-t / IDLE_TAU)`.
pub const IDLE_TAU: Duration = Duration::from_millis(200);
/// The longest observation window adaptive pacing adds after a unit (it is
/// 1/20 of the unit's work time, up to this).
pub const MAX_PROBE: Duration = Duration::from_millis(50);

/// Time, for the engine: a monotonic clock and a way to wait.
pub trait Clock: Send + Sync {
    /// Monotonic time since an arbitrary origin.
    fn now(&self) -> Duration;
    /// Wait for `d`.
    fn sleep(&self, d: Duration);
}

/// The real clock ([`Instant`] and [`std::thread::sleep`]).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A clock for tests: time stands still except when advanced by hand or by
/// `sleep`, and every sleep is recorded.
#[derive(Debug, Default)]
pub struct FakeClock {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    now: Duration,
    sleeps: Vec<Duration>,
}

impl FakeClock {
    pub fn new() -> Self {
        Self::default()
    }
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
    /// Let `d` pass (simulated work).
    pub fn advance(&self, d: Duration) {
        self.lock().now += d;
    }
    /// Every sleep so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.lock().sleeps.clone()
    }
    /// Sum of all sleeps.
    pub fn total_slept(&self) -> Duration {
        self.lock().sleeps.iter().sum()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        self.lock().now
    }
    fn sleep(&self, d: Duration) {
        let mut s = self.lock();
        s.now += d;
        s.sleeps.push(d);
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
    fn sleep(&self, d: Duration) {
        (**self).sleep(d)
    }
}

/// How to pace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// Wait `mult ×` the (smoothed) work time after each unit; 0 = full
    /// speed. The kernel's default is 10.
    Fixed { mult: u32 },
    /// Full speed while the disk is otherwise idle, up to `max_mult` under
    /// load; `fallback_mult` when the disk's counters cannot be read.
    Adaptive { max_mult: u32, fallback_mult: u32 },
}

impl Default for Pace {
    fn default() -> Self {
        Pace::Fixed { mult: 10 }
    }
}

/// An exponentially weighted moving average.
#[derive(Clone, Copy, Debug)]
pub struct Ewma {
    alpha: f64,
    value: Option<f64>,
}

impl Ewma {
    pub fn new(alpha: f64) -> Self {
        Ewma { alpha, value: None }
    }
    /// Feed a value; the first one is taken as is.
    pub fn update(&mut self, x: f64) -> f64 {
        let v = match self.value {
            None => x,
            Some(v) => v + self.alpha * (x - v),
        };
        self.value = Some(v);
        v
    }
    pub fn get(&self) -> Option<f64> {
        self.value
    }
}

/// Pacing state of one filesystem.
///
/// Call [`Pacer::before_work`] right before a unit of work and
/// [`Pacer::after_work`] right after it; the latter returns how long to
/// wait before the next unit.
///
/// # Adaptive algorithm
///
/// Our own I/O disturbs the disk's counters, so foreign load is measured
/// two ways and the larger estimate wins:
///
/// 1. **Idle windows** (from the end of one unit to the start of the
///    next; we issue no I/O then, and every unit ends with a flush, so
///    nothing of ours is in flight): the fraction of time the disk was
///    busy, `Σ Δio_ticks / Σ window` over the recent windows (both sums
///    decay with time constant [`IDLE_TAU`] of idle time, which evens out
///    the jiffy granularity of `io_ticks`). Nothing needs subtracting.
///    Where the kernel has pressure stall information, the share of the
///    idle window during which some task was stalled on I/O or waiting
///    for a CPU (`/proc/pressure/{io,cpu}`, "some") counts too: it sees
///    foreground programs that suffer although the disk is not saturated.
///    (During our own work such stalls cannot be told apart from the ones
///    our I/O path causes, so they are not used then.)
/// 2. **Work window**: the share of requests completed during the unit
///    that were not ours, `(Δios − r̂·ours) / Δios`, where `ours` is the
///    number of requests we issued and `r̂` the number of requests the
///    block layer completes per request of ours (requests get split, and
///    on an image file the host filesystem adds its own). `r̂` is learned
///    (EWMA) from units whose following idle window was quiet (busy <
///    [`QUIET`]); until then this estimate is not used.
///
/// The load `L` maps linearly to a target multiplier: 0 below
/// [`LOAD_IDLE`], `max_mult` at [`LOAD_BUSY`] and above. The multiplier
/// moves towards the target by [`BACKOFF_GAIN`] of the gap when it must
/// rise and [`RECOVER_GAIN`] when it may fall: back off fast, speed up
/// slowly. The wait is `multiplier × smoothed work time`, but never less
/// than a short probe (1/20 of the unit's work time, at most
/// [`MAX_PROBE`]) so that there always is an idle window to observe: on an
/// idle disk adaptive pacing runs at ≈ 95 % of full speed.
///
/// When no sample can be had, the fixed `fallback_mult` applies.
#[derive(Clone, Debug)]
pub struct Pacer {
    pace: Pace,
    work: Ewma,
    /// Current multiplier of adaptive pacing.
    level: f64,
    /// Learned block-layer requests per request of ours.
    ratio: Ewma,
    /// End of the previous unit and the counters then.
    idle_from: Option<(Duration, LoadSample)>,
    /// Start of the current unit and the counters then.
    work_from: Option<(Duration, LoadSample)>,
    /// The previous unit: (Δios, our requests).
    last_work: Option<(u64, u64)>,
    /// Decayed sums of idle-window lengths and of busy ticks in them.
    idle_ms: f64,
    idle_ticks: f64,
    /// Decayed sum of pressure stall time (I/O or CPU, ms) in idle windows.
    idle_stall: f64,
    /// Last load estimate (for reports).
    load: f64,
    have_signal: bool,
}

impl Pacer {
    pub fn new(pace: Pace) -> Self {
        Pacer {
            pace,
            work: Ewma::new(WORK_EWMA_ALPHA),
            level: 0.0,
            ratio: Ewma::new(0.3),
            idle_from: None,
            work_from: None,
            last_work: None,
            idle_ms: 0.0,
            idle_ticks: 0.0,
            idle_stall: 0.0,
            load: 0.0,
            have_signal: false,
        }
    }

    /// The pace this pacer follows.
    pub fn pace(&self) -> Pace {
        self.pace
    }

    /// The multiplier in effect now.
    pub fn multiplier(&self) -> f64 {
        match self.pace {
            Pace::Fixed { mult } => f64::from(mult),
            Pace::Adaptive { fallback_mult, .. } if !self.have_signal => f64::from(fallback_mult),
            Pace::Adaptive { .. } => self.level,
        }
    }

    /// The last foreign-load estimate (0..1; adaptive only).
    pub fn load(&self) -> f64 {
        self.load
    }

    /// A unit of work starts at `now`; `sample` are the counters now.
    pub fn before_work(&mut self, now: Duration, sample: Option<LoadSample>) {
        let Pace::Adaptive { max_mult, .. } = self.pace else {
            return;
        };
        let Some(s) = sample else {
            self.have_signal = false;
            self.idle_from = None;
            self.work_from = None;
            return;
        };
        self.have_signal = true;
        let mut load = 0.0f64;
        if let Some((t0, s0)) = self.idle_from.take() {
            let window_ms = now.saturating_sub(t0).as_secs_f64() * 1000.0;
            if window_ms > 0.0 {
                let ticks = s.io_ticks_ms.saturating_sub(s0.io_ticks_ms) as f64;
                let busy = (ticks / window_ms).clamp(0.0, 1.0);
                // io_ticks advance in jiffies: a short window reads as 0 or
                // as several ms. Estimate over the recent windows together,
                // weighted by their length; it is unbiased either way.
                let keep = (-window_ms / (IDLE_TAU.as_secs_f64() * 1000.0)).exp();
                self.idle_ms = self.idle_ms * keep + window_ms;
                self.idle_ticks = self.idle_ticks * keep + ticks;
                load = load.max((self.idle_ticks / self.idle_ms).clamp(0.0, 1.0));
                // Pressure stalls while we are idle are other programs'.
                let stall_us = delta(s.stall_io_us, s0.stall_io_us)
                    .max(delta(s.stall_cpu_us, s0.stall_cpu_us));
                self.idle_stall = self.idle_stall * keep + stall_us as f64 / 1000.0;
                load = load.max((self.idle_stall / self.idle_ms).clamp(0.0, 1.0));

                if let Some((dios, ours)) = self.last_work {
                    if busy < QUIET && s.ios.saturating_sub(s0.ios) <= 2 && ours > 0 && dios > 0 {
                        self.ratio.update(dios as f64 / ours as f64);
                    } else if let Some(r) = self.ratio.get()
                        && dios > 0
                    {
                        let foreign = (dios as f64 - r * ours as f64).max(0.0) / dios as f64;
                        load = load.max(foreign.clamp(0.0, 1.0));
                    }
                }
            }
        }
        self.load = load;
        let target =
            f64::from(max_mult) * ((load - LOAD_IDLE) / (LOAD_BUSY - LOAD_IDLE)).clamp(0.0, 1.0);
        let gain = if target > self.level {
            BACKOFF_GAIN
        } else {
            RECOVER_GAIN
        };
        self.level += (target - self.level) * gain;
        if self.level < 0.01 {
            self.level = 0.0;
        }
        self.work_from = Some((now, s));
    }

    /// The unit that started at the last [`Pacer::before_work`] ended at
    /// `now` after `elapsed` of work, having issued `our_requests` device
    /// requests; `sample` are the counters now. Returns the wait before the
    /// next unit of this filesystem.
    pub fn after_work(
        &mut self,
        now: Duration,
        elapsed: Duration,
        our_requests: u64,
        sample: Option<LoadSample>,
    ) -> Duration {
        let smoothed = self.work.update(elapsed.as_secs_f64());
        let wait = |mult: f64| Duration::from_secs_f64((smoothed * mult).max(0.0));
        match self.pace {
            Pace::Fixed { mult } => wait(f64::from(mult)),
            Pace::Adaptive { fallback_mult, .. } => {
                let (Some(s), Some((_, s0))) = (sample, self.work_from.take()) else {
                    self.have_signal = false;
                    self.last_work = None;
                    return wait(f64::from(fallback_mult));
                };
                self.last_work = Some((s.ios.saturating_sub(s0.ios), our_requests));

                self.idle_from = Some((now, s));
                let probe = (elapsed / 20).min(MAX_PROBE);
                wait(self.level).max(probe)
            }
        }
    }
}

/// Growth of a cumulative counter between two optional readings.
fn delta(now: Option<u64>, before: Option<u64>) -> u64 {
    match (now, before) {
        (Some(a), Some(b)) => a.saturating_sub(b),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fixed_is_mult_times_smoothed_work() {
        let mut p = Pacer::new(Pace::Fixed { mult: 10 });
        assert_eq!(p.after_work(MS, 20 * MS, 3, None), 200 * MS);
        // 0.3 × 40 + 0.7 × 20 = 26 ms → 260 ms
        let d = p.after_work(MS, 40 * MS, 3, None);
        assert!((d.as_secs_f64() - 0.260).abs() < 1e-9, "{d:?}");
        let mut p = Pacer::new(Pace::Fixed { mult: 0 });
        assert_eq!(p.after_work(MS, 20 * MS, 3, None), Duration::ZERO);
    }

    #[test]
    fn fake_clock_records() {
        let c = FakeClock::new();
        c.advance(5 * MS);
        c.sleep(7 * MS);
        assert_eq!(c.now(), 12 * MS);
        assert_eq!(c.sleeps(), vec![7 * MS]);
        assert_eq!(c.total_slept(), 7 * MS);
    }

    /// A simulated disk: our units take `work` and issue `ours` requests,
    /// each split into `split` block requests; other programs keep the disk
    /// busy `foreign_busy` of the time with `foreign_iops` requests/s.
    struct Sim {
        now: Duration,
        s: LoadSample,
        busy_acc: f64,
        ios_acc: f64,
    }

    impl Sim {
        fn pass(&mut self, d: Duration, busy: f64, iops: f64) {
            self.now += d;
            self.busy_acc += d.as_secs_f64() * 1000.0 * busy;
            self.ios_acc += d.as_secs_f64() * iops;
            self.s.io_ticks_ms = self.busy_acc as u64;
            self.s.ios = self.ios_acc as u64;
        }
        /// One cycle: returns (wait, multiplier).
        fn cycle(
            &mut self,
            p: &mut Pacer,
            foreign_busy: f64,
            foreign_iops: f64,
        ) -> (Duration, f64) {
            let work = 100 * MS;
            let ours = 20u64;
            let split = 4.0;
            p.before_work(self.now, Some(self.s));
            let our_iops = ours as f64 * split / work.as_secs_f64();
            self.pass(work, 1.0, our_iops + foreign_iops);
            let wait = p.after_work(self.now, work, ours, Some(self.s));
            self.pass(wait, foreign_busy, foreign_iops);
            (wait, p.multiplier())
        }
    }

    #[test]
    fn adaptive_full_speed_when_idle_backs_off_under_load() {
        let mut p = Pacer::new(Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 10,
        });
        let mut sim = Sim {
            now: Duration::ZERO,
            s: LoadSample::default(),
            busy_acc: 0.0,
            ios_acc: 0.0,
        };
        // Idle: only the probe (5 ms after 100 ms of work).
        for _ in 0..20 {
            let (wait, m) = sim.cycle(&mut p, 0.0, 0.0);
            assert_eq!(m, 0.0);
            assert_eq!(wait, 5 * MS);
        }
        // Split factor learned: ~4 block requests per request of ours.
        let r = p.ratio.get().expect("calibrated");
        assert!((r - 4.0).abs() < 0.2, "{r}");
        // Heavy foreign load: the multiplier climbs towards 100.
        let mut m = 0.0;
        for _ in 0..15 {
            m = sim.cycle(&mut p, 0.8, 500.0).1;
        }
        assert!(m > 95.0, "{m}");
        // Moderate load: somewhere in between.
        for _ in 0..40 {
            m = sim.cycle(&mut p, 0.25, 100.0).1;
        }
        let want = 100.0 * (0.25 - LOAD_IDLE) / (LOAD_BUSY - LOAD_IDLE);
        assert!((m - want).abs() < 10.0, "{m} vs {want}");
        // Load gone: back to full speed, more slowly than it backed off.
        let mut cycles = 0;
        while m > 0.0 {
            m = sim.cycle(&mut p, 0.0, 0.0).1;
            cycles += 1;
            assert!(cycles < 100);
        }
        assert!(cycles > 5, "{cycles}");
    }

    #[test]
    fn adaptive_sees_foreign_requests_during_work() {
        // The disk is barely busy while we sleep (below LOAD_IDLE, so the
        // idle window alone would not slow us down), but during our work
        // as many foreign requests complete as our own.
        let mut p = Pacer::new(Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 10,
        });
        let mut sim = Sim {
            now: Duration::ZERO,
            s: LoadSample::default(),
            busy_acc: 0.0,
            ios_acc: 0.0,
        };
        for _ in 0..10 {
            sim.cycle(&mut p, 0.0, 0.0);
        }
        let mut m = 0.0;
        for _ in 0..10 {
            p.before_work(sim.now, Some(sim.s));
            sim.pass(100 * MS, 1.0, 20.0 * 4.0 / 0.1 + 800.0);
            let wait = p.after_work(sim.now, 100 * MS, 20, Some(sim.s));
            sim.pass(wait, 0.03, 1000.0);
            m = p.multiplier();
        }
        assert!(m > 50.0, "{m}");
    }

    #[test]
    fn adaptive_without_signal_falls_back() {
        let mut p = Pacer::new(Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 7,
        });
        p.before_work(Duration::ZERO, None);
        assert_eq!(p.after_work(10 * MS, 10 * MS, 1, None), 70 * MS);
        assert_eq!(p.multiplier(), 7.0);
    }
}
