//! `ext4kit mount` (FUSE) against the kernel: a tree made through the
//! mount (files, holes past 4 GiB, symlinks, hard links, devices, xattrs,
//! ACLs, rename flags, truncate, fallocate modes, SEEK_DATA, mmap writes,
//! times before 1970) is read back identically by a kernel ext4 mount
//! after unmounting, and `e2fsck -fn` is clean; unlink of an open file;
//! SIGTERM, background mounts and umount; kill -9 during fsyncs then a
//! replaying mount; the fuse2fs leak (4 KiB random writes then rm); the
//! errno of 60 refused or edge-case calls equal to kernel ext4's;
//! pjdfstest when installed; online lazy init zeroing stale inode tables
//! while files are made (and `noinit_itable` leaving them); `-o discard`
//! giving a deleted file's space back to the image at an immediate unmount;
//! `-o writeback_cache` keeping O_APPEND, SEEK_DATA and ctimes right.
//!
//! Every mount is made on a temporary directory and unmounted by a guard
//! (also on failure); the mount tests need root and /dev/fuse and say
//! `SKIP` otherwise.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::fuse::*;
use common::*;
use ext4kit_device::{Device, FileDevice, host};

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What a tree walk records of each path (relative to the root).
type Tree = BTreeMap<String, String>;

/// Hash a file's contents, reading a sparse file's data ranges only.
fn content_hash(p: &Path, size: u64) -> String {
    let dev = FileDevice::open(p, ext4kit_device::OpenOptions::read_only()).unwrap();
    let holes = dev.known_zero_ranges(0, size).unwrap();
    let f = File::open(p).unwrap();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut pos = 0u64;
    let chunk = |from: u64, to: u64, h: &mut u64| {
        let mut buf = vec![0u8; (to - from) as usize];
        f.read_exact_at(&mut buf, from).unwrap();
        *h ^= fnv(&buf).rotate_left((from % 63) as u32);
        *h = h.wrapping_mul(31);
    };
    for (s, e) in holes {
        if s > pos {
            chunk(pos, s, &mut h);
        }
        pos = pos.max(e);
    }
    if pos < size {
        chunk(pos, size, &mut h);
    }
    format!("{h:016x} holes-at-data-ranges")
}

/// Every path below `root`: type, mode, owner, size, links, i_blocks,
/// a/m/ctime with nanoseconds, rdev, xattrs (values hashed), link
/// targets, content hashes.
fn walk(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let ft = md.file_type();
        let mut s = format!(
            "mode={:o} uid={} gid={} nlink={} blocks={} rdev={:x} atime={}.{} mtime={}.{} ctime={}.{}",
            md.mode(),
            md.uid(),
            md.gid(),
            md.nlink(),
            md.blocks(),
            md.rdev(),
            md.atime(),
            md.atime_nsec(),
            md.mtime(),
            md.mtime_nsec(),
            md.ctime(),
            md.ctime_nsec()
        );
        if !ft.is_dir() {
            s += &format!(" size={}", md.size());
        }
        let mut xa = host::xattrs(&p).unwrap();
        xa.sort();
        for (n, v) in xa {
            s += &format!(" xattr:{}={:x}", String::from_utf8_lossy(&n), fnv(&v));
        }
        if ft.is_symlink() {
            s += &format!(" -> {}", fs::read_link(&p).unwrap().display());
        } else if ft.is_file() {
            s += &format!(" data={}", content_hash(&p, md.size()));
        } else if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                let e = e.unwrap();
                if rel.is_empty() && e.file_name() == "lost+found" {
                    continue;
                }
                stack.push(e.path());
            }
        }
        out.insert(rel, s);
    }
    out
}

