//! Incremental extent-tree edits: the cost of a change is O(depth), as in
//! the kernel's `ext4_ext_insert_extent`, `ext4_ext_remove_space` and
//! friends, not the size of the tree.
//!
//! - **Path**: [`ExtentTree`] finds the leaf for a logical block by one
//!   root-to-leaf walk (every node checked by [`check_node`]: magic, depth,
//!   counts, checksum, key order, physical ranges).
//! - **Insert** ([`ExtentTree::insert`]) of a mapping into a hole: merged
//!   with its left or right neighbour in the leaf when they are contiguous
//!   logically and physically, in the same state and within 32768
//!   (written) / 32767 (unwritten) blocks (`ext4_can_extents_be_merged`);
//!   else put in the leaf, which splits when full as `ext4_ext_split`
//!   does (the entries after the insertion point go to a new block, an
//!   append at the end starts the new block with the new extent alone),
//!   the index entry going into the parent, which splits in turn; a full
//!   root moves its entries into a new block and becomes a one-entry index
//!   one level higher (`ext4_ext_grow_indepth`).
//! - **Remove** ([`ExtentTree::remove`]) of a range (punch, truncate): from
//!   the end, leaf by leaf, extents are dropped or trimmed (one split into
//!   two when the range is inside it); emptied leaves and index nodes are
//!   freed, and an emptied tree becomes an empty depth-0 root
//!   (`ext4_ext_rm_leaf`/`ext4_ext_rm_idx`).
//! - **Conversion** of unwritten parts (a write into a preallocated range,
//!   `ZERO_RANGE`) is a remove plus an insert of the same blocks in the new
//!   state: the extent splits into up to three, and the converted part
//!   merges with a neighbour in the same state (`ext4_split_extent`,
//!   `ext4_ext_convert_to_initialized`).
//! - **Keys**: when the first entry of a node changes, the keys of the
//!   index entries above it follow (`ext4_ext_correct_indexes`), so every
//!   index key equals its child's first key (e2fsck checks it).
//! - **Tidying** (beyond the kernel): a leaf or index node that an edit
//!   left at most half full is merged with a sibling when both fit in one
//!   block; a root whose children's entries fit in the inode takes them in
//!   and loses a level (the kernel's `ext4_ext_try_to_merge_up`, for any
//!   depth and number of children); a depth-1 tree (at most four leaves)
//!   is kept packed. Trees of depth 0 and 1 thus always satisfy e2fsck's
//!   pass 1E ("could be narrower/shorter"); deeper ones can get its offer
//!   after random edits, as the kernel's do (packing a whole level is not
//!   an O(depth) operation), so an edit that leaves a tree of depth ≥ 2
//!   notes the inode and `Filesystem::tidy_trees` rewrites the trees
//!   that rule flags, packed, at the next sync or close.
//!
//! Every block goes through [`TreeIo`] (the operations layer implements it
//! on a journal handle and the block allocator); checksums are set through
//! `ext4kit_format`'s checksum module. The root lives in the 60-byte
//! `i_block` copy the caller stores back into the inode;
//! [`ExtentTree::blocks_delta`] is the change of tree blocks for `i_blocks`.

use ext4kit_format::Csum;
use ext4kit_format::extent::{
    ENTRIES_IN_INODE, EXT_INIT_MAX_LEN, ExtentHeader, entries_per_block, set_block_checksum,
};
use zerocopy::IntoBytes;

use crate::FsError;
use crate::extent::{MAX_DEPTH, Mapping, NodeInfo, check_node, node_error};

/// Longest unwritten extent.
pub const UNWRITTEN_MAX: u32 = EXT_INIT_MAX_LEN - 1;

/// First logical block past the largest file (2^32).
pub const LBLK_END: u64 = 1 << 32;

/// Where the tree's blocks come from and go to.
pub trait TreeIo {
    /// The newest image of tree block `blk`.
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError>;
    /// Change tree block `blk` to `data` (`new`: a block just allocated).
    fn write(&mut self, blk: u64, data: &[u8], new: bool) -> Result<(), FsError>;
    /// One block for a new node, near `goal`.
    fn alloc(&mut self, goal: u64) -> Result<u64, FsError>;
    /// Free (and revoke) tree block `blk`.
    fn free(&mut self, blk: u64) -> Result<(), FsError>;
    /// The image of tree block `blk` as this edit last checked or wrote
    /// it, if it remembers one (it is then the newest image: nothing
    /// else changes the inode's tree while the edit owns it). Default:
    /// none, every read is checked.
    fn checked(&self, blk: u64) -> Option<Vec<u8>> {
        let _ = blk;
        None
    }
    /// Remember `data` as the checked (or just written) image of `blk`.
    fn note_checked(&self, blk: u64, data: &[u8]) {
        let _ = (blk, data);
    }
}

