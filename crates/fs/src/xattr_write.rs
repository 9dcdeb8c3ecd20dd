//! Writing extended attributes and POSIX ACLs, the way the kernel's
//! `fs/ext4/xattr.c` and `acl.c` do it.
//!
//! The code changes two things only: the raw on-disk image of one inode
//! (`s_inode_size` bytes: the in-inode area after `i_extra_isize`,
//! `i_file_acl`, `i_blocks`, `i_mode` for ACLs, the inode checksum), which
//! the caller owns and writes back, and xattr blocks, which it reads,
//! writes, allocates and frees through [`XattrBlocks`]. The operations
//! layer implements that trait on a journal handle and the allocator;
//! nothing here touches a device.
//!
//! What the kernel does, and so this code:
//! - **Placement** (`ext4_xattr_set_handle`): a value goes into the inode
//!   when it fits there, else into the block; an attribute that moves is
//!   removed from where it was (a value that now fits in the inode leaves
//!   the block, one that grows out of the inode goes to the block).
//!   128-byte inodes (and `i_extra_isize == 0`) have no in-inode area.
//! - **Layout** (`ext4_xattr_set_entry`): entries grow down from the
//!   header, values (padded to 4 bytes, padding zeroed) grow up from the
//!   end and are kept packed (a removed value's space is closed up); block
//!   entries are sorted by (name index, name length, name), in-inode
//!   entries are appended. A replaced value of the same padded size is
//!   overwritten in place.
//! - **Hashes and checksums**: block entries carry `ext4_xattr_hash_entry`
//!   of name and value, the block header the hash of those
//!   (`ext4_xattr_rehash`), and with metadata_csum the block checksum;
//!   in-inode entries have hash 0, as the kernel writes them.
//! - **Shared blocks**: a block with `h_refcount > 1` is never changed in
//!   place: the inode gets a modified copy in a new block and the old
//!   block's refcount drops by one; a block whose last reference goes is
//!   freed. An identical existing block is reused (refcount + 1, as the
//!   kernel's mbcache does) when the caller names it among
//!   [`XattrBlocks::candidates`] for the block hash; without candidates
//!   every new block is private (refcount 1), which the kernel and e2fsck
//!   accept (the kernel may share it later).
//! - **Limits**: names longer than 255 bytes ERANGE, values over 64 KiB
//!   E2BIG, no room in the inode and the block ENOSPC; an existing
//!   attribute is EEXIST under [`SetMode::Create`], a missing one ENODATA
//!   under [`SetMode::Replace`] and on remove.
//!
//! - **EA inodes** (ea_inode, `ext4_xattr_inode_*`): a value whose padded
//!   size exceeds `EXT4_XATTR_MIN_LARGE_EA_SIZE`, or that fits nowhere
//!   else, goes to a new EA inode ([`XattrBlocks::ea_inode_create`]); the
//!   entry (in the inode or the block) has `e_value_inum`, no bytes in its
//!   area, and the hash of its name and the value's crc32c. References
//!   are counted per place: an in-inode entry holds one, a block holds one
//!   for each of its entries whatever its `h_refcount` (a shared block's
//!   copy takes one more of each, a freed block drops them); a removed or
//!   replaced entry drops its reference ([`XattrBlocks::ea_inode_ref`]),
//!   and the last one frees the EA inode in the same transaction (no
//!   orphan is needed: nothing is left half done across a crash). EA
//!   inodes are not shared between values (the kernel's EA-inode cache):
//!   each new value gets its own, which the kernel and e2fsck accept.
//!   Blocks naming EA inodes are not shared either.
//!
//! Not done: `system.data` (inline data, left to the inline-data code), growing
//! `i_extra_isize`, quota. Permission checks (owner, CAP_SYS_ADMIN for
//! `trusted.`, sticky directories, clearing S_ISGID on ACL changes) are the
//! caller's; the file-type rules that do not depend on the caller are here
//! (`user.` only on regular files and directories, no ACLs on symlinks,
//! default ACLs only on directories).
//!
//! After a change that returns `true` the caller sets the inode's ctime
//! (and `i_version`), writes the inode back (the inode checksum is
//! already recomputed here; a caller that changes more fields afterwards
//! recomputes it with [`ext4kit_format::inode::set_checksum`]), and sets
//! the `ext_attr` compat feature in the superblock if it is not set
//! (`ext4_xattr_update_super_block`).
//!
//! For a new inode: [`ext4kit_format::acl::inherit`] gives its mode and
//! ACLs from the directory's default ACL (store them with [`set_acl`]);
//! for a deleted one, [`release_xattr_block`] drops its block reference.

use ext4kit_format::acl::{self, AclEntry};
use ext4kit_format::inode::{EXT4_HUGE_FILE_FL, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, set_checksum};
use ext4kit_format::xattr::{self as fx, BLOCK_HEADER_SIZE, ENTRY_HEADER_SIZE, XATTR_MAGIC};
use ext4kit_format::{Csum, Incompat, RoCompat};

use crate::FsError;
use crate::sb::FsInfo;

/// Where the xattr code gets and puts xattr blocks. The operations layer
/// implements it on a journal handle (reads see the running transaction,
/// writes are journaled metadata) and the block allocator.
pub trait XattrBlocks {
    /// The current contents of block `blk` (one filesystem block).
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError>;
    /// Replace block `blk` with `data` (one block, checksum already set).
    /// Journaled by the implementation.
    fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError>;
    /// Allocate one metadata block, near `goal` (the first block of the
    /// inode's group, as the kernel asks). `Ok(None)` when the
    /// filesystem is full (reported as ENOSPC). The block's contents are
    /// written with [`XattrBlocks::write`] right after.
    fn alloc(&mut self, goal: u64) -> Result<Option<u64>, FsError>;
    /// Free block `blk` (it held xattrs: revoke it, and do not reuse it
    /// before the transaction commits).
    fn free(&mut self, blk: u64) -> Result<(), FsError>;
    /// Xattr blocks that may hold exactly the attributes of a block whose
    /// header hash is `hash` (the kernel's mbcache lookup; false hits are
    /// fine, each candidate is read and compared). A new or changed
    /// attribute set equal to a candidate's takes a reference to it
    /// instead of a block of its own. Only blocks that are allocated and
    /// hold xattrs may be named (forget a block when it is freed, as the
    /// kernel drops it from the mbcache). The default knows none: no
    /// sharing.
    fn candidates(&self, hash: u32) -> Vec<u64> {
        let _ = hash;
        Vec::new()
    }
    /// ea_inode: make an EA inode holding `value` for inode `owner`
    /// (owned by `uid:gid`, as `ext4_xattr_inode_create`): a regular
    /// file with EXT4_EA_INODE_FL, one link, refcount 1 (`i_ctime` high
    /// word, `i_version` low word), `hash` (crc32c of the value) in
    /// `i_atime`, the value in its data blocks (journaled, as the kernel
    /// writes them). `Ok(None)` when the filesystem is full (ENOSPC).
    /// The default cannot: values that need one are refused.
    fn ea_inode_create(
        &mut self,
        owner: u32,
        uid: u32,
        gid: u32,
        value: &[u8],
        hash: u32,
    ) -> Result<Option<u32>, FsError> {
        let _ = (owner, uid, gid, value, hash);
        Err(FsError::Unsupported(
            "attribute values in EA inodes (ea_inode) here".into(),
        ))
    }
    /// ea_inode: add `delta` (+1 or -1) to EA inode `inum`'s refcount
    /// (`ext4_xattr_inode_update_ref`); the inode is freed with its
    /// blocks when the count reaches 0, in the same transaction.
    fn ea_inode_ref(&mut self, inum: u32, delta: i64) -> Result<(), FsError> {
        let _ = (inum, delta);
        Err(FsError::Unsupported(
            "attribute values in EA inodes (ea_inode) here".into(),
        ))
    }
}

/// A value as [`set_entry`] stores it: bytes in the area, or a reference
/// to an EA inode (no bytes in the area).
#[derive(Clone, Copy)]
enum Val<'a> {
    Bytes(&'a [u8]),
    Ea { inum: u32, len: usize, hash: u32 },
}

impl Val<'_> {
    /// Bytes the value takes in its area.
    fn area_size(&self) -> usize {
        match self {
            Val::Bytes(v) => fx::value_size_padded(v.len()),
            Val::Ea { .. } => 0,
        }
    }
}

