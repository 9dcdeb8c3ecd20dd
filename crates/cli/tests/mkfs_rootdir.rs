//! `ext4kit mkfs -d DIRECTORY`: a host tree copied into the new filesystem.
//!
//! Oracles: the source tree itself (types, modes, owners, ns times,
//! digests, symlink targets, device numbers, xattrs and ACLs, hard-link
//! groups, holes) read back through ext4kit's read side and, as root with
//! loop devices, through a kernel mount (else SKIP); `e2fsck -fn`; the
//! same bytes twice and whatever order the tree was created in (with
//! `-U`, `-E hash_seed=`, `SOURCE_DATE_EPOCH`); `mke2fs -d` on the same
//! tree (same tree, and byte-identical outside the superblock and the
//! inode tables on a small tree, whose only differences are mke2fs
//! 1.47.0 dropping nanoseconds and its `s_kbytes_written`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use ext4kit_device::host;
use ext4kit_fs::inode::FileType;
use ext4kit_fs::sb::{Fs, Volume};

/// What a path is, as both sides can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    atime: (i64, u32),
    mtime: (i64, u32),
    ctime: (i64, u32),
    content: Option<u32>,
    target: Option<Vec<u8>>,
    rdev: Option<(u32, u32)>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Paths of the same inode (hard links), this one included.
    group: Vec<Vec<u8>>,
}

type Tree = BTreeMap<Vec<u8>, Node>;

fn crc(h: u32, b: &[u8]) -> u32 {
    ext4kit_format::checksum::crc32c_raw(h, b)
}

