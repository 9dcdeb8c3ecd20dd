//! `mkfs -z UNDO-FILE` and mke2fs's automatic undo file
//! (`should_do_undo` and `mke2fs_setup_tdb` in misc/mke2fs.c 1.47.0).
//!
//! mke2fs makes an undo file when `-z FILE` is given (`-z ""` means the
//! automatic name), or by itself when the target already holds an
//! ext2/3/4 superblock, the new filesystem has group checksums
//! (metadata_csum or gdt_csum) and lazy inode table init (or mke2fs.conf
//! says `force_undo`): then in `$E2FSPROGS_UNDO_DIR`, else mke2fs.conf's
//! `[defaults] undo_dir`, else `/var/lib/e2fsprogs`, as
//! `DIR/mke2fs-BASENAME.e2undo` (an old one is deleted first), but only
//! when that directory is writable and not `none`; otherwise none. With
//! an undo file, the target is not discarded ("Can't undo discard").

use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use ext4kit::mkfs::{self, Resolved};
use ext4kit::profile::Profile;
use ext4kit::undo::{UndoDevice, UndoFile, UndoParams, block_size_for};
use ext4kit_device::{Device, OpenOptions, open_device};

/// The undo file a run will write.
#[derive(Clone, Debug)]
pub struct Choice {
    pub path: PathBuf,
    /// The automatic name: an old file of that name is deleted first.
    pub automatic: bool,
}

/// The undo file mke2fs would write for this run, if any; refuses an
/// undo file that is the target itself. Nothing is touched.
pub fn choose(
    opt_z: Option<&str>,
    device: &Path,
    opened: Option<&dyn Device>,
    resolved: &Resolved,
    profile: &Profile,
) -> Result<Option<Choice>> {
    let choice = match opt_z {
        Some(z) if !z.is_empty() => Some(Choice {
            path: PathBuf::from(z),
            automatic: false,
        }),
        Some(_) => auto_path(device, profile),
        None if should_do_undo(device, opened, resolved, profile) => auto_path(device, profile),
        None => None,
    };
    if let Some(c) = &choice {
        refuse_target(&c.path, device)?;
    }
    Ok(choice)
}

/// mke2fs's `should_do_undo`: group checksums and lazy inode tables (or
/// `force_undo`), and an ext2/3/4 magic at byte 1024 of the target (of
/// the device, not of `-E offset=`, as mke2fs reads it). The lazy inode
/// tables are those asked for: `-E assume_storage_prezeroed=1` turns
/// them on only after this (so with `lazy_itable_init=0` no undo file).
/// `opened`: the target already connected (an NBD export), read there.
fn should_do_undo(
    device: &Path,
    opened: Option<&dyn Device>,
    resolved: &Resolved,
    profile: &Profile,
) -> bool {
    let csum = resolved.params.features.has_group_csum();
    let force = profile.get_int(&resolved.fs_types, "force_undo", 0) != 0;
    // lazy_itable_init before assume_storage_prezeroed sets it: mke2fs
    // decides on the undo file first.
    if !force && (!csum || !resolved.lazy_itable_init_asked) {
        return false;
    }
    let mut magic = [0u8; 2];
    if let Some(d) = opened {
        return d.size() >= 1024 + 0x3a
            && d.read_at(&mut magic, 1024 + 0x38).is_ok()
            && magic == [0x53, 0xEF];
    }
    if ext4kit_device::is_device_uri(device) {
        // An NBD export: read through the protocol (a failed connection
        // is reported by the open that follows).
        return open_device(device, OpenOptions::read_only())
            .is_ok_and(|d| d.size() >= 1024 + 0x3a && d.read_at(&mut magic, 1024 + 0x38).is_ok())
            && magic == [0x53, 0xEF];
    }
    let Ok(f) = std::fs::File::open(device) else {
        return false;
    };
    use std::os::unix::fs::FileExt;
    f.read_exact_at(&mut magic, 1024 + 0x38).is_ok() && magic == [0x53, 0xEF]
}

