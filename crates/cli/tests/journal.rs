//! `ext4kit journal dump|replay` against e2fsprogs: the oracle is byte
//! equality with `e2fsck -E journal_only -y` run on a copy of the same
//! image (bytes equal everywhere, the ext4 superblock compared without the
//! fields that record when and how much was written).
//!
//! Corpus: transactions written by debugfs (`jo`/`jw`/`jc`: several
//! transactions, revokes, an escaped block, an uncommitted tail) with
//! journal checksums v3, v2 and none; as root with loop devices, dirty
//! journals left by the kernel (a copy taken while mounted, a shutdown
//! without log flush, a wrapped 4 MiB log); and randomly corrupted logs,
//! which must never panic and either replay exactly like e2fsck or be
//! refused with one line and nothing written.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use ext4kit_format::superblock::Superblock;

// ---------------------------------------------------------------- helpers

fn e2fs_tools() -> Result<(), String> {
    for t in ["mke2fs", "e2fsck", "debugfs"] {
        if !have(t) {
            return Err(format!("{t} not found"));
        }
    }
    Ok(())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn sb_of(img: &Path) -> Superblock {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; 1024];
    fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut b, 1024)
        .unwrap();
    Superblock::parse(&b).unwrap()
}

const RECOVER: u32 = 0x4;

