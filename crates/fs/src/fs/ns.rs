//! Namespace operations over `dir_write` (issue 7 step 4): create (all
//! file types), mkdir, symlink, link, unlink, rmdir. Each is one handle
//! (atomic) under the call locks of the directory and of the inode it
//! changes (see "Locking" in `fs.rs`): the entry change, the inode(s),
//! link counts (`dir_nlink`: a directory past 64999 links counts 1),
//! times and, for a last unlink of a file whose blocks fit one handle,
//! the release of its blocks and inode. A last unlink of a larger file
//! drops the name and puts the inode on the orphan list (or orphan
//! file) in one transaction and frees it in following ones: a crash in
//! between is finished by orphan processing at the next open.

use ext4kit_format::dir::FT_DIR;
use ext4kit_format::inode::{S_IFCHR, S_IFDIR, S_IFMT, S_IFREG};

use super::*;
use crate::dir_write::{DirBlocks, DirParams, DirWriter, new_dir_block};
use crate::inode::FileType;

/// `EXT4_LINK_MAX`.
pub const LINK_MAX: u16 = 65000;

/// [`DirBlocks`] over an operation's handle: one directory inode whose
/// block list, `i_size`, `i_blocks` and flags change in `dir` (the caller
/// stores it).
pub(crate) struct DirIo<'a, 'b> {
    fs: &'a Filesystem,
    op: &'a mut Op<'b>,
    pub(crate) dir: InodeInfo,
    params: DirParams,
    maps: Vec<Mapping>,
}

impl<'a, 'b> DirIo<'a, 'b> {
    pub(crate) fn new(
        fs: &'a Filesystem,
        op: &'a mut Op<'b>,
        mut dir: InodeInfo,
    ) -> Result<Self, FsError> {
        if !dir.is_dir() {
            return Err(FsError::NotADirectory);
        }
        // An inline directory moves into a block first, in this handle.
        fs.uninline_in(op, &mut dir, true)?;
        let (maps, _) = fs.mapping(&dir)?;
        let params = fs.read(|f| DirParams::new(f.info, &dir));
        Ok(DirIo {
            fs,
            op,
            dir,
            params,
            maps,
        })
    }

    fn phys(&self, lblk: u32) -> Result<u64, FsError> {
        let l = u64::from(lblk);
        self.maps
            .iter()
            .find(|m| m.lblk <= l && l < m.end())
            .map(|m| m.pblk + (l - m.lblk))
            .ok_or_else(|| {
                FsError::corrupt(
                    "directory",
                    format!("inode {} block {lblk} is a hole", self.dir.ino),
                )
            })
    }
}

/// The largest directory without large_dir (bytes).
const DIR_SIZE_MAX_SMALL: u64 = 1 << 31;

impl DirBlocks for DirIo<'_, '_> {
    fn params(&self) -> DirParams {
        self.params
    }
    fn block_size(&self) -> u32 {
        self.fs.block_size() as u32
    }
    fn nblocks(&self) -> u32 {
        (self.dir.size / self.fs.block_size()) as u32
    }
    fn read(&self, lblk: u32) -> Result<Vec<u8>, FsError> {
        let p = self.phys(lblk)?;
        self.fs.read(|f| f.meta_block(p, "directory block"))
    }
    fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
        let p = self.phys(lblk)?;
        self.op.h.modify(p, |b| b.copy_from_slice(data))
    }
    fn append(&mut self) -> Result<u32, FsError> {
        let bs = self.fs.block_size();
        let lblk = self.nblocks();
        // Without large_dir a directory stays below 2 GiB (its size is
        // i_size_lo only, and e2fsck takes a larger one for corrupt);
        // with it, i_size_high counts (set_size writes both halves).
        if !self.params.large_dir && (u64::from(lblk) + 1) * bs > DIR_SIZE_MAX_SMALL {
            return Err(FsError::StructureFull(format!(
                "directory inode {} would pass 2 GiB without large_dir",
                self.dir.ino
            )));
        }
        let group = self.fs.inode_group(self.dir.ino);
        let goal = self
            .maps
            .last()
            .map(|m| m.pblk + u64::from(m.len))
            .unwrap_or_else(|| self.fs.balloc.goal_for_inode(group, false));
        let mut req = AllocRequest::new(1, group);
        req.goal = Some(goal);
        // Bigalloc: a directory block follows the file mapping rule.
        let (p, held) = self.fs.place_block(&self.maps, u64::from(lblk), &req)?;
        self.op.h.modify_new(p, |_| ())?;
        self.maps.push(Mapping {
            lblk: u64::from(lblk),
            pblk: p,
            len: 1,
            unwritten: false,
        });
        self.maps = normalize(std::mem::take(&mut self.maps));
        // One incremental insert (O(depth)), as for files.
        let mut root = self.dir.i_block;
        let mut delta = 0i64;
        let m = Mapping {
            lblk: u64::from(lblk),
            pblk: p,
            len: 1,
            unwritten: false,
        };
        self.fs
            .tree_edit(self.op, &self.dir, &mut root, &mut delta, |t| t.insert(&m))?;
        let size = (u64::from(lblk) + 1) * bs;
        let per512 = (bs / 512) as i64;
        let delta = delta * self.fs.clusters().ratio() as i64;
        let blocks = (self.dir.blocks_512 as i64 + (held as i64 + delta) * per512).max(0) as u64;
        self.fs.edit_inode(&mut self.dir, |n| {
            n.i_block_bytes_mut().copy_from_slice(&root);
            n.set_size(size);
            n.set_blocks_512(blocks);
        })?;
        Ok(lblk)
    }
    fn indexed(&self) -> bool {
        self.dir.is_htree()
    }
    fn set_indexed(&mut self) -> Result<(), FsError> {
        self.fs.edit_inode(&mut self.dir, |n| {
            n.i_flags
                .set(n.i_flags.get() | ext4kit_format::inode::EXT4_INDEX_FL)
        })
    }
}

