//! `ext4kit lazyinit`: zero the inode tables mke2fs left for the kernel's
//! lazy init, offline, on image files and block devices.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use ext4kit::lazyinit::engine::{Event, Observer, Options, Summary};
use ext4kit::lazyinit::{
    DeviceKind, Engine, Job, MonotonicClock, Pace, SysfsLoad, VerifyZero, ZeroStats,
};
use ext4kit_device::{Device, NbdUri, OpenOptions, open_device};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

/// Longest batch of a paced run while it runs at full speed (adaptive
/// pacing seeing no load): long enough that the flushes that close batches
/// cost a few percent, short enough that a foreground starting meanwhile
/// waits little behind it before pacing sees it.
const IDLE_BATCH_TIME: Duration = Duration::from_millis(40);

/// Exit code when stopped by a signal: 128 + its number, as a shell
/// reports a process killed by it (SIGINT 130, SIGTERM 143). Progress is
/// kept; rerun to resume.
pub fn exit_code_for_signal(sig: i32) -> i32 {
    128 + sig
}

/// A path as shown in messages: control characters (a newline in a file
/// name) escaped, so that every message stays on one line.
pub fn shown(path: &Path) -> String {
    one_line(&path.display().to_string())
}

/// `s` with control characters escaped (`\n`, `\t`, `\u{1b}`).
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How to pace.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaceMode {
    /// Wait MULT × the measured work time after each batch of groups.
    Fixed,
    /// Full speed while the disk is otherwise idle, backing off up to
    /// MAX_MULT as other I/O appears (from /sys/block/<disk>/stat).
    Adaptive,
}

/// `--verify-zero`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyArg {
    /// Read before zeroing on non-rotational block devices only.
    Auto,
    /// Always read first; zero only what is not zero yet.
    Always,
    /// Never read; zero everything that is not a hole.
    Never,
}

impl From<VerifyArg> for VerifyZero {
    fn from(v: VerifyArg) -> Self {
        match v {
            VerifyArg::Auto => VerifyZero::Auto,
            VerifyArg::Always => VerifyZero::Always,
            VerifyArg::Never => VerifyZero::Never,
        }
    }
}

/// Zero the inode tables the kernel's lazy init would zero, offline.
///
/// Every filesystem given is validated before anything is written to any
/// of them. One worker serves them all, a batch of groups at a time.
/// Progress is kept in the filesystems' own group flags: an interrupted
/// run resumes where it stopped.
#[derive(clap::Args, Debug)]
pub struct LazyinitArgs {
    /// ext4 image files or block devices (unmounted).
    #[arg(required = true, value_name = "DEVICE")]
    pub devices: Vec<PathBuf>,

    /// After each batch, wait N × the time it took (the kernel's
    /// init_itable=N); 0 = full speed.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub mult: u32,

    /// Pacing: fixed (--mult) or adaptive (idle → full speed, load →
    /// back off to --max-mult; --mult applies where no I/O counters exist).
    #[arg(long, value_enum, default_value_t = PaceMode::Fixed)]
    pub pace: PaceMode,

    /// Highest multiplier of adaptive pacing.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub max_mult: u32,

    /// Read table ranges before zeroing them: auto (non-rotational block
    /// devices), always, never. Holes of image files are always skipped.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = VerifyArg::Auto)]
    pub verify_zero: VerifyArg,

    /// Progress as JSON lines on stdout, then a summary object.
    #[arg(long)]
    pub json: bool,

    /// No progress, no summary (errors still go to stderr).
    #[arg(long, short)]
    pub quiet: bool,

    /// Validate and show what would be done; write nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Most groups committed together (default: a descriptor block's worth).
    #[arg(long, value_name = "N", hide = true)]
    pub max_batch_groups: Option<u32>,
}

