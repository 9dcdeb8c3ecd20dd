//! `ext4kit info`: geometry and lazy-init state of an ext4 filesystem.

use std::path::PathBuf;

use anyhow::Context;
use ext4kit::image::Image;
use ext4kit::lazyinit;
use ext4kit_device::{OpenOptions, open_device};
use ext4kit_format::features::Compat;
use ext4kit_format::inode::Inode;
use ext4kit_format::superblock::{STATE_ERROR, STATE_VALID, Superblock};
use serde_json::json;

/// Show an ext4 filesystem's identity, state, counts and times (what
/// `dumpe2fs -h` shows first), its geometry, and how many block groups
/// still lack ITABLE_ZEROED (inode tables left for lazy init). Read-only.
/// Times are shown in UTC.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// ext4 image file or block device.
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `ext4kit info`; returns the exit code.
pub fn run(args: &InfoArgs) -> anyhow::Result<i32> {
    let path = &args.device;
    // Device errors name the path themselves.
    let dev = open_device(path, OpenOptions::read_only())?;
    let img = Image::open(dev.as_ref()).with_context(|| format!("{}", path.display()))?;
    let g = img.geometry();
    let sb = img.superblock();
    let st = lazyinit::status(&img);
    let features = img.features().names();
    let allocated = dev.allocated_bytes();
    let journal = journal_info(&img).with_context(|| format!("{}", path.display()))?;
    let external = journal.is_none() && img.features().compat.contains(Compat::HAS_JOURNAL);
    // With --journal-path: the journal device, checked as a writer
    // checks it (a wrong one is refused with one line).
    let external_blocks = match crate::extjournal::path() {
        Some(_) if external => {
            let joined = crate::extjournal::open(path, OpenOptions::read_only())?;
            let j = ext4kit_fs::journal::recover::Journal::open(joined.as_ref())
                .with_context(|| format!("{}", path.display()))?;
            Some(u64::from(j.maxlen()))
        }
        _ => None,
    };
    let s = Summary::of(sb);
    if args.json {
        let v = json!({
            "device": path.display().to_string(),
            "size": dev.size(),
            "allocated_bytes": allocated,
            "uuid": s.uuid,
            "label": s.label,
            "last_mounted_on": s.last_mounted,
            "state": s.state,
            "clean": sb.s_state.get() & STATE_VALID != 0,
            "has_errors": sb.s_state.get() & STATE_ERROR != 0,
            "errors_behavior": s.errors_behavior,
            "block_size": g.block_size,
            "blocks_count": g.blocks_count,
            "free_blocks": sb.free_blocks_count(),
            "reserved_blocks": sb.r_blocks_count(),
            "inodes_count": sb.s_inodes_count.get(),
            "free_inodes": sb.s_free_inodes_count.get(),
            "mount_count": sb.s_mnt_count.get(),
            "max_mount_count": s.max_mount_count,
            "created_time": s.created,
            "last_mount_time": s.last_mount,
            "last_write_time": s.last_write,
            "last_check_time": s.last_check,
            "journal_inode": journal.map(|j| j.inode),
            "journal_bytes": journal.map(|j| j.bytes),
            "journal_blocks": journal.map(|j| j.bytes / u64::from(g.block_size)).or(external_blocks),
            "groups": g.group_count,
            "blocks_per_group": g.blocks_per_group,
            "inodes_per_group": g.inodes_per_group,
            "inode_size": g.inode_size,
            "itable_blocks_per_group": g.itable_blocks,
            "desc_size": g.desc_size,
            "desc_blocks": g.desc_blocks,
            "desc_table_block": g.gdt_start,
            "desc_checksum": img.desc_checksum().name(),
            "features": features,
            "needs_recovery": img.needs_recovery(),
            "groups_not_zeroed": st.groups_not_zeroed,
            "groups_inode_uninit": st.groups_inode_uninit,
            "groups_inconsistent": st.groups_inconsistent,
            "lazyinit_refusal": st.refusal,
            "bytes_to_zero": st.bytes_to_zero,
        });
        let mut v = v;
        // (Added apart: one json! of everything passes the macro's
        // recursion limit.)
        v["error_count"] = json!(sb.s_error_count.get());
        // meta_bg: s_first_meta_bg (null without), and where every primary
        // descriptor block is.
        v["first_meta_bg"] = json!(g.first_meta_bg);
        v["desc_block_locations"] = json!(g.desc_locs);
        v["first_error"] = json!(s.first_error.as_ref().map(FsErrorInfo::json));
        v["last_error"] = json!(s.last_error.as_ref().map(FsErrorInfo::json));
        v["journal_uuid"] =
            json!(external.then(|| ext4kit_fs::journal::recover::fmt_uuid(&sb.s_journal_uuid)));
        v["journal_device"] = json!(external.then(|| sb.s_journal_dev.get()));
        outln!("{v}");
        return Ok(0);
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    outln!("device:              {}", path.display());
    match allocated {
        Some(a) => outln!(
            "size:                {} bytes ({:.1} MiB), {} bytes allocated ({:.1} MiB)",
            dev.size(),
            mib(dev.size()),
            a,
            mib(a)
        ),
        None => outln!(
            "size:                {} bytes ({:.1} MiB)",
            dev.size(),
            mib(dev.size())
        ),
    }
    outln!(
        "filesystem UUID:     {}",
        s.uuid.as_deref().unwrap_or("<none>")
    );
    outln!(
        "volume name:         {}",
        s.label.as_deref().unwrap_or("<none>")
    );
    outln!(
        "last mounted on:     {}",
        s.last_mounted.as_deref().unwrap_or("<not available>")
    );
    outln!("state:               {}", s.state);
    outln!("errors behavior:     {}", s.errors_behavior);
    if sb.s_error_count.get() != 0 || s.first_error.is_some() {
        outln!("error count:         {}", sb.s_error_count.get());
    }
    for (what, e) in [("first", &s.first_error), ("last", &s.last_error)] {
        if let Some(e) = e {
            outln!("{:<21}{}", format!("{what} error:"), e.text());
        }
    }
    outln!("features:            {}", features.join(" "));
    outln!("block size:          {}", g.block_size);
    outln!(
        "blocks:              {} ({} free, {} reserved)",
        g.blocks_count,
        sb.free_blocks_count(),
        sb.r_blocks_count()
    );
    outln!(
        "inodes:              {} ({} free)",
        sb.s_inodes_count.get(),
        sb.s_free_inodes_count.get()
    );
    outln!(
        "block groups:        {} ({} blocks, {} inodes per group)",
        g.group_count,
        g.blocks_per_group,
        g.inodes_per_group
    );
    outln!(
        "inode tables:        {} blocks per group ({}-byte inodes)",
        g.itable_blocks,
        g.inode_size
    );
    match g.first_meta_bg {
        None => outln!(
            "group descriptors:   {} bytes, {} block(s) from block {}, checksum {}",
            g.desc_size,
            g.desc_blocks,
            g.gdt_start,
            img.desc_checksum().name()
        ),
        Some(_) => outln!(
            "group descriptors:   {} bytes, {} block(s): {} from block {}, {} in their meta groups (meta_bg, {} groups each), checksum {}",
            g.desc_size,
            g.desc_blocks,
            g.table_blocks(),
            g.gdt_start,
            g.desc_blocks - g.table_blocks(),
            g.descs_per_block,
            img.desc_checksum().name()
        ),
    }
    outln!(
        "mount count:         {} (maximum {})",
        sb.s_mnt_count.get(),
        s.max_mount_count
    );
    let when = |t: Option<u64>| t.map_or_else(|| "n/a".to_string(), ctime_utc);
    outln!("created:             {}", when(s.created));
    outln!("last mount:          {}", when(s.last_mount));
    outln!("last write:          {}", when(s.last_write));
    outln!("last checked:        {}", when(s.last_check));
    match journal {
        Some(j) => outln!(
            "journal:             {} ({} blocks, inode {})",
            human_bytes(j.bytes),
            j.bytes / u64::from(g.block_size),
            j.inode
        ),
        None if img.features().compat.contains(Compat::HAS_JOURNAL) => {
            outln!(
                "journal:             external (UUID {}, device {:#06x}){}",
                ext4kit_fs::journal::recover::fmt_uuid(&sb.s_journal_uuid),
                sb.s_journal_dev.get(),
                external_blocks.map_or(String::new(), |n| format!(", {n} blocks"))
            )
        }
        None => outln!("journal:             none"),
    }
    if img.needs_recovery() {
        outln!("journal:             needs recovery");
    }
    outln!(
        "lazy init:           {} of {} groups without ITABLE_ZEROED ({} INODE_UNINIT), {:.1} MiB of inode table to zero",
        st.groups_not_zeroed,
        st.groups,
        st.groups_inode_uninit,
        mib(st.bytes_to_zero)
    );
    if st.groups_inconsistent > 0 {
        outln!(
            "                     {} group(s) with inconsistent counts (lazyinit will refuse)",
            st.groups_inconsistent
        );
    }
    if let Some(why) = &st.refusal {
        outln!("                     lazyinit would refuse: {why}");
    }
    Ok(0)
}

/// The superblock fields `dumpe2fs -h` users look for, decoded.
struct Summary {
    uuid: Option<String>,
    label: Option<String>,
    last_mounted: Option<String>,
    /// e2p's `print_fs_state`: "clean" or "not clean", plus " with errors".
    state: String,
    /// e2p's `print_fs_errors`, lower case.
    errors_behavior: &'static str,
    /// The first and last recorded filesystem errors.
    first_error: Option<FsErrorInfo>,
    last_error: Option<FsErrorInfo>,
    /// Signed, as dumpe2fs prints it (-1: no limit).
    max_mount_count: i16,
    /// Seconds since the epoch (with the `_hi` byte); `None` when 0.
    created: Option<u64>,
    last_mount: Option<u64>,
    last_write: Option<u64>,
    last_check: Option<u64>,
}

impl Summary {
    fn of(sb: &Superblock) -> Self {
        let state = sb.s_state.get();
        let mut st = if state & STATE_VALID != 0 {
            "clean".to_string()
        } else {
            "not clean".to_string()
        };
        if state & STATE_ERROR != 0 {
            st.push_str(" with errors");
        }
        let time = |lo: u32, hi: u8| {
            let t = u64::from(lo) | (u64::from(hi) << 32);
            (t != 0).then_some(t)
        };
        Summary {
            uuid: (sb.s_uuid != [0; 16]).then(|| uuid::Uuid::from_bytes(sb.s_uuid).to_string()),
            label: c_string(&sb.s_volume_name),
            last_mounted: c_string(&sb.s_last_mounted),
            state: st,
            errors_behavior: match sb.s_errors.get() {
                1 => "continue",
                2 => "remount read-only",
                3 => "panic",
                _ => "unknown (continue)",
            },
            first_error: FsErrorInfo::of(
                time(sb.s_first_error_time.get(), sb.s_first_error_time_hi),
                &sb.s_first_error_func,
                sb.s_first_error_line.get(),
                sb.s_first_error_ino.get(),
                sb.s_first_error_block.get(),
                sb.s_first_error_errcode,
            ),
            last_error: FsErrorInfo::of(
                time(sb.s_last_error_time.get(), sb.s_last_error_time_hi),
                &sb.s_last_error_func,
                sb.s_last_error_line.get(),
                sb.s_last_error_ino.get(),
                sb.s_last_error_block.get(),
                sb.s_last_error_errcode,
            ),
            max_mount_count: sb.s_max_mnt_count.get() as i16,
            created: time(sb.s_mkfs_time.get(), sb.s_mkfs_time_hi),
            last_mount: time(sb.s_mtime.get(), sb.s_mtime_hi),
            last_write: time(sb.s_wtime.get(), sb.s_wtime_hi),
            last_check: time(sb.s_lastcheck.get(), sb.s_lastcheck_hi),
        }
    }
}

/// One recorded filesystem error (what dumpe2fs shows as "First error
/// time", "... function", "... line #", "... inode #", "... block #",
/// "... err").
struct FsErrorInfo {
    time: u64,
    func: String,
    line: u32,
    ino: u32,
    block: u64,
    /// e2p's name of the `EXT4_ERR_*` code; `None` when 0.
    code: Option<String>,
}

impl FsErrorInfo {
    /// `None` when no time is recorded (dumpe2fs's rule).
    fn of(
        time: Option<u64>,
        func: &[u8],
        line: u32,
        ino: u32,
        block: u64,
        code: u8,
    ) -> Option<Self> {
        Some(FsErrorInfo {
            time: time?,
            func: c_string(func).unwrap_or_default(),
            line,
            ino,
            block,
            code: (code != 0).then(|| errcode_name(code)),
        })
    }

    fn text(&self) -> String {
        let mut t = format!("{} in {}:{}", ctime_utc(self.time), self.func, self.line);
        if self.ino != 0 {
            t.push_str(&format!(", inode {}", self.ino));
        }
        if self.block != 0 {
            t.push_str(&format!(", block {}", self.block));
        }
        if let Some(c) = &self.code {
            t.push_str(&format!(": {c}"));
        }
        t
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "time": self.time,
            "function": self.func,
            "line": self.line,
            "inode": self.ino,
            "block": self.block,
            "errcode": self.code,
        })
    }
}

