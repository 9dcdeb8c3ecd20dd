//! The read side of the engine and `ext4kit ls`, `cat`, `stat`.
//!
//! Oracles: debugfs (`dx_hash`, `ls -l`, `cat`, `stat`, `ea_list`) and the
//! source tree an image was populated from (`mke2fs -d`), a kernel mount
//! for kernel-written trees (root with loop devices, else SKIP), and
//! images that must stay byte-identical (read-only, also with a dirty
//! journal).

mod common;

use std::os::unix::ffi::OsStrExt;

use common::*;
use ext4kit_format::dirhash;

/// Names for hashing: short, long (several MD4/TEA rounds), bytes >= 0x80
/// (where the signed and unsigned variants differ).
fn hash_names() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..200usize {
        let len = 1 + (i * 7) % 90;
        let mut n = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Printable, no whitespace or quotes (debugfs splits its
            // command line), some bytes with the top bit set.
            let b = (x % 94) as u8 + 33;
            let b = if x.is_multiple_of(5) { b | 0x80 } else { b };
            n.push(if b == b'"' || b == b'\'' || b == b'\\' {
                b'a'
            } else {
                b
            });
        }
        v.push(n);
    }
    v.push(b"lost+found".to_vec());
    v.push(b"a".to_vec());
    v.push([b'x'; 255].to_vec());
    v
}

#[test]
fn dirhash_matches_debugfs() {
    if !have("debugfs") {
        return skip("dirhash_matches_debugfs", "debugfs not found");
    }
    let dir = image_dir();
    let names = hash_names();
    let seeds: [(&str, [u8; 16]); 2] = [
        (SEED, uuid::Uuid::parse_str(SEED).unwrap().into_bytes()),
        ("00000000-0000-0000-0000-000000000000", [0; 16]),
    ];
    let mut cmds = Vec::new();
    let mut want = Vec::new();
    for (s, seed) in &seeds {
        for alg in 0u8..=5 {
            for n in &names {
                cmds.extend_from_slice(format!("dx_hash -h {alg} -s {s} ").as_bytes());
                cmds.extend_from_slice(n);
                cmds.push(b'\n');
                want.push(dirhash::dirhash(alg, n, seed).unwrap());
            }
        }
    }
    let f = dir.path().join("cmds");
    std::fs::write(&f, &cmds).unwrap();
    let out = run_ok(tool("debugfs").arg("-f").arg(&f)).unwrap();
    let text = out.stdout;
    let got: Vec<dirhash::DxHash> = text
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"Hash of "))
        .map(|l| {
            let s = String::from_utf8_lossy(l);
            let (_, rest) = s.rsplit_once(" is 0x").unwrap();
            let (maj, min) = rest.split_once(" (minor 0x").unwrap();
            dirhash::DxHash {
                major: u32::from_str_radix(maj, 16).unwrap(),
                minor: u32::from_str_radix(min.trim_end_matches(')'), 16).unwrap(),
            }
        })
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "debugfs printed {} hashes",
        got.len()
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let n = &names[i % names.len()];
        assert_eq!(
            g,
            w,
            "hash {} of {:?} (alg {})",
            i,
            std::ffi::OsStr::from_bytes(n),
            (i / names.len()) % 6
        );
    }
}

// ---------------------------------------------------------------------
// A model of a tree: what the source directory (or a kernel mount) has,
// and what ext4kit reads from the image.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ext4kit_device::{FileDevice, OpenOptions};
use ext4kit_fs::inode::FileType;
use ext4kit_fs::sb::{Fs, Volume};

/// path -> (attribute name -> value).
type XattrMap = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    /// `i_mode` (type and permissions).
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    mtime: i64,
    /// FNV-1a of the content (regular files), the target (symlinks).
    content: Option<u64>,
    target: Option<Vec<u8>>,
    rdev: Option<(u32, u32)>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A digest of a whole image (to prove it was not written): CRC-32C of
/// every 1 MiB and the length (hardware CRC, fast also in debug builds).
fn image_digest(path: &Path) -> (Vec<u32>, u64) {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let (mut sums, mut len) = (Vec::new(), 0u64);
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return (sums, len);
        }
        len += n as u64;
        sums.push(ext4kit_format::checksum::crc32c_raw(!0, &buf[..n]));
    }
}

/// Content digest: CRC-32C (hardware, fast also in debug builds).
fn fnv(h: &mut u64, b: &[u8]) {
    *h = u64::from(ext4kit_format::checksum::crc32c_raw(*h as u32, b));
}

const FNV0: u64 = 0xffff_ffff;

/// Every path of the image below `/` (without lost+found), read with the
/// library: names, inode fields, content digests, targets, xattrs. Checks
/// on the way that every name is found again by `lookup` (by hash in an
/// htree directory).
fn walk_image(fs: &Fs<'_>) -> BTreeMap<Vec<u8>, Node> {
    walk_image_times(fs).0
}

/// Times (atime, mtime, ctime as seconds and nanoseconds) and 512-byte
/// blocks of every path.
type Times = BTreeMap<Vec<u8>, ([(i64, i64); 3], u64)>;

/// [`walk_image`], and the times and block counts of every path.
fn walk_image_times(fs: &Fs<'_>) -> (BTreeMap<Vec<u8>, Node>, Times) {
    let mut out = BTreeMap::new();
    let mut times = Times::new();
    let root = fs.root().unwrap();
    let mut stack = vec![(Vec::<u8>::new(), root)];
    while let Some((path, dir)) = stack.pop() {
        let entries = fs.read_dir(&dir).unwrap();
        for e in entries {
            if e.name == b"." || e.name == b".." || (path.is_empty() && e.name == b"lost+found") {
                continue;
            }
            let found = fs.lookup(&dir, &e.name).unwrap();
            assert_eq!(
                found.as_ref().map(|f| f.ino),
                Some(e.ino),
                "lookup of {:?}",
                e.name_lossy()
            );
            let mut p = path.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            let i = fs.inode(e.ino).unwrap();
            let mut content = None;
            let mut target = None;
            if !i.has_inline_data()
                && matches!(i.file_type(), FileType::Regular | FileType::Directory)
            {
                check_single_block_mapping(fs, &i);
            }
            match i.file_type() {
                FileType::Regular => {
                    let mut h = FNV0;
                    fs.read_each(&i, &mut |b| {
                        fnv(&mut h, b);
                        true
                    })
                    .unwrap();
                    content = Some(h);
                }
                FileType::Symlink => target = Some(fs.read_link(&i).unwrap()),
                FileType::Directory => stack.push((p.clone(), i.clone())),
                _ => {}
            }
            let rdev =
                matches!(i.file_type(), FileType::CharDev | FileType::BlockDev).then(|| i.rdev());
            let xattrs = fs
                .xattrs(&i)
                .unwrap()
                .into_iter()
                .filter(|x| x.name != b"system.data")
                .map(|x| (x.name, x.value))
                .collect();
            let t = |x: ext4kit_fs::inode::Timestamp| (x.sec, i64::from(x.nsec));
            times.insert(
                p.clone(),
                ([t(i.atime), t(i.mtime), t(i.ctime)], i.blocks_512),
            );
            out.insert(
                p,
                Node {
                    mode: u32::from(i.mode),
                    uid: i.uid,
                    gid: i.gid,
                    size: if i.is_dir() { 0 } else { i.size },
                    nlink: u64::from(i.links),
                    mtime: i.mtime.sec,
                    content,
                    target,
                    rdev,
                    xattrs,
                },
            );
        }
    }
    (out, times)
}

