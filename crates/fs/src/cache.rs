//! The block cache: every metadata read and write of a read-write
//! filesystem goes through it.
//!
//! Per block it keeps up to four images, newest first:
//! - **running**: the copy the running transaction's handles change (one
//!   per block, behind its own lock so that handles on other blocks never
//!   wait for it);
//! - **committing**: the copy frozen when its transaction began to commit
//!   (what the log gets; handles of the next transaction make a new
//!   running copy from it);
//! - **committed**: the last image whose commit is durable, not yet
//!   written home (what the checkpoint writes home);
//! - **clean**: the same bytes as the device holds.
//!
//! [`BlockRead`] returns the newest image, so metadata code sees its own
//! transaction's changes. Nothing here writes a metadata block home: the
//! journal's checkpoint does, from the committed images only. Clean
//! images are evicted (oldest use first) when there are more than the
//! cache's limit; images a transaction or checkpoint still needs never are.
//!
//! Locking: one mutex over the map (held for device reads of missing
//! blocks, so a concurrent checkpoint can never leave a stale clean copy
//! behind), then per-block mutexes for running copies. The journal takes
//! its own state lock before this one, never the other way round.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ext4kit_device::Device;

use crate::{BlockRead, FsError};

/// A running copy: the block a handle modifies.
pub type RunningCopy = Arc<Mutex<Vec<u8>>>;

#[derive(Default)]
struct Slot {
    running: Option<RunningCopy>,
    committing: Option<Arc<[u8]>>,
    committed: Option<(u32, Arc<[u8]>)>,
    clean: Option<Arc<[u8]>>,
    last_use: u64,
}

impl Slot {
    fn only_clean(&self) -> bool {
        self.running.is_none() && self.committing.is_none() && self.committed.is_none()
    }
    fn empty(&self) -> bool {
        self.only_clean() && self.clean.is_none()
    }
}

#[derive(Default)]
struct Inner {
    map: HashMap<u64, Slot>,
    clock: u64,
    clean_count: usize,
    stats: CacheStats,
}

/// Counters, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Reads answered from memory.
    pub hits: u64,
    /// Reads that went to the device.
    pub misses: u64,
    /// Clean images dropped to stay under the limit.
    pub evictions: u64,
}

