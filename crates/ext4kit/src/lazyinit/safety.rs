//! The cross-check run before lazy init writes anything.
//!
//! A valid checksum only proves that a descriptor was written as it is, not
//! that it is right: a buggy tool, or a bit flip followed by a checksum
//! repair, leaves a descriptor whose inode table points at the journal, or
//! whose unused-inodes count hides inodes in use. Zeroing what such a
//! descriptor says destroys data that e2fsck could still have saved. So,
//! before the first write, everything that decides what gets zeroed is
//! checked against an independent source:
//!
//! * **Backups.** The geometry fields of the primary superblock (block and
//!   cluster size, blocks and inodes per group, revision, inode size, first
//!   inode, reserved descriptor blocks, groups per flex) must equal those
//!   of the first backup superblock, and every group's bitmap and inode
//!   table locations must equal those in the first backup descriptor
//!   table. The kernel never changes either; mke2fs, e2fsck, tune2fs and
//!   resize2fs write all copies.
//! * **Layout.** Every group's superblock and descriptor copies, reserved
//!   descriptor blocks, bitmaps and inode table lie inside the filesystem
//!   (inside their own group without `flex_bg`) and overlap nothing else.
//! * **Block bitmaps.** Every such block is marked in use in the block
//!   bitmap of the group it lies in; for a `BLOCK_UNINIT` group, in the
//!   bitmap the kernel and libext2fs compute (its own superblock,
//!   descriptors and the group's own bitmaps and table only).
//! * **Special inodes.** The root inode is a directory (and, with
//!   `metadata_csum`, its checksum matches: a wrong inode size or table
//!   location shows there). The journal's and the resize inode's block
//!   maps are read and validated, and no inode table or bitmap overlaps
//!   them.
//! * **Inode bitmaps.** No inode at or past a group's `itable_unused`
//!   watermark is marked in use (groups without `INODE_UNINIT`, whose
//!   bitmap is meaningful).
//! * **A probe.** The first block of every range to zero that is not a
//!   proven hole is read: an inode there that is in use (with
//!   `metadata_csum`: its checksum matches; without: a live file type and
//!   link count, no deletion time, created after the filesystem) refuses.
//!
//! Anything that fails refuses the whole filesystem with one line naming
//! the group and the conflict. Memory is O(groups); the bitmaps read are
//! those of the groups that hold metadata (few with `flex_bg`) and of the
//! groups to zero.

use std::collections::HashMap;

use ext4kit_format::features::{Compat, Incompat};
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ext4kit_format::superblock::Superblock;

use super::plan::GroupWork;
use crate::image::{Geometry, Image, ImageError};

/// Inode numbers of the special inodes checked here.
const ROOT_INO: u32 = 2;
const RESIZE_INO: u32 = 7;
/// `i_flags` bit: the inode maps its blocks with an extent tree.
const EXTENTS_FL: u32 = 0x0008_0000;
/// `i_flags` bit: the data lives in the inode.
const INLINE_DATA_FL: u32 = 0x1000_0000;
const EXTENT_MAGIC: u16 = 0xF30A;
const S_IFMT: u16 = 0o170000;
const S_IFDIR: u16 = 0o040000;
const S_IFREG: u16 = 0o100000;

/// Why lazy init refuses to write: one line, naming the group when there
/// is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} (run e2fsck first)")]
pub struct Conflict(pub String);

fn conflict(msg: impl Into<String>) -> Conflict {
    Conflict(msg.into())
}

/// What a block range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Super,
    Gdt,
    ReservedGdt,
    BlockBitmap,
    InodeBitmap,
    InodeTable,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Super => "superblock",
            Kind::Gdt => "descriptor table",
            Kind::ReservedGdt => "reserved descriptor blocks",
            Kind::BlockBitmap => "block bitmap",
            Kind::InodeBitmap => "inode bitmap",
            Kind::InodeTable => "inode table",
        }
    }
}

/// One group's piece of metadata: blocks `start..end`.
#[derive(Clone, Copy, Debug)]
struct Extent {
    start: u64,
    end: u64,
    group: u32,
    kind: Kind,
}

impl Extent {
    fn describe(&self) -> String {
        format!(
            "group {}'s {} (blocks {}..{})",
            self.group,
            self.kind.name(),
            self.start,
            self.end
        )
    }
}

/// Does `group` hold a superblock backup (and descriptor copies)?
pub use ext4kit_format::layout::group_has_super;

/// Reads one block at a time, within a budget: a corrupt block map that
/// sends the check around in circles ends in a refusal, not in hours.
struct Reader<'a, 'd> {
    image: &'a Image<'d>,
    bs: usize,
    reads: std::cell::Cell<u64>,
    limit: u64,
}

