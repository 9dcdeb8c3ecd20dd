//! A mutation fuzzer for the read-write tools and the mount (issue 24).
//!
//! Seed images come from nine mkfs recipes (mke2fs defaults, no
//! metadata_csum, 128-byte inodes without 64bit, 4 KiB blocks, a dirty
//! journal: the default recipe with committed but not checkpointed
//! transactions left by `Filesystem::crash`, inline_data with small
//! inline files, dirs and a symlink from `mke2fs -d`, bigalloc with 16
//! KiB clusters of 1 KiB blocks, and casefold + quota + ea_inode with
//! the htree directory casefolded, mmp + fast_commit), each populated with the
//! same tree (nested directories, an htree directory, a file with an
//! extent tree below its inode, an xattr block, a symlink). Each case
//! mutates one seed: bytes of one metadata structure (superblock, group
//! descriptors, block and inode bitmaps, inode table, directory entries,
//! extent blocks, the htree root, the xattr block, the journal superblock
//! and log; the checksum recomputed in most cases so that the checks
//! behind it are reached), or a structural change (a directory entry
//! pointing at its directory or an ancestor, a cross-linked block, a
//! dirent's rec_len/name_len, an extent header's fields). On every
//! mutated image each read-write subcommand runs on a fresh copy, and a
//! FUSE mount runs a small workload (root with /dev/fuse only, else
//! SKIP). Each run is classified panic / signal / hang (timeout) /
//! refused (exit ≠ 0) / ok; after every success `e2fsck -fn` runs, and
//! what it reports that it did not report on the mutated image before
//! (nor, with a dirty journal, after e2fsck's own journal replay) is new
//! damage.
//!
//! Everything follows from the seed: `EXT4KIT_FUZZ_RW_SEED` (default
//! below), `EXT4KIT_FUZZ_RW_IMAGES` (default 20: the fixed run of
//! `cargo test`), `EXT4KIT_FUZZ_RW_JOBS` (workers, default 1),
//! `EXT4KIT_FUZZ_RW_OUT` (a directory for reproducers: the mutated image,
//! the command and both e2fsck outputs of each finding). The fixed run
//! fails on any finding; `scripts/fuzz-rw.sh` runs the long campaign and
//! prints the counts.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use ext4kit_format::Csum;
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::xattr_write::SetMode;

const DEFAULT_SEED: u64 = 0x5eed_2024_0024;

/// What a mutation aims at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Superblock,
    Descriptors,
    BlockBitmap,
    InodeBitmap,
    InodeTable,
    Dirents,
    ExtentBlock,
    HtreeRoot,
    XattrBlock,
    JournalSuper,
    JournalLog,
    Loop,
    CrossLink,
    DirentLen,
    ExtentHeader,
}

const RAW_KINDS: [Kind; 11] = [
    Kind::Superblock,
    Kind::Descriptors,
    Kind::BlockBitmap,
    Kind::InodeBitmap,
    Kind::InodeTable,
    Kind::Dirents,
    Kind::ExtentBlock,
    Kind::HtreeRoot,
    Kind::XattrBlock,
    Kind::JournalSuper,
    Kind::JournalLog,
];
const STRUCT_KINDS: [Kind; 4] = [
    Kind::Loop,
    Kind::CrossLink,
    Kind::DirentLen,
    Kind::ExtentHeader,
];

/// A seed image and where its structures are.
struct Seed {
    name: &'static str,
    bytes: Vec<u8>,
    bs: u64,
    csum: Csum,
    desc_size: usize,
    /// Blocks by kind (for the raw mutations).
    blocks: BTreeMap<Kind, Vec<u64>>,
    /// Extent and directory blocks: (owner inode, generation).
    owners: HashMap<u64, (u32, u32)>,
    /// Inode slots (byte offset in the image) of the tree's inodes.
    slots: Vec<(u32, u64)>,
    /// Linear directory blocks of nested directories: (block, the
    /// directory and its ancestors' inodes, innermost first).
    nested: Vec<(u64, Vec<u32>)>,
    /// Regular files' inodes with extents in the inode (cross-link and
    /// header targets) and blocks owned by something else.
    files: Vec<u32>,
    used: Vec<u64>,
}

fn name(i: usize, len: usize) -> Vec<u8> {
    let mut n = format!("entry-{i:04}-").into_bytes();
    n.resize(len, b'n');
    n
}

