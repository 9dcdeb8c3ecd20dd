//! The jbd2 journal of an ext4 filesystem: recovery ([`recover`](mod@recover)) and the
//! fast-commit area ([`fast_commit`]), the
//! writer (transactions in [`txn`], the log encoding and ring in [`log`],
//! [`commit`] and [`checkpoint`]).

pub mod checkpoint;
pub mod commit;
pub mod fast_commit;
pub mod fc_replay;
pub mod log;
pub mod recover;
pub mod txn;

pub use fast_commit::FcLog;
pub use recover::{
    HomeWrite, Journal, LogBlock, LogEntry, RecoverError, Recovery, TagInfo, apply, recover,
};
pub use txn::{FreedHook, Handle, JournalCsum, JournalOptions, JournalStats, JournalWriter};
