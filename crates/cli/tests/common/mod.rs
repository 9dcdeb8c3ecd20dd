//! Helpers shared by the `ext4kit` integration tests: running ext4kit and
//! e2fsprogs, a strict e2fsck check, a sparse-aware image comparison, and
//! RAII guards for loop devices and mounts.
//!
//! Tests that need something the machine lacks (a tool, root, loop devices)
//! print one `SKIP <test>: <reason>` line on stderr and return.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use ext4kit_device::{CutMode, Device, FaultDevice, FileDevice, MemDevice, OpenOptions};

pub mod dumpe2fs;
pub mod fuse;

/// The UUID every comparison uses (`-U`).
pub const UUID: &str = "0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09";
/// The directory hash seed every comparison uses (`-E hash_seed=`).
pub const SEED: &str = "7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60";
/// The clock both formatters see (`E2FSPROGS_FAKE_TIME`).
pub const FAKE_TIME: &str = "1700000000";

/// /etc/mke2fs.conf of Debian 12 (e2fsprogs 1.47.0-2): no orphan_file and
/// no metadata_csum_seed in the ext4 features.
pub const DEBIAN_CONF: &str = r#"[defaults]
	base_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
	default_mntopts = acl,user_xattr
	enable_periodic_fsck = 0
	blocksize = 4096
	inode_size = 256
	inode_ratio = 16384

[fs_types]
	ext3 = {
		features = has_journal
	}
	ext4 = {
		features = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
	}
	small = {
		blocksize = 1024
		inode_ratio = 4096
	}
	floppy = {
		blocksize = 1024
		inode_ratio = 8192
	}
	big = {
		inode_ratio = 32768
	}
	huge = {
		inode_ratio = 65536
	}
	news = {
		inode_ratio = 4096
	}
	largefile = {
		inode_ratio = 1048576
		blocksize = -1
	}
	largefile4 = {
		inode_ratio = 4194304
		blocksize = -1
	}
	hurd = {
	     blocksize = 4096
	     inode_size = 128
	     warn_y2038_dates = 0
	}
"#;

/// mke2fs.conf with the ext4 defaults of upstream e2fsprogs 1.47.0
/// (orphan_file and metadata_csum_seed on).
pub const UPSTREAM_CONF: &str = r#"# mke2fs.conf with the feature defaults of upstream e2fsprogs 1.47.0 for ext4
# (orphan_file and metadata_csum_seed on; Debian 12 turns both off).
[defaults]
	base_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
	default_mntopts = acl,user_xattr
	enable_periodic_fsck = 0
	blocksize = 4096
	inode_size = 256
	inode_ratio = 16384

[fs_types]
	ext3 = {
		features = has_journal
	}
	ext4 = {
		features = has_journal,extent,huge_file,flex_bg,metadata_csum,metadata_csum_seed,64bit,dir_nlink,extra_isize,orphan_file
	}
	small = {
		blocksize = 1024
		inode_ratio = 4096
	}
	floppy = {
		blocksize = 1024
		inode_ratio = 8192
	}
	big = {
		inode_ratio = 32768
	}
	huge = {
		inode_ratio = 65536
	}
	news = {
		inode_ratio = 4096
	}
	largefile = {
		inode_ratio = 1048576
		blocksize = -1
	}
	largefile4 = {
		inode_ratio = 4194304
		blocksize = -1
	}
	hurd = {
	     blocksize = 4096
	     inode_size = 128
	     warn_y2038_dates = 0
	}
"#;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const TIB: u64 = 1 << 40;

/// Print a skip notice for `what` and let the caller return.
pub fn skip(what: &str, reason: &str) {
    eprintln!("SKIP {what}: {reason}");
}

/// Where to find `tool`: `$PATH` first, then the sbin directories that a
/// non-root `$PATH` often lacks.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| {
            p.metadata()
                .map(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.is_file() && m.permissions().mode() & 0o111 != 0
                })
                .unwrap_or(false)
        })
}

/// Is `tool` installed?
pub fn have(tool: &str) -> bool {
    find_tool(tool).is_some()
}

/// A `Command` for an external tool (found with [`find_tool`]), with the C
/// locale so that messages can be matched.
pub fn tool(name: &str) -> Command {
    let path = find_tool(name).unwrap_or_else(|| PathBuf::from(name));
    let mut c = Command::new(path);
    c.env("LC_ALL", "C").env("LANG", "C").stdin(Stdio::null());
    c
}

