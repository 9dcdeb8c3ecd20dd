//! encrypt and verity without keys (issue 20): images whose encrypted
//! files, directories and symlinks the kernel made (`test_dummy_encryption`
//! on a loop device), changed by the engine without any key (the image
//! tools, `ext4kit mount`, the operations layer, a power cut at every
//! write), then `e2fsck -fn` clean and every remaining encrypted file read
//! back intact by the kernel with the key. The kernel mounted without the
//! key is the oracle for the no-key names (listings and symlink targets).
//! Verity files are crafted (this kernel has no CONFIG_FS_VERITY): a file
//! with blocks past i_size and `EXT4_VERITY_FL`, e2fsck the oracle.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::fuse::FuseMount;
use common::*;
use ext4kit_device::{CutMode, Device, MemDevice};
use ext4kit_format::inode::{ROOT_INO, S_IFREG};
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Filesystem, NewInode, RenameFlags, SetAttr};
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

const ENOKEY: i32 = 126;
const EPERM: i32 = 1;

/// A kernel-made image and what the kernel showed of it.
struct Kimg {
    img: PathBuf,
    /// Plaintext path (under `enc/`) -> contents, for every regular file.
    files: BTreeMap<String, Vec<u8>>,
    /// Plaintext path -> target, for every symlink.
    links: BTreeMap<String, String>,
    /// Unencrypted files (under `plain/`) -> contents.
    plain: BTreeMap<String, Vec<u8>>,
    /// Plaintext path -> no-key path (each component as the kernel lists
    /// it without the key).
    nokey: BTreeMap<String, String>,
    /// No-key directory path -> the kernel's no-key listing.
    listing: BTreeMap<String, BTreeSet<String>>,
    /// No-key symlink path -> the kernel's readlink without the key.
    nokey_links: BTreeMap<String, String>,
}

fn why_not() -> Option<String> {
    if let Err(e) = kernel_mount_available() {
        return Some(e);
    }
    if let Err(e) = e2fs_tools() {
        return Some(e);
    }
    if !Path::new("/sys/fs/ext4/features/encryption").exists() {
        return Some("the kernel's ext4 has no encryption".into());
    }
    None
}

fn walk_ino(root: &Path, rel: &str, out: &mut BTreeMap<u64, String>) {
    for e in fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        let p = format!("{rel}/{name}");
        let m = fs::symlink_metadata(root.join(&p)).unwrap();
        out.insert(m.ino(), p.clone());
        if m.is_dir() {
            walk_ino(root, &p, out);
        }
    }
}

/// Make `name` (size `size`) with `files` encrypted files in `enc/` (an
/// htree directory for 100 and more), a 200-byte name, symlinks (fast and
/// slow), `enc/sub/` (with `enc/sub/deeper/`) and `enc/empty/`; then, without
/// the key, `plain/` (unencrypted) and the kernel's no-key view.
fn kernel_image(dir: &Path, name: &str, size: &str, files: usize) -> Kimg {
    kernel_image_with(dir, name, size, files, &["-b", "4096"])
}

