//! `mkfs -d ARCHIVE`: a tar archive (plain, gzip, zstd or xz, told by
//! their magic bytes; `-` for stdin) read
//! once into the same [`Tree`] a directory gives, so that the populator
//! and the layout do not know where the tree came from.
//!
//! The archive is read in its own order, but the tree is built sorted
//! (names by their bytes, the preorder of [`super::source`]), so the
//! image does not depend on the order the archive lists its members in.
//! File data is copied to an unlinked temporary file (the spool) as it
//! streams by and read from there when the populator places it in tree
//! order: memory stays one node per name, the spool takes the data's
//! size on disk. Owners, modes, devices and times come from the archive,
//! never from the host: PAX `mtime`/`atime`/`ctime` with their fractions
//! when present, else the header's mtime for all three; xattrs from PAX
//! `SCHILY.xattr.*` records. Directories the archive implies but does not
//! list get mode 0755, owner 0:0 and time 0. A later member of the same
//! name replaces an earlier one (as tar extracts). Hard links (`1`
//! members) join their target's inode; the first name in tree order
//! holds it, as with a directory.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

use super::PopulateError;
use super::source::{Kind, Node, Time, Tree};

/// One member, before the tree is built.
struct Member {
    node: Node,
    /// Where it is, for messages: the archive's name and the member's.
    shown: PathBuf,
    /// A hard link: the target's path.
    link: Option<Vec<u8>>,
}

fn bad(path: &Path, what: impl Into<String>) -> PopulateError {
    PopulateError::Invalid {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Normalize a member name: no leading `/` or `./`, no `.` components,
/// no trailing `/`; `..` is refused. `None` for the root itself.
fn clean(name: &[u8]) -> Result<Option<Vec<u8>>, &'static str> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in name.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("a member name with '..'"),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.iter().any(|c| c.len() > 255) {
        return Err("a name longer than 255 bytes");
    }
    Ok(Some(parts.join(&b'/')))
}

fn pax_time(v: &[u8]) -> Option<Time> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = match s.split_once('.') {
        Some((a, b)) => (a, b),
        None => (s, ""),
    };
    let sec: i64 = sec.parse().ok()?;
    let mut ns = 0u32;
    for (k, c) in frac.bytes().take(9).enumerate() {
        if !c.is_ascii_digit() {
            return None;
        }
        ns += u32::from(c - b'0') * 10u32.pow(8 - k as u32);
    }
    // "-1.5" is 1.5 s before the epoch.
    if sec < 0 && ns > 0 {
        Some(Time {
            sec: sec - 1,
            nsec: 1_000_000_000 - ns,
        })
    } else {
        Some(Time { sec, nsec: ns })
    }
}

/// PAX records: `LEN key=value\n`, LEN counting the whole record.
fn parse_pax(d: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < d.len() {
        if d[at..].iter().all(|&b| b == 0) {
            break;
        }
        let sp = at + d[at..].iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&d[at..sp]).ok()?.parse().ok()?;
        let end = at.checked_add(len)?;
        if len == 0 || end > d.len() || d[end - 1] != b'\n' {
            return None;
        }
        let rec = &d[sp + 1..end - 1];
        let eq = rec.iter().position(|&b| b == b'=')?;
        out.push((rec[..eq].to_vec(), rec[eq + 1..].to_vec()));
        at = end;
    }
    Some(out)
}

/// The spool: an unlinked temporary file.
fn spool_file() -> Result<std::fs::File, PopulateError> {
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let p = dir.join(format!(".ext4kit-mkfs-d.{}.{nanos}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)
        .map_err(|e| super::source::io_err(&p, "cannot create the spool file", e))?;
    let _ = std::fs::remove_file(&p);
    Ok(f)
}

/// Read the archive `name` (a path, or `-` for stdin): plain, gzip, zstd
/// or xz, told apart by their first bytes.
pub fn scan_archive(name: &Path) -> Result<Tree, PopulateError> {
    let input: Box<dyn Read> = if name == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(name).map_err(|e| super::source::io_err(name, "cannot open", e))?,
        )
    };
    let mut input = std::io::BufReader::with_capacity(1 << 16, input);
    let head = {
        input
            .fill_buf()
            .map_err(|e| super::source::io_err(name, "cannot read", e))?
            .to_vec()
    };
    let reader: Box<dyn Read> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(input))
    } else if head.starts_with(&ZSTD_MAGIC)
        || (head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18])
    {
        // (or a skippable frame first: magic 0x184D2A5?, little-endian)
        Box::new(Zstd::new(input))
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        // Concatenated streams (`cat a.xz b.xz`, pixz) as xz reads them.
        Box::new(liblzma::read::XzDecoder::new_multi_decoder(input))
    } else {
        Box::new(input)
    };
    scan_tar(name, reader)
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// A zstd stream: frames one after another (as `zstd` writes them, or
/// `cat a.zst b.zst`), skippable frames skipped, each frame's content
/// checksum checked when it has one.
struct Zstd<R: BufRead> {
    src: R,
    dec: ruzstd::decoding::FrameDecoder,
    /// A frame is being decoded.
    in_frame: bool,
}

