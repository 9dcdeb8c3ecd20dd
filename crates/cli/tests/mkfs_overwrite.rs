//! Overwrite protection as mke2fs 1.47 does it (misc/mke2fs.c PRS(),
//! lib/support/plausible.c): when stdin and stdout are terminals, a target
//! holding a filesystem, another signature or a partition table is shown
//! ("t.img contains a ext4 file system labelled 'precious'" ...) and,
//! without -F, "Proceed anyway? (y,N)" is asked; "no" exits 1 with nothing
//! written. Without a terminal nothing is asked.
//!
//! Each case runs real mke2fs and ext4kit on identical copies of a target
//! on a pseudo-terminal (script(1)) and compares what they print.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::*;

const SIZE: u64 = 16 * MIB;

/// Environment for both formatters: same clock, no progress countdown,
/// UTC (the "created on" lines), our mke2fs.conf.
fn env(conf: &Path) -> Vec<(String, String)> {
    [
        ("E2FSPROGS_FAKE_TIME", FAKE_TIME),
        ("SOURCE_DATE_EPOCH", FAKE_TIME),
        ("E2FSPROGS_SKIP_PROGRESS", "1"),
        ("TZ", "UTC"),
        ("LC_ALL", "C"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("MKE2FS_CONFIG".to_string(), conf.display().to_string())])
    .collect()
}

/// Run a shell command line on a pseudo-terminal (stdin and stdout are the
/// terminal) in `dir`, typing `input`. Returns the exit status and what
/// the terminal showed, without carriage returns and without mke2fs's
/// version banner.
fn on_pty(
    dir: &Path,
    cmdline: &str,
    input: &str,
    env: &[(String, String)],
) -> (Option<i32>, String) {
    let mut c = tool("script");
    c.arg("-qec")
        .arg(cmdline)
        .arg("/dev/null")
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // script(1) lingers for 2 s after an end of input that nobody read;
    // /dev/null does not make it wait.
    c.stdin(if input.is_empty() {
        Stdio::null()
    } else {
        Stdio::piped()
    });
    let mut child = c.spawn().expect("running script");
    // Type the answer only once the question is on the terminal: typed
    // earlier, the terminal echoes it before the prompt (a race that shows
    // on a loaded machine), and the transcripts would differ by timing.
    let mut shown = Vec::new();
    if let Some(mut stdin) = child.stdin.take() {
        if let Some(stdout) = child.stdout.as_mut() {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&shown).contains("(y,N)") {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => shown.extend_from_slice(&buf[..n]),
                }
            }
        }
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().expect("waiting for script");
    shown.extend_from_slice(&out.stdout);
    let text = String::from_utf8_lossy(&shown)
        .replace('\r', "")
        .lines()
        .filter(|l| !l.starts_with("mke2fs 1.47"))
        .map(|l| format!("{l}\n"))
        .collect();
    (out.status.code(), text)
}

fn pty_available(test: &str) -> bool {
    for t in ["script", "mke2fs", "e2fsck"] {
        if !have(t) {
            skip(test, &format!("{t} not found"));
            return false;
        }
    }
    true
}

fn write_at(path: &Path, off: u64, data: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(data, off).unwrap();
}

fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Standard CRC-32C (Castagnoli), as btrfs stores it.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn lvm2_crc(buf: &[u8]) -> u32 {
    const TAB: [u32; 16] = [
        0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4, 0x4db26158,
        0x5005713c, 0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c, 0x9b64c2b0, 0x86d3d2d4,
        0xa00ae278, 0xbdbdf21c,
    ];
    let mut crc: u32 = 0xf597a6cf;
    for &b in buf {
        crc ^= u32::from(b);
        crc = (crc >> 4) ^ TAB[(crc & 0xf) as usize];
        crc = (crc >> 4) ^ TAB[(crc & 0xf) as usize];
    }
    crc
}

/// What is put on the target before the format.
#[derive(Clone, Copy, Debug)]
enum Old {
    Ext4Mounted,
    Ext2,
    Ext3Labelled,
    Swap,
    Lvm2,
    Luks1,
    Luks2,
    Iso9660,
    Vfat,
    VfatLabelled,
    Xfs,
    Btrfs,
    Dos,
    Gpt,
}

