//! mke2fs-compatible options, resolved against mke2fs.conf into the
//! planner's [`FsParams`] and the superblock [`SuperSettings`], the way
//! mke2fs's `PRS()` does. Everything is validated here, before any write.

use ext4kit_format::Features;
use ext4kit_format::features::{Compat, Incompat, RoCompat, Word};

use super::geometry::FsParams;
use super::writer::SuperSettings;
use crate::profile::{FsTypeQuery, Profile, for_hurd};

/// Options as the user gave them (mke2fs spelling).
#[derive(Clone, Debug, Default)]
pub struct MkfsOptions {
    pub fs_type: Option<String>,
    pub usage_types: Option<String>,
    /// `-b`: positive = exact, negative = minimum (the last `-b`).
    pub block_size: Option<i64>,
    /// The `-b` values before the last one, in order: mke2fs checks each,
    /// and a positive one sets the unit in which sizes are read, which a
    /// later negative `-b` does not reset.
    pub earlier_block_sizes: Vec<i64>,
    /// `-N`; `Some(0)` means the default, as in mke2fs.
    pub num_inodes: Option<u64>,
    pub inode_ratio: Option<u64>,
    pub inode_size: Option<u32>,
    pub reserved_ratio: Option<f64>,
    pub label: Option<String>,
    pub uuid: Option<String>,
    /// `-O`, every occurrence (mke2fs joins them with `,`).
    pub features: Vec<String>,
    /// `-E`: mke2fs keeps only the **last** `-E`, so only the last element
    /// is used (after the profile's `options`).
    pub extended: Vec<String>,
    /// `-J`, every occurrence, parsed in order (later keys win).
    pub journal: Vec<String>,
    /// `-j`
    pub add_journal: bool,
    pub flex_bg_size: Option<u32>,
    pub blocks_per_group: Option<u32>,
    pub mount_dir: Option<String>,
    pub creator_os: Option<String>,
    pub errors: Option<String>,
    /// FS-SIZE argument.
    pub fs_size: Option<String>,
    /// `-F` given: a type mke2fs.conf does not define is only a warning.
    pub force: bool,
    /// `-r`: revision level (0 or 1), as given.
    pub revision: Option<String>,
    /// `-s`: the deprecated sparse_super switch (`atoi`: > 0 on, 0 off).
    pub sparse_super: Option<String>,
    /// `MKE2FS_FIRST_META_BG` from the environment (read with `atoi`, and
    /// only with `-O meta_bg`, as mke2fs does).
    pub first_meta_bg_env: Option<String>,
    /// `-S`: write the superblock and descriptors only (last-resort
    /// recovery; inode tables, bitmaps, directories and journal untouched).
    pub super_only: bool,
    /// `-C`: cluster size in bytes (bigalloc), checked by
    /// [`parse_cluster_size_arg`].
    pub cluster_size: Option<u32>,
    /// `-J device=`: the journal device, read by the caller before
    /// resolving (mke2fs opens it while it parses the options: its block
    /// size is the default). Required when `-J device=` is given; see
    /// [`journal_device_spec`] and [`super::journal_dev::inspect`].
    pub external_journal: Option<super::journal_dev::ExternalJournal>,
    /// The partition's first sector (`/sys/dev/block/M:m/start`; 0 for
    /// files), for mke2fs.conf's `hugefiles_align_disk`.
    pub partition_start_sectors: u64,
    /// `-l FILE` / `-c`: bad block numbers, as read (see
    /// [`super::badblocks::parse_list`]).
    pub bad_blocks: Option<Vec<u64>>,
    /// The device as named on the command line, for mke2fs's messages
    /// that name it.
    pub device_name: Option<String>,
}

/// What the options resolve to.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub params: FsParams,
    pub settings: SuperSettings,
    pub fs_types: Vec<String>,
    /// Discard the device before writing (`-E discard`, the default).
    pub discard: bool,
    /// The user promised the storage reads as zero.
    pub assume_prezeroed: bool,
    /// lazy_itable_init as mke2fs.conf and `-E lazy_itable_init=` set
    /// it, before `assume_storage_prezeroed` turns it on: what mke2fs's
    /// should_do_undo looks at (it runs before that).
    pub lazy_itable_init_asked: bool,
    /// `-E offset=`: the filesystem starts this many bytes into the target.
    pub offset: u64,
    pub warnings: Vec<String>,
}

/// mke2fs's warning (not with -q) for clusters of more than 16 blocks.
pub const BIGALLOC_EXPERIMENTAL: &str = "\nWarning: bigalloc file systems with a cluster size greater than\n16 times the block size is considered experimental";

/// A user error: one line naming the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(pub String);

fn err<T>(s: impl Into<String>) -> Result<T, OptionError> {
    Err(OptionError(s.into()))
}

/// `strtoull(s, &end, 0)`, as glibc parses: blanks, an optional sign,
/// `0x` hex, leading-`0` octal or decimal. Returns whether a `-` was
/// given, the magnitude (`None` on overflow, where strtoull saturates)
/// and the unparsed rest (all of `s` when there are no digits).
fn strtoull0(s: &str) -> (bool, Option<u64>, &str) {
    let b = s.as_bytes();
    let mut i = b.iter().take_while(|&&c| is_c_space(char::from(c))).count();
    let mut neg = false;
    if let Some(&c) = b.get(i)
        && (c == b'+' || c == b'-')
    {
        neg = c == b'-';
        i += 1;
    }
    let radix = if b.get(i) == Some(&b'0')
        && matches!(b.get(i + 1), Some(b'x' | b'X'))
        && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
    {
        i += 2;
        16
    } else if b.get(i) == Some(&b'0') {
        8
    } else {
        10
    };
    let start = i;
    let mut v: Option<u64> = Some(0);
    while let Some(d) = b.get(i).and_then(|&c| char::from(c).to_digit(radix)) {
        v = v
            .and_then(|v| v.checked_mul(u64::from(radix)))
            .and_then(|v| v.checked_add(u64::from(d)));
        i += 1;
    }
    if i == start {
        return (false, Some(0), s);
    }
    (neg, v, &s[i..])
}

/// e2p's `parse_num_blocks2` on the magnitude: a number with at most one
/// suffix character, K/M/G/T (binary) or `s` (512-byte sectors), in
/// blocks of `1024 << log_block_size`, or in bytes when `log_block_size`
/// is `None` (mke2fs's -1, for `-b` and `-i`). `None` where e2p returns 0
/// for garbage, and also on overflow, where e2p silently wraps.
fn num_blocks_magnitude(arg: &str, log_block_size: Option<u32>) -> Option<(bool, u64)> {
    let (neg, num, rest) = strtoull0(arg);
    let num = num?;
    let mut chars = rest.chars();
    let suffix = chars.next();
    if chars.next().is_some() {
        return None;
    }
    let shl = |n: u64, s: u32| n.checked_shl(s).filter(|v| v >> s == n);
    let k = |n: u64| match log_block_size {
        None => shl(n, 10),
        Some(l) => Some(n >> l),
    };
    let v = match suffix {
        None => num,
        Some('T' | 't') => k(shl(num, 30)?)?,
        Some('G' | 'g') => k(shl(num, 20)?)?,
        Some('M' | 'm') => k(shl(num, 10)?)?,
        Some('K' | 'k') => k(num)?,
        Some('s') => match log_block_size {
            None => shl(num, 9)?,
            Some(l) => num >> (1 + l),
        },
        Some(_) => return None,
    };
    Some((neg, v))
}

/// `parse_num_blocks2`: a number with an optional K/M/G/T/s suffix, in
/// blocks of `1024 << log_block_size` (the FS-SIZE argument,
/// `orphan_file_size=`). `None` for garbage, 0 and overflow (a negative
/// number wraps, as with strtoull).
pub fn parse_num_blocks(arg: &str, log_block_size: u32) -> Option<u64> {
    let (neg, v) = num_blocks_magnitude(arg, Some(log_block_size))?;
    let v = if neg { v.wrapping_neg() } else { v };
    (v != 0).then_some(v)
}

/// `-b`: `parse_num_blocks2(arg, -1)`, in bytes with an optional suffix
/// (`4k`); negative means "at least". The range (1024..=65536 in
/// magnitude, any number: mke2fs rounds it down to a power of two) is
/// checked by [`resolve`].
pub fn parse_block_size_arg(arg: &str) -> Result<i64, String> {
    let (neg, v) =
        num_blocks_magnitude(arg, None).ok_or_else(|| format!("invalid block size - {arg}"))?;
    let v = v.min(i64::MAX as u64) as i64;
    Ok(if neg { -v } else { v })
}

/// `-i`: `parse_num_blocks(arg, -1)`, bytes per inode with an optional
/// suffix (`64k`); mke2fs checks the range (1024..=64 MiB) in `resolve`.
pub fn parse_inode_ratio_arg(arg: &str) -> Result<u64, String> {
    match num_blocks_magnitude(arg, None) {
        Some((neg, v)) => Ok(if neg { v.wrapping_neg() } else { v }),
        None => Err(format!(
            "invalid inode ratio {arg} (min 1024/max {})",
            65536 * 1024
        )),
    }
}

/// `strtoul(arg, &end, 0)` that must use the whole argument (`-N`, `-g`,
/// `-G`, `-I`): decimal, `0x` hex or leading-`0` octal; a `-` negates
/// modulo 2^64 and an overflow saturates, as glibc does.
pub fn parse_c_ulong(arg: &str) -> Result<u64, String> {
    let (neg, v, rest) = strtoull0(arg);
    if !rest.is_empty() || arg.is_empty() {
        return Err(format!("'{arg}' is not a number"));
    }
    Ok(match (neg, v) {
        (_, None) => u64::MAX,
        (true, Some(v)) => v.wrapping_neg(),
        (false, Some(v)) => v,
    })
}

/// [`parse_c_ulong`] stored in a C `unsigned int`/`int` (`-g`, `-I`):
/// the low 32 bits, as mke2fs's assignment keeps.
pub fn parse_c_uint(arg: &str) -> Result<u32, String> {
    parse_c_ulong(arg).map(|v| v as u32)
}

/// `-C`: `parse_num_blocks2(arg, -1)`, bytes with an optional suffix;
/// mke2fs takes more than 1 KiB up to 512 MiB (`EXT2_MAX_CLUSTER_SIZE`).
pub fn parse_cluster_size_arg(arg: &str) -> Result<u32, String> {
    match num_blocks_magnitude(arg, None) {
        Some((false, v)) if v > 1024 && v <= 1 << 29 => Ok(v as u32),
        _ => Err(format!("invalid cluster size - {arg}")),
    }
}

/// `-G`: [`parse_c_ulong`]; mke2fs refuses sizes above 2^32 - 1.
pub fn parse_flex_bg_size_arg(arg: &str) -> Result<u32, String> {
    let v = parse_c_ulong(arg)?;
    u32::try_from(v).map_err(|_| format!("flex_bg size ({v}) must be less than or equal to 2^31"))
}

/// `strtoul(arg, &end, 0)` as mke2fs calls it where only `*end` is
/// checked: the whole argument must be the number, and an empty one is 0
/// (a negative number wraps modulo 2^64, an overflow saturates).
fn c_strtoul_whole(arg: &str) -> Option<u64> {
    if arg.is_empty() {
        return Some(0);
    }
    parse_c_ulong(arg).ok()
}

/// `strtoul(arg, &end, 0)` with nothing checked: the number at the
/// start, 0 for garbage (mke2fs's `lazy_itable_init=` and the like).
fn c_strtoul_prefix(arg: &str) -> (u64, &str) {
    let (neg, v, rest) = strtoull0(arg);
    let v = match (neg, v) {
        (_, None) => u64::MAX,
        (true, Some(v)) => v.wrapping_neg(),
        (false, Some(v)) => v,
    };
    (v, rest)
}

/// `strtod` with `*end` checked: the whole argument must be the number.
/// As glibc's strtod in the C locale: C white space first, a sign, then
/// a decimal number with an optional exponent, a hexadecimal float
/// (`0x1.8p3`, the exponent optional), `inf`/`infinity` or `nan` with an
/// optional `(chars)`. An empty argument is 0 (strtod stops at once and
/// `*end` is the terminating NUL), only blanks are not.
fn c_strtod_whole(arg: &str) -> Option<f64> {
    if arg.is_empty() {
        return Some(0.0);
    }
    let (v, rest) = c_strtod(arg);
    rest.is_empty().then_some(v)
}

/// `strtod(s, &end)`: the value and the unparsed rest (all of `s`, and
/// 0, when no number starts it).
pub(crate) fn c_strtod(s: &str) -> (f64, &str) {
    let t = s.trim_start_matches(is_c_space);
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let sign = |v: f64| if neg { -v } else { v };
    let lower = body.get(..8).unwrap_or(body).to_ascii_lowercase();
    if lower.starts_with("infinity") {
        return (sign(f64::INFINITY), &body[8..]);
    }
    if lower.starts_with("inf") {
        return (sign(f64::INFINITY), &body[3..]);
    }
    if lower.starts_with("nan") {
        let mut rest = &body[3..];
        // nan(n-char-sequence): letters, digits and '_' in parentheses.
        if let Some(inner) = rest.strip_prefix('(')
            && let Some(close) = inner.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            && inner[close..].starts_with(')')
        {
            rest = &inner[close + 1..];
        }
        return (sign(f64::NAN), rest);
    }
    let hex = body.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("0x"));
    if hex && let Some((v, rest)) = hex_float(&body[2..]) {
        return (sign(v), rest);
    }
    // Decimal: digits, an optional fraction, at least one digit in all,
    // then an exponent only if it has digits.
    let b = body.as_bytes();
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let int = digits(0);
    let mut end = int;
    let mut frac = 0;
    if b.get(end) == Some(&b'.') {
        frac = digits(end + 1);
        end += 1 + frac;
    }
    if int + frac == 0 {
        return (0.0, s);
    }
    if matches!(b.get(end), Some(b'e' | b'E')) {
        let mut e = end + 1;
        if matches!(b.get(e), Some(b'+' | b'-')) {
            e += 1;
        }
        let n = digits(e);
        if n > 0 {
            end = e + n;
        }
    }
    // Rust reads this subset of strtod's syntax, correctly rounded.
    let v = body[..end].parse::<f64>().unwrap_or(0.0);
    (sign(v), &body[end..])
}