fn getfacl(p: &Path) -> String {
    let o = run_ok(tool("getfacl").args(["-p", "-n"]).arg(p)).unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with("# file:"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn tool_ok(name: &str, args: &[&str]) {
    run_ok(tool(name).args(args)).unwrap();
}

fn errno_of(r: std::io::Result<()>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// The workload of the big test, on the mounted tree `m`.
fn build_tree(m: &Path) {
    let p = |s: &str| m.join(s);
    fs::create_dir_all(p("a/b/c")).unwrap();
    fs::create_dir(p("d")).unwrap();
    // Files of assorted sizes, one fsynced.
    for (i, len) in [0usize, 1, 4095, 4096, 4097, 100_000, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let mut f = File::create(p(&format!("a/f{i}"))).unwrap();
        f.write_all(&pattern(len, i as u64)).unwrap();
        if i == 3 {
            f.sync_all().unwrap();
        }
    }
    // Overwrite the middle, append (O_APPEND).
    let f = OpenOptions::new().write(true).open(p("a/f5")).unwrap();
    f.write_all_at(b"overwritten", 50_000).unwrap();
    let mut f = OpenOptions::new().append(true).open(p("a/f5")).unwrap();
    f.write_all(b"appended at the end").unwrap();
    assert_eq!(fs::metadata(p("a/f5")).unwrap().len(), 100_019);
    // Symlinks (fast and slow), hard links.
    symlink("f1", p("a/short")).unwrap();
    let long = "x/".repeat(100) + "target";
    symlink(&long, p("a/long")).unwrap();
    assert_eq!(
        fs::read_link(p("a/long")).unwrap().to_str(),
        Some(long.as_str())
    );
    fs::hard_link(p("a/f2"), p("d/f2-link")).unwrap();
    fs::hard_link(p("a/f2"), p("a/b/f2-link2")).unwrap();
    assert_eq!(fs::metadata(p("a/f2")).unwrap().nlink(), 3);
    // Devices and fifos.
    host::mknod(&p("d/fifo"), libc::S_IFIFO | 0o640, 0, 0).unwrap();
    host::mknod(&p("d/null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
    host::mknod(&p("d/blk"), libc::S_IFBLK | 0o600, 259, 70_000).unwrap();
    // Owner, mode, times with nanoseconds, before 1970 and after 2038.
    std::os::unix::fs::chown(p("a/f4"), Some(1234), Some(5678)).unwrap();
    fs::set_permissions(p("a/f4"), fs::Permissions::from_mode(0o4751)).unwrap();
    host::set_times_nofollow(
        &p("a/f1"),
        (-86_400 * 400 - 5, 250_000_000),
        (-1, 999_999_999),
    )
    .unwrap();
    host::set_times_nofollow(&p("a/f0"), (4_102_444_800, 1), (2_500_000_000, 123_456_789)).unwrap();
    let md = fs::metadata(p("a/f1")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (-1, 999_999_999));
    assert_eq!(
        (md.atime(), md.atime_nsec()),
        (-86_400 * 400 - 5, 250_000_000)
    );
    // Xattrs and ACLs (the kernel checks them: FUSE_POSIX_ACL).
    host::set_xattr(&p("a/f3"), b"user.colour", b"blue").unwrap();
    host::set_xattr(&p("a/f3"), b"user.big", &pattern(3000, 9)).unwrap();
    host::set_xattr(&p("a"), b"trusted.t", b"x").unwrap();
    tool_ok(
        "setfacl",
        &["-m", "u:1234:rw,g:55:r", p("a/f6").to_str().unwrap()],
    );
    tool_ok(
        "setfacl",
        &["-d", "-m", "u:4321:rwx", p("d").to_str().unwrap()],
    );
    File::create(p("d/inherits")).unwrap();
    fs::create_dir(p("d/subdir")).unwrap();
    let acl = getfacl(&p("d/inherits"));
    assert!(acl.contains("user:4321:rwx"), "{acl}");
    assert!(getfacl(&p("d/subdir")).contains("default:user:4321:rwx"));
    // Rename flags.
    fs::write(p("d/x"), b"x").unwrap();
    fs::write(p("d/y"), b"yy").unwrap();
    assert_eq!(
        errno_of(host::rename_with_flags(&p("d/x"), &p("d/y"), 1)),
        Some(libc::EEXIST)
    );
    host::rename_with_flags(&p("d/x"), &p("d/y"), 2).unwrap();
    assert_eq!(fs::read(p("d/x")).unwrap(), b"yy");
    assert_eq!(fs::read(p("d/y")).unwrap(), b"x");
    host::rename_with_flags(&p("a/b/c"), &p("d"), 2).unwrap();
    assert!(p("a/b/c/inherits").exists() && p("d").read_dir().unwrap().count() == 0);
    host::rename_with_flags(&p("a/b/c"), &p("d"), 2).unwrap();
    fs::rename(p("d/x"), p("a/b/moved")).unwrap();
    assert_eq!(
        errno_of(fs::rename(p("a"), p("a/b/inside"))),
        Some(libc::EINVAL)
    );
    // Truncate down and up.
    let f = OpenOptions::new().write(true).open(p("a/f6")).unwrap();
    f.set_len(1_000_001).unwrap();
    f.set_len(2_000_000).unwrap();
    drop(f);
    // fallocate: default, keep size, punch, zero range.
    let fa = p("a/falloc").to_string_lossy().into_owned();
    fs::write(&fa, pattern(200_000, 3)).unwrap();
    tool_ok("fallocate", &["-l", "1M", &fa]);
    tool_ok("fallocate", &["-n", "-o", "1M", "-l", "1M", &fa]);
    tool_ok("fallocate", &["-p", "-o", "8192", "-l", "16384", &fa]);
    tool_ok("fallocate", &["-z", "-o", "40000", "-l", "30000", &fa]);
    let data = fs::read(&fa).unwrap();
    assert_eq!(data.len(), 1 << 20);
    assert!(data[8192..24576].iter().all(|&b| b == 0));
    assert!(data[40000..70000].iter().all(|&b| b == 0));
    assert_eq!(&data[..8192], &pattern(200_000, 3)[..8192]);
    // A sparse file past 4 GiB; SEEK_DATA/SEEK_HOLE see its holes.
    let sp = p("a/sparse");
    let f = File::create(&sp).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(&pattern(8192, 5), 5 << 30).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let md = fs::metadata(&sp).unwrap();
    assert_eq!(md.len(), (5 << 30) + 8192);
    assert!(md.blocks() <= 64, "{} blocks", md.blocks());
    let dev = FileDevice::open(&sp, ext4kit_device::OpenOptions::read_only()).unwrap();
    assert_eq!(
        dev.known_zero_ranges(0, md.len()).unwrap(),
        vec![(4096, 5 << 30)]
    );
    let mut tail = vec![0u8; 8192];
    File::open(&sp)
        .unwrap()
        .read_exact_at(&mut tail, 5 << 30)
        .unwrap();
    assert_eq!(tail, pattern(8192, 5));
    // A write through a shared mapping.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(p("a/f6"))
        .unwrap();
    host::write_through_mmap(&f, 12_345, b"written through mmap").unwrap();
    drop(f);
    let mut got = vec![0u8; 20];
    File::open(p("a/f6"))
        .unwrap()
        .read_exact_at(&mut got, 12_345)
        .unwrap();
    assert_eq!(&got, b"written through mmap");
    // O_DIRECT is accepted (FUSE direct I/O goes straight to the engine).
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = OpenOptions::new()
            .write(true)
            .read(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(p("a/direct"))
            .unwrap();
        f.write_all(&pattern(1 << 16, 11)).unwrap();
        let mut back = vec![0u8; 1 << 16];
        f.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, pattern(1 << 16, 11));
    }
    // Errors as ext4 gives them.
    assert_eq!(errno_of(fs::remove_dir(p("a"))), Some(libc::ENOTEMPTY));
    assert_eq!(errno_of(fs::create_dir(p("a"))), Some(libc::EEXIST));
    assert_eq!(
        errno_of(File::create(p(&"n".repeat(256))).map(|_| ())),
        Some(libc::ENAMETOOLONG)
    );
    assert_eq!(
        errno_of(fs::metadata(p("missing")).map(|_| ())),
        Some(libc::ENOENT)
    );
    // Removing things.
    fs::remove_file(p("a/f0")).unwrap();
    fs::remove_dir(p("d/subdir")).unwrap();
    // A directory with many names (an htree), half removed while listed.
    fs::create_dir(p("many")).unwrap();
    for i in 0..600 {
        fs::write(p(&format!("many/name-{i:04}-{}", "z".repeat(40))), b"").unwrap();
    }
    let mut seen = 0;
    for (k, e) in fs::read_dir(p("many")).unwrap().enumerate() {
        let e = e.unwrap();
        seen += 1;
        if k % 2 == 0 {
            fs::remove_file(e.path()).unwrap();
        }
    }
    assert_eq!(seen, 600);
    assert_eq!(fs::read_dir(p("many")).unwrap().count(), 300);
    // statfs: the free counts move.
    let df = run_ok(tool("df").args(["-B1", "--output=avail"]).arg(m)).unwrap();
    assert!(String::from_utf8_lossy(&df.stdout).lines().count() == 2);
}

/// `o` with the transport's options `t` first.
fn with<'a>(t: &[&'a str], o: &[&'a str]) -> Vec<&'a str> {
    [t, o].concat()
}

/// Our own FUSE session loop (the default), for the tests of what only
/// it serves (FUSE_STATX, FUSE_TMPFILE): explicit, so that
/// `EXT4KIT_TEST_TRANSPORT=fuser` does not move them.
const OWN: &[&str] = &["transport=ext4kit"];

/// Our own transport over io_uring (`-o uring`, FUSE over io_uring).
const URING: &[&str] = &["uring"];

/// A body of the own-transport tests over io_uring: skipped where the
/// kernel lacks it, `enable_uring` back to what it was afterwards.
fn over_uring(what: &str, body: fn(&str, &[&str])) {
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let _switch = match UringSwitch::on() {
        Ok(s) => s,
        Err(e) => return skip(what, &e),
    };
    body(what, URING);
}

/// With `-o uring` the requests are served by ring threads.
fn assert_rings(t: &[&str], m: &FuseMount) {
    if t.contains(&"uring") {
        // The rings start right after the mount is live.
        wait_until("ring threads", Duration::from_secs(10), || {
            ring_threads(m) > 0
        })
        .unwrap();
    }
}

/// fuser's session, kept covered while it exists: the tree, kill -9 and
/// pjdfstest tests run on it explicitly too (their default-named twins
/// run on the default transport, or on `EXT4KIT_TEST_TRANSPORT`'s).
const FUSER: &[&str] = &["transport=fuser"];

/// The default mount (no `transport=`), for what the default transport
/// must serve (O_TMPFILE, statx's btime); [`OWN`] where the run was put
/// on fuser's by `EXT4KIT_TEST_TRANSPORT=fuser`.
fn default_transport() -> &'static [&'static str] {
    match std::env::var("EXT4KIT_TEST_TRANSPORT").as_deref() {
        Ok("fuser" | "devfuse") => OWN,
        _ => &[],
    }
}

#[test]
fn tree_through_the_mount_reads_back_on_the_kernel() {
    tree_readback("tree_through_the_mount_reads_back_on_the_kernel", &[]);
}

#[test]
fn fuser_transport_tree_reads_back_on_the_kernel() {
    tree_readback("fuser_transport_tree_reads_back_on_the_kernel", FUSER);
}

/// Our own session on `/dev/fuse` (`nouring`), kept covered now that
/// io_uring is the default where the kernel offers it: the tree, kill -9
/// and pjdfstest tests run on it explicitly.
const DEVFUSE: &[&str] = &["transport=ext4kit", "nouring"];

#[test]
fn devfuse_transport_tree_reads_back_on_the_kernel() {
    tree_readback("devfuse_transport_tree_reads_back_on_the_kernel", DEVFUSE);
}

/// The transport the mount's status names, and its ring threads: the
/// default is io_uring where the kernel offers it (as root the switch is
/// held on by `FuseMount`), `nouring` is `/dev/fuse`, fuser's is fuser.
#[test]
fn the_default_transport_is_io_uring_where_the_kernel_offers_it() {
    let what = "the_default_transport_is_io_uring_where_the_kernel_offers_it";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let status = |m: &FuseMount| -> serde_json::Value {
        let out = run_ok(ext4kit().args(["status", "--json"]).arg(m.path())).unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let uring = fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok()
        && nix::unistd::geteuid().is_root();
    // Explicit transport=ext4kit: EXT4KIT_TEST_TRANSPORT=devfuse's
    // nouring (given first) stays, fuser's is undone.
    let own_default = std::env::var("EXT4KIT_TEST_TRANSPORT").as_deref() != Ok("devfuse");
    let m = FuseMount::new(&img, &["transport=ext4kit"]).unwrap();
    let v = status(&m);
    if uring && own_default {
        assert_rings(URING, &m);
        assert_eq!(v["transport"], "io_uring", "{v}");
        let out = run_ok(ext4kit().arg("status").arg(m.path())).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains("transport: io_uring"), "{text}");
    } else {
        eprintln!("{what}: no FUSE over io_uring to default to here");
        assert_eq!(v["transport"], "/dev/fuse", "{v}");
    }
    m.unmount().unwrap();
    let m = FuseMount::new(&img, DEVFUSE).unwrap();
    assert_eq!(status(&m)["transport"], "/dev/fuse");
    assert_eq!(ring_threads(&m), 0);
    m.unmount().unwrap();
    let m = FuseMount::new(&img, FUSER).unwrap();
    assert_eq!(status(&m)["transport"], "fuser");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// The end of a connection ends the rings: an unmount, and an abort
/// (`umount -f`: ENODEV with entries in the kernel) both have the daemon
/// exit 0, the image clean.
#[test]
fn uring_unmount_and_abort_end_the_rings() {
    over_uring("uring_unmount_and_abort_end_the_rings", |_, t| {
        let dir = image_dir();
        let img = mkfs(dir.path(), "64M");
        let m = FuseMount::new(&img, t).unwrap();
        assert_rings(t, &m);
        fs::write(m.path().join("f"), b"over the ring").unwrap();
        let started = std::time::Instant::now();
        m.unmount().unwrap();
        assert!(started.elapsed() < Duration::from_secs(20), "slow unmount");
        let mut m = FuseMount::new(&img, t).unwrap();
        assert_eq!(fs::read(m.path().join("f")).unwrap(), b"over the ring");
        // umount -f: the kernel aborts the connection (ENODEV on
        // /dev/fuse, every ring entry torn down) before it unmounts.
        run_ok(tool("umount").arg("-f").arg(m.path())).unwrap();
        // The daemon ends (ENODEV: the image closed cleanly, exit 0).
        m.wait_exit().unwrap();
        drop(m);
        e2fsck_clean(&img).unwrap();
    });
}

#[test]
fn uring_tree_reads_back_on_the_kernel() {
    over_uring("uring_tree_reads_back_on_the_kernel", tree_readback);
}

fn tree_readback(what: &str, t: &[&str]) {
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    for t in ["setfacl", "getfacl", "fallocate", "df"] {
        if !have(t) {
            return skip(what, &format!("{t} not found"));
        }
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "512M");
    let m = FuseMount::new(&img, t).unwrap();
    assert_rings(t, &m);
    build_tree(m.path());
    // Past the attribute TTL: the walk sees what the engine has, not
    // what the kernel cached.
    std::thread::sleep(Duration::from_millis(1100));
    // A walk reads every file and directory, and with relatime (the
    // default) the first read of each updates its atime, as on the
    // kernel's ext4: walk once for those updates, then again for the
    // tree to compare (its reads update nothing, each atime now being
    // newer than the mtime and the ctime).
    walk(m.path());
    std::thread::sleep(Duration::from_millis(1100));
    let ours = walk(m.path());
    let acl_ours = getfacl(&m.path().join("a/f6"));
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    assert!(!dumpe2fs_h(&img).contains("needs_recovery"));
    // The kernel sees the same tree.
    let lo = LoopDev::attach(&img).unwrap();
    let km = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let theirs = walk(km.path());
    let acl_theirs = getfacl(&km.path().join("a/f6"));
    km.unmount().unwrap();
    drop(lo);
    for (k, v) in &ours {
        assert_eq!(theirs.get(k), Some(v), "{k}");
    }
    assert_eq!(ours.len(), theirs.len());
    assert_eq!(acl_ours, acl_theirs);
    assert!(acl_ours.contains("user:1234:rw-"), "{acl_ours}");
    // Mounted again, ext4kit reads what it wrote (and the kernel's
    // readback wrote nothing).
    let m = FuseMount::new(&img, &with(t, &["ro"])).unwrap();
    let again = walk(m.path());
    m.unmount().unwrap();
    assert_eq!(again, ours);
    e2fsck_clean(&img).unwrap();
}

/// One statfs field of the mounted filesystem (`stat -f -c FORMAT`).
fn statfs_field(m: &Path, format: &str) -> u64 {
    let o = run_ok(tool("stat").args(["-f", "-c", format]).arg(m)).unwrap();
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// Free blocks of the mounted filesystem (statfs).
fn free_blocks(m: &Path) -> u64 {
    statfs_field(m, "%f")
}

#[test]
fn unlinked_open_file_lives_until_closed() {
    let what = "unlinked_open_file_lives_until_closed";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let before = free_blocks(m.path());
    let p = m.path().join("victim");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(&pattern(8 << 20, 1)).unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    // Still readable and writable through the descriptor.
    f.write_all_at(b"after unlink", 1 << 20).unwrap();
    f.sync_all().unwrap();
    let mut buf = vec![0u8; 12];
    f.read_exact_at(&mut buf, 1 << 20).unwrap();
    assert_eq!(&buf, b"after unlink");
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    // fchmod, fchown, futimens work on it as on ext4.
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    std::os::unix::fs::fchown(&f, Some(42), Some(43)).unwrap();
    let t = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 5);
    f.set_modified(t).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!((md.mode() & 0o7777, md.uid(), md.gid()), (0o600, 42, 43));
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 5));
    f.set_len(9 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 9 << 20);
    assert!(free_blocks(m.path()) + 2000 < before);
    drop(f);
    wait_until("the blocks to come back", Duration::from_secs(10), || {
        free_blocks(m.path()) == before
    })
    .unwrap();
    // Once more, still open at unmount time: freed at close.
    let mut g = File::create(m.path().join("kept-open")).unwrap();
    g.write_all(&pattern(1 << 20, 2)).unwrap();
    fs::remove_file(m.path().join("kept-open")).unwrap();
    g.sync_all().unwrap();
    let pid = m.pid();
    run_ok(tool("kill").args(["-TERM", &pid.to_string()])).unwrap();
    let mut m = m;
    m.wait_exit().unwrap();
    drop(g);
    drop(m);
    let after = e2fsck_clean(&img).unwrap();
    assert_eq!(
        used_inodes(&after),
        used_inodes(&fresh),
        "{after} / {fresh}"
    );
    assert_eq!(after, fresh);
}

#[test]
fn background_mount_and_signals_close_cleanly() {
    let what = "background_mount_and_signals_close_cleanly";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("flock") {
        return skip(what, "flock not found");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    // Background: returns once the mount is live.
    let mnt = tempfile::Builder::new()
        .prefix("ext4kit-fuse.")
        .tempdir()
        .unwrap();
    // The switch held on first: the mount finds it Y and says nothing.
    let uring = uring_for_mount();
    let out = run(ext4kit()
        .arg("mount")
        .arg(&img)
        .arg(mnt.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped()))
    .unwrap();
    // A guard even for the background mount.
    let guard = FuseMount {
        dir: Some(mnt),
        child: None,
        uring,
    };
    assert!(out.status.success(), "{}", last_line(&out));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    assert!(is_mounted(guard.path()));
    fs::write(guard.path().join("bg"), b"background").unwrap();
    // The image is in use: a second mount and a writer are refused.
    let other = tempfile::tempdir().unwrap();
    let out = run(ext4kit().arg("mount").arg(&img).arg(other.path())).unwrap();
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    run_ok(tool("umount").arg(guard.path())).unwrap();
    // The daemon closes the image (its flock goes) once it is clean.
    wait_until(
        "the daemon to close the image",
        Duration::from_secs(60),
        || {
            tool("flock")
                .args(["-n"])
                .arg(&img)
                .arg("true")
                .status()
                .is_ok_and(|s| s.success())
        },
    )
    .unwrap();
    drop(guard);
    e2fsck_clean(&img).unwrap();
    assert!(!dumpe2fs_h(&img).contains("needs_recovery"));

    // Foreground, SIGINT and SIGTERM: the same clean close.
    for sig in ["-INT", "-TERM"] {
        let mut m = FuseMount::new(&img, &["commit=1"]).unwrap();
        fs::write(m.path().join(format!("f{sig}")), pattern(100_000, 7)).unwrap();
        run_ok(tool("kill").args([sig, &m.pid().to_string()])).unwrap();
        m.wait_exit().unwrap();
        assert!(!is_mounted(m.path()));
        drop(m);
        e2fsck_clean(&img).unwrap();
        assert!(!dumpe2fs_h(&img).contains("needs_recovery"));
    }
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    assert_eq!(fs::read(m.path().join("bg")).unwrap(), b"background");
    assert_eq!(
        fs::read(m.path().join("f-TERM")).unwrap(),
        pattern(100_000, 7)
    );
    assert_eq!(
        errno_of(fs::write(m.path().join("new"), b"x")),
        Some(libc::EROFS)
    );
    m.unmount().unwrap();
}

#[test]
fn bad_options_are_refused_before_anything_is_written() {
    let dir = image_dir();
    let img = dir.path().join("x.img");
    sparse_file(&img, 64 << 20).unwrap();
    let before = file_hash(&img).unwrap();
    let mnt = tempfile::tempdir().unwrap();
    for (opts, want) in [
        ("bogus", "unknown mount option 'bogus'"),
        ("rw,norecovery", "needs a read-only mount"),
        ("commit=soon", "invalid value 'soon'"),
        ("data=journal", "not supported"),
    ] {
        let out = run(ext4kit()
            .args(["mount", "-f", "-o", opts])
            .arg(&img)
            .arg(mnt.path()))
        .unwrap();
        assert!(!out.status.success(), "{opts}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{opts}: {err}");
        assert!(err.contains(want), "{opts}: {err}");
    }
    // Not a mount point, not a filesystem.
    let out = run(ext4kit().args(["mount", "-f"]).arg(&img).arg(&img)).unwrap();
    assert!(!out.status.success());
    assert!(
        last_line(&out).contains("Not a directory"),
        "{}",
        last_line(&out)
    );
    assert_eq!(file_hash(&img).unwrap(), before);
    let help = run_ok(ext4kit().args(["mount", "--help"])).unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for w in [
        "init_itable",
        "commit=SEC",
        "norecovery",
        "allow_other",
        "umount",
    ] {
        assert!(help.contains(w), "--help lacks {w}");
    }
}

#[test]
fn kill9_during_fsyncs_then_replay() {
    kill9_replay("kill9_during_fsyncs_then_replay", &[]);
}

#[test]
fn fuser_transport_kill9_during_fsyncs_then_replay() {
    kill9_replay("fuser_transport_kill9_during_fsyncs_then_replay", FUSER);
}

#[test]
fn devfuse_transport_kill9_during_fsyncs_then_replay() {
    kill9_replay("devfuse_transport_kill9_during_fsyncs_then_replay", DEVFUSE);
}

#[test]
fn uring_kill9_during_fsyncs_then_replay() {
    over_uring("uring_kill9_during_fsyncs_then_replay", kill9_replay);
}

fn kill9_replay(what: &str, t: &[&str]) {
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let seed = std::env::var("EXT4KIT_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7u64);
    for round in 0..3u64 {
        let m = FuseMount::new(&img, &with(t, &["commit=30"])).unwrap();
        assert_rings(t, &m);
        let root = m.path().join(format!("r{round}"));
        fs::create_dir(&root).unwrap();
        File::open(m.path()).unwrap().sync_all().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(String, usize)>();
        let r2 = root.clone();
        let worker = std::thread::spawn(move || {
            for i in 0..100_000usize {
                let name = format!("file-{i}");
                let len = (i * 7919) % 50_000 + 1;
                let ok = (|| -> std::io::Result<()> {
                    let mut f = File::create(r2.join(&name))?;
                    f.write_all(&pattern(len, i as u64))?;
                    f.sync_all()
                })();
                if ok.is_err() {
                    return;
                }
                if tx.send((name, len)).is_err() {
                    return;
                }
                // Unsynced changes beside the synced ones.
                let _ = fs::write(r2.join(format!("loose-{i}")), b"not synced");
            }
        });
        // A few fsyncs first (a loaded machine is slow), then a random
        // moment.
        let mut synced: Vec<(String, usize)> = Vec::new();
        while synced.len() < 3 {
            synced.push(rx.recv_timeout(Duration::from_secs(60)).unwrap());
        }
        let delay = seed.wrapping_mul(round + 1).wrapping_mul(2_654_435_761) % 500;
        std::thread::sleep(Duration::from_millis(delay));
        m.kill9();
        let _ = worker.join();
        synced.extend(rx.try_iter());
        assert!(!synced.is_empty(), "round {round}: nothing was fsynced");
        assert!(dumpe2fs_h(&img).contains("needs_recovery"));
        if round == 0 {
            // Read-only: the journal is replayed in memory only (the
            // fsynced files are there, nothing is written); with noload
            // not at all.
            let hash = file_hash(&img).unwrap();
            let m = FuseMount::new(&img, &with(t, &["ro"])).unwrap();
            let root = m.path().join("r0");
            let (name, len) = synced.last().unwrap();
            let i: usize = name[5..].parse().unwrap();
            assert_eq!(fs::read(root.join(name)).unwrap(), pattern(*len, i as u64));
            m.unmount().unwrap();
            let m = FuseMount::new(&img, &with(t, &["ro,noload"])).unwrap();
            assert!(m.path().join("lost+found").is_dir());
            m.unmount().unwrap();
            assert_eq!(file_hash(&img).unwrap(), hash);
        }
        // The next mount replays the journal; every fsynced file is there.
        let m = FuseMount::new(&img, t).unwrap();
        let root = m.path().join(format!("r{round}"));
        for (name, len) in &synced {
            let i: usize = name[5..].parse().unwrap();
            assert_eq!(
                fs::read(root.join(name)).unwrap(),
                pattern(*len, i as u64),
                "round {round}: {name}"
            );
        }
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
    }
}

#[test]
fn random_4k_writes_then_rm_leak_nothing() {
    let what = "random_4k_writes_then_rm_leak_nothing";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = m.path().join("fio-like");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let span = 32u64 << 20;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let block = pattern(4096, 3);
    for _ in 0..3000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.write_all_at(&block, (x % (span / 4096)) * 4096).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    fs::remove_file(&p).unwrap();
    m.unmount().unwrap();
    let after = e2fsck_clean(&img).unwrap();
    assert_eq!(after, fresh);
}

/// Where `cargo install pjdfstest` put the binary, if it did.
fn pjdfstest_bin() -> Option<PathBuf> {
    find_tool("pjdfstest").or_else(|| {
        let home = std::env::var_os("HOME")?;
        let p = Path::new(&home).join(".cargo/bin/pjdfstest");
        p.is_file().then_some(p)
    })
}

#[test]
fn pjdfstest_on_the_mount() {
    pjdfstest("pjdfstest_on_the_mount", &[]);
}

#[test]
fn fuser_transport_pjdfstest() {
    pjdfstest("fuser_transport_pjdfstest", FUSER);
}

#[test]
fn devfuse_transport_pjdfstest() {
    pjdfstest("devfuse_transport_pjdfstest", DEVFUSE);
}

#[test]
fn uring_pjdfstest() {
    over_uring("uring_pjdfstest", pjdfstest);
}

fn pjdfstest(what: &str, t: &[&str]) {
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let Some(bin) = pjdfstest_bin() else {
        return skip(
            what,
            "pjdfstest not installed (cargo install pjdfstest --locked)",
        );
    };
    let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
    for u in ["nobody:", "daemon:"] {
        if !passwd.lines().any(|l| l.starts_with(u)) {
            return skip(what, &format!("no user {}", u.trim_end_matches(':')));
        }
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &with(t, &["allow_other"])).unwrap();
    assert_rings(t, &m);
    let work = m.path().join("pjd");
    fs::create_dir(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777)).unwrap();
    let conf = dir.path().join("pjdfstest.toml");
    fs::write(&conf, PJDFSTEST_CONF).unwrap();
    // A second filesystem (the image's directory) for the EXDEV cases.
    let other = dir.path().join("secondary");
    fs::create_dir(&other).unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o777)).unwrap();
    // The whole suite by default (398 cases, seconds);
    // EXT4KIT_PJDFSTEST=PATTERN runs the cases whose names contain it.
    let mut c = Command::new(&bin);
    c.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&work)
        .arg("-s")
        .arg(&other);
    if let Ok(pat) = std::env::var("EXT4KIT_PJDFSTEST") {
        c.arg(pat);
    }
    let out = c.stdin(Stdio::null()).output().expect("running pjdfstest");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("FAILED")).collect();
    let summary = text
        .lines()
        .find(|l| l.contains("Summary:"))
        .map(str::to_string);
    eprintln!(
        "pjdfstest: {} failed; {}",
        failed.len(),
        summary.as_deref().unwrap_or("no summary")
    );
    for l in &failed {
        eprintln!("  {l}");
    }
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let summary = summary.unwrap_or_else(|| panic!("pjdfstest did not run:\n{text}"));
    assert!(summary.contains(" 0 failed"), "{summary}");
    assert!(failed.is_empty(), "{} pjdfstest cases failed", failed.len());
}

