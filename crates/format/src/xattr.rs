//! Extended attributes: the in-inode area (magic at `128 + i_extra_isize`,
//! entries right after it, values relative to the first entry), the
//! external block (32-byte header, entries from offset 32, values relative
//! to the block start), the entry and block hashes, and name prefixes.
//! Kernel `fs/ext4/xattr.{c,h}`.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `h_magic` of both the in-inode header and the block header.
pub const XATTR_MAGIC: u32 = 0xEA02_0000;
/// Size of the block header.
pub const BLOCK_HEADER_SIZE: usize = 32;
/// Size of the in-inode header (just the magic).
pub const IBODY_HEADER_SIZE: usize = 4;
/// Fixed part of an entry.
pub const ENTRY_HEADER_SIZE: usize = 16;

/// Name indexes (`e_name_index`) and the prefixes they stand for.
pub const INDEX_USER: u8 = 1;
pub const INDEX_POSIX_ACL_ACCESS: u8 = 2;
pub const INDEX_POSIX_ACL_DEFAULT: u8 = 3;
pub const INDEX_TRUSTED: u8 = 4;
pub const INDEX_LUSTRE: u8 = 5;
pub const INDEX_SECURITY: u8 = 6;
pub const INDEX_SYSTEM: u8 = 7;
pub const INDEX_RICHACL: u8 = 8;
pub const INDEX_ENCRYPTION: u8 = 9;
pub const INDEX_HURD: u8 = 10;

/// The prefix of a name index (the full name is prefix + suffix).
pub fn prefix(index: u8) -> Option<&'static str> {
    Some(match index {
        INDEX_USER => "user.",
        INDEX_POSIX_ACL_ACCESS => "system.posix_acl_access",
        INDEX_POSIX_ACL_DEFAULT => "system.posix_acl_default",
        INDEX_TRUSTED => "trusted.",
        INDEX_LUSTRE => "lustre.",
        INDEX_SECURITY => "security.",
        INDEX_SYSTEM => "system.",
        INDEX_RICHACL => "system.richacl",
        INDEX_ENCRYPTION => "c",
        INDEX_HURD => "gnu.",
        _ => return None,
    })
}

/// Longest name suffix (`e_name_len` is one byte; the kernel refuses
/// more with ERANGE).
pub const NAME_MAX: usize = 255;
/// Largest value the VFS passes (`XATTR_SIZE_MAX`; more is E2BIG).
pub const SIZE_MAX: usize = 65536;
/// Largest `h_refcount` the kernel lets a shared block reach
/// (`EXT4_XATTR_REFCOUNT_MAX`).
pub const REFCOUNT_MAX: u32 = 1024;

/// `EXT4_XATTR_MIN_LARGE_EA_SIZE`: with ea_inode, padded values larger
/// than this go to an EA inode.
pub const fn min_large_ea_size(block_size: usize) -> usize {
    block_size - entry_size(3) - BLOCK_HEADER_SIZE - 4
}

/// `EXT4_XATTR_BLOCK_RESERVE`: with ea_inode, the space a block keeps free
/// for entries.
pub const fn block_reserve(block_size: usize) -> usize {
    let r = block_size / 8;
    if r < 1024 { r } else { 1024 }
}

/// The name index and suffix ext4 stores a full attribute name under, for
/// the namespaces the kernel lets setxattr write: `user.`, `trusted.`,
/// `security.`, and the two POSIX ACL names (whose suffix is empty).
/// `None` for anything else (`system.data`, `gnu.`, unknown prefixes).
pub fn split_name(full: &[u8]) -> Option<(u8, &[u8])> {
    if full == b"system.posix_acl_access" {
        return Some((INDEX_POSIX_ACL_ACCESS, b""));
    }
    if full == b"system.posix_acl_default" {
        return Some((INDEX_POSIX_ACL_DEFAULT, b""));
    }
    for (index, p) in [
        (INDEX_USER, &b"user."[..]),
        (INDEX_TRUSTED, b"trusted."),
        (INDEX_SECURITY, b"security."),
    ] {
        if let Some(rest) = full.strip_prefix(p) {
            return Some((index, rest));
        }
    }
    None
}

/// `struct ext4_xattr_header` (external block).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct XattrHeader {
    pub h_magic: U32,
    pub h_refcount: U32,
    pub h_blocks: U32,
    pub h_hash: U32,
    pub h_checksum: U32,
    pub h_reserved: [U32; 3],
}

/// `struct ext4_xattr_entry` (the name follows, padded to 4 bytes).
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct XattrEntry {
    pub e_name_len: u8,
    pub e_name_index: u8,
    pub e_value_offs: U16,
    pub e_value_inum: U32,
    pub e_value_size: U32,
    pub e_hash: U32,
}

const _: () = assert!(size_of::<XattrHeader>() == BLOCK_HEADER_SIZE);
const _: () = assert!(size_of::<XattrEntry>() == ENTRY_HEADER_SIZE);

/// Size of an entry with a name of `name_len` bytes.
pub const fn entry_size(name_len: usize) -> usize {
    (ENTRY_HEADER_SIZE + name_len + 3) & !3
}

/// Values are padded to this.
pub const fn value_size_padded(len: usize) -> usize {
    (len + 3) & !3
}

