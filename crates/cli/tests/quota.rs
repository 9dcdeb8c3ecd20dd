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
    engine_usage_is_debugfs_lq(img);
}

/// The engine's view of the quota files (`Filesystem::quota_usage`)
/// equals `debugfs lq`'s, type by type.
fn engine_usage_is_debugfs_lq(img: &Path) {
    use ext4kit_fs::fs::Filesystem;
    use ext4kit_fs::rw::RwOptions;
    let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
    let usage: Vec<_> = (0..3).map(|t| fs.quota_usage(t).unwrap()).collect();
    fs.close().unwrap();
    for (t, name) in ["user", "group", "project"].into_iter().enumerate() {
        let lq = debugfs_lq(img, name);
        let ours: BTreeMap<u32, (u64, u64)> = usage[t]
            .iter()
            .filter(|(_, u)| **u != (0, 0))
            .map(|(k, v)| (*k, *v))
            .collect();
        let theirs: BTreeMap<u32, (u64, u64)> =
            lq.into_iter().filter(|(_, u)| *u != (0, 0)).collect();
        assert_eq!(ours, theirs, "{name} quota of {}", img.display());
    }
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
    let cases: [&[&str]; 3] = [
        &[
            "-b",
            "1024",
            "-O",
            "quota,project",
            "-E",
            "quotatype=usrquota:grpquota:prjquota",
        ],
        &[
            "-b",
            "4096",
            "-O",
            "quota,project",
            "-E",
            "quotatype=usrquota:grpquota:prjquota",
        ],
        // User and group quota only, 128-byte inodes (no project ids).
        &["-b", "4096", "-I", "128", "-O", "quota"],
    ];
    for args in cases {
        let dir = image_dir();
        let host = host_tree(dir.path());
        let img = mkimg(dir.path(), "q.img", "64M", args);
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

/// A power cut at every write (sampled: about 40 cuts per mode) of a
/// workload that inserts new ids (the quota files grow), writes,
/// chowns, truncates, deletes a large file over several handles and
/// moves a project: after ext4kit's recovery (replay, orphans) and close,
/// `e2fsck -fn` is clean, so the usage was exact in every committed state.
#[test]
fn crash_at_every_write_keeps_quota_exact() {
    if let Err(r) = e2fs_tools() {
        return skip("crash_at_every_write_keeps_quota_exact", &r);
    }
    use ext4kit_device::{CutMode, Device, MemDevice};
    use ext4kit_format::inode::{S_IFDIR, S_IFREG};
    use ext4kit_fs::fs::{Filesystem, NewInode, SetAttr};
    use ext4kit_fs::rw::RwOptions;
    use std::sync::Arc;
    let dir = image_dir();
    let mut args = vec!["-b", "1024"];
    args.extend(QUOTA_ARGS);
    let img = mkimg(dir.path(), "c.img", "16M", &args);
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let run = |dev: Arc<dyn Device>| -> Result<(), ext4kit_fs::FsError> {
        let fs = Filesystem::open(dev, RwOptions::default())?;
        let (d, _) = fs.mkdir(2, b"d", &NewInode::new(S_IFDIR | 0o755, 0, 0))?;
        let (big, _) = fs.create(2, b"big", &NewInode::new(S_IFREG | 0o644, 7, 7))?;
        fs.write_at(big.ino, 0, &pattern(600_000, 1))?;
        fs.sync()?;
        for i in 0..20u32 {
            let name = format!("f{i}");
            let (f, _) = fs.create(
                d.ino,
                name.as_bytes(),
                &NewInode::new(S_IFREG | 0o644, 0, 0),
            )?;
            fs.write_at(f.ino, 0, &pattern(3000 + i as usize * 100, 2))?;
            let a = SetAttr {
                uid: Some(10_000 + i * 300),
                gid: Some(20_000 + i * 70_000),
                ..Default::default()
            };
            fs.setattr(f.ino, &a)?;
            fs.set_projid(f.ino, 100 + i)?;
        }
        fs.sync()?;
        fs.truncate(big.ino, 100_000)?;
        fs.unlink(2, b"big")?;
        fs.unlink(d.ino, b"f3")?;
        fs.close()
    };
    let one = |cut: Option<u64>, mode: CutMode| {
        let (mem, r, ops) = run_cut(&base, cut, mode, run);
        (mem, r.is_ok(), ops)
    };
    let (mem, ok, ops) = one(None, CutMode::DropAll);
    assert!(ok);
    let out = dir.path().join("cut.img");
    fs::write(&out, mem.to_bytes()).unwrap();
    e2fsck_clean(&out).unwrap_or_else(|e| panic!("no cut: {e}"));
    let step = (ops / 40).max(1);
    let mut checked = 0;
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 5,
            torn: false,
        },
    ] {
        for cut in (1..ops).step_by(step as usize) {
            let (mem, _, _) = one(Some(cut), mode);
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            fs.close().unwrap();
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 20);
}

/// The kernel reads what the tools wrote to a quota image. A kernel
/// without quota support (CONFIG_QUOTA and CONFIG_QFMT_V2, as this one:
/// QFMT_V2 off) refuses quota images read-write, also mke2fs's own: the
/// read-write part is skipped with the kernel's reason, the read-only
/// mount (which ext4 allows without quota support) still checks the
/// contents.
#[test]
fn kernel_reads_a_quota_image_the_tools_changed() {
    const TEST: &str = "kernel_reads_a_quota_image_the_tools_changed";
    if let Err(r) = e2fs_tools().and_then(|_| kernel_mount_available()) {
        return skip(TEST, &r);
    }
    let dir = image_dir();
    let host = host_tree(dir.path());
    let mut args = vec!["-b", "4096"];
    args.extend(QUOTA_ARGS);
    let img = mkimg(dir.path(), "k.img", "64M", &args);
    let at = |p: &str| format!("{}:{p}", img.display());
    run_ok(ext4kit().args(["cp", "-a"]).arg(&host).arg(at("/"))).unwrap();
    run_ok(ext4kit().args(["chown", "70000:4242"]).arg(at("/src/f"))).unwrap();
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    match Mount::new(lo.path(), "ext4", None) {
        Ok(m) => {
            // A kernel with quota support: it keeps the usage too.
            fs::write(m.path().join("kernel-file"), pattern(40_000, 9)).unwrap();
            m.unmount().unwrap();
        }
        Err(e) => {
            // The kernel says why ("not built with CONFIG_QUOTA and
            // CONFIG_QFMT_V2").
            let dev = lo.path().file_name().unwrap().to_string_lossy().to_string();
            let log =
                run(&mut tool("dmesg")).map(|o| String::from_utf8_lossy(&o.stdout).to_string());
            let why = log
                .ok()
                .and_then(|l| {
                    l.lines()
                        .rev()
                        .find(|l| l.contains(&dev))
                        .map(str::to_string)
                })
                .unwrap_or(e);
            skip(
                &format!("{TEST} (read-write mount)"),
                &format!("the kernel refuses quota images read-write: {why}"),
            )
        }
    }
    let m = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let got = fs::read(m.path().join("src/f")).unwrap();
    assert!(got == fs::read(host.join("f")).unwrap());
    let md = fs::metadata(m.path().join("src/f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((md.uid(), md.gid()), (70000, 4242));
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
}
