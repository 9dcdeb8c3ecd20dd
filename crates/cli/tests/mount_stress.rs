//! The mount under the programs that hunt filesystem bugs: copy_file_range
//! (data, kept holes, errno as kernel ext4, size and mtime); fsx (fsx-rs,
//! every operation type it has, several seeds and shapes); a model-checked
//! exerciser for what fsx-rs lacks (ZERO_RANGE, KEEP_SIZE, copies between
//! files, SEEK_HOLE, a file unlinked while open); fio writing with
//! `--verify=crc32c` (parallel sequential, random, mmap and O_DIRECT jobs,
//! verify backlog, then a verify-only pass after a remount); stress-ng's
//! filesystem stressors. Every image ends `e2fsck -fn` clean.
//!
//! They need root and /dev/fuse, and the tool each runs (fsx: `cargo
//! install fsx`; fio and stress-ng: Debian's packages); without them they
//! print one `SKIP` line. Sizes are small by default; long runs:
//! `EXT4KIT_FSX_OPS` (operations per fsx seed), `EXT4KIT_FSX_SEEDS`
//! (comma-separated), `EXT4KIT_MODEL_OPS`, `EXT4KIT_FIO_SIZE` (e.g. `1g`),
//! `EXT4KIT_STRESS_SECS`.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fuse::*;
use common::*;
use ext4kit_device::host;

const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Copy `len` bytes with copy_file_range, looping over short copies as
/// callers do; the total (less than `len` at the source's end).
fn copy_all(src: &File, off_in: u64, dst: &File, off_out: u64, len: u64) -> std::io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let n = host::copy_file_range(
            src,
            off_in + done,
            dst,
            off_out + done,
            (len - done).min(1 << 30) as usize,
        )?;
        if n == 0 {
            break;
        }
        done += n as u64;
    }
    Ok(done)
}

