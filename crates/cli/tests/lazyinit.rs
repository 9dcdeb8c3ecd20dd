//! Lazy init against the real e2fsprogs: images made by mke2fs with their
//! unused inode-table tails filled with random bytes, run through the
//! library and the `ext4kit` binary, checked with dumpe2fs and `e2fsck -fn`.
//!
//! Tests that need mke2fs/e2fsck, root or loop devices print why they skip
//! when they cannot run.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit::lazyinit::engine::{Engine, Options};
use ext4kit::lazyinit::{FakeClock, Job, Pace};
use ext4kit_device::{Device, FaultDevice, FileDevice, MemDevice, OpenOptions};

mod common;
use common::dumpe2fs;

// ---------------------------------------------------------------- helpers

fn tool(name: &str) -> bool {
    Command::new(name)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// mke2fs, e2fsck and dumpe2fs are there (else print why we skip).
fn have_e2fsprogs(test: &str) -> bool {
    let ok = tool("mke2fs") && tool("e2fsck") && tool("dumpe2fs") && tool("debugfs");
    if !ok {
        eprintln!("skip {test}: e2fsprogs (mke2fs, e2fsck, dumpe2fs, debugfs) not installed");
    }
    ok
}

fn is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Make a lazily-initialized ext4 image (no discard, so no group starts
/// with ITABLE_ZEROED).
fn mkfs(path: &Path, size: u64, extra: &[&str]) {
    mkfs_with(Maker::Mke2fs, path, size, extra)
}

/// Which formatter makes a test image.
#[derive(Clone, Copy, Debug)]
enum Maker {
    Mke2fs,
    Ext4kit,
}

fn mkfs_with(maker: Maker, path: &Path, size: u64, extra: &[&str]) {
    let _ = fs::remove_file(path);
    File::create(path).unwrap().set_len(size).unwrap();
    let mut cmd = match maker {
        Maker::Mke2fs => Command::new("mke2fs"),
        Maker::Ext4kit => {
            let mut c = Command::new(ext4kit_bin());
            c.arg("mkfs");
            c
        }
    };
    let out = cmd
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-E",
            "lazy_itable_init=1,nodiscard",
        ])
        .args(extra)
        .arg(path)
        .output()
        .expect("run mke2fs");
    assert!(
        out.status.success(),
        "mke2fs {extra:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(Clone, Debug)]
struct Group {
    itable: u64,
    inode_uninit: bool,
    zeroed: bool,
    unused: u64,
}

#[derive(Clone, Debug)]
struct Layout {
    block_size: u64,
    ipg: u64,
    inode_size: u64,
    itb: u64,
    features: String,
    /// Primary descriptor blocks: the table after the primary superblock
    /// and, with meta_bg, the block in the first group of each meta group.
    gdt: Vec<u64>,
    groups: Vec<Group>,
}

impl Layout {
    /// First block of group `g`'s table that lazy init may zero.
    fn tail_start(&self, g: &Group) -> u64 {
        if g.inode_uninit {
            g.itable
        } else {
            let ipb = self.block_size / self.inode_size;
            g.itable + (self.ipg - g.unused).div_ceil(ipb)
        }
    }
    fn tail(&self, g: &Group) -> (u64, u64) {
        (self.tail_start(g), g.itable + self.itb)
    }
}

fn field<'a>(text: &'a str, name: &str) -> &'a str {
    dumpe2fs::field(text, name).unwrap_or_else(|| panic!("dumpe2fs: no {name}"))
}

/// Parse `dumpe2fs` output: independent of our own parser.
fn layout(path: &Path) -> Layout {
    let out = Command::new("dumpe2fs")
        .arg(path)
        .output()
        .expect("dumpe2fs");
    assert!(out.status.success(), "dumpe2fs failed");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let block_size = field(&text, "Block size").parse().unwrap();
    let ipg = field(&text, "Inodes per group").parse().unwrap();
    let inode_size = field(&text, "Inode size").parse().unwrap();
    let itb = field(&text, "Inode blocks per group").parse().unwrap();
    let features = field(&text, "Filesystem features").to_string();
    let desc_size: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Group descriptor size:"))
        .map_or(32, |v| v.trim().parse().unwrap());
    let dpb = block_size / desc_size;
    let dump = dumpe2fs::groups(&text);
    let gdt = dumpe2fs::primary_desc_blocks(&dump, dpb);
    let groups = dump
        .iter()
        .map(|g| Group {
            itable: g.itable,
            inode_uninit: g.inode_uninit,
            zeroed: g.zeroed,
            unused: g.unused,
        })
        .collect();
    Layout {
        block_size,
        ipg,
        inode_size,
        itb,
        features,
        gdt: {
            assert!(!gdt.is_empty(), "no primary descriptor blocks");
            gdt
        },
        groups,
    }
}

struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn fill(&mut self, b: &mut [u8]) {
        for c in b.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        // Never all zero.
        if let Some(x) = b.first_mut() {
            *x |= 1;
        }
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Fill the zeroable tail of every group without ITABLE_ZEROED with random
/// bytes. Returns the bytes written.
fn fill_tails(path: &Path, lay: &Layout, seed: u64) -> u64 {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut rng = Rng::new(seed);
    let mut total = 0;
    for g in lay.groups.iter().filter(|g| !g.zeroed) {
        let (s, e) = lay.tail(g);
        let mut buf = vec![0u8; ((e - s) * lay.block_size) as usize];
        rng.fill(&mut buf);
        f.write_all_at(&buf, s * lay.block_size).unwrap();
        total += buf.len() as u64;
    }
    f.sync_all().unwrap();
    total
}

/// `e2fsck -fn` must exit 0 and print only the version line, the five
/// "Pass N" lines and the summary line.
fn assert_fsck_clean(path: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(path)
        .output()
        .expect("e2fsck");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| {
            !(l.starts_with("e2fsck ")
                || l.starts_with("Pass ")
                || (l.contains(" files (") && l.ends_with(" blocks"))
                || l.trim().is_empty())
        })
        .collect();
    assert!(
        out.status.success() && bad.is_empty(),
        "e2fsck -fn {} not clean (status {:?}):\n{text}",
        path.display(),
        out.status.code()
    );
}

fn read_all(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap()
}

/// Compare an image with its state before lazy init: only blocks of the
/// zeroable tails (which must now be zero) and of the primary descriptor
/// table may differ. `final_state`: every group must be ITABLE_ZEROED.
/// Otherwise: any group with the flag must have a zero tail. Returns the
/// number of flagged groups.
fn check_image(path: &Path, before: &[u8], lay: &Layout, final_state: bool) -> usize {
    let after = read_all(path);
    assert_eq!(after.len(), before.len());
    let bs = lay.block_size as usize;
    let now = layout(path);
    let mut allowed = vec![false; after.len() / bs];
    for &b in &lay.gdt {
        allowed[b as usize] = true;
    }
    for g in lay.groups.iter().filter(|g| !g.zeroed) {
        let (s, e) = lay.tail(g);
        for b in s..e {
            allowed[b as usize] = true;
        }
    }
    for (i, (a, b)) in after.chunks(bs).zip(before.chunks(bs)).enumerate() {
        if a != b {
            assert!(
                allowed[i],
                "block {i} changed but is neither a table tail nor the primary GDT"
            );
        }
    }
    let mut flagged = 0;
    for (i, (g, gn)) in lay.groups.iter().zip(&now.groups).enumerate() {
        assert_eq!(g.itable, gn.itable);
        if final_state {
            assert!(gn.zeroed, "group {i} lacks ITABLE_ZEROED");
        }
        if gn.zeroed {
            flagged += 1;
            if !g.zeroed {
                let (s, e) = lay.tail(g);
                let t = &after[s as usize * bs..e as usize * bs];
                assert!(
                    t.iter().all(|&x| x == 0),
                    "group {i}: flagged but tail not zero"
                );
            }
        }
    }
    flagged
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

/// The `ext4kit` binary cargo built for these tests.
fn ext4kit_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ext4kit"))
}

