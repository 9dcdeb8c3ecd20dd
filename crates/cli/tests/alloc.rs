//! The engine's block and inode allocators (`ext4kit-fs` `balloc`,
//! `ialloc`) against e2fsprogs: free extents per group equal dumpe2fs's,
//! and what they allocate, written unjournaled, e2fsck accepts.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use ext4kit_device::{Device, FileDevice, OpenOptions};
use ext4kit_format::{Inode, Superblock};
use ext4kit_fs::balloc::{AllocRequest, BlockAlloc};
use ext4kit_fs::groups::{DescTable, DirtySet, Layout};
use ext4kit_fs::ialloc::InodeAlloc;
use ext4kit_fs::{BlockRead, DeviceBlocks};

struct Fs {
    dev: FileDevice,
    layout: Layout,
}

impl Fs {
    fn open(img: &Path, write: bool) -> Fs {
        let opts = if write {
            OpenOptions::read_write()
        } else {
            OpenOptions::read_only()
        };
        let dev = FileDevice::open(img, opts).expect("open image");
        let mut buf = vec![0u8; 1024];
        dev.read_at(&mut buf, 1024).expect("read superblock");
        let sb = Superblock::parse(&buf).expect("superblock");
        let layout = Layout::from_superblock(&sb).expect("layout");
        Fs { dev, layout }
    }

    fn blocks(&self) -> DeviceBlocks<'_> {
        DeviceBlocks::new(&self.dev, self.layout.block_size, self.layout.blocks_count)
    }
}

/// dumpe2fs's "Free blocks:" list of every group.
fn dumpe2fs_free(img: &Path) -> Vec<Vec<(u64, u32)>> {
    let text = dumpe2fs::dumpe2fs(img).expect("dumpe2fs");
    dumpe2fs::groups(&text)
        .iter()
        .map(|g| {
            g.free_blocks
                .iter()
                .map(|&(a, e)| (a, (e - a) as u32))
                .collect()
        })
        .collect()
}

fn mkfs(dir: &Path, name: &str, size: u64, args: &[&str]) -> std::path::PathBuf {
    let img = dir.join(name);
    sparse_file(&img, size).unwrap();
    let mut c = mke2fs(["-F", "-q", "-E", "nodiscard"]);
    c.args(args).arg(&img);
    run_ok(&mut c).unwrap();
    img
}

const CONFIGS: &[(&str, u64, &[&str])] = &[
    ("ext4-4k", GIB + 12 * MIB, &["-t", "ext4"]),
    (
        "ext4-1k",
        96 * MIB + 300 * KIB,
        &["-t", "ext4", "-b", "1024"],
    ),
    ("ext4-noflex", GIB, &["-t", "ext4", "-O", "^flex_bg"]),
    ("ext4-32bit", GIB, &["-t", "ext4", "-O", "^64bit"]),
    (
        "ext4-gdtcsum",
        GIB,
        &["-t", "ext4", "-O", "^metadata_csum,uninit_bg"],
    ),
    (
        "ext4-nosparse",
        512 * MIB,
        &[
            "-t",
            "ext4",
            "-O",
            "^sparse_super,^resize_inode",
            "-b",
            "1024",
        ],
    ),
    (
        "ext4-metabg",
        3 * GIB,
        &["-t", "ext4", "-O", "meta_bg,^resize_inode"],
    ),
    (
        "ext4-metabg-1k",
        300 * MIB,
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-O",
            "meta_bg,^resize_inode,^64bit",
        ],
    ),
    (
        "ext4-flex4",
        2 * GIB,
        &["-t", "ext4", "-G", "4", "-b", "2048"],
    ),
    ("ext4-sparse2", GIB, &["-t", "ext4", "-O", "sparse_super2"]),
    (
        "ext4-eager",
        512 * MIB,
        &["-t", "ext4", "-E", "lazy_itable_init=0", "-b", "1024"],
    ),
    ("ext2", 256 * MIB, &["-t", "ext2", "-b", "1024"]),
    ("ext3", 512 * MIB, &["-t", "ext3"]),
];

