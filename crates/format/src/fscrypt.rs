//! fscrypt without keys: the inode flags, and the "no-key" names the
//! kernel shows for an encrypted directory's entries when the key is absent
//! (`fs/crypto/fname.c`, kernel 5.15 and later).
//!
//! A no-key name is the base64url encoding (RFC 4648 alphabet `A-Za-z0-9-_`,
//! no padding) of a `fscrypt_nokey_name`: the entry's directory hash and
//! minor hash as two little-endian words, then the ciphertext name if it
//! fits in 149 bytes; a longer one gives its first 149 bytes and the
//! SHA-256 of the rest (189 bytes, 252 characters). A lookup decodes the
//! name: a short form carries the whole on-disk name (its hash words are
//! not needed to match); a long form matches an entry by prefix and digest.

/// `EXT4_ENCRYPT_FL`: the inode's contents and (for a directory) its
/// entries' names are encrypted; the policy is the `c` xattr (index 9).
pub const ENCRYPT_FL: u32 = 0x800;
/// `EXT4_VERITY_FL`: an fs-verity file (read-only; the Merkle tree and
/// descriptor are stored past i_size).
pub const VERITY_FL: u32 = 0x10_0000;

/// Bytes of ciphertext a no-key name carries whole.
pub const NOKEY_BYTES: usize = 149;
/// The long form's length in bytes: hash words, prefix, SHA-256.
pub const NOKEY_MAX: usize = 8 + NOKEY_BYTES + 32;

/// A decoded no-key name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoKeyName {
    /// The whole on-disk name.
    Full(Vec<u8>),
    /// A longer name: its hash words, first [`NOKEY_BYTES`] bytes and the
    /// SHA-256 of the rest.
    Long {
        hash: u32,
        minor_hash: u32,
        prefix: Vec<u8>,
        digest: [u8; 32],
    },
}

impl NoKeyName {
    /// Does on-disk name `disk` match (the kernel's `fscrypt_match_name`)?
    pub fn matches(&self, disk: &[u8]) -> bool {
        match self {
            NoKeyName::Full(n) => n == disk,
            NoKeyName::Long { prefix, digest, .. } => {
                disk.len() > NOKEY_BYTES
                    && disk[..NOKEY_BYTES] == prefix[..]
                    && sha256(&disk[NOKEY_BYTES..]) == *digest
            }
        }
    }
}

/// The no-key name of on-disk name `disk` with the hash words the
/// kernel's readdir passes (the entry's htree hash, or 0 and 0 for a
/// linear directory).
pub fn nokey_name(disk: &[u8], hash: u32, minor_hash: u32) -> Vec<u8> {
    let mut raw = Vec::with_capacity(NOKEY_MAX);
    raw.extend_from_slice(&hash.to_le_bytes());
    raw.extend_from_slice(&minor_hash.to_le_bytes());
    if disk.len() <= NOKEY_BYTES {
        raw.extend_from_slice(disk);
    } else {
        raw.extend_from_slice(&disk[..NOKEY_BYTES]);
        raw.extend_from_slice(&sha256(&disk[NOKEY_BYTES..]));
    }
    base64url_encode(&raw)
}

/// Decode a name given for an encrypted directory without its key
/// (`fscrypt_setup_filename`'s no-key branch). `None` for a name that no
/// entry can have (the kernel's ENOENT).
pub fn decode_nokey_name(name: &[u8]) -> Option<NoKeyName> {
    if name.len() > base64url_len(NOKEY_MAX) {
        return None;
    }
    let raw = base64url_decode(name)?;
    let n = raw.len();
    if n < 9 || (n > 8 + NOKEY_BYTES && n != NOKEY_MAX) {
        return None;
    }
    if n != NOKEY_MAX {
        return Some(NoKeyName::Full(raw[8..].to_vec()));
    }
    let word = |i: usize| u32::from_le_bytes([raw[i], raw[i + 1], raw[i + 2], raw[i + 3]]);
    let mut digest = [0u8; 32];
    digest.copy_from_slice(&raw[8 + NOKEY_BYTES..]);
    Some(NoKeyName::Long {
        hash: word(0),
        minor_hash: word(4),
        prefix: raw[8..8 + NOKEY_BYTES].to_vec(),
        digest,
    })
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Characters of the base64url encoding of `n` bytes (no padding).
pub fn base64url_len(n: usize) -> usize {
    (n * 4).div_ceil(3)
}

/// Base64url without padding, as `fscrypt_base64url_encode`.
pub fn base64url_encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(base64url_len(src.len()));
    let (mut ac, mut bits) = (0u32, 0u32);
    for &b in src {
        ac = (ac << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(B64[((ac >> bits) & 0x3f) as usize]);
        }
        ac &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(B64[((ac << (6 - bits)) & 0x3f) as usize]);
    }
    out
}

/// The inverse of [`base64url_encode`]; `None` for a character outside the
/// alphabet or nonzero leftover bits (as `fscrypt_base64url_decode`).
pub fn base64url_decode(src: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(src.len() * 3 / 4);
    let (mut ac, mut bits) = (0u32, 0u32);
    for &c in src {
        let v = B64.iter().position(|&x| x == c)? as u32;
        ac = (ac << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((ac >> bits) as u8);
        }
        ac &= (1 << bits) - 1;
    }
    if ac != 0 || bits >= 6 {
        return None;
    }
    Some(out)
}

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// SHA-256 (FIPS 180-4) of `data`: the long no-key name's digest.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 64];
        for (i, c) in chunk.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, v) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn sha256_known_answers() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(
            hex(&sha256(long)),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn base64url_round_trips_and_rejects() {
        for n in 0..40usize {
            let v: Vec<u8> = (0..n as u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            let e = base64url_encode(&v);
            assert_eq!(e.len(), base64url_len(n));
            assert_eq!(base64url_decode(&e).as_deref(), Some(&v[..]));
        }
        assert_eq!(base64url_encode(b"\xfb\xff"), b"-_8");
        assert_eq!(base64url_decode(b"a+b"), None);
        // Leftover bits must be zero.
        assert_eq!(base64url_decode(b"-_9"), None);
        assert_eq!(base64url_decode(b"A"), None);
    }

    #[test]
    fn nokey_names_short_and_long() {
        let short = vec![7u8; 32];
        let n = nokey_name(&short, 0x1234, 0x5678);
        assert_eq!(decode_nokey_name(&n), Some(NoKeyName::Full(short.clone())));
        assert!(decode_nokey_name(&n).is_some_and(|d| d.matches(&short)));
        let long: Vec<u8> = (0..=254u8).collect();
        let n = nokey_name(&long, 1, 2);
        assert_eq!(n.len(), 252);
        let d = decode_nokey_name(&n).expect("long form");
        assert!(matches!(
            d,
            NoKeyName::Long {
                hash: 1,
                minor_hash: 2,
                ..
            }
        ));
        assert!(d.matches(&long));
        let mut other = long.clone();
        other[200] ^= 1;
        assert!(!d.matches(&other));
        assert!(!d.matches(&long[..150]));
        // Too short to hold a name, or between the two forms.
        assert_eq!(decode_nokey_name(&base64url_encode(&[0; 8])), None);
        assert_eq!(decode_nokey_name(&base64url_encode(&[0; 170])), None);
        assert_eq!(decode_nokey_name(b"plain.txt"), None);
    }
}
