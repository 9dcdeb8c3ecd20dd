//! Directory writes (`ext4kit_fs::dir_write`) on real mke2fs images.
//!
//! A test-only [`DirBlocks`] writes directory blocks straight into the
//! image (unjournaled) and allocates from the block bitmaps of initialized
//! groups, keeping bitmaps, descriptor and superblock counts and their
//! checksums right, so that e2fsck sees a consistent filesystem. The
//! entries point at a few regular files made by debugfs whose link counts
//! are set to match at the end.
//!
//! Oracles: `e2fsck -fn` (clean), debugfs `ls -p` and `htree_dump`, and the
//! read side's `read_dir`/`lookup`.

mod common;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use ext4kit_device::{FileDevice, OpenOptions};
use ext4kit_format::Csum;
use ext4kit_format::dir::FT_REG_FILE;
use ext4kit_format::group_desc::GroupDesc;
use ext4kit_fs::FsError;
use ext4kit_fs::dir_write::{DirBlocks, DirParams, DirWriter};
use ext4kit_fs::sb::{Fs, FsInfo, Volume};

const BLOCK_UNINIT: u16 = 2;

/// A directory of an image file, written in place.
struct ImageDir {
    file: std::fs::File,
    info: FsInfo,
    /// The group descriptors (the test allocator changes and writes them).
    descs: Vec<GroupDesc>,
    p: DirParams,
    slot_off: u64,
    slot: Vec<u8>,
    pblks: Vec<u64>,
    indexed: bool,
    bitmaps: BTreeMap<u32, Vec<u8>>,
    allocated: u64,
}

fn inode_slot_off(fs: &Fs<'_>, ino: u32) -> u64 {
    let info = fs.info;
    let g = (ino - 1) / info.inodes_per_group;
    let i = (ino - 1) % info.inodes_per_group;
    fs.group_desc(g).unwrap().inode_table() * u64::from(info.block_size)
        + u64::from(i) * u64::from(info.inode_size)
}

