//! Incremental extent-tree edits (`ext4kit_fs::extent_write` through the
//! operations layer) on heavily fragmented files: a model-based random
//! test (content equal to a byte model, e2fsck clean, debugfs's `ex` equal
//! to ext4kit's mapping, depth 2 reached), the 20 000-extent file the
//! whole-tree rewrite refused (TooBig) with a bounded cost per append, a
//! kernel-written depth-2 tree edited by ext4kit and the kernel in turn,
//! and a power cut at every write of an edit that splits a leaf and grows
//! the tree.

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use common::*;
use ext4kit_device::{CutMode, Device, MemDevice};
use ext4kit_format::inode::S_IFREG;
use ext4kit_fs::extent::Mapping;
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

/// e2fsck without its pass-1E offers to repack extent trees ("could be
/// narrower/shorter. Optimize?"), for the kernel's own trees: its punch
/// leaves them in `kernel_and_ext4kit_edit_one_depth_two_tree_in_turn`.
/// ext4kit's deep trees get no such offer (edited ones are repacked at
/// sync and close).
const NO_OPTIMIZE: &[&str] = &["-E", "no_optimize_extents"];

fn create(fs: &Filesystem, name: &str) -> u32 {
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    fs.create(2, name.as_bytes(), &spec).unwrap().0.ino
}

/// ext4kit's mapping of `ino` and its tree depth.
fn mapping(fs: &Filesystem, ino: u32) -> (Vec<Mapping>, u16) {
    let i = fs.inode(ino).unwrap();
    let (maps, nodes) = fs.read(|f| f.extent_tree(&i)).unwrap();
    (maps, nodes.iter().map(|n| n.depth).max().unwrap_or(0))
}

/// The leaf extents `debugfs -R "ex PATH"` prints: (lblk, pblk, len,
/// unwritten), and the tree depth.
fn debugfs_extents(img: &Path, path: &str) -> (Vec<Mapping>, u16) {
    let out = run_ok(tool("debugfs").arg("-R").arg(format!("ex {path}")).arg(img)).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut v = Vec::new();
    let mut depth = 0;
    for line in text.lines() {
        // " 2/ 2   1/ 84     0 -     0  9217 -  9217      1 Uninit"
        let norm = line.replace('/', " ");
        let t: Vec<&str> = norm.split_whitespace().collect();
        let num = |i: usize| t.get(i).and_then(|s| s.parse::<u64>().ok());
        let (Some(lv), Some(max)) = (num(0), num(1)) else {
            continue;
        };
        depth = max as u16;
        if lv != max {
            continue;
        }
        let (Some(l), Some(p), Some(n)) = (num(4), num(7), num(10)) else {
            panic!("debugfs ex line {line:?}");
        };
        v.push(Mapping {
            lblk: l,
            pblk: p,
            len: n as u32,
            unwritten: t.get(11) == Some(&"Uninit"),
        });
    }
    (v, depth)
}

fn read_file(fs: &Filesystem, ino: u32) -> Vec<u8> {
    let size = fs.inode(ino).unwrap().size as usize;
    let mut v = vec![0u8; size];
    assert_eq!(fs.read_at(ino, 0, &mut v).unwrap(), size);
    v
}

/// Every other block of `n` written with its own pattern (one extent
/// each): returns the file's model.
fn fragment(fs: &Filesystem, ino: u32, n: u64, bs: u64) -> Vec<u8> {
    let mut model = Vec::new();
    for k in 0..n {
        let d = pattern(bs as usize, 1000 + k);
        fs.write_at(ino, 2 * k * bs, &d).unwrap();
        model.resize((2 * k * bs) as usize, 0);
        model.extend(d);
    }
    model
}