fn build_seed(dir: &Path, recipe: &'static str) -> Seed {
    let (size, args): (&str, &[&str]) = match recipe {
        "default" | "dirty-journal" => ("8M", &[]),
        "no-csum" => ("8M", &["-O", "^metadata_csum"]),
        "i128-no64bit" => ("8M", &["-I", "128", "-O", "^64bit"]),
        "4k" => ("16M", &["-b", "4096"]),
        "inline" => ("8M", &["-O", "inline_data"]),
        "bigalloc" => ("32M", &["-O", "bigalloc", "-C", "16384"]),
        "features" => ("8M", &["-O", "casefold,quota,ea_inode"]),
        "mmp-fc" => (
            "8M",
            &["-O", "mmp,fast_commit", "-E", "mmp_update_interval=1"],
        ),
        _ => unreachable!(),
    };
    let mut a = vec!["-E", "hash_seed=7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60"];
    a.extend_from_slice(args);
    // inline_data: mke2fs -d stores these small files, the symlink and
    // the small directories inline (the engine creates extent-mapped
    // inodes only), so the mutations also hit inline inodes.
    let src = dir.join(format!("src-{recipe}"));
    let src_arg = src.to_string_lossy().into_owned();
    if recipe == "inline" {
        std::fs::create_dir_all(src.join("id/sub")).unwrap();
        for (n, len) in [("id/a", 10), ("id/b", 59), ("id/sub/c", 100), ("tiny", 1)] {
            std::fs::write(src.join(n), pattern(len, len as u64)).unwrap();
        }
        std::os::unix::fs::symlink("id/sub/c", src.join("islink")).unwrap();
        a.extend_from_slice(&["-d", &src_arg]);
    }
    let img = mkimg(dir, &format!("seed-{recipe}.img"), size, &a);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let reg = NewInode::new(S_IFREG | 0o644, 0, 0);
    let dirs = NewInode::new(S_IFDIR | 0o755, 0, 0);
    let (d1, _) = fs.mkdir(2, b"d1", &dirs).unwrap();
    let (sub, _) = fs.mkdir(d1.ino, b"sub", &dirs).unwrap();
    let (deeper, _) = fs.mkdir(sub.ino, b"deeper", &dirs).unwrap();
    let (other, _) = fs.mkdir(d1.ino, b"other", &dirs).unwrap();
    for (d, n) in [(sub.ino, "f"), (deeper.ino, "g"), (other.ino, "h")] {
        let (f, _) = fs.create(d, n.as_bytes(), &reg).unwrap();
        fs.write_at(f.ino, 0, &pattern(1500, u64::from(f.ino)))
            .unwrap();
    }
    let (h, _) = fs.mkdir(2, b"h", &dirs).unwrap();
    if recipe == "features" {
        fs.set_flags(h.ino, h.flags | ext4kit_fs::fs::flags::CASEFOLD_FL)
            .unwrap();
    }
    for i in 0..200 {
        fs.create(h.ino, &name(i, 60), &reg).unwrap();
    }
    let mut files = Vec::new();
    let bs = u64::from(fs.read(|f| f.info.block_size));
    for (n, k) in [(&b"f0"[..], 6u64), (b"f1", 3), (b"f2", 120)] {
        let (f, _) = fs.create(2, n, &reg).unwrap();
        for i in 0..k {
            fs.write_at(f.ino, i * 2 * bs, &pattern(bs as usize, i))
                .unwrap();
        }
        files.push(f.ino);
    }
    let (x, _) = fs.create(2, b"x", &reg).unwrap();
    fs.set_xattr(x.ino, b"user.big", Some(&[b'v'; 400]), SetMode::Any)
        .unwrap();
    fs.write_at(x.ino, 0, b"x\n").unwrap();
    let (s, _) = fs.create(2, b"small", &reg).unwrap();
    fs.write_at(s.ino, 0, &[b's'; 3000]).unwrap();
    fs.symlink(2, b"link", b"d1/sub/f", &reg).unwrap();
    fs.close().unwrap();
    if recipe == "dirty-journal" {
        let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
        let (j, _) = fs.mkdir(2, b"j", &dirs).unwrap();
        for i in 0..20 {
            let (f, _) = fs.create(j.ino, &name(i, 30), &reg).unwrap();
            fs.write_at(f.ino, 0, &pattern(700, i as u64)).unwrap();
        }
        fs.unlink(2, b"f1").unwrap();
        files.remove(1);
        fs.sync().unwrap();
        fs.crash();
        assert!(dumpe2fs_h(&img).contains("needs_recovery"));
    } else {
        e2fsck_clean(&img).unwrap();
    }

    // Where everything is, found on a copy (an open replays the journal
    // and marks it in use).
    let probe = dir.join(format!("probe-{recipe}.img"));
    sparse_copy(&img, &probe);
    let fs = Filesystem::open(open_file(&probe), RwOptions::default()).unwrap();
    let mut blocks: BTreeMap<Kind, Vec<u64>> = BTreeMap::new();
    let mut owners = HashMap::new();
    let (csum, desc_size, groups) =
        fs.read(|f| (f.info.csum, usize::from(f.info.desc_size), f.info.groups));
    blocks.insert(Kind::Superblock, vec![0]);
    blocks.insert(
        Kind::Descriptors,
        vec![ext4kit_format::layout::gdt_start(bs as u32)],
    );
    for g in 0..groups.min(2) {
        let (bb, ib) = fs.read(|f| {
            let d = f.group_desc(g).unwrap();
            (d.block_bitmap(), d.inode_bitmap())
        });
        blocks.entry(Kind::BlockBitmap).or_default().push(bb);
        blocks.entry(Kind::InodeBitmap).or_default().push(ib);
    }
    let tree = [
        2, d1.ino, sub.ino, deeper.ino, other.ino, h.ino, x.ino, s.ino, 8,
    ];
    let mut slots = Vec::new();
    let mut itable = HashSet::new();
    for &ino in tree.iter().chain(&files) {
        let (b, off) = fs.inode_location(ino).unwrap();
        itable.insert(b);
        slots.push((ino, b * bs + off as u64));
    }
    blocks.insert(Kind::InodeTable, itable.into_iter().collect());
    let mut used = Vec::new();
    for &ino in &files {
        let i = fs.inode(ino).unwrap();
        let (maps, nodes) = fs.read(|f| f.extent_tree(&i)).unwrap();
        for n in nodes.iter().filter(|n| n.pblk != 0) {
            owners.insert(n.pblk, (i.ino, i.generation));
            blocks.entry(Kind::ExtentBlock).or_default().push(n.pblk);
        }
        used.extend(maps.iter().map(|m| m.pblk));
    }
    let mut nested = Vec::new();
    let chains: [(u32, Vec<u32>); 5] = [
        (2, vec![2]),
        (d1.ino, vec![d1.ino, 2]),
        (sub.ino, vec![sub.ino, d1.ino, 2]),
        (deeper.ino, vec![deeper.ino, sub.ino, d1.ino, 2]),
        (h.ino, vec![h.ino, 2]),
    ];
    for (ino, chain) in chains {
        let i = fs.inode(ino).unwrap();
        for m in fs.read(|f| f.file_map(&i)).unwrap() {
            for b in m.pblk..m.pblk + u64::from(m.len) {
                owners.insert(b, (i.ino, i.generation));
                used.push(b);
                if ino == h.ino && m.lblk == 0 && b == m.pblk {
                    blocks.entry(Kind::HtreeRoot).or_default().push(b);
                } else {
                    blocks.entry(Kind::Dirents).or_default().push(b);
                }
                if ino != h.ino {
                    nested.push((b, chain.clone()));
                }
            }
        }
    }
    assert!(
        fs.inode(h.ino).unwrap().is_htree(),
        "{recipe}: /h is an htree"
    );
    let xi = fs.inode(x.ino).unwrap();
    assert_ne!(xi.file_acl, 0);
    blocks.insert(Kind::XattrBlock, vec![xi.file_acl]);
    used.push(xi.file_acl);
    let j = fs.inode(8).unwrap();
    let jm = fs.read(|f| f.file_map(&j)).unwrap();
    let jsb = jm[0].pblk;
    blocks.insert(Kind::JournalSuper, vec![jsb]);
    blocks.insert(Kind::JournalLog, (jsb + 1..jsb + 24).collect());
    fs.crash();
    let _ = std::fs::remove_file(&probe);
    if let Some(out) = std::env::var_os("EXT4KIT_FUZZ_RW_OUT") {
        let _ = std::fs::create_dir_all(&out);
        sparse_copy(&img, &Path::new(&out).join(format!("seed-{recipe}.img")));
    }
    Seed {
        name: recipe,
        bytes: std::fs::read(&img).unwrap(),
        bs,
        csum,
        desc_size,
        blocks,
        owners,
        slots,
        nested,
        files,
        used,
    }
}

