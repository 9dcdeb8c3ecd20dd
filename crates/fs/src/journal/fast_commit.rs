//! The fast-commit area of a jbd2 journal (ext4's `fast_commit`): what
//! the kernel's recovery would find there, as `ext4_fc_replay_scan`
//! (fs/ext4/fast_commit.c) decides it.
//!
//! With the journal superblock's fast-commit feature the last
//! `num_fc_blks` blocks of the journal are not part of the full-commit
//! ring (`j_last = s_maxlen - num_fc_blks`, the fast-commit area is
//! `j_last + 1 .. s_maxlen`). After the full-commit SCAN pass the kernel
//! reads that area for the transaction that did *not* fully commit (the
//! scan's `end_transaction`): a block starting with a HEAD tag of that tid,
//! then tag-length-value records (`le16 tag, le16 len, value`), each fast
//! commit closed by a TAIL whose crc32c (raw, seed 0, over every record
//! since the previous TAIL up to the TAIL's crc field) and tid must match.
//! Everything up to the last valid TAIL is replayed after the full log.
//!
//! [`scan`] classifies the area; [`crate::journal::apply`] refuses to
//! write anything when it holds a log the kernel would fail on, and
//! replays a valid one (never half a replay). Stale blocks (a HEAD of an
//! older tid, no HEAD) are what the kernel ignores too: tids only grow,
//! so a fast commit older than the last full commit can never match the
//! next expected tid.
//!
//! [`records`] decodes a valid log into [`FcTag`]s (what a replay steps
//! through, `journal/fc_replay.rs`), and [`commit_as_full`] makes the
//! replay's result durable in one step, as a full transaction of the
//! fast commits' tid (docs/ARCHITECTURE.md, "Fast-commit replay").

use std::collections::BTreeMap;

use ext4kit_device::Device;
use ext4kit_format::checksum::crc32c_raw;

use super::log::LogCodec;
use super::recover::{Journal, LogBlock, RecoverError, Recovery};

pub const EXT4_FC_TAG_ADD_RANGE: u16 = 1;
pub const EXT4_FC_TAG_DEL_RANGE: u16 = 2;
pub const EXT4_FC_TAG_CREAT: u16 = 3;
pub const EXT4_FC_TAG_LINK: u16 = 4;
pub const EXT4_FC_TAG_UNLINK: u16 = 5;
pub const EXT4_FC_TAG_INODE: u16 = 6;
pub const EXT4_FC_TAG_PAD: u16 = 7;
pub const EXT4_FC_TAG_TAIL: u16 = 8;
pub const EXT4_FC_TAG_HEAD: u16 = 9;
/// HEAD `fc_features` the kernel knows (none).
pub const EXT4_FC_SUPPORTED_FEATURES: u32 = 0;

/// What the fast-commit area holds for the expected tid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum FcLog {
    /// No fast-commit feature in the journal, or nothing to replay (no
    /// HEAD in the first block, a HEAD of another tid).
    #[default]
    Empty,
    /// Fast commits of transaction `tid` that the kernel would replay:
    /// `tags` records (HEAD..last valid TAIL) in `blocks` blocks, with
    /// how many of each tag (index = tag number, 0 unused).
    Valid {
        tid: u32,
        tags: u32,
        blocks: u32,
        per_tag: [u32; 10],
    },
    /// The kernel's scan fails on it (bad crc of the only fast commit,
    /// an unknown tag or feature, the area ends inside a log): its
    /// recovery and mount fail.
    Bad {
        tid: u32,
        block: u32,
        detail: String,
    },
}

impl FcLog {
    /// One line naming why a writer must not replay this log, `None` when
    /// there is nothing to replay.
    pub fn refusal(&self) -> Option<String> {
        match self {
            FcLog::Empty => None,
            FcLog::Valid {
                tid, tags, blocks, ..
            } => Some(format!(
                "the journal holds fast commits of transaction {tid} ({tags} tags in {blocks} blocks) that must be replayed first (run e2fsck -fy, or mount it with the kernel)"
            )),
            FcLog::Bad { tid, block, detail } => Some(format!(
                "the fast-commit area of transaction {tid} is damaged at journal block {block}: {detail} (the kernel refuses to mount it; run e2fsck -fy)"
            )),
        }
    }
}

