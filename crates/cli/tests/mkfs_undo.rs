//! `ext4kit mkfs -z UNDO-FILE` and mke2fs's automatic undo file: formats
//! over an old filesystem with files in it, `e2undo` (e2fsprogs 1.47) puts
//! the old bytes back exactly; the undo file compared with mke2fs's for the
//! same run; an interrupted format whose undo file still restores; the
//! E2FSPROGS_UNDO_DIR / undo_dir knobs and the refusals.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use ext4kit::mkfs::{self, Env, MkfsOptions};
use ext4kit::profile::Profile;
use ext4kit::undo::{UndoDevice, UndoFile, UndoParams};
use ext4kit_device::{Device, FaultControl, FaultDevice, FileDevice, OpenOptions};

const TEST_FILES: [(&str, usize, u64); 3] = [
    ("small", 3000, 1),
    ("medium", 300_000, 2),
    ("big", 2_500_000, 3),
];

fn tools() -> Result<(), String> {
    for t in ["mke2fs", "e2fsck", "e2undo", "debugfs"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    Ok(())
}

/// An old ext4 image (mke2fs with `args`) holding [`TEST_FILES`].
fn old_image(dir: &Path, name: &str, size: &str, args: &[&str]) -> PathBuf {
    let img = mkimg(dir, name, size, args);
    for (f, len, seed) in TEST_FILES {
        let src = dir.join(format!("{name}.{f}"));
        std::fs::write(&src, pattern(len, seed)).unwrap();
        run_ok(
            tool("debugfs")
                .arg("-w")
                .arg("-R")
                .arg(format!("write {} {f}", src.display()))
                .arg(&img),
        )
        .unwrap();
    }
    check_files(&img);
    img
}

/// The files of [`old_image`] read back with debugfs.
fn check_files(img: &Path) {
    for (f, len, seed) in TEST_FILES {
        let out = run_ok(tool("debugfs").arg("-R").arg(format!("cat {f}")).arg(img)).unwrap();
        assert!(out.stdout == pattern(len, seed), "{f} differs in {img:?}");
    }
}

fn copy_of(img: &Path, name: &str) -> PathBuf {
    let c = img.with_file_name(name);
    let _ = std::fs::remove_file(&c);
    sparse_copy(img, &c);
    c
}

fn e2undo(undo: &Path, img: &Path) -> std::process::Output {
    run_ok(tool("e2undo").arg(undo).arg(img)).unwrap()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exit status non-zero, one line on stderr; the line.
fn one_line_error(o: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "succeeded: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {err:?}");
    lines[0].to_string()
}

/// Format over an old filesystem with other parameters, undo, get the
/// old bytes back: 4 KiB blocks over 1 KiB ones and the reverse (with the
/// inode tables zeroed), and the new filesystem is clean in between.
#[test]
fn e2undo_restores_the_old_filesystem() {
    const TEST: &str = "e2undo_restores_the_old_filesystem";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let cases: [(&[&str], &[&str]); 2] = [
        (
            &["-b", "1024"],
            &["-b", "4096", "-N", "2000", "-O", "^metadata_csum"],
        ),
        (
            &["-b", "4096", "-O", "^has_journal"],
            &["-b", "1024", "-E", "lazy_itable_init=0", "-J", "size=2"],
        ),
    ];
    for (i, (old_args, new_args)) in cases.iter().enumerate() {
        let img = old_image(dir.path(), &format!("r{i}.img"), "48M", old_args);
        let orig = copy_of(&img, &format!("r{i}.orig"));
        let undo = dir.path().join(format!("r{i}.e2undo"));
        let out = run_ok(
            ext4kit_mkfs(["-q", "-F", "-t", "ext4"])
                .args(*new_args)
                .arg("-z")
                .arg(&undo)
                .arg(&img),
        )
        .unwrap();
        assert_eq!(
            stdout(&out),
            format!(
                "Overwriting existing filesystem; this can be undone using the command:\n    e2undo {} {}\n\n",
                undo.display(),
                img.display()
            )
        );
        e2fsck_clean(&img).unwrap();
        assert!(
            sparse_equal(&img, &orig).is_err(),
            "case {i}: nothing changed"
        );
        e2undo(&undo, &img);
        sparse_equal(&img, &orig).unwrap_or_else(|e| panic!("case {i}: {e}"));
        e2fsck_clean(&img).unwrap();
        check_files(&img);
    }
}

/// `-E offset=`: the undo file records the offset (compat flag), e2undo
/// finds the filesystem there by itself, the bytes before it stay.
#[test]
fn e2undo_restores_with_offset() {
    const TEST: &str = "e2undo_restores_with_offset";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let img = dir.path().join("off.img");
    let off = 1_048_576u64;
    // A "partition table" of random bytes, then a filesystem at 1 MiB.
    std::fs::write(&img, pattern(off as usize, 9)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(off + 40 * MIB)
        .unwrap();
    run_ok(
        mke2fs(["-q", "-F", "-t", "ext4", "-b", "4096"])
            .arg("-E")
            .arg(format!("offset={off}"))
            .arg(&img)
            .arg("40M"),
    )
    .unwrap();
    let orig = copy_of(&img, "off.orig");
    let undo = dir.path().join("off.e2undo");
    run_ok(
        ext4kit_mkfs(["-q", "-F", "-t", "ext4", "-b", "1024", "-z"])
            .arg(&undo)
            .arg("-E")
            .arg(format!("offset={off}"))
            .arg(&img)
            .arg("32M"),
    )
    .unwrap();
    let f = parse_undo(&undo);
    assert_eq!((f.compat & 1, f.fs_offset), (1, off));
    assert!(
        f.blocks.keys().all(|&b| b >= off),
        "saved before the offset"
    );
    e2undo(&undo, &img);
    sparse_equal(&img, &orig).unwrap();
}

fn read_range(p: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; len];
    std::fs::File::open(p)
        .unwrap()
        .read_exact_at(&mut v, off)
        .unwrap();
    v
}

/// An undo file as e2undo reads it: header fields and every saved undo
/// block by its byte position on the target (extended keys split).
struct Parsed {
    block_size: u32,
    fs_block_size: u32,
    state: u32,
    compat: u32,
    fs_offset: u64,
    superblock: Vec<u8>,
    blocks: BTreeMap<u64, Vec<u8>>,
}

fn parse_undo(path: &Path) -> Parsed {
    let f = std::fs::read(path).unwrap();
    let u32_at = |at: usize| u32::from_le_bytes(f[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(f[at..at + 8].try_into().unwrap());
    assert_eq!(&f[..8], b"E2UNDO02");
    let (n, sb_blk, key_blk) = (u64_at(8), u64_at(16) as usize, u64_at(24) as usize);
    let (tdb, fsbs) = (u32_at(32) as usize, u32_at(36));
    let fs_offset = u64_at(64);
    let kpb = (tdb / 16 - 1) as u64;
    let mut blocks = BTreeMap::new();
    let mut lblk = key_blk;
    let mut i = 0;
    while i < n {
        let kb = &f[lblk * tdb..(lblk + 1) * tdb];
        assert_eq!(u32::from_le_bytes(kb[..4].try_into().unwrap()), 0xCADE_CADE);
        lblk += 1;
        for j in 0..(n - i).min(kpb) as usize {
            let at = 16 + 16 * j;
            let fsblk = u64::from_le_bytes(kb[at..at + 8].try_into().unwrap());
            let size = u32::from_le_bytes(kb[at + 12..at + 16].try_into().unwrap()) as usize;
            let data = &f[lblk * tdb..lblk * tdb + size];
            for (c, chunk) in data.chunks(tdb).enumerate() {
                let pos = fs_offset + fsblk * u64::from(fsbs) + (c * tdb) as u64;
                assert!(blocks.insert(pos, chunk.to_vec()).is_none(), "saved twice");
            }
            lblk += size.div_ceil(tdb);
        }
        i += kpb;
    }
    Parsed {
        block_size: tdb as u32,
        fs_block_size: fsbs,
        state: u32_at(44),
        compat: u32_at(48),
        fs_offset,
        superblock: f[sb_blk * tdb..sb_blk * tdb + 1024].to_vec(),
        blocks,
    }
}

/// The same format by mke2fs -z and ext4kit mkfs -z over copies of one
/// old image: the same stdout, the same new filesystem, undo files with
/// the same header and superblock copy; every block ext4kit saved mke2fs
/// saved with the same bytes, and the blocks only mke2fs saved read as
/// zero in the old image (ext4kit skips zeroing what is a hole already).
#[test]
fn undo_file_matches_mke2fs() {
    const TEST: &str = "undo_file_matches_mke2fs";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    for (i, (old_args, new_args, ext)) in [
        (&["-b", "4096"][..], &["-b", "1024"][..], ""),
        (
            &["-b", "1024"][..],
            &["-b", "4096"][..],
            "lazy_itable_init=0,",
        ),
    ]
    .iter()
    .enumerate()
    {
        let old = old_image(dir.path(), &format!("m{i}.img"), "40M", old_args);
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        for d in [&a, &b] {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir(d).unwrap();
            sparse_copy(&old, &d.join("t.img"));
        }
        let args = |c: &mut Command, d: &Path| {
            c.args(["-q", "-F", "-t", "ext4", "-U", UUID, "-E"])
                .arg(format!("{ext}hash_seed={SEED}"))
                .args(new_args.iter())
                .args(["-z", "u.e2undo", "t.img"])
                .current_dir(d)
                .env("MKE2FS_CONFIG", &conf)
                .env("E2FSPROGS_FAKE_TIME", FAKE_TIME);
        };
        let mut m = mke2fs(Vec::<&str>::new());
        args(&mut m, &a);
        let mut k = ext4kit_mkfs(Vec::<&str>::new());
        args(&mut k, &b);
        let (om, ok) = (run_ok(&mut m).unwrap(), run_ok(&mut k).unwrap());
        assert_eq!(stdout(&ok), stdout(&om), "case {i}");
        let (ia, ib) = (a.join("t.img"), b.join("t.img"));
        // mke2fs -z's zap_sector(2, 6) cannot set 512-byte blocks on the
        // undo channel and zeroes 3 KiB at block 2 instead of bytes
        // 1024..4096: with 4 KiB blocks the old bytes 2048..4096 stay.
        // ext4kit zeroes them, as mke2fs does without -z. The rest is equal.
        let tail = |p: &Path| read_range(p, 2048, 2048);
        if tail(&ia) != tail(&ib) {
            assert_eq!(tail(&ia), tail(&old), "case {i}: mke2fs's bytes 2048..4096");
            assert!(tail(&ib).iter().all(|&x| x == 0), "case {i}: ext4kit's");
            let f = std::fs::OpenOptions::new().write(true).open(&ib).unwrap();
            use std::os::unix::fs::FileExt;
            f.write_all_at(&tail(&ia), 2048).unwrap();
        }
        sparse_equal(&ib, &ia).unwrap_or_else(|e| panic!("case {i}: new images: {e}"));
        let (ua, ub) = (
            parse_undo(&a.join("u.e2undo")),
            parse_undo(&b.join("u.e2undo")),
        );
        assert_eq!(
            (
                ub.block_size,
                ub.fs_block_size,
                ub.state,
                ub.compat,
                ub.fs_offset
            ),
            (
                ua.block_size,
                ua.fs_block_size,
                ua.state,
                ua.compat,
                ua.fs_offset
            ),
            "case {i}: headers"
        );
        assert!(
            ub.superblock == ua.superblock,
            "case {i}: superblock copies"
        );
        for (pos, data) in &ub.blocks {
            match ua.blocks.get(pos) {
                Some(d) => assert!(d == data, "case {i}: block at {pos} differs"),
                None => panic!("case {i}: only ext4kit saved the block at {pos}"),
            }
        }
        let only_mke2fs: Vec<u64> = ua
            .blocks
            .iter()
            .filter(|(pos, _)| !ub.blocks.contains_key(pos))
            .map(|(pos, d)| {
                assert!(
                    d.iter().all(|&x| x == 0),
                    "case {i}: mke2fs saved data at {pos} that ext4kit left"
                );
                *pos
            })
            .collect();
        eprintln!(
            "case {i}: {} undo blocks saved by both, {} (zero) by mke2fs only",
            ub.blocks.len(),
            only_mke2fs.len()
        );
        for (d, u) in [(&a, "u.e2undo"), (&b, "u.e2undo")] {
            e2undo(&d.join(u), &d.join("t.img"));
            sparse_equal(&d.join("t.img"), &old).unwrap();
        }
    }
}

/// mkfs stopped after its N-th device operation (every further one
/// fails; what it had issued reaches the disk, as after a kill): the
/// unfinished undo file still restores everything but the primary
/// superblock's state, which e2undo marks not clean ("Incomplete undo
/// record"); e2fsck finds the old filesystem clean with its files.
#[test]
fn interrupted_mkfs_undo_file_restores() {
    const TEST: &str = "interrupted_mkfs_undo_file_restores";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let size = 24 * MIB;
    let old = old_image(dir.path(), "old.img", "24M", &["-b", "1024"]);
    let old_bytes = std::fs::read(&old).unwrap();
    let opts = MkfsOptions {
        fs_type: Some("ext4".into()),
        block_size: Some(4096),
        uuid: Some(UUID.into()),
        extended: vec![format!("nodiscard,lazy_itable_init=0,hash_seed={SEED}")],
        ..MkfsOptions::default()
    };
    let env = Env {
        device_size: Some(size),
        is_regular_file: true,
        logical_sector_size: 0,
        physical_sector_size: 0,
        io_hints: None,
        now: 1_700_000_000,
        page_size: 4096,
        uid: 0,
        gid: 0,
        kernel_lazy_itable_init: true,
    };
    let resolved = mkfs::resolve(&opts, &Profile::parse(DEBIAN_CONF).unwrap(), &env).unwrap();
    let prepared = mkfs::prepare(resolved, false).unwrap();
    let params = UndoParams {
        block_size: 32768,
        fs_block_size: 4096,
        fs_offset: 0,
        old_len: size,
    };
    let img = dir.path().join("cut.img");
    let undo = dir.path().join("cut.e2undo");
    // One run with `cut` operations allowed (None: all); the op count.
    let format_once = |cut: Option<u64>| -> u64 {
        let _ = std::fs::remove_file(&img);
        let _ = std::fs::remove_file(&undo);
        sparse_copy(&old, &img);
        let file = FileDevice::open(&img, OpenOptions::read_write()).unwrap();
        let ctl = FaultControl::new();
        let fault = Arc::new(FaultDevice::with_control(file, ctl.clone()));
        let u = UndoFile::open(&undo, Some(&*fault as &dyn Device), params).unwrap();
        let dev = UndoDevice::new(fault.clone(), u);
        if let Some(n) = cut {
            ctl.fail_after(n);
        }
        let r = mkfs::write(&dev, prepared.clone());
        if cut.is_none() {
            r.unwrap();
            dev.finish().unwrap();
        } else {
            assert!(
                r.is_err(),
                "the cut after {cut:?} operations did not stop mkfs"
            );
        }
        // What was issued reaches the disk.
        ctl.reset();
        fault.flush().unwrap();
        ctl.ops()
    };
    let total = format_once(None);
    e2fsck_clean(&img).unwrap();
    assert!(total > 6, "only {total} operations");
    let mut restored = 0;
    for n in [1, total / 3, total * 2 / 3, total - 2] {
        format_once(Some(n));
        let bytes = std::fs::read(&img).unwrap();
        if bytes == old_bytes {
            continue;
        }
        let out = run(tool("e2undo").arg(&undo).arg(&img)).unwrap();
        if !out.status.success() {
            let h = run(tool("e2undo").arg("-h").arg(&undo).arg(&img)).unwrap();
            panic!("cut after {n}: {out:?}\nheader:\n{}", stdout(&h));
        }
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("Incomplete undo record"),
            "cut after {n}: {out:?}"
        );
        let bytes = std::fs::read(&img).unwrap();
        let differ: Vec<usize> = bytes
            .chunks(1024)
            .zip(old_bytes.chunks(1024))
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(k, _)| k * 1024)
            .collect();
        assert!(
            differ.iter().all(|&k| k == 1024),
            "cut after {n} of {total}: restored image differs in the KiB at {:?}",
            &differ[..differ.len().min(8)]
        );
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("cut after {n}: {e}"));
        check_files(&img);
        restored += 1;
    }
    assert!(restored >= 3, "only {restored} cuts changed the target");
}

