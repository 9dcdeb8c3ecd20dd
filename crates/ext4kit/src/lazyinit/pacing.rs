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
/// its requests that are not ours, or of time stalled) below which it
/// exerts no pressure.
pub const LOAD_IDLE: f64 = 0.05;
/// Foreign load at and above which the pressure is full (`max_mult`).
pub const LOAD_BUSY: f64 = 0.5;
/// Share of foreign requests during our work below which they exert no
/// pressure (our own requests are estimated, so this one is noisy).
pub const REQ_IDLE: f64 = 0.2;
/// Share of foreign requests at and above which the pressure is full.
pub const REQ_BUSY: f64 = 0.7;
/// Share of all CPUs' time busy while we are idle below which the CPUs
/// count as idle.
pub const CPU_IDLE: f64 = 0.15;
/// CPU busy share at and above which the pressure is full (one busy CPU of
/// two is 0.5).
pub const CPU_BUSY: f64 = 0.40;
/// Own slowdown (smoothed unit cost over its baseline) below which it
/// exerts no pressure. On an image file the cost per byte of an idle
/// machine varies by up to 1.7× with the host's writeback (measured over
/// 1 TiB jobs), so the threshold sits above that.
pub const SLOW_IDLE: f64 = 2.0;
/// Own slowdown above which the next idle window is made longer (a
/// quarter of the unit's work time instead of 1/20) to look closer.
pub const SLOW_SUSPECT: f64 = 1.8;
/// Own slowdown at and above which the pressure is full.
pub const SLOW_BUSY: f64 = 2.5;
/// Work time over which the own unit cost is smoothed.
pub const COST_TAU: Duration = Duration::from_millis(100);
/// Units measured before the own slowdown is used.
pub const COST_WARMUP: u32 = 3;
/// Work time over which the cost baseline drifts up by a factor e.
pub const BASE_DRIFT: Duration = Duration::from_secs(30);
/// Time constant (of quiet idle time) with which the baseline follows a
/// slowdown that no other signal explains.
pub const BASE_RELAX: Duration = Duration::from_secs(20);
/// Step towards a higher multiplier (backing off is fast).
pub const BACKOFF_GAIN: f64 = 0.5;
/// The multiplier rises at most to twice its value per unit, and from 0 to
/// at most this.
pub const RAMP_START: f64 = 5.0;
/// Smallest step towards a lower multiplier.
pub const RECOVER_GAIN: f64 = 0.5;
/// Time constant of the fall of the multiplier once the load is gone.
pub const RECOVER_TAU: Duration = Duration::from_millis(250);
/// An idle window quieter than this calibrates our own request count.
pub const QUIET: f64 = 0.01;
/// Time constant (of idle time) of the foreign-busy estimate: older idle
/// windows weigh `exp(-t / IDLE_TAU)`.
pub const IDLE_TAU: Duration = Duration::from_millis(20);
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
/// Several signals of contention each give a *pressure* between 0 (none)
/// and 1, linear between an "idle" and a "busy" threshold; the largest one
/// wins, and the target multiplier is `pressure × max_mult`:
///
/// 1. **Idle windows** (from the end of one unit to the start of the next;
///    we issue no I/O then, and every unit ends with a flush, so nothing of
///    ours is in flight): what other programs do to the machine while we
///    do nothing. Each is a ratio of sums over the recent windows (both
///    sums decay with time constant [`IDLE_TAU`] of idle time, which evens
///    out the tick granularity of the counters):
///    * the disk's busy share, `Σ Δio_ticks / Σ window`
///      ([`LOAD_IDLE`]..[`LOAD_BUSY`]);
///    * the share of the window during which some task was stalled on I/O
///      or waiting for a CPU (pressure stall information,
///      `/proc/pressure/{io,cpu}` "some"; same thresholds);
///    * the share of all CPUs' time that was busy (`/proc/stat`,
///      [`CPU_IDLE`]..[`CPU_BUSY`]): a CPU-bound foreground that leaves
///      the disk nearly idle and is never stalled still shows here (one
///      busy CPU of two is 0.5).
/// 2. **Work window**: the share of disk requests completed during the
///    unit that were not ours, `(Δios − r̂·ours) / Δios`, where `ours` is
///    the number of requests we issued and `r̂` the number of requests the
///    block layer completes per request of ours (requests get split, and
///    on an image file the host filesystem adds its own). `r̂` is learned
///    (EWMA) from units whose following idle window was quiet (busy <
///    [`QUIET`]); until then this estimate is not used. The ratio varies
///    with the mix of a unit's requests, so this signal has its own, higher
///    thresholds ([`REQ_IDLE`]..[`REQ_BUSY`]).
/// 3. **Our own slowdown** (LEDBAT-style: a background transfer yields
///    when its own latency grows): the cost of a unit, work time per
///    byte zeroed or read (not per request: a batch's fixed requests would
///    make long batches look slow), smoothed over about [`COST_TAU`] of work, against its
///    baseline, the lowest smoothed cost seen (drifting up by a factor e
///    per [`BASE_DRIFT`] of work so that it can follow a change of the
///    work itself). Contention for anything we share with the foreground
///    (CPUs, the loop device's worker, the host filesystem's journal, the
///    disk queue) slows us down too, whether or not a counter sees it; a
///    ratio of [`SLOW_IDLE`] and more counts, [`SLOW_BUSY`] is full
///    pressure. This signal reacts within a unit or two at full speed,
///    where the idle windows are too short to see much. While the idle
///    windows show no load at all, the baseline relaxes towards the current
///    cost (time constant [`BASE_RELAX`] of idle time): a slowdown that
///    nothing else explains is eventually taken as the new normal.
///
/// A pressure counts only as far as the two previous units showed it too
/// (the smallest of the three is used): single outliers are common on an idle
/// machine. The multiplier moves towards the target by [`BACKOFF_GAIN`] of the gap
/// per unit when it must rise (but at most to twice its value, or to
/// [`RAMP_START`] from 0, so that a short burst costs one short wait), and falls by at least [`RECOVER_GAIN`] of
/// the gap per unit, faster after long waits (time constant
/// [`RECOVER_TAU`] of wall time): back off at once, speed up soon after the
/// load is gone. The wait is `multiplier × smoothed work time`, but never
/// less than a short probe (1/20 of the unit's work time, at most
/// [`MAX_PROBE`]) so that there always is an idle window to observe: on an
/// idle machine adaptive pacing runs at ≈ 95 % of full speed.
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
    /// When the multiplier was last updated.
    updated_at: Option<Duration>,
    /// Decayed sums of idle-window lengths and of busy ticks in them.
    idle_ms: f64,
    idle_ticks: f64,
    /// Decayed sum of pressure stall time (I/O or CPU, ms) in idle windows.
    idle_stall: f64,
    /// Decayed sums of busy and all CPU ticks in idle windows.
    idle_cpu_busy: f64,
    idle_cpu_total: f64,
    /// Pressure from the idle window before the current unit, and whether
    /// that window showed no load at all; its length in seconds.
    idle_pressure: f64,
    idle_quiet: bool,
    idle_secs: f64,
    /// Decayed sums of work seconds and of bytes touched (own cost).
    cost_secs: f64,
    cost_bytes: f64,
    /// Baseline cost (seconds per byte) and the units measured so far.
    base: Option<f64>,
    cost_units: u32,
    /// The pressure of the previous unit, before debouncing.
    prev_pressure: f64,
    /// The pressure of the unit before that.
    prev_pressure2: f64,
    /// The last signals (for reports and tests).
    signals: Signals,
    have_signal: bool,
}

