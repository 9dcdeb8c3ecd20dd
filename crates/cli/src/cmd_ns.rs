//! `ext4kit mkdir [-p]` and `ext4kit rm [-r] [-f]` on unmounted images,
//! each operand one open/close (clean) and each change one transaction;
//! messages as coreutils prints them.

use std::ffi::OsString;

use anyhow::{anyhow, bail};
use ext4kit_format::inode::S_IFDIR;
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::inode::InodeInfo;

use crate::cmd_attr::open_rw;
use crate::cmd_ls::{Target, parse_target};

/// Split a path into its parent and last component (`None` for "/").
pub fn split_last(path: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
    let trimmed: &[u8] = {
        let mut p = path;
        while p.len() > 1 && p.ends_with(b"/") {
            p = &p[..p.len() - 1];
        }
        p
    };
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => {
            let parent = if i == 0 {
                b"/".to_vec()
            } else {
                trimmed[..i].to_vec()
            };
            let name = &trimmed[i + 1..];
            (parent, (!name.is_empty()).then(|| name.to_vec()))
        }
        None if trimmed.is_empty() => (b"/".to_vec(), None),
        None => (b"/".to_vec(), Some(trimmed.to_vec())),
    }
}

/// Resolve a directory path (symlinks followed).
pub fn resolve_dir(fs: &Filesystem, path: &[u8]) -> Result<InodeInfo, FsError> {
    let d = fs.read(|f| f.resolve(path, true))?;
    if !d.is_dir() {
        return Err(FsError::NotADirectory);
    }
    Ok(d)
}

/// The uid/gid new files get (the caller's, as the kernel gives them).
pub fn owner() -> (u32, u32) {
    // SAFETY-free: std exposes no getuid; /proc/self/status has it.
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let id = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (id("Uid:"), id("Gid:"))
}

/// Make directories in images.
#[derive(clap::Args, Debug)]
pub struct MkdirArgs {
    /// No error if existing, make parent directories as needed.
    #[arg(short = 'p', long = "parents")]
    pub parents: bool,
    /// Permission bits (octal, default 755).
    #[arg(short = 'm', long = "mode", value_name = "MODE")]
    pub mode: Option<String>,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

fn with_fs(t: &Target, f: impl FnOnce(&Filesystem) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let fs = open_rw(t)?;
    let r = f(&fs);
    let c = fs
        .close()
        .map_err(|e| anyhow!("{}: closing: {e}", t.img.display()));
    r.and(c)
}

/// Run `ext4kit mkdir`.
pub fn mkdir(args: &MkdirArgs) -> anyhow::Result<i32> {
    let perm = match &args.mode {
        Some(m) => crate::cmd_attr::apply_mode(m, 0o777, true)
            .ok_or_else(|| anyhow!("invalid mode '{m}'"))?,
        None => 0o755,
    };
    let (uid, gid) = owner();
    let mut failed = false;
    for arg in &args.targets {
        let t = parse_target(arg);
        let res = with_fs(&t, |fs| {
            let spec = NewInode::new(S_IFDIR | perm, uid, gid);
            let e = |e: FsError| anyhow!("cannot create directory '{}': {e}", t.spec);
            if args.parents {
                let mut cur = fs.read(|f| f.root()).map_err(e)?;
                for comp in t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
                    cur = match fs.lookup(cur.ino, comp).map_err(e)? {
                        Some(i) if i.is_dir() => i,
                        Some(i) if i.is_symlink() => {
                            fs.read(|f| f.resolve(&t.path, true)).map_err(e)?
                        }
                        Some(_) => return Err(e(FsError::NotADirectory)),
                        None => fs.mkdir(cur.ino, comp, &spec).map_err(e)?.0,
                    };
                }
                return Ok(());
            }
            let (parent, name) = split_last(&t.path);
            let Some(name) = name else {
                return Err(e(FsError::Exists));
            };
            let d = resolve_dir(fs, &parent).map_err(e)?;
            fs.mkdir(d.ino, &name, &spec).map_err(e)?;
            Ok(())
        });
        if let Err(e) = res {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            failed = true;
        }
    }
    Ok(i32::from(failed))
}

