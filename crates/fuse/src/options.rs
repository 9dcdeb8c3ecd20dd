//! `-o` mount options, with the kernel's ext4 names and meanings where
//! ext4kit has them, FUSE's `allow_other`/`default_permissions`/
//! `writeback_cache`, and ext4kit's own `lazyinit=`.
//!
//! Parsing is pure: an unknown or malformed option is a one-line
//! [`OptionError`] before anything is opened, so a refused mount writes
//! nothing. Later options override earlier ones (`-o ro,rw` is `rw`), as
//! with mount(8).

use std::time::Duration;

pub use ext4kit_fs::rw::ErrorBehavior;

/// Which FUSE transport serves the mount (`transport=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// `transport=ext4kit` (default): our own session loop on
    /// `/dev/fuse` (`crate::session`).
    #[default]
    Ext4kit,
    /// `transport=fuser`: fuser 0.18's session (kept selectable while
    /// it exists; it lacks FUSE_TMPFILE and FUSE_STATX).
    Fuser,
}

/// FUSE over io_uring on our own transport (`uring` / `nouring`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Uring {
    /// The default: io_uring where the kernel offers it (its
    /// `fuse.enable_uring` Y, or N and set by root, saying so), else
    /// `/dev/fuse` without a word.
    #[default]
    Auto,
    /// `uring`: insist; where it cannot be had, `/dev/fuse` with one
    /// line why.
    On,
    /// `nouring`: `/dev/fuse` only.
    Off,
}

/// How online lazy init paces itself (`lazyinit=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LazyinitPace {
    /// `init_itable=N` (default 10, the kernel's default multiplier).
    #[default]
    Fixed,
    /// `lazyinit=adaptive`: the multiplier follows contention signals.
    Adaptive,
}