/// A byte model of a file: `model[off..]` gets `data`, zero-filled up to
/// `off` when it was shorter.
fn model_write(model: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

fn read_whole(f: &File, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

/// The copy_file_range errno cases, in order: what each gave ("ok N" or
/// "errno E"), on the directory `root` of some ext4 (the mount or the
/// kernel's).
fn copy_errno_script(root: &Path) -> Vec<(String, String)> {
    let p = |s: &str| root.join(s);
    fs::write(p("src"), pattern(100_000, 1)).unwrap();
    fs::write(p("dst"), b"").unwrap();
    let rw = |s: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(p(s))
            .unwrap()
    };
    let src = rw("src");
    let dst = rw("dst");
    let ro = File::open(p("dst")).unwrap();
    let wo = OpenOptions::new().write(true).open(p("src")).unwrap();
    let app = OpenOptions::new().append(true).open(p("dst")).unwrap();
    let max = (1u64 << 44) - 4096;
    let mut out = Vec::new();
    let mut step = |what: &str, r: std::io::Result<usize>| {
        let o = match r {
            Ok(n) => format!("ok {n}"),
            Err(e) => format!("errno {}", e.raw_os_error().unwrap_or(-1)),
        };
        out.push((what.to_string(), o));
    };
    step("copy", host::copy_file_range(&src, 0, &dst, 0, 50_000));
    step(
        "past the source's end",
        host::copy_file_range(&src, 200_000, &dst, 0, 10),
    );
    step(
        "cut at the source's end",
        host::copy_file_range(&src, 99_990, &dst, 0, 100),
    );
    step(
        "same file, apart",
        host::copy_file_range(&src, 0, &src, 200_000, 4096),
    );
    step(
        "same file, overlapping",
        host::copy_file_range(&src, 0, &src, 1000, 4096),
    );
    step(
        "same file, same place",
        host::copy_file_range(&src, 4096, &src, 4096, 4096),
    );
    step(
        "to a read-only descriptor",
        host::copy_file_range(&src, 0, &ro, 0, 10),
    );
    step(
        "from a write-only descriptor",
        host::copy_file_range(&wo, 0, &dst, 0, 10),
    );
    step(
        "to an O_APPEND descriptor",
        host::copy_file_range(&src, 0, &app, 0, 10),
    );
    step(
        "to the largest size",
        host::copy_file_range(&src, 0, &dst, max, 10),
    );
    step(
        "across the largest size",
        host::copy_file_range(&src, 0, &dst, max - 10, 100),
    );
    let dir = File::open(root).unwrap();
    step(
        "from a directory",
        host::copy_file_range(&dir, 0, &dst, 0, 10),
    );
    step("size after", Ok(dst.metadata().unwrap().len() as usize));
    out
}

#[test]
fn copy_file_range_on_the_mount() {
    let what = "copy_file_range_on_the_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);

    // A sparse source: data, a hole, preallocated (unwritten) space, more
    // data, a partial last block.
    let src = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p("sparse"))
        .unwrap();
    let mut model = Vec::new();
    for (off, len, seed) in [(0u64, 1 << 20, 1u64), (16 << 20, (1 << 20) + 123, 2)] {
        let d = pattern(len, seed);
        src.write_all_at(&d, off).unwrap();
        model_write(&mut model, off, &d);
    }
    host::fallocate(&src, 0, 4 << 20, 4 << 20).unwrap();
    src.sync_all().unwrap();
    let size = model.len() as u64;

    // The whole file into a new one: equal bytes, the holes kept (the
    // kernel's fallback copy through splice writes the zeros out).
    let dst = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p("copy"))
        .unwrap();
    let old = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 0);
    dst.set_modified(old).unwrap();
    assert_eq!(copy_all(&src, 0, &dst, 0, size + 5000).unwrap(), size);
    let md = dst.metadata().unwrap();
    assert_eq!(md.len(), size);
    assert!(md.mtime() > 1_000_000_000, "mtime {}", md.mtime());
    assert_eq!(read_whole(&dst, size as usize), model);
    assert!(
        md.blocks() * 512 <= (3 << 20),
        "the copy allocated {} bytes for 2 MiB of data",
        md.blocks() * 512
    );
    assert_eq!(
        host::seek_data_hole(&dst, 0, libc::SEEK_HOLE).unwrap(),
        1 << 20
    );
    assert_eq!(
        host::seek_data_hole(&dst, 1 << 20, libc::SEEK_DATA).unwrap(),
        16 << 20
    );

    // Into the middle of a file with data (unaligned, across the end of
    // the source's data into its hole): the hole's part reads as zeros,
    // the rest of the file is untouched.
    let over = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(p("over"))
        .unwrap();
    let mut om = pattern(4 << 20, 9);
    over.write_all_at(&om, 0).unwrap();
    let (from, to, n) = (512 * 1024 + 7, 100_001u64, 1 << 20);
    assert_eq!(copy_all(&src, from, &over, to, n).unwrap(), n);
    om[to as usize..(to + n) as usize].copy_from_slice(&model[from as usize..(from + n) as usize]);
    assert_eq!(read_whole(&over, om.len()), om);
    // Past the end, a copy that ends in the source's hole: the size
    // covers it, nothing is allocated for the zeros.
    let blocks = over.metadata().unwrap().blocks();
    assert_eq!(
        copy_all(&src, 2 << 20, &over, 8 << 20, 1 << 20).unwrap(),
        1 << 20
    );
    om.resize(9 << 20, 0);
    let md = over.metadata().unwrap();
    assert_eq!(md.len(), 9 << 20);
    assert_eq!(md.blocks(), blocks);
    assert_eq!(read_whole(&over, om.len()), om);

    // Within one file, apart: the copy extends it.
    assert_eq!(copy_all(&src, 10, &src, 20 << 20, 70_000).unwrap(), 70_000);
    let piece = model[10..70_010].to_vec();
    model_write(&mut model, 20 << 20, &piece);
    assert_eq!(read_whole(&src, model.len()), model);
    drop((src, dst, over));

    // The errno of each refused or edge case, as kernel ext4 gives them.
    fs::create_dir(p("errnos")).unwrap();
    let ours = copy_errno_script(&p("errnos"));
    let want = [
        ("copy", "ok 50000"),
        ("past the source's end", "ok 0"),
        ("cut at the source's end", "ok 10"),
        ("same file, apart", "ok 4096"),
        ("same file, overlapping", "errno 22"),
        ("same file, same place", "errno 22"),
        ("to a read-only descriptor", "errno 9"),
        ("from a write-only descriptor", "errno 9"),
        ("to an O_APPEND descriptor", "errno 9"),
        ("to the largest size", "errno 27"),
        ("across the largest size", "ok 10"),
        ("from a directory", "errno 21"),
        ("size after", "ok 17592186040320"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(ours, want);
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();

    // What was copied is on the disk.
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    let back = fs::read(m.path().join("copy")).unwrap();
    assert!(back == model[..size as usize], "the copy after a remount");
    m.unmount().unwrap();

    // The kernel's ext4 answers the same (when it can be mounted here).
    match kernel_mount_available() {
        Err(e) => eprintln!("{what}: not compared with kernel ext4: {e}"),
        Ok(()) => {
            let copy = dir.path().join("kernel.img");
            sparse_copy(&img, &copy);
            let lo = LoopDev::attach(&copy).unwrap();
            let km = Mount::new(lo.path(), "ext4", None).unwrap();
            let d = km.path().join("kernel-errnos");
            fs::create_dir(&d).unwrap();
            let kernel = copy_errno_script(&d);
            km.unmount().unwrap();
            drop(lo);
            assert_eq!(ours, kernel, "ext4kit (left) and kernel ext4 (right)");
            eprintln!("{what}: {} cases as kernel ext4", kernel.len());
        }
    }
}

/// Where `cargo install fsx` put the binary, if it did.
fn fsx_bin() -> Option<PathBuf> {
    find_tool("fsx").or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = Path::new(&home).join(".cargo/bin/fsx");
        p.is_file().then_some(p)
    })
}

