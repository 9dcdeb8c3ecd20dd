//! [`BlockDevice`]: a block special file (`/dev/sdX`, `/dev/loopN`, ...).

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::sys::{self, major, minor};
use crate::{
    Device, DeviceError, DiscardOutcome, IoHints, OpenOptions, Result, check_range, sysfs,
};

/// A block device.
///
/// Opened with `O_EXCL` when writing (or when `exclusive` is asked for), so
/// that the kernel refuses it while it is mounted, part of a RAID/LVM
/// set, used as swap or held exclusively by another program
/// ([`DeviceError::Busy`]). I/O goes through the page cache with positional
/// reads and writes; [`Device::flush`] is `fdatasync`, which also flushes the
/// device's write cache.
#[derive(Debug)]
pub struct BlockDevice {
    file: File,
    path: PathBuf,
    writable: bool,
    size: u64,
    logical_block_size: u32,
    physical_block_size: u32,
    io_hints: IoHints,
    discard_zeroes: bool,
    devnum: (u32, u32),
    sysfs_dir: Option<PathBuf>,
}

impl BlockDevice {
    /// Open a block device.
    ///
    /// Errors: [`DeviceError::Open`] if it cannot be opened or queried
    /// (missing path, permission), [`DeviceError::Busy`] on `EBUSY` from an
    /// exclusive open, [`DeviceError::NotADevice`] if it is not a block
    /// device.
    ///
    /// This does not consult the mount table; [`crate::open_device`] does.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let path = path.as_ref();
        let open_err = |source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Stat first so that we never open (and possibly block on) a FIFO
        // or a character device with side effects.
        let meta = fs::metadata(path).map_err(open_err)?;
        if !meta.file_type().is_block_device() {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
            });
        }
        let file = crate::open::open_nonblocking(path, opts.write, opts.write || opts.exclusive)?;
        Self::from_file(file, path, opts)
    }

    /// Use an opened file, checked with `fstat` to be a block device (else
    /// [`DeviceError::NotADevice`]). It must have been opened with
    /// `O_EXCL` when `opts.write || opts.exclusive`.
    pub(crate) fn from_file(file: File, path: &Path, opts: OpenOptions) -> Result<Self> {
        let open_err = |source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        let meta = file.metadata().map_err(open_err)?;
        if !meta.file_type().is_block_device() {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
            });
        }
        let size = sys::blk_size(&file).map_err(open_err)?;
        let logical_block_size = sys::blk_logical_block_size(&file).map_err(open_err)?;
        // Old kernels may lack BLKPBSZGET: then it is the logical size.
        let physical_block_size = sys::blk_physical_block_size(&file).unwrap_or(logical_block_size);
        // No hint where the kernel has none.
        let io_hints = IoHints {
            min_io: sys::blk_io_min(&file).unwrap_or(0),
            opt_io: sys::blk_io_opt(&file).unwrap_or(0),
            alignment_offset: sys::blk_alignment_offset(&file).unwrap_or(0),
        };
        // Old kernels or odd drivers may lack it: then promise nothing.
        let discard_zeroes = sys::blk_discard_zeroes(&file).unwrap_or(false);
        let devnum = (major(meta.rdev()), minor(meta.rdev()));
        let sysfs_dir = sysfs::disk_dir_for_devnum(devnum.0, devnum.1);
        Ok(BlockDevice {
            file,
            path: path.to_path_buf(),
            writable: opts.write,
            size,
            logical_block_size,
            physical_block_size,
            io_hints,
            discard_zeroes,
            devnum,
            sysfs_dir,
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device number as (major, minor).
    pub fn devnum(&self) -> (u32, u32) {
        self.devnum
    }

    /// The sysfs directory of the disk (`/sys/block/<disk>`; the parent disk
    /// for a partition), when sysfs knows the device.
    pub fn sysfs_dir(&self) -> Option<PathBuf> {
        self.sysfs_dir.clone()
    }

    /// The underlying open file.
    pub fn file(&self) -> &File {
        &self.file
    }

    fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(DeviceError::ReadOnly {
                path: self.path.clone(),
            })
        }
    }

    /// Split `[offset, offset+len)` into an unaligned head, a middle aligned
    /// to the logical block size, and an unaligned tail (each `(start, len)`).
    fn split_aligned(&self, offset: u64, len: u64) -> [(u64, u64); 3] {
        let bs = u64::from(self.logical_block_size);
        let end = offset + len;
        let a = offset.div_ceil(bs) * bs;
        let b = end / bs * bs;
        if a >= b {
            return [(offset, len), (b, 0), (end, 0)];
        }
        [(offset, a - offset), (a, b - a), (b, end - b)]
    }
}