/// What a case did to the seed (for the report).
struct Mutation {
    kind: Kind,
    what: String,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// One to four edits of `buf[range]`: bit flips, bytes, 32-bit values.
fn scribble(rng: &mut Rng, buf: &mut [u8], lo: usize, hi: usize) -> String {
    let mut what = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let off = lo + rng.below((hi - lo) as u64) as usize;
        match rng.below(6) {
            0 => {
                let bit = rng.below(8);
                buf[off] ^= 1 << bit;
                what.push(format!("flip {off}.{bit}"));
            }
            1 => {
                let v = rng.next() as u8;
                buf[off] = v;
                what.push(format!("byte {off}={v:#x}"));
            }
            k => {
                let o = (off & !3).min(hi.saturating_sub(4)).max(lo);
                let v: u32 = match k {
                    2 => 0,
                    3 => u32::MAX,
                    4 => rng.below(64) as u32,
                    _ => rng.next() as u32,
                };
                if o + 4 <= buf.len() {
                    buf[o..o + 4].copy_from_slice(&v.to_le_bytes());
                }
                what.push(format!("u32 {o}={v:#x}"));
            }
        }
    }
    what.join(", ")
}

/// The dirents of a linear directory block: (offset, inode, rec_len,
/// name_len).
fn dirents(b: &[u8]) -> Vec<(usize, u32, u16, u8)> {
    let mut out = Vec::new();
    let mut o = 0;
    while o + 8 <= b.len() {
        let rl = u16_at(b, o + 4);
        out.push((o, u32_at(b, o), rl, b[o + 6]));
        if rl < 8 {
            break;
        }
        o += usize::from(rl);
    }
    out
}

