//! `ext4kit mkfs` with invalid input: every case must exit non-zero with a
//! one-line error on stderr (nothing on stdout), and must not write a single
//! byte to the target, which is filled with a recognizable pattern first.
//!
//! A case marked `known_failing` prints `KNOWN-FAIL` instead of failing the
//! test (so the suite stays green while the code catches up); every other
//! failing case is collected and all of them are reported at the end.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;

/// The target's size: 8 MiB of pseudo-random bytes.
const TARGET_SIZE: u64 = 8 * MIB;
/// Stands for the target path in a case's arguments.
const T: &str = "{T}";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// An 8 MiB file of pattern bytes.
    Pattern,
    /// A path that does not exist (and must not be created).
    Missing,
    /// An empty directory (which must stay empty).
    Dir,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Non-zero exit, exactly one line on stderr, nothing on stdout.
    OneLineError,
    /// Like `OneLineError`, and the message contains this text.
    OneLineErrorWith(&'static str),
    /// A command-line parsing error (clap): non-zero exit; the message may
    /// take several lines.
    UsageError,
}

struct Case {
    name: &'static str,
    /// Arguments after `mkfs`; `{T}` is replaced by the target path.
    args: &'static [&'static str],
    target: Target,
    expect: Expect,
    known_failing: bool,
}

