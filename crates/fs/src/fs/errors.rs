//! Errors met by operations, recorded as ext4 records them.
//!
//! Every public operation of [`Filesystem`] runs inside [`Filesystem::guard`]:
//! when the outermost one fails with a corrupt structure
//! ([`FsError::is_corruption`]), the error goes to
//! [`RwFs::record_error`](crate::rw::RwFs::record_error) (the superblock's
//! error fields; errors=remount-ro stops further writes) with the
//! operation's name, its line and its inode (the inode and block the error
//! message names win). The operation still fails with the corruption
//! (EFSCORRUPTED for the mount). An operation whose failure aborted the
//! journal (any error after its handle changed blocks) is recorded the
//! same way, with that error. Nested operations (an unlink that deletes
//! the inode, an open that processes orphans) record once: a thread-local
//! depth tells the outermost call.

use std::cell::Cell;
use std::panic::Location;

use crate::FsError;
use crate::rw::ErrorRecord;
use crate::xattr_write::XattrError;

use super::Filesystem;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// An operation's error type that may carry an [`FsError`].
pub trait OpError {
    /// The engine error inside, if any.
    fn fs_error(&self) -> Option<&FsError>;
}

impl OpError for FsError {
    fn fs_error(&self) -> Option<&FsError> {
        Some(self)
    }
}

impl OpError for XattrError {
    fn fs_error(&self) -> Option<&FsError> {
        match self {
            XattrError::Fs(e) => Some(e),
            _ => None,
        }
    }
}

/// Leaves one guard level, also when the operation unwinds.
struct Level;

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

impl Filesystem {
    /// Run operation `func` on inode `ino`; a corruption it fails with is
    /// recorded (see the module docs).
    #[track_caller]
    pub(crate) fn guard<T, E: OpError>(
        &self,
        func: &'static str,
        ino: u32,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let line = Location::caller().line();
        let outer = DEPTH.with(|d| {
            let v = d.get();
            d.set(v + 1);
            v == 0
        });
        let live = outer && self.rw().journal().aborted().is_none();
        let r = {
            let _level = Level;
            f()
        };
        if outer
            && let Err(e) = &r
            && let Some(fe) = e.fs_error()
        {
            if live && self.rw().journal().aborted().is_some() {
                self.note_abort(func, line, ino, fe);
            } else {
                self.note_error(func, line, ino, fe);
            }
        }
        r
    }

    /// The operation `func` (at `line`, on inode `ino`) failed with `e`
    /// and the journal was live when it began and is aborted now: its
    /// handle failed ([`crate::journal::Handle::fail`]: a half operation
    /// must not commit) or a commit it waited for did. Recorded, with the
    /// error that caused it, as the kernel's `ext4_journal_abort_handle`
    /// and `__ext4_std_error` record it at that point (not later by
    /// whichever operation meets the aborted journal next); the
    /// filesystem is read-only from now on.
    fn note_abort(&self, func: &str, line: u32, ino: u32, e: &FsError) {
        if self.rw().read_only().is_some() {
            return;
        }
        let rec = ErrorRecord::of(e, func, line, ino);
        self.rw().record_error(&rec, e);
    }