impl<'a, 'd> Reader<'a, 'd> {
    fn new(image: &'a Image<'d>) -> Self {
        let g = image.geometry();
        // Bitmaps, backup descriptors, and map blocks of a full filesystem
        // (about one per 1024 data blocks) fit easily.
        let limit = (g.blocks_count / 64)
            .max(4 * u64::from(g.group_count) + u64::from(g.desc_blocks) + (1 << 16));
        Reader {
            image,
            bs: g.block_size as usize,
            reads: std::cell::Cell::new(0),
            limit,
        }
    }

    fn block(&self, b: u64) -> Result<Vec<u8>, ImageError> {
        let g = self.image.geometry();
        if b >= g.blocks_count {
            return Err(ImageError::Corrupt {
                what: "block map",
                detail: format!("block {b} is outside the filesystem"),
            });
        }
        self.reads.set(self.reads.get() + 1);
        if self.reads.get() > self.limit {
            return Err(ImageError::Corrupt {
                what: "block maps",
                detail: format!(
                    "more than {} metadata blocks to read for the cross-check (run e2fsck first)",
                    self.limit
                ),
            });
        }
        let mut buf = vec![0u8; self.bs];
        self.image.device().read_at(&mut buf, g.byte_offset(b))?;
        Ok(buf)
    }
}

/// Failure of the check: a conflict, or an I/O error while reading.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Conflict(#[from] Conflict),
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// Run every check. `pending` are the groups lazy init would zero.
pub fn check(image: &Image<'_>, pending: &[GroupWork]) -> Result<(), CheckError> {
    let sb = image.superblock();
    let rd = Reader::new(image);
    check_backups(image, &rd)?;
    let extents = layout(image)?;
    check_block_bitmaps(image, &rd, &extents)?;
    check_special_inodes(image, &rd, &extents)?;
    check_inode_bitmaps(image, &rd, pending)?;
    check_inode_maps(image, &rd, pending)?;
    probe_ranges(image, &rd, pending, sb)?;
    Ok(())
}

/// The first backup group, if the filesystem has one.
fn first_backup(sb: &Superblock, geom: &Geometry) -> Option<u32> {
    (1..geom.group_count.min(1 << 16)).find(|&g| group_has_super(sb, g))
}

fn group_start(geom: &Geometry, group: u32) -> u64 {
    geom.first_data_block + u64::from(group) * u64::from(geom.blocks_per_group)
}

fn group_end(geom: &Geometry, group: u32) -> u64 {
    (group_start(geom, group) + u64::from(geom.blocks_per_group)).min(geom.blocks_count)
}

fn group_of(geom: &Geometry, block: u64) -> u32 {
    ((block - geom.first_data_block) / u64::from(geom.blocks_per_group)) as u32
}