impl Device for BlockDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }

    fn physical_block_size(&self) -> u32 {
        self.physical_block_size
    }

    fn io_hints(&self) -> Option<IoHints> {
        Some(self.io_hints)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(offset, len, self.size)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DeviceError::io(offset, len, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.check_writable()?;
        check_range(offset, len, self.size)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| DeviceError::io(offset, len, e))
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| DeviceError::io(0, self.size, e))
    }

    /// Unaligned edges are written with zeros. The aligned middle is first
    /// "punched" (`fallocate(PUNCH_HOLE)`: a write-zeroes that may unmap on
    /// thin storage, refused by devices that cannot do it without writing),
    /// then `BLKZEROOUT`, and written with zeros as the last resort.
    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        check_range(offset, len, self.size)?;
        let [head, mid, tail] = self.split_aligned(offset, len);
        let io_err = |(o, l): (u64, u64)| move |e| DeviceError::io(o, l, e);
        for part in [head, tail] {
            if part.1 > 0 {
                sys::write_zeros(&self.file, part.0, part.1).map_err(io_err(part))?;
            }
        }
        if mid.1 == 0 {
            return Ok(());
        }
        match sys::punch_hole(&self.file, mid.0, mid.1) {
            Ok(()) => return Ok(()),
            Err(e)
                if sys::is_unsupported(&e)
                    || matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENODEV)) => {}
            Err(e) => return Err(io_err(mid)(e)),
        }
        match sys::blk_zeroout(&self.file, mid.0, mid.1) {
            Ok(()) => Ok(()),
            Err(e) if sys::is_unsupported(&e) || e.raw_os_error() == Some(libc::EINVAL) => {
                sys::write_zeros(&self.file, mid.0, mid.1).map_err(io_err(mid))
            }
            Err(e) => Err(io_err(mid)(e)),
        }
    }

    /// `BLKDISCARD` on the part of the range aligned to logical blocks (the
    /// unaligned edges are left alone: discard is only a hint).
    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        self.check_writable()?;
        check_range(offset, len, self.size)?;
        let [_, (start, n), _] = self.split_aligned(offset, len);
        if n == 0 {
            return Ok(DiscardOutcome::Discarded);
        }
        match sys::blk_discard(&self.file, start, n) {
            Ok(()) => Ok(DiscardOutcome::Discarded),
            Err(e) if sys::is_unsupported(&e) => Ok(DiscardOutcome::Unsupported),
            Err(e) => Err(DeviceError::io(start, n, e)),
        }
    }

    fn discard_zeroes_data(&self) -> bool {
        self.discard_zeroes
    }

    fn is_rotational(&self) -> Option<bool> {
        sysfs::rotational_in(self.sysfs_dir.as_deref()?)
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_non_block_files() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        assert!(matches!(
            BlockDevice::open(tmp.path(), OpenOptions::default()),
            Err(DeviceError::NotADevice { .. })
        ));
        assert!(matches!(
            BlockDevice::open("/dev/null", OpenOptions::default()),
            Err(DeviceError::NotADevice { .. })
        ));
        assert!(matches!(
            BlockDevice::open("/no/such/dev", OpenOptions::default()),
            Err(DeviceError::Open { .. })
        ));
    }
}
