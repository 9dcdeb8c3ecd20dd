//! Two devices for one filesystem: the filesystem device and its external
//! journal device (`mke2fs -O journal_dev`, attached with `-J device=`).
//!
//! [`WithJournal`] joins them into one address space so that everything
//! above the device layer (recovery, the journal writer, checkpoints) keeps
//! working with one `&dyn Device`: bytes `0..fs.size()` are the filesystem
//! device, bytes `base..base + journal.size()` are the journal device
//! (`base` is the filesystem device's size rounded up to 1 MiB, a multiple
//! of every ext4 block size), and nothing lies between. The journal code
//! learns `base` from [`Device::journal_base`].
//!
//! **Flush ordering.** A [`Device::flush`] is a barrier for both devices:
//! it returns once every write completed on either device before the call
//! is durable. The journal device is flushed first, then the filesystem
//! device; a side with no write since its last flush is not flushed. That
//! is what the journal's ordering rules need (see ARCHITECTURE's crash
//! model): ordered data on the filesystem device and log blocks on the
//! journal device are durable before the commit block is written; home
//! writes of a checkpoint are durable before the journal superblock moves
//! the tail; the filesystem superblock's `needs_recovery` is durable before
//! the first commit block.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{Device, DeviceError, DiscardOutcome, IoHints, Result};

/// Alignment of the journal device's bytes in the joined address space.
const ALIGN: u64 = 1 << 20;

/// A filesystem device and its external journal device as one [`Device`]
/// (see the module docs).
pub struct WithJournal {
    fs: Arc<dyn Device>,
    journal: Arc<dyn Device>,
    base: u64,
    fs_dirty: AtomicBool,
    journal_dirty: AtomicBool,
}

/// One part of a request: on the filesystem device (`false`) or the
/// journal device (`true`), at `offset` there, `len` bytes, starting `skip`
/// bytes into the request.
struct Part {
    journal: bool,
    offset: u64,
    len: u64,
    skip: u64,
}

impl WithJournal {
    /// Join `fs` and its external journal device `journal`.
    pub fn new(fs: Arc<dyn Device>, journal: Arc<dyn Device>) -> WithJournal {
        let base = fs.size().div_ceil(ALIGN).saturating_mul(ALIGN);
        WithJournal {
            fs,
            journal,
            base,
            fs_dirty: AtomicBool::new(true),
            journal_dirty: AtomicBool::new(true),
        }
    }

    /// The filesystem device.
    pub fn fs_device(&self) -> &Arc<dyn Device> {
        &self.fs
    }

    /// The journal device.
    pub fn journal_device(&self) -> &Arc<dyn Device> {
        &self.journal
    }

    /// Split `[offset, offset+len)` into its parts on the two devices;
    /// anything outside both is out of range.
    fn split(&self, offset: u64, len: u64) -> Result<Vec<Part>> {
        let end = offset.checked_add(len).ok_or(DeviceError::OutOfRange {
            offset,
            len,
            size: self.size(),
        })?;
        let out_of_range = || DeviceError::OutOfRange {
            offset,
            len,
            size: self.size(),
        };
        let mut parts = Vec::with_capacity(1);
        if offset < self.base {
            let e = end.min(self.base);
            if e > self.fs.size() {
                return Err(out_of_range());
            }
            if e > offset {
                parts.push(Part {
                    journal: false,
                    offset,
                    len: e - offset,
                    skip: 0,
                });
            }
        }
        if end > self.base {
            let s = offset.max(self.base);
            if end - self.base > self.journal.size() {
                return Err(out_of_range());
            }
            parts.push(Part {
                journal: true,
                offset: s - self.base,
                len: end - s,
                skip: s - offset,
            });
        }
        Ok(parts)
    }

    fn side(&self, journal: bool) -> &dyn Device {
        if journal { &*self.journal } else { &*self.fs }
    }

    fn dirty(&self, journal: bool) {
        let flag = if journal {
            &self.journal_dirty
        } else {
            &self.fs_dirty
        };
        flag.store(true, Ordering::SeqCst);
    }
}

impl Device for WithJournal {
    fn size(&self) -> u64 {
        self.base.saturating_add(self.journal.size())
    }

    fn logical_block_size(&self) -> u32 {
        self.fs
            .logical_block_size()
            .max(self.journal.logical_block_size())
    }

    fn physical_block_size(&self) -> u32 {
        self.fs
            .physical_block_size()
            .max(self.journal.physical_block_size())
    }

