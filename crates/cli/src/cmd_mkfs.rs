//! `ext4kit mkfs`: mke2fs's options, our planner and writer.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ext4kit::mkfs::{self, Env, MkfsOptions};
use ext4kit::profile::Profile;
use ext4kit_device::{Device, FileDevice, OpenOptions, open_device};

/// Create an ext4 filesystem (mke2fs-compatible options).
///
/// Given a path that does not exist and a size, a sparse image file is
/// created. On sparse files and devices that prove ranges read as zero,
/// zeroing is skipped, so the image stays as small as possible while
/// holding the same bytes mke2fs would write.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Examples:\n  ext4kit mkfs disk.img 10G\n  ext4kit mkfs -t ext4 -L data -E lazy_itable_init=1,nodiscard /dev/sdX"
)]
pub struct MkfsArgs {
    /// Filesystem type (ext4, ext3, ext2), as in mke2fs.conf [default: ext4].
    #[arg(short = 't', value_name = "FS-TYPE")]
    fs_type: Option<String>,
    /// Usage types (comma-separated: news, largefile, small, ...).
    #[arg(short = 'T', value_name = "USAGE-TYPES")]
    usage_types: Option<String>,
    /// Block size in bytes (1024, 2048, 4096, 4k, ...; negative = minimum).
    #[arg(
        short = 'b',
        action = clap::ArgAction::Append,
        value_parser = ext4kit::mkfs::options::parse_block_size_arg,
        value_name = "BLOCK-SIZE",
        allow_hyphen_values = true
    )]
    block_size: Vec<i64>,
    /// Number of inodes (0: the default).
    #[arg(
        short = 'N',
        overrides_with = "num_inodes",
        value_parser = ext4kit::mkfs::options::parse_c_ulong,
        value_name = "NUMBER-OF-INODES"
    )]
    num_inodes: Option<u64>,
    /// Bytes per inode.
    #[arg(
        short = 'i',
        overrides_with = "inode_ratio",
        value_parser = ext4kit::mkfs::options::parse_inode_ratio_arg,
        value_name = "BYTES-PER-INODE"
    )]
    inode_ratio: Option<u64>,
    /// Inode size in bytes.
    #[arg(
        short = 'I',
        overrides_with = "inode_size",
        value_parser = ext4kit::mkfs::options::parse_c_uint,
        value_name = "INODE-SIZE"
    )]
    inode_size: Option<u32>,
    /// Reserved blocks percentage.
    #[arg(
        short = 'm',
        overrides_with = "reserved_ratio",
        value_name = "RESERVED-RATIO"
    )]
    reserved_ratio: Option<f64>,
    /// Volume label (at most 16 bytes).
    #[arg(short = 'L', overrides_with = "label", value_name = "LABEL")]
    label: Option<String>,
    /// Filesystem UUID (or null, clear, random, time).
    #[arg(short = 'U', overrides_with = "uuid", value_name = "UUID")]
    uuid: Option<String>,
    /// Features to set or clear (feat,^feat,...). May be repeated.
    #[arg(short = 'O', value_name = "FEATURE[,...]")]
    features: Vec<String>,
    /// Extended options: lazy_itable_init=, lazy_journal_init=,
    /// assume_storage_prezeroed=, discard, nodiscard, hash_seed=,
    /// root_owner[=uid:gid], num_backup_sb=, packed_meta_blocks, stride=,
    /// stripe_width=, orphan_file_size=. As in mke2fs, only the last -E
    /// counts.
    #[arg(short = 'E', overrides_with = "extended", value_name = "EXTENDED-OPTS")]
    extended: Option<String>,
    /// Journal options (size=MiB).
    #[arg(short = 'J', value_name = "JOURNAL-OPTS")]
    journal: Vec<String>,
    /// Create a journal (ext3).
    #[arg(short = 'j', overrides_with = "add_journal")]
    add_journal: bool,
    /// Groups per flex_bg.
    #[arg(
        short = 'G',
        overrides_with = "flex_bg_size",
        value_parser = ext4kit::mkfs::options::parse_flex_bg_size_arg,
        value_name = "FLEX-GROUP-SIZE"
    )]
    flex_bg_size: Option<u32>,
    /// Blocks per group.
    #[arg(
        short = 'g',
        overrides_with = "blocks_per_group",
        value_parser = ext4kit::mkfs::options::parse_c_uint,
        value_name = "BLOCKS-PER-GROUP"
    )]
    blocks_per_group: Option<u32>,
    /// Last-mounted directory to record.
    #[arg(
        short = 'M',
        overrides_with = "mount_dir",
        value_name = "LAST-MOUNTED-DIR"
    )]
    mount_dir: Option<String>,
    /// Creator OS.
    #[arg(short = 'o', overrides_with = "creator_os", value_name = "CREATOR-OS")]
    creator_os: Option<String>,
    /// Error behaviour (continue, remount-ro, panic).
    #[arg(short = 'e', overrides_with = "errors", value_name = "ERRORS-BEHAVIOR")]
    errors: Option<String>,
    /// Force: accepted for compatibility (ext4kit never prompts).
    #[arg(short = 'F', action = clap::ArgAction::Count)]
    force: u8,
    /// Quiet.
    #[arg(short = 'q')]
    quiet: bool,
    /// Dry run: plan and print, write nothing.
    #[arg(short = 'n', overrides_with = "dry_run")]
    dry_run: bool,
    /// Verbose.
    #[arg(short = 'v')]
    verbose: bool,
    /// Print a machine-readable JSON report on stdout.
    #[arg(long)]
    json: bool,
    /// Device or image file.
    #[arg(value_name = "DEVICE")]
    device: PathBuf,
    /// Filesystem size (blocks, or with a K/M/G/T suffix).
    #[arg(value_name = "FS-SIZE")]
    fs_size: Option<String>,
}