/// The ext4kit binary built for these tests.
pub fn ext4kit_path() -> &'static str {
    env!("CARGO_BIN_EXE_ext4kit")
}

/// A `Command` for the ext4kit binary, with the C locale.
pub fn ext4kit() -> Command {
    let mut c = Command::new(ext4kit_path());
    c.env("LC_ALL", "C")
        .env("LANG", "C")
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null());
    c
}

/// `ext4kit mkfs ARGS...`.
pub fn ext4kit_mkfs<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = ext4kit();
    c.arg("mkfs").args(args);
    c
}

/// `mke2fs ARGS...`.
pub fn mke2fs<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = tool("mke2fs");
    c.args(args);
    c
}

/// `dumpe2fs -h IMG`, stdout only (empty on failure).
pub fn dumpe2fs_h(img: &Path) -> String {
    tool("dumpe2fs")
        .arg("-h")
        .arg(img)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// One case of a matrix: "ok" or "FAIL" on stderr, the failure collected
/// for the test's final assertion.
pub fn report_case(label: &str, res: Result<(), String>, failures: &mut Vec<String>) {
    match res {
        Ok(()) => eprintln!("ok     {label}"),
        Err(e) => {
            eprintln!("FAIL   {label}: {e}");
            failures.push(format!("{label}: {e}"));
        }
    }
}

/// Run a command and capture everything; a spawn failure is an `Err`.
pub fn run(cmd: &mut Command) -> Result<Output, String> {
    cmd.output().map_err(|e| format!("cannot run {cmd:?}: {e}"))
}

/// Run a command and demand exit status 0.
pub fn run_ok(cmd: &mut Command) -> Result<Output, String> {
    let out = run(cmd)?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The last non-empty line of a command's stderr (or stdout), for messages.
pub fn last_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let std = String::from_utf8_lossy(&out.stdout);
    err.lines()
        .chain(std.lines())
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string()
}

const E2FSCK_PASSES: [&str; 5] = [
    "Pass 1: Checking inodes, blocks, and sizes",
    "Pass 2: Checking directory structure",
    "Pass 3: Checking directory connectivity",
    "Pass 4: Checking reference counts",
    "Pass 5: Checking group summary information",
];

/// `e2fsck -fn PATH` must exit 0 and say nothing but its version line, the
/// five "Pass N:" lines and the "PATH: N/M files ..., N/M blocks" summary
/// (e2fsck exits 0 after some real complaints, so the text is checked too).
/// Returns the summary line.
pub fn e2fsck_clean(path: &Path) -> Result<String, String> {
    e2fsck_clean_with(path, &[])
}

/// [`e2fsck_clean`] with extra options before the path (e.g. `-E
/// no_optimize_extents`: no pass-1E offers to repack an extent tree,
/// which are optimizations, not repairs).
pub fn e2fsck_clean_with(path: &Path, extra: &[&str]) -> Result<String, String> {
    e2fsck_clean_env(path, extra, &[])
}

/// [`e2fsck_clean_with`] with environment variables for e2fsck (e.g.
/// `BLKID_FILE`).
pub fn e2fsck_clean_env(
    path: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<String, String> {
    let mut cmd = tool("e2fsck");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run(cmd.arg("-fn").args(extra).arg(path))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let fail = |why: &str| Err(format!("e2fsck -fn {}: {why}:\n{text}", path.display()));
    if out.status.code() != Some(0) {
        return fail(&format!("exit status {}", out.status));
    }
    // The summary names the filesystem by its label when it has one.
    let path_prefix = format!("{}: ", path.display());
    let label_prefix = fs_label(path)
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}: "));
    let named = |line: &str| {
        line.starts_with(&path_prefix) || label_prefix.as_ref().is_some_and(|p| line.starts_with(p))
    };
    let mut passes = 0;
    let mut version = false;
    let mut summary: Option<&str> = None;
    for line in text.lines() {
        if !version && line.starts_with("e2fsck ") {
            version = true;
        } else if passes < 5 && line == E2FSCK_PASSES[passes] {
            passes += 1;
        } else if summary.is_none()
            && passes == 5
            && named(line)
            && line.contains(" files (")
            && line.ends_with(" blocks")
        {
            summary = Some(line);
        } else {
            return fail(&format!("unexpected line {line:?}"));
        }
    }
    match summary {
        Some(s) if version && passes == 5 => Ok(s.to_string()),
        _ => fail("incomplete output"),
    }
}

/// The used inode count in an e2fsck summary ("NAME: 11/65536 files ...").
pub fn used_inodes(summary: &str) -> Option<u64> {
    let (_, rest) = summary.rsplit_once(": ")?;
    rest.split('/').next()?.trim().parse().ok()
}

/// The block size recorded in an ext2/3/4 superblock, if there is one.
pub fn fs_block_size(img: &Path) -> Option<u64> {
    let f = File::open(img).ok()?;
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, 1024).ok()?;
    if u16::from_le_bytes([sb[56], sb[57]]) != 0xEF53 {
        return None;
    }
    let log = u32::from_le_bytes([sb[24], sb[25], sb[26], sb[27]]);
    (log <= 6).then(|| 1024u64 << log)
}