impl<R: BufRead> Zstd<R> {
    fn new(src: R) -> Self {
        Zstd {
            src,
            dec: ruzstd::decoding::FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use ruzstd::decoding::BlockDecodingStrategy;
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        use std::io::{Error, ErrorKind};
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.src.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.dec.reset(&mut self.src) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        let want = u64::from(length);
                        let got =
                            std::io::copy(&mut (&mut self.src).take(want), &mut std::io::sink())?;
                        if got < want {
                            return Err(Error::new(
                                ErrorKind::UnexpectedEof,
                                "zstd: truncated skippable frame",
                            ));
                        }
                        continue;
                    }
                    Err(e) => return Err(Error::new(ErrorKind::InvalidData, format!("zstd: {e}"))),
                }
            }
            while self.dec.can_collect() < buf.len() && !self.dec.is_finished() {
                let need = buf.len() - self.dec.can_collect();
                self.dec
                    .decode_blocks(&mut self.src, BlockDecodingStrategy::UptoBytes(need))
                    .map_err(|e| Error::new(ErrorKind::InvalidData, format!("zstd: {e}")))?;
            }
            let n = self.dec.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.dec.is_finished() {
                if let (Some(want), Some(got)) = (
                    self.dec.get_checksum_from_data(),
                    self.dec.get_calculated_checksum(),
                ) && want != got
                {
                    return Err(Error::new(
                        ErrorKind::InvalidData,
                        "zstd: content checksum mismatch (corrupt archive)",
                    ));
                }
                self.in_frame = false;
            }
        }
    }
}

