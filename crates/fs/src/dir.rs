//! Reading directories: linear iteration (entry checks as the kernel's
//! `ext4_check_dir_entry`, checksum tails), inline-data directories, and
//! htree lookup by hash (dx_root and dx_node levels, up to three with
//! large_dir, dx_tail checksums, hash-collision continuation).

use ext4kit_format::dir::{FT_DIR_CSUM, TAIL_SIZE, rec_len, rec_len_from_disk};
use ext4kit_format::dirhash::{self, DX_HASH_SIPHASH};
use ext4kit_format::features::{Compat, Incompat};
use ext4kit_format::fscrypt::{self, NoKeyName};
use ext4kit_format::htree::{self, DxRootInfo};
use zerocopy::FromBytes;

use crate::FsError;
use crate::extent::Mapping;
use crate::file::Content;
use crate::inode::InodeInfo;
use crate::sb::Fs;

/// One live directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub ino: u32,
    pub name: Vec<u8>,
    /// The entry's `file_type` (0 without the filetype feature).
    pub file_type: u8,
}

impl Entry {
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// Does `i` have `EXT4_ENCRYPT_FL` (a directory: its names are
/// ciphertext)?
pub fn is_encrypted(i: &InodeInfo) -> bool {
    i.flags & fscrypt::ENCRYPT_FL != 0
}

/// Largest directory read in one piece (inline or block).
const MAX_DIR_BLOCKS: u64 = 1 << 31;

/// Mask of the block number in a dx_entry (the kernel's `dx_get_block`).
const DX_BLOCK_MASK: u32 = 0x0fff_ffff;

/// A name looked for in a directory, folded once (in a casefolded one)
/// for the comparisons with every entry.
pub struct NameKey<'a> {
    asked: &'a [u8],
    /// The folded name in a casefolded directory (`None` outside one, or
    /// when the name is not UTF-8: then only the same bytes match).
    folded: Option<Vec<u8>>,
}

impl<'a> NameKey<'a> {
    /// `asked` in a directory that is casefolded when `cf`.
    pub fn new(cf: bool, asked: &'a [u8]) -> NameKey<'a> {
        let folded = if cf {
            ext4kit_format::casefold::fold(asked)
        } else {
            None
        };
        NameKey { asked, folded }
    }

    /// What a casefolded directory hashes for the name.
    pub fn hash_input(&self) -> &[u8] {
        self.folded.as_deref().unwrap_or(self.asked)
    }

    /// Whether a directory entry's name `entry` is this name.
    pub fn matches(&self, entry: &[u8]) -> bool {
        entry == self.asked
            || self
                .folded
                .as_ref()
                .is_some_and(|f| ext4kit_format::casefold::fold(entry).as_ref() == Some(f))
    }
}

fn bad(ino: u32, at: impl std::fmt::Display, d: impl std::fmt::Display) -> FsError {
    FsError::corrupt("directory", format!("inode {ino} {at}: {d}"))
}

/// A directory about to be removed (or replaced) as empty must list
/// '.' (ext4_empty_dir): one whose size is 0 or whose first block is
/// damaged lists nothing and is not known to be empty (its entries would
/// be lost). Corrupt, as the kernel's "invalid size".
pub fn check_dots(dir: &InodeInfo, entries: &[Entry]) -> Result<(), FsError> {
    if entries.iter().any(|e| e.name == b"." && e.ino == dir.ino) {
        return Ok(());
    }
    Err(bad(
        dir.ino,
        format_args!("(size {})", dir.size),
        "no '.' entry, so it is not known to be empty; the image needs e2fsck",
    ))
}

/// The blocks of a directory: its whole mapping (for a full read) or
/// none (a lookup maps just the blocks it reads), and its size in blocks.
struct DirBlocks {
    maps: Option<Vec<Mapping>>,
    nblocks: u64,
}

impl Fs<'_> {
    fn is_dx(&self, dir: &InodeInfo) -> bool {
        dir.is_htree()
            && !dir.has_inline_data()
            && self.info.features.compat.contains(Compat::DIR_INDEX)
    }