impl ImageDir {
    fn open(img: &Path, path: &[u8]) -> ImageDir {
        let dev = FileDevice::open(img, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let dir = fs.resolve(path, false).unwrap();
        let mut pblks = Vec::new();
        for m in fs.file_map(&dir).unwrap() {
            assert_eq!(m.lblk, pblks.len() as u64, "a hole in the directory");
            pblks.extend((0..u64::from(m.len)).map(|i| m.pblk + i));
        }
        pblks.truncate((dir.size / u64::from(vol.info.block_size)) as usize);
        let info = vol.info.clone();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(img)
            .unwrap();
        let descs = (0..info.groups)
            .map(|g| fs.group_desc(g).unwrap())
            .collect();
        ImageDir {
            p: DirParams::new(&info, &dir),
            slot_off: inode_slot_off(&fs, dir.ino),
            descs,
            slot: dir.raw.clone(),
            indexed: dir.is_htree(),
            info,
            file,
            pblks,
            bitmaps: BTreeMap::new(),
            allocated: 0,
        }
    }

    fn bs(&self) -> u64 {
        u64::from(self.info.block_size)
    }

    fn alloc(&mut self) -> u64 {
        let goal = self.pblks.last().map_or(0, |b| b + 1);
        let bpg = u64::from(self.info.blocks_per_group);
        let first = self.info.first_data_block;
        let g0 = ((goal.max(first) - first) / bpg) as u32;
        for k in 0..self.info.groups {
            let g = (g0 + k) % self.info.groups;
            let d = &self.descs[g as usize];
            if d.flags() & BLOCK_UNINIT != 0 || d.free_blocks() == 0 {
                continue;
            }
            let start = self.info.group_first_block(g);
            let n = (self.info.blocks_count - start).min(bpg);
            let bm_blk = d.block_bitmap();
            let bs = self.bs();
            let file = &self.file;
            let bm = self.bitmaps.entry(g).or_insert_with(|| {
                let mut b = vec![0u8; bs as usize];
                file.read_exact_at(&mut b, bm_blk * bs).unwrap();
                b
            });
            let from = if k == 0 {
                goal.saturating_sub(start)
            } else {
                0
            };
            if let Some(i) = (from..n).find(|&i| bm[(i / 8) as usize] & (1 << (i % 8)) == 0) {
                bm[(i / 8) as usize] |= 1 << (i % 8);
                let d = &mut self.descs[g as usize];
                d.set_free_blocks(d.free_blocks() - 1);
                self.allocated += 1;
                return start + i;
            }
        }
        panic!("test image full");
    }

    /// Write the inode, bitmaps, descriptors and superblock counts.
    fn finish(mut self) {
        let bs = self.bs();
        let n = self.pblks.len() as u64;
        // Extents (contiguous runs), at most 4 in the inode.
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for (l, &pb) in self.pblks.iter().enumerate() {
            match runs.last_mut() {
                Some((rl, rp, len))
                    if *rp + *len == pb && *rl + *len == l as u64 && *len < 32768 =>
                {
                    *len += 1
                }
                _ => runs.push((l as u64, pb, 1)),
            }
        }
        assert!(
            runs.len() <= 4,
            "test allocator fragmented the directory: {runs:?}"
        );
        let s = &mut self.slot;
        let size = n * bs;
        s[0x04..0x08].copy_from_slice(&(size as u32).to_le_bytes());
        s[0x6C..0x70].copy_from_slice(&((size >> 32) as u32).to_le_bytes());
        let b512 = n * bs / 512;
        s[0x1C..0x20].copy_from_slice(&(b512 as u32).to_le_bytes());
        s[0x74..0x76].copy_from_slice(&((b512 >> 32) as u16).to_le_bytes());
        let mut flags = u32::from_le_bytes(s[0x20..0x24].try_into().unwrap());
        if self.indexed {
            flags |= 0x1000;
        }
        s[0x20..0x24].copy_from_slice(&flags.to_le_bytes());
        let ib = &mut s[0x28..0x64];
        ib.fill(0);
        ib[0..2].copy_from_slice(&0xF30Au16.to_le_bytes());
        ib[2..4].copy_from_slice(&(runs.len() as u16).to_le_bytes());
        ib[4..6].copy_from_slice(&4u16.to_le_bytes());
        for (k, &(l, p, len)) in runs.iter().enumerate() {
            let e = &mut ib[12 + 12 * k..24 + 12 * k];
            e[0..4].copy_from_slice(&(l as u32).to_le_bytes());
            e[4..6].copy_from_slice(&(len as u16).to_le_bytes());
            e[6..8].copy_from_slice(&((p >> 32) as u16).to_le_bytes());
            e[8..12].copy_from_slice(&(p as u32).to_le_bytes());
        }
        write_inode(
            &self.file,
            &self.info,
            self.slot_off,
            &mut self.slot,
            self.p.ino,
        );
        let csum = self.info.csum;
        let ds = usize::from(self.info.desc_size);
        let bpg = self.info.blocks_per_group as usize;
        let dpb = self.info.descs_per_block();
        for (&g, bm) in &self.bitmaps {
            let at = self.info.desc_block(g / dpb) * bs + u64::from(g % dpb) * ds as u64;
            let d = &mut self.descs[g as usize];
            self.file.write_all_at(bm, d.block_bitmap() * bs).unwrap();
            if csum.metadata {
                d.set_block_bitmap_csum(csum.bitmap(&bm[..bpg / 8]));
            }
            d.update_checksum(&csum, g, ds);
            self.file.write_all_at(d.on_disk(ds), at).unwrap();
        }
        let mut sb = vec![0u8; 1024];
        self.file.read_exact_at(&mut sb, 1024).unwrap();
        let lo = u32::from_le_bytes(sb[0x0C..0x10].try_into().unwrap());
        let hi = u32::from_le_bytes(sb[0x158..0x15C].try_into().unwrap());
        let free = (u64::from(lo) | (u64::from(hi) << 32)) - self.allocated;
        sb[0x0C..0x10].copy_from_slice(&(free as u32).to_le_bytes());
        if self.info.desc_size >= 64 {
            sb[0x158..0x15C].copy_from_slice(&((free >> 32) as u32).to_le_bytes());
        }
        if csum.metadata {
            let c = ext4kit_format::checksum::crc32c_raw(!0, &sb[..1020]);
            sb[1020..].copy_from_slice(&c.to_le_bytes());
        }
        self.file.write_all_at(&sb, 1024).unwrap();
    }
}

fn write_inode(file: &std::fs::File, info: &FsInfo, off: u64, slot: &mut [u8], ino: u32) {
    let csum: Csum = info.csum;
    if csum.metadata {
        ext4kit_format::inode::set_checksum(slot, ino, &csum);
    }
    file.write_all_at(slot, off).unwrap();
}

/// Add `delta` to the link count of inode `ino`.
fn add_links(img: &Path, ino: u32, delta: i64) {
    let dev = FileDevice::open(img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let inode = vol.fs().inode(ino).unwrap();
    let mut slot = inode.raw.clone();
    let links = i64::from(u16::from_le_bytes([slot[0x1A], slot[0x1B]])) + delta;
    assert!((1..65000).contains(&links), "links {links}");
    slot[0x1A..0x1C].copy_from_slice(&(links as u16).to_le_bytes());
    let off = inode_slot_off(&vol.fs(), ino);
    let file = std::fs::OpenOptions::new().write(true).open(img).unwrap();
    write_inode(&file, &vol.info, off, &mut slot, ino);
}

impl DirBlocks for ImageDir {
    fn params(&self) -> DirParams {
        self.p
    }
    fn block_size(&self) -> u32 {
        self.info.block_size
    }
    fn nblocks(&self) -> u32 {
        self.pblks.len() as u32
    }
    fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
        let mut b = vec![0u8; self.info.block_size as usize];
        self.file
            .read_exact_at(&mut b, self.pblks[lblk as usize] * self.bs())
            .map_err(|e| FsError::Unsupported(e.to_string()))?;
        Ok(b)
    }
    fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
        self.file
            .write_all_at(data, self.pblks[lblk as usize] * self.bs())
            .map_err(|e| FsError::Unsupported(e.to_string()))
    }
    fn append(&mut self) -> Result<u32, FsError> {
        let pb = self.alloc();
        let zero = vec![0u8; self.info.block_size as usize];
        self.file
            .write_all_at(&zero, pb * self.bs())
            .map_err(|e| FsError::Unsupported(e.to_string()))?;
        self.pblks.push(pb);
        Ok(self.pblks.len() as u32 - 1)
    }
    fn indexed(&self) -> bool {
        self.indexed
    }
    fn set_indexed(&mut self) -> Result<(), FsError> {
        self.indexed = true;
        Ok(())
    }
}

