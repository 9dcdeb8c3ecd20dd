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
    /// A filesystem feature this part of the engine does not handle.
    #[error("unsupported filesystem feature: {what}")]
    Unsupported { what: String },
    /// A caller's request that cannot be right (freeing free blocks, a
    /// group that does not exist).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
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
