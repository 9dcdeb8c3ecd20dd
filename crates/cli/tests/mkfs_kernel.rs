//! Filesystems made by `ext4kit mkfs` under a real kernel: attach the image
//! to a loop device, mount it as ext4, write a few thousand files and
//! directories, unmount, and demand a clean `e2fsck -fn`; then mount it
//! again read-only and check that everything reads back. One test per
//! configuration ext4kit makes and the kernel supports: block sizes,
//! feature sets, ext2/ext3 types and revision 0 (mounted as such, through
//! the ext4 driver), geometry options, an offset in the image, bad
//! blocks, mke2fs.conf's huge files.
//!
//! When the kernel refuses one of our images, the test makes mke2fs's
//! image of the same configuration: if the kernel refuses that too, the
//! configuration is beyond this kernel and the test skips, saying so;
//! otherwise it fails (our bug).
//!
//! Needs root, loop devices and an ext4-capable kernel; otherwise every test
//! prints why it skips. Loop devices and mounts are always released (RAII
//! guards, also on panic).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;

/// Can we attach, mount, write and unmount at all? Checked once with an
/// image made by mke2fs, so that a failure to mount one of *ours* counts as
/// a failure, not as a missing capability.
fn kernel_ready() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            kernel_mount_available()?;
            for t in ["mke2fs", "e2fsck"] {
                if !have(t) {
                    return Err(format!("{t} not found (install e2fsprogs)"));
                }
            }
            let dir = image_dir();
            let img = dir.path().join("probe.img");
            sparse_file(&img, 64 * MIB).map_err(|e| e.to_string())?;
            run_ok(mke2fs(["-F", "-q", "-t", "ext4"]).arg(&img))?;
            let lo =
                LoopDev::attach(&img).map_err(|e| format!("cannot attach a loop device: {e}"))?;
            let mnt = Mount::new(lo.path(), "ext4", None)
                .map_err(|e| format!("cannot mount ext4 from a loop device: {e}"))?;
            fs::write(mnt.path().join("probe"), b"probe").map_err(|e| e.to_string())?;
            mnt.unmount()?;
            Ok(())
        })
        .clone()
}

/// Deterministic file contents: `len` bytes derived from `seed`.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Write the workload under `root`; return what each regular file (by path
/// relative to `root`) must contain afterwards.
fn populate(root: &Path) -> std::io::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut expect = BTreeMap::new();
    let mut put = |rel: PathBuf, data: Vec<u8>| -> std::io::Result<()> {
        let mut f = fs::File::create(root.join(&rel))?;
        f.write_all(&data)?;
        expect.insert(rel, data);
        Ok(())
    };
    // 50 directories of 60 files, 0 to ~9 KiB each (inline data sizes,
    // one block, several blocks), each with a nested chain of directories.
    for d in 0..50u64 {
        let dir = PathBuf::from(format!("dir{d:02}"));
        fs::create_dir(root.join(&dir))?;
        for f in 0..60u64 {
            let len = ((d * 131 + f * 977) % 9000) as usize;
            put(
                dir.join(format!("file{f:02}.dat")),
                content(d * 1000 + f, len),
            )?;
        }
        let nested = dir.join("a").join("b").join("c");
        fs::create_dir_all(root.join(&nested))?;
        for f in 0..3u64 {
            put(
                nested.join(format!("n{f}")),
                content(d * 7 + f, 100 + f as usize),
            )?;
        }
    }
    // A big directory (htree).
    fs::create_dir(root.join("big-dir"))?;
    for f in 0..600u64 {
        put(
            PathBuf::from(format!("big-dir/entry-with-a-longish-name-{f:04}")),
            content(90_000 + f, (f % 50) as usize),
        )?;
    }
    // A few larger files (~1 MiB; extents, indirect blocks without them).
    fs::create_dir(root.join("large"))?;
    for f in 0..4u64 {
        put(
            PathBuf::from(format!("large/big{f}.bin")),
            content(70_000 + f, (1 << 20) + (f as usize) * 4099),
        )?;
    }
    // Deletes, renames, links, an unlinked-while-open file.
    for d in (0..50u64).step_by(5) {
        for f in (0..60u64).step_by(7) {
            let rel = PathBuf::from(format!("dir{d:02}/file{f:02}.dat"));
            fs::remove_file(root.join(&rel))?;
            expect.remove(&rel);
        }
    }
    for d in (1..50u64).step_by(10) {
        let from = PathBuf::from(format!("dir{d:02}/file01.dat"));
        let to = PathBuf::from(format!("dir{:02}/moved-from-{d:02}.dat", d + 1));
        fs::rename(root.join(&from), root.join(&to))?;
        let data = expect.remove(&from).expect("renamed file exists");
        expect.insert(to, data);
    }
    fs::remove_dir_all(root.join("dir49/a"))?;
    expect.retain(|p, _| !p.starts_with("dir49/a"));
    fs::hard_link(
        root.join("dir02/file02.dat"),
        root.join("large/hardlink.dat"),
    )?;
    expect.insert(
        PathBuf::from("large/hardlink.dat"),
        expect[Path::new("dir02/file02.dat")].clone(),
    );
    std::os::unix::fs::symlink("../dir03/file03.dat", root.join("large/symlink"))?;
    {
        let mut f = fs::File::create(root.join("orphan"))?;
        fs::remove_file(root.join("orphan"))?;
        f.write_all(&content(1, 200_000))?;
        f.sync_all()?;
    }
    Ok(expect)
}