/// Bytes of a pseudo-random file.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A POSIX ACL in the `posix_acl_xattr` form (version 2): user::rw-,
/// user:1000:r--, group::r--, mask::r--, other::---.
fn acl_value() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// One entry of the source tree.
enum Item {
    Dir(&'static str, u32),
    File(String, Vec<u8>, u32),
    /// A sparse file: (offset, bytes) pieces and the size.
    Sparse(&'static str, Vec<(u64, Vec<u8>)>, u64),
    Symlink(&'static str, Vec<u8>),
    Link(&'static str, &'static str),
    Fifo(&'static str),
    Socket(&'static str),
    Dev(&'static str, u32, u32, u32),
    Xattr(&'static str, &'static str, Vec<u8>),
    Owner(&'static str, u32, u32),
    Raw(Vec<u8>, Vec<u8>),
}

/// The tree the tests copy. `bs` bounds the long symlink (its target
/// and NUL fit one block).
fn items(bs: usize) -> Vec<Item> {
    use Item::*;
    let mut v = vec![
        Dir("dir", 0o755),
        Dir("dir/sub", 0o2775),
        Dir("sticky", 0o1777),
        Dir("empty", 0o700),
        Dir("big", 0o755),
        File("empty_file".into(), Vec::new(), 0o644),
        File("hello".into(), b"hello, world\n".to_vec(), 0o644),
        File("setuid".into(), b"#!/bin/sh\n".to_vec(), 0o4755),
        File("dir/setgid".into(), b"g".to_vec(), 0o2711),
        File("dir/sub/noise".into(), noise(7, 300_000), 0o600),
        // Explicit zero blocks between data (not a hole on the host).
        File(
            "zeros".into(),
            [noise(1, 5000), vec![0; 3 * 65536], noise(2, 100)].concat(),
            0o644,
        ),
        Sparse(
            "sparse",
            vec![(0, b"head".to_vec()), (3 << 20, b"middle".to_vec())],
            9 << 20,
        ),
        Sparse(
            "sparse_end",
            vec![((64 << 20) - 1, b"x".to_vec())],
            64 << 20,
        ),
        Symlink("sym59", vec![b'a'; 59]),
        Symlink("sym60", vec![b'b'; 60]),
        Symlink("symlong", vec![b'c'; bs - 1]),
        Symlink("dir/rel", b"../hello".to_vec()),
        Link("dir/hello_link", "hello"),
        Link("dir/sub/hello_link2", "hello"),
        Fifo("fifo"),
        Socket("sock"),
        Xattr("hello", "user.greeting", b"hi there".to_vec()),
        Xattr("dir", "user.dirattr", b"d".to_vec()),
        Xattr("dir/sub/noise", "user.big", noise(3, (bs - 300).min(3000))),
        Xattr("dir/sub/noise", "user.small", b"s".to_vec()),
        Xattr("setuid", "system.posix_acl_access", acl_value()),
        Xattr("dir", "system.posix_acl_default", acl_value()),
        Raw(b"caf\xe9".to_vec(), b"latin-1 name".to_vec()),
        Raw(vec![b'n'; 255], b"longest name".to_vec()),
    ];
    for k in 0..400 {
        v.push(File(
            format!("big/entry-with-a-longish-name-{k:05}"),
            format!("{k}").into_bytes(),
            0o644,
        ));
    }
    if is_root() {
        v.push(Dev("chr", libc::S_IFCHR, 1, 3));
        v.push(Dev("blk", libc::S_IFBLK, 259, 70000));
        v.push(Xattr("hello", "trusted.t", b"trusted".to_vec()));
        v.push(Xattr("hello", "security.s", b"label".to_vec()));
        v.push(Owner("hello", 1234, 5678));
        v.push(Owner("dir/sub", 70000, 80000));
        v.push(Owner("sym60", 42, 43));
    }
    v
}

/// Make the tree under `root`, the entries in order or reversed (the
/// parents always first). Times: mtime in 2001 with nanoseconds, atime an
/// hour ahead (later than mtime and ctime and not old, so that reading
/// the files and directories does not move it under relatime).
fn build(root: &Path, bs: usize, reverse: bool) {
    let mut list = items(bs);
    if reverse {
        // Directories keep their order (parents first), the rest flips.
        let (dirs, mut rest): (Vec<Item>, Vec<Item>) =
            list.into_iter().partition(|i| matches!(i, Item::Dir(..)));
        let (attrs, mut plain): (Vec<Item>, Vec<Item>) = rest
            .drain(..)
            .partition(|i| matches!(i, Item::Xattr(..) | Item::Owner(..) | Item::Link(..)));
        plain.reverse();
        list = dirs.into_iter().chain(plain).chain(attrs).collect();
    }
    let p = |s: &str| root.join(s);
    for it in &list {
        match it {
            Item::Dir(n, mode) => {
                std::fs::create_dir(p(n)).unwrap();
                std::fs::set_permissions(p(n), std::fs::Permissions::from_mode(*mode)).unwrap();
            }
            Item::File(n, data, mode) => {
                std::fs::write(p(n), data).unwrap();
                std::fs::set_permissions(p(n), std::fs::Permissions::from_mode(*mode)).unwrap();
            }
            Item::Sparse(n, pieces, size) => {
                use std::os::unix::fs::FileExt;
                let f = std::fs::File::create(p(n)).unwrap();
                f.set_len(*size).unwrap();
                for (off, b) in pieces {
                    f.write_all_at(b, *off).unwrap();
                }
            }
            Item::Symlink(n, t) => std::os::unix::fs::symlink(OsStr::from_bytes(t), p(n)).unwrap(),
            Item::Link(n, t) => std::fs::hard_link(p(t), p(n)).unwrap(),
            Item::Fifo(n) => host::mknod(&p(n), libc::S_IFIFO | 0o640, 0, 0).unwrap(),
            Item::Socket(n) => {
                let l = std::os::unix::net::UnixListener::bind(p(n)).unwrap();
                drop(l);
            }
            Item::Dev(n, t, ma, mi) => host::mknod(&p(n), t | 0o660, *ma, *mi).unwrap(),
            Item::Xattr(n, name, v) => host::set_xattr(&p(n), name.as_bytes(), v).unwrap(),
            Item::Owner(n, u, g) => {
                std::os::unix::fs::lchown(p(n), Some(*u), Some(*g)).unwrap();
            }
            Item::Raw(n, data) => std::fs::write(root.join(OsStr::from_bytes(n)), data).unwrap(),
        }
    }
    // Times last (bottom-up, so that no later change moves them).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut all: Vec<PathBuf> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
            all.push(e.path());
        }
    }
    all.sort();
    for (k, path) in all.iter().enumerate().rev() {
        let ns = (k as u32 * 7919) % 1_000_000_000;
        host::set_times_nofollow(path, (now + 3600, ns), (981_173_106, ns)).unwrap();
    }
}

/// The host tree below `root` (without a top-level lost+found). Contents
/// are read after every stat, so that atimes are the ones before.
fn walk_host(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut inodes: BTreeMap<(u64, u64), Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let mut key = b"/".to_vec();
            key.extend_from_slice(p.strip_prefix(root).unwrap().as_os_str().as_bytes());
            if key == b"/lost+found" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let mut target = None;
            if ft.is_dir() {
                stack.push(p.clone());
            } else if ft.is_symlink() {
                target = Some(
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                );
            } else if ft.is_file() {
                files.push((key.clone(), p.clone()));
            }
            if !ft.is_dir() {
                inodes
                    .entry((m.dev(), m.ino()))
                    .or_default()
                    .push(key.clone());
            }
            use std::os::unix::fs::FileTypeExt;
            let rdev = (ft.is_char_device() || ft.is_block_device()).then(|| {
                let r = m.rdev();
                (
                    (((r >> 32) & 0xffff_f000) | ((r >> 8) & 0xfff)) as u32,
                    (((r >> 12) & 0xffff_ff00) | (r & 0xff)) as u32,
                )
            });
            out.insert(
                key.clone(),
                Node {
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if ft.is_dir() { 0 } else { m.size() },
                    nlink: m.nlink(),
                    atime: (m.atime(), m.atime_nsec() as u32),
                    mtime: (m.mtime(), m.mtime_nsec() as u32),
                    ctime: (m.ctime(), m.ctime_nsec() as u32),
                    content: None,
                    target,
                    rdev,
                    xattrs: host::xattrs(&p).unwrap().into_iter().collect(),
                    group: vec![key],
                },
            );
        }
    }
    for (key, p) in files {
        let n = out.get_mut(&key).unwrap();
        n.content = Some(crc(!0, &std::fs::read(p).unwrap()));
    }
    for keys in inodes.values() {
        for k in keys {
            let mut g = keys.clone();
            g.sort();
            out.get_mut(k).unwrap().group = g;
        }
    }
    out
}

/// The same model of an image, through ext4kit's read side; also checks
/// that every name is found by lookup (by hash in an htree).
fn walk_image(fs: &Fs<'_>) -> Tree {
    let mut out = Tree::new();
    let mut inodes: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![(Vec::<u8>::new(), fs.root().unwrap())];
    while let Some((path, dir)) = stack.pop() {
        for e in fs.read_dir(&dir).unwrap() {
            if e.name == b"." || e.name == b".." || (path.is_empty() && e.name == b"lost+found") {
                continue;
            }
            let found = fs.lookup(&dir, &e.name).unwrap().map(|f| f.ino);
            assert_eq!(found, Some(e.ino), "lookup of {}", e.name_lossy());
            let mut p = path.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            let i = fs.inode(e.ino).unwrap();
            let (mut content, mut target) = (None, None);
            match i.file_type() {
                FileType::Regular => {
                    let mut h = !0u32;
                    fs.read_each(&i, &mut |b| {
                        h = crc(h, b);
                        true
                    })
                    .unwrap();
                    content = Some(h);
                }
                FileType::Symlink => target = Some(fs.read_link(&i).unwrap()),
                FileType::Directory => stack.push((p.clone(), i.clone())),
                _ => {}
            }
            if !i.is_dir() {
                inodes.entry(i.ino).or_default().push(p.clone());
            }
            let rdev =
                matches!(i.file_type(), FileType::CharDev | FileType::BlockDev).then(|| i.rdev());
            let t = |x: ext4kit_fs::inode::Timestamp| (x.sec, x.nsec);
            out.insert(
                p.clone(),
                Node {
                    mode: u32::from(i.mode),
                    uid: i.uid,
                    gid: i.gid,
                    size: if i.is_dir() { 0 } else { i.size },
                    nlink: u64::from(i.links),
                    atime: t(i.atime),
                    mtime: t(i.mtime),
                    ctime: t(i.ctime),
                    content,
                    target,
                    rdev,
                    xattrs: fs
                        .xattrs(&i)
                        .unwrap()
                        .into_iter()
                        .map(|x| (x.name, x.value))
                        .collect(),
                    group: vec![p],
                },
            );
        }
    }
    for keys in inodes.values() {
        for k in keys {
            let mut g = keys.clone();
            g.sort();
            out.get_mut(k).unwrap().group = g;
        }
    }
    out
}

/// Compare two models; directories' link counts are compared too
/// (2 + subdirectories on both sides).
fn compare(label: &str, got: &Tree, want: &Tree, ignore: impl Fn(&mut Node)) -> Result<(), String> {
    let gk: Vec<_> = got.keys().collect();
    let wk: Vec<_> = want.keys().collect();
    if gk != wk {
        let missing: Vec<_> = wk.iter().filter(|k| !got.contains_key(**k)).collect();
        let extra: Vec<_> = gk.iter().filter(|k| !want.contains_key(**k)).collect();
        return Err(format!(
            "{label}: names differ: missing {:?}, extra {:?}",
            missing
                .iter()
                .map(|k| String::from_utf8_lossy(k))
                .collect::<Vec<_>>(),
            extra
                .iter()
                .map(|k| String::from_utf8_lossy(k))
                .collect::<Vec<_>>()
        ));
    }
    for (k, w) in want {
        let mut g = got[k].clone();
        let mut w = w.clone();
        ignore(&mut g);
        ignore(&mut w);
        if g != w {
            return Err(format!(
                "{label}: {} differs:\n  got  {g:?}\n  want {w:?}",
                String::from_utf8_lossy(k)
            ));
        }
    }
    Ok(())
}

fn open_image(img: &Path) -> ext4kit_device::FileDevice {
    ext4kit_device::FileDevice::open(img, ext4kit_device::OpenOptions::read_only()).unwrap()
}

fn mkfs_d(
    src: &Path,
    img: &Path,
    extra: &[&str],
    size: &str,
) -> Result<std::process::Output, String> {
    let mut c = ext4kit_mkfs(["-q", "-F", "-t", "ext4"]);
    c.args(extra)
        .arg("-d")
        .arg(src)
        .arg(img)
        .arg(size)
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME);
    run_ok(&mut c)
}

/// The 512-byte blocks an image allocated for `path`.
fn blocks_of(fs: &Fs<'_>, path: &[u8]) -> u64 {
    fs.resolve(path, false).unwrap().blocks_512
}

#[test]
fn tree_reads_back_through_the_library() {
    let mut failures = Vec::new();
    for (label, bs, extra) in [
        ("4k", 4096usize, vec!["-b", "4096"]),
        ("1k", 1024, vec!["-b", "1024"]),
        (
            "4k-nocsum-128",
            4096,
            vec!["-b", "4096", "-O", "^metadata_csum", "-I", "128"],
        ),
    ] {
        let res = (|| -> Result<(), String> {
            let src = tempfile::tempdir().unwrap();
            build(src.path(), bs, false);
            let want = walk_host(src.path());
            let dir = image_dir();
            let img = dir.path().join("img");
            mkfs_d(src.path(), &img, &extra, "256M")?;
            e2fsck_clean(&img)?;
            let dev = open_image(&img);
            let vol = Volume::open(&dev).map_err(|e| e.to_string())?;
            let fs = vol.fs();
            let got = walk_image(&fs);
            let small = extra.contains(&"128");
            compare(label, &got, &want, |n| {
                if small {
                    // 128-byte inodes keep no nanoseconds.
                    n.atime.1 = 0;
                    n.mtime.1 = 0;
                    n.ctime.1 = 0;
                }
            })?;
            // Holes and zero blocks take no space.
            let b = (bs / 512) as u64;
            let cases: [(&[u8], u64); 3] = [
                (b"/sparse", 2 * b),
                (b"/sparse_end", b),
                (b"/zeros", (5000u64.div_ceil(bs as u64) + 1) * b),
            ];
            for (p, want) in cases {
                let got = blocks_of(&fs, p);
                if got != want {
                    return Err(format!(
                        "{label}: {} has {got} sectors, want {want}",
                        String::from_utf8_lossy(p)
                    ));
                }
            }
            if !fs.resolve(b"/big", false).unwrap().is_htree() {
                return Err(format!("{label}: /big is not an htree"));
            }
            Ok(())
        })();
        report_case(label, res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn tree_reads_back_through_the_kernel() {
    if let Err(why) = kernel_mount_available() {
        return skip("tree_reads_back_through_the_kernel", &why);
    }
    let src = tempfile::tempdir().unwrap();
    build(src.path(), 4096, false);
    let want = walk_host(src.path());
    let dir = image_dir();
    let img = dir.path().join("img");
    mkfs_d(src.path(), &img, &["-b", "4096"], "256M").unwrap();
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("ro,noatime")).unwrap();
    let got = walk_host(m.path());
    let res = compare("kernel", &got, &want, |_| {});
    m.unmount().unwrap();
    drop(lo);
    res.unwrap();
    e2fsck_clean(&img).unwrap();
}

/// 100 000 entries in one directory (names of 6 to 42 bytes): an htree,
/// `e2fsck -fn` clean, every name read back through the library (each
/// one also looked up through the index) and, with a kernel, the mount.
#[test]
fn hundred_thousand_entries_in_one_directory() {
    // The source on a tmpfs when this may mount one: 100 000 creations
    // take a second there, 20 on a loaded disk-backed /tmp.
    let tmpfs = Mount::new(Path::new("none"), "tmpfs", Some("size=256m")).ok();
    let plain = tempfile::tempdir().unwrap();
    let src_root = tmpfs.as_ref().map_or(plain.path(), |m| m.path());
    let many = src_root.join("many");
    std::fs::create_dir(&many).unwrap();
    let mut want = BTreeSet::new();
    for i in 0..100_000u32 {
        let name = format!("{i:05x}-{}", "n".repeat((i % 37) as usize));
        std::fs::File::create(many.join(&name)).unwrap();
        want.insert(name.into_bytes());
    }
    let dir = image_dir();
    let img = dir.path().join("img");
    mkfs_d(src_root, &img, &["-b", "4096", "-N", "110000"], "512M").unwrap();
    e2fsck_clean(&img).unwrap();
    let dev = open_image(&img);
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let d = fs.resolve(b"/many", false).unwrap();
    assert!(d.is_htree(), "/many is not an htree");
    let mut got = BTreeSet::new();
    for e in fs.read_dir(&d).unwrap() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        assert_eq!(
            e.file_type,
            ext4kit_format::dir::FT_REG_FILE,
            "{}",
            e.name_lossy()
        );
        assert!(got.insert(e.name.clone()), "{} twice", e.name_lossy());
    }
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the names read back differ from the source's");
    for name in &want {
        let found = fs.lookup(&d, name).unwrap();
        assert!(
            found.is_some(),
            "lookup of {}",
            String::from_utf8_lossy(name)
        );
    }
    assert!(fs.lookup(&d, b"not-there").unwrap().is_none());
    if let Err(why) = kernel_mount_available() {
        return skip("hundred_thousand_entries_in_one_directory (kernel)", &why);
    }
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("ro,noatime")).unwrap();
    let mut kernel = BTreeSet::new();
    let res = std::fs::read_dir(m.path().join("many")).map(|rd| {
        for e in rd.flatten() {
            kernel.insert(e.file_name().as_bytes().to_vec());
        }
    });
    // Every name looked up through the kernel's htree code too.
    let missing = want
        .iter()
        .filter(|n| {
            std::fs::symlink_metadata(m.path().join("many").join(OsStr::from_bytes(n))).is_err()
        })
        .count();
    m.unmount().unwrap();
    drop(lo);
    res.unwrap();
    assert!(
        kernel == want,
        "the kernel lists other names ({})",
        kernel.len()
    );
    assert_eq!(missing, 0, "names the kernel's lookup does not find");
}

/// A 5 GiB sparse file with data in its first and last block (and one
/// across the 4 GiB line): only those blocks are allocated, the holes
/// stay holes, the bytes at both ends and past 4 GiB read back.
#[test]
fn five_gib_sparse_file() {
    let src = tempfile::tempdir().unwrap();
    let p = src.path().join("sparse5g");
    let size = 5u64 << 30;
    {
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(size).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"first", 0).unwrap();
        f.write_all_at(b"over4g", (4u64 << 30) - 3).unwrap();
        f.write_all_at(b"last", size - 4).unwrap();
    }
    let dir = image_dir();
    let img = dir.path().join("img");
    mkfs_d(src.path(), &img, &["-b", "4096"], "64M").unwrap();
    e2fsck_clean(&img).unwrap();
    let dev = open_image(&img);
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let i = fs.resolve(b"/sparse5g", false).unwrap();
    assert_eq!(i.size, size);
    // Blocks 0, 4 GiB/4 KiB - 1 and 4 GiB/4 KiB, the last: 4 blocks of
    // data in 3 extents (the extents fit the inode, no tree block).
    assert_eq!(i.blocks_512, 4 * 8, "sectors allocated");
    let map = fs.file_map(&i).unwrap();
    let lb: Vec<(u64, u32)> = map.iter().map(|m| (m.lblk, m.len)).collect();
    let g4 = (4u64 << 30) / 4096;
    assert_eq!(lb, vec![(0, 1), (g4 - 1, 2), (size / 4096 - 1, 1)]);
    let content = fs.content(&i).unwrap();
    let read = |off: u64, len: usize| {
        let mut b = vec![0xffu8; len];
        let n = fs.read_at(&i, &content, off, &mut b).unwrap();
        b.truncate(n);
        b
    };
    assert_eq!(read(0, 8), b"first\0\0\0");
    assert_eq!(read((4u64 << 30) - 4, 8), b"\0over4g\0");
    assert_eq!(read(size - 6, 16), b"\0\0last");
    assert_eq!(read(1 << 31, 4), vec![0; 4]);
}

#[test]
fn same_bytes_whatever_the_creation_order() {
    let dir = image_dir();
    let mut images = Vec::new();
    for (k, reverse) in [(0, false), (1, true), (2, false)] {
        let src = tempfile::tempdir().unwrap();
        build(src.path(), 4096, reverse);
        let img = dir.path().join(format!("img{k}"));
        let mut c = ext4kit_mkfs(["-q", "-F", "-t", "ext4", "-b", "4096", "-U", UUID, "-E"]);
        c.arg(format!("hash_seed={SEED}"))
            .arg("-d")
            .arg(src.path())
            .arg(&img)
            .arg("64M")
            .env("E2FSPROGS_FAKE_TIME", "1600000000")
            .env("SOURCE_DATE_EPOCH", "1600000000");
        run_ok(&mut c).unwrap();
        e2fsck_clean(&img).unwrap();
        images.push(img);
    }
    let a = std::fs::read(&images[0]).unwrap();
    for img in &images[1..] {
        let b = std::fs::read(img).unwrap();
        let diff = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(
            a.len() == b.len() && diff == 0,
            "{} differs from {} in {diff} bytes",
            img.display(),
            images[0].display()
        );
    }
    // The clamp: every time of the copied tree is at or before the epoch.
    let dev = open_image(&images[0]);
    let vol = Volume::open(&dev).unwrap();
    for (p, n) in walk_image(&vol.fs()) {
        for t in [n.atime, n.mtime, n.ctime] {
            assert!(
                t <= (1_600_000_000, 0),
                "{}: {t:?}",
                String::from_utf8_lossy(&p)
            );
        }
    }
}

#[test]
fn same_tree_as_mke2fs_d() {
    if !have("mke2fs") {
        return skip("same_tree_as_mke2fs_d", "mke2fs not found");
    }
    let src = tempfile::tempdir().unwrap();
    build(src.path(), 4096, false);
    let dir = image_dir();
    let ours = dir.path().join("ours");
    let theirs = dir.path().join("theirs");
    mkfs_d(src.path(), &ours, &["-b", "4096"], "256M").unwrap();
    run_ok(
        mke2fs(["-q", "-F", "-t", "ext4", "-b", "4096", "-d"])
            .arg(src.path())
            .arg(&theirs)
            .arg("256M")
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME),
    )
    .unwrap();
    e2fsck_clean(&ours).unwrap();
    let (d1, d2) = (open_image(&ours), open_image(&theirs));
    let (v1, v2) = (Volume::open(&d1).unwrap(), Volume::open(&d2).unwrap());
    let (a, b) = (walk_image(&v1.fs()), walk_image(&v2.fs()));
    // mke2fs 1.47.0 keeps whole seconds only.
    compare("mke2fs", &a, &b, |n| {
        n.atime.1 = 0;
        n.mtime.1 = 0;
        n.ctime.1 = 0;
    })
    .unwrap();
}

