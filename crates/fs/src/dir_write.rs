//! Writing directories: adding, removing and retargeting entries in linear
//! and hash-indexed (htree) directories, as the kernel's `fs/ext4/namei.c`
//! does it (`ext4_add_entry`, `add_dirent_to_buf`, `make_indexed_dir`,
//! `ext4_dx_add_entry`, `do_split`, `dx_insert_block`,
//! `ext4_generic_delete_entry`), with checksum tails and dx_tails kept
//! right under metadata_csum and up to three index levels with large_dir.
//!
//! All block access goes through the [`DirBlocks`] trait: the operations
//! layer implements it on a journal handle (reads give a block's newest
//! image, writes are journaled, `append` allocates and maps a zeroed block
//! and grows `i_size`), tests implement it directly on an image. Nothing
//! here allocates, journals or touches the inode except through it.
//!
//! Lookups done here (duplicate checks, removal) walk the index by hash:
//! an insert into an htree reads one block per index level plus the leaf
//! (and the blocks of a split), never the whole directory.

use ext4kit_format::Csum;
use ext4kit_format::dir::{
    FT_DIR, TAIL_SIZE, put_tail, rec_len, rec_len_from_disk, rec_len_to_disk,
};
use ext4kit_format::dirhash;
use ext4kit_format::features::{Compat, Incompat};
use ext4kit_format::htree::{self, DX_ENTRY_SIZE, NODE_COUNT_OFFSET, ROOT_INFO_OFFSET};

use crate::FsError;
use crate::inode::InodeInfo;
use crate::sb::FsInfo;

/// What the directory code needs to know about the filesystem and the
/// directory besides its blocks.
#[derive(Clone, Copy, Debug)]
pub struct DirParams {
    /// The directory's inode number and generation (checksum seeds).
    pub ino: u32,
    pub generation: u32,
    /// The filesystem's checksum context (`csum.metadata`: metadata_csum).
    pub csum: Csum,
    /// `s_hash_seed`, `s_def_hash_version` and the unsigned-hash flag.
    pub hash_seed: [u8; 16],
    pub def_hash_version: u8,
    pub unsigned_hash: bool,
    /// dir_index: a one-block directory that overflows becomes an htree.
    pub dir_index: bool,
    /// large_dir: three index levels instead of two.
    pub large_dir: bool,
    /// filetype: entries carry a file type (else it is written as 0).
    pub filetype: bool,
    /// `s_inodes_count` (entries naming a larger inode are corrupt).
    pub inodes_count: u32,
    /// A casefolded directory (`EXT4_CASEFOLD_FL` on a casefold
    /// filesystem): `s_encoding_flags`. Names are then hashed and compared
    /// folded, and strict mode refuses names that are not UTF-8.
    pub casefold: Option<u16>,
}

impl DirParams {
    /// The parameters of directory `dir` on the filesystem `info`.
    pub fn new(info: &FsInfo, dir: &InodeInfo) -> DirParams {
        DirParams {
            ino: dir.ino,
            generation: dir.generation,
            csum: info.csum,
            hash_seed: info.hash_seed,
            def_hash_version: info.def_hash_version,
            unsigned_hash: info.unsigned_hash,
            dir_index: info.features.compat.contains(Compat::DIR_INDEX),
            large_dir: info.features.incompat.contains(Incompat::LARGEDIR),
            filetype: info.features.incompat.contains(Incompat::FILETYPE),
            inodes_count: info.inodes_count,
            casefold: info.casefold.filter(|_| {
                dir.flags & crate::fs::flags::CASEFOLD_FL != 0
                    && dir.flags & ext4kit_format::fscrypt::ENCRYPT_FL == 0
            }),
        }
    }
}

/// The blocks of one directory, as the operations layer provides them.
///
/// Logical block numbers run from 0 to `nblocks() - 1` (the directory's
/// `i_size / block_size`); holes are the implementation's error to report.
pub trait DirBlocks {
    /// The directory and filesystem settings (constant for a directory).
    fn params(&self) -> DirParams;
    /// The filesystem block size.
    fn block_size(&self) -> u32;
    /// Blocks in the directory (`i_size / block_size`).
    fn nblocks(&self) -> u32;
    /// The newest image of logical block `lblk`.
    fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError>;
    /// Replace logical block `lblk` (a whole block; journaled by the
    /// caller). Checksums are already filled in.
    fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError>;
    /// Grow the directory by one allocated, zeroed block (mapped, `i_size`
    /// and `i_blocks` updated); returns its logical number (`nblocks()`
    /// before the call).
    fn append(&mut self) -> Result<u32, FsError>;
    /// Does the inode have `EXT4_INDEX_FL`?
    fn indexed(&self) -> bool;
    /// Set `EXT4_INDEX_FL` on the inode (when the directory becomes an
    /// htree).
    fn set_indexed(&mut self) -> Result<(), FsError>;
}

/// Where an entry lives and what it says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub lblk: u32,
    /// Byte offset of the record in its block.
    pub offset: usize,
    pub ino: u32,
    pub file_type: u8,
}

/// One record of a directory block.
#[derive(Clone, Copy, Debug)]
struct Rec {
    off: usize,
    ino: u32,
    rec_len: usize,
    name_len: usize,
}

/// Refuse names the kernel refuses (before any I/O).
pub fn check_name(name: &[u8]) -> Result<(), FsError> {
    if name.is_empty() {
        return Err(FsError::InvalidName("empty name"));
    }
    if name.len() > 255 {
        return Err(FsError::NameTooLong);
    }
    if name.contains(&b'/') {
        return Err(FsError::InvalidName("'/' in a name"));
    }
    if name.contains(&0) {
        return Err(FsError::InvalidName("NUL in a name"));
    }
    Ok(())
}

/// The first block of a new directory: `.` (rec_len 12) and `..` covering
/// the rest (less the checksum tail), as `ext4_init_new_dir` writes it.
pub fn new_dir_block(p: &DirParams, block_size: u32, parent: u32) -> Vec<u8> {
    let bs = block_size as usize;
    let csum = if p.csum.metadata { TAIL_SIZE } else { 0 };
    let ft = if p.filetype { FT_DIR } else { 0 };
    let mut b = vec![0u8; bs];
    ext4kit_format::dir::put_entry(&mut b, 0, p.ino, 12, b".", ft);
    let rl = rec_len_to_disk(bs - 12 - csum, bs);
    ext4kit_format::dir::put_entry(&mut b, 12, parent, rl, b"..", ft);
    if p.csum.metadata {
        put_tail(&mut b, p.ino, p.generation, &p.csum);
    }
    b
}

/// The first block of a directory converted out of inline data
/// (`ext4_finish_convert_inline_dir`): `.` and `..` (`parent`), then
/// `entries` (no dots) packed in order, the last one's `rec_len` running
/// to the end of the block (less the checksum tail). `None` when they do
/// not fit one block (an inode as large as a block can hold more).
pub fn dir_block_from_entries(
    p: &DirParams,
    block_size: u32,
    parent: u32,
    entries: &[(u32, &[u8], u8)],
) -> Option<Vec<u8>> {
    let bs = block_size as usize;
    let csum = if p.csum.metadata { TAIL_SIZE } else { 0 };
    let end = bs - csum;
    let ft_dir = if p.filetype { FT_DIR } else { 0 };
    let mut b = vec![0u8; bs];
    let mut recs: Vec<(u32, &[u8], u8)> = vec![(p.ino, b".", ft_dir), (parent, b"..", ft_dir)];
    recs.extend(
        entries
            .iter()
            .map(|&(i, n, t)| (i, n, if p.filetype { t } else { 0 })),
    );
    let need: usize = recs.iter().map(|(_, n, _)| rec_len(n.len())).sum();
    if need > end {
        return None;
    }
    let mut off = 0usize;
    let last = recs.len() - 1;
    for (k, (ino, name, ft)) in recs.iter().enumerate() {
        let rl = if k == last {
            end - off
        } else {
            rec_len(name.len())
        };
        off = ext4kit_format::dir::put_entry(&mut b, off, *ino, rec_len_to_disk(rl, bs), name, *ft);
    }
    if p.csum.metadata {
        put_tail(&mut b, p.ino, p.generation, &p.csum);
    }
    Some(b)
}