/// Remove files or directories from images.
#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// Remove directories and their contents recursively.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    pub recursive: bool,
    /// Ignore nonexistent files, never prompt.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// Remove empty directories.
    #[arg(short = 'd', long = "dir")]
    pub dir: bool,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// Remove everything below directory `dir`, then nothing else.
fn remove_tree(fs: &Filesystem, dir: &InodeInfo) -> Result<(), FsError> {
    let entries = fs.read(|f| f.read_dir(dir))?;
    for e in entries {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let i = fs.inode(e.ino)?;
        if i.is_dir() {
            remove_tree(fs, &i)?;
            fs.rmdir(dir.ino, &e.name)?;
        } else {
            fs.unlink(dir.ino, &e.name)?;
        }
    }
    Ok(())
}

/// Run `ext4kit rm`.
pub fn rm(args: &RmArgs) -> anyhow::Result<i32> {
    let mut failed = false;
    for arg in &args.targets {
        let t = parse_target(arg);
        let (parent, name) = split_last(&t.path);
        let Some(name) = name else {
            eprintln!("ext4kit: it is dangerous to operate recursively on '/'");
            failed = true;
            continue;
        };
        if name == b"." || name == b".." {
            eprintln!(
                "ext4kit: refusing to remove '.' or '..' directory: skipping '{}'",
                t.spec
            );
            failed = true;
            continue;
        }
        // Checked read-only first: a refused operand is never written.
        let pre = (|| -> anyhow::Result<bool> {
            let dev = crate::cmd_ls::open_image(&t)?;
            let vol = crate::cmd_ls::open_volume(&t, dev.as_ref())?;
            let fs = vol.fs();
            let e = |e: FsError| anyhow!("cannot remove '{}': {e}", t.spec);
            let d = fs.resolve(&parent, true).map_err(e)?;
            if !d.is_dir() {
                return Err(e(FsError::NotADirectory));
            }
            match fs.lookup(&d, &name).map_err(e)? {
                None if args.force => Ok(false),
                None => Err(e(FsError::NotFound)),
                Some(en) => {
                    let i = fs.inode(en.ino).map_err(e)?;
                    if i.is_dir() && !args.recursive && !args.dir {
                        bail!("cannot remove '{}': Is a directory", t.spec);
                    }
                    Ok(true)
                }
            }
        })();
        let go = match pre {
            Ok(g) => g,
            Err(e) => {
                eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
                failed = true;
                continue;
            }
        };
        if !go {
            continue;
        }
        let res = with_fs(&t, |fs| {
            let e = |e: FsError| anyhow!("cannot remove '{}': {e}", t.spec);
            let d = resolve_dir(fs, &parent).map_err(e)?;
            let i = fs
                .lookup(d.ino, &name)
                .map_err(e)?
                .ok_or_else(|| e(FsError::NotFound))?;
            if i.is_dir() {
                if args.recursive {
                    remove_tree(fs, &i).map_err(e)?;
                }
                fs.rmdir(d.ino, &name).map_err(e)?;
            } else {
                fs.unlink(d.ino, &name).map_err(e)?;
            }
            Ok(())
        });
        if let Err(e) = res {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            failed = true;
        }
    }
    Ok(i32::from(failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split() {
        assert_eq!(split_last(b"/a/b"), (b"/a".to_vec(), Some(b"b".to_vec())));
        assert_eq!(split_last(b"/a/b/"), (b"/a".to_vec(), Some(b"b".to_vec())));
        assert_eq!(split_last(b"/a"), (b"/".to_vec(), Some(b"a".to_vec())));
        assert_eq!(split_last(b"a"), (b"/".to_vec(), Some(b"a".to_vec())));
        assert_eq!(split_last(b"/"), (b"/".to_vec(), None));
    }
}
