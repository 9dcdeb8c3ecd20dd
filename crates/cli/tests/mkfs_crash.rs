//! Power cuts during `mkfs`: the writer runs on a fault-injecting device
//! that drops every unflushed write and fails everything after the N-th
//! operation, for every N. Formatting over an old filesystem, each cut
//! must leave the old filesystem untouched, no recognizable ext4 (the old
//! superblock is gone and the new one not yet written), or the complete new
//! filesystem, which `e2fsck -fn` finds clean: never a new superblock in
//! front of missing tables. (The fault model loses all unflushed writes
//! together; it does not reorder them.)

mod common;

use std::sync::Arc;

use common::*;
use ext4kit::mkfs::{self, Env, MkfsOptions};
use ext4kit::profile::Profile;
use ext4kit_device::{Device, FaultControl, FaultDevice, MemDevice};

const SIZE: u64 = 64 * MIB;
const NEW_UUID: [u8; 16] = [
    0x0b, 0x7e, 0x3c, 0x52, 0x8f, 0x1d, 0x4a, 0x6e, 0x9c, 0x2b, 0x5d, 0x4f, 0x3e, 0x2a, 0x1b, 0x09,
];

fn has_ext4_magic(bytes: &[u8]) -> bool {
    bytes.len() > 1024 + 0x3A && bytes[1024 + 0x38..1024 + 0x3A] == [0x53, 0xEF]
}

#[test]
fn power_cut_at_every_write_of_mkfs() {
    const TEST: &str = "power_cut_at_every_write_of_mkfs";
    for t in ["mke2fs", "e2fsck"] {
        if !have(t) {
            return skip(TEST, &format!("{t} not found"));
        }
    }
    let dir = image_dir();
    // An old filesystem with a different layout (1 KiB blocks) fills the
    // target, so stale metadata is everywhere.
    let old = dir.path().join("old.img");
    sparse_file(&old, SIZE).unwrap();
    run_ok(
        mke2fs([
            "-F",
            "-q",
            "-t",
            "ext4",
            "-b",
            "1024",
            "-E",
            "lazy_itable_init=0,nodiscard",
        ])
        .arg(&old),
    )
    .unwrap();
    let old_bytes = std::fs::read(&old).unwrap();

    let opts = MkfsOptions {
        fs_type: Some("ext4".into()),
        uuid: Some("0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09".into()),
        extended: vec!["nodiscard,hash_seed=7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60".into()],
        ..MkfsOptions::default()
    };
    let env = Env {
        device_size: Some(SIZE),
        is_regular_file: false,
        logical_sector_size: 512,
        physical_sector_size: 512,
        io_hints: None,
        now: 1_700_000_000,
        page_size: 4096,
        uid: 0,
        gid: 0,
        kernel_lazy_itable_init: true,
    };
    let resolved = mkfs::resolve(&opts, &Profile::parse(DEBIAN_CONF).unwrap(), &env).unwrap();
    let prepared = mkfs::prepare(resolved, false).unwrap();

    // Count the operations of a full run.
    let total = {
        let mem = Arc::new(MemDevice::from_bytes(old_bytes.clone()));
        let ctl = FaultControl::new();
        let dev = FaultDevice::with_control(mem.clone(), ctl.clone());
        mkfs::execute(&dev, prepared.clone()).unwrap();
        ctl.ops()
    };
    assert!(total > 3, "only {total} operations");

    let img = dir.path().join("cut.img");
    let (mut untouched, mut none, mut clean) = (0, 0, 0);
    for k in 1..=total {
        let mem = Arc::new(MemDevice::from_bytes(old_bytes.clone()));
        let ctl = FaultControl::new();
        ctl.power_cut_after(k);
        let dev = FaultDevice::with_control(mem.clone(), ctl.clone());
        let _ = mkfs::execute(&dev as &dyn Device, prepared.clone());
        let bytes = mem.to_bytes();
        if bytes == old_bytes {
            untouched += 1;
            continue;
        }
        if !has_ext4_magic(&bytes) {
            none += 1;
            continue;
        }
        assert_eq!(
            &bytes[1024 + 0x68..1024 + 0x78],
            &NEW_UUID[..],
            "power cut after operation {k} of {total}: a superblock that is neither old nor new"
        );
        std::fs::write(&img, &bytes).unwrap();
        if let Err(e) = e2fsck_clean(&img) {
            panic!("power cut after operation {k} of {total}: {e}");
        }
        clean += 1;
    }
    eprintln!(
        "{total} cut points: {untouched} old filesystem untouched, {none} without a filesystem, {clean} new and clean"
    );
    assert!(clean >= 1, "the complete run must leave a filesystem");
}
