//! [`FileDevice`]: a regular (usually sparse) image file.

use std::fs::{self, File};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ranges::push_merge;
use crate::sys::{self, major, minor};
use crate::{Device, DeviceError, DiscardOutcome, OpenOptions, Result, check_range, sysfs};

/// A regular image file used as a device.
///
/// The device size is the file length when opened (or as set by
/// [`FileDevice::set_len`]); accesses beyond it fail with
/// [`DeviceError::OutOfRange`] rather than growing the file.
/// I/O is positional (`pread`/`pwrite`), so the device can be shared
/// between threads.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    writable: bool,
    size: AtomicU64,
}

impl FileDevice {
    /// Open an existing regular file.
    ///
    /// Errors: [`DeviceError::Open`] if it cannot be stat'ed or opened
    /// (including a missing file), [`DeviceError::NotADevice`] if it is not
    /// a regular file, [`DeviceError::Busy`] if `opts.exclusive` and another
    /// open file description holds an `flock` on it.
    ///
    /// This does not check whether the file backs a mounted loop device;
    /// [`crate::open_device`] does.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        let path = path.as_ref();
        let open_err = |source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Stat first (a cheap, clear refusal), then open without blocking
        // and check the opened file itself: the path may have been swapped
        // for a FIFO in between.
        let meta = fs::metadata(path).map_err(open_err)?;
        if !meta.is_file() {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
            });
        }
        let file = crate::open::open_nonblocking(path, opts.write, false)?;
        Self::from_file(file, path, opts)
    }

    /// Create a new file of `size` bytes without allocating any of it (a
    /// sparse file), and open it read-write. Fails with
    /// [`DeviceError::Open`] (`AlreadyExists`) if the path exists.
    pub fn create_sparse(path: impl AsRef<Path>, size: u64) -> Result<Self> {
        let path = path.as_ref();
        let open_err = |source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(open_err)?;
        if let Err(e) = file.set_len(size) {
            drop(file);
            // Do not leave a half-made file behind; the original error is
            // the one worth reporting.
            let _ = fs::remove_file(path);
            return Err(open_err(e));
        }
        Self::from_file(
            file,
            path,
            OpenOptions {
                write: true,
                exclusive: false,
            },
        )
    }

    /// Use an opened file (checked with `fstat`: a regular file, else
    /// [`DeviceError::NotADevice`]). With `opts.exclusive`, another holder
    /// of an `flock` or of a POSIX or OFD `fcntl` lock (QEMU locks images
    /// that way) makes it [`DeviceError::Busy`]; a writable file then also
    /// gets our own OFD write lock for as long as it is open.
    pub(crate) fn from_file(file: File, path: &Path, opts: OpenOptions) -> Result<Self> {
        let open_err = |source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        let meta = file.metadata().map_err(open_err)?;
        if !meta.is_file() {
            return Err(DeviceError::NotADevice {
                path: path.to_path_buf(),
            });
        }
        if opts.exclusive
            && (!sys::try_flock_exclusive(&file).map_err(open_err)?
                || !try_fcntl_lock(&file, opts.write).map_err(open_err)?)
        {
            return Err(DeviceError::Busy {
                path: path.to_path_buf(),
            });
        }
        Ok(FileDevice {
            file,
            path: path.to_path_buf(),
            writable: opts.write,
            size: AtomicU64::new(meta.len()),
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying file. Use positional I/O on it: its file offset is
    /// moved by [`Device::known_zero_ranges`].
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Change the file length (and so the device size): truncating or
    /// extending with a hole.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.check_writable()?;
        self.file
            .set_len(size)
            .map_err(|e| DeviceError::io(size, 0, e))?;
        self.size.store(size, Ordering::Release);
        Ok(())
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

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.size())
    }
}

/// Whole-file OFD lock: `Ok(false)` if another open file description (of
/// any process) holds a conflicting POSIX or OFD lock on any byte. With
/// `write`, takes a write lock (held until the file is closed); without,
/// only asks (`F_OFD_GETLK`: a write lock would conflict with any lock).
fn try_fcntl_lock(file: &File, write: bool) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0; // to the end of the file, however long
    let cmd = if write {
        libc::F_OFD_SETLK
    } else {
        libc::F_OFD_GETLK
    };
    // SAFETY: the descriptor is owned by `file`; `fl` is a valid, writable
    // `struct flock` for the duration of the call (GETLK writes into it).
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
            // No record locks on this filesystem: nobody can hold one.
            Some(libc::ENOLCK) | Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => Ok(true),
            _ => Err(e),
        };
    }
    Ok(write || fl.l_type == libc::F_UNLCK as libc::c_short)
}