/// An image with directory `/d` and `targets` empty regular files
/// `/t0`... (returned with their inode numbers).
fn image(
    dir: &Path,
    name: &str,
    mkfs: &[&str],
    size: &str,
    ssv: &[&str],
    targets: usize,
) -> (PathBuf, Vec<u32>) {
    let img = dir.join(format!("{name}.img"));
    run_ok(mke2fs(["-q", "-F"]).args(mkfs).arg(&img).arg(size)).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let mut cmds = String::from("mkdir d\n");
    for s in ssv {
        cmds.push_str(&format!("ssv {s}\n"));
    }
    for t in 0..targets {
        cmds.push_str(&format!("write {} t{t}\n", empty.display()));
    }
    let f = dir.join(format!("{name}.cmds"));
    std::fs::write(&f, cmds).unwrap();
    run_ok(tool("debugfs").arg("-w").arg("-f").arg(&f).arg(&img)).unwrap();
    let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let inos = (0..targets)
        .map(|t| {
            vol.fs()
                .resolve(format!("/t{t}").as_bytes(), false)
                .unwrap()
                .ino
        })
        .collect();
    (img, inos)
}

/// Every check: e2fsck clean, the read side and debugfs list exactly
/// `model`, every name found by lookup.
fn verify(img: &Path, model: &BTreeMap<Vec<u8>, u32>, indexed: bool) {
    verify_sampled(img, model, indexed, 1)
}

