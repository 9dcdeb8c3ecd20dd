//! `ext4kit fstrim [-o OFFSET] [-l LEN] [-m MINLEN] [-v] [--json]
//! DEVICE|MOUNTPOINT`: discard the free space of an unmounted ext2/3/4
//! image or device, or of a mounted filesystem (util-linux fstrim's
//! options, FITRIM's semantics).
//!
//! Offline (DEVICE): a dirty journal is replayed first, as the other
//! write commands do. On image files only the free space the file still
//! holds is discarded (holes are skipped, so a second run finds nothing
//! to do); block devices cannot tell, so all free space in the range is
//! discarded. Nothing but the replay and the discards is written.
//!
//! Online (MOUNTPOINT, a directory): the `FITRIM` ioctl on it, as
//! util-linux fstrim issues it; an `ext4kit mount` answers it with the
//! same trim (groups trimmed before that freed nothing since are
//! skipped), and so does any kernel filesystem that supports it.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use ext4kit_device::{Device, OpenOptions};
use ext4kit_format::features::{Compat, Incompat};
use ext4kit_fs::balloc::BlockAlloc;
use ext4kit_fs::discard::{DiscardOptions, Discarder, Reconcile, TrimReport, TrimRequest};
use ext4kit_fs::groups::{DescTable, DirtySet, Layout};
use ext4kit_fs::journal::recover::{self, Journal};
use ext4kit_fs::sb::Volume;
use serde_json::json;

use crate::cmd_attr::parse_size;

#[derive(clap::Args, Debug)]
pub struct FstrimArgs {
    /// Byte offset in the filesystem to start at (K, M, G, KiB, MB... suffixes).
    #[arg(short = 'o', long = "offset", value_name = "OFFSET")]
    pub offset: Option<String>,
    /// Bytes to search for free space from the offset (default: to the end).
    #[arg(short = 'l', long = "length", value_name = "LENGTH")]
    pub length: Option<String>,
    /// Leave free extents shorter than this alone.
    #[arg(short = 'm', long = "minimum", value_name = "MINLEN")]
    pub minimum: Option<String>,
    /// Say how much was trimmed.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Image file or block device (not mounted), or the mount point of a
    /// mounted filesystem (an ext4kit mount or any that supports FITRIM).
    #[arg(value_name = "DEVICE|MOUNTPOINT")]
    pub device: PathBuf,
}

fn size_arg(v: &Option<String>, what: &str, default: u64) -> anyhow::Result<u64> {
    match v {
        None => Ok(default),
        Some(s) => parse_size(s).ok_or_else(|| anyhow!("invalid {what} value specified: '{s}'")),
    }
}

/// `15.5 GiB` (util-linux's size_to_human_string with a space).
fn human(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        let s = format!("{v:.1}");
        format!("{} {}", s.strip_suffix(".0").unwrap_or(&s), UNITS[u])
    }
}

/// Replay a dirty journal (the kernel's rule: needs_recovery and a
/// nonempty log); returns the transactions replayed.
fn replay_if_dirty(dev: &dyn Device) -> anyhow::Result<u32> {
    let sb = recover::read_superblock(dev)?;
    if !Compat(sb.s_feature_compat.get()).contains(Compat::HAS_JOURNAL)
        || !Incompat(sb.s_feature_incompat.get()).contains(Incompat::RECOVER)
    {
        return Ok(0);
    }
    let j = Journal::open(dev)?;
    if j.jsb.s_start.get() == 0 {
        return Ok(0);
    }
    let rec = recover::recover(dev, &j)?;
    recover::apply(dev, &j, &rec)?;
    Ok(rec.transactions())
}

