//! The ext4 superblock (1024 bytes at byte offset 1024 of the device).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::checksum;

/// Byte offset of the primary superblock on the device.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
/// Size of the superblock structure.
pub const SUPERBLOCK_SIZE: usize = 1024;
/// `s_magic`.
pub const EXT4_MAGIC: u16 = 0xEF53;

/// `s_state` bits.
pub const STATE_VALID: u16 = 0x0001;
pub const STATE_ERROR: u16 = 0x0002;
pub const STATE_ORPHAN: u16 = 0x0004;

/// `s_flags` bits.
pub const FLAG_SIGNED_HASH: u32 = 0x0001;
pub const FLAG_UNSIGNED_HASH: u32 = 0x0002;

/// `s_default_mount_opts` bits.
pub const DEFM_XATTR_USER: u32 = 0x0004;
pub const DEFM_ACL: u32 = 0x0008;

/// The superblock, field names as the kernel spells them.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Superblock {
    pub s_inodes_count: U32,
    pub s_blocks_count_lo: U32,
    pub s_r_blocks_count_lo: U32,
    pub s_free_blocks_count_lo: U32,
    pub s_free_inodes_count: U32,
    pub s_first_data_block: U32,
    pub s_log_block_size: U32,
    pub s_log_cluster_size: U32,
    pub s_blocks_per_group: U32,
    pub s_clusters_per_group: U32,
    pub s_inodes_per_group: U32,
    pub s_mtime: U32,
    pub s_wtime: U32,
    pub s_mnt_count: U16,
    pub s_max_mnt_count: U16,
    pub s_magic: U16,
    pub s_state: U16,
    pub s_errors: U16,
    pub s_minor_rev_level: U16,
    pub s_lastcheck: U32,
    pub s_checkinterval: U32,
    pub s_creator_os: U32,
    pub s_rev_level: U32,
    pub s_def_resuid: U16,
    pub s_def_resgid: U16,
    pub s_first_ino: U32,
    pub s_inode_size: U16,
    pub s_block_group_nr: U16,
    pub s_feature_compat: U32,
    pub s_feature_incompat: U32,
    pub s_feature_ro_compat: U32,
    pub s_uuid: [u8; 16],
    pub s_volume_name: [u8; 16],
    pub s_last_mounted: [u8; 64],
    pub s_algorithm_usage_bitmap: U32,
    pub s_prealloc_blocks: u8,
    pub s_prealloc_dir_blocks: u8,
    pub s_reserved_gdt_blocks: U16,
    pub s_journal_uuid: [u8; 16],
    pub s_journal_inum: U32,
    pub s_journal_dev: U32,
    pub s_last_orphan: U32,
    pub s_hash_seed: [u8; 16],
    pub s_def_hash_version: u8,
    pub s_jnl_backup_type: u8,
    pub s_desc_size: U16,
    pub s_default_mount_opts: U32,
    pub s_first_meta_bg: U32,
    pub s_mkfs_time: U32,
    pub s_jnl_blocks: [U32; 17],
    pub s_blocks_count_hi: U32,
    pub s_r_blocks_count_hi: U32,
    pub s_free_blocks_count_hi: U32,
    pub s_min_extra_isize: U16,
    pub s_want_extra_isize: U16,
    pub s_flags: U32,
    pub s_raid_stride: U16,
    pub s_mmp_interval: U16,
    pub s_mmp_block: U64,
    pub s_raid_stripe_width: U32,
    pub s_log_groups_per_flex: u8,
    pub s_checksum_type: u8,
    pub s_encryption_level: u8,
    pub s_reserved_pad: u8,
    pub s_kbytes_written: U64,
    pub s_snapshot_inum: U32,
    pub s_snapshot_id: U32,
    pub s_snapshot_r_blocks_count: U64,
    pub s_snapshot_list: U32,
    pub s_error_count: U32,
    pub s_first_error_time: U32,
    pub s_first_error_ino: U32,
    pub s_first_error_block: U64,
    pub s_first_error_func: [u8; 32],
    pub s_first_error_line: U32,
    pub s_last_error_time: U32,
    pub s_last_error_ino: U32,
    pub s_last_error_line: U32,
    pub s_last_error_block: U64,
    pub s_last_error_func: [u8; 32],
    pub s_mount_opts: [u8; 64],
    pub s_usr_quota_inum: U32,
    pub s_grp_quota_inum: U32,
    pub s_overhead_clusters: U32,
    pub s_backup_bgs: [U32; 2],
    pub s_encrypt_algos: [u8; 4],
    pub s_encrypt_pw_salt: [u8; 16],
    pub s_lpf_ino: U32,
    pub s_prj_quota_inum: U32,
    pub s_checksum_seed: U32,
    pub s_wtime_hi: u8,
    pub s_mtime_hi: u8,
    pub s_mkfs_time_hi: u8,
    pub s_lastcheck_hi: u8,
    pub s_first_error_time_hi: u8,
    pub s_last_error_time_hi: u8,
    pub s_first_error_errcode: u8,
    pub s_last_error_errcode: u8,
    pub s_encoding: U16,
    pub s_encoding_flags: U16,
    pub s_orphan_file_inum: U32,
    pub s_reserved: [U32; 94],
    pub s_checksum: U32,
}

