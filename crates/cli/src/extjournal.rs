//! `--journal-path PATH`: the external journal device of the filesystem a
//! command opens (the kernel's `journal_path=` mount option; e2fsck and
//! debugfs call it `-j external_journal`). Given once on the command line
//! for every image tool; `ext4kit mount` also takes `-o journal_path=`.
//!
//! The journal device is opened like the filesystem (read-only for the
//! read tools, read-write and exclusive for the writers, refusing a
//! mounted or busy device) and joined with it
//! ([`ext4kit_device::WithJournal`]); the journal code checks that it is
//! the filesystem's journal before anything is written.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use ext4kit_device::{Device, OpenOptions, WithJournal, open_device};

static JOURNAL_PATH: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Remember `--journal-path` (once, from `main`).
pub fn set(path: Option<PathBuf>) {
    let _ = JOURNAL_PATH.set(path);
}

/// The `--journal-path` given, if any.
pub fn path() -> Option<&'static Path> {
    JOURNAL_PATH.get().and_then(|p| p.as_deref())
}

/// `dev` joined with the journal device of `--journal-path`, opened
/// like `opts`; `dev` itself without the option.
pub fn attach(dev: Box<dyn Device>, opts: OpenOptions) -> anyhow::Result<Box<dyn Device>> {
    let Some(p) = path() else {
        return Ok(dev);
    };
    let j: Arc<dyn Device> = Arc::from(open_device(p, opts)?);
    Ok(Box::new(WithJournal::new(Arc::from(dev), j)))
}

/// Open the filesystem at `path` (as `open_device`) with its journal
/// device when `--journal-path` was given.
pub fn open(path: &Path, opts: OpenOptions) -> anyhow::Result<Box<dyn Device>> {
    attach(open_device(path, opts)?, opts)
}
