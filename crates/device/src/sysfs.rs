//! Looking block devices up in sysfs (`/sys/dev/block/MAJ:MIN`,
//! `/sys/block/<disk>`): rotational flag, partitions, the directory whose
//! `stat` file a load-aware pacer reads.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::sys::{major, minor};

/// The sysfs directory of the *disk* holding block device `major:minor`:
/// the device itself for a whole disk, its parent for a partition.
///
/// Returns `/sys/block/<disk>` when that exists (it is a symlink to the
/// canonical directory), otherwise the canonical directory under
/// `/sys/devices`. `None` when the number is not a block device known to
/// sysfs (e.g. the anonymous device numbers of tmpfs, overlayfs or btrfs).
pub(crate) fn disk_dir_for_devnum(major: u32, minor: u32) -> Option<PathBuf> {
    let dir = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let disk = if dir.join("partition").exists() {
        dir.parent()?.to_path_buf()
    } else {
        dir
    };
    let name = disk.file_name()?;
    let short = Path::new("/sys/block").join(name);
    Some(if short.exists() { short } else { disk })
}

/// `queue/rotational` of the disk holding `major:minor`, if known.
pub(crate) fn rotational_for_devnum(major: u32, minor: u32) -> Option<bool> {
    let dir = disk_dir_for_devnum(major, minor)?;
    rotational_in(&dir)
}

/// Read `<dir>/queue/rotational`.
pub(crate) fn rotational_in(dir: &Path) -> Option<bool> {
    let text = fs::read_to_string(dir.join("queue/rotational")).ok()?;
    match text.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// Parse a sysfs `dev` file ("MAJ:MIN\n").
pub(crate) fn parse_devnum(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Device numbers of the partitions of whole disk `major:minor` (empty for
/// a partition or an unknown device).
pub(crate) fn partitions_of(major: u32, minor: u32) -> Vec<(u32, u32)> {
    let Ok(dir) = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")) else {
        return Vec::new();
    };
    if dir.join("partition").exists() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().join("partition").exists())
        .filter_map(|e| fs::read_to_string(e.path().join("dev")).ok())
        .filter_map(|t| parse_devnum(&t))
        .collect()
}

/// The sysfs directory (`/sys/block/<disk>`) of the disk behind `path`:
/// for a block device, the disk it is (or, for a partition, the disk it is
/// on); for any other file, the disk holding the filesystem the file lives
/// on. Best effort: `None` when the path cannot be stat'ed or the device is
/// not a real block device (tmpfs, overlayfs, network filesystems, btrfs'
/// anonymous device numbers, ...).
///
/// A load-aware pacer reads `<dir>/stat` and `<dir>/queue/*` from here.
///
/// Stacked devices are followed down to the disk that does the I/O: a loop
/// device to the disk under its backing file, a device-mapper or md device
/// to its first component (`slaves/`), so that the counters include other
/// programs' I/O, not only what passes through the stacked device.
pub fn backing_sysfs_dir(path: impl AsRef<Path>) -> Option<PathBuf> {
    let meta = fs::metadata(path.as_ref()).ok()?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let dir = disk_dir_for_devnum(major(dev), minor(dev))?;
    Some(physical_disk_dir(dir, 8))
}

/// Follow loop devices (to the filesystem holding the backing file) and
/// dm/md devices (to their first component) down to a physical disk;
/// `depth` bounds the walk.
fn physical_disk_dir(dir: PathBuf, depth: u32) -> PathBuf {
    if depth == 0 {
        return dir;
    }
    if let Ok(backing) = fs::read_to_string(dir.join("loop/backing_file"))
        && let Ok(meta) = fs::metadata(backing.trim_end_matches('\n'))
        && let Some(d) = disk_dir_for_devnum(major(meta.dev()), minor(meta.dev()))
    {
        return physical_disk_dir(d, depth - 1);
    }
    let first_slave = fs::read_dir(dir.join("slaves"))
        .ok()
        .and_then(|it| {
            let mut names: Vec<_> = it.flatten().map(|e| e.path()).collect();
            names.sort();
            names.into_iter().next()
        })
        .and_then(|p| fs::read_to_string(p.join("dev")).ok())
        .and_then(|t| parse_devnum(&t));
    match first_slave.and_then(|(a, b)| disk_dir_for_devnum(a, b)) {
        Some(d) => physical_disk_dir(d, depth - 1),
        None => dir,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_dev_files() {
        assert_eq!(parse_devnum("7:0\n"), Some((7, 0)));
        assert_eq!(parse_devnum("259:12"), Some((259, 12)));
        assert_eq!(parse_devnum("x:1"), None);
        assert_eq!(parse_devnum(""), None);
    }

    #[test]
    fn backing_dir_is_best_effort() {
        assert_eq!(backing_sysfs_dir("/definitely/not/here"), None);
        // Whatever the machine, the answer (if any) is a directory with a
        // `dev` file.
        let tmp = tempfile::NamedTempFile::new().expect("tempfile");
        if let Some(dir) = backing_sysfs_dir(tmp.path()) {
            assert!(dir.join("dev").exists(), "{}", dir.display());
        }
    }
}