/// Every expected file is there with its content, and the symlink resolves.
fn verify(root: &Path, expect: &BTreeMap<PathBuf, Vec<u8>>) -> Result<(), String> {
    for (rel, data) in expect {
        let got = fs::read(root.join(rel)).map_err(|e| format!("{}: {e}", rel.display()))?;
        if &got != data {
            return Err(format!("{}: content differs after remount", rel.display()));
        }
    }
    let link = fs::read(root.join("large/symlink")).map_err(|e| format!("symlink: {e}"))?;
    if link != expect[Path::new("dir03/file03.dat")] {
        return Err("symlink target content differs".into());
    }
    if root.join("orphan").exists() {
        return Err("the unlinked file came back".into());
    }
    Ok(())
}

/// Extra checks a configuration brings: on the mounted filesystem (run
/// on the first mount before the workload, and on the read-only mount
/// after it), or on the image after the last e2fsck.
type Check<'a> = &'a dyn Fn(&Path) -> Result<(), String>;

/// One configuration for the kernel: how ext4kit makes it, how it is
/// mounted, and what else must hold. [`kernel_case`] is the plain ext4
/// one.
struct Case<'a> {
    name: &'a str,
    conf: &'a str,
    /// The image file's size.
    size: u64,
    /// mkfs options after `-q -t TYPE`.
    opts: &'a [&'a str],
    /// `-t` for mkfs, and the type given to mount (ext2 and ext3 go
    /// through the ext4 driver here, with their own feature checks).
    fs_type: &'a str,
    /// Where the filesystem starts in the image (`-E offset=` in `opts`):
    /// the loop devices for mounting and checking start there.
    offset: u64,
    /// The size argument after the device, if any.
    fs_size: Option<&'a str>,
    /// The logical sector size of a loop device that mkfs formats (and
    /// everything else goes through) instead of the image file; 0: none.
    sector_size: u64,
    /// Run on the image file before mkfs.
    before: Option<Check<'a>>,
    mounted: Option<Check<'a>>,
    offline: Option<Check<'a>>,
}

impl<'a> Case<'a> {
    fn new(name: &'a str, conf: &'a str, size: u64, opts: &'a [&'a str]) -> Self {
        Case {
            name,
            conf,
            size,
            opts,
            fs_type: "ext4",
            offset: 0,
            fs_size: None,
            sector_size: 0,
            before: None,
            mounted: None,
            offline: None,
        }
    }

    fn fs_type(self, fs_type: &'a str) -> Self {
        Case { fs_type, ..self }
    }

    fn at_offset(self, offset: u64, fs_size: &'a str) -> Self {
        Case {
            offset,
            fs_size: Some(fs_size),
            ..self
        }
    }

    fn on_loop_device(self, sector_size: u64) -> Self {
        Case {
            sector_size,
            ..self
        }
    }

    fn before(self, prepare: Check<'a>) -> Self {
        Case {
            before: Some(prepare),
            ..self
        }
    }

    fn mounted(self, check: Check<'a>) -> Self {
        Case {
            mounted: Some(check),
            ..self
        }
    }

    fn offline(self, check: Check<'a>) -> Self {
        Case {
            offline: Some(check),
            ..self
        }
    }

    /// A loop device over the filesystem (at its offset in the image, with
    /// the case's sector size).
    fn attach(&self, img: &Path) -> Result<LoopDev, String> {
        let (off, sector) = (self.offset.to_string(), self.sector_size.to_string());
        let mut opts = Vec::new();
        if self.offset != 0 {
            opts.extend(["-o", off.as_str()]);
        }
        if self.sector_size != 0 {
            opts.extend(["--sector-size", sector.as_str()]);
        }
        LoopDev::attach_with(img, &opts)
    }

    /// Is the filesystem only reachable through a loop device?
    fn needs_loop(&self) -> bool {
        self.offset != 0 || self.sector_size != 0
    }

    /// `e2fsck_clean` on the filesystem (through a loop device when it
    /// starts at an offset or lives on a device with larger sectors).
    fn fsck(&self, img: &Path) -> Result<String, String> {
        if !self.needs_loop() {
            return e2fsck_clean(img);
        }
        let lo = self.attach(img)?;
        e2fsck_clean(lo.path())
    }

    /// Format `img` with `cmd` (ext4kit's mkfs or mke2fs) as this case
    /// says: the file itself, or a loop device over it with the case's
    /// sector size.
    fn format(&self, mut cmd: Command, img: &Path, conf: &Path) -> Result<(), String> {
        let lo = match self.sector_size {
            0 => None,
            _ => Some(self.attach(img)?),
        };
        cmd.args(["-q", "-t", self.fs_type])
            .args(self.opts)
            .arg(lo.as_ref().map_or(img, |l| l.path()))
            .args(self.fs_size)
            .env("MKE2FS_CONFIG", conf);
        run_ok(&mut cmd).map(drop)
    }

    /// Our image does not mount: does mke2fs's twin? `Ok(reason)` when the
    /// kernel refuses that too (a limit of this kernel, not our bug).
    fn kernel_refuses_mke2fs_too(&self, dir: &Path, conf: &Path) -> Result<String, String> {
        let img = dir.join("mke2fs-twin.img");
        sparse_file(&img, self.size).map_err(|e| e.to_string())?;
        if let Some(prepare) = self.before {
            prepare(&img)?;
        }
        self.format(mke2fs(["-F"]), &img, conf)?;
        let lo = self.attach(&img)?;
        match Mount::new(lo.path(), self.fs_type, None) {
            Ok(mnt) => {
                mnt.unmount()?;
                Err("mke2fs's image of the same configuration mounts".into())
            }
            Err(e) => Ok(format!(
                "the kernel refuses mke2fs's image too: {}{}",
                e.lines().next().unwrap_or(""),
                kernel_log(lo.path())
            )),
        }
    }

    fn run(&self) {
        let test = format!("mkfs_kernel {}", self.name);
        if let Err(why) = kernel_ready() {
            return skip(&test, &why);
        }
        let dir = image_dir();
        let conf_path = dir.path().join("mke2fs.conf");
        fs::write(&conf_path, self.conf).unwrap();
        let img = dir.path().join("kernel.img");
        sparse_file(&img, self.size).unwrap();
        if let Some(prepare) = self.before {
            prepare(&img).unwrap_or_else(|e| panic!("{test}: preparing the image: {e}"));
        }
        if self.sector_size != 0 {
            // An old losetup (or loop driver) has no --sector-size.
            if let Err(e) = self.attach(&img) {
                let why = format!(
                    "cannot attach a loop device with {}-byte sectors: {e}",
                    self.sector_size
                );
                return skip(&test, &why);
            }
        }
        self.format(ext4kit_mkfs::<_, &str>([]), &img, &conf_path)
            .unwrap_or_else(|e| panic!("{test}: mkfs: {e}"));
        self.fsck(&img)
            .unwrap_or_else(|e| panic!("{test}: fresh image: {e}"));

        let expect = {
            let lo = self.attach(&img).unwrap();
            let mnt = match Mount::new(lo.path(), self.fs_type, None) {
                Ok(m) => m,
                Err(e) => {
                    let log = kernel_log(lo.path());
                    drop(lo);
                    match self.kernel_refuses_mke2fs_too(dir.path(), &conf_path) {
                        Ok(why) => return skip(&test, &why),
                        Err(twin) => {
                            panic!("{test}: the kernel refuses to mount it: {e}\n({twin}){log}")
                        }
                    }
                }
            };
            if let Some(check) = self.mounted {
                check(mnt.path()).unwrap_or_else(|e| panic!("{test}: fresh mount: {e}"));
            }
            let expect = populate(mnt.path()).unwrap_or_else(|e| panic!("{test}: writing: {e}"));
            run_ok(tool("sync").arg("-f").arg(mnt.path())).unwrap();
            mnt.unmount().unwrap();
            expect
            // `lo` is detached here.
        };
        let summary = self
            .fsck(&img)
            .unwrap_or_else(|e| panic!("{test}: after the kernel wrote to it: {e}"));
        // The files did land in this filesystem (not in the mount point).
        let used = used_inodes(&summary).unwrap_or(0);
        assert!(
            used as usize > expect.len(),
            "{test}: only {used} inodes in use after writing {} files: {summary}",
            expect.len()
        );

        {
            let lo = self.attach(&img).unwrap();
            let mnt = Mount::new(lo.path(), self.fs_type, Some("ro")).unwrap();
            verify(mnt.path(), &expect).unwrap_or_else(|e| panic!("{test}: {e}"));
            if let Some(check) = self.mounted {
                check(mnt.path()).unwrap_or_else(|e| panic!("{test}: after the workload: {e}"));
            }
        }
        if let Some(check) = self.offline {
            check(&img).unwrap_or_else(|e| panic!("{test}: {e}"));
        }
        eprintln!(
            "ok     {test}: {} files written, checked and fsck-clean ({summary})",
            expect.len()
        );
    }
}