const fn bad(name: &'static str, args: &'static [&'static str]) -> Case {
    Case {
        name,
        args,
        target: Target::Pattern,
        expect: Expect::OneLineError,
        known_failing: false,
    }
}

impl Case {
    const fn target(mut self, t: Target) -> Case {
        self.target = t;
        self
    }
    const fn expect(mut self, e: Expect) -> Case {
        self.expect = e;
        self
    }
    #[allow(dead_code)] // kept for cases ext4kit does not handle yet
    const fn known_failing(mut self) -> Case {
        self.known_failing = true;
        self
    }
}

const CASES: &[Case] = &[
    bad("-U not-a-uuid", &["-t", "ext4", "-U", "not-a-uuid", T]),
    bad(
        "-E hash_seed=bad",
        &["-t", "ext4", "-E", "hash_seed=bad", T],
    ),
    bad("-E unknown_key", &["-t", "ext4", "-E", "unknown_key", T]),
    bad("-E stride=abc", &["-t", "ext4", "-E", "stride=abc", T]),
    bad(
        "-E root_owner=abc",
        &["-t", "ext4", "-E", "root_owner=abc", T],
    ),
    bad(
        "-O no_such_feature",
        &["-t", "ext4", "-O", "no_such_feature", T],
    ),
    // bigalloc and quota: mke2fs's refusals (mkfs_parity checks that
    // mke2fs refuses them too).
    bad(
        "-O bigalloc without extents",
        &["-t", "ext4", "-O", "bigalloc,^extent,^64bit", T],
    )
    .expect(Expect::OneLineErrorWith(
        "Can't support bigalloc feature without extents feature",
    )),
    bad("-C without bigalloc", &["-t", "ext4", "-C", "65536", T]).expect(Expect::OneLineErrorWith(
        "specifying a cluster size requires the bigalloc feature",
    )),
    bad(
        "-C smaller than the block size",
        &[
            "-t", "ext4", "-b", "4096", "-O", "bigalloc", "-C", "2048", T,
        ],
    )
    .expect(Expect::OneLineErrorWith(
        "The cluster size may not be smaller than the block size",
    )),
    bad(
        "-C 1024",
        &["-t", "ext4", "-O", "bigalloc", "-C", "1024", T],
    )
    .expect(Expect::UsageError),
    bad("-C 1G", &["-t", "ext4", "-O", "bigalloc", "-C", "1G", T]).expect(Expect::UsageError),
    bad(
        "-O project -I 128",
        &["-t", "ext4", "-O", "project", "-I", "128", T],
    )
    .expect(Expect::OneLineErrorWith(
        "128 byte inodes are too small for project quota",
    )),
    bad(
        "-E quotatype=bogus",
        &["-t", "ext4", "-O", "quota", "-E", "quotatype=usr:bogus", T],
    )
    .expect(Expect::OneLineErrorWith(
        "Failed to parse quota type at bogus",
    )),
    bad(
        "-E quotatype without a value",
        &["-t", "ext4", "-O", "quota", "-E", "quotatype", T],
    ),
    bad("-b 70000", &["-t", "ext4", "-b", "70000", T]),
    bad("-b 128", &["-t", "ext4", "-b", "128", T]),
    bad("-I 100", &["-t", "ext4", "-I", "100", T]),
    bad(
        "-I 8192 -b 4096",
        &["-t", "ext4", "-I", "8192", "-b", "4096", T],
    ),
    bad("-i 10", &["-t", "ext4", "-i", "10", T]),
    bad("-N 4294967296", &["-t", "ext4", "-N", "4294967296", T]),
    bad("-m 60", &["-t", "ext4", "-m", "60", T]),
    bad("-G 3", &["-t", "ext4", "-G", "3", T]),
    bad(
        "-G 16 -O ^flex_bg",
        &["-t", "ext4", "-G", "16", "-O", "^flex_bg", T],
    ),
    bad(
        "-J size=1 (too small)",
        &["-t", "ext4", "-b", "4096", "-J", "size=1", T],
    ),
    bad("-J size=999999", &["-t", "ext4", "-J", "size=999999", T]),
    bad("-t no_such_type", &["-t", "no_such_type", T]),
    bad(
        "-O ^metadata_csum,metadata_csum_seed",
        &["-t", "ext4", "-O", "^metadata_csum,metadata_csum_seed", T],
    ),
    // A size larger than a regular file grows the file, as with mke2fs
    // (see `size_larger_than_regular_file_grows_it`); block devices are
    // never exceeded (see `size_larger_than_block_device_is_refused`).
    bad("size 0", &["-t", "ext4", T, "0"]),
    bad("size 12Q", &["-t", "ext4", T, "12Q"]),
    bad("too small: 60K (1k blocks)", &["-t", "ext4", T, "60K"]),
    bad("too small: 100K (1k blocks)", &["-t", "ext4", T, "100K"]),
    bad(
        "too small: 60K -b 4096",
        &["-t", "ext4", "-b", "4096", T, "60K"],
    ),
    bad("missing path, no size", &["-t", "ext4", T])
        .target(Target::Missing)
        .expect(Expect::OneLineErrorWith("does not exist")),
    bad("directory as target", &["-t", "ext4", T]).target(Target::Dir),
    bad("directory as target, with size", &["-t", "ext4", T, "8M"]).target(Target::Dir),
    bad("unknown CLI option --bogus", &["-t", "ext4", "--bogus", T]),
    // meta_bg and descriptor sizes, refused as mke2fs refuses them.
    bad(
        "-O meta_bg with resize_inode",
        &["-t", "ext4", "-O", "meta_bg", T],
    )
    .expect(Expect::OneLineErrorWith(
        "resize_inode and meta_bg features are not compatible",
    )),
    bad(
        "-E desc_size=128 -O ^64bit",
        &["-t", "ext4", "-O", "^64bit", "-E", "desc_size=128", T],
    )
    .expect(Expect::OneLineErrorWith("desc_size requires '-O 64bit'")),
    bad("-E desc_size=96", &["-t", "ext4", "-E", "desc_size=96", T])
        .expect(Expect::OneLineErrorWith("Invalid desc_size: '96'")),
    bad(
        "-E desc_size=12k",
        &["-t", "ext4", "-E", "desc_size=12k", T],
    )
    .expect(Expect::OneLineErrorWith("Invalid desc_size")),
    // mke2fs takes these and writes a filesystem e2fsck rejects (2048,
    // 32) or dies of SIGFPE (8192): ext4kit refuses them.
    bad(
        "-E desc_size=2048",
        &["-t", "ext4", "-E", "desc_size=2048", T],
    )
    .expect(Expect::OneLineErrorWith("Invalid desc_size")),
    bad("-E desc_size=32", &["-t", "ext4", "-E", "desc_size=32", T])
        .expect(Expect::OneLineErrorWith("Invalid desc_size")),
    bad("-E offset=abc", &["-t", "ext4", "-E", "offset=abc", T])
        .expect(Expect::OneLineErrorWith("Invalid offset: abc")),
    bad("-E offset=12k", &["-t", "ext4", "-E", "offset=12k", T])
        .expect(Expect::OneLineErrorWith("Invalid offset: 12k")),
    // Revision 0 and -s, as mke2fs refuses them.
    bad("-r 2", &["-t", "ext4", "-r", "2", T]).expect(Expect::OneLineErrorWith(
        "Filesystem revision too high while trying to create revision 2",
    )),
    bad("-r x", &["-t", "ext4", "-r", "x", T])
        .expect(Expect::OneLineErrorWith("bad revision level - x")),
    bad(
        "-r 0 -O extent",
        &["-t", "ext4", "-r", "0", "-O", "extent", T],
    )
    .expect(Expect::OneLineErrorWith(
        "Filesystem features not supported with revision 0 filesystems",
    )),
    bad("-r 0 -j", &["-t", "ext2", "-r", "0", "-j", T]).expect(Expect::OneLineErrorWith(
        "Journals not supported with revision 0 filesystems",
    )),
    bad("-r 0 -s 1", &["-t", "ext2", "-r", "0", "-s", "1", T]).expect(Expect::OneLineErrorWith(
        "Sparse superblocks not supported with revision 0 filesystems",
    )),
    bad("-s 0 with resize_inode", &["-t", "ext4", "-s", "0", T]).expect(Expect::OneLineErrorWith(
        "reserved online resize blocks not supported on non-sparse",
    )),
    // e2fsprogs' m_mkfs_overhead: mke2fs refuses it ("Cannot create
    // filesystem with requested number of inodes").
    bad(
        "m_mkfs_overhead",
        &[
            "-o", "Linux", "-o", "hurd", "-b", "1024", "-m", "0", "-g", "256", "-N", "3745", "-t",
            "ext2", T, "1024",
        ],
    )
    .expect(Expect::OneLineErrorWith("too many inodes")),
    bad(
        "-o hurd -O filetype",
        &["-t", "ext2", "-o", "hurd", "-O", "filetype", T],
    )
    .expect(Expect::OneLineErrorWith(
        "The HURD does not support the filetype feature.",
    )),
    bad(
        "-o hurd -O metadata_csum",
        &["-t", "ext4", "-o", "hurd", "-O", "metadata_csum", T],
    )
    .expect(Expect::OneLineErrorWith(
        "The HURD does not support the metadata_csum feature.",
    )),
    // Newer than mke2fs 1.47.0, which calls them bad options.
    bad("-E nodirect_io", &["-t", "ext4", "-E", "nodirect_io", T]).expect(
        Expect::OneLineErrorWith("Bad option(s) specified: nodirect_io"),
    ),
    bad("-E direct_io", &["-t", "ext4", "-E", "direct_io", T]).expect(Expect::OneLineErrorWith(
        "Bad option(s) specified: direct_io",
    )),
    // More than 2^32 blocks without 64bit (and without mke2fs.conf's
    // auto_64-bit_support).
    bad("-O ^64bit, 17T", &["-t", "ext4", "-O", "^64bit", T, "17T"]).expect(
        Expect::OneLineErrorWith(
            "Size of device (0x110000000 blocks) too big to be expressed in 32 bits",
        ),
    ),
    // Features outside mke2fs's ok_features may be neither set nor
    // cleared, named or as FEATURE_<word><bit>: mke2fs names the whole
    // -O string.
    bad(
        "-O ^lazy_bg",
        &["-t", "ext4", "-O", "has_journal,^lazy_bg", T],
    )
    .expect(Expect::OneLineErrorWith(
        "Invalid filesystem option set: has_journal,^lazy_bg",
    )),
    bad("-O compression", &["-t", "ext4", "-O", "compression", T]).expect(
        Expect::OneLineErrorWith("Invalid filesystem option set: compression"),
    ),
    bad("-O FEATURE_C20", &["-t", "ext4", "-O", "FEATURE_C20", T]).expect(
        Expect::OneLineErrorWith("Invalid filesystem option set: FEATURE_C20"),
    ),
    bad(
        "-O ^needs_recovery",
        &["-t", "ext4", "-O", "^needs_recovery", T],
    )
    .expect(Expect::OneLineErrorWith(
        "Invalid filesystem option set: ^needs_recovery",
    )),
    // mke2fs 1.47.0 -S creates the orphan file over lost+found and data
    // blocks (or fails after zeroing the primary superblock).
    bad(
        "-S with orphan_file",
        &["-t", "ext4", "-S", "-O", "orphan_file", T],
    )
    .expect(Expect::OneLineErrorWith("-S with orphan_file")),
    // mke2fs's block count wraps around and it never ends.
    bad(
        "-E offset past the end",
        &["-t", "ext4", "-E", "offset=99999999999", T],
    )
    .expect(Expect::OneLineErrorWith("past the end of the device")),
    // mke2fs 1.47.0 takes it and writes a version 1 journal superblock
    // with version 2 fields, which e2fsck clears.
    bad(
        "-J v1_superblock",
        &["-t", "ext4", "-J", "v1_superblock", T],
    )
    .expect(Expect::OneLineErrorWith(
        "-J v1_superblock is not supported",
    )),
];

/// What a command did, for messages.
fn describe(out: &Output) -> String {
    format!(
        "exit {}; stdout {:?}; stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Check exit status and messages against `expect`.
fn check_output(out: &Output, expect: Expect) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return Err(format!("succeeded ({})", describe(out)));
    }
    if out.status.code() == Some(101) || stderr.contains("panicked") {
        return Err(format!("panicked ({})", describe(out)));
    }
    if out.status.code().is_none() {
        return Err(format!("killed by a signal ({})", describe(out)));
    }
    if expect == Expect::UsageError {
        return Ok(());
    }
    let lines: Vec<&str> = stderr.lines().collect();
    if lines.len() != 1 || lines[0].trim().is_empty() {
        return Err(format!(
            "stderr is not exactly one line ({})",
            describe(out)
        ));
    }
    if !out.stdout.is_empty() {
        return Err(format!("wrote to stdout ({})", describe(out)));
    }
    if let Expect::OneLineErrorWith(text) = expect
        && !lines[0].contains(text)
    {
        return Err(format!("message lacks {text:?} ({})", describe(out)));
    }
    Ok(())
}

fn run_case(
    dir: &Path,
    pristine: &Path,
    pristine_hash: (u64, u64),
    c: &Case,
) -> Result<(), String> {
    let target: PathBuf = match c.target {
        Target::Pattern => {
            let p = dir.join("target.img");
            std::fs::copy(pristine, &p).map_err(|e| format!("copying the target: {e}"))?;
            p
        }
        Target::Missing => {
            let p = dir.join("missing.img");
            let _ = std::fs::remove_file(&p);
            p
        }
        Target::Dir => {
            let p = dir.join("a-directory");
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).map_err(|e| e.to_string())?;
            p
        }
    };
    let target_str = target.display().to_string();
    let args: Vec<&str> = c
        .args
        .iter()
        .map(|&a| if a == T { target_str.as_str() } else { a })
        .collect();
    let out = run(ext4kit_mkfs(&args)
        .env("MKE2FS_CONFIG", dir.join("mke2fs.conf"))
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME))?;
    let verdict = check_output(&out, c.expect);
    // Whatever the messages, the target must be untouched.
    let untouched = match c.target {
        Target::Pattern => match file_hash(&target) {
            Ok(h) if h == pristine_hash => Ok(()),
            Ok((_, len)) => Err(format!(
                "TARGET MODIFIED (now {len} bytes, content hash differs)"
            )),
            Err(e) => Err(format!("target unreadable afterwards: {e}")),
        },
        Target::Missing => match target.symlink_metadata() {
            Err(_) => Ok(()),
            Ok(_) => Err("the missing target was CREATED".to_string()),
        },
        Target::Dir => match std::fs::read_dir(&target).map(Iterator::count) {
            Ok(0) => Ok(()),
            Ok(_) => Err("something was created inside the directory".to_string()),
            Err(e) => Err(format!("the directory is gone: {e}")),
        },
    };
    match (verdict, untouched) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(a), Ok(())) | (Ok(()), Err(a)) => Err(a),
        (Err(a), Err(b)) => Err(format!("{b}; {a}")),
    }
}

