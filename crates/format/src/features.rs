//! Typed feature flags of the three superblock feature words, and the
//! e2fsprogs spelling of each (as `-O` and dumpe2fs use them).

macro_rules! flag_word {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $val:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name(pub u32);
        impl $name {
            $($(#[$fm])* pub const $flag: Self = Self($val);)*
            pub const fn empty() -> Self { Self(0) }
            pub const fn bits(self) -> u32 { self.0 }
            pub const fn contains(self, other: Self) -> bool { self.0 & other.0 == other.0 }
            pub fn insert(&mut self, other: Self) { self.0 |= other.0 }
            pub fn remove(&mut self, other: Self) { self.0 &= !other.0 }
            pub fn set(&mut self, other: Self, on: bool) { if on { self.insert(other) } else { self.remove(other) } }
        }
        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, o: Self) -> Self { Self(self.0 | o.0) }
        }
    };
}

flag_word!(
    /// `s_feature_compat`.
    Compat {
        DIR_PREALLOC = 0x1,
        IMAGIC_INODES = 0x2,
        HAS_JOURNAL = 0x4,
        EXT_ATTR = 0x8,
        RESIZE_INODE = 0x10,
        DIR_INDEX = 0x20,
        LAZY_BG = 0x40,
        EXCLUDE_BITMAP = 0x100,
        SPARSE_SUPER2 = 0x200,
        FAST_COMMIT = 0x400,
        STABLE_INODES = 0x800,
        ORPHAN_FILE = 0x1000,
    }
);

flag_word!(
    /// `s_feature_incompat`.
    Incompat {
        COMPRESSION = 0x1,
        FILETYPE = 0x2,
        RECOVER = 0x4,
        JOURNAL_DEV = 0x8,
        META_BG = 0x10,
        EXTENTS = 0x40,
        BIT64 = 0x80,
        MMP = 0x100,
        FLEX_BG = 0x200,
        EA_INODE = 0x400,
        DIRDATA = 0x1000,
        CSUM_SEED = 0x2000,
        LARGEDIR = 0x4000,
        INLINE_DATA = 0x8000,
        ENCRYPT = 0x10000,
        CASEFOLD = 0x20000,
    }
);

flag_word!(
    /// `s_feature_ro_compat`.
    RoCompat {
        SPARSE_SUPER = 0x1,
        LARGE_FILE = 0x2,
        BTREE_DIR = 0x4,
        HUGE_FILE = 0x8,
        GDT_CSUM = 0x10,
        DIR_NLINK = 0x20,
        EXTRA_ISIZE = 0x40,
        HAS_SNAPSHOT = 0x80,
        QUOTA = 0x100,
        BIGALLOC = 0x200,
        METADATA_CSUM = 0x400,
        REPLICA = 0x800,
        READONLY = 0x1000,
        PROJECT = 0x2000,
        SHARED_BLOCKS = 0x4000,
        VERITY = 0x8000,
        ORPHAN_PRESENT = 0x10000,
    }
);

/// All three feature words together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub compat: Compat,
    pub incompat: Incompat,
    pub ro_compat: RoCompat,
}

/// Which word a named feature lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    Compat,
    Incompat,
    RoCompat,
}

/// Feature names as e2fsprogs spells them (lib/e2p/feature.c), with aliases.
pub const FEATURE_NAMES: &[(&str, Word, u32)] = &[
    ("dir_prealloc", Word::Compat, 0x1),
    ("imagic_inodes", Word::Compat, 0x2),
    ("has_journal", Word::Compat, 0x4),
    ("ext_attr", Word::Compat, 0x8),
    ("resize_inode", Word::Compat, 0x10),
    ("dir_index", Word::Compat, 0x20),
    ("lazy_bg", Word::Compat, 0x40),
    ("snapshot_bitmap", Word::Compat, 0x100),
    ("sparse_super2", Word::Compat, 0x200),
    ("fast_commit", Word::Compat, 0x400),
    ("stable_inodes", Word::Compat, 0x800),
    ("orphan_file", Word::Compat, 0x1000),
    ("sparse_super", Word::RoCompat, 0x1),
    ("large_file", Word::RoCompat, 0x2),
    ("huge_file", Word::RoCompat, 0x8),
    ("uninit_bg", Word::RoCompat, 0x10),
    ("uninit_groups", Word::RoCompat, 0x10),
    ("dir_nlink", Word::RoCompat, 0x20),
    ("extra_isize", Word::RoCompat, 0x40),
    ("quota", Word::RoCompat, 0x100),
    ("bigalloc", Word::RoCompat, 0x200),
    ("metadata_csum", Word::RoCompat, 0x400),
    ("replica", Word::RoCompat, 0x800),
    ("read-only", Word::RoCompat, 0x1000),
    ("project", Word::RoCompat, 0x2000),
    ("shared_blocks", Word::RoCompat, 0x4000),
    ("verity", Word::RoCompat, 0x8000),
    ("orphan_present", Word::RoCompat, 0x10000),
    ("compression", Word::Incompat, 0x1),
    ("filetype", Word::Incompat, 0x2),
    ("needs_recovery", Word::Incompat, 0x4),
    ("journal_dev", Word::Incompat, 0x8),
    ("extent", Word::Incompat, 0x40),
    ("extents", Word::Incompat, 0x40),
    ("meta_bg", Word::Incompat, 0x10),
    ("64bit", Word::Incompat, 0x80),
    ("mmp", Word::Incompat, 0x100),
    ("flex_bg", Word::Incompat, 0x200),
    ("ea_inode", Word::Incompat, 0x400),
    ("dirdata", Word::Incompat, 0x1000),
    ("metadata_csum_seed", Word::Incompat, 0x2000),
    ("large_dir", Word::Incompat, 0x4000),
    ("inline_data", Word::Incompat, 0x8000),
    ("encrypt", Word::Incompat, 0x10000),
    ("casefold", Word::Incompat, 0x20000),
    ("fname_encoding", Word::Incompat, 0x20000),
];

