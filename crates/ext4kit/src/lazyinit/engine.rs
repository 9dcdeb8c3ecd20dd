//! The worker: one thread of control serving any number of filesystems.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::pacing::{Clock, Pace, Pacer, Signals};
use super::zero::{ZeroStats, Zeroer};
use super::{Job, LazyError, commit_zeroed};

/// Engine settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Pacing.
    pub pace: Pace,
    /// Most groups committed together (they also always share one
    /// descriptor block).
    pub max_batch_groups: u32,
    /// A batch is closed once its work took this long, while the pacer
    /// runs at full speed (`--mult 0`, or adaptive pacing seeing no load).
    pub max_batch_time: Duration,
    /// ... and this long while the pacer waits between batches: short
    /// bursts, like the kernel's one group at a time, so that foreground
    /// I/O never waits long behind ours.
    pub paced_batch_time: Duration,
    /// [`Engine::run`] sleeps in slices of at most this, checking the stop
    /// flag in between.
    pub sleep_slice: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            pace: Pace::default(),
            max_batch_groups: u32::MAX,
            max_batch_time: Duration::from_millis(100),
            paced_batch_time: Duration::from_millis(10),
            sleep_slice: Duration::from_millis(100),
        }
    }
}

/// Progress, as it happens.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// Work on a filesystem is about to start.
    Started {
        job: usize,
        device: &'a str,
        groups_total: u32,
        /// Groups that already have `ITABLE_ZEROED`.
        groups_done: u32,
        bytes_pending: u64,
    },
    /// A group's zeroes and flag are durable.
    GroupDone {
        job: usize,
        device: &'a str,
        group: u32,
        /// Groups with `ITABLE_ZEROED` now.
        groups_done: u32,
        groups_total: u32,
        /// This group.
        stats: ZeroStats,
        /// This filesystem, this run, so far.
        totals: ZeroStats,
    },
    /// A batch was committed; the filesystem's next batch waits `wait`.
    Batch {
        job: usize,
        device: &'a str,
        groups: u32,
        elapsed: Duration,
        wait: Duration,
        multiplier: f64,
        /// Foreign load estimate (adaptive pacing), 0..1.
        load: f64,
        /// The pressures behind it (adaptive pacing; all 0 otherwise).
        signals: Signals,
    },
    /// Every group of a filesystem is done.
    Finished { job: usize, device: &'a str },
    /// Work on a filesystem stopped on an error; the others go on.
    Failed {
        job: usize,
        device: &'a str,
        error: &'a LazyError,
    },
    /// A stop was requested; the current batch was committed.
    Stopped,
}

/// Receives [`Event`]s.
pub trait Observer {
    fn on_event(&mut self, event: &Event<'_>);
}

impl Observer for () {
    fn on_event(&mut self, _: &Event<'_>) {}
}

impl<F: FnMut(&Event<'_>)> Observer for F {
    fn on_event(&mut self, event: &Event<'_>) {
        self(event)
    }
}

/// What happened to one filesystem.
#[derive(Debug)]
pub struct JobReport {
    pub device: String,
    pub groups_total: u32,
    /// Groups with `ITABLE_ZEROED` at the end.
    pub groups_done: u32,
    /// Groups this run set `ITABLE_ZEROED` on.
    pub groups_zeroed_now: u32,
    /// Groups still without it.
    pub groups_remaining: u32,
    pub stats: ZeroStats,
    /// Time spent working (not waiting) on this filesystem.
    pub work_time: Duration,
    /// Why work stopped early, if it did.
    pub error: Option<LazyError>,
}

/// What a run did.
#[derive(Debug)]
pub struct Summary {
    pub jobs: Vec<JobReport>,
    /// A stop was requested before everything was done.
    pub stopped: bool,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Time spent waiting (pacing).
    pub slept: Duration,
}

impl Summary {
    /// Every filesystem is fully done, without error.
    pub fn complete(&self) -> bool {
        self.jobs
            .iter()
            .all(|j| j.error.is_none() && j.groups_remaining == 0)
    }

