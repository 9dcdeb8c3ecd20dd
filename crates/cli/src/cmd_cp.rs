//! `ext4kit cp [-r] [-a] SRC... DST`: copy between an unmounted image and
//! the host (e2tools' `e2cp`, with coreutils' messages).
//!
//! - Image to host (`IMG:PATH... HOSTDIR` or `IMG:PATH HOSTFILE`): read-only
//!   (a dirty journal is replayed in memory). Regular files, and with `-r`
//!   directories, symlinks (copied as symlinks inside a recursive copy or
//!   with `-a`), fifos and device nodes. `-a` keeps mode, owner (when
//!   allowed), times, xattrs (ACLs included, as the host accepts them)
//!   and hard links. Holes and unwritten extents stay holes on the host
//!   (with or without `-a`).
//! - Host to image (`HOST... IMG:DIR` or `HOST IMG:PATH`): files (only
//!   the source's data ranges by `SEEK_DATA`/`SEEK_HOLE` are read, and
//!   of them only the filesystem blocks with a nonzero byte are written:
//!   holes and zero blocks take no blocks; the size is kept), with `-r` directories, symlinks, fifos, sockets
//!   and devices; an existing file is overwritten. `-a` keeps mode,
//!   owner, times (ns), xattrs and hard links. One open and clean close
//!   per command, each file's creation its own transaction.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use ext4kit_device::host;
use ext4kit_fs::FsError;
use ext4kit_fs::dir::Entry;
use ext4kit_fs::file::Content;
use ext4kit_fs::inode::{FileType, InodeInfo, Timestamp};
use ext4kit_fs::sb::Fs;

use crate::cmd_attr::open_rw;
use crate::cmd_ls::{Target, access_error, open_image, open_volume, parse_target};
use crate::cmd_ns::{resolve_dir, split_last};
use crate::walk::{Node, Step, Tree, show, walk};
use ext4kit_fs::fs::flags;
use ext4kit_fs::fs::{Filesystem, NewInode, SetAttr, Times};