/// The kernel's last log lines about `dev` (a loop device), for a refused
/// mount; empty if the log is unreadable.
fn kernel_log(dev: &Path) -> String {
    let Some(name) = dev
        .file_name()
        .map(|n| format!("({})", n.to_string_lossy()))
    else {
        return String::new();
    };
    let Ok(out) = run(&mut tool("dmesg")) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&name)).collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    if tail.is_empty() {
        return String::new();
    }
    format!("\nkernel log:\n{}", tail.join("\n"))
}

/// A plain ext4 configuration: `ext4kit mkfs -t ext4 OPTS` on a sparse
/// image of `size` bytes.
fn kernel_case(name: &str, conf: &str, size: u64, opts: &[&str]) {
    Case::new(name, conf, size, opts).run();
}

#[test]
fn kernel_default_4k() {
    kernel_case("default (4k)", DEBIAN_CONF, 512 * MIB, &[]);
}

#[test]
fn kernel_blocksize_1024() {
    kernel_case("-b 1024", DEBIAN_CONF, 256 * MIB, &["-b", "1024"]);
}

#[test]
fn kernel_no_metadata_csum() {
    kernel_case(
        "-O ^metadata_csum",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "^metadata_csum"],
    );
}

#[test]
fn kernel_upstream_orphan_file() {
    kernel_case(
        "upstream conf (orphan_file, metadata_csum_seed)",
        UPSTREAM_CONF,
        GIB,
        &[],
    );
}

#[test]
fn kernel_no_journal() {
    kernel_case(
        "-O ^has_journal",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "^has_journal"],
    );
}

/// The feature flags the kernel here supports (no casefold or verity: its
/// ext4 lacks CONFIG_UNICODE and CONFIG_FS_VERITY): inline data files and
/// directories, large directories, xattrs in inodes, the encryption flags.
#[test]
fn kernel_feature_flags() {
    kernel_case(
        "-O inline_data,large_dir,ea_inode,encrypt,stable_inodes",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "inline_data,large_dir,ea_inode,encrypt,stable_inodes"],
    );
}

/// One superblock backup (sparse_super2), a journal with a fast-commit
/// area, multiple mount protection (the kernel's kmmpd updates the MMP
/// block while mounted and leaves it clean).
#[test]
fn kernel_sparse_super2_fast_commit_mmp() {
    kernel_case(
        "-O sparse_super2,fast_commit,mmp -E num_backup_sb=1",
        DEBIAN_CONF,
        512 * MIB,
        &[
            "-O",
            "sparse_super2,fast_commit,mmp",
            "-E",
            "num_backup_sb=1,mmp_update_interval=1",
        ],
    );
}

