//! The engine's block and inode allocators (`ext4kit-fs` `balloc`,
//! `ialloc`) against e2fsprogs: free extents per group equal dumpe2fs's,
//! and what they allocate, written unjournaled, e2fsck accepts.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use ext4kit_device::{Device, FileDevice, OpenOptions};
use ext4kit_format::Superblock;
use ext4kit_fs::DeviceBlocks;
use ext4kit_fs::balloc::BlockAlloc;
use ext4kit_fs::groups::{DescTable, DirtySet, Layout};

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
    let out = run_ok(tool("dumpe2fs").arg(img)).expect("dumpe2fs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut groups = Vec::new();
    let mut in_groups = false;
    for line in text.lines() {
        if line.starts_with("Group ") {
            in_groups = true;
            continue;
        }
        let t = line.trim();
        if in_groups && let Some(list) = t.strip_prefix("Free blocks:") {
            let mut v = Vec::new();
            for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (a, b) = match item.split_once('-') {
                    Some((a, b)) => (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()),
                    None => {
                        let a = item.parse::<u64>().unwrap();
                        (a, a)
                    }
                };
                v.push((a, (b - a + 1) as u32));
            }
            groups.push(v);
        }
    }
    groups
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
        let fs = Fs::open(&img, false);
        let rd = fs.blocks();
        let descs = DescTable::read(fs.layout.clone(), &rd).unwrap();
        let ba = BlockAlloc::open(&descs, Arc::new(DirtySet::default()), false);
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
