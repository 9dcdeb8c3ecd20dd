//! mke2fs-compatible options, resolved against mke2fs.conf into the
//! planner's [`FsParams`] and the superblock [`SuperSettings`], the way
//! mke2fs's `PRS()` does. Everything is validated here, before any write.

use ext4kit_format::Features;
use ext4kit_format::features::{Compat, Incompat, RoCompat, Word};

use super::geometry::FsParams;
use super::writer::SuperSettings;
use crate::profile::Profile;

/// Options as the user gave them (mke2fs spelling).
#[derive(Clone, Debug, Default)]
pub struct MkfsOptions {
    pub fs_type: Option<String>,
    pub usage_types: Option<String>,
    /// `-b`: positive = exact, negative = minimum.
    pub block_size: Option<i64>,
    pub num_inodes: Option<u64>,
    pub inode_ratio: Option<u64>,
    pub inode_size: Option<u32>,
    pub reserved_ratio: Option<f64>,
    pub label: Option<String>,
    pub uuid: Option<String>,
    pub features: Vec<String>,
    pub extended: Vec<String>,
    pub journal: Vec<String>,
    /// `-j`
    pub add_journal: bool,
    pub flex_bg_size: Option<u32>,
    pub blocks_per_group: Option<u32>,
    pub mount_dir: Option<String>,
    pub creator_os: Option<String>,
    pub errors: Option<String>,
    /// FS-SIZE argument.
    pub fs_size: Option<String>,
}

/// What the options resolve to.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub params: FsParams,
    pub settings: SuperSettings,
    pub fs_types: Vec<String>,
    /// Discard the device before writing (`-E discard`, the default).
    pub discard: bool,
    /// The user promised the storage reads as zero.
    pub assume_prezeroed: bool,
    pub warnings: Vec<String>,
}

/// A user error: one line naming the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionError(pub String);

fn err<T>(s: impl Into<String>) -> Result<T, OptionError> {
    Err(OptionError(s.into()))
}

/// `parse_num_blocks2`: a number with an optional K/M/G/T/s suffix, in
/// blocks of `1024 << log_block_size`.
pub fn parse_num_blocks(arg: &str, log_block_size: u32) -> Option<u64> {
    let arg = arg.trim();
    let split = arg
        .find(|c: char| !(c.is_ascii_hexdigit() || c == 'x' || c == 'X'))
        .unwrap_or(arg.len());
    // Hex digits include 'b'..'f'; only accept hex with a 0x prefix.
    let (digits, suffix) = if arg.starts_with("0x") || arg.starts_with("0X") {
        arg.split_at(split)
    } else {
        let s = arg.find(|c: char| !c.is_ascii_digit()).unwrap_or(arg.len());
        arg.split_at(s)
    };
    let num: u64 = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(h, 16).ok()?
    } else {
        digits.parse().ok()?
    };
    let shift = |n: u64, s: u32| n.checked_shl(s).filter(|v| v >> s == n);
    let v = match suffix {
        "" => num,
        "T" | "t" => shift(num, 40)? >> (10 + log_block_size),
        "G" | "g" => shift(num, 30)? >> (10 + log_block_size),
        "M" | "m" => shift(num, 20)? >> (10 + log_block_size),
        "K" | "k" => num >> log_block_size,
        "s" => num >> (1 + log_block_size),
        _ => return None,
    };
    Some(v)
}

/// Parse a UUID in the usual 8-4-4-4-12 form.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    uuid::Uuid::try_parse(s)
        .ok()
        .filter(|_| s.len() == 36)
        .map(|u| *u.as_bytes())
}

