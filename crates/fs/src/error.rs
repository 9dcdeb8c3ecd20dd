//! The engine's error type. Each message is one line that names the
//! problem; callers add the path or image name.

use ext4kit_device::DeviceError;

use crate::journal::RecoverError;

/// Why an engine operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// A read, write or flush of the device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The journal could not be replayed.
    #[error(transparent)]
    Recover(#[from] RecoverError),
    /// A block number at or past the end of the filesystem.
    #[error("block {block} is outside the filesystem ({count} blocks)")]
    BlockOutOfRange { block: u64, count: u64 },
    /// A metadata structure failed its checksum, magic or bounds check.
    #[error("corrupt {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    /// A feature or structure the engine does not handle (one line naming it).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A path component does not exist (ENOENT).
    #[error("No such file or directory")]
    NotFound,
    /// A path component used as a directory is not one (ENOTDIR).
    #[error("Not a directory")]
    NotADirectory,
    /// A directory where a file is needed (EISDIR).
    #[error("Is a directory")]
    IsADirectory,
    /// More than [`crate::path::MAX_SYMLINKS`] symlinks in one lookup (ELOOP).
    #[error("Too many levels of symbolic links")]
    SymlinkLoop,
    /// Not a symbolic link (EINVAL of readlink).
    #[error("Invalid argument (not a symbolic link)")]
    NotASymlink,
    /// A name that already exists in a directory (EEXIST).
    #[error("File exists")]
    Exists,
    /// A name longer than 255 bytes (ENAMETOOLONG).
    #[error("File name too long")]
    NameTooLong,
    /// An empty name, one with '/' or NUL, or `.`/`..` where a real
    /// entry is needed (EINVAL).
    #[error("Invalid argument ({0})")]
    InvalidName(&'static str),
    /// No room left: e.g. a directory index at its deepest level (ENOSPC).
    #[error("No space left on device ({0})")]
    NoSpace(String),
}

impl FsError {
    /// The errno a POSIX caller (the FUSE mount) reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => 2,         // ENOENT
            FsError::NotADirectory => 20,   // ENOTDIR
            FsError::IsADirectory => 21,    // EISDIR
            FsError::SymlinkLoop => 40,     // ELOOP
            FsError::NotASymlink => 22,     // EINVAL
            FsError::Exists => 17,          // EEXIST
            FsError::NameTooLong => 36,     // ENAMETOOLONG
            FsError::InvalidName(_) => 22,  // EINVAL
            FsError::NoSpace(_) => 28,      // ENOSPC
            FsError::Unsupported(_) => 95,  // EOPNOTSUPP
            FsError::Corrupt { .. } => 117, // EUCLEAN (EFSCORRUPTED)
            _ => 5,                         // EIO
        }
    }

    /// A [`FsError::Corrupt`] with a formatted detail.
    pub fn corrupt(what: &'static str, detail: impl Into<String>) -> Self {
        FsError::Corrupt {
            what,
            detail: detail.into(),
        }
    }
}
