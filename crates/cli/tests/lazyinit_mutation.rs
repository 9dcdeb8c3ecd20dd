//! Mutation campaign: lazy init must never destroy data, even when a
//! corrupted superblock or descriptor carries a valid checksum.
//!
//! Real images (mke2fs- and ext4kit-made, 4 KiB and 1 KiB blocks,
//! `metadata_csum` and `uninit_bg`, and 1 KiB meta_bg ones with two meta
//! groups, whose descriptors are mutated where they are, and 1 KiB
//! bigalloc ones with 4 KiB clusters) get files and directories (debugfs),
//! then fields of their superblock and descriptors are changed, in part with
//! every checksum recomputed (as a buggy tool, or a bit flip followed by a
//! checksum repair, would leave them), and `ext4kit lazyinit` runs on each.
//! Either it refuses and nothing is written, or every block that held data
//! or metadata before (all blocks in use in the original image's bitmaps,
//! except the inode-table tails lazy init may zero) is unchanged, the
//! primary descriptors changed in their flags and checksums only, and
//! `e2fsck -fn` is no worse than before.
//!
//! `EXT4KIT_MUTANTS=N` sets the number of mutants per base image (default 6:
//! seconds); `EXT4KIT_MUTATION_SEED` the seed.

mod common;

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::dumpe2fs::{self, DumpGroup as Group, dumpe2fs, field};
use common::{ext4kit, ext4kit_mkfs, have, image_dir, mke2fs, run, run_ok, skip, tool};
use ext4kit_format::Csum;
use ext4kit_format::superblock::Superblock;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// One group of the original image, from dumpe2fs.
/// What the original image looks like (dumpe2fs, not our parser).
#[derive(Clone, Debug)]
struct Base {
    name: String,
    path: PathBuf,
    bs: u64,
    ipg: u64,
    inode_size: u64,
    itb: u64,
    desc_size: usize,
    /// Every primary descriptor block (with meta_bg not contiguous).
    gdt: Vec<u64>,
    groups: Vec<Group>,
    /// Blocks holding data or metadata that lazy init must never change
    /// (half-open ranges, sorted), the primary descriptor blocks excluded.
    protected: Vec<(u64, u64)>,
    /// A few protected blocks to point descriptors at.
    targets: Vec<u64>,
    /// The backup of each primary descriptor block that lazy init
    /// compares with: in the first backup group's table, or with meta_bg
    /// in the second group of the block's meta group.
    backup_gdt: Vec<Option<u64>>,
}

impl Base {
    fn dpb(&self) -> usize {
        self.bs as usize / self.desc_size
    }

    /// Byte offset of group `g`'s descriptor in the copy whose blocks are
    /// `blocks` (by descriptor block index).
    fn desc_at(&self, blocks: &[u64], g: usize) -> usize {
        blocks[g / self.dpb()] as usize * self.bs as usize + (g % self.dpb()) * self.desc_size
    }

    /// Byte offset of group `g`'s primary descriptor.
    fn desc(&self, g: usize) -> usize {
        self.desc_at(&self.gdt, g)
    }

    /// Byte offset of group `g`'s backup descriptor, if it has one.
    fn backup_desc(&self, g: usize) -> Option<usize> {
        let b = self.backup_gdt.get(g / self.dpb()).copied().flatten()?;
        Some(b as usize * self.bs as usize + (g % self.dpb()) * self.desc_size)
    }
}