fn make_old(kind: Old, img: &Path, conf: &Path) -> Result<(), String> {
    sparse_file(img, SIZE).map_err(|e| e.to_string())?;
    let mk = |args: &[&str]| {
        run_ok(
            mke2fs(args)
                .arg(img)
                .env("MKE2FS_CONFIG", conf)
                .env("E2FSPROGS_FAKE_TIME", "1600000000"),
        )
        .map(drop)
    };
    match kind {
        Old::Ext4Mounted => {
            mk(&["-q", "-F", "-t", "ext4", "-L", "precious"])?;
            if !have("debugfs") {
                return Err("debugfs not found".into());
            }
            for req in ["ssv last_mounted /srv/precious", "ssv mtime 20240101120000"] {
                run_ok(tool("debugfs").arg("-w").arg("-R").arg(req).arg(img))?;
            }
        }
        Old::Ext2 => mk(&["-q", "-F", "-t", "ext2"])?,
        Old::Ext3Labelled => mk(&["-q", "-F", "-t", "ext3", "-L", "old data"])?,
        Old::Swap => {
            if !have("mkswap") {
                return Err("mkswap not found".into());
            }
            run_ok(tool("mkswap").arg("-L").arg("swp").arg(img))?;
        }
        Old::Lvm2 => {
            let mut h = vec![0u8; 512];
            h[0..8].copy_from_slice(b"LABELONE");
            h[8..16].copy_from_slice(&1u64.to_le_bytes());
            h[20..24].copy_from_slice(&32u32.to_le_bytes());
            h[24..32].copy_from_slice(b"LVM2 001");
            h[32..64].copy_from_slice(b"abcdefghijklmnopqrstuvwxyz012345");
            let crc = lvm2_crc(&h[20..512]);
            h[16..20].copy_from_slice(&crc.to_le_bytes());
            write_at(img, 512, &h);
        }
        Old::Luks1 | Old::Luks2 => {
            let mut h = vec![0u8; 4096];
            h[0..6].copy_from_slice(b"LUKS\xba\xbe");
            let v2 = matches!(kind, Old::Luks2);
            h[6..8].copy_from_slice(&(if v2 { 2u16 } else { 1 }).to_be_bytes());
            if v2 {
                h[8..16].copy_from_slice(&16384u64.to_be_bytes());
                h[24..32].copy_from_slice(b"vault-01");
                h[72..78].copy_from_slice(b"sha256");
            } else {
                h[8..11].copy_from_slice(b"aes");
                h[40..51].copy_from_slice(b"xts-plain64");
                h[72..78].copy_from_slice(b"sha256");
                h[104..108].copy_from_slice(&4096u32.to_be_bytes());
                h[108..112].copy_from_slice(&64u32.to_be_bytes());
            }
            h[168..204].copy_from_slice(b"6b9f5c2e-1d0a-4c1b-9e0f-2a3b4c5d6e7f");
            write_at(img, 0, &h);
        }
        Old::Iso9660 => {
            let mut pvd = vec![0u8; 2048];
            pvd[0] = 1;
            pvd[1..6].copy_from_slice(b"CD001");
            pvd[6] = 1;
            pvd[8..40].fill(b' ');
            pvd[40..72].fill(b' ');
            pvd[40..46].copy_from_slice(b"MYDISC");
            let blocks = (SIZE / 2048) as u32;
            pvd[80..84].copy_from_slice(&blocks.to_le_bytes());
            pvd[84..88].copy_from_slice(&blocks.to_be_bytes());
            pvd[120..122].copy_from_slice(&1u16.to_le_bytes());
            pvd[122..124].copy_from_slice(&1u16.to_be_bytes());
            pvd[124..126].copy_from_slice(&1u16.to_le_bytes());
            pvd[126..128].copy_from_slice(&1u16.to_be_bytes());
            pvd[128..130].copy_from_slice(&2048u16.to_le_bytes());
            pvd[130..132].copy_from_slice(&2048u16.to_be_bytes());
            write_at(img, 16 * 2048, &pvd);
            let mut term = vec![0u8; 2048];
            term[0] = 255;
            term[1..6].copy_from_slice(b"CD001");
            term[6] = 1;
            write_at(img, 17 * 2048, &term);
        }
        Old::Vfat | Old::VfatLabelled => {
            let mut b = vec![0u8; 512];
            b[0..3].copy_from_slice(&[0xEB, 0x3C, 0x90]);
            b[3..11].copy_from_slice(b"MSDOS5.0");
            b[11..13].copy_from_slice(&512u16.to_le_bytes());
            b[13] = 4; // sectors per cluster
            b[14..16].copy_from_slice(&4u16.to_le_bytes()); // reserved
            b[16] = 2; // FATs
            b[17..19].copy_from_slice(&512u16.to_le_bytes()); // root entries
            b[21] = 0xF8;
            b[22..24].copy_from_slice(&128u16.to_le_bytes()); // sectors per FAT
            b[24..26].copy_from_slice(&32u16.to_le_bytes());
            b[26..28].copy_from_slice(&64u16.to_le_bytes());
            b[32..36].copy_from_slice(&((SIZE / 512) as u32).to_le_bytes());
            b[36] = 0x80;
            b[38] = 0x29;
            b[39..43].copy_from_slice(&0x1234_5678u32.to_le_bytes());
            b[43..54].copy_from_slice(b"MYFAT      ");
            b[54..62].copy_from_slice(b"FAT16   ");
            b[510] = 0x55;
            b[511] = 0xAA;
            write_at(img, 0, &b);
            // The FATs' first entries (media byte).
            for fat in 0..2u64 {
                write_at(img, (4 + fat * 128) * 512, &[0xF8, 0xFF, 0xFF, 0xFF]);
            }
            if matches!(kind, Old::VfatLabelled) {
                // A volume-label entry first in the root directory (the
                // label libblkid reports; the boot sector's is only a copy).
                let mut e = [0u8; 32];
                e[0..11].copy_from_slice(b"PHOTOS     ");
                e[11] = 0x08;
                write_at(img, (4 + 2 * 128) * 512, &e);
            }
        }
        Old::Xfs => {
            // A version 4 superblock (no CRC) with a consistent geometry.
            let mut sb = vec![0u8; 512];
            sb[0..4].copy_from_slice(b"XFSB");
            sb[4..8].copy_from_slice(&4096u32.to_be_bytes());
            sb[8..16].copy_from_slice(&16384u64.to_be_bytes());
            sb[32..48].copy_from_slice(&[3u8; 16]);
            sb[80..84].copy_from_slice(&1u32.to_be_bytes());
            sb[84..88].copy_from_slice(&4096u32.to_be_bytes());
            sb[88..92].copy_from_slice(&4u32.to_be_bytes());
            sb[100..102].copy_from_slice(&0xb4a4u16.to_be_bytes());
            sb[102..104].copy_from_slice(&512u16.to_be_bytes());
            sb[104..106].copy_from_slice(&256u16.to_be_bytes());
            sb[106..108].copy_from_slice(&16u16.to_be_bytes());
            sb[108..115].copy_from_slice(b"scratch");
            sb[120..128].copy_from_slice(&[12, 9, 8, 4, 12, 0, 0, 25]);
            write_at(img, 0, &sb);
        }
        Old::Btrfs => {
            let mut sb = vec![0u8; 4096];
            sb[32..48].copy_from_slice(&[5u8; 16]);
            sb[48..56].copy_from_slice(&65536u64.to_le_bytes());
            sb[64..72].copy_from_slice(b"_BHRfS_M");
            sb[112..120].copy_from_slice(&SIZE.to_le_bytes());
            sb[136..144].copy_from_slice(&1u64.to_le_bytes());
            sb[144..148].copy_from_slice(&4096u32.to_le_bytes());
            sb[148..152].copy_from_slice(&16384u32.to_le_bytes());
            sb[299..306].copy_from_slice(b"pool-01");
            let crc = crc32c(&sb[32..]);
            sb[0..4].copy_from_slice(&crc.to_le_bytes());
            write_at(img, 65536, &sb);
        }
        Old::Dos => {
            let mut m = vec![0u8; 512];
            let p = &mut m[446..462];
            p[4] = 0x83;
            p[8..12].copy_from_slice(&2048u32.to_le_bytes());
            p[12..16].copy_from_slice(&((SIZE / 512 - 2048) as u32).to_le_bytes());
            m[440..444].copy_from_slice(&0xdead_beefu32.to_le_bytes());
            m[510] = 0x55;
            m[511] = 0xAA;
            write_at(img, 0, &m);
        }
        Old::Gpt => {
            let last = SIZE / 512 - 1;
            let mut m = vec![0u8; 512];
            let p = &mut m[446..462];
            p[4] = 0xEE;
            p[8..12].copy_from_slice(&1u32.to_le_bytes());
            p[12..16].copy_from_slice(&(last as u32).to_le_bytes());
            m[510] = 0x55;
            m[511] = 0xAA;
            write_at(img, 0, &m);
            let mut entries = vec![0u8; 128 * 128];
            let linux_fs: [u8; 16] = [
                0xAF, 0x3D, 0xC6, 0x0F, 0x83, 0x84, 0x72, 0x47, 0x8E, 0x79, 0x3D, 0x69, 0xD8, 0x47,
                0x7D, 0xE4,
            ];
            entries[0..16].copy_from_slice(&linux_fs);
            entries[16..32].copy_from_slice(&[7u8; 16]);
            entries[32..40].copy_from_slice(&2048u64.to_le_bytes());
            entries[40..48].copy_from_slice(&(last - 34).to_le_bytes());
            let ecrc = crc32_ieee(&entries);
            let header = |my: u64, alt: u64, ent: u64| {
                let mut h = vec![0u8; 512];
                h[0..8].copy_from_slice(b"EFI PART");
                h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
                h[12..16].copy_from_slice(&92u32.to_le_bytes());
                h[24..32].copy_from_slice(&my.to_le_bytes());
                h[32..40].copy_from_slice(&alt.to_le_bytes());
                h[40..48].copy_from_slice(&34u64.to_le_bytes());
                h[48..56].copy_from_slice(&(last - 33).to_le_bytes());
                h[56..72].copy_from_slice(&[9u8; 16]);
                h[72..80].copy_from_slice(&ent.to_le_bytes());
                h[80..84].copy_from_slice(&128u32.to_le_bytes());
                h[84..88].copy_from_slice(&128u32.to_le_bytes());
                h[88..92].copy_from_slice(&ecrc.to_le_bytes());
                let crc = crc32_ieee(&h[..92]);
                h[16..20].copy_from_slice(&crc.to_le_bytes());
                h
            };
            write_at(img, 512, &header(1, last, 2));
            write_at(img, 1024, &entries);
            write_at(img, (last - 32) * 512, &entries);
            write_at(img, last * 512, &header(last, 1, last - 32));
        }
    }
    Ok(())
}

