//! Bad blocks (`-l FILE`, `-c`): the list in `ext2fs_read_bb_FILE`'s
//! format, mke2fs's `handle_bad_blocks` (the primary superblock and
//! descriptors must be good; bad blocks in a backup's area are counted
//! free once more, as mke2fs does) and the bad block inode (inode 1) as
//! `ext2fs_update_bb_inode` builds it: block-mapped, its data the bad
//! blocks in ascending order, its indirect blocks from the first free
//! block, allocated when the walk reaches them (even when no bad block is
//! left to go in them), `i_blocks` counting the bad blocks only.

use super::geometry::{BlockMap, FileMap, GeometryError, Planner, Run};

/// `ext2fs_read_bb_FILE`: one block number per line (`sscanf("%llu")`:
/// leading blanks, an optional sign, digits; other lines are skipped).
/// Numbers of 2^32 and more are an error (`EOVERFLOW`), as in libext2fs.
/// Returns the numbers in file order (range checks need the layout).
pub fn parse_list(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '\t', '\r', '\x0b', '\x0c']);
        let (neg, digits) = match t.as_bytes().first() {
            Some(b'-') => (true, &t[1..]),
            Some(b'+') => (false, &t[1..]),
            _ => (false, t),
        };
        let d: &str = &digits[..digits.bytes().take_while(u8::is_ascii_digit).count()];
        if d.is_empty() {
            continue;
        }
        let v = d.parse::<u64>().unwrap_or(u64::MAX);
        let v = if neg { v.wrapping_neg() } else { v };
        if v >> 32 != 0 {
            return Err(
                "ext2fs_read_bb_FILE: Value too large for defined data type while reading in list of bad blocks from file"
                    .into(),
            );
        }
        out.push(v);
    }
    Ok(out)
}

/// What the bad blocks did to the plan (messages for the CLI).
#[derive(Clone, Debug, Default)]
pub struct BadBlocks {
    /// The bad blocks inside the filesystem, ascending, once each.
    pub blocks: Vec<u64>,
    /// Numbers outside it (`Bad block %u out of range; ignored.`).
    pub ignored: Vec<u64>,
    /// Groups whose backup superblock/descriptors hold a bad block (the
    /// group's first block).
    pub bad_backups: Vec<u64>,
    /// The bad block inode's mapping (indirect blocks included).
    pub map: FileMap,
    /// Cache accesses of `ext2fs_update_bb_inode` (block, write).
    pub trace: Vec<(u64, bool)>,
}

/// `handle_bad_blocks`, before the group tables are placed: the bad blocks
/// are marked in the bitmap (the counts move when the bad block inode
/// takes them).
pub(super) fn mark(pl: &mut Planner, list: &[u64]) -> Result<(), GeometryError> {
    let blocks = pl.blocks_count;
    let fdb = pl.first_data_block;
    let mut bb = BadBlocks::default();
    for &b in list {
        if b < fdb || b >= blocks {
            bb.ignored.push(b);
        } else {
            bb.blocks.push(b);
        }
    }
    bb.blocks.sort_unstable();
    bb.blocks.dedup();
    let must_be_good = fdb + 1 + u64::from(pl.desc_blocks);
    if let Some(&b) = bb.blocks.iter().find(|&&b| b <= must_be_good) {
        return Err(GeometryError::Invalid(format!(
            "Block {b} in primary superblock/group descriptor area bad (blocks {fdb} through {must_be_good} must be good in order to build a filesystem)"
        )));
    }
    let bpg = u64::from(pl.blocks_per_group);
    let mut group_block = fdb + bpg;
    for _ in 1..pl.group_count {
        let mut bad = false;
        for j in 0..=u64::from(pl.desc_blocks) {
            let b = group_block + j;
            if bb.blocks.binary_search(&b).is_ok() {
                if !bad {
                    bb.bad_backups.push(group_block);
                }
                bad = true;
                let g = pl.group_of_block(b) as usize;
                pl.l.groups[g].free_blocks += 1;
                pl.l.free_blocks += 1;
            }
        }
        group_block += bpg;
    }
    for &b in &bb.blocks {
        pl.l.used.insert(b, 1);
    }
    pl.l.bad_blocks = Some(bb);
    Ok(())
}

