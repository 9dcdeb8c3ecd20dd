//! `ext4kit mkfs -J device=`: finding the journal device and reading it.
//!
//! The device is given as mke2fs takes it (`get_devname`): a path, or a
//! `NAME=value` tag (`UUID=`, `LABEL=`, ...) that libblkid resolves. The
//! tag is looked up with the `blkid` command (`blkid -o device -t TAG`):
//! the same library and cache mke2fs uses, so it finds what mke2fs finds,
//! also where udev makes no `/dev/disk/by-*` links (containers, initramfs,
//! loop devices on some systems); without `blkid` installed, the
//! `/dev/disk/by-uuid` and `/dev/disk/by-label` links are the fallback.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};
use ext4kit::mkfs::journal_dev::{self, ExternalJournal, JournalDevice};
use ext4kit_device::{Device, OpenOptions, open_device};

/// The journal device of `-J device=SPEC`, as found and read before the
/// format.
pub struct Found {
    pub path: PathBuf,
    pub external: ExternalJournal,
}

/// Check the journal device at `path` (looked up from `-J device=` by
/// [`resolve_spec`] while the options were read, as mke2fs's
/// `journal_device`) as mke2fs does before it adds a journal device
/// (nothing is written).
pub fn find_path(path: &Path) -> Result<Found> {
    let path = path.to_path_buf();
    // mke2fs's ext2fs_open failure, as com_err says it.
    let md = std::fs::metadata(&path).map_err(|e| {
        let text = e.to_string();
        let text = text.rfind(" (os error ").map_or(&*text, |i| &text[..i]);
        anyhow::anyhow!(
            "{text} while trying to open journal device {}",
            path.display()
        )
    })?;
    if !md.file_type().is_block_device() {
        // mke2fs asks, then fails in ext2fs_add_journal_device after the
        // filesystem was written.
        bail!(
            "journal device {} is not a block device (Supplied journal device not a block device)",
            path.display()
        );
    }
    let dev = open_device(&path, OpenOptions::read_only())?;
    let name = path.display().to_string();
    let jd = journal_dev::inspect(dev.as_ref(), &name)?;
    Ok(Found {
        external: jd.external(&name, md.rdev() as u32),
        path,
    })
}

/// Open the journal device for the update, exclusively (refusing it when
/// mounted or in use, as mke2fs's check_mount does), and read it again.
pub fn open_rw(found: &Found) -> Result<(Box<dyn Device>, JournalDevice)> {
    let dev = open_device(&found.path, OpenOptions::read_write())?;
    let name = found.path.display().to_string();
    let jd = journal_dev::inspect(dev.as_ref(), &name)?;
    if jd.external(&name, found.external.rdev) != found.external {
        bail!("journal device {name} changed while the filesystem was being planned");
    }
    Ok((dev, jd))
}

/// mke2fs's `get_devname(NULL, spec, NULL)`: a `NAME=value` tag that
/// libblkid finds wins (with its collision warning when a file of that
/// name exists too); else the name itself.
pub fn resolve_spec(spec: &str) -> Result<PathBuf> {
    let is_file = Path::new(spec).exists();
    if let Some((tag, value)) = spec.split_once('=')
        && !tag.is_empty()
        && !tag.contains('/')
    {
        if let Some(dev) = lookup_tag(spec, tag, value) {
            if is_file && dev != Path::new(spec) {
                eprintln!(
                    "Collision found: '{spec}' refers to both '{}' and a file '{spec}'. Using '{}'!",
                    dev.display(),
                    dev.display()
                );
            }
            return Ok(dev);
        }
        if !is_file {
            bail!("Could not find journal device matching {spec}");
        }
    }
    Ok(PathBuf::from(spec))
}

/// `blkid -o device -t NAME=value`; without blkid, the udev links.
fn lookup_tag(spec: &str, tag: &str, value: &str) -> Option<PathBuf> {
    match Command::new("blkid")
        .args(["-o", "device", "-t", spec])
        .output()
    {
        Ok(out) => out
            .status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            .and_then(|s| {
                s.lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .map(PathBuf::from)
            }),
        Err(_) => {
            let value = value.trim_matches('"');
            let dir = match tag {
                "UUID" => "/dev/disk/by-uuid",
                "LABEL" => "/dev/disk/by-label",
                "PARTUUID" => "/dev/disk/by-partuuid",
                "PARTLABEL" => "/dev/disk/by-partlabel",
                _ => return None,
            };
            let link = Path::new(dir).join(value);
            std::fs::canonicalize(link).ok()
        }
    }
}