/// Name of a fast-commit tag (the kernel's `tag2str`).
pub fn tag_name(tag: u16) -> &'static str {
    match tag {
        EXT4_FC_TAG_ADD_RANGE => "ADD_RANGE",
        EXT4_FC_TAG_DEL_RANGE => "DEL_RANGE",
        EXT4_FC_TAG_CREAT => "CREAT_DENTRY",
        EXT4_FC_TAG_LINK => "LINK_DENTRY",
        EXT4_FC_TAG_UNLINK => "DEL_DENTRY",
        EXT4_FC_TAG_INODE => "INODE",
        EXT4_FC_TAG_PAD => "PAD",
        EXT4_FC_TAG_TAIL => "TAIL",
        EXT4_FC_TAG_HEAD => "HEAD",
        _ => "ERROR",
    }
}

/// `ext4_fc_value_len_isvalid`.
fn len_ok(tag: u16, len: usize, inode_size: usize) -> bool {
    const DENTRY: usize = 8; // ext4_fc_dentry_info without the name
    match tag {
        EXT4_FC_TAG_ADD_RANGE => len == 16,
        EXT4_FC_TAG_DEL_RANGE => len == 12,
        EXT4_FC_TAG_CREAT | EXT4_FC_TAG_LINK | EXT4_FC_TAG_UNLINK => {
            len > DENTRY && len - DENTRY <= 255
        }
        EXT4_FC_TAG_INODE => len >= 4 + 128 && len - 4 <= inode_size,
        EXT4_FC_TAG_PAD => true,
        EXT4_FC_TAG_TAIL => len >= 8,
        EXT4_FC_TAG_HEAD => len == 8,
        _ => false,
    }
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

enum Step {
    Continue,
    Stop,
    Fail(String),
}

/// One fast-commit record as the kernel's REPLAY pass reads it
/// (`struct ext4_fc_*` of fs/ext4/fast_commit.h, all little-endian).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FcTag {
    /// `ext4_fc_head`: features, tid.
    Head { features: u32, tid: u32 },
    /// `ext4_fc_add_range`: inode `ino` maps `len` blocks from logical
    /// `lblk` to physical `pblk` (an `ext4_extent`; `ee_len > 32768` is an
    /// unwritten extent of `ee_len - 32768` blocks).
    AddRange {
        ino: u32,
        lblk: u32,
        len: u16,
        unwritten: bool,
        pblk: u64,
    },
    /// `ext4_fc_del_range`: inode `ino` loses logical `lblk..lblk+len`.
    DelRange { ino: u32, lblk: u32, len: u32 },
    /// `ext4_fc_dentry_info` of CREAT (a new inode's first name), LINK
    /// (another name) and UNLINK (a name removed): `tag` says which.
    Dentry {
        tag: u16,
        parent: u32,
        ino: u32,
        name: Vec<u8>,
    },
    /// `ext4_fc_inode`: the on-disk inode `ino` (`raw`, 128 bytes up to
    /// the inode size) as the fast commit saw it.
    Inode { ino: u32, raw: Vec<u8> },
    /// Padding to the end of a block.
    Pad,
    /// `ext4_fc_tail`: end of one fast commit.
    Tail { tid: u32, crc: u32 },
}