impl Filesystem {
    /// Credits for the tree of directory `d` (an inline one: its
    /// conversion) and the groups its conversion may dirty.
    fn dir_tree_credits(&self, d: &InodeInfo) -> Result<(u32, u32), FsError> {
        if d.has_inline_data() {
            return Ok((super::inline::UNINLINE_CREDITS, 1));
        }
        let (_, nodes) = self.mapping(d)?;
        Ok((2 * nodes.len() as u32, 0))
    }
}

/// Credits for changing one directory entry set (index levels, a split,
/// a new block and its tree).
fn dir_credits(dir: &InodeInfo) -> u32 {
    let _ = dir;
    24
}

impl Filesystem {
    /// Look `name` up in directory `dir`.
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Result<Option<InodeInfo>, FsError> {
        self.guard("lookup", dir, || self.lookup_op(dir, name))
    }

    fn lookup_op(&self, dir: u32, name: &[u8]) -> Result<Option<InodeInfo>, FsError> {
        let found = {
            let _r = self.locks.read(dir);
            let d = self.inode(dir)?;
            if !d.is_dir() {
                return Err(FsError::NotADirectory);
            }
            self.read(|f| f.lookup(&d, name))?
        };
        match found {
            Some(e) => Ok(Some(self.inode(e.ino)?)),
            None => Ok(None),
        }
    }

    /// [`Filesystem::lookup`] by on-disk name (no no-key decoding).
    fn lookup_disk(&self, dir: u32, name: &[u8]) -> Result<Option<InodeInfo>, FsError> {
        let found = {
            let _r = self.locks.read(dir);
            let d = self.inode(dir)?;
            self.read(|f| f.lookup_disk(&d, name))?
        };
        match found {
            Some(e) => Ok(Some(self.inode(e.ino)?)),
            None => Ok(None),
        }
    }

    /// The on-disk name of `dir`'s entry `name` (a no-key name in an
    /// encrypted directory; NotFound when no entry has it). The caller
    /// holds `dir`'s call lock.
    fn disk_name(&self, dir: u32, name: &[u8]) -> Result<Vec<u8>, FsError> {
        let _r = self.locks.read(dir);
        let d = self.inode(dir)?;
        self.read(|f| f.disk_name(&d, name))?
            .ok_or(FsError::NotFound)
    }

    fn touch_dir(&self, d: &mut InodeInfo, links: i32) -> Result<(), FsError> {
        let t = now();
        let (s, x) = encode_time(t);
        let dir_nlink = self.read(|f| {
            f.info
                .features
                .ro_compat
                .contains(ext4kit_format::features::RoCompat::DIR_NLINK)
        });
        let cur = d.links;
        let new = match links {
            1 if cur >= LINK_MAX - 1 || cur == 1 && d.is_dir() && cur < 2 => {
                if dir_nlink {
                    1
                } else {
                    return Err(FsError::TooManyLinks);
                }
            }
            1 => cur + 1,
            -1 if cur == 1 && d.is_dir() => 1,
            -1 => cur.saturating_sub(1),
            _ => cur,
        };
        self.edit_inode(d, |n| {
            n.i_links_count.set(new);
            n.i_mtime.set(s);
            n.i_ctime.set(s);
            if inode_has_extra(n) {
                n.i_mtime_extra.set(x);
                n.i_ctime_extra.set(x);
            }
        })
    }

