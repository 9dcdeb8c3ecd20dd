//! [`MemDevice`]: a sparse in-memory device for tests.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::ranges::push_merge;
use crate::{Device, DiscardOutcome, Result, check_range};

/// Allocation unit of a [`MemDevice`].
const CHUNK: usize = 4096;
const CHUNK64: u64 = CHUNK as u64;

type Chunk = Box<[u8; CHUNK]>;

/// A sparse in-memory device.
///
/// Storage is a map of 4 KiB chunks; absent chunks read as zeros and are
/// reported by [`Device::known_zero_ranges`], so a 1 TiB device costs only
/// what is written to it. Chunks that become all zeros (by writes of zeros,
/// `zeroout` or `discard`) are freed, and writing zeros to an absent chunk
/// allocates nothing. Like a hole-punching file, `discard` zeroes.
///
/// To keep access to a `MemDevice` after handing it out (e.g. inside a
/// [`crate::FaultDevice`] or as a `Box<dyn Device>`), wrap it in an `Arc`:
/// `Arc<MemDevice>` is a [`Device`] too.
pub struct MemDevice {
    size: u64,
    chunks: Mutex<BTreeMap<u64, Chunk>>,
}

impl fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemDevice")
            .field("size", &self.size)
            .field("allocated_chunks", &self.lock().len())
            .finish()
    }
}

impl MemDevice {
    /// A device of `size` bytes, all zeros, nothing allocated.
    pub fn new(size: u64) -> Self {
        MemDevice {
            size,
            chunks: Mutex::new(BTreeMap::new()),
        }
    }