/// Parsed mount options (used where [`crate::mount`] opens the engine and
/// starts online lazy init).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    /// `ro`: served from the read side; the device is opened read-only.
    pub read_only: bool,
    /// `discard` / `nodiscard` (default off): the per-commit discard batch
    /// and the reconciler at open (`crates/fs/src/discard.rs`).
    pub discard: bool,
    /// `init_itable=N`: online lazy init sleeps N times the time each
    /// group took (kernel default 10).
    pub init_itable: u32,
    /// `noinit_itable`: no online lazy init.
    pub noinit_itable: bool,
    /// `lazyinit=adaptive|fixed`.
    pub lazyinit: LazyinitPace,
    /// `commit=SEC`: the running transaction is committed once it is this
    /// old (default 5 s; `commit=0` means the default, as in the kernel).
    pub commit: Duration,
    /// `errors=remount-ro|continue`; `None`: what the superblock's
    /// `s_errors` says (tune2fs -e), as the kernel does.
    pub errors: Option<ErrorBehavior>,
    /// `norecovery` / `noload` (with `ro` only): a dirty journal is not
    /// replayed, not even in memory; the on-disk state is shown as it is.
    pub norecovery: bool,
    /// FUSE `allow_other`: users other than the mounting one may access
    /// the mount (permissions are checked by the kernel).
    pub allow_other: bool,
    /// FUSE `default_permissions`. Always in effect: the kernel checks
    /// permissions (and POSIX ACLs) as for any local filesystem; the
    /// option is accepted so that fstab lines can carry it.
    pub default_permissions: bool,
    /// `writeback_cache` / `nowriteback_cache` (FUSE's writeback cache,
    /// default off): writes go to the kernel's page cache and reach the
    /// engine by writeback (merged into requests of up to 1 MiB), as on a
    /// local filesystem; the kernel keeps size and times and handles
    /// `O_APPEND`. `fsync`, `close` and the unmount write the pages back
    /// first, so what `fsync` promises is unchanged. `SEEK_DATA`/
    /// `SEEK_HOLE` of a file open for writing first have the kernel write
    /// its dirty pages back (an inval notify, see `FuseFs::lseek`), so
    /// they answer from the extent map as ext4 does (with blocks smaller
    /// than a page the kernel writes whole pages, so the zeros around a
    /// partial write into a hole are data). What it gives up, because the
    /// kernel's FUSE does not ask before: `st_blocks` counts dirty data
    /// only once written back (exact after fsync, which invalidates the
    /// kernel's cached attributes, and close); ENOSPC and a write past
    /// ext4's largest file size come from the fsync or close after the
    /// write-back (EFBIG, ENOSPC), not from `write(2)`.
    pub writeback_cache: bool,
    /// `sync` / `async` (default async): the kernel mount is synchronous
    /// (every write is followed by an fsync of its file, as on ext4), and
    /// writes go to the engine directly instead of the write-behind
    /// buffer ([`crate::wbuf`]).
    pub sync: bool,
    /// `noatime`: no atime updates (also passed to the kernel mount).
    /// With neither this nor `strictatime`: `relatime` (the default), as
    /// the kernel's (see [`crate::atime`]).
    pub noatime: bool,
    /// `strictatime`: every access updates the atime.
    pub strictatime: bool,
    /// `nodiratime` / `diratime`: no atime updates of directories.
    pub nodiratime: bool,
    /// `lazytime` / `nolazytime`: atime updates kept in memory until the
    /// inode's fsync, `ext4kit sync`, 12 hours, or the unmount ([`crate::atime`]).
    pub lazytime: bool,
    /// `nosuid` / `suid`, `nodev` / `dev`, `noexec` / `exec`: VFS flags of
    /// the kernel mount. ext4kit's default is `nosuid,nodev` (what a FUSE
    /// mount gets unless asked otherwise); `suid` and `dev` need root (a
    /// mount through fusermount3 is always nosuid,nodev).
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    /// `transport=ext4kit|fuser`: the FUSE session (ext4kit's own by
    /// default, see [`Transport`]).
    pub transport: Transport,
    /// `uring` / `nouring`: our own transport over io_uring (FUSE over
    /// io_uring, kernel 6.14+; by default where the kernel offers it,
    /// see [`Uring`]), falling back to `/dev/fuse` where the kernel
    /// lacks it. `uring` implies `transport=ext4kit`; a later
    /// `transport=fuser` turns it off again (fuser reads `/dev/fuse`).
    pub uring: Uring,
    /// `uring_depth=N`: ring entries per ring thread (1 to
    /// [`MAX_URING_DEPTH`], default [`DEFAULT_URING_DEPTH`]): requests the
    /// kernel can hand a ring before its thread commits one.
    pub uring_depth: u16,
    /// `journal_path=PATH`: the filesystem's external journal device
    /// (the kernel's option; checked to be the filesystem's journal at
    /// open).
    pub journal_path: Option<std::path::PathBuf>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            discard: false,
            init_itable: DEFAULT_INIT_ITABLE,
            noinit_itable: false,
            lazyinit: LazyinitPace::Fixed,
            commit: DEFAULT_COMMIT,
            errors: None,
            norecovery: false,
            allow_other: false,
            default_permissions: true,
            writeback_cache: DEFAULT_WRITEBACK_CACHE,
            sync: false,
            noatime: false,
            strictatime: false,
            nodiratime: false,
            lazytime: false,
            nosuid: true,
            nodev: true,
            noexec: false,
            transport: Transport::Ext4kit,
            uring: Uring::Auto,
            uring_depth: DEFAULT_URING_DEPTH,
            journal_path: None,
        }
    }
}

/// Ring entries per ring thread by default. More than one: a request
/// whose reply waits (LSEEK with the writeback cache has the kernel
/// write dirty pages back first, and those WRITEs come to the queue of
/// the CPU the LSEEK runs on) must not hold the queue's only entry.
pub const DEFAULT_URING_DEPTH: u16 = 4;
/// Most ring entries per ring thread (each has a payload buffer of
/// `max_write`, virtual until touched).
pub const MAX_URING_DEPTH: u16 = 64;
/// The kernel's `JBD2_DEFAULT_MAX_COMMIT_AGE`.
pub const DEFAULT_COMMIT: Duration = Duration::from_secs(5);
/// FUSE's writeback cache only with `writeback_cache`: it is faster for
/// small writes but gives up what the kernel's FUSE cannot keep exact
/// with it (see [`MountOptions::writeback_cache`]).
pub const DEFAULT_WRITEBACK_CACHE: bool = false;
/// The kernel's `EXT4_DEF_LI_WAIT_MULT`.
pub const DEFAULT_INIT_ITABLE: u32 = 10;
/// Longest `commit=` accepted (the kernel takes up to `INT_MAX / HZ`; a
/// day is already far past any useful value).
pub const MAX_COMMIT_SECS: u64 = 86_400;

/// A refused `-o` string: one line naming the option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(pub String);