    fn dir_blocks(&self, dir: &InodeInfo, whole: bool) -> Result<DirBlocks, FsError> {
        let bs = u64::from(self.info.block_size);
        if !dir.size.is_multiple_of(bs) {
            return Err(bad(
                dir.ino,
                "",
                format!("size {} is not a multiple of the block size", dir.size),
            ));
        }
        let nblocks = dir.size / bs;
        if nblocks > MAX_DIR_BLOCKS {
            return Err(bad(dir.ino, "", format!("size {} is too large", dir.size)));
        }
        Ok(DirBlocks {
            maps: if whole {
                Some(self.file_map(dir)?)
            } else {
                None
            },
            nblocks,
        })
    }

    /// Read logical block `lblk` of a directory (holes are errors).
    fn dir_block(&self, dir: &InodeInfo, db: &DirBlocks, lblk: u64) -> Result<Vec<u8>, FsError> {
        if lblk >= db.nblocks {
            return Err(bad(
                dir.ino,
                format!("block {lblk}"),
                format!("past the directory's end ({} blocks)", db.nblocks),
            ));
        }
        let m = match &db.maps {
            Some(maps) => {
                let i = maps.partition_point(|m| m.end() <= lblk);
                maps.get(i).copied().filter(|m| m.lblk <= lblk)
            }
            None if dir.has_extents() => self.extent_at(dir, lblk)?,
            None => self.block_map_at(dir, lblk)?.map(|p| Mapping {
                lblk,
                pblk: p,
                len: 1,
                unwritten: false,
            }),
        };
        match m {
            Some(m) if !m.unwritten => self.blocks.block(m.pblk + (lblk - m.lblk)),
            _ => Err(bad(
                dir.ino,
                format!("block {lblk}"),
                "a hole in a directory",
            )),
        }
    }

    /// Check and parse the entries of a leaf block (`lblk` for messages).
    fn leaf_entries(
        &self,
        dir: &InodeInfo,
        buf: &[u8],
        lblk: u64,
        out: &mut Vec<Entry>,
    ) -> Result<(), FsError> {
        let bs = buf.len();
        let mut end = bs;
        if self.info.csum.metadata {
            let t = &buf[bs - TAIL_SIZE..];
            let tail_ok = t[..4] == [0; 4]
                && u16::from_le_bytes([t[4], t[5]]) == TAIL_SIZE as u16
                && t[6] == 0
                && t[7] == FT_DIR_CSUM;
            if !tail_ok {
                return Err(bad(dir.ino, format!("block {lblk}"), "no checksum tail"));
            }
            let stored = u32::from_le_bytes([t[8], t[9], t[10], t[11]]);
            let c = self
                .info
                .csum
                .dir_block(dir.ino, dir.generation, &buf[..bs - TAIL_SIZE]);
            if c != stored {
                return Err(bad(
                    dir.ino,
                    format!("block {lblk}"),
                    "checksum does not match",
                ));
            }
            end = bs - TAIL_SIZE;
        }
        self.parse_entries(dir, &buf[..end], bs, &format!("block {lblk}"), out)
    }