#[test]
fn kernel_bigalloc() {
    kernel_case(
        "-O bigalloc (64 KiB clusters)",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "bigalloc"],
    );
}

#[test]
fn kernel_bigalloc_1k_blocks() {
    kernel_case(
        "-b 1024 -O bigalloc -C 4096",
        UPSTREAM_CONF,
        256 * MIB,
        &["-b", "1024", "-O", "bigalloc", "-C", "4096"],
    );
}

/// The kernel keeps the usage in the quota files mke2fs-style files start
/// with; e2fsck checks it after the workload.
#[test]
fn kernel_quota_and_project() {
    const TEST: &str = "mkfs_kernel -O quota,project";
    if let Err(why) = kernel_ready() {
        return skip(TEST, &why);
    }
    // A kernel without CONFIG_QUOTA refuses mke2fs's own quota images.
    let probe = (|| -> Result<(), String> {
        let dir = image_dir();
        let img = dir.path().join("quota-probe.img");
        sparse_file(&img, 64 * MIB).map_err(|e| e.to_string())?;
        run_ok(mke2fs(["-F", "-q", "-t", "ext4", "-O", "quota,project"]).arg(&img))?;
        let lo = LoopDev::attach(&img).map_err(|e| e.to_string())?;
        let mnt = Mount::new(lo.path(), "ext4", None).map_err(|_| {
            // The kernel says why (e.g. built without CONFIG_QFMT_V2).
            let log = kernel_log(lo.path());
            let why = log.lines().last().unwrap_or("no CONFIG_QUOTA?");
            format!("the kernel does not mount mke2fs's quota images ({why})")
        })?;
        mnt.unmount()
    })();
    if let Err(why) = probe {
        return skip(TEST, &why);
    }
    kernel_case(
        "-O quota,project",
        UPSTREAM_CONF,
        512 * MIB,
        &["-O", "quota,project"],
    );
}

#[test]
fn kernel_blocksize_2048() {
    kernel_case("-b 2048", DEBIAN_CONF, 256 * MIB, &["-b", "2048"]);
}

/// A block size that is not a power of two: the power of two below it.
#[test]
fn kernel_blocksize_3000() {
    Case::new(
        "-b 3000 (2048-byte blocks)",
        DEBIAN_CONF,
        256 * MIB,
        &["-b", "3000"],
    )
    .offline(&|img| match fs_block_size(img) {
        Some(2048) => Ok(()),
        other => Err(format!("block size {other:?}, not 2048")),
    })
    .run();
}

/// Block sizes above the page size: only kernels with large block size
/// support mount them (the case skips, saying so, when this one refuses
/// mke2fs's image as well).
#[test]
fn kernel_blocksize_65536() {
    // -F: mke2fs asks before making blocks larger than the page size.
    kernel_case("-b 65536", DEBIAN_CONF, 512 * MIB, &["-F", "-b", "65536"]);
}

#[test]
fn kernel_meta_bg() {
    kernel_case(
        "-O meta_bg,^resize_inode",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "meta_bg,^resize_inode"],
    );
}

#[test]
fn kernel_meta_bg_1k_blocks() {
    kernel_case(
        "-b 1024 -O meta_bg,^resize_inode",
        DEBIAN_CONF,
        256 * MIB,
        &["-b", "1024", "-O", "meta_bg,^resize_inode"],
    );
}

#[test]
fn kernel_packed_meta_blocks() {
    kernel_case(
        "-E packed_meta_blocks=1",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "packed_meta_blocks=1"],
    );
}

#[test]
fn kernel_packed_meta_blocks_flex_bg_1() {
    kernel_case(
        "-G 1 -E packed_meta_blocks=1",
        DEBIAN_CONF,
        512 * MIB,
        &["-G", "1", "-E", "packed_meta_blocks=1"],
    );
}

#[test]
fn kernel_no_flex_bg() {
    kernel_case("-O ^flex_bg", DEBIAN_CONF, 512 * MIB, &["-O", "^flex_bg"]);
}

/// Many small groups (`-g`) with a small flex_bg (`-G`).
#[test]
fn kernel_small_groups() {
    kernel_case(
        "-g 4096 -G 4",
        DEBIAN_CONF,
        256 * MIB,
        &["-g", "4096", "-G", "4"],
    );
}

#[test]
fn kernel_no_64bit() {
    kernel_case("-O ^64bit", DEBIAN_CONF, 512 * MIB, &["-O", "^64bit"]);
}

/// ext4 without extents: block-mapped files (64bit needs extents).
#[test]
fn kernel_no_extents() {
    kernel_case(
        "-O ^extent,^64bit",
        DEBIAN_CONF,
        256 * MIB,
        &["-O", "^extent,^64bit"],
    );
}

/// Group descriptor checksums instead of metadata checksums.
#[test]
fn kernel_uninit_bg() {
    kernel_case(
        "-O ^metadata_csum,uninit_bg",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "^metadata_csum,uninit_bg"],
    );
}

#[test]
fn kernel_ext3() {
    Case::new("-t ext3", DEBIAN_CONF, 256 * MIB, &[])
        .fs_type("ext3")
        .run();
}

#[test]
fn kernel_ext2() {
    Case::new("-t ext2", DEBIAN_CONF, 256 * MIB, &[])
        .fs_type("ext2")
        .run();
}

