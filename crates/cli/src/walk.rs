//! A depth-first walk over a directory tree of an image, without
//! recursion (a deep tree cannot overflow the stack) and keeping the set
//! of directories it is inside: an entry that names one of them (a
//! damaged image's loop, e.g. `sub/self` → `sub`) is reported as
//! [`Step::Loop`] and never entered. Used by `rm -r`, `cp -r`/`cp -a` out
//! of an image and `ls -R`.

use std::collections::HashSet;

use ext4kit_fs::dir::Entry;
use ext4kit_fs::inode::InodeInfo;

/// One directory on the way down, or one entry met: its inode and its
/// name in its parent (empty for the walk's root).
pub struct Node {
    pub inode: InodeInfo,
    pub name: Vec<u8>,
}

/// What the walk meets, in order. `path` is the chain of directories
/// from the root to (and including) the current one.
pub enum Step<'a> {
    /// A directory, before its entries (the last of `path`).
    Enter(&'a [Node]),
    /// A non-directory entry of the last directory of `path`.
    Other(&'a [Node], &'a Node),
    /// A directory after its entries (the last of `path`).
    Leave(&'a [Node]),
    /// An entry of the last directory of `path` naming a directory the
    /// walk is inside (itself or an ancestor): not entered.
    Loop(&'a [Node], &'a Node),
}

/// The tree the walk reads.
pub trait Tree {
    type Err;
    /// The entries of the last directory of `path` ('.' and '..' are
    /// skipped by the walk).
    fn entries(&mut self, path: &[Node]) -> Result<Vec<Entry>, Self::Err>;
    /// The inode of entry `e` of the last directory of `path`; `None`
    /// skips the entry (the tree reported why).
    fn inode(&mut self, path: &[Node], e: &Entry) -> Result<Option<InodeInfo>, Self::Err>;
}

/// Walk the tree below directory `root` (named `name` in its parent),
/// calling `f` for every step; the first error ends the walk. `f`
/// returning `Ok(false)` on [`Step::Enter`] skips that directory's
/// entries (its [`Step::Leave`] still comes).
pub fn walk<T: Tree>(
    tree: &mut T,
    root: InodeInfo,
    name: Vec<u8>,
    f: &mut dyn FnMut(Step<'_>) -> Result<bool, T::Err>,
) -> Result<(), T::Err> {
    let mut path = vec![Node { inode: root, name }];
    let mut inside: HashSet<u32> = HashSet::from([path[0].inode.ino]);
    let mut pending: Vec<std::vec::IntoIter<Entry>> = Vec::new();
    let first = if f(Step::Enter(&path))? {
        tree.entries(&path)?
    } else {
        Vec::new()
    };
    pending.push(first.into_iter());
    while let Some(level) = pending.last_mut() {
        let Some(e) = level.next() else {
            pending.pop();
            f(Step::Leave(&path))?;
            if let Some(n) = path.pop() {
                inside.remove(&n.inode.ino);
            }
            continue;
        };
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let Some(inode) = tree.inode(&path, &e)? else {
            continue;
        };
        let node = Node {
            inode,
            name: e.name,
        };
        if !node.inode.is_dir() {
            f(Step::Other(&path, &node))?;
            continue;
        }
        if inside.contains(&node.inode.ino) {
            f(Step::Loop(&path, &node))?;
            continue;
        }
        inside.insert(node.inode.ino);
        path.push(node);
        let kids = if f(Step::Enter(&path))? {
            tree.entries(&path)?
        } else {
            Vec::new()
        };
        pending.push(kids.into_iter());
    }
    Ok(())
}

/// `spec` (the walk's root as the user named it) joined with the names
/// of `path` below the root and then `last`.
pub fn show(spec: &str, path: &[Node], last: Option<&[u8]>) -> String {
    let mut s = spec.to_string();
    for n in path.iter().skip(1).map(|n| &n.name[..]).chain(last) {
        if !s.ends_with('/') {
            s.push('/');
        }
        s.push_str(&String::from_utf8_lossy(n));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A tree in memory: directory inode -> entries.
    struct Mem(HashMap<u32, Vec<(&'static str, u32)>>);

    fn info(ino: u32, dir: bool) -> InodeInfo {
        let t = ext4kit_fs::inode::Timestamp::default();
        InodeInfo {
            ino,
            mode: if dir { 0o040755 } else { 0o100644 },
            uid: 0,
            gid: 0,
            size: 0,
            links: 1,
            flags: 0,
            generation: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: None,
            dtime: 0,
            blocks_512: 0,
            file_acl: 0,
            i_block: [0; 60],
            extra_isize: 0,
            version: 0,
            projid: 0,
            raw: Vec::new(),
        }
    }

    impl Tree for Mem {
        type Err = String;
        fn entries(&mut self, path: &[Node]) -> Result<Vec<Entry>, String> {
            let ino = path.last().map(|n| n.inode.ino).unwrap_or(0);
            Ok(self
                .0
                .get(&ino)
                .ok_or("no such directory")?
                .iter()
                .map(|&(n, i)| Entry {
                    ino: i,
                    name: n.as_bytes().to_vec(),
                    file_type: 0,
                })
                .collect())
        }
        fn inode(&mut self, _: &[Node], e: &Entry) -> Result<Option<InodeInfo>, String> {
            Ok(Some(info(e.ino, self.0.contains_key(&e.ino))))
        }
    }

    fn trace(m: &mut Mem) -> Vec<String> {
        let mut out = Vec::new();
        walk(m, info(2, true), Vec::new(), &mut |s| {
            out.push(match s {
                Step::Enter(p) => format!("enter {}", show("/", p, None)),
                Step::Other(p, n) => format!("file {}", show("/", p, Some(&n.name))),
                Step::Leave(p) => format!("leave {}", show("/", p, None)),
                Step::Loop(p, n) => format!("loop {}", show("/", p, Some(&n.name))),
            });
            Ok(true)
        })
        .unwrap();
        out
    }

    #[test]
    fn loops_are_reported_not_entered() {
        let mut m = Mem(HashMap::from([
            (2, vec![(".", 2), ("..", 2), ("d1", 12), ("f", 20)]),
            (12, vec![("sub", 13)]),
            (13, vec![("self", 13), ("up", 12), ("g", 21)]),
        ]));
        assert_eq!(
            trace(&mut m),
            [
                "enter /",
                "enter /d1",
                "enter /d1/sub",
                "loop /d1/sub/self",
                "loop /d1/sub/up",
                "file /d1/sub/g",
                "leave /d1/sub",
                "leave /d1",
                "file /f",
                "leave /",
            ]
        );
    }

    #[test]
    fn a_directory_linked_twice_is_no_loop() {
        let mut m = Mem(HashMap::from([
            (2, vec![("a", 12), ("b", 12)]),
            (12, vec![]),
        ]));
        assert_eq!(
            trace(&mut m),
            [
                "enter /", "enter /a", "leave /a", "enter /b", "leave /b", "leave /"
            ]
        );
    }

    #[test]
    fn deep_trees_need_no_stack() {
        let depth = 200_000u32;
        let mut dirs = HashMap::new();
        for i in 0..depth {
            dirs.insert(100 + i, vec![("d", 101 + i)]);
        }
        dirs.insert(100 + depth, vec![]);
        dirs.insert(2, vec![("d", 100)]);
        let mut n = 0;
        walk(&mut Mem(dirs), info(2, true), Vec::new(), &mut |s| {
            n += usize::from(matches!(s, Step::Leave(_)));
            Ok(true)
        })
        .unwrap();
        assert_eq!(n, depth as usize + 2);
    }
}
