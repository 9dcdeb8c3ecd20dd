//! inline_data written by the engine (issue 20): images made by
//! `mke2fs -O inline_data` and populated by the kernel (loop mount) or by
//! `mke2fs -d` (small files and directories inline), changed through the
//! operations layer and through `ext4kit mount` (appends to inline files,
//! an inline directory grown past its capacity, truncates, unlinks, a
//! moved inline directory, xattrs on an inline file), then `e2fsck -fn`
//! clean and the tree read back by the engine and the kernel; the kernel
//! writing inline data into an image the engine changed, and the engine
//! going on; a power cut at every write of the conversions.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use common::fuse::FuseMount;
use common::*;
use ext4kit_device::{CutMode, Device, MemDevice};
use ext4kit_format::inode::{ROOT_INO, S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode, RenameFlags};
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
    Link(Vec<u8>),
}

type Tree = BTreeMap<String, Node>;

const LONG_LINK: &str = "a/target/name/that/is/longer/than/sixty/bytes/so/it/is/no/fast/symlink";

/// The starting tree, written under `root` (a host directory for
/// `mke2fs -d`, or a kernel mount).
fn populate(root: &Path) {
    let w = |p: &str, d: &[u8]| fs::write(root.join(p), d).unwrap();
    w("small.txt", b"hello inline");
    w("mid.txt", &pattern(100, 1));
    w("big.bin", &pattern(5000, 2));
    w("keep.txt", b"untouched");
    w("trunc0.txt", b"to be emptied");
    w("trunc3.txt", b"to be cut");
    w("rm.txt", b"to be removed");
    w("xattr.txt", b"with an attribute");
    for d in ["d1", "d2", "d3"] {
        fs::create_dir(root.join(d)).unwrap();
    }
    w("d1/a.txt", b"a");
    w("d1/b.txt", b"bee");
    w("d3/x", b"x in d3");
    std::os::unix::fs::symlink("small.txt", root.join("fast")).unwrap();
    std::os::unix::fs::symlink(LONG_LINK, root.join("long")).unwrap();
}

/// The tree after [`change`]'s operations.
fn changed_model() -> Tree {
    let mut t = Tree::new();
    let f = |t: &mut Tree, p: &str, d: &[u8]| {
        t.insert(p.to_string(), Node::File(d.to_vec()));
    };
    let mut small = b"hello inline-appended".to_vec();
    small.extend(pattern(5000, 3));
    f(&mut t, "small.txt", &small);
    let mut mid = pattern(100, 1);
    mid.extend(b"0123456789");
    f(&mut t, "mid.txt", &mid);
    f(&mut t, "big.bin", &pattern(5000, 2));
    f(&mut t, "keep.txt", b"untouched");
    f(&mut t, "trunc0.txt", b"");
    f(&mut t, "trunc3.txt", b"to ");
    f(&mut t, "xattr.txt", b"with an attribute");
    t.insert("d1".into(), Node::Dir);
    f(&mut t, "d1/a.txt", b"a");
    f(&mut t, "d1/b.txt", b"bee");
    for i in 0..60 {
        f(&mut t, &format!("d1/f{i:02}"), format!("n{i}").as_bytes());
    }
    t.insert("d1/moved".into(), Node::Dir);
    f(&mut t, "d1/moved/x", b"x in d3");
    t.insert("fast".into(), Node::Link(b"small.txt".to_vec()));
    t.insert("long".into(), Node::Link(LONG_LINK.as_bytes().to_vec()));
    t
}

/// An inline_data image (1 KiB blocks, so 60 names make an htree)
/// holding [`populate`]'s tree: written by the kernel when `kernel`,
/// else by `mke2fs -d`.
fn inline_image(dir: &Path, kernel: bool) -> std::path::PathBuf {
    let args = ["-b", "1024", "-I", "256", "-O", "inline_data"];
    if kernel {
        let img = mkimg(dir, "k.img", "32M", &args);
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        populate(m.path());
        m.unmount().unwrap();
        drop(lo);
        img
    } else {
        let src = dir.join("src");
        fs::create_dir_all(&src).unwrap();
        populate(&src);
        let img = dir.join("d.img");
        run_ok(tool("truncate").args(["-s", "32M"]).arg(&img)).unwrap();
        run_ok(
            mke2fs(["-q", "-F", "-t", "ext4", "-U", UUID, "-E", "nodiscard"])
                .args(args)
                .arg("-d")
                .arg(&src)
                .arg(&img),
        )
        .unwrap();
        img
    }
}

