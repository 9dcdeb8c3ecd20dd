//! `ext4kit mount` by a user who is not root (issue 23 item 5): through
//! the set-user-ID `fusermount3`, as libfuse mounts. As root, the test
//! makes an image and a mount point owned by uid 65534 and runs the
//! mount as that uid (setpriv): write and read a file, unmount with
//! `fusermount3 -u`, the server exits 0, `e2fsck -fn` is clean.
//!
//! fusermount3 opens `/dev/fuse` as the user, so `/dev/fuse` must be
//! mode 0666 as udev normally makes it; where it is 0600 (this machine)
//! the test runs in a private mount namespace (`unshare -m`) with a mode
//! 0666 node of the same device bound over `/dev/fuse` there: the host's
//! `/dev/fuse` is not touched, and every mount lives and dies in the
//! namespace. The refusals are checked too: with `/dev/fuse` closed to
//! the user, and `allow_other` without `user_allow_other`, the mount
//! fails with one line saying what is missing.
//!
//! Skips (with the reason) when not root, without /dev/fuse, without a
//! set-user-ID root fusermount3, setpriv or unshare, or when uid 65534
//! cannot reach the ext4kit binary.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::*;

const UID: &str = "65534";

fn why_not() -> Result<(), String> {
    fuse_available()?;
    let fm = find_tool("fusermount3").ok_or("fusermount3 not installed (package fuse3)")?;
    let md = std::fs::metadata(&fm).map_err(|e| format!("{}: {e}", fm.display()))?;
    if md.uid() != 0 || md.mode() & 0o4000 == 0 {
        return Err(format!("{} is not set-user-ID root", fm.display()));
    }
    for t in ["setpriv", "unshare", "mknod", "mount"] {
        if !have(t) {
            return Err(format!("{t} not installed"));
        }
    }
    // Every directory above the binary must be searchable by others.
    let mut p = Path::new(ext4kit_path()).parent();
    while let Some(d) = p {
        let mode = std::fs::metadata(d).map_err(|e| e.to_string())?.mode();
        if mode & 0o001 == 0 {
            return Err(format!("{} is not searchable by uid {UID}", d.display()));
        }
        p = d.parent();
    }
    Ok(())
}

/// `sh -c SCRIPT` as uid/gid 65534, no supplementary groups, in `dir`;
/// with `private_fuse`, in a private mount namespace whose `/dev/fuse`
/// is `dir/fuse` (mode 0666).
fn as_user(dir: &Path, script: &str, private_fuse: bool) -> std::process::Output {
    let user = format!(
        "exec setpriv --reuid={UID} --regid={UID} --clear-groups env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin LC_ALL=C B='{}' sh -c '{}'",
        ext4kit_path(),
        script.replace('\'', r"'\''")
    );
    let mut c = if private_fuse {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind '{}/fuse' /dev/fuse && {user}",
                dir.display()
            ));
        c
    } else {
        let mut c = Command::new("sh");
        c.arg("-c").arg(user);
        c
    };
    c.current_dir(dir).output().expect("running sh")
}

fn text(o: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Mount as the user, write and read a file and a directory, unmount
/// with `fusermount3 -u`: the server (-f) exits 0 and the image is clean.
const MOUNT_SCRIPT: &str = r#"
$B mount -f img m 2>server.err & pid=$!
i=0
until grep -q " $PWD/m fuse" /proc/self/mounts; do
  i=$((i+1)); [ $i -gt 500 ] && { echo "not mounted"; cat server.err; exit 10; }
  kill -0 $pid 2>/dev/null || { echo "server exited"; cat server.err; exit 11; }
  sleep 0.02
done
grep " $PWD/m fuse" /proc/self/mounts
echo hello > m/f && mkdir m/d && echo deep > m/d/g || exit 12
[ "$(cat m/f)" = hello ] && [ "$(cat m/d/g)" = deep ] || exit 13
[ "$(stat -c %u m/f)" = 65534 ] || exit 14
fusermount3 -u m || exit 15
wait $pid; rc=$?
cat server.err
[ $rc = 0 ] || { echo "server exit $rc"; exit 16; }
! grep -q " $PWD/m " /proc/self/mounts || exit 17
"#;

#[test]
fn user_mounts_through_fusermount3() {
    if let Err(r) = why_not() {
        return skip("user_mounts_through_fusermount3", &r);
    }
    let td = image_dir();
    let dir = td.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let img = dir.join("img");
    run_ok(&mut ext4kit_mkfs([
        "-q",
        "-E",
        &format!("root_owner={UID}:{UID}"),
        img.to_str().unwrap(),
        "32M",
    ]))
    .unwrap();
    let m = dir.join("m");
    std::fs::create_dir(&m).unwrap();
    let owner = format!("{UID}:{UID}");
    let paths = [dir, &img, &m].map(|p| p.to_str().unwrap());
    run_ok(tool("chown").arg(&owner).args(paths)).unwrap();

    // /dev/fuse closed to the user (mode 0600 here): one line saying so.
    let dev_open = Command::new("setpriv")
        .args([
            &format!("--reuid={UID}"),
            &format!("--regid={UID}"),
            "--clear-groups",
            "test",
            "-r",
            "/dev/fuse",
            "-a",
            "-w",
            "/dev/fuse",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !dev_open {
        let o = as_user(dir, "$B mount -f img m", false);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", text(&o));
        assert_eq!(err.trim().lines().count(), 1, "{}", text(&o));
        assert!(
            err.contains("/dev/fuse (mode") && err.contains("0666"),
            "{}",
            text(&o)
        );
    }

    // The mount itself, with a mode 0666 /dev/fuse (private if need be).
    let node = dir.join("fuse");
    run_ok(tool("mknod").args([node.to_str().unwrap(), "c", "10", "229"])).unwrap();
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_user(dir, MOUNT_SCRIPT, !dev_open);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("user_id=65534"), "{}", text(&o));
    assert!(
        out.contains("nosuid") && out.contains("nodev"),
        "{}",
        text(&o)
    );
    e2fsck_clean(&img).unwrap();

    // allow_other without user_allow_other in /etc/fuse.conf: refused,
    // with fusermount3's reason.
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if !conf.lines().any(|l| l.trim() == "user_allow_other") {
        let o = as_user(dir, "$B mount -f -o allow_other img m", !dev_open);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", text(&o));
        assert_eq!(err.trim().lines().count(), 1, "{}", text(&o));
        assert!(err.contains("user_allow_other"), "{}", text(&o));
    }
    e2fsck_clean(&img).unwrap();
}
