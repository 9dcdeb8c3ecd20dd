//! Corrupt metadata never panics, never hangs: a seeded mutation campaign
//! over a small image (inode table, extent blocks, directory blocks with
//! the htree root, an xattr block, bitmaps, the descriptor block, the
//! journal superblock). Each case flips a few bytes of one metadata block,
//! then opens the image read-write, walks the whole tree (readdir, stat,
//! read, readlink, xattrs) and runs a few writes (create, write, unlink,
//! rename, setxattr, truncate, mkdir), under a time bound. Every error is
//! one line; when an operation met corruption, the image records it
//! (error state and count in the superblock). `EXT4KIT_FUZZ_WRITES=N`
//! runs N cases (default 48), `EXT4KIT_FUZZ_SEED=S` another seed.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use ext4kit_device::{Device, MemDevice};
use ext4kit_format::Csum;
use ext4kit_format::inode::{self, S_IFREG};
use ext4kit_format::superblock::{STATE_ERROR, SUPERBLOCK_OFFSET, Superblock};
use ext4kit_fs::FsError;
use ext4kit_fs::fs::{Filesystem, NewInode, RenameFlags};
use ext4kit_fs::rw::{ErrorBehavior, RwOptions};
use ext4kit_fs::xattr_write::SetMode;

fn name(i: usize) -> Vec<u8> {
    format!("entry-with-a-longish-name-{i:04}").into_bytes()
}