    /// A device holding `bytes` (its size is `bytes.len()`).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        let mut map = BTreeMap::new();
        for (i, piece) in bytes.chunks(CHUNK).enumerate() {
            if piece.iter().any(|&b| b != 0) {
                let mut c: Chunk = Box::new([0u8; CHUNK]);
                c[..piece.len()].copy_from_slice(piece);
                map.insert(i as u64, c);
            }
        }
        MemDevice {
            size: bytes.len() as u64,
            chunks: Mutex::new(map),
        }
    }

    /// The whole content as a vector. Meant for small devices: it allocates
    /// `size` bytes.
    ///
    /// # Panics
    /// If the size does not fit in memory (`usize`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = usize::try_from(self.size).expect("MemDevice::to_bytes: device too large");
        let mut v = vec![0u8; len];
        let map = self.lock();
        for (&idx, chunk) in map.iter() {
            let start = idx as usize * CHUNK;
            let n = CHUNK.min(len - start);
            v[start..start + n].copy_from_slice(&chunk[..n]);
        }
        v
    }

    /// An independent copy of the current content.
    pub fn snapshot(&self) -> MemDevice {
        MemDevice {
            size: self.size,
            chunks: Mutex::new(self.lock().clone()),
        }
    }

    /// Number of allocated 4 KiB chunks.
    pub fn allocated_chunks(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Chunk>> {
        // A panic while holding the lock cannot leave the map structurally
        // broken (no operation leaves it half-updated), so recover.
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Set `[offset, offset+len)` to zeros, freeing whole chunks.
    fn zero_range(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = offset + len;
        let mut map = self.lock();
        let first = offset / CHUNK64;
        let last = (end - 1) / CHUNK64;
        let keys: Vec<u64> = map.range(first..=last).map(|(&k, _)| k).collect();
        for k in keys {
            let cs = k * CHUNK64;
            let s = offset.max(cs) - cs;
            let e = end.min(cs + CHUNK64) - cs;
            if s == 0 && e == CHUNK64 {
                map.remove(&k);
            } else if let Some(c) = map.get_mut(&k) {
                c[s as usize..e as usize].fill(0);
                if c.iter().all(|&b| b == 0) {
                    map.remove(&k);
                }
            }
        }
    }
}

impl Device for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        buf.fill(0);
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let map = self.lock();
        for (&k, c) in map.range(offset / CHUNK64..=(end - 1) / CHUNK64) {
            let cs = k * CHUNK64;
            let s = offset.max(cs);
            let e = end.min(cs + CHUNK64);
            buf[(s - offset) as usize..(e - offset) as usize]
                .copy_from_slice(&c[(s - cs) as usize..(e - cs) as usize]);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check_range(offset, buf.len() as u64, self.size)?;
        let end = offset + buf.len() as u64;
        let mut map = self.lock();
        let mut pos = offset;
        while pos < end {
            let k = pos / CHUNK64;
            let cs = k * CHUNK64;
            let e = end.min(cs + CHUNK64);
            let piece = &buf[(pos - offset) as usize..(e - offset) as usize];
            let range = (pos - cs) as usize..(e - cs) as usize;
            let zeros = piece.iter().all(|&b| b == 0);
            match map.get_mut(&k) {
                Some(c) => {
                    c[range].copy_from_slice(piece);
                    if zeros && c.iter().all(|&b| b == 0) {
                        map.remove(&k);
                    }
                }
                None if zeros => {}
                None => {
                    let mut c: Chunk = Box::new([0u8; CHUNK]);
                    c[range].copy_from_slice(piece);
                    map.insert(k, c);
                }
            }
            pos = e;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size)?;
        self.zero_range(offset, len);
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        check_range(offset, len, self.size)?;
        self.zero_range(offset, len);
        Ok(DiscardOutcome::Zeroed)
    }

    fn discard_zeroes_data(&self) -> bool {
        true
    }

    /// The unallocated chunks in the range (and anything past the end).
    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let end = offset.saturating_add(len);
        let map = self.lock();
        let mut pos = offset;
        for (&k, _) in map.range(offset / CHUNK64..=(end - 1) / CHUNK64) {
            let cs = k * CHUNK64;
            push_merge(&mut out, pos, cs.max(pos));
            pos = pos.max(cs + CHUNK64);
        }
        push_merge(&mut out, pos, end);
        Ok(out)
    }

    fn reports_allocation(&self) -> bool {
        true
    }

    fn allocated_bytes(&self) -> Option<u64> {
        Some(self.lock().len() as u64 * CHUNK64)
    }

    fn is_rotational(&self) -> Option<bool> {
        Some(false)
    }

    fn name(&self) -> String {
        format!("memory device ({} bytes)", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceError;

    const TIB: u64 = 1 << 40;

    #[test]
    fn round_trip_across_chunks() {
        let dev = MemDevice::new(64 * 1024);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8 + 1).collect();
        dev.write_at(&data, 1000).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, 1000).unwrap();
        assert_eq!(back, data);
        let all = dev.to_bytes();
        assert!(all[..1000].iter().all(|&b| b == 0));
        assert_eq!(&all[1000..11_000], &data[..]);
        assert!(all[11_000..].iter().all(|&b| b == 0));
        assert_eq!(dev.allocated_chunks(), 3); // bytes 1000..11000 touch chunks 0, 1, 2
    }

    #[test]
    fn out_of_range_errors() {
        let dev = MemDevice::new(8192);
        let mut buf = [0u8; 16];
        assert!(matches!(
            dev.read_at(&mut buf, 8190),
            Err(DeviceError::OutOfRange {
                offset: 8190,
                len: 16,
                size: 8192
            })
        ));
        assert!(matches!(
            dev.write_at(&buf, 8192),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.zeroout(0, 8193),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.discard(4096, 4097),
            Err(DeviceError::OutOfRange { .. })
        ));
        // Empty access at the very end is fine.
        dev.read_at(&mut [], 8192).unwrap();
        dev.write_at(&buf, 8192 - 16).unwrap();
    }

    #[test]
    fn huge_sparse_device() {
        let dev = MemDevice::new(TIB);
        assert!(dev.is_known_zero(0, TIB).unwrap());
        dev.write_at(b"superblock", 1024).unwrap();
        dev.write_at(b"end", TIB - 3).unwrap();
        assert_eq!(dev.allocated_bytes(), Some(8192));
        assert_eq!(
            dev.known_zero_ranges(0, TIB).unwrap(),
            vec![(4096, TIB - 4096)]
        );
        assert_eq!(
            dev.known_zero_ranges(100, 5000).unwrap(),
            vec![(4096, 5100)]
        );
        let mut b = [0u8; 3];
        dev.read_at(&mut b, TIB - 3).unwrap();
        assert_eq!(&b, b"end");
        // Zeros do not allocate.
        dev.write_at(&vec![0u8; 1 << 20], 1 << 30).unwrap();
        assert_eq!(dev.allocated_chunks(), 2);
        dev.zeroout(0, TIB).unwrap();
        assert_eq!(dev.allocated_chunks(), 0);
    }

    #[test]
    fn zeroout_and_discard_partial_chunks() {
        let dev = MemDevice::from_bytes(vec![0xee; 3 * 4096]);
        assert_eq!(dev.allocated_chunks(), 3);
        dev.zeroout(100, 4096).unwrap();
        let b = dev.to_bytes();
        assert!(b[..100].iter().all(|&x| x == 0xee));
        assert!(b[100..4196].iter().all(|&x| x == 0));
        assert!(b[4196..].iter().all(|&x| x == 0xee));
        assert_eq!(dev.allocated_chunks(), 3);
        assert_eq!(dev.discard(4096, 8192).unwrap(), DiscardOutcome::Zeroed);
        assert_eq!(dev.allocated_chunks(), 1);
        assert!(dev.is_known_zero(4096, 8192).unwrap());
        // Overwriting the last non-zero bytes with zeros frees the chunk.
        dev.write_at(&[0u8; 100], 0).unwrap();
        assert_eq!(dev.allocated_chunks(), 0);
        assert!(dev.is_known_zero(0, 3 * 4096).unwrap());
    }

    #[test]
    fn snapshot_is_independent() {
        let dev = MemDevice::new(4096 * 4);
        dev.write_at(b"one", 0).unwrap();
        let snap = dev.snapshot();
        dev.write_at(b"two", 0).unwrap();
        assert_eq!(&snap.to_bytes()[..3], b"one");
        assert_eq!(&dev.to_bytes()[..3], b"two");
        // from_bytes of a short, unaligned buffer.
        let small = MemDevice::from_bytes(b"abc".to_vec());
        assert_eq!(small.size(), 3);
        assert_eq!(small.to_bytes(), b"abc");
    }
}
