//! Quota accounting (issue 20): the `quota` feature's hidden quota files
//! (`s_usr_quota_inum`, `s_grp_quota_inum`, `s_prj_quota_inum`) kept
//! exact through every operation, in the handle of the change.
//!
//! Format (QFMT_VFS_V1, the kernel's `quota_tree.c` and `quota_v2.c`,
//! e2fsprogs' `quotaio_tree.c`/`quotaio_v2.c`): the file is a sequence of
//! 1 KiB quota blocks. Block 0 holds the header (magic, version 1) and
//! the info (`dqi_bgrace`, `dqi_igrace`, `dqi_flags`, `dqi_blocks`,
//! `dqi_free_blk`, `dqi_free_entry`); block 1 is the root of a radix tree
//! of depth 4 over the id's bytes (most significant first), 256 block
//! numbers per tree block; the last level points at data blocks of 14
//! 72-byte dquot entries after a 16-byte header (`next_free`,
//! `prev_free`, `entries`). Usage is `dqb_curspace` (bytes: `i_blocks`
//! × 512, as the kernel and e2fsck count) and `dqb_curinodes`; limits
//! and grace times are kept as they are (no enforcement).
//!
//! How it is kept: every write of an inode slot goes through
//! `create_inode`, `store_inode`, `set_inode_attrs` or a free of the
//! inode, each of which notes the change of (ids, space, one inode) in
//! the operation (`Op::quota`). `finish` adds the operation's deltas to
//! the dquot entries inside the same handle (in place: additions of
//! different handles commute), inserting an entry for an id the file
//! does not have yet (new tree blocks, the file grown by a block when
//! its last one is full), before the allocators' groups are rendered.
//! Counted as e2fsck counts: the root and every inode from
//! `s_first_ino` except the quota files and the orphan file.

use super::*;
use crate::sb::Fs;
use ext4kit_format::inode::EXT4_EA_INODE_FL;

/// Quota block size (`QT_BLKSIZE`).
const QB: usize = 1024;
const TREE_DEPTH: u32 = 4;
const ROOT_BLK: u32 = 1;
/// `struct qt_disk_dqdbheader`.
const DQDB_HEADER: usize = 16;
/// `struct v2r1_disk_dqblk`.
const ENTRY: usize = 72;
const PER_DATA_BLOCK: usize = (QB - DQDB_HEADER) / ENTRY;
/// `V2_DQINFOOFF`: the info after the 8-byte header.
const INFO: usize = 8;
/// `V2_INITQMAGICS`: user, group, project.
const MAGICS: [u32; 3] = [0xd9c0_1f11, 0xd9c0_1927, 0xd9c0_3f14];
const OFF_CURINODES: usize = 24;
const OFF_CURSPACE: usize = 48;
const OFF_ITIME: usize = 64;

/// Credits an operation adds for each quota type: the entry blocks of
/// the old and new id, and an insertion (up to four new quota blocks, the
/// tree block pointing at them, the info block, a new file block with
/// its bitmap and descriptor, the quota inode).
pub(crate) const CREDITS_PER_TYPE: u32 = 12;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn le64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

fn bad(msg: String) -> FsError {
    FsError::corrupt("quota file", msg)
}

/// The quota block store the tree code works on.
pub(crate) trait QuotaBlocks {
    fn read_qblk(&mut self, k: u32) -> Result<Vec<u8>, FsError>;
    /// Write quota block `k` (the file grows when `k` is past its end).
    fn write_qblk(&mut self, k: u32, b: &[u8]) -> Result<(), FsError>;
}

/// `struct qtree_mem_dqinfo`'s on-disk part.
#[derive(Clone, Copy, Debug)]
struct Info {
    blocks: u32,
    free_blk: u32,
    free_entry: u32,
}

fn read_info(io: &mut dyn QuotaBlocks) -> Result<Info, FsError> {
    let b = io.read_qblk(0)?;
    Ok(Info {
        blocks: le32(&b, INFO + 12),
        free_blk: le32(&b, INFO + 16),
        free_entry: le32(&b, INFO + 20),
    })
}