/// An fsx-rs configuration with every operation it has: `flen` bytes at
/// most, operations of `min..=max` bytes aligned to `align`. fsx-rs 0.3.2
/// can make a posix_fallocate of 0 bytes (its length cut to `flen` and
/// then aligned down, or a size of `min` = 0), which every Linux
/// filesystem refuses with EINVAL (tmpfs too) and fsx takes for a
/// failure: so `min` > 0, and no posix_fallocate where `align` > 1.
fn fsx_config(flen: u64, min: u64, max: u64, align: u64) -> String {
    let falloc = if align > 1 { 0 } else { 4 };
    format!(
        r#"flen = {flen}

[opsize]
min = {min}
max = {max}
align = {align}

[weights]
close_open = 2
read = 10
write = 10
mapread = 6
mapwrite = 6
invalidate = 2
truncate = 4
fsync = 1
fdatasync = 1
posix_fallocate = {falloc}
punch_hole = 4
sendfile = 3
posix_fadvise = 2
copy_file_range = 5
"#
    )
}

#[test]
fn fsx_on_the_mount() {
    let what = "fsx_on_the_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let Some(bin) = fsx_bin() else {
        return skip(what, "fsx not installed (cargo install fsx --locked)");
    };
    let ops = env_u64("EXT4KIT_FSX_OPS", 3000);
    let seeds: Vec<u64> = std::env::var("EXT4KIT_FSX_SEEDS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 3]);
    // Shapes, by the seed (1, 2 and 3 have one each): byte-granular
    // operations up to 64 KiB (fsx's defaults), block-aligned ones on a
    // larger file, large ones (past FUSE's 128 KiB requests).
    let shapes = [
        (1u64 << 20, 1u64, 65_536u64, 1u64),
        (8 << 20, 4096, 262_144, 4096),
        (4 << 20, 1, 1 << 20, 1),
    ];
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    for seed in &seeds {
        let (flen, min, max, align) = shapes[((seed + 2) % 3) as usize];
        let conf = dir.path().join(format!("fsx-{seed}.toml"));
        fs::write(&conf, fsx_config(flen, min, max, align)).unwrap();
        let art = dir.path().join(format!("fsx-{seed}"));
        fs::create_dir_all(&art).unwrap();
        let m = FuseMount::new(&img, &[]).unwrap();
        let file = m.path().join(format!("fsx-{seed}.dat"));
        let t = Instant::now();
        let out = Command::new(&bin)
            .arg("-f")
            .arg(&conf)
            .arg("-N")
            .arg(ops.to_string())
            .arg("-S")
            .arg(seed.to_string())
            .arg("-P")
            .arg(&art)
            .arg(&file)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("running fsx");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "fsx seed {seed} (flen {flen}, ops {min}..={max} aligned {align}): {ops} ops in {:.1} s, {}",
            t.elapsed().as_secs_f64(),
            out.status
        );
        if !out.status.success() {
            // What fsx says first (the failure), then the operations that
            // led to it.
            let lines: Vec<&str> = text.lines().collect();
            for l in lines.iter().take(10) {
                eprintln!("  {l}");
            }
            eprintln!("  ...");
            for l in &lines[lines.len().saturating_sub(40).max(10)..] {
                eprintln!("  {l}");
            }
        }
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
        assert!(
            out.status.success(),
            "fsx seed {seed} failed (artifacts in {})",
            art.display()
        );
    }
}

