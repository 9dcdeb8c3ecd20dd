//! The operations layer (`ext4kit_fs::fs::Filesystem`) against the real
//! tools: files ext4kit creates and writes (holes, overwrites, unaligned
//! ends, fragmented files with depth-2 extent trees, truncates) are read
//! back identical by debugfs after being linked with `debugfs ln`, and
//! `e2fsck -fn` stays clean; deleted files give every block and inode
//! back; a power cut at every write of a small workload recovers to a
//! committed state that e2fsck accepts.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use ext4kit_device::{CutMode, Device, MemDevice};
use ext4kit_format::inode::S_IFREG;
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode, SetAttr, Times};
use ext4kit_fs::inode::Timestamp;
use ext4kit_fs::rw::RwOptions;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn new_file(fs: &Filesystem) -> u32 {
    let mut op = fs.begin(2, 2).unwrap();
    let spec = NewInode {
        mode: S_IFREG | 0o640,
        uid: 1234,
        gid: 56,
        links: 1,
        time: None,
        rdev: None,
    };
    let i = fs.create_inode(&mut op, 2, &spec).unwrap();
    fs.finish(op).unwrap();
    i.ino
}

fn debugfs(img: &Path, write: bool, cmd: &str) -> Vec<u8> {
    let mut c = tool("debugfs");
    if write {
        c.arg("-w");
    }
    let out = run_ok(c.arg("-R").arg(cmd).arg(img)).unwrap();
    out.stdout
}

/// Files of one scenario: (name, expected content).
fn scenario(fs: &Filesystem, bs: u64) -> Vec<(u32, Vec<u8>)> {
    let mut files = Vec::new();
    // Unaligned write, overwrite inside it, hole at the start.
    let a = new_file(fs);
    let mut want = vec![0u8; 3000];
    want.extend(pattern(50_000, 1));
    fs.write_at(a, 3000, &want[3000..]).unwrap();
    let b = pattern(7000, 2);
    fs.write_at(a, 10_000, &b).unwrap();
    want[10_000..17_000].copy_from_slice(&b);
    files.push((a, want));
    // Fragmented: every other block, 420 extents (a deep tree), then cut.
    let f = new_file(fs);
    let mut want = Vec::new();
    for k in 0..420u64 {
        let d = pattern(bs as usize, 100 + k);
        fs.write_at(f, 2 * k * bs, &d).unwrap();
        want.resize((2 * k * bs) as usize, 0);
        want.extend(d);
    }
    fs.truncate(f, 300 * bs + 77).unwrap();
    want.truncate((300 * bs + 77) as usize);
    files.push((f, want));
    // Sparse growth, a big write across several handles.
    let s = new_file(fs);
    let big = pattern(5 << 20, 3);
    fs.write_at(s, 1 << 20, &big).unwrap();
    fs.truncate(s, 8 << 20).unwrap();
    let mut want = vec![0u8; 1 << 20];
    want.extend(big);
    want.resize(8 << 20, 0);
    files.push((s, want));
    // fallocate: default (unwritten, size grows), a write into the
    // unwritten range, KEEP_SIZE past the end, a punched hole, a zeroed
    // range (unaligned ends), and a write into the zeroed range.
    let u = new_file(fs);
    fs.fallocate(u, 0, 40 * bs + 5, Falloc::default()).unwrap();
    let mut want = vec![0u8; (40 * bs + 5) as usize];
    let w = pattern((10 * bs) as usize, 5);
    fs.write_at(u, 3 * bs + 100, &w).unwrap();
    want[(3 * bs + 100) as usize..(13 * bs + 100) as usize].copy_from_slice(&w);
    let keep = Falloc {
        keep_size: true,
        ..Falloc::default()
    };
    fs.fallocate(u, 40 * bs, 100 * bs, keep).unwrap();
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    fs.fallocate(u, 4 * bs + 7, 3 * bs, punch).unwrap();
    want[(4 * bs + 7) as usize..(7 * bs + 7) as usize].fill(0);
    let zero = Falloc {
        zero_range: true,
        ..Falloc::default()
    };
    fs.fallocate(u, 9 * bs + 1, 2 * bs + 10, zero).unwrap();
    want[(9 * bs + 1) as usize..(11 * bs + 11) as usize].fill(0);
    fs.write_at(u, 10 * bs, b"x").unwrap();
    want[(10 * bs) as usize] = b'x';
    files.push((u, want));
    // setattr: mode, owner (32-bit ids), times with nanoseconds past 2038
    // and before 1970, size.
    let t = new_file(fs);
    fs.write_at(t, 0, &pattern(5000, 6)).unwrap();
    let ts = |sec, nsec| Some(Timestamp { sec, nsec });
    let a = SetAttr {
        mode: Some(0o4751),
        uid: Some(70_000),
        gid: Some(80_001),
        size: Some(3000),
        times: Some(Times {
            atime: ts(-12_345, 999_999_999),
            mtime: ts(4_000_000_000, 123_456_789),
            ctime: None,
            crtime: None,
        }),
    };
    fs.setattr(t, &a).unwrap();
    let mut want = pattern(5000, 6);
    want.truncate(3000);
    files.push((t, want));
    // Created then deleted: everything given back.
    let d = new_file(fs);
    fs.write_at(d, 0, &pattern(300_000, 4)).unwrap();
    fs.delete_inode(d).unwrap();
    files
}

fn check_case(dir: &Path, name: &str, args: &[&str]) {
    let img = mkimg(dir, name, "64M", args);
    let before = e2fsck_clean(&img).unwrap();
    let bs = fs_block_size(&img).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let files = scenario(&fs, bs);
    fs.close().unwrap();
    for (k, (ino, _)) in files.iter().enumerate() {
        debugfs(&img, true, &format!("ln <{ino}> /f{k}"));
    }
    let after = e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        used_inodes(&after),
        used_inodes(&before).map(|n| n + files.len() as u64),
        "{name}"
    );
    for (k, (_, want)) in files.iter().enumerate() {
        let got = debugfs(&img, false, &format!("cat /f{k}"));
        assert!(
            got == *want,
            "{name}: /f{k} differs ({} vs {} bytes)",
            got.len(),
            want.len()
        );
    }
    // ext4kit reads back the same through a fresh open.
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    for (ino, want) in &files {
        let mut got = vec![0u8; want.len()];
        assert_eq!(fs.read_at(*ino, 0, &mut got).unwrap(), want.len());
        assert!(got == *want, "{name}: inode {ino}");
    }
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// As root with loop devices: the kernel mounts what ext4kit wrote and
/// reads the same bytes and stat fields; after the kernel appends to
/// and truncates the files and unmounts, e2fsck is clean and ext4kit
/// reads what the kernel wrote.
#[test]
fn kernel_reads_what_ext4kit_wrote() {
    let name = "kernel_reads_what_ext4kit_wrote";
    if let Err(r) = e2fs_tools().and_then(|_| kernel_mount_available()) {
        return skip(name, &r);
    }
    let dir = image_dir();
    for (img_name, args) in [
        ("k4.img", &["-b", "4096"][..]),
        ("k1.img", &["-b", "1024"][..]),
    ] {
        let img = mkimg(dir.path(), img_name, "64M", args);
        let bs = fs_block_size(&img).unwrap();
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let files = scenario(&fs, bs);
        let stats: Vec<_> = files.iter().map(|(i, _)| fs.inode(*i).unwrap()).collect();
        fs.close().unwrap();
        for (k, (ino, _)) in files.iter().enumerate() {
            debugfs(&img, true, &format!("ln <{ino}> /f{k}"));
        }
        {
            let lo = LoopDev::attach(&img).unwrap();
            let m = Mount::new(lo.path(), "ext4", Some("noatime")).unwrap();
            for (k, ((_, want), st)) in files.iter().zip(&stats).enumerate() {
                let p = m.path().join(format!("f{k}"));
                let got = fs::read(&p).unwrap();
                assert!(got == *want, "{img_name}: f{k} content");
                let md = fs::symlink_metadata(&p).unwrap();
                assert_eq!(md.mode(), u32::from(st.mode), "f{k} mode");
                assert_eq!((md.uid(), md.gid()), (st.uid, st.gid), "f{k} owner");
                assert_eq!(md.size(), st.size, "f{k} size");
                assert_eq!(md.blocks(), st.blocks_512, "f{k} blocks");
                assert_eq!(
                    (md.mtime(), md.mtime_nsec() as u32),
                    (st.mtime.sec, st.mtime.nsec)
                );
                assert_eq!(
                    (md.atime(), md.atime_nsec() as u32),
                    (st.atime.sec, st.atime.nsec)
                );
                assert_eq!(
                    (md.ctime(), md.ctime_nsec() as u32),
                    (st.ctime.sec, st.ctime.nsec)
                );
                // The kernel writes on: an append and a truncate.
                let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
                std::io::Write::write_all(&mut f, b"kernel").unwrap();
                drop(f);
            }
            fs::OpenOptions::new()
                .write(true)
                .open(m.path().join("f0"))
                .unwrap()
                .set_len(1000)
                .unwrap();
            m.unmount().unwrap();
        }
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{img_name} after the kernel: {e}"));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        for (k, (ino, want)) in files.iter().enumerate() {
            let mut want = want.clone();
            want.extend_from_slice(b"kernel");
            if k == 0 {
                want.truncate(1000);
            }
            let mut got = vec![0u8; want.len() + 10];
            assert_eq!(fs.read_at(*ino, 0, &mut got).unwrap(), want.len());
            assert!(
                got[..want.len()] == want[..],
                "{img_name}: f{k} after the kernel"
            );
            // And ext4kit writes on top of the kernel's writes.
            fs.write_at(*ino, 0, b"again").unwrap();
        }
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap();
    }
}

#[test]
fn written_files_read_back_by_debugfs_and_e2fsck_clean() {
    if let Err(r) = e2fs_tools() {
        return skip("written_files_read_back_by_debugfs_and_e2fsck_clean", &r);
    }
    let dir = image_dir();
    check_case(dir.path(), "4k.img", &["-b", "4096"]);
    check_case(dir.path(), "1k.img", &["-b", "1024"]);
    check_case(
        dir.path(),
        "1k-nocsum.img",
        &["-b", "1024", "-O", "^metadata_csum,uninit_bg"],
    );
    check_case(
        dir.path(),
        "4k-32bit-noflex.img",
        &["-b", "4096", "-O", "^64bit,^flex_bg,^metadata_csum"],
    );
}

