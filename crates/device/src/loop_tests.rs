//! Tests on a real loop device. They need root, `losetup`, `mke2fs` and
//! `mount`; without them they print why and return. They only ever touch
//! the loop device they attach themselves, and always detach it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::*;

const MIB: u64 = 1 << 20;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Run a command; `Err` with its stderr (or the spawn error) on failure.
fn run(cmd: &str, args: &[&str]) -> std::result::Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Detaches the loop device when dropped.
struct LoopGuard(String);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        if let Err(e) = run("losetup", &["-d", &self.0]) {
            eprintln!("cleanup: {e}");
        }
    }
}

/// Unmounts the directory when dropped (lazily if a plain unmount fails).
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let dir = self.0.to_string_lossy().into_owned();
        if let Err(e) = run("umount", &[&dir]) {
            eprintln!("cleanup: {e}; trying a lazy unmount");
            if let Err(e) = run("umount", &["-l", &dir]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

fn expect_mounted(r: Result<impl Sized>, mountpoint: &Path, what: &str) {
    match r {
        Err(DeviceError::Mounted { on: Some(on), .. }) => {
            assert_eq!(Path::new(&on), mountpoint, "{what}")
        }
        Err(e) => panic!("{what}: expected Mounted, got {e}"),
        Ok(_) => panic!("{what}: expected Mounted, got Ok"),
    }
}

#[test]
fn loop_device_mounted_refusal() {
    if !is_root() {
        eprintln!("skipping loop device test: not root");
        return;
    }
    if run("losetup", &["--version"]).is_err() {
        eprintln!("skipping loop device test: losetup is unavailable");
        return;
    }
    // Declared first so that it is removed last.
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    drop(FileDevice::create_sparse(&image, 64 * MIB).expect("create image"));
    let image_str = image.to_string_lossy().into_owned();

    let loopdev = match run("losetup", &["-f", "--show", &image_str]) {
        Ok(dev) if dev.starts_with("/dev/loop") => dev,
        Ok(other) => panic!("losetup printed {other:?}"),
        Err(e) => {
            eprintln!("skipping loop device test: cannot attach a loop device: {e}");
            return;
        }
    };
    let _loop_guard = LoopGuard(loopdev.clone());
    let loop_name = loopdev.trim_start_matches("/dev/").to_string();

    // The image is found behind the loop device, by identity.
    assert_eq!(
        loop_devices_backed_by(&image),
        vec![PathBuf::from(&loopdev)]
    );
    check_not_mounted(&image).expect("image not mounted yet");
    check_not_mounted(&loopdev).expect("loop device not mounted yet");
    // Load is read from the disk doing the I/O: a loop device leads to the
    // disk under its backing file.
    assert_eq!(backing_sysfs_dir(&loopdev), backing_sysfs_dir(&image));

    // Block device I/O on our own loop device.
    {
        let dev = BlockDevice::open(&loopdev, OpenOptions::read_write()).expect("open loop");
        assert_eq!(dev.size(), 64 * MIB);
        assert_eq!(dev.logical_block_size(), 512);
        assert_eq!(
            dev.sysfs_dir(),
            Some(Path::new("/sys/block").join(&loop_name))
        );
        assert!(dev.is_rotational().is_some());
        assert!(matches!(
            BlockDevice::open(&loopdev, OpenOptions::read_write()),
            Err(DeviceError::Busy { .. })
        ));

        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 250) as u8 + 1).collect();
        dev.write_at(&data, MIB + 100).expect("write");
        let mut back = vec![0u8; data.len()];
        dev.read_at(&mut back, MIB + 100).expect("read");
        assert_eq!(back, data);

        // Unaligned zeroout: edges written, middle zeroed by the kernel.
        dev.zeroout(MIB + 200, 8192).expect("zeroout");
        dev.read_at(&mut back, MIB + 100).expect("read");
        assert_eq!(back[..100], data[..100]);
        assert!(back[100..100 + 8192].iter().all(|&b| b == 0));
        assert_eq!(back[100 + 8192..], data[100 + 8192..]);

        let outcome = dev.discard(2 * MIB, MIB).expect("discard");
        assert!(
            matches!(
                outcome,
                DiscardOutcome::Discarded | DiscardOutcome::Unsupported
            ),
            "{outcome:?}"
        );
        dev.flush().expect("flush");
        let mut buf = [0u8; 16];
        assert!(matches!(
            dev.read_at(&mut buf, 64 * MIB - 8),
            Err(DeviceError::OutOfRange { .. })
        ));
        // A non-exclusive read-only open works beside the exclusive writer,
        // and refuses writes.
        drop(BlockDevice::open(&loopdev, OpenOptions::read_only()).expect("shared ro"));
        drop(dev);
        let ro = BlockDevice::open(&loopdev, OpenOptions::read_only()).expect("open ro");
        assert!(matches!(
            ro.write_at(&buf, 0),
            Err(DeviceError::ReadOnly { .. })
        ));
    }

    if let Err(e) = run("mke2fs", &["-q", "-F", "-t", "ext4", &loopdev]) {
        eprintln!("skipping the mounted part of the loop device test: {e}");
        return;
    }
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mnt = mnt.canonicalize().expect("canonicalize");
    let mnt_str = mnt.to_string_lossy().into_owned();
    if let Err(e) = run("mount", &["-t", "ext4", &loopdev, &mnt_str]) {
        eprintln!("skipping the mounted part of the loop device test: {e}");
        return;
    }
    let mount_guard = MountGuard(mnt.clone());

    expect_mounted(
        open_device(&loopdev, OpenOptions::read_write()),
        &mnt,
        "loop device",
    );
    expect_mounted(
        open_device(&image, OpenOptions::read_write()),
        &mnt,
        "backing file",
    );
    expect_mounted(check_not_mounted(&loopdev), &mnt, "check loop device");
    expect_mounted(check_not_mounted(&image), &mnt, "check backing file");
    // Even when opened without write access asked for exclusivity.
    expect_mounted(
        open_device(
            &image,
            OpenOptions {
                write: true,
                exclusive: false,
            },
        ),
        &mnt,
        "backing file, not exclusive",
    );
    // Reading a mounted device is allowed.
    let ro = open_device(&image, OpenOptions::read_only()).expect("read-only open");
    let mut magic = [0u8; 2];
    ro.read_at(&mut magic, 1024 + 0x38).expect("read magic");
    assert_eq!(magic, [0x53, 0xef]);
    drop(ro);
    // A file on the mounted filesystem leads, through our loop device, to
    // the disk under the image.
    let inner = mnt.join("f");
    std::fs::write(&inner, b"x").expect("write file");
    assert_eq!(backing_sysfs_dir(&inner), backing_sysfs_dir(&image));
    std::fs::remove_file(&inner).expect("rm");

    drop(mount_guard);
    check_not_mounted(&image).expect("image unmounted");
    let dev = open_device(&loopdev, OpenOptions::read_write()).expect("open after umount");
    assert_eq!(dev.size(), 64 * MIB);
}

