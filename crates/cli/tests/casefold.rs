//! casefold read-write (issue 20): directories with `EXT4_CASEFOLD_FL`
//! hash and compare folded names (NFD, ignorables removed, full case
//! folding). The oracles: e2fsck, which recomputes every htree hash of a
//! casefolded directory with e2fsprogs' own utf8 tables and looks for
//! names that fold to the same, and debugfs (libext2fs), whose entries
//! in a casefolded directory we read back. This kernel has no
//! CONFIG_UNICODE, so it cannot mount these images (mkfs_kernel says so).

mod common;

use std::fs;
use std::path::Path;

use common::fuse::FuseMount;
use common::*;
use ext4kit_format::inode::{ROOT_INO, S_IFDIR, S_IFREG};
use ext4kit_fs::FsError;
use ext4kit_fs::fs::flags::CASEFOLD_FL;
use ext4kit_fs::fs::{Filesystem, NewInode, RenameFlags};
use ext4kit_fs::rw::RwOptions;

fn file(mode: u16) -> NewInode {
    NewInode::new(mode, 0, 0)
}

fn ino_of(fs: &Filesystem, dir: u32, name: &str) -> Option<u32> {
    fs.lookup(dir, name.as_bytes()).unwrap().map(|i| i.ino)
}

/// Enough names for a two-level htree in 1 KiB blocks, in mixed case and
/// with non-ASCII letters that fold (ß → ss, Å → å, Σ → σ).
fn names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 4 {
            0 => format!("File_{i:04}"),
            1 => format!("straße-{i}"),
            2 => format!("ÅNGSTRÖM {i}"),
            _ => format!("ΣΊΣΥΦΟΣ.{i}"),
        })
        .collect()
}

/// Another spelling of `name` that folds the same.
fn respell(name: &str) -> String {
    name.to_uppercase()
}

#[test]
fn engine_names_fold_and_e2fsck_agrees() {
    if let Err(r) = e2fs_tools() {
        return skip("engine_names_fold_and_e2fsck_agrees", &r);
    }
    let dir = image_dir();
    for (n, extra) in [
        ("b1.img", &["-b", "1024"][..]),
        ("b4.img", &["-b", "4096", "-E", "encoding_flags=strict"][..]),
    ] {
        let mut args = vec!["-O", "casefold"];
        args.extend_from_slice(extra);
        let img = mkimg(dir.path(), n, "64M", &args);
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let (cf, _) = fs.mkdir(ROOT_INO, b"cf", &file(S_IFDIR | 0o755)).unwrap();
        fs.set_flags(cf.ino, cf.flags | CASEFOLD_FL).unwrap();
        let all = names(1500);
        for nm in &all {
            fs.create(cf.ino, nm.as_bytes(), &file(S_IFREG | 0o644))
                .unwrap();
        }
        // Every name is found under another spelling, and a create of
        // another spelling is EEXIST.
        for nm in all.iter().step_by(37) {
            let want = ino_of(&fs, cf.ino, nm);
            assert!(want.is_some(), "{n}: {nm}");
            assert_eq!(ino_of(&fs, cf.ino, &respell(nm)), want, "{n}: {nm}");
            let e = fs
                .create(cf.ino, respell(nm).as_bytes(), &file(S_IFREG | 0o644))
                .unwrap_err();
            assert!(matches!(e, FsError::Exists), "{n}: {nm}: {e}");
        }
        assert!(ino_of(&fs, cf.ino, "STRASSE-1").is_some(), "ß folds to ss");
        // Zero-width space is ignored.
        assert!(ino_of(&fs, cf.ino, "File_\u{200B}0000").is_some());
        // Unlink and rename under other spellings.
        fs.unlink(cf.ino, b"FILE_0004").unwrap();
        assert_eq!(ino_of(&fs, cf.ino, "File_0004"), None);
        fs.rename(
            cf.ino,
            "STRASSE-5".as_bytes(),
            cf.ino,
            b"renamed",
            RenameFlags::default(),
        )
        .unwrap();
        assert_eq!(ino_of(&fs, cf.ino, "straße-5"), None);
        assert!(ino_of(&fs, cf.ino, "RENAMED").is_some());
        // The flag: inherited by directories, not by files; changed only
        // on empty directories.
        let (sub, _) = fs.mkdir(cf.ino, b"Sub", &file(S_IFDIR | 0o755)).unwrap();
        assert!(sub.flags & CASEFOLD_FL != 0, "{n}: inherited");
        let f = fs.lookup(cf.ino, b"file_0000").unwrap().unwrap();
        assert_eq!(f.flags & CASEFOLD_FL, 0);
        let e = fs.set_flags(cf.ino, cf.flags & !CASEFOLD_FL).unwrap_err();
        assert!(matches!(e, FsError::NotEmpty), "{e}");
        fs.create(sub.ino, b"x", &file(S_IFREG | 0o644)).unwrap();
        assert!(ino_of(&fs, sub.ino, "X").is_some());
        // A plain directory stays byte-exact.
        let (plain, _) = fs
            .mkdir(ROOT_INO, b"plain", &file(S_IFDIR | 0o755))
            .unwrap();
        fs.create(plain.ino, b"abc", &file(S_IFREG | 0o644))
            .unwrap();
        fs.create(plain.ino, b"ABC", &file(S_IFREG | 0o644))
            .unwrap();
        // Strict mode refuses names that are not UTF-8 in casefolded
        // directories only.
        let bad = fs.create(cf.ino, b"bad\xff", &file(S_IFREG | 0o644));
        if extra.contains(&"encoding_flags=strict") {
            assert!(matches!(bad, Err(FsError::InvalidName(_))), "{bad:?}");
        } else {
            bad.unwrap();
            assert!(fs.lookup(cf.ino, b"bad\xff").unwrap().is_some());
            assert!(fs.lookup(cf.ino, b"BAD\xff").unwrap().is_none());
        }
        fs.create(plain.ino, b"bad\xff", &file(S_IFREG | 0o644))
            .unwrap();
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{n}: {e}"));
        // The read side: the tools look up under any spelling.
        let o = run_ok(ext4kit().args(["stat", &format!("{}:/CF/file_0008", img.display())]));
        // The root is not casefolded: "CF" is not "cf".
        assert!(o.is_err(), "{n}: /CF found in a plain root");
        run_ok(ext4kit().args(["stat", &format!("{}:/cf/FILE_0008", img.display())]))
            .unwrap_or_else(|e| panic!("{n}: {e}"));
    }
}

