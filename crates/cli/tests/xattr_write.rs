//! The xattr writer (`ext4kit_fs::xattr_write`) on real mke2fs images:
//! 256- and 128-byte inodes, 1 KiB and 4 KiB blocks, with and without
//! metadata_csum. A test-only [`XattrBlocks`] writes straight into the
//! image (no journal) with a test-only allocator that keeps the block
//! bitmap, the counts and their checksums as e2fsck wants them. After each
//! scenario `e2fsck -fn` is clean, and the read side's `xattrs()` and
//! `debugfs ea_list` show exactly the model's attributes; a random
//! sequence of set/replace/remove on a few inodes is checked the same way
//! (`EXT4KIT_XATTR_SEEDS=N` for more seeds); as root with loop devices the
//! kernel mount sees the same attributes and ACLs (`os.getxattr` through
//! python3, the raw bytes getfattr/getfacl read), and a block the kernel
//! shared between two inodes is copied on write.

mod common;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use ext4kit_device::{FileDevice, OpenOptions};
use ext4kit_format::GroupDesc;
use ext4kit_format::acl::{self, AclEntry};
use ext4kit_format::checksum::crc32c_raw;
use ext4kit_format::group_desc::BG_BLOCK_UNINIT;
use ext4kit_fs::FsError;
use ext4kit_fs::sb::{FsInfo, Volume};
use ext4kit_fs::xattr::XattrPlace;
use ext4kit_fs::xattr_write::{
    self as xw, AclKind, SetMode, XattrBlocks, XattrError, XattrGeometry,
};

type Cache = BTreeMap<u32, BTreeSet<u64>>;

/// Direct, unjournaled block I/O with a first-fit allocator that keeps
/// bitmaps, group and superblock counts and checksums consistent.
struct TestBlocks<'a> {
    f: &'a File,
    info: &'a FsInfo,
    /// The mbcache: xattr blocks in use by header hash.
    cache: &'a RefCell<Cache>,
    allocated: Vec<u64>,
    freed: Vec<u64>,
}

impl TestBlocks<'_> {
    fn bs(&self) -> u64 {
        u64::from(self.info.block_size)
    }
    fn desc_pos(&self, g: u32) -> u64 {
        let per = self.info.descs_per_block();
        self.info.desc_block(g / per) * self.bs()
            + u64::from(g % per) * u64::from(self.info.desc_size)
    }
    fn desc(&self, g: u32) -> GroupDesc {
        let mut b = vec![0u8; usize::from(self.info.desc_size)];
        self.f.read_exact_at(&mut b, self.desc_pos(g)).unwrap();
        GroupDesc::parse(&b).unwrap()
    }
    fn put_desc(&self, g: u32, mut d: GroupDesc, bitmap: &[u8]) {
        let ds = usize::from(self.info.desc_size);
        if self.info.csum.metadata {
            let n = self.info.blocks_per_group as usize / 8;
            d.set_block_bitmap_csum(self.info.csum.bitmap(&bitmap[..n]));
        }
        d.update_checksum(&self.info.csum, g, ds);
        self.f
            .write_all_at(d.on_disk(ds), self.desc_pos(g))
            .unwrap();
    }
    fn sb_free_delta(&self, delta: i64) {
        let mut sb = vec![0u8; 1024];
        self.f.read_exact_at(&mut sb, 1024).unwrap();
        let lo = u32::from_le_bytes(sb[0x0C..0x10].try_into().unwrap());
        let hi = u32::from_le_bytes(sb[0x158..0x15C].try_into().unwrap());
        let bit64 = self.info.desc_size >= 64;
        let v = u64::from(lo) | if bit64 { u64::from(hi) << 32 } else { 0 };
        let v = (v as i64 + delta) as u64;
        sb[0x0C..0x10].copy_from_slice(&(v as u32).to_le_bytes());
        if bit64 {
            sb[0x158..0x15C].copy_from_slice(&((v >> 32) as u32).to_le_bytes());
        }
        if self.info.csum.metadata {
            let c = crc32c_raw(!0, &sb[..1020]);
            sb[1020..].copy_from_slice(&c.to_le_bytes());
        }
        self.f.write_all_at(&sb, 1024).unwrap();
    }
    fn group_of(&self, blk: u64) -> (u32, usize) {
        let rel = blk - self.info.first_data_block;
        let bpg = u64::from(self.info.blocks_per_group);
        ((rel / bpg) as u32, (rel % bpg) as usize)
    }
}

impl XattrBlocks for TestBlocks<'_> {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        let mut b = vec![0u8; self.bs() as usize];
        self.f.read_exact_at(&mut b, blk * self.bs()).unwrap();
        Ok(b)
    }
    fn write(&mut self, blk: u64, data: &[u8]) -> Result<(), FsError> {
        assert_eq!(data.len() as u64, self.bs());
        self.f.write_all_at(data, blk * self.bs()).unwrap();
        if data[..4] == 0xEA02_0000u32.to_le_bytes() {
            let h = u32::from_le_bytes(data[12..16].try_into().unwrap());
            self.cache.borrow_mut().entry(h).or_default().insert(blk);
        }
        Ok(())
    }
    fn candidates(&self, hash: u32) -> Vec<u64> {
        self.cache
            .borrow()
            .get(&hash)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }
    fn alloc(&mut self, goal: u64) -> Result<Option<u64>, FsError> {
        let (g0, _) = self.group_of(goal);
        let groups = self.info.groups;
        for g in (g0..groups).chain(0..g0) {
            let mut d = self.desc(g);
            if d.flags() & BG_BLOCK_UNINIT != 0 || d.free_blocks() == 0 {
                continue;
            }
            let bm_blk = d.block_bitmap();
            let mut bm = self.read(bm_blk)?;
            let first = self.info.group_first_block(g);
            for i in 0..self.info.blocks_per_group as usize {
                let blk = first + i as u64;
                if blk >= self.info.blocks_count {
                    break;
                }
                if bm[i / 8] & (1 << (i % 8)) == 0 {
                    bm[i / 8] |= 1 << (i % 8);
                    self.f.write_all_at(&bm, bm_blk * self.bs()).unwrap();
                    d.set_free_blocks(d.free_blocks() - 1);
                    self.put_desc(g, d, &bm);
                    self.sb_free_delta(-1);
                    self.allocated.push(blk);
                    return Ok(Some(blk));
                }
            }
        }
        Ok(None)
    }
    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        let (g, i) = self.group_of(blk);
        let mut d = self.desc(g);
        let bm_blk = d.block_bitmap();
        let mut bm = self.read(bm_blk)?;
        assert!(bm[i / 8] & (1 << (i % 8)) != 0, "freeing free block {blk}");
        bm[i / 8] &= !(1 << (i % 8));
        self.f.write_all_at(&bm, bm_blk * self.bs()).unwrap();
        d.set_free_blocks(d.free_blocks() + 1);
        self.put_desc(g, d, &bm);
        self.sb_free_delta(1);
        self.freed.push(blk);
        for set in self.cache.borrow_mut().values_mut() {
            set.remove(&blk);
        }
        Ok(())
    }
}

