//! [`open_device`]: open a path as whichever kind of device it is.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::{BlockDevice, Device, DeviceError, FileDevice, OpenOptions, Result, check_not_mounted};

/// Open `path` as a [`FileDevice`] (regular file), [`BlockDevice`] (block
/// special file) or NBD export (a URI).
///
/// The path is opened without blocking (`O_NONBLOCK`, so a FIFO or a
/// terminal swapped in never hangs the open) and the *opened* file is
/// checked with `fstat`: only a regular file or a block device is used.
///
/// When `opts.write` is set, refuses with [`DeviceError::Mounted`] — before
/// opening anything for writing — a block device that is mounted (or has a
/// mounted partition) and a regular file that backs a mounted loop device;
/// see [`check_not_mounted`]. Read-only opens of mounted devices are allowed.
///
/// A missing path is [`DeviceError::Open`] (kind `NotFound`); directories,
/// character devices, FIFOs and sockets are [`DeviceError::NotADevice`].
///
/// A device URI (see [`crate::is_device_uri`]: `nbd://HOST[:PORT]/EXPORT`,
/// `nbd+unix:///EXPORT?socket=PATH`) connects to that NBD export
/// ([`crate::NbdDevice`]); `exclusive` has no meaning there.
pub fn open_device(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Box<dyn Device>> {
    let path = path.as_ref();
    if crate::is_device_uri(path) {
        let uri = path.to_str().unwrap_or_default();
        return Ok(Box::new(crate::NbdDevice::open(uri, opts)?));
    }
    let md = fs::metadata(path).map_err(|source| DeviceError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let ft = md.file_type();
    if !ft.is_block_device() && !ft.is_file() {
        return Err(DeviceError::NotADevice {
            path: path.to_path_buf(),
        });
    }
    if opts.write {
        check_not_mounted(path)?;
    }
    // O_EXCL without O_CREAT: exclusive on block devices, ignored on files.
    let file = open_nonblocking(path, opts.write, opts.write || opts.exclusive)?;
    let ft = file
        .metadata()
        .map_err(|source| DeviceError::Open {
            path: path.to_path_buf(),
            source,
        })?
        .file_type();
    if ft.is_block_device() {
        Ok(Box::new(BlockDevice::from_file(file, path, opts)?))
    } else if ft.is_file() {
        Ok(Box::new(FileDevice::from_file(file, path, opts)?))
    } else {
        Err(DeviceError::NotADevice {
            path: path.to_path_buf(),
        })
    }
}

/// Open `path` for reading (and writing) with `O_NONBLOCK | O_NOCTTY`
/// (and `O_EXCL`), then turn `O_NONBLOCK` off again for the I/O. `EBUSY`
/// (an exclusive open of a block device in use) is [`DeviceError::Busy`].
pub(crate) fn open_nonblocking(path: &Path, write: bool, excl: bool) -> Result<File> {
    let mut oo = fs::OpenOptions::new();
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if excl {
        flags |= libc::O_EXCL;
    }
    oo.read(true).write(write).custom_flags(flags);
    let file = oo.open(path).map_err(|e| {
        if excl && e.raw_os_error() == Some(libc::EBUSY) {
            DeviceError::Busy {
                path: path.to_path_buf(),
            }
        } else {
            DeviceError::Open {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl(F_GETFL/F_SETFL) only reads and sets the status flags
    // of `fd`, which `file` owns and keeps open for the whole call.
    let rc = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 {
            fl
        } else {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(DeviceError::Open {
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    #[test]
    fn directory_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        for opts in [OpenOptions::read_only(), OpenOptions::read_write()] {
            assert!(matches!(
                open_device(dir.path(), opts),
                Err(DeviceError::NotADevice { .. })
            ));
            match open_device(dir.path().join("missing"), opts) {
                Err(DeviceError::Open { path, source }) => {
                    assert_eq!(source.kind(), io::ErrorKind::NotFound);
                    assert_eq!(path, dir.path().join("missing"));
                }
                Err(e) => panic!("unexpected error {e}"),
                Ok(_) => panic!("opened a missing path"),
            }
        }
        assert!(matches!(
            open_device("/dev/null", OpenOptions::read_only()),
            Err(DeviceError::NotADevice { .. })
        ));
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        let st = std::process::Command::new("mkfifo").arg(&p).status();
        if !st.is_ok_and(|s| s.success()) {
            eprintln!("SKIP fifo_is_refused_without_blocking: no mkfifo");
            return;
        }
        // Opening a FIFO with no writer would block forever without
        // O_NONBLOCK; the opened file is then seen to be no device.
        for opts in [OpenOptions::read_only(), OpenOptions::read_write()] {
            // As if the path had been swapped between stat and open.
            let f = open_nonblocking(&p, opts.write, false).expect("no blocking");
            assert!(matches!(
                FileDevice::from_file(f, &p, opts),
                Err(DeviceError::NotADevice { .. })
            ));
            let f = open_nonblocking(&p, opts.write, false).expect("no blocking");
            assert!(matches!(
                BlockDevice::from_file(f, &p, opts),
                Err(DeviceError::NotADevice { .. })
            ));
            assert!(matches!(
                open_device(&p, opts),
                Err(DeviceError::NotADevice { .. })
            ));
        }
    }

    #[test]
    fn opens_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        drop(FileDevice::create_sparse(&p, 1 << 20).unwrap());
        let dev = open_device(&p, OpenOptions::read_write()).unwrap();
        assert_eq!(dev.size(), 1 << 20);
        dev.write_at(b"hello", 1000).unwrap();
        let mut b = [0u8; 5];
        dev.read_at(&mut b, 1000).unwrap();
        assert_eq!(&b, b"hello");
        assert!(dev.discard_zeroes_data());
        assert_eq!(dev.name(), p.display().to_string());
    }
}
