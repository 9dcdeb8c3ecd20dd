//! `ext4kit cp [-r] [-a] SRC... DST`: copy between an unmounted image and
//! the host (e2tools' `e2cp`, with coreutils' messages).
//!
//! - Image to host (`IMG:PATH... HOSTDIR` or `IMG:PATH HOSTFILE`): read-only
//!   (a dirty journal is replayed in memory). Regular files, and with `-r`
//!   directories, symlinks (copied as symlinks inside a recursive copy or
//!   with `-a`), fifos and device nodes. `-a` keeps mode, owner (when
//!   allowed), times, xattrs (ACLs included, as the host accepts them),
//!   hard links and holes.
//! - Host to image: into an existing regular file of the image (its
//!   content replaced, one clean close); creating new names in an image
//!   needs the directory writer and is refused with a message until then.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use ext4kit_device::host;
use ext4kit_fs::FsError;
use ext4kit_fs::file::Content;
use ext4kit_fs::inode::{FileType, InodeInfo, Timestamp};
use ext4kit_fs::sb::Fs;

use crate::cmd_attr::{open_rw, resolve};
use crate::cmd_ls::{Target, access_error, open_image, open_volume, parse_target};

/// Copy files between images (IMG:PATH) and the host.
#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    pub recursive: bool,
    /// Archive: -r, and keep mode, owner, times, xattrs, hard links, holes.
    #[arg(short = 'a', long = "archive")]
    pub archive: bool,
    /// SRC... DST (IMG:PATH or host paths; one side must be an image).
    #[arg(value_name = "SRC... DST", required = true, num_args = 2..)]
    pub paths: Vec<OsString>,
}

/// Is `arg` an `IMG:PATH` operand (a ':' after an existing image file)?
fn image_operand(arg: &OsStr) -> Option<Target> {
    let b = arg.as_bytes();
    b.contains(&b':').then_some(())?;
    let t = parse_target(arg);
    (t.img.as_os_str().len() < b.len() && t.img.exists()).then_some(t)
}

/// Run `ext4kit cp`.
pub fn run(args: &CpArgs) -> anyhow::Result<i32> {
    let (dst, srcs) = args
        .paths
        .split_last()
        .ok_or_else(|| anyhow!("missing destination operand"))?;
    let recursive = args.recursive || args.archive;
    let dst_img = image_operand(dst);
    let mut failed = false;
    match dst_img {
        None => {
            let dst = PathBuf::from(dst);
            let into_dir = dst.is_dir();
            if srcs.len() > 1 && !into_dir {
                bail!("target '{}' is not a directory", dst.display());
            }
            for s in srcs {
                let Some(t) = image_operand(s) else {
                    eprintln!(
                        "ext4kit: '{}': neither side is an image (IMG:PATH); use cp",
                        s.to_string_lossy()
                    );
                    failed = true;
                    continue;
                };
                if let Err(e) = export(&t, &dst, into_dir, recursive, args.archive) {
                    eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
                    failed = true;
                }
            }
        }
        Some(t) => {
            if srcs.len() > 1 {
                bail!(
                    "copying several files into an image needs the directory writer (not available yet)"
                );
            }
            let src = PathBuf::from(&srcs[0]);
            if image_operand(&srcs[0]).is_some() {
                bail!("copying from one image to another is not supported: copy through the host");
            }
            if let Err(e) = import_into_existing(&src, &t) {
                eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
                failed = true;
            }
        }
    }
    Ok(i32::from(failed))
}

struct Export<'a> {
    fs: Fs<'a>,
    archive: bool,
    /// inode -> first host path (hard links with -a).
    links: HashMap<u32, PathBuf>,
}

