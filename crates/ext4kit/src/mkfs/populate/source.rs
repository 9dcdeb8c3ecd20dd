//! The source tree of `mkfs -d DIRECTORY`: one scan of the host
//! directory into a list of nodes in the order they become inodes.
//!
//! Entries are sorted by their name's bytes (mke2fs 1.47's `scandir` with
//! `alphasort` in the C locale), so the result does not depend on the
//! order the host directory lists them in. The list is the preorder of
//! that sorted tree: a directory, then its entries, each directory's
//! subtree before the next entry, which is the order mke2fs's
//! `__populate_fs` creates (and numbers) inodes in. A hard link (a
//! non-directory whose `(st_dev, st_ino)` was seen before) becomes a
//! name for the first node of its group, not a node of its own.
//!
//! Memory is one [`Node`] per name (names, metadata and xattrs), not the
//! data: file contents are read when they are written.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::PopulateError;

/// What a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Char,
    Block,
    Fifo,
    Socket,
}

/// A timestamp: seconds since the epoch and nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

/// One name of the tree and, unless it is a hard link, its inode.
#[derive(Clone, Debug)]
pub struct Node {
    /// The entry's name (empty for the root); its path is
    /// [`Tree::path`] (not kept per node).
    pub name: Vec<u8>,
    /// The parent node (the root is its own parent).
    pub parent: usize,
    pub kind: Kind,
    /// Permission bits with setuid, setgid and sticky (`st_mode & 07777`).
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    /// `st_size` (the symlink target's length for symlinks).
    pub size: u64,
    /// `st_rdev` of devices.
    pub rdev: u64,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// A symlink's target.
    pub target: Vec<u8>,
    /// The entries of a directory, sorted by name.
    pub children: Vec<usize>,
    /// A hard link: the node holding the inode.
    pub link_to: Option<usize>,
    /// Names of this inode in the tree (hard links included).
    pub nlink: u32,
    /// Subdirectories (for a directory's link count).
    pub subdirs: u32,
    /// An archive member's data: (offset, length) in the tree's spool
    /// file (`None`: read the host file at `path`).
    pub spooled: Option<(u64, u64)>,
}

impl Node {
    /// Directory entry file type.
    pub fn file_type(&self) -> u8 {
        use ext4kit_format::dir::*;
        match self.kind {
            Kind::Dir => FT_DIR,
            Kind::File => FT_REG_FILE,
            Kind::Symlink => FT_SYMLINK,
            Kind::Char => FT_CHRDEV,
            Kind::Block => FT_BLKDEV,
            Kind::Fifo => FT_FIFO,
            Kind::Socket => FT_SOCK,
        }
    }
}

/// The scanned tree: `nodes[0]` is the root, the rest in creation order.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub nodes: Vec<Node>,
    /// The source: the directory, or the archive's name (for messages).
    pub root: PathBuf,
    /// Where an archive's file data was copied (unlinked temporary file).
    pub spool: Option<std::sync::Arc<std::fs::File>>,
}

impl Tree {
    /// Where node `k` is: the source joined with the names from the
    /// root down to it.
    pub fn path(&self, k: usize) -> PathBuf {
        let mut names = Vec::new();
        let mut c = k;
        while c != 0 && c < self.nodes.len() && names.len() < self.nodes.len() {
            names.push(&self.nodes[c].name);
            c = self.nodes[c].parent;
        }
        let mut p = self.root.clone();
        for n in names.iter().rev() {
            p.push(OsStr::from_bytes(n));
        }
        p
    }

    /// What a populate's progress runs up to: the inodes (names that are
    /// not hard links to an earlier one) and the bytes of their files.
    pub fn totals(&self) -> (u64, u64) {
        let mut inodes = 0u64;
        let mut bytes = 0u64;
        for n in self.nodes.iter().filter(|n| n.link_to.is_none()) {
            inodes += 1;
            if n.kind == Kind::File {
                bytes += n.size;
            }
        }
        (inodes, bytes)
    }
}

pub(super) fn io_err(path: &Path, what: &str, e: std::io::Error) -> PopulateError {
    PopulateError::Source {
        path: path.to_path_buf(),
        what: format!("{what}: {e}"),
    }
}