/// `extent_at` / `block_map_at` (one path through the tree) agree with the
/// full mapping at the first and last block of every run and in the
/// holes after them.
fn check_single_block_mapping(fs: &Fs<'_>, i: &ext4kit_fs::inode::InodeInfo) {
    let maps = fs.file_map(i).unwrap();
    let at = |l: u64| -> Option<u64> {
        if i.has_extents() {
            fs.extent_at(i, l).unwrap().map(|m| m.pblk + (l - m.lblk))
        } else {
            fs.block_map_at(i, l).unwrap()
        }
    };
    for (k, m) in maps.iter().enumerate() {
        let last = m.end() - 1;
        assert_eq!(at(m.lblk), Some(m.pblk), "inode {} lblk {}", i.ino, m.lblk);
        assert_eq!(
            at(last),
            Some(m.pblk + u64::from(m.len) - 1),
            "inode {} lblk {last}",
            i.ino
        );
        let next = maps.get(k + 1).map(|n| n.lblk);
        if next != Some(m.end())
            && (i.has_extents() || m.end() < i.size.div_ceil(u64::from(fs.info.block_size)))
        {
            assert_eq!(at(m.end()), None, "inode {} hole at {}", i.ino, m.end());
        }
    }
}

/// The same model of a host directory (sizes of directories left out:
/// they differ between filesystems). `xattrs` says what each path has.
fn walk_host(root: &Path, xattrs: &XattrMap) -> BTreeMap<Vec<u8>, Node> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::from(root)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap();
            let mut key = b"/".to_vec();
            key.extend_from_slice(rel.as_os_str().as_bytes());
            if key == b"/lost+found" {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let ft = m.file_type();
            let mut content = None;
            let mut target = None;
            if ft.is_file() {
                let mut h = FNV0;
                fnv(&mut h, &std::fs::read(&p).unwrap());
                content = Some(h);
            } else if ft.is_symlink() {
                target = Some(
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                );
            } else if ft.is_dir() {
                stack.push(p.clone());
            }
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
                    mtime: m.mtime(),
                    content,
                    target,
                    rdev,
                    xattrs: xattrs.get(&key).cloned().unwrap_or_default(),
                },
            );
        }
    }
    out
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    tool("python3")
        .arg("-c")
        .arg("import os,sys; os.setxattr(sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3]))")
        .arg(path)
        .arg(name)
        .arg(hex)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn write_at(path: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    f.write_all_at(data, off).unwrap();
}

/// A source tree with every kind of thing `mke2fs -d` copies. Returns the
/// xattrs set (empty when the temporary filesystem has none) and whether
/// device nodes could be made.
fn make_source(src: &Path, big_dir: usize) -> (XattrMap, bool) {
    std::fs::create_dir_all(src.join("dir/sub/deeper")).unwrap();
    for (i, len) in [
        0u64,
        1,
        59,
        60,
        1023,
        1024,
        1025,
        4095,
        4096,
        4097,
        12 * 1024 + 1,
        300_000,
        3 << 20,
    ]
    .iter()
    .enumerate()
    {
        pattern_file(&src.join(format!("f{i}_{len}")), *len, i as u64 + 1).unwrap();
    }
    // Sparse: islands of data (several extents; indirect blocks on ext2/3,
    // and a byte past 64 MiB for the triple-indirect block with 1 KiB).
    let sp = src.join("sparse");
    for k in 0..9u64 {
        write_at(&sp, k * 200_000 + 5, b"island");
    }
    write_at(&src.join("far"), 70 << 20, b"end");
    std::fs::write(src.join("dir/sub/deeper/leaf.txt"), b"deep\n").unwrap();
    std::os::unix::fs::symlink("f1_1", src.join("fast")).unwrap();
    std::os::unix::fs::symlink("dir/sub", src.join("tosub")).unwrap();
    std::os::unix::fs::symlink("/dir/sub/deeper/leaf.txt", src.join("abs")).unwrap();
    std::os::unix::fs::symlink("x".repeat(59), src.join("fast59")).unwrap();
    std::os::unix::fs::symlink("y".repeat(60), src.join("slow60")).unwrap();
    std::os::unix::fs::symlink("z/".repeat(150), src.join("slow300")).unwrap();
    std::os::unix::fs::symlink("loop2", src.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", src.join("loop2")).unwrap();
    std::fs::hard_link(src.join("f4_1023"), src.join("dir/hardlink")).unwrap();
    let fifo = tool("mkfifo")
        .arg(src.join("fifo"))
        .status()
        .is_ok_and(|s| s.success());
    assert!(fifo, "mkfifo");
    let devs = tool("mknod")
        .arg(src.join("null"))
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success())
        && tool("mknod")
            .arg(src.join("blk"))
            .args(["b", "259", "70000"])
            .status()
            .is_ok_and(|s| s.success());
    let big = src.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..big_dir {
        std::fs::File::create(big.join(format!("entry-{i:05}-{}", "n".repeat(i % 40)))).unwrap();
    }
    let mut xattrs = XattrMap::new();
    let sets: [(&str, &str, Vec<u8>); 4] = [
        ("/f1_1", "user.small", b"v".to_vec()),
        ("/f1_1", "user.other", b"second value".to_vec()),
        ("/dir", "user.big", vec![0xA5; 600]),
        ("/fast", "user.onlink", b"x".to_vec()),
    ];
    for (p, n, v) in sets {
        if p == "/fast" {
            continue; // user.* is not allowed on symlinks
        }
        if !set_xattr(&src.join(&p[1..]), n, &v) {
            xattrs.clear();
            break;
        }
        xattrs
            .entry(p.as_bytes().to_vec())
            .or_default()
            .insert(n.as_bytes().to_vec(), v);
    }
    (xattrs, devs)
}