/// Replay `img` with ext4kit (on `dir/ours.img`) and with
/// `e2fsck -E journal_only -y` (on `dir/theirs.img`); both must succeed
/// and give the same bytes. Returns ext4kit's output line and the path of
/// its replayed image.
fn replay_like_e2fsck(img: &Path, dir: &Path) -> (String, PathBuf) {
    let ours = dir.join("ours.img");
    let theirs = dir.join("theirs.img");
    sparse_copy(img, &ours);
    sparse_copy(img, &theirs);
    let out = run(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
    assert!(
        out.status.success(),
        "ext4kit replay failed: {}",
        text(&out)
    );
    let e = run(tool("e2fsck")
        .args(["-E", "journal_only", "-y"])
        .arg(&theirs))
    .unwrap();
    assert!(
        e.status.code().is_some_and(|c| c <= 1),
        "e2fsck -E journal_only failed: {}",
        text(&e)
    );
    let (a, b) = (sb_of(&ours), sb_of(&theirs));
    assert_eq!(
        a.s_feature_incompat.get() & RECOVER,
        0,
        "needs_recovery left set"
    );
    assert_eq!(a.s_feature_incompat.get(), b.s_feature_incompat.get());
    assert_eq!(a.s_state.get(), b.s_state.get(), "superblock state");
    if a.s_feature_ro_compat.get() & 0x400 != 0 {
        assert!(a.checksum_ok(), "superblock checksum");
    }
    let (ma, mb) = (dir.join("ours.masked"), dir.join("theirs.masked"));
    sparse_copy(&ours, &ma);
    sparse_copy(&theirs, &mb);
    mask_superblock(&ma);
    mask_superblock(&mb);
    sparse_equal(&ma, &mb).unwrap_or_else(|e| panic!("replay differs from e2fsck's: {e}"));
    fs::remove_file(&ma).unwrap();
    fs::remove_file(&mb).unwrap();
    fs::remove_file(&theirs).unwrap();
    (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ours,
    )
}

/// After a crash replay the kernel and e2fsck leave the superblock's free
/// counts stale; `e2fsck -fn` must exit 0 and complain about nothing else.
fn e2fsck_clean_after_crash(img: &Path) -> Result<(), String> {
    let out = run(tool("e2fsck").arg("-fn").arg(img))?;
    let t = text(&out);
    if out.status.code() != Some(0) {
        return Err(format!("e2fsck -fn exit {}: {t}", out.status));
    }
    for line in t.lines() {
        let ok = line.starts_with("e2fsck ")
            || line.starts_with("Pass ")
            || line.starts_with("Free blocks count wrong (")
            || line.starts_with("Free inodes count wrong (")
            || line == "Fix? no"
            || line.is_empty()
            || line.contains(" files (");
        if !ok {
            return Err(format!("unexpected e2fsck line {line:?}:\n{t}"));
        }
    }
    Ok(())
}

fn mkfs(img: &Path, size: &str, args: &[&str]) {
    let _ = fs::remove_file(img);
    run_ok(tool("truncate").args(["-s", size]).arg(img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext4"]).args(args).arg(img)).unwrap();
}

fn debugfs_w(img: &Path, cmds: &str) {
    let f = img.with_extension("cmds");
    fs::write(&f, cmds).unwrap();
    let out = run_ok(tool("debugfs").arg("-w").arg("-f").arg(&f).arg(img)).unwrap();
    let t = text(&out);
    assert!(
        !t.contains("rror") && !t.contains("not open"),
        "debugfs: {t}"
    );
}

fn read_block(img: &Path, bs: u64, b: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut v = vec![0u8; bs as usize];
    fs::File::open(img)
        .unwrap()
        .read_exact_at(&mut v, b * bs)
        .unwrap();
    v
}

/// Which journal checksums a debugfs corpus image uses.
#[derive(Clone, Copy, Debug)]
enum Csum {
    V3,
    V2,
    None,
}

/// A 1 KiB-block image with five committed transactions and one left
/// uncommitted by debugfs: blocks 5000-5002 (tid 1), an escaped block 5003
/// (tid 2), a revoke of 5001 (tid 3), 5004 and 5001 again (tid 4, replayed:
/// newer than the revoke), a revoke of 5000 (tid 5: its tid-1 copy is not
/// replayed), and 5005 in an uncommitted tid 6 (not replayed).
fn debugfs_image(dir: &Path, csum: Csum, bs: u32) -> PathBuf {
    let img = dir.join(format!("debugfs-{csum:?}-{bs}.img"));
    let size = if bs == 1024 { "16M" } else { "64M" };
    mkfs(&img, size, &["-b", &bs.to_string()]);
    debugfs_transactions(&img, dir, csum, bs);
    img
}

/// The log block where the journal superblock lives, from debugfs.
fn journal_block(img: &Path, lblk: u64) -> u64 {
    let out = run_ok(
        tool("debugfs")
            .args(["-R", &format!("bmap <8> {lblk}")])
            .arg(img),
    )
    .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<u64>()
        .unwrap()
}

/// Change the journal superblock of `img` (block size `bs`) and store its
/// checksum again.
fn patch_jsb(img: &Path, bs: u64, f: impl FnOnce(&mut [u8])) {
    use ext4kit_format::checksum::jbd2;
    use std::os::unix::fs::FileExt;
    let at = journal_block(img, 0) * bs;
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut raw = vec![0u8; 1024];
    file.read_exact_at(&mut raw, at).unwrap();
    f(&mut raw);
    let c = jbd2::superblock(&raw);
    raw[0xFC..0x100].copy_from_slice(&c.to_be_bytes());
    file.write_all_at(&raw, at).unwrap();
}

/// The debugfs transactions of [`debugfs_image`], written into `img`.
fn debugfs_transactions(img: &Path, dir: &Path, csum: Csum, bs: u32) {
    let b = bs as usize;
    let pat: Vec<u8> = (0..3 * b).map(|i| ((i * 7 + 3) % 251) as u8).collect();
    fs::write(dir.join("pat"), &pat).unwrap();
    let mut esc = vec![0u8; b];
    esc[..4].copy_from_slice(&[0xc0, 0x3b, 0x39, 0x98]);
    esc[4..11].copy_from_slice(b"escaped");
    fs::write(dir.join("esc"), &esc).unwrap();
    fs::write(dir.join("pat2"), vec![b'B'; b]).unwrap();
    let jo = match csum {
        Csum::V3 => "jo -c",
        Csum::V2 => "jo -c -v 2",
        Csum::None => "jo",
    };
    let d = dir.display();
    debugfs_w(
        img,
        &format!(
            "{jo}\njw -b 5000,5001,5002 {d}/pat\njw -b 5003 {d}/esc\njw -r 5001\n\
             jw -b 5004,5001 {d}/pat\njw -r 5000\njw -b 5005 -c {d}/pat2\njc\n"
        ),
    );
}

/// Check the home blocks the debugfs transactions leave after replay.
fn check_debugfs_homes(ours: &Path, dir: &Path, bs: u32) {
    let b = u64::from(bs);
    let pat = fs::read(dir.join("pat")).unwrap();
    let bsz = bs as usize;
    assert_eq!(
        read_block(ours, b, 5000),
        vec![0u8; bsz],
        "revoked block written"
    );
    assert_eq!(
        read_block(ours, b, 5001),
        pat[bsz..2 * bsz],
        "newest copy of 5001"
    );
    assert_eq!(read_block(ours, b, 5002), pat[2 * bsz..], "5002");
    assert_eq!(
        read_block(ours, b, 5003)[..11],
        *b"\xc0\x3b\x39\x98escaped",
        "escape"
    );
    assert_eq!(read_block(ours, b, 5004), pat[..bsz], "5004");
    assert_eq!(
        read_block(ours, b, 5005),
        vec![0u8; bsz],
        "uncommitted block written"
    );
}

// ---------------------------------------------------------------- tests

#[test]
fn debugfs_transactions_replay_like_e2fsck() {
    if let Err(why) = e2fs_tools() {
        return skip("debugfs_transactions_replay_like_e2fsck", &why);
    }
    for (csum, bs) in [
        (Csum::V3, 1024),
        (Csum::V2, 1024),
        (Csum::None, 1024),
        (Csum::V3, 4096),
    ] {
        let dir = image_dir();
        let img = debugfs_image(dir.path(), csum, bs);
        let feature = match csum {
            Csum::V3 => "csum_v3",
            Csum::V2 => "csum_v2",
            Csum::None => "revoke 64bit\n",
        };
        let dump = run_ok(ext4kit().args(["journal", "dump"]).arg(&img)).unwrap();
        let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
        assert!(dump.contains(feature), "{csum:?}: {dump}");
        assert!(
            dump.contains("FS block 5003 logged at journal block 7 (flags 0x9)"),
            "{dump}"
        );
        assert!(dump.contains("Revoke FS block 5001"), "{dump}");
        assert!(dump.contains("End of log before transaction 6"), "{dump}");
        assert!(
            dump.contains("Replay: 5 transactions, 4 blocks (4 tags, 2 revoked by 2 revoke records), next sequence 7"),
            "{dump}"
        );

        let (line, ours) = replay_like_e2fsck(&img, dir.path());
        assert!(
            line.contains("replayed 5 transactions (1..6), 4 blocks, 2 revoked tags"),
            "{line}"
        );
        check_debugfs_homes(&ours, dir.path(), bs);
        e2fsck_clean(&ours).unwrap();
        // A second replay finds a clean journal and changes nothing.
        let before = file_hash(&ours).unwrap();
        let again = run_ok(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
        assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to replay"));
        assert_eq!(file_hash(&ours).unwrap(), before);
    }
}

/// Transaction ids that cross 2^32 (the revoke of tid 0xffffffff does not
/// hide tid 0's copy; tid 1's revoke hides tid 0xfffffffd's), a log that
/// starts in the second of three extents (1 KiB blocks, 64 MiB journal),
/// and an ext3 filesystem whose journal is block-mapped (indirect blocks).
#[test]
fn debugfs_tid_wrap_fragmented_and_block_mapped_journals() {
    if let Err(why) = e2fs_tools() {
        return skip(
            "debugfs_tid_wrap_fragmented_and_block_mapped_journals",
            &why,
        );
    }
    let dir = image_dir();
    let d = dir.path();
    // tid wrap.
    let img = d.join("tidwrap.img");
    mkfs(&img, "16M", &["-b", "1024"]);
    patch_jsb(&img, 1024, |j| {
        j[0x18..0x1C].copy_from_slice(&0xFFFF_FFFDu32.to_be_bytes())
    });
    debugfs_transactions(&img, d, Csum::V3, 1024);
    let dump = run_ok(ext4kit().args(["journal", "dump"]).arg(&img)).unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(
        dump.contains("Found sequence 0, descriptor block"),
        "{dump}"
    );
    assert!(dump.contains("End of log before transaction 2\n"), "{dump}");
    let (line, ours) = replay_like_e2fsck(&img, d);
    assert!(
        line.contains("5 transactions (4294967293..2), 4 blocks, 2 revoked"),
        "{line}"
    );
    assert!(line.contains("next transaction 3"), "{line}");
    check_debugfs_homes(&ours, d, 1024);
    e2fsck_clean(&ours).unwrap();

    // A fragmented journal; the log starts at log block 20000.
    let img = d.join("frag.img");
    mkfs(&img, "256M", &["-b", "1024", "-J", "size=64"]);
    let (b0, b1) = (journal_block(&img, 16383), journal_block(&img, 16384));
    assert_ne!(
        b0 + 1,
        b1,
        "the journal is contiguous; the test needs extents"
    );
    patch_jsb(&img, 1024, |j| {
        j[0x14..0x18].copy_from_slice(&20000u32.to_be_bytes())
    });
    debugfs_transactions(&img, d, Csum::V3, 1024);
    let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(&img)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["start"], 20000, "{v}");
    assert_eq!(v["transactions"], 5, "{v}");
    let (_, ours) = replay_like_e2fsck(&img, d);
    check_debugfs_homes(&ours, d, 1024);
    e2fsck_clean(&ours).unwrap();

    // ext3: block-mapped journal, no journal checksums.
    let img = d.join("ext3.img");
    let _ = fs::remove_file(&img);
    run_ok(tool("truncate").args(["-s", "16M"]).arg(&img)).unwrap();
    run_ok(mke2fs(["-q", "-F", "-t", "ext3", "-b", "1024"]).arg(&img)).unwrap();
    debugfs_transactions(&img, d, Csum::None, 1024);
    let (line, ours) = replay_like_e2fsck(&img, d);
    assert!(line.contains("replayed 5 transactions"), "{line}");
    check_debugfs_homes(&ours, d, 1024);
    e2fsck_clean(&ours).unwrap();
}

/// needs_recovery with an empty log: nothing to write, but like e2fsck the
/// flag is cleared and the journal's sequence moves on by one.
#[test]
fn needs_recovery_with_an_empty_log() {
    if let Err(why) = e2fs_tools() {
        return skip("needs_recovery_with_an_empty_log", &why);
    }
    let dir = image_dir();
    let img = dir.path().join("empty.img");
    mkfs(&img, "16M", &["-b", "1024"]);
    run_ok(
        tool("debugfs")
            .args(["-w", "-R", "feature needs_recovery"])
            .arg(&img),
    )
    .unwrap();
    let (line, ours) = replay_like_e2fsck(&img, dir.path());
    assert!(line.contains("replayed 0 transactions"), "{line}");
    assert!(line.contains("next transaction 2"), "{line}");
    e2fsck_clean(&ours).unwrap();
}

#[test]
fn dry_run_and_dump_write_nothing() {
    if let Err(why) = e2fs_tools() {
        return skip("dry_run_and_dump_write_nothing", &why);
    }
    let dir = image_dir();
    let img = debugfs_image(dir.path(), Csum::V3, 1024);
    let before = file_hash(&img).unwrap();
    let out = run_ok(ext4kit().args(["journal", "replay", "-n"]).arg(&img)).unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(line.contains("would replay 5 transactions"), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    let out = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(&img)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["needs_recovery"], true);
    assert_eq!(v["transactions"], 5);
    assert_eq!(v["replay_blocks"], 4);
    assert_eq!(v["revoked_tags"], 2);
    assert_eq!(v["next_sequence"], 7);
    assert!(v["error"].is_null());
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries[0]["type"], "descriptor");
    assert_eq!(entries[0]["tags"][2]["flags"], 0xa);
    assert!(
        entries
            .iter()
            .any(|e| e["type"] == "revoke" && e["blocks"][0] == 5001)
    );
    assert_eq!(
        file_hash(&img).unwrap(),
        before,
        "dump or -n wrote to the image"
    );
}

#[test]
fn refusals_are_one_line_and_write_nothing() {
    if let Err(why) = e2fs_tools() {
        return skip("refusals_are_one_line_and_write_nothing", &why);
    }
    let dir = image_dir();
    // No journal at all.
    let nj = dir.path().join("nojournal.img");
    mkfs(&nj, "8M", &["-O", "^has_journal"]);
    // A journal superblock with a broken checksum.
    let bad = debugfs_image(dir.path(), Csum::V3, 1024);
    let jsb = {
        let out = run_ok(tool("debugfs").args(["-R", "bmap <8> 0"]).arg(&bad)).unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&bad).unwrap();
        f.write_all_at(&[0x77], jsb * 1024 + 0x20).unwrap(); // s_errno
    }
    // (Fast-commit logs: kernel_fast_commit_logs_are_replayed_like_this.)
    for (img, want) in [
        (&nj, "has no journal"),
        (&bad, "corrupt journal superblock: checksum"),
        (&dir.path().join("missing.img"), "No such file"),
    ] {
        let before = file_hash(img).ok();
        for args in [&["journal", "replay"][..], &["journal", "dump"]] {
            let out = run(ext4kit().args(args).arg(img)).unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{args:?} {}: {}",
                img.display(),
                text(&out)
            );
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with("ext4kit: ") && err.contains(want), "{err}");
            assert!(err.contains(&*img.display().to_string()), "{err}");
        }
        assert_eq!(file_hash(img).ok(), before, "{} was written", img.display());
    }
}

