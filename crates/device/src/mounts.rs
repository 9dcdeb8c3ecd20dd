//! Is a device (or an image file, through a loop device) mounted?
//!
//! Reads `/proc/self/mountinfo` and `/sys/block/loop*/loop/backing_file`.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::sys::{major, minor};
use crate::{DeviceError, Result, sysfs};

const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Major number of the mounted device (`st_dev` of files on it).
    pub major: u32,
    /// Minor number of the mounted device.
    pub minor: u32,
    /// Where it is mounted (octal escapes such as `\040` decoded).
    pub mount_point: String,
    /// Filesystem type (`ext4`, `tmpfs`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/sda1`, `tmpfs`, ...), escapes decoded.
    pub source: String,
}

/// The mount table of this process' mount namespace.
pub fn mounts() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&fs::read_to_string(MOUNTINFO)?))
}

/// Decode the octal escapes (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash) the kernel uses in mountinfo fields.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse mountinfo text; malformed lines are skipped.
fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            // id parent maj:min root mount_point options [optional...] - fstype source super_options
            let fields: Vec<&str> = line.split(' ').collect();
            let (maj, min) = fields.get(2)?.split_once(':')?;
            let mount_point = unescape(fields.get(4)?);
            let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            Some(MountEntry {
                major: maj.parse().ok()?,
                minor: min.parse().ok()?,
                mount_point,
                fs_type: unescape(fields.get(sep + 1)?),
                source: unescape(fields.get(sep + 2).copied().unwrap_or("")),
            })
        })
        .collect()
}

/// The first mount of any of `devs`: by the device number in mountinfo, or
/// (for filesystems such as btrfs that report an anonymous device number)
/// by a `/dev/...` mount source that is the same block device.
fn find_mount<'a>(table: &'a [MountEntry], devs: &[(u32, u32)]) -> Option<&'a MountEntry> {
    if devs.is_empty() {
        return None;
    }
    table
        .iter()
        .find(|m| devs.contains(&(m.major, m.minor)))
        .or_else(|| {
            table.iter().find(|m| {
                m.source.starts_with("/dev/")
                    && fs::metadata(&m.source).is_ok_and(|md| {
                        md.file_type().is_block_device()
                            && devs.contains(&(major(md.rdev()), minor(md.rdev())))
                    })
            })
        })
}

/// A block device and its partitions.
fn with_partitions(devnum: (u32, u32)) -> Vec<(u32, u32)> {
    let mut v = vec![devnum];
    v.extend(sysfs::partitions_of(devnum.0, devnum.1));
    v
}

/// Loop devices whose backing file is the file with identity `(dev, ino)`:
/// `(/dev/loopN, (major, minor))`.
fn loops_backed_by(dev: u64, ino: u64) -> Vec<(PathBuf, (u32, u32))> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, (u32, u32))> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| {
            let dir = e.path();
            let backing = fs::read_to_string(dir.join("loop/backing_file")).ok()?;
            let backing = backing.strip_suffix('\n').unwrap_or(&backing);
            // A deleted backing file cannot be the one we stat'ed by path.
            let md = fs::metadata(backing).ok()?;
            if md.dev() != dev || md.ino() != ino {
                return None;
            }
            let devnum = sysfs::parse_devnum(&fs::read_to_string(dir.join("dev")).ok()?)?;
            Some((Path::new("/dev").join(e.file_name()), devnum))
        })
        .collect();
    out.sort();
    out
}

/// Loop devices (`/dev/loopN`) currently backed by the file at `path`,
/// compared by file identity (device and inode), not by name. Best effort:
/// empty if `path` cannot be stat'ed or sysfs is unavailable.
pub fn loop_devices_backed_by(path: impl AsRef<Path>) -> Vec<PathBuf> {
    match fs::metadata(path.as_ref()) {
        Ok(md) if md.is_file() => loops_backed_by(md.dev(), md.ino())
            .into_iter()
            .map(|(p, _)| p)
            .collect(),
        _ => Vec::new(),
    }
}

/// Fail with [`DeviceError::Mounted`] if `path` is in use as a mounted
/// filesystem: a block device that (or a partition of which) is mounted, or
/// a regular file that backs a loop device that (or a partition of which) is
/// mounted.
///
/// [`DeviceError::Open`] if `path` cannot be stat'ed or the mount table
/// cannot be read; [`DeviceError::NotADevice`] for anything that is neither
/// a regular file nor a block device.
pub fn check_not_mounted(path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    if crate::is_device_uri(path) {
        // A network export: no local mount can hold it.
        return Ok(());
    }
    let md = fs::metadata(path).map_err(|source| DeviceError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let devs: Vec<(u32, u32)> = if md.file_type().is_block_device() {
        with_partitions((major(md.rdev()), minor(md.rdev())))
    } else if md.is_file() {
        loops_backed_by(md.dev(), md.ino())
            .into_iter()
            .flat_map(|(_, devnum)| with_partitions(devnum))
            .collect()
    } else {
        return Err(DeviceError::NotADevice {
            path: path.to_path_buf(),
        });
    };
    if devs.is_empty() {
        return Ok(());
    }
    let table = mounts().map_err(|source| DeviceError::Open {
        path: PathBuf::from(MOUNTINFO),
        source,
    })?;
    match find_mount(&table, &devs) {
        Some(m) => Err(DeviceError::Mounted {
            path: path.to_path_buf(),
            on: Some(m.mount_point.clone()),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
42 27 7:0 / /tmp/my\\040mnt rw,relatime shared:5 master:2 - ext4 /dev/loop0 rw
43 27 0:55 / /data rw - btrfs /dev/sdz rw
garbage line
";

    #[test]
    fn parses_mountinfo() {
        let t = parse_mountinfo(SAMPLE);
        assert_eq!(t.len(), 4);
        assert_eq!(
            t[2],
            MountEntry {
                major: 7,
                minor: 0,
                mount_point: "/tmp/my mnt".into(),
                fs_type: "ext4".into(),
                source: "/dev/loop0".into(),
            }
        );
        assert_eq!(t[1].fs_type, "ext4");
        assert_eq!((t[1].major, t[1].minor), (254, 0));
        assert_eq!(
            find_mount(&t, &[(7, 0)]).map(|m| m.mount_point.as_str()),
            Some("/tmp/my mnt")
        );
        assert!(find_mount(&t, &[(7, 1)]).is_none());
        assert!(find_mount(&t, &[]).is_none());
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape("a\\040b\\011c\\134d"), "a b\tc\\d");
        assert_eq!(unescape("trail\\04"), "trail\\04");
        assert_eq!(unescape("plain"), "plain");
    }

    #[test]
    fn real_mount_table_reads() {
        // /proc is there on any Linux this runs on; the root is mounted.
        let t = mounts().unwrap();
        assert!(t.iter().any(|m| m.mount_point == "/"));
    }

    #[test]
    fn temp_file_is_not_mounted() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        check_not_mounted(tmp.path()).unwrap();
        assert!(loop_devices_backed_by(tmp.path()).is_empty());
        assert!(matches!(
            check_not_mounted("/no/such/file"),
            Err(DeviceError::Open { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            check_not_mounted(dir.path()),
            Err(DeviceError::NotADevice { .. })
        ));
    }
}