/// Step 1's oracle: every group's free extents, from the layout (no I/O)
/// or from its bitmap, equal what dumpe2fs prints; only groups that are
/// not known from the layout have their bitmap read.
#[test]
fn free_extents_equal_dumpe2fs() {
    if !have("mke2fs") || !have("dumpe2fs") {
        return skip("free_extents_equal_dumpe2fs", "e2fsprogs not installed");
    }
    let dir = image_dir();
    for (name, size, args) in CONFIGS {
        let img = mkfs(dir.path(), name, *size, args);
        e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        let fs = Fs::open(&img, false);
        let rd = fs.blocks();
        let descs = Arc::new(DescTable::read(fs.layout.clone(), &rd).unwrap());
        let ba = BlockAlloc::open(&rd, descs, Arc::new(DirtySet::default()), false).unwrap();
        let want = dumpe2fs_free(&img);
        assert_eq!(
            want.len() as u32,
            fs.layout.group_count,
            "{name}: group count"
        );
        let st = ba.stats();
        assert!(
            st.groups_from_layout >= 1,
            "{name}: no group known from the layout"
        );
        for (g, w) in want.iter().enumerate() {
            let got = ba.free_ranges(&rd, g as u32).unwrap();
            assert_eq!(&got, w, "{name}: group {g}");
        }
        let reads = ba.stats().bitmap_reads;
        assert_eq!(
            reads,
            u64::from(fs.layout.group_count) - st.groups_from_layout,
            "{name}: bitmaps read"
        );
        eprintln!(
            "{name}: {} groups, {} from the layout, {reads} bitmaps read",
            fs.layout.group_count, st.groups_from_layout
        );
    }
}

