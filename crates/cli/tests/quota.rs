//! Quota and project quota read-write (issue 20): images made with
//! `-O quota,project` (mke2fs and ext4kit mkfs) changed by the image tools
//! stay clean for `e2fsck -fn`, whose pass 5 compares every id's usage
//! with the quota files ("[QUOTA WARNING] Usage inconsistent").

mod common;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use common::fuse::FuseMount;
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

/// `debugfs -R "lq TYPE"`: id -> (bytes, inodes).
fn debugfs_lq(img: &Path, qtype: &str) -> BTreeMap<u32, (u64, u64)> {
    let out = run_ok(
        tool("debugfs")
            .arg("-R")
            .arg(format!("lq {qtype}"))
            .arg(img),
    )
    .unwrap();
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() >= 5
            && let (Ok(id), Ok(space), Ok(inodes)) = (
                w[0].parse::<u32>(),
                w[1].parse::<u64>(),
                w[4].parse::<u64>(),
            )
        {
            m.insert(id, (space, inodes));
        }
    }
    m
}

fn sh(dir: &Path, script: &str) {
    run_ok(tool("sh").arg("-c").arg(script).current_dir(dir))
        .unwrap_or_else(|e| panic!("{script}: {e}"));
}

/// The same through the mount: files, writes, truncates, fallocate, an
/// xattr block, chown, links, renames, an unlinked open file, O_TMPFILE,
/// a PROJINHERIT directory (`chattr -p 42 +P`: new inodes take its id, a
/// rename of another project's file into it is EXDEV), a project id
/// change (`chattr -p`), then `e2fsck -fn` clean and `debugfs lq`
/// showing the project's usage. Both transports.
#[test]
fn mount_keeps_quota_exact() {
    if let Err(r) = fuse_available() {
        return skip("mount_keeps_quota_exact", &r);
    }
    for transport in [None, Some("transport=ext4kit")] {
        let dir = image_dir();
        let mut args = vec!["-b", "4096"];
        args.extend(QUOTA_ARGS);
        let img = mkimg(dir.path(), "m.img", "64M", &args);
        let opts: Vec<&str> = transport.into_iter().collect();
        let m = FuseMount::new(&img, &opts).unwrap();
        let p = m.path().to_path_buf();
        fs::create_dir(p.join("d")).unwrap();
        fs::write(p.join("d/a"), pattern(100_000, 3)).unwrap();
        std::os::unix::fs::chown(p.join("d/a"), Some(1234), Some(567)).unwrap();
        fs::write(p.join("big"), pattern(3 << 20, 4)).unwrap();
        let f = OpenOptions::new().write(true).open(p.join("big")).unwrap();
        f.set_len(1 << 20).unwrap();
        f.set_len(5 << 20).unwrap();
        drop(f);
        sh(
            &p,
            "setfattr -n user.big -v 0x$(printf '%02x' $(seq 1 1500) | head -c 3000) d/a \
             && fallocate -l 2M d/falloc && chown 99:98 d/falloc \
             && ln d/a d/a2 && mv d/a2 a3 && rm big && mkdir -p d/x/y \
             && chown -R 4000:4001 d/x && cp -r d d2 && rm -r d2/x",
        );
        // An unlinked open file, then an O_TMPFILE one.
        let mut f = fs::File::create(p.join("open")).unwrap();
        f.write_all(&pattern(70_000, 5)).unwrap();
        fs::remove_file(p.join("open")).unwrap();
        f.write_all(&pattern(9000, 6)).unwrap();
        drop(f);
        match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(p.join("d"))
        {
            Ok(mut t) => t.write_all(&pattern(20_000, 7)).unwrap(),
            Err(e) => eprintln!("O_TMPFILE not passed through: {e}"),
        }
        // Project 42.
        fs::create_dir(p.join("proj")).unwrap();
        sh(&p, "chattr -p 42 +P proj && lsattr -pd proj");
        fs::write(p.join("proj/f"), pattern(50_000, 8)).unwrap();
        fs::create_dir(p.join("proj/sub")).unwrap();
        fs::write(p.join("proj/sub/g"), pattern(5000, 9)).unwrap();
        let e = fs::rename(p.join("d/a"), p.join("proj/a")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
        let e = fs::hard_link(p.join("d/a"), p.join("proj/a")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
        fs::rename(p.join("proj/f"), p.join("proj/sub/f")).unwrap();
        // mv falls back to a copy across projects.
        sh(
            &p,
            "mv d/falloc proj/ && chattr -p 7 proj/sub/g && lsattr -p proj/sub/g",
        );
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        let prj = debugfs_lq(&img, "project");
        // proj, proj/sub, proj/sub/f and the copied falloc in 42; g in 7.
        assert_eq!(prj.get(&42).map(|u| u.1), Some(4), "{prj:?}");
        assert_eq!(prj.get(&7).map(|u| u.1), Some(1), "{prj:?}");
        let usr = debugfs_lq(&img, "user");
        assert_eq!(usr.get(&1234).map(|u| u.1), Some(1), "{usr:?}");
    }
}
