//! The parallel engine (issue 18): handles of different inodes run side
//! by side (no operations mutex), each rendering its own allocator
//! groups. Checked here from several threads at once:
//! - a handle held open does not stop another inode's calls (under one
//!   operations mutex they would wait for it forever);
//! - threads each on their own files (writes, truncates, punches,
//!   xattrs, modes, renames, unlinks) and through one shared directory,
//!   against an in-memory model per thread: after they join, and again
//!   after a close and a reopen, every file's bytes and metadata are the
//!   model's; `e2fsck -fn` clean;
//! - many threads renaming, creating, unlinking and writing names that
//!   collide in three overlapping directories (and moving a directory
//!   between them) finish under a watchdog (a lock-order cycle fails the
//!   test instead of hanging it); `e2fsck -fn` clean;
//! - a power cut at every flush of a four-thread workload recorded once
//!   (and a sample of volatile-cache cuts) recovers, for every thread,
//!   a state between its last fsync and its last step; `e2fsck -fn` clean.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use ext4kit_device::{CutMode, CutReplay, Device, MemDevice, RecordingDevice, Trace};
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode, RenameFlags, SetAttr};
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

const KIB: u64 = 1024;
/// A watchdog's limit for work that takes seconds (debug build, shared
/// machine): only a deadlock reaches it.
const WATCHDOG: Duration = Duration::from_secs(240);

fn create(fs: &Filesystem, dir: u32, name: &str) -> u32 {
    fs.create(dir, name.as_bytes(), &NewInode::new(S_IFREG | 0o644, 0, 0))
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
        .0
        .ino
}

fn mkdir(fs: &Filesystem, parent: u32, name: &str) -> u32 {
    fs.mkdir(
        parent,
        name.as_bytes(),
        &NewInode::new(S_IFDIR | 0o755, 0, 0),
    )
    .unwrap_or_else(|e| panic!("mkdir {name}: {e}"))
    .0
    .ino
}

fn read_all(fs: &Filesystem, ino: u32) -> Vec<u8> {
    let size = fs.inode(ino).unwrap().size as usize;
    let mut b = vec![0u8; size];
    let n = fs.read_at(ino, 0, &mut b).unwrap();
    b.truncate(n);
    b
}

/// Names of directory `d` (without `.` and `..`).
fn names(fs: &Filesystem, d: u32) -> BTreeMap<String, u32> {
    let i = fs.inode(d).unwrap();
    fs.read(|f| f.read_dir(&i))
        .unwrap()
        .into_iter()
        .filter(|e| e.name != b"." && e.name != b"..")
        .map(|e| (String::from_utf8_lossy(&e.name).into_owned(), e.ino))
        .collect()
}

/// One thread's work, returning what it did.
type Job<T> = Box<dyn FnOnce(&Filesystem) -> T + Send>;

/// Run `jobs` on threads of their own; panic if one of them panics or if
/// they are not all done within [`WATCHDOG`] (a deadlock).
fn run_watched<T: Send + 'static>(fs: &Arc<Filesystem>, jobs: Vec<Job<T>>) -> Vec<T> {
    let (tx, rx) = mpsc::channel();
    let n = jobs.len();
    for (k, job) in jobs.into_iter().enumerate() {
        let (fs, tx) = (fs.clone(), tx.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&fs)));
            drop(fs);
            let _ = tx.send((k, r));
        });
    }
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (k, r) = rx
            .recv_timeout(WATCHDOG)
            .expect("the workers deadlocked (watchdog)");
        match r {
            Ok(r) => out[k] = Some(r),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    out.into_iter()
        .map(|r| r.expect("every job reported"))
        .collect()
}

