//! EA inodes (ea_inode): the inodes that hold large xattr values, made
//! and released for `xattr_write` through [`XattrBlocks`] on an
//! operation's handle, the way `fs/ext4/xattr.c` keeps them
//! (`ext4_xattr_inode_create`, `ext4_xattr_inode_update_ref`).
//!
//! An EA inode is a regular file with mode `S_IFREG` (no permission
//! bits), one link, EXT4_EA_INODE_FL and extents, owned by the inode that
//! first stored the value. Its reference count is 64 bits: the high word
//! in `i_ctime`, the low one in `i_version` (`l_i_version`); the value's
//! crc32c (seeded with the filesystem's checksum seed) is in `i_atime`.
//! Its data blocks are written through the journal (the kernel journals
//! them as metadata). When the count reaches 0 the inode and its blocks
//! are freed in the same transaction that dropped the last reference, so
//! a crash leaves either the old state or the new one and no orphan; the
//! kernel instead puts the inode on the orphan list and frees it at
//! eviction, which ends in the same state.

use super::*;
use ext4kit_format::inode::{EXT4_EA_INODE_FL, S_IFREG};

/// Credits one EA inode's creation or release may take: its inode table
/// block, inode bitmap, descriptors, block bitmaps, tree blocks and (for a
/// creation) a value of 64 KiB in `block_size` blocks.
pub(crate) fn ea_inode_credits(block_size: u64) -> u32 {
    (xattr_value_blocks(block_size) + 12) as u32
}

fn xattr_value_blocks(block_size: u64) -> u64 {
    (ext4kit_format::xattr::SIZE_MAX as u64).div_ceil(block_size.max(1024))
}

/// [`XattrBlocks`] for reading only (before a handle starts).
struct Peek<'a>(&'a Filesystem);

impl XattrBlocks for Peek<'_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.0.read(|f| f.meta_block(blk, "xattr block"))
    }
    fn write(&mut self, _blk: u64, _data: &[u8]) -> Result<(), FsError> {
        Err(FsError::InvalidRequest("xattr peek writes".into()))
    }
    fn alloc(&mut self, _goal: u64) -> Result<Option<u64>, FsError> {
        Err(FsError::InvalidRequest("xattr peek allocates".into()))
    }
    fn free(&mut self, _blk: u64) -> Result<(), FsError> {
        Err(FsError::InvalidRequest("xattr peek frees".into()))
    }
}

impl Filesystem {
    /// (credits, groups) that releasing `inode`'s EA inode references
    /// may take when it is deleted (each may free its EA inode).
    pub(crate) fn ea_release_cost(&self, inode: &InodeInfo) -> Result<(u32, u32), FsError> {
        let geo = self.xattr_geometry();
        if !geo.ea_inode {
            return Ok((0, 0));
        }
        let (_, n) = xw::ea_charge(&geo, &Peek(self), inode.ino, &inode.raw).map_err(xattr_fs)?;
        let n = n as u32;
        Ok((n.saturating_mul(8), n.saturating_mul(2)))
    }