fn write_info(io: &mut dyn QuotaBlocks, i: &Info) -> Result<(), FsError> {
    let mut b = io.read_qblk(0)?;
    put32(&mut b, INFO + 12, i.blocks);
    put32(&mut b, INFO + 16, i.free_blk);
    put32(&mut b, INFO + 20, i.free_entry);
    io.write_qblk(0, &b)
}

/// `get_free_dqblk`.
fn get_free_dqblk(io: &mut dyn QuotaBlocks, info: &mut Info) -> Result<u32, FsError> {
    if info.free_blk != 0 {
        let blk = info.free_blk;
        let b = io.read_qblk(blk)?;
        info.free_blk = le32(&b, 0);
        return Ok(blk);
    }
    let blk = info.blocks;
    io.write_qblk(blk, &[0u8; QB])?;
    info.blocks += 1;
    Ok(blk)
}

/// `remove_free_dqentry`: `blk` (contents `b`) leaves the free list.
fn remove_free_dqentry(
    io: &mut dyn QuotaBlocks,
    info: &mut Info,
    b: &mut [u8],
) -> Result<(), FsError> {
    let next = le32(b, 0);
    let prev = le32(b, 4);
    if next != 0 {
        let mut t = io.read_qblk(next)?;
        put32(&mut t, 4, prev);
        io.write_qblk(next, &t)?;
    }
    if prev != 0 {
        let mut t = io.read_qblk(prev)?;
        put32(&mut t, 0, next);
        io.write_qblk(prev, &t)?;
    } else {
        info.free_entry = next;
    }
    put32(b, 0, 0);
    put32(b, 4, 0);
    Ok(())
}

/// `find_free_dqentry`: a free entry for `id` (its id written); returns
/// its data block and byte offset in the file.
fn find_free_dqentry(
    io: &mut dyn QuotaBlocks,
    info: &mut Info,
    id: u32,
) -> Result<(u32, u64), FsError> {
    let (blk, mut b) = if info.free_entry != 0 {
        let blk = info.free_entry;
        (blk, io.read_qblk(blk)?)
    } else {
        let blk = get_free_dqblk(io, info)?;
        info.free_entry = blk;
        (blk, vec![0u8; QB])
    };
    let entries = le16(&b, 8);
    if usize::from(entries) + 1 >= PER_DATA_BLOCK {
        remove_free_dqentry(io, info, &mut b)?;
    }
    b[8..10].copy_from_slice(&(entries + 1).to_le_bytes());
    let i = (0..PER_DATA_BLOCK)
        .find(|&i| {
            let o = DQDB_HEADER + i * ENTRY;
            b[o..o + ENTRY].iter().all(|&x| x == 0)
        })
        .ok_or_else(|| bad(format!("data block {blk}: no free entry")))?;
    let o = DQDB_HEADER + i * ENTRY;
    put32(&mut b, o, id);
    // qtree_entry_unused: an all-zero entry is free (id 0 without usage).
    if id == 0 {
        put64(&mut b, o + OFF_ITIME, 1);
    }
    io.write_qblk(blk, &b)?;
    Ok((blk, u64::from(blk) * QB as u64 + o as u64))
}

/// `do_insert_tree`.
fn do_insert_tree(
    io: &mut dyn QuotaBlocks,
    info: &mut Info,
    id: u32,
    treeblk: &mut u32,
    depth: u32,
) -> Result<u64, FsError> {
    let mut b = if *treeblk == 0 {
        *treeblk = get_free_dqblk(io, info)?;
        vec![0u8; QB]
    } else {
        io.read_qblk(*treeblk)?
    };
    let idx = ((id >> ((TREE_DEPTH - depth - 1) * 8)) & 0xff) as usize;
    let mut newblk = le32(&b, idx * 4);
    let newson = newblk == 0;
    let off = if depth == TREE_DEPTH - 1 {
        if !newson {
            return Err(bad(format!("id {id} is in the tree already")));
        }
        let (blk, off) = find_free_dqentry(io, info, id)?;
        newblk = blk;
        off
    } else {
        do_insert_tree(io, info, id, &mut newblk, depth + 1)?
    };
    if newson {
        put32(&mut b, idx * 4, newblk);
        io.write_qblk(*treeblk, &b)?;
    }
    Ok(off)
}