fn check_backups(image: &Image<'_>, rd: &Reader<'_, '_>) -> Result<(), CheckError> {
    let geom = image.geometry();
    let sb = image.superblock();
    let Some(bg) = first_backup(sb, geom) else {
        return Ok(());
    };
    let at = group_start(geom, bg);
    let raw = rd.block(at)?;
    let backup = Superblock::parse(&raw[..1024.min(raw.len())]).ok_or_else(|| {
        conflict(format!(
            "group {bg}: backup superblock at block {at} unreadable"
        ))
    })?;
    if backup.s_magic.get() != sb.s_magic.get() {
        return Err(conflict(format!(
            "group {bg}: no backup superblock at block {at} where the primary's geometry puts one (magic {:#06x})",
            backup.s_magic.get()
        ))
        .into());
    }
    let eff = |s: &Superblock| -> (u32, u32) {
        if s.s_rev_level.get() == 0 {
            (128, 11)
        } else {
            (u32::from(s.s_inode_size.get()), s.s_first_ino.get())
        }
    };
    let geo_incompat = Incompat::BIT64.bits() | Incompat::FLEX_BG.bits() | Incompat::META_BG.bits();
    let fields: [(&str, u64, u64); 12] = [
        (
            "log block size",
            sb.s_log_block_size.get().into(),
            backup.s_log_block_size.get().into(),
        ),
        (
            "log cluster size",
            sb.s_log_cluster_size.get().into(),
            backup.s_log_cluster_size.get().into(),
        ),
        (
            "blocks per group",
            sb.s_blocks_per_group.get().into(),
            backup.s_blocks_per_group.get().into(),
        ),
        (
            "clusters per group",
            sb.s_clusters_per_group.get().into(),
            backup.s_clusters_per_group.get().into(),
        ),
        (
            "inodes per group",
            sb.s_inodes_per_group.get().into(),
            backup.s_inodes_per_group.get().into(),
        ),
        ("inode size", eff(sb).0.into(), eff(&backup).0.into()),
        ("first inode", eff(sb).1.into(), eff(&backup).1.into()),
        (
            "first data block",
            sb.s_first_data_block.get().into(),
            backup.s_first_data_block.get().into(),
        ),
        (
            "descriptor size",
            sb.desc_size().into(),
            backup.desc_size().into(),
        ),
        (
            "reserved descriptor blocks",
            sb.s_reserved_gdt_blocks.get().into(),
            backup.s_reserved_gdt_blocks.get().into(),
        ),
        (
            "log groups per flex",
            sb.s_log_groups_per_flex.into(),
            backup.s_log_groups_per_flex.into(),
        ),
        (
            "layout features",
            (sb.s_feature_incompat.get() & geo_incompat).into(),
            (backup.s_feature_incompat.get() & geo_incompat).into(),
        ),
    ];
    for (name, p, b) in fields {
        if p != b {
            return Err(conflict(format!(
                "superblock: {name} is {p} but {b} in the backup superblock of group {bg}"
            ))
            .into());
        }
    }
    // The backup descriptor table: the same bitmap and table locations.
    // (With meta_bg, each meta group's block is compared with its copy in
    // the meta group's second group, where e2fsprogs reads backups from.)
    let ds = geom.desc_size as usize;
    for index in 0..geom.desc_blocks {
        let Some(loc) = crate::image::backup_descriptor_location(sb, geom, at, index) else {
            continue;
        };
        let bg = group_of(geom, loc);
        let blk = rd.block(loc)?;
        for g in geom.groups_in_desc_block(index) {
            let off = (g - index * geom.descs_per_block) as usize * ds;
            let Some(d) = ext4kit_format::group_desc::GroupDesc::parse(&blk[off..off + ds]) else {
                continue;
            };
            let p = image.desc(g);
            for (name, pv, bv) in [
                ("block bitmap", p.block_bitmap(), d.block_bitmap()),
                ("inode bitmap", p.inode_bitmap(), d.inode_bitmap()),
                ("inode table", p.inode_table(), d.inode_table()),
            ] {
                if pv != bv {
                    return Err(conflict(format!(
                        "group {g}: {name} at block {pv}, but the backup descriptors in group {bg} say block {bv}"
                    ))
                    .into());
                }
            }
        }
    }
    Ok(())
}

/// Every group's metadata, sorted, checked for bounds and overlaps.
fn layout(image: &Image<'_>) -> Result<Vec<Extent>, Conflict> {
    let geom = image.geometry();
    let sb = image.superblock();
    let flex = image.features().incompat.contains(Incompat::FLEX_BG);
    let mut v: Vec<Extent> = Vec::with_capacity(geom.group_count as usize * 4);
    let itb = u64::from(geom.itable_blocks);
    for g in 0..geom.group_count {
        let gs = group_start(geom, g);
        let ge = group_end(geom, g);
        let sup = group_has_super(sb, g);
        let mut push = |start: u64, len: u64, kind| {
            if len > 0 {
                v.push(Extent {
                    start,
                    end: start + len,
                    group: g,
                    kind,
                });
            }
        };
        // e2fsprogs' ext2fs_super_and_bgd_loc2: the contiguous table (and
        // the reserved blocks) after each superblock copy, except in the
        // meta groups of meta_bg, where the first, second and last group
        // of each hold one descriptor block (after the superblock, if any).
        let dpb = geom.descs_per_block;
        let in_meta = geom.first_meta_bg.is_some_and(|f| g / dpb >= f);
        if sup {
            let s = if g == 0 { geom.sb_block } else { gs };
            push(s, 1, Kind::Super);
            if !in_meta {
                let tb = u64::from(geom.table_blocks());
                push(s + 1, tb, Kind::Gdt);
                push(
                    s + 1 + tb,
                    u64::from(geom.reserved_gdt_blocks),
                    Kind::ReservedGdt,
                );
            }
        }
        if in_meta && [0, 1, dpb - 1].contains(&(g % dpb)) {
            push(gs + u64::from(sup), 1, Kind::Gdt);
        }
        let d = image.desc(g);
        for (start, len, kind) in [
            (d.block_bitmap(), 1, Kind::BlockBitmap),
            (d.inode_bitmap(), 1, Kind::InodeBitmap),
            (d.inode_table(), itb, Kind::InodeTable),
        ] {
            let e = Extent {
                start,
                end: start.saturating_add(len),
                group: g,
                kind,
            };
            if start < geom.first_data_block || e.end > geom.blocks_count {
                return Err(conflict(format!(
                    "{} is outside the filesystem (blocks {}..{})",
                    e.describe(),
                    geom.first_data_block,
                    geom.blocks_count
                )));
            }
            if !flex && (start < gs || e.end > ge) {
                return Err(conflict(format!(
                    "{} is outside the group (blocks {gs}..{ge}) without flex_bg",
                    e.describe()
                )));
            }
            v.push(e);
        }
    }
    for e in &v {
        if e.end > geom.blocks_count {
            return Err(conflict(format!(
                "{} is outside the filesystem ({} blocks)",
                e.describe(),
                geom.blocks_count
            )));
        }
    }
    v.sort_unstable_by_key(|e| (e.start, e.end));
    for w in v.windows(2) {
        if w[1].start < w[0].end {
            return Err(conflict(format!(
                "{} overlaps {}",
                w[1].describe(),
                w[0].describe()
            )));
        }
    }
    Ok(v)
}