fn parse_base(name: &str, path: &Path) -> Result<Base, String> {
    let text = dumpe2fs(path)?;
    let num = |k: &str| -> Result<u64, String> {
        field(&text, k)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("dumpe2fs: no {k}"))
    };
    let bs = num("Block size")?;
    let blocks = num("Block count")?;
    let ipg = num("Inodes per group")?;
    let inode_size = num("Inode size")?;
    let itb = num("Inode blocks per group")?;
    let features = field(&text, "Filesystem features")
        .unwrap_or("")
        .to_string();
    let desc_size = if features.contains("64bit") {
        num("Group descriptor size")? as usize
    } else {
        32
    };
    let dpb = bs / desc_size as u64;
    let groups = dumpe2fs::groups(&text);
    // The contiguous table (absent with meta_bg and s_first_meta_bg 0),
    // then the meta groups' blocks (in the first group of each meta
    // group); the backups lazy init compares with: the first backup
    // superblock's table, and meta_bg's block in a meta group's second
    // group.
    let table = dumpe2fs::primary_desc_blocks(&groups, dpb);
    let backup_gdt = groups
        .iter()
        .filter(|g| g.backup_sb)
        .find_map(|g| g.gdt)
        .map(|r| r.0);
    let old = groups
        .iter()
        .find(|g| g.primary_sb)
        .and_then(|g| g.gdt)
        .map_or(0, |(a, b)| b + 1 - a);
    let mut backups: Vec<Option<u64>> = (0..old).map(|i| backup_gdt.map(|b| b + i)).collect();
    for k in 0..(table.len() as u64 - old) {
        let index = old + k;
        backups.push(groups.get((index * dpb + 1) as usize).and_then(|g| g.desc));
    }
    if table.is_empty() {
        return Err("dumpe2fs: no primary descriptors".into());
    }
    let mut base = Base {
        name: name.to_string(),
        path: path.to_path_buf(),
        bs,
        ipg,
        inode_size,
        itb,
        desc_size,
        gdt: table,
        groups,
        protected: Vec::new(),
        targets: Vec::new(),
        backup_gdt: backups,
    };
    // Protected = everything minus free blocks, minus zeroable tails, minus
    // the primary descriptor blocks (compared field by field instead).
    let mut holes: Vec<(u64, u64)> = Vec::new();
    let ipb = bs / inode_size;
    for g in &base.groups {
        holes.extend(g.free_blocks.iter().copied());
        if !g.zeroed {
            let used = if g.inode_uninit {
                0
            } else {
                (ipg - g.unused).div_ceil(ipb)
            };
            holes.push((g.itable + used, g.itable + itb));
        }
    }
    holes.extend(base.gdt.iter().map(|&b| (b, b + 1)));
    holes.sort_unstable();
    let mut pos = 0;
    for (s, e) in holes {
        if s > pos {
            base.protected.push((pos, s));
        }
        pos = pos.max(e);
    }
    if pos < blocks {
        base.protected.push((pos, blocks));
    }
    let total: u64 = base.protected.iter().map(|(s, e)| e - s).sum();
    let mut rng = Rng(total);
    for _ in 0..16 {
        let mut k = rng.below(total);
        for &(s, e) in &base.protected {
            if k < e - s {
                base.targets.push(s + k);
                break;
            }
            k -= e - s;
        }
    }
    Ok(base)
}