/// Insert an entry for `id`: its byte offset in the file.
pub(crate) fn insert(io: &mut dyn QuotaBlocks, id: u32) -> Result<u64, FsError> {
    let mut info = read_info(io)?;
    let mut root = ROOT_BLK;
    let off = do_insert_tree(io, &mut info, id, &mut root, 0)?;
    write_info(io, &info)?;
    Ok(off)
}

/// Every entry of the file: id → byte offset (the tree walked from the
/// root, each block checked to be inside `dqi_blocks`).
pub(crate) fn scan(io: &mut dyn QuotaBlocks, qtype: usize) -> Result<HashMap<u32, u64>, FsError> {
    let h = io.read_qblk(0)?;
    if le32(&h, 0) != MAGICS[qtype] || le32(&h, 4) != 1 {
        return Err(bad(format!(
            "type {qtype}: not a v2 (revision 1) quota file (magic {:#x}, version {})",
            le32(&h, 0),
            le32(&h, 4)
        )));
    }
    let info = read_info(io)?;
    let mut out = HashMap::new();
    // (block, depth): tree blocks are visited once each by construction;
    // data blocks are shared by ids, so each is read once.
    let mut stack = vec![(ROOT_BLK, 0u32)];
    let mut data_seen = std::collections::HashSet::new();
    let mut visits = 0u64;
    while let Some((blk, depth)) = stack.pop() {
        if blk >= info.blocks || blk == 0 {
            return Err(bad(format!("tree block {blk} outside 1..{}", info.blocks)));
        }
        visits += 1;
        if visits > u64::from(info.blocks) * 256 {
            return Err(bad("tree loops".into()));
        }
        let b = io.read_qblk(blk)?;
        if depth == TREE_DEPTH {
            for i in 0..PER_DATA_BLOCK {
                let o = DQDB_HEADER + i * ENTRY;
                if b[o..o + ENTRY].iter().any(|&x| x != 0) {
                    let id = le32(&b, o);
                    out.insert(id, u64::from(blk) * QB as u64 + o as u64);
                }
            }
            continue;
        }
        for idx in 0..256usize {
            let r = le32(&b, idx * 4);
            if r == 0 {
                continue;
            }
            if depth + 1 == TREE_DEPTH && !data_seen.insert(r) {
                continue;
            }
            stack.push((r, depth + 1));
        }
    }
    Ok(out)
}

/// One quota type's file.
#[derive(Debug)]
pub(crate) struct QuotaType {
    ino: u32,
    /// Physical block of each file block.
    map: Vec<u64>,
    size: u64,
    entries: HashMap<u32, u64>,
}

/// The quota files of a filesystem with the `quota` feature.
#[derive(Debug)]
pub(crate) struct Quotas {
    types: Mutex<[Option<QuotaType>; 3]>,
    /// Which types are kept (for the ids of a charge).
    enabled: [bool; 3],
    inums: [u32; 3],
    orphan_file_ino: u32,
}

/// What an inode is charged: its (user, group, project) ids and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Charge {
    ids: [u32; 3],
    bytes: u64,
}

impl Quotas {
    pub(crate) fn count(&self) -> u32 {
        self.enabled.iter().filter(|&&e| e).count() as u32
    }
}

/// Reading a quota file at open (through the read side).
struct ReadIo<'a, 'b> {
    fs: &'a Fs<'b>,
    map: &'a [u64],
    bs: usize,
}

