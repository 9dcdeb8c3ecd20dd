//! Step 2: make a byte range of an inode table read as zeros, writing as
//! little as possible.
//!
//! Policy (see the module docs of [`super`] for the reasoning):
//!
//! 1. Ranges the device *proves* are zero without reading
//!    ([`Device::known_zero_ranges`]: holes of a sparse file, unallocated
//!    chunks of a memory device) are skipped.
//! 2. The rest is either zeroed right away with [`Device::zeroout`] (punch
//!    hole on files, `BLKZEROOUT` on block devices), or, when read-compare
//!    is on, read in chunks first: blocks that already read as zeros are
//!    skipped and only the runs of non-zero blocks are zeroed (runs closer
//!    than [`MERGE_GAP`] are merged into one request).
//!
//! [`VerifyZero`] decides whether read-compare is on for a device.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use ext4kit_device::{Device, DeviceError};

/// Largest read issued by read-compare.
pub const READ_CHUNK: usize = 1 << 20;
/// Non-zero runs separated by fewer zero bytes than this are zeroed with a
/// single request.
pub const MERGE_GAP: u64 = 64 * 1024;

/// `--verify-zero`: whether to read a range before zeroing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyZero {
    /// Read-compare on non-rotational block devices only.
    #[default]
    Auto,
    /// Always read-compare (files too: allocated zeros are then left as
    /// they are instead of being punched out).
    Always,
    /// Never read; zero everything that is not a known hole.
    Never,
}

impl VerifyZero {
    /// Should ranges on a device of this kind be read before zeroing?
    ///
    /// `Auto`: yes for a block device known to be non-rotational (reads are
    /// cheap there and, on thin or SSD storage, avoid allocating or wearing
    /// anything); no on rotational or unknown block devices (a read costs as
    /// much as the write it might save) and no for files (holes already say
    /// what is zero, and punching an allocated range frees space even when
    /// it held zeros, so the image gets sparser).
    pub fn read_compare(self, kind: DeviceKind, rotational: Option<bool>) -> bool {
        match self {
            VerifyZero::Always => true,
            VerifyZero::Never => false,
            VerifyZero::Auto => kind == DeviceKind::Block && rotational == Some(false),
        }
    }
}

impl fmt::Display for VerifyZero {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VerifyZero::Auto => "auto",
            VerifyZero::Always => "always",
            VerifyZero::Never => "never",
        })
    }
}

impl FromStr for VerifyZero {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(VerifyZero::Auto),
            "always" => Ok(VerifyZero::Always),
            "never" => Ok(VerifyZero::Never),
            other => Err(format!("'{other}': expected auto, always or never")),
        }
    }
}

/// What kind of thing a device is, as far as zero detection cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A regular (image) file.
    File,
    /// A block device.
    Block,
    /// Anything else (memory, wrappers).
    Other,
}

impl DeviceKind {
    /// Classify a path by its file type (`Other` if it cannot be stat'ed).
    pub fn of_path(path: impl AsRef<Path>) -> DeviceKind {
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(path) {
            Ok(m) if m.file_type().is_block_device() => DeviceKind::Block,
            Ok(m) if m.is_file() => DeviceKind::File,
            _ => DeviceKind::Other,
        }
    }
}

/// Byte counts of zeroing work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ZeroStats {
    /// Bytes handed to `zeroout`.
    pub bytes_zeroed: u64,
    /// Bytes found to be zero already (holes or read-compare).
    pub bytes_skipped_already_zero: u64,
    /// Bytes read by read-compare.
    pub bytes_read: u64,
    /// Device requests issued (reads, zeroouts).
    pub requests: u64,
}

impl std::ops::AddAssign for ZeroStats {
    fn add_assign(&mut self, o: Self) {
        self.bytes_zeroed += o.bytes_zeroed;
        self.bytes_skipped_already_zero += o.bytes_skipped_already_zero;
        self.bytes_read += o.bytes_read;
        self.requests += o.requests;
    }
}

/// Zeroes ranges of one device with a fixed policy; owns its read buffer.
#[derive(Debug)]
pub struct Zeroer {
    read_compare: bool,
    buf: Vec<u8>,
}

