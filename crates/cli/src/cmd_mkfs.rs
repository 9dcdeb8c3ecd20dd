//! `ext4kit mkfs`: mke2fs's options, our planner and writer.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ext4kit::mkfs::{self, Env, MkfsOptions};
use ext4kit::profile::Profile;
use ext4kit_device::{Device, FileDevice, OpenOptions, open_device};

/// Create an ext4 filesystem (mke2fs-compatible options).
///
/// Given a path that does not exist and a size, a sparse image file is
/// created. On sparse files and devices that prove ranges read as zero,
/// zeroing is skipped, so the image stays as small as possible while
/// holding the same bytes mke2fs would write.
#[derive(clap::Args, Debug)]
#[command(
    args_override_self = true,
    after_help = "Examples:\n  ext4kit mkfs disk.img 10G\n  ext4kit mkfs -t ext4 -L data -E lazy_itable_init=1,nodiscard /dev/sdX"
)]
pub struct MkfsArgs {
    /// Filesystem type (ext4, ext3, ext2), as in mke2fs.conf [default: ext4].
    #[arg(short = 't', value_name = "FS-TYPE")]
    fs_type: Vec<String>,
    /// Usage types (comma-separated: news, largefile, small, ...).
    #[arg(short = 'T', value_name = "USAGE-TYPES")]
    usage_types: Vec<String>,
    // The options mke2fs checks while its getopt loop reads them are kept
    // as given (every occurrence) and checked in command-line order by
    // `getopt_check`, before -V (see `MkfsArgs::order_extended`).
    /// Block size in bytes (1024, 2048, 4096, 4k, ...; negative = minimum).
    #[arg(
        short = 'b',
        action = clap::ArgAction::Append,
        value_name = "BLOCK-SIZE",
        allow_hyphen_values = true
    )]
    block_size: Vec<String>,
    /// Number of inodes (0: the default).
    #[arg(
        short = 'N',
        action = clap::ArgAction::Append,
        value_name = "NUMBER-OF-INODES",
        allow_hyphen_values = true
    )]
    num_inodes: Vec<String>,
    /// Bytes per inode.
    #[arg(
        short = 'i',
        action = clap::ArgAction::Append,
        value_name = "BYTES-PER-INODE",
        allow_hyphen_values = true
    )]
    inode_ratio: Vec<String>,
    /// Inode size in bytes.
    #[arg(
        short = 'I',
        action = clap::ArgAction::Append,
        value_name = "INODE-SIZE",
        allow_hyphen_values = true
    )]
    inode_size: Vec<String>,
    /// Reserved blocks percentage.
    #[arg(
        short = 'm',
        action = clap::ArgAction::Append,
        value_name = "RESERVED-RATIO",
        allow_hyphen_values = true
    )]
    reserved_ratio: Vec<String>,
    /// Volume label (at most 16 bytes).
    #[arg(short = 'L', action = clap::ArgAction::Append, value_name = "LABEL")]
    label: Vec<String>,
    /// Filesystem UUID (or null, clear, random, time).
    #[arg(short = 'U', overrides_with = "uuid", value_name = "UUID")]
    uuid: Option<String>,
    /// Features to set or clear (feat,^feat,...; meta_bg needs
    /// ^resize_inode; journal_dev makes an external journal device). May
    /// be repeated.
    #[arg(short = 'O', value_name = "FEATURE[,...]")]
    features: Vec<String>,
    /// Extended options: lazy_itable_init=, lazy_journal_init=,
    /// assume_storage_prezeroed=, discard, nodiscard, hash_seed=,
    /// root_owner[=uid:gid], num_backup_sb=, packed_meta_blocks, stride=,
    /// stripe_width=, orphan_file_size=, desc_size= (64..1024 bytes, with
    /// 64bit), offset= (bytes into the target), test_fs, no_copy_xattrs,
    /// encoding= (utf8; turns casefold on), encoding_flags= (strict),
    /// mmp_update_interval= (seconds, with mmp), resize= (the block count
    /// the reserved GDT blocks must cover). As in mke2fs, only the last -E
    /// counts.
    #[arg(short = 'E', value_name = "EXTENDED-OPTS")]
    extended: Vec<String>,
    /// Journal options: size=MiB (0: no size, the default if a journal is
    /// made), fast_commit_size=KiB (with fast_commit), location=BLOCK (the
    /// journal's goal block), device=PATH|UUID=..|LABEL=.. (an external
    /// journal device made with -O journal_dev). Numbers may be hex (0x)
    /// or octal (0).
    #[arg(short = 'J', value_name = "JOURNAL-OPTS")]
    journal: Vec<String>,
    /// Create a journal (ext3).
    #[arg(short = 'j', overrides_with = "add_journal")]
    add_journal: bool,
    /// Groups per flex_bg (a power of 2).
    #[arg(
        short = 'G',
        action = clap::ArgAction::Append,
        value_name = "FLEX-GROUP-SIZE",
        allow_hyphen_values = true
    )]
    flex_bg_size: Vec<String>,
    /// Blocks per group.
    #[arg(
        short = 'g',
        action = clap::ArgAction::Append,
        value_name = "BLOCKS-PER-GROUP",
        allow_hyphen_values = true
    )]
    blocks_per_group: Vec<String>,
    /// Last-mounted directory to record.
    #[arg(
        short = 'M',
        overrides_with = "mount_dir",
        value_name = "LAST-MOUNTED-DIR"
    )]
    mount_dir: Option<String>,
    /// Creator OS.
    #[arg(short = 'o', overrides_with = "creator_os", value_name = "CREATOR-OS")]
    creator_os: Option<String>,
    /// Error behaviour (continue, remount-ro, panic).
    #[arg(
        short = 'e',
        action = clap::ArgAction::Append,
        value_name = "ERRORS-BEHAVIOR",
        allow_hyphen_values = true
    )]
    errors: Vec<String>,
    /// Force: format even when the target holds a filesystem or another
    /// signature (no question asked).
    #[arg(short = 'F', action = clap::ArgAction::Count)]
    force: u8,
    /// Quiet: only warnings and errors.
    #[arg(short = 'q', action = clap::ArgAction::Count)]
    quiet: u8,
    /// Dry run: plan and print, write nothing.
    #[arg(short = 'n', action = clap::ArgAction::Count)]
    dry_run: u8,
    /// Verbose.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Deprecated spelling of -E (as in mke2fs).
    #[arg(short = 'R', value_name = "EXTENDED-OPTS", hide = true)]
    extended_deprecated: Vec<String>,
    /// -E and -R values in command-line order (see [`MkfsArgs::order_extended`]).
    #[arg(skip)]
    extended_in_order: Option<Vec<String>>,
    /// The options mke2fs's getopt loop checks, `(letter, value)` in
    /// command-line order (`-j` with an empty value).
    #[arg(skip)]
    getopt_order: Option<Vec<(char, String)>>,
    /// Deprecated: same as -E nodiscard (as in mke2fs).
    #[arg(short = 'K', action = clap::ArgAction::Count, hide = true)]
    keep: u8,
    // mke2fs options ext4kit does not implement yet: accepted by the parser
    // so that they get one clear error (see `unsupported`).
    /// Check the device for bad blocks with badblocks(8) first (twice:
    /// its read-write test); they go into the bad block inode.
    #[arg(short = 'c', action = clap::ArgAction::Count)]
    opt_c: u8,
    /// Read the bad blocks list from FILE (one block number a line, as
    /// badblocks(8) prints them).
    #[arg(short = 'l', value_name = "FILE")]
    opt_l: Option<String>,
    /// Cluster size in bytes (with -O bigalloc; default 16 blocks).
    #[arg(
        short = 'C',
        action = clap::ArgAction::Append,
        value_name = "CLUSTER-SIZE",
        allow_hyphen_values = true
    )]
    opt_cap_c: Vec<String>,
    /// Copy a tree into the new filesystem: a directory, or a tar archive
    /// (plain, gzip, zstd or xz, told by its first bytes; `-` reads it
    /// from stdin). Shows progress on a terminal; --json reports what was
    /// copied under "populated".
    #[arg(short = 'd', value_name = "ROOT-DIR|TARBALL")]
    opt_d: Option<String>,
    /// Direct I/O: write with O_DIRECT where the target takes it (same
    /// bytes).
    #[arg(short = 'D', action = clap::ArgAction::Count)]
    opt_cap_d: u8,
    /// Revision level: 1, or 0 (no features, 128-byte inodes).
    #[arg(
        short = 'r',
        action = clap::ArgAction::Append,
        value_name = "REVISION",
        allow_hyphen_values = true
    )]
    opt_r: Vec<String>,
    /// Deprecated: 1 sets, 0 clears sparse_super (use -O [^]sparse_super).
    #[arg(
        short = 's',
        overrides_with = "opt_s",
        value_name = "SPARSE-SUPER",
        allow_hyphen_values = true
    )]
    opt_s: Option<String>,
    /// Write the superblock and group descriptors only (last-resort
    /// recovery: give the filesystem's original options, then run
    /// e2fsck -fy). Unlike mke2fs 1.47.0, the device is not discarded
    /// first (that would destroy the data) unless -E discard.
    #[arg(short = 'S', action = clap::ArgAction::Count)]
    opt_cap_s: u8,
    /// Save the old content of every block overwritten into UNDO-FILE
    /// (e2fsprogs' undo format: `e2undo UNDO-FILE DEVICE` restores it); an
    /// existing undo file of what the target holds is appended to. No
    /// discard then. Without -z, mke2fs's automatic undo file in
    /// $E2FSPROGS_UNDO_DIR or mke2fs.conf's undo_dir, when writable.
    #[arg(short = 'z', value_name = "UNDO-FILE")]
    opt_z: Option<String>,
    /// Print the version and exit (installed as mke2fs: mke2fs 1.47.0's
    /// version line, then ext4kit's).
    #[arg(short = 'V', action = clap::ArgAction::Count)]
    opt_cap_v: u8,
    /// Print a machine-readable JSON report on stdout.
    #[arg(long)]
    json: bool,
    /// Device or image file.
    #[arg(value_name = "DEVICE")]
    device: Option<PathBuf>,
    /// Filesystem size (blocks, or with a K/M/G/T suffix).
    #[arg(value_name = "FS-SIZE")]
    fs_size: Option<String>,
}

