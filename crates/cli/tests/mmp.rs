//! Multiple mount protection (`-O mmp`) in the read-write engine: the
//! image tools and the mount write an mmp image (e2fsck clean, the clean
//! sequence after close), a second open while the mount runs is refused
//! with one line and writes nothing, a killed mount's live sequence is
//! waited out by the next open, which then proceeds; e2fsck's "fsck is
//! running" sequence refuses at once; the kernel mounts what we wrote,
//! we open what it wrote and are refused while it has the device.
//!
//! The open's waits use the test hook `EXT4KIT_MMP_WAIT_MS` (the rule
//! itself, `min(2 * check + 1, check + 60)` s, is a unit test of
//! ext4kit-format), always above the 1 s update interval of the images.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::fuse::*;
use common::*;
use ext4kit_format::mmp::{MMP_SEQ_CLEAN, MMP_SEQ_FSCK};

const WAIT: &str = "EXT4KIT_MMP_WAIT_MS";

/// A 64 MiB ext4kit image with mmp and a 1 s update interval.
fn mmp_image(dir: &Path) -> std::path::PathBuf {
    let img = dir.join("mmp.img");
    run_ok(&mut ext4kit_mkfs([
        "-q",
        "-F",
        "-t",
        "ext4",
        "-O",
        "mmp",
        "-E",
        "mmp_update_interval=1,nodiscard",
        "-U",
        UUID,
        img.to_str().unwrap(),
        "64M",
    ]))
    .unwrap();
    img
}

/// The superblock and the MMP block's byte offset.
fn mmp_where(img: &Path) -> (ext4kit_format::Superblock, u64) {
    let b = fs::read(img).unwrap();
    let sb = ext4kit_format::Superblock::parse(&b[1024..2048]).unwrap();
    let off = sb.s_mmp_block.get() * u64::from(sb.block_size().unwrap());
    (sb, off)
}

fn mmp_seq(img: &Path) -> u32 {
    let (_, off) = mmp_where(img);
    let b = fs::read(img).unwrap();
    let o = off as usize;
    u32::from_le_bytes(b[o + 4..o + 8].try_into().unwrap())
}

/// Put `seq` into the MMP block (checksum kept right).
fn set_mmp_seq(img: &Path, seq: u32) {
    let (sb, off) = mmp_where(img);
    let mut b = fs::read(img).unwrap();
    let o = off as usize;
    let m = &mut b[o..o + 1024];
    m[4..8].copy_from_slice(&seq.to_le_bytes());
    ext4kit_format::mmp::set_checksum(ext4kit_format::Csum::from_superblock(&sb).seed, m);
    fs::write(img, b).unwrap();
}

/// The engine's open of `img` (shared, past the tools' exclusive open)
/// while someone updates the MMP block every second: refused with one
/// line naming the node, and the block is not written.
fn expect_in_use(img: &Path) {
    let dev = open_file(img);
    let (sb, _) = mmp_where(img);
    let before = mmp_seq(img);
    let r = ext4kit_fs::mmp::Mmp::start_with_wait(dev, &sb, Some(Duration::from_millis(2500)));
    let e = match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("the open was not refused (sequence {before:#x})"),
    };
    assert!(
        e.contains("device is in use by node") && !e.contains('\n'),
        "{e}"
    );
}

fn at(img: &Path, p: &str) -> String {
    format!("{}:{p}", img.display())
}

/// `ext4kit cp FROM TO` with the mmp wait shortened to `wait_ms`.
fn cp(
    wait_ms: &str,
    from: impl AsRef<std::ffi::OsStr>,
    to: impl AsRef<std::ffi::OsStr>,
) -> Command {
    let mut c = ext4kit();
    c.env(WAIT, wait_ms).arg("cp").arg(from).arg(to);
    c
}