impl QuotaBlocks for ReadIo<'_, '_> {
    fn read_qblk(&mut self, k: u32) -> Result<Vec<u8>, FsError> {
        read_mapped(self.map, self.bs, k, |p| {
            self.fs.meta_block(p, "quota file")
        })
    }
    fn write_qblk(&mut self, _k: u32, _b: &[u8]) -> Result<(), FsError> {
        Err(FsError::InvalidRequest("quota file read only here".into()))
    }
}

fn read_mapped(
    map: &[u64],
    bs: usize,
    k: u32,
    read: impl FnOnce(u64) -> Result<Vec<u8>, FsError>,
) -> Result<Vec<u8>, FsError> {
    let byte = k as usize * QB;
    match map.get(byte / bs) {
        Some(&p) if p != 0 => {
            let b = read(p)?;
            let o = byte % bs;
            Ok(b[o..o + QB].to_vec())
        }
        _ => Ok(vec![0u8; QB]),
    }
}

/// Writing a quota file inside an operation.
struct OpIo<'a, 'b> {
    fs: &'a Filesystem,
    op: &'a mut Op<'b>,
    t: &'a mut QuotaType,
}

impl QuotaBlocks for OpIo<'_, '_> {
    fn read_qblk(&mut self, k: u32) -> Result<Vec<u8>, FsError> {
        let bs = self.fs.block_size() as usize;
        let fs = self.fs;
        read_mapped(&self.t.map, bs, k, |p| {
            fs.read(|f| f.meta_block(p, "quota file"))
        })
    }

    fn write_qblk(&mut self, k: u32, data: &[u8]) -> Result<(), FsError> {
        let bs = self.fs.block_size() as usize;
        let byte = k as usize * QB;
        let fb = byte / bs;
        let end = (byte + QB) as u64;
        let mut grow = None;
        let cl = self.fs.clusters();
        while self.t.map.len() <= fb {
            let goal = self.t.map.last().map(|&p| p + 1);
            let l = self.t.map.len() as u64;
            let p = match self.t.map.last() {
                // Bigalloc: the rest of the last block's cluster first
                // (the file grows a block at a time, from block 0).
                Some(&last) if l & cl.mask() != 0 => cl.c2b(cl.b2c(last)) + (l & cl.mask()),
                _ => {
                    let g = self.fs.inode_group(self.t.ino);
                    let mut req = AllocRequest::new(1, g);
                    req.goal = goal;
                    self.fs.place_block(&[], l, &req)?.0
                }
            };
            self.op.h.modify_new(p, |_| {})?;
            self.t.map.push(p);
            grow = Some(());
        }
        let p = self.t.map[fb];
        let o = byte % bs;
        self.op
            .h
            .modify(p, |b| b[o..o + QB].copy_from_slice(data))?;
        if grow.is_some() || end > self.t.size {
            self.t.size = self.t.size.max(end);
            self.store_quota_inode()?;
        }
        Ok(())
    }
}

impl OpIo<'_, '_> {
    /// The quota inode's extents, `i_blocks` and `i_size` after a growth.
    fn store_quota_inode(&mut self) -> Result<(), FsError> {
        let fs = self.fs;
        let mut inode = fs.inode_any_op(self.t.ino)?;
        let (_, nodes) = fs.mapping(&inode)?;
        let mut maps: Vec<Mapping> = Vec::new();
        for (l, &p) in self.t.map.iter().enumerate() {
            match maps.last_mut() {
                Some(m) if m.pblk + u64::from(m.len) == p && m.len < 32768 => m.len += 1,
                _ => maps.push(Mapping {
                    lblk: l as u64,
                    pblk: p,
                    len: 1,
                    unwritten: false,
                }),
            }
        }
        let bs = fs.block_size();
        // Whole clusters with bigalloc (the map starts at block 0 and
        // fills each cluster in order), and a cluster per tree block.
        let ratio = fs.clusters().ratio();
        let data_512 = (self.t.map.len() as u64).div_ceil(ratio) * ratio * (bs / 512);
        let size = self.t.size;
        fs.edit_inode(&mut inode, |n| n.set_size(size))?;
        let old_tree = nodes.iter().filter(|n| n.pblk != 0).count() as u64 * ratio;
        fs.edit_inode(&mut inode, |n| {
            n.set_blocks_512(data_512 + old_tree * (bs / 512))
        })?;
        fs.write_tree(self.op, &mut inode, &nodes, &maps)?;
        fs.store_inode(self.op, &inode)
    }
}

