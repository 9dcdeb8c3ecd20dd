//! Path resolution from the root: `.`/`..` through the directories' own
//! entries, symbolic links followed in the middle of a path (and at its end
//! when asked), relative to the directory that holds them, at most
//! [`MAX_SYMLINKS`] of them per lookup (ELOOP beyond).

use ext4kit_format::inode::ROOT_INO;

use crate::FsError;
use crate::inode::InodeInfo;
use crate::sb::Fs;

/// The kernel's `MAXSYMLINKS`.
pub const MAX_SYMLINKS: u32 = 40;

impl Fs<'_> {
    /// The root directory.
    pub fn root(&self) -> Result<InodeInfo, FsError> {
        let r = self.inode(ROOT_INO)?;
        if !r.is_dir() {
            return Err(FsError::corrupt(
                "root directory",
                "inode 2 is not a directory",
            ));
        }
        Ok(r)
    }

    /// Resolve `path` (absolute or relative to the root). With `follow`,
    /// a symlink as the last component is followed too; a trailing `/`
    /// always follows and demands a directory.
    pub fn resolve(&self, path: &[u8], follow: bool) -> Result<InodeInfo, FsError> {
        let trailing_slash = path.len() > 1 && path.ends_with(b"/");
        let follow = follow || trailing_slash;
        let mut pending: Vec<Vec<u8>> = Vec::new();
        push_components(&mut pending, path);
        let mut cur = self.root()?;
        let mut links = 0u32;
        while let Some(comp) = pending.pop() {
            if !cur.is_dir() {
                return Err(FsError::NotADirectory);
            }
            if comp == b"." {
                continue;
            }
            let entry = self.lookup(&cur, &comp)?.ok_or(FsError::NotFound)?;
            let next = self.inode(entry.ino)?;
            if next.is_symlink() && (follow || !pending.is_empty()) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(FsError::SymlinkLoop);
                }
                let target = self.read_link(&next)?;
                if target.starts_with(b"/") {
                    cur = self.root()?;
                }
                push_components(&mut pending, &target);
                continue;
            }
            cur = next;
        }
        if trailing_slash && !cur.is_dir() {
            return Err(FsError::NotADirectory);
        }
        Ok(cur)
    }
}

/// Push the components of `path` so that the first is popped first.
fn push_components(stack: &mut Vec<Vec<u8>>, path: &[u8]) {
    let comps: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty())
        .collect();
    for c in comps.into_iter().rev() {
        stack.push(c.to_vec());
    }
}