fn fuzz_cases(default: u64) -> u64 {
    std::env::var("EXT4KIT_JOURNAL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Corrupt 1-4 random bytes of the journal superblock or the live log of
/// `base` (`bs`-byte blocks), `cases` times: ext4kit must never panic;
/// when it replays, e2fsck must replay to the same bytes; when it refuses,
/// it says so in one line and writes nothing. Returns (replayed, refused).
fn fuzz_campaign(base: &Path, dir: &Path, bs: u64, cases: u64, seed: u64) -> (u32, u32) {
    use std::os::unix::fs::FileExt;
    let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(base)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    let maxlen = v["maxlen"].as_u64().unwrap();
    let live = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["log_block"].as_u64().unwrap() + 2)
        .max()
        .unwrap()
        .min(maxlen);
    let phys: Vec<u64> = (0..live).map(|l| journal_block(base, l)).collect();
    let mut x: u64 = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut replayed, mut refused) = (0, 0);
    let img = dir.join("fuzz.img");
    let ours = dir.join("ours.img");
    let theirs = dir.join("theirs.img");
    for case in 0..cases {
        sparse_copy(base, &img);
        {
            let f = fs::OpenOptions::new().write(true).open(&img).unwrap();
            for _ in 0..1 + next() % 4 {
                // Mostly headers, tags and tails, where the decisions are.
                let l = (next() % live) as usize;
                let off = match next() % 3 {
                    0 => next() % 64,
                    1 => bs - 4 + next() % 4,
                    _ => next() % bs,
                };
                let v = (next() & 0xFF) as u8;
                f.write_all_at(&[v], phys[l] * bs + off).unwrap();
            }
        }
        sparse_copy(&img, &ours);
        sparse_copy(&img, &theirs);
        let out = run(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
        let t = text(&out);
        assert!(!t.contains("panicked"), "case {case}: {t}");
        match out.status.code() {
            Some(0) if !String::from_utf8_lossy(&out.stdout).contains("replayed") => {
                // A clean journal or a log the kernel would discard.
                sparse_equal(&ours, &img).unwrap_or_else(|d| panic!("case {case}: {d}: {t}"));
            }
            Some(0) => {
                let e = run(tool("timeout")
                    .args(["20", "e2fsck", "-E", "journal_only", "-y"])
                    .arg(&theirs))
                .unwrap();
                let et = text(&e);
                assert!(
                    e.status.code().is_some_and(|c| c <= 1) && et.contains("recovering journal"),
                    "case {case}: ext4kit replayed ({t}) but e2fsck did not: {et}"
                );
                let (a, b) = (sb_of(&ours), sb_of(&theirs));
                assert_eq!(a.s_state.get(), b.s_state.get(), "case {case}: state");
                assert_eq!(a.s_feature_incompat.get(), b.s_feature_incompat.get());
                mask_superblock(&ours);
                mask_superblock(&theirs);
                sparse_equal(&ours, &theirs)
                    .unwrap_or_else(|d| panic!("case {case}: differs from e2fsck: {d} ({t})"));
                replayed += 1;
            }
            Some(1) => {
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(err.lines().count(), 1, "case {case}: {err}");
                sparse_equal(&ours, &img)
                    .unwrap_or_else(|d| panic!("case {case}: refused but wrote: {d}"));
                refused += 1;
            }
            c => panic!("case {case}: exit {c:?}: {t}"),
        }
    }
    (replayed, refused)
}

/// Random corruption of debugfs-written logs (checksums v3, v2, none).
#[test]
fn corrupted_logs_never_panic_and_match_e2fsck_or_refuse() {
    if let Err(why) = e2fs_tools() {
        return skip(
            "corrupted_logs_never_panic_and_match_e2fsck_or_refuse",
            &why,
        );
    }
    let n = fuzz_cases(40);
    for (csum, cases, seed) in [
        (Csum::V3, n / 2, 0x9E37_79B9_7F4A_7C15),
        (Csum::V2, n / 4, 0x1234_5678_9ABC_DEF1),
        (Csum::None, n / 4, 0x0F0F_1234_4321_F0F1),
    ] {
        let dir = image_dir();
        let base = debugfs_image(dir.path(), csum, 1024);
        let (ok, no) = fuzz_campaign(&base, dir.path(), 1024, cases, seed);
        eprintln!("corrupted {csum:?} logs: {ok} replayed like e2fsck, {no} refused");
    }
}

// ------------------------------------------------ kernel-made journals

/// Root, loop devices, python3 (for the shutdown ioctl) and e2fsprogs.
fn kernel_ok() -> Result<(), String> {
    e2fs_tools()?;
    kernel_mount_available()?;
    if !have("python3") {
        return Err("python3 not found (needed for the EXT4_IOC_SHUTDOWN ioctl)".into());
    }
    Ok(())
}

/// fsync a path (file or directory).
fn fsync(p: &Path) {
    fs::File::open(p).unwrap().sync_all().unwrap();
}

/// The same shutdown without the fsync of the mount point first (a
/// directory fsync would commit the fast commits' transaction fully).
fn shutdown_nologflush_now(mnt: &Path) {
    run_ok(
        tool("python3")
            .arg("-c")
            .arg(
                "import os,fcntl,struct,sys; fd=os.open(sys.argv[1],os.O_RDONLY); \
         fcntl.ioctl(fd,0x8004587D,struct.pack('I',2))",
            )
            .arg(mnt),
    )
    .unwrap();
}

/// Restores `/proc/sys/vm/dirty_writeback_centisecs` on drop.
struct Writeback(String);

impl Writeback {
    fn off() -> Writeback {
        const P: &str = "/proc/sys/vm/dirty_writeback_centisecs";
        let old = fs::read_to_string(P).unwrap();
        fs::write(P, "0").unwrap();
        Writeback(old)
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/vm/dirty_writeback_centisecs", self.0.trim());
    }
}

fn check_kernel_image(img: &Path, dir: &Path, what: &str) {
    let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(img)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
    assert_eq!(v["needs_recovery"], true, "{what}: {v}");
    assert!(v["transactions"].as_u64().unwrap() >= 1, "{what}: {v}");
    assert!(v["error"].is_null(), "{what}: {v}");
    let (line, ours) = replay_like_e2fsck(img, dir);
    eprintln!("{what}: {line}");
    e2fsck_clean_after_crash(&ours).unwrap_or_else(|e| panic!("{what}: {e}"));
}

#[test]
fn kernel_dirty_journals_replay_like_e2fsck() {
    if let Err(why) = kernel_ok() {
        return skip("kernel_dirty_journals_replay_like_e2fsck", &why);
    }
    let dir = image_dir();
    let d = dir.path();

    // (a) Writeback off, fsync, copy the backing file while mounted: one
    // committed transaction, home blocks stale.
    {
        let base = d.join("base.img");
        mkfs(&base, "256M", &["-b", "4096"]);
        let lo = LoopDev::attach(&base).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        let copyimg = d.join("fsync-copy.img");
        {
            let _wb = Writeback::off();
            fs::create_dir(m.path().join("d")).unwrap();
            for i in 1..=200 {
                fs::write(m.path().join(format!("d/f{i}")), format!("x{i}\n")).unwrap();
            }
            fsync(&m.path().join("d/f200"));
            sparse_copy(&base, &copyimg);
        }
        m.unmount().unwrap();
        drop(lo);
        fs::remove_file(&base).unwrap();
        check_kernel_image(&copyimg, d, "fsync-copy");
        fs::remove_file(&copyimg).unwrap();
    }

    // (b) Shutdown without log flush after create/fsync/rm: several
    // transactions and a revoke block.
    {
        let img = d.join("shutdown.img");
        mkfs(&img, "64M", &["-b", "4096"]);
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        fs::create_dir(m.path().join("d")).unwrap();
        for i in 1..=400 {
            fs::write(m.path().join(format!("d/file-with-a-long-name-{i}")), b"").unwrap();
        }
        fsync(&m.path().join("d"));
        fs::remove_dir_all(m.path().join("d")).unwrap();
        shutdown_nologflush(m.path());
        m.unmount().unwrap();
        drop(lo);
        let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(&img)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
        assert!(
            v["entries"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["type"] == "revoke"),
            "no revoke block in the shutdown log: {v}"
        );
        check_kernel_image(&img, d, "shutdown");
        fs::remove_file(&img).unwrap();
    }

    // (c) A 4 MiB journal and many fsyncs: the live log wraps. Where the
    // kernel's tail is at the shutdown depends on when it last
    // checkpointed (timing, load), so a log that happens not to wrap is
    // made again with a different number of commits, up to 6 times.
    {
        let img = d.join("wrap.img");
        let mut wrapped = None;
        for attempt in 0..6u64 {
            let _ = fs::remove_file(&img);
            mkfs(&img, "256M", &["-b", "4096", "-J", "size=4"]);
            let lo = LoopDev::attach(&img).unwrap();
            let m = Mount::new(lo.path(), "ext4", None).unwrap();
            for i in 0..3000 + attempt * 137 {
                let p = m.path().join(format!("f{}", i % 300));
                fs::write(&p, vec![b'x'; (100 + i) as usize]).unwrap();
                fsync(&p);
            }
            shutdown_nologflush(m.path());
            m.unmount().unwrap();
            drop(lo);
            let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(&img)).unwrap();
            let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
            let entries = v["entries"].as_array().unwrap();
            let first = entries[0]["log_block"].as_u64().unwrap();
            let last = entries.last().unwrap()["log_block"].as_u64().unwrap();
            if last < first {
                wrapped = Some(attempt);
                break;
            }
            eprintln!("attempt {attempt}: the live log does not wrap (blocks {first}..{last})");
        }
        assert!(
            wrapped.is_some(),
            "the kernel's live log never wrapped in 6 attempts"
        );
        check_kernel_image(&img, d, "wrap");
    }
}