/// `SOURCE_DATE_EPOCH`, which clamps the times `-d` copies (as mke2fs
/// 1.47.1 does).
fn source_date_epoch() -> Result<Option<i64>> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => match v.trim().parse::<i64>() {
            Ok(n) => Ok(Some(n)),
            Err(_) => bail!("invalid SOURCE_DATE_EPOCH: '{}'", v.trim()),
        },
        Err(_) => Ok(None),
    }
}

fn now_from_env() -> Result<u32> {
    for var in ["E2FSPROGS_FAKE_TIME", "SOURCE_DATE_EPOCH"] {
        if let Ok(v) = std::env::var(var) {
            let v = v.trim();
            let n = if let Some(h) = v.strip_prefix("0x") {
                u64::from_str_radix(h, 16).ok()
            } else {
                v.parse::<u64>().ok()
            };
            match n {
                Some(n) if n <= u64::from(u32::MAX) => return Ok(n as u32),
                _ => bail!("invalid {var}: '{v}'"),
            }
        }
    }
    // The coarse clock, as mke2fs's time(2): the fine one can stamp a
    // second that an e2fsck started just after still calls the future.
    let secs = ext4kit_device::host::realtime_coarse_secs();
    Ok(secs.min(u64::from(u32::MAX)) as u32)
}

/// The system page size (only used for `blocksize = -1` in mke2fs.conf
/// and the "blocks too big" warning).
fn page_size() -> u32 {
    ext4kit_device::page_size()
}

impl MkfsArgs {
    /// Record the `-E` and `-R` values in the order they were given (mke2fs
    /// treats `-R` as a deprecated `-E`), from the parser's matches.
    pub fn order_extended(&mut self, m: &clap::ArgMatches) {
        let mut all: Vec<(usize, String)> = Vec::new();
        for id in ["extended", "extended_deprecated"] {
            if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) {
                all.extend(idx.zip(vals.cloned()));
            }
        }
        all.sort_by_key(|(i, _)| *i);
        self.extended_in_order = Some(all.into_iter().map(|(_, v)| v).collect());
        let mut order: Vec<(usize, char, String)> = Vec::new();
        for (id, c) in GETOPT_IDS {
            if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
                continue;
            }
            let Some(idx) = m.indices_of(id) else {
                continue;
            };
            if c == 'j' || c == 'K' {
                order.extend(idx.map(|i| (i, c, String::new())));
            } else if let Some(vals) = m.get_many::<String>(id) {
                order.extend(idx.zip(vals.cloned()).map(|(i, v)| (i, c, v)));
            }
        }
        order.sort_by_key(|(i, _, _)| *i);
        self.getopt_order = Some(order.into_iter().map(|(_, c, v)| (c, v)).collect());
    }

    /// [`MkfsArgs::getopt_order`], or (without the parser's matches) the
    /// options option by option.
    fn getopt_args(&self) -> Vec<(char, String)> {
        if let Some(o) = &self.getopt_order {
            return o.clone();
        }
        let mut v: Vec<(char, String)> = Vec::new();
        let lists: [(char, &Vec<String>); 15] = [
            ('b', &self.block_size),
            ('L', &self.label),
            ('R', &self.extended_deprecated),
            ('C', &self.opt_cap_c),
            ('e', &self.errors),
            ('g', &self.blocks_per_group),
            ('G', &self.flex_bg_size),
            ('i', &self.inode_ratio),
            ('I', &self.inode_size),
            ('J', &self.journal),
            ('m', &self.reserved_ratio),
            ('N', &self.num_inodes),
            ('r', &self.opt_r),
            ('t', &self.fs_type),
            ('T', &self.usage_types),
        ];
        for (c, l) in lists {
            v.extend(l.iter().map(|s| (c, s.clone())));
        }
        if self.add_journal {
            v.push(('j', String::new()));
        }
        v.extend((0..self.keep).map(|_| ('K', String::new())));
        v
    }
}

/// The arguments [`ext4kit::mkfs::options::getopt_check`] looks at.
const GETOPT_IDS: [(&str, char); 17] = [
    ("block_size", 'b'),
    ("keep", 'K'),
    ("label", 'L'),
    ("extended_deprecated", 'R'),
    ("opt_cap_c", 'C'),
    ("errors", 'e'),
    ("blocks_per_group", 'g'),
    ("flex_bg_size", 'G'),
    ("inode_ratio", 'i'),
    ("inode_size", 'I'),
    ("add_journal", 'j'),
    ("journal", 'J'),
    ("reserved_ratio", 'm'),
    ("num_inodes", 'N'),
    ("opt_r", 'r'),
    ("fs_type", 't'),
    ("usage_types", 'T'),
];

