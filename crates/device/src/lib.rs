//! The device layer: everything ext4kit reads or writes goes through the
//! [`Device`] trait. Regular image files, block devices, an in-memory device,
//! a fault-injecting wrapper and a recording wrapper (record a workload's
//! writes once, cut the power at each of them offline) implement it.
//!
//! This is the only crate allowed to contain `unsafe` (ioctls); every such
//! block carries a `// SAFETY:` comment.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

mod blockdev;
mod delay;
mod extjournal;
mod fault;
mod file;
mod fuse_dev;
pub mod host;
#[cfg(test)]
mod loop_tests;
mod mem;
mod mounts;
mod nbd;
mod open;
mod ranges;
mod record;
mod sys;
mod sysfs;
pub mod uring_cmd;

pub use blockdev::BlockDevice;
pub use delay::{DelayControl, DelayDevice, DiscardRecord};
pub use extjournal::WithJournal;
pub use fault::{CutMode, FaultControl, FaultDevice, TEAR_SECTOR};
pub use file::FileDevice;
pub use fuse_dev::fuse_clone;
pub use mem::MemDevice;
pub use mounts::{MountEntry, check_not_mounted, loop_devices_backed_by, mounts};
pub use nbd::{NbdDevice, NbdUri};
pub use open::open_device;
pub use record::{CutReplay, RecordingDevice, Trace, TraceOp};
pub use sys::recv_fd;
pub use sysfs::backing_sysfs_dir;

/// Errors from the device layer.
///
/// Each message is complete on its own and names what it is about: the
/// OS error (`source`) is part of the text, so [`std::error::Error::source`]
/// is deliberately `None`. Reporting both (as `thiserror` does for a field
/// named `source`) made every chain-printing caller (`anyhow`'s `{:#}`)
/// say the OS error twice: "x: No such file or directory (os error 2):
/// No such file or directory (os error 2)". Use [`DeviceError::os_error`]
/// to look at the underlying `io::Error`.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceError {
    /// Opening (or inspecting) `path` failed; `source` says why (e.g.
    /// `NotFound`, `PermissionDenied`).
    Open { path: PathBuf, source: io::Error },
    /// `path` (or a loop device backed by it) is mounted; `on` is the mount
    /// point when known.
    Mounted { path: PathBuf, on: Option<String> },
    /// Exclusive open failed: the device is held by someone else (`EBUSY`
    /// for block devices, an `flock` held by another process for files).
    Busy { path: PathBuf },
    /// The path is neither a regular file nor a block device.
    NotADevice { path: PathBuf },
    /// A read, write, flush, zeroout or discard failed.
    Io {
        offset: u64,
        len: u64,
        source: io::Error,
    },
    /// The access does not fit inside the device.
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A mutating operation on a device that was opened read-only.
    ReadOnly { path: PathBuf },
    /// An NBD export (`server` is its URI) failed: the handshake, a
    /// request the server answered with an error, or the connection.
    Nbd { server: String, message: String },
    /// A fault injected by [`FaultDevice`].
    Injected(&'static str),
    /// Anything else.
    Other(String),
}

impl std::fmt::Display for DeviceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceError::Open { path, source } => write!(f, "{}: {source}", path.display()),
            DeviceError::Mounted { path, on } => {
                write!(f, "{} is mounted", path.display())?;
                match on {
                    Some(m) => write!(f, " on {m}"),
                    None => Ok(()),
                }
            }
            DeviceError::Busy { path } => write!(
                f,
                "{} is in use by another program (could not open it exclusively)",
                path.display()
            ),
            DeviceError::NotADevice { path } => {
                write!(f, "{}: not a regular file or block device", path.display())
            }
            DeviceError::Io {
                offset,
                len,
                source,
            } => write!(f, "I/O error at byte {offset} ({len} bytes): {source}"),
            DeviceError::OutOfRange { offset, len, size } => write!(
                f,
                "access beyond the end of the device (byte {offset}, {len} bytes, device size {size})"
            ),
            DeviceError::ReadOnly { path } => write!(f, "{} was opened read-only", path.display()),
            DeviceError::Nbd { server, message } => write!(f, "{server}: {message}"),
            DeviceError::Injected(what) => write!(f, "injected fault: {what}"),
            DeviceError::Other(msg) => f.write_str(msg),
        }
    }
}

/// No `source()`: the message already contains it (see [`DeviceError`]).
impl std::error::Error for DeviceError {}

