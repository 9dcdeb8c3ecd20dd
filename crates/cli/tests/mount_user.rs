//! `ext4kit mount` by a user who is not root (issue 23 item 5): through
//! the set-user-ID `fusermount3`, as libfuse mounts. As root, the test
//! makes an image and a mount point owned by uid 65534 and runs the
//! mount as that uid (setpriv): write and read a file, unmount with
//! `fusermount3 -u`, the server exits 0, `e2fsck -fn` is clean; a
//! `kill -9` of the server, the next mount replays, SIGTERM ends it
//! cleanly; with `user_allow_other` (a private `/etc/fuse.conf`) an
//! `allow_other` mount, which auto_unmount removes after a `kill -9`.
//!
//! fusermount3 opens `/dev/fuse` as the user, so `/dev/fuse` must be
//! mode 0666 as udev normally makes it; where it is 0600 (this machine)
//! the test runs in a private mount namespace (`unshare -m`) with a mode
//! 0666 node of the same device bound over `/dev/fuse` there: the host's
//! `/dev/fuse` is not touched, and every mount lives and dies in the
//! namespace. The refusals are checked too: with `/dev/fuse` closed to
//! the user, a fusermount3 that is not set-user-ID, and `allow_other`
//! without `user_allow_other`, the mount
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

/// Where [`as_user`] runs its script.
#[derive(Clone, Copy, PartialEq)]
enum Ns {
    /// This process's mount namespace, as it is.
    Host,
    /// A private mount namespace whose `/dev/fuse` is a mode 0666 node
    /// of the same device (`fuse`: the host's is closed to the user).
    Private { fuse: bool },
    /// As `Private`, and `/etc/fuse.conf` there says `user_allow_other`.
    AllowOther { fuse: bool },
}

/// `sh -c SCRIPT` as uid/gid 65534, no supplementary groups, in `dir`
/// (`$B` is the ext4kit binary), in the namespace `ns` describes.
fn as_user(dir: &Path, script: &str, ns: Ns) -> std::process::Output {
    let user = format!(
        "exec setpriv --reuid={UID} --regid={UID} --clear-groups env -i PATH=/usr/bin:/bin:/usr/sbin:/sbin LC_ALL=C B='{}' sh -c '{}'",
        ext4kit_path(),
        script.replace('\'', r"'\''")
    );
    let d = dir.display();
    let (fuse, conf) = match ns {
        Ns::Host => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(user);
            return c.current_dir(dir).output().expect("running sh");
        }
        Ns::Private { fuse } => (fuse, false),
        Ns::AllowOther { fuse } => (fuse, true),
    };
    let mut setup = String::new();
    if fuse {
        // The node on a tmpfs of the namespace's own: the test's
        // directory may be on a nodev mount (/dev/shm often is).
        std::fs::create_dir_all(dir.join("dev")).unwrap();
        setup += &format!(
            "mount -t tmpfs -o mode=755 ext4kit-test '{d}/dev' && mknod -m 666 '{d}/dev/fuse' c $((0x$(stat -c %t /dev/fuse))) $((0x$(stat -c %T /dev/fuse))) && mount --bind '{d}/dev/fuse' /dev/fuse && "
        );
    }
    if conf {
        std::fs::write(dir.join("fuse.conf"), "user_allow_other\n").unwrap();
        setup += &format!("mount --bind '{d}/fuse.conf' /etc/fuse.conf && ");
    }
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup}{user}"));
    c.current_dir(dir).output().expect("running unshare")
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

