//! The operations layer from several threads at once (issue 7 item 4, a
//! thread-safe library API): threads hammering one file (disjoint and
//! overlapping writes across handles, truncate, fallocate, setattr,
//! xattrs), one pair of directories (create, mkdir, rmdir, unlink, link
//! and rename between them, rename over a name, RENAME_EXCHANGE) and the
//! orphan list and orphan file (unlink_open + release_orphan), with
//! readers alongside that must never see a change half done. Then close,
//! `e2fsck -fn` clean, and the final state one that a serial order of the
//! same calls gives.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode, RenameFlags, SetAttr, Times};
use ext4kit_fs::inode::Timestamp;
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

const THREADS: u64 = 4;
const KIB: u64 = 1024;

fn file(fs: &Filesystem, dir: u32, name: &str) -> u32 {
    fs.create(dir, name.as_bytes(), &NewInode::new(S_IFREG | 0o644, 0, 0))
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
        .0
        .ino
}

fn dir(fs: &Filesystem, parent: u32, name: &str) -> u32 {
    fs.mkdir(
        parent,
        name.as_bytes(),
        &NewInode::new(S_IFDIR | 0o755, 0, 0),
    )
    .unwrap_or_else(|e| panic!("mkdir {name}: {e}"))
    .0
    .ino
}

fn read(fs: &Filesystem, ino: u32, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let n = fs.read_at(ino, off, &mut b).unwrap();
    b.truncate(n);
    b
}

/// Names in directory `d` (without `.` and `..`).
fn names(fs: &Filesystem, d: u32) -> BTreeMap<Vec<u8>, u32> {
    let i = fs.inode(d).unwrap();
    fs.read(|f| f.read_dir(&i))
        .unwrap()
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| (e.name, e.ino))
        .collect()
}

/// One block of thread `t`'s part of the fragmented file.
fn block_data(t: u64, k: u64) -> Vec<u8> {
    pattern(KIB as usize, 1000 * t + k + 1)
}