/// The inode and filesystem facts a tree edit needs.
#[derive(Clone, Copy, Debug)]
pub struct TreeParams {
    pub ino: u32,
    pub generation: u32,
    pub csum: Csum,
    pub block_size: u32,
    pub first_data_block: u64,
    pub blocks_count: u64,
    /// Blocks `i_size` covers (`ceil(i_size / block_size)`): where
    /// e2fsck's bounds of a deep tree's index entries end (see
    /// [`pack_bounds`]).
    pub eof_block: u64,
}

/// Credits one insert or remove of a single piece may take at `depth`
/// (nodes outside the inode): the path, a split at every level, a new
/// root block, a sibling merge per level, and slack; the
/// `ext4_ext_calc_credits_for_single_extent` of this engine.
pub fn single_extent_credits(depth: u16) -> u32 {
    let d = u32::from(depth) + 1;
    3 * d + 2
}

/// Would e2fsck's pass 1E offer to rebuild a tree with these nodes
/// (`e2fsck_should_rebuild_extents`: "could be narrower" or "could be
/// shallower")? Per level from the root: the entries and the room summed
/// over its nodes, a non-root node that is not full counting one entry
/// less (e2fsck's allowance for the kernel's append splits). A level
/// whose free room exceeds one block's worth of entries could lose a
/// node; a level whose entries would fit in the room of a level above
/// could go. `nodes`: every node of the tree, the root (`pblk` 0)
/// included; `block_size`: the filesystem's.
pub fn tree_wants_rebuild(nodes: &[NodeInfo], block_size: u32) -> bool {
    let Some(root) = nodes.iter().find(|n| n.pblk == 0) else {
        return false;
    };
    let depth = usize::from(root.depth);
    if depth == 0 {
        return false;
    }
    let per = usize::from(entries_per_block(block_size));
    let mut num = vec![0usize; depth + 1];
    let mut max = vec![0usize; depth + 1];
    for n in nodes {
        let Some(level) = depth.checked_sub(usize::from(n.depth)) else {
            continue;
        };
        let (e, m) = (usize::from(n.entries), usize::from(n.max));
        num[level] += e;
        max[level] += m;
        if level > 0 && e < m {
            max[level] -= 1;
        }
    }
    (0..=depth).any(|i| max[i].saturating_sub(num[i]) > per || (0..i).any(|j| num[i] < max[j]))
}

/// Cut `keys.len()` entries (keys ascending) into `ceil(n / per)` nodes
/// of `per` entries, all full but one: `(start, end)` of each. From the
/// front (the last node not full) unless a node would then start past
/// `eof` (the blocks `i_size` covers) while packing from the back (the
/// first node not full) keeps every node's start at or before it.
///
/// Why: e2fsck's pass 1 (`scan_extent_node`) gives an index entry the
/// range up to the next key, the last entry of a node the range its
/// parent gave the node, and the root's last entry the range up to
/// `eof`; an entry of a non-root node ending past its node's range is
/// "end of extent exceeds allowed value" (uninit *extents* past `eof`
/// are allowed, index entries never are). So in a tree of depth 2 or
/// more, a leaf starting past `eof` (a `KEEP_SIZE` preallocation that
/// spans a leaf boundary) is refused in the rightmost index node (the
/// kernel's trees have the same problem: e2fsprogs issue 145). Keeping
/// every extent past `eof` in the leaf that starts at or before it
/// avoids it whenever they fit in one leaf.
pub fn pack_bounds(keys: &[u64], per: usize, eof: u64) -> Vec<(usize, usize)> {
    let n = keys.len();
    let per = per.max(1);
    let need = n.div_ceil(per);
    let front: Vec<(usize, usize)> = (0..need)
        .map(|i| (i * per, ((i + 1) * per).min(n)))
        .collect();
    let ok = |v: &[(usize, usize)]| v.iter().all(|&(s, _)| s == 0 || keys[s] <= eof);
    if ok(&front) {
        return front;
    }
    let first = n - (need - 1) * per;
    let back: Vec<(usize, usize)> = (0..need)
        .map(|i| match i {
            0 => (0, first),
            _ => (first + (i - 1) * per, first + i * per),
        })
        .collect();
    if ok(&back) { back } else { front }
}

fn mergeable(a: &Mapping, b: &Mapping) -> bool {
    let max = if a.unwritten {
        UNWRITTEN_MAX
    } else {
        EXT_INIT_MAX_LEN
    };
    a.end() == b.lblk
        && a.pblk + u64::from(a.len) == b.pblk
        && a.unwritten == b.unwritten
        && a.len + b.len <= max
}

/// The part of `m` inside `[a, b)` (which must overlap it).
fn clip(m: &Mapping, a: u64, b: u64) -> Mapping {
    let s = m.lblk.max(a);
    let e = m.end().min(b);
    Mapping {
        lblk: s,
        pblk: m.pblk + (s - m.lblk),
        len: (e - s) as u32,
        unwritten: m.unwritten,
    }
}