fn open_fs(img: &Path) -> (FileDevice, ()) {
    (FileDevice::open(img, OpenOptions::read_only()).unwrap(), ())
}

fn compare_trees(what: &str, got: &BTreeMap<Vec<u8>, Node>, want: &BTreeMap<Vec<u8>, Node>) {
    let gk: Vec<_> = got
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let wk: Vec<_> = want
        .keys()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert_eq!(gk.len(), wk.len(), "{what}: names differ");
    assert_eq!(gk, wk, "{what}: names differ");
    for (k, w) in want {
        let g = &got[k];
        assert_eq!(g, w, "{what}: {}", String::from_utf8_lossy(k));
    }
}

/// `debugfs -R "ls -l DIR"`: (inode, mode, uid, gid, size, name) per entry.
fn debugfs_ls(img: &Path, dir: &str) -> Vec<(u32, u32, u32, u32, u64, Vec<u8>)> {
    let out = run_ok(
        tool("debugfs")
            .arg("-R")
            .arg(format!("ls -l {dir}"))
            .arg(img),
    )
    .unwrap();
    out.stdout
        .split(|&b| b == b'\n')
        .filter_map(|l| {
            let s = String::from_utf8_lossy(l).into_owned();
            let f: Vec<&str> = s.split_whitespace().collect();
            if f.len() < 9 {
                return None;
            }
            // ino mode (ft) uid gid size date time name...
            let name_at = s.find(f[7]).map(|i| i + f[7].len() + 1)?;
            let name = l.get(name_at..)?.to_vec();
            Some((
                f[0].parse().ok()?,
                u32::from_str_radix(f[1], 8).ok()?,
                f[3].parse().ok()?,
                f[4].parse().ok()?,
                f[5].parse().ok()?,
                name,
            ))
        })
        .collect()
}

fn check_against_debugfs(fs: &Fs<'_>, img: &Path, dirs: &[&str], xattr_paths: &[&str]) {
    for d in dirs {
        let dir = fs.resolve(d.as_bytes(), true).unwrap();
        let mut ours: Vec<_> = fs
            .read_dir(&dir)
            .unwrap()
            .into_iter()
            .map(|e| {
                let i = fs.inode(e.ino).unwrap();
                (e.ino, u32::from(i.mode), i.uid, i.gid, i.size, e.name)
            })
            .collect();
        let mut theirs = debugfs_ls(img, d);
        ours.sort_by(|a, b| a.5.cmp(&b.5));
        theirs.sort_by(|a, b| a.5.cmp(&b.5));
        assert_eq!(ours, theirs, "debugfs ls -l {d} on {}", img.display());
    }
    for p in xattr_paths {
        let i = fs.resolve(p.as_bytes(), false).unwrap();
        let mut ours: Vec<_> = fs
            .xattrs(&i)
            .unwrap()
            .into_iter()
            .map(|x| (x.name_lossy(), x.value.len()))
            .collect();
        let mut theirs = debugfs_ea_list(img, p);
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "debugfs ea_list {p}");
    }
}

fn e2fs_tools() -> Result<(), String> {
    for t in ["mke2fs", "e2fsck", "debugfs", "mkfifo", "mknod"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    Ok(())
}

/// mke2fs -d SRC, then `e2fsck -fyD` so that directories past one block
/// become htrees (mke2fs -d writes linear directories), then a clean
/// `e2fsck -fn`.
fn populated_image(dir: &Path, src: &Path, name: &str, args: &[&str]) -> PathBuf {
    let img = dir.join(format!("{name}.img"));
    run_ok(
        mke2fs(["-q", "-F", "-N", "8192", "-E", &format!("hash_seed={SEED}")])
            .args(args)
            .arg("-d")
            .arg(src)
            .arg(&img)
            .arg("48M"),
    )
    .unwrap();
    let out = run(tool("e2fsck").arg("-fyD").arg(&img)).unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "e2fsck -fyD {name}: {}",
        last_line(&out)
    );
    e2fsck_clean(&img).unwrap();
    img
}

#[test]
fn populated_images_read_like_the_source_and_debugfs() {
    if let Err(why) = e2fs_tools() {
        return skip("populated_images_read_like_the_source_and_debugfs", &why);
    }
    let dir = image_dir();
    // Two trees: one with a 5200-entry directory (mke2fs -d fills it
    // slowly, so only two configurations get it), one without.
    let src_big = dir.path().join("src-big");
    let src = dir.path().join("src");
    let (xattrs, devs) = make_source(&src, 0);
    make_source(&src_big, 5200);
    if !devs {
        eprintln!("note: mknod failed (not root?): no device nodes in the tree");
    }
    if xattrs.is_empty() {
        eprintln!("note: the temporary filesystem takes no user xattrs: none in the tree");
    }
    let want_small = walk_host(&src, &xattrs);
    let want_big = walk_host(&src_big, &xattrs);
    let configs: [(&str, bool, &[&str]); 7] = [
        ("ext4-1k", true, &["-t", "ext4", "-b", "1024"]),
        ("ext4-4k", false, &["-t", "ext4", "-b", "4096"]),
        (
            "ext4-4k-nocsum",
            false,
            &["-t", "ext4", "-b", "4096", "-O", "^metadata_csum"],
        ),
        (
            "ext4-1k-128",
            false,
            &[
                "-t",
                "ext4",
                "-b",
                "1024",
                "-I",
                "128",
                "-O",
                "^metadata_csum,uninit_bg",
            ],
        ),
        ("ext3-1k", false, &["-t", "ext3", "-b", "1024"]),
        ("ext2-4k", true, &["-t", "ext2", "-b", "4096"]),
        ("ext4-inline", false, &["-t", "ext4", "-O", "inline_data"]),
    ];
    for (name, with_big, args) in configs {
        let (src, want) = if with_big {
            (&src_big, &want_big)
        } else {
            (&src, &want_small)
        };
        let img = populated_image(dir.path(), src, name, args);
        let before = image_digest(&img);
        let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        // The big directory is an htree now.
        let big = fs.resolve(b"/big", false).unwrap();
        assert_eq!(big.is_htree(), with_big, "{name}: /big indexed?");
        let got = walk_image(&fs);
        compare_trees(name, &got, want);
        let xp: Vec<&str> = xattrs
            .keys()
            .map(|k| std::str::from_utf8(k).unwrap())
            .collect();
        check_against_debugfs(&fs, &img, &["/", "/dir", "/big"], &xp);
        drop(vol);
        drop(dev);
        assert_eq!(image_digest(&img), before, "{name}: the image changed");
    }
    let _ = open_fs;
}