/// Is bit `i` of `bitmap` set?
fn bit(bitmap: &[u8], i: u64) -> bool {
    let byte = (i / 8) as usize;
    bitmap.get(byte).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

fn check_block_bitmaps(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    extents: &[Extent],
) -> Result<(), CheckError> {
    let geom = image.geometry();
    let mut cache: Option<(u32, Vec<u8>)> = None;
    for e in extents {
        let mut b = e.start;
        while b < e.end {
            let g = group_of(geom, b);
            let gs = group_start(geom, g);
            let run_end = e.end.min(group_end(geom, g));
            let flags = image.desc_flags(g);
            if flags & BG_BLOCK_UNINIT != 0 {
                // The computed bitmap marks only the group's own metadata
                // lying inside it.
                if e.group != g {
                    return Err(conflict(format!(
                        "group {g} is BLOCK_UNINIT but holds {}",
                        e.describe()
                    ))
                    .into());
                }
            } else {
                if cache.as_ref().is_none_or(|(cg, _)| *cg != g) {
                    let bm = rd.block(image.desc(g).block_bitmap())?;
                    cache = Some((g, bm));
                }
                let bm = cache.as_ref().map(|(_, b)| b.as_slice()).unwrap_or(&[]);
                // One bit per cluster (bigalloc), else per block.
                let ratio = u64::from(geom.cluster_ratio.max(1));
                if let Some(free) = (b..run_end).find(|&x| !bit(bm, (x - gs) / ratio)) {
                    return Err(conflict(format!(
                        "group {g}: block {free} of {} is free in the block bitmap",
                        e.describe()
                    ))
                    .into());
                }
            }
            b = run_end;
        }
    }
    Ok(())
}

/// An inode slot as read from its table.
fn read_inode(image: &Image<'_>, ino: u32) -> Result<Vec<u8>, ImageError> {
    let geom = image.geometry();
    let g = (ino - 1) / geom.inodes_per_group;
    let idx = (ino - 1) % geom.inodes_per_group;
    let table = image.desc(g).inode_table();
    let off = geom
        .byte_offset(table)
        .saturating_add(u64::from(idx) * u64::from(geom.inode_size));
    let mut buf = vec![0u8; geom.inode_size as usize];
    image.device().read_at(&mut buf, off)?;
    Ok(buf)
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Validate a special inode: type, and checksum with metadata_csum.
fn special_inode(
    image: &Image<'_>,
    ino: u32,
    what: &str,
    want_type: u16,
) -> Result<Vec<u8>, CheckError> {
    let slot = read_inode(image, ino)?;
    let mode = le16(&slot, 0);
    if mode & S_IFMT != want_type || le16(&slot, 0x1A) == 0 {
        return Err(conflict(format!(
            "group 0: the {what} (inode {ino}) is not where the inode size ({}) and group 0's inode table (block {}) put it (mode {mode:#o})",
            image.geometry().inode_size,
            image.desc(0).inode_table()
        ))
        .into());
    }
    if image.csum().metadata && !ext4kit_format::inode::checksum_ok(&slot, ino, image.csum()) {
        return Err(conflict(format!(
            "group 0: the {what} (inode {ino}) has a bad checksum (wrong inode size or table location?)"
        ))
        .into());
    }
    Ok(slot)
}

/// Physical block ranges mapped by an inode (extent tree or block map),
/// validated to lie inside the filesystem.
/// `sized`: the map must fit the inode's size (the journal); otherwise
/// (any file, sparse ones included) every pointer is followed, within a
/// budget of reads bounded by the filesystem's size.
fn inode_blocks(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    slot: &[u8],
    what: &str,
    sized: bool,
) -> Result<Vec<(u64, u64)>, CheckError> {
    let geom = image.geometry();
    let bs = u64::from(geom.block_size);
    let size = u64::from(le32(slot, 4)) | (u64::from(le32(slot, 0x6C)) << 32);
    let nblocks = if sized {
        size.div_ceil(bs)
    } else {
        geom.blocks_count
    };
    if sized && nblocks > geom.blocks_count {
        return Err(conflict(format!(
            "the {what} is {size} bytes, larger than the filesystem"
        ))
        .into());
    }
    let iblock = &slot[0x28..0x28 + 60];
    let mut out: Vec<(u64, u64)> = Vec::new();
    let bad = |b: u64| -> CheckError {
        conflict(format!(
            "the {what} maps block {b}, outside the filesystem ({} blocks)",
            geom.blocks_count
        ))
        .into()
    };
    let push = |out: &mut Vec<(u64, u64)>, s: u64, n: u64| -> Result<(), CheckError> {
        if n == 0 {
            return Ok(());
        }
        if s < geom.first_data_block || s.saturating_add(n) > geom.blocks_count {
            return Err(bad(s));
        }
        match out.last_mut() {
            Some(last) if last.1 == s => last.1 = s + n,
            _ => out.push((s, s + n)),
        }
        Ok(())
    };
    if le32(slot, 0x20) & EXTENTS_FL != 0 {
        // (node bytes, depth expected, remaining budget)
        let mut stack: Vec<(Vec<u8>, Option<u16>)> = vec![(iblock.to_vec(), None)];
        let mut nodes = 0u64;
        while let Some((node, want_depth)) = stack.pop() {
            nodes += 1;
            if nodes > geom.blocks_count.min(1 << 20) {
                return Err(conflict(format!("the {what}'s extent tree does not end")).into());
            }
            if le16(&node, 0) != EXTENT_MAGIC {
                return Err(
                    conflict(format!("the {what}'s extent tree is corrupt (magic)")).into(),
                );
            }
            let entries = le16(&node, 2) as usize;
            let max = le16(&node, 4) as usize;
            let depth = le16(&node, 6);
            if entries > max
                || 12 + 12 * max > node.len()
                || depth > 5
                || want_depth.is_some_and(|d| d != depth)
            {
                return Err(
                    conflict(format!("the {what}'s extent tree is corrupt (header)")).into(),
                );
            }
            for i in 0..entries {
                let e = &node[12 + 12 * i..24 + 12 * i];
                if depth == 0 {
                    let mut len = u64::from(le16(e, 4));
                    if len > 32768 {
                        len -= 32768;
                    }
                    let start = u64::from(le32(e, 8)) | (u64::from(le16(e, 6)) << 32);
                    push(&mut out, start, len)?;
                } else {
                    let leaf = u64::from(le32(e, 4)) | (u64::from(le16(e, 8)) << 32);
                    push(&mut out, leaf, 1)?;
                    stack.push((rd.block(leaf)?, Some(depth - 1)));
                }
            }
        }
    } else {
        let apb = bs / 4;
        let mut left = nblocks;
        for i in 0..12 {
            if left == 0 {
                break;
            }
            let b = u64::from(le32(iblock, 4 * i));
            if b != 0 {
                push(&mut out, b, 1)?;
            }
            left -= 1;
        }
        // Indirect levels: (pointer, depth).
        let mut work: Vec<(u64, u32)> = Vec::new();
        for (i, depth) in [(12usize, 1u32), (13, 2), (14, 3)] {
            let b = u64::from(le32(iblock, 4 * i));
            if b != 0 && left > 0 {
                work.push((b, depth));
            }
        }
        let mut budget = nblocks / apb.max(1) + 4 + nblocks / (apb * apb).max(1);
        for (b, depth) in work {
            let mut stack = vec![(b, depth)];
            while let Some((b, depth)) = stack.pop() {
                if budget == 0 {
                    return Err(conflict(format!(
                        "the {what}'s block map has more indirect blocks than it can need"
                    ))
                    .into());
                }
                budget -= 1;
                push(&mut out, b, 1)?;
                let blk = rd.block(b)?;
                let mut children = Vec::new();
                for k in 0..apb as usize {
                    let c = u64::from(le32(&blk, 4 * k));
                    if c != 0 {
                        children.push(c);
                    }
                }
                if depth == 1 {
                    for c in children {
                        push(&mut out, c, 1)?;
                    }
                } else {
                    for c in children.into_iter().rev() {
                        stack.push((c, depth - 1));
                    }
                }
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The extent among `extents` (sorted, disjoint) overlapping `s..e`.
fn overlapping(extents: &[Extent], s: u64, e: u64) -> Option<&Extent> {
    let i = extents.partition_point(|x| x.start < e);
    (i > 0 && extents[i - 1].end > s).then(|| &extents[i - 1])
}

fn check_special_inodes(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    extents: &[Extent],
) -> Result<(), CheckError> {
    let f = image.features();
    let geom = image.geometry();
    special_inode(image, ROOT_INO, "root directory", S_IFDIR)?;
    if f.compat.contains(Compat::HAS_JOURNAL) && image.superblock().s_journal_inum.get() != 0 {
        let ino = image.superblock().s_journal_inum.get();
        if ino > geom.inodes_count || ino == 0 {
            return Err(conflict(format!("superblock: journal inode {ino}")).into());
        }
        let slot = special_inode(image, ino, "journal", S_IFREG)?;
        for (s, e) in inode_blocks(image, rd, &slot, "journal", true)? {
            if let Some(x) = overlapping(extents, s, e) {
                return Err(conflict(format!(
                    "{} overlaps the journal (blocks {s}..{e})",
                    x.describe()
                ))
                .into());
            }
        }
    }
    if f.compat.contains(Compat::RESIZE_INODE) {
        let slot = special_inode(image, RESIZE_INO, "resize inode", S_IFREG)?;
        // Double-indirect block -> primary reserved descriptor blocks ->
        // their backups.
        let dind = u64::from(le32(&slot, 0x28 + 4 * 13));
        if dind != 0 {
            let mut blocks = vec![dind];
            let d = rd.block(dind)?;
            let apb = geom.block_size as usize / 4;
            for k in 0..apb {
                let p = u64::from(le32(&d, 4 * k));
                if p == 0 {
                    continue;
                }
                blocks.push(p);
                if blocks.len() > 2 * apb {
                    break;
                }
                let r = rd.block(p)?;
                for j in 0..apb {
                    let q = u64::from(le32(&r, 4 * j));
                    if q != 0 {
                        blocks.push(q);
                    }
                }
            }
            for b in blocks {
                if b >= geom.blocks_count {
                    return Err(conflict(format!(
                        "the resize inode maps block {b}, outside the filesystem"
                    ))
                    .into());
                }
                if let Some(x) = overlapping(extents, b, b + 1)
                    && matches!(
                        x.kind,
                        Kind::InodeTable | Kind::BlockBitmap | Kind::InodeBitmap
                    )
                {
                    return Err(conflict(format!(
                        "{} overlaps the resize inode's block {b}",
                        x.describe()
                    ))
                    .into());
                }
            }
        }
    }
    Ok(())
}

fn check_inode_bitmaps(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    pending: &[GroupWork],
) -> Result<(), CheckError> {
    let geom = image.geometry();
    let ipg = geom.inodes_per_group;
    // Bitmaps of neighbouring groups usually share nothing; a small cache
    // keyed by block keeps repeated reads away when they do.
    let mut cache: HashMap<u64, Vec<u8>> = HashMap::new();
    for w in pending {
        let d = image.desc(w.group);
        if d.flags() & BG_INODE_UNINIT != 0 {
            continue;
        }
        let first_unused = ipg - d.itable_unused().min(ipg);
        let blk = d.inode_bitmap();
        if !cache.contains_key(&blk) {
            if cache.len() > 64 {
                cache.clear();
            }
            cache.insert(blk, rd.block(blk)?);
        }
        let bm = &cache[&blk];
        if let Some(i) = (u64::from(first_unused)..u64::from(ipg)).find(|&i| bit(bm, i)) {
            let ino = u64::from(w.group) * u64::from(ipg) + i + 1;
            return Err(conflict(format!(
                "group {}: inode {ino} is in use in the inode bitmap but past the unused-inodes watermark ({} of {ipg} unused)",
                w.group,
                d.itable_unused()
            ))
            .into());
        }
    }
    Ok(())
}

/// No inode in use (in its group's bitmap, below the unused-inodes
/// watermark) maps a block, or has an extended-attribute block, in a range
/// to zero: this catches an inode table pointed at file data or a
/// directory, even when every copy of the descriptor says so. The work is
/// proportional to the inodes in use (few, on the fresh filesystems lazy
/// init is for).
fn check_inode_maps(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    pending: &[GroupWork],
) -> Result<(), CheckError> {
    let geom = image.geometry();
    let mut zero: Vec<(u64, u64, u32)> = pending
        .iter()
        .filter(|w| w.zero_blocks > 0)
        .map(|w| {
            let s = w.zero_start();
            (s, s + u64::from(w.zero_blocks), w.group)
        })
        .collect();
    if zero.is_empty() {
        return Ok(());
    }
    zero.sort_unstable();
    let hit = |s: u64, e: u64| -> Option<(u64, u64, u32)> {
        let i = zero.partition_point(|z| z.0 < e);
        (i > 0 && zero[i - 1].1 > s).then(|| zero[i - 1])
    };
    let ipg = geom.inodes_per_group;
    let isz = geom.inode_size as usize;
    for g in 0..geom.group_count {
        let d = image.desc(g);
        if d.flags() & BG_INODE_UNINIT != 0 {
            continue;
        }
        let used = ipg - d.itable_unused().min(ipg);
        if used == 0 {
            continue;
        }
        let ibm = rd.block(d.inode_bitmap())?;
        let table = d.inode_table();
        // The used part of the table, a chunk at a time.
        let per_chunk = (1u32 << 20) / geom.inode_size;
        let mut idx = 0u32;
        while idx < used {
            let n = per_chunk.min(used - idx);
            let mut buf = vec![0u8; n as usize * isz];
            let off = geom
                .byte_offset(table)
                .saturating_add(u64::from(idx) * u64::from(geom.inode_size));
            image
                .device()
                .read_at(&mut buf, off)
                .map_err(ImageError::from)?;
            for k in 0..n {
                let i = idx + k;
                let ino = g * ipg + i + 1;
                if !bit(&ibm, u64::from(i)) || ino == 1 || ino == RESIZE_INO {
                    continue;
                }
                let slot = &buf[k as usize * isz..(k as usize + 1) * isz];
                let mode = le16(slot, 0);
                let mut ranges = Vec::new();
                let acl = u64::from(le32(slot, 0x68)) | (u64::from(le16(slot, 0x76)) << 32);
                if acl != 0 {
                    ranges.push((acl, acl + 1));
                }
                let flags = le32(slot, 0x20);
                let size = u64::from(le32(slot, 4));
                let has_map = matches!(mode & S_IFMT, S_IFREG | S_IFDIR | 0o120000)
                    && flags & INLINE_DATA_FL == 0
                    && !(mode & S_IFMT == 0o120000 && flags & EXTENTS_FL == 0 && size < 60);
                if has_map {
                    let what = format!("inode {ino}");
                    ranges.extend(inode_blocks(image, rd, slot, &what, false)?);
                }
                for (s, e) in ranges {
                    if let Some((zs, ze, zg)) = hit(s, e) {
                        return Err(conflict(format!(
                            "group {zg}: the part of its inode table to zero (blocks {zs}..{ze}) holds blocks {s}..{e} of inode {ino}"
                        ))
                        .into());
                    }
                }
            }
            idx += n;
        }
    }
    Ok(())
}

/// Does this inode slot look like an inode of this filesystem in use?
fn looks_in_use(image: &Image<'_>, sb: &Superblock, slot: &[u8], ino: u32) -> bool {
    let mode = le16(slot, 0);
    let links = le16(slot, 0x1A);
    if mode == 0 || links == 0 {
        return false;
    }
    if image.csum().metadata {
        return ext4kit_format::inode::checksum_ok(slot, ino, image.csum());
    }
    let ftype = mode & S_IFMT;
    let live_type = matches!(
        ftype,
        0o010000 | 0o020000 | 0o040000 | 0o060000 | 0o100000 | 0o120000 | 0o140000
    );
    let dtime = le32(slot, 0x14);
    let ctime = le32(slot, 0x0C);
    let made = sb.s_mkfs_time.get();
    live_type && dtime == 0 && ctime != 0 && ctime >= made
}

fn probe_ranges(
    image: &Image<'_>,
    rd: &Reader<'_, '_>,
    pending: &[GroupWork],
    sb: &Superblock,
) -> Result<(), CheckError> {
    let geom = image.geometry();
    let dev = image.device();
    let bs = u64::from(geom.block_size);
    for w in pending {
        if w.zero_blocks == 0 {
            continue;
        }
        let b = w.zero_start();
        if dev
            .is_known_zero(geom.byte_offset(b), bs)
            .map_err(ImageError::from)?
        {
            continue;
        }
        let blk = rd.block(b)?;
        let first_idx = w.used_blocks * geom.inodes_per_block;
        for k in 0..geom.inodes_per_block {
            let idx = first_idx + k;
            let ino = w.group * geom.inodes_per_group + idx + 1;
            let off = (k * geom.inode_size) as usize;
            let slot = &blk[off..off + geom.inode_size as usize];
            if looks_in_use(image, sb, slot, ino) {
                return Err(conflict(format!(
                    "group {}: inode {ino}, in the part of the inode table to zero, looks in use (mode {:#o}, {} links)",
                    w.group,
                    le16(slot, 0),
                    le16(slot, 0x1A)
                ))
                .into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::test_support::{ITB, synthetic, table_start};
    use crate::lazyinit::{Job, LazyError};
    use ext4kit_device::{Device, MemDevice};
    use ext4kit_format::features::RoCompat;
    use ext4kit_format::group_desc::GroupDesc;

    const GROUPS: u32 = 4;

    /// Rewrite group `g`'s descriptor with `edit`, checksum recomputed.
    fn edit_desc(dev: &MemDevice, g: u32, edit: impl FnOnce(&mut GroupDesc)) {
        let off = 2048 + u64::from(g) * 64;
        let mut raw = vec![0u8; 64];
        dev.read_at(&mut raw, off).unwrap();
        let mut d = GroupDesc::parse(&raw).unwrap();
        edit(&mut d);
        let img = Image::open(dev).unwrap();
        let csum = *img.csum();
        drop(img);
        d.update_checksum(&csum, g, 64);
        dev.write_at(d.on_disk(64), off).unwrap();
    }

    fn refused(dev: &MemDevice, want: &str) {
        let before = dev.to_bytes();
        match Job::prepare(dev) {
            Err(LazyError::Unsafe(c)) => assert!(c.0.contains(want), "{c}"),
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("not refused; expected '{want}'"),
        }
        assert!(dev.to_bytes() == before, "written");
    }

    #[test]
    fn synthetic_passes() {
        for mc in [true, false] {
            let dev = synthetic(mc, GROUPS);
            Job::prepare(&dev).expect("clean synthetic image");
        }
    }

    #[test]
    fn bitmap_over_another_groups_bitmap() {
        let dev = synthetic(true, GROUPS);
        let ib1 = table_start(GROUPS) - u64::from(GROUPS) + 1;
        edit_desc(&dev, 3, |d| d.set_block_bitmap(ib1));
        refused(&dev, "bitmap (blocks");
        refused(&dev, "overlaps group");
    }

    #[test]
    fn table_in_free_blocks() {
        let dev = synthetic(true, GROUPS);
        let free = table_start(GROUPS) + u64::from(GROUPS) * ITB + 50;
        edit_desc(&dev, 2, |d| d.set_inode_table(free));
        refused(&dev, "is free in the block bitmap");
    }

    #[test]
    fn hidden_inode_past_the_watermark() {
        let dev = synthetic(false, GROUPS);
        // Inode 12 in use in group 0's bitmap, but 53 of 64 called unused.
        let ibm = table_start(GROUPS) - u64::from(GROUPS);
        dev.write_at(&[0x0F], ibm * 1024 + 1).unwrap();
        refused(&dev, "inode 12 is in use in the inode bitmap");
    }

    #[test]
    fn live_inode_in_an_inode_uninit_group() {
        for mc in [true, false] {
            let dev = synthetic(mc, GROUPS);
            // Group 2 says INODE_UNINIT, but its first inode is a file.
            let ino = 2 * 64 + 1;
            let mut slot = vec![0u8; 256];
            slot[0..2].copy_from_slice(&0o100644u16.to_le_bytes());
            slot[0x0C..0x10].copy_from_slice(&1_800_000_000u32.to_le_bytes());
            slot[0x1A..0x1C].copy_from_slice(&1u16.to_le_bytes());
            slot[0x80..0x82].copy_from_slice(&32u16.to_le_bytes());
            let img = Image::open(&dev).unwrap();
            ext4kit_format::inode::set_checksum(&mut slot, ino, img.csum());
            drop(img);
            let at = (table_start(GROUPS) + 2 * ITB) * 1024;
            dev.write_at(&slot, at).unwrap();
            refused(
                &dev,
                &format!("inode {ino}, in the part of the inode table to zero"),
            );
        }
    }

    #[test]
    fn table_over_a_directory_block() {
        for mc in [true, false] {
            let dev = synthetic(mc, GROUPS);
            // The root directory's first block lies in group 1's table,
            // as if that table had been pointed at it.
            let blk = (table_start(GROUPS) + ITB + 5) as u32;
            let at = table_start(GROUPS) * 1024 + 256;
            let mut root = vec![0u8; 256];
            dev.read_at(&mut root, at).unwrap();
            root[0x04..0x08].copy_from_slice(&1024u32.to_le_bytes());
            root[0x28..0x2C].copy_from_slice(&blk.to_le_bytes());
            let img = Image::open(&dev).unwrap();
            ext4kit_format::inode::set_checksum(&mut root, 2, img.csum());
            drop(img);
            dev.write_at(&root, at).unwrap();
            refused(&dev, &format!("holds blocks {blk}..{} of inode 2", blk + 1));
        }
    }

    #[test]
    fn root_inode_must_be_a_directory() {
        let dev = synthetic(true, GROUPS);
        dev.write_at(&[0u8; 256], table_start(GROUPS) * 1024 + 256)
            .unwrap();
        refused(&dev, "root directory (inode 2)");
    }

    #[test]
    fn sparse_super_groups() {
        let mut sb = Superblock::zeroed();
        sb.s_feature_ro_compat.set(RoCompat::SPARSE_SUPER.bits());
        let got: Vec<u32> = (0..130).filter(|&g| group_has_super(&sb, g)).collect();
        assert_eq!(got, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81, 125]);
        sb.s_feature_ro_compat.set(0);
        assert!(group_has_super(&sb, 6));
        sb.s_feature_compat.set(Compat::SPARSE_SUPER2.bits());
        sb.s_backup_bgs[0].set(1);
        sb.s_backup_bgs[1].set(40);
        let got: Vec<u32> = (0..130).filter(|&g| group_has_super(&sb, g)).collect();
        assert_eq!(got, vec![0, 1, 40]);
    }
}