type Entry = [u8; 12];

fn ext_entry(m: &Mapping) -> Entry {
    let len = m.len as u16
        + if m.unwritten {
            EXT_INIT_MAX_LEN as u16
        } else {
            0
        };
    let mut e = [0u8; 12];
    e[0..4].copy_from_slice(&(m.lblk as u32).to_le_bytes());
    e[4..6].copy_from_slice(&len.to_le_bytes());
    e[6..8].copy_from_slice(&((m.pblk >> 32) as u16).to_le_bytes());
    e[8..12].copy_from_slice(&(m.pblk as u32).to_le_bytes());
    e
}

fn idx_entry(key: u32, child: u64) -> Entry {
    let mut e = [0u8; 12];
    e[0..4].copy_from_slice(&key.to_le_bytes());
    e[4..8].copy_from_slice(&(child as u32).to_le_bytes());
    e[8..10].copy_from_slice(&((child >> 32) as u16).to_le_bytes());
    e
}

/// One node: the root (`pblk == 0`, the inode's 60 bytes) or a block.
#[derive(Clone, Debug)]
struct Node {
    pblk: u64,
    buf: Vec<u8>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

impl Node {
    fn entries(&self) -> usize {
        usize::from(u16_at(&self.buf, 2))
    }
    fn max(&self) -> usize {
        usize::from(u16_at(&self.buf, 4))
    }
    fn depth(&self) -> u16 {
        u16_at(&self.buf, 6)
    }
    fn set_header(&mut self, entries: usize, max: usize, depth: u16) {
        let h = ExtentHeader::new(entries as u16, max as u16, depth);
        self.buf[..12].copy_from_slice(h.as_bytes());
    }
    fn set_entries(&mut self, n: usize) {
        self.buf[2..4].copy_from_slice(&(n as u16).to_le_bytes());
    }
    fn ent(&self, i: usize) -> Entry {
        let mut e = [0u8; 12];
        e.copy_from_slice(&self.buf[12 + 12 * i..24 + 12 * i]);
        e
    }
    fn set_ent(&mut self, i: usize, e: &Entry) {
        self.buf[12 + 12 * i..24 + 12 * i].copy_from_slice(e);
    }
    fn key(&self, i: usize) -> u32 {
        u32_at(&self.buf, 12 + 12 * i)
    }
    fn set_key(&mut self, i: usize, k: u32) {
        self.buf[12 + 12 * i..16 + 12 * i].copy_from_slice(&k.to_le_bytes());
    }
    fn child(&self, i: usize) -> u64 {
        let o = 12 + 12 * i;
        u64::from(u32_at(&self.buf, o + 4)) | (u64::from(u16_at(&self.buf, o + 8)) << 32)
    }
    fn ext(&self, i: usize) -> Mapping {
        let o = 12 + 12 * i;
        let raw = u32::from(u16_at(&self.buf, o + 4));
        let (len, unwritten) = if raw > EXT_INIT_MAX_LEN {
            (raw - EXT_INIT_MAX_LEN, true)
        } else {
            (raw, false)
        };
        Mapping {
            lblk: u64::from(u32_at(&self.buf, o)),
            pblk: u64::from(u32_at(&self.buf, o + 8)) | (u64::from(u16_at(&self.buf, o + 6)) << 32),
            len,
            unwritten,
        }
    }
    fn set_ext(&mut self, i: usize, m: &Mapping) {
        self.set_ent(i, &ext_entry(m));
    }
    fn all(&self) -> Vec<Entry> {
        (0..self.entries()).map(|i| self.ent(i)).collect()
    }
    fn set_all(&mut self, v: &[Entry]) {
        for (i, e) in v.iter().enumerate() {
            self.set_ent(i, e);
        }
        let n = v.len();
        let end = (12 + 12 * self.max()).min(self.buf.len());
        self.buf[(12 + 12 * n).min(end)..end].fill(0);
        self.set_entries(n);
    }
    fn insert(&mut self, i: usize, e: &Entry) {
        let n = self.entries();
        self.buf.copy_within(12 + 12 * i..12 + 12 * n, 24 + 12 * i);
        self.set_ent(i, e);
        self.set_entries(n + 1);
    }
    fn remove(&mut self, i: usize) {
        let n = self.entries();
        self.buf.copy_within(24 + 12 * i..12 + 12 * n, 12 + 12 * i);
        self.buf[12 * n..12 + 12 * n].fill(0);
        self.set_entries(n - 1);
    }
}

/// One level of a path: the node and the entry taken (index nodes), or
/// the insertion point (leaves: how many extents start at or before the
/// block looked for).
#[derive(Clone, Debug)]
struct Step {
    node: Node,
    pos: usize,
}

type Path = Vec<Step>;

/// An inode's extent tree being edited (see the module docs).
pub struct ExtentTree<'a> {
    io: &'a mut dyn TreeIo,
    p: TreeParams,
    root: [u8; 60],
    per_block: usize,
    /// Tree blocks allocated minus freed by these edits.
    pub blocks_delta: i64,
    /// Goal for new tree blocks (the data being mapped); 0: none.
    pub goal: u64,
    /// The blocks `i_size` will cover once the edit in progress is done
    /// (a written extent lies inside them): splits and repacks keep node
    /// starts at or before it ([`pack_bounds`]).
    eof: u64,
}