impl Seed {
    fn block<'a>(&self, img: &'a mut [u8], blk: u64) -> &'a mut [u8] {
        let bs = self.bs as usize;
        &mut img[blk as usize * bs..(blk as usize + 1) * bs]
    }

    /// Make the checksum of block `blk` (a `kind`) right again where it
    /// was right in the seed.
    fn reseal(&self, img: &mut [u8], kind: Kind, blk: u64) {
        let c = self.csum;
        let old = self.block(&mut self.bytes.clone(), blk).to_vec();
        let owner = self.owners.get(&blk).copied();
        let bs = self.bs as usize;
        let b = self.block(img, blk);
        match kind {
            Kind::Superblock => {
                let o = if bs == 1024 { 0 } else { 1024 };
                let s = &mut b[o..o + 1024];
                if let Ok(mut sb) =
                    <ext4kit_format::superblock::Superblock as zerocopy::FromBytes>::read_from_bytes(
                        s,
                    )
                    && c.metadata
                {
                    sb.update_checksum();
                    s.copy_from_slice(zerocopy::IntoBytes::as_bytes(&sb));
                }
            }
            Kind::Descriptors => {
                for g in 0..bs / self.desc_size {
                    let r = g * self.desc_size..(g + 1) * self.desc_size;
                    let was = c.group_desc(g as u32, &old[r.clone()]);
                    if u16_at(&old, r.start + 0x1E) == was && was != 0 {
                        let v = c.group_desc(g as u32, &b[r.clone()]);
                        b[r.start + 0x1E..r.start + 0x20].copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Kind::InodeTable => {
                for &(ino, at) in &self.slots {
                    if at / self.bs != blk {
                        continue;
                    }
                    let o = (at % self.bs) as usize;
                    let isz = 128.max(self.inode_size(&old, o));
                    let slot = o..(o + isz).min(bs);
                    if ext4kit_format::inode::checksum_ok(&old[slot.clone()], ino, &c) {
                        ext4kit_format::inode::set_checksum(&mut b[slot], ino, &c);
                    }
                }
            }
            Kind::ExtentBlock => {
                if let Some((ino, g)) = owner {
                    ext4kit_format::extent::set_block_checksum(b, ino, g, &c);
                }
            }
            Kind::Dirents | Kind::Loop | Kind::DirentLen => {
                let t = bs - 12;
                let tail =
                    old[t..t + 4] == [0; 4] && old[t + 4..t + 6] == [12, 0] && old[t + 7] == 0xDE;
                if let (true, Some((ino, g))) = (tail, owner) {
                    ext4kit_format::dir::put_tail(b, ino, g, &c);
                }
            }
            Kind::XattrBlock if c.metadata => {
                let v = c.xattr_block(blk, b);
                b[16..20].copy_from_slice(&v.to_le_bytes());
            }
            Kind::JournalSuper if old[0xFC..0x100] != [0; 4] => {
                let v = ext4kit_format::checksum::jbd2::superblock(b);
                b[0xFC..0x100].copy_from_slice(&v.to_be_bytes());
            }
            _ => {}
        }
    }

    fn inode_size(&self, _blk: &[u8], _o: usize) -> usize {
        let sb = &self.bytes[1024..2048];
        usize::from(u16_at(sb, 0x58)).max(128)
    }

    /// Reseal the inode slot at byte `at` of the image (inode `ino`).
    fn reseal_inode(&self, img: &mut [u8], ino: u32, at: u64) {
        let isz = self.inode_size(&[], 0) as u64;
        let slot = &mut img[at as usize..(at + isz) as usize];
        if self.csum.metadata {
            ext4kit_format::inode::set_checksum(slot, ino, &self.csum);
        }
    }

    fn mutate(&self, rng: &mut Rng) -> (Vec<u8>, Mutation) {
        let mut img = self.bytes.clone();
        let structural = rng.below(4) == 0;
        let kind = if structural {
            STRUCT_KINDS[rng.below(4) as usize]
        } else {
            RAW_KINDS[rng.below(RAW_KINDS.len() as u64) as usize]
        };
        let pick = |rng: &mut Rng, v: &[u64]| v[rng.below(v.len() as u64) as usize];
        let reseal = rng.below(5) != 0;
        let bs = self.bs as usize;
        let what = match kind {
            Kind::Loop => {
                let (blk, chain) = &self.nested[rng.below(self.nested.len() as u64) as usize];
                let b = self.block(&mut img, *blk);
                let ents: Vec<_> = dirents(b)
                    .into_iter()
                    .filter(|e| e.1 != 0 && e.3 > 0 && usize::from(e.2) <= bs)
                    .skip(2)
                    .collect();
                if ents.is_empty() {
                    return self.mutate(rng);
                }
                let e = ents[rng.below(ents.len() as u64) as usize];
                let to = chain[rng.below(chain.len() as u64) as usize];
                b[e.0..e.0 + 4].copy_from_slice(&to.to_le_bytes());
                b[e.0 + 7] = 2; // FT_DIR
                if reseal {
                    self.reseal(&mut img, kind, *blk);
                }
                format!("block {blk} entry at {} -> inode {to} (dir)", e.0)
            }
            Kind::DirentLen => {
                let (blk, _) = &self.nested[rng.below(self.nested.len() as u64) as usize];
                let blk = *blk;
                let b = self.block(&mut img, blk);
                let ents = dirents(b);
                let e = ents[rng.below(ents.len() as u64) as usize];
                let w = if rng.below(2) == 0 {
                    let v = [0u16, 4, 8, 11, 12, 13, 1023, 4095, 65535][rng.below(9) as usize]
                        .wrapping_add(rng.below(2) as u16);
                    b[e.0 + 4..e.0 + 6].copy_from_slice(&v.to_le_bytes());
                    format!("rec_len={v}")
                } else {
                    let v = rng.next() as u8;
                    b[e.0 + 6] = v;
                    format!("name_len={v}")
                };
                if reseal {
                    self.reseal(&mut img, kind, blk);
                }
                format!("block {blk} entry at {}: {w}", e.0)
            }
            Kind::CrossLink | Kind::ExtentHeader => {
                let ino = self.files[rng.below(self.files.len() as u64) as usize];
                let at = self
                    .slots
                    .iter()
                    .find(|s| s.0 == ino)
                    .map(|s| s.1)
                    .unwrap_or(0);
                // The extent root in i_block (offset 40), or a leaf block.
                let leaf = self
                    .owners
                    .iter()
                    .filter(|(b, o)| o.0 == ino && self.blocks[&Kind::ExtentBlock].contains(b))
                    .map(|(b, _)| *b)
                    .min();
                let (base, in_block) = match leaf {
                    Some(l) if rng.below(2) == 0 => (l as usize * bs, Some(l)),
                    _ => (at as usize + 40, None),
                };
                let node = &mut img[base..];
                let entries = usize::from(u16_at(node, 2)).max(1);
                let w = if kind == Kind::ExtentHeader {
                    let (field, v) = match rng.below(4) {
                        0 => ("magic", rng.next() as u16),
                        1 => ("entries", [0u16, 5, 340, 65535][rng.below(4) as usize]),
                        2 => ("max", [0u16, 1, 4, 65535][rng.below(4) as usize]),
                        _ => ("depth", [1u16, 2, 5, 6, 65535][rng.below(5) as usize]),
                    };
                    let o = match field {
                        "magic" => 0,
                        "entries" => 2,
                        "max" => 4,
                        _ => 6,
                    };
                    node[o..o + 2].copy_from_slice(&v.to_le_bytes());
                    format!("{field}={v}")
                } else {
                    // An extent (or index) entry's start at a block in use.
                    let i = rng.below(entries.min(4) as u64) as usize;
                    let depth = u16_at(node, 6);
                    let to = pick(rng, &self.used);
                    let e = 12 + 12 * i;
                    if depth == 0 {
                        node[e + 6..e + 8].copy_from_slice(&((to >> 32) as u16).to_le_bytes());
                        node[e + 8..e + 12].copy_from_slice(&(to as u32).to_le_bytes());
                    } else {
                        node[e + 4..e + 8].copy_from_slice(&(to as u32).to_le_bytes());
                        node[e + 8..e + 10].copy_from_slice(&((to >> 32) as u16).to_le_bytes());
                    }
                    format!("entry {i} -> block {to}")
                };
                if reseal {
                    match in_block {
                        Some(l) => self.reseal(&mut img, Kind::ExtentBlock, l),
                        None => self.reseal_inode(&mut img, ino, at),
                    }
                }
                match in_block {
                    Some(l) => format!("inode {ino} leaf {l}: {w}"),
                    None => format!("inode {ino} root: {w}"),
                }
            }
            Kind::InodeTable if rng.below(2) == 0 => {
                let (ino, at) = self.slots[rng.below(self.slots.len() as u64) as usize];
                let isz = self.inode_size(&[], 0);
                let w = scribble(rng, &mut img, at as usize, at as usize + isz);
                if reseal {
                    self.reseal_inode(&mut img, ino, at);
                }
                format!("inode {ino}: {w}")
            }
            _ => {
                let Some(v) = self.blocks.get(&kind).filter(|v| !v.is_empty()) else {
                    return self.mutate(rng);
                };
                let blk = pick(rng, v);
                let (lo, hi) = match kind {
                    Kind::Superblock => (1024, 2048),
                    Kind::JournalSuper => (blk as usize * bs, blk as usize * bs + 1024.min(bs)),
                    _ => (blk as usize * bs, (blk as usize + 1) * bs),
                };
                let w = scribble(rng, &mut img, lo, hi);
                if reseal {
                    let b = if kind == Kind::Superblock {
                        u64::from(bs == 1024)
                    } else {
                        blk
                    };
                    self.reseal(&mut img, kind, b);
                }
                format!("block {blk}: {w}")
            }
        };
        let what = format!("{what}{}", if reseal { " (resealed)" } else { "" });
        (img, Mutation { kind, what })
    }
}

/// How one run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Panic,
    Signal,
    Hang,
    Refused,
    Ok,
    /// Ok, but e2fsck could not check the mutated image (it aborted):
    /// nothing to compare with.
    Unchecked,
    /// Ok, and e2fsck reports a new kind of damage on an image it found
    /// damaged before (e.g. a block allocated that a damaged extent tree
    /// claims while the bitmap says free: the damage spreads, as it does
    /// with the kernel). Reported with reproducers, not a failure.
    Propagated,
    /// Ok, and e2fsck reports damage on an image it found clean.
    NewDamage,
}

fn classify(st: Option<ExitStatus>, stderr: &str) -> Class {
    match st {
        None => Class::Hang,
        Some(_) if stderr.contains("panicked at") => Class::Panic,
        Some(s) if s.code() == Some(101) => Class::Panic,
        Some(s) if s.signal().is_some() => Class::Signal,
        Some(s) if s.success() => Class::Ok,
        Some(_) => Class::Refused,
    }
}

/// Run `cmd` (stdout dropped, stderr captured) for at most `limit`.
fn run_for(cmd: &mut Command, limit: Duration) -> (Option<ExitStatus>, String) {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return (Some(ExitStatus::from_raw(127 << 8)), e.to_string()),
    };
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let t = Instant::now();
    let st = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(3)),
            Err(_) => break None,
        }
    };
    let s = reader.join().unwrap_or_default();
    (st, String::from_utf8_lossy(&s).into_owned())
}