/// A `kill -9` of the server (`-o $OPTS`), then a mount that replays
/// the journal and is ended by SIGTERM (`fusermount3 -u -z` for a
/// user): the server exits 0. With `$GONE` set the killed server's mount
/// must go by itself (auto_unmount); else it is cleared with
/// `fusermount3 -u -z`: fusermount3 (3.14) looks at the mount point as
/// root before its auto_unmount, and a mount without allow_other
/// refuses root (EACCES), so it leaves the mount alone.
const KILL_SCRIPT: &str = r#"
live() {
  i=0
  until grep -q " $PWD/m fuse" /proc/self/mounts; do
    i=$((i+1)); [ $i -gt 500 ] && { echo "not mounted"; cat server.err; exit 20; }
    kill -0 $1 2>/dev/null || { echo "server exited"; cat server.err; exit 21; }
    sleep 0.02
  done
}
$B mount -f -o $OPTS img m 2>server.err & pid=$!
live $pid
echo more > m/k && sync m/k || exit 22
kill -9 $pid; wait $pid
if [ -n "$GONE" ]; then
  i=0
  while grep -q " $PWD/m fuse" /proc/self/mounts; do
    i=$((i+1)); [ $i -gt 500 ] && { echo "still mounted after kill -9"; exit 23; }
    sleep 0.02
  done
else
  fusermount3 -u -z m || exit 27
fi
$B mount -f -o $OPTS img m 2>server.err & pid=$!
live $pid
[ "$(cat m/k)" = more ] || exit 24
kill -TERM $pid; wait $pid; rc=$?
cat server.err
[ $rc = 0 ] || { echo "server exit $rc after SIGTERM"; exit 25; }
! grep -q " $PWD/m " /proc/self/mounts || exit 26
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
        let o = as_user(dir, "$B mount -f img m", Ns::Host);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", text(&o));
        assert_eq!(err.trim().lines().count(), 1, "{}", text(&o));
        assert!(
            err.contains("/dev/fuse (mode") && err.contains("0666"),
            "{}",
            text(&o)
        );
    }

    // A fusermount3 that is not set-user-ID (a copy, first on PATH): one
    // line naming it.
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let fm = find_tool("fusermount3").unwrap();
    std::fs::copy(&fm, bin.join("fusermount3")).unwrap();
    std::fs::set_permissions(
        bin.join("fusermount3"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let o = as_user(dir, "PATH=$PWD/bin:$PATH $B mount -f img m", Ns::Host);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(err.trim().lines().count(), 1, "{}", text(&o));
    assert!(
        err.contains("bin/fusermount3 is not set-user-ID root"),
        "{}",
        text(&o)
    );

    // The mount itself, with a mode 0666 /dev/fuse (private if need be).
    let fuse = !dev_open;
    let o = as_user(dir, MOUNT_SCRIPT, Ns::Private { fuse });
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("user_id=65534"), "{}", text(&o));
    assert!(
        out.contains("nosuid") && out.contains("nodev"),
        "{}",
        text(&o)
    );
    e2fsck_clean(&img).unwrap();
    let kill = |opts: &str, gone: bool, ns: Ns| {
        let gone = if gone { "GONE=1" } else { "GONE=" };
        let script = format!("OPTS={opts} {gone}\n{KILL_SCRIPT}");
        let o = as_user(dir, &script, ns);
        assert!(o.status.success(), "-o {opts}: {}", text(&o));
        e2fsck_clean(&img).unwrap();
    };
    kill("rw", false, Ns::Private { fuse });
    // With user_allow_other (in the namespace's /etc/fuse.conf):
    // allow_other, and auto_unmount after a kill -9.
    if Path::new("/etc/fuse.conf").is_file() {
        kill("allow_other", true, Ns::AllowOther { fuse });
        // The same over FUSE over io_uring (a user's mount takes it with
        // `-o uring` where the switch is on): the killed server's rings
        // hold fusermount3's socket, so its auto_unmount sees the
        // connection gone (not ECONNABORTED mid-teardown) and unmounts.
        match common::fuse::UringSwitch::on() {
            Ok(_on) => kill("uring,allow_other", true, Ns::AllowOther { fuse }),
            Err(why) => skip("user_mounts_through_fusermount3 (-o uring)", &why),
        }
    }

    // allow_other without user_allow_other in /etc/fuse.conf: refused,
    // with fusermount3's reason.
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if !conf.lines().any(|l| l.trim() == "user_allow_other") {
        let o = as_user(
            dir,
            "$B mount -f -o allow_other img m",
            Ns::Private { fuse },
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{}", text(&o));
        assert_eq!(err.trim().lines().count(), 1, "{}", text(&o));
        assert!(err.contains("user_allow_other"), "{}", text(&o));
    }
    e2fsck_clean(&img).unwrap();
}
