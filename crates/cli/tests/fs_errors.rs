//! Errors recorded as ext4 records them: a corrupt inode met by an
//! operation fails it (EFSCORRUPTED/EFSBADCRC), the superblock gets the
//! error state and the first/last error fields (dumpe2fs shows them, e2fsck
//! sees "a file system with errors", `ext4kit info` shows them);
//! errors=remount-ro refuses later writes with EROFS while reads go on,
//! errors=continue goes on; the superblock's `s_errors` applies without an
//! option; the fields survive a journal replay at the next open.

mod common;

use std::fs::OpenOptions as StdOpen;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use ext4kit_format::inode::S_IFREG;
use ext4kit_format::superblock::{STATE_ERROR, SUPERBLOCK_OFFSET, Superblock};
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::{ErrorBehavior, RwOptions};

/// The primary superblock on disk.
fn superblock(img: &Path) -> Superblock {
    let mut raw = vec![0u8; 1024];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut raw, SUPERBLOCK_OFFSET)
        .unwrap();
    let sb = Superblock::parse(&raw).unwrap();
    assert!(sb.checksum_ok(), "superblock checksum");
    sb
}

fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// An image with files "a" (intact) and "bad" whose inode's checksum no
/// longer matches (one byte of its mtime flipped). Returns bad's inode.
fn image_with_bad_inode(img: &Path) -> u32 {
    let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let (a, _) = fs.create(2, b"a", &spec).unwrap();
    fs.write_at(a.ino, 0, b"intact").unwrap();
    let (bad, _) = fs.create(2, b"bad", &spec).unwrap();
    fs.write_at(bad.ino, 0, b"soon corrupt").unwrap();
    let (blk, off) = fs.inode_location(bad.ino).unwrap();
    let bs = u64::from(fs.rw().geometry().block_size);
    fs.close().unwrap();
    let f = StdOpen::new().read(true).write(true).open(img).unwrap();
    let at = blk * bs + off as u64 + 0x10;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, at).unwrap();
    bad.ino
}

/// e2fsck -n (no -f) names the error state as its reason to check.
fn e2fsck_sees_errors(img: &Path) {
    let out = run(tool("e2fsck").arg("-n").arg(img)).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("contains a file system with errors"),
        "e2fsck -n: {text}"
    );
}

fn opts(errors: Option<ErrorBehavior>) -> RwOptions {
    RwOptions {
        errors,
        ..RwOptions::default()
    }
}

#[test]
fn remount_ro_records_the_error_and_refuses_writes() {
    if let Err(r) = e2fs_tools() {
        return skip("remount_ro_records_the_error_and_refuses_writes", &r);
    }
    let dir = image_dir();
    // Both ways to ask for remount-ro: the option, and s_errors without
    // an option.
    for (name, mkfs_args, errors) in [
        ("opt.img", vec![], Some(ErrorBehavior::RemountRo)),
        ("sb.img", vec!["-e", "remount-ro"], None),
    ] {
        let img = mkimg(dir.path(), name, "16M", &mkfs_args);
        let bad = image_with_bad_inode(&img);
        let fs = Filesystem::open(open_file(&img), opts(errors)).unwrap();
        assert_eq!(fs.rw().error_behavior(), ErrorBehavior::RemountRo);
        // A committed change before the error: its log is replayed at the
        // next open, over the directly written superblock.
        let spec = NewInode::new(S_IFREG | 0o600, 0, 0);
        fs.create(2, b"before", &spec).unwrap();
        fs.sync().unwrap();
        let e = fs.write_at(bad, 0, b"x").unwrap_err();
        assert!(e.is_corruption(), "{e}");
        assert_eq!(e.errno(), 74, "EFSBADCRC");
        assert!(!e.to_string().contains('\n'));
        // Further writes: EROFS; reads go on.
        let e = fs.create(2, b"after", &spec).unwrap_err();
        assert!(matches!(e, FsError::ReadOnly(_)), "{e}");
        assert_eq!(e.errno(), 30);
        let a = fs.lookup(2, b"a").unwrap().unwrap();
        let mut buf = [0u8; 6];
        fs.read_at(a.ino, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"intact");
        assert!(fs.lookup(2, b"before").unwrap().is_some());
        fs.close().unwrap();

        let sb = superblock(&img);
        assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
        assert_eq!(sb.s_error_count.get(), 1);
        assert_eq!(c_str(&sb.s_first_error_func), "write_at");
        assert_eq!(sb.s_first_error_ino.get(), bad);
        assert_eq!(sb.s_first_error_errcode, 4, "EFSBADCRC");
        assert_ne!(sb.s_first_error_time.get(), 0);
        assert_ne!(sb.s_first_error_line.get(), 0);
        assert_eq!(c_str(&sb.s_last_error_func), "write_at");
        let d = dumpe2fs_h(&img);
        assert!(d.contains("FS Error count:           1"), "{d}");
        assert!(d.contains("First error function:     write_at"), "{d}");
        assert!(
            d.contains(&format!("First error inode #:      {bad}")),
            "{d}"
        );
        assert!(d.contains("First error err:          EFSBADCRC"), "{d}");
        e2fsck_sees_errors(&img);
        let out = run_ok(ext4kit().arg("info").arg(&img)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("with errors"), "{text}");
        assert!(text.contains("error count:         1"), "{text}");
        assert!(
            text.contains("first error:         ") && text.contains("write_at:"),
            "{text}"
        );
        assert!(text.contains(&format!("inode {bad}")), "{text}");
        assert!(text.contains("EFSBADCRC"), "{text}");
        let out = run_ok(ext4kit().args(["info", "--json"]).arg(&img)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["error_count"], 1);
        assert_eq!(v["first_error"]["function"], "write_at");
        assert_eq!(v["first_error"]["inode"], bad);
        assert_eq!(v["first_error"]["errcode"], "EFSBADCRC");

        // The next open replays the log (which holds an older superblock)
        // and keeps the error fields, as the kernel's ext4_load_journal.
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        assert!(fs.lookup(2, b"before").unwrap().is_some());
        fs.close().unwrap();
        let sb = superblock(&img);
        assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
        assert_eq!(sb.s_error_count.get(), 1);
        assert_eq!(c_str(&sb.s_first_error_func), "write_at");
    }
}

