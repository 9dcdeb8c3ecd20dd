//! `ext4kit cp [-r] [-a] SRC... DST`: copy between an unmounted image and
//! the host (e2tools' `e2cp`, with coreutils' messages).
//!
//! - Image to host (`IMG:PATH... HOSTDIR` or `IMG:PATH HOSTFILE`): read-only
//!   (a dirty journal is replayed in memory). Regular files, and with `-r`
//!   directories, symlinks (copied as symlinks inside a recursive copy or
//!   with `-a`), fifos and device nodes. `-a` keeps mode, owner (when
//!   allowed), times, xattrs (ACLs included, as the host accepts them),
//!   hard links and holes.
//! - Host to image (`HOST... IMG:DIR` or `HOST IMG:PATH`): files
//!   (zeros stay holes), with `-r` directories, symlinks, fifos, sockets
//!   and devices; an existing file is overwritten. `-a` keeps mode,
//!   owner, times (ns), xattrs and hard links. One open and clean close
//!   per command, each file's creation its own transaction.

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

use crate::cmd_attr::open_rw;
use crate::cmd_ls::{Target, access_error, open_image, open_volume, parse_target};
use crate::cmd_ns::{resolve_dir, split_last};
use ext4kit_fs::fs::{Filesystem, NewInode, SetAttr, Times};

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
    (t.img.as_os_str().len() < b.len() && (t.img.exists() || ext4kit_device::is_device_uri(&t.img)))
        .then_some(t)
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
            if srcs.iter().any(|s| image_operand(s).is_some()) {
                bail!("copying from one image to another is not supported: copy through the host");
            }
            if let Err(e) = import(srcs, &t, recursive, args.archive) {
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

/// Where a host source goes in the image.
struct Import<'a> {
    fs: &'a Filesystem,
    archive: bool,
    uid: u32,
    gid: u32,
    /// (host dev, host ino) -> image inode (hard links with -a).
    links: HashMap<(u64, u64), u32>,
}

/// Host -> image: `srcs` into `t` (an existing directory, or a new or
/// existing file name for one source).
fn import(srcs: &[OsString], t: &Target, recursive: bool, archive: bool) -> anyhow::Result<()> {
    // Checked read-only first: a refused target is never written.
    let into_dir = {
        let dev = open_image(t)?;
        let vol = open_volume(t, dev.as_ref())?;
        let fs = vol.fs();
        match fs.resolve(&t.path, true) {
            Ok(i) if i.is_dir() => true,
            Ok(i) if srcs.len() == 1 && i.is_regular() => false,
            Ok(_) if srcs.len() > 1 => bail!("target '{}' is not a directory", t.spec),
            Ok(_) => bail!("cannot overwrite '{}': not a regular file", t.spec),
            Err(FsError::NotFound) if srcs.len() == 1 => {
                let (parent, name) = split_last(&t.path);
                if name.is_none() {
                    bail!("cannot create '{}'", t.spec);
                }
                match fs.resolve(&parent, true) {
                    Ok(d) if d.is_dir() => false,
                    Ok(_) => return Err(access_error(&t.spec, &FsError::NotADirectory)),
                    Err(e) => return Err(anyhow!("cannot create regular file '{}': {e}", t.spec)),
                }
            }
            Err(FsError::NotFound) => bail!("target '{}' is not a directory", t.spec),
            Err(e) => return Err(access_error(&t.spec, &e)),
        }
    };
    for s in srcs {
        let p = Path::new(s);
        let md =
            fs::symlink_metadata(p).with_context(|| format!("cannot stat '{}'", p.display()))?;
        if md.is_dir() && !recursive {
            bail!("-r not specified; omitting directory '{}'", p.display());
        }
    }
    let fs = open_rw(t)?;
    let (uid, gid) = crate::cmd_ns::owner();
    let mut im = Import {
        fs: &fs,
        archive,
        uid,
        gid,
        links: HashMap::new(),
    };
    let res = (|| -> anyhow::Result<()> {
        let e = |e: FsError| anyhow!("'{}': {e}", t.spec);
        for s in srcs {
            let p = Path::new(s);
            let (dir, name) = if into_dir {
                let d = resolve_dir(&fs, &t.path).map_err(e)?;
                let base = p
                    .file_name()
                    .ok_or_else(|| anyhow!("cannot copy '{}': no file name", p.display()))?;
                (d.ino, base.as_bytes().to_vec())
            } else {
                let (parent, name) = split_last(&t.path);
                let d = resolve_dir(&fs, &parent).map_err(e)?;
                (d.ino, name.unwrap_or_default())
            };
            im.copy_in(p, dir, &name)?;
        }
        Ok(())
    })();
    let c = fs
        .close()
        .with_context(|| format!("{}: closing", t.img.display()));
    res.and(c)
}