fn stdout_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn host_mode_string(m: &std::fs::Metadata) -> String {
    let mode = m.mode();
    let ft = m.file_type();
    let t = if ft.is_dir() {
        'd'
    } else if ft.is_symlink() {
        'l'
    } else if ft.is_char_device() {
        'c'
    } else if ft.is_block_device() {
        'b'
    } else if ft.is_fifo() {
        'p'
    } else if ft.is_socket() {
        's'
    } else {
        '-'
    };
    let mut s = String::from(t);
    for (bit, c) in [
        (0o400, 'r'),
        (0o200, 'w'),
        (0o100, 'x'),
        (0o040, 'r'),
        (0o020, 'w'),
        (0o010, 'x'),
        (0o004, 'r'),
        (0o002, 'w'),
        (0o001, 'x'),
    ] {
        s.push(if mode & bit != 0 { c } else { '-' });
    }
    s
}

#[test]
fn cli_ls_cat_stat_and_their_errors() {
    if let Err(why) = e2fs_tools() {
        return skip("cli_ls_cat_stat_and_their_errors", &why);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    let (xattrs, _) = make_source(&src, 300);
    let img = populated_image(dir.path(), &src, "cli", &["-t", "ext4", "-b", "4096"]);
    let before = image_digest(&img);
    let im = img.display().to_string();
    let at = |p: &str| format!("{im}:{p}");

    // ls: names as the source has them (sorted bytewise), -a adds dots.
    let out = run_ok(ext4kit().arg("ls").arg(&img)).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.push("lost+found".into());
    names.sort();
    assert_eq!(stdout_of(&out).lines().collect::<Vec<_>>(), names);
    let out = run_ok(ext4kit().args(["ls", "-a"]).arg(at("/dir"))).unwrap();
    assert_eq!(
        stdout_of(&out).lines().collect::<Vec<_>>(),
        [".", "..", "hardlink", "sub"]
    );
    let out = run_ok(ext4kit().arg("ls").arg(at("/big"))).unwrap();
    assert_eq!(stdout_of(&out).lines().count(), 300);

    // ls -l: mode, links, ids, size (or device numbers), name -> target.
    let out = run_ok(ext4kit().args(["ls", "-l"]).arg(at("/"))).unwrap();
    let text = stdout_of(&out);
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("total "));
    for l in lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        let is_dev = l.starts_with('c') || l.starts_with('b');
        let name_at = if is_dev { 9 } else { 8 };
        let name = f[name_at];
        if name == "lost+found" {
            continue;
        }
        let m = std::fs::symlink_metadata(src.join(name)).unwrap();
        assert_eq!(f[0], host_mode_string(&m), "{l}");
        assert_eq!(f[1], m.nlink().to_string(), "{l}");
        assert_eq!(f[2], m.uid().to_string(), "{l}");
        assert_eq!(f[3], m.gid().to_string(), "{l}");
        if is_dev {
            let r = m.rdev();
            let (ma, mi) = (((r >> 8) & 0xfff), ((r & 0xff) | ((r >> 12) & 0xfff00)));
            assert_eq!(format!("{} {}", f[4], f[5]), format!("{ma}, {mi}"), "{l}");
        } else if !m.is_dir() {
            assert_eq!(f[4], m.size().to_string(), "{l}");
        }
        if m.file_type().is_symlink() {
            let t = std::fs::read_link(src.join(name)).unwrap();
            assert!(l.ends_with(&format!(" -> {}", t.display())), "{l}");
        }
    }

    // cat: several files in a row, symlinks in the middle and at the end
    // (relative and absolute), holes.
    let out = run_ok(
        ext4kit()
            .arg("cat")
            .arg(at("/f11_300000"))
            .arg(at("fast"))
            .arg(at("/tosub/deeper/leaf.txt"))
            .arg(at("/abs"))
            .arg(at("/sparse")),
    )
    .unwrap();
    let mut want = std::fs::read(src.join("f11_300000")).unwrap();
    want.extend(std::fs::read(src.join("f1_1")).unwrap());
    want.extend(b"deep\ndeep\n");
    want.extend(std::fs::read(src.join("sparse")).unwrap());
    assert!(out.stdout == want, "cat output differs");

    // stat: coreutils-like text and JSON fields.
    let out = run_ok(ext4kit().arg("stat").arg(at("/f1_1"))).unwrap();
    let text = stdout_of(&out);
    let m = std::fs::metadata(src.join("f1_1")).unwrap();
    assert!(text.starts_with("  File: /f1_1\n  Size: 1 "), "{text}");
    assert!(
        text.contains(&format!("Access: ({:04o}/-rw", m.mode() & 0o7777)),
        "{text}"
    );
    let out = run_ok(ext4kit().args(["stat", "--json"]).arg(at("/f1_1"))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["size"], 1);
    assert_eq!(v["links"], m.nlink());
    assert_eq!(v["uid"], m.uid());
    assert_eq!(v["mtime"]["sec"], m.mtime());
    assert_eq!(v["type"], "regular file");
    let names: Vec<String> = v["xattrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = xattrs
        .get(b"/f1_1".as_slice())
        .map(|m| {
            m.keys()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let mut names = names;
    names.sort();
    want.sort();
    assert_eq!(names, want);
    let out = run_ok(ext4kit().args(["stat", "--json"]).arg(at("/slow300"))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["symlink"], "z/".repeat(150));
    let out = run_ok(ext4kit().args(["stat", "-L", "--json"]).arg(at("/tosub"))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "directory");

    // Errors: one line naming the operand and the reason, exit 1.
    for (args, msg) in [
        (
            vec!["ls".to_string(), at("/nope")],
            format!("cannot access '{}': No such file or directory", at("/nope")),
        ),
        (
            vec!["stat".to_string(), at("/f1_1/x")],
            format!("cannot access '{}': Not a directory", at("/f1_1/x")),
        ),
        (
            vec!["cat".to_string(), at("/loop1")],
            format!(
                "cannot access '{}': Too many levels of symbolic links",
                at("/loop1")
            ),
        ),
        (
            vec!["cat".to_string(), at("/dir")],
            format!("'{}': Is a directory", at("/dir")),
        ),
        (
            vec!["ls".to_string(), "/nonexistent/x.img:/".to_string()],
            "/nonexistent/x.img: No such file or directory".to_string(),
        ),
    ] {
        let out = run(ext4kit().args(&args)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("ext4kit: ") && err.contains(&msg),
            "{args:?}: {err}"
        );
    }
    // A failing operand does not stop the others.
    let out = run(ext4kit().arg("cat").arg(at("/nope")).arg(at("/f1_1"))).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, std::fs::read(src.join("f1_1")).unwrap());
    for c in ["ls", "cat", "stat"] {
        let out = run_ok(ext4kit().args([c, "--help"])).unwrap();
        assert!(
            stdout_of(&out).contains(&format!("Usage: ext4kit {c}")),
            "{c} --help"
        );
    }
    // A closed stdout neither panics nor hangs.
    let mut child = ext4kit()
        .arg("cat")
        .arg(at("/f12_3145728"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 141)),
        "{:?}",
        out.status
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(image_digest(&img), before, "the image changed");
}

fn bmap(img: &Path, path: &str, lblk: u64) -> u64 {
    let out = run_ok(
        tool("debugfs")
            .arg("-R")
            .arg(format!("bmap {path} {lblk}"))
            .arg(img),
    )
    .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn read_img_block(img: &Path, bs: u64, b: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; bs as usize];
    std::fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut v, b * bs)
        .unwrap();
    v
}