/// A power cut at every write of: create + write + commit, overwrite +
/// grow + commit, truncate + commit, delete + commit. After recovery the
/// file is in a committed state no older than the last commit that
/// returned, and e2fsck is clean once the file is linked.
#[test]
fn crash_at_every_write_recovers_a_committed_state() {
    if let Err(r) = e2fs_tools() {
        return skip("crash_at_every_write_recovers_a_committed_state", &r);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "c.img", "16M", &["-b", "1024"]);
    let base = fs::read(&img).unwrap();
    let states: [Option<Vec<u8>>; 5] = {
        let a = pattern(20_000, 9);
        let mut b = a.clone();
        b[5000..9000].copy_from_slice(&pattern(4000, 10));
        b.extend(pattern(3000, 11));
        let mut c = b.clone();
        c.truncate(7777);
        [None, Some(a), Some(b), Some(c), None]
    };
    let run = |dev: Arc<dyn Device>, returned: &mut usize| -> Result<u32, String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        let mut op = fs.begin(2, 2).map_err(e)?;
        let spec = NewInode {
            mode: S_IFREG | 0o600,
            uid: 0,
            gid: 0,
            links: 1,
            time: None,
            rdev: None,
        };
        let ino = fs.create_inode(&mut op, 2, &spec).map_err(e)?.ino;
        fs.finish(op).map_err(e)?;
        fs.write_at(ino, 0, states[1].as_ref().unwrap())
            .map_err(e)?;
        fs.sync().map_err(e)?;
        *returned = 1;
        fs.write_at(ino, 5000, &pattern(4000, 10)).map_err(e)?;
        fs.write_at(ino, 20_000, &pattern(3000, 11)).map_err(e)?;
        fs.sync().map_err(e)?;
        *returned = 2;
        fs.truncate(ino, 7777).map_err(e)?;
        fs.sync().map_err(e)?;
        *returned = 3;
        fs.delete_inode(ino).map_err(e)?;
        fs.sync().map_err(e)?;
        *returned = 4;
        fs.close().map_err(e)?;
        Ok(ino)
    };
    let base = MemDevice::from_bytes(base);
    let one = |cut: Option<u64>, mode: CutMode| {
        let (mem, (returned, r), ops) = run_cut(&base, cut, mode, |d| {
            let mut returned = 0;
            let r = run(d, &mut returned);
            (returned, r)
        });
        (mem, returned, r, ops)
    };
    // A clean run: its inode number and how many writes it makes.
    let (_, returned, r, ops) = one(None, CutMode::DropAll);
    assert_eq!(returned, 4);
    let ino = r.unwrap();
    let step = (ops / 60).max(1);
    let mut checked = 0;
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 7,
            torn: false,
        },
    ] {
        for cut in (1..ops).step_by(step as usize) {
            let (mem, returned, _, _) = one(Some(cut), mode);
            // Recover with ext4kit, then look at the file.
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            let got = fs.inode(ino).ok().filter(|i| i.links > 0).map(|i| {
                let mut v = vec![0u8; i.size as usize];
                fs.read_at(ino, 0, &mut v).unwrap();
                v
            });
            fs.close().unwrap();
            // Ordered data: overwrites of a file's own blocks (and the
            // zeroing of a truncated block's tail) go in place before
            // their commit, as the kernel's do, so a byte of committed
            // state k may already show the next state's byte or zero.
            let fits = |k: usize| match (&states[k], &got) {
                (None, None) => true,
                (Some(s), Some(g)) => {
                    let next = states.get(k + 1).cloned().flatten().unwrap_or_default();
                    s.len() == g.len()
                        && g.iter()
                            .enumerate()
                            .all(|(i, &b)| b == s[i] || b == 0 || next.get(i) == Some(&b))
                }
                _ => false,
            };
            assert!(
                (returned..states.len()).any(fits),
                "cut {cut} {mode:?}: a state older than the last returned commit ({returned}) or never committed"
            );
            let out = dir.path().join("cut.img");
            fs::write(&out, mem.to_bytes()).unwrap();
            if got.is_some() {
                debugfs(&out, true, &format!("ln <{ino}> /f"));
            }
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 10);
}

