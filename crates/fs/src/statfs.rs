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

/// The kernel's `ext4_calculate_overhead`, what it uses when the
/// superblock's `s_overhead_clusters` is 0 (images from older mke2fs): the
/// blocks before the first group, each group's superblock backup,
/// descriptor and reserved GDT blocks, every group's two bitmaps and
/// inode table (wherever flex_bg put them), and an internal journal's
/// `journal_blocks`. Without bigalloc, blocks and clusters are one.
pub fn overhead_blocks(l: &crate::groups::Layout, journal_blocks: u64) -> u64 {
    let base: u64 = (0..l.group_count)
        .map(|g| u64::from(l.base_meta_blocks(g)))
        .sum();
    let per_group = 2 + u64::from(l.itable_blocks);
    l.first_data_block + base + u64::from(l.group_count) * per_group + journal_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The overhead mke2fs writes (`s_overhead_clusters`, which ext4kit
    /// mkfs writes byte for byte as it does) is what the kernel computes
    /// when the field is 0 (checked on a loop mount: 14325 blocks of
    /// 16384 either way for a 64 MiB image).
    #[test]
    fn overhead_as_mke2fs_writes_it() {
        use ext4kit_device::Device;
        use ext4kit_format::superblock::Superblock;
        for (size, extra) in [
            (8u64 << 20, &[][..]),
            (64 << 20, &[][..]),
            (40 << 20, &["^flex_bg"][..]),
            (24 << 20, &["^resize_inode"][..]),
            (48 << 20, &["sparse_super2"][..]),
        ] {
            let dev = crate::balloc::tests::image(size, extra);
            let mut buf = vec![0u8; 1024];
            dev.read_at(&mut buf, 1024).unwrap();
            let sb = Superblock::parse(&buf).unwrap();
            let l = crate::groups::Layout::from_superblock(&sb).unwrap();
            let dev: std::sync::Arc<dyn Device> = std::sync::Arc::new(dev);
            let fs = crate::fs::Filesystem::open(dev, crate::rw::RwOptions::default()).unwrap();
            let journal = fs.inode(8).unwrap().size / u64::from(l.block_size);
            let want = u64::from(sb.s_overhead_clusters.get());
            assert_ne!(want, 0, "{size} {extra:?}: mkfs wrote no overhead");
            assert_eq!(overhead_blocks(&l, journal), want, "{size} {extra:?}");
            fs.close().unwrap();
        }
    }

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
