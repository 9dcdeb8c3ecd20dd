//! Reading extended attributes: the in-inode area and the external block
//! (magic, `h_blocks`, checksum, entry bounds, entry hashes), values in
//! EA inodes, and POSIX ACLs turned into the `posix_acl_xattr` form that
//! getxattr returns.

use ext4kit_format::acl;
use ext4kit_format::xattr::{self as fx, RawEntry, XATTR_MAGIC};

use crate::FsError;
use crate::inode::InodeInfo;
use crate::sb::Fs;

/// Largest value accepted from an EA inode.
pub const MAX_VALUE: u64 = 64 * 1024;

/// Where an attribute is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrPlace {
    Inode,
    Block,
}

/// One attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xattr {
    /// The full name (`user.foo`, `system.posix_acl_access`).
    pub name: Vec<u8>,
    /// The value as getxattr returns it (ACLs in `posix_acl_xattr` form).
    pub value: Vec<u8>,
    pub place: XattrPlace,
}

impl Xattr {
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// Parsed entries and the bytes their value offsets refer to.
type Area = (Vec<RawEntry>, Vec<u8>);

fn bad(ino: u32, where_: &str, d: impl std::fmt::Display) -> FsError {
    FsError::corrupt("extended attributes", format!("inode {ino} {where_}: {d}"))
}

impl Fs<'_> {
    /// The raw in-inode entries and the area they index (values are
    /// relative to the area's start). `None` without an in-inode area.
    fn ibody(&self, inode: &InodeInfo) -> Result<Option<Area>, FsError> {
        let start = 128 + usize::from(inode.extra_isize);
        if inode.raw.len() < start + fx::IBODY_HEADER_SIZE {
            return Ok(None);
        }
        let magic = u32::from_le_bytes(inode.raw[start..start + 4].try_into().unwrap_or([0; 4]));
        if magic != XATTR_MAGIC {
            return Ok(None);
        }
        let area = inode.raw[start + 4..].to_vec();
        let (entries, end) =
            fx::parse_entries(&area, 0).map_err(|e| bad(inode.ino, "in the inode", e))?;
        for e in &entries {
            if e.value_inum == 0 && e.value_size > 0 {
                let vs = usize::from(e.value_offs);
                let ve = vs + e.value_size as usize;
                if vs < end || ve > area.len() {
                    return Err(bad(
                        inode.ino,
                        "in the inode",
                        format!("value of entry at {} is outside the area", e.offset),
                    ));
                }
                let h = fx::entry_hash(&e.name, &area[vs..ve]);
                if e.hash != 0
                    && e.hash != h
                    && e.hash != fx::entry_hash_signed(&e.name, &area[vs..ve])
                {
                    return Err(bad(
                        inode.ino,
                        "in the inode",
                        "an entry hash does not match",
                    ));
                }
            }
        }
        Ok(Some((entries, area)))
    }

    /// The raw block entries and the block.
    fn xattr_block(&self, inode: &InodeInfo) -> Result<Option<Area>, FsError> {
        let blk = inode.file_acl;
        if blk == 0 {
            return Ok(None);
        }
        let where_ = format!("block {blk}");
        if !self.info.range_ok(blk, 1) {
            return Err(bad(inode.ino, &where_, "outside the filesystem"));
        }
        let b = self.blocks.block(blk)?;
        let (h, _) = <fx::XattrHeader as zerocopy::FromBytes>::read_from_prefix(&b)
            .map_err(|_| bad(inode.ino, &where_, "short block"))?;
        if h.h_magic.get() != XATTR_MAGIC || h.h_blocks.get() != 1 {
            return Err(bad(
                inode.ino,
                &where_,
                format!(
                    "bad header (magic {:#010x}, {} blocks)",
                    h.h_magic.get(),
                    h.h_blocks.get()
                ),
            ));
        }
        if self.info.csum.metadata && self.info.csum.xattr_block(blk, &b) != h.h_checksum.get() {
            return Err(bad(inode.ino, &where_, "checksum does not match"));
        }
        let (entries, end) =
            fx::parse_entries(&b, fx::BLOCK_HEADER_SIZE).map_err(|e| bad(inode.ino, &where_, e))?;
        for e in &entries {
            if e.value_inum == 0 && e.value_size > 0 {
                let vs = usize::from(e.value_offs);
                let ve = vs + e.value_size as usize;
                if vs < end || ve > b.len() {
                    return Err(bad(
                        inode.ino,
                        &where_,
                        format!("value of entry at {} is outside the block", e.offset),
                    ));
                }
                let v = &b[vs..ve];
                if e.hash != fx::entry_hash(&e.name, v)
                    && e.hash != fx::entry_hash_signed(&e.name, v)
                {
                    return Err(bad(inode.ino, &where_, "an entry hash does not match"));
                }
            }
        }
        Ok(Some((entries, b)))
    }

    /// The value of one raw entry, from its area or its EA inode.
    fn raw_value(&self, inode: &InodeInfo, e: &RawEntry, area: &[u8]) -> Result<Vec<u8>, FsError> {
        if e.value_inum != 0 {
            let vi = self.inode(e.value_inum)?;
            if vi.size != u64::from(e.value_size) || vi.size > MAX_VALUE {
                return Err(bad(
                    inode.ino,
                    "EA inode",
                    format!(
                        "inode {} holds {} bytes for a {}-byte value",
                        vi.ino, vi.size, e.value_size
                    ),
                ));
            }
            return self.read_all(&vi, MAX_VALUE);
        }
        if e.value_size == 0 {
            return Ok(Vec::new());
        }
        let vs = usize::from(e.value_offs);
        Ok(area[vs..vs + e.value_size as usize].to_vec())
    }

    /// The value of `system.data` (inline data beyond `i_block`).
    pub fn inline_data_xattr(&self, inode: &InodeInfo) -> Result<Option<Vec<u8>>, FsError> {
        let Some((entries, area)) = self.ibody(inode)? else {
            return Ok(None);
        };
        for e in &entries {
            if e.name_index == fx::INDEX_SYSTEM && e.name == b"data" {
                return Ok(Some(self.raw_value(inode, e, &area)?));
            }
        }
        Ok(None)
    }

    /// Every attribute of an inode (in-inode first, then the block), as
    /// listxattr/getxattr show them. Entries with an unknown name index
    /// are left out, as the kernel leaves them out.
    pub fn xattrs(&self, inode: &InodeInfo) -> Result<Vec<Xattr>, FsError> {
        let mut out = Vec::new();
        for (place, part) in [
            (XattrPlace::Inode, self.ibody(inode)?),
            (XattrPlace::Block, self.xattr_block(inode)?),
        ] {
            let Some((entries, area)) = part else {
                continue;
            };
            for e in &entries {
                let Some(name) = e.full_name() else { continue };
                let mut value = self.raw_value(inode, e, &area)?;
                if matches!(
                    e.name_index,
                    fx::INDEX_POSIX_ACL_ACCESS | fx::INDEX_POSIX_ACL_DEFAULT
                ) {
                    let a = acl::from_disk(&value).map_err(|d| bad(inode.ino, "ACL", d))?;
                    value = acl::to_xattr(&a);
                }
                out.push(Xattr { name, value, place });
            }
        }
        Ok(out)
    }
}