/// Make, populate and describe one base image.
fn make_base(dir: &Path, maker: &str, bs: u32, csum: &str) -> Result<Base, String> {
    let name = format!("{maker}-{bs}-{csum}");
    let meta_bg = csum == "meta_bg";
    let bigalloc = csum == "bigalloc";
    let path = dir.join(format!("{name}.img"));
    let size: u64 = 32 << 20;
    File::create(&path)
        .and_then(|f| f.set_len(size))
        .map_err(|e| e.to_string())?;
    let feats = if meta_bg {
        "metadata_csum,^uninit_bg,meta_bg,^resize_inode"
    } else if bigalloc {
        "metadata_csum,^uninit_bg,bigalloc"
    } else if csum == "metadata_csum" {
        "metadata_csum,^uninit_bg"
    } else {
        "^metadata_csum,uninit_bg"
    };
    // Small groups, so that there are several groups of each kind (with
    // meta_bg 32 groups of 1 MiB: two meta groups of 16).
    let bpg = if meta_bg || bigalloc {
        // bigalloc: clusters per group (4 KiB clusters: 4 MiB groups).
        "1024"
    } else if bs == 4096 {
        "2048"
    } else {
        "4096"
    };
    let bs_s = bs.to_string();
    let mut args = vec![
        "-q",
        "-F",
        "-t",
        "ext4",
        "-b",
        bs_s.as_str(),
        "-g",
        bpg,
        "-O",
        feats,
        "-E",
        "lazy_itable_init=1,nodiscard",
    ];
    if bigalloc {
        args.extend(["-C", "4096"]);
    }
    args.push(path.to_str().ok_or("path")?);
    let mut cmd = if maker == "mke2fs" {
        mke2fs(&args)
    } else {
        ext4kit_mkfs(&args)
    };
    run_ok(&mut cmd)?;
    // Files and directories, so that there is data to destroy.
    let payload = dir.join("payload");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8 + 1).collect();
    fs::write(&payload, &data).map_err(|e| e.to_string())?;
    let p = payload.to_str().ok_or("path")?;
    let mut cmds = vec!["mkdir d1".to_string(), "mkdir d1/d2".to_string()];
    for i in 0..6 {
        cmds.push(format!("write {p} d1/f{i}"));
    }
    cmds.push(format!("write {p} d1/d2/g"));
    let script = dir.join(format!("{name}.debugfs"));
    fs::write(&script, cmds.join("\n") + "\n").map_err(|e| e.to_string())?;
    run_ok(tool("debugfs").arg("-w").arg("-f").arg(&script).arg(&path))?;
    common::e2fsck_clean(&path)?;
    let mut base = parse_base(&name, &path)?;
    // Directory and file blocks as targets too: a table pointed at them
    // must be refused even when both descriptor copies agree.
    for f in ["/", "d1", "d1/d2", "d1/f0", "d1/f3", "d1/d2/g", "<8>"] {
        let out = run(tool("debugfs")
            .args(["-R", &format!("blocks {f}")])
            .arg(&path))?;
        let blocks: Vec<u64> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        base.targets.extend(blocks.iter().take(3));
    }
    // Random bytes in the zeroable tails, as on a reused disk.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| e.to_string())?;
    let mut rng = Rng(bs.into());
    let ipb = base.bs / base.inode_size;
    for g in base.groups.iter().filter(|g| !g.zeroed) {
        let used = if g.inode_uninit {
            0
        } else {
            (base.ipg - g.unused).div_ceil(ipb)
        };
        let (s, e) = (g.itable + used, g.itable + base.itb);
        let mut buf = vec![0u8; ((e - s) * base.bs) as usize];
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&rng.next().to_le_bytes()[..c.len()]);
        }
        f.write_all_at(&buf, s * base.bs)
            .map_err(|e| e.to_string())?;
    }
    Ok(base)
}

/// Superblock fields: (name, offset, size).
const SB_FIELDS: &[(&str, usize, usize)] = &[
    ("inodes_count", 0x00, 4),
    ("blocks_count_lo", 0x04, 4),
    ("free_blocks_lo", 0x0C, 4),
    ("free_inodes", 0x10, 4),
    ("first_data_block", 0x14, 4),
    ("log_block_size", 0x18, 4),
    ("log_cluster_size", 0x1C, 4),
    ("blocks_per_group", 0x20, 4),
    ("clusters_per_group", 0x24, 4),
    ("inodes_per_group", 0x28, 4),
    ("state", 0x3A, 2),
    ("rev_level", 0x4C, 4),
    ("first_ino", 0x54, 4),
    ("inode_size", 0x58, 2),
    ("feature_compat", 0x5C, 4),
    ("feature_incompat", 0x60, 4),
    ("feature_ro_compat", 0x64, 4),
    ("reserved_gdt_blocks", 0xCE, 2),
    ("journal_inum", 0xE0, 4),
    ("desc_size", 0xFE, 2),
    ("blocks_count_hi", 0x150, 4),
    ("min_extra_isize", 0x15C, 2),
    ("want_extra_isize", 0x15E, 2),
    ("log_groups_per_flex", 0x174, 1),
    ("backup_bgs", 0x24C, 4),
];

