//! Promises of the kernel's ext4 that `ext4kit mount` keeps (issue 23),
//! each checked side by side with the kernel's ext4 on a loop mount of
//! the same image where the test can loop-mount (else against the values
//! the kernel gives, written down here): times past the inode's range
//! clamp instead of wrapping; statfs's counts (f_bavail holds back the
//! reserved-clusters pool) and the UUID's fsid; a stale mount point is
//! named as one; atime updates (relatime, strictatime, noatime,
//! nodiratime, lazytime); suid/dev/exec as mount(8), as root.
//!
//! Every mount is made on a temporary directory and unmounted by a guard
//! (also on failure); the tests need root and /dev/fuse and say `SKIP`
//! otherwise.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::fuse::*;
use common::*;

/// A fresh `ext4kit mkfs` image with `inode_size`-byte inodes.
fn mkfs_inodes(dir: &Path, name: &str, inode_size: u32) -> PathBuf {
    let img = dir.join(name);
    let _ = fs::remove_file(&img);
    run_ok(&mut ext4kit_mkfs([
        "-q",
        "-F",
        "-b",
        "4096",
        "-I",
        &inode_size.to_string(),
        "-U",
        UUID,
        "-E",
        "nodiscard",
        img.to_str().unwrap(),
        "64M",
    ]))
    .unwrap();
    img
}

/// A loop-mount of a copy of `img` by the kernel's ext4, or why not.
fn kernel_copy(img: &Path, name: &str) -> Result<(PathBuf, LoopDev, Mount), String> {
    kernel_mount_available()?;
    let t = KernelTwin::new(img, img.with_file_name(name), None)?;
    Ok((t.copy, t.lo, t.mount))
}

/// (atime, mtime) of `p` as (seconds, nanoseconds).
fn am_times(p: &Path) -> ((i64, i64), (i64, i64)) {
    let md = fs::metadata(p).unwrap();
    ((md.atime(), md.atime_nsec()), (md.mtime(), md.mtime_nsec()))
}

/// `touch -d` times around the ends of ext4's range (UTC), each with
/// what the kernel's ext4 stores for 256-byte and for 128-byte inodes.
const TIMES: &[(&str, i64, i64, i64, i64)] = &[
    ("2500-01-01", 15_032_385_535, 0, 2_147_483_647, 0),
    ("2446-05-10 22:38:55.5", 15_032_385_535, 0, 2_147_483_647, 0),
    (
        "2446-05-10 22:38:54.25",
        15_032_385_534,
        250_000_000,
        2_147_483_647,
        0,
    ),
    (
        "2038-01-19 03:14:08.5",
        2_147_483_648,
        500_000_000,
        2_147_483_647,
        0,
    ),
    (
        "2200-01-01 12:00:00.123456789",
        7_258_161_600,
        123_456_789,
        2_147_483_647,
        0,
    ),
    ("1970-01-01 00:00:00.5", 0, 500_000_000, 0, 0),
    ("1969-12-31 23:59:58.5", -2, 500_000_000, -2, 0),
    (
        "1901-12-13 20:45:52.5",
        -2_147_483_648,
        0,
        -2_147_483_648,
        0,
    ),
    ("1800-01-01", -2_147_483_648, 0, -2_147_483_648, 0),
];

/// `touch -d T` on one new file per time in [`TIMES`] under `root`; the
/// (atime, mtime) each then has.
fn touch_script(root: &Path) -> Vec<((i64, i64), (i64, i64))> {
    TIMES
        .iter()
        .enumerate()
        .map(|(i, (t, ..))| {
            let p = root.join(format!("t{i}"));
            File::create(&p).unwrap();
            run_ok(tool("touch").arg("-d").arg(format!("{t} UTC")).arg(&p)).unwrap();
            am_times(&p)
        })
        .collect()
}

fn read_times(root: &Path) -> Vec<((i64, i64), (i64, i64))> {
    (0..TIMES.len())
        .map(|i| am_times(&root.join(format!("t{i}"))))
        .collect()
}

