//! Image tools that change an existing file of an unmounted image, each
//! one transaction that leaves the filesystem clean: `ext4kit chmod`,
//! `chown`, `truncate -s`, `fallocate` (util-linux's options). A dirty
//! journal is replayed first. Messages follow coreutils/util-linux:
//! `ext4kit: cannot access 'IMG:PATH': No such file or directory`.

use std::ffi::OsString;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use ext4kit_device::{Device, OpenOptions, open_device};
use ext4kit_format::inode::S_IFREG;
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Falloc, Filesystem, NewInode, SetAttr};
use ext4kit_fs::inode::InodeInfo;
use ext4kit_fs::rw::RwOptions;
use ext4kit_fs::sb::Fs;

use crate::cmd_ls::{Target, access_error, open_image, open_volume, parse_target};

/// Open the image of `t` for writing (replaying a dirty journal).
pub fn open_rw(t: &Target) -> anyhow::Result<Filesystem> {
    // Refuses a mounted device or a file behind a mounted loop device.
    let dev: Arc<dyn Device> =
        Arc::from(crate::extjournal::open(&t.img, OpenOptions::read_write())?);
    Filesystem::open(dev, RwOptions::default()).with_context(|| format!("{}", t.img.display()))
}

/// Resolve `t`'s path (symlinks followed).
pub fn resolve(fs: &Filesystem, t: &Target) -> anyhow::Result<InodeInfo> {
    fs.read(|f| f.resolve(&t.path, true))
        .map_err(|e| access_error(&t.spec, &e))
}

/// Why [`open_rw_checked`] failed: the open itself or the caller's check.
enum CheckedOpen {
    Fs(FsError),
    Check(anyhow::Error),
}

impl From<FsError> for CheckedOpen {
    fn from(e: FsError) -> Self {
        CheckedOpen::Fs(e)
    }
}

/// Does the image's superblock ask for a journal replay? (Unreadable:
/// no; the opens below report it.)
fn needs_replay(dev: &dyn Device) -> bool {
    use ext4kit_format::features::{Compat, Incompat};
    let mut raw = vec![0u8; ext4kit_format::superblock::SUPERBLOCK_SIZE];
    if dev
        .read_at(&mut raw, ext4kit_format::superblock::SUPERBLOCK_OFFSET)
        .is_err()
    {
        return false;
    }
    ext4kit_format::Superblock::parse(&raw).is_some_and(|sb| {
        Incompat(sb.s_feature_incompat.get()).contains(Incompat::RECOVER)
            && Compat(sb.s_feature_compat.get()).contains(Compat::HAS_JOURNAL)
    })
}