/// mke2fs's `journal_size` order: does a `-j` (or the name mkfs.ext3,
/// which sets it before the options) come after the last `-J size=`?
fn journal_asked(order: &[(char, String)], who: &Personality) -> bool {
    let is_size = |v: &str| {
        v.split(',')
            .any(|t| t.split_once('=').is_some_and(|(k, _)| k == "size"))
    };
    let last_size = order.iter().rposition(|(c, v)| *c == 'J' && is_size(v));
    let last_j = order.iter().rposition(|(c, _)| *c == 'j');
    let ext3 = *who == Personality::MkfsType("ext3".into());
    match (last_j, last_size) {
        (Some(j), Some(s)) => j > s,
        (Some(_), None) => true,
        (None, None) => ext3,
        (None, Some(_)) => false,
    }
}

/// Which program the user ran: `ext4kit mkfs`, or the binary installed
/// (linked) as `mke2fs` or `mkfs.<type>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Personality {
    /// `ext4kit mkfs`: ext4 unless `-t` says otherwise.
    Ext4kit,
    /// `mke2fs`: `[defaults] fs_type` of mke2fs.conf, else ext2 (ext3
    /// with `-j`/`-J`).
    Mke2fs,
    /// `mkfs.<type>` (mkfs.ext2, mkfs.ext3, mkfs.ext4): that type;
    /// mkfs.ext3 also adds a journal, as mke2fs does.
    MkfsType(String),
}

impl Personality {
    /// The personality for a program name (the file name of argv[0]);
    /// `None` for names that are not mke2fs's.
    pub fn from_program_name(name: &str) -> Option<Personality> {
        match name {
            "mke2fs" => Some(Personality::Mke2fs),
            "mkfs.ext2" | "mkfs.ext3" | "mkfs.ext4" => Some(Personality::MkfsType(
                name.trim_start_matches("mkfs.").to_string(),
            )),
            _ => None,
        }
    }

    /// The name to print in messages.
    pub fn program(&self) -> String {
        match self {
            Personality::Ext4kit => "ext4kit mkfs".into(),
            Personality::Mke2fs => "mke2fs".into(),
            Personality::MkfsType(t) => format!("mkfs.{t}"),
        }
    }
}

/// mke2fs options that ext4kit does not implement yet, with what they do.
fn unsupported(a: &MkfsArgs) -> Option<String> {
    let list: [(bool, &str, &str); 0] = [];
    let _ = a;
    list.iter()
        .find(|(given, _, _)| *given)
        .map(|(_, opt, what)| format!("not supported by ext4kit yet: {opt} ({what})"))
}

/// The type mke2fs would use before the size class: `-t`, else
/// `[devices] <DEVICE> fs_type`, else what the program name says.
fn ext_type(
    a: &MkfsArgs,
    who: &Personality,
    profile: &Profile,
    device: &str,
    add_journal: bool,
) -> String {
    if let Some(t) = a.fs_type.first() {
        return t.clone();
    }
    if let Some(t) = profile.get_value(&["devices", device, "fs_type"]) {
        return t.to_string();
    }
    match who {
        Personality::Ext4kit => "ext4".into(),
        Personality::MkfsType(t) => t.clone(),
        Personality::Mke2fs => {
            let t = profile
                .get_value(&["defaults", "fs_type"])
                .unwrap_or("ext2");
            if t == "ext2" && mkfs::options::journal_size_given(add_journal, &a.journal) {
                "ext3".into()
            } else {
                t.to_string()
            }
        }
    }
}

/// mke2fs's `proceed_question()`: ask on stdout, read one line from stdin;
/// anything but an answer starting with y/Y is "no" (returns false, after
/// a newline, as mke2fs does). With `delay` > 0 seconds, no answer in that
/// time means yes.
fn proceed_question(delay: i64) -> bool {
    use std::io::BufRead;
    let read = || {
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(n) if n > 0 => Some(line),
            _ => None,
        }
    };
    let answer = if delay > 0 {
        crate::out::write_fmt(format_args!(
            "Proceed anyway (or wait {delay} seconds to proceed) ? (y,N) "
        ));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read());
        });
        match rx.recv_timeout(std::time::Duration::from_secs(delay as u64)) {
            Ok(a) => a,
            Err(_) => {
                outln!("<proceeding>");
                return true;
            }
        }
    } else {
        crate::out::write_fmt(format_args!("Proceed anyway? (y,N) "));
        read()
    };
    let yes = answer
        .as_deref()
        .and_then(|l| l.chars().next())
        .is_some_and(|c| c == 'y' || c == 'Y');
    if !yes {
        outln!();
    }
    yes
}

/// mke2fs's numeric progress (lib/ext2fs/progress.c) for a step over
/// `max` groups, which ext4kit does at once: the label, the first
/// "0/max" update (unless `E2FSPROGS_SKIP_PROGRESS` is set), the blanking
/// at the end, then `done`.
fn progress_step(label: &str, max: u64, done: &str) {
    progress_from(label, 0, max, done);
}

/// [`progress_step`] whose one update shows `first` of `max`.
fn progress_from(label: &str, first: u64, max: u64, done: &str) {
    let digits = max.to_string().len();
    let mut s = String::from(label);
    if std::env::var_os("E2FSPROGS_SKIP_PROGRESS").is_none() {
        s.push_str(&format!("{first:>digits$}/{max}"));
        s.push_str(&"\u{8}".repeat(2 * digits + 1));
    }
    s.push_str(&" ".repeat(2 * digits + 1));
    s.push_str(&"\u{8}".repeat(2 * digits + 1));
    s.push_str(done);
    crate::out::write_fmt(format_args!("{s}"));
}

/// Print a warning the way mke2fs does: the 128-byte-inode and undefined
/// type notices on stdout (mke2fs uses printf), the rest on stderr.
fn print_warning(w: &str, json: bool) {
    let on_stdout = w.starts_with("128-byte inodes") || w.starts_with("Your mke2fs.conf");
    if w.starts_with("Your mke2fs.conf") && !json {
        // mke2fs's blank lines: one before, and one after the advice to
        // update the file (ext3/ext4 only).
        let after = if w.contains("You probably need") {
            "\n"
        } else {
            ""
        };
        outln!("\n{w}{after}");
    } else if on_stdout && !json {
        outln!("{w}");
    } else if w.starts_with("Warning: the fs_type") {
        // mke2fs sets this one off with blank lines.
        eprintln!("\n{w}\n");
    } else {
        eprintln!("{w}");
    }
}

/// What mke2fs's getopt loop printed, on stderr.
fn print_loop_notes(notes: &[mkfs::options::LoopNote], who: &Personality, json: bool) {
    use mkfs::options::LoopNote;
    for n in notes {
        match n {
            LoopNote::RDeprecated => {
                eprintln!("{}: '-R' is deprecated, use '-E' instead", who.program())
            }
            LoopNote::KDeprecated => eprintln!(
                "Warning: -K option is deprecated and should not be used anymore. Use '-E nodiscard' extended option instead!"
            ),
            LoopNote::BlockSizeUnusable(b) => {
                eprintln!("Warning: blocksize {b} not usable on most systems.")
            }
            LoopNote::LabelTooLong(w) => print_warning(w, json),
        }
    }
}