impl DeviceError {
    /// The OS error behind an [`DeviceError::Open`] or [`DeviceError::Io`].
    pub fn os_error(&self) -> Option<&io::Error> {
        match self {
            DeviceError::Open { source, .. } | DeviceError::Io { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Shorthand for [`DeviceError::Io`].
    pub fn io(offset: u64, len: u64, source: io::Error) -> Self {
        DeviceError::Io {
            offset,
            len,
            source,
        }
    }
}

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// How to open a file or block device.
///
/// The default is read-only and not exclusive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Open for writing. Block devices opened for writing are always opened
    /// with `O_EXCL`; [`open_device`] refuses mounted devices when this is set.
    pub write: bool,
    /// Demand exclusive use: `O_EXCL` for block devices (also when read-only),
    /// a non-blocking `flock(LOCK_EX)` for regular files. Failure to get it is
    /// [`DeviceError::Busy`].
    pub exclusive: bool,
}

impl OpenOptions {
    /// Read-only, not exclusive.
    pub fn read_only() -> Self {
        OpenOptions {
            write: false,
            exclusive: false,
        }
    }

    /// Read-write and exclusive (what a tool that modifies a filesystem wants).
    pub fn read_write() -> Self {
        OpenOptions {
            write: true,
            exclusive: true,
        }
    }
}

/// Is `path` a device URI (`nbd://...`, `nbd+unix://...`) rather than a
/// path? [`open_device`] opens these as [`NbdDevice`]s; commands must not
/// look for them in the filesystem.
pub fn is_device_uri(path: impl AsRef<std::path::Path>) -> bool {
    path.as_ref().to_str().is_some_and(nbd::is_uri)
}

/// Check that `[offset, offset+len)` lies within a device of `size` bytes.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange { offset, len, size }),
    }
}

/// The system's memory page size (4096 when it cannot be read).
pub fn page_size() -> u32 {
    // SAFETY: sysconf only reads a system constant; no pointers involved.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// `ctime(3)` of `secs` in the local time zone, without the newline
/// ("Tue Dec  1 09:38:02 2026"), as e2fsprogs prints times; `None` when the
/// time cannot be converted.
pub fn ctime_local(secs: i64) -> Option<String> {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    #[allow(clippy::useless_conversion)] // time_t is i32 on some targets
    let t: libc::time_t = secs.try_into().ok()?;
    // SAFETY: `tm` is plain old data (all-zero is a valid value);
    // localtime_r reads `t` and writes only into `tm`, both live locals
    // borrowed for the duration of the call.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: see above; both pointers are valid and do not alias.
    let r = unsafe { libc::localtime_r(&t, &mut tm) };
    if r.is_null() {
        return None;
    }
    Some(format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS.get(usize::try_from(tm.tm_wday).ok()?)?,
        MONTHS.get(usize::try_from(tm.tm_mon).ok()?)?,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec,
        i64::from(tm.tm_year) + 1900
    ))
}

/// What a `discard` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscardOutcome {
    /// The range was discarded and now reads as zeros (hole punched, or the
    /// device guarantees zeroes after discard).
    Zeroed,
    /// The range was discarded; its content is now undefined.
    Discarded,
    /// The device does not support discard; nothing happened.
    Unsupported,
}

/// I/O hints of a block device (`BLKIOMIN`, `BLKIOOPT`, `BLKALIGNOFF`),
/// what libblkid's topology probe reports and mke2fs turns into
/// `stride`/`stripe_width`. Zero means "no hint".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoHints {
    /// Minimum I/O size in bytes.
    pub min_io: u32,
    /// Optimal I/O size in bytes.
    pub opt_io: u32,
    /// Alignment offset in bytes (-1 when the kernel says misaligned).
    pub alignment_offset: i64,
}

/// One device: a regular image file, a block device, memory, or a wrapper.
///
/// All offsets and lengths are in bytes. All methods take `&self` so that a
/// device can be shared between threads (positional I/O needs no cursor);
/// implementations use interior mutability where they need state.
pub trait Device: Send + Sync {
    /// Size of the device in bytes.
    fn size(&self) -> u64;

    /// Logical block (sector) size in bytes: 512 for files.
    fn logical_block_size(&self) -> u32 {
        512
    }

    /// Physical block (sector) size in bytes (`BLKPBSZGET`): the logical
    /// size unless the device says otherwise.
    fn physical_block_size(&self) -> u32 {
        self.logical_block_size()
    }

    /// I/O topology hints; `None` for anything but a block device (mke2fs
    /// asks for none on regular files).
    fn io_hints(&self) -> Option<IoHints> {
        None
    }

    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Write all of `buf` at `offset`. Not durable until [`Device::flush`].
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()>;