/// `check` run on a read-only open (a dirty journal replayed in memory,
/// the whole filesystem validated).
fn check_read_only(
    t: &Target,
    check: &impl Fn(&Target, &Fs<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dev = open_image(t)?;
    let vol = open_volume(t, dev.as_ref())?;
    check(t, &vol.fs())
}

/// Open `t`'s image for writing with `check` run on its filesystem (the
/// target resolved there) before anything is written. A clean image is
/// read and validated once, by the read-write open
/// ([`Filesystem::open_checked`]); an image whose journal needs a replay
/// is checked on a read-only open first (replayed in memory), so that a
/// refused target is never written, not even by the replay.
pub(crate) fn open_rw_checked(
    t: &Target,
    check: &impl Fn(&Target, &Fs<'_>) -> anyhow::Result<()>,
) -> anyhow::Result<Filesystem> {
    let dirty = needs_replay(open_image(t)?.as_ref());
    if dirty {
        check_read_only(t, check)?;
        return open_rw(t);
    }
    let dev: Arc<dyn Device> = match open_device(&t.img, OpenOptions::read_write()) {
        Ok(d) => Arc::from(crate::extjournal::attach(d, OpenOptions::read_write())?),
        Err(e) => {
            // Report what the check says first, as when it ran alone.
            check_read_only(t, check)?;
            return Err(e.into());
        }
    };
    Filesystem::open_checked(dev, RwOptions::default(), |fs| {
        fs.read(|f| check(t, f)).map_err(CheckedOpen::Check)
    })
    .map_err(|e| match e {
        CheckedOpen::Fs(e) => anyhow::Error::new(e).context(format!("{}", t.img.display())),
        CheckedOpen::Check(e) => e,
    })
}

/// Run `f` for each target on one open filesystem per image, closing each
/// cleanly; every failure is printed as one line, exit 1 if any. `check`
/// runs on the target's inode before anything is written
/// ([`open_rw_checked`]): a target it refuses is left untouched.
fn each(
    targets: &[OsString],
    check: impl Fn(&Target, &InodeInfo) -> anyhow::Result<()>,
    f: impl FnMut(&Filesystem, &Target) -> anyhow::Result<()>,
) -> anyhow::Result<i32> {
    let resolved = |t: &Target, fs: &Fs<'_>| {
        let inode = fs
            .resolve(&t.path, true)
            .map_err(|e| access_error(&t.spec, &e))?;
        check(t, &inode)
    };
    each_fs(targets, resolved, f)
}

/// [`each`] with `check` given the filesystem rather than the target's
/// inode (for a target that may not exist yet).
fn each_fs(
    targets: &[OsString],
    check: impl Fn(&Target, &Fs<'_>) -> anyhow::Result<()>,
    mut f: impl FnMut(&Filesystem, &Target) -> anyhow::Result<()>,
) -> anyhow::Result<i32> {
    let mut failed = false;
    for arg in targets {
        let t = parse_target(arg);
        let res = (|| -> anyhow::Result<()> {
            let fs = open_rw_checked(&t, &check)?;
            let r = f(&fs, &t);
            let c = fs
                .close()
                .with_context(|| format!("{}: closing", t.img.display()));
            r.and(c)
        })();
        if let Err(e) = res {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            failed = true;
        }
    }
    Ok(i32::from(failed))
}

/// Change the permission bits of files in images (octal or symbolic modes).
#[derive(clap::Args, Debug)]
pub struct ChmodArgs {
    /// Octal (755) or symbolic (u+x,go-w, a=r) mode.
    #[arg(value_name = "MODE", allow_hyphen_values = true)]
    pub mode: String,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// Apply a chmod mode string to `old` (permission bits, `dir` for `X`).
pub fn apply_mode(spec: &str, old: u16, dir: bool) -> Option<u16> {
    if !spec.is_empty() && spec.bytes().all(|c| (b'0'..=b'7').contains(&c)) {
        let v = u32::from_str_radix(spec, 8).ok()?;
        return (v <= 0o7777).then_some(v as u16);
    }
    let mut mode = old & 0o7777;
    for clause in spec.split(',') {
        let b = clause.as_bytes();
        let mut i = 0;
        let mut who = 0u16;
        while i < b.len() && b"ugoa".contains(&b[i]) {
            who |= match b[i] {
                b'u' => 0o4700,
                b'g' => 0o2070,
                b'o' => 0o1007,
                _ => 0o7777,
            };
            i += 1;
        }
        let no_who = who == 0;
        if no_who {
            who = 0o7777;
        }
        if i >= b.len() {
            return None;
        }
        while i < b.len() {
            let op = b[i];
            if !b"+-=".contains(&op) {
                return None;
            }
            i += 1;
            let mut bits = 0u16;
            while i < b.len() && !b"+-=".contains(&b[i]) {
                bits |= match b[i] {
                    b'r' => 0o444,
                    b'w' => 0o222,
                    b'x' => 0o111,
                    b'X' if dir || old & 0o111 != 0 => 0o111,
                    b'X' => 0,
                    b's' => 0o6000,
                    b't' => 0o1000,
                    _ => return None,
                };
                i += 1;
            }
            let mut eff = bits & who;
            if no_who {
                // chmod without "who" honours the umask; none here but 0o022
                // as coreutils' default umask would give for +w.
                eff &= !0o022 | if op == b'-' { 0o022 } else { 0 };
            }
            match op {
                b'+' => mode |= eff,
                b'-' => mode &= !eff,
                _ => mode = (mode & !(who & 0o7777 & !if dir { 0o6000 } else { 0 })) | eff,
            }
        }
    }
    Some(mode)
}

/// Run `ext4kit chmod`.
pub fn chmod(args: &ChmodArgs) -> anyhow::Result<i32> {
    if apply_mode(&args.mode, 0, false).is_none() {
        bail!("invalid mode: '{}'", args.mode);
    }
    each(
        &args.targets,
        |_, _| Ok(()),
        |fs, t| {
            let inode = resolve(fs, t)?;
            let mode = apply_mode(&args.mode, inode.perm(), inode.is_dir())
                .ok_or_else(|| anyhow!("invalid mode: '{}'", args.mode))?;
            let a = SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            };
            fs.setattr(inode.ino, &a)
                .map_err(|e| anyhow!("changing permissions of '{}': {e}", t.spec))?;
            Ok(())
        },
    )
}

/// Change the owner and/or group of files in images (numeric ids).
#[derive(clap::Args, Debug)]
pub struct ChownArgs {
    /// OWNER[:GROUP], OWNER:, or :GROUP (numeric ids: the image has no
    /// user database of its own).
    #[arg(value_name = "OWNER[:GROUP]")]
    pub owner: String,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// Parse `OWNER[:GROUP]` (numeric).
pub fn parse_owner(s: &str) -> Option<(Option<u32>, Option<u32>)> {
    let (u, g) = match s.split_once([':', '.']) {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let num = |x: &str| -> Option<Option<u32>> {
        if x.is_empty() {
            Some(None)
        } else {
            x.parse::<u32>().ok().map(Some)
        }
    };
    let uid = num(u)?;
    let gid = match g {
        Some(g) => num(g)?,
        None => None,
    };
    (uid.is_some() || gid.is_some()).then_some((uid, gid))
}

/// Run `ext4kit chown`.
pub fn chown(args: &ChownArgs) -> anyhow::Result<i32> {
    let (uid, gid) = parse_owner(&args.owner)
        .ok_or_else(|| anyhow!("invalid user: '{}' (numeric ids only)", args.owner))?;
    each(
        &args.targets,
        |_, _| Ok(()),
        |fs, t| {
            let inode = resolve(fs, t)?;
            let a = SetAttr {
                uid,
                gid,
                ..SetAttr::default()
            };
            fs.setattr(inode.ino, &a)
                .map_err(|e| anyhow!("changing ownership of '{}': {e}", t.spec))?;
            Ok(())
        },
    )
}

/// Shrink or extend files in images to a size.
#[derive(clap::Args, Debug)]
pub struct TruncateArgs {
    /// SIZE with an optional K, M, G, T (1024) or KB, MB, GB (1000) suffix;
    /// a leading + or - changes the current size.
    #[arg(
        short = 's',
        long = "size",
        value_name = "SIZE",
        allow_hyphen_values = true
    )]
    pub size: String,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// A size with coreutils' suffixes (K=1024 ... KB=1000 ..., KiB=1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let suf = &s[digits..];
    let (unit, rest) = match suf.chars().next() {
        None => return Some(n),
        Some(c) => (c.to_ascii_uppercase(), &suf[1..]),
    };
    let exp = "KMGTPE".find(unit)? as u32 + 1;
    let base: u64 = match rest {
        "" | "iB" => 1024,
        "B" => 1000,
        _ => return None,
    };
    n.checked_mul(base.checked_pow(exp)?)
}

/// Run `ext4kit truncate`.
pub fn truncate(args: &TruncateArgs) -> anyhow::Result<i32> {
    let (rel, num) = match args.size.as_bytes().first() {
        Some(b'+') => (1i8, &args.size[1..]),
        Some(b'-') => (-1, &args.size[1..]),
        _ => (0, &args.size[..]),
    };
    let n = parse_size(num).ok_or_else(|| anyhow!("Invalid number: '{}'", args.size))?;
    let check = |t: &Target, inode: &InodeInfo| {
        if inode.is_dir() {
            bail!(
                "cannot open '{}' for writing: {}",
                t.spec,
                FsError::IsADirectory
            );
        }
        if !inode.is_regular() {
            bail!("cannot truncate '{}': not a regular file", t.spec);
        }
        ext4kit_fs::fs::flags::may_write_contents(inode)
            .map_err(|e| anyhow!("failed to truncate '{}': {e}", t.spec))
    };
    each(&args.targets, check, |fs, t| {
        let inode = resolve(fs, t)?;
        let size = match rel {
            1 => inode.size.saturating_add(n),
            -1 => inode.size.saturating_sub(n),
            _ => n,
        };
        fs.truncate(inode.ino, size)
            .map_err(|e| anyhow!("failed to truncate '{}' at {size} bytes: {e}", t.spec))?;
        Ok(())
    })
}

/// Preallocate, punch or zero space of files in images (util-linux's
/// `fallocate`; a missing file is created, mode 0644, unless -n, -p or -z
/// is given).
#[derive(clap::Args, Debug)]
pub struct FallocateArgs {
    /// Offset of the range (K, M, G, KiB, MB... suffixes).
    #[arg(
        short = 'o',
        long = "offset",
        value_name = "OFFSET",
        default_value = "0"
    )]
    pub offset: String,
    /// Length of the range.
    #[arg(short = 'l', long = "length", value_name = "LENGTH")]
    pub length: String,
    /// Keep the file size (FALLOC_FL_KEEP_SIZE).
    #[arg(short = 'n', long = "keep-size")]
    pub keep_size: bool,
    /// Punch a hole (implies --keep-size).
    #[arg(short = 'p', long = "punch-hole")]
    pub punch_hole: bool,
    /// Zero the range (unwritten extents).
    #[arg(short = 'z', long = "zero-range")]
    pub zero_range: bool,
    /// IMG:PATH (e2tools' spelling).
    #[arg(value_name = "IMG:PATH")]
    pub target: OsString,
}

