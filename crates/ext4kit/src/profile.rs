//! `mke2fs.conf` handling, reproducing mke2fs 1.47.0.
//!
//! This module covers three things:
//!
//! * the profile file format of e2fsprogs' `lib/support/profile.c`
//!   ([`Profile::parse`], [`Profile::load`], [`Profile::builtin`]);
//! * mke2fs's `parse_fs_type()` resolution of the `fs_types` list
//!   ([`Profile::fs_types`], [`Profile::fs_types_with`]);
//! * mke2fs's `get_*_from_profile()` helpers and the way `PRS()` turns the
//!   profile into feature / extended-option edit strings
//!   ([`Profile::get_string`], [`Profile::get_int`], ...,
//!   [`Profile::feature_edit_list`], [`Profile::options_list`]).
//!
//! # Format (as `profile.c` parses it)
//!
//! * Every line before the first line whose *first byte* is `[` is ignored.
//! * Blank lines and lines whose first non-blank byte is `#` or `;` are
//!   comments. `#`/`;` also end an unquoted tag or value.
//! * `[name]` opens (or re-opens, merging into) a top-level section. It is an
//!   error inside `{ ... }`. A `*` right after `]` marks it final.
//! * `tag = value` adds a relation. An unquoted value is one word; anything
//!   but blanks or a comment after it is an error. A quoted value
//!   (`"..."`, escapes `\n`, `\t`, `\b`, `\<any>` = that char) ends at the
//!   closing quote and the rest of the line is ignored.
//! * `tag = {` (or `tag =` followed by a line starting with `{`) opens a
//!   subsection, closed by a line starting with `}`. Subsections with the
//!   same name are *not* merged: lookups only ever see the first one.
//! * A `*` anywhere in a tag truncates it there (the "final" marker). Final
//!   markers only matter when several files are loaded (directory config).
//! * Relations with the same name keep their file order.
//!
//! # Lookups (as mke2fs does them)
//!
//! * [`Profile::get_string`]: the **last** fs_type in the list that has the
//!   relation wins, then `[defaults]`.
//! * [`Profile::get_int`] / [`get_uint`](Profile::get_uint) /
//!   [`get_double`](Profile::get_double) / [`get_bool`](Profile::get_bool):
//!   start from `[defaults]` (or the caller's default), then every fs_type in
//!   list order overrides it, so the last one that has a *valid* value wins.
//!   Unparsable values are silently ignored (mke2fs ignores the error codes).
//! * Inside one section only the first relation of a given name is used.
//!
//! # Order of use in mke2fs 1.47.0 `PRS()`
//!
//! 1. Load the profile ([`Profile::load`]).
//! 2. Block size so far: `-b N` with `N > 0` (or an external journal's
//!    block size) sets it; otherwise (no `-b`, or a negative "minimum" `-b`)
//!    `EXT2_BLOCK_SIZE` is still 1024.
//! 3. `fs_blocks_count` = the explicit size in those units, else the device
//!    size in those units rounded down to whole pages.
//! 4. `-t`/`-T` default to `[devices] <dev> fs_type`/`usage_types`;
//!    `creator_os` to `defaults.creator_os`.
//! 5. [`Profile::fs_types_with`] with that count and block size (so the size
//!    class is decided on the 1 KiB-unit count when `-b` is absent).
//! 6. Features: [`Profile::feature_edits`], then `-O`.
//! 7. Only if no positive `-b`: `blocksize = get_int(types, "blocksize",
//!    4096)`, `-1` meaning the page size, raised to the logical sector size
//!    and to `|-b|`; then `fs_blocks_count /= blocksize / 1024`. The fs_types
//!    list is not recomputed.
//! 8. Later lookups (`reserved_ratio`, `cluster_size`, `inode_ratio`,
//!    `num_backup_sb`, `options`, `inode_size`, `flex_bg_size`, ...) use that
//!    same list (replaced by `["journal"]` for `-O journal_dev`).

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Path mke2fs reads when `MKE2FS_CONFIG` is not set
/// (`ROOT_SYSCONFDIR "/mke2fs.conf"`).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/mke2fs.conf";

/// Environment variable naming an alternative config file (or directory).
pub const CONFIG_ENV: &str = "MKE2FS_CONFIG";

/// Name profile.c gives to the compiled-in default profile.
pub const BUILTIN_SOURCE_NAME: &str = "<default>";

/// Base features used when neither `[defaults]` nor any fs_type defines
/// `base_features` (the literal default in mke2fs's `PRS()`).
pub const FALLBACK_BASE_FEATURES: &str = "sparse_super,large_file,filetype,resize_inode,dir_index";

/// Mount options used when no `default_mntopts` is configured.
pub const FALLBACK_DEFAULT_MNTOPTS: &str = "acl,user_xattr";

/// `fgets()` buffer in `profile_update_file()` is 2048 bytes, so a physical
/// line of a config *file* is processed in chunks of at most 2047 bytes.
const FGETS_CHUNK: usize = 2047;

/// The compiled-in default profile: byte-for-byte upstream e2fsprogs 1.47.0
/// `misc/mke2fs.conf.in` (what `profile-to-c.awk` turns into
/// `mke2fs_default_profile`).
pub const BUILTIN_MKE2FS_CONF: &str = concat!(
    "[defaults]\n",
    "\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr\n",
    "\tdefault_mntopts = acl,user_xattr\n",
    "\tenable_periodic_fsck = 0\n",
    "\tblocksize = 4096\n",
    "\tinode_size = 256\n",
    "\tinode_ratio = 16384\n",
    "\n",
    "[fs_types]\n",
    "\text3 = {\n",
    "\t\tfeatures = has_journal\n",
    "\t}\n",
    "\text4 = {\n",
    "\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,metadata_csum_seed,64bit,dir_nlink,extra_isize,orphan_file\n",
    "\t}\n",
    "\tsmall = {\n",
    "\t\tblocksize = 1024\n",
    "\t\tinode_ratio = 4096\n",
    "\t}\n",
    "\tfloppy = {\n",
    "\t\tblocksize = 1024\n",
    "\t\tinode_ratio = 8192\n",
    "\t}\n",
    "\tbig = {\n",
    "\t\tinode_ratio = 32768\n",
    "\t}\n",
    "\thuge = {\n",
    "\t\tinode_ratio = 65536\n",
    "\t}\n",
    "\tnews = {\n",
    "\t\tinode_ratio = 4096\n",
    "\t}\n",
    "\tlargefile = {\n",
    "\t\tinode_ratio = 1048576\n",
    "\t\tblocksize = -1\n",
    "\t}\n",
    "\tlargefile4 = {\n",
    "\t\tinode_ratio = 4194304\n",
    "\t\tblocksize = -1\n",
    "\t}\n",
    "\thurd = {\n",
    "\t     blocksize = 4096\n",
    "\t     inode_size = 128\n",
    "\t     warn_y2038_dates = 0\n",
    "\t}\n",
);

/// Kind of a profile syntax error (the `PROF_*` codes of `prof_err.et`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SyntaxErrorKind {
    /// `[section]` inside a `{ ... }` block.
    #[error("Profile section header not at top level")]
    SectionNotTop,
    /// Malformed `[section]` line.
    #[error("Syntax error in profile section header")]
    SectionSyntax,
    /// Malformed `tag = value` line.
    #[error("Syntax error in profile relation")]
    RelationSyntax,
    /// `}` at top level.
    #[error("Extra closing brace in profile")]
    ExtraCloseBrace,
    /// `tag =` not followed by a line starting with `{`.
    #[error("Missing open brace in profile")]
    MissingOpenBrace,
}

/// Errors of this module. All of them are fatal in mke2fs.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// Syntax error; mke2fs prints this and exits 1.
    #[error("Syntax error in mke2fs config file ({file}, line #{line})\n\t{kind}")]
    Syntax {
        /// File name, or `<default>` for text parsed with [`Profile::parse`].
        file: String,
        /// 1-based line number, counted the way profile.c counts.
        line: usize,
        /// What went wrong.
        kind: SyntaxErrorKind,
    },
    /// I/O error other than "not found"/"permission denied" while opening the
    /// configuration (mke2fs: "Couldn't init profile successfully").
    #[error("Couldn't init profile successfully ({}: {source})", path.display())]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The ext type (from `-t`, `defaults.fs_type`, ...) has no subsection with
    /// at least one relation in `[fs_types]`, it is not `ext2`, and `force`
    /// was not given. mke2fs prints the message and "Aborting...", exit 1.
    #[error("{}", undefined_fs_type_message(fs_type))]
    UndefinedFsType {
        /// The undefined type.
        fs_type: String,
    },
}

fn undefined_fs_type_message(fs_type: &str) -> String {
    let mut msg = format!("Your mke2fs.conf file does not define the {fs_type} filesystem type.");
    if matches!(fs_type, "ext3" | "ext4" | "ext4dev") {
        msg.push_str("\nYou probably need to install an updated mke2fs.conf file.");
    }
    msg
}