fn ino_of(fs: &Filesystem, path: &str) -> u32 {
    let mut ino = ROOT_INO;
    for c in path.split('/').filter(|c| !c.is_empty()) {
        ino = fs
            .lookup(ino, c.as_bytes())
            .unwrap()
            .unwrap_or_else(|| panic!("{path}: no {c}"))
            .ino;
    }
    ino
}

fn inline(fs: &Filesystem, path: &str) -> bool {
    fs.inode(ino_of(fs, path)).unwrap().has_inline_data()
}

/// The tree as the engine reads it (lost+found left out).
fn engine_tree(fs: &Filesystem) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((d, pre)) = stack.pop() {
        let di = fs.inode(d).unwrap();
        let entries = fs.read(|f| f.read_dir(&di)).unwrap();
        for e in entries {
            if e.name == b"." || e.name == b".." || (d == ROOT_INO && e.name == b"lost+found") {
                continue;
            }
            let path = format!("{pre}{}", String::from_utf8_lossy(&e.name));
            let i = fs.inode(e.ino).unwrap();
            if i.is_dir() {
                out.insert(path.clone(), Node::Dir);
                stack.push((e.ino, format!("{path}/")));
            } else if i.is_symlink() {
                out.insert(path, Node::Link(fs.read(|f| f.read_link(&i)).unwrap()));
            } else {
                let mut v = vec![0u8; i.size as usize];
                assert_eq!(fs.read_at(e.ino, 0, &mut v).unwrap(), v.len());
                out.insert(path, Node::File(v));
            }
        }
    }
    out
}

