//! `s_kbytes_written` exactly as mke2fs 1.47 leaves it.
//!
//! mke2fs stores 1, then at close adds the bytes its Unix I/O channel had
//! sent to the device so far (`ext2fs_close2`), plus the superblock and
//! descriptor blocks it is about to write. The channel has an 8-block
//! write-back cache, so the count depends on which dirty blocks were evicted
//! before the close. This module replays mke2fs's sequence of single-block
//! accesses through the same LRU cache to get the same number. It only
//! feeds one informational superblock field, but byte-for-byte parity with
//! mke2fs needs it.

use ext4kit_format::features::{Incompat, RoCompat};
use ext4kit_format::group_desc::{BG_BLOCK_UNINIT, BG_INODE_UNINIT};

use super::geometry::{Layout, MapStep};
use super::quota::Io;

const CACHE_SIZE: usize = 8;

#[derive(Clone, Copy)]
struct Entry {
    block: u64,
    dirty: bool,
    access: u64,
}

struct Cache {
    entries: Vec<Entry>,
    clock: u64,
    evicted_dirty: u64,
    /// With an undo file: filesystem blocks per undo block, and the undo
    /// blocks saved so far (see [`mke2fs_kbytes_written_undo`]).
    undo: Option<(u64, std::collections::BTreeSet<u64>)>,
}

impl Cache {
    fn new() -> Self {
        Self {
            entries: Vec::with_capacity(CACHE_SIZE),
            clock: 0,
            evicted_dirty: 0,
            undo: None,
        }
    }
    /// undo_io before a write of `n` blocks from `first`: the first write
    /// into an undo block reads its old content with the backing channel,
    /// a read of more than four blocks, which flushes the cache first.
    fn undo_touch(&mut self, first: u64, n: u64) {
        let Some((per, saved)) = self.undo.as_mut() else {
            return;
        };
        if n == 0 {
            return;
        }
        let mut new = false;
        for k in first / *per..=(first + n - 1) / *per {
            new |= saved.insert(k);
        }
        if new {
            self.flush();
        }
    }
    fn access(&mut self, block: u64, write: bool) {
        if write {
            self.undo_touch(block, 1);
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.block == block) {
            e.access = self.clock;
            e.dirty |= write;
            return;
        }
        let e = Entry {
            block,
            dirty: write,
            access: self.clock,
        };
        if self.entries.len() < CACHE_SIZE {
            self.entries.push(e);
            return;
        }
        let (idx, _) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.access)
            .unwrap_or((0, &self.entries[0]));
        if self.entries[idx].dirty {
            self.evicted_dirty += 1;
            if std::env::var_os("EXT4KIT_DEBUG_KBYTES").is_some() {
                eprintln!("evict {}", self.entries[idx].block);
            }
        }
        self.entries[idx] = e;
    }
    /// `flush_cached_blocks(FLUSH_INVALIDATE)`, which an odd-sized write
    /// (the MMP structure) does first: every dirty block is written and
    /// the cache emptied.
    fn flush_invalidate(&mut self) {
        self.evicted_dirty += self.entries.iter().filter(|e| e.dirty).count() as u64;
        self.entries.clear();
    }

    /// `flush_cached_blocks` (before a read of more than four blocks):
    /// every dirty block is written, and stays cached, clean.
    fn flush(&mut self) {
        for e in &mut self.entries {
            if e.dirty {
                self.evicted_dirty += 1;
                e.dirty = false;
            }
        }
    }
}

/// Reads of more than this many blocks bypass the cache (after a flush).
const READ_DIRECT_SIZE: u64 = 4;
/// `EXT2_INODE_SCAN_DEFAULT_BUFFER_BLOCKS`.
const SCAN_BUFFER_BLOCKS: u64 = 8;

/// The value mke2fs writes to `s_kbytes_written` for this layout.
pub fn mke2fs_kbytes_written(l: &Layout) -> u64 {
    kbytes_written(l, None)
}