/// Revision 0: no features, 128-byte inodes, no reserved inode range.
#[test]
fn kernel_revision_0() {
    Case::new("-t ext2 -r 0", DEBIAN_CONF, 256 * MIB, &["-r", "0"])
        .fs_type("ext2")
        .run();
}

/// The Hurd's layout (translator field, no filetype), mounted as ext2.
#[test]
fn kernel_hurd() {
    Case::new("-t ext2 -o hurd", DEBIAN_CONF, 256 * MIB, &["-o", "hurd"])
        .fs_type("ext2")
        .run();
}

#[test]
fn kernel_inode_size_128() {
    kernel_case("-I 128", DEBIAN_CONF, 256 * MIB, &["-I", "128"]);
}

#[test]
fn kernel_inode_size_1024() {
    kernel_case("-I 1024", DEBIAN_CONF, 256 * MIB, &["-I", "1024"]);
}

/// Few inodes (the workload needs about 4000).
#[test]
fn kernel_few_inodes() {
    kernel_case("-N 4500", DEBIAN_CONF, 512 * MIB, &["-N", "4500"]);
}

/// One inode per MiB: the image is large (sparse) so that the workload's
/// inodes fit.
#[test]
fn kernel_largefile() {
    kernel_case("-T largefile", DEBIAN_CONF, 6 * GIB, &["-T", "largefile"]);
}

/// Reserved descriptor blocks for growth to 64 GiB.
#[test]
fn kernel_resize_limit() {
    kernel_case(
        "-E resize=16777216",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "resize=16777216"],
    );
}

#[test]
fn kernel_raid_stride() {
    kernel_case(
        "-E stride=16,stripe_width=64",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "stride=16,stripe_width=64"],
    );
}

#[test]
fn kernel_desc_size_128() {
    kernel_case(
        "-E desc_size=128",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "desc_size=128"],
    );
}

/// A backup superblock in every group (`-s 0`, the deprecated spelling of
/// `-O ^sparse_super`). Reserved descriptor blocks need sparse_super
/// (mke2fs refuses them without), so resize_inode goes too.
#[test]
fn kernel_no_sparse_super() {
    kernel_case(
        "-s 0 -O ^resize_inode",
        DEBIAN_CONF,
        256 * MIB,
        &["-s", "0", "-O", "^resize_inode"],
    );
}

#[test]
fn kernel_no_sparse_super_feature() {
    kernel_case(
        "-b 1024 -O ^sparse_super,^resize_inode",
        DEBIAN_CONF,
        128 * MIB,
        &["-b", "1024", "-O", "^sparse_super,^resize_inode"],
    );
}

/// Inode tables left for the kernel's lazy init thread to zero.
#[test]
fn kernel_lazy_itable_init() {
    kernel_case(
        "-E lazy_itable_init=1",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "lazy_itable_init=1"],
    );
}

/// The smallest journal (1024 blocks).
#[test]
fn kernel_small_journal() {
    kernel_case("-J size=4", DEBIAN_CONF, 256 * MIB, &["-J", "size=4"]);
}

/// The orphan file with 1 KiB blocks (the workload leaves an orphan).
#[test]
fn kernel_orphan_file_1k_blocks() {
    kernel_case(
        "upstream conf -b 1024 (orphan_file)",
        UPSTREAM_CONF,
        256 * MIB,
        &["-b", "1024"],
    );
}

/// mkfs on a loop device with 4096-byte logical sectors: the sector size
/// raises the (1 KiB "small") block size to 4096, and discard works on a
/// loop device.
#[test]
fn kernel_4k_sector_device() {
    Case::new(
        "loop device with 4k sectors",
        DEBIAN_CONF,
        256 * MIB,
        &["-E", "discard"],
    )
    .on_loop_device(4096)
    .offline(&|img| match fs_block_size(img) {
        Some(4096) => Ok(()),
        other => Err(format!("block size {other:?}, not 4096")),
    })
    .run();
}

/// Linear directories without file types in the entries.
#[test]
fn kernel_no_dir_index_no_filetype() {
    kernel_case(
        "-O ^dir_index,^filetype",
        DEBIAN_CONF,
        256 * MIB,
        &["-O", "^dir_index,^filetype"],
    );
}

/// ext4 with the optional inode features off.
#[test]
fn kernel_minimal_ext4() {
    kernel_case(
        "-O ^huge_file,^dir_nlink,^extra_isize,^resize_inode",
        DEBIAN_CONF,
        512 * MIB,
        &["-O", "^huge_file,^dir_nlink,^extra_isize,^resize_inode"],
    );
}

/// sparse_super2 without any backup superblock.
#[test]
fn kernel_sparse_super2_no_backups() {
    kernel_case(
        "-O sparse_super2 -E num_backup_sb=0",
        DEBIAN_CONF,
        256 * MIB,
        &["-O", "sparse_super2", "-E", "num_backup_sb=0"],
    );
}

/// Neither the journal nor the inode tables zeroed (the storage is said
/// to read as zeros): the kernel's lazy init thread and journal cope.
#[test]
fn kernel_lazy_journal_prezeroed() {
    kernel_case(
        "-E lazy_journal_init=1,assume_storage_prezeroed=1",
        DEBIAN_CONF,
        512 * MIB,
        &["-E", "lazy_journal_init=1,assume_storage_prezeroed=1"],
    );
}

/// As many inodes as 1 KiB blocks allow with 128-byte inodes.
#[test]
fn kernel_dense_inodes() {
    kernel_case(
        "-b 1024 -i 1024 -I 128",
        DEBIAN_CONF,
        128 * MIB,
        &["-b", "1024", "-i", "1024", "-I", "128"],
    );
}