/// One file of the model exerciser: the descriptor and the bytes it must
/// hold.
struct Modeled {
    f: File,
    model: Vec<u8>,
}

impl Modeled {
    fn check_range(&self, what: &str, off: u64, len: u64) {
        let end = (off + len).min(self.model.len() as u64);
        if off >= end {
            return;
        }
        let mut buf = vec![0u8; (end - off) as usize];
        let n = self.f.read_at(&mut buf, off).unwrap();
        assert_eq!(n, buf.len(), "{what}: short read at {off}");
        if let Some(i) = buf
            .iter()
            .zip(&self.model[off as usize..end as usize])
            .position(|(a, b)| a != b)
        {
            panic!(
                "{what}: byte {} is {:#x}, the model has {:#x}",
                off + i as u64,
                buf[i],
                self.model[off as usize + i]
            );
        }
    }

    fn check_size(&self, what: &str) {
        assert_eq!(
            self.f.metadata().unwrap().len(),
            self.model.len() as u64,
            "{what}: size"
        );
    }

    /// SEEK_HOLE/SEEK_DATA from `off`: every byte of a reported hole is a
    /// zero of the model.
    fn check_holes(&self, what: &str, off: u64) {
        let size = self.model.len() as u64;
        if off >= size {
            assert_eq!(
                errno_of(host::seek_data_hole(&self.f, off as i64, libc::SEEK_HOLE)),
                Some(libc::ENXIO),
                "{what}: SEEK_HOLE past the end"
            );
            return;
        }
        let h = host::seek_data_hole(&self.f, off as i64, libc::SEEK_HOLE).unwrap();
        assert!(h >= off && h <= size, "{what}: SEEK_HOLE({off}) = {h}");
        if h == size {
            return;
        }
        let d = match host::seek_data_hole(&self.f, h as i64, libc::SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => size,
            Err(e) => panic!("{what}: SEEK_DATA({h}): {e}"),
        };
        assert!(d > h && d <= size, "{what}: SEEK_DATA({h}) = {d}");
        if let Some(i) = self.model[h as usize..d as usize]
            .iter()
            .position(|&b| b != 0)
        {
            panic!(
                "{what}: [{h}, {d}) reported as a hole, the model has data at {}",
                h + i as u64
            );
        }
    }
}