/// The base image (1 KiB blocks) and its metadata blocks worth corrupting.
fn base(
    dir: &std::path::Path,
    img_name: &str,
    extra: &[&str],
) -> (Vec<u8>, Vec<(&'static str, u64)>, Reseal) {
    let mut args = vec!["-b", "1024", "-N", "1024"];
    args.extend_from_slice(extra);
    let img = mkimg(dir, img_name, "8M", &args);
    let fs = Filesystem::open(open_file(&img), RwOptions::default()).unwrap();
    let reg = NewInode::new(S_IFREG | 0o644, 0, 0);
    let dirs = NewInode::new(ext4kit_format::inode::S_IFDIR | 0o755, 0, 0);
    let (d, _) = fs.mkdir(2, b"d", &dirs).unwrap();
    for i in 0..120 {
        fs.create(d.ino, &name(i), &reg).unwrap();
    }
    let (f0, _) = fs.create(2, b"f0", &reg).unwrap();
    let (f1, _) = fs.create(2, b"f1", &reg).unwrap();
    for k in 0..14u64 {
        fs.write_at(f0.ino, k * 2048, &[k as u8 + 1; 1024]).unwrap();
        fs.write_at(f1.ino, k * 2048, &[k as u8 + 7; 1024]).unwrap();
    }
    // A two-level htree (long names: few per leaf) and a depth-2 extent
    // tree (more than 4 leaves of 84 extents).
    let (h, _) = fs.mkdir(2, b"h", &dirs).unwrap();
    for i in 0..420 {
        let mut n = name(i);
        n.resize(200, b'x');
        fs.create(h.ino, &n, &reg).unwrap();
    }
    let (f2, _) = fs.create(2, b"f2", &reg).unwrap();
    let (f3, _) = fs.create(2, b"f3", &reg).unwrap();
    for k in 0..350u64 {
        fs.write_at(f2.ino, k * 2048, &[k as u8; 1024]).unwrap();
        fs.write_at(f3.ino, k * 2048, &[k as u8; 1024]).unwrap();
    }
    let (x, _) = fs.create(2, b"x", &reg).unwrap();
    fs.set_xattr(x.ino, b"user.big", Some(&[b'v'; 400]), SetMode::Any)
        .unwrap();
    let (s, _) = fs.create(2, b"small", &reg).unwrap();
    fs.write_at(s.ino, 0, &[b's'; 3000]).unwrap();
    fs.symlink(2, b"link", b"d/entry-with-a-longish-name-0001", &reg)
        .unwrap();
    let mut targets: Vec<(&'static str, u64)> = Vec::new();
    let mut reseal = fs.read(|f| Reseal {
        csum: f.info.csum,
        itable: f.group_desc(0).unwrap().inode_table(),
        inode_size: u64::from(f.info.inode_size),
        owners: HashMap::new(),
    });
    let mut itable = HashSet::new();
    for ino in [2, 8, d.ino, f0.ino, f1.ino, x.ino, s.ino, h.ino, f2.ino] {
        itable.insert(fs.inode_location(ino).unwrap().0);
    }
    targets.extend(itable.into_iter().map(|b| ("inode table", b)));
    for ino in [f0.ino, f1.ino, f2.ino] {
        let i = fs.inode(ino).unwrap();
        let (_, nodes) = fs.read(|f| f.extent_tree(&i)).unwrap();
        if ino == f2.ino {
            assert!(nodes.iter().any(|n| n.depth == 2), "f2: depth 2");
        }
        for n in &nodes {
            reseal.owners.insert(n.pblk, (i.ino, i.generation));
        }
        targets.extend(
            nodes
                .iter()
                .filter(|n| n.pblk != 0)
                .map(|n| ("extent block", n.pblk)),
        );
    }
    for ino in [d.ino, 2, h.ino] {
        let i = fs.inode(ino).unwrap();
        assert!(ino == 2 || i.is_htree(), "an htree");
        if ino == h.ino {
            let levels = fs.read(|f| f.htree_levels(&i)).unwrap();
            assert_eq!(levels, Some(2), "h: two index levels");
        }
        for m in fs.read(|f| f.file_map(&i)).unwrap() {
            for b in m.pblk..m.pblk + u64::from(m.len) {
                reseal.owners.insert(b, (i.ino, i.generation));
            }
            targets.extend((m.pblk..m.pblk + u64::from(m.len)).map(|b| {
                let root = ino == d.ino && b == m.pblk && m.lblk == 0;
                (
                    if root {
                        "htree root"
                    } else {
                        "directory block"
                    },
                    b,
                )
            }));
        }
    }
    let xi = fs.inode(x.ino).unwrap();
    assert_ne!(xi.file_acl, 0, "x has an xattr block");
    targets.push(("xattr block", xi.file_acl));
    let (bb, ib, first) = fs.read(|f| {
        let g = f.group_desc(0).unwrap();
        (g.block_bitmap(), g.inode_bitmap(), f.info.first_data_block)
    });
    targets.push(("block bitmap", bb));
    targets.push(("inode bitmap", ib));
    targets.push(("descriptor block", first + 1));
    let j = fs.inode(8).unwrap();
    let jm = fs.read(|f| f.file_map(&j)).unwrap();
    targets.push(("journal superblock", jm[0].pblk));
    fs.close().unwrap();
    e2fsck_clean(&img).unwrap();
    (std::fs::read(&img).unwrap(), targets, reseal)
}

/// What it takes to make a mutated block's checksum right again, so that
/// the structure checks behind the checksum are reached.
struct Reseal {
    csum: Csum,
    itable: u64,
    inode_size: u64,
    /// Extent and directory blocks: (owner inode, generation).
    owners: HashMap<u64, (u32, u32)>,
}

impl Reseal {
    /// Recompute the checksum of block `blk` (a `what`) on `dev` where
    /// it was right in `base`; other kinds are left as they are.
    fn apply(&self, base: &MemDevice, dev: &MemDevice, what: &str, blk: u64) {
        let bs = 1024usize;
        let mut old = vec![0u8; bs];
        base.read_at(&mut old, blk * 1024).unwrap();
        let mut b = vec![0u8; bs];
        dev.read_at(&mut b, blk * 1024).unwrap();
        let owner = self.owners.get(&blk).copied();
        match what {
            "inode table" => {
                let isz = self.inode_size as usize;
                for k in 0..bs / isz {
                    let ino = ((blk - self.itable) as usize * (bs / isz) + k + 1) as u32;
                    let slot = k * isz..(k + 1) * isz;
                    if b[slot.clone()] != old[slot.clone()]
                        && inode::checksum_ok(&old[slot.clone()], ino, &self.csum)
                    {
                        inode::set_checksum(&mut b[slot], ino, &self.csum);
                    }
                }
            }
            "extent block" => {
                if let Some((ino, g)) = owner {
                    ext4kit_format::extent::set_block_checksum(&mut b, ino, g, &self.csum);
                }
            }
            "directory block" | "htree root" => {
                // Leaves with a checksum tail (fake entry: rec_len 12,
                // file type 0xDE); index nodes are left alone.
                let t = bs - 12;
                let has_tail =
                    old[t..t + 4] == [0; 4] && old[t + 4..t + 6] == [12, 0] && old[t + 7] == 0xDE;
                if let (true, Some((ino, g))) = (has_tail, owner) {
                    ext4kit_format::dir::put_tail(&mut b, ino, g, &self.csum);
                }
            }
            "xattr block" => {
                let c = self.csum.xattr_block(blk, &b);
                b[16..20].copy_from_slice(&c.to_le_bytes());
            }
            _ => return,
        }
        dev.write_at(&b, blk * 1024).unwrap();
    }
}

/// One line, no panic text.
fn one_line(what: &str, e: &impl std::fmt::Display) -> Result<(), String> {
    let s = e.to_string();
    if s.contains('\n') || s.is_empty() {
        return Err(format!("{what}: error is not one line: {s:?}"));
    }
    Ok(())
}

#[derive(Default)]
struct Outcome {
    /// An operation (after a successful open) failed with corruption.
    detected: bool,
}

fn note(out: &mut Outcome, what: &str, e: &FsError) -> Result<(), String> {
    one_line(what, e)?;
    if e.is_corruption() {
        out.detected = true;
    }
    Ok(())
}

/// Walk everything below `dir` (read-only operations).
fn walk(
    fs: &Filesystem,
    dir: u32,
    depth: u32,
    seen: &mut HashSet<u32>,
    out: &mut Outcome,
) -> Result<(), String> {
    if depth > 4 || !seen.insert(dir) {
        return Ok(());
    }
    let d = match fs.inode(dir) {
        Ok(d) => d,
        Err(e) => return note(out, "stat dir", &e),
    };
    let entries = match fs.read(|f| f.read_dir(&d)) {
        Ok(v) => v,
        Err(e) => {
            // What the mount does with errors of read-side closures.
            fs.note_error("readdir", line!(), dir, &e);
            return note(out, "readdir", &e);
        }
    };
    for e in entries.iter().take(300) {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        let i = match fs.lookup(dir, &e.name) {
            Ok(Some(i)) => i,
            Ok(None) => continue,
            Err(err) => {
                note(out, "lookup", &err)?;
                continue;
            }
        };
        if i.is_dir() {
            walk(fs, i.ino, depth + 1, seen, out)?;
        } else if i.is_regular() {
            let mut buf = vec![0u8; i.size.min(1 << 20) as usize];
            if let Err(err) = fs.read_at(i.ino, 0, &mut buf) {
                note(out, "read", &err)?;
            }
        } else if i.is_symlink()
            && let Err(err) = fs.read(|f| f.read_link(&i))
        {
            fs.note_error("readlink", line!(), i.ino, &err);
            note(out, "readlink", &err)?;
        }
        if let Err(err) = fs.xattrs(i.ino) {
            note(out, "xattrs", &err)?;
        }
    }
    Ok(())
}

fn case(dev: Arc<MemDevice>, errors: ErrorBehavior) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    let opts = RwOptions {
        errors: Some(errors),
        ..RwOptions::default()
    };
    let fs = match Filesystem::open(dev.clone(), opts) {
        Ok(fs) => fs,
        Err(e) => {
            one_line("open", &e)?;
            return Ok(out);
        }
    };
    walk(&fs, 2, 0, &mut HashSet::new(), &mut out)?;
    let reg = NewInode::new(S_IFREG | 0o644, 0, 0);
    let ino_of = |n: &[u8]| fs.lookup(2, n).ok().flatten().map(|i| i.ino);
    let d = ino_of(b"d");
    macro_rules! op {
        ($what:expr, $e:expr) => {
            if let Err(e) = $e {
                note(&mut out, $what, &e)?;
            }
        };
    }
    match fs.create(2, b"new", &reg) {
        Ok((i, _)) => op!("write new", fs.write_at(i.ino, 0, &[7u8; 5000])),
        Err(e) => note(&mut out, "create", &e)?,
    }
    if let Some(d) = d {
        op!("unlink", fs.unlink(d, &name(5)));
        op!(
            "rename",
            fs.rename(2, b"small", d, b"moved", RenameFlags::default())
        );
        op!("mkdir", fs.mkdir(d, b"sub", &NewInode::new(0o40755, 0, 0)));
        op!("create in d", fs.create(d, b"zz-new-name", &reg));
    }
    for (n, val) in [(&b"x"[..], 300usize), (&b"f0"[..], 40)] {
        if let Some(i) = ino_of(n) {
            match fs.set_xattr(i, b"user.k", Some(&vec![b'q'; val]), SetMode::Any) {
                Ok(_) => {}
                Err(ext4kit_fs::xattr_write::XattrError::Fs(e)) => note(&mut out, "setxattr", &e)?,
                Err(e) => one_line("setxattr", &e)?,
            }
        }
    }
    if let Some(f0) = ino_of(b"f0") {
        op!("truncate", fs.truncate(f0, 3000));
    }
    if let Some(f1) = ino_of(b"f1") {
        op!("write f1", fs.write_at(f1, 8192, &[9u8; 4096]));
        op!("truncate f1", fs.truncate(f1, 40_000));
    }
    op!("unlink x", fs.unlink(2, b"x"));
    if let Err(e) = fs.close() {
        one_line("close", &e)?;
    }
    if out.detected {
        let mut raw = vec![0u8; 1024];
        dev.read_at(&mut raw, SUPERBLOCK_OFFSET)
            .map_err(|e| e.to_string())?;
        let sb = Superblock::parse(&raw).ok_or("short superblock")?;
        if sb.s_state.get() & STATE_ERROR == 0 || sb.s_error_count.get() == 0 {
            return Err(format!(
                "corruption detected but not recorded (state {:#x}, count {})",
                sb.s_state.get(),
                sb.s_error_count.get()
            ));
        }
    }
    Ok(out)
}

type Base = (MemDevice, Vec<(&'static str, u64)>, Reseal);

/// The two base images: with metadata_csum (most flips fail a checksum)
/// and without (flips reach the structure checks).
fn bases(dir: &std::path::Path) -> Vec<Base> {
    [
        ("csum.img", &[][..]),
        ("nocsum.img", &["-O", "^metadata_csum"][..]),
    ]
    .iter()
    .map(|(n, a)| {
        let (bytes, targets, reseal) = base(dir, n, a);
        (MemDevice::from_bytes(bytes), targets, reseal)
    })
    .collect()
}

/// Run [`case`] on `dev` in a thread with a time bound; `Err` says what
/// went wrong (a panic, a hang, a bad error).
fn run_bounded(dev: Arc<MemDevice>, errors: ErrorBehavior) -> Result<Outcome, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(dev, errors)));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err("panicked".into()),
        Err(_) => Err("no answer after 60 s (hang)".into()),
    }
}