/// Random sequences of write, truncate, fallocate (all modes), setattr,
/// delete and sync over a few files, against an in-memory model: after
/// each sequence every file's bytes, size and mode equal the model's, the
/// filesystem closes cleanly and e2fsck is clean (files linked with
/// debugfs). `EXT4KIT_OPS_MODEL=N` runs N sequences (default 6).
#[test]
fn random_sequences_match_the_model() {
    let name = "random_sequences_match_the_model";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let runs: u64 = std::env::var("EXT4KIT_OPS_MODEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let dir = image_dir();
    let base = mkimg(dir.path(), "base.img", "32M", &["-b", "1024"]);
    for run in 0..runs {
        let img = dir.path().join("m.img");
        run_ok(tool("cp").arg("--sparse=always").arg(&base).arg(&img)).unwrap();
        let mut rng = Rng(0x5EED ^ (run + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        // (ino, content, mode)
        let mut model: Vec<(u32, Vec<u8>, u16)> =
            (0..3).map(|_| (new_file(&fs), Vec::new(), 0o640)).collect();
        let ops = 40;
        for step in 0..ops {
            let k = rng.below(model.len() as u64) as usize;
            let (ino, ref mut data, ref mut mode) = model[k];
            let max = 300_000u64;
            let ctx = format!("run {run} step {step} file {k}");
            match rng.below(10) {
                0..=3 => {
                    let off = rng.below(max);
                    let len = 1 + rng.below(40_000) as usize;
                    let d = pattern(len, rng.next());
                    fs.write_at(ino, off, &d)
                        .unwrap_or_else(|e| panic!("{ctx}: write: {e}"));
                    let end = off as usize + len;
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[off as usize..end].copy_from_slice(&d);
                }
                4 => {
                    let size = rng.below(max);
                    fs.truncate(ino, size)
                        .unwrap_or_else(|e| panic!("{ctx}: truncate: {e}"));
                    data.resize(size as usize, 0);
                }
                5..=7 => {
                    let off = rng.below(max);
                    let len = 1 + rng.below(60_000);
                    let (keep, punch, zero) = match rng.below(4) {
                        0 => (false, false, false),
                        1 => (true, false, false),
                        2 => (true, true, false),
                        _ => (rng.below(2) == 0, false, true),
                    };
                    let m = Falloc {
                        keep_size: keep,
                        punch_hole: punch,
                        zero_range: zero,
                    };
                    fs.fallocate(ino, off, len, m)
                        .unwrap_or_else(|e| panic!("{ctx}: fallocate {m:?}: {e}"));
                    let end = (off + len) as usize;
                    if punch || zero {
                        let e = end.min(data.len());
                        if (off as usize) < e {
                            data[off as usize..e].fill(0);
                        }
                    }
                    if !keep && data.len() < end {
                        data.resize(end, 0);
                    }
                }
                8 => {
                    let m = (rng.below(0o7777) as u16) & 0o777;
                    let a = SetAttr {
                        mode: Some(m),
                        ..SetAttr::default()
                    };
                    fs.setattr(ino, &a).unwrap();
                    *mode = m;
                }
                _ => {
                    if rng.below(3) == 0 {
                        fs.delete_inode(ino)
                            .unwrap_or_else(|e| panic!("{ctx}: delete: {e}"));
                        model[k] = (new_file(&fs), Vec::new(), 0o640);
                    } else {
                        fs.sync().unwrap();
                    }
                }
            }
        }
        for (k, (ino, data, mode)) in model.iter().enumerate() {
            let i = fs.inode(*ino).unwrap();
            assert_eq!(i.size, data.len() as u64, "run {run} file {k} size");
            assert_eq!(i.mode & 0o7777, *mode, "run {run} file {k} mode");
            let mut got = vec![0u8; data.len()];
            fs.read_at(*ino, 0, &mut got).unwrap();
            assert!(got == *data, "run {run} file {k} content");
        }
        fs.close().unwrap();
        for (k, (ino, _, _)) in model.iter().enumerate() {
            debugfs(&img, true, &format!("ln <{ino}> /f{k}"));
        }
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("run {run}: {e}"));
        for (k, (_, data, _)) in model.iter().enumerate() {
            assert!(
                debugfs(&img, false, &format!("cat /f{k}")) == *data,
                "run {run} f{k} by debugfs"
            );
        }
    }
}

fn stat_line(img: &Path, path: &str) -> String {
    String::from_utf8_lossy(&debugfs(img, false, &format!("stat {path}"))).into_owned()
}

/// `ext4kit chmod/chown/truncate/fallocate` on files `mke2fs -d` put in an
/// image: the changes are what coreutils/util-linux would make, the image
/// is clean after each command, and a failing command names the path,
/// exits 1 and leaves the image as it was.
#[test]
fn attribute_and_size_tools() {
    if let Err(r) = e2fs_tools() {
        return skip("attribute_and_size_tools", &r);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("f"), pattern(100_000, 1)).unwrap();
    fs::write(src.join("d/g"), b"hello").unwrap();
    std::os::unix::fs::symlink("f", src.join("l")).unwrap();
    let img = dir.path().join("t.img");
    run_ok(tool("truncate").args(["-s", "32M"]).arg(&img)).unwrap();
    run_ok(
        mke2fs(["-q", "-F", "-t", "ext4", "-b", "1024", "-d"])
            .arg(&src)
            .arg(&img),
    )
    .unwrap();
    let at = |p: &str| format!("{}:{p}", img.display());
    let ok = |args: &[&str], p: &str| {
        run_ok(ext4kit().args(args).arg(at(p))).unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{args:?} {p}: {e}"));
    };
    ok(&["chmod", "4751"], "/f");
    assert!(
        stat_line(&img, "/f").contains("Mode:  04751"),
        "{}",
        stat_line(&img, "/f")
    );
    ok(&["chmod", "go-rx,u-s"], "/l"); // follows the symlink
    assert!(
        stat_line(&img, "/f").contains("Mode:  0700"),
        "{}",
        stat_line(&img, "/f")
    );
    ok(&["chown", "70000:4242"], "/d/g");
    let s = stat_line(&img, "/d/g");
    assert!(
        s.contains("User: 70000") && s.contains("Group:  4242"),
        "{s}"
    );
    ok(&["truncate", "-s", "10K"], "/f");
    let mut want = pattern(100_000, 1);
    want.truncate(10_240);
    assert_eq!(debugfs(&img, false, "cat /f"), want);
    ok(&["truncate", "-s", "+1M"], "/f");
    want.resize(10_240 + (1 << 20), 0);
    assert_eq!(debugfs(&img, false, "cat /f"), want);
    ok(&["fallocate", "-o", "1K", "-l", "2K", "-p"], "/f");
    want[1024..3072].fill(0);
    assert_eq!(debugfs(&img, false, "cat /f"), want);
    ok(&["fallocate", "-l", "4M", "-n"], "/d/g");
    assert_eq!(debugfs(&img, false, "cat /d/g"), b"hello");
    ok(&["fallocate", "-o", "2", "-l", "2", "-z"], "/d/g");
    assert_eq!(debugfs(&img, false, "cat /d/g"), b"he\0\0o");
    ok(&["fallocate", "-l", "8M"], "/d/g");
    assert!(stat_line(&img, "/d/g").contains("Size: 8388608"));
    // Failures: one line naming the operand, exit 1, image unchanged.
    let before = file_hash(&img).unwrap();
    for (args, p, msg) in [
        (&["chmod", "644"][..], "/nope", "cannot access"),
        (&["truncate", "-s", "1"][..], "/d", "Is a directory"),
        (&["chown", "1:1"][..], "/d/g/x", "Not a directory"),
        (&["fallocate", "-l", "1K"][..], "/d", "Is a directory"),
    ] {
        let out = run(ext4kit().args(args).arg(at(p))).unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(msg) && err.contains(p), "{args:?}: {err}");
    }
    let out = run(ext4kit().args(["chmod", "u*x"]).arg(at("/f"))).unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid mode"));
    // A refused open writes nothing either (the hash covers the journal).
    assert_eq!(file_hash(&img).unwrap(), before);
    e2fsck_clean(&img).unwrap();
}

/// xattrs and ACLs through the operations layer (xattr_write on a
/// journal handle + the block allocator): in-inode and block values, an
/// access ACL that a chmod keeps in sync, removal, delete releasing the
/// block; getfattr/getfacl through the kernel (as root) and e2fsck agree.
#[test]
fn xattrs_through_the_operations_layer() {
    if let Err(r) = e2fs_tools() {
        return skip("xattrs_through_the_operations_layer", &r);
    }
    use ext4kit_fs::xattr_write::SetMode;
    let dir = image_dir();
    let img = mkimg(dir.path(), "x.img", "32M", &["-b", "1024"]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let f = new_file(&fs);
    fs.write_at(f, 0, b"data").unwrap();
    fs.set_xattr(f, b"user.small", Some(b"v1"), SetMode::Any)
        .unwrap();
    let big = pattern(700, 3);
    fs.set_xattr(f, b"user.big", Some(&big), SetMode::Any)
        .unwrap();
    assert!(
        fs.set_xattr(f, b"user.small", Some(b"x"), SetMode::Create)
            .is_err()
    );
    assert!(fs.set_xattr(f, b"user.none", None, SetMode::Any).is_err());
    // An ACL with a named user: kept as an xattr, mode from it.
    // posix_acl_xattr: version 2, then (tag, perm, id) entries.
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, 4, 1000),
        (4, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    fs.set_xattr(f, b"system.posix_acl_access", Some(&acl), SetMode::Any)
        .unwrap();
    assert_eq!(fs.inode(f).unwrap().mode & 0o777, 0o640);
    // chmod follows into the ACL (mask = group bits).
    let a = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    fs.setattr(f, &a).unwrap();
    let attrs = fs.xattrs(f).unwrap();
    let got = attrs
        .iter()
        .find(|x| x.name == b"system.posix_acl_access")
        .unwrap();
    assert_eq!(got.value.len(), acl.len());
    // The mask entry (tag 0x10) now has perm 0.
    assert_eq!(&got.value[4 + 3 * 8..4 + 3 * 8 + 4], &[0x10, 0, 0, 0]);
    let g = new_file(&fs);
    fs.set_xattr(g, b"user.big", Some(&big), SetMode::Any)
        .unwrap();
    fs.set_xattr(g, b"trusted.t", Some(b"tt"), SetMode::Any)
        .unwrap();
    fs.set_xattr(g, b"user.big", None, SetMode::Any).unwrap();
    let gone = new_file(&fs);
    fs.set_xattr(gone, b"user.big", Some(&pattern(900, 8)), SetMode::Any)
        .unwrap();
    assert_ne!(fs.inode(gone).unwrap().file_acl, 0);
    fs.delete_inode(gone).unwrap();
    fs.close().unwrap();
    debugfs(&img, true, &format!("ln <{f}> /f"));
    debugfs(&img, true, &format!("ln <{g}> /g"));
    e2fsck_clean(&img).unwrap();
    let ea = String::from_utf8_lossy(&debugfs(&img, false, "ea_list /f")).into_owned();
    assert!(ea.contains("user.small") && ea.contains("user.big"), "{ea}");
    let ea = String::from_utf8_lossy(&debugfs(&img, false, "ea_list /g")).into_owned();
    assert!(ea.contains("trusted.t") && !ea.contains("user.big"), "{ea}");
    if kernel_mount_available().is_err() || !have("getfacl") {
        return skip(
            "xattrs_through_the_operations_layer (kernel part)",
            "no root, loop or getfacl",
        );
    }
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("noatime")).unwrap();
    let out = run_ok(
        tool("getfacl")
            .args(["-n", "--omit-header"])
            .arg(m.path().join("f")),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("user:1000:r--") && text.contains("mask::---"),
        "{text}"
    );
    if have("getfattr") {
        let out = run_ok(
            tool("getfattr")
                .args(["-n", "user.small", "--only-values"])
                .arg(m.path().join("f")),
        )
        .unwrap();
        assert_eq!(out.stdout, b"v1");
    }
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
}

/// Symlinks (fast below 60 bytes, one block above) and device nodes made
/// by the operations layer: e2fsck clean, debugfs and (as root) the
/// kernel read the same targets and device numbers.
#[test]
fn symlinks_and_devices() {
    if let Err(r) = e2fs_tools() {
        return skip("symlinks_and_devices", &r);
    }
    use ext4kit_format::inode::{S_IFBLK, S_IFCHR, S_IFIFO, S_IFSOCK};
    let dir = image_dir();
    for (name, args) in [
        ("s4.img", &["-b", "4096"][..]),
        ("s1.img", &["-b", "1024", "-O", "^metadata_csum"][..]),
    ] {
        let img = mkimg(dir.path(), name, "32M", args);
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let long: Vec<u8> = (0..300).map(|i| b'a' + (i % 26) as u8).collect();
        let mut made = Vec::new();
        let mut op = fs.begin(8, 2).unwrap();
        for (n, target) in [
            ("short", &b"f"[..]),
            ("fifty9", &[b'x'; 59][..]),
            ("sixty", &[b'y'; 60][..]),
            ("long", &long[..]),
        ] {
            let i = fs
                .create_symlink(&mut op, 2, target, &NewInode::new(0, 7, 8))
                .unwrap();
            made.push((n, i.ino, target.to_vec()));
        }
        let mut devs = Vec::new();
        for (n, mode, rdev) in [
            ("c", S_IFCHR | 0o600, Some((4, 64))),
            ("b", S_IFBLK | 0o660, Some((259, 70_000))),
            ("p", S_IFIFO | 0o644, None),
            ("s", S_IFSOCK | 0o755, None),
        ] {
            let spec = NewInode {
                rdev,
                ..NewInode::new(mode, 0, 0)
            };
            devs.push((
                n,
                fs.create_inode(&mut op, 2, &spec).unwrap().ino,
                mode,
                rdev,
            ));
        }
        fs.finish(op).unwrap();
        fs.close().unwrap();
        for (n, ino, _) in &made {
            debugfs(&img, true, &format!("ln <{ino}> /{n}"));
        }
        for (n, ino, _, _) in &devs {
            debugfs(&img, true, &format!("ln <{ino}> /{n}"));
        }
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        for (n, ino, target) in &made {
            let i = fs.inode(*ino).unwrap();
            assert_eq!(fs.read(|f| f.read_link(&i)).unwrap(), *target, "{name} {n}");
            assert_eq!(i.has_extents(), target.len() >= 60, "{name} {n}");
        }
        for (n, ino, _, rdev) in &devs {
            if let Some(r) = rdev {
                assert_eq!(fs.inode(*ino).unwrap().rdev(), *r, "{name} {n}");
            }
        }
        fs.close().unwrap();
        if kernel_mount_available().is_err() {
            continue;
        }
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", Some("noatime")).unwrap();
        for (n, _, target) in &made {
            let got = fs::read_link(m.path().join(n)).unwrap();
            assert_eq!(
                got.as_os_str().as_encoded_bytes(),
                &target[..],
                "{name} {n}"
            );
        }
        for (n, _, mode, rdev) in &devs {
            let md = fs::symlink_metadata(m.path().join(n)).unwrap();
            assert_eq!(md.mode(), u32::from(*mode), "{name} {n}");
            if let Some((ma, mi)) = rdev {
                let d = md.rdev();
                let (kma, kmi) = (
                    ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
                    (d & 0xff) | ((d >> 12) & !0xff),
                );
                assert_eq!((kma as u32, kmi as u32), (*ma, *mi), "{name} {n}");
            }
        }
        m.unmount().unwrap();
        drop(lo);
        e2fsck_clean(&img).unwrap();
    }
}

/// `ext4kit cp`: image to host (-r, -a keeping mode, times, xattrs, hard
/// links, holes, symlinks, fifos) equals the tree `mke2fs -d` was made
/// from; host to image into an existing file replaces its content and
/// leaves the image clean; refusals write nothing.
#[test]
fn cp_between_image_and_host() {
    if let Err(r) = e2fs_tools() {
        return skip("cp_between_image_and_host", &r);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d/e")).unwrap();
    fs::write(src.join("f"), pattern(70_000, 1)).unwrap();
    fs::write(src.join("d/e/g"), b"deep").unwrap();
    {
        let f = fs::File::create(src.join("sparse")).unwrap();
        f.set_len(10 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&f, b"tail", (10 << 20) - 4).unwrap();
    }
    fs::hard_link(src.join("f"), src.join("d/f-link")).unwrap();
    std::os::unix::fs::symlink("../f", src.join("d/sym")).unwrap();
    run_ok(tool("mkfifo").arg(src.join("fifo"))).unwrap();
    fs::set_permissions(src.join("f"), fs::Permissions::from_mode(0o640)).unwrap();
    if have("setfattr") {
        run_ok(
            tool("setfattr")
                .args(["-n", "user.k", "-v", "vv"])
                .arg(src.join("d/e/g")),
        )
        .unwrap();
    }
    let img = dir.path().join("cp.img");
    run_ok(tool("truncate").args(["-s", "64M"]).arg(&img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext4", "-d"]).arg(&src).arg(&img)).unwrap();
    let at = |p: &str| format!("{}:{p}", img.display());
    // Image -> host, archive.
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    run_ok(
        ext4kit()
            .args(["cp", "-a"])
            .arg(at("/"))
            .arg(out.join("tree")),
    )
    .unwrap();
    let t = out.join("tree");
    assert_eq!(fs::read(t.join("f")).unwrap(), pattern(70_000, 1));
    assert_eq!(fs::read(t.join("d/e/g")).unwrap(), b"deep");
    let sp = fs::read(t.join("sparse")).unwrap();
    assert_eq!(sp.len(), 10 << 20);
    assert!(sp[..sp.len() - 4].iter().all(|&b| b == 0) && sp.ends_with(b"tail"));
    let md = fs::metadata(t.join("sparse")).unwrap();
    assert!(md.blocks() < 64, "holes kept: {} blocks", md.blocks());
    let (a, b) = (
        fs::metadata(t.join("f")).unwrap(),
        fs::metadata(t.join("d/f-link")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "hard link kept");
    assert_eq!(a.mode() & 0o7777, 0o640);
    let s = fs::metadata(src.join("f")).unwrap();
    // mke2fs -d keeps whole seconds.
    assert_eq!((a.mtime(), a.mtime_nsec()), (s.mtime(), 0));
    assert_eq!(
        fs::read_link(t.join("d/sym")).unwrap(),
        PathBuf::from("../f")
    );
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &fs::symlink_metadata(t.join("fifo")).unwrap().file_type()
    ));
    if have("getfattr") && have("setfattr") {
        let o = run_ok(
            tool("getfattr")
                .args(["-n", "user.k", "--only-values"])
                .arg(t.join("d/e/g")),
        )
        .unwrap();
        assert_eq!(o.stdout, b"vv");
    }
    // Plain cp of one file into a directory; a directory without -r.
    run_ok(ext4kit().arg("cp").arg(at("/d/e/g")).arg(&out)).unwrap();
    assert_eq!(fs::read(out.join("g")).unwrap(), b"deep");
    let o = run(ext4kit().arg("cp").arg(at("/d")).arg(&out)).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-r not specified; omitting directory"));
    // Host -> image, into an existing file.
    let host = dir.path().join("new");
    let mut data = pattern(123_457, 9);
    data[50_000..90_000].fill(0);
    fs::write(&host, &data).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(at("/d/e/g"))).unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(debugfs(&img, false, "cat /d/e/g"), data);
    // Refusals: one line, exit 1, the image untouched.
    let before = file_hash(&img).unwrap();
    for dst in ["/nope/x", "/d/e/g/x", "/fifo"] {
        let o = run(ext4kit().arg("cp").arg(&host).arg(at(dst))).unwrap();
        assert_eq!(o.status.code(), Some(1), "{dst}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(dst), "{err}");
    }
    assert_eq!(file_hash(&img).unwrap(), before);
    let o = run(ext4kit().arg("cp").arg(&src).arg(at("/"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("-r not specified"));
    assert_eq!(file_hash(&img).unwrap(), before);
    // Host tree -> image with -a, back out with -a: the same tree.
    run_ok(ext4kit().args(["mkdir", "-p"]).arg(at("/x/y"))).unwrap();
    run_ok(ext4kit().args(["cp", "-a"]).arg(&src).arg(at("/x/y"))).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(at("/x/new"))).unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(debugfs(&img, false, "cat /x/new"), data);
    let back = dir.path().join("back");
    run_ok(ext4kit().args(["cp", "-a"]).arg(at("/x/y/src")).arg(&back)).unwrap();
    for p in ["f", "d/e/g", "sparse", "d/f-link"] {
        assert_eq!(
            fs::read(back.join(p)).unwrap(),
            fs::read(src.join(p)).unwrap(),
            "{p}"
        );
        let (a, b) = (
            fs::metadata(back.join(p)).unwrap(),
            fs::metadata(src.join(p)).unwrap(),
        );
        assert_eq!(
            (a.mode(), a.mtime(), a.mtime_nsec()),
            (b.mode(), b.mtime(), b.mtime_nsec()),
            "{p}"
        );
    }
    let (a, b) = (
        fs::metadata(back.join("f")).unwrap(),
        fs::metadata(back.join("d/f-link")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino());
    assert_eq!(
        fs::read_link(back.join("d/sym")).unwrap(),
        PathBuf::from("../f")
    );
    if have("getfattr") && have("setfattr") {
        let o = run_ok(
            tool("getfattr")
                .args(["-n", "user.k", "--only-values"])
                .arg(back.join("d/e/g")),
        )
        .unwrap();
        assert_eq!(o.stdout, b"vv");
    }
    // rm: a file, a directory needs -r, -f of a missing name, -r of a tree.
    run_ok(ext4kit().arg("rm").arg(at("/x/new"))).unwrap();
    let o = run(ext4kit().arg("rm").arg(at("/x/y"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Is a directory"));
    run_ok(ext4kit().args(["rm", "-f"]).arg(at("/x/nothing"))).unwrap();
    let o = run(ext4kit().arg("rm").arg(at("/x/nothing"))).unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("No such file or directory"));
    run_ok(ext4kit().args(["rm", "-r"]).arg(at("/x"))).unwrap();
    let o = run(ext4kit().arg("mkdir").arg(at("/d"))).unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("File exists"));
    e2fsck_clean(&img).unwrap();
    let ls = String::from_utf8_lossy(&debugfs(&img, false, "ls /")).into_owned();
    assert!(!ls.contains(" x "), "{ls}");
}

/// Namespace operations over dir_write: mkdir (nlink, "." and ".."),
/// create of every type, symlinks, hard links, unlink (small and large
/// files), rmdir (empty; a non-empty one refused), 3000 names in one
/// directory (an htree), deletes in it. e2fsck clean, the kernel lists
/// the same names, types and link counts; refusals change nothing.
#[test]
fn namespace_operations() {
    if let Err(r) = e2fs_tools() {
        return skip("namespace_operations", &r);
    }
    use ext4kit_format::inode::{S_IFCHR, S_IFDIR, S_IFIFO, S_IFSOCK};
    use ext4kit_fs::FsError;
    let dir = image_dir();
    for (name, args) in [
        ("n4.img", &["-b", "4096"][..]),
        ("n1.img", &["-b", "1024", "-O", "^metadata_csum"][..]),
    ] {
        let img = mkimg(dir.path(), name, "64M", args);
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let spec = |m| NewInode::new(m, 1000, 1000);
        let (a, _) = fs.mkdir(2, b"a", &spec(S_IFDIR | 0o755)).unwrap();
        let (b, _) = fs.mkdir(a.ino, b"b", &spec(S_IFDIR | 0o700)).unwrap();
        assert_eq!(fs.inode(a.ino).unwrap().links, 3);
        assert_eq!(fs.inode(2).unwrap().links, 4);
        let (f, _) = fs.create(b.ino, b"file", &spec(S_IFREG | 0o644)).unwrap();
        fs.write_at(f.ino, 0, &pattern(50_000, 1)).unwrap();
        fs.create(b.ino, b"fifo", &spec(S_IFIFO | 0o600)).unwrap();
        fs.create(b.ino, b"sock", &spec(S_IFSOCK | 0o600)).unwrap();
        fs.create(
            b.ino,
            b"tty",
            &NewInode {
                rdev: Some((4, 1)),
                ..spec(S_IFCHR | 0o620)
            },
        )
        .unwrap();
        fs.symlink(a.ino, b"to-file", b"b/file", &spec(0)).unwrap();
        fs.link(f.ino, a.ino, b"hard").unwrap();
        assert_eq!(fs.inode(f.ino).unwrap().links, 2);
        // Refusals.
        assert!(matches!(
            fs.create(b.ino, b"file", &spec(S_IFREG)),
            Err(FsError::Exists)
        ));
        assert!(matches!(fs.rmdir(a.ino, b"b"), Err(FsError::NotEmpty)));
        assert!(matches!(fs.unlink(2, b"a"), Err(FsError::IsADirectory)));
        assert!(matches!(fs.unlink(2, b"nope"), Err(FsError::NotFound)));
        assert!(matches!(
            fs.link(a.ino, 2, b"dirlink"),
            Err(FsError::IsADirectory)
        ));
        // Unlink: one link of two, then a big file (several handles).
        fs.unlink(a.ino, b"hard").unwrap();
        assert_eq!(fs.inode(f.ino).unwrap().links, 1);
        let (big, _) = fs.create(a.ino, b"big", &spec(S_IFREG | 0o644)).unwrap();
        fs.write_at(big.ino, 0, &pattern(6 << 20, 2)).unwrap();
        let free_before_big = fs.block_alloc().free_blocks();
        fs.unlink(a.ino, b"big").unwrap();
        fs.sync().unwrap();
        assert!(fs.block_alloc().free_blocks() > free_before_big);
        // An htree: 3000 names, then every third removed.
        let (h, _) = fs.mkdir(2, b"many", &spec(S_IFDIR | 0o755)).unwrap();
        for k in 0..3000 {
            fs.create(
                h.ino,
                format!("name-{k:05}-padding-to-make-it-longer").as_bytes(),
                &spec(S_IFREG | 0o600),
            )
            .unwrap();
        }
        assert!(fs.inode(h.ino).unwrap().is_htree());
        for k in (0..3000).step_by(3) {
            fs.unlink(
                h.ino,
                format!("name-{k:05}-padding-to-make-it-longer").as_bytes(),
            )
            .unwrap();
        }
        // mkdir/rmdir round trip.
        fs.mkdir(a.ino, b"gone", &spec(S_IFDIR | 0o755)).unwrap();
        fs.rmdir(a.ino, b"gone").unwrap();
        assert_eq!(fs.inode(a.ino).unwrap().links, 3);
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let ls = String::from_utf8_lossy(&debugfs(&img, false, "ls -l /a/b")).into_owned();
        for n in ["file", "fifo", "sock", "tty"] {
            assert!(ls.contains(n), "{ls}");
        }
        if kernel_mount_available().is_err() {
            continue;
        }
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", Some("noatime")).unwrap();
        let names = |p: &str| {
            let mut v: Vec<String> = fs::read_dir(m.path().join(p))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names("a"), vec!["b", "to-file"]);
        assert_eq!(names("a/b"), vec!["fifo", "file", "sock", "tty"]);
        let many = names("many");
        assert_eq!(many.len(), 2000);
        assert!(many.contains(&"name-00001-padding-to-make-it-longer".to_string()));
        assert!(!many.contains(&"name-00000-padding-to-make-it-longer".to_string()));
        assert_eq!(
            fs::read(m.path().join("a/to-file")).unwrap(),
            pattern(50_000, 1)
        );
        assert_eq!(fs::metadata(m.path().join("a")).unwrap().nlink(), 3);
        // The kernel writes in the same directories.
        fs::write(m.path().join("many/kernel"), b"k").unwrap();
        fs::create_dir(m.path().join("a/kdir")).unwrap();
        m.unmount().unwrap();
        drop(lo);
        e2fsck_clean(&img).unwrap();
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let many = fs.lookup(2, b"many").unwrap().unwrap();
        assert!(fs.lookup(many.ino, b"kernel").unwrap().is_some());
        fs.unlink(many.ino, b"kernel").unwrap();
        let a = fs.lookup(2, b"a").unwrap().unwrap();
        fs.rmdir(a.ino, b"kdir").unwrap();
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| {
            panic!(
                "{name}: {e}\n{}\nnow {:?}",
                dumpe2fs_h(&img),
                std::time::SystemTime::now()
            )
        });
    }
}

/// rename: within a directory, across parents (a directory: "..",
/// link counts), over a file, over an empty directory, NOREPLACE and
/// EXCHANGE (a file with a directory across parents), WHITEOUT (a
/// directory across parents; refused with EXCHANGE), refusals (into
/// itself, over a non-empty directory, type mismatches). e2fsck clean
/// after everything; the kernel sees the result.
#[test]
fn rename_cases() {
    if let Err(r) = e2fs_tools() {
        return skip("rename_cases", &r);
    }
    use ext4kit_format::inode::S_IFDIR;
    use ext4kit_fs::FsError;
    use ext4kit_fs::fs::RenameFlags;
    let dir = image_dir();
    let img = mkimg(dir.path(), "r.img", "32M", &["-b", "1024"]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let d = |m| NewInode::new(S_IFDIR | m, 0, 0);
    let f = |m| NewInode::new(S_IFREG | m, 0, 0);
    let (a, _) = fs.mkdir(2, b"a", &d(0o755)).unwrap();
    let (b, _) = fs.mkdir(2, b"b", &d(0o755)).unwrap();
    let (sub, _) = fs.mkdir(a.ino, b"sub", &d(0o755)).unwrap();
    fs.create(sub.ino, b"inner", &f(0o644)).unwrap();
    let (x, _) = fs.create(a.ino, b"x", &f(0o644)).unwrap();
    fs.write_at(x.ino, 0, b"xx").unwrap();
    let (y, _) = fs.create(b.ino, b"y", &f(0o644)).unwrap();
    fs.write_at(y.ino, 0, &pattern(20_000, 1)).unwrap();
    let none = RenameFlags::default();
    // Within a directory.
    fs.rename(a.ino, b"x", a.ino, b"x2", none).unwrap();
    // A directory across parents.
    fs.rename(a.ino, b"sub", b.ino, b"sub", none).unwrap();
    assert_eq!(fs.inode(a.ino).unwrap().links, 2);
    assert_eq!(fs.inode(b.ino).unwrap().links, 3);
    let sub_i = fs.lookup(b.ino, b"sub").unwrap().unwrap();
    assert_eq!(fs.lookup(sub_i.ino, b"..").unwrap().unwrap().ino, b.ino);
    // Over an existing file (y is freed).
    let free = fs.block_alloc().free_blocks();
    fs.rename(a.ino, b"x2", b.ino, b"y", none).unwrap();
    fs.sync().unwrap();
    assert!(fs.block_alloc().free_blocks() > free);
    assert_eq!(fs.lookup(b.ino, b"y").unwrap().unwrap().ino, x.ino);
    // NOREPLACE.
    fs.create(a.ino, b"z", &f(0o600)).unwrap();
    let nr = RenameFlags {
        noreplace: true,
        ..none
    };
    assert!(matches!(
        fs.rename(a.ino, b"z", b.ino, b"y", nr),
        Err(FsError::Exists)
    ));
    // Over an empty directory, and refusals.
    fs.mkdir(a.ino, b"empty", &d(0o700)).unwrap();
    fs.mkdir(b.ino, b"e2", &d(0o700)).unwrap();
    fs.rename(b.ino, b"e2", a.ino, b"empty", none).unwrap();
    assert_eq!(fs.inode(a.ino).unwrap().links, 3);
    assert_eq!(fs.inode(b.ino).unwrap().links, 3);
    assert!(matches!(
        fs.rename(2, b"b", sub_i.ino, b"loop", none),
        Err(FsError::InvalidName(_))
    ));
    assert!(matches!(
        fs.rename(a.ino, b"z", b.ino, b"sub", none),
        Err(FsError::IsADirectory)
    ));
    assert!(matches!(
        fs.rename(b.ino, b"sub", a.ino, b"z", none),
        Err(FsError::NotADirectory)
    ));
    fs.mkdir(a.ino, b"full", &d(0o700)).unwrap();
    let full = fs.lookup(a.ino, b"full").unwrap().unwrap();
    fs.create(full.ino, b"k", &f(0o600)).unwrap();
    assert!(matches!(
        fs.rename(b.ino, b"sub", a.ino, b"full", none),
        Err(FsError::NotEmpty)
    ));
    // EXCHANGE a file (a/z) with a directory (b/sub) across parents.
    let ex = RenameFlags {
        exchange: true,
        ..none
    };
    fs.rename(a.ino, b"z", b.ino, b"sub", ex).unwrap();
    let moved = fs.lookup(a.ino, b"z").unwrap().unwrap();
    assert!(moved.is_dir());
    assert_eq!(fs.lookup(moved.ino, b"..").unwrap().unwrap().ino, a.ino);
    assert!(fs.lookup(b.ino, b"sub").unwrap().unwrap().is_regular());
    assert_eq!(fs.inode(a.ino).unwrap().links, 5); // ., .., empty, full, z
    assert_eq!(fs.inode(b.ino).unwrap().links, 2);
    // WHITEOUT: a directory across parents; a/full becomes a character
    // device 0/0 of mode 0 owned by 7:8, in the rename's transaction.
    let wo = RenameFlags {
        whiteout: Some((7, 8)),
        ..none
    };
    fs.rename(a.ino, b"full", b.ino, b"full", wo).unwrap();
    let w = fs.lookup(a.ino, b"full").unwrap().unwrap();
    let w = fs.inode(w.ino).unwrap();
    assert_eq!((w.mode, w.links, w.uid, w.gid), (0o020000, 1, 7, 8));
    assert_eq!(fs.inode(a.ino).unwrap().links, 4); // full moved out
    assert_eq!(fs.inode(b.ino).unwrap().links, 3);
    assert!(matches!(
        fs.rename(
            a.ino,
            b"z",
            b.ino,
            b"sub",
            RenameFlags {
                exchange: true,
                ..wo
            }
        ),
        Err(FsError::InvalidName(_))
    ));
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    if kernel_mount_available().is_err() {
        return;
    }
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", Some("noatime")).unwrap();
    assert_eq!(fs::read(m.path().join("b/y")).unwrap(), b"xx");
    assert!(m.path().join("a/z/inner").exists());
    assert_eq!(fs::metadata(m.path().join("a")).unwrap().nlink(), 4);
    let w = fs::symlink_metadata(m.path().join("a/full")).unwrap();
    assert_eq!((w.mode(), w.rdev(), w.uid(), w.gid()), (0o020000, 0, 7, 8));
    assert!(m.path().join("b/full/k").exists());
    fs::rename(m.path().join("a/z"), m.path().join("b/back")).unwrap();
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
}

/// `ext4kit mv` and `ext4kit ln [-s] [-f]` on an image: results as
/// coreutils would leave them, e2fsck clean, one-line errors.
#[test]
fn mv_and_ln_tools() {
    if let Err(r) = e2fs_tools() {
        return skip("mv_and_ln_tools", &r);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("f"), b"file").unwrap();
    fs::write(src.join("g"), b"gee").unwrap();
    let img = dir.path().join("m.img");
    run_ok(tool("truncate").args(["-s", "32M"]).arg(&img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext4", "-d"]).arg(&src).arg(&img)).unwrap();
    let at = |p: &str| format!("{}:{p}", img.display());
    let ok = |args: &[&str], ps: &[&str]| {
        let mut c = ext4kit();
        c.args(args);
        for p in ps {
            c.arg(at(p));
        }
        run_ok(&mut c).unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{args:?} {ps:?}: {e}"));
    };
    ok(&["mv"], &["/f", "/f2"]);
    ok(&["mv"], &["/f2", "/d"]);
    assert_eq!(debugfs(&img, false, "cat /d/f2"), b"file");
    ok(&["mv"], &["/g", "/d/f2"]); // replaces
    assert_eq!(debugfs(&img, false, "cat /d/f2"), b"gee");
    ok(&["ln"], &["/d/f2", "/hard"]);
    assert!(stat_line(&img, "/hard").contains("Links: 2"));
    run_ok(ext4kit().args(["ln", "-s", "d/f2"]).arg(at("/soft"))).unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(
        run_ok(ext4kit().arg("cat").arg(at("/soft")))
            .unwrap()
            .stdout,
        b"gee"
    );
    let o = run(ext4kit().args(["ln", "-s", "x"]).arg(at("/soft"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("File exists"));
    run_ok(ext4kit().args(["ln", "-sf", "d"]).arg(at("/soft"))).unwrap();
    let o = run(ext4kit().arg("mv").arg(at("/nope")).arg(at("/x"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot move") && err.contains("/nope") && err.contains("No such file"),
        "{err}"
    );
    let o = run(ext4kit().arg("mv").arg(at("/d")).arg(at("/d/inside"))).unwrap();
    assert_eq!(o.status.code(), Some(1));
    e2fsck_clean(&img).unwrap();
}

/// Refused namespace tools leave the image byte for byte as it was (not
/// even the mount count or write time changes): their refusals are found
/// read-only before the image is opened for writing. A refusal that only
/// the operation can find may still mark the image in use; these are the
/// ones a user meets (missing or existing names, wrong types).
#[test]
fn refused_namespace_tools_write_nothing() {
    if let Err(r) = e2fs_tools() {
        return skip("refused_namespace_tools_write_nothing", &r);
    }
    let dir = image_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d/e")).unwrap();
    fs::write(src.join("f"), b"file").unwrap();
    let img = dir.path().join("r.img");
    run_ok(tool("truncate").args(["-s", "32M"]).arg(&img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext4", "-d"]).arg(&src).arg(&img)).unwrap();
    let at = |p: &str| format!("{}:{p}", img.display());
    let before = fs::read(&img).unwrap();
    let cases: &[(&[&str], &[&str], &str)] = &[
        (&["mkdir"], &["/d"], "File exists"),
        (&["mkdir"], &["/nope/x"], "No such file"),
        (&["mkdir"], &["/f/x"], "Not a directory"),
        (&["mkdir", "-p"], &["/f/x/y"], "Not a directory"),
        (&["mv"], &["/nope", "/x"], "No such file"),
        (&["mv"], &["/nope", "/nope2", "/d"], "No such file"),
        (&["mv"], &["/f", "/d", "/f"], "not a directory"),
        (&["mv"], &["/f", "/nope/x"], "No such file"),
        (&["mv", "--exchange"], &["/f", "/zz"], "No such file"),
        (&["ln"], &["/nope", "/y"], "No such file"),
        (&["ln"], &["/d", "/y"], "not allowed for directory"),
        (&["ln"], &["/f", "/d/e/../../f"], "File exists"),
        (&["ln", "-s", "t"], &["/f"], "File exists"),
        (&["ln", "-s", "t"], &["/nope/x"], "No such file"),
    ];
    for (args, paths, why) in cases {
        let mut c = ext4kit();
        c.args(*args);
        for p in *paths {
            c.arg(at(p));
        }
        let o = run(&mut c).unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?} {paths:?}: {err}");
        assert!(err.contains(why), "{args:?} {paths:?}: {err}");
        assert!(
            fs::read(&img).unwrap() == before,
            "{args:?} {paths:?} wrote to the image"
        );
    }
}

/// The namespace against a model: random create, mkdir, write, link,
/// unlink, rmdir and rename (plain, over files, NOREPLACE, EXCHANGE)
/// across directories; after each sequence the tree read back (names,
/// types, contents, link counts) equals the model's, the close is clean
/// and e2fsck is clean. `EXT4KIT_NS_MODEL=N` sequences (default 4).
#[test]
fn random_namespace_matches_the_model() {
    if let Err(r) = e2fs_tools() {
        return skip("random_namespace_matches_the_model", &r);
    }
    use ext4kit_format::inode::S_IFDIR;
    use ext4kit_fs::fs::RenameFlags;
    use std::collections::BTreeMap;
    #[derive(Clone, Debug, PartialEq)]
    enum Node {
        Dir(BTreeMap<Vec<u8>, Node>),
        File(u32), // model file id
    }
    fn paths(n: &Node, pre: &[Vec<u8>], out: &mut Vec<(Vec<Vec<u8>>, bool)>) {
        if let Node::Dir(m) = n {
            for (k, v) in m {
                let mut p = pre.to_vec();
                p.push(k.clone());
                out.push((p.clone(), matches!(v, Node::Dir(_))));
                paths(v, &p, out);
            }
        }
    }
    fn get<'a>(n: &'a mut Node, p: &[Vec<u8>]) -> &'a mut Node {
        let mut cur = n;
        for c in p {
            let Node::Dir(m) = cur else { unreachable!() };
            cur = m.get_mut(c).unwrap();
        }
        cur
    }
    let runs: u64 = std::env::var("EXT4KIT_NS_MODEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = image_dir();
    let base = mkimg(dir.path(), "nsbase.img", "32M", &["-b", "1024"]);
    for run in 0..runs {
        let img = dir.path().join("ns.img");
        run_ok(tool("cp").arg("--sparse=always").arg(&base).arg(&img)).unwrap();
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let mut rng = Rng(0xA5A5 ^ (run + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut root = Node::Dir(BTreeMap::from([(
            b"lost+found".to_vec(),
            Node::Dir(BTreeMap::new()),
        )]));
        let mut contents: Vec<Vec<u8>> = Vec::new(); // by model file id
        let mut inos: Vec<u32> = Vec::new(); // model file id -> inode
        let ino_of = |fs: &Filesystem, p: &[Vec<u8>]| -> u32 {
            let mut cur = 2;
            for c in p {
                cur = fs.lookup(cur, c).unwrap().unwrap().ino;
            }
            cur
        };
        for step in 0..60 {
            let mut all = Vec::new();
            paths(&root, &[], &mut all);
            let dirs: Vec<Vec<Vec<u8>>> = std::iter::once(Vec::new())
                .chain(all.iter().filter(|(_, d)| *d).map(|(p, _)| p.clone()))
                .collect();
            let files: Vec<Vec<Vec<u8>>> = all
                .iter()
                .filter(|(_, d)| !*d)
                .map(|(p, _)| p.clone())
                .collect();
            let pick =
                |rng: &mut Rng, v: &[Vec<Vec<u8>>]| v[rng.below(v.len() as u64) as usize].clone();
            let name = |rng: &mut Rng| format!("n{}", rng.below(12)).into_bytes();
            let ctx = format!("run {run} step {step}");
            match rng.below(9) {
                0 | 1 => {
                    let d = pick(&mut rng, &dirs);
                    let n = name(&mut rng);
                    let Node::Dir(m) = get(&mut root, &d) else {
                        unreachable!()
                    };
                    if m.contains_key(&n) {
                        continue;
                    }
                    let di = ino_of(&fs, &d);
                    if rng.below(3) == 0 {
                        fs.mkdir(di, &n, &NewInode::new(S_IFDIR | 0o755, 0, 0))
                            .unwrap_or_else(|e| panic!("{ctx}: mkdir: {e}"));
                        m.insert(n, Node::Dir(BTreeMap::new()));
                    } else {
                        let (i, _) = fs
                            .create(di, &n, &NewInode::new(S_IFREG | 0o644, 0, 0))
                            .unwrap_or_else(|e| panic!("{ctx}: create: {e}"));
                        m.insert(n, Node::File(contents.len() as u32));
                        contents.push(Vec::new());
                        inos.push(i.ino);
                    }
                }
                2 if !files.is_empty() => {
                    let f = pick(&mut rng, &files);
                    let Node::File(id) = get(&mut root, &f).clone() else {
                        unreachable!()
                    };
                    let d = pattern(1 + rng.below(5000) as usize, rng.next());
                    fs.write_at(inos[id as usize], 0, &d).unwrap();
                    let c = &mut contents[id as usize];
                    if c.len() < d.len() {
                        c.resize(d.len(), 0);
                    }
                    c[..d.len()].copy_from_slice(&d);
                }
                3 if !files.is_empty() => {
                    let f = pick(&mut rng, &files);
                    let Node::File(id) = get(&mut root, &f).clone() else {
                        unreachable!()
                    };
                    let d = pick(&mut rng, &dirs);
                    let n = name(&mut rng);
                    let Node::Dir(m) = get(&mut root, &d) else {
                        unreachable!()
                    };
                    if m.contains_key(&n) {
                        continue;
                    }
                    fs.link(inos[id as usize], ino_of(&fs, &d), &n)
                        .unwrap_or_else(|e| panic!("{ctx}: link: {e}"));
                    let Node::Dir(m) = get(&mut root, &d) else {
                        unreachable!()
                    };
                    m.insert(n, Node::File(id));
                }
                4 if !files.is_empty() => {
                    let f = pick(&mut rng, &files);
                    let (parent, n) = f.split_at(f.len() - 1);
                    fs.unlink(ino_of(&fs, parent), &n[0])
                        .unwrap_or_else(|e| panic!("{ctx}: unlink: {e}"));
                    let Node::Dir(m) = get(&mut root, parent) else {
                        unreachable!()
                    };
                    m.remove(&n[0]);
                }
                5 if dirs.len() > 2 => {
                    let d = pick(&mut rng, &dirs[1..]);
                    if d == [b"lost+found".to_vec()] {
                        continue;
                    }
                    let (parent, n) = d.split_at(d.len() - 1);
                    let empty = matches!(get(&mut root, &d), Node::Dir(m) if m.is_empty());
                    let r = fs.rmdir(ino_of(&fs, parent), &n[0]);
                    assert_eq!(r.is_ok(), empty, "{ctx}: rmdir {d:?}: {r:?}");
                    if empty {
                        let Node::Dir(m) = get(&mut root, parent) else {
                            unreachable!()
                        };
                        m.remove(&n[0]);
                    }
                }
                _ if all.len() > 1 => {
                    // rename
                    let (s, sdir) = all[rng.below(all.len() as u64) as usize].clone();
                    if s == [b"lost+found".to_vec()] {
                        continue;
                    }
                    let d = pick(&mut rng, &dirs);
                    // Into itself?
                    if sdir && d.starts_with(&s) {
                        continue;
                    }
                    let n = name(&mut rng);
                    let (sp, sn) = s.split_at(s.len() - 1);
                    let mut dp = d.clone();
                    dp.push(n.clone());
                    if dp == s {
                        continue;
                    }
                    let exists = matches!(get(&mut root, &d), Node::Dir(m) if m.contains_key(&n));
                    let target = if exists {
                        Some(get(&mut root, &dp).clone())
                    } else {
                        None
                    };
                    let exchange = exists && rng.below(3) == 0;
                    if exchange {
                        let tdir = matches!(target, Some(Node::Dir(_)));
                        if tdir && sp.starts_with(&dp) {
                            continue;
                        }
                    }
                    let noreplace = !exchange && rng.below(4) == 0;
                    let flags = RenameFlags {
                        noreplace,
                        exchange,
                        whiteout: None,
                    };
                    let si = ino_of(&fs, sp);
                    let di = ino_of(&fs, &d);
                    let r = fs.rename(si, &sn[0], di, &n, flags);
                    let snode = get(&mut root, &s).clone();
                    let ok_model = if exchange {
                        true
                    } else if let Some(t) = &target {
                        !noreplace
                            && match (&snode, t) {
                                (Node::Dir(_), Node::Dir(m)) => m.is_empty(),
                                (Node::File(_), Node::File(_)) => true,
                                _ => false,
                            }
                    } else {
                        true
                    };
                    assert_eq!(
                        r.is_ok(),
                        ok_model,
                        "{ctx}: rename {s:?} -> {dp:?} {flags:?}: {r:?}"
                    );
                    if r.is_err() {
                        continue;
                    }
                    if exchange {
                        let t = target.unwrap();
                        *get(&mut root, &dp) = snode;
                        *get(&mut root, &s) = t;
                    } else {
                        let same = matches!((&snode, &target), (Node::File(a), Some(Node::File(b))) if a == b);
                        if !same {
                            let Node::Dir(m) = get(&mut root, sp) else {
                                unreachable!()
                            };
                            m.remove(&sn[0]);
                            let Node::Dir(m) = get(&mut root, &d) else {
                                unreachable!()
                            };
                            m.insert(n, snode);
                        }
                    }
                }
                _ => {}
            }
        }
        // Compare the tree.
        let mut nlinks: BTreeMap<u32, u16> = BTreeMap::new();
        let mut all = Vec::new();
        paths(&root, &[], &mut all);
        for (p, _) in &all {
            if let Node::File(id) = get(&mut root, p).clone() {
                *nlinks.entry(id).or_default() += 1;
            }
        }
        fn walk(
            fs: &Filesystem,
            ino: u32,
            node: &Node,
            contents: &[Vec<u8>],
            inos: &[u32],
            nlinks: &BTreeMap<u32, u16>,
            at: &str,
        ) {
            let d = fs.inode(ino).unwrap();
            let got: Vec<_> = fs
                .read(|f| f.read_dir(&d))
                .unwrap()
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .collect();
            let Node::Dir(m) = node else { unreachable!() };
            let names: Vec<Vec<u8>> = got
                .iter()
                .map(|e| e.name.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            assert_eq!(names, m.keys().cloned().collect::<Vec<_>>(), "{at}");
            let subdirs = m.values().filter(|v| matches!(v, Node::Dir(_))).count() as u16;
            assert_eq!(d.links, 2 + subdirs, "{at} nlink");
            for e in got {
                let child = &m[&e.name];
                let i = fs.inode(e.ino).unwrap();
                let here = format!("{at}/{}", e.name_lossy());
                match child {
                    Node::Dir(_) => {
                        assert!(i.is_dir(), "{here}");
                        walk(fs, e.ino, child, contents, inos, nlinks, &here);
                    }
                    Node::File(id) => {
                        assert_eq!(e.ino, inos[*id as usize], "{here}");
                        assert_eq!(i.links, nlinks[id], "{here} nlink");
                        let mut b = vec![0u8; i.size as usize];
                        fs.read_at(e.ino, 0, &mut b).unwrap();
                        assert!(b == contents[*id as usize], "{here} content");
                    }
                }
            }
        }
        walk(
            &fs,
            2,
            &root,
            &contents,
            &inos,
            &nlinks,
            &format!("run {run}"),
        );
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("run {run}: {e}"));
    }
}

/// A power cut at every write of a namespace workload (mkdir, create +
/// write, rename across directories, unlink, rmdir, each group committed
/// by a sync), in both cut modes: after ext4kit's recovery the tree is
/// exactly one committed state, no older than the last sync that
/// returned, and e2fsck is clean.
#[test]
fn crash_in_namespace_operations_recovers_a_committed_tree() {
    if let Err(r) = e2fs_tools() {
        return skip(
            "crash_in_namespace_operations_recovers_a_committed_tree",
            &r,
        );
    }
    use ext4kit_format::inode::S_IFDIR;
    use ext4kit_fs::fs::RenameFlags;
    let dir = image_dir();
    let img = mkimg(dir.path(), "cn.img", "16M", &["-b", "1024"]);
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let run = |dev: Arc<dyn Device>, returned: &mut usize| -> Result<(), ext4kit_fs::FsError> {
        let fs = Filesystem::open(dev, RwOptions::default())?;
        let (d, _) = fs.mkdir(2, b"d", &NewInode::new(S_IFDIR | 0o755, 0, 0))?;
        let (f, _) = fs.create(d.ino, b"f", &NewInode::new(S_IFREG | 0o644, 0, 0))?;
        fs.write_at(f.ino, 0, &pattern(3000, 1))?;
        fs.sync()?;
        *returned = 1;
        fs.rename(d.ino, b"f", 2, b"g", RenameFlags::default())?;
        fs.mkdir(d.ino, b"e", &NewInode::new(S_IFDIR | 0o700, 0, 0))?;
        fs.sync()?;
        *returned = 2;
        fs.unlink(2, b"g")?;
        fs.rmdir(d.ino, b"e")?;
        fs.sync()?;
        *returned = 3;
        fs.close()
    };
    let tree = |fs: &Filesystem| -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![(2u32, String::new())];
        while let Some((ino, at)) = stack.pop() {
            let d = fs.inode(ino).unwrap();
            for e in fs.read(|f| f.read_dir(&d)).unwrap() {
                if e.name == b"." || e.name == b".." || e.name == b"lost+found" {
                    continue;
                }
                let p = format!("{at}/{}", e.name_lossy());
                let i = fs.inode(e.ino).unwrap();
                if i.is_dir() {
                    stack.push((e.ino, p.clone()));
                    out.push(format!("{p}/"));
                } else {
                    let mut b = vec![0u8; i.size as usize];
                    fs.read_at(e.ino, 0, &mut b).unwrap();
                    assert!(b == pattern(3000, 1), "{p} content");
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    };
    let states: [Vec<&str>; 4] = [
        vec![],
        vec!["/d/", "/d/f"],
        vec!["/d/", "/d/e/", "/g"],
        vec!["/d/"],
    ];
    let one = |cut: Option<u64>, mode: CutMode| {
        let (mem, returned, ops) = run_cut(&base, cut, mode, |d| {
            let mut returned = 0;
            let _ = run(d, &mut returned);
            returned
        });
        (mem, returned, ops)
    };
    let (_, returned, ops) = one(None, CutMode::DropAll);
    assert_eq!(returned, 3);
    let step = (ops / 50).max(1);
    let mut checked = 0;
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 11,
            torn: false,
        },
    ] {
        for cut in (1..ops).step_by(step as usize) {
            let (mem, returned, _) = one(Some(cut), mode);
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            let got = tree(&fs);
            fs.close().unwrap();
            assert!(
                (returned..states.len()).any(|k| states[k] == got),
                "cut {cut} {mode:?}: tree {got:?} is no committed state from {returned} on"
            );
            let out = dir.path().join("cut.img");
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 20);
}

/// Unlink while open: the inode stays readable and writable with link
/// count 0 on the orphan list; its release frees everything; after a
/// crash instead, the next open (ext4kit's) or the kernel's mount frees
/// it. e2fsck clean every way.
#[test]
fn unlink_while_open_and_orphans_after_a_crash() {
    if let Err(r) = e2fs_tools() {
        return skip("unlink_while_open_and_orphans_after_a_crash", &r);
    }
    let dir = image_dir();
    let base = mkimg(dir.path(), "o.img", "32M", &["-b", "1024"]);
    let before = e2fsck_clean(&base).unwrap();
    let setup = |img: &Path| -> (Filesystem, u32) {
        let fs = Filesystem::open(open_file(img), RwOptions::default()).unwrap();
        let (f, _) = fs
            .create(2, b"f", &NewInode::new(S_IFREG | 0o644, 0, 0))
            .unwrap();
        fs.write_at(f.ino, 0, &pattern(200_000, 3)).unwrap();
        let (_, orphan) = fs.unlink_open(2, b"f").unwrap();
        assert!(orphan);
        assert!(fs.lookup(2, b"f").unwrap().is_none());
        let mut b = vec![0u8; 200_000];
        fs.read_at(f.ino, 0, &mut b).unwrap();
        assert!(b == pattern(200_000, 3));
        fs.write_at(f.ino, 200_000, b"more").unwrap();
        fs.sync().unwrap();
        (fs, f.ino)
    };
    // Released on the last close.
    let img = dir.path().join("a.img");
    run_ok(tool("cp").arg("--sparse=always").arg(&base).arg(&img)).unwrap();
    let (fs, ino) = setup(&img);
    fs.release_orphan(ino).unwrap();
    assert_eq!(fs.rw().superblock().unwrap().s_last_orphan.get(), 0);
    fs.close().unwrap();
    assert_eq!(
        e2fsck_clean(&img).unwrap(),
        before.replace(&base.display().to_string(), &img.display().to_string())
    );
    // A crash with the orphan pending: ext4kit's next open frees it.
    let img = dir.path().join("b.img");
    run_ok(tool("cp").arg("--sparse=always").arg(&base).arg(&img)).unwrap();
    let (fs, _) = setup(&img);
    fs.crash();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert_eq!(fs.rw().superblock().unwrap().s_last_orphan.get(), 0);
    fs.close().unwrap();
    assert_eq!(
        e2fsck_clean(&img).unwrap(),
        before.replace(&base.display().to_string(), &img.display().to_string())
    );
    // The same crash replayed and cleaned up by the kernel's mount.
    if kernel_mount_available().is_err() {
        return;
    }
    let img = dir.path().join("c.img");
    run_ok(tool("cp").arg("--sparse=always").arg(&base).arg(&img)).unwrap();
    let (fs, _) = setup(&img);
    fs.crash();
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        m.unmount().unwrap();
    }
    assert_eq!(
        e2fsck_clean(&img).unwrap(),
        before.replace(&base.display().to_string(), &img.display().to_string())
    );
}

/// Group `g`'s inode table start from `dumpe2fs` ("Inode table at X-Y").
fn dumpe2fs_itable(img: &Path, g: u32) -> u64 {
    let text = dumpe2fs::dumpe2fs(img).unwrap();
    dumpe2fs::groups(&text)
        .get(g as usize)
        .unwrap_or_else(|| panic!("no group {g} in dumpe2fs"))
        .itable
}

/// meta_bg and sparse_super2 images (made by mke2fs and by ext4kit mkfs;
/// 1 KiB blocks and 64-bit descriptors, 17 groups, so the second meta
/// group starts in the last group, which holds sparse_super2's second
/// backup: its descriptor block follows that superblock). The read side
/// lists them, the engine writes them (fallocate into the last groups,
/// cp, mkdir, rm), the metadata-only client (`RwFs`) finds an inode of
/// the last meta group and its close sums the counts from the meta_bg
/// descriptors; e2fsck is clean after each and the kernel reads the files.
#[test]
fn meta_bg_and_sparse_super2_images() {
    let name = "meta_bg_and_sparse_super2_images";
    if let Err(e) = e2fs_tools() {
        return skip(name, &e);
    }
    let dir = image_dir();
    let data = pattern(300_000, 5);
    let host = dir.path().join("data");
    fs::write(&host, &data).unwrap();
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let base = ["-b", "1024", "-O"];
    let cases: [(&str, &str); 4] = [
        ("mb-ss2", "64bit,meta_bg,sparse_super2,^resize_inode"),
        ("mb", "64bit,meta_bg,^resize_inode"),
        ("ss2", "64bit,sparse_super2"),
        ("mb-ss2-32", "^64bit,meta_bg,sparse_super2,^resize_inode"),
    ];
    for (case, feats) in cases {
        for maker in ["mke2fs", "ext4kit"] {
            let label = format!("{case}-{maker}");
            let img = dir.path().join(format!("{label}.img"));
            // 17 groups of 8 MiB (33 with 32-byte descriptors).
            let size = if case.ends_with("-32") {
                "264M"
            } else {
                "136M"
            };
            run_ok(tool("truncate").args(["-s", size]).arg(&img)).unwrap();
            let mut args: Vec<&str> = vec!["-q", "-F", "-t", "ext4", "-U", UUID];
            args.extend(base);
            args.push(feats);
            args.extend(["-E", "nodiscard"]);
            let mut c = if maker == "mke2fs" {
                mke2fs(&args)
            } else {
                ext4kit_mkfs(&args)
            };
            run_ok(c.arg(&img)).unwrap();
            e2fsck_clean(&img).unwrap_or_else(|e| panic!("{label}: mkfs: {e}"));
            let spec = |p: &str| format!("{}:{p}", img.display());
            // The read side finds every descriptor.
            run_ok(ext4kit().arg("ls").arg(spec("/")))
                .unwrap_or_else(|e| panic!("{label}: ls: {e}"));
            // The engine: the big file reaches the last groups.
            for args in [
                vec!["cp".to_string(), empty.display().to_string(), spec("/big")],
                vec![
                    "fallocate".to_string(),
                    "-l".into(),
                    "110M".into(),
                    spec("/big"),
                ],
                vec!["cp".into(), host.display().to_string(), spec("/a")],
                vec!["mkdir".into(), spec("/d")],
                vec!["cp".into(), host.display().to_string(), spec("/d/b")],
                vec!["rm".into(), spec("/a")],
                vec!["cp".into(), host.display().to_string(), spec("/c")],
            ] {
                run_ok(ext4kit().args(&args)).unwrap_or_else(|e| panic!("{label}: {e}"));
            }
            e2fsck_clean(&img).unwrap_or_else(|e| panic!("{label}: engine: {e}"));
            // The metadata-only client on an inode of the last meta group.
            let fs = ext4kit_fs::rw::RwFs::open(open_file(&img), RwOptions::default()).unwrap();
            let g = fs.geometry();
            let last = g.inodes_count / g.inodes_per_group - 1;
            let ino = last * g.inodes_per_group + 1;
            let (blk, off) = fs.inode_location(ino).unwrap();
            assert_eq!((blk, off), (dumpe2fs_itable(&img, last), 0), "{label}");
            fs.set_label("metabg").unwrap();
            fs.close().unwrap();
            e2fsck_clean(&img).unwrap_or_else(|e| panic!("{label}: RwFs close: {e}"));
            if kernel_mount_available().is_ok() {
                let lo = LoopDev::attach(&img).unwrap();
                let m = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
                for p in ["c", "d/b"] {
                    assert_eq!(fs::read(m.path().join(p)).unwrap(), data, "{label}: {p}");
                }
                assert_eq!(fs::metadata(m.path().join("big")).unwrap().len(), 110 << 20);
                m.unmount().unwrap();
            }
        }
    }
}

/// `ext4kit fallocate` creates a missing file as util-linux fallocate(1)
/// does (O_CREAT, 0644, only without -n/-p/-z): the same mode, size and
/// allocation as fallocate(1) gives on a kernel mount of the same image;
/// with -n, a missing directory or a dangling symlink nothing is written.
#[test]
fn fallocate_creates_a_missing_file() {
    let name = "fallocate_creates_a_missing_file";
    if let Err(e) = e2fs_tools() {
        return skip(name, &e);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "falloc.img", "32M", &[]);
    let at = |p: &str| format!("{}:{p}", img.display());
    run_ok(ext4kit().args(["mkdir"]).arg(at("/d"))).unwrap();
    run_ok(ext4kit().args(["ln", "-s", "nowhere"]).arg(at("/dangling"))).unwrap();
    run_ok(ext4kit().args(["fallocate", "-l", "1M"]).arg(at("/d/new"))).unwrap();
    e2fsck_clean(&img).unwrap();
    let st = stat_line(&img, "/d/new");
    assert!(st.contains("Mode:  0644"), "{st}");
    let out = run_ok(ext4kit().args(["stat"]).arg(at("/d/new"))).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("Size: 1048576"), "{text}");
    let before = file_hash(&img).unwrap();
    for (args, p) in [
        (&["fallocate", "-n", "-l", "1M"][..], "/d/other"),
        (&["fallocate", "-p", "-l", "1M"][..], "/d/other"),
        (&["fallocate", "-l", "1M"][..], "/nodir/x"),
        (&["fallocate", "-l", "1M"][..], "/dangling"),
        (&["fallocate", "-l", "1M"][..], "/d/new/x"),
    ] {
        let out = run(ext4kit().args(args).arg(at(p))).unwrap();
        assert!(!out.status.success(), "{args:?} {p}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(err.lines().count(), 1, "{args:?} {p}: {err}");
        assert!(err.contains(p), "{args:?} {p}: {err}");
        assert_eq!(file_hash(&img).unwrap(), before, "{args:?} {p} wrote");
    }
    if kernel_mount_available().is_err() {
        return;
    }
    // fallocate(1) on a kernel mount makes the same file.
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", None).unwrap();
    let k = m.path().join("d/kernel");
    run_ok(tool("fallocate").args(["-l", "1M"]).arg(&k)).unwrap();
    let (ours, theirs) = (
        fs::metadata(m.path().join("d/new")).unwrap(),
        fs::metadata(&k).unwrap(),
    );
    assert_eq!(
        (ours.mode(), ours.len(), ours.blocks()),
        (theirs.mode(), theirs.len(), theirs.blocks())
    );
    assert_eq!(
        fs::read(m.path().join("d/new")).unwrap(),
        vec![0u8; 1 << 20]
    );
    m.unmount().unwrap();
    drop(lo);
    e2fsck_clean(&img).unwrap();
}

/// Issue 20, defect 1: `ext4kit cp` keeps a sparse source sparse. A
/// 63 MiB file with 4 KiB of data at each MiB (a trailing hole after the
/// last piece), a zero block written inside a data range, and a 1 KiB
/// image block size: only the nonzero blocks are allocated (plus the
/// extent leaf), the size is kept, the content reads back identical
/// (debugfs) and e2fsck is clean. Back out to the host (with and without
/// -a) the holes stay holes.
#[test]
fn cp_keeps_holes() {
    if let Err(r) = e2fs_tools() {
        return skip("cp_keeps_holes", &r);
    }
    let dir = image_dir();
    let src = dir.path().join("sparse");
    let mib = 1u64 << 20;
    let mut want = vec![0u8; (63 * mib) as usize];
    {
        let f = fs::File::create(&src).unwrap();
        f.set_len(63 * mib).unwrap();
        for k in 0..63u64 {
            // The last piece ends 12 KiB before the end: a trailing hole.
            let at = k * mib + if k == 62 { 512 << 10 } else { 0 };
            let d = pattern(4096, k + 1);
            std::os::unix::fs::FileExt::write_at(&f, &d, at).unwrap();
            want[at as usize..at as usize + 4096].copy_from_slice(&d);
        }
        // Written zeros (data to SEEK_DATA): two 4 KiB blocks, no holes.
        std::os::unix::fs::FileExt::write_at(&f, &[0u8; 8192], 5 * mib + 4096).unwrap();
    }
    let host_blocks = fs::metadata(&src).unwrap().blocks();
    for bs in ["1024", "4096"] {
        let img = mkimg(dir.path(), &format!("holes-{bs}.img"), "128M", &["-b", bs]);
        let at = format!("{}:/sparse", img.display());
        run_ok(ext4kit().arg("cp").arg(&src).arg(&at)).unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("bs {bs}: {e}"));
        let o = run_ok(ext4kit().args(["stat", "--json"]).arg(&at)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["size"].as_u64(), Some(63 * mib), "bs {bs}: {v}");
        // 63 × 4 KiB of data and one extent leaf block.
        let blocks = v["blocks"].as_u64().unwrap();
        let leaf = bs.parse::<u64>().unwrap() / 512;
        assert_eq!(blocks, 63 * 8 + leaf, "bs {bs}: 512-byte blocks");
        assert!(
            blocks <= host_blocks + leaf,
            "bs {bs}: {blocks} > host {host_blocks}"
        );
        assert_eq!(debugfs(&img, false, "cat /sparse"), want, "bs {bs}");
        // Back to the host: holes stay holes, plain and with -a.
        for flags in [&[][..], &["-a"][..]] {
            let out = dir.path().join(format!("back-{bs}-{}", flags.len()));
            run_ok(ext4kit().arg("cp").args(flags).arg(&at).arg(&out)).unwrap();
            assert_eq!(fs::read(&out).unwrap(), want, "bs {bs} {flags:?}");
            let b = fs::metadata(&out).unwrap().blocks();
            assert!(
                b <= 63 * 8 + 64,
                "bs {bs} {flags:?}: {b} blocks on the host"
            );
        }
    }
}
