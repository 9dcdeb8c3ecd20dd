//! `mkfs -d`: the new filesystem's tree, copied from a source, written
//! straight into the free space of the planned layout (no journal, no
//! read-back): a bulk populator, not the read-write engine.
//!
//! Order (see `docs/ARCHITECTURE.md`, "mkfs -d"): the writer's head (old
//! superblock wiped, device tail zeroed) → [`populate`] (file data, then
//! directory, symlink, extent and xattr blocks, each written once, in
//! preorder; allocations and inode slots recorded into the [`Layout`]) →
//! the writer's body (inode tables with the new inodes, bitmaps and
//! descriptors counting them, superblocks last). An error stops before
//! any superblock is written, so a failed run leaves no valid-looking
//! filesystem.
//!
//! Allocation is one cursor over the free space: each file's data is
//! placed in the first free run at or after the cursor that holds all of
//! it (so it is one extent where it fits), holes and all-zero blocks are
//! not allocated, tree blocks follow their data.
//!
//! With `-O inline_data` small files, symlinks and directories are
//! stored inline (`i_block` and `system.data`) exactly where mke2fs 1.47
//! does; see `docs/ARCHITECTURE.md`, "Inline data".

pub mod archive;
pub mod source;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use ext4kit_device::{Device, DeviceError};
use ext4kit_format::Csum;
use ext4kit_format::extent::{self, Extent, ExtentHeader, ExtentIndex};
use ext4kit_format::features::{Compat, Incompat, RoCompat};
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};
use ext4kit_format::inode::{
    self, EXT4_EXTENTS_FL, EXT4_INDEX_FL, EXT4_INLINE_DATA_FL, EXTRA_ISIZE, Inode, S_IFBLK,
    S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFREG, S_IFSOCK,
};
use ext4kit_fs::FsError;
use ext4kit_fs::dir_write::{DirBlocks, DirParams, DirWriter, new_dir_block};
use ext4kit_fs::xattr_write::{self, SetMode, XattrBlocks, XattrGeometry};
use zerocopy::IntoBytes;

use super::geometry::{Layout, Run};
use super::writer::SuperSettings;
use source::{Kind, Time, Tree};

/// Why `mkfs -d` failed: each names the source path it was at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PopulateError {
    /// The source could not be read.
    #[error("{}: {what}", path.display())]
    Source { path: PathBuf, what: String },
    /// Something in the source this filesystem cannot hold.
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    /// A type or feature not supported (yet).
    #[error("{}: not supported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    /// The file changed while it was copied.
    #[error("{}: changed while it was copied", path.display())]
    Changed { path: PathBuf },
    /// The tree does not fit.
    #[error("{}: {what}", path.display())]
    NoSpace { path: PathBuf, what: String },
    /// An option combination `-d` does not support yet.
    #[error("-d is not supported with {0} yet")]
    Feature(String),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// What [`populate`] leaves in the layout for the writer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Populated {
    /// The new inodes' slots, one after another (whole `inode_size`
    /// bytes each, checksummed): inode `first_ino + k` at `k *
    /// inode_size`. The copy numbers its inodes consecutively, so this
    /// is one flat buffer (no allocation per inode).
    pub table: Vec<u8>,
    /// Number of the first slot in `table`.
    pub first_ino: u32,
    /// Highest inode number in use.
    pub last_ino: u32,
    /// The root's link count (3 + its subdirectories).
    pub root_links: u16,
    /// The root became an htree.
    pub root_indexed: bool,
    /// Files (inodes) and bytes of data written.
    pub files: u64,
    pub data_bytes: u64,
    /// Every byte written by the populator (data and its metadata
    /// blocks).
    pub bytes_written: u64,
}

/// Options of the copy that are not in the layout.
#[derive(Clone, Default)]
pub struct PopulateOptions {
    /// `SOURCE_DATE_EPOCH`: times after it are clamped to it.
    pub clamp: Option<i64>,
    /// Called after each inode is written with the inodes written so far
    /// and the source bytes (file sizes) copied so far; see
    /// [`Tree::totals`] for what they run up to.
    pub progress: Option<std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>>,
}