/// Run `ext4kit lazyinit`; returns the exit code.
pub fn run(args: &LazyinitArgs) -> anyhow::Result<i32> {
    let signals = install_signal_handlers()?;
    let stop = Arc::clone(&signals.stop);
    let out = Output::new(args);

    // 1. Open everything (exclusively, refusing mounted devices).
    let mut refused = 0usize;
    let mut devs: Vec<(PathBuf, Box<dyn Device>)> = Vec::new();
    let mut seen: HashMap<Identity, PathBuf> = HashMap::new();
    for path in &args.devices {
        if let Some(id) = file_identity(path)
            && let Some(first) = seen.insert(id, path.clone())
        {
            out.refuse(path, &format!("same device as {}", shown(&first)));
            refused += 1;
            continue;
        }
        let opts = if args.dry_run {
            OpenOptions::read_only()
        } else {
            OpenOptions::read_write()
        };
        match open_device(path, opts) {
            Ok(d) => {
                if ext4kit_device::is_device_uri(path) && d.reports_allocation() {
                    // An NBD export: one whole-device BLOCK_STATUS (its
                    // slices pipelined) fills the client's known-zero
                    // cache, so the per-group questions below are
                    // answered without a round trip each. Only a warm-up:
                    // an error here comes back on the real questions.
                    let _ = d.known_zero_ranges(0, d.size());
                }
                devs.push((path.clone(), d))
            }
            Err(e) => {
                out.refuse(path, &e.to_string());
                refused += 1;
            }
        }
    }

    // 2. Validate and plan every filesystem before writing to any.
    let mut jobs: Vec<Job<'_>> = Vec::new();
    for (path, dev) in &devs {
        match Job::prepare(dev.as_ref()) {
            Ok(mut job) => {
                job.set_name(shown(path));
                if job.no_group_checksums() {
                    out.note(&format!(
                        "{}: nothing to do: no group descriptor checksums (neither metadata_csum nor uninit_bg), so no inode table was left for lazy init",
                        shown(path)
                    ));
                }
                let kind = DeviceKind::of_path(path);
                job.set_read_compare(
                    VerifyZero::from(args.verify_zero).read_compare(kind, dev.is_rotational()),
                );
                if args.pace == PaceMode::Adaptive {
                    match SysfsLoad::for_path(path) {
                        Some(l) => job.set_load_signal(Box::new(l)),
                        None => out.note(&format!(
                            "{}: no I/O counters for the disk beneath it; pacing at fixed x{}",
                            shown(path),
                            args.mult
                        )),
                    }
                }
                jobs.push(job);
            }
            Err(e) => {
                out.refuse(path, &e.to_string());
                refused += 1;
            }
        }
    }
    if refused > 0 {
        out.note(&format!(
            "refused {refused} of {} filesystem(s); nothing was written",
            args.devices.len()
        ));
        return Ok(1);
    }

    if args.dry_run {
        for job in &jobs {
            out.plan(job);
        }
        return Ok(0);
    }

    // 3. Work.
    let paced = args.mult > 0 || matches!(args.pace, PaceMode::Adaptive);
    let opts = Options {
        pace: match args.pace {
            PaceMode::Fixed => Pace::Fixed { mult: args.mult },
            PaceMode::Adaptive => Pace::Adaptive {
                max_mult: args.max_mult,
                fallback_mult: args.mult,
            },
        },
        max_batch_groups: args.max_batch_groups.unwrap_or(u32::MAX).max(1),
        // Paced batches are short (Options::paced_batch_time), batches at
        // full speed long enough that their flushes cost little; adaptive
        // pacing switches between the two with the load it sees.
        max_batch_time: if paced {
            IDLE_BATCH_TIME
        } else {
            Options::default().max_batch_time
        },
        ..Options::default()
    };
    // The bar counts groups as the summary does: those with ITABLE_ZEROED
    // out of all groups.
    let total_groups: u64 = jobs.iter().map(|j| u64::from(j.groups_total())).sum();
    let done_groups: u64 = jobs
        .iter()
        .map(|j| u64::from(j.groups_total()) - j.pending().len() as u64)
        .sum();
    let clock = MonotonicClock::new();
    let mut progress = Progress::new(&out, total_groups, done_groups);
    let summary = Engine::new(jobs, opts, &clock)
        .with_stop_flag(&stop)
        .run(&mut progress);
    progress.finish();
    out.summary(&summary);

    Ok(if summary.failed() {
        1
    } else if summary.stopped {
        exit_code_for_signal(signals.received())
    } else {
        0
    })
}

