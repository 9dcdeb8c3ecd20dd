//! Writing inline-data inodes (issue 20): an inode whose data lives in
//! `i_block` and the `system.data` attribute (`EXT4_INLINE_DATA_FL`) is
//! converted into an extent-mapped one before anything changes its data
//! or its entries, as the kernel converts one that outgrows the inode
//! (`ext4_convert_inline_data_nolock`, `ext4_convert_inline_dir`): the
//! content goes into one new block (a directory's gets `.` and `..` and
//! its `rec_len`s packed, as `ext4_finish_convert_inline_dir`), the
//! `system.data` entry is removed, the flag cleared, `EXTENTS_FL` set and
//! a one-extent root written, all in one handle. A directory converts in
//! the handle of the entry change itself; a file's data paths (write,
//! truncate, fallocate) convert in a handle of their own just before the
//! change, so a crash in between leaves an extent-mapped file with the
//! same bytes. The only change made in place is the `..` of a moved
//! inline directory (the first four bytes of `i_block`).

use super::*;
use crate::dir_write::{DirParams, dir_block_from_entries};
use ext4kit_format::inode::EXT4_INLINE_DATA_FL;

/// Credits a conversion adds to a handle besides its inode: the new
/// block, the xattr block `system.data` may be in, the block bitmap and
/// the group descriptor of the new block.
pub(crate) const UNINLINE_CREDITS: u32 = 4;

impl Filesystem {
    /// Convert `inode` out of inline data inside `op` (nothing when it has
    /// none); `keep` false drops the data (a truncate to 0: no block).
    /// The inode is stored and `inode` updated.
    pub(crate) fn uninline_in(
        &self,
        op: &mut Op<'_>,
        inode: &mut InodeInfo,
        keep: bool,
    ) -> Result<(), FsError> {
        if !inode.has_inline_data() {
            return Ok(());
        }
        let ino = inode.ino;
        let bs = self.block_size();
        let extents = self.read(|f| f.info.features.incompat.contains(Incompat::EXTENTS));
        if !extents {
            return Err(FsError::Unsupported(format!(
                "converting inline-data inode {ino} on a filesystem without extents"
            )));
        }
        // The content, while the inode still holds it: (is metadata, block).
        let block = if !keep {
            None
        } else if inode.is_dir() {
            let entries = self.read(|f| f.read_dir(inode))?;
            let parent = entries
                .iter()
                .find(|e| e.name == b"..")
                .map(|e| e.ino)
                .ok_or_else(|| {
                    FsError::corrupt(
                        "directory",
                        format!("inode {ino}: inline data without '..'"),
                    )
                })?;
            let rest: Vec<(u32, &[u8], u8)> = entries
                .iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| (e.ino, e.name.as_slice(), e.file_type))
                .collect();
            let p = self.read(|f| DirParams::new(f.info, inode));
            let b = dir_block_from_entries(&p, bs as u32, parent, &rest).ok_or_else(|| {
                FsError::StructureFull(format!(
                    "inline directory {ino}: its entries do not fit one block"
                ))
            })?;
            Some((true, b))
        } else if inode.is_regular() {
            let mut data = self.read(|f| f.inline_data(inode))?;
            if data.is_empty() {
                None
            } else {
                data.resize(bs as usize, 0);
                Some((false, data))
            }
        } else {
            return Err(FsError::Unsupported(format!(
                "converting inline-data inode {ino} (not a regular file or directory)"
            )));
        };
        // The block first: out of space here changes nothing.
        let pblk = match &block {
            Some((meta, _)) => {
                let group = self.inode_group(ino);
                let mut req = AllocRequest::new(1, group);
                req.goal = Some(self.balloc.goal_for_inode(group, !meta));
                // A whole cluster with bigalloc (block 0 at its start).
                Some(self.place_block(&[], 0, &req)?)
            }
            None => None,
        };
        let geo = self.xattr_geometry();
        let mut slot = inode.raw.clone();
        {
            let mut io = self.xattr_io(op);
            xw::remove_inline_data(&geo, &mut io, ino, &mut slot).map_err(xattr_fs)?;
        }
        *inode = self.decode_any(ino, slot)?;
        let mut root = [0u8; 60];
        root[..12].copy_from_slice(ExtentHeader::new(0, ENTRIES_IN_INODE, 0).as_bytes());
        self.edit_inode(inode, |n| {
            n.i_flags
                .set((n.i_flags.get() & !EXT4_INLINE_DATA_FL) | EXT4_EXTENTS_FL);
            n.i_block_bytes_mut().copy_from_slice(&root);
            if !keep {
                n.set_size(0);
            }
        })?;
        if let (Some((meta, data)), Some((p, held))) = (block, pblk) {
            if meta {
                op.h.modify_new(p, |b| b.copy_from_slice(&data))?;
            } else {
                op.h.write_data(p, &data)?;
            }
            let m = Mapping {
                lblk: 0,
                pblk: p,
                len: 1,
                unwritten: false,
            };
            self.write_tree(op, inode, &[], &[m])?;
            let blocks = inode.blocks_512 + held * (bs / 512);
            self.edit_inode(inode, |n| {
                n.set_blocks_512(blocks);
                if meta {
                    n.set_size(bs);
                }
            })?;
        }
        self.store_inode(op, inode)
    }

    /// [`Filesystem::uninline_in`] of inode `ino` as an operation of its
    /// own (the caller holds its call lock): the tid, or `None` when the
    /// inode has no inline data.
    pub(crate) fn uninline(&self, ino: u32, keep: bool) -> Result<Option<u32>, FsError> {
        if !self.inode_any(ino)?.has_inline_data() {
            return Ok(None);
        }
        let mut op = self.begin(UNINLINE_CREDITS + 2, 1)?;
        op.own(ino);
        let mut inode = self.inode_any(ino)?;
        match self.uninline_in(&mut op, &mut inode, keep) {
            Ok(()) => self.finish(op).map(Some),
            Err(e @ FsError::NoSpace { .. })
                if !op.h.changed() && !self.balloc.has_dirty_mine() =>
            {
                drop(op);
                Err(e)
            }
            Err(e) => Err(self.fail(op, e)),
        }
    }

    /// The `..` of inline directory `dir` set to `parent` in place (the
    /// first four bytes of `i_block`, `ext4_inline_data` keeps it there);
    /// the caller stores the inode.
    pub(crate) fn set_inline_parent(
        &self,
        dir: &mut InodeInfo,
        parent: u32,
    ) -> Result<(), FsError> {
        self.edit_inode(dir, |n| n.i_block[0].set(parent))
    }
}
