//! The jbd2 journal: superblock and log blocks (big-endian throughout).
//!
//! Layout as in the kernel's `include/linux/jbd2.h`. Every log block starts
//! with a [`JournalHeader`]; descriptor blocks carry block tags (the
//! [`BlockTag3`] form with `csum_v3`, else the [`BlockTag`] form whose used
//! length is [`tag_bytes`]) and, with checksums v2/v3, a [`BlockTail`];
//! revoke blocks a [`RevokeHeader`] and block numbers; commit blocks a
//! [`CommitHeader`].

use zerocopy::big_endian::{U16 as B16, U32 as B32, U64 as B64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const JBD2_MAGIC: u32 = 0xC03B_3998;
pub const JBD2_SUPERBLOCK_V1: u32 = 3;
pub const JBD2_SUPERBLOCK_V2: u32 = 4;
pub const JBD2_DESCRIPTOR_BLOCK: u32 = 1;
pub const JBD2_COMMIT_BLOCK: u32 = 2;
pub const JBD2_REVOKE_BLOCK: u32 = 5;
/// Fast-commit blocks (type 6; not handled by ext4kit).
pub const JBD2_FC_BLOCK: u32 = 6;

/// compat: whole-transaction crc32 (checksum "v1") in the commit block.
pub const JBD2_FEATURE_COMPAT_CHECKSUM: u32 = 0x1;
pub const JBD2_FEATURE_INCOMPAT_REVOKE: u32 = 0x1;
pub const JBD2_FEATURE_INCOMPAT_64BIT: u32 = 0x2;
pub const JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const JBD2_FEATURE_INCOMPAT_CSUM_V2: u32 = 0x8;
pub const JBD2_FEATURE_INCOMPAT_CSUM_V3: u32 = 0x10;
pub const JBD2_FEATURE_INCOMPAT_FAST_COMMIT: u32 = 0x20;
/// Every incompat bit the kernel (and e2fsck) knows.
pub const JBD2_KNOWN_INCOMPAT_FEATURES: u32 = JBD2_FEATURE_INCOMPAT_REVOKE
    | JBD2_FEATURE_INCOMPAT_64BIT
    | JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT
    | JBD2_FEATURE_INCOMPAT_CSUM_V2
    | JBD2_FEATURE_INCOMPAT_CSUM_V3
    | JBD2_FEATURE_INCOMPAT_FAST_COMMIT;
/// No compat or ro_compat bits are "known" to the kernel's loader (the
/// compat CHECKSUM bit is tolerated because compat bits never refuse).
pub const JBD2_KNOWN_ROCOMPAT_FEATURES: u32 = 0;

/// `s_checksum_type` / `h_chksum_type` values.
pub const JBD2_CRC32_CHKSUM: u8 = 1;
pub const JBD2_MD5_CHKSUM: u8 = 2;
pub const JBD2_SHA1_CHKSUM: u8 = 3;
pub const JBD2_CRC32C_CHKSUM: u8 = 4;
/// `h_chksum_size` for a v1 (crc32) commit checksum.
pub const JBD2_CRC32_CHKSUM_SIZE: u8 = 4;

/// Tag flags (the low 16 bits of `t_flags`).
pub const JBD2_FLAG_ESCAPE: u16 = 1;
pub const JBD2_FLAG_SAME_UUID: u16 = 2;
pub const JBD2_FLAG_DELETED: u16 = 4;
pub const JBD2_FLAG_LAST_TAG: u16 = 8;

/// Smallest journal the kernel accepts, in blocks.
pub const JBD2_MIN_JOURNAL_BLOCKS: u32 = 1024;
/// Default number of fast-commit blocks when `s_num_fc_blks` is 0.
pub const JBD2_DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;

/// `journal_header_t`: the first 12 bytes of every journal block.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct JournalHeader {
    pub h_magic: B32,
    pub h_blocktype: B32,
    pub h_sequence: B32,
}

/// `journal_block_tag3_t`: a descriptor tag with `csum_v3` (16 bytes,
/// with or without the 64bit feature).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BlockTag3 {
    pub t_blocknr: B32,
    pub t_flags: B32,
    pub t_blocknr_high: B32,
    pub t_checksum: B32,
}