/// pjdfstest-rs settings: ext4's features, the unprivileged users it
/// switches to (two that Debian has), a nap longer than the clock's
/// granularity. No remounts: `mount -o remount,ro` of the FUSE mount is
/// refused as busy in 6 of the EROFS cases (not an ext4kit answer).
const PJDFSTEST_CONF: &str = r#"[features]
posix_fallocate = {}
rename_ctime = {}
utimensat = {}
utime_now = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["daemon", "daemon"],
]
"#;

/// One outcome: "ok", "ok <detail>" or the errno.
fn outcome<T: std::fmt::Debug>(r: std::io::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => match e.raw_os_error() {
            Some(n) => format!("errno {n}"),
            None => format!("error {e}"),
        },
    }
}

/// The same operations, with their expected refusals, on `root`: what
/// each returned, in order.
fn errno_script(root: &Path) -> Vec<(String, String)> {
    let p = |s: &str| root.join(s);
    let mut out = Vec::new();
    let mut step = |what: &str, r: String| out.push((what.to_string(), r));
    step("mkdir d", outcome(fs::create_dir(p("d"))));
    step("mkdir d again", outcome(fs::create_dir(p("d"))));
    step("write d/f", outcome(fs::write(p("d/f"), b"data")));
    step("rmdir non-empty", outcome(fs::remove_dir(p("d"))));
    step("rmdir a file", outcome(fs::remove_dir(p("d/f"))));
    step("unlink a dir", outcome(fs::remove_file(p("d"))));
    step(
        "open missing",
        outcome(File::open(p("missing")).map(|_| ())),
    );
    step("mkdir below a file", outcome(fs::create_dir(p("d/f/x"))));
    step("name of 255", outcome(fs::write(p(&"a".repeat(255)), b"")));
    step("name of 256", outcome(fs::write(p(&"b".repeat(256)), b"")));
    step(
        "symlink 4095",
        outcome(symlink("t".repeat(4095), p("s4095"))),
    );
    step(
        "readlink 4095",
        outcome(fs::read_link(p("s4095")).map(|t| t.as_os_str().len())),
    );
    step("readlink of a file", outcome(fs::read_link(p("d/f"))));
    step("link a dir", outcome(fs::hard_link(p("d"), p("dlink"))));
    step(
        "link missing",
        outcome(fs::hard_link(p("nope"), p("nlink"))),
    );
    step(
        "link onto existing",
        outcome(fs::hard_link(p("d/f"), p("s4095"))),
    );
    fs::create_dir_all(p("e/sub")).unwrap();
    fs::create_dir_all(p("g/sub")).unwrap();
    step(
        "rename into itself",
        outcome(fs::rename(p("e"), p("e/sub/e"))),
    );
    step(
        "rename file over dir",
        outcome(fs::rename(p("d/f"), p("e"))),
    );
    step(
        "rename dir over file",
        outcome(fs::rename(p("e"), p("d/f"))),
    );
    step(
        "rename over non-empty dir",
        outcome(fs::rename(p("e"), p("g"))),
    );
    step(
        "rename over empty dir",
        outcome(fs::rename(p("e/sub"), p("g/sub"))),
    );
    step("rename missing", outcome(fs::rename(p("nope"), p("x"))));
    step(
        "noreplace onto existing",
        outcome(host::rename_with_flags(&p("d/f"), &p("s4095"), 1)),
    );
    step(
        "exchange with missing",
        outcome(host::rename_with_flags(&p("d/f"), &p("nope"), 2)),
    );
    step(
        "noreplace|exchange",
        outcome(host::rename_with_flags(&p("d/f"), &p("s4095"), 3)),
    );
    // RENAME_WHITEOUT (4): the source name becomes a character device
    // 0/0 of mode 0, the caller's; not with RENAME_EXCHANGE.
    fs::write(p("w1"), b"w").unwrap();
    fs::write(p("w3"), b"").unwrap();
    let node = |n: &str| {
        fs::symlink_metadata(p(n)).map(|m| (m.mode(), m.rdev(), m.nlink(), m.uid(), m.len()))
    };
    step(
        "whiteout rename",
        outcome(host::rename_with_flags(&p("w1"), &p("w2"), 4)),
    );
    step("whiteout left", outcome(node("w1")));
    step("whiteout moved", outcome(node("w2")));
    step(
        "whiteout over existing",
        outcome(host::rename_with_flags(&p("w2"), &p("w3"), 4)),
    );
    step("whiteout left 2", outcome(node("w2")));
    step(
        "whiteout|exchange",
        outcome(host::rename_with_flags(&p("w3"), &p("d/f"), 6)),
    );
    step(
        "whiteout|noreplace onto existing",
        outcome(host::rename_with_flags(&p("w3"), &p("d/f"), 5)),
    );
    step("unlink whiteout", outcome(fs::remove_file(p("w1"))));
    let f = p("d/f");
    step(
        "xattr set",
        outcome(host::set_xattr_flags(&f, b"user.a", Some(b"1"), 0)),
    );
    step(
        "xattr create existing",
        outcome(host::set_xattr_flags(&f, b"user.a", Some(b"2"), 1)),
    );
    step(
        "xattr replace missing",
        outcome(host::set_xattr_flags(&f, b"user.b", Some(b"2"), 2)),
    );
    step("xattr get missing", outcome(host::get_xattr(&f, b"user.b")));
    step("xattr get", outcome(host::get_xattr(&f, b"user.a")));
    step(
        "xattr remove missing",
        outcome(host::set_xattr_flags(&f, b"user.b", None, 0)),
    );
    step(
        "xattr remove",
        outcome(host::set_xattr_flags(&f, b"user.a", None, 0)),
    );
    step(
        "xattr unknown namespace",
        outcome(host::set_xattr_flags(&f, b"foo.a", Some(b"1"), 0)),
    );
    step(
        "xattr get unknown namespace",
        outcome(host::get_xattr(&f, b"foo.a")),
    );
    step(
        "xattr on a symlink",
        outcome(host::set_xattr_flags(&p("s4095"), b"user.a", Some(b"1"), 0)),
    );
    step(
        "xattr empty name",
        outcome(host::set_xattr_flags(&f, b"user.", Some(b"1"), 0)),
    );
    step(
        "xattr too big for a block",
        outcome(host::set_xattr_flags(
            &f,
            b"user.big",
            Some(&[7u8; 5000]),
            0,
        )),
    );
    step(
        "xattr past 64 KiB",
        outcome(host::set_xattr_flags(
            &f,
            b"user.huge",
            Some(&vec![7u8; 65537]),
            0,
        )),
    );
    step(
        "trusted xattr",
        outcome(host::set_xattr_flags(&f, b"trusted.t", Some(b"1"), 0)),
    );
    let fh = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    let max = (1u64 << 44) - 4096;
    step("truncate to the largest size", outcome(fh.set_len(max)));
    step("truncate past it", outcome(fh.set_len(max + 1)));
    step("write at the end", outcome(fh.write_at(b"x", max)));
    step("write before the end", outcome(fh.write_at(b"xy", max - 1)));
    step("truncate back", outcome(fh.set_len(10_000)));
    step("write at 1 MiB", outcome(fh.write_all_at(b"data", 1 << 20)));
    step("seek data from 0", outcome(host::seek_data_hole(&fh, 0, 3)));
    step("seek hole from 0", outcome(host::seek_data_hole(&fh, 0, 4)));
    step(
        "seek data in the hole",
        outcome(host::seek_data_hole(&fh, 8192, 3)),
    );
    step(
        "seek data past the end",
        outcome(host::seek_data_hole(&fh, 2 << 20, 3)),
    );
    step(
        "seek hole past the end",
        outcome(host::seek_data_hole(&fh, 2 << 20, 4)),
    );
    step(
        "size",
        outcome(fh.metadata().map(|m| (m.len(), m.blocks()))),
    );
    drop(fh);
    step(
        "open a dir for writing",
        outcome(OpenOptions::new().write(true).open(p("d")).map(|_| ())),
    );
    step(
        "fifo",
        outcome(host::mknod(&p("fifo"), libc::S_IFIFO | 0o600, 0, 0)),
    );
    step(
        "fifo again",
        outcome(host::mknod(&p("fifo"), libc::S_IFIFO | 0o600, 0, 0)),
    );
    step(
        "xattr on a fifo",
        outcome(host::set_xattr_flags(&p("fifo"), b"user.a", Some(b"1"), 0)),
    );
    step("unlink .", outcome(fs::remove_dir(p("d/."))));
    step("rmdir the root's ..", outcome(fs::remove_dir(p("d/.."))));
    out
}

#[test]
fn errnos_match_kernel_ext4() {
    let what = "errnos_match_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let km = KernelTwin::new(&img, dir.path().join("kernel.img"), None).unwrap();
    let kernel = errno_script(km.path());
    // A device (or image) the kernel has mounted is refused, with one line.
    let other = tempfile::tempdir().unwrap();
    for target in [km.lo.path(), km.copy.as_path()] {
        let out = run(ext4kit()
            .args(["mount", "-f"])
            .arg(target)
            .arg(other.path()))
        .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("mounted"), "{err}");
    }
    let copy = km.copy.clone();
    km.unmount().unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let ours = errno_script(m.path());
    m.unmount().unwrap();
    assert_eq!(kernel.len(), ours.len());
    let mut diffs = Vec::new();
    for ((w, k), (_, o)) in kernel.iter().zip(&ours) {
        if k != o {
            diffs.push(format!("{w}: kernel {k}, ext4kit {o}"));
        }
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    e2fsck_clean(&img).unwrap();
    e2fsck_clean(&copy).unwrap();
}

