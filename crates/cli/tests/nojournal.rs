//! Journal-less images (`mkfs.ext4 -O ^has_journal`) written as the
//! kernel's ext4 writes them: the engine's transactions commit in place,
//! `s_state` is "not clean" while the image is open for writing and
//! "clean" again after a clean close; after a crash (kill -9 of the
//! mount, a power cut on the fault-injecting device) `e2fsck -fy`
//! repairs the image and it is usable again. 4 KiB and 1 KiB blocks; an
//! ext2 image (no extents) is refused with one line.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::fuse::{FuseMount, wait_until};
use common::*;
use ext4kit_device::{CutMode, Device, FaultDevice};
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

const ROOT: u32 = 2;

/// A journal-less ext4 image of `size` with `block` byte blocks.
fn image(dir: &Path, name: &str, size: &str, block: &str) -> PathBuf {
    let img = mkimg(dir, name, size, &["-O", "^has_journal", "-b", block]);
    let h = dumpe2fs_h(&img);
    assert!(!h.contains("has_journal"), "{h}");
    assert!(h.contains("Filesystem state:         clean"), "{h}");
    img
}

fn state(img: &Path) -> String {
    dumpe2fs_h(img)
        .lines()
        .find_map(|l| l.strip_prefix("Filesystem state:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A small host tree: nested directories, small and multi-block files,
/// a symlink.
fn host_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::write(root.join("a/small"), b"hello\n").unwrap();
    fs::write(root.join("a/b/big"), pattern(300_000, 1)).unwrap();
    fs::write(root.join("a/b/c/mid"), pattern(20_000, 2)).unwrap();
    for i in 0..40 {
        fs::write(
            root.join(format!("a/b/f{i}")),
            pattern(i * 97 + 1, i as u64),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("b/big", root.join("a/link")).unwrap();
}

/// Path -> type, size and content hash, below `root` (lost+found left out).
fn walk(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let ft = md.file_type();
        let s = if ft.is_symlink() {
            format!("link -> {}", fs::read_link(&p).unwrap().display())
        } else if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                let e = e.unwrap();
                if rel.is_empty() && e.file_name() == "lost+found" {
                    continue;
                }
                stack.push(e.path());
            }
            format!("dir {:o}", md.mode())
        } else {
            let data = fs::read(&p).unwrap();
            let h = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
            format!("file {:o} {} {h:016x}", md.mode(), md.size())
        };
        out.insert(rel, s);
    }
    out
}

fn tool_ok(args: &[&str]) {
    run_ok(ext4kit().args(args)).unwrap();
}

/// mkdir, cp -r of a tree, rm, fallocate, truncate with the image tools,
/// each a read-write open and clean close of a journal-less image: every
/// step leaves it clean for `e2fsck -fn` and "clean" in `s_state`, and
/// the files read back.
#[test]
fn image_tools_write_journal_less_images() {
    let what = "image_tools_write_journal_less_images";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    host_tree(&src);
    let mut failures = Vec::new();
    for block in ["4096", "1024"] {
        let res = (|| -> Result<(), String> {
            let img = image(dir.path(), &format!("nj{block}.img"), "64M", block);
            let i = img.to_str().unwrap();
            let check = |step: &str| -> Result<(), String> {
                e2fsck_clean(&img).map_err(|e| format!("after {step}: {e}"))?;
                match state(&img).as_str() {
                    "clean" => Ok(()),
                    s => Err(format!("after {step}: state {s:?}")),
                }
            };
            tool_ok(&["mkdir", "-p", &format!("{i}:/d/e")]);
            check("mkdir")?;
            tool_ok(&["cp", "-r", src.to_str().unwrap(), &format!("{i}:/d/")]);
            check("cp -r")?;
            tool_ok(&["rm", "-r", &format!("{i}:/d/src/a/b/c")]);
            tool_ok(&["rm", &format!("{i}:/d/src/a/b/f3")]);
            check("rm")?;
            tool_ok(&["fallocate", "-l", "2M", &format!("{i}:/d/e/pre")]);
            check("fallocate")?;
            tool_ok(&["truncate", "-s", "1000", &format!("{i}:/d/src/a/b/big")]);
            tool_ok(&["truncate", "-s", "5M", &format!("{i}:/d/e/pre")]);
            check("truncate")?;
            let out = run_ok(ext4kit().args(["cat", &format!("{i}:/d/src/a/b/big")]))?;
            if out.stdout != pattern(300_000, 1)[..1000] {
                return Err("big does not read back after truncate".into());
            }
            let out = run_ok(ext4kit().args(["cat", &format!("{i}:/d/src/a/b/f7")]))?;
            if out.stdout != pattern(7 * 97 + 1, 7) {
                return Err("f7 does not read back".into());
            }
            let out = run_ok(ext4kit().args(["ls", &format!("{i}:/d/src/a/b")]))?;
            let ls = String::from_utf8_lossy(&out.stdout);
            if ls.lines().any(|l| matches!(l.trim(), "c" | "f3")) {
                return Err(format!("removed entries still listed:\n{ls}"));
            }
            Ok(())
        })();
        report_case(&format!("{block}-byte blocks"), res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// ext2 (no extents, no journal): the engine does not write block-mapped
/// files; the refusal is one line, and the image stays clean.
#[test]
fn ext2_images_are_refused_with_one_line() {
    let what = "ext2_images_are_refused_with_one_line";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = dir.path().join("ext2.img");
    run_ok(tool("truncate").args(["-s", "16M"]).arg(&img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext2", "-U", UUID]).arg(&img)).unwrap();
    let out = run(ext4kit().args(["mkdir", &format!("{}:/d", img.display())])).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("block-mapped"), "{err}");
    e2fsck_clean(&img).unwrap();
    assert_eq!(state(&img), "clean");
}

/// The mount on a journal-less image: "not clean" while mounted, a small
/// workload, unmount, `e2fsck -fn` clean and "clean"; the kernel mounts
/// it and reads back the same tree.
#[test]
fn mount_writes_journal_less_images_the_kernel_reads_back() {
    let what = "mount_writes_journal_less_images_the_kernel_reads_back";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let kernel = kernel_mount_available();
    if let Err(e) = &kernel {
        eprintln!("note: {what}: no kernel read-back ({e})");
    }
    let dir = image_dir();
    let mut failures = Vec::new();
    for block in ["4096", "1024"] {
        let res = (|| -> Result<(), String> {
            let img = image(dir.path(), &format!("m{block}.img"), "64M", block);
            let m = FuseMount::new(&img, &[])?;
            let s = state(&img);
            if s != "not clean" {
                return Err(format!("state while mounted: {s:?}"));
            }
            host_tree(&m.path().join("t"));
            fs::rename(m.path().join("t/a/small"), m.path().join("t/small")).unwrap();
            fs::remove_file(m.path().join("t/a/b/f5")).unwrap();
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(m.path().join("t/a/b/c/mid"))
                .unwrap();
            f.write_all(&pattern(50_000, 9)).unwrap();
            f.sync_all().unwrap();
            drop(f);
            File::open(m.path()).unwrap().sync_all().unwrap();
            let s = state(&img);
            if s != "not clean" {
                return Err(format!("state after fsync: {s:?}"));
            }
            let ours = walk(&m.path().join("t"));
            m.unmount()?;
            e2fsck_clean(&img)?;
            let s = state(&img);
            if s != "clean" {
                return Err(format!("state after unmount: {s:?}"));
            }
            if kernel.is_ok() {
                let lo = LoopDev::attach(&img)?;
                let km = Mount::new(lo.path(), "ext4", Some("ro"))?;
                let theirs = walk(&km.path().join("t"));
                km.unmount()?;
                drop(lo);
                if theirs != ours {
                    return Err(format!(
                        "the kernel reads another tree:\nours {ours:#?}\nkernel {theirs:#?}"
                    ));
                }
            }
            // Mounted again by ext4kit: the same tree.
            let m = FuseMount::new(&img, &["ro"])?;
            let again = walk(&m.path().join("t"));
            m.unmount()?;
            if again != ours {
                return Err("a second mount reads another tree".into());
            }
            Ok(())
        })();
        report_case(&format!("{block}-byte blocks"), res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// kill -9 of the mount daemon in the middle of fsyncs: the image is "not
/// clean", `e2fsck -fy` repairs it, a second `e2fsck -fn` is clean, the
/// fsynced files are there, and it mounts read-write again.
#[test]
fn kill9_of_a_journal_less_mount_then_e2fsck_repairs() {
    let what = "kill9_of_a_journal_less_mount_then_e2fsck_repairs";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let mut failures = Vec::new();
    for block in ["4096", "1024"] {
        let res = (|| -> Result<(), String> {
            let img = image(dir.path(), &format!("k{block}.img"), "64M", block);
            let m = FuseMount::new(&img, &["commit=30"])?;
            let root = m.path().join("r");
            fs::create_dir(&root).unwrap();
            File::open(m.path()).unwrap().sync_all().unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<(String, usize)>();
            let r2 = root.clone();
            let worker = std::thread::spawn(move || {
                for i in 0..100_000usize {
                    let name = format!("file-{i}");
                    let len = (i * 7919) % 30_000 + 1;
                    let ok = (|| -> std::io::Result<()> {
                        let mut f = File::create(r2.join(&name))?;
                        f.write_all(&pattern(len, i as u64))?;
                        f.sync_all()
                    })();
                    if ok.is_err() || tx.send((name, len)).is_err() {
                        return;
                    }
                    let _ = fs::write(r2.join(format!("loose-{i}")), b"not synced");
                    let _ = fs::remove_file(r2.join(format!("loose-{}", i / 2)));
                }
            });
            let mut synced = Vec::new();
            while synced.len() < 5 {
                synced.push(
                    rx.recv_timeout(Duration::from_secs(60))
                        .map_err(|e| e.to_string())?,
                );
            }
            std::thread::sleep(Duration::from_millis(150));
            m.kill9();
            let _ = worker.join();
            synced.extend(rx.try_iter());
            let s = state(&img);
            if s != "not clean" {
                return Err(format!("state after kill -9: {s:?}"));
            }
            // e2fsck -fy: 0 (nothing to fix) or 1 (fixed).
            let out = run(tool("e2fsck").arg("-fy").arg(&img))?;
            if !matches!(out.status.code(), Some(0 | 1)) {
                return Err(format!(
                    "e2fsck -fy: {}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
            e2fsck_clean(&img)?;
            let m = FuseMount::new(&img, &[])?;
            for (name, len) in &synced {
                let i: usize = name[5..].parse().unwrap();
                let got = fs::read(root_of(&m).join(name)).map_err(|e| format!("{name}: {e}"))?;
                if got != pattern(*len, i as u64) {
                    return Err(format!("{name} does not read back"));
                }
            }
            fs::create_dir(m.path().join("after")).unwrap();
            fs::write(m.path().join("after/x"), pattern(10_000, 3)).unwrap();
            m.unmount()?;
            e2fsck_clean(&img)?;
            Ok(())
        })();
        report_case(&format!("{block}-byte blocks"), res, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn root_of(m: &FuseMount) -> PathBuf {
    m.path().join("r")
}

/// Power cuts on the fault-injecting device (every unflushed write lost,
/// or a seeded subset surviving, torn at sectors) during a workload of
/// the engine: the cut image is "not clean", `e2fsck -fy` repairs it, a
/// second `e2fsck -fn` is clean, and the engine writes it again.
#[test]
fn power_cuts_of_a_journal_less_image_then_e2fsck_repairs() {
    let what = "power_cuts_of_a_journal_less_image_then_e2fsck_repairs";
    if let Err(e) = e2fs_tools() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let mut failures = Vec::new();
    for block in ["4096", "1024"] {
        let base = image(dir.path(), &format!("p{block}.img"), "16M", block);
        for (k, cut_after) in [40u64, 150, 400, 900].into_iter().enumerate() {
            let mode = match k % 3 {
                0 => CutMode::DropAll,
                1 => CutMode::Subset {
                    seed: cut_after,
                    torn: false,
                },
                _ => CutMode::Subset {
                    seed: cut_after,
                    torn: true,
                },
            };
            let res = (|| -> Result<(), String> {
                let img = dir.path().join(format!("cut{block}-{cut_after}.img"));
                sparse_copy(&base, &img);
                let fault = Arc::new(FaultDevice::new(open_file(&img)));
                let ctl = fault.control();
                ctl.set_cut_mode(mode);
                let dev: Arc<dyn Device> = fault.clone();
                let fs = Filesystem::open(dev, RwOptions::default()).map_err(|e| e.to_string())?;
                ctl.power_cut_after(cut_after);
                let dir_spec = NewInode::new(S_IFDIR | 0o755, 0, 0);
                let file_spec = NewInode::new(S_IFREG | 0o644, 0, 0);
                let _ = (|| -> Result<(), ext4kit_fs::FsError> {
                    for i in 0..200u32 {
                        let d = fs.mkdir(ROOT, format!("d{i}").as_bytes(), &dir_spec)?.0.ino;
                        for j in 0..4u32 {
                            let f = fs.create(d, format!("f{j}").as_bytes(), &file_spec)?.0.ino;
                            fs.write_at(f, 0, &pattern(((i * 4 + j) as usize % 7) * 3000 + 1, 1))?;
                        }
                        if i % 3 == 0 {
                            fs.unlink(d, b"f1")?;
                        }
                        if i % 2 == 0 {
                            fs.sync()?;
                        }
                    }
                    Ok(())
                })();
                if !ctl.is_power_lost() {
                    return Err(format!("the workload ended before op {cut_after}"));
                }
                fs.crash();
                drop(fault);
                let s = state(&img);
                if s != "not clean" {
                    return Err(format!("state after the cut: {s:?}"));
                }
                let out = run(tool("e2fsck").arg("-fy").arg(&img))?;
                if !matches!(out.status.code(), Some(0 | 1)) {
                    return Err(format!(
                        "e2fsck -fy: {}\n{}",
                        out.status,
                        String::from_utf8_lossy(&out.stdout)
                    ));
                }
                e2fsck_clean(&img)?;
                let i = img.to_str().unwrap();
                run_ok(ext4kit().args(["mkdir", "-p", &format!("{i}:/again/x")]))?;
                run_ok(ext4kit().args(["fallocate", "-l", "100K", &format!("{i}:/again/x/y")]))?;
                e2fsck_clean(&img)?;
                if state(&img) != "clean" {
                    return Err("not clean after a clean close".into());
                }
                Ok(())
            })();
            report_case(
                &format!("{block} cut after {cut_after} {mode:?}"),
                res,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

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

/// What assumed a journal, on a journal-less mount: online lazy init
/// (`ITABLE_ZEROED` committed after the zeros) and a file unlinked while
/// open (on the orphan list until closed): the image is clean after the
/// unmount, every table zeroed, the space of the unlinked file back.
#[test]
fn lazy_init_and_unlinked_open_files_on_a_journal_less_mount() {
    let what = "lazy_init_and_unlinked_open_files_on_a_journal_less_mount";
    if let Err(e) = fuse_available() {
        return skip(what, &e);
    }
    let dir = image_dir();
    let img = dir.path().join("lazy.img");
    {
        // Stale bytes under the tables: what zeroing must clear.
        let mut f = File::create(&img).unwrap();
        let chunk = vec![0xAAu8; 1 << 20];
        for _ in 0..64 {
            f.write_all(&chunk).unwrap();
        }
    }
    run_ok(&mut mke2fs([
        "-q",
        "-F",
        "-t",
        "ext4",
        "-O",
        "^has_journal",
        "-b",
        "4096",
        "-g",
        "4096",
        "-E",
        "lazy_itable_init=1,nodiscard",
        img.to_str().unwrap(),
    ]))
    .unwrap();
    let (_, left) = zeroed_groups(&img);
    assert!(left >= 3, "groups left for lazy init: {left}");
    let m = FuseMount::new(&img, &["init_itable=0"]).unwrap();
    let p = m.path().join("open-unlinked");
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_all(&pattern(1 << 20, 4)).unwrap();
    fs::remove_file(&p).unwrap();
    for i in 0..50 {
        fs::write(m.path().join(format!("f{i}")), pattern(3000, i)).unwrap();
    }
    f.sync_all().unwrap();
    use std::io::{Read, Seek};
    f.rewind().unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == pattern(1 << 20, 4), "the unlinked file reads back");
    drop(f);
    wait_until("lazy init", Duration::from_secs(30), || {
        run_ok(ext4kit().args(["status", "--json"]).arg(m.path()))
            .ok()
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .is_some_and(|v| v["lazyinit"]["status"]["state"] == "done")
    })
    .unwrap();
    assert_eq!(state(&img), "not clean");
    m.unmount().unwrap();
    assert_eq!(zeroed_groups(&img).1, 0, "groups not zeroed");
    e2fsck_clean(&img).unwrap();
    assert_eq!(state(&img), "clean");
    let m = FuseMount::new(&img, &["ro"]).unwrap();
    for i in 0..50 {
        assert_eq!(
            fs::read(m.path().join(format!("f{i}"))).unwrap(),
            pattern(3000, i),
            "f{i}"
        );
    }
    assert!(!m.path().join("open-unlinked").exists());
    m.unmount().unwrap();
}