impl FcTag {
    /// Decode the value `val` of a record `tag` whose length
    /// [`len_ok`] accepted; `None` for an unknown tag.
    fn decode(tag: u16, val: &[u8]) -> Option<FcTag> {
        Some(match tag {
            EXT4_FC_TAG_HEAD => FcTag::Head {
                features: le32(val, 0),
                tid: le32(val, 4),
            },
            EXT4_FC_TAG_ADD_RANGE => {
                let raw_len = le16(val, 8);
                let unwritten = raw_len > 32768;
                FcTag::AddRange {
                    ino: le32(val, 0),
                    lblk: le32(val, 4),
                    len: if unwritten { raw_len - 32768 } else { raw_len },
                    unwritten,
                    pblk: (u64::from(le16(val, 10)) << 32) | u64::from(le32(val, 12)),
                }
            }
            EXT4_FC_TAG_DEL_RANGE => FcTag::DelRange {
                ino: le32(val, 0),
                lblk: le32(val, 4),
                len: le32(val, 8),
            },
            EXT4_FC_TAG_CREAT | EXT4_FC_TAG_LINK | EXT4_FC_TAG_UNLINK => FcTag::Dentry {
                tag,
                parent: le32(val, 0),
                ino: le32(val, 4),
                name: val[8..].to_vec(),
            },
            EXT4_FC_TAG_INODE => FcTag::Inode {
                ino: le32(val, 0),
                raw: val[4..].to_vec(),
            },
            EXT4_FC_TAG_PAD => FcTag::Pad,
            EXT4_FC_TAG_TAIL => FcTag::Tail {
                tid: le32(val, 0),
                crc: le32(val, 4),
            },
            _ => return None,
        })
    }
}

/// The records a replay of `log` goes through, in log order: the first
/// `tags` records of the area (HEAD up to the last valid TAIL), as the
/// kernel's REPLAY pass counts `fc_replay_num_tags` down. Empty for
/// anything but [`FcLog::Valid`]. A record that does not decode the way
/// [`scan`] read it (the area changed since) is
/// [`RecoverError::Corrupt`].
pub fn records(dev: &dyn Device, j: &Journal, log: &FcLog) -> Result<Vec<FcTag>, RecoverError> {
    let FcLog::Valid { tags, blocks, .. } = log else {
        return Ok(Vec::new());
    };
    let Some(area) = j.fc_area() else {
        return Ok(Vec::new());
    };
    let changed = || RecoverError::Corrupt {
        what: "fast-commit area",
        detail: "a record no longer reads as the scan found it".into(),
    };
    let bs = j.block_size as usize;
    let inode_size = usize::from(j.sb.s_inode_size.get()).max(128);
    let mut out = Vec::with_capacity(*tags as usize);
    for off in 0..*blocks {
        let lblk = area.start + off;
        if lblk >= area.end {
            return Err(changed());
        }
        let b = j.jread(dev, u64::from(lblk))?;
        let mut cur = 0usize;
        while cur + 4 <= bs && out.len() < *tags as usize {
            let tag = le16(&b, cur);
            let len = usize::from(le16(&b, cur + 2));
            let val = cur + 4;
            if len > bs - val || !len_ok(tag, len, inode_size) {
                return Err(changed());
            }
            out.push(FcTag::decode(tag, &b[val..val + len]).ok_or_else(changed)?);
            cur = val + len;
        }
    }
    if out.len() != *tags as usize {
        return Err(changed());
    }
    Ok(out)
}

