//! Our own FUSE transport's wire format (issues 18 and 23; see
//! ARCHITECTURE "Our own FUSE transport"): the kernel ABI structs
//! ([`abi`]), request decoding and reply encoding ([`codec`]). Written
//! from the kernel's `include/uapi/linux/fuse.h` (7.43). Not used by
//! the mount yet: fuser is the transport.

pub mod abi;
pub mod codec;