/// Features ext4kit can format today.
fn unsupported_features(f: &Features) -> Vec<String> {
    let bad_compat = Compat::SPARSE_SUPER2.bits()
        | Compat::FAST_COMMIT.bits()
        | Compat::LAZY_BG.bits()
        | Compat::EXCLUDE_BITMAP.bits()
        | Compat::DIR_PREALLOC.bits()
        | Compat::IMAGIC_INODES.bits();
    let bad_incompat = Incompat::COMPRESSION.bits()
        | Incompat::RECOVER.bits()
        | Incompat::JOURNAL_DEV.bits()
        | Incompat::META_BG.bits()
        | Incompat::MMP.bits()
        | Incompat::EA_INODE.bits()
        | Incompat::DIRDATA.bits()
        | Incompat::LARGEDIR.bits()
        | Incompat::INLINE_DATA.bits()
        | Incompat::ENCRYPT.bits()
        | Incompat::CASEFOLD.bits();
    let bad_ro = RoCompat::QUOTA.bits()
        | RoCompat::BIGALLOC.bits()
        | RoCompat::REPLICA.bits()
        | RoCompat::READONLY.bits()
        | RoCompat::PROJECT.bits()
        | RoCompat::SHARED_BLOCKS.bits()
        | RoCompat::VERITY.bits()
        | RoCompat::ORPHAN_PRESENT.bits()
        | RoCompat::BTREE_DIR.bits()
        | RoCompat::HAS_SNAPSHOT.bits();
    let mut out = Vec::new();
    for (word, bad) in [
        (Word::Compat, bad_compat),
        (Word::Incompat, bad_incompat),
        (Word::RoCompat, bad_ro),
    ] {
        let w = f.word(word) & bad;
        for bit in 0..32 {
            if w & (1 << bit) != 0 {
                out.push(Features::name_of(word, 1 << bit));
            }
        }
    }
    out
}

/// Apply an e2p feature edit string ("feat,^feat,...").
pub fn edit_features(f: &mut Features, s: &str) -> Result<(), OptionError> {
    for tok in s.split([',', ' ', '\t']).filter(|t| !t.is_empty()) {
        let (on, name) = match tok.strip_prefix(['^', '-']) {
            Some(n) => (false, n),
            None => (true, tok.strip_prefix('+').unwrap_or(tok)),
        };
        if name.eq_ignore_ascii_case("none") || name.eq_ignore_ascii_case("clear") {
            *f = Features::default();
            continue;
        }
        let Some((word, bit)) = Features::lookup(name) else {
            return err(format!(
                "invalid filesystem option set: unknown feature '{name}'"
            ));
        };
        f.set(word, bit, on);
    }
    Ok(())
}

fn parse_bool_val(key: &str, v: Option<&str>) -> Result<bool, OptionError> {
    match v {
        None => Ok(true),
        Some(s) => match s.parse::<i64>() {
            Ok(n) => Ok(n != 0),
            Err(_) => err(format!("invalid value for extended option {key}: '{s}'")),
        },
    }
}

/// Environment facts the resolver needs (injected for tests).
#[derive(Clone, Debug)]
pub struct Env {
    /// Device size in bytes (`None` when the file does not exist yet).
    pub device_size: Option<u64>,
    /// The target is a regular file (it may grow to the requested size, as
    /// with mke2fs); block devices may not be exceeded.
    pub is_regular_file: bool,
    pub logical_sector_size: u32,
    /// Seconds since the epoch to stamp (E2FSPROGS_FAKE_TIME etc.).
    pub now: u32,
    pub page_size: u32,
    pub uid: u32,
    pub gid: u32,
    /// Kernel supports lazy itable init.
    pub kernel_lazy_itable_init: bool,
}