/// See the module documentation.
pub struct BlockCache {
    dev: Arc<dyn Device>,
    block_size: u32,
    block_count: u64,
    clean_limit: usize,
    inner: Mutex<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent before anything
    // that could panic, so a poisoned lock still holds valid state.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Default number of clean blocks kept (at 4 KiB: 32 MiB).
pub const DEFAULT_CLEAN_LIMIT: usize = 8192;

impl BlockCache {
    /// A cache over `dev` for a filesystem of `block_count` blocks of
    /// `block_size` bytes, keeping at most `clean_limit` clean images.
    pub fn new(
        dev: Arc<dyn Device>,
        block_size: u32,
        block_count: u64,
        clean_limit: usize,
    ) -> Self {
        BlockCache {
            dev,
            block_size,
            block_count,
            clean_limit: clean_limit.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The device underneath.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        lock(&self.inner).stats
    }

    /// Number of blocks holding any image (for the memory-bound tests).
    pub fn resident(&self) -> usize {
        lock(&self.inner).map.len()
    }

    fn check(&self, blk: u64) -> Result<(), FsError> {
        if blk >= self.block_count {
            return Err(FsError::BlockOutOfRange {
                block: blk,
                count: self.block_count,
            });
        }
        Ok(())
    }

    /// The newest image below the running copy, reading the device (and
    /// keeping a clean copy) when the cache has none.
    fn base_image(&self, inner: &mut Inner, blk: u64) -> Result<Arc<[u8]>, FsError> {
        inner.clock += 1;
        let now = inner.clock;
        if let Some(slot) = inner.map.get_mut(&blk) {
            slot.last_use = now;
            let img = slot
                .committing
                .clone()
                .or_else(|| slot.committed.as_ref().map(|(_, d)| d.clone()))
                .or_else(|| slot.clean.clone());
            if let Some(img) = img {
                inner.stats.hits += 1;
                return Ok(img);
            }
        }
        inner.stats.misses += 1;
        let mut buf = vec![0u8; self.block_size as usize];
        self.dev
            .read_at(&mut buf, blk * u64::from(self.block_size))?;
        let img: Arc<[u8]> = buf.into();
        let slot = inner.map.entry(blk).or_default();
        slot.last_use = now;
        if slot.clean.is_none() {
            inner.clean_count += 1;
        }
        slot.clean = Some(img.clone());
        self.evict(inner);
        Ok(img)
    }

    /// Drop the least recently used clean-only slots when over the limit
    /// (half of them at a time, so the sweep is amortized).
    fn evict(&self, inner: &mut Inner) {
        if inner.clean_count <= self.clean_limit {
            return;
        }
        let mut cands: Vec<(u64, u64)> = inner
            .map
            .iter()
            .filter(|(_, s)| s.only_clean() && s.clean.is_some())
            .map(|(&b, s)| (s.last_use, b))
            .collect();
        let drop_n = cands.len().saturating_sub(self.clean_limit / 2);
        if drop_n == 0 {
            return;
        }
        cands.select_nth_unstable(drop_n - 1);
        for &(_, b) in &cands[..drop_n] {
            inner.map.remove(&b);
        }
        inner.clean_count -= drop_n;
        inner.stats.evictions += drop_n as u64;
    }

    /// Install a running copy. A clean image is dropped: a slot keeps a
    /// clean image only while it has nothing newer, so every counted
    /// clean image is evictable and eviction always makes progress.
    fn set_running(&self, inner: &mut Inner, blk: u64, copy: RunningCopy) {
        let slot = inner.map.entry(blk).or_default();
        slot.running = Some(copy);
        if slot.clean.take().is_some() {
            inner.clean_count -= 1;
        }
    }

    /// The running copy of `blk`, made from the newest image if the
    /// running transaction has none yet. Returns it and whether it was
    /// new (the caller's transaction then counts the block).
    pub fn running_copy(&self, blk: u64) -> Result<(RunningCopy, bool), FsError> {
        self.check(blk)?;
        let mut inner = lock(&self.inner);
        if let Some(r) = inner.map.get(&blk).and_then(|s| s.running.clone()) {
            return Ok((r, false));
        }
        let base = self.base_image(&mut inner, blk)?;
        let copy: RunningCopy = Arc::new(Mutex::new(base.to_vec()));
        self.set_running(&mut inner, blk, copy.clone());
        Ok((copy, true))
    }

    /// Running copy of a block whose old content does not matter (a newly
    /// allocated metadata block): starts as zeros, no device read.
    pub fn running_zeroed(&self, blk: u64) -> Result<(RunningCopy, bool), FsError> {
        self.check(blk)?;
        let mut inner = lock(&self.inner);
        if let Some(r) = inner.map.get(&blk).and_then(|s| s.running.clone()) {
            return Ok((r, false));
        }
        let copy: RunningCopy = Arc::new(Mutex::new(vec![0u8; self.block_size as usize]));
        self.set_running(&mut inner, blk, copy.clone());
        Ok((copy, true))
    }

    /// Commit step "freeze": the running copies of `blocks` become their
    /// committing copies (no handle may be open). Returns the frozen
    /// images in the order given.
    pub fn freeze(&self, blocks: &[u64]) -> Vec<(u64, Arc<[u8]>)> {
        let mut inner = lock(&self.inner);
        let mut out = Vec::with_capacity(blocks.len());
        for &b in blocks {
            let Some(slot) = inner.map.get_mut(&b) else {
                continue;
            };
            let Some(r) = slot.running.take() else {
                continue;
            };
            let img: Arc<[u8]> = match Arc::try_unwrap(r) {
                Ok(m) => m
                    .into_inner()
                    .unwrap_or_else(PoisonError::into_inner)
                    .into(),
                Err(shared) => lock(&shared).clone().into(),
            };
            slot.committing = Some(img.clone());
            out.push((b, img));
        }
        out
    }

    /// The commit of `tid` is durable: its committing copies become the
    /// committed images (the checkpoint will write them home).
    pub fn committed(&self, tid: u32, blocks: &[u64]) {
        let mut inner = lock(&self.inner);
        for &b in blocks {
            if let Some(slot) = inner.map.get_mut(&b)
                && let Some(img) = slot.committing.take()
            {
                slot.committed = Some((tid, img));
            }
        }
    }

    /// Drop the running copy of `blk` (its change is withdrawn from the
    /// running transaction: the block was freed and revoked in it).
    pub fn drop_running(&self, blk: u64) {
        let mut inner = lock(&self.inner);
        let mut remove = false;
        if let Some(slot) = inner.map.get_mut(&blk) {
            slot.running = None;
            remove = slot.empty();
        }
        if remove {
            inner.map.remove(&blk);
        }
    }

    /// Forget every image of `blk` except a running copy (a block freed
    /// and revoked by a durable transaction: its old committed image must
    /// never be written home over whatever the block holds next).
    pub fn forget(&self, blk: u64) {
        let mut inner = lock(&self.inner);
        let mut remove = false;
        let mut had_clean = false;
        if let Some(slot) = inner.map.get_mut(&blk) {
            slot.committing = None;
            slot.committed = None;
            had_clean = slot.clean.take().is_some();
            remove = slot.empty();
        }
        if had_clean {
            inner.clean_count -= 1;
        }
        if remove {
            inner.map.remove(&blk);
        }
    }

    /// The block was written on the device outside the journal (ordered
    /// data): drop a clean copy so reads see the device.
    pub fn invalidate_clean(&self, blk: u64) {
        let mut inner = lock(&self.inner);
        let mut remove = false;
        let mut had_clean = false;
        if let Some(slot) = inner.map.get_mut(&blk) {
            had_clean = slot.clean.take().is_some();
            remove = slot.empty();
        }
        if had_clean {
            inner.clean_count -= 1;
        }
        if remove {
            inner.map.remove(&blk);
        }
    }

    /// Every committed image not yet written home, by block number.
    pub fn checkpoint_list(&self) -> Vec<(u64, u32, Arc<[u8]>)> {
        let inner = lock(&self.inner);
        let mut v: Vec<(u64, u32, Arc<[u8]>)> = inner
            .map
            .iter()
            .filter_map(|(&b, s)| s.committed.as_ref().map(|(t, d)| (b, *t, d.clone())))
            .collect();
        v.sort_unstable_by_key(|e| e.0);
        v
    }

    /// The images of `list` are home and flushed: they become clean
    /// (unless a newer commit replaced them meanwhile).
    pub fn checkpointed(&self, list: &[(u64, u32, Arc<[u8]>)]) {
        let mut inner = lock(&self.inner);
        let mut new_clean = 0;
        for (b, _, img) in list {
            if let Some(slot) = inner.map.get_mut(b)
                && slot
                    .committed
                    .as_ref()
                    .is_some_and(|(_, d)| Arc::ptr_eq(d, img))
            {
                slot.committed = None;
                // Clean only if nothing newer exists (see `set_running`).
                if slot.running.is_none()
                    && slot.committing.is_none()
                    && slot.clean.replace(img.clone()).is_none()
                {
                    new_clean += 1;
                }
            }
        }
        inner.clean_count += new_clean;
        self.evict(&mut inner);
    }

    /// Number of blocks with a committed, not yet checkpointed image.
    pub fn dirty_count(&self) -> usize {
        lock(&self.inner)
            .map
            .values()
            .filter(|s| s.committed.is_some())
            .count()
    }
}

impl BlockRead for BlockCache {
    fn block_size(&self) -> u32 {
        self.block_size
    }