    /// Parse the records of one region (a block less its tail, or an
    /// inline-data part).
    fn parse_entries(
        &self,
        dir: &InodeInfo,
        buf: &[u8],
        block_size: usize,
        at: &str,
        out: &mut Vec<Entry>,
    ) -> Result<(), FsError> {
        let filetype = self.info.features.incompat.contains(Incompat::FILETYPE);
        let mut off = 0usize;
        while off < buf.len() {
            let here = |d: String| bad(dir.ino, format!("{at} offset {off}"), d);
            if off + 8 > buf.len() {
                return Err(here("entry header runs past the block".into()));
            }
            let ino = u32::from_le_bytes(buf[off..off + 4].try_into().unwrap_or([0; 4]));
            let rl =
                rec_len_from_disk(u16::from_le_bytes([buf[off + 4], buf[off + 5]]), block_size);
            let nl = usize::from(buf[off + 6]);
            if rl < rec_len(1) {
                return Err(here(format!("rec_len {rl} is smaller than the minimum")));
            }
            if !rl.is_multiple_of(4) {
                return Err(here(format!("rec_len {rl} is not a multiple of 4")));
            }
            if rl < rec_len(nl) {
                return Err(here(format!("rec_len {rl} is too small for name_len {nl}")));
            }
            if off + rl > buf.len() {
                return Err(here(format!("rec_len {rl} runs past the block")));
            }
            if ino > self.info.inodes_count {
                return Err(here(format!("inode {ino} is out of range")));
            }
            if ino != 0 {
                if nl == 0 {
                    return Err(here("an entry with an empty name".into()));
                }
                out.push(Entry {
                    ino,
                    name: buf[off + 8..off + 8 + nl].to_vec(),
                    file_type: if filetype { buf[off + 7] } else { 0 },
                });
            }
            off += rl;
        }
        Ok(())
    }

    /// The root of an htree: `.` and `..`, and the index.
    fn dx_root(
        &self,
        dir: &InodeInfo,
        buf: &[u8],
    ) -> Result<(Vec<Entry>, htree::DxNode, u8, u8), FsError> {
        let bs = buf.len();
        let b = |d: &str| bad(dir.ino, "htree root", d);
        let mut dots = Vec::new();
        // "." (rec_len 12) then ".." covering the rest of the block.
        self.parse_entries(dir, &buf[..12], bs, "htree root", &mut dots)?;
        self.parse_entries(dir, &buf[12..], bs, "htree root", &mut dots)?;
        if dots.len() != 2 || dots[0].name != b"." || dots[1].name != b".." {
            return Err(b("the '.' and '..' entries are missing"));
        }
        let (info, _) = DxRootInfo::read_from_prefix(&buf[htree::ROOT_INFO_OFFSET..])
            .map_err(|_| b("short block"))?;
        let levels = info.indirect_levels;
        let max = if self.info.features.incompat.contains(Incompat::LARGEDIR) {
            htree::MAX_LEVELS_LARGEDIR
        } else {
            htree::MAX_LEVELS
        };
        if levels >= max {
            return Err(bad(
                dir.ino,
                "htree root",
                format!("{} index levels (at most {max})", u32::from(levels) + 1),
            ));
        }
        if info.info_length < 8 {
            return Err(b("dx_root_info length below 8"));
        }
        if info.hash_version == DX_HASH_SIPHASH {
            return Err(FsError::Unsupported(format!(
                "directory inode {} uses the siphash directory hash (casefolding)",
                dir.ino
            )));
        }
        if info.hash_version > dirhash::DX_HASH_TEA {
            return Err(bad(
                dir.ino,
                "htree root",
                format!("unknown hash version {}", info.hash_version),
            ));
        }
        let off = htree::ROOT_INFO_OFFSET + usize::from(info.info_length);
        if off + 8 > bs {
            return Err(b("dx_root_info too long"));
        }
        let node = self.dx_index(dir, buf, off, "htree root")?;
        let version = dirhash::effective_version(info.hash_version, self.info.unsigned_hash);
        Ok((dots, node, version, levels))
    }

    /// Parse and check (limit, checksum) the index at `off` of a block.
    fn dx_index(
        &self,
        dir: &InodeInfo,
        buf: &[u8],
        off: usize,
        at: &str,
    ) -> Result<htree::DxNode, FsError> {
        let m = self.info.csum.metadata;
        let node = htree::parse_node(buf, off, htree::limit(buf.len(), off, m))
            .map_err(|d| bad(dir.ino, at, d))?;
        if m {
            let seed = self.info.csum.inode_seed(dir.ino, dir.generation);
            if !htree::checksum_ok(buf, off, &node, seed) {
                return Err(bad(dir.ino, at, "index checksum does not match"));
            }
        }
        Ok(node)
    }