/// Panics the campaign found, replayed every run: (base 0 = csum or 1,
/// target, byte offset in the block, bytes written there).
const REGRESSIONS: &[(usize, &str, u64, &[u8])] = &[
    // dx_root_info.indirect_levels 255: "levels + 1" overflowed (dir.rs).
    (0, "htree root", 30, &[0xff]),
    (1, "htree root", 30, &[0xff]),
];

#[test]
fn corrupt_metadata_regressions() {
    if let Err(r) = e2fs_tools() {
        return skip("corrupt_metadata_regressions", &r);
    }
    let dir = image_dir();
    let bases = bases(dir.path());
    let mut failures = Vec::new();
    for &(b, what, off, bytes) in REGRESSIONS {
        let (base_dev, targets, _) = &bases[b];
        let blk = targets.iter().find(|t| t.0 == what).unwrap().1;
        for errors in [ErrorBehavior::RemountRo, ErrorBehavior::Continue] {
            let dev = Arc::new(base_dev.snapshot());
            dev.write_at(bytes, blk * 1024 + off).unwrap();
            if let Err(e) = run_bounded(dev, errors) {
                failures.push(format!(
                    "{what} +{off} {bytes:?} (base {b}, {errors:?}): {e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corrupt_metadata_never_panics_nor_hangs() {
    if let Err(r) = e2fs_tools() {
        return skip("corrupt_metadata_never_panics_nor_hangs", &r);
    }
    let dir = image_dir();
    let bases = bases(dir.path());
    let cases: u64 = std::env::var("EXT4KIT_FUZZ_WRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48);
    let seed: u64 = std::env::var("EXT4KIT_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_F00D);
    let bs = 1024u64;
    let mut failures = Vec::new();
    let mut detected = 0;
    for n in 0..cases {
        let mut rng = Rng(seed ^ (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let (base_dev, targets, reseal) = &bases[(n / 2 % 2) as usize];
        let (what, blk) = targets[rng.below(targets.len() as u64) as usize];
        let dev = Arc::new(base_dev.snapshot());
        let mut flips = Vec::new();
        for _ in 0..1 + rng.below(3) {
            // Half the flips hit a header (the first 64 bytes); some set a
            // whole 32-bit word (0, all ones, or random).
            let off = if rng.below(2) == 0 {
                rng.below(64)
            } else {
                rng.below(bs)
            };
            let at = blk * bs + off;
            let mut b = [0u8; 4];
            let len = (bs - off).min(4) as usize;
            dev.read_at(&mut b[..len], at).unwrap();
            let x = match rng.below(4) {
                0 => 0,
                1 => u32::MAX,
                2 => rng.next() as u32,
                _ => u32::from_le_bytes(b) ^ (1 + rng.below(255) as u32),
            };
            let w = x.to_le_bytes();
            dev.write_at(&w[..len], at).unwrap();
            flips.push((off, x));
        }
        // A quarter of the csum cases get their checksums made right.
        let resealed = n % 8 < 2;
        if resealed {
            reseal.apply(base_dev, &dev, what, blk);
        }
        let errors = if n % 2 == 0 {
            ErrorBehavior::RemountRo
        } else {
            ErrorBehavior::Continue
        };
        let csum = match (n / 2 % 2, resealed) {
            (0, true) => "csum, resealed",
            (0, false) => "csum",
            _ => "nocsum",
        };
        let label = format!("case {n} ({csum}, {what} {blk}, words {flips:?}, {errors:?})");
        match run_bounded(dev, errors) {
            Ok(o) => detected += u32::from(o.detected),
            Err(e) => {
                let hang = e.contains("hang");
                failures.push(format!("{label}: {e}"));
                if hang {
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{cases} cases, {detected} with corruption detected by an operation");
}