/// Run `ext4kit fallocate`.
pub fn fallocate(args: &FallocateArgs) -> anyhow::Result<i32> {
    let off = parse_size(&args.offset).ok_or_else(|| anyhow!("invalid offset value specified"))?;
    let len = parse_size(&args.length)
        .filter(|&l| l > 0)
        .ok_or_else(|| anyhow!("invalid length value specified"))?;
    if args.punch_hole && args.zero_range {
        bail!("--punch-hole and --zero-range are mutually exclusive");
    }
    let mode = Falloc {
        keep_size: args.keep_size || args.punch_hole,
        punch_hole: args.punch_hole,
        zero_range: args.zero_range,
    };
    // fallocate(1) opens with O_CREAT only in the default mode (no
    // --keep-size, --punch-hole or --zero-range): a missing file is made
    // there, 0644 (less the usual umask 022, which takes nothing from
    // it), owned by the caller, as the kernel's open would make it.
    let create = !(args.keep_size || args.punch_hole || args.zero_range);
    let check = move |t: &Target, fs: &Fs<'_>| {
        let inode = match find(fs, t, create)? {
            Found::Inode(i) => i,
            Found::Missing { dir, .. } => {
                return ext4kit_fs::fs::flags::may_create_in(&fs.inode(dir)?)
                    .map_err(|e| anyhow!("fallocate failed: '{}': {e}", t.spec));
            }
        };
        if !inode.is_regular() {
            let why = if inode.is_dir() {
                FsError::IsADirectory.to_string()
            } else {
                "not a regular file".to_string()
            };
            bail!("fallocate failed: '{}': {why}", t.spec);
        }
        ext4kit_fs::fs::flags::may_write_contents(&inode)
            .map_err(|e| anyhow!("fallocate failed: '{}': {e}", t.spec))
    };
    each_fs(std::slice::from_ref(&args.target), check, |fs, t| {
        let ino = match fs.read(|f| find(f, t, create))? {
            Found::Inode(i) => i.ino,
            Found::Missing { dir, name } => {
                let (uid, gid) = crate::cmd_ns::owner();
                let spec = NewInode::new(S_IFREG | 0o644, uid, gid);
                fs.create(dir, &name, &spec)
                    .map_err(|e| anyhow!("cannot open {}: {e}", t.spec))?
                    .0
                    .ino
            }
        };
        fs.fallocate(ino, off, len, mode)
            .map_err(|e| anyhow!("fallocate failed: {}: {e}", t.spec))?;
        Ok(())
    })
}