/// A handle held open (an operation in the middle of its change) does
/// not keep other inodes' calls from running: a create, a write in two
/// handles, a rename, reads and an xattr of other inodes finish while it
/// is open. Before this, one operations mutex ran one handle at a time
/// and these would have waited for it.
#[test]
fn an_open_handle_does_not_stop_other_inodes() {
    if let Err(r) = e2fs_tools() {
        return skip("an_open_handle_does_not_stop_other_inodes", &r);
    }
    let d = image_dir();
    let img = mkimg(d.path(), "h.img", "64M", &[]);
    let fs = Arc::new(Filesystem::open(open_file(&img), RwOptions::default()).unwrap());
    let held = create(&fs, 2, "held");
    let dir = mkdir(&fs, 2, "d");
    let mut op = fs.begin(4, 1).unwrap();
    // The held operation changes its inode (a time), as a real one would.
    let mut i = fs.inode(held).unwrap();
    fs.edit_inode(&mut i, |n| n.i_mtime.set(1_700_000_000))
        .unwrap();
    fs.store_inode(&mut op, &i).unwrap();
    let work = move |fs: &Filesystem| {
        let f = create(fs, dir, "f");
        // Several handles, but no more than the running transaction
        // holds: a handle that does not fit waits for a commit, and the
        // commit for the open handle (jbd2's rule), which is not this.
        let data = pattern(9 * 1024 * 1024 + 17, 7);
        fs.write_at(f, 0, &data).unwrap();
        fs.rename(dir, b"f", 2, b"g", RenameFlags::default())
            .unwrap();
        let got = read_all(fs, f);
        assert!(got == data, "the other file's bytes");
        fs.set_xattr(f, b"user.x", Some(b"1"), SetMode::Any)
            .unwrap();
    };
    let (tx, rx) = mpsc::channel();
    let other = fs.clone();
    std::thread::spawn(move || {
        work(&other);
        drop(other);
        let _ = tx.send(());
    });
    rx.recv_timeout(WATCHDOG)
        .expect("another inode's calls waited for the open handle");
    fs.finish(op).unwrap();
    assert_eq!(fs.inode(held).unwrap().mtime.sec, 1_700_000_000);
    let fs = Arc::into_inner(fs).expect("the worker is done");
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// What one thread expects of one of its files.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileModel {
    data: Vec<u8>,
    mode: u16,
    xattr: Option<Vec<u8>>,
}

/// One thread's files by (directory, name), from its own calls only.
type Model = BTreeMap<(u32, String), (u32, FileModel)>;

/// The files of `model` are on the filesystem as the model says, and its
/// own directory holds nothing else.
fn check_model(fs: &Filesystem, t: u64, own: u32, shared: u32, model: &Model) {
    let mut want_own: BTreeMap<String, u32> = BTreeMap::new();
    let mut want_shared: BTreeMap<String, u32> = BTreeMap::new();
    for ((d, name), (ino, m)) in model {
        if *d == own {
            want_own.insert(name.clone(), *ino);
        } else {
            want_shared.insert(name.clone(), *ino);
        }
        let i = fs.inode(*ino).unwrap();
        assert_eq!(i.size, m.data.len() as u64, "thread {t}: size of {name}");
        assert_eq!(i.mode & 0o7777, m.mode, "thread {t}: mode of {name}");
        assert_eq!(i.links, 1, "thread {t}: links of {name}");
        assert!(read_all(fs, *ino) == m.data, "thread {t}: bytes of {name}");
        let x = fs.xattrs(*ino).unwrap();
        let got = x
            .iter()
            .find(|x| x.name == b"user.model")
            .map(|x| x.value.clone());
        assert_eq!(got, m.xattr, "thread {t}: xattr of {name}");
    }
    assert_eq!(names(fs, own), want_own, "thread {t}: its directory");
    let prefix = format!("s{t}_");
    let in_shared: BTreeMap<String, u32> = names(fs, shared)
        .into_iter()
        .filter(|(n, _)| n.starts_with(&prefix))
        .collect();
    assert_eq!(
        in_shared, want_shared,
        "thread {t}: its names in the shared directory"
    );
}