/// mke2fs's automatic undo file: over an ext4 filesystem, with group
/// checksums and lazy inode tables, in E2FSPROGS_UNDO_DIR (or mke2fs.conf's
/// undo_dir) as mke2fs-NAME.e2undo, an old one deleted first; none with
/// "none", a missing directory, or without group checksums. The messages
/// are mke2fs's.
#[test]
fn automatic_undo_file_as_mke2fs() {
    const TEST: &str = "automatic_undo_file_as_mke2fs";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let img = old_image(dir.path(), "auto.img", "32M", &[]);
    let orig = copy_of(&img, "auto.orig");
    let udir = dir.path().join("undo");
    std::fs::create_dir(&udir).unwrap();
    let file = udir.join("mke2fs-auto.img.e2undo");
    std::fs::write(&file, b"stale").unwrap();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let message = |f: &Path, i: &Path| {
        format!(
            "Overwriting existing filesystem; this can be undone using the command:\n    e2undo {} {}\n\n",
            f.display(),
            i.display()
        )
    };
    let expect = message(&file, &img);
    // mke2fs's own output for the same run, on a copy.
    let copy = copy_of(&img, "auto.img.copy");
    let mut m = mke2fs(["-q", "-F", "-t", "ext4"]);
    m.arg(&copy)
        .env("E2FSPROGS_UNDO_DIR", &udir)
        .env("MKE2FS_CONFIG", &conf);
    let mout = run_ok(&mut m).unwrap();
    let mfile = udir.join("mke2fs-auto.img.copy.e2undo");
    assert_eq!(stdout(&mout), message(&mfile, &copy));
    std::fs::remove_file(&mfile).unwrap();
    let mut k = ext4kit_mkfs(["-q", "-F", "-t", "ext4", "-b", "1024"]);
    k.arg(&img)
        .env("E2FSPROGS_UNDO_DIR", &udir)
        .env("MKE2FS_CONFIG", &conf);
    assert_eq!(stdout(&run_ok(&mut k).unwrap()), expect);
    e2undo(&file, &img);
    sparse_equal(&img, &orig).unwrap();
    // undo_dir from mke2fs.conf when the variable is not set.
    let conf2 = dir.path().join("undo_dir.conf");
    std::fs::write(
        &conf2,
        DEBIAN_CONF.replace(
            "[defaults]\n",
            &format!("[defaults]\n\tundo_dir = {}\n", udir.display()),
        ),
    )
    .unwrap();
    std::fs::remove_file(&file).unwrap();
    let mut k = ext4kit_mkfs(["-q", "-F", "-t", "ext4"]);
    k.arg(&img)
        .env_remove("E2FSPROGS_UNDO_DIR")
        .env("MKE2FS_CONFIG", &conf2);
    assert_eq!(stdout(&run_ok(&mut k).unwrap()), expect);
    e2undo(&file, &img);
    sparse_equal(&img, &orig).unwrap();
    // No undo file: "none", a directory that is not there, no checksums.
    std::fs::remove_file(&file).unwrap();
    for (undo_dir, args) in [
        ("none", &["-t", "ext4"][..]),
        ("/nonexistent-ext4kit-dir", &["-t", "ext4"][..]),
        (
            udir.to_str().unwrap(),
            &["-t", "ext4", "-O", "^metadata_csum,^uninit_bg"][..],
        ),
        (
            udir.to_str().unwrap(),
            &["-t", "ext4", "-E", "lazy_itable_init=0"][..],
        ),
    ] {
        let mut k = ext4kit_mkfs(["-q", "-F"]);
        k.args(args)
            .arg(&img)
            .env("E2FSPROGS_UNDO_DIR", undo_dir)
            .env("MKE2FS_CONFIG", &conf);
        assert_eq!(stdout(&run_ok(&mut k).unwrap()), "", "{undo_dir} {args:?}");
        assert!(!file.exists(), "{undo_dir} {args:?}");
    }
}