/// [`kernel_image`] with these mke2fs arguments.
fn kernel_image_with(dir: &Path, name: &str, size: &str, files: usize, args: &[&str]) -> Kimg {
    let mut all = vec!["-O", "encrypt", "-N", "2048"];
    all.extend_from_slice(args);
    let img = mkimg(dir, name, size, &all);
    let mut k = Kimg {
        img: img.clone(),
        files: BTreeMap::new(),
        links: BTreeMap::new(),
        plain: BTreeMap::new(),
        nokey: BTreeMap::new(),
        listing: BTreeMap::new(),
        nokey_links: BTreeMap::new(),
    };
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("test_dummy_encryption")).unwrap();
    let root = m.path().to_path_buf();
    fs::create_dir(root.join("enc")).unwrap();
    for i in 0..files {
        let p = format!("enc/file-{i:03}-{}", "n".repeat(i % 40));
        let data = pattern((i * 997) % 20000, i as u64 + 1);
        k.files.insert(p, data);
    }
    k.files
        .insert(format!("enc/{}", "L".repeat(200)), pattern(5000, 777));
    fs::create_dir_all(root.join("enc/sub/deeper")).unwrap();
    fs::create_dir(root.join("enc/empty")).unwrap();
    for i in 0..5 {
        k.files.insert(
            format!("enc/sub/s{i}"),
            pattern(100 + i * 3000, 50 + i as u64),
        );
    }
    k.files.insert("enc/sub/deeper/d".into(), pattern(9000, 99));
    for (p, data) in &k.files {
        fs::write(root.join(p), data).unwrap();
    }
    k.links.insert("enc/lnk-short".into(), "file-000-".into());
    k.links.insert("enc/lnk-long".into(), "t".repeat(300));
    k.links.insert("enc/sub/up".into(), "../file-001-n".into());
    for (p, t) in &k.links {
        std::os::unix::fs::symlink(t, root.join(p)).unwrap();
    }
    let mut plain_inos = BTreeMap::new();
    walk_ino(&root, "enc", &mut plain_inos);
    m.unmount().unwrap();
    // Without the key: the no-key names, and unencrypted files.
    let m = Mount::new(lo.path(), "ext4", None).unwrap();
    let root = m.path().to_path_buf();
    let mut nokey_inos = BTreeMap::new();
    walk_ino(&root, "enc", &mut nokey_inos);
    for (ino, p) in &plain_inos {
        k.nokey.insert(p.clone(), nokey_inos[ino].clone());
    }
    for p in nokey_inos.values() {
        let full = root.join(p);
        let meta = fs::symlink_metadata(&full).unwrap();
        if meta.is_dir() {
            let names = fs::read_dir(&full)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            k.listing.insert(p.clone(), names);
        } else if meta.file_type().is_symlink() {
            let t = fs::read_link(&full).unwrap();
            k.nokey_links
                .insert(p.clone(), t.into_os_string().into_string().unwrap());
        }
    }
    k.listing.insert(
        "enc".into(),
        fs::read_dir(root.join("enc"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
    );
    fs::create_dir(root.join("plain")).unwrap();
    for i in 0..3 {
        let p = format!("plain/p{i}");
        let data = pattern(3000 * i + 10, 300 + i as u64);
        fs::write(root.join(&p), &data).unwrap();
        k.plain.insert(p, data);
    }
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
    k
}

/// What the kernel must find with the key after the engine's changes.
#[derive(Default)]
struct Expect {
    files: BTreeMap<String, Vec<u8>>,
    links: BTreeMap<String, String>,
    gone: Vec<String>,
    modes: BTreeMap<String, u32>,
    plain: BTreeMap<String, Vec<u8>>,
}

impl Expect {
    fn of(k: &Kimg) -> Expect {
        Expect {
            files: k.files.clone(),
            links: k.links.clone(),
            plain: k.plain.clone(),
            ..Expect::default()
        }
    }

    /// `p` (a file, a symlink or a whole directory) is removed.
    fn remove(&mut self, p: &str) {
        let under = format!("{p}/");
        self.files.retain(|k, _| k != p && !k.starts_with(&under));
        self.links.retain(|k, _| k != p && !k.starts_with(&under));
        self.modes.retain(|k, _| k != p && !k.starts_with(&under));
        self.gone.push(p.to_string());
    }
}

/// Mount `img` with the key (`test_dummy_encryption`) and check `want`.
fn kernel_verify(img: &Path, want: &Expect) {
    let lo = LoopDev::attach(img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("test_dummy_encryption")).unwrap();
    let root = m.path();
    for (p, data) in want.files.iter().chain(&want.plain) {
        let got = fs::read(root.join(p)).unwrap_or_else(|e| panic!("kernel read {p}: {e}"));
        assert!(got == *data, "kernel: {p} differs ({} bytes)", got.len());
    }
    for (p, t) in &want.links {
        let got = fs::read_link(root.join(p)).unwrap();
        assert_eq!(got, PathBuf::from(t), "kernel readlink {p}");
    }
    for p in &want.gone {
        assert!(
            fs::symlink_metadata(root.join(p)).is_err(),
            "kernel: {p} still there"
        );
    }
    for (p, mode) in &want.modes {
        let m = fs::symlink_metadata(root.join(p)).unwrap();
        assert_eq!(m.mode() & 0o7777, *mode, "kernel: mode of {p}");
    }
    m.unmount().unwrap();
    drop(lo);
}

fn spec(img: &Path, p: &str) -> String {
    format!("{}:/{p}", img.display())
}

/// `ext4kit ARGS` must fail with one line containing `want`, the image
/// unchanged.
fn refused(img: &Path, args: &[&str], want: &str) {
    let before = file_hash(img).unwrap();
    let out = run(ext4kit().args(args)).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    assert_eq!(
        file_hash(img).unwrap(),
        before,
        "{args:?} changed the image"
    );
}

fn ino_at(fs: &Filesystem, path: &str) -> u32 {
    let mut cur = ROOT_INO;
    for c in path.split('/') {
        cur = fs.lookup(cur, c.as_bytes()).unwrap().expect(path).ino;
    }
    cur
}

fn parent_and_name(p: &str) -> (&str, &str) {
    p.rsplit_once('/').unwrap()
}

/// The image tools and the operations layer without keys: listings and
/// symlink targets as the kernel's no-key names, contents and new names
/// refused one line each, unlink/rmdir by no-key name, chmod, xattrs and
/// unencrypted files as usual; e2fsck clean; the kernel reads the rest.
#[test]
fn tools_without_keys() {
    let what = "encrypt tools_without_keys";
    if let Some(why) = why_not() {
        return skip(what, &why);
    }
    let dir = image_dir();
    let k = kernel_image(dir.path(), "tools.img", "64M", 120);
    let img = &k.img;
    {
        let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
        for (d, names) in &k.listing {
            let ino = ino_at(&fs, d);
            let i = fs.inode(ino).unwrap();
            let got: BTreeSet<String> = fs
                .read(|f| f.read_dir_user(&i))
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap())
                .filter(|n| n != "." && n != "..")
                .collect();
            assert_eq!(&got, names, "listing of {d}");
        }
        for (p, t) in &k.nokey_links {
            let i = fs.inode(ino_at(&fs, p)).unwrap();
            let got = fs.read(|f| f.read_link(&i)).unwrap();
            assert_eq!(String::from_utf8(got).unwrap(), *t, "readlink {p}");
        }
        let f0 = ino_at(&fs, &k.nokey["enc/file-001-n"]);
        let mut buf = [0u8; 16];
        let e = fs.read_at(f0, 0, &mut buf).unwrap_err();
        assert_eq!(e.errno(), ENOKEY, "{e}");
        assert_eq!(fs.write_at(f0, 0, b"x").unwrap_err().errno(), ENOKEY);
        assert_eq!(fs.truncate(f0, 0).unwrap_err().errno(), ENOKEY);
        let enc = ino_at(&fs, "enc");
        let e = fs
            .create(enc, b"new", &NewInode::new(S_IFREG | 0o644, 0, 0))
            .unwrap_err();
        assert_eq!(e.errno(), ENOKEY);
        // A plaintext name is no name without the key.
        assert!(fs.lookup(enc, b"file-001-n").unwrap().is_none());
        // xattrs: the context (index 9, name "c") is kept as it is (the
        // mount never lists it); others are set as usual.
        let names: Vec<_> = fs.xattrs(f0).unwrap().into_iter().map(|x| x.name).collect();
        assert_eq!(names, [b"cc".to_vec()]);
        fs.set_xattr(f0, b"user.note", Some(b"kept"), SetMode::Any)
            .unwrap();
        fs.close().unwrap();
    }
    e2fsck_clean(img).unwrap();
    let nk = |p: &str| spec(img, &k.nokey[p]);
    let f1 = nk("enc/file-001-n");
    refused(img, &["cat", &f1], "Required key not available");
    refused(
        img,
        &["truncate", "-s", "0", &f1],
        "Required key not available",
    );
    refused(
        img,
        &["mkdir", &spec(img, &format!("{}/new", k.nokey["enc/sub"]))],
        "Required key not available",
    );
    refused(
        img,
        &["ln", "-s", "t", &spec(img, "enc/s")],
        "Required key not available",
    );
    refused(
        img,
        &["mv", &f1, &spec(img, "enc/zz")],
        "Required key not available",
    );
    refused(
        img,
        &["mv", &f1, &spec(img, "plain/zz")],
        "Required key not available",
    );
    refused(
        img,
        &["mv", &spec(img, "plain/p0"), &spec(img, "enc/zz")],
        "Required key not available",
    );
    let host = dir.path().join("host.txt");
    fs::write(&host, b"host").unwrap();
    refused(
        img,
        &["cp", host.to_str().unwrap(), &spec(img, "enc/new")],
        "Required key not available",
    );
    refused(img, &["cat", &spec(img, "enc/file-001-n")], "No such file");
    // Allowed: rm by no-key name (every other file, the long name, a
    // whole tree), chmod, new unencrypted files.
    let mut want = Expect::of(&k);
    let mut rm: Vec<String> = Vec::new();
    for (i, p) in k.files.keys().filter(|p| !p.contains("/sub/")).enumerate() {
        if i % 2 == 0 && p != "enc/file-001-n" {
            rm.push(p.clone());
        }
    }
    let long = format!("enc/{}", "L".repeat(200));
    if !rm.contains(&long) {
        rm.push(long);
    }
    let mut args = vec!["rm".to_string()];
    for p in &rm {
        args.push(nk(p));
        want.remove(p);
    }
    run_ok(ext4kit().args(&args)).unwrap();
    run_ok(ext4kit().args(["rm", "-r", &nk("enc/sub")])).unwrap();
    want.remove("enc/sub");
    run_ok(ext4kit().args(["rm", "-r", &nk("enc/empty")])).unwrap();
    want.remove("enc/empty");
    run_ok(ext4kit().args(["rm", &nk("enc/lnk-long")])).unwrap();
    want.remove("enc/lnk-long");
    run_ok(ext4kit().args(["chmod", "600", &f1])).unwrap();
    want.modes.insert("enc/file-001-n".into(), 0o600);
    run_ok(ext4kit().args(["mkdir", &spec(img, "plain/newdir")])).unwrap();
    run_ok(ext4kit().args(["cp", host.to_str().unwrap(), &spec(img, "plain/newdir/h")])).unwrap();
    want.plain.insert("plain/newdir/h".into(), b"host".to_vec());
    run_ok(ext4kit().args(["rm", &spec(img, "plain/p1")])).unwrap();
    want.plain.remove("plain/p1");
    want.gone.push("plain/p1".into());
    let out = run_ok(ext4kit().args(["ls", &spec(img, "enc")])).unwrap();
    let listed: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let left: BTreeSet<String> = k.listing["enc"]
        .iter()
        .filter(|n| {
            !want
                .gone
                .iter()
                .any(|g| k.nokey.get(g).is_some_and(|x| x == &format!("enc/{n}")))
        })
        .cloned()
        .collect();
    assert_eq!(listed, left);
    e2fsck_clean(img).unwrap();
    kernel_verify(img, &want);
    // The user xattr set without the key is there for the kernel too.
    if have("getfattr") {
        let lo = LoopDev::attach(img).unwrap();
        let m = Mount::new(lo.path(), "ext4", Some("test_dummy_encryption")).unwrap();
        let out = run_ok(
            tool("getfattr")
                .args(["--only-values", "-n", "user.note"])
                .arg(m.path().join("enc/file-001-n")),
        )
        .unwrap();
        assert_eq!(out.stdout, b"kept");
        m.unmount().unwrap();
    }
}

