//! The orphan file (orphan_file feature): an inode unlinked while open is
//! recorded in the orphan file's blocks (not on the old `s_last_orphan`
//! list); `orphan_present` is set in the transaction that fills the first
//! slot and cleared in the one that empties the file. Released, it leaves; after a crash ext4kit's next
//! open frees it, and so does the kernel's mount; an orphan the kernel
//! left in the orphan file (shutdown without log flush with the file
//! still open) is freed by ext4kit's open. e2fsck clean every way, with
//! the fresh image's counts.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use ext4kit_format::features::RoCompat;
use ext4kit_format::inode::S_IFREG;
use ext4kit_format::superblock::{SUPERBLOCK_OFFSET, Superblock};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

fn superblock(img: &Path) -> Superblock {
    let mut raw = vec![0u8; 1024];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut raw, SUPERBLOCK_OFFSET)
        .unwrap();
    Superblock::parse(&raw).unwrap()
}

fn orphan_present(img: &Path) -> bool {
    RoCompat(superblock(img).s_feature_ro_compat.get()).contains(RoCompat::ORPHAN_PRESENT)
}

/// Create "f" (200 000 bytes), unlink it while open; the orphan is in
/// the orphan file. Returns the open filesystem and the inode.
fn setup(img: &Path) -> (Filesystem, u32) {
    let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
    let (f, _) = fs
        .create(2, b"f", &NewInode::new(S_IFREG | 0o644, 0, 0))
        .unwrap();
    fs.write_at(f.ino, 0, &vec![0x5a; 200_000]).unwrap();
    let (_, orphan) = fs.unlink_open(2, b"f").unwrap();
    assert!(orphan);
    let of = fs.orphan_file().expect("orphan file");
    assert!(of.contains(f.ino));
    assert_eq!(of.entries(), vec![f.ino]);
    let sb = fs.rw().superblock().unwrap();
    assert_eq!(sb.s_last_orphan.get(), 0);
    // Set in the transaction that fills the first slot.
    assert!(RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::ORPHAN_PRESENT));
    let mut b = vec![0u8; 10];
    fs.read_at(f.ino, 100, &mut b).unwrap();
    assert_eq!(b, vec![0x5a; 10]);
    fs.sync().unwrap();
    (fs, f.ino)
}

fn same_summary(before: &str, base: &Path, img: &Path) {
    assert_eq!(
        e2fsck_clean(img).unwrap(),
        before.replace(&base.display().to_string(), &img.display().to_string())
    );
}