/// Run `ext4kit fstrim`.
pub fn run(args: &FstrimArgs) -> anyhow::Result<i32> {
    let req = TrimRequest {
        start: size_arg(&args.offset, "offset", 0)?,
        len: size_arg(&args.length, "length", u64::MAX)?,
        minlen: size_arg(&args.minimum, "minimum", 0)?,
    };
    let path = &args.device;
    let p = path.display().to_string();
    if path.is_dir() {
        return online(args, &req, &p);
    }
    // Refuses a mounted device (or a file behind a mounted loop device)
    // and a device someone else holds exclusively.
    let dev: Arc<dyn Device> = Arc::from(crate::extjournal::open(path, OpenOptions::read_write())?);
    let allocated_before = dev.allocated_bytes();
    let (replayed, rep) = (|| -> anyhow::Result<(u32, TrimReport)> {
        // Validate before anything is written: superblock, features and
        // descriptors (a dirty journal replayed in memory), then the
        // layout; trim reads and checks every bitmap in the range before
        // its first discard.
        {
            let vol = Volume::open(&*dev)?;
            req.check(&Layout::from_superblock(&vol.info.sb)?)?;
        }
        let replayed = replay_if_dirty(&*dev)?;
        let vol = Volume::open(&*dev)?;
        let rd = &vol.blocks;
        let info = &vol.info;
        let bs = info.block_size;
        let layout = Layout::from_superblock(&info.sb)?;
        let blocks = layout.blocks_count;
        let descs = Arc::new(DescTable::new(layout));
        let alloc = Arc::new(BlockAlloc::open(
            rd,
            descs,
            Arc::new(DirtySet::default()),
            false,
        )?);
        let opts = DiscardOptions {
            reconcile: Reconcile::Off,
            ..DiscardOptions::default()
        };
        let d = Discarder::new(dev.clone(), alloc, bs, blocks, &opts)?;
        let r = d.trim(rd, &req);
        d.finish();
        let r = r?;
        dev.flush()?;
        Ok((replayed, r))
    })()
    .with_context(|| p.clone())?;
    let allocated_after = dev.allocated_bytes();
    if args.json {
        outln!(
            "{}",
            json!({
                "device": p,
                "replayed_transactions": replayed,
                "trimmed_bytes": rep.bytes,
                "requests": rep.requests,
                "free_bytes": rep.free_bytes,
                "groups": rep.groups,
                "groups_skipped": rep.groups_skipped,
                "failed": rep.failed,
                "unsupported": rep.unsupported,
                "allocation_known": rep.allocation_known,
                "allocated_bytes_before": allocated_before,
                "allocated_bytes_after": allocated_after,
            })
        );
    } else if args.verbose {
        outln!("{p}: {} ({} bytes) trimmed", human(rep.bytes), rep.bytes);
        let mut detail = format!(
            "{p}: {} groups, {} free in extents >= minimum, {} already unallocated",
            rep.groups,
            human(rep.free_bytes),
            rep.groups_skipped
        );
        if !rep.allocation_known {
            detail.push_str(" (the device cannot report allocation: all free space discarded)");
        }
        if let (Some(a), Some(b)) = (allocated_before, allocated_after) {
            detail.push_str(&format!("; allocated {} -> {}", human(a), human(b)));
        }
        if replayed > 0 {
            detail.push_str(&format!("; {replayed} journal transactions replayed first"));
        }
        outln!("{detail}");
    }
    if rep.unsupported {
        eprintln!("ext4kit fstrim: {p}: the discard operation is not supported");
        return Ok(1);
    }
    if rep.failed > 0 {
        eprintln!(
            "ext4kit fstrim: {p}: {} discard requests failed",
            rep.failed
        );
        return Ok(1);
    }
    Ok(0)
}

/// `FITRIM` on the mount point `p` (the reply says how many bytes were
/// trimmed).
fn online(args: &FstrimArgs, req: &TrimRequest, p: &str) -> anyhow::Result<i32> {
    let dir = std::fs::File::open(&args.device).with_context(|| p.to_string())?;
    let bytes = match ext4kit_device::host::fitrim(&dir, req.start, req.len, req.minlen) {
        Ok(n) => n,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::ENOSYS)
            ) =>
        {
            eprintln!("ext4kit fstrim: {p}: the discard operation is not supported");
            return Ok(1);
        }
        Err(e) => return Err(anyhow!("{p}: FITRIM ioctl failed: {e}")),
    };
    if args.json {
        outln!(
            "{}",
            json!({
                "mountpoint": p,
                "online": true,
                "trimmed_bytes": bytes,
            })
        );
    } else if args.verbose {
        outln!("{p}: {} ({bytes} bytes) trimmed", human(bytes));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