impl std::fmt::Debug for PopulateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PopulateOptions")
            .field("clamp", &self.clamp)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Refuse the layouts `-d` does not handle yet (before anything is
/// written).
pub fn check_layout(l: &Layout) -> Result<(), PopulateError> {
    let f = &l.features;
    let bad = if !f.incompat.contains(Incompat::EXTENTS) {
        Some("a filesystem without extents (ext2/ext3)")
    } else if f.ro_compat.contains(RoCompat::BIGALLOC) {
        Some("bigalloc")
    } else if f.ro_compat.contains(RoCompat::QUOTA) || f.ro_compat.contains(RoCompat::PROJECT) {
        Some("quota")
    } else if l.hugefiles.is_some() {
        Some("mke2fs.conf's huge files")
    } else if l.super_only {
        Some("-S")
    } else if l.root.runs.len() != 1 || l.root.runs[0].len != 1 {
        Some("this root directory layout")
    } else {
        None
    };
    match bad {
        Some(w) => Err(PopulateError::Feature(w.into())),
        None => Ok(()),
    }
}

/// Everything that can be checked before the target is touched: the
/// layout ([`check_layout`]) and enough inodes for the tree.
pub fn check(l: &Layout, tree: &Tree) -> Result<(), PopulateError> {
    check_layout(l)?;
    number(l, tree).map(|_| ())
}

/// Copy `tree` into the free space of `layout` on `dev`, recording the
/// allocations, counts and inode slots in `layout` (see the module docs).
pub fn populate(
    dev: &dyn Device,
    layout: &mut Layout,
    settings: &SuperSettings,
    tree: &Tree,
    opts: &PopulateOptions,
) -> Result<(), PopulateError> {
    check_layout(layout)?;
    let bs = u64::from(layout.block_size);
    // Blocks the writer zeroes after the populator ran (the device tail,
    // as mke2fs's MD-superblock wipe) are left alone.
    let rsv = 65536 / bs;
    let mut tail = layout.blocks_count & !(rsv - 1);
    if tail > rsv {
        tail -= rsv;
    }
    let tail = if tail > 0 { tail } else { layout.blocks_count };
    let csum = super::writer::layout_csum(layout, settings);
    let mut p = Pop {
        l: layout,
        s: settings,
        csum,
        dev,
        opts,
        tree,
        cursor: 0,
        end: tail,
        allocs: Vec::new(),
        inos: vec![0; tree.nodes.len()],
        out: Populated::default(),
        table: Vec::new(),
        first_ino: 0,
        slot: Vec::new(),
        wbuf: Vec::new(),
        wat: 0,
    };
    p.cursor = p.l.used.next_free(p.l.first_data_block);
    p.first_ino = p.l.last_used_ino() + 1;
    let (inos, last) = number(p.l, tree)?;
    p.inos = inos;
    p.out.last_ino = last;
    p.run()?;
    p.account();
    let mut out = std::mem::take(&mut p.out);
    out.first_ino = p.first_ino;
    out.table = std::mem::take(&mut p.table);
    layout.populated = Some(out);
    Ok(())
}

/// Number the inodes in creation order: each node's inode number and
/// the highest one. Fails (naming the first path without one) when the
/// filesystem has too few.
fn number(l: &Layout, tree: &Tree) -> Result<(Vec<u32>, u32), PopulateError> {
    let mut inos = vec![0u32; tree.nodes.len()];
    let mut next = l.last_used_ino() + 1;
    inos[0] = 2;
    for (k, n) in tree.nodes.iter().enumerate().skip(1) {
        if n.name.len() > 255 {
            return Err(PopulateError::Invalid {
                path: tree.path(k),
                what: format!("name longer than 255 bytes ({})", n.name.len()),
            });
        }
        if n.parent == 0 && n.name == LOST_FOUND {
            if n.kind != Kind::Dir {
                return Err(PopulateError::Invalid {
                    path: tree.path(k),
                    what: "lost+found exists in the new filesystem and is a directory".into(),
                });
            }
            if !n.children.is_empty() {
                return Err(PopulateError::Unsupported {
                    path: tree.path(k),
                    what: "entries in lost+found".into(),
                });
            }
            inos[k] = 11;
            continue;
        }
        if let Some(t) = n.link_to {
            inos[k] = inos[t];
            continue;
        }
        if next > l.inodes_count {
            // The root and a merged lost+found have theirs already.
            let needed = tree.nodes[1..]
                .iter()
                .filter(|n| n.link_to.is_none() && !(n.parent == 0 && n.name == LOST_FOUND))
                .count();
            let free = l.inodes_count - l.last_used_ino();
            return Err(PopulateError::NoSpace {
                path: tree.path(k),
                what: format!("no inode left for it (the tree needs {needed}, {free} are free)"),
            });
        }
        inos[k] = next;
        next += 1;
    }
    Ok((inos, next - 1))
}

struct Pop<'a> {
    l: &'a mut Layout,
    s: &'a SuperSettings,
    csum: Csum,
    dev: &'a dyn Device,
    opts: &'a PopulateOptions,
    tree: &'a Tree,
    /// Next block to allocate from.
    cursor: u64,
    /// Allocation stops here.
    end: u64,
    /// Every allocated run (start, length).
    allocs: Vec<(u64, u64)>,
    /// Inode number of each node.
    inos: Vec<u32>,
    out: Populated,
    /// The new inodes' slots from `first_ino` on ([`Populated::table`]).
    table: Vec<u8>,
    first_ino: u32,
    /// The inode being stored (reused).
    slot: Vec<u8>,
    /// Writes not yet sent: bytes for the device from `wat` on, so that
    /// the data of many small files placed one after another goes out in
    /// few large writes.
    wbuf: Vec<u8>,
    wat: u64,
}

/// Largest write [`Pop::put`] gathers.
const WBUF: usize = 1 << 20;

const LOST_FOUND: &[u8] = b"lost+found";
/// `EXT4_LINK_MAX`.
const LINK_MAX: u32 = 65000;
/// Longest initialized extent.
const EXT_MAX: u32 = 32768;
/// Blocks read and written at once.
const CHUNK_BLOCKS: u64 = 256;
/// `EXT4_MIN_INLINE_DATA_SIZE`: inline data in `i_block`.
const INLINE_IBLOCK: usize = 60;
/// `EXT2_EXT_ATTR_MAGIC`, the in-inode attribute area's header.
const XATTR_MAGIC: u32 = 0xEA02_0000;

/// The in-inode attribute area libext2fs leaves on an inode with
/// inline_data, before its other xattrs ([`Pop::store`]).
#[derive(Clone, Copy)]
enum InlineEa<'b> {
    /// Nothing (no inline_data).
    None,
    /// Only the header magic: the inode was inline (`ext2fs_inline_data_init`)
    /// and `ext2fs_inline_data_expand` removed its `system.data`.
    Magic,
    /// `system.data` holding these bytes (the data past `i_block`'s 60).
    Data(&'b [u8]),
}