/// The pressures (0..1) behind the last update of an adaptive pacer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// Disk busy share in the idle windows.
    pub disk: f64,
    /// Pressure stall share in the idle windows.
    pub stall: f64,
    /// CPU busy share in the idle windows.
    pub cpu: f64,
    /// Share of foreign requests during the last unit.
    pub requests: f64,
    /// Own slowdown: smoothed unit cost over its baseline (a ratio ≥ 1,
    /// not a pressure; 0 while there is no baseline yet).
    pub slowdown: f64,
    /// The pressure that set the target: the largest of all.
    pub pressure: f64,
}

/// `x` mapped linearly onto 0..1 between `idle` and `busy`.
fn pressure(x: f64, idle: f64, busy: f64) -> f64 {
    ((x - idle) / (busy - idle)).clamp(0.0, 1.0)
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
            updated_at: None,
            idle_ms: 0.0,
            idle_ticks: 0.0,
            idle_stall: 0.0,
            idle_cpu_busy: 0.0,
            idle_cpu_total: 0.0,
            idle_pressure: 0.0,
            idle_quiet: false,
            idle_secs: 0.0,
            cost_secs: 0.0,
            cost_bytes: 0.0,
            base: None,
            cost_units: 0,
            prev_pressure: 0.0,
            prev_pressure2: 0.0,
            signals: Signals::default(),
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

    /// Does the next unit run at full speed, with no wait planned after
    /// it? True for `--mult 0`, and for adaptive pacing while its
    /// multiplier is 0 and the last unit showed no pressure at all. The
    /// engine makes such units longer (fewer flushes per byte).
    pub fn full_speed(&self) -> bool {
        match self.pace {
            Pace::Fixed { mult } => mult == 0,
            Pace::Adaptive { .. } => {
                self.have_signal && self.level == 0.0 && self.prev_pressure == 0.0
            }
        }
    }

    /// The pressure behind the current multiplier (0..1; adaptive only):
    /// the largest of the [`Signals`].
    pub fn load(&self) -> f64 {
        self.signals.pressure
    }

    /// The signals behind the current multiplier (adaptive only).
    pub fn signals(&self) -> Signals {
        self.signals
    }

    /// A unit of work starts at `now`; `sample` are the counters now.
    pub fn before_work(&mut self, now: Duration, sample: Option<LoadSample>) {
        if !matches!(self.pace, Pace::Adaptive { .. }) {
            return;
        }
        let Some(s) = sample else {
            self.have_signal = false;
            self.idle_from = None;
            self.work_from = None;
            return;
        };
        self.have_signal = true;
        self.idle_pressure = 0.0;
        self.idle_quiet = false;
        self.idle_secs = 0.0;
        if let Some((t0, s0)) = self.idle_from.take() {
            let window = now.saturating_sub(t0);
            let window_ms = window.as_secs_f64() * 1000.0;
            if window_ms > 0.0 {
                self.idle_secs = window.as_secs_f64();
                let ticks = s.io_ticks_ms.saturating_sub(s0.io_ticks_ms) as f64;
                let busy = (ticks / window_ms).clamp(0.0, 1.0);
                // io_ticks advance in jiffies, CPU time in ticks: a short
                // window reads as 0 or as a whole tick. Estimate over the
                // recent windows together, weighted by their length; it is
                // unbiased either way.
                let keep = (-window_ms / (IDLE_TAU.as_secs_f64() * 1000.0)).exp();
                self.idle_ms = self.idle_ms * keep + window_ms;
                self.idle_ticks = self.idle_ticks * keep + ticks;
                let disk = (self.idle_ticks / self.idle_ms).clamp(0.0, 1.0);
                // Pressure stalls while we are idle are other programs'.
                let stall_us = delta(s.stall_io_us, s0.stall_io_us)
                    .max(delta(s.stall_cpu_us, s0.stall_cpu_us));
                self.idle_stall = self.idle_stall * keep + stall_us as f64 / 1000.0;
                let stall = (self.idle_stall / self.idle_ms).clamp(0.0, 1.0);
                // So is the CPU time used while we are idle.
                let mut cpu = 0.0;
                if let (Some(c), Some(c0)) = (s.cpu, s0.cpu) {
                    self.idle_cpu_busy =
                        self.idle_cpu_busy * keep + c.busy.saturating_sub(c0.busy) as f64;
                    self.idle_cpu_total =
                        self.idle_cpu_total * keep + c.total.saturating_sub(c0.total) as f64;
                    if self.idle_cpu_total > 0.0 {
                        cpu = (self.idle_cpu_busy / self.idle_cpu_total).clamp(0.0, 1.0);
                    }
                }
                self.signals.disk = pressure(disk, LOAD_IDLE, LOAD_BUSY);
                self.signals.stall = pressure(stall, LOAD_IDLE, LOAD_BUSY);
                self.signals.cpu = pressure(cpu, CPU_IDLE, CPU_BUSY);
                self.idle_pressure = self
                    .signals
                    .disk
                    .max(self.signals.stall)
                    .max(self.signals.cpu);
                self.idle_quiet = self.idle_pressure == 0.0;

                // A quiet window after a unit tells how many block-layer
                // requests one of ours makes.
                if let Some((dios, ours)) = self.last_work
                    && busy < QUIET
                    && s.ios.saturating_sub(s0.ios) <= 2
                    && ours > 0
                    && dios > 0
                {
                    self.ratio.update(dios as f64 / ours as f64);
                }
            }
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
        our_bytes: u64,
        sample: Option<LoadSample>,
    ) -> Duration {
        let smoothed = self.work.update(elapsed.as_secs_f64());
        let wait = |mult: f64| Duration::from_secs_f64((smoothed * mult).max(0.0));
        let (max_mult, fallback_mult) = match self.pace {
            Pace::Fixed { mult } => return wait(f64::from(mult)),
            Pace::Adaptive {
                max_mult,
                fallback_mult,
            } => (max_mult, fallback_mult),
        };
        let (Some(s), Some((_, s0))) = (sample, self.work_from.take()) else {
            self.have_signal = false;
            self.last_work = None;
            return wait(f64::from(fallback_mult));
        };
        let dios = s.ios.saturating_sub(s0.ios);
        self.last_work = Some((dios, our_requests));
        self.idle_from = Some((now, s));

        // Foreign requests during the unit.
        self.signals.requests = match self.ratio.get() {
            Some(r) if dios > 0 => {
                let foreign = (dios as f64 - r * our_requests as f64).max(0.0) / dios as f64;
                pressure(foreign, REQ_IDLE, REQ_BUSY)
            }
            _ => 0.0,
        };

        // Our own cost per request against its baseline.
        let secs = elapsed.as_secs_f64();
        // Per byte, not per request: a batch's fixed requests (flushes, the
        // descriptor block) would make long batches look slower per request.
        let slow = if our_bytes > 0 && secs > 0.0 {
            self.own_slowdown(secs, our_bytes as f64)
        } else {
            0.0
        };
        self.signals.slowdown = slow;
        let slow_pressure = if slow > 0.0 {
            pressure(slow, SLOW_IDLE, SLOW_BUSY)
        } else {
            0.0
        };

        let now_p = self
            .idle_pressure
            .max(self.signals.requests)
            .max(slow_pressure);
        // One or two units alone are not believed: a single slow unit, a
        // burst of someone's requests or a tick of CPU in a short window are
        // common on an idle machine. Sustained load shows in three units in
        // a row.
        let p = now_p.min(self.prev_pressure).min(self.prev_pressure2);
        self.prev_pressure2 = self.prev_pressure;
        self.prev_pressure = now_p;
        self.signals.pressure = p;
        let target = f64::from(max_mult) * p;
        let since = self
            .updated_at
            .map_or(0.0, |t| now.saturating_sub(t).as_secs_f64());
        self.updated_at = Some(now);
        if target > self.level {
            // Back off fast, but let the waits grow at most twofold per
            // unit from RAMP_START: a burst of someone's work is over by
            // the end of the first (short) wait, and that longer window
            // shows it; sustained load reaches ×10 within two units.
            let ramp = (2.0 * self.level).max(RAMP_START);
            self.level = (self.level + (target - self.level) * BACKOFF_GAIN).min(ramp);
        } else {
            let keep = (1.0 - RECOVER_GAIN).min((-since / RECOVER_TAU.as_secs_f64()).exp());
            self.level = target + (self.level - target) * keep;
        }
        if self.level < 0.01 {
            self.level = 0.0;
        }
        // A unit slower than usual widens the next idle window, so that the
        // idle-window signals can confirm or refute it sooner.
        let probe = if slow > SLOW_SUSPECT {
            elapsed / 4
        } else {
            elapsed / 20
        };
        let probe = probe.min(MAX_PROBE);
        wait(self.level).max(probe)
    }

    /// Feed one unit's cost; the smoothed cost over its baseline (0 while
    /// there is no baseline yet).
    fn own_slowdown(&mut self, secs: f64, bytes: f64) -> f64 {
        let keep = (-secs / COST_TAU.as_secs_f64()).exp();
        self.cost_secs = self.cost_secs * keep + secs;
        self.cost_bytes = self.cost_bytes * keep + bytes;
        let cost = self.cost_secs / self.cost_bytes;
        self.cost_units = self.cost_units.saturating_add(1);
        let mut base = match self.base {
            Some(b) => (b * (secs / BASE_DRIFT.as_secs_f64()).exp()).min(cost),
            None => cost,
        };
        if self.idle_quiet && cost > base {
            // Nothing else to be seen: let the baseline follow.
            let relax = 1.0 - (-self.idle_secs / BASE_RELAX.as_secs_f64()).exp();
            base += (cost - base) * relax;
        }
        self.base = Some(base);
        if self.cost_units <= COST_WARMUP {
            return 0.0;
        }
        cost / base
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
    use super::super::load::CpuTicks;
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fixed_is_mult_times_smoothed_work() {
        let mut p = Pacer::new(Pace::Fixed { mult: 10 });
        assert_eq!(p.after_work(MS, 20 * MS, 3, 3 << 20, None), 200 * MS);
        // 0.3 × 40 + 0.7 × 20 = 26 ms → 260 ms
        let d = p.after_work(MS, 40 * MS, 3, 3 << 20, None);
        assert!((d.as_secs_f64() - 0.260).abs() < 1e-9, "{d:?}");
        let mut p = Pacer::new(Pace::Fixed { mult: 0 });
        assert_eq!(p.after_work(MS, 20 * MS, 3, 3 << 20, None), Duration::ZERO);
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

    /// What other programs do (all shares 0..1).
    #[derive(Clone, Copy, Default)]
    struct Foreground {
        /// Share of time the disk is busy with them.
        disk: f64,
        /// Their disk requests per second.
        iops: f64,
        /// Share of all CPUs they keep busy.
        cpu: f64,
        /// Share of time some task stalls (PSI "some").
        stall: f64,
        /// How much slower our units run alongside them.
        slowdown: f64,
    }

    const IDLE: Foreground = Foreground {
        disk: 0.0,
        iops: 0.0,
        cpu: 0.0,
        stall: 0.0,
        slowdown: 1.0,
    };

    /// A simulated machine with 2 CPUs and 250 Hz ticks (500 CPU ticks a
    /// second, counted as whole ticks like `/proc/stat`). Our units take
    /// 25 ms (times the foreground's slowdown, times ±15 % of noise), issue
    /// 6 requests, each split into 4 block requests, and keep one CPU
    /// busy.
    struct Sim {
        now: Duration,
        ios: f64,
        busy_ms: f64,
        stall_us: f64,
        cpu_busy: f64,
        cpu_total: f64,
        noise: u64,
        work: Duration,
        slept: Duration,
    }

    impl Sim {
        fn new() -> Self {
            Sim {
                now: Duration::ZERO,
                ios: 0.0,
                busy_ms: 0.0,
                stall_us: 0.0,
                cpu_busy: 0.0,
                cpu_total: 0.0,
                noise: 1,
                work: Duration::ZERO,
                slept: Duration::ZERO,
            }
        }
        fn sample(&self) -> LoadSample {
            LoadSample {
                ios: self.ios as u64,
                io_ticks_ms: self.busy_ms as u64,
                stall_io_us: Some(self.stall_us as u64),
                stall_cpu_us: Some(0),
                cpu: Some(CpuTicks {
                    busy: self.cpu_busy as u64,
                    total: self.cpu_total as u64,
                }),
            }
        }
        fn pass(&mut self, d: Duration, disk: f64, iops: f64, cpu: f64, stall: f64) {
            let s = d.as_secs_f64();
            self.now += d;
            self.busy_ms += s * 1000.0 * disk.min(1.0);
            self.ios += s * iops;
            self.stall_us += s * 1e6 * stall;
            self.cpu_busy += s * 500.0 * cpu.min(1.0);
            self.cpu_total += s * 500.0;
        }
        /// Deterministic noise in 0.85..1.15.
        fn jitter(&mut self) -> f64 {
            self.noise = self
                .noise
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            0.85 + 0.3 * ((self.noise >> 33) as f64 / (1u64 << 31) as f64)
        }
        /// One unit and its wait; returns (wait, multiplier).
        fn cycle(&mut self, p: &mut Pacer, f: Foreground) -> (Duration, f64) {
            let work = (25 * MS).mul_f64(f.slowdown * self.jitter());
            let ours = 6u64;
            p.before_work(self.now, Some(self.sample()));
            let our_iops = ours as f64 * 4.0 / work.as_secs_f64();
            self.pass(work, 1.0, our_iops + f.iops, 0.5 + f.cpu, f.stall);
            let wait = p.after_work(self.now, work, ours, ours << 20, Some(self.sample()));
            self.pass(wait, f.disk, f.iops, f.cpu, f.stall);
            self.work += work;
            self.slept += wait;
            (wait, p.multiplier())
        }
        /// Run for `d` of simulated time; returns the multiplier at the end.
        fn run(&mut self, p: &mut Pacer, f: Foreground, d: Duration) -> f64 {
            let end = self.now + d;
            let mut m = p.multiplier();
            while self.now < end {
                m = self.cycle(p, f).1;
            }
            m
        }
        /// Our share of the time (work / (work + waits)) from now on, over
        /// `d` of simulated time.
        fn duty(&mut self, p: &mut Pacer, f: Foreground, d: Duration) -> f64 {
            let (w0, s0) = (self.work, self.slept);
            self.run(p, f, d);
            let w = (self.work - w0).as_secs_f64();
            w / (w + (self.slept - s0).as_secs_f64())
        }
    }

    fn adaptive() -> Pacer {
        Pacer::new(Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 10,
        })
    }

    /// The share of time `--mult 10` works.
    const MULT10_DUTY: f64 = 1.0 / 11.0;

    #[test]
    fn adaptive_runs_at_full_speed_when_idle() {
        let mut p = adaptive();
        let mut sim = Sim::new();
        // Idle, with ±15 % of noise in the unit times: only the probe
        // (1/20 of the work) is waited.
        let duty = sim.duty(&mut p, IDLE, Duration::from_secs(60));
        assert!(duty > 0.94, "{duty}");
        assert!(
            sim.slept.as_secs_f64() < sim.work.as_secs_f64() * 0.06,
            "{:?} {:?}",
            sim.slept,
            sim.work
        );
        assert_eq!(p.multiplier(), 0.0);
        // Split factor learned: ~4 block requests per request of ours.
        let r = p.ratio.get().expect("calibrated");
        assert!((r - 4.0).abs() < 0.2, "{r}");
    }

    #[test]
    fn full_speed_only_without_load() {
        assert!(Pacer::new(Pace::Fixed { mult: 0 }).full_speed());
        assert!(!Pacer::new(Pace::Fixed { mult: 10 }).full_speed());
        // Adaptive: not before a signal was seen (the fallback applies),
        // yes on an idle machine, no as soon as load shows.
        let mut p = adaptive();
        assert!(!p.full_speed());
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(2));
        assert!(p.full_speed());
        let busy = Foreground { cpu: 0.5, ..IDLE };
        sim.run(&mut p, busy, Duration::from_millis(200));
        assert!(!p.full_speed());
        assert!(p.multiplier() > 0.0);
    }

    #[test]
    fn adaptive_shrugs_off_single_outliers_when_idle() {
        // An idle machine with one odd unit in 100: twice as slow,
        // with someone's CPU burst and disk requests right after it.
        let mut p = adaptive();
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(2));
        let odd = Foreground {
            cpu: 0.6,
            disk: 0.3,
            iops: 2000.0,
            stall: 0.3,
            slowdown: 2.0,
        };
        let (w0, s0) = (sim.work, sim.slept);
        for i in 0..1000 {
            sim.cycle(&mut p, if i % 100 == 0 { odd } else { IDLE });
        }
        let w = (sim.work - w0).as_secs_f64();
        let duty = w / (w + (sim.slept - s0).as_secs_f64());
        // Such a burst is real load for a moment (its traces stay in the
        // idle-window estimates for a while), but it costs little.
        assert!(duty > 0.8, "{duty}");
    }

    #[test]
    fn adaptive_yields_to_cpu_bound_work() {
        // The case of postmark on 2 CPUs: one CPU busy with the
        // foreground, the disk nearly idle, nobody stalled, and our units
        // a bit slower.
        let mut p = adaptive();
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(5));
        let fg = Foreground {
            cpu: 0.5,
            disk: 0.02,
            iops: 20.0,
            slowdown: 1.2,
            ..IDLE
        };
        // Within 1 s at least as polite as --mult 10, ...
        let m = sim.run(&mut p, fg, Duration::from_secs(1));
        assert!(m >= 10.0, "{m}");
        // ... and over the first 10 s (onset included) far more.
        sim.run(&mut p, IDLE, Duration::from_secs(5));
        let duty = sim.duty(&mut p, fg, Duration::from_secs(10));
        assert!(duty < MULT10_DUTY / 2.0, "{duty}");
        assert!(p.signals().cpu > 0.9, "{:?}", p.signals());
        // Gone: back to full speed within a few seconds.
        sim.run(&mut p, IDLE, Duration::from_secs(8));
        let duty = sim.duty(&mut p, IDLE, Duration::from_secs(5));
        assert!(duty > 0.94, "{duty}");
    }

    #[test]
    fn adaptive_yields_when_only_its_own_units_slow_down() {
        // No counter shows the foreground (it is on another disk, or the
        // contention is in a queue nobody counts); only our units take
        // three times as long.
        let mut p = adaptive();
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(5));
        let fg = Foreground {
            slowdown: 3.0,
            ..IDLE
        };
        let m = sim.run(&mut p, fg, Duration::from_millis(1500));
        assert!(m >= 10.0, "{m}");
        assert!(p.signals().slowdown > 1.5, "{:?}", p.signals());
        let duty = sim.duty(&mut p, fg, Duration::from_secs(5));
        assert!(duty < MULT10_DUTY, "{duty}");
        // A slowdown nothing else explains is taken as the new normal
        // after a while of quiet idle windows: back to full speed.
        sim.run(&mut p, fg, Duration::from_secs(30));
        let duty = sim.duty(&mut p, fg, Duration::from_secs(5));
        assert!(duty > 0.9, "{duty}");
        // And when the contention goes away the baseline follows down at
        // once: a second slowdown is seen again.
        sim.run(&mut p, IDLE, Duration::from_secs(5));
        let m = sim.run(&mut p, fg, Duration::from_millis(1500));
        assert!(m >= 10.0, "{m}");
    }

    #[test]
    fn adaptive_yields_to_disk_bound_work() {
        // A direct-I/O writer: the disk busy, the CPUs idle, our units
        // slower.
        let mut p = adaptive();
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(5));
        let fg = Foreground {
            disk: 0.9,
            iops: 400.0,
            cpu: 0.03,
            stall: 0.6,
            slowdown: 1.5,
        };
        let m = sim.run(&mut p, fg, Duration::from_millis(500));
        assert!(m >= 10.0, "{m}");
        let duty = sim.duty(&mut p, fg, Duration::from_secs(10));
        assert!(duty < MULT10_DUTY / 3.0, "{duty}");
        let s = p.signals();
        assert!(s.disk > 0.9 && s.stall > 0.9, "{s:?}");
        // Moderate disk load: somewhere in between.
        let fg = Foreground {
            disk: 0.25,
            iops: 100.0,
            slowdown: 1.0,
            ..IDLE
        };
        let m = sim.run(&mut p, fg, Duration::from_secs(20));
        let want = 100.0 * (0.25 - LOAD_IDLE) / (LOAD_BUSY - LOAD_IDLE);
        assert!((m - want).abs() < 10.0, "{m} vs {want}");
    }

    #[test]
    fn adaptive_sees_foreign_requests_during_work() {
        // The disk is barely busy while we sleep (below LOAD_IDLE, so the
        // idle window alone would not slow us down), but during our work
        // three times as many foreign requests complete as our own.
        let mut p = adaptive();
        let mut sim = Sim::new();
        sim.run(&mut p, IDLE, Duration::from_secs(1));
        let mut m = 0.0;
        for _ in 0..10 {
            p.before_work(sim.now, Some(sim.sample()));
            sim.pass(25 * MS, 1.0, 4.0 * 24.0 / 0.025, 0.5, 0.0);
            let wait = p.after_work(sim.now, 25 * MS, 6, 6 << 20, Some(sim.sample()));
            sim.pass(wait, 0.03, 4000.0, 0.0, 0.0);
            m = p.multiplier();
        }
        assert!(m > 50.0, "{m}");
        assert!(p.signals().requests > 0.9, "{:?}", p.signals());
    }

    #[test]
    fn adaptive_without_signal_falls_back() {
        let mut p = Pacer::new(Pace::Adaptive {
            max_mult: 100,
            fallback_mult: 7,
        });
        p.before_work(Duration::ZERO, None);
        assert_eq!(p.after_work(10 * MS, 10 * MS, 1, 1 << 20, None), 70 * MS);
        assert_eq!(p.multiplier(), 7.0);
    }

    #[test]
    fn adaptive_without_cpu_counters_still_works() {
        // No /proc/stat, no PSI: disk counters and the own slowdown only.
        let mut p = adaptive();
        let mut now = Duration::ZERO;
        let mut s = LoadSample::default();
        let mut top = 0.0f64;
        for i in 0..110u32 {
            let work = if i < 100 { 25 * MS } else { 75 * MS };
            p.before_work(now, Some(s));
            now += work;
            s.ios += 24;
            let wait = p.after_work(now, work, 6, 6 << 20, Some(s));
            now += wait;
            if i == 99 {
                assert_eq!(p.multiplier(), 0.0);
            }
            top = top.max(p.multiplier());
        }
        assert!(top >= 20.0, "{top}");
    }

    #[test]
    fn long_batches_at_the_same_cost_per_byte_are_not_a_slowdown() {
        // Paced batches of 3 groups and full-speed ones of 11 at 9 ms a
        // group; each batch also makes 5 requests of its own (flushes, the
        // descriptor block): per request the long ones look 1.7× slower.
        let mut p = adaptive();
        let mut now = Duration::ZERO;
        let mut s = LoadSample::default();
        for i in 0..200u32 {
            let groups: u64 = if i % 20 < 10 { 3 } else { 11 };
            let work = 9 * MS * groups as u32;
            p.before_work(now, Some(s));
            now += work;
            s.ios += groups + 5;
            let wait = p.after_work(now, work, groups + 5, groups << 21, Some(s));
            now += wait;
            if i > 20 {
                assert!(
                    p.signals().slowdown < SLOW_SUSPECT,
                    "{i}: {:?}",
                    p.signals()
                );
                assert_eq!(p.multiplier(), 0.0, "{i}");
                assert!(wait <= work / 20, "{i}: {wait:?}");
            }
        }
    }
}