/// Does this kernel's ext4 list `feature` in /sys/fs/ext4/features?
/// (Features it only has with an optional config, e.g. casefold with
/// CONFIG_UNICODE.) `Err` says why not.
fn ext4_sysfs_feature(feature: &str, config: &str) -> Result<(), String> {
    let dir = Path::new("/sys/fs/ext4/features");
    if !dir.is_dir() {
        return Err("/sys/fs/ext4/features is missing".into());
    }
    if dir.join(feature).exists() {
        Ok(())
    } else {
        Err(format!(
            "this kernel's ext4 has no {feature} (not in /sys/fs/ext4/features: built without {config})"
        ))
    }
}

#[test]
fn kernel_casefold() {
    if let Err(why) = ext4_sysfs_feature("casefold", "CONFIG_UNICODE") {
        return skip("mkfs_kernel -O casefold", &why);
    }
    kernel_case("-O casefold", DEBIAN_CONF, 256 * MIB, &["-O", "casefold"]);
}

#[test]
fn kernel_verity() {
    if let Err(why) = ext4_sysfs_feature("verity", "CONFIG_FS_VERITY") {
        return skip("mkfs_kernel -O verity", &why);
    }
    kernel_case("-O verity", DEBIAN_CONF, 256 * MIB, &["-O", "verity"]);
}

/// `-E offset=`: the filesystem starts 1 MiB + 512 bytes into the image,
/// which has data before it and after it; the loop devices start at the
/// offset, and neither the mkfs nor the kernel touches the bytes around
/// the filesystem.
#[test]
fn kernel_offset() {
    const OFFSET: u64 = MIB + 512;
    const FS: u64 = 256 * MIB;
    let around = |img: &Path| -> Result<(), String> {
        let f = fs::File::open(img).map_err(|e| e.to_string())?;
        use std::os::unix::fs::FileExt;
        let mut head = vec![0u8; OFFSET as usize];
        let mut tail = vec![0u8; MIB as usize];
        f.read_exact_at(&mut head, 0).map_err(|e| e.to_string())?;
        f.read_exact_at(&mut tail, OFFSET + FS)
            .map_err(|e| e.to_string())?;
        if head != pattern(head.len(), 11) {
            return Err("the bytes before the offset changed".into());
        }
        if tail != pattern(tail.len(), 12) {
            return Err("the bytes after the filesystem changed".into());
        }
        Ok(())
    };
    let opt = format!("offset={OFFSET}");
    Case::new(
        "-E offset=1049088 (256M)",
        DEBIAN_CONF,
        OFFSET + FS + MIB,
        &["-E", &opt],
    )
    .at_offset(OFFSET, "256M")
    .before(&|img: &Path| {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(img)
            .map_err(|e| e.to_string())?;
        f.write_all_at(&pattern(OFFSET as usize, 11), 0)
            .and_then(|()| f.write_all_at(&pattern(MIB as usize, 12), OFFSET + FS))
            .map_err(|e| e.to_string())
    })
    .offline(&around)
    .run();
}

/// `-l FILE`: the listed blocks go to the bad block inode (inode 1); the
/// kernel allocates none of them, and they are still listed afterwards.
#[test]
fn kernel_bad_blocks() {
    const BAD: [u64; 6] = [40000, 40001, 40002, 50000, 60001, 65000];
    let list_dir = image_dir();
    let list = list_dir.path().join("badblocks.txt");
    let text: String = BAD.iter().map(|b| format!("{b}\n")).collect();
    fs::write(&list, text).unwrap();
    let list = list.display().to_string();
    Case::new(
        "-l BADBLOCKS (6 blocks)",
        DEBIAN_CONF,
        256 * MIB,
        &["-l", &list],
    )
    .offline(&|img| {
        let out = run_ok(tool("dumpe2fs").arg("-b").arg(img))?;
        let got: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if got == BAD {
            Ok(())
        } else {
            Err(format!("dumpe2fs -b lists {got:?}, not {BAD:?}"))
        }
    })
    .run();
}

/// mke2fs.conf's huge files (`make_hugefiles`): three 20 MiB files in
/// /huge, zero-filled, which the kernel reads before and after the
/// workload.
#[test]
fn kernel_hugefiles() {
    const SIZE: u64 = 20 * MIB;
    let conf = format!(
        "{DEBIAN_CONF}\thugefiles = {{
\t\tmake_hugefiles = true
\t\thugefiles_dir = /huge
\t\thugefiles_name = chunk
\t\thugefiles_digits = 2
\t\tnum_hugefiles = 3
\t\thugefiles_size = 20M
\t}}
"
    );
    Case::new(
        "-T hugefiles (make_hugefiles, 3 x 20M)",
        &conf,
        512 * MIB,
        &["-T", "hugefiles"],
    )
    .mounted(&|root| {
        let mut names = Vec::new();
        for e in fs::read_dir(root.join("huge")).map_err(|e| format!("/huge: {e}"))? {
            let e = e.map_err(|e| e.to_string())?;
            let data = fs::read(e.path()).map_err(|err| format!("{:?}: {err}", e.path()))?;
            if data.len() as u64 != SIZE || data.iter().any(|&b| b != 0) {
                return Err(format!(
                    "{:?}: {} bytes, not {SIZE} zero bytes",
                    e.path(),
                    data.len()
                ));
            }
            names.push(e.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        if names == ["chunk00", "chunk01", "chunk02"] {
            Ok(())
        } else {
            Err(format!("/huge holds {names:?}"))
        }
    })
    .run();
}

const CAP_SYS_RESOURCE: u32 = 24;

/// Is capability number `cap` in this process's effective set (from
/// /proc/self/status)?
fn has_capability(cap: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_string();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|set| set >> cap & 1 == 1)
}

