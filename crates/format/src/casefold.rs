//! Casefolded names (the `casefold` feature, `s_encoding` utf8-12.1):
//! what a casefolded directory hashes and compares instead of the bytes of
//! a name.
//!
//! The rule is e2fsprogs' and the kernel's `utf8_casefold` ("nfdicf"):
//! Unicode normalization form D, Default_Ignorable_Code_Point removed, full
//! case folding (CaseFolding.txt statuses C and F), as the canonical
//! caseless form NFD(fold(NFD(name))). A name that is not valid UTF-8 has
//! no folded form: it is hashed and compared as its bytes (the kernel's
//! "opaque sequence"), and refused in strict mode.
//!
//! The tables are the `unicode-normalization` and `caseless` crates',
//! newer than the 12.1 the on-disk encoding names; the two differ only for
//! code points assigned after Unicode 12.1 (the kernel leaves those as they
//! are), which names rarely hold.

use caseless::Caseless;
use unicode_normalization::UnicodeNormalization;

/// `s_encoding` of utf8-12.1 (`EXT4_ENC_UTF8_12_1`).
pub const ENC_UTF8_12_1: u16 = 1;
/// `s_encoding_flags`: refuse names that are not valid UTF-8.
pub const ENC_STRICT_MODE_FL: u16 = 1;

/// Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 12.1):
/// removed before folding, as e2fsprogs 1.47's tables remove them.
const IGNORABLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
];

fn ignorable(c: char) -> bool {
    let c = u32::from(c);
    IGNORABLE.iter().any(|&(a, b)| (a..=b).contains(&c))
}

/// The folded form of `name`, or `None` when it is not valid UTF-8.
pub fn fold(name: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(name).ok()?;
    let folded: String = s
        .nfd()
        .filter(|&c| !ignorable(c))
        .default_case_fold()
        .nfd()
        .collect();
    Some(folded.into_bytes())
}

/// Whether `name` may be created in a casefolded directory of a
/// filesystem with `s_encoding_flags` `flags`.
pub fn allowed(name: &[u8], flags: u16) -> bool {
    flags & ENC_STRICT_MODE_FL == 0 || std::str::from_utf8(name).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_case_decomposes_and_drops_ignorables() {
        assert_eq!(fold(b"ABC").unwrap(), b"abc");
        // U+00C5 and U+212B (ANGSTROM SIGN) fold to a + U+030A.
        assert_eq!(fold("Å".as_bytes()), fold("å".as_bytes()));
        assert_eq!(fold("\u{212B}".as_bytes()).unwrap(), "a\u{30A}".as_bytes());
        // Full folding: ß is ss.
        assert_eq!(fold("STRASSE".as_bytes()), fold("straße".as_bytes()));
        // A zero-width space is ignored.
        assert_eq!(fold("a\u{200B}b".as_bytes()), fold(b"ab"));
        assert_ne!(fold(b"a"), fold(b"b"));
        // Not UTF-8: no folded form.
        assert_eq!(fold(b"\xff"), None);
        assert!(allowed(b"\xff", 0));
        assert!(!allowed(b"\xff", ENC_STRICT_MODE_FL));
    }
}