/// `journal_block_tag_t`: the tag without `csum_v3`. Only the first
/// [`tag_bytes`] bytes are on disk: 8 (32-bit), 12 (64bit), plus 2 with
/// `csum_v2` (the kernel's `journal_tag_bytes`). The flags sit at bytes
/// 6..8 in both forms (for tag3 they are the low half of `t_flags`).
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BlockTag {
    pub t_blocknr: B32,
    pub t_checksum: B16,
    pub t_flags: B16,
    pub t_blocknr_high: B32,
}

/// `jbd2_journal_block_tail`: the last 4 bytes of descriptor and revoke
/// blocks with checksums v2/v3.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BlockTail {
    pub t_checksum: B32,
}

/// `jbd2_journal_revoke_header_t`: `r_count` = bytes used in the block,
/// this 16-byte header included; records (4 or 8 bytes with 64bit) follow.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RevokeHeader {
    pub r_header: JournalHeader,
    pub r_count: B32,
}

/// `struct commit_header`.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CommitHeader {
    pub h_header: JournalHeader,
    pub h_chksum_type: u8,
    pub h_chksum_size: u8,
    pub h_padding: [u8; 2],
    pub h_chksum: [B32; 8],
    pub h_commit_sec: B64,
    pub h_commit_nsec: B32,
}

const _: () = assert!(size_of::<JournalHeader>() == 12);
const _: () = assert!(size_of::<BlockTag3>() == 16);
const _: () = assert!(size_of::<BlockTag>() == 12);
const _: () = assert!(size_of::<BlockTail>() == 4);
const _: () = assert!(size_of::<RevokeHeader>() == 16);
const _: () = assert!(size_of::<CommitHeader>() == 60);

/// Byte offset of the flags (be16) inside any tag form.
pub const TAG_FLAGS_OFFSET: usize = 6;
/// Byte offset of `t_blocknr_high` inside any tag form (64bit only).
pub const TAG_BLOCKNR_HIGH_OFFSET: usize = 8;

/// The journal features that shape the log's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFormat {
    pub compat: u32,
    pub incompat: u32,
}

impl LogFormat {
    pub fn of(jsb: &JournalSuperblock) -> Self {
        Self {
            compat: jsb.s_feature_compat.get(),
            incompat: jsb.s_feature_incompat.get(),
        }
    }
    pub fn csum_v3(self) -> bool {
        self.incompat & JBD2_FEATURE_INCOMPAT_CSUM_V3 != 0
    }
    pub fn csum_v2(self) -> bool {
        self.incompat & JBD2_FEATURE_INCOMPAT_CSUM_V2 != 0
    }
    /// Checksums v2 or v3 (crc32c per block).
    pub fn csum_v2or3(self) -> bool {
        self.csum_v2() || self.csum_v3()
    }
    /// Checksum v1 (crc32_be over the transaction in the commit block).
    pub fn csum_v1(self) -> bool {
        self.compat & JBD2_FEATURE_COMPAT_CHECKSUM != 0
    }
    pub fn is_64bit(self) -> bool {
        self.incompat & JBD2_FEATURE_INCOMPAT_64BIT != 0
    }
    pub fn async_commit(self) -> bool {
        self.incompat & JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT != 0
    }
    pub fn fast_commit(self) -> bool {
        self.incompat & JBD2_FEATURE_INCOMPAT_FAST_COMMIT != 0
    }
    /// Bytes one tag takes in a descriptor (not counting a following UUID).
    pub fn tag_bytes(self) -> usize {
        tag_bytes(self.incompat)
    }
    /// Bytes of a revoke record.
    pub fn revoke_record_bytes(self) -> usize {
        if self.is_64bit() { 8 } else { 4 }
    }
    /// Bytes reserved at the end of descriptor and revoke blocks.
    pub fn tail_bytes(self) -> usize {
        if self.csum_v2or3() {
            size_of::<BlockTail>()
        } else {
            0
        }
    }
}