/// The shutdown recipe on other journal formats the kernel writes:
/// checksum v1 (`journal_checksum` without metadata_csum: crc32_be over
/// each transaction), v1 with async commits (data=journal: data blocks in
/// the log), 32-bit tags (no 64bit) and ext3's block-mapped journal.
#[test]
fn kernel_journal_formats_replay_like_e2fsck() {
    if let Err(why) = kernel_ok() {
        return skip("kernel_journal_formats_replay_like_e2fsck", &why);
    }
    let dir = image_dir();
    let d = dir.path();
    for (what, fstype, mkfs_args, opts, feature) in [
        (
            "v1",
            "ext4",
            "^metadata_csum",
            "journal_checksum",
            "checksum",
        ),
        (
            "v1-async",
            "ext4",
            "^metadata_csum",
            "journal_async_commit,data=journal",
            "async_commit",
        ),
        ("32bit-v3", "ext4", "^64bit", "", "csum_v3"),
        ("ext3", "ext3", "", "", "revoke"),
    ] {
        let img = d.join(format!("{what}.img"));
        let _ = fs::remove_file(&img);
        run_ok(tool("truncate").args(["-s", "16M"]).arg(&img)).unwrap();
        let mut mk = mke2fs(["-q", "-F", "-t", fstype, "-b", "1024"]);
        if !mkfs_args.is_empty() {
            mk.args(["-O", mkfs_args]);
        }
        run_ok(mk.arg(&img)).unwrap();
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", (!opts.is_empty()).then_some(opts)).unwrap();
        fs::create_dir(m.path().join("d")).unwrap();
        for i in 1..=300 {
            fs::write(
                m.path().join(format!("d/file-long-name-{i}")),
                format!("{i}\n"),
            )
            .unwrap();
        }
        fsync(&m.path().join("d"));
        fs::remove_dir_all(m.path().join("d")).unwrap();
        fs::write(m.path().join("last"), vec![7u8; 5000]).unwrap();
        fsync(&m.path().join("last"));
        shutdown_nologflush(m.path());
        m.unmount().unwrap();
        drop(lo);
        let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(&img)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&j.stdout).unwrap();
        assert!(
            v["features"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == feature),
            "{what}: {}",
            v["features"]
        );
        check_kernel_image(&img, d, what);
        if what.starts_with("v1") {
            // Corruptions of a kernel v1 log (crc32_be over transactions).
            let (ok, no) = fuzz_campaign(&img, d, 1024, fuzz_cases(40) / 4, 0x5DEE_CE66_D1CE_4E5B);
            eprintln!("corrupted kernel {what} logs: {ok} replayed like e2fsck, {no} refused");
        }
        fs::remove_file(&img).unwrap();
    }
}