/// The part of a hexadecimal float after `0x`: hex digits with an
/// optional `.` (at least one digit), then an optional binary exponent
/// `p[+-]digits`. `None` when no digit follows (strtod then reads the
/// `0` alone).
fn hex_float(s: &str) -> Option<(f64, &str)> {
    let b = s.as_bytes();
    // The first 15 significant digits (60 bits) are kept; any nonzero
    // digit after them only sets the lowest bit, so that the conversion
    // to 53 bits still rounds as if all were there.
    let mut mant: u64 = 0;
    let mut kept = 0u32;
    let mut sticky = false;
    let mut exp: i64 = 0;
    let mut any = false;
    let mut i = 0;
    let mut seen_dot = false;
    while i < b.len() {
        let c = b[i];
        if c == b'.' && !seen_dot {
            seen_dot = true;
            i += 1;
            continue;
        }
        let Some(d) = (c as char).to_digit(16) else {
            break;
        };
        any = true;
        if mant == 0 && d == 0 {
            // Leading zeros carry no bits.
            if seen_dot {
                exp -= 4;
            }
        } else if kept < 15 {
            mant = mant << 4 | u64::from(d);
            kept += 1;
            if seen_dot {
                exp -= 4;
            }
        } else {
            sticky |= d != 0;
            if !seen_dot {
                exp += 4;
            }
        }
        i += 1;
    }
    if !any {
        return None;
    }
    if matches!(b.get(i), Some(b'p' | b'P')) {
        let mut e = i + 1;
        let neg = match b.get(e) {
            Some(b'-') => {
                e += 1;
                true
            }
            Some(b'+') => {
                e += 1;
                false
            }
            _ => false,
        };
        let n = b[e..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n > 0 {
            // Saturate: a huge exponent is inf or 0 anyway.
            let p = s[e..e + n].parse::<i64>().unwrap_or(i64::MAX).min(1 << 20);
            exp += if neg { -p } else { p };
            i = e + n;
        }
    }
    let m = (mant | u64::from(sticky)) as f64;
    // Scale in steps that stay within f64's exponent range.
    let mut v = m;
    let mut e = exp;
    while e != 0 && v != 0.0 && v.is_finite() {
        let step = e.clamp(-1000, 1000);
        v *= 2f64.powi(step as i32);
        e -= step;
    }
    Some((v, &s[i..]))
}

/// What mke2fs's getopt loop takes from the options it checks while
/// reading them (see [`getopt_check`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Getopt {
    /// `-b`, every one (see [`MkfsOptions::earlier_block_sizes`]).
    pub block_sizes: Vec<i64>,
    pub cluster_size: Option<u32>,
    pub errors: Option<String>,
    pub blocks_per_group: Option<u32>,
    pub flex_bg_size: Option<u32>,
    pub inode_ratio: Option<u64>,
    pub inode_size: Option<u32>,
    pub reserved_ratio: Option<f64>,
    pub num_inodes: Option<u64>,
    pub revision: Option<String>,
    /// mke2fs's `journal_size` once `-j` and the `-J size=` values were
    /// read in order: 0 = no journal asked for, < 0 = the default size,
    /// else MiB.
    pub journal_size: i32,
    /// The last `-J device=`, as the lookup given to
    /// [`getopt_check_with`] found it (mke2fs's `journal_device`).
    pub journal_device: Option<String>,
    /// What the loop prints as it reads the options, in order.
    pub notes: Vec<LoopNote>,
}

/// A message mke2fs's getopt loop prints on stderr while it reads the
/// options (before its version line, and before the error of a later
/// option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoopNote {
    /// `-R`: "PROGRAM: '-R' is deprecated, use '-E' instead".
    RDeprecated,
    /// `-K`: deprecated, use `-E nodiscard`.
    KDeprecated,
    /// A `-b` over 4096 bytes: "Warning: blocksize N not usable on most
    /// systems."
    BlockSizeUnusable(i64),
    /// A `-L` over 16 bytes: [`label_warning`]'s text.
    LabelTooLong(String),
}

/// [`getopt_check_with`]'s error: the option refused, and what the loop
/// printed before it.
#[derive(Clone, Debug, PartialEq)]
pub struct GetoptFailure {
    pub notes: Vec<LoopNote>,
    pub error: OptionError,
}

/// mke2fs's `PRS()` getopt loop: each option checked as it is read, in
/// command-line order (`(option letter, value)`, `-j` with an empty
/// value), so the first bad one is the error, with mke2fs's message, and
/// it comes before `-V` prints the version. Later checks stay in
/// [`resolve`]. A `-J device=` is taken as found, as given (see
/// [`getopt_check_with`]).
pub fn getopt_check(args: &[(char, String)]) -> Result<Getopt, OptionError> {
    getopt_check_with(args, &mut |spec| Some(spec.to_string())).map_err(|f| f.error)
}

/// [`getopt_check`] with mke2fs's lookup of each `-J device=SPEC` as it
/// is read (`get_devname`: a `NAME=value` tag or a path): `find_journal`
/// returns the device's path, or `None` for a tag that names nothing,
/// mke2fs's "Could not find journal device matching SPEC" (before `-V`
/// prints anything, like the other errors of the loop).
///
/// `-R`, `-K` (with an empty value) and `-L` are listed too, for the
/// [`LoopNote`]s they print.
pub fn getopt_check_with(
    args: &[(char, String)],
    find_journal: &mut dyn FnMut(&str) -> Option<String>,
) -> Result<Getopt, GetoptFailure> {
    let mut g = Getopt::default();
    match getopt_loop(args, find_journal, &mut g) {
        Ok(()) => Ok(g),
        Err(error) => Err(GetoptFailure {
            notes: g.notes,
            error,
        }),
    }
}

fn getopt_loop(
    args: &[(char, String)],
    find_journal: &mut dyn FnMut(&str) -> Option<String>,
    g: &mut Getopt,
) -> Result<(), OptionError> {
    let (mut fs_type_seen, mut usage_seen) = (false, false);
    for (c, arg) in args {
        let arg = arg.as_str();
        match *c {
            'b' => {
                let b = parse_block_size_arg(arg).unwrap_or(0);
                if !(1024..=65536).contains(&b.unsigned_abs()) {
                    return err(format!("invalid block size - {arg}"));
                }
                g.block_sizes.push(b);
            }
            'C' => {
                g.cluster_size = Some(
                    parse_cluster_size_arg(arg)
                        .map_err(|_| OptionError(format!("invalid cluster size - {arg}")))?,
                );
            }
            'e' => match arg {
                "continue" | "remount-ro" | "panic" => g.errors = Some(arg.to_string()),
                _ => return err(format!("bad error behavior - {arg}")),
            },
            'g' => {
                let v = c_strtoul_whole(arg)
                    .ok_or_else(|| OptionError("Illegal number for blocks per group".into()))?
                    as u32;
                if !v.is_multiple_of(8) {
                    return err("blocks per group must be multiple of 8");
                }
                g.blocks_per_group = Some(v);
            }
            'G' => {
                let v = c_strtoul_whole(arg)
                    .ok_or_else(|| OptionError("Illegal number for flex_bg size".into()))?;
                if v < 1 || v & (v - 1) != 0 {
                    return err("flex_bg size must be a power of 2");
                }
                if v > u64::from(u32::MAX) {
                    return err(format!(
                        "flex_bg size ({v}) must be less than or equal to 2^31"
                    ));
                }
                g.flex_bg_size = Some(v as u32);
            }
            'i' => {
                // parse_num_blocks into an int.
                let r = parse_inode_ratio_arg(arg).unwrap_or(0) as i32;
                if !(1024..=65536 * 1024).contains(&r) {
                    return err(format!(
                        "invalid inode ratio {arg} (min 1024/max {})",
                        65536 * 1024
                    ));
                }
                g.inode_ratio = Some(r as u64);
            }
            'I' => {
                let v = c_strtoul_whole(arg)
                    .ok_or_else(|| OptionError(format!("invalid inode size - {arg}")))?;
                g.inode_size = Some(v as u32);
            }
            'j' if g.journal_size == 0 => g.journal_size = -1,
            'J' => parse_journal_opts(arg, g, find_journal)?,
            'm' => match c_strtod_whole(arg) {
                // A NaN passes mke2fs's `> 50 || < 0` check, but its
                // reserved block count is then the NaN's cast to an
                // integer, undefined in C (2^63 on x86-64: refused with
                // 64bit, "Invalid argument passed to ext2 library", and
                // truncated to 0 without): refused here with the message
                // of the other values out of range.
                Some(r) if (0.0..=50.0).contains(&r) => g.reserved_ratio = Some(r),
                _ => return err(format!("invalid reserved blocks percent - {arg}")),
            },
            'N' => {
                let v = c_strtoul_whole(arg)
                    .ok_or_else(|| OptionError(format!("bad num inodes - {arg}")))?;
                g.num_inodes = Some(v);
            }
            'r' => {
                let v = c_strtoul_whole(arg)
                    .ok_or_else(|| OptionError(format!("bad revision level - {arg}")))?;
                if v > 1 {
                    return err(format!(
                        "Filesystem revision too high while trying to create revision {}",
                        v as i32
                    ));
                }
                g.revision = Some(arg.to_string());
            }
            't' => {
                if fs_type_seen {
                    return err("The -t option may only be used once");
                }
                fs_type_seen = true;
            }
            'T' => {
                if usage_seen {
                    return err("The -T option may only be used once");
                }
                usage_seen = true;
            }
            'R' => g.notes.push(LoopNote::RDeprecated),
            'K' => g.notes.push(LoopNote::KDeprecated),
            'L' => g
                .notes
                .extend(label_warning(Some(arg)).map(LoopNote::LabelTooLong)),
            _ => {}
        }
        // mke2fs warns as it reads a -b it took.
        if *c == 'b'
            && let Some(&b) = g.block_sizes.last()
            && b > 4096
        {
            g.notes.push(LoopNote::BlockSizeUnusable(b));
        }
    }
    Ok(())
}

/// `parse_journal_opts` (misc/util.c): `size=` and `fast_commit_size=`
/// are `strtoul(arg, &p, 0)` into an int (hex and octal too; `size=0`
/// asks for no journal size, a negative one for the default), `device=`
/// (looked up at once with `find_journal`), `location=`, `v1_superblock`; anything else
/// is mke2fs's "Bad journal options specified".
fn parse_journal_opts(
    opts: &str,
    g: &mut Getopt,
    find_journal: &mut dyn FnMut(&str) -> Option<String>,
) -> Result<(), OptionError> {
    let bad = |why: String| OptionError(format!("Bad journal options specified: {why}"));
    for tok in opts.split(',').filter(|t| !t.is_empty()) {
        let (k, v) = match tok.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (tok, None),
        };
        match (k, v) {
            ("device" | "size" | "fast_commit_size" | "location", None) => {
                return Err(bad(format!("journal option '{k}' needs a value")));
            }
            ("size", Some(v)) => {
                let n = c_strtoul_whole(v)
                    .ok_or_else(|| bad(format!("invalid journal size: '{v}'")))?;
                g.journal_size = n as i32;
            }
            ("fast_commit_size", Some(v)) => {
                c_strtoul_whole(v)
                    .ok_or_else(|| bad(format!("invalid fast commit size: '{v}'")))?;
            }
            ("device", Some(v)) => {
                let dev = find_journal(v).ok_or_else(|| {
                    OptionError(format!("Could not find journal device matching {v}"))
                })?;
                g.journal_device = Some(dev);
            }
            ("location", Some(_)) => {}
            // Refused by resolve (see there).
            ("v1_superblock", _) => {}
            _ => return Err(bad(format!("bad journal option: '{k}'"))),
        }
    }
    Ok(())
}

/// mke2fs's warning for a `-L` of more than 16 bytes (its getopt loop
/// prints it as it reads the option; [`resolve`] lists it in its
/// warnings too).
pub fn label_warning(label: Option<&str>) -> Option<String> {
    let l = label.filter(|l| l.len() > 16)?;
    // mke2fs's wording (and its blank line after).
    let cut = String::from_utf8_lossy(&l.as_bytes()[..16]).into_owned();
    Some(format!(
        "Warning: label too long; will be truncated to '{cut}'\n"
    ))
}

/// Parse a UUID in the usual 8-4-4-4-12 form.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    uuid::Uuid::try_parse(s)
        .ok()
        .filter(|_| s.len() == 36)
        .map(|u| *u.as_bytes())
}

/// mke2fs's `ok_features`: what `-O` and mke2fs.conf may set or clear.
/// Any other feature, named or `FEATURE_<C|I|R><bit>`, is refused both
/// ways ("^lazy_bg" too), as mke2fs 1.47.0 refuses it.
fn ok_to_edit(word: Word, bit: u32) -> bool {
    let ok = match word {
        Word::Compat => {
            Compat::HAS_JOURNAL.bits()
                | Compat::RESIZE_INODE.bits()
                | Compat::DIR_INDEX.bits()
                | Compat::EXT_ATTR.bits()
                | Compat::SPARSE_SUPER2.bits()
                | Compat::FAST_COMMIT.bits()
                | Compat::STABLE_INODES.bits()
                | Compat::ORPHAN_FILE.bits()
        }
        Word::Incompat => {
            Incompat::FILETYPE.bits()
                | Incompat::EXTENTS.bits()
                | Incompat::JOURNAL_DEV.bits()
                | Incompat::META_BG.bits()
                | Incompat::FLEX_BG.bits()
                | Incompat::EA_INODE.bits()
                | Incompat::MMP.bits()
                | Incompat::BIT64.bits()
                | Incompat::INLINE_DATA.bits()
                | Incompat::ENCRYPT.bits()
                | Incompat::CASEFOLD.bits()
                | Incompat::CSUM_SEED.bits()
                | Incompat::LARGEDIR.bits()
        }
        Word::RoCompat => {
            RoCompat::LARGE_FILE.bits()
                | RoCompat::HUGE_FILE.bits()
                | RoCompat::DIR_NLINK.bits()
                | RoCompat::EXTRA_ISIZE.bits()
                | RoCompat::SPARSE_SUPER.bits()
                | RoCompat::GDT_CSUM.bits()
                | RoCompat::BIGALLOC.bits()
                | RoCompat::QUOTA.bits()
                | RoCompat::METADATA_CSUM.bits()
                | RoCompat::PROJECT.bits()
                | RoCompat::VERITY.bits()
        }
    };
    ok & bit == bit
}

