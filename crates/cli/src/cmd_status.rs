//! `ext4kit status [--json] MOUNTPOINT`: what an `ext4kit mount` is doing
//! in the background (online lazy init: groups left, rate, pace, ETA;
//! with `-o discard` the discard queue and the reconciler that gives back
//! what an earlier crash or kill left undiscarded; the journal commits
//! made when the mount went idle and by `ext4kit sync`), read from the status
//! file the mount rewrites every second
//! (`ext4kit_fuse::mount::status_path`).

use std::path::PathBuf;

use anyhow::{Context, anyhow};

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The status as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where the filesystem is mounted (by `ext4kit mount`).
    pub mountpoint: PathBuf,
}

pub fn run(args: &StatusArgs) -> anyhow::Result<i32> {
    let shown = args.mountpoint.display().to_string();
    let mnt = args
        .mountpoint
        .canonicalize()
        .with_context(|| shown.clone())?;
    let path = ext4kit_fuse::mount::status_path(&mnt);
    let text = std::fs::read_to_string(&path).map_err(|_| {
        anyhow!(
            "{shown}: not served by a running `ext4kit mount` (no status at {})",
            path.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{shown}: unreadable status {}: {e}", path.display()))?;
    if args.json {
        outln!("{v}");
        return Ok(0);
    }
    let device = v["device"].as_str().unwrap_or("?");
    let pid = v["pid"].as_u64().unwrap_or(0);
    outln!("{shown}: {device} (ext4kit mount, pid {pid})");
    if let Some(t) = v["transport"].as_str() {
        outln!("transport: {t}");
    }
    match v["lazyinit"]["text"].as_str() {
        Some(t) => outln!("{t}"),
        None => outln!("lazy init: not running (noinit_itable or a read-only mount)"),
    }
    match v["discard"]["text"].as_str() {
        Some(t) => outln!("{t}"),
        None => outln!("discard: off (nodiscard or a read-only mount)"),
    }
    if let Some(t) = v["commits"]["text"].as_str() {
        outln!("{t}");
    }
    Ok(0)
}