/// The replay refuses an image another program holds (flock).
#[test]
fn replay_refuses_a_busy_image() {
    if let Err(why) = e2fs_tools() {
        return skip("replay_refuses_a_busy_image", &why);
    }
    let dir = image_dir();
    let img = debugfs_image(dir.path(), Csum::V3, 1024);
    let before = file_hash(&img).unwrap();
    let held =
        ext4kit_device::FileDevice::open(&img, ext4kit_device::OpenOptions::read_write()).unwrap();
    let out = run(ext4kit().args(["journal", "replay"]).arg(&img)).unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(err.contains("in use by another program"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    drop(held);
    assert_eq!(file_hash(&img).unwrap(), before);
}

/// The replay refuses an image whose loop device is mounted.
#[test]
fn replay_refuses_a_mounted_image() {
    if let Err(why) = kernel_ok() {
        return skip("replay_refuses_a_mounted_image", &why);
    }
    let dir = image_dir();
    let img = dir.path().join("m.img");
    mkfs(&img, "32M", &["-b", "4096"]);
    let lo = LoopDev::attach(&img).unwrap();
    let m = Mount::new(lo.path(), "ext4", None).unwrap();
    for target in [img.as_path(), lo.path()] {
        let out = run(ext4kit().args(["journal", "replay"]).arg(target)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(err.contains("is mounted"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    m.unmount().unwrap();
}

// ------------------------------------------------------- fast commits

/// `ext4kit journal dump --json` of an image.
fn dump_json(img: &Path) -> serde_json::Value {
    let j = run_ok(ext4kit().args(["journal", "dump", "--json"]).arg(img)).unwrap();
    serde_json::from_slice(&j.stdout).unwrap()
}

/// `ext4kit cat IMG:PATH` bytes.
fn cat(img: &Path, path: &str) -> Vec<u8> {
    run_ok(
        ext4kit()
            .arg("cat")
            .arg(format!("{}:{path}", img.display())),
    )
    .unwrap()
    .stdout
}

/// The kernel leaves fast commits in the log (fast_commit, files created,
/// written and fsync'd, then a shutdown without log flush): ext4kit finds
/// them, `journal replay -n` writes nothing, and `journal replay`, a
/// write through the tools (`cp`) and the FUSE mount replay them: the fsync'd files are
/// there, `e2fsck -fn` is clean. The two other replayers, `e2fsck -fy`
/// and the kernel's mount, agree with each other and with ext4kit; reads
/// before the replay see the full commits' state.
#[test]
fn kernel_fast_commit_logs_are_replayed_like_this() {
    if let Err(why) = kernel_ok() {
        return skip("kernel_fast_commit_logs_are_replayed_like_this", &why);
    }
    let dir = image_dir();
    let d = dir.path();
    let img = d.join("fc.img");
    let files: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|i| (format!("/d/f{i}"), pattern(1000 * (i as usize + 1) + 17, i)))
        .collect();
    // commit=60 keeps the timer's full commit away; a full commit the
    // kernel makes anyway (memory or log pressure on a loaded machine)
    // turns the fast commits stale: then the image is made again.
    let mut v = serde_json::Value::Null;
    for attempt in 0..4 {
        mkfs(&img, "64M", &["-b", "4096", "-O", "fast_commit"]);
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", Some("commit=60")).unwrap();
        fs::create_dir(m.path().join("d")).unwrap();
        run_ok(tool("sync").arg("-f").arg(m.path())).unwrap();
        for (p, data) in &files {
            let p = m.path().join(&p[1..]);
            fs::write(&p, data).unwrap();
            fsync(&p);
        }
        shutdown_nologflush_now(m.path());
        m.unmount().unwrap();
        drop(lo);
        v = dump_json(&img);
        if v["fast_commit"]["state"] == "valid" {
            break;
        }
        eprintln!("attempt {attempt}: no fast commits to replay: {v}");
    }
    assert_eq!(v["needs_recovery"], true, "{v}");
    assert_eq!(v["fc_blocks"], 16, "{v}");
    let fc = &v["fast_commit"];
    assert_eq!(fc["state"], "valid", "no fast commits in the log: {v}");
    assert_eq!(fc["tid"], v["end_tid"], "{v}");
    for tag in ["HEAD", "TAIL", "INODE", "CREAT_DENTRY", "ADD_RANGE"] {
        assert!(fc["per_tag"][tag].as_u64().unwrap_or(0) >= 1, "{tag}: {v}");
    }
    // The decoded records say what the kernel did: every file has its
    // CREAT_DENTRY under /d, its last INODE record carries its size and a
    // regular mode, and its ADD_RANGEs cover its blocks.
    let recs = v["fast_commit_records"].as_array().expect("records");
    assert_eq!(recs.len() as u64, fc["tags"].as_u64().unwrap(), "{v}");
    let mut parents = std::collections::BTreeSet::new();
    for (p, data) in &files {
        let name = p.rsplit('/').next().unwrap();
        let c = recs
            .iter()
            .find(|r| r["tag"] == "CREAT_DENTRY" && r["name"] == name)
            .unwrap_or_else(|| panic!("no CREAT_DENTRY of {name}: {v}"));
        parents.insert(c["parent"].as_u64().unwrap());
        let ino = &c["ino"];
        let inode = recs
            .iter()
            .rev()
            .find(|r| r["tag"] == "INODE" && r["ino"] == *ino)
            .unwrap_or_else(|| panic!("no INODE of {name}: {v}"));
        assert_eq!(inode["size"], data.len() as u64, "{name}: {inode}");
        assert_eq!(inode["mode"].as_u64().unwrap() & 0o170000, 0o100000);
        assert_eq!(inode["links"], 1, "{inode}");
        let mapped: u64 = recs
            .iter()
            .filter(|r| r["tag"] == "ADD_RANGE" && r["ino"] == *ino)
            .map(|r| r["len"].as_u64().unwrap())
            .sum();
        assert!(mapped >= (data.len() as u64).div_ceil(4096), "{name}: {v}");
    }
    assert_eq!(parents.len(), 1, "one parent directory: {v}");
    assert_eq!(recs[0]["tag"], "HEAD");
    assert_eq!(recs[recs.len() - 1]["tag"], "TAIL");
    let s = img.display().to_string();
    let before = file_hash(&img).unwrap();
    let out = run_ok(ext4kit().args(["journal", "replay", "-n", &s])).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("and its fast commits"),
        "{}",
        text(&out)
    );
    assert_eq!(file_hash(&img).unwrap(), before, "replay -n wrote");
    // ext4kit's replay: `journal replay`, and a write through a tool.
    let ours = d.join("ours.img");
    sparse_copy(&img, &ours);
    run_ok(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
    e2fsck_clean(&ours).unwrap();
    assert_eq!(dump_json(&ours)["needs_recovery"], false);
    let by_cp = d.join("cp.img");
    sparse_copy(&img, &by_cp);
    let host = d.join("host");
    fs::write(&host, b"host file\n").unwrap();
    run_ok(
        ext4kit()
            .arg("cp")
            .arg(&host)
            .arg(format!("{}:/d/f0", by_cp.display())),
    )
    .unwrap();
    e2fsck_clean(&by_cp).unwrap();
    assert_eq!(cat(&by_cp, "/d/f0"), b"host file\n");
    for (p, data) in &files[1..] {
        assert!(cat(&by_cp, p) == *data, "{p}: after cp's replay");
    }
    // The FUSE mount replays them too (its rw open).
    match fuse_available() {
        Err(why) => eprintln!("skipping the FUSE mount of an fc image: {why}"),
        Ok(()) => {
            let by_mount = d.join("mount.img");
            sparse_copy(&img, &by_mount);
            let m = common::fuse::FuseMount::new(&by_mount, &[]).unwrap();
            for (p, data) in &files {
                assert!(
                    fs::read(m.path().join(&p[1..])).unwrap() == *data,
                    "{p}: through the mount"
                );
            }
            m.unmount().unwrap();
            e2fsck_clean(&by_mount).unwrap();
        }
    }
    // Read-only: the replayed state, computed in memory (nothing
    // written).
    let ls = run_ok(ext4kit().arg("ls").arg(format!("{s}:/"))).unwrap();
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains('d'),
        "{}",
        text(&ls)
    );
    for (p, data) in &files {
        assert!(cat(&img, p) == *data, "{p}: read-only, before the replay");
    }
    assert_eq!(file_hash(&img).unwrap(), before, "reads wrote");

    // The oracles: e2fsck -fy and the kernel's replay, on copies.
    let by_fsck = d.join("fsck.img");
    sparse_copy(&img, &by_fsck);
    let e = run(tool("e2fsck").arg("-fy").arg(&by_fsck)).unwrap();
    assert!(
        e.status.code().is_some_and(|c| c <= 1),
        "e2fsck -fy: {}",
        text(&e)
    );
    e2fsck_clean(&by_fsck).unwrap();
    let twin = KernelTwin::new(&img, d.join("kernel.img"), None).unwrap();
    let mut seen = Vec::new();
    for (p, _) in &files {
        seen.push(fs::read(twin.path().join(&p[1..])).unwrap());
    }
    twin.unmount().unwrap();
    let by_kernel = d.join("kernel.img");
    e2fsck_clean(&by_kernel).unwrap();
    for ((p, data), kernel) in files.iter().zip(&seen) {
        assert!(
            kernel == data,
            "{p}: the kernel's replay lost the fsync'd bytes"
        );
        assert!(
            cat(&by_fsck, p) == *data,
            "{p}: e2fsck's replay as ext4kit reads it"
        );
        assert!(
            cat(&by_kernel, p) == *data,
            "{p}: the kernel's replay as ext4kit reads it"
        );
        assert!(cat(&ours, p) == *data, "{p}: ext4kit's replay");
    }
    let list = |img: &Path| {
        let out = run_ok(ext4kit().arg("ls").arg(format!("{}:/d", img.display()))).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(list(&by_fsck), list(&by_kernel));
    assert_eq!(list(&ours), list(&by_kernel));
    // A full transaction of the fast commits' tid after the last full
    // commit (how ext4kit makes a replay durable, fast_commit::
    // commit_as_full; empty here) is one the kernel replays: the fast
    // commits are then stale to it as to us, the fsync'd files are not
    // there, the directory is, e2fsck -fn is clean after its mount.
    let sealed = d.join("sealed.img");
    sparse_copy(&img, &sealed);
    {
        use ext4kit_device::{FileDevice, OpenOptions};
        use ext4kit_fs::journal::{fast_commit, recover};
        let dev = FileDevice::open(&sealed, OpenOptions::read_write()).unwrap();
        let j = recover::Journal::open(&dev).unwrap();
        let rec = recover::recover(&dev, &j).unwrap();
        let n = fast_commit::commit_as_full(&dev, &j, &rec, &Default::default()).unwrap();
        assert_eq!(n, 1, "a commit block alone");
    }
    let after = dump_json(&sealed);
    assert_eq!(after["fast_commit"]["state"], "empty", "{after}");
    assert_eq!(
        after["end_tid"].as_u64(),
        v["end_tid"].as_u64().map(|t| t + 1),
        "{after}"
    );
    let twin = KernelTwin::new(&sealed, d.join("sealed-kernel.img"), None).unwrap();
    assert!(twin.path().join("d").is_dir());
    for (p, _) in &files {
        assert!(!twin.path().join(&p[1..]).exists(), "{p}");
    }
    twin.unmount().unwrap();
    e2fsck_clean(&d.join("sealed-kernel.img")).unwrap();

    // After the oracles' replay the fast commits are history: ext4kit
    // writes the kernel's result, which stays clean.
    run_ok(
        ext4kit()
            .arg("mkdir")
            .arg(format!("{}:/after", by_kernel.display())),
    )
    .unwrap();
    e2fsck_clean(&by_kernel).unwrap();
}

/// Python run on a kernel mount (`d`: the mount point) to leave fast
/// commits behind: `w(path, data, mode)` writes and fsyncs, `fs(path)`
/// fsyncs.
const FC_PRELUDE: &str = "import os,sys,ctypes\nd=sys.argv[1]\n\
def fs(p):\n    fd=os.open(p,os.O_RDONLY); os.fsync(fd); os.close(fd)\n\
def w(p,data,mode='wb'):\n    f=open(d+p,mode); f.write(data); f.flush(); os.fsync(f.fileno()); f.close()\n";

/// A kernel image with a valid fast-commit log: mkfs with fast_commit,
/// `/d` with two files made by a full commit, then `workload` (Python,
/// see [`FC_PRELUDE`]) and a shutdown without log flush. A full commit
/// the kernel makes anyway (a loaded machine) can turn the fast commits
/// stale: the image is then made again.
fn fc_image(img: &Path, workload: &str) -> serde_json::Value {
    fc_image_with(img, "64M", "4096", workload)
}

/// [`fc_image`] of `size` with blocks of `bs` bytes.
fn fc_image_with(img: &Path, size: &str, bs: &str, workload: &str) -> serde_json::Value {
    let mut v = serde_json::Value::Null;
    for attempt in 0..4 {
        mkfs(img, size, &["-b", bs, "-O", "fast_commit"]);
        let lo = LoopDev::attach(img).unwrap();
        let m = Mount::new(lo.path(), "ext4", Some("commit=60")).unwrap();
        fs::create_dir(m.path().join("d")).unwrap();
        fs::write(m.path().join("d/keep"), pattern(6000, 1)).unwrap();
        fs::write(m.path().join("d/other"), pattern(300, 2)).unwrap();
        run_ok(tool("sync").arg("-f").arg(m.path())).unwrap();
        run_ok(
            tool("python3")
                .arg("-c")
                .arg(format!("{FC_PRELUDE}{workload}"))
                .arg(m.path()),
        )
        .unwrap();
        shutdown_nologflush_now(m.path());
        m.unmount().unwrap();
        drop(lo);
        v = dump_json(img);
        if v["fast_commit"]["state"] == "valid" {
            return v;
        }
        eprintln!("attempt {attempt}: no fast commits to replay: {v}");
    }
    panic!("no fast commits in the log: {v}");
}

/// Everything under `root` (a mount): path -> (kind and mode, size, link
/// count, content hash).
fn tree(root: &Path) -> std::collections::BTreeMap<String, (u32, u64, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    fn walk(
        root: &Path,
        dir: &Path,
        out: &mut std::collections::BTreeMap<String, (u32, u64, u64, u64)>,
    ) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let hash = if md.is_file() {
                file_hash(&p).unwrap().0
            } else {
                0
            };
            let size = if md.is_dir() { 0 } else { md.size() };
            out.insert(rel, (md.mode(), size, md.nlink(), hash));
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The tree the kernel's mount (its own replay) shows for `img`.
fn kernel_tree(
    img: &Path,
    copy: PathBuf,
) -> std::collections::BTreeMap<String, (u32, u64, u64, u64)> {
    let twin = KernelTwin::new(img, copy, None).unwrap();
    let t = tree(twin.path());
    twin.unmount().unwrap();
    t
}

/// Kernel fast-commit logs of every kind the kernel writes (new files,
/// appends, overwrites, truncates, preallocation, punched holes, a file
/// of many extents, hard links, renames, several fast commits, fast
/// commits after a full commit): ext4kit's replay (`journal replay`)
/// ends in the tree the kernel's own replay of a copy gives (names, modes,
/// sizes, link counts, contents), e2fsck -fn is clean, and the kernel
/// mounts ext4kit's result.
#[test]
fn kernel_fast_commit_workloads_replay_to_the_kernels_tree() {
    let name = "kernel_fast_commit_workloads_replay_to_the_kernels_tree";
    if let Err(why) = kernel_ok() {
        return skip(name, &why);
    }
    let dir = image_dir();
    let d = dir.path();
    let cases: &[(&str, &str)] = &[
        (
            "creates and appends",
            "w('/d/new', b'a'*5000)\nw('/d/keep', b'b'*9000, 'ab')\nw('/d/empty', b'')\n\
             for i in range(20):\n    w('/d/n%d' % i, bytes([65+i])*(100+i*700))\n",
        ),
        (
            "truncates, preallocation and holes",
            "w('/d/big', b'c'*40000)\nos.truncate(d+'/d/big', 10000); fs(d+'/d/big')\n\
             os.truncate(d+'/d/keep', 100); fs(d+'/d/keep')\n\
             fd=os.open(d+'/d/pre', os.O_WRONLY|os.O_CREAT, 0o644)\n\
             os.posix_fallocate(fd, 0, 65536); os.pwrite(fd, b'z'*5000, 8192); os.fsync(fd); os.close(fd)\n\
             fd=os.open(d+'/d/hole', os.O_RDWR|os.O_CREAT, 0o644)\nos.write(fd, b'h'*40960); os.fsync(fd)\n\
             ctypes.CDLL(None).fallocate(fd, 3, ctypes.c_long(8192), ctypes.c_long(12288)); os.fsync(fd); os.close(fd)\n\
             w('/d/other', b'o'*100, 'r+b')\n",
        ),
        (
            "many extents",
            "fd=os.open(d+'/d/frag', os.O_WRONLY|os.O_CREAT, 0o644)\n\
             for i in range(0, 60, 2):\n    os.pwrite(fd, bytes([i])*4096, i*4096); os.fsync(fd)\n\
             os.close(fd)\n",
        ),
        (
            "links and renames",
            "w('/d/x', b'x'*100)\nos.link(d+'/d/x', d+'/d/x2'); fs(d+'/d/x')\n\
             os.rename(d+'/d/x2', d+'/d/y'); fs(d+'/d/y')\nos.rename(d+'/d/keep', d+'/d/kept'); fs(d+'/d/kept')\n\
             os.link(d+'/d/other', d+'/d/o2'); fs(d+'/d/other')\nos.unlink(d+'/d/o2'); fs(d+'/d/other')\n",
        ),
        (
            "fast commits after a full commit",
            "w('/d/before', b'1'*3000)\nos.sync()\nw('/d/after', b'2'*7000)\nw('/d/before', b'3'*5000, 'ab')\n\
             w('/d/keep', b'4'*10, 'ab')\n",
        ),
    ];
    let big = "for i in range(10):\n    w('/d/f%d' % i, bytes([65+i])*(3000*i+10))\n\
               w('/d/big', b'q'*3000000)\nw('/d/keep', b'k'*70000, 'ab')\n";
    let cases = cases
        .iter()
        .map(|&(what, wl)| (what, "64M", "4096", wl))
        .chain([("1 KiB blocks, a file across groups", "256M", "1024", big)]);
    for (i, (what, size, bs, workload)) in cases.enumerate() {
        let img = d.join(format!("w{i}.img"));
        let v = fc_image_with(&img, size, bs, workload);
        eprintln!("{what}: {}", v["fast_commit"]);
        let want = kernel_tree(&img, d.join("kernel.img"));
        let ours = d.join("ours.img");
        sparse_copy(&img, &ours);
        let out = run_ok(ext4kit().args(["journal", "replay"]).arg(&ours))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        eprintln!("{what}: {}", text(&out).trim());
        e2fsck_clean(&ours).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = kernel_tree(&ours, d.join("ours-mounted.img"));
        assert_eq!(got, want, "{what}: ext4kit's replay vs the kernel's");
        // The transaction ext4kit commits the replay as (before applying
        // it) is one the kernel's recovery replays to the same tree.
        let sealed = d.join("sealed.img");
        sparse_copy(&img, &sealed);
        {
            use ext4kit_device::{FileDevice, OpenOptions};
            use ext4kit_fs::journal::recover;
            let dev = FileDevice::open(&sealed, OpenOptions::read_write()).unwrap();
            let j = recover::Journal::open(&dev).unwrap();
            let rec = recover::recover(&dev, &j).unwrap();
            let again = recover::replay_fast_commits(&dev, &j, &rec).unwrap();
            assert_eq!(again.transactions(), rec.transactions() + 1, "{what}");
        }
        let got = kernel_tree(&sealed, d.join("sealed-mounted.img"));
        assert_eq!(
            got, want,
            "{what}: the kernel's recovery of ext4kit's transaction"
        );
        e2fsck_clean(&d.join("sealed-mounted.img")).unwrap_or_else(|e| panic!("{what}: {e}"));
        for f in [
            img,
            ours,
            sealed,
            d.join("kernel.img"),
            d.join("ours-mounted.img"),
            d.join("sealed-mounted.img"),
        ] {
            let _ = fs::remove_file(f);
        }
    }
}

/// A random fsync workload for [`fc_image`] (`seed`): creates, appends,
/// truncates, overwrites past the end, preallocation, hard links,
/// renames, unlinks and the odd full commit (`os.sync()`), each step in
/// a `try` (a step may name a file an earlier one removed).
fn random_fc_workload(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut names = vec!["keep".to_string(), "other".to_string()];
    let mut out = String::new();
    for step in 0..40 {
        let pick = |names: &[String], k: u64| names[(k % names.len() as u64) as usize].clone();
        let k = next(100);
        let n = pick(&names, next(1000));
        let op = match k {
            0..25 => {
                let new = format!("n{step}");
                names.push(new.clone());
                let len = [0, 1, 100, 4096, 5000, 20000, 70000][next(7) as usize];
                format!("w(d+'/d/{new}', bytes([{}])*{len})", next(256))
            }
            25..45 => format!(
                "w(d+'/d/{n}', b'a'*{}, 'ab')",
                [1, 3000, 9000][next(3) as usize]
            ),
            45..55 => format!(
                "os.truncate(d+'/d/{n}', {}); fs(d+'/d/{n}')",
                [0, 10, 4096, 6000][next(4) as usize]
            ),
            55..65 => {
                let new = format!("l{step}");
                names.push(new.clone());
                format!("os.link(d+'/d/{n}', d+'/d/{new}'); fs(d+'/d/{n}')")
            }
            65..75 => {
                let new = format!("r{step}");
                names.retain(|m| *m != n);
                names.push(new.clone());
                format!("os.rename(d+'/d/{n}', d+'/d/{new}'); fs(d+'/d/{new}')")
            }
            75..85 => format!(
                "fd=os.open(d+'/d/{n}', os.O_RDWR); os.pwrite(fd, b'p'*{}, {}); os.fsync(fd); os.close(fd)",
                [10, 5000][next(2) as usize],
                [0, 4096, 100000][next(3) as usize]
            ),
            85..90 => format!(
                "fd=os.open(d+'/d/{n}', os.O_RDWR); os.posix_fallocate(fd, {}, {}); os.fsync(fd); os.close(fd)",
                [0, 8192][next(2) as usize],
                [4096, 65536][next(2) as usize]
            ),
            90..95 if names.len() > 2 => {
                names.retain(|m| *m != n);
                format!("os.unlink(d+'/d/{n}'); fs(d+'/d')")
            }
            _ => "os.sync()".to_string(),
        };
        out.push_str(&format!("try:\n    {op}\nexcept OSError:\n    pass\n"));
    }
    out
}

/// Random fsync workloads (`EXT4KIT_JOURNAL_FUZZ_CASES` seeds, 6 by
/// default): a valid fast-commit log is replayed by ext4kit to the
/// kernel's tree, e2fsck clean; a log the kernel's recovery fails on (its
/// fast-commit area full: the scan runs past its end) is refused by
/// ext4kit with one line, nothing written, and the kernel's mount fails
/// too; a stale one replays as the full log.
#[test]
fn kernel_random_fast_commit_workloads_replay_to_the_kernels_tree() {
    let name = "kernel_random_fast_commit_workloads_replay_to_the_kernels_tree";
    if let Err(why) = kernel_ok() {
        return skip(name, &why);
    }
    let dir = image_dir();
    let d = dir.path();
    let mut states = std::collections::BTreeMap::new();
    for seed in 1..=fuzz_cases(6) {
        let img = d.join("r.img");
        mkfs(&img, "64M", &["-b", "4096", "-O", "fast_commit"]);
        {
            let lo = LoopDev::attach(&img).unwrap();
            let m = Mount::new(lo.path(), "ext4", Some("commit=60")).unwrap();
            fs::create_dir(m.path().join("d")).unwrap();
            fs::write(m.path().join("d/keep"), pattern(6000, 1)).unwrap();
            fs::write(m.path().join("d/other"), pattern(300, 2)).unwrap();
            run_ok(tool("sync").arg("-f").arg(m.path())).unwrap();
            let script = format!("{FC_PRELUDE}{}", random_fc_workload(seed));
            run_ok(tool("python3").arg("-c").arg(&script).arg(m.path()))
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{script}"));
            shutdown_nologflush_now(m.path());
            m.unmount().unwrap();
        }
        let v = dump_json(&img);
        let state = v["fast_commit"]["state"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        *states.entry(state.clone()).or_insert(0) += 1;
        let what = format!("seed {seed} ({state})");
        let ours = d.join("ours.img");
        sparse_copy(&img, &ours);
        if state == "bad" {
            let before = file_hash(&ours).unwrap();
            let out = run(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
            assert_eq!(out.status.code(), Some(1), "{what}: {}", text(&out));
            assert_eq!(
                String::from_utf8_lossy(&out.stderr).lines().count(),
                1,
                "{what}"
            );
            assert_eq!(file_hash(&ours).unwrap(), before, "{what}: a refusal wrote");
            assert!(
                KernelTwin::new(&img, d.join("kernel.img"), None).is_err(),
                "{what}: the kernel mounted a log ext4kit calls damaged"
            );
        } else {
            let want = kernel_tree(&img, d.join("kernel.img"));
            run_ok(ext4kit().args(["journal", "replay"]).arg(&ours))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // A stale log is the full log's replay, whose superblock
            // counts may lag as after any crash; a replayed one is exact.
            if state == "valid" {
                e2fsck_clean(&ours).map(drop)
            } else {
                e2fsck_clean_after_crash(&ours)
            }
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = kernel_tree(&ours, d.join("ours-mounted.img"));
            assert_eq!(got, want, "{what}: ext4kit's replay vs the kernel's");
        }
        for f in ["r.img", "ours.img", "kernel.img", "ours-mounted.img"] {
            let _ = fs::remove_file(d.join(f));
        }
    }
    eprintln!("{name}: {states:?}");
}

/// A power cut at every write of ext4kit's fast-commit replay (the rw
/// open of a kernel image with fast commits, then its close), whole
/// flushes lost or a random subset of the unflushed writes kept: the
/// next open finishes the replay, the tree is the one the kernel's
/// replay gives, e2fsck -fn is clean.
#[test]
fn power_cut_during_a_fast_commit_replay() {
    use ext4kit_device::{CutMode, Device, MemDevice};
    use ext4kit_fs::fs::Filesystem;
    use ext4kit_fs::rw::RwOptions;
    use std::sync::Arc;
    let name = "power_cut_during_a_fast_commit_replay";
    if let Err(why) = kernel_ok() {
        return skip(name, &why);
    }
    let dir = image_dir();
    let d = dir.path();
    let img = d.join("fc.img");
    fc_image(
        &img,
        "w('/d/new', b'a'*5000)\nw('/d/keep', b'b'*9000, 'ab')\n\
         w('/d/big', b'c'*40000)\nos.truncate(d+'/d/big', 10000); fs(d+'/d/big')\n\
         os.link(d+'/d/new', d+'/d/hard'); fs(d+'/d/new')\nos.rename(d+'/d/other', d+'/d/moved'); fs(d+'/d/moved')\n",
    );
    let want = kernel_tree(&img, d.join("kernel.img"));
    let base = MemDevice::from_bytes(fs::read(&img).unwrap());
    let _ = fs::remove_file(&img);
    let run = |dev: Arc<dyn Device>| -> Result<(), String> {
        let e = |e: ext4kit_fs::FsError| e.to_string();
        Filesystem::open(dev, RwOptions::default())
            .map_err(e)?
            .close()
            .map_err(e)
    };
    let out = d.join("cut.img");
    let check = |mem: &MemDevice, what: &str| {
        fs::write(&out, mem.to_bytes()).unwrap();
        e2fsck_clean(&out).unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = kernel_tree(&out, d.join("cut-mounted.img"));
        assert_eq!(got, want, "{what}: the tree after the cut and a reopen");
    };
    let (mem, r, ops) = run_cut(&base, None, CutMode::DropAll, run);
    r.unwrap();
    check(&mem, "no cut");
    eprintln!("{name}: {ops} writes");
    for mode in [
        CutMode::DropAll,
        CutMode::Subset {
            seed: 7,
            torn: false,
        },
    ] {
        for cut in 1..ops {
            let (mem, _, _) = run_cut(&base, Some(cut), mode, run);
            let what = format!("cut {cut} {mode:?}");
            run(mem.clone() as Arc<dyn Device>).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            check(&mem, &what);
        }
    }
}

/// Fast commits older than the last full commit (fsyncs, then syncfs,
/// then more full commits, then a shutdown): the kernel ignores them, so
/// the replay does, byte for byte like `e2fsck -E journal_only`; ext4kit
/// then writes the image (its full commits outside the fast-commit area)
/// and the kernel mounts it and sees the files.
#[test]
fn kernel_stale_fast_commits_replay_like_e2fsck_and_ext4kit_writes() {
    if let Err(why) = kernel_ok() {
        return skip(
            "kernel_stale_fast_commits_replay_like_e2fsck_and_ext4kit_writes",
            &why,
        );
    }
    let dir = image_dir();
    let d = dir.path();
    let img = d.join("stale.img");
    mkfs(&img, "64M", &["-b", "4096", "-O", "fast_commit"]);
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        fs::create_dir(m.path().join("d")).unwrap();
        run_ok(tool("sync").arg("-f").arg(m.path())).unwrap();
        for i in 0..4 {
            let p = m.path().join(format!("d/f{i}"));
            fs::write(&p, pattern(3000 + i, i as u64)).unwrap();
            fsync(&p);
        }
        // A full commit of the fast commits' transaction, then one more
        // (a rename of a directory is not fast-commit eligible).
        run_ok(tool("sync").arg("-f").arg(m.path())).unwrap();
        fs::rename(m.path().join("d"), m.path().join("e")).unwrap();
        fsync(m.path());
        shutdown_nologflush(m.path());
        m.unmount().unwrap();
    }
    let v = dump_json(&img);
    assert_eq!(v["needs_recovery"], true, "{v}");
    assert!(v["transactions"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["fast_commit"]["state"], "empty", "{v}");
    // The kernel replays it without complaint.
    let twin = KernelTwin::new(&img, d.join("kernel0.img"), None).unwrap();
    for i in 0..4 {
        assert!(
            fs::read(twin.path().join(format!("e/f{i}"))).unwrap() == pattern(3000 + i, i as u64)
        );
    }
    twin.unmount().unwrap();
    fs::remove_file(d.join("kernel0.img")).unwrap();
    // e2fsck 1.47's scan calls a HEAD of another tid an error (-EINVAL;
    // the kernel's ext4_fc_replay_scan stops there without one), so it
    // clears VALID_FS to force a full check and, on that error path,
    // leaves the journal's s_sequence at its old value (the kernel and
    // ext4kit restart the log at end_tid + 1): those aside, the replay
    // is byte for byte e2fsck's.
    let ours = d.join("ours.img");
    let theirs = d.join("theirs.img");
    sparse_copy(&img, &ours);
    sparse_copy(&img, &theirs);
    run_ok(ext4kit().args(["journal", "replay"]).arg(&ours)).unwrap();
    let e = run(tool("e2fsck")
        .args(["-E", "journal_only", "-y"])
        .arg(&theirs))
    .unwrap();
    assert!(e.status.code().is_some_and(|c| c <= 1), "{}", text(&e));
    let (a, b) = (sb_of(&ours), sb_of(&theirs));
    assert_eq!(a.s_state.get(), 1, "ours: clean");
    assert_eq!(b.s_state.get(), 0, "e2fsck: not clean (see above)");
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(&theirs).unwrap();
        let off = 1024 + std::mem::offset_of!(Superblock, s_state) as u64;
        f.write_all_at(&1u16.to_le_bytes(), off).unwrap();
        let jsb_at = journal_block(&ours, 0) * 4096;
        let (mut ja, mut jb) = (vec![0u8; 1024], vec![0u8; 1024]);
        fs::File::open(&ours)
            .unwrap()
            .read_exact_at(&mut ja, jsb_at)
            .unwrap();
        fs::File::open(&theirs)
            .unwrap()
            .read_exact_at(&mut jb, jsb_at)
            .unwrap();
        let seq = |j: &[u8]| u32::from_be_bytes([j[24], j[25], j[26], j[27]]);
        assert_eq!(seq(&ja), v["next_sequence"].as_u64().unwrap() as u32);
        let (mut ma, mut mb) = (ja.clone(), jb.clone());
        for m in [&mut ma, &mut mb] {
            m[24..28].fill(0);
            m[0xFC..0x100].fill(0);
        }
        assert!(ma == mb, "journal superblocks differ beyond s_sequence");
        f.write_all_at(&ja, jsb_at).unwrap();
    }
    let (ma, mb) = (d.join("ours.masked"), d.join("theirs.masked"));
    sparse_copy(&ours, &ma);
    sparse_copy(&theirs, &mb);
    mask_superblock(&ma);
    mask_superblock(&mb);
    sparse_equal(&ma, &mb).unwrap_or_else(|e| panic!("replay differs from e2fsck's: {e}"));
    for p in [&ma, &mb, &theirs] {
        fs::remove_file(p).unwrap();
    }
    e2fsck_clean_after_crash(&ours).unwrap();
    // ext4kit writes it (80 opens, each with its commits and a clean close).
    let s = ours.display().to_string();
    let host = d.join("host");
    fs::write(&host, b"host file\n").unwrap();
    for i in 0..40 {
        run_ok(ext4kit().arg("mkdir").arg(format!("{s}:/m{i}"))).unwrap();
        run_ok(ext4kit().arg("cp").arg(&host).arg(format!("{s}:/m{i}/h"))).unwrap();
    }
    e2fsck_clean_after_crash(&ours).unwrap();
    let twin = KernelTwin::new(&ours, d.join("kernel.img"), None).unwrap();
    for i in 0..4 {
        let got = fs::read(twin.path().join(format!("e/f{i}"))).unwrap();
        assert!(got == pattern(3000 + i, i as u64), "e/f{i}");
    }
    assert!(twin.path().join("m39/h").exists());
    twin.unmount().unwrap();
    e2fsck_clean(&d.join("kernel.img")).unwrap();
}

/// ext4kit mkfs -O fast_commit, ext4kit's tools write it (the journal
/// gets the fast-commit feature, as the kernel's mount sets it), the
/// kernel mounts it clean, writes with fast commits and unmounts; ext4kit
/// writes the kernel-used image again; e2fsck -fn clean after each step.
#[test]
fn mkfs_fast_commit_images_are_written_by_ext4kit_and_the_kernel() {
    if let Err(why) = kernel_ok() {
        return skip(
            "mkfs_fast_commit_images_are_written_by_ext4kit_and_the_kernel",
            &why,
        );
    }
    let dir = image_dir();
    let d = dir.path();
    let img = d.join("mk.img");
    run_ok(tool("truncate").args(["-s", "128M"]).arg(&img)).unwrap();
    run_ok(ext4kit_mkfs(["-q", "-F", "-t", "ext4", "-O", "fast_commit"]).arg(&img)).unwrap();
    let s = img.display().to_string();
    let host = d.join("data");
    fs::write(&host, pattern(70_000, 9)).unwrap();
    run_ok(ext4kit().arg("mkdir").arg(format!("{s}:/a"))).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(format!("{s}:/a/data"))).unwrap();
    e2fsck_clean(&img).unwrap();
    let v = dump_json(&img);
    assert!(
        v["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == "fast_commit"),
        "{v}"
    );
    {
        let lo = LoopDev::attach(&img).unwrap();
        let m = Mount::new(lo.path(), "ext4", None).unwrap();
        assert!(fs::read(m.path().join("a/data")).unwrap() == pattern(70_000, 9));
        for i in 0..5u64 {
            let p = m.path().join(format!("a/k{i}"));
            fs::write(&p, pattern(500 + i as usize, i)).unwrap();
            fsync(&p);
        }
        m.unmount().unwrap();
    }
    e2fsck_clean(&img).unwrap();
    run_ok(ext4kit().arg("rm").arg(format!("{s}:/a/k0"))).unwrap();
    run_ok(ext4kit().arg("cp").arg(&host).arg(format!("{s}:/a/data2"))).unwrap();
    e2fsck_clean(&img).unwrap();
    assert!(cat(&img, "/a/k4") == pattern(504, 4));
    let twin = KernelTwin::new(&img, d.join("kernel.img"), None).unwrap();
    assert!(fs::read(twin.path().join("a/data2")).unwrap() == pattern(70_000, 9));
    assert!(!twin.path().join("a/k0").exists());
    twin.unmount().unwrap();
    e2fsck_clean(&d.join("kernel.img")).unwrap();
}