/// `touch -d 2500-01-01` gives 2446-05-10 22:38:55 as on the kernel's
/// ext4 (it gave 1955: the seconds wrapped), `1800-01-01` gives
/// 1901-12-13 20:45:52, and on 128-byte inodes the signed 32-bit range
/// (2038-01-19 03:14:07) without nanoseconds; what the mount stored reads
/// back the same on a kernel mount of the image, and e2fsck is clean.
#[test]
fn times_past_the_range_clamp_as_kernel_ext4() {
    let what = "times_past_the_range_clamp_as_kernel_ext4";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("touch") {
        return skip(what, "touch not found");
    }
    let dir = image_dir();
    let mut kernel_checked = false;
    for inode_size in [256u32, 128] {
        let img = mkfs_inodes(dir.path(), &format!("i{inode_size}.img"), inode_size);
        let want: Vec<_> = TIMES
            .iter()
            .map(|&(_, s, ns, s128, ns128)| {
                let t = if inode_size == 128 {
                    (s128, ns128)
                } else {
                    (s, ns)
                };
                (t, t)
            })
            .collect();
        // The kernel's ext4 on a copy, where it can loop-mount.
        match kernel_copy(&img, &format!("k{inode_size}.img")) {
            Ok((copy, lo, km)) => {
                let kernel = touch_script(km.path());
                km.unmount().unwrap();
                drop(lo);
                e2fsck_clean(&copy).unwrap();
                assert_eq!(kernel, want, "the kernel's ext4, {inode_size}-byte inodes");
                kernel_checked = true;
            }
            Err(e) => eprintln!("note: {what}: no kernel comparison ({e})"),
        }
        let m = FuseMount::new(&img, &[]).unwrap();
        let ours = touch_script(m.path());
        m.unmount().unwrap();
        assert_eq!(ours, want, "ext4kit mount, {inode_size}-byte inodes");
        e2fsck_clean(&img).unwrap();
        // Stored as shown: a new mount (and the kernel's) reads the same.
        let m = FuseMount::new(&img, &["ro"]).unwrap();
        assert_eq!(
            read_times(m.path()),
            want,
            "remounted, {inode_size}-byte inodes"
        );
        m.unmount().unwrap();
        if let Ok((_, lo, km)) = kernel_copy(&img, &format!("r{inode_size}.img")) {
            assert_eq!(
                read_times(km.path()),
                want,
                "kernel reading ext4kit's image"
            );
            km.unmount().unwrap();
            drop(lo);
        }
    }
    if !kernel_checked {
        eprintln!("note: {what}: checked against the kernel's values written in the test");
    }
}

/// `stat -f` of `root`: blocks, free, available, inodes, free inodes,
/// block size, name length, fsid (hex).
fn statfs_line(root: &Path) -> String {
    let out = run_ok(
        tool("stat")
            .args(["-f", "-c", "%b %f %a %c %d %S %s %l %i"])
            .arg(root),
    )
    .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Everything but the fsid (the last field).
fn counts(line: &str) -> String {
    line.rsplit_once(' ')
        .map(|(c, _)| c.to_string())
        .unwrap_or_default()
}

/// Files on the filesystem at `root`: one of 10 MiB, 50 small ones and a
/// directory, then `sync`.
fn fill(root: &Path) {
    fs::write(root.join("big"), pattern(10 << 20, 7)).unwrap();
    fs::create_dir(root.join("d")).unwrap();
    for i in 0..50 {
        fs::write(
            root.join("d").join(format!("f{i}")),
            pattern(3000 + i * 100, i as u64),
        )
        .unwrap();
    }
    run_ok(&mut tool("sync")).unwrap();
}

/// statfs on the mount says what the kernel's ext4 says on the same
/// image: f_bavail holds back the reserved-clusters pool too (it was
/// 327 blocks high on 64 MiB and 4096 blocks, 16 MiB, on 1 GiB and
/// more), fresh and after writing, also for an image without
/// `s_overhead_clusters` (older mke2fs); the kernel's f_fsid is the one
/// `ext4kit_fs::statfs::fsid` derives from the UUID (FUSE itself has no
/// field for it: the kernel's FUSE reports 0).
#[test]
fn statfs_matches_kernel_ext4() {
    let what = "statfs_matches_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    if !have("stat") || !have("sync") {
        return skip(what, "stat or sync not found");
    }
    let uuid = uuid::Uuid::parse_str(UUID).unwrap();
    let [lo32, hi32] = ext4kit_fs::statfs::fsid(uuid.as_bytes());
    let want_fsid = format!("{:x}", (u64::from(lo32) << 32) | u64::from(hi32));
    let dir = image_dir();
    for (size, no_overhead) in [("64M", false), ("1G", false), ("40M", true)] {
        let img = dir.path().join(format!("s{size}.img"));
        run_ok(&mut ext4kit_mkfs([
            "-q",
            "-F",
            "-b",
            "4096",
            "-U",
            UUID,
            "-E",
            "nodiscard",
            img.to_str().unwrap(),
            size,
        ]))
        .unwrap();
        // As older mke2fs left it: no s_overhead_clusters (the kernel
        // then computes the overhead; f_blocks was the whole size).
        if no_overhead {
            if !have("debugfs") {
                continue;
            }
            run_ok(
                tool("debugfs")
                    .args(["-w", "-R", "ssv overhead_clusters 0"])
                    .arg(&img),
            )
            .unwrap();
            assert!(!dumpe2fs_h(&img).contains("Overhead clusters"));
        }
        let km = KernelTwin::new(
            &img,
            dir.path().join(format!("k{size}.img")),
            Some("noinit_itable"),
        )
        .unwrap();
        let k_fresh = statfs_line(km.path());
        fill(km.path());
        let k_full = statfs_line(km.path());
        let copy = km.copy.clone();
        km.unmount().unwrap();
        let fsid = k_fresh.rsplit(' ').next().unwrap_or_default().to_string();
        assert_eq!(fsid, want_fsid, "{size}: the kernel's f_fsid");

        let m = FuseMount::new(&img, &["noinit_itable"]).unwrap();
        let o_fresh = statfs_line(m.path());
        fill(m.path());
        let o_full = statfs_line(m.path());
        m.unmount().unwrap();
        assert_eq!(
            counts(&o_fresh),
            counts(&k_fresh),
            "{size}: fresh, ext4kit vs kernel"
        );
        assert_eq!(
            counts(&o_full),
            counts(&k_full),
            "{size}: after writing, ext4kit vs kernel"
        );
        e2fsck_clean(&img).unwrap();
        e2fsck_clean(&copy).unwrap();
    }
}

