//! ea_inode read-write: xattr values in EA inodes written, replaced and
//! removed by the engine (refcounts, hashes, quota), checked by e2fsck,
//! read back by the kernel and by getfattr through our mount, and the
//! kernel's values read back by us; a power cut at every write of a
//! set/replace/remove leaves the old or the new value and a clean image.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::fuse::FuseMount;
use common::*;
use ext4kit_device::{CutMode, Device, MemDevice};
use ext4kit_format::inode::{ROOT_INO, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

fn make(fs: &Filesystem, name: &str) -> u32 {
    let spec = NewInode::new(S_IFREG | 0o644, 1000, 1000);
    fs.create(ROOT_INO, name.as_bytes(), &spec).unwrap().0.ino
}

fn get(fs: &Filesystem, ino: u32, name: &str) -> Option<Vec<u8>> {
    fs.xattrs(ino)
        .unwrap()
        .into_iter()
        .find(|x| x.name == name.as_bytes())
        .map(|x| x.value)
}

fn ino_of(fs: &Filesystem, name: &str) -> u32 {
    fs.lookup(ROOT_INO, name.as_bytes()).unwrap().unwrap().ino
}

fn ea_image(dir: &Path, name: &str, extra: &[&str]) -> std::path::PathBuf {
    let mut args = vec!["-O", "ea_inode", "-I", "256"];
    args.extend_from_slice(extra);
    mkimg(dir, name, "32M", &args)
}

/// Large values go to EA inodes and back: set, replace (large by large,
/// large by small, small by large), remove, unlink of a file holding
/// them, then a seeded mix of small and big values on three files, on
/// 1 KiB and 4 KiB blocks and with quota; e2fsck clean, the values read
/// back after a reopen.
#[test]
fn set_replace_remove_and_random_mix() {
    if let Err(r) = e2fs_tools() {
        return skip("set_replace_remove_and_random_mix", &r);
    }
    let dir = image_dir();
    for (n, extra) in [
        ("b1.img", &["-b", "1024"][..]),
        ("b4.img", &["-b", "4096", "-O", "quota"][..]),
    ] {
        let img = ea_image(dir.path(), n, extra);
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let a = make(&fs, "a");
        let b = make(&fs, "b");
        let c = make(&fs, "c");
        let v20 = pattern(20 * 1024, 1);
        let v64 = pattern(65536, 2);
        fs.set_xattr(a, b"user.big", Some(&v20), SetMode::Any)
            .unwrap();
        fs.set_xattr(a, b"user.huge", Some(&v64), SetMode::Any)
            .unwrap();
        fs.set_xattr(a, b"user.small", Some(b"x"), SetMode::Any)
            .unwrap();
        assert!(
            fs.set_xattr(a, b"user.over", Some(&pattern(65537, 3)), SetMode::Any)
                .is_err()
        );
        assert_eq!(get(&fs, a, "user.big").as_deref(), Some(&v20[..]));
        assert_eq!(get(&fs, a, "user.huge").as_deref(), Some(&v64[..]));
        let v30 = pattern(30000, 4);
        fs.set_xattr(a, b"user.big", Some(&v30), SetMode::Replace)
            .unwrap();
        fs.set_xattr(a, b"user.huge", Some(b"now small"), SetMode::Any)
            .unwrap();
        fs.set_xattr(a, b"user.small", Some(&v20), SetMode::Any)
            .unwrap();
        fs.set_xattr(b, b"user.big", Some(&v20), SetMode::Any)
            .unwrap();
        fs.set_xattr(b, b"user.big", None, SetMode::Any).unwrap();
        fs.set_xattr(c, b"user.big", Some(&v20), SetMode::Any)
            .unwrap();
        fs.set_xattr(c, b"trusted.t", Some(&v64), SetMode::Any)
            .unwrap();
        fs.unlink(ROOT_INO, b"c").unwrap();
        // The mix: a model of every attribute, checked at the end.
        let files = [a, b, make(&fs, "d")];
        let mut model: BTreeMap<(u32, String), Vec<u8>> = BTreeMap::new();
        for (ino, k, v) in [
            (a, "user.big", &v30[..]),
            (a, "user.huge", &b"now small"[..]),
            (a, "user.small", &v20[..]),
        ] {
            model.insert((ino, k.to_string()), v.to_vec());
        }
        let mut x: u64 = 0x5eed;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for step in 0..80 {
            let f = files[rnd(3) as usize];
            let name = format!("user.n{}", rnd(6));
            let len = match rnd(4) {
                0 => rnd(80) as usize,
                1 => 300 + rnd(3000) as usize,
                _ => 4000 + rnd(61537) as usize,
            };
            if rnd(5) == 0 {
                let r = fs.set_xattr(f, name.as_bytes(), None, SetMode::Any);
                let had = model.remove(&(f, name.clone())).is_some();
                assert_eq!(r.is_ok(), had, "step {step}: remove {name}: {r:?}");
            } else {
                let v = pattern(len, step);
                match fs.set_xattr(f, name.as_bytes(), Some(&v), SetMode::Any) {
                    Ok(_) => {
                        model.insert((f, name), v);
                    }
                    // The block full of entries: refused, nothing changed.
                    Err(e) if e.errno() == 28 => {}
                    Err(e) => panic!("step {step}: set {name} ({len} bytes): {e}"),
                }
            }
        }
        let check = |fs: &Filesystem| {
            for f in files {
                let got: BTreeMap<(u32, String), Vec<u8>> = fs
                    .xattrs(f)
                    .unwrap()
                    .into_iter()
                    .map(|x| ((f, String::from_utf8(x.name).unwrap()), x.value))
                    .collect();
                let want: BTreeMap<_, _> = model
                    .iter()
                    .filter(|((i, _), _)| *i == f)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                assert_eq!(
                    got.keys().collect::<Vec<_>>(),
                    want.keys().collect::<Vec<_>>()
                );
                assert!(got == want, "{n}: values of inode {f}");
            }
        };
        check(&fs);
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{n}: {e}"));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        check(&fs);
        // Everything removed: the EA inodes go with their last reference.
        for ((f, k), _) in std::mem::take(&mut model) {
            fs.set_xattr(f, k.as_bytes(), None, SetMode::Any).unwrap();
        }
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{n} (all removed): {e}"));
        let out = run_ok(tool("dumpe2fs").arg("-h").arg(&img)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let free = |k: &str| {
            text.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
                .unwrap()
        };
        let fresh = ea_image(dir.path(), "fresh.img", extra);
        let out = run_ok(tool("dumpe2fs").arg("-h").arg(&fresh)).unwrap();
        let t0 = String::from_utf8_lossy(&out.stdout).into_owned();
        let free0 = |k: &str| {
            t0.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
                .unwrap()
        };
        // Three files left (a, b, d): only their inodes are in use.
        let used = |s: String| s.parse::<u64>().unwrap();
        assert_eq!(
            used(free0("Free inodes")) - used(free("Free inodes")),
            3,
            "{n}: EA inodes all freed"
        );
        let _ = fs::remove_file(&fresh);
    }
}

/// The kernel writes large values (setfattr on a loop mount of an
/// ea_inode image) and we read them; we write, replace and remove, and
/// the kernel reads ours and removes them; e2fsck clean between.
#[test]
fn kernel_both_ways() {
    let what = "kernel_both_ways";
    if let Err(r) = e2fs_tools() {
        return skip(what, &r);
    }
    if let Err(r) = kernel_mount_available() {
        return skip(what, &r);
    }
    if !have("setfattr") || !have("getfattr") {
        return skip(what, "no setfattr/getfattr");
    }
    let dir = image_dir();
    let img = ea_image(dir.path(), "k.img", &["-b", "1024"]);
    let hex = |v: &[u8]| {
        let mut s = String::from("0x");
        for b in v {
            s.push_str(&format!("{b:02x}"));
        }
        s
    };
    let kv = pattern(20 * 1024, 11);
    let kv2 = pattern(40000, 12);
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let f = m.path().join("f");
        fs::write(&f, b"data").unwrap();
        for (n, v) in [("user.k", &kv), ("user.k2", &kv2)] {
            run_ok(tool("setfattr").args(["-n", n, "-v", &hex(v)]).arg(&f)).unwrap();
        }
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    let ov = pattern(30000, 13);
    {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let f = ino_of(&fs, "f");
        assert_eq!(get(&fs, f, "user.k").as_deref(), Some(&kv[..]));
        assert_eq!(get(&fs, f, "user.k2").as_deref(), Some(&kv2[..]));
        fs.set_xattr(f, b"user.ours", Some(&ov), SetMode::Create)
            .unwrap();
        fs.set_xattr(f, b"user.k", Some(&kv2), SetMode::Replace)
            .unwrap();
        fs.set_xattr(f, b"user.k2", None, SetMode::Any).unwrap();
        fs.close().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let f = m.path().join("f");
        for (n, v) in [("user.ours", &ov), ("user.k", &kv2)] {
            let out = run_ok(tool("getfattr").args(["-n", n, "--only-values"]).arg(&f)).unwrap();
            assert!(
                out.stdout == *v,
                "{n}: {} bytes from the kernel",
                out.stdout.len()
            );
        }
        let out = run(tool("getfattr").args(["-n", "user.k2"]).arg(&f)).unwrap();
        assert!(!out.status.success(), "user.k2 removed");
        run_ok(tool("setfattr").args(["-x", "user.ours"]).arg(&f)).unwrap();
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
}

/// A power cut at every write of a set of a new big value, a replace of
/// a big value by another and a remove, all unflushed writes lost or a
/// seeded subset kept: the image opens, each attribute is old or new,
/// and e2fsck is clean.
#[test]
fn power_cut_at_every_write() {
    let what = "power_cut_at_every_write";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "c.img", "8M", &["-O", "ea_inode", "-b", "1024"]);
    let old = pattern(20000, 21);
    let new = pattern(25000, 22);
    let add = pattern(9000, 23);
    {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let f = make(&fs, "f");
        fs.set_xattr(f, b"user.r", Some(&old), SetMode::Any)
            .unwrap();
        fs.set_xattr(f, b"user.gone", Some(&old), SetMode::Any)
            .unwrap();
        fs.close().unwrap();
    }
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let (o2, n2, a2) = (old.clone(), new.clone(), add.clone());
    let run = move |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let x = |e: ext4kit_fs::xattr_write::XattrError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        let f = fs.lookup(ROOT_INO, b"f").map_err(e)?.ok_or("no f")?.ino;
        fs.set_xattr(f, b"user.add", Some(&a2), SetMode::Create)
            .map_err(x)?;
        fs.set_xattr(f, b"user.r", Some(&n2), SetMode::Replace)
            .map_err(x)?;
        fs.set_xattr(f, b"user.gone", None, SetMode::Any)
            .map_err(x)?;
        let _ = &o2;
        fs.close().map_err(e)
    };
    let one = |cut: Option<u64>, mode: CutMode| run_cut(&base, cut, mode, &run);
    let (_, r, ops) = one(None, CutMode::DropAll);
    r.unwrap();
    let out = dir.path().join("cut.img");
    let mut seen_new = false;
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 18,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (mem, _, _) = one(Some(cut), mode);
            {
                let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                    .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
                let f = ino_of(&fs, "f");
                let r = get(&fs, f, "user.r");
                assert!(
                    r.as_deref() == Some(&old[..]) || r.as_deref() == Some(&new[..]),
                    "cut {cut} {mode:?}: user.r"
                );
                seen_new |= r.as_deref() == Some(&new[..]);
                let a = get(&fs, f, "user.add");
                assert!(
                    a.is_none() || a.as_deref() == Some(&add[..]),
                    "cut {cut}: add"
                );
                let g = get(&fs, f, "user.gone");
                assert!(
                    g.is_none() || g.as_deref() == Some(&old[..]),
                    "cut {cut}: gone"
                );
                fs.close().unwrap();
            }
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
        }
    }
    assert!(seen_new, "some cut kept the new value");
}