fn time(sec: i64, nsec: i64) -> Time {
    Time {
        sec,
        nsec: nsec.clamp(0, 999_999_999) as u32,
    }
}

/// The node of `path` and its `lstat`.
fn node_of(
    path: &Path,
    name: &[u8],
    parent: usize,
) -> Result<(Node, std::fs::Metadata), PopulateError> {
    let md = std::fs::symlink_metadata(path).map_err(|e| io_err(path, "cannot stat", e))?;
    let ft = md.file_type();
    let kind = if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_char_device() {
        Kind::Char
    } else if ft.is_block_device() {
        Kind::Block
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_socket() {
        Kind::Socket
    } else {
        return Err(PopulateError::Unsupported {
            path: path.to_path_buf(),
            what: "file type".into(),
        });
    };
    let target = if kind == Kind::Symlink {
        std::fs::read_link(path)
            .map_err(|e| io_err(path, "cannot read the symlink", e))?
            .as_os_str()
            .as_bytes()
            .to_vec()
    } else {
        Vec::new()
    };
    let mut xattrs =
        ext4kit_device::host::xattrs(path).map_err(|e| io_err(path, "cannot list xattrs", e))?;
    xattrs.sort();
    let node = Node {
        name: name.to_vec(),
        parent,
        kind,
        perm: (md.mode() & 0o7777) as u16,
        uid: md.uid(),
        gid: md.gid(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime: time(md.mtime(), md.mtime_nsec()),
        ctime: time(md.ctime(), md.ctime_nsec()),
        size: if kind == Kind::Symlink {
            target.len() as u64
        } else {
            md.size()
        },
        rdev: md.rdev(),
        xattrs,
        target,
        children: Vec::new(),
        link_to: None,
        nlink: 1,
        subdirs: 0,
        spooled: None,
    };
    Ok((node, md))
}

/// Scan the directory `root` (which must be a directory).
pub fn scan(root: &Path) -> Result<Tree, PopulateError> {
    let mut tree = Tree {
        root: root.to_path_buf(),
        ..Tree::default()
    };
    let (r, _) = node_of(root, b"", 0)?;
    if r.kind != Kind::Dir {
        return Err(PopulateError::Source {
            path: root.to_path_buf(),
            what: "not a directory".into(),
        });
    }
    tree.nodes.push(r);
    let mut links: HashMap<(u64, u64), usize> = HashMap::new();
    // Preorder: a stack of (directory node, its path, its sorted entry
    // names, next).
    let mut stack: Vec<(usize, PathBuf, Vec<Vec<u8>>, usize)> =
        vec![(0, root.to_path_buf(), sorted_names(root)?, 0)];
    while let Some((dir, dpath, names, next)) = stack.last_mut() {
        let dir = *dir;
        if *next == names.len() {
            stack.pop();
            continue;
        }
        let name = std::mem::take(&mut names[*next]);
        *next += 1;
        let path = dpath.join(OsStr::from_bytes(&name));
        let (mut n, md) = node_of(&path, &name, dir)?;
        let idx = tree.nodes.len();
        if n.kind != Kind::Dir && md.nlink() > 1 {
            match links.get(&(md.dev(), md.ino())) {
                Some(&first) => {
                    n.link_to = Some(first);
                    tree.nodes[first].nlink += 1;
                }
                None => {
                    links.insert((md.dev(), md.ino()), idx);
                }
            }
        }
        let is_dir = n.kind == Kind::Dir;
        tree.nodes.push(n);
        tree.nodes[dir].children.push(idx);
        if is_dir {
            tree.nodes[dir].subdirs += 1;
            let names = sorted_names(&path)?;
            stack.push((idx, path, names, 0));
        }
    }
    Ok(tree)
}

fn sorted_names(dir: &Path) -> Result<Vec<Vec<u8>>, PopulateError> {
    let rd = std::fs::read_dir(dir).map_err(|e| io_err(dir, "cannot read the directory", e))?;
    let mut names = Vec::new();
    for e in rd {
        let e = e.map_err(|e| io_err(dir, "cannot read the directory", e))?;
        names.push(e.file_name().as_bytes().to_vec());
    }
    names.sort();
    Ok(names)
}