#[test]
fn tools_write_an_mmp_image_and_refuse_a_running_fsck() {
    if let Err(e) = e2fs_tools() {
        return skip("tools_write_an_mmp_image_and_refuse_a_running_fsck", &e);
    }
    let dir = image_dir();
    let img = mmp_image(dir.path());
    let host = dir.path().join("data");
    fs::write(&host, pattern(300_000, 3)).unwrap();
    run_ok(&mut cp("100", &host, at(&img, "/f"))).unwrap();
    run_ok(
        ext4kit()
            .env(WAIT, "100")
            .args(["chmod", "600"])
            .arg(at(&img, "/f")),
    )
    .unwrap();
    assert_eq!(mmp_seq(&img), MMP_SEQ_CLEAN, "clean sequence after close");
    e2fsck_clean(&img).unwrap();
    let out = dir.path().join("back");
    run_ok(&mut cp("100", at(&img, "/f"), &out)).unwrap();
    assert_eq!(fs::read(&out).unwrap(), fs::read(&host).unwrap());
    // e2fsck has it: refused at once, one line, nothing written.
    set_mmp_seq(&img, MMP_SEQ_FSCK);
    let before = file_hash(&img).unwrap();
    let t = Instant::now();
    let o = run(&mut cp("5000", &host, at(&img, "/g"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("in use by node") && err.contains("fsck"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(4), "no wait for fsck");
    assert_eq!(
        file_hash(&img).unwrap(),
        before,
        "a refused open writes nothing"
    );
}

#[test]
fn mount_holds_the_device_and_a_killed_mount_is_waited_out() {
    let what = "mount_holds_the_device_and_a_killed_mount_is_waited_out";
    if let Err(e) = fuse_available().and_then(|()| e2fs_tools()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mmp_image(dir.path());
    let host = dir.path().join("data");
    fs::write(&host, pattern(50_000, 4)).unwrap();
    // A clean mount and unmount.
    let m = FuseMount::with_env(&img, &[], &[(WAIT, "100")]).unwrap();
    fs::write(m.path().join("a"), b"first").unwrap();
    m.unmount().unwrap();
    assert_eq!(mmp_seq(&img), MMP_SEQ_CLEAN);
    e2fsck_clean(&img).unwrap();

    let m = FuseMount::with_env(&img, &[], &[(WAIT, "100")]).unwrap();
    fs::write(m.path().join("b"), b"second").unwrap();
    // The mount's thread changes the sequence every second: a second
    // open that waits 2.5 s sees it and is refused, writing nothing.
    let s1 = mmp_seq(&img);
    assert_ne!(s1, MMP_SEQ_CLEAN);
    // (The tools' exclusive open refuses it on this host already; the
    // engine's own check is what another host sharing the disk meets.)
    let o = run(&mut cp("100", &host, at(&img, "/c"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    expect_in_use(&img);
    assert_ne!(mmp_seq(&img), s1, "the mount keeps updating");
    // Killed: its last sequence stays; the next open waits it out twice
    // (before and after writing its own), then proceeds.
    m.kill9();
    let left = mmp_seq(&img);
    assert_ne!(left, MMP_SEQ_CLEAN);
    let t = Instant::now();
    run_ok(&mut cp("1500", &host, at(&img, "/c"))).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(3000),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(mmp_seq(&img), MMP_SEQ_CLEAN);
    e2fsck_clean(&img).unwrap();
    let out = dir.path().join("back");
    run_ok(&mut cp("100", at(&img, "/b"), &out)).unwrap();
    assert_eq!(fs::read(&out).unwrap(), b"second");
}

#[test]
fn the_kernel_and_ext4kit_take_turns_on_an_mmp_image() {
    let what = "the_kernel_and_ext4kit_take_turns_on_an_mmp_image";
    if let Err(e) = kernel_mount_available().and_then(|()| e2fs_tools()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mmp_image(dir.path());
    let host = dir.path().join("data");
    fs::write(&host, pattern(200_000, 5)).unwrap();
    run_ok(&mut cp("100", &host, at(&img, "/ours"))).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let m = match Mount::new(lo.path(), "ext4", None) {
        Ok(m) => m,
        Err(e) => return skip(what, &format!("the kernel does not mount it: {e}")),
    };
    assert_eq!(
        fs::read(m.path().join("ours")).unwrap(),
        fs::read(&host).unwrap()
    );
    fs::write(m.path().join("theirs"), b"kernel").unwrap();
    // While the kernel has it (kmmpd updates every second): refused.
    std::thread::sleep(Duration::from_millis(1500));
    expect_in_use(&img);
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
    let out = dir.path().join("back");
    run_ok(&mut cp("100", at(&img, "/theirs"), &out)).unwrap();
    assert_eq!(fs::read(&out).unwrap(), b"kernel");
    run_ok(&mut cp("100", &host, at(&img, "/x"))).unwrap();
    e2fsck_clean(&img).unwrap();
}