/// `-V`: the version, then exit 0 (mke2fs prints it after parsing the
/// command line, before looking at the device). As `mke2fs`/`mkfs.extN`,
/// mke2fs's own first line, on stderr, so that scripts testing the mke2fs
/// version see the release ext4kit reproduces, then the ext4kit version;
/// as `ext4kit mkfs`, one line on stdout.
fn print_version(who: &Personality) {
    let v = env!("EXT4KIT_VERSION");
    match who {
        Personality::Ext4kit => outln!("ext4kit mkfs {v} (mke2fs {MKE2FS_VERSION} compatible)"),
        _ => eprintln!("mke2fs {MKE2FS_VERSION} ({MKE2FS_DATE})\n\tUsing ext4kit {v}"),
    }
}

/// The mke2fs release whose output ext4kit reproduces.
const MKE2FS_VERSION: &str = "1.47.0";
const MKE2FS_DATE: &str = "5-Feb-2023";

pub fn run(a: &MkfsArgs, who: &Personality) -> Result<i32> {
    let start = Instant::now();
    let mke2fs = *who != Personality::Ext4kit;
    // mke2fs reads mke2fs.conf before its options: installed as mke2fs,
    // a broken one fails first (also -V, and without the version line).
    let early_profile = if mke2fs {
        Some(Profile::load().context("reading mke2fs.conf")?)
    } else {
        None
    };
    // mke2fs's getopt loop: each option checked as it is read, so a bad
    // one is refused even with -V, which prints the version after it.
    let order = a.getopt_args();
    // mke2fs looks each -J device= up (a NAME=value tag with libblkid) as
    // its loop reads it; a path is taken as it is, and opened later.
    let mut find_journal = |spec: &str| {
        crate::jdev::resolve_spec(spec)
            .ok()
            .map(|p| p.display().to_string())
    };
    // What mke2fs's loop prints as it reads the options comes before its
    // version line (also with -V) and before the error of a later option.
    let g = match mkfs::options::getopt_check_with(&order, &mut find_journal) {
        Ok(g) => {
            print_loop_notes(&g.notes, who, a.json);
            g
        }
        Err(f) => {
            print_loop_notes(&f.notes, who, a.json);
            return Err(f.error.into());
        }
    };
    let add_journal = journal_asked(&order, who);
    // (resolve lists the last -L's warning too: printed here already.)
    let early_label_warning = mkfs::options::label_warning(a.label.last().map(String::as_str));
    if a.opt_cap_v > 0 {
        print_version(who);
        return Ok(0);
    }
    let Some(device) = a.device.as_deref() else {
        bail!(
            "missing DEVICE (usage: {} [options] DEVICE [FS-SIZE]; see --help)",
            who.program()
        );
    };
    // What ext4kit lacks, before mke2fs's version line: one line.
    if let Some(msg) = unsupported(a) {
        bail!("{msg}");
    }
    let quiet = a.quiet > 0;
    let verbose = a.verbose > 0;
    let dry_run = a.dry_run > 0;
    if mke2fs && !quiet {
        // mke2fs's version line, once the options are read.
        eprintln!("mke2fs {MKE2FS_VERSION} ({MKE2FS_DATE})");
    }
    // -J device=PATH: mke2fs opens it now for its block size, unless -b
    // gave one (then only when it adds the journal).
    let jdev_early = g.block_sizes.last().is_none_or(|&b| b <= 0);
    let mut jdev = match &g.journal_device {
        Some(p) if jdev_early => Some(crate::jdev::find_path(Path::new(p))?),
        _ => None,
    };
    let (profile, _source) = match early_profile {
        Some(p) => p,
        None => Profile::load().context("reading mke2fs.conf")?,
    };
    let dev_name = device.display().to_string();
    // An NBD URI names an existing export (its size comes from the server).
    let uri = ext4kit_device::is_device_uri(device);
    let exists = uri || device.exists();
    if !exists && a.fs_size.is_none() {
        let msg = format!(
            "The file {} does not exist and no size was specified.",
            device.display()
        );
        if mke2fs {
            // mke2fs's line, as it prints it (no program name).
            eprintln!("{msg}");
            return Ok(1);
        }
        bail!(
            "the file {} does not exist and no size was specified",
            device.display()
        );
    }
    // One read-only probe of an existing target: size, sector size, and
    // whether a discard leaves zeros (regular files: yes, holes).
    // An NBD export is connected once, here, and that connection serves
    // the undo check, the undo file's view and the run (one handshake,
    // one known-zero cache): read-write unless -n.
    let nbd: Option<Arc<dyn Device>> = if uri {
        let opts = if dry_run {
            OpenOptions::read_only()
        } else {
            OpenOptions::read_write()
        };
        Some(Arc::from(open_device(device, opts)?))
    } else {
        None
    };
    let (device_size, sector, phys_sector, io_hints, dev_discard_zeroes) = if exists {
        let dev: Box<dyn Device> = match &nbd {
            Some(d) => Box::new(Arc::clone(d)),
            None => open_device(device, OpenOptions::read_only())?,
        };
        (
            Some(dev.size()),
            dev.logical_block_size(),
            dev.physical_block_size(),
            dev.io_hints(),
            dev.discard_zeroes_data(),
        )
    } else {
        (None, 512, 512, None, true)
    };
    let mut extended = match &a.extended_in_order {
        Some(v) => v.clone(),
        None => a
            .extended
            .iter()
            .chain(&a.extended_deprecated)
            .cloned()
            .collect(),
    };
    if a.keep > 0 {
        // -K is applied before the -E options are parsed, as in mke2fs
        // (so a `discard` in them still wins): in front of each of them,
        // whether the -E options are merged or the last one counts.
        for e in &mut extended {
            *e = format!("nodiscard,{e}");
        }
        if extended.is_empty() {
            extended.push("nodiscard".into());
        }
    }
    // Installed as mke2fs: a -U that is no UUID is refused as mke2fs
    // does, once the options and the layout are settled (after their
    // warnings and errors), with the device as com_err's program name;
    // mke2fs has written by then, ext4kit has not. (`ext4kit mkfs`
    // refuses it with its other option errors.)
    let bad_uuid = a.uuid.as_deref().filter(|u| {
        mke2fs
            && !["null", "clear", "time", "random"]
                .iter()
                .any(|w| u.eq_ignore_ascii_case(w))
            && mkfs::options::parse_uuid(u).is_none()
    });
    let usage_types = a.usage_types.first().cloned().or_else(|| {
        profile
            .get_value(&["devices", &dev_name, "usage_types"])
            .map(str::to_string)
    });
    let opts = MkfsOptions {
        fs_type: Some(ext_type(a, who, &profile, &dev_name, add_journal)),
        usage_types,
        block_size: g.block_sizes.last().copied(),
        earlier_block_sizes: g.block_sizes[..g.block_sizes.len().saturating_sub(1)].to_vec(),
        num_inodes: g.num_inodes,
        inode_ratio: g.inode_ratio,
        inode_size: g.inode_size,
        reserved_ratio: g.reserved_ratio,
        label: a.label.last().cloned(),
        uuid: if bad_uuid.is_some() {
            None
        } else {
            a.uuid.clone()
        },
        features: a.features.clone(),
        extended,
        journal: a.journal.clone(),
        // A -j after the last -J size= (mkfs.ext3 sets mke2fs's
        // journal_size = -1 before the options are read).
        add_journal,
        flex_bg_size: g.flex_bg_size,
        blocks_per_group: g.blocks_per_group,
        mount_dir: a.mount_dir.clone(),
        creator_os: a.creator_os.clone(),
        errors: g.errors.clone(),
        fs_size: a.fs_size.clone(),
        force: a.force > 0,
        revision: g.revision.clone(),
        sparse_super: a.opt_s.clone(),
        first_meta_bg_env: std::env::var("MKE2FS_FIRST_META_BG").ok(),
        super_only: a.opt_cap_s > 0,
        cluster_size: g.cluster_size,
        external_journal: None,
        device_name: Some(dev_name.clone()),
        partition_start_sectors: partition_start(device),
        // mke2fs -n stops before it reads the list.
        bad_blocks: match &a.opt_l {
            Some(f) if a.dry_run == 0 => Some(read_bad_blocks_file(f)?),
            _ => None,
        },
    };
    // -J device= with -b: read the journal device now, still before
    // anything is written.
    if let (Some(p), None) = (&g.journal_device, &jdev) {
        jdev = Some(crate::jdev::find_path(Path::new(p))?);
    }
    let opts = MkfsOptions {
        external_journal: jdev.as_ref().map(|j| j.external.clone()),
        ..opts
    };
    let is_file = !exists
        || std::fs::metadata(device)
            .map(|m| m.is_file())
            .unwrap_or(false);
    // As mke2fs: no sector size for regular files, and the test-suite
    // overrides MKE2FS_DEVICE_SECTSIZE / MKE2FS_DEVICE_PHYS_SECTSIZE.
    let (sector, phys_sector) = mkfs::options::sector_sizes(
        if is_file { 0 } else { sector },
        if is_file { 0 } else { phys_sector },
        |v| std::env::var(v).ok(),
    );
    let env = Env {
        device_size,
        is_regular_file: is_file,
        logical_sector_size: sector,
        physical_sector_size: phys_sector,
        io_hints: if is_file { None } else { io_hints },
        now: now_from_env()?,
        page_size: page_size(),
        uid: 0,
        gid: 0,
        kernel_lazy_itable_init: true,
    };
    let mut resolved = mkfs::resolve(&opts, &profile, &env)?;
    if let Some(j) = &jdev
        && g.block_sizes.last().is_none_or(|&b| b <= 0)
        && !a.json
    {
        outln!(
            "Using journal device's blocksize: {}",
            j.external.block_size
        );
    }
    // mke2fs discards only a target with a size: not a file it has just
    // created (or found empty), and never with -n. Its inode tables are
    // then left for lazy init, not claimed zeroed.
    let has_size = device_size.is_some_and(|s| s > 0);
    if !has_size || dry_run {
        resolved.discard = false;
    }
    // -z / the automatic undo file; mke2fs does not discard then.
    let undo = crate::undo::choose(
        a.opt_z.as_deref(),
        device,
        nbd.as_deref(),
        &resolved,
        &profile,
    )?;
    if undo.is_some() {
        resolved.discard = false;
    }
    // Everything above is validated; from here on mke2fs's output.
    if !exists && !dry_run && !a.json {
        outln!("Creating regular file {dev_name}");
    }
    let too_big = resolved
        .warnings
        .iter()
        .find(|w| w.contains("-byte blocks too big for system"))
        .cloned();
    let (to_stdout, to_stderr): (Vec<&String>, Vec<&String>) = resolved
        .warnings
        .iter()
        .filter(|w| Some(*w) != too_big.as_ref())
        .filter(|w| Some(*w) != early_label_warning.as_ref())
        .filter(|w| !(quiet && w.as_str() == mkfs::options::BIGALLOC_EXPERIMENTAL))
        .partition(|w| w.starts_with("128-byte inodes") || w.starts_with("Your mke2fs.conf"));
    for w in to_stderr {
        print_warning(w, a.json);
    }
    if verbose && !a.json {
        let list: Vec<String> = resolved.fs_types.iter().map(|t| format!("'{t}'")).collect();
        outln!("fs_types for mke2fs.conf resolution: {}", list.join(", "));
    }
    // Blocks larger than a page: mke2fs asks (whatever stdin is) unless
    // -F, and says it went on.
    if let Some(w) = too_big {
        if a.force == 0 {
            eprintln!("{}: {w}", who.program());
            if !proceed_question(0) {
                return Ok(1);
            }
        }
        eprintln!("Warning: {w}, forced to continue");
    }
    for w in to_stdout {
        print_warning(w, a.json);
    }
    // Overwrite protection, as mke2fs's check_plausibility(): only when
    // stdin and stdout are terminals; the question only without -F.
    // As mke2fs: no look at what the target holds with -E offset=.
    if exists && !uri && has_size && resolved.offset == 0 && interactive() {
        let found =
            crate::probe::probe_path(device).with_context(|| format!("reading {dev_name}"))?;
        if let Some(f) = found {
            let (out, err) = f.report(&dev_name);
            for l in err {
                eprintln!("{l}");
            }
            for l in out {
                outln!("{l}");
            }
            if a.force == 0 {
                let delay = profile
                    .get_value(&["options", "proceed_delay"])
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .unwrap_or(0);
                if !proceed_question(delay) {
                    return Ok(1);
                }
            }
        }
    }
    if let Some(u) = &undo
        && !a.json
    {
        crate::undo::announce(u, &dev_name);
    }
    // Would a discard of this target leave zeros? Regular files: yes
    // (holes). Block devices: only if the kernel says so.
    let discard_zeroes = has_size && (is_file || dev_discard_zeroes);
    // As mke2fs's "DEVICE: ... while setting up superblock": the plan's
    // refusals name the target.
    let mut prepared = mkfs::prepare(resolved, discard_zeroes).with_context(|| dev_name.clone())?;
    let show = !quiet && !a.json;
    if show {
        csum_advice(&prepared.layout);
    }
    {
        use ext4kit_format::features::Compat;
        let asked = prepared.resolved.params.features.compat;
        let got = prepared.layout.features.compat;
        if asked.contains(Compat::HAS_JOURNAL) && !got.contains(Compat::HAS_JOURNAL) {
            // mke2fs's figure_journal_size(), with or without -q.
            eprintln!("\nFilesystem too small for a journal");
        }
    }
    // mke2fs prints its verbose lines under -v whatever -q says.
    if verbose && !a.json && prepared.resolved.assume_prezeroed {
        outln!("Assuming the storage device is prezeroed - skipping inode table and journal wipe");
    }
    if let Some(u) = bad_uuid {
        // Where mke2fs parses it: after the layout and its messages (and
        // its discard: nothing is written here). Its message ends in an
        // extra newline: one line here.
        eprintln!("{dev_name}: could not parse UUID: {u}");
        return Ok(1);
    }
    // -d: the layout must suit it and the source is read whole before
    // the target is touched (a bad source writes nothing).
    let source_tree = match &a.opt_d {
        Some(d) if !dry_run => {
            mkfs::populate::check_layout(&prepared.layout)?;
            // A directory, else a tar archive (plain, gzip, zstd or xz;
            // - is stdin).
            let p = Path::new(d);
            let tree = if d != "-" && p.is_dir() {
                mkfs::populate::source::scan(p)
            } else {
                mkfs::populate::archive::scan_archive(p)
            }
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            mkfs::populate::check(&prepared.layout, &tree)?;
            Some(tree)
        }
        _ => None,
    };
    if dry_run {
        // As mke2fs -n (also with -q): the summary, nothing written.
        if a.json {
            outln!(
                "{}",
                json_report(device, &prepared, None, None, undo.as_ref(), start)
            );
        } else {
            print_summary(a, &prepared);
        }
        return Ok(0);
    }
    if prepared.layout.super_only && !super_only_confirmed(a, &prepared, device, &profile)? {
        return Ok(1);
    }
    // The journal device, exclusively, before the target is touched.
    let journal = match &jdev {
        Some(j) if !mkfs::journal_dev::is_journal_dev(&prepared.layout) => {
            Some((j, crate::jdev::open_rw(j)?))
        }
        _ => None,
    };
    // The undo file, before the target changes (also its length).
    let undo_file = match &undo {
        Some(u) => Some(crate::undo::open(
            u,
            device,
            nbd.clone(),
            device_size,
            &prepared,
        )?),
        None => None,
    };
    let l = &prepared.layout;
    let offset = prepared.resolved.offset;
    let needed = offset + l.blocks_count * u64::from(l.block_size);
    let dev: Box<dyn Device> = if exists && is_file && device_size.is_some_and(|s| s < needed) {
        // A regular file grows to the filesystem size, as with mke2fs.
        ext4kit_device::check_not_mounted(device)?;
        let f = FileDevice::open(device, OpenOptions::read_write())?;
        f.set_len(needed)
            .with_context(|| format!("extending {dev_name}"))?;
        Box::new(f)
    } else if let Some(d) = &nbd {
        Box::new(Arc::clone(d))
    } else if exists {
        open_device(device, OpenOptions::read_write())?
    } else {
        Box::new(create_image(device, needed)?)
    };
    // -D: writes with O_DIRECT, where the target allows it.
    let dev = if a.opt_cap_d > 0 {
        crate::direct::DirectDevice::wrap(dev, device).0
    } else {
        dev
    };
    // -E offset=: everything from here on is relative to the offset; the
    // bytes before it are never touched.
    let dev: Box<dyn Device> = if offset > 0 {
        Box::new(mkfs::OffsetDevice::new(dev, offset))
    } else {
        dev
    };
    let (dev, undo_dev) = crate::undo::wrap(dev, undo_file);
    let mut discarded = false;
    if prepared.resolved.discard {
        discarded = mkfs::discard(dev.as_ref(), &mut prepared)?;
        if discarded && show {
            progress_step(
                "Discarding device blocks: ",
                prepared.layout.blocks_count,
                "done                            \n",
            );
        }
        // Not under show: mke2fs prints this with -v even when -q.
        if discarded && verbose && !a.json && discard_zeroes {
            outln!("Discard succeeded and will return 0s - skipping inode table wipe");
        }
    }
    if prepared.layout.mmp_block.is_some() {
        prepared.settings.mmp_host = mmp_host(device);
    }
    if show {
        print_summary(a, &prepared);
    }
    if mkfs::journal_dev::is_journal_dev(&prepared.layout) {
        let r = write_journal_device(
            a,
            dev.as_ref(),
            &prepared,
            discarded,
            device,
            undo.as_ref(),
            start,
        )?;
        crate::undo::finish(&undo_dev)?;
        return Ok(r);
    }
    if a.opt_c > 0 {
        // test_disk runs after the discard and the summary; its bad
        // blocks join -l's, and the plan is made again around them.
        let mut list = prepared
            .resolved
            .params
            .bad_blocks
            .clone()
            .unwrap_or_default();
        list.extend(test_disk(
            device,
            &prepared.layout,
            a.opt_c,
            quiet,
            verbose,
        )?);
        let mut r = prepared.resolved.clone();
        r.params.bad_blocks = Some(list);
        let host = prepared.settings.mmp_host.clone();
        let zeroed = prepared.settings.itable_zeroed;
        prepared = mkfs::prepare(r, zeroed)?;
        prepared.settings.mmp_host = host;
    }
    if let Some(bb) = &prepared.layout.bad_blocks {
        for b in &bb.ignored {
            eprintln!("Bad block {} out of range; ignored.", *b as u32);
        }
        for b in &bb.bad_backups {
            eprintln!(
                "Warning: the backup superblock/group descriptors at block {b} contain\n\tbad blocks.\n"
            );
        }
    }
    crate::undo::adjust_kbytes(&undo_dev, &mut prepared);
    let l = &prepared.layout;
    let groups = u64::from(l.group_count);
    let super_only = l.super_only;
    if show {
        // packed_allocate_tables (flex_bg with packed_meta_blocks) shows
        // no progress; ext2fs_allocate_tables does.
        let packed = prepared.resolved.params.packed_meta_blocks
            && l.features
                .incompat
                .contains(ext4kit_format::features::Incompat::FLEX_BG);
        if !packed {
            progress_step("Allocating group tables: ", groups, "");
        } else {
            crate::out::write_fmt(format_args!("Allocating group tables: "));
        }
        crate::out::write_fmt(format_args!("done                            \n"));
        if !super_only {
            crate::out::write_fmt(format_args!("Writing inode tables: "));
        }
    }
    let mut report = match &source_tree {
        Some(tree) => {
            let bar = (show && std::io::stderr().is_terminal()).then(|| populate_bar(tree));
            let opts = mkfs::populate::PopulateOptions {
                clamp: source_date_epoch()?,
                progress: bar.clone().map(|b| {
                    let f: std::sync::Arc<dyn Fn(u64, u64) + Send + Sync> =
                        std::sync::Arc::new(move |files, bytes| {
                            b.set_position(bytes);
                            if files % 64 == 0 {
                                b.set_message(format!("{files} files"));
                            }
                        });
                    f
                }),
            };
            let res = mkfs::write_populated(dev.as_ref(), prepared.clone(), tree, &opts);
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let (r, p) = res.map_err(|e| anyhow::anyhow!("{e}"))?;
            prepared = p;
            r
        }
        None => mkfs::write(dev.as_ref(), prepared.clone())?,
    };
    report.discarded = discarded;
    let l = &prepared.layout;
    if let Some((_, (jdevh, jd))) = &journal {
        // ext2fs_add_journal_device: the filesystem joins the journal's
        // users.
        mkfs::journal_dev::add_user(
            jdevh.as_ref(),
            jd,
            prepared.settings.uuid,
            prepared.settings.now,
        )?;
    }
    crate::undo::finish(&undo_dev)?;
    let has_journal = l
        .features
        .compat
        .contains(ext4kit_format::features::Compat::HAS_JOURNAL);
    if super_only && has_journal && !a.json && journal.is_none() {
        // mke2fs says it with -q too.
        outln!("Skipping journal creation in super-only mode");
    }
    if show {
        if !super_only {
            progress_step("", groups, "done                            \n");
        }
        if let Some((j, _)) = &journal {
            outln!("Adding journal to device {}: done", j.path.display());
        } else if has_journal && !super_only {
            outln!("Creating journal ({} blocks): done", l.journal_blocks);
        }
        if l.mmp_block.is_some() {
            let interval =
                ext4kit::mkfs::mmp::effective_interval(prepared.settings.mmp_update_interval)
                    .unwrap_or(prepared.settings.mmp_update_interval);
            outln!("Multiple mount protection is enabled with update interval {interval} seconds.");
        }
    }
    if let Some(h) = &l.hugefiles {
        // mk_hugefiles' lines; its errors are reported and mke2fs goes on.
        if let Some(e) = &h.error {
            for line in e.lines() {
                eprintln!("{}: {line}", who.program());
            }
        }
        if show && let Some(p) = &h.progress {
            if verbose && h.zero {
                outln!("Huge files will be zero'ed");
            }
            if h.error.is_some() {
                // Stopped part way: no "done", the next line follows on.
                crate::out::write_fmt(format_args!("{p}"));
            } else {
                outln!("{p}done");
            }
        }
    }
    if show {
        crate::out::write_fmt(format_args!(
            "Writing superblocks and filesystem accounting information: "
        ));
        progress_step("", groups, "done\n\n");
        check_message(&prepared.settings);
    }
    if a.json {
        let mut v = json_report(
            device,
            &prepared,
            Some(&report),
            Some(dev.allocated_bytes()),
            undo.as_ref(),
            start,
        );
        if let (Some((j, _)), Some(obj)) = (&journal, v.as_object_mut()) {
            obj.insert("journal_device".into(), j.path.display().to_string().into());
        }
        outln!("{v}");
    }
    Ok(0)
}

