//! Reading extent trees of any depth: every node's header (magic, depth,
//! entries <= max, max fits its room), block checksums, index and extent
//! ordering within the parent's range, physical ranges inside the
//! filesystem. Unwritten extents are reported as such (read as zeros).

use ext4kit_format::extent::{EXTENT_MAGIC, Extent as DiskExtent, ExtentHeader, ExtentIndex};
use zerocopy::FromBytes;

use crate::FsError;
use crate::inode::InodeInfo;
use crate::sb::Fs;

/// Deepest tree the kernel accepts (`EXT4_MAX_EXTENT_DEPTH`).
pub const MAX_DEPTH: u16 = 5;

/// One mapped run of a file: logical `lblk..lblk+len` at physical `pblk..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub lblk: u64,
    pub pblk: u64,
    pub len: u32,
    /// Allocated but never written (reads as zeros).
    pub unwritten: bool,
}

impl Mapping {
    pub fn end(&self) -> u64 {
        self.lblk + u64::from(self.len)
    }
}

/// One tree node as read (for writers and for `stat`-like tools).
#[derive(Clone, Debug)]
pub struct NodeInfo {
    /// Physical block (0 for the root in the inode).
    pub pblk: u64,
    pub depth: u16,
    pub entries: u16,
    pub max: u16,
}