fn export(
    t: &Target,
    dst: &Path,
    into_dir: bool,
    recursive: bool,
    archive: bool,
) -> anyhow::Result<()> {
    let dev = open_image(t)?;
    let vol = open_volume(t, dev.as_ref())?;
    let fs = vol.fs();
    let inode = fs
        .resolve(&t.path, !archive)
        .map_err(|e| access_error(&t.spec, &e))?;
    let name = t
        .path
        .rsplit(|&c| c == b'/')
        .find(|c| !c.is_empty())
        .unwrap_or(b"/");
    let target = if into_dir {
        dst.join(OsStr::from_bytes(name))
    } else {
        dst.to_path_buf()
    };
    if inode.is_dir() && !recursive {
        bail!("-r not specified; omitting directory '{}'", t.spec);
    }
    let mut ex = Export {
        fs,
        archive,
        links: HashMap::new(),
    };
    ex.copy(&inode, &t.spec, &target)
}

impl Export<'_> {
    fn copy(&mut self, inode: &InodeInfo, spec: &str, dst: &Path) -> anyhow::Result<()> {
        let fs = self.fs;
        if self.archive && !inode.is_dir() && inode.links > 1 {
            if let Some(first) = self.links.get(&inode.ino) {
                let _ = fs::remove_file(dst);
                fs::hard_link(first, dst)
                    .with_context(|| format!("cannot create hard link '{}'", dst.display()))?;
                return Ok(());
            }
            self.links.insert(inode.ino, dst.to_path_buf());
        }
        let err = |e: FsError| anyhow!("'{spec}': {e}");
        match inode.file_type() {
            FileType::Directory => {
                if !dst.is_dir() {
                    fs::create_dir(dst)
                        .with_context(|| format!("cannot create directory '{}'", dst.display()))?;
                }
                for e in fs.read_dir(inode).map_err(err)? {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    let child = fs.inode(e.ino).map_err(err)?;
                    let cspec = format!("{}/{}", spec.trim_end_matches('/'), e.name_lossy());
                    self.copy(&child, &cspec, &dst.join(OsStr::from_bytes(&e.name)))?;
                }
            }
            FileType::Regular => self.file(inode, spec, dst)?,
            FileType::Symlink => {
                let target = fs.read_link(inode).map_err(err)?;
                let _ = fs::remove_file(dst);
                symlink(OsStr::from_bytes(&target), dst)
                    .with_context(|| format!("cannot create symbolic link '{}'", dst.display()))?;
            }
            FileType::Fifo | FileType::CharDev | FileType::BlockDev | FileType::Socket => {
                special(inode, dst)?;
            }
            FileType::Unknown => bail!("'{spec}': unknown file type"),
        }
        if self.archive {
            self.attrs(inode, dst)?;
        } else if !inode.is_symlink() {
            let _ = fs::set_permissions(
                dst,
                fs::Permissions::from_mode(u32::from(inode.perm() & 0o777)),
            );
        }
        Ok(())
    }

    fn file(&self, inode: &InodeInfo, spec: &str, dst: &Path) -> anyhow::Result<()> {
        let fs = self.fs;
        let err = |e: FsError| anyhow!("'{spec}': {e}");
        let mut out = File::create(dst)
            .with_context(|| format!("cannot create regular file '{}'", dst.display()))?;
        let werr = |e: std::io::Error| anyhow!("error writing '{}': {e}", dst.display());
        match fs.content(inode).map_err(err)? {
            Content::Blocks(maps) if self.archive => {
                // Holes (and unwritten extents) stay holes.
                let bs = u64::from(fs.info.block_size);
                let mut buf = vec![0u8; 1 << 20];
                for m in maps.iter().filter(|m| !m.unwritten) {
                    let start = m.lblk * bs;
                    let end = (m.end() * bs).min(inode.size);
                    let mut off = start;
                    let content = Content::Blocks(vec![*m]);
                    while off < end {
                        let want = ((end - off) as usize).min(buf.len());
                        let n = fs
                            .read_at(inode, &content, off, &mut buf[..want])
                            .map_err(err)?;
                        if n == 0 {
                            break;
                        }
                        out.seek(SeekFrom::Start(off)).map_err(werr)?;
                        out.write_all(&buf[..n]).map_err(werr)?;
                        off += n as u64;
                    }
                }
                out.set_len(inode.size).map_err(werr)?;
            }
            _ => {
                let mut werr_slot = None;
                fs.read_each(inode, &mut |b| match out.write_all(b) {
                    Ok(()) => true,
                    Err(e) => {
                        werr_slot = Some(e);
                        false
                    }
                })
                .map_err(err)?;
                if let Some(e) = werr_slot {
                    return Err(werr(e));
                }
            }
        }
        Ok(())
    }

    fn attrs(&self, inode: &InodeInfo, dst: &Path) -> anyhow::Result<()> {
        // Owner first (it clears setuid bits), then mode, xattrs, times.
        // Like cp -a: ownership is kept when allowed.
        let _ = std::os::unix::fs::lchown(dst, Some(inode.uid), Some(inode.gid));
        if !inode.is_symlink() {
            fs::set_permissions(dst, fs::Permissions::from_mode(u32::from(inode.perm())))
                .with_context(|| format!("preserving permissions for '{}'", dst.display()))?;
        }
        for x in self.fs.xattrs(inode).unwrap_or_default() {
            // As cp -a: attributes the host refuses (trusted. without
            // root, security. labels) are skipped.
            let _ = host::set_xattr(dst, &x.name, &x.value);
        }
        let t = |t: Timestamp| (t.sec, t.nsec);
        host::set_times_nofollow(dst, t(inode.atime), t(inode.mtime))
            .with_context(|| format!("preserving times for '{}'", dst.display()))?;
        Ok(())
    }
}