/// Apply an e2p feature edit string ("feat,^feat,...").
pub fn edit_features(f: &mut Features, s: &str) -> Result<(), OptionError> {
    for tok in s.split([',', ' ', '\t']).filter(|t| !t.is_empty()) {
        let (on, name) = match tok.strip_prefix(['^', '-']) {
            Some(n) => (false, n),
            None => (true, tok.strip_prefix('+').unwrap_or(tok)),
        };
        if name.eq_ignore_ascii_case("none") || name.eq_ignore_ascii_case("clear") {
            *f = Features::default();
            continue;
        }
        // mke2fs names the whole string it was given, whatever word in it
        // is unknown or not allowed.
        match Features::lookup(name) {
            Some((word, bit)) if ok_to_edit(word, bit) => f.set(word, bit, on),
            _ => return err(format!("Invalid filesystem option set: {s}")),
        }
    }
    Ok(())
}

/// Default mount options (`s_default_mount_opts` bits), as e2p names them.
const MNTOPTS: &[(&str, u32)] = &[
    ("debug", 0x1),
    ("bsdgroups", 0x2),
    ("user_xattr", 0x4),
    ("acl", 0x8),
    ("uid16", 0x10),
    ("journal_data", 0x20),
    ("journal_data_ordered", 0x40),
    ("journal_data_writeback", 0x60),
    ("nobarrier", 0x100),
    ("block_validity", 0x200),
    ("discard", 0x400),
    ("nodelalloc", 0x800),
];
/// The journalling-mode field of the default mount options.
const DEFM_JMODE: u32 = 0x60;

/// `e2p_string2mntopt`: a name (case-insensitive) or `MNTOPT_<n>`.
fn mntopt_mask(name: &str) -> Option<u32> {
    if let Some(&(_, m)) = MNTOPTS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
        return Some(m);
    }
    let b = name.as_bytes();
    if b.len() < 7 || !b[..7].eq_ignore_ascii_case(b"MNTOPT_") || b.len() < 9 {
        return None;
    }
    // e2p hands `strtol` the string from its 9th byte on (a quirk kept for
    // parity): "MNTOPT_12" is bit 2 and "MNTOPT_5" is refused.
    let rest = std::str::from_utf8(&b[8..]).ok()?;
    let t = rest.trim_start_matches(is_c_space);
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0u64, |n, c| {
        n.saturating_mul(10).saturating_add(u64::from(c - b'0'))
    });
    match (neg, n) {
        (false, 0..=31) => Some(1 << n),
        (true, 0) => Some(1),
        _ => None,
    }
}

fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// `e2p_edit_mntopts` (every option allowed): apply "opt,^opt,+opt,-opt"
/// to `opts`, with e2p's tokenizer: blanks before a word are skipped, a
/// word ends at a blank or a comma, and the character ending it is
/// consumed, so an empty word (",,", ", ", a leading comma) is an error.
/// `Err` carries the first word that is not a known option; `opts` may
/// then be partly edited, as in e2p.
pub fn edit_mntopts(opts: &mut u32, s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let space = |c: u8| is_c_space(char::from(c));
    let mut i = 0;
    while i < b.len() {
        while i < b.len() && space(b[i]) {
            i += 1;
        }
        let start = i;
        while i < b.len() && !space(b[i]) && b[i] != b',' {
            i += 1;
        }
        let tok = &s[start..i];
        let (neg, name) = match tok.as_bytes().first() {
            Some(b'-' | b'^') => (true, &tok[1..]),
            Some(b'+') => (false, &tok[1..]),
            _ => (false, tok),
        };
        let Some(mask) = mntopt_mask(name) else {
            return Err(tok.to_owned());
        };
        if mask & DEFM_JMODE != 0 {
            *opts &= !DEFM_JMODE;
        }
        if neg {
            *opts &= !mask;
        } else {
            *opts |= mask;
        }
        i += 1;
    }
    Ok(())
}

/// A time-based (version 1) UUID, as `uuid_generate_time` makes for
/// `-U time`: the current time, a random clock sequence and a random node
/// id with the multicast bit set (libuuid's choice when it has no MAC
/// address; it never exposes one here).
fn time_uuid() -> [u8; 16] {
    let r = *uuid::Uuid::new_v4().as_bytes();
    let mut node = [0u8; 6];
    node.copy_from_slice(&r[..6]);
    node[0] |= 0x01;
    let ts = uuid::Timestamp::now(uuid::timestamp::context::ContextV1::new(
        u16::from_le_bytes([r[6], r[7]]),
    ));
    *uuid::Uuid::new_v1(ts, &node).as_bytes()
}

/// `atoi()`: optional blanks and sign, then digits; anything else ends the
/// number (no digits: 0). Saturates instead of overflowing.
fn atoi(s: &str) -> i64 {
    let t = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let mut n: i64 = 0;
    for b in t.bytes().take_while(u8::is_ascii_digit) {
        n = n.saturating_mul(10).saturating_add(i64::from(b - b'0'));
    }
    if neg { -n } else { n }
}

/// The sector sizes mke2fs uses: the device's (`logical`, `physical`; 0 =
/// unknown, as for regular files), overridden by `MKE2FS_DEVICE_SECTSIZE`
/// and `MKE2FS_DEVICE_PHYS_SECTSIZE` (read with `atoi`, as mke2fs does;
/// `var` looks a variable up). A negative value acts like 0 in every
/// comparison mke2fs makes, so it is returned as 0.
pub fn sector_sizes(
    logical: u32,
    physical: u32,
    var: impl Fn(&str) -> Option<String>,
) -> (u32, u32) {
    let get = |name: &str, dflt: u32| match var(name) {
        Some(v) => atoi(&v).clamp(0, i64::from(i32::MAX)) as u32,
        None => dflt,
    };
    (
        get("MKE2FS_DEVICE_SECTSIZE", logical),
        get("MKE2FS_DEVICE_PHYS_SECTSIZE", physical),
    )
}

/// Environment facts the resolver needs (injected for tests).
#[derive(Clone, Debug)]
pub struct Env {
    /// Device size in bytes (`None` when the file does not exist yet).
    pub device_size: Option<u64>,
    /// The target is a regular file (it may grow to the requested size, as
    /// with mke2fs); block devices may not be exceeded.
    pub is_regular_file: bool,
    /// Logical sector size (`BLKSSZGET`; 0 when unknown, e.g. a regular
    /// file), after `MKE2FS_DEVICE_SECTSIZE` (see [`sector_sizes`]).
    pub logical_sector_size: u32,
    /// Physical sector size (`BLKPBSZGET`; 0 when unknown), after
    /// `MKE2FS_DEVICE_PHYS_SECTSIZE`. mke2fs uses the logical size when
    /// this is 0.
    pub physical_sector_size: u32,
    /// The block device's I/O hints (`None` for regular files, as mke2fs
    /// asks libblkid for none there).
    pub io_hints: Option<ext4kit_device::IoHints>,
    /// Seconds since the epoch to stamp (E2FSPROGS_FAKE_TIME etc.).
    pub now: u32,
    pub page_size: u32,
    pub uid: u32,
    pub gid: u32,
    /// Kernel supports lazy itable init.
    pub kernel_lazy_itable_init: bool,
}

/// The `device=` of the `-J` options (the last one, as mke2fs keeps it):
/// a path, or `UUID=`/`LABEL=` (any `NAME=value` libblkid knows) for the
/// caller to look up. `device` without a value is mke2fs's "Bad journal
/// options".
pub fn journal_device_spec(journal: &[String]) -> Result<Option<String>, OptionError> {
    let mut dev = None;
    for tok in journal.iter().flat_map(|j| j.split(',')) {
        match tok.split_once('=') {
            Some(("device", v)) => dev = Some(v.to_string()),
            None if tok == "device" => return err("journal option 'device' needs a value"),
            _ => {}
        }
    }
    Ok(dev)
}

/// `-E resize=N` as mke2fs's parse_extended_opts reads it: N blocks (with
/// a K/M/G/T suffix) that the reserved GDT blocks must cover, more than
/// the filesystem has now. The result is the reserved descriptor blocks
/// (at most a block's worth of pointers); 0 or less leaves the default.
/// mke2fs counts the groups of `blocks` without the first data block and
/// divides in 32-bit unsigned arithmetic: a limit past 2^32 groups wraps.
fn resize_reserved_gdt(
    arg: &str,
    log_bs: u32,
    blocks: u64,
    blocks_per_group: u32,
    desc_size: u32,
) -> Result<u32, OptionError> {
    let resize = match parse_num_blocks(arg, log_bs) {
        Some(r) => r,
        None => return err(format!("Invalid resize parameter: {arg}")),
    };
    if resize <= blocks {
        return err("The resize maximum must be greater than the filesystem size.");
    }
    let bs = 1024u64 << log_bs;
    let bpg = if blocks_per_group == 0 {
        bs * 8
    } else {
        u64::from(blocks_per_group)
    };
    let gdpb = (bs / u64::from(desc_size)) as u32;
    // ext2fs_div_ceil(unsigned int, unsigned int).
    let div_ceil32 = |a: u32, b: u32| if a == 0 { 0 } else { (a - 1) / b + 1 };
    let groups = blocks.div_ceil(bpg) as u32;
    let desc_blocks = groups.div_ceil(gdpb);
    let rsv_groups = resize.div_ceil(bpg);
    let rsv_gdb = i64::from(div_ceil32(rsv_groups as u32, gdpb)) - i64::from(desc_blocks);
    let apb = (bs / 4) as i64;
    Ok(rsv_gdb.min(apb).max(0) as u32)
}

/// mke2fs's `journal_size`: the last `-J size=` (strtoul base 0 into an
/// int: `size=0` is no size at all, a negative one the default), and
/// `-j` turning a 0 into -1. `add_journal` stands for a `-j` given after
/// the last `size=` (the caller knows the order; [`getopt_check`] reads
/// it the same way).
pub fn journal_size(add_journal: bool, journal: &[String]) -> i32 {
    let mut size = 0i32;
    for tok in journal.iter().flat_map(|j| j.split(',')) {
        if let Some(("size", v)) = tok.split_once('=') {
            size = c_strtoul_whole(v).unwrap_or(0) as i32;
        }
    }
    if add_journal && size == 0 { -1 } else { size }
}

/// mke2fs's `journal_size != 0`: `-j`, or a `-J size=` other than 0 (not
/// `device=`, `location=` or `fast_commit_size=` alone).
pub fn journal_size_given(add_journal: bool, journal: &[String]) -> bool {
    journal_size(add_journal, journal) != 0
}

