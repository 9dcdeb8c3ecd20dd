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
    /// A valid filesystem (or journal) that the read-write engine does
    /// not handle; the message names the feature.
    #[error("unsupported for writing: {0}")]
    Unsupported(String),
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
}

impl FsError {
    /// A [`FsError::Corrupt`] with a formatted detail.
    pub fn corrupt(what: &'static str, detail: impl Into<String>) -> Self {
        FsError::Corrupt {
            what,
            detail: detail.into(),
        }
    }
}