/// Copy files between images (IMG:PATH) and the host.
#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    pub recursive: bool,
    /// Archive: -r, and keep mode, owner, times, xattrs, hard links.
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
                match export(&t, &dst, into_dir, recursive, args.archive) {
                    Ok(all) => failed |= !all,
                    Err(e) => {
                        eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
                        failed = true;
                    }
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
) -> anyhow::Result<bool> {
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
    // The image's root copied into a directory fills that directory
    // (joining "/" would name the host's root).
    let target = if into_dir && ![&b"/"[..], b".", b".."].contains(&name) {
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
    /// Copy `inode` (named `spec`) to `dst`; a directory with everything
    /// below it, depth first without recursion. An entry that loops back
    /// to a directory being copied is reported (one line) and not copied;
    /// returns whether everything was copied.
    fn copy(&mut self, inode: &InodeInfo, spec: &str, dst: &Path) -> anyhow::Result<bool> {
        if !inode.is_dir() {
            self.one(inode, spec, dst)?;
            return Ok(true);
        }
        struct Src<'a, 'b> {
            fs: Fs<'a>,
            spec: &'b str,
            /// An entry was skipped (reported).
            skipped: bool,
        }
        impl Tree for Src<'_, '_> {
            type Err = anyhow::Error;
            fn entries(&mut self, path: &[Node]) -> anyhow::Result<Vec<Entry>> {
                let d = path
                    .last()
                    .map(|n| &n.inode)
                    .ok_or_else(|| anyhow!("empty path"))?;
                self.fs
                    .read_dir_user(d)
                    .map_err(|e| anyhow!("'{}': {e}", show(self.spec, path, None)))
            }
            fn inode(&mut self, path: &[Node], e: &Entry) -> anyhow::Result<Option<InodeInfo>> {
                // A damaged directory may hold any bytes as a name: never
                // one that leaves the destination ("/etc", "a/../..").
                if e.name.is_empty() || e.name.iter().any(|&c| c == b'/' || c == 0) {
                    eprintln!(
                        "ext4kit: '{}': not copying an entry with an invalid name (the directory is damaged)",
                        show(self.spec, path, Some(&e.name))
                    );
                    self.skipped = true;
                    return Ok(None);
                }
                self.fs
                    .inode(e.ino)
                    .map(Some)
                    .map_err(|x| anyhow!("'{}': {x}", show(self.spec, path, Some(&e.name))))
            }
        }
        let under = |path: &[Node]| -> PathBuf {
            let mut p = dst.to_path_buf();
            for n in path.iter().skip(1) {
                p.push(OsStr::from_bytes(&n.name));
            }
            p
        };
        let mut all = true;
        let mut src = Src {
            fs: self.fs,
            spec,
            skipped: false,
        };
        walk(&mut src, inode.clone(), Vec::new(), &mut |s| {
            match s {
                Step::Enter(path) => {
                    let d = under(path);
                    // Never through a symlink copied before (a damaged
                    // directory may repeat a name): it could point out of
                    // the destination.
                    if path.len() > 1 && fs::symlink_metadata(&d).is_ok_and(|m| !m.is_dir()) {
                        let _ = fs::remove_file(&d);
                    }
                    if !d.is_dir() {
                        fs::create_dir(&d).with_context(|| {
                            format!("cannot create directory '{}'", d.display())
                        })?;
                    }
                }
                Step::Other(path, n) => {
                    let d = under(path).join(OsStr::from_bytes(&n.name));
                    self.one(&n.inode, &show(spec, path, Some(&n.name)), &d)?;
                }
                Step::Leave(path) => {
                    if let Some(n) = path.last() {
                        self.keep(&n.inode, &under(path))?;
                    }
                }
                Step::Loop(path, n) => {
                    eprintln!(
                        "ext4kit: '{}': not copying a directory loop (inode {} is a directory it is inside)",
                        show(spec, path, Some(&n.name)),
                        n.inode.ino
                    );
                    all = false;
                }
            }
            Ok(true)
        })?;
        Ok(all && !src.skipped)
    }

    /// Copy one non-directory.
    fn one(&mut self, inode: &InodeInfo, spec: &str, dst: &Path) -> anyhow::Result<()> {
        let fs = self.fs;
        if self.archive && inode.links > 1 {
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
            FileType::Directory => bail!("'{spec}': a directory"),
            FileType::Regular => {
                // Not through a symlink (a repeated name of a damaged
                // directory could make one point out of the destination).
                if fs::symlink_metadata(dst).is_ok_and(|m| m.file_type().is_symlink()) {
                    let _ = fs::remove_file(dst);
                }
                self.file(inode, spec, dst)?
            }
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
        self.keep(inode, dst)
    }

    /// Mode (and with -a owner, xattrs, times) of a copied inode.
    fn keep(&self, inode: &InodeInfo, dst: &Path) -> anyhow::Result<()> {
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
            Content::Blocks(maps) => {
                // Holes (and unwritten extents) stay holes, with or
                // without -a (as coreutils cp keeps a sparse source's).
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
    /// The host directories being copied (dev, ino): a bind mount can make
    /// a host tree loop. The recursion is bounded as the host's paths are
    /// (PATH_MAX: every source is opened by its whole path).
    inside: HashSet<(u64, u64)>,
}

/// Host -> image: `srcs` into `t` (an existing directory, or a new or
/// existing file name for one source).
fn import(srcs: &[OsString], t: &Target, recursive: bool, archive: bool) -> anyhow::Result<()> {
    // Checked read-only first: a refused target is never written.
    let into_dir = {
        let dev = open_image(t)?;
        let vol = open_volume(t, dev.as_ref())?;
        let fs = vol.fs();
        let keyless = |e: FsError| anyhow!("cannot copy to '{}': {e}", t.spec);
        match fs.resolve(&t.path, true) {
            Ok(i) if i.is_dir() => {
                flags::may_create_in(&i).map_err(keyless)?;
                true
            }
            Ok(i) if srcs.len() == 1 && i.is_regular() => {
                flags::may_write_contents(&i).map_err(keyless)?;
                false
            }
            Ok(_) if srcs.len() > 1 => bail!("target '{}' is not a directory", t.spec),
            Ok(_) => bail!("cannot overwrite '{}': not a regular file", t.spec),
            Err(FsError::NotFound) if srcs.len() == 1 => {
                let (parent, name) = split_last(&t.path);
                if name.is_none() {
                    bail!("cannot create '{}'", t.spec);
                }
                match fs.resolve(&parent, true) {
                    Ok(d) if d.is_dir() => {
                        flags::may_create_in(&d).map_err(keyless)?;
                        false
                    }
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
        inside: HashSet::new(),
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
            let key = (md.dev(), md.ino());
            if !self.inside.insert(key) {
                bail!(
                    "cannot copy '{}': a directory loop (it is a directory being copied)",
                    src.display()
                );
            }
            let mut kids: Vec<_> = fs::read_dir(src)
                .with_context(|| format!("cannot open directory '{}'", src.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading directory '{}'", src.display()))?;
            kids.sort_by_key(|k| k.file_name());
            for k in kids {
                let kn = k.file_name();
                self.copy_in(&k.path(), d.ino, kn.as_bytes())?;
            }
            self.inside.remove(&key);
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

    /// The content of host file `src` into regular file `ino` (empty):
    /// only the source's data ranges (`SEEK_DATA`/`SEEK_HOLE`; the whole
    /// file where the source cannot tell) are read, and inside them only
    /// the filesystem blocks holding a nonzero byte are written, so holes
    /// and zero blocks stay holes and take no blocks. The size is the
    /// source's, a trailing hole included.
    fn data(&self, src: &Path, ino: u32) -> anyhow::Result<()> {
        let e = |e: FsError| anyhow!("'{}': {e}", src.display());
        let rerr = |e: std::io::Error| anyhow!("error reading '{}': {e}", src.display());
        let f = File::open(src)
            .with_context(|| format!("cannot open '{}' for reading", src.display()))?;
        let bs = u64::from(self.fs.rw().geometry().block_size);
        // A whole number of blocks (at most 64 KiB each).
        let mut buf = vec![0u8; 1 << 20];
        // Bytes of the source seen so far, and whether its holes are known.
        let mut seen = 0u64;
        let mut seekable = true;
        let mut pos = 0u64;
        'ranges: loop {
            let (start, stop) = if seekable {
                match next_data(&f, pos) {
                    DataRange::Data(s, h) => (s, Some(h)),
                    DataRange::End => break,
                    DataRange::Unknown => {
                        seekable = false;
                        (pos, None)
                    }
                }
            } else {
                (pos, None)
            };
            // Whole blocks of the image: from the block the range starts
            // in (never before what was done) to the end of the block it
            // ends in.
            let mut off = (start / bs * bs).max(pos);
            let stop = stop.map(|h| h.div_ceil(bs) * bs);
            loop {
                let want = match stop {
                    Some(h) if h <= off => break,
                    Some(h) => ((h - off) as usize).min(buf.len()),
                    None => buf.len(),
                };
                let n = read_full_at(&f, &mut buf[..want], off).map_err(rerr)?;
                seen = seen.max(off + n as u64);
                self.write_nonzero_blocks(ino, off, &buf[..n], bs as usize)
                    .map_err(e)?;
                off += n as u64;
                if n < want {
                    // The end of the source.
                    break 'ranges;
                }
            }
            pos = off;
        }
        let size = if seekable {
            seen.max(f.metadata().map_err(rerr)?.len())
        } else {
            seen
        };
        if self.fs.inode(ino).map_err(e)?.size < size {
            self.fs.truncate(ino, size).map_err(e)?;
        }
        Ok(())
    }

    /// Write the runs of `data` (read at byte `off`, a block boundary)
    /// whose `bs`-byte blocks hold a nonzero byte; all-zero blocks stay
    /// holes.
    fn write_nonzero_blocks(
        &self,
        ino: u32,
        off: u64,
        data: &[u8],
        bs: usize,
    ) -> Result<(), FsError> {
        let mut run: Option<usize> = None;
        let mut at = 0;
        while at < data.len() {
            let end = (at + bs).min(data.len());
            let zero = data[at..end].iter().all(|&b| b == 0);
            match (zero, run) {
                (false, None) => run = Some(at),
                (true, Some(r)) => {
                    self.fs.write_at(ino, off + r as u64, &data[r..at])?;
                    run = None;
                }
                _ => {}
            }
            at = end;
        }
        if let Some(r) = run {
            self.fs.write_at(ino, off + r as u64, &data[r..])?;
        }
        Ok(())
    }
}

/// The next data range of a host file at or after `pos`.
enum DataRange {
    /// Data from the first offset up to the second (a hole or the end).
    Data(u64, u64),
    /// Only a hole from `pos` to the end of the file.
    End,
    /// The file cannot tell (no `SEEK_DATA`): read everything.
    Unknown,
}

fn next_data(f: &File, pos: u64) -> DataRange {
    let Ok(p) = i64::try_from(pos) else {
        return DataRange::Unknown;
    };
    let data = match host::seek_data_hole(f, p, libc::SEEK_DATA) {
        Ok(d) => d,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return DataRange::End,
        Err(_) => return DataRange::Unknown,
    };
    let Ok(d) = i64::try_from(data) else {
        return DataRange::Unknown;
    };
    match host::seek_data_hole(f, d, libc::SEEK_HOLE) {
        Ok(h) if h > data => DataRange::Data(data, h),
        _ => DataRange::Unknown,
    }
}

/// `read_at` until `buf` is full or the end of the file: the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