/// Without dir_index (1 KiB blocks, a linear directory of many blocks)
/// the kernel's no-key names carry hash words 0: the listings match, and
/// unlink by those names works; the kernel reads the rest.
#[test]
fn linear_directories_without_dir_index() {
    let what = "encrypt linear_directories_without_dir_index";
    if let Some(why) = why_not() {
        return skip(what, &why);
    }
    let dir = image_dir();
    let k = kernel_image_with(
        dir.path(),
        "linear.img",
        "32M",
        60,
        &["-b", "1024", "-O", "^dir_index"],
    );
    let mut want = Expect::of(&k);
    {
        let fs = Filesystem::open(open_file(&k.img), RwOptions::default()).unwrap();
        for (d, names) in &k.listing {
            let i = fs.inode(ino_at(&fs, d)).unwrap();
            assert!(!i.is_htree(), "{d} has an index");
            let got: BTreeSet<String> = fs
                .read(|f| f.read_dir_user(&i))
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap())
                .filter(|n| n != "." && n != "..")
                .collect();
            assert_eq!(&got, names, "listing of {d}");
        }
        for p in ["enc/file-007-nnnnnnn", "enc/sub/s2"] {
            let (d, name) = parent_and_name(&k.nokey[p]);
            fs.unlink(ino_at(&fs, d), name.as_bytes()).unwrap();
            want.remove(p);
        }
        fs.close().unwrap();
    }
    e2fsck_clean(&k.img).unwrap();
    kernel_verify(&k.img, &want);
}