/// A transaction written by debugfs (jo/jw/jc) that renames an entry of
/// the root directory and replaces a file's first block: ls and cat see
/// the replayed state, the image stays byte-identical, and the tree equals
/// the one e2fsck's replay writes.
#[test]
fn dirty_journal_is_replayed_in_memory_only() {
    if let Err(why) = e2fs_tools() {
        return skip("dirty_journal_is_replayed_in_memory_only", &why);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    make_source(&src, 0);
    let img = populated_image(dir.path(), &src, "dirty", &["-t", "ext4", "-b", "1024"]);
    let bs = 1024u64;
    let data_blk = bmap(&img, "/f11_300000", 0);
    let root_blk = bmap(&img, "/", 0);
    // The new root block: "f11_300000" becomes "g11_300000", with the tail
    // checksum of the root directory.
    let mut root = read_img_block(&img, bs, root_blk);
    let pos = root.windows(10).position(|w| w == b"f11_300000").unwrap();
    root[pos] = b'g';
    {
        let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let r = vol.fs().root().unwrap();
        ext4kit_format::dir::put_tail(&mut root, 2, r.generation, &vol.info.csum);
    }
    let mut blocks = vec![b'N'; bs as usize];
    blocks.extend_from_slice(&root);
    let f = dir.path().join("jblocks");
    std::fs::write(&f, &blocks).unwrap();
    let cmds = dir.path().join("cmds");
    std::fs::write(
        &cmds,
        format!("jo -c\njw -b {data_blk},{root_blk} {}\njc\n", f.display()),
    )
    .unwrap();
    let out = run_ok(tool("debugfs").arg("-w").arg("-f").arg(&cmds).arg(&img)).unwrap();
    assert!(!stdout_of(&out).contains("rror"), "{}", stdout_of(&out));
    assert!(dumpe2fs_h(&img).contains("needs_recovery"));
    let before = image_digest(&img);
    let im = img.display().to_string();

    let out = run_ok(ext4kit().arg("ls").arg(&img)).unwrap();
    let names = stdout_of(&out);
    assert!(names.lines().any(|l| l == "g11_300000"), "{names}");
    assert!(!names.lines().any(|l| l == "f11_300000"), "{names}");
    let out = run_ok(ext4kit().arg("cat").arg(format!("{im}:/g11_300000"))).unwrap();
    let old = std::fs::read(src.join("f11_300000")).unwrap();
    assert_eq!(out.stdout.len(), old.len());
    assert!(out.stdout[..bs as usize].iter().all(|&b| b == b'N'));
    assert_eq!(out.stdout[bs as usize..], old[bs as usize..]);
    assert_eq!(image_digest(&img), before, "the image changed");

    // e2fsck's replay of a copy gives the same tree.
    let copy = dir.path().join("replayed.img");
    std::fs::copy(&img, &copy).unwrap();
    let out = run(tool("e2fsck").args(["-E", "journal_only", "-y"]).arg(&copy)).unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        last_line(&out)
    );
    let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    assert_eq!(vol.info.replayed_transactions, 1);
    let ours = walk_image(&vol.fs());
    let dev2 = FileDevice::open(&copy, OpenOptions::read_only()).unwrap();
    let vol2 = Volume::open(&dev2).unwrap();
    assert_eq!(vol2.info.replayed_transactions, 0);
    let theirs = walk_image(&vol2.fs());
    compare_trees("replayed", &ours, &theirs);
    assert_eq!(image_digest(&img), before, "the image changed");
}

/// A small tree for mutation campaigns: a few files (one with islands,
/// so an extent tree or indirect blocks), symlinks, an xattr block, and a
/// directory of 150 entries (an htree after `e2fsck -D`).
fn small_source(src: &Path) {
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    pattern_file(&src.join("one"), 5000, 1).unwrap();
    pattern_file(&src.join("a/b/two"), 70_000, 2).unwrap();
    for k in 0..7u64 {
        write_at(&src.join("islands"), k * 30_000, b"x");
    }
    std::os::unix::fs::symlink("one", src.join("fast")).unwrap();
    std::os::unix::fs::symlink("a/".repeat(40) + "x", src.join("slow")).unwrap();
    let _ = set_xattr(&src.join("one"), "user.attr", &[7u8; 300]);
    std::fs::create_dir(src.join("many")).unwrap();
    for i in 0..150 {
        std::fs::File::create(src.join(format!("many/name-{i:04}"))).unwrap();
    }
}

/// Walk everything, ignoring errors; returns how many operations failed.
/// Reads at most 4 MiB per file, visits each directory once.
fn walk_ignoring_errors(fs: &Fs<'_>) -> usize {
    let mut errors = 0;
    let Ok(root) = fs.root() else { return 1 };
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        if !seen.insert(d.ino) || seen.len() > 1000 {
            continue;
        }
        let entries = match fs.read_dir(&d) {
            Ok(e) => e,
            Err(_) => {
                errors += 1;
                continue;
            }
        };
        let _ = fs.xattrs(&d).map_err(|_| errors += 1);
        for e in entries {
            if fs.lookup(&d, &e.name).is_err() {
                errors += 1;
            }
            let Ok(i) = fs.inode(e.ino) else {
                errors += 1;
                continue;
            };
            let _ = fs.xattrs(&i).map_err(|_| errors += 1);
            match i.file_type() {
                FileType::Directory => stack.push(i),
                FileType::Symlink => {
                    let _ = fs.read_link(&i).map_err(|_| errors += 1);
                }
                _ => {
                    let mut left = 4usize << 20;
                    let r = fs.read_each(&i, &mut |b| {
                        left = left.saturating_sub(b.len());
                        left > 0
                    });
                    let _ = r.map_err(|_| errors += 1);
                }
            }
            let mut p = b"/".to_vec();
            p.extend_from_slice(&e.name);
            let _ = fs.resolve(&p, true);
        }
    }
    errors
}