/// Read a tar stream into a tree (see the module docs).
pub fn scan_tar(name: &Path, reader: impl Read) -> Result<Tree, PopulateError> {
    let mut spool = spool_file()?;
    let mut spooled = 0u64;
    let mut members: BTreeMap<Vec<u8>, Member> = BTreeMap::new();
    let mut root: Option<Node> = None;
    let mut ar = tar::Archive::new(reader);
    let corrupt = |e: std::io::Error| bad(name, format!("not a readable tar archive: {e}"));
    // Raw entries: PAX and GNU long-name members are read here (the tar
    // crate's own PAX parser splits records at newlines, which breaks
    // binary xattr values).
    let entries = ar.entries().map_err(corrupt)?.raw(true);
    let mut buf = vec![0u8; 1 << 16];
    let mut pax: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    for e in entries {
        let mut e = e.map_err(corrupt)?;
        let et = e.header().entry_type();
        match et {
            tar::EntryType::XHeader => {
                let mut d = Vec::new();
                e.read_to_end(&mut d).map_err(corrupt)?;
                pax = parse_pax(&d).ok_or_else(|| bad(name, "a malformed PAX header"))?;
                continue;
            }
            tar::EntryType::XGlobalHeader => continue,
            tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
                let mut d = Vec::new();
                e.read_to_end(&mut d).map_err(corrupt)?;
                while d.last() == Some(&0) {
                    d.pop();
                }
                if et == tar::EntryType::GNULongName {
                    long_name = Some(d);
                } else {
                    long_link = Some(d);
                }
                continue;
            }
            _ => {}
        }
        let pax_get = |k: &[u8]| pax.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        let raw = pax_get(b"path")
            .or(long_name.take())
            .unwrap_or_else(|| e.path_bytes().into_owned());
        let link_name = pax_get(b"linkpath")
            .or(long_link.take())
            .or_else(|| e.link_name_bytes().map(|t| t.into_owned()));
        let shown = name.join(String::from_utf8_lossy(&raw).as_ref());
        let path = match clean(&raw) {
            Ok(p) => p,
            Err(w) => return Err(bad(&shown, w)),
        };
        let h = e.header().clone();
        let kind = match et {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::File,
            tar::EntryType::Char => Kind::Char,
            tar::EntryType::Block => Kind::Block,
            tar::EntryType::Fifo => Kind::Fifo,
            _ => {
                return Err(PopulateError::Unsupported {
                    path: shown,
                    what: format!("tar member type {:?}", et.as_byte() as char),
                });
            }
        };
        let num = |r: std::io::Result<u64>, what: &str| {
            r.map_err(|err| bad(&shown, format!("bad {what} in the header: {err}")))
        };
        let pax_num =
            |k: &[u8]| pax_get(k).and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok());
        let mode = num(h.mode().map(u64::from), "mode")? as u16 & 0o7777;
        let uid = match pax_num(b"uid") {
            Some(u) => u as u32,
            None => num(h.uid(), "uid")? as u32,
        };
        let gid = match pax_num(b"gid") {
            Some(g) => g as u32,
            None => num(h.gid(), "gid")? as u32,
        };
        if pax_num(b"size").is_some_and(|sz| sz != e.size()) {
            return Err(PopulateError::Unsupported {
                path: shown,
                what: "a PAX size other than the header's (members over 8 GiB)".into(),
            });
        }
        let mtime = Time {
            sec: num(h.mtime(), "mtime")? as i64,
            nsec: 0,
        };
        let mt = pax_get(b"mtime").and_then(|v| pax_time(&v));
        let at = pax_get(b"atime").and_then(|v| pax_time(&v));
        let ct = pax_get(b"ctime").and_then(|v| pax_time(&v));
        let mut xattrs: Vec<(Vec<u8>, Vec<u8>)> = pax
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(b"SCHILY.xattr.")
                    .map(|n| (n.to_vec(), v.clone()))
            })
            .collect();
        xattrs.sort();
        pax.clear();
        let mtime = mt.unwrap_or(mtime);
        let target = if kind == Kind::Symlink {
            link_name
                .clone()
                .ok_or_else(|| bad(&shown, "a symlink without a target"))?
        } else {
            Vec::new()
        };
        let link = if et == tar::EntryType::Link {
            let t = link_name
                .clone()
                .ok_or_else(|| bad(&shown, "a hard link without a target"))?;
            match clean(&t) {
                Ok(Some(t)) => Some(t),
                _ => return Err(bad(&shown, "a hard link to a bad name")),
            }
        } else {
            None
        };
        let rdev = if matches!(kind, Kind::Char | Kind::Block) {
            let ma = num(h.device_major().map(|m| u64::from(m.unwrap_or(0))), "major")?;
            let mi = num(h.device_minor().map(|m| u64::from(m.unwrap_or(0))), "minor")?;
            // glibc's gnu_dev_makedev.
            (mi & 0xff) | ((ma & 0xfff) << 8) | ((mi & !0xff) << 12) | ((ma & !0xfff) << 32)
        } else {
            0
        };
        let mut data = None;
        let mut size = if kind == Kind::Symlink {
            target.len() as u64
        } else {
            0
        };
        if kind == Kind::File && link.is_none() {
            let len = e.size();
            let off = spooled;
            let mut left = len;
            while left > 0 {
                let n = (left as usize).min(buf.len());
                e.read_exact(&mut buf[..n])
                    .map_err(|err| bad(&shown, format!("truncated archive: {err}")))?;
                spool
                    .write_all(&buf[..n])
                    .map_err(|err| super::source::io_err(name, "cannot write the spool", err))?;
                left -= n as u64;
            }
            spooled += len;
            data = Some((off, len));
            size = len;
        }
        let node = Node {
            name: Vec::new(),
            parent: 0,
            kind,
            perm: mode,
            uid,
            gid,
            atime: at.unwrap_or(mtime),
            mtime,
            ctime: ct.unwrap_or(mtime),
            size,
            rdev,
            xattrs,
            target,
            children: Vec::new(),
            link_to: None,
            nlink: 1,
            subdirs: 0,
            spooled: data,
        };
        match path {
            None => {
                if kind != Kind::Dir {
                    return Err(bad(&shown, "the archive's root is not a directory"));
                }
                root = Some(node);
            }
            Some(p) => {
                members.insert(p, Member { node, shown, link });
            }
        }
    }
    // Read on to the end of the stream, so that a compressed archive's
    // trailing checksum is checked (and a corrupt tail is an error).
    std::io::copy(&mut ar.into_inner(), &mut std::io::sink()).map_err(corrupt)?;
    spool
        .flush()
        .map_err(|e| super::source::io_err(name, "cannot write the spool", e))?;
    build(name, root, members, spool)
}

