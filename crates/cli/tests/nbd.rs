//! ext4kit against real NBD servers, started and stopped by the tests on
//! unix sockets in temporary directories: qemu-nbd on a sparse file, and
//! nbdkit (file and memory plugins; delay, error, log, nozero, noextents,
//! fua and multi-conn filters). mkfs byte-identical to mkfs on a file,
//! e2fsck clean, server-side allocation no larger, lazyinit, the tools and
//! the mount over an export; error replies, a server killed mid-run and
//! missing commands give one line, and a rerun finishes the job. Tests
//! skip with a printed reason when qemu-nbd / nbdkit are absent.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::fuse::FuseMount;
use common::*;

/// A server process, killed and reaped on drop (also when a test fails).
struct Server {
    child: Option<Child>,
    uri: String,
    log: Option<PathBuf>,
}

impl Server {
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Lines of the log filter's file naming request `what` ("Write",
    /// "Trim", "Zero", "Flush", "Extents"), counted once per request.
    fn count(&self, what: &str) -> usize {
        let Some(log) = &self.log else { return 0 };
        let pat = format!(" {what} id=");
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&pat))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wait for `sock` to appear while `child` lives.
fn started(mut child: Child, sock: &Path, uri: String, log: Option<PathBuf>) -> Option<Server> {
    let t = Instant::now();
    while !sock.exists() {
        if t.elapsed() > Duration::from_secs(20) || child.try_wait().ok().flatten().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(Server {
        child: Some(child),
        uri,
        log,
    })
}

fn qemu_nbd(file: &Path, sock: &Path) -> Option<Server> {
    let _ = std::fs::remove_file(sock);
    let child = Command::new(find_tool("qemu-nbd")?)
        .args(["-f", "raw", "-x", "ex", "--persistent", "--discard=unmap"])
        .arg("-k")
        .arg(sock)
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let uri = format!("nbd+unix:///ex?socket={}", sock.display());
    started(child, sock, uri, None)
}

/// `nbdkit -f -U SOCK --filter=log FILTERS... PLUGIN ARGS... logfile=LOG`:
/// `filters` are filter names, `args` the plugin's and filters' KEY=VALUE.
fn nbdkit(dir: &Path, filters: &[&str], plugin: &str, args: &[&str]) -> Option<Server> {
    let sock = dir.join("kit.sock");
    let log = dir.join("kit.log");
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&log);
    let mut c = Command::new(find_tool("nbdkit")?);
    c.arg("-f").arg("-U").arg(&sock).arg("--filter=log");
    for f in filters {
        c.arg(format!("--filter={f}"));
    }
    c.arg(plugin)
        .args(args)
        .arg(format!("logfile={}", log.display()));
    let child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    started(child, &sock, uri, Some(log))
}

fn have_nbdkit(test: &str) -> bool {
    let ok = have("nbdkit");
    if !ok {
        skip(test, "nbdkit missing");
    }
    ok
}

fn kit(args: &[&str]) -> Output {
    run(ext4kit().args(args).env("E2FSPROGS_FAKE_TIME", FAKE_TIME)).unwrap()
}

