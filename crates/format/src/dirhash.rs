//! ext4's directory hash functions (htree keys): legacy (`dx_hack_hash`),
//! half-MD4 and TEA, each in the signed-`char` and unsigned-`char` flavour,
//! keyed by the filesystem's `s_hash_seed` (the MD4 initial state when the
//! seed is all zero). The arithmetic is e2fsprogs' `lib/ext2fs/dirhash.c`
//! and the kernel's `fs/ext4/hash.c`.

/// `dx_root_info.hash_version` / `s_def_hash_version` values.
pub const DX_HASH_LEGACY: u8 = 0;
pub const DX_HASH_HALF_MD4: u8 = 1;
pub const DX_HASH_TEA: u8 = 2;
pub const DX_HASH_LEGACY_UNSIGNED: u8 = 3;
pub const DX_HASH_HALF_MD4_UNSIGNED: u8 = 4;
pub const DX_HASH_TEA_UNSIGNED: u8 = 5;
pub const DX_HASH_SIPHASH: u8 = 6;

/// The hash that marks "end of directory" in 32-bit readdir cookies; the
/// kernel never hands it out as a name's hash.
pub const HTREE_EOF_32BIT: u32 = 0x7fff_ffff;

/// A name's major and minor hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DxHash {
    pub major: u32,
    pub minor: u32,
}

/// The algorithm that `hash_version` (from the dx_root) selects on a
/// filesystem whose superblock says `unsigned_chars` (`s_flags` has
/// `EXT2_FLAGS_UNSIGNED_HASH`): the kernel adds 3 to the legacy..tea
/// versions then.
pub fn effective_version(hash_version: u8, unsigned_chars: bool) -> u8 {
    if hash_version <= DX_HASH_TEA && unsigned_chars {
        hash_version + 3
    } else {
        hash_version
    }
}

/// The seed as the four 32-bit words the functions use (`s_hash_seed` is
/// stored as four little-endian words). `None` for the all-zero seed, which
/// means "the default MD4 state".
pub fn seed_words(seed: &[u8; 16]) -> Option<[u32; 4]> {
    let w = [0, 1, 2, 3].map(|i| {
        u32::from_le_bytes([
            seed[4 * i],
            seed[4 * i + 1],
            seed[4 * i + 2],
            seed[4 * i + 3],
        ])
    });
    (w != [0; 4]).then_some(w)
}

const DEFAULT_STATE: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];

/// Hash `name` with algorithm `version` (0..=5) and `seed`. `None` for
/// an unknown version (and for siphash, which needs casefolding and is not
/// supported). This is e2fsprogs' `ext2fs_dirhash`: the major hash has its
/// low bit cleared. See [`kernel_major`] for the kernel's one extra rule.
pub fn dirhash(version: u8, name: &[u8], seed: &[u8; 16]) -> Option<DxHash> {
    let mut buf = seed_words(seed).unwrap_or(DEFAULT_STATE);
    let unsigned = matches!(
        version,
        DX_HASH_LEGACY_UNSIGNED | DX_HASH_HALF_MD4_UNSIGNED | DX_HASH_TEA_UNSIGNED
    );
    let (major, minor) = match version {
        DX_HASH_LEGACY | DX_HASH_LEGACY_UNSIGNED => (dx_hack_hash(name, unsigned), 0),
        DX_HASH_HALF_MD4 | DX_HASH_HALF_MD4_UNSIGNED => {
            let mut in_ = [0u32; 8];
            let mut p = name;
            while !p.is_empty() {
                str2hashbuf(p, &mut in_, unsigned);
                half_md4_transform(&mut buf, &in_);
                p = &p[p.len().min(32)..];
            }
            (buf[1], buf[2])
        }
        DX_HASH_TEA | DX_HASH_TEA_UNSIGNED => {
            let mut in_ = [0u32; 4];
            let mut p = name;
            while !p.is_empty() {
                str2hashbuf(p, &mut in_, unsigned);
                tea_transform(&mut buf, &in_);
                p = &p[p.len().min(16)..];
            }
            (buf[0], buf[1])
        }
        _ => return None,
    };
    Some(DxHash {
        major: major & !1,
        minor,
    })
}

/// The kernel's major hash (`ext4fs_dirhash`): e2fsprogs' value, except
/// that the 32-bit EOF marker `0x7fffffff << 1` is moved one step down so
/// that no name hashes to the end-of-directory cookie.
pub fn kernel_major(h: DxHash) -> u32 {
    if h.major == HTREE_EOF_32BIT << 1 {
        (HTREE_EOF_32BIT - 1) << 1
    } else {
        h.major
    }
}

fn char_value(b: u8, unsigned: bool) -> u32 {
    if unsigned {
        u32::from(b)
    } else {
        i32::from(b as i8) as u32
    }
}

fn dx_hack_hash(name: &[u8], unsigned: bool) -> u32 {
    let (mut hash0, mut hash1): (u32, u32) = (0x12a3_fe2d, 0x37ab_e8f9);
    for &b in name {
        let c = char_value(b, unsigned);
        let mut hash = hash1.wrapping_add(hash0 ^ c.wrapping_mul(7_152_373));
        if hash & 0x8000_0000 != 0 {
            hash = hash.wrapping_sub(0x7fff_ffff);
        }
        hash1 = hash0;
        hash0 = hash;
    }
    hash0 << 1
}