/// One write(2) larger than the free space: a short write (the bytes
/// that fit, as ext4's), the next one ENOSPC; the file's size is what
/// the writes returned (before, the FUSE request that met the shortage
/// failed whole while the engine kept and sized what it had written of
/// it), the bytes read back after a remount, the journal not aborted
/// (the mount still writes after a delete), e2fsck clean.
#[test]
fn a_write_past_the_free_space_is_short() {
    let what = "a_write_past_the_free_space_is_short";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "24M");
    let data = pattern(32 << 20, 5);
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = m.path().join("big");
    let mut f = File::create(&p).unwrap();
    let n = f.write(&data).unwrap();
    assert!(n > 0 && n < data.len(), "write of {n}");
    let e = f.write(&data[n..]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    assert_eq!(fs::metadata(&p).unwrap().len(), n as u64);
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    // What the engine sized and kept (not the kernel's cached size).
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = m.path().join("big");
    assert_eq!(
        fs::metadata(&p).unwrap().len(),
        n as u64,
        "size after a remount"
    );
    let back = fs::read(&p).unwrap();
    assert!(back == data[..n], "content after a remount");
    // Space comes back; the filesystem is still writable.
    fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(n as u64 / 2)
        .unwrap();
    fs::write(m.path().join("small"), b"after").unwrap();
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// Calls through the descriptor of a file that is open but unlinked (an
/// orphan: link count 0) on `root`: what each returned, in order, with
/// the attributes they leave. The file has an access ACL, so a chmod
/// must keep its mask in step.
fn orphan_script(root: &Path) -> Vec<(String, String)> {
    let p = root.join("o");
    let mut out = Vec::new();
    let mut step = |what: &str, r: String| out.push((what.to_string(), r));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all_at(b"orphan data", 0).unwrap();
    tool_ok("setfacl", &["-m", "u:1234:rw", p.to_str().unwrap()]);
    step("unlink", outcome(fs::remove_file(&p)));
    let attrs = |f: &File| {
        f.metadata().map(|m| {
            (
                m.nlink(),
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
            )
        })
    };
    // (Its mtime is the write's: not the same on both.)
    step("stat", outcome(attrs(&f).map(|a| (a.0, a.1, a.2, a.3))));
    step(
        "fchmod",
        outcome(f.set_permissions(fs::Permissions::from_mode(0o604))),
    );
    step(
        "acl after fchmod",
        outcome(host::fget_xattr(&f, b"system.posix_acl_access")),
    );
    step(
        "fchown",
        outcome(std::os::unix::fs::fchown(&f, Some(42), Some(43))),
    );
    let t = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 5);
    step("futimens", outcome(f.set_modified(t)));
    step("stat after", outcome(attrs(&f)));
    let set = |name: &[u8], v: Option<&[u8]>, flags| host::fset_xattr_flags(&f, name, v, flags);
    step("fsetxattr", outcome(set(b"user.a", Some(b"1"), 0)));
    step(
        "fsetxattr create existing",
        outcome(set(b"user.a", Some(b"2"), 1)),
    );
    step(
        "fsetxattr replace missing",
        outcome(set(b"user.b", Some(b"2"), 2)),
    );
    // Too big for the inode: an xattr block, freed with the orphan.
    step(
        "fsetxattr big",
        outcome(set(b"user.big", Some(&[7u8; 3000]), 0)),
    );
    step("fgetxattr", outcome(host::fget_xattr(&f, b"user.a")));
    step(
        "fgetxattr big",
        outcome(host::fget_xattr(&f, b"user.big").map(|v| v.len())),
    );
    step(
        "fgetxattr missing",
        outcome(host::fget_xattr(&f, b"user.b")),
    );
    step(
        "flistxattr",
        outcome(host::flist_xattrs(&f).map(|mut v| {
            v.sort();
            v
        })),
    );
    step("fremovexattr", outcome(set(b"user.a", None, 0)));
    step("fremovexattr missing", outcome(set(b"user.a", None, 0)));
    let mut buf = [0u8; 11];
    step("read", outcome(f.read_exact_at(&mut buf, 0).map(|()| buf)));
    drop(f);
    out
}

/// fchmod (its ACL kept in step), fchown, futimens, fsetxattr (one big
/// enough for an xattr block), fgetxattr, flistxattr and fremovexattr on
/// an open, unlinked file do on the mount what they do on the kernel's
/// ext4 (the engine refused link count 0 for times and xattrs, and a
/// chmod there skipped the ACL); the file is freed at its close, e2fsck
/// is clean.
#[test]
fn unlinked_open_file_calls_match_kernel_ext4() {
    let what = "unlinked_open_file_calls_match_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    if !have("setfacl") {
        return skip(what, "setfacl is not installed");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let km = KernelTwin::new(&img, dir.path().join("kernel.img"), None).unwrap();
    let kernel = orphan_script(km.path());
    let copy = km.copy.clone();
    km.unmount().unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let before = free_blocks(m.path());
    let ours = orphan_script(m.path());
    wait_until("the orphan to be freed", Duration::from_secs(10), || {
        free_blocks(m.path()) == before
    })
    .unwrap();
    m.unmount().unwrap();
    assert_eq!(kernel.len(), ours.len());
    let diffs: Vec<String> = kernel
        .iter()
        .zip(&ours)
        .filter(|((_, k), (_, o))| k != o)
        .map(|((w, k), (_, o))| format!("{w}: kernel {k}, ext4kit {o}"))
        .collect();
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    e2fsck_clean(&img).unwrap();
    e2fsck_clean(&copy).unwrap();
}

#[test]
fn concurrent_unlinks_of_open_files() {
    let what = "concurrent_unlinks_of_open_files";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    // Several threads unlink files they hold open and write to them
    // afterwards; the closes free them in any order (the orphan list is
    // shared by all of them).
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let root = m.path().to_path_buf();
            std::thread::spawn(move || {
                for i in 0..60u64 {
                    let p = root.join(format!("t{t}-{i}"));
                    let mut f = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&p)
                        .unwrap();
                    f.write_all(&pattern(((t * 7 + i) % 5 + 1) as usize * 20_000, i))
                        .unwrap();
                    fs::remove_file(&p).unwrap();
                    f.write_all_at(b"still here", 4096).unwrap();
                    let mut b = [0u8; 10];
                    f.read_exact_at(&mut b, 4096).unwrap();
                    assert_eq!(&b, b"still here");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    m.unmount().unwrap();
    assert_eq!(e2fsck_clean(&img).unwrap(), fresh);
}

/// Changing requests in parallel without a lock of the mount's own: four
/// threads append records to one O_APPEND file, make and remove
/// directories in one shared directory, and rename a new file over a file
/// they still hold open (the old one lives on through the descriptor, an
/// orphan from the rename's own transaction, freed at the close). Every
/// record is there once, whole; e2fsck is clean.
#[test]
fn parallel_changes_and_renames_over_open_files() {
    let what = "parallel_changes_and_renames_over_open_files";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let fresh = e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    fs::create_dir(m.path().join("shared")).unwrap();
    const N: u64 = 40;
    const REC: usize = 64;
    let record = |t: u64, i: u64| {
        let mut r = format!("t{t} i{i} ").into_bytes();
        r.resize(REC - 1, b'.');
        r.push(b'\n');
        r
    };
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let root = m.path().to_path_buf();
            std::thread::spawn(move || {
                let mut log = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(root.join("log"))
                    .unwrap();
                for i in 0..N {
                    log.write_all(&record(t, i)).unwrap();
                    let d = root.join("shared").join(format!("d{t}-{i}"));
                    fs::create_dir(&d).unwrap();
                    if i % 2 == 0 {
                        fs::remove_dir(&d).unwrap();
                    }
                    let v = root.join(format!("v{t}"));
                    let mut old = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .open(&v)
                        .unwrap();
                    let body = pattern(5000 + i as usize, 10 * t + i);
                    old.write_all(&body).unwrap();
                    let n = root.join(format!("n{t}"));
                    fs::write(&n, pattern(3000, 1000 + t * N + i)).unwrap();
                    fs::rename(&n, &v).unwrap();
                    let mut back = vec![0u8; body.len()];
                    old.read_exact_at(&mut back, 0).unwrap();
                    assert!(back == body, "v{t} #{i}: the replaced file changed");
                    assert_eq!(old.metadata().unwrap().nlink(), 0);
                    old.write_all_at(b"orphan", 0).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let log = fs::read(m.path().join("log")).unwrap();
    assert_eq!(log.len(), 4 * N as usize * REC);
    let mut recs: Vec<&[u8]> = log.chunks(REC).collect();
    recs.sort();
    let mut want: Vec<Vec<u8>> = (0..4)
        .flat_map(|t| (0..N).map(move |i| record(t, i)))
        .collect();
    want.sort();
    assert!(recs.iter().zip(&want).all(|(a, b)| *a == &b[..]));
    for t in 0..4 {
        let v = fs::read(m.path().join(format!("v{t}"))).unwrap();
        assert!(v == pattern(3000, 1000 + t * N + N - 1), "v{t}");
    }
    let left = fs::read_dir(m.path().join("shared")).unwrap().count();
    assert_eq!(left, 4 * N as usize / 2);
    m.unmount().unwrap();
    let after = e2fsck_clean(&img).unwrap();
    // The log, v0..v3, shared and its directories: nothing else is left.
    assert_eq!(
        used_inodes(&after),
        used_inodes(&fresh).map(|n| n + 6 + 4 * N / 2),
        "{after} / {fresh}"
    );
}

/// Groups of `img` with and without `ITABLE_ZEROED` (dumpe2fs).
fn zeroed_groups(img: &Path) -> (usize, usize) {
    let out = run_ok(tool("dumpe2fs").arg(img)).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let groups: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("Group ") && l.contains(": (Blocks"))
        .collect();
    let zeroed = groups
        .iter()
        .filter(|l| l.contains("ITABLE_ZEROED"))
        .count();
    (zeroed, groups.len() - zeroed)
}

/// An image whose inode tables were left for lazy init over stale bytes
/// (0xAA everywhere before mke2fs): what zeroing must clear.
fn lazy_image(dir: &Path) -> PathBuf {
    let img = dir.join("lazy.img");
    let mut f = File::create(&img).unwrap();
    let chunk = vec![0xAAu8; 1 << 20];
    for _ in 0..256 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    run_ok(tool("mke2fs").args([
        "-q",
        "-F",
        "-t",
        "ext4",
        "-b",
        "4096",
        "-g",
        "8192",
        "-E",
        "lazy_itable_init=1,nodiscard",
        img.to_str().unwrap(),
    ]))
    .unwrap();
    img
}

#[test]
fn online_lazy_init_zeroes_the_tables_while_mounted() {
    let what = "online_lazy_init_zeroes_the_tables_while_mounted";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    // noinit_itable: the tables stay as mke2fs left them.
    let img = lazy_image(dir.path());
    let (_, left) = zeroed_groups(&img);
    assert_eq!(left, 8, "groups left for lazy init");
    let m = FuseMount::new(&img, &["noinit_itable"]).unwrap();
    fs::write(m.path().join("a"), b"a").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = run_ok(ext4kit().arg("status").arg(m.path())).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("lazy init: not running"), "{text}");
    m.unmount().unwrap();
    assert_eq!(zeroed_groups(&img).1, left);
    e2fsck_clean(&img).unwrap();

    // init_itable=0: the worker zeroes every table while files are made.
    let m = FuseMount::new(&img, &["init_itable=0"]).unwrap();
    for i in 0..200 {
        fs::write(m.path().join(format!("f{i}")), pattern(3000, i)).unwrap();
    }
    std::thread::sleep(Duration::from_secs(3));
    // `ext4kit status` shows the worker's progress while mounted.
    let out = run_ok(ext4kit().args(["status", "--json"]).arg(m.path())).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["lazyinit"]["status"]["groups_total"], 8, "{v}");
    assert_eq!(v["lazyinit"]["status"]["state"], "done", "{v}");
    let out = run_ok(ext4kit().arg("status").arg(m.path())).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("lazy init: done, 8/8 groups zeroed"),
        "{text}"
    );
    let status_file = ext4kit_fuse::mount::status_path(&m.path().canonicalize().unwrap());
    m.unmount().unwrap();
    assert!(!status_file.exists(), "the status file goes with the mount");
    let out = ext4kit().arg("status").arg(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && err.contains("not served by a running"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let out = run_ok(tool("dumpe2fs").arg(&img)).unwrap();
    let left: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.starts_with("Group ") && l.contains(": (Blocks") && !l.contains("ITABLE_ZEROED")
        })
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "groups not zeroed: {left:?}");
    e2fsck_clean(&img).unwrap();
    // The files are intact (read back on a read-only mount).
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    for i in 0..200 {
        assert_eq!(
            fs::read(m.path().join(format!("f{i}"))).unwrap(),
            pattern(3000, i),
            "f{i}"
        );
    }
    m.unmount().unwrap();
}

#[test]
fn discard_on_the_mount_gives_the_space_back_at_once() {
    let what = "discard_on_the_mount_gives_the_space_back_at_once";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "1G");
    let allocated = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    let m = FuseMount::new(&img, &["discard"]).unwrap();
    let before = allocated(&img);
    let p = m.path().join("big");
    let mut f = File::create(&p).unwrap();
    let chunk = pattern(1 << 20, 7);
    for _ in 0..96 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    assert!(
        allocated(&img) >= before + (90 << 20),
        "the data reached the image"
    );
    // Delete, then unmount at once: the commit's discards are not lost.
    fs::remove_file(&p).unwrap();
    m.unmount().unwrap();
    let after = allocated(&img);
    assert!(
        after <= before + (4 << 20),
        "allocated {before} before the data, {after} after the delete"
    );
    e2fsck_clean(&img).unwrap();
}

