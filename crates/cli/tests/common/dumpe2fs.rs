//! Reading `dumpe2fs IMG` output, independent of ext4kit's own parser:
//! the header fields and, per group, what the layout tests compare
//! (flags, inode table, unused inodes, free blocks, superblock copies and
//! descriptor blocks).

use std::path::Path;

use super::{run, tool};

/// `dumpe2fs IMG` (C locale), stdout; `Err` if it cannot run or fails.
pub fn dumpe2fs(path: &Path) -> Result<String, String> {
    let out = run(tool("dumpe2fs").arg(path))?;
    if !out.status.success() {
        return Err(format!("dumpe2fs {} failed", path.display()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The value of header line `name: value` (the first line starting with
/// `name`), trimmed.
pub fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|r| r.trim_start_matches(':').trim())
}

/// "A-B" or "A" at the start of `s` (a trailing comma dropped).
pub fn range(s: &str) -> Option<(u64, u64)> {
    let s = s.split_whitespace().next()?.trim_end_matches(',');
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// One "Group N: ..." paragraph.
#[derive(Clone, Debug, Default)]
pub struct DumpGroup {
    /// `[INODE_UNINIT]` in the group line.
    pub inode_uninit: bool,
    /// `[ITABLE_ZEROED]` in the group line.
    pub zeroed: bool,
    /// First block of "Inode table at A-B".
    pub itable: u64,
    /// "N unused inodes" (0 when not shown).
    pub unused: u64,
    /// "Free blocks: ..." as half-open ranges.
    pub free_blocks: Vec<(u64, u64)>,
    /// "Primary superblock at".
    pub primary_sb: bool,
    /// "Backup superblock at".
    pub backup_sb: bool,
    /// "Group descriptors at A-B": the contiguous table (or its copy).
    pub gdt: Option<(u64, u64)>,
    /// "Group descriptor at X": meta_bg's descriptor block in this group.
    pub desc: Option<u64>,
}

/// The groups of a full `dumpe2fs` listing, in order.
pub fn groups(text: &str) -> Vec<DumpGroup> {
    let mut groups: Vec<DumpGroup> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("Group ")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        {
            let flags = rest.rsplit_once('[').map_or("", |(_, f)| f);
            groups.push(DumpGroup {
                inode_uninit: flags.contains("INODE_UNINIT"),
                zeroed: flags.contains("ITABLE_ZEROED"),
                ..DumpGroup::default()
            });
            continue;
        }
        let Some(g) = groups.last_mut() else { continue };
        let t = line.trim();
        g.primary_sb |= line.contains("Primary superblock at");
        g.backup_sb |= line.contains("Backup superblock at");
        if let Some(r) = line.split("Group descriptors at ").nth(1) {
            g.gdt = g.gdt.or(range(r));
        }
        if let Some(r) = line.split("Group descriptor at ").nth(1) {
            g.desc = g.desc.or(range(r).map(|r| r.0));
        }
        if let Some(rest) = t.strip_prefix("Inode table at ") {
            if let Some(r) = range(rest) {
                g.itable = r.0;
            }
        } else if line.contains(" free inodes, ") {
            g.unused = line
                .split(", ")
                .find_map(|p| p.trim().strip_suffix(" unused inodes"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        } else if let Some(rest) = t.strip_prefix("Free blocks: ") {
            for part in rest.split(", ").filter(|p| !p.is_empty()) {
                if let Some((a, b)) = range(part) {
                    g.free_blocks.push((a, b + 1));
                }
            }
        }
    }
    groups
}

/// Every primary descriptor block: the table after the primary
/// superblock and, with meta_bg, the block in the first group of each
/// meta group (`dpb` groups each).
pub fn primary_desc_blocks(groups: &[DumpGroup], dpb: u64) -> Vec<u64> {
    let mut v: Vec<u64> = groups
        .iter()
        .find(|g| g.primary_sb)
        .and_then(|g| g.gdt)
        .map_or(Vec::new(), |(a, b)| (a..=b).collect());
    v.extend(
        groups
            .iter()
            .enumerate()
            .filter(|(i, _)| (*i as u64).is_multiple_of(dpb))
            .filter_map(|(_, g)| g.desc),
    );
    v
}
