//! The load signal of adaptive pacing: cumulative I/O counters of the disk
//! a filesystem lives on.
//!
//! [`SysfsLoad`] reads `/sys/block/<disk>/stat` (see the kernel's
//! `Documentation/block/stat.rst`): field 1 is reads completed, field 5
//! writes completed, field 10 `io_ticks`, the milliseconds during which
//! the disk had at least one request in flight. For an image file the disk
//! is the one holding the filesystem the file lives on
//! ([`ext4kit_device::backing_sysfs_dir`]); for a partition, the whole disk.
//! Each sample also carries the machine's CPU time (`/proc/stat`) and its
//! pressure stall totals (`/proc/pressure/{io,cpu}`) where they exist.

use std::path::{Path, PathBuf};

/// Cumulative counters of one disk at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadSample {
    /// Requests completed so far (reads + writes).
    pub ios: u64,
    /// Milliseconds the disk has been busy so far.
    pub io_ticks_ms: u64,
    /// Pressure stall information, when the kernel has it: microseconds
    /// so far during which some task was stalled waiting for I/O
    /// (`/proc/pressure/io`) and for a CPU (`/proc/pressure/cpu`), the
    /// "some" lines' `total`. This sees foreground programs that suffer
    /// even when the disk itself is not saturated (CPU-bound work that
    /// competes with our I/O path, e.g. through a loop device).
    pub stall_io_us: Option<u64>,
    pub stall_cpu_us: Option<u64>,
    /// CPU time of the whole machine so far, summed over all CPUs, in
    /// `/proc/stat` ticks: busy (user, nice, system, irq, softirq, steal;
    /// less our own process's user and system time) and in all (busy +
    /// idle + iowait). Sampled by the kernel at each timer tick, so only
    /// sums over many short windows are meaningful.
    pub cpu: Option<CpuTicks>,
}

/// CPU ticks of the whole machine (see [`LoadSample::cpu`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTicks {
    pub busy: u64,
    pub total: u64,
}

/// The aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat_cpu(text: &str) -> Option<CpuTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    // (guest time is already included in user).
    if f.len() < 7 {
        return None;
    }
    let steal = f.get(7).copied().unwrap_or(0);
    let busy = f[0]
        .saturating_add(f[1])
        .saturating_add(f[2])
        .saturating_add(f[5])
        .saturating_add(f[6])
        .saturating_add(steal);
    Some(CpuTicks {
        busy,
        total: busy.saturating_add(f[3]).saturating_add(f[4]),
    })
}

/// The CPU time (user + system, ticks) of the process whose
/// `/proc/<pid>/stat` this is: fields 14 and 15 after the `(comm)`.
pub fn parse_proc_pid_stat_cpu(text: &str) -> Option<u64> {
    // comm may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime.saturating_add(stime))
}

/// The machine's CPU ticks, less our own process's: what the rest of the
/// machine used. (Both are counted on the same timer ticks, so this takes
/// out exactly the ticks that caught us, e.g. reporting progress right
/// after a unit.)
fn read_cpu() -> Option<CpuTicks> {
    let mut c = parse_proc_stat_cpu(&std::fs::read_to_string("/proc/stat").ok()?)?;
    if let Some(own) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .as_deref()
        .and_then(parse_proc_pid_stat_cpu)
    {
        c.busy = c.busy.saturating_sub(own);
    }
    Some(c)
}

/// The `total=` of the "some" line of a `/proc/pressure/*` file.
pub fn parse_psi_some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

fn read_psi(name: &str) -> Option<u64> {
    parse_psi_some_total(&std::fs::read_to_string(Path::new("/proc/pressure").join(name)).ok()?)
}

/// A source of [`LoadSample`]s. `None` means "unknown right now".
pub trait LoadSignal: Send {
    fn sample(&mut self) -> Option<LoadSample>;
}

/// Parse the content of a sysfs block `stat` file.
pub fn parse_block_stat(text: &str) -> Option<LoadSample> {
    let f: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if f.len() < 11 {
        return None;
    }
    Some(LoadSample {
        ios: f[0].saturating_add(f[4]),
        io_ticks_ms: f[9],
        ..LoadSample::default()
    })
}

/// Counters read from a sysfs `stat` file.
#[derive(Clone, Debug)]
pub struct SysfsLoad {
    stat: PathBuf,
}