/// Pack up to `4 * out.len()` bytes of `msg` into words, padded with the
/// length pattern (the C code's `str2hashbuf`; `msg.len()` is the whole
/// remaining length, which the pad encodes).
fn str2hashbuf(msg: &[u8], out: &mut [u32], unsigned: bool) {
    let len = msg.len() as u32;
    let mut pad = len | (len << 8);
    pad |= pad << 16;
    let mut val = pad;
    let take = msg.len().min(out.len() * 4);
    let mut n = 0usize;
    for (i, &b) in msg[..take].iter().enumerate() {
        val = char_value(b, unsigned).wrapping_add(val << 8);
        if i % 4 == 3 {
            out[n] = val;
            n += 1;
            val = pad;
        }
    }
    if n < out.len() {
        out[n] = val;
        n += 1;
    }
    for w in &mut out[n..] {
        *w = pad;
    }
}

fn tea_transform(buf: &mut [u32; 4], in_: &[u32; 4]) {
    const DELTA: u32 = 0x9E37_79B9;
    let mut sum: u32 = 0;
    let (mut b0, mut b1) = (buf[0], buf[1]);
    let [a, b, c, d] = *in_;
    for _ in 0..16 {
        sum = sum.wrapping_add(DELTA);
        b0 = b0.wrapping_add(
            ((b1 << 4).wrapping_add(a)) ^ b1.wrapping_add(sum) ^ ((b1 >> 5).wrapping_add(b)),
        );
        b1 = b1.wrapping_add(
            ((b0 << 4).wrapping_add(c)) ^ b0.wrapping_add(sum) ^ ((b0 >> 5).wrapping_add(d)),
        );
    }
    buf[0] = buf[0].wrapping_add(b0);
    buf[1] = buf[1].wrapping_add(b1);
}

fn half_md4_transform(buf: &mut [u32; 4], x: &[u32; 8]) {
    fn f(x: u32, y: u32, z: u32) -> u32 {
        z ^ (x & (y ^ z))
    }
    fn g(x: u32, y: u32, z: u32) -> u32 {
        (x & y).wrapping_add((x ^ y) & z)
    }
    fn h(x: u32, y: u32, z: u32) -> u32 {
        x ^ y ^ z
    }
    const K2: u32 = 0o13240474631;
    const K3: u32 = 0o15666365641;
    let [mut a, mut b, mut c, mut d] = *buf;
    macro_rules! round {
        ($f:ident, $a:ident, $b:ident, $c:ident, $d:ident, $x:expr, $s:expr) => {
            $a = $a
                .wrapping_add($f($b, $c, $d))
                .wrapping_add($x)
                .rotate_left($s);
        };
    }
    round!(f, a, b, c, d, x[0], 3);
    round!(f, d, a, b, c, x[1], 7);
    round!(f, c, d, a, b, x[2], 11);
    round!(f, b, c, d, a, x[3], 19);
    round!(f, a, b, c, d, x[4], 3);
    round!(f, d, a, b, c, x[5], 7);
    round!(f, c, d, a, b, x[6], 11);
    round!(f, b, c, d, a, x[7], 19);

    round!(g, a, b, c, d, x[1].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[3].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[5].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[7].wrapping_add(K2), 13);
    round!(g, a, b, c, d, x[0].wrapping_add(K2), 3);
    round!(g, d, a, b, c, x[2].wrapping_add(K2), 5);
    round!(g, c, d, a, b, x[4].wrapping_add(K2), 9);
    round!(g, b, c, d, a, x[6].wrapping_add(K2), 13);

    round!(h, a, b, c, d, x[3].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[7].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[2].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[6].wrapping_add(K3), 15);
    round!(h, a, b, c, d, x[1].wrapping_add(K3), 3);
    round!(h, d, a, b, c, x[5].wrapping_add(K3), 9);
    round!(h, c, d, a, b, x[0].wrapping_add(K3), 11);
    round!(h, b, c, d, a, x[4].wrapping_add(K3), 15);

    buf[0] = buf[0].wrapping_add(a);
    buf[1] = buf[1].wrapping_add(b);
    buf[2] = buf[2].wrapping_add(c);
    buf[3] = buf[3].wrapping_add(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_value_from_debugfs() {
        // debugfs 1.47.0: dx_hash -h half_md4 -s 7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60 hello
        // "Hash of hello is 0xc71a1e0 (minor 0xd9cfc1d4)".
        let seed = uuid_bytes("7f3a9e21-4c5b-4d8e-a6f7-1b2c3d4e5f60");
        let h = dirhash(DX_HASH_HALF_MD4, b"hello", &seed).unwrap();
        assert_eq!(
            h,
            DxHash {
                major: 0x0c71_a1e0,
                minor: 0xd9cf_c1d4
            }
        );
    }

    #[test]
    fn unknown_versions_and_effective_version() {
        assert!(dirhash(DX_HASH_SIPHASH, b"x", &[0; 16]).is_none());
        assert!(dirhash(7, b"x", &[0; 16]).is_none());
        assert_eq!(effective_version(DX_HASH_TEA, true), DX_HASH_TEA_UNSIGNED);
        assert_eq!(effective_version(DX_HASH_TEA, false), DX_HASH_TEA);
        assert_eq!(
            kernel_major(DxHash {
                major: 0xffff_fffe,
                minor: 0
            }),
            0xffff_fffc
        );
    }

    fn uuid_bytes(s: &str) -> [u8; 16] {
        let hex: Vec<u8> = s.bytes().filter(|b| *b != b'-').collect();
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            let d = |c: u8| (c as char).to_digit(16).unwrap() as u8;
            *o = d(hex[2 * i]) << 4 | d(hex[2 * i + 1]);
        }
        out
    }
}