/// The same through `ext4kit mount`: readdir and readlink as the
/// kernel's no-key names, open of an encrypted file and new names ENOKEY,
/// unlink and rmdir by no-key name, chmod; the kernel reads the rest.
#[test]
fn mount_without_keys() {
    let what = "encrypt mount_without_keys";
    if let Some(why) = why_not() {
        return skip(what, &why);
    }
    if let Err(why) = fuse_available() {
        return skip(what, &why);
    }
    let dir = image_dir();
    let k = kernel_image(dir.path(), "mount.img", "64M", 60);
    let mut want = Expect::of(&k);
    let m = FuseMount::new(&k.img, &[]).unwrap();
    let root = m.path().to_path_buf();
    for (d, names) in &k.listing {
        let got: BTreeSet<String> = fs::read_dir(root.join(d))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(&got, names, "mount: listing of {d}");
    }
    for (p, t) in &k.nokey_links {
        assert_eq!(fs::read_link(root.join(p)).unwrap(), PathBuf::from(t));
    }
    for (p, data) in &k.files {
        let meta = fs::metadata(root.join(&k.nokey[p])).unwrap();
        assert_eq!(meta.len(), data.len() as u64, "size of {p}");
    }
    let f1 = root.join(&k.nokey["enc/file-001-n"]);
    let os = |r: std::io::Result<()>| r.unwrap_err().raw_os_error();
    assert_eq!(os(fs::read(&f1).map(|_| ())), Some(ENOKEY));
    assert_eq!(
        os(fs::OpenOptions::new().write(true).open(&f1).map(|_| ())),
        Some(ENOKEY)
    );
    assert_eq!(os(fs::write(root.join("enc/new"), b"x")), Some(ENOKEY));
    assert_eq!(os(fs::create_dir(root.join("enc/newdir"))), Some(ENOKEY));
    assert_eq!(
        os(std::os::unix::fs::symlink("t", root.join("enc/s"))),
        Some(ENOKEY)
    );
    assert_eq!(os(fs::rename(&f1, root.join("enc/zz"))), Some(ENOKEY));
    assert_eq!(
        os(fs::hard_link(root.join("plain/p0"), root.join("enc/zz"))),
        Some(ENOKEY)
    );
    assert_eq!(
        os(fs::metadata(root.join("enc/file-001-n")).map(|_| ())),
        Some(2)
    );
    let mut n = 0;
    for p in k.files.keys().filter(|p| !p.contains("/sub/")) {
        n += 1;
        if n % 3 == 0 && p != "enc/file-001-n" {
            fs::remove_file(root.join(&k.nokey[p])).unwrap();
            want.remove(p);
        }
    }
    fs::remove_dir_all(root.join(&k.nokey["enc/sub"])).unwrap();
    want.remove("enc/sub");
    fs::remove_dir(root.join(&k.nokey["enc/empty"])).unwrap();
    want.remove("enc/empty");
    // xattrs of an encrypted directory (it opens without the key): the
    // context is never listed; a user xattr is set and listed.
    if have("getfattr") && have("setfattr") {
        let d = root.join("enc");
        run_ok(tool("setfattr").args(["-n", "user.k", "-v", "v1"]).arg(&d)).unwrap();
        let out = run_ok(tool("getfattr").args(["-d", "-m", "-"]).arg(&d)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let names: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .collect();
        assert_eq!(names, ["user.k=\"v1\""], "{text}");
    }
    fs::set_permissions(&f1, fs::Permissions::from_mode(0o640)).unwrap();
    want.modes.insert("enc/file-001-n".into(), 0o640);
    fs::write(root.join("plain/p0"), b"rewritten").unwrap();
    want.plain.insert("plain/p0".into(), b"rewritten".to_vec());
    m.unmount().unwrap();
    e2fsck_clean(&k.img).unwrap();
    kernel_verify(&k.img, &want);
}

/// A seeded random mix of what is allowed without keys (unlink by no-key
/// name, chmod, user xattrs, unencrypted files written and removed) and
/// of what is refused (every refusal ENOKEY, nothing changed); e2fsck
/// clean and the kernel reads every remaining file.
#[test]
fn random_mix_without_keys() {
    let what = "encrypt random_mix_without_keys";
    if let Some(why) = why_not() {
        return skip(what, &why);
    }
    let dir = image_dir();
    let k = kernel_image(dir.path(), "mix.img", "64M", 100);
    let mut want = Expect::of(&k);
    let fs = Filesystem::open(open_file(&k.img), RwOptions::default()).unwrap();
    let enc = ino_at(&fs, "enc");
    let plain = ino_at(&fs, "plain");
    let mut live: Vec<String> = k
        .files
        .keys()
        .filter(|p| !p.contains("/sub/"))
        .cloned()
        .collect();
    let mut rng = Rng(20);
    let mut plain_n = 0;
    for step in 0..300 {
        let pick = |rng: &mut Rng, v: &[String]| v[rng.below(v.len() as u64) as usize].clone();
        match rng.below(7) {
            0 if live.len() > 10 => {
                let p = pick(&mut rng, &live);
                let (d, name) = parent_and_name(&k.nokey[&p]);
                fs.unlink(ino_at(&fs, d), name.as_bytes()).unwrap();
                live.retain(|x| x != &p);
                want.remove(&p);
            }
            1 => {
                let p = pick(&mut rng, &live);
                let mode = 0o600 + (rng.below(0o100) as u16);
                let a = SetAttr {
                    mode: Some(mode),
                    ..SetAttr::default()
                };
                fs.setattr(ino_at(&fs, &k.nokey[&p]), &a).unwrap();
                want.modes.insert(p, u32::from(mode));
            }
            2 => {
                let p = pick(&mut rng, &live);
                let v = pattern(rng.below(200) as usize + 1, step);
                fs.set_xattr(ino_at(&fs, &k.nokey[&p]), b"user.r", Some(&v), SetMode::Any)
                    .unwrap();
            }
            3 => {
                let name = format!("q{plain_n}");
                plain_n += 1;
                let (i, _) = fs
                    .create(
                        plain,
                        name.as_bytes(),
                        &NewInode::new(S_IFREG | 0o644, 0, 0),
                    )
                    .unwrap();
                let data = pattern(rng.below(9000) as usize, step + 1000);
                fs.write_at(i.ino, 0, &data).unwrap();
                want.plain.insert(format!("plain/{name}"), data);
            }
            4 if !want.plain.is_empty() => {
                let keys: Vec<String> = want.plain.keys().cloned().collect();
                let p = pick(&mut rng, &keys);
                fs.unlink(plain, parent_and_name(&p).1.as_bytes()).unwrap();
                want.plain.remove(&p);
                want.gone.push(p);
            }
            _ => {
                let p = pick(&mut rng, &live);
                let ino = ino_at(&fs, &k.nokey[&p]);
                let name = parent_and_name(&k.nokey[&p]).1.as_bytes().to_vec();
                let e: FsError = match rng.below(6) {
                    0 => fs.write_at(ino, rng.below(5000), b"zz").unwrap_err(),
                    1 => fs.truncate(ino, rng.below(3)).unwrap_err(),
                    2 => fs.read_at(ino, 0, &mut [0u8; 8]).unwrap_err(),
                    3 => fs.link(ino, enc, b"another").unwrap_err(),
                    4 => fs
                        .rename(enc, &name, plain, b"out", RenameFlags::default())
                        .unwrap_err(),
                    _ => fs
                        .create(enc, b"x", &NewInode::new(S_IFREG | 0o644, 0, 0))
                        .unwrap_err(),
                };
                assert_eq!(e.errno(), ENOKEY, "step {step}: {e}");
            }
        }
    }
    fs.close().unwrap();
    e2fsck_clean(&k.img).unwrap();
    kernel_verify(&k.img, &want);
}

/// A power cut at every write of an unlink by no-key name in an encrypted
/// (htree) directory: each state opens, holds the entry with its file or
/// neither, and is e2fsck clean; the kernel reads the survivors.
#[test]
fn power_cut_unlink_in_encrypted_dir() {
    let what = "encrypt power_cut_unlink_in_encrypted_dir";
    if let Some(why) = why_not() {
        return skip(what, &why);
    }
    let dir = image_dir();
    let k = kernel_image(dir.path(), "cut.img", "16M", 110);
    let base = MemDevice::from_bytes(fs::read(&k.img).unwrap());
    let long = format!("enc/{}", "L".repeat(200));
    let victims = [
        long.clone(),
        "enc/file-104-".to_string() + &"n".repeat(104 % 40),
    ];
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        for v in &victims {
            let (d, name) = parent_and_name(&k.nokey[v]);
            fs.unlink(ino_at(&fs, d), name.as_bytes()).map_err(e)?;
        }
        fs.close().map_err(e)
    };
    let (_, r, ops) = run_cut(&base, None, CutMode::DropAll, run);
    r.unwrap();
    assert!(ops > 2, "{ops} writes");
    eprintln!("{what}: a power cut at each of {ops} writes");
    let out = dir.path().join("state.img");
    let modes = [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 19,
            torn: false,
        },
    ];
    for (cut, mode) in modes
        .into_iter()
        .flat_map(|m| (1..ops).map(move |c| (c, m)))
    {
        let (mem, _, _) = run_cut(&base, Some(cut), mode, run);
        {
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            for v in &victims {
                let (d, name) = parent_and_name(&k.nokey[v]);
                if let Some(i) = fs.lookup(ino_at(&fs, d), name.as_bytes()).unwrap() {
                    assert_eq!(i.size, k.files[v].len() as u64, "cut {cut} {mode:?}: {v}");
                    assert_eq!(i.links, 1, "cut {cut} {mode:?}: {v}");
                }
            }
            fs.close().unwrap();
        }
        fs::write(&out, mem.to_bytes()).unwrap();
        e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
    }
    let (mem, _, _) = run_cut(&base, None, CutMode::DropAll, run);
    fs::write(&out, mem.to_bytes()).unwrap();
    let mut want = Expect::of(&k);
    for v in &victims {
        want.remove(v);
    }
    kernel_verify(&out, &want);
}