/// The flags the signal handlers set.
struct Signals {
    /// Any stop signal arrived: the engine stops after the current batch.
    stop: Arc<AtomicBool>,
    /// SIGTERM arrived (else it was SIGINT).
    term: Arc<AtomicBool>,
}

impl Signals {
    /// The signal that stopped the run (SIGTERM wins if both came).
    fn received(&self) -> i32 {
        if self.term.load(Ordering::SeqCst) {
            signal_hook::consts::SIGTERM
        } else {
            signal_hook::consts::SIGINT
        }
    }
}

/// SIGINT and SIGTERM set the stop flag (the engine stops after the
/// current batch); a second one terminates at once, with 128 + its number.
fn install_signal_handlers() -> anyhow::Result<Signals> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let stop = Arc::new(AtomicBool::new(false));
    let term = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // Order matters: the conditional shutdown sees the flag as it was
        // before this signal sets it.
        signal_hook::flag::register_conditional_shutdown(
            sig,
            exit_code_for_signal(sig),
            Arc::clone(&stop),
        )
        .context("installing signal handlers")?;
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    signal_hook::flag::register(SIGTERM, Arc::clone(&term))
        .context("installing signal handlers")?;
    Ok(Signals { stop, term })
}

/// (st_dev, st_ino) of a file, (0, st_rdev) of a block device; an NBD
/// URI by the export it reaches ([`NbdUri::identity`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Identity {
    Inode(u64, u64),
    Export(String),
}

fn file_identity(path: &Path) -> Option<Identity> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if ext4kit_device::is_device_uri(path) {
        let u = NbdUri::parse(path.to_str()?).ok()?;
        return u.identity().map(Identity::Export);
    }
    let m = std::fs::metadata(path).ok()?;
    if m.file_type().is_block_device() {
        Some(Identity::Inode(0, m.rdev()))
    } else {
        Some(Identity::Inode(m.dev(), m.ino()))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Json,
    Human { bar: bool },
    Quiet,
}

/// Where messages go.
struct Output {
    mode: Mode,
}

impl Output {
    fn new(args: &LazyinitArgs) -> Self {
        let mode = if args.json {
            Mode::Json
        } else if args.quiet {
            Mode::Quiet
        } else {
            Mode::Human {
                bar: std::io::stderr().is_terminal(),
            }
        };
        Output { mode }
    }

    fn json_line(&self, v: &serde_json::Value) {
        // A closed stdout must not abort the work: the flags on disk are
        // the real record.
        outln!("{v}");
    }

    /// A filesystem is refused: always a one-line message on stderr.
    fn refuse(&self, path: &Path, reason: &str) {
        let reason = one_line(reason);
        let shown = shown(path);
        if reason.starts_with(&shown) {
            eprintln!("ext4kit: {reason}");
        } else {
            eprintln!("ext4kit: {shown}: {reason}");
        }
        if self.mode == Mode::Json {
            self.json_line(&json!({
                "event": "refused",
                "device": path.display().to_string(),
                "reason": reason,
            }));
        }
    }

    fn note(&self, msg: &str) {
        if self.mode != Mode::Quiet {
            eprintln!("ext4kit: {}", one_line(msg));
        }
    }

    fn plan(&self, job: &Job<'_>) {
        let pending = job.pending().len();
        let bytes = job.pending_bytes();
        match self.mode {
            Mode::Json => self.json_line(&json!({
                "event": "plan",
                "device": job.name(),
                "groups_total": job.groups_total(),
                "groups_done": job.groups_zeroed_before(),
                "groups_pending": pending,
                "bytes_pending": bytes,
            })),
            Mode::Human { .. } => outln!(
                "{}: {} of {} groups to zero, {} of inode table at most",
                job.name(),
                pending,
                job.groups_total(),
                human_bytes(bytes)
            ),
            Mode::Quiet => {}
        }
    }