    /// A run of blocks the cache holds no image of is read from the
    /// device in one request and *not* kept (a scan, e.g. the descriptor
    /// table at open, must not fill the cache); otherwise block by block.
    fn read_blocks(&self, start: u64, buf: &mut [u8]) -> Result<(), FsError> {
        let bs = u64::from(self.block_size);
        let n = buf.len() as u64 / bs;
        crate::run_in_range(start, n, self.block_count)?;
        {
            let mut inner = lock(&self.inner);
            if (start..start + n).all(|b| !inner.map.contains_key(&b)) {
                // Under the map lock, as base_image's reads: no
                // checkpoint can write one of these blocks meanwhile.
                inner.stats.misses += n;
                self.dev.read_at(buf, start * bs)?;
                return Ok(());
            }
        }
        for (i, chunk) in buf.chunks_mut(bs as usize).enumerate() {
            self.read_block(start + i as u64, chunk)?;
        }
        Ok(())
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn read_block(&self, blk: u64, buf: &mut [u8]) -> Result<(), FsError> {
        self.check(blk)?;
        let running = {
            let mut inner = lock(&self.inner);
            match inner.map.get(&blk).and_then(|s| s.running.clone()) {
                Some(r) => {
                    inner.stats.hits += 1;
                    Some(r)
                }
                None => {
                    let img = self.base_image(&mut inner, blk)?;
                    let n = buf.len().min(img.len());
                    buf[..n].copy_from_slice(&img[..n]);
                    None
                }
            }
        };
        if let Some(r) = running {
            // Outside the map lock: a handle may be changing it right now.
            let data = lock(&r);
            let n = buf.len().min(data.len());
            buf[..n].copy_from_slice(&data[..n]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;

    fn cache(limit: usize) -> (Arc<MemDevice>, BlockCache) {
        let mem = Arc::new(MemDevice::new(64 * 1024));
        for b in 0..64u8 {
            mem.write_at(&[b; 1024], u64::from(b) * 1024).unwrap();
        }
        let dev: Arc<dyn Device> = mem.clone();
        (mem, BlockCache::new(dev, 1024, 64, limit))
    }

    #[test]
    fn newest_image_wins_and_nothing_goes_home() {
        let (mem, c) = cache(16);
        assert_eq!(c.block(5).unwrap()[0], 5);
        let (r, new) = c.running_copy(5).unwrap();
        assert!(new);
        lock(&r)[0] = 0xAA;
        assert!(!c.running_copy(5).unwrap().1);
        assert_eq!(c.block(5).unwrap()[0], 0xAA);
        let frozen = c.freeze(&[5]);
        assert_eq!(frozen[0].1[0], 0xAA);
        // Next transaction builds on the frozen copy.
        let (r2, new) = c.running_copy(5).unwrap();
        assert!(new);
        assert_eq!(lock(&r2)[0], 0xAA);
        lock(&r2)[1] = 0xBB;
        c.committed(1, &[5]);
        let list = c.checkpoint_list();
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].2[0], list[0].2[1]), (0xAA, 5));
        // The device still has the old block: only checkpoints write home.
        assert_eq!(mem.to_bytes()[5 * 1024], 5);
        c.checkpointed(&list);
        assert_eq!(c.dirty_count(), 0);
        assert_eq!(&c.block(5).unwrap()[..2], &[0xAA, 0xBB]);
        assert!(c.block(64).is_err());
    }

    #[test]
    fn forget_drops_committed_images() {
        let (_mem, c) = cache(16);
        let (r, _) = c.running_copy(7).unwrap();
        lock(&r)[0] = 1;
        c.freeze(&[7]);
        c.committed(3, &[7]);
        c.forget(7);
        assert!(c.checkpoint_list().is_empty());
        assert_eq!(c.block(7).unwrap()[0], 7);
    }

    #[test]
    fn clean_images_are_evicted_dirty_ones_never() {
        let (_mem, c) = cache(8);
        let (r, _) = c.running_copy(0).unwrap();
        lock(&r)[0] = 0xEE;
        for b in 1..64 {
            assert_eq!(c.block(b).unwrap()[0], b as u8);
        }
        assert!(c.resident() <= 10, "{}", c.resident());
        assert!(c.stats().evictions > 0);
        assert_eq!(c.block(0).unwrap()[0], 0xEE);
    }

    #[test]
    fn eviction_progresses_with_many_dirty_blocks() {
        let (_mem, c) = cache(8);
        for b in 0..20 {
            c.block(b).unwrap();
            c.running_copy(b).unwrap();
        }
        for b in 20..64 {
            c.block(b).unwrap();
        }
        assert!(c.resident() <= 20 + 9, "{}", c.resident());
        let frozen: Vec<u64> = (0..20).collect();
        c.freeze(&frozen);
        c.committed(1, &frozen);
        let list = c.checkpoint_list();
        c.checkpointed(&list);
        assert!(c.resident() <= 9, "{}", c.resident());
        assert_eq!(c.block(3).unwrap()[0], 3);
    }

    #[test]
    fn concurrent_readers_and_writers() {
        let (_mem, c) = cache(8);
        let c = Arc::new(c);
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let c = c.clone();
            threads.push(std::thread::spawn(move || {
                for i in 0..200u64 {
                    let b = (t * 16 + i) % 64;
                    if t % 2 == 0 {
                        let (r, _) = c.running_copy(b).unwrap();
                        let mut g = lock(&r);
                        g[1] = g[1].wrapping_add(1);
                    } else {
                        c.block(b).unwrap();
                    }
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        let sum: u32 = (0..64).map(|b| u32::from(c.block(b).unwrap()[1])).sum();
        let base: u32 = (0..64).sum();
        assert_eq!(sum, base + 400);
    }
}