/// A small tree without hard links, htrees or xattr blocks: the layout
/// is mke2fs's, and the images differ only in the primary superblock
/// (`s_kbytes_written` and its checksum) and the inode table (the
/// nanoseconds mke2fs 1.47.0 drops, and the checksums over them).
#[test]
fn small_tree_matches_mke2fs_byte_for_byte_but_times() {
    if !have("mke2fs") {
        return skip(
            "small_tree_matches_mke2fs_byte_for_byte_but_times",
            "mke2fs not found",
        );
    }
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir(s.join("d")).unwrap();
    std::fs::write(s.join("d/f"), noise(5, 70_000)).unwrap();
    std::fs::write(s.join("a"), b"a").unwrap();
    std::os::unix::fs::symlink("a", s.join("l")).unwrap();
    host::mknod(&s.join("p"), libc::S_IFIFO | 0o644, 0, 0).unwrap();
    let dir = image_dir();
    let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
    let seed = format!("hash_seed={SEED}");
    let args = ["-q", "-F", "-t", "ext4", "-U", UUID, "-E", &seed, "-d"];
    run_ok(
        ext4kit_mkfs(args)
            .arg(s)
            .arg(&ours)
            .arg("16M")
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME),
    )
    .unwrap();
    run_ok(
        mke2fs(args)
            .arg(s)
            .arg(&theirs)
            .arg("16M")
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME),
    )
    .unwrap();
    e2fsck_clean(&ours).unwrap();
    let bad = differing_blocks(&ours, &theirs, false);
    assert!(bad.is_empty(), "blocks differing from mke2fs -d: {bad:?}");
}