    fn summary(&self, s: &Summary) {
        match self.mode {
            Mode::Json => {
                let devices: Vec<_> = s
                    .jobs
                    .iter()
                    .map(|j| {
                        json!({
                            "device": j.device,
                            "groups_total": j.groups_total,
                            "groups_done": j.groups_done,
                            "groups_zeroed_now": j.groups_zeroed_now,
                            "groups_remaining": j.groups_remaining,
                            "bytes_zeroed": j.stats.bytes_zeroed,
                            "bytes_skipped_already_zero": j.stats.bytes_skipped_already_zero,
                            "bytes_read": j.stats.bytes_read,
                            "work_ms": j.work_time.as_millis() as u64,
                            "error": j.error.as_ref().map(|e| e.to_string()),
                        })
                    })
                    .collect();
                self.json_line(&json!({
                    "event": "summary",
                    "complete": s.complete(),
                    "stopped": s.stopped,
                    "elapsed_ms": s.elapsed.as_millis() as u64,
                    "slept_ms": s.slept.as_millis() as u64,
                    "devices": devices,
                }));
                if s.stopped {
                    eprintln!("ext4kit: interrupted; progress is saved, run again to resume");
                }
            }
            Mode::Human { .. } => {
                for j in &s.jobs {
                    let st = &j.stats;
                    if j.error.is_none() && j.groups_zeroed_now == 0 && j.groups_remaining == 0 {
                        eprintln!(
                            "{}: nothing to do: {}/{} groups zeroed already",
                            j.device, j.groups_done, j.groups_total
                        );
                        continue;
                    }
                    eprintln!(
                        "{}: {}/{} groups zeroed ({} this run): {} zeroed, {} already zero{}",
                        j.device,
                        j.groups_done,
                        j.groups_total,
                        j.groups_zeroed_now,
                        human_bytes(st.bytes_zeroed),
                        human_bytes(st.bytes_skipped_already_zero),
                        if st.bytes_read > 0 {
                            format!(", {} read to check", human_bytes(st.bytes_read))
                        } else {
                            String::new()
                        }
                    );
                }
                if s.stopped {
                    eprintln!(
                        "ext4kit: interrupted; progress is saved, run the same command again to resume"
                    );
                }
            }
            Mode::Quiet => {
                if s.stopped {
                    eprintln!("ext4kit: interrupted; run again to resume");
                }
            }
        }
        for j in &s.jobs {
            if let Some(e) = &j.error {
                eprintln!("ext4kit: {}: {}", j.device, one_line(&e.to_string()));
            }
        }
    }
}

/// The engine observer: progress bar, JSON lines, or nothing.
struct Progress<'o> {
    out: &'o Output,
    bar: Option<ProgressBar>,
    started: Instant,
    /// Bytes actually zeroed (holes and zeros found by reading excluded):
    /// the rate shown is the work done, not the ground covered.
    bytes: u64,
}

impl<'o> Progress<'o> {
    /// `total_groups` of every filesystem, `done_groups` already with
    /// ITABLE_ZEROED: the bar counts as the summary does.
    fn new(out: &'o Output, total_groups: u64, done_groups: u64) -> Self {
        let bar = match out.mode {
            Mode::Human { bar: true } => {
                let b =
                    ProgressBar::with_draw_target(Some(total_groups), ProgressDrawTarget::stderr());
                b.set_position(done_groups);
                b.reset_eta();
                let style = ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} groups  {msg}  ETA {eta}",
                )
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                b.set_style(style);
                b.enable_steady_tick(Duration::from_millis(200));
                Some(b)
            }
            _ => None,
        };
        Progress {
            out,
            bar,
            started: Instant::now(),
            bytes: 0,
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    fn stats_json(v: &mut serde_json::Value, st: &ZeroStats) {
        v["bytes_zeroed"] = st.bytes_zeroed.into();
        v["bytes_skipped_already_zero"] = st.bytes_skipped_already_zero.into();
        v["bytes_read"] = st.bytes_read.into();
    }
}