/// Random operations on two files through the mount, each checked
/// against a byte model: writes, mmap writes, truncates, every fallocate
/// mode FUSE passes (default, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE with and
/// without KEEP_SIZE), copy_file_range within and between the files,
/// SEEK_HOLE/SEEK_DATA, fsync; halfway the second file is unlinked and
/// used on through its descriptor. fsx-rs has no ZERO_RANGE, no
/// KEEP_SIZE and copies only within one file.
fn model_run(root: &Path, seed: u64, ops: u64, flen: u64, maxop: u64) -> Vec<u8> {
    let open = |name: &str| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(root.join(name))
            .unwrap()
    };
    let mut files = [
        Modeled {
            f: open("a"),
            model: Vec::new(),
        },
        Modeled {
            f: open("b"),
            model: Vec::new(),
        },
    ];
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut unlinked = false;
    for step in 0..ops {
        if step == ops / 2 && !unlinked {
            fs::remove_file(root.join("b")).unwrap();
            unlinked = true;
        }
        let k = rng.below(2) as usize;
        // Offsets and lengths: byte-granular or block-aligned, at random.
        let aligned = rng.below(3) == 0;
        let mut off = rng.below(flen);
        let mut len = 1 + rng.below(maxop);
        if aligned {
            off -= off % 4096;
            len = len.div_ceil(4096) * 4096;
        }
        len = len.min(flen - off).max(1);
        let op = rng.below(13);
        let what = format!("seed {seed} step {step} file {k} op {op} [{off}, +{len})");
        match op {
            0 | 1 => {
                let d = pattern(len as usize, rng.next());
                files[k].f.write_all_at(&d, off).unwrap();
                model_write(&mut files[k].model, off, &d);
            }
            2 => {
                // A write through a shared mapping (inside the file).
                let size = files[k].model.len() as u64;
                if size > 0 {
                    let off = off % size;
                    let len = len.min(size - off);
                    let d = pattern(len as usize, rng.next());
                    host::write_through_mmap(&files[k].f, off, &d).unwrap();
                    model_write(&mut files[k].model, off, &d);
                }
            }
            3 => {
                let size = rng.below(flen + 1);
                files[k].f.set_len(size).unwrap();
                files[k].model.resize(size as usize, 0);
            }
            4..=8 => {
                let mode = [
                    0,
                    FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    FALLOC_FL_ZERO_RANGE,
                    FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                ][(op - 4) as usize];
                host::fallocate(&files[k].f, mode, off, len)
                    .unwrap_or_else(|e| panic!("{what}: fallocate mode {mode:#x}: {e}"));
                let m = &mut files[k].model;
                let end = (off + len) as usize;
                if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
                    let stop = end.min(m.len());
                    if (off as usize) < stop {
                        m[off as usize..stop].fill(0);
                    }
                }
                if mode & FALLOC_FL_KEEP_SIZE == 0 && m.len() < end {
                    m.resize(end, 0);
                }
            }
            9 | 10 => {
                // copy_file_range: from either file to either (apart when
                // it is the same one).
                let from = rng.below(2) as usize;
                let size = files[from].model.len() as u64;
                if size == 0 {
                    continue;
                }
                let src_off = rng.below(size);
                let mut n = len.min(size - src_off);
                if from == k {
                    let (a, b) = (src_off.min(off), src_off.max(off));
                    n = n.min(b - a);
                }
                if n == 0 {
                    continue;
                }
                let got = if from == k {
                    copy_all(&files[k].f, src_off, &files[k].f, off, n)
                } else {
                    copy_all(&files[from].f, src_off, &files[k].f, off, n)
                }
                .unwrap_or_else(|e| panic!("{what}: copy from file {from} at {src_off}: {e}"));
                assert_eq!(got, n, "{what}: copied");
                let piece = files[from].model[src_off as usize..(src_off + n) as usize].to_vec();
                model_write(&mut files[k].model, off, &piece);
            }
            11 => {
                files[k].check_holes(&what, off);
            }
            _ => {
                if rng.below(4) == 0 {
                    files[k].f.sync_all().unwrap();
                }
                files[k].check_range(&what, off, len);
            }
        }
        files[k].check_size(&what);
        if step % 64 == 63 {
            for (j, f) in files.iter().enumerate() {
                f.check_range(&format!("{what}: whole file {j}"), 0, f.model.len() as u64);
            }
        }
    }
    for (j, f) in files.iter().enumerate() {
        f.check_size(&format!("seed {seed} end, file {j}"));
        f.check_range(
            &format!("seed {seed} end, file {j}"),
            0,
            f.model.len() as u64,
        );
    }
    let [a, _b] = files;
    a.model
}

