//! mke2fs.conf's huge files (`make_hugefiles`, misc/mk_hugefiles.c):
//! preallocated, physically contiguous files made right after the orphan
//! file, in a directory of their own (or the root).
//!
//! The planner replays mk_hugefiles over the layout: the directories
//! (`ext2fs_mkdir`, one path component at a time), the files (each a run
//! of free chunks from a moving goal after the slack, appended extent by
//! extent with `ext2fs_extent_insert`), their names linked as
//! `ext2fs_link` links them (first fit over the directory's blocks, a new
//! block by `ext2fs_expand_dir` when none has room; a directory's fifth
//! extent splits its root into one leaf block, and the directory's later
//! extents go there, up to the leaf's capacity). The extent tree is
//! modelled slot by slot as libext2fs leaves it: splits at the end of the
//! file move one entry into the new node (`no_balance`), the root's split
//! moves them all, and the entries a split copies away stay behind as
//! stale bytes past `eh_entries`. The I/O libext2fs does meanwhile is
//! recorded (through its 4-inode cache) for `s_kbytes_written`, and so
//! are the runs it zeroes (for undo_io under `-z`).
//!
//! With inline_data the directories ext2fs_mkdir makes are inline until
//! a link finds no room and `ext2fs_inline_data_expand` gives them a
//! block; with bigalloc allocations take clusters, and a plan whose files
//! are off their clusters (which e2fsck rejects) is refused.

use ext4kit_format::dir;
use ext4kit_format::extent::{self, EXT_INIT_MAX_LEN, Extent, ExtentHeader, ExtentIndex};
use ext4kit_format::features::{Incompat, RoCompat};
use zerocopy::IntoBytes;

use super::geometry::{FileMap, GeometryError, Planner, Run};

/// mke2fs.conf's hugefiles settings, numbers already parsed in blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HugeParams {
    /// `hugefiles_dir` (default `/`).
    pub dir: String,
    /// `hugefiles_name` (default `hugefile`).
    pub name: String,
    /// `hugefiles_digits` (default 5).
    pub digits: u32,
    /// `num_hugefiles` (0: as many as fit, or one).
    pub num_files: u64,
    /// `hugefiles_size` in blocks (0: fill).
    pub num_blocks: u64,
    /// `hugefiles_slack` in blocks (default 1M).
    pub slack: u64,
    /// `hugefiles_align` in blocks.
    pub align: u64,
    /// `hugefiles_align_disk`: the partition's start, in blocks.
    pub part_offset: u64,
    pub uid: u32,
    pub gid: u32,
    /// `hugefiles_umask` (default 077).
    pub umask: u32,
    /// `zero_hugefiles` when mke2fs.conf sets it; by default the files are
    /// zeroed unless the storage reads as zero (a zeroing discard, or
    /// `assume_storage_prezeroed`).
    pub zero: Option<bool>,
}

/// A directory entry as `link_proc` leaves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub ino: u32,
    pub name: Vec<u8>,
    pub ft: u8,
    pub rec_len: u32,
}

impl Dirent {
    /// A directory block's first two entries, `.` (12 bytes) and `..`
    /// (`dotdot_rec_len` bytes: the rest of the block when it is the last).
    fn dots(ino: u32, parent: u32, dotdot_rec_len: u32) -> Vec<Dirent> {
        let entry = |ino, name: &[u8], rec_len| Dirent {
            ino,
            name: name.to_vec(),
            ft: dir::FT_DIR,
            rec_len,
        };
        vec![entry(ino, b".", 12), entry(parent, b"..", dotdot_rec_len)]
    }
}

/// A directory the huge files touch (the root is always the first).
#[derive(Clone, Debug)]
pub struct HugeDir {
    pub ino: u32,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub links: u16,
    pub map: FileMap,
    /// Entries of each block, in logical order.
    pub blocks: Vec<Vec<Dirent>>,
    /// The parent directory (`..`).
    pub parent: u32,
    /// With inline_data, while the directory is still inline: the entries
    /// of its 56 bytes in `i_block` after the parent's number (its
    /// `system.data` attribute stays empty).
    pub inline: Option<Vec<Dirent>>,
    /// Made inline (its emptied in-inode attribute area keeps the magic).
    pub was_inline: bool,
}

/// Bytes of `i_block` an inline directory's entries have (after `..`).
pub const INLINE_DIR_AREA: u32 = 56;

/// One huge file.
#[derive(Clone, Debug)]
pub struct HugeFile {
    pub ino: u32,
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Blocks counted in `i_blocks` (data and extent tree blocks).
    pub counted_blocks: u64,
    /// The 60-byte `i_block` extent root, stale slots included.
    pub i_block: [u8; 60],
    /// Extent tree blocks (physical block, contents without checksum).
    pub nodes: Vec<(u64, Vec<u8>)>,
    /// The data runs (for zeroing).
    pub data: Vec<Run>,
}

