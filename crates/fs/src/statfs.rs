//! What `statfs(2)` reports for an ext4 filesystem, computed as the
//! kernel's `ext4_statfs` computes it (fs/ext4/super.c): the space held
//! back from `f_bavail` (the reserved blocks and the reserved-clusters
//! pool) and `f_fsid` from the UUID. Pure arithmetic, no I/O.

/// Clusters the kernel's ext4 holds back at mount for allocations that
/// must not fail for lack of space (`ext4_calculate_resv_clusters`,
/// `s_resv_clusters`): none without extents (ext2/ext3 images), else 2 %
/// of the clusters, at most 4096.
pub fn resv_clusters(blocks_count: u64, cluster_bits: u32, extents: bool) -> u64 {
    if !extents {
        return 0;
    }
    ((blocks_count >> cluster_bits) / 50).min(4096)
}

/// `f_bavail`: the free blocks less the reserved blocks
/// (`s_r_blocks_count`) and the reserved-clusters pool (in blocks), 0
/// when fewer are free.
pub fn bavail(bfree: u64, r_blocks: u64, resv_blocks: u64) -> u64 {
    bfree.saturating_sub(r_blocks.saturating_add(resv_blocks))
}

/// `f_fsid` (`uuid_to_fsid`): the UUID's two little-endian 64-bit
/// halves XORed, as `val[0]` (low 32 bits) and `val[1]` (high).
pub fn fsid(uuid: &[u8; 16]) -> [u32; 2] {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&uuid[..8]);
    hi.copy_from_slice(&uuid[8..]);
    let v = u64::from_le_bytes(lo) ^ u64::from_le_bytes(hi);
    [v as u32, (v >> 32) as u32]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_clusters_pool() {
        // 64 MiB of 4 KiB blocks: 2 %.
        assert_eq!(resv_clusters(16_384, 0, true), 327);
        // 800 MiB and more: the 4096 cap (what made f_bavail 16 MiB high).
        assert_eq!(resv_clusters(204_800, 0, true), 4096);
        assert_eq!(resv_clusters(1 << 28, 0, true), 4096);
        assert_eq!(resv_clusters(16_384, 0, false), 0);
        // Clusters of 16 blocks (bigalloc).
        assert_eq!(resv_clusters(16_384, 4, true), 20);
        assert_eq!(resv_clusters(49, 0, true), 0);
    }

    #[test]
    fn available_blocks() {
        // The kernel's numbers for a fresh 64 MiB mkfs.ext4 image.
        assert_eq!(bavail(14_319, 819, 327), 13_173);
        assert_eq!(bavail(100, 819, 327), 0);
        assert_eq!(bavail(1146, 819, 327), 0);
        assert_eq!(bavail(1147, 819, 327), 1);
        assert_eq!(bavail(5, u64::MAX, 1), 0);
    }

    #[test]
    fn fsid_from_the_uuid() {
        // 0b1a1d5c-2e3f-4a5b-8c9d-0e1f2a3b4c5d: the kernel's statfs gave
        // f_fsid {0x43138787, 0x06060404} (`stat -f` prints
        // 4313878706060404).
        let u = [
            0x0b, 0x1a, 0x1d, 0x5c, 0x2e, 0x3f, 0x4a, 0x5b, 0x8c, 0x9d, 0x0e, 0x1f, 0x2a, 0x3b,
            0x4c, 0x5d,
        ];
        assert_eq!(fsid(&u), [0x4313_8787, 0x0606_0404]);
        assert_eq!(fsid(&[0; 16]), [0, 0]);
        assert_eq!(fsid(&[0xff; 16]), [0, 0]);
    }
}