/// `ext4_xattr_inode_hash`: crc32c of the value with the filesystem seed.
pub fn ea_value_hash(geo: &XattrGeometry, value: &[u8]) -> u32 {
    ext4kit_format::checksum::crc32c_raw(geo.csum.seed, value)
}

/// The filesystem settings the xattr writer needs.
#[derive(Clone, Debug)]
pub struct XattrGeometry {
    pub block_size: usize,
    pub csum: Csum,
    /// 64bit: `i_file_acl` has 48 bits.
    pub bit64: bool,
    /// huge_file: `i_blocks` has 48 bits and may count in blocks.
    pub huge_file: bool,
    /// ea_inode (large values in EA inodes).
    pub ea_inode: bool,
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub blocks_count: u64,
    /// Blocks per cluster (bigalloc; 1 without): an xattr block holds a
    /// cluster of its own, and EA inode values are charged in clusters.
    pub cluster_blocks: u64,
}

impl XattrGeometry {
    pub fn new(info: &FsInfo) -> XattrGeometry {
        XattrGeometry {
            block_size: info.block_size as usize,
            csum: info.csum,
            bit64: info.features.incompat.contains(Incompat::BIT64),
            huge_file: info.features.ro_compat.contains(RoCompat::HUGE_FILE),
            ea_inode: info.features.incompat.contains(Incompat::EA_INODE),
            first_data_block: info.first_data_block,
            blocks_per_group: info.blocks_per_group,
            inodes_per_group: info.inodes_per_group,
            blocks_count: info.blocks_count,
            cluster_blocks: if info.features.ro_compat.contains(RoCompat::BIGALLOC) {
                1u64 << info
                    .sb
                    .s_log_cluster_size
                    .get()
                    .saturating_sub(info.sb.s_log_block_size.get())
                    .min(31)
            } else {
                1
            },
        }
    }

    /// The allocation goal for inode `ino`'s block: its group's first block.
    pub fn goal(&self, ino: u32) -> u64 {
        let g = u64::from(ino.saturating_sub(1) / self.inodes_per_group.max(1));
        self.first_data_block + g * u64::from(self.blocks_per_group)
    }
}

/// Why an xattr change was refused. Nothing was changed then (except
/// after [`XattrError::Fs`], which the caller treats as an aborted
/// transaction).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum XattrError {
    /// XATTR_CREATE and the attribute exists (EEXIST).
    #[error("File exists")]
    Exists,
    /// XATTR_REPLACE or remove and the attribute does not exist (ENODATA).
    #[error("No data available")]
    NoData,
    /// No room in the inode nor in an xattr block (ENOSPC).
    #[error("No space left on device")]
    NoSpace,
    /// A name longer than 255 bytes (ERANGE).
    #[error("Numerical result out of range (attribute name longer than 255 bytes)")]
    NameTooLong,
    /// A value larger than 65536 bytes (E2BIG).
    #[error("Argument list too long (attribute value larger than 65536 bytes)")]
    ValueTooBig,
    /// A malformed name or ACL (EINVAL).
    #[error("Invalid argument ({0})")]
    Invalid(&'static str),
    /// A namespace or feature not handled (EOPNOTSUPP).
    #[error("Operation not supported ({0})")]
    NotSupported(String),
    /// The file type does not take this attribute (EPERM).
    #[error("Operation not permitted ({0})")]
    NotPermitted(&'static str),
    /// A default ACL on a non-directory (EACCES).
    #[error("Permission denied ({0})")]
    AccessDenied(&'static str),
    /// Reading or writing failed, or a structure is corrupt.
    #[error(transparent)]
    Fs(#[from] FsError),
}

impl XattrError {
    /// The errno for a POSIX caller.
    pub fn errno(&self) -> i32 {
        match self {
            XattrError::Exists => 17,
            XattrError::NoData => 61,
            XattrError::NoSpace => 28,
            XattrError::NameTooLong => 34,
            XattrError::ValueTooBig => 7,
            XattrError::Invalid(_) => 22,
            XattrError::NotSupported(_) => 95,
            XattrError::NotPermitted(_) => 1,
            XattrError::AccessDenied(_) => 13,
            XattrError::Fs(e) => e.errno(),
        }
    }
}

/// setxattr's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SetMode {
    /// Create or replace (flags 0).
    #[default]
    Any,
    /// XATTR_CREATE: fail with EEXIST if it exists.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if it does not.
    Replace,
}

/// Which ACL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclKind {
    Access,
    Default,
}

impl AclKind {
    fn index(self) -> u8 {
        match self {
            AclKind::Access => fx::INDEX_POSIX_ACL_ACCESS,
            AclKind::Default => fx::INDEX_POSIX_ACL_DEFAULT,
        }
    }
}

// ---- raw inode fields -------------------------------------------------

const OFF_BLOCKS_LO: usize = 0x1C;
const OFF_FLAGS: usize = 0x20;
const OFF_FILE_ACL_LO: usize = 0x68;
const OFF_BLOCKS_HI: usize = 0x74;
const OFF_FILE_ACL_HI: usize = 0x76;

fn g16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn g32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn p16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}
fn p32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn slot_mode(slot: &[u8]) -> u16 {
    g16(slot, 0)
}

fn slot_file_acl(geo: &XattrGeometry, slot: &[u8]) -> u64 {
    let hi = if geo.bit64 {
        u64::from(g16(slot, OFF_FILE_ACL_HI)) << 32
    } else {
        0
    };
    u64::from(g32(slot, OFF_FILE_ACL_LO)) | hi
}

fn set_slot_file_acl(geo: &XattrGeometry, slot: &mut [u8], blk: u64) {
    p32(slot, OFF_FILE_ACL_LO, blk as u32);
    if geo.bit64 {
        p16(slot, OFF_FILE_ACL_HI, (blk >> 32) as u16);
    }
}

/// Add `delta` filesystem blocks to `i_blocks` (in 512-byte units, or in
/// blocks with EXT4_HUGE_FILE_FL).
fn add_slot_blocks(geo: &XattrGeometry, slot: &mut [u8], delta: i64) {
    let huge_fl = geo.huge_file && g32(slot, OFF_FLAGS) & EXT4_HUGE_FILE_FL != 0;
    let unit = if huge_fl {
        1
    } else {
        (geo.block_size / 512) as i64
    };
    let mut v = u64::from(g32(slot, OFF_BLOCKS_LO));
    if geo.huge_file {
        v |= u64::from(g16(slot, OFF_BLOCKS_HI)) << 32;
    }
    let v = (v as i64).saturating_add(delta * unit).max(0) as u64;
    p32(slot, OFF_BLOCKS_LO, v as u32);
    if geo.huge_file {
        p16(slot, OFF_BLOCKS_HI, (v >> 32) as u16);
    }
}

/// Start of the in-inode xattr header, when the inode has room for one
/// (`EXT4_INODE_HAS_XATTR_SPACE`).
fn ibody_start(slot: &[u8]) -> Option<usize> {
    if slot.len() <= 128 {
        return None;
    }
    let extra = usize::from(g16(slot, 0x80));
    let start = 128 + extra;
    (extra != 0 && start + fx::IBODY_HEADER_SIZE + 4 <= slot.len()).then_some(start)
}

// ---- entry areas ------------------------------------------------------
//
// An area is a buffer whose entries start at `first` and whose value
// offsets count from `base`; it ends at the buffer's end. For the inode,
// the buffer is the whole slot and base = first = header + 4; for a block,
// base = 0 and first = 32.

#[derive(Clone, Copy)]
struct Ent {
    name_len: usize,
    index: u8,
    offs: usize,
    inum: u32,
    size: usize,
}

fn ent(b: &[u8], e: usize) -> Ent {
    Ent {
        name_len: usize::from(b[e]),
        index: b[e + 1],
        offs: usize::from(g16(b, e + 2)),
        inum: g32(b, e + 4),
        size: g32(b, e + 8) as usize,
    }
}

fn is_last(b: &[u8], e: usize) -> bool {
    b[e..e + 4] == [0, 0, 0, 0]
}

fn next(b: &[u8], e: usize) -> usize {
    e + fx::entry_size(usize::from(b[e]))
}

