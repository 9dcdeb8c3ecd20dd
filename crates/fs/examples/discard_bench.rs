//! Seed 002's experiment on the engine: the commit latency after deleting
//! many fragmented files on a device whose discards take a few ms each.
//!
//! Per run: mke2fs a sparse image, write `FILES` files of `BLOCKS` blocks
//! one block at a time in turn (every file's blocks alternate with the
//! others'), commit, make every discard take `DELAY_MS`, delete every
//! other file (so no two freed blocks are adjacent: one discard each),
//! and time the commit (`sync`). Modes, interleaved run by run:
//!
//! - `nodiscard`: no discard at all (the baseline commit);
//! - `sequential`: the freed extents discarded one by one on the commit
//!   path (the kernel before seed 002, `ext4_free_data_callback`);
//! - `parallel-wait`: all issued at once on `WORKERS` threads and waited
//!   for at commit (seed 002's patch: 17.0 s -> 4.8 s);
//! - `ext4kit`: `-o discard` of the engine: queued at commit, issued by
//!   `WORKERS` threads, never waited for; "drain" is the time until the
//!   last discard finished.
//!
//! `discard_bench thin IMG MIB` instead measures the image file's
//! allocation after a delete with discard and an immediate close (and
//! after a crash plus a reopen with discard).
//!
//! `cargo run --release -p ext4kit-fs --example discard_bench -- IMG
//! [FILES] [BLOCKS] [DELAY_MS] [WORKERS] [RUNS] [FLUSH_MS]` (defaults 64 64
//! 5 8 3 2; FLUSH_MS: the latency of each device flush, two per commit,
//! so that the commit has a device cost as on real storage).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit_device::{DelayDevice, Device, FileDevice, OpenOptions};
use ext4kit_format::inode::S_IFREG;
use ext4kit_fs::FsError;
use ext4kit_fs::discard::{DiscardOptions, Reconcile};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

const ROOT: u32 = 2;

fn out(s: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{s}");
}

fn mkfs(img: &Path, size: u64) -> Result<(), String> {
    let f = std::fs::File::create(img).map_err(|e| format!("{}: {e}", img.display()))?;
    f.set_len(size).map_err(|e| e.to_string())?;
    drop(f);
    let st = Command::new("mke2fs")
        .args(["-F", "-q", "-t", "ext4", "-b", "4096", "-E", "nodiscard"])
        .arg(img)
        .status()
        .map_err(|e| format!("mke2fs: {e}"))?;
    if !st.success() {
        return Err(format!("mke2fs failed on {}", img.display()));
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    NoDiscard,
    Sequential,
    ParallelWait,
    Ext4kit,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoDiscard => "nodiscard",
            Mode::Sequential => "sequential",
            Mode::ParallelWait => "parallel-wait",
            Mode::Ext4kit => "ext4kit",
        }
    }
}

struct Run {
    commit: Duration,
    drain: Duration,
    discards: u64,
    max_in_flight: u64,
}

/// Adjacent (start, len) ranges merged, sorted.
fn merged(freed: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v = freed.to_vec();
    v.sort_unstable();
    let mut m: Vec<(u64, u64)> = Vec::new();
    for (s, n) in v {
        match m.last_mut() {
            Some(l) if l.0 + l.1 == s => l.1 += n,
            _ => m.push((s, n)),
        }
    }
    m
}

struct Params {
    files: u64,
    blocks: u64,
    delay: Duration,
    flush: Duration,
    workers: usize,
}

