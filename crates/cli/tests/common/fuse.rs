//! `ext4kit mount` in tests: whether FUSE mounts can run here, a fresh
//! image for them, and a guard that mounts on a temporary directory and
//! always unmounts (also when a test fails).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// A fresh `ext4kit mkfs` image (4 KiB blocks, 256-byte inodes).
pub fn mkfs(dir: &Path, size: &str) -> PathBuf {
    let img = dir.join("fs.img");
    let _ = fs::remove_file(&img);
    run_ok(&mut ext4kit_mkfs([
        "-q",
        "-F",
        "-b",
        "4096",
        "-I",
        "256",
        "-U",
        UUID,
        "-E",
        "nodiscard",
        img.to_str().unwrap(),
        size,
    ]))
    .unwrap();
    img
}

/// Is a FUSE filesystem mounted on `dir`?
pub use super::is_fuse_mounted as is_mounted;

pub fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Result<(), String> {
    let t = Instant::now();
    while !ok() {
        if t.elapsed() > limit {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// An `ext4kit mount -f` on a temporary directory, unmounted (lazily if
/// it must) and its process reaped on drop, also when a test fails.
pub struct FuseMount {
    pub dir: Option<tempfile::TempDir>,
    pub child: Option<Child>,
    /// As root: `enable_uring` held on while the mount lives (the
    /// default transport uses FUSE over io_uring where the kernel offers
    /// it; kernels without the "can't be disabled once enabled on a
    /// connection" change refuse the ring commands of a live mount once
    /// the switch is N again, so it stays on until the mount is gone), back to what
    /// it was after the last mount of the test binary. Declared after
    /// `dir`, so dropped after the unmount.
    pub uring: Option<UringSwitch>,
}

/// The `-o` options `EXT4KIT_TEST_TRANSPORT` puts first on every mount
/// of a run: `fuser` (fuser's session), `ext4kit` (our own, on io_uring
/// where the kernel offers it: the default), `devfuse` (our own on
/// `/dev/fuse`: `nouring`). A test's own options come later and win.
pub fn test_transport_opts() -> Vec<String> {
    match std::env::var("EXT4KIT_TEST_TRANSPORT").as_deref() {
        Err(_) | Ok("") => Vec::new(),
        Ok("devfuse") => vec!["transport=ext4kit".into(), "nouring".into()],
        Ok(t) => vec![format!("transport={t}")],
    }
}

/// As root, the `enable_uring` switch held on for a mount (see
/// [`FuseMount::uring`]); None elsewhere (the mount then uses io_uring
/// only if the switch is already Y).
pub fn uring_for_mount() -> Option<UringSwitch> {
    if nix::unistd::geteuid().is_root() {
        UringSwitch::on().ok()
    } else {
        None
    }
}

impl FuseMount {
    /// `ext4kit mount -f [-o OPTS] IMG <tempdir>`, waiting until live.
    pub fn new(img: &Path, opts: &[&str]) -> Result<FuseMount, String> {
        Self::spawn(img, opts, None)
    }

    /// [`FuseMount::new`] with the daemon's stderr (its tracing output:
    /// `RUST_LOG` as set, else `warn`, which includes the engine's error
    /// lines) appended to the file `log`, kept for a failure's evidence.
    pub fn with_log(img: &Path, opts: &[&str], log: &Path) -> Result<FuseMount, String> {
        Self::spawn(img, opts, Some(log))
    }

    /// [`FuseMount::new`] with extra environment variables for the daemon.
    pub fn with_env(img: &Path, opts: &[&str], env: &[(&str, &str)]) -> Result<FuseMount, String> {
        Self::spawn_env(img, opts, None, env)
    }

    fn spawn(img: &Path, opts: &[&str], log: Option<&Path>) -> Result<FuseMount, String> {
        Self::spawn_env(img, opts, log, &[])
    }

    fn spawn_env(
        img: &Path,
        opts: &[&str],
        log: Option<&Path>,
        env: &[(&str, &str)],
    ) -> Result<FuseMount, String> {
        let dir = tempfile::Builder::new()
            .prefix("ext4kit-fuse.")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let mut c = ext4kit();
        c.arg("mount").arg("-f");
        c.envs(env.iter().copied());
        // EXT4KIT_TEST_TRANSPORT=fuser|ext4kit|devfuse: every mount of
        // the run on that FUSE session (its options given first, so a
        // test's own `transport=` or `uring` wins).
        for o in test_transport_opts() {
            c.arg("-o").arg(o);
        }
        let uring = uring_for_mount();
        for o in opts {
            c.arg("-o").arg(o);
        }
        c.arg(img).arg(dir.path());
        c.stdout(Stdio::null());
        match log {
            Some(log) => {
                let f = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .map_err(|e| format!("{}: {e}", log.display()))?;
                if std::env::var_os("RUST_LOG").is_none() {
                    c.env("RUST_LOG", "warn");
                }
                c.env("NO_COLOR", "1");
                c.stderr(f);
            }
            None => {
                c.stderr(Stdio::inherit());
            }
        }
        let child = c.spawn().map_err(|e| e.to_string())?;
        let mut m = FuseMount {
            dir: Some(dir),
            child: Some(child),
            uring,
        };
        let path = m.path().to_path_buf();
        let limit = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&path) {
            if let Some(st) = m.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                m.child = None;
                return Err(format!("ext4kit mount exited early: {st}"));
            }
            if Instant::now() > limit {
                return Err("the mount did not come up".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("mounted").path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `umount`, then the serving process must exit 0 (clean close).
    /// "target is busy" is retried for a while: a process elsewhere on the
    /// machine walking /tmp (find, du) may be inside the mount for a moment.
    pub fn unmount(mut self) -> Result<(), String> {
        let mut tries = 0;
        loop {
            match run_ok(tool("umount").arg(self.path())) {
                Ok(_) => break,
                Err(e) if e.contains("target is busy") && tries < 30 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
        self.wait_exit()
    }

    /// Wait for the serving process; it must exit 0.
    pub fn wait_exit(&mut self) -> Result<(), String> {
        let mut child = self.child.take().ok_or("no process")?;
        let t = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => return Err(format!("ext4kit mount exited with {st}")),
                Ok(None) if t.elapsed() > Duration::from_secs(120) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("ext4kit mount did not exit after the unmount".into());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// SIGKILL the serving process (a crash), then clear the dead mount.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            for i in 0..40 {
                if !is_mounted(dir.path()) {
                    break;
                }
                let mut c = tool("umount");
                if i >= 5 {
                    c.arg("-l");
                }
                let _ = c.arg(dir.path()).output();
                std::thread::sleep(Duration::from_millis(50));
            }
            if is_mounted(dir.path()) {
                eprintln!("warning: could not unmount {}", dir.path().display());
                std::mem::forget(dir);
            }
        }
        if let Some(mut c) = self.child.take() {
            let t = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The kernel's FUSE-over-io_uring switch.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Guards and the switch's value before the first.
static URING_SWITCH: std::sync::Mutex<(usize, Option<String>)> = std::sync::Mutex::new((0, None));

/// `-o uring` tests: while a guard lives, the kernel's `enable_uring` is
/// on (the mount would set it too, but then nobody set it back); after
/// the last guard it is what it was before the first.
pub struct UringSwitch(());

impl UringSwitch {
    /// Err: why FUSE over io_uring cannot be tested here.
    pub fn on() -> Result<UringSwitch, String> {
        let mut g = URING_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 == 0 {
            let was = fs::read_to_string(ENABLE_URING)
                .map_err(|_| format!("the kernel has no FUSE over io_uring ({ENABLE_URING})"))?;
            fs::write(ENABLE_URING, "Y").map_err(|e| format!("{ENABLE_URING}: {e}"))?;
            g.1 = Some(was.trim().to_string());
        }
        g.0 += 1;
        Ok(UringSwitch(()))
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        let mut g = URING_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
        g.0 -= 1;
        if g.0 == 0
            && let Some(was) = g.1.take()
        {
            let _ = fs::write(ENABLE_URING, was);
        }
    }
}

/// The mount daemon's io_uring ring threads (`ext4kit-uring-*`).
pub fn ring_threads(m: &FuseMount) -> usize {
    let Ok(tasks) = fs::read_dir(format!("/proc/{}/task", m.pid())) else {
        return 0;
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.starts_with("ext4kit-uring"))
        .count()
}
