//! The MMP block (`struct mmp_struct`, multiple mount protection): its
//! fields, the special sequence numbers and its checksum (CRC-32C of the
//! bytes before `mmp_checksum`, seeded with the filesystem's checksum
//! seed, only with metadata_csum), as fs/ext4/mmp.c and lib/ext2fs/mmp.c.

use crate::checksum::crc32c_raw;

/// `EXT4_MMP_MAGIC`.
pub const MMP_MAGIC: u32 = 0x004D_4D50;
/// `EXT4_MMP_SEQ_CLEAN`: the sequence of a cleanly unmounted filesystem.
pub const MMP_SEQ_CLEAN: u32 = 0xFF4D_4D50;
/// `EXT4_MMP_SEQ_FSCK`: e2fsck (or another exclusive user) has it.
pub const MMP_SEQ_FSCK: u32 = 0xE24D_4D50;
/// `EXT4_MMP_SEQ_MAX`: live sequence numbers are at most this.
pub const MMP_SEQ_MAX: u32 = 0xE24D_4D4F;
/// `EXT4_MMP_UPDATE_INTERVAL`: the default update interval, in seconds.
pub const MMP_UPDATE_INTERVAL: u16 = 5;
/// `EXT4_MMP_MAX_UPDATE_INTERVAL`.
pub const MMP_MAX_UPDATE_INTERVAL: u16 = 300;
/// `EXT4_MMP_MIN_CHECK_INTERVAL`.
pub const MMP_MIN_CHECK_INTERVAL: u16 = 5;
/// `sizeof(struct mmp_struct)`.
pub const MMP_STRUCT_SIZE: usize = 1024;
/// Offset of `mmp_seq` (le32).
pub const MMP_SEQ_OFFSET: usize = 4;
/// Offset of `mmp_time` (le64).
pub const MMP_TIME_OFFSET: usize = 8;
/// Offset of `mmp_nodename` (64 bytes).
pub const MMP_NODENAME_OFFSET: usize = 16;
/// Offset of `mmp_bdevname` (32 bytes).
pub const MMP_BDEVNAME_OFFSET: usize = 80;
/// Offset of `mmp_check_interval` (le16).
pub const MMP_CHECK_INTERVAL_OFFSET: usize = 112;
/// Offset of `mmp_checksum` (le32), the end of what it covers.
pub const MMP_CHECKSUM_OFFSET: usize = 1020;

fn le32(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

/// The fields of an MMP block the protocol reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmpView {
    pub magic: u32,
    pub seq: u32,
    pub time: u64,
    /// Up to the first NUL.
    pub nodename: String,
    pub bdevname: String,
    pub check_interval: u16,
    pub checksum: u32,
}

fn cstr(b: &[u8]) -> String {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..n]).into_owned()
}

/// Parse the first [`MMP_STRUCT_SIZE`] bytes of `b` (`None` when shorter).
pub fn parse(b: &[u8]) -> Option<MmpView> {
    if b.len() < MMP_STRUCT_SIZE {
        return None;
    }
    let mut t = [0u8; 8];
    t.copy_from_slice(&b[MMP_TIME_OFFSET..MMP_TIME_OFFSET + 8]);
    Some(MmpView {
        magic: le32(b, 0),
        seq: le32(b, MMP_SEQ_OFFSET),
        time: u64::from_le_bytes(t),
        nodename: cstr(&b[MMP_NODENAME_OFFSET..MMP_NODENAME_OFFSET + 64]),
        bdevname: cstr(&b[MMP_BDEVNAME_OFFSET..MMP_BDEVNAME_OFFSET + 32]),
        check_interval: u16::from_le_bytes([
            b[MMP_CHECK_INTERVAL_OFFSET],
            b[MMP_CHECK_INTERVAL_OFFSET + 1],
        ]),
        checksum: le32(b, MMP_CHECKSUM_OFFSET),
    })
}

/// `ext4_mmp_csum`: CRC-32C (seed `csum_seed`) of the structure before
/// its checksum field. `b` holds at least [`MMP_STRUCT_SIZE`] bytes.
pub fn checksum(csum_seed: u32, b: &[u8]) -> u32 {
    crc32c_raw(csum_seed, &b[..MMP_CHECKSUM_OFFSET])
}

/// Store the checksum of `b` (see [`checksum`]).
pub fn set_checksum(csum_seed: u32, b: &mut [u8]) {
    let c = checksum(csum_seed, b);
    b[MMP_CHECKSUM_OFFSET..MMP_STRUCT_SIZE].copy_from_slice(&c.to_le_bytes());
}

/// Set the sequence, time, node name and device name (truncated to 64
/// and 32 bytes, zero-filled) of the structure in `b`.
pub fn set_fields(b: &mut [u8], seq: u32, time: u64, nodename: &[u8], bdevname: &[u8]) {
    b[MMP_SEQ_OFFSET..MMP_SEQ_OFFSET + 4].copy_from_slice(&seq.to_le_bytes());
    b[MMP_TIME_OFFSET..MMP_TIME_OFFSET + 8].copy_from_slice(&time.to_le_bytes());
    let nn = &mut b[MMP_NODENAME_OFFSET..MMP_NODENAME_OFFSET + 64];
    nn.fill(0);
    let n = nodename.len().min(64);
    nn[..n].copy_from_slice(&nodename[..n]);
    let bd = &mut b[MMP_BDEVNAME_OFFSET..MMP_BDEVNAME_OFFSET + 32];
    bd.fill(0);
    let n = bdevname.len().min(32);
    bd[..n].copy_from_slice(&bdevname[..n]);
}

/// The check interval the open's wait is made of
/// (`ext4_multi_mount_protect`): the superblock's update interval, at
/// least [`MMP_MIN_CHECK_INTERVAL`], or the block's when larger.
pub fn check_interval(sb_update_interval: u16, block_check_interval: u16) -> u32 {
    u32::from(sb_update_interval)
        .max(u32::from(MMP_MIN_CHECK_INTERVAL))
        .max(u32::from(block_check_interval))
}

/// The open's wait in seconds: `min(2 * check + 1, check + 60)`.
pub fn wait_secs(check_interval: u32) -> u32 {
    (2 * check_interval + 1).min(check_interval + 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_wait_rule() {
        let mut b = vec![0u8; 1024];
        b[0..4].copy_from_slice(&MMP_MAGIC.to_le_bytes());
        set_fields(&mut b, 77, 0x0012_3456_789a, b"host", b"/dev/x");
        b[112..114].copy_from_slice(&9u16.to_le_bytes());
        set_checksum(3, &mut b);
        let v = parse(&b).unwrap();
        assert_eq!(v.magic, MMP_MAGIC);
        assert_eq!(v.seq, 77);
        assert_eq!(v.time, 0x0012_3456_789a);
        assert_eq!(v.nodename, "host");
        assert_eq!(v.bdevname, "/dev/x");
        assert_eq!(v.check_interval, 9);
        assert_eq!(v.checksum, checksum(3, &b));
        assert_eq!(check_interval(1, 0), 5);
        assert_eq!(check_interval(7, 5), 7);
        assert_eq!(check_interval(1, 10), 10);
        assert_eq!(wait_secs(5), 11);
        assert_eq!(wait_secs(100), 160);
        assert!(parse(&b[..100]).is_none());
    }
}
