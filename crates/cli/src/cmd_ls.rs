//! `ext4kit ls [-l] [-a] [-R] IMG:PATH...`: list a directory of an
//! unmounted image (like e2tools' e2ls, output like coreutils' `ls -n`).
//! Also the helpers `cat` and `stat` share: the `IMG:PATH` spelling,
//! opening an image read-only (a dirty journal replayed in memory only),
//! mode strings and UTC times.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use anyhow::anyhow;
use ext4kit_device::{Device, OpenOptions};
use ext4kit_fs::FsError;
use ext4kit_fs::inode::{FileType, InodeInfo, Timestamp};
use ext4kit_fs::sb::{Fs, Volume};

/// List directory contents of an ext2/3/4 image (read-only; a dirty journal
/// is replayed in memory, the image is never written). Times are UTC.
#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Long listing: mode, links, uid, gid (numeric), size (or device
    /// numbers), modification time, name, symlink target.
    #[arg(short = 'l')]
    pub long: bool,
    /// Include entries whose names begin with '.' (also '.' and '..').
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// List subdirectories recursively.
    #[arg(short = 'R', long = "recursive")]
    pub recursive: bool,
    /// IMG:PATH (e2tools' spelling; a plain IMG means its root directory).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

/// An `IMG:PATH` operand.
pub struct Target {
    pub img: PathBuf,
    /// The path inside the image (bytes, `/` when none was given).
    pub path: Vec<u8>,
    /// The operand as given, for messages.
    pub spec: String,
}

/// Split `IMG:PATH`: the image is the shortest prefix before a ':' that
/// exists (so image names may contain ':'), or the whole operand when it
/// exists as it is.
pub fn parse_target(arg: &OsStr) -> Target {
    let b = arg.as_bytes();
    let spec = arg.to_string_lossy().into_owned();
    let mk = |img: &[u8], path: &[u8]| Target {
        img: PathBuf::from(OsString::from_vec(img.to_vec())),
        path: if path.is_empty() {
            b"/".to_vec()
        } else {
            path.to_vec()
        },
        spec: spec.clone(),
    };
    if ext4kit_device::is_device_uri(arg) {
        // NBD URI: the ':' after the export's path starts the image path
        // (so export names and socket paths cannot contain ':' here).
        let start = spec.find("://").map_or(0, |i| i + 3);
        let path_at = b[start..]
            .iter()
            .position(|&c| c == b'/')
            .map_or(b.len(), |i| start + i);
        return match b[path_at..].iter().position(|&c| c == b':') {
            Some(i) => mk(&b[..path_at + i], &b[path_at + i + 1..]),
            None => mk(b, b"/"),
        };
    }
    if std::path::Path::new(arg).exists() {
        return mk(b, b"/");
    }
    for (i, &c) in b.iter().enumerate() {
        if c == b':' && std::path::Path::new(OsStr::from_bytes(&b[..i])).exists() {
            return mk(&b[..i], &b[i + 1..]);
        }
    }
    match b.iter().position(|&c| c == b':') {
        Some(i) => mk(&b[..i], &b[i + 1..]),
        None => mk(b, b"/"),
    }
}

/// Open an image read-only.
pub fn open_image(t: &Target) -> anyhow::Result<Box<dyn Device>> {
    // Device errors name the path themselves.
    crate::extjournal::open(&t.img, OpenOptions::read_only())
}

/// Validate the filesystem (replaying a dirty journal in memory).
pub fn open_volume<'d>(t: &Target, dev: &'d dyn Device) -> anyhow::Result<Volume<'d>> {
    Volume::open(dev).map_err(|e| anyhow!("{}: {e}", t.img.display()))
}

/// "cannot access 'SPEC': REASON", coreutils' wording.
pub fn access_error(spec: &str, e: &FsError) -> anyhow::Error {
    anyhow!("cannot access '{spec}': {e}")
}