#[test]
fn continue_records_the_error_and_goes_on() {
    if let Err(r) = e2fs_tools() {
        return skip("continue_records_the_error_and_goes_on", &r);
    }
    let dir = image_dir();
    // mke2fs's default s_errors is continue.
    let img = mkimg(dir.path(), "c.img", "16M", &[]);
    let bad = image_with_bad_inode(&img);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert_eq!(fs.rw().error_behavior(), ErrorBehavior::Continue);
    let e = fs.truncate(bad, 0).unwrap_err();
    assert!(e.is_corruption(), "{e}");
    let e = fs.inode(bad).unwrap_err();
    assert!(e.is_corruption(), "{e}");
    let spec = NewInode::new(S_IFREG | 0o600, 0, 0);
    let (g, _) = fs.create(2, b"after", &spec).unwrap();
    fs.write_at(g.ino, 0, b"still writable").unwrap();
    fs.close().unwrap();
    let sb = superblock(&img);
    assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
    assert_eq!(sb.s_error_count.get(), 2);
    assert_eq!(c_str(&sb.s_first_error_func), "truncate");
    assert_eq!(c_str(&sb.s_last_error_func), "inode");
    assert_eq!(sb.s_last_error_ino.get(), bad);
    e2fsck_sees_errors(&img);
    // The option overrides s_errors.
    let fs = Filesystem::open(open_file(&img), opts(Some(ErrorBehavior::RemountRo))).unwrap();
    assert!(fs.write_at(bad, 0, b"x").is_err());
    assert!(matches!(
        fs.create(2, b"no", &spec),
        Err(FsError::ReadOnly(_))
    ));
    fs.close().unwrap();
    assert_eq!(superblock(&img).s_error_count.get(), 3);
}

/// The first operation to meet an aborted journal (here aborted by hand,
/// as a failed write would) records it as the kernel's "Detected aborted
/// journal" does (EIO) and fails with EROFS; the filesystem is read-only
/// from then on, and it is recorded once.
#[test]
fn an_aborted_journal_is_recorded_once() {
    if let Err(r) = e2fs_tools() {
        return skip("an_aborted_journal_is_recorded_once", &r);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "a.img", "16M", &[]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    fs.rw()
        .journal()
        .abort_journal(&FsError::InvalidRequest("a test".into()));
    let spec = NewInode::new(S_IFREG | 0o600, 0, 0);
    let e = fs.create(2, b"x", &spec).unwrap_err();
    assert!(matches!(e, FsError::Aborted(_)), "{e}");
    assert_eq!(e.errno(), 30);
    let e = fs.create(2, b"y", &spec).unwrap_err();
    assert!(matches!(e, FsError::ReadOnly(_)), "{e}");
    assert!(fs.lookup(2, b"lost+found").unwrap().is_some());
    fs.close().unwrap();
    let sb = superblock(&img);
    assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
    assert_eq!(sb.s_error_count.get(), 1);
    assert_eq!(c_str(&sb.s_first_error_func), "create");
    assert_eq!(sb.s_first_error_errcode, 2, "EIO");
    // The next open replays nothing, keeps the record and clears the
    // journal's s_errno.
    Filesystem::open(open_file(&img), RwOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let sb = superblock(&img);
    assert_eq!(sb.s_error_count.get(), 1);
    assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
}