/// What mk_hugefiles made.
#[derive(Clone, Debug, Default)]
pub struct HugePlan {
    pub dirs: Vec<HugeDir>,
    pub files: Vec<HugeFile>,
    pub zero: bool,
    /// mke2fs's progress line (`Creating N huge file(s) ...: `), when it
    /// got that far.
    pub progress: Option<String>,
    /// `com_err` messages (one a line, without the program name), printed
    /// to stderr; mke2fs goes on after them. With `progress` set, the
    /// progress line ends without its "done".
    pub error: Option<String>,
    /// Cache accesses (block, write) in libext2fs's order.
    pub trace: Vec<(u64, bool)>,
    /// The data runs `ext2fs_zero_blocks2` zeroes (when `zero`): (where
    /// in `trace` it happens, first block, blocks). Its zeroout bypasses
    /// the cache, but under `-z` undo_io first saves the old contents.
    pub zeroed: Vec<(usize, u64, u64)>,
}

impl HugePlan {
    /// The root directory's model (always present once planned).
    pub fn root(&self) -> Option<&HugeDir> {
        self.dirs.iter().find(|d| d.ino == 2)
    }
}

/// libext2fs's 4-entry inode cache and its one-block buffer, which decide
/// whether an inode read reaches the I/O channel.
struct Io {
    trace: Vec<(u64, bool)>,
    icache: [u32; 4],
    last: usize,
    buffer_blk: u64,
}

impl Io {
    fn access(&mut self, b: u64, w: bool) {
        self.trace.push((b, w));
    }
    fn read_inode(&mut self, ino: u32, blk: u64) {
        if self.icache.contains(&ino) {
            return;
        }
        if self.buffer_blk != blk {
            self.access(blk, false);
            self.buffer_blk = blk;
        }
        self.last = (self.last + 1) % 4;
        self.icache[self.last] = ino;
    }
    fn write_inode(&mut self, blk: u64) {
        if self.buffer_blk != blk {
            self.access(blk, false);
            self.buffer_blk = blk;
        }
        self.access(blk, true);
    }
}

fn unsupported(what: &str) -> GeometryError {
    GeometryError::Invalid(format!(
        "mke2fs.conf hugefiles: {what} is not supported by ext4kit yet"
    ))
}

/// An extent tree node on the rightmost path (the root has `pblk` 0).
#[derive(Clone)]
struct Node {
    pblk: u64,
    depth: u16,
    max: usize,
    count: usize,
    slots: Vec<[u8; 12]>,
}

impl Node {
    fn first_pblk(&self) -> u64 {
        let s = &self.slots[0];
        if self.depth == 0 {
            let hi = u64::from(u16::from_le_bytes([s[6], s[7]]));
            let lo = u64::from(u32::from_le_bytes([s[8], s[9], s[10], s[11]]));
            (hi << 32) | lo
        } else {
            let lo = u64::from(u32::from_le_bytes([s[4], s[5], s[6], s[7]]));
            let hi = u64::from(u16::from_le_bytes([s[8], s[9]]));
            (hi << 32) | lo
        }
    }
    fn lblk_of(&self, k: usize) -> u32 {
        let s = &self.slots[k];
        u32::from_le_bytes([s[0], s[1], s[2], s[3]])
    }
    fn bytes(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let h = ExtentHeader::new(self.count as u16, self.max as u16, self.depth);
        out[..12].copy_from_slice(h.as_bytes());
        for (k, s) in self.slots.iter().enumerate() {
            if 12 + 12 * k + 12 <= len {
                out[12 + 12 * k..24 + 12 * k].copy_from_slice(s);
            }
        }
        out
    }
}

/// Appending extents to a fresh inode, as `ext2fs_extent_insert` with
/// `EXT2_EXTENT_INSERT_AFTER` does it.
struct Tree {
    /// Every node ever made: index 0 is the root.
    nodes: Vec<Node>,
    /// The rightmost path, root first (indices into `nodes`).
    path: Vec<usize>,
    splits: u64,
    iblk: u64,
    bs: u32,
}

fn slot(b: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    s.copy_from_slice(&b[..12]);
    s
}