fn implied_dir() -> Node {
    let t = Time { sec: 0, nsec: 0 };
    Node {
        name: Vec::new(),
        parent: 0,
        kind: Kind::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
        atime: t,
        mtime: t,
        ctime: t,
        size: 0,
        rdev: 0,
        xattrs: Vec::new(),
        target: Vec::new(),
        children: Vec::new(),
        link_to: None,
        nlink: 1,
        subdirs: 0,
        spooled: None,
    }
}

/// The sorted preorder tree of the members.
fn build(
    name: &Path,
    root: Option<Node>,
    mut members: BTreeMap<Vec<u8>, Member>,
    spool: std::fs::File,
) -> Result<Tree, PopulateError> {
    // Implied parents.
    let mut implied = Vec::new();
    for p in members.keys() {
        let mut q: &[u8] = p;
        while let Some(i) = q.iter().rposition(|&b| b == b'/') {
            q = &q[..i];
            match members.get(q) {
                Some(m) if m.node.kind != Kind::Dir => {
                    return Err(bad(
                        &m.shown,
                        "a member is inside it, but it is no directory",
                    ));
                }
                Some(_) => {}
                None => implied.push(q.to_vec()),
            }
        }
    }
    for q in implied {
        let shown = name.join(String::from_utf8_lossy(&q).as_ref());
        members.entry(q).or_insert(Member {
            node: implied_dir(),
            shown,
            link: None,
        });
    }
    // Children of each directory, sorted by name.
    let mut kids: HashMap<Vec<u8>, Vec<Vec<u8>>> = HashMap::new();
    for p in members.keys() {
        let parent = match p.iter().rposition(|&b| b == b'/') {
            Some(i) => p[..i].to_vec(),
            None => Vec::new(),
        };
        kids.entry(parent).or_default().push(p.clone());
    }
    for v in kids.values_mut() {
        v.sort_by(|a, b| leaf(a).cmp(leaf(b)));
    }
    let mut tree = Tree {
        nodes: Vec::new(),
        root: name.to_path_buf(),
        spool: Some(std::sync::Arc::new(spool)),
    };
    let mut r = root.unwrap_or_else(implied_dir);
    r.name.clear();
    tree.nodes.push(r);
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    // Preorder with an explicit stack of (node, its children, next).
    let mut stack: Vec<(usize, Vec<Vec<u8>>, usize)> =
        vec![(0, kids.remove(&Vec::new()).unwrap_or_default(), 0)];
    while let Some((dir, list, next)) = stack.last_mut() {
        let dir = *dir;
        if *next == list.len() {
            stack.pop();
            continue;
        }
        let p = std::mem::take(&mut list[*next]);
        *next += 1;
        let Some(m) = members.remove(&p) else {
            continue;
        };
        let mut n = m.node;
        n.name = leaf(&p).to_vec();
        n.parent = dir;
        let idx = tree.nodes.len();
        let is_dir = n.kind == Kind::Dir;
        tree.nodes.push(n);
        tree.nodes[dir].children.push(idx);
        index.insert(p.clone(), idx);
        if let Some(t) = m.link {
            // Resolved after the walk (the target may come later).
            tree.nodes[idx].target = t;
            tree.nodes[idx].link_to = Some(usize::MAX);
        }
        if is_dir {
            tree.nodes[dir].subdirs += 1;
            let list = kids.remove(&p).unwrap_or_default();
            stack.push((idx, list, 0));
        }
    }
    resolve_links(&mut tree, &index)?;
    Ok(tree)
}

fn leaf(p: &[u8]) -> &[u8] {
    match p.iter().rposition(|&b| b == b'/') {
        Some(i) => &p[i + 1..],
        None => p,
    }
}