impl MountOptions {
    /// Parse the comma-separated option lists of every `-o` in order
    /// (later options win), then check the combination.
    pub fn parse<'a>(lists: impl IntoIterator<Item = &'a str>) -> Result<Self, OptionError> {
        let mut o = MountOptions::default();
        for list in lists {
            for opt in list.split(',') {
                let opt = opt.trim();
                if !opt.is_empty() {
                    o.apply(opt)?;
                }
            }
        }
        if o.norecovery && !o.read_only {
            return Err(OptionError(
                "norecovery/noload needs a read-only mount (add -o ro)".into(),
            ));
        }
        Ok(o)
    }

    fn apply(&mut self, opt: &str) -> Result<(), OptionError> {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let flag = |set: &mut bool, v: bool| -> Result<(), OptionError> {
            if value.is_some() {
                return Err(OptionError(format!("mount option '{key}' takes no value")));
            }
            *set = v;
            Ok(())
        };
        match key {
            "ro" => flag(&mut self.read_only, true),
            "rw" => flag(&mut self.read_only, false),
            "discard" => flag(&mut self.discard, true),
            "nodiscard" => flag(&mut self.discard, false),
            "noinit_itable" => flag(&mut self.noinit_itable, true),
            "init_itable" => {
                // The kernel's `init_itable` alone means the default.
                self.init_itable = match value {
                    None => DEFAULT_INIT_ITABLE,
                    Some(v) => number(key, v)?,
                };
                self.noinit_itable = false;
                Ok(())
            }
            "uring" | "nouring" => {
                if value.is_some() {
                    return Err(OptionError(format!("mount option '{key}' takes no value")));
                }
                if key == "uring" {
                    self.uring = Uring::On;
                    self.transport = Transport::Ext4kit;
                } else {
                    self.uring = Uring::Off;
                }
                Ok(())
            }
            "uring_depth" => {
                let v = value.ok_or_else(|| {
                    OptionError("mount option 'uring_depth' needs a value (1 to 64)".into())
                })?;
                let n: u16 = number(key, v)?;
                if !(1..=MAX_URING_DEPTH).contains(&n) {
                    return Err(OptionError(format!(
                        "uring_depth={n} is out of range (1 to {MAX_URING_DEPTH})"
                    )));
                }
                self.uring_depth = n;
                Ok(())
            }
            "journal_path" => {
                match value {
                    Some(v) if !v.is_empty() => self.journal_path = Some(v.into()),
                    _ => {
                        return Err(OptionError(
                            "mount option 'journal_path' needs a value (the journal device)".into(),
                        ));
                    }
                }
                Ok(())
            }
            "transport" => {
                self.transport = match value {
                    Some("fuser") => {
                        self.uring = Uring::Off;
                        Transport::Fuser
                    }
                    Some("ext4kit") => Transport::Ext4kit,
                    Some(v) => {
                        return Err(OptionError(format!(
                            "invalid value '{v}' for mount option 'transport' (fuser or ext4kit)"
                        )));
                    }
                    None => {
                        return Err(OptionError(
                            "mount option 'transport' needs a value (fuser or ext4kit)".into(),
                        ));
                    }
                };
                Ok(())
            }
            "lazyinit" => {
                self.lazyinit = match value {
                    Some("adaptive") => LazyinitPace::Adaptive,
                    Some("fixed") => LazyinitPace::Fixed,
                    Some(v) => {
                        return Err(OptionError(format!(
                            "invalid value '{v}' for mount option 'lazyinit' (adaptive or fixed)"
                        )));
                    }
                    None => {
                        return Err(OptionError(
                            "mount option 'lazyinit' needs a value (adaptive or fixed)".into(),
                        ));
                    }
                };
                Ok(())
            }
            "commit" => {
                let secs: u64 = match value {
                    Some(v) => number(key, v)?,
                    None => 0,
                };
                if secs > MAX_COMMIT_SECS {
                    return Err(OptionError(format!(
                        "commit={secs} is too large (at most {MAX_COMMIT_SECS} seconds)"
                    )));
                }
                self.commit = if secs == 0 {
                    DEFAULT_COMMIT
                } else {
                    Duration::from_secs(secs)
                };
                Ok(())
            }
            "errors" => {
                self.errors = match value {
                    Some("remount-ro") => Some(ErrorBehavior::RemountRo),
                    Some("continue") => Some(ErrorBehavior::Continue),
                    Some("panic") => {
                        return Err(OptionError(
                            "errors=panic is not supported (use remount-ro or continue)".into(),
                        ));
                    }
                    Some(v) => {
                        return Err(OptionError(format!(
                            "invalid value '{v}' for mount option 'errors' (remount-ro or continue)"
                        )));
                    }
                    None => {
                        return Err(OptionError(
                            "mount option 'errors' needs a value (remount-ro or continue)".into(),
                        ));
                    }
                };
                Ok(())
            }
            "norecovery" | "noload" => flag(&mut self.norecovery, true),
            "data" => match value {
                Some("ordered") => Ok(()),
                Some(v @ ("journal" | "writeback")) => Err(OptionError(format!(
                    "data={v} is not supported (only data=ordered)"
                ))),
                Some(v) => Err(OptionError(format!(
                    "invalid value '{v}' for mount option 'data' (only ordered)"
                ))),
                None => Err(OptionError(
                    "mount option 'data' needs a value (ordered)".into(),
                )),
            },
            "allow_other" => flag(&mut self.allow_other, true),
            "default_permissions" => flag(&mut self.default_permissions, true),
            "writeback_cache" => flag(&mut self.writeback_cache, true),
            "nowriteback_cache" => flag(&mut self.writeback_cache, false),
            "sync" => flag(&mut self.sync, true),
            "async" => flag(&mut self.sync, false),
            // ext4kit's defaults (rw, nosuid, nodev, exec, async): a no-op.
            "defaults" => {
                let mut ignored = false;
                flag(&mut ignored, false)
            }
            "suid" => flag(&mut self.nosuid, false),
            "dev" => flag(&mut self.nodev, false),
            "exec" => flag(&mut self.noexec, false),
            // The atime modes, as mount(8): `atime` undoes `noatime`.
            "relatime" => {
                flag(&mut self.noatime, false)?;
                flag(&mut self.strictatime, false)
            }
            "strictatime" => {
                flag(&mut self.noatime, false)?;
                flag(&mut self.strictatime, true)
            }
            "noatime" => {
                flag(&mut self.strictatime, false)?;
                flag(&mut self.noatime, true)
            }
            "atime" => flag(&mut self.noatime, false),
            "nodiratime" => flag(&mut self.nodiratime, true),
            "diratime" => flag(&mut self.nodiratime, false),
            "lazytime" => flag(&mut self.lazytime, true),
            "nolazytime" => flag(&mut self.lazytime, false),
            "nosuid" => flag(&mut self.nosuid, true),
            "nodev" => flag(&mut self.nodev, true),
            "noexec" => flag(&mut self.noexec, true),
            _ => Err(OptionError(format!("unknown mount option '{opt}'"))),
        }
    }
}

