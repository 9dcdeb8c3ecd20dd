//! Error messages of `info`, `lazyinit` and `mkfs` for the targets a new
//! user gets wrong first: a missing file (also in a missing directory), a
//! directory, a file that holds no ext4 filesystem. Each is one line on
//! stderr that names the path once, says the OS error at most once, and
//! exits non-zero without writing anything.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

/// stderr as text.
fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run `ext4kit ARGS` and demand a failure whose first stderr line names
/// `path` exactly once and contains `what`; no OS error text twice.
fn fails_naming(args: &[&str], path: &Path, what: &str) {
    let out = run(ext4kit().args(args)).unwrap();
    let err = stderr(&out);
    assert_ne!(out.status.code(), Some(0), "{args:?} succeeded: {err}");
    assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {err}");
    let first = err.lines().next().unwrap_or("");
    let p = path.display().to_string();
    assert!(first.starts_with("ext4kit: "), "{args:?}: {err}");
    assert_eq!(
        first.matches(&p).count(),
        1,
        "{args:?}: path not once: {first}"
    );
    assert!(first.contains(what), "{args:?}: want {what:?} in {first}");
    assert!(first.matches("os error").count() <= 1, "{args:?}: {first}");
    // The OS message (e.g. "No such file or directory") is not repeated.
    for m in [
        "No such file or directory",
        "Is a directory",
        "Not a directory",
    ] {
        assert!(first.matches(m).count() <= 1, "{args:?}: repeated: {first}");
    }
    // Only "refused N of M ..." may follow (lazyinit's summary).
    for l in err.lines().skip(1) {
        assert!(
            l.starts_with("ext4kit: refused "),
            "{args:?}: extra line {l:?}"
        );
    }
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("missing.img");
    let s = img.to_str().unwrap();
    fails_naming(&["info", s], &img, "No such file or directory");
    fails_naming(&["info", "--json", s], &img, "No such file or directory");
    fails_naming(&["lazyinit", s], &img, "No such file or directory");
    fails_naming(
        &["lazyinit", "--dry-run", s],
        &img,
        "No such file or directory",
    );
    fails_naming(
        &["mkfs", s],
        &img,
        "does not exist and no size was specified",
    );
    fails_naming(&["mkfs", "-n", s], &img, "does not exist");
    assert!(!img.exists());

    // A missing directory on the way: the OS error once, the path once.
    let deep = dir.path().join("no-such-dir").join("x.img");
    let d = deep.to_str().unwrap();
    fails_naming(
        &["info", d],
        &deep,
        "No such file or directory (os error 2)",
    );
    fails_naming(
        &["lazyinit", d],
        &deep,
        "No such file or directory (os error 2)",
    );
    fails_naming(
        &["mkfs", d, "8M"],
        &deep,
        "No such file or directory (os error 2)",
    );
    assert!(!dir.path().join("no-such-dir").exists());
}

#[test]
fn directory() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("adir");
    std::fs::create_dir(&sub).unwrap();
    let s = sub.to_str().unwrap();
    let what = "not a regular file or block device";
    fails_naming(&["info", s], &sub, what);
    fails_naming(&["lazyinit", s], &sub, what);
    fails_naming(&["mkfs", s], &sub, what);
    fails_naming(&["mkfs", "-F", s, "8M"], &sub, what);
    assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 0);
}

#[test]
fn not_ext4() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("junk.bin");
    // 4 MiB of a fixed pattern: no ext2/3/4 magic anywhere.
    let junk: Vec<u8> = (0..4 * MIB as usize).map(|i| (i % 251) as u8).collect();
    std::fs::write(&img, &junk).unwrap();
    let s = img.to_str().unwrap();
    let what = "not an ext2/3/4 filesystem";
    fails_naming(&["info", s], &img, what);
    fails_naming(&["info", "--json", s], &img, what);
    fails_naming(&["lazyinit", s], &img, what);
    fails_naming(&["lazyinit", "--dry-run", s], &img, what);
    assert_eq!(std::fs::read(&img).unwrap(), junk, "a refusal wrote");

    // mkfs takes such a file as its target (it holds nothing ext4kit
    // knows); with -F nothing is asked, and the result is clean.
    let out = run_ok(&mut ext4kit_mkfs(["-q", "-F", s])).unwrap();
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    if have("e2fsck") {
        e2fsck_clean(&img).unwrap();
    } else {
        skip("not_ext4 (e2fsck part)", "e2fsck not installed");
    }
}

/// An unreadable mke2fs.conf: the OS error once (the profile error shows
/// its source and returns it; the binary's printer says it once).
#[test]
fn unreadable_config() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("new.img");
    let conf = Path::new("/proc/self/mem"); // read(2) at offset 0: EIO
    if !conf.exists() {
        skip("unreadable_config", "no /proc/self/mem");
        return;
    }
    let out = run(ext4kit_mkfs(["-n"])
        .arg(&img)
        .arg("8M")
        .env("MKE2FS_CONFIG", conf))
    .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("/proc/self/mem").count(), 1, "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
    assert!(!img.exists());
}
