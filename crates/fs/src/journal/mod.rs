//! The jbd2 journal of an ext4 filesystem.

pub mod recover;

pub use recover::{
    HomeWrite, Journal, LogBlock, LogEntry, RecoverError, Recovery, TagInfo, apply, recover,
};