/// Refusals, each one line with nothing written: the undo file is the
/// target; its directory does not exist; an existing file that is not an
/// undo file; an undo file of another filesystem. -n prints mke2fs's
/// message and writes no undo file.
#[test]
fn undo_refusals_write_nothing() {
    const TEST: &str = "undo_refusals_write_nothing";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "ref.img", "16M", &[]);
    let other = mkimg(dir.path(), "other.img", "16M", &["-b", "1024"]);
    let before = file_hash(&img).unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, pattern(5000, 4)).unwrap();
    // An undo file of `other` after a format.
    let of = dir.path().join("other.e2undo");
    run_ok(ext4kit_mkfs(["-q", "-F", "-z"]).arg(&of).arg(&other)).unwrap();
    let cases: [(PathBuf, &str); 4] = [
        (img.clone(), "the undo file cannot be the target"),
        (
            dir.path().join("no/such/dir/u"),
            "No such file or directory",
        ),
        (garbage.clone(), "Undo file corrupt"),
        (of.clone(), "Wrong undo file for this filesystem"),
    ];
    for (undo, want) in &cases {
        let out = run(ext4kit_mkfs(["-q", "-F", "-z"]).arg(undo).arg(&img)).unwrap();
        let line = one_line_error(&out);
        assert!(line.contains(want), "{undo:?}: {line}");
        assert!(line.contains(&*undo.to_string_lossy()), "{undo:?}: {line}");
        assert_eq!(file_hash(&img).unwrap(), before, "{undo:?}: target written");
    }
    assert_eq!(std::fs::read(&garbage).unwrap(), pattern(5000, 4));
    // -n: the message, no file.
    let u = dir.path().join("dry.e2undo");
    let out = run_ok(ext4kit_mkfs(["-n", "-F", "-z"]).arg(&u).arg(&img)).unwrap();
    assert!(stdout(&out).starts_with("Overwriting existing filesystem;"));
    assert!(!u.exists());
    assert_eq!(file_hash(&img).unwrap(), before);
}