/// [`verify`], looking up only every `step`-th name.
fn verify_sampled(img: &Path, model: &BTreeMap<Vec<u8>, u32>, indexed: bool, step: usize) {
    e2fsck_clean(img).unwrap();
    let dev = FileDevice::open(img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let d = fs.resolve(b"/d", false).unwrap();
    assert_eq!(d.is_htree(), indexed, "indexed?");
    let csum = vol.info.csum.metadata;
    let mut got: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for e in fs.read_dir(&d).unwrap() {
        if e.name != b"." && e.name != b".." {
            assert_eq!(e.file_type, FT_REG_FILE);
            assert!(got.insert(e.name, e.ino).is_none(), "a name twice");
        }
    }
    same(&got, model, "read_dir");
    for (n, &ino) in model.iter().step_by(step) {
        assert_eq!(fs.lookup(&d, n).unwrap().map(|e| e.ino), Some(ino));
    }
    // debugfs: `ls -p` lines are "/ino/mode/uid/gid/name/size/" (names
    // as raw bytes).
    let out = run_ok(tool("debugfs").arg("-R").arg("ls -p /d").arg(img)).unwrap();
    let mut ls: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
    for l in out.stdout.split(|&b| b == b'\n') {
        let f: Vec<&[u8]> = l.split(|&b| b == b'/').collect();
        if f.len() < 7 || f[5] == b"." || f[5] == b".." {
            continue;
        }
        let ino: u32 = String::from_utf8_lossy(f[1]).parse().unwrap_or(0);
        if ino != 0 {
            ls.insert(f[5].to_vec(), ino);
        }
    }
    same(&ls, model, "debugfs ls");
    if indexed {
        let out = run_ok(tool("debugfs").arg("-R").arg("htree_dump /d").arg(img)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let errs = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains("Root node dump:"), "{text}");
        // debugfs 1.47.0 says "does not have space for checksum" on every
        // htree root without metadata_csum (e2fsck -D's too): only a
        // checksummed filesystem must dump without complaint.
        if csum {
            assert!(!errs.to_lowercase().contains("checksum"), "{errs}");
        }
    }
}

/// Two name maps are equal (else name the first difference).
fn same(got: &BTreeMap<Vec<u8>, u32>, want: &BTreeMap<Vec<u8>, u32>, what: &str) {
    if got == want {
        return;
    }
    let extra = got.iter().find(|(k, v)| want.get(*k) != Some(v));
    let missing = want.iter().find(|(k, v)| got.get(*k) != Some(v));
    let show =
        |e: Option<(&Vec<u8>, &u32)>| e.map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), *v));
    panic!(
        "{what}: {} names, want {}; first extra {:?}, first missing {:?}",
        got.len(),
        want.len(),
        show(extra),
        show(missing)
    );
}

fn name(i: u32, len: usize) -> Vec<u8> {
    let mut n = format!("n{i}-").into_bytes();
    let mut x = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    while n.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Printable, no '/', some bytes >= 0x80 (signed/unsigned hashes
        // differ there); debugfs prints them as they are.
        let b = b'a' + (x % 26) as u8;
        n.push(if x % 7 == 0 { b | 0x80 } else { b });
    }
    n
}

/// Add `names` (spread over the targets), check, and return the model.
fn fill(
    img: &Path,
    targets: &[u32],
    names: impl Iterator<Item = Vec<u8>>,
) -> BTreeMap<Vec<u8>, u32> {
    let mut d = ImageDir::open(img, b"/d");
    let mut model = BTreeMap::new();
    let mut refs = vec![0i64; targets.len()];
    {
        let mut w = DirWriter::new(&mut d);
        for (i, n) in names.enumerate() {
            let t = i % targets.len();
            w.add(&n, targets[t], FT_REG_FILE).unwrap();
            refs[t] += 1;
            model.insert(n, targets[t]);
        }
    }
    d.finish();
    for (t, r) in targets.iter().zip(refs) {
        add_links(img, *t, r);
    }
    model
}

