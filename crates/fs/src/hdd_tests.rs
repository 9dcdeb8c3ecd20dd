//! What stress-ng's `--hdd` stressor does to the mount, on the engine
//! directly and with more threads than the mount's two workers: each
//! thread creates a file, truncates it, unlinks it while "open" (an
//! orphan), writes it in 64 KiB pieces (sequential, random, or both),
//! reads it back and checks every byte, sometimes fsyncs, then releases
//! the orphan; beside them a thread commits as the mount's timer does
//! and another reads the directories and the orphans' attributes. No
//! operation may fail, the journal must not abort, and at the end every
//! block and inode is free again. `EXT4KIT_HDD_ROUNDS` sets the rounds
//! per thread (default 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ext4kit_device::Device;
use ext4kit_format::inode::{S_IFDIR, S_IFREG};

use crate::balloc::tests::image;
use crate::fs::{Filesystem, NewInode};
use crate::rw::RwOptions;

const PIECE: u64 = 64 * 1024;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The bytes stress-ng writes at `off`: each byte its offset's low bits
/// mixed with the round.
fn fill(buf: &mut [u8], off: u64, round: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = ((off + i as u64) as u8) ^ (round as u8).wrapping_mul(31);
    }
}

/// One `--hdd` worker: `rounds` files of `bytes` bytes in directory `dir`.
fn worker(fs: &Filesystem, t: u64, dir: u32, rounds: u64, bytes: u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x1234_5678_9ABC_DEF1));
    let spec = NewInode::new(S_IFREG | 0o600, 0, 0);
    let mut buf = vec![0u8; PIECE as usize];
    for round in 0..rounds {
        let what = format!("thread {t} round {round}");
        let (f, _) = fs
            .create(dir, b"hdd", &spec)
            .unwrap_or_else(|e| panic!("{what}: create: {e}"));
        fs.truncate(f.ino, 0)
            .unwrap_or_else(|e| panic!("{what}: truncate: {e}"));
        let (_, orphan) = fs
            .unlink_open(dir, b"hdd")
            .unwrap_or_else(|e| panic!("{what}: unlink: {e}"));
        assert!(orphan, "{what}: not an orphan");
        let mode = rng.below(3);
        let pieces = bytes / PIECE;
        let mut offsets: Vec<u64> = Vec::new();
        if mode != 1 {
            offsets.extend((0..pieces).map(|k| k * PIECE));
        }
        if mode != 0 {
            // Random pieces at 512-byte offsets, the first at the end.
            offsets.push(bytes);
            offsets.extend((1..pieces).map(|_| rng.below(bytes) & !511));
        }
        for (k, &off) in offsets.iter().enumerate() {
            fill(&mut buf, off, round);
            fs.write_at(f.ino, off, &buf)
                .unwrap_or_else(|e| panic!("{what}: write at {off}: {e}"));
            if k % 97 == 96 && rng.below(2) == 0 {
                let tid = fs.rw().journal().running_tid();
                fs.commit_tid(tid)
                    .unwrap_or_else(|e| panic!("{what}: fsync: {e}"));
            }
        }
        // Read everything back: each byte is what the last write over it
        // put there (writes in order; zeros where none did).
        let size = fs.inode_any(f.ino).unwrap().size;
        let mut want = vec![0u8; size as usize];
        for &off in &offsets {
            let end = (off + PIECE).min(size);
            fill(&mut want[off as usize..end as usize], off, round);
        }
        let mut got = vec![0u8; size as usize];
        let n = fs
            .read_at(f.ino, 0, &mut got)
            .unwrap_or_else(|e| panic!("{what}: read: {e}"));
        assert_eq!(n as u64, size, "{what}: short read");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!("{what}: byte {i} of {size} differs (mode {mode})");
        }
        fs.release_orphan(f.ino)
            .unwrap_or_else(|e| panic!("{what}: release: {e}"));
    }
}

#[test]
fn hdd_stressor_threads_on_orphans_keep_the_journal_alive() {
    let rounds = std::env::var("EXT4KIT_HDD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2u64);
    let mem = Arc::new(image(96 << 20, &[]));
    let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default()).unwrap();
    let free0 = (
        fs.block_alloc().free_blocks(),
        fs.inode_alloc().free_inodes(),
    );
    let threads = 4u64;
    let dirs: Vec<u32> = (0..threads)
        .map(|t| {
            let spec = NewInode::new(S_IFDIR | 0o755, 0, 0);
            fs.mkdir(2, format!("d{t}").as_bytes(), &spec)
                .unwrap()
                .0
                .ino
        })
        .collect();
    let free1 = (
        fs.block_alloc().free_blocks(),
        fs.inode_alloc().free_inodes(),
    );
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (fs, dir) = (&fs, dirs[t as usize]);
                s.spawn(move || worker(fs, t, dir, rounds, 2 << 20))
            })
            .collect();
        // The mount's commit timer.
        let timer = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                fs.rw().journal().commit().expect("commit");
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        // Readers: the directories and whatever inode they name.
        let reader = s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for &d in &dirs {
                    let entries = fs.read_locked(d, |f, i| f.read_dir(i)).expect("readdir");
                    for e in entries {
                        let _ = fs.inode_any(e.ino).expect("stat");
                    }
                }
                std::thread::yield_now();
            }
        });
        for w in workers {
            if let Err(p) = w.join() {
                stop.store(true, Ordering::Relaxed);
                std::panic::resume_unwind(p);
            }
        }
        stop.store(true, Ordering::Relaxed);
        timer.join().unwrap();
        reader.join().unwrap();
    });
    assert!(fs.rw().read_only().is_none(), "{:?}", fs.rw().read_only());
    assert!(fs.rw().journal().aborted().is_none());
    fs.sync().unwrap();
    assert_eq!(
        (
            fs.block_alloc().free_blocks(),
            fs.inode_alloc().free_inodes()
        ),
        free1,
        "every file's blocks and inode free again"
    );
    for (t, _) in dirs.iter().enumerate() {
        fs.rmdir(2, format!("d{t}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    assert_eq!(
        (
            fs.block_alloc().free_blocks(),
            fs.inode_alloc().free_inodes()
        ),
        free0
    );
    fs.close().unwrap();
}