/// e2p's `e2p_errcode2str`.
fn errcode_name(code: u8) -> String {
    const NAMES: [&str; 18] = [
        "",
        "UNKNOWN",
        "EIO",
        "ENOMEM",
        "EFSBADCRC",
        "EFSCORRUPTED",
        "ENOSPC",
        "ENOKEY",
        "EROFS",
        "EFBIG",
        "EEXIST",
        "ERANGE",
        "EOVERFLOW",
        "EBUSY",
        "ENOTDIR",
        "ENOTEMPTY",
        "ESHUTDOWN",
        "EFAULT",
    ];
    NAMES
        .get(usize::from(code))
        .map_or_else(|| format!("UNKNOWN_ERRCODE_{code}"), |s| s.to_string())
}

/// A NUL-padded superblock string; `None` when empty.
fn c_string(raw: &[u8]) -> Option<String> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    (end > 0).then(|| String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// An internal journal: its inode and its size (the inode's `i_size`).
#[derive(Clone, Copy)]
struct Journal {
    inode: u32,
    bytes: u64,
}

/// Read the journal inode named by the superblock; `None` without an
/// internal journal.
fn journal_info(img: &Image<'_>) -> anyhow::Result<Option<Journal>> {
    let sb = img.superblock();
    let ino = sb.s_journal_inum.get();
    if !img.features().compat.contains(Compat::HAS_JOURNAL) || ino == 0 {
        return Ok(None);
    }
    let g = img.geometry();
    let ipg = g.inodes_per_group;
    let group = (ino - 1).checked_div(ipg).unwrap_or(u32::MAX);
    if ino > g.inodes_count || group >= g.group_count {
        anyhow::bail!("journal inode {ino} is outside the inode tables");
    }
    let table = img.desc(group).inode_table();
    let offset = g
        .byte_offset(table)
        .checked_add(u64::from((ino - 1) % ipg) * u64::from(g.inode_size))
        .filter(|end| end.saturating_add(u64::from(g.inode_size)) <= g.fs_bytes())
        .with_context(|| {
            format!("journal inode {ino}: inode table block {table} is outside the filesystem")
        })?;
    let mut buf = vec![0u8; g.inode_size.clamp(128, 160) as usize];
    img.device()
        .read_at(&mut buf, offset)
        .with_context(|| format!("reading journal inode {ino}"))?;
    let inode = Inode::parse(&buf).with_context(|| format!("journal inode {ino}: short read"))?;
    Ok(Some(Journal {
        inode: ino,
        bytes: inode.size(),
    }))
}

/// Bytes as dumpe2fs shows journal sizes: "4096k" below 8 MiB, else "64M".
fn human_bytes(b: u64) -> String {
    let k = b / 1024;
    if k < 8192 {
        format!("{k}k")
    } else {
        format!("{}M", k >> 10)
    }
}

/// `ctime(3)` layout in UTC, e.g. "Tue Nov 14 22:13:20 2023 UTC".
fn ctime_utc(t: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = t / 86_400;
    let secs = t % 86_400;
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 >= 0.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {} UTC",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        day,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        year
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctime_layout() {
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970 UTC");
        assert_eq!(ctime_utc(1_700_000_000), "Tue Nov 14 22:13:20 2023 UTC");
        assert_eq!(ctime_utc(951_782_400), "Tue Feb 29 00:00:00 2000 UTC");
        assert_eq!(ctime_utc(4_102_444_800), "Fri Jan  1 00:00:00 2100 UTC");
    }

    #[test]
    fn journal_sizes() {
        assert_eq!(human_bytes(4 << 20), "4096k");
        assert_eq!(human_bytes(64 << 20), "64M");
    }
}