fn need_tools(what: &str) -> bool {
    for t in ["mke2fs", "e2fsck", "debugfs"] {
        if !have(t) {
            skip(what, &format!("{t} not found"));
            return false;
        }
    }
    true
}

/// (name, mke2fs args, debugfs `ssv` settings, names, name length, htree?)
type Config<'a> = (&'a str, &'a [&'a str], &'a [&'a str], u32, usize, bool);

#[test]
fn linear_and_htree_on_images() {
    if !need_tools("linear_and_htree_on_images") {
        return;
    }
    let dir = image_dir();
    let configs: &[Config] = &[
        (
            "4k-csum-signed",
            &["-t", "ext4", "-b", "4096"],
            &[],
            2000,
            24,
            true,
        ),
        (
            "1k-nocsum-unsigned-tea",
            &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
            &[
                "flags 2",
                "def_hash_version tea",
                "hash_seed 01234567-89ab-cdef-0123-456789abcdef",
            ],
            1500,
            40,
            true,
        ),
        (
            "1k-csum-unsigned-legacy",
            &["-t", "ext4", "-b", "1024"],
            &["flags 2", "def_hash_version legacy"],
            1500,
            60,
            true,
        ),
        (
            "4k-csum-halfmd4-signed-zero-seed",
            &["-t", "ext4", "-b", "4096"],
            &["flags 1", "def_hash_version half_md4", "hash_seed null"],
            1200,
            100,
            true,
        ),
        (
            "4k-no-dir-index",
            &["-t", "ext4", "-b", "4096", "-O", "^dir_index"],
            &[],
            400,
            30,
            false,
        ),
        ("1k-few", &["-t", "ext4", "-b", "1024"], &[], 20, 10, false),
    ];
    for &(cfg, mkfs, ssv, n, len, htree) in configs {
        let (img, targets) = image(dir.path(), cfg, mkfs, "32M", ssv, 3);
        let model = fill(&img, &targets, (0..n).map(|i| name(i, len)));
        eprintln!("{cfg}: {} names", model.len());
        if std::env::var_os("DIRW_KEEP").is_some() {
            let _ = std::fs::copy(&img, format!("/tmp/dirw-{cfg}.img"));
        }
        verify(&img, &model, htree);
    }
}

#[test]
fn insert_remove_sequences_match_a_model() {
    if !need_tools("insert_remove_sequences_match_a_model") {
        return;
    }
    let dir = image_dir();
    for (seed, (bs, csum)) in [
        (1u64, ("1024", true)),
        (2, ("4096", false)),
        (3, ("1024", false)),
        (4, ("4096", true)),
    ] {
        let mkfs: Vec<&str> = if csum {
            vec!["-t", "ext4", "-b", bs]
        } else {
            vec!["-t", "ext4", "-b", bs, "-O", "^metadata_csum"]
        };
        let cfg = format!("model-{seed}");
        let (img, targets) = image(dir.path(), &cfg, &mkfs, "16M", &[], 2);
        let mut d = ImageDir::open(&img, b"/d");
        let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
        let mut refs = [0i64; 2];
        let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        {
            let mut w = DirWriter::new(&mut d);
            for _ in 0..3000 {
                let k = rnd(900) as u32;
                let n = name(k, 5 + (k as usize * 7) % 70);
                let t = (k % 2) as usize;
                if rnd(3) != 0 {
                    let r = w.add(&n, targets[t], FT_REG_FILE);
                    if let std::collections::btree_map::Entry::Vacant(v) = model.entry(n) {
                        r.unwrap();
                        v.insert(targets[t]);
                        refs[t] += 1;
                    } else {
                        assert!(matches!(r, Err(FsError::Exists)), "{r:?}");
                    }
                } else {
                    let r = w.remove(&n);
                    if model.remove(&n).is_some() {
                        assert_eq!(r.unwrap().ino, targets[t]);
                        refs[t] -= 1;
                    } else {
                        assert!(matches!(r, Err(FsError::NotFound)), "{r:?}");
                    }
                }
            }
        }
        let indexed = d.indexed;
        d.finish();
        for (t, r) in targets.iter().zip(refs) {
            add_links(&img, *t, r);
        }
        verify(&img, &model, indexed);
    }
}