    /// Some filesystem failed.
    pub fn failed(&self) -> bool {
        self.jobs.iter().any(|j| j.error.is_some())
    }
}

/// What [`Engine::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ran one batch on filesystem `job` (successfully or not).
    Worked { job: usize },
    /// Nothing is due yet; the next unit is due after this wait.
    Wait(Duration),
    /// Nothing is left to do.
    Done,
}

struct Slot<'d> {
    job: Job<'d>,
    pacer: Pacer,
    zeroer: Zeroer,
    next_due: Duration,
    stats: ZeroStats,
    zeroed_now: u32,
    work_time: Duration,
    error: Option<LazyError>,
}

impl Slot<'_> {
    fn active(&self) -> bool {
        self.error.is_none() && !self.job.pending.is_empty()
    }
}

/// The single worker serving every filesystem given.
pub struct Engine<'a, 'd> {
    slots: Vec<Slot<'d>>,
    clock: &'a dyn Clock,
    opts: Options,
    stop: Option<&'a AtomicBool>,
    rr: usize,
    started: bool,
}

impl<'a, 'd> Engine<'a, 'd> {
    /// An engine over `jobs` (already prepared: every filesystem validated).
    pub fn new(jobs: Vec<Job<'d>>, opts: Options, clock: &'a dyn Clock) -> Self {
        let slots = jobs
            .into_iter()
            .map(|job| Slot {
                pacer: Pacer::new(opts.pace),
                zeroer: Zeroer::new(job.read_compare),
                job,
                next_due: Duration::ZERO,
                stats: ZeroStats::default(),
                zeroed_now: 0,
                work_time: Duration::ZERO,
                error: None,
            })
            .collect();
        Engine {
            slots,
            clock,
            opts,
            stop: None,
            rr: 0,
            started: false,
        }
    }

    /// Stop (after committing the current batch) once `flag` is set.
    pub fn with_stop_flag(mut self, flag: &'a AtomicBool) -> Self {
        self.stop = Some(flag);
        self
    }

