//! `FITRIM` on the mount (util-linux `fstrim MOUNTPOINT`, `ext4kit fstrim
//! MOUNTPOINT`): the kernel forwards the ioctl of a file or directory on
//! a FUSE mount to the daemon (`fuse_file_ioctl`/`fuse_dir_ioctl`, as a
//! "restricted" ioctl: the argument's size and direction come from the
//! command, so the 24-byte `struct fstrim_range` arrives as `in_data`
//! and goes back as the reply's data).
//!
//! Semantics as ext4's `ext4_trim_fs`: `start` and `len` are bytes,
//! taken in whole blocks (`start >> bits`, `len >> bits`: the range is
//! `[start_blk, start_blk + len_blks)`, clamped to the filesystem);
//! `minlen` in bytes, free extents shorter than `minlen >> bits` blocks
//! are left alone; EINVAL for a start past the end, a length shorter
//! than a block, a minimum larger than a group; EPERM without root (the
//! kernel wants CAP_SYS_ADMIN); EOPNOTSUPP when the device cannot
//! discard. The reply is the range with `len` set to the bytes trimmed.
//! Groups trimmed before that freed nothing since are skipped (the
//! engine's in-memory `was_trimmed`, the kernel's
//! `EXT4_GROUP_INFO_WAS_TRIMMED`; on image files also every group whose
//! free space the file holds no data for), so a second run trims 0 bytes.
//!
//! Unlike the kernel, a read-only mount answers EROFS: its device is
//! opened read-only, so it cannot discard (the kernel trims `ro` mounts,
//! and refuses only `noload` ones).

use ext4kit_fs::discard::TrimRequest;
use fuser::Errno;

use crate::attr::errno;
use crate::shared::{Backend, Shared};

/// `FITRIM`: `_IOWR('X', 121, struct fstrim_range)`.
pub const FITRIM: u32 = 0xC018_5879;

/// `struct fstrim_range` (three native-endian `__u64`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FstrimRange {
    pub start: u64,
    pub len: u64,
    pub minlen: u64,
}

/// Size of `struct fstrim_range`.
pub const FSTRIM_RANGE_SIZE: usize = 24;

impl FstrimRange {
    /// Decode the ioctl's argument; `None` when it is too short.
    pub fn parse(b: &[u8]) -> Option<FstrimRange> {
        let word = |i: usize| -> Option<u64> {
            let s = b.get(i * 8..i * 8 + 8)?;
            Some(u64::from_ne_bytes(s.try_into().ok()?))
        };
        Some(FstrimRange {
            start: word(0)?,
            len: word(1)?,
            minlen: word(2)?,
        })
    }

    /// Encode for the reply.
    pub fn to_bytes(self) -> [u8; FSTRIM_RANGE_SIZE] {
        let mut out = [0u8; FSTRIM_RANGE_SIZE];
        out[..8].copy_from_slice(&self.start.to_ne_bytes());
        out[8..16].copy_from_slice(&self.len.to_ne_bytes());
        out[16..].copy_from_slice(&self.minlen.to_ne_bytes());
        out
    }

    /// The engine's request for this range on a filesystem of
    /// `block_size`-byte blocks: start and length in whole blocks, as
    /// `ext4_trim_fs` takes them (the engine checks the rest).
    pub fn request(&self, block_size: u32) -> TrimRequest {
        let bs = u64::from(block_size.max(1));
        TrimRequest {
            start: self.start / bs * bs,
            len: self.len / bs * bs,
            minlen: self.minlen,
        }
    }
}

/// Run `FITRIM` for a caller with `uid`: the reply's range (`len` = bytes
/// trimmed) or the errno ext4 gives.
pub fn fitrim(s: &Shared, uid: u32, in_data: &[u8], out_size: u32) -> Result<FstrimRange, Errno> {
    if uid != 0 {
        return Err(Errno::EPERM);
    }
    // The kernel copies the struct in and out of the caller's memory
    // (EFAULT there); a short buffer can only come from a broken caller.
    let range = FstrimRange::parse(in_data).ok_or(Errno::EFAULT)?;
    if (out_size as usize) < FSTRIM_RANGE_SIZE {
        return Err(Errno::EFAULT);
    }
    let fs = match &s.backend {
        Backend::Rw(fs) => fs,
        Backend::Ro(_) => return Err(Errno::EROFS),
    };
    // Blocks freed by the running transaction are busy until it commits
    // (ext4 trims only what a commit freed): after `rm; sync` they are
    // trimmed now, not after the next `commit=` tick.
    s.commit_all().map_err(|e| errno(&e))?;
    let rep = fs
        .trim(&range.request(s.block_size))
        .map_err(|e| errno(&e))?;
    if rep.unsupported {
        return Err(Errno::EOPNOTSUPP);
    }
    if rep.failed > 0 {
        return Err(Errno::EIO);
    }
    Ok(FstrimRange {
        len: rep.bytes,
        ..range
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitrim_is_iowr_x_121_of_24_bytes() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let iowr = (3u32 << 30) | ((FSTRIM_RANGE_SIZE as u32) << 16) | (u32::from(b'X') << 8) | 121;
        assert_eq!(FITRIM, iowr);
    }

    #[test]
    fn range_round_trips_and_short_input_is_refused() {
        let r = FstrimRange {
            start: 1,
            len: u64::MAX,
            minlen: 4096,
        };
        assert_eq!(FstrimRange::parse(&r.to_bytes()), Some(r));
        assert_eq!(FstrimRange::parse(&r.to_bytes()[..23]), None);
    }

    #[test]
    fn request_takes_whole_blocks_as_ext4_trim_fs() {
        let r = FstrimRange {
            start: 4095,
            len: 8191,
            minlen: 5000,
        };
        // start block 0, one block long: [0, 4096).
        let q = r.request(4096);
        assert_eq!((q.start, q.len, q.minlen), (0, 4096, 5000));
        let all = FstrimRange {
            start: 0,
            len: u64::MAX,
            minlen: 0,
        }
        .request(4096);
        assert_eq!(all.len, u64::MAX / 4096 * 4096);
        // Shorter than a block stays shorter than a block (EINVAL later).
        assert_eq!(
            FstrimRange {
                start: 0,
                len: 4095,
                minlen: 0
            }
            .request(4096)
            .len,
            0
        );
    }
}