impl Tree {
    fn new(iblk: u64, bs: u32) -> Self {
        Tree {
            nodes: vec![Node {
                pblk: 0,
                depth: 0,
                max: usize::from(extent::ENTRIES_IN_INODE),
                count: 0,
                slots: vec![[0; 12]; 4],
            }],
            path: vec![0],
            splits: 0,
            iblk,
            bs,
        }
    }
    /// `update_path` at `level`: the inode or the node's block.
    fn update(&self, io: &mut Io, level: usize) {
        if level == 0 {
            io.write_inode(self.iblk);
        } else {
            io.access(self.nodes[self.path[level]].pblk, true);
        }
    }
    /// `ext2fs_extent_goto2` back down the rightmost path, to the level
    /// `height` above the leaves.
    fn goto(&self, io: &mut Io, height: usize) {
        let to = self.path.len() - height;
        for &n in &self.path[1..to] {
            io.access(self.nodes[n].pblk, false);
        }
    }
    fn insert(
        &mut self,
        pl: &mut Planner,
        io: &mut Io,
        level: usize,
        entry: [u8; 12],
    ) -> Result<(), GeometryError> {
        let height = self.path.len() - 1 - level;
        let n = self.path[level];
        if self.nodes[n].count >= self.nodes[n].max {
            self.split(pl, io, level)?;
        }
        let level = self.path.len() - 1 - height;
        let n = self.path[level];
        let node = &mut self.nodes[n];
        let c = node.count;
        node.slots[c] = entry;
        node.count += 1;
        // ext2fs_extent_replace, then update_path.
        self.update(io, level);
        self.update(io, level);
        Ok(())
    }
    fn split(&mut self, pl: &mut Planner, io: &mut Io, level: usize) -> Result<(), GeometryError> {
        let height = self.path.len() - 1 - level;
        let n = self.path[level];
        let mut goal = self.nodes[n].first_pblk().wrapping_sub(1);
        if level > 0 {
            let p = self.path[level - 1];
            if self.nodes[p].count >= self.nodes[p].max {
                self.split(pl, io, level - 1)?;
                self.goto(io, height);
            }
        }
        let level = self.path.len() - 1 - height;
        let n = self.path[level];
        if goal == 0 {
            goal = pl.inode_goal(1);
        }
        let b = pl.alloc_block(goal, "hugefile extent block")?;
        // ext2fs_alloc_block2 writes the zeroed block, then the node.
        io.access(b, true);
        io.access(b, true);
        let max = usize::from(extent::entries_per_block(self.bs));
        if level == 0 {
            let root = self.nodes[0].clone();
            let mut slots = vec![[0u8; 12]; max];
            slots[..root.count].copy_from_slice(&root.slots[..root.count]);
            let child = Node {
                pblk: b,
                depth: root.depth,
                max,
                count: root.count,
                slots,
            };
            let first = child.lblk_of(0);
            self.nodes.push(child);
            let ci = self.nodes.len() - 1;
            let r = &mut self.nodes[0];
            r.count = 1;
            r.depth += 1;
            r.slots[0] = slot(ExtentIndex::new(first, b).as_bytes());
            self.path.insert(1, ci);
            io.write_inode(self.iblk);
            io.write_inode(self.iblk);
        } else {
            let old = &mut self.nodes[n];
            let moved = old.slots[old.count - 1];
            old.count -= 1;
            let mut slots = vec![[0u8; 12]; max];
            slots[0] = moved;
            let node = Node {
                pblk: b,
                depth: old.depth,
                max,
                count: 1,
                slots,
            };
            let start = node.lblk_of(0);
            self.update(io, level);
            self.nodes.push(node);
            let ni = self.nodes.len() - 1;
            // The parent: its current entry replaced, the new index after.
            self.update(io, level - 1);
            let p = self.path[level - 1];
            let pn = &mut self.nodes[p];
            let c = pn.count;
            pn.slots[c] = slot(ExtentIndex::new(start, b).as_bytes());
            pn.count += 1;
            self.update(io, level - 1);
            self.update(io, level - 1);
            self.path[level] = ni;
        }
        self.goto(io, height);
        self.splits += 1;
        io.write_inode(self.iblk);
        Ok(())
    }
}

/// link_proc over one directory block's entries (or an inline
/// directory's area): `(changed, done)`. A free entry after the current
/// one is absorbed when it starts before `absorb_before`.
fn link_entries(
    ents: &mut Vec<Dirent>,
    need: u32,
    name: &[u8],
    ino: u32,
    ft: u8,
    absorb_before: u32,
) -> (bool, bool) {
    let mut changed = false;
    let mut i = 0;
    let mut offset = 0u32;
    while i < ents.len() {
        let next_at = offset + ents[i].rec_len;
        if i + 1 < ents.len() && ents[i + 1].ino == 0 && next_at < absorb_before {
            let add = ents[i + 1].rec_len;
            ents[i].rec_len += add;
            ents.remove(i + 1);
            changed = true;
        }
        let e = &mut ents[i];
        if e.ino != 0 {
            let min = dir::rec_len(e.name.len()) as u32;
            if e.rec_len >= min + need {
                let rest = e.rec_len - min;
                e.rec_len = min;
                ents.insert(
                    i + 1,
                    Dirent {
                        ino: 0,
                        name: Vec::new(),
                        ft: 0,
                        rec_len: rest,
                    },
                );
                changed = true;
            }
            offset += ents[i].rec_len;
            i += 1;
            continue;
        }
        if e.rec_len >= need {
            e.ino = ino;
            e.name = name.to_vec();
            e.ft = ft;
            return (true, true);
        }
        offset += e.rec_len;
        i += 1;
    }
    (changed, false)
}

/// `calc_overhead`: extent blocks a file of `num` blocks may need.
fn calc_overhead(bs: u32, num: u64) -> u64 {
    let extents = num.div_ceil(u64::from(EXT_INIT_MAX_LEN));
    if extents <= 4 {
        return 0;
    }
    let epb = (u64::from(bs) - 12) / 12 / 2 - 1;
    let e1 = extents.div_ceil(epb);
    let e2 = e1.div_ceil(epb);
    let e3 = e2.div_ceil(epb);
    let e4 = e3.div_ceil(epb);
    e1 + e2 + e3 + e4
}

fn round_up_align(b: u64, align: u64, part_offset: u64) -> u64 {
    if align == 0 {
        return b;
    }
    let m = (b + part_offset % align) % align;
    if m != 0 { b + align - m } else { b }
}

/// `ext2fs_new_inode`: inodes 1..=`last` are the only ones in use.
/// `Ok(None)` is its `EXT2_ET_INODE_ALLOC_FAIL`: every inode is taken.
fn new_inode(pl: &Planner, last: u32, start: u32) -> Result<Option<u32>, GeometryError> {
    let start = start.max(pl.first_ino);
    // mk_hugefiles searches from the parent's group, and the parent is
    // always the newest inode (or the root), so the search never starts
    // past the first free inode; the model relies on that.
    if start > last + 1 {
        return Err(unsupported("a directory in a group of its own"));
    }
    let ino = last + 1;
    Ok((ino <= pl.inodes_count).then_some(ino))
}