/// `drwxr-xr-x`, with setuid/setgid/sticky as ls shows them.
pub fn mode_string(inode: &InodeInfo) -> String {
    let m = inode.mode;
    let mut s = String::with_capacity(10);
    s.push(inode.file_type().letter());
    let bit = |b: u16, c: char| if m & b != 0 { c } else { '-' };
    let special = |x: u16, sp: u16, on: char, off: char| match (m & x != 0, m & sp != 0) {
        (true, true) => on,
        (false, true) => off,
        (true, false) => 'x',
        (false, false) => '-',
    };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(0o100, 0o4000, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(0o010, 0o2000, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(0o001, 0o1000, 't', 'T'));
    s
}

/// Civil date (UTC) of a Unix time: (year, month 1-12, day, h, m, s).
pub fn civil(secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Howard Hinnant's days_from_civil, inverted.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// `2026-12-01 12:19:23.123456789 +0000` (stat's format, UTC).
pub fn full_time(t: Timestamp) -> String {
    let (y, mo, d, h, mi, s) = civil(t.sec);
    format!(
        "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{:09} +0000",
        t.nsec
    )
}

/// ls's time column: `Dec  1 12:19` within six months of now, else
/// `Dec  1  2020` (UTC).
pub fn ls_time(t: Timestamp, now: i64) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d, h, mi, _) = civil(t.sec);
    let mon = MONTHS[(mo as usize - 1) % 12];
    let six_months = 31_556_952 / 2;
    if t.sec <= now && now - t.sec < six_months {
        format!("{mon} {d:2} {h:02}:{mi:02}")
    } else {
        format!("{mon} {d:2}  {y}")
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Names as ls prints them (bytes that are not UTF-8 shown lossily).
fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

struct Row {
    mode: String,
    links: String,
    uid: String,
    gid: String,
    size: String,
    time: String,
    name: String,
}

fn row(fs: &Fs<'_>, inode: &InodeInfo, name: &[u8], now: i64) -> Result<Row, FsError> {
    let size = match inode.file_type() {
        FileType::CharDev | FileType::BlockDev => {
            let (ma, mi) = inode.rdev();
            format!("{ma}, {mi}")
        }
        _ => inode.size.to_string(),
    };
    let mut n = show(name);
    if inode.is_symlink() {
        n.push_str(" -> ");
        n.push_str(&show(&fs.read_link(inode)?));
    }
    Ok(Row {
        mode: mode_string(inode),
        links: inode.links.to_string(),
        uid: inode.uid.to_string(),
        gid: inode.gid.to_string(),
        size,
        time: ls_time(inode.mtime, now),
        name: n,
    })
}

fn print_rows(rows: &[Row]) {
    let w = |f: fn(&Row) -> &str| rows.iter().map(|r| f(r).len()).max().unwrap_or(0);
    let (wl, wu, wg, ws) = (
        w(|r| &r.links),
        w(|r| &r.uid),
        w(|r| &r.gid),
        w(|r| &r.size),
    );
    for r in rows {
        outln!(
            "{} {:>wl$} {:<wu$} {:<wg$} {:>ws$} {} {}",
            r.mode,
            r.links,
            r.uid,
            r.gid,
            r.size,
            r.time,
            r.name
        );
    }
}

/// List one directory (or show one non-directory); errors of single
/// entries are reported and make the exit code 1.
struct Ctx<'a, 'b> {
    fs: &'b Fs<'a>,
    args: &'b LsArgs,
    failed: bool,
    now: i64,
    /// Directories on the way down (a damaged image may loop).
    ancestors: Vec<u32>,
}

/// `ls` of `inode` and, with -R, of the directories below it: depth
/// first without recursion (a deep tree needs no stack), never entering a
/// directory it is inside (a damaged image may loop).
fn list(
    cx: &mut Ctx<'_, '_>,
    spec: &str,
    inode: &InodeInfo,
    shown_name: &[u8],
    header: bool,
) -> Result<(), FsError> {
    let subdirs = list_one(cx, spec, inode, shown_name, header)?;
    cx.ancestors.push(inode.ino);
    // (spec, directory, depth: how many ancestors it has)
    let mut todo: Vec<(String, InodeInfo, usize)> = Vec::new();
    let push = |todo: &mut Vec<_>, spec: &str, subs: Vec<(Vec<u8>, InodeInfo)>, depth| {
        for (name, child) in subs.into_iter().rev() {
            let sub = format!("{}/{}", spec.trim_end_matches('/'), show(&name));
            todo.push((sub, child, depth));
        }
    };
    push(&mut todo, spec, subdirs, 1);
    while let Some((sub, child, depth)) = todo.pop() {
        cx.ancestors.truncate(depth);
        outln!();
        if cx.ancestors.contains(&child.ino) {
            eprintln!("ext4kit: '{sub}': not listing already-listed directory (a loop)");
            cx.failed = true;
            continue;
        }
        match list_one(cx, &sub, &child, b"", true) {
            Ok(subs) => {
                cx.ancestors.push(child.ino);
                push(&mut todo, &sub, subs, depth + 1);
            }
            Err(err) => {
                eprintln!("ext4kit: cannot open directory '{sub}': {err}");
                cx.failed = true;
            }
        }
    }
    cx.ancestors.clear();
    Ok(())
}

/// List one directory (or show one non-directory); returns the
/// subdirectories to list next with -R.
fn list_one(
    cx: &mut Ctx<'_, '_>,
    spec: &str,
    inode: &InodeInfo,
    shown_name: &[u8],
    header: bool,
) -> Result<Vec<(Vec<u8>, InodeInfo)>, FsError> {
    if !inode.is_dir() {
        if cx.args.long {
            print_rows(&[row(cx.fs, inode, shown_name, cx.now)?]);
        } else {
            outln!("{}", show(shown_name));
        }
        return Ok(Vec::new());
    }
    let mut entries = cx.fs.read_dir_user(inode)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries.retain(|e| cx.args.all || !e.name.starts_with(b"."));
    if header {
        outln!("{spec}:");
    }
    let mut subdirs = Vec::new();
    let mut rows = Vec::new();
    let mut total = 0u64;
    for e in &entries {
        let child = match cx.fs.inode(e.ino) {
            Ok(c) => c,
            Err(err) => {
                eprintln!(
                    "ext4kit: cannot access '{}/{}': {err}",
                    spec.trim_end_matches('/'),
                    e.name_lossy()
                );
                cx.failed = true;
                continue;
            }
        };
        if cx.args.recursive && child.is_dir() && e.name != b"." && e.name != b".." {
            subdirs.push((e.name.clone(), child.clone()));
        }
        if cx.args.long {
            match row(cx.fs, &child, &e.name, cx.now) {
                Ok(r) => {
                    total = total.saturating_add(child.blocks_512.div_ceil(2));
                    rows.push(r);
                }
                Err(err) => {
                    eprintln!(
                        "ext4kit: cannot read '{}/{}': {err}",
                        spec.trim_end_matches('/'),
                        e.name_lossy()
                    );
                    cx.failed = true;
                }
            }
        } else {
            outln!("{}", e.name_lossy());
        }
    }
    if cx.args.long {
        outln!("total {total}");
        print_rows(&rows);
    }
    Ok(subdirs)
}

/// Run `ext4kit ls`.
pub fn run(args: &LsArgs) -> anyhow::Result<i32> {
    let mut failed = false;
    let now = now();
    let many = args.targets.len() > 1 || args.recursive;
    for (i, arg) in args.targets.iter().enumerate() {
        let t = parse_target(arg);
        let res = (|| -> anyhow::Result<()> {
            let dev = open_image(&t)?;
            let vol = open_volume(&t, dev.as_ref())?;
            let fs = vol.fs();
            let inode = fs
                .resolve(&t.path, false)
                .map_err(|e| access_error(&t.spec, &e))?;
            // A symlink to a directory named without -l is listed as the
            // directory (ls follows command-line symlinks unless -l).
            let inode = if inode.is_symlink() && !args.long {
                fs.resolve(&t.path, true)
                    .map_err(|e| access_error(&t.spec, &e))?
            } else {
                inode
            };
            if i > 0 && inode.is_dir() {
                outln!();
            }
            let shown = if inode.is_dir() {
                t.spec.as_bytes().to_vec()
            } else {
                t.path.clone()
            };
            let mut cx = Ctx {
                fs: &fs,
                args,
                failed: false,
                now,
                ancestors: Vec::new(),
            };
            let r = list(&mut cx, &t.spec, &inode, &shown, many && inode.is_dir());
            failed |= cx.failed;
            r.map_err(|e| anyhow!("cannot open directory '{}': {e}", t.spec))
        })();
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
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(civil(1_700_000_000), (2023, 11, 14, 22, 13, 20));
        assert_eq!(civil(-1), (1969, 12, 31, 23, 59, 59));
        assert_eq!(civil(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(
            full_time(Timestamp {
                sec: 1_700_000_000,
                nsec: 5
            }),
            "2023-11-14 22:13:20.000000005 +0000"
        );
        assert_eq!(
            ls_time(
                Timestamp {
                    sec: 1_700_000_000,
                    nsec: 0
                },
                1_700_000_100
            ),
            "Nov 14 22:13"
        );
        assert_eq!(
            ls_time(
                Timestamp {
                    sec: 1_000_000_000,
                    nsec: 0
                },
                1_700_000_100
            ),
            "Sep  9  2001"
        );
    }
}
