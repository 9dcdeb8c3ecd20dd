//! Filesystems made by `ext4kit mkfs` under a real kernel: attach the image
//! to a loop device, mount it as ext4, write a few thousand files and
//! directories, unmount, and demand a clean `e2fsck -fn`; then mount it
//! again read-only and check that everything reads back.
//!
//! Needs root, loop devices and an ext4-capable kernel; otherwise every test
//! prints why it skips. Loop devices and mounts are always released (RAII
//! guards, also on panic).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
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

fn kernel_case(name: &str, conf: &str, size: u64, opts: &[&str]) {
    let test = format!("mkfs_kernel {name}");
    if let Err(why) = kernel_ready() {
        return skip(&test, &why);
    }
    let dir = image_dir();
    let conf_path = dir.path().join("mke2fs.conf");
    fs::write(&conf_path, conf).unwrap();
    let img = dir.path().join("kernel.img");
    sparse_file(&img, size).unwrap();
    run_ok(
        ext4kit_mkfs(["-q", "-t", "ext4"])
            .args(opts)
            .arg(&img)
            .env("MKE2FS_CONFIG", &conf_path),
    )
    .unwrap();
    e2fsck_clean(&img).unwrap_or_else(|e| panic!("{test}: fresh image: {e}"));

    let expect = {
        let lo = LoopDev::attach(&img).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", None)
            .unwrap_or_else(|e| panic!("{test}: the kernel refuses to mount it: {e}"));
        let expect = populate(mnt.path()).unwrap_or_else(|e| panic!("{test}: writing: {e}"));
        run_ok(tool("sync").arg("-f").arg(mnt.path())).unwrap();
        mnt.unmount().unwrap();
        expect
        // `lo` is detached here.
    };
    let summary =
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{test}: after the kernel wrote to it: {e}"));
    // The files did land in this filesystem (not in the mount point).
    let used = used_inodes(&summary).unwrap_or(0);
    assert!(
        used as usize > expect.len(),
        "{test}: only {used} inodes in use after writing {} files: {summary}",
        expect.len()
    );

    let lo = LoopDev::attach(&img).unwrap();
    let mnt = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    verify(mnt.path(), &expect).unwrap_or_else(|e| panic!("{test}: {e}"));
    eprintln!(
        "ok     {test}: {} files written, checked and fsck-clean ({summary})",
        expect.len()
    );
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
        let mnt = Mount::new(lo.path(), "ext4", None)
            .map_err(|_| "the kernel does not mount mke2fs's quota images (no CONFIG_QUOTA?)")?;
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
/// tools refuse it with one line naming the external journal and write
/// nothing.
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
    assert!(err.contains("external journal"), "{err}");
    assert_eq!(file_hash(&img).unwrap(), before, "the refused mkdir wrote");
    eprintln!("ok     {TEST}: {} files ({summary})", expect.len());
}