/// Four threads on one file: each writes every other block of its own
/// region (hundreds of extents: the tree splits and grows while the
/// others edit it), preallocates (KEEP_SIZE) and punches in its region,
/// sets its xattr, mode and times; two readers keep reading a region
/// written before and the attributes. Then all of them write one 5 MiB
/// range over each other (three handles per write) while a fifth thread
/// truncates and zero-ranges it: serially the file is one writer's bytes
/// (or zeros) up to its size, never a mix of chunks.
#[test]
fn one_file_from_many_threads() {
    if let Err(r) = e2fs_tools() {
        return skip("one_file_from_many_threads", &r);
    }
    let d = image_dir();
    let img = mkimg(d.path(), "f.img", "128M", &["-b", "1024"]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let f = file(&fs, 2, "f");
    let head = pattern(64 * KIB as usize, 99);
    fs.write_at(f, 0, &head).unwrap();
    let region = |t: u64| 256 * KIB + t * 2048 * KIB;
    const BLOCKS: u64 = 240;
    // The end first: the preallocations stay inside the file (unwritten
    // extents past EOF that get index entries of their own make e2fsck
    // 1.47 complain, a separate matter).
    let end = region(THREADS);
    fs.write_at(f, end, b"e").unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (fs, stop, head) = (&fs, &stop, &head);
                s.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        assert!(read(fs, f, 0, head.len()) == *head, "the head changed");
                        fs.xattrs(f).unwrap();
                        fs.inode(f).unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let base = region(t);
                    for k in 0..BLOCKS {
                        fs.write_at(f, base + 2 * k * KIB, &block_data(t, k))
                            .unwrap();
                        if k % 20 == 0 {
                            // Preallocated and punched blocks in the upper
                            // half of the region (never written).
                            let up = base + 1024 * KIB + k * 2 * KIB;
                            let keep = Falloc {
                                keep_size: true,
                                ..Falloc::default()
                            };
                            fs.fallocate(f, up, 4 * KIB, keep).unwrap();
                            let punch = Falloc {
                                keep_size: true,
                                punch_hole: true,
                                ..Falloc::default()
                            };
                            fs.fallocate(f, up + KIB, KIB, punch).unwrap();
                            let name = format!("user.t{t}");
                            fs.set_xattr(f, name.as_bytes(), Some(&k.to_le_bytes()), SetMode::Any)
                                .unwrap();
                            let ts = Timestamp {
                                sec: 1_700_000_000 + k as i64,
                                nsec: t as u32,
                            };
                            let a = SetAttr {
                                mode: Some(0o600 + t as u16),
                                times: Some(Times {
                                    mtime: Some(ts),
                                    ..Times::default()
                                }),
                                ..SetAttr::default()
                            };
                            fs.setattr(f, &a).unwrap();
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    });
    // Every thread's blocks, the holes between them, the head.
    assert_eq!(fs.inode(f).unwrap().size, end + 1);
    assert!(read(&fs, f, 0, head.len()) == head);
    for t in 0..THREADS {
        let base = region(t);
        let got = read(&fs, f, base, (2 * BLOCKS * KIB) as usize);
        for k in 0..BLOCKS {
            let at = (2 * k * KIB) as usize;
            assert!(
                got[at..at + KIB as usize] == block_data(t, k)[..],
                "thread {t} block {k}"
            );
            if at + 2 * KIB as usize <= got.len() {
                assert!(
                    got[at + KIB as usize..at + 2 * KIB as usize]
                        .iter()
                        .all(|&b| b == 0)
                );
            }
        }
    }
    let xattrs = fs.xattrs(f).unwrap();
    for t in 0..THREADS {
        let name = format!("user.t{t}");
        let x = xattrs.iter().find(|x| x.name == name.as_bytes());
        let want = ((BLOCKS - 1) / 20 * 20).to_le_bytes();
        assert_eq!(x.map(|x| &x.value[..]), Some(&want[..]), "{name}");
    }

    // Overlapping writes of three handles each, truncates, zero ranges.
    let g = file(&fs, 2, "g");
    let len = 5 * 1024 * KIB + 123;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = &fs;
            s.spawn(move || {
                let data = vec![t as u8 + 1; len as usize];
                for _ in 0..3 {
                    fs.write_at(g, 0, &data).unwrap();
                }
            });
        }
        let fs = &fs;
        s.spawn(move || {
            for k in 0..6u64 {
                fs.truncate(g, len / (k + 2)).unwrap();
                let z = Falloc {
                    keep_size: true,
                    zero_range: true,
                    ..Falloc::default()
                };
                if k % 2 == 0 {
                    fs.fallocate(g, 0, len, z).unwrap();
                }
                // Shrinking only: a sparse growth would end the file in
                // zeros after a writer's bytes (a serial outcome too).
                let a = SetAttr {
                    size: Some(len / (k + 3)),
                    ..SetAttr::default()
                };
                fs.setattr(g, &a).unwrap();
            }
        });
    });
    let size = fs.inode(g).unwrap().size;
    let got = read(&fs, g, 0, size as usize);
    assert_eq!(got.len() as u64, size);
    if let Some(&b0) = got.first() {
        let mixed = got.iter().position(|&b| b != b0);
        assert_eq!(mixed, None, "g (size {size}) starts with {b0} but changes");
    }
    fs.close().unwrap();
    e2fsck_clean_with(&img, &["-E", "no_optimize_extents"]).unwrap();
}

/// What one directory thread expects at the end: (in B?, name) -> kind
/// ('f' file, 'd' directory).
type Model = BTreeMap<(bool, String), char>;