/// Where [`Profile::load`] got its configuration from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProfileSource {
    /// A regular file.
    File(PathBuf),
    /// A directory: profile.c loads every regular file in it whose name is
    /// made only of ASCII alphanumerics, `-` and `_`, in byte order (listed in
    /// `files`), followed by the directory itself, which reads as empty.
    /// Earlier files take precedence.
    Directory {
        /// The directory.
        path: PathBuf,
        /// The files loaded from it, in lookup order.
        files: Vec<PathBuf>,
    },
    /// The compiled-in default ([`BUILTIN_MKE2FS_CONF`]).
    Builtin,
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    name: String,
    /// `Some` for relations, `None` for sections.
    value: Option<String>,
    is_final: bool,
    parent: usize,
    children: Vec<usize>,
}

/// One parsed file: an arena whose node 0 is the root.
#[derive(Debug, Clone, PartialEq)]
struct Tree {
    nodes: Vec<Node>,
}

impl Tree {
    fn new() -> Self {
        Tree {
            nodes: vec![Node {
                name: "(root)".to_owned(),
                value: None,
                is_final: false,
                parent: 0,
                children: Vec::new(),
            }],
        }
    }

    /// `profile_add_node()`: children are kept sorted by name (byte order),
    /// a new node goes after the existing ones with the same name.
    fn add(&mut self, parent: usize, name: String, value: Option<String>) -> usize {
        let idx = self.nodes.len();
        let pos = self.nodes[parent]
            .children
            .iter()
            .position(|&c| self.nodes[c].name.as_bytes() > name.as_bytes())
            .unwrap_or(self.nodes[parent].children.len());
        self.nodes.push(Node {
            name,
            value,
            is_final: false,
            parent,
            children: Vec::new(),
        });
        self.nodes[parent].children.insert(pos, idx);
        idx
    }

    /// First child section called `name`.
    fn section(&self, parent: usize, name: &str) -> Option<usize> {
        self.nodes[parent]
            .children
            .iter()
            .copied()
            .find(|&c| self.nodes[c].value.is_none() && self.nodes[c].name == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParseState {
    InitComment,
    StdLine,
    GetOpenBrace,
}

struct Parser {
    tree: Tree,
    state: ParseState,
    group_level: usize,
    line_num: usize,
    current: usize,
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn skip_blanks(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| is_c_space(b)).count();
    &s[n..]
}

fn is_end_or_comment(s: &[u8]) -> bool {
    matches!(s.first(), None | Some(b'#') | Some(b';'))
}

/// Length of the leading run of bytes that are neither blanks nor `#`/`;`.
fn word_len(s: &[u8]) -> usize {
    s.iter()
        .take_while(|&&b| !is_c_space(b) && b != b'#' && b != b';')
        .count()
}

/// `parse_quoted_string()`: `s` starts right after the opening quote.
fn unquote(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut it = s.iter().copied();
    while let Some(b) = it.next() {
        match b {
            b'"' => break,
            b'\\' => match it.next() {
                Some(b'n') => out.push(b'\n'),
                Some(b't') => out.push(b'\t'),
                Some(b'b') => out.push(0x08),
                Some(other) => out.push(other),
                // profile.c runs off the end of the string here; stop.
                None => break,
            },
            other => out.push(other),
        }
    }
    out
}

/// Truncates at the first `*` (final marker); returns whether there was one.
fn strip_final(tag: &mut Vec<u8>) -> bool {
    match tag.iter().position(|&b| b == b'*') {
        Some(p) => {
            tag.truncate(p);
            true
        }
        None => false,
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// C string view: everything up to the first NUL.
fn c_str(s: &[u8]) -> &[u8] {
    match s.iter().position(|&b| b == 0) {
        Some(p) => &s[..p],
        None => s,
    }
}

impl Parser {
    fn new() -> Self {
        Parser {
            tree: Tree::new(),
            state: ParseState::InitComment,
            group_level: 0,
            line_num: 0,
            current: 0,
        }
    }

    /// `parse_line()`.
    fn line(&mut self, raw: &[u8]) -> Result<(), SyntaxErrorKind> {
        let line = c_str(raw);
        self.line_num += 1;
        if self.state == ParseState::GetOpenBrace {
            if skip_blanks(line).first() != Some(&b'{') {
                return Err(SyntaxErrorKind::MissingOpenBrace);
            }
            self.state = ParseState::StdLine;
            return Ok(());
        }
        if self.state == ParseState::InitComment {
            if line.first() != Some(&b'[') {
                return Ok(());
            }
            self.state = ParseState::StdLine;
        }
        let mut end = line.len();
        while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
            end -= 1;
        }
        let cp = skip_blanks(&line[..end]);
        if is_end_or_comment(cp) {
            return Ok(());
        }
        match cp[0] {
            b'[' => self.section_header(&cp[1..]),
            b'}' => {
                if self.group_level == 0 {
                    return Err(SyntaxErrorKind::ExtraCloseBrace);
                }
                if cp.get(1) == Some(&b'*') {
                    self.tree.nodes[self.current].is_final = true;
                }
                self.current = self.tree.nodes[self.current].parent;
                self.group_level -= 1;
                Ok(())
            }
            _ => self.relation(cp),
        }
    }

    fn section_header(&mut self, after_bracket: &[u8]) -> Result<(), SyntaxErrorKind> {
        if self.group_level > 0 {
            return Err(SyntaxErrorKind::SectionNotTop);
        }
        let cp = skip_blanks(after_bracket);
        let close = cp
            .iter()
            .position(|&b| b == b']')
            .ok_or(SyntaxErrorKind::SectionSyntax)?;
        let name = if cp.first() == Some(&b'"') {
            // Note: profile.c unquotes in place, which for names containing
            // `]` *and* escapes can also alter the text after the first `]`;
            // we always look at the original text there.
            unquote(&cp[1..])
        } else {
            let mut n = close;
            while n > 1 && is_c_space(cp[n - 1]) {
                n -= 1;
            }
            if n == 0 {
                return Err(SyntaxErrorKind::SectionSyntax);
            }
            cp[..n].to_vec()
        };
        let name = lossy(&name);
        let sect = match self.tree.section(0, &name) {
            Some(s) => s,
            None => self.tree.add(0, name, None),
        };
        self.current = sect;
        let mut rest = &cp[close + 1..];
        if rest.first() == Some(&b'*') {
            self.tree.nodes[sect].is_final = true;
            rest = &rest[1..];
        }
        if !is_end_or_comment(skip_blanks(rest)) {
            return Err(SyntaxErrorKind::SectionSyntax);
        }
        Ok(())
    }

    fn relation(&mut self, cp: &[u8]) -> Result<(), SyntaxErrorKind> {
        let eq = cp
            .iter()
            .position(|&b| b == b'=')
            .ok_or(SyntaxErrorKind::RelationSyntax)?;
        if eq == 0 {
            return Err(SyntaxErrorKind::RelationSyntax);
        }
        let tag_raw = &cp[..eq];
        let mut tag = if tag_raw[0] == b'"' {
            unquote(&tag_raw[1..])
        } else {
            let n = word_len(tag_raw);
            let mut rest = &tag_raw[n..];
            if !rest.is_empty() {
                rest = &rest[1..];
            }
            if !skip_blanks(rest).is_empty() {
                return Err(SyntaxErrorKind::RelationSyntax);
            }
            tag_raw[..n].to_vec()
        };

        let value = skip_blanks(&cp[eq + 1..]);
        let relation_value = if value.first() == Some(&b'"') {
            Some(unquote(&value[1..]))
        } else if is_end_or_comment(value) {
            self.state = ParseState::GetOpenBrace;
            None
        } else if value[0] == b'{' {
            if !is_end_or_comment(skip_blanks(&value[1..])) {
                return Err(SyntaxErrorKind::RelationSyntax);
            }
            None
        } else {
            let n = word_len(value);
            if !is_end_or_comment(skip_blanks(&value[n..])) {
                return Err(SyntaxErrorKind::RelationSyntax);
            }
            Some(value[..n].to_vec())
        };

        let is_final = strip_final(&mut tag);
        let tag = lossy(&tag);
        match relation_value {
            None => {
                let sect = self.tree.add(self.current, tag, None);
                self.tree.nodes[sect].is_final = is_final;
                self.current = sect;
                self.group_level += 1;
            }
            Some(v) => {
                let rel = self.tree.add(self.current, tag, Some(lossy(&v)));
                self.tree.nodes[rel].is_final = is_final;
            }
        }
        Ok(())
    }

    fn wrap(&self, file: &str, kind: SyntaxErrorKind) -> ProfileError {
        ProfileError::Syntax {
            file: file.to_owned(),
            line: self.line_num,
            kind,
        }
    }

    /// In-memory text, split on `\n` like `profile_set_default()`.
    fn parse_text(text: &[u8], file: &str) -> Result<Tree, ProfileError> {
        let mut p = Parser::new();
        let mut rest = c_str(text);
        while !rest.is_empty() {
            let (line, next) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &rest[rest.len()..]),
            };
            p.line(line).map_err(|k| p.wrap(file, k))?;
            rest = next;
        }
        Ok(p.tree)
    }

    /// File contents, read in `fgets()` chunks like `profile_update_file()`.
    fn parse_file(data: &[u8], file: &str) -> Result<Tree, ProfileError> {
        let mut p = Parser::new();
        let mut rest = data;
        while !rest.is_empty() {
            let limit = rest.len().min(FGETS_CHUNK);
            let n = rest[..limit]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(limit, |i| i + 1);
            p.line(&rest[..n]).map_err(|k| p.wrap(file, k))?;
            rest = &rest[n..];
        }
        Ok(p.tree)
    }
}

/// A parsed mke2fs configuration (one or more profile files).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// In lookup order; earlier files win.
    files: Vec<Tree>,
}

/// Inputs of mke2fs's `parse_fs_type()`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsTypeQuery<'a> {
    /// `-t` argument, or `[devices] <dev> fs_type` when `-t` was not given.
    pub fs_type: Option<&'a str>,
    /// `-T` argument (comma separated), or `[devices] <dev> usage_types`.
    pub usage_types: Option<&'a str>,
    /// Filesystem size, in units of `block_size` (see [`size_type`]).
    ///
    /// As `PRS()` computes it: the explicit size argument converted to
    /// `block_size` units, else the device size in `block_size` units rounded
    /// down to a multiple of `page_size / block_size` blocks when the page is
    /// larger than `block_size`. It is *not* yet rescaled to the block size
    /// the profile picks afterwards (`get_int(types, "blocksize", 4096)`,
    /// `fs_blocks_count /= blocksize / 1024`).
    pub fs_blocks_count: u64,
    /// `EXT2_BLOCK_SIZE(&fs_param)` at that point of `PRS()`: the `-b` value
    /// if a positive one was given (or the external journal's block size),
    /// otherwise 1024. `0` is accepted and means 1024.
    pub block_size: u32,
    /// Making a filesystem for the Hurd (see [`for_hurd`]).
    pub is_hurd: bool,
    /// mke2fs's `journal_size != 0` (`-j`, `-J ...`): turns a defaulted
    /// `ext2` into `ext3`.
    pub journal: bool,
    /// `-F`: an undefined ext type is only a warning.
    pub force: bool,
}