/// e2fsck -fn's complaints, numbers and the image's name taken out
/// (a count that changes is the same complaint).
fn fsck_lines(img: &Path) -> (Option<i32>, Vec<String>) {
    let mut c = tool("e2fsck");
    c.arg("-fn").arg(img);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = match c.output() {
        Ok(o) => o,
        Err(_) => return (None, vec![]),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = img.display().to_string();
    let mut v: Vec<String> = text
        .lines()
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("e2fsck ")
                && !l.starts_with("Pass ")
                && !l.contains(" files (")
                && !l.starts_with("Warning: skipping journal recovery")
        })
        .map(|l| {
            // Paths and names change with a rename; the complaint stays.
            let l = l.replace(&shown, "IMG");
            // A list of blocks or inodes: the complaint is its kind.
            if let Some((head, _)) = l.split_once(" differences: ") {
                return format!("{head} differences");
            }
            // Wrong free counts, of a group or of the superblock (which a
            // tool sums from the groups): one kind.
            for k in ["Free blocks count wrong", "Free inodes count wrong"] {
                if l.starts_with(k) {
                    return k.to_string();
                }
            }
            let l = l.split(" mod time ").next().unwrap_or("").to_string();
            let l: String = l
                .split(' ')
                .map(|w| {
                    let w = w.trim_start_matches('\t');
                    if w.starts_with('/') {
                        "PATH"
                    } else if w.starts_with("(/") || w.starts_with("(...)") {
                        // "Inode N (PATH) has invalid mode": a path
                        // that is "..." once its parent is gone.
                        "(PATH)"
                    } else if w.starts_with('\'') && w.len() > 1 {
                        "'NAME'"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
            l.chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect::<String>()
        })
        .map(|l| {
            // A directory with two parents: which one e2fsck calls the
            // extra link depends on the order it meets them (a rename of
            // the directory changes it).
            if l.contains("is a link to directory")
                || (l.starts_with("'#'") || l.starts_with("'NAME'"))
                    && l.contains(" should be PATH")
            {
                return "a directory with two parents".to_string();
            }
            // "###" and "#" are the same complaint.
            let mut s = String::new();
            for c in l.chars() {
                if !(c == '#' && s.ends_with('#')) {
                    s.push(c);
                }
            }
            s
        })
        .collect();
    v.sort();
    v.dedup();
    (out.status.code(), v)
}

/// The baseline complaints of a mutated image: e2fsck -fn on it and,
/// when its journal needs recovery, on a copy e2fsck replayed first.
fn baseline(img: &Path, scratch: &Path) -> Option<HashSet<String>> {
    let (code, mut lines) = fsck_lines(img);
    // e2fsck could not check it (aborted or crashed): nothing to compare.
    if code.is_none_or(|c| c >= 8) || lines.iter().any(|l| l.contains("aborted")) {
        return None;
    }
    if needs_recovery(img) {
        let copy = scratch.join("replayed.img");
        let _ = std::fs::copy(img, &copy);
        let _ = run_for(
            tool("e2fsck")
                .arg("-p")
                .arg("-E")
                .arg("journal_only")
                .arg(&copy),
            Duration::from_secs(60),
        );
        lines.extend(fsck_lines(&copy).1);
        let _ = std::fs::remove_file(&copy);
    }
    Some(lines.into_iter().collect())
}

/// Does the image's superblock say its journal needs recovery?
fn needs_recovery(img: &Path) -> bool {
    let sb = std::fs::read(img)
        .map(|b| b.get(1024..2048).map(<[u8]>::to_vec).unwrap_or_default())
        .unwrap_or_default();
    sb.len() == 1024 && u16_at(&sb, 0x38) == 0xEF53 && u32_at(&sb, 0x60) & 0x4 != 0
}

/// e2fsck -fn after a tool: of the image as e2fsck would leave it after
/// its journal replay when the tool left the journal to recover (a
/// journal aborted on corruption keeps its committed transactions).
fn after_lines(img: &Path, scratch: &Path) -> (Option<i32>, Vec<String>, bool) {
    if !needs_recovery(img) {
        let (c, l) = fsck_lines(img);
        return (c, l, false);
    }
    let copy = scratch.join("after-replayed.img");
    let _ = std::fs::copy(img, &copy);
    let _ = run_for(
        tool("e2fsck")
            .arg("-p")
            .arg("-E")
            .arg("journal_only")
            .arg(&copy),
        Duration::from_secs(60),
    );
    let (c, l) = fsck_lines(&copy);
    let _ = std::fs::remove_file(&copy);
    (c, l, true)
}

/// The read-write subcommands and their arguments (`@` is the image).
fn tool_runs(host: &Path) -> Vec<(&'static str, Vec<String>)> {
    let h = |p: &str| host.join(p).display().to_string();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        (
            "cp in",
            vec!["cp".into(), h("file"), "@:/d1/sub/new".into()],
        ),
        (
            "cp -a in",
            vec!["cp".into(), "-a".into(), h("tree"), "@:/h".into()],
        ),
        (
            "cp -r out",
            vec!["cp".into(), "-r".into(), "@:/d1".into(), h("out")],
        ),
        (
            "cp -a out",
            vec!["cp".into(), "-a".into(), "@:/".into(), h("out")],
        ),
        (
            "mkdir -p",
            v(&["mkdir", "-p", "@:/d1/sub/deeper/n/m", "@:/h/nd"]),
        ),
        (
            "rm",
            v(&[
                "rm",
                "@:/f0",
                &format!("@:/h/{}", String::from_utf8_lossy(&name(7, 60))),
            ]),
        ),
        ("rm -r", v(&["rm", "-r", "@:/d1"])),
        ("rm -r htree", v(&["rm", "-r", "@:/h"])),
        ("mv", v(&["mv", "@:/f2", "@:/d1/other/f2m"])),
        ("mv dir", v(&["mv", "@:/d1/sub", "@:/h/subm"])),
        ("ln", v(&["ln", "@:/small", "@:/d1/small2"])),
        ("ln -s", v(&["ln", "-s", "d1/other/h", "@:/d1/sl"])),
        ("chmod", v(&["chmod", "600", "@:/f2", "@:/d1"])),
        ("chown", v(&["chown", "12:34", "@:/x", "@:/h"])),
        ("truncate", v(&["truncate", "-s", "3000", "@:/f2"])),
        ("truncate +", v(&["truncate", "-s", "200000", "@:/small"])),
        ("fallocate", v(&["fallocate", "-l", "65536", "@:/f1"])),
        (
            "fallocate -p",
            v(&["fallocate", "-p", "-o", "4096", "-l", "8192", "@:/f2"]),
        ),
        // Inline inodes (the inline recipe's; absent elsewhere: refused).
        (
            "inline grow",
            v(&["truncate", "-s", "5000", "@:/tiny", "@:/id/a"]),
        ),
        ("inline mkdir", v(&["mkdir", "@:/id/sub/nd", "@:/id/n2"])),
        ("inline mv", v(&["mv", "@:/id/sub", "@:/d1/idsub"])),
        ("inline rm -r", v(&["rm", "-r", "@:/id"])),
        ("fstrim", v(&["fstrim", "@"])),
        ("journal replay", v(&["journal", "replay", "@"])),
        ("lazyinit", v(&["lazyinit", "@"])),
    ]
}

/// One finding: a class other than ok/refused.
struct Finding {
    case: usize,
    seed: &'static str,
    mutation: String,
    tool: String,
    class: Class,
    detail: String,
}

#[derive(Default)]
struct Tally {
    images: usize,
    runs: BTreeMap<(String, Class), usize>,
    classes: BTreeMap<Class, usize>,
    kinds: BTreeMap<Kind, usize>,
    mounts: usize,
    findings: Vec<Finding>,
    /// The last line of one refusal per tool (a sample for the report).
    refusals: BTreeMap<String, String>,
    /// Successful runs that left the journal to recover (aborted on
    /// corruption) on an image whose journal was clean, per tool.
    left_dirty: BTreeMap<String, usize>,
}

fn mount_available() -> bool {
    fuse_available().is_ok()
}

/// The mount's small workload: walk (bounded), read, create, write,
/// mkdir, rename, unlink, fsync.
fn workload(m: &Path) {
    let mut todo = vec![(m.to_path_buf(), 0)];
    let mut n = 0;
    while let Some((d, depth)) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten().take(64) {
            n += 1;
            if n > 400 {
                break;
            }
            let p = e.path();
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if md.is_dir() && depth < 6 {
                todo.push((p, depth + 1));
            } else if md.is_file() {
                if let Ok(f) = std::fs::File::open(&p) {
                    let mut b = vec![0u8; 65536];
                    let _ = f.read_at(&mut b, 0);
                }
            } else if md.is_symlink() {
                let _ = std::fs::read_link(&p);
            }
        }
    }
    let _ = std::fs::write(m.join("d1/sub/mnew"), pattern(10000, 3));
    let _ = std::fs::create_dir(m.join("h/mdir"));
    let _ = std::fs::rename(m.join("f2"), m.join("d1/f2r"));
    let _ = std::fs::remove_file(m.join("f0"));
    let _ = std::fs::remove_dir_all(m.join("d1/other"));
    if let Ok(f) = std::fs::OpenOptions::new()
        .append(true)
        .open(m.join("small"))
    {
        let _ = f.write_at(b"appended", 3000);
        let _ = f.sync_all();
    }
}