/// Directory writer over some [`DirBlocks`].
pub struct DirWriter<'a, D: DirBlocks + ?Sized> {
    d: &'a mut D,
    p: DirParams,
    bs: usize,
    /// Tests replace the name hash (to make collisions at will).
    hash_override: Option<fn(&[u8]) -> u32>,
}

/// One level of an htree path: the index block, where its count/limit
/// sits, and the entry followed.
#[derive(Clone)]
struct Frame {
    lblk: u32,
    buf: Vec<u8>,
    off: usize,
    at: usize,
}

fn get16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn get32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn put16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

impl Frame {
    fn count(&self) -> usize {
        usize::from(get16(&self.buf, self.off + 2))
    }
    fn limit(&self) -> usize {
        usize::from(get16(&self.buf, self.off))
    }
    fn set_count(&mut self, c: usize) {
        put16(&mut self.buf, self.off + 2, c as u16);
    }
    fn hash(&self, i: usize) -> u32 {
        if i == 0 {
            0
        } else {
            get32(&self.buf, self.off + i * DX_ENTRY_SIZE)
        }
    }
    fn block(&self, i: usize) -> u32 {
        get32(&self.buf, self.off + i * DX_ENTRY_SIZE + 4) & 0x0fff_ffff
    }
    /// `dx_insert_block`: a new entry after `at`.
    fn insert_after_at(&mut self, hash: u32, block: u32) {
        let count = self.count();
        let new = self.off + (self.at + 1) * DX_ENTRY_SIZE;
        let end = self.off + count * DX_ENTRY_SIZE;
        self.buf.copy_within(new..end, new + DX_ENTRY_SIZE);
        put32(&mut self.buf, new, hash);
        put32(&mut self.buf, new + 4, block);
        self.set_count(count + 1);
    }
}

/// A found record: its block number, the block's image, the block's
/// records and the record's index among them.
type Found = (u32, Vec<u8>, Vec<Rec>, usize);

/// Largest directory (in blocks) an htree can address.
const DX_MAX_BLOCK: u32 = 0x0fff_ffff;

impl<'a, D: DirBlocks + ?Sized> DirWriter<'a, D> {
    pub fn new(d: &'a mut D) -> Self {
        let p = d.params();
        let bs = d.block_size() as usize;
        DirWriter {
            d,
            p,
            bs,
            hash_override: None,
        }
    }

    fn bad(&self, at: impl std::fmt::Display, d: impl std::fmt::Display) -> FsError {
        FsError::corrupt("directory", format!("inode {} {at}: {d}", self.p.ino))
    }

    fn csum_size(&self) -> usize {
        if self.p.csum.metadata { TAIL_SIZE } else { 0 }
    }

    /// Usable bytes of a leaf block (before the checksum tail).
    fn usable(&self) -> usize {
        self.bs - self.csum_size()
    }

    fn is_dx(&self) -> bool {
        self.p.dir_index && self.d.indexed()
    }

    fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
        if lblk >= self.d.nblocks() {
            return Err(self.bad(
                format!("block {lblk}"),
                format!("past the directory's end ({} blocks)", self.d.nblocks()),
            ));
        }
        let b = self.d.read(lblk)?;
        if b.len() != self.bs {
            return Err(self.bad(format!("block {lblk}"), "short block"));
        }
        Ok(b)
    }

    /// Read a leaf block and check its checksum tail.
    fn read_leaf(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
        let b = self.read(lblk)?;
        if self.p.csum.metadata {
            let t = &b[self.bs - TAIL_SIZE..];
            let tail_ok = t[..4] == [0; 4]
                && get16(t, 4) == TAIL_SIZE as u16
                && t[6] == 0
                && t[7] == ext4kit_format::dir::FT_DIR_CSUM;
            if !tail_ok {
                return Err(self.bad(format!("block {lblk}"), "no checksum tail"));
            }
            let c = self
                .p
                .csum
                .dir_block(self.p.ino, self.p.generation, &b[..self.bs - TAIL_SIZE]);
            if c != get32(t, 8) {
                return Err(self.bad(format!("block {lblk}"), "checksum does not match"));
            }
        }
        Ok(b)
    }

    fn write_leaf(&mut self, lblk: u32, mut b: Vec<u8>) -> Result<(), FsError> {
        if self.p.csum.metadata {
            put_tail(&mut b, self.p.ino, self.p.generation, &self.p.csum);
        }
        self.d.write(lblk, &b)
    }

    fn write_node(&mut self, f: &Frame) -> Result<(), FsError> {
        let mut b = f.buf.clone();
        if self.p.csum.metadata {
            let node = htree::DxNode {
                count: f.count() as u16,
                limit: f.limit() as u16,
                entries: Vec::new(),
            };
            let seed = self.p.csum.inode_seed(self.p.ino, self.p.generation);
            htree::set_checksum(&mut b, f.off, &node, seed);
        }
        self.d.write(f.lblk, &b)
    }

    /// The records of `buf[start..end]`, checked as `ext4_check_dir_entry`.
    fn records(
        &self,
        buf: &[u8],
        start: usize,
        end: usize,
        lblk: u32,
    ) -> Result<Vec<Rec>, FsError> {
        let mut out = Vec::new();
        let mut off = start;
        while off < end {
            let here = |d: String| self.bad(format!("block {lblk} offset {off}"), d);
            if off + 8 > end {
                return Err(here("entry header runs past the block".into()));
            }
            let ino = get32(buf, off);
            let rl = rec_len_from_disk(get16(buf, off + 4), self.bs);
            let nl = usize::from(buf[off + 6]);
            if rl < rec_len(1) || !rl.is_multiple_of(4) || rl < rec_len(nl) {
                return Err(here(format!("bad rec_len {rl} (name_len {nl})")));
            }
            if off + rl > end {
                return Err(here(format!("rec_len {rl} runs past the block")));
            }
            if ino > self.p.inodes_count {
                return Err(here(format!("inode {ino} is out of range")));
            }
            out.push(Rec {
                off,
                ino,
                rec_len: rl,
                name_len: nl,
            });
            off += rl;
        }
        Ok(out)
    }

    fn leaf_records(&self, buf: &[u8], lblk: u32) -> Result<Vec<Rec>, FsError> {
        self.records(buf, 0, self.usable(), lblk)
    }

    fn name_of<'b>(buf: &'b [u8], r: &Rec) -> &'b [u8] {
        &buf[r.off + 8..r.off + 8 + r.name_len]
    }

    fn find_in(&self, buf: &[u8], recs: &[Rec], name: &[u8]) -> Option<usize> {
        let key = crate::dir::NameKey::new(self.p.casefold.is_some(), name);
        recs.iter()
            .position(|r| r.ino != 0 && key.matches(Self::name_of(buf, r)))
    }

    fn ft(&self, ft: u8) -> u8 {
        if self.p.filetype { ft } else { 0 }
    }

    /// `ext4_find_dest_de` + `ext4_insert_dentry` on one leaf: put the
    /// entry into the first record with room (splitting a live record's
    /// slack). `false` when the block has no room.
    fn insert_in(&self, buf: &mut [u8], recs: &[Rec], name: &[u8], ino: u32, ft: u8) -> bool {
        let need = rec_len(name.len());
        for r in recs {
            let nlen = rec_len(r.name_len);
            let room = if r.ino != 0 {
                r.rec_len - nlen
            } else {
                r.rec_len
            };
            if room < need {
                continue;
            }
            let (off, rl) = if r.ino != 0 {
                put16(buf, r.off + 4, rec_len_to_disk(nlen, self.bs));
                (r.off + nlen, r.rec_len - nlen)
            } else {
                (r.off, r.rec_len)
            };
            ext4kit_format::dir::put_entry(
                buf,
                off,
                ino,
                rec_len_to_disk(rl, self.bs),
                name,
                self.ft(ft),
            );
            return true;
        }
        false
    }

    // ----- hashing and the index -----

    fn hash(&self, version: u8, name: &[u8]) -> Result<u32, FsError> {
        if let Some(f) = self.hash_override {
            return Ok(f(name) & !1);
        }
        let key = crate::dir::NameKey::new(self.p.casefold.is_some(), name);
        let h =
            dirhash::dirhash(version, key.hash_input(), &self.p.hash_seed).ok_or_else(|| {
                FsError::Unsupported(format!(
                    "directory inode {} uses hash version {version}",
                    self.p.ino
                ))
            })?;
        Ok(dirhash::kernel_major(h))
    }

    fn max_levels(&self) -> usize {
        usize::from(if self.p.large_dir {
            htree::MAX_LEVELS_LARGEDIR
        } else {
            htree::MAX_LEVELS
        })
    }

    /// The root's hash algorithm (with the unsigned variant applied) and
    /// indirect levels, checked as `dx_probe` does.
    fn root_info(&self, root: &[u8]) -> Result<(u8, usize, usize), FsError> {
        let b = |d: &str| self.bad("htree root", d);
        if get32(root, 0) != self.p.ino
            || rec_len_from_disk(get16(root, 4), self.bs) != 12
            || root[6] != 1
            || root[8] != b'.'
            || root[12 + 6] != 2
            || &root[20..22] != b".."
            || rec_len_from_disk(get16(root, 16), self.bs) != self.bs - 12
        {
            return Err(b("the '.' and '..' entries are missing"));
        }
        let version = root[ROOT_INFO_OFFSET + 4];
        let info_len = usize::from(root[ROOT_INFO_OFFSET + 5]);
        let levels = usize::from(root[ROOT_INFO_OFFSET + 6]);
        if version == dirhash::DX_HASH_SIPHASH {
            return Err(FsError::Unsupported(format!(
                "directory inode {} uses the siphash directory hash (casefolding)",
                self.p.ino
            )));
        }
        if version > dirhash::DX_HASH_TEA {
            return Err(b("unknown hash version"));
        }
        if levels >= self.max_levels() {
            return Err(b("too many index levels"));
        }
        if info_len < 8 || ROOT_INFO_OFFSET + info_len + 8 > self.bs {
            return Err(b("bad dx_root_info length"));
        }
        Ok((
            dirhash::effective_version(version, self.p.unsigned_hash),
            levels,
            ROOT_INFO_OFFSET + info_len,
        ))
    }

    /// Check an index block's count/limit and dx_tail checksum.
    fn frame(&self, lblk: u32, buf: Vec<u8>, off: usize) -> Result<Frame, FsError> {
        let at = || {
            if lblk == 0 {
                format!("htree root (block {lblk})")
            } else {
                format!("htree node (block {lblk})")
            }
        };
        let m = self.p.csum.metadata;
        let expect = htree::limit(self.bs, off, m);
        if off + 4 > self.bs {
            return Err(self.bad(at(), "short block"));
        }
        let f = Frame {
            lblk,
            buf,
            off,
            at: 0,
        };
        if f.limit() != expect {
            return Err(self.bad(at(), "index limit does not match the block size"));
        }
        if f.count() == 0 || f.count() > f.limit() {
            return Err(self.bad(at(), "index count is 0 or above its limit"));
        }
        if m {
            let node = htree::DxNode {
                count: f.count() as u16,
                limit: f.limit() as u16,
                entries: Vec::new(),
            };
            let seed = self.p.csum.inode_seed(self.p.ino, self.p.generation);
            if !htree::checksum_ok(&f.buf, off, &node, seed) {
                return Err(self.bad(at(), "index checksum does not match"));
            }
        }
        // Block numbers are checked when followed (`read`).
        Ok(f)
    }

    fn pick(f: &mut Frame, hash: u32) {
        // Last entry whose hash is <= ours (entry 0 counts as hash 0).
        let (mut lo, mut hi) = (1usize, f.count());
        while lo < hi {
            let m = lo + (hi - lo) / 2;
            if f.hash(m) > hash {
                hi = m;
            } else {
                lo = m + 1;
            }
        }
        f.at = lo - 1;
    }

    /// `dx_probe`: the path from the root to the leaf for `name`; returns
    /// the frames and the name's hash.
    fn probe(&self, name: &[u8]) -> Result<(Vec<Frame>, u32), FsError> {
        let root = self.read(0)?;
        let (version, levels, off) = self.root_info(&root)?;
        let hash = self.hash(version, name)?;
        let mut frames = Vec::with_capacity(levels + 1);
        let mut f = self.frame(0, root, off)?;
        Self::pick(&mut f, hash);
        frames.push(f);
        for _ in 0..levels {
            let Some(last) = frames.last() else {
                break;
            };
            let blk = last.block(last.at);
            let buf = self.read(blk)?;
            if !htree::is_node_block(&buf, self.bs) {
                return Err(self.bad(format!("htree node (block {blk})"), "not an index node"));
            }
            let mut f = self.frame(blk, buf, NODE_COUNT_OFFSET)?;
            Self::pick(&mut f, hash);
            frames.push(f);
        }
        Ok((frames, hash))
    }

    /// `ext4_htree_next_block`: move the path to the next leaf if it may
    /// hold more names of `hash` (its index hash, less the continuation
    /// bit, equals ours). `false` at the end.
    fn next_leaf(&self, frames: &mut [Frame], hash: u32) -> Result<bool, FsError> {
        let mut d = frames.len() - 1;
        loop {
            let f = &mut frames[d];
            if f.at + 1 < f.count() {
                f.at += 1;
                break;
            }
            if d == 0 {
                return Ok(false);
            }
            d -= 1;
        }
        if frames[d].hash(frames[d].at) & !1 != hash {
            return Ok(false);
        }
        for k in d + 1..frames.len() {
            let blk = frames[k - 1].block(frames[k - 1].at);
            let buf = self.read(blk)?;
            frames[k] = self.frame(blk, buf, NODE_COUNT_OFFSET)?;
        }
        Ok(true)
    }

    /// Find `name` through the index: the leaf block, its image and the
    /// record's index.
    fn dx_find(&self, name: &[u8]) -> Result<Option<Found>, FsError> {
        let (mut frames, hash) = self.probe(name)?;
        for _ in 0..=self.d.nblocks() {
            let Some(last) = frames.last() else {
                break;
            };
            let lblk = last.block(last.at);
            let buf = self.read_leaf(lblk)?;
            let recs = self.leaf_records(&buf, lblk)?;
            if let Some(i) = self.find_in(&buf, &recs, name) {
                return Ok(Some((lblk, buf, recs, i)));
            }
            if !self.next_leaf(&mut frames, hash)? {
                return Ok(None);
            }
        }
        Err(self.bad("htree", "the index loops"))
    }

    /// Find `name` in a linear directory (block 0 of an htree holds only
    /// `.` and `..`, so `.`/`..` are found here too).
    fn linear_find(
        &self,
        name: &[u8],
        blocks: std::ops::Range<u32>,
    ) -> Result<Option<Found>, FsError> {
        for lblk in blocks {
            let buf = self.read_leaf(lblk)?;
            let recs = self.leaf_records(&buf, lblk)?;
            if let Some(i) = self.find_in(&buf, &recs, name) {
                return Ok(Some((lblk, buf, recs, i)));
            }
        }
        Ok(None)
    }

    /// The root's `..` (an htree's block 0 has no checksum tail).
    fn dx_dotdot(&self) -> Result<(Vec<u8>, usize), FsError> {
        let root = self.read(0)?;
        let (_, _, off) = self.root_info(&root)?;
        Ok((root, off))
    }

    fn find_any(&self, name: &[u8]) -> Result<Option<Found>, FsError> {
        if self.is_dx() {
            self.dx_find(name)
        } else {
            self.linear_find(name, 0..self.d.nblocks())
        }
    }

    // ----- public operations -----

    /// Look `name` up (`.` and `..` included).
    pub fn find(&self, name: &[u8]) -> Result<Option<Slot>, FsError> {
        if self.is_dx() && (name == b"." || name == b"..") {
            let (root, _) = self.dx_dotdot()?;
            let off = if name == b"." { 0 } else { 12 };
            return Ok(Some(Slot {
                lblk: 0,
                offset: off,
                ino: get32(&root, off),
                file_type: root[off + 7],
            }));
        }
        Ok(self.find_any(name)?.map(|(lblk, buf, recs, i)| Slot {
            lblk,
            offset: recs[i].off,
            ino: recs[i].ino,
            file_type: buf[recs[i].off + 7],
        }))
    }

    /// Add `name` → `ino` (`file_type` one of `FT_*`). Refuses an existing
    /// name with [`FsError::Exists`].
    pub fn add(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<(), FsError> {
        check_name(name)?;
        if let Some(flags) = self.p.casefold
            && !ext4kit_format::casefold::allowed(name, flags)
        {
            return Err(FsError::InvalidName(
                "not UTF-8 (a casefolded directory in strict mode)",
            ));
        }
        if name == b"." || name == b".." {
            return Err(FsError::Exists);
        }
        if ino == 0 || ino > self.p.inodes_count {
            return Err(FsError::InvalidName("inode number out of range"));
        }
        if self.d.nblocks() == 0 {
            return Err(FsError::Unsupported(format!(
                "directory inode {} has no blocks (inline data)",
                self.p.ino
            )));
        }
        if self.is_dx() {
            return self.dx_add(name, ino, file_type);
        }
        // Linear: the first block with room, checking every block for the
        // name first (the kernel leaves that to the lookup before).
        let n = self.d.nblocks();
        let mut room: Option<(u32, Vec<u8>, Vec<Rec>)> = None;
        for lblk in 0..n {
            let buf = self.read_leaf(lblk)?;
            let recs = self.leaf_records(&buf, lblk)?;
            if self.find_in(&buf, &recs, name).is_some() {
                return Err(FsError::Exists);
            }
            if room.is_none() && self.has_room(&recs, name.len()) {
                room = Some((lblk, buf, recs));
            }
        }
        if let Some((lblk, mut buf, recs)) = room {
            self.insert_in(&mut buf, &recs, name, ino, file_type);
            return self.write_leaf(lblk, buf);
        }
        if n == 1 && self.p.dir_index {
            return self.make_indexed_dir(name, ino, file_type);
        }
        // A new block: one empty record, then the entry in it.
        let lblk = self.d.append()?;
        let mut buf = vec![0u8; self.bs];
        let usable = self.usable();
        ext4kit_format::dir::put_entry(
            &mut buf,
            0,
            ino,
            rec_len_to_disk(usable, self.bs),
            name,
            self.ft(file_type),
        );
        self.write_leaf(lblk, buf)
    }

    fn has_room(&self, recs: &[Rec], name_len: usize) -> bool {
        let need = rec_len(name_len);
        recs.iter().any(|r| {
            let room = if r.ino != 0 {
                r.rec_len - rec_len(r.name_len)
            } else {
                r.rec_len
            };
            room >= need
        })
    }

    /// Remove `name`; returns what it pointed at. `.` and `..` are refused.
    /// `name` is matched, never written: any on-disk bytes (an encrypted
    /// directory's ciphertext names may hold '/' or NUL).
    pub fn remove(&mut self, name: &[u8]) -> Result<Slot, FsError> {
        if name.is_empty() {
            return Err(FsError::InvalidName("empty name"));
        }
        if name.len() > 255 {
            return Err(FsError::NameTooLong);
        }
        if name == b"." || name == b".." {
            return Err(FsError::InvalidName("'.' and '..' cannot be removed"));
        }
        let Some((lblk, mut buf, recs, i)) = self.find_any(name)? else {
            return Err(FsError::NotFound);
        };
        let r = recs[i];
        let slot = Slot {
            lblk,
            offset: r.off,
            ino: r.ino,
            file_type: buf[r.off + 7],
        };
        if i > 0 {
            // Merge into the previous record, wipe this one.
            let p = recs[i - 1];
            put16(
                &mut buf,
                p.off + 4,
                rec_len_to_disk(p.rec_len + r.rec_len, self.bs),
            );
            buf[r.off..r.off + r.rec_len].fill(0);
        } else {
            // First record of the block: inode 0, keep rec_len.
            put32(&mut buf, r.off, 0);
            buf[r.off + 6..r.off + r.rec_len].fill(0);
        }
        self.write_leaf(lblk, buf)?;
        Ok(slot)
    }

    /// Point the existing entry `name` at `ino`/`file_type` (rename over an
    /// existing name; `..` of a moved directory). Returns the old target.
    pub fn retarget(&mut self, name: &[u8], ino: u32, file_type: u8) -> Result<Slot, FsError> {
        check_name(name)?;
        if ino == 0 || ino > self.p.inodes_count {
            return Err(FsError::InvalidName("inode number out of range"));
        }
        let ft = self.ft(file_type);
        if self.is_dx() && (name == b"." || name == b"..") {
            let (root, off) = self.dx_dotdot()?;
            let at = if name == b"." { 0 } else { 12 };
            let old = Slot {
                lblk: 0,
                offset: at,
                ino: get32(&root, at),
                file_type: root[at + 7],
            };
            let mut f = self.frame(0, root, off)?;
            put32(&mut f.buf, at, ino);
            f.buf[at + 7] = ft;
            self.write_node(&f)?;
            return Ok(old);
        }
        let Some((lblk, mut buf, recs, i)) = self.find_any(name)? else {
            return Err(FsError::NotFound);
        };
        let r = recs[i];
        let old = Slot {
            lblk,
            offset: r.off,
            ino: r.ino,
            file_type: buf[r.off + 7],
        };
        put32(&mut buf, r.off, ino);
        buf[r.off + 7] = ft;
        self.write_leaf(lblk, buf)?;
        Ok(old)
    }

    /// Does the directory hold nothing but `.` and `..` (rmdir)?
    pub fn is_empty(&self) -> Result<bool, FsError> {
        let dx = self.is_dx();
        for lblk in 0..self.d.nblocks() {
            if dx && lblk == 0 {
                continue;
            }
            let buf = self.read(lblk)?;
            if dx && htree::is_node_block(&buf, self.bs) && get16(&buf, 8) != 0 {
                // An index node (an emptied leaf without checksums has
                // limit 0 here).
                continue;
            }
            let buf = self.read_leaf(lblk)?;
            for r in self.leaf_records(&buf, lblk)? {
                let n = Self::name_of(&buf, &r);
                if r.ino != 0 && n != b"." && n != b".." {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    // ----- htree growth -----

    /// `make_indexed_dir`: block 0 becomes the dx_root (`.`, `..`, the
    /// root info and one index entry), its other entries move to a new
    /// block 1, which is then split by hash and the new entry added.
    fn make_indexed_dir(&mut self, name: &[u8], ino: u32, ft: u8) -> Result<(), FsError> {
        let mut root = self.read_leaf(0)?;
        let recs = self.leaf_records(&root, 0)?;
        let ok = recs.len() >= 2
            && recs[0].off == 0
            && recs[0].rec_len == 12
            && Self::name_of(&root, &recs[0]) == b"."
            && Self::name_of(&root, &recs[1]) == b"..";
        if !ok {
            return Err(self.bad("block 0", "the '.' and '..' entries are missing"));
        }
        let de = 12 + recs[1].rec_len;
        let usable = self.usable();
        let len = usable - de;
        let mut data2 = vec![0u8; self.bs];
        data2[..len].copy_from_slice(&root[de..usable]);
        // The last record of the moved ones reaches the new block's end.
        let moved = self.records(&data2, 0, len, 1)?;
        let Some(last) = moved.last() else {
            return Err(self.bad("block 0", "no entries to index"));
        };
        put16(
            &mut data2,
            last.off + 4,
            rec_len_to_disk(usable - last.off, self.bs),
        );
        let version = dirhash::effective_version(self.p.def_hash_version, self.p.unsigned_hash);
        let hash = self.hash(version, name)?;
        // Checked; now change things.
        let blk1 = self.d.append()?;
        if blk1 != 1 {
            return Err(self.bad("block 0", "the directory grew at a block other than 1"));
        }
        self.d.set_indexed()?;
        root[de..usable].fill(0);
        // The root: `..` to the end, root info, one entry for block 1.
        put16(&mut root, 16, rec_len_to_disk(self.bs - 12, self.bs));
        let info = ROOT_INFO_OFFSET;
        root[info..info + 8].fill(0);
        root[info + 4] = self.p.def_hash_version;
        root[info + 5] = 8;
        let off = info + 8;
        let limit = htree::limit(self.bs, off, self.p.csum.metadata);
        put16(&mut root, off, limit as u16);
        put16(&mut root, off + 2, 1);
        put32(&mut root, off + 4, 1);
        let mut frame = Frame {
            lblk: 0,
            buf: root,
            off,
            at: 0,
        };
        let (lblk, mut buf, hint) = self.do_split(&mut frame, 1, data2, hash, version)?;
        self.put_at(&mut buf, hint, name, ino, ft, lblk)?;
        self.write_leaf(lblk, buf)?;
        self.write_node(&frame)
    }

    /// Insert at the record `hint` (the split's last record) of a leaf.
    fn put_at(
        &self,
        buf: &mut [u8],
        hint: usize,
        name: &[u8],
        ino: u32,
        ft: u8,
        lblk: u32,
    ) -> Result<(), FsError> {
        let recs = self.leaf_records(buf, lblk)?;
        let r: Vec<Rec> = recs.into_iter().filter(|r| r.off == hint).collect();
        if !self.insert_in(buf, &r, name, ino, ft) {
            return Err(self.bad(format!("block {lblk}"), "no room after a split"));
        }
        Ok(())
    }

    /// `do_split`: move the upper half (by hash) of leaf `lblk` to a new
    /// block, insert it in `frame` after `at`; returns the block that gets
    /// the name of `hash` (number, image, offset of its last record). The
    /// other block is written; the returned one and `frame` are not.
    fn do_split(
        &mut self,
        frame: &mut Frame,
        lblk: u32,
        mut data1: Vec<u8>,
        hash: u32,
        version: u8,
    ) -> Result<(u32, Vec<u8>, usize), FsError> {
        let newblock = self.d.append()?;
        if newblock > DX_MAX_BLOCK {
            return Err(FsError::StructureFull(format!(
                "directory inode {} is at the htree's block limit",
                self.p.ino
            )));
        }
        let bs = self.bs;
        let usable = self.usable();
        // dx_make_map: live records, last one first, then sorted by hash.
        let recs = self.leaf_records(&data1, lblk)?;
        let mut map: Vec<(u32, usize, usize)> = Vec::with_capacity(recs.len());
        for r in recs.iter().rev() {
            if r.ino != 0 && r.name_len != 0 {
                let h = self.hash(version, Self::name_of(&data1, r))?;
                map.push((h, r.off, r.rec_len));
            }
        }
        dx_sort_map(&mut map);
        let count = map.len();
        let mut size = 0usize;
        let mut moved = 0usize;
        let mut i = count as isize - 1;
        while i >= 0 {
            let e = map[i as usize];
            if size + e.2 / 2 > bs / 2 {
                break;
            }
            size += e.2;
            moved += 1;
            i -= 1;
        }
        let split = if i > 0 { count - moved } else { count / 2 };
        let hash2 = map.get(split).map_or(0, |e| e.0);
        let continued = u32::from(split > 0 && map[split - 1].0 == hash2);
        // dx_move_dirents into the new block, in hash order.
        let mut data2 = vec![0u8; bs];
        let mut to = 0usize;
        let mut last2 = 0usize;
        for &(_, off, rl) in &map[split..] {
            let nl = usize::from(data1[off + 6]);
            let len = rec_len(nl);
            data2[to..to + len].copy_from_slice(&data1[off..off + len]);
            put16(&mut data2, to + 4, rec_len_to_disk(len, bs));
            put32(&mut data1, off, 0);
            data1[off + 6..off + rl].fill(0);
            last2 = to;
            to += len;
        }
        put16(&mut data2, last2 + 4, rec_len_to_disk(usable - last2, bs));
        // dx_pack_dirents on the old block.
        let recs = self.leaf_records(&data1, lblk)?;
        let mut packed = vec![0u8; bs];
        let mut to = 0usize;
        let mut last1 = 0usize;
        for r in recs.iter().filter(|r| r.ino != 0 && r.name_len != 0) {
            let len = rec_len(r.name_len);
            packed[to..to + len].copy_from_slice(&data1[r.off..r.off + len]);
            put16(&mut packed, to + 4, rec_len_to_disk(len, bs));
            last1 = to;
            to += len;
        }
        put16(&mut packed, last1 + 4, rec_len_to_disk(usable - last1, bs));
        frame.insert_after_at(hash2 + continued, newblock);
        if hash >= hash2 {
            self.write_leaf(lblk, packed)?;
            Ok((newblock, data2, last2))
        } else {
            self.write_leaf(newblock, data2)?;
            Ok((lblk, packed, last1))
        }
    }

    /// `ext4_dx_add_entry`.
    fn dx_add(&mut self, name: &[u8], ino: u32, ft: u8) -> Result<(), FsError> {
        let (first, hash) = self.probe(name)?;
        let version =
            dirhash::effective_version(first[0].buf[ROOT_INFO_OFFSET + 4], self.p.unsigned_hash);
        // The name may already be in this leaf or, with equal hashes, in
        // the ones that continue it.
        let mut path = first.clone();
        let mut first_leaf = None;
        for _ in 0..=self.d.nblocks() {
            let Some(last) = path.last() else {
                break;
            };
            let lblk = last.block(last.at);
            let buf = self.read_leaf(lblk)?;
            let recs = self.leaf_records(&buf, lblk)?;
            if self.find_in(&buf, &recs, name).is_some() {
                return Err(FsError::Exists);
            }
            if first_leaf.is_none() {
                first_leaf = Some((buf, recs));
            }
            if !self.next_leaf(&mut path, hash)? {
                break;
            }
        }
        let mut first = Some(first);
        // Each pass either adds the entry or grows the index by one node
        // (at most one per level), then probes again.
        for _ in 0..=2 * self.max_levels() + 2 {
            let mut frames = match first.take() {
                Some(f) => f,
                None => self.probe(name)?.0,
            };
            let last = frames.len() - 1;
            let leaf = frames[last].block(frames[last].at);
            let (mut buf, recs) = match first_leaf.take() {
                Some(l) => l,
                None => {
                    let buf = self.read_leaf(leaf)?;
                    let recs = self.leaf_records(&buf, leaf)?;
                    (buf, recs)
                }
            };
            if self.insert_in(&mut buf, &recs, name, ino, ft) {
                return self.write_leaf(leaf, buf);
            }
            if frames[last].count() < frames[last].limit() {
                let mut frame = frames.pop().ok_or_else(|| self.bad("htree", "no path"))?;
                let (lblk, mut buf, hint) = self.do_split(&mut frame, leaf, buf, hash, version)?;
                self.put_at(&mut buf, hint, name, ino, ft, lblk)?;
                self.write_leaf(lblk, buf)?;
                return self.write_node(&frame);
            }
            // The leaf's index node is full: split the lowest full level
            // whose parent has room, or add a level under the root.
            let mut fi = last;
            while fi > 0 && frames[fi - 1].count() >= frames[fi - 1].limit() {
                fi -= 1;
            }
            let add_level = fi == 0;
            if add_level && frames.len() == self.max_levels() {
                return Err(FsError::StructureFull(format!(
                    "directory inode {} index is full ({} levels{})",
                    self.p.ino,
                    frames.len(),
                    if self.p.large_dir {
                        ""
                    } else {
                        ", large_dir is off"
                    }
                )));
            }
            let newblock = self.d.append()?;
            let mut node2 = vec![0u8; self.bs];
            put16(&mut node2, 4, rec_len_to_disk(self.bs, self.bs));
            let node_limit = htree::limit(self.bs, NODE_COUNT_OFFSET, self.p.csum.metadata);
            let icount = frames[fi].count();
            let f = &frames[fi];
            let entries = |a: usize, b: usize| {
                f.buf[f.off + a * DX_ENTRY_SIZE..f.off + b * DX_ENTRY_SIZE].to_vec()
            };
            if !add_level {
                let icount1 = icount / 2;
                let icount2 = icount - icount1;
                let hash2 = f.hash(icount1);
                let moved = entries(icount1, icount);
                node2[NODE_COUNT_OFFSET..NODE_COUNT_OFFSET + moved.len()].copy_from_slice(&moved);
                let mut n2 = Frame {
                    lblk: newblock,
                    buf: node2,
                    off: NODE_COUNT_OFFSET,
                    at: 0,
                };
                put16(&mut n2.buf, NODE_COUNT_OFFSET, node_limit as u16);
                n2.set_count(icount2);
                frames[fi].set_count(icount1);
                frames[fi - 1].insert_after_at(hash2, newblock);
                self.write_node(&n2)?;
                self.write_node(&frames[fi - 1])?;
                self.write_node(&frames[fi])?;
            } else {
                let moved = entries(0, icount);
                node2[NODE_COUNT_OFFSET..NODE_COUNT_OFFSET + moved.len()].copy_from_slice(&moved);
                let mut n2 = Frame {
                    lblk: newblock,
                    buf: node2,
                    off: NODE_COUNT_OFFSET,
                    at: 0,
                };
                put16(&mut n2.buf, NODE_COUNT_OFFSET, node_limit as u16);
                n2.set_count(icount);
                let r = &mut frames[0];
                r.set_count(1);
                let o = r.off + 4;
                put32(&mut r.buf, o, newblock);
                r.buf[ROOT_INFO_OFFSET + 6] += 1;
                self.write_node(&frames[0])?;
                self.write_node(&n2)?;
            }
        }
        Err(self.bad("htree", "the index does not settle"))
    }
}

/// The kernel's `dx_sort_map` (comb sort, then bubble sort) on
/// (hash, offset, size) triples, so that equal hashes end up in the
/// kernel's order.
fn dx_sort_map(map: &mut [(u32, usize, usize)]) {
    let n = map.len();
    if n == 0 {
        return;
    }
    let top = n - 1;
    let mut count = n;
    while count > 2 {
        count = count * 10 / 13;
        if count.wrapping_sub(9) < 2 {
            count = 11;
        }
        // p = top, q = p - count; while q >= 0
        let mut p = top as isize;
        let mut q = p - count as isize;
        while q >= 0 {
            if map[p as usize].0 < map[q as usize].0 {
                map.swap(p as usize, q as usize);
            }
            p -= 1;
            q -= 1;
        }
    }
    loop {
        let mut more = false;
        let mut q = top;
        while q > 0 {
            q -= 1;
            if map[q + 1].0 >= map[q].0 {
                continue;
            }
            map.swap(q + 1, q);
            more = true;
        }
        if !more {
            break;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ext4kit_format::dir::{FT_REG_FILE, FT_SYMLINK};
    use std::collections::BTreeMap;

    /// A directory in memory.
    pub struct MemDir {
        pub p: DirParams,
        pub bs: u32,
        pub blocks: Vec<Vec<u8>>,
        pub indexed: bool,
        pub reads: std::cell::Cell<u64>,
        pub hash_override: Option<fn(&[u8]) -> u32>,
    }

    impl MemDir {
        pub fn new(p: DirParams, bs: u32) -> MemDir {
            MemDir {
                blocks: vec![new_dir_block(&p, bs, 2)],
                p,
                bs,
                indexed: false,
                reads: std::cell::Cell::new(0),
                hash_override: None,
            }
        }
    }

    impl DirBlocks for MemDir {
        fn params(&self) -> DirParams {
            self.p
        }
        fn block_size(&self) -> u32 {
            self.bs
        }
        fn nblocks(&self) -> u32 {
            self.blocks.len() as u32
        }
        fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
            self.reads.set(self.reads.get() + 1);
            Ok(self.blocks[lblk as usize].clone())
        }
        fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
            self.blocks[lblk as usize] = data.to_vec();
            Ok(())
        }
        fn append(&mut self) -> Result<u32, FsError> {
            self.blocks.push(vec![0; self.bs as usize]);
            Ok(self.blocks.len() as u32 - 1)
        }
        fn indexed(&self) -> bool {
            self.indexed
        }
        fn set_indexed(&mut self) -> Result<(), FsError> {
            self.indexed = true;
            Ok(())
        }
    }

    pub fn params(metadata: bool, version: u8, unsigned: bool, large_dir: bool) -> DirParams {
        DirParams {
            ino: 12,
            generation: 0x1234_5678,
            csum: Csum::new(metadata, false, false, 0, [7; 16]),
            hash_seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            def_hash_version: version,
            unsigned_hash: unsigned,
            dir_index: true,
            large_dir,
            filetype: true,
            inodes_count: 1 << 20,
            casefold: None,
        }
    }

    /// Walk the whole directory as an independent checker: every block
    /// used once, index hash ranges respected by the leaves, checksums.
    /// Returns name → (ino, type) of the live entries (without . and ..).
    pub fn check(d: &MemDir) -> BTreeMap<Vec<u8>, (u32, u8)> {
        let mut out = BTreeMap::new();
        let w = DirWriter {
            hash_override: d.hash_override,
            p: d.p,
            bs: d.bs as usize,
            d: &mut MemDir {
                p: d.p,
                bs: d.bs,
                blocks: d.blocks.clone(),
                indexed: d.indexed,
                reads: std::cell::Cell::new(0),
                hash_override: None,
            },
        };
        let mut add = |buf: &[u8], recs: Vec<Rec>| {
            for r in recs {
                let n = DirWriter::<MemDir>::name_of(buf, &r).to_vec();
                if r.ino != 0 && n != b"." && n != b".." {
                    assert!(out.insert(n, (r.ino, buf[r.off + 7])).is_none());
                }
            }
        };
        if !w.is_dx() {
            for l in 0..d.nblocks() {
                let b = w.read_leaf(l).unwrap();
                add(&b, w.leaf_records(&b, l).unwrap());
            }
            return out;
        }
        let root = w.read(0).unwrap();
        let (version, levels, off) = w.root_info(&root).unwrap();
        let mut seen = vec![false; d.blocks.len()];
        seen[0] = true;
        // (lblk, depth, lo, hi)
        let mut stack = vec![(0u32, 0usize, 0u32, u64::from(u32::MAX) + 1)];
        while let Some((lblk, depth, lo, hi)) = stack.pop() {
            let buf = w.read(lblk).unwrap();
            let f = w
                .frame(lblk, buf, if lblk == 0 { off } else { NODE_COUNT_OFFSET })
                .unwrap();
            for i in 0..f.count() {
                let clo = if i == 0 { lo } else { f.hash(i) };
                assert!(clo >= lo);
                let chi = if i + 1 < f.count() {
                    u64::from(f.hash(i + 1))
                } else {
                    hi
                };
                let b = f.block(i);
                assert!(!seen[b as usize], "block {b} used twice");
                seen[b as usize] = true;
                if depth < levels {
                    stack.push((b, depth + 1, clo, chi));
                } else {
                    let lb = w.read_leaf(b).unwrap();
                    let recs = w.leaf_records(&lb, b).unwrap();
                    for r in &recs {
                        if r.ino == 0 {
                            continue;
                        }
                        let h = w
                            .hash(version, DirWriter::<MemDir>::name_of(&lb, r))
                            .unwrap();
                        assert!(h >= clo & !1, "hash {h:x} below {clo:x}");
                        let within =
                            u64::from(h) < chi || (chi & 1 == 1 && u64::from(h) == chi & !1);
                        assert!(within, "hash {h:x} at or above {chi:x}");
                    }
                    add(&lb, recs);
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "blocks not in the index");
        out
    }

    fn name(i: u32, len: usize) -> Vec<u8> {
        let mut n = format!("f{i:07}_").into_bytes();
        while n.len() < len {
            n.push(b'a' + (i as usize + n.len()) as u8 % 26);
        }
        n.truncate(len.max(9));
        n
    }

    #[test]
    fn converted_inline_dir_block() {
        let p = params(true, 1, false, false);
        let names: Vec<Vec<u8>> = (0..5).map(|i| format!("n{i}").into_bytes()).collect();
        let ents: Vec<(u32, &[u8], u8)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (20 + i as u32, n.as_slice(), FT_REG_FILE))
            .collect();
        let b = dir_block_from_entries(&p, 1024, 2, &ents).unwrap();
        let got = ext4kit_format::dir::parse_block(&b[..1024 - TAIL_SIZE]).unwrap();
        let seen: Vec<(u32, Vec<u8>)> = got.iter().map(|e| (e.inode, e.name.clone())).collect();
        let mut want = vec![(12, b".".to_vec()), (2, b"..".to_vec())];
        want.extend(ents.iter().map(|(i, n, _)| (*i, n.to_vec())));
        assert_eq!(seen, want);
        let total: usize = got.iter().map(|e| usize::from(e.rec_len)).sum();
        assert_eq!(total, 1024 - TAIL_SIZE);
        assert_eq!(got[0].rec_len, 12);
        // More than a block holds: refused.
        let long = vec![b'x'; 255];
        let many: Vec<(u32, &[u8], u8)> = (0..4).map(|i| (30 + i, long.as_slice(), 1)).collect();
        assert!(dir_block_from_entries(&p, 1024, 2, &many).is_none());
    }

    #[test]
    fn names_are_checked() {
        let mut d = MemDir::new(params(true, 1, false, false), 1024);
        let mut w = DirWriter::new(&mut d);
        assert!(matches!(w.add(b"", 13, 1), Err(FsError::InvalidName(_))));
        assert!(matches!(w.add(b"a/b", 13, 1), Err(FsError::InvalidName(_))));
        assert!(matches!(
            w.add(b"a\0b", 13, 1),
            Err(FsError::InvalidName(_))
        ));
        assert!(matches!(
            w.add(&[b'x'; 256], 13, 1),
            Err(FsError::NameTooLong)
        ));
        assert!(matches!(w.add(b"..", 13, 1), Err(FsError::Exists)));
        w.add(&[b'x'; 255], 13, FT_REG_FILE).unwrap();
        w.add(b"a", 14, FT_REG_FILE).unwrap();
        let e = w.add(b"a", 15, FT_REG_FILE).unwrap_err();
        assert!(matches!(e, FsError::Exists));
        assert_eq!(e.errno(), 17);
        assert!(matches!(w.remove(b"b"), Err(FsError::NotFound)));
        assert!(matches!(w.remove(b".."), Err(FsError::InvalidName(_))));
        assert_eq!(w.remove(b"a").unwrap().ino, 14);
        assert_eq!(check(&d).len(), 1);
    }

    #[test]
    fn linear_slack_reuse_and_remove() {
        let mut p = params(true, 1, false, false);
        p.dir_index = false;
        let mut d = MemDir::new(p, 1024);
        let mut w = DirWriter::new(&mut d);
        w.add(b"one", 20, FT_REG_FILE).unwrap();
        w.add(b"two", 21, FT_SYMLINK).unwrap();
        // "." 12, ".." 12, "one" 12, "two" takes the rest.
        let b = w.read_leaf(0).unwrap();
        let recs = w.leaf_records(&b, 0).unwrap();
        let lens: Vec<usize> = recs.iter().map(|r| r.rec_len).collect();
        assert_eq!(lens, vec![12, 12, 12, 1024 - 12 - 36]);
        // Removing "one" merges it into "..".
        w.remove(b"one").unwrap();
        let b = w.read_leaf(0).unwrap();
        let lens: Vec<usize> = w
            .leaf_records(&b, 0)
            .unwrap()
            .iter()
            .map(|r| r.rec_len)
            .collect();
        assert_eq!(lens, vec![12, 24, 1024 - 48]);
        // ... and a name that fits goes into ".."'s slack again.
        w.add(b"tri", 22, FT_REG_FILE).unwrap();
        let b = w.read_leaf(0).unwrap();
        let lens: Vec<usize> = w
            .leaf_records(&b, 0)
            .unwrap()
            .iter()
            .map(|r| r.rec_len)
            .collect();
        assert_eq!(lens, vec![12, 12, 12, 1024 - 48]);
        // Without dir_index the directory grows linearly.
        for i in 0..200 {
            w.add(&name(i, 20), 100 + i, FT_REG_FILE).unwrap();
        }
        assert!(d.nblocks() > 1 && !d.indexed);
        // The first entry of block 1 removed: inode 0, rec_len kept.
        let b1 = d.blocks[1].clone();
        let first = DirWriter::<MemDir>::name_of(
            &b1,
            &Rec {
                off: 0,
                ino: 0,
                rec_len: 0,
                name_len: usize::from(b1[6]),
            },
        )
        .to_vec();
        let rl = get16(&b1, 4);
        let mut w = DirWriter::new(&mut d);
        w.remove(&first).unwrap();
        assert_eq!(get32(&d.blocks[1], 0), 0);
        assert_eq!(get16(&d.blocks[1], 4), rl);
        assert_eq!(check(&d).len(), 201);
    }

    #[test]
    fn retarget_and_dotdot() {
        for csum in [false, true] {
            let mut d = MemDir::new(params(csum, 1, false, false), 1024);
            let mut w = DirWriter::new(&mut d);
            w.add(b"x", 30, FT_REG_FILE).unwrap();
            assert_eq!(w.retarget(b"x", 31, FT_SYMLINK).unwrap().ino, 30);
            assert_eq!(w.retarget(b"..", 40, FT_DIR).unwrap().ino, 2);
            assert_eq!(w.find(b"..").unwrap().unwrap().ino, 40);
            for i in 0..100 {
                w.add(&name(i, 30), 100 + i, FT_REG_FILE).unwrap();
            }
            assert!(w.is_dx());
            assert!(!w.is_empty().unwrap());
            assert_eq!(w.find(b"..").unwrap().unwrap().ino, 40);
            assert_eq!(w.retarget(b"..", 41, FT_DIR).unwrap().ino, 40);
            assert_eq!(w.find(b"..").unwrap().unwrap().ino, 41);
            assert_eq!(w.find(b"x").unwrap().unwrap().ino, 31);
            w.retarget(&name(5, 30), 7, FT_SYMLINK).unwrap();
            let m = check(&d);
            assert_eq!(m[&name(5, 30)], (7, FT_SYMLINK));
            assert_eq!(m[&b"x".to_vec()], (31, FT_SYMLINK));
            let mut w = DirWriter::new(&mut d);
            for i in 0..100 {
                w.remove(&name(i, 30)).unwrap();
            }
            w.remove(b"x").unwrap();
            assert!(w.is_empty().unwrap());
            assert!(check(&d).is_empty());
        }
    }

    #[test]
    fn make_indexed_dir_layout() {
        let mut d = MemDir::new(params(true, 1, false, false), 4096);
        let mut w = DirWriter::new(&mut d);
        let mut i = 0;
        while !w.is_dx() {
            w.add(&name(i, 40), 100 + i, FT_REG_FILE).unwrap();
            i += 1;
        }
        assert_eq!(d.blocks.len(), 3);
        let root = &d.blocks[0];
        assert_eq!(get16(root, 4), 12);
        assert_eq!(get16(root, 16), 4096 - 12);
        assert_eq!(&root[0x18..0x20], &[0, 0, 0, 0, 1, 8, 0, 0]);
        assert_eq!(get16(root, 0x20), 507);
        assert_eq!(get16(root, 0x22), 2);
        assert_eq!(get32(root, 0x24), 1);
        assert_eq!(get32(root, 0x2C), 2);
        assert_eq!(check(&d).len(), i as usize);
    }

    /// Grow an htree to `n` names; returns the directory.
    fn grow(p: DirParams, bs: u32, n: u32, len: usize) -> MemDir {
        let mut d = MemDir::new(p, bs);
        let mut w = DirWriter::new(&mut d);
        for i in 0..n {
            w.add(&name(i, len), 100 + (i % 1000), FT_REG_FILE).unwrap();
        }
        d
    }

    #[test]
    fn two_levels_and_index_full_without_large_dir() {
        // 1 KiB blocks, 255-byte names: 3 per leaf, the root holds 123
        // leaves, a second level comes quickly; the index fills at 2
        // levels without large_dir.
        let p = params(true, 2, true, false);
        let mut d = grow(p, 1024, 2000, 255);
        assert_eq!(d.blocks[0][0x18 + 6], 1);
        assert_eq!(check(&d).len(), 2000);
        let mut w = DirWriter::new(&mut d);
        for i in 0..2000 {
            assert!(w.find(&name(i, 255)).unwrap().is_some());
        }
        for i in (0..2000).step_by(3) {
            w.remove(&name(i, 255)).unwrap();
        }
        assert_eq!(check(&d).len(), 2000 - 667);
    }

    #[test]
    fn three_levels_with_large_dir() {
        // Tiny index nodes are not possible, so force it: 1 KiB blocks and
        // 255-byte names need 123 * 126 leaves for the third level.
        let p = params(false, 1, false, true);
        let n = 2 * 124 * 127 + 200;
        let d = grow(p, 1024, n, 255);
        assert_eq!(d.blocks[0][0x18 + 6], 2);
        assert_eq!(check(&d).len(), n as usize);
        // Without large_dir the same directory is refused at two levels.
        let mut d2 = MemDir::new(params(false, 1, false, false), 1024);
        let mut w = DirWriter::new(&mut d2);
        let mut full = None;
        for i in 0..n {
            if let Err(e) = w.add(&name(i, 255), 100, FT_REG_FILE) {
                full = Some((i, e));
                break;
            }
        }
        let (i, e) = full.expect("index full");
        assert!(matches!(e, FsError::StructureFull(_)), "{e}");
        assert!(e.to_string().contains("large_dir"), "{e}");
        assert!(i > 124 * 127, "{i}");
    }

    /// A hash with massive collisions: names of one length share it.
    fn len_hash(name: &[u8]) -> u32 {
        (name.len() as u32) << 24
    }

    #[test]
    fn collisions_continue_across_leaves() {
        // Leaves split in the middle of equal hashes: the new index entry
        // carries the continuation bit, lookups and the duplicate check
        // follow it into the next leaves.
        let mut d = MemDir::new(params(true, 1, false, false), 1024);
        d.hash_override = Some(len_hash);
        let mut model = BTreeMap::new();
        let mut w = DirWriter::new(&mut d);
        w.hash_override = Some(len_hash);
        for i in 0..1500u32 {
            let n = name(i, 12 + (i as usize % 3) * 20);
            w.add(&n, 100 + i, FT_REG_FILE).unwrap();
            model.insert(n, (100 + i, FT_REG_FILE));
        }
        for n in model.keys() {
            assert!(w.find(n).unwrap().is_some());
            assert!(matches!(w.add(n, 5, FT_REG_FILE), Err(FsError::Exists)));
        }
        let gone: Vec<Vec<u8>> = model.keys().step_by(2).cloned().collect();
        for n in &gone {
            w.remove(n).unwrap();
            model.remove(n);
        }
        // Index entries with the continuation bit exist.
        let root = &d.blocks[0];
        let count = usize::from(get16(root, 0x22));
        let cont = (1..count)
            .filter(|&i| get32(root, 0x20 + 8 * i) & 1 == 1)
            .count();
        assert!(cont > 3, "{cont} continued index entries");
        assert_eq!(check(&d), model);
    }

    #[test]
    fn inserts_do_not_scan() {
        let p = params(true, 1, false, false);
        let mut d = grow(p, 4096, 10_000, 20);
        d.reads.set(0);
        let mut w = DirWriter::new(&mut d);
        for i in 10_000..11_000 {
            w.add(&name(i, 20), 100, FT_REG_FILE).unwrap();
        }
        // Two probes (duplicate check, insert) of root + node + leaf, plus
        // splits: far from the ~150 blocks of the directory.
        assert!(d.reads.get() < 1000 * 10, "{} reads", d.reads.get());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn model(
            ops in proptest::collection::vec((0u16..600, proptest::bool::ANY, 1usize..80), 1..1500),
            csum in proptest::bool::ANY,
            version in 0u8..3,
            unsigned in proptest::bool::ANY,
            small in proptest::bool::ANY,
        ) {
            let bs = if small { 1024 } else { 4096 };
            let mut d = MemDir::new(params(csum, version, unsigned, false), bs);
            let mut model = BTreeMap::new();
            let mut w = DirWriter::new(&mut d);
            for (k, add, len) in ops {
                let n = name(u32::from(k), len);
                if add {
                    let r = w.add(&n, 100 + u32::from(k), FT_REG_FILE);
                    if let std::collections::btree_map::Entry::Vacant(v) = model.entry(n) {
                        r.unwrap();
                        v.insert((100 + u32::from(k), FT_REG_FILE));
                    } else {
                        proptest::prop_assert!(matches!(r, Err(FsError::Exists)));
                    }
                } else {
                    let r = w.remove(&n);
                    if model.remove(&n).is_some() {
                        r.unwrap();
                    } else {
                        proptest::prop_assert!(matches!(r, Err(FsError::NotFound)));
                    }
                }
            }
            proptest::prop_assert_eq!(check(&d), model);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Damaged blocks make operations fail, never panic.
        #[test]
        fn corrupt_blocks_never_panic(
            n in 0u32..400,
            csum in proptest::bool::ANY,
            hits in proptest::collection::vec((0usize..64, 0usize..4096, 0u8..=255), 1..12),
            ops in proptest::collection::vec((0u32..500, proptest::bool::ANY), 1..60),
        ) {
            let mut d = grow(params(csum, 1, false, false), 1024, n, 24);
            let nb = d.blocks.len();
            for (b, off, v) in hits {
                d.blocks[b % nb][off % 1024] = v;
            }
            let mut w = DirWriter::new(&mut d);
            for (k, add) in ops {
                let nm = name(k, 24);
                let _ = if add {
                    w.add(&nm, 100 + k, FT_REG_FILE).map(|_| ())
                } else {
                    w.remove(&nm).map(|_| ())
                };
                let _ = w.find(&nm);
                let _ = w.retarget(b"..", 3, FT_DIR);
                let _ = w.is_empty();
            }
        }
    }
}