/// debugfs (libext2fs, casefold-aware in 1.47) fills a casefolded
/// directory and `e2fsck -fD` indexes it with e2fsprogs' folded hashes:
/// we find every name through that htree under other spellings (our
/// hash is theirs), add to it, and e2fsck agrees.
#[test]
fn debugfs_entries_read_back_and_ours_pass_e2fsck() {
    if let Err(r) = e2fs_tools() {
        return skip("debugfs_entries_read_back_and_ours_pass_e2fsck", &r);
    }
    let dir = image_dir();
    let img = mkimg(
        dir.path(),
        "d.img",
        "32M",
        &["-O", "casefold", "-b", "1024"],
    );
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let mut script = String::from("mkdir cf\nset_inode_field cf flags 0x40080000\ncd cf\n");
    let theirs: Vec<String> = (0..400)
        .map(|i| match i % 3 {
            0 => format!("Dbg_{i}"),
            1 => format!("Größe_{i}"),
            _ => format!("Ωmega_{i}"),
        })
        .collect();
    for nm in &theirs {
        script.push_str(&format!("write {} {nm}\n", empty.display()));
    }
    let cmds = dir.path().join("cmds");
    fs::write(&cmds, script).unwrap();
    run_ok(tool("debugfs").arg("-w").arg("-f").arg(&cmds).arg(&img)).unwrap();
    // Index it (e2fsck exits 1 when it changed something).
    let o = run(tool("e2fsck").args(["-fyD"]).arg(&img)).unwrap();
    assert!(o.status.code().is_some_and(|c| c <= 1), "{o:?}");
    e2fsck_clean(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let cf = fs.lookup(ROOT_INO, b"cf").unwrap().unwrap();
    assert!(cf.flags & CASEFOLD_FL != 0);
    assert!(cf.flags & 0x1000 != 0, "e2fsck -D made it an htree");
    let find_all = |fs: &Filesystem| {
        for nm in &theirs {
            assert!(ino_of(fs, cf.ino, &respell(nm)).is_some(), "{nm}");
            assert!(ino_of(fs, cf.ino, &nm.to_lowercase()).is_some(), "{nm}");
        }
    };
    find_all(&fs);
    for nm in names(300) {
        fs.create(cf.ino, nm.as_bytes(), &file(S_IFREG | 0o644))
            .unwrap();
    }
    find_all(&fs);
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

fn chattr(args: &[&str], p: &Path) -> Result<std::process::Output, String> {
    run_ok(tool("chattr").args(args).arg(p))
}

/// Through the mount: `chattr +F`, lookups under other spellings, and
/// no stale name in the kernel's dcache after a rename, unlink or create
/// under another spelling (the entries of a casefolded directory are
/// valid for 0 s).
#[test]
fn through_the_mount() {
    let what = "casefold through_the_mount";
    if let Err(r) = e2fs_tools() {
        return skip(what, &r);
    }
    if let Err(r) = fuse_available() {
        return skip(what, &r);
    }
    let dir = image_dir();
    for (n, opts) in [("m1.img", &[][..]), ("m2.img", &["transport=fuser"][..])] {
        let img = mkimg(dir.path(), n, "32M", &["-O", "casefold"]);
        let m = FuseMount::new(&img, opts).unwrap();
        let cf = m.path().join("cf");
        fs::create_dir(&cf).unwrap();
        chattr(&["+F"], &cf).unwrap();
        fs::write(cf.join("Readme.TXT"), b"hello").unwrap();
        assert_eq!(fs::read(cf.join("readme.txt")).unwrap(), b"hello");
        assert_eq!(fs::read(cf.join("README.txt")).unwrap(), b"hello");
        // A create under another spelling opens the same file.
        let e = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(cf.join("README.TXT"))
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{n}");
        // Rename and unlink: no other spelling survives in the dcache.
        fs::rename(cf.join("readme.TXT"), cf.join("Other")).unwrap();
        assert!(!cf.join("Readme.TXT").exists(), "{n}: stale after rename");
        assert!(!cf.join("readme.txt").exists(), "{n}: stale after rename");
        assert_eq!(fs::read(cf.join("OTHER")).unwrap(), b"hello");
        // A name looked up as missing, then created under another one.
        assert!(!cf.join("late").exists());
        fs::write(cf.join("LATE"), b"x").unwrap();
        assert!(cf.join("late").exists(), "{n}: stale negative entry");
        fs::remove_file(cf.join("late")).unwrap();
        assert!(!cf.join("LATE").exists(), "{n}: stale after unlink");
        // The listing keeps the names as created.
        let mut listed: Vec<String> = fs::read_dir(&cf)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        listed.sort();
        assert_eq!(listed, vec!["Other".to_string()]);
        // +F on a non-empty directory: ENOTEMPTY, as ext4.
        let plain = m.path().join("plain");
        fs::create_dir(&plain).unwrap();
        fs::write(plain.join("a"), b"").unwrap();
        assert!(chattr(&["+F"], &plain).is_err());
        fs::create_dir(cf.join("Sub")).unwrap();
        let o = run_ok(tool("lsattr").arg("-d").arg(cf.join("SUB"))).unwrap();
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            s.split_whitespace().next().unwrap_or("").contains('F'),
            "{s}"
        );
        m.unmount().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{n}: {e}"));
    }
}

/// Random creates, unlinks, renames and lookups under random spellings
/// against a model keyed by the folded name (what the directory must
/// hold, spelled as first created), in an htree of 1 KiB blocks; e2fsck
/// clean at the end and after a reopen the same.
#[test]
fn random_ops_match_a_folded_model() {
    if let Err(r) = e2fs_tools() {
        return skip("random_ops_match_a_folded_model", &r);
    }
    use ext4kit_format::casefold::fold;
    use std::collections::BTreeMap;
    let dir = image_dir();
    let img = mkimg(
        dir.path(),
        "r.img",
        "32M",
        &["-O", "casefold", "-b", "1024"],
    );
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let (cf, _) = fs.mkdir(ROOT_INO, b"cf", &file(S_IFDIR | 0o755)).unwrap();
    fs.set_flags(cf.ino, cf.flags | CASEFOLD_FL).unwrap();
    let bases = names(240);
    let mut model: BTreeMap<Vec<u8>, (String, u32)> = BTreeMap::new();
    let mut x: u64 = 0xcafe_f01d;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    // One of the base names, in one of three spellings.
    let spell = |k: u64, how: u64| -> String {
        let b = &bases[k as usize];
        match how {
            0 => b.clone(),
            1 => b.to_uppercase(),
            _ => b.to_lowercase(),
        }
    };
    for step in 0..2500 {
        let (k, how) = (rnd(bases.len() as u64), rnd(3));
        let nm = spell(k, how);
        let key = fold(nm.as_bytes()).unwrap();
        match rnd(4) {
            0 | 1 => {
                let r = fs.create(cf.ino, nm.as_bytes(), &file(S_IFREG | 0o644));
                match model.get(&key) {
                    Some(_) => assert!(matches!(r, Err(FsError::Exists)), "{step}: {nm}"),
                    None => {
                        let (i, _) = r.unwrap_or_else(|e| panic!("{step}: {nm}: {e}"));
                        model.insert(key, (nm, i.ino));
                    }
                }
            }
            2 => {
                let r = fs.unlink(cf.ino, nm.as_bytes());
                match model.remove(&key) {
                    Some(_) => {
                        r.unwrap_or_else(|e| panic!("{step}: {nm}: {e}"));
                    }
                    None => assert!(matches!(r, Err(FsError::NotFound)), "{step}: {nm}"),
                }
            }
            _ => {
                let to = spell(rnd(bases.len() as u64), rnd(3));
                let tkey = fold(to.as_bytes()).unwrap();
                let r = fs.rename(
                    cf.ino,
                    nm.as_bytes(),
                    cf.ino,
                    to.as_bytes(),
                    RenameFlags::default(),
                );
                match model.get(&key).cloned() {
                    None => assert!(matches!(r, Err(FsError::NotFound)), "{step}: {nm}"),
                    Some(src) => {
                        r.unwrap_or_else(|e| panic!("{step}: {nm} -> {to}: {e}"));
                        if tkey != key {
                            model.remove(&key);
                            // Over an existing entry its spelling stays.
                            let spelled = model.get(&tkey).map_or(to, |t| t.0.clone());
                            model.insert(tkey, (spelled, src.1));
                        }
                    }
                }
            }
        }
        let probe = spell(rnd(bases.len() as u64), rnd(3));
        let want = model.get(&fold(probe.as_bytes()).unwrap()).map(|e| e.1);
        assert_eq!(ino_of(&fs, cf.ino, &probe), want, "{step}: lookup {probe}");
    }
    let check = |fs: &Filesystem| {
        let d = fs.inode(cf.ino).unwrap();
        let mut listed: Vec<(String, u32)> = fs
            .read(|f| f.read_dir(&d))
            .unwrap()
            .into_iter()
            .filter(|e| e.name != b"." && e.name != b"..")
            .map(|e| (String::from_utf8(e.name).unwrap(), e.ino))
            .collect();
        listed.sort();
        let mut want: Vec<(String, u32)> = model.values().cloned().collect();
        want.sort();
        assert_eq!(listed, want);
    };
    check(&fs);
    assert!(fs.inode(cf.ino).unwrap().is_htree());
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    check(&fs);
    fs.close().unwrap();
}

/// A create, an unlink and a rename under other spellings in a
/// casefolded htree, cut at every write (two cut modes): each is all or
/// nothing after the replay, and e2fsck is clean.
#[test]
fn power_cut_at_every_write() {
    let what = "casefold power_cut_at_every_write";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    use ext4kit_device::{CutMode, Device, MemDevice};
    use std::sync::Arc;
    let dir = image_dir();
    let img = mkimg(dir.path(), "c.img", "8M", &["-O", "casefold", "-b", "1024"]);
    {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let (cf, _) = fs.mkdir(ROOT_INO, b"cf", &file(S_IFDIR | 0o755)).unwrap();
        fs.set_flags(cf.ino, cf.flags | CASEFOLD_FL).unwrap();
        for nm in names(120) {
            fs.create(cf.ino, nm.as_bytes(), &file(S_IFREG | 0o644))
                .unwrap();
        }
        fs.close().unwrap();
    }
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        let cf = fs.lookup(ROOT_INO, b"cf").map_err(e)?.ok_or("no cf")?.ino;
        fs.create(cf, "NEW_Größe".as_bytes(), &file(S_IFREG | 0o644))
            .map_err(e)?;
        fs.unlink(cf, b"FILE_0008").map_err(e)?;
        fs.rename(
            cf,
            "STRASSE-1".as_bytes(),
            cf,
            b"Moved",
            RenameFlags::default(),
        )
        .map_err(e)?;
        fs.close().map_err(e)
    };
    let one = |cut: Option<u64>, mode: CutMode| run_cut(&base, cut, mode, run);
    let (_, r, ops) = one(None, CutMode::DropAll);
    r.unwrap();
    let out = dir.path().join("cut.img");
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 19,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (mem, _, _) = one(Some(cut), mode);
            {
                let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                    .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
                let cf = ino_of(&fs, ROOT_INO, "cf").unwrap();
                // The rename: exactly one of the two names.
                let (old, moved) = (ino_of(&fs, cf, "straße-1"), ino_of(&fs, cf, "MOVED"));
                assert!(
                    old.is_some() != moved.is_some(),
                    "cut {cut} {mode:?}: rename"
                );
                // Every other name is still there under any spelling.
                for nm in names(120).iter().filter(|n| !n.starts_with("straße-1")) {
                    if nm == "File_0008" {
                        continue;
                    }
                    assert!(
                        ino_of(&fs, cf, &respell(nm)).is_some(),
                        "cut {cut} {mode:?}: {nm}"
                    );
                }
                fs.close().unwrap();
            }
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
        }
    }
}