#[test]
fn hundred_thousand_entries() {
    if !need_tools("hundred_thousand_entries") {
        return;
    }
    let dir = image_dir();
    let (img, targets) = image(
        dir.path(),
        "100k",
        &["-t", "ext4", "-b", "4096"],
        "64M",
        &[],
        4,
    );
    let t0 = std::time::Instant::now();
    let model = fill(&img, &targets, (0..100_000).map(|i| name(i, 16)));
    let took = t0.elapsed();
    verify_sampled(&img, &model, true, 101);
    let out = run_ok(tool("debugfs").arg("-R").arg("htree_dump /d").arg(&img)).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Indirect levels: 1"),
        "two index levels expected"
    );
    eprintln!("100 000 entries added in {took:?}");
}

/// The records of a leaf block as (offset, inode, rec_len, name) with the
/// name only for live entries; or an index block's count/limit/entries.
fn layout(b: &[u8], lblk: u32, indexed: bool, csum: bool) -> Vec<(usize, u32, usize, Vec<u8>)> {
    let bs = b.len();
    let g16 = |o: usize| usize::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let g32 = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let index_at = if indexed && lblk == 0 {
        Some(0x18 + usize::from(b[0x1D]))
    } else if indexed && g32(0) == 0 && g16(4) == bs && b[6] == 0 && g16(8) != 0 {
        Some(8)
    } else {
        None
    };
    let mut out = Vec::new();
    if let Some(off) = index_at {
        if lblk == 0 {
            out.push((0, g32(0), g16(4), b[8..9].to_vec()));
            out.push((12, g32(12), g16(16), b[0x18..0x20].to_vec()));
        }
        let count = g16(off + 2);
        out.push((off, count as u32, g16(off), Vec::new()));
        for i in 1..count {
            out.push((
                i,
                g32(off + 8 * i),
                g32(off + 8 * i + 4) as usize,
                Vec::new(),
            ));
        }
        out.push((0, g32(off + 4), 0, Vec::new()));
        return out;
    }
    let end = if csum { bs - 12 } else { bs };
    let mut o = 0;
    while o < end {
        let (ino, rl, nl) = (g32(o), g16(o + 4), usize::from(b[o + 6]));
        let name = if ino != 0 {
            b[o + 8..o + 8 + nl].to_vec()
        } else {
            Vec::new()
        };
        out.push((o, ino, rl, name));
        if rl == 0 {
            break;
        }
        o += rl;
    }
    out
}

/// The same sequence of creates and unlinks done by the kernel (on a loop
/// mount) and by `DirWriter` (on a copy of the image before the kernel
/// ran) gives the same directory, block by block: the same records at the
/// same offsets with the same rec_len, the same dx_root and index entries.
#[test]
fn same_layout_as_the_kernel() {
    let why = (|| {
        if !need_tools("same_layout_as_the_kernel") {
            return Err("e2fsprogs missing".to_string());
        }
        kernel_mount_available()
    })();
    if let Err(why) = why {
        return skip("same_layout_as_the_kernel", &why);
    }
    let dir = image_dir();
    let configs: &[(&str, &[&str], &[&str])] = &[
        ("k4-csum", &["-t", "ext4", "-b", "4096"], &[]),
        (
            "k1-csum-unsigned",
            &["-t", "ext4", "-b", "1024"],
            &["flags 2"],
        ),
        (
            "k1-nocsum-tea",
            &["-t", "ext4", "-b", "1024", "-O", "^metadata_csum"],
            &["def_hash_version tea"],
        ),
    ];
    for &(cfg, mkfs, ssv) in configs {
        // 1 KiB blocks: enough names for a second index level (and splits
        // of index nodes).
        let (n, levels) = if mkfs.contains(&"1024") {
            (5000u32, 2)
        } else {
            (1500, 1)
        };
        let nm = |i: u32| name(i, 10 + (i as usize % 50));
        let mut ops: Vec<(bool, Vec<u8>)> = (0..n).map(|i| (true, nm(i))).collect();
        ops.extend((0..n).step_by(4).map(|i| (false, nm(i))));
        ops.extend((n..n + 300).map(|i| (true, nm(i))));
        kernel_compare(dir.path(), cfg, mkfs, ssv, &ops, levels);
    }
}

