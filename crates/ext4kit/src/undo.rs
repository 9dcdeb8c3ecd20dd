//! e2fsprogs' undo files (`lib/ext2fs/undo_io.c`, format `E2UNDO02`), as
//! `mke2fs -z` writes them and `e2undo` replays them.
//!
//! [`UndoDevice`] wraps the target (seen from the filesystem's first byte,
//! i.e. above `-E offset=`): before a write, zeroout or discard touches a
//! part of the target for the first time, the old bytes of every undo
//! block it touches (`block_size`, 32 KiB for filesystem blocks up to 4
//! KiB) are appended to the undo file. The file is
//!
//! ```text
//! block 0   header (512 bytes: counts, sizes, checksums, fs_offset)
//! block 1   a copy of the target's current superblock (s_magic inverted)
//! block 2   key block: magic, crc32c, then {fsblk, crc32c, size} keys
//! 3..       the data of those keys, then the next key block, its data...
//! ```
//!
//! Keys are in units of the filesystem block size given in the header and
//! relative to the filesystem's start (`fs_offset`, with the
//! `FS_OFFSET` compat flag, tells e2undo where that is); consecutive undo
//! blocks extend the previous key up to 512 undo blocks, as undo_io does.
//!
//! The crash rule is undo_io's: data first, then the key block that lists
//! it, then the header that counts it, so that the file is consistent
//! after each step and an interrupted format leaves a usable (unfinished)
//! undo file. ext4kit adds an fdatasync of the undo file before the target
//! is written, so that the saved bytes are on stable storage before they
//! are overwritten, and refreshes the superblock copy after a write to the
//! superblock, so that the copy matches the target also when the run stops
//! between the last write and [`UndoDevice::finish`].
//!
//! An existing undo file is appended to, as undo_io reopens one: it must
//! be an undo file whose superblock copy matches the target (the file of
//! an earlier run that produced what the target holds now); blocks it
//! already saved are not saved again, so `e2undo` goes back to the state
//! before the first run. Unlike undo_io, the keys keep the file's own
//! filesystem block size and undo block size (undo_io rewrites the header
//! with the new block size, which misplaces the old keys when it differs),
//! and the written-block map is relative to the filesystem (undo_io's
//! write path and its reopen disagree there when `fs_offset` is not 0).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ext4kit_device::{Device, DeviceError, DiscardOutcome, Result as DevResult};
use ext4kit_format::checksum::crc32c_raw;

/// The header magic.
pub const MAGIC: &[u8; 8] = b"E2UNDO02";
/// A key block's magic.
pub const KEYBLOCK_MAGIC: u32 = 0xCADE_CADE;
/// Header state: the undo file is complete.
pub const STATE_FINISHED: u32 = 0x1;
/// Compat feature: `fs_offset` is valid.
pub const FEATURE_COMPAT_FS_OFFSET: u32 = 0x1;
/// Undo block sizes e2undo accepts.
pub const MIN_BLOCK_SIZE: u32 = 1024;
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// A key covers at most this many undo blocks.
pub const MAX_EXTENT_BLOCKS: u64 = 512;

const HEADER_SIZE: usize = 512;
const SUPERBLOCK_OFFSET: u64 = 1024;
const SUPERBLOCK_SIZE: usize = 1024;
const KEY_SIZE: usize = 16;
const KEYBLOCK_HEADER: usize = 16;
/// `s_magic` inside the superblock.
const S_MAGIC: usize = 0x38;

/// mke2fs's undo block size (`tdb_data_size`) for a filesystem block size.
pub fn block_size_for(fs_block_size: u32) -> u32 {
    if fs_block_size <= 4096 {
        32768
    } else {
        fs_block_size.saturating_mul(8).min(MAX_BLOCK_SIZE)
    }
}