    /// Run `f` as one operation on directory `parent` (its inode stored at
    /// the end); `extra` credits for what `f` does besides the entry. The
    /// caller holds `parent`'s call lock (so the checks made before the
    /// handle stay true); the directory is read again inside the handle,
    /// whose content lock it owns.
    ///
    /// Refusals are found before the handle starts (`absent`: the name
    /// must not exist; the callers check the rest first); an error from
    /// `f` fails the handle, as it may have changed blocks.
    fn in_dir<R>(
        &self,
        parent: u32,
        absent: Option<&[u8]>,
        extra: u32,
        groups: u32,
        f: impl FnOnce(&Filesystem, &mut Op<'_>, &mut InodeInfo) -> Result<R, FsError>,
    ) -> Result<(R, u32), FsError> {
        self.in_dir_as(parent, absent, extra, groups, false, f)
    }

    /// [`Self::in_dir`] with the handle's `ops` exclusive when `exclusive`
    /// (an edit of the old orphan list, see [`Filesystem::orphan_del`]).
    fn in_dir_as<R>(
        &self,
        parent: u32,
        absent: Option<&[u8]>,
        extra: u32,
        groups: u32,
        exclusive: bool,
        f: impl FnOnce(&Filesystem, &mut Op<'_>, &mut InodeInfo) -> Result<R, FsError>,
    ) -> Result<(R, u32), FsError> {
        let d = self.inode(parent)?;
        if !d.is_dir() {
            return Err(FsError::NotADirectory);
        }
        flags::may_add_entry(&d)?;
        if absent.is_some() {
            flags::may_create_in(&d)?;
        }
        if let Some(name) = absent {
            self.check_absent(&d, name)?;
        }
        let (tree, inline) = self.dir_tree_credits(&d)?;
        let credits = dir_credits(&d) + tree + extra;
        let mut op = self.begin_as(credits, groups + 2 + inline, exclusive)?;
        op.own(parent);
        // Nothing changed yet: a refusal ends the empty handle.
        let mut d = self.inode(parent)?;
        match f(self, &mut op, &mut d) {
            Ok(r) => {
                if let Err(e) = self.store_inode(&mut op, &d) {
                    return Err(self.fail(op, e));
                }
                Ok((r, self.finish(op)?))
            }
            // Refused before anything changed (no free inode: ENOSPC as
            // ext4's, the journal goes on): end the empty handle.
            Err(e @ FsError::NoSpace { .. })
                if !op.h.changed() && !self.balloc.has_dirty_mine() =>
            {
                drop(op);
                Err(e)
            }
            Err(e) => Err(self.fail(op, e)),
        }
    }

    fn add_entry(
        &self,
        op: &mut Op<'_>,
        d: &mut InodeInfo,
        name: &[u8],
        ino: u32,
        ft: u8,
    ) -> Result<(), FsError> {
        let mut io = DirIo::new(self, op, d.clone())?;
        DirWriter::new(&mut io).add(name, ino, ft)?;
        *d = io.dir;
        Ok(())
    }

    fn check_absent(&self, d: &InodeInfo, name: &[u8]) -> Result<(), FsError> {
        crate::dir_write::check_name(name)?;
        self.check_encoding(d, name)?;
        if self.read(|f| f.lookup(d, name))?.is_some() {
            return Err(FsError::Exists);
        }
        Ok(())
    }

    /// EINVAL for a new name in a casefolded directory of a strict-mode
    /// filesystem that is not UTF-8 (the kernel's
    /// `generic_ci_validate_strict_name`), before anything changes.
    fn check_encoding(&self, d: &InodeInfo, name: &[u8]) -> Result<(), FsError> {
        if let Some(flags) = self.read(|f| f.info.casefold)
            && d.flags & flags::CASEFOLD_FL != 0
            && !ext4kit_format::casefold::allowed(name, flags)
        {
            return Err(FsError::InvalidName(
                "not UTF-8 (a casefolded directory in strict mode)",
            ));
        }
        Ok(())
    }

    /// Create a regular file, fifo, socket or device `name` in `parent`
    /// (mknod/create). Returns the new inode and the tid.
    pub fn create(
        &self,
        parent: u32,
        name: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        let _p = self.locks.call(parent);
        self.guard("create", parent, || self.create_op(parent, name, spec))
    }

    fn create_op(
        &self,
        parent: u32,
        name: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        if spec.mode & S_IFMT == S_IFDIR {
            return self.mkdir(parent, name, spec);
        }
        self.in_dir(parent, Some(name), 4, 2, |fs, op, d| {
            let spec = NewInode { links: 1, ..*spec };
            let i = fs.create_inode(op, parent, &spec)?;
            fs.add_entry(op, d, name, i.ino, i.file_type().dirent_type())?;
            fs.touch_dir(d, 0)?;
            Ok(i)
        })
    }

    /// O_TMPFILE: a regular file near `parent` with no name (link count
    /// 0, on the orphan list from its first transaction, as ext4's
    /// `ext4_tmpfile`): freed by [`Filesystem::release_orphan`] on the
    /// last close, or by orphan processing after a crash, unless
    /// [`Filesystem::link`] gives it a name first. Returns the new inode
    /// and the tid.
    pub fn create_tmpfile(
        &self,
        parent: u32,
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        if spec.mode & S_IFMT != S_IFREG {
            return Err(FsError::InvalidRequest(
                "O_TMPFILE makes a regular file only".into(),
            ));
        }
        let _p = self.locks.call(parent);
        self.guard("create_tmpfile", parent, || {
            flags::may_create_in(&self.inode(parent)?)?;
            self.in_dir(parent, None, 6, 1, |fs, op, _d| {
                let spec = NewInode { links: 0, ..*spec };
                let mut i = fs.create_inode(op, parent, &spec)?;
                fs.orphan_add(op, &mut i)?;
                Ok(i)
            })
        })
    }

    /// Make directory `name` in `parent` ("." and "..", link counts,
    /// used_dirs).
    pub fn mkdir(
        &self,
        parent: u32,
        name: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        let _p = self.locks.call(parent);
        self.guard("mkdir", parent, || self.mkdir_op(parent, name, spec))
    }

    fn mkdir_op(
        &self,
        parent: u32,
        name: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        let d = self.inode(parent)?;
        let dir_nlink = self.read(|f| {
            f.info
                .features
                .ro_compat
                .contains(ext4kit_format::features::RoCompat::DIR_NLINK)
        });
        if d.links >= LINK_MAX - 1 && !dir_nlink {
            return Err(FsError::TooManyLinks);
        }
        self.in_dir(parent, Some(name), 8, 3, |fs, op, d| {
            let spec = NewInode {
                mode: S_IFDIR | (spec.mode & 0o7777),
                links: 2,
                ..*spec
            };
            let mut i = fs.create_inode(op, parent, &spec)?;
            let params = fs.read(|f| DirParams::new(f.info, &i));
            let bs = fs.block_size();
            let block = new_dir_block(&params, bs as u32, parent);
            let group = fs.inode_group(i.ino);
            let mut req = AllocRequest::new(1, group);
            req.goal = Some(fs.balloc.goal_for_inode(group, false));
            let (p, held) = fs.place_block(&[], 0, &req)?;
            op.h.modify_new(p, |b| b.copy_from_slice(&block))?;
            fs.edit_inode(&mut i, |n| {
                n.set_size(bs);
                n.set_blocks_512(held * (bs / 512));
            })?;
            let m = Mapping {
                lblk: 0,
                pblk: p,
                len: 1,
                unwritten: false,
            };
            fs.write_tree(op, &mut i, &[], &[m])?;
            fs.store_inode(op, &i)?;
            fs.add_entry(op, d, name, i.ino, FT_DIR)?;
            fs.touch_dir(d, 1)?;
            Ok(i)
        })
    }

    /// Make symlink `name` -> `target` in `parent`.
    pub fn symlink(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        let _p = self.locks.call(parent);
        self.guard("symlink", parent, || {
            self.symlink_op(parent, name, target, spec)
        })
    }

    fn symlink_op(
        &self,
        parent: u32,
        name: &[u8],
        target: &[u8],
        spec: &NewInode,
    ) -> Result<(InodeInfo, u32), FsError> {
        let bs = self.block_size();
        if target.is_empty() || target.len() as u64 >= bs.min(4096) {
            return Err(FsError::NameTooLong);
        }
        self.in_dir(parent, Some(name), 6, 3, |fs, op, d| {
            let i = fs.create_symlink(op, parent, target, spec)?;
            fs.add_entry(op, d, name, i.ino, FileType::Symlink.dirent_type())?;
            fs.touch_dir(d, 0)?;
            Ok(i)
        })
    }

    /// Hard link `ino` as `name` in `parent` (not for directories).
    pub fn link(&self, ino: u32, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        self.guard("link", ino, || self.link_op(ino, parent, name))
    }

    fn link_op(&self, ino: u32, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        // A directory is refused before its lock would be taken after the
        // parent's (it may be the parent's ancestor); it stays one.
        if self.inode_any(ino)?.is_dir() {
            return Err(FsError::IsADirectory);
        }
        let _p = self.locks.call(parent);
        let _i = self.locks.call(ino);
        let i = self.inode_any(ino)?;
        flags::may_change(&i)?;
        self.same_project(&self.inode(parent)?, &i)?;
        if i.links >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        // An O_TMPFILE inode (link count 0, on the orphan list) gets its
        // first name: off the list in the same transaction (ext4's
        // `ext4_link` with `I_LINKABLE`).
        let tmp = i.links == 0;
        let excl = tmp && self.on_orphan_list(ino);
        Ok(self
            .in_dir_as(parent, Some(name), 4, 1, excl, |fs, op, d| {
                let mut i = if tmp {
                    fs.inode_any(ino)?
                } else {
                    fs.inode(ino)?
                };
                if tmp {
                    fs.orphan_del(op, &mut i)?;
                }
                let links = i.links + 1;
                let t = now();
                fs.edit_inode(&mut i, |n| {
                    n.i_links_count.set(links);
                    set_node_times(n, &Times::default(), t);
                })?;
                fs.store_inode(op, &i)?;
                fs.add_entry(op, d, name, ino, i.file_type().dirent_type())?;
                fs.touch_dir(d, 0)
            })?
            .1)
    }

    /// Blocks and groups a complete release of `inode` needs.
    fn release_cost(&self, inode: &InodeInfo) -> Result<(u32, u32), FsError> {
        if !inode.has_extents() {
            let (ec, eg) = self.ea_release_cost(inode)?;
            return Ok((2 + ec, 1 + eg));
        }
        let (maps, nodes) = self.mapping(inode)?;
        let l = self.descs.layout();
        let mut groups = BTreeSet::new();
        for m in &maps {
            groups.extend(l.group_of(m.pblk)..=l.group_of(m.pblk + u64::from(m.len) - 1));
        }
        let (ec, eg) = self.ea_release_cost(inode)?;
        Ok((nodes.len() as u32 + 4 + ec, groups.len() as u32 + 2 + eg))
    }

    /// Free everything of `inode` inside `op` (blocks, tree, xattr block,
    /// dtime, link count 0, inode bitmap).
    fn release_in(&self, op: &mut Op<'_>, inode: &mut InodeInfo) -> Result<(), FsError> {
        let bs = self.block_size();
        if inode.has_extents() {
            let (maps, nodes) = self.mapping(inode)?;
            // Every extent goes: nothing stays to keep a cluster.
            let freed = self.free_data(op, &maps, None, None)?;
            let blocks = inode.blocks_512.saturating_sub(freed * (bs / 512));
            self.edit_inode(inode, |n| n.set_blocks_512(blocks))?;
            self.write_tree(op, inode, &nodes, &[])?;
            if inode.is_dir() {
                for m in &maps {
                    for b in m.pblk..m.pblk + u64::from(m.len) {
                        op.h.revoke(b)?;
                    }
                }
            }
        }
        let ino = inode.ino;
        let geo = self.xattr_geometry();
        if inode.file_acl != 0 || geo.ea_inode {
            let mut slot = inode.raw.clone();
            let mut io = self.xattr_io(op);
            let (_, i) = xw::ea_charge(&geo, &io, ino, &slot).map_err(xattr_fs)?;
            xw::release_xattr_block(&geo, &mut io, ino, &mut slot).map_err(xattr_fs)?;
            drop(io);
            // The values' blocks leave with i_blocks (quota_note_alloc).
            self.quota_note_ea(op, ino, &slot, 0, -(i as i64));
            *inode = self.decode_any(ino, slot)?;
        }
        let t = now();
        self.edit_inode(inode, |n| {
            n.i_dtime.set(t.sec as u32);
            n.i_links_count.set(0);
            n.set_size(0);
        })?;
        self.store_inode(op, inode)?;
        self.quota_note_alloc(op, ino, &inode.raw, false);
        self.ialloc
            .free(self.rw.blocks(), ino, inode.mode & S_IFMT == S_IFDIR)
    }

    /// Remove `name` (not a directory) from `parent`; the inode is freed
    /// with its last link.
    pub fn unlink(&self, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        self.guard("unlink", parent, || self.unlink_op(parent, name))
    }

    fn unlink_op(&self, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        self.unlink_with(parent, name, |_| false).map(|(t, _, _)| t)
    }

    /// unlink for a file that is still open: the last link goes, the
    /// inode stays (link count 0, on the orphan list, readable and
    /// writable by number) until [`Filesystem::release_orphan`] on the last
    /// close, or the next open after a crash frees it. Returns the tid and
    /// whether the inode became such an orphan.
    pub fn unlink_open(&self, parent: u32, name: &[u8]) -> Result<(u32, bool), FsError> {
        self.guard("unlink_open", parent, || self.unlink_open_op(parent, name))
    }

    fn unlink_open_op(&self, parent: u32, name: &[u8]) -> Result<(u32, bool), FsError> {
        self.unlink_with(parent, name, |_| true)
            .map(|(t, _, orphan)| (t, orphan))
    }

    /// unlink that decides under the engine's locks whether the inode
    /// stays as an orphan ([`Filesystem::unlink_open`]) or is freed with
    /// its last link ([`Filesystem::unlink`]): `keep(ino)` is asked once,
    /// only when the inode loses its last link, with the directory's and
    /// the inode's call locks held, before anything changes. The mount
    /// answers "is it open?" there, so an open that holds
    /// [`Filesystem::lock_inode`] cannot slip in between the answer and
    /// the free. Returns the tid, the inode number and whether the inode
    /// became an orphan.
    pub fn unlink_keep_if(
        &self,
        parent: u32,
        name: &[u8],
        keep: impl FnOnce(u32) -> bool,
    ) -> Result<(u32, u32, bool), FsError> {
        self.guard("unlink", parent, || self.unlink_with(parent, name, keep))
    }

    /// The last close of an inode unlinked while open: free it.
    pub fn release_orphan(&self, ino: u32) -> Result<u32, FsError> {
        let _c = self.locks.call(ino);
        self.guard("release_orphan", ino, || self.release_orphan_op(ino))
    }

    fn release_orphan_op(&self, ino: u32) -> Result<u32, FsError> {
        let i = self.inode_any(ino)?;
        if i.links != 0 {
            return Ok(self.rw.journal().running_tid());
        }
        self.delete_inode(ino)
    }

    fn unlink_with(
        &self,
        parent: u32,
        name: &[u8],
        keep: impl FnOnce(u32) -> bool,
    ) -> Result<(u32, u32, bool), FsError> {
        let p_lock = self.locks.call(parent);
        let disk = self.disk_name(parent, name)?;
        let name = &disk[..];
        let Some(target) = self.lookup_disk(parent, name)? else {
            return Err(FsError::NotFound);
        };
        if target.is_dir() {
            return Err(FsError::IsADirectory);
        }
        // The entry cannot change under the parent's lock; the inode is
        // read again under its own.
        let t_lock = self.locks.call(target.ino);
        let target = self.inode(target.ino)?;
        flags::may_remove_entry(&self.inode(parent)?, &target)?;
        let keep = target.links <= 1 && keep(target.ino);
        let (c, g) = self.release_cost(&target)?;
        let whole = !keep && target.links <= 1 && g as usize <= MAX_GROUPS * 4;
        let (_, tid) = self.in_dir(
            parent,
            None,
            c + 2,
            if whole { g } else { 0 },
            |fs, op, d| {
                let mut io = DirIo::new(fs, op, d.clone())?;
                DirWriter::new(&mut io).remove(name)?;
                *d = io.dir;
                fs.touch_dir(d, 0)?;
                let mut i = fs.inode(target.ino)?;
                if i.links <= 1 && whole {
                    op.own(target.ino);
                    fs.release_in(op, &mut i)
                } else {
                    let links = i.links.saturating_sub(1);
                    let t = now();
                    fs.edit_inode(&mut i, |n| {
                        n.i_links_count.set(links);
                        set_node_times(n, &Times::default(), t);
                    })?;
                    if links == 0 {
                        // Freed on release (or right after, in its own
                        // transactions); on the orphan list until then.
                        fs.orphan_add(op, &mut i)
                    } else {
                        fs.store_inode(op, &i)
                    }
                }
            },
        )?;
        let orphan = target.links <= 1 && !whole;
        if orphan && !keep {
            // On the orphan list now: the directory is free for others
            // while the file's blocks go, in steps.
            drop(p_lock);
            let tid = self.delete_inode(target.ino)?;
            drop(t_lock);
            return Ok((tid, target.ino, false));
        }
        Ok((tid, target.ino, orphan))
    }

    /// Remove the empty directory `name` from `parent`.
    pub fn rmdir(&self, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        let _p = self.locks.call(parent);
        self.guard("rmdir", parent, || self.rmdir_op(parent, name))
    }

    fn rmdir_op(&self, parent: u32, name: &[u8]) -> Result<u32, FsError> {
        if name == b"." {
            return Err(FsError::InvalidName("rmdir of '.'"));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        let disk = self.disk_name(parent, name)?;
        let name = &disk[..];
        let Some(target) = self.lookup_disk(parent, name)? else {
            return Err(FsError::NotFound);
        };
        if !target.is_dir() {
            return Err(FsError::NotADirectory);
        }
        // A child after its parent (see "Locking"); read again under it.
        let _t = self.locks.call(target.ino);
        let target = self.inode(target.ino)?;
        flags::may_remove_entry(&self.inode(parent)?, &target)?;
        let entries = self.read(|f| f.read_dir(&target))?;
        crate::dir::check_dots(&target, &entries)?;
        if entries.iter().any(|e| e.name != b"." && e.name != b"..") {
            return Err(FsError::NotEmpty);
        }
        let (c, g) = self.release_cost(&target)?;
        Ok(self
            .in_dir(parent, None, c + 4, g, |fs, op, d| {
                op.own(target.ino);
                let mut t = fs.inode(target.ino)?;
                let mut io = DirIo::new(fs, op, d.clone())?;
                DirWriter::new(&mut io).remove(name)?;
                *d = io.dir;
                fs.touch_dir(d, -1)?;
                fs.release_in(op, &mut t)
            })?
            .1)
    }

    /// Apply `f` to directory `d` through a [`DirWriter`] (its inode state
    /// carried back into `d`).
    fn with_dir<R>(
        &self,
        op: &mut Op<'_>,
        d: &mut InodeInfo,
        f: impl FnOnce(&mut DirWriter<'_, DirIo<'_, '_>>) -> Result<R, FsError>,
    ) -> Result<R, FsError> {
        let mut io = DirIo::new(self, op, d.clone())?;
        let r = f(&mut DirWriter::new(&mut io))?;
        *d = io.dir;
        Ok(r)
    }

    /// The `..` of directory `m` (moved to `to`) retargeted and `m`
    /// stored: in place in an inline directory's `i_block`.
    fn retarget_dotdot(&self, op: &mut Op<'_>, m: &mut InodeInfo, to: u32) -> Result<(), FsError> {
        if m.has_inline_data() {
            self.set_inline_parent(m, to)?;
        } else {
            self.with_dir(op, m, |w| w.retarget(b"..", to, FT_DIR).map(|_| ()))?;
        }
        self.store_inode(op, m)
    }

    /// A directory `d` of `parent` about to move away: its '..'
    /// must name `parent` (else it is a second link to a directory whose
    /// parent is elsewhere: corrupt, EUCLEAN through the mount).
    fn check_parent(&self, d: &InodeInfo, parent: u32) -> Result<(), FsError> {
        if !d.is_dir() {
            return Ok(());
        }
        let up = {
            let _r = self.locks.read(d.ino);
            self.read(|f| f.parent_of(d))?
        };
        if up == Some(parent) {
            return Ok(());
        }
        Err(FsError::corrupt(
            "directory",
            format!(
                "inode {} has two parents: its '..' names inode {}, not {parent}; the image needs e2fsck",
                d.ino,
                up.unwrap_or(0)
            ),
        ))
    }

    /// Is directory `anc` the directory `ino` or one of its ancestors?
    /// (One block per level: `..` is in each directory's first block.)
    fn is_ancestor(&self, anc: u32, mut ino: u32) -> Result<bool, FsError> {
        for _ in 0..4096 {
            if ino == anc {
                return Ok(true);
            }
            if ino == 2 {
                return Ok(false);
            }
            let up = {
                let _r = self.locks.read(ino);
                let d = self.inode(ino)?;
                self.read(|f| f.parent_of(&d))?
            };
            let Some(up) = up else {
                return Ok(false);
            };
            ino = up;
        }
        Err(FsError::corrupt(
            "directory",
            "a '..' chain does not reach the root",
        ))
    }

    /// rename(2) / renameat2: move `sname` of `sdir` to `dname` of `ddir`,
    /// replacing an existing target (a file, or an empty directory for a
    /// directory) unless `flags.noreplace`; `flags.exchange` swaps the two
    /// entries. Directories moved across parents get their `..` and both
    /// parents' link counts updated. One transaction.
    pub fn rename(
        &self,
        sdir: u32,
        sname: &[u8],
        ddir: u32,
        dname: &[u8],
        flags: RenameFlags,
    ) -> Result<u32, FsError> {
        self.rename_keep_if(sdir, sname, ddir, dname, flags, |_| false)
            .map(|(t, _)| t)
    }

    /// [`Filesystem::rename`] where a replaced file losing its last link
    /// stays as an orphan (link count 0, on the orphan list, in the same
    /// transaction: as ext4 keeps a replaced open file) when
    /// `keep(ino)` says so; asked once under the engine's locks (see
    /// [`Filesystem::unlink_keep_if`]), only for such a file. Returns the
    /// tid and whether the replaced file became an orphan.
    pub fn rename_keep_if(
        &self,
        sdir: u32,
        sname: &[u8],
        ddir: u32,
        dname: &[u8],
        flags: RenameFlags,
        keep: impl FnOnce(u32) -> bool,
    ) -> Result<(u32, bool), FsError> {
        self.guard("rename", sdir, || {
            // The tree above the parents holds still while their order is
            // decided (the kernel's s_vfs_rename_mutex and lock_rename).
            let _r = (sdir != ddir).then(|| lock(&self.renames));
            let _parents = self.lock_parents(sdir, ddir);
            self.rename_op(sdir, sname, ddir, dname, flags, keep)
        })
    }

    /// Call locks of a rename's parents: an ancestor before its
    /// descendant (an rmdir or rename inside the ancestor locks the
    /// descendant after it), else by inode number. A failed walk up
    /// (the caller's checks report it) orders by number.
    fn lock_parents(&self, a: u32, b: u32) -> Vec<InodeLock<'_>> {
        if a == b {
            return vec![self.locks.call(a)];
        }
        let first = if self.is_ancestor(b, a).unwrap_or(false) {
            b
        } else if self.is_ancestor(a, b).unwrap_or(false) {
            a
        } else {
            a.min(b)
        };
        let second = if first == a { b } else { a };
        vec![self.locks.call(first), self.locks.call(second)]
    }

    fn rename_op(
        &self,
        sdir: u32,
        sname: &[u8],
        ddir: u32,
        dname: &[u8],
        flags: RenameFlags,
        keep: impl FnOnce(u32) -> bool,
    ) -> Result<(u32, bool), FsError> {
        if flags.noreplace && flags.exchange {
            return Err(FsError::InvalidName(
                "RENAME_NOREPLACE with RENAME_EXCHANGE",
            ));
        }
        if flags.whiteout.is_some() && flags.exchange {
            return Err(FsError::InvalidName("RENAME_WHITEOUT with RENAME_EXCHANGE"));
        }
        for n in [sname, dname] {
            crate::dir_write::check_name(n)?;
            if n == b"." || n == b".." {
                return Err(FsError::InvalidName("renaming '.' or '..'"));
            }
        }
        let src = self.lookup(sdir, sname)?.ok_or(FsError::NotFound)?;
        self.check_encoding(&self.inode(ddir)?, dname)?;
        let dst = self.lookup(ddir, dname)?;
        // fscrypt_prepare_rename: both directories' keys, which the
        // engine never has (ENOKEY; a rename inside one encrypted
        // directory too).
        flags::may_rename_between(&self.inode(sdir)?, &self.inode(ddir)?)?;
        // As do_renameat2: NOREPLACE is checked first, then two links of
        // one inode make the rename a no-op (vfs_rename).
        if flags.noreplace && dst.is_some() {
            return Err(FsError::Exists);
        }
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
            return Ok((self.rw.journal().running_tid(), false));
        }
        if flags.exchange && dst.is_none() {
            return Err(FsError::NotFound);
        }
        // A directory may not move below itself.
        if src.is_dir() && sdir != ddir && self.is_ancestor(src.ino, ddir)? {
            return Err(FsError::InvalidName("moving a directory into itself"));
        }
        // A target that contains the source: EINVAL for an exchange,
        // ENOTEMPTY otherwise (do_renameat2's "trap" checks, before the
        // type checks).
        if let Some(d) = &dst
            && d.is_dir()
            && sdir != ddir
            && self.is_ancestor(d.ino, sdir)?
        {
            return Err(if flags.exchange {
                FsError::InvalidName("moving a directory into itself")
            } else {
                FsError::NotEmpty
            });
        }
        // A directory moved to another parent must be the one its '..'
        // names: an entry that is a second link to a directory (a damaged
        // image) would otherwise retarget the '..' of a directory that
        // lives elsewhere, disconnecting it or making a loop (the same
        // for the other side of an exchange).
        if sdir != ddir {
            self.check_parent(&src, sdir)?;
            if let Some(d) = dst.as_ref().filter(|_| flags.exchange) {
                self.check_parent(d, ddir)?;
            }
        }
        // The moved and the replaced inode, after the parents (neither is
        // an ancestor of a parent: refused above); read again under their
        // locks.
        let mut kids = vec![src.ino];
        kids.extend(dst.as_ref().map(|d| d.ino));
        let _kids = self.locks.call_sorted(&kids);
        let src = self.inode(src.ino)?;
        let dst = match dst {
            Some(d) => Some(self.inode(d.ino)?),
            None => None,
        };
        // may_delete of the source (and of a replaced or exchanged
        // target), may_create in the target directory, and a directory
        // moved to another parent must be writable itself ('..').
        let (sd, dd) = (self.inode(sdir)?, self.inode(ddir)?);
        // Into a PROJINHERIT directory of another project: EXDEV (both
        // ways for an exchange), as ext4_rename / ext4_cross_rename.
        self.same_project(&dd, &src)?;
        if let Some(d) = dst.as_ref().filter(|_| flags.exchange) {
            self.same_project(&sd, d)?;
        }
        flags::may_remove_entry(&sd, &src)?;
        match &dst {
            Some(d) => flags::may_remove_entry(&dd, d)?,
            None => flags::may_add_entry(&dd)?,
        }
        if src.is_dir() && sdir != ddir {
            flags::may_write_data(&src)?;
        }
        let mut keep_replaced = false;
        let mut release = None;
        if let (Some(d), false) = (&dst, flags.exchange) {
            match (src.is_dir(), d.is_dir()) {
                (true, false) => return Err(FsError::NotADirectory),
                (false, true) => return Err(FsError::IsADirectory),
                (true, true) => {
                    let e = self.read(|f| f.read_dir(d))?;
                    crate::dir::check_dots(d, &e)?;
                    if e.iter().any(|x| x.name != b"." && x.name != b"..") {
                        return Err(FsError::NotEmpty);
                    }
                }
                _ => {}
            }
            keep_replaced = !d.is_dir() && d.links <= 1 && keep(d.ino);
            if (d.is_dir() || d.links <= 1) && !keep_replaced {
                release = Some(self.release_cost(d)?);
            }
        }
        let (rc, rg) = release.unwrap_or((4, 0));
        // A whiteout: its inode (bitmap, descriptor, table block, the
        // superblock's counts) in the source directory's group.
        let (wc, wg) = if flags.whiteout.is_some() {
            (8, 1)
        } else {
            (0, 0)
        };
        // Either directory may be inline (converted here).
        let (ic, ig) = (2 * super::inline::UNINLINE_CREDITS, 2);
        let mut op = self.begin(2 * 24 + rc + 8 + wc + ic, rg + 3 + wg + ig)?;
        for ino in [sdir, ddir, src.ino] {
            op.own(ino);
        }
        if let Some(d) = &dst {
            op.own(d.ino);
        }
        let r = (|| -> Result<(), FsError> {
            let mut sd = self.inode(sdir)?;
            let mut dd_own = if ddir == sdir {
                None
            } else {
                Some(self.inode(ddir)?)
            };
            let sft = src.file_type().dirent_type();
            if flags.exchange {
                let d = dst.clone().ok_or(FsError::NotFound)?;
                let dft = d.file_type().dirent_type();
                self.with_dir(&mut op, &mut sd, |w| {
                    w.retarget(sname, d.ino, dft).map(|_| ())
                })?;
                {
                    let dd = dd_own.as_mut().unwrap_or(&mut sd);
                    self.with_dir(&mut op, dd, |w| w.retarget(dname, src.ino, sft).map(|_| ()))?;
                }
                if sdir != ddir {
                    for (moved, to) in [(&src, ddir), (&d, sdir)] {
                        if moved.is_dir() {
                            let mut m = self.inode(moved.ino)?;
                            self.retarget_dotdot(&mut op, &mut m, to)?;
                        }
                    }
                    let dd = dd_own.as_mut().ok_or(FsError::NotFound)?;
                    match (src.is_dir(), d.is_dir()) {
                        (true, false) => {
                            self.touch_dir(&mut sd, -1)?;
                            self.touch_dir(dd, 1)?;
                        }
                        (false, true) => {
                            self.touch_dir(&mut sd, 1)?;
                            self.touch_dir(dd, -1)?;
                        }
                        _ => {
                            self.touch_dir(&mut sd, 0)?;
                            self.touch_dir(dd, 0)?;
                        }
                    }
                } else {
                    self.touch_dir(&mut sd, 0)?;
                }
                for ino in [src.ino, d.ino] {
                    let mut i = self.inode(ino)?;
                    let t = now();
                    self.edit_inode(&mut i, |n| set_node_times(n, &Times::default(), t))?;
                    self.store_inode(&mut op, &i)?;
                }
            } else {
                // The target name first (add, or retarget over the old).
                {
                    let dd = dd_own.as_mut().unwrap_or(&mut sd);
                    match &dst {
                        Some(_) => {
                            self.with_dir(&mut op, dd, |w| {
                                w.retarget(dname, src.ino, sft).map(|_| ())
                            })?;
                        }
                        None => self.with_dir(&mut op, dd, |w| w.add(dname, src.ino, sft))?,
                    }
                }
                match flags.whiteout {
                    None => self.with_dir(&mut op, &mut sd, |w| w.remove(sname).map(|_| ()))?,
                    Some((uid, gid)) => {
                        let spec = NewInode {
                            rdev: Some((0, 0)),
                            ..NewInode::new(S_IFCHR, uid, gid)
                        };
                        let wh = self.create_inode(&mut op, sdir, &spec)?;
                        self.with_dir(&mut op, &mut sd, |w| {
                            w.retarget(sname, wh.ino, wh.file_type().dirent_type())
                                .map(|_| ())
                        })?;
                    }
                }
                // The replaced inode loses a link (or everything).
                let replaced_dir = dst.as_ref().is_some_and(|d| d.is_dir());
                if let Some(d) = &dst {
                    let mut i = self.inode(d.ino)?;
                    if keep_replaced {
                        // Still open: an orphan until its last close.
                        let t = now();
                        self.edit_inode(&mut i, |n| {
                            n.i_links_count.set(0);
                            set_node_times(n, &Times::default(), t);
                        })?;
                        self.orphan_add(&mut op, &mut i)?;
                    } else if d.is_dir() || i.links <= 1 {
                        self.release_in(&mut op, &mut i)?;
                    } else {
                        let links = i.links - 1;
                        let t = now();
                        self.edit_inode(&mut i, |n| {
                            n.i_links_count.set(links);
                            set_node_times(n, &Times::default(), t);
                        })?;
                        self.store_inode(&mut op, &i)?;
                    }
                }
                if src.is_dir() && sdir != ddir {
                    let mut m = self.inode(src.ino)?;
                    self.retarget_dotdot(&mut op, &mut m, ddir)?;
                }
                match dd_own.as_mut() {
                    Some(dd) => {
                        let sl = if src.is_dir() { -1 } else { 0 };
                        let dl = if src.is_dir() && !replaced_dir { 1 } else { 0 };
                        self.touch_dir(&mut sd, sl)?;
                        self.touch_dir(dd, dl)?;
                    }
                    None => {
                        let l = if replaced_dir { -1 } else { 0 };
                        self.touch_dir(&mut sd, l)?;
                    }
                }
                let mut i = self.inode(src.ino)?;
                let t = now();
                self.edit_inode(&mut i, |n| set_node_times(n, &Times::default(), t))?;
                self.store_inode(&mut op, &i)?;
            }
            self.store_inode(&mut op, &sd)?;
            if let Some(dd) = &dd_own {
                self.store_inode(&mut op, dd)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok((self.finish(op)?, keep_replaced)),
            Err(e) => Err(self.fail(op, e)),
        }
    }
}

/// renameat2 flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST when the target exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: swap source and target (both must exist).
    pub exchange: bool,
    /// RENAME_WHITEOUT, with the whiteout's owner (uid, gid): the source
    /// name is left pointing at a new character device 0/0, mode 0 (an
    /// overlayfs whiteout), made in the rename's transaction as ext4's
    /// `ext4_whiteout_for_rename`. Not with `exchange`.
    pub whiteout: Option<(u32, u32)>,
}