impl<'a> ExtentTree<'a> {
    /// Edit the tree whose root is `i_block` (an inode with `EXTENTS_FL`).
    pub fn new(io: &'a mut dyn TreeIo, p: TreeParams, i_block: &[u8; 60]) -> Result<Self, FsError> {
        let t = ExtentTree {
            io,
            p,
            root: *i_block,
            per_block: usize::from(entries_per_block(p.block_size)),
            blocks_delta: 0,
            goal: 0,
            eof: p.eof_block,
        };
        check_node(&t.root, 0, None, p.ino, p.generation, None)?;
        Ok(t)
    }

    /// The root as it is now (the inode's new `i_block`).
    pub fn root(&self) -> &[u8; 60] {
        &self.root
    }

    /// Depth of the tree (0: the extents are in the inode).
    pub fn depth(&self) -> u16 {
        u16_at(&self.root, 6)
    }

    fn bad(&self, pblk: u64, d: impl std::fmt::Display) -> FsError {
        node_error(self.p.ino, pblk, d)
    }

    fn csum(&self) -> Option<&Csum> {
        self.p.csum.metadata.then_some(&self.p.csum)
    }

    /// Read and check node `pblk` of depth `depth`: the header, the key
    /// order, extents' lengths and physical ranges, children's ranges.
    fn read_node(&self, pblk: u64, depth: u16) -> Result<Node, FsError> {
        if pblk < self.p.first_data_block || pblk >= self.p.blocks_count {
            return Err(self.bad(pblk, "an index points outside the filesystem"));
        }
        if let Some(buf) = self.io.checked(pblk) {
            // Checked (or written) by this edit before: its checksum and
            // entries are known good; only the depth is the caller's.
            check_node(&buf, pblk, Some(depth), self.p.ino, self.p.generation, None)?;
            return Ok(Node { pblk, buf });
        }
        let buf = self.io.read(pblk)?;
        if buf.len() != self.p.block_size as usize {
            return Err(self.bad(pblk, "short block"));
        }
        check_node(
            &buf,
            pblk,
            Some(depth),
            self.p.ino,
            self.p.generation,
            self.csum(),
        )?;
        let node = Node { pblk, buf };
        self.check_entries(&node)?;
        self.io.note_checked(pblk, &node.buf);
        Ok(node)
    }

    fn check_entries(&self, node: &Node) -> Result<(), FsError> {
        let n = node.entries();
        let leaf = node.depth() == 0;
        let mut prev_end = 0u64;
        for i in 0..n {
            let k = u64::from(node.key(i));
            if i > 0 && k < prev_end {
                return Err(self.bad(node.pblk, format!("entry {i} is out of order")));
            }
            if leaf {
                let m = node.ext(i);
                let ok = m.len > 0
                    && m.pblk >= self.p.first_data_block
                    && m.pblk + u64::from(m.len) <= self.p.blocks_count;
                if !ok {
                    return Err(self.bad(
                        node.pblk,
                        format!(
                            "extent {i} ({}+{} at {}) is empty or outside the filesystem",
                            m.lblk, m.len, m.pblk
                        ),
                    ));
                }
                prev_end = m.end();
            } else {
                prev_end = k + 1;
            }
        }
        Ok(())
    }

    fn root_node(&self) -> Result<Node, FsError> {
        let node = Node {
            pblk: 0,
            buf: self.root.to_vec(),
        };
        check_node(&node.buf, 0, None, self.p.ino, self.p.generation, None)?;
        self.check_entries(&node)?;
        Ok(node)
    }

