//! ext4kit's read-write ext4 engine.
//!
//! Layers (see `docs/ARCHITECTURE.md`, "Read-write engine"):
//! - [`journal`]: jbd2 recovery ([`journal::recover`](mod@journal::recover)) and, above it, the
//!   transaction/commit/checkpoint writer ([`journal::JournalWriter`]);
//! - [`cache::BlockCache`], that every metadata read and write goes
//!   through; [`rw::RwFs`] opens and closes a filesystem around both;
//! - allocators, inodes, extents, directories, xattrs: code that reads
//!   blocks through [`BlockRead`] and changes them only inside a
//!   transaction handle.
//!
//! [`BlockRead`] is the one seam between the metadata code and where blocks
//! come from: the device itself ([`DeviceBlocks`]), the device with a
//! journal replayed in memory (read-only opens of a dirty filesystem), or
//! the block cache of a running transaction.

pub mod balloc;
pub mod blockmap;
pub mod cache;
pub mod dir;
pub mod dir_write;
pub mod discard;
pub mod error;
pub mod extent;
pub mod extent_write;
pub mod file;
pub mod fs;
pub mod groups;
pub mod ialloc;
pub mod inode;
pub mod journal;
pub mod mmp;
pub mod orphan_file;
pub mod path;
pub mod rw;
pub mod sb;
pub mod statfs;
pub mod xattr;
pub mod xattr_write;

#[cfg(test)]
mod hdd_tests;
#[cfg(test)]
mod scale_tests;

use std::collections::HashMap;

use ext4kit_device::Device;

pub use error::FsError;

/// Reads filesystem blocks by number. Implementations must be usable from
/// several threads at once.
pub trait BlockRead: Send + Sync {
    /// The filesystem block size in bytes.
    fn block_size(&self) -> u32;

    /// Number of blocks in the filesystem (reads at or past it fail).
    fn block_count(&self) -> u64;

    /// Read block `blk` into `buf` (`buf.len() == block_size()`).
    fn read_block(&self, blk: u64, buf: &mut [u8]) -> Result<(), FsError>;

    /// Read block `blk` into a new buffer.
    fn block(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; self.block_size() as usize];
        self.read_block(blk, &mut buf)?;
        Ok(buf)
    }

    /// Read `buf.len() / block_size()` consecutive blocks from `start`
    /// into `buf`. Sources that can override this with one large read
    /// (a run of blocks nobody holds a newer image of); the default reads
    /// block by block.
    fn read_blocks(&self, start: u64, buf: &mut [u8]) -> Result<(), FsError> {
        let bs = self.block_size() as usize;
        for (i, chunk) in buf.chunks_mut(bs).enumerate() {
            self.read_block(start + i as u64, chunk)?;
        }
        Ok(())
    }
}

/// Check that `n` blocks from `start` lie below `count`.
pub(crate) fn run_in_range(start: u64, n: u64, count: u64) -> Result<(), FsError> {
    if start.checked_add(n).is_none_or(|e| e > count) {
        return Err(FsError::BlockOutOfRange {
            block: start.saturating_add(n).saturating_sub(1).max(start),
            count,
        });
    }
    Ok(())
}

/// Blocks straight from a device, optionally with an overlay of block
/// images that take precedence (the home writes of a journal replayed in
/// memory, for read-only opens that must not write).
pub struct DeviceBlocks<'d> {
    dev: &'d dyn Device,
    block_size: u32,
    block_count: u64,
    overlay: HashMap<u64, Vec<u8>>,
}

impl<'d> DeviceBlocks<'d> {
    /// `block_count` is the filesystem's (`s_blocks_count`), checked
    /// against the device size by the caller.
    pub fn new(dev: &'d dyn Device, block_size: u32, block_count: u64) -> Self {
        DeviceBlocks {
            dev,
            block_size,
            block_count,
            overlay: HashMap::new(),
        }
    }

    /// Make `blk` read as `data` (one block) without touching the device.
    pub fn overlay(&mut self, blk: u64, data: Vec<u8>) {
        self.overlay.insert(blk, data);
    }

    /// The device underneath.
    pub fn device(&self) -> &'d dyn Device {
        self.dev
    }
}

impl BlockRead for DeviceBlocks<'_> {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read_block(&self, blk: u64, buf: &mut [u8]) -> Result<(), FsError> {
        if blk >= self.block_count {
            return Err(FsError::BlockOutOfRange {
                block: blk,
                count: self.block_count,
            });
        }
        if let Some(data) = self.overlay.get(&blk) {
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data[..n]);
            return Ok(());
        }
        self.dev.read_at(buf, blk * u64::from(self.block_size))?;
        Ok(())
    }

    fn read_blocks(&self, start: u64, buf: &mut [u8]) -> Result<(), FsError> {
        let bs = u64::from(self.block_size);
        let n = buf.len() as u64 / bs;
        run_in_range(start, n, self.block_count)?;
        if self.overlay.keys().any(|&b| b >= start && b < start + n) {
            let bs = bs as usize;
            for (i, chunk) in buf.chunks_mut(bs).enumerate() {
                self.read_block(start + i as u64, chunk)?;
            }
            return Ok(());
        }
        self.dev.read_at(buf, start * bs)?;
        Ok(())
    }
}