/// Descriptor fields: (name, offset, size).
const GD_FIELDS: &[(&str, usize, usize)] = &[
    ("block_bitmap", 0x00, 4),
    ("inode_bitmap", 0x04, 4),
    ("inode_table", 0x08, 4),
    ("free_blocks", 0x0C, 2),
    ("free_inodes", 0x0E, 2),
    ("used_dirs", 0x10, 2),
    ("flags", 0x12, 2),
    ("itable_unused", 0x1C, 2),
];

fn get(buf: &[u8], off: usize, size: usize) -> u64 {
    let mut v = 0u64;
    for i in 0..size {
        v |= u64::from(buf[off + i]) << (8 * i);
    }
    v
}

fn put(buf: &mut [u8], off: usize, size: usize, v: u64) {
    for i in 0..size {
        buf[off + i] = (v >> (8 * i)) as u8;
    }
}

fn new_value(rng: &mut Rng, old: u64, size: usize, base: &Base) -> u64 {
    let mask = if size == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * size)) - 1
    };
    let v = match rng.below(8) {
        0 => rng.next(),
        1 => old ^ (1 << rng.below(8 * size as u64)),
        2 => old.wrapping_add(1 + rng.below(16)),
        3 => old.wrapping_sub(1 + rng.below(16)),
        4 => 0,
        5 => base.targets[rng.below(base.targets.len() as u64) as usize],
        6 => old.wrapping_mul(2),
        _ => old / 2,
    };
    v & mask
}

/// Apply one mutation to `img` (a copy of the base). Returns a label.
fn mutate(img: &mut [u8], base: &Base, rng: &mut Rng) -> String {
    let sb_off = 1024usize;
    let ngroups = base.groups.len();
    let mut label = String::new();
    let fields = 1 + rng.below(3) as usize;
    for _ in 0..fields {
        let g = rng.below(ngroups as u64) as usize;
        let d = base.desc(g);
        match rng.below(10) {
            0..=2 => {
                let (name, off, size) = SB_FIELDS[rng.below(SB_FIELDS.len() as u64) as usize];
                let old = get(img, sb_off + off, size);
                let v = new_value(rng, old, size, base);
                put(img, sb_off + off, size, v);
                label += &format!("sb.{name}:{old}->{v} ");
            }
            3..=6 => {
                let (name, off, size) = GD_FIELDS[rng.below(GD_FIELDS.len() as u64) as usize];
                let old = get(img, d + off, size);
                let v = new_value(rng, old, size, base);
                put(img, d + off, size, v);
                label += &format!("g{g}.{name}:{old}->{v} ");
                // Sometimes the same lie in the backup table too, so that
                // the checks past the backup comparison are exercised.
                if let Some(b) = base.backup_desc(g)
                    && off <= 0x08
                    && rng.chance(30)
                {
                    put(img, b + off, size, v);
                    label += "(+backup) ";
                }
            }
            7 => {
                // Unused and free inodes raised together.
                let k = 1 + rng.below(64);
                let u = get(img, d + 0x1C, 2);
                let f = get(img, d + 0x0E, 2);
                put(img, d + 0x1C, 2, (u + k) & 0xFFFF);
                put(img, d + 0x0E, 2, (f + k) & 0xFFFF);
                label += &format!("g{g}.unused+free+={k} ");
            }
            8 => {
                // Claim INODE_UNINIT with every inode free.
                let fl = get(img, d + 0x12, 2) | 1;
                put(img, d + 0x12, 2, fl);
                put(img, d + 0x0E, 2, base.ipg);
                put(img, d + 0x1C, 2, base.ipg);
                label += &format!("g{g}.inode_uninit ");
            }
            _ => {
                // The inode table somewhere else, in both copies.
                let t = base.targets[rng.below(base.targets.len() as u64) as usize];
                put(img, d + 0x08, 4, t);
                if let Some(b) = base.backup_desc(g) {
                    put(img, b + 0x08, 4, t);
                }
                label += &format!("g{g}.inode_table=>{t}(both) ");
            }
        }
    }
    if rng.chance(50) {
        recompute_checksums(img, base);
        label += "[checksums recomputed]";
    }
    label
}

