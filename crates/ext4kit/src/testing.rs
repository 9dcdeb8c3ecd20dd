//! Test support (this crate's tests, and with the `test-support`
//! feature the engine's): a fresh ext4 made in memory by ext4kit's own
//! mkfs, the image the unit tests of lazy init, the allocators and the
//! journal start from.

use ext4kit_device::MemDevice;

use crate::mkfs::{self, Env, MkfsOptions};
use crate::profile::Profile;

/// An in-memory ext4 to make: mke2fs.conf's ext4 features of Debian 12
/// (metadata_csum, 64bit, flex_bg, no orphan_file), 256-byte inodes,
/// the tests' fixed UUID and clock, lazy inode tables, no discard.
#[derive(Clone, Debug)]
pub struct MemImage {
    pub size: u64,
    pub block_size: u32,
    pub inode_ratio: u32,
    /// `-g`.
    pub blocks_per_group: Option<u32>,
    /// `-O` edits.
    pub features: Vec<String>,
    /// More `-E` options (after `nodiscard`).
    pub extended: Vec<String>,
}

impl MemImage {
    pub fn new(size: u64, block_size: u32, inode_ratio: u32) -> MemImage {
        MemImage {
            size,
            block_size,
            inode_ratio,
            blocks_per_group: None,
            features: Vec::new(),
            extended: Vec::new(),
        }
    }

    /// Make it; the message says what mkfs refused.
    pub fn make(&self) -> Result<MemDevice, String> {
        let dev = MemDevice::new(self.size);
        self.make_on(&dev)?;
        Ok(dev)
    }

    /// Make it on `dev` (of at least `size` bytes, reading as zeros).
    pub fn make_on(&self, dev: &dyn ext4kit_device::Device) -> Result<(), String> {
        let conf = format!(
            "[defaults]\n\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr\n\tblocksize = {}\n\tinode_size = 256\n\tinode_ratio = {}\n[fs_types]\n\text4 = {{\n\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize\n\t}}\n",
            self.block_size, self.inode_ratio
        );
        let opts = MkfsOptions {
            fs_type: Some("ext4".into()),
            uuid: Some("0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09".into()),
            extended: std::iter::once("nodiscard".to_string())
                .chain(self.extended.iter().cloned())
                .collect(),
            blocks_per_group: self.blocks_per_group,
            features: self.features.clone(),
            ..MkfsOptions::default()
        };
        let env = Env {
            device_size: Some(self.size),
            is_regular_file: false,
            logical_sector_size: 512,
            physical_sector_size: 512,
            io_hints: None,
            now: 1_700_000_000,
            page_size: 4096,
            uid: 0,
            gid: 0,
            kernel_lazy_itable_init: true,
        };
        let profile = Profile::parse(&conf).map_err(|e| e.to_string())?;
        let resolved = mkfs::resolve(&opts, &profile, &env).map_err(|e| e.to_string())?;
        let prepared = mkfs::prepare(resolved, false).map_err(|e| e.to_string())?;
        mkfs::execute(dev, prepared).map_err(|e| e.to_string())?;
        Ok(())
    }
}