fn mutant_count(default: u64) -> u64 {
    std::env::var("EXT4KIT_READ_MUTANTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Random damage to the metadata blocks of small populated images (with
/// and without metadata_csum, and a block-mapped ext2): walking everything
/// never panics, and `ext4kit ls -laR` / `cat` fail with one-line errors,
/// exit 1 at most.
#[test]
fn corrupted_images_never_panic() {
    if let Err(why) = e2fs_tools() {
        return skip("corrupted_images_never_panic", &why);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    small_source(&src);
    let cases = mutant_count(150);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let configs: [(&str, &[&str]); 3] = [
        ("mut-csum", &["-t", "ext4", "-b", "1024"]),
        (
            "mut-nocsum",
            &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
        ),
        ("mut-ext2", &["-t", "ext2", "-b", "1024"]),
    ];
    let (mut opened, mut with_errors) = (0u64, 0u64);
    for (name, args) in configs {
        let img = dir.path().join(format!("{name}.img"));
        run_ok(
            mke2fs(["-q", "-F", "-N", "256"])
                .args(args)
                .arg("-d")
                .arg(&src)
                .arg(&img)
                .arg("4M"),
        )
        .unwrap();
        let out = run(tool("e2fsck").arg("-fyD").arg(&img)).unwrap();
        assert!(matches!(out.status.code(), Some(0 | 1)));
        e2fsck_clean(&img).unwrap();
        let base = std::fs::read(&img).unwrap();
        let bs = 1024usize;
        // Metadata blocks: non-zero blocks that are not file data.
        let data: std::collections::HashSet<u64> = {
            let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
            let vol = Volume::open(&dev).unwrap();
            let fs = vol.fs();
            let mut set = std::collections::HashSet::new();
            for p in ["/one", "/a/b/two", "/islands"] {
                let i = fs.resolve(p.as_bytes(), false).unwrap();
                for m in fs.file_map(&i).unwrap() {
                    set.extend(m.pblk..m.pblk + u64::from(m.len));
                }
            }
            set
        };
        let meta: Vec<usize> = (0..base.len() / bs)
            .filter(|&b| !data.contains(&(b as u64)))
            .filter(|&b| base[b * bs..(b + 1) * bs].iter().any(|&v| v != 0))
            .collect();
        let m = dir.path().join(format!("{name}-mutant.img"));
        for case in 0..cases {
            let mut bytes = base.clone();
            let blk = meta[(rnd() % meta.len() as u64) as usize];
            for _ in 0..1 + rnd() % 4 {
                let off = blk * bs + (rnd() % bs as u64) as usize;
                bytes[off] = match rnd() % 4 {
                    0 => 0,
                    1 => 0xff,
                    _ => rnd() as u8,
                };
            }
            std::fs::write(&m, &bytes).unwrap();
            let dev = FileDevice::open(&m, OpenOptions::read_only()).unwrap();
            let res =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    match Volume::open(&dev) {
                        Ok(vol) => Some(walk_ignoring_errors(&vol.fs())),
                        Err(e) => {
                            let s = e.to_string();
                            assert!(!s.contains('\n'), "{s}");
                            None
                        }
                    }
                }));
            let r = res.unwrap_or_else(|_| panic!("{name} case {case}: panic (block {blk})"));
            if let Some(errs) = r {
                opened += 1;
                with_errors += u64::from(errs > 0);
            }
            if case % 5 == 0 {
                let ms = m.display().to_string();
                for args in [
                    vec!["ls".to_string(), "-laR".to_string(), ms.clone()],
                    vec![
                        "cat".to_string(),
                        format!("{ms}:/one"),
                        format!("{ms}:/a/b/two"),
                        format!("{ms}:/slow"),
                    ],
                    vec![
                        "stat".to_string(),
                        "--json".to_string(),
                        format!("{ms}:/many/name-0077"),
                    ],
                ] {
                    let out =
                        run(ext4kit().args(&args).stdout(std::process::Stdio::null())).unwrap();
                    let err = String::from_utf8_lossy(&out.stderr);
                    assert!(
                        matches!(out.status.code(), Some(0 | 1)),
                        "{name} case {case} {args:?}: {:?} {err}",
                        out.status
                    );
                    for l in err.lines() {
                        assert!(l.starts_with("ext4kit: "), "{name} case {case}: {l}");
                    }
                }
            }
        }
    }
    eprintln!("mutants: {opened} opened, {with_errors} of them with errors found by the walk");
}

/// Builds a tree on a kernel mount (argv[1]): a 50 000-entry directory
/// (a 3-level htree with large_dir),
/// ACLs (access and default, in getxattr's form), xattrs (in-inode, in
/// a block and in an EA inode), sparse files, unwritten extents (fallocate, also KEEP_SIZE),
/// a file with a hole punched every other block (a deep extent tree),
/// interleaved appends with fsync, hard links, symlinks, devices, fifos.
const KERNEL_TREE_PY: &str = r#"
import ctypes, os, struct, sys
m = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
def falloc(fd, mode, off, ln):
    if libc.fallocate(fd, mode, off, ln) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
def acl(entries):
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)
U = 0xFFFFFFFF
os.makedirs(m + "/big")
# Long names: with 1 KiB blocks and large_dir the index needs 3 levels.
for i in range(50000):
    os.close(os.open("%s/big/f%06d-%s" % (m, i, "q" * (200 + i % 37)), os.O_CREAT | os.O_WRONLY, 0o644))
os.makedirs(m + "/acl/sub")
with open(m + "/acl/file", "wb") as f:
    f.write(b"acl file\n")
os.setxattr(m + "/acl/file", "system.posix_acl_access",
            acl([(1, 6, U), (2, 4, 1000), (2, 6, 1001), (4, 4, U), (8, 5, 2000), (0x10, 7, U), (0x20, 0, U)]))
os.setxattr(m + "/acl/sub", "system.posix_acl_default",
            acl([(1, 7, U), (4, 5, U), (8, 7, 3000), (0x10, 7, U), (0x20, 5, U)]))