/// The checks every extent node gets before use (readers and writers):
/// magic, depth (`depth`: the one expected, `None` for the root: any up
/// to [`MAX_DEPTH`]), entries <= max <= the room of `buf`, no empty index
/// node, and with `csum` (metadata_csum) the block's checksum tail (not
/// for the root, `pblk == 0`). Returns (depth, entries, max).
pub fn check_node(
    buf: &[u8],
    pblk: u64,
    depth: Option<u16>,
    ino: u32,
    generation: u32,
    csum: Option<&ext4kit_format::Csum>,
) -> Result<(u16, u16, u16), FsError> {
    let bad = |d: String| node_error(ino, pblk, d);
    let (h, _) = ExtentHeader::read_from_prefix(buf).map_err(|_| bad("short node".into()))?;
    if h.eh_magic.get() != EXTENT_MAGIC {
        return Err(bad(format!("bad magic {:#06x}", h.eh_magic.get())));
    }
    let d = h.eh_depth.get();
    let (entries, max) = (h.eh_entries.get(), h.eh_max.get());
    let room = ((buf.len() - 12) / 12) as u16;
    if d > MAX_DEPTH || depth.is_some_and(|want| want != d) {
        return Err(bad(format!("depth {d} where {depth:?} was expected")));
    }
    if max == 0 || max > room || entries > max {
        return Err(bad(format!(
            "{entries} entries, max {max} (room for {room})"
        )));
    }
    if entries == 0 && d > 0 {
        return Err(bad("an index node with no entries".into()));
    }
    if let Some(csum) = csum.filter(|_| pblk != 0) {
        let end = 12 + usize::from(max) * 12;
        let stored = buf
            .get(end..end + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let want = csum.extent_block(ino, generation, &buf[..end]);
        if stored != Some(want) {
            return Err(bad("checksum does not match".into()));
        }
    }
    Ok((d, entries, max))
}

/// `FsError::Corrupt` for inode `ino`'s tree node at `pblk` (0: the root
/// in the inode).
pub fn node_error(ino: u32, pblk: u64, d: impl std::fmt::Display) -> FsError {
    let at = if pblk == 0 {
        "in the inode".to_string()
    } else {
        format!("block {pblk}")
    };
    FsError::corrupt("extent tree", format!("inode {ino} {at}: {d}"))
}

struct Walk<'a, 'b> {
    fs: &'b Fs<'a>,
    ino: u32,
    generation: u32,
    out: Vec<Mapping>,
    nodes: Vec<NodeInfo>,
    visited: u64,
}

impl Walk<'_, '_> {
    fn bad(&self, pblk: u64, d: impl std::fmt::Display) -> FsError {
        node_error(self.ino, pblk, d)
    }

    /// Header checks of one node (magic, depth, entries, max, checksum).
    fn check_header(
        &self,
        buf: &[u8],
        pblk: u64,
        depth: Option<u16>,
    ) -> Result<(u16, u16, u16), FsError> {
        let csum = self.fs.info.csum.metadata.then_some(&self.fs.info.csum);
        check_node(buf, pblk, depth, self.ino, self.generation, csum)
    }

    /// Walk the node in `buf` (the inode's 60 bytes or a tree block),
    /// whose entries must lie in `lo..hi` and whose depth must be `depth`
    /// (`None` for the root: any depth up to [`MAX_DEPTH`]).
    fn node(
        &mut self,
        buf: &[u8],
        pblk: u64,
        depth: Option<u16>,
        lo: u64,
        hi: u64,
    ) -> Result<(), FsError> {
        self.visited += 1;
        if self.visited > self.fs.info.blocks_count + 1 {
            return Err(self.bad(
                pblk,
                "the tree has more nodes than the filesystem has blocks",
            ));
        }
        let (d, entries, max) = self.check_header(buf, pblk, depth)?;
        self.nodes.push(NodeInfo {
            pblk,
            depth: d,
            entries,
            max,
        });
        let ent = |i: usize| &buf[12 + 12 * i..24 + 12 * i];
        if d == 0 {
            let mut prev_end = lo;
            for i in 0..usize::from(entries) {
                let (e, _) =
                    DiskExtent::read_from_prefix(ent(i)).map_err(|_| self.bad(pblk, "short"))?;
                let lblk = u64::from(e.ee_block.get());
                let len = e.len();
                let start = e.start();
                if len == 0 {
                    return Err(self.bad(pblk, format!("extent {i} has length 0")));
                }
                if lblk < prev_end || lblk + u64::from(len) > hi {
                    return Err(self.bad(
                        pblk,
                        format!(
                            "extent {i} (logical {lblk}+{len}) overlaps its neighbour or leaves its range {lo}..{hi}"
                        ),
                    ));
                }
                if !self.fs.info.range_ok(start, u64::from(len)) {
                    return Err(self.bad(
                        pblk,
                        format!("extent {i} maps blocks {start}+{len} outside the filesystem"),
                    ));
                }
                prev_end = lblk + u64::from(len);
                self.out.push(Mapping {
                    lblk,
                    pblk: start,
                    len,
                    unwritten: e.is_unwritten(),
                });
            }
            return Ok(());
        }
        let mut idx = Vec::with_capacity(usize::from(entries));
        for i in 0..usize::from(entries) {
            let (x, _) =
                ExtentIndex::read_from_prefix(ent(i)).map_err(|_| self.bad(pblk, "short"))?;
            idx.push((u64::from(x.ei_block.get()), x.leaf()));
        }
        for i in 0..idx.len() {
            let (start, child) = idx[i];
            let next = idx.get(i + 1).map_or(hi, |n| n.0);
            if start < lo || start >= next || next > hi {
                return Err(self.bad(
                    pblk,
                    format!("index {i} (logical {start}) is out of order or leaves {lo}..{hi}"),
                ));
            }
            if !self.fs.info.range_ok(child, 1) {
                return Err(self.bad(
                    pblk,
                    format!("index {i} points at block {child}, outside the filesystem"),
                ));
            }
            let b = self.fs.blocks.block(child)?;
            self.node(&b, child, Some(d - 1), start, next)?;
        }
        Ok(())
    }
}

impl Fs<'_> {
    /// The extent holding logical block `lblk` of an extent-mapped inode
    /// (one root-to-leaf path is read and checked), `None` in a hole.
    pub fn extent_at(&self, inode: &InodeInfo, lblk: u64) -> Result<Option<Mapping>, FsError> {
        let w = Walk {
            fs: self,
            ino: inode.ino,
            generation: inode.generation,
            out: Vec::new(),
            nodes: Vec::new(),
            visited: 0,
        };
        let mut buf = inode.i_block.to_vec();
        let mut pblk = 0u64;
        let mut depth = None;
        loop {
            let (d, entries, _) = w.check_header(&buf, pblk, depth)?;
            let ent = |i: usize| &buf[12 + 12 * i..24 + 12 * i];
            if d == 0 {
                let mut prev_end = 0u64;
                for i in 0..usize::from(entries) {
                    let (e, _) =
                        DiskExtent::read_from_prefix(ent(i)).map_err(|_| w.bad(pblk, "short"))?;
                    let start = u64::from(e.ee_block.get());
                    let len = e.len();
                    if len == 0 || start < prev_end {
                        return Err(w.bad(pblk, format!("extent {i} is empty or out of order")));
                    }
                    prev_end = start + u64::from(len);
                    if lblk >= start && lblk < prev_end {
                        if !self.info.range_ok(e.start(), u64::from(len)) {
                            return Err(w.bad(
                                pblk,
                                format!("extent {i} maps blocks outside the filesystem"),
                            ));
                        }
                        return Ok(Some(Mapping {
                            lblk: start,
                            pblk: e.start(),
                            len,
                            unwritten: e.is_unwritten(),
                        }));
                    }
                }
                return Ok(None);
            }
            let mut child = None;
            let mut prev = None;
            for i in 0..usize::from(entries) {
                let (x, _) =
                    ExtentIndex::read_from_prefix(ent(i)).map_err(|_| w.bad(pblk, "short"))?;
                let start = u64::from(x.ei_block.get());
                if prev.is_some_and(|p| start <= p) {
                    return Err(w.bad(pblk, format!("index {i} is out of order")));
                }
                prev = Some(start);
                if start <= lblk {
                    child = Some(x.leaf());
                }
            }
            let Some(c) = child else { return Ok(None) };
            if !self.info.range_ok(c, 1) {
                return Err(w.bad(
                    pblk,
                    format!("an index points at block {c}, outside the filesystem"),
                ));
            }
            buf = self.blocks.block(c)?;
            pblk = c;
            depth = Some(d - 1);
        }
    }

    /// All extents of an extent-mapped inode, in logical order.
    pub fn extents(&self, inode: &InodeInfo) -> Result<Vec<Mapping>, FsError> {
        Ok(self.extent_tree(inode)?.0)
    }

    /// The extents and the tree's nodes (root first, depth-first).
    pub fn extent_tree(&self, inode: &InodeInfo) -> Result<(Vec<Mapping>, Vec<NodeInfo>), FsError> {
        let mut w = Walk {
            fs: self,
            ino: inode.ino,
            generation: inode.generation,
            out: Vec::new(),
            nodes: Vec::new(),
            visited: 0,
        };
        w.node(&inode.i_block, 0, None, 0, 1 << 32)?;
        Ok((w.out, w.nodes))
    }
}