fn one(img: &Path, mode: Mode, p: &Params) -> Result<Run, FsError> {
    let (files, blocks, delay, workers) = (p.files, p.blocks, p.delay, p.workers);
    mkfs(img, 512 << 20).map_err(FsError::Unsupported)?;
    let o = OpenOptions {
        write: true,
        exclusive: false,
    };
    let dev = Arc::new(DelayDevice::new(FileDevice::open(img, o)?));
    let ctl = dev.control();
    let opts = RwOptions {
        discard: (mode == Mode::Ext4kit).then(|| DiscardOptions {
            workers,
            reconcile: Reconcile::Off,
            ..DiscardOptions::default()
        }),
        ..RwOptions::default()
    };
    let fs = Filesystem::open(dev.clone() as Arc<dyn Device>, opts)?;
    let bs = u64::from(fs.rw().geometry().block_size);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if matches!(mode, Mode::Sequential | Mode::ParallelWait) {
        let d = dev.clone();
        let armed = armed.clone();
        fs.rw().journal().add_freed_hook(Box::new(move |_, freed| {
            if !armed.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let ranges = merged(freed);
            if mode == Mode::Sequential {
                for (s, n) in ranges {
                    let _ = d.discard(s * bs, n * bs);
                }
            } else {
                let next = std::sync::atomic::AtomicUsize::new(0);
                std::thread::scope(|sc| {
                    for _ in 0..workers {
                        sc.spawn(|| {
                            loop {
                                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                let Some(&(s, n)) = ranges.get(i) else { break };
                                let _ = d.discard(s * bs, n * bs);
                            }
                        });
                    }
                });
            }
        }));
    }
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let inos: Vec<u32> = (0..files)
        .map(|i| {
            fs.create(ROOT, format!("f{i}").as_bytes(), &spec)
                .map(|r| r.0.ino)
        })
        .collect::<Result<_, _>>()?;
    let blk = vec![0x5Au8; bs as usize];
    for b in 0..blocks {
        for &ino in &inos {
            fs.write_at(ino, b * bs, &blk)?;
        }
    }
    fs.sync()?;
    ctl.set_discard_delay(delay);
    ctl.set_flush_delay(p.flush);
    ctl.reset_counters();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    for i in (0..files).step_by(2) {
        fs.unlink(ROOT, format!("f{i}").as_bytes())?;
    }
    let t = Instant::now();
    fs.sync()?;
    let commit = t.elapsed();
    fs.wait_discards();
    let drain = t.elapsed();
    let r = Run {
        commit,
        drain,
        discards: ctl.discards(),
        max_in_flight: ctl.max_in_flight(),
    };
    ctl.set_discard_delay(Duration::ZERO);
    ctl.set_flush_delay(Duration::ZERO);
    fs.close()?;
    Ok(r)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// st_blocks × 512 of a file.
fn allocated(img: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(img).map_or(0, |m| m.blocks() * 512)
}

/// `thin IMG MIB`: on a fresh sparse image, write MIB MiB to a file
/// (nodiscard), then delete it with `-o discard` and close at once; then
/// the same with a crash instead of the close, and an open with discard
/// (the reconciler). Prints the image's allocation at each step.
fn thin(img: &Path, mib: u64) -> Result<(), FsError> {
    let mib_of = |b: u64| b as f64 / (1u64 << 20) as f64;
    for crash in [false, true] {
        mkfs(img, (mib << 21).max(512 << 20)).map_err(FsError::Unsupported)?;
        let empty = allocated(img);
        let o = OpenOptions {
            write: true,
            exclusive: false,
        };
        let open = |discard: bool| -> Result<Filesystem, FsError> {
            let dev: Arc<dyn Device> = Arc::new(FileDevice::open(img, o)?);
            let opts = RwOptions {
                discard: discard.then(|| DiscardOptions {
                    reconcile_pace: 0,
                    ..DiscardOptions::default()
                }),
                ..RwOptions::default()
            };
            Filesystem::open(dev, opts)
        };
        let fs = open(false)?;
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        let ino = fs.create(ROOT, b"big", &spec)?.0.ino;
        let chunk = vec![0xA5u8; 4 << 20];
        for i in 0..mib / 4 {
            fs.write_at(ino, i * chunk.len() as u64, &chunk)?;
        }
        fs.close()?;
        let full = allocated(img);
        let fs = open(true)?;
        let t = Instant::now();
        fs.unlink(ROOT, b"big")?;
        fs.sync()?;
        let line = if crash {
            fs.crash();
            let lost = allocated(img);
            let fs = open(true)?;
            let r = fs.wait_reconciled();
            fs.close()?;
            format!(
                "| delete, sync, crash; open with discard (reconciler: {:.0} MiB) | {:.1} | {:.1} | {:.1} | {:.1} |",
                mib_of(r.map_or(0, |r| r.bytes)),
                mib_of(empty),
                mib_of(full),
                mib_of(lost),
                mib_of(allocated(img))
            )
        } else {
            fs.close()?;
            format!(
                "| delete, sync, close at once ({:.0} ms) | {:.1} | {:.1} | {:.1} | {:.1} |",
                t.elapsed().as_secs_f64() * 1e3,
                mib_of(empty),
                mib_of(full),
                mib_of(allocated(img)),
                mib_of(allocated(img))
            )
        };
        out(&line);
    }
    let _ = std::fs::remove_file(img);
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("thin") {
        let (Some(img), Some(mib)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok())) else {
            eprintln!("usage: discard_bench thin IMG MIB");
            std::process::exit(2);
        };
        out(
            "| ext4kit -o discard | empty MiB | with data MiB | after delete MiB | at the end MiB |",
        );
        out("|---|---:|---:|---:|---:|");
        if let Err(e) = thin(Path::new(img), mib) {
            eprintln!("discard_bench thin: {e}");
            std::process::exit(1);
        }
        return;
    }
    let Some(img) = args.first() else {
        eprintln!(
            "usage: discard_bench IMG [FILES] [BLOCKS] [DELAY_MS] [WORKERS] [RUNS] [FLUSH_MS]"
        );
        std::process::exit(2);
    };
    let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (files, blocks, delay_ms, workers, runs, flush_ms) = (
        num(1, 64),
        num(2, 64),
        num(3, 5),
        num(4, 8) as usize,
        num(5, 3),
        num(6, 2),
    );
    let p = Params {
        files,
        blocks,
        delay: Duration::from_millis(delay_ms),
        flush: Duration::from_millis(flush_ms),
        workers,
    };
    let img = Path::new(img);
    out(&format!(
        "{files} files x {blocks} blocks interleaved, every other file deleted, {delay_ms} ms per discard, {flush_ms} ms per flush, {workers} workers, {runs} runs"
    ));
    out("| run | mode | commit ms | all discards done ms | discards | max in flight |");
    out("|---:|---|---:|---:|---:|---:|");
    let modes = [
        Mode::NoDiscard,
        Mode::Sequential,
        Mode::ParallelWait,
        Mode::Ext4kit,
    ];
    let mut commit: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut drain: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    for run in 0..runs {
        for (k, &m) in modes.iter().enumerate() {
            match one(img, m, &p) {
                Ok(r) => {
                    let c = r.commit.as_secs_f64() * 1e3;
                    let d = r.drain.as_secs_f64() * 1e3;
                    commit[k].push(c);
                    drain[k].push(d);
                    out(&format!(
                        "| {run} | {} | {c:.1} | {d:.1} | {} | {} |",
                        m.name(),
                        r.discards,
                        r.max_in_flight
                    ));
                }
                Err(e) => {
                    eprintln!("discard_bench: {} run {run}: {e}", m.name());
                    std::process::exit(1);
                }
            }
        }
    }
    let _ = std::fs::remove_file(img);
    let med: Vec<(f64, f64)> = (0..modes.len())
        .map(|k| (median(&mut commit[k]), median(&mut drain[k])))
        .collect();
    out("");
    out("| mode | median commit ms | median all discards done ms |");
    out("|---|---:|---:|");
    for (k, m) in modes.iter().enumerate() {
        out(&format!(
            "| {} | {:.1} | {:.1} |",
            m.name(),
            med[k].0,
            med[k].1
        ));
    }
    let (nod, seq, par, ek) = (med[0], med[1], med[2], med[3]);
    out("");
    out(&format!(
        "worst commit, sequential / parallel-wait (the seed's comparison): {:.1}x",
        seq.0 / par.0
    ));
    out(&format!(
        "worst commit, sequential / ext4kit: {:.0}x; all discards done, sequential / ext4kit: {:.1}x (goal >= 3.5x)",
        seq.0 / ek.0,
        seq.1 / ek.1
    ));
    out(&format!(
        "commit with discard vs nodiscard: {:.1} ms vs {:.1} ms ({:+.0} %, goal within 10 %)",
        ek.0,
        nod.0,
        (ek.0 / nod.0 - 1.0) * 100.0
    ));
}