/// The kernel's `journal_tag_bytes` for a journal with `incompat` features.
pub const fn tag_bytes(incompat: u32) -> usize {
    if incompat & JBD2_FEATURE_INCOMPAT_CSUM_V3 != 0 {
        return size_of::<BlockTag3>();
    }
    let mut sz = size_of::<BlockTag>();
    if incompat & JBD2_FEATURE_INCOMPAT_CSUM_V2 != 0 {
        sz += 2;
    }
    if incompat & JBD2_FEATURE_INCOMPAT_64BIT != 0 {
        sz
    } else {
        sz - 4
    }
}

/// One tag parsed from a descriptor, whatever its on-disk form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// Home block number (high half only with 64bit).
    pub blocknr: u64,
    /// The low 16 bits of `t_flags`.
    pub flags: u16,
    /// The stored checksum: 32 bits with v3, 16 with v2, else 0.
    pub checksum: u32,
}

impl Tag {
    /// Parse the tag at the start of `bytes` (which holds at least
    /// `fmt.tag_bytes()` bytes; `None` if shorter).
    pub fn parse(bytes: &[u8], fmt: LogFormat) -> Option<Tag> {
        let tb = fmt.tag_bytes();
        let b = bytes.get(..tb)?;
        let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut blocknr = u64::from(be32(0));
        if fmt.is_64bit() {
            blocknr |= u64::from(be32(TAG_BLOCKNR_HIGH_OFFSET)) << 32;
        }
        let flags = u16::from_be_bytes([b[TAG_FLAGS_OFFSET], b[TAG_FLAGS_OFFSET + 1]]);
        let checksum = if fmt.csum_v3() {
            be32(12)
        } else if fmt.csum_v2() {
            u32::from(u16::from_be_bytes([b[4], b[5]]))
        } else {
            0
        };
        Some(Tag {
            blocknr,
            flags,
            checksum,
        })
    }

    /// Serialize into `out` (`fmt.tag_bytes()` long).
    pub fn write(&self, out: &mut [u8], fmt: LogFormat) {
        let tb = fmt.tag_bytes();
        let o = &mut out[..tb];
        o.fill(0);
        o[0..4].copy_from_slice(&(self.blocknr as u32).to_be_bytes());
        o[TAG_FLAGS_OFFSET..TAG_FLAGS_OFFSET + 2].copy_from_slice(&self.flags.to_be_bytes());
        if fmt.is_64bit() || fmt.csum_v3() {
            let hi = if fmt.is_64bit() {
                (self.blocknr >> 32) as u32
            } else {
                0
            };
            o[8..12].copy_from_slice(&hi.to_be_bytes());
        }
        if fmt.csum_v3() {
            o[12..16].copy_from_slice(&self.checksum.to_be_bytes());
        } else if fmt.csum_v2() {
            o[4..6].copy_from_slice(&(self.checksum as u16).to_be_bytes());
        }
    }
}

impl JournalHeader {
    pub fn new(blocktype: u32, sequence: u32) -> Self {
        Self {
            h_magic: JBD2_MAGIC.into(),
            h_blocktype: blocktype.into(),
            h_sequence: sequence.into(),
        }
    }
    /// The header at the start of a block (`None` if shorter than 12 bytes).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes.get(..size_of::<Self>())?).ok()
    }
}

impl CommitHeader {
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes.get(..size_of::<Self>())?).ok()
    }
}

impl RevokeHeader {
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes.get(..size_of::<Self>())?).ok()
    }
}

/// Is `a` after `b` in tid order (modulo 2^32, the kernel's `tid_gt`)?
pub fn tid_gt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// `tid_geq`: `a` is `b` or after it, modulo 2^32.
pub fn tid_geq(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

/// `journal_superblock_t`, 1024 bytes.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct JournalSuperblock {
    pub h_magic: B32,
    pub h_blocktype: B32,
    pub h_sequence: B32,
    pub s_blocksize: B32,
    pub s_maxlen: B32,
    pub s_first: B32,
    pub s_sequence: B32,
    pub s_start: B32,
    pub s_errno: B32,
    pub s_feature_compat: B32,
    pub s_feature_incompat: B32,
    pub s_feature_ro_compat: B32,
    pub s_uuid: [u8; 16],
    pub s_nr_users: B32,
    pub s_dynsuper: B32,
    pub s_max_transaction: B32,
    pub s_max_trans_data: B32,
    pub s_checksum_type: u8,
    pub s_padding2: [u8; 3],
    pub s_num_fc_blks: B32,
    pub s_head: B32,
    pub s_padding: [B32; 40],
    pub s_checksum: B32,
    pub s_users: [u8; 768],
}