/// Through the mount (our transport and fuser's): `setfattr` of a
/// 20 KiB and a 64 KiB value, `getfattr` reads them back, a replace and a
/// remove; after unmount e2fsck is clean and the engine reads the values.
#[test]
fn through_the_mount() {
    let what = "ea_inode through_the_mount";
    if let Err(r) = e2fs_tools() {
        return skip(what, &r);
    }
    if let Err(r) = fuse_available() {
        return skip(what, &r);
    }
    if !have("setfattr") || !have("getfattr") {
        return skip(what, "no setfattr/getfattr");
    }
    let dir = image_dir();
    let v20 = pattern(20 * 1024, 31);
    let v64 = pattern(65536, 32);
    let path = dir.path().join("v64");
    fs::write(&path, &v64).unwrap();
    for (n, opts) in [("m1.img", &[][..]), ("m2.img", &["transport=fuser"][..])] {
        let img = ea_image(dir.path(), n, &["-b", "4096"]);
        let m = FuseMount::new(&img, opts).unwrap();
        let f = m.path().join("f");
        fs::write(&f, b"data").unwrap();
        let hex: String = std::iter::once("0x".to_string())
            .chain(v20.iter().map(|b| format!("{b:02x}")))
            .collect();
        run_ok(
            tool("setfattr")
                .args(["-n", "user.big", "-v", &hex])
                .arg(&f),
        )
        .unwrap();
        // A 64 KiB value from a file (too long for one argument in hex).
        let restore = dir.path().join("restore");
        let mut text = format!("# file: {}\nuser.huge=0x", f.display());
        for b in &v64 {
            text.push_str(&format!("{b:02x}"));
        }
        text.push_str("\n\n");
        fs::write(&restore, text).unwrap();
        run_ok(tool("setfattr").arg(format!("--restore={}", restore.display()))).unwrap();
        for (k, v) in [("user.big", &v20), ("user.huge", &v64)] {
            let out = run_ok(tool("getfattr").args(["-n", k, "--only-values"]).arg(&f)).unwrap();
            assert!(out.stdout == *v, "{n} {k}: {} bytes", out.stdout.len());
        }
        run_ok(
            tool("setfattr")
                .args(["-n", "user.big", "-v", "small"])
                .arg(&f),
        )
        .unwrap();
        run_ok(tool("setfattr").args(["-x", "user.huge"]).arg(&f)).unwrap();
        run_ok(
            tool("setfattr")
                .args(["-n", "user.again", "-v", &hex])
                .arg(&f),
        )
        .unwrap();
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{n}: {e}"));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let i = ino_of(&fs, "f");
        assert_eq!(get(&fs, i, "user.big").as_deref(), Some(&b"small"[..]));
        assert_eq!(get(&fs, i, "user.again").as_deref(), Some(&v20[..]));
        assert!(get(&fs, i, "user.huge").is_none());
        fs.close().unwrap();
    }
}
