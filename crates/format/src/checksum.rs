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
        if self.metadata {
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
}