impl SysfsLoad {
    /// Read `stat_file` (it must be readable and parse now).
    pub fn from_stat_file(stat_file: impl Into<PathBuf>) -> Option<Self> {
        let s = SysfsLoad {
            stat: stat_file.into(),
        };
        let text = std::fs::read_to_string(&s.stat).ok()?;
        parse_block_stat(&text)?;
        Some(s)
    }

    /// The counters of the disk beneath `path` (a block device, or any
    /// file on a filesystem backed by one). `None` when there is no such
    /// disk (tmpfs, overlay, network filesystems, ...).
    pub fn for_path(path: impl AsRef<Path>) -> Option<Self> {
        let dir = ext4kit_device::backing_sysfs_dir(path)?;
        Self::from_stat_file(dir.join("stat"))
    }

    /// The `stat` file read.
    pub fn stat_file(&self) -> &Path {
        &self.stat
    }
}

impl LoadSignal for SysfsLoad {
    fn sample(&mut self) -> Option<LoadSample> {
        let mut s = parse_block_stat(&std::fs::read_to_string(&self.stat).ok()?)?;
        s.stall_io_us = read_psi("io");
        s.stall_cpu_us = read_psi("cpu");
        s.cpu = read_cpu();
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat() {
        let t = "  164916    52315 13117170    43585   412287   296578 21431448  1164386        0   491508  1213560        0        0        0        0    33620   5588\n";
        assert_eq!(
            parse_block_stat(t),
            Some(LoadSample {
                ios: 164916 + 412287,
                io_ticks_ms: 491508,
                ..LoadSample::default()
            })
        );
        // Old kernels: 11 fields.
        assert!(parse_block_stat("1 2 3 4 5 6 7 8 9 10 11").is_some());
        assert_eq!(parse_block_stat("1 2 3"), None);
        assert_eq!(parse_block_stat("a b c d e f g h i j k"), None);
    }

    #[test]
    fn parses_psi() {
        let t = "some avg10=3.87 avg60=5.75 avg300=9.98 total=547762103\nfull avg10=3.72 avg60=5.09 avg300=6.68 total=337668240\n";
        assert_eq!(parse_psi_some_total(t), Some(547_762_103));
        assert_eq!(parse_psi_some_total("full total=1\n"), None);
    }

    #[test]
    fn parses_proc_stat() {
        let t = "cpu  92440 3 17085 64366 2383 5 323 1808 7 0\ncpu0 45679 0 8919 32899 674 0 91 908 0 0\nintr 1\n";
        let busy = 92440 + 3 + 17085 + 5 + 323 + 1808;
        assert_eq!(
            parse_proc_stat_cpu(t),
            Some(CpuTicks {
                busy,
                total: busy + 64366 + 2383
            })
        );
        // Old kernels: no steal field.
        assert_eq!(
            parse_proc_stat_cpu("cpu 1 2 3 4 5 6 7\n"),
            Some(CpuTicks {
                busy: 1 + 2 + 3 + 6 + 7,
                total: 1 + 2 + 3 + 6 + 7 + 4 + 5
            })
        );
        assert_eq!(parse_proc_stat_cpu("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_proc_stat_cpu("cpu 1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(parse_proc_stat_cpu("cpu 1 2 3\n"), None);
    }

    #[test]
    fn parses_proc_pid_stat() {
        let t = "8452 (a b) c) R 8449 8449 6823 0 -1 4194304 123 0 0 0 17 4 0 0 20 0 1\n";
        assert_eq!(parse_proc_pid_stat_cpu(t), Some(21));
        assert_eq!(parse_proc_pid_stat_cpu("8452 (cat) R 1 2"), None);
        assert_eq!(parse_proc_pid_stat_cpu("no parenthesis"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        if !own.is_empty() {
            assert!(parse_proc_pid_stat_cpu(&own).is_some(), "{own}");
        }
    }

    #[test]
    fn real_sysfs_is_best_effort() {
        let tmp = std::env::temp_dir();
        if let Some(mut s) = SysfsLoad::for_path(&tmp) {
            let a = s.sample().expect("sample");
            let b = s.sample().expect("sample");
            assert!(b.ios >= a.ios && b.io_ticks_ms >= a.io_ticks_ms);
        } else {
            eprintln!("skip: no sysfs block device beneath {}", tmp.display());
        }
    }
}