/// A mount over a stale FUSE mount point (its server killed: every stat
/// gives ENOTCONN) is refused with one line that says so and how to
/// clear it (it said "Not a directory").
#[test]
fn a_stale_mountpoint_is_named_with_the_way_to_clear_it() {
    let what = "a_stale_mountpoint_is_named_with_the_way_to_clear_it";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "32M");
    let mut m = FuseMount::new(&img, &[]).unwrap();
    if let Some(mut c) = m.child.take() {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let e = fs::metadata(m.path()).unwrap_err();
    // ENOTCONN on /dev/fuse; ECONNABORTED after io_uring (the kernel
    // aborts the connection when the rings go with the killed server).
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "{e}"
    );
    for fg in [true, false] {
        let mut c = ext4kit();
        c.arg("mount");
        if fg {
            c.arg("-f");
        }
        let out = run(c.arg(&img).arg(m.path())).unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        for want in ["stale FUSE mount", "fusermount3 -u", "umount -l"] {
            assert!(err.contains(want), "{want}: {err}");
        }
        assert!(err.contains(&*m.path().to_string_lossy()), "{err}");
    }
    // The guard clears the stale mount (umount, then umount -l).
    drop(m);
}

/// (seconds, nanoseconds) of `p`'s atime.
fn atime_of(p: &Path) -> (i64, i64) {
    am_times(p).0
}