    /// Make every completed write durable (fdatasync / cache flush).
    fn flush(&self) -> Result<()>;

    /// Hint: start writing back `[offset, offset+len)` now, without
    /// waiting, so that a later [`Device::flush`] has less left to do.
    /// Durability still needs `flush`. Default: no-op.
    fn start_writeback(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Make `[offset, offset+len)` read as zeros, preferring ways that do not
    /// allocate storage: punch a hole in a file, BLKZEROOUT on a block
    /// device (which may unmap on thin storage), written zeros as last resort.
    fn zeroout(&self, offset: u64, len: u64) -> Result<()>;

    /// Discard (trim) `[offset, offset+len)`: punch hole on files,
    /// BLKDISCARD on block devices.
    fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome>;

    /// Does a successful discard guarantee the range reads back as zeros?
    /// (Files: yes. Block devices: what the kernel reports.)
    fn discard_zeroes_data(&self) -> bool {
        false
    }

    /// Ranges within `[offset, offset+len)` that are *proven* to read as
    /// zeros without reading them (holes of a sparse file). Sorted, disjoint.
    /// A device that cannot tell returns an empty list.
    fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
        let _ = (offset, len);
        Ok(Vec::new())
    }

    /// Does [`Device::known_zero_ranges`] report what the storage holds
    /// (every unallocated range shows as a hole), so that free space the
    /// device still holds can be found (image files, memory)? Block
    /// devices cannot tell (the default: `false`).
    fn reports_allocation(&self) -> bool {
        false
    }

    /// Is the whole range proven to read as zeros without reading it?
    fn is_known_zero(&self, offset: u64, len: u64) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        let r = self.known_zero_ranges(offset, len)?;
        Ok(r.len() == 1 && r[0].0 <= offset && r[0].1 >= offset.saturating_add(len))
    }

    /// Bytes of storage actually allocated (st_blocks × 512 for files);
    /// `None` when unknown.
    fn allocated_bytes(&self) -> Option<u64> {
        None
    }

    /// True for rotational (spinning) media, when known.
    fn is_rotational(&self) -> Option<bool> {
        None
    }

    /// A human-readable name (the path) for messages.
    fn name(&self) -> String;

    /// For a filesystem whose journal is on another device
    /// ([`WithJournal`]): the byte offset at which the journal device's
    /// bytes start in this device's address space (the filesystem device
    /// is `0..base`). `None` for every ordinary device.
    fn journal_base(&self) -> Option<u64> {
        None
    }
}

