//! Orphan-file blocks: zero entries and an 8-byte tail (magic, checksum).

pub const ORPHAN_BLOCK_MAGIC: u32 = 0x0B10_CA04;
pub const ORPHAN_TAIL_SIZE: usize = 8;

/// Fill an empty orphan-file block (zero entries) with its tail.
pub fn init_block(buf: &mut [u8], ino: u32, generation: u32, pblk: u64, csum: &crate::Csum) {
    buf.fill(0);
    let n = buf.len();
    buf[n - 8..n - 4].copy_from_slice(&ORPHAN_BLOCK_MAGIC.to_le_bytes());
    if !csum.metadata {
        return;
    }
    // The checksum covers the entries only, not the magic.
    let c = csum.orphan_block(ino, generation, pblk, &buf[..n - ORPHAN_TAIL_SIZE]);
    buf[n - 4..].copy_from_slice(&c.to_le_bytes());
}
