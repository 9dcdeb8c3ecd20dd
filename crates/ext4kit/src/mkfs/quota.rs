//! `-O quota` / `project`: the quota files mke2fs 1.47 writes
//! (`create_quota_inodes`: lib/support/mkquota.c, quotaio.c,
//! quotaio_v2.c, quotaio_tree.c).
//!
//! Each enabled type gets a v2 (revision 1) quota file: a 1 KiB header
//! block, the 4-level radix tree of 1 KiB blocks and data blocks of
//! 72-byte dquot entries, holding the usage mke2fs computes: the root
//! directory and lost+found, nothing else (the reserved inodes, the quota
//! files and the orphan file are not counted). User and group quota live
//! in inodes 3 and 4; the project quota file takes the first free inode
//! (12), before the orphan file.
//!
//! The file is built by replaying libext2fs's own sequence of quota-tree
//! operations over a model of its file I/O (one block buffer, blocks
//! allocated at the first write into them), so that the contents and the
//! blocks the I/O channel sees (for `s_kbytes_written`) are mke2fs's.

use std::collections::BTreeMap;

use ext4kit_format::features::Incompat;

use super::geometry::{FileMap, FsParams, GeometryError, Planner};

/// `-E quotatype=` bits (`QUOTA_USR_BIT` ...).
pub const USR: u8 = 1;
pub const GRP: u8 = 2;
pub const PRJ: u8 = 4;

/// `INITQMAGICS`: user, group, project.
const MAGICS: [u32; 3] = [0xd9c0_1f11, 0xd9c0_1927, 0xd9c0_3f14];
/// `MAX_DQ_TIME` / `MAX_IQ_TIME`: one week.
const GRACE: u32 = 604_800;
const QT_BLKSIZE: usize = 1024;
const QT_TREEOFF: u32 = 1;
const QT_TREEDEPTH: u32 = 4;
/// `struct qt_disk_dqdbheader`.
const DQDB_HEADER: usize = 16;
/// `struct v2r1_disk_dqblk`.
const ENTRY_SIZE: usize = 72;
const ENTRIES_PER_BLOCK: usize = (QT_BLKSIZE - DQDB_HEADER) / ENTRY_SIZE;

/// One I/O of the quota file code, in the order mke2fs makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    /// A block of the quota file (physical block).
    Block { pblk: u64, write: bool },
    /// The inode table block holding the quota inode.
    Inode { write: bool },
}

/// A quota file to write.
#[derive(Clone, Debug)]
pub struct QuotaFile {
    /// 0 user, 1 group, 2 project.
    pub qtype: u8,
    pub ino: u32,
    pub map: FileMap,
    /// The contents; its length is `i_size`.
    pub data: Vec<u8>,
    /// Block I/O as mke2fs makes it (for `s_kbytes_written`).
    pub trace: Vec<Io>,
}

/// `parse_quota_types`: `usr`/`usrquota`, `grp`/`grpquota`,
/// `prj`/`prjquota`, each possibly `^`-negated, separated by `:` or `,`,
/// edited into `bits`. The error is the token that failed. (As with
/// strtok, empty words are skipped, except that a leading separator makes
/// the first word fail.)
pub fn parse_quota_types(s: &str, bits: u8) -> Result<u8, String> {
    let mut q = bits;
    if s.is_empty() {
        return Ok(q);
    }
    let leading = s.starts_with([':', ',']);
    let mut words: Vec<&str> = s.split([':', ',']).filter(|w| !w.is_empty()).collect();
    if leading {
        // parse_quota_types looks at the buffer itself first, which still
        // starts with the separator strtok skipped.
        let end = s[1..].find([':', ',']).map_or(s.len(), |i| i + 1);
        words.insert(0, &s[..end]);
    }
    for w in words {
        let (not, name) = match w.strip_prefix('^') {
            Some(n) => (true, n),
            None => (false, w),
        };
        let bit = match name {
            "usr" | "usrquota" => USR,
            "grp" | "grpquota" => GRP,
            "prj" | "prjquota" => PRJ,
            _ => return Err(w.to_string()),
        };
        if not {
            q &= !bit;
        } else {
            q |= bit;
        }
    }
    Ok(q)
}