    fn dx_node(
        &self,
        dir: &InodeInfo,
        db: &DirBlocks,
        lblk: u64,
    ) -> Result<htree::DxNode, FsError> {
        let buf = self.dir_block(dir, db, lblk)?;
        let at = format!("htree node (block {lblk})");
        if !htree::is_node_block(&buf, buf.len()) {
            return Err(bad(dir.ino, &at, "not an index node"));
        }
        self.dx_index(dir, &buf, htree::NODE_COUNT_OFFSET, &at)
    }

    /// Levels of index of an htree directory (1 = the root only, up to 3
    /// with large_dir); `None` for a linear directory.
    pub fn htree_levels(&self, dir: &InodeInfo) -> Result<Option<u8>, FsError> {
        if !self.is_dx(dir) {
            return Ok(None);
        }
        let db = self.dir_blocks(dir, false)?;
        let root = self.dir_block(dir, &db, 0)?;
        Ok(Some(self.dx_root(dir, &root)?.3 + 1))
    }

    /// Every live entry of a directory (`.` and `..` included), in on-disk
    /// order (not hash order).
    pub fn read_dir(&self, dir: &InodeInfo) -> Result<Vec<Entry>, FsError> {
        if !dir.is_dir() {
            return Err(FsError::NotADirectory);
        }
        let mut out = Vec::new();
        if dir.has_inline_data() {
            let Content::Inline(data) = self.content(dir)? else {
                return Ok(out);
            };
            if data.len() < 4 {
                return Err(bad(dir.ino, "inline data", "shorter than 4 bytes"));
            }
            let parent = u32::from_le_bytes(data[..4].try_into().unwrap_or([0; 4]));
            if parent == 0 || parent > self.info.inodes_count {
                return Err(bad(
                    dir.ino,
                    "inline data",
                    format!("parent inode {parent}"),
                ));
            }
            out.push(Entry {
                ino: dir.ino,
                name: b".".to_vec(),
                file_type: ext4kit_format::dir::FT_DIR,
            });
            out.push(Entry {
                ino: parent,
                name: b"..".to_vec(),
                file_type: ext4kit_format::dir::FT_DIR,
            });
            let split = data.len().min(60);
            self.parse_entries(dir, &data[4..split], 65536, "inline data", &mut out)?;
            self.parse_entries(dir, &data[split..], 65536, "inline data (xattr)", &mut out)?;
            return Ok(out);
        }
        let db = self.dir_blocks(dir, true)?;
        let dx = self.is_dx(dir);
        for m in db.maps.iter().flatten() {
            if m.lblk >= db.nblocks {
                break;
            }
            for lblk in m.lblk..m.end().min(db.nblocks) {
                let buf = self.dir_block(dir, &db, lblk)?;
                if dx && lblk == 0 {
                    out.extend(self.dx_root(dir, &buf)?.0);
                } else if dx && htree::is_node_block(&buf, buf.len()) {
                    // An index node. Without checksums an emptied leaf
                    // looks the same; it holds no names either way.
                    let node = self.dx_index(dir, &buf, htree::NODE_COUNT_OFFSET, "htree node");
                    if self.info.csum.metadata {
                        node?;
                    }
                } else {
                    self.leaf_entries(dir, &buf, lblk, &mut out)?;
                }
            }
        }
        Ok(out)
    }