/// `-O journal_dev`: mke2fs's create_journal_dev, with its output (the
/// zeroing progress unless lazy_journal_init, then an empty line, also
/// with -q).
fn write_journal_device(
    a: &MkfsArgs,
    dev: &dyn Device,
    prepared: &mkfs::Prepared,
    discarded: bool,
    device: &Path,
    undo: Option<&crate::undo::Choice>,
    start: Instant,
) -> Result<i32> {
    let l = &prepared.layout;
    if a.quiet == 0 && !a.json && !prepared.settings.lazy_journal_init {
        // The first update comes after the first 1024 blocks.
        progress_from(
            "Zeroing journal device: ",
            l.blocks_count.min(1024),
            l.blocks_count,
            "",
        );
    }
    let mut report = mkfs::write(dev, prepared.clone())?;
    report.discarded = discarded;
    if a.json {
        let v = json_report(
            device,
            prepared,
            Some(&report),
            Some(dev.allocated_bytes()),
            undo,
            start,
        );
        outln!("{v}");
    } else {
        outln!();
    }
    Ok(0)
}

/// `-S`, before anything is written (mke2fs asks only after its discard):
/// what the target holds, mke2fs's warning, and unless -F its question.
/// Returns whether to go on.
fn super_only_confirmed(
    a: &MkfsArgs,
    p: &mkfs::Prepared,
    device: &Path,
    profile: &Profile,
) -> Result<bool> {
    let dev_name = device.display().to_string();
    if device.exists() && !ext4kit_device::is_device_uri(device) && p.resolved.offset == 0 {
        let found =
            crate::probe::probe_path(device).with_context(|| format!("reading {dev_name}"))?;
        if let Some(f) = found {
            let (out, err) = f.report(&dev_name);
            for l in err {
                eprintln!("{l}");
            }
            for l in out {
                outln!("{l}");
            }
        }
    }
    if p.resolved.discard {
        eprintln!(
            "Warning: -E discard: the device is discarded before the superblock rewrite (its data is then lost)"
        );
    }
    if !a.json {
        outln!("{dev_name} may be further corrupted by superblock rewrite");
    }
    if a.force > 0 {
        return Ok(true);
    }
    let delay = profile
        .get_value(&["options", "proceed_delay"])
        .and_then(|v| v.trim().parse::<i64>().ok())
        .unwrap_or(0);
    Ok(proceed_question(delay))
}