/// Resolve options into planner parameters. No I/O except what `env`
/// already captured; random UUIDs come from the `uuid` crate.
pub fn resolve(opts: &MkfsOptions, profile: &Profile, env: &Env) -> Result<Resolved, OptionError> {
    let mut warnings = Vec::new();
    // -r, checked while mke2fs parses the command line.
    let rev0 = match opts.revision.as_deref() {
        None => false,
        Some(r) => match parse_c_ulong(r) {
            Ok(0) => true,
            Ok(1) => false,
            Ok(n) => {
                return err(format!(
                    "Filesystem revision too high while trying to create revision {}",
                    n as i32
                ));
            }
            Err(_) => return err(format!("bad revision level - {r}")),
        },
    };
    // -b
    let mut blocksize: i64 = 0;
    if let Some(b) = opts.block_size {
        // Any size in range: mke2fs uses the power of two below it
        // (int_log2) for the block size, but the number as given in a few
        // places (see `raw_bs` below).
        if !(1024..=65536).contains(&b.unsigned_abs()) {
            return err(format!("invalid block size - {b}"));
        }
        blocksize = b;
    }
    for &b in &opts.earlier_block_sizes {
        if !(1024..=65536).contains(&b.unsigned_abs()) {
            return err(format!("invalid block size - {b}"));
        }
    }
    // -J device= without a block size: the journal device's ("Using
    // journal device's blocksize"), at least a negative -b's.
    if journal_device_spec(&opts.journal)?.is_some() && opts.external_journal.is_none() {
        return err("-J device=: the journal device has not been read");
    }
    if blocksize <= 0
        && let Some(ej) = &opts.external_journal
    {
        let jbs = i64::from(ej.block_size);
        if blocksize < 0 && jbs < -blocksize {
            return err(format!(
                "Journal dev blocksize ({jbs}) smaller than minimum blocksize {}",
                -blocksize
            ));
        }
        blocksize = jbs;
    }
    // EXT2_BLOCK_SIZE(&fs_param) until the block size is final: the last
    // positive -b (int_log2 of its KiB), else 1 KiB.
    let log_bs_hint = std::iter::once(blocksize)
        .chain(opts.earlier_block_sizes.iter().rev().copied())
        .find(|&b| b > 0)
        .map_or(0, |b| (b as u64 / 1024).ilog2());
    let unit = 1024u64 << log_bs_hint;
    // Size.
    let explicit = match &opts.fs_size {
        Some(s) => match parse_num_blocks(s, log_bs_hint) {
            Some(n) if n > 0 => Some(n),
            _ => {
                return err(format!(
                    "invalid blocks '{s}' on device '{}'",
                    opts.device_name.as_deref().unwrap_or("")
                ));
            }
        },
        None => None,
    };
    let mut fs_blocks_count = match (explicit, env.device_size) {
        (Some(n), _) => n,
        (None, Some(0)) => return err("device size reported to be zero"),
        (None, Some(sz)) => {
            let mut n = sz / unit;
            let ratio = u64::from(env.page_size) / unit;
            if ratio > 1 {
                n &= !(ratio - 1);
            }
            n
        }
        (None, None) => return err("the file does not exist and no size was specified"),
    };
    if let (Some(n), Some(sz)) = (explicit, env.device_size)
        && !env.is_regular_file
        && n.saturating_mul(unit) > sz
    {
        return err(format!(
            "filesystem larger than apparent device size ({} > {} bytes)",
            n.saturating_mul(unit),
            sz
        ));
    }
    let creator_os_name = opts.creator_os.clone().or_else(|| {
        profile
            .get_value(&["defaults", "creator_os"])
            .map(str::to_owned)
    });
    let types = profile
        .fs_types_with(&FsTypeQuery {
            fs_type: opts.fs_type.as_deref(),
            usage_types: opts.usage_types.as_deref(),
            fs_blocks_count,
            block_size: 1024 << log_bs_hint,
            is_hurd: for_hurd(creator_os_name.as_deref()),
            journal: journal_size_given(opts.add_journal, &opts.journal),
            force: opts.force,
        })
        .map_err(|e| OptionError(e.to_string().replace('\n', " ")))?;
    warnings.extend(types.warnings.iter().cloned());
    let mut fs_types = types.types.clone();
    // default_mntopts is looked up before -O journal_dev replaces the list.
    let mntopt_types = fs_types.clone();
    // Features.
    let mut f = Features::default();
    let edits = profile.feature_edits(&fs_types);
    let user_features = opts.features.join(",");
    // Revision 0: no features and no default mount options from the
    // profile (mke2fs skips them); only -O can add some, and is refused.
    let hurd = for_hurd(creator_os_name.as_deref());
    if !rev0 {
        let mut profile_edits = vec![edits.base.clone()];
        profile_edits.extend(edits.fs_type_features.iter().cloned());
        for e in profile_edits.iter().filter(|e| !e.is_empty()) {
            edit_features(&mut f, e)?;
        }
    }
    // Features the Hurd does not support, masked after the profile's
    // features and before default_features and -O (as mke2fs).
    if hurd {
        f.incompat.remove(Incompat::FILETYPE);
        f.ro_compat.remove(RoCompat::HUGE_FILE);
        f.ro_compat.remove(RoCompat::METADATA_CSUM);
        f.incompat.remove(Incompat::EA_INODE);
        f.incompat.remove(Incompat::CASEFOLD);
    }
    if !rev0
        && opts.features.is_empty()
        && let Some(d) = &edits.default_features
    {
        edit_features(&mut f, d)?;
    }
    let default_orphan = f.compat.contains(Compat::ORPHAN_FILE);
    let default_seed = f.incompat.contains(Incompat::CSUM_SEED);
    if !opts.features.is_empty() {
        edit_features(&mut f, &user_features)?;
    }
    if rev0 && (f.compat.bits() != 0 || f.incompat.bits() != 0 || f.ro_compat.bits() != 0) {
        return err("Filesystem features not supported with revision 0 filesystems");
    }
    if hurd {
        for (on, name) in [
            (f.incompat.contains(Incompat::FILETYPE), "filetype"),
            (f.ro_compat.contains(RoCompat::HUGE_FILE), "huge_file"),
            (
                f.ro_compat.contains(RoCompat::METADATA_CSUM),
                "metadata_csum",
            ),
            (f.incompat.contains(Incompat::EA_INODE), "ea_inode"),
        ] {
            if on {
                return err(format!("The HURD does not support the {name} feature."));
            }
        }
    }
    if let Some(v) = &opts.sparse_super {
        match atoi(v) {
            n if n > 0 => {
                if rev0 {
                    return err("Sparse superblocks not supported with revision 0 filesystems");
                }
                f.ro_compat.insert(RoCompat::SPARSE_SUPER);
            }
            0 => f.ro_compat.remove(RoCompat::SPARSE_SUPER),
            _ => {}
        }
    }
    if journal_size_given(opts.add_journal, &opts.journal) {
        if rev0 {
            return err("Journals not supported with revision 0 filesystems");
        }
        f.compat.insert(Compat::HAS_JOURNAL);
    }
    if default_orphan && !f.compat.contains(Compat::HAS_JOURNAL) {
        f.compat.remove(Compat::ORPHAN_FILE);
    }
    if default_seed && !f.ro_compat.contains(RoCompat::METADATA_CSUM) {
        f.incompat.remove(Incompat::CSUM_SEED);
    }
    // Block size. A sector size of 0 is unknown (regular files).
    let lsector = env.logical_sector_size;
    let psector = if env.physical_sector_size == 0 {
        lsector
    } else {
        env.physical_sector_size
    };
    if blocksize <= 0 {
        let mut use_bsize = profile.get_int(&fs_types, "blocksize", 4096);
        if use_bsize == -1 {
            use_bsize = i64::from(env.page_size);
        }
        if lsector != 0 && use_bsize < i64::from(lsector) {
            use_bsize = i64::from(lsector);
        }
        if blocksize < 0 && use_bsize < -blocksize {
            use_bsize = -blocksize;
        }
        if !(1024..=65536).contains(&use_bsize) {
            return err(if lsector != 0 && use_bsize == i64::from(lsector) {
                format!("invalid block size {use_bsize} (the device's sector size)")
            } else {
                format!("invalid block size {use_bsize} from mke2fs.conf")
            });
        }
        blocksize = use_bsize;
        fs_blocks_count /= blocksize as u64 / 1024;
    } else if (blocksize as u32) < lsector {
        return err(format!(
            "Invalid argument while setting blocksize; too small for device (logical sector size {lsector})"
        ));
    } else if (blocksize as u32) < psector && psector <= env.page_size {
        warnings.push(format!(
            "Warning: specified blocksize {blocksize} is less than device physical sectorsize {psector}"
        ));
    }
    // mke2fs's `blocksize` keeps the number as given (3000 with `-b 3000`)
    // until it is set to EXT2_BLOCK_SIZE after the device geometry: the
    // sector size checks above, the default inode ratio's floor and the
    // stride from the device's I/O hints below use it; everything else
    // uses the block size, the power of two at or below it.
    let raw_bs = blocksize as u32;
    let bs = 1024u32 << (raw_bs / 1024).ilog2();
    if bs > env.page_size {
        warnings.push(format!(
            "{bs}-byte blocks too big for system (max {})",
            env.page_size
        ));
    }
    const MAX_32: u64 = (1 << 32) - 1;
    if fs_blocks_count > MAX_32 && f.incompat.contains(Incompat::BIT64) {
        f.compat.remove(Compat::RESIZE_INODE);
    }
    // mke2fs.conf's auto_64-bit_support: a filesystem too big for 32-bit
    // block numbers gets 64bit (and so no resize inode) instead of an
    // error.
    if fs_blocks_count > MAX_32
        && !f.incompat.contains(Incompat::BIT64)
        && profile.get_bool(&fs_types, "auto_64-bit_support", false)
    {
        f.incompat.insert(Incompat::BIT64);
        f.compat.remove(Compat::RESIZE_INODE);
    }
    if fs_blocks_count > MAX_32 && !f.incompat.contains(Incompat::BIT64) {
        return err(format!(
            // mke2fs's words, less the device name it puts after the count.
            "Size of device ({fs_blocks_count:#x} blocks) too big to be expressed in 32 bits using a blocksize of {bs}."
        ));
    }
    let log_bs = (bs / 1024).trailing_zeros();
    if fs_blocks_count > (1u64 << (log_bs + 10 + 3 + 32)) - 1 {
        return err(format!(
            "size of device ({fs_blocks_count} blocks) too big to create a filesystem"
        ));
    }
    // -O journal_dev: the "journal" type for every later mke2fs.conf
    // lookup, no reserved blocks, and only journal_dev (and metadata_csum)
    // of the features so far.
    let journal_dev = f.incompat.contains(Incompat::JOURNAL_DEV);
    if journal_dev {
        fs_types = vec!["journal".to_string()];
        f.compat = Compat::empty();
        f.incompat = Incompat::JOURNAL_DEV;
        f.ro_compat = RoCompat(f.ro_compat.bits() & RoCompat::METADATA_CSUM.bits());
    }
    let mut reserved_ratio = match opts.reserved_ratio {
        Some(r) => r,
        None => profile.get_double(&fs_types, "reserved_ratio", 5.0),
    };
    // mke2fs's check, printed with "%lf"; a NaN is refused too (see
    // getopt_check).
    if !(0.0..=50.0).contains(&reserved_ratio) {
        // (C's "%lf" of a NaN is "nan", Rust's "NaN".)
        let shown = if reserved_ratio.is_nan() {
            "nan".to_string()
        } else {
            format!("{reserved_ratio:.6}")
        };
        return err(format!("invalid reserved blocks percent - {shown}"));
    }
    if journal_dev {
        reserved_ratio = 0.0;
    }
    if f.incompat.contains(Incompat::BIT64) && !f.incompat.contains(Incompat::EXTENTS) {
        return err(
            "Extents MUST be enabled for a 64-bit filesystem.  Pass -O extents to rectify.",
        );
    }
    // -C / cluster_size: s_log_cluster_size as int_log2 of the KiB (0
    // leaves libext2fs's default of 16 blocks).
    // mke2fs raises the default inode ratio to EXT2_CLUSTER_SIZE of its
    // parameters, where a log of 0 still means 1 KiB.
    let (cluster_bits, ratio_cluster) = if f.ro_compat.contains(RoCompat::BIGALLOC) {
        let cs = match opts.cluster_size {
            Some(c) => i64::from(c),
            None => profile.get_int(&fs_types, "cluster_size", i64::from(bs) * 16),
        };
        let kib = (cs.max(0) as u64) >> 10;
        let log_cluster = if kib == 0 { 0 } else { kib.ilog2() };
        if log_cluster != 0 && log_cluster < log_bs {
            return err("The cluster size may not be smaller than the block size.");
        }
        if log_cluster > 19 {
            return err(format!("invalid cluster size - {cs}"));
        }
        let bits = if log_cluster == 0 {
            4
        } else {
            log_cluster - log_bs
        };
        (bits, 1024u64 << log_cluster)
    } else if opts.cluster_size.is_some() {
        return err("specifying a cluster size requires the bigalloc feature");
    } else {
        (0, u64::from(bs))
    };
    let mut inode_ratio = match opts.inode_ratio {
        Some(r) => {
            if !(1024..=(65536 * 1024)).contains(&r) {
                return err(format!(
                    "invalid inode ratio {r} (min 1024/max {})",
                    65536 * 1024
                ));
            }
            r
        }
        None => {
            let r = profile.get_int(&fs_types, "inode_ratio", 8192).max(0) as u64;
            r.max(u64::from(raw_bs)).max(ratio_cluster)
        }
    };
    if inode_ratio == 0 {
        inode_ratio = u64::from(bs);
    }
    // Defaults that the profile may change.
    let mut lazy_itable_init = env.kernel_lazy_itable_init;
    lazy_itable_init = profile.get_bool(&fs_types, "lazy_itable_init", lazy_itable_init);
    let mut discard = profile.get_bool(&fs_types, "discard", true);
    // `-E discard` given on the command line (not only the default).
    let mut discard_asked = false;
    let mut lazy_journal_init = profile.get_bool(&fs_types, "lazy_journal_init", false);
    let mut packed_meta_blocks = profile.get_bool(&fs_types, "packed_meta_blocks", false);
    let mut assume_prezeroed = false;
    // mke2fs's get_device_geometry (block devices only): the topology's
    // minimum and optimal I/O sizes, falling back on the physical sector
    // size, become stride and stripe width when larger than a block.
    let (mut stride, mut stripe_width) = (0u32, 0u32);
    if let Some(h) = env.io_hints {
        let mut min_io = h.min_io;
        let mut opt_io = h.opt_io;
        if min_io == 0 && psector > raw_bs {
            min_io = psector;
        }
        if opt_io == 0 && min_io > 0 {
            opt_io = min_io;
        }
        if opt_io == 0 && psector > raw_bs {
            opt_io = psector;
        }
        if min_io > raw_bs {
            stride = min_io / raw_bs;
        }
        if opt_io > raw_bs {
            stripe_width = opt_io / raw_bs;
        }
        if h.alignment_offset != 0 {
            warnings.push(format!(
                "the device's alignment is offset by {} bytes; this may result in very poor performance, (re)-partitioning suggested",
                h.alignment_offset as u64
            ));
        }
    }
    let mut hash_seed: Option<[u8; 16]> = None;
    let mut root_uid = 0u32;
    let mut root_gid = 0u32;
    // -E resize=: s_reserved_gdt_blocks as parse_extended_opts computes it.
    let mut reserved_gdt: Option<u32> = None;
    let mut orphan_file_blocks: Option<u32> = None;
    // The first meta block group, from the environment, only when meta_bg
    // was asked for (not when libext2fs turns it on by itself).
    let first_meta_bg = match &opts.first_meta_bg_env {
        Some(v) if f.incompat.contains(Incompat::META_BG) => atoi(v) as u32,
        _ => 0,
    };
    let mut desc_size = 0u32;
    let mut offset = 0u64;
    let mut test_fs = false;
    // sparse_super2's backups (mke2fs.conf `num_backup_sb`, then -E).
    let mut num_backups = profile.get_int(&fs_types, "num_backup_sb", 2) as i32;
    let mut mmp_update_interval: u16 = 0;
    // casefold from the features: the encoding and its flags from
    // mke2fs.conf (before the extended options, as mke2fs).
    let (mut encoding, mut encoding_flags) = (0u16, 0u16);
    if f.incompat.contains(Incompat::CASEFOLD) {
        let en = profile
            .get_string(&fs_types, "encoding")
            .unwrap_or_else(|| "utf8".into());
        encoding = super::encoding::str2encoding(&en)
            .ok_or_else(|| OptionError(format!("Unknown filename encoding from profile: {en}")))?;
        encoding_flags = match profile.get_string(&fs_types, "encoding_flags") {
            Some(ef) => super::encoding::str2encoding_flags(encoding, &ef, 0)
                .ok_or_else(|| OptionError(format!("Unknown encoding flags from profile: {ef}")))?,
            None => super::encoding::default_flags(encoding),
        };
    }
    let mut quota_types = super::quota::USR | super::quota::GRP;
    let mut ext_list: Vec<String> = profile.options_list(&fs_types);
    // mke2fs keeps only the last -E.
    ext_list.extend(opts.extended.last().cloned());
    for ext in &ext_list {
        // `encoding_flags=` of this option string (parse_extended_opts
        // applies it at the end of each call).
        let mut ext_encoding_flags: Option<String> = None;
        for tok in ext.split(',').filter(|t| !t.is_empty()) {
            let (k, v) = match tok.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (tok, None),
            };
            let need = |v: Option<&str>| -> Result<String, OptionError> {
                v.map(str::to_string).ok_or_else(|| {
                    OptionError(format!("Bad option(s) specified: {k} (it needs a value)"))
                })
            };
            // strtoul(arg, &p, 0) with `*p` checked: hex and octal too,
            // an empty value is 0.
            let num = |v: Option<&str>, what: &str| -> Result<u64, OptionError> {
                let s = need(v)?;
                c_strtoul_whole(&s)
                    .ok_or_else(|| OptionError(format!("Invalid {what} parameter: {s}")))
            };
            // strtoul with nothing checked (`lazy_itable_init=yes` is 0).
            let flag = |v: Option<&str>| v.is_none_or(|s| c_strtoul_prefix(s).0 != 0);
            match k {
                // s_raid_stride is 16 bits, s_raid_stripe_width 32.
                "stride" => stride = u32::from(num(v, "stride")? as u16),
                "stripe-width" | "stripe_width" => stripe_width = num(v, "stripe-width")? as u32,
                "resize" => {
                    let s = need(v)?;
                    let rsv = resize_reserved_gdt(
                        &s,
                        log_bs,
                        fs_blocks_count,
                        opts.blocks_per_group.unwrap_or(0),
                        if f.incompat.contains(Incompat::BIT64) {
                            if desc_size == 0 { 64 } else { desc_size }
                        } else {
                            32
                        },
                    )?;
                    if rsv > 0 {
                        if rev0 {
                            return err(
                                "On-line resizing not supported with revision 0 filesystems",
                            );
                        }
                        f.compat.insert(Compat::RESIZE_INODE);
                        reserved_gdt = Some(rsv);
                    }
                }
                "packed_meta_blocks" => packed_meta_blocks = flag(v),
                "lazy_itable_init" => lazy_itable_init = flag(v),
                // mke2fs only ever sets the lazy flag here.
                "lazy_journal_init" => lazy_journal_init |= flag(v),
                "assume_storage_prezeroed" => assume_prezeroed = flag(v),
                "discard" => {
                    discard = true;
                    discard_asked = true;
                }
                "nodiscard" => {
                    discard = false;
                    discard_asked = false;
                }
                "hash_seed" => {
                    let s = need(v)?;
                    hash_seed = Some(
                        parse_uuid(&s)
                            .ok_or_else(|| OptionError(format!("Invalid hash seed: {s}")))?,
                    );
                }
                "root_owner" => match v {
                    None => {
                        root_uid = env.uid;
                        root_gid = env.gid;
                    }
                    Some(s) => {
                        // strtoul(arg, &p, 0) up to the ':', then to the
                        // end (uid_t and gid_t are 32 bits).
                        let (u, rest) = c_strtoul_prefix(s);
                        let parsed =
                            rest.strip_prefix(':')
                                .and_then(|g| match c_strtoul_prefix(g) {
                                    (g, "") => Some(g),
                                    _ => None,
                                });
                        let Some(g) = parsed else {
                            return err(format!("Invalid root_owner: '{s}'"));
                        };
                        root_uid = u as u32;
                        root_gid = g as u32;
                    }
                },
                "num_backup_sb" => {
                    // strtoul into an int: "-1" is -1, which passes the
                    // "> 2" check and means no backup.
                    let s = need(v)?;
                    let n = parse_c_ulong(&s).map(|n| n as i32);
                    match n {
                        Ok(n) if n <= 2 => num_backups = n,
                        _ => return err(format!("Invalid # of backup superblocks: {s}")),
                    }
                    // Without sparse_super2 mke2fs ignores it silently.
                }
                "mmp_update_interval" => {
                    // strtoul into the 16-bit superblock field.
                    let s = need(v)?;
                    mmp_update_interval = parse_c_ulong(&s)
                        .map_err(|_| OptionError(format!("Invalid mmp_update_interval: {s}")))?
                        as u16;
                }
                "encoding" => {
                    let s = need(v)?;
                    encoding = super::encoding::str2encoding(&s)
                        .ok_or_else(|| OptionError(format!("Invalid encoding: {s}")))?;
                    f.incompat.insert(Incompat::CASEFOLD);
                }
                "encoding_flags" => ext_encoding_flags = Some(need(v)?),
                "orphan_file_size" => {
                    let s = need(v)?;
                    let n = parse_num_blocks(&s, log_bs)
                        .ok_or_else(|| OptionError(format!("Invalid size of orphan file {s}")))?;
                    orphan_file_blocks = Some(n as u32);
                }
                "desc_size" | "desc-size" => {
                    if !f.incompat.contains(Incompat::BIT64) {
                        return err(format!("{k} requires '-O 64bit'"));
                    }
                    if let Some(r) = reserved_gdt {
                        return err(format!("'{k}' must be before 'resize={r}'"));
                    }
                    let s = need(v)?;
                    let d = match parse_c_ulong(&s) {
                        Ok(d) if d & d.wrapping_sub(1) == 0 => d,
                        _ => return err(format!("Invalid desc_size: '{s}'")),
                    };
                    // mke2fs takes any power of two, but only 64..1024
                    // make a filesystem (others fail or make one e2fsck
                    // rejects).
                    if d != 0 && !(64..=1024).contains(&d) {
                        return err(format!(
                            "Invalid desc_size: '{s}' (64 to 1024, a power of two)"
                        ));
                    }
                    desc_size = d as u32;
                }
                "offset" => {
                    let s = need(v)?;
                    offset = parse_c_ulong(&s)
                        .map_err(|_| OptionError(format!("Invalid offset: {s}")))?;
                }
                "test_fs" => test_fs = true,
                // Only matters with -d (not supported yet); accepted, as
                // mke2fs 1.47.0 does.
                "no_copy_xattrs" => {}
                "quotatype" => {
                    let s = need(v)?;
                    quota_types = super::quota::parse_quota_types(&s, 0).map_err(|tok| {
                        OptionError(format!(
                            "Failed to parse quota type at {tok} (Bad option(s) specified: quotatype)"
                        ))
                    })?;
                }
                "android_sparse" => {
                    return err(format!(
                        "extended option '{k}' is not supported by ext4kit yet"
                    ));
                }
                // mke2fs's words (without the usage text it adds).
                _ => return err(format!("Bad option(s) specified: {k}")),
            }
        }
        // The end of parse_extended_opts: with casefold the flags start
        // again from the encoding's defaults (even those mke2fs.conf set).
        if f.incompat.contains(Incompat::CASEFOLD) {
            encoding_flags = super::encoding::default_flags(encoding);
            if let Some(ef) = &ext_encoding_flags {
                encoding_flags = super::encoding::str2encoding_flags(encoding, ef, encoding_flags)
                    .ok_or_else(|| OptionError(format!("error: Invalid encoding flag: {ef}")))?;
            }
        } else if ext_encoding_flags.is_some() {
            return err(
                "error: An encoding must be explicitly specified when passing encoding-flags",
            );
        }
    }
    // -E offset= without a size: the filesystem takes the rest of the
    // target (mke2fs subtracts the offset's whole blocks, and warns).
    if offset > 0 {
        if explicit.is_none() {
            let skip = offset / u64::from(bs);
            if skip >= fs_blocks_count {
                return err(format!(
                    "offset {offset} is past the end of the device ({} bytes)",
                    fs_blocks_count * u64::from(bs)
                ));
            }
            fs_blocks_count -= skip;
            warnings.push(format!(
                "\nWarning: offset specified without an explicit file system size.\nCreating a file system with {fs_blocks_count} blocks but this might\nnot be what you want.\n"
            ));
        }
        if let Some(sz) = env.device_size
            && !env.is_regular_file
            && offset.saturating_add(fs_blocks_count.saturating_mul(u64::from(bs))) > sz
        {
            return err(format!(
                "filesystem at offset {offset} larger than the device ({} + {offset} > {sz} bytes)",
                fs_blocks_count.saturating_mul(u64::from(bs))
            ));
        }
    }
    // mke2fs.conf's huge files (mk_hugefiles.c).
    let hugefiles = if profile.get_bool(&fs_types, "make_hugefiles", false) {
        let log = (bs / 1024).trailing_zeros();
        let blocks_of = |key: &str, dflt: &str| {
            let v = profile
                .get_string(&fs_types, key)
                .unwrap_or_else(|| dflt.to_owned());
            parse_num_blocks(&v, log).unwrap_or(0)
        };
        let num_files = profile.get_int(&fs_types, "num_hugefiles", 0);
        let digits = profile.get_int(&fs_types, "hugefiles_digits", 5);
        if num_files < 0 {
            return err(format!(
                "mke2fs.conf: num_hugefiles = {num_files} is not supported by ext4kit"
            ));
        }
        if digits < 0 {
            return err(format!(
                "mke2fs.conf: hugefiles_digits = {digits} is not supported by ext4kit"
            ));
        }
        if opts.super_only {
            // mke2fs 1.47.0 runs mk_hugefiles after -S too: a directory
            // and files allocated from the bitmaps -S rebuilt, i.e. over
            // the data blocks it is meant to recover.
            return err(
                "-S with make_hugefiles would write huge files over the data -S is meant to recover (as mke2fs 1.47.0 does); use a usage type (-T) without make_hugefiles",
            );
        }
        let align = blocks_of("hugefiles_align", "0");
        let part_offset = if profile.get_bool(&fs_types, "hugefiles_align_disk", false) {
            opts.partition_start_sectors / u64::from(bs / 512)
        } else {
            0
        };
        let num_blocks = blocks_of("hugefiles_size", "0");
        let num_blocks = if align != 0 && num_blocks % align != 0 {
            num_blocks + align - num_blocks % align
        } else {
            num_blocks
        };
        let uid = profile.get_int(&fs_types, "hugefiles_uid", 0) as i32 as u32;
        let gid = profile.get_int(&fs_types, "hugefiles_gid", 0) as i32 as u32;
        Some(super::hugefiles::HugeParams {
            dir: profile
                .get_string(&fs_types, "hugefiles_dir")
                .unwrap_or_else(|| "/".into()),
            name: profile
                .get_string(&fs_types, "hugefiles_name")
                .unwrap_or_else(|| "hugefile".into()),
            digits: digits as u32,
            num_files: num_files as u64,
            num_blocks,
            slack: blocks_of("hugefiles_slack", "1M"),
            align,
            part_offset,
            uid,
            gid,
            umask: profile.get_int(&fs_types, "hugefiles_umask", 0o77) as i32 as u32,
            // Set in mke2fs.conf when both defaults give the same answer.
            zero: Some(profile.get_bool(&fs_types, "zero_hugefiles", true))
                .filter(|&z| z == profile.get_bool(&fs_types, "zero_hugefiles", false)),
        })
    } else {
        None
    };
    if stride != 0 && !stripe_width.is_multiple_of(stride) {
        warnings.push(format!(
            "\nWarning: RAID stripe-width {stripe_width} not an even multiple of stride {stride}.\n"
        ));
    }
    // Project quota: the feature follows -E quotatype=prj and brings the
    // project quota file; it needs room for i_projid.
    if quota_types & super::quota::PRJ != 0 {
        f.ro_compat.insert(RoCompat::PROJECT);
    }
    let project = f.ro_compat.contains(RoCompat::PROJECT);
    if project {
        quota_types |= super::quota::PRJ;
        if opts.inode_size == Some(128) {
            return err("128 byte inodes are too small for project quota");
        }
    }
    if f.ro_compat.contains(RoCompat::METADATA_CSUM) && f.ro_compat.contains(RoCompat::GDT_CSUM) {
        f.ro_compat.remove(RoCompat::GDT_CSUM);
    }
    if f.ro_compat.contains(RoCompat::BIGALLOC) && !f.incompat.contains(Incompat::EXTENTS) {
        return err("Can't support bigalloc feature without extents feature");
    }
    if f.ro_compat.contains(RoCompat::BIGALLOC) && cluster_bits > 4 {
        // mke2fs prints it unless -q (the CLI drops it then).
        warnings.push(BIGALLOC_EXPERIMENTAL.into());
    }
    if f.incompat.contains(Incompat::META_BG) && f.compat.contains(Compat::RESIZE_INODE) {
        return err(
            "The resize_inode and meta_bg features are not compatible. They can not be both enabled simultaneously.",
        );
    }
    if f.compat.contains(Compat::RESIZE_INODE) && !f.ro_compat.contains(RoCompat::SPARSE_SUPER) {
        return err("reserved online resize blocks not supported on non-sparse filesystem");
    }
    if f.incompat.contains(Incompat::CSUM_SEED) && !f.ro_compat.contains(RoCompat::METADATA_CSUM) {
        return err("the metadata_csum_seed feature requires the metadata_csum feature");
    }
    if f.compat.contains(Compat::ORPHAN_FILE) && !f.compat.contains(Compat::HAS_JOURNAL) {
        return err("cannot set orphan_file feature without a journal");
    }
    if let Some(g) = opts.blocks_per_group {
        if g < 256 || g > 8 * bs {
            return err("blocks per group count out of range");
        }
        if g % 8 != 0 {
            return err("blocks per group must be multiple of 8");
        }
    }
    // -I 0 (or none) falls back to mke2fs.conf's inode_size, and 0 there
    // leaves libext2fs's default of 128.
    let inode_size = match opts.inode_size {
        Some(i) if i != 0 => i64::from(i),
        // mke2fs: project quota without -I takes mke2fs.conf's size, at
        // least 256.
        _ if project => profile.get_int(&fs_types, "inode_size", 0).max(256),
        _ => profile.get_int(&fs_types, "inode_size", 0),
    };
    if inode_size != 0
        && (!(128..=i64::from(bs)).contains(&inode_size) || (inode_size as u32).count_ones() != 1)
    {
        return err(format!(
            "invalid inode size {inode_size} (min 128/max {bs})"
        ));
    }
    // mke2fs warns only about an inode size of 128 that was asked for (by
    // -I or mke2fs.conf); with none at all, libext2fs silently uses 128.
    if inode_size == 128 && profile.get_bool(&fs_types, "warn_y2038_dates", true) {
        warnings.push("128-byte inodes cannot handle dates beyond 2038 and are deprecated".into());
    }
    // inline_data needs room in the inode: mke2fs refuses an inode size of
    // 128 that was asked for (-I or mke2fs.conf). With none at all it
    // takes libext2fs's 128 and stores lost+found's empty inline-data
    // attribute in a block of its own, which ext4kit does not reproduce.
    if f.incompat.contains(Incompat::INLINE_DATA) && !rev0 {
        if inode_size == 128 {
            return err("128 byte inodes are too small for inline data; specify larger size");
        }
        if inode_size == 0 {
            return err(
                "inline_data with the default 128-byte inodes (no inode_size in mke2fs.conf) is not supported by ext4kit; give -I 256",
            );
        }
    }
    // Revision 0 has 128-byte inodes whatever -I or the profile say (only
    // the checks above see those).
    let inode_size: u32 = if inode_size == 0 || rev0 {
        128
    } else {
        inode_size as u32
    };
    let mut log_flex = 0u8;
    if let Some(g) = opts.flex_bg_size {
        if !f.incompat.contains(Incompat::FLEX_BG) {
            return err("Flex_bg feature not enabled, so flex_bg size may not be specified");
        }
        if g == 0 || !g.is_power_of_two() {
            return err(format!("flex_bg size must be a power of 2: {g}"));
        }
        if g > (1 << 31) {
            return err(format!(
                "flex_bg size ({g}) must be less than or equal to 2^31"
            ));
        }
        log_flex = g.trailing_zeros() as u8;
    } else if f.incompat.contains(Incompat::FLEX_BG) {
        // mke2fs does not check mke2fs.conf's value: its int_log2 rounds
        // down (3 gives groups of 2), and 0 means no flex groups.
        let g = profile.get_uint(&fs_types, "flex_bg_size", 16) as u32;
        if g > 0 {
            log_flex = g.ilog2() as u8;
        }
    }
    // Inode count.
    let inodes = match opts.num_inodes.filter(|&n| n != 0) {
        Some(n) => {
            if n > MAX_32 {
                return err(format!("too many inodes ({n}), specify < 2^32 inodes"));
            }
            n
        }
        None => {
            let n = fs_blocks_count.saturating_mul(u64::from(bs)) / inode_ratio;
            if n > MAX_32 {
                if f.incompat.contains(Incompat::BIT64) {
                    MAX_32
                } else {
                    return err(format!("too many inodes ({n}), raise inode ratio?"));
                }
            } else {
                n
            }
        }
    };
    if inodes.saturating_mul(u64::from(inode_size)) >= fs_blocks_count.saturating_mul(u64::from(bs))
    {
        return err(format!(
            "inode_size ({inode_size}) * inodes_count ({inodes}) too big for a filesystem with {fs_blocks_count} blocks, specify higher inode_ratio (-i) or lower inode count (-N)"
        ));
    }
    reserved_ratio = reserved_ratio.clamp(0.0, 50.0);
    let r_blocks = (reserved_ratio * fs_blocks_count as f64 / 100.0) as u64;
    // Journal size.
    let mut journal_blocks = None;
    // -J fast_commit_size= (KiB), used only with the fast_commit feature.
    let mut fc_blocks = None;
    // -J location= (else mke2fs.conf's journal_location).
    let mut location: Option<String> = None;
    let external = opts.external_journal.is_some();
    for j in &opts.journal {
        for tok in j.split(',').filter(|t| !t.is_empty()) {
            let (k, v) = tok.split_once('=').unwrap_or((tok, ""));
            match k {
                // mke2fs does not look at the size with an external
                // journal.
                // The size is the last one (see journal_size, below).
                "size" if !tok.contains('=') => {
                    return err("journal option 'size' needs a value");
                }
                "size" => {
                    c_strtoul_whole(v)
                        .ok_or_else(|| OptionError(format!("invalid journal size: '{v}'")))?;
                }
                "v1_superblock" => {}
                "fast_commit_size" => {
                    let n = c_strtoul_whole(v)
                        .ok_or_else(|| OptionError(format!("invalid fast commit size: '{v}'")))?;
                    // fcsize_to_blks: KiB to blocks, in a C int; 0 and
                    // negative numbers mean the default.
                    let kib = n as i32;
                    if kib > 0 {
                        fc_blocks = Some((i64::from(kib) * 1024 / i64::from(bs)) as u32);
                    }
                }
                // Read by the caller (opts.external_journal).
                "device" => {}
                "location" if tok.contains('=') => location = Some(v.to_string()),
                "location" => return err("journal option 'location' needs a value"),
                _ => return err(format!("bad journal option: '{k}'")),
            }
        }
    }
    // jsize_to_blks: MiB to blocks in C int arithmetic (a huge size
    // wraps, and figure_journal_size then reports the wrapped total). Not
    // looked at with an external journal.
    let jsize = journal_size(opts.add_journal, &opts.journal);
    if jsize > 0 && !external {
        journal_blocks = Some((jsize.wrapping_mul(1024) / (bs / 1024) as i32) as u32);
    }
    // mke2fs 1.47.0 takes -J v1_superblock and writes a version 1 jbd2
    // superblock that keeps version 2 fields (UUID, one user), which
    // e2fsck then clears ("Found invalid V2 journal superblock fields").
    if !external
        && opts
            .journal
            .iter()
            .flat_map(|j| j.split(','))
            .any(|t| t.split('=').next() == Some("v1_superblock"))
    {
        return err(
            "-J v1_superblock is not supported: mke2fs 1.47.0 writes a version 1 journal superblock with version 2 fields, which e2fsck clears",
        );
    }
    let location = location.or_else(|| profile.get_string(&fs_types, "journal_location"));
    // parse_num_blocks2: garbage is block 0.
    let journal_location = location
        .filter(|l| !l.is_empty())
        .map(|l| parse_num_blocks(&l, log_bs).unwrap_or(0));
    if let Some(ej) = &opts.external_journal
        && ej.block_size != bs
        && !journal_dev
    {
        return err(format!(
            "Filesystem has unexpected block size while trying to open journal device {} (its blocks are {} bytes, the filesystem's {bs})",
            ej.path, ej.block_size
        ));
    }
    // UUIDs.
    let uuid = match opts.uuid.as_deref() {
        None => *uuid::Uuid::new_v4().as_bytes(),
        Some(s) if s.eq_ignore_ascii_case("null") || s.eq_ignore_ascii_case("clear") => [0; 16],
        Some(s) if s.eq_ignore_ascii_case("random") => *uuid::Uuid::new_v4().as_bytes(),
        Some(s) if s.eq_ignore_ascii_case("time") => time_uuid(),
        Some(s) => {
            parse_uuid(s).ok_or_else(|| OptionError(format!("could not parse UUID: {s}")))?
        }
    };
    let hash_seed = hash_seed.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let hash_alg = profile
        .get_string(&fs_types, "hash_alg")
        .unwrap_or_else(|| "half_md4".into());
    let def_hash_version = match hash_alg.to_ascii_lowercase().as_str() {
        "legacy" => 0,
        "half_md4" => 1,
        "tea" => 2,
        _ => 1,
    };
    let mut default_mount_opts = 0u32;
    if !rev0 {
        let mntopts = profile.default_mntopts(&mntopt_types);
        edit_mntopts(&mut default_mount_opts, &mntopts)
            .map_err(|_| OptionError(format!("Invalid mount option set: {mntopts}")))?;
    }
    let mut label = [0u8; 16];
    if let Some(l) = &opts.label {
        warnings.extend(label_warning(Some(l)));
        let n = l.len().min(16);
        label[..n].copy_from_slice(&l.as_bytes()[..n]);
    }
    let mut last_mounted = [0u8; 64];
    if let Some(m) = &opts.mount_dir {
        let n = m.len().min(64);
        last_mounted[..n].copy_from_slice(&m.as_bytes()[..n]);
    }
    // mke2fs's set_os(): -o, else [defaults] creator_os; a number is taken
    // as it is (atoi), names case-insensitively.
    let creator_os = match creator_os_name.as_deref() {
        None => 0,
        Some(s) if s.as_bytes().first().is_some_and(u8::is_ascii_digit) => {
            atoi(s).clamp(0, i64::from(i32::MAX)) as u32
        }
        Some(s) => match s.to_ascii_lowercase().as_str() {
            "linux" => 0,
            "hurd" | "gnu" => 1,
            "freebsd" => 3,
            "lites" => 4,
            _ => return err(format!("unknown os - {s}")),
        },
    };
    // set_error_behavior(): the profile's value is checked even when -e
    // overrides it.
    let profile_errors = match profile.get_string(&fs_types, "errors").as_deref() {
        None => 1,
        Some("continue") => 1,
        Some("remount-ro") => 2,
        Some("panic") => 3,
        Some(o) => return err(format!("bad error behavior in profile - {o}")),
    };
    let errors = match opts.errors.as_deref() {
        None => profile_errors,
        Some("continue") => 1,
        Some("remount-ro") => 2,
        Some("panic") => 3,
        Some(o) => return err(format!("bad error behavior - {o}")),
    };
    let enable_periodic = profile.get_bool(&fs_types, "enable_periodic_fsck", false);
    let (max_mnt_count, checkinterval) = if enable_periodic {
        let val: u32 = uuid.iter().map(|&b| u32::from(b)).sum();
        ((20 + (val % 20)) as u16, 86400 * 180)
    } else {
        (0xFFFF, 0)
    };
    let lazy_itable_init_asked = lazy_itable_init;
    if assume_prezeroed {
        lazy_itable_init = true;
        lazy_journal_init = true;
    }
    // sparse_super2: backups in group 1 and in the last group.
    let mut backup_bgs = [0u32; 2];
    if f.compat.contains(Compat::SPARSE_SUPER2) {
        if num_backups >= 1 {
            backup_bgs[0] = 1;
        }
        if num_backups >= 2 {
            backup_bgs[1] = !0;
        }
    }
    if opts.super_only && !discard_asked {
        // mke2fs 1.47.0 discards the device before -S rewrites the
        // superblock, destroying the data -S is there to recover; ext4kit
        // discards only when `-E discard` asks for it.
        discard = false;
    }
    if f.ro_compat.contains(RoCompat::BIGALLOC) && opts.bad_blocks.is_some() {
        return err("a bad blocks list (-l, -c) with bigalloc is not supported by ext4kit yet");
    }
    if opts.super_only && opts.bad_blocks.is_some() {
        return err("-S with a bad blocks list (-l, -c) is not supported by ext4kit yet");
    }
    if opts.super_only && f.compat.contains(Compat::ORPHAN_FILE) {
        // mke2fs 1.47.0 -S goes on to create the orphan file: in the
        // inode bitmap -S leaves empty that is inode 11 (lost+found),
        // and its blocks come from data blocks; or, with another UUID,
        // it fails after zeroing the primary superblock.
        return err(
            "-S with orphan_file would overwrite lost+found and data blocks (as mke2fs 1.47.0 does); add -O ^orphan_file",
        );
    }
    if f.incompat.contains(Incompat::MMP)
        && !opts.super_only
        && super::mmp::effective_interval(mmp_update_interval).is_none()
    {
        // ext2fs_mmp_init's EINVAL, which mke2fs reports after writing.
        return err(format!(
            "Error while enabling multiple mount protection feature: mmp_update_interval {mmp_update_interval} is more than {}",
            super::mmp::MMP_MAX_UPDATE_INTERVAL
        ));
    }
    let params = FsParams {
        blocks_count: fs_blocks_count,
        block_size: bs,
        inode_size: inode_size as u16,
        inodes_count: inodes,
        features: f,
        log_groups_per_flex: log_flex,
        blocks_per_group: opts.blocks_per_group.unwrap_or(0),
        r_blocks_count: r_blocks,
        reserved_gdt_blocks: reserved_gdt,
        desc_size,
        first_meta_bg,
        journal_blocks,
        orphan_file_blocks,
        stride,
        packed_meta_blocks,
        root_uid,
        root_gid,
        itable_zeroed: assume_prezeroed,
        lazy_itable_init,
        backup_bgs,
        journal_fc_blocks: fc_blocks,
        super_only: opts.super_only,
        cluster_bits,
        quota_types,
        external_journal: external && !journal_dev,
        journal_location,
        hugefiles,
        bad_blocks: opts.bad_blocks.clone(),
    };
    let settings = SuperSettings {
        uuid,
        hash_seed,
        now: env.now,
        label,
        last_mounted,
        def_hash_version,
        default_mount_opts,
        errors,
        creator_os,
        max_mnt_count,
        checkinterval,
        raid_stride: stride as u16,
        raid_stripe_width: stripe_width,
        root_uid,
        root_gid,
        lazy_itable_init,
        lazy_journal_init,
        itable_zeroed: assume_prezeroed,
        kbytes_written: 0,
        rev_level: u32::from(!rev0),
        test_fs,
        encoding,
        encoding_flags,
        mmp_update_interval,
        mmp_host: super::mmp::MmpHost::default(),
        external_journal: opts.external_journal.clone().filter(|_| !journal_dev),
    };
    Ok(Resolved {
        params,
        settings,
        fs_types,
        discard,
        assume_prezeroed,
        lazy_itable_init_asked,
        offset,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_number_parsing_like_mke2fs() {
        assert_eq!(parse_num_blocks("0100", 0), Some(64), "octal, as strtoull");
        assert_eq!(parse_num_blocks("0x10", 0), Some(16));
        assert_eq!(parse_num_blocks(" 100", 0), Some(100));
        assert_eq!(parse_num_blocks("100 ", 0), None);
        assert_eq!(parse_num_blocks("1Kb", 0), None);
        assert_eq!(parse_num_blocks("4k", 2), Some(1));
        assert_eq!(parse_num_blocks("99999999999T", 0), None, "overflow");
        assert_eq!(parse_block_size_arg("4k"), Ok(4096));
        assert_eq!(parse_block_size_arg("-2048"), Ok(-2048));
        assert_eq!(parse_block_size_arg("-1k"), Ok(-1024));
        assert_eq!(parse_block_size_arg("64K"), Ok(65536));
        assert_eq!(parse_block_size_arg("512"), Ok(512), "range: resolve");
        assert!(parse_block_size_arg("4kk").is_err());
        assert!(parse_block_size_arg("x").is_err());
        assert_eq!(parse_inode_ratio_arg("64k"), Ok(65536));
        assert_eq!(parse_c_ulong("0x100"), Ok(256));
        assert_eq!(parse_c_ulong("010"), Ok(8));
        assert_eq!(parse_c_ulong("-1"), Ok(u64::MAX));
        assert_eq!(parse_c_ulong("99999999999999999999999"), Ok(u64::MAX));
        assert!(parse_c_ulong("10k").is_err());
        assert!(parse_c_ulong("").is_err());
        assert!(parse_c_ulong("08").is_err());
        assert_eq!(parse_c_uint("0x100000010"), Ok(16));
        assert!(parse_flex_bg_size_arg("0x100000000").is_err());
    }

    #[test]
    fn num_blocks_suffixes() {
        assert_eq!(parse_num_blocks("1G", 0), Some(1 << 20));
        assert_eq!(parse_num_blocks("1G", 2), Some(1 << 18));
        assert_eq!(parse_num_blocks("100", 0), Some(100));
        assert_eq!(parse_num_blocks("2048s", 0), Some(1024));
        assert_eq!(parse_num_blocks("1x", 0), None);
        assert_eq!(parse_num_blocks("", 0), None);
    }

    #[test]
    fn uuid_parsing() {
        assert!(parse_uuid("0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09").is_some());
        assert!(parse_uuid("not-a-uuid").is_none());
    }

    fn env(size: u64) -> Env {
        Env {
            device_size: Some(size),
            is_regular_file: true,
            logical_sector_size: 0,
            physical_sector_size: 0,
            io_hints: None,
            now: 1_700_000_000,
            page_size: 4096,
            uid: 0,
            gid: 0,
            kernel_lazy_itable_init: true,
        }
    }

    fn opts(fs_type: &str) -> MkfsOptions {
        MkfsOptions {
            fs_type: Some(fs_type.into()),
            ..MkfsOptions::default()
        }
    }

    #[test]
    fn mntopts_edit_like_e2p() {
        let edit = |start: u32, s: &str| {
            let mut v = start;
            edit_mntopts(&mut v, s).map(|()| v)
        };
        assert_eq!(edit(0, "acl,user_xattr"), Ok(0xc));
        assert_eq!(edit(0xc, "^acl"), Ok(0x4));
        assert_eq!(edit(0xc, "-acl +debug"), Ok(0x5));
        assert_eq!(edit(0, "ACL,Discard"), Ok(0x408));
        assert_eq!(edit(0, "acl,"), Ok(0x8));
        // A journalling mode replaces the previous one.
        assert_eq!(edit(0, "journal_data,journal_data_ordered"), Ok(0x40));
        assert_eq!(edit(0x20, "^journal_data_ordered"), Ok(0));
        // MNTOPT_<n>, with e2p's off-by-one: the number starts at byte 9.
        assert_eq!(edit(0, "MNTOPT_12"), Ok(1 << 2));
        assert_eq!(edit(0, "MNTOPT_x31"), Ok(1 << 31));
        assert_eq!(edit(0, "MNTOPT_x-0"), Ok(1));
        assert_eq!(edit(0, "MNTOPT_5"), Err("MNTOPT_5".into()));
        assert_eq!(edit(0, "MNTOPT_x32"), Err("MNTOPT_x32".into()));
        // Empty words are errors, as in e2p.
        assert_eq!(edit(0, "acl,,user_xattr"), Err("".into()));
        assert_eq!(edit(0, ",acl"), Err("".into()));
        assert_eq!(edit(0, "acl , user_xattr"), Err("".into()));
        assert_eq!(edit(0, "acl, user_xattr"), Ok(0xc));
        assert_eq!(edit(0, "acl, x"), Err("x".into()));
        assert_eq!(edit(0, "bogus"), Err("bogus".into()));
    }

    #[test]
    fn default_mntopts_clear() {
        let conf = "[defaults]\n\tdefault_mntopts = ^acl\n[fs_types]\n\text4 = {\n\t\tfeatures = has_journal\n\t}\n";
        let p = Profile::parse(conf).unwrap();
        let r = resolve(&opts("ext4"), &p, &env(1 << 30)).unwrap();
        assert_eq!(r.settings.default_mount_opts, 0);
        let conf = conf.replace("^acl", "acl,^acl,user_xattr");
        let p = Profile::parse(&conf).unwrap();
        let r = resolve(&opts("ext4"), &p, &env(1 << 30)).unwrap();
        assert_eq!(r.settings.default_mount_opts, 0x4);
        let conf = conf.replace("acl,^acl,user_xattr", "acl,,user_xattr");
        let p = Profile::parse(&conf).unwrap();
        let e = resolve(&opts("ext4"), &p, &env(1 << 30)).unwrap_err();
        assert_eq!(e.0, "Invalid mount option set: acl,,user_xattr");
    }

    #[test]
    fn undefined_type_is_a_warning_with_force() {
        let p = Profile::parse("[defaults]\n\terrors = panic\n").unwrap();
        let e = resolve(&opts("ext4"), &p, &env(1 << 20)).unwrap_err();
        assert!(
            e.0.contains("does not define the ext4 filesystem type"),
            "{e}"
        );
        assert!(!e.0.contains('\n'), "one line: {e}");
        let forced = MkfsOptions {
            force: true,
            ..opts("ext4")
        };
        let r = resolve(&forced, &p, &env(1 << 20)).unwrap();
        assert!(
            r.warnings[0].starts_with("Your mke2fs.conf file does not define the ext4"),
            "{:?}",
            r.warnings
        );
        assert_eq!(r.settings.errors, 3);
        // ext2 never needs a definition.
        assert!(resolve(&opts("ext2"), &p, &env(1 << 20)).is_ok());
    }

    #[test]
    fn no_inode_size_means_128_without_warning() {
        let p = Profile::parse("[defaults]\n\tblocksize = 4096\n").unwrap();
        let r = resolve(&opts("ext2"), &p, &env(1 << 30)).unwrap();
        assert_eq!(r.params.inode_size, 128);
        assert!(
            r.warnings.iter().all(|w| !w.contains("128-byte")),
            "{:?}",
            r.warnings
        );
        // -I 0 is "not given"; an explicit 128 warns.
        let o = MkfsOptions {
            inode_size: Some(0),
            ..opts("ext2")
        };
        assert_eq!(
            resolve(&o, &p, &env(1 << 30)).unwrap().params.inode_size,
            128
        );
        let o = MkfsOptions {
            inode_size: Some(128),
            ..opts("ext2")
        };
        let r = resolve(&o, &p, &env(1 << 30)).unwrap();
        assert!(
            r.warnings.iter().any(|w| w.contains("128-byte")),
            "{:?}",
            r.warnings
        );
        // The builtin configuration still gives 256.
        let r = resolve(&opts("ext4"), &Profile::builtin(), &env(1 << 30)).unwrap();
        assert_eq!(r.params.inode_size, 256);
    }

    #[test]
    fn last_extended_option_wins_and_n0_is_default() {
        let p = Profile::builtin();
        let o = MkfsOptions {
            extended: vec!["nodiscard".into(), "lazy_itable_init=1".into()],
            ..opts("ext4")
        };
        let r = resolve(&o, &p, &env(1 << 30)).unwrap();
        assert!(r.discard, "the first -E is dropped");
        let dflt = resolve(&opts("ext4"), &p, &env(1 << 30)).unwrap();
        let o = MkfsOptions {
            num_inodes: Some(0),
            ..opts("ext4")
        };
        let r = resolve(&o, &p, &env(1 << 30)).unwrap();
        assert_eq!(r.params.inodes_count, dflt.params.inodes_count);
    }

    #[test]
    fn sector_sizes_like_mke2fs() {
        let none = |_: &str| None::<String>;
        assert_eq!(sector_sizes(512, 4096, none), (512, 4096));
        let vars = |v: &str| match v {
            "MKE2FS_DEVICE_SECTSIZE" => Some(" 2048x".to_string()),
            "MKE2FS_DEVICE_PHYS_SECTSIZE" => Some("-4096".to_string()),
            _ => None,
        };
        assert_eq!(sector_sizes(512, 512, vars), (2048, 0));
        assert_eq!(atoi("abc"), 0);
        assert_eq!(atoi("+12k"), 12);
        // The logical size raises the block size; the physical one only
        // warns about an explicit smaller block size.
        let p = Profile::builtin();
        let mut e = env(64 << 20);
        e.logical_sector_size = 2048;
        let r = resolve(&opts("ext4"), &p, &e).unwrap();
        assert_eq!(r.params.block_size, 2048);
        let b1k = MkfsOptions {
            block_size: Some(1024),
            ..opts("ext4")
        };
        assert!(resolve(&b1k, &p, &e).is_err());
        let mut e = env(64 << 20);
        e.physical_sector_size = 4096;
        let r = resolve(&b1k, &p, &e).unwrap();
        assert_eq!(r.params.block_size, 1024);
        assert!(
            r.warnings
                .iter()
                .any(|w| w
                    == "Warning: specified blocksize 1024 is less than device physical sectorsize 4096"),
            "{:?}",
            r.warnings
        );
    }

    /// get_device_geometry: a 512e disk (4 KiB physical sectors, minimum
    /// I/O 4 KiB) gives 1 KiB-block filesystems stride = stripe = 4; the
    /// physical size stands in for a missing minimum I/O size; -E wins;
    /// regular files get no hints at all.
    #[test]
    fn io_hints_become_stride_like_mke2fs() {
        use ext4kit_device::IoHints;
        let p = Profile::builtin();
        let b1k = MkfsOptions {
            block_size: Some(1024),
            ..opts("ext4")
        };
        let mut e = env(1 << 30);
        e.is_regular_file = false;
        e.logical_sector_size = 512;
        e.physical_sector_size = 4096;
        e.io_hints = Some(IoHints {
            min_io: 4096,
            opt_io: 0,
            alignment_offset: 0,
        });
        let r = resolve(&b1k, &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (4, 4));
        // 4 KiB blocks: nothing larger than a block.
        let r = resolve(&opts("ext4"), &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (0, 0));
        // No minimum I/O size: the physical sector size.
        e.io_hints = Some(IoHints::default());
        let r = resolve(&b1k, &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (4, 4));
        // RAID: 64 KiB chunks, 4 data disks.
        e.io_hints = Some(IoHints {
            min_io: 65536,
            opt_io: 262_144,
            alignment_offset: 0,
        });
        let r = resolve(&opts("ext4"), &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (16, 64));
        // `-b 5000`: 4 KiB blocks, but mke2fs divides the hints by 5000.
        let b5000 = MkfsOptions {
            block_size: Some(5000),
            ..opts("ext4")
        };
        let r = resolve(&b5000, &p, &e).unwrap();
        assert_eq!(r.params.block_size, 4096);
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (13, 52));
        let o = MkfsOptions {
            extended: vec!["stride=8".into()],
            ..opts("ext4")
        };
        let r = resolve(&o, &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (8, 64));
        let o = MkfsOptions {
            extended: vec!["stride=5".into()],
            ..opts("ext4")
        };
        let r = resolve(&o, &p, &e).unwrap();
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("not an even multiple of stride 5")),
            "{:?}",
            r.warnings
        );
        e.io_hints = None;
        let r = resolve(&b1k, &p, &e).unwrap();
        assert_eq!((r.params.stride, r.settings.raid_stripe_width), (0, 0));
    }

    /// A bad `errors` in mke2fs.conf is fatal even with -e, as in mke2fs.
    #[test]
    fn profile_errors_checked_even_with_e() {
        let p = Profile::parse("[defaults]\n\terrors = broken\n").unwrap();
        let o = MkfsOptions {
            errors: Some("panic".into()),
            ..opts("ext2")
        };
        let e = resolve(&o, &p, &env(1 << 30)).unwrap_err();
        assert_eq!(e.0, "bad error behavior in profile - broken");
        let p = Profile::parse("[defaults]\n\terrors = continue\n").unwrap();
        assert_eq!(resolve(&o, &p, &env(1 << 30)).unwrap().settings.errors, 3);
    }

    /// mke2fs.conf's reserved_ratio: strtod's syntax, mke2fs's range check
    /// and its "%lf" in the message (checked against mke2fs 1.47.0).
    #[test]
    fn profile_reserved_ratio_like_mke2fs() {
        let r = |v: &str| {
            let p = Profile::parse(&format!("[defaults]\n\treserved_ratio = {v}\n")).unwrap();
            resolve(&opts("ext2"), &p, &env(1 << 30)).map(|r| r.params.r_blocks_count)
        };
        assert_eq!(r("0x1.8p1"), r("3"));
        assert_eq!(
            r("60").unwrap_err().0,
            "invalid reserved blocks percent - 60.000000"
        );
        assert_eq!(
            r("-0x1p0").unwrap_err().0,
            "invalid reserved blocks percent - -1.000000"
        );
        assert_eq!(
            r("nan").unwrap_err().0,
            "invalid reserved blocks percent - nan"
        );
        assert_eq!(
            r("inf").unwrap_err().0,
            "invalid reserved blocks percent - inf"
        );
    }

    /// The creator OS comes from -o, else `[defaults] creator_os`, and may
    /// be a number, as in mke2fs's set_os().
    #[test]
    fn creator_os_like_set_os() {
        let p = Profile::parse("[defaults]\n\tcreator_os = FreeBSD\n").unwrap();
        let r = resolve(&opts("ext2"), &p, &env(1 << 30)).unwrap();
        assert_eq!(r.settings.creator_os, 3);
        let o = MkfsOptions {
            creator_os: Some("4".into()),
            ..opts("ext2")
        };
        assert_eq!(
            resolve(&o, &p, &env(1 << 30)).unwrap().settings.creator_os,
            4
        );
        let o = MkfsOptions {
            creator_os: Some("LINUX".into()),
            ..opts("ext2")
        };
        assert_eq!(
            resolve(&o, &p, &env(1 << 30)).unwrap().settings.creator_os,
            0
        );
        for hurd in ["1", "GNU", "hurd"] {
            let o = MkfsOptions {
                creator_os: Some(hurd.into()),
                features: vec!["filetype".into()],
                ..opts("ext2")
            };
            // The Hurd has no filetype: -O filetype is refused, as in mke2fs.
            let e = resolve(&o, &p, &env(1 << 30)).unwrap_err();
            assert_eq!(e.0, "The HURD does not support the filetype feature.");
            let o = MkfsOptions {
                features: vec![],
                ..o
            };
            let r = resolve(&o, &p, &env(1 << 30)).unwrap();
            assert_eq!(r.settings.creator_os, 1, "{hurd}");
            assert!(!r.params.features.incompat.contains(Incompat::FILETYPE));
        }
        let o = MkfsOptions {
            creator_os: Some("plan9".into()),
            ..opts("ext2")
        };
        assert_eq!(
            resolve(&o, &p, &env(1 << 30)).unwrap_err().0,
            "unknown os - plan9"
        );
    }

    /// casefold's encoding: mke2fs.conf's `encoding`/`encoding_flags`
    /// when the feature comes from the features, `-E encoding=` turns the
    /// feature on, and every extended-option string starts the flags over
    /// from the encoding's defaults (mke2fs.conf's flags are lost then).
    #[test]
    fn casefold_encoding_like_mke2fs() {
        let conf = "[fs_types]\n\text4 = {\n\t\tfeatures = has_journal,extent\n\t\tencoding_flags = strict\n\t}\n";
        let p = Profile::parse(conf).unwrap();
        let o = |features: &[&str], ext: &[&str]| MkfsOptions {
            features: features.iter().map(|s| s.to_string()).collect(),
            extended: ext.iter().map(|s| s.to_string()).collect(),
            ..opts("ext4")
        };
        let r = resolve(&o(&["casefold"], &[]), &p, &env(1 << 30)).unwrap();
        assert_eq!((r.settings.encoding, r.settings.encoding_flags), (1, 1));
        let r = resolve(&o(&["casefold"], &["test_fs"]), &p, &env(1 << 30)).unwrap();
        assert_eq!((r.settings.encoding, r.settings.encoding_flags), (1, 0));
        let r = resolve(
            &o(&[], &["encoding=utf8,encoding_flags=strict"]),
            &p,
            &env(1 << 30),
        )
        .unwrap();
        assert!(r.params.features.incompat.contains(Incompat::CASEFOLD));
        assert_eq!((r.settings.encoding, r.settings.encoding_flags), (1, 1));
        let r = resolve(&o(&[], &[]), &p, &env(1 << 30)).unwrap();
        assert_eq!((r.settings.encoding, r.settings.encoding_flags), (0, 0));
        let e = resolve(&o(&[], &["encoding_flags=strict"]), &p, &env(1 << 30)).unwrap_err();
        assert!(
            e.0.contains("An encoding must be explicitly specified"),
            "{e}"
        );
        let bad = Profile::parse(&conf.replace("strict", "bogus")).unwrap();
        let e = resolve(&o(&["casefold"], &[]), &bad, &env(1 << 30)).unwrap_err();
        assert_eq!(e.0, "Unknown encoding flags from profile: bogus");
    }

    /// inline_data: an explicit 128-byte inode size is mke2fs's refusal;
    /// libext2fs's silent 128 (no inode_size anywhere) is ext4kit's.
    #[test]
    fn inline_data_needs_large_inodes() {
        let p = Profile::parse("[defaults]\n\tblocksize = 4096\n").unwrap();
        let o = MkfsOptions {
            features: vec!["inline_data".into()],
            ..opts("ext2")
        };
        let e = resolve(&o, &p, &env(1 << 30)).unwrap_err();
        assert!(e.0.contains("-I 256"), "{e}");
        let o = MkfsOptions {
            inode_size: Some(128),
            ..o
        };
        let e = resolve(&o, &p, &env(1 << 30)).unwrap_err();
        assert_eq!(
            e.0,
            "128 byte inodes are too small for inline data; specify larger size"
        );
        let o = MkfsOptions {
            inode_size: Some(256),
            ..o
        };
        assert!(resolve(&o, &p, &env(1 << 30)).is_ok());
    }

    /// num_backup_sb as mke2fs reads it (strtoul into an int), and the
    /// s_backup_bgs request it makes.
    #[test]
    fn num_backup_sb_like_mke2fs() {
        let p = Profile::builtin();
        let bgs = |ext: &str| {
            let o = MkfsOptions {
                features: vec!["sparse_super2".into()],
                extended: vec![ext.into()],
                ..opts("ext4")
            };
            resolve(&o, &p, &env(1 << 30)).map(|r| r.params.backup_bgs)
        };
        assert_eq!(bgs("test_fs"), Ok([1, !0]));
        assert_eq!(bgs("num_backup_sb=1"), Ok([1, 0]));
        assert_eq!(bgs("num_backup_sb=0"), Ok([0, 0]));
        assert_eq!(bgs("num_backup_sb=-1"), Ok([0, 0]));
        assert_eq!(bgs("num_backup_sb=0x2"), Ok([1, !0]));
        assert!(bgs("num_backup_sb=3").is_err());
    }

    /// -E resize= as parse_extended_opts computes it, -J as
    /// parse_journal_opts reads device= and size=.
    #[test]
    fn resize_and_journal_options_like_mke2fs() {
        // 64 MiB of 1 KiB blocks, 64-byte descriptors: 8 groups, 1
        // descriptor block; 1000000 blocks are 123 groups, 8 blocks.
        assert_eq!(resize_reserved_gdt("1000000", 0, 65536, 0, 64), Ok(7));
        assert_eq!(resize_reserved_gdt("100000", 0, 65536, 0, 64), Ok(0));
        assert_eq!(resize_reserved_gdt("4T", 0, 65536, 0, 64), Ok(256));
        // Past 2^32 groups the 32-bit division wraps (then capped).
        assert_eq!(
            resize_reserved_gdt("1000000000000000", 0, 65536, 0, 64),
            Ok(256)
        );
        assert_eq!(
            resize_reserved_gdt("35184372088832", 0, 65536, 0, 64),
            Ok(0)
        );
        assert!(resize_reserved_gdt("65536", 0, 65536, 0, 64).is_err());
        assert!(resize_reserved_gdt("x", 0, 65536, 0, 64).is_err());
        let p = Profile::builtin();
        let o = MkfsOptions {
            extended: vec!["resize=1000000".into()],
            features: vec!["^resize_inode".into()],
            ..opts("ext4")
        };
        let r = resolve(&o, &p, &env(64 << 20)).unwrap();
        assert!(r.params.features.compat.contains(Compat::RESIZE_INODE));
        assert_eq!(r.params.reserved_gdt_blocks, Some(7));
        let o = MkfsOptions {
            extended: vec!["resize=1000000,desc_size=128".into()],
            ..opts("ext4")
        };
        assert_eq!(
            resolve(&o, &p, &env(64 << 20)).unwrap_err().0,
            "'desc_size' must be before 'resize=7'"
        );
        let j = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            journal_device_spec(&j(&["size=4,device=/dev/a", "device=UUID=x"])),
            Ok(Some("UUID=x".into()))
        );
        assert!(journal_device_spec(&j(&["device"])).is_err());
        assert!(!journal_size_given(
            false,
            &j(&["device=/dev/a,location=5"])
        ));
        assert!(!journal_size_given(false, &j(&["fast_commit_size=64"])));
        assert!(journal_size_given(false, &j(&["location=5,size=8"])));
        assert!(journal_size_given(true, &[]));
        // -J device= needs the device read first.
        let o = MkfsOptions {
            journal: j(&["device=/dev/a"]),
            ..opts("ext4")
        };
        assert!(resolve(&o, &p, &env(64 << 20)).is_err());
    }

    #[test]
    fn time_uuid_is_version_1() {
        let o = MkfsOptions {
            uuid: Some("time".into()),
            ..opts("ext4")
        };
        let r = resolve(&o, &Profile::builtin(), &env(1 << 30)).unwrap();
        let u = uuid::Uuid::from_bytes(r.settings.uuid);
        assert_eq!(u.get_version_num(), 1);
        assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
        let secs = u.get_timestamp().map(|t| t.to_unix().0).unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        assert!(secs.abs_diff(now) < 600, "timestamp {secs} vs now {now}");
        let o = MkfsOptions {
            uuid: Some("random".into()),
            ..opts("ext4")
        };
        let r = resolve(&o, &Profile::builtin(), &env(1 << 30)).unwrap();
        assert_eq!(uuid::Uuid::from_bytes(r.settings.uuid).get_version_num(), 4);
    }

    /// mke2fs's getopt loop: the first bad option in command-line order,
    /// with mke2fs's message; strtoul base 0 (hex, octal, empty = 0).
    /// `-m` is strtod's: what glibc accepts (checked against mke2fs
    /// 1.47.0: `mke2fs -m ARG -n`), and where it stops.
    #[test]
    fn strtod_like_glibc() {
        let ok = |s: &str| c_strtod_whole(s);
        assert_eq!(ok("0x1p2"), Some(4.0));
        assert_eq!(ok("0x1.8p1"), Some(3.0));
        assert_eq!(ok("0X.8P+3"), Some(4.0));
        assert_eq!(ok("0x10"), Some(16.0));
        assert_eq!(ok("0x0.0001p16"), Some(1.0));
        assert_eq!(ok("-0x1p-1"), Some(-0.5));
        assert_eq!(ok(" 3"), Some(3.0));
        assert_eq!(ok("\t+2.5"), Some(2.5));
        assert_eq!(ok("1e1"), Some(10.0));
        assert_eq!(ok(".5e1"), Some(5.0));
        assert_eq!(ok("5."), Some(5.0));
        assert_eq!(ok("1e-400"), Some(0.0));
        assert_eq!(ok(""), Some(0.0));
        assert_eq!(ok("inf"), Some(f64::INFINITY));
        assert_eq!(ok("-Infinity"), Some(f64::NEG_INFINITY));
        assert!(ok("nan").is_some_and(f64::is_nan));
        assert!(ok("-NaN").is_some_and(f64::is_nan));
        assert!(ok("nan(abc_1)").is_some_and(f64::is_nan));
        for bad in [
            " ", "0x", "0xp1", "0x1p", "1e", "1e+", ".", "nan(", "infin", "3 ", "5%", "1_0",
        ] {
            assert_eq!(ok(bad), None, "{bad:?}");
        }
        assert_eq!(c_strtod("0xg"), (0.0, "xg"));
        assert_eq!(c_strtod("1e+"), (1.0, "e+"));
        // Many digits round as a whole.
        assert_eq!(ok("0x1.00000000000008p0"), Some(1.0));
        assert_eq!(ok("0x1.000000000000080001p0"), Some(1.0 + f64::EPSILON));
        let a = |v: &[(char, &str)]| -> Vec<(char, String)> {
            v.iter().map(|(c, s)| (*c, s.to_string())).collect()
        };
        assert_eq!(
            getopt_check(&a(&[('m', "0x1p2")])).unwrap().reserved_ratio,
            Some(4.0)
        );
        for bad in ["inf", "0x1p6", "-1e-300", "nan", "-nan(1)"] {
            assert_eq!(
                getopt_check(&a(&[('m', bad)])).unwrap_err().0,
                format!("invalid reserved blocks percent - {bad}")
            );
        }
    }

    #[test]
    fn getopt_checks_like_mke2fs() {
        let a = |v: &[(char, &str)]| -> Vec<(char, String)> {
            v.iter().map(|(c, s)| (*c, s.to_string())).collect()
        };
        let e = |v: &[(char, &str)]| getopt_check(&a(v)).unwrap_err().0;
        assert_eq!(e(&[('e', "broken")]), "bad error behavior - broken");
        assert_eq!(
            e(&[('e', "panic"), ('b', "100"), ('e', "x")]),
            "invalid block size - 100"
        );
        assert_eq!(e(&[('G', "3")]), "flex_bg size must be a power of 2");
        assert_eq!(e(&[('G', "0")]), "flex_bg size must be a power of 2");
        assert_eq!(e(&[('G', "")]), "flex_bg size must be a power of 2");
        assert_eq!(e(&[('G', "1x")]), "Illegal number for flex_bg size");
        assert_eq!(
            e(&[('G', "0x100000000")]),
            "flex_bg size (4294967296) must be less than or equal to 2^31"
        );
        assert_eq!(e(&[('N', "5k")]), "bad num inodes - 5k");
        assert_eq!(
            e(&[('g', "1001")]),
            "blocks per group must be multiple of 8"
        );
        assert_eq!(
            e(&[('m', "50.5")]),
            "invalid reserved blocks percent - 50.5"
        );
        assert!(e(&[('J', "size=4x")]).starts_with("Bad journal options specified"));
        assert!(e(&[('J', "size")]).starts_with("Bad journal options specified"));
        assert!(e(&[('J', "nope")]).starts_with("Bad journal options specified"));
        assert_eq!(
            e(&[('t', "ext4"), ('t', "ext3")]),
            "The -t option may only be used once"
        );
        let g = getopt_check(&a(&[
            ('G', "0x10"),
            ('N', "010"),
            ('g', ""),
            ('I', "0x100"),
            ('m', " 2.5"),
            ('J', "size=0x10,v1_superblock"),
        ]))
        .unwrap();
        assert_eq!(g.flex_bg_size, Some(16));
        assert_eq!(g.num_inodes, Some(8));
        assert_eq!(g.blocks_per_group, Some(0));
        assert_eq!(g.inode_size, Some(256));
        assert_eq!(g.reserved_ratio, Some(2.5));
        assert_eq!(g.journal_size, 16);
        // -j turns journal_size 0 into -1; a later size=0 takes it back.
        // -J device= is looked up as it is read: the first not found is
        // the error, even before a later bad option; the last found wins.
        let mut asked = Vec::new();
        let mut find = |s: &str| {
            asked.push(s.to_string());
            (!s.starts_with("UUID=")).then(|| format!("/dev/{s}"))
        };
        let r = getopt_check_with(
            &a(&[('J', "device=sda"), ('J', "device=sdb"), ('b', "4096")]),
            &mut find,
        );
        assert_eq!(r.unwrap().journal_device.as_deref(), Some("/dev/sdb"));
        let r = getopt_check_with(
            &a(&[
                ('J', "size=4,device=UUID=x"),
                ('b', "100"),
                ('J', "device=sdc"),
            ]),
            &mut find,
        );
        assert_eq!(
            r.unwrap_err().error.0,
            "Could not find journal device matching UUID=x"
        );
        assert_eq!(asked, ["sda", "sdb", "UUID=x"]);
        // What the loop prints, in order, also before a refused option.
        let long = "12345678901234567890";
        let g = getopt_check(&a(&[
            ('K', ""),
            ('b', "8192"),
            ('R', "x"),
            ('L', long),
            ('b', "-8192"),
        ]))
        .unwrap();
        assert_eq!(
            g.notes,
            [
                LoopNote::KDeprecated,
                LoopNote::BlockSizeUnusable(8192),
                LoopNote::RDeprecated,
                LoopNote::LabelTooLong(label_warning(Some(long)).unwrap()),
            ]
        );
        let f = getopt_check_with(&a(&[('L', long), ('b', "100"), ('K', "")]), &mut |s| {
            Some(s.into())
        })
        .unwrap_err();
        assert_eq!(f.error.0, "invalid block size - 100");
        assert_eq!(
            f.notes,
            [LoopNote::LabelTooLong(label_warning(Some(long)).unwrap())]
        );
        let js = |v: &[(char, &str)]| getopt_check(&a(v)).unwrap().journal_size;
        assert_eq!(js(&[('J', "size=0"), ('j', "")]), -1);
        assert_eq!(js(&[('j', ""), ('J', "size=0")]), 0);
        assert_eq!(js(&[('J', "size=-1")]), -1);
        let j = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(journal_size(false, &j(&["size=0"])), 0);
        assert_eq!(journal_size(true, &j(&["size=0"])), -1);
        assert_eq!(journal_size(false, &j(&["size=0x20", "size=010"])), 8);
        assert!(!journal_size_given(false, &j(&["size=0"])));
    }
}
