//! ext4kit's read-write ext4 engine.
//!
//! This first step holds journal recovery only ([`journal::recover`]): the
//! kernel's three-pass jbd2 replay, as a list of home writes that a
//! read-only caller can overlay in memory and a writer can apply.

pub mod journal;