/// `(user, group, project)` and bytes of an inode slot.
pub(crate) fn charge_of(raw: &[u8], bs: u64, huge_file: bool) -> Charge {
    if raw.len() < 128 {
        return Charge::default();
    }
    let uid = u32::from(le16(raw, 0x02)) | (u32::from(le16(raw, 0x78)) << 16);
    let gid = u32::from(le16(raw, 0x18)) | (u32::from(le16(raw, 0x7A)) << 16);
    let lo = u64::from(le32(raw, 0x1C));
    let hi = u64::from(le16(raw, 0x74));
    let flags = le32(raw, 0x20);
    let mut blocks = lo | (hi << 32);
    if huge_file && flags & 0x0004_0000 != 0 {
        blocks *= bs / 512;
    }
    let projid = if raw.len() >= 0xA0 && usize::from(le16(raw, 0x80)) >= 0xA0 - 128 {
        le32(raw, 0x9C)
    } else {
        0
    };
    Charge {
        ids: [uid, gid, projid],
        bytes: blocks * 512,
    }
}

impl Filesystem {
    /// Load the quota files (`quota` feature), `None` without it.
    pub(crate) fn load_quotas(fs: &Fs<'_>) -> Result<Option<Quotas>, FsError> {
        let sb = &fs.info.sb;
        if !fs.info.features.ro_compat.contains(RoCompat::QUOTA) {
            return Ok(None);
        }
        let inums = [
            sb.s_usr_quota_inum.get(),
            sb.s_grp_quota_inum.get(),
            sb.s_prj_quota_inum.get(),
        ];
        let bs = fs.info.block_size as usize;
        let mut types: [Option<QuotaType>; 3] = [None, None, None];
        for (t, &ino) in inums.iter().enumerate() {
            if ino == 0 {
                continue;
            }
            if t == 2 && !fs.info.features.ro_compat.contains(RoCompat::PROJECT) {
                return Err(FsError::Unsupported(
                    "a project quota file without the project feature".into(),
                ));
            }
            let inode = fs.inode(ino)?;
            if !inode.has_extents() {
                return Err(FsError::Unsupported(format!(
                    "writing the block-mapped quota file (inode {ino})"
                )));
            }
            let (maps, _) = fs.extent_tree(&inode)?;
            let nblocks = inode.size.div_ceil(bs as u64) as usize;
            let mut map = vec![0u64; nblocks];
            for m in &maps {
                for i in 0..u64::from(m.len) {
                    let l = (m.lblk + i) as usize;
                    if l < nblocks && !m.unwritten {
                        map[l] = m.pblk + i;
                    }
                }
            }
            if map.contains(&0) {
                return Err(bad(format!("quota file inode {ino} has a hole")));
            }
            let mut io = ReadIo { fs, map: &map, bs };
            let entries = scan(&mut io, t)?;
            types[t] = Some(QuotaType {
                ino,
                map,
                size: inode.size,
                entries,
            });
        }
        Ok(Some(Quotas {
            enabled: [types[0].is_some(), types[1].is_some(), types[2].is_some()],
            types: Mutex::new(types),
            inums,
            orphan_file_ino: sb.s_orphan_file_inum.get(),
        }))
    }

    /// Whether inode `ino` is charged to quota (e2fsck's pass 1 rule).
    fn quota_counted(&self, q: &Quotas, ino: u32) -> bool {
        let first = self.read(|fs| fs.info.first_ino);
        (ino == ext4kit_format::inode::ROOT_INO || ino >= first)
            && !q.inums.contains(&ino)
            && (q.orphan_file_ino == 0 || ino != q.orphan_file_ino)
    }

