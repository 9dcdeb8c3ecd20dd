//! The jbd2 journal superblock (big-endian throughout).

use zerocopy::big_endian::{U32 as B32, U64 as B64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const JBD2_MAGIC: u32 = 0xC03B_3998;
pub const JBD2_SUPERBLOCK_V1: u32 = 3;
pub const JBD2_SUPERBLOCK_V2: u32 = 4;
pub const JBD2_DESCRIPTOR_BLOCK: u32 = 1;
pub const JBD2_COMMIT_BLOCK: u32 = 2;
pub const JBD2_REVOKE_BLOCK: u32 = 5;

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

/// Keep the 64-bit type referenced for future journal block tags.
pub type Be64 = B64;