/// The volume label in an ext2/3/4 superblock, if there is a superblock.
pub fn fs_label(img: &Path) -> Option<String> {
    let f = File::open(img).ok()?;
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, 1024).ok()?;
    if u16::from_le_bytes([sb[56], sb[57]]) != 0xEF53 {
        return None;
    }
    let raw = &sb[120..136];
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Some(String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// Ranges of `path` (whole file) that are not proven to be holes.
fn data_ranges(path: &Path, size: u64) -> Result<Vec<(u64, u64)>, String> {
    let dev = FileDevice::open(path, OpenOptions::read_only())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let zeros = dev
        .known_zero_ranges(0, size)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut pos = 0;
    for (s, e) in zeros {
        if s > pos {
            out.push((pos, s.min(size)));
        }
        pos = pos.max(e);
    }
    if pos < size {
        out.push((pos, size));
    }
    Ok(out)
}

/// Union of two sorted lists of half-open ranges.
fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a.iter().chain(b).copied().collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Compare two (sparse) image files. Only ranges allocated in either file
/// are read; a range that is a hole in both reads as zeros in both. (Hole
/// discovery uses `lseek(SEEK_DATA/SEEK_HOLE)` through the device crate; as a
/// guard, the first and last 64 KiB of every skipped range are read anyway.)
///
/// On a difference: the number of differing bytes and the first differing
/// blocks, in units of the block size found in `a`'s superblock (or 4096).
pub fn sparse_equal(a: &Path, b: &Path) -> Result<(), String> {
    let (fa, fb) = (
        File::open(a).map_err(|e| format!("{}: {e}", a.display()))?,
        File::open(b).map_err(|e| format!("{}: {e}", b.display()))?,
    );
    let (sa, sb) = (
        fa.metadata().map_err(|e| e.to_string())?.len(),
        fb.metadata().map_err(|e| e.to_string())?.len(),
    );
    if sa != sb {
        return Err(format!("sizes differ: {sa} != {sb}"));
    }
    let bs = fs_block_size(a).unwrap_or(4096);
    let data = union(&data_ranges(a, sa)?, &data_ranges(b, sb)?);
    // The guard reads at the edges of the skipped ranges.
    let mut ranges = data.clone();
    let mut pos = 0;
    for &(s, e) in data.iter().chain(std::iter::once(&(sa, sa))) {
        if s > pos {
            let g = 64 * KIB;
            ranges.push((pos, (pos + g).min(s)));
            ranges.push((s.saturating_sub(g).max(pos), s));
        }
        pos = e;
    }
    let ranges = union(&ranges, &[]);

    const CHUNK: u64 = MIB;
    let (mut xa, mut xb) = (vec![0u8; CHUNK as usize], vec![0u8; CHUNK as usize]);
    let mut ndiff: u64 = 0;
    let mut blocks: Vec<u64> = Vec::new();
    for (s, e) in ranges {
        let mut off = s;
        while off < e {
            let n = (e - off).min(CHUNK) as usize;
            fa.read_exact_at(&mut xa[..n], off)
                .map_err(|e| format!("reading {}: {e}", a.display()))?;
            fb.read_exact_at(&mut xb[..n], off)
                .map_err(|e| format!("reading {}: {e}", b.display()))?;
            if xa[..n] != xb[..n] {
                for i in 0..n {
                    if xa[i] != xb[i] {
                        ndiff += 1;
                        let blk = (off + i as u64) / bs;
                        if blocks.len() < 8 && !blocks.contains(&blk) {
                            blocks.push(blk);
                        }
                    }
                }
            }
            off += n as u64;
        }
    }
    if ndiff == 0 {
        return Ok(());
    }
    let list: Vec<String> = blocks.iter().map(u64::to_string).collect();
    Err(format!(
        "images differ in {ndiff} bytes; first differing {bs}-byte blocks: {} \
         (first at byte offset {})",
        list.join(","),
        first_diff_offset(&fa, &fb, blocks[0] * bs, bs).unwrap_or(blocks[0] * bs)
    ))
}

fn first_diff_offset(fa: &File, fb: &File, start: u64, len: u64) -> Option<u64> {
    let mut xa = vec![0u8; len as usize];
    let mut xb = vec![0u8; len as usize];
    fa.read_exact_at(&mut xa, start).ok()?;
    fb.read_exact_at(&mut xb, start).ok()?;
    xa.iter()
        .zip(&xb)
        .position(|(x, y)| x != y)
        .map(|i| start + i as u64)
}

/// Create a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) -> std::io::Result<()> {
    let f = File::create(path)?;
    f.set_len(size)
}