    fn io_hints(&self) -> Option<IoHints> {
        self.fs.io_hints()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        for p in self.split(offset, buf.len() as u64)? {
            let b = &mut buf[p.skip as usize..(p.skip + p.len) as usize];
            self.side(p.journal).read_at(b, p.offset)?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        for p in self.split(offset, buf.len() as u64)? {
            let b = &buf[p.skip as usize..(p.skip + p.len) as usize];
            self.side(p.journal).write_at(b, p.offset)?;
            self.dirty(p.journal);
        }
        Ok(())
    }

    /// The journal device first, then the filesystem device (each only
    /// when written since its last flush).
    fn flush(&self) -> Result<()> {
        if self.journal_dirty.swap(false, Ordering::SeqCst)
            && let Err(e) = self.journal.flush()
        {
            self.journal_dirty.store(true, Ordering::SeqCst);
            return Err(e);
        }
        if self.fs_dirty.swap(false, Ordering::SeqCst)
            && let Err(e) = self.fs.flush()
        {
            self.fs_dirty.store(true, Ordering::SeqCst);
            return Err(e);
        }
        Ok(())
    }

    fn start_writeback(&self, offset: u64, len: u64) -> Result<()> {
        for p in self.split(offset, len)? {
            self.side(p.journal).start_writeback(p.offset, p.len)?;
        }
        Ok(())
    }

    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        for p in self.split(offset, len)? {
            self.side(p.journal).zeroout(p.offset, p.len)?;
            self.dirty(p.journal);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        let mut outcome = None;
        for p in self.split(offset, len)? {
            let o = self.side(p.journal).discard(p.offset, p.len)?;
            self.dirty(p.journal);
            // The weakest outcome of the parts.
            outcome = Some(match (outcome, o) {
                (None, o) => o,
                (Some(DiscardOutcome::Zeroed), o) => o,
                (Some(prev), _) => prev,
            });
        }
        Ok(outcome.unwrap_or(DiscardOutcome::Zeroed))
    }

    fn discard_zeroes_data(&self) -> bool {
        self.fs.discard_zeroes_data() && self.journal.discard_zeroes_data()
    }

    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        for p in self.split(offset, len)? {
            let shift = if p.journal { self.base } else { 0 };
            for (s, e) in self.side(p.journal).known_zero_ranges(p.offset, p.len)? {
                crate::ranges::push_merge(&mut out, s + shift, e + shift);
            }
        }
        Ok(out)
    }

    fn reports_allocation(&self) -> bool {
        self.fs.reports_allocation() && self.journal.reports_allocation()
    }

    /// The filesystem device's (what the tools' "allocated" reports are
    /// about; the journal device's storage is its own).
    fn allocated_bytes(&self) -> Option<u64> {
        self.fs.allocated_bytes()
    }

    fn is_rotational(&self) -> Option<bool> {
        self.fs.is_rotational()
    }

    fn name(&self) -> String {
        self.fs.name()
    }

    fn journal_base(&self) -> Option<u64> {
        Some(self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDevice;

    fn pair() -> (Arc<MemDevice>, Arc<MemDevice>, WithJournal) {
        let fs = Arc::new(MemDevice::new(3 * 4096));
        let j = Arc::new(MemDevice::new(2 * 4096));
        let w = WithJournal::new(fs.clone(), j.clone());
        (fs, j, w)
    }

    #[test]
    fn the_journal_device_starts_at_the_aligned_base() {
        let (fs, j, w) = pair();
        assert_eq!(w.journal_base(), Some(ALIGN));
        assert_eq!(w.size(), ALIGN + 2 * 4096);
        w.write_at(&[1; 10], 4096).unwrap();
        w.write_at(&[2; 10], ALIGN + 4096).unwrap();
        let mut b = [0u8; 10];
        fs.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [1; 10]);
        j.read_at(&mut b, 4096).unwrap();
        assert_eq!(b, [2; 10]);
        w.read_at(&mut b, ALIGN + 4096).unwrap();
        assert_eq!(b, [2; 10]);
    }

    #[test]
    fn the_gap_and_the_ends_are_out_of_range() {
        let (_fs, _j, w) = pair();
        let mut b = [0u8; 4096];
        assert!(w.read_at(&mut b, 3 * 4096).is_err());
        assert!(w.read_at(&mut b, 2 * 4096 + 1).is_err());
        assert!(w.read_at(&mut b, ALIGN + 2 * 4096 - 1).is_err());
        assert!(w.write_at(&b, ALIGN - 4096).is_err());
        assert!(w.read_at(&mut b, u64::MAX - 10).is_err());
    }

    /// A memory device that logs its flushes into a shared list.
    struct Logged {
        inner: MemDevice,
        tag: &'static str,
        log: Arc<std::sync::Mutex<Vec<&'static str>>>,
    }

    impl Device for Logged {
        crate::forward_device!(inner; flush);
        fn flush(&self) -> Result<()> {
            self.log.lock().unwrap().push(self.tag);
            self.inner.flush()
        }
    }

    #[test]
    fn a_flush_flushes_the_journal_device_first_and_skips_a_clean_side() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let dev = |tag| {
            Arc::new(Logged {
                inner: MemDevice::new(1 << 20),
                tag,
                log: log.clone(),
            })
        };
        let w = WithJournal::new(dev("fs"), dev("journal"));
        w.flush().unwrap();
        assert_eq!(*log.lock().unwrap(), ["journal", "fs"]);
        log.lock().unwrap().clear();
        w.flush().unwrap();
        assert!(log.lock().unwrap().is_empty(), "nothing written since");
        w.write_at(&[1; 512], 0).unwrap();
        w.flush().unwrap();
        assert_eq!(*log.lock().unwrap(), ["fs"]);
        log.lock().unwrap().clear();
        w.write_at(&[1; 512], ALIGN).unwrap();
        w.write_at(&[1; 512], 4096).unwrap();
        w.flush().unwrap();
        assert_eq!(*log.lock().unwrap(), ["journal", "fs"]);
        log.lock().unwrap().clear();
        w.discard(ALIGN, 4096).unwrap();
        w.flush().unwrap();
        assert_eq!(*log.lock().unwrap(), ["journal"]);
    }

    #[test]
    fn known_zero_ranges_are_in_joined_offsets() {
        let (_fs, _j, w) = pair();
        w.write_at(&[1; 4096], ALIGN).unwrap();
        let r = w.known_zero_ranges(ALIGN, 2 * 4096).unwrap();
        assert!(r.iter().all(|&(s, _)| s >= ALIGN + 4096), "{r:?}");
    }
}