/// The blocks of `ours` that differ from mke2fs's `theirs` beyond
/// `s_kbytes_written` (and the superblock checksum). Group 0's inode
/// table is skipped, or with `slots` compared inode by inode without the
/// nanoseconds mke2fs 1.47.0 drops (`i_[cma]time_extra`) and the inode
/// checksum over them.
fn differing_blocks(ours: &Path, theirs: &Path, slots: bool) -> Vec<String> {
    let (a, b) = (std::fs::read(ours).unwrap(), std::fs::read(theirs).unwrap());
    if a.len() != b.len() {
        return vec![format!("sizes {} and {}", a.len(), b.len())];
    }
    let dev = open_image(ours);
    let vol = Volume::open(&dev).unwrap();
    let info = &vol.fs().info;
    let bs = info.block_size as usize;
    let isz = usize::from(info.inode_size);
    let table = vol.fs().group_desc(0).unwrap().inode_table();
    let table_blocks = u64::from(info.inodes_per_group) * isz as u64 / bs as u64;
    let mut bad = Vec::new();
    for (k, (x, y)) in a.chunks(bs).zip(b.chunks(bs)).enumerate() {
        let k = k as u64;
        if x == y {
            continue;
        }
        if k >= table && k < table + table_blocks {
            if !slots {
                continue;
            }
            let masked = |o: usize| (0x7C..0x7E).contains(&o) || (0x82..0x90).contains(&o);
            for (j, (p, q)) in x.chunks(isz).zip(y.chunks(isz)).enumerate() {
                let ino = (k - table) as usize * (bs / isz) + j + 1;
                let off: Vec<String> = (0..isz)
                    .filter(|&o| p[o] != q[o] && !masked(o))
                    .map(|o| format!("{o:#x}"))
                    .collect();
                if !off.is_empty() {
                    bad.push(format!("inode {ino} at {}", off.join(",")));
                }
            }
            continue;
        }
        // A superblock copy: s_kbytes_written (0x178) and the checksum
        // (0x3FC) may differ.
        let at = if k == 0 && bs > 1024 { 1024 } else { 0 };
        let only_kbytes = x.len() >= at + 1024
            && x[at + 56..at + 58] == [0x53, 0xEF]
            && x.iter().zip(y).enumerate().all(|(o, (p, q))| {
                p == q
                    || (at + 0x178..at + 0x180).contains(&o)
                    || (at + 0x3FC..at + 0x400).contains(&o)
            });
        if !only_kbytes {
            bad.push(format!("block {k}"));
        }
    }
    bad
}