/// The kernel's `check_xattrs` for an area (bounds of names and values).
fn check_area(b: &[u8], base: usize, first: usize, ea_inode: bool) -> Result<(), &'static str> {
    let end = b.len();
    let mut e = first;
    loop {
        if e + 4 > end {
            return Err("entry list runs past its area");
        }
        if is_last(b, e) {
            break;
        }
        let n = next(b, e);
        if e + ENTRY_HEADER_SIZE > end || n >= end {
            return Err("entry name out of bounds");
        }
        let nl = usize::from(b[e]);
        if b[e + ENTRY_HEADER_SIZE..e + ENTRY_HEADER_SIZE + nl].contains(&0) {
            return Err("bad entry name length");
        }
        e = n;
    }
    let term = e;
    let mut e = first;
    while e < term {
        let x = ent(b, e);
        if x.inum != 0 && !ea_inode {
            return Err("value in an EA inode without the ea_inode feature");
        }
        if x.size > (1 << 24) {
            return Err("value size too large");
        }
        if x.size != 0 && x.inum == 0 {
            if x.offs > end - base {
                return Err("value out of bounds");
            }
            let v = base + x.offs;
            if v < term + 4 || x.size > end - v || fx::value_size_padded(x.size) > end - v {
                return Err("value overlaps the entries or runs past the area");
            }
        }
        e = next(b, e);
    }
    Ok(())
}

/// `xattr_find_entry`: the entry called (`index`, `name`), or where it
/// would go (sorted areas: before the first larger entry; unsorted: at
/// the end).
fn find(b: &[u8], first: usize, index: u8, name: &[u8], sorted: bool) -> (usize, bool) {
    let mut e = first;
    let mut cmp: i32 = 1;
    while !is_last(b, e) {
        let x = ent(b, e);
        cmp = i32::from(index) - i32::from(x.index);
        if cmp == 0 {
            cmp = name.len() as i32 - x.name_len as i32;
        }
        if cmp == 0 {
            let en = &b[e + ENTRY_HEADER_SIZE..e + ENTRY_HEADER_SIZE + x.name_len];
            cmp = match name.cmp(en) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            };
        }
        if cmp <= 0 && (sorted || cmp == 0) {
            break;
        }
        e = next(b, e);
    }
    (e, cmp == 0)
}

/// `ext4_xattr_set_entry` (without EA inodes): set (`Some`) or remove
/// (`None`) the entry at `here` (`found`: it is the named entry, else the
/// insertion point). Nothing changes on ENOSPC.
#[allow(clippy::too_many_arguments)]
fn set_entry(
    b: &mut [u8],
    base: usize,
    first: usize,
    here: usize,
    found: bool,
    index: u8,
    name: &[u8],
    value: Option<Val<'_>>,
    is_block: bool,
    reserve: Option<usize>,
) -> Result<(), XattrError> {
    let end = b.len();
    let name_len = name.len();
    let esize = fx::entry_size(name_len);
    let old_size = if found && ent(b, here).inum == 0 {
        fx::value_size_padded(ent(b, here).size)
    } else {
        0
    };
    let new_size = value.map_or(0, |v| v.area_size());
    if let Some(Val::Bytes(v)) = value
        && found
        && ent(b, here).inum == 0
        && new_size != 0
        && new_size == old_size
    {
        let offs = ent(b, here).offs;
        p32(b, here + 8, v.len() as u32);
        let at = base + offs;
        b[at..at + v.len()].copy_from_slice(v);
        b[at + v.len()..at + new_size].fill(0);
    } else {
        let mut min_offs = end - base;
        let mut last = first;
        while !is_last(b, last) {
            let x = ent(b, last);
            if x.inum == 0 && x.size != 0 && x.offs < min_offs {
                min_offs = x.offs;
            }
            last = next(b, last);
        }
        if value.is_some() {
            let mut free = min_offs.saturating_sub(last - base + 4);
            if found {
                free += esize + old_size;
            }
            if free < esize + new_size {
                return Err(XattrError::NoSpace);
            }
            if let Some(r) = reserve
                && new_size != 0
                && is_block
                && min_offs + old_size < new_size + r
            {
                return Err(XattrError::NoSpace);
            }
        }
        // Remove the old value, closing the gap (a value in an EA inode
        // has none here; the caller drops that inode's reference).
        if found && ent(b, here).inum == 0 && ent(b, here).size != 0 {
            let first_val = base + min_offs;
            let offs = ent(b, here).offs;
            let val = base + offs;
            b.copy_within(first_val..val, first_val + old_size);
            b[first_val..first_val + old_size].fill(0);
            min_offs += old_size;
            let mut e = first;
            while !is_last(b, e) {
                let x = ent(b, e);
                if x.inum == 0 && x.size != 0 && x.offs < offs {
                    p16(b, e + 2, (x.offs + old_size) as u16);
                }
                e = next(b, e);
            }
        }
        match value {
            None => {
                // Remove the name.
                let new_last = last - esize;
                b.copy_within(here + esize..last + 4, here);
                b[new_last + 4..last + 4].fill(0);
            }
            Some(_) if !found => {
                let rest = last - here + 4;
                b.copy_within(here..here + rest, here + esize);
                b[here..here + esize].fill(0);
                b[here] = name_len as u8;
                b[here + 1] = index;
                b[here + ENTRY_HEADER_SIZE..here + ENTRY_HEADER_SIZE + name_len]
                    .copy_from_slice(name);
            }
            Some(_) => {
                p32(b, here + 4, 0);
                p16(b, here + 2, 0);
                p32(b, here + 8, 0);
            }
        }
        match value {
            Some(Val::Bytes(v)) => {
                if !v.is_empty() {
                    let off = min_offs - new_size;
                    p16(b, here + 2, off as u16);
                    let at = base + off;
                    b[at..at + v.len()].copy_from_slice(v);
                    b[at + v.len()..at + new_size].fill(0);
                }
                p32(b, here + 8, v.len() as u32);
            }
            Some(Val::Ea { inum, len, .. }) => {
                p16(b, here + 2, 0);
                p32(b, here + 4, inum);
                p32(b, here + 8, len as u32);
            }
            None => {}
        }
    }
    match value {
        // In the block and in the inode alike, an entry naming an EA inode
        // hashes the name and the value's crc32c (ext4_xattr_set_entry).
        Some(Val::Ea { hash, .. }) => {
            p32(b, here + 12, fx::entry_hash(name, &hash.to_le_bytes()));
        }
        Some(Val::Bytes(v)) => {
            let hash = if is_block { fx::entry_hash(name, v) } else { 0 };
            p32(b, here + 12, hash);
        }
        None => {}
    }
    if is_block {
        rehash(b);
    }
    Ok(())
}

/// `ext4_xattr_rehash`: the block header's hash.
fn rehash(b: &mut [u8]) {
    let mut hashes = Vec::new();
    let mut e = BLOCK_HEADER_SIZE;
    while !is_last(b, e) {
        hashes.push(g32(b, e + 12));
        e = next(b, e);
    }
    let h = fx::block_hash(hashes);
    p32(b, 12, h);
}

fn set_block_csum(geo: &XattrGeometry, blk: u64, b: &mut [u8]) {
    if geo.csum.metadata {
        let c = geo.csum.xattr_block(blk, b);
        p32(b, 16, c);
    }
}

fn corrupt(ino: u32, where_: &str, d: impl std::fmt::Display) -> XattrError {
    XattrError::Fs(FsError::corrupt(
        "extended attributes",
        format!("inode {ino} {where_}: {d}"),
    ))
}

// ---- the two places ---------------------------------------------------

struct Ibody {
    start: usize,
    here: usize,
    found: bool,
}

fn ibody_find(
    geo: &XattrGeometry,
    ino: u32,
    slot: &[u8],
    index: u8,
    name: &[u8],
) -> Result<Option<Ibody>, XattrError> {
    let Some(start) = ibody_start(slot) else {
        return Ok(None);
    };
    let first = start + 4;
    if g32(slot, start) != XATTR_MAGIC {
        return Ok(Some(Ibody {
            start,
            here: first,
            found: false,
        }));
    }
    check_area(slot, first, first, geo.ea_inode).map_err(|d| corrupt(ino, "in the inode", d))?;
    let (here, found) = find(slot, first, index, name, false);
    Ok(Some(Ibody { start, here, found }))
}

/// `ext4_xattr_ibody_set` on `slot`.
fn ibody_set(
    slot: &mut [u8],
    ib: &Ibody,
    index: u8,
    name: &[u8],
    value: Option<Val<'_>>,
) -> Result<(), XattrError> {
    let first = ib.start + 4;
    if g32(slot, ib.start) != XATTR_MAGIC {
        // No attributes yet: whatever the area holds is not an entry list.
        let mut scratch = slot.to_vec();
        scratch[ib.start..].fill(0);
        set_entry(
            &mut scratch,
            first,
            first,
            first,
            false,
            index,
            name,
            value,
            false,
            None,
        )?;
        slot.copy_from_slice(&scratch);
    } else {
        set_entry(
            slot, first, first, ib.here, ib.found, index, name, value, false, None,
        )?;
    }
    let magic = if is_last(slot, first) { 0 } else { XATTR_MAGIC };
    p32(slot, ib.start, magic);
    Ok(())
}

