//! `ext4kit mkdir [-p]` and `ext4kit rm [-r] [-f]` on unmounted images,
//! each operand one open/close (clean) and each change one transaction;
//! messages as coreutils prints them.

use std::ffi::OsString;

use anyhow::{anyhow, bail};
use ext4kit_format::inode::S_IFDIR;
use ext4kit_fs::FsError;
use ext4kit_fs::dir::Entry;
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::inode::InodeInfo;
use ext4kit_fs::sb::Fs;
use std::collections::HashMap;

use crate::walk::{Node, Step, Tree, show, walk};

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
    closing(t, fs, f)
}

/// [`with_fs`] with `check` run read-only before anything is written
/// ([`crate::cmd_attr::open_rw_checked`]): an operation it refuses leaves
/// the image as it was, not even its mount count changed.
fn with_fs_checked(
    t: &Target,
    check: impl Fn(&Target, &Fs<'_>) -> anyhow::Result<()>,
    f: impl FnOnce(&Filesystem) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let fs = crate::cmd_attr::open_rw_checked(t, &check)?;
    closing(t, fs, f)
}

/// Run `f` on `fs`, then close it cleanly; the first error wins.
fn closing(
    t: &Target,
    fs: Filesystem,
    f: impl FnOnce(&Filesystem) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let r = f(&fs);
    let c = fs
        .close()
        .map_err(|e| anyhow!("{}: closing: {e}", t.img.display()));
    r.and(c)
}

/// A directory of the read-only view (symlinks followed).
fn ro_dir(f: &Fs<'_>, path: &[u8]) -> Result<InodeInfo, FsError> {
    let d = f.resolve(path, true)?;
    if !d.is_dir() {
        return Err(FsError::NotADirectory);
    }
    Ok(d)
}

/// The inode `name` names in `dir` of the read-only view, if any.
fn ro_lookup(f: &Fs<'_>, dir: &InodeInfo, name: &[u8]) -> Result<Option<InodeInfo>, FsError> {
    match f.lookup(dir, name)? {
        Some(e) => Ok(Some(f.inode(e.ino)?)),
        None => Ok(None),
    }
}

/// `mkdir`'s refusals, found read-only: a missing or non-directory
/// parent, an existing name (without `-p`), a component that is not a
/// directory (with `-p`).
fn mkdir_check(parents: bool, t: &Target, f: &Fs<'_>) -> anyhow::Result<()> {
    let e = |e: FsError| anyhow!("cannot create directory '{}': {e}", t.spec);
    if parents {
        let mut cur = ro_dir(f, b"/").map_err(e)?;
        for comp in t.path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            match ro_lookup(f, &cur, comp).map_err(e)? {
                Some(i) if i.is_dir() => cur = i,
                // Followed by the operation itself.
                Some(i) if i.is_symlink() => return Ok(()),
                Some(_) => return Err(e(FsError::NotADirectory)),
                None => return ext4kit_fs::fs::flags::may_create_in(&cur).map_err(e),
            }
        }
        return Ok(());
    }
    let (parent, name) = split_last(&t.path);
    let Some(name) = name else {
        return Err(e(FsError::Exists));
    };
    let d = ro_dir(f, &parent).map_err(e)?;
    if ro_lookup(f, &d, &name).map_err(e)?.is_some() {
        return Err(e(FsError::Exists));
    }
    ext4kit_fs::fs::flags::may_create_in(&d).map_err(e)
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
        let check = |t: &Target, f: &Fs<'_>| mkdir_check(args.parents, t, f);
        let res = with_fs_checked(&t, check, |fs| {
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

/// The read-only check before `rm -r` writes: every directory below
/// `dir` is readable, no entry loops back to a directory it is inside and
/// no directory is reached twice, every inode is readable and every
/// regular file's block map is sound. A tree that fails is not touched
/// (the removal could not finish, and stopping half-way in a damaged tree
/// would leave it worse than it was).
fn check_tree(fs: &Fs<'_>, dir: InodeInfo, spec: &str) -> anyhow::Result<()> {
    struct Check<'a, 'b> {
        fs: &'b Fs<'a>,
        spec: &'b str,
    }
    impl Tree for Check<'_, '_> {
        type Err = anyhow::Error;
        fn entries(&mut self, path: &[Node]) -> anyhow::Result<Vec<Entry>> {
            let d = path
                .last()
                .map(|n| &n.inode)
                .ok_or_else(|| anyhow!("empty path"))?;
            let err = |e: FsError| anyhow!("cannot remove '{}': {e}", show(self.spec, path, None));
            let entries = self.fs.read_dir_user(d).map_err(err)?;
            ext4kit_fs::dir::check_dots(d, &entries).map_err(err)?;
            Ok(entries)
        }
        fn inode(&mut self, path: &[Node], e: &Entry) -> anyhow::Result<Option<InodeInfo>> {
            let err = |x: FsError| {
                anyhow!(
                    "cannot remove '{}': {x}",
                    show(self.spec, path, Some(&e.name))
                )
            };
            let i = self.fs.inode(e.ino).map_err(err)?;
            if i.is_regular() {
                self.fs.content(&i).map_err(err)?;
            }
            Ok(Some(i))
        }
    }
    let mut seen: HashMap<u32, String> = HashMap::new();
    walk(&mut Check { fs, spec }, dir, Vec::new(), &mut |s| match s {
        Step::Loop(path, n) => bail!(
            "cannot remove '{}': directory loop (inode {} is '{}', which contains it); the image needs e2fsck",
            show(spec, path, Some(&n.name)),
            n.inode.ino,
            show(
                spec,
                &path[..path
                    .iter()
                    .position(|p| p.inode.ino == n.inode.ino)
                    .map_or(path.len(), |i| i + 1)],
                None
            ),
        ),
        Step::Enter(path) => {
            let here = show(spec, path, None);
            let ino = path.last().map_or(0, |n| n.inode.ino);
            if let Some(first) = seen.insert(ino, here.clone()) {
                bail!(
                    "cannot remove '{here}': directory also linked as '{first}' (inode {ino}); the image needs e2fsck"
                );
            }
            Ok(true)
        }
        _ => Ok(true),
    })
}

/// Remove everything below directory `dir`, then nothing else (depth
/// first, without recursion; [`check_tree`] has ruled out loops).
fn remove_tree(fs: &Filesystem, dir: InodeInfo) -> Result<(), FsError> {
    struct Rw<'a>(&'a Filesystem);
    impl Tree for Rw<'_> {
        type Err = FsError;
        fn entries(&mut self, path: &[Node]) -> Result<Vec<Entry>, FsError> {
            let d = path.last().map(|n| &n.inode).ok_or(FsError::NotFound)?;
            self.0.read(|f| f.read_dir_user(d))
        }
        fn inode(&mut self, _: &[Node], e: &Entry) -> Result<Option<InodeInfo>, FsError> {
            self.0.inode(e.ino).map(Some)
        }
    }
    walk(&mut Rw(fs), dir, Vec::new(), &mut |s| {
        match s {
            Step::Other(path, n) => {
                let parent = path.last().map_or(0, |p| p.inode.ino);
                fs.unlink(parent, &n.name)?;
            }
            Step::Leave(path) if path.len() > 1 => {
                let parent = path[path.len() - 2].inode.ino;
                fs.rmdir(parent, &path[path.len() - 1].name)?;
            }
            Step::Loop(_, n) => {
                return Err(FsError::corrupt(
                    "directory",
                    format!("directory loop at inode {}", n.inode.ino),
                ));
            }
            _ => {}
        }
        Ok(true)
    })
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
                    if i.is_dir() && args.recursive {
                        check_tree(&fs, i, &t.spec)?;
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
                    remove_tree(fs, i.clone()).map_err(e)?;
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

/// Move (rename) files inside an image.
#[derive(clap::Args, Debug)]
pub struct MvArgs {
    /// Do not overwrite an existing file (RENAME_NOREPLACE).
    #[arg(short = 'n', long = "no-clobber")]
    pub no_clobber: bool,
    /// Exchange source and destination (RENAME_EXCHANGE).
    #[arg(long = "exchange")]
    pub exchange: bool,
    /// IMG:SRC... IMG:DST (one image).
    #[arg(value_name = "IMG:SRC... IMG:DST", required = true, num_args = 2..)]
    pub paths: Vec<OsString>,
}

/// The read-only check before `mv` writes: a directory moved to another
/// parent is the one its '..' names (not a second link to a directory
/// that lives elsewhere, in a damaged image); the engine's rename checks
/// the same, but only after the image is open for writing. Operands that
/// cannot be resolved are left to the rename's own errors.
fn mv_check(fs: &Fs<'_>, dt: &Target, srcs: &[OsString], exchange: bool) -> anyhow::Result<()> {
    let dir_of = |p: &[u8]| fs.resolve(p, true).ok().filter(|i| i.is_dir());
    let into = !exchange && dir_of(&dt.path).is_some();
    let (dparent, dname) = split_last(&dt.path);
    for s in srcs {
        let st = parse_target(s);
        let (sp, Some(sn)) = split_last(&st.path) else {
            continue;
        };
        if st.img != dt.img {
            continue;
        }
        let (Some(sd), Some(dd)) = (
            dir_of(&sp),
            if into {
                dir_of(&dt.path)
            } else {
                dir_of(&dparent)
            },
        ) else {
            continue;
        };
        let e = |e: FsError| anyhow!("cannot move '{}' to '{}': {e}", st.spec, dt.spec);
        let mut moved = vec![(sd.ino, sn)];
        if exchange && let Some(n) = dname.clone() {
            moved.push((dd.ino, n));
        }
        for (parent, name) in moved {
            let d = match fs.lookup(&fs.inode(parent).map_err(e)?, &name) {
                Ok(Some(en)) => fs.inode(en.ino).map_err(e)?,
                _ => continue,
            };
            if sd.ino == dd.ino || !d.is_dir() {
                continue;
            }
            let up = fs.parent_of(&d).map_err(e)?;
            if up != Some(parent) {
                return Err(e(FsError::corrupt(
                    "directory",
                    format!(
                        "inode {} has two parents: its '..' names inode {}, not {parent}; the image needs e2fsck",
                        d.ino,
                        up.unwrap_or(0)
                    ),
                )));
            }
        }
    }
    Ok(())
}

/// One `mv` operand's names: the source's parent and name, and where it
/// goes (the destination directory's path and the new name), or the
/// refusal a move of it gets without looking at the image (another
/// image, the root). `into`: the destination is a directory.
struct MvNames {
    src_dir: Vec<u8>,
    src_name: Vec<u8>,
    dst_dir: Vec<u8>,
    dst_name: Vec<u8>,
}

fn mv_names(st: &Target, dt: &Target, into: bool) -> anyhow::Result<MvNames> {
    if st.img != dt.img {
        bail!(
            "cannot move '{}' to '{}': not the same image",
            st.spec,
            dt.spec
        );
    }
    let root = || {
        anyhow!(
            "cannot move '{}' to '{}': {}",
            st.spec,
            dt.spec,
            FsError::InvalidName("the root")
        )
    };
    let (src_dir, sn) = split_last(&st.path);
    let src_name = sn.ok_or_else(root)?;
    let (dst_dir, dst_name) = if into {
        (dt.path.clone(), src_name.clone())
    } else {
        let (dp, dn) = split_last(&dt.path);
        (dp, dn.ok_or_else(root)?)
    };
    Ok(MvNames {
        src_dir,
        src_name,
        dst_dir,
        dst_name,
    })
}

/// The refusals of `mv`'s own steps that a read-only look finds (a
/// missing source or destination directory, several sources into a
/// non-directory, another image): `Ok` if at least one source may be
/// moved (the others are then reported by the move itself), else the
/// errors, all but the last printed here.
fn mv_some_can_move(
    f: &Fs<'_>,
    dt: &Target,
    srcs: &[OsString],
    exchange: bool,
) -> anyhow::Result<()> {
    let into = !exchange && ro_dir(f, &dt.path).is_ok();
    if srcs.len() > 1 && !into {
        bail!("target '{}' is not a directory", dt.spec);
    }
    let mut errors = Vec::new();
    for s in srcs {
        let st = parse_target(s);
        let r = (|| -> anyhow::Result<()> {
            let n = mv_names(&st, dt, into)?;
            let e = |e: FsError| anyhow!("cannot move '{}' to '{}': {e}", st.spec, dt.spec);
            let sd = ro_dir(f, &n.src_dir).map_err(e)?;
            ro_lookup(f, &sd, &n.src_name)
                .map_err(e)?
                .ok_or_else(|| e(FsError::NotFound))?;
            let dd = ro_dir(f, &n.dst_dir).map_err(e)?;
            ext4kit_fs::fs::flags::may_rename_between(&sd, &dd).map_err(e)?;
            if exchange && ro_lookup(f, &dd, &n.dst_name).map_err(e)?.is_none() {
                return Err(e(FsError::NotFound));
            }
            Ok(())
        })();
        match r {
            Ok(()) => return Ok(()),
            Err(e) => errors.push(e),
        }
    }
    let last = errors.pop();
    for e in errors {
        eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Run `ext4kit mv`.
pub fn mv(args: &MvArgs) -> anyhow::Result<i32> {
    let (dst, srcs) = args
        .paths
        .split_last()
        .ok_or_else(|| anyhow!("missing destination operand"))?;
    let dt = parse_target(dst);
    let flags = ext4kit_fs::fs::RenameFlags {
        noreplace: args.no_clobber,
        exchange: args.exchange,
        whiteout: None,
    };
    // Checked read-only first: a directory with two parents, or operands
    // every one of which would be refused, leave the image unwritten.
    let check = |dt: &Target, f: &Fs<'_>| {
        mv_check(f, dt, srcs, args.exchange)?;
        mv_some_can_move(f, dt, srcs, args.exchange)
    };
    let mut failed = false;
    let res = with_fs_checked(&dt, check, |fs| {
        let into = fs
            .read(|f| f.resolve(&dt.path, true))
            .is_ok_and(|i| i.is_dir())
            && !args.exchange;
        if srcs.len() > 1 && !into {
            bail!("target '{}' is not a directory", dt.spec);
        }
        for s in srcs {
            let st = parse_target(s);
            let r = (|| -> anyhow::Result<()> {
                let n = mv_names(&st, &dt, into)?;
                let e = |e: FsError| anyhow!("cannot move '{}' to '{}': {e}", st.spec, dt.spec);
                let sd = resolve_dir(fs, &n.src_dir).map_err(e)?;
                let dd = resolve_dir(fs, &n.dst_dir).map_err(e)?;
                let (sn, dn) = (n.src_name, n.dst_name);
                if args.no_clobber && fs.lookup(dd.ino, &dn).map_err(e)?.is_some() {
                    return Ok(()); // mv -n: silently skipped
                }
                fs.rename(sd.ino, &sn, dd.ino, &dn, flags).map_err(e)?;
                Ok(())
            })();
            if let Err(e) = r {
                eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
                failed = true;
            }
        }
        Ok(())
    });
    if let Err(e) = res {
        eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
        failed = true;
    }
    Ok(i32::from(failed))
}

/// Make hard or symbolic links inside an image.
#[derive(clap::Args, Debug)]
pub struct LnArgs {
    /// Make a symbolic link (TARGET is stored as given).
    #[arg(short = 's', long = "symbolic")]
    pub symbolic: bool,
    /// Replace an existing destination.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    /// TARGET (IMG:PATH for a hard link, any text with -s).
    #[arg(value_name = "TARGET")]
    pub target: OsString,
    /// IMG:LINK_NAME
    #[arg(value_name = "IMG:LINK_NAME")]
    pub link: OsString,
}

/// The name a link made inside an existing directory gets: the last
/// component of its target.
fn link_base(args: &LnArgs) -> Vec<u8> {
    let base = if args.symbolic {
        args.target.as_encoded_bytes().to_vec()
    } else {
        split_last(&parse_target(&args.target).path)
            .1
            .unwrap_or_default()
    };
    base.rsplit(|&c| c == b'/')
        .find(|c| !c.is_empty())
        .unwrap_or(b"")
        .to_vec()
}

/// `ln`'s refusals, found read-only (the same steps as [`ln`]'s).
fn ln_check(args: &LnArgs, lt: &Target, f: &Fs<'_>) -> anyhow::Result<()> {
    let e = |e: FsError| anyhow!("failed to create link '{}': {e}", lt.spec);
    let (lp, ln) = split_last(&lt.path);
    let mut name = ln.ok_or_else(|| e(FsError::Exists))?;
    let mut d = ro_dir(f, &lp).map_err(e)?;
    if let Some(i) = ro_lookup(f, &d, &name).map_err(e)?
        && i.is_dir()
    {
        d = i;
        name = link_base(args);
    }
    if let Some(old) = ro_lookup(f, &d, &name).map_err(e)?
        && (!args.force || old.is_dir())
    {
        return Err(e(FsError::Exists));
    }
    ext4kit_fs::fs::flags::may_create_in(&d).map_err(e)?;
    if !args.symbolic {
        let tt = parse_target(&args.target);
        if tt.img != lt.img {
            bail!(
                "failed to create hard link '{}': not the same image",
                lt.spec
            );
        }
        let i = f
            .resolve(&tt.path, false)
            .map_err(|x| anyhow!("failed to access '{}': {x}", tt.spec))?;
        if i.is_dir() {
            bail!("'{}': hard link not allowed for directory", tt.spec);
        }
    }
    Ok(())
}

/// Run `ext4kit ln`.
pub fn ln(args: &LnArgs) -> anyhow::Result<i32> {
    let lt = parse_target(&args.link);
    let check = |t: &Target, f: &Fs<'_>| ln_check(args, t, f);
    let res = with_fs_checked(&lt, check, |fs| {
        let e = |e: FsError| anyhow!("failed to create link '{}': {e}", lt.spec);
        let (lp, ln) = split_last(&lt.path);
        let ln = ln.ok_or_else(|| e(FsError::Exists))?;
        let mut d = resolve_dir(fs, &lp).map_err(e)?;
        let mut name = ln;
        // An existing directory as LINK_NAME: the link goes inside it.
        if let Some(i) = fs.lookup(d.ino, &name).map_err(e)?
            && i.is_dir()
        {
            d = i;
            name = link_base(args);
        }
        if let Some(old) = fs.lookup(d.ino, &name).map_err(e)? {
            if !args.force || old.is_dir() {
                return Err(e(FsError::Exists));
            }
            fs.unlink(d.ino, &name).map_err(e)?;
        }
        if args.symbolic {
            let (uid, gid) = owner();
            fs.symlink(
                d.ino,
                &name,
                args.target.as_encoded_bytes(),
                &NewInode::new(0, uid, gid),
            )
            .map_err(e)?;
        } else {
            let tt = parse_target(&args.target);
            if tt.img != lt.img {
                bail!(
                    "failed to create hard link '{}': not the same image",
                    lt.spec
                );
            }
            let i = fs
                .read(|f| f.resolve(&tt.path, false))
                .map_err(|x| anyhow!("failed to access '{}': {x}", tt.spec))?;
            if i.is_dir() {
                bail!("'{}': hard link not allowed for directory", tt.spec);
            }
            fs.link(i.ino, d.ino, &name).map_err(e)?;
        }
        Ok(())
    });
    match res {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            Ok(1)
        }
    }
}
