//! ext4kit library.
pub mod image;
pub mod lazyinit;
pub mod mkfs;
pub mod profile;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod undo;
