//! `ext4kit sync MOUNTPOINT...`: make everything written to an `ext4kit
//! mount` before it durable, and return when it is.
//!
//! `sync(1)` cannot do that on a FUSE mount: the kernel writes its dirty
//! pages back to the daemon but does not forward `sync(2)`/`syncfs(2)`
//! itself (only virtiofs gets `FUSE_SYNCFS`), so the mount commits only
//! once it has been quiet for a few milliseconds (the idle commit). This
//! command first calls `syncfs(2)` on the path (the kernel's dirty pages,
//! with `-o writeback_cache`, reach the daemon), then sends the mount's
//! own ioctl (`ext4kit_fuse::idle::SYNC_IOCTL`) on it; the mount flushes
//! its write-behind buffer and commits the journal (data, log, commit
//! block, each flushed) before it replies.

use std::path::PathBuf;

use anyhow::{Context, anyhow};

#[derive(clap::Args, Debug)]
#[command(
    long_about = "Make everything written to an ext4kit mount before this command durable \
                  (the write-behind buffer flushed, the journal committed and flushed), and \
                  return when it is.\n\n\
                  sync(1) reaches a FUSE mount only as the kernel's writeback: the kernel \
                  does not forward sync(2)/syncfs(2) to the daemon, so there the mount \
                  commits a few milliseconds after it went quiet, and a kill in that window \
                  loses the change. This command waits for the commit itself. Any file or \
                  directory of the mount names it."
)]
pub struct SyncArgs {
    /// A mount point (or any file or directory) of an `ext4kit mount`.
    #[arg(value_name = "MOUNTPOINT", required = true)]
    pub paths: Vec<PathBuf>,
}

pub fn run(args: &SyncArgs) -> anyhow::Result<i32> {
    for path in &args.paths {
        let p = path.display().to_string();
        let f = std::fs::File::open(path).with_context(|| p.clone())?;
        ext4kit_device::host::syncfs(&f).map_err(|e| anyhow!("{p}: syncfs failed: {e}"))?;
        match ext4kit_device::host::ioctl_no_arg(&f, ext4kit_fuse::idle::SYNC_IOCTL) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTTY)
                        | Some(libc::EOPNOTSUPP)
                        | Some(libc::ENOSYS)
                        | Some(libc::EINVAL)
                ) =>
            {
                return Err(anyhow!(
                    "{p}: not an ext4kit mount (syncfs(2) done; the mount's commit is not \
                     available)"
                ));
            }
            Err(e) => return Err(anyhow!("{p}: commit failed: {e}")),
        }
    }
    Ok(0)
}