/// debugfs `set_inode_field` on `img`.
fn sif(img: &Path, path: &str, field: &str, value: &str) {
    run_ok(
        tool("debugfs")
            .arg("-w")
            .arg("-R")
            .arg(format!("sif {path} {field} {value}"))
            .arg(img),
    )
    .unwrap();
}

fn free_blocks(img: &Path) -> u64 {
    let s = dumpe2fs_h(img);
    s.lines()
        .find_map(|l| l.strip_prefix("Free blocks:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Crafted fs-verity files (12 KiB written, i_size cut to 5000, the rest
/// standing for the Merkle tree; `EXT4_VERITY_FL`): e2fsck accepts them;
/// reads end at i_size; writes, truncates and fallocate are EPERM one line
/// each, through the tools and the mount; chmod is allowed; unlink frees
/// the blocks past i_size too.
#[test]
fn verity_files() {
    let what = "encrypt verity_files";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    if !have("debugfs") {
        return skip(what, "debugfs not found");
    }
    let dir = image_dir();
    let img = mkimg(
        dir.path(),
        "verity.img",
        "32M",
        &["-O", "verity", "-b", "4096"],
    );
    let host = dir.path().join("v.bin");
    let data = pattern(12288, 5);
    fs::write(&host, &data).unwrap();
    for n in ["v1", "v2"] {
        run_ok(ext4kit().args(["cp", host.to_str().unwrap(), &spec(&img, n)])).unwrap();
        sif(&img, n, "size", "5000");
        sif(&img, n, "flags", "0x180000");
    }
    e2fsck_clean(&img).unwrap();
    let out = run_ok(ext4kit().args(["cat", &spec(&img, "v1")])).unwrap();
    assert!(out.stdout == data[..5000], "{} bytes", out.stdout.len());
    let v1 = spec(&img, "v1");
    refused(&img, &["truncate", "-s", "0", &v1], "fs-verity");
    refused(&img, &["truncate", "-s", "9000", &v1], "fs-verity");
    refused(&img, &["fallocate", "-l", "64K", &v1], "fs-verity");
    refused(&img, &["cp", host.to_str().unwrap(), &v1], "fs-verity");
    {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let ino = ino_at(&fs, "v1");
        assert_eq!(fs.write_at(ino, 0, b"x").unwrap_err().errno(), EPERM);
        assert_eq!(fs.truncate(ino, 100).unwrap_err().errno(), EPERM);
        let mut buf = vec![0u8; 16384];
        assert_eq!(fs.read_at(ino, 0, &mut buf).unwrap(), 5000);
        assert_eq!(fs.read_at(ino, 5000, &mut buf).unwrap(), 0);
        fs.close().unwrap();
    }
    run_ok(ext4kit().args(["chmod", "444", &v1])).unwrap();
    e2fsck_clean(&img).unwrap();
    if fuse_available().is_ok() {
        let m = FuseMount::new(&img, &[]).unwrap();
        let p = m.path().join("v2");
        assert!(fs::read(&p).unwrap() == data[..5000]);
        let e = fs::OpenOptions::new().write(true).open(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(EPERM));
        let out = run(tool("truncate").args(["-s", "0"]).arg(&p)).unwrap();
        assert!(!out.status.success(), "truncate of a verity file");
        m.unmount().unwrap();
    }
    let before = free_blocks(&img);
    run_ok(ext4kit().args(["rm", &v1])).unwrap();
    assert_eq!(free_blocks(&img), before + 3, "all three blocks freed");
    e2fsck_clean(&img).unwrap();
}