/// Errors of an undo file. Each names the undo file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UndoError {
    /// The file cannot be opened or created.
    #[error("{}: {err} while trying to open the undo file", path.display())]
    Open { path: PathBuf, err: io::Error },
    /// Reading or writing the undo file failed.
    #[error("{}: {err} while writing the undo file", path.display())]
    Io { path: PathBuf, err: io::Error },
    /// Not an undo file e2undo could replay (undo_io's
    /// `EXT2_ET_UNDO_FILE_CORRUPT`).
    #[error("{}: Undo file corrupt ({why})", path.display())]
    Corrupt { path: PathBuf, why: &'static str },
    /// An undo file of another filesystem state (`EXT2_ET_UNDO_FILE_WRONG`).
    #[error("{}: Wrong undo file for this filesystem", path.display())]
    Wrong { path: PathBuf },
    /// Reading the target failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// How to write an undo file for one target.
#[derive(Clone, Copy, Debug)]
pub struct UndoParams {
    /// Undo block size ([`block_size_for`]) for a new file.
    pub block_size: u32,
    /// Unit of the keys (the filesystem block size) for a new file.
    pub fs_block_size: u32,
    /// `-E offset=`: where the filesystem starts on the target (recorded
    /// for e2undo; the wrapped device is already shifted).
    pub fs_offset: u64,
    /// How many bytes (from the filesystem's start) the target held before
    /// this run: nothing past them is saved (a file being extended, a
    /// file just created), as undo_io's short reads.
    pub old_len: u64,
}

/// Tdb block indices already saved: disjoint `[start, end)` runs.
#[derive(Default, Debug)]
struct Saved(BTreeMap<u64, u64>);

impl Saved {
    fn contains(&self, k: u64) -> bool {
        self.0.range(..=k).next_back().is_some_and(|(_, &e)| k < e)
    }
    fn insert(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let (mut s, mut e) = (s, e);
        let overlapping: Vec<(u64, u64)> = self
            .0
            .range(..=e)
            .rev()
            .take_while(|(_, end)| **end >= s)
            .map(|(&a, &b)| (a, b))
            .collect();
        for (a, b) in overlapping {
            self.0.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.0.insert(s, e);
    }
}

/// The open undo file and where its next pieces go.
#[derive(Debug)]
pub struct UndoFile {
    path: PathBuf,
    file: File,
    /// Undo block size.
    tdb: u64,
    /// Unit of `fsblk` in the keys.
    fs_bs: u64,
    fs_offset: u64,
    old_len: u64,
    saved: Saved,
    keyb: Vec<u8>,
    keys_in_block: usize,
    num_keys: u64,
    key_blk: u64,
    next_blk: u64,
    super_blk: u64,
    first_key_blk: u64,
    state: u32,
    f_compat: u32,
    /// Blocks 0..=2 exist (undo_setup_tdb has run).
    set_up: bool,
    /// A save failed: the target must not be written any more.
    failed: bool,
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The target's superblock area (1024 bytes at byte 1024), or `None` when
/// the target is too small to have one.
fn read_super(dev: &dyn Device) -> DevResult<Option<Vec<u8>>> {
    if dev.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64 {
        return Ok(None);
    }
    let mut sb = vec![0u8; SUPERBLOCK_SIZE];
    dev.read_at(&mut sb, SUPERBLOCK_OFFSET)?;
    Ok(Some(sb))
}

impl UndoFile {
    /// Open (or create, mode 0600) the undo file at `path` for the target
    /// `dev` (seen from the filesystem's start; `None` when the target does
    /// not exist yet). An empty file is started afresh; a non-empty one
    /// must be an undo file whose superblock copy matches `dev`, and is
    /// appended to. Nothing is written here.
    pub fn open(
        path: &Path,
        dev: Option<&dyn Device>,
        p: UndoParams,
    ) -> Result<UndoFile, UndoError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|err| UndoError::Open {
                path: path.to_path_buf(),
                err,
            })?;
        let len = file
            .metadata()
            .map_err(|err| UndoError::Open {
                path: path.to_path_buf(),
                err,
            })?
            .len();
        let tdb = u64::from(p.block_size.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE));
        let mut u = UndoFile {
            path: path.to_path_buf(),
            file,
            tdb,
            fs_bs: u64::from(p.fs_block_size.max(1)),
            fs_offset: p.fs_offset,
            old_len: p.old_len,
            saved: Saved::default(),
            keyb: vec![0u8; tdb as usize],
            keys_in_block: 0,
            num_keys: 0,
            key_blk: 2,
            next_blk: 3,
            super_blk: 1,
            first_key_blk: 2,
            state: 0,
            f_compat: 0,
            set_up: false,
            failed: false,
        };
        if len > 0 {
            u.reopen(dev)?;
        }
        Ok(u)
    }

    /// The undo file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, why: &'static str) -> UndoError {
        UndoError::Corrupt {
            path: self.path.clone(),
            why,
        }
    }

    fn io(&self, err: io::Error) -> UndoError {
        UndoError::Io {
            path: self.path.clone(),
            err,
        }
    }

    fn keys_per_block(&self) -> usize {
        (self.tdb as usize / KEY_SIZE) - 1
    }

    /// undo_io's `try_reopen_undo_file`.
    fn reopen(&mut self, dev: Option<&dyn Device>) -> Result<(), UndoError> {
        let mut hdr = [0u8; HEADER_SIZE];
        self.file
            .read_exact_at(&mut hdr, 0)
            .map_err(|_| self.corrupt("no header"))?;
        if &hdr[..8] != MAGIC {
            return Err(self.corrupt("not an undo file"));
        }
        if crc32c_raw(!0, &hdr[..HEADER_SIZE - 4]) != le32(&hdr, HEADER_SIZE - 4) {
            return Err(self.corrupt("header checksum"));
        }
        let block_size = le32(&hdr, 32);
        let fs_block_size = le32(&hdr, 36);
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size)
            || fs_block_size == 0
            || !block_size.is_multiple_of(fs_block_size)
        {
            return Err(self.corrupt("block size"));
        }
        if le32(&hdr, 52) != 0 || le32(&hdr, 56) != 0 {
            return Err(self.corrupt("unknown features"));
        }
        let (tdb, fs_bs) = (u64::from(block_size), u64::from(fs_block_size));
        let super_blk = le64(&hdr, 16);
        let key_offset = le64(&hdr, 24);
        let num_keys = le64(&hdr, 8);
        // Does the superblock copy match the target?
        let cur = match dev {
            Some(d) => read_super(d)?,
            None => None,
        };
        let mut copy = vec![0u8; SUPERBLOCK_SIZE];
        let wrong = || UndoError::Wrong {
            path: self.path.clone(),
        };
        super_blk
            .checked_mul(tdb)
            .and_then(|off| self.file.read_exact_at(&mut copy, off).ok())
            .ok_or_else(wrong)?;
        copy[S_MAGIC] = !copy[S_MAGIC];
        copy[S_MAGIC + 1] = !copy[S_MAGIC + 1];
        if cur.as_deref() != Some(&copy[..]) || crc32c_raw(!0, &copy) != le32(&hdr, 40) {
            return Err(wrong());
        }
        // Load the keys: the written-block map and where to go on.
        self.tdb = tdb;
        self.fs_bs = fs_bs;
        self.keyb = vec![0u8; tdb as usize];
        let kpb = self.keys_per_block() as u64;
        let mut lblk = key_offset;
        self.key_blk = key_offset;
        self.next_blk = key_offset.max(2) + 1;
        self.keys_in_block = 0;
        let mut i = 0u64;
        while i < num_keys {
            self.key_blk = lblk;
            let mut kb = vec![0u8; tdb as usize];
            lblk.checked_mul(tdb)
                .and_then(|off| self.file.read_exact_at(&mut kb, off).ok())
                .ok_or_else(|| self.corrupt("missing key block"))?;
            if le32(&kb, 0) != KEYBLOCK_MAGIC {
                return Err(self.corrupt("key block magic"));
            }
            let crc = le32(&kb, 4);
            put32(&mut kb, 4, 0);
            if crc32c_raw(!0, &kb) != crc {
                return Err(self.corrupt("key block checksum"));
            }
            lblk += 1;
            let n = (num_keys - i).min(kpb) as usize;
            for j in 0..n {
                let at = KEYBLOCK_HEADER + j * KEY_SIZE;
                let fsblk = le64(&kb, at);
                let size = u64::from(le32(&kb, at + 12));
                let start = fsblk
                    .checked_mul(fs_bs)
                    .ok_or_else(|| self.corrupt("key out of range"))?;
                let first = start / tdb;
                self.saved.insert(first, first + size.div_ceil(tdb));
                lblk += size.div_ceil(tdb);
                self.next_blk = lblk;
                self.keys_in_block = j + 1;
            }
            self.keyb = kb;
            i += kpb;
        }
        self.num_keys = num_keys;
        if self.keys_in_block == self.keys_per_block() {
            // A full last key block: the next one goes after its data.
            self.keyb.fill(0);
            self.keys_in_block = 0;
            self.key_blk = self.next_blk;
            self.next_blk += 1;
        }
        self.super_blk = super_blk;
        self.first_key_blk = key_offset;
        self.state = le32(&hdr, 44) & !STATE_FINISHED;
        self.f_compat = le32(&hdr, 48);
        self.set_up = true;
        Ok(())
    }

    /// undo_io's `undo_setup_tdb`: room for the header, the superblock
    /// copy and the first key block.
    fn setup(&mut self) -> Result<(), UndoError> {
        if self.set_up {
            return Ok(());
        }
        let want = 3 * self.tdb;
        let len = self.file.metadata().map_err(|e| self.io(e))?.len();
        if len < want {
            self.file.set_len(want).map_err(|e| self.io(e))?;
        }
        self.set_up = true;
        Ok(())
    }

    fn write_key_block(&mut self) -> Result<(), UndoError> {
        put32(&mut self.keyb, 0, KEYBLOCK_MAGIC);
        put32(&mut self.keyb, 4, 0);
        put64(&mut self.keyb, 8, 0);
        let crc = crc32c_raw(!0, &self.keyb);
        put32(&mut self.keyb, 4, crc);
        self.file
            .write_all_at(&self.keyb, self.key_blk * self.tdb)
            .map_err(|e| self.io(e))
    }

    /// undo_io's `write_undo_indexes` without the key block: the header
    /// and the copy of the target's superblock as it is now.
    fn write_header(&mut self, dev: &dyn Device) -> Result<(), UndoError> {
        let sb = read_super(dev)?.unwrap_or_else(|| vec![0u8; SUPERBLOCK_SIZE]);
        self.write_header_with(sb)
    }

    /// The header with `sb` as the superblock copy.
    fn write_header_with(&mut self, mut sb: Vec<u8>) -> Result<(), UndoError> {
        let sb_crc = crc32c_raw(!0, &sb);
        sb[S_MAGIC] = !sb[S_MAGIC];
        sb[S_MAGIC + 1] = !sb[S_MAGIC + 1];
        if self.fs_offset != 0 {
            self.f_compat |= FEATURE_COMPAT_FS_OFFSET;
        } else {
            self.f_compat &= !FEATURE_COMPAT_FS_OFFSET;
        }
        let mut hdr = [0u8; HEADER_SIZE];
        hdr[..8].copy_from_slice(MAGIC);
        put64(&mut hdr, 8, self.num_keys);
        put64(&mut hdr, 16, self.super_blk);
        put64(&mut hdr, 24, self.first_key_blk);
        put32(&mut hdr, 32, self.tdb as u32);
        put32(&mut hdr, 36, self.fs_bs as u32);
        put32(&mut hdr, 40, sb_crc);
        put32(&mut hdr, 44, self.state);
        put32(&mut hdr, 48, self.f_compat);
        put64(&mut hdr, 64, self.fs_offset);
        let crc = crc32c_raw(!0, &hdr[..HEADER_SIZE - 4]);
        put32(&mut hdr, HEADER_SIZE - 4, crc);
        self.file.write_all_at(&hdr, 0).map_err(|e| self.io(e))?;
        self.file
            .write_all_at(&sb, self.super_blk * self.tdb)
            .map_err(|e| self.io(e))
    }

    /// Save the old content of every undo block `[off, off+len)` touches
    /// that is not saved yet; with `zeroing`, blocks the device proves
    /// zero are left for later (a zeroout does not change them). Then the
    /// key block and header, and an fdatasync, before the caller writes.
    /// `sb_after`: what the superblock will be after this operation
    /// (when it changes it): the header is written with it (and synced)
    /// before the target changes.
    fn save(
        &mut self,
        dev: &dyn Device,
        off: u64,
        len: u64,
        zeroing: bool,
        sb_after: Option<Vec<u8>>,
    ) -> Result<(), UndoError> {
        if len == 0 {
            return Ok(());
        }
        let tdb = self.tdb;
        let first = off / tdb;
        let last = (off + len - 1) / tdb;
        let mut added = false;
        let mut buf = Vec::new();
        let mut k = first;
        while k <= last {
            if self.saved.contains(k) {
                k += 1;
                continue;
            }
            let start = k * tdb;
            if start >= self.old_len {
                // Nothing was there: as undo_io's short read of 0 bytes.
                self.saved.insert(k, last + 1);
                break;
            }
            let n = tdb.min(self.old_len - start);
            if zeroing && dev.is_known_zero(start, n)? {
                k += 1;
                continue;
            }
            self.saved.insert(k, k + 1);
            buf.resize(n as usize, 0);
            dev.read_at(&mut buf, start)?;
            self.setup()?;
            self.add_block(start, &buf)?;
            added = true;
            k += 1;
        }
        if added && self.keys_in_block > 0 {
            self.write_key_block()?;
        }
        if added || (sb_after.is_some() && self.set_up) {
            match sb_after {
                Some(sb) => self.write_header_with(sb)?,
                None => self.write_header(dev)?,
            }
            self.file.sync_data().map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// Append one undo block's data and its key (extending the last key
    /// when it continues it, as undo_io does).
    fn add_block(&mut self, start: u64, data: &[u8]) -> Result<(), UndoError> {
        let fsblk = start / self.fs_bs;
        let n = data.len() as u64;
        let extend = self.keys_in_block > 0 && {
            let at = KEYBLOCK_HEADER + (self.keys_in_block - 1) * KEY_SIZE;
            let kf = le64(&self.keyb, at);
            let ksz = u64::from(le32(&self.keyb, at + 12));
            (kf * self.fs_bs + self.fs_bs - 1 + ksz) / self.fs_bs == fsblk
                && MAX_EXTENT_BLOCKS * self.tdb > ksz + n
        };
        if extend {
            let at = KEYBLOCK_HEADER + (self.keys_in_block - 1) * KEY_SIZE;
            let crc = crc32c_raw(le32(&self.keyb, at + 8), data);
            let ksz = le32(&self.keyb, at + 12);
            put32(&mut self.keyb, at + 8, crc);
            put32(&mut self.keyb, at + 12, ksz + n as u32);
        } else {
            let at = KEYBLOCK_HEADER + self.keys_in_block * KEY_SIZE;
            put64(&mut self.keyb, at, fsblk);
            put32(&mut self.keyb, at + 8, crc32c_raw(!0, data));
            put32(&mut self.keyb, at + 12, n as u32);
            self.keys_in_block += 1;
            self.num_keys += 1;
        }
        self.file
            .write_all_at(data, self.next_blk * self.tdb)
            .map_err(|e| self.io(e))?;
        self.next_blk += 1;
        if self.keys_in_block == self.keys_per_block() {
            self.write_key_block()?;
            self.keyb.fill(0);
            self.keys_in_block = 0;
            self.key_blk = self.next_blk;
            self.next_blk += 1;
        }
        Ok(())
    }
}

/// What an operation leaves where it writes.
#[derive(Clone, Copy)]
enum After<'a> {
    Bytes(&'a [u8]),
    Zeros,
    Unknown,
}

/// A device whose old content is saved into an undo file before it is
/// changed (see the module documentation).
pub struct UndoDevice<D: Device> {
    inner: D,
    undo: Mutex<UndoFile>,
}

impl<D: Device> UndoDevice<D> {
    /// `inner` (seen from the filesystem's start) with `undo` recording.
    pub fn new(inner: D, undo: UndoFile) -> Self {
        UndoDevice {
            inner,
            undo: Mutex::new(undo),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UndoFile> {
        self.undo.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The undo file's path.
    pub fn undo_path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    /// The undo block size (the file's own when it was appended to).
    pub fn undo_block_size(&self) -> u32 {
        self.lock().tdb as u32
    }

    /// Undo blocks saved so far in this file (keys, including earlier runs').
    pub fn num_keys(&self) -> u64 {
        self.lock().num_keys
    }

    /// Mark the undo file complete (undo_io's close): the header with the
    /// final superblock copy and `STATE_FINISHED`, synced. Call after the
    /// target's last write and flush. Honours
    /// `UNDO_IO_SIMULATE_UNFINISHED` as undo_io does (for tests).
    pub fn finish(&self) -> Result<(), UndoError> {
        let mut u = self.lock();
        if u.failed {
            return Err(u.corrupt("an earlier save failed"));
        }
        u.setup()?;
        if std::env::var_os("UNDO_IO_SIMULATE_UNFINISHED").is_none() {
            u.state |= STATE_FINISHED;
        }
        if u.keys_in_block > 0 {
            u.write_key_block()?;
        }
        u.write_header(&self.inner)?;
        u.file.sync_data().map_err(|e| u.io(e))
    }

    /// The superblock as it is and as it will be after `new` (the bytes
    /// this operation puts at `off`, `None` for zeros) is applied, when
    /// the operation touches it.
    fn super_change(
        &self,
        off: u64,
        len: u64,
        new: Option<&[u8]>,
    ) -> DevResult<Option<(Vec<u8>, Vec<u8>)>> {
        let sb_end = SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64;
        if off >= sb_end || off.saturating_add(len) <= SUPERBLOCK_OFFSET {
            return Ok(None);
        }
        let Some(old) = read_super(&self.inner)? else {
            return Ok(None);
        };
        let mut after = old.clone();
        let (s, e) = (off.max(SUPERBLOCK_OFFSET), (off + len).min(sb_end));
        let dst = &mut after[(s - SUPERBLOCK_OFFSET) as usize..(e - SUPERBLOCK_OFFSET) as usize];
        match new {
            Some(b) => dst.copy_from_slice(&b[(s - off) as usize..(e - off) as usize]),
            None => dst.fill(0),
        }
        Ok(Some((old, after)))
    }

    /// Before an operation: save what it overwrites; when it changes the
    /// superblock, the header's copy is already the new one (a run that
    /// stops right after the write leaves a matching undo file). Returns
    /// the superblock as it was, for [`UndoDevice::failed_write`].
    fn before(
        &self,
        off: u64,
        len: u64,
        zeroing: bool,
        new: After<'_>,
    ) -> DevResult<Option<Vec<u8>>> {
        let mut u = self.lock();
        if u.failed {
            return Err(DeviceError::Other(format!(
                "{}: the undo file could not be written; the target is left alone",
                u.path.display()
            )));
        }
        let change = match new {
            After::Bytes(b) => self.super_change(off, len, Some(b))?,
            After::Zeros => self.super_change(off, len, None)?,
            After::Unknown => None,
        };
        let (old, after) = match change {
            Some((o, a)) => (Some(o), Some(a)),
            None => (None, None),
        };
        u.save(&self.inner, off, len, zeroing, after).map_err(|e| {
            u.failed = true;
            match e {
                UndoError::Device(d) => d,
                other => DeviceError::Other(other.to_string()),
            }
        })?;
        Ok(old)
    }

    /// The operation failed: the copy goes back to the superblock as it
    /// was (best effort; the target's state is unknown anyway).
    fn failed_write(&self, old: Option<Vec<u8>>) {
        if let Some(sb) = old {
            let mut u = self.lock();
            if u.set_up {
                let _ = u.write_header_with(sb);
            }
        }
    }
}

impl<D: Device> Device for UndoDevice<D> {
    ext4kit_device::forward_device!(inner; write_at, zeroout, discard);

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        let old = self.before(offset, buf.len() as u64, false, After::Bytes(buf))?;
        self.inner
            .write_at(buf, offset)
            .inspect_err(|_| self.failed_write(old))
    }

    fn zeroout(&self, offset: u64, len: u64) -> DevResult<()> {
        let old = self.before(offset, len, true, After::Zeros)?;
        self.inner
            .zeroout(offset, len)
            .inspect_err(|_| self.failed_write(old))
    }

    fn discard(&self, offset: u64, len: u64) -> DevResult<DiscardOutcome> {
        // What a discard leaves is not known before: the copy is taken
        // after it.
        self.before(offset, len, false, After::Unknown)?;
        let r = self.inner.discard(offset, len)?;
        let sb_end = SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64;
        if offset < sb_end && offset.saturating_add(len) > SUPERBLOCK_OFFSET {
            let mut u = self.lock();
            if u.set_up && !u.failed {
                u.write_header(&self.inner)
                    .map_err(|e| DeviceError::Other(e.to_string()))?;
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_device::MemDevice;

    fn params(old_len: u64) -> UndoParams {
        UndoParams {
            block_size: 32768,
            fs_block_size: 4096,
            fs_offset: 0,
            old_len,
        }
    }

    /// A minimal reader of the format, as e2undo reads it: (fsblk, data).
    fn replay_keys(path: &Path) -> (Vec<u8>, Vec<(u64, Vec<u8>)>) {
        let f = std::fs::read(path).unwrap();
        let tdb = le32(&f, 32) as usize;
        let fs_bs = u64::from(le32(&f, 36));
        let n = le64(&f, 8);
        let kpb = (tdb / KEY_SIZE - 1) as u64;
        let mut lblk = le64(&f, 24) as usize;
        let mut out = Vec::new();
        let mut i = 0;
        while i < n {
            let kb = &f[lblk * tdb..(lblk + 1) * tdb];
            assert_eq!(le32(kb, 0), KEYBLOCK_MAGIC);
            let mut c = kb.to_vec();
            put32(&mut c, 4, 0);
            assert_eq!(crc32c_raw(!0, &c), le32(kb, 4));
            lblk += 1;
            for j in 0..(n - i).min(kpb) as usize {
                let at = KEYBLOCK_HEADER + j * KEY_SIZE;
                let size = le32(kb, at + 12) as usize;
                let data = f[lblk * tdb..lblk * tdb + size].to_vec();
                assert_eq!(crc32c_raw(!0, &data), le32(kb, at + 8));
                out.push((le64(kb, at) * fs_bs, data));
                lblk += size.div_ceil(tdb);
            }
            i += kpb;
        }
        (f[..HEADER_SIZE].to_vec(), out)
    }

    fn restore(dev: &MemDevice, keys: &[(u64, Vec<u8>)]) {
        for (off, data) in keys {
            dev.write_at(data, *off).unwrap();
        }
    }

    fn snapshot(dev: &MemDevice) -> Vec<u8> {
        let mut v = vec![0u8; dev.size() as usize];
        dev.read_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn saves_old_bytes_once_and_restores_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.e2undo");
        let size = 1 << 20;
        let mem = MemDevice::new(size);
        let old: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        mem.write_at(&old, 0).unwrap();
        let f = UndoFile::open(&path, Some(&mem), params(size)).unwrap();
        let dev = UndoDevice::new(&mem, f);
        dev.write_at(&[1u8; 100], 5000).unwrap();
        dev.write_at(&[2u8; 70000], 40000).unwrap();
        dev.zeroout(0, 4096).unwrap();
        dev.write_at(&[3u8; 10], size - 10).unwrap();
        dev.finish().unwrap();
        let (hdr, keys) = replay_keys(&path);
        assert_eq!(le32(&hdr, 44), STATE_FINISHED);
        // Undo blocks 0..=3 (the first three contiguous: one key) and 31.
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].0, 0);
        assert_eq!(keys[0].1.len(), 4 * 32768);
        assert_eq!(keys[1].0, size - 32768);
        restore(&mem, &keys);
        assert_eq!(snapshot(&mem), old);
    }

    #[test]
    fn nothing_past_the_old_length_and_known_zero_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.e2undo");
        let mem = MemDevice::new(1 << 20);
        mem.write_at(&[9u8; 1000], 100).unwrap();
        let f = UndoFile::open(&path, Some(&mem), params(40000)).unwrap();
        let dev = UndoDevice::new(&mem, f);
        // A hole zeroed: nothing to save; past the old length: nothing.
        dev.zeroout(65536, 65536).unwrap();
        dev.write_at(&[1u8; 100_000], 32768).unwrap();
        dev.finish().unwrap();
        let (_, keys) = replay_keys(&path);
        assert_eq!(keys.len(), 1);
        assert_eq!((keys[0].0, keys[0].1.len()), (32768, 40000 - 32768));
    }

    #[test]
    fn reopen_appends_and_refuses_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.e2undo");
        let size = 1 << 20;
        let mem = MemDevice::new(size);
        let old: Vec<u8> = (0..size).map(|i| (i % 13) as u8 + 1).collect();
        mem.write_at(&old, 0).unwrap();
        {
            let f = UndoFile::open(&path, Some(&mem), params(size)).unwrap();
            let dev = UndoDevice::new(&mem, f);
            dev.write_at(&[1u8; 3000], 0).unwrap();
            dev.finish().unwrap();
        }
        {
            // A second run into the same file: block 0 is not saved again.
            let f = UndoFile::open(&path, Some(&mem), params(size)).unwrap();
            let dev = UndoDevice::new(&mem, f);
            dev.write_at(&[2u8; 3000], 0).unwrap();
            dev.write_at(&[2u8; 3000], 300_000).unwrap();
            dev.finish().unwrap();
            assert_eq!(dev.num_keys(), 2);
        }
        let (_, keys) = replay_keys(&path);
        restore(&mem, &keys);
        assert_eq!(snapshot(&mem), old);
        // The target changed behind the file's back: wrong file.
        mem.write_at(&[0xAAu8; 1024], 1024).unwrap();
        let e = UndoFile::open(&path, Some(&mem), params(size)).unwrap_err();
        assert!(matches!(e, UndoError::Wrong { .. }), "{e}");
        // Not an undo file at all.
        std::fs::write(&path, b"hello").unwrap();
        let e = UndoFile::open(&path, Some(&mem), params(size)).unwrap_err();
        assert!(e.to_string().contains("Undo file corrupt"), "{e}");
    }

    #[test]
    fn key_blocks_fill_and_continue() {
        // 1 KiB undo blocks hold 63 keys a key block; every other block
        // written makes a key of its own.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.e2undo");
        let size: u64 = 300 * 1024;
        let mem = MemDevice::new(size);
        let old: Vec<u8> = (0..size).map(|i| (i / 1024) as u8 ^ 0x5A).collect();
        mem.write_at(&old, 0).unwrap();
        let p = UndoParams {
            block_size: 1024,
            fs_block_size: 1024,
            fs_offset: 0,
            old_len: size,
        };
        let f = UndoFile::open(&path, Some(&mem), p).unwrap();
        let dev = UndoDevice::new(&mem, f);
        for b in (0..300).step_by(2) {
            dev.write_at(&[0u8; 1024], b * 1024).unwrap();
        }
        dev.finish().unwrap();
        assert_eq!(dev.num_keys(), 150);
        let (_, keys) = replay_keys(&path);
        assert_eq!(keys.len(), 150);
        restore(&mem, &keys);
        assert_eq!(snapshot(&mem), old);
        // And it reopens (the superblock copy is of the final state).
        let f = UndoFile::open(&path, Some(&mem), p).unwrap();
        assert_eq!(f.num_keys, 150);
        assert_eq!(f.keys_in_block, 150 - 2 * 63);
    }
}