/// Four threads, each on files of its own in a directory of its own and
/// under names of its own in one shared directory (so every thread's
/// handles edit that directory too): creates, writes at random offsets
/// (also past the end: holes), truncates, punches, zero ranges, modes,
/// xattrs, renames within and across the two directories, unlinks and
/// fsyncs, all checked against a model per thread after they join, and
/// again after close and reopen. e2fsck -fn clean; the free counts are
/// the allocators'.
#[test]
fn threads_on_their_own_files_match_a_model() {
    if let Err(r) = e2fs_tools() {
        return skip("threads_on_their_own_files_match_a_model", &r);
    }
    let d = image_dir();
    for (name, args) in [
        ("p4k.img", &[][..]),
        ("p1k.img", &["-b", "1024", "-O", "^orphan_file"][..]),
    ] {
        let img = mkimg(d.path(), name, "96M", args);
        let fs = Arc::new(Filesystem::open(open_file(&img), RwOptions::default()).unwrap());
        let shared = mkdir(&fs, 2, "shared");
        const THREADS: u64 = 4;
        let dirs: Vec<u32> = (0..THREADS)
            .map(|t| mkdir(&fs, 2, &format!("t{t}")))
            .collect();
        let jobs: Vec<Job<Model>> = (0..THREADS)
            .map(|t| {
                let own = dirs[t as usize];
                Box::new(move |fs: &Filesystem| model_worker(fs, t, own, shared)) as Job<Model>
            })
            .collect();
        let models = run_watched(&fs, jobs);
        for (t, m) in models.iter().enumerate() {
            check_model(&fs, t as u64, dirs[t], shared, m);
        }
        let fs = Arc::into_inner(fs).expect("the workers are done");
        fs.close().unwrap();
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        for (t, m) in models.iter().enumerate() {
            check_model(&fs, t as u64, dirs[t], shared, m);
        }
        fs.close().unwrap();
    }
}

fn model_worker(fs: &Filesystem, t: u64, own: u32, shared: u32) -> Model {
    let mut rng = Rng(0x5eed + 977 * t);
    let mut model = Model::new();
    let mut next = 0u64;
    let mut seed = 1000 * t;
    for _ in 0..260 {
        let pick = rng.below(100);
        // A file of the model, when there is one.
        let key = (!model.is_empty()).then(|| {
            let k = rng.below(model.len() as u64) as usize;
            model.keys().nth(k).cloned().expect("k is in range")
        });
        match (pick, key) {
            (0..=14, _) | (_, None) => {
                next += 1;
                let name = format!("f{next}");
                let ino = create(fs, own, &name);
                let fm = FileModel {
                    data: Vec::new(),
                    mode: 0o644,
                    xattr: None,
                };
                model.insert((own, name), (ino, fm));
            }
            (15..=49, Some(k)) => {
                let (ino, m) = model.get_mut(&k).expect("picked from the model");
                let off = rng.below(300 * KIB);
                let big = rng.below(8) == 0;
                let len = 1 + rng.below(if big { 600 * KIB } else { 24 * KIB });
                seed += 1;
                let data = pattern(len as usize, seed);
                fs.write_at(*ino, off, &data).unwrap();
                let end = (off + len) as usize;
                if m.data.len() < end {
                    m.data.resize(end, 0);
                }
                m.data[off as usize..end].copy_from_slice(&data);
            }
            (50..=57, Some(k)) => {
                let (ino, m) = model.get_mut(&k).expect("picked from the model");
                let size = rng.below(m.data.len() as u64 + 40 * KIB);
                fs.truncate(*ino, size).unwrap();
                m.data.resize(size as usize, 0);
            }
            (58..=64, Some(k)) => {
                let (ino, m) = model.get_mut(&k).expect("picked from the model");
                let len = m.data.len() as u64;
                let off = rng.below(len + 1);
                let n = 1 + rng.below(64 * KIB);
                let punch = rng.below(2) == 0;
                let mode = Falloc {
                    keep_size: punch,
                    punch_hole: punch,
                    zero_range: !punch,
                };
                fs.fallocate(*ino, off, n, mode).unwrap();
                let end = (off + n) as usize;
                if !punch && m.data.len() < end {
                    m.data.resize(end, 0);
                }
                let stop = end.min(m.data.len());
                m.data[off as usize..stop].fill(0);
            }
            (65..=71, Some(k)) => {
                let (ino, m) = model.get_mut(&k).expect("picked from the model");
                let mode = 0o600 | (rng.below(0o100) as u16);
                let a = SetAttr {
                    mode: Some(mode),
                    ..SetAttr::default()
                };
                fs.setattr(*ino, &a).unwrap();
                m.mode = mode;
            }
            (72..=79, Some(k)) => {
                let (ino, m) = model.get_mut(&k).expect("picked from the model");
                if rng.below(4) == 0 && m.xattr.is_some() {
                    fs.set_xattr(*ino, b"user.model", None, SetMode::Any)
                        .unwrap();
                    m.xattr = None;
                } else {
                    // Large enough now and then to need the xattr block.
                    let v = pattern(1 + rng.below(300) as usize, seed);
                    fs.set_xattr(*ino, b"user.model", Some(&v), SetMode::Any)
                        .unwrap();
                    m.xattr = Some(v);
                }
            }
            (80..=89, Some(k)) => {
                // Rename within or across the two directories, sometimes
                // over another of the thread's files.
                let (ino, m) = model.remove(&k).expect("picked from the model");
                let to_dir = if rng.below(2) == 0 { own } else { shared };
                let over = (rng.below(3) == 0)
                    .then(|| model.keys().find(|(d, _)| *d == to_dir).cloned())
                    .flatten();
                let to = match over {
                    Some(o) => {
                        model.remove(&o);
                        o
                    }
                    None => {
                        next += 1;
                        let n = if to_dir == shared {
                            format!("s{t}_{next}")
                        } else {
                            format!("f{next}")
                        };
                        (to_dir, n)
                    }
                };
                fs.rename(
                    k.0,
                    k.1.as_bytes(),
                    to.0,
                    to.1.as_bytes(),
                    RenameFlags::default(),
                )
                .unwrap();
                model.insert(to, (ino, m));
            }
            (90..=95, Some(k)) => {
                model.remove(&k);
                fs.unlink(k.0, k.1.as_bytes()).unwrap();
            }
            (_, Some(k)) => {
                // fsync: the commit waits for the other threads' open
                // handles, theirs go on in the next transaction.
                let _ = k;
                fs.commit_tid(fs.rw().journal().running_tid()).unwrap();
            }
        }
    }
    model
}