/// `(N bytes) trimmed` of an `fstrim -v` line (util-linux's and ours).
fn trimmed_bytes(out: &std::process::Output) -> u64 {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.ends_with(" bytes) trimmed"));
    line.and_then(|l| l.rsplit_once('(')?.1.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no trimmed line in {text:?}"))
}

#[test]
fn fstrim_on_the_mount_gives_free_space_back() {
    let what = "fstrim_on_the_mount_gives_free_space_back";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "512M");
    let allocated = |p: &Path| fs::metadata(p).unwrap().blocks() * 512;
    let m = FuseMount::new(&img, &["nodiscard"]).unwrap();
    let mnt = m.path().to_path_buf();
    let before = allocated(&img);
    // util-linux fstrim when installed, else ours, for the first trim of
    // each round; the other one for the second.
    let util = have("fstrim");
    let fstrim = |ours: bool, args: &[&str]| {
        let mut c = if ours {
            let mut c = ext4kit();
            c.arg("fstrim");
            c
        } else {
            tool("fstrim")
        };
        c.args(args).arg(&mnt);
        run(&mut c).unwrap()
    };
    for (round, first_ours) in [(0u64, !util), (1, true)] {
        let p = mnt.join(format!("big{round}"));
        let mut f = File::create(&p).unwrap();
        let chunk = pattern(1 << 20, round);
        for _ in 0..64 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        let full = allocated(&img);
        assert!(
            full >= before + (60 << 20),
            "round {round}: data in the image"
        );
        // Deleted and committed without discard: the image keeps it all.
        fs::remove_file(&p).unwrap();
        File::open(&mnt).unwrap().sync_all().unwrap();
        assert!(
            allocated(&img) + (4 << 20) >= full,
            "round {round}: nodiscard"
        );
        let out = fstrim(first_ours, &["-v"]);
        assert!(out.status.success(), "round {round}: {out:?}");
        let n = trimmed_bytes(&out);
        let after = allocated(&img);
        assert!(n >= 60 << 20, "round {round}: trimmed {n}");
        assert!(
            after <= before + (4 << 20),
            "round {round}: allocated {before} before the data, {after} after fstrim"
        );
        // What it says it trimmed is what the image gave back.
        assert!(
            n.abs_diff(full - after) <= 2 << 20,
            "round {round}: trimmed {n}, the image shrank by {}",
            full - after
        );
        // Nothing freed since: a second run (with the other tool) trims
        // nothing.
        let second_ours = !first_ours || !util;
        let out = fstrim(second_ours, &["-v"]);
        assert!(out.status.success(), "round {round}: {out:?}");
        assert_eq!(trimmed_bytes(&out), 0, "round {round}: second fstrim");
    }
    // FITRIM's refusals, as ext4 gives them: a start past the end, a
    // length shorter than a block, a minimum larger than a group.
    for args in [&["-o", "1G"][..], &["-l", "1K"][..], &["-m", "256M"][..]] {
        let out = fstrim(true, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        assert!(err.contains("Invalid argument"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    let out = run(ext4kit().args(["fstrim", "--json"]).arg(&mnt)).unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["trimmed_bytes"], 0, "{v}");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    // A read-only mount opened its device read-only: EROFS.
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    let out = run(ext4kit().arg("fstrim").arg(m.path())).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Read-only file system"),
        "{err}"
    );
    m.unmount().unwrap();
}

/// `-o writeback_cache`: the kernel's page cache holds the writes and
/// hands them over by writeback. An `O_APPEND` handle's pages are written
/// back where the kernel put them (not again at the engine's end of
/// file); `SEEK_DATA` never calls dirty data a hole; a file created in a
/// directory with a default ACL shows, through the mount and after the
/// unmount, the ctime the ACL gave it.
#[test]
fn writeback_cache_keeps_append_seek_and_ctime() {
    let what = "writeback_cache_keeps_append_seek_and_ctime";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("setfacl") {
        return skip(what, "setfacl not found");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &["writeback_cache"]).unwrap();
    let p = |s: &str| m.path().join(s);
    // O_APPEND on a file whose start is on the engine already.
    fs::write(p("log"), b"xyz").unwrap();
    File::open(p("log")).unwrap().sync_all().unwrap();
    let mut f = OpenOptions::new().append(true).open(p("log")).unwrap();
    f.write_all(b"1").unwrap();
    f.sync_all().unwrap();
    f.write_all(b"23").unwrap();
    drop(f);
    // Dirty data past a hole, not written back yet.
    let f = File::create(p("sparse")).unwrap();
    f.write_all_at(&pattern(4096, 9), 1 << 20).unwrap();
    let at = host::seek_data_hole(&f, 0, 3).expect("SEEK_DATA over dirty data");
    assert!(at <= 1 << 20, "SEEK_DATA at {at}");
    drop(f);
    // Default ACL: the new file's ACL is set after it is made.
    fs::create_dir(p("acl")).unwrap();
    run_ok(
        tool("setfacl")
            .args(["-d", "-m", "u:1234:rw"])
            .arg(p("acl")),
    )
    .unwrap();
    fs::write(p("acl/f"), b"").unwrap();
    let ct = |md: fs::Metadata| (md.ctime(), md.ctime_nsec());
    let seen = ct(fs::metadata(p("acl/f")).unwrap());
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(ct(fs::metadata(p("acl/f")).unwrap()), seen, "past the TTL");
    assert_eq!(fs::read(p("log")).unwrap(), b"xyz123");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    let p = |s: &str| m.path().join(s);
    assert_eq!(fs::read(p("log")).unwrap(), b"xyz123");
    assert_eq!(
        fs::read(p("sparse")).unwrap()[1 << 20..],
        pattern(4096, 9)[..]
    );
    assert_eq!(ct(fs::metadata(p("acl/f")).unwrap()), seen, "on the disk");
    m.unmount().unwrap();
}

/// SEEK_DATA/SEEK_HOLE over data written into holes and not fsynced,
/// in `root`: every answer (twice, with more writes between), the size,
/// and a `cp --sparse=always` copy's bytes and answers.
fn dirty_seek_script(root: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let p = root.join("s");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let probes: Vec<u64> = vec![
        0,
        4096,
        1 << 20,
        (1 << 20) + 4095,
        (1 << 20) + 4096,
        2 << 20,
        3 << 20,
        (3 << 20) + 100,
        (3 << 20) + 1024,
        (3 << 20) + 4096,
        (5 << 20) - 2,
        5 << 20,
        6 << 20,
        8 << 20,
        (8 << 20) + 9999,
        (8 << 20) + 10_000,
        9 << 20,
    ];
    let seeks = |f: &File, round: &str, out: &mut Vec<(String, String)>| {
        for &o in &probes {
            for (w, name) in [(libc::SEEK_DATA, "data"), (libc::SEEK_HOLE, "hole")] {
                let r = outcome(host::seek_data_hole(f, o as i64, w));
                out.push((format!("{round}: seek {name} from {o}"), r));
            }
        }
        let md = f.metadata().unwrap();
        out.push((format!("{round}: size"), md.len().to_string()));
    };
    for (off, len) in [
        (1u64 << 20, 4096usize),
        ((3 << 20) + 100, 1),
        ((5 << 20) - 1, 2),
        (8 << 20, 10_000),
    ] {
        f.write_all_at(&pattern(len, off), off).unwrap();
    }
    seeks(&f, "first", &mut out);
    // More dirty pages, also before what the first round wrote back.
    f.write_all_at(b"x", 2 << 20).unwrap();
    f.write_all_at(&pattern(3000, 7), 6 << 20).unwrap();
    seeks(&f, "second", &mut out);
    let c = root.join("c");
    run_ok(tool("cp").arg("--sparse=always").arg(&p).arg(&c)).unwrap();
    let same = fs::read(&p).unwrap() == fs::read(&c).unwrap();
    out.push(("cp keeps the bytes".into(), same.to_string()));
    let cf = File::open(&c).unwrap();
    seeks(&cf, "copy", &mut out);
    out
}

/// `-o writeback_cache`: SEEK_DATA/SEEK_HOLE over dirty pages the kernel
/// has not written back answer as the kernel's ext4 answers over its
/// delayed-allocation pages (the mount has the kernel write the range
/// back first); `cp --sparse=always` keeps the data and the holes;
/// e2fsck clean. With 1 KiB blocks the kernel's FUSE writes back whole
/// 4 KiB pages (zeros around a partial write included), so what ext4 calls
/// a hole next to a partial write is data here: there no data is ever
/// missed (SEEK_DATA no later, SEEK_HOLE no earlier than the kernel's).
#[test]
fn writeback_cache_seek_data_as_kernel_ext4() {
    let what = "writeback_cache_seek_data_as_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    for bs in ["4096", "1024"] {
        let dir = image_dir();
        let img = mkimg(dir.path(), "fs.img", "64M", &["-b", bs]);
        let km = KernelTwin::new(&img, dir.path().join("kernel.img"), None).unwrap();
        let kernel = dirty_seek_script(km.path());
        km.unmount().unwrap();
        let m = FuseMount::new(&img, &["writeback_cache"]).unwrap();
        let ours = dirty_seek_script(m.path());
        m.unmount().unwrap();
        assert_eq!(kernel.len(), ours.len());
        let num = |r: &str| r.strip_prefix("ok ").and_then(|n| n.parse::<u64>().ok());
        let diffs: Vec<String> = kernel
            .iter()
            .zip(&ours)
            .filter(|((w, k), (_, o))| {
                if bs == "4096" || k == o {
                    return k != o;
                }
                // 1 KiB blocks: ours may see more data, never less.
                match (num(k), num(o)) {
                    (Some(k), Some(o)) if w.contains("seek data") => o > k,
                    (Some(k), Some(o)) if w.contains("seek hole") => o < k,
                    _ => true,
                }
            })
            .map(|((w, k), (_, o))| format!("{w}: kernel {k}, ext4kit {o}"))
            .collect();
        assert!(diffs.is_empty(), "block size {bs}:\n{}", diffs.join("\n"));
        assert!(
            ours.iter()
                .any(|(w, r)| w == "cp keeps the bytes" && r == "true")
        );
        e2fsck_clean(&img).unwrap();
    }
}

/// The chattr/lsattr workload of [`lsattr_and_chattr_as_kernel_ext4`]:
/// every command's exit status and every lsattr line, on the tree at $1.
const FLAGS_SCRIPT: &str = r#"cd "$1" || exit 1
r() { "$@" >/dev/null 2>&1; echo "$* -> $?"; }
echo hi > f; mkdir d; echo t > d/t; mknod p p
lsattr f; lsattr -d d
r chattr +i f; lsattr f
r sh -c 'echo x >> f'; r rm f; r mv f g; r chmod 600 f; r touch f; r ln f h
r setfattr -n user.a -v 1 f; r truncate -s 0 f
r chattr +i f; r chattr +d f; r chattr -i f
r chattr +a f; lsattr f
r sh -c 'echo y >> f'; r sh -c 'echo z > f'; r truncate -s 0 f; r rm f; r chmod 600 f
r touch f; r fallocate -l 8192 f; r fallocate -p -o 0 -l 4096 f; r setfattr -n user.b -v 1 f
r chattr +j f; r chattr +T f; r chattr +A +d +S f; lsattr f; r chattr -a f; r chattr -ASd f
r chattr +i d; r touch d/new; r rm d/t; r mv d/t x; r mv f d/f; r chattr -i d
r chattr +a d; r touch d/new2; r rm d/new2; r mv d/new2 d/n3; r mv f d/f2; lsattr -d d
r chattr -a d; r chattr +T d; r chattr +D d; lsattr -d d
r chattr +d p; r chattr +A d/t; r chattr +i d/t
cat d/f2 d/t
"#;

/// lsattr/chattr on the mount answer as on a kernel ext4 mount of the
/// same image (same flags shown, same exit status for every refused
/// change: EPERM on immutable and append-only files and directories,
/// EOPNOTSUPP for flags that cannot be set), the flags reach the disk
/// (a kernel mount lists them), e2fsck is clean. `chattr -e` is
/// refused (EOPNOTSUPP) where the kernel would migrate to a block map.
#[test]
fn lsattr_and_chattr_as_kernel_ext4() {
    let what = "lsattr_and_chattr_as_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|_| kernel_mount_available()) {
        return skip(what, &e);
    }
    for t in ["lsattr", "chattr", "setfattr", "fallocate", "mknod", "sh"] {
        if !have(t) {
            return skip(what, &format!("{t} not found"));
        }
    }
    let dir = image_dir();
    let script = dir.path().join("flags.sh");
    fs::write(&script, FLAGS_SCRIPT).unwrap();
    let ours = mkfs(dir.path(), "64M");
    let theirs = dir.path().join("kernel.img");
    sparse_copy(&ours, &theirs);
    let run_script = |m: &Path| {
        let o = run(tool("bash").arg(&script).arg(m)).unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let listing = |m: &Path| {
        let o = run_ok(tool("lsattr").arg("-d").arg(m.join("d")).arg(m.join("d/t"))).unwrap();
        String::from_utf8_lossy(&o.stdout).replace(&m.display().to_string(), "")
    };
    let (want, want_disk) = {
        let lo = LoopDev::attach(&theirs).unwrap();
        let k = Mount::new(lo.path(), "ext4", None).unwrap();
        let out = run_script(k.path());
        let l = listing(k.path());
        k.unmount().unwrap();
        (out, l)
    };
    let m = FuseMount::new(&ours, &[]).unwrap();
    let got = run_script(m.path());
    let f = m.path().join("d/f2");
    let e = run(tool("chattr").arg("-e").arg(&f)).unwrap();
    assert!(
        String::from_utf8_lossy(&e.stderr).contains("Operation not supported"),
        "chattr -e: {e:?}"
    );
    m.unmount().unwrap();
    assert_eq!(got, want, "the script on the mount vs on kernel ext4");
    assert!(want.contains("-----a--------e------- d"), "{want}");
    e2fsck_clean(&ours).unwrap();
    let lo = LoopDev::attach(&ours).unwrap();
    let k = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    assert_eq!(listing(k.path()), want_disk, "flags on disk");
    k.unmount().unwrap();
}

/// The workload of [`stale_handles_after_inode_reuse_are_estale`] on
/// the mount at argv[1].
const HANDLES_PY: &str = r#"
import ctypes, errno, fcntl, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
class FH(ctypes.Structure):
    _fields_ = [("n", ctypes.c_uint), ("t", ctypes.c_int), ("h", ctypes.c_ubyte * 128)]
