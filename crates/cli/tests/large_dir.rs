//! large_dir through the operations layer (`fs::Filesystem`): a
//! directory that needs a third htree level (1 KiB blocks, 255-byte
//! names, 32 000 entries: 2 to 3 names a leaf) is written by the engine,
//! e2fsck -fn is clean, debugfs sees two indirect levels and the kernel
//! reads every name back; a kernel-written 3-level directory is read and
//! changed by the engine. (The block layout against the kernel's is
//! `dir_write.rs`'s `third_level_same_as_the_kernel`.)

mod common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use common::*;
use ext4kit_format::inode::{ROOT_INO, S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

const N: u32 = 32_000;

fn name(i: u32) -> Vec<u8> {
    let mut n = format!("n{i}-").into_bytes();
    let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while n.len() < 255 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = b'a' + (x % 26) as u8;
        n.push(if x % 7 == 0 { b | 0x80 } else { b });
    }
    n
}

fn image(dir: &Path) -> std::path::PathBuf {
    mkimg(
        dir,
        "ld.img",
        "128M",
        &["-b", "1024", "-O", "large_dir", "-N", "4096"],
    )
}

fn indirect_levels(img: &Path) -> String {
    let out = run_ok(tool("debugfs").arg("-R").arg("htree_dump /d").arg(img)).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("Indirect levels"))
        .unwrap_or("")
        .trim()
        .to_string()
}

fn want() -> BTreeSet<Vec<u8>> {
    (0..N).map(name).collect()
}

#[test]
fn third_level_written_by_the_engine_read_by_the_kernel() {
    let what = "third_level_written_by_the_engine_read_by_the_kernel";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = image(dir.path());
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let (d, _) = fs
        .mkdir(ROOT_INO, b"d", &NewInode::new(S_IFDIR | 0o755, 0, 0))
        .unwrap();
    let (f, _) = fs
        .create(ROOT_INO, b"f", &NewInode::new(S_IFREG | 0o644, 0, 0))
        .unwrap();
    // Hard links: one directory entry each, no inode to allocate.
    for i in 0..N {
        fs.link(f.ino, d.ino, &name(i)).unwrap();
    }
    for i in (0..N).step_by(97) {
        let got = fs.lookup(d.ino, &name(i)).unwrap();
        assert_eq!(got.map(|x| x.ino), Some(f.ino), "{i}");
    }
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(indirect_levels(&img), "Indirect levels: 2");
    if let Err(e) = kernel_mount_available() {
        return skip(what, &format!("kernel read back: {e}"));
    }
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let got: BTreeSet<Vec<u8>> = std::fs::read_dir(m.path().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    // And by name (the kernel's dx_probe through three levels).
    for i in (0..N).step_by(101) {
        let p = m.path().join("d").join(OsStr::from_bytes(&name(i)));
        assert!(p.exists(), "{i}");
    }
    m.unmount().unwrap();
    drop(lo);
    assert!(got == want(), "{} names, {} expected", got.len(), N);
}

#[test]
fn kernel_written_third_level_is_changed_by_the_engine() {
    let what = "kernel_written_third_level_is_changed_by_the_engine";
    if let Err(e) = e2fs_tools().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = image(dir.path());
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let d = m.path().join("d");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(m.path().join("f"), b"x").unwrap();
        for i in 0..N {
            std::fs::hard_link(m.path().join("f"), d.join(OsStr::from_bytes(&name(i)))).unwrap();
        }
        m.unmount().unwrap();
    }
    assert_eq!(indirect_levels(&img), "Indirect levels: 2");
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let d = fs.lookup(ROOT_INO, b"d").unwrap().unwrap();
    let f = fs.lookup(ROOT_INO, b"f").unwrap().unwrap();
    for i in (0..N).step_by(37) {
        let got = fs.lookup(d.ino, &name(i)).unwrap();
        assert_eq!(got.map(|x| x.ino), Some(f.ino), "{i}");
    }
    for i in (0..N).step_by(64) {
        fs.unlink(d.ino, &name(i)).unwrap();
    }
    for i in N..N + 2000 {
        fs.link(f.ino, d.ino, &name(i)).unwrap();
    }
    assert!(fs.lookup(d.ino, &name(0)).unwrap().is_none());
    assert!(fs.lookup(d.ino, &name(N + 1999)).unwrap().is_some());
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}