/// Inside an `impl Device for Wrapper` block: every [`Device`] method
/// *not* named in the list is forwarded to the field `self.$inner`; the
/// named ones are the wrapper's own (written next to the call) or, when
/// it does not write them, the trait's defaults. So a method added to
/// the trait is forwarded by every wrapper unless it says otherwise (the
/// `reports_allocation` gap of the hand-written wrappers cannot recur).
///
/// ```ignore
/// impl<D: Device> Device for Logging<D> {
///     ext4kit_device::forward_device!(inner; write_at, name);
///     fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> { ... }
///     fn name(&self) -> String { ... }
/// }
/// ```
#[macro_export]
macro_rules! forward_device {
    ($inner:ident; $($own:ident),* $(,)?) => {
        $crate::forward_device!(@pick size [$($own)*]
            fn size(&self) -> u64 { self.$inner.size() });
        $crate::forward_device!(@pick logical_block_size [$($own)*]
            fn logical_block_size(&self) -> u32 { self.$inner.logical_block_size() });
        $crate::forward_device!(@pick physical_block_size [$($own)*]
            fn physical_block_size(&self) -> u32 { self.$inner.physical_block_size() });
        $crate::forward_device!(@pick io_hints [$($own)*]
            fn io_hints(&self) -> Option<$crate::IoHints> { self.$inner.io_hints() });
        $crate::forward_device!(@pick read_at [$($own)*]
            fn read_at(&self, buf: &mut [u8], offset: u64) -> $crate::Result<()> {
                self.$inner.read_at(buf, offset)
            });
        $crate::forward_device!(@pick write_at [$($own)*]
            fn write_at(&self, buf: &[u8], offset: u64) -> $crate::Result<()> {
                self.$inner.write_at(buf, offset)
            });
        $crate::forward_device!(@pick flush [$($own)*]
            fn flush(&self) -> $crate::Result<()> { self.$inner.flush() });
        $crate::forward_device!(@pick start_writeback [$($own)*]
            fn start_writeback(&self, offset: u64, len: u64) -> $crate::Result<()> {
                self.$inner.start_writeback(offset, len)
            });
        $crate::forward_device!(@pick zeroout [$($own)*]
            fn zeroout(&self, offset: u64, len: u64) -> $crate::Result<()> {
                self.$inner.zeroout(offset, len)
            });
        $crate::forward_device!(@pick discard [$($own)*]
            fn discard(&self, offset: u64, len: u64) -> $crate::Result<$crate::DiscardOutcome> {
                self.$inner.discard(offset, len)
            });
        $crate::forward_device!(@pick discard_zeroes_data [$($own)*]
            fn discard_zeroes_data(&self) -> bool { self.$inner.discard_zeroes_data() });
        $crate::forward_device!(@pick known_zero_ranges [$($own)*]
            fn known_zero_ranges(&self, offset: u64, len: u64)
                -> $crate::Result<Vec<(u64, u64)>> {
                self.$inner.known_zero_ranges(offset, len)
            });
        $crate::forward_device!(@pick reports_allocation [$($own)*]
            fn reports_allocation(&self) -> bool { self.$inner.reports_allocation() });
        $crate::forward_device!(@pick is_known_zero [$($own)*]
            fn is_known_zero(&self, offset: u64, len: u64) -> $crate::Result<bool> {
                self.$inner.is_known_zero(offset, len)
            });
        $crate::forward_device!(@pick allocated_bytes [$($own)*]
            fn allocated_bytes(&self) -> Option<u64> { self.$inner.allocated_bytes() });
        $crate::forward_device!(@pick is_rotational [$($own)*]
            fn is_rotational(&self) -> Option<bool> { self.$inner.is_rotational() });
        $crate::forward_device!(@pick name [$($own)*]
            fn name(&self) -> String { self.$inner.name() });
        $crate::forward_device!(@pick journal_base [$($own)*]
            fn journal_base(&self) -> Option<u64> { self.$inner.journal_base() });
    };
    // `$m` is in the wrapper's own list: nothing generated.
    (@pick size [size $($r:ident)*] $f:item) => {};
    (@pick logical_block_size [logical_block_size $($r:ident)*] $f:item) => {};
    (@pick physical_block_size [physical_block_size $($r:ident)*] $f:item) => {};
    (@pick io_hints [io_hints $($r:ident)*] $f:item) => {};
    (@pick read_at [read_at $($r:ident)*] $f:item) => {};
    (@pick write_at [write_at $($r:ident)*] $f:item) => {};
    (@pick flush [flush $($r:ident)*] $f:item) => {};
    (@pick start_writeback [start_writeback $($r:ident)*] $f:item) => {};
    (@pick zeroout [zeroout $($r:ident)*] $f:item) => {};
    (@pick discard [discard $($r:ident)*] $f:item) => {};
    (@pick discard_zeroes_data [discard_zeroes_data $($r:ident)*] $f:item) => {};
    (@pick known_zero_ranges [known_zero_ranges $($r:ident)*] $f:item) => {};
    (@pick reports_allocation [reports_allocation $($r:ident)*] $f:item) => {};
    (@pick is_known_zero [is_known_zero $($r:ident)*] $f:item) => {};
    (@pick allocated_bytes [allocated_bytes $($r:ident)*] $f:item) => {};
    (@pick is_rotational [is_rotational $($r:ident)*] $f:item) => {};
    (@pick name [name $($r:ident)*] $f:item) => {};
    (@pick journal_base [journal_base $($r:ident)*] $f:item) => {};
    // Not this one: look at the rest of the list.
    (@pick $m:ident [$h:ident $($r:ident)*] $f:item) => {
        $crate::forward_device!(@pick $m [$($r)*] $f);
    };
    // Not in the list: forward.
    (@pick $m:ident [] $f:item) => { $f };
}