def handle(p):
    fh = FH(); fh.n = 128; mid = ctypes.c_int()
    if libc.name_to_handle_at(-100, p.encode(), ctypes.byref(fh), ctypes.byref(mid), 0) != 0:
        raise OSError(ctypes.get_errno(), "name_to_handle_at")
    return fh
def open_h(m, fh):
    mfd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    fd = libc.open_by_handle_at(mfd, ctypes.byref(fh), os.O_RDONLY)
    e = ctypes.get_errno(); os.close(mfd)
    if fd < 0: return errno.errorcode[e]
    d = os.read(fd, 100).decode(); os.close(fd); return d
def gen(p):
    fd = os.open(p, os.O_RDONLY)
    g = struct.unpack("I", fcntl.ioctl(fd, 0x80047601, b"\0" * 4))[0]; os.close(fd); return g
m = sys.argv[1]
a, b = m + "/a", m + "/b"
open(a, "w").write("old")
ia, ga, ha = os.stat(a).st_ino, gen(a), handle(a)
print("a", open_h(m, ha))
os.unlink(a)
open(b, "w").write("new")
print("reused", os.stat(b).st_ino == ia, "generation changed", gen(b) != ga)
print("stale", open_h(m, ha))
print("b", open_h(m, handle(b)))
print("gen", gen(b))
"#;

/// A file handle (name_to_handle_at) of a deleted file whose inode
/// number a new file reuses opens nothing: ESTALE, because the entry
/// replies carry `i_generation` and the kernel compares it; the new
/// file's own handle opens it. FS_IOC_GETVERSION (`lsattr -v`) shows
/// the generations, different for the two files, and a kernel mount of
/// the image shows the same.
#[test]
fn stale_handles_after_inode_reuse_are_estale() {
    let what = "stale_handles_after_inode_reuse_are_estale";
    if let Err(e) = fuse_available().and_then(|_| kernel_mount_available()) {
        return skip(what, &e);
    }
    if !have("python3") {
        return skip(what, "python3 not found");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let out = run_ok(tool("python3").arg("-c").arg(HANDLES_PY).arg(m.path())).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    m.unmount().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "a old",
            "reused True generation changed True",
            "stale ESTALE",
            "b new"
        ],
        "{text}"
    );
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let k = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let v = run_ok(tool("lsattr").arg("-v").arg(k.path().join("b"))).unwrap();
    k.unmount().unwrap();
    let kernel_gen = String::from_utf8_lossy(&v.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    assert_eq!(lines[4], format!("gen {kernel_gen}"), "{text}");
}

/// The mount's request counts (`ext4kit status --json`, whose file the
/// mount rewrites every second: waited for).
fn request_counts(m: &Path) -> serde_json::Value {
    std::thread::sleep(Duration::from_millis(1300));
    let out = run_ok(ext4kit().args(["status", "--json"]).arg(m)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["requests"].clone()
}

/// The round trips the mount saves (issue 8's postmark goal): writes
/// ask for `security.capability` once per file, not once per write(2)
/// (`FUSE_HANDLE_KILLPRIV_V2`, so the mount clears set-user-ID/set-group-ID
/// itself: checked for a write by another user, a truncate and a
/// chown); names and attributes stay cached past one second (no LOOKUP
/// or GETATTR on reopening a file); `ls -l` of a directory whose entries
/// the kernel has not cached gets them with READDIRPLUS, not one LOOKUP
/// per name.
#[test]
fn metadata_round_trips_are_saved() {
    let what = "metadata_round_trips_are_saved";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &["allow_other"]).unwrap();
    let p = |s: &str| m.path().join(s);
    let before = request_counts(m.path());
    let mut f = File::create(p("w")).unwrap();
    for k in 0..200u64 {
        f.write_all(&pattern(4096, k)).unwrap();
    }
    drop(f);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let after = request_counts(m.path());
    let gx = n(&after, "getxattr") - n(&before, "getxattr");
    assert!(gx <= 2, "{gx} GETXATTRs for 200 writes");
    // Reopened after more than a second: from the kernel's caches (the
    // writes made its attributes stale: one stat fetches them first).
    fs::metadata(p("w")).unwrap();
    let c0 = request_counts(m.path());
    let md = fs::metadata(p("w")).unwrap();
    assert_eq!(md.len(), 200 * 4096);
    assert_eq!(fs::read(p("w")).unwrap()[4096..8192], pattern(4096, 1)[..]);
    let c1 = request_counts(m.path());
    assert_eq!(n(&c1, "lookup"), n(&c0, "lookup"), "LOOKUP after 1 s");
    assert_eq!(n(&c1, "getattr"), n(&c0, "getattr"), "GETATTR after 1 s");
    // Set-user-ID and group-executable set-group-ID cleared as the kernel
    // clears them: a write by another user, a truncate by another user,
    // a chown (by root too); not by a write of root's.
    let mode = |s: &str| fs::metadata(p(s)).unwrap().mode() & 0o7777;
    for s in ["s1", "s2", "s3", "s4"] {
        fs::write(p(s), b"x").unwrap();
        fs::set_permissions(p(s), fs::Permissions::from_mode(0o6777)).unwrap();
    }
    fs::OpenOptions::new()
        .append(true)
        .open(p("s1"))
        .unwrap()
        .write_all(b"root")
        .unwrap();
    assert_eq!(mode("s1"), 0o6777, "root's write keeps the bits");
    let as_nobody = |script: &str| {
        let ok = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                script,
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "{script}");
    };
    as_nobody(&format!("echo x >> {}", p("s1").display()));
    assert_eq!(mode("s1"), 0o0777, "a write by another user");
    as_nobody(&format!("truncate -s 0 {}", p("s2").display()));
    assert_eq!(mode("s2"), 0o0777, "a truncate by another user");
    std::os::unix::fs::chown(p("s3"), Some(65534), None).unwrap();
    assert_eq!(mode("s3"), 0o0777, "a chown");
    fs::set_permissions(p("s4"), fs::Permissions::from_mode(0o6767)).unwrap();
    as_nobody(&format!("echo x >> {}", p("s4").display()));
    assert_eq!(
        mode("s4"),
        0o2767,
        "set-group-ID without group execute stays"
    );
    // ls -l of 100 names the kernel has not seen.
    fs::create_dir(p("d")).unwrap();
    for k in 0..100 {
        fs::write(p(&format!("d/f{k:03}")), b"").unwrap();
    }
    m.unmount().unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let before = request_counts(m.path());
    let mut names = 0;
    for e in fs::read_dir(m.path().join("d")).unwrap() {
        let e = e.unwrap();
        assert_eq!(fs::symlink_metadata(e.path()).unwrap().len(), 0);
        names += 1;
    }
    assert_eq!(names, 100);
    let after = request_counts(m.path());
    let lookups = n(&after, "lookup") - n(&before, "lookup");
    assert!(n(&after, "readdirplus") > n(&before, "readdirplus"));
    assert!(lookups <= 2, "{lookups} LOOKUPs for ls -l of 100 names");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// Write-only opens are served with `FOPEN_DIRECT_IO` (killpriv v2, no