/// The MMP block's host part: the host name (`gethostname`, read from
/// /proc in the binary without unsafe code), the device as given, and the
/// wall-clock time (mke2fs ignores E2FSPROGS_FAKE_TIME there too).
fn mmp_host(device: &Path) -> mkfs::mmp::MmpHost {
    let nodename = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim_end_matches('\n').as_bytes().to_vec())
        .unwrap_or_default();
    let time = ext4kit_device::host::realtime_coarse_secs();
    use std::os::unix::ffi::OsStrExt;
    mkfs::mmp::MmpHost {
        nodename,
        bdevname: device.as_os_str().as_bytes().to_vec(),
        time,
    }
}

/// Are stdin and stdout both terminals? (mke2fs's `isatty(0) && isatty(1)`
/// before it looks for an existing filesystem.)
/// `-l FILE`: mke2fs's read_bb_file.
fn read_bad_blocks_file(f: &str) -> Result<Vec<u64>> {
    let bytes = std::fs::read(f)
        .map_err(|e| anyhow::anyhow!("read_bad_blocks_file: {e} while trying to open {f}"))?;
    mkfs::badblocks::parse_list(&String::from_utf8_lossy(&bytes)).map_err(|e| anyhow::anyhow!(e))
}

/// `-c`: mke2fs's test_disk: `badblocks -b BS -X [-s] [-w] DEVICE LAST`,
/// its output read as a bad blocks list.
fn test_disk(
    device: &Path,
    l: &mkfs::Layout,
    passes: u8,
    quiet: bool,
    verbose: bool,
) -> Result<Vec<u64>> {
    let mut args: Vec<String> = vec!["-b".into(), l.block_size.to_string(), "-X".into()];
    if !quiet {
        args.push("-s".into());
    }
    if passes > 1 {
        args.push("-w".into());
    }
    args.push(device.display().to_string());
    args.push((l.blocks_count - 1).to_string());
    if verbose {
        outln!("Running command: badblocks {}", args.join(" "));
    }
    let out = std::process::Command::new("badblocks")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("popen: {e} while trying to run 'badblocks'"))?;
    mkfs::badblocks::parse_list(&String::from_utf8_lossy(&out.stdout))
        .map_err(|e| anyhow::anyhow!(e.replace("from file", "from program")))
}