    /// The inode `..` names: read from the first block only (where `.`
    /// and `..` always are, also in an htree's root), so walking up a
    /// tree costs one block per level however large its directories are.
    pub fn parent_of(&self, dir: &InodeInfo) -> Result<Option<u32>, FsError> {
        if !dir.is_dir() {
            return Err(FsError::NotADirectory);
        }
        if dir.has_inline_data() || dir.size == 0 {
            return Ok(self
                .read_dir(dir)?
                .into_iter()
                .find(|e| e.name == b"..")
                .map(|e| e.ino));
        }
        let db = self.dir_blocks(dir, false)?;
        let buf = self.dir_block(dir, &db, 0)?;
        let mut out = Vec::new();
        if self.is_dx(dir) {
            out = self.dx_root(dir, &buf)?.0;
        } else {
            self.leaf_entries(dir, &buf, 0, &mut out)?;
        }
        Ok(out.into_iter().find(|e| e.name == b"..").map(|e| e.ino))
    }

    /// Whether `dir` hashes and compares folded names (`EXT4_CASEFOLD_FL`
    /// on a casefold filesystem; not an encrypted directory, whose names
    /// are ciphertext hashed with SipHash under its key).
    pub fn casefolded(&self, dir: &InodeInfo) -> bool {
        self.info.casefold.is_some()
            && dir.flags & crate::fs::flags::CASEFOLD_FL != 0
            && !is_encrypted(dir)
    }

    /// Look `name` up as a user gives it: in an encrypted directory a
    /// no-key name (as [`Fs::read_dir_user`] lists it; any other name is
    /// absent, the kernel's ENOENT without the key). The entry carries the
    /// on-disk name.
    pub fn lookup(&self, dir: &InodeInfo, name: &[u8]) -> Result<Option<Entry>, FsError> {
        if !is_encrypted(dir) || name == b"." || name == b".." {
            return self.lookup_disk(dir, name);
        }
        if !dir.is_dir() {
            return Err(FsError::NotADirectory);
        }
        match fscrypt::decode_nokey_name(name) {
            None => Ok(None),
            Some(NoKeyName::Full(disk)) => self.lookup_disk(dir, &disk),
            Some(long) => Ok(self
                .read_dir(dir)?
                .into_iter()
                .find(|e| e.name != b"." && e.name != b".." && long.matches(&e.name))),
        }
    }

    /// [`Fs::read_dir`] with an encrypted directory's names as the
    /// kernel's no-key names (`fscrypt_fname_disk_to_usr` with the hash
    /// words its readdir passes: the entry's htree hash where the kernel
    /// reads the directory in hash order, `is_dx_dir`, else 0 and 0).
    pub fn read_dir_user(&self, dir: &InodeInfo) -> Result<Vec<Entry>, FsError> {
        let mut entries = self.read_dir(dir)?;
        if !is_encrypted(dir) {
            return Ok(entries);
        }
        let hashed = self.info.features.compat.contains(Compat::DIR_INDEX)
            && (dir.is_htree()
                || dir.size == u64::from(self.info.block_size)
                || dir.has_inline_data());
        let version = if !hashed {
            None
        } else if self.is_dx(dir) {
            let db = self.dir_blocks(dir, false)?;
            let root = self.dir_block(dir, &db, 0)?;
            Some(self.dx_root(dir, &root)?.2)
        } else {
            Some(dirhash::effective_version(
                self.info.def_hash_version,
                self.info.unsigned_hash,
            ))
        };
        for e in &mut entries {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let (major, minor) =
                match version.and_then(|v| dirhash::dirhash(v, &e.name, &self.info.hash_seed)) {
                    Some(h) => (dirhash::kernel_major(h), h.minor),
                    None => (0, 0),
                };
            e.name = fscrypt::nokey_name(&e.name, major, minor);
        }
        Ok(entries)
    }

    /// The on-disk name of the entry a user calls `name` in `dir` (itself
    /// outside encrypted directories); `None` when there is none.
    pub fn disk_name(&self, dir: &InodeInfo, name: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        if !is_encrypted(dir) {
            return Ok(Some(name.to_vec()));
        }
        Ok(self.lookup(dir, name)?.map(|e| e.name))
    }