/// The block count in an ext2/3/4 superblock (64-bit aware).
fn fs_block_count(img: &Path) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let f = fs::File::open(img).ok()?;
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, 1024).ok()?;
    let le32 = |o: usize| u64::from(u32::from_le_bytes([sb[o], sb[o + 1], sb[o + 2], sb[o + 3]]));
    let incompat_64bit = le32(0x60) & 0x80 != 0;
    let hi = if incompat_64bit { le32(0x150) } else { 0 };
    Some(hi << 32 | le32(4))
}

/// Online growth: the kernel mounts the filesystem ext4kit made, takes
/// the workload, and grows it from `size` to `grown` bytes while mounted
/// (resize2fs on a mounted filesystem only asks the kernel, which uses
/// the reserved descriptor blocks, or meta_bg); then a second workload in
/// the grown filesystem, e2fsck clean, and both read back.
fn online_resize_case(name: &str, size: u64, grown: u64, opts: &[&str]) {
    let test = format!("mkfs_kernel online resize {name}");
    if let Err(why) = kernel_ready() {
        return skip(&test, &why);
    }
    if !have("resize2fs") {
        return skip(&test, "resize2fs not found");
    }
    // The kernel's resize ioctls need CAP_SYS_RESOURCE, which a root in
    // a container may lack.
    if !has_capability(CAP_SYS_RESOURCE) {
        return skip(
            &test,
            "no CAP_SYS_RESOURCE (the kernel refuses online resizing)",
        );
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    fs::write(&conf, DEBIAN_CONF).unwrap();
    let img = dir.path().join("grow.img");
    sparse_file(&img, size).unwrap();
    run_ok(
        ext4kit_mkfs(["-q", "-t", "ext4"])
            .args(opts)
            .arg(&img)
            .env("MKE2FS_CONFIG", &conf),
    )
    .unwrap();
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{test}: fresh image: {e}"));
    let bs = fs_block_size(&img).unwrap();
    let (first, second) = {
        let lo = LoopDev::attach(&img).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", None)
            .unwrap_or_else(|e| panic!("{test}: the kernel refuses to mount it: {e}"));
        let first = populate(mnt.path()).unwrap_or_else(|e| panic!("{test}: writing: {e}"));
        fs::OpenOptions::new()
            .write(true)
            .open(&img)
            .and_then(|f| f.set_len(grown))
            .unwrap();
        run_ok(tool("losetup").arg("-c").arg(lo.path())).unwrap();
        run_ok(tool("resize2fs").arg(lo.path()))
            .unwrap_or_else(|e| panic!("{test}: the kernel does not grow it: {e}"));
        let root2 = mnt.path().join("after-growth");
        fs::create_dir(&root2).unwrap();
        let second =
            populate(&root2).unwrap_or_else(|e| panic!("{test}: writing after growth: {e}"));
        run_ok(tool("sync").arg("-f").arg(mnt.path())).unwrap();
        mnt.unmount().unwrap();
        (first, second)
    };
    let summary =
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{test}: after the kernel grew it: {e}"));
    assert_eq!(
        fs_block_count(&img),
        Some(grown / bs),
        "{test}: block count after growth"
    );
    let lo = LoopDev::attach(&img).unwrap();
    let mnt = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    verify(mnt.path(), &first).unwrap_or_else(|e| panic!("{test}: {e}"));
    verify(&mnt.path().join("after-growth"), &second).unwrap_or_else(|e| panic!("{test}: {e}"));
    eprintln!(
        "ok     {test}: grown to {} blocks, {} files ({summary})",
        grown / bs,
        first.len() + second.len()
    );
}

/// The reserved descriptor blocks (resize_inode) ext4kit sets aside:
/// from 4 groups to 128 (two descriptor blocks).
#[test]
fn kernel_online_resize() {
    online_resize_case("(resize_inode, 4k)", 512 * MIB, 16 * GIB, &["-b", "4096"]);
}

/// Up to the `-E resize=` limit exactly: 1 KiB blocks, from 16 groups
/// (one descriptor block) to 128 (eight).
#[test]
fn kernel_online_resize_to_limit() {
    online_resize_case(
        "(-b 1024 -E resize=1048576, to the limit)",
        128 * MIB,
        GIB,
        &["-b", "1024", "-E", "resize=1048576"],
    );
}

/// meta_bg: the kernel adds descriptor blocks in the new groups.
#[test]
fn kernel_online_resize_meta_bg() {
    online_resize_case(
        "(-O meta_bg,^resize_inode, 4k)",
        512 * MIB,
        16 * GIB,
        &["-b", "4096", "-O", "meta_bg,^resize_inode"],
    );
}

/// On a block device (a loop device over a sparse file) ext4kit writes the
/// same bytes as mke2fs does on a twin device, but allocates far less in
/// the backing file: where mke2fs writes zeros (journal), ext4kit punches.
#[test]
fn block_device_format_matches_mke2fs_and_stays_thin() {
    const TEST: &str = "block_device_format_matches_mke2fs_and_stays_thin";
    if let Err(why) = kernel_ready() {
        return skip(TEST, &why);
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    fs::write(&conf, DEBIAN_CONF).unwrap();
    let (ref_img, our_img) = (dir.path().join("ref.img"), dir.path().join("ours.img"));
    sparse_file(&ref_img, 2 * GIB).unwrap();
    sparse_file(&our_img, 2 * GIB).unwrap();
    let uuid = "0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09";
    let eopt = "hash_seed=7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60";
    let args = ["-F", "-q", "-t", "ext4", "-U", uuid, "-E", eopt];
    {
        let a = LoopDev::attach(&ref_img).unwrap();
        let b = LoopDev::attach(&our_img).unwrap();
        run_ok(
            mke2fs(args)
                .arg(a.path())
                .env("MKE2FS_CONFIG", &conf)
                .env("E2FSPROGS_FAKE_TIME", "1700000000"),
        )
        .unwrap();
        run_ok(
            ext4kit_mkfs(args)
                .arg(b.path())
                .env("MKE2FS_CONFIG", &conf)
                .env("E2FSPROGS_FAKE_TIME", "1700000000"),
        )
        .unwrap();
    }
    sparse_equal(&ref_img, &our_img).unwrap();
    e2fsck_clean(&our_img).unwrap();
    use std::os::unix::fs::MetadataExt;
    let (r, o) = (
        fs::metadata(&ref_img).unwrap().blocks(),
        fs::metadata(&our_img).unwrap().blocks(),
    );
    assert!(o < r, "ours allocates {o} sectors, mke2fs {r}");
}

/// `-O journal_dev` and `-J device=`: ext4kit makes a journal device on
/// one loop device and a filesystem using it on another; the kernel mounts
/// the filesystem with `journal_path=` and runs the workload, e2fsck
/// (given the journal) finds it clean, a read-only mount reads it back.
/// ext4kit's read side (info, ls, cat) opens such a filesystem, and so
/// does offline lazyinit (it never needs the journal); the read-write
/// tools refuse it without `--journal-path` with one line naming the
/// option and write nothing, and write it with the option.
#[test]
fn kernel_external_journal() {
    const TEST: &str = "mkfs_kernel external journal";
    if let Err(why) = kernel_ready() {
        return skip(TEST, &why);
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    fs::write(&conf, DEBIAN_CONF).unwrap();
    let (jimg, img) = (dir.path().join("journal.img"), dir.path().join("fs.img"));
    sparse_file(&jimg, 64 * MIB).unwrap();
    sparse_file(&img, 512 * MIB).unwrap();
    let jlo = LoopDev::attach(&jimg).unwrap();
    run_ok(
        ext4kit_mkfs(["-q", "-t", "ext4", "-b", "4096", "-O", "journal_dev"])
            .arg(jlo.path())
            .env("MKE2FS_CONFIG", &conf),
    )
    .unwrap();
    let jpath = jlo.path().display().to_string();
    run_ok(
        ext4kit_mkfs(["-q", "-t", "ext4", "-J", &format!("device={jpath}")])
            .args(["-E", "lazy_itable_init=1,nodiscard"])
            .arg(&img)
            .env("MKE2FS_CONFIG", &conf),
    )
    .unwrap();
    e2fsck_clean_with(&img, &["-j", &jpath]).unwrap_or_else(|e| panic!("{TEST}: fresh: {e}"));
    // Offline lazy init needs no journal: it works on such filesystems.
    run_ok(ext4kit().args(["lazyinit", "-q", "--mult", "0"]).arg(&img)).unwrap();
    let info = run_ok(ext4kit().arg("info").arg(&img)).unwrap();
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    assert!(info.contains("lazy init:           0 of"), "{info}");
    e2fsck_clean_with(&img, &["-j", &jpath]).unwrap_or_else(|e| panic!("{TEST}: lazyinit: {e}"));
    let jopt = format!("journal_path={jpath}");
    let expect = {
        let lo = LoopDev::attach(&img).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", Some(&jopt))
            .unwrap_or_else(|e| panic!("{TEST}: the kernel refuses to mount it: {e}"));
        let expect = populate(mnt.path()).unwrap_or_else(|e| panic!("{TEST}: writing: {e}"));
        run_ok(tool("sync").arg("-f").arg(mnt.path())).unwrap();
        mnt.unmount().unwrap();
        expect
    };
    let summary = e2fsck_clean_with(&img, &["-j", &jpath])
        .unwrap_or_else(|e| panic!("{TEST}: after the kernel wrote to it: {e}"));
    assert!(
        used_inodes(&summary).unwrap_or(0) as usize > expect.len(),
        "{summary}"
    );
    {
        let lo = LoopDev::attach(&img).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", Some(&format!("ro,{jopt}"))).unwrap();
        verify(mnt.path(), &expect).unwrap_or_else(|e| panic!("{TEST}: {e}"));
    }
    // The read side.
    let info = run_ok(ext4kit().arg("info").arg(&img)).unwrap();
    assert!(String::from_utf8_lossy(&info.stdout).contains("external"));
    let cat = run_ok(
        ext4kit()
            .arg("cat")
            .arg(format!("{}:/dir02/file02.dat", img.display())),
    )
    .unwrap();
    assert_eq!(cat.stdout, expect[Path::new("dir02/file02.dat")]);
    // The read-write tools refuse it.
    let before = file_hash(&img).unwrap();
    let out = run(ext4kit()
        .arg("mkdir")
        .arg(format!("{}:/new", img.display())))
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "mkdir on an external-journal filesystem succeeded"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("journal_path"), "{err}");
    assert_eq!(file_hash(&img).unwrap(), before, "the refused mkdir wrote");
    drop(jlo);
    run_ok(
        ext4kit()
            .args(["--journal-path", &jimg.display().to_string(), "mkdir"])
            .arg(format!("{}:/new", img.display())),
    )
    .unwrap();
    e2fsck_clean_with(&img, &["-j", &jimg.display().to_string()])
        .unwrap_or_else(|e| panic!("{TEST}: after ext4kit mkdir: {e}"));
    eprintln!("ok     {TEST}: {} files ({summary})", expect.len());
}