with open(m + "/acl/sub/inherits", "wb") as f:
    f.write(b"x")
with open(m + "/x", "wb") as f:
    f.write(b"xattrs\n")
os.setxattr(m + "/x", "user.small", b"1")
os.setxattr(m + "/x", "user.big", bytes(range(256)) * 3)
os.setxattr(m + "/x", "trusted.t", b"trusted value")
# Larger than a block: the value lives in an EA inode (ea_inode).
os.setxattr(m + "/x", "user.huge", bytes(range(7, 250)) * 40)
with open(m + "/sparse", "wb") as f:
    for k in range(20):
        f.seek(k * 1000003)
        f.write(b"island %d" % k)
fd = os.open(m + "/unwritten", os.O_CREAT | os.O_RDWR, 0o600)
falloc(fd, 0, 0, 1 << 20)
os.pwrite(fd, b"written in the middle", 300000)
os.close(fd)
fd = os.open(m + "/keepsize", os.O_CREAT | os.O_RDWR, 0o600)
os.write(fd, b"head")
falloc(fd, 1, 4096, 1 << 20)
os.close(fd)
fd = os.open(m + "/punched", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, bytes(range(251)) * 5000)
os.fsync(fd)
for k in range(0, 1200, 2):
    falloc(fd, 3, k * 1024, 1024)
os.close(fd)
a = os.open(m + "/appA", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
b = os.open(m + "/appB", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
for k in range(400):
    os.write(a, b"A%05d" % k * 170)
    os.fsync(a)
    os.write(b, b"B%05d" % k * 170)
    os.fsync(b)
os.close(a)
os.close(b)
os.link(m + "/x", m + "/acl/xlink")
os.symlink("x", m + "/fastlink")
os.symlink("acl/" + "./" * 100 + "file", m + "/slowlink")
os.mknod(m + "/chr", 0o20640, os.makedev(4, 64))
os.mknod(m + "/blk", 0o60600, os.makedev(259, 123456))
os.mkfifo(m + "/fifo")
os.utime(m + "/x", ns=(-1234567890123456789, 4102444800123456789))
os.utime(m + "/sparse", ns=(1, 2**31 * 10**9 + 5))
"#;

/// Dumps every path's xattrs (argv[1] = mount) as JSON {path: {name: hex}}.
const XATTR_DUMP_PY: &str = r#"
import json, os, sys
m = sys.argv[1]
out = {}
for d, dirs, files in os.walk(m):
    for n in dirs + files:
        p = os.path.join(d, n)
        rel = "/" + os.path.relpath(p, m)
        if rel == "/lost+found":
            continue
        names = os.listxattr(p, follow_symlinks=False)
        if names:
            out[rel] = {x: os.getxattr(p, x, follow_symlinks=False).hex() for x in names}
print(json.dumps(out))
"#;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn kernel_written_tree_reads_like_the_kernel_mount() {
    let why = e2fs_tools()
        .and_then(|()| kernel_mount_available())
        .and_then(|()| {
            have("python3")
                .then_some(())
                .ok_or("python3 not found".to_string())
        });
    if let Err(why) = why {
        return skip("kernel_written_tree_reads_like_the_kernel_mount", &why);
    }
    let t0 = std::time::Instant::now();
    let lap = |what: &str| eprintln!("kernel tree: {what} at {:.1} s", t0.elapsed().as_secs_f64());
    let dir = image_dir();
    let img = dir.path().join("kernel.img");
    sparse_file(&img, 256 * MIB).unwrap();
    run_ok(
        mke2fs([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            "1024",
            "-N",
            "70000",
            "-O",
            "large_dir,ea_inode",
        ])
        .arg(&img),
    )
    .unwrap();
    let lo = match LoopDev::attach(&img) {
        Ok(l) => l,
        Err(e) => return skip("kernel_written_tree_reads_like_the_kernel_mount", &e),
    };
    {
        let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
        run_ok(
            tool("python3")
                .arg("-c")
                .arg(KERNEL_TREE_PY)
                .arg(mnt.path()),
        )
        .unwrap();
        mnt.unmount().unwrap();
    }
    lap("tree written");
    e2fsck_clean(&img).unwrap();
    lap("e2fsck");
    let before = image_digest(&img);
    let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let (got, times) = walk_image_times(&fs);
    lap("ext4kit walk");
    // The shapes the kernel made: an htree, a deep extent tree, unwritten
    // extents.
    let big = fs.resolve(b"/big", false).unwrap();
    assert_eq!(fs.htree_levels(&big).unwrap(), Some(3));
    let punched = fs.resolve(b"/punched", false).unwrap();
    let (maps, nodes) = fs.extent_tree(&punched).unwrap();
    assert!(maps.len() >= 300, "{} extents", maps.len());
    let depth = nodes.iter().map(|n| n.depth).max().unwrap();
    assert!(depth >= 2, "extent tree depth {depth}");
    let unw = fs.resolve(b"/unwritten", false).unwrap();
    assert!(fs.extents(&unw).unwrap().iter().any(|m| m.unwritten));

    let mnt = Mount::new(lo.path(), "ext4", Some("ro,noload")).unwrap();
    let out = run_ok(tool("python3").arg("-c").arg(XATTR_DUMP_PY).arg(mnt.path())).unwrap();
    let dump: BTreeMap<String, BTreeMap<String, String>> =
        serde_json::from_slice(&out.stdout).unwrap();
    let xattrs: XattrMap = dump
        .iter()
        .map(|(p, m)| {
            (
                p.as_bytes().to_vec(),
                m.iter()
                    .map(|(n, v)| (n.as_bytes().to_vec(), unhex(v)))
                    .collect(),
            )
        })
        .collect();
    assert!(
        xattrs.contains_key(b"/acl/file".as_slice()),
        "no ACL seen by the kernel"
    );
    assert_eq!(
        xattrs[b"/x".as_slice()][b"user.huge".as_slice()].len(),
        243 * 40
    );
    let want = walk_host(mnt.path(), &xattrs);
    lap("kernel walk");
    compare_trees("kernel", &got, &want);
    // Times with nanoseconds and epoch bits, and allocated blocks.
    for (p, (t, blocks)) in &times {
        let m = std::fs::symlink_metadata(mnt.path().join(std::str::from_utf8(&p[1..]).unwrap()))
            .unwrap();
        let what = String::from_utf8_lossy(p);
        assert_eq!(t[0], (m.atime(), m.atime_nsec()), "{what} atime");
        assert_eq!(t[1], (m.mtime(), m.mtime_nsec()), "{what} mtime");
        assert_eq!(t[2], (m.ctime(), m.ctime_nsec()), "{what} ctime");
        assert_eq!(*blocks, m.blocks(), "{what} blocks");
    }
    lap("times compared");
    mnt.unmount().unwrap();
    drop(vol);
    assert_eq!(image_digest(&img), before, "the image changed");
    e2fsck_clean(&img).unwrap();
}

/// OR `bits` into the superblock word at `off` (0x60 incompat, 0x64
/// ro_compat) of `img` and store the superblock checksum again.
fn patch_sb_word(img: &Path, off: usize, bits: u32) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut raw = vec![0u8; 1024];
    file.read_exact_at(&mut raw, 1024).unwrap();
    let v = u32::from_le_bytes(raw[off..off + 4].try_into().unwrap()) | bits;
    raw[off..off + 4].copy_from_slice(&v.to_le_bytes());
    let c = ext4kit_format::checksum::crc32c_raw(!0, &raw[..0x3FC]);
    raw[0x3FC..].copy_from_slice(&c.to_le_bytes());
    file.write_all_at(&raw, 1024).unwrap();
}