impl Device for FileDevice {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DeviceError::io(offset, len, e))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.check_writable()?;
        self.check(offset, len)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| DeviceError::io(offset, len, e))
    }

    fn flush(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| DeviceError::io(0, self.size(), e))
    }

    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)`: queue writeback of the
    /// range and return at once.
    fn start_writeback(&self, offset: u64, len: u64) -> Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Ok(());
        };
        // SAFETY: sync_file_range only reads its integer arguments; the fd
        // is owned by `self.file` and open for the duration of the call.
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), off, n, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc != 0 {
            // A hint only: ignore failures (e.g. unsupported filesystems).
        }
        Ok(())
    }

    /// Punches a hole (never allocates); writes zeros if the filesystem
    /// cannot punch holes.
    fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable()?;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let io_err = |e| DeviceError::io(offset, len, e);
        match sys::punch_hole(&self.file, offset, len) {
            Ok(()) => Ok(()),
            Err(e) if sys::is_unsupported(&e) => {
                sys::write_zeros(&self.file, offset, len).map_err(io_err)
            }
            Err(e) => Err(io_err(e)),
        }
    }

    /// Punches a hole: [`DiscardOutcome::Zeroed`], or
    /// [`DiscardOutcome::Unsupported`] if the filesystem cannot.
    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
        self.check_writable()?;
        self.check(offset, len)?;
        if len == 0 {
            return Ok(DiscardOutcome::Zeroed);
        }
        match sys::punch_hole(&self.file, offset, len) {
            Ok(()) => Ok(DiscardOutcome::Zeroed),
            Err(e) if sys::is_unsupported(&e) => Ok(DiscardOutcome::Unsupported),
            Err(e) => Err(DeviceError::io(offset, len, e)),
        }
    }

    fn discard_zeroes_data(&self) -> bool {
        true
    }

    /// Holes found with `lseek(SEEK_DATA/SEEK_HOLE)`; anything past the end
    /// of the file counts as zero. Filesystems without hole reporting show
    /// the whole file as data (so: no known zeros).
    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let end = offset.saturating_add(len);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let io_err = |e| DeviceError::io(offset, len, e);
        let file_len = self.file.metadata().map_err(io_err)?.len();
        let mut push = |s: u64, e: u64| push_merge(&mut out, s, e);
        let mut pos = offset;
        while pos < end {
            if pos >= file_len {
                push(pos, end);
                break;
            }
            let data = match sys::seek_data(&self.file, pos) {
                Ok(Some(d)) => d,
                // Only a hole follows, up to EOF and (for us) beyond.
                Ok(None) => {
                    push(pos, end);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) || sys::is_unsupported(&e) => {
                    return Ok(Vec::new());
                }
                Err(e) => return Err(io_err(e)),
            };
            push(pos, data.min(end));
            if data >= end {
                break;
            }
            pos = match sys::seek_hole(&self.file, data) {
                Ok(Some(h)) if h > data => h,
                // A data byte was just found here, so a hole (at worst EOF)
                // must follow; if the file shrank meanwhile, stop.
                Ok(_) => break,
                Err(e) => return Err(io_err(e)),
            };
        }
        Ok(out)
    }

    /// Holes are what the host filesystem has not allocated
    /// (`SEEK_DATA`); where it cannot report holes every byte shows as
    /// data, which only makes a reconciler discard more than needed.
    fn reports_allocation(&self) -> bool {
        true
    }

    fn allocated_bytes(&self) -> Option<u64> {
        self.file.metadata().ok().map(|m| m.blocks() * 512)
    }

    /// The rotational flag of the disk under the file's filesystem.
    fn is_rotational(&self) -> Option<bool> {
        let dev = self.file.metadata().ok()?.dev();
        sysfs::rotational_for_devnum(major(dev), minor(dev))
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    const MIB: u64 = 1 << 20;

    fn rw() -> OpenOptions {
        OpenOptions {
            write: true,
            exclusive: false,
        }
    }

    #[test]
    fn create_sparse_is_all_hole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let dev = FileDevice::create_sparse(&p, 64 * MIB).unwrap();
        assert_eq!(dev.size(), 64 * MIB);
        assert_eq!(dev.allocated_bytes(), Some(0));
        assert_eq!(
            dev.known_zero_ranges(0, 64 * MIB).unwrap(),
            vec![(0, 64 * MIB)]
        );
        assert!(dev.is_known_zero(MIB, MIB).unwrap());
        // Past EOF counts as zero.
        assert_eq!(
            dev.known_zero_ranges(60 * MIB, 8 * MIB).unwrap(),
            vec![(60 * MIB, 68 * MIB)]
        );
        // Creating it again fails.
        match FileDevice::create_sparse(&p, MIB) {
            Err(DeviceError::Open { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::AlreadyExists)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_makes_data_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let dev = FileDevice::create_sparse(&p, 16 * MIB).unwrap();
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8 + 1).collect();
        dev.write_at(&data, 4 * MIB).unwrap();
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, 4 * MIB).unwrap();
        assert_eq!(back, data);
        let zr = dev.known_zero_ranges(0, 16 * MIB).unwrap();
        // The written range is not known-zero; the start and end are.
        assert!(!dev.is_known_zero(4 * MIB, 8192).unwrap());
        assert!(zr.iter().all(|&(s, e)| e <= 4 * MIB || s >= 4 * MIB + 8192));
        assert_eq!(zr.first().unwrap().0, 0);
        assert_eq!(zr.last().unwrap().1, 16 * MIB);
        assert!(dev.is_known_zero(0, MIB).unwrap());
        assert!(dev.is_known_zero(8 * MIB, MIB).unwrap());
        assert!(dev.allocated_bytes().unwrap() >= 8192);
        dev.flush().unwrap();

        // Reopen read-only: contents persist, writes refused.
        drop(dev);
        let ro = FileDevice::open(&p, OpenOptions::default()).unwrap();
        let mut back = vec![0u8; data.len()];
        ro.read_at(&mut back, 4 * MIB).unwrap();
        assert_eq!(back, data);
        assert!(matches!(
            ro.write_at(&data, 0),
            Err(DeviceError::ReadOnly { .. })
        ));
        assert!(matches!(
            ro.zeroout(0, 4096),
            Err(DeviceError::ReadOnly { .. })
        ));
    }

    #[test]
    fn out_of_range() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_sparse(dir.path().join("img"), 8192).unwrap();
        let mut buf = [0u8; 512];
        assert!(matches!(
            dev.read_at(&mut buf, 8192 - 256),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.write_at(&buf, u64::MAX - 10),
            Err(DeviceError::OutOfRange { .. })
        ));
        // The file did not grow.
        assert_eq!(dev.file().metadata().unwrap().len(), 8192);
    }

    #[test]
    fn zeroout_punches_and_does_not_allocate() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        let dev = FileDevice::create_sparse(&p, 16 * MIB).unwrap();
        dev.write_at(&vec![0xaa; (4 * MIB) as usize], 2 * MIB)
            .unwrap();
        dev.flush().unwrap();
        let before = dev.allocated_bytes().unwrap();
        assert!(before >= 4 * MIB);

        // Zero a range that is half data, half hole.
        dev.zeroout(4 * MIB, 4 * MIB).unwrap();
        let after = dev.allocated_bytes().unwrap();
        assert!(after <= before - 2 * MIB, "{before} -> {after}");
        let mut buf = vec![0xffu8; (4 * MIB) as usize];
        dev.read_at(&mut buf, 4 * MIB).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        dev.read_at(&mut buf[..4096], 2 * MIB).unwrap();
        assert!(buf[..4096].iter().all(|&b| b == 0xaa));
        assert!(dev.is_known_zero(4 * MIB, 4 * MIB).unwrap());

        // Zeroing a hole allocates nothing.
        dev.zeroout(10 * MIB, 4 * MIB).unwrap();
        assert_eq!(dev.allocated_bytes().unwrap(), after);

        // Unaligned zeroout: the partial blocks are zeroed, neighbours kept.
        dev.zeroout(2 * MIB + 100, 1000).unwrap();
        let mut small = vec![0u8; 1200];
        dev.read_at(&mut small, 2 * MIB).unwrap();
        assert!(small[..100].iter().all(|&b| b == 0xaa));
        assert!(small[100..1100].iter().all(|&b| b == 0));
        assert!(small[1100..].iter().all(|&b| b == 0xaa));
        assert_eq!(dev.size(), 16 * MIB);
    }

    #[test]
    fn discard_is_zeroing() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_sparse(dir.path().join("img"), 4 * MIB).unwrap();
        assert!(dev.discard_zeroes_data());
        dev.write_at(&vec![7u8; MIB as usize], MIB).unwrap();
        let outcome = dev.discard(MIB, MIB).unwrap();
        if outcome == DiscardOutcome::Unsupported {
            eprintln!("filesystem cannot punch holes; discard not checked");
            return;
        }
        assert_eq!(outcome, DiscardOutcome::Zeroed);
        let mut buf = vec![1u8; MIB as usize];
        dev.read_at(&mut buf, MIB).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert!(dev.is_known_zero(0, 4 * MIB).unwrap());
        assert_eq!(dev.allocated_bytes(), Some(0));
    }

    #[test]
    fn open_errors() {
        let dir = tempfile::tempdir().unwrap();
        match FileDevice::open(dir.path().join("missing"), rw()) {
            Err(DeviceError::Open { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            FileDevice::open(dir.path(), rw()),
            Err(DeviceError::NotADevice { .. })
        ));
    }

    #[test]
    fn exclusive_lock() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        drop(FileDevice::create_sparse(&p, MIB).unwrap());
        let excl = OpenOptions::read_write();
        let a = FileDevice::open(&p, excl).unwrap();
        assert!(matches!(
            FileDevice::open(&p, excl),
            Err(DeviceError::Busy { .. })
        ));
        // Non-exclusive opens are not affected.
        FileDevice::open(&p, OpenOptions::default()).unwrap();
        drop(a);
        FileDevice::open(&p, excl).unwrap();
    }

    /// Take a whole-file lock on `p` through a new open file description.
    fn hold_lock(p: &Path, cmd: libc::c_int, ty: libc::c_int) -> File {
        use std::os::fd::AsRawFd;
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        // SAFETY: as in `try_fcntl_lock`.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = ty as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = 100;
        fl.l_len = 1;
        // SAFETY: `f` owns the descriptor; `fl` is valid for the call.
        let rc = unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        f
    }

    #[test]
    fn fcntl_locks_make_it_busy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        drop(FileDevice::create_sparse(&p, MIB).unwrap());
        // A POSIX read lock on one byte (conflicts even within a process
        // with OFD locks), an OFD lock as QEMU takes them.
        for (cmd, ty) in [
            (libc::F_SETLK, libc::F_RDLCK),
            (libc::F_OFD_SETLK, libc::F_RDLCK),
            (libc::F_OFD_SETLK, libc::F_WRLCK),
        ] {
            for opts in [
                OpenOptions::read_write(),
                OpenOptions {
                    write: false,
                    exclusive: true,
                },
            ] {
                // (Closing any descriptor of the file drops this process's
                // POSIX locks, so the lock is taken again for each open.)
                let held = hold_lock(&p, cmd, ty);
                assert!(
                    matches!(FileDevice::open(&p, opts), Err(DeviceError::Busy { .. })),
                    "{cmd} {ty} {opts:?}"
                );
                drop(held);
            }
            let held = hold_lock(&p, cmd, ty);
            // Plain read-only opens are not affected.
            drop(FileDevice::open(&p, OpenOptions::default()).unwrap());
            drop(held);
            drop(FileDevice::open(&p, OpenOptions::read_write()).unwrap());
        }
        // Our own OFD lock keeps a second writer out, then goes with us.
        let a = FileDevice::open(&p, OpenOptions::read_write()).unwrap();
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        assert!(!try_fcntl_lock(&f, true).unwrap());
        drop(a);
        assert!(try_fcntl_lock(&f, true).unwrap());
    }

    #[test]
    fn set_len_resizes() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_sparse(dir.path().join("img"), MIB).unwrap();
        dev.set_len(2 * MIB).unwrap();
        assert_eq!(dev.size(), 2 * MIB);
        dev.write_at(&[1], 2 * MIB - 1).unwrap();
        assert!(dev.is_known_zero(MIB, MIB - 4096).unwrap());
    }

    #[test]
    fn rotational_is_best_effort() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_sparse(dir.path().join("img"), MIB).unwrap();
        // Either answer is fine; it must not fail or panic.
        let _ = dev.is_rotational();
        assert_eq!(dev.logical_block_size(), 512);
    }
}
