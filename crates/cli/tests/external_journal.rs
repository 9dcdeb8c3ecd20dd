//! Filesystems whose journal is on another device (`mkfs -O journal_dev`,
//! attached with `-J device=`), read-write: the tools' `--journal-path`,
//! e2fsck `-j` clean after our writes, the kernel (`journal_path=` on loop
//! devices) reading what we wrote and leaving dirty external journals we
//! replay like it does, refusals of wrong journals (one line, nothing
//! written) and a power cut at every write across both devices.
//!
//! Making the pair needs root: mke2fs (and `ext4kit mkfs`) attach a
//! journal device only when it is a block device, so the journal image
//! is loop-attached for the mkfs; everything after works on the image
//! files (the kernel parts on loop devices again).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::fuse::FuseMount;
use common::*;
use ext4kit_device::{CutMode, Device, MemDevice, WithJournal};
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

const ROOT_INO: u32 = 2;

/// Root, loop devices and e2fsprogs (the pair is made with a loop device).
fn pair_ok() -> Result<(), String> {
    e2fs_tools()?;
    if !is_root() {
        return Err("needs root (loop device for mkfs -J device=)".into());
    }
    if !have("losetup") {
        return Err("losetup not found".into());
    }
    Ok(())
}

/// A journal device `NAME-j.img` (8 MiB) and a filesystem `NAME.img`
/// (32 MiB, 4 KiB blocks) attached to it, made by `ext4kit mkfs` or
/// mke2fs.
fn make_pair(dir: &Path, name: &str, ours: bool) -> (PathBuf, PathBuf) {
    make_pair_bs(dir, name, ours, "4096")
}

/// [`make_pair`] with block size `bs`.
fn make_pair_bs(dir: &Path, name: &str, ours: bool, bs: &str) -> (PathBuf, PathBuf) {
    let fsimg = dir.join(format!("{name}.img"));
    let jimg = dir.join(format!("{name}-j.img"));
    sparse_file(&jimg, 8 << 20).unwrap();
    sparse_file(&fsimg, 32 << 20).unwrap();
    let mkfs = |args: &[&str], img: &Path| -> Command {
        let mut c = if ours {
            ext4kit_mkfs(args)
        } else {
            mke2fs(args)
        };
        c.arg(img);
        c
    };
    run_ok(&mut mkfs(
        &["-q", "-F", "-t", "ext4", "-b", bs, "-O", "journal_dev"],
        &jimg,
    ))
    .unwrap();
    let lo = LoopDev::attach(&jimg).unwrap();
    let spec = format!("device={}", lo.path().display());
    run_ok(&mut mkfs(
        &[
            "-q",
            "-F",
            "-t",
            "ext4",
            "-b",
            bs,
            "-E",
            "nodiscard",
            "-J",
            &spec,
        ],
        &fsimg,
    ))
    .unwrap();
    drop(lo);
    (fsimg, jimg)
}

fn jp(j: &Path) -> [String; 2] {
    ["--journal-path".into(), j.display().to_string()]
}

/// `e2fsck -fn -j JOURNAL FS` clean. With an empty blkid cache: e2fsck
/// compares the superblock's `s_journal_dev` hint with the device its
/// blkid cache names for the journal UUID ("Superblock hint for external
/// superblock should be ..."), and the kernel rewrites the hint to the
/// loop device it was mounted from, so a cache entry of an earlier loop
/// number would make that line depend on which loop devices the tests
/// got. With the loop devices detached, nothing in a fresh cache has the
/// UUID and the hint is not compared.
fn e2fsck_clean_ext(fsimg: &Path, jimg: &Path) -> Result<String, String> {
    let cache = fsimg.with_extension("blkid.tab");
    let _ = fs::remove_file(&cache);
    let r = e2fsck_clean_env(
        fsimg,
        &["-j", &jimg.display().to_string()],
        &[("BLKID_FILE", &cache.display().to_string())],
    );
    let _ = fs::remove_file(&cache);
    r
}