impl Features {
    /// Look a feature up by its e2fsprogs name (case-insensitive), also
    /// accepting the generic `FEATURE_C12` / `FEATURE_I3` / `FEATURE_R5` form.
    pub fn lookup(name: &str) -> Option<(Word, u32)> {
        let lower = name.to_ascii_lowercase();
        if let Some(&(_, w, b)) = FEATURE_NAMES.iter().find(|(n, _, _)| *n == lower) {
            return Some((w, b));
        }
        let rest = lower.strip_prefix("feature_")?;
        let (w, num) = match rest.as_bytes().first()? {
            b'c' => (Word::Compat, &rest[1..]),
            b'i' => (Word::Incompat, &rest[1..]),
            b'r' => (Word::RoCompat, &rest[1..]),
            _ => return None,
        };
        let bit: u32 = num.parse().ok()?;
        (bit < 32).then(|| (w, 1u32 << bit))
    }

    /// Name of a single bit, for messages.
    pub fn name_of(word: Word, bit: u32) -> String {
        FEATURE_NAMES
            .iter()
            .find(|(_, w, b)| *w == word && *b == bit)
            .map(|(n, _, _)| (*n).to_string())
            .unwrap_or_else(|| {
                let c = match word {
                    Word::Compat => 'C',
                    Word::Incompat => 'I',
                    Word::RoCompat => 'R',
                };
                format!("FEATURE_{c}{}", bit.trailing_zeros())
            })
    }

    pub fn has(&self, word: Word, bit: u32) -> bool {
        self.word(word) & bit == bit
    }
    pub fn word(&self, word: Word) -> u32 {
        match word {
            Word::Compat => self.compat.0,
            Word::Incompat => self.incompat.0,
            Word::RoCompat => self.ro_compat.0,
        }
    }
    pub fn set(&mut self, word: Word, bit: u32, on: bool) {
        let w = match word {
            Word::Compat => &mut self.compat.0,
            Word::Incompat => &mut self.incompat.0,
            Word::RoCompat => &mut self.ro_compat.0,
        };
        if on { *w |= bit } else { *w &= !bit }
    }
    /// Either flavour of group-descriptor checksumming is on.
    pub fn has_group_csum(&self) -> bool {
        self.ro_compat.contains(RoCompat::METADATA_CSUM)
            || self.ro_compat.contains(RoCompat::GDT_CSUM)
    }
    pub fn metadata_csum(&self) -> bool {
        self.ro_compat.contains(RoCompat::METADATA_CSUM)
    }

    /// Names of every bit set, in e2fsprogs order (compat, incompat, ro_compat).
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for word in [Word::Compat, Word::Incompat, Word::RoCompat] {
            let w = self.word(word);
            for bit in 0..32 {
                if w & (1 << bit) != 0 {
                    out.push(Self::name_of(word, 1 << bit));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn lookup_names() {
        assert_eq!(
            Features::lookup("metadata_csum"),
            Some((Word::RoCompat, 0x400))
        );
        assert_eq!(Features::lookup("EXTENTS"), Some((Word::Incompat, 0x40)));
        assert_eq!(
            Features::lookup("FEATURE_C12"),
            Some((Word::Compat, 0x1000))
        );
        assert_eq!(Features::lookup("nonsense"), None);
        assert_eq!(Features::name_of(Word::Compat, 0x1000), "orphan_file");
    }
}