/// The longest name a directory entry holds (`EXT2_NAME_LEN`).
const NAME_LEN: usize = 255;

/// ext2fs_link stores only the low 8 bits of a longer name's length (the
/// whole name still written, `rec_len` sized for it), so mke2fs names the
/// entry by a truncated prefix (e2fsck then finds the huge files'
/// duplicates): such a name is refused, as a user would expect.
fn check_name_len(name: &[u8]) -> Result<(), GeometryError> {
    if name.len() > NAME_LEN {
        return Err(GeometryError::Invalid(format!(
            "mke2fs.conf hugefiles: the name '{}' is longer than {NAME_LEN} bytes \
             (mke2fs would store it truncated)",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// libext2fs's message for `EXT2_ET_INODE_ALLOC_FAIL`.
const INODE_ALLOC_FAIL: &str = "Could not allocate inode in ext2 filesystem";

fn pl_inline(pl: &Planner) -> bool {
    pl.features.incompat.contains(Incompat::INLINE_DATA)
}

/// Planning state of mk_hugefiles.
struct Hp<'a> {
    pl: &'a mut Planner,
    io: Io,
    last_ino: u32,
    dirs: Vec<HugeDir>,
    csum: bool,
}

impl Hp<'_> {
    fn iblk(&self, ino: u32) -> u64 {
        self.pl.inode_block(ino)
    }
    fn dir_index(&self, ino: u32) -> usize {
        self.dirs.iter().position(|d| d.ino == ino).unwrap_or(0)
    }
    fn limit(&self) -> u32 {
        self.pl.block_size - if self.csum { dir::TAIL_SIZE as u32 } else { 0 }
    }
    /// `ext2fs_link` without expanding: `Ok(false)` for
    /// `EXT2_ET_DIR_NO_SPACE`.
    fn link(&mut self, dir: u32, name: &[u8], ino: u32, ft: u8) -> bool {
        let d = self.dir_index(dir);
        let di = self.iblk(dir);
        // ext2fs_link, ext2fs_dir_iterate2's check and block_iterate3
        // each read the directory's inode.
        for _ in 0..3 {
            self.io.read_inode(dir, di);
        }
        let need = dir::rec_len(name.len()) as u32;
        if let Some(ents) = self.dirs[d].inline.as_mut() {
            // ext2fs_inline_data_dir_iterate: the area after `..` is one
            // "block" of 56 bytes; link_proc absorbs a free next entry only
            // when it starts 8 bytes (and a tail's size) before its end.
            let tail = if self.csum { dir::TAIL_SIZE as u32 } else { 0 };
            let before = INLINE_DIR_AREA.saturating_sub(8 + tail);
            let (changed, done) = link_entries(ents, need, name, ino, ft, before);
            if changed {
                self.io.write_inode(di);
            }
            return done;
        }
        if let Some(l) = self.dirs[d].map.leaf {
            // block_iterate3 goes down to the leaf before the first block.
            self.io.access(l, false);
        }
        for lb in 0..self.dirs[d].blocks.len() {
            let pblk = self.dirs[d].map.pblk(lb as u32).unwrap_or(0);
            self.io.access(pblk, false);
            let ents = &mut self.dirs[d].blocks[lb];
            let (changed, done) = link_entries(ents, need, name, ino, ft, u32::MAX);
            if changed {
                self.io.access(pblk, true);
            }
            if done {
                return true;
            }
        }
        false
    }
    /// `ext2fs_inline_data_expand` of an inline directory that is full:
    /// its entries move into a new block (the first free one), after `.`
    /// and `..`, the last one stretched to the block's end.
    fn expand_inline(&mut self, d: usize, ents: Vec<Dirent>) -> Result<(), GeometryError> {
        let dir = self.dirs[d].ino;
        let di = self.iblk(dir);
        // ext2fs_inline_data_expand's read and ea_get; i_block cleared and
        // written; ext2fs_inline_data_ea_remove (xattrs_read, then
        // xattrs_write); the inode read again.
        for _ in 0..2 {
            self.io.read_inode(dir, di);
        }
        self.io.write_inode(di);
        self.io.read_inode(dir, di);
        self.io.write_inode(di);
        self.io.read_inode(dir, di);
        // ext2fs_inline_data_dir_expand: ext2fs_new_block2 with goal 0,
        // the block written, ext2fs_bmap2(BMAP_SET) (the extent insert
        // writes the inode twice), ext2fs_write_inode.
        let b = self.pl.alloc_block(0, "hugefiles directory")?;
        self.io.access(b, true);
        self.io.write_inode(di);
        self.io.write_inode(di);
        self.io.write_inode(di);
        let limit = self.limit();
        let parent = self.dirs[d].parent;
        let mut block = Dirent::dots(dir, parent, 12);
        block.extend(ents);
        let used: u32 = block.iter().map(|e| e.rec_len).sum();
        if let Some(last) = block.last_mut() {
            last.rec_len += limit - used;
        }
        let hd = &mut self.dirs[d];
        hd.map.runs = vec![Run {
            lblk: 0,
            pblk: b,
            len: 1,
        }];
        hd.blocks = vec![block];
        Ok(())
    }
    /// `extent_node_split` of a directory's full in-inode root (the fifth
    /// extent's insert): one leaf block, at the first free block from the
    /// one before the first extent's, gets the four extents; the root keeps
    /// one index to it (and stale copies of extents 1..3, as the writer
    /// renders a `FileMap` with a leaf).
    fn split_dir_root(&mut self, d: usize) -> Result<(), GeometryError> {
        if self.pl.cluster_ratio() > 1 {
            return Err(unsupported(
                "a directory of more than 4 extents with bigalloc",
            ));
        }
        let di = self.iblk(self.dirs[d].ino);
        let first = self.dirs[d].map.runs.first().map_or(0, |r| r.pblk);
        let mut goal = first.wrapping_sub(1);
        if goal == 0 {
            // ext2fs_find_inode_goal: where logical block 0 is mapped.
            goal = first;
        }
        let l = self
            .pl
            .alloc_block(goal, "hugefiles directory extent block")?;
        // ext2fs_alloc_block3 writes the zeroed block, then the split
        // writes the node; the root is written (ext2fs_write_inode after
        // its update_path), the handle goes back down to the leaf, and the
        // inode is written with the new block counted.
        self.io.access(l, true);
        self.io.access(l, true);
        self.io.write_inode(di);
        self.io.write_inode(di);
        self.io.access(l, false);
        self.io.write_inode(di);
        self.dirs[d].map.leaf = Some(l);
        Ok(())
    }
    /// `ext2fs_expand_dir`: one empty block at the first free block after
    /// the directory's last one.
    fn expand(&mut self, dir: u32) -> Result<(), GeometryError> {
        let d = self.dir_index(dir);
        let di = self.iblk(dir);
        for _ in 0..3 {
            self.io.read_inode(dir, di);
        }
        // block_iterate3 cannot iterate an inline directory: the inline
        // data is expanded instead.
        if let Some(ents) = self.dirs[d].inline.take() {
            return self.expand_inline(d, ents);
        }
        let leaf = self.dirs[d].map.leaf;
        if let Some(l) = leaf {
            // ext2fs_find_inode_goal and block_iterate3 go down to the leaf.
            self.io.access(l, false);
        }
        let n = self.dirs[d].blocks.len() as u32;
        let goal = self.dirs[d].map.pblk(n - 1).unwrap_or(0);
        let ratio = self.pl.cluster_ratio();
        // bigalloc: expand_dir_proc takes the next block of the last
        // block's cluster without an allocation.
        let b = if ratio > 1 && (goal + 1) / ratio == goal / ratio {
            goal + 1
        } else {
            self.pl.alloc_block(goal, "hugefiles directory")?
        };
        self.io.access(b, true);
        if let Some(l) = leaf {
            // ext2fs_extent_set_bmap's gotos (and its look at the next and
            // previous leaf extents) read the leaf again.
            self.io.access(l, false);
        }
        let contiguous = matches!(self.dirs[d].map.runs.last(),
            Some(r) if r.pblk + u64::from(r.len) == b && r.len < EXT_INIT_MAX_LEN - 1);
        if contiguous {
            if let Some(r) = self.dirs[d].map.runs.last_mut() {
                r.len += 1;
            }
            // ext2fs_extent_replace: update_path writes the node.
            match leaf {
                Some(l) => self.io.access(l, true),
                None => self.io.write_inode(di),
            }
        } else {
            let runs = self.dirs[d].map.runs.len();
            let per_leaf = usize::from(extent::entries_per_block(self.pl.block_size));
            match leaf {
                None if runs >= usize::from(extent::ENTRIES_IN_INODE) => {
                    self.split_dir_root(d)?;
                }
                Some(_) if runs >= per_leaf => {
                    return Err(unsupported(&format!(
                        "a directory of more than {per_leaf} extents"
                    )));
                }
                _ => {}
            }
            self.dirs[d].map.runs.push(Run {
                lblk: n,
                pblk: b,
                len: 1,
            });
            // ext2fs_extent_insert: its extent_replace and its own
            // update_path each write the node.
            match self.dirs[d].map.leaf {
                Some(l) => {
                    self.io.access(l, true);
                    self.io.access(l, true);
                }
                None => {
                    self.io.write_inode(di);
                    self.io.write_inode(di);
                }
            }
        }
        if let Some(l) = self.dirs[d].map.leaf {
            // ext2fs_extent_fix_parents goes back down to the new extent
            // (and, right after the root's split, set_bmap's final goto
            // does too).
            self.io.access(l, false);
            if leaf.is_none() {
                self.io.access(l, false);
            }
        }
        self.io.write_inode(di);
        let limit = self.limit();
        self.dirs[d].blocks.push(vec![Dirent {
            ino: 0,
            name: Vec::new(),
            ft: 0,
            rec_len: limit,
        }]);
        self.io.read_inode(dir, di);
        self.io.write_inode(di);
        Ok(())
    }
}

/// mk_hugefiles over the planned filesystem (after the orphan file).
pub(super) fn plan_hugefiles(
    pl: &mut Planner,
    hp: &HugeParams,
    storage_zeroed: bool,
) -> Result<(), GeometryError> {
    let bs = pl.block_size;
    if !pl.features.incompat.contains(Incompat::EXTENTS) {
        // mk_hugefiles returns EXT2_ET_EXTENT_NOT_SUPPORTED before it
        // makes anything; mke2fs reports it and goes on.
        pl.l.hugefiles = Some(HugePlan {
            error: Some(
                "Operation not supported for inodes containing extents while creating huge files"
                    .into(),
            ),
            ..HugePlan::default()
        });
        return Ok(());
    }
    let csum = pl.features.ro_compat.contains(RoCompat::METADATA_CSUM);
    let last_ino = pl.last_used_ino();
    let root_blocks: Vec<u64> = (0..pl.root.blocks() as u32)
        .filter_map(|l| pl.root.pblk(l))
        .collect();
    // Unreachable from mke2fs's order: mk_hugefiles runs right after
    // create_root_dir and create_lost_and_found (populate_fs for -d comes
    // later), so the root holds only `.`, `..` and `lost+found`, in the one
    // block ext2fs_mkdir gave it (it is never inline: ext2fs_mkdir makes
    // inline directories only from the first non-reserved inode on). Kept
    // as a guard for the model's assumption.
    if root_blocks.len() != 1 {
        return Err(unsupported("a root directory of more than one block"));
    }
    let limit = bs - if csum { dir::TAIL_SIZE as u32 } else { 0 };
    let root = HugeDir {
        ino: 2,
        mode: 0,
        uid: 0,
        gid: 0,
        links: 3,
        map: pl.root.clone(),
        parent: 2,
        inline: None,
        was_inline: false,
        blocks: vec![{
            let mut b = Dirent::dots(2, 2, 12);
            b.push(Dirent {
                ino: 11,
                name: b"lost+found".to_vec(),
                ft: dir::FT_DIR,
                rec_len: limit - 24,
            });
            b
        }],
    };
    let it0 = pl.groups[0].inode_table;
    let mut h = Hp {
        pl,
        io: Io {
            trace: Vec::new(),
            icache: [0; 4],
            last: 0,
            buffer_blk: it0,
        },
        last_ino,
        dirs: vec![root],
        csum,
    };
    let mut plan = HugePlan {
        zero: hp.zero.unwrap_or(!storage_zeroed),
        ..HugePlan::default()
    };
    let finish = |h: Hp<'_>, mut plan: HugePlan| {
        plan.dirs = h.dirs;
        plan.trace = h.io.trace;
        h.pl.l.hugefiles = Some(plan);
    };
    // With inline_data ext2fs_mkdir makes inline directories: no block
    // until the first ext2fs_expand_dir (the root is no inline directory).
    let inline = pl_inline(h.pl);
    // create_directory: every non-empty component, a new directory.
    let mut dir = 2u32;
    for comp in hp.dir.split('/').filter(|c| !c.is_empty()) {
        let parent = dir;
        let (pgroup, _) = h.pl.inode_loc(parent);
        let start = pgroup * h.pl.inodes_per_group + 1;
        let Some(ino) = new_inode(h.pl, h.last_ino, start)? else {
            // create_directory fails; mk_hugefiles returns its error and
            // the directories made so far stay.
            plan.error = Some(format!("{INODE_ALLOC_FAIL} while creating huge files"));
            finish(h, plan);
            return Ok(());
        };
        check_name_len(comp.as_bytes())?;
        h.pl.new_inode_scan(start, ino);
        let pi = h.iblk(parent);
        let di = h.iblk(ino);
        let mut new_dir = HugeDir {
            ino,
            mode: 0o040000 | (0o777 & !hp.umask) as u16,
            uid: hp.uid,
            gid: hp.gid,
            links: 2,
            map: FileMap::default(),
            blocks: Vec::new(),
            parent,
            inline: None,
            was_inline: inline,
        };
        if inline {
            // ext2fs_new_dir_inline_data: one empty entry over the area.
            new_dir.inline = Some(vec![Dirent {
                ino: 0,
                name: Vec::new(),
                ft: 0,
                rec_len: INLINE_DIR_AREA,
            }]);
            h.io.read_inode(parent, pi);
            h.io.write_inode(di);
            // ext2fs_inline_data_init: the empty system.data attribute
            // (ext2fs_xattrs_read, then xattr_set's ext2fs_xattrs_write).
            h.io.read_inode(ino, di);
            h.io.write_inode(di);
        } else {
            let goal = h.pl.inode_goal(ino);
            let blk = h.pl.alloc_block(goal, "hugefiles directory")?;
            h.io.read_inode(parent, pi);
            h.io.write_inode(di);
            h.io.access(blk, true);
            h.io.write_inode(di);
            h.io.write_inode(di);
            new_dir.map.runs.push(Run {
                lblk: 0,
                pblk: blk,
                len: 1,
            });
            new_dir.blocks.push(Dirent::dots(ino, parent, limit - 12));
        }
        h.pl.use_inode(ino, true);
        h.last_ino = ino;
        h.dirs.push(new_dir);
        // ext2fs_lookup: every block of the parent read.
        for _ in 0..2 {
            h.io.read_inode(parent, pi);
        }
        let pd = h.dir_index(parent);
        for lb in 0..h.dirs[pd].blocks.len() as u32 {
            let b = h.dirs[pd].map.pblk(lb).unwrap_or(0);
            h.io.access(b, false);
        }
        if h.dirs[pd]
            .blocks
            .iter()
            .flatten()
            .chain(h.dirs[pd].inline.iter().flatten())
            .any(|e| e.ino != 0 && e.name == comp.as_bytes())
        {
            // ext2fs_mkdir fails with EXT2_ET_DIR_EXISTS after writing the
            // new inode and freeing it again, which e2fsck rejects.
            return Err(GeometryError::Invalid(format!(
                "mke2fs.conf hugefiles_dir: '{comp}' exists already (mke2fs would stop \
                 there and leave the filesystem inconsistent)"
            )));
        }
        if !h.link(parent, comp.as_bytes(), ino, dir::FT_DIR) {
            // ext2fs_link does not expand the directory and ext2fs_mkdir
            // gives up with EXT2_ET_DIR_NO_SPACE, freeing the inode it has
            // written already, which e2fsck rejects. Reached with
            // inline_data: a name of 49 bytes or more does not fit in the
            // 56 bytes of the parent's i_block (the root, with a block of
            // its own, always has room for a name of up to 255 bytes).
            return Err(GeometryError::Invalid(format!(
                "mke2fs.conf hugefiles_dir: '{comp}' does not fit in its parent directory \
                 (mke2fs would stop there with \"No free space in the directory\" and leave \
                 the filesystem inconsistent)"
            )));
        }
        h.io.read_inode(parent, pi);
        h.io.write_inode(pi);
        h.dirs[pd].links += 1;
        h.io.read_inode(ino, di);
        h.io.write_inode(di);
        dir = ino;
    }
    let fs_blocks = h.pl.free_blocks;
    // bigalloc: calc_overhead counts clusters of extent blocks.
    let ratio = h.pl.cluster_ratio();
    let overhead = |num: u64| calc_overhead(bs, num).wrapping_mul(ratio);
    let mut num_files = hp.num_files;
    let mut num_blocks = hp.num_blocks;
    let mut num_slack = hp.slack;
    let align = hp.align;
    if fs_blocks < num_slack.wrapping_add(align) {
        plan.error = Some("No space left on device while creating huge files".into());
        finish(h, plan);
        return Ok(());
    }
    let mut fs_blocks = fs_blocks - (num_slack + align);
    if num_blocks != 0 && num_blocks > fs_blocks {
        plan.error = Some("No space left on device while creating huge files".into());
        finish(h, plan);
        return Ok(());
    }
    if num_blocks == 0 && num_files == 0 {
        num_files = 1;
    }
    if num_files == 0 && num_blocks != 0 {
        num_files = fs_blocks / num_blocks;
        fs_blocks = fs_blocks.wrapping_sub(num_files / 16 + 1);
        fs_blocks = fs_blocks.wrapping_sub(overhead(num_blocks).wrapping_mul(num_files));
        num_files = fs_blocks / num_blocks;
    }
    if num_blocks == 0 && num_files > 1 {
        num_blocks = fs_blocks / num_files;
        fs_blocks = fs_blocks.wrapping_sub(num_files / 16 + 1);
        fs_blocks = fs_blocks.wrapping_sub(overhead(num_blocks).wrapping_mul(num_files));
        num_blocks = fs_blocks / num_files;
    }
    let each = if num_blocks != 0 {
        num_blocks
    } else {
        fs_blocks
    };
    num_slack = num_slack.wrapping_add(overhead(each).wrapping_mul(num_files));
    num_slack = num_slack.wrapping_add(num_files / 16 + 1);
    let blocks = h.pl.blocks_count;
    // get_start_block: leave `num_slack` free blocks at the start.
    let last_blk = blocks - 1;
    let mut blk = h.pl.first_data_block;
    let mut slack = num_slack;
    while slack > 0 {
        let b = h.pl.used.next_free(blk);
        if b > last_blk {
            break;
        }
        blk = b;
        let next = match h.pl.used.next_used(blk) {
            Some(n) if n <= last_blk => n,
            _ => last_blk,
        };
        if next - blk > slack {
            blk += slack;
            break;
        }
        slack -= next - blk;
        blk = next;
    }
    let mut goal = round_up_align(blk, align, hp.part_offset);
    if each > 0x8000_0000 / u64::from(bs) {
        h.pl.l.features.ro_compat.insert(RoCompat::LARGE_FILE);
    }
    let mut progress = format!("Creating {num_files} huge file(s) ");
    if num_blocks != 0 {
        progress.push_str(&format!("with {num_blocks} blocks each"));
    }
    progress.push_str(": ");
    plan.progress = Some(progress);
    for idx in 0..num_files {
        let Some(ino) = new_inode(h.pl, h.last_ino, 0)? else {
            // mk_hugefile fails before it writes anything: the files made
            // so far stay, the progress line gets no "done", and mke2fs
            // reports the error twice (mk_hugefiles, then main) and goes on.
            plan.error = Some(format!(
                "{INODE_ALLOC_FAIL} while creating huge file {idx}\n\
                 {INODE_ALLOC_FAIL} while creating huge files"
            ));
            break;
        };
        h.pl.new_inode_scan(0, ino);
        let fi = h.iblk(ino);
        h.io.write_inode(fi);
        h.pl.use_inode(ino, false);
        h.last_ino = ino;
        let mut tree = Tree::new(fi, bs);
        let mut lblk: u64 = 0;
        let mut left = if num_blocks != 0 { num_blocks } else { 1 };
        let mut count = 0u64;
        let mut data: Vec<Run> = Vec::new();
        while left > 0 {
            let end = h.pl.used.next_free(goal);
            if goal > last_blk || end > last_blk {
                // mke2fs leaves this file allocated but unlinked, with
                // neither size nor i_blocks: e2fsck rejects the result.
                return Err(GeometryError::Invalid(format!(
                    "mke2fs.conf hugefiles: huge file {idx} does not fit in the free space \
                     (mke2fs would leave it half-made and the filesystem inconsistent)"
                )));
            }
            goal = end;
            let bend = match h.pl.used.next_used(goal) {
                Some(b) if b <= last_blk => b,
                _ => {
                    if num_blocks == 0 {
                        left = 0;
                    }
                    blocks
                }
            };
            let n = if num_blocks == 0 || bend - goal < left {
                bend - goal
            } else {
                left
            };
            let mut pblk = goal;
            if num_blocks != 0 {
                left -= n;
            }
            goal += n;
            count += n;
            if ratio > 1 && (!pblk.is_multiple_of(ratio) || !n.is_multiple_of(ratio)) {
                // Blocks mapped off their cluster's offset or a file ending
                // inside a cluster: e2fsck rejects what mke2fs makes.
                return Err(GeometryError::Invalid(format!(
                    "mke2fs.conf hugefiles with bigalloc: huge file {idx} would not be \
                     cluster-aligned (e2fsck rejects what mke2fs makes); set hugefiles_align \
                     and hugefiles_size to multiples of the cluster size ({} KiB)",
                    ratio * u64::from(bs) / 1024
                )));
            }
            h.pl.take(pblk, n);
            if plan.zero {
                plan.zeroed.push((h.io.trace.len(), pblk, n));
            }
            let mut rem = n;
            while rem > 0 {
                let l = rem.min(u64::from(EXT_INIT_MAX_LEN));
                if lblk + l > u64::from(u32::MAX) {
                    // ee_block has 32 bits and ext2fs_extent_insert does not
                    // check it: mke2fs wraps the logical block numbers past
                    // 2^32 (and a file of exactly 2^32 blocks has an i_size
                    // past the extent format's limit); e2fsck rejects both.
                    return Err(GeometryError::Invalid(format!(
                        "mke2fs.conf hugefiles: huge file {idx} would have 2^32 blocks or more, \
                         past what an extent-mapped file can map (mke2fs makes it and e2fsck \
                         rejects the result); set hugefiles_size to at most {} blocks \
                         or num_hugefiles higher",
                        u32::MAX
                    )));
                }
                match data.last_mut() {
                    Some(r)
                        if r.pblk + u64::from(r.len) == pblk
                            && u64::from(r.len) + l <= u64::from(u32::MAX) =>
                    {
                        r.len += l as u32
                    }
                    _ => data.push(Run {
                        lblk: lblk as u32,
                        pblk,
                        len: l as u32,
                    }),
                }
                let e = slot(Extent::new(lblk as u32, l as u16, pblk).as_bytes());
                let level = tree.path.len() - 1;
                tree.insert(h.pl, &mut h.io, level, e)?;
                pblk += l;
                lblk += l;
                rem -= l;
            }
        }
        h.io.read_inode(ino, fi);
        h.io.write_inode(fi);
        let name = {
            let mut s = hp.name.clone();
            if hp.digits > 0 {
                s.push_str(&format!("{:0width$}", idx, width = hp.digits as usize));
            } else if num_files > 1 {
                s.push_str(&idx.to_string());
            }
            s.into_bytes()
        };
        check_name_len(&name)?;
        let size = count * u64::from(bs);
        if size >= 0x8000_0000 {
            h.pl.l.features.ro_compat.insert(RoCompat::LARGE_FILE);
        }
        while !h.link(dir, &name, ino, dir::FT_REG_FILE) {
            h.expand(dir)?;
        }
        let root = tree.nodes[0].bytes(60);
        let mut i_block = [0u8; 60];
        i_block.copy_from_slice(&root);
        let mut nodes = Vec::new();
        for n in &tree.nodes[1..] {
            nodes.push((n.pblk, n.bytes(bs as usize)));
        }
        plan.files.push(HugeFile {
            ino,
            mode: 0o100000 | (0o666 & !hp.umask) as u16,
            uid: hp.uid,
            gid: hp.gid,
            size,
            // ext2fs_iblk_add_blocks counts whole clusters: the data's
            // (rounded down) and one for each extent block.
            counted_blocks: (count / ratio + tree.splits) * ratio,
            i_block,
            nodes,
            data,
        });
    }
    finish(h, plan);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_and_alignment_like_mk_hugefiles() {
        assert_eq!(calc_overhead(4096, 4 * 32768), 0);
        // 5 extents: one leaf (169 extents each) and the levels above it.
        assert_eq!(calc_overhead(4096, 5 * 32768), 4);
        assert_eq!(round_up_align(10, 0, 3), 10);
        assert_eq!(round_up_align(10, 8, 0), 16);
        assert_eq!(round_up_align(10, 8, 3), 13);
        assert_eq!(round_up_align(13, 8, 3), 13);
    }
}
