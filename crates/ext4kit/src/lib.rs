//! ext4kit library.
pub mod mkfs;
pub mod profile;
