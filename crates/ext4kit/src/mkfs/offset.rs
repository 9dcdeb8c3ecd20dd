//! `-E offset=N`: the filesystem starts N bytes into the target, as
//! mke2fs's Unix I/O channel with its `offset=` option. Every operation is
//! shifted by N; nothing before N is touched.

use ext4kit_device::{Device, DiscardOutcome, Result};

/// A device seen from byte `offset` on.
pub struct OffsetDevice<D: Device> {
    inner: D,
    offset: u64,
}

impl<D: Device> OffsetDevice<D> {
    pub fn new(inner: D, offset: u64) -> Self {
        Self { inner, offset }
    }
    fn at(&self, off: u64) -> u64 {
        off.saturating_add(self.offset)
    }
}

impl<D: Device> Device for OffsetDevice<D> {
    // is_known_zero: the default, over the shifted known_zero_ranges.
    ext4kit_device::forward_device!(inner; size, read_at, write_at, start_writeback, zeroout, discard, known_zero_ranges, is_known_zero);

    fn size(&self) -> u64 {
        self.inner.size().saturating_sub(self.offset)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<()> {
        self.inner.read_at(buf, self.at(off))
    }
    fn write_at(&self, buf: &[u8], off: u64) -> Result<()> {
        self.inner.write_at(buf, self.at(off))
    }
    fn start_writeback(&self, off: u64, len: u64) -> Result<()> {
        self.inner.start_writeback(self.at(off), len)
    }
    fn zeroout(&self, off: u64, len: u64) -> Result<()> {
        self.inner.zeroout(self.at(off), len)
    }
    fn discard(&self, off: u64, len: u64) -> Result<DiscardOutcome> {
        self.inner.discard(self.at(off), len)
    }
    fn known_zero_ranges(&self, off: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        Ok(self
            .inner
            .known_zero_ranges(self.at(off), len)?
            .into_iter()
            .filter_map(|(s, e)| {
                let s = s.max(self.offset) - self.offset;
                let e = e.saturating_sub(self.offset);
                (e > s).then_some((s, e))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;

    #[test]
    fn shifts_every_operation() {
        let mem = MemDevice::new(1 << 20);
        mem.write_at(&[0xAA; 4096], 0).unwrap();
        let d = OffsetDevice::new(&mem, 65536);
        assert_eq!(d.size(), (1 << 20) - 65536);
        d.write_at(&[1, 2, 3], 10).unwrap();
        let mut b = [0u8; 3];
        mem.read_at(&mut b, 65546).unwrap();
        assert_eq!(b, [1, 2, 3]);
        d.read_at(&mut b, 10).unwrap();
        assert_eq!(b, [1, 2, 3]);
        d.zeroout(10, 3).unwrap();
        mem.read_at(&mut b, 65546).unwrap();
        assert_eq!(b, [0, 0, 0]);
        for (s, e) in d.known_zero_ranges(0, 8192).unwrap() {
            assert!(s < e && e <= 8192);
        }
        assert_eq!(d.reports_allocation(), mem.reports_allocation());
        let mut first = [0u8; 1];
        mem.read_at(&mut first, 0).unwrap();
        assert_eq!(first, [0xAA], "nothing before the offset is touched");
    }
}
