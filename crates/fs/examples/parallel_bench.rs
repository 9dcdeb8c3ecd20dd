//! The parallel engine (issue 18) without FUSE: THREADS threads each
//! create FILES files of 16 KiB (four 4 KiB writes, each its own handle
//! with an allocation) in a directory of their own, on an image in DIR
//! (tmpfs is best: no device waits), then one commit. With `serial`,
//! every call runs under one mutex, which is about what the old
//! operations mutex did (it covered each handle, most of a call).
//! Prints calls per second.
//!
//! `cargo run --release -p ext4kit-fs --example parallel_bench [DIR] [THREADS] [FILES] [serial]`

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ext4kit_device::{Device, FileDevice, OpenOptions};
use ext4kit_format::inode::{S_IFDIR, S_IFREG};
use ext4kit_fs::fs::{Filesystem, NewInode};
use ext4kit_fs::rw::RwOptions;

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let threads: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(4);
    let files: u32 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let serial = args.get(4).is_some_and(|a| a == "serial");
    let img = dir.join(format!("parallel_bench.{}.img", std::process::id()));
    let st = Command::new("mke2fs")
        .args(["-F", "-q", "-t", "ext4", "-J", "size=128"])
        .arg(&img)
        .arg("2G")
        .status()
        .map_err(|e| format!("mke2fs: {e}"))?;
    if !st.success() {
        return Err("mke2fs failed".into());
    }
    let dev: Arc<dyn Device> =
        Arc::new(FileDevice::open(&img, OpenOptions::read_write()).map_err(|e| e.to_string())?);
    let fs = Filesystem::open(dev, RwOptions::default()).map_err(|e| e.to_string())?;
    let big = Mutex::new(());
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    let data = vec![0x5au8; 4096];
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (fs, big, spec, data) = (&fs, &big, &spec, &data);
            s.spawn(move || {
                let mut d = 0;
                let dspec = NewInode::new(S_IFDIR | 0o755, 0, 0);
                if let Ok((i, _)) = fs.mkdir(2, format!("t{t}").as_bytes(), &dspec) {
                    d = i.ino;
                }
                for k in 0..files {
                    let mut ino = 0;
                    {
                        let _g = serial.then(|| big.lock().unwrap_or_else(|e| e.into_inner()));
                        if let Ok((i, _)) = fs.create(d, format!("f{k}").as_bytes(), spec) {
                            ino = i.ino;
                        }
                    }
                    for b in 0..4u64 {
                        let _g = serial.then(|| big.lock().unwrap_or_else(|e| e.into_inner()));
                        let _ = fs.write_at(ino, b * 4096, data);
                    }
                }
            });
        }
    });
    fs.sync().map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    fs.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&img);
    let calls = f64::from(threads * files * 5);
    let _ = writeln!(
        std::io::stdout().lock(),
        "threads {threads}{}: {} calls in {secs:.2} s = {:.0} calls/s",
        if serial { " (serial)" } else { "" },
        threads * files * 5,
        calls / secs
    );
    Ok(())
}