/// A regular file inode owning `extents` (at most 4, depth 0).
fn file_inode(layout: &Layout, extents: &[(u64, u32)]) -> Inode {
    use ext4kit_format::extent::EXTENT_MAGIC;
    let mut ino = Inode::default();
    ino.i_mode.set(ext4kit_format::inode::S_IFREG | 0o644);
    ino.i_links_count.set(1);
    for t in [&mut ino.i_atime, &mut ino.i_ctime, &mut ino.i_mtime] {
        t.set(1_700_000_000);
    }
    ino.i_flags.set(ext4kit_format::inode::EXT4_EXTENTS_FL);
    if layout.inode_size > 128 {
        ino.i_extra_isize.set(ext4kit_format::inode::EXTRA_ISIZE);
    }
    let total: u64 = extents.iter().map(|e| u64::from(e.1)).sum();
    ino.set_size(total * u64::from(layout.block_size));
    ino.set_blocks_512(total * u64::from(layout.block_size) / 512);
    let mut ib = [0u8; 60];
    ib[0..2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
    ib[2..4].copy_from_slice(&(extents.len() as u16).to_le_bytes());
    ib[4..6].copy_from_slice(&4u16.to_le_bytes());
    let mut lblk = 0u32;
    for (i, &(s, n)) in extents.iter().enumerate() {
        let e = &mut ib[12 + 12 * i..24 + 12 * i];
        e[0..4].copy_from_slice(&lblk.to_le_bytes());
        e[4..6].copy_from_slice(&(n as u16).to_le_bytes());
        e[6..8].copy_from_slice(&((s >> 32) as u16).to_le_bytes());
        e[8..12].copy_from_slice(&(s as u32).to_le_bytes());
        lblk += n;
    }
    ino.i_block_bytes_mut().copy_from_slice(&ib);
    ino
}

/// Allocate inodes and blocks with the engine's allocators on mke2fs
/// images, write the rendered bitmaps and descriptors (and minimal inodes
/// owning the blocks, linked into / with debugfs) without a journal:
/// e2fsck -fn finds nothing to say.
#[test]
fn allocations_pass_e2fsck() {
    if !have("mke2fs") || !have("debugfs") || !have("e2fsck") {
        return skip("allocations_pass_e2fsck", "e2fsprogs not installed");
    }
    let dir = image_dir();
    let configs: &[(&str, u64, &[&str])] = &[
        ("ck-4k", 3 * GIB, &["-t", "ext4"]),
        (
            "ck-1k-gdtcsum-32",
            160 * MIB,
            &[
                "-t",
                "ext4",
                "-b",
                "1024",
                "-O",
                "^metadata_csum,^64bit,uninit_bg",
            ],
        ),
        ("ck-noflex", 2 * GIB, &["-t", "ext4", "-O", "^flex_bg"]),
        ("ck-32bit-csum", 2 * GIB, &["-t", "ext4", "-O", "^64bit"]),
        ("ck-2k-flex4", GIB, &["-t", "ext4", "-b", "2048", "-G", "4"]),
        (
            "ck-metabg",
            3 * GIB,
            &["-t", "ext4", "-O", "meta_bg,^resize_inode"],
        ),
    ];
    for (name, size, args) in configs {
        let img = mkfs(dir.path(), name, *size, args);
        let owners = {
            let fs = Fs::open(&img, true);
            allocate_and_write(&fs, name)
        };
        let cmds: String = owners
            .iter()
            .map(|ino| format!("ln <{ino}> /f{ino}\n"))
            .collect();
        let cmdfile = dir.path().join(format!("{name}.cmds"));
        std::fs::write(&cmdfile, cmds).unwrap();
        run_ok(tool("debugfs").arg("-w").arg("-f").arg(&cmdfile).arg(&img)).unwrap();
        let summary = e2fsck_clean(&img).unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!("{name}: {summary}");
        // Reopened, what was written reads back as dumpe2fs sees it.
        {
            let fs = Fs::open(&img, false);
            let rd = fs.blocks();
            let descs = Arc::new(DescTable::read(fs.layout.clone(), &rd).unwrap());
            let ba = BlockAlloc::open(&rd, descs, Arc::new(DirtySet::default()), false).unwrap();
            for (g, w) in dumpe2fs_free(&img).iter().enumerate() {
                assert_eq!(
                    &ba.free_ranges(&rd, g as u32).unwrap(),
                    w,
                    "{name}: group {g}"
                );
            }
        }
        kernel_uses(&img, name, &owners);
    }
}

/// Root with loop devices: the kernel mounts the result, sees the files,
/// allocates more itself, and e2fsck stays clean.
fn kernel_uses(img: &Path, name: &str, owners: &[u32]) {
    if let Err(why) = kernel_mount_available() {
        return skip(
            &format!("allocations_pass_e2fsck kernel part ({name})"),
            &why,
        );
    }
    {
        let lo = LoopDev::attach(img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        for ino in owners {
            let p = m.path().join(format!("f{ino}"));
            let md =
                std::fs::metadata(&p).unwrap_or_else(|e| panic!("{name}: {}: {e}", p.display()));
            assert!(md.is_file(), "{name}: {}", p.display());
        }
        let big = m.path().join("kernel-fallocated");
        run_ok(tool("fallocate").arg("-l").arg("64M").arg(&big)).unwrap();
        std::fs::write(m.path().join("kernel-written"), vec![7u8; 3 << 20]).unwrap();
        std::fs::create_dir(m.path().join("kernel-dir")).unwrap();
        eprintln!(
            "{name}: the kernel mounted it on {} and allocated",
            m.path().display()
        );
        m.unmount().unwrap();
    }
    e2fsck_clean(img).unwrap_or_else(|e| panic!("{name} after the kernel: {e}"));
}

/// The test's "transaction": allocate, free some, commit, render, write.
/// Returns the inodes to link.
fn allocate_and_write(fs: &Fs, name: &str) -> Vec<u32> {
    let l = &fs.layout;
    let rd = fs.blocks();
    let descs = Arc::new(DescTable::read(l.clone(), &rd).unwrap());
    let dirty = Arc::new(DirtySet::default());
    let ba = Arc::new(BlockAlloc::open(&rd, descs.clone(), dirty.clone(), false).unwrap());
    let ia = InodeAlloc::open(&rd, descs.clone(), ba.clone(), dirty).unwrap();
    let mut inodes: Vec<(u32, Vec<(u64, u32)>)> = Vec::new();
    let lens = [1u64, 7, 300, 5000, 40_000, 100_000, 3, 70_000, 12, 9000];
    let mut scratch = Vec::new();
    for (k, &len) in lens.iter().enumerate() {
        let len = len.min(l.blocks_count / 16);
        let a = ia.alloc(&rd, 2, false).unwrap();
        let mut req = AllocRequest::new(len, a.group);
        if k % 3 == 2 {
            req.max_extent = 32767;
        }
        let got = ba.alloc(&rd, &req).unwrap();
        // A scratch allocation between files, freed and committed below.
        scratch.push(
            ba.alloc(&rd, &AllocRequest::new(len / 3 + 1, a.group))
                .unwrap(),
        );
        let mut chunks = got.extents.chunks(4);
        let first = chunks.next().unwrap().to_vec();
        inodes.push((a.ino, first));
        for c in chunks {
            let b = ia.alloc(&rd, 2, false).unwrap();
            inodes.push((b.ino, c.to_vec()));
        }
    }
    // Files "near a parent" in other groups: INODE_UNINIT (and
    // BLOCK_UNINIT) groups get their first inodes and blocks.
    for g in [
        l.group_count / 2,
        l.group_count - 1,
        3.min(l.group_count - 1),
    ] {
        let parent = g * l.inodes_per_group + 1;
        for len in [1u64, 20] {
            let a = ia.alloc(&rd, parent, false).unwrap();
            let got = ba.alloc(&rd, &AllocRequest::new(len, a.group)).unwrap();
            assert!(got.extents.len() <= 4);
            inodes.push((a.ino, got.extents));
        }
    }
    // An empty file alone in a group: only the inode side changes there,
    // BLOCK_UNINIT is cleared all the same (as the kernel does). (Files go
    // to groups with free blocks too: the big files above filled some.)
    if l.group_count > 8 {
        let g = l.group_count - 2;
        let a = ia.alloc(&rd, g * l.inodes_per_group + 1, false).unwrap();
        assert_eq!(a.group, g, "{name}: {a:?}");
        inodes.push((a.ino, Vec::new()));
    }
    // An inode allocated and freed again in the same transaction.
    let gone = ia.alloc(&rd, 2, false).unwrap();
    ia.free(&rd, gone.ino, false).unwrap();
    for s in &scratch {
        for &(b, n) in &s.extents {
            ba.free(&rd, 1, b, n).unwrap();
        }
    }
    assert!(!ba.committed(1).is_empty(), "{name}");
    // Render and write every changed group, then the descriptor blocks.
    let mut desc_blocks = std::collections::BTreeSet::new();
    for d in ba.take_dirty() {
        let im = ia.render(&rd, &d).unwrap();
        for (blk, data) in [im.block_bitmap, im.inode_bitmap].into_iter().flatten() {
            fs.dev
                .write_at(&data, blk * u64::from(l.block_size))
                .unwrap();
        }
        desc_blocks.insert(im.desc_block);
    }
    for i in desc_blocks {
        let (blk, data) = descs.block_image(&rd, i).unwrap();
        fs.dev
            .write_at(&data, blk * u64::from(l.block_size))
            .unwrap();
    }
    // The minimal inodes.
    let isz = l.inode_size as usize;
    for (ino, ext) in &inodes {
        let g = (ino - 1) / l.inodes_per_group;
        let idx = (ino - 1) % l.inodes_per_group;
        let blk = descs.get(&rd, g).unwrap().inode_table() + u64::from(idx / l.inodes_per_block());
        let off = (idx % l.inodes_per_block()) as usize * isz;
        let mut buf = rd.block(blk).unwrap();
        file_inode(l, ext).write_to(&mut buf[off..off + isz], *ino, &l.csum);
        fs.dev
            .write_at(&buf, blk * u64::from(l.block_size))
            .unwrap();
    }
    // Superblock counts.
    let mut sbuf = vec![0u8; 1024];
    fs.dev.read_at(&mut sbuf, 1024).unwrap();
    let fb = ba.free_blocks();
    sbuf[0x0C..0x10].copy_from_slice(&(fb as u32).to_le_bytes());
    sbuf[0x158..0x15C].copy_from_slice(&((fb >> 32) as u32).to_le_bytes());
    sbuf[0x10..0x14].copy_from_slice(&(ia.free_inodes() as u32).to_le_bytes());
    if l.csum.metadata {
        let c = Superblock::parse(&sbuf).unwrap().compute_checksum();
        sbuf[0x3FC..].copy_from_slice(&c.to_le_bytes());
    }
    fs.dev.write_at(&sbuf, 1024).unwrap();
    fs.dev.flush().unwrap();
    eprintln!(
        "{name}: {} inodes, {} bitmaps read, {} groups visited",
        inodes.len(),
        ba.stats().bitmap_reads,
        ba.stats().groups_visited
    );
    inodes.into_iter().map(|(i, _)| i).collect()
}
