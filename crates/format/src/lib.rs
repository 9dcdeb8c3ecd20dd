//! ext4 on-disk format: every structure declared once, little-endian
//! (jbd2 big-endian), and every checksum computed in [`checksum`].
//! No I/O happens in this crate.

pub mod acl;
pub mod casefold;
pub mod checksum;
pub mod dir;
pub mod dirhash;
pub mod extent;
pub mod features;
pub mod fscrypt;
pub mod group_desc;
pub mod htree;
pub mod inode;
pub mod jbd2;
pub mod layout;
pub mod mmp;
pub mod orphan;
pub mod superblock;
pub mod xattr;

pub use checksum::Csum;
pub use features::{Compat, Features, Incompat, RoCompat, Word};
pub use group_desc::GroupDesc;
pub use inode::Inode;
pub use superblock::Superblock;
