//! The read side of the engine and `ext4kit ls`, `cat`, `stat`.
//!
//! Oracles: debugfs (`dx_hash`, `ls -l`, `cat`, `stat`, `ea_list`) and the
//! source tree an image was populated from (`mke2fs -d`), a kernel mount
//! for kernel-written trees (root with loop devices, else SKIP), and
//! images that must stay byte-identical (read-only, also with a dirty
//! journal).

mod common;

use std::os::unix::ffi::OsStrExt;

use common::*;
use ext4kit_format::dirhash;

/// Names for hashing: short, long (several MD4/TEA rounds), bytes >= 0x80
/// (where the signed and unsigned variants differ).
fn hash_names() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..200usize {
        let len = 1 + (i * 7) % 90;
        let mut n = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Printable, no whitespace or quotes (debugfs splits its
            // command line), some bytes with the top bit set.
            let b = (x % 94) as u8 + 33;
            let b = if x.is_multiple_of(5) { b | 0x80 } else { b };
            n.push(if b == b'"' || b == b'\'' || b == b'\\' {
                b'a'
            } else {
                b
            });
        }
        v.push(n);
    }
    v.push(b"lost+found".to_vec());
    v.push(b"a".to_vec());
    v.push([b'x'; 255].to_vec());
    v
}

#[test]
fn dirhash_matches_debugfs() {
    if !have("debugfs") {
        return skip("dirhash_matches_debugfs", "debugfs not found");
    }
    let dir = image_dir();
    let names = hash_names();
    let seeds: [(&str, [u8; 16]); 2] = [
        (SEED, uuid::Uuid::parse_str(SEED).unwrap().into_bytes()),
        ("00000000-0000-0000-0000-000000000000", [0; 16]),
    ];
    let mut cmds = Vec::new();
    let mut want = Vec::new();
    for (s, seed) in &seeds {
        for alg in 0u8..=5 {
            for n in &names {
                cmds.extend_from_slice(format!("dx_hash -h {alg} -s {s} ").as_bytes());
                cmds.extend_from_slice(n);
                cmds.push(b'\n');
                want.push(dirhash::dirhash(alg, n, seed).unwrap());
            }
        }
    }
    let f = dir.path().join("cmds");
    std::fs::write(&f, &cmds).unwrap();
    let out = run_ok(tool("debugfs").arg("-f").arg(&f)).unwrap();
    let text = out.stdout;
    let got: Vec<dirhash::DxHash> = text
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"Hash of "))
        .map(|l| {
            let s = String::from_utf8_lossy(l);
            let (_, rest) = s.rsplit_once(" is 0x").unwrap();
            let (maj, min) = rest.split_once(" (minor 0x").unwrap();
            dirhash::DxHash {
                major: u32::from_str_radix(maj, 16).unwrap(),
                minor: u32::from_str_radix(min.trim_end_matches(')'), 16).unwrap(),
            }
        })
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "debugfs printed {} hashes",
        got.len()
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let n = &names[i % names.len()];
        assert_eq!(
            g,
            w,
            "hash {} of {:?} (alg {})",
            i,
            std::ffi::OsStr::from_bytes(n),
            (i / names.len()) % 6
        );
    }
}