/// One parsed entry: where its value is (offset relative to the area's
/// value base) and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    pub name_index: u8,
    pub name: Vec<u8>,
    pub value_offs: u16,
    pub value_inum: u32,
    pub value_size: u32,
    pub hash: u32,
    /// Offset of the entry in the area.
    pub offset: usize,
}

impl RawEntry {
    /// The full attribute name (`user.foo`), `None` for an unknown index.
    pub fn full_name(&self) -> Option<Vec<u8>> {
        let mut n = prefix(self.name_index)?.as_bytes().to_vec();
        n.extend_from_slice(&self.name);
        Some(n)
    }
}

/// Parse the entry list that starts at `start` of `area` and ends with a
/// zero word (or at `area.len()`, with at least 4 bytes to spare, as the
/// kernel requires). Returns the entries and the offset just past the
/// terminating word.
pub fn parse_entries(area: &[u8], start: usize) -> Result<(Vec<RawEntry>, usize), &'static str> {
    let mut out = Vec::new();
    let mut off = start;
    loop {
        let word = area
            .get(off..off + 4)
            .ok_or("entry list runs past its area")?;
        if word == [0, 0, 0, 0] {
            return Ok((out, off + 4));
        }
        let e = XattrEntry::read_from_prefix(&area[off..])
            .map_err(|_| "entry runs past its area")?
            .0;
        let nl = usize::from(e.e_name_len);
        let size = entry_size(nl);
        let name = area
            .get(off + ENTRY_HEADER_SIZE..off + ENTRY_HEADER_SIZE + nl)
            .ok_or("entry name runs past its area")?;
        if off + size > area.len() {
            return Err("entry runs past its area");
        }
        out.push(RawEntry {
            name_index: e.e_name_index,
            name: name.to_vec(),
            value_offs: e.e_value_offs.get(),
            value_inum: e.e_value_inum.get(),
            value_size: e.e_value_size.get(),
            hash: e.e_hash.get(),
            offset: off,
        });
        off += size;
    }
}

const NAME_HASH_SHIFT: u32 = 5;
const VALUE_HASH_SHIFT: u32 = 16;
const BLOCK_HASH_SHIFT: u32 = 16;

/// `ext4_xattr_hash_entry`: over the name (without prefix; unsigned chars)
/// and the value as little-endian words (zero-padded to 4 bytes).
pub fn entry_hash(name: &[u8], value: &[u8]) -> u32 {
    entry_hash_with(name, value, false)
}

/// The variant old kernels computed with signed chars
/// (`ext4_xattr_hash_entry_signed`); the kernel still accepts it.
pub fn entry_hash_signed(name: &[u8], value: &[u8]) -> u32 {
    entry_hash_with(name, value, true)
}

fn entry_hash_with(name: &[u8], value: &[u8], signed: bool) -> u32 {
    let mut hash: u32 = 0;
    for &b in name {
        let c = if signed {
            i32::from(b as i8) as u32
        } else {
            u32::from(b)
        };
        hash = (hash << NAME_HASH_SHIFT) ^ (hash >> (32 - NAME_HASH_SHIFT)) ^ c;
    }
    for chunk in value.chunks(4) {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        hash =
            (hash << VALUE_HASH_SHIFT) ^ (hash >> (32 - VALUE_HASH_SHIFT)) ^ u32::from_le_bytes(w);
    }
    hash
}

/// `ext4_xattr_rehash`: the block hash from the entries' hashes (0 when
/// any entry hash is 0).
pub fn block_hash(entry_hashes: impl IntoIterator<Item = u32>) -> u32 {
    let mut hash: u32 = 0;
    for h in entry_hashes {
        if h == 0 {
            return 0;
        }
        hash = (hash << BLOCK_HASH_SHIFT) ^ (hash >> (32 - BLOCK_HASH_SHIFT)) ^ h;
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_one_entry() {
        let mut a = vec![0u8; 64];
        a[0] = 3; // name_len
        a[1] = INDEX_USER;
        a[2..4].copy_from_slice(&40u16.to_le_bytes());
        a[8..12].copy_from_slice(&5u32.to_le_bytes());
        a[16..19].copy_from_slice(b"abc");
        let (e, end) = parse_entries(&a, 0).unwrap();
        assert_eq!(end, 24);
        assert_eq!(e[0].full_name().unwrap(), b"user.abc");
        assert_eq!(e[0].value_size, 5);
        assert!(parse_entries(&a[..20], 0).is_err());
    }

    #[test]
    fn hashes() {
        // A value of "hello" under "abc", checked by hand against the
        // kernel's formula.
        let h = entry_hash(b"abc", b"hello");
        let mut x: u32 = 0;
        for c in b"abc" {
            x = (x << 5) ^ (x >> 27) ^ u32::from(*c);
        }
        for w in [u32::from_le_bytes(*b"hell"), u32::from(b'o')] {
            x = (x << 16) ^ (x >> 16) ^ w;
        }
        assert_eq!(h, x);
        assert_eq!(entry_hash(b"abc", b""), entry_hash_signed(b"abc", b""));
        assert_ne!(entry_hash(&[0xC3], b""), entry_hash_signed(&[0xC3], b""));
        assert_eq!(block_hash([1, 0, 2]), 0);
        assert_eq!(block_hash([1]), 1);
    }
}