#[test]
fn fallocate_modes_and_copies_against_a_model() {
    let what = "fallocate_modes_and_copies_against_a_model";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let ops = env_u64("EXT4KIT_MODEL_OPS", 1000);
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    for seed in [11u64, 12] {
        let m = FuseMount::new(&img, &[]).unwrap();
        let root = m.path().join(format!("model-{seed}"));
        fs::create_dir(&root).unwrap();
        let t = Instant::now();
        // Small operations on a small file; large ones (past FUSE's 128 KiB
        // requests and the engine's write chunks) on a larger one.
        let (flen, maxop, ops) = if seed % 2 == 1 {
            (2 << 20, 200_000, ops)
        } else {
            (8 << 20, 1 << 20, ops / 3)
        };
        let a = model_run(&root, seed, ops, flen, maxop);
        eprintln!(
            "model seed {seed}: {ops} ops in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
        // The first file as the model has it, after a remount.
        let m = FuseMount::new(&img, &["ro"]).unwrap();
        let back = fs::read(m.path().join(format!("model-{seed}/a"))).unwrap();
        assert!(back == a, "seed {seed}: the file after a remount");
        assert!(!m.path().join(format!("model-{seed}/b")).exists());
        m.unmount().unwrap();
    }
}

#[test]
fn out_of_space_fails_the_call_not_the_mount() {
    // Found by stress-ng's fallocate stressor: a fallocate larger than
    // the free space aborted the journal (every later change EROFS).
    let what = "out_of_space_fails_the_call_not_the_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    let f = File::create(p("big")).unwrap();
    for mode in [0, FALLOC_FL_KEEP_SIZE] {
        assert_eq!(
            errno_of(host::fallocate(&f, mode, 0, 1 << 30)),
            Some(libc::ENOSPC),
            "fallocate mode {mode}"
        );
    }
    f.set_len(0).unwrap();
    let chunk = pattern(1 << 20, 3);
    let mut full = None;
    for i in 0..100u64 {
        if let Err(e) = f.write_all_at(&chunk, i << 20) {
            full = Some(e.raw_os_error());
            break;
        }
    }
    assert_eq!(full, Some(Some(libc::ENOSPC)));
    drop(f);
    // The filesystem goes on (not read-only): an empty file while full,
    // then the space back, a file with data and a directory.
    File::create(p("empty")).unwrap();
    fs::remove_file(p("big")).unwrap();
    fs::write(p("after"), b"still writable").unwrap();
    fs::create_dir(p("d")).unwrap();
    for f in ["empty", "after"] {
        fs::remove_file(p(f)).unwrap();
    }
    fs::remove_dir(p("d")).unwrap();
    m.unmount().unwrap();
    assert_eq!(e2fsck_clean(&img).unwrap(), fresh);
    assert!(!dumpe2fs_h(&img).contains("with errors"));
}

#[test]
fn fio_verify_on_the_mount() {
    let what = "fio_verify_on_the_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("fio") {
        return skip(what, "fio not installed (apt-get install fio)");
    }
    let size = std::env::var("EXT4KIT_FIO_SIZE").unwrap_or_else(|_| "12m".into());
    let dir = image_dir();
    let img = mkfs(dir.path(), "512M");
    // Parallel jobs, each on its own files: sequential and random
    // writes, an mmap writer and O_DIRECT, crc32c in every block, checked
    // while writing (verify_backlog) and at the end of each job.
    let job = |mnt: &Path| {
        format!(
            r#"[global]
directory={}
size={size}
verify=crc32c
verify_fatal=1
do_verify=1
ioengine=psync
randrepeat=1

[seq]
rw=write
bs=128k
numjobs=2
verify_backlog=32

[rand]
rw=randwrite
bs=4k
numjobs=2
verify_backlog=512

[mixed]
rw=randwrite
bssplit=4k/40:16k/30:64k/30
verify_backlog=64

[mmap]
ioengine=mmap
rw=randwrite
bs=16k

[direct]
rw=randwrite
bs=8k
direct=1
"#,
            mnt.display()
        )
    };
    let run_fio = |jobfile: &Path, extra: &[&str]| {
        let t = Instant::now();
        // Its verify state files go beside the job file.
        let out = tool("fio")
            .current_dir(jobfile.parent().unwrap_or(Path::new("/")))
            .args(extra)
            .arg(jobfile)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("running fio");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "fio {extra:?}: {} in {:.1} s",
            out.status,
            t.elapsed().as_secs_f64()
        );
        (out.status.success(), text)
    };
    let m = FuseMount::new(&img, &[]).unwrap();
    let jobfile = dir.path().join("verify.fio");
    fs::write(&jobfile, job(m.path())).unwrap();
    let (ok, text) = run_fio(&jobfile, &[]);
    m.unmount().unwrap();
    assert!(ok, "fio (write and verify) failed:\n{text}");
    e2fsck_clean(&img).unwrap();
    // After a remount: only the verification, every block read back.
    let m = FuseMount::new(&img, &[]).unwrap();
    fs::write(&jobfile, job(m.path())).unwrap();
    let (ok, text) = run_fio(&jobfile, &["--verify_only"]);
    m.unmount().unwrap();
    assert!(ok, "fio --verify_only after a remount failed:\n{text}");
    assert!(text.contains("READ: bw="), "fio read nothing back:\n{text}");
    assert!(
        !text.contains("verify: bad") && !text.contains("crc32c: verify failed"),
        "{text}"
    );
    e2fsck_clean(&img).unwrap();
}

