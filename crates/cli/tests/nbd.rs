//! ext4kit against real NBD servers (qemu-nbd on a sparse file, over a
//! unix socket): mkfs byte-identical to mkfs on a file, e2fsck clean,
//! server-side allocation no larger, lazyinit and ls over the export, a
//! clean error when the server is gone. Skips without qemu-nbd.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UUID: &str = "01234567-89ab-cdef-0123-456789abcdef";

/// A qemu-nbd process, killed on drop (also when a test fails).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qemu_nbd(file: &Path, sock: &Path) -> Option<Server> {
    let child = Command::new("qemu-nbd")
        .args([
            "-f",
            "raw",
            "-x",
            "ex",
            "--persistent",
            "--discard=unmap",
            "-k",
        ])
        .arg(sock)
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let s = Server(child);
    let start = Instant::now();
    while !sock.exists() {
        if start.elapsed() > Duration::from_secs(20) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(s)
}

fn ext4kit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ext4kit"))
        .args(args)
        .env("E2FSPROGS_FAKE_TIME", "1700000000")
        .output()
        .expect("run ext4kit")
}

fn blocks(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks()
}

#[test]
fn mkfs_lazyinit_and_tools_over_qemu_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("exported.img");
    let plain = dir.path().join("plain.img");
    let sock = dir.path().join("nbd.sock");
    for f in [&exported, &plain] {
        std::fs::File::create(f)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
    }
    let Some(server) = qemu_nbd(&exported, &sock) else {
        eprintln!("SKIP mkfs_lazyinit_and_tools_over_qemu_nbd: qemu-nbd missing or not starting");
        return;
    };
    let uri = format!("nbd+unix:///ex?socket={}", sock.display());
    let hash = format!("hash_seed={UUID}");
    let mkfs = |dev: &str| {
        let o = ext4kit(&["mkfs", "-q", "-U", UUID, "-E", &hash, dev]);
        assert!(
            o.status.success(),
            "{dev}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    mkfs(&uri);
    mkfs(plain.to_str().unwrap());
    let a = std::fs::read(&exported).unwrap();
    let b = std::fs::read(&plain).unwrap();
    assert!(a == b, "mkfs over NBD differs from mkfs on a file");
    assert!(
        blocks(&exported) <= blocks(&plain),
        "server allocation {} > {} blocks",
        blocks(&exported),
        blocks(&plain)
    );
    let fsck = Command::new("e2fsck")
        .arg("-fn")
        .arg(&exported)
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );

    let o = ext4kit(&["ls", "-a", &uri]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("lost+found"));
    let o = ext4kit(&["ls", &format!("{uri}:/lost+found")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ext4kit(&["lazyinit", &uri]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ext4kit(&["info", &uri]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // The server gone: one clean line, no panic.
    drop(server);
    let o = ext4kit(&["info", &uri]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&uri) && !err.contains("panicked"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn bad_nbd_uri_is_one_line() {
    let o = ext4kit(&["info", "nbd+unix:///ex"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("invalid NBD URI: missing ?socket=PATH"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