/// A tree around the inline limits: files of 0, 1, 59, 60, 61, 100,
/// 127, 128, 129, 200 bytes (inline up to `inode_size - 128` = 128),
/// files of zeros (inline whatever their size, as mke2fs never writes
/// them), a file whose data starts past a hole (block 0 allocated, as
/// mke2fs's inline expansion does), empty directories, directories whose
/// entries fit `i_block` or not, symlinks of 59, 60, 100, 128, 129 bytes,
/// a hard link.
fn build_inline(root: &Path) {
    let w = |p: &str, d: &[u8]| std::fs::write(root.join(p), d).unwrap();
    for d in ["empty", "few", "block", "nest", "nest/inner"] {
        std::fs::create_dir(root.join(d)).unwrap();
    }
    for n in [0usize, 1, 59, 60, 61, 100, 127, 128, 129, 200, 5000] {
        let mut d = noise(n as u64 + 1, n);
        if let Some(b) = d.first_mut() {
            *b |= 1;
        }
        w(&format!("f{n}"), &d);
    }
    w("zeros100", &[0; 100]);
    w("zeros5000", &[0; 5000]);
    let mut tail = vec![0u8; 100];
    tail[90] = 7;
    w("tail100", &tail);
    let hole = std::fs::File::create(root.join("hole")).unwrap();
    {
        use std::os::unix::fs::FileExt;
        hole.write_all_at(b"after a hole", 5000).unwrap();
    }
    w("few/a", b"a");
    w("few/bb", b"");
    for i in 0..12 {
        w(&format!("block/entry_{i:02}"), b"x");
    }
    std::fs::hard_link(root.join("f61"), root.join("few/link")).unwrap();
    for (name, len) in [
        ("s59", 59),
        ("s60", 60),
        ("s100", 100),
        ("s128", 128),
        ("s129", 129),
    ] {
        let t: String = std::iter::repeat_n('t', len).collect();
        std::os::unix::fs::symlink(t, root.join(name)).unwrap();
    }
}