fn special(inode: &InodeInfo, dst: &Path) -> anyhow::Result<()> {
    let _ = fs::remove_file(dst);
    let (ma, mi) = inode.rdev();
    let kind = match inode.file_type() {
        FileType::Fifo => libc::S_IFIFO,
        FileType::CharDev => libc::S_IFCHR,
        FileType::BlockDev => libc::S_IFBLK,
        _ => libc::S_IFSOCK,
    };
    host::mknod(dst, kind | u32::from(inode.perm() & 0o777), ma, mi)
        .with_context(|| format!("cannot create special file '{}'", dst.display()))
}

/// Host file -> an existing regular file of the image (content replaced).
fn import_into_existing(src: &Path, t: &Target) -> anyhow::Result<()> {
    let md = fs::metadata(src).with_context(|| format!("cannot stat '{}'", src.display()))?;
    if md.is_dir() {
        bail!(
            "copying directories into an image needs the directory writer (not available yet): '{}'",
            src.display()
        );
    }
    // Checked read-only first: a refused target is never written.
    {
        let dev = open_image(t)?;
        let vol = open_volume(t, dev.as_ref())?;
        match vol.fs().resolve(&t.path, true) {
            Ok(i) if i.is_regular() => {}
            Ok(i) if i.is_dir() => bail!(
                "'{}' is a directory: creating names in an image needs the directory writer (not available yet)",
                t.spec
            ),
            Ok(_) => bail!("cannot overwrite '{}': not a regular file", t.spec),
            Err(FsError::NotFound) => bail!(
                "cannot create '{}': creating names in an image needs the directory writer (not available yet)",
                t.spec
            ),
            Err(e) => return Err(access_error(&t.spec, &e)),
        }
    }
    let mut f =
        File::open(src).with_context(|| format!("cannot open '{}' for reading", src.display()))?;
    let fs = open_rw(t)?;
    let res = (|| -> anyhow::Result<()> {
        let inode = resolve(&fs, t)?;
        let e = |e: FsError| anyhow!("'{}': {e}", t.spec);
        fs.truncate(inode.ino, 0).map_err(e)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("error reading '{}'", src.display()))?;
            if n == 0 {
                break;
            }
            if buf[..n].iter().all(|&b| b == 0) {
                // Zeros stay a hole (the size is set at the end).
            } else {
                fs.write_at(inode.ino, off, &buf[..n]).map_err(e)?;
            }
            off += n as u64;
        }
        if fs.inode(inode.ino).map_err(e)?.size < off {
            fs.truncate(inode.ino, off).map_err(e)?;
        }
        Ok(())
    })();
    let c = fs
        .close()
        .with_context(|| format!("{}: closing", t.img.display()));
    res.and(c)
}
