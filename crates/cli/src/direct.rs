//! `-D`: mke2fs's direct I/O. Writes (and the reads of a read-modify-write)
//! go through a second descriptor of the target opened with `O_DIRECT`,
//! from a buffer aligned to the page size, in whole logical sectors;
//! everything else (size, zeroing, discard, holes) stays with the ordinary
//! device. Targets that refuse `O_DIRECT` (tmpfs, some network
//! filesystems) are written the ordinary way, as the bytes are the same.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use ext4kit_device::{Device, DeviceError, Result};

pub struct DirectDevice {
    inner: Box<dyn Device>,
    file: File,
    /// Alignment of offsets and lengths (the logical sector size, at least
    /// 512) and of the buffer (the page size).
    sector: u64,
    buf: Mutex<Vec<u8>>,
}

const ALIGN: usize = 4096;

impl DirectDevice {
    /// `inner` with writes through `O_DIRECT`, or `inner` itself (and
    /// `false`) when the target does not take `O_DIRECT`.
    pub fn wrap(inner: Box<dyn Device>, path: &Path) -> (Box<dyn Device>, bool) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path);
        match file {
            Ok(file) => {
                let sector = u64::from(inner.logical_block_size().max(512));
                (
                    Box::new(DirectDevice {
                        inner,
                        file,
                        sector,
                        buf: Mutex::new(Vec::new()),
                    }),
                    true,
                )
            }
            Err(_) => (inner, false),
        }
    }

    /// Run `f` on an aligned scratch buffer of `len` bytes.
    fn with_buf<T>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> Result<T>) -> Result<T> {
        let mut guard = self
            .buf
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.len() < len + ALIGN {
            guard.resize(len + ALIGN, 0);
        }
        let start = guard.as_ptr().align_offset(ALIGN);
        f(&mut guard[start..start + len])
    }

    fn io_err(off: u64, len: usize, e: std::io::Error) -> DeviceError {
        DeviceError::io(off, len as u64, e)
    }
}

impl Device for DirectDevice {
    ext4kit_device::forward_device!(inner; write_at, flush, start_writeback);

    fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let s = self.sector;
        let start = offset - offset % s;
        let end = (offset + data.len() as u64).div_ceil(s) * s;
        let len = (end - start) as usize;
        self.with_buf(len, |buf| {
            let head = (offset - start) as usize;
            if head != 0 || len != data.len() {
                // Read-modify-write of the partial sectors (beyond the end
                // of a file they read as zeros).
                buf.fill(0);
                self.file
                    .read_at(buf, start)
                    .map_err(|e| Self::io_err(start, len, e))?;
            }
            buf[head..head + data.len()].copy_from_slice(data);
            self.file
                .write_all_at(buf, start)
                .map_err(|e| Self::io_err(start, len, e))
        })?;
        // A regular file must not grow past what was written.
        let want = offset + data.len() as u64;
        if end > want
            && let Ok(m) = self.file.metadata()
            && m.is_file()
            && m.len() == end
            && end > self.inner.size().max(want)
        {
            self.file
                .set_len(self.inner.size().max(want))
                .map_err(|e| Self::io_err(want, 0, e))?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Self::io_err(0, 0, e))?;
        self.inner.flush()
    }
    fn start_writeback(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }
}