/// `touch -a -d @SECS P`.
fn set_atime(p: &Path, secs: i64) {
    run_ok(
        tool("touch")
            .arg("-a")
            .arg("-d")
            .arg(format!("@{secs}"))
            .arg(p),
    )
    .unwrap();
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Reads and listings on the filesystem at `root`, each step with
/// whether it changed the atime of what it read.
fn atime_script(root: &Path) -> Vec<(&'static str, bool)> {
    let mut out = Vec::new();
    let f = root.join("f");
    let mut step = |what: &'static str, p: &Path, act: &dyn Fn()| {
        let before = atime_of(p);
        // The clock moves on between the steps (ns timestamps).
        std::thread::sleep(std::time::Duration::from_millis(20));
        act();
        out.push((what, atime_of(p) != before));
    };
    fs::write(&f, pattern(5000, 1)).unwrap();
    let read = || {
        fs::read(&f).unwrap();
    };
    step("read a new file", &f, &read);
    step("read it again", &f, &read);
    step("stat only", &f, &|| {
        fs::metadata(&f).unwrap();
    });
    set_atime(&f, now_secs() + 3600);
    step("read, atime in the future", &f, &read);
    set_atime(&f, now_secs() - 2 * 86_400);
    step("read, atime two days old", &f, &read);
    step("read once more", &f, &read);
    {
        use std::io::Write;
        let mut a = fs::OpenOptions::new().append(true).open(&f).unwrap();
        a.write_all(b"more").unwrap();
    }
    step("read after an append", &f, &read);
    let d = root.join("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("x"), b"x").unwrap();
    let list = || {
        fs::read_dir(&d).unwrap().for_each(drop);
    };
    step("list a changed directory", &d, &list);
    step("list it again", &d, &list);
    if have("chattr") {
        let g = root.join("g");
        fs::write(&g, pattern(5000, 2)).unwrap();
        run_ok(tool("chattr").arg("+A").arg(&g)).unwrap();
        step("read a chattr +A file", &g, &|| {
            fs::read(&g).unwrap();
        });
    }
    out
}

/// atime updates as the kernel's ext4 makes them, for relatime (the
/// default), strictatime, noatime, nodiratime and lazytime: the same
/// script of reads and listings changes the atime at the same steps on
/// the mount and on a kernel mount of the same image (the mount never
/// updated an atime before); the atimes are stored (lazytime ones too,
/// at unmount) and e2fsck is clean.
#[test]
fn atime_as_kernel_ext4() {
    let what = "atime_as_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    if !have("touch") {
        return skip(what, "touch not found");
    }
    let dir = image_dir();
    let mut diffs = Vec::new();
    for opts in [
        "",
        "strictatime",
        "noatime",
        "nodiratime",
        "lazytime",
        "strictatime,lazytime",
    ] {
        let img = mkfs(dir.path(), "32M");
        let copy = dir.path().join("kernel.img");
        let km = KernelTwin::new(&img, copy, (!opts.is_empty()).then_some(opts)).unwrap();
        let kernel = atime_script(km.path());
        eprintln!("kernel ext4, -o {opts:?}: {kernel:?}");
        km.unmount().unwrap();
        let o: Vec<&str> = if opts.is_empty() { vec![] } else { vec![opts] };
        let m = FuseMount::new(&img, &o).unwrap();
        let ours = atime_script(m.path());
        let shown = atime_of(&m.path().join("f"));
        m.unmount().unwrap();
        for ((w, k), (_, o)) in kernel.iter().zip(&ours) {
            if k != o {
                diffs.push(format!(
                    "-o {opts:?}: {w}: kernel changed={k}, ext4kit changed={o}"
                ));
            }
        }
        assert_eq!(kernel.len(), ours.len());
        e2fsck_clean(&img).unwrap();
        let m = FuseMount::new(&img, &["ro"]).unwrap();
        assert_eq!(
            atime_of(&m.path().join("f")),
            shown,
            "-o {opts:?}: stored atime"
        );
        m.unmount().unwrap();
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

/// Issue 23: a lazytime atime waits in memory, as the kernel's, through
/// the journal's commits (the idle commit too), and `ext4kit sync
/// MOUNTPOINT` writes it as the kernel's sync(2) writes its dirty-time
/// inodes: after the sync and a `kill -9` the replayed image has the new
/// atime; without the sync the kill loses it (the kernel's crash would
/// too), and the image keeps the old one.
#[test]
fn lazytime_atimes_are_written_by_ext4kit_sync() {
    let what = "lazytime_atimes_are_written_by_ext4kit_sync";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "32M");
    let m = FuseMount::new(&img, &[]).unwrap();
    fs::write(m.path().join("f"), b"lazy").unwrap();
    set_atime(&m.path().join("f"), 1_000_000_000);
    m.unmount().unwrap();
    for sync in [false, true] {
        let m = FuseMount::new(&img, &["strictatime,lazytime"]).unwrap();
        let f = m.path().join("f");
        let before = atime_of(&f);
        assert_eq!(fs::read(&f).unwrap(), b"lazy");
        let shown = atime_of(&f);
        assert!(shown > before, "sync={sync}: the read set no atime");
        // The creation above and this read: let an idle commit happen.
        std::thread::sleep(std::time::Duration::from_millis(300));
        if sync {
            run_ok(ext4kit().arg("sync").arg(m.path())).unwrap();
        }
        m.kill9();
        let m = FuseMount::new(&img, &["noatime"]).unwrap();
        let stored = atime_of(&m.path().join("f"));
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
        if sync {
            assert_eq!(
                stored, shown,
                "the lazytime atime was not written by ext4kit sync"
            );
        } else {
            assert_eq!(
                stored, before,
                "a lazytime atime reached the image without a sync"
            );
        }
    }
}

/// The per-mount flags of the mount on `dir` that `want` names, from
/// /proc/self/mountinfo (field 6).
fn mount_flags(dir: &Path) -> Vec<String> {
    let want = dir.to_string_lossy().into_owned();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(want.as_str()))
        .unwrap_or_default()
        .to_string();
    let opts = line.split(' ').nth(5).unwrap_or_default();
    ["nosuid", "nodev", "noexec"]
        .iter()
        .filter(|f| opts.split(',').any(|o| o == **f))
        .map(|f| f.to_string())
        .collect()
}