/// The kernel's SCAN of the fast-commit area for transaction `expected`
/// (the full-commit scan's `end_transaction`). Only read errors are
/// `Err`; what the kernel's scan would fail on is [`FcLog::Bad`].
pub fn scan(dev: &dyn Device, j: &Journal, expected: u32) -> Result<FcLog, RecoverError> {
    let Some(area) = j.fc_area() else {
        return Ok(FcLog::Empty);
    };
    let bs = j.block_size as usize;
    let inode_size = usize::from(j.sb.s_inode_size.get()).max(128);
    let mut cur_tag = 0u32;
    let mut num_tags = 0u32;
    let mut crc = 0u32;
    let mut per_tag = [0u32; 10];
    let mut counted = [0u32; 10];
    let mut valid_blocks = 0u32;
    // The kernel's loop runs to j_fc_last = s_maxlen inclusive, whose
    // read fails: a log that has not stopped by then is an error.
    for off in 0..=(area.end - area.start) {
        let lblk = area.start + off;
        if lblk >= area.end {
            return Ok(FcLog::Bad {
                tid: expected,
                block: lblk,
                detail: "the fast-commit log runs past the end of the journal".into(),
            });
        }
        let b = j.jread(dev, u64::from(lblk))?;
        if off == 0 && le16(&b, 0) != EXT4_FC_TAG_HEAD {
            return Ok(FcLog::Empty);
        }
        // The kernel since "ext4: fix off by one in fast commit" (a TAIL
        // value reaches the block's end): `end = start + blocksize`,
        // records while `cur <= end - 4`. Older logs (the record ending
        // one byte before) read the same way.
        let end = bs;
        let mut cur = 0usize;
        let mut step = Step::Continue;
        while cur + 4 <= end {
            let tag = le16(&b, cur);
            let len = usize::from(le16(&b, cur + 2));
            let val = cur + 4;
            let rec = cur..val + len;
            if len > end - val || !len_ok(tag, len, inode_size) {
                step = if num_tags > 0 {
                    Step::Stop
                } else {
                    Step::Fail(format!("tag {} with length {len}", tag_name(tag)))
                };
                break;
            }
            match tag {
                EXT4_FC_TAG_ADD_RANGE
                | EXT4_FC_TAG_DEL_RANGE
                | EXT4_FC_TAG_LINK
                | EXT4_FC_TAG_UNLINK
                | EXT4_FC_TAG_CREAT
                | EXT4_FC_TAG_INODE
                | EXT4_FC_TAG_PAD => {
                    cur_tag += 1;
                    counted[usize::from(tag)] += 1;
                    crc = crc32c_raw(crc, &b[rec]);
                }
                EXT4_FC_TAG_TAIL => {
                    cur_tag += 1;
                    counted[usize::from(tag)] += 1;
                    crc = crc32c_raw(crc, &b[cur..val + 4]);
                    let tid = le32(&b, val);
                    let tcrc = le32(&b, val + 4);
                    if tid == expected && tcrc == crc {
                        num_tags = cur_tag;
                        per_tag = counted;
                        valid_blocks = off + 1;
                    } else if num_tags > 0 {
                        step = Step::Stop;
                    } else {
                        step = Step::Fail(format!(
                            "the fast commit's tail (tid {tid}) does not match its checksum"
                        ));
                    }
                    crc = 0;
                }
                EXT4_FC_TAG_HEAD => {
                    let features = le32(&b, val);
                    if features & !EXT4_FC_SUPPORTED_FEATURES != 0 {
                        step = Step::Fail(format!("unknown fast-commit features {features:#x}"));
                    } else if le32(&b, val + 4) != expected {
                        step = Step::Stop;
                    } else {
                        cur_tag += 1;
                        counted[usize::from(tag)] += 1;
                        crc = crc32c_raw(crc, &b[rec]);
                    }
                }
                // len_ok refused every other tag above.
                _ => {}
            }
            if !matches!(step, Step::Continue) {
                break;
            }
            cur = val + len;
        }
        match step {
            Step::Continue => {}
            Step::Stop => {
                return Ok(if num_tags > 0 {
                    FcLog::Valid {
                        tid: expected,
                        tags: num_tags,
                        blocks: valid_blocks,
                        per_tag,
                    }
                } else {
                    FcLog::Empty
                });
            }
            Step::Fail(detail) => {
                return Ok(FcLog::Bad {
                    tid: expected,
                    block: lblk,
                    detail,
                });
            }
        }
    }
    Ok(FcLog::Empty)
}