/// Eight threads on names that collide, in three directories A, B and C
/// (C moved between A and B all along, with files in it): each loops over
/// creates, unlinks, writes, renames within and across the directories
/// (over names that exist or not), links, mkdir/rmdir and RENAME_EXCHANGE;
/// many calls fail (the name is gone, taken, a directory not empty), none
/// may hang or corrupt. Run under a watchdog; e2fsck -fn clean after.
#[test]
fn overlapping_directories_from_many_threads_do_not_deadlock() {
    if let Err(r) = e2fs_tools() {
        return skip(
            "overlapping_directories_from_many_threads_do_not_deadlock",
            &r,
        );
    }
    let d = image_dir();
    let img = mkimg(d.path(), "o.img", "64M", &["-b", "1024"]);
    let fs = Arc::new(Filesystem::open(open_file(&img), RwOptions::default()).unwrap());
    let a = mkdir(&fs, 2, "A");
    let b = mkdir(&fs, 2, "B");
    let c = mkdir(&fs, a, "C");
    create(&fs, c, "inside");
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 120;
    let anchors: Arc<Vec<u32>> = Arc::new(
        (0..THREADS)
            .map(|t| create(&fs, [a, b][t as usize % 2], &format!("keep{t}")))
            .collect(),
    );
    let jobs: Vec<Job<u64>> = (0..THREADS)
        .map(|t| {
            let anchors = anchors.clone();
            Box::new(move |fs: &Filesystem| {
                let mut rng = Rng(77 + t);
                let mut ok = 0u64;
                // Where C is, as far as this thread knows (others move it).
                let where_c = |fs: &Filesystem| {
                    if fs.lookup(a, b"C").ok().flatten().is_some() {
                        a
                    } else {
                        b
                    }
                };
                for _ in 0..ROUNDS {
                    let dirs = [a, b, c];
                    let d1 = dirs[rng.below(3) as usize];
                    let d2 = dirs[rng.below(3) as usize];
                    let n1 = format!("n{}", rng.below(6));
                    let n2 = format!("n{}", rng.below(6));
                    let r: Result<(), FsError> = match rng.below(9) {
                        0 => fs
                            .create(d1, n1.as_bytes(), &NewInode::new(S_IFREG | 0o644, 0, 0))
                            .map(|_| ()),
                        1 => fs.unlink(d1, n1.as_bytes()).map(|_| ()),
                        2 => {
                            // Into a file no call frees (the API leaves
                            // that to its caller: the mount holds a
                            // reference), linked under colliding names.
                            let f = anchors[rng.below(THREADS) as usize];
                            let off = rng.below(64 * KIB);
                            let data = pattern(1 + rng.below(32 * KIB) as usize, t);
                            fs.write_at(f, off, &data).map(|_| ())
                        }
                        3 | 4 => fs
                            .rename(d1, n1.as_bytes(), d2, n2.as_bytes(), RenameFlags::default())
                            .map(|_| ()),
                        5 => {
                            let flags = RenameFlags {
                                exchange: true,
                                ..RenameFlags::default()
                            };
                            fs.rename(d1, n1.as_bytes(), d2, n2.as_bytes(), flags)
                                .map(|_| ())
                        }
                        6 => {
                            let f = anchors[rng.below(THREADS) as usize];
                            fs.link(f, d2, n2.as_bytes()).map(|_| ())
                        }
                        7 => {
                            let n = format!("dir{}", rng.below(3));
                            if rng.below(2) == 0 {
                                fs.mkdir(d1, n.as_bytes(), &NewInode::new(S_IFDIR | 0o755, 0, 0))
                                    .map(|_| ())
                            } else {
                                fs.rmdir(d1, n.as_bytes()).map(|_| ())
                            }
                        }
                        _ => {
                            // Move C to the other of A and B (its files
                            // with it): a cross-directory rename of a
                            // directory while others work inside it.
                            let from = where_c(fs);
                            let to = if from == a { b } else { a };
                            fs.rename(from, b"C", to, b"C", RenameFlags::default())
                                .map(|_| ())
                        }
                    };
                    match r {
                        Ok(()) => ok += 1,
                        Err(e) if e.is_corruption() => panic!("thread {t}: {e}"),
                        Err(FsError::Aborted(e)) => panic!("thread {t}: journal aborted: {e}"),
                        Err(_) => {}
                    }
                }
                ok
            }) as Job<u64>
        })
        .collect();
    let done = run_watched(&fs, jobs);
    assert!(
        done.iter().sum::<u64>() > THREADS * ROUNDS / 4,
        "most calls failed: {done:?}"
    );
    // C and what it holds survived every move.
    let cs = names(&fs, a).contains_key("C") as u32 + names(&fs, b).contains_key("C") as u32;
    assert_eq!(cs, 1, "C is in exactly one of A and B");
    assert!(names(&fs, c).contains_key("inside"));
    for (t, &f) in anchors.iter().enumerate() {
        assert!(fs.inode(f).unwrap().links >= 1, "keep{t}");
    }
    let fs = Arc::into_inner(fs).expect("the workers are done");
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
}