    fn charge(&self, raw: &[u8]) -> Charge {
        let huge = self.read(|fs| fs.info.features.ro_compat.contains(RoCompat::HUGE_FILE));
        charge_of(raw, self.block_size(), huge)
    }

    /// Note in `op` that inode `ino` went from `old` to `new` (`None`:
    /// not in use).
    pub(crate) fn quota_note(
        &self,
        op: &mut Op<'_>,
        ino: u32,
        old: Option<Charge>,
        new: Option<Charge>,
    ) {
        let Some(q) = &self.quota else {
            return;
        };
        if old == new || !self.quota_counted(q, ino) {
            return;
        }
        for t in 0..3 {
            if !q.enabled[t] {
                continue;
            }
            if let Some(c) = old {
                op.quota.push((t as u8, c.ids[t], -(c.bytes as i64), -1));
            }
            if let Some(c) = new {
                op.quota.push((t as u8, c.ids[t], c.bytes as i64, 1));
            }
        }
    }

    /// Note the write of slot `new` over the slot as it is now.
    pub(crate) fn quota_note_store(
        &self,
        op: &mut Op<'_>,
        ino: u32,
        new: &[u8],
    ) -> Result<(), FsError> {
        if self.quota.is_none() || is_ea_inode(new) {
            return Ok(());
        }
        let (blk, off) = self.inode_location(ino)?;
        let b = self.read(|fs| fs.meta_block(blk, "inode table"))?;
        let old = self.charge(&b[off..off + new.len()]);
        let new = self.charge(new);
        self.quota_note(op, ino, Some(old), Some(new));
        Ok(())
    }

    /// Note `bytes` and `inodes` of EA inode values charged to inode
    /// `ino` (slot `raw`): e2fsck charges an inode, for each entry it
    /// sees (in the inode or its block) naming an EA inode, one inode and
    /// the value's size in blocks; the EA inode itself is not charged.
    pub(crate) fn quota_note_ea(
        &self,
        op: &mut Op<'_>,
        ino: u32,
        raw: &[u8],
        bytes: i64,
        inodes: i64,
    ) {
        let Some(q) = &self.quota else {
            return;
        };
        if (bytes == 0 && inodes == 0) || !self.quota_counted(q, ino) {
            return;
        }
        let c = self.charge(raw);
        for t in 0..3 {
            if q.enabled[t] {
                op.quota.push((t as u8, c.ids[t], bytes, inodes));
            }
        }
    }

    /// Note a new inode (slot `raw`) or a freed one.
    pub(crate) fn quota_note_alloc(&self, op: &mut Op<'_>, ino: u32, raw: &[u8], alloc: bool) {
        if self.quota.is_none() || is_ea_inode(raw) {
            return;
        }
        let c = self.charge(raw);
        if alloc {
            self.quota_note(op, ino, None, Some(c));
        } else {
            self.quota_note(op, ino, Some(c), None);
        }
    }

