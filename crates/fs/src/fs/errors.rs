//! Errors met by operations, recorded as ext4 records them.
//!
//! Every public operation of [`Filesystem`] runs inside [`Filesystem::guard`]:
//! when the outermost one fails with a corrupt structure
//! ([`FsError::is_corruption`]), the error goes to
//! [`RwFs::record_error`](crate::rw::RwFs::record_error) (the superblock's
//! error fields; errors=remount-ro stops further writes) with the
//! operation's name, its line and its inode (the inode and block the error
//! message names win). The operation still fails with the corruption
//! (EFSCORRUPTED for the mount). Nested operations (an unlink that deletes
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
        let r = {
            let _level = Level;
            f()
        };
        if outer
            && let Err(e) = &r
            && let Some(fe) = e.fs_error()
        {
            self.note_error(func, line, ino, fe);
        }
        r
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