impl Zeroer {
    /// A zeroer that reads before zeroing when `read_compare` is set.
    pub fn new(read_compare: bool) -> Self {
        Zeroer {
            read_compare,
            buf: Vec::new(),
        }
    }

    /// Is read-compare on?
    pub fn read_compare(&self) -> bool {
        self.read_compare
    }

    /// Make `[offset, offset+len)` read as zeros (not flushed). `unit` is
    /// the granularity at which read-compare decides what is zero (the
    /// filesystem block size).
    pub fn zero_range(
        &mut self,
        dev: &dyn Device,
        offset: u64,
        len: u64,
        unit: u32,
    ) -> Result<ZeroStats, DeviceError> {
        let mut st = ZeroStats::default();
        if len == 0 {
            return Ok(st);
        }
        let end = offset.checked_add(len).ok_or(DeviceError::OutOfRange {
            offset,
            len,
            size: dev.size(),
        })?;
        let holes = dev.known_zero_ranges(offset, len)?;
        let mut pos = offset;
        for (hs, he) in holes {
            let (hs, he) = (hs.clamp(pos, end), he.clamp(pos, end));
            if hs >= he {
                continue;
            }
            if hs > pos {
                self.fill(dev, pos, hs, unit, &mut st)?;
            }
            st.bytes_skipped_already_zero += he - hs;
            pos = he;
        }
        if pos < end {
            self.fill(dev, pos, end, unit, &mut st)?;
        }
        Ok(st)
    }

    /// Zero `[start, end)`, which is not known to be zero.
    fn fill(
        &mut self,
        dev: &dyn Device,
        start: u64,
        end: u64,
        unit: u32,
        st: &mut ZeroStats,
    ) -> Result<(), DeviceError> {
        if !self.read_compare {
            dev.zeroout(start, end - start)?;
            st.bytes_zeroed += end - start;
            st.requests += 1;
            return Ok(());
        }
        if self.buf.len() != READ_CHUNK {
            self.buf = vec![0u8; READ_CHUNK];
        }
        let unit = u64::from(unit.max(512));
        // Open run of non-zero data: [run_start, run_end).
        let mut run: Option<(u64, u64)> = None;
        let mut zeroed = 0u64;
        let mut pos = start;
        while pos < end {
            let n = (end - pos).min(READ_CHUNK as u64);
            let buf = &mut self.buf[..n as usize];
            dev.read_at(buf, pos)?;
            st.bytes_read += n;
            st.requests += 1;
            let mut off = 0u64;
            while off < n {
                // Pieces end on `unit` boundaries of the device.
                let abs = pos + off;
                let piece_end = ((abs / unit + 1) * unit).min(pos + n);
                let piece = &buf[off as usize..(piece_end - pos) as usize];
                if !is_zero(piece) {
                    run = match run {
                        Some((s, e)) if abs - e < MERGE_GAP => Some((s, piece_end)),
                        Some((s, e)) => {
                            dev.zeroout(s, e - s)?;
                            st.requests += 1;
                            zeroed += e - s;
                            Some((abs, piece_end))
                        }
                        None => Some((abs, piece_end)),
                    };
                }
                off = piece_end - pos;
            }
            pos += n;
        }
        if let Some((s, e)) = run {
            dev.zeroout(s, e - s)?;
            st.requests += 1;
            zeroed += e - s;
        }
        st.bytes_zeroed += zeroed;
        st.bytes_skipped_already_zero += (end - start) - zeroed;
        Ok(())
    }
}