/// One thread's appends: `(trace length after the fsync returned, bytes
/// fsynced)` per fsync, and the bytes of every step.
struct Appends {
    fsyncs: Vec<(u64, usize)>,
    steps: Vec<usize>,
}

/// The bytes thread `t` appends in all (its file is a prefix of them).
fn stream(t: u64) -> Vec<u8> {
    pattern(600 * KIB as usize, 31 + t)
}

/// Four threads append to a file each (in its own directory, with a
/// rename and an xattr now and then) and fsync most steps, on a device
/// that records every write and flush. Offline, a power cut after every
/// flush of the trace (every unflushed write lost) and after a sample of
/// other points (a seeded subset of the unflushed writes surviving, also
/// torn at 512 bytes) is recovered by the engine: every thread's file is
/// a prefix of its stream at one of its step boundaries, at least as
/// long as its last fsync that returned before the cut; e2fsck -fn clean
/// on every recovered image of the first kind and a sample of the
/// second.
#[test]
fn a_power_cut_under_threads_keeps_every_fsync() {
    if let Err(r) = e2fs_tools() {
        return skip("a_power_cut_under_threads_keeps_every_fsync", &r);
    }
    let d = image_dir();
    let img = mkimg(d.path(), "c.img", "32M", &["-b", "1024"]);
    let base = MemDevice::from_bytes(std::fs::read(&img).unwrap());
    let trace = Trace::new();
    let dev: Arc<dyn Device> =
        Arc::new(RecordingDevice::with_trace(base.snapshot(), trace.clone()));
    let fs = Arc::new(Filesystem::open(dev, RwOptions::default()).unwrap());
    const THREADS: u64 = 4;
    let dirs: Vec<u32> = (0..THREADS)
        .map(|t| mkdir(&fs, 2, &format!("t{t}")))
        .collect();
    let files: Vec<u32> = (0..THREADS)
        .map(|t| create(&fs, dirs[t as usize], "f"))
        .collect();
    fs.sync().unwrap();
    let start = trace.len();
    let jobs: Vec<Job<Appends>> = (0..THREADS)
        .map(|t| {
            let (dir, ino) = (dirs[t as usize], files[t as usize]);
            let trace = trace.clone();
            Box::new(move |fs: &Filesystem| {
                let all = stream(t);
                let mut rng = Rng(5 + t);
                let mut at = 0usize;
                let mut out = Appends {
                    fsyncs: Vec::new(),
                    steps: vec![0],
                };
                let mut name = "f".to_string();
                for k in 0..14 {
                    let n = (1 + rng.below(40 * KIB)) as usize;
                    let tid = fs.write_at(ino, at as u64, &all[at..at + n]).unwrap();
                    at += n;
                    out.steps.push(at);
                    if k % 4 == 1 {
                        let to = format!("f{k}");
                        fs.rename(
                            dir,
                            name.as_bytes(),
                            dir,
                            to.as_bytes(),
                            RenameFlags::default(),
                        )
                        .unwrap();
                        name = to;
                        fs.set_xattr(ino, b"user.k", Some(&[k as u8]), SetMode::Any)
                            .unwrap();
                    }
                    if k % 3 != 2 {
                        fs.commit_tid(tid.max(fs.rw().journal().running_tid()))
                            .unwrap();
                        out.fsyncs.push((trace.len(), at));
                    }
                }
                out
            }) as Job<Appends>
        })
        .collect();
    let runs = run_watched(&fs, jobs);
    let fs = Arc::into_inner(fs).expect("the workers are done");
    fs.close().unwrap();
    let ops = trace.ops();
    let total = ops.len() as u64;

    // Recover the image after a cut and check every thread's file.
    let out = d.path().join("cut.img");
    let check = |dev: MemDevice, k: u64, fsck: bool| -> Result<(), String> {
        let dev = Arc::new(dev);
        let fs = Filesystem::open(dev.clone(), RwOptions::default())
            .map_err(|e| format!("open after the cut: {e}"))?;
        for t in 0..THREADS {
            let r = &runs[t as usize];
            let ino = files[t as usize];
            let data = read_all(&fs, ino);
            let len = data.len();
            let all = stream(t);
            if data[..] != all[..len] {
                return Err(format!(
                    "thread {t}: the file is not a prefix of its stream"
                ));
            }
            if !r.steps.contains(&len) {
                return Err(format!("thread {t}: {len} bytes is not a step boundary"));
            }
            let synced = r
                .fsyncs
                .iter()
                .filter(|(at, _)| *at <= k)
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(0);
            if len < synced {
                return Err(format!("thread {t}: {len} bytes, fsync'd {synced}"));
            }
        }
        fs.close().map_err(|e| format!("close: {e}"))?;
        if fsck {
            std::fs::write(&out, dev.to_bytes()).map_err(|e| e.to_string())?;
            e2fsck_clean(&out)?;
        }
        Ok(())
    };
    let mut replay = CutReplay::new(&base, &ops);
    let mut last = usize::MAX;
    let mut fscked = 0;
    for k in start..=total {
        let f = replay.durable_prefix(k);
        if f == last {
            continue;
        }
        last = f;
        let dev = replay.cut(k, CutMode::DropAll);
        check(dev, k, true).unwrap_or_else(|e| panic!("DropAll cut {k}: {e}"));
        fscked += 1;
    }
    let mut rng = Rng(99);
    for i in 0..24u64 {
        let k = start + rng.below(total - start + 1);
        let mode = CutMode::Subset {
            seed: i,
            torn: i % 2 == 1,
        };
        let dev = replay.cut(k, mode);
        check(dev, k, i % 4 == 0).unwrap_or_else(|e| panic!("{mode:?} cut {k}: {e}"));
    }
    println!("power cuts under threads: {total} operations, {fscked} flush points recovered");
}