/// Result of the fs_types resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsTypes {
    /// The list used for every profile lookup, e.g. `["ext4", "huge"]`.
    pub types: Vec<String>,
    /// The ext type (first element of `types`).
    pub ext_type: String,
    /// `floppy`, `small`, `default`, `big` or `huge`; only added to `types`
    /// if no usage types were given and `[fs_types]` defines it (the stock
    /// config has no `default` entry, so a mid-sized ext4 gives `["ext4"]`).
    pub size_type: String,
    /// Messages mke2fs prints but continues after.
    pub warnings: Vec<String>,
}

/// The size class of mke2fs's `parse_fs_type()`.
///
/// `fs_blocks_count` is in units of `block_size` (`0` means 1024, which is
/// `EXT2_BLOCK_SIZE` before any block size is known). mke2fs computes
/// `meg = 1 MiB / block_size` in blocks and compares `fs_blocks_count`
/// against `3*meg` (`floppy` below), `512*meg` (`small`), `4*1024*1024*meg`
/// (`default`), `16*1024*1024*meg` (`big`), else `huge`. Since every legal
/// block size divides 1 MiB this is exactly a comparison of the size in
/// bytes against 3 MiB, 512 MiB, 4 TiB and 16 TiB; the block size only fixes
/// the unit of `fs_blocks_count`.
pub fn size_type(fs_blocks_count: u64, block_size: u32) -> &'static str {
    let bs = if block_size == 0 {
        1024
    } else {
        u64::from(block_size)
    };
    let meg = (1024 * 1024) / bs;
    if fs_blocks_count < 3 * meg {
        "floppy"
    } else if fs_blocks_count < 512 * meg {
        "small"
    } else if fs_blocks_count < 4 * 1024 * 1024 * meg {
        "default"
    } else if fs_blocks_count < 16 * 1024 * 1024 * meg {
        "big"
    } else {
        "huge"
    }
}

/// mke2fs's `for_hurd()`: `creator_os` is `-o`, else `defaults.creator_os`.
/// `None` means "not the Hurd" (mke2fs says yes only when built on GNU/Hurd).
/// A value starting with a digit is compared numerically with
/// `EXT2_OS_HURD` (1); otherwise `GNU` or `hurd`, case-insensitively.
pub fn for_hurd(creator_os: Option<&str>) -> bool {
    let Some(os) = creator_os else {
        return false;
    };
    if os.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        let digits: String = os.chars().take_while(char::is_ascii_digit).collect();
        // atoi(); anything that does not fit is certainly not 1.
        return digits.parse::<u64>().ok() == Some(1);
    }
    os.eq_ignore_ascii_case("gnu") || os.eq_ignore_ascii_case("hurd")
}

/// The ordered feature edits mke2fs derives from the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureEdits {
    /// `base_features` ([`Profile::get_string`] semantics, fallback
    /// [`FALLBACK_BASE_FEATURES`]).
    pub base: String,
    /// The first `features` relation of each fs_type, in list order, empty
    /// ones left out.
    pub fs_type_features: Vec<String>,
    /// `default_features` ([`Profile::get_string`] semantics), if non-empty.
    /// mke2fs applies it **only when no `-O` was given**.
    pub default_features: Option<String>,
}

impl FeatureEdits {
    /// The edit strings in application order, excluding the user's `-O`
    /// string (which mke2fs applies after these).
    pub fn before_user(&self, user_features_given: bool) -> Vec<String> {
        let mut v = Vec::with_capacity(self.fs_type_features.len() + 2);
        if !self.base.is_empty() {
            v.push(self.base.clone());
        }
        v.extend(self.fs_type_features.iter().cloned());
        if !user_features_given {
            v.extend(self.default_features.iter().cloned());
        }
        v
    }
}

/// Parsed number prefix for the strtol/strtoul emulation.
struct CInteger {
    negative: bool,
    magnitude: u64,
    overflow: bool,
}

