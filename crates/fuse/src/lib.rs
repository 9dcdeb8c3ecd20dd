//! ext4kit's FUSE adapter: the read-write engine ([`ext4kit_fs`]) served
//! to the kernel as a mounted filesystem. The only crate that depends on
//! `fuser` (0.18, pure-Rust mount: mount(2) on `/dev/fuse` as root,
//! `fusermount3` otherwise; no libfuse).
//!
//! - [`options`]: `-o` options with the kernel's ext4 names.
//! - [`atime`]: relatime/strictatime/noatime/nodiratime/lazytime atime
//!   updates on READ, READDIR and READLINK, as the kernel's VFS makes them.
//! - [`attr`]: inode numbers (FUSE's root 1 is ext4's 2), attributes,
//!   times (with a workaround for fuser 0.18.0's pre-1970 setattr bug),
//!   device numbers, errno values as kernel ext4 returns them.
//! - [`shared`]: the engine (read-write, or the read side for `ro`) and
//!   the mount's bookkeeping: lookup counts, open handles, orphans
//!   (unlinked while open: freed at the last release/forget or at
//!   unmount), readdir snapshots, the tid of each inode's last change
//!   (what fsync commits).
//! - [`idle`]: the idle commit (what `sync(1)` cannot ask a FUSE
//!   server for: commit once the mount went quiet).
//! - [`ops`]: the operations, one `op_*` method per FUSE request with
//!   plain arguments and answers (no transport's types).
//! - `fuser_fs`: the `fuser::Filesystem` adapter over them.
//! - [`proto`]: our own transport's kernel ABI and codec (not used by
//!   the mount yet).
//! - [`trim`]: `FITRIM` (fstrim on the mount point).
//! - [`wbuf`]: the write-behind buffer of the default (write-through)
//!   mount: small writes answered at once, merged, flushed in order.
//! - [`mount`]: open, mount, serve, unmount on signals, close cleanly.
//! - `session`: our own FUSE session loop on `/dev/fuse`
//!   (`-o transport=ext4kit`, experimental).
//! - `fusermount`: the mount of a user who is not root, through the
//!   set-user-ID `fusermount3` (the `/dev/fuse` fd passed back).

pub mod atime;
pub mod attr;
pub mod flags;
mod fuser_fs;
mod fusermount;
pub mod idle;
pub mod mount;
pub mod ops;
pub mod options;
pub mod proto;
mod session;
pub mod shared;
pub mod trim;
mod uring;
pub mod wbuf;

#[doc(hidden)]
pub use mount::serve_wrapped;
pub use mount::{MountError, MountReport, MountRequest, default_threads, serve};
pub use options::{MountOptions, OptionError};
