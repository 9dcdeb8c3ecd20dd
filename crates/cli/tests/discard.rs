//! Discard at commit on sparse image files (space given back at close,
//! and after a crash by the next open's reconciler) and offline
//! `ext4kit fstrim`. Every image ends e2fsck-clean.
//!
//! `EXT4KIT_DISCARD_MIB` sets the data written by the sparse-image tests
//! (256 MiB by default).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ext4kit_device::{DelayDevice, Device, FileDevice, OpenOptions};
use ext4kit_format::inode::S_IFREG;
use ext4kit_fs::discard::{DiscardOptions, Reconcile};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

const ROOT: u32 = 2;

fn data_mib() -> u64 {
    std::env::var("EXT4KIT_DISCARD_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Bytes the image file occupies (st_blocks × 512).
fn allocated(img: &Path) -> u64 {
    std::fs::metadata(img).unwrap().blocks() * 512
}

fn discard_opts(reconcile: Reconcile) -> RwOptions {
    RwOptions {
        discard: Some(DiscardOptions {
            reconcile,
            reconcile_pace: 0,
            ..DiscardOptions::default()
        }),
        ..RwOptions::default()
    }
}

/// Write `mib` MiB into a new file `/f` (no discard) and close.
fn fill(img: &Path, mib: u64) {
    let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let ino = fs.create(ROOT, b"f", &spec).unwrap().0.ino;
    let chunk = vec![0xA5u8; 4 << 20];
    for i in 0..mib / 4 {
        fs.write_at(ino, i * chunk.len() as u64, &chunk).unwrap();
    }
    fs.close().unwrap();
}

fn prepared(name: &str) -> Option<(tempfile::TempDir, std::path::PathBuf, u64, u64)> {
    if let Err(e) = e2fs_tools() {
        skip(name, &e);
        return None;
    }
    let dir = image_dir();
    let mib = data_mib();
    let size = format!("{}M", (mib * 2).max(128));
    let img = mkimg(dir.path(), "d.img", &size, &["-b", "4096"]);
    let before = allocated(&img);
    fill(&img, mib);
    let full = allocated(&img);
    assert!(
        full >= before + mib * (1 << 20) * 9 / 10,
        "{before} -> {full}"
    );
    Some((dir, img, before, full))
}

/// Delete with discard on and close at once: the image's allocation is
/// back to what it was before the data (up to the journal blocks the
/// sessions wrote).
#[test]
fn delete_then_close_gives_the_space_back() {
    let Some((_dir, img, before, _)) = prepared("delete_then_close_gives_the_space_back") else {
        return;
    };
    let fs = Filesystem::open(open_file(&img), discard_opts(Reconcile::Off)).unwrap();
    fs.unlink(ROOT, b"f").unwrap();
    fs.close().unwrap();
    let after = allocated(&img);
    assert!(after <= before + (2 << 20), "{before} -> {after}");
    e2fsck_clean(&img).unwrap();
}

/// The same delete, then a crash before the (slow) discards ran: the
/// space stays allocated; the next open with discard finds and discards
/// it (the reconciler).
#[test]
fn discards_lost_in_a_crash_come_back_at_the_next_open() {
    let Some((_dir, img, before, full)) =
        prepared("discards_lost_in_a_crash_come_back_at_the_next_open")
    else {
        return;
    };
    let o = OpenOptions {
        write: true,
        exclusive: false,
    };
    let slow = Arc::new(DelayDevice::new(FileDevice::open(&img, o).unwrap()));
    slow.control().set_discard_delay(Duration::from_millis(50));
    let mut opts = discard_opts(Reconcile::Off);
    if let Some(d) = opts.discard.as_mut() {
        d.workers = 1;
        d.max_request_blocks = 256;
    }
    let fs = Filesystem::open(slow.clone() as Arc<dyn Device>, opts).unwrap();
    fs.unlink(ROOT, b"f").unwrap();
    fs.sync().unwrap();
    fs.crash();
    drop(slow);
    let crashed = allocated(&img);
    assert!(
        crashed > before + (full - before) / 2,
        "the discards ran before the crash: {before} -> {full} -> {crashed}"
    );
    let fs = Filesystem::open(open_file(&img), discard_opts(Reconcile::Auto)).unwrap();
    let r = fs.wait_reconciled().unwrap();
    assert!(r.finished && r.error.is_none(), "{r:?}");
    fs.close().unwrap();
    let after = allocated(&img);
    assert!(
        after <= before + (2 << 20),
        "{before} -> {crashed} -> {after}"
    );
    e2fsck_clean(&img).unwrap();
}

fn fstrim(args: &[&str], img: &Path) -> std::process::Output {
    run(ext4kit().arg("fstrim").args(args).arg(img)).unwrap()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// `ext4kit fstrim` on mke2fs images populated with files (with and
/// without a journal), some deleted: the allocation drops by what was
/// deleted, the kept file is intact, e2fsck is clean, and a second run
/// skips every group.
#[test]
fn fstrim_gives_back_deleted_files() {
    if let Err(e) = e2fs_tools() {
        skip("fstrim_gives_back_deleted_files", &e);
        return;
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    for (i, name) in ["a", "b", "keep"].iter().enumerate() {
        pattern_file(&src.join(name), 24 << 20, i as u64 + 1).unwrap();
    }
    let src_arg = src.to_str().unwrap();
    for (name, extra) in [
        ("j.img", vec!["-b", "4096", "-d", src_arg]),
        (
            "nj.img",
            vec!["-b", "4096", "-O", "^has_journal", "-d", src_arg],
        ),
    ] {
        let img = mkimg(dir.path(), name, "256M", &extra);
        let spec = |p: &str| format!("{}:{p}", img.display());
        run_ok(ext4kit().arg("rm").arg(spec("/a")).arg(spec("/b"))).unwrap();
        let held = allocated(&img);
        let out = fstrim(&["-v"], &img);
        assert!(out.status.success(), "{}", last_line(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(" bytes) trimmed"), "{text}");
        let after = allocated(&img);
        assert!(
            after + (46 << 20) <= held,
            "{name}: {held} -> {after}: {text}"
        );
        e2fsck_clean(&img).unwrap();
        let kept = dir.path().join("kept");
        run_ok(
            tool("debugfs")
                .arg("-R")
                .arg(format!("dump /keep {}", kept.display()))
                .arg(&img),
        )
        .unwrap();
        assert_eq!(
            file_hash(&kept).unwrap(),
            file_hash(&src.join("keep")).unwrap()
        );
        // A second run finds the free space already unallocated.
        let again = fstrim(&["--json"], &img);
        assert!(again.status.success(), "{}", last_line(&again));
        let j = json(&again);
        assert_eq!(j["trimmed_bytes"], 0, "{j}");
        assert!(j["groups_skipped"].as_u64().unwrap() >= 1, "{j}");
        assert_eq!(j["allocation_known"], true);
        assert_eq!(allocated(&img), after);
    }
}

/// A dirty journal is replayed before the trim (like the other write
/// commands), and the result is e2fsck-clean.
#[test]
fn fstrim_replays_a_dirty_journal_first() {
    if let Err(e) = e2fs_tools() {
        skip("fstrim_replays_a_dirty_journal_first", &e);
        return;
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "d.img", "128M", &["-b", "4096"]);
    fill(&img, 32);
    {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        fs.unlink(ROOT, b"f").unwrap();
        fs.sync().unwrap();
        fs.crash();
    }
    assert!(dumpe2fs_h(&img).contains("needs_recovery"));
    let held = allocated(&img);
    let out = fstrim(&["-v"], &img);
    assert!(out.status.success(), "{}", last_line(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("journal transactions replayed first"),
        "{text}"
    );
    assert!(allocated(&img) + (30 << 20) <= held, "{text}");
    assert!(!dumpe2fs_h(&img).contains("needs_recovery"));
    e2fsck_clean(&img).unwrap();
}

/// Refusals are one line, exit status 1, and write nothing.
#[test]
fn fstrim_refusals() {
    if let Err(e) = e2fs_tools() {
        skip("fstrim_refusals", &e);
        return;
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "d.img", "64M", &[]);
    let h = file_hash(&img).unwrap();
    for args in [
        vec!["-o", "1G"],
        vec!["-l", "100"],
        vec!["-m", "1G"],
        vec!["-o", "12x"],
    ] {
        let out = fstrim(&args, &img);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("ext4kit fstrim: ") || err.starts_with("ext4kit: "),
            "{err}"
        );
        assert_eq!(file_hash(&img).unwrap(), h, "{args:?} wrote to the image");
    }
    let junk = dir.path().join("junk");
    pattern_file(&junk, 1 << 20, 3).unwrap();
    let hj = file_hash(&junk).unwrap();
    let out = fstrim(&[], &junk);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("junk"), "{err}");
    assert_eq!(file_hash(&junk).unwrap(), hj);
    e2fsck_clean(&img).unwrap();
}

/// As root: files written and deleted by the kernel (mounted without
/// `-o discard`), then `ext4kit fstrim` on the loop device (a block
/// device: no allocation information, so all free space is discarded;
/// the loop driver punches the holes) and on the image file (nothing
/// left to do). The kept file is intact, e2fsck clean.
#[test]
fn fstrim_kernel_image_and_block_device() {
    let name = "fstrim_kernel_image_and_block_device";
    if let Err(e) = kernel_mount_available().and_then(|()| e2fs_tools()) {
        skip(name, &e);
        return;
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "k.img", "256M", &["-b", "4096"]);
    let keep = dir.path().join("keep");
    pattern_file(&keep, 8 << 20, 9).unwrap();
    let lo = match LoopDev::attach(&img) {
        Ok(l) => l,
        Err(e) => return skip(name, &e),
    };
    {
        let m = match Mount::new(lo.path(), "ext4", Some("nodiscard")) {
            Ok(m) => m,
            Err(e) => return skip(name, &e),
        };
        pattern_file(&m.path().join("big"), 48 << 20, 5).unwrap();
        std::fs::copy(&keep, m.path().join("keep")).unwrap();
        run_ok(&mut tool("sync")).unwrap();
        std::fs::remove_file(m.path().join("big")).unwrap();
        run_ok(&mut tool("sync")).unwrap();
        m.unmount().unwrap();
    }
    let held = allocated(&img);
    let out = fstrim(&["--json"], lo.path());
    assert!(out.status.success(), "{}", last_line(&out));
    let j = json(&out);
    assert_eq!(j["allocation_known"], false, "{j}");
    assert_eq!(j["trimmed_bytes"], j["free_bytes"], "{j}");
    let after = allocated(&img);
    assert!(after + (40 << 20) <= held, "{held} -> {after}: {j}");
    drop(lo);
    let out = fstrim(&["--json"], &img);
    assert!(out.status.success(), "{}", last_line(&out));
    let j = json(&out);
    assert!(j["trimmed_bytes"].as_u64().unwrap() < 1 << 20, "{j}");
    e2fsck_clean(&img).unwrap();
    let kept = dir.path().join("kept");
    run_ok(
        tool("debugfs")
            .arg("-R")
            .arg(format!("dump /keep {}", kept.display()))
            .arg(&img),
    )
    .unwrap();
    assert_eq!(file_hash(&kept).unwrap(), file_hash(&keep).unwrap());
}

/// `ext4kit status --json MNT`, once the mount has published a status
/// with a finished (or stopped) reconciler.
fn reconciled_status(mnt: &Path) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let r = fuse::wait_until("the reconciler", Duration::from_secs(60), || {
        let Ok(o) = run(ext4kit().args(["status", "--json"]).arg(mnt)) else {
            return false;
        };
        last = serde_json::from_slice(&o.stdout).unwrap_or_default();
        matches!(
            last["discard"]["reconcile"]["state"].as_str(),
            Some("done" | "stopped")
        )
    });
    r.unwrap_or_else(|e| panic!("{e}; last status: {last}"));
    last
}

/// Write `mib` MiB into `path` on a mount and fsync it.
fn write_fsynced(path: &Path, mib: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = pattern(1 << 20, 7);
    for _ in 0..mib {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
}

/// Issue 20, defect 2, on a real mount: what a `kill -9` of the daemon
/// left undiscarded is given back by the next `-o discard` mount's
/// reconciler, and `ext4kit status` shows the discard queue and the
/// reconciler's state. Five runs: (1) `-o discard`, a file written with
/// fsync, removed, the removal made durable by an fsync of the directory,
/// kill -9 at once; (2) the same on a `nodiscard` mount, so every freed
/// block is still held by the image; (3) the sequence with a plain
/// `sync`, which does not reach a FUSE server (the kernel sends
/// FUSE_SYNCFS to virtiofs only): the mount's idle commit usually has made
/// the removal durable by then, but a kill right after may still lose it
/// (the file is back, its blocks in use), and the image then holds
/// exactly the file's blocks more than the empty one; (4) `ext4kit sync
/// MOUNTPOINT` instead (issue 23: it commits): the removal is durable;
/// (5) a `nodiscard` mount, the removal followed by `fstrim MOUNTPOINT`
/// (FITRIM commits first, then trims): durable, and the image is back to
/// the empty one's size before any reconciler runs. After each run the
/// image is e2fsck clean.
#[test]
fn mount_discard_gives_back_what_a_kill_left() {
    let name = "mount_discard_gives_back_what_a_kill_left";
    if let Err(e) = fuse_available() {
        return skip(name, &e);
    }
    let mib = 64u64;
    let dir = image_dir();
    let img = fuse::mkfs(dir.path(), "512M");
    // The empty mounted image (lazy init done, the journal written).
    let m = fuse::FuseMount::new(&img, &["discard"]).unwrap();
    let st = reconciled_status(m.path());
    assert_eq!(st["discard"]["reconcile"]["state"], "done", "{st}");
    m.unmount().unwrap();
    let empty = allocated(&img);
    let slack = 4 << 20;
    #[derive(PartialEq)]
    enum After {
        DirFsync,
        Sync,
        Ext4kitSync,
        Fstrim,
    }
    for (run_no, first, after) in [
        (1, "discard", After::DirFsync),
        (2, "nodiscard", After::DirFsync),
        (3, "discard", After::Sync),
        (4, "discard", After::Ext4kitSync),
        (5, "nodiscard", After::Fstrim),
    ] {
        if after == After::Fstrim && find_tool("fstrim").is_none() {
            eprintln!("{name}: run {run_no} skipped: fstrim (util-linux) is not installed");
            continue;
        }
        let label = format!("run {run_no} (-o {first})");
        let m = fuse::FuseMount::new(&img, &[first]).unwrap();
        let big = m.path().join("big");
        write_fsynced(&big, mib);
        assert!(allocated(&img) >= empty + (mib << 20), "{label}: written");
        std::fs::remove_file(&big).unwrap();
        match after {
            After::DirFsync => std::fs::File::open(m.path()).unwrap().sync_all().unwrap(),
            After::Sync => drop(run_ok(&mut tool("sync")).unwrap()),
            After::Ext4kitSync => drop(run_ok(ext4kit().arg("sync").arg(m.path())).unwrap()),
            After::Fstrim => drop(run_ok(tool("fstrim").arg(m.path())).unwrap()),
        }
        m.kill9();
        if after == After::Fstrim {
            let a = allocated(&img);
            assert!(
                a <= empty + slack,
                "{label}: after fstrim and the kill the image holds {a} bytes, empty {empty}"
            );
        }
        let m = fuse::FuseMount::new(&img, &["discard"]).unwrap();
        let st = reconciled_status(m.path());
        assert_eq!(st["discard"]["reconcile"]["state"], "done", "{label}: {st}");
        let text = String::from_utf8_lossy(
            &run_ok(ext4kit().arg("status").arg(m.path()))
                .unwrap()
                .stdout,
        )
        .into_owned();
        assert!(
            text.contains("discard: on") && text.contains("reconciler: done"),
            "{label}: {text}"
        );
        let big = m.path().join("big");
        let back = big.exists();
        if run_no == 2 {
            // Nothing was discarded before the kill: all of it is the
            // reconciler's.
            let given = st["discard"]["reconcile"]["bytes"].as_u64().unwrap();
            assert!(
                given >= mib << 20,
                "{label}: reconciler gave back {given}: {st}"
            );
        }
        if after != After::Sync {
            assert!(!back, "{label}: the committed removal was lost");
        }
        if back {
            eprintln!(
                "{name}: {label}: the removal was not durable at sync(2), as expected on FUSE"
            );
            std::fs::remove_file(&big).unwrap();
            std::fs::File::open(m.path()).unwrap().sync_all().unwrap();
            // Discard at commit gives it back now.
            fuse::wait_until("the discards", Duration::from_secs(30), || {
                allocated(&img) <= empty + slack
            })
            .unwrap();
        }
        let a = allocated(&img);
        assert!(
            a <= empty + slack,
            "{label}: image holds {a} bytes, empty {empty}"
        );
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{label}: {e}"));
    }
}