    fn stop_requested(&self) -> bool {
        self.stop.is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// Run until everything is done, every filesystem failed, or a stop is
    /// requested; waits (pacing) on the clock.
    pub fn run(mut self, obs: &mut dyn Observer) -> Summary {
        let t0 = self.clock.now();
        let mut slept = Duration::ZERO;
        let mut stopped = false;
        loop {
            if self.stop_requested() {
                stopped = self.slots.iter().any(Slot::active);
                if stopped {
                    obs.on_event(&Event::Stopped);
                }
                break;
            }
            match self.step(obs) {
                Step::Worked { .. } => {}
                Step::Wait(d) => {
                    let d = d.min(self.opts.sleep_slice);
                    self.clock.sleep(d);
                    slept += d;
                }
                Step::Done => break,
            }
        }
        let elapsed = self.clock.now().saturating_sub(t0);
        self.into_summary(stopped, elapsed, slept)
    }

    /// Do at most one batch, never waiting. Emits `Started` events on the
    /// first call.
    pub fn step(&mut self, obs: &mut dyn Observer) -> Step {
        if !self.started {
            self.started = true;
            for (i, s) in self.slots.iter().enumerate() {
                obs.on_event(&Event::Started {
                    job: i,
                    device: &s.job.name,
                    groups_total: s.job.groups_total(),
                    groups_done: s.job.groups_total() - s.job.pending.len() as u32,
                    bytes_pending: s.job.pending_bytes(),
                });
                if s.job.pending.is_empty() {
                    obs.on_event(&Event::Finished {
                        job: i,
                        device: &s.job.name,
                    });
                }
            }
        }
        let n = self.slots.len();
        let mut best: Option<usize> = None;
        for k in 0..n {
            let i = (self.rr + k) % n;
            if !self.slots[i].active() {
                continue;
            }
            if best.is_none_or(|b| self.slots[i].next_due < self.slots[b].next_due) {
                best = Some(i);
            }
        }
        let Some(i) = best else {
            return Step::Done;
        };
        let now = self.clock.now();
        let due = self.slots[i].next_due;
        if due > now {
            return Step::Wait(due - now);
        }
        self.rr = (i + 1) % n;
        if let Err(e) = self.run_batch(i, obs) {
            let slot = &mut self.slots[i];
            obs.on_event(&Event::Failed {
                job: i,
                device: &slot.job.name,
                error: &e,
            });
            slot.error = Some(e);
        } else if self.slots[i].job.pending.is_empty() {
            obs.on_event(&Event::Finished {
                job: i,
                device: &self.slots[i].job.name,
            });
        }
        Step::Worked { job: i }
    }

    /// Zero one batch of filesystem `i` and commit it.
    fn run_batch(&mut self, i: usize, obs: &mut dyn Observer) -> Result<(), LazyError> {
        let clock = self.clock;
        let stop = self.stop;
        let opts = self.opts;
        let slot = &mut self.slots[i];
        let t0 = clock.now();
        let s0 = slot.job.load.as_mut().and_then(|l| l.sample());
        slot.pacer.before_work(t0, s0);

        let geom = slot.job.image.geometry().clone();
        let dev = slot.job.image.device();
        let Some(first) = slot.job.pending.front() else {
            return Ok(());
        };
        let di = geom.desc_block_index(first.group);
        // Refuse to zero anything if someone changed the descriptors.
        slot.job.image.verify_desc_block_unchanged(di)?;
        let mut requests = 1u64;
        let mut bytes = 0u64;
        let mut done: Vec<(u32, ZeroStats)> = Vec::new();
        let batch_time = if slot.pacer.full_speed() {
            opts.max_batch_time
        } else {
            opts.paced_batch_time
        };
        let mut blocks = 1u64;
        let mut last_block = di;
        while let Some(w) = slot.job.pending.get(done.len()) {
            if done.len() as u64 >= u64::from(opts.max_batch_groups) {
                break;
            }
            let b = geom.desc_block_index(w.group);
            if b != last_block {
                // A changed block ends the batch here (what was zeroed is
                // committed); the next batch starts with it and stops.
                if slot.job.image.verify_desc_block_unchanged(b).is_err() {
                    break;
                }
                (last_block, blocks) = (b, blocks + 1);
                requests += 1;
            }
            let (off, len) = w.byte_range(&geom);
            let st = slot.zeroer.zero_range(dev, off, len, geom.block_size)?;
            requests += st.requests;
            bytes += st.bytes_zeroed + st.bytes_read;
            done.push((w.group, st));
            if stop.is_some_and(|f| f.load(Ordering::SeqCst))
                || clock.now().saturating_sub(t0) >= batch_time
            {
                break;
            }
        }
        let groups: Vec<u32> = done.iter().map(|&(g, _)| g).collect();
        commit_zeroed(&mut slot.job.image, &groups)?;
        // flush, per descriptor block a re-read and its write, flush
        requests += 2 + 2 * blocks;
        slot.job.pending.drain(..done.len());
        let t1 = clock.now();
        let elapsed = t1.saturating_sub(t0);
        let s1 = slot.job.load.as_mut().and_then(|l| l.sample());
        let wait = slot.pacer.after_work(t1, elapsed, requests, bytes, s1);
        slot.next_due = t1 + wait;
        slot.work_time += elapsed;
        slot.zeroed_now += groups.len() as u32;

        let total = slot.job.groups_total();
        let done_before = total - slot.job.pending.len() as u32 - groups.len() as u32;
        for (groups_done, (g, st)) in (done_before + 1..).zip(done) {
            slot.stats += st;
            obs.on_event(&Event::GroupDone {
                job: i,
                device: &slot.job.name,
                group: g,
                groups_done,
                groups_total: total,
                stats: st,
                totals: slot.stats,
            });
        }
        obs.on_event(&Event::Batch {
            job: i,
            device: &slot.job.name,
            groups: groups.len() as u32,
            elapsed,
            wait,
            multiplier: slot.pacer.multiplier(),
            load: slot.pacer.load(),
            signals: slot.pacer.signals(),
        });
        Ok(())
    }

    fn into_summary(self, stopped: bool, elapsed: Duration, slept: Duration) -> Summary {
        let jobs = self
            .slots
            .into_iter()
            .map(|s| {
                let total = s.job.groups_total();
                let remaining = s.job.pending.len() as u32;
                JobReport {
                    device: s.job.name,
                    groups_total: total,
                    groups_done: total - remaining,
                    groups_zeroed_now: s.zeroed_now,
                    groups_remaining: remaining,
                    stats: s.stats,
                    work_time: s.work_time,
                    error: s.error,
                }
            })
            .collect();
        Summary {
            jobs,
            stopped,
            elapsed,
            slept,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ext4kit_device::{Device, DiscardOutcome, FaultDevice, MemDevice};
    use ext4kit_format::group_desc::BG_INODE_ZEROED;

    use super::*;
    use crate::image::Image;
    use crate::image::test_support::{ITB, synthetic, table_start};
    use crate::lazyinit::pacing::FakeClock;

    const BS: u64 = 1024;
    /// Used table blocks of group 0 in `synthetic` (11 inodes, 4 per block).
    const USED0: u64 = 3;

    fn noise(seed: &mut u64, buf: &mut [u8]) {
        for b in buf.iter_mut() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *b = (*seed >> 24) as u8 | 1;
        }
    }

    /// Fill every table with noise; returns the used blocks of group 0.
    fn fill_tables(dev: &dyn Device, groups: u32) -> Vec<u8> {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut buf = vec![0u8; (u64::from(groups) * ITB * BS) as usize];
        noise(&mut seed, &mut buf);
        let off = table_start(groups) * BS;
        // Keep the root inode: the cross-check looks for it.
        dev.read_at(&mut buf[256..512], off + 256).unwrap();
        dev.write_at(&buf, off).unwrap();
        buf[..(USED0 * BS) as usize].to_vec()
    }

    /// Check what must hold at any moment: descriptors valid, used blocks
    /// intact, every flagged group's tail zero. Returns the flagged count.
    fn check_invariants(dev: &dyn Device, groups: u32, used0: &[u8]) -> u32 {
        let img = Image::open(dev).expect("image stays valid");
        let ts = table_start(groups);
        let mut used = vec![0u8; used0.len()];
        dev.read_at(&mut used, ts * BS).unwrap();
        assert!(used == used0, "used inode blocks changed");
        let mut flagged = 0;
        for g in 0..groups {
            if img.desc_flags(g) & BG_INODE_ZEROED == 0 {
                continue;
            }
            flagged += 1;
            let first = if g == 0 { USED0 } else { 0 };
            let start = ts + u64::from(g) * ITB + first;
            let mut tail = vec![1u8; ((ITB - first) * BS) as usize];
            dev.read_at(&mut tail, start * BS).unwrap();
            assert!(
                tail.iter().all(|&b| b == 0),
                "group {g} flagged but not zero"
            );
        }
        flagged
    }

    fn run_all(dev: &dyn Device, opts: Options) -> Summary {
        let job = Job::prepare(dev).expect("prepare");
        let clock = FakeClock::new();
        Engine::new(vec![job], opts, &clock).run(&mut ())
    }

    fn full_speed() -> Options {
        Options {
            pace: Pace::Fixed { mult: 0 },
            ..Options::default()
        }
    }

    #[test]
    fn zeroes_tails_and_sets_flags() {
        for mc in [true, false] {
            let groups = 20;
            let dev = synthetic(mc, groups);
            let used0 = fill_tables(&dev, groups);
            let before = dev.allocated_chunks();
            let s = run_all(&dev, full_speed());
            assert!(s.complete(), "{s:?}");
            let j = &s.jobs[0];
            assert_eq!(
                (j.groups_done, j.groups_zeroed_now, j.groups_remaining),
                (20, 20, 0)
            );
            assert_eq!(j.stats.bytes_zeroed, (u64::from(groups) * ITB - USED0) * BS);
            assert_eq!(check_invariants(&dev, groups, &used0), groups);
            assert!(dev.allocated_chunks() < before);
            // A second run finds nothing to do and writes nothing.
            let snap = dev.to_bytes();
            let s = run_all(&dev, full_speed());
            assert!(s.complete());
            assert_eq!(s.jobs[0].groups_zeroed_now, 0);
            assert!(dev.to_bytes() == snap);
        }
    }

    #[test]
    fn one_batch_spans_descriptor_blocks() {
        // 48 groups of 64-byte descriptors in 1 KiB blocks: three blocks.
        let groups = 48;
        let dev = synthetic(true, groups);
        let used0 = fill_tables(&dev, groups);
        let job = Job::prepare(&dev).expect("prepare");
        assert_eq!(job.image.geometry().desc_blocks, 3);
        let clock = FakeClock::new();
        let mut batches = Vec::new();
        let mut obs = |e: &Event<'_>| {
            if let Event::Batch { groups, .. } = e {
                batches.push(*groups);
            }
        };
        let s = Engine::new(vec![job], full_speed(), &clock).run(&mut obs);
        assert!(s.complete(), "{s:?}");
        assert_eq!(batches, vec![groups], "one batch over the three blocks");
        assert_eq!(check_invariants(&dev, groups, &used0), groups);
    }

    #[test]
    fn a_changed_second_descriptor_block_ends_the_batch_before_it() {
        let groups = 48;
        let dev = synthetic(true, groups);
        fill_tables(&dev, groups);
        let job = Job::prepare(&dev).expect("prepare");
        // Someone changes the second descriptor block after the plan.
        let at = job.image.geometry().desc_block(1) * BS + 1000;
        dev.write_at(&[0x5a], at).unwrap();
        let clock = FakeClock::new();
        let s = Engine::new(vec![job], full_speed(), &clock).run(&mut ());
        let j = &s.jobs[0];
        assert_eq!((j.groups_zeroed_now, j.groups_remaining), (16, 32));
        let e = j.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("changed"), "{e}");
        let mut b = [0u8];
        dev.read_at(&mut b, at).unwrap();
        assert_eq!(b, [0x5a], "the changed block is not written");
    }