impl Observer for Progress<'_> {
    fn on_event(&mut self, ev: &Event<'_>) {
        match self.out.mode {
            Mode::Json => {
                let v = match ev {
                    Event::Started {
                        device,
                        groups_total,
                        groups_done,
                        bytes_pending,
                        ..
                    } => json!({
                        "event": "start",
                        "device": device,
                        "groups_done": groups_done,
                        "groups_total": groups_total,
                        "bytes_pending": bytes_pending,
                    }),
                    Event::GroupDone {
                        device,
                        group,
                        groups_done,
                        groups_total,
                        totals,
                        ..
                    } => {
                        let mut v = json!({
                            "event": "group",
                            "device": device,
                            "group": group,
                            "groups_done": groups_done,
                            "groups_total": groups_total,
                        });
                        Self::stats_json(&mut v, totals);
                        v
                    }
                    Event::Batch {
                        device,
                        groups,
                        elapsed,
                        wait,
                        multiplier,
                        load,
                        signals,
                        ..
                    } => json!({
                        "event": "batch",
                        "device": device,
                        "groups": groups,
                        "work_us": elapsed.as_micros() as u64,
                        "wait_us": wait.as_micros() as u64,
                        "mult": (multiplier * 100.0).round() / 100.0,
                        "load": (load * 1000.0).round() / 1000.0,
                        "signals": {
                            "disk": (signals.disk * 1000.0).round() / 1000.0,
                            "stall": (signals.stall * 1000.0).round() / 1000.0,
                            "cpu": (signals.cpu * 1000.0).round() / 1000.0,
                            "requests": (signals.requests * 1000.0).round() / 1000.0,
                            "slowdown": (signals.slowdown * 1000.0).round() / 1000.0,
                        },
                    }),
                    Event::Finished { device, .. } => {
                        json!({"event": "finished", "device": device})
                    }
                    Event::Failed { device, error, .. } => {
                        json!({"event": "error", "device": device, "reason": error.to_string()})
                    }
                    Event::Stopped => json!({"event": "stopped"}),
                    _ => return,
                };
                self.out.json_line(&v);
            }
            Mode::Human { bar } => match ev {
                Event::GroupDone { device, stats, .. } => {
                    self.bytes += stats.bytes_zeroed;
                    if let Some(b) = &self.bar {
                        b.set_message(format!(
                            "{device}  {}",
                            rate(self.bytes, self.started.elapsed())
                        ));
                        b.inc(1);
                    }
                }
                Event::Failed { device, error, .. } => {
                    let msg = format!("ext4kit: {device}: {}", one_line(&error.to_string()));
                    match &self.bar {
                        Some(b) => b.println(msg),
                        None => eprintln!("{msg}"),
                    }
                }
                Event::Stopped => {
                    let msg = "ext4kit: stopping after the current batch (signal received)";
                    match &self.bar {
                        Some(b) => b.println(msg),
                        None => eprintln!("{msg}"),
                    }
                }
                Event::Started {
                    device,
                    groups_total,
                    groups_done,
                    bytes_pending,
                    ..
                } if !bar => eprintln!(
                    "{device}: {} of {groups_total} groups to zero ({} at most)",
                    groups_total - groups_done,
                    human_bytes(*bytes_pending)
                ),
                _ => {}
            },
            Mode::Quiet => {}
        }
    }
}

/// The zeroing rate for the bar: bytes actually zeroed per second.
fn rate(bytes: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    format!("{:.1} MB/s zeroed", bytes as f64 / secs / 1e6)
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_counts_only_what_was_given() {
        assert_eq!(rate(0, Duration::from_secs(1)), "0.0 MB/s zeroed");
        assert_eq!(rate(5_000_000, Duration::from_secs(2)), "2.5 MB/s zeroed");
    }

    #[test]
    fn signal_exit_codes() {
        assert_eq!(exit_code_for_signal(signal_hook::consts::SIGINT), 130);
        assert_eq!(exit_code_for_signal(signal_hook::consts::SIGTERM), 143);
    }

    #[test]
    fn paths_stay_on_one_line() {
        assert_eq!(shown(Path::new("a\nb.img")), "a\\nb.img");
        assert_eq!(one_line("x\ty"), "x\\ty");
        assert_eq!(shown(Path::new("plain é.img")), "plain é.img");
    }

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
