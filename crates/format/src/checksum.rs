//! Every checksum ext4 and jbd2 use, computed in one place.
//!
//! ext4 uses the raw CRC-32C register update: the caller supplies the
//! initial value and there is no final inversion. The `crc32c` crate
//! implements the standard (inverted) CRC, so `raw(seed, d) =
//! !crc32c_append(!seed, d)`.

/// Raw CRC-32C, ext4 convention.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// CRC-16 (poly 0x8005 reflected = 0xA001, no final xor) as used by
/// `gdt_csum` (e2fsprogs lib/ext2fs/crc16.c).
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &b in data {
        crc = (crc >> 8) ^ CRC16_TABLE[((crc ^ u16::from(b)) & 0xff) as usize];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u16;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xA001
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// The kernel's `crc32_be` (polynomial 0x04C11DB7, most significant bit
/// first, caller's seed, no final inversion): jbd2's checksum "v1" over a
/// whole transaction, seeded with `!0`.
pub fn crc32_be(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = (crc << 8) ^ CRC32_BE_TABLE[(((crc >> 24) as u8) ^ b) as usize];
    }
    crc
}

const CRC32_BE_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = (i as u32) << 24;
        let mut k = 0;
        while k < 8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04C1_1DB7
            } else {
                c << 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// jbd2 checksums (v2/v3 use crc32c in the raw form, like ext4).
pub mod jbd2 {
    use super::crc32c_raw;

    /// Offset of `s_checksum` in the journal superblock.
    const JSB_CSUM_OFF: usize = 0xFC;
    /// Offset of `h_chksum[0]` in a commit block.
    const COMMIT_CSUM_OFF: usize = 16;

    /// Journal superblock checksum: crc32c(~0) over the 1024-byte
    /// superblock with `s_checksum` taken as zero (note: seed ~0, not the
    /// journal seed).
    pub fn superblock(jsb: &[u8]) -> u32 {
        let jsb = &jsb[..1024.min(jsb.len())];
        let end = JSB_CSUM_OFF.min(jsb.len());
        let c = crc32c_raw(!0, &jsb[..end]);
        let c = crc32c_raw(c, &[0; 4][..(jsb.len() - end).min(4)]);
        crc32c_raw(c, jsb.get(JSB_CSUM_OFF + 4..).unwrap_or(&[]))
    }

    /// `j_csum_seed`: crc32c(~0) of the journal UUID.
    pub fn seed(uuid: &[u8; 16]) -> u32 {
        crc32c_raw(!0, uuid)
    }

    /// Descriptor or revoke block tail: over the whole block with the
    /// 4-byte tail taken as zero.
    pub fn block_tail(seed: u32, block: &[u8]) -> u32 {
        let n = block.len().saturating_sub(4);
        let c = crc32c_raw(seed, &block[..n]);
        crc32c_raw(c, &[0; 4][..block.len() - n])
    }

    /// Tag checksum of a logged block: crc32c(seed, be32 tid) then the
    /// block as it is in the log (after escaping). Tag3 stores all 32 bits,
    /// the v2 tag the low 16.
    pub fn tag(seed: u32, tid: u32, log_copy: &[u8]) -> u32 {
        crc32c_raw(crc32c_raw(seed, &tid.to_be_bytes()), log_copy)
    }

    /// Commit block checksum: over the whole block with `h_chksum[0]`
    /// taken as zero.
    pub fn commit(seed: u32, block: &[u8]) -> u32 {
        let end = COMMIT_CSUM_OFF.min(block.len());
        let c = crc32c_raw(seed, &block[..end]);
        let zeros = (block.len() - end).min(4);
        let c = crc32c_raw(c, &[0; 4][..zeros]);
        crc32c_raw(c, block.get(COMMIT_CSUM_OFF + 4..).unwrap_or(&[]))
    }
}

/// htree index block checksum (dx_tail): crc32c(directory inode seed)
/// over the block up to the end of the live entries, then the tail's
/// `dt_reserved` and a zero checksum field.
pub fn dx_node(inode_seed: u32, covered: &[u8], dt_reserved: &[u8]) -> u32 {
    let c = crc32c_raw(inode_seed, covered);
    let c = crc32c_raw(c, dt_reserved);
    crc32c_raw(c, &[0; 4])
}

/// The filesystem's checksum context: which algorithm applies and the seed.
#[derive(Clone, Copy, Debug)]
pub struct Csum {
    /// `metadata_csum` is on (crc32c everywhere).
    pub metadata: bool,
    /// `gdt_csum` (uninit_bg) without metadata_csum: CRC-16 descriptors.
    pub gdt: bool,
    /// crc32c seed of the filesystem (from `s_checksum_seed` or the UUID).
    pub seed: u32,
    /// The filesystem UUID (for the CRC-16 descriptor checksum).
    pub uuid: [u8; 16],
}

impl Csum {
    /// Build from the superblock's view of things.
    pub fn new(
        metadata: bool,
        gdt: bool,
        csum_seed_feature: bool,
        stored_seed: u32,
        uuid: [u8; 16],
    ) -> Self {
        let seed = if csum_seed_feature {
            stored_seed
        } else {
            crc32c_raw(!0, &uuid)
        };
        Self {
            metadata,
            gdt: gdt && !metadata,
            seed,
            uuid,
        }
    }

    /// From a parsed superblock.
    pub fn from_superblock(sb: &crate::Superblock) -> Self {
        use crate::features::{Incompat, RoCompat};
        let ro = RoCompat(sb.s_feature_ro_compat.get());
        let inc = Incompat(sb.s_feature_incompat.get());
        Self::new(
            ro.contains(RoCompat::METADATA_CSUM),
            ro.contains(RoCompat::GDT_CSUM),
            inc.contains(Incompat::CSUM_SEED),
            sb.s_checksum_seed.get(),
            sb.s_uuid,
        )
    }

    /// Group descriptor checksum (16 bits). `desc` is the full descriptor
    /// (`s_desc_size` bytes); its `bg_checksum` field is ignored.
    pub fn group_desc(&self, group: u32, desc: &[u8]) -> u16 {
        const OFF: usize = 0x1E;
        if self.metadata && (OFF + 2..=64).contains(&desc.len()) {
            // One pass over group number + descriptor (checksum zeroed):
            // the same value as the four pieces below, at a quarter of the
            // calls (this runs for every group at every open).
            let mut buf = [0u8; 4 + 64];
            buf[..4].copy_from_slice(&group.to_le_bytes());
            buf[4..4 + desc.len()].copy_from_slice(desc);
            buf[4 + OFF] = 0;
            buf[4 + OFF + 1] = 0;
            (crc32c_raw(self.seed, &buf[..4 + desc.len()]) & 0xFFFF) as u16
        } else if self.metadata {
            let mut c = crc32c_raw(self.seed, &group.to_le_bytes());
            c = crc32c_raw(c, &desc[..OFF]);
            c = crc32c_raw(c, &[0, 0]);
            if desc.len() > OFF + 2 {
                c = crc32c_raw(c, &desc[OFF + 2..]);
            }
            (c & 0xFFFF) as u16
        } else if self.gdt {
            let mut c = crc16(!0, &self.uuid);
            c = crc16(c, &group.to_le_bytes());
            c = crc16(c, &desc[..OFF]);
            if desc.len() > OFF + 2 {
                c = crc16(c, &desc[OFF + 2..]);
            }
            c
        } else {
            0
        }
    }

    /// Block or inode bitmap checksum over the covered bytes.
    pub fn bitmap(&self, bytes: &[u8]) -> u32 {
        crc32c_raw(self.seed, bytes)
    }

    /// Per-inode seed: fs seed → le32 inode number → le32 generation.
    pub fn inode_seed(&self, ino: u32, generation: u32) -> u32 {
        let c = crc32c_raw(self.seed, &ino.to_le_bytes());
        crc32c_raw(c, &generation.to_le_bytes())
    }

    /// Inode checksum over the whole on-disk inode (`inode.len()` =
    /// `s_inode_size`), with both checksum fields treated as zero.
    /// Returns the 32-bit value; the caller stores lo/hi as the inode's
    /// `i_extra_isize` allows (see [`crate::inode::set_checksum`]).
    pub fn inode(&self, ino: u32, generation: u32, inode: &[u8]) -> u32 {
        let s = self.inode_seed(ino, generation);
        let mut c = crc32c_raw(s, &inode[..0x7C]);
        c = crc32c_raw(c, &[0, 0]);
        c = crc32c_raw(c, &inode[0x7E..0x80.min(inode.len())]);
        if inode.len() > 0x80 {
            let extra = u16::from_le_bytes([inode[0x80], inode[0x81]]) as usize;
            if extra >= 4 {
                c = crc32c_raw(c, &inode[0x80..0x82]);
                c = crc32c_raw(c, &[0, 0]);
                c = crc32c_raw(c, &inode[0x84..]);
            } else {
                c = crc32c_raw(c, &inode[0x80..]);
            }
        }
        c
    }

    /// Extent tree block checksum: header + `eh_max` entries.
    pub fn extent_block(&self, ino: u32, generation: u32, covered: &[u8]) -> u32 {
        crc32c_raw(self.inode_seed(ino, generation), covered)
    }

    /// Directory leaf block checksum over everything before the 12-byte tail.
    pub fn dir_block(&self, ino: u32, generation: u32, before_tail: &[u8]) -> u32 {
        crc32c_raw(self.inode_seed(ino, generation), before_tail)
    }

    /// Extended-attribute block checksum: crc32c(fs seed) over the le64
    /// block number, then the whole block with `h_checksum` (offset 16)
    /// taken as zero.
    pub fn xattr_block(&self, pblk: u64, block: &[u8]) -> u32 {
        const OFF: usize = 16;
        let c = crc32c_raw(self.seed, &pblk.to_le_bytes());
        let c = crc32c_raw(c, &block[..OFF.min(block.len())]);
        let c = crc32c_raw(c, &[0; 4]);
        crc32c_raw(c, block.get(OFF + 4..).unwrap_or(&[]))
    }

    /// Orphan-file block checksum over the entries (everything but the
    /// 8-byte tail).
    pub fn orphan_block(&self, ino: u32, generation: u32, pblk: u64, data: &[u8]) -> u32 {
        let c = self.inode_seed(ino, generation);
        let c = crc32c_raw(c, &pblk.to_le_bytes());
        crc32c_raw(c, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_values() {
        assert_eq!(crc32c_raw(!0, b"123456789"), 0x1CF9_6D7C);
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
        assert_eq!(crc16(0xFFFF, b"123456789"), 0x4B37);
        // CRC-32/MPEG-2 (= the kernel's crc32_be seeded with ~0).
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
        assert_eq!(crc32_be(!0, b""), !0);
    }

    /// A block rebuilt from its non-zero runs.
    fn sparse(len: usize, runs: &[(usize, &str)]) -> Vec<u8> {
        let mut b = vec![0u8; len];
        for &(off, hex) in runs {
            for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
                let s = std::str::from_utf8(pair).unwrap();
                b[off + i] = u8::from_str_radix(s, 16).unwrap();
            }
        }
        b
    }

    /// Blocks of a journal written by Linux 6.18 (1 KiB blocks, 64bit +
    /// csum_v3, fs UUID 01234567-89ab-cdef-0123-456789abcdef): one
    /// transaction (tid 2) left in the log by EXT4_IOC_SHUTDOWN(NOLOGFLUSH).
    #[test]
    fn jbd2_vectors_from_a_kernel_journal() {
        let jsb = sparse(
            1024,
            &[
                (
                    0,
                    "c03b399800000004000000000000040000000400000000010000000200000001",
                ),
                (43, "12000000000123456789abcdef0123456789abcdef00000001"),
                (80, "04"),
                (252, "c02b6db9"),
            ],
        );
        assert_eq!(jbd2::superblock(&jsb), 0xC02B_6DB9);
        let uuid: [u8; 16] = jsb[0x30..0x40].try_into().unwrap();
        let seed = jbd2::seed(&uuid);
        let desc = sparse(
            1024,
            &[
                (0, "c03b3998000000010000000200000084"),
                (24, "03cbf234"),
                (
                    47,
                    "020000000200000000f03dabd4000000880000000200000000456fa862000000860000000200000000bf581aeb0000048600000002000000009c554a9400000001000000020000000028ce1f26000000830000000a0000000016d326f2",
                ),
                (1020, "3b689d42"),
            ],
        );
        assert_eq!(jbd2::block_tail(seed, &desc), 0x3B68_9D42);
        // The first tag's block (a block bitmap) and its tag3 checksum.
        let mut data = vec![0u8; 1024];
        data[0] = 0xFF;
        data[1] = 0x0F;
        data[256..].fill(0xFF);
        assert_eq!(jbd2::tag(seed, 2, &data), 0x03CB_F234);
        let commit = sparse(
            1024,
            &[
                (0, "c03b3998000000020000000200000000833f43a6"),
                (52, "6b0ea0c1034d6ce5"),
            ],
        );
        assert_eq!(jbd2::commit(seed, &commit), 0x833F_43A6);
    }

    /// Checksum v1 (compat CHECKSUM, `-o journal_checksum` without
    /// metadata_csum): the commit block's `h_chksum[0]` is crc32_be(~0)
    /// over the transaction's descriptor and data blocks. A Linux 6.18
    /// transaction (1 KiB blocks: a chmod, then EXT4_IOC_SHUTDOWN).
    #[test]
    fn jbd2_v1_vector_from_a_kernel_journal() {
        let desc = sparse(
            1024,
            &[(0, "c03b3998000000010000000200000044"), (39, "010000000a")],
        );
        let itable = sparse(
            1024,
            &[
                (
                    512,
                    "c04100000030000050a70e6b50a70e6b50a70e6b00000000000002001800000000000800000000000af3010004",
                ),
                (568, "0c00000024"),
                (640, "20"),
                (656, "50a70e6b"),
                (
                    768,
                    "808100000000000000f1536551a70e6b00f1536500000000000001000000000000000800010000000af3000004",
                ),
                (896, "2000000084a8f026"),
                (913, "f15365"),
            ],
        );
        let sb = sparse(
            1024,
            &[
                (1, "0800000020000099010000ce190000f407000001"),
                (
                    33,
                    "200000002000000008000050a70e6b50a70e6b0100ffff53ef01000100000050a70e6b",
                ),
                (
                    76,
                    "01000000000000000b000000000100003c000000460200006b0000000123456789abcdef0123456789abcdef",
                ),
                (136, "2f746d702f6a762f6d"),
                (206, "1f"),
                (224, "08"),
                (
                    236,
                    "41e7b39ca06643569fb3025cfa808a44010100000c0000000000000050a70e6b0af3030004",
                ),
                (
                    284,
                    "0200000030000000020000000f0000003300000011000000ef0300004302",
                ),
                (334, "10"),
                (348, "2000200001"),
                (372, "0400000033"),
                (584, "2406"),
            ],
        );
        let commit = sparse(
            1024,
            &[
                (0, "c03b39980000000200000002010400002e75fab0"),
                (52, "6b0ea751169c1017"),
            ],
        );
        let mut c = crc32_be(!0, &desc);
        c = crc32_be(c, &itable);
        c = crc32_be(c, &sb);
        // h_chksum_type 1 (crc32), h_chksum_size 4, then the sum.
        assert_eq!(&commit[12..14], &[1, 4]);
        assert_eq!(c, u32::from_be_bytes(commit[16..20].try_into().unwrap()));
        assert_eq!(c, 0x2E75_FAB0);
    }

    fn crc32c_bitwise(mut c: u32, d: &[u8]) -> u32 {
        for &b in d {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
        }
        c
    }

    proptest! {
        #[test]
        fn raw_matches_bitwise(seed: u32, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            prop_assert_eq!(crc32c_raw(seed, &data), crc32c_bitwise(seed, &data));
        }
        #[test]
        fn raw_is_incremental(seed: u32, a in proptest::collection::vec(any::<u8>(), 0..100), b in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut ab = a.clone();
            ab.extend_from_slice(&b);
            prop_assert_eq!(crc32c_raw(crc32c_raw(seed, &a), &b), crc32c_raw(seed, &ab));
        }
    }

    proptest::proptest! {
        /// The one-pass descriptor checksum equals the piecewise one.
        #[test]
        fn group_desc_one_pass(seed in proptest::prelude::any::<u32>(), group in proptest::prelude::any::<u32>(),
                               desc in proptest::collection::vec(proptest::prelude::any::<u8>(), 64), short in proptest::prelude::any::<bool>()) {
            let d = if short { &desc[..32] } else { &desc[..] };
            let c = Csum { metadata: true, gdt: false, seed, uuid: [0; 16] };
            let mut w = crc32c_raw(seed, &group.to_le_bytes());
            w = crc32c_raw(w, &d[..0x1E]);
            w = crc32c_raw(w, &[0, 0]);
            w = crc32c_raw(w, &d[0x20..]);
            proptest::prop_assert_eq!(c.group_desc(group, d), (w & 0xFFFF) as u16);
        }
    }
}