struct Block {
    blk: u64,
    data: Vec<u8>,
    here: usize,
    found: bool,
}

fn read_block(
    geo: &XattrGeometry,
    blocks: &dyn XattrBlocks,
    ino: u32,
    blk: u64,
) -> Result<Vec<u8>, XattrError> {
    let where_ = format!("block {blk}");
    if blk < geo.first_data_block || blk >= geo.blocks_count {
        return Err(corrupt(ino, &where_, "outside the filesystem"));
    }
    let data = blocks.read(blk)?;
    if data.len() != geo.block_size {
        return Err(corrupt(ino, &where_, "short block"));
    }
    if g32(&data, 0) != XATTR_MAGIC || g32(&data, 8) != 1 {
        return Err(corrupt(ino, &where_, "invalid header"));
    }
    if geo.csum.metadata && geo.csum.xattr_block(blk, &data) != g32(&data, 16) {
        return Err(corrupt(ino, &where_, "checksum does not match"));
    }
    if g32(&data, 4) == 0 {
        return Err(corrupt(ino, &where_, "reference count 0"));
    }
    Ok(data)
}

fn block_find(
    geo: &XattrGeometry,
    blocks: &dyn XattrBlocks,
    ino: u32,
    slot: &[u8],
    index: u8,
    name: &[u8],
) -> Result<Option<Block>, XattrError> {
    let blk = slot_file_acl(geo, slot);
    if blk == 0 {
        return Ok(None);
    }
    let data = read_block(geo, blocks, ino, blk)?;
    check_area(&data, 0, BLOCK_HEADER_SIZE, geo.ea_inode)
        .map_err(|d| corrupt(ino, &format!("block {blk}"), d))?;
    let (here, found) = find(&data, BLOCK_HEADER_SIZE, index, name, true);
    Ok(Some(Block {
        blk,
        data,
        here,
        found,
    }))
}

/// Drop one reference to xattr block `blk` (`ext4_xattr_release_block`):
/// free it when it was the last, else write it back with the refcount
/// lowered. `i_blocks` loses the block either way.
fn release_block(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    slot: &mut [u8],
    blk: u64,
    mut data: Vec<u8>,
) -> Result<(), XattrError> {
    let refs = g32(&data, 4);
    if refs <= 1 {
        // ext4_xattr_inode_dec_ref_all: the block's EA inode references
        // go with it.
        for inum in ea_inums(&data, BLOCK_HEADER_SIZE) {
            blocks.ea_inode_ref(inum, -1)?;
        }
        blocks.free(blk)?;
    } else {
        p32(&mut data, 4, refs - 1);
        set_block_csum(geo, blk, &mut data);
        blocks.write(blk, &data)?;
    }
    add_slot_blocks(geo, slot, -(geo.cluster_blocks as i64));
    Ok(())
}

/// `ext4_xattr_block_set`: set or remove in the block (a new one when the
/// inode has none, a copy when it is shared).
#[allow(clippy::too_many_arguments)]
fn block_set(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    cur: Option<&Block>,
    index: u8,
    name: &[u8],
    value: Option<Val<'_>>,
) -> Result<(), XattrError> {
    let reserve = geo.ea_inode.then(|| fx::block_reserve(geo.block_size));
    let (mut buf, here, found) = match cur {
        Some(c) => {
            let mut b = c.data.clone();
            p32(&mut b, 4, 1);
            (b, c.here, c.found)
        }
        None => {
            let mut b = vec![0u8; geo.block_size];
            p32(&mut b, 0, XATTR_MAGIC);
            p32(&mut b, 4, 1);
            p32(&mut b, 8, 1);
            (b, BLOCK_HEADER_SIZE, false)
        }
    };
    set_entry(
        &mut buf,
        0,
        BLOCK_HEADER_SIZE,
        here,
        found,
        index,
        name,
        value,
        true,
        reserve,
    )?;
    let empty = is_last(&buf, BLOCK_HEADER_SIZE);
    let private = cur.is_some_and(|c| g32(&c.data, 4) == 1);
    let cur_blk = cur.map(|c| c.blk);
    let twin = if empty {
        None
    } else {
        find_identical(geo, blocks, &buf, cur_blk)?
    };
    let new_blk = if empty {
        None
    } else if let Some((tb, mut td)) = twin {
        // The kernel's mbcache reuse: take a reference to the twin.
        let refs = g32(&td, 4);
        p32(&mut td, 4, refs + 1);
        set_block_csum(geo, tb, &mut td);
        blocks.write(tb, &td)?;
        add_slot_blocks(geo, slot, geo.cluster_blocks as i64);
        Some(tb)
    } else if let (true, Some(cb)) = (private, cur_blk) {
        set_block_csum(geo, cb, &mut buf);
        blocks.write(cb, &buf)?;
        Some(cb)
    } else {
        let Some(nb) = blocks.alloc(geo.goal(ino))? else {
            return Err(XattrError::NoSpace);
        };
        set_block_csum(geo, nb, &mut buf);
        blocks.write(nb, &buf)?;
        add_slot_blocks(geo, slot, geo.cluster_blocks as i64);
        Some(nb)
    };
    set_slot_file_acl(geo, slot, new_blk.unwrap_or(0));
    // EA inode references belong to the block: a shared block keeps its
    // own (the changed entry's too), and its copy takes one more of each
    // EA inode it carries over (ext4_xattr_inode_inc_ref_all); a private
    // block loses the changed entry's.
    let old_inum = cur
        .filter(|c| c.found)
        .map_or(0, |c| ent(&c.data, c.here).inum);
    if let Some(c) = cur {
        if private {
            if old_inum != 0 {
                blocks.ea_inode_ref(old_inum, -1)?;
            }
        } else if new_blk.is_some() && new_blk != Some(c.blk) {
            for inum in ea_inums(&c.data, BLOCK_HEADER_SIZE) {
                if !(c.found && inum == old_inum) {
                    blocks.ea_inode_ref(inum, 1)?;
                }
            }
        }
    }
    if let Some(c) = cur
        && Some(c.blk) != new_blk
    {
        // The old block's remaining EA inode references went to `buf` (or
        // away with the changed entry, above): none to drop on release.
        let mut old = c.data.clone();
        if private {
            clear_ea_inums(&mut old);
        }
        release_block(geo, blocks, slot, c.blk, old)?;
    }
    Ok(())
}

/// The EA inodes an area's entries name (one per entry).
fn ea_inums(b: &[u8], first: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut e = first;
    while !is_last(b, e) {
        let n = ent(b, e).inum;
        if n != 0 {
            out.push(n);
        }
        e = next(b, e);
    }
    out
}

/// Zero the EA inode numbers of a block image (so that releasing it
/// drops no EA inode references).
fn clear_ea_inums(b: &mut [u8]) {
    let mut e = BLOCK_HEADER_SIZE;
    while !is_last(b, e) {
        p32(b, e + 4, 0);
        e = next(b, e);
    }
}

/// A block the caller knows of ([`XattrBlocks::candidates`]) with the same
/// entries and values as `buf` (the kernel's `ext4_xattr_cmp`) and room
/// for one more reference.
fn find_identical(
    geo: &XattrGeometry,
    blocks: &dyn XattrBlocks,
    buf: &[u8],
    skip: Option<u64>,
) -> Result<Option<(u64, Vec<u8>)>, XattrError> {
    let hash = g32(buf, 12);
    if hash == 0 {
        return Ok(None);
    }
    for c in blocks.candidates(hash) {
        if Some(c) == skip || c < geo.first_data_block || c >= geo.blocks_count {
            continue;
        }
        let d = blocks.read(c)?;
        if d.len() != geo.block_size
            || g32(&d, 0) != XATTR_MAGIC
            || g32(&d, 8) != 1
            || g32(&d, 12) != hash
            || g32(&d, 4) == 0
            || g32(&d, 4) >= fx::REFCOUNT_MAX
            || (geo.csum.metadata && geo.csum.xattr_block(c, &d) != g32(&d, 16))
        {
            continue;
        }
        if same_entries(buf, &d) {
            return Ok(Some((c, d)));
        }
    }
    Ok(None)
}