    /// The path from the root to the leaf where `lblk` is or would be.
    fn find(&self, lblk: u64) -> Result<Path, FsError> {
        let mut path = Vec::new();
        let mut node = self.root_node()?;
        loop {
            let n = node.entries();
            // Entries whose key is at or before lblk.
            let (mut lo, mut hi) = (0usize, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if u64::from(node.key(mid)) <= lblk {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let d = node.depth();
            if d == 0 {
                path.push(Step { node, pos: lo });
                return Ok(path);
            }
            let pos = lo.saturating_sub(1);
            let child = node.child(pos);
            path.push(Step { node, pos });
            if path.len() > usize::from(MAX_DEPTH) {
                return Err(self.bad(child, "the tree is deeper than the kernel allows"));
            }
            node = self.read_node(child, d - 1)?;
        }
    }

    fn store(&mut self, node: &mut Node) -> Result<(), FsError> {
        self.write_node(node, false)
    }

    fn write_node(&mut self, node: &mut Node, new: bool) -> Result<(), FsError> {
        if node.pblk == 0 {
            self.root.copy_from_slice(&node.buf[..60]);
            return Ok(());
        }
        if let Some(c) = self.csum() {
            let c = *c;
            set_block_checksum(&mut node.buf, self.p.ino, self.p.generation, &c);
        }
        self.io.write(node.pblk, &node.buf, new)?;
        self.io.note_checked(node.pblk, &node.buf);
        Ok(())
    }

    fn new_node(&mut self, near: u64, depth: u16, entries: &[Entry]) -> Result<Node, FsError> {
        let goal = if near != 0 { near } else { self.goal };
        let blk = self.io.alloc(goal)?;
        self.blocks_delta += 1;
        let mut node = Node {
            pblk: blk,
            buf: vec![0u8; self.p.block_size as usize],
        };
        node.set_header(0, self.per_block, depth);
        node.set_all(entries);
        self.write_node(&mut node, true)?;
        Ok(node)
    }

    fn free_node(&mut self, pblk: u64) -> Result<(), FsError> {
        self.io.free(pblk)?;
        self.blocks_delta -= 1;
        Ok(())
    }

    /// The first key of the node at `level` changed: the index keys above
    /// it follow (`ext4_ext_correct_indexes`).
    fn correct_keys(&mut self, path: &mut Path, level: usize) -> Result<(), FsError> {
        if path[level].node.entries() == 0 {
            return Ok(());
        }
        let k = path[level].node.key(0);
        for l in (0..level).rev() {
            let pos = path[l].pos;
            if path[l].node.key(pos) == k {
                break;
            }
            path[l].node.set_key(pos, k);
            let mut n = path[l].node.clone();
            self.store(&mut n)?;
            path[l].node = n;
            if pos != 0 {
                break;
            }
        }
        Ok(())
    }

    /// Put `e` at `pos` of the node at `level`, splitting it (and its
    /// ancestors) or growing the tree as needed.
    fn insert_entry(
        &mut self,
        path: &mut Path,
        level: usize,
        pos: usize,
        e: Entry,
    ) -> Result<(), FsError> {
        let node = &path[level].node;
        if node.entries() < node.max() {
            let mut n = node.clone();
            n.insert(pos, &e);
            self.store(&mut n)?;
            path[level].node = n;
            if pos == 0 && level > 0 {
                self.correct_keys(path, level)?;
            }
            return Ok(());
        }
        if level == 0 {
            self.grow(path)?;
            return self.insert_entry(path, 1, pos, e);
        }
        // Split: the entries after the insertion point go to a new node;
        // an append at the end starts the new node alone (ext4_ext_split).
        let mut all = node.all();
        let n = all.len();
        all.insert(pos, e);
        let mut keep = if pos == n { n } else { pos + 1 };
        if node.depth() == 0 && u64::from(u32_at(&all[keep], 0)) > self.eof {
            // The new leaf would start past i_size's blocks: start it at
            // the last extent at or before them instead, so the extents
            // past them stay in a leaf that starts inside (pack_bounds).
            let inside = all.partition_point(|x| u64::from(u32_at(x, 0)) <= self.eof);
            if inside >= 2 {
                keep = inside - 1;
            }
        }
        let right = all.split_off(keep);
        let depth = node.depth();
        let near = node.pblk + 1;
        let new = self.new_node(near, depth, &right)?;
        let mut old = path[level].node.clone();
        old.set_all(&all);
        self.store(&mut old)?;
        path[level].node = old;
        if pos == 0 {
            self.correct_keys(path, level)?;
        }
        let ppos = path[level - 1].pos + 1;
        self.insert_entry(path, level - 1, ppos, idx_entry(new.key(0), new.pblk))
    }

    /// The root is full: its entries move to a new block, the root becomes
    /// a one-entry index node one level higher (`ext4_ext_grow_indepth`).
    fn grow(&mut self, path: &mut Path) -> Result<(), FsError> {
        let root = path[0].node.clone();
        let d = root.depth();
        if d >= MAX_DEPTH {
            return Err(FsError::InvalidRequest(format!(
                "inode {}: the extent tree would be deeper than {MAX_DEPTH}",
                self.p.ino
            )));
        }
        let entries = root.all();
        let first = entries.first().map_or(0, |e| u32_at(e, 0));
        let b = self.new_node(0, d, &entries)?;
        let mut r = root;
        r.set_header(1, usize::from(ENTRIES_IN_INODE), d + 1);
        r.set_all(&[idx_entry(first, b.pblk)]);
        self.store(&mut r)?;
        let old_pos = path[0].pos;
        path[0] = Step { node: r, pos: 0 };
        path.insert(
            1,
            Step {
                node: b,
                pos: old_pos,
            },
        );
        Ok(())
    }

    /// The extent mapping `lblk`, if any.
    pub fn lookup(&self, lblk: u64) -> Result<Option<Mapping>, FsError> {
        let path = self.find(lblk)?;
        let s = &path[path.len() - 1];
        if s.pos == 0 {
            return Ok(None);
        }
        let m = s.node.ext(s.pos - 1);
        Ok((m.end() > lblk).then_some(m))
    }

    /// A goal for a new block at logical `lblk` (`ext4_ext_find_goal`):
    /// next to the nearest extent of its leaf, else the leaf block.
    pub fn goal_for(&self, lblk: u64) -> Result<Option<u64>, FsError> {
        let path = self.find(lblk)?;
        let s = &path[path.len() - 1];
        if s.pos > 0 {
            let m = s.node.ext(s.pos - 1);
            return Ok(Some(m.pblk + (lblk - m.lblk)));
        }
        if s.node.entries() > 0 {
            let m = s.node.ext(0);
            return Ok(Some(m.pblk.saturating_sub(m.lblk - lblk).max(1)));
        }
        Ok((s.node.pblk != 0).then_some(s.node.pblk))
    }

    /// The extents overlapping `[a, b)`, whole, in logical order.
    pub fn range(&self, a: u64, b: u64) -> Result<Vec<Mapping>, FsError> {
        let mut out = Vec::new();
        let mut at = a;
        while at < b {
            let path = self.find(at)?;
            let s = &path[path.len() - 1];
            for i in s.pos.saturating_sub(1)..s.node.entries() {
                let m = s.node.ext(i);
                if m.lblk >= b {
                    return Ok(out);
                }
                if m.end() > at {
                    out.push(m);
                }
            }
            match next_leaf_key(&path) {
                Some(k) if k > at => at = k,
                _ => break,
            }
        }
        Ok(out)
    }

    /// Extents overlapping `[a, b)` from the end backwards, whole, each
    /// with the number of distinct tree blocks read to reach it, leaf by
    /// leaf until that number would pass `max_blocks` (the first leaf is
    /// always taken). The flag tells whether the whole range was seen.
    #[allow(clippy::type_complexity)]
    pub fn range_back(
        &self,
        a: u64,
        b: u64,
        max_blocks: usize,
    ) -> Result<(Vec<(Mapping, usize)>, bool), FsError> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        let mut hi = b.min(LBLK_END);
        while hi > a {
            let path = self.find(hi - 1)?;
            seen.extend(path.iter().map(|s| s.node.pblk).filter(|&p| p != 0));
            if seen.len() > max_blocks && !out.is_empty() {
                return Ok((out, false));
            }
            let ll = path.len() - 1;
            let s = &path[ll];
            for i in (0..s.node.entries()).rev() {
                let m = s.node.ext(i);
                if m.end() <= a {
                    return Ok((out, true));
                }
                if m.lblk < hi {
                    out.push((m, seen.len()));
                }
            }
            let lo = leaf_low(&path, hi - 1);
            if lo == 0 || lo <= a {
                break;
            }
            hi = lo;
        }
        Ok((out, true))
    }

    /// Map `m` (which must lie in a hole), merging with a neighbour when
    /// possible.
    pub fn insert(&mut self, m: &Mapping) -> Result<(), FsError> {
        if m.len == 0
            || m.end() > LBLK_END
            || m.len
                > if m.unwritten {
                    UNWRITTEN_MAX
                } else {
                    EXT_INIT_MAX_LEN
                }
        {
            return Err(FsError::InvalidRequest(format!(
                "inode {}: extent {}+{} cannot be mapped",
                self.p.ino, m.lblk, m.len
            )));
        }
        if self.goal == 0 {
            self.goal = m.pblk;
        }
        // Data written in `m` makes `i_size` reach its end.
        self.eof = if m.unwritten {
            self.p.eof_block
        } else {
            self.p.eof_block.max(m.end())
        };
        let mut path = self.find(m.lblk)?;
        let ll = path.len() - 1;
        let pos = path[ll].pos;
        let leaf = &path[ll].node;
        let n = leaf.entries();
        let left = (pos > 0).then(|| leaf.ext(pos - 1));
        let right = (pos < n).then(|| leaf.ext(pos));
        if left.is_some_and(|l| l.end() > m.lblk) || right.is_some_and(|r| r.lblk < m.end()) {
            return Err(FsError::InvalidRequest(format!(
                "inode {}: extent {}+{} overlaps a mapped range",
                self.p.ino, m.lblk, m.len
            )));
        }
        if let Some(mut l) = left.filter(|l| mergeable(l, m)) {
            let mut leaf = leaf.clone();
            l.len += m.len;
            let both = right.filter(|r| mergeable(&l, r));
            match both {
                Some(r) => {
                    l.len += r.len;
                    leaf.set_ext(pos - 1, &l);
                    leaf.remove(pos);
                }
                None => leaf.set_ext(pos - 1, &l),
            }
            self.store(&mut leaf)?;
            path[ll].node = leaf;
            if both.is_some() && ll > 0 {
                // The leaf lost an entry: it may fit with a sibling now.
                self.merge_siblings(&mut path, ll)?;
            }
        } else if let Some(mut r) = right.filter(|r| mergeable(m, r)) {
            let mut leaf = leaf.clone();
            r.lblk = m.lblk;
            r.pblk = m.pblk;
            r.len += m.len;
            leaf.set_ext(pos, &r);
            self.store(&mut leaf)?;
            path[ll].node = leaf;
            if pos == 0 {
                self.correct_keys(&mut path, ll)?;
            }
        } else {
            self.insert_entry(&mut path, ll, pos, ext_entry(m))?;
        }
        self.collapse_root()
    }

    /// Unmap `[a, b)`; returns the pieces unmapped (the caller frees their
    /// blocks, or maps them again in another state).
    pub fn remove(&mut self, a: u64, b: u64) -> Result<Vec<Mapping>, FsError> {
        self.eof = self.p.eof_block;
        let mut removed = Vec::new();
        let mut hi = b.min(LBLK_END);
        while hi > a {
            let mut path = self.find(hi - 1)?;
            let ll = path.len() - 1;
            let lo = leaf_low(&path, hi - 1);
            let mut leaf = path[ll].node.clone();
            let first = (leaf.entries() > 0).then(|| leaf.key(0));
            let mut changed = false;
            let mut split_right = None;
            let mut i = leaf.entries();
            while i > 0 {
                i -= 1;
                let e = leaf.ext(i);
                if e.end() <= a {
                    break;
                }
                if e.lblk >= hi {
                    continue;
                }
                changed = true;
                let (s, t) = (e.lblk.max(a), e.end().min(hi));
                removed.push(clip(&e, s, t));
                match (e.lblk < s, e.end() > t) {
                    (true, true) => {
                        leaf.set_ext(i, &clip(&e, e.lblk, s));
                        split_right = Some(clip(&e, t, e.end()));
                    }
                    (true, false) => leaf.set_ext(i, &clip(&e, e.lblk, s)),
                    (false, true) => leaf.set_ext(i, &clip(&e, t, e.end())),
                    (false, false) => leaf.remove(i),
                }
            }
            if changed {
                if leaf.entries() == 0 && ll > 0 {
                    path[ll].node = leaf;
                    self.drop_node(&mut path, ll)?;
                } else {
                    self.store(&mut leaf)?;
                    let now_first = (leaf.entries() > 0).then(|| leaf.key(0));
                    path[ll].node = leaf;
                    if now_first != first {
                        self.correct_keys(&mut path, ll)?;
                    }
                    if ll > 0 {
                        self.merge_siblings(&mut path, ll)?;
                    }
                }
            }
            if let Some(r) = split_right {
                // Never merges: the hole just made separates it.
                self.insert(&r)?;
                break;
            }
            if lo == 0 || lo <= a {
                break;
            }
            hi = lo;
        }
        self.collapse_root()?;
        removed.reverse();
        Ok(removed)
    }

    /// The node at `level` (not the root) is empty: free it and drop its
    /// index entry, up the tree as far as nodes empty (an emptied root
    /// becomes an empty leaf of depth 0).
    fn drop_node(&mut self, path: &mut Path, level: usize) -> Result<(), FsError> {
        let pblk = path[level].node.pblk;
        self.free_node(pblk)?;
        let parent = level - 1;
        let ppos = path[parent].pos;
        let mut pn = path[parent].node.clone();
        pn.remove(ppos);
        if pn.entries() == 0 {
            if parent == 0 {
                pn.set_header(0, usize::from(ENTRIES_IN_INODE), 0);
                pn.set_all(&[]);
                self.store(&mut pn)?;
                path[0].node = pn;
                path.truncate(1);
                return Ok(());
            }
            path[parent].node = pn;
            return self.drop_node(path, parent);
        }
        self.store(&mut pn)?;
        path[parent].node = pn;
        path[parent].pos = ppos.min(path[parent].node.entries() - 1);
        if ppos == 0 {
            self.correct_keys(path, parent)?;
        }
        if parent > 0 {
            self.merge_siblings(path, parent)?;
        }
        Ok(())
    }

    /// A node (not the root) at most half full after a removal: merge it
    /// with its right or left sibling when both fit in one block; the
    /// parent loses an entry and is looked at in turn.
    fn merge_siblings(&mut self, path: &mut Path, level: usize) -> Result<(), FsError> {
        let node = &path[level].node;
        if node.entries() * 2 > node.max() {
            return Ok(());
        }
        let parent = level - 1;
        let pos = path[parent].pos;
        let pcount = path[parent].node.entries();
        let depth = node.depth();
        // (left position in the parent, left node, right node)
        let mut pair = None;
        if pos + 1 < pcount {
            let r = self.read_node(path[parent].node.child(pos + 1), depth)?;
            if r.entries() + node.entries() <= node.max().min(r.max()) {
                pair = Some((pos, node.clone(), r));
            }
        }
        if pair.is_none() && pos > 0 {
            let l = self.read_node(path[parent].node.child(pos - 1), depth)?;
            if l.entries() + node.entries() <= node.max().min(l.max()) {
                pair = Some((pos - 1, l, node.clone()));
            }
        }
        let Some((lpos, mut left, right)) = pair else {
            return Ok(());
        };
        let mut all = left.all();
        all.extend(right.all());
        left.set_all(&all);
        self.store(&mut left)?;
        self.free_node(right.pblk)?;
        let mut pn = path[parent].node.clone();
        pn.remove(lpos + 1);
        self.store(&mut pn)?;
        path[parent].node = pn;
        path[parent].pos = lpos;
        path.truncate(level);
        path.push(Step { node: left, pos: 0 });
        if parent > 0 {
            self.merge_siblings(path, parent)?;
        }
        Ok(())
    }

    /// While the root's children hold at most as many entries as the
    /// inode does, take them into the root (one level less). A depth-1
    /// tree (at most four leaves: bounded) is kept packed: its extents in
    /// as few leaves as they need, the last one the only one not full, as
    /// e2fsck's pass 1E wants a tree.
    fn collapse_root(&mut self) -> Result<(), FsError> {
        loop {
            let root = self.root_node()?;
            let d = root.depth();
            if d == 0 {
                return Ok(());
            }
            let mut kids = Vec::new();
            let mut total = 0;
            for i in 0..root.entries() {
                let c = self.read_node(root.child(i), d - 1)?;
                total += c.entries();
                if total > usize::from(ENTRIES_IN_INODE) && d > 1 {
                    return Ok(());
                }
                kids.push(c);
            }
            if total > usize::from(ENTRIES_IN_INODE) {
                return self.repack_leaves(root, kids);
            }
            let all: Vec<Entry> = kids.iter().flat_map(|k| k.all()).collect();
            for k in &kids {
                self.free_node(k.pblk)?;
            }
            let mut r = root;
            r.set_header(0, usize::from(ENTRIES_IN_INODE), d - 1);
            r.set_all(&all);
            self.store(&mut r)?;
        }
    }

    /// Pack the leaves of a depth-1 tree (`kids`, in order) if they are not.
    fn repack_leaves(&mut self, root: Node, kids: Vec<Node>) -> Result<(), FsError> {
        let total: usize = kids.iter().map(Node::entries).sum();
        let per = kids.iter().map(Node::max).min().unwrap_or(self.per_block);
        let need = total.div_ceil(per);
        if kids.len() <= need {
            return Ok(());
        }
        let all: Vec<Entry> = kids.iter().flat_map(|k| k.all()).collect();
        let keys: Vec<u64> = all.iter().map(|e| u64::from(u32_at(e, 0))).collect();
        let bounds = pack_bounds(&keys, per, self.eof);
        let mut index = Vec::with_capacity(need);
        for (k, &(s, e)) in kids.iter().zip(&bounds) {
            let mut n = k.clone();
            n.set_all(&all[s..e]);
            self.store(&mut n)?;
            index.push(idx_entry(n.key(0), n.pblk));
        }
        for k in &kids[index.len()..] {
            self.free_node(k.pblk)?;
        }
        let mut r = root;
        r.set_all(&index);
        self.store(&mut r)
    }

    /// Every extent in order (tests, small trees).
    pub fn all(&self) -> Result<Vec<Mapping>, FsError> {
        self.range(0, LBLK_END)
    }
}

/// The first key of the leaf after the path's, if any
/// (`ext4_ext_next_leaf_block`).
fn next_leaf_key(path: &Path) -> Option<u64> {
    let ll = path.len() - 1;
    (0..ll).rev().find_map(|l| {
        let s = &path[l];
        (s.pos + 1 < s.node.entries()).then(|| u64::from(s.node.key(s.pos + 1)))
    })
}

/// The lowest logical block the path's leaf covers (0 for the leftmost
/// leaf), below `at`.
fn leaf_low(path: &Path, at: u64) -> u64 {
    let ll = path.len() - 1;
    if ll == 0 {
        return 0;
    }
    let s = &path[ll - 1];
    let k = u64::from(s.node.key(s.pos));
    if k <= at { k } else { 0 }
}

#[cfg(test)]
mod tests;
