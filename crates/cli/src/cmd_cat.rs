//! `ext4kit cat IMG:PATH...`: write files of an unmounted image to stdout
//! (symlinks followed; holes and unwritten extents read as zeros).
//! Read-only: a dirty journal is replayed in memory, never written.

use std::ffi::OsString;
use std::io::Write;

use anyhow::anyhow;
use ext4kit_fs::FsError;

use crate::cmd_ls::{access_error, open_image, open_volume, parse_target};

/// Concatenate files of ext2/3/4 images to standard output (read-only).
#[derive(clap::Args, Debug)]
pub struct CatArgs {
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// Run `ext4kit cat`.
pub fn run(args: &CatArgs) -> anyhow::Result<i32> {
    let stdout = std::io::stdout();
    let mut failed = false;
    for arg in &args.targets {
        let t = parse_target(arg);
        let mut write_err: Option<std::io::Error> = None;
        let res = (|| -> anyhow::Result<()> {
            let dev = open_image(&t)?;
            let vol = open_volume(&t, dev.as_ref())?;
            let fs = vol.fs();
            let inode = fs
                .resolve(&t.path, true)
                .map_err(|e| access_error(&t.spec, &e))?;
            if inode.is_dir() {
                return Err(anyhow!("'{}': {}", t.spec, FsError::IsADirectory));
            }
            let mut out = stdout.lock();
            fs.read_each(&inode, &mut |b| match out.write_all(b) {
                Ok(()) => true,
                Err(e) => {
                    write_err = Some(e);
                    false
                }
            })
            .map_err(|e| anyhow!("'{}': {e}", t.spec))?;
            if write_err.is_none()
                && let Err(e) = out.flush()
            {
                write_err = Some(e);
            }
            Ok(())
        })();
        if let Some(e) = write_err {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(crate::out::EXIT_BROKEN_PIPE);
            }
            return Err(anyhow!("writing to standard output: {e}"));
        }
        if let Err(e) = res {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            failed = true;
        }
    }
    Ok(i32::from(failed))
}