/// An existing undo file of the same target is appended to (as undo_io
/// reopens it): two formats into one undo file, one e2undo goes back to
/// the filesystem before the first.
#[test]
fn undo_file_is_appended_to() {
    const TEST: &str = "undo_file_is_appended_to";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let img = old_image(dir.path(), "two.img", "32M", &["-b", "2048"]);
    let orig = copy_of(&img, "two.orig");
    let undo = dir.path().join("two.e2undo");
    for args in [
        &["-b", "4096"][..],
        &["-b", "1024", "-O", "^has_journal"][..],
    ] {
        run_ok(
            ext4kit_mkfs(["-q", "-F", "-t", "ext4"])
                .args(args)
                .arg("-z")
                .arg(&undo)
                .arg(&img),
        )
        .unwrap();
        e2fsck_clean(&img).unwrap();
    }
    e2undo(&undo, &img);
    sparse_equal(&img, &orig).unwrap();
    check_files(&img);
}

/// mke2fs decides on the automatic undo file before
/// `-E assume_storage_prezeroed=1` turns lazy inode tables on: with it
/// alone an undo file, with `lazy_itable_init=0` too (in either order)
/// none. The same decision, output and images as mke2fs 1.47.0, each
/// side in its own directory with the same relative names; the undo file
/// restores.
#[test]
fn automatic_undo_and_assume_storage_prezeroed() {
    const TEST: &str = "automatic_undo_and_assume_storage_prezeroed";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let old = old_image(dir.path(), "old.img", "32M", &[]);
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let sides = [dir.path().join("real"), dir.path().join("ours")];
    for s in &sides {
        std::fs::create_dir_all(s.join("undo")).unwrap();
    }
    for (ext, made) in [
        ("assume_storage_prezeroed=1", true),
        ("assume_storage_prezeroed=1,lazy_itable_init=0", false),
        ("lazy_itable_init=0,assume_storage_prezeroed=1", false),
        ("lazy_itable_init=1", true),
        ("lazy_itable_init=0", false),
    ] {
        let mut outs = Vec::new();
        for (i, s) in sides.iter().enumerate() {
            let img = s.join("p.img");
            let _ = std::fs::remove_file(&img);
            sparse_copy(&old, &img);
            let _ = std::fs::remove_file(s.join("undo/mke2fs-p.img.e2undo"));
            let args = [
                "-q",
                "-F",
                "-t",
                "ext4",
                "-U",
                UUID,
                "-E",
                &format!("{ext},hash_seed={SEED}"),
                "p.img",
            ];
            let mut c = if i == 0 {
                mke2fs(args)
            } else {
                ext4kit_mkfs(args)
            };
            c.current_dir(s)
                .env("E2FSPROGS_UNDO_DIR", "undo")
                .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
                .env("MKE2FS_CONFIG", &conf);
            outs.push(stdout(&run_ok(&mut c).unwrap()));
            assert_eq!(
                s.join("undo/mke2fs-p.img.e2undo").exists(),
                made,
                "{ext}: {}",
                s.display()
            );
        }
        assert_eq!(outs[0], outs[1], "{ext}");
        let (a, b) = (sides[0].join("p.img"), sides[1].join("p.img"));
        // (With prezeroed over storage that is not zeroed, a broken
        // promise, both keep the old bytes that share an inode table block
        // with the reserved inodes.)
        sparse_equal(&a, &b).unwrap_or_else(|e| panic!("{ext}: {e}"));
        e2fsck_clean(&b).unwrap();
        if made {
            e2undo(&sides[1].join("undo/mke2fs-p.img.e2undo"), &b);
            sparse_equal(&b, &old).unwrap_or_else(|e| panic!("{ext}: undone: {e}"));
        }
        eprintln!("ok     {ext}");
    }
}