/// writeback cache: `ops.rs::direct_write`), so the kernel asks no
/// GETXATTR of `security.capability` before their first write (the
/// cached path asked one per file: the CREATE's attributes clear
/// `S_NOSEC`). What the kernel then leaves to the mount is done as ext4
/// does it, one script on a kernel loop mount and on the mount compared:
/// `security.capability` removed by any write (root's too, write-only or
/// read-write open) and by a chown, set-user-ID cleared by another
/// user's write, and a write-only O_DSYNC write durable when it returns
/// (kill -9 right after it, idle commit off, `commit=30`).
#[test]
fn write_only_opens_ask_no_capability_and_kill_it_as_ext4() {
    let what = "write_only_opens_ask_no_capability_and_kill_it_as_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    for t in ["setcap", "getcap", "setpriv"] {
        if !have(t) {
            return skip(what, &format!("{t} not found"));
        }
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let script = "set -e; mkdir t; chmod 777 t; cd t
        for f in a b c e; do printf 0 > $f; done; chmod 4757 e
        for f in a b c e; do setcap cap_net_raw+ep $f; done
        printf x >> a
        exec 3<>b; printf y >&3; exec 3>&-
        chown 65534 c
        setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'printf z >> e'
        for f in a b c e; do echo \"$f $(getcap $f | wc -l) $(stat -c '%a %s %u' $f)\"; done";
    let run = |root: &Path| -> String {
        let out = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let twin = KernelTwin::new(&img, dir.path().join("kernel.img"), None).unwrap();
    let want = run(twin.path());
    twin.unmount().unwrap();
    // Every capability gone on ext4 (the second field: getcap's lines).
    assert!(
        want.lines().all(|l| l.split(' ').nth(1) == Some("0")),
        "{want}"
    );
    let m = FuseMount::with_env(
        &img,
        &["commit=30", "allow_other"],
        &[("EXT4KIT_IDLE_COMMIT", "0")],
    )
    .unwrap();
    let p = |s: &str| m.path().join(s);
    assert_eq!(run(m.path()), want);
    // No GETXATTR for a file created and written write-only.
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let before = request_counts(m.path());
    let mut f = File::create(p("w")).unwrap();
    for k in 0..50u64 {
        f.write_all(&pattern(3000, k)).unwrap();
    }
    drop(f);
    let after = request_counts(m.path());
    let gx = n(&after, "getxattr") - n(&before, "getxattr");
    assert_eq!(gx, 0, "GETXATTRs for a write-only file");
    assert_eq!(
        fs::read(p("w")).unwrap(),
        (0..50u64)
            .flat_map(|k| pattern(3000, k))
            .collect::<Vec<u8>>()
    );
    // O_DSYNC on a write-only (direct) open: durable at the return.
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DSYNC)
        .open(p("dsync"))
        .unwrap();
    f.write_all(&pattern(5000, 7)).unwrap();
    m.kill9();
    let m = FuseMount::new(&img, &[]).unwrap();
    assert_eq!(fs::read(m.path().join("dsync")).unwrap(), pattern(5000, 7));
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// A file's (mtime, ctime) as nanoseconds since the epoch.
fn mc_times(md: &fs::Metadata) -> (i128, i128) {
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (
        ns(md.mtime(), md.mtime_nsec()),
        ns(md.ctime(), md.ctime_nsec()),
    )
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// The default mount's write-behind buffer: 4 KiB writes are answered
/// from it and reach the engine merged (a handful of engine writes for
/// hundreds of `write(2)`s, counted in the status file), and what the
/// kernel is shown stays exact while they are buffered: partial pages
/// read through another handle, size, `st_blocks`, SEEK_DATA/SEEK_HOLE,
/// and mtime/ctime at the time of the write (also when the one-second
/// timer flushed them, and after the unmount). An fsync'ed file survives
/// a `kill -9` right after more buffered writes to it (those may be lost,
/// but only from the end).
#[test]
fn small_writes_are_buffered_and_stay_exact() {
    let what = "small_writes_are_buffered_and_stay_exact";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    let n = |v: &serde_json::Value, k: &str| v["wbuf"][k].as_u64().unwrap();
    let before = request_counts(m.path());
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(p("a"))
        .unwrap();
    let t0 = now_ns();
    let mut model = Vec::new();
    for k in 0..256u64 {
        let d = pattern(4096, k);
        f.write_all_at(&d, k * 4096).unwrap();
        model.extend_from_slice(&d);
    }
    f.write_all_at(b"hello", 5000).unwrap();
    model[5000..5005].copy_from_slice(b"hello");
    let tail = pattern(100, 99);
    f.write_all_at(&tail, 3 << 20).unwrap();
    let t1 = now_ns();
    // Partial pages are not in the kernel's page cache: READs.
    let g = File::open(p("a")).unwrap();
    let mut buf = [0u8; 10];
    g.read_exact_at(&mut buf, 4998).unwrap();
    assert_eq!(buf[..], model[4998..5008]);
    let mut buf = [0u8; 100];
    g.read_exact_at(&mut buf, 3 << 20).unwrap();
    assert_eq!(buf[..], tail[..]);
    let md = fs::metadata(p("a")).unwrap();
    assert_eq!(md.len(), (3 << 20) + 100);
    assert_eq!(md.blocks(), 257 * 8, "256 blocks, a hole, one block");
    let (mt, ct) = mc_times(&md);
    assert!(t0 <= mt && mt <= t1, "mtime {mt} not in [{t0}, {t1}]");
    assert_eq!(mt, ct);
    assert_eq!(host::seek_data_hole(&g, 0, 4).unwrap(), 1 << 20);
    assert_eq!(host::seek_data_hole(&g, 1 << 20, 3).unwrap(), 3 << 20);
    // Flushed by the timer, not by a request: still the writes' times.
    let t2 = now_ns();
    for k in 0..64u64 {
        f.write_all_at(&pattern(1000, k), (8 << 20) + k * 1000)
            .unwrap();
    }
    let t3 = now_ns();
    std::thread::sleep(Duration::from_millis(2500));
    let (mt, ct) = mc_times(&fs::metadata(p("a")).unwrap());
    assert!(
        t2 <= mt && mt <= t3,
        "timer flush: mtime {mt} not in [{t2}, {t3}]"
    );
    assert_eq!(mt, ct);
    let after = request_counts(m.path());
    let buffered = n(&after, "buffered_writes") - n(&before, "buffered_writes");
    let ranges = n(&after, "flushed_ranges") - n(&before, "flushed_ranges");
    assert!(buffered >= 322, "{buffered} writes buffered");
    assert!(
        ranges <= 8,
        "{ranges} engine writes for {buffered} buffered ones"
    );
    drop((f, g));
    let seen = fs::metadata(p("a")).unwrap();
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let mut full = model.clone();
    full.resize(3 << 20, 0);
    full.extend_from_slice(&tail);
    full.resize(8 << 20, 0);
    for k in 0..64u64 {
        full.extend_from_slice(&pattern(1000, k));
    }
    // An fsync'ed file and a kill -9 right after more buffered writes.
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    assert_eq!(fs::read(p("a")).unwrap(), full);
    assert_eq!(mc_times(&fs::metadata(p("a")).unwrap()), mc_times(&seen));
    let mut c = File::create(p("c")).unwrap();
    for k in 0..100u64 {
        c.write_all(&pattern(4096, k)).unwrap();
    }
    c.sync_all().unwrap();
    for k in 100..200u64 {
        c.write_all(&pattern(4096, k)).unwrap();
    }
    m.kill9();
    let m = FuseMount::new(&img, &[]).unwrap();
    let got = fs::read(m.path().join("c")).unwrap();
    assert!(got.len() >= 100 * 4096 && got.len() <= 200 * 4096 && got.len().is_multiple_of(4096));
    for (k, chunk) in got.chunks(4096).enumerate() {
        assert_eq!(chunk, &pattern(4096, k as u64)[..], "block {k} of c");
    }
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// The write-behind buffer holds several inodes at once: four threads
/// write two files of their own and their quarter of a shared one,
/// interleaved (small random writes, each thread reading its bytes back
/// through a second handle now and then, and checking the size), and
/// every file equals its model after the join, after the unmount and
/// e2fsck, and after a remount. Then several files are buffered at once,
/// some fsync'ed (and written no more), others written further, and a
/// `kill -9` keeps every fsync'ed file whole.
#[test]
fn several_buffered_files_match_a_model_and_fsynced_ones_survive_kill9() {
    let what = "several_buffered_files_match_a_model_and_fsynced_ones_survive_kill9";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    const FILE: u64 = 1 << 20;
    let dir = image_dir();
    let img = mkfs(dir.path(), "256M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let n = |v: &serde_json::Value, k: &str| v["wbuf"][k].as_u64().unwrap();
    let before = request_counts(m.path());
    File::create(m.path().join("shared")).unwrap();
    let models: Vec<Vec<(String, u64, Vec<u8>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4u64)
            .map(|k| {
                let root = m.path().to_path_buf();
                sc.spawn(move || {
                    let mut rng = Rng(0x1357_9bdf_2468_ace1 ^ (k + 1));
                    let names = [format!("t{k}a"), format!("t{k}b"), "shared".to_string()];
                    let open = |name: &str| {
                        OpenOptions::new()
                            .create(true)
                            .truncate(false)
                            .read(true)
                            .write(true)
                            .open(root.join(name))
                            .unwrap()
                    };
                    let files: Vec<File> = names.iter().map(|n| open(n)).collect();
                    let readers: Vec<File> = names.iter().map(|n| open(n)).collect();
                    let bases = [0, 0, k * (FILE / 4)];
                    let spans = [FILE, FILE, FILE / 4];
                    let mut ms = vec![Vec::new(), Vec::new(), Vec::new()];
                    for step in 0..1500u64 {
                        let i = rng.below(3) as usize;
                        let len = 1 + rng.below(6000);
                        let off = rng.below(spans[i] - len);
                        let d = pattern(len as usize, step * 4 + k);
                        files[i].write_all_at(&d, bases[i] + off).unwrap();
                        let m = &mut ms[i];
                        let e = (off + len) as usize;
                        if m.len() < e {
                            m.resize(e, 0);
                        }
                        m[off as usize..e].copy_from_slice(&d);
                        if rng.below(50) == 0 {
                            // Read-after-write through the buffer.
                            let a = rng.below(m.len() as u64) as usize;
                            let b = (a + 1 + rng.below(9000) as usize).min(m.len());
                            let mut got = vec![0u8; b - a];
                            readers[i]
                                .read_exact_at(&mut got, bases[i] + a as u64)
                                .unwrap();
                            assert!(got[..] == m[a..b], "thread {k}: {} at {a}", names[i]);
                            if i < 2 {
                                let size = readers[i].metadata().unwrap().len();
                                assert_eq!(size, m.len() as u64, "thread {k}: {}", names[i]);
                            }
                        }
                    }
                    names
                        .into_iter()
                        .zip(bases)
                        .zip(ms)
                        .map(|((n, b), m)| (n, b, m))
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let check = |root: &Path| {
        for (k, files) in models.iter().enumerate() {
            for (name, base, want) in files {
                let got = fs::read(root.join(name)).unwrap();
                let b = *base as usize;
                let part = got.get(b..b + want.len()).unwrap_or_default();
                assert!(
                    part == &want[..],
                    "thread {k}: {name} differs from its model"
                );
                if name != "shared" {
                    assert_eq!(got.len(), want.len(), "thread {k}: {name}");
                }
            }
        }
    };
    check(m.path());
    let after = request_counts(m.path());
    let buffered = n(&after, "buffered_writes") - n(&before, "buffered_writes");
    assert!(buffered >= 4000, "{buffered} of 6000 writes buffered");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    check(m.path());
    // Six files buffered at once (a thread each: one thread's writes of
    // another file flush its previous one); three fsync'ed and left
    // alone, three written further; then kill -9.
    let written = std::sync::Barrier::new(6);
    std::thread::scope(|sc| {
        for i in 0..6u64 {
            let (root, written) = (m.path().to_path_buf(), &written);
            sc.spawn(move || {
                let mut f = File::create(root.join(format!("k{i}"))).unwrap();
                for k in 0..64u64 {
                    f.write_all(&pattern(4096, k * 8 + i)).unwrap();
                }
                written.wait();
                if i % 2 == 0 {
                    f.sync_all().unwrap();
                } else {
                    for k in 64..128u64 {
                        f.write_all(&pattern(4096, k * 8 + i)).unwrap();
                    }
                }
            });
        }
    });
    m.kill9();
    let m = FuseMount::new(&img, &[]).unwrap();
    for i in 0..6u64 {
        let got = fs::read(m.path().join(format!("k{i}"))).unwrap();
        if i % 2 == 0 {
            assert_eq!(got.len(), 64 * 4096, "k{i} was fsync'ed");
        }
        assert!(got.len().is_multiple_of(4096), "k{i}: {} bytes", got.len());
        for (k, chunk) in got.chunks(4096).enumerate() {
            assert!(
                chunk == &pattern(4096, k as u64 * 8 + i)[..],
                "block {k} of k{i}"
            );
        }
    }
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// What ext4 refuses at `write(2)` time is still refused then, not at a
/// later flush: EFBIG at the largest file (a write across it is cut
/// there), EPERM on a file made immutable while open for writing
/// (`chattr +i` reaches the engine after the writes before it), ENOSPC
/// when the filesystem fills (every write answered before it is on the
/// disk after the fsync, which succeeds).
#[test]
fn buffered_writes_fail_at_write_time_as_ext4() {
    let what = "buffered_writes_fail_at_write_time_as_ext4";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    if !have("chattr") {
        return skip(what, "chattr not found");
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    let max = u64::from(u32::MAX) * 4096;
    let big = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(p("big"))
        .unwrap();
    big.write_all_at(b"x", 4096).unwrap();
    assert_eq!(big.write_at(b"ab", max - 1).unwrap(), 1);
    assert_eq!(
        errno_of(big.write_at(b"a", max).map(|_| ())),
        Some(libc::EFBIG)
    );
    big.sync_all().unwrap();
    assert_eq!(fs::metadata(p("big")).unwrap().len(), max);
    drop(big);
    fs::remove_file(p("big")).unwrap();
    // Immutable while open.
    let mut im = File::create(p("im")).unwrap();
    im.write_all(&pattern(4096, 1)).unwrap();
    run_ok(tool("chattr").arg("+i").arg(p("im"))).unwrap();
    assert_eq!(errno_of(im.write_all(&pattern(4096, 2))), Some(libc::EPERM));
    run_ok(tool("chattr").arg("-i").arg(p("im"))).unwrap();
    drop(im);
    assert_eq!(fs::read(p("im")).unwrap(), pattern(4096, 1));
    // Full.
    let mut fill = File::create(p("fill")).unwrap();
    let mut done = 0u64;
    let err = loop {
        match fill.write(&pattern(4096, done / 4096)) {
            Ok(4096) => done += 4096,
            Ok(k) => panic!("short write of {k} bytes at {done}"),
            Err(e) => break e,
        }
        assert!(done < 128 << 20, "no ENOSPC on a 64 MiB filesystem");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(done > 32 << 20, "ENOSPC after {done} bytes");
    fill.sync_all().unwrap();
    drop(fill);
    let got = fs::read(p("fill")).unwrap();
    assert_eq!(got.len() as u64, done);
    for (k, chunk) in got.chunks(4096).enumerate() {
        assert_eq!(chunk, &pattern(4096, k as u64)[..], "block {k} of fill");
    }
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// Writes that must be durable when `write(2)` returns go to the engine
/// directly, not through the write-behind buffer: O_DSYNC and O_SYNC
/// handles, and every write of a `-o sync` mount (the buffer's count in
/// the status file stays where it was; the data is there after the
/// unmount).
#[test]
fn sync_writes_bypass_the_write_behind_buffer() {
    let what = "sync_writes_bypass_the_write_behind_buffer";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    use std::os::unix::fs::OpenOptionsExt;
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let buffered = |v: &serde_json::Value| v["wbuf"]["buffered_writes"].as_u64().unwrap();
    for opts in [&[][..], &["sync"][..]] {
        let m = FuseMount::new(&img, opts).unwrap();
        let p = |s: &str| m.path().join(s);
        let before = request_counts(m.path());
        for (name, flag) in [("dsync", libc::O_DSYNC), ("sync", libc::O_SYNC)] {
            let mut f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .custom_flags(if opts.is_empty() { flag } else { 0 })
                .open(p(name))
                .unwrap();
            for k in 0..10u64 {
                f.write_all(&pattern(4096, k)).unwrap();
            }
        }
        let after = request_counts(m.path());
        assert_eq!(buffered(&after), buffered(&before), "-o {opts:?}");
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
        let m = FuseMount::new(&img, &["ro"]).unwrap();
        let want: Vec<u8> = (0..10u64).flat_map(|k| pattern(4096, k)).collect();
        for name in ["dsync", "sync"] {
            assert_eq!(fs::read(m.path().join(name)).unwrap(), want);
        }
        m.unmount().unwrap();
    }
    // The default mount with a plain handle does buffer (the count moves).
    let m = FuseMount::new(&img, &[]).unwrap();
    let before = request_counts(m.path());
    fs::write(m.path().join("plain"), pattern(4096, 1)).unwrap();
    let after = request_counts(m.path());
    assert!(buffered(&after) > buffered(&before));
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// `sync(1)` (or sync(2)) on the mount, then `kill -9` 0.3 s later: what
/// was written before the sync is there after the replaying mount (the
/// idle commit: the kernel does not forward sync(2) to a FUSE server,
/// but it returns only after its writes reached the daemon, which
/// commits once it is quiet). `commit=30`, so the timer cannot be what
/// commits. Then `ext4kit sync MNT` and a kill right after it returns:
/// durable without any wait.
#[test]
fn sync_then_kill9_is_durable() {
    let what = "sync_then_kill9_is_durable";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "128M");
    let small = |f: &mut File, seed: u64| {
        for k in 0..2048u64 {
            f.write_all(&pattern(4096, seed + k)).unwrap();
        }
    };
    let small_model =
        |seed: u64| -> Vec<u8> { (0..2048u64).flat_map(|k| pattern(4096, seed + k)).collect() };
    for (round, use_tool) in [(0u64, true), (1, false)] {
        let m = FuseMount::new(&img, &["commit=30"]).unwrap();
        let p = |s: &str| m.path().join(s);
        // 8 MiB in 4 KiB writes (the write-behind buffer), 8 MiB in one
        // write (through), a directory and a rename.
        small(
            &mut File::create(p(&format!("small{round}"))).unwrap(),
            round * 10_000,
        );
        fs::write(p(&format!("big{round}")), pattern(8 << 20, round)).unwrap();
        fs::create_dir(p(&format!("d{round}"))).unwrap();
        fs::write(p("tmp"), b"renamed").unwrap();
        fs::rename(p("tmp"), p(&format!("d{round}/renamed"))).unwrap();
        if use_tool {
            run_ok(&mut tool("sync")).unwrap();
        } else {
            // SAFETY: sync(2) takes no arguments.
            unsafe { libc::sync() };
        }
        std::thread::sleep(Duration::from_millis(300));
        m.kill9();
        let m = FuseMount::new(&img, &["commit=30"]).unwrap();
        let p = |s: &str| m.path().join(s);
        for r in 0..=round {
            let small = fs::read(p(&format!("small{r}")));
            assert!(
                small.as_ref().is_ok_and(|d| *d == small_model(r * 10_000)),
                "round {round}: small{r} not durable at sync (len {:?})",
                small.map(|d| d.len())
            );
            assert_eq!(
                fs::read(p(&format!("big{r}"))).unwrap(),
                pattern(8 << 20, r)
            );
            assert_eq!(fs::read(p(&format!("d{r}/renamed"))).unwrap(), b"renamed");
        }
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap();
    }
    // `ext4kit sync MOUNTPOINT`: the kill comes as soon as it returned.
    let m = FuseMount::new(&img, &["commit=30"]).unwrap();
    let p = |s: &str| m.path().join(s);
    small(&mut File::create(p("explicit")).unwrap(), 77);
    fs::remove_file(p("big0")).unwrap();
    run_ok(ext4kit().arg("sync").arg(m.path())).unwrap();
    m.kill9();
    assert!(dumpe2fs_h(&img).contains("needs_recovery"));
    let m = FuseMount::new(&img, &[]).unwrap();
    assert_eq!(
        fs::read(m.path().join("explicit")).unwrap(),
        small_model(77)
    );
    assert!(
        !m.path().join("big0").exists(),
        "the removal was not durable"
    );
    // `ext4kit status` counts the commits of `ext4kit sync`.
    run_ok(ext4kit().arg("sync").arg(m.path())).unwrap();
    let mut last = String::new();
    wait_until("the sync in the status", Duration::from_secs(20), || {
        let Ok(o) = run(ext4kit().arg("status").arg(m.path())) else {
            return false;
        };
        last = String::from_utf8_lossy(&o.stdout).into_owned();
        last.contains("commits: ") && last.contains(" 1 by ext4kit sync")
    })
    .unwrap_or_else(|e| panic!("{e}: {last}"));
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// `ext4kit sync` on what is not an ext4kit mount: one line, exit 1
/// (syncfs(2) was done); --help says what it is for.
#[test]
fn ext4kit_sync_refuses_other_filesystems() {
    let dir = image_dir();
    let out = ext4kit().arg("sync").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an ext4kit mount"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let out = ext4kit().arg("sync").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let help = run_ok(ext4kit().args(["sync", "--help"])).unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("durable") && help.contains("MOUNTPOINT"),
        "{help}"
    );
}

/// `ls -fai DIR`: (inode number, name) of every entry, "." and ".."
/// included, in the directory's order.
fn listing(d: &Path) -> Vec<(u64, String)> {
    let out = run_ok(Command::new("ls").arg("-fai").arg(d)).unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let (i, n) = l.trim_start().split_once(' ').unwrap();
            (i.parse().unwrap(), n.to_string())
        })
        .collect()
}

/// Listings the kernel keeps (`FOPEN_CACHE_DIR`): a second listing of
/// an unchanged directory asks the daemon nothing; one after a change
/// through the mount shows it; a directory moved to another parent lists
/// the new parent as ".."; with relatime, a listing after a chmod (ctime
/// past the atime) still updates the atime, as on the kernel's ext4.
#[test]
fn cached_listings_stay_exact() {
    let what = "cached_listings_stay_exact";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let reads = |v: &serde_json::Value| n(v, "readdir") + n(v, "readdirplus");
    for d in ["a", "b", "a/sub"] {
        fs::create_dir(p(d)).unwrap();
    }
    for k in 0..20 {
        fs::write(p(&format!("a/sub/f{k}")), b"x").unwrap();
    }
    let first = listing(&p("a/sub"));
    assert_eq!(first.len(), 22);
    let c0 = request_counts(m.path());
    assert_eq!(listing(&p("a/sub")), first);
    let c1 = request_counts(m.path());
    assert_eq!(reads(&c1), reads(&c0), "a second listing was not cached");
    fs::write(p("a/sub/new"), b"").unwrap();
    fs::remove_file(p("a/sub/f0")).unwrap();
    let names: Vec<String> = listing(&p("a/sub")).into_iter().map(|e| e.1).collect();
    assert!(names.contains(&"new".to_string()) && !names.contains(&"f0".to_string()));
    let dotdot = |d: &str| {
        let l = listing(&p(d));
        l.iter().find(|e| e.1 == "..").unwrap().0
    };
    let ino = |s: &str| fs::metadata(p(s)).unwrap().ino();
    assert_eq!(dotdot("a/sub"), ino("a"));
    fs::rename(p("a/sub"), p("b/sub")).unwrap();
    assert_eq!(dotdot("b/sub"), ino("b"), "\"..\" after a move");
    // relatime: listed once (atime set), listed again (kept), chmod
    // (ctime past the atime), listed again: the atime moves on.
    fs::create_dir(p("t")).unwrap();
    listing(&p("t"));
    let a1 = fs::metadata(p("t")).unwrap();
    listing(&p("t"));
    let a2 = fs::metadata(p("t")).unwrap();
    assert_eq!((a2.atime(), a2.atime_nsec()), (a1.atime(), a1.atime_nsec()));
    std::thread::sleep(Duration::from_millis(20));
    fs::set_permissions(p("t"), fs::Permissions::from_mode(0o700)).unwrap();
    let c = fs::metadata(p("t")).unwrap();
    listing(&p("t"));
    let a3 = fs::metadata(p("t")).unwrap();
    assert!(
        (a3.atime(), a3.atime_nsec()) >= (c.ctime(), c.ctime_nsec()),
        "atime not updated by a listing after a chmod"
    );
    m.unmount().unwrap();
    // noatime: no listing is dropped for its atime, so the move's own
    // notify is what drops the moved directory's.
    let m = FuseMount::new(&img, &["noatime"]).unwrap();
    let p = |s: &str| m.path().join(s);
    let dotdot = |d: &str| {
        let l = listing(&p(d));
        l.iter().find(|e| e.1 == "..").unwrap().0
    };
    let ino = |s: &str| fs::metadata(p(s)).unwrap().ino();
    assert_eq!(dotdot("b/sub"), ino("b"));
    assert_eq!(dotdot("b/sub"), ino("b"));
    fs::rename(p("b/sub"), p("a/sub")).unwrap();
    assert_eq!(dotdot("a/sub"), ino("a"), "\"..\" after a move (noatime)");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// A name that is not there is a negative entry the kernel keeps: a
/// second stat of it asks the daemon nothing; a create, a rename onto
/// it, a link and a mkdir through the mount then show the new inode,
/// and an unlink shows it gone again.
#[test]
fn negative_entries_are_cached_and_replaced() {
    let what = "negative_entries_are_cached_and_replaced";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let m = FuseMount::new(&img, &[]).unwrap();
    let p = |s: &str| m.path().join(s);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap();
    let gone = |s: &str| {
        let e = fs::symlink_metadata(p(s)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{s}");
    };
    gone("x");
    let c0 = request_counts(m.path());
    gone("x");
    let c1 = request_counts(m.path());
    assert_eq!(
        n(&c1, "lookup"),
        n(&c0, "lookup"),
        "a second miss asked again"
    );
    fs::write(p("x"), b"1").unwrap();
    assert_eq!(fs::read(p("x")).unwrap(), b"1");
    for s in ["y", "z", "d"] {
        gone(s);
    }
    fs::write(p("t"), b"2").unwrap();
    fs::rename(p("t"), p("y")).unwrap();
    assert_eq!(fs::read(p("y")).unwrap(), b"2");
    gone("t");
    fs::hard_link(p("y"), p("z")).unwrap();
    assert_eq!(
        fs::metadata(p("z")).unwrap().ino(),
        fs::metadata(p("y")).unwrap().ino()
    );
    fs::create_dir(p("d")).unwrap();
    assert!(fs::metadata(p("d")).unwrap().is_dir());
    fs::remove_file(p("x")).unwrap();
    gone("x");
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// `statx(2)`'s birth time through our own transport (FUSE_STATX) is the
/// inode's `i_crtime`: what `ext4kit stat` shows and what the kernel's
/// ext4 returns for the same image, on the default mount. (fuser's
/// transport has no btime: `created()` fails there.)
#[test]
fn statx_btime_is_the_crtime() {
    let what = "statx_btime_is_the_crtime";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let m = FuseMount::new(&img, default_transport()).unwrap();
    fs::write(m.path().join("f"), b"born").unwrap();
    fs::create_dir(m.path().join("d")).unwrap();
    let ours: Vec<std::time::SystemTime> = ["f", "d"]
        .iter()
        .map(|n| fs::metadata(m.path().join(n)).unwrap().created().unwrap())
        .collect();
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let km = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let theirs: Vec<std::time::SystemTime> = ["f", "d"]
        .iter()
        .map(|n| fs::metadata(km.path().join(n)).unwrap().created().unwrap())
        .collect();
    km.unmount().unwrap();
    drop(lo);
    eprintln!("{what}: btime {ours:?}");
    assert_eq!(ours, theirs);
    for (n, t) in ["f", "d"].iter().zip(&ours) {
        let out = run_ok(
            ext4kit()
                .arg("stat")
                .arg("--json")
                .arg(format!("{}:/{n}", img.display())),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
        assert_eq!(v["crtime"]["sec"].as_u64(), Some(d.as_secs()), "{n}");
        assert_eq!(
            v["crtime"]["nsec"].as_u64(),
            Some(u64::from(d.subsec_nanos())),
            "{n}"
        );
    }
}

/// open(`dir`, O_TMPFILE | `extra` | O_RDWR, 0o640) as a File.
fn open_tmpfile(dir: &Path, extra: i32) -> std::io::Result<File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: `c` is a NUL-terminated path; the fd returned is owned by
    // the File alone.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, 0o640) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// linkat(fd, "", AT_FDCWD, `to`, AT_EMPTY_PATH) (`empty`), else
/// linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, `to`, AT_SYMLINK_FOLLOW).
fn link_fd(f: &File, to: &Path, empty: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let proc = std::ffi::CString::new(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map_err(std::io::Error::other)?;
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let r = unsafe {
        if empty {
            libc::linkat(
                f.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        } else {
            libc::linkat(
                libc::AT_FDCWD,
                proc.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        }
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The O_TMPFILE workload of [`tmpfile_as_kernel_ext4`]: the outcome of
/// each step.
fn tmpfile_script(root: &Path) -> Vec<(String, String)> {
    let d = root.join("t");
    fs::create_dir(&d).unwrap();
    let mut out = Vec::new();
    let mut step = |what: &str, r: String| out.push((what.to_string(), r));
    let stat = |f: &File| f.metadata().map(|m| (m.nlink(), m.mode(), m.len()));
    // Linked with AT_EMPTY_PATH, then read back by its name.
    let f = open_tmpfile(&d, 0).unwrap();
    step("write", outcome(f.write_all_at(b"tmpfile data", 0)));
    step("fstat", outcome(stat(&f)));
    step("listing", outcome(fs::read_dir(&d).map(|r| r.count())));
    step(
        "linkat empty path",
        outcome(link_fd(&f, &d.join("a"), true)),
    );
    step("fstat linked", outcome(stat(&f)));
    step("link again", outcome(link_fd(&f, &d.join("a2"), true)));
    drop(f);
    step("read a", outcome(fs::read(d.join("a"))));
    step(
        "stat a",
        outcome(fs::metadata(d.join("a")).map(|m| m.nlink())),
    );
    // Linked through /proc/self/fd.
    let f = open_tmpfile(&d, 0).unwrap();
    step("write b", outcome(f.write_all_at(&[5u8; 10000], 0)));
    step("linkat proc", outcome(link_fd(&f, &d.join("b"), false)));
    step(
        "linkat over a name",
        outcome(link_fd(&f, &d.join("a"), false)),
    );
    drop(f);
    step("read b", outcome(fs::read(d.join("b")).map(|v| v.len())));
    // Never linked: gone at close.
    let f = open_tmpfile(&d, 0).unwrap();
    step("write unlinked", outcome(f.write_all_at(&[7u8; 20000], 0)));
    drop(f);
    // O_EXCL: never linkable.
    let f = open_tmpfile(&d, libc::O_EXCL).unwrap();
    step("excl fstat", outcome(stat(&f)));
    step("excl linkat", outcome(link_fd(&f, &d.join("c"), true)));
    step(
        "excl linkat proc",
        outcome(link_fd(&f, &d.join("c"), false)),
    );
    drop(f);
    // In a file, not a directory.
    step(
        "on a file",
        outcome(open_tmpfile(&d.join("a"), 0).map(|_| ())),
    );
    // A default ACL of the directory is inherited, as by a create.
    if have("setfacl") {
        let ad = root.join("acl");
        fs::create_dir(&ad).unwrap();
        tool_ok("setfacl", &["-d", "-m", "u:1234:rw", ad.to_str().unwrap()]);
        let f = open_tmpfile(&ad, 0).unwrap();
        step("acl mode", outcome(stat(&f)));
        step(
            "acl inherited",
            outcome(host::fget_xattr(&f, b"system.posix_acl_access")),
        );
        step("acl linkat", outcome(link_fd(&f, &ad.join("x"), true)));
        drop(f);
        step("acl by name", getfacl(&ad.join("x")));
    }
    step(
        "listing after",
        outcome(fs::read_dir(&d).map(|r| {
            let mut v: Vec<String> = r
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        })),
    );
    out
}

/// Free inodes of the mounted filesystem (statfs).
fn free_inodes(m: &Path) -> u64 {
    statfs_field(m, "%d")
}

/// O_TMPFILE on our own transport (FUSE_TMPFILE, the default) does what it does on the
/// kernel's ext4: an unnamed file (nlink 0) that linkat names (by
/// AT_EMPTY_PATH and /proc/self/fd), freed at close when never linked,
/// never linkable with O_EXCL; e2fsck is clean and the free inode and
/// block counts are back: on the default mount. On fuser's transport
/// (`-o transport=fuser`) it stays EOPNOTSUPP.
#[test]
fn tmpfile_as_kernel_ext4() {
    let what = "tmpfile_as_kernel_ext4";
    if let Err(e) = fuse_available().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkfs(dir.path(), "64M");
    let copy = dir.path().join("kernel.img");
    sparse_copy(&img, &copy);
    let lo = LoopDev::attach(&copy).unwrap();
    let km = Mount::new(lo.path(), "ext4", None).unwrap();
    let kernel = tmpfile_script(km.path());
    km.unmount().unwrap();
    drop(lo);
    // fuser's transport: the kernel asks, gets ENOSYS, and says EOPNOTSUPP.
    let m = FuseMount::new(&img, FUSER).unwrap();
    let e = open_tmpfile(m.path(), 0).map(|_| ());
    assert_eq!(errno_of(e), Some(libc::EOPNOTSUPP));
    m.unmount().unwrap();
    // The default mount (our own transport) serves it.
    let m = FuseMount::new(&img, default_transport()).unwrap();
    let (blocks, inodes) = (free_blocks(m.path()), free_inodes(m.path()));
    let ours = tmpfile_script(m.path());
    m.unmount().unwrap();
    assert_eq!(kernel.len(), ours.len());
    let diffs: Vec<String> = kernel
        .iter()
        .zip(&ours)
        .filter(|((_, k), (_, o))| k != o)
        .map(|((w, k), (_, o))| format!("{w}: kernel {k}, ext4kit {o}"))
        .collect();
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
    e2fsck_clean(&img).unwrap();
    e2fsck_clean(&copy).unwrap();
    // Named: the directories "t" (and "acl"), "a", "b" (and "acl/x");
    // the others left nothing.
    let named = if have("setfacl") { 5 } else { 3 };
    let m = FuseMount::new(&img, OWN).unwrap();
    assert_eq!(free_inodes(m.path()), inodes - named);
    assert!(free_blocks(m.path()) + 10 > blocks);
    // A tmpfile open at a kill -9: on the orphan list, freed by the next
    // mount's orphan processing.
    let f = open_tmpfile(m.path(), 0).unwrap();
    f.write_all_at(&[9u8; 50000], 0).unwrap();
    f.sync_all().unwrap();
    m.kill9();
    drop(f);
    let m = FuseMount::new(&img, OWN).unwrap();
    assert_eq!(free_inodes(m.path()), inodes - named);
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
}