/// Recompute the superblock checksum and every primary and backup
/// descriptor checksum, as a "repair" would.
fn recompute_checksums(img: &mut [u8], base: &Base) {
    let Some(mut sb) = Superblock::parse(&img[1024..2048]) else {
        return;
    };
    if sb.s_feature_ro_compat.get() & 0x400 != 0 {
        sb.update_checksum();
        img[1024 + 0x3FC..1024 + 0x400].copy_from_slice(&sb.s_checksum.get().to_le_bytes());
    }
    let csum = Csum::from_superblock(&sb);
    let ds = base.desc_size;
    for g in 0..base.groups.len() {
        for off in std::iter::once(base.desc(g)).chain(base.backup_desc(g)) {
            let c = csum.group_desc(g as u32, &img[off..off + ds]);
            img[off + 0x1E..off + 0x20].copy_from_slice(&c.to_le_bytes());
        }
    }
}

fn read_ranges(img: &[u8], bs: u64, ranges: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(s, e) in ranges {
        out.extend_from_slice(&img[(s * bs) as usize..(e * bs) as usize]);
    }
    out
}

/// The primary descriptors without their flags and checksum fields.
fn gdt_fixed_fields(img: &[u8], base: &Base) -> Vec<u8> {
    let bs = base.bs as usize;
    let mut v = Vec::new();
    for &b in &base.gdt {
        v.extend_from_slice(&img[b as usize * bs..(b as usize + 1) * bs]);
    }
    for g in 0..base.groups.len() {
        // The descriptor's place in `v`: blocks in index order.
        let o = g * base.desc_size;
        v[o + 0x12..o + 0x14].fill(0);
        v[o + 0x1E..o + 0x20].fill(0);
    }
    v
}

fn fsck_code(path: &Path) -> i32 {
    run(tool("e2fsck").arg("-fn").arg(path))
        .ok()
        .and_then(|o| o.status.code())
        .unwrap_or(99)
}

#[derive(Default, Debug)]
struct Tally {
    mutants: u64,
    refused: u64,
    ran: u64,
    ran_fsck_dirty_before: u64,
    /// Refusals by kind of reason (numbers and names stripped).
    reasons: std::collections::BTreeMap<String, u64>,
}

/// The kind of a refusal: its message without the path, numbers and
/// quoted values, cut to a few words.
fn reason_kind(err: &str, path: &Path) -> String {
    let line = err.lines().next().unwrap_or("");
    let p = format!("{}: ", path.display());
    let msg = line.split_once(p.as_str()).map(|(_, m)| m).unwrap_or(line);
    let words: Vec<String> = msg
        .split_whitespace()
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .take(7)
        .map(str::to_string)
        .collect();
    words.join(" ")
}

