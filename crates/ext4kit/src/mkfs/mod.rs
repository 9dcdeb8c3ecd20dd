//! `mkfs`: options → plan (pure geometry) → writer → report.
//!
//! [`prepare`] validates everything and plans the layout without touching
//! the target; [`execute`] is the only step that writes.

pub mod badblocks;
pub mod blockset;
pub mod encoding;
pub mod geometry;
pub mod hugefiles;
pub mod journal_dev;
pub mod kbytes;
pub mod mmp;
pub mod offset;
pub mod options;
pub mod populate;
pub mod quota;
pub mod writer;

use ext4kit_device::{Device, DeviceError, DiscardOutcome};

pub use geometry::{FsParams, GeometryError, Layout, plan};
pub use offset::OffsetDevice;
pub use options::{Env, MkfsOptions, OptionError, Resolved, resolve};
pub use writer::{SuperSettings, WriteStats, Writer};

/// Errors of a mkfs run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MkfsError {
    #[error(transparent)]
    Option(#[from] OptionError),
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Write(#[from] writer::WriteError),
    #[error(transparent)]
    JournalDev(#[from] journal_dev::JournalDevError),
    #[error(transparent)]
    Populate(#[from] populate::PopulateError),
}

/// A validated, planned format, ready to execute.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub resolved: Resolved,
    pub layout: Layout,
    pub settings: SuperSettings,
}

/// Plan the filesystem. `discard_zeroes` says whether a discard of this
/// device is known to leave zeros (files: yes), which lets the inode
/// tables be claimed zeroed, as mke2fs does after a successful discard.
pub fn prepare(resolved: Resolved, discard_zeroes: bool) -> Result<Prepared, MkfsError> {
    let zeroed = resolved.assume_prezeroed || (resolved.discard && discard_zeroes);
    let mut params = resolved.params.clone();
    params.itable_zeroed = zeroed;
    if zeroed {
        params.lazy_itable_init = true;
    }
    let layout = plan(&params)?;
    let mut settings = resolved.settings.clone();
    settings.itable_zeroed = zeroed;
    settings.lazy_itable_init = params.lazy_itable_init;
    settings.kbytes_written = if journal_dev::is_journal_dev(&layout) {
        journal_dev::kbytes_written(&layout)
    } else {
        kbytes::mke2fs_kbytes_written(&layout)
    };
    Ok(Prepared {
        resolved,
        layout,
        settings,
    })
}

/// What a run did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Report {
    pub discarded: bool,
    pub itable_zeroed: bool,
    pub stats: WriteStats,
}

/// Write the prepared filesystem to `dev`: [`discard`] (when the options
/// ask for it), then [`write()`].
pub fn execute(dev: &dyn Device, prepared: Prepared) -> Result<Report, MkfsError> {
    let mut prepared = prepared;
    let discarded = if prepared.resolved.discard {
        discard(dev, &mut prepared)?
    } else {
        false
    };
    let mut report = write(dev, prepared)?;
    report.discarded = discarded;
    Ok(report)
}

/// mke2fs's discard before the format (first one block, then the whole
/// filesystem). Returns whether the device discarded. When the plan
/// assumed a zeroing discard that did not happen, it is re-planned without
/// the zeroed inode tables.
pub fn discard(dev: &dyn Device, prepared: &mut Prepared) -> Result<bool, MkfsError> {
    let bs = u64::from(prepared.layout.block_size);
    let len = (prepared.layout.blocks_count * bs).min(dev.size());
    let outcome = match dev.discard(0, bs.min(len)) {
        Ok(DiscardOutcome::Unsupported) | Err(_) => DiscardOutcome::Unsupported,
        Ok(_) => dev.discard(0, len).unwrap_or(DiscardOutcome::Unsupported),
    };
    tracing::debug!(?outcome, "discard before format");
    let zeroes = outcome == DiscardOutcome::Zeroed && dev.discard_zeroes_data();
    if prepared.settings.itable_zeroed && !prepared.resolved.assume_prezeroed && !zeroes {
        // The plan assumed a zeroing discard; it did not happen.
        *prepared = prepare(prepared.resolved.clone(), false)?;
    }
    Ok(outcome != DiscardOutcome::Unsupported)
}

/// Write the prepared filesystem to `dev` (no discard).
pub fn write(dev: &dyn Device, prepared: Prepared) -> Result<Report, MkfsError> {
    let Prepared {
        layout, settings, ..
    } = prepared;
    let mut report = Report {
        itable_zeroed: settings.itable_zeroed,
        ..Report::default()
    };
    let w = Writer {
        layout: &layout,
        settings: &settings,
    };
    tracing::debug!(
        groups = layout.group_count,
        blocks = layout.blocks_count,
        itable_zeroed = settings.itable_zeroed,
        "writing filesystem"
    );
    report.stats = w.write(dev)?;
    tracing::debug!(stats = ?report.stats, "format written");
    Ok(report)
}

/// `mkfs -d`: write the prepared filesystem with `tree` copied into it
/// (no discard): the writer's head, the copy, then the writer's body,
/// whose superblocks come last. Returns the report and what was copied.
pub fn write_populated(
    dev: &dyn Device,
    prepared: Prepared,
    tree: &populate::source::Tree,
    opts: &populate::PopulateOptions,
) -> Result<(Report, Prepared), MkfsError> {
    let Prepared {
        resolved,
        mut layout,
        mut settings,
    } = prepared;
    populate::check_layout(&layout)?;
    let mut report = Report {
        itable_zeroed: settings.itable_zeroed,
        ..Report::default()
    };
    let head = Writer {
        layout: &layout,
        settings: &settings,
    }
    .write_head(dev)?;
    populate::populate(dev, &mut layout, &settings, tree, opts)?;
    if let Some(p) = &layout.populated {
        settings.kbytes_written += p.bytes_written / 1024;
    }
    let body = Writer {
        layout: &layout,
        settings: &settings,
    }
    .write_body(dev)?;
    report.stats = head;
    report.stats.add(&body);
    if let Some(p) = &layout.populated {
        report.stats.bytes_written += p.bytes_written;
    }
    Ok((
        report,
        Prepared {
            resolved,
            layout,
            settings,
        },
    ))
}