    /// Record `e` if it is a corruption (met by `func` at `line` working
    /// on inode `ino`), or the first operation to meet an aborted journal
    /// (the kernel's "Detected aborted journal": EIO, read-only from then
    /// on). For callers that meet errors outside the operations, e.g. in
    /// a [`Filesystem::read`] closure (readdir).
    pub fn note_error(&self, func: &str, line: u32, ino: u32, e: &FsError) {
        let aborted = matches!(e, FsError::Aborted(_)) && self.rw().read_only().is_none();
        if !e.is_corruption() && !aborted {
            return;
        }
        let rec = ErrorRecord::of(e, func, line, ino);
        self.rw().record_error(&rec, e);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use ext4kit_device::{Device, DeviceError, MemDevice};
    use ext4kit_format::inode::S_IFREG;
    use ext4kit_format::superblock::{STATE_ERROR, SUPERBLOCK_OFFSET, Superblock};

    use crate::FsError;
    use crate::balloc::tests::image;
    use crate::fs::{Filesystem, NewInode};
    use crate::rw::{ErrorRecord, RwOptions};

    /// Passes everything through, except that the next device write after
    /// [`FailOnce::arm`] fails (once).
    struct FailOnce {
        inner: Arc<MemDevice>,
        armed: AtomicBool,
    }

    impl Device for FailOnce {
        ext4kit_device::forward_device!(inner; write_at);
        fn write_at(&self, buf: &[u8], offset: u64) -> ext4kit_device::Result<()> {
            if self.armed.swap(false, Ordering::SeqCst) {
                return Err(DeviceError::Injected("one failed write"));
            }
            self.inner.write_at(buf, offset)
        }
    }

    fn superblock(mem: &MemDevice) -> Superblock {
        let mut raw = vec![0u8; 1024];
        mem.read_at(&mut raw, SUPERBLOCK_OFFSET).unwrap();
        Superblock::parse(&raw).unwrap()
    }

    fn c_str(b: &[u8]) -> String {
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// A write whose data fails to reach the device fails its handle,
    /// which aborts the journal: that write is what the superblock
    /// records (function, inode, EIO), at once, and the filesystem is
    /// read-only from then on (before, nothing was recorded until the
    /// next operation met the aborted journal, under its own name).
    #[test]
    fn the_operation_whose_failure_aborts_the_journal_is_recorded() {
        let mem = Arc::new(image(16 << 20, &[]));
        let dev = Arc::new(FailOnce {
            inner: mem.clone(),
            armed: AtomicBool::new(false),
        });
        let fs = Filesystem::open(dev.clone() as Arc<dyn Device>, RwOptions::default()).unwrap();
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        let (f, _) = fs.create(2, b"f", &spec).unwrap();
        fs.sync().unwrap();
        assert_eq!(superblock(&mem).s_error_count.get(), 0);
        // The ordered data write is the first device write of write_at.
        dev.armed.store(true, Ordering::SeqCst);
        let e = fs.write_at(f.ino, 0, &[7u8; 8192]).unwrap_err();
        assert!(matches!(e, FsError::Device(_)), "{e:?}");
        assert!(fs.rw().journal().aborted().is_some());
        let why = fs.rw().read_only().expect("read-only after the abort");
        assert!(why.contains("one failed write"), "{why}");
        let sb = superblock(&mem);
        assert_ne!(sb.s_state.get() & STATE_ERROR, 0);
        assert_eq!(sb.s_error_count.get(), 1);
        assert_eq!(c_str(&sb.s_first_error_func), "write_at");
        assert_eq!(sb.s_first_error_ino.get(), f.ino);
        assert_eq!(sb.s_first_error_errcode, 2, "EIO");
        assert_ne!(sb.s_first_error_line.get(), 0);
        // The next change is refused, and not recorded again.
        let e = fs.create(2, b"g", &spec).unwrap_err();
        assert!(matches!(e, FsError::ReadOnly(_)), "{e:?}");
        assert!(fs.lookup(2, b"f").unwrap().is_some());
        fs.close().unwrap();
        assert_eq!(superblock(&mem).s_error_count.get(), 1);
    }

    /// A file unlinked while open (an orphan, link count 0) is no
    /// corruption: its xattrs can be read and set, and its last close
    /// frees it with its xattr block. Before, setting one failed with
    /// EFSCORRUPTED and recorded an error, and the release of an orphan
    /// with an xattr block aborted the journal ("deleted inode
    /// referenced"): the filesystem went read-only on a close.
    #[test]
    fn an_orphan_with_an_xattr_block_is_no_corruption() {
        use crate::xattr_write::SetMode;
        let mem = Arc::new(image(16 << 20, &[]));
        let fs = Filesystem::open(mem.clone() as Arc<dyn Device>, RwOptions::default()).unwrap();
        let free0 = (
            fs.block_alloc().free_blocks(),
            fs.inode_alloc().free_inodes(),
        );
        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
        // One with an xattr block (too large for the inode), released.
        let (a, _) = fs.create(2, b"a", &spec).unwrap();
        fs.write_at(a.ino, 0, b"data").unwrap();
        fs.set_xattr(a.ino, b"user.big", Some(&[7u8; 600]), SetMode::Any)
            .unwrap();
        assert_ne!(fs.inode(a.ino).unwrap().file_acl, 0);
        assert!(fs.unlink_open(2, b"a").unwrap().1);
        fs.release_orphan(a.ino).unwrap();
        assert!(fs.rw().read_only().is_none(), "{:?}", fs.rw().read_only());
        assert!(fs.rw().journal().aborted().is_none());
        // One whose xattrs are set and read while it is an orphan.
        let (b, _) = fs.create(2, b"b", &spec).unwrap();
        assert!(fs.unlink_open(2, b"b").unwrap().1);
        fs.set_xattr(b.ino, b"user.big", Some(&[8u8; 600]), SetMode::Any)
            .unwrap();
        fs.set_xattr(b.ino, b"user.small", Some(b"x"), SetMode::Any)
            .unwrap();
        let names: Vec<Vec<u8>> = fs
            .xattrs(b.ino)
            .unwrap()
            .into_iter()
            .map(|x| x.name)
            .collect();
        assert!(names.contains(&b"user.big".to_vec()), "{names:?}");
        assert!(names.contains(&b"user.small".to_vec()), "{names:?}");
        fs.release_orphan(b.ino).unwrap();
        assert!(fs.rw().read_only().is_none(), "{:?}", fs.rw().read_only());
        fs.sync().unwrap();
        assert_eq!(
            (
                fs.block_alloc().free_blocks(),
                fs.inode_alloc().free_inodes()
            ),
            free0
        );
        fs.close().unwrap();
        let sb = superblock(&mem);
        assert_eq!(sb.s_error_count.get(), 0);
        assert_eq!(sb.s_state.get() & STATE_ERROR, 0);
    }

    /// The line an error is logged with names the function, line, inode,
    /// block and the error, then what happens.
    #[test]
    fn the_error_line_names_operation_inode_and_error() {
        let e = FsError::corrupt("extent tree", "inode 12: block 345: bad magic");
        let rec = ErrorRecord::of(&e, "write_at", 77, 0);
        let m = rec.message(&e, "read-only from now on");
        assert_eq!(
            m,
            "write_at:77: inode #12: block 345: corrupt extent tree: inode 12: block 345: bad magic; read-only from now on"
        );
        assert!(!m.contains('\n'));
        let e = FsError::NoCredits(9);
        let m = ErrorRecord::of(&e, "truncate", 5, 40).message(&e, "x");
        assert_eq!(
            m,
            "truncate:5: inode #40: transaction handle exceeded its 9 block credits; x"
        );
    }
}