fn same_entries(a: &[u8], b: &[u8]) -> bool {
    let (Ok((ea, _)), Ok((eb, _))) = (
        fx::parse_entries(a, BLOCK_HEADER_SIZE),
        fx::parse_entries(b, BLOCK_HEADER_SIZE),
    ) else {
        return false;
    };
    ea.len() == eb.len()
        && ea.iter().zip(&eb).all(|(x, y)| {
            let val = |buf: &[u8], e: &fx::RawEntry| {
                let o = usize::from(e.value_offs);
                buf.get(o..o + e.value_size as usize).map(<[u8]>::to_vec)
            };
            x.hash == y.hash
                && x.name_index == y.name_index
                && x.name == y.name
                && x.value_size == y.value_size
                && x.value_inum == y.value_inum
                && y.value_inum == 0
                && val(a, x).is_some()
                && val(a, x) == val(b, y)
        })
}

fn value_same(b: &[u8], base: usize, here: usize, value: &[u8]) -> bool {
    let x = ent(b, here);
    x.inum == 0 && x.size == value.len() && b[base + x.offs..base + x.offs + x.size] == *value
}

/// Store value `v` of (`index`, `name`): in the inode when it fits,
/// else in the block, removing the entry from the other place; with
/// `in_ea` the value goes to a new EA inode first and the entry names
/// it (the inode is released again when no place has room).
#[allow(clippy::too_many_arguments)]
fn place(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    s: &mut [u8],
    ib: &Option<Ibody>,
    ib_found: bool,
    bl: &mut Option<Block>,
    bl_found: bool,
    index: u8,
    name: &[u8],
    v: Val<'_>,
    in_ea: bool,
) -> Result<(), XattrError> {
    let mut val = v;
    let mut made = 0;
    if in_ea && let Val::Bytes(bytes) = v {
        let hash = ea_value_hash(geo, bytes);
        let uid = u32::from(g16(s, 2)) | (u32::from(g16(s, 0x78)) << 16);
        let gid = u32::from(g16(s, 0x18)) | (u32::from(g16(s, 0x7A)) << 16);
        let Some(inum) = blocks.ea_inode_create(ino, uid, gid, bytes, hash)? else {
            return Err(XattrError::NoSpace);
        };
        made = inum;
        val = Val::Ea {
            inum,
            len: bytes.len(),
            hash,
        };
    }
    let r = (|| {
        let mut work = s.to_vec();
        let in_ibody = match ib {
            Some(i) => ibody_set(&mut work, i, index, name, Some(val)),
            None => Err(XattrError::NoSpace),
        };
        match in_ibody {
            Ok(()) => {
                if bl_found {
                    block_set(geo, blocks, ino, &mut work, bl.as_ref(), index, name, None)?;
                }
            }
            Err(XattrError::NoSpace) => {
                let mut work = s.to_vec();
                if bl.is_none() {
                    *bl = block_find(geo, blocks, ino, &work, index, name)?;
                }
                block_set(
                    geo,
                    blocks,
                    ino,
                    &mut work,
                    bl.as_ref(),
                    index,
                    name,
                    Some(val),
                )?;
                if let (true, Some(i)) = (ib_found, ib) {
                    ibody_set(&mut work, i, index, name, None)?;
                }
                s.copy_from_slice(&work);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        s.copy_from_slice(&work);
        Ok(())
    })();
    if r.is_err() && made != 0 {
        blocks.ea_inode_ref(made, -1)?;
    }
    r
}

/// `ext4_xattr_set_handle` for a stored (index, suffix) name and an
/// on-disk value. Works on a copy of the slot; the slot is updated only
/// on success.
#[allow(clippy::too_many_arguments)]
fn set_raw(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    index: u8,
    name: &[u8],
    value: Option<&[u8]>,
    mode: SetMode,
) -> Result<bool, XattrError> {
    if name.len() > fx::NAME_MAX {
        return Err(XattrError::NameTooLong);
    }
    let mut s = slot.to_vec();
    let ib = ibody_find(geo, ino, &s, index, name)?;
    let ib_found = ib.as_ref().is_some_and(|i| i.found);
    let mut bl = None;
    if !ib_found {
        bl = block_find(geo, blocks, ino, &s, index, name)?;
    }
    let bl_found = bl.as_ref().is_some_and(|b| b.found);
    if !ib_found && !bl_found {
        if mode == SetMode::Replace {
            return Err(XattrError::NoData);
        }
        if value.is_none() {
            return Ok(false);
        }
    } else if mode == SetMode::Create {
        return Err(XattrError::Exists);
    }
    // The in-inode entry's EA inode reference is the inode's: it goes
    // when that entry is removed or replaced (block entries: block_set).
    let ib_inum = match (&ib, ib_found) {
        (Some(i), true) => ent(&s, i.here).inum,
        _ => 0,
    };
    match value {
        None => {
            if let (true, Some(i)) = (ib_found, &ib) {
                ibody_set(&mut s, i, index, name, None)?;
            } else {
                block_set(geo, blocks, ino, &mut s, bl.as_ref(), index, name, None)?;
            }
        }
        Some(v) => {
            if let (true, Some(i)) = (ib_found, &ib)
                && value_same(&s, i.start + 4, i.here, v)
            {
                return Ok(false);
            }
            if let (true, Some(b)) = (bl_found, &bl)
                && value_same(&b.data, 0, b.here, v)
            {
                return Ok(false);
            }
            let large = geo.ea_inode
                && fx::value_size_padded(v.len()) > fx::min_large_ea_size(geo.block_size);
            let mut put = |large| {
                place(
                    geo,
                    blocks,
                    ino,
                    &mut s,
                    &ib,
                    ib_found,
                    &mut bl,
                    bl_found,
                    index,
                    name,
                    Val::Bytes(v),
                    large,
                )
            };
            match put(large) {
                // ext4_xattr_set_handle: with ea_inode, a value that fits
                // nowhere is retried in an EA inode.
                Err(XattrError::NoSpace) if geo.ea_inode && !large && !v.is_empty() => put(true)?,
                r => r?,
            }
        }
    }
    if ib_inum != 0 {
        blocks.ea_inode_ref(ib_inum, -1)?;
    }
    if geo.csum.metadata {
        set_checksum(&mut s, ino, &geo.csum);
    }
    slot.copy_from_slice(&s);
    Ok(true)
}

// ---- the API ----------------------------------------------------------

/// setxattr (`Some(value)`) or removexattr (`None`, always with ENODATA
/// for a missing name, as the VFS passes XATTR_REPLACE) of the full name
/// `name` (`user.x`, `trusted.x`, `security.x`,
/// `system.posix_acl_access`/`_default` with a value in the
/// `posix_acl_xattr` form getfacl/setfacl exchange) on inode `ino`, whose
/// on-disk image is `slot`. Returns whether anything changed (then the
/// caller updates ctime and writes the inode; see the module docs).
pub fn set_xattr(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    name: &[u8],
    value: Option<&[u8]>,
    mode: SetMode,
) -> Result<bool, XattrError> {
    if name.len() > fx::NAME_MAX {
        return Err(XattrError::NameTooLong);
    }
    if value.is_some_and(|v| v.len() > fx::SIZE_MAX) {
        return Err(XattrError::ValueTooBig);
    }
    let Some((index, suffix)) = fx::split_name(name) else {
        return Err(XattrError::NotSupported(format!(
            "attribute namespace of {:?}",
            String::from_utf8_lossy(name)
        )));
    };
    if index == fx::INDEX_POSIX_ACL_ACCESS || index == fx::INDEX_POSIX_ACL_DEFAULT {
        let kind = if index == fx::INDEX_POSIX_ACL_ACCESS {
            AclKind::Access
        } else {
            AclKind::Default
        };
        let entries = match value {
            None => None,
            Some([]) => None,
            Some(v) => {
                let e = acl::from_xattr(v).map_err(XattrError::Invalid)?;
                (!e.is_empty()).then_some(e)
            }
        };
        return set_acl(geo, blocks, ino, slot, kind, entries.as_deref());
    }
    if suffix.is_empty() {
        return Err(XattrError::Invalid("empty attribute name after the prefix"));
    }
    if suffix.contains(&0) {
        return Err(XattrError::Invalid("attribute name with a NUL byte"));
    }
    let ftype = slot_mode(slot) & S_IFMT;
    if index == fx::INDEX_USER && ftype != S_IFREG && ftype != S_IFDIR {
        return Err(XattrError::NotPermitted(
            "user. attributes only on regular files and directories",
        ));
    }
    let mode = if value.is_none() {
        SetMode::Replace
    } else {
        mode
    };
    set_raw(geo, blocks, ino, slot, index, suffix, value, mode)
}

/// removexattr: [`set_xattr`] with no value.
pub fn remove_xattr(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    name: &[u8],
) -> Result<bool, XattrError> {
    set_xattr(geo, blocks, ino, slot, name, None, SetMode::Replace)
}

/// Remove `system.data` (the inline data beyond `i_block`) from the
/// inode (or its block): the inline-data conversion's last step. Returns
/// whether it was there.
pub fn remove_inline_data(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
) -> Result<bool, XattrError> {
    set_raw(
        geo,
        blocks,
        ino,
        slot,
        fx::INDEX_SYSTEM,
        b"data",
        None,
        SetMode::Any,
    )
}

/// Set (`Some`) or remove (`None`) an ACL, as `ext4_set_acl`: the ACL is
/// validated (`posix_acl_valid`); an access ACL that the mode bits can
/// express is not stored (and removes a stored one), and the mode's
/// permission bits follow the ACL (the mask in the group bits); a default
/// ACL on a non-directory is EACCES; symlinks take no ACLs. Stored in
/// ext4's compact on-disk form. Removing an absent ACL is not an error.
pub fn set_acl(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    kind: AclKind,
    entries: Option<&[AclEntry]>,
) -> Result<bool, XattrError> {
    let m = slot_mode(slot);
    if m & S_IFMT == S_IFLNK {
        return Err(XattrError::NotSupported("ACLs on symbolic links".into()));
    }
    if kind == AclKind::Default && m & S_IFMT != S_IFDIR {
        return match entries {
            Some(_) => Err(XattrError::AccessDenied("default ACLs only on directories")),
            None => Ok(false),
        };
    }
    if let Some(e) = entries {
        acl::validate(e).map_err(XattrError::Invalid)?;
    }
    let mut new_mode = m;
    let mut stored = entries;
    if kind == AclKind::Access
        && let Some(e) = entries
    {
        let (bits, not_equiv) = acl::equiv_mode(e);
        new_mode = (m & !0o777) | bits;
        if !not_equiv {
            stored = None;
        }
    }
    let disk = stored.map(acl::to_disk);
    let mut s = slot.to_vec();
    let changed = match set_raw(
        geo,
        blocks,
        ino,
        &mut s,
        kind.index(),
        b"",
        disk.as_deref(),
        SetMode::Any,
    ) {
        Ok(c) => c,
        Err(XattrError::NoData) => false,
        Err(e) => return Err(e),
    };
    let mode_changed = new_mode != m;
    if mode_changed {
        p16(&mut s, 0, new_mode);
        if geo.csum.metadata {
            set_checksum(&mut s, ino, &geo.csum);
        }
    }
    slot.copy_from_slice(&s);
    Ok(changed || mode_changed)
}

/// The stored ACL of `kind` (from the read side's xattrs, which give the
/// `posix_acl_xattr` form), parsed.
pub fn get_acl(
    attrs: &[crate::xattr::Xattr],
    kind: AclKind,
) -> Result<Option<Vec<AclEntry>>, XattrError> {
    let name: &[u8] = match kind {
        AclKind::Access => b"system.posix_acl_access",
        AclKind::Default => b"system.posix_acl_default",
    };
    match attrs.iter().find(|x| x.name == name) {
        None => Ok(None),
        Some(x) => Ok(Some(
            acl::from_xattr(&x.value).map_err(XattrError::Invalid)?,
        )),
    }
}

/// chmod with ACLs (the kernel's `posix_acl_chmod` after `setattr`): the
/// mode's permission bits (0o7777) become `perm`, and a stored access ACL
/// follows them (owner, other, and the mask, or the owning group without
/// one). `access` is the inode's current access ACL ([`get_acl`]).
pub fn chmod(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
    perm: u16,
    access: Option<&[AclEntry]>,
) -> Result<(), XattrError> {
    let m = slot_mode(slot);
    let mut s = slot.to_vec();
    p16(&mut s, 0, (m & S_IFMT) | (perm & 0o7777));
    if let Some(a) = access
        && m & S_IFMT != S_IFLNK
    {
        let new = acl::chmod(a, perm);
        let disk = acl::to_disk(&new);
        set_raw(
            geo,
            blocks,
            ino,
            &mut s,
            fx::INDEX_POSIX_ACL_ACCESS,
            b"",
            Some(&disk),
            SetMode::Any,
        )?;
    }
    if geo.csum.metadata {
        set_checksum(&mut s, ino, &geo.csum);
    }
    slot.copy_from_slice(&s);
    Ok(())
}

/// Drop the inode's xattr block reference (for an inode being deleted,
/// `ext4_xattr_delete_inode`): the block is freed with its last
/// reference (and its EA inode references with it), else its refcount
/// lowered; with ea_inode, the in-inode entries' EA inodes lose their
/// references too (call it then also without a block); `i_file_acl` becomes 0 and
/// `i_blocks` loses the block. Returns whether there was a block.
pub fn release_xattr_block(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &mut [u8],
) -> Result<bool, XattrError> {
    let mut s = slot.to_vec();
    // The in-inode entries' EA inodes lose their references (and the
    // entries their numbers: a second call drops nothing).
    let mut dropped = false;
    if geo.ea_inode
        && let Some(start) = ibody_start(&s)
        && g32(&s, start) == XATTR_MAGIC
    {
        let first = start + 4;
        check_area(&s, first, first, true).map_err(|d| corrupt(ino, "in the inode", d))?;
        let mut e = first;
        while !is_last(&s, e) {
            let n = ent(&s, e).inum;
            if n != 0 {
                blocks.ea_inode_ref(n, -1)?;
                p32(&mut s, e + 4, 0);
                dropped = true;
            }
            e = next(&s, e);
        }
    }
    let blk = slot_file_acl(geo, &s);
    if blk == 0 {
        if dropped {
            if geo.csum.metadata {
                set_checksum(&mut s, ino, &geo.csum);
            }
            slot.copy_from_slice(&s);
        }
        return Ok(false);
    }
    let data = read_block(geo, blocks, ino, blk)?;
    check_area(&data, 0, BLOCK_HEADER_SIZE, geo.ea_inode)
        .map_err(|d| corrupt(ino, &format!("block {blk}"), d))?;
    release_block(geo, blocks, &mut s, blk, data)?;
    set_slot_file_acl(geo, &mut s, 0);
    if geo.csum.metadata {
        set_checksum(&mut s, ino, &geo.csum);
    }
    slot.copy_from_slice(&s);
    Ok(true)
}

/// Add `bytes` (a multiple of the block size, may be negative) of EA
/// inode values to inode `ino`'s `i_blocks` (image `slot`): the kernel
/// charges them to the inode naming them (`ext4_xattr_inode_alloc_quota`,
/// which adds to `i_blocks`), and e2fsck expects them there.
pub fn charge_ea_blocks(geo: &XattrGeometry, ino: u32, slot: &mut [u8], bytes: i64) {
    if bytes == 0 {
        return;
    }
    add_slot_blocks(geo, slot, bytes / geo.block_size as i64);
    if geo.csum.metadata {
        set_checksum(slot, ino, &geo.csum);
    }
}

/// What e2fsck charges inode `ino` (image `slot`) to quota for values in
/// EA inodes: (bytes, inodes), one inode and the value's size rounded up
/// to blocks for each entry in the inode or its block naming an EA inode.
pub fn ea_charge(
    geo: &XattrGeometry,
    blocks: &dyn XattrBlocks,
    ino: u32,
    slot: &[u8],
) -> Result<(u64, u64), XattrError> {
    if !geo.ea_inode {
        return Ok((0, 0));
    }
    let bs = geo.block_size as u64;
    let mut out = (0u64, 0u64);
    let mut add = |b: &[u8], first: usize| {
        let mut e = first;
        while !is_last(b, e) {
            let x = ent(b, e);
            if x.inum != 0 {
                // Rounded up to clusters with bigalloc (e2fsck's
                // `size_to_quota_blocks`).
                let cb = bs * geo.cluster_blocks;
                out.0 += (x.size as u64).div_ceil(cb) * cb;
                out.1 += 1;
            }
            e = next(b, e);
        }
    };
    if let Some(start) = ibody_start(slot)
        && g32(slot, start) == XATTR_MAGIC
    {
        let first = start + 4;
        check_area(slot, first, first, true).map_err(|d| corrupt(ino, "in the inode", d))?;
        add(slot, first);
    }
    let blk = slot_file_acl(geo, slot);
    if blk != 0 {
        let data = read_block(geo, blocks, ino, blk)?;
        check_area(&data, 0, BLOCK_HEADER_SIZE, true)
            .map_err(|d| corrupt(ino, &format!("block {blk}"), d))?;
        add(&data, BLOCK_HEADER_SIZE);
    }
    Ok(out)
}

/// Add a reference to inode `ino`'s xattr block from another inode whose
/// image is `other` (which must have no block): the kernel's sharing of
/// identical blocks, here only on request (e.g. `cp -a` of hard-linked
/// or identical attribute sets, or tests). Fails with ENOSPC at the
/// kernel's refcount limit.
pub fn share_xattr_block(
    geo: &XattrGeometry,
    blocks: &mut dyn XattrBlocks,
    ino: u32,
    slot: &[u8],
    other_ino: u32,
    other: &mut [u8],
) -> Result<(), XattrError> {
    let blk = slot_file_acl(geo, slot);
    if blk == 0 || slot_file_acl(geo, other) != 0 {
        return Err(XattrError::Invalid(
            "sharing needs a block on the source and none on the target",
        ));
    }
    let mut data = read_block(geo, blocks, ino, blk)?;
    let refs = g32(&data, 4);
    if refs >= fx::REFCOUNT_MAX {
        return Err(XattrError::NoSpace);
    }
    p32(&mut data, 4, refs + 1);
    set_block_csum(geo, blk, &mut data);
    blocks.write(blk, &data)?;
    set_slot_file_acl(geo, other, blk);
    add_slot_blocks(geo, other, geo.cluster_blocks as i64);
    if geo.csum.metadata {
        set_checksum(other, other_ino, &geo.csum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Mem {
        blocks: HashMap<u64, Vec<u8>>,
        next: u64,
        bs: usize,
        limit: u64,
        share: bool,
    }

    impl XattrBlocks for Mem {
        fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
            Ok(self
                .blocks
                .get(&blk)
                .cloned()
                .unwrap_or_else(|| vec![0; self.bs]))
        }
        fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
            self.blocks.insert(blk, data.to_vec());
            Ok(())
        }
        fn alloc(&mut self, _goal: u64) -> Result<Option<u64>, FsError> {
            if self.next >= self.limit {
                return Ok(None);
            }
            self.next += 1;
            Ok(Some(self.next - 1))
        }
        fn free(&mut self, blk: u64) -> Result<(), FsError> {
            self.blocks.remove(&blk);
            Ok(())
        }
        fn candidates(&self, hash: u32) -> Vec<u64> {
            if !self.share {
                return Vec::new();
            }
            let mut v: Vec<u64> = self
                .blocks
                .iter()
                .filter(|(_, d)| g32(d, 12) == hash)
                .map(|(b, _)| *b)
                .collect();
            v.sort();
            v
        }
    }

    fn geo() -> XattrGeometry {
        XattrGeometry {
            block_size: 1024,
            csum: Csum::new(true, false, false, 0, [7; 16]),
            bit64: true,
            huge_file: true,
            ea_inode: false,
            first_data_block: 1,
            blocks_per_group: 8192,
            inodes_per_group: 128,
            blocks_count: 8192,
            cluster_blocks: 1,
        }
    }

    fn slot(isize: usize) -> Vec<u8> {
        let mut s = vec![0u8; isize];
        p16(&mut s, 0, S_IFREG | 0o644);
        if isize > 128 {
            p16(&mut s, 0x80, 32);
        }
        s
    }

    fn mem() -> Mem {
        Mem {
            blocks: HashMap::new(),
            next: 100,
            bs: 1024,
            limit: 200,
            share: false,
        }
    }

    #[test]
    fn inode_then_block_then_back() {
        let g = geo();
        let mut m = mem();
        let mut s = slot(256);
        assert!(set_xattr(&g, &mut m, 12, &mut s, b"user.a", Some(b"x"), SetMode::Any).unwrap());
        assert_eq!(slot_file_acl(&g, &s), 0);
        // 256 - 160 - 4 - 4 = 88 bytes: a 100-byte value goes to the block.
        let big = vec![b'v'; 100];
        set_xattr(&g, &mut m, 12, &mut s, b"user.b", Some(&big), SetMode::Any).unwrap();
        assert_eq!(slot_file_acl(&g, &s), 100);
        assert_eq!(g32(&s, OFF_BLOCKS_LO), 2);
        assert!(matches!(
            set_xattr(
                &g,
                &mut m,
                12,
                &mut s,
                b"user.b",
                Some(b"y"),
                SetMode::Create
            ),
            Err(XattrError::Exists)
        ));
        assert!(matches!(
            set_xattr(
                &g,
                &mut m,
                12,
                &mut s,
                b"user.c",
                Some(b"y"),
                SetMode::Replace
            ),
            Err(XattrError::NoData)
        ));
        // Small again: moves into the inode, the block is freed.
        set_xattr(
            &g,
            &mut m,
            12,
            &mut s,
            b"user.b",
            Some(b"small"),
            SetMode::Replace,
        )
        .unwrap();
        assert_eq!(slot_file_acl(&g, &s), 0);
        assert_eq!(g32(&s, OFF_BLOCKS_LO), 0);
        assert!(m.blocks.is_empty());
        remove_xattr(&g, &mut m, 12, &mut s, b"user.a").unwrap();
        remove_xattr(&g, &mut m, 12, &mut s, b"user.b").unwrap();
        assert_eq!(g32(&s, 160), 0, "magic cleared with the last entry");
        assert!(matches!(
            remove_xattr(&g, &mut m, 12, &mut s, b"user.b"),
            Err(XattrError::NoData)
        ));
        assert!(checksum_ok(&s, 12, &g));
    }

    fn checksum_ok(s: &[u8], ino: u32, g: &XattrGeometry) -> bool {
        ext4kit_format::inode::checksum_ok(s, ino, &g.csum)
    }

    #[test]
    fn limits() {
        let g = geo();
        let mut m = mem();
        let mut s = slot(128);
        let long = [b"user.".to_vec(), vec![b'n'; 251]].concat();
        assert!(matches!(
            set_xattr(&g, &mut m, 12, &mut s, &long, Some(b""), SetMode::Any),
            Err(XattrError::NameTooLong)
        ));
        assert!(matches!(
            set_xattr(
                &g,
                &mut m,
                12,
                &mut s,
                b"user.x",
                Some(&vec![0; 65537]),
                SetMode::Any
            ),
            Err(XattrError::ValueTooBig)
        ));
        assert!(matches!(
            set_xattr(
                &g,
                &mut m,
                12,
                &mut s,
                b"user.x",
                Some(&vec![0; 2000]),
                SetMode::Any
            ),
            Err(XattrError::NoSpace)
        ));
        assert!(matches!(
            set_xattr(&g, &mut m, 12, &mut s, b"user.", Some(b""), SetMode::Any),
            Err(XattrError::Invalid(_))
        ));
        assert!(matches!(
            set_xattr(
                &g,
                &mut m,
                12,
                &mut s,
                b"system.data",
                Some(b""),
                SetMode::Any
            ),
            Err(XattrError::NotSupported(_))
        ));
        assert!(matches!(
            set_xattr(&g, &mut m, 12, &mut s, b"os2.x", Some(b""), SetMode::Any),
            Err(XattrError::NotSupported(_))
        ));
        // Largest value in a 1 KiB block: 1024 - 32 - 20 (entry) - 4.
        let max = 1024 - 32 - 20 - 4;
        set_xattr(
            &g,
            &mut m,
            12,
            &mut s,
            b"user.x",
            Some(&vec![1; max]),
            SetMode::Any,
        )
        .unwrap();
        assert!(matches!(
            set_xattr(&g, &mut m, 12, &mut s, b"user.y", Some(b""), SetMode::Any),
            Err(XattrError::NoSpace)
        ));
        // A fifo takes no user. attributes, but trusted. ones.
        let mut f = slot(256);
        p16(&mut f, 0, 0o010644);
        assert!(matches!(
            set_xattr(&g, &mut m, 13, &mut f, b"user.x", Some(b""), SetMode::Any),
            Err(XattrError::NotPermitted(_))
        ));
        set_xattr(
            &g,
            &mut m,
            13,
            &mut f,
            b"trusted.x",
            Some(b""),
            SetMode::Any,
        )
        .unwrap();
    }

    #[test]
    fn block_entries_sorted_and_hashed() {
        let g = geo();
        let mut m = mem();
        let mut s = slot(128);
        for n in [
            &b"user.zz"[..],
            b"user.b",
            b"trusted.a",
            b"user.a",
            b"security.q",
        ] {
            set_xattr(&g, &mut m, 12, &mut s, n, Some(n), SetMode::Any).unwrap();
        }
        let b = m.blocks[&100].clone();
        let (es, _) = fx::parse_entries(&b, 32).unwrap();
        let keys: Vec<(u8, Vec<u8>)> = es.iter().map(|e| (e.name_index, e.name.clone())).collect();
        let mut sorted = keys.clone();
        sorted.sort_by(|a, b| (a.0, a.1.len(), &a.1).cmp(&(b.0, b.1.len(), &b.1)));
        assert_eq!(keys, sorted);
        for e in &es {
            let v =
                &b[usize::from(e.value_offs)..usize::from(e.value_offs) + e.value_size as usize];
            assert_eq!(e.hash, fx::entry_hash(&e.name, v));
        }
        assert_eq!(g32(&b, 12), fx::block_hash(es.iter().map(|e| e.hash)));
        assert_eq!(g32(&b, 16), g.csum.xattr_block(100, &b));
    }

    #[test]
    fn shared_block_copy_on_write() {
        let g = geo();
        let mut m = mem();
        let mut a = slot(128);
        let mut b = slot(128);
        set_xattr(&g, &mut m, 12, &mut a, b"user.k", Some(b"v"), SetMode::Any).unwrap();
        share_xattr_block(&g, &mut m, 12, &a, 13, &mut b).unwrap();
        assert_eq!(g32(&m.blocks[&100], 4), 2);
        set_xattr(&g, &mut m, 13, &mut b, b"user.k", Some(b"w"), SetMode::Any).unwrap();
        assert_eq!(slot_file_acl(&g, &b), 101);
        assert_eq!(g32(&m.blocks[&100], 4), 1);
        assert_eq!(g32(&m.blocks[&101], 4), 1);
        assert_eq!(g32(&b, OFF_BLOCKS_LO), 2);
        // Drop the shared reference by removal, then the last one.
        share_xattr_block(&g, &mut m, 12, &a, 14, &mut slot(128)).unwrap();
        remove_xattr(&g, &mut m, 12, &mut a, b"user.k").unwrap();
        assert_eq!(slot_file_acl(&g, &a), 0);
        assert_eq!(g32(&m.blocks[&100], 4), 1, "inode 14 still holds it");
        assert!(m.blocks.contains_key(&100));
    }

    #[test]
    fn acl_mode_sync() {
        use ext4kit_format::acl::*;
        let g = geo();
        let mut m = mem();
        let mut d = slot(256);
        p16(&mut d, 0, S_IFDIR | 0o755);
        let e = |tag, perm, id| AclEntry { tag, perm, id };
        let u = ACL_UNDEFINED_ID;
        let full = vec![
            e(ACL_USER_OBJ, 7, u),
            e(ACL_USER, 5, 1000),
            e(ACL_GROUP_OBJ, 5, u),
            e(ACL_MASK, 1, u),
            e(ACL_OTHER, 0, u),
        ];
        set_acl(&g, &mut m, 12, &mut d, AclKind::Access, Some(&full)).unwrap();
        assert_eq!(slot_mode(&d), S_IFDIR | 0o710);
        super::chmod(&g, &mut m, 12, &mut d, 0o750, Some(&full)).unwrap();
        let (ents, area) = {
            let start = 164;
            fx::parse_entries(&d[start..], 0).unwrap()
        };
        let v = &d[164 + usize::from(ents[0].value_offs)..][..ents[0].value_size as usize];
        let back = from_disk(v).unwrap();
        assert_eq!(back[3].perm, 5, "mask follows chmod");
        let _ = area;
        // An ACL the mode expresses is not stored.
        let min = vec![
            e(ACL_USER_OBJ, 6, u),
            e(ACL_GROUP_OBJ, 4, u),
            e(ACL_OTHER, 4, u),
        ];
        set_acl(&g, &mut m, 12, &mut d, AclKind::Access, Some(&min)).unwrap();
        assert_eq!(slot_mode(&d), S_IFDIR | 0o644);
        assert_eq!(g32(&d, 160), 0);
        // Invalid ones are refused.
        let bad = vec![
            e(ACL_USER_OBJ, 6, u),
            e(ACL_USER, 4, 5),
            e(ACL_GROUP_OBJ, 4, u),
            e(ACL_OTHER, 4, u),
        ];
        assert!(matches!(
            set_acl(&g, &mut m, 12, &mut d, AclKind::Access, Some(&bad)),
            Err(XattrError::Invalid(_))
        ));
        let mut f = slot(256);
        assert!(matches!(
            set_acl(&g, &mut m, 13, &mut f, AclKind::Default, Some(&min)),
            Err(XattrError::AccessDenied(_))
        ));
        // Inheritance: the default's mask limits the group bits.
        let inh = inherit(Some(&full), S_IFREG | 0o666, false, false, 0o022);
        assert_eq!(inh.mode, S_IFREG | 0o600);
        assert!(inh.access.is_some() && inh.default.is_none());
    }

    #[test]
    fn corrupt_areas_never_panic() {
        let g = geo();
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // A valid starting point: attributes in the inode and the block.
        let mut m = mem();
        let mut s = slot(256);
        for i in 0..6u8 {
            let v = vec![b'a' + i; 40 + usize::from(i) * 30];
            let n = format!("user.n{i}");
            set_xattr(&g, &mut m, 12, &mut s, n.as_bytes(), Some(&v), SetMode::Any).unwrap();
        }
        let blk = slot_file_acl(&g, &s);
        let good_block = m.blocks[&blk].clone();
        let nocsum = XattrGeometry {
            csum: Csum::new(false, false, false, 0, [0; 16]),
            ..g.clone()
        };
        for round in 0..3000 {
            let mut s2 = s.clone();
            let mut m2 = mem();
            let mut b = good_block.clone();
            for _ in 0..1 + rnd(6) {
                if rnd(2) == 0 {
                    let at = 160 + rnd(96) as usize;
                    s2[at] = rnd(256) as u8;
                } else {
                    let at = rnd(1024) as usize;
                    b[at] = rnd(256) as u8;
                }
            }
            m2.blocks.insert(blk, b);
            let name = format!("user.n{}", rnd(8));
            let len = rnd(300) as usize;
            let v = vec![b'z'; len];
            let geo = if round % 2 == 0 { &g } else { &nocsum };
            let _ = match rnd(3) {
                0 => remove_xattr(geo, &mut m2, 12, &mut s2, name.as_bytes()),
                _ => set_xattr(
                    geo,
                    &mut m2,
                    12,
                    &mut s2,
                    name.as_bytes(),
                    Some(&v),
                    SetMode::Any,
                ),
            };
            let _ = release_xattr_block(geo, &mut m2, 12, &mut s2);
        }
    }

    #[test]
    fn identical_blocks_are_shared() {
        let g = geo();
        let mut m = mem();
        m.share = true;
        let mut a = slot(128);
        let mut b = slot(128);
        let mut c = slot(128);
        for s in [&mut a, &mut b] {
            set_xattr(&g, &mut m, 12, s, b"user.k", Some(b"v"), SetMode::Any).unwrap();
        }
        assert_eq!(slot_file_acl(&g, &a), 100);
        assert_eq!(slot_file_acl(&g, &b), 100, "reused");
        assert_eq!(g32(&m.blocks[&100], 4), 2);
        assert_eq!(g32(&b, OFF_BLOCKS_LO), 2);
        // A private block that becomes identical to another one joins it
        // and is freed.
        set_xattr(&g, &mut m, 14, &mut c, b"user.k", Some(b"w"), SetMode::Any).unwrap();
        assert_eq!(slot_file_acl(&g, &c), 101);
        set_xattr(&g, &mut m, 14, &mut c, b"user.k", Some(b"v"), SetMode::Any).unwrap();
        assert_eq!(slot_file_acl(&g, &c), 100);
        assert!(!m.blocks.contains_key(&101));
        assert_eq!(g32(&m.blocks[&100], 4), 3);
        assert_eq!(g32(&c, OFF_BLOCKS_LO), 2);
        assert_eq!(
            g32(&m.blocks[&100], 16),
            g.csum.xattr_block(100, &m.blocks[&100])
        );
    }
}