/// `-O inline_data`: the same bytes as `mke2fs -d -O inline_data`,
/// inode tables included (but nanoseconds), with 4 KiB and 1 KiB blocks;
/// e2fsck-clean; the tree read back through the library and, as root
/// with loop devices, the kernel.
#[test]
fn inline_data_tree_matches_mke2fs() {
    let test = "inline_data_tree_matches_mke2fs";
    if !have("mke2fs") {
        return skip(test, "mke2fs not found");
    }
    let src = tempfile::tempdir().unwrap();
    build_inline(src.path());
    let want = walk_host(src.path());
    let dir = image_dir();
    let seed = format!("hash_seed={SEED}");
    let kernel = kernel_mount_available();
    if let Err(why) = &kernel {
        skip(&format!("{test} (kernel mount)"), why);
    }
    for bs in ["4096", "1024"] {
        let (ours, theirs) = (dir.path().join("ours"), dir.path().join("theirs"));
        let args = [
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            bs,
            "-O",
            "inline_data",
            "-U",
            UUID,
            "-E",
            &seed,
            "-d",
        ];
        for (mut c, img) in [(ext4kit_mkfs(args), &ours), (mke2fs(args), &theirs)] {
            let _ = std::fs::remove_file(img);
            run_ok(
                c.arg(src.path())
                    .arg(img)
                    .arg("16M")
                    .env("E2FSPROGS_FAKE_TIME", FAKE_TIME),
            )
            .unwrap();
        }
        e2fsck_clean(&ours).unwrap();
        let bad = differing_blocks(&ours, &theirs, true);
        assert!(bad.is_empty(), "-b {bs}: differs from mke2fs -d: {bad:?}");
        let dev = open_image(&ours);
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let inl = fs.resolve(b"/f128", false).unwrap();
        assert!(
            inl.has_inline_data() && inl.blocks_512 == 0,
            "-b {bs}: /f128"
        );
        // Two mkfs runs read the source: directories' atimes move. The
        // library lists the `system.data` attribute the kernel hides.
        let no_atime = |n: &mut Node| {
            n.atime = (0, 0);
            n.xattrs.remove(&b"system.data"[..]);
        };
        compare(&format!("-b {bs}"), &walk_image(&fs), &want, no_atime).unwrap();
        if kernel.is_ok() {
            let lo = LoopDev::attach(&ours).unwrap();
            let m = Mount::new(lo.path(), "ext4", Some("ro,noatime")).unwrap();
            let got = walk_host(m.path());
            let res = compare(&format!("-b {bs} kernel"), &got, &want, no_atime);
            m.unmount().unwrap();
            drop(lo);
            res.unwrap();
        }
    }
}

