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