/// A temporary directory for images: `/dev/shm` (tmpfs: fast, and takes
/// sparse files past ext4's 16 TiB limit) when it is usable, else the
/// default temporary directory.
pub fn image_dir() -> tempfile::TempDir {
    shm_dir().unwrap_or_else(|| {
        tempfile::Builder::new()
            .prefix("ext4kit-test.")
            .tempdir()
            .expect("creating a temporary directory")
    })
}

/// A temporary directory in `/dev/shm`, if that exists and is writable.
pub fn shm_dir() -> Option<tempfile::TempDir> {
    if !Path::new("/dev/shm").is_dir() {
        return None;
    }
    tempfile::Builder::new()
        .prefix("ext4kit-test.")
        .tempdir_in("/dev/shm")
        .ok()
}

/// Is the effective user root? (From /proc/self/status, no unsafe code.)
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// A loop device attached to an image file; detached on drop.
pub struct LoopDev {
    path: PathBuf,
}

impl LoopDev {
    /// `losetup -f --show IMG`.
    pub fn attach(img: &Path) -> Result<LoopDev, String> {
        Self::attach_with(img, &[])
    }

    /// `losetup -f --show OPTS... IMG` (e.g. `--sector-size 4096`).
    pub fn attach_with(img: &Path, opts: &[&str]) -> Result<LoopDev, String> {
        if !have("losetup") {
            return Err("losetup not found".into());
        }
        let out = run_ok(tool("losetup").arg("-f").arg("--show").args(opts).arg(img))?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !dev.starts_with("/dev/") {
            return Err(format!("losetup printed {dev:?}"));
        }
        Ok(LoopDev {
            path: PathBuf::from(dev),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        // The kernel may hold the device briefly after umount; retry.
        for _ in 0..20 {
            match tool("losetup").arg("-d").arg(&self.path).output() {
                Ok(o) if o.status.success() => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        eprintln!("warning: could not detach {}", self.path.display());
    }
}

/// A filesystem mounted on a fresh temporary directory; unmounted on drop
/// (also while unwinding from a panic).
pub struct Mount {
    dir: Option<tempfile::TempDir>,
}

impl Mount {
    /// `mount -t FSTYPE [-o OPTIONS] DEV <tempdir>`.
    pub fn new(dev: &Path, fstype: &str, options: Option<&str>) -> Result<Mount, String> {
        let dir = tempfile::Builder::new()
            .prefix("ext4kit-mnt.")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut cmd = tool("mount");
        cmd.arg("-t").arg(fstype);
        if let Some(o) = options {
            cmd.arg("-o").arg(o);
        }
        run_ok(cmd.arg(dev).arg(dir.path()))?;
        Ok(Mount { dir: Some(dir) })
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("mounted").path()
    }

    /// Unmount now, reporting failure (drop would only warn). A busy
    /// mount is retried for a while (something may still hold it for a
    /// moment); if it stays busy, the error is returned and the drop
    /// that follows detaches it lazily, so the caller can still detach
    /// its loop device.
    pub fn unmount(mut self) -> Result<(), String> {
        let dir = self.dir.take().expect("mounted");
        let mut last = String::new();
        for _ in 0..10 {
            match run_ok(tool("umount").arg(dir.path())) {
                Ok(_) => return Ok(()),
                Err(e) => last = e,
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        self.dir = Some(dir);
        Err(last)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        for i in 0..20 {
            let mut c = tool("umount");
            if i >= 10 {
                c.arg("-l");
            }
            match c.arg(dir.path()).output() {
                Ok(o) if o.status.success() => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        eprintln!("warning: could not unmount {}", dir.path().display());
        // Do not let TempDir try to delete files of a still-mounted fs.
        std::mem::forget(dir);
    }
}

/// The "kernel twin" of an image: a sparse copy (`copy`), loop-attached
/// and mounted by the kernel's ext4 with `options`, to run the same
/// script on as on ext4kit's mount. Dropping it unmounts, then detaches.
pub struct KernelTwin {
    /// The kernel's mount (declared first: dropped before the loop device).
    pub mount: Mount,
    pub lo: LoopDev,
    /// The copy the kernel mounted (it stays after [`KernelTwin::unmount`]).
    pub copy: PathBuf,
}

impl KernelTwin {
    /// Copy `img` to `copy`, attach it and mount it with the kernel's ext4.
    pub fn new(img: &Path, copy: PathBuf, options: Option<&str>) -> Result<KernelTwin, String> {
        sparse_copy(img, &copy);
        let lo = LoopDev::attach(&copy)?;
        let mount = Mount::new(lo.path(), "ext4", options)?;
        Ok(KernelTwin { mount, lo, copy })
    }

    /// The kernel's mount point.
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// Unmount (a failure is an `Err`), then detach.
    pub fn unmount(self) -> Result<(), String> {
        let KernelTwin { mount, lo, .. } = self;
        mount.unmount()?;
        drop(lo);
        Ok(())
    }
}

/// Can this process attach loop devices and mount ext4? `Err` says why not.
pub fn kernel_mount_available() -> Result<(), String> {
    if !is_root() {
        return Err("not root".into());
    }
    for t in ["losetup", "mount", "umount"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("ext4"))
    {
        // ext4 may still be a loadable module; mount will tell.
        eprintln!("note: ext4 not in /proc/filesystems (module not loaded yet?)");
    }
    Ok(())
}

/// A 64-bit FNV-1a hash of a whole file (to prove it was not written).
pub fn file_hash(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = File::open(path)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut buf = vec![0u8; 1 << 16];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        for &b in &buf[..n] {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok((h, len))
}

/// Fill `path` with `len` bytes of a recognizable pseudo-random pattern.
pub fn pattern_file(path: &Path, len: u64, seed: u64) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    let mut x = seed | 1;
    let mut buf = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        for c in buf.chunks_mut(8) {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            c.copy_from_slice(&b[..c.len()]);
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// `debugfs -R "ea_list PATH"`: (name, value length) per attribute (ACLs
/// in ext4's on-disk form, as debugfs shows them).
pub fn debugfs_ea_list(img: &Path, path: &str) -> Vec<(String, usize)> {
    let out = run_ok(
        tool("debugfs")
            .arg("-R")
            .arg(format!("ea_list {path}"))
            .arg(img),
    )
    .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("  "))
        .filter_map(|l| {
            let l = l.trim_start();
            let (name, rest) = l.split_once(" (")?;
            let len = rest.split(')').next()?.parse().ok()?;
            Some((name.to_string(), len))
        })
        .collect()
}

/// `mke2fs` and `e2fsck` are installed (for a `skip` line otherwise).
pub fn e2fs_tools() -> Result<(), String> {
    for t in ["mke2fs", "e2fsck"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    Ok(())
}

/// A new sparse image `dir/name` of `size` made by mke2fs (ext4, [`UUID`],
/// no discard) with extra `args`.
pub fn mkimg(dir: &Path, name: &str, size: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(name);
    let _ = std::fs::remove_file(&img);
    run_ok(tool("truncate").args(["-s", size]).arg(&img)).unwrap();
    run_ok(
        mke2fs(["-q", "-F", "-t", "ext4", "-U", UUID, "-E", "nodiscard"])
            .args(args)
            .arg(&img),
    )
    .unwrap();
    img
}

/// `EXT4_IOC_SHUTDOWN` with `EXT4_GOING_FLAGS_NOLOGFLUSH` after an fsync
/// of the mount point: the log keeps what was committed, nothing more
/// reaches the disk.
pub fn shutdown_nologflush(mnt: &Path) {
    run_ok(
        tool("python3")
            .arg("-c")
            .arg(
                "import os,fcntl,struct,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.fsync(fd); \
         fcntl.ioctl(fd,0x8004587D,struct.pack('I',2))",
            )
            .arg(mnt),
    )
    .unwrap();
}

/// Superblock fields that say when and how much was written, and the
/// checksum over them: the only bytes allowed to differ from e2fsck's.
pub fn mask_superblock(img: &Path) {
    use ext4kit_format::superblock::Superblock;
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    for (off, len) in [
        (std::mem::offset_of!(Superblock, s_wtime), 4),
        (std::mem::offset_of!(Superblock, s_wtime_hi), 1),
        (std::mem::offset_of!(Superblock, s_kbytes_written), 8),
        (std::mem::offset_of!(Superblock, s_checksum), 4),
    ] {
        f.write_all_at(&vec![0u8; len], 1024 + off as u64).unwrap();
    }
}

/// Copy an image, keeping its holes.
pub fn sparse_copy(src: &Path, dst: &Path) {
    run_ok(tool("cp").arg("--sparse=always").arg(src).arg(dst)).unwrap();
}

/// An image file opened read-write as a shared device. Not exclusive: a
/// child process forked by a parallel test may hold a copy of the
/// descriptor (and its flock) for a moment.
pub fn open_file(img: &Path) -> std::sync::Arc<dyn Device> {
    let o = OpenOptions {
        write: true,
        exclusive: false,
    };
    std::sync::Arc::new(FileDevice::open(img, o).unwrap())
}

/// `len` bytes of a recognizable pseudo-random pattern (xorshift64) for
/// `seed`: test data whose every copy can be regenerated and compared.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A small deterministic generator (xorshift64) for random test
/// workloads; the seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform-ish in `0..n` (`0` for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Can this process serve a FUSE mount (root, /dev/fuse, fuse in
/// /proc/filesystems) and check it (e2fsprogs)? `Err` says what is missing.
pub fn fuse_available() -> Result<(), String> {
    if !is_root() {
        return Err("not root".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Err("/dev/fuse missing".into());
    }
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("fuse"))
    {
        return Err("fuse not in /proc/filesystems".into());
    }
    e2fs_tools()
}

/// Is a FUSE filesystem mounted on `dir` (this process's mount table)?
pub fn is_fuse_mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            // `fuse` (fuser's mount), `fuse.ext4kit` (our own transport's).
            f.get(4) == Some(&want.as_str())
                && (l.contains(" - fuse ") || l.contains(" - fuse.ext4kit "))
        })
}

/// One run of `run` on a [`FaultDevice`] over a copy of `base`, its power
/// cut after `cut` writes (`None`: no cut) in `mode`: the copy (what a
/// crash left), what `run` returned and the writes it made (the crash
/// tests' loop over every write).
pub fn run_cut<R>(
    base: &MemDevice,
    cut: Option<u64>,
    mode: CutMode,
    run: impl FnOnce(std::sync::Arc<dyn Device>) -> R,
) -> (std::sync::Arc<MemDevice>, R, u64) {
    let mem = std::sync::Arc::new(base.snapshot());
    let fault = FaultDevice::new(mem.clone());
    let ctl = fault.control();
    ctl.set_cut_mode(mode);
    if let Some(n) = cut {
        ctl.power_cut_after(n);
    }
    let r = run(std::sync::Arc::new(fault));
    (mem, r, ctl.ops())
}

/// [`run_cut`] for a filesystem with an external journal: copies of
/// `fs` and `journal` joined ([`ext4kit_device::WithJournal`]) under one
/// [`FaultDevice`], so the cut counts the writes of both devices and a
/// flush is the barrier of both. Returns both copies.
pub fn run_cut_joined<R>(
    fs: &MemDevice,
    journal: &MemDevice,
    cut: Option<u64>,
    mode: CutMode,
    run: impl FnOnce(std::sync::Arc<dyn Device>) -> R,
) -> (std::sync::Arc<MemDevice>, std::sync::Arc<MemDevice>, R, u64) {
    let f = std::sync::Arc::new(fs.snapshot());
    let j = std::sync::Arc::new(journal.snapshot());
    let joined = ext4kit_device::WithJournal::new(f.clone(), j.clone());
    let fault = FaultDevice::new(joined);
    let ctl = fault.control();
    ctl.set_cut_mode(mode);
    if let Some(n) = cut {
        ctl.power_cut_after(n);
    }
    let r = run(std::sync::Arc::new(fault));
    (f, j, r, ctl.ops())
}