    /// A device on which time passes: every operation advances the fake
    /// clock (1 ms per 16 KiB zeroed or read, 2 ms per flush or write).
    struct Slow<'c> {
        inner: MemDevice,
        clock: &'c FakeClock,
    }
    impl Device for Slow<'_> {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, b: &mut [u8], o: u64) -> ext4kit_device::Result<()> {
            self.clock
                .advance(Duration::from_micros(b.len() as u64 * 1000 / 16384));
            self.inner.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> ext4kit_device::Result<()> {
            self.clock.advance(Duration::from_millis(2));
            self.inner.write_at(b, o)
        }
        fn flush(&self) -> ext4kit_device::Result<()> {
            self.clock.advance(Duration::from_millis(2));
            Ok(())
        }
        fn zeroout(&self, o: u64, l: u64) -> ext4kit_device::Result<()> {
            self.clock.advance(Duration::from_micros(l * 1000 / 16384));
            self.inner.zeroout(o, l)
        }
        fn discard(&self, o: u64, l: u64) -> ext4kit_device::Result<DiscardOutcome> {
            self.inner.discard(o, l)
        }
        fn name(&self) -> String {
            "slow".into()
        }
    }

    #[test]
    fn mult_4_sleeps_four_times_the_work() {
        let clock = FakeClock::new();
        let groups = 48;
        let dev = Slow {
            inner: synthetic(true, groups),
            clock: &clock,
        };
        fill_tables(&dev.inner, groups);
        // Make the work uneven: some groups' tables are already holes.
        for g in (0..groups).step_by(3).skip(1) {
            let b = table_start(groups) + u64::from(g) * ITB;
            dev.inner.zeroout(b * BS, ITB * BS).unwrap();
        }
        let job = Job::prepare(&dev).expect("prepare");
        let opts = Options {
            pace: Pace::Fixed { mult: 4 },
            max_batch_groups: 1,
            ..Options::default()
        };
        let mut work = Duration::ZERO;
        let mut batches = 0;
        let mut obs = |e: &Event<'_>| {
            if let Event::Batch { elapsed, .. } = e {
                work += *elapsed;
                batches += 1;
            }
        };
        let t0 = clock.now();
        let s = Engine::new(vec![job], opts, &clock).run(&mut obs);
        assert!(s.complete());
        assert_eq!(batches, groups);
        let slept = clock.total_slept();
        assert_eq!(slept, s.slept);
        assert_eq!(clock.now() - t0, work + slept);
        let ratio = slept.as_secs_f64() / work.as_secs_f64();
        assert!(
            (ratio - 4.0).abs() < 0.4,
            "sleep/work = {ratio} ({slept:?} / {work:?})"
        );
        // Sleeps come in slices no longer than the slice option.
        assert!(clock.sleeps().iter().all(|&d| d <= opts.sleep_slice));
    }

    #[test]
    fn full_speed_batches_are_long_paced_ones_short() {
        // 48 groups, 16 per descriptor block; each group's table takes
        // ~1 ms to zero on `Slow`. Batches close after max_batch_time at
        // full speed and after paced_batch_time while pacing waits.
        let batches = |mult: u32| {
            let clock = FakeClock::new();
            let dev = Slow {
                inner: synthetic(true, 48),
                clock: &clock,
            };
            fill_tables(&dev.inner, 48);
            let job = Job::prepare(&dev).expect("prepare");
            let opts = Options {
                pace: Pace::Fixed { mult },
                max_batch_time: Duration::from_millis(8),
                paced_batch_time: Duration::from_millis(2),
                ..Options::default()
            };
            let mut n = 0;
            let s = Engine::new(vec![job], opts, &clock).run(&mut |e: &Event<'_>| {
                if matches!(e, Event::Batch { .. }) {
                    n += 1;
                }
            });
            assert!(s.complete());
            n
        };
        let (fast, paced) = (batches(0), batches(1));
        assert!(fast >= 2, "{fast}");
        assert!(paced >= 3 * fast, "{paced} vs {fast}");
    }

    #[test]
    fn round_robin_across_filesystems() {
        let a = synthetic(true, 5);
        let b = synthetic(false, 3);
        let jobs = vec![Job::prepare(&a).unwrap(), Job::prepare(&b).unwrap()];
        let opts = Options {
            max_batch_groups: 1,
            ..full_speed()
        };
        let clock = FakeClock::new();
        let mut order = Vec::new();
        let mut obs = |e: &Event<'_>| {
            if let Event::GroupDone { job, group, .. } = e {
                order.push((*job, *group));
            }
        };
        let s = Engine::new(jobs, opts, &clock).run(&mut obs);
        assert!(s.complete());
        assert_eq!(
            order,
            vec![
                (0, 0),
                (1, 0),
                (0, 1),
                (1, 1),
                (0, 2),
                (1, 2),
                (0, 3),
                (0, 4)
            ]
        );
    }

    #[test]
    fn paced_filesystems_interleave_by_due_time() {
        // With pacing, the worker serves whichever filesystem is due and
        // sleeps only when none is.
        let clock = FakeClock::new();
        let a = Slow {
            inner: synthetic(true, 4),
            clock: &clock,
        };
        let b = Slow {
            inner: synthetic(true, 4),
            clock: &clock,
        };
        fill_tables(&a.inner, 4);
        let jobs = vec![Job::prepare(&a).unwrap(), Job::prepare(&b).unwrap()];
        let opts = Options {
            pace: Pace::Fixed { mult: 1 },
            max_batch_groups: 1,
            ..Options::default()
        };
        let s = Engine::new(jobs, opts, &clock).run(&mut ());
        assert!(s.complete());
        // b's batches (holes only) are short, a's long; each waits its own
        // multiple, so the total wait is less than the sum of both.
        let work: Duration = s.jobs.iter().map(|j| j.work_time).sum();
        assert!(s.slept < work, "{:?} vs {work:?}", s.slept);
    }

    #[test]
    fn stop_flag_commits_current_batch_and_resume_finishes() {
        let groups = 6;
        let dev = synthetic(true, groups);
        let used0 = fill_tables(&dev, groups);
        let stop = AtomicBool::new(false);
        let clock = FakeClock::new();
        let opts = Options {
            max_batch_groups: 2,
            ..full_speed()
        };
        let mut obs = |e: &Event<'_>| {
            if let Event::GroupDone { group: 0, .. } = e {
                stop.store(true, Ordering::SeqCst);
            }
        };
        let job = Job::prepare(&dev).unwrap();
        let s = Engine::new(vec![job], opts, &clock)
            .with_stop_flag(&stop)
            .run(&mut obs);
        assert!(s.stopped && !s.complete() && !s.failed());
        assert_eq!(s.jobs[0].groups_zeroed_now, 2);
        assert_eq!(check_invariants(&dev, groups, &used0), 2);
        let s = run_all(&dev, full_speed());
        assert!(s.complete());
        assert_eq!(s.jobs[0].groups_zeroed_now, 4);
        assert_eq!(check_invariants(&dev, groups, &used0), groups);
    }

    #[test]
    fn descriptor_change_fails_the_job_without_zeroing() {
        let dev = synthetic(true, 3);
        let used0 = fill_tables(&dev, 3);
        let job = Job::prepare(&dev).unwrap();
        // Someone writes to the descriptor block after we planned.
        dev.write_at(&[1], 2048 + 64 * 2 + 0x3C).unwrap();
        let snap = dev.to_bytes();
        let clock = FakeClock::new();
        let mut failed = 0;
        let s = Engine::new(vec![job], full_speed(), &clock).run(&mut |e: &Event<'_>| {
            if matches!(e, Event::Failed { .. }) {
                failed += 1;
            }
        });
        assert_eq!(failed, 1);
        assert!(s.failed());
        let err = s.jobs[0].error.as_ref().unwrap().to_string();
        assert!(err.contains("changed on disk"), "{err}");
        assert!(dev.to_bytes() == snap, "nothing may be written");
        let _ = used0;
    }

    #[test]
    fn power_cut_at_every_op_keeps_the_image_consistent() {
        let groups = 5;
        let base = synthetic(true, groups);
        let used0 = fill_tables(&base, groups);
        for batch in [1, u32::MAX] {
            let opts = Options {
                max_batch_groups: batch,
                ..full_speed()
            };
            let total = {
                let mem = Arc::new(base.snapshot());
                let dev = FaultDevice::new(Arc::clone(&mem));
                let ctl = dev.control();
                assert!(run_all(&dev, opts).complete());
                ctl.ops()
            };
            assert!(total >= 4, "{total}");
            for k in 1..=total {
                let mem = Arc::new(base.snapshot());
                let dev = FaultDevice::new(Arc::clone(&mem));
                dev.control().power_cut_after(k);
                let s = run_all(&dev, opts);
                assert_eq!(s.complete(), k == total, "batch {batch} k {k}");
                drop(dev);
                let flagged = check_invariants(&*mem, groups, &used0);
                assert!(flagged <= groups);
                let s = run_all(&*mem, opts);
                assert!(s.complete());
                assert_eq!(check_invariants(&*mem, groups, &used0), groups);
            }
        }
    }
}