/// `e2fsck -E journal_only -y -j JOURNAL FS` (a fresh blkid cache, see
/// [`e2fsck_clean_ext`]): the replay oracle.
fn e2fsck_journal_only(fsimg: &Path, jimg: &Path) {
    let cache = fsimg.with_extension("blkid.tab");
    let _ = fs::remove_file(&cache);
    let e = run(tool("e2fsck")
        .env("BLKID_FILE", &cache)
        .args(["-E", "journal_only", "-y", "-j"])
        .arg(jimg)
        .arg(fsimg))
    .unwrap();
    let _ = fs::remove_file(&cache);
    assert!(e.status.code().is_some_and(|c| c <= 1), "e2fsck: {e:?}");
}

/// Every file under `root` (as the kernel shows it): path -> contents
/// (directories as "<dir>").
fn walk(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == "lost+found" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                out.insert(rel, b"<dir>".to_vec());
                stack.push(p);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// The kernel's mount of the pair (both loop-attached, `journal_path=`);
/// unmounted, then detached, on drop (fields drop in order).
struct KernelPair {
    mount: Mount,
    _fs: LoopDev,
    _j: LoopDev,
}

impl KernelPair {
    fn new(fsimg: &Path, jimg: &Path) -> Result<KernelPair, String> {
        let j = LoopDev::attach(jimg)?;
        let f = LoopDev::attach(fsimg)?;
        let opt = format!("journal_path={}", j.path().display());
        let mount = Mount::new(f.path(), "ext4", Some(&opt))?;
        Ok(KernelPair {
            mount,
            _fs: f,
            _j: j,
        })
    }

    fn path(&self) -> &Path {
        self.mount.path()
    }

    fn unmount(self) {
        let KernelPair { mount, _fs, _j } = self;
        mount.unmount().unwrap();
    }
}

#[test]
fn images_with_an_external_journal_are_written_and_stay_clean() {
    let what = "images_with_an_external_journal_are_written_and_stay_clean";
    if let Err(r) = pair_ok() {
        return skip(what, &r);
    }
    let kernel = kernel_mount_available();
    let dir = image_dir();
    let d = dir.path();
    let data = pattern(300_000, 7);
    let host = d.join("data");
    fs::write(&host, &data).unwrap();
    // mke2fs with 1 KiB blocks: the jbd2 superblock is block 2 there.
    for (ours, bs) in [(true, "4096"), (false, "1024")] {
        let name = if ours { "ext4kit" } else { "mke2fs" };
        let (fsimg, jimg) = make_pair_bs(d, name, ours, bs);
        let target = |p: &str| format!("{}:{p}", fsimg.display());
        run_ok(ext4kit().args(jp(&jimg)).arg("mkdir").arg(target("/d"))).unwrap();
        run_ok(
            ext4kit()
                .args(jp(&jimg))
                .arg("cp")
                .arg(&host)
                .arg(target("/d/data")),
        )
        .unwrap();
        e2fsck_clean_ext(&fsimg, &jimg).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = run_ok(ext4kit().args(jp(&jimg)).arg("cat").arg(target("/d/data"))).unwrap();
        assert!(out.stdout == data, "{name}: cat");
        // journal dump shows the external journal (first block 2).
        let out = run_ok(
            ext4kit()
                .args(jp(&jimg))
                .args(["journal", "dump"])
                .arg(&fsimg),
        )
        .unwrap();
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(t.contains("external"), "{name}: {t}");
        let out = run_ok(ext4kit().args(jp(&jimg)).arg("info").arg(&fsimg)).unwrap();
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(
            t.contains("journal:             external (UUID ") && t.contains(" blocks"),
            "{name}: info: {t}"
        );

        // The FUSE mount: -o journal_path= (refused without it).
        match fuse_available() {
            Err(r) => skip(&format!("{what} (mount part)"), &r),
            Ok(()) => {
                let before = (file_hash(&fsimg).unwrap(), file_hash(&jimg).unwrap());
                let mnt = tempfile::tempdir().unwrap();
                let out = run(ext4kit().args(["mount", "-f"]).arg(&fsimg).arg(mnt.path())).unwrap();
                assert!(!out.status.success(), "{name}: mounted without the journal");
                let e = last_line(&out);
                assert!(e.contains("journal_path"), "{name}: {e}");
                assert_eq!(
                    before,
                    (file_hash(&fsimg).unwrap(), file_hash(&jimg).unwrap())
                );
                let opt = format!("journal_path={}", jimg.display());
                let m = FuseMount::new(&fsimg, &[&opt]).unwrap();
                assert!(
                    fs::read(m.path().join("d/data")).unwrap() == data,
                    "{name}: mount read"
                );
                fs::write(m.path().join("d/m"), b"mount\n").unwrap();
                m.unmount().unwrap();
                e2fsck_clean_ext(&fsimg, &jimg)
                    .unwrap_or_else(|e| panic!("{name} after the mount: {e}"));
            }
        }
        if let Err(r) = &kernel {
            skip(&format!("{what} (kernel part)"), r);
            continue;
        }
        let k = KernelPair::new(&fsimg, &jimg).unwrap();
        assert!(
            fs::read(k.path().join("d/data")).unwrap() == data,
            "{name}: kernel read"
        );
        if fuse_available().is_ok() {
            assert_eq!(fs::read(k.path().join("d/m")).unwrap(), b"mount\n");
        }
        fs::write(k.path().join("d/k"), b"kernel\n").unwrap();
        fs::create_dir(k.path().join("d/kd")).unwrap();
        k.unmount();
        e2fsck_clean_ext(&fsimg, &jimg).unwrap_or_else(|e| panic!("{name} after kernel: {e}"));
        let out = run_ok(ext4kit().args(jp(&jimg)).arg("cat").arg(target("/d/k"))).unwrap();
        assert_eq!(out.stdout, b"kernel\n", "{name}");
        run_ok(ext4kit().args(jp(&jimg)).arg("rm").arg(target("/d/data"))).unwrap();
        e2fsck_clean_ext(&fsimg, &jimg).unwrap_or_else(|e| panic!("{name} after rm: {e}"));
        fs::remove_file(&fsimg).unwrap();
        fs::remove_file(&jimg).unwrap();
    }
}

#[test]
fn a_dirty_kernel_external_journal_is_replayed_like_the_kernel() {
    let what = "a_dirty_kernel_external_journal_is_replayed_like_the_kernel";
    if let Err(r) = pair_ok().and_then(|_| kernel_mount_available()) {
        return skip(what, &r);
    }
    if !have("python3") {
        return skip(what, "python3 not found (for the shutdown ioctl)");
    }
    let dir = image_dir();
    let d = dir.path();
    let (fsimg, jimg) = make_pair(d, "k", false);
    {
        let k = KernelPair::new(&fsimg, &jimg).unwrap();
        let m = k.path();
        fs::create_dir(m.join("d")).unwrap();
        for i in 0..150 {
            fs::write(m.join(format!("d/f{i}")), pattern(1000 + i * 37, i as u64)).unwrap();
        }
        fs::File::open(m.join("d")).unwrap().sync_all().unwrap();
        for i in 0..50 {
            fs::remove_file(m.join(format!("d/f{i}"))).unwrap();
        }
        fs::create_dir(m.join("e")).unwrap();
        shutdown_nologflush(m);
        k.unmount();
    }
    let out = run_ok(
        ext4kit()
            .args(jp(&jimg))
            .args(["journal", "dump", "--json"])
            .arg(&fsimg),
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["needs_recovery"], true, "{v}");
    assert!(v["transactions"].as_u64().unwrap() >= 1, "{v}");
    // Without the option: one line naming it, nothing written.
    let before = (file_hash(&fsimg).unwrap(), file_hash(&jimg).unwrap());
    let out = run(ext4kit().args(["journal", "replay"]).arg(&fsimg)).unwrap();
    assert!(!out.status.success());
    assert!(
        last_line(&out).contains("journal_path"),
        "{}",
        last_line(&out)
    );
    assert_eq!(
        before,
        (file_hash(&fsimg).unwrap(), file_hash(&jimg).unwrap())
    );

    // The kernel's replay on copies.
    let (kf, kj) = (d.join("kf.img"), d.join("kj.img"));
    sparse_copy(&fsimg, &kf);
    sparse_copy(&jimg, &kj);
    let want = {
        let k = KernelPair::new(&kf, &kj).unwrap();
        let t = walk(k.path());
        k.unmount();
        t
    };
    assert!(
        want.contains_key("d/f149") && !want.contains_key("d/f0"),
        "{:?}",
        want.keys()
    );
    // e2fsck's replay on other copies: the oracle for the bytes.
    let (ef, ej) = (d.join("ef.img"), d.join("ej.img"));
    sparse_copy(&fsimg, &ef);
    sparse_copy(&jimg, &ej);
    e2fsck_journal_only(&ef, &ej);
    // Ours, then the kernel reads it.
    run_ok(
        ext4kit()
            .args(jp(&jimg))
            .args(["journal", "replay"])
            .arg(&fsimg),
    )
    .unwrap();
    for (a, b) in [(&fsimg, &ef), (&jimg, &ej)] {
        let (ma, mb) = (d.join("a.masked"), d.join("b.masked"));
        sparse_copy(a, &ma);
        sparse_copy(b, &mb);
        mask_superblock(&ma);
        mask_superblock(&mb);
        sparse_equal(&ma, &mb)
            .unwrap_or_else(|e| panic!("{}: replay differs from e2fsck's: {e}", a.display()));
        fs::remove_file(&ma).unwrap();
        fs::remove_file(&mb).unwrap();
    }
    // (The superblock's free counts are stale after any replay, as
    // after the kernel's: e2fsck -fn is clean once a mount wrote them.)
    let k = KernelPair::new(&fsimg, &jimg).unwrap();
    let got = walk(k.path());
    k.unmount();
    assert!(got == want, "trees differ");
    e2fsck_clean_ext(&fsimg, &jimg).unwrap();
    e2fsck_clean_ext(&kf, &kj).unwrap();
}

fn refused(args: &[String], want: &str, files: &[&Path]) {
    let before: Vec<_> = files.iter().map(|f| file_hash(f).unwrap()).collect();
    let out = run(ext4kit().args(args)).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: {err}");
    let after: Vec<_> = files.iter().map(|f| file_hash(f).unwrap()).collect();
    assert_eq!(before, after, "{args:?} wrote");
}

#[test]
fn wrong_journals_are_refused_with_one_line_and_no_write() {
    let what = "wrong_journals_are_refused_with_one_line_and_no_write";
    if let Err(r) = pair_ok() {
        return skip(what, &r);
    }
    let dir = image_dir();
    let d = dir.path();
    let (f1, j1) = make_pair(d, "one", true);
    let (_f2, j2) = make_pair(d, "two", false);
    let plain = d.join("plain.img");
    sparse_file(&plain, 8 << 20).unwrap();
    let internal = mkimg(d, "internal.img", "32M", &["-b", "4096"]);
    let s = |p: &Path| p.display().to_string();
    let t = |p: &Path, x: &str| format!("{}:{x}", p.display());
    let files = [f1.as_path(), j1.as_path(), j2.as_path(), plain.as_path()];
    let uuid = {
        let h = dumpe2fs_h(&f1);
        h.lines()
            .find_map(|l| l.strip_prefix("Journal UUID:"))
            .unwrap()
            .trim()
            .to_string()
    };
    for tool_args in [
        vec!["mkdir".to_string(), t(&f1, "/x")],
        vec!["journal".into(), "replay".into(), s(&f1)],
        vec!["ls".into(), t(&f1, "/")],
    ] {
        // Needed only with a dirty journal for the read-only tools: ls of
        // a clean image works without it.
        if tool_args[0] != "ls" {
            refused(&tool_args, &uuid, &files);
        }
        let mut a = vec!["--journal-path".to_string(), s(&j2)];
        a.extend(tool_args.iter().cloned());
        if tool_args[0] != "ls" {
            refused(&a, "is not the filesystem's journal UUID", &files);
        }
        let mut a = vec!["--journal-path".to_string(), s(&plain)];
        a.extend(tool_args.iter().cloned());
        if tool_args[0] != "ls" {
            refused(&a, "not an external journal device", &files);
        }
    }
    // The journal device as the filesystem, a journal for an internal one.
    refused(&["mkdir".into(), t(&j1, "/x")], "journal_dev", &files);
    let mut files2 = files.to_vec();
    files2.push(&internal);
    refused(
        &[
            "--journal-path".into(),
            s(&j1),
            "mkdir".into(),
            t(&internal, "/x"),
        ],
        "internal",
        &files2,
    );
    // The right one works.
    run_ok(ext4kit().args(jp(&j1)).arg("mkdir").arg(t(&f1, "/x"))).unwrap();
    e2fsck_clean_ext(&f1, &j1).unwrap();
}

#[test]
fn a_power_cut_at_every_write_across_both_devices() {
    let what = "a_power_cut_at_every_write_across_both_devices";
    if let Err(r) = pair_ok() {
        return skip(what, &r);
    }
    let dir = image_dir();
    let d = dir.path();
    let (fsimg, jimg) = make_pair(d, "cut", true);
    let base_f = MemDevice::from_bytes(fs::read(&fsimg).unwrap());
    let base_j = MemDevice::from_bytes(fs::read(&jimg).unwrap());
    let joined = |f: Arc<MemDevice>, j: Arc<MemDevice>| -> Arc<dyn Device> {
        Arc::new(WithJournal::new(f, j))
    };
    let data = pattern(70_000, 3);
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        let (dd, _) = fs
            .mkdir(ROOT_INO, b"d", &NewInode::new(S_IFDIR | 0o755, 0, 0))
            .map_err(e)?;
        let (g, _) = fs
            .create(dd.ino, b"g", &NewInode::new(S_IFREG | 0o644, 0, 0))
            .map_err(e)?;
        fs.write_at(g.ino, 0, &data).map_err(e)?;
        fs.sync().map_err(e)?;
        fs.create(ROOT_INO, b"h", &NewInode::new(S_IFREG | 0o644, 0, 0))
            .map_err(e)?;
        fs.close().map_err(e)
    };
    let (f0, j0, r, ops) = run_cut_joined(&base_f, &base_j, None, CutMode::DropAll, run);
    r.unwrap();
    assert!(ops > 10, "{ops} writes");
    // Both devices were written.
    assert!(f0.to_bytes() != base_f.to_bytes() && j0.to_bytes() != base_j.to_bytes());
    let (outf, outj) = (d.join("out.img"), d.join("out-j.img"));
    let mut seen = [false; 2];
    let mut replayed = 0;
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 5,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (f, j, _, _) = run_cut_joined(&base_f, &base_j, Some(cut), mode, run);
            // A dirty log: `journal replay` gives e2fsck's bytes on both
            // devices.
            let fb = f.to_bytes();
            if fb[1024 + 0x60] & 0x4 != 0 {
                fs::write(&outf, &fb).unwrap();
                fs::write(&outj, j.to_bytes()).unwrap();
                let (ef, ej) = (d.join("e.img"), d.join("e-j.img"));
                fs::copy(&outf, &ef).unwrap();
                fs::copy(&outj, &ej).unwrap();
                e2fsck_journal_only(&ef, &ej);
                run_ok(
                    ext4kit()
                        .args(jp(&outj))
                        .args(["journal", "replay"])
                        .arg(&outf),
                )
                .unwrap();
                for (a, b) in [(&outf, &ef), (&outj, &ej)] {
                    mask_superblock(a);
                    mask_superblock(b);
                    sparse_equal(a, b).unwrap_or_else(|e| {
                        panic!(
                            "cut {cut} {mode:?}: {}: not e2fsck's replay: {e}",
                            a.display()
                        )
                    });
                }
                replayed += 1;
            }
            {
                let fs = Filesystem::open(joined(f.clone(), j.clone()), RwOptions::default())
                    .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
                if let Some(dd) = fs.lookup(ROOT_INO, b"d").unwrap()
                    && let Some(g) = fs.lookup(dd.ino, b"g").unwrap()
                {
                    let mut buf = vec![0u8; data.len() + 10];
                    let n = fs.read_at(g.ino, 0, &mut buf).unwrap();
                    assert!(
                        n == 0 || buf[..n] == data[..],
                        "cut {cut} {mode:?}: g has {n} bytes"
                    );
                    seen[usize::from(n != 0)] = true;
                }
                fs.close().unwrap();
            }
            fs::write(&outf, f.to_bytes()).unwrap();
            fs::write(&outj, j.to_bytes()).unwrap();
            e2fsck_clean_ext(&outf, &outj).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
        }
    }
    assert!(seen[1], "some cut kept the data");
    assert!(replayed > 0, "no cut left a dirty log");
    eprintln!("{what}: {ops} writes, {replayed} dirty logs replayed like e2fsck");
}
