//! [`open_device`]: open a path as whichever kind of device it is.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use crate::{BlockDevice, Device, DeviceError, FileDevice, OpenOptions, Result, check_not_mounted};

/// Open `path` as a [`FileDevice`] (regular file) or [`BlockDevice`] (block
/// special file).
///
/// When `opts.write` is set, refuses with [`DeviceError::Mounted`] — before
/// opening anything for writing — a block device that is mounted (or has a
/// mounted partition) and a regular file that backs a mounted loop device;
/// see [`check_not_mounted`]. Read-only opens of mounted devices are allowed.
///
/// A missing path is [`DeviceError::Open`] (kind `NotFound`); directories,
/// character devices, FIFOs and sockets are [`DeviceError::NotADevice`].
pub fn open_device(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Box<dyn Device>> {
    let path = path.as_ref();
    let md = fs::metadata(path).map_err(|source| DeviceError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let ft = md.file_type();
    let is_block = ft.is_block_device();
    if !is_block && !ft.is_file() {
        return Err(DeviceError::NotADevice {
            path: path.to_path_buf(),
        });
    }
    if opts.write {
        check_not_mounted(path)?;
    }
    if is_block {
        Ok(Box::new(BlockDevice::open(path, opts)?))
    } else {
        Ok(Box::new(FileDevice::open(path, opts)?))
    }
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