/// All bytes zero? (Branch-free fold so the compiler can vectorize it.)
fn is_zero(b: &[u8]) -> bool {
    let mut words = b.chunks_exact(8);
    let acc = words.by_ref().fold(0u64, |a, w| {
        a | u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
    });
    acc == 0 && words.remainder().iter().all(|&x| x == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;

    /// A device that forgets holes (like a block device): known_zero_ranges
    /// is empty, and it records the zeroouts it gets.
    struct NoHoles {
        inner: MemDevice,
        zeroouts: std::sync::Mutex<Vec<(u64, u64)>>,
    }
    impl Device for NoHoles {
        fn size(&self) -> u64 {
            self.inner.size()
        }
        fn read_at(&self, b: &mut [u8], o: u64) -> ext4kit_device::Result<()> {
            self.inner.read_at(b, o)
        }
        fn write_at(&self, b: &[u8], o: u64) -> ext4kit_device::Result<()> {
            self.inner.write_at(b, o)
        }
        fn flush(&self) -> ext4kit_device::Result<()> {
            Ok(())
        }
        fn zeroout(&self, o: u64, l: u64) -> ext4kit_device::Result<()> {
            self.zeroouts.lock().unwrap().push((o, l));
            self.inner.zeroout(o, l)
        }
        fn discard(
            &self,
            o: u64,
            l: u64,
        ) -> ext4kit_device::Result<ext4kit_device::DiscardOutcome> {
            self.inner.discard(o, l)
        }
        fn name(&self) -> String {
            "noholes".into()
        }
    }

    #[test]
    fn policy_table() {
        use DeviceKind::*;
        let a = VerifyZero::Auto;
        assert!(a.read_compare(Block, Some(false)));
        assert!(!a.read_compare(Block, Some(true)));
        assert!(!a.read_compare(Block, None));
        assert!(!a.read_compare(File, Some(false)));
        assert!(VerifyZero::Always.read_compare(File, None));
        assert!(!VerifyZero::Never.read_compare(Block, Some(false)));
        assert_eq!("always".parse::<VerifyZero>(), Ok(VerifyZero::Always));
        assert!("sometimes".parse::<VerifyZero>().is_err());
    }

    #[test]
    fn holes_are_skipped() {
        let dev = MemDevice::new(1 << 20);
        dev.write_at(&[1u8; 100], 8192 + 5).unwrap();
        let mut z = Zeroer::new(false);
        let st = z.zero_range(&dev, 4096, 65536, 1024).unwrap();
        // Only the allocated 4 KiB chunk is zeroed.
        assert_eq!(st.bytes_zeroed, 4096);
        assert_eq!(st.bytes_skipped_already_zero, 65536 - 4096);
        assert_eq!(st.bytes_read, 0);
        assert_eq!(dev.allocated_chunks(), 0);
    }

    #[test]
    fn read_compare_zeroes_only_nonzero_runs() {
        let dev = NoHoles {
            inner: MemDevice::new(8 << 20),
            zeroouts: Default::default(),
        };
        // Non-zero data at two places far apart, and two close together.
        dev.write_at(&[7u8; 10], 1024 * 3 + 1).unwrap();
        dev.write_at(&[7u8; 1], 1024 * 10).unwrap();
        dev.write_at(&[9u8; 3000], 3 << 20).unwrap();
        let mut z = Zeroer::new(true);
        let st = z.zero_range(&dev, 1024, (6 << 20) - 1024, 1024).unwrap();
        let zo = dev.zeroouts.lock().unwrap().clone();
        assert_eq!(zo, vec![(3072, 11 * 1024 - 3072), (3 << 20, 3072)]);
        assert_eq!(st.bytes_zeroed, 11 * 1024 - 3072 + 3072);
        assert_eq!(st.bytes_read, (6 << 20) - 1024);
        assert_eq!(
            st.bytes_zeroed + st.bytes_skipped_already_zero,
            (6 << 20) - 1024
        );
        let mut all = vec![1u8; 8 << 20];
        dev.read_at(&mut all, 0).unwrap();
        assert!(all.iter().all(|&b| b == 0));
    }

    #[test]
    fn without_read_compare_everything_is_zeroed() {
        let dev = NoHoles {
            inner: MemDevice::new(1 << 20),
            zeroouts: Default::default(),
        };
        let mut z = Zeroer::new(false);
        let st = z.zero_range(&dev, 4096, 8192, 4096).unwrap();
        assert_eq!(st.bytes_zeroed, 8192);
        assert_eq!(*dev.zeroouts.lock().unwrap(), vec![(4096, 8192)]);
    }

    #[test]
    fn zero_check() {
        assert!(is_zero(&[]));
        assert!(is_zero(&[0; 13]));
        let mut v = vec![0u8; 29];
        v[28] = 1;
        assert!(!is_zero(&v));
        v[28] = 0;
        v[3] = 1;
        assert!(!is_zero(&v));
    }
}