fn campaign(base: &Base, n: u64, seed: u64, dir: &Path, tally: &mut Tally) -> Result<(), String> {
    let orig = fs::read(&base.path).map_err(|e| e.to_string())?;
    let mut rng = Rng(seed
        ^ base
            .name
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
    let mpath = dir.join(format!("{}.mut.img", base.name));
    for i in 0..n {
        let mut img = orig.clone();
        let label = mutate(&mut img, base, &mut rng);
        fs::write(&mpath, &img).map_err(|e| e.to_string())?;
        let fsck_before = fsck_code(&mpath);
        let out = run(ext4kit()
            .args(["lazyinit", "-q", "--mult", "0"])
            .arg(&mpath))?;
        let code = out.status.code().unwrap_or(-1);
        let after = fs::read(&mpath).map_err(|e| e.to_string())?;
        let what = format!("{} mutant {i} [{label}]", base.name);
        let err = String::from_utf8_lossy(&out.stderr);
        tally.mutants += 1;
        if code == 101 || err.contains("panicked") {
            return Err(format!("{what}: panic: {err}"));
        }
        if code != 0 {
            tally.refused += 1;
            *tally.reasons.entry(reason_kind(&err, &mpath)).or_default() += 1;
            if after != img {
                return Err(format!("{what}: refused (exit {code}) but wrote: {err}"));
            }
            if err.lines().count() > 2 {
                return Err(format!("{what}: more than one line per refusal: {err}"));
            }
            continue;
        }
        tally.ran += 1;
        if fsck_before != 0 {
            tally.ran_fsck_dirty_before += 1;
        }
        if read_ranges(&after, base.bs, &base.protected)
            != read_ranges(&img, base.bs, &base.protected)
        {
            // Find the first changed block for the message.
            let mut first = None;
            for &(s, e) in &base.protected {
                for b in s..e {
                    let r = (b * base.bs) as usize..((b + 1) * base.bs) as usize;
                    if after[r.clone()] != img[r] {
                        first = Some(b);
                        break;
                    }
                }
                if first.is_some() {
                    break;
                }
            }
            return Err(format!(
                "{what}: exit 0 but block {first:?}, which held data or metadata, changed"
            ));
        }
        if gdt_fixed_fields(&after, base) != gdt_fixed_fields(&img, base) {
            return Err(format!(
                "{what}: descriptor fields other than flags changed"
            ));
        }
        let fsck_after = fsck_code(&mpath);
        if fsck_after > fsck_before {
            return Err(format!(
                "{what}: e2fsck -fn got worse: exit {fsck_before} before, {fsck_after} after"
            ));
        }
    }
    Ok(())
}

#[test]
fn mutated_images_never_lose_data() {
    for t in ["mke2fs", "e2fsck", "dumpe2fs", "debugfs"] {
        if !have(t) {
            skip(
                "mutated_images_never_lose_data",
                &format!("{t} not installed"),
            );
            return;
        }
    }
    let n: u64 = std::env::var("EXT4KIT_MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let seed: u64 = std::env::var("EXT4KIT_MUTATION_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED);
    let dir = image_dir();
    let mut tally = Tally::default();
    for maker in ["mke2fs", "ext4kit"] {
        for bs in [4096u32, 1024] {
            for csum in ["metadata_csum", "uninit_bg", "meta_bg", "bigalloc"] {
                if matches!(csum, "meta_bg" | "bigalloc") && bs != 1024 {
                    continue;
                }
                let base = make_base(dir.path(), maker, bs, csum)
                    .unwrap_or_else(|e| panic!("{maker} {bs} {csum}: {e}"));
                assert!(
                    base.groups.iter().any(|g| !g.zeroed),
                    "{}: nothing left for lazy init",
                    base.name
                );
                // The unmutated image itself is zeroed without complaint.
                let clean = dir.path().join(format!("{}.clean.img", base.name));
                fs::copy(&base.path, &clean).unwrap();
                let out = run(ext4kit()
                    .args(["lazyinit", "-q", "--mult", "0"])
                    .arg(&clean))
                .unwrap();
                assert!(
                    out.status.success(),
                    "{}: {}",
                    base.name,
                    String::from_utf8_lossy(&out.stderr)
                );
                common::e2fsck_clean(&clean).unwrap();
                fs::remove_file(&clean).unwrap();
                if let Err(e) = campaign(&base, n, seed, dir.path(), &mut tally) {
                    panic!("{e}");
                }
                eprintln!(
                    "{}: done; so far {} mutants, {} refused, {} ran",
                    base.name, tally.mutants, tally.refused, tally.ran
                );
            }
        }
    }
    eprintln!(
        "mutation campaign: {} mutants, {} refused, {} ran ({} of them on images e2fsck already flagged)",
        tally.mutants, tally.refused, tally.ran, tally.ran_fsck_dirty_before
    );
    let mut kinds: Vec<_> = tally.reasons.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1));
    for (k, n) in kinds.iter().take(25) {
        eprintln!("  {n:6} {k}");
    }
}