struct Dirs {
    _tmp: tempfile::TempDir,
    conf: PathBuf,
    /// mke2fs works here ...
    a: PathBuf,
    /// ... ext4kit here, on an identical copy named the same (t.img).
    b: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = image_dir();
    let conf = tmp.path().join("mke2fs.conf");
    std::fs::write(&conf, DEBIAN_CONF).unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    Dirs {
        _tmp: tmp,
        conf,
        a,
        b,
    }
}

fn same_args() -> String {
    format!("-U {UUID} -E hash_seed={SEED}")
}

/// For every kind of old content: mke2fs shows it and asks; ext4kit shows
/// the same lines and asks the same question; "n" leaves the target as it
/// was, with exit status 1 from both.
#[test]
fn shows_what_is_there_and_asks_like_mke2fs() {
    const TEST: &str = "shows_what_is_there_and_asks_like_mke2fs";
    if !pty_available(TEST) {
        return;
    }
    let d = dirs();
    let env = env(&d.conf);
    let kinds = [
        Old::Ext4Mounted,
        Old::Ext2,
        Old::Ext3Labelled,
        Old::Swap,
        Old::Lvm2,
        Old::Luks1,
        Old::Luks2,
        Old::Iso9660,
        Old::Vfat,
        Old::VfatLabelled,
        Old::Xfs,
        Old::Btrfs,
        Old::Dos,
        Old::Gpt,
    ];
    let mut failures = Vec::new();
    for kind in kinds {
        let t0 = std::time::Instant::now();
        let (ia, ib) = (d.a.join("t.img"), d.b.join("t.img"));
        let made = make_old(kind, &ia, &d.conf);
        if let Err(why) = made {
            skip(&format!("{TEST} {kind:?}"), &why);
            continue;
        }
        std::fs::copy(&ia, &ib).unwrap();
        let before = std::fs::read(&ib).unwrap();
        let (ca, ta) = on_pty(&d.a, "mke2fs -t ext4 t.img", "n\n", &env);
        let cmd = format!("{} mkfs -t ext4 t.img", ext4kit_path());
        let (cb, tb) = on_pty(&d.b, &cmd, "n\n", &env);
        let label = format!("{kind:?}");
        if !ta.contains("Proceed anyway? (y,N)") || ca != Some(1) {
            failures.push(format!(
                "{label}: mke2fs did not ask (exit {ca:?}): the test image is wrong:\n{ta}"
            ));
        } else if ta != tb || cb != Some(1) {
            failures.push(format!(
                "{label}: ext4kit (exit {cb:?}) differs from mke2fs:\n--- mke2fs\n{ta}--- ext4kit\n{tb}"
            ));
        } else if std::fs::read(&ib).unwrap() != before {
            failures.push(format!("{label}: the target was MODIFIED after 'n'"));
        } else {
            eprintln!(
                "ok     {label}: {} ({:.1}s)",
                tb.lines().nth(1).unwrap_or("").trim(),
                t0.elapsed().as_secs_f64()
            );
        }
        let _ = std::fs::remove_file(&ia);
        let _ = std::fs::remove_file(&ib);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// "y" formats, -F shows what is there without asking, and in both cases
/// the whole transcript equals mke2fs's (same UUID, seed and clock), and
/// the images are byte-identical and clean.
#[test]
fn yes_and_force_format_like_mke2fs() {
    const TEST: &str = "yes_and_force_format_like_mke2fs";
    if !pty_available(TEST) {
        return;
    }
    let d = dirs();
    let env = env(&d.conf);
    let args = same_args();
    for (flags, input) in [("", "y\n"), ("-F ", "")] {
        let (ia, ib) = (d.a.join("t.img"), d.b.join("t.img"));
        make_old(Old::Ext3Labelled, &ia, &d.conf).unwrap();
        std::fs::copy(&ia, &ib).unwrap();
        let (ca, ta) = on_pty(
            &d.a,
            &format!("mke2fs {flags}-t ext4 {args} t.img"),
            input,
            &env,
        );
        let (cb, tb) = on_pty(
            &d.b,
            &format!("{} mkfs {flags}-t ext4 {args} t.img", ext4kit_path()),
            input,
            &env,
        );
        assert_eq!(ca, Some(0), "mke2fs {flags}: {ta}");
        assert!(
            ta.contains("contains a ext3 file system labelled 'old data'"),
            "{ta}"
        );
        assert_eq!(ta.contains("Proceed anyway?"), flags.is_empty(), "{ta}");
        assert_eq!(
            ta, tb,
            "ext4kit {flags}differs from mke2fs (exit {cb:?}):\n--- mke2fs\n{ta}--- ext4kit\n{tb}"
        );
        assert_eq!(cb, Some(0));
        sparse_equal(&ia, &ib).unwrap();
        e2fsck_clean(&ib).unwrap();
    }
}

/// mke2fs.conf's `[options] proceed_delay`: no answer within that many
/// seconds means yes ("<proceeding>"), as with mke2fs.
#[test]
fn proceed_delay_like_mke2fs() {
    const TEST: &str = "proceed_delay_like_mke2fs";
    if !pty_available(TEST) {
        return;
    }
    let d = dirs();
    std::fs::write(
        &d.conf,
        format!("{DEBIAN_CONF}\n[options]\n\tproceed_delay = 1\n"),
    )
    .unwrap();
    let env = env(&d.conf);
    let args = same_args();
    let mut shown = Vec::new();
    for (dir, prog) in [
        (&d.a, "mke2fs".to_string()),
        (&d.b, format!("{} mkfs", ext4kit_path())),
    ] {
        let img = dir.join("t.img");
        make_old(Old::Ext2, &img, &d.conf).unwrap();
        // Nothing typed; the terminal stays open past the delay.
        let (code, text) = on_pty_silent(dir, &format!("{prog} -t ext4 {args} t.img"), &env, 3);
        assert_eq!(code, Some(0), "{prog}: {text}");
        e2fsck_clean(&img).unwrap();
        shown.push(text);
    }
    assert!(
        shown[0].contains("wait 1 seconds to proceed") && shown[0].contains("<proceeding>"),
        "{}",
        shown[0]
    );
    assert_eq!(
        shown[0], shown[1],
        "--- mke2fs\n{}--- ext4kit\n{}",
        shown[0], shown[1]
    );
    sparse_equal(&d.a.join("t.img"), &d.b.join("t.img")).unwrap();
}

/// Like [`on_pty`] with nothing typed, keeping the terminal's input open
/// for `secs` seconds.
fn on_pty_silent(
    dir: &Path,
    cmdline: &str,
    env: &[(String, String)],
    secs: u64,
) -> (Option<i32>, String) {
    let mut c = tool("script");
    c.arg("-qec")
        .arg(cmdline)
        .arg("/dev/null")
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("running script");
    let stdin = child.stdin.take();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        drop(stdin);
    });
    let out = child.wait_with_output().expect("waiting for script");
    let _ = holder.join();
    let text = String::from_utf8_lossy(&out.stdout)
        .replace('\r', "")
        .lines()
        .filter(|l| !l.starts_with("mke2fs 1.47"))
        .map(|l| format!("{l}\n"))
        .collect();
    (out.status.code(), text)
}

