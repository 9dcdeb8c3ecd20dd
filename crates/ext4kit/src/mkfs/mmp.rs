//! Multiple mount protection (`-O mmp`): the MMP block as libext2fs's
//! `ext2fs_mmp_init` writes it at format time (lib/ext2fs/mmp.c 1.47.0).
//!
//! The block is allocated right after the journal, at the first free block
//! of the filesystem (`ext2fs_alloc_block2` with goal 0, see the planner),
//! zeroed, and its first 1024 bytes (`struct mmp_struct`) written: magic,
//! the "clean" sequence, the wall-clock time of the write (mke2fs takes it
//! from `gettimeofday`, not from `E2FSPROGS_FAKE_TIME`), the host name, the
//! device name as given on the command line, the check interval, and with
//! metadata_csum a CRC-32C of the structure seeded with the filesystem's
//! checksum seed.

use ext4kit_format::checksum::crc32c_raw;

pub use ext4kit_format::mmp::{
    MMP_CHECKSUM_OFFSET, MMP_MAGIC, MMP_MAX_UPDATE_INTERVAL, MMP_MIN_CHECK_INTERVAL, MMP_SEQ_CLEAN,
    MMP_STRUCT_SIZE, MMP_TIME_OFFSET, MMP_UPDATE_INTERVAL,
};

/// The host-dependent part of the MMP block, found by the caller (the
/// library does no I/O of its own for it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MmpHost {
    /// `gethostname()`, truncated to 64 bytes.
    pub nodename: Vec<u8>,
    /// The device name as given to mkfs, truncated to 32 bytes (strncpy).
    pub bdevname: Vec<u8>,
    /// Seconds since the epoch at the write (wall clock).
    pub time: u64,
}

/// The update interval mke2fs stores: the given one, else the default;
/// `None` when it is above the maximum (`ext2fs_mmp_init` fails).
pub fn effective_interval(requested: u16) -> Option<u16> {
    match requested {
        0 => Some(MMP_UPDATE_INTERVAL),
        i if i > MMP_MAX_UPDATE_INTERVAL => None,
        i => Some(i),
    }
}

/// The MMP block (`block_size` bytes, zero past the structure).
/// `csum_seed` is the filesystem's checksum seed when metadata_csum is on.
pub fn mmp_block(
    block_size: usize,
    interval: u16,
    host: &MmpHost,
    csum_seed: Option<u32>,
) -> Vec<u8> {
    let mut b = vec![0u8; block_size.max(MMP_STRUCT_SIZE)];
    b[0..4].copy_from_slice(&MMP_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&MMP_SEQ_CLEAN.to_le_bytes());
    b[MMP_TIME_OFFSET..MMP_TIME_OFFSET + 8].copy_from_slice(&host.time.to_le_bytes());
    let n = host.nodename.len().min(64);
    b[16..16 + n].copy_from_slice(&host.nodename[..n]);
    let n = host.bdevname.len().min(32);
    b[80..80 + n].copy_from_slice(&host.bdevname[..n]);
    let check = interval.max(MMP_MIN_CHECK_INTERVAL);
    b[112..114].copy_from_slice(&check.to_le_bytes());
    if let Some(seed) = csum_seed {
        let c = crc32c_raw(seed, &b[..MMP_CHECKSUM_OFFSET]);
        b[MMP_CHECKSUM_OFFSET..MMP_STRUCT_SIZE].copy_from_slice(&c.to_le_bytes());
    }
    b.truncate(block_size);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_of_the_structure() {
        let host = MmpHost {
            nodename: b"vm".to_vec(),
            bdevname: b"0123456789012345678901234567890123456789".to_vec(),
            time: 0x1122_3344_5566,
        };
        let b = mmp_block(4096, 3, &host, None);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..4], &[0x50, 0x4d, 0x4d, 0x00]);
        assert_eq!(&b[4..8], &[0x50, 0x4d, 0x4d, 0xff]);
        assert_eq!(&b[8..16], &0x1122_3344_5566u64.to_le_bytes());
        assert_eq!(&b[16..18], b"vm");
        assert_eq!(&b[80..112], &host.bdevname[..32], "strncpy: no NUL");
        assert_eq!(&b[112..114], &5u16.to_le_bytes(), "at least 5 seconds");
        assert!(b[114..].iter().all(|&x| x == 0), "no checksum without csum");
        let c = mmp_block(1024, 7, &host, Some(0x1234));
        assert_eq!(&c[112..114], &7u16.to_le_bytes());
        let want = crc32c_raw(0x1234, &c[..1020]);
        assert_eq!(&c[1020..1024], &want.to_le_bytes());
        assert_eq!(effective_interval(0), Some(5));
        assert_eq!(effective_interval(300), Some(300));
        assert_eq!(effective_interval(301), None);
    }
}