const _: () = assert!(size_of::<JournalSuperblock>() == 1024);

impl JournalSuperblock {
    /// jbd2's `jbd2_journal_get_num_fc_blks`: `s_num_fc_blks`, or
    /// [`JBD2_DEFAULT_FAST_COMMIT_BLOCKS`] when it is 0.
    pub fn num_fc_blocks(&self) -> u32 {
        match self.s_num_fc_blks.get() {
            0 => JBD2_DEFAULT_FAST_COMMIT_BLOCKS,
            n => n,
        }
    }

    /// Blocks at the end of the journal kept for fast commits: the
    /// [`JournalSuperblock::num_fc_blocks`] when the superblock has the
    /// fast-commit feature, else 0.
    pub fn fc_area_blocks(&self) -> u32 {
        if self.s_feature_incompat.get() & JBD2_FEATURE_INCOMPAT_FAST_COMMIT != 0 {
            self.num_fc_blocks()
        } else {
            0
        }
    }

    /// A fresh, empty v2 superblock as mke2fs writes it.
    pub fn new(block_size: u32, maxlen: u32, fs_uuid: [u8; 16]) -> Self {
        let mut s = Self::new_zeroed();
        s.h_magic.set(JBD2_MAGIC);
        s.h_blocktype.set(JBD2_SUPERBLOCK_V2);
        s.s_blocksize.set(block_size);
        s.s_maxlen.set(maxlen);
        s.s_first.set(1);
        s.s_sequence.set(1);
        s.s_uuid = fs_uuid;
        s.s_nr_users.set(1);
        s
    }
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes.get(..1024)?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_sizes_match_the_kernel() {
        assert_eq!(tag_bytes(0), 8);
        assert_eq!(tag_bytes(JBD2_FEATURE_INCOMPAT_64BIT), 12);
        assert_eq!(tag_bytes(JBD2_FEATURE_INCOMPAT_CSUM_V2), 10);
        assert_eq!(
            tag_bytes(JBD2_FEATURE_INCOMPAT_CSUM_V2 | JBD2_FEATURE_INCOMPAT_64BIT),
            14
        );
        assert_eq!(tag_bytes(JBD2_FEATURE_INCOMPAT_CSUM_V3), 16);
        assert_eq!(
            tag_bytes(JBD2_FEATURE_INCOMPAT_CSUM_V3 | JBD2_FEATURE_INCOMPAT_64BIT),
            16
        );
    }

    #[test]
    fn tags_round_trip_in_every_form() {
        for incompat in [0, 2, 8, 10, 16, 18] {
            let fmt = LogFormat {
                compat: 0,
                incompat,
            };
            let hi = if fmt.is_64bit() { 0x12_0000_0000 } else { 0 };
            let t = Tag {
                blocknr: hi | 0x3456_789A,
                flags: JBD2_FLAG_ESCAPE | JBD2_FLAG_LAST_TAG,
                checksum: if fmt.csum_v3() {
                    0xDEAD_BEEF
                } else if fmt.csum_v2() {
                    0xBEEF
                } else {
                    0
                },
            };
            let mut buf = [0u8; 16];
            t.write(&mut buf, fmt);
            assert_eq!(Tag::parse(&buf, fmt), Some(t), "incompat {incompat:#x}");
            assert_eq!(buf[7], 9);
        }
        assert_eq!(Tag::parse(&[0; 7], LogFormat::default()), None);
    }

    #[test]
    fn tids_compare_modulo_2_32() {
        assert!(tid_gt(1, 0));
        assert!(tid_gt(0, u32::MAX));
        assert!(!tid_gt(u32::MAX, 0));
        assert!(tid_geq(5, 5));
        assert!(tid_geq(2, u32::MAX - 3));
        assert!(!tid_geq(u32::MAX - 3, 2));
    }
}