macro_rules! forward_device_impl {
    ($($ty:ty),*) => {$(
        impl<T: Device + ?Sized> Device for $ty {
            fn size(&self) -> u64 {
                (**self).size()
            }
            fn logical_block_size(&self) -> u32 {
                (**self).logical_block_size()
            }
            fn physical_block_size(&self) -> u32 {
                (**self).physical_block_size()
            }
            fn io_hints(&self) -> Option<IoHints> {
                (**self).io_hints()
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
                (**self).write_at(buf, offset)
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn start_writeback(&self, offset: u64, len: u64) -> Result<()> {
                (**self).start_writeback(offset, len)
            }
            fn zeroout(&self, offset: u64, len: u64) -> Result<()> {
                (**self).zeroout(offset, len)
            }
            fn discard(&self, offset: u64, len: u64) -> Result<DiscardOutcome> {
                (**self).discard(offset, len)
            }
            fn discard_zeroes_data(&self) -> bool {
                (**self).discard_zeroes_data()
            }
            fn known_zero_ranges(&self, offset: u64, len: u64) -> Result<Vec<(u64, u64)>> {
                (**self).known_zero_ranges(offset, len)
            }
            fn reports_allocation(&self) -> bool {
                (**self).reports_allocation()
            }
            fn is_known_zero(&self, offset: u64, len: u64) -> Result<bool> {
                (**self).is_known_zero(offset, len)
            }
            fn allocated_bytes(&self) -> Option<u64> {
                (**self).allocated_bytes()
            }
            fn is_rotational(&self) -> Option<bool> {
                (**self).is_rotational()
            }
            fn name(&self) -> String {
                (**self).name()
            }
            fn journal_base(&self) -> Option<u64> {
                (**self).journal_base()
            }
        }
    )*};
}

// Shared and boxed devices are devices too, so that e.g. a test can keep an
// `Arc<MemDevice>` while a `FaultDevice<Arc<MemDevice>>` is handed out.
forward_device_impl!(&T, Box<T>, Arc<T>);

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    /// A device whose every query has an answer no default gives.
    struct Probe {
        inner: MemDevice,
    }

    impl Device for Probe {
        forward_device!(inner; logical_block_size, physical_block_size, io_hints,
            discard_zeroes_data, reports_allocation, allocated_bytes, is_rotational, name);
        fn logical_block_size(&self) -> u32 {
            4096
        }
        fn physical_block_size(&self) -> u32 {
            8192
        }
        fn io_hints(&self) -> Option<IoHints> {
            Some(IoHints {
                min_io: 4096,
                opt_io: 65536,
                alignment_offset: 0,
            })
        }
        fn discard_zeroes_data(&self) -> bool {
            true
        }
        fn reports_allocation(&self) -> bool {
            true
        }
        fn allocated_bytes(&self) -> Option<u64> {
            Some(7)
        }
        fn is_rotational(&self) -> Option<bool> {
            Some(true)
        }
        fn name(&self) -> String {
            "probe".into()
        }
    }

    fn answers(
        d: &dyn Device,
    ) -> (
        u32,
        u32,
        Option<IoHints>,
        bool,
        bool,
        Option<u64>,
        Option<bool>,
    ) {
        (
            d.logical_block_size(),
            d.physical_block_size(),
            d.io_hints(),
            d.discard_zeroes_data(),
            d.reports_allocation(),
            d.allocated_bytes(),
            d.is_rotational(),
        )
    }

    /// Every wrapper answers the device's queries as the device does
    /// (what [`forward_device`] forwards unless a wrapper says otherwise).
    #[test]
    fn wrappers_forward_every_query() {
        let want = answers(&Probe {
            inner: MemDevice::new(1 << 20),
        });
        assert_eq!(want.0, 4096);
        let probe = || Probe {
            inner: MemDevice::new(1 << 20),
        };
        assert_eq!(answers(&RecordingDevice::new(probe())), want);
        assert_eq!(answers(&DelayDevice::new(probe())), want);
        assert_eq!(answers(&FaultDevice::new(probe())), want);
        assert_eq!(answers(&Arc::new(probe())), want);
        assert_eq!(RecordingDevice::new(probe()).size(), 1 << 20);
    }

    /// The OS error is said once: in the message, not again as a source
    /// (chain printers such as anyhow's `{:#}` print both).
    #[test]
    fn os_error_is_not_repeated_by_chain_printers() {
        let e = open_device("/nonexistent-ext4kit/x.img", OpenOptions::read_only())
            .err()
            .expect("a missing path must not open");
        assert!(e.source().is_none());
        assert_eq!(
            e.os_error().map(io::Error::kind),
            Some(io::ErrorKind::NotFound)
        );
        let msg = e.to_string();
        assert!(msg.starts_with("/nonexistent-ext4kit/x.img: "), "{msg}");
        assert_eq!(msg.matches("os error 2").count(), 1, "{msg}");
        let io = DeviceError::io(4096, 512, io::Error::from_raw_os_error(libc::EIO));
        assert!(io.source().is_none());
        assert_eq!(io.to_string().matches("os error 5").count(), 1);
    }
}