/// The first sector of the partition `device` is (`/sys/dev/block/M:m/start`,
/// as mk_hugefiles reads it for `hugefiles_align_disk`); 0 for anything
/// that is not a partition.
fn partition_start(device: &Path) -> u64 {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(m) = std::fs::metadata(device) else {
        return 0;
    };
    if !m.file_type().is_block_device() {
        return 0;
    }
    let dev = m.rdev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/start"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// `-d`'s progress bar on stderr (a terminal only, not with -q or
/// --json): source bytes copied of the tree's total, files, ETA.
fn populate_bar(tree: &mkfs::populate::source::Tree) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let (files, bytes) = tree.totals();
    let b = ProgressBar::with_draw_target(Some(bytes), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(&format!(
        "Copying files: [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}}  {{msg}} of {files}  ETA {{eta}}"
    ))
    .map(|s| s.progress_chars("=> "))
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    b.set_style(style);
    b.set_message("0 files");
    b
}

/// The `--json` report: the plan, and what the run did (`report` is `None`
/// for `-n`, which writes nothing: `"dry_run": true`). `undo_file` is the
/// undo file (`-z`, or mke2fs's automatic one) the run writes, or with
/// `-n` would write; `null` for none.
fn json_report(
    device: &Path,
    p: &mkfs::Prepared,
    report: Option<&mkfs::Report>,
    allocated_bytes: Option<Option<u64>>,
    undo: Option<&crate::undo::Choice>,
    start: Instant,
) -> serde_json::Value {
    let l = &p.layout;
    let mut v = serde_json::json!({
        "device": device,
        "dry_run": report.is_none(),
        "block_size": l.block_size,
        "blocks": l.blocks_count,
        "groups": l.group_count,
        "inodes": l.inodes_count,
        "inodes_per_group": l.inodes_per_group,
        "inode_size": l.inode_size,
        "journal_blocks": l.journal_blocks,
        "features": l.features.names(),
        "fs_types": p.resolved.fs_types,
        "uuid": uuid::Uuid::from_bytes(p.settings.uuid).to_string(),
        "itable_zeroed": p.settings.itable_zeroed,
        "warnings": p.resolved.warnings,
        "undo_file": undo.map(|u| &u.path),
    });
    if let (Some(r), Some(obj)) = (report, v.as_object_mut()) {
        obj.insert("itable_zeroed".into(), r.itable_zeroed.into());
        obj.insert("discarded".into(), r.discarded.into());
        if let Some(pop) = &l.populated {
            obj.insert(
                "populated".into(),
                serde_json::json!({
                    "inodes": pop.files,
                    "data_bytes": pop.data_bytes,
                    "bytes_written": pop.bytes_written,
                }),
            );
        }
        obj.insert(
            "stats".into(),
            serde_json::to_value(&r.stats).unwrap_or_default(),
        );
        obj.insert("allocated_bytes".into(), allocated_bytes.flatten().into());
        obj.insert("seconds".into(), start.elapsed().as_secs_f64().into());
    }
    v
}

/// mke2fs's notes on metadata_csum without extents or 64bit.
fn csum_advice(l: &mkfs::Layout) {
    use ext4kit_format::features::{Incompat, RoCompat};
    if !l.features.ro_compat.contains(RoCompat::METADATA_CSUM)
        || l.features.incompat.contains(Incompat::JOURNAL_DEV)
    {
        return;
    }
    if !l.features.incompat.contains(Incompat::EXTENTS) {
        outln!(
            "Extents are not enabled.  The file extent tree can be checksummed, whereas block maps cannot.  Not enabling extents reduces the coverage of metadata checksumming.  Pass -O extents to rectify."
        );
    }
    if !l.features.incompat.contains(Incompat::BIT64) {
        outln!(
            "64-bit filesystem support is not enabled.  The larger fields afforded by this feature enable full-strength checksumming.  Pass -O 64bit to rectify."
        );
    }
}

/// mke2fs's `print_check_message()` after a format with periodic checks.
fn check_message(s: &mkfs::SuperSettings) {
    if std::env::var_os("MKE2FS_SKIP_CHECK_MSG").is_some() {
        return;
    }
    let mnt = (s.max_mnt_count as i16).max(0);
    if mnt == 0 && s.checkinterval == 0 {
        return;
    }
    outln!(
        "This filesystem will be automatically checked every {mnt} mounts or\n{} days, whichever comes first.  Use tune2fs -c or -i to override.",
        f64::from(s.checkinterval) / 86400.0
    );
}

fn create_image(path: &Path, size: u64) -> Result<FileDevice> {
    // The device error names the path.
    FileDevice::create_sparse(path, size).context("creating the image file")
}

/// mke2fs's `show_stats()`.
fn print_summary(a: &MkfsArgs, p: &mkfs::Prepared) {
    let l = &p.layout;
    let s = &p.settings;
    if a.verbose > 0 {
        print_verbose_stats(p);
    } else {
        outln!(
            "Creating filesystem with {} {}k blocks and {} inodes",
            l.blocks_count,
            l.block_size / 1024,
            l.inodes_count
        );
    }
    if l.group_count == 1 {
        outln!();
    } else {
        if s.uuid != [0; 16] {
            outln!("Filesystem UUID: {}", uuid::Uuid::from_bytes(s.uuid));
        }
        let mut text = String::from("Superblock backups stored on blocks: ");
        let mut col_left: i64 = 0;
        for (i, g) in l.backup_groups().enumerate() {
            let block = l.group_first_block(g);
            if i > 0 {
                text.push_str(", ");
            }
            let need = block.to_string().len() as i64 + 2;
            if need > col_left {
                text.push_str("\n\t");
                col_left = 72;
            }
            col_left -= need;
            text.push_str(&block.to_string());
        }
        outln!("{text}\n");
    }
}

/// The first part of `show_stats()` with -v.
fn print_verbose_stats(p: &mkfs::Prepared) {
    use ext4kit_format::features::RoCompat;
    let l = &p.layout;
    let s = &p.settings;
    let asked = p.resolved.params.blocks_count;
    if asked > l.blocks_count {
        eprintln!("warning: {} blocks unused.\n", asked - l.blocks_count);
    }
    let label_end = s.label.iter().position(|&b| b == 0).unwrap_or(16);
    outln!(
        "Filesystem label={}",
        String::from_utf8_lossy(&s.label[..label_end])
    );
    let os = match s.creator_os {
        0 => "Linux",
        1 => "Hurd",
        2 => "Masix",
        3 => "FreeBSD",
        4 => "Lites",
        _ => "(unknown os)",
    };
    outln!("OS type: {os}");
    let log = (l.block_size / 1024).trailing_zeros();
    outln!("Block size={} (log={log})", l.block_size);
    if l.features.ro_compat.contains(RoCompat::BIGALLOC) {
        outln!(
            "Cluster size={} (log={})",
            l.block_size << l.cluster_bits,
            log + l.cluster_bits
        );
    } else {
        outln!("Fragment size={} (log={log})", l.block_size);
    }
    outln!(
        "Stride={} blocks, Stripe width={} blocks",
        s.raid_stride,
        s.raid_stripe_width
    );
    outln!("{} inodes, {} blocks", l.inodes_count, l.blocks_count);
    outln!(
        "{} blocks ({:.2}%) reserved for the super user",
        l.r_blocks_count,
        100.0 * l.r_blocks_count as f64 / l.blocks_count as f64
    );
    outln!("First data block={}", l.first_data_block);
    if s.root_uid != 0 || s.root_gid != 0 {
        outln!("Root directory owner={}:{}", s.root_uid, s.root_gid);
    }
    if l.reserved_gdt_blocks > 0 {
        let per_block = u64::from(l.block_size / u32::from(l.desc_size.max(32)));
        outln!(
            "Maximum filesystem blocks={}",
            (u64::from(l.reserved_gdt_blocks) + u64::from(l.desc_blocks))
                * per_block
                * u64::from(l.blocks_per_group)
        );
    }
    if l.group_count > 1 {
        outln!("{} block groups", l.group_count);
    } else {
        outln!("{} block group", l.group_count);
    }
    if l.features.ro_compat.contains(RoCompat::BIGALLOC) {
        outln!(
            "{} blocks per group, {} clusters per group",
            l.blocks_per_group,
            l.clusters_per_group()
        );
    } else {
        outln!(
            "{} blocks per group, {} fragments per group",
            l.blocks_per_group,
            l.blocks_per_group
        );
    }
    outln!("{} inodes per group", l.inodes_per_group);
}