/// What a failed run leaves for whoever reads the failure: `dir` (the
/// image and the daemon's log) is kept and named, and the message has the
/// log's end, the superblock's state and error fields (`dumpe2fs -h`:
/// `s_state`, `s_errors`, `s_first_error_*`, `s_last_error_*`) and what
/// `e2fsck -fn` says.
fn evidence(dir: tempfile::TempDir, img: &Path, log: &Path) -> String {
    let kept = dir.keep();
    let mut s = format!(
        "evidence kept in {}: the image {}, the daemon's log {}\n",
        kept.display(),
        img.display(),
        log.display()
    );
    let tail = |s: &mut String, what: &str, text: &str, n: usize, from_end: bool| {
        let lines: Vec<&str> = text.lines().collect();
        let part = if from_end {
            &lines[lines.len().saturating_sub(n)..]
        } else {
            &lines[..lines.len().min(n)]
        };
        *s += &format!(
            "--- {what} ({} lines, {} shown) ---\n",
            lines.len(),
            part.len()
        );
        for l in part {
            *s += l;
            s.push('\n');
        }
    };
    let text = fs::read_to_string(log).unwrap_or_else(|e| format!("(unreadable: {e})"));
    tail(&mut s, "the daemon's log", &text, 80, true);
    let keys = [
        "Filesystem state",
        "Errors behavior",
        "FS Error count",
        "First error",
        "Last error",
    ];
    let sb: String = dumpe2fs_h(img)
        .lines()
        .filter(|l| keys.iter().any(|k| l.starts_with(k)))
        .map(|l| format!("{l}\n"))
        .collect();
    tail(&mut s, "dumpe2fs -h: state and errors", &sb, 40, false);
    let fsck = match run(tool("e2fsck").arg("-fn").arg(img)) {
        Ok(out) => {
            String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout)
                + &format!("({})\n", out.status)
        }
        Err(e) => e,
    };
    tail(&mut s, "e2fsck -fn", &fsck, 120, false);
    s
}