/// What a target path names: an inode, or (with `create`) nothing yet in
/// an existing directory.
enum Found {
    Inode(InodeInfo),
    Missing { dir: u32, name: Vec<u8> },
}

/// Resolve `t` (symlinks followed); with `create`, a missing last
/// component of an existing directory is [`Found::Missing`] (not a
/// dangling symlink, nor a path ending in '/').
fn find(fs: &Fs<'_>, t: &Target, create: bool) -> anyhow::Result<Found> {
    match fs.resolve(&t.path, true) {
        Ok(i) => Ok(Found::Inode(i)),
        Err(FsError::NotFound) if create && !t.path.ends_with(b"/") => {
            let cut = t.path.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
            let (parent, name) = t.path.split_at(cut);
            let parent = if parent.is_empty() { &b"/"[..] } else { parent };
            let dir = fs
                .resolve(parent, true)
                .map_err(|e| access_error(&t.spec, &e))?;
            if !dir.is_dir() {
                return Err(access_error(&t.spec, &FsError::NotADirectory));
            }
            if fs.lookup(&dir, name)?.is_some() {
                // A dangling symlink: open(O_CREAT) would follow it.
                return Err(access_error(&t.spec, &FsError::NotFound));
            }
            Ok(Found::Missing {
                dir: dir.ino,
                name: name.to_vec(),
            })
        }
        Err(e) => Err(access_error(&t.spec, &e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(apply_mode("755", 0, false), Some(0o755));
        assert_eq!(apply_mode("4755", 0, false), Some(0o4755));
        assert_eq!(apply_mode("u+x", 0o644, false), Some(0o744));
        assert_eq!(apply_mode("go-r", 0o644, false), Some(0o600));
        assert_eq!(apply_mode("a=r", 0o777, false), Some(0o444));
        assert_eq!(apply_mode("u+x,g+w", 0o600, false), Some(0o720));
        assert_eq!(apply_mode("a+X", 0o600, true), Some(0o711));
        assert_eq!(apply_mode("a+X", 0o600, false), Some(0o600));
        assert_eq!(apply_mode("+x", 0o600, false), Some(0o711));
        assert_eq!(apply_mode("u+t", 0o600, false), Some(0o600));
        assert_eq!(apply_mode("o+t", 0o600, false), Some(0o1600));
        assert_eq!(apply_mode("99", 0, false), None);
        assert_eq!(apply_mode("u*x", 0, false), None);
        assert_eq!(apply_mode("17777", 0, false), None);
    }

    #[test]
    fn owners_and_sizes() {
        assert_eq!(parse_owner("1000:100"), Some((Some(1000), Some(100))));
        assert_eq!(parse_owner("1000"), Some((Some(1000), None)));
        assert_eq!(parse_owner(":5"), Some((None, Some(5))));
        assert_eq!(parse_owner("root"), None);
        assert_eq!(parse_owner(":"), None);
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("4KiB"), Some(4096));
        assert_eq!(parse_size("4KB"), Some(4000));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1x"), None);
        assert_eq!(parse_size(""), None);
    }
}