    /// Add `op`'s deltas to the quota files inside its handle.
    pub(crate) fn quota_flush(&self, op: &mut Op<'_>) -> Result<(), FsError> {
        let Some(q) = &self.quota else {
            return Ok(());
        };
        if op.quota.is_empty() {
            return Ok(());
        }
        let mut sum: BTreeMap<(u8, u32), (i64, i64)> = BTreeMap::new();
        for (t, id, s, i) in std::mem::take(&mut op.quota) {
            let e = sum.entry((t, id)).or_default();
            e.0 += s;
            e.1 += i;
        }
        let bs = self.block_size() as usize;
        let mut types = lock(&q.types);
        for ((t, id), (ds, di)) in sum {
            if ds == 0 && di == 0 {
                continue;
            }
            let Some(qt) = types[usize::from(t)].as_mut() else {
                continue;
            };
            let off = match qt.entries.get(&id) {
                Some(&o) => o,
                None => {
                    let mut io = OpIo {
                        fs: self,
                        op,
                        t: qt,
                    };
                    let o = insert(&mut io, id)?;
                    qt.entries.insert(id, o);
                    o
                }
            };
            let fb = off as usize / bs;
            let p = *qt
                .map
                .get(fb)
                .ok_or_else(|| bad(format!("entry of id {id} past the file")))?;
            let o = off as usize % bs;
            op.h.modify(p, |b| {
                let e = &mut b[o..o + ENTRY];
                let inodes = le64(e, OFF_CURINODES).saturating_add_signed(di);
                let space = le64(e, OFF_CURSPACE).saturating_add_signed(ds);
                // A negative result means the file was off already: 0.
                let inodes = if di < 0 && le64(e, OFF_CURINODES) < di.unsigned_abs() {
                    0
                } else {
                    inodes
                };
                let space = if ds < 0 && le64(e, OFF_CURSPACE) < ds.unsigned_abs() {
                    0
                } else {
                    space
                };
                put64(e, OFF_CURINODES, inodes);
                put64(e, OFF_CURSPACE, space);
                if e.iter().all(|&x| x == 0) {
                    put64(e, OFF_ITIME, 1);
                }
            })?;
        }
        Ok(())
    }

    /// EXDEV for a link of `i` into `dir` when `dir` has PROJINHERIT and
    /// another project id (`ext4_link`, `ext4_rename`).
    pub(crate) fn same_project(&self, dir: &InodeInfo, i: &InodeInfo) -> Result<(), FsError> {
        let project = self.read(|fs| fs.info.features.ro_compat.contains(RoCompat::PROJECT));
        if project && dir.flags & flags::PROJINHERIT_FL != 0 && dir.projid != i.projid {
            return Err(FsError::CrossProject);
        }
        Ok(())
    }

    /// Set inode `ino`'s project id (`FS_IOC_FSSETXATTR`'s `fsx_projid`,
    /// `ext4_ioctl_setproject`): its usage moves to the new id in the
    /// same handle. Needs the project feature and the large inode's
    /// `i_projid` field (EOPNOTSUPP otherwise, as ext4).
    pub fn set_projid(&self, ino: u32, projid: u32) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("set_projid", ino, || {
            let i = self.inode_open(ino)?;
            if i.projid == projid {
                return Ok(self.rw.journal().running_tid());
            }
            let project = self.read(|fs| fs.info.features.ro_compat.contains(RoCompat::PROJECT));
            let extra = i.raw.len() >= 0xA0 && usize::from(le16(&i.raw, 0x80)) >= 0xA0 - 128;
            if !project || !extra {
                return Err(FsError::Unsupported(
                    "project ids need the project feature and large inodes".into(),
                ));
            }
            flags::may_setattr(&i, true)?;
            let mut op = self.begin(1, 0)?;
            op.own(ino);
            let r = (|| {
                let mut i = self.inode_open(ino)?;
                let c = now();
                self.edit_inode(&mut i, |n| {
                    n.i_projid.set(projid);
                    let (s, x) = encode_time(c);
                    n.i_ctime.set(s);
                    n.i_ctime_extra.set(x);
                })?;
                self.store_inode(&mut op, &i)
            })();
            match r {
                Ok(()) => self.finish(op),
                Err(e) => Err(self.fail(op, e)),
            }
        })
    }

    /// Credits a handle adds for quota.
    pub(crate) fn quota_credits(&self) -> u32 {
        self.quota
            .as_ref()
            .map_or(0, |q| q.count() * CREDITS_PER_TYPE)
    }

    /// Usage of every id of quota type `qtype` (0 user, 1 group, 2
    /// project): id → (bytes, inodes), as the file holds it now.
    pub fn quota_usage(&self, qtype: usize) -> Result<BTreeMap<u32, (u64, u64)>, FsError> {
        let Some(q) = &self.quota else {
            return Ok(BTreeMap::new());
        };
        let types = lock(&q.types);
        let Some(qt) = types.get(qtype).and_then(|t| t.as_ref()) else {
            return Ok(BTreeMap::new());
        };
        let bs = self.block_size() as usize;
        let mut out = BTreeMap::new();
        for (&id, &off) in &qt.entries {
            let b = read_mapped(&qt.map, bs, (off / QB as u64) as u32, |p| {
                self.read(|f| f.meta_block(p, "quota file"))
            })?;
            let o = off as usize % QB;
            out.insert(
                id,
                (le64(&b, o + OFF_CURSPACE), le64(&b, o + OFF_CURINODES)),
            );
        }
        Ok(out)
    }
}