/// The tree under a host directory (a kernel or ext4kit mount).
fn host_tree(root: &Path) -> Tree {
    let mut out = Tree::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((d, pre)) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = String::from_utf8_lossy(e.file_name().as_bytes()).to_string();
            if pre.is_empty() && name == "lost+found" {
                continue;
            }
            let path = format!("{pre}{name}");
            let t = e.file_type().unwrap();
            if t.is_dir() {
                out.insert(path.clone(), Node::Dir);
                stack.push((e.path(), format!("{path}/")));
            } else if t.is_symlink() {
                let l = fs::read_link(e.path()).unwrap();
                out.insert(path, Node::Link(l.as_os_str().as_bytes().to_vec()));
            } else {
                out.insert(path, Node::File(fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}

fn diff(a: &Tree, b: &Tree) -> String {
    let mut s = String::new();
    for (k, v) in a {
        if b.get(k) != Some(v) {
            s += &format!("{k}: {:?} vs {:?}\n", short(Some(v)), short(b.get(k)));
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            s += &format!("{k}: missing vs present\n");
        }
    }
    s
}

fn short(n: Option<&Node>) -> String {
    match n {
        Some(Node::File(d)) => format!("file of {} bytes", d.len()),
        other => format!("{other:?}"),
    }
}

/// [`changed_model`]'s operations through the operations layer.
fn change(fs: &Filesystem) {
    let file = NewInode::new(S_IFREG | 0o644, 0, 0);
    let small = ino_of(fs, "small.txt");
    let size = fs.inode(small).unwrap().size;
    let mut more = b"-appended".to_vec();
    more.extend(pattern(5000, 3));
    fs.write_at(small, size, &more).unwrap();
    fs.write_at(ino_of(fs, "mid.txt"), 100, b"0123456789")
        .unwrap();
    fs.truncate(ino_of(fs, "trunc0.txt"), 0).unwrap();
    fs.truncate(ino_of(fs, "trunc3.txt"), 3).unwrap();
    fs.unlink(ROOT_INO, b"rm.txt").unwrap();
    let x = ino_of(fs, "xattr.txt");
    fs.set_xattr(x, b"user.color", Some(b"blue"), SetMode::Any)
        .unwrap();
    let d1 = ino_of(fs, "d1");
    for i in 0..60 {
        let (f, _) = fs.create(d1, format!("f{i:02}").as_bytes(), &file).unwrap();
        fs.write_at(f.ino, 0, format!("n{i}").as_bytes()).unwrap();
    }
    fs.rename(ROOT_INO, b"d3", d1, b"moved", RenameFlags::default())
        .unwrap();
    fs.rmdir(ROOT_INO, b"d2").unwrap();
}

fn engine_round(kernel: bool) {
    let dir = image_dir();
    let img = inline_image(dir.path(), kernel);
    e2fsck_clean(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    for p in [
        "small.txt",
        "mid.txt",
        "keep.txt",
        "trunc3.txt",
        "xattr.txt",
        "d1",
        "d2",
        "d3",
    ] {
        assert!(inline(&fs, p), "{p} is inline");
    }
    assert!(!inline(&fs, "big.bin"));
    change(&fs);
    // Converted where changed; the untouched file and the moved
    // directory (its '..' changed in place) stay inline.
    assert!(!inline(&fs, "small.txt") && !inline(&fs, "d1"));
    assert!(inline(&fs, "keep.txt") && inline(&fs, "d1/moved"));
    let want = changed_model();
    let got = engine_tree(&fs);
    assert!(got == want, "engine before close:\n{}", diff(&got, &want));
    let xa = fs.xattrs(ino_of(&fs, "xattr.txt")).unwrap();
    assert!(
        xa.iter()
            .any(|a| a.name == b"user.color" && a.value == b"blue")
    );
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let got = engine_tree(&fs);
    fs.close().unwrap();
    assert!(got == want, "engine after reopen:\n{}", diff(&got, &want));
    if let Err(e) = kernel_mount_available() {
        return skip("engine_round", &format!("kernel read back: {e}"));
    }
    // The kernel reads the same tree, then writes inline data again.
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let got = host_tree(m.path());
        assert!(got == want, "kernel:\n{}", diff(&got, &want));
        let moved_dots = fs::metadata(m.path().join("d1/moved/..")).unwrap();
        let d1 = fs::metadata(m.path().join("d1")).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&moved_dots),
            std::os::unix::fs::MetadataExt::ino(&d1)
        );
        fs::create_dir(m.path().join("kdir")).unwrap();
        fs::write(m.path().join("kdir/k1"), b"kernel inline").unwrap();
        fs::write(m.path().join("keep.txt"), b"rewritten by the kernel").unwrap();
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert!(inline(&fs, "kdir") && inline(&fs, "kdir/k1"));
    let kdir = ino_of(&fs, "kdir");
    fs.write_at(ino_of(&fs, "kdir/k1"), 13, b" + engine")
        .unwrap();
    fs.mkdir(kdir, b"sub", &NewInode::new(S_IFDIR | 0o755, 0, 0))
        .unwrap();
    fs.unlink(ROOT_INO, b"keep.txt").unwrap();
    // An inline symlink (mke2fs -d makes one) or a block one (the kernel).
    fs.unlink(ROOT_INO, b"long").unwrap();
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    assert_eq!(
        fs::read(m.path().join("kdir/k1")).unwrap(),
        b"kernel inline + engine"
    );
    assert!(m.path().join("kdir/sub").is_dir());
    assert!(!m.path().join("keep.txt").exists());
    assert!(fs::symlink_metadata(m.path().join("long")).is_err());
    m.unmount().unwrap();
}

/// Built by `mke2fs -d` (no root needed), changed by the engine.
#[test]
fn mke2fs_d_inline_tree_changed_by_the_engine() {
    if let Err(e) = e2fs_tools() {
        return skip("mke2fs_d_inline_tree_changed_by_the_engine", &e);
    }
    engine_round(false);
}

/// Written by the kernel, changed by the engine, read and written again
/// by the kernel, changed by the engine.
#[test]
fn kernel_inline_tree_changed_by_the_engine_and_back() {
    let what = "kernel_inline_tree_changed_by_the_engine_and_back";
    if let Err(e) = e2fs_tools().and_then(|()| kernel_mount_available()) {
        return skip(what, &e);
    }
    engine_round(true);
}

/// The same changes through `ext4kit mount` (and the image tools' `mv`
/// and `rm`) on a kernel-written image.
#[test]
fn kernel_inline_tree_changed_through_the_mount() {
    let what = "kernel_inline_tree_changed_through_the_mount";
    if let Err(e) = e2fs_tools()
        .and_then(|()| kernel_mount_available())
        .and_then(|()| fuse_available())
    {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = inline_image(dir.path(), true);
    // The image tools first: a move of an inline directory and an rm.
    let at = |p: &str| format!("{}:{p}", img.display());
    run_ok(ext4kit().arg("mv").arg(at("/d3")).arg(at("/d1/moved"))).unwrap();
    run_ok(ext4kit().arg("rm").arg(at("/rm.txt"))).unwrap();
    e2fsck_clean(&img).unwrap();
    let m = FuseMount::new(&img, &[]).unwrap();
    let r = m.path();
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(r.join("small.txt"))
            .unwrap();
        let mut more = b"-appended".to_vec();
        more.extend(pattern(5000, 3));
        f.write_all(&more).unwrap();
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(r.join("mid.txt"))
            .unwrap();
        f.write_all(b"0123456789").unwrap();
    }
    fs::OpenOptions::new()
        .write(true)
        .open(r.join("trunc0.txt"))
        .unwrap()
        .set_len(0)
        .unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(r.join("trunc3.txt"))
        .unwrap()
        .set_len(3)
        .unwrap();
    // The listing of an inline directory while it converts: every name
    // before the change is still listed once after it.
    let before: Vec<_> = fs::read_dir(r.join("d1"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for i in 0..60 {
        fs::write(r.join(format!("d1/f{i:02}")), format!("n{i}")).unwrap();
    }
    let after: Vec<_> = fs::read_dir(r.join("d1"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    for n in &before {
        assert_eq!(after.iter().filter(|a| *a == n).count(), 1, "{n:?}");
    }
    fs::remove_dir(r.join("d2")).unwrap();
    let setfattr = have("setfattr");
    if setfattr {
        run_ok(
            tool("setfattr")
                .args(["-n", "user.color", "-v", "blue"])
                .arg(r.join("xattr.txt")),
        )
        .unwrap();
    }
    let want = changed_model();
    let got = host_tree(r);
    assert!(got == want, "through the mount:\n{}", diff(&got, &want));
    m.unmount().unwrap();
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let km = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let got = host_tree(km.path());
    if setfattr && have("getfattr") {
        let o = run_ok(
            tool("getfattr")
                .args(["-n", "user.color", "--only-values"])
                .arg(km.path().join("xattr.txt")),
        )
        .unwrap();
        assert_eq!(o.stdout, b"blue");
    }
    km.unmount().unwrap();
    assert!(
        got == want,
        "kernel after the mount:\n{}",
        diff(&got, &want)
    );
}

/// A power cut at every write of an open, an append to an inline file,
/// a create in an inline directory (both converted), a sync and a
/// close, all unflushed writes lost or a seeded subset kept: the image
/// opens, holds the old or the new file and the old or the new
/// directory, and e2fsck is clean.
#[test]
fn power_cut_during_conversions() {
    let what = "power_cut_during_conversions";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = inline_image(dir.path(), false);
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let old_small = b"hello inline".to_vec();
    let mut new_small = old_small.clone();
    new_small.extend(pattern(3000, 9));
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        let find = |n: &[u8]| match fs.lookup(ROOT_INO, n) {
            Ok(Some(i)) => Ok(i.ino),
            Ok(None) => Err("missing".to_string()),
            Err(x) => Err(e(x)),
        };
        fs.write_at(find(b"small.txt")?, 12, &pattern(3000, 9))
            .map_err(e)?;
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        fs.create(find(b"d1")?, b"new-name", &spec).map_err(e)?;
        fs.sync().map_err(e)?;
        fs.close().map_err(e)
    };
    let one = |cut: Option<u64>, mode: CutMode| run_cut(&base, cut, mode, run);
    let (_, r, ops) = one(None, CutMode::DropAll);
    r.unwrap();
    let mut seen = [false; 2];
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 20,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (mem, _, _) = one(Some(cut), mode);
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            let small = ino_of(&fs, "small.txt");
            let i = fs.inode(small).unwrap();
            let mut v = vec![0u8; i.size as usize];
            fs.read_at(small, 0, &mut v).unwrap();
            assert!(
                v == old_small || v == new_small,
                "cut {cut} {mode:?}: small.txt of {} bytes",
                v.len()
            );
            seen[usize::from(v == new_small)] = true;
            let d1 = fs.inode(ino_of(&fs, "d1")).unwrap();
            let names: Vec<Vec<u8>> = fs
                .read(|f| f.read_dir(&d1))
                .unwrap()
                .into_iter()
                .map(|e| e.name)
                .collect();
            assert!(names.contains(&b"a.txt".to_vec()) && names.contains(&b"b.txt".to_vec()));
            fs.close().unwrap();
            let out = dir.path().join("cut.img");
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
        }
    }
    assert!(seen[0] && seen[1], "both outcomes seen: {seen:?}");
}