#[test]
fn bad_input_is_refused_without_writing() {
    let dir = image_dir();
    std::fs::write(dir.path().join("mke2fs.conf"), DEBIAN_CONF).unwrap();
    let pristine = dir.path().join("pristine.img");
    pattern_file(&pristine, TARGET_SIZE, 0x5eed_a5a5).unwrap();
    let hash = file_hash(&pristine).unwrap();

    let mut failures = Vec::new();
    for c in CASES {
        match run_case(dir.path(), &pristine, hash, c) {
            Ok(()) if c.known_failing => {
                eprintln!("FIXED? {}: passes but is marked known_failing", c.name)
            }
            Ok(()) => eprintln!("ok     {}", c.name),
            Err(why) if c.known_failing => eprintln!("KNOWN-FAIL {}: {why}", c.name),
            Err(why) => {
                eprintln!("FAIL   {}: {why}", c.name);
                failures.push(format!("{}: {why}", c.name));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} bad-input case(s) misbehave:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// An unknown usage type is only a warning for mke2fs (it goes on with the
/// other settings); ext4kit must then format, and format correctly.
#[test]
fn unknown_usage_type_is_only_a_warning() {
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let img = dir.path().join("t.img");
    sparse_file(&img, 64 * MIB).unwrap();
    let out = run(ext4kit_mkfs(["-t", "ext4", "-T", "no_such_usage"])
        .arg(&img)
        .env("MKE2FS_CONFIG", &conf))
    .unwrap();
    assert!(
        out.status.success(),
        "ext4kit mkfs failed: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no_such_usage"),
        "no warning about the unknown usage type: {}",
        describe(&out)
    );
    if !have("e2fsck") {
        return skip(
            "unknown_usage_type_is_only_a_warning (fsck)",
            "e2fsck not found",
        );
    }
    e2fsck_clean(&img).unwrap();
}

/// Like mke2fs, a size larger than a regular file grows the file.
#[test]
fn size_larger_than_regular_file_grows_it() {
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let img = dir.path().join("t.img");
    sparse_file(&img, 8 * MIB).unwrap();
    let out = run(ext4kit_mkfs(["-q", "-t", "ext4"])
        .arg(&img)
        .arg("16M")
        .env("MKE2FS_CONFIG", &conf))
    .unwrap();
    assert!(
        out.status.success(),
        "ext4kit mkfs failed: {}",
        describe(&out)
    );
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 16 * MIB);
    if !have("e2fsck") {
        return skip("size_larger_than_regular_file_grows_it", "e2fsck not found");
    }
    e2fsck_clean(&img).unwrap();
}

/// A mounted filesystem, whether named by its loop device or by the image
/// file behind it, must be refused, and left as it was.
#[test]
fn mounted_target_is_refused() {
    const TEST: &str = "mounted_target_is_refused";
    if let Err(why) = kernel_mount_available() {
        return skip(TEST, &why);
    }
    let dir = image_dir();
    let conf = dir.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let img = dir.path().join("mounted.img");
    run_ok(
        ext4kit_mkfs(["-q", "-t", "ext4"])
            .arg(&img)
            .arg("64M")
            .env("MKE2FS_CONFIG", &conf),
    )
    .unwrap();
    let lo = match LoopDev::attach(&img) {
        Ok(lo) => lo,
        Err(why) => return skip(TEST, &format!("cannot attach a loop device: {why}")),
    };
    // Read-only, so that the kernel itself writes nothing while we look.
    let mnt = match Mount::new(lo.path(), "ext4", Some("ro")) {
        Ok(m) => m,
        Err(why) => return skip(TEST, &format!("cannot mount ext4: {why}")),
    };
    let before = file_hash(&img).unwrap();
    let dev_before = file_hash(lo.path()).unwrap();

    let mut failures = Vec::new();
    let targets = [
        ("the loop device", lo.path().to_path_buf()),
        ("the image file", img.clone()),
    ];
    for (what, target) in &targets {
        for size in [None, Some("32M")] {
            let mut cmd = ext4kit_mkfs(["-F", "-t", "ext4"]);
            cmd.arg(target).args(size).env("MKE2FS_CONFIG", &conf);
            let out = run(&mut cmd).unwrap();
            let label = format!("mkfs on {what} (size {size:?})");
            match check_output(&out, Expect::OneLineError) {
                Ok(()) => eprintln!("ok     {label}: {}", last_line(&out)),
                Err(why) => failures.push(format!("{label}: {why}")),
            }
        }
    }
    if file_hash(&img).unwrap() != before || file_hash(lo.path()).unwrap() != dev_before {
        failures.push("the mounted filesystem was MODIFIED".to_string());
    }
    mnt.unmount().unwrap();
    drop(lo);
    if have("e2fsck")
        && let Err(e) = e2fsck_clean(&img)
    {
        failures.push(e);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// FS-SIZE larger than a block device must be refused, device untouched.
#[test]
fn size_larger_than_block_device_is_refused() {
    const TEST: &str = "size_larger_than_block_device_is_refused";
    if let Err(why) = kernel_mount_available() {
        return skip(TEST, &why);
    }
    let dir = image_dir();
    std::fs::write(dir.path().join("mke2fs.conf"), DEBIAN_CONF).unwrap();
    let img = dir.path().join("dev.img");
    pattern_file(&img, TARGET_SIZE, 0xb10c).unwrap();
    let before = file_hash(&img).unwrap();
    let lo = match LoopDev::attach(&img) {
        Ok(lo) => lo,
        Err(why) => return skip(TEST, &format!("cannot attach a loop device: {why}")),
    };
    let out = run(ext4kit_mkfs(["-t", "ext4"])
        .arg(lo.path())
        .arg("16M")
        .env("MKE2FS_CONFIG", dir.path().join("mke2fs.conf")))
    .unwrap();
    let verdict = check_output(&out, Expect::OneLineError);
    drop(lo);
    assert_eq!(file_hash(&img).unwrap(), before, "the device was MODIFIED");
    verdict.unwrap();
}