/// `E2FSPROGS_UNDO_DIR`, `[defaults] undo_dir` or /var/lib/e2fsprogs,
/// when writable and not "none": `DIR/mke2fs-BASENAME.e2undo`.
fn auto_path(device: &Path, profile: &Profile) -> Option<Choice> {
    let dir: OsString = match std::env::var_os("E2FSPROGS_UNDO_DIR") {
        Some(d) => d,
        None => profile
            .get_value(&["defaults", "undo_dir"])
            .unwrap_or("/var/lib/e2fsprogs")
            .into(),
    };
    if dir.is_empty() || dir == "none" || !ext4kit_device::host::access_writable(Path::new(&dir)) {
        return None;
    }
    // An NBD URI by its export name (its "path" would end in the socket's
    // name), "nbd" for the default export.
    let uri = device
        .to_str()
        .filter(|_| ext4kit_device::is_device_uri(device))
        .and_then(|s| ext4kit_device::NbdUri::parse(s).ok());
    let base = match uri {
        Some(u) if u.export.is_empty() => OsString::from("nbd"),
        Some(u) => OsString::from(u.export.replace('/', "_")),
        None => device
            .file_name()
            .map(OsString::from)
            .unwrap_or_else(|| device.as_os_str().to_owned()),
    };
    let mut p = dir;
    p.push("/mke2fs-");
    p.push(base);
    p.push(".e2undo");
    Some(Choice {
        path: PathBuf::from(p),
        automatic: true,
    })
}

/// The undo file must not be the target (the same file, or the same
/// block device).
fn refuse_target(undo: &Path, device: &Path) -> Result<()> {
    let (Ok(u), Ok(d)) = (std::fs::metadata(undo), std::fs::metadata(device)) else {
        return Ok(());
    };
    let same_file = u.dev() == d.dev() && u.ino() == d.ino();
    let same_bdev =
        u.file_type().is_block_device() && d.file_type().is_block_device() && u.rdev() == d.rdev();
    if same_file || same_bdev {
        bail!(
            "{}: the undo file cannot be the target {} itself",
            undo.display(),
            device.display()
        );
    }
    if u.is_dir() {
        bail!(
            "{}: Is a directory while trying to open the undo file",
            undo.display()
        );
    }
    Ok(())
}

/// mke2fs's message (on stdout, also with -q).
pub fn announce(c: &Choice, dev_name: &str) {
    outln!(
        "Overwriting existing filesystem; this can be undone using the command:\n    e2undo {} {}\n",
        c.path.display(),
        dev_name
    );
}

/// Open the undo file before anything is written: `old_len` is what the
/// target held (from the filesystem's start). An existing file must match
/// the target (see [`UndoFile::open`]); an automatic one is deleted first.
/// `opened`: the target already connected (an NBD export): its old
/// content is read there.
pub fn open(
    c: &Choice,
    device: &Path,
    opened: Option<Arc<dyn Device>>,
    device_size: Option<u64>,
    prepared: &mkfs::Prepared,
) -> Result<UndoFile> {
    if c.automatic {
        match std::fs::remove_file(&c.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("{e} while trying to delete {}", c.path.display()),
        }
    }
    let offset = prepared.resolved.offset;
    let bs = prepared.layout.block_size;
    let params = UndoParams {
        block_size: block_size_for(bs),
        fs_block_size: bs,
        fs_offset: offset,
        old_len: device_size.unwrap_or(0).saturating_sub(offset),
    };
    let view: Option<Box<dyn Device>> = match device_size {
        Some(_) => {
            let d: Box<dyn Device> = match opened {
                Some(d) => Box::new(d),
                None => open_device(device, OpenOptions::read_only())?,
            };
            let v: Box<dyn Device> = if offset > 0 {
                Box::new(mkfs::OffsetDevice::new(d, offset))
            } else {
                d
            };
            Some(v)
        }
        None => None,
    };
    Ok(UndoFile::open(&c.path, view.as_deref(), params)?)
}

/// The target with its old content going into `file` first; the handle
/// is for [`finish`].
pub type Handle = Arc<UndoDevice<Box<dyn Device>>>;

pub fn wrap(dev: Box<dyn Device>, file: Option<UndoFile>) -> (Box<dyn Device>, Option<Handle>) {
    match file {
        Some(f) => {
            let u = Arc::new(UndoDevice::new(dev, f));
            (Box::new(Arc::clone(&u)), Some(u))
        }
        None => (dev, None),
    }
}

/// Mark the undo file complete, after the target's last write.
pub fn finish(h: &Option<Handle>) -> Result<()> {
    if let Some(u) = h {
        u.finish()?;
    }
    Ok(())
}

/// mke2fs's `s_kbytes_written` with an undo file (its cache is flushed
/// before each first write into an undo block).
pub fn adjust_kbytes(h: &Option<Handle>, p: &mut mkfs::Prepared) {
    let Some(u) = h else {
        return;
    };
    if p.layout.super_only || mkfs::journal_dev::is_journal_dev(&p.layout) {
        return;
    }
    p.settings.kbytes_written =
        mkfs::kbytes::mke2fs_kbytes_written_undo(&p.layout, &p.settings, u.undo_block_size());
}