/// A loop device with 4 KiB sectors reports them as its logical and
/// physical block size, and I/O hints no smaller than a sector (what
/// mke2fs's block size and stride choices read).
#[test]
fn loop_device_sector_sizes() {
    if !is_root() {
        eprintln!("skipping loop device test: not root");
        return;
    }
    if run("losetup", &["--version"]).is_err() {
        eprintln!("skipping loop device test: losetup is unavailable");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(8 * MIB))
        .expect("image");
    let image_str = image.to_string_lossy().into_owned();
    let loopdev = match run(
        "losetup",
        &["-f", "--show", "--sector-size", "4096", &image_str],
    ) {
        Ok(dev) if dev.starts_with("/dev/") => dev,
        Ok(other) => panic!("losetup printed {other:?}"),
        Err(e) => {
            eprintln!("skipping loop device test: cannot attach a 4 KiB-sector loop device: {e}");
            return;
        }
    };
    let _guard = LoopGuard(loopdev.clone());
    let dev = BlockDevice::open(&loopdev, OpenOptions::read_only()).expect("open");
    assert_eq!(dev.logical_block_size(), 4096);
    assert_eq!(dev.physical_block_size(), 4096);
    let hints = dev.io_hints().expect("a block device has hints");
    assert!(hints.min_io == 0 || hints.min_io >= 4096, "{hints:?}");
    assert_eq!(hints.alignment_offset, 0);
}