/// Four threads change two directories at once: files and directories
/// made in A (long names: the directories become htrees and split
/// leaves), hard links from A into B, renames from A to B (directories
/// too, which moves link counts of both parents), renames over an
/// existing name, rmdirs, unlinks, and all of them swap A/X and B/Y with
/// RENAME_EXCHANGE. Readers keep looking up names that exist throughout.
/// The end state is each thread's own model (its names are its own) plus
/// X and Y, and e2fsck agrees with every link count.
#[test]
fn directories_from_many_threads() {
    if let Err(r) = e2fs_tools() {
        return skip("directories_from_many_threads", &r);
    }
    let d = image_dir();
    let img = mkimg(d.path(), "d.img", "64M", &["-b", "1024"]);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let a = dir(&fs, 2, "A");
    let b = dir(&fs, 2, "B");
    for k in 0..16 {
        file(&fs, a, &format!("keep_{k}"));
    }
    let x = file(&fs, a, "X");
    let y = file(&fs, b, "Y");
    let ex = RenameFlags {
        exchange: true,
        ..RenameFlags::default()
    };
    let stop = AtomicBool::new(false);
    const N: u64 = 60;
    let models: Vec<Model> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (fs, stop) = (&fs, &stop);
                s.spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let k = n % 16;
                        let name = format!("keep_{k}");
                        assert!(
                            fs.lookup(a, name.as_bytes()).unwrap().is_some(),
                            "{name} vanished"
                        );
                        let (d, want) = if r == 0 { (a, "X") } else { (b, "Y") };
                        assert!(
                            fs.lookup(d, want.as_bytes()).unwrap().is_some(),
                            "{want} vanished"
                        );
                        if n.is_multiple_of(8) {
                            // readdir as the mount does it.
                            let seen = fs.read_locked(a, |f, i| f.read_dir(i)).unwrap();
                            assert!(seen.iter().any(|e| e.name == b"keep_0"));
                        }
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let mut m = Model::new();
                    let long = "_a_long_name_that_fills_directory_blocks_quickly";
                    for i in 0..N {
                        let fname = format!("f{t}_{i}{long}");
                        let fino = file(fs, a, &fname);
                        m.insert((false, fname.clone()), 'f');
                        let dname = format!("d{t}_{i}");
                        dir(fs, a, &dname);
                        m.insert((false, dname.clone()), 'd');
                        match i % 3 {
                            0 => {
                                let l = format!("l{t}_{i}");
                                fs.link(fino, b, l.as_bytes()).unwrap();
                                m.insert((true, l), 'f');
                            }
                            1 => {
                                let r = format!("r{t}_{i}");
                                fs.rename(
                                    a,
                                    fname.as_bytes(),
                                    b,
                                    r.as_bytes(),
                                    RenameFlags::default(),
                                )
                                .unwrap();
                                m.remove(&(false, fname.clone()));
                                m.insert((true, r), 'f');
                            }
                            _ => {
                                fs.unlink(a, fname.as_bytes()).unwrap();
                                m.remove(&(false, fname.clone()));
                            }
                        }
                        if i % 5 == 0 {
                            // A directory moves from A to B.
                            fs.rename(
                                a,
                                dname.as_bytes(),
                                b,
                                dname.as_bytes(),
                                RenameFlags::default(),
                            )
                            .unwrap();
                            m.remove(&(false, dname.clone()));
                            m.insert((true, dname.clone()), 'd');
                        }
                        if i % 4 == 0 {
                            let inb = m.contains_key(&(true, dname.clone()));
                            fs.rmdir(if inb { b } else { a }, dname.as_bytes()).unwrap();
                            m.remove(&(inb, dname.clone()));
                        }
                        if i % 6 == 0 {
                            // Over an existing name of the thread's own.
                            let tmp = format!("tmp{t}");
                            file(fs, a, &tmp);
                            let over = format!("over{t}");
                            fs.rename(
                                a,
                                tmp.as_bytes(),
                                b,
                                over.as_bytes(),
                                RenameFlags::default(),
                            )
                            .unwrap();
                            m.insert((true, over), 'f');
                        }
                        fs.rename(a, b"X", b, b"Y", ex).unwrap();
                    }
                    m
                })
            })
            .collect();
        let models = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        models
    });
    let mut want: BTreeMap<(bool, String), char> = models.into_iter().flatten().collect();
    for k in 0..16 {
        want.insert((false, format!("keep_{k}")), 'f');
    }
    want.insert((false, "X".into()), 'f');
    want.insert((true, "Y".into()), 'f');
    let mut got = BTreeMap::new();
    for (inb, d) in [(false, a), (true, b)] {
        for (name, ino) in names(&fs, d) {
            let kind = if fs.inode(ino).unwrap().is_dir() {
                'd'
            } else {
                'f'
            };
            got.insert((inb, String::from_utf8(name).unwrap()), kind);
        }
    }
    assert_eq!(got, want);
    // X and Y were swapped THREADS * N times: back where they started.
    let xy = (
        fs.lookup(a, b"X").unwrap().unwrap().ino,
        fs.lookup(b, b"Y").unwrap().unwrap().ino,
    );
    assert_eq!(xy, (x, y));
    let subdirs = |inb: bool| {
        want.iter()
            .filter(|(k, v)| k.0 == inb && **v == 'd')
            .count()
    };
    assert_eq!(fs.inode(a).unwrap().links as usize, 2 + subdirs(false));
    assert_eq!(fs.inode(b).unwrap().links as usize, 2 + subdirs(true));
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// Threads unlink files they hold open (or rename other files over them),
/// write to the orphans, and release them on "last close" in a shuffled
/// order, several orphans pending at
/// once: the old orphan list (chained through the inodes) and the orphan
/// file see concurrent inserts and removals. Everything is freed, the list
/// is empty and e2fsck is clean.
#[test]
fn orphans_from_many_threads() {
    if let Err(r) = e2fs_tools() {
        return skip("orphans_from_many_threads", &r);
    }
    let d = image_dir();
    for (name, args) in [
        ("list.img", &["-b", "1024", "-O", "^orphan_file"][..]),
        ("file.img", &["-b", "1024", "-O", "orphan_file"][..]),
    ] {
        let img = mkimg(d.path(), name, "64M", args);
        let before = e2fsck_clean(&img).unwrap();
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let free0 = fs.inode_alloc().free_inodes();
        let bfree0 = fs.block_alloc().free_blocks();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let fs = &fs;
                s.spawn(move || {
                    let mut rng = Rng(t * 7919 + 13);
                    let mut open: Vec<(u32, u64)> = Vec::new();
                    for i in 0..40u64 {
                        let n = format!("o{t}_{i}");
                        let ino = file(fs, 2, &n);
                        let len = 1 + rng.below(40 * KIB);
                        let seed = 100 * t + i;
                        fs.write_at(ino, 0, &pattern(len as usize, seed)).unwrap();
                        let orphan = if i % 4 == 3 {
                            // Replaced by a rename while open: an orphan in
                            // the rename's transaction.
                            let over = format!("n{t}_{i}");
                            file(fs, 2, &over);
                            let keep = |k: u32| {
                                assert_eq!(k, ino);
                                true
                            };
                            let flags = RenameFlags::default();
                            let (_, orphan) = fs
                                .rename_keep_if(2, over.as_bytes(), 2, n.as_bytes(), flags, keep)
                                .unwrap();
                            fs.unlink(2, n.as_bytes()).unwrap();
                            orphan
                        } else {
                            fs.unlink_open(2, n.as_bytes()).unwrap().1
                        };
                        assert!(orphan, "{n}");
                        fs.write_at(ino, len, b"tail").unwrap();
                        open.push((ino, seed));
                        // Release some of the pending ones, in any order.
                        while open.len() > 3 || (rng.below(3) == 0 && !open.is_empty()) {
                            let k = rng.below(open.len() as u64) as usize;
                            let (ino, seed) = open.swap_remove(k);
                            let i = fs.inode_any(ino).unwrap();
                            assert_eq!(i.links, 0);
                            let body = read(fs, ino, 0, (i.size - 4) as usize);
                            assert!(body == pattern(body.len(), seed), "orphan {ino}");
                            fs.release_orphan(ino).unwrap();
                        }
                    }
                    for (ino, _) in open {
                        fs.release_orphan(ino).unwrap();
                    }
                });
            }
        });
        assert_eq!(
            fs.rw().superblock().unwrap().s_last_orphan.get(),
            0,
            "{name}"
        );
        if let Some(of) = fs.orphan_file() {
            assert!(of.is_empty(), "{name}");
        }
        assert_eq!(fs.inode_alloc().free_inodes(), free0, "{name}");
        fs.sync().unwrap();
        // Every freed block is allocatable again once committed.
        assert_eq!(fs.block_alloc().free_blocks(), bfree0, "{name}");
        fs.close().unwrap();
        let after = e2fsck_clean(&img).unwrap();
        assert_eq!(after, before, "{name}");
    }
}