fn ok(o: &Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Failed with exactly one line on stderr, no panic, naming `uri`.
fn one_line_failure(o: &Output, uri: &str, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{what}: succeeded");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    assert!(err.contains(uri), "{what}: {err}");
    err
}

fn mkfs_args(dev: &str) -> Vec<String> {
    [
        "mkfs",
        "-q",
        "-U",
        UUID,
        "-E",
        &format!("hash_seed={SEED}"),
        dev,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn mkfs(dev: &str, extra: &[&str]) -> Output {
    let mut a = mkfs_args(dev);
    let d = a.pop().unwrap();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(d);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    kit(&a)
}

fn blocks(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks()
}

/// A sparse file of `size` and a plain-file mkfs of the same size beside
/// it (the reference).
fn files(dir: &Path, size: u64, extra: &[&str]) -> (PathBuf, PathBuf) {
    let exported = dir.join("exported.img");
    let plain = dir.join("plain.img");
    for f in [&exported, &plain] {
        let _ = std::fs::remove_file(f);
        sparse_file(f, size).unwrap();
    }
    ok(&mkfs(plain.to_str().unwrap(), extra), "mkfs on the file");
    (exported, plain)
}

#[test]
fn mkfs_lazyinit_and_tools_over_qemu_nbd() {
    let name = "mkfs_lazyinit_and_tools_over_qemu_nbd";
    let dir = image_dir();
    let (exported, plain) = files(dir.path(), 256 << 20, &[]);
    let sock = dir.path().join("nbd.sock");
    let Some(mut server) = qemu_nbd(&exported, &sock) else {
        return skip(name, "qemu-nbd missing or not starting");
    };
    let uri = server.uri.clone();
    ok(&mkfs(&uri, &[]), "mkfs over NBD");
    sparse_equal(&exported, &plain).unwrap();
    assert!(
        blocks(&exported) <= blocks(&plain),
        "server allocation {} > {} blocks",
        blocks(&exported),
        blocks(&plain)
    );
    e2fsck_clean(&exported).unwrap();

    let o = kit(&["ls", "-a", &uri]);
    ok(&o, "ls");
    assert!(String::from_utf8_lossy(&o.stdout).contains("lost+found"));
    ok(&kit(&["ls", &format!("{uri}:/lost+found")]), "ls dir");
    // The same export twice (another spelling of the socket's path) is
    // refused before anything is written.
    let other = format!("nbd+unix:///ex?socket={}/./nbd.sock", dir.path().display());
    let o = kit(&["lazyinit", "-q", &uri, &other]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("same device as"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    ok(&kit(&["lazyinit", &uri]), "lazyinit");
    ok(&kit(&["info", &uri]), "info");
    // An undo file over NBD, restored by e2undo on the file behind it.
    let undo = dir.path().join("u.e2undo");
    let before = file_hash(&exported).unwrap();
    let o = mkfs(&uri, &["-z", undo.to_str().unwrap(), "-L", "again"]);
    ok(&o, "mkfs -z over NBD");
    server.stop();
    assert_ne!(file_hash(&exported).unwrap(), before);
    ok(
        &run(tool("e2undo").arg(&undo).arg(&exported)).unwrap(),
        "e2undo",
    );
    assert_eq!(file_hash(&exported).unwrap(), before);
    e2fsck_clean(&exported).unwrap();

    // The server gone: one clean line, no panic.
    let o = kit(&["info", &uri]);
    one_line_failure(&o, &uri, "info without a server");
}

/// qemu-nbd (8.2 and later) offers extended headers, which the client
/// takes (64-bit requests: one BLOCK_STATUS for the whole export); the
/// compact headers (`EXT4KIT_NBD_EXTENDED=0`, what servers without them
/// get) write the same bytes.
#[test]
fn qemu_nbd_with_and_without_extended_headers() {
    let name = "qemu_nbd_with_and_without_extended_headers";
    let dir = image_dir();
    let (exported, plain) = files(dir.path(), 5 << 30, &[]);
    let sock = dir.path().join("nbd.sock");
    for extended in ["1", "0"] {
        sparse_file(&exported, 5 << 30).unwrap();
        let Some(mut server) = qemu_nbd(&exported, &sock) else {
            return skip(name, "qemu-nbd missing or not starting");
        };
        let a = mkfs_args(&server.uri);
        let o = run(ext4kit()
            .args(&a)
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
            .env("EXT4KIT_NBD_EXTENDED", extended))
        .unwrap();
        ok(
            &o,
            &format!("mkfs over NBD, EXT4KIT_NBD_EXTENDED={extended}"),
        );
        let o = run(ext4kit()
            .args(["ls", &server.uri])
            .env("EXT4KIT_NBD_EXTENDED", extended))
        .unwrap();
        ok(&o, "ls");
        server.stop();
        sparse_equal(&exported, &plain).unwrap();
        assert!(blocks(&exported) <= blocks(&plain));
    }
    e2fsck_clean(&exported).unwrap();
}

#[test]
fn bad_nbd_uri_is_one_line() {
    let o = kit(&["info", "nbd+unix:///ex"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("invalid NBD URI: missing ?socket=PATH"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// nbdkit's file plugin (mkfs byte-identical, allocation no larger) and
/// memory plugin (copied out with qemu-img, when present, and checked).
#[test]
fn mkfs_lazyinit_and_tools_over_nbdkit_file_and_memory() {
    let name = "mkfs_lazyinit_and_tools_over_nbdkit_file_and_memory";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    let (exported, plain) = files(dir.path(), 128 << 20, &[]);
    let file = format!("file={}", exported.display());
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit file");
    ok(&mkfs(&srv.uri, &[]), "mkfs over nbdkit file");
    sparse_equal(&exported, &plain).unwrap();
    assert!(blocks(&exported) <= blocks(&plain));
    ok(&kit(&["lazyinit", "-q", &srv.uri]), "lazyinit");
    ok(&kit(&["ls", "-a", &srv.uri]), "ls");
    assert!(srv.count("Write") > 0);
    drop(srv);
    e2fsck_clean(&exported).unwrap();

    let srv = nbdkit(dir.path(), &[], "memory", &["size=128M"]).expect("nbdkit memory");
    ok(&mkfs(&srv.uri, &[]), "mkfs over nbdkit memory");
    ok(&kit(&["lazyinit", "-q", &srv.uri]), "lazyinit");
    ok(&kit(&["info", &srv.uri]), "info");
    if have("qemu-img") {
        let out = dir.path().join("memory.img");
        ok(
            &run(tool("qemu-img")
                .args(["convert", "-f", "raw", "-O", "raw"])
                .arg(&srv.uri)
                .arg(&out))
            .unwrap(),
            "qemu-img convert",
        );
        e2fsck_clean(&out).unwrap();
    } else {
        skip(name, "qemu-img missing: the memory export is not fsck'ed");
    }
}

/// Servers that offer and that do not offer WRITE_ZEROES, BLOCK_STATUS,
/// FUA, FAST_ZERO and multi-conn: the same image every time.
#[test]
fn servers_with_and_without_optional_commands() {
    let name = "servers_with_and_without_optional_commands";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    // The file plugin offers WRITE_ZEROES, FUA, multi-conn, TRIM and
    // BLOCK_STATUS; the filters take them away (fua: fuamode=none is
    // the default, and nbdkit 1.32 refuses the word itself).
    let cases: [(&[&str], &[&str]); 7] = [
        (&[], &[]),
        (&["nozero"], &[]),
        (&["nozero"], &["zeromode=plugin", "fastzeromode=none"]),
        (&["noextents"], &[]),
        (&["nozero", "noextents"], &[]),
        (&["fua"], &[]),
        (&["multi-conn"], &["multi-conn-mode=disable"]),
    ];
    for (filters, extra) in cases {
        let what = format!("filters {filters:?} {extra:?}");
        let (exported, plain) = files(dir.path(), 64 << 20, &[]);
        let mut args = vec![format!("file={}", exported.display())];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let srv = nbdkit(dir.path(), filters, "file", &args).expect("nbdkit");
        ok(&mkfs(&srv.uri, &[]), &what);
        if filters.contains(&"noextents") {
            // Nothing is known zero: the inode tables are left for
            // lazyinit (no ITABLE_ZEROED), unlike on a sparse file.
            e2fsck_clean(&exported).unwrap_or_else(|e| panic!("{what}: {e}"));
        } else {
            sparse_equal(&exported, &plain).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        ok(&kit(&["lazyinit", "-q", &srv.uri]), &what);
        if filters.contains(&"nozero") && extra.is_empty() {
            assert_eq!(srv.count("Zero"), 0, "{what}: WRITE_ZEROES sent");
        }
        if filters.contains(&"noextents") {
            assert_eq!(srv.count("Extents"), 0, "{what}: BLOCK_STATUS sent");
        }
        drop(srv);
        e2fsck_clean(&exported).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// The round trips of the default mkfs of a 64 GiB export (nbdkit file
/// plugin, which offers multi-conn): the write open uses four
/// connections and spreads its requests over them, BLOCK_STATUS is asked
/// for the whole device once and everything later (journal, inode
/// tables) is answered by the known-zero cache, and the image stays
/// byte-identical to mkfs on a file.
#[test]
fn mkfs_over_nbd_round_trips() {
    let name = "mkfs_over_nbd_round_trips";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    let (exported, plain) = files(dir.path(), 64 << 30, &[]);
    let file = format!("file={}", exported.display());
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit file");
    ok(
        &run(ext4kit()
            .args(mkfs_args(&srv.uri))
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
            .env_remove("EXT4KIT_NBD_CONNS")
            .env_remove("EXT4KIT_NBD_WINDOW"))
        .unwrap(),
        "mkfs",
    );
    let log = std::fs::read_to_string(srv.log.as_ref().unwrap()).unwrap();
    drop(srv);
    sparse_equal(&exported, &plain).unwrap();
    // Requests per connection ("connection=N Write id=..."): the
    // connections that wrote.
    let mut writers: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" Write id="))
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("connection=")))
        .collect();
    writers.sort_unstable();
    writers.dedup();
    assert_eq!(writers.len(), 4, "{writers:?}");
    // One open for the size probe, the undo check and the run: its four
    // connections are all the handshakes.
    let connects = log
        .lines()
        .filter(|l| l.contains(" Connect export="))
        .count();
    assert_eq!(connects, 4, "one open of four connections");
    // BLOCK_STATUS lengths: no request of one 128 MiB journal extent.
    let counts: Vec<u64> = log
        .lines()
        .filter(|l| l.contains(" Extents id="))
        .filter_map(|l| {
            let c = l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("count=0x"))?;
            u64::from_str_radix(c, 16).ok()
        })
        .collect();
    // The whole-device check (slices of 4 GiB - 64 KiB, the last 1 MiB)
    // fills the known-zero cache: the journal, the inode tables and the
    // edges are answered from it, without a request.
    let whole = counts
        .iter()
        .filter(|&&c| c == 0xffff_0000 || c == 1 << 20)
        .count();
    assert_eq!(whole, 17, "{counts:x?}");
    assert!(counts.len() <= whole + 1, "{counts:x?}");
    assert!(
        !counts
            .iter()
            .any(|&c| c == 128 << 20 || c == (128 << 20) - 4096),
        "{counts:x?}"
    );
    e2fsck_clean(&exported).unwrap();
}

/// Error replies (nbdkit's error filter) on writes, zeroes, trims and
/// block status: one line naming the error, exit ≠ 0; then a rerun
/// against a healthy server finishes the job.
#[test]
fn error_replies_are_one_line_and_a_rerun_finishes() {
    let name = "error_replies_are_one_line_and_a_rerun_finishes";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    // (command, extra filters, error filter settings, the error's name)
    let cases: [(&str, &[&str], &[&str], &str); 6] = [
        ("mkfs", &[], &["error=EIO", "error-pwrite-rate=100%"], "EIO"),
        (
            "mkfs",
            &[],
            &["error=ENOSPC", "error-pwrite-rate=100%"],
            "ENOSPC",
        ),
        ("mkfs", &[], &["error=EIO", "error-trim-rate=100%"], "EIO"),
        // lazyinit's WRITE_ZEROES: only where block status does not
        // already say zero.
        (
            "lazyinit",
            &["noextents"],
            &["error=ENOSPC", "error-zero-rate=100%"],
            "ENOSPC",
        ),
        (
            "lazyinit",
            &[],
            &["error=EIO", "error-extents-rate=100%"],
            "EIO",
        ),
        ("mkfs", &[], &["error=EIO", "error-rate=20%"], "EIO"),
    ];
    for (cmd, filters, eargs, errname) in cases {
        let what = format!("{cmd} with {filters:?} {eargs:?}");
        let (exported, _plain) = files(dir.path(), 64 << 20, &[]);
        let file = format!("file={}", exported.display());
        if cmd == "lazyinit" {
            // Without block status mkfs cannot know the tables read as
            // zero: they are left to lazyinit.
            let srv = nbdkit(dir.path(), &["noextents"], "file", &[&file]).expect("nbdkit");
            ok(&mkfs(&srv.uri, &[]), &what);
        }
        let mut fl = filters.to_vec();
        fl.push("error");
        let mut args = vec![file.as_str()];
        args.extend(eargs);
        let srv = nbdkit(dir.path(), &fl, "file", &args).expect("nbdkit error");
        let o = if cmd == "mkfs" {
            mkfs(&srv.uri, &[])
        } else {
            kit(&["lazyinit", "-q", &srv.uri])
        };
        if o.status.success() {
            // A discard failing is not fatal (mke2fs ignores it too);
            // a random rate may miss every request.
            assert!(
                eargs
                    .iter()
                    .any(|a| a.contains("trim") || a.contains("error-rate")),
                "{what}: succeeded"
            );
        } else {
            let err = one_line_failure(&o, &srv.uri, &what);
            assert!(err.contains(errname), "{what}: {err}");
        }
        drop(srv);
        let srv = nbdkit(dir.path(), filters, "file", &[&file]).expect("nbdkit");
        if cmd == "mkfs" {
            ok(&mkfs(&srv.uri, &[]), &format!("{what}: rerun"));
        } else {
            ok(
                &kit(&["lazyinit", "-q", &srv.uri]),
                &format!("{what}: rerun"),
            );
        }
        drop(srv);
        e2fsck_clean(&exported).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

/// Wait until the server logged `n` requests of `what` (while `child`,
/// the client, still runs); then kill the server.
fn kill_after(srv: &mut Server, child: &mut Child, what: &str, n: usize) {
    let t = Instant::now();
    while srv.count(what) < n {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the client finished before the server saw {n} {what} requests"
        );
        assert!(t.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    srv.stop();
}

fn finish(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

/// A server killed mid-mkfs and mid-lazyinit: one line, exit ≠ 0; a rerun
/// against a restarted server finishes and the image is clean.
#[test]
fn server_killed_mid_mkfs_and_mid_lazyinit() {
    let name = "server_killed_mid_mkfs_and_mid_lazyinit";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    // noextents: nothing is known zero, so the inode tables are zeroed
    // by requests the delay filter slows down.
    let slow: &[&str] = &["noextents", "delay"];
    let (exported, _plain) = files(dir.path(), 64 << 20, &["-b", "1024"]);
    let file = format!("file={}", exported.display());
    let mut srv = nbdkit(
        dir.path(),
        slow,
        "file",
        &[&file, "delay-write=30ms", "delay-zero=30ms"],
    )
    .expect("nbdkit");
    let uri = srv.uri.clone();
    let mut a = mkfs_args(&uri);
    a.insert(1, "-b".into());
    a.insert(2, "1024".into());
    a.insert(3, "-E".into());
    a.insert(4, "lazy_itable_init=0,nodiscard".into());
    let mut child = ext4kit()
        .args(&a)
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_after(&mut srv, &mut child, "Write", 4);
    one_line_failure(&finish(child), &uri, "mkfs, server killed");
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit");
    let b: Vec<&str> = a.iter().map(String::as_str).collect();
    ok(&kit(&b), "mkfs rerun");
    drop(srv);
    e2fsck_clean(&exported).unwrap();

    // lazyinit: mkfs lazily, then kill the server during the zeroing.
    let srv = nbdkit(dir.path(), &["noextents"], "file", &[&file]).expect("nbdkit");
    ok(&mkfs(&uri, &["-b", "1024"]), "lazy mkfs");
    drop(srv);
    let mut srv = nbdkit(dir.path(), slow, "file", &[&file, "delay-zero=50ms"]).expect("nbdkit");
    let mut child = ext4kit()
        .args(["lazyinit", "-q", &uri])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kill_after(&mut srv, &mut child, "Zero", 2);
    one_line_failure(&finish(child), &uri, "lazyinit, server killed");
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit");
    ok(&kit(&["lazyinit", "-q", &uri]), "lazyinit rerun");
    drop(srv);
    e2fsck_clean(&exported).unwrap();
}

/// The mount on an export: files written and fsynced, one removed with
/// `-o discard` (TRIM at commit), a kill -9 after a removal, then a
/// remount whose durable-discard reconciler trims what the kill lost;
/// e2fsck clean on the file behind the server.
#[test]
fn mount_over_nbd_writes_fsyncs_and_trims() {
    let name = "mount_over_nbd_writes_fsyncs_and_trims";
    if !have_nbdkit(name) {
        return;
    }
    if let Err(e) = fuse_available() {
        return skip(name, &e);
    }
    let dir = image_dir();
    let (exported, _plain) = files(dir.path(), 64 << 20, &[]);
    let file = format!("file={}", exported.display());
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit");
    ok(&mkfs(&srv.uri, &["-E", "nodiscard"]), "mkfs");
    let uri = PathBuf::from(&srv.uri);

    let m = FuseMount::new(&uri, &["discard"]).unwrap();
    let data = pattern(3 << 20, 7);
    for f in ["a", "b"] {
        use std::io::Write;
        let mut fh = std::fs::File::create(m.path().join(f)).unwrap();
        fh.write_all(&data).unwrap();
        fh.sync_all().unwrap();
    }
    assert!(srv.count("Flush") > 0, "fsync sent no FLUSH");
    let trims = srv.count("Trim");
    std::fs::remove_file(m.path().join("a")).unwrap();
    m.unmount().unwrap();
    assert!(srv.count("Trim") > trims, "rm with -o discard sent no TRIM");
    e2fsck_clean(&exported).unwrap();

    // Removed, then killed before the discard's commit: the next mount's
    // reconciler gives the blocks back.
    let m = FuseMount::new(&uri, &["discard", "commit=30"]).unwrap();
    std::fs::remove_file(m.path().join("b")).unwrap();
    let _ = run(ext4kit().arg("sync").arg(m.path()));
    m.kill9();
    let trims = srv.count("Trim");
    let m = FuseMount::new(&uri, &["discard"]).unwrap();
    assert!(!m.path().join("b").exists());
    m.unmount().unwrap();
    assert!(
        srv.count("Trim") > trims,
        "the reconciler sent no TRIM after the kill"
    );
    drop(srv);
    e2fsck_clean(&exported).unwrap();
}

/// Lazyinit of an 8 GiB image whose inode tables are left to it (mkfs
/// `-E nodiscard`), over nbdkit: the engine's block-by-block reads of
/// consecutive metadata go through the client's read-ahead window (a
/// few dozen requests, was ~245 one-block reads), the known-zero
/// questions are answered from one whole-device BLOCK_STATUS, and the image is
/// byte-identical to lazyinit on a copy of the file, e2fsck clean.
#[test]
fn lazyinit_over_nbd_reads_ahead() {
    let name = "lazyinit_over_nbd_reads_ahead";
    if !have_nbdkit(name) {
        return;
    }
    let dir = image_dir();
    // (One -E: the last counts.)
    let e = format!("hash_seed={SEED},nodiscard");
    let (exported, plain) = files(dir.path(), 8 << 30, &["-E", &e]);
    ok(&mkfs(exported.to_str().unwrap(), &["-E", &e]), "mkfs");
    let file = format!("file={}", exported.display());
    let srv = nbdkit(dir.path(), &[], "file", &[&file]).expect("nbdkit file");
    ok(&kit(&["lazyinit", "-q", &srv.uri]), "lazyinit over nbd");
    let log = std::fs::read_to_string(srv.log.as_ref().unwrap()).unwrap();
    drop(srv);
    ok(
        &kit(&["lazyinit", "-q", plain.to_str().unwrap()]),
        "lazyinit",
    );
    let reads = log.lines().filter(|l| l.contains(" Read id=")).count();
    assert!(reads <= 60, "{reads} read requests");
    // One whole-device BLOCK_STATUS (two slices of 4 GiB - 64 KiB, one
    // of 128 KiB) warms the known-zero cache: no question per group (was
    // two per group, 128).
    let status = log.lines().filter(|l| l.contains(" Extents id=")).count();
    assert!(status <= 4, "{status} BLOCK_STATUS requests");
    sparse_equal(&exported, &plain).unwrap();
    e2fsck_clean(&exported).unwrap();
}