    /// `ext4_xattr_inode_create` + `ext4_xattr_inode_write` inside `op`.
    pub(crate) fn ea_inode_create_in(
        &self,
        op: &mut Op<'_>,
        owner: u32,
        uid: u32,
        gid: u32,
        value: &[u8],
        hash: u32,
    ) -> Result<Option<u32>, FsError> {
        let bs = self.block_size();
        let n = (value.len() as u64).div_ceil(bs);
        // The blocks first: a full filesystem refuses before any change.
        let group = self.inode_group(owner);
        let mut extents = Vec::new();
        let bigalloc = self.clusters().ratio() > 1;
        if n > 0 {
            let mut req = AllocRequest::new(n, group);
            req.goal = Some(self.balloc.goal_for_inode(group, true));
            // Whole clusters with bigalloc (the value from block 0, the
            // rest of its last cluster held unmapped).
            let r = if bigalloc {
                self.balloc.alloc_clusters(self.rw.blocks(), &req)
            } else {
                self.balloc.alloc(self.rw.blocks(), &req)
            };
            match r {
                Ok(a) => extents = a.extents,
                Err(FsError::NoSpace { .. } | FsError::SpaceBusy { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let spec = NewInode {
            mode: S_IFREG,
            uid,
            gid,
            links: 1,
            time: None,
            rdev: None,
        };
        let mut inode = match self.create_inode(op, owner, &spec) {
            Ok(i) => i,
            Err(FsError::NoSpace { .. }) => {
                let tid = op.h.tid();
                for &(s, l) in &extents {
                    // Whole clusters as allocated (blocks without bigalloc).
                    self.balloc.free_clusters(self.rw.blocks(), tid, s, l)?;
                    op.h.free_extent(s, u64::from(l));
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        // create_inode charged the new inode to quota: EA inodes are
        // charged to their owners instead.
        let fresh = inode.raw.clone();
        self.quota_note_alloc(op, inode.ino, &fresh, false);
        if !inode.has_extents() {
            return Err(FsError::Unsupported(
                "EA inodes without the extents feature".into(),
            ));
        }
        let mut maps = Vec::new();
        let mut lblk = 0u64;
        let b = bs as usize;
        let held: u64 = extents.iter().map(|e| u64::from(e.1)).sum();
        for &(start, len) in &extents {
            // The value's blocks only (a last cluster's rest stays unmapped).
            let len = (u64::from(len).min(n.saturating_sub(lblk))) as u32;
            if len == 0 {
                break;
            }
            for i in 0..u64::from(len) {
                let from = ((lblk + i) as usize) * b;
                let to = (from + b).min(value.len());
                let chunk = &value[from..to];
                op.h.modify_new(start + i, |blk| {
                    blk[..chunk.len()].copy_from_slice(chunk);
                    blk[chunk.len()..].fill(0);
                })?;
            }
            maps.push(Mapping {
                lblk,
                pblk: start,
                len,
                unwritten: false,
            });
            lblk += u64::from(len);
        }
        let len = value.len() as u64;
        self.edit_inode(&mut inode, |nd| {
            nd.i_flags.set(nd.i_flags.get() | EXT4_EA_INODE_FL);
            nd.set_size(len);
            nd.set_blocks_512(held * (bs / 512));
            // Refcount 1: high word in i_ctime, low word in i_version.
            nd.i_ctime.set(0);
            nd.i_ctime_extra.set(0);
            nd.l_i_version.set(1);
            nd.i_atime.set(hash);
            nd.i_atime_extra.set(0);
        })?;
        self.write_tree(op, &mut inode, &[], &maps)?;
        self.store_inode(op, &inode)?;
        Ok(Some(inode.ino))
    }

    /// `ext4_xattr_inode_update_ref` inside `op`: the EA inode `inum`'s
    /// refcount changes by `delta`; at 0 it is freed with its blocks.
    pub(crate) fn ea_inode_ref_in(
        &self,
        op: &mut Op<'_>,
        inum: u32,
        delta: i64,
    ) -> Result<(), FsError> {
        let mut inode = self.inode_any_op(inum)?;
        let bad = |d: String| FsError::corrupt("EA inode", format!("inode {inum}: {d}"));
        if inode.flags & EXT4_EA_INODE_FL == 0 || inode.links == 0 {
            return Err(bad("not an EA inode in use".into()));
        }
        let node = Inode::parse(&inode.raw).ok_or_else(|| bad("short".into()))?;
        let refs = (u64::from(node.i_ctime.get()) << 32) | u64::from(node.l_i_version.get());
        let new = refs as i64 + delta;
        if new < 0 {
            return Err(bad(format!("reference count {refs} would drop below 0")));
        }
        let new = new as u64;
        if new > 0 {
            self.edit_inode(&mut inode, |nd| {
                nd.i_ctime.set((new >> 32) as u32);
                nd.l_i_version.set(new as u32);
            })?;
            return self.store_inode(op, &inode);
        }
        // The last reference: free the value's blocks, the tree and the
        // inode, as eviction of an unlinked inode does.
        let (maps, nodes) = self.mapping(&inode)?;
        self.free_data(op, &maps, None, None)?;
        for m in &maps {
            for b in m.pblk..m.pblk + u64::from(m.len) {
                op.h.revoke(b)?;
            }
        }
        self.edit_inode(&mut inode, |nd| nd.set_blocks_512(0))?;
        self.write_tree(op, &mut inode, &nodes, &[])?;
        let t = now();
        self.edit_inode(&mut inode, |nd| {
            nd.i_dtime.set(t.sec as u32);
            nd.i_links_count.set(0);
            nd.set_size(0);
            nd.i_ctime.set(0);
            nd.l_i_version.set(0);
        })?;
        self.store_inode(op, &inode)?;
        self.ialloc.free(self.rw.blocks(), inum, false)
    }
}
