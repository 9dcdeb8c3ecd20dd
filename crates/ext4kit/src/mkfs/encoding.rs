//! Filename encodings for `-O casefold` (`s_encoding`, `s_encoding_flags`),
//! as e2fsprogs 1.47.0's lib/e2p/encoding.c names and parses them.

/// `EXT4_ENC_UTF8_12_1`: the one encoding ext4 knows.
pub const ENC_UTF8_12_1: u16 = 1;
/// `EXT4_ENC_STRICT_MODE_FL`: refuse invalid UTF-8 names.
pub const ENC_STRICT_MODE_FL: u16 = 1;

/// `e2p_str2encoding`: the magic number of an encoding name (exact,
/// case-sensitive match).
pub fn str2encoding(name: &str) -> Option<u16> {
    match name {
        "utf8-12.1" | "utf8" => Some(ENC_UTF8_12_1),
        _ => None,
    }
}

/// `e2p_get_encoding_flags`: the default flags of an encoding (0 for
/// utf8, and for unknown ones).
pub fn default_flags(_encoding: u16) -> u16 {
    0
}

/// `e2p_str2encoding_flags`: apply `strict`/`nostrict` words separated by
/// `-` (strtok: empty words are skipped) to `flags`. `None` for an
/// unknown word or an encoding other than utf8.
pub fn str2encoding_flags(encoding: u16, param: &str, flags: u16) -> Option<u16> {
    if encoding != ENC_UTF8_12_1 {
        return None;
    }
    let mut flags = flags;
    for word in param.split('-').filter(|w| !w.is_empty()) {
        let (neg, name) = match word.strip_prefix("no") {
            Some(rest) => (true, rest),
            None => (false, word),
        };
        if name != "strict" {
            return None;
        }
        if neg {
            flags &= !ENC_STRICT_MODE_FL;
        } else {
            flags |= ENC_STRICT_MODE_FL;
        }
    }
    Some(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_flags_like_e2p() {
        assert_eq!(str2encoding("utf8"), Some(1));
        assert_eq!(str2encoding("utf8-12.1"), Some(1));
        assert_eq!(str2encoding("UTF8"), None);
        assert_eq!(str2encoding("utf8-12"), None);
        assert_eq!(str2encoding_flags(1, "strict", 0), Some(1));
        assert_eq!(str2encoding_flags(1, "strict-nostrict", 0), Some(0));
        assert_eq!(str2encoding_flags(1, "nostrict", 1), Some(0));
        assert_eq!(str2encoding_flags(1, "--strict-", 0), Some(1));
        assert_eq!(str2encoding_flags(1, "", 0), Some(0));
        assert_eq!(str2encoding_flags(1, "strict,x", 0), None);
        assert_eq!(str2encoding_flags(1, "bogus", 0), None);
        assert_eq!(str2encoding_flags(2, "strict", 0), None);
    }
}