/// No terminal, no question (scripts keep working, as with mke2fs):
/// stdin not a terminal, or stdout not a terminal. The old filesystem is
/// replaced and nothing about it is printed.
#[test]
fn never_asks_without_a_terminal() {
    const TEST: &str = "never_asks_without_a_terminal";
    if !pty_available(TEST) {
        return;
    }
    let d = dirs();
    let env = env(&d.conf);
    let img = d.b.join("t.img");
    // stdin and stdout are pipes.
    make_old(Old::Ext3Labelled, &img, &d.conf).unwrap();
    let out = run_ok(
        ext4kit_mkfs(["-t", "ext4"])
            .arg(&img)
            .envs(env.iter().map(|(k, v)| (k, v))),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("contains") && !text.contains("Proceed"),
        "{text}"
    );
    e2fsck_clean(&img).unwrap();
    assert_eq!(fs_label(&img).as_deref(), Some(""));
    // stdin is a terminal, stdout a file: mke2fs does not look either.
    for (dir, prog) in [
        (&d.a, "mke2fs".to_string()),
        (&d.b, format!("{} mkfs", ext4kit_path())),
    ] {
        let img = dir.join("t.img");
        make_old(Old::Ext3Labelled, &img, &d.conf).unwrap();
        let (code, shown) = on_pty(dir, &format!("{prog} -t ext4 t.img > out.txt"), "", &env);
        let out = std::fs::read_to_string(dir.join("out.txt")).unwrap();
        assert_eq!(code, Some(0), "{prog}: {shown}{out}");
        assert!(
            !out.contains("contains") && !out.contains("Proceed"),
            "{prog}: {out}"
        );
        e2fsck_clean(&img).unwrap();
    }
}
