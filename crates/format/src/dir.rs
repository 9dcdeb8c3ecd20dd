//! Linear directory blocks: `ext4_dir_entry_2` records and the checksum tail.

/// `file_type` values in directory entries.
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;
/// `file_type` of the checksum tail's fake entry.
pub const FT_DIR_CSUM: u8 = 0xDE;
/// Size of the checksum tail.
pub const TAIL_SIZE: usize = 12;

/// A record length as stored (`ext4_rec_len_from_disk`): 64 KiB blocks
/// store 65536 as 0 or 65535.
pub fn rec_len_from_disk(dlen: u16, block_size: usize) -> usize {
    if block_size < 65536 {
        usize::from(dlen)
    } else if dlen == 0xFFFF || dlen == 0 {
        65536
    } else {
        usize::from(dlen & 0xFFFC) | (usize::from(dlen & 3) << 16)
    }
}

/// A record length as stored (`ext4_rec_len_to_disk`): 65536 in a 64 KiB
/// block is stored as 65535, larger lengths keep their high bits in the
/// low two bits.
pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    if block_size < 65536 {
        len as u16
    } else if len == 65536 {
        0xFFFF
    } else {
        ((len & 0xFFFC) | ((len >> 16) & 3)) as u16
    }
}

/// Length of a directory record holding a name of `name_len` bytes.
pub const fn rec_len(name_len: usize) -> usize {
    (8 + name_len + 3) & !3
}

/// Write one directory entry at `off`; returns the offset after it.
pub fn put_entry(
    buf: &mut [u8],
    off: usize,
    ino: u32,
    rec_len: u16,
    name: &[u8],
    file_type: u8,
) -> usize {
    buf[off..off + 4].copy_from_slice(&ino.to_le_bytes());
    buf[off + 4..off + 6].copy_from_slice(&rec_len.to_le_bytes());
    buf[off + 6] = name.len() as u8;
    buf[off + 7] = file_type;
    buf[off + 8..off + 8 + name.len()].copy_from_slice(name);
    off + usize::from(rec_len)
}

/// Write the checksum tail at the end of the block and fill its checksum.
pub fn put_tail(buf: &mut [u8], dir_ino: u32, generation: u32, csum: &crate::Csum) {
    let t = buf.len() - TAIL_SIZE;
    buf[t..t + 4].fill(0);
    buf[t + 4..t + 6].copy_from_slice(&(TAIL_SIZE as u16).to_le_bytes());
    buf[t + 6] = 0;
    buf[t + 7] = FT_DIR_CSUM;
    let c = csum.dir_block(dir_ino, generation, &buf[..t]);
    buf[t + 8..t + 12].copy_from_slice(&c.to_le_bytes());
}

/// One parsed directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub inode: u32,
    pub rec_len: u16,
    pub file_type: u8,
    pub name: Vec<u8>,
}

/// Parse the entries of a linear directory block; `None` if a record is
/// malformed.
pub fn parse_block(buf: &[u8]) -> Option<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off + 8 <= buf.len() {
        let ino = u32::from_le_bytes(buf[off..off + 4].try_into().ok()?);
        let rl = u16::from_le_bytes([buf[off + 4], buf[off + 5]]);
        let nl = usize::from(buf[off + 6]);
        let ft = buf[off + 7];
        if rl < 8 || off + usize::from(rl) > buf.len() || 8 + nl > usize::from(rl) {
            return None;
        }
        out.push(DirEntry {
            inode: ino,
            rec_len: rl,
            file_type: ft,
            name: buf[off + 8..off + 8 + nl].to_vec(),
        });
        off += usize::from(rl);
    }
    Some(out)
}