#[test]
fn unlinked_open_files_go_to_the_orphan_file() {
    if let Err(r) = e2fs_tools() {
        return skip("unlinked_open_files_go_to_the_orphan_file", &r);
    }
    let dir = image_dir();
    let base = mkimg(dir.path(), "o.img", "32M", &["-O", "orphan_file"]);
    assert!(!orphan_present(&base));
    let before = e2fsck_clean(&base).unwrap();

    // Released on the last close; the clean close clears orphan_present.
    let img = dir.path().join("a.img");
    sparse_copy(&base, &img);
    let (fs, ino) = setup(&img);
    fs.release_orphan(ino).unwrap();
    assert!(fs.orphan_file().unwrap().is_empty());
    fs.close().unwrap();
    assert!(!orphan_present(&img));
    same_summary(&before, &base, &img);

    // A crash with the orphan pending: ext4kit's next open frees it.
    let img = dir.path().join("b.img");
    sparse_copy(&base, &img);
    let (fs, _) = setup(&img);
    fs.crash();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert!(fs.orphan_file().unwrap().is_empty());
    fs.close().unwrap();
    assert!(!orphan_present(&img));
    same_summary(&before, &base, &img);

    // A close with the orphan still pending keeps orphan_present (the
    // next open frees it).
    let img = dir.path().join("c.img");
    sparse_copy(&base, &img);
    let (fs, _) = setup(&img);
    fs.close().unwrap();
    assert!(orphan_present(&img));
    Filesystem::open(open_file(&img), RwOptions::default())
        .unwrap()
        .close()
        .unwrap();
    assert!(!orphan_present(&img));
    same_summary(&before, &base, &img);

    if let Err(r) = kernel_mount_available() {
        return skip(
            "unlinked_open_files_go_to_the_orphan_file (kernel part)",
            &r,
        );
    }
    // The same crash replayed and cleaned up by the kernel's mount.
    let img = dir.path().join("k.img");
    sparse_copy(&base, &img);
    let (fs, _) = setup(&img);
    fs.crash();
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        m.unmount().unwrap();
    }
    same_summary(&before, &base, &img);

    // The kernel leaves an orphan in the orphan file (unlink while open,
    // the directory fsynced, then a shutdown without log flush while the
    // file is still open); ext4kit's open replays and frees it.
    let img = dir.path().join("kw.img");
    sparse_copy(&base, &img);
    let ino: u32 = {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let script = r#"
import os, fcntl, struct, sys
d = sys.argv[1]
fd = os.open(d + "/g", os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"k" * 300000)
os.fsync(fd)
os.unlink(d + "/g")
dfd = os.open(d, os.O_RDONLY)
os.fsync(dfd)
print(os.fstat(fd).st_ino)
fcntl.ioctl(dfd, 0x8004587D, struct.pack("I", 2))
"#;
        let out = run_ok(tool("python3").arg("-c").arg(script).arg(m.path())).unwrap();
        m.unmount().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let sb = superblock(&img);
    assert!(
        RoCompat(sb.s_feature_ro_compat.get()).contains(RoCompat::ORPHAN_PRESENT),
        "the kernel left orphan_present"
    );
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert!(fs.orphan_file().unwrap().is_empty());
    let i = fs.inode_any(ino).unwrap();
    assert_eq!(i.links, 0);
    assert_ne!(i.dtime, 0, "inode {ino} freed");
    fs.close().unwrap();
    same_summary(&before, &base, &img);
}

/// A full orphan file (one block: 254 slots with 1 KiB blocks) sends the
/// next orphan to the old list, as the kernel falls back; after a crash
/// the next open frees both the list's and the file's orphans.
#[test]
fn a_full_orphan_file_falls_back_to_the_list() {
    if let Err(r) = e2fs_tools() {
        return skip("a_full_orphan_file_falls_back_to_the_list", &r);
    }
    let dir = image_dir();
    let base = mkimg(
        dir.path(),
        "full.img",
        "16M",
        &[
            "-b",
            "1024",
            "-O",
            "orphan_file",
            "-E",
            "orphan_file_size=1",
        ],
    );
    let before = e2fsck_clean(&base).unwrap();
    let img = dir.path().join("f.img");
    sparse_copy(&base, &img);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let slots = (1024 - 8) / 4;
    let mut inos = Vec::new();
    for i in 0..=slots {
        let name = format!("f{i}");
        let (f, _) = fs
            .create(2, name.as_bytes(), &NewInode::new(S_IFREG | 0o644, 0, 0))
            .unwrap();
        fs.write_at(f.ino, 0, b"ten bytes.").unwrap();
        assert!(fs.unlink_open(2, name.as_bytes()).unwrap().1);
        inos.push(f.ino);
    }
    let of = fs.orphan_file().unwrap();
    assert_eq!(of.entries(), inos[..slots]);
    let last = inos[slots];
    assert!(!of.contains(last));
    assert_eq!(fs.rw().superblock().unwrap().s_last_orphan.get(), last);
    fs.sync().unwrap();
    fs.crash();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert!(fs.orphan_file().unwrap().is_empty());
    assert_eq!(fs.rw().superblock().unwrap().s_last_orphan.get(), 0);
    fs.close().unwrap();
    assert!(!orphan_present(&img));
    same_summary(&before, &base, &img);
}