/// Make the result of a fast-commit replay durable in one step: `blocks`
/// (home block -> its content once the full commits *and* the fast
/// commits of `rec` are replayed) are written as one full jbd2
/// transaction of tid `rec.end_tid` (the fast commits' tid) right after
/// the last full commit of the live log; the journal superblock is not
/// touched. Order as jbd2's commit: descriptors and copies, flush, the
/// commit block, flush.
///
/// Before the commit block is durable the log is what it was (the new
/// blocks lie in the free part of the ring, the fast-commit area is never
/// written), so the next open replays the same full and fast commits
/// again. Once it is durable a recovery replays one more full
/// transaction and then finds no fast commits for `end_tid + 1` (their
/// HEAD carries `end_tid`): the kernel, e2fsck and [`super::apply`] all
/// reach the replayed state. Returns the log blocks written.
pub fn commit_as_full(
    dev: &dyn Device,
    j: &Journal,
    rec: &Recovery,
    blocks: &BTreeMap<u64, Vec<u8>>,
) -> Result<u32, RecoverError> {
    let bs = j.block_size as usize;
    if !rec.dirty {
        return Err(RecoverError::Unsupported(
            "the journal is empty: no fast commits to make durable".into(),
        ));
    }
    for (&b, data) in blocks {
        if b >= j.fs_blocks || j.contains_phys(b) || data.len() != bs {
            return Err(RecoverError::Corrupt {
                what: "fast-commit replay",
                detail: format!("it would write block {b}, outside the filesystem's home blocks"),
            });
        }
    }
    let (first, last) = (u64::from(j.first()), u64::from(j.last()));
    let wrap = |v: u64| if v >= last { v - (last - first) } else { v };
    // After the commit block of the last full transaction (end_tid - 1);
    // a log without one starts at s_start.
    let start = u64::from(j.jsb.s_start.get());
    let pos = rec
        .entries
        .iter()
        .rev()
        .find(|e| e.tid == rec.end_tid.wrapping_sub(1) && matches!(e.kind, LogBlock::Commit { .. }))
        .map_or(start, |e| wrap(e.log_block + 1));
    let codec = LogCodec {
        fmt: j.fmt,
        seed: j.csum_seed(),
        block_size: bs,
        uuid: j.jsb.s_uuid,
    };
    let cap = last - first;
    let used = (pos + cap - start) % cap;
    let needed = codec.blocks_needed(blocks.len(), 0) as u64;
    // One block of margin: the ring never fills up to the log's tail.
    if needed + 1 > cap - used {
        return Err(RecoverError::Unsupported(format!(
            "the log has no room for the replayed fast commits ({needed} blocks, {} free; run e2fsck -fy, or mount it with the kernel)",
            cap - used
        )));
    }
    let list: Vec<(u64, &[u8])> = blocks.iter().map(|(&b, d)| (b, d.as_slice())).collect();
    let enc = codec.descriptor_blocks(rec.end_tid, &list);
    let put = |at: u64, data: &[u8]| -> Result<(), RecoverError> {
        let p = j.phys(at).ok_or_else(|| RecoverError::Log {
            block: at,
            detail: "not mapped".into(),
        })?;
        dev.write_at(data, p * bs as u64)?;
        Ok(())
    };
    let mut at = pos;
    for b in &enc.blocks {
        put(at, b)?;
        at = wrap(at + 1);
    }
    dev.flush()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let commit = codec.commit_block(
        rec.end_tid,
        now.as_secs(),
        now.subsec_nanos(),
        enc.crc32_sum,
    );
    put(at, &commit)?;
    dev.flush()?;
    Ok(enc.blocks.len() as u32 + 1)
}

/// Offsets in `struct ext4_inode` the INODE step uses.
const I_FLAGS: usize = 32;
const I_BLOCK: usize = 40;
const I_GENERATION: usize = 100;