#[test]
fn root_owner_and_bad_sources() {
    let dir = image_dir();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f"), b"x").unwrap();
    // -E root_owner: the root's owner; the copied entries keep theirs.
    let img = dir.path().join("owner");
    mkfs_d(src.path(), &img, &["-E", "root_owner=1000:2000"], "16M").unwrap();
    e2fsck_clean(&img).unwrap();
    {
        let dev = open_image(&img);
        let vol = Volume::open(&dev).unwrap();
        let root = vol.fs().root().unwrap();
        assert_eq!((root.uid, root.gid), (1000, 2000));
    }
    // Errors: one line naming the path, exit 1, and no superblock left.
    let check = |label: &str, src: &Path, extra: &[&str], size: &str, names: &Path| {
        let img = dir.path().join(label);
        let mut c = ext4kit_mkfs(["-q", "-F", "-t", "ext4"]);
        c.args(extra).arg("-d").arg(src).arg(&img).arg(size);
        let out = run(&mut c).unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{label}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{label}: {err}");
        assert!(
            err.contains(&*names.to_string_lossy()),
            "{label}: {err:?} does not name {}",
            names.display()
        );
        if img.exists() {
            let sb = dumpe2fs_h(&img);
            assert!(
                !sb.contains("magic number"),
                "{label}: a superblock was left: {sb}"
            );
        }
    };
    let missing = src.path().join("nope");
    check("missing", &missing, &[], "16M", &missing);
    // A tree larger than the filesystem.
    let big = tempfile::tempdir().unwrap();
    std::fs::write(big.path().join("huge"), noise(9, 3 << 20)).unwrap();
    check("full", big.path(), &[], "2M", &big.path().join("huge"));
    // More files than inodes.
    let many = tempfile::tempdir().unwrap();
    for k in 0..40 {
        std::fs::write(many.path().join(format!("f{k:02}")), b"x").unwrap();
    }
    check("inodes", many.path(), &["-N", "16"], "4M", many.path());
    // A symlink longer than a 1 KiB block.
    let sl = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("y".repeat(2000), sl.path().join("s")).unwrap();
    check(
        "symlink",
        sl.path(),
        &["-b", "1024"],
        "4M",
        &sl.path().join("s"),
    );
    // Unreadable files (only without root, who reads anything).
    if !is_root() {
        let ur = tempfile::tempdir().unwrap();
        std::fs::write(ur.path().join("secret"), b"x").unwrap();
        std::fs::set_permissions(
            ur.path().join("secret"),
            std::fs::Permissions::from_mode(0o000),
        )
        .unwrap();
        check(
            "unreadable",
            ur.path(),
            &[],
            "4M",
            &ur.path().join("secret"),
        );
    }
    // -d with what it does not support yet: refused before writing.
    let img = dir.path().join("ext2");
    let out = run(ext4kit_mkfs(["-q", "-F", "-t", "ext2", "-d"])
        .arg(src.path())
        .arg(&img)
        .arg("8M"))
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!img.exists() || !dumpe2fs_h(&img).contains("magic number"));
}

