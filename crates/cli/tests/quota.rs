//! Quota and project quota read-write (issue 20): images made with
//! `-O quota,project` (mke2fs and ext4kit mkfs) changed by the image tools
//! stay clean for `e2fsck -fn`, whose pass 5 compares every id's usage
//! with the quota files ("[QUOTA WARNING] Usage inconsistent").

mod common;

use std::fs;
use std::path::Path;

use common::*;

const QUOTA_ARGS: [&str; 4] = [
    "-O",
    "quota,project",
    "-E",
    "quotatype=usrquota:grpquota:prjquota",
];

/// Many tool operations on `img`, `e2fsck -fn` clean after each.
fn tool_ops(img: &Path, host: &Path) {
    let at = |p: &str| format!("{}:{p}", img.display());
    let ok = |args: &[&str], p: &str| {
        run_ok(ext4kit().args(args).arg(at(p))).unwrap();
        e2fsck_clean(img).unwrap_or_else(|e| panic!("{args:?} {p}: {e}"));
    };
    let ok2 = |args: &[&str], a: &str, b: &str| {
        run_ok(ext4kit().args(args).arg(at(a)).arg(at(b))).unwrap();
        e2fsck_clean(img).unwrap_or_else(|e| panic!("{args:?} {a} {b}: {e}"));
    };
    run_ok(ext4kit().args(["cp", "-a"]).arg(host).arg(at("/"))).unwrap();
    e2fsck_clean(img).unwrap_or_else(|e| panic!("cp -a: {e}"));
    ok(&["mkdir", "-p"], "/a/b/c");
    ok(&["chown", "70000:4242"], "/src/f");
    ok(&["chown", "1000:1000"], "/src/d");
    ok(&["chown", "1001:1002"], "/src/d/e/h");
    // Enough new ids for more than one data block of entries (14 per 1 KiB
    // quota block) and new tree blocks: the quota files grow.
    for i in 0..40u32 {
        let p = format!("/a/b/f{i}");
        run_ok(ext4kit().arg("cp").arg(host.join("f")).arg(at(&p))).unwrap();
        let owner = format!("{}:{}", 5000 + i * 257, 9000 + i * 65_537);
        run_ok(ext4kit().args(["chown", &owner]).arg(at(&p))).unwrap();
    }
    e2fsck_clean(img).unwrap_or_else(|e| panic!("40 owners: {e}"));
    ok(&["truncate", "-s", "5000"], "/src/f");
    ok(&["truncate", "-s", "3M"], "/src/f");
    ok(&["fallocate", "-l", "1M"], "/a/b/f3");
    ok2(&["ln"], "/src/f", "/a/f-link");
    ok2(&["mv"], "/src/d", "/a/b/c/d");
    ok(&["rm"], "/a/f-link");
    ok(&["rm"], "/src/f");
    for i in (0..40u32).step_by(3) {
        ok(&["rm"], &format!("/a/b/f{i}"));
    }
    ok(&["rm", "-r"], "/a/b/c");
    ok(&["rm", "-r"], "/src");
}

fn host_tree(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("d/e")).unwrap();
    fs::write(src.join("f"), pattern(100_000, 1)).unwrap();
    fs::write(src.join("d/g"), b"hello").unwrap();
    fs::write(src.join("d/e/h"), pattern(9000, 2)).unwrap();
    std::os::unix::fs::symlink("f", src.join("l")).unwrap();
    std::os::unix::fs::symlink("x".repeat(200), src.join("d/long")).unwrap();
    src
}

#[test]
fn tools_keep_mke2fs_quota_exact() {
    if let Err(r) = e2fs_tools() {
        return skip("tools_keep_mke2fs_quota_exact", &r);
    }
    for bs in ["1024", "4096"] {
        let dir = image_dir();
        let host = host_tree(dir.path());
        let mut args = vec!["-b", bs];
        args.extend(QUOTA_ARGS);
        let img = mkimg(dir.path(), "q.img", "64M", &args);
        e2fsck_clean(&img).unwrap();
        tool_ops(&img, &host);
    }
}

#[test]
fn tools_keep_ext4kit_mkfs_quota_exact() {
    if let Err(r) = e2fs_tools() {
        return skip("tools_keep_ext4kit_mkfs_quota_exact", &r);
    }
    let dir = image_dir();
    let host = host_tree(dir.path());
    let img = dir.path().join("q.img");
    run_ok(tool("truncate").args(["-s", "64M"]).arg(&img)).unwrap();
    run_ok(ext4kit_mkfs(QUOTA_ARGS).args(["-q", "-F"]).arg(&img)).unwrap();
    e2fsck_clean(&img).unwrap();
    tool_ops(&img, &host);
}