impl Import<'_> {
    fn copy_in(&mut self, src: &Path, dir: u32, name: &[u8]) -> anyhow::Result<()> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let fs = self.fs;
        let shown = || String::from_utf8_lossy(name).into_owned();
        let e = |e: FsError| anyhow!("cannot create '{}': {e}", shown());
        let md = fs::symlink_metadata(src)
            .with_context(|| format!("cannot stat '{}'", src.display()))?;
        let ft = md.file_type();
        let perm = (md.mode() & 0o7777) as u16;
        let (uid, gid) = if self.archive {
            (md.uid(), md.gid())
        } else {
            (self.uid, self.gid)
        };
        let existing = fs.lookup(dir, name).map_err(e)?;
        if self.archive
            && !ft.is_dir()
            && md.nlink() > 1
            && let Some(&ino) = self.links.get(&(md.dev(), md.ino()))
        {
            if existing.is_some() {
                fs.unlink(dir, name).map_err(e)?;
            }
            fs.link(ino, dir, name).map_err(e)?;
            return Ok(());
        }
        use ext4kit_format::inode::{S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFREG, S_IFSOCK};
        let ino = if ft.is_dir() {
            let d = match existing {
                Some(i) if i.is_dir() => i,
                Some(_) => bail!(
                    "cannot overwrite non-directory '{}' with a directory",
                    shown()
                ),
                None => {
                    fs.mkdir(dir, name, &NewInode::new(S_IFDIR | perm, uid, gid))
                        .map_err(e)?
                        .0
                }
            };
            let mut kids: Vec<_> = fs::read_dir(src)
                .with_context(|| format!("cannot open directory '{}'", src.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading directory '{}'", src.display()))?;
            kids.sort_by_key(|k| k.file_name());
            for k in kids {
                let kn = k.file_name();
                self.copy_in(&k.path(), d.ino, kn.as_bytes())?;
            }
            d.ino
        } else if ft.is_symlink() {
            let target = fs::read_link(src)
                .with_context(|| format!("cannot read symbolic link '{}'", src.display()))?;
            if existing.is_some() {
                fs.unlink(dir, name).map_err(e)?;
            }
            fs.symlink(
                dir,
                name,
                target.as_os_str().as_bytes(),
                &NewInode::new(0, uid, gid),
            )
            .map_err(e)?
            .0
            .ino
        } else if ft.is_file() {
            let ino = match existing {
                Some(i) if i.is_regular() => {
                    fs.truncate(i.ino, 0).map_err(e)?;
                    i.ino
                }
                Some(_) => bail!("cannot overwrite '{}': not a regular file", shown()),
                None => {
                    fs.create(dir, name, &NewInode::new(S_IFREG | perm, uid, gid))
                        .map_err(e)?
                        .0
                        .ino
                }
            };
            self.data(src, ino)?;
            ino
        } else {
            if existing.is_some() {
                bail!("cannot create special file '{}': File exists", shown());
            }
            let kind = if ft.is_fifo() {
                S_IFIFO
            } else if ft.is_socket() {
                S_IFSOCK
            } else if ft.is_char_device() {
                S_IFCHR
            } else {
                S_IFBLK
            };
            let rdev = md.rdev();
            let spec = NewInode {
                rdev: Some((libc::major(rdev), libc::minor(rdev))),
                ..NewInode::new(kind | perm, uid, gid)
            };
            fs.create(dir, name, &spec).map_err(e)?.0.ino
        };
        if self.archive {
            if md.nlink() > 1 && !ft.is_dir() {
                self.links.insert((md.dev(), md.ino()), ino);
            }
            for (n, v) in host::xattrs(src).unwrap_or_default() {
                fs.set_xattr(ino, &n, Some(&v), ext4kit_fs::xattr_write::SetMode::Any)
                    .map_err(|x| {
                        anyhow!(
                            "setting {} on '{}': {x}",
                            String::from_utf8_lossy(&n),
                            shown()
                        )
                    })?;
            }
            let ts = |s: i64, n: i64| {
                Some(Timestamp {
                    sec: s,
                    nsec: n as u32,
                })
            };
            let a = SetAttr {
                mode: (!ft.is_symlink()).then_some(perm),
                uid: Some(uid),
                gid: Some(gid),
                size: None,
                times: Some(Times {
                    atime: ts(md.atime(), md.atime_nsec()),
                    mtime: ts(md.mtime(), md.mtime_nsec()),
                    ctime: None,
                    crtime: None,
                }),
            };
            fs.setattr(ino, &a).map_err(e)?;
        }
        Ok(())
    }

    fn data(&self, src: &Path, ino: u32) -> anyhow::Result<()> {
        let e = |e: FsError| anyhow!("'{}': {e}", src.display());
        let mut f = File::open(src)
            .with_context(|| format!("cannot open '{}' for reading", src.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = f
                .read(&mut buf)
                .with_context(|| format!("error reading '{}'", src.display()))?;
            if n == 0 {
                break;
            }
            // Zeros stay a hole (the size is set at the end).
            if buf[..n].iter().any(|&b| b != 0) {
                self.fs.write_at(ino, off, &buf[..n]).map_err(e)?;
            }
            off += n as u64;
        }
        if self.fs.inode(ino).map_err(e)?.size < off {
            self.fs.truncate(ino, off).map_err(e)?;
        }
        Ok(())
    }
}