/// `-d ARCHIVE`: a pax tar of the same tree (GNU tar, xattrs kept), plain,
/// gzip, zstd and xz (each also as two streams one after the other, split
/// mid-archive), and on stdin, gives the directory's bytes (times clamped,
/// since archiving reads the files); a corrupt archive (truncated, or a
/// compressed one with a flipped byte) and a `..` member are one line and
/// no filesystem.
#[test]
fn tarball_gives_the_directory_bytes() {
    if !have("tar") || !have("gzip") {
        return skip("tarball_gives_the_directory_bytes", "tar or gzip not found");
    }
    let dir = image_dir();
    let src = tempfile::tempdir().unwrap();
    build(src.path(), 4096, false);
    // (tar has no sockets.)
    std::fs::remove_file(src.path().join("sock")).unwrap();
    let tarball = dir.path().join("t.tar");
    run_ok(
        tool("tar")
            .args(["--format=pax", "--xattrs", "--xattrs-include=*", "-C"])
            .arg(src.path())
            .arg("-cf")
            .arg(&tarball)
            .arg("."),
    )
    .unwrap();
    // Compressed copies: whole, and as two concatenated streams.
    let raw = std::fs::read(&tarball).unwrap();
    let half = dir.path().join("half");
    let compress = |prog: &str, data: &[u8]| {
        std::fs::write(&half, data).unwrap();
        run_ok(tool(prog).arg("-c").arg(&half)).unwrap().stdout
    };
    let mut compressed: Vec<(String, PathBuf)> = Vec::new();
    for (prog, ext) in [("gzip", "gz"), ("zstd", "zst"), ("xz", "xz")] {
        if !have(prog) {
            println!(
                "tarball_gives_the_directory_bytes: {prog} not found, its archives not tested"
            );
            continue;
        }
        let whole = dir.path().join(format!("t.tar.{ext}"));
        std::fs::write(&whole, compress(prog, &raw)).unwrap();
        let cut = raw.len() / 2 + 77;
        let two = dir.path().join(format!("t2.tar.{ext}"));
        let joined = [compress(prog, &raw[..cut]), compress(prog, &raw[cut..])].concat();
        std::fs::write(&two, joined).unwrap();
        compressed.push((prog.to_string(), whole));
        compressed.push((format!("{prog} (two streams)"), two));
    }
    let seed = format!("hash_seed={SEED}");
    let make = |from: &Path, img: &Path, stdin: Option<&Path>| {
        let mut c = ext4kit_mkfs([
            "-q", "-F", "-t", "ext4", "-b", "4096", "-U", UUID, "-E", &seed,
        ]);
        c.arg("-d")
            .arg(if stdin.is_some() {
                Path::new("-")
            } else {
                from
            })
            .arg(img)
            .arg("64M")
            .env("E2FSPROGS_FAKE_TIME", "1600000000")
            .env("SOURCE_DATE_EPOCH", "1600000000");
        if let Some(f) = stdin {
            c.stdin(std::fs::File::open(f).unwrap());
        }
        run_ok(&mut c).unwrap();
        e2fsck_clean(img).unwrap();
        std::fs::read(img).unwrap()
    };
    let d = make(src.path(), &dir.path().join("d.img"), None);
    let dev = open_image(&dir.path().join("d.img"));
    let want = walk_image(&Volume::open(&dev).unwrap().fs());
    let mut cases = vec![
        ("tar".to_string(), tarball.clone(), None),
        (
            "stdin".to_string(),
            tarball.clone(),
            Some(tarball.as_path()),
        ),
    ];
    cases.extend(compressed.iter().map(|(l, p)| (l.clone(), p.clone(), None)));
    for (k, (label, from, stdin)) in cases.into_iter().enumerate() {
        let label = label.as_str();
        let from = &from;
        let img = dir.path().join(format!("c{k}.img"));
        let t = make(from, &img, stdin);
        if t != d {
            // Say what differs before failing.
            let dev = open_image(&img);
            let got = walk_image(&Volume::open(&dev).unwrap().fs());
            compare(label, &got, &want, |_| {}).unwrap();
            panic!("{label}: the same tree, but not the same bytes");
        }
    }
    // Bad archives.
    let check = |label: &str, archive: &Path| {
        let img = dir.path().join(format!("{label}.img"));
        let out = run(ext4kit_mkfs(["-q", "-F", "-t", "ext4", "-d"])
            .arg(archive)
            .arg(&img)
            .arg("16M"))
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{label}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{label}: {err}");
        assert!(!img.exists(), "{label}: the target was touched");
    };
    let mut bytes = std::fs::read(&tarball).unwrap();
    bytes.truncate(bytes.len() / 2 + 100);
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &bytes).unwrap();
    check("truncated", &cut);
    let mut h = vec![0u8; 1024];
    h[..512].copy_from_slice(&ustar_header(b"../evil", b'0', 0));
    let evil = dir.path().join("evil.tar");
    std::fs::write(&evil, [h, vec![0; 1024]].concat()).unwrap();
    check("dotdot", &evil);
    for (label, path) in &compressed {
        if label.contains("two") {
            continue;
        }
        let mut bytes = std::fs::read(path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x55;
        let bad = dir.path().join(format!("bad.{label}"));
        std::fs::write(&bad, &bytes).unwrap();
        check(&format!("corrupt {label}"), &bad);
    }
}

/// A ustar header block for `name` of type `typ` and `size` bytes.
fn ustar_header(name: &[u8], typ: u8, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = typ;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}
