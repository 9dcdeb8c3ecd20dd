//! The orphan file (`orphan_file` feature, mke2fs 1.47's default for new
//! ext4), as the kernel's `fs/ext4/orphan.c` keeps it.
//!
//! The file (inode `s_orphan_file_inum`, `i_size` a whole number of
//! blocks, every block mapped) is a set of slots: each block holds
//! `(block size - 8) / 4` little-endian inode numbers (0: free) and an
//! 8-byte tail, the magic [`ORPHAN_BLOCK_MAGIC`] and, with metadata_csum,
//! the CRC-32C of the slots seeded with the orphan inode's seed and the
//! block's physical number (`Csum::orphan_block`). It never grows: when
//! every slot is taken the old `s_last_orphan` list is used instead, as
//! the kernel falls back.
//!
//! [`OrphanFile::load`] checks every block (magic, checksum: the kernel's
//! `ext4_init_orphan_info` refuses a mount otherwise) and learns which
//! slots are taken; adding and removing an entry changes one block through
//! the operation's journal handle (checksum recomputed), so an inode is on
//! the orphan file in the same transaction as the change that needs it.
//! Callers serialize changes (the operations lock); `orphan_present` is
//! the operations layer's (`Filesystem::orphan_add`/`orphan_del`).

use std::collections::BTreeMap;
use std::sync::Mutex;

use ext4kit_format::orphan::{ORPHAN_BLOCK_MAGIC, ORPHAN_TAIL_SIZE};

use crate::FsError;
use crate::journal::Handle;
use crate::sb::Fs;

/// The orphan file of an open filesystem (see the module docs).
#[derive(Debug)]
pub struct OrphanFile {
    ino: u32,
    generation: u32,
    /// Physical block of each logical block.
    blocks: Vec<u64>,
    per_block: usize,
    state: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    /// Taken slot index -> inode number.
    taken: BTreeMap<usize, u32>,
    /// Free slots per block.
    free: Vec<usize>,
}

fn bad(detail: String) -> FsError {
    FsError::corrupt("orphan file", detail)
}

impl OrphanFile {
    /// Read and check the orphan file; `None` without the feature.
    pub fn load(fs: &Fs<'_>) -> Result<Option<OrphanFile>, FsError> {
        if !fs
            .info
            .features
            .compat
            .contains(ext4kit_format::features::Compat::ORPHAN_FILE)
        {
            return Ok(None);
        }
        let ino = fs.info.sb.s_orphan_file_inum.get();
        if ino == 0 || ino > fs.info.inodes_count {
            return Err(bad(format!("orphan file inode {ino} is out of range")));
        }
        let inode = fs.inode(ino)?;
        let bs = u64::from(fs.info.block_size);
        if !inode.size.is_multiple_of(bs) || inode.size / bs > 1 << 20 {
            return Err(bad(format!(
                "inode {ino}: size {} is not whole blocks",
                inode.size
            )));
        }
        let n = inode.size / bs;
        let maps = fs.file_map(&inode)?;
        let mut blocks = Vec::with_capacity(n as usize);
        for l in 0..n {
            let p = maps
                .iter()
                .find(|m| m.lblk <= l && l < m.end() && !m.unwritten)
                .map(|m| m.pblk + (l - m.lblk))
                .ok_or_else(|| bad(format!("inode {ino}: logical block {l} is not mapped")))?;
            blocks.push(p);
        }
        let per_block = (bs as usize - ORPHAN_TAIL_SIZE) / 4;
        let mut slots = Slots::default();
        for (i, &p) in blocks.iter().enumerate() {
            let b = fs.meta_block(p, "orphan file")?;
            let tail = b.len() - ORPHAN_TAIL_SIZE;
            let word = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
            if word(tail) != ORPHAN_BLOCK_MAGIC {
                return Err(bad(format!(
                    "inode {ino}: block {p} (orphan block {i}): bad magic"
                )));
            }
            if fs.info.csum.metadata
                && word(tail + 4)
                    != fs
                        .info
                        .csum
                        .orphan_block(ino, inode.generation, p, &b[..tail])
            {
                return Err(bad(format!(
                    "inode {ino}: block {p} (orphan block {i}): checksum does not match"
                )));
            }
            let mut free = 0;
            for j in 0..per_block {
                match word(4 * j) {
                    0 => free += 1,
                    o => {
                        slots.taken.insert(i * per_block + j, o);
                    }
                }
            }
            slots.free.push(free);
        }
        Ok(Some(OrphanFile {
            ino,
            generation: inode.generation,
            blocks,
            per_block,
            state: Mutex::new(slots),
        }))
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode numbers in the file, in slot order.
    pub fn entries(&self) -> Vec<u32> {
        self.slots().taken.values().copied().collect()
    }

    /// No slot is taken.
    pub fn is_empty(&self) -> bool {
        self.slots().taken.is_empty()
    }

    /// Is `ino` in the file?
    pub fn contains(&self, ino: u32) -> bool {
        self.slots().taken.values().any(|&i| i == ino)
    }

    /// Write slot `idx` (block `idx / per_block`) as `value` inside `h`.
    fn write_slot(
        &self,
        h: &mut Handle<'_>,
        idx: usize,
        value: u32,
        csum: &ext4kit_format::Csum,
    ) -> Result<(), FsError> {
        let blk = self.blocks[idx / self.per_block];
        let off = 4 * (idx % self.per_block);
        let (ino, generation) = (self.ino, self.generation);
        h.modify(blk, |b| {
            b[off..off + 4].copy_from_slice(&value.to_le_bytes());
            let tail = b.len() - ORPHAN_TAIL_SIZE;
            if csum.metadata {
                let c = csum.orphan_block(ino, generation, blk, &b[..tail]);
                b[tail + 4..tail + 8].copy_from_slice(&c.to_le_bytes());
            }
        })
    }

    /// Put `ino` in the first free slot (`ext4_orphan_file_add`) inside
    /// `h`; `false` when the file is full (use the orphan list) or `ino`
    /// is there already.
    pub fn add(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        csum: &ext4kit_format::Csum,
    ) -> Result<bool, FsError> {
        let mut s = self.slots();
        if s.taken.values().any(|&i| i == ino) {
            return Ok(true);
        }
        let Some(b) = s.free.iter().position(|&f| f > 0) else {
            return Ok(false);
        };
        let idx = (b * self.per_block..(b + 1) * self.per_block)
            .find(|i| !s.taken.contains_key(i))
            .ok_or_else(|| bad(format!("orphan block {b}: free count")))?;
        self.write_slot(h, idx, ino, csum)?;
        s.taken.insert(idx, ino);
        s.free[b] -= 1;
        Ok(true)
    }

    /// Clear `ino`'s slot inside `h` (`ext4_orphan_file_del`); `false`
    /// when it is not in the file.
    pub fn del(
        &self,
        h: &mut Handle<'_>,
        ino: u32,
        csum: &ext4kit_format::Csum,
    ) -> Result<bool, FsError> {
        let mut s = self.slots();
        let Some(idx) = s.taken.iter().find(|(_, i)| **i == ino).map(|(k, _)| *k) else {
            return Ok(false);
        };
        self.write_slot(h, idx, 0, csum)?;
        s.taken.remove(&idx);
        s.free[idx / self.per_block] += 1;
        Ok(true)
    }
}