/// `ext2fs_update_bb_inode` (create_bad_block_inode, after the reserved
/// inodes).
pub(super) fn make_inode(pl: &mut Planner, iblk: u64) -> Result<(), GeometryError> {
    let Some(mut bb) = pl.l.bad_blocks.take() else {
        return Ok(());
    };
    let apb = u64::from(pl.block_size / 4);
    let n = bb.blocks.len() as u64;
    if n > 12 + apb + apb * apb {
        return Err(GeometryError::Invalid(format!(
            "{n} bad blocks need a triple-indirect block, which ext4kit does not make yet"
        )));
    }
    let mut bm = BlockMap::default();
    let mut trace = Vec::new();
    // The walk stops at the first position without a bad block; the
    // indirect blocks that position needs are allocated first.
    let new_meta = |pl: &mut Planner, trace: &mut Vec<(u64, bool)>| {
        let b = pl.alloc_block(0, "bad block inode")?;
        trace.push((b, true));
        trace.push((b, false));
        Ok::<u64, GeometryError>(b)
    };
    let mut ind: Option<usize> = None;
    let mut dind: Option<usize> = None;
    for p in 0..=n {
        if p >= 12 && p < 12 + apb {
            if p == 12 {
                let b = new_meta(pl, &mut trace)?;
                bm.i_block[12] = b as u32;
                bm.indirect.push((b, Vec::new()));
                ind = Some(bm.indirect.len() - 1);
            }
        } else if p >= 12 + apb {
            if p == 12 + apb {
                if let Some(i) = ind.take().filter(|&i| !bm.indirect[i].1.is_empty()) {
                    trace.push((bm.indirect[i].0, true));
                }
                let b = new_meta(pl, &mut trace)?;
                bm.i_block[13] = b as u32;
                bm.indirect.push((b, Vec::new()));
                dind = Some(bm.indirect.len() - 1);
            }
            if (p - 12 - apb) % apb == 0 {
                if let Some(i) = ind.take().filter(|&i| !bm.indirect[i].1.is_empty()) {
                    trace.push((bm.indirect[i].0, true));
                }
                let b = new_meta(pl, &mut trace)?;
                if let Some(d) = dind {
                    bm.indirect[d].1.push(b as u32);
                }
                bm.indirect.push((b, Vec::new()));
                ind = Some(bm.indirect.len() - 1);
            }
        }
        if p == n {
            break;
        }
        let b = bb.blocks[p as usize];
        pl.take(b, 1);
        if p < 12 {
            bm.i_block[p as usize] = b as u32;
        } else if let Some(i) = ind {
            bm.indirect[i].1.push(b as u32);
        }
    }
    if let Some(i) = ind.filter(|&i| !bm.indirect[i].1.is_empty()) {
        trace.push((bm.indirect[i].0, true));
    }
    if let Some(d) = dind.filter(|&d| !bm.indirect[d].1.is_empty()) {
        trace.push((bm.indirect[d].0, true));
    }
    trace.push((iblk, true));
    let mut runs: Vec<Run> = Vec::new();
    for (k, &b) in bb.blocks.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if r.pblk + u64::from(r.len) == b => r.len += 1,
            _ => runs.push(Run {
                lblk: k as u32,
                pblk: b,
                len: 1,
            }),
        }
    }
    bb.map = FileMap {
        runs,
        leaf: None,
        blockmap: Some(bm),
    };
    bb.trace = trace;
    pl.l.bad_blocks = Some(bb);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_format_like_read_bb_file() {
        assert_eq!(
            parse_list("10\n  20 junk\nx\n\n+30\n"),
            Ok(vec![10, 20, 30])
        );
        assert!(parse_list("4294967296\n").is_err());
        assert!(parse_list("-1\n").is_err());
        assert_eq!(parse_list("4294967295"), Ok(vec![u64::from(u32::MAX)]));
    }
}