/// libext2fs's file I/O on one inode, as far as mke2fs's quota code uses
/// it (`ext2fs_file_write`/`read`/`flush`, `ext2fs_file_set_size2`).
struct FileSim {
    bs: u64,
    /// Blocks per cluster: a block inside an already allocated cluster is
    /// mapped without a new allocation (nothing zeroed).
    ratio: u64,
    /// The contents (`i_size` bytes; the buffer is written through).
    data: Vec<u8>,
    size: u64,
    pos: u64,
    blockno: u64,
    valid: bool,
    dirty: bool,
    mapped: Vec<bool>,
    /// (logical block, or `None` for the inode's table block; write)
    trace: Vec<(Option<u64>, bool)>,
    /// Logical blocks in the order they were mapped.
    alloc_order: Vec<u64>,
}

impl FileSim {
    fn new(bs: u32, ratio: u64) -> Self {
        Self {
            bs: u64::from(bs),
            ratio,
            data: Vec::new(),
            size: 0,
            pos: 0,
            blockno: 0,
            valid: false,
            dirty: false,
            mapped: Vec::new(),
            trace: Vec::new(),
            alloc_order: Vec::new(),
        }
    }
    fn is_mapped(&self, lb: u64) -> bool {
        self.mapped.get(lb as usize).copied().unwrap_or(false)
    }
    /// `ext2fs_bmap2(BMAP_ALLOC)`: a new block is zeroed through the I/O
    /// channel (not one inside a cluster already allocated), the inode is
    /// rewritten.
    fn alloc(&mut self, lb: u64) {
        let base = lb - lb % self.ratio;
        let implied = (base..base + self.ratio).any(|b| self.is_mapped(b));
        if !implied {
            self.trace.push((Some(lb), true));
        }
        self.trace.push((None, true));
        if self.mapped.len() <= lb as usize {
            self.mapped.resize(lb as usize + 1, false);
        }
        self.mapped[lb as usize] = true;
        self.alloc_order.push(lb);
    }
    fn flush(&mut self) {
        if !(self.valid && self.dirty) {
            return;
        }
        if !self.is_mapped(self.blockno) {
            self.alloc(self.blockno);
        }
        self.trace.push((Some(self.blockno), true));
        self.dirty = false;
    }
    fn sync(&mut self) {
        let b = self.pos / self.bs;
        if b != self.blockno {
            self.flush();
            self.valid = false;
        }
        self.blockno = b;
    }
    fn load(&mut self, dontfill: bool) {
        if !self.valid {
            if !dontfill && self.is_mapped(self.blockno) {
                self.trace.push((Some(self.blockno), false));
            }
            self.valid = true;
        }
    }
    fn write(&mut self, off: u64, buf: &[u8]) {
        self.pos = off;
        let mut rest = buf;
        while !rest.is_empty() {
            self.sync();
            let start = self.pos % self.bs;
            let c = ((self.bs - start) as usize).min(rest.len());
            self.load(c as u64 == self.bs);
            self.dirty = true;
            let p = self.pos as usize;
            if self.data.len() < p + c {
                self.data.resize(p + c, 0);
            }
            self.data[p..p + c].copy_from_slice(&rest[..c]);
            if !self.is_mapped(self.blockno) {
                self.alloc(self.blockno);
            }
            self.pos += c as u64;
            rest = &rest[c..];
        }
        if !buf.is_empty() && self.size < self.pos {
            // ext2fs_file_set_size2: the inode, then the rest of the last
            // block zeroed on disk (ext2fs_file_zero_past_offset).
            self.size = self.pos;
            self.trace.push((None, true));
            if !self.size.is_multiple_of(self.bs) {
                self.sync();
                let lb = self.size / self.bs;
                if self.is_mapped(lb) {
                    self.trace.push((Some(lb), false));
                    self.trace.push((Some(lb), true));
                }
            }
        }
    }
    fn read(&mut self, off: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.pos = off;
        let mut got = 0usize;
        while self.pos < self.size && got < len {
            self.sync();
            self.load(false);
            let start = self.pos % self.bs;
            let c = ((self.bs - start) as usize)
                .min(len - got)
                .min((self.size - self.pos) as usize);
            let p = self.pos as usize;
            out[got..got + c].copy_from_slice(&self.data[p..p + c]);
            self.pos += c as u64;
            got += c;
        }
        out
    }
    fn close(&mut self) {
        self.flush();
    }
}

