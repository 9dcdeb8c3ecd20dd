//! `ext4kit info` against `dumpe2fs -h` on the same images: identity,
//! state, features, counts, mount count and times, journal size, in the
//! text report and in `--json` (stable keys), values equal.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use serde_json::Value;

/// `dumpe2fs -h IMG` in UTC as "field" -> "value".
fn dumpe2fs_fields(img: &Path) -> HashMap<String, String> {
    let out = run_ok(tool("dumpe2fs").env("TZ", "UTC").arg("-h").arg(img)).unwrap();
    key_values(&String::from_utf8_lossy(&out.stdout))
}

/// "key:   value" lines (split at the first colon).
fn key_values(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `ext4kit info IMG` (text) and `ext4kit info --json IMG`.
fn info(img: &Path) -> (HashMap<String, String>, Value) {
    let out = run_ok(ext4kit().arg("info").arg(img)).unwrap();
    let text = key_values(&String::from_utf8_lossy(&out.stdout));
    let out = run_ok(ext4kit().args(["info", "--json"]).arg(img)).unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    (text, json)
}

fn debugfs_w(img: &Path, cmds: &[&str]) {
    for c in cmds {
        run_ok(tool("debugfs").args(["-w", "-R", c]).arg(img)).unwrap();
    }
}

fn num(d: &HashMap<String, String>, k: &str) -> i64 {
    d.get(k)
        .unwrap_or_else(|| panic!("dumpe2fs has no {k:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("dumpe2fs {k:?} is not a number: {:?}", d[k]))
}

/// Every value `info` shares with `dumpe2fs -h` is equal, in both forms.
fn compare(img: &Path) {
    let d = dumpe2fs_fields(img);
    let (t, j) = info(img);
    let get = |k: &str| {
        d.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("dumpe2fs: no {k:?}"))
    };
    let jstr = |k: &str| j[k].as_str().map(str::to_string);
    let ji = |k: &str| {
        j[k].as_i64()
            .unwrap_or_else(|| panic!("json {k:?}: {}", j[k]))
    };

    // Identity.
    assert_eq!(t["filesystem UUID"], get("Filesystem UUID"));
    assert_eq!(jstr("uuid").unwrap(), get("Filesystem UUID"));
    assert_eq!(t["volume name"], get("Filesystem volume name"));
    let label = get("Filesystem volume name");
    assert_eq!(jstr("label"), (label != "<none>").then_some(label));
    assert_eq!(t["last mounted on"], get("Last mounted on"));
    let lm = get("Last mounted on");
    assert_eq!(
        jstr("last_mounted_on"),
        (lm != "<not available>").then_some(lm)
    );
    // State.
    assert_eq!(t["state"], get("Filesystem state"));
    assert_eq!(jstr("state").unwrap(), get("Filesystem state"));
    assert_eq!(
        j["clean"].as_bool(),
        Some(!get("Filesystem state").starts_with("not"))
    );
    assert_eq!(
        j["has_errors"].as_bool(),
        Some(get("Filesystem state").ends_with("with errors"))
    );
    assert_eq!(t["errors behavior"], get("Errors behavior").to_lowercase());
    assert_eq!(
        jstr("errors_behavior").unwrap(),
        get("Errors behavior").to_lowercase()
    );
    // Features, in dumpe2fs's order.
    assert_eq!(t["features"], get("Filesystem features"));
    let jf: Vec<&str> = j["features"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(jf.join(" "), get("Filesystem features"));
    // Counts.
    let blocks = format!(
        "{} ({} free, {} reserved)",
        get("Block count"),
        get("Free blocks"),
        get("Reserved block count")
    );
    assert_eq!(t["blocks"], blocks);
    assert_eq!(ji("blocks_count"), num(&d, "Block count"));
    assert_eq!(ji("free_blocks"), num(&d, "Free blocks"));
    assert_eq!(ji("reserved_blocks"), num(&d, "Reserved block count"));
    assert_eq!(
        t["inodes"],
        format!("{} ({} free)", get("Inode count"), get("Free inodes"))
    );
    assert_eq!(ji("inodes_count"), num(&d, "Inode count"));
    assert_eq!(ji("free_inodes"), num(&d, "Free inodes"));
    assert_eq!(ji("block_size"), num(&d, "Block size"));
    // Mounts and times (ctime layout; dumpe2fs ran with TZ=UTC).
    assert_eq!(
        t["mount count"],
        format!(
            "{} (maximum {})",
            get("Mount count"),
            get("Maximum mount count")
        )
    );
    assert_eq!(ji("mount_count"), num(&d, "Mount count"));
    assert_eq!(ji("max_mount_count"), num(&d, "Maximum mount count"));
    for (ours, theirs) in [
        ("created", "Filesystem created"),
        ("last mount", "Last mount time"),
        ("last write", "Last write time"),
        ("last checked", "Last checked"),
    ] {
        let want = get(theirs);
        let want = if want == "n/a" {
            want
        } else {
            format!("{want} UTC")
        };
        assert_eq!(t[ours], want, "{ours}");
    }
    // Journal: size and blocks from the journal inode.
    match d.get("Total journal blocks") {
        Some(jb) => {
            let jb: u64 = jb.parse().unwrap();
            let bs = num(&d, "Block size") as u64;
            assert_eq!(j["journal_blocks"].as_u64(), Some(jb));
            assert_eq!(j["journal_bytes"].as_u64(), Some(jb * bs));
            assert_eq!(ji("journal_inode"), num(&d, "Journal inode"));
            assert_eq!(
                t["journal"],
                format!(
                    "{} ({jb} blocks, inode {})",
                    get("Total journal size"),
                    get("Journal inode")
                )
            );
        }
        None => {
            assert!(j["journal_bytes"].is_null());
            assert_eq!(t["journal"], "none");
        }
    }
}

fn have_tools(test: &str) -> bool {
    for t in ["dumpe2fs", "debugfs", "e2fsck"] {
        if !have(t) {
            skip(test, &format!("{t} not installed"));
            return false;
        }
    }
    true
}

fn mkfs(img: &Path, args: &[&str], mib: u64) {
    let mut c = ext4kit_mkfs(["-q", "-U", UUID, "-E"]);
    c.arg(format!("hash_seed={SEED}"))
        .args(args)
        .arg(img)
        .arg(format!("{mib}M"))
        .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
        .env("MKE2FS_CONFIG", "/nonexistent/mke2fs.conf");
    run_ok(&mut c).unwrap();
    e2fsck_clean(img).unwrap();
}

#[test]
fn fresh_filesystems_match_dumpe2fs() {
    if !have_tools("fresh_filesystems_match_dumpe2fs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Labelled ext4 with a 4 MiB journal (1 KiB blocks): "4096k".
    let a = dir.path().join("a.img");
    mkfs(&a, &["-L", "precious", "-t", "ext4"], 64);
    compare(&a);
    let (_, j) = info(&a);
    assert_eq!(j["created_time"].as_u64(), Some(FAKE_TIME.parse().unwrap()));
    assert!(j["last_mount_time"].is_null());
    // 4 KiB blocks, a journal of 64 MiB or more ("64M"), no label.
    let b = dir.path().join("b.img");
    mkfs(&b, &["-b", "4096"], 2048);
    compare(&b);
    // No journal.
    let c = dir.path().join("c.img");
    mkfs(&c, &["-O", "^has_journal"], 32);
    compare(&c);
}

#[test]
fn mounted_and_damaged_state_match_dumpe2fs() {
    if !have_tools("mounted_and_damaged_state_match_dumpe2fs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("m.img");
    mkfs(&img, &["-L", "data"], 32);
    // What a few mounts leave in the superblock.
    debugfs_w(
        &img,
        &[
            "ssv mnt_count 7",
            "ssv max_mnt_count 25",
            "ssv mtime @1700001234",
            "ssv lastcheck @1699990000",
            "ssv last_mounted /mnt/data",
            "ssv errors 2",
        ],
    );
    e2fsck_clean(&img).unwrap();
    compare(&img);
    let (t, j) = info(&img);
    assert_eq!(j["last_mount_time"].as_u64(), Some(1_700_001_234));
    // debugfs sets the write time itself when it closes.
    assert!(j["last_write_time"].as_u64().is_some());
    assert_eq!(j["last_check_time"].as_u64(), Some(1_699_990_000));
    assert_eq!(t["last mount"], "Tue Nov 14 22:33:54 2023 UTC");
    // Not cleanly unmounted, with errors recorded: e2fsck would (rightly)
    // complain about this one, so only info and dumpe2fs read it.
    debugfs_w(&img, &["ssv state 2"]);
    compare(&img);
    let (t, j) = info(&img);
    assert_eq!(t["state"], "not clean with errors");
    assert_eq!(j["clean"].as_bool(), Some(false));
    assert_eq!(j["has_errors"].as_bool(), Some(true));
}

/// `--json` keys are an interface: this is the whole set; adding one is
/// fine (add it here), renaming or dropping one breaks scripts.
#[test]
fn json_keys_are_stable() {
    if !have_tools("json_keys_are_stable") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("k.img");
    mkfs(&img, &[], 16);
    let (_, j) = info(&img);
    let mut keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = vec![
        "allocated_bytes",
        "block_size",
        "blocks_count",
        "blocks_per_group",
        "bytes_to_zero",
        "clean",
        "created_time",
        "desc_block_locations",
        "desc_blocks",
        "desc_checksum",
        "desc_size",
        "desc_table_block",
        "device",
        "error_count",
        "errors_behavior",
        "features",
        "first_error",
        "first_meta_bg",
        "free_blocks",
        "free_inodes",
        "groups",
        "groups_inconsistent",
        "groups_inode_uninit",
        "groups_not_zeroed",
        "has_errors",
        "inode_size",
        "inodes_count",
        "inodes_per_group",
        "itable_blocks_per_group",
        "journal_blocks",
        "journal_bytes",
        // An external journal's device number and UUID (session 19).
        "journal_device",
        "journal_inode",
        "journal_uuid",
        "label",
        "lazyinit_refusal",
        "last_check_time",
        "last_error",
        "last_mount_time",
        "last_mounted_on",
        "last_write_time",
        "max_mount_count",
        "mount_count",
        "needs_recovery",
        "reserved_blocks",
        "size",
        "state",
        "uuid",
    ];
    want.sort_unstable();
    assert_eq!(keys, want);
}

/// A superblock pointing its journal at an inode that does not exist: one
/// line naming the image and the inode, exit 1, no panic.
#[test]
fn bad_journal_inode_is_one_line() {
    if !have_tools("bad_journal_inode_is_one_line") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("j.img");
    mkfs(&img, &[], 16);
    // e2fsck would rightly complain after this; only info reads it.
    debugfs_w(&img, &["ssv journal_inum 999999"]);
    for json in [false, true] {
        let mut c = ext4kit();
        c.arg("info");
        if json {
            c.arg("--json");
        }
        let out = run(c.arg(&img)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&img.display().to_string()) && err.contains("999999"),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
}

/// dumpe2fs's primary descriptor blocks: the table after the primary
/// superblock ("Group descriptors at A-B" in group 0) and, with meta_bg,
/// "Group descriptor at X" of the first group of each meta group
/// (`dpb` groups each).
fn dumpe2fs_desc_blocks(img: &Path, dpb: u64) -> Vec<u64> {
    let text = dumpe2fs::dumpe2fs(img).unwrap();
    dumpe2fs::primary_desc_blocks(&dumpe2fs::groups(&text), dpb)
}

/// Issue 20: `info` opens meta_bg filesystems (it refused them): every
/// primary descriptor block where dumpe2fs finds it, from mke2fs and from
/// ext4kit mkfs, with 64- and 32-byte descriptors, `s_first_meta_bg` 0 and
/// 1 (`MKE2FS_FIRST_META_BG`), sparse_super2; the dumpe2fs -h fields
/// equal as for the other layouts, and the lazy-init counts shown.
#[test]
fn meta_bg_descriptor_locations_match_dumpe2fs() {
    if !have_tools("meta_bg_descriptor_locations_match_dumpe2fs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, u64, Option<&str>); 4] = [
        ("mb", "meta_bg,^resize_inode", 256, None),
        ("mb-32", "^64bit,meta_bg,^resize_inode", 320, None),
        ("mb-first1", "meta_bg,^resize_inode", 256, Some("1")),
        ("mb-ss2", "meta_bg,sparse_super2,^resize_inode", 256, None),
    ];
    for (name, feats, mib, first) in cases {
        for maker in ["mke2fs", "ext4kit"] {
            let label = format!("{name}-{maker}");
            let img = dir.path().join(format!("{label}.img"));
            run_ok(tool("truncate").args(["-s", &format!("{mib}M")]).arg(&img)).unwrap();
            let args = [
                "-q",
                "-F",
                "-t",
                "ext4",
                "-b",
                "1024",
                "-U",
                UUID,
                "-E",
                "nodiscard",
                "-O",
                feats,
            ];
            let mut c = if maker == "mke2fs" {
                mke2fs(args)
            } else {
                ext4kit_mkfs(args)
            };
            if let Some(f) = first {
                c.env("MKE2FS_FIRST_META_BG", f);
            }
            run_ok(c.arg(&img)).unwrap();
            e2fsck_clean(&img).unwrap_or_else(|e| panic!("{label}: {e}"));
            compare(&img);
            let (t, j) = info(&img);
            let dpb = 1024 / j["desc_size"].as_u64().unwrap();
            let want = dumpe2fs_desc_blocks(&img, dpb);
            let have: Vec<u64> = j["desc_block_locations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(have, want, "{label}: descriptor blocks");
            assert!(have.len() >= 2, "{label}: one meta group only");
            assert_eq!(
                j["first_meta_bg"].as_u64(),
                Some(first.map_or(0, |f| f.parse().unwrap())),
                "{label}"
            );
            assert!(
                t["group descriptors"].contains("in their meta groups"),
                "{label}: {t:?}"
            );
            assert!(j["lazyinit_refusal"].is_null(), "{label}: {j}");
        }
    }
}