/// large_dir: a third index level, laid out as the kernel does (1 KiB
/// blocks and 255-byte names: 2 to 3 names per leaf).
#[test]
fn third_level_same_as_the_kernel() {
    let why = (|| {
        if !need_tools("third_level_same_as_the_kernel") {
            return Err("e2fsprogs missing".to_string());
        }
        kernel_mount_available()
    })();
    if let Err(why) = why {
        return skip("third_level_same_as_the_kernel", &why);
    }
    let dir = image_dir();
    let ops: Vec<(bool, Vec<u8>)> = (0..32_000).map(|i| (true, name(i, 255))).collect();
    kernel_compare(
        dir.path(),
        "k1-largedir",
        &[
            "-t",
            "ext4",
            "-b",
            "1024",
            "-O",
            "large_dir,^metadata_csum",
            "-N",
            "40000",
        ],
        &[],
        &ops,
        3,
    );
}

/// Run `ops` (create or unlink, by name) through the kernel on a loop
/// mount and through `DirWriter` on a copy of the image made before, and
/// compare the directories block by block.
fn kernel_compare(
    dir: &Path,
    cfg: &str,
    mkfs: &[&str],
    ssv: &[&str],
    ops: &[(bool, Vec<u8>)],
    want_levels: usize,
) {
    let (img, _) = image(dir, cfg, mkfs, "64M", ssv, 0);
    let copy = dir.join(format!("{cfg}-ours.img"));
    std::fs::copy(&img, &copy).unwrap();
    // The kernel first.
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let d = m.path().join("d");
        for (add, nm) in ops {
            let p = d.join(std::ffi::OsStr::from_bytes(nm));
            if *add {
                std::fs::File::create(&p).unwrap();
            } else {
                std::fs::remove_file(&p).unwrap();
            }
        }
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    // The kernel's inode numbers, by name.
    let dev = FileDevice::open(&img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let kd = fs.resolve(b"/d", false).unwrap();
    let inos: BTreeMap<Vec<u8>, u32> = fs
        .read_dir(&kd)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.ino))
        .collect();
    let kernel = ImageDir::open(&img, b"/d");
    let mut ours = ImageDir::open(&copy, b"/d");
    {
        let mut w = DirWriter::new(&mut ours);
        for (add, nm) in ops {
            if *add {
                let ino = inos.get(nm).copied().unwrap_or(11);
                w.add(nm, ino, FT_REG_FILE).unwrap();
            } else {
                w.remove(nm).unwrap();
            }
        }
    }
    assert_eq!(ours.indexed, kernel.indexed, "{cfg}: indexed");
    assert_eq!(ours.nblocks(), kernel.nblocks(), "{cfg}: blocks");
    let csum = vol.info.csum.metadata;
    for l in 0..kernel.nblocks() {
        let k = layout(&kernel.read(l).unwrap(), l, kernel.indexed, csum);
        let o = layout(&ours.read(l).unwrap(), l, ours.indexed, csum);
        if k != o {
            let i = k
                .iter()
                .zip(&o)
                .position(|(a, b)| a != b)
                .unwrap_or(k.len().min(o.len()));
            panic!(
                "{cfg}: block {l} differs at record {i}: kernel {:?}, ours {:?}",
                k.get(i),
                o.get(i)
            );
        }
    }
    let levels = if kernel.indexed {
        kernel.read(0).unwrap()[0x1E]
    } else {
        0
    };
    eprintln!(
        "{cfg}: {} blocks identical in layout, {} index levels",
        kernel.nblocks(),
        levels + 1
    );
    assert_eq!(usize::from(levels) + 1, want_levels, "{cfg}: index levels");
}