/// name -> (value, where it is stored).
type Attrs = BTreeMap<Vec<u8>, (Vec<u8>, XattrPlace)>;

/// An image, the model of its attributes (path -> name -> value as
/// getxattr returns it) and the writer.
struct Img {
    path: PathBuf,
    file: File,
    model: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>,
    cache: RefCell<Cache>,
}

/// What one call did besides its result.
#[derive(Default, Debug)]
struct Effect {
    allocated: Vec<u64>,
    freed: Vec<u64>,
}

impl Img {
    fn new(dir: &Path, name: &str, args: &[&str], src: &Path) -> Img {
        let path = dir.join(format!("{name}.img"));
        run_ok(
            mke2fs(["-q", "-F", "-t", "ext4", "-N", "64"])
                .args(args)
                .arg("-d")
                .arg(src)
                .arg(&path)
                .arg("8M"),
        )
        .unwrap();
        e2fsck_clean(&path).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        Img {
            path,
            file,
            model: BTreeMap::new(),
            cache: RefCell::new(Cache::new()),
        }
    }

    /// Run `op` on the inode at `path`'s image and write the image back
    /// (when it succeeded).
    fn on<R>(
        &mut self,
        path: &str,
        op: impl FnOnce(&XattrGeometry, &mut TestBlocks<'_>, u32, &mut [u8]) -> Result<R, XattrError>,
    ) -> (Result<R, XattrError>, Effect) {
        let dev = FileDevice::open(&self.path, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let inode = fs.resolve(path.as_bytes(), false).unwrap();
        let geo = XattrGeometry::new(&vol.info);
        let mut blocks = TestBlocks {
            f: &self.file,
            info: &vol.info,
            cache: &self.cache,
            allocated: Vec::new(),
            freed: Vec::new(),
        };
        let mut slot = inode.raw.clone();
        let r = op(&geo, &mut blocks, inode.ino, &mut slot);
        let eff = Effect {
            allocated: blocks.allocated,
            freed: blocks.freed,
        };
        if r.is_ok() {
            self.write_slot(&vol.info, inode.ino, &slot);
        } else {
            assert_eq!(slot, inode.raw, "a failed call changed the inode");
        }
        (r, eff)
    }

    fn write_slot(&self, info: &FsInfo, ino: u32, slot: &[u8]) {
        let idx = u64::from((ino - 1) % info.inodes_per_group);
        let g = ((ino - 1) / info.inodes_per_group) as usize;
        let per = info.descs_per_block() as usize;
        let mut raw = vec![0u8; usize::from(info.desc_size)];
        let at = info.desc_block((g / per) as u32) * u64::from(info.block_size)
            + (g % per) as u64 * u64::from(info.desc_size);
        self.file.read_exact_at(&mut raw, at).unwrap();
        let table = ext4kit_format::group_desc::GroupDesc::parse(&raw)
            .unwrap()
            .inode_table();
        let pos = table * u64::from(info.block_size) + idx * u64::from(info.inode_size);
        self.file.write_all_at(slot, pos).unwrap();
    }

    fn set(
        &mut self,
        path: &str,
        name: &str,
        value: &[u8],
        mode: SetMode,
    ) -> Result<bool, XattrError> {
        let (r, _) = self.on(path, |g, b, ino, s| {
            xw::set_xattr(g, b, ino, s, name.as_bytes(), Some(value), mode)
        });
        if r.is_ok() {
            self.model
                .entry(path.into())
                .or_default()
                .insert(name.as_bytes().to_vec(), value.to_vec());
        }
        r
    }

    fn remove(&mut self, path: &str, name: &str) -> Result<bool, XattrError> {
        let (r, _) = self.on(path, |g, b, ino, s| {
            xw::remove_xattr(g, b, ino, s, name.as_bytes())
        });
        if r.is_ok() {
            self.model
                .entry(path.into())
                .or_default()
                .remove(name.as_bytes());
        }
        r
    }

    /// The read side's attributes of `path` (name -> (value, place)) and
    /// the inode's mode and `i_file_acl`.
    fn read(&self, path: &str) -> (Attrs, u16, u64) {
        let dev = FileDevice::open(&self.path, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let inode = fs.resolve(path.as_bytes(), false).unwrap();
        let m = fs
            .xattrs(&inode)
            .unwrap()
            .into_iter()
            .map(|x| (x.name, (x.value, x.place)))
            .collect();
        (m, inode.mode, inode.file_acl)
    }

    /// e2fsck clean; read side and debugfs equal to the model.
    fn check(&self, what: &str) {
        if let Err(e) = e2fsck_clean(&self.path) {
            panic!("{what}: {e}");
        }
        for (path, want) in &self.model {
            let (got, _, _) = self.read(path);
            let got: BTreeMap<_, _> = got.into_iter().map(|(k, (v, _))| (k, v)).collect();
            assert_eq!(&got, want, "{what}: read side of {path}");
            let mut theirs = debugfs_ea_list(&self.path, path);
            theirs.sort();
            let mut ours: Vec<(String, usize)> = want
                .iter()
                .map(|(k, v)| {
                    let len = if k.starts_with(b"system.posix_acl") {
                        acl::to_disk(&acl::from_xattr(v).unwrap()).len()
                    } else {
                        v.len()
                    };
                    (String::from_utf8_lossy(k).into_owned(), len)
                })
                .collect();
            ours.sort();
            assert_eq!(ours, theirs, "{what}: debugfs ea_list {path}");
        }
    }
}

fn source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    for i in 0..6 {
        std::fs::write(src.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    let _ = run(tool("mkfifo").arg(src.join("p")));
    src
}

/// Printable bytes (debugfs prints them), deterministic.
fn val(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 26) as u8
        })
        .collect()
}

const CONFIGS: &[(&str, &[&str], usize, usize)] = &[
    ("4k-256-csum", &["-b", "4096", "-I", "256"], 4096, 256),
    ("1k-128-csum", &["-b", "1024", "-I", "128"], 1024, 128),
    (
        "1k-256-nocsum",
        &["-b", "1024", "-I", "256", "-O", "^metadata_csum"],
        1024,
        256,
    ),
    (
        "4k-128-nocsum",
        &["-b", "4096", "-I", "128", "-O", "^metadata_csum,^64bit"],
        4096,
        128,
    ),
];

fn e2fs_tools() -> Result<(), String> {
    for t in ["mke2fs", "e2fsck", "debugfs"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    Ok(())
}

fn ace(tag: u16, perm: u16, id: u32) -> AclEntry {
    AclEntry { tag, perm, id }
}

/// The scenarios of items 1-3 on one image; returns it for the kernel check.
fn scenarios(dir: &Path, src: &Path, name: &str, args: &[&str], bs: usize, isz: usize) -> Img {
    let mut img = Img::new(dir, name, args, src);
    let w = |s: &str| format!("{name}: {s}");
    // 1. A small value: in the inode when there is room, else the block.
    img.set("/f0", "user.small", b"hello", SetMode::Any)
        .unwrap();
    let (a, _, facl) = img.read("/f0");
    let want = if isz > 128 {
        XattrPlace::Inode
    } else {
        XattrPlace::Block
    };
    assert_eq!(a[&b"user.small".to_vec()].1, want, "{}", w("placement"));
    assert_eq!(facl != 0, isz == 128);
    img.check(&w("one small attribute"));
    // Spill: many attributes, then large ones, go to the block.
    for i in 0..8 {
        img.set("/f0", &format!("user.n{i}"), &val(24, i), SetMode::Any)
            .unwrap();
    }
    img.set("/f0", "trusted.big", &val(bs / 4, 99), SetMode::Create)
        .unwrap();
    img.set(
        "/f0",
        "security.selinux",
        b"system_u:object_r:etc_t:s0\0",
        SetMode::Any,
    )
    .unwrap();
    let (a, _, facl) = img.read("/f0");
    assert_ne!(facl, 0);
    assert_eq!(a[&b"trusted.big".to_vec()].1, XattrPlace::Block);
    img.check(&w("spilled into the block"));
    // 2. Flags and limits, with nothing written on failure.
    let before = file_hash(&img.path).unwrap();
    assert!(matches!(
        img.set("/f0", "user.small", b"x", SetMode::Create),
        Err(XattrError::Exists)
    ));
    assert!(matches!(
        img.set("/f0", "user.none", b"x", SetMode::Replace),
        Err(XattrError::NoData)
    ));
    assert!(matches!(
        img.remove("/f0", "user.none"),
        Err(XattrError::NoData)
    ));
    assert!(matches!(
        img.set("/f0", "user.huge", &val(bs, 1), SetMode::Any),
        Err(XattrError::NoSpace)
    ));
    let long = format!("user.{}", "n".repeat(251));
    assert!(matches!(
        img.set("/f0", &long, b"", SetMode::Any),
        Err(XattrError::NameTooLong)
    ));
    assert!(matches!(
        img.set("/f0", "user.x", &vec![b'a'; 65537], SetMode::Any),
        Err(XattrError::ValueTooBig)
    ));
    assert!(matches!(
        img.set("/p", "user.x", b"", SetMode::Any),
        Err(XattrError::NotPermitted(_))
    ));
    // Same value: nothing to do.
    assert!(
        !img.set("/f0", "user.small", b"hello", SetMode::Any)
            .unwrap()
    );
    assert_eq!(
        file_hash(&img.path).unwrap(),
        before,
        "{}",
        w("refusals wrote")
    );
    img.set("/p", "trusted.fifo", b"ok", SetMode::Any).unwrap();
    // A block value replaced by a small one moves into the inode (room
    // allowing); the large one grows in place in the block.
    img.set("/f0", "trusted.big", &val(bs / 3, 7), SetMode::Replace)
        .unwrap();
    img.check(&w("replaced values"));
    // Empty value.
    img.set("/f0", "user.empty", b"", SetMode::Any).unwrap();
    img.check(&w("empty value"));
    // Remove everything: the block is freed, i_file_acl is 0 again.
    let names: Vec<Vec<u8>> = img.model["/f0"].keys().cloned().collect();
    for n in names {
        img.remove("/f0", std::str::from_utf8(&n).unwrap()).unwrap();
    }
    let (a, _, facl) = img.read("/f0");
    assert!(a.is_empty() && facl == 0, "{}", w("all removed"));
    img.check(&w("all removed"));

    // 3. Shared block: f2's block shared with f3 (as the kernel's mbcache
    // would), then f3 changed: copied on write; f2 removed: freed.
    img.set("/f2", "user.shared", &val(bs / 2, 5), SetMode::Any)
        .unwrap();
    img.set("/f2", "user.other", &val(bs / 8, 6), SetMode::Any)
        .unwrap();
    let (_, _, b2) = img.read("/f2");
    {
        let dev = FileDevice::open(&img.path, OpenOptions::read_only()).unwrap();
        let vol = Volume::open(&dev).unwrap();
        let fs = vol.fs();
        let i2 = fs.resolve(b"/f2", false).unwrap();
        let i3 = fs.resolve(b"/f3", false).unwrap();
        let geo = XattrGeometry::new(&vol.info);
        let mut blocks = TestBlocks {
            f: &img.file,
            info: &vol.info,
            cache: &img.cache,
            allocated: Vec::new(),
            freed: Vec::new(),
        };
        let mut s3 = i3.raw.clone();
        xw::share_xattr_block(&geo, &mut blocks, i2.ino, &i2.raw, i3.ino, &mut s3).unwrap();
        img.write_slot(&vol.info, i3.ino, &s3);
    }
    let shared = img.model["/f2"].clone();
    img.model.insert("/f3".into(), shared);
    img.check(&w("shared block"));
    let (r, eff) = img.on("/f3", |g, b, ino, s| {
        xw::set_xattr(g, b, ino, s, b"user.other", Some(b"mine"), SetMode::Replace)
    });
    r.unwrap();
    img.model
        .get_mut("/f3")
        .unwrap()
        .insert(b"user.other".to_vec(), b"mine".to_vec());
    let (_, _, b3) = img.read("/f3");
    assert_eq!(eff.allocated, vec![b3], "{}", w("copy on write"));
    assert!(eff.freed.is_empty());
    assert_ne!(b3, b2);
    img.check(&w("copied on write"));
    let (r, eff) = img.on("/f2", |g, b, ino, s| xw::release_xattr_block(g, b, ino, s));
    assert!(r.unwrap());
    assert_eq!(eff.freed, vec![b2], "{}", w("last reference frees"));
    img.model.remove("/f2");
    let (a, _, facl) = img.read("/f2");
    assert!(a.is_empty() && facl == 0);
    img.check(&w("released"));

    // Identical attribute sets share one block (the test's mbcache names
    // the candidates); changing one copies it again.
    let same = val(bs / 2, 11);
    img.set("/f4", "user.same", &same, SetMode::Any).unwrap();
    let (r, eff) = img.on("/f5", |g, b, ino, s| {
        xw::set_xattr(g, b, ino, s, b"user.same", Some(&same), SetMode::Any)
    });
    r.unwrap();
    assert!(eff.allocated.is_empty(), "{}", w("reused, not allocated"));
    img.model
        .entry("/f5".into())
        .or_default()
        .insert(b"user.same".to_vec(), same.clone());
    let (_, _, b4) = img.read("/f4");
    let (_, _, b5) = img.read("/f5");
    assert_eq!(b4, b5, "{}", w("identical sets share"));
    img.check(&w("reused block"));

    // 4. ACLs on the directory and a file, mode kept in sync.
    let u = acl::ACL_UNDEFINED_ID;
    let full = vec![
        ace(acl::ACL_USER_OBJ, 7, u),
        ace(acl::ACL_USER, 6, 1000),
        ace(acl::ACL_GROUP_OBJ, 5, u),
        ace(acl::ACL_GROUP, 4, 100),
        ace(acl::ACL_MASK, 5, u),
        ace(acl::ACL_OTHER, 1, u),
    ];
    let x = acl::to_xattr(&full);
    img.set("/d", "system.posix_acl_access", &x, SetMode::Any)
        .unwrap();
    img.set("/d", "system.posix_acl_default", &x, SetMode::Any)
        .unwrap();
    let (_, mode, _) = img.read("/d");
    assert_eq!(mode & 0o777, 0o751, "{}", w("mode from the ACL"));
    img.check(&w("ACLs on a directory"));
    // chmod: the mask follows the group bits.
    let (r, _) = img.on("/d", |g, b, ino, s| {
        xw::chmod(g, b, ino, s, 0o770, Some(&full))
    });
    r.unwrap();
    let chmodded = acl::chmod(&full, 0o770);
    assert_eq!(chmodded[4].perm, 7);
    img.model.get_mut("/d").unwrap().insert(
        b"system.posix_acl_access".to_vec(),
        acl::to_xattr(&chmodded),
    );
    let (a, mode, _) = img.read("/d");
    assert_eq!(mode & 0o777, 0o770);
    assert_eq!(
        xw::get_acl(
            &[ext4kit_fs::xattr::Xattr {
                name: b"system.posix_acl_access".to_vec(),
                value: a[&b"system.posix_acl_access".to_vec()].0.clone(),
                place: XattrPlace::Inode,
            }],
            AclKind::Access
        )
        .unwrap()
        .unwrap(),
        chmodded
    );
    img.check(&w("chmod with an ACL"));
    // An ACL the mode bits express: not stored, mode set.
    let min = vec![
        ace(acl::ACL_USER_OBJ, 6, u),
        ace(acl::ACL_GROUP_OBJ, 0, u),
        ace(acl::ACL_OTHER, 0, u),
    ];
    img.set(
        "/f1",
        "system.posix_acl_access",
        &acl::to_xattr(&min),
        SetMode::Any,
    )
    .unwrap();
    img.model.remove("/f1");
    let (a, mode, _) = img.read("/f1");
    assert!(a.is_empty());
    assert_eq!(mode & 0o777, 0o600);
    assert!(matches!(
        img.set("/f1", "system.posix_acl_default", &x, SetMode::Any),
        Err(XattrError::AccessDenied(_))
    ));
    // Bad ACL xattr values.
    assert!(matches!(
        img.set(
            "/f1",
            "system.posix_acl_access",
            b"\x02\0\0\0\x01",
            SetMode::Any
        ),
        Err(XattrError::Invalid(_))
    ));
    img.check(&w("ACLs"));
    img
}

#[test]
fn xattr_writes_on_real_images() {
    if let Err(why) = e2fs_tools() {
        return skip("xattr_writes_on_real_images", &why);
    }
    let dir = image_dir();
    let src = source(dir.path());
    let mut imgs = Vec::new();
    for (name, args, bs, isz) in CONFIGS {
        imgs.push(scenarios(dir.path(), &src, name, args, *bs, *isz));
    }
    match kernel_mount_available().and_then(|()| {
        if have("python3") {
            Ok(())
        } else {
            Err("python3 not found".into())
        }
    }) {
        Err(why) => skip("xattr_writes_on_real_images (kernel mount)", &why),
        Ok(()) => {
            for img in &imgs {
                kernel_sees_model(img);
            }
        }
    }
}

/// `os.listxattr`/`os.getxattr` of every path in the model through a
/// read-only kernel mount, hex-encoded: name -> value.
fn kernel_xattrs(mnt: &Path, paths: &[&str]) -> BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>> {
    let script = "import os, sys\nroot = sys.argv[1]\nfor p in sys.argv[2:]:\n    f = root + p\n    for n in sorted(os.listxattr(f, follow_symlinks=False)):\n        v = os.getxattr(f, n, follow_symlinks=False)\n        print(p, n.encode().hex(), v.hex())\n";
    let out = run_ok(tool("python3").arg("-c").arg(script).arg(mnt).args(paths)).unwrap();
    let mut m: BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for p in paths {
        m.insert(p.to_string(), BTreeMap::new());
    }
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let mut it = l.split(' ');
        let (p, n, v) = (
            it.next().unwrap(),
            it.next().unwrap(),
            it.next().unwrap_or(""),
        );
        m.get_mut(p).unwrap().insert(unhex(n), unhex(v));
    }
    m
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn kernel_sees_model(img: &Img) {
    let lo = LoopDev::attach(&img.path).unwrap();
    let mnt = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let paths: Vec<&str> = img.model.keys().map(|s| s.as_str()).collect();
    let got = kernel_xattrs(mnt.path(), &paths);
    mnt.unmount().unwrap();
    drop(lo);
    for (p, want) in &img.model {
        assert_eq!(
            &got[p],
            want,
            "kernel getxattr of {p} in {}",
            img.path.display()
        );
    }
}

/// Random set/replace/remove on a few inodes against a model.
#[test]
fn xattr_random_sequences_match_a_model() {
    if let Err(why) = e2fs_tools() {
        return skip("xattr_random_sequences_match_a_model", &why);
    }
    let seeds: u64 = std::env::var("EXT4KIT_XATTR_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let dir = image_dir();
    let src = source(dir.path());
    for seed in 0..seeds {
        for (name, args, bs, _) in CONFIGS.iter().skip(seed as usize % 2).step_by(2) {
            let tag = format!("{name}-seed{seed}");
            let mut img = Img::new(dir.path(), &tag, args, &src);
            let mut x = seed.wrapping_add(1).wrapping_mul(0x2545_F491_4F6C_DD1D);
            let mut rnd = |n: u64| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % n
            };
            let paths = ["/f4", "/f5", "/d"];
            let names = [
                "user.a",
                "user.bb",
                "user.ccc",
                "trusted.t",
                "security.s",
                "user.long_name_xx",
            ];
            for step in 0..60 {
                let p = paths[rnd(3) as usize];
                let n = names[rnd(names.len() as u64) as usize];
                let exists = img
                    .model
                    .get(p)
                    .is_some_and(|m| m.contains_key(n.as_bytes()));
                let what = format!("{tag} step {step}: {p} {n}");
                match rnd(4) {
                    0 => {
                        let r = img.remove(p, n);
                        assert_eq!(r.is_ok(), exists, "{what}: remove {r:?}");
                    }
                    k => {
                        let len = match rnd(4) {
                            0 => rnd(8),
                            1 => rnd(64),
                            _ => rnd(*bs as u64 / 3),
                        } as usize;
                        let v = val(len, rnd(1 << 30));
                        let mode =
                            [SetMode::Any, SetMode::Create, SetMode::Replace][k as usize - 1];
                        match img.set(p, n, &v, mode) {
                            Ok(_) => assert!(
                                match mode {
                                    SetMode::Create => !exists,
                                    SetMode::Replace => exists,
                                    SetMode::Any => true,
                                },
                                "{what}: {mode:?} succeeded"
                            ),
                            Err(XattrError::Exists) => {
                                assert!(exists && mode == SetMode::Create, "{what}")
                            }
                            Err(XattrError::NoData) => {
                                assert!(!exists && mode == SetMode::Replace, "{what}")
                            }
                            Err(XattrError::NoSpace) => {}
                            Err(e) => panic!("{what}: {e}"),
                        }
                    }
                }
                if step % 20 == 19 {
                    img.check(&what);
                }
            }
            img.check(&tag);
        }
    }
}

/// The kernel shares identical xattr blocks (mbcache); ext4kit then
/// changes one of the sharing inodes: copy on write, the kernel reads
/// both right, e2fsck is clean.
#[test]
fn kernel_shared_block_is_copied_on_write() {
    let t = "kernel_shared_block_is_copied_on_write";
    if let Err(why) = e2fs_tools() {
        return skip(t, &why);
    }
    if let Err(why) = kernel_mount_available() {
        return skip(t, &why);
    }
    if !have("python3") {
        return skip(t, "python3 not found");
    }
    let dir = image_dir();
    let src = source(dir.path());
    let mut img = Img::new(dir.path(), "kshare", &["-b", "1024", "-I", "256"], &src);
    let big = val(600, 3);
    {
        let lo = LoopDev::attach(&img.path).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
        let script = "import os, sys\nfor f in sys.argv[2:]:\n    os.setxattr(sys.argv[1] + f, 'user.big', bytes.fromhex(os.environ['V']))\n";
        run_ok(
            tool("python3")
                .env(
                    "V",
                    big.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                )
                .arg("-c")
                .arg(script)
                .arg(mnt.path())
                .args(["/f0", "/f1", "/f2"]),
        )
        .unwrap();
        mnt.unmount().unwrap();
    }
    for f in ["/f0", "/f1", "/f2"] {
        img.model
            .entry(f.into())
            .or_default()
            .insert(b"user.big".to_vec(), big.clone());
    }
    let blocks: Vec<u64> = ["/f0", "/f1", "/f2"]
        .iter()
        .map(|f| img.read(f).2)
        .collect();
    img.check("kernel-written");
    if blocks[0] != blocks[1] || blocks[1] != blocks[2] {
        eprintln!("note: the kernel did not share the block ({blocks:?})");
    } else {
        eprintln!(
            "note: the kernel shared block {} among three inodes",
            blocks[0]
        );
    }
    img.set("/f1", "user.big", b"now small", SetMode::Replace)
        .unwrap();
    // Too large for the inode's 92 free bytes: goes to the (shared) block.
    img.set("/f2", "user.more", &val(120, 4), SetMode::Any)
        .unwrap();
    let after: Vec<u64> = ["/f0", "/f1", "/f2"]
        .iter()
        .map(|f| img.read(f).2)
        .collect();
    assert_eq!(after[0], blocks[0]);
    assert_eq!(after[1], 0, "small value moved into the inode");
    assert_ne!(after[2], blocks[0], "shared block copied on write");
    img.check("after ext4kit's changes");
    kernel_sees_model(&img);
}

/// One operation of the differential test: set (with flags 0, CREATE=1,
/// REPLACE=2) or remove.
#[derive(Clone, Debug)]
struct Op {
    path: &'static str,
    name: String,
    value: Option<Vec<u8>>,
    flags: u8,
}

fn random_ops(seed: u64, n: usize, bs: usize) -> Vec<Op> {
    let mut x = seed.wrapping_add(7).wrapping_mul(0x2545_F491_4F6C_DD1D);
    let mut rnd = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let u = acl::ACL_UNDEFINED_ID;
    let acls = [
        acl::to_xattr(&[
            ace(acl::ACL_USER_OBJ, 7, u),
            ace(acl::ACL_USER, 6, 1000),
            ace(acl::ACL_GROUP_OBJ, 5, u),
            ace(acl::ACL_MASK, 7, u),
            ace(acl::ACL_OTHER, 1, u),
        ]),
        acl::to_xattr(&[
            ace(acl::ACL_USER_OBJ, 6, u),
            ace(acl::ACL_GROUP_OBJ, 4, u),
            ace(acl::ACL_OTHER, 0, u),
        ]),
    ];
    let names = [
        "user.a",
        "user.bb",
        "user.ccc",
        "trusted.t",
        "security.s",
        "user.a_much_longer_name",
    ];
    (0..n)
        .map(|_| {
            let path = ["/f4", "/f5", "/d"][rnd(3) as usize];
            if path == "/d" && rnd(4) == 0 {
                let name = ["system.posix_acl_access", "system.posix_acl_default"][rnd(2) as usize];
                let value = match rnd(3) {
                    0 => None,
                    k => Some(acls[k as usize - 1].clone()),
                };
                return Op {
                    path,
                    name: name.into(),
                    value,
                    flags: 0,
                };
            }
            let name = names[rnd(names.len() as u64) as usize].to_string();
            let value = (rnd(4) != 0).then(|| {
                let len = match rnd(4) {
                    0 => rnd(8),
                    1 => rnd(64),
                    _ => rnd(bs as u64 / 3),
                } as usize;
                val(len, rnd(1 << 30))
            });
            Op {
                path,
                name,
                value,
                flags: rnd(3) as u8,
            }
        })
        .collect()
}

/// The same random operations by the kernel (on a mount) and by ext4kit
/// (on a copy of the image made before): the same result (errno) for
/// each, and in the end the same attributes in the same place (inode or
/// block), byte-identical in-inode areas, and the same modes.
#[test]
fn kernel_and_ext4kit_place_alike() {
    let t = "kernel_and_ext4kit_place_alike";
    if let Err(why) = e2fs_tools() {
        return skip(t, &why);
    }
    if let Err(why) = kernel_mount_available() {
        return skip(t, &why);
    }
    if !have("python3") {
        return skip(t, "python3 not found");
    }
    let dir = image_dir();
    let src = source(dir.path());
    for (ci, (name, args, bs, _)) in CONFIGS.iter().enumerate() {
        let ops = random_ops(ci as u64, 150, *bs);
        let kimg = Img::new(dir.path(), &format!("k-{name}"), args, &src);
        let mut ximg = Img::new(dir.path(), &format!("x-{name}"), args, &src);
        std::fs::copy(&kimg.path, &ximg.path).unwrap();
        // The kernel's results.
        let script = r#"import os, sys
root = sys.argv[1]
for line in open(sys.argv[2]):
    p, n, v, fl = line.split()
    f = root + p
    try:
        if v == "-":
            os.removexattr(f, n)
        else:
            os.setxattr(f, n, bytes.fromhex(v[1:]), int(fl))
        print(0)
    except OSError as e:
        print(e.errno)
"#;
        let opsfile = dir.path().join(format!("ops-{name}"));
        let text: String = ops
            .iter()
            .map(|o| {
                let v = match &o.value {
                    None => "-".to_string(),
                    Some(v) => format!(
                        "x{}",
                        v.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    ),
                };
                format!("{} {} {} {}\n", o.path, o.name, v, o.flags)
            })
            .collect();
        std::fs::write(&opsfile, text).unwrap();
        let kernel: Vec<i32> = {
            let lo = LoopDev::attach(&kimg.path).unwrap();
            let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
            let out = run_ok(
                tool("python3")
                    .arg("-c")
                    .arg(script)
                    .arg(mnt.path())
                    .arg(&opsfile),
            )
            .unwrap();
            mnt.unmount().unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.parse().unwrap())
                .collect()
        };
        e2fsck_clean(&kimg.path).unwrap();
        for (i, o) in ops.iter().enumerate() {
            let mode = match o.flags {
                1 => SetMode::Create,
                2 => SetMode::Replace,
                _ => SetMode::Any,
            };
            let (r, _) = ximg.on(o.path, |g, b, ino, s| {
                xw::set_xattr(g, b, ino, s, o.name.as_bytes(), o.value.as_deref(), mode)
            });
            let errno = r.map_or_else(|e| e.errno(), |_| 0);
            assert_eq!(errno, kernel[i], "{name} op {i} {o:?}");
        }
        e2fsck_clean(&ximg.path).unwrap();
        let mut hist = BTreeMap::new();
        for e in &kernel {
            *hist.entry(*e).or_insert(0) += 1;
        }
        let mut in_block = 0;
        // Shared blocks (both mbcaches): the same inodes share.
        let kb: Vec<u64> = ["/f4", "/f5", "/d"]
            .iter()
            .map(|p| kimg.read(p).2)
            .collect();
        let xb: Vec<u64> = ["/f4", "/f5", "/d"]
            .iter()
            .map(|p| ximg.read(p).2)
            .collect();
        for i in 0..3 {
            for j in 0..3 {
                assert_eq!(
                    kb[i] != 0 && kb[i] == kb[j],
                    xb[i] != 0 && xb[i] == xb[j],
                    "{name}: sharing {kb:?} vs {xb:?}"
                );
            }
        }
        for p in ["/f4", "/f5", "/d"] {
            let (ka, kmode, kblk) = kimg.read(p);
            let (xa, xmode, xblk) = ximg.read(p);
            assert_eq!(kblk == 0, xblk == 0, "{name}: {p} has an xattr block");
            if kblk != 0 {
                // Same entries, order, values and hashes; only the
                // refcount (the kernel may share) and the checksum (over
                // the block number) may differ.
                let mask = |mut b: Vec<u8>| {
                    b[4..8].fill(0);
                    b[16..20].fill(0);
                    b
                };
                assert_eq!(
                    mask(read_block(&ximg.path, xblk, *bs)),
                    mask(read_block(&kimg.path, kblk, *bs)),
                    "{name}: xattr block of {p}"
                );
            }
            assert_eq!(xa, ka, "{name}: attributes and places of {p}");
            in_block += xa.values().filter(|v| v.1 == XattrPlace::Block).count();
            assert_eq!(xmode, kmode, "{name}: mode of {p}");
            let kraw = raw_inode(&kimg.path, p);
            let xraw = raw_inode(&ximg.path, p);
            assert_eq!(
                xraw[0x1C..0x20],
                kraw[0x1C..0x20],
                "{name}: i_blocks of {p}"
            );
            if kraw.len() > 128 {
                let start = 128 + usize::from(u16::from_le_bytes([kraw[128], kraw[129]]));
                assert_eq!(xraw[start..], kraw[start..], "{name}: in-inode area of {p}");
            }
        }
        eprintln!(
            "{name}: results (errno: count) {hist:?}, {in_block} attributes in blocks at the end"
        );
    }
}

fn read_block(img: &Path, blk: u64, bs: usize) -> Vec<u8> {
    let mut b = vec![0u8; bs];
    File::open(img)
        .unwrap()
        .read_exact_at(&mut b, blk * bs as u64)
        .unwrap();
    b
}

fn raw_inode(img: &Path, path: &str) -> Vec<u8> {
    let dev = FileDevice::open(img, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    fs.resolve(path.as_bytes(), false).unwrap().raw
}

/// Symlink and device inode bodies as the kernel writes them: fast
/// symlinks up to 59 bytes in `i_block` without the EXTENTS flag, a
/// 60-byte one in a block (target + NUL), device numbers in the old or new
/// encoding, no extent tree for devices, fifos and sockets; the format
/// helpers give the same bytes.
#[test]
fn kernel_symlink_and_device_bodies() {
    use ext4kit_format::inode::{self as di, EXT4_EXTENTS_FL};
    let t = "kernel_symlink_and_device_bodies";
    if let Err(why) = e2fs_tools() {
        return skip(t, &why);
    }
    if let Err(why) = kernel_mount_available() {
        return skip(t, &why);
    }
    if !have("python3") {
        return skip(t, "python3 not found");
    }
    let dir = image_dir();
    let src = source(dir.path());
    let img = Img::new(dir.path(), "bodies", &["-b", "1024", "-I", "256"], &src);
    let s59 = "a".repeat(59);
    let s60 = "b".repeat(60);
    {
        let lo = LoopDev::attach(&img.path).unwrap();
        let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
        let script = r#"import os, stat, sys
r = sys.argv[1]
os.symlink(sys.argv[2], r + "/s59")
os.symlink(sys.argv[3], r + "/s60")
os.symlink("x", r + "/s1")
os.mknod(r + "/c_old", stat.S_IFCHR | 0o600, os.makedev(4, 64))
os.mknod(r + "/c_new", stat.S_IFCHR | 0o600, os.makedev(300, 70000))
os.mknod(r + "/b_old", stat.S_IFBLK | 0o600, os.makedev(8, 1))
os.mknod(r + "/b_zero", stat.S_IFBLK | 0o600, os.makedev(0, 0))
os.mknod(r + "/fifo", stat.S_IFIFO | 0o600)
os.mknod(r + "/sock", stat.S_IFSOCK | 0o600)
"#;
        run_ok(
            tool("python3")
                .arg("-c")
                .arg(script)
                .arg(mnt.path())
                .arg(&s59)
                .arg(&s60),
        )
        .unwrap();
        mnt.unmount().unwrap();
    }
    e2fsck_clean(&img.path).unwrap();
    let dev = FileDevice::open(&img.path, OpenOptions::read_only()).unwrap();
    let vol = Volume::open(&dev).unwrap();
    let fs = vol.fs();
    let get = |p: &str| fs.resolve(p.as_bytes(), false).unwrap();
    for (p, target) in [("/s59", s59.as_str()), ("/s1", "x")] {
        let i = get(p);
        assert_eq!(i.size, target.len() as u64);
        assert_eq!(
            i.flags & EXT4_EXTENTS_FL,
            0,
            "{p}: fast symlink without extents"
        );
        assert!(!di::new_inode_uses_extents(i.mode, target.len()));
        assert_eq!(
            Some(i.i_block),
            di::fast_symlink_i_block(target.as_bytes(), true),
            "{p}"
        );
    }
    let i = get("/s60");
    assert_eq!(i.size, 60);
    assert!(di::fast_symlink_i_block(s60.as_bytes(), true).is_none());
    assert!(di::new_inode_uses_extents(i.mode, 60));
    assert_ne!(i.flags & EXT4_EXTENTS_FL, 0);
    let m = fs.extents(&i).unwrap();
    let mut b = vec![0u8; 1024];
    dev_read(&img.path, m[0].pblk * 1024, &mut b);
    assert_eq!(Some(b), di::slow_symlink_block(s60.as_bytes(), 1024));
    assert!(di::slow_symlink_block(&[b'c'; 1024], 1024).is_none());
    for (p, maj, min) in [
        ("/c_old", 4, 64),
        ("/c_new", 300, 70000),
        ("/b_old", 8, 1),
        ("/b_zero", 0, 0),
    ] {
        let i = get(p);
        assert_eq!(i.i_block, di::device_i_block(maj, min), "{p}");
        assert_eq!(i.rdev(), (maj, min), "{p}: read side decodes it");
        assert_eq!(i.flags & EXT4_EXTENTS_FL, 0);
        assert!(!di::new_inode_uses_extents(i.mode, 0));
    }
    for p in ["/fifo", "/sock"] {
        let i = get(p);
        assert_eq!(i.i_block, [0u8; 60], "{p}");
        assert_eq!(i.flags & EXT4_EXTENTS_FL, 0);
        assert!(!di::new_inode_uses_extents(i.mode, 0));
    }
}

fn dev_read(img: &Path, pos: u64, buf: &mut [u8]) {
    File::open(img).unwrap().read_exact_at(buf, pos).unwrap();
}

/// ACL inheritance and chmod as the kernel does them: files and
/// directories created by the kernel in a directory with a default ACL get
/// the mode and ACLs `acl::inherit` computes; a kernel chmod of a file with
/// an ACL leaves the ACL `acl::chmod` computes, and ext4kit's `chmod`
/// writes the same.
#[test]
fn kernel_acl_inheritance_and_chmod() {
    let t = "kernel_acl_inheritance_and_chmod";
    if let Err(why) = e2fs_tools() {
        return skip(t, &why);
    }
    if let Err(why) = kernel_mount_available() {
        return skip(t, &why);
    }
    if !have("python3") {
        return skip(t, "python3 not found");
    }
    let u = acl::ACL_UNDEFINED_ID;
    let defaults = [
        vec![
            ace(acl::ACL_USER_OBJ, 7, u),
            ace(acl::ACL_USER, 6, 1000),
            ace(acl::ACL_GROUP_OBJ, 5, u),
            ace(acl::ACL_MASK, 6, u),
            ace(acl::ACL_OTHER, 1, u),
        ],
        vec![
            ace(acl::ACL_USER_OBJ, 6, u),
            ace(acl::ACL_GROUP_OBJ, 4, u),
            ace(acl::ACL_OTHER, 0, u),
        ],
    ];
    let dir = image_dir();
    let src = source(dir.path());
    let mut img = Img::new(dir.path(), "inherit", &["-b", "4096", "-I", "256"], &src);
    let hex = |v: &[u8]| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for (k, def) in defaults.iter().enumerate() {
        let script = r#"import os, sys
r, k, acl = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
os.mkdir(r + "/top" + k)
os.setxattr(r + "/top" + k, "system.posix_acl_default", acl)
os.umask(0o022)
os.close(os.open(r + "/top" + k + "/file", os.O_CREAT | os.O_WRONLY, 0o666))
os.close(os.open(r + "/top" + k + "/exe", os.O_CREAT | os.O_WRONLY, 0o751))
os.mkdir(r + "/top" + k + "/sub", 0o777)
os.close(os.open(r + "/top" + k + "/chm", os.O_CREAT | os.O_WRONLY, 0o666))
os.chmod(r + "/top" + k + "/chm", 0o705)
"#;
        {
            let lo = LoopDev::attach(&img.path).unwrap();
            let mnt = Mount::new(lo.path(), "ext4", None).unwrap();
            run_ok(
                tool("python3")
                    .arg("-c")
                    .arg(script)
                    .arg(mnt.path())
                    .arg(k.to_string())
                    .arg(hex(&acl::to_xattr(def))),
            )
            .unwrap();
            mnt.unmount().unwrap();
        }
        e2fsck_clean(&img.path).unwrap();
        let top = format!("/top{k}");
        for (name, mode, is_dir) in [
            ("file", 0o100666u16, false),
            ("exe", 0o100751, false),
            ("sub", 0o040777, true),
            ("chm", 0o100666, false),
        ] {
            let p = format!("{top}/{name}");
            let want = acl::inherit(Some(def), mode, is_dir, false, 0o022);
            let (a, got_mode, _) = img.read(&p);
            let get = |n: &[u8]| a.get(n).map(|x| acl::from_xattr(&x.0).unwrap());
            if name == "chm" {
                // Kernel chmod: the ACL follows the new bits.
                let want_acl = want.access.as_ref().map(|acc| acl::chmod(acc, 0o705));
                assert_eq!(got_mode & 0o7777, 0o705);
                assert_eq!(get(b"system.posix_acl_access"), want_acl, "{p}");
                continue;
            }
            assert_eq!(got_mode, want.mode, "{p}: mode");
            assert_eq!(
                get(b"system.posix_acl_access"),
                want.access,
                "{p}: access ACL"
            );
            assert_eq!(
                get(b"system.posix_acl_default"),
                want.default,
                "{p}: default ACL"
            );
        }
        // ext4kit's chmod of "file" to 0o705 gives what the kernel gave "chm".
        let p = format!("{top}/file");
        let access = xw::get_acl(
            &{
                let dev = FileDevice::open(&img.path, OpenOptions::read_only()).unwrap();
                let vol = Volume::open(&dev).unwrap();
                let fs = vol.fs();
                fs.xattrs(&fs.resolve(p.as_bytes(), false).unwrap())
                    .unwrap()
            },
            AclKind::Access,
        )
        .unwrap();
        let (r, _) = img.on(&p, |g, b, ino, s| {
            xw::chmod(g, b, ino, s, 0o705, access.as_deref())
        });
        r.unwrap();
        let (mine, mmode, _) = img.read(&p);
        let (kern, kmode, _) = img.read(&format!("{top}/chm"));
        assert_eq!(mmode, kmode);
        let strip = |m: Attrs| {
            m.into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(strip(mine), strip(kern), "{p}: chmod like the kernel's");
        e2fsck_clean(&img.path).unwrap();
    }
}

/// In-inode xattrs the kernel wrote (small `user.*` and `security.*`
/// values right after `i_extra_isize`) survive every ext4kit change of
/// the inode: the image tools' chmod, chown, truncate and fallocate, and
/// on the FUSE mount a write, chmod, truncate and one more xattr. The
/// kernel reads them all back afterwards; e2fsck is clean.
#[test]
fn kernel_in_inode_xattrs_survive_ext4kit_changes() {
    let t = "kernel_in_inode_xattrs_survive_ext4kit_changes";
    if let Err(why) = kernel_mount_available().and_then(|_| fuse_available()) {
        return skip(t, &why);
    }
    let dir = image_dir();
    let img = mkimg(dir.path(), "inxattr.img", "64M", &["-I", "256"]);
    let small: [(&str, &[u8]); 3] = [
        ("user.small", b"hello"),
        ("security.tag", b"\x01\x02\x03"),
        ("user.other", b"xyz"),
    ];
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        for f in ["a", "b"] {
            let p = m.path().join(f);
            std::fs::write(&p, pattern(10_000, 7)).unwrap();
            for (n, v) in small {
                let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
                run_ok(
                    tool("setfattr")
                        .args(["-n", n, "-v", &format!("0x{hex}")])
                        .arg(&p),
                )
                .unwrap();
            }
        }
        m.unmount().unwrap();
    }
    // The attributes are in the inode (the case this test is about).
    for f in ["/a", "/b"] {
        let raw = raw_inode(&img, f);
        let extra = usize::from(u16::from_le_bytes([raw[0x80], raw[0x81]]));
        let at = 128 + extra;
        assert_eq!(raw[at..at + 4], 0xEA02_0000u32.to_le_bytes(), "{f}");
    }
    let spec = |p: &str| format!("{}:{p}", img.display());
    for args in [
        vec!["chmod", "600"],
        vec!["chown", "1000:100"],
        vec!["truncate", "-s", "3000"],
        vec!["fallocate", "-n", "-l", "64K"],
    ] {
        run_ok(ext4kit().args(&args).arg(spec("/a"))).unwrap();
    }
    {
        let m = common::fuse::FuseMount::new(&img, &[]).unwrap();
        let p = m.path().join("b");
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        std::io::Write::write_all(&mut f, &pattern(5000, 9)).unwrap();
        f.sync_all().unwrap();
        drop(f);
        run_ok(tool("chmod").args(["640"]).arg(&p)).unwrap();
        run_ok(tool("truncate").args(["-s", "12000"]).arg(&p)).unwrap();
        run_ok(tool("setfattr").args(["-n", "user.new", "-v", "1"]).arg(&p)).unwrap();
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    let lo = LoopDev::attach(&img).unwrap();
    let mnt = Mount::new(lo.path(), "ext4", Some("ro")).unwrap();
    let got = kernel_xattrs(mnt.path(), &["/a", "/b"]);
    let meta = |f: &str| std::fs::metadata(mnt.path().join(f)).unwrap();
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (meta("a"), meta("b"));
    mnt.unmount().unwrap();
    drop(lo);
    for f in ["/a", "/b"] {
        let mut want: BTreeMap<Vec<u8>, Vec<u8>> = small
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec()))
            .collect();
        if f == "/b" {
            want.insert(b"user.new".to_vec(), b"1".to_vec());
        }
        assert_eq!(got[f], want, "xattrs of {f} after ext4kit's changes");
    }
    assert_eq!(
        (a.mode() & 0o7777, a.uid(), a.gid(), a.size()),
        (0o600, 1000, 100, 3000)
    );
    assert!(a.blocks() * 512 >= 64 << 10);
    assert_eq!((b.mode() & 0o7777, b.size()), (0o640, 12000));
}