/// Hard links: every name of a group points at the group's first name in
/// tree order, which takes the metadata of the member that had the data.
fn resolve_links(tree: &mut Tree, index: &HashMap<Vec<u8>, usize>) -> Result<(), PopulateError> {
    let n = tree.nodes.len();
    // Each link's data-holding member (following link chains).
    let mut owner: Vec<usize> = (0..n).collect();
    for (k, o) in owner.iter_mut().enumerate() {
        if tree.nodes[k].link_to.is_none() {
            continue;
        }
        let mut cur = k;
        let mut hops = 0;
        while tree.nodes[cur].link_to.is_some() {
            let t = &tree.nodes[cur].target;
            let Some(&next) = index.get(t) else {
                return Err(bad(
                    &tree.path(k),
                    "a hard link to a name not in the archive",
                ));
            };
            if tree.nodes[next].kind == Kind::Dir {
                return Err(bad(&tree.path(k), "a hard link to a directory"));
            }
            cur = next;
            hops += 1;
            if hops > n {
                return Err(bad(&tree.path(k), "a loop of hard links"));
            }
        }
        *o = cur;
    }
    // Groups by owner; the first name in tree order holds the inode.
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, &o) in owner.iter().enumerate() {
        if o != k {
            groups.entry(o).or_insert_with(|| vec![o]).push(k);
        }
    }
    for (o, mut ks) in groups {
        ks.sort_unstable();
        let head = ks[0];
        if head != o {
            // The head takes the owner's inode data.
            let src = tree.nodes[o].clone();
            let h = &mut tree.nodes[head];
            let (name, parent, children) =
                (h.name.clone(), h.parent, std::mem::take(&mut h.children));
            *h = src;
            h.name = name;
            h.parent = parent;
            h.children = children;
        }
        tree.nodes[head].link_to = None;
        tree.nodes[head].nlink = ks.len() as u32;
        let kind = tree.nodes[head].kind;
        for &k in &ks[1..] {
            tree.nodes[k].link_to = Some(head);
            tree.nodes[k].target.clear();
            tree.nodes[k].kind = kind;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_frames_one_after_another() {
        use ruzstd::encoding::{CompressionLevel, compress_to_vec};
        let a = compress_to_vec(&b"hello, "[..], CompressionLevel::Fastest);
        let b = compress_to_vec(&vec![7u8; 100_000][..], CompressionLevel::Fastest);
        // A skippable frame (magic 0x184D2A53, 3 bytes) between them.
        let skip = [0x53, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3];
        let all = [a.clone(), skip.to_vec(), b].concat();
        let mut out = Vec::new();
        Zstd::new(&all[..]).read_to_end(&mut out).unwrap();
        assert_eq!(&out[..7], b"hello, ");
        assert_eq!(out.len(), 100_007);
        assert!(out[7..].iter().all(|&x| x == 7));
        // Cut short: an error, not a short read.
        let cut = &all[..all.len() - 5];
        assert!(Zstd::new(cut).read_to_end(&mut Vec::new()).is_err());
        // Not zstd after the first frame: an error.
        let junk = [a, b"junk".to_vec()].concat();
        assert!(Zstd::new(&junk[..]).read_to_end(&mut Vec::new()).is_err());
    }

    #[test]
    fn names_are_cleaned() {
        assert_eq!(clean(b"./a//b/"), Ok(Some(b"a/b".to_vec())));
        assert_eq!(clean(b"/x"), Ok(Some(b"x".to_vec())));
        assert_eq!(clean(b"."), Ok(None));
        assert_eq!(clean(b"./"), Ok(None));
        assert!(clean(b"a/../b").is_err());
        assert!(clean(&[b'n'; 256]).is_err());
    }

    #[test]
    fn pax_records_with_binary_values() {
        // A value with a newline inside: the length decides, not '\n'.
        let v = b"a\nb";
        let rec = |k: &[u8], v: &[u8]| {
            let body = [k, b"=", v, b"\n"].concat();
            let mut n = body.len() + 2;
            if (n.to_string().len() + 1 + body.len()) != n {
                n = n.to_string().len() + 1 + body.len();
            }
            [n.to_string().into_bytes(), b" ".to_vec(), body].concat()
        };
        let d = [
            rec(b"SCHILY.xattr.user.k", v),
            rec(b"mtime", b"1.5"),
            vec![0; 20],
        ]
        .concat();
        let p = parse_pax(&d).expect("parses");
        assert_eq!(p[0], (b"SCHILY.xattr.user.k".to_vec(), v.to_vec()));
        assert_eq!(p[1].1, b"1.5");
        assert!(parse_pax(b"99 mtime=1\n").is_none());
        assert!(parse_pax(b"x mtime=1\n").is_none());
    }

    #[test]
    fn pax_times() {
        assert_eq!(
            pax_time(b"981173106.123456789"),
            Some(Time {
                sec: 981_173_106,
                nsec: 123_456_789
            })
        );
        assert_eq!(pax_time(b"5"), Some(Time { sec: 5, nsec: 0 }));
        assert_eq!(
            pax_time(b"-1.25"),
            Some(Time {
                sec: -2,
                nsec: 750_000_000
            })
        );
        assert_eq!(pax_time(b"1.x"), None);
    }
}