/// stress-ng's filesystem stressors, one after the other, each with two
/// workers and `--verify`. For reproducing a failure:
/// `EXT4KIT_STRESS_SECS` (each stressor's time), `EXT4KIT_STRESS_ONLY`
/// (comma-separated stressor names, e.g. `hdd`), `EXT4KIT_STRESS_HDD_OPTS`
/// (stress-ng's `--hdd-opts`, e.g. `wr-rnd,rd-rnd,fsync`). A failure keeps
/// the image and the daemon's log (see [`evidence`]).
#[test]
fn stress_ng_filesystem_stressors_on_the_mount() {
    let what = "stress_ng_filesystem_stressors_on_the_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("stress-ng") {
        return skip(what, "stress-ng not installed (apt-get install stress-ng)");
    }
    let secs = env_u64("EXT4KIT_STRESS_SECS", 3);
    let only: Option<Vec<String>> = std::env::var("EXT4KIT_STRESS_ONLY")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let mut hdd = vec!["--hdd-bytes".to_string(), "32m".to_string()];
    if let Ok(o) = std::env::var("EXT4KIT_STRESS_HDD_OPTS") {
        hdd.extend(["--hdd-opts".to_string(), o]);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "512M");
    let log = dir.path().join("mount.log");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::with_log(&img, &[], &log).unwrap();
    let work = m.path().join("stress");
    fs::create_dir(&work).unwrap();
    let mut failed = Vec::new();
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for (stressor, extra) in [
        ("dentry", vec![]),
        ("rename", vec![]),
        ("link", vec![]),
        ("symlink", vec![]),
        ("xattr", vec![]),
        ("fallocate", strs(&["--fallocate-bytes", "64m"])),
        ("dir", vec![]),
        ("hdd", hdd.clone()),
    ] {
        if only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|s| s == stressor))
        {
            continue;
        }
        let t = Instant::now();
        let out = tool("stress-ng")
            .arg(format!("--{stressor}"))
            .arg("2")
            .args(&extra)
            .args(["--timeout", &format!("{secs}s")])
            .arg("--temp-path")
            .arg(&work)
            .args(["--verify", "--metrics-brief"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("running stress-ng");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "stress-ng --{stressor}: {} in {:.1} s",
            out.status,
            t.elapsed().as_secs_f64()
        );
        if !out.status.success() {
            failed.push(format!("--{stressor} {extra:?}: {}\n{text}", out.status));
        }
    }
    let left = fs::read_dir(&work).map(|d| d.count()).unwrap_or(0);
    if let Err(e) = fs::remove_dir_all(&work) {
        failed.push(format!("removing {}: {e}", work.display()));
    } else if left > 0 {
        failed.push(format!("stress-ng left {left} entries"));
    }
    if let Err(e) = m.unmount() {
        failed.push(format!("unmount: {e}"));
    }
    // The engine logs every error it records (one "ext4 error" line).
    let daemon = fs::read_to_string(&log).unwrap_or_default();
    if let Some(l) = daemon.lines().find(|l| l.contains("ext4 error")) {
        failed.push(format!("the daemon logged an error: {l}"));
    }
    // Everything it made is gone: the image is as fresh (no leaked
    // blocks or inodes).
    match e2fsck_clean(&img) {
        Ok(s) if s == fresh => {}
        Ok(s) => failed.push(format!("e2fsck: {s}, fresh it was {fresh}")),
        Err(e) => failed.push(e),
    }
    if !failed.is_empty() {
        panic!("{}\n{}", failed.join("\n"), evidence(dir, &img, &log));
    }
}