/// An incompat feature the read side does not handle is refused with one
/// line naming it; an unknown ro_compat feature still reads.
#[test]
fn unknown_features_are_named() {
    if let Err(why) = e2fs_tools() {
        return skip("unknown_features_are_named", &why);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    small_source(&src);
    let img = dir.path().join("feat.img");
    run_ok(
        mke2fs(["-q", "-F", "-t", "ext4", "-d"])
            .arg(&src)
            .arg(&img)
            .arg("4M"),
    )
    .unwrap();
    e2fsck_clean(&img).unwrap();
    for (bit, name) in [(0x8_0000u32, "FEATURE_I19"), (0x1000, "dirdata")] {
        let copy = dir.path().join("incompat.img");
        std::fs::copy(&img, &copy).unwrap();
        patch_sb_word(&copy, 0x60, bit);
        let before = image_digest(&copy);
        let out = run(ext4kit().arg("ls").arg(&copy)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("incompatible feature {name}")),
            "{err}"
        );
        assert_eq!(image_digest(&copy), before);
    }
    // casefold is read, but only with the one encoding there is (this
    // image has s_encoding 0).
    let copy = dir.path().join("casefold.img");
    std::fs::copy(&img, &copy).unwrap();
    patch_sb_word(&copy, 0x60, 0x2_0000);
    let out = run(ext4kit().arg("ls").arg(&copy)).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("casefold encoding 0"), "{err}");
    let copy = dir.path().join("rocompat.img");
    std::fs::copy(&img, &copy).unwrap();
    patch_sb_word(&copy, 0x64, 0x10_0000);
    let out = run_ok(ext4kit().arg("cat").arg(format!("{}:/one", copy.display()))).unwrap();
    assert_eq!(out.stdout, std::fs::read(src.join("one")).unwrap());
    let dev = FileDevice::open(&copy, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    assert_eq!(vol.info.unknown_ro_compat, vec!["FEATURE_R20".to_string()]);
}

/// On a kernel mount (argv[1]): files and directories, some removed again,
/// fsync'd, then EXT4_IOC_SHUTDOWN without log flush: the committed
/// transactions stay in the log, the home blocks are partly stale.
const KERNEL_DIRTY_PY: &str = r#"
import fcntl, os, struct, sys
m = sys.argv[1]
os.makedirs(m + "/d/e")
for i in range(300):
    with open("%s/d/file%03d" % (m, i), "wb") as f:
        f.write(b"content %d\n" % i * (i + 1))
        f.flush()
        os.fsync(f.fileno())
for i in range(0, 300, 3):
    os.unlink("%s/d/file%03d" % (m, i))
os.symlink("d/file001", m + "/link")
for p in [m + "/d", m + "/d/e", m]:
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
fd = os.open(m, os.O_RDONLY)
fcntl.ioctl(fd, 0x8004587D, struct.pack("I", 2))
"#;

/// A dirty journal written by the kernel (shutdown without log flush):
/// ls/cat see the replayed tree, equal to the tree after e2fsck's replay,
/// and the image is not written.
#[test]
fn kernel_dirty_journal_is_replayed_in_memory_only() {
    let why = e2fs_tools()
        .and_then(|()| kernel_mount_available())
        .and_then(|()| {
            have("python3")
                .then_some(())
                .ok_or("python3 not found".to_string())
        });
    if let Err(why) = why {
        return skip("kernel_dirty_journal_is_replayed_in_memory_only", &why);
    }
    let dir = image_dir();
    let img = dir.path().join("kdirty.img");
    sparse_file(&img, 64 * MIB).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext4", "-b", "1024"]).arg(&img)).unwrap();
    {
        let lo = match LoopDev::attach(&img) {
            Ok(l) => l,
            Err(e) => return skip("kernel_dirty_journal_is_replayed_in_memory_only", &e),
        };
        let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
        run_ok(
            tool("python3")
                .arg("-c")
                .arg(KERNEL_DIRTY_PY)
                .arg(mnt.path()),
        )
        .unwrap();
        mnt.unmount().unwrap();
    }
    assert!(dumpe2fs_h(&img).contains("needs_recovery"));
    let before = image_digest(&img);
    let out = run_ok(ext4kit().arg("ls").arg(format!("{}:/d", img.display()))).unwrap();
    let names = stdout_of(&out);
    assert_eq!(
        names.lines().filter(|l| l.starts_with("file")).count(),
        200,
        "{names}"
    );
    let out = run_ok(ext4kit().arg("cat").arg(format!("{}:/link", img.display()))).unwrap();
    assert_eq!(out.stdout, b"content 1\n".repeat(2));
    let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    assert!(vol.info.replayed_transactions >= 1);
    let ours = walk_image(&vol.fs());
    let copy = dir.path().join("kdirty-replayed.img");
    std::fs::copy(&img, &copy).unwrap();
    let out = run(tool("e2fsck").args(["-E", "journal_only", "-y"]).arg(&copy)).unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        last_line(&out)
    );
    // After a crash replay the summary counts are stale (the kernel
    // fixes them at mount): exit 0 is what counts here.
    let out = run(tool("e2fsck").arg("-fn").arg(&copy)).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stdout_of(&out));
    let dev2 = FileDevice::open(&copy, OpenOptions::read_only()).unwrap();
    let vol2 = Volume::open(&dev2).unwrap();
    compare_trees("kernel replay", &ours, &walk_image(&vol2.fs()));
    drop(vol);
    assert_eq!(image_digest(&img), before, "the image changed");
}