impl Pop<'_> {
    fn path(&self, n: usize) -> PathBuf {
        self.tree.path(n)
    }

    fn run(&mut self) -> Result<(), PopulateError> {
        let mut src_bytes = 0u64;
        for k in 0..self.tree.nodes.len() {
            let tree = self.tree;
            let n = &tree.nodes[k];
            if n.link_to.is_some() || (k != 0 && self.inos[k] == 11) {
                continue;
            }
            match n.kind {
                Kind::Dir => self.dir(k)?,
                Kind::File => self.file(k)?,
                Kind::Symlink => self.symlink(k)?,
                Kind::Char | Kind::Block | Kind::Fifo | Kind::Socket => self.special(k)?,
            }
            self.out.files += 1;
            if let Some(f) = &self.opts.progress {
                if n.kind == Kind::File {
                    src_bytes += n.size;
                }
                f(self.out.files, src_bytes);
            }
        }
        self.flush_writes()
    }

    // ---- allocation ----

    /// The free run at or after `b` (below `end`): (start, length).
    fn free_run(&self, b: u64) -> Option<(u64, u64)> {
        let s = self.l.used.next_free(b);
        if s >= self.end {
            return None;
        }
        let e = self.l.used.next_used(s).unwrap_or(self.end).min(self.end);
        Some((s, e - s))
    }

    /// Move the cursor to the first free run (at or after it) that holds
    /// `n` blocks, if there is one.
    fn reserve(&mut self, n: u64) {
        let mut b = self.cursor;
        while let Some((s, len)) = self.free_run(b) {
            if len >= n {
                self.cursor = s;
                return;
            }
            b = s + len;
        }
    }

    /// `n` blocks from the cursor on (wrapping once to the start): the
    /// physical runs, in order.
    fn take(&mut self, n: u64, who: usize) -> Result<Vec<(u64, u64)>, PopulateError> {
        let mut got = Vec::new();
        let mut left = n;
        let mut wrapped = false;
        while left > 0 {
            let Some((s, len)) = self.free_run(self.cursor) else {
                if wrapped {
                    return Err(PopulateError::NoSpace {
                        path: self.path(who),
                        what: "no space left in the new filesystem".into(),
                    });
                }
                wrapped = true;
                self.cursor = self.l.first_data_block;
                continue;
            };
            let k = len.min(left);
            self.l.used.insert(s, k);
            self.allocs.push((s, k));
            got.push((s, k));
            left -= k;
            self.cursor = s + k;
        }
        Ok(got)
    }

    fn write(&mut self, pblk: u64, data: &[u8]) -> Result<(), PopulateError> {
        self.put(data, pblk * u64::from(self.l.block_size))?;
        self.out.bytes_written += data.len() as u64;
        Ok(())
    }

    /// Write `data` at byte `off`: gathered with the writes before it
    /// when it follows them (see [`Pop::wbuf`]); [`Pop::flush_writes`]
    /// sends the rest.
    fn put(&mut self, data: &[u8], off: u64) -> Result<(), PopulateError> {
        if !self.wbuf.is_empty()
            && (self.wat + self.wbuf.len() as u64 != off || self.wbuf.len() + data.len() > WBUF)
        {
            self.flush_writes()?;
        }
        if self.wbuf.is_empty() {
            if data.len() >= WBUF {
                self.dev.write_at(data, off)?;
                return Ok(());
            }
            self.wat = off;
        }
        self.wbuf.extend_from_slice(data);
        Ok(())
    }

    fn flush_writes(&mut self) -> Result<(), PopulateError> {
        if !self.wbuf.is_empty() {
            self.dev.write_at(&self.wbuf, self.wat)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    // ---- extent trees ----

    /// The extent tree of `runs` (sorted, non-overlapping): `i_block` and
    /// the tree blocks it needs (allocated after the data, written).
    fn tree_for(
        &mut self,
        ino: u32,
        runs: &[Run],
        who: usize,
    ) -> Result<([u8; 60], u64), PopulateError> {
        let bs = self.l.block_size as usize;
        let per = usize::from(extent::entries_per_block(self.l.block_size));
        // (first logical block, 12-byte entry) of the current level.
        let mut level: Vec<(u32, [u8; 12])> = runs
            .iter()
            .map(|r| {
                let e = Extent::new(r.lblk, r.len as u16, r.pblk);
                let mut b = [0u8; 12];
                b.copy_from_slice(e.as_bytes());
                (r.lblk, b)
            })
            .collect();
        let mut depth = 0u16;
        let mut tree_blocks = 0u64;
        while level.len() > usize::from(extent::ENTRIES_IN_INODE) {
            let nodes = level.len().div_ceil(per);
            let blocks = self.take(nodes as u64, who)?;
            let mut pblks = blocks
                .iter()
                .flat_map(|&(s, n)| (s..s + n).collect::<Vec<_>>());
            let mut next = Vec::with_capacity(nodes);
            for chunk in level.chunks(per) {
                let Some(p) = pblks.next() else { break };
                let mut buf = vec![0u8; bs];
                let h = ExtentHeader::new(chunk.len() as u16, per as u16, depth);
                buf[..12].copy_from_slice(h.as_bytes());
                for (k, (_, e)) in chunk.iter().enumerate() {
                    buf[12 + 12 * k..24 + 12 * k].copy_from_slice(e);
                }
                if self.csum.metadata {
                    extent::set_block_checksum(&mut buf, ino, 0, &self.csum);
                }
                self.write(p, &buf)?;
                let ix = ExtentIndex::new(chunk[0].0, p);
                let mut b = [0u8; 12];
                b.copy_from_slice(ix.as_bytes());
                next.push((chunk[0].0, b));
            }
            tree_blocks += nodes as u64;
            level = next;
            depth += 1;
        }
        let mut root = [0u8; 60];
        let h = ExtentHeader::new(level.len() as u16, extent::ENTRIES_IN_INODE, depth);
        root[..12].copy_from_slice(h.as_bytes());
        for (k, (_, e)) in level.iter().enumerate() {
            root[12 + 12 * k..24 + 12 * k].copy_from_slice(e);
        }
        Ok((root, tree_blocks))
    }

    // ---- inodes ----

    fn clamp(&self, t: Time) -> Time {
        match self.opts.clamp {
            Some(c) if t.sec > c || (t.sec == c && t.nsec > 0) => Time { sec: c, nsec: 0 },
            _ => t,
        }
    }

    /// The inode of node `k` before xattrs.
    fn base_inode(&self, k: usize, mode: u16, links: u32) -> Inode {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let mut i = Inode::default();
        i.i_mode.set(mode | n.perm);
        i.i_uid.set(n.uid as u16);
        i.l_i_uid_high.set((n.uid >> 16) as u16);
        i.i_gid.set(n.gid as u16);
        i.l_i_gid_high.set((n.gid >> 16) as u16);
        let dir_nlink = self.l.features.ro_compat.contains(RoCompat::DIR_NLINK);
        let links = if mode == S_IFDIR && links >= LINK_MAX && dir_nlink {
            1
        } else {
            links.min(u32::from(u16::MAX))
        };
        i.i_links_count.set(links as u16);
        let enc = |t: Time| -> (u32, u32) {
            let epoch = ((t.sec - i64::from(t.sec as i32)) >> 32) as u32 & 3;
            (t.sec as u32, epoch | (t.nsec.min(999_999_999) << 2))
        };
        let (a, ax) = enc(self.clamp(n.atime));
        let (m, mx) = enc(self.clamp(n.mtime));
        let (c, cx) = enc(self.clamp(n.ctime));
        i.i_atime.set(a);
        i.i_mtime.set(m);
        i.i_ctime.set(c);
        if self.l.inode_size > 128 {
            i.i_extra_isize.set(EXTRA_ISIZE);
            i.i_atime_extra.set(ax);
            i.i_mtime_extra.set(mx);
            i.i_ctime_extra.set(cx);
            i.i_crtime.set(self.s.now);
        }
        i
    }

    /// Store the inode of node `k`, its xattrs added.
    fn store(&mut self, k: usize, i: &Inode) -> Result<(), PopulateError> {
        self.store_ea(k, i, InlineEa::None)
    }

    /// [`Pop::store`] with the in-inode area an inline_data inode gets
    /// first (`system.data` is the first in-inode entry, as libext2fs
    /// sets it before the copied xattrs).
    fn store_ea(&mut self, k: usize, i: &Inode, ea: InlineEa<'_>) -> Result<(), PopulateError> {
        let ino = self.inos[k];
        let mut slot = std::mem::take(&mut self.slot);
        slot.clear();
        slot.resize(usize::from(self.l.inode_size), 0);
        i.write_to(&mut slot, ino, &self.csum);
        if !matches!(ea, InlineEa::None) {
            put_inline_ea(&mut slot, ea);
            if self.csum.metadata {
                inode::set_checksum(&mut slot, ino, &self.csum);
            }
        }
        let tree = self.tree;
        let n = &tree.nodes[k];
        if !n.xattrs.is_empty() {
            let geo = XattrGeometry {
                block_size: self.l.block_size as usize,
                csum: self.csum,
                bit64: self.l.features.incompat.contains(Incompat::BIT64),
                huge_file: self.l.features.ro_compat.contains(RoCompat::HUGE_FILE),
                ea_inode: false,
                first_data_block: self.l.first_data_block,
                blocks_per_group: self.l.blocks_per_group,
                inodes_per_group: self.l.inodes_per_group,
                blocks_count: self.l.blocks_count,
                cluster_blocks: 1,
            };
            let mut xb = XBlocks {
                pop: self,
                who: k,
                blocks: BTreeMap::new(),
                err: None,
            };
            for (name, value) in &n.xattrs {
                let r = xattr_write::set_xattr(
                    &geo,
                    &mut xb,
                    ino,
                    &mut slot,
                    name,
                    Some(value),
                    SetMode::Any,
                );
                if let Some(e) = xb.err.take() {
                    return Err(e);
                }
                r.map_err(|e| PopulateError::Invalid {
                    path: tree.path(k),
                    what: format!("extended attribute {}: {e}", String::from_utf8_lossy(name)),
                })?;
            }
            let blocks = std::mem::take(&mut xb.blocks);
            for (b, data) in blocks {
                self.write(b, &data)?;
            }
            if self.csum.metadata {
                inode::set_checksum(&mut slot, ino, &self.csum);
            }
        }
        // Inodes are stored in the order they are numbered in.
        let at = (ino - self.first_ino) as usize * slot.len();
        if ino < self.first_ino || at != self.table.len() {
            return Err(PopulateError::Invalid {
                path: self.path(k),
                what: format!("inode {ino} stored out of order"),
            });
        }
        self.table.extend_from_slice(&slot);
        self.slot = slot;
        Ok(())
    }

    fn map_runs(
        &mut self,
        i: &mut Inode,
        ino: u32,
        runs: &[Run],
        who: usize,
    ) -> Result<u64, PopulateError> {
        let (root, tree_blocks) = self.tree_for(ino, runs, who)?;
        i.i_flags.set(i.i_flags.get() | EXT4_EXTENTS_FL);
        i.i_block_bytes_mut().copy_from_slice(&root);
        let data: u64 = runs.iter().map(|r| u64::from(r.len)).sum();
        Ok(data + tree_blocks)
    }

    /// `-O inline_data`: small files, symlinks and directories go inline,
    /// as mke2fs's `do_write_internal`, `ext2fs_symlink` and
    /// `ext2fs_mkdir` put them.
    fn inline(&self) -> bool {
        self.l.features.incompat.contains(Incompat::INLINE_DATA)
    }

    /// The most bytes an inline file or symlink holds: `i_block`'s 60 and
    /// what `ext2fs_xattr_inode_max_size` leaves for `system.data`'s
    /// value in the inode body (its entry, the end marker and the area's
    /// header out of `inode_size - 160`): `inode_size - 128`.
    fn inline_max(&self) -> usize {
        let isz = usize::from(self.l.inode_size);
        if isz <= 160 + 4 + 24 {
            return INLINE_IBLOCK;
        }
        INLINE_IBLOCK + (isz - 160 - 4 - 20 - 4) / 4 * 4
    }

    /// Store an inline inode: `data`'s first 60 bytes in `i_block`, the
    /// rest in `system.data` (empty when there is none).
    fn store_inline(&mut self, k: usize, mut i: Inode, data: &[u8]) -> Result<(), PopulateError> {
        i.i_flags.set(i.i_flags.get() | EXT4_INLINE_DATA_FL);
        let head = data.len().min(INLINE_IBLOCK);
        i.i_block_bytes_mut()[..head].copy_from_slice(&data[..head]);
        self.store_ea(k, &i, InlineEa::Data(&data[head..]))
    }

    fn set_blocks(&self, i: &mut Inode, blocks: u64) {
        i.set_blocks_512(blocks * u64::from(self.l.block_size) / 512);
    }

    // ---- node types ----

    fn dir_params(&self, ino: u32) -> DirParams {
        let f = &self.l.features;
        DirParams {
            ino,
            generation: 0,
            csum: self.csum,
            hash_seed: self.s.hash_seed,
            def_hash_version: self.s.def_hash_version,
            unsigned_hash: false,
            dir_index: f.compat.contains(Compat::DIR_INDEX),
            large_dir: f.incompat.contains(Incompat::LARGEDIR),
            filetype: f.incompat.contains(Incompat::FILETYPE),
            inodes_count: self.l.inodes_count,
            // mkfs -d makes no casefolded directory (mke2fs -d neither).
            casefold: None,
        }
    }

    fn dir(&mut self, k: usize) -> Result<(), PopulateError> {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let ino = self.inos[k];
        let parent = self.inos[n.parent];
        let p = self.dir_params(ino);
        let bs = self.l.block_size;
        let mut d = MemDir {
            p,
            bs,
            blocks: vec![new_dir_block(&p, bs, parent)],
            indexed: false,
        };
        let fs_err = |e: FsError| PopulateError::Invalid {
            path: tree.path(k),
            what: format!("directory: {e}"),
        };
        let links = 2 + n.subdirs + u32::from(k == 0);
        if k != 0 && self.inline() {
            // ext2fs_mkdir makes it inline (`..` and one empty entry in
            // i_block); ext2fs_link packs the entries after `..` until one
            // finds no room, then ext2fs_inline_data_expand moves them into
            // a block, where the rest follow: the blocks built below.
            let need: usize = n
                .children
                .iter()
                .map(|&c| ext4kit_format::dir::rec_len(tree.nodes[c].name.len()))
                .sum();
            let room = INLINE_IBLOCK - 4;
            if need <= room {
                let mut area = [0u8; INLINE_IBLOCK];
                area[..4].copy_from_slice(&parent.to_le_bytes());
                let mut off = 4;
                if n.children.is_empty() {
                    ext4kit_format::dir::put_entry(&mut area, off, 0, room as u16, b"", 0);
                }
                for (j, &c) in n.children.iter().enumerate() {
                    let cn = &tree.nodes[c];
                    let t = cn.link_to.map_or(cn, |t| &tree.nodes[t]);
                    let ft = if p.filetype { t.file_type() } else { 0 };
                    let mut len = ext4kit_format::dir::rec_len(cn.name.len());
                    if j + 1 == n.children.len() {
                        len = INLINE_IBLOCK - off;
                    }
                    off = ext4kit_format::dir::put_entry(
                        &mut area,
                        off,
                        self.inos[c],
                        len as u16,
                        &cn.name,
                        ft,
                    );
                }
                let mut i = self.base_inode(k, S_IFDIR, links);
                i.set_size(INLINE_IBLOCK as u64);
                return self.store_inline(k, i, &area);
            }
        }
        {
            let mut w = DirWriter::new(&mut d);
            if k == 0 {
                w.add(LOST_FOUND, 11, ext4kit_format::dir::FT_DIR)
                    .map_err(fs_err)?;
            }
            for &c in &n.children {
                let cn = &tree.nodes[c];
                if k == 0 && cn.name == LOST_FOUND {
                    continue;
                }
                let t = cn.link_to.map_or(cn, |t| &tree.nodes[t]);
                w.add(&cn.name, self.inos[c], t.file_type()).map_err(|e| {
                    PopulateError::Invalid {
                        path: tree.path(c),
                        what: format!("cannot link it: {e}"),
                    }
                })?;
            }
        }
        let nblocks = d.blocks.len() as u64;
        let mut runs = Vec::new();
        if k == 0 {
            let first = self.l.root.runs[0].pblk;
            runs.push(Run {
                lblk: 0,
                pblk: first,
                len: 1,
            });
            if nblocks > 1 {
                self.reserve(nblocks - 1);
                for (s, len) in self.take(nblocks - 1, k)? {
                    push_run(&mut runs, s, len);
                }
            }
            if runs.len() > usize::from(extent::ENTRIES_IN_INODE) {
                return Err(PopulateError::Unsupported {
                    path: tree.path(k),
                    what: "a root directory in more than 4 pieces".into(),
                });
            }
        } else {
            self.reserve(nblocks);
            for (s, len) in self.take(nblocks, k)? {
                push_run(&mut runs, s, len);
            }
        }
        for (lb, b) in d.blocks.iter().enumerate() {
            let pblk = pblk_of(&runs, lb as u32);
            self.write(pblk, b)?;
        }
        if k == 0 {
            self.l.root.runs = runs;
            self.out.root_links = links.min(u32::from(u16::MAX)) as u16;
            self.out.root_indexed = d.indexed;
            return Ok(());
        }
        let mut i = self.base_inode(k, S_IFDIR, links);
        i.set_size(nblocks * u64::from(bs));
        let blocks = self.map_runs(&mut i, ino, &runs, k)?;
        self.set_blocks(&mut i, blocks);
        if d.indexed {
            i.i_flags.set(i.i_flags.get() | EXT4_INDEX_FL);
        }
        if self.inline() {
            // Expanded out of its inline start.
            return self.store_ea(k, &i, InlineEa::Magic);
        }
        self.store(k, &i)
    }

    fn file(&mut self, k: usize) -> Result<(), PopulateError> {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let path = tree.path(k);
        let bs = u64::from(self.l.block_size);
        // The data: an archive member's bytes in the spool, or the host
        // file (checked against the scan before and after).
        let spool = match (n.spooled, &tree.spool) {
            (Some((off, _)), Some(f)) => Some((f.clone(), off)),
            _ => None,
        };
        let (f, base) = match &spool {
            Some((_, off)) => (None, *off),
            None => (
                Some(File::open(&path).map_err(|e| PopulateError::Source {
                    path: path.clone(),
                    what: format!("cannot open: {e}"),
                })?),
                0,
            ),
        };
        let changed = |md: &std::fs::Metadata| {
            !md.is_file()
                || md.size() != n.size
                || md.mtime() != n.mtime.sec
                || md.mtime_nsec() != i64::from(n.mtime.nsec)
        };
        if let Some(f) = &f {
            let md = f.metadata().map_err(|e| PopulateError::Source {
                path: path.clone(),
                what: format!("cannot stat: {e}"),
            })?;
            if changed(&md) {
                return Err(PopulateError::Changed { path });
            }
        }
        let size = n.size;
        if self.inline() && size <= self.inline_max() as u64 {
            return self.inline_file(k, f.as_ref(), spool.as_ref().map(|(s, o)| (&**s, *o)));
        }
        let segs = match &f {
            Some(f) => data_segments(f, size, bs).map_err(|e| PopulateError::Source {
                path: path.clone(),
                what: format!("cannot find its data: {e}"),
            })?,
            None if size > 0 => vec![(0, size.div_ceil(bs))],
            None => Vec::new(),
        };
        let Some(reader) = f.as_ref().or(spool.as_ref().map(|(s, _)| &**s)) else {
            return Err(PopulateError::Source {
                path,
                what: "no data".into(),
            });
        };
        let mut upper: u64 = segs.iter().map(|(a, b)| b - a).sum();
        // With inline_data the file starts inline: its first write of
        // data (the first block that is not all zero) finds no room and
        // ext2fs_inline_data_expand writes the 60 empty inline bytes at
        // offset 0, so block 0 is allocated (zeros) before that data.
        let mut need0 = self.inline();
        if need0 && segs.first().is_some_and(|s| s.0 != 0) {
            upper += 1;
        }
        if upper > 0 {
            self.reserve(upper);
        }
        let mut runs: Vec<Run> = Vec::new();
        // (A small file's buffer is its size: no 1 MiB allocation for each.)
        let mut buf = vec![0u8; (upper.min(CHUNK_BLOCKS) * bs) as usize];
        for (a, b) in segs {
            let mut blk = a;
            while blk < b {
                let nb = (b - blk).min(CHUNK_BLOCKS);
                let want = ((nb * bs).min(size - blk * bs)) as usize;
                let chunk = &mut buf[..(nb * bs) as usize];
                chunk.fill(0);
                read_full(reader, &mut chunk[..want], base + blk * bs).map_err(|e| match e {
                    ReadErr::Short => PopulateError::Changed { path: path.clone() },
                    ReadErr::Io(e) => PopulateError::Source {
                        path: path.clone(),
                        what: format!("cannot read: {e}"),
                    },
                })?;
                // Runs of blocks that are not all zero.
                let mut j = 0u64;
                while j < nb {
                    let at = |j: u64| &chunk[(j * bs) as usize..((j + 1) * bs) as usize];
                    if at(j).iter().all(|&x| x == 0) {
                        j += 1;
                        continue;
                    }
                    let mut e = j + 1;
                    while e < nb && !at(e).iter().all(|&x| x == 0) {
                        e += 1;
                    }
                    if need0 {
                        need0 = false;
                        if blk + j != 0 {
                            let zero = vec![0u8; bs as usize];
                            for (s, len) in self.take(1, k)? {
                                self.put(&zero, s * bs)?;
                                self.out.bytes_written += bs;
                                push_file_run(&mut runs, 0, s, len);
                            }
                        }
                    }
                    let mut off = j;
                    for (s, len) in self.take(e - j, k)? {
                        let bytes = &chunk[(off * bs) as usize..((off + len) * bs) as usize];
                        self.put(bytes, s * bs)?;
                        self.out.bytes_written += bytes.len() as u64;
                        self.out.data_bytes += bytes.len() as u64;
                        push_file_run(&mut runs, (blk + off) as u32, s, len);
                        off += len;
                    }
                    j = e;
                }
                blk += nb;
            }
        }
        if let Some(f) = &f {
            let md = f.metadata().map_err(|e| PopulateError::Source {
                path: path.clone(),
                what: format!("cannot stat: {e}"),
            })?;
            if changed(&md) {
                return Err(PopulateError::Changed { path });
            }
        }
        if size.div_ceil(bs) > 1 << 32 {
            return Err(PopulateError::Invalid {
                path,
                what: "larger than an ext4 file can be".into(),
            });
        }
        let ino = self.inos[k];
        let mut i = self.base_inode(k, S_IFREG, n.nlink);
        i.set_size(size);
        if self.inline() && runs.is_empty() {
            // Nothing but zeros: mke2fs's copy_file never writes, the
            // file stays inline and empty, whatever its size.
            return self.store_inline(k, i, &[]);
        }
        let blocks = self.map_runs(&mut i, ino, &runs, k)?;
        self.set_blocks(&mut i, blocks);
        if self.inline() {
            // Too big for inline: ext2fs_inline_data_expand at its first
            // write removed the empty `system.data`.
            return self.store_ea(k, &i, InlineEa::Magic);
        }
        self.store(k, &i)
    }

    /// A regular file that fits inline (`inline_max` bytes): its data in
    /// `i_block` and `system.data`, as `ext2fs_file_write` stores it. A
    /// file of only zeros is never written by mke2fs's `copy_file`: it
    /// stays inline with nothing in it, `i_size` its size.
    fn inline_file(
        &mut self,
        k: usize,
        f: Option<&File>,
        spool: Option<(&File, u64)>,
    ) -> Result<(), PopulateError> {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let path = tree.path(k);
        let mut data = vec![0u8; n.size as usize];
        let (reader, base) = match (f, spool) {
            (Some(f), _) => (f, 0),
            (None, Some((s, off))) => (s, off),
            (None, None) => {
                return Err(PopulateError::Source {
                    path,
                    what: "no data".into(),
                });
            }
        };
        read_full(reader, &mut data, base).map_err(|e| match e {
            ReadErr::Short => PopulateError::Changed { path: path.clone() },
            ReadErr::Io(e) => PopulateError::Source {
                path: path.clone(),
                what: format!("cannot read: {e}"),
            },
        })?;
        if let Some(f) = f {
            let md = f.metadata().map_err(|e| PopulateError::Source {
                path: path.clone(),
                what: format!("cannot stat: {e}"),
            })?;
            if !md.is_file()
                || md.size() != n.size
                || md.mtime() != n.mtime.sec
                || md.mtime_nsec() != i64::from(n.mtime.nsec)
            {
                return Err(PopulateError::Changed { path });
            }
        }
        if data.iter().all(|&b| b == 0) {
            data.clear();
        }
        let mut i = self.base_inode(k, S_IFREG, n.nlink);
        i.set_size(n.size);
        self.store_inline(k, i, &data)
    }

    fn symlink(&mut self, k: usize) -> Result<(), PopulateError> {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let ino = self.inos[k];
        let mut i = self.base_inode(k, S_IFLNK, n.nlink);
        i.set_size(n.target.len() as u64);
        if let Some(b) = inode::fast_symlink_i_block(&n.target, true) {
            i.i_block_bytes_mut().copy_from_slice(&b);
        } else if self.inline() && n.target.len() <= self.inline_max() {
            // ext2fs_symlink's inline symlink.
            return self.store_inline(k, i, &n.target);
        } else {
            let Some(block) = inode::slow_symlink_block(&n.target, self.l.block_size as usize)
            else {
                return Err(PopulateError::Invalid {
                    path: tree.path(k),
                    what: format!(
                        "symlink target of {} bytes does not fit a {}-byte block",
                        n.target.len(),
                        self.l.block_size
                    ),
                });
            };
            self.reserve(1);
            let got = self.take(1, k)?;
            let pblk = got[0].0;
            self.write(pblk, &block)?;
            let runs = [Run {
                lblk: 0,
                pblk,
                len: 1,
            }];
            let blocks = self.map_runs(&mut i, ino, &runs, k)?;
            self.set_blocks(&mut i, blocks);
        }
        self.store(k, &i)
    }

    fn special(&mut self, k: usize) -> Result<(), PopulateError> {
        let tree = self.tree;
        let n = &tree.nodes[k];
        let mode = match n.kind {
            Kind::Char => S_IFCHR,
            Kind::Block => S_IFBLK,
            Kind::Fifo => S_IFIFO,
            _ => S_IFSOCK,
        };
        let mut i = self.base_inode(k, mode, n.nlink);
        if matches!(n.kind, Kind::Char | Kind::Block) {
            let r = n.rdev;
            // glibc's gnu_dev_major / gnu_dev_minor.
            let major = (((r >> 8) & 0xfff) | ((r >> 32) & !0xfff)) as u32;
            let minor = ((r & 0xff) | ((r >> 12) & !0xff)) as u32;
            i.i_block_bytes_mut()
                .copy_from_slice(&inode::device_i_block(major, minor));
        }
        self.store(k, &i)
    }

    // ---- accounting ----

    /// The group descriptors' counts and flags, and the totals.
    fn account(&mut self) {
        let l = &mut *self.l;
        let bpg = u64::from(l.blocks_per_group);
        for &(s, n) in &self.allocs {
            let mut b = s;
            let end = s + n;
            while b < end {
                let g = ((b - l.first_data_block) / bpg) as usize;
                let gend = l.first_data_block + (g as u64 + 1) * bpg;
                let k = end.min(gend) - b;
                let gp = &mut l.groups[g];
                gp.free_blocks -= k as u32;
                gp.flags &= !BG_BLOCK_UNINIT;
                l.free_blocks -= k;
                b += k;
            }
        }
        let ipg = l.inodes_per_group;
        for (k, n) in self.tree.nodes.iter().enumerate().skip(1) {
            let ino = self.inos[k];
            if n.link_to.is_some() || ino == 11 {
                continue;
            }
            let (g, slot) = ((ino - 1) / ipg, (ino - 1) % ipg);
            let gp = &mut l.groups[g as usize];
            gp.free_inodes -= 1;
            if n.kind == Kind::Dir {
                gp.used_dirs += 1;
            }
            gp.flags &= !(BG_INODE_UNINIT | BG_BLOCK_UNINIT);
            gp.itable_unused = gp.itable_unused.min(ipg - slot - 1);
            l.free_inodes -= 1;
        }
    }
}

/// Write the in-inode attribute area of `ea` into `slot` (libext2fs's
/// `write_xattrs_to_buffer` for the inode body: hash 0, the value at the
/// end of the area, padded to 4 bytes; an empty value's offset is the
/// area's end).
fn put_inline_ea(slot: &mut [u8], ea: InlineEa<'_>) {
    let at = 128 + usize::from(EXTRA_ISIZE);
    if slot.len() < at + 4 + 24 {
        return;
    }
    slot[at..at + 4].copy_from_slice(&XATTR_MAGIC.to_le_bytes());
    if let InlineEa::Data(v) = ea {
        let e = at + 4;
        let room = slot.len() - e;
        let padded = v.len().div_ceil(4) * 4;
        let offs = room - padded;
        slot[e] = 4; // e_name_len
        slot[e + 1] = 7; // e_name_index: system.
        slot[e + 2..e + 4].copy_from_slice(&(offs as u16).to_le_bytes());
        slot[e + 4..e + 8].fill(0); // e_value_inum
        slot[e + 8..e + 12].copy_from_slice(&(v.len() as u32).to_le_bytes());
        slot[e + 12..e + 16].fill(0); // e_hash
        slot[e + 16..e + 20].copy_from_slice(b"data");
        slot[e + offs..e + offs + v.len()].copy_from_slice(v);
    }
}

fn pblk_of(runs: &[Run], lblk: u32) -> u64 {
    runs.iter()
        .find(|r| lblk >= r.lblk && lblk < r.lblk + r.len)
        .map_or(0, |r| r.pblk + u64::from(lblk - r.lblk))
}

/// Append a directory's physical run (logical blocks follow on).
fn push_run(runs: &mut Vec<Run>, pblk: u64, len: u64) {
    let lblk = runs.last().map_or(0, |r| r.lblk + r.len);
    push_file_run(runs, lblk, pblk, len);
}

/// Append `len` blocks at logical `lblk` → physical `pblk`, merged with
/// the last run when contiguous, split at the longest extent.
fn push_file_run(runs: &mut Vec<Run>, mut lblk: u32, mut pblk: u64, mut len: u64) {
    while len > 0 {
        if let Some(r) = runs.last_mut()
            && r.lblk + r.len == lblk
            && r.pblk + u64::from(r.len) == pblk
            && r.len < EXT_MAX
        {
            let k = len.min(u64::from(EXT_MAX - r.len)) as u32;
            r.len += k;
            lblk += k;
            pblk += u64::from(k);
            len -= u64::from(k);
            continue;
        }
        let k = len.min(u64::from(EXT_MAX)) as u32;
        runs.push(Run { lblk, pblk, len: k });
        lblk += k;
        pblk += u64::from(k);
        len -= u64::from(k);
    }
}

/// The file's data as block ranges `[a, b)` (SEEK_DATA/SEEK_HOLE, whole
/// blocks); the whole file when the source cannot tell.
fn data_segments(f: &File, size: u64, bs: u64) -> std::io::Result<Vec<(u64, u64)>> {
    const SEEK_DATA: i32 = 3;
    const SEEK_HOLE: i32 = 4;
    const ENXIO: i32 = 6;
    const EINVAL: i32 = 22;
    let whole = vec![(0, size.div_ceil(bs))];
    let mut segs: Vec<(u64, u64)> = Vec::new();
    let mut off = 0u64;
    while off < size {
        let data = match ext4kit_device::host::seek_data_hole(f, off as i64, SEEK_DATA) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(ENXIO) => break,
            Err(e) if e.raw_os_error() == Some(EINVAL) => return Ok(whole),
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = ext4kit_device::host::seek_data_hole(f, data as i64, SEEK_HOLE)?.min(size);
        let (a, b) = (data / bs, hole.div_ceil(bs));
        match segs.last_mut() {
            Some(l) if l.1 >= a => l.1 = l.1.max(b),
            _ => segs.push((a, b)),
        }
        off = hole.max(data + 1);
    }
    Ok(segs)
}

enum ReadErr {
    Short,
    Io(std::io::Error),
}

fn read_full(f: &File, mut buf: &mut [u8], mut off: u64) -> Result<(), ReadErr> {
    while !buf.is_empty() {
        match f.read_at(buf, off) {
            Ok(0) => return Err(ReadErr::Short),
            Ok(n) => {
                buf = &mut buf[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadErr::Io(e)),
        }
    }
    Ok(())
}

/// A directory being built in memory.
struct MemDir {
    p: DirParams,
    bs: u32,
    blocks: Vec<Vec<u8>>,
    indexed: bool,
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
        self.blocks
            .get(lblk as usize)
            .cloned()
            .ok_or_else(|| FsError::InvalidRequest(format!("directory block {lblk} past the end")))
    }
    fn write(&mut self, lblk: u32, data: &[u8]) -> Result<(), FsError> {
        match self.blocks.get_mut(lblk as usize) {
            Some(b) => {
                b.copy_from_slice(data);
                Ok(())
            }
            None => Err(FsError::InvalidRequest(format!(
                "directory block {lblk} past the end"
            ))),
        }
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

/// The xattr block of one inode, kept until the inode is done.
struct XBlocks<'p, 'a> {
    pop: &'p mut Pop<'a>,
    who: usize,
    blocks: BTreeMap<u64, Vec<u8>>,
    err: Option<PopulateError>,
}

impl XattrBlocks for XBlocks<'_, '_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.blocks
            .get(&blk)
            .cloned()
            .ok_or_else(|| FsError::InvalidRequest(format!("xattr block {blk} not made here")))
    }
    fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
        self.blocks.insert(blk, data.to_vec());
        Ok(())
    }
    fn alloc(&mut self, _goal: u64) -> Result<Option<u64>, FsError> {
        match self.pop.take(1, self.who) {
            Ok(v) => Ok(v.first().map(|r| r.0)),
            Err(e) => {
                self.err = Some(e);
                Ok(None)
            }
        }
    }
    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        Err(FsError::InvalidRequest(format!(
            "xattr block {blk} freed while copying"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(BTreeMap<u64, Vec<u8>>, u64);
    impl XattrBlocks for Mem {
        fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
            Ok(self.0[&blk].clone())
        }
        fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
            self.0.insert(blk, data.to_vec());
            Ok(())
        }
        fn alloc(&mut self, _goal: u64) -> Result<Option<u64>, FsError> {
            self.1 += 1;
            Ok(Some(self.1))
        }
        fn free(&mut self, _blk: u64) -> Result<(), FsError> {
            Ok(())
        }
    }

    #[test]
    fn inline_ea_is_libext2fs_system_data() {
        let at = 128 + usize::from(EXTRA_ISIZE);
        let mut slot = vec![0u8; 256];
        put_inline_ea(&mut slot, InlineEa::Data(b"abcde"));
        assert_eq!(slot[at..at + 4], XATTR_MAGIC.to_le_bytes());
        let e = &slot[at + 4..];
        // name_len 4, index 7 (system.), value at 92 - 8 = 84, size 5,
        // hash 0, "data", end marker.
        assert_eq!(e[..4], [4, 7, 84, 0]);
        assert_eq!(e[8..12], 5u32.to_le_bytes());
        assert_eq!(e[12..16], [0; 4]);
        assert_eq!(&e[16..20], b"data");
        assert_eq!(e[20..24], [0; 4]);
        assert_eq!(&e[84..89], b"abcde");
        assert_eq!(e[89..92], [0; 3]);
        // Empty: the value's offset is the area's end; only the magic
        // for an expanded inode.
        let mut slot = vec![0u8; 256];
        put_inline_ea(&mut slot, InlineEa::Data(b""));
        assert_eq!(slot[at + 4..at + 8], [4, 7, 92, 0]);
        let mut slot = vec![0u8; 256];
        put_inline_ea(&mut slot, InlineEa::Magic);
        assert!(slot[at + 4..].iter().all(|&b| b == 0));
        assert_eq!(slot[at..at + 4], XATTR_MAGIC.to_le_bytes());
    }

    #[test]
    fn big_xattr_goes_to_a_block() {
        let csum = Csum::new(true, false, false, 0, [7; 16]);
        let geo = XattrGeometry {
            block_size: 4096,
            csum,
            bit64: true,
            huge_file: true,
            ea_inode: false,
            first_data_block: 0,
            blocks_per_group: 32768,
            inodes_per_group: 8192,
            blocks_count: 65536,
            cluster_blocks: 1,
        };
        let mut i = Inode::default();
        i.i_mode.set(S_IFREG | 0o644);
        i.i_extra_isize.set(EXTRA_ISIZE);
        let mut slot = vec![0u8; 256];
        i.write_to(&mut slot, 12, &csum);
        let mut m = Mem(BTreeMap::new(), 100);
        let r = xattr_write::set_xattr(
            &geo,
            &mut m,
            12,
            &mut slot,
            b"user.big",
            Some(&[7u8; 3000]),
            SetMode::Any,
        );
        assert!(r.is_ok(), "{r:?}");
    }
}