/// [`mke2fs_kbytes_written`] for `mke2fs -z` (undo blocks of
/// `undo_block_size` bytes, a new undo file): undo_io's first write into
/// each undo block flushes the write cache (its read of the old content),
/// so dirty blocks go out earlier and some are written twice. The zeroing
/// before the cached writes (old superblock, device tail, inode tables)
/// and the journal's (after each extent insert) and the huge files' (each
/// data run before its extents) come in mke2fs's order.
pub fn mke2fs_kbytes_written_undo(
    l: &Layout,
    s: &super::SuperSettings,
    undo_block_size: u32,
) -> u64 {
    let bs = u64::from(l.block_size);
    kbytes_written(
        l,
        Some(UndoModel {
            per: (u64::from(undo_block_size) / bs).max(1),
            itables: !s.itable_zeroed,
            lazy_itable_init: s.lazy_itable_init,
            journal: !s.lazy_journal_init,
        }),
    )
}

#[derive(Clone, Copy)]
struct UndoModel {
    per: u64,
    itables: bool,
    lazy_itable_init: bool,
    journal: bool,
}

fn kbytes_written(l: &Layout, undo: Option<UndoModel>) -> u64 {
    let f = &l.features;
    let sets_one = f.incompat.contains(Incompat::FLEX_BG)
        || f.ro_compat.contains(RoCompat::HUGE_FILE)
        || f.ro_compat.contains(RoCompat::GDT_CSUM)
        || f.ro_compat.contains(RoCompat::DIR_NLINK)
        || f.ro_compat.contains(RoCompat::METADATA_CSUM)
        || f.ro_compat.contains(RoCompat::EXTRA_ISIZE);
    if !sets_one {
        return 0;
    }
    let bs = u64::from(l.block_size);
    if l.super_only {
        // mke2fs -S writes nothing through the cache before the close:
        // only zap_sector(2, 6).
        return 1 + (3072 >> 10) + (u64::from(l.desc_blocks) + 1) / (bs / 1024);
    }
    // Bytes written around the cache (besides the 4096 of zap_sector).
    let mut direct: u64 = 0;
    let isz = u64::from(l.inode_size);
    let iblk = |ino: u32| l.inode_block(ino);
    let mut c = Cache::new();
    if let Some(u) = undo {
        c.undo = Some((u.per, Default::default()));
        // zap_sector(2, 6) (at block 2: undo_io refuses 512-byte blocks)
        // and zap_sector(0, 2); the device's tail; the inode tables.
        c.undo_touch(0, 3);
        let rsv = (65536 / bs).max(1);
        let mut start = l.blocks_count & !(rsv - 1);
        if start > rsv {
            start -= rsv;
        }
        if start > 0 {
            c.undo_touch(start, l.blocks_count - start);
        }
        if u.itables {
            // write_inode_tables runs before any inode is made: with group
            // checksums each group's itable_unused is still
            // ext2fs_initialize's, which counts inodes 1..=s_first_ino
            // as used (the final one also counts lost+found, the orphan
            // file, huge files...).
            let ipg = u64::from(l.inodes_per_group);
            let csum = f.has_group_csum();
            for (g, gp) in l.groups.iter().enumerate() {
                let used = if csum {
                    u64::from(l.first_ino)
                        .saturating_sub(g as u64 * ipg)
                        .min(ipg)
                } else {
                    ipg
                };
                let n = if u.lazy_itable_init {
                    (used * isz).div_ceil(bs)
                } else {
                    u64::from(l.inode_blocks_per_group)
                };
                c.undo_touch(gp.inode_table, n);
            }
        }
    }
    let zero_journal_run = |c: &mut Cache, r: &super::geometry::Run| {
        if undo.is_some_and(|u| u.journal) {
            c.undo_touch(r.pblk, u64::from(r.len));
        }
    };
    let metadata = f.ro_compat.contains(RoCompat::METADATA_CSUM);
    // write_reserved_inodes
    if metadata {
        for ino in 1..l.first_ino {
            c.access(iblk(ino), true);
        }
    }
    // create_root_dir: write_new_inode, dir block, extent set (inode).
    let root = l.root.runs[0].pblk;
    c.access(iblk(2), true);
    c.access(root, true);
    c.access(iblk(2), true);
    // lost+found: mkdir then link into root.
    let lpf0 = l.lost_found.runs[0].pblk;
    let inline = f.incompat.contains(Incompat::INLINE_DATA);
    c.access(iblk(11), true);
    if !inline {
        c.access(lpf0, true);
    }
    c.access(iblk(11), true);
    c.access(root, false); // lookup
    c.access(root, false); // link: read
    c.access(root, true); // link: write
    c.access(iblk(2), true); // parent link count
    c.access(root, false); // create_lost_and_found's lookup
    // Inline: the first expansion converts the directory into its first
    // block (ext2fs_inline_data_expand).
    let first_expanded = if inline { 0 } else { 1 };
    for lb in first_expanded..l.lost_found.blocks() as u32 {
        if let Some(p) = l.lost_found.pblk(lb) {
            if inline && lb == 0 {
                c.access(iblk(11), true);
                c.access(p, true);
                c.access(iblk(11), true);
                continue;
            }
            c.access(p, true);
            c.access(iblk(11), true);
            c.access(iblk(11), true);
        }
    }
    // Bad blocks inode (ext2fs_update_bb_inode's block walk).
    match &l.bad_blocks {
        Some(bb) => {
            for &(b, w) in &bb.trace {
                c.access(b, w);
            }
        }
        None => c.access(iblk(1), true),
    }
    // Resize inode.
    if let Some(dind) = l.resize_dind {
        for k in 0..u64::from(l.reserved_gdt_blocks) {
            c.access(l.sb_block() + 1 + u64::from(l.desc_blocks) + k, true);
        }
        c.access(dind, true);
        c.access(iblk(7), true);
    }
    // Journal: extent inserts, leaf, inode, superblock.
    if let Some(j) = l.journal.as_ref().filter(|j| j.blockmap.is_some()) {
        // ext2fs_fallocate's slow path: ext2fs_bmap2(BMAP_ALLOC) per block;
        // every new block is zeroed through the cache, indirect blocks are
        // read and rewritten for each pointer they gain.
        for st in j.blockmap.iter().flat_map(|b| b.steps.iter()) {
            match *st {
                MapStep::Meta { block, parent } => {
                    c.access(block, true);
                    if let Some(d) = parent {
                        c.access(d, true);
                    }
                }
                MapStep::Data { block, ind, dind } => {
                    if let Some(d) = dind {
                        c.access(d, false);
                    }
                    if let Some(i) = ind {
                        c.access(i, false);
                    }
                    c.access(block, true);
                    if let Some(i) = ind {
                        c.access(i, true);
                    }
                    // ext2fs_bmap2 writes the inode after every allocation.
                    c.access(iblk(8), true);
                }
            }
        }
        c.access(iblk(8), true);
        c.access(iblk(8), true);
        if let Some(p) = j.pblk(0) {
            c.access(p, true);
        }
    } else if let Some(j) = &l.journal {
        for (k, run) in j.runs.iter().enumerate() {
            match j.leaf {
                Some(leaf) if k >= 4 => {
                    if k == 4 {
                        c.access(leaf, true);
                        c.access(iblk(8), true);
                    }
                    c.access(leaf, true);
                }
                _ => c.access(iblk(8), true),
            }
            // ext2fs_fallocate zeroes an extent after inserting it.
            zero_journal_run(&mut c, run);
        }
        c.access(iblk(8), true);
        if let Some(p) = j.pblk(0) {
            c.access(p, true);
        }
    }
    // MMP: the block zeroed through the cache, then the 1024-byte MMP
    // structure written around it, after a flush of the whole cache.
    if let Some(b) = l.mmp_block {
        c.access(b, true);
        c.flush_invalidate();
        direct += 1024;
    }
    // Quota files, then quota_write_inode's ext2fs_write_bitmaps (which
    // leaves the bitmaps clean: ext2fs_close writes them again only when
    // the orphan file dirtied them).
    let csum = f.has_group_csum();
    let write_bitmaps = |c: &mut Cache| {
        for gp in &l.groups {
            if !(csum && gp.flags & BG_BLOCK_UNINIT != 0) {
                c.access(gp.block_bitmap, true);
            }
            if !(csum && gp.flags & BG_INODE_UNINIT != 0) {
                c.access(gp.inode_bitmap, true);
            }
        }
    };
    let quota = f.ro_compat.contains(RoCompat::QUOTA);
    if quota {
        // quota_compute_usage: an inode scan of every initialized table,
        // in reads of up to 8 blocks. Inodes 1..=first_ino are all that
        // is in use then; with group checksums only their groups are
        // initialized, each read up to its itable_unused (which covers
        // just those inodes: group 0 alone, unless a group has fewer).
        let ipg = u64::from(l.inodes_per_group);
        let ipb = bs / isz;
        let (last_group, _) = l.inode_loc(l.first_ino);
        for (g, gp) in l.groups.iter().enumerate() {
            if csum && g as u32 > last_group {
                continue;
            }
            let mut left = if csum {
                let used = u64::from(l.first_ino)
                    .saturating_sub(g as u64 * ipg)
                    .min(ipg);
                (used + ipb - 1) * isz / bs
            } else {
                u64::from(l.inode_blocks_per_group)
            };
            let mut blk = gp.inode_table;
            if left > SCAN_BUFFER_BLOCKS {
                // Whole buffers: raw reads after a flush.
                c.flush();
                let full = left / SCAN_BUFFER_BLOCKS * SCAN_BUFFER_BLOCKS;
                blk += full;
                left -= full;
            }
            if left > READ_DIRECT_SIZE {
                c.flush();
            } else {
                for b in blk..blk + left {
                    c.access(b, false);
                }
            }
        }
        for q in &l.quota {
            for io in &q.trace {
                match *io {
                    Io::Inode { write } => c.access(iblk(q.ino), write),
                    Io::Block { pblk, write } => c.access(pblk, write),
                }
            }
        }
        write_bitmaps(&mut c);
    }
    // Orphan file.
    if let Some((ino, fm)) = l.orphan.as_ref().filter(|(_, f)| f.blockmap.is_some()) {
        // block_iterate3(BLOCK_FLAG_APPEND): an indirect block is written
        // as zeros, read back, filled, and written again at its end.
        c.access(iblk(*ino), true);
        let mut open_ind: Option<u64> = None;
        for st in fm.blockmap.iter().flat_map(|b| b.steps.iter()) {
            match *st {
                MapStep::Meta { block, .. } => {
                    if let Some(i) = open_ind.take() {
                        c.access(i, true);
                    }
                    c.access(block, true);
                    c.access(block, false);
                    open_ind = Some(block);
                }
                MapStep::Data { block, .. } => c.access(block, true),
            }
        }
        if let Some(i) = open_ind.take() {
            c.access(i, true);
        }
        c.access(iblk(*ino), true);
        c.access(iblk(*ino), true);
    } else if let Some((ino, fm)) = &l.orphan {
        c.access(iblk(*ino), true);
        for lb in 0..fm.blocks() as u32 {
            if let Some(p) = fm.pblk(lb) {
                c.access(p, true);
                // block_iterate3 maps each new block through the extent
                // tree, rewriting the inode every time.
                c.access(iblk(*ino), true);
            }
        }
        c.access(iblk(*ino), true);
    }
    // mk_hugefiles: its directory and inode writes, extent blocks and
    // directory scans, as the planner recorded them.
    // Under -z each zeroed data run is saved to the undo file first.
    if let Some(h) = &l.hugefiles {
        let mut zeroed = h.zeroed.iter().peekable();
        for (k, &(b, w)) in h.trace.iter().enumerate() {
            while let Some(&(_, first, n)) = zeroed.next_if(|z| z.0 <= k) {
                c.undo_touch(first, n);
            }
            c.access(b, w);
        }
        for &(_, first, n) in zeroed {
            c.undo_touch(first, n);
        }
    }
    // write_bitmaps at close.
    if !quota || l.orphan.is_some() || l.hugefiles.is_some() {
        write_bitmaps(&mut c);
    }
    // zap_sector(2, 6) and zap_sector(0, 2): 4096 bytes written directly.
    let bytes = 4096 + direct + c.evicted_dirty * bs;
    1 + (bytes >> 10) + (u64::from(l.desc_blocks) + 1) / (bs / 1024)
}