fn now_from_env() -> Result<u32> {
    for var in ["E2FSPROGS_FAKE_TIME", "SOURCE_DATE_EPOCH"] {
        if let Ok(v) = std::env::var(var) {
            let v = v.trim();
            let n = if let Some(h) = v.strip_prefix("0x") {
                u64::from_str_radix(h, 16).ok()
            } else {
                v.parse::<u64>().ok()
            };
            match n {
                Some(n) if n <= u64::from(u32::MAX) => return Ok(n as u32),
                _ => bail!("invalid {var}: '{v}'"),
            }
        }
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(secs.min(u64::from(u32::MAX)) as u32)
}

/// The system page size (only used for `blocksize = -1` in mke2fs.conf
/// and the "blocks too big" warning).
fn page_size() -> u32 {
    ext4kit_device::page_size()
}

pub fn run(a: &MkfsArgs) -> Result<i32> {
    let start = Instant::now();
    let (profile, _source) = Profile::load().context("reading mke2fs.conf")?;
    let exists = a.device.exists();
    // One read-only probe of an existing target: size, sector size, and
    // whether a discard leaves zeros (regular files: yes, holes).
    let (device_size, sector, phys_sector, io_hints, dev_discard_zeroes) = if exists {
        let dev = open_device(&a.device, OpenOptions::read_only())?;
        (
            Some(dev.size()),
            dev.logical_block_size(),
            dev.physical_block_size(),
            dev.io_hints(),
            dev.discard_zeroes_data(),
        )
    } else {
        (None, 512, 512, None, true)
    };
    let opts = MkfsOptions {
        // Like mkfs.ext4: ext4 unless -t says otherwise.
        fs_type: Some(a.fs_type.clone().unwrap_or_else(|| "ext4".to_string())),
        usage_types: a.usage_types.clone(),
        block_size: a.block_size.last().copied(),
        earlier_block_sizes: a.block_size[..a.block_size.len().saturating_sub(1)].to_vec(),
        num_inodes: a.num_inodes,
        inode_ratio: a.inode_ratio,
        inode_size: a.inode_size,
        reserved_ratio: a.reserved_ratio,
        label: a.label.clone(),
        uuid: a.uuid.clone(),
        features: a.features.clone(),
        extended: a.extended.iter().cloned().collect(),
        journal: a.journal.clone(),
        add_journal: a.add_journal,
        flex_bg_size: a.flex_bg_size,
        blocks_per_group: a.blocks_per_group,
        mount_dir: a.mount_dir.clone(),
        creator_os: a.creator_os.clone(),
        errors: a.errors.clone(),
        fs_size: a.fs_size.clone(),
        force: a.force > 0,
    };
    let is_file = !exists
        || std::fs::metadata(&a.device)
            .map(|m| m.is_file())
            .unwrap_or(false);
    // As mke2fs: no sector size for regular files, and the test-suite
    // overrides MKE2FS_DEVICE_SECTSIZE / MKE2FS_DEVICE_PHYS_SECTSIZE.
    let (sector, phys_sector) = mkfs::options::sector_sizes(
        if is_file { 0 } else { sector },
        if is_file { 0 } else { phys_sector },
        |v| std::env::var(v).ok(),
    );
    let env = Env {
        device_size,
        is_regular_file: is_file,
        logical_sector_size: sector,
        physical_sector_size: phys_sector,
        io_hints: if is_file { None } else { io_hints },
        now: now_from_env()?,
        page_size: page_size(),
        uid: 0,
        gid: 0,
        kernel_lazy_itable_init: true,
    };
    let resolved = mkfs::resolve(&opts, &profile, &env)?;
    for w in &resolved.warnings {
        if !a.quiet {
            eprintln!("ext4kit: warning: {}", w.trim_start_matches("Warning: "));
        }
    }
    // Would a discard of this target leave zeros? Regular files: yes
    // (holes). Block devices: only if the kernel says so.
    let discard_zeroes = is_file || dev_discard_zeroes;
    let prepared = mkfs::prepare(resolved, discard_zeroes)?;
    let l = &prepared.layout;
    if a.dry_run {
        if a.json {
            outln!("{}", json_report(a, &prepared, None, None, start));
        } else {
            print_summary(a, &prepared);
        }
        return Ok(0);
    }
    let needed = l.blocks_count * u64::from(l.block_size);
    let dev: Box<dyn Device> = if exists && is_file && device_size.is_some_and(|s| s < needed) {
        // A regular file grows to the filesystem size, as with mke2fs.
        ext4kit_device::check_not_mounted(&a.device)?;
        let f = FileDevice::open(&a.device, OpenOptions::read_write())?;
        f.set_len(needed)
            .with_context(|| format!("extending {}", a.device.display()))?;
        Box::new(f)
    } else if exists {
        open_device(&a.device, OpenOptions::read_write())?
    } else {
        Box::new(create_image(&a.device, needed)?)
    };
    if !a.quiet && !a.json {
        if !exists {
            outln!("Creating regular file {}", a.device.display());
        }
        print_summary(a, &prepared);
    }
    let report = mkfs::execute(dev.as_ref(), prepared.clone())?;
    if a.json {
        let v = json_report(
            a,
            &prepared,
            Some(&report),
            Some(dev.allocated_bytes()),
            start,
        );
        outln!("{v}");
    } else if !a.quiet {
        outln!("Writing superblocks and filesystem accounting information: done");
    }
    Ok(0)
}

/// The `--json` report: the plan, and what the run did (`report` is `None`
/// for `-n`, which writes nothing: `"dry_run": true`).
fn json_report(
    a: &MkfsArgs,
    p: &mkfs::Prepared,
    report: Option<&mkfs::Report>,
    allocated_bytes: Option<Option<u64>>,
    start: Instant,
) -> serde_json::Value {
    let l = &p.layout;
    let mut v = serde_json::json!({
        "device": a.device,
        "dry_run": report.is_none(),
        "block_size": l.block_size,
        "blocks": l.blocks_count,
        "groups": l.group_count,
        "inodes": l.inodes_count,
        "inodes_per_group": l.inodes_per_group,
        "inode_size": l.inode_size,
        "journal_blocks": l.journal_blocks,
        "features": l.features.names(),
        "fs_types": p.resolved.fs_types,
        "uuid": uuid::Uuid::from_bytes(p.settings.uuid).to_string(),
        "itable_zeroed": p.settings.itable_zeroed,
        "warnings": p.resolved.warnings,
    });
    if let (Some(r), Some(obj)) = (report, v.as_object_mut()) {
        obj.insert("itable_zeroed".into(), r.itable_zeroed.into());
        obj.insert("discarded".into(), r.discarded.into());
        obj.insert(
            "stats".into(),
            serde_json::to_value(&r.stats).unwrap_or_default(),
        );
        obj.insert("allocated_bytes".into(), allocated_bytes.flatten().into());
        obj.insert("seconds".into(), start.elapsed().as_secs_f64().into());
    }
    v
}

fn create_image(path: &Path, size: u64) -> Result<FileDevice> {
    FileDevice::create_sparse(path, size).with_context(|| format!("creating {}", path.display()))
}

fn print_summary(a: &MkfsArgs, p: &mkfs::Prepared) {
    if a.quiet && !a.dry_run {
        return;
    }
    let l = &p.layout;
    outln!(
        "Creating filesystem with {} {}k blocks and {} inodes",
        l.blocks_count,
        l.block_size / 1024,
        l.inodes_count
    );
    outln!(
        "Filesystem UUID: {}",
        uuid::Uuid::from_bytes(p.settings.uuid)
    );
    let backups: Vec<String> = l
        .backup_groups()
        .map(|g| l.group_first_block(g).to_string())
        .collect();
    if !backups.is_empty() {
        outln!(
            "Superblock backups stored on blocks: {}",
            backups.join(", ")
        );
    }
    if a.verbose || a.dry_run {
        outln!(
            "fs_types for mke2fs.conf resolution: '{}'",
            p.resolved.fs_types.join("', '")
        );
        outln!("Features: {}", l.features.names().join(" "));
        outln!(
            "{} block groups, {} blocks per group, {} inodes per group, journal {} blocks",
            l.group_count,
            l.blocks_per_group,
            l.inodes_per_group,
            l.journal_blocks
        );
    }
}