const _: () = assert!(size_of::<Superblock>() == SUPERBLOCK_SIZE);

impl Superblock {
    /// An all-zero superblock.
    pub fn zeroed() -> Self {
        Self::new_zeroed()
    }

    /// Parse from exactly 1024 bytes (no validation beyond the length).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        Self::read_from_bytes(bytes.get(..SUPERBLOCK_SIZE)?).ok()
    }

    pub fn blocks_count(&self) -> u64 {
        u64::from(self.s_blocks_count_lo.get()) | (u64::from(self.s_blocks_count_hi.get()) << 32)
    }
    pub fn set_blocks_count(&mut self, v: u64) {
        self.s_blocks_count_lo.set(v as u32);
        self.s_blocks_count_hi.set((v >> 32) as u32);
    }
    pub fn r_blocks_count(&self) -> u64 {
        u64::from(self.s_r_blocks_count_lo.get())
            | (u64::from(self.s_r_blocks_count_hi.get()) << 32)
    }
    pub fn set_r_blocks_count(&mut self, v: u64) {
        self.s_r_blocks_count_lo.set(v as u32);
        self.s_r_blocks_count_hi.set((v >> 32) as u32);
    }
    pub fn free_blocks_count(&self) -> u64 {
        u64::from(self.s_free_blocks_count_lo.get())
            | (u64::from(self.s_free_blocks_count_hi.get()) << 32)
    }
    pub fn set_free_blocks_count(&mut self, v: u64) {
        self.s_free_blocks_count_lo.set(v as u32);
        self.s_free_blocks_count_hi.set((v >> 32) as u32);
    }
    /// Block size in bytes, if `s_log_block_size` is sane (1 KiB..64 KiB).
    pub fn block_size(&self) -> Option<u32> {
        let l = self.s_log_block_size.get();
        (l <= 6).then(|| 1024u32 << l)
    }
    /// Descriptor size in bytes (32 without the 64bit feature).
    pub fn desc_size(&self) -> u16 {
        if self.s_feature_incompat.get() & crate::features::Incompat::BIT64.bits() != 0 {
            self.s_desc_size.get()
        } else {
            32
        }
    }

    /// Compute the checksum over the first 1020 bytes.
    pub fn compute_checksum(&self) -> u32 {
        checksum::crc32c_raw(!0, &self.as_bytes()[..SUPERBLOCK_SIZE - 4])
    }
    /// Store a fresh checksum.
    pub fn update_checksum(&mut self) {
        let c = self.compute_checksum();
        self.s_checksum.set(c);
    }
    /// Does the stored checksum match?
    pub fn checksum_ok(&self) -> bool {
        self.compute_checksum() == self.s_checksum.get()
    }
}