/// The byte part of the INODE step (`ext4_fc_replay_inode`): the on-disk
/// inode `disk` (its whole slot) takes the fast commit's inode `fc`
/// (`ext4_fc_inode.fc_raw_inode`, 128 bytes up to the inode size) except
/// `i_block`: everything before it, and `i_generation` up to `fc`'s
/// length. An extent inode keeps the on-disk tree root, or gets an empty
/// one (magic, `eh_max` 4) when the slot had none (a new inode: the
/// ADD_RANGEs rebuild its mapping); an inline-data inode takes `fc`'s
/// `i_block` too; a block-mapped one keeps the on-disk map. The steps
/// after it (`i_blocks` from the mapping, the checksum, the bitmap bit)
/// belong to the caller. `false` when `fc` is shorter than 128 bytes or
/// longer than the slot (the scan's length check refuses both).
pub fn replay_inode_bytes(disk: &mut [u8], fc: &[u8]) -> bool {
    if fc.len() < 128 || fc.len() > disk.len() {
        return false;
    }
    disk[..I_BLOCK].copy_from_slice(&fc[..I_BLOCK]);
    disk[I_GENERATION..fc.len()].copy_from_slice(&fc[I_GENERATION..]);
    let flags = le32(disk, I_FLAGS);
    if flags & ext4kit_format::inode::EXT4_EXTENTS_FL != 0 {
        if le16(disk, I_BLOCK) != ext4kit_format::extent::EXTENT_MAGIC {
            let root = &mut disk[I_BLOCK..I_BLOCK + 12];
            root.fill(0);
            root[..2].copy_from_slice(&ext4kit_format::extent::EXTENT_MAGIC.to_le_bytes());
            // eh_max: (sizeof i_block - header) / sizeof extent.
            root[4..6].copy_from_slice(&4u16.to_le_bytes());
        }
    } else if flags & ext4kit_format::inode::EXT4_INLINE_DATA_FL != 0 {
        disk[I_BLOCK..I_GENERATION].copy_from_slice(&fc[I_BLOCK..I_GENERATION]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext4kit_format::extent::EXTENT_MAGIC;
    use ext4kit_format::inode::{EXT4_EXTENTS_FL, EXT4_INLINE_DATA_FL};

    fn fc_inode(flags: u32, fill: u8, len: usize) -> Vec<u8> {
        let mut v = vec![fill; len];
        v[I_FLAGS..I_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
        v
    }

    #[test]
    fn inode_step_keeps_the_disk_tree_root_or_starts_an_empty_one() {
        // A slot with a tree root: it stays, the rest is the fc inode's.
        let mut disk = vec![0u8; 256];
        disk[I_BLOCK..I_BLOCK + 2].copy_from_slice(&EXTENT_MAGIC.to_le_bytes());
        disk[I_BLOCK + 12] = 0x55;
        disk[200] = 0x77; // beyond the fc inode's 160 bytes
        let fc = fc_inode(EXT4_EXTENTS_FL, 0xAB, 160);
        assert!(replay_inode_bytes(&mut disk, &fc));
        assert!(disk[..I_FLAGS].iter().all(|&b| b == 0xAB));
        assert_eq!(le16(&disk, I_BLOCK), EXTENT_MAGIC);
        assert_eq!(disk[I_BLOCK + 12], 0x55, "the on-disk tree");
        assert!(disk[I_GENERATION..160].iter().all(|&b| b == 0xAB));
        assert_eq!(disk[200], 0x77, "past the fc inode: the slot's");
        // A zeroed slot (a new inode): an empty root.
        let mut disk = vec![0u8; 256];
        assert!(replay_inode_bytes(&mut disk, &fc));
        assert_eq!(
            &disk[I_BLOCK..I_BLOCK + 12],
            &[0x0A, 0xF3, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]
        );
        assert!(disk[I_BLOCK + 12..I_GENERATION].iter().all(|&b| b == 0));
        // Inline data: i_block is the fc inode's.
        let mut disk = vec![0u8; 256];
        let fc = fc_inode(EXT4_INLINE_DATA_FL, 0xCD, 128);
        assert!(replay_inode_bytes(&mut disk, &fc));
        assert!(disk[I_BLOCK..I_GENERATION].iter().all(|&b| b == 0xCD));
        // Block-mapped: the on-disk map stays.
        let mut disk = vec![9u8; 256];
        let fc = fc_inode(0, 0xEE, 128);
        assert!(replay_inode_bytes(&mut disk, &fc));
        assert!(disk[I_BLOCK..I_GENERATION].iter().all(|&b| b == 9));
        assert!(disk[I_GENERATION..128].iter().all(|&b| b == 0xEE));
        // Lengths the scan refuses.
        assert!(!replay_inode_bytes(&mut [0u8; 256], &[0u8; 127]));
        assert!(!replay_inode_bytes(&mut [0u8; 128], &[0u8; 160]));
    }
}
