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
    /// Not enough free space (blocks or inodes).
    #[error("no space left: {wanted} wanted, {available} free")]
    NoSpace { wanted: u64, available: u64 },
    /// Enough space only counting blocks freed by transactions that have
    /// not committed yet (or whose discard is in flight): commit (or wait
    /// for the discards) and retry.
    #[error(
        "no space left until a commit: {wanted} wanted, {available} free, {busy} waiting for a commit or discard"
    )]
    SpaceBusy {
        wanted: u64,
        available: u64,
        busy: u64,
    },
    /// A caller's request that cannot be right (freeing free blocks, a
    /// group that does not exist).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A valid filesystem, journal or structure that the engine (or this
    /// part of it) does not handle; the message names the feature.
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// Multiple mount protection refused the open (the one line names
    /// the node that holds the device, see [`crate::mmp`]).
    #[error("{0}")]
    InUse(String),
    /// The journal was aborted by an earlier write error: no further
    /// changes are accepted (ext4's errors=remount-ro behaviour).
    #[error("the journal is aborted after an earlier error: {0}")]
    Aborted(String),
    /// A handle changed more distinct blocks than the credits it reserved.
    #[error("transaction handle exceeded its {0} block credits")]
    NoCredits(u32),
    /// One handle asked for more blocks than a transaction may hold.
    #[error("a handle of {wanted} blocks exceeds the largest transaction ({max} blocks)")]
    TooBig { wanted: u32, max: u32 },
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
    /// No room left in a structure: e.g. a directory index at its deepest
    /// level (ENOSPC).
    #[error("No space left on device ({0})")]
    StructureFull(String),
    /// rmdir of a directory with entries (ENOTEMPTY).
    #[error("Directory not empty")]
    NotEmpty,
    /// A link count at its limit (EMLINK).
    #[error("Too many links")]
    TooManyLinks,
    /// The inode's flags forbid the change: immutable or append-only
    /// (EPERM, as ext4 and the VFS answer).
    #[error("Operation not permitted ({0})")]
    NotPermitted(&'static str),
    /// The operation needs the encryption key of an encrypted file or
    /// directory, which the engine never has (ENOKEY, as fscrypt answers
    /// without the key: `fscrypt_require_key`, `fscrypt_prepare_*`).
    #[error("Required key not available ({0})")]
    NoKey(&'static str),
    /// A rename or link into a directory with PROJINHERIT of another
    /// project (EXDEV, as ext4's `ext4_rename` and `ext4_link`: the
    /// caller copies instead).
    #[error("Invalid cross-device link (into another project's directory)")]
    CrossProject,
    /// A write after an error made the filesystem read-only
    /// (errors=remount-ro behaviour; EROFS).
    #[error("Read-only file system (after an earlier error: {0})")]
    ReadOnly(String),
}

impl FsError {
    /// The errno a POSIX caller (the FUSE mount) reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotPermitted(_) => 1,   // EPERM
            FsError::NoKey(_) => 126,        // ENOKEY
            FsError::NotFound => 2,          // ENOENT
            FsError::NotADirectory => 20,    // ENOTDIR
            FsError::IsADirectory => 21,     // EISDIR
            FsError::SymlinkLoop => 40,      // ELOOP
            FsError::NotASymlink => 22,      // EINVAL
            FsError::Exists => 17,           // EEXIST
            FsError::NameTooLong => 36,      // ENAMETOOLONG
            FsError::InvalidName(_) => 22,   // EINVAL
            FsError::StructureFull(_) => 28, // ENOSPC
            FsError::NotEmpty => 39,         // ENOTEMPTY
            FsError::TooManyLinks => 31,     // EMLINK
            FsError::CrossProject => 18,     // EXDEV
            FsError::NoSpace { .. } => 28,   // ENOSPC
            FsError::SpaceBusy { .. } => 28, // ENOSPC (after waiting)
            FsError::Unsupported(_) => 95,   // EOPNOTSUPP
            FsError::InUse(_) => 16,         // EBUSY
            // EFSBADCRC (EBADMSG) for checksums, as ext4 returns them.
            FsError::Corrupt { detail, .. } if detail.contains("checksum") => 74,
            FsError::Corrupt { .. } => 117, // EUCLEAN (EFSCORRUPTED)
            FsError::BlockOutOfRange { .. } => 117, // EFSCORRUPTED
            FsError::ReadOnly(_) => 30,     // EROFS
            // ext4_journal_check_start: "Detected aborted journal".
            FsError::Aborted(_) => 30, // EROFS
            _ => 5,                    // EIO
        }
    }

    /// Is this a corrupt on-disk structure (what ext4 records in the
    /// superblock's error fields and acts on with `errors=`)?
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            FsError::Corrupt { .. } | FsError::BlockOutOfRange { .. }
        )
    }

    /// The `EXT4_ERR_*` code the superblock records for this error
    /// (`s_first_error_errcode`, `s_last_error_errcode`; e2p's names):
    /// EFSBADCRC (4) for a checksum mismatch, EFSCORRUPTED (5) for other
    /// corruption, EIO (2) for a device error, UNKNOWN (1) otherwise.
    pub fn ext4_errcode(&self) -> u8 {
        match self {
            FsError::Corrupt { detail, .. } if detail.contains("checksum") => 4,
            FsError::Corrupt { .. } | FsError::BlockOutOfRange { .. } => 5,
            FsError::Device(_) | FsError::Aborted(_) => 2,
            FsError::ReadOnly(_) => 8,
            FsError::NoSpace { .. } | FsError::SpaceBusy { .. } => 6,
            _ => 1,
        }
    }

    /// The inode and block a corruption error names, where its message
    /// does ("inode N", "block N"; a block out of range): what the
    /// superblock's `s_*_error_ino`/`_block` record. 0 when unknown.
    pub fn location(&self) -> (u32, u64) {
        match self {
            FsError::BlockOutOfRange { block, .. } => (0, *block),
            FsError::Corrupt { detail, .. } => (
                number_after(detail, "inode ")
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                number_after(detail, "block ").unwrap_or(0),
            ),
            _ => (0, 0),
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

/// The decimal number right after the first `key` in `s`.
fn number_after(s: &str, key: &str) -> Option<u64> {
    let i = s.find(key)? + key.len();
    let digits: String = s[i..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}