/// EA inodes are charged to the inodes naming them, not by themselves.
fn is_ea_inode(raw: &[u8]) -> bool {
    raw.get(0x20..0x24)
        .is_some_and(|f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]) & EXT4_EA_INODE_FL != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quota file in memory.
    struct Mem(Vec<u8>);
    impl QuotaBlocks for Mem {
        fn read_qblk(&mut self, k: u32) -> Result<Vec<u8>, FsError> {
            let o = k as usize * QB;
            if o + QB > self.0.len() {
                return Ok(vec![0; QB]);
            }
            Ok(self.0[o..o + QB].to_vec())
        }
        fn write_qblk(&mut self, k: u32, b: &[u8]) -> Result<(), FsError> {
            let o = k as usize * QB;
            if self.0.len() < o + QB {
                self.0.resize(o + QB, 0);
            }
            self.0[o..o + QB].copy_from_slice(b);
            Ok(())
        }
    }

    fn empty(qtype: usize) -> Mem {
        let mut m = Mem(vec![0; 2 * QB]);
        put32(&mut m.0, 0, MAGICS[qtype]);
        put32(&mut m.0, 4, 1);
        put32(&mut m.0, INFO + 12, 2);
        m
    }

    #[test]
    fn inserts_are_found_by_scan() {
        let mut m = empty(0);
        let ids = [
            0u32,
            1000,
            1001,
            65_536,
            0xdead_beef,
            7,
            8,
            9,
            10,
            11,
            12,
            13,
            14,
            15,
            16,
            17,
        ];
        let mut offs = HashMap::new();
        for &id in &ids {
            let o = insert(&mut m, id).unwrap();
            assert_eq!(le32(&m.0, o as usize), id);
            offs.insert(id, o);
        }
        assert_eq!(scan(&mut m, 0).unwrap(), offs);
        assert!(insert(&mut m, 1000).is_err());
        // 16 ids sharing the top bytes fill more than one data block: the
        // free list moved on.
        let info = read_info(&mut m).unwrap();
        assert!(info.blocks as usize * QB <= m.0.len());
    }

    #[test]
    fn scan_refuses_a_wrong_magic() {
        let mut m = empty(1);
        assert!(scan(&mut m, 0).is_err());
        assert!(scan(&mut m, 1).unwrap().is_empty());
    }

    #[test]
    fn charge_reads_ids_blocks_and_project() {
        let mut raw = vec![0u8; 256];
        raw[0x02..0x04].copy_from_slice(&0x1234u16.to_le_bytes());
        raw[0x78..0x7A].copy_from_slice(&0x0001u16.to_le_bytes());
        raw[0x18..0x1A].copy_from_slice(&7u16.to_le_bytes());
        raw[0x1C..0x20].copy_from_slice(&16u32.to_le_bytes());
        raw[0x80..0x82].copy_from_slice(&32u16.to_le_bytes());
        raw[0x9C..0xA0].copy_from_slice(&42u32.to_le_bytes());
        let c = charge_of(&raw, 4096, true);
        assert_eq!(c.ids, [0x1_1234, 7, 42]);
        assert_eq!(c.bytes, 16 * 512);
        raw[0x80..0x82].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(charge_of(&raw, 4096, true).ids[2], 0);
    }
}