/// `--json` names the undo file: `undo_file` is the -z path or the
/// automatic one (with -n the one that would be made, and none is), null
/// without one; and the automatic one is made where it says.
#[test]
fn json_names_the_undo_file() {
    const TEST: &str = "json_names_the_undo_file";
    if let Err(e) = tools() {
        return skip(TEST, &e);
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let udir = dir.path().join("undo");
    std::fs::create_dir(&udir).unwrap();
    let img = mkimg(dir.path(), "j.img", "16M", &[]);
    let z = dir.path().join("z.e2undo");
    let auto = udir.join("mke2fs-j.img.e2undo");
    let json = |args: &[&str], undo_dir: &Path| -> serde_json::Value {
        let mut c = ext4kit_mkfs(["--json", "-F", "-t", "ext4"]);
        c.args(args)
            .arg(&img)
            .env("E2FSPROGS_UNDO_DIR", undo_dir)
            .env("MKE2FS_CONFIG", &conf);
        let out = run_ok(&mut c).unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&out)))
    };
    let path = |p: &Path| serde_json::Value::from(p.display().to_string());
    let none = Path::new("none");
    // -n: the file that would be made; none is.
    let v = json(&["-n", "-z", z.to_str().unwrap()], none);
    assert_eq!(v["undo_file"], path(&z));
    assert_eq!(v["dry_run"], true);
    let v = json(&["-n"], &udir);
    assert_eq!(v["undo_file"], path(&auto));
    assert!(!z.exists() && !auto.exists());
    // Formats: -z, then the automatic one, then none.
    let v = json(&["-z", z.to_str().unwrap()], none);
    assert_eq!(v["undo_file"], path(&z));
    assert!(z.exists());
    let v = json(&[], &udir);
    assert_eq!(v["undo_file"], path(&auto));
    assert!(auto.exists());
    let v = json(&[], none);
    assert_eq!(v["undo_file"], serde_json::Value::Null);
    let v = json(&["-n", "-O", "^metadata_csum,^uninit_bg"], &udir);
    assert_eq!(v["undo_file"], serde_json::Value::Null);
    e2fsck_clean(&img).unwrap();
}
