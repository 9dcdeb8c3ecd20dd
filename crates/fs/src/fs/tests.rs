//! The operations layer on a fresh filesystem in memory.

use std::sync::Arc;

use ext4kit_device::{Device, MemDevice};
use ext4kit_format::inode::{S_IFDIR, S_IFMT, S_IFREG};

use super::*;
use crate::balloc::tests::image;

fn open(dev: &Arc<MemDevice>) -> Filesystem {
    Filesystem::open(dev.clone() as Arc<dyn Device>, RwOptions::default()).unwrap()
}

fn new_file(fs: &Filesystem) -> u32 {
    let mut op = fs.begin(2, 2).unwrap();
    let spec = NewInode {
        mode: S_IFREG | 0o644,
        uid: 1000,
        gid: 100,
        links: 1,
        time: None,
        rdev: None,
    };
    let i = fs.create_inode(&mut op, 2, &spec).unwrap();
    fs.finish(op).unwrap();
    i.ino
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn read_all(fs: &Filesystem, ino: u32) -> Vec<u8> {
    let size = fs.inode(ino).unwrap().size as usize;
    let mut v = vec![0u8; size];
    assert_eq!(fs.read_at(ino, 0, &mut v).unwrap(), size);
    v
}

#[test]
fn cut_and_normalize() {
    let m = |l, p, n, u| Mapping {
        lblk: l,
        pblk: p,
        len: n,
        unwritten: u,
    };
    let v = vec![
        m(0, 100, 10, false),
        m(10, 110, 5, false),
        m(20, 200, 5, true),
    ];
    let n = normalize(v.clone());
    assert_eq!(n, vec![m(0, 100, 15, false), m(20, 200, 5, true)]);
    let (out, inside) = cut(&n, 5, 22);
    assert_eq!(out, vec![m(0, 100, 5, false), m(22, 202, 3, true)]);
    assert_eq!(inside, vec![m(5, 105, 10, false), m(20, 200, 2, true)]);
    // Merging stops at the longest extent of each state.
    let big = normalize(vec![m(0, 0, 32768, false), m(32768, 32768, 1, false)]);
    assert_eq!(big.len(), 2);
}

#[test]
fn create_write_read_truncate_delete_reopen() {
    let dev = Arc::new(image(64 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let ifree0 = fs.inode_alloc().free_inodes();
    let ino = new_file(&fs);
    let i = fs.inode(ino).unwrap();
    assert_eq!(i.mode & S_IFMT, S_IFREG);
    assert_eq!((i.uid, i.gid, i.links, i.size), (1000, 100, 1, 0));
    assert!(i.has_extents() && i.crtime.is_some() && i.extra_isize == 32);
    // A write at an unaligned offset, then an overwrite in the middle.
    let a = pattern(10_000, 1);
    fs.write_at(ino, 3000, &a).unwrap();
    let b = pattern(2000, 7);
    fs.write_at(ino, 5000, &b).unwrap();
    let mut want = vec![0u8; 3000];
    want.extend_from_slice(&a);
    want[5000..7000].copy_from_slice(&b);
    assert_eq!(read_all(&fs, ino), want);
    let i = fs.inode(ino).unwrap();
    assert_eq!(i.size, 13_000);
    // 1 KiB blocks: blocks 2..=12 written (0 and 1 are a hole), i_blocks
    // in 512-byte units.
    assert_eq!(i.blocks_512, 11 * 2);
    // Truncate inside a block: the tail reads zeros after growing again.
    fs.truncate(ino, 4500).unwrap();
    fs.truncate(ino, 6000).unwrap();
    want.truncate(4500);
    want.resize(6000, 0);
    assert_eq!(read_all(&fs, ino), want);
    assert_eq!(fs.inode(ino).unwrap().blocks_512, 3 * 2);
    // Sparse write far away (a hole between).
    fs.write_at(ino, 1 << 20, b"end").unwrap();
    want.resize(1 << 20, 0);
    want.extend_from_slice(b"end");
    assert_eq!(read_all(&fs, ino), want);
    fs.close().unwrap();
    // Reopened: everything is there.
    let fs = open(&dev);
    assert_eq!(read_all(&fs, ino), want);
    fs.delete_inode(ino).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    assert_eq!(fs.inode_alloc().free_inodes(), ifree0);
    fs.close().unwrap();
}

#[test]
fn fragmented_file_grows_a_deep_tree_and_shrinks_back() {
    let dev = Arc::new(image(64 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let ino = new_file(&fs);
    // Every other block: one extent each (1 KiB blocks: 84 per leaf).
    let n = 400u64;
    for k in 0..n {
        fs.write_at(ino, 2 * k * 1024, &pattern(1024, k as u8))
            .unwrap();
    }
    let i = fs.inode(ino).unwrap();
    let (maps, nodes) = fs.read(|f| f.extent_tree(&i)).unwrap();
    assert!(maps.len() as u64 >= n / 2, "{} extents", maps.len());
    let depth = nodes.iter().map(|x| x.depth).max().unwrap();
    assert_eq!(depth, 2, "5 leaves need an index level below the root");
    let tree = nodes.iter().filter(|x| x.pblk != 0).count() as u64;
    assert_eq!(i.blocks_512, (n + tree) * 2);
    for k in [0u64, 1, 77, n - 1] {
        let mut b = vec![0u8; 1024];
        fs.read_at(ino, 2 * k * 1024, &mut b).unwrap();
        assert_eq!(b, pattern(1024, k as u8), "block {k}");
    }
    fs.truncate(ino, 3 * 1024).unwrap();
    let i = fs.inode(ino).unwrap();
    let (maps, nodes) = fs.read(|f| f.extent_tree(&i)).unwrap();
    assert_eq!(nodes.len(), 1, "back to a root-only tree");
    assert_eq!(maps.len(), 2);
    fs.truncate(ino, 0).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.inode(ino).unwrap().blocks_512, 0);
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

#[test]
fn fallocate_modes_keep_the_mapping_and_counts() {
    let dev = Arc::new(image(64 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let ino = new_file(&fs);
    let maps = |fs: &Filesystem| {
        let i = fs.inode(ino).unwrap();
        (fs.read(|f| f.extents(&i)).unwrap(), i)
    };
    fs.fallocate(ino, 0, 100 * 1024, Falloc::default()).unwrap();
    let (m, i) = maps(&fs);
    assert!(m.iter().all(|x| x.unwritten));
    assert_eq!((i.size, i.blocks_512), (100 * 1024, 200));
    // A write in the middle splits the unwritten extent in three.
    fs.write_at(ino, 10 * 1024, &[7u8; 2048]).unwrap();
    let (m, _) = maps(&fs);
    let states: Vec<(u64, u32, bool)> = m.iter().map(|x| (x.lblk, x.len, x.unwritten)).collect();
    assert_eq!(states, vec![(0, 10, true), (10, 2, false), (12, 88, true)]);
    // KEEP_SIZE: blocks past the end, size unchanged.
    let keep = Falloc {
        keep_size: true,
        ..Falloc::default()
    };
    fs.fallocate(ino, 100 * 1024, 50 * 1024, keep).unwrap();
    let (_, i) = maps(&fs);
    assert_eq!((i.size, i.blocks_512), (100 * 1024, 300));
    // Punch the written blocks and a bit more: freed, reads zeros.
    let punch = Falloc {
        keep_size: true,
        punch_hole: true,
        ..Falloc::default()
    };
    fs.fallocate(ino, 9 * 1024, 4 * 1024, punch).unwrap();
    let (m, i) = maps(&fs);
    assert!(m.iter().all(|x| x.end() <= 9 || x.lblk >= 13));
    assert_eq!(i.blocks_512, 300 - 8);
    let mut b = vec![1u8; 4096];
    fs.read_at(ino, 9 * 1024, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0));
    // ZERO_RANGE over a written block makes it unwritten (reads zeros).
    fs.write_at(ino, 20 * 1024, &[9u8; 1024]).unwrap();
    let zero = Falloc {
        zero_range: true,
        ..Falloc::default()
    };
    fs.fallocate(ino, 20 * 1024, 1024, zero).unwrap();
    let (m, _) = maps(&fs);
    assert!(
        m.iter()
            .any(|x| x.lblk <= 20 && 20 < x.end() && x.unwritten)
    );
    fs.read_at(ino, 20 * 1024, &mut b[..1024]).unwrap();
    assert!(b[..1024].iter().all(|&x| x == 0));
    // Refusals.
    assert!(
        fs.fallocate(
            ino,
            0,
            1024,
            Falloc {
                punch_hole: true,
                ..Falloc::default()
            }
        )
        .is_err()
    );
    assert!(fs.fallocate(ino, 0, 0, Falloc::default()).is_err());
    fs.delete_inode(ino).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

#[test]
fn fallocate_on_an_unlinked_open_file() {
    let dev = Arc::new(image(64 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let (i, _) = fs.create(2, b"victim", &spec).unwrap();
    let ino = i.ino;
    fs.write_at(ino, 0, &pattern(40 * 1024, 3)).unwrap();
    let (_, orphan) = fs.unlink_open(2, b"victim").unwrap();
    assert!(orphan);
    // Every mode works through the descriptor, as on ext4 (the inode's
    // link count is 0 now).
    let modes = [
        Falloc::default(),
        Falloc {
            keep_size: true,
            ..Falloc::default()
        },
        Falloc {
            keep_size: true,
            punch_hole: true,
            ..Falloc::default()
        },
        Falloc {
            zero_range: true,
            ..Falloc::default()
        },
    ];
    for (k, mode) in modes.into_iter().enumerate() {
        let off = 1000 + k as u64 * 10_000;
        fs.fallocate(ino, off, 5000, mode)
            .unwrap_or_else(|e| panic!("mode {mode:?}: {e}"));
    }
    fs.fallocate(ino, 60 * 1024, 4096, Falloc::default())
        .unwrap();
    let i = fs.inode_any(ino).unwrap();
    assert_eq!(i.size, 64 * 1024);
    let mut want = pattern(40 * 1024, 3);
    want[21_000..26_000].fill(0);
    want[31_000..36_000].fill(0);
    want.resize(64 * 1024, 0);
    let mut got = vec![1u8; 64 * 1024];
    assert_eq!(fs.read_at(ino, 0, &mut got).unwrap(), got.len());
    assert!(got == want);
    fs.release_orphan(ino).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

#[test]
fn out_of_space_fails_the_call_not_the_journal() {
    let dev = Arc::new(image(16 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let ino = new_file(&fs);
    // More than the filesystem holds: ENOSPC, what fitted stays
    // allocated (as ext4's fallocate leaves it), the journal goes on.
    let e = fs
        .fallocate(ino, 0, 64 << 20, Falloc::default())
        .unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    assert!(fs.rw().journal().aborted().is_none());
    assert!(fs.block_alloc().free_blocks() < free0 / 4);
    // A write past the space: ENOSPC too, nothing aborted; at the
    // shortage right away (nothing free), the same.
    let other = new_file(&fs);
    let e = fs.write_at(other, 0, &vec![5u8; 32 << 20]).unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    let e = fs.write_at(other, 40 << 20, &[5u8; 8192]).unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    assert!(fs.rw().journal().aborted().is_none());
    // Freeing makes room again.
    fs.delete_inode(ino).unwrap();
    fs.sync().unwrap();
    fs.write_at(other, 0, &pattern(1 << 20, 4)).unwrap();
    let mut back = vec![0u8; 1 << 20];
    fs.read_at(other, 0, &mut back).unwrap();
    assert!(back == pattern(1 << 20, 4));
    fs.delete_inode(other).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

#[test]
fn generations_are_unique_across_threads() {
    let dev = Arc::new(image(16 << 20, &[]));
    let fs = open(&dev);
    let per = 20_000;
    let all: Vec<u32> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| (0..per).map(|_| fs.next_generation()).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let distinct: std::collections::HashSet<u32> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "two callers got one generation");
    fs.close().unwrap();
}

/// setattr (a chmod keeping an access ACL in step), set_times, set_xattr
/// (into an xattr block) and xattrs on an inode unlinked while open
/// (link count 0) work as on ext4; releasing it frees the xattr block
/// too; a freed inode is NotFound, not a corruption.
#[test]
fn attribute_calls_on_an_unlinked_open_file() {
    let dev = Arc::new(image(16 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let (i, _) = fs.create(2, b"victim", &spec).unwrap();
    let ino = i.ino;
    fs.write_at(ino, 0, &pattern(5000, 1)).unwrap();
    // user::rw- user:1234:rw- group::r-- mask::rw- other::r-- in
    // getxattr's form: version 2, then (tag, perm, id) entries.
    let mut value = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 6, 1234),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 4, u32::MAX),
    ] {
        value.extend_from_slice(&tag.to_le_bytes());
        value.extend_from_slice(&perm.to_le_bytes());
        value.extend_from_slice(&id.to_le_bytes());
    }
    fs.set_xattr(ino, b"system.posix_acl_access", Some(&value), SetMode::Any)
        .unwrap();
    let (_, orphan) = fs.unlink_open(2, b"victim").unwrap();
    assert!(orphan);
    let sa = SetAttr {
        mode: Some(0o604),
        uid: Some(42),
        gid: Some(43),
        ..SetAttr::default()
    };
    fs.setattr(ino, &sa).unwrap();
    let t = Timestamp {
        sec: 1_000_000_000,
        nsec: 5,
    };
    fs.set_times(
        ino,
        &Times {
            mtime: Some(t),
            ..Times::default()
        },
    )
    .unwrap();
    fs.set_xattr(ino, b"user.big", Some(&[7u8; 600]), SetMode::Any)
        .unwrap();
    let i = fs.inode_any(ino).unwrap();
    assert_eq!((i.links, i.mode & 0o7777, i.uid, i.gid), (0, 0o604, 42, 43));
    assert_eq!(i.mtime, t);
    assert!(i.file_acl != 0, "the big value is in a block");
    let x = fs.xattrs(ino).unwrap();
    let big = x.iter().find(|a| a.name == b"user.big").unwrap();
    assert_eq!(big.value, vec![7u8; 600]);
    // The ACL's mask follows the chmod's group bits (posix_acl_chmod).
    let acl = x
        .iter()
        .find(|a| a.name == b"system.posix_acl_access")
        .unwrap();
    assert_ne!(acl.value, value, "the ACL was not kept in step");
    fs.release_orphan(ino).unwrap();
    assert!(fs.rw().journal().aborted().is_none());
    // Freed: a stale number, not a corrupt inode.
    let e = fs
        .set_xattr(ino, b"user.a", Some(b"1"), SetMode::Any)
        .unwrap_err();
    assert!(matches!(e, XattrError::Fs(FsError::NotFound)), "{e:?}");
    let e = fs.setattr(ino, &sa).unwrap_err();
    assert!(matches!(e, FsError::NotFound), "{e:?}");
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    assert_eq!(fs.rw().superblock().unwrap().s_state.get() & 2, 0);
    fs.close().unwrap();
}

/// A write the free space holds only part of: the part is written and
/// counted (write_partial's short write), i_size and i_blocks cover it,
/// ENOSPC only once nothing fits; write_at fails the same call.
#[test]
fn a_write_past_the_free_space_is_short() {
    let dev = Arc::new(image(16 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    let ino = new_file(&fs);
    let data = pattern(32 << 20, 9);
    let (_, n) = fs.write_partial(ino, 100, &data).unwrap();
    assert!(n > 0 && n < data.len(), "short write of {n}");
    assert!(fs.rw().journal().aborted().is_none());
    let i = fs.inode(ino).unwrap();
    assert_eq!(i.size, 100 + n as u64);
    let mapped = i.size.div_ceil(1024);
    // Every block of the size is mapped and written (plus tree blocks).
    assert!(i.blocks_512 >= 2 * mapped, "{} for {mapped}", i.blocks_512);
    assert!(
        fs.block_alloc().free_blocks() < 64,
        "left {}",
        fs.block_alloc().free_blocks()
    );
    let mut back = vec![0u8; n];
    assert_eq!(fs.read_at(ino, 100, &mut back).unwrap(), n);
    assert!(back == data[..n]);
    // Nothing more fits: ENOSPC (write_at the same), the journal goes on.
    let e = fs.write_partial(ino, i.size, &data[..1 << 20]).unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    let e = fs.write_at(ino, i.size, &data[..1 << 20]).unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    assert!(fs.rw().journal().aborted().is_none());
    fs.delete_inode(ino).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

/// The last free block taken by a write whose tree edit needs one (a
/// full root growing a level), then one-block writes into the holes of
/// a fragmented file until the space is gone: the data leaves the tree
/// the blocks its edits need (before, the split short of a block failed
/// the handle and aborted the journal: the filesystem went read-only).
#[test]
fn filling_the_space_never_fails_a_tree_split() {
    let dev = Arc::new(image(16 << 20, &[]));
    let fs = open(&dev);
    let a = new_file(&fs);
    let b = new_file(&fs);
    let c = new_file(&fs);
    // A full root: four one-block extents.
    for k in 0..4u64 {
        fs.write_at(a, 2 * k * 1024, &pattern(1024, k as u8))
            .unwrap();
    }
    assert_eq!(root_depth(&fs.inode(a).unwrap().i_block), 0);
    fs.write_at(c, 0, &pattern(1024, 99)).unwrap();
    // Everything else into `b` (more than fits: ENOSPC, what fits kept).
    let e = fs.fallocate(b, 0, 64 << 20, Falloc::default()).unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    assert!(fs.rw().journal().aborted().is_none());
    // One block back; the next write's extent makes the root grow.
    fs.truncate(c, 0).unwrap();
    fs.sync().unwrap();
    let mut written = 4u64;
    let mut k = 4u64;
    loop {
        match fs.write_at(a, 2 * k * 1024, &pattern(1024, k as u8)) {
            Ok(_) => written += 1,
            Err(e) => {
                assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
                break;
            }
        }
        assert!(fs.rw().journal().aborted().is_none(), "aborted at {k}");
        k += 1;
    }
    assert!(fs.rw().journal().aborted().is_none(), "aborted at {k}");
    let mut buf = vec![0u8; 1024];
    for j in 0..written {
        fs.read_at(a, 2 * j * 1024, &mut buf).unwrap();
        assert!(buf == pattern(1024, j as u8), "block {j}");
    }
    // Free some, fill again with holes of `a`: splits at every level
    // while the space runs out.
    fs.fallocate(
        b,
        0,
        400 * 1024,
        Falloc {
            keep_size: true,
            punch_hole: true,
            ..Falloc::default()
        },
    )
    .unwrap();
    fs.sync().unwrap();
    loop {
        match fs.write_at(a, 2 * k * 1024, &pattern(1024, k as u8)) {
            Ok(_) => k += 1,
            Err(e) => {
                assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
                break;
            }
        }
    }
    assert!(fs.rw().journal().aborted().is_none(), "aborted at {k}");
    assert!(root_depth(&fs.inode(a).unwrap().i_block) >= 1);
    // Creating files with the space gone: ENOSPC at most, never an abort.
    for n in 0..20u32 {
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        let _ = fs.create(2, format!("f{n}").as_bytes(), &spec);
    }
    assert!(fs.rw().journal().aborted().is_none());
    fs.close().unwrap();
}

/// Times past what the inode holds are clamped as the kernel's ext4
/// clamps them (2446-05-10 22:38:55 and 1901-12-13 20:45:52 UTC, no
/// nanoseconds at a bound), never wrapped: through set_times, setattr,
/// a new inode's given time and the slot-level InodeAttrs.
#[test]
fn times_past_the_range_are_clamped_not_wrapped() {
    use crate::inode::{TIME_MAX_EXTRA, TIME_MIN};
    let dev = Arc::new(image(8 << 20, &[]));
    let fs = open(&dev);
    let ino = new_file(&fs);
    let y2500 = Timestamp {
        sec: 16_725_225_600,
        nsec: 7,
    };
    let y1800 = Timestamp {
        sec: -5_364_662_400,
        nsec: 9,
    };
    let max = Timestamp {
        sec: TIME_MAX_EXTRA,
        nsec: 0,
    };
    let min = Timestamp {
        sec: TIME_MIN,
        nsec: 0,
    };
    fs.set_times(
        ino,
        &Times {
            atime: Some(y1800),
            mtime: Some(y2500),
            ..Times::default()
        },
    )
    .unwrap();
    let i = fs.inode(ino).unwrap();
    assert_eq!((i.atime, i.mtime), (min, max));
    // Inside the range nothing changes (nanoseconds kept).
    let inside = Timestamp {
        sec: TIME_MAX_EXTRA - 1,
        nsec: 999_999_999,
    };
    let sa = SetAttr {
        times: Some(Times {
            atime: Some(inside),
            mtime: Some(y1800),
            ctime: Some(y2500),
            crtime: None,
        }),
        ..SetAttr::default()
    };
    fs.setattr(ino, &sa).unwrap();
    let i = fs.inode(ino).unwrap();
    assert_eq!((i.atime, i.mtime, i.ctime), (inside, min, max));
    // A new inode made with a given time (also its crtime).
    let mut op = fs.begin(2, 2).unwrap();
    let spec = NewInode {
        time: Some(y2500),
        ..NewInode::new(S_IFREG | 0o644, 0, 0)
    };
    let n = fs.create_inode(&mut op, 2, &spec).unwrap();
    fs.finish(op).unwrap();
    let n = fs.inode(n.ino).unwrap();
    assert_eq!(
        (n.atime, n.mtime, n.ctime, n.crtime),
        (max, max, max, Some(max))
    );
    // The slot-level path (cp -p into an image, the mount's kill of
    // suid bits).
    let a = crate::rw::InodeAttrs {
        mtime: Some((y1800.sec, y1800.nsec)),
        atime: Some((y2500.sec, y2500.nsec)),
        ..Default::default()
    };
    fs.set_inode_attrs(ino, &a).unwrap();
    let i = fs.inode(ino).unwrap();
    assert_eq!((i.atime, i.mtime), (max, min));
    fs.close().unwrap();
}

#[test]
fn time_encoding_with_and_without_the_extra_field() {
    use crate::inode::{TIME_MAX_EXTRA, TIME_MAX_NO_EXTRA, TIME_MIN};
    use ext4kit_format::inode::decode_time;
    let t = |sec, nsec| Timestamp { sec, nsec };
    // (time, extra) -> decoded back
    for (tin, extra, want) in [
        (t(0, 5), true, t(0, 5)),
        (t(0, 5), false, t(0, 0)),
        (t(16_725_225_600, 1), true, t(TIME_MAX_EXTRA, 0)),
        (t(16_725_225_600, 1), false, t(TIME_MAX_NO_EXTRA, 0)),
        (t(3_000_000_000, 1), true, t(3_000_000_000, 1)),
        (t(3_000_000_000, 1), false, t(TIME_MAX_NO_EXTRA, 0)),
        (t(i64::MIN, 3), true, t(TIME_MIN, 0)),
        (t(-5_364_662_400, 3), false, t(TIME_MIN, 0)),
        (t(-1, 500), true, t(-1, 500)),
        (t(TIME_MAX_EXTRA, 999_999_999), true, t(TIME_MAX_EXTRA, 0)),
        (t(i64::MAX, 0), true, t(TIME_MAX_EXTRA, 0)),
    ] {
        let (s, x) = encode_time_in(tin, extra);
        let (sec, nsec) = decode_time(s, extra.then_some(x));
        assert_eq!(t(sec, nsec), want, "{tin:?} extra={extra}");
    }
    // 2446-05-10 22:38:55 and 1901-12-13 20:45:52 UTC.
    assert_eq!(TIME_MAX_EXTRA, 15_032_385_535);
    assert_eq!(TIME_MIN, -2_147_483_648);
}

#[test]
fn write_ranges_matches_write_at_and_a_model() {
    let dev = Arc::new(image(64 << 20, &[]));
    let fs = open(&dev);
    let free0 = fs.block_alloc().free_blocks();
    // Two files laid out alike: written data, a hole, an unwritten
    // (fallocated) run; then the same ranges, one file through write_at
    // one by one, the other through one write_ranges.
    let (a, b) = (new_file(&fs), new_file(&fs));
    for &ino in &[a, b] {
        fs.write_at(ino, 0, &pattern(200_000, 3)).unwrap();
        fs.fallocate(ino, 400_000, 150_000, Falloc::default())
            .unwrap();
    }
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // Disjoint ranges in file order, over every kind of place and past
    // the end.
    let mut ranges: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut at = 0u64;
    while at < 700_000 {
        let gap = 1 + next() % 9000;
        let len = 1 + next() % 7000;
        ranges.push((at + gap, pattern(len as usize, (next() % 255) as u8)));
        at += gap + len;
    }
    let mut want = read_all(&fs, a);
    for (off, d) in &ranges {
        fs.write_at(a, *off, d).unwrap();
        let e = *off as usize + d.len();
        if want.len() < e {
            want.resize(e, 0);
        }
        want[*off as usize..e].copy_from_slice(d);
    }
    let refs: Vec<(u64, &[u8])> = ranges.iter().map(|(o, d)| (*o, d.as_slice())).collect();
    fs.write_ranges(b, &refs, Some((1_700_000_000, 5))).unwrap();
    assert_eq!(read_all(&fs, a), want);
    assert_eq!(read_all(&fs, b), want);
    let (ia, ib) = (fs.inode(a).unwrap(), fs.inode(b).unwrap());
    assert_eq!((ib.size, ib.blocks_512), (ia.size, ia.blocks_512));
    assert_eq!((ib.mtime.sec, ib.mtime.nsec), (1_700_000_000, 5));
    assert_eq!((ib.ctime.sec, ib.ctime.nsec), (1_700_000_000, 5));
    // Overwrites in place of the same ranges: nothing allocated.
    let free1 = fs.block_alloc().free_blocks();
    fs.write_ranges(b, &refs, None).unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free1);
    fs.close().unwrap();
    let fs = open(&dev);
    assert_eq!(read_all(&fs, b), want);
    fs.delete_inode(a).unwrap();
    fs.delete_inode(b).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.block_alloc().free_blocks(), free0);
    fs.close().unwrap();
}

/// O_TMPFILE: an inode without links on the orphan list (old list and
/// orphan file); `link` names it and takes it off; one never linked is
/// freed by `release_orphan`, or by orphan processing at the next open.
#[test]
fn tmpfile_is_an_orphan_until_linked() {
    for extra in [&[][..], &["orphan_file"][..]] {
        let dev = Arc::new(image(64 << 20, extra));
        let fs = open(&dev);
        let free0 = fs.block_alloc().free_blocks();
        let on_list = |fs: &Filesystem, ino: u32| match fs.orphan_file() {
            Some(of) => of.contains(ino),
            None => fs.rw().superblock().unwrap().s_last_orphan.get() == ino,
        };
        let spec = NewInode::new(S_IFREG | 0o600, 1000, 100);
        let (a, _) = fs.create_tmpfile(2, &spec).unwrap();
        assert_eq!(a.links, 0);
        assert!(on_list(&fs, a.ino), "{extra:?}");
        assert!(
            fs.create_tmpfile(2, &NewInode::new(S_IFDIR | 0o700, 0, 0))
                .is_err()
        );
        fs.write_at(a.ino, 0, &pattern(30 * 1024, 1)).unwrap();
        fs.link(a.ino, 2, b"named").unwrap();
        let i = fs.inode(a.ino).unwrap();
        assert_eq!((i.links, i.dtime), (1, 0));
        assert!(!on_list(&fs, a.ino));
        assert_eq!(fs.lookup(2, b"named").unwrap().map(|e| e.ino), Some(a.ino));
        assert_eq!(read_all(&fs, a.ino), pattern(30 * 1024, 1));
        // Never linked: freed at the last close.
        let (b, _) = fs.create_tmpfile(2, &spec).unwrap();
        fs.write_at(b.ino, 0, &pattern(20 * 1024, 2)).unwrap();
        fs.release_orphan(b.ino).unwrap();
        assert!(!on_list(&fs, b.ino));
        // Open at a crash: the next open's orphan processing frees it.
        let (c, _) = fs.create_tmpfile(2, &spec).unwrap();
        fs.write_at(c.ino, 0, &pattern(20 * 1024, 3)).unwrap();
        fs.sync().unwrap();
        drop(fs);
        let fs = open(&dev);
        assert!(!on_list(&fs, c.ino));
        assert_eq!(fs.inode_any(c.ino).unwrap().links, 0);
        fs.unlink(2, b"named").unwrap();
        fs.sync().unwrap();
        assert_eq!(fs.block_alloc().free_blocks(), free0, "{extra:?}");
        fs.close().unwrap();
    }
}