/// Resolve options into planner parameters. No I/O except what `env`
/// already captured; random UUIDs come from the `uuid` crate.
pub fn resolve(opts: &MkfsOptions, profile: &Profile, env: &Env) -> Result<Resolved, OptionError> {
    let mut warnings = Vec::new();
    // -b
    let mut blocksize: i64 = 0;
    if let Some(b) = opts.block_size {
        let a = b.unsigned_abs();
        if !(1024..=65536).contains(&a) || !a.is_power_of_two() {
            return err(format!("invalid block size - {b}"));
        }
        blocksize = b;
    }
    let log_bs_hint = if blocksize > 0 {
        (blocksize as u64 / 1024).trailing_zeros()
    } else {
        0
    };
    let unit = 1024u64 << log_bs_hint;
    // Size.
    let explicit = match &opts.fs_size {
        Some(s) => match parse_num_blocks(s, log_bs_hint) {
            Some(n) if n > 0 => Some(n),
            _ => return err(format!("invalid blocks '{s}' on device")),
        },
        None => None,
    };
    let mut fs_blocks_count = match (explicit, env.device_size) {
        (Some(n), _) => n,
        (None, Some(0)) => return err("device size reported to be zero"),
        (None, Some(sz)) => {
            let mut n = sz / unit;
            let ratio = u64::from(env.page_size) / unit;
            if ratio > 1 {
                n &= !(ratio - 1);
            }
            n
        }
        (None, None) => return err("the file does not exist and no size was specified"),
    };
    if let (Some(n), Some(sz)) = (explicit, env.device_size)
        && !env.is_regular_file
        && n.saturating_mul(unit) > sz
    {
        return err(format!(
            "filesystem larger than apparent device size ({} > {} bytes)",
            n.saturating_mul(unit),
            sz
        ));
    }
    let types = profile
        .fs_types(
            opts.fs_type.as_deref(),
            opts.usage_types.as_deref(),
            fs_blocks_count,
            if blocksize > 0 { blocksize as u32 } else { 0 },
        )
        .map_err(|e| OptionError(e.to_string()))?;
    warnings.extend(types.warnings.iter().cloned());
    let fs_types = types.types.clone();
    // Features.
    let mut f = Features::default();
    let edits = profile.feature_edits(&fs_types);
    let user_features = opts.features.join(",");
    for e in edits.before_user(!opts.features.is_empty()) {
        edit_features(&mut f, &e)?;
    }
    let default_orphan = f.compat.contains(Compat::ORPHAN_FILE);
    let default_seed = f.incompat.contains(Incompat::CSUM_SEED);
    if !opts.features.is_empty() {
        edit_features(&mut f, &user_features)?;
    }
    if opts.add_journal || !opts.journal.is_empty() {
        f.compat.insert(Compat::HAS_JOURNAL);
    }
    if default_orphan && !f.compat.contains(Compat::HAS_JOURNAL) {
        f.compat.remove(Compat::ORPHAN_FILE);
    }
    if default_seed && !f.ro_compat.contains(RoCompat::METADATA_CSUM) {
        f.incompat.remove(Incompat::CSUM_SEED);
    }
    // Block size.
    if blocksize <= 0 {
        let mut use_bsize = profile.get_int(&fs_types, "blocksize", 4096);
        if use_bsize == -1 {
            use_bsize = i64::from(env.page_size);
        }
        if use_bsize < i64::from(env.logical_sector_size) {
            use_bsize = i64::from(env.logical_sector_size);
        }
        if blocksize < 0 && use_bsize < -blocksize {
            use_bsize = -blocksize;
        }
        if !(1024..=65536).contains(&use_bsize) || (use_bsize as u64).count_ones() != 1 {
            return err(format!("invalid block size {use_bsize} from mke2fs.conf"));
        }
        blocksize = use_bsize;
        fs_blocks_count /= blocksize as u64 / 1024;
    } else if (blocksize as u32) < env.logical_sector_size {
        return err("block size too small for device");
    }
    let bs = blocksize as u32;
    if bs > env.page_size {
        warnings.push(format!(
            "{bs}-byte blocks too big for system (max {})",
            env.page_size
        ));
    }
    const MAX_32: u64 = (1 << 32) - 1;
    if fs_blocks_count > MAX_32 && f.incompat.contains(Incompat::BIT64) {
        f.compat.remove(Compat::RESIZE_INODE);
    }
    if fs_blocks_count > MAX_32 && !f.incompat.contains(Incompat::BIT64) {
        return err(format!(
            "size of device ({fs_blocks_count} blocks) too big to be expressed in 32 bits using a blocksize of {bs}"
        ));
    }
    let log_bs = (bs / 1024).trailing_zeros();
    if fs_blocks_count > (1u64 << (log_bs + 10 + 3 + 32)) - 1 {
        return err(format!(
            "size of device ({fs_blocks_count} blocks) too big to create a filesystem"
        ));
    }
    let mut reserved_ratio = match opts.reserved_ratio {
        Some(r) => r,
        None => profile.get_double(&fs_types, "reserved_ratio", 5.0),
    };
    if !(0.0..=50.0).contains(&reserved_ratio) || reserved_ratio.is_nan() {
        return err(format!(
            "invalid reserved blocks percent - {reserved_ratio}"
        ));
    }
    if f.incompat.contains(Incompat::BIT64) && !f.incompat.contains(Incompat::EXTENTS) {
        return err("extents must be enabled for a 64-bit filesystem (pass -O extents)");
    }
    let mut inode_ratio = match opts.inode_ratio {
        Some(r) => {
            if !(1024..=(65536 * 1024)).contains(&r) {
                return err(format!(
                    "invalid inode ratio {r} (min 1024/max {})",
                    65536 * 1024
                ));
            }
            r
        }
        None => {
            let r = profile.get_int(&fs_types, "inode_ratio", 8192).max(0) as u64;
            r.max(u64::from(bs))
        }
    };
    if inode_ratio == 0 {
        inode_ratio = u64::from(bs);
    }
    // Defaults that the profile may change.
    let mut lazy_itable_init = env.kernel_lazy_itable_init;
    lazy_itable_init = profile.get_bool(&fs_types, "lazy_itable_init", lazy_itable_init);
    let mut discard = profile.get_bool(&fs_types, "discard", true);
    let mut lazy_journal_init = profile.get_bool(&fs_types, "lazy_journal_init", false);
    let mut packed_meta_blocks = profile.get_bool(&fs_types, "packed_meta_blocks", false);
    let mut assume_prezeroed = false;
    let mut stride = 0u32;
    let mut stripe_width = 0u32;
    let mut hash_seed: Option<[u8; 16]> = None;
    let mut root_uid = 0u32;
    let mut root_gid = 0u32;
    let mut resize: Option<u64> = None;
    let mut orphan_file_blocks: Option<u32> = None;
    let mut ext_list: Vec<String> = profile.options_list(&fs_types);
    ext_list.extend(opts.extended.iter().cloned());
    for ext in &ext_list {
        for tok in ext.split(',').filter(|t| !t.is_empty()) {
            let (k, v) = match tok.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (tok, None),
            };
            let need = |v: Option<&str>| -> Result<String, OptionError> {
                v.map(str::to_string)
                    .ok_or_else(|| OptionError(format!("extended option '{k}' needs a value")))
            };
            let num = |v: Option<&str>| -> Result<u64, OptionError> {
                let s = need(v)?;
                s.parse::<u64>().map_err(|_| {
                    OptionError(format!("invalid value for extended option {k}: '{s}'"))
                })
            };
            match k {
                "stride" => stride = num(v)? as u32,
                "stripe-width" | "stripe_width" => stripe_width = num(v)? as u32,
                "resize" => resize = Some(num(v)?),
                "packed_meta_blocks" => packed_meta_blocks = parse_bool_val(k, v)?,
                "lazy_itable_init" => lazy_itable_init = parse_bool_val(k, v)?,
                "lazy_journal_init" => lazy_journal_init = parse_bool_val(k, v)?,
                "assume_storage_prezeroed" => assume_prezeroed = parse_bool_val(k, v)?,
                "discard" => discard = true,
                "nodiscard" => discard = false,
                "hash_seed" => {
                    let s = need(v)?;
                    hash_seed = Some(
                        parse_uuid(&s)
                            .ok_or_else(|| OptionError(format!("invalid hash seed: {s}")))?,
                    );
                }
                "root_owner" => match v {
                    None => {
                        root_uid = env.uid;
                        root_gid = env.gid;
                    }
                    Some(s) => {
                        let parsed = s
                            .split_once(':')
                            .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
                        let Some((u, g)) = parsed else {
                            return err(format!("invalid root_owner: '{s}' (expected uid:gid)"));
                        };
                        root_uid = u;
                        root_gid = g;
                    }
                },
                "num_backup_sb" => {
                    let n = num(v)?;
                    if n > 2 {
                        return err(format!("invalid # of backup superblocks: {n}"));
                    }
                    // Without sparse_super2 mke2fs ignores it silently.
                }
                "orphan_file_size" => {
                    let s = need(v)?;
                    let n = parse_num_blocks(&s, log_bs)
                        .ok_or_else(|| OptionError(format!("invalid orphan file size: {s}")))?;
                    orphan_file_blocks = Some(n as u32);
                }
                "test_fs"
                | "desc_size"
                | "desc-size"
                | "mmp_update_interval"
                | "offset"
                | "quotatype"
                | "encoding"
                | "encoding_flags"
                | "android_sparse"
                | "nodirect_io"
                | "direct_io"
                | "no_copy_xattrs" => {
                    return err(format!(
                        "extended option '{k}' is not supported by ext4kit yet"
                    ));
                }
                _ => return err(format!("bad extended option: '{k}'")),
            }
        }
    }
    // mke2fs.conf's huge files (mk_hugefiles.c): refused by name.
    if profile.get_bool(&fs_types, "make_hugefiles", false) {
        let keys: Vec<&str> = [
            "hugefiles_dir",
            "hugefiles_name",
            "hugefiles_digits",
            "hugefiles_size",
            "hugefiles_slack",
            "hugefiles_align",
            "hugefiles_align_disk",
            "hugefiles_uid",
            "hugefiles_gid",
            "hugefiles_umask",
            "num_hugefiles",
            "zero_hugefiles",
        ]
        .into_iter()
        .filter(|k| profile.get_string(&fs_types, k).is_some())
        .collect();
        let with = if keys.is_empty() {
            String::new()
        } else {
            format!(" ({})", keys.join(", "))
        };
        return err(format!(
            "mke2fs.conf: make_hugefiles{with} is not supported by ext4kit yet"
        ));
    }
    if stride != 0 && !stripe_width.is_multiple_of(stride) {
        warnings.push(format!(
            "\nWarning: RAID stripe-width {stripe_width} not an even multiple of stride {stride}.\n"
        ));
    }
    if f.ro_compat.contains(RoCompat::METADATA_CSUM) && f.ro_compat.contains(RoCompat::GDT_CSUM) {
        f.ro_compat.remove(RoCompat::GDT_CSUM);
    }
    if f.compat.contains(Compat::RESIZE_INODE) && !f.ro_compat.contains(RoCompat::SPARSE_SUPER) {
        return err("reserved online resize blocks not supported on non-sparse filesystem");
    }
    if f.incompat.contains(Incompat::CSUM_SEED) && !f.ro_compat.contains(RoCompat::METADATA_CSUM) {
        return err("the metadata_csum_seed feature requires the metadata_csum feature");
    }
    if f.compat.contains(Compat::ORPHAN_FILE) && !f.compat.contains(Compat::HAS_JOURNAL) {
        return err("cannot set orphan_file feature without a journal");
    }
    let bad = unsupported_features(&f);
    if !bad.is_empty() {
        return err(format!(
            "feature(s) not supported by ext4kit yet: {}",
            bad.join(", ")
        ));
    }
    if let Some(g) = opts.blocks_per_group {
        if g < 256 || g > 8 * bs {
            return err("blocks per group count out of range");
        }
        if g % 8 != 0 {
            return err("blocks per group must be multiple of 8");
        }
    }
    let inode_size = match opts.inode_size {
        Some(i) => i as i64,
        None => profile.get_int(&fs_types, "inode_size", 0),
    };
    let inode_size: u32 = if inode_size == 0 {
        256
    } else {
        inode_size as u32
    };
    if !(128..=bs).contains(&inode_size) || !inode_size.is_power_of_two() {
        return err(format!(
            "invalid inode size {inode_size} (min 128/max {bs})"
        ));
    }
    if inode_size == 128 && profile.get_bool(&fs_types, "warn_y2038_dates", true) {
        warnings.push("128-byte inodes cannot handle dates beyond 2038 and are deprecated".into());
    }
    let mut log_flex = 0u8;
    if let Some(g) = opts.flex_bg_size {
        if !f.incompat.contains(Incompat::FLEX_BG) {
            return err("flex_bg feature not enabled, so flex_bg size may not be specified");
        }
        if g == 0 || !g.is_power_of_two() {
            return err(format!("flex_bg size must be a power of 2: {g}"));
        }
        if g > (1 << 31) {
            return err(format!(
                "flex_bg size ({g}) must be less than or equal to 2^31"
            ));
        }
        log_flex = g.trailing_zeros() as u8;
    } else if f.incompat.contains(Incompat::FLEX_BG) {
        let g = profile.get_uint(&fs_types, "flex_bg_size", 16) as u32;
        if g > 0 && g.is_power_of_two() {
            log_flex = g.trailing_zeros() as u8;
        }
    }
    // Inode count.
    let inodes = match opts.num_inodes {
        Some(n) => {
            if n > MAX_32 {
                return err(format!("too many inodes ({n}), specify < 2^32 inodes"));
            }
            n
        }
        None => {
            let n = fs_blocks_count.saturating_mul(u64::from(bs)) / inode_ratio;
            if n > MAX_32 {
                if f.incompat.contains(Incompat::BIT64) {
                    MAX_32
                } else {
                    return err(format!("too many inodes ({n}), raise inode ratio?"));
                }
            } else {
                n
            }
        }
    };
    if inodes.saturating_mul(u64::from(inode_size)) >= fs_blocks_count.saturating_mul(u64::from(bs))
    {
        return err(format!(
            "inode_size ({inode_size}) * inodes_count ({inodes}) too big for a filesystem with {fs_blocks_count} blocks, specify higher inode_ratio (-i) or lower inode count (-N)"
        ));
    }
    reserved_ratio = reserved_ratio.clamp(0.0, 50.0);
    let r_blocks = (reserved_ratio * fs_blocks_count as f64 / 100.0) as u64;
    // Journal size.
    let mut journal_blocks = None;
    for j in &opts.journal {
        for tok in j.split(',').filter(|t| !t.is_empty()) {
            let (k, v) = tok.split_once('=').unwrap_or((tok, ""));
            match k {
                "size" => {
                    let mb: u64 = v
                        .parse()
                        .map_err(|_| OptionError(format!("invalid journal size: '{v}'")))?;
                    let blocks = mb * 1024 / u64::from(bs / 1024);
                    if !(1024..=10_240_000).contains(&blocks) {
                        return err(format!(
                            "the total requested journal size is {blocks} blocks; it must be between 1024 and 10240000 blocks"
                        ));
                    }
                    journal_blocks = Some(blocks as u32);
                }
                "device" | "location" | "fast_commit_size" => {
                    return err(format!(
                        "journal option '{k}' is not supported by ext4kit yet"
                    ));
                }
                _ => return err(format!("bad journal option: '{k}'")),
            }
        }
    }
    if let Some(r) = resize {
        let _ = r;
        return err("extended option 'resize' is not supported by ext4kit yet");
    }
    // UUIDs.
    let uuid = match opts.uuid.as_deref() {
        None => *uuid::Uuid::new_v4().as_bytes(),
        Some(s) if s.eq_ignore_ascii_case("null") || s.eq_ignore_ascii_case("clear") => [0; 16],
        Some(s) if s.eq_ignore_ascii_case("random") || s.eq_ignore_ascii_case("time") => {
            *uuid::Uuid::new_v4().as_bytes()
        }
        Some(s) => {
            parse_uuid(s).ok_or_else(|| OptionError(format!("could not parse UUID: {s}")))?
        }
    };
    let hash_seed = hash_seed.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let hash_alg = profile
        .get_string(&fs_types, "hash_alg")
        .unwrap_or_else(|| "half_md4".into());
    let def_hash_version = match hash_alg.to_ascii_lowercase().as_str() {
        "legacy" => 0,
        "half_md4" => 1,
        "tea" => 2,
        _ => 1,
    };
    let mntopts = profile.default_mntopts(&fs_types);
    let mut default_mount_opts = 0u32;
    for o in mntopts.split([',', ' ']).filter(|s| !s.is_empty()) {
        default_mount_opts |= match o {
            "debug" => 0x1,
            "bsdgroups" => 0x2,
            "user_xattr" => 0x4,
            "acl" => 0x8,
            "uid16" => 0x10,
            "journal_data" => 0x20,
            "journal_data_ordered" => 0x40,
            "journal_data_writeback" => 0x60,
            "nobarrier" => 0x100,
            "block_validity" => 0x200,
            "discard" => 0x400,
            "nodelalloc" => 0x800,
            _ => return err(format!("invalid mount option set: {o}")),
        };
    }
    let mut label = [0u8; 16];
    if let Some(l) = &opts.label {
        if l.len() > 16 {
            // mke2fs's wording (and its blank line after).
            let cut = String::from_utf8_lossy(&l.as_bytes()[..16]).into_owned();
            warnings.push(format!(
                "Warning: label too long; will be truncated to '{cut}'\n"
            ));
        }
        let n = l.len().min(16);
        label[..n].copy_from_slice(&l.as_bytes()[..n]);
    }
    let mut last_mounted = [0u8; 64];
    if let Some(m) = &opts.mount_dir {
        let n = m.len().min(64);
        last_mounted[..n].copy_from_slice(&m.as_bytes()[..n]);
    }
    let creator_os = match opts.creator_os.as_deref().map(|s| s.to_ascii_lowercase()) {
        None => 0,
        Some(s) => match s.as_str() {
            "linux" => 0,
            "hurd" | "gnu" => return err("creator OS hurd is not supported by ext4kit"),
            "freebsd" => 3,
            "lites" => 4,
            _ => return err(format!("unknown os - {s}")),
        },
    };
    let errors = match opts.errors.as_deref() {
        None => match profile.get_string(&fs_types, "errors").as_deref() {
            None => 1,
            Some("continue") => 1,
            Some("remount-ro") => 2,
            Some("panic") => 3,
            Some(o) => return err(format!("invalid errors behavior in mke2fs.conf: {o}")),
        },
        Some("continue") => 1,
        Some("remount-ro") => 2,
        Some("panic") => 3,
        Some(o) => return err(format!("invalid -e argument: '{o}'")),
    };
    let enable_periodic = profile.get_bool(&fs_types, "enable_periodic_fsck", false);
    let (max_mnt_count, checkinterval) = if enable_periodic {
        let val: u32 = uuid.iter().map(|&b| u32::from(b)).sum();
        ((20 + (val % 20)) as u16, 86400 * 180)
    } else {
        (0xFFFF, 0)
    };
    if assume_prezeroed {
        lazy_itable_init = true;
        lazy_journal_init = true;
    }
    let params = FsParams {
        blocks_count: fs_blocks_count,
        block_size: bs,
        inode_size: inode_size as u16,
        inodes_count: inodes,
        features: f,
        log_groups_per_flex: log_flex,
        blocks_per_group: opts.blocks_per_group.unwrap_or(0),
        r_blocks_count: r_blocks,
        reserved_gdt_blocks: None,
        journal_blocks,
        orphan_file_blocks,
        stride,
        packed_meta_blocks,
        root_uid,
        root_gid,
        itable_zeroed: assume_prezeroed,
        lazy_itable_init,
    };
    let settings = SuperSettings {
        uuid,
        hash_seed,
        now: env.now,
        label,
        last_mounted,
        def_hash_version,
        default_mount_opts,
        errors,
        creator_os,
        max_mnt_count,
        checkinterval,
        raid_stride: stride as u16,
        raid_stripe_width: stripe_width,
        root_uid,
        root_gid,
        lazy_itable_init,
        lazy_journal_init,
        itable_zeroed: assume_prezeroed,
        kbytes_written: 0,
    };
    Ok(Resolved {
        params,
        settings,
        fs_types,
        discard,
        assume_prezeroed,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn num_blocks_suffixes() {
        assert_eq!(parse_num_blocks("1G", 0), Some(1 << 20));
        assert_eq!(parse_num_blocks("1G", 2), Some(1 << 18));
        assert_eq!(parse_num_blocks("100", 0), Some(100));
        assert_eq!(parse_num_blocks("2048s", 0), Some(1024));
        assert_eq!(parse_num_blocks("1x", 0), None);
        assert_eq!(parse_num_blocks("", 0), None);
    }

    #[test]
    fn uuid_parsing() {
        assert!(parse_uuid("0b7e3c52-8f1d-4a6e-9c2b-5d4f3e2a1b09").is_some());
        assert!(parse_uuid("not-a-uuid").is_none());
    }
}