/// `strtol(s, &end, 0)` / `strtoul` with the "whole string must be used"
/// check of profile.c. Returns `None` for empty/garbage strings.
fn parse_c_integer(s: &str) -> Option<CInteger> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut i = b.iter().take_while(|&&c| is_c_space(c)).count();
    let mut negative = false;
    if let Some(&c) = b.get(i)
        && (c == b'+' || c == b'-')
    {
        negative = c == b'-';
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
    let mut magnitude: u64 = 0;
    let mut overflow = false;
    while let Some(d) = b.get(i).and_then(|&c| char::from(c).to_digit(radix)) {
        match magnitude
            .checked_mul(u64::from(radix))
            .and_then(|m| m.checked_add(u64::from(d)))
        {
            Some(m) => magnitude = m,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start || i != b.len() {
        return None;
    }
    Some(CInteger {
        negative,
        magnitude,
        overflow,
    })
}

/// `profile_get_integer()` value parsing: `strtol` base 0, must fit `int`.
fn parse_profile_int(s: &str) -> Option<i32> {
    let n = parse_c_integer(s)?;
    if n.overflow {
        return None;
    }
    let v = i128::from(n.magnitude);
    i32::try_from(if n.negative { -v } else { v }).ok()
}

/// `profile_get_uint()` value parsing: `strtoul` base 0 (a leading `-`
/// negates modulo 2^64, as glibc does), must fit `unsigned int`.
fn parse_profile_uint(s: &str) -> Option<u32> {
    let n = parse_c_integer(s)?;
    if n.overflow {
        return None;
    }
    let v = if n.negative {
        n.magnitude.wrapping_neg()
    } else {
        n.magnitude
    };
    u32::try_from(v).ok()
}

/// `profile_get_double()` value parsing (`strtod`, C locale, as `-m`
/// reads it: hex floats, `inf`, `nan(...)` too). Overflow and underflow
/// (ERANGE) are rejected, as is anything after the number.
fn parse_profile_double(s: &str) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let (v, rest) = crate::mkfs::options::c_strtod(s);
    if !rest.is_empty() {
        return None;
    }
    let t = std::str::from_utf8(skip_blanks(s.as_bytes())).ok()?;
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let literal_special = body
        .get(..3)
        .is_some_and(|p| p.eq_ignore_ascii_case("inf") || p.eq_ignore_ascii_case("nan"));
    if literal_special {
        return Some(v);
    }
    if v.is_infinite() {
        return None;
    }
    let mantissa_nonzero = match body.get(..2) {
        Some(p) if p.eq_ignore_ascii_case("0x") => body[2..]
            .bytes()
            .take_while(|&c| c != b'p' && c != b'P')
            .any(|c| c.is_ascii_hexdigit() && c != b'0'),
        _ => body
            .bytes()
            .take_while(|&c| c != b'e' && c != b'E')
            .any(|c| (b'1'..=b'9').contains(&c)),
    };
    if (v == 0.0 && mantissa_nonzero) || (v != 0.0 && v.abs() < f64::MIN_POSITIVE) {
        return None;
    }
    Some(v)
}

/// `profile_parse_boolean()`.
pub fn parse_bool(s: &str) -> Option<bool> {
    const YES: [&str; 6] = ["y", "yes", "true", "t", "1", "on"];
    const NO: [&str; 6] = ["n", "no", "false", "nil", "0", "off"];
    if YES.iter().any(|y| y.eq_ignore_ascii_case(s)) {
        Some(true)
    } else if NO.iter().any(|n| n.eq_ignore_ascii_case(s)) {
        Some(false)
    } else {
        None
    }
}

fn is_eacces(e: &io::Error) -> bool {
    e.raw_os_error() == Some(13)
}

/// Regular files of a config directory, as `get_dirlist()` selects them.
fn dir_list(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let ok = name
            .as_bytes()
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
        if !ok {
            continue;
        }
        let path = dir.join(&name);
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(files)
}

/// `~/` expansion of `profile_open_file()` (HOME only).
fn expand_home(path: &Path) -> PathBuf {
    let bytes = path.as_os_str().as_bytes();
    if bytes.starts_with(b"~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        let mut out = home.as_bytes().to_vec();
        out.extend_from_slice(&bytes[1..]);
        return PathBuf::from(OsStr::from_bytes(&out));
    }
    path.to_path_buf()
}

impl Profile {
    /// Loads the configuration the way mke2fs does: the path in
    /// `MKE2FS_CONFIG` if that variable is set, else `/etc/mke2fs.conf`.
    ///
    /// If the file does not exist (also when `MKE2FS_CONFIG` names a missing
    /// file, is empty, or the file is unreadable with EACCES) the built-in
    /// default is used: `profile_init()` then returns `ENOENT` and mke2fs
    /// falls back to `mke2fs_default_profile`. Syntax errors and other I/O
    /// errors are fatal in mke2fs and returned as errors here.
    pub fn load() -> Result<(Profile, ProfileSource), ProfileError> {
        Self::load_with(std::env::var_os(CONFIG_ENV).as_deref())
    }

    /// [`Profile::load`] with an explicit value for `MKE2FS_CONFIG`
    /// (`None` = unset).
    pub fn load_with(config_env: Option<&OsStr>) -> Result<(Profile, ProfileSource), ProfileError> {
        match config_env {
            None => Self::load_from(Path::new(DEFAULT_CONFIG_PATH)),
            // An empty name ends profile.c's file list: no file at all.
            Some(v) if v.is_empty() => Ok((Self::builtin(), ProfileSource::Builtin)),
            Some(v) => Self::load_from(Path::new(v)),
        }
    }

    /// Loads `path` with `profile_init()` semantics, falling back to the
    /// built-in profile when it does not exist.
    ///
    /// * Missing path → built-in.
    /// * Regular file → parsed; if it cannot be opened with ENOENT/EACCES →
    ///   built-in. A leading `~/` is expanded with `$HOME` for the file open
    ///   only (profile.c first tries `opendir()` on the unexpanded name, which
    ///   fails with ENOENT unless `./~` exists, so such paths normally give
    ///   the built-in profile; this is reproduced).
    /// * Directory → see [`ProfileSource::Directory`]; built-in if it holds no
    ///   eligible file (profile.c then skips it), otherwise never falls back.
    pub fn load_from(path: &Path) -> Result<(Profile, ProfileSource), ProfileError> {
        let io_err = |source: io::Error| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        match dir_list(path) {
            // An empty listing makes profile.c skip the path entirely, so
            // no file is found and the built-in profile is used.
            Ok(files) if files.is_empty() => Ok((Self::builtin(), ProfileSource::Builtin)),
            Ok(files) => {
                let mut trees = Vec::with_capacity(files.len() + 1);
                let mut used = Vec::with_capacity(files.len());
                for f in files {
                    match std::fs::read(&f) {
                        Ok(data) => {
                            let name = f.display().to_string();
                            trees.push(Parser::parse_file(&data, &name)?);
                            used.push(f);
                        }
                        Err(e) if is_eacces(&e) => continue,
                        Err(e) => {
                            return Err(ProfileError::Io { path: f, source: e });
                        }
                    }
                }
                // The directory itself is then opened as a file, which reads
                // as empty (fgets() fails with EISDIR).
                trees.push(Tree::new());
                Ok((
                    Profile { files: trees },
                    ProfileSource::Directory {
                        path: path.to_path_buf(),
                        files: used,
                    },
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                let real = expand_home(path);
                match std::fs::read(&real) {
                    Ok(data) => {
                        let name = real.display().to_string();
                        let tree = Parser::parse_file(&data, &name)?;
                        Ok((Profile { files: vec![tree] }, ProfileSource::File(real)))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound || is_eacces(&e) => {
                        Ok((Self::builtin(), ProfileSource::Builtin))
                    }
                    Err(e) => Err(io_err(e)),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Ok((Self::builtin(), ProfileSource::Builtin))
            }
            Err(e) => Err(io_err(e)),
        }
    }

    /// Parses profile text (lines split on `\n`, as `profile_set_default()`
    /// does; syntax errors name the file `<default>`).
    pub fn parse(text: &str) -> Result<Profile, ProfileError> {
        let tree = Parser::parse_text(text.as_bytes(), BUILTIN_SOURCE_NAME)?;
        Ok(Profile { files: vec![tree] })
    }

    /// Parses profile text as if it had been read from the file `name`
    /// (`fgets()` chunking of lines longer than 2047 bytes, `name` in errors).
    pub fn parse_file_contents(data: &[u8], name: &str) -> Result<Profile, ProfileError> {
        let tree = Parser::parse_file(data, name)?;
        Ok(Profile { files: vec![tree] })
    }

    /// The compiled-in default profile ([`BUILTIN_MKE2FS_CONF`]).
    pub fn builtin() -> Profile {
        Self::parse(BUILTIN_MKE2FS_CONF).expect("built-in mke2fs.conf parses")
    }

    /// All relation values found by profile.c's iterator: `sections` are
    /// walked (first matching subsection at each level, per file), then the
    /// relations named `leaf` (all relations if `None`) are collected; files
    /// are visited in order until one whose path contains a final section.
    fn relations(&self, sections: &[&str], leaf: Option<&str>) -> Vec<&str> {
        let mut out = Vec::new();
        for tree in &self.files {
            let mut final_seen = false;
            let mut sect = Some(0);
            for name in sections {
                sect = sect.and_then(|s| tree.section(s, name));
                match sect {
                    Some(s) => final_seen |= tree.nodes[s].is_final,
                    None => break,
                }
            }
            if let Some(s) = sect {
                out.extend(tree.nodes[s].children.iter().filter_map(|&c| {
                    let n = &tree.nodes[c];
                    let v = n.value.as_deref()?;
                    leaf.is_none_or(|l| n.name == l).then_some(v)
                }));
            }
            if final_seen {
                break;
            }
        }
        out
    }

    /// `profile_get_value()`: the first relation at `path` (sections then
    /// relation name), e.g. `["devices", "/dev/sda1", "fs_type"]` or
    /// `["options", "proceed_delay"]`.
    pub fn get_value(&self, path: &[&str]) -> Option<&str> {
        let (leaf, sections) = path.split_last()?;
        self.relations(sections, Some(leaf)).into_iter().next()
    }

    /// Every relation at `path`, in file order.
    pub fn get_values(&self, path: &[&str]) -> Vec<&str> {
        match path.split_last() {
            Some((leaf, sections)) => self.relations(sections, Some(leaf)),
            None => Vec::new(),
        }
    }

    /// mke2fs's `profile_has_subsection()`: true only if `[section]` has a
    /// (first) subsection `sub` that directly contains at least one relation.
    pub fn has_subsection(&self, section: &str, sub: &str) -> bool {
        !self.relations(&[section, sub], None).is_empty()
    }

    /// Names of the top-level sections (of the first file defining each).
    pub fn section_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for tree in &self.files {
            for &c in &tree.nodes[0].children {
                let n = tree.nodes[c].name.as_str();
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        names
    }

    /// Shorthand for [`Profile::fs_types_with`] for a non-Hurd mke2fs
    /// without `-j`/`-J` and without `-F`.
    pub fn fs_types(
        &self,
        fs_type: Option<&str>,
        usage_types: Option<&str>,
        fs_blocks_count: u64,
        block_size: u32,
    ) -> Result<FsTypes, ProfileError> {
        self.fs_types_with(&FsTypeQuery {
            fs_type,
            usage_types,
            fs_blocks_count,
            block_size,
            ..FsTypeQuery::default()
        })
    }

    /// mke2fs's `parse_fs_type()`, for the program name `mke2fs`.
    ///
    /// 1. ext type: `fs_type`; else `ext2` on the Hurd; else
    ///    `defaults.fs_type` (default `ext2`), where `ext2` becomes `ext3` if
    ///    `journal`.
    /// 2. If `[fs_types]` has no subsection with relations for it and it is not
    ///    `ext2`: error [`ProfileError::UndefinedFsType`], or with `force` a
    ///    warning (the type is still used).
    /// 3. Size class from [`size_type`]`(fs_blocks_count, block_size)`.
    /// 4. `types = [ext_type]`, then each non-empty comma-separated item of
    ///    `usage_types` (or of the size class if `usage_types` is `None`) that
    ///    `[fs_types]` defines; an undefined item other than `default` gives the
    ///    warning "the fs_type X is not defined in mke2fs.conf" and is
    ///    dropped. Items are not trimmed.
    /// 5. `hurd` is appended on the Hurd (whether defined or not).
    pub fn fs_types_with(&self, q: &FsTypeQuery<'_>) -> Result<FsTypes, ProfileError> {
        let mut warnings = Vec::new();
        let ext_type: String = match q.fs_type {
            Some(t) => t.to_owned(),
            None if q.is_hurd => "ext2".to_owned(),
            None => {
                let t = self.get_value(&["defaults", "fs_type"]).unwrap_or("ext2");
                if t == "ext2" && q.journal {
                    "ext3".to_owned()
                } else {
                    t.to_owned()
                }
            }
        };
        if ext_type != "ext2" && !self.has_subsection("fs_types", &ext_type) {
            if !q.force {
                return Err(ProfileError::UndefinedFsType { fs_type: ext_type });
            }
            warnings.push(undefined_fs_type_message(&ext_type));
        }

        let size = size_type(q.fs_blocks_count, q.block_size);
        let usage = q.usage_types.unwrap_or(size);
        let mut types = vec![ext_type.clone()];
        for item in usage.split(',').filter(|s| !s.is_empty()) {
            if self.has_subsection("fs_types", item) {
                types.push(item.to_owned());
            } else if item != "default" {
                warnings.push(format!(
                    "Warning: the fs_type {item} is not defined in mke2fs.conf"
                ));
            }
        }
        if q.is_hurd {
            types.push("hurd".to_owned());
        }
        Ok(FsTypes {
            types,
            ext_type,
            size_type: size.to_owned(),
            warnings,
        })
    }

    fn fs_type_value(&self, fs_type: &str, key: &str) -> Option<&str> {
        self.get_value(&["fs_types", fs_type, key])
    }

    /// `get_string_from_profile()`: the **last** fs_type in `types` that has
    /// `key` wins; otherwise `[defaults]`; otherwise `None` (the caller's
    /// default). Only the first relation of that name in a section counts.
    pub fn get_string(&self, types: &[String], key: &str) -> Option<String> {
        types
            .iter()
            .rev()
            .find_map(|t| self.fs_type_value(t, key))
            .or_else(|| self.get_value(&["defaults", key]))
            .map(str::to_owned)
    }

    /// `get_int_from_profile()`: `[defaults]` then every fs_type in order
    /// overrides (last valid value wins). Values are parsed like `strtol(s,
    /// 0)` (decimal, `0x` hex, leading-`0` octal), must use the whole string
    /// and fit a C `int` (i32); invalid values are ignored. `default` is
    /// returned unchanged when nothing valid is found.
    pub fn get_int(&self, types: &[String], key: &str, default: i64) -> i64 {
        self.fold(types, key, default, |s| parse_profile_int(s).map(i64::from))
    }

    /// `get_uint_from_profile()`: like [`Profile::get_int`] with `strtoul`
    /// parsing; values must fit a C `unsigned int` (u32).
    pub fn get_uint(&self, types: &[String], key: &str, default: u64) -> u64 {
        self.fold(types, key, default, |s| {
            parse_profile_uint(s).map(u64::from)
        })
    }

    /// `get_double_from_profile()`: like [`Profile::get_int`] with `strtod`
    /// parsing.
    pub fn get_double(&self, types: &[String], key: &str, default: f64) -> f64 {
        self.fold(types, key, default, parse_profile_double)
    }

    /// `get_bool_from_profile()`: like [`Profile::get_int`]; values as
    /// [`parse_bool`] (case-insensitive y/yes/true/t/1/on, n/no/false/nil/0/off).
    /// An invalid value is ignored (for `[defaults]` mke2fs would use an
    /// uninitialised variable; we keep `default`).
    pub fn get_bool(&self, types: &[String], key: &str, default: bool) -> bool {
        self.fold(types, key, default, parse_bool)
    }

    fn fold<T>(
        &self,
        types: &[String],
        key: &str,
        default: T,
        parse: impl Fn(&str) -> Option<T>,
    ) -> T {
        let mut ret = self
            .get_value(&["defaults", key])
            .and_then(&parse)
            .unwrap_or(default);
        for t in types {
            if let Some(v) = self.fs_type_value(t, key).and_then(&parse) {
                ret = v;
            }
        }
        ret
    }

    /// The feature edits of `PRS()` (revision 1 filesystems; with `-r 0`
    /// mke2fs applies none of them).
    pub fn feature_edits(&self, types: &[String]) -> FeatureEdits {
        FeatureEdits {
            base: self
                .get_string(types, "base_features")
                .unwrap_or_else(|| FALLBACK_BASE_FEATURES.to_owned()),
            fs_type_features: types
                .iter()
                .filter_map(|t| self.fs_type_value(t, "features"))
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            default_features: self
                .get_string(types, "default_features")
                .filter(|s| !s.is_empty()),
        }
    }

    /// The strings mke2fs feeds to `e2p_edit_feature2()` before the user's
    /// `-O`, **assuming no `-O` was given**: `base_features`, each fs_type's
    /// `features`, then `default_features`. If `-O` is given, use
    /// [`FeatureEdits::before_user`]`(true)` of [`Profile::feature_edits`]
    /// (mke2fs then skips `default_features`), followed by the `-O` string.
    pub fn feature_edit_list(&self, types: &[String]) -> Vec<String> {
        self.feature_edits(types).before_user(false)
    }

    /// `default_mntopts` ([`Profile::get_string`] semantics, fallback
    /// [`FALLBACK_DEFAULT_MNTOPTS`]), for `e2p_edit_mntopts()`.
    pub fn default_mntopts(&self, types: &[String]) -> String {
        self.get_string(types, "default_mntopts")
            .unwrap_or_else(|| FALLBACK_DEFAULT_MNTOPTS.to_owned())
    }

    /// The non-empty first `options` relation of each fs_type, in order;
    /// mke2fs passes each to `parse_extended_opts()` before the user's `-E`.
    /// (`[defaults]` is not consulted.)
    pub fn options_list(&self, types: &[String]) -> Vec<String> {
        types
            .iter()
            .filter_map(|t| self.fs_type_value(t, "options"))
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// [`Profile::options_list`] joined with `,`, or `None` if empty.
    pub fn options_string(&self, types: &[String]) -> Option<String> {
        let l = self.options_list(types);
        (!l.is_empty()).then(|| l.join(","))
    }
}

impl fmt::Display for FsTypes {
    /// Like mke2fs `-v`: `'ext4', 'huge'`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.types.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "'{t}'")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Debian's /etc/mke2fs.conf for 1.47.0 (no orphan_file, no
    /// metadata_csum_seed).
    const DEBIAN_CONF: &str = "[defaults]
\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
\tdefault_mntopts = acl,user_xattr
\tenable_periodic_fsck = 0
\tblocksize = 4096
\tinode_size = 256
\tinode_ratio = 16384

[fs_types]
\text3 = {
\t\tfeatures = has_journal
\t}
\text4 = {
\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
\t}
\tsmall = {
\t\tblocksize = 1024
\t\tinode_ratio = 4096
\t}
\tfloppy = {
\t\tblocksize = 1024
\t\tinode_ratio = 8192
\t}
\tbig = {
\t\tinode_ratio = 32768
\t}
\thuge = {
\t\tinode_ratio = 65536
\t}
\tnews = {
\t\tinode_ratio = 4096
\t}
\tlargefile = {
\t\tinode_ratio = 1048576
\t\tblocksize = -1
\t}
\tlargefile4 = {
\t\tinode_ratio = 4194304
\t\tblocksize = -1
\t}
\thurd = {
\t     blocksize = 4096
\t     inode_size = 128
\t     warn_y2038_dates = 0
\t}
";

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const TIB: u64 = 1024 * GIB;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn syntax_err(text: &str) -> (usize, SyntaxErrorKind) {
        match Profile::parse(text) {
            Err(ProfileError::Syntax { line, kind, .. }) => (line, kind),
            other => panic!("expected syntax error, got {other:?}"),
        }
    }

    /// ext4 types for a size in bytes, with the 1 KiB unit mke2fs uses when
    /// `-b` was not given.
    fn ext4_types(p: &Profile, bytes: u64, usage: Option<&str>) -> FsTypes {
        p.fs_types(Some("ext4"), usage, bytes / 1024, 0).unwrap()
    }

    #[test]
    fn builtin_text_is_upstream_conf() {
        assert!(BUILTIN_MKE2FS_CONF.starts_with("[defaults]\n\tbase_features = sparse_super,"));
        assert!(BUILTIN_MKE2FS_CONF.ends_with("\t     warn_y2038_dates = 0\n\t}\n"));
        assert!(BUILTIN_MKE2FS_CONF.contains(
            "\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,\
             metadata_csum_seed,64bit,dir_nlink,extra_isize,orphan_file\n"
        ));
        assert_eq!(BUILTIN_MKE2FS_CONF.lines().count(), 45);
        // Same as Debian's file except for the ext4 features line.
        let deb: Vec<&str> = DEBIAN_CONF.lines().collect();
        let up: Vec<&str> = BUILTIN_MKE2FS_CONF.lines().collect();
        assert_eq!(deb.len(), up.len());
        let diffs: Vec<usize> = (0..up.len()).filter(|&i| deb[i] != up[i]).collect();
        assert_eq!(diffs, vec![13]);
    }

    #[test]
    fn parse_builtin() {
        let p = Profile::builtin();
        assert_eq!(p.section_names(), vec!["defaults", "fs_types"]);
        assert_eq!(p.get_value(&["defaults", "blocksize"]), Some("4096"));
        assert_eq!(
            p.get_value(&["defaults", "default_mntopts"]),
            Some("acl,user_xattr")
        );
        assert_eq!(
            p.get_value(&["fs_types", "hurd", "inode_size"]),
            Some("128")
        );
        assert_eq!(
            p.get_value(&["fs_types", "ext3", "features"]),
            Some("has_journal")
        );
        assert_eq!(p.get_value(&["fs_types", "nope", "features"]), None);
        assert_eq!(p.get_value(&["defaults"]), None);
        assert_eq!(p.get_value(&[]), None);
        for t in [
            "ext3",
            "ext4",
            "small",
            "floppy",
            "big",
            "huge",
            "news",
            "largefile",
            "largefile4",
            "hurd",
        ] {
            assert!(p.has_subsection("fs_types", t), "{t}");
        }
        assert!(!p.has_subsection("fs_types", "ext2"));
        assert!(!p.has_subsection("fs_types", "default"));
        let f = p.get_value(&["fs_types", "ext4", "features"]).unwrap();
        assert!(f.contains("orphan_file") && f.contains("metadata_csum_seed"));
        assert_eq!(Profile::parse(BUILTIN_MKE2FS_CONF).unwrap(), p);
    }

    #[test]
    fn parse_debian_variant() {
        let p = Profile::parse(DEBIAN_CONF).unwrap();
        let types = ext4_types(&p, GIB, None).types;
        assert_eq!(
            p.feature_edit_list(&types),
            v(&[
                "sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr",
                "has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize",
            ])
        );
        assert_eq!(p.get_int(&types, "inode_size", 0), 256);
        // File-style parsing gives the same tree.
        assert_eq!(
            Profile::parse_file_contents(DEBIAN_CONF.as_bytes(), "/etc/mke2fs.conf").unwrap(),
            p
        );
    }

    #[test]
    fn size_classes() {
        let p = Profile::builtin();
        let cases = [
            (2 * MIB, "floppy", v(&["ext4", "floppy"])),
            (100 * MIB, "small", v(&["ext4", "small"])),
            (GIB, "default", v(&["ext4"])),
            (5 * TIB, "big", v(&["ext4", "big"])),
            (17 * TIB, "huge", v(&["ext4", "huge"])),
        ];
        for (bytes, class, types) in cases {
            for bs in [0u32, 1024, 4096, 65536] {
                let unit = if bs == 0 { 1024 } else { u64::from(bs) };
                let r = p.fs_types(Some("ext4"), None, bytes / unit, bs).unwrap();
                assert_eq!(r.size_type, class, "{bytes} bs {bs}");
                assert_eq!(r.types, types);
                assert_eq!(r.ext_type, "ext4");
                assert!(r.warnings.is_empty());
            }
        }
        // Boundaries are exact byte sizes.
        assert_eq!(size_type(3 * 1024 - 1, 0), "floppy");
        assert_eq!(size_type(3 * 1024, 1024), "small");
        assert_eq!(size_type(512 * 256 - 1, 4096), "small");
        assert_eq!(size_type(512 * 256, 4096), "default");
        assert_eq!(size_type(4 * TIB / 4096 - 1, 4096), "default");
        assert_eq!(size_type(4 * TIB / 4096, 4096), "big");
        assert_eq!(size_type(16 * TIB / 1024, 0), "huge");
        assert_eq!(
            format!("{}", ext4_types(&p, 17 * TIB, None)),
            "'ext4', 'huge'"
        );
    }

    #[test]
    fn usage_types() {
        let p = Profile::builtin();
        let r = ext4_types(&p, 17 * TIB, Some("news"));
        assert_eq!(r.types, v(&["ext4", "news"]));
        assert_eq!(r.size_type, "huge");
        assert_eq!(p.get_int(&r.types, "inode_ratio", 8192), 4096);

        let r = ext4_types(&p, GIB, Some("largefile"));
        assert_eq!(r.types, v(&["ext4", "largefile"]));
        assert_eq!(p.get_int(&r.types, "blocksize", 4096), -1);
        assert_eq!(p.get_int(&r.types, "inode_ratio", 8192), 1_048_576);

        let r = ext4_types(&p, GIB, Some("news,,bogus,default,largefile4, small"));
        assert_eq!(r.types, v(&["ext4", "news", "largefile4"]));
        assert_eq!(
            r.warnings,
            v(&[
                "Warning: the fs_type bogus is not defined in mke2fs.conf",
                "Warning: the fs_type  small is not defined in mke2fs.conf",
            ])
        );
        assert_eq!(p.get_int(&r.types, "inode_ratio", 0), 4_194_304);

        // -T replaces the size class entirely.
        let r = ext4_types(&p, 100 * MIB, Some("news"));
        assert_eq!(r.types, v(&["ext4", "news"]));
        assert_eq!(p.get_int(&r.types, "blocksize", 4096), 4096);
    }

    #[test]
    fn ext_type_resolution() {
        let p = Profile::builtin();
        // No -t: defaults.fs_type, else ext2 (which need not be defined).
        let r = p.fs_types(None, None, GIB / 1024, 0).unwrap();
        assert_eq!(r.types, v(&["ext2"]));
        let q = FsTypeQuery {
            journal: true,
            fs_blocks_count: 100 * MIB / 1024,
            ..Default::default()
        };
        assert_eq!(p.fs_types_with(&q).unwrap().types, v(&["ext3", "small"]));
        let p2 = Profile::parse(&format!(
            "{BUILTIN_MKE2FS_CONF}[defaults]\n\tfs_type = ext4\n"
        ))
        .unwrap();
        assert_eq!(p2.fs_types_with(&q).unwrap().types, v(&["ext4", "small"]));

        // Hurd: ext2 unless -t, and "hurd" appended.
        let q = FsTypeQuery {
            is_hurd: true,
            fs_blocks_count: GIB / 1024,
            ..Default::default()
        };
        let r = p.fs_types_with(&q).unwrap();
        assert_eq!(r.types, v(&["ext2", "hurd"]));
        assert_eq!(p.get_int(&r.types, "inode_size", 0), 128);
        assert!(!p.get_bool(&r.types, "warn_y2038_dates", true));
        assert!(for_hurd(Some("GNU")) && for_hurd(Some("Hurd")) && for_hurd(Some("1")));
        assert!(!for_hurd(Some("linux")) && !for_hurd(Some("0")) && !for_hurd(None));

        // An undefined ext type aborts unless forced.
        let bare = Profile::parse("[defaults]\n\tblocksize = 4096\n").unwrap();
        match bare.fs_types(Some("ext4"), None, GIB / 1024, 0) {
            Err(e @ ProfileError::UndefinedFsType { .. }) => {
                assert!(
                    e.to_string()
                        .contains("does not define the ext4 filesystem type")
                );
                assert!(e.to_string().contains("updated mke2fs.conf"));
            }
            other => panic!("{other:?}"),
        }
        let q = FsTypeQuery {
            fs_type: Some("xfs"),
            force: true,
            fs_blocks_count: GIB / 1024,
            ..Default::default()
        };
        let r = bare.fs_types_with(&q).unwrap();
        assert_eq!(r.types, v(&["xfs"]));
        assert_eq!(
            r.warnings,
            v(&["Your mke2fs.conf file does not define the xfs filesystem type."])
        );
        assert!(bare.fs_types(Some("ext2"), None, 1, 0).is_ok());
        // An empty subsection does not count as defined.
        let empty = Profile::parse("[fs_types]\n ext4 = {\n  x = {\n   y = 1\n  }\n }\n").unwrap();
        assert!(!empty.has_subsection("fs_types", "ext4"));
        assert!(empty.fs_types(Some("ext4"), None, 1, 0).is_err());
    }

    #[test]
    fn int_lookups() {
        let p = Profile::builtin();
        let small = ext4_types(&p, 100 * MIB, None).types;
        assert_eq!(p.get_int(&small, "inode_ratio", 8192), 4096);
        assert_eq!(p.get_int(&small, "blocksize", 4096), 1024);
        let floppy = ext4_types(&p, 2 * MIB, None).types;
        assert_eq!(p.get_int(&floppy, "inode_ratio", 8192), 8192);
        assert_eq!(p.get_int(&floppy, "blocksize", 4096), 1024);
        let default = ext4_types(&p, GIB, None).types;
        assert_eq!(p.get_int(&default, "inode_ratio", 8192), 16384);
        assert_eq!(p.get_int(&default, "blocksize", 4096), 4096);
        assert_eq!(p.get_int(&default, "inode_size", 0), 256);
        assert_eq!(p.get_int(&default, "num_backup_sb", 2), 2);
        assert_eq!(p.get_int(&default, "force_undo", 0), 0);
        let big = ext4_types(&p, 5 * TIB, None).types;
        assert_eq!(p.get_int(&big, "inode_ratio", 8192), 32768);
        let huge = ext4_types(&p, 17 * TIB, None).types;
        assert_eq!(p.get_int(&huge, "inode_ratio", 8192), 65536);
        assert_eq!(p.get_uint(&huge, "inode_ratio", 0), 65536);
        assert_eq!(p.get_uint(&huge, "flex_bg_size", 16), 16);
        assert_eq!(p.get_double(&huge, "reserved_ratio", 5.0), 5.0);
        assert!(!p.get_bool(&huge, "enable_periodic_fsck", true));
        assert!(p.get_bool(&huge, "lazy_itable_init", true));
        assert_eq!(p.get_string(&huge, "hash_alg"), None);
        assert_eq!(p.default_mntopts(&huge), "acl,user_xattr");
    }

    #[test]
    fn override_order() {
        let p = Profile::parse(
            "[defaults]
  x = 1
  s = defs
  b = yes
  r = 2.5
[fs_types]
  a = {
    x = 2
    s = from_a
    b = off
    r = 1e1
    options = stride=4
  }
  b = {
    x = 3
    s = from_b
    x = 99
    b = maybe
    r = junk
    options = \"\"
  }
  c = {
    x = 0x10
    options = stripe_width=8
  }
  d = {
    x = bogus
    s = from_d
  }
",
        )
        .unwrap();
        // ints: last valid wins, first relation of a section only.
        assert_eq!(p.get_int(&v(&["a", "b"]), "x", 0), 3);
        assert_eq!(p.get_int(&v(&["b", "a"]), "x", 0), 2);
        assert_eq!(p.get_int(&v(&["a", "c"]), "x", 0), 16);
        assert_eq!(p.get_int(&v(&["c", "d"]), "x", 0), 16);
        assert_eq!(p.get_int(&v(&["zz"]), "x", 7), 1);
        assert_eq!(p.get_int(&v(&["zz"]), "nokey", 7), 7);
        // strings: last fs_type having it wins, then defaults.
        assert_eq!(
            p.get_string(&v(&["a", "b"]), "s").as_deref(),
            Some("from_b")
        );
        assert_eq!(
            p.get_string(&v(&["b", "a"]), "s").as_deref(),
            Some("from_a")
        );
        assert_eq!(
            p.get_string(&v(&["a", "c"]), "s").as_deref(),
            Some("from_a")
        );
        assert_eq!(p.get_string(&v(&["c"]), "s").as_deref(), Some("defs"));
        assert_eq!(p.get_string(&v(&["c"]), "nokey"), None);
        // bools and doubles ignore invalid values.
        assert!(!p.get_bool(&v(&["a", "b"]), "b", true));
        assert!(p.get_bool(&v(&["b"]), "b", false));
        assert_eq!(p.get_double(&v(&["a", "b"]), "r", 0.0), 10.0);
        assert_eq!(p.get_double(&v(&[]), "r", 0.0), 2.5);
        // options: per type, in order, empty ones skipped.
        assert_eq!(
            p.options_list(&v(&["a", "b", "c"])),
            v(&["stride=4", "stripe_width=8"])
        );
        assert_eq!(
            p.options_string(&v(&["a", "b", "c"])).as_deref(),
            Some("stride=4,stripe_width=8")
        );
        assert_eq!(p.options_string(&v(&["d"])), None);
        assert_eq!(p.get_values(&["fs_types", "b", "x"]), vec!["3", "99"]);
    }

    #[test]
    fn value_parsers() {
        assert_eq!(parse_profile_int("4096"), Some(4096));
        assert_eq!(parse_profile_int("-1"), Some(-1));
        assert_eq!(parse_profile_int(" +12"), Some(12));
        assert_eq!(parse_profile_int("0x1F"), Some(31));
        assert_eq!(parse_profile_int("010"), Some(8));
        assert_eq!(parse_profile_int("0"), Some(0));
        assert_eq!(parse_profile_int("08"), None);
        assert_eq!(parse_profile_int("0x"), None);
        assert_eq!(parse_profile_int("12k"), None);
        assert_eq!(parse_profile_int(""), None);
        assert_eq!(parse_profile_int(" "), None);
        assert_eq!(parse_profile_int("2147483647"), Some(i32::MAX));
        assert_eq!(parse_profile_int("2147483648"), None);
        assert_eq!(parse_profile_int("-2147483648"), Some(i32::MIN));
        assert_eq!(parse_profile_int("99999999999999999999999"), None);
        assert_eq!(parse_profile_uint("4294967295"), Some(u32::MAX));
        assert_eq!(parse_profile_uint("4294967296"), None);
        assert_eq!(parse_profile_uint("-1"), None);
        assert_eq!(parse_profile_uint("-0"), Some(0));
        assert_eq!(parse_profile_double("5"), Some(5.0));
        assert_eq!(parse_profile_double(" 0.5"), Some(0.5));
        assert_eq!(parse_profile_double("1e1"), Some(10.0));
        assert_eq!(parse_profile_double("-.25"), Some(-0.25));
        assert_eq!(parse_profile_double("1e999"), None);
        assert_eq!(parse_profile_double("1e-999"), None);
        assert_eq!(parse_profile_double("0e-999"), Some(0.0));
        assert_eq!(parse_profile_double("INF"), Some(f64::INFINITY));
        assert_eq!(parse_profile_double("5%"), None);
        assert_eq!(parse_profile_double(""), None);
        assert_eq!(parse_profile_double("0x1.8p1"), Some(3.0));
        assert_eq!(parse_profile_double("0xep0"), Some(14.0));
        assert_eq!(parse_profile_double("0x1p-99999"), None);
        assert_eq!(parse_profile_double("0x1p99999"), None);
        assert_eq!(parse_profile_double("0x0p-99999"), Some(0.0));
        assert_eq!(parse_profile_double("0x"), None);
        assert!(parse_profile_double("nan(x)").is_some_and(f64::is_nan));
        for y in ["y", "YES", "true", "T", "1", "On"] {
            assert_eq!(parse_bool(y), Some(true), "{y}");
        }
        for n in ["n", "No", "FALSE", "nil", "0", "off"] {
            assert_eq!(parse_bool(n), Some(false), "{n}");
        }
        assert_eq!(parse_bool("2"), None);
        assert_eq!(parse_bool(""), None);
    }

    #[test]
    fn feature_edits_ext4() {
        let p = Profile::builtin();
        let types = ext4_types(&p, GIB, None).types;
        let expected = v(&[
            "sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr",
            "has_journal,extent,huge_file,flex_bg,metadata_csum,metadata_csum_seed,64bit,\
             dir_nlink,extra_isize,orphan_file",
        ]);
        assert_eq!(p.feature_edit_list(&types), expected);
        let huge = ext4_types(&p, 17 * TIB, Some("huge,news")).types;
        assert_eq!(p.feature_edit_list(&huge), expected);
        let ext3 = p.fs_types(Some("ext3"), None, GIB / 1024, 0).unwrap().types;
        assert_eq!(
            p.feature_edit_list(&ext3),
            v(&[
                "sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr",
                "has_journal"
            ])
        );
        // Fallback base features and default_features handling.
        let q = Profile::parse(
            "[fs_types]\n ext4 = {\n  features = extent\n  default_features = ^resize_inode\n }\n \
             small = {\n  features = \"\"\n  base_features = sparse_super\n }\n",
        )
        .unwrap();
        let e = q.feature_edits(&v(&["ext4"]));
        assert_eq!(e.base, FALLBACK_BASE_FEATURES);
        assert_eq!(e.default_features.as_deref(), Some("^resize_inode"));
        assert_eq!(
            q.feature_edit_list(&v(&["ext4"])),
            v(&[FALLBACK_BASE_FEATURES, "extent", "^resize_inode"])
        );
        assert_eq!(e.before_user(true), v(&[FALLBACK_BASE_FEATURES, "extent"]));
        assert_eq!(
            q.feature_edit_list(&v(&["ext4", "small"])),
            v(&["sparse_super", "extent", "^resize_inode"])
        );
        // Only the first `features` relation of a section is used
        // (checked against mke2fs 1.47.0 + dumpe2fs).
        let c4 = Profile::parse(
            "[defaults]\n base_features = sparse_super\n[fs_types]\n ext4 = {\n  \
             features = has_journal\n  features = extent\n  default_features = ^has_journal\n }\n",
        )
        .unwrap();
        let t = v(&["ext4"]);
        assert_eq!(
            c4.feature_edit_list(&t),
            v(&["sparse_super", "has_journal", "^has_journal"])
        );
        assert_eq!(
            c4.feature_edits(&t).before_user(true),
            v(&["sparse_super", "has_journal"])
        );
    }

    #[test]
    fn syntax_details() {
        let p = Profile::parse(
            "garbage before the first section = {
 [not a section either]
[defaults] ; comment
\t# comment
\t; comment
\tplain = value # trailing comment
\tquoted = \"a b\\tc\\\\d\\\"e\\nf\\bg\\q\" trailing junk ignored
\t\"quoted tag\" = x
\tstarred* = 1
\tnospace=2
\tsub =
\t\t{ anything here is ignored
\t\tinner = 3
\t}*
[ spaced name  ]
\tk = v
[\"quoted name\"]
\tk = w
[defaults]*
\tplain = second
",
        )
        .unwrap();
        assert_eq!(p.get_value(&["defaults", "plain"]), Some("value"));
        assert_eq!(
            p.get_values(&["defaults", "plain"]),
            vec!["value", "second"]
        );
        assert_eq!(
            p.get_value(&["defaults", "quoted"]),
            Some("a b\tc\\d\"e\nf\u{8}gq")
        );
        assert_eq!(p.get_value(&["defaults", "quoted tag"]), Some("x"));
        assert_eq!(p.get_value(&["defaults", "starred"]), Some("1"));
        assert_eq!(p.get_value(&["defaults", "nospace"]), Some("2"));
        assert_eq!(p.get_value(&["defaults", "sub", "inner"]), Some("3"));
        assert_eq!(p.get_value(&["spaced name", "k"]), Some("v"));
        assert_eq!(p.get_value(&["quoted name", "k"]), Some("w"));
        assert_eq!(
            p.section_names(),
            vec!["defaults", "quoted name", "spaced name"]
        );

        // Duplicate subsections are not merged: the first one wins.
        let p = Profile::parse("[fs_types]\n a = {\n  x = 1\n }\n a = {\n  x = 2\n  y = 3\n }\n")
            .unwrap();
        assert_eq!(p.get_value(&["fs_types", "a", "x"]), Some("1"));
        assert_eq!(p.get_value(&["fs_types", "a", "y"]), None);
        // CRLF line endings.
        let p = Profile::parse("[defaults]\r\n blocksize = 1024\r\n").unwrap();
        assert_eq!(p.get_value(&["defaults", "blocksize"]), Some("1024"));
        // Unterminated blocks at EOF are accepted.
        assert!(Profile::parse("[a]\n b = {\n c = 1\n").is_ok());
        assert!(Profile::parse("").is_ok());
    }

    #[test]
    fn syntax_errors() {
        use SyntaxErrorKind::*;
        assert_eq!(syntax_err("[defaults]\n\tfoo = a b\n"), (2, RelationSyntax));
        assert_eq!(
            syntax_err("# c\n\n[defaults]\n\tfeatures = a, b\n"),
            (4, RelationSyntax)
        );
        assert_eq!(
            syntax_err("[defaults]\n\tno equals sign\n"),
            (2, RelationSyntax)
        );
        assert_eq!(syntax_err("[defaults]\n\t= value\n"), (2, RelationSyntax));
        assert_eq!(
            syntax_err("[defaults]\n\tmy tag = value\n"),
            (2, RelationSyntax)
        );
        assert_eq!(syntax_err("[defaults]\n\tt = { x\n"), (2, RelationSyntax));
        assert_eq!(syntax_err("[defaults]\n}\n"), (2, ExtraCloseBrace));
        assert_eq!(
            syntax_err("[defaults]\n t =\n # no brace\n"),
            (3, MissingOpenBrace)
        );
        assert_eq!(syntax_err("[defaults]\n t = {\n [x]\n"), (3, SectionNotTop));
        assert_eq!(syntax_err("[defaults\n"), (1, SectionSyntax));
        assert_eq!(syntax_err("[]\n"), (1, SectionSyntax));
        assert_eq!(syntax_err("[a] b\n"), (1, SectionSyntax));
        assert_eq!(syntax_err("[\"a]b\"]\n"), (1, SectionSyntax));
        let e = Profile::parse("[a]\n x y\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Syntax error in mke2fs config file (<default>, line #2)\n\tSyntax error in profile relation"
        );
    }

    #[test]
    fn file_lines_are_fgets_chunks() {
        let long = format!("[defaults]\n\tk = {}\n", "a".repeat(3000));
        let p = Profile::parse(&long).unwrap();
        assert_eq!(p.get_value(&["defaults", "k"]).map(str::len), Some(3000));
        match Profile::parse_file_contents(long.as_bytes(), "f") {
            Err(ProfileError::Syntax { file, line, kind }) => {
                assert_eq!(
                    (file.as_str(), line, kind),
                    ("f", 3, SyntaxErrorKind::RelationSyntax)
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn loading() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.conf");
        let (p, src) = Profile::load_with(Some(missing.as_os_str())).unwrap();
        assert_eq!(src, ProfileSource::Builtin);
        assert_eq!(p, Profile::builtin());
        let (_, src) = Profile::load_with(Some(OsStr::new(""))).unwrap();
        assert_eq!(src, ProfileSource::Builtin);

        let file = dir.path().join("mke2fs.conf");
        std::fs::write(&file, DEBIAN_CONF).unwrap();
        let (p, src) = Profile::load_with(Some(file.as_os_str())).unwrap();
        assert_eq!(src, ProfileSource::File(file.clone()));
        assert_eq!(p, Profile::parse(DEBIAN_CONF).unwrap());

        let bad = dir.path().join("bad.conf");
        std::fs::write(&bad, "[defaults]\n\n\tx = 1 2\n").unwrap();
        match Profile::load_from(&bad) {
            Err(ProfileError::Syntax { file, line, kind }) => {
                assert_eq!(file, bad.display().to_string());
                assert_eq!(line, 3);
                assert_eq!(kind, SyntaxErrorKind::RelationSyntax);
            }
            other => panic!("{other:?}"),
        }

        // Directory: eligible files in name order, earlier ones win.
        let cdir = dir.path().join("conf.d");
        std::fs::create_dir(&cdir).unwrap();
        let (_, src) = Profile::load_from(&cdir).unwrap();
        assert_eq!(src, ProfileSource::Builtin);
        std::fs::write(cdir.join("b"), "[defaults]\n x = b\n y = b\n").unwrap();
        std::fs::write(cdir.join("a-1"), "[defaults]\n x = a\n").unwrap();
        std::fs::write(cdir.join("c.conf"), "[defaults]\n y = ignored\n").unwrap();
        let (p, src) = Profile::load_from(&cdir).unwrap();
        assert_eq!(
            src,
            ProfileSource::Directory {
                path: cdir.clone(),
                files: vec![cdir.join("a-1"), cdir.join("b")],
            }
        );
        assert_eq!(p.get_value(&["defaults", "x"]), Some("a"));
        assert_eq!(p.get_value(&["defaults", "y"]), Some("b"));
        assert_eq!(p.get_values(&["defaults", "x"]), vec!["a", "b"]);
        // A final section stops the search in later files.
        std::fs::write(cdir.join("a-1"), "[defaults]*\n x = a\n").unwrap();
        let (p, _) = Profile::load_from(&cdir).unwrap();
        assert_eq!(p.get_value(&["defaults", "y"]), None);
        assert_eq!(p.get_value(&["defaults", "x"]), Some("a"));
    }
}