    /// Look up an entry by its on-disk name.
    pub fn lookup_disk(&self, dir: &InodeInfo, name: &[u8]) -> Result<Option<Entry>, FsError> {
        if !dir.is_dir() {
            return Err(FsError::NotADirectory);
        }
        if self.is_dx(dir) && name != b"." && name != b".." {
            return self.dx_lookup(dir, name);
        }
        let key = NameKey::new(self.casefolded(dir), name);
        Ok(self
            .read_dir(dir)?
            .into_iter()
            .find(|e| key.matches(&e.name)))
    }

    fn dx_lookup(&self, dir: &InodeInfo, name: &[u8]) -> Result<Option<Entry>, FsError> {
        let db = self.dir_blocks(dir, false)?;
        let root = self.dir_block(dir, &db, 0)?;
        let (_, node, version, levels) = self.dx_root(dir, &root)?;
        let key = NameKey::new(self.casefolded(dir), name);
        let h =
            dirhash::dirhash(version, key.hash_input(), &self.info.hash_seed).ok_or_else(|| {
                bad(
                    dir.ino,
                    "htree root",
                    format!("unknown hash version {version}"),
                )
            })?;
        let hash = dirhash::kernel_major(h);
        let pick = |n: &htree::DxNode| n.entries.partition_point(|e| e.0 <= hash).max(1) - 1;
        let mut frames: Vec<(htree::DxNode, usize)> = Vec::new();
        let at = pick(&node);
        frames.push((node, at));
        for _ in 0..levels {
            let (n, at) = frames
                .last()
                .map(|(n, at)| (n, *at))
                .ok_or(FsError::NotFound)?;
            let blk = n.entries[at].1 & DX_BLOCK_MASK;
            let child = self.dx_node(dir, &db, u64::from(blk))?;
            let at = pick(&child);
            frames.push((child, at));
        }
        // Leaves visited; a damaged index could otherwise cycle.
        for _ in 0..=db.nblocks {
            let (n, at) = frames
                .last()
                .map(|(n, at)| (n, *at))
                .ok_or(FsError::NotFound)?;
            let lblk = u64::from(n.entries[at].1 & DX_BLOCK_MASK);
            let buf = self.dir_block(dir, &db, lblk)?;
            let mut entries = Vec::new();
            self.leaf_entries(dir, &buf, lblk, &mut entries)?;
            if let Some(e) = entries.into_iter().find(|e| key.matches(&e.name)) {
                return Ok(Some(e));
            }
            // The next leaf holds more of this hash only if its index
            // entry's hash (less the collision bit) is ours.
            let mut d = frames.len() - 1;
            loop {
                let (n, at) = &mut frames[d];
                if *at + 1 < n.entries.len() {
                    *at += 1;
                    break;
                }
                if d == 0 {
                    return Ok(None);
                }
                d -= 1;
            }
            let (n, at) = &frames[d];
            if n.entries[*at].0 & !1 != hash {
                return Ok(None);
            }
            for k in d + 1..frames.len() {
                let (p, pat) = &frames[k - 1];
                let blk = p.entries[*pat].1 & DX_BLOCK_MASK;
                frames[k] = (self.dx_node(dir, &db, u64::from(blk))?, 0);
            }
        }
        Err(bad(dir.ino, "htree", "the index loops"))
    }
}

#[cfg(test)]
mod tests {
    use super::NameKey;

    #[test]
    fn name_keys_match_folded_names_and_only_bytes_otherwise() {
        let k = NameKey::new(true, "STRASSE".as_bytes());
        assert!(k.matches("straße".as_bytes()) && k.matches(b"Strasse"));
        assert!(!k.matches(b"strase"));
        assert_eq!(k.hash_input(), b"strasse");
        // Not UTF-8: only the same bytes.
        let bad = NameKey::new(true, b"\xffA");
        assert!(bad.matches(b"\xffA") && !bad.matches(b"\xffa"));
        assert_eq!(bad.hash_input(), b"\xffA");
        // Outside a casefolded directory: bytes.
        let plain = NameKey::new(false, b"A");
        assert!(plain.matches(b"A") && !plain.matches(b"a"));
    }
}