/// The daemon's threads (name, state, kernel wait channel), for a hang.
fn thread_states(pid: u32) -> String {
    let mut s = String::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    for t in tasks.into_iter().flatten().flatten() {
        let p = t.path();
        let r = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let status = r("status");
        let state = status
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or("");
        s.push_str(&format!(
            "thread {} {}: {state} wchan {}\n",
            r("comm").trim(),
            t.file_name().to_string_lossy(),
            r("wchan")
        ));
    }
    s
}

/// Mount `img`, run the workload, unmount: the class of the whole.
fn mount_case(img: &Path, limit: Duration) -> (Class, String) {
    let dir = match tempfile::Builder::new()
        .prefix("ext4kit-fuzz-mnt.")
        .tempdir()
    {
        Ok(d) => d,
        Err(e) => return (Class::Refused, e.to_string()),
    };
    let log = img.with_extension("mount.log");
    let logf = std::fs::File::create(&log).unwrap();
    let mut child = match ext4kit()
        .arg("mount")
        .arg("-f")
        .arg(img)
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(logf)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (Class::Refused, e.to_string()),
    };
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let t = Instant::now();
    let mut up = false;
    let mut early = None;
    while t.elapsed() < limit {
        if is_fuse_mounted(dir.path()) {
            up = true;
            break;
        }
        if let Ok(Some(st)) = child.try_wait() {
            early = Some(st);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let cleanup = |dir: &Path| {
        for i in 0..40 {
            if !is_fuse_mounted(dir) {
                return;
            }
            let mut c = tool("umount");
            if i >= 3 {
                c.arg("-l");
            }
            let _ = c.arg(dir).output();
            std::thread::sleep(Duration::from_millis(25));
        }
    };
    if !up {
        let class = match early {
            Some(st) => classify(Some(st), &read_log()),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Class::Hang
            }
        };
        cleanup(dir.path());
        return (class, read_log());
    }
    let m = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let w = m.clone();
    std::thread::spawn(move || {
        workload(&w);
        let _ = tx.send(());
    });
    if rx.recv_timeout(limit).is_err() {
        let threads = thread_states(child.id());
        let _ = child.kill();
        let _ = child.wait();
        cleanup(&m);
        return (
            Class::Hang,
            format!("workload did not finish\n{threads}{}", read_log()),
        );
    }
    // umount, again while the mount is busy (a child forked by another
    // worker may hold a copy of a descriptor for a moment), then lazily.
    let mut ust = None;
    for i in 0..10 {
        let mut c = tool("umount");
        if i == 9 {
            c.arg("-l");
        }
        let (st, err) = run_for(c.arg(&m), limit);
        ust = Some((st, err));
        if st.is_some_and(|s| s.success()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let t = Instant::now();
    let mut threads = String::new();
    let st = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            _ if t.elapsed() > limit => {
                threads = thread_states(child.id());
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    cleanup(&m);
    if st.is_none() {
        return (
            Class::Hang,
            format!(
                "the daemon did not exit (umount: {ust:?})\n{threads}{}",
                read_log()
            ),
        );
    }
    (classify(st, &read_log()), read_log())
}

/// One mutated image: every tool on a fresh copy, and the mount.
#[allow(clippy::too_many_arguments)]
fn run_case(
    case: usize,
    seed: &Seed,
    img_bytes: &[u8],
    m: &Mutation,
    scratch: &Path,
    host: &Path,
    mount: bool,
    limit: Duration,
    tally: &Mutex<Tally>,
    out: Option<&Path>,
) {
    let mutated = scratch.join("mutated.img");
    std::fs::write(&mutated, img_bytes).unwrap();
    let base_dirty = needs_recovery(&mutated);
    let base = baseline(&mutated, scratch);
    let work = scratch.join("work.img");
    let mut results: Vec<(String, Class, String)> = Vec::new();
    let mut left_dirty: Vec<String> = Vec::new();
    let mut check = |tool: &str, class: Class, stderr: String, results: &mut Vec<_>| {
        if class != Class::Ok {
            results.push((tool.to_string(), class, stderr));
            return;
        }
        let Some(base) = &base else {
            results.push((tool.to_string(), Class::Unchecked, String::new()));
            return;
        };
        let (code, after, dirty) = after_lines(&work, scratch);
        if dirty && !base_dirty {
            left_dirty.push(tool.to_string());
        }
        let new: Vec<&String> = after.iter().filter(|l| !base.contains(*l)).collect();
        if code.is_none() || !new.is_empty() {
            let detail = format!(
                "new e2fsck lines:\n{}\n(stderr of the tool:)\n{stderr}",
                new.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            let class = if base.is_empty() {
                Class::NewDamage
            } else {
                Class::Propagated
            };
            results.push((tool.to_string(), class, detail));
        } else {
            results.push((tool.to_string(), Class::Ok, String::new()));
        }
    };
    for (label, args) in tool_runs(host) {
        std::fs::write(&work, img_bytes).unwrap();
        let _ = std::fs::remove_dir_all(host.join("out"));
        std::fs::create_dir(host.join("out")).unwrap();
        let shown = work.display().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a == "@" {
                    shown.clone()
                } else if let Some(rest) = a.strip_prefix("@:") {
                    format!("{shown}:{rest}")
                } else {
                    a.clone()
                }
            })
            .collect();
        let (st, stderr) = run_for(ext4kit().args(&args), limit);
        let class = classify(st, &stderr);
        if label.ends_with(" out") && class == Class::Ok {
            // Read-only: the image must not change.
            let same = std::fs::read(&work)
                .map(|b| b == img_bytes)
                .unwrap_or(false);
            let c = if same { Class::Ok } else { Class::NewDamage };
            results.push((label.to_string(), c, "the image changed".into()));
            continue;
        }
        check(label, class, stderr, &mut results);
    }
    if mount {
        std::fs::write(&work, img_bytes).unwrap();
        let (class, log) = mount_case(&work, limit);
        check("mount", class, log, &mut results);
    }
    let mut t = tally.lock().unwrap();
    for tool in left_dirty {
        *t.left_dirty.entry(tool).or_default() += 1;
    }
    t.images += 1;
    *t.kinds.entry(m.kind).or_default() += 1;
    t.mounts += usize::from(mount);
    for (tool, class, detail) in results {
        *t.runs.entry((tool.clone(), class)).or_default() += 1;
        *t.classes.entry(class).or_default() += 1;
        if class == Class::Refused {
            let last = detail.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
            t.refusals
                .entry(tool.clone())
                .or_insert_with(|| last.to_string());
        }
        if matches!(class, Class::Ok | Class::Refused | Class::Unchecked) {
            continue;
        }
        eprintln!(
            "FINDING case {case} ({} seed, {:?}: {}): {tool}: {class:?}\n{detail}",
            seed.name, m.kind, m.what
        );
        if let Some(out) = out {
            let d = out.join(format!("case-{case:05}-{}", tool.replace(' ', "_")));
            let _ = std::fs::create_dir_all(&d);
            let _ = std::fs::write(d.join("mutated.img"), img_bytes);
            let _ = std::fs::write(
                d.join("README"),
                format!(
                    "seed image: {}\nmutation: {:?}: {}\ntool: {tool}\nclass: {class:?}\n\
                     (run the tool's command of tests/fuzz_rw.rs tool_runs on a copy of mutated.img)\n\n{detail}\n\n\
                     e2fsck baseline:\n{}\n",
                    seed.name,
                    m.kind,
                    m.what,
                    base.iter()
                        .flatten()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            );
        }
        if class == Class::Propagated {
            continue;
        }
        t.findings.push(Finding {
            case,
            seed: seed.name,
            mutation: format!("{:?}: {}", m.kind, m.what),
            tool,
            class,
            detail,
        });
    }
}

fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| {
            let v = v.trim();
            v.strip_prefix("0x")
                .map(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or_else(|| v.parse().ok())
        })
        .unwrap_or(default)
}

#[test]
fn fuzz_rw_tools_and_mount() {
    if let Err(why) = e2fs_tools() {
        return skip("fuzz_rw_tools_and_mount", &why);
    }
    let seed = env_num("EXT4KIT_FUZZ_RW_SEED", DEFAULT_SEED);
    let images = env_num("EXT4KIT_FUZZ_RW_IMAGES", 20) as usize;
    let jobs = env_num("EXT4KIT_FUZZ_RW_JOBS", 1).max(1) as usize;
    let out = std::env::var_os("EXT4KIT_FUZZ_RW_OUT").map(PathBuf::from);
    let limit = Duration::from_secs(env_num("EXT4KIT_FUZZ_RW_TIMEOUT", 30));
    // EXT4KIT_FUZZ_RW_CASES=3,17: only those cases (reproducing).
    let only: Option<Vec<usize>> = std::env::var("EXT4KIT_FUZZ_RW_CASES")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect());
    let mount = mount_available();
    if !mount {
        skip(
            "fuzz_rw_tools_and_mount: the mount part",
            &fuse_available().err().unwrap_or_default(),
        );
    }
    let dir = image_dir();
    let recipes = [
        "default",
        "no-csum",
        "i128-no64bit",
        "4k",
        "dirty-journal",
        "inline",
        "bigalloc",
        "features",
        "mmp-fc",
    ];
    let seeds: Vec<Seed> = recipes.iter().map(|r| build_seed(dir.path(), r)).collect();
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..jobs {
            let (next, tally, seeds, out, dir, only) =
                (&next, &tally, &seeds, &out, dir.path(), &only);
            s.spawn(move || {
                let scratch = dir.join(format!("w{w}"));
                let host = scratch.join("host");
                std::fs::create_dir_all(host.join("tree/sub")).unwrap();
                std::fs::write(host.join("file"), pattern(20000, 1)).unwrap();
                std::fs::write(host.join("tree/a"), pattern(5000, 2)).unwrap();
                std::fs::write(host.join("tree/sub/b"), b"b\n").unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let case = match only {
                        Some(v) if i < v.len() => v[i],
                        Some(_) => break,
                        None if i < images => i,
                        None => break,
                    };
                    let mut rng =
                        Rng((seed ^ (case as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
                    for _ in 0..4 {
                        rng.next();
                    }
                    let sd = &seeds[case % seeds.len()];
                    let (bytes, m) = sd.mutate(&mut rng);
                    run_case(
                        case,
                        sd,
                        &bytes,
                        &m,
                        &scratch,
                        &host,
                        mount,
                        limit,
                        tally,
                        out.as_deref(),
                    );
                    if (case + 1) % 50 == 0 {
                        eprintln!(
                            "fuzz_rw: {} images, {:.0} s",
                            case + 1,
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
            });
        }
    });
    let t = tally.into_inner().unwrap();
    let runs: usize = t.classes.values().sum();
    let count = |c: Class| t.classes.get(&c).copied().unwrap_or(0);
    eprintln!(
        "fuzz_rw: seed {seed:#x}, {} images, {runs} runs ({} mounts) in {:.0} s: \
                  panic {}, signal {}, hang {}, refused {}, ok {} (+{} on images e2fsck could not check), new damage {} (+{} spread on damaged images)",
        t.images,
        t.mounts,
        started.elapsed().as_secs_f64(),
        count(Class::Panic),
        count(Class::Signal),
        count(Class::Hang),
        count(Class::Refused),
        count(Class::Ok),
        count(Class::Unchecked),
        count(Class::NewDamage),
        count(Class::Propagated),
    );
    eprintln!(
        "fuzz_rw: ok runs that left the journal to recover: {:?}",
        t.left_dirty
    );
    eprintln!("fuzz_rw: mutations by kind: {:?}", t.kinds);
    let mut per_tool: BTreeMap<&str, BTreeMap<Class, usize>> = BTreeMap::new();
    for ((tool, class), n) in &t.runs {
        *per_tool.entry(tool).or_default().entry(*class).or_default() += n;
    }
    for (tool, m) in per_tool {
        eprintln!("fuzz_rw:   {tool:<15} {m:?}");
    }
    for (tool, line) in &t.refusals {
        eprintln!("fuzz_rw:   {tool:<15} refused e.g.: {line}");
    }
    assert!(
        t.findings.is_empty(),
        "{} findings: {:#?}",
        t.findings.len(),
        t.findings
            .iter()
            .map(|f| format!(
                "case {} ({} seed, {}): {}: {:?}: {}",
                f.case,
                f.seed,
                f.mutation,
                f.tool,
                f.class,
                f.detail.chars().take(400).collect::<String>()
            ))
            .collect::<Vec<_>>()
    );
}