/// Random writes, punches, truncates and fallocates (all modes, writes
/// into unwritten ranges) on a fragmented file against a byte model:
/// after each sequence the content equals the model, the filesystem is
/// e2fsck clean, debugfs's `ex` lists exactly ext4kit's extents, and a
/// tree of depth 2 was edited. `EXT4KIT_EXTENT_MODEL=N` runs N sequences
/// (default 3).
#[test]
fn random_edits_of_a_fragmented_file_match_the_model() {
    let name = "random_edits_of_a_fragmented_file_match_the_model";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let runs: u64 = std::env::var("EXT4KIT_EXTENT_MODEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let dir = image_dir();
    let base = mkimg(dir.path(), "base.img", "32M", &["-b", "1024"]);
    let bs = 1024u64;
    let mut deepest = 0;
    for run in 0..runs {
        let img = dir.path().join("m.img");
        sparse_copy(&base, &img);
        let mut rng = Rng(0xE87 ^ (run + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let ino = create(&fs, "f");
        // 400 one-block extents: five 1 KiB leaves, depth 2.
        let mut data = fragment(&fs, ino, 400, bs);
        assert_eq!(mapping(&fs, ino).1, 2, "run {run}: fragmented depth");
        let span = 1000 * bs;
        for step in 0..60 {
            let ctx = format!("run {run} step {step}");
            let off = rng.below(span);
            let len = 1 + if rng.below(3) == 0 {
                rng.below(60 * bs)
            } else {
                rng.below(3 * bs)
            };
            match rng.below(8) {
                0..=2 => {
                    let d = pattern(len as usize, rng.next());
                    fs.write_at(ino, off, &d)
                        .unwrap_or_else(|e| panic!("{ctx}: write {off}+{len}: {e}"));
                    let end = (off + len) as usize;
                    if data.len() < end {
                        data.resize(end, 0);
                    }
                    data[off as usize..end].copy_from_slice(&d);
                }
                3 if rng.below(3) == 0 => {
                    let size = data.len() as u64 / 2 + rng.below(data.len() as u64);
                    fs.truncate(ino, size)
                        .unwrap_or_else(|e| panic!("{ctx}: truncate {size}: {e}"));
                    data.resize(size as usize, 0);
                }
                _ => {
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
                        .unwrap_or_else(|e| panic!("{ctx}: fallocate {m:?} {off}+{len}: {e}"));
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
            }
            let (_, d) = mapping(&fs, ino);
            deepest = deepest.max(d);
            if step % 20 == 19 {
                assert!(read_file(&fs, ino) == data, "{ctx}: content");
            }
        }
        assert!(read_file(&fs, ino) == data, "run {run}: content");
        // The sync repacks a deep tree e2fsck would offer to rebuild.
        fs.sync().unwrap();
        assert!(read_file(&fs, ino) == data, "run {run}: content after sync");
        let (maps, _) = mapping(&fs, ino);
        let blocks = fs.inode(ino).unwrap().blocks_512;
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("run {run}: {e}"));
        let (dx, ddepth) = debugfs_extents(&img, "/f");
        assert_eq!(dx, maps, "run {run}: debugfs ex");
        let cat = run_ok(tool("debugfs").arg("-R").arg("cat /f").arg(&img)).unwrap();
        assert!(cat.stdout == data, "run {run}: debugfs cat");
        // Reopened: the same bytes and counts.
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        assert!(read_file(&fs, ino) == data);
        assert_eq!(fs.inode(ino).unwrap().blocks_512, blocks);
        assert_eq!(mapping(&fs, ino).1, ddepth);
        fs.close().unwrap();
    }
    assert!(deepest >= 2, "deepest tree {deepest}");
}

/// A file of about a thousand one-block extents (1 KiB blocks: a depth-2
/// tree, one index node) and a `KEEP_SIZE` preallocation of 1 MiB past
/// its end, then punched into some 60 extents, written into and random
/// writes inside, as fsx leaves a file: e2fsck found "end of extent
/// exceeds allowed value" when a leaf started past i_size's blocks (the
/// preallocation alone in the leaf its insert split off), an index entry
/// e2fsck bounds by i_size. The content stays the model's.
#[test]
fn keep_size_preallocation_past_the_end_of_a_deep_tree() {
    let name = "keep_size_preallocation_past_the_end_of_a_deep_tree";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let dir = image_dir();
    let base = mkimg(dir.path(), "base.img", "32M", &["-b", "1024"]);
    let bs = 1024u64;
    let keep = Falloc {
        keep_size: true,
        ..Falloc::default()
    };
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    // (extents: 1008 fill twelve leaves; gap in blocks past the end)
    for (case, n, gap) in [(0u64, 1008u64, 64u64), (1, 960, 0), (2, 1000, 7)] {
        let img = dir.path().join(format!("p{case}.img"));
        sparse_copy(&base, &img);
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let ino = create(&fs, "f");
        let mut data = fragment(&fs, ino, n, bs);
        let end = data.len() as u64;
        let pre = end + gap * bs;
        fs.fallocate(ino, pre, 1 << 20, keep).unwrap();
        assert_eq!(mapping(&fs, ino).1, 2, "case {case}: depth");
        let ctx = format!("case {case}");
        let mut rng = Rng(0x5EED ^ case);
        for k in 0..60u64 {
            let off = pre + (16 * k + 1 + rng.below(14)) * bs;
            fs.fallocate(ino, off, bs, punch)
                .unwrap_or_else(|e| panic!("{ctx}: punch {k}: {e}"));
        }
        assert_eq!(fs.inode(ino).unwrap().size, end, "{ctx}: size kept");
        // Writes inside, and one into the preallocation (i_size grows
        // over part of it).
        for k in 0..20u64 {
            let off = rng.below(end);
            let d = pattern(1 + rng.below(3 * bs) as usize, 77 + k);
            fs.write_at(ino, off, &d).unwrap();
            let e = (off as usize + d.len()).max(data.len());
            data.resize(e, 0);
            data[off as usize..off as usize + d.len()].copy_from_slice(&d);
        }
        if case == 2 {
            let off = pre + 200 * bs + 3;
            let d = pattern(5 * bs as usize, 9);
            fs.write_at(ino, off, &d).unwrap();
            data.resize(off as usize, 0);
            data.extend(&d);
        }
        assert!(read_file(&fs, ino) == data, "{ctx}: content");
        let (maps, _) = mapping(&fs, ino);
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(debugfs_extents(&img, "/f").0, maps, "{ctx}: debugfs ex");
    }
}

/// 12 000 one-block extents in one file (1 KiB blocks) on a filesystem
/// with a 1 MiB journal (256-block transactions). The whole-tree rewrite
/// logged every tree block on every write: 20 000 appends took 488 s here
/// (240 block reads per append at the end, 8 at the start: this test's
/// bound fails) and past about 250 tree blocks (21 000 extents) one
/// write needs more credits than a transaction holds. The incremental
/// edits read and change a bounded number of blocks per append whatever
/// the tree's size. Then holes punched at random and a truncate to 0
/// give every block back. `EXT4KIT_EXTENT_APPENDS=N` for another count
/// (24 000 passes in 45 s of a debug build, most of it in the block
/// allocator's per-operation work on a group cut into thousands of free
/// ranges).
#[test]
fn many_extents_append_at_a_bounded_cost() {
    let name = "many_extents_append_at_a_bounded_cost";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let n: u64 = std::env::var("EXT4KIT_EXTENT_APPENDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12_000);
    let dir = image_dir();
    let bs = 1024u64;
    let size = format!("{}M", (2 * n * bs).div_ceil(1 << 20) + 24);
    let img = mkimg(
        dir.path(),
        "big.img",
        &size,
        &["-b", "1024", "-J", "size=1"],
    );
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let free0 = fs.block_alloc().free_blocks();
    let ino = create(&fs, "big");
    let reads = |fs: &Filesystem| {
        let s = fs.rw().blocks().stats();
        s.hits + s.misses
    };
    let window = 1000.min(n / 4);
    let mut first = 0;
    let mut last = 0;
    let block = vec![0x5Au8; bs as usize];
    for k in 0..n {
        let r0 = reads(&fs);
        fs.write_at(ino, 2 * k * bs, &block)
            .unwrap_or_else(|e| panic!("append {k}: {e}"));
        let r = reads(&fs) - r0;
        if k < window {
            first += r;
        } else if k >= n - window {
            last += r;
        }
    }
    let (maps, depth) = mapping(&fs, ino);
    assert_eq!(maps.len() as u64, n);
    assert!(depth >= 2, "depth {depth}");
    // Block reads per append grow with the depth only (one more level
    // from 1 to 3 at most), never with the number of extents.
    assert!(
        last <= 2 * first + 10 * window,
        "reads per append: first {first}, last {last} per {window}"
    );
    // Random one-block punches into the extents' neighbours and a few
    // bigger ones.
    let mut rng = Rng(77);
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    for _ in 0..200 {
        let k = rng.below(2 * n);
        let len = if rng.below(10) == 0 { 500 } else { 1 };
        fs.fallocate(ino, k * bs, len * bs, punch).unwrap();
    }
    fs.sync().unwrap();
    let (maps, _) = mapping(&fs, ino);
    let mapped: u64 = maps.iter().map(|m| u64::from(m.len)).sum();
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    let (dx, _) = debugfs_extents(&img, "/big");
    assert_eq!(dx, maps);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let i = fs.inode(ino).unwrap();
    assert!(i.blocks_512 >= mapped * 2);
    fs.truncate(ino, 0).unwrap();
    fs.sync().unwrap();
    let (maps, depth) = mapping(&fs, ino);
    assert!(maps.is_empty() && depth == 0);
    assert_eq!(fs.inode(ino).unwrap().blocks_512, 0);
    // Every data and tree block is free again (on disk; busy ones too).
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// Random one-block punches into a fully allocated 1 GiB file (4 KiB
/// blocks): every punch splits an extent, the tree grows to thousands of
/// extents and depth 2, and the block reads per punch stay bounded.
/// `EXT4KIT_EXTENT_PUNCHES=N` for another count (default 3000).
#[test]
fn random_punches_in_a_gigabyte_file_stay_bounded() {
    let name = "random_punches_in_a_gigabyte_file_stay_bounded";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let n: u64 = std::env::var("EXT4KIT_EXTENT_PUNCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let dir = image_dir();
    let bs = 4096u64;
    let img = mkimg(dir.path(), "p.img", "1200M", &["-b", "4096"]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let ino = create(&fs, "p");
    let gib = 1u64 << 30;
    fs.fallocate(ino, 0, gib, Falloc::default()).unwrap();
    // Some written data too: the first and the last 8 MiB.
    for off in [0, gib - (8 << 20)] {
        fs.write_at(ino, off, &pattern(8 << 20, off)).unwrap();
    }
    let reads = |fs: &Filesystem| {
        let s = fs.rw().blocks().stats();
        s.hits + s.misses
    };
    let mut rng = Rng(99);
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    let window = 500.min(n / 4);
    let (mut first, mut last) = (0, 0);
    let mut holes = std::collections::BTreeSet::new();
    for k in 0..n {
        let b = rng.below(gib / bs);
        let r0 = reads(&fs);
        fs.fallocate(ino, b * bs, bs, punch).unwrap();
        let r = reads(&fs) - r0;
        holes.insert(b);
        if k < window {
            first += r;
        } else if k >= n - window {
            last += r;
        }
    }
    let (maps, depth) = mapping(&fs, ino);
    assert!(depth >= 2 || n < 2000, "depth {depth}");
    assert!(maps.len() as u64 > holes.len() as u64 / 2);
    assert!(
        last <= 2 * first + 10 * window,
        "reads per punch: first {first}, last {last} per {window}"
    );
    let mapped: u64 = maps.iter().map(|m| u64::from(m.len)).sum();
    assert_eq!(mapped, gib / bs - holes.len() as u64);
    // The written data outside the holes is intact.
    let mut buf = vec![0u8; 8 << 20];
    fs.read_at(ino, 0, &mut buf).unwrap();
    let mut want = pattern(8 << 20, 0);
    for &h in holes.range(..(8 << 20) / bs) {
        want[(h * bs) as usize..((h + 1) * bs) as usize].fill(0);
    }
    assert!(buf == want);
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(debugfs_extents(&img, "/p").0, maps);
}

/// As root with loop devices: the kernel writes a file with a depth-2
/// tree (every other block); ext4kit writes into its holes and the middle
/// of extents and punches a range; the kernel reads the same bytes, writes
/// and punches further; ext4kit reads what the kernel made. e2fsck is
/// clean after each writer.
#[test]
fn kernel_and_ext4kit_edit_one_depth_two_tree_in_turn() {
    let name = "kernel_and_ext4kit_edit_one_depth_two_tree_in_turn";
    if let Err(r) = e2fs_tools().and_then(|_| kernel_mount_available()) {
        return skip(name, &r);
    }
    if !have("fallocate") {
        return skip(name, "fallocate (util-linux) not found");
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "k.img", "32M", &["-b", "1024"]);
    let bs = 1024u64;
    let mut model;
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let p = m.path().join("f");
        let f = fs::File::create(&p).unwrap();
        model = Vec::new();
        for k in 0..500u64 {
            let d = pattern(bs as usize, k);
            std::os::unix::fs::FileExt::write_all_at(&f, &d, 2 * k * bs).unwrap();
            model.resize((2 * k * bs) as usize, 0);
            model.extend(d);
            if k % 50 == 49 {
                f.sync_all().unwrap();
            }
        }
        f.sync_all().unwrap();
        drop(f);
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    let (_, kdepth) = debugfs_extents(&img, "/f");
    assert_eq!(kdepth, 2, "the kernel's tree");
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let ino = fs.read(|f| f.resolve(b"/f", true)).unwrap().ino;
    assert!(
        read_file(&fs, ino) == model,
        "ext4kit reads the kernel's file"
    );
    // Holes filled, written blocks overwritten across extents, a punch.
    for (off, len, seed) in [
        (bs, 3 * bs, 1u64),
        (301 * bs + 100, 40 * bs, 2),
        (700 * bs, 2 * bs, 3),
    ] {
        let d = pattern(len as usize, seed);
        fs.write_at(ino, off, &d).unwrap();
        let end = (off + len) as usize;
        model[off as usize..end].copy_from_slice(&d);
    }
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    fs.fallocate(ino, 500 * bs + 10, 100 * bs, punch).unwrap();
    model[(500 * bs + 10) as usize..(600 * bs + 10) as usize].fill(0);
    let (maps, _) = mapping(&fs, ino);
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    assert_eq!(debugfs_extents(&img, "/f").0, maps);
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let p = m.path().join("f");
        assert!(
            fs::read(&p).unwrap() == model,
            "the kernel reads ext4kit's edits"
        );
        let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
        let d = pattern(5 * bs as usize, 9);
        std::os::unix::fs::FileExt::write_all_at(&f, &d, 401 * bs).unwrap();
        model[(401 * bs) as usize..(406 * bs) as usize].copy_from_slice(&d);
        f.sync_all().unwrap();
        drop(f);
        run_ok(
            tool("fallocate")
                .args([
                    "-p",
                    "-o",
                    &(800 * bs).to_string(),
                    "-l",
                    &(50 * bs).to_string(),
                ])
                .arg(&p),
        )
        .unwrap();
        model[(800 * bs) as usize..(850 * bs) as usize].fill(0);
        m.unmount().unwrap();
    }
    // The kernel's punch leaves leaves e2fsck offers to narrow.
    e2fsck_clean_with(&img, NO_OPTIMIZE).unwrap();
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    assert!(
        read_file(&fs, ino) == model,
        "ext4kit reads the kernel's edits"
    );
    fs.write_at(ino, 3 * bs, b"last").unwrap();
    model[(3 * bs) as usize..(3 * bs) as usize + 4].copy_from_slice(b"last");
    // ext4kit's close repacks the tree it edited.
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    let cat = run_ok(tool("debugfs").arg("-R").arg("cat /f").arg(&img)).unwrap();
    assert!(cat.stdout == model);
}

/// A power cut at every write of an open, one write that splits a full
/// leaf and makes the tree one level deeper (four full 1 KiB leaves under
/// the root), a sync and a close, in both cut modes: the recovered file
/// has the old mapping or the new one, reads accordingly, and e2fsck is
/// clean.
#[test]
fn power_cut_during_a_split_that_grows_the_tree() {
    let name = "power_cut_during_a_split_that_grows_the_tree";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "c.img", "16M", &["-b", "1024"]);
    let bs = 1024u64;
    // 336 extents: a depth-1 tree with four full leaves.
    let (ino, old_data, old_map) = {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let ino = create(&fs, "f");
        // Another file's blocks between this one's: a write into a hole
        // cannot merge with its neighbours.
        let other = create(&fs, "g");
        let mut data = Vec::new();
        for k in 0..336u64 {
            let d = pattern(bs as usize, 1000 + k);
            fs.write_at(ino, 2 * k * bs, &d).unwrap();
            data.resize((2 * k * bs) as usize, 0);
            data.extend(d);
            fs.write_at(other, k * bs, &[7u8; 1024]).unwrap();
        }
        let (maps, depth) = mapping(&fs, ino);
        assert_eq!((maps.len(), depth), (336, 1));
        fs.close().unwrap();
        (ino, data, maps)
    };
    e2fsck_clean(&img).unwrap();
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    // The edit: a block in a hole inside the first leaf (a split in the
    // middle, then the full root grows).
    let at = 5 * bs;
    let new_block = pattern(bs as usize, 4242);
    let mut new_data = old_data.clone();
    new_data[at as usize..(at + bs) as usize].copy_from_slice(&new_block);
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let fs = Filesystem::open(dev, RwOptions::default()).map_err(e)?;
        fs.write_at(ino, at, &new_block).map_err(e)?;
        fs.sync().map_err(e)?;
        fs.close().map_err(e)
    };
    let one = |cut: Option<u64>, mode: CutMode| run_cut(&base, cut, mode, run);
    let (mem, r, ops) = one(None, CutMode::DropAll);
    r.unwrap();
    let new_map = {
        let fs = Filesystem::open(mem as Arc<dyn Device>, RwOptions::default()).unwrap();
        let (maps, depth) = mapping(&fs, ino);
        assert_eq!((maps.len(), depth), (337, 2), "the edit splits and grows");
        assert!(read_file(&fs, ino) == new_data);
        maps
    };
    let mut seen = [false; 2];
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 11,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (mem, _, _) = one(Some(cut), mode);
            let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
                .unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
            let (maps, _) = mapping(&fs, ino);
            let got = read_file(&fs, ino);
            fs.close().unwrap();
            if maps == old_map {
                assert!(
                    got == old_data,
                    "cut {cut} {mode:?}: old mapping, other bytes"
                );
                seen[0] = true;
            } else {
                assert_eq!(maps, new_map, "cut {cut} {mode:?}: neither mapping");
                assert!(
                    got == new_data,
                    "cut {cut} {mode:?}: new mapping, other bytes"
                );
                seen[1] = true;
            }
            let out = dir.path().join("cut.img");
            fs::write(&out, mem.to_bytes()).unwrap();
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("cut {cut} {mode:?}: {e}"));
        }
    }
    assert!(seen[0] && seen[1], "both outcomes seen: {seen:?}");
}

/// A power cut at every write of a truncate that takes several handles
/// (a depth-2 tree of 2000 one-block extents, 1 KiB blocks, transactions
/// capped small so each handle commits on its own), with the orphan file
/// and with the old orphan list: after the next open (replay, then
/// orphan processing) the file has its old size and bytes or its new
/// ones, the free block count is the old or the new one to the block
/// (nothing leaked, nothing freed twice), the orphan list is empty and
/// e2fsck is clean. On some cuts e2fsck's own replay and orphan
/// processing (`-fy`, what the kernel's mount does too) must end at one
/// of the two states as well.
#[test]
fn power_cut_during_a_multi_handle_truncate() {
    let name = "power_cut_during_a_multi_handle_truncate";
    if let Err(r) = e2fs_tools() {
        return skip(name, &r);
    }
    for (tag, extra) in [
        ("orphan_file", &[][..]),
        ("orphan list", &["-O", "^orphan_file"][..]),
    ] {
        truncate_cut_campaign(tag, extra);
    }
}

fn truncate_cut_campaign(tag: &str, extra: &[&str]) {
    let dir = image_dir();
    let mut args = vec!["-b", "1024"];
    args.extend_from_slice(extra);
    let img = mkimg(dir.path(), "t.img", "16M", &args);
    let bs = 1024u64;
    let n = 2000u64;
    let (ino, old_data, free_old) = {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let ino = create(&fs, "f");
        let data = fragment(&fs, ino, n, bs);
        let (_, depth) = mapping(&fs, ino);
        assert_eq!(depth, 2, "{tag}: a depth-2 tree");
        fs.close().unwrap();
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let free = fs.block_alloc().free_blocks();
        fs.close().unwrap();
        (ino, data, free)
    };
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    // Keep 100 of the 2000 extents and half a block of the next one.
    let new_size = 2 * 100 * bs + bs / 2;
    let new_data = old_data[..new_size as usize].to_vec();
    let small = || {
        let mut o = RwOptions::default();
        o.journal.max_transaction = Some(48);
        o
    };
    let commits = std::cell::Cell::new(0);
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        let fs = Filesystem::open(dev, small()).map_err(e)?;
        fs.truncate(ino, new_size).map_err(e)?;
        commits.set(fs.rw().journal().stats().commits);
        fs.close().map_err(e)
    };
    let one = |cut: Option<u64>| run_cut(&base, cut, CutMode::DropAll, run);
    let (mem, r, ops) = one(None);
    r.unwrap();
    let free_new = {
        let fs = Filesystem::open(mem as Arc<dyn Device>, RwOptions::default()).unwrap();
        assert!(read_file(&fs, ino) == new_data);
        let free = fs.block_alloc().free_blocks();
        fs.close().unwrap();
        free
    };
    assert!(free_new > free_old);
    // The truncate commits in several transactions (else there is
    // nothing to protect).
    assert!(commits.get() >= 2, "{tag}: {} commits", commits.get());
    let mut seen = [false; 2];
    for cut in 1..ops {
        let (mem, _, _) = one(Some(cut));
        let crashed = mem.to_bytes();
        let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default())
            .unwrap_or_else(|e| panic!("{tag} cut {cut}: {e}"));
        let got = read_file(&fs, ino);
        let free = fs.block_alloc().free_blocks();
        assert!(
            fs.orphan_file().is_none_or(|o| o.is_empty()),
            "{tag} cut {cut}"
        );
        assert_eq!(
            fs.rw().superblock().unwrap().s_last_orphan.get(),
            0,
            "{tag} cut {cut}"
        );
        fs.close().unwrap();
        if got.len() == old_data.len() {
            assert!(got == old_data, "{tag} cut {cut}: old size, other bytes");
            assert_eq!(free, free_old, "{tag} cut {cut}: old size, free count");
            seen[0] = true;
        } else {
            assert_eq!(
                got.len(),
                new_data.len(),
                "{tag} cut {cut}: size neither old nor new"
            );
            assert!(got == new_data, "{tag} cut {cut}: new size, other bytes");
            assert_eq!(free, free_new, "{tag} cut {cut}: new size, free count");
            seen[1] = true;
        }
        let out = dir.path().join("cut.img");
        fs::write(&out, mem.to_bytes()).unwrap();
        e2fsck_clean(&out).unwrap_or_else(|e| panic!("{tag} cut {cut}: {e}"));
        if cut % 8 == 0 {
            // e2fsck's replay and orphan processing on the crashed image.
            fs::write(&out, &crashed).unwrap();
            let st = tool("e2fsck").arg("-fy").arg(&out).output().unwrap();
            assert!(
                matches!(st.status.code(), Some(0 | 1)),
                "{tag} cut {cut}: e2fsck -fy: {}",
                String::from_utf8_lossy(&st.stdout)
            );
            e2fsck_clean(&out).unwrap_or_else(|e| panic!("{tag} cut {cut} after -fy: {e}"));
            let dev = MemDevice::from_bytes(fs::read(&out).unwrap());
            let fs =
                Filesystem::open(Arc::new(dev) as Arc<dyn Device>, RwOptions::default()).unwrap();
            let size = fs.inode(ino).unwrap().size;
            assert!(
                size == old_data.len() as u64 || size == new_size,
                "{tag} cut {cut}: e2fsck left size {size}"
            );
            fs.crash();
        }
    }
    assert!(seen[0] && seen[1], "{tag}: both outcomes seen: {seen:?}");
}