/// `struct qtree_mem_dqinfo` plus the handle: the quota tree code of
/// quotaio_tree.c over a [`FileSim`].
struct Tree {
    f: FileSim,
    blocks: u32,
    free_blk: u32,
    free_entry: u32,
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

impl Tree {
    fn read_blk(&mut self, blk: u32) -> Vec<u8> {
        self.f.read(u64::from(blk) * QT_BLKSIZE as u64, QT_BLKSIZE)
    }
    fn write_blk(&mut self, blk: u32, buf: &[u8]) {
        self.f.write(u64::from(blk) * QT_BLKSIZE as u64, buf);
    }
    fn get_free_dqblk(&mut self) -> u32 {
        if self.free_blk != 0 {
            let blk = self.free_blk;
            let buf = self.read_blk(blk);
            self.free_blk = le32(&buf, 0);
            return blk;
        }
        let zero = [0u8; QT_BLKSIZE];
        self.write_blk(self.blocks, &zero);
        self.blocks += 1;
        self.blocks - 1
    }
    fn remove_free_dqentry(&mut self, buf: &mut [u8], blk: u32) {
        let next = le32(buf, 0);
        let prev = le32(buf, 4);
        if next != 0 {
            let mut t = self.read_blk(next);
            put32(&mut t, 4, prev);
            self.write_blk(next, &t);
        }
        if prev != 0 {
            let mut t = self.read_blk(prev);
            put32(&mut t, 0, next);
            self.write_blk(prev, &t);
        } else {
            self.free_entry = next;
        }
        put32(buf, 0, 0);
        put32(buf, 4, 0);
        self.write_blk(blk, buf);
    }
    /// Returns the entry's block and offset in the file.
    fn find_free_dqentry(&mut self) -> (u32, u64) {
        let (blk, mut buf) = if self.free_entry != 0 {
            let blk = self.free_entry;
            (blk, self.read_blk(blk))
        } else {
            let blk = self.get_free_dqblk();
            self.free_entry = blk;
            (blk, vec![0u8; QT_BLKSIZE])
        };
        let entries = u16::from_le_bytes([buf[8], buf[9]]);
        if usize::from(entries) + 1 >= ENTRIES_PER_BLOCK {
            self.remove_free_dqentry(&mut buf, blk);
        }
        buf[8..10].copy_from_slice(&(entries + 1).to_le_bytes());
        let i = (0..ENTRIES_PER_BLOCK)
            .find(|&i| {
                let o = DQDB_HEADER + i * ENTRY_SIZE;
                buf[o..o + ENTRY_SIZE].iter().all(|&b| b == 0)
            })
            .unwrap_or(ENTRIES_PER_BLOCK - 1);
        self.write_blk(blk, &buf);
        let off = u64::from(blk) * QT_BLKSIZE as u64 + (DQDB_HEADER + i * ENTRY_SIZE) as u64;
        (blk, off)
    }
    fn do_insert_tree(&mut self, id: u32, treeblk: &mut u32, depth: u32) -> u64 {
        let mut buf = if *treeblk == 0 {
            *treeblk = self.get_free_dqblk();
            vec![0u8; QT_BLKSIZE]
        } else {
            self.read_blk(*treeblk)
        };
        let idx = ((id >> ((QT_TREEDEPTH - depth - 1) * 8)) & 0xff) as usize;
        let mut newblk = le32(&buf, idx * 4);
        let newson = newblk == 0;
        let off = if depth == QT_TREEDEPTH - 1 {
            let (b, off) = self.find_free_dqentry();
            newblk = b;
            off
        } else {
            self.do_insert_tree(id, &mut newblk, depth + 1)
        };
        if newson {
            put32(&mut buf, idx * 4, newblk);
            self.write_blk(*treeblk, &buf);
        }
        off
    }
    fn info_bytes(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        put32(&mut b, 0, GRACE);
        put32(&mut b, 4, GRACE);
        put32(&mut b, 8, 0);
        put32(&mut b, 12, self.blocks);
        put32(&mut b, 16, self.free_blk);
        put32(&mut b, 20, self.free_entry);
        b
    }
}

/// The quota file of type `qtype` holding `usage` (id → (bytes, inodes)),
/// as quota_file_create + write_dquots + quota_file_close write it.
fn build_file(qtype: u8, usage: &BTreeMap<u32, (u64, u64)>, bs: u32, ratio: u64) -> FileSim {
    let mut t = Tree {
        f: FileSim::new(bs, ratio),
        blocks: QT_TREEOFF + 1,
        free_blk: 0,
        free_entry: 0,
    };
    // quota_inode_init_new: read (inode cache miss), then write_new_inode.
    t.f.trace.push((None, false));
    t.f.trace.push((None, true));
    // v2_new_io.
    let mut hdr = [0u8; 8];
    put32(&mut hdr, 0, MAGICS[usize::from(qtype)]);
    put32(&mut hdr, 4, 1);
    t.f.write(0, &hdr);
    let info = t.info_bytes();
    t.f.write(8, &info);
    // write_dquots, in id order.
    for (&id, &(space, inodes)) in usage {
        if space == 0 && inodes == 0 {
            continue;
        }
        let mut tmp = QT_TREEOFF;
        let off = t.do_insert_tree(id, &mut tmp, 0);
        let mut e = [0u8; ENTRY_SIZE];
        put32(&mut e, 0, id);
        e[24..32].copy_from_slice(&inodes.to_le_bytes());
        e[48..56].copy_from_slice(&space.to_le_bytes());
        t.f.write(off, &e);
    }
    // quota_file_close: write_info, then the file's last buffer.
    let info = t.info_bytes();
    t.f.write(8, &info);
    t.f.close();
    t.f
}

/// `create_quota_inodes`: plan the quota files of `p.quota_types` (after
/// the journal, before the orphan file).
pub(super) fn plan_quota(pl: &mut Planner, p: &FsParams) -> Result<(), GeometryError> {
    let bs = pl.l.block_size;
    let ratio = pl.l.cluster_ratio();
    // quota_compute_usage: the root directory and lost+found (owned by
    // root); the project id is 0 for both.
    let root = pl.l.i_blocks_512(&pl.l.root) * 512;
    let lpf = pl.l.i_blocks_512(&pl.l.lost_found) * 512;
    let project_ok = pl.l.inode_size > 128;
    for qtype in 0..3u8 {
        if p.quota_types & (1 << qtype) == 0 {
            continue;
        }
        if qtype == 2 && !project_ok {
            continue;
        }
        let (root_id, lpf_id) = match qtype {
            0 => (p.root_uid, 0),
            1 => (p.root_gid, 0),
            _ => (0, 0),
        };
        let mut usage: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (id, space) in [(root_id, root), (lpf_id, lpf)] {
            let u = usage.entry(id).or_insert((0, 0));
            u.0 += space;
            u.1 += 1;
        }
        let ino = match qtype {
            0 => ext4kit_format::inode::USR_QUOTA_INO,
            1 => ext4kit_format::inode::GRP_QUOTA_INO,
            _ => {
                let ino = super::geometry::first_free_inode(&pl.l);
                if ino > pl.l.inodes_count {
                    return Err(GeometryError::NoSpace("project quota inode"));
                }
                pl.new_inode_scan(0, ino);
                pl.use_inode(ino, false);
                ino
            }
        };
        let sim = build_file(qtype, &usage, bs, ratio);
        let map = allocate(pl, ino, &sim.alloc_order)?;
        if !pl.l.features.incompat.contains(Incompat::EXTENTS) && map.blocks() > 12 {
            return Err(GeometryError::Invalid(
                "quota file too large for a block-mapped inode".into(),
            ));
        }
        let trace = sim
            .trace
            .iter()
            .filter_map(|&(lb, write)| match lb {
                None => Some(Io::Inode { write }),
                Some(lb) => map.pblk(lb as u32).map(|pblk| Io::Block { pblk, write }),
            })
            .collect();
        pl.l.quota.push(QuotaFile {
            qtype,
            ino,
            map,
            data: sim.data,
            trace,
        });
    }
    Ok(())
}

/// Map the file's logical blocks in the order libext2fs mapped them
/// (`extent_bmap` with `BMAP_ALLOC`): a block of a logical cluster that
/// already has one goes at its place in that physical cluster; otherwise
/// a new cluster at the first free one from the block before it (or from
/// the inode's group). Extents merge what is contiguous.
fn allocate(pl: &mut Planner, ino: u32, order: &[u64]) -> Result<FileMap, GeometryError> {
    let mask = pl.l.cluster_ratio() - 1;
    let group_goal = pl.inode_goal(ino);
    let mut map: BTreeMap<u64, u64> = BTreeMap::new();
    for &lb in order {
        let base = lb & !mask;
        if mask > 0
            && let Some((&l2, &p2)) = map.range(base..=(lb | mask)).next()
        {
            map.insert(lb, p2 - (l2 - base) + (lb - base));
            continue;
        }
        let goal = match lb.checked_sub(1).and_then(|p| map.get(&p)) {
            Some(&p) => p,
            None => group_goal,
        };
        let b = pl.alloc_block(goal, "quota file")?;
        map.insert(lb, (b & !mask) + (lb & mask));
    }
    // ext2fs_extent_set_bmap, block by block in that order: extend the
    // extent found at the block (or the one before it) at either end, or
    // prepend to the next one, or insert a new extent.
    let mut runs: Vec<super::geometry::Run> = Vec::new();
    for &lb in order {
        let pb = map[&lb];
        let lb = lb as u32;
        let cur = runs
            .iter()
            .rposition(|r| r.lblk <= lb)
            .or(if runs.is_empty() { None } else { Some(0) });
        let Some(i) = cur else {
            runs.push(super::geometry::Run {
                lblk: lb,
                pblk: pb,
                len: 1,
            });
            continue;
        };
        let r = runs[i];
        if lb == r.lblk + r.len && pb == r.pblk + u64::from(r.len) {
            runs[i].len += 1;
        } else if lb + 1 == r.lblk && pb + 1 == r.pblk {
            runs[i] = super::geometry::Run {
                lblk: lb,
                pblk: pb,
                len: r.len + 1,
            };
        } else if let Some(n) = runs.get(i + 1).copied()
            && lb + 1 == n.lblk
            && pb + 1 == n.pblk
        {
            runs[i + 1] = super::geometry::Run {
                lblk: lb,
                pblk: pb,
                len: n.len + 1,
            };
        } else {
            let at = if lb < r.lblk { i } else { i + 1 };
            runs.insert(
                at,
                super::geometry::Run {
                    lblk: lb,
                    pblk: pb,
                    len: 1,
                },
            );
        }
    }
    let fm = FileMap {
        runs,
        ..FileMap::default()
    };
    if fm.runs.len() > 4 {
        return Err(GeometryError::Invalid(
            "quota file too fragmented for this planner".into(),
        ));
    }
    Ok(fm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_types_like_parse_quota_types() {
        assert_eq!(parse_quota_types("usrquota:grpquota:prjquota", 0), Ok(7));
        assert_eq!(parse_quota_types("usr,prj", 0), Ok(5));
        assert_eq!(parse_quota_types("^grp", USR | GRP), Ok(USR));
        assert_eq!(parse_quota_types("usr::grp", 0), Ok(3));
        assert_eq!(parse_quota_types("", USR), Ok(USR));
        assert_eq!(parse_quota_types("usr:bogus", 0), Err("bogus".into()));
        assert_eq!(parse_quota_types(":usr", 0), Err(":usr".into()));
    }

    /// One id: header, the four tree levels, one data block (6 KiB), the
    /// data block on the free-entry list.
    #[test]
    fn one_id_file_layout() {
        let mut u = BTreeMap::new();
        u.insert(0, (8192u64, 2u64));
        let f = build_file(0, &u, 4096, 1);
        assert_eq!(f.data.len(), 6 * 1024);
        assert_eq!(le32(&f.data, 0), MAGICS[0]);
        assert_eq!(le32(&f.data, 8 + 12), 6, "dqi_blocks");
        assert_eq!(le32(&f.data, 8 + 20), 5, "dqi_free_entry");
        for (lvl, blk) in [(1usize, 2u32), (2, 3), (3, 4), (4, 5)] {
            assert_eq!(le32(&f.data, lvl * 1024), blk);
        }
        let e = 5 * 1024 + DQDB_HEADER;
        assert_eq!(
            u16::from_le_bytes([f.data[5 * 1024 + 8], f.data[5 * 1024 + 9]]),
            1
        );
        assert_eq!(
            u64::from_le_bytes(f.data[e + 24..e + 32].try_into().unwrap()),
            2
        );
        assert_eq!(
            u64::from_le_bytes(f.data[e + 48..e + 56].try_into().unwrap()),
            8192
        );
    }
}