fn number<T: std::str::FromStr>(key: &str, v: &str) -> Result<T, OptionError> {
    v.parse().map_err(|_| {
        OptionError(format!(
            "invalid value '{v}' for mount option '{key}' (a whole number)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<MountOptions, OptionError> {
        MountOptions::parse([s])
    }

    #[test]
    fn defaults() {
        let o = p("").unwrap();
        assert_eq!(o, MountOptions::default());
        assert!(!o.read_only && !o.discard && !o.noinit_itable);
        assert_eq!(o.commit, Duration::from_secs(5));
        assert_eq!(o.init_itable, 10);
    }

    #[test]
    fn kernel_names() {
        let o =
            p("ro,discard,init_itable=3,commit=30,errors=continue,noload,data=ordered").unwrap();
        assert!(o.read_only && o.discard && o.norecovery);
        assert_eq!(o.init_itable, 3);
        assert_eq!(o.commit, Duration::from_secs(30));
        assert_eq!(o.errors, Some(ErrorBehavior::Continue));
        let o =
            MountOptions::parse(["discard", "nodiscard,noinit_itable,lazyinit=adaptive"]).unwrap();
        assert!(!o.discard && o.noinit_itable);
        assert_eq!(o.lazyinit, LazyinitPace::Adaptive);
        assert_eq!(p("commit=0").unwrap().commit, DEFAULT_COMMIT);
        assert!(!p("ro,rw").unwrap().read_only);
        assert!(p("allow_other,default_permissions").unwrap().allow_other);
        assert!(p("noatime,nosuid,nodev,noexec,defaults").unwrap().nosuid);
        assert!(!p("").unwrap().writeback_cache);
        assert_eq!(p("").unwrap().transport, Transport::Ext4kit);
        assert_eq!(
            p("transport=ext4kit").unwrap().transport,
            Transport::Ext4kit
        );
        assert_eq!(p("transport=fuser").unwrap().transport, Transport::Fuser);
        // journal_path=: the external journal device; a value is needed.
        assert_eq!(
            p("journal_path=/dev/sdb1").unwrap().journal_path,
            Some("/dev/sdb1".into())
        );
        assert_eq!(p("").unwrap().journal_path, None);
        assert!(p("journal_path").is_err());
        assert!(p("journal_path=").is_err());
        assert!(p("transport=x").is_err());
        // uring: our own transport over io_uring; later options win.
        assert_eq!(p("").unwrap().uring, Uring::Auto);
        let u = p("uring").unwrap();
        assert!(u.uring == Uring::On && u.transport == Transport::Ext4kit);
        assert_eq!(p("uring,transport=fuser").unwrap().uring, Uring::Off);
        let u = p("transport=fuser,uring").unwrap();
        assert!(u.uring == Uring::On && u.transport == Transport::Ext4kit);
        let u = p("uring,nouring").unwrap();
        assert!(u.uring == Uring::Off && u.transport == Transport::Ext4kit);
        assert_eq!(p("nouring,uring").unwrap().uring, Uring::On);
        assert!(p("nouring=1").is_err());
        assert_eq!(p("").unwrap().uring_depth, DEFAULT_URING_DEPTH);
        assert_eq!(p("uring_depth=8").unwrap().uring_depth, 8);
        for bad in [
            "uring_depth",
            "uring_depth=0",
            "uring_depth=65",
            "uring_depth=x",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("uring=1").is_err());
        assert!(p("transport").is_err());
        assert!(p("writeback_cache").unwrap().writeback_cache);
        assert!(
            !p("writeback_cache,nowriteback_cache")
                .unwrap()
                .writeback_cache
        );
        assert!(!p("").unwrap().sync);
        assert!(p("sync").unwrap().sync);
        assert!(!p("sync,async").unwrap().sync);
    }

    #[test]
    fn atime_modes() {
        let o = p("").unwrap();
        assert!(!o.noatime && !o.strictatime && !o.nodiratime && !o.lazytime);
        let o = p("strictatime,nodiratime,lazytime").unwrap();
        assert!(o.strictatime && o.nodiratime && o.lazytime && !o.noatime);
        let o = p("strictatime,noatime").unwrap();
        assert!(o.noatime && !o.strictatime);
        let o = p("noatime,strictatime").unwrap();
        assert!(!o.noatime && o.strictatime);
        let o = p("noatime,atime").unwrap();
        assert!(!o.noatime && !o.strictatime);
        let o = p("strictatime,relatime,nodiratime,diratime,lazytime,nolazytime").unwrap();
        assert_eq!(o, MountOptions::default());
        // suid/dev/exec as mount(8), nosuid,nodev by default.
        let o = p("").unwrap();
        assert!(o.nosuid && o.nodev && !o.noexec);
        let o = p("suid,dev,noexec").unwrap();
        assert!(!o.nosuid && !o.nodev && o.noexec);
        let o = p("suid,dev,noexec,nosuid,exec,defaults").unwrap();
        assert!(o.nosuid && !o.nodev && !o.noexec);
        assert!(p("dev=1").is_err());
        // nodiratime is no longer noatime.
        assert!(!p("nodiratime").unwrap().noatime);
        assert!(p("relatime=1").is_err());
    }

    #[test]
    fn refusals_name_the_option() {
        for (s, want) in [
            ("bogus", "unknown mount option 'bogus'"),
            ("rw,frobnicate=1", "unknown mount option 'frobnicate=1'"),
            ("commit=x", "invalid value 'x' for mount option 'commit'"),
            ("commit=-1", "invalid value '-1'"),
            ("commit=99999999", "too large"),
            ("init_itable=many", "invalid value 'many'"),
            ("errors=panic", "errors=panic is not supported"),
            ("errors=sometimes", "invalid value 'sometimes'"),
            ("data=journal", "data=journal is not supported"),
            ("norecovery", "needs a read-only mount"),
            ("noload,rw", "needs a read-only mount"),
            ("ro=1", "'ro' takes no value"),
            ("writeback_cache=1", "'writeback_cache' takes no value"),
            ("lazyinit=sometimes", "invalid value 'sometimes'"),
        ] {
            let e = p(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(!e.contains('\n'), "{s}: {e}");
        }
    }
}