/// What a root user can do on the filesystem at `root`: write to a
/// device node (`/dev/null`'s numbers) made there, run a script.
fn dev_exec_script(root: &Path) -> (String, String) {
    let null = root.join("null");
    let _ = fs::remove_file(&null);
    run_ok(tool("mknod").arg(&null).args(["c", "1", "3"])).unwrap();
    let dev = match fs::OpenOptions::new().write(true).open(&null) {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("{:?}", e.raw_os_error()),
    };
    let script = root.join("s.sh");
    fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let mut perm = fs::metadata(&script).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    fs::set_permissions(&script, perm).unwrap();
    let exec = match std::process::Command::new(&script).status() {
        Ok(st) if st.success() => "ok".to_string(),
        Ok(st) => st.to_string(),
        Err(e) => format!("{:?}", e.raw_os_error()),
    };
    (dev, exec)
}

/// `-o suid,dev,exec,noexec` as mount(8) does them, as root; the default
/// stays nosuid,nodev (they were always nosuid,nodev: device nodes of a
/// root filesystem image could not be used). With `dev` a device node in
/// the image works as on a kernel mount; without, EACCES. A user other
/// than root is refused `suid`/`dev` with one line.
#[test]
fn suid_dev_exec_as_mount8() {
    let what = "suid_dev_exec_as_mount8";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    if !have("mknod") {
        return skip(what, "mknod not found");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "32M");
    // The kernel's ext4 (mount's defaults: suid, dev, exec).
    let km = KernelTwin::new(&img, dir.path().join("kernel.img"), Some("dev,exec")).unwrap();
    let kernel = dev_exec_script(km.path());
    km.unmount().unwrap();
    assert_eq!(kernel, ("ok".to_string(), "ok".to_string()));
    let eacces = format!("{:?}", Some(libc::EACCES));
    for (opts, flags, want) in [
        ("", "nosuid,nodev", (eacces.as_str(), "ok")),
        ("suid,dev", "", ("ok", "ok")),
        ("dev,noexec", "nosuid,noexec", ("ok", eacces.as_str())),
        ("suid,dev,nosuid,noexec,exec", "nosuid", ("ok", "ok")),
        ("defaults", "nosuid,nodev", (eacces.as_str(), "ok")),
    ] {
        let o: Vec<&str> = if opts.is_empty() { vec![] } else { vec![opts] };
        let m = FuseMount::new(&img, &o).unwrap();
        let got_flags = mount_flags(m.path()).join(",");
        let got = dev_exec_script(m.path());
        m.unmount().unwrap();
        assert_eq!(got_flags, flags, "-o {opts:?}: mount flags");
        assert_eq!(
            (got.0.as_str(), got.1.as_str()),
            want,
            "-o {opts:?}: (device, exec)"
        );
    }
    e2fsck_clean(&img).unwrap();
    // Not root: suid/dev refused before anything is opened.
    if have("setpriv") {
        let mp = tempfile::tempdir().unwrap();
        for opts in ["suid", "dev"] {
            let out = run(tool("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(ext4kit_path())
                .args(["mount", "-f", "-o", opts])
                .arg(&img)
                .arg(mp.path()))
            .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{opts}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains("need root"), "{opts}: {err}");
        }
    }
}