/// Lock order across a directory and its parent: C is made before P
/// (so C's inode number is the smaller) and then moved into P. One thread
/// moves a file between C and P (a cross-directory rename: P, the
/// ancestor, must be locked first, not the smaller number), others rename
/// C inside P, rmdir it (refused: not empty) and create and remove names
/// in both; ordered by number the first and the second would wait for
/// each other forever. A watchdog fails the test instead of hanging.
#[test]
fn renames_between_a_directory_and_its_parent_do_not_deadlock() {
    if let Err(r) = e2fs_tools() {
        return skip(
            "renames_between_a_directory_and_its_parent_do_not_deadlock",
            &r,
        );
    }
    let d = image_dir();
    let img = mkimg(d.path(), "r.img", "32M", &["-b", "1024"]);
    let fs = std::sync::Arc::new(Filesystem::open(open_file(&img), RwOptions::default()).unwrap());
    let c = dir(&fs, 2, "C");
    let p = dir(&fs, 2, "P");
    assert!(c < p);
    let none = RenameFlags::default();
    fs.rename(2, b"C", p, b"C", none).unwrap();
    file(&fs, c, "keep");
    file(&fs, c, "f");
    const N: u64 = 150;
    let (done, finished) = std::sync::mpsc::channel();
    type Job = Box<dyn FnOnce(&Filesystem) + Send>;
    let jobs: Vec<Job> = vec![
        Box::new(move |fs| {
            for _ in 0..N {
                fs.rename(c, b"f", p, b"f", none).unwrap();
                fs.rename(p, b"f", c, b"f", none).unwrap();
            }
        }),
        Box::new(move |fs| {
            for _ in 0..N {
                fs.rename(p, b"C", p, b"C2", none).unwrap();
                fs.rename(p, b"C2", p, b"C", none).unwrap();
            }
        }),
        Box::new(move |fs| {
            for _ in 0..N {
                for name in [&b"C"[..], b"C2"] {
                    match fs.rmdir(p, name) {
                        Err(ext4kit_fs::FsError::NotEmpty | ext4kit_fs::FsError::NotFound) => {}
                        other => panic!("rmdir of a non-empty directory: {other:?}"),
                    }
                }
            }
        }),
        Box::new(move |fs| {
            for i in 0..N {
                let g = format!("g{i}");
                file(fs, c, &g);
                fs.unlink(c, g.as_bytes()).unwrap();
                dir(fs, p, "e");
                fs.rmdir(p, b"e").unwrap();
            }
        }),
    ];
    for job in jobs {
        let (fs, done) = (fs.clone(), done.clone());
        std::thread::spawn(move || {
            job(&fs);
            drop(fs);
            let _ = done.send(());
        });
    }
    for _ in 0..4 {
        finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a worker died or the renames deadlocked");
    }
    assert!(fs.lookup(c, b"f").unwrap().is_some());
    assert!(fs.lookup(p, b"C").unwrap().is_some());
    let fs = std::sync::Arc::into_inner(fs).expect("the workers are done");
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}