fn ext4kit(args: &[&str]) -> Output {
    Command::new(ext4kit_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ext4kit")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The value of `"key":` in a JSON line (the first occurrence), without
/// quotes. Our JSON is compact and its keys are unique per line.
fn json_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\":");
    let i = line.find(&pat)? + pat.len();
    let rest = &line[i..];
    let end = rest.find([',', '}', ']']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

fn json_u64(line: &str, key: &str) -> u64 {
    json_field(line, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {line}"))
}

fn last_line(out: &Output) -> String {
    text(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ext4kit-lazyinit-")
        .tempdir()
        .unwrap()
}

// ------------------------------------------------------------------ tests

/// The done-when matrix: 4K and 1K blocks, metadata_csum and uninit_bg,
/// 64- and 32-byte descriptors, via the binary with `--mult 0`.
#[test]
fn lazy_images_from_both_formatters_are_zeroed_exactly() {
    if !have_e2fsprogs("lazy_images_from_both_formatters_are_zeroed_exactly") {
        return;
    }
    let dir = tmpdir();
    let cases: &[(&str, u64, &[&str], &str)] = &[
        ("4k-csum", 1 << 30, &["-b", "4096"], "metadata_csum"),
        ("1k-csum", 256 << 20, &["-b", "1024"], "metadata_csum"),
        (
            "4k-gdt",
            1 << 30,
            &["-b", "4096", "-O", "^metadata_csum,uninit_bg"],
            "uninit_bg",
        ),
        (
            "1k-gdt",
            256 << 20,
            &["-b", "1024", "-O", "^metadata_csum,uninit_bg"],
            "uninit_bg",
        ),
        (
            "1k-csum-32",
            128 << 20,
            &["-b", "1024", "-O", "^64bit"],
            "metadata_csum",
        ),
        (
            "4k-gdt-32",
            512 << 20,
            &["-b", "4096", "-O", "^64bit,^metadata_csum,uninit_bg"],
            "uninit_bg",
        ),
        // meta_bg (issue 20): 32 and 40 groups of 8 MiB, 16 or 32
        // descriptors per block, so the last meta group's descriptor block
        // is written far from the first; with sparse_super2 too.
        (
            "1k-metabg",
            256 << 20,
            &["-b", "1024", "-O", "meta_bg,^resize_inode"],
            "meta_bg",
        ),
        (
            "1k-metabg-32",
            320 << 20,
            &["-b", "1024", "-O", "^64bit,meta_bg,^resize_inode"],
            "meta_bg",
        ),
        (
            "1k-metabg-ss2",
            256 << 20,
            &["-b", "1024", "-O", "meta_bg,sparse_super2,^resize_inode"],
            "meta_bg",
        ),
        // bigalloc (issue 20): block bitmaps with a bit per cluster; 8
        // groups of 32 MiB (1 KiB blocks, 4 KiB clusters) and 16 of 64 MiB
        // (4 KiB blocks, 16 KiB clusters, 4096 clusters per group).
        (
            "1k-bigalloc",
            256 << 20,
            &["-b", "1024", "-O", "bigalloc", "-C", "4096"],
            "bigalloc",
        ),
        (
            "4k-bigalloc",
            1 << 30,
            &["-b", "4096", "-O", "bigalloc", "-C", "16384", "-g", "4096"],
            "bigalloc",
        ),
        // 8 inodes per group: the reserved inodes and lost+found reach
        // into group 1's table.
        (
            "1k-csum-8ipg",
            64 << 20,
            &["-b", "1024", "-N", "64"],
            "metadata_csum",
        ),
    ];
    let all = [Maker::Mke2fs, Maker::Ext4kit]
        .into_iter()
        .flat_map(|m| cases.iter().map(move |c| (m, c)));
    for (i, (maker, &(name, size, extra, feature))) in all.enumerate() {
        let name = &format!("{name}-{maker:?}");
        let img = dir.path().join(format!("{name}.img"));
        mkfs_with(maker, &img, size, extra);
        let lay = layout(&img);
        assert!(lay.features.contains(feature), "{name}: {}", lay.features);
        assert!(lay.groups.len() >= 4, "{name}: too few groups");
        assert!(
            lay.groups.iter().all(|g| !g.zeroed),
            "{name}: mke2fs zeroed tables"
        );
        let filled = fill_tails(&img, &lay, 42 + i as u64);
        assert!(filled > 0);
        assert_fsck_clean(&img);
        let before = read_all(&img);

        let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));

        let flagged = check_image(&img, &before, &lay, true);
        assert_eq!(flagged, lay.groups.len());
        assert_fsck_clean(&img);

        // Nothing left: a second run changes nothing.
        let snap = read_all(&img);
        let out = ext4kit(&["lazyinit", "--mult", "0", "--json", img.to_str().unwrap()]);
        assert!(out.status.success());
        assert!(read_all(&img) == snap, "{name}: second run wrote");
        let last = last_line(&out);
        assert_eq!(json_field(&last, "event"), Some("summary"));
        assert_eq!(json_u64(&last, "groups_zeroed_now"), 0);
    }
}

/// Without group-descriptor checksums nothing is left for lazy init: the
/// run says so and exits 0 without writing, and `info` shows nothing
/// pending either.
#[test]
fn no_group_checksums_is_nothing_to_do() {
    if !have_e2fsprogs("no_group_checksums_is_nothing_to_do") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("nocsum.img");
    mkfs(&img, 64 << 20, &["-O", "^metadata_csum,^uninit_bg"]);
    let before = read_all(&img);
    let p = img.to_str().unwrap();
    let out = ext4kit(&["lazyinit", "--mult", "0", p]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("nothing to do"), "{err}");
    assert!(read_all(&img) == before, "written");
    let dry = ext4kit(&["lazyinit", "--dry-run", "--json", p]);
    assert!(dry.status.success());
    assert_eq!(json_u64(&last_line(&dry), "groups_pending"), 0);
    let info = ext4kit(&["info", "--json", p]);
    assert!(info.status.success());
    let v = last_line(&info);
    assert_eq!(json_u64(&v, "groups_not_zeroed"), 0);
    assert_eq!(json_u64(&v, "bytes_to_zero"), 0);
    assert_fsck_clean(&img);
}

/// 1 KiB-block bigalloc: `info` opens it (e2fsck calls it clean); lazyinit
/// zeroes a lazy one (it refused bigalloc before issue 20; the cluster
/// bitmaps are cross-checked per cluster) and leaves it clean.
#[test]
fn bigalloc_1k_opens() {
    if !have_e2fsprogs("bigalloc_1k_opens") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("ba.img");
    mkfs(
        &img,
        64 << 20,
        &["-b", "1024", "-O", "bigalloc", "-C", "16384"],
    );
    let p = img.to_str().unwrap();
    let info = ext4kit(&["info", p]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(text(&info.stdout).contains("bigalloc"));
    let out = ext4kit(&["lazyinit", "--mult", "0", p]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(layout(&img).groups.iter().all(|g| g.zeroed), "{err}");
    assert_fsck_clean(&img);
}

/// Without 64bit the high word of the block count is padding: a stray
/// value there changes nothing (it read as a 4 PiB filesystem before).
#[test]
fn block_count_high_word_only_with_64bit() {
    if !have_e2fsprogs("block_count_high_word_only_with_64bit") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("no64.img");
    // uninit_bg: no superblock checksum to recompute.
    mkfs(&img, 64 << 20, &["-O", "^64bit,^metadata_csum,uninit_bg"]);
    let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&1u32.to_le_bytes(), 1024 + 0x150).unwrap();
    drop(f);
    let p = img.to_str().unwrap();
    let info = ext4kit(&["info", "--json", p]);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert_eq!(json_u64(&last_line(&info), "blocks_count"), 64 << 10);
    let out = ext4kit(&["lazyinit", "--mult", "0", p]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_fsck_clean(&img);
}

/// An image another process holds with a POSIX `fcntl` lock (as QEMU
/// locks its images, there with OFD locks) is busy: refused, not written.
#[test]
fn fcntl_locked_image_is_busy() {
    if !have_e2fsprogs("fcntl_locked_image_is_busy") {
        return;
    }
    if !tool("python3") {
        eprintln!("SKIP fcntl_locked_image_is_busy: python3 not installed");
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("locked.img");
    mkfs(&img, 64 << 20, &[]);
    let before = read_all(&img);
    let script = "import fcntl, os, sys\n\
                  f = open(sys.argv[1], 'r+b')\n\
                  fcntl.lockf(f, fcntl.LOCK_SH, 1, 201)\n\
                  print('locked', flush=True)\n\
                  sys.stdin.read()\n";
    let mut holder = Command::new("python3")
        .args(["-c", script])
        .arg(&img)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
    drop(holder.stdin.take());
    holder.wait().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("in use by another program"), "{err}");
    assert!(read_all(&img) == before, "written");
    // Released: it runs.
    let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_fsck_clean(&img);
}

/// A newline in a path never splits an error line.
#[test]
fn newline_in_path_stays_on_one_line() {
    let dir = tmpdir();
    let img = dir.path().join("two\nlines.img");
    fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("two\\nlines.img"), "{err}");
    for l in err.lines() {
        assert!(l.starts_with("ext4kit: "), "split line: {err:?}");
    }
}

/// `info` before and after, as JSON.
#[test]
fn info_reports_groups_left() {
    if !have_e2fsprogs("info_reports_groups_left") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("a.img");
    mkfs(&img, 512 << 20, &["-b", "4096"]);
    let info = |img: &Path| -> String {
        let out = ext4kit(&["info", "--json", img.to_str().unwrap()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).lines().count(), 1);
        last_line(&out)
    };
    let v = info(&img);
    assert_eq!(json_u64(&v, "block_size"), 4096);
    assert_eq!(json_u64(&v, "groups"), 4);
    assert_eq!(json_u64(&v, "groups_not_zeroed"), 4);
    assert_eq!(json_u64(&v, "allocated_bytes"), allocated(&img));
    assert_eq!(json_field(&v, "desc_checksum"), Some("metadata_csum"));
    let out = ext4kit(&["lazyinit", "-q", "--mult", "0", img.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(
        out.stdout.is_empty() && out.stderr.is_empty(),
        "--quiet printed"
    );
    let v = info(&img);
    assert_eq!(json_u64(&v, "groups_not_zeroed"), 0);
    let human = ext4kit(&["info", img.to_str().unwrap()]);
    assert!(text(&human.stdout).contains("0 of 4 groups without ITABLE_ZEROED"));
    // Not ext4: an error, exit 1.
    let junk = dir.path().join("junk");
    fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let out = ext4kit(&["info", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not an ext2/3/4 filesystem"));
}

/// Run debugfs commands in one read-write session, checksum verification
/// off (so that a half-edited descriptor does not stop the next command).
fn debugfs_w(img: &Path, cmds: &[&str]) {
    let script = img.with_extension("debugfs");
    fs::write(&script, cmds.join("\n") + "\n").unwrap();
    let out = Command::new("debugfs")
        .args(["-w", "-n", "-f"])
        .arg(&script)
        .arg(img)
        .output()
        .expect("debugfs");
    let err = text(&out.stderr);
    assert!(
        out.status.success() && err.lines().all(|l| l.starts_with("debugfs ")),
        "debugfs {cmds:?}: {err}"
    );
}

/// Everything that must be refused is refused with a one-line reason, and
/// nothing is written to any of the filesystems given.
#[test]
fn refusals_write_nothing() {
    if !have_e2fsprogs("refusals_write_nothing") {
        return;
    }
    let dir = tmpdir();
    let good = dir.path().join("good.img");
    mkfs(&good, 64 << 20, &[]);
    let mk = |name: &str, size: u64, extra: &[&str]| {
        let p = dir.path().join(name);
        mkfs(&p, size, extra);
        p
    };
    let mut cases: Vec<(PathBuf, &str)> = Vec::new();

    let zero = dir.path().join("zeros.img");
    fs::write(&zero, vec![0u8; 4 << 20]).unwrap();
    cases.push((zero, "not an ext2/3/4 filesystem"));

    let sb = mk("sbcsum.img", 64 << 20, &[]);
    let f = fs::OpenOptions::new().write(true).open(&sb).unwrap();
    f.write_all_at(b"X", 1024 + 0x78).unwrap(); // s_volume_name
    cases.push((sb, "corrupt superblock: checksum"));

    let gd = mk("gdcsum.img", 64 << 20, &["-b", "1024"]);
    let f = fs::OpenOptions::new().write(true).open(&gd).unwrap();
    f.write_all_at(&[0x5A], 2048 + 64 * 3 + 0x10).unwrap(); // group 3 used dirs
    cases.push((gd, "group 3: checksum"));

    let gd16 = mk(
        "gdcsum16.img",
        64 << 20,
        &["-b", "1024", "-O", "^metadata_csum,uninit_bg"],
    );
    let f = fs::OpenOptions::new().write(true).open(&gd16).unwrap();
    f.write_all_at(&[0x5A], 2048 + 64 * 2 + 0x10).unwrap();
    cases.push((gd16, "group 2: checksum"));

    let tr = mk("trunc.img", 64 << 20, &[]);
    fs::OpenOptions::new()
        .write(true)
        .open(&tr)
        .unwrap()
        .set_len((64 << 20) - 4096)
        .unwrap();
    cases.push((tr, "truncated image"));

    // Forged descriptors and superblocks with valid checksums (debugfs
    // recomputes them): each of these used to be zeroed over.
    let jblk = |img: &Path| -> u64 {
        let out = Command::new("debugfs")
            .args(["-R", "bmap <8> 0"])
            .arg(img)
            .output()
            .expect("debugfs");
        text(&out.stdout).trim().parse().expect("journal block")
    };
    let onjournal = mk("onjournal.img", 64 << 20, &[]);
    let j = jblk(&onjournal);
    debugfs_w(
        &onjournal,
        &[
            &format!("set_bg 1 inode_table {j}"),
            "set_bg 1 checksum calc",
        ],
    );
    // info says what lazyinit would refuse, and why.
    let out = ext4kit(&["info", onjournal.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(
            "lazyinit would refuse: refusing to zero anything: group 1: inode table at block"
        ),
        "{}",
        text(&out.stdout)
    );
    let out = ext4kit(&["info", "--json", onjournal.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("info --json");
    assert!(
        v["lazyinit_refusal"]
            .as_str()
            .is_some_and(|r| r.contains("group 1: inode table at block")),
        "{v}"
    );
    let out = ext4kit(&["info", "--json", good.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("info --json");
    assert!(v["lazyinit_refusal"].is_null(), "{v}");
    cases.push((onjournal, "group 1: inode table at block"));

    let rev0 = mk("rev0.img", 64 << 20, &["-O", "^metadata_csum,uninit_bg"]);
    debugfs_w(&rev0, &["ssv rev_level 0"]);
    cases.push((rev0, "revision 0"));

    let isize = mk("isize.img", 64 << 20, &["-b", "1024", "-I", "256"]);
    debugfs_w(&isize, &["ssv inode_size 128"]);
    cases.push((isize, "inode size 128"));

    // Inodes in use hidden by raising the unused and free counts together.
    let hidden = mk("hidden.img", 64 << 20, &["-b", "1024"]);
    let payload = dir.path().join("payload");
    fs::write(&payload, b"precious").unwrap();
    let p = payload.to_str().unwrap();
    debugfs_w(
        &hidden,
        &[
            &format!("write {p} f1"),
            &format!("write {p} f2"),
            &format!("write {p} f3"),
        ],
    );
    let l = layout(&hidden);
    let g0 = &l.groups[0];
    let free = {
        let out = Command::new("dumpe2fs").arg(&hidden).output().unwrap();
        let t = text(&out.stdout);
        let line = t
            .lines()
            .find(|x| x.contains("free inodes,"))
            .unwrap()
            .to_string();
        line.split(" free inodes,")
            .next()
            .and_then(|a| a.rsplit(", ").next())
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    debugfs_w(
        &hidden,
        &[
            &format!("set_bg 0 itable_unused {}", g0.unused + 3),
            &format!("set_bg 0 free_inodes_count {}", free + 3),
            "set_bg 0 checksum calc",
        ],
    );
    cases.push((hidden, "is in use in the inode bitmap"));

    let unused = mk("unused.img", 64 << 20, &["-b", "1024"]);
    debugfs_w(
        &unused,
        &[
            "set_bg 2 itable_unused 1000",
            "set_bg 2 flags 0",
            "set_bg 2 free_inodes_count 900",
            "set_bg 2 checksum calc",
        ],
    );
    cases.push((
        unused,
        "group 2: unused inodes count 1000 > free inodes count 900",
    ));

    let reserved = mk("reserved.img", 64 << 20, &["-b", "1024"]);
    let l = layout(&reserved);
    let all = l.ipg.to_string();
    debugfs_w(
        &reserved,
        &[
            &format!("set_bg 0 itable_unused {all}"),
            &format!("set_bg 0 free_inodes_count {all}"),
            "set_bg 0 checksum calc",
        ],
    );
    cases.push((reserved, "first non-reserved inode"));

    let recover = mk("recover.img", 64 << 20, &[]);
    debugfs_w(&recover, &["feature needs_recovery"]);
    cases.push((recover, "journal needs recovery"));

    let unclean = mk("unclean.img", 64 << 20, &["-O", "^has_journal"]);
    debugfs_w(&unclean, &["ssv state 0"]);
    cases.push((unclean, "not cleanly unmounted"));

    let errors = mk("errors.img", 64 << 20, &[]);
    debugfs_w(&errors, &["ssv state 3"]);
    cases.push((errors, "having errors"));

    for (img, want) in &cases {
        let snap_bad = read_all(img);
        let snap_good = read_all(&good);
        // The good filesystem first: it must not be touched either.
        let out = ext4kit(&[
            "lazyinit",
            "--mult",
            "0",
            good.to_str().unwrap(),
            img.to_str().unwrap(),
        ]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", img.display());
        let line = err
            .lines()
            .find(|l| l.contains(img.to_str().unwrap()))
            .unwrap_or_else(|| panic!("no message naming {}: {err}", img.display()));
        assert!(
            line.contains(want),
            "{}: expected '{want}' in: {err}",
            img.display()
        );
        assert_eq!(
            err.lines()
                .filter(|l| l.contains(img.to_str().unwrap()))
                .count(),
            1
        );
        assert!(read_all(img) == snap_bad, "{}: written", img.display());
        assert!(
            read_all(&good) == snap_good,
            "good image written while {} refused",
            img.display()
        );
    }

    // The same file twice is refused too.
    let g = good.to_str().unwrap();
    let out = ext4kit(&["lazyinit", "--mult", "0", g, g]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("same device as"));
    assert!(layout(&good).groups.iter().all(|g| !g.zeroed));
}

/// A sparse 1 TiB lazy image grows by at most 1 MiB.
#[test]
fn sparse_1tib_image_stays_sparse() {
    if !have_e2fsprogs("sparse_1tib_image_stays_sparse") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("big.img");
    mkfs(&img, 1 << 40, &["-J", "size=64"]);
    let before = allocated(&img);
    let out = ext4kit(&["lazyinit", "--mult", "0", "--json", img.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let after = allocated(&img);
    assert!(after <= before + (1 << 20), "grew from {before} to {after}");
    let lay = layout(&img);
    assert_eq!(lay.groups.len(), 8192);
    assert!(lay.groups.iter().all(|g| g.zeroed));
    assert_fsck_clean(&img);
    // JSON progress: one object per line, a group event per group.
    let stdout = text(&out.stdout);
    assert!(
        stdout
            .lines()
            .all(|l| l.starts_with('{') && l.ends_with('}'))
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| json_field(l, "event") == Some("group"))
            .count(),
        8192
    );
    let last = last_line(&out);
    assert_eq!(json_field(&last, "event"), Some("summary"));
    assert_eq!(json_u64(&last, "bytes_zeroed"), 0);
    assert!(json_u64(&last, "bytes_skipped_already_zero") > 0);
}

/// An image full of old data gets sparser, not denser.
#[test]
fn old_data_image_gets_sparser() {
    if !have_e2fsprogs("old_data_image_gets_sparser") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("old.img");
    mkfs(&img, 1 << 30, &[]);
    let lay = layout(&img);
    let filled = fill_tails(&img, &lay, 7);
    let before = allocated(&img);
    let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let after = allocated(&img);
    assert!(
        after + filled - (1 << 20) <= before,
        "allocated {before} -> {after}, filled {filled}"
    );
    assert_fsck_clean(&img);
}

/// Crash safety with the fault-injecting device: a power cut after every
/// possible number of mutating operations leaves an e2fsck-clean image with
/// intact used inodes and truthful flags, and a rerun finishes the job.
#[test]
fn power_cut_after_every_op() {
    if !have_e2fsprogs("power_cut_after_every_op") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("small.img");
    mkfs(&img, 24 << 20, &["-b", "1024"]);
    let lay = layout(&img);
    assert_eq!(lay.groups.len(), 3);
    fill_tails(&img, &lay, 99);
    let base = read_all(&img);
    let cut = dir.path().join("cut.img");
    let run = |dev: &dyn Device, batch: u32| {
        let job = Job::prepare(dev).expect("prepare");
        let clock = FakeClock::new();
        let opts = Options {
            pace: Pace::Fixed { mult: 0 },
            max_batch_groups: batch,
            ..Options::default()
        };
        Engine::new(vec![job], opts, &clock).run(&mut ())
    };
    for batch in [1, u32::MAX] {
        let total = {
            let mem = Arc::new(MemDevice::from_bytes(base.clone()));
            let dev = FaultDevice::new(Arc::clone(&mem));
            let ctl = dev.control();
            assert!(run(&dev, batch).complete());
            ctl.ops()
        };
        let mut last_flagged = 0;
        for k in 1..=total {
            let mem = Arc::new(MemDevice::from_bytes(base.clone()));
            let dev = FaultDevice::new(Arc::clone(&mem));
            dev.control().power_cut_after(k);
            let s = run(&dev, batch);
            assert_eq!(
                s.complete(),
                k == total,
                "batch {batch}, cut after {k} of {total}"
            );
            drop(dev);
            fs::write(&cut, mem.to_bytes()).unwrap();
            assert_fsck_clean(&cut);
            let flagged = check_image(&cut, &base, &lay, false);
            assert!(flagged >= last_flagged, "progress went backwards");
            last_flagged = flagged;
            // Resume on what survived.
            assert!(run(&*mem, batch).complete());
            fs::write(&cut, mem.to_bytes()).unwrap();
            check_image(&cut, &base, &lay, true);
            assert_fsck_clean(&cut);
        }
        assert_eq!(last_flagged, lay.groups.len());
    }
}

/// The same engine through a real file: FileDevice, library API.
#[test]
fn library_on_image_file() {
    if !have_e2fsprogs("library_on_image_file") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("lib.img");
    mkfs(
        &img,
        128 << 20,
        &["-b", "1024", "-O", "^metadata_csum,uninit_bg"],
    );
    let lay = layout(&img);
    fill_tails(&img, &lay, 5);
    let before = read_all(&img);
    {
        let dev = FileDevice::open(&img, OpenOptions::read_write()).unwrap();
        let job = Job::prepare(&dev).unwrap();
        assert_eq!(job.pending().len(), lay.groups.len());
        let clock = FakeClock::new();
        let opts = Options {
            pace: Pace::Fixed { mult: 0 },
            ..Options::default()
        };
        let s = Engine::new(vec![job], opts, &clock).run(&mut ());
        assert!(s.complete(), "{s:?}");
    }
    check_image(&img, &before, &lay, true);
    assert_fsck_clean(&img);
}

fn spawn(args: &[&str]) -> Child {
    Command::new(ext4kit_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ext4kit")
}

fn signal(child: &Child, sig: i32) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(st.success());
}

/// SIGKILL the real binary at random moments; after each kill the image is
/// clean and truthful, progress never goes back, and a final run finishes.
#[test]
fn sigkill_at_random_moments_then_resume() {
    if !have_e2fsprogs("sigkill_at_random_moments_then_resume") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("kill.img");
    mkfs(&img, 512 << 20, &["-b", "1024", "-T", "default"]);
    let lay = layout(&img);
    assert!(lay.groups.len() >= 64);
    fill_tails(&img, &lay, 1234);
    let base = read_all(&img);
    let path = img.to_str().unwrap();
    let mut rng = Rng::new(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    let mut flagged = 0;
    let start = Instant::now();
    let mut kills = 0;
    while kills < 6 && start.elapsed() < Duration::from_secs(40) {
        let mut child = spawn(&[
            "lazyinit",
            "--mult",
            "20",
            "--max-batch-groups",
            "1",
            "--verify-zero",
            "always",
            path,
        ]);
        std::thread::sleep(Duration::from_millis(30 + rng.below(400)));
        // try_wait reaps a finished child; only a live one can be killed.
        let finished = child.try_wait().unwrap().is_some();
        if !finished {
            signal(&child, 9);
            let _ = child.wait();
        }
        assert_fsck_clean(&img);
        let now = check_image(&img, &base, &lay, false);
        assert!(now >= flagged, "flags went from {flagged} to {now}");
        flagged = now;
        kills += 1;
        if finished || flagged == lay.groups.len() {
            break;
        }
    }
    eprintln!(
        "killed {kills} times, {flagged}/{} groups done",
        lay.groups.len()
    );
    let out = ext4kit(&["lazyinit", "--mult", "0", path]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    check_image(&img, &base, &lay, true);
    assert_fsck_clean(&img);
}

/// SIGINT stops after the current batch with a message and exit code 130;
/// the run resumes where it stopped.
#[test]
fn sigint_stops_cleanly_and_resumes() {
    if !have_e2fsprogs("sigint_stops_cleanly_and_resumes") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("int.img");
    mkfs(&img, 256 << 20, &["-b", "1024"]);
    let lay = layout(&img);
    fill_tails(&img, &lay, 77);
    let base = read_all(&img);
    let path = img.to_str().unwrap();
    let mut child = spawn(&[
        "lazyinit",
        "--json",
        "--mult",
        "50",
        "--max-batch-groups",
        "1",
        path,
    ]);
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // Wait for the first committed group, then interrupt.
    for l in lines.by_ref() {
        let l = l.unwrap();
        if l.contains("\"event\":\"group\"") {
            break;
        }
    }
    signal(&child, 2);
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(130), "stderr: {err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        rest.iter().any(|l| l.contains("\"event\":\"stopped\"")),
        "{rest:?}"
    );
    let summary = rest.last().unwrap();
    assert_eq!(json_field(summary, "stopped"), Some("true"));
    let first = json_u64(summary, "groups_done") as usize;
    assert!(first >= 1 && first < lay.groups.len(), "{first}");
    assert_eq!(check_image(&img, &base, &lay, false), first);
    assert_fsck_clean(&img);

    // SIGTERM: the same, with 143 (128 + 15), resuming where SIGINT left.
    let mut child = spawn(&[
        "lazyinit",
        "--json",
        "--mult",
        "50",
        "--max-batch-groups",
        "1",
        path,
    ]);
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    for l in lines.by_ref() {
        if l.unwrap().contains("\"event\":\"group\"") {
            break;
        }
    }
    signal(&child, 15);
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(143), "{rest:?}");
    let done = json_u64(rest.last().unwrap(), "groups_done") as usize;
    assert!(done > first && done < lay.groups.len(), "{first} -> {done}");
    assert_eq!(check_image(&img, &base, &lay, false), done);
    let out = ext4kit(&["lazyinit", "--mult", "0", "--json", path]);
    assert!(out.status.success());
    assert_eq!(
        json_u64(&last_line(&out), "groups_zeroed_now") as usize,
        lay.groups.len() - done
    );
    check_image(&img, &base, &lay, true);
}

/// Several filesystems in one run: one worker, round-robin.
#[test]
fn several_filesystems_round_robin() {
    if !have_e2fsprogs("several_filesystems_round_robin") {
        return;
    }
    let dir = tmpdir();
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    mkfs(&a, 128 << 20, &["-b", "1024"]);
    mkfs(
        &b,
        64 << 20,
        &["-b", "1024", "-O", "^metadata_csum,uninit_bg"],
    );
    let (la, lb) = (layout(&a), layout(&b));
    fill_tails(&a, &la, 1);
    fill_tails(&b, &lb, 2);
    let (ba, bb) = (read_all(&a), read_all(&b));
    let out = ext4kit(&[
        "lazyinit",
        "--json",
        "--mult",
        "0",
        "--max-batch-groups",
        "1",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let devs: Vec<&str> = stdout
        .lines()
        .filter(|l| json_field(l, "event") == Some("group"))
        .filter_map(|l| json_field(l, "device"))
        .collect();
    // Alternating while both have work.
    let n = lb.groups.len().min(la.groups.len());
    for (i, d) in devs.iter().take(2 * n).enumerate() {
        let want = if i % 2 == 0 { &a } else { &b };
        assert_eq!(*d, want.to_str().unwrap(), "event {i}");
    }
    check_image(&a, &ba, &la, true);
    check_image(&b, &bb, &lb, true);
    assert_fsck_clean(&a);
    assert_fsck_clean(&b);
}

/// A loop device: a block device (BLKZEROOUT, read-compare, sysfs
/// counters for adaptive pacing), and refusal once it is mounted.
#[test]
fn loop_device_and_mount_refusal() {
    const T: &str = "loop_device_and_mount_refusal";
    if !have_e2fsprogs(T) {
        return;
    }
    if !is_root() {
        eprintln!("skip {T}: needs root for loop devices");
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("loop.img");
    mkfs(&img, 256 << 20, &["-b", "4096"]);
    let lay = layout(&img);
    fill_tails(&img, &lay, 3);
    let before = read_all(&img);
    let out = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&img)
        .output();
    let dev = match out {
        Ok(o) if o.status.success() => text(&o.stdout).trim().to_string(),
        Ok(o) => {
            eprintln!("skip {T}: losetup failed: {}", text(&o.stderr).trim());
            return;
        }
        Err(e) => {
            eprintln!("skip {T}: no losetup: {e}");
            return;
        }
    };
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());

    // Mounted: refused through the image file and through the device.
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-o", "ro,noload", &dev])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        for target in [img.to_str().unwrap(), dev.as_str()] {
            let out = ext4kit(&["lazyinit", "--mult", "0", target]);
            assert_eq!(out.status.code(), Some(1));
            assert!(
                text(&out.stderr).contains("mounted"),
                "{}",
                text(&out.stderr)
            );
        }
        let _ = Command::new("umount").arg(&mnt).status();
        assert!(read_all(&img) == before, "written while mounted");
    } else {
        eprintln!("{T}: cannot mount here; mount refusal not checked");
    }

    // Held exclusively by another program (O_EXCL on a block device):
    // refused, nothing written.
    {
        use std::os::unix::fs::OpenOptionsExt;
        const O_EXCL: i32 = 0o200; // Linux
        let held = fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_EXCL)
            .open(&dev)
            .expect("open loop device O_EXCL");
        let out = ext4kit(&["lazyinit", "--mult", "0", &dev]);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("in use"),
            "{}",
            text(&out.stderr)
        );
        drop(held);
        assert!(read_all(&img) == before, "written while held");
    }

    let out = ext4kit(&[
        "lazyinit",
        "--mult",
        "0",
        "--pace",
        "adaptive",
        "--verify-zero",
        "always",
        "--json",
        &dev,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let last = last_line(&out);
    assert!(json_u64(&last, "bytes_read") > 0, "{last}");
    assert!(json_u64(&last, "bytes_zeroed") > 0, "{last}");
    drop(_detach);
    check_image(&img, &before, &lay, true);
    assert_fsck_clean(&img);
}

/// meta_bg (issue 20): the cross-check compares each meta group's
/// descriptor block with its backup in the meta group's second group, so
/// a backup that disagrees about an inode table refuses, writing nothing.
#[test]
fn meta_bg_backup_descriptor_conflict_refuses() {
    if !have_e2fsprogs("meta_bg_backup_descriptor_conflict_refuses") {
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("mb.img");
    mkfs(
        &img,
        256 << 20,
        &["-b", "1024", "-O", "meta_bg,^resize_inode"],
    );
    // 16 descriptors per block: meta group 1 is groups 16..32; its block
    // is at the start of group 16, its backup at the start of group 17
    // (neither has a superblock copy). Group 16's descriptor comes first:
    // bg_inode_table_lo at byte 8.
    let backup = 1 + 17 * 8192u64;
    let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.write_all_at(&777u32.to_le_bytes(), backup * 1024 + 8)
        .unwrap();
    drop(f);
    let before = read_all(&img);
    let out = ext4kit(&["lazyinit", "--mult", "0", img.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("group 16: inode table") && err.contains("backup descriptors in group 17"),
        "{err}"
    );
    assert!(read_all(&img) == before, "written");
}
