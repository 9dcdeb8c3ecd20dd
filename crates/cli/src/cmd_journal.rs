//! `ext4kit journal dump|replay`: look at and replay an ext4 filesystem's
//! jbd2 journal offline (what `debugfs -R logdump` and
//! `e2fsck -E journal_only` do).

use std::path::{Path, PathBuf};

use anyhow::Context;
use ext4kit_device::{Device, OpenOptions};
use ext4kit_format::features::Incompat;
use ext4kit_format::jbd2::*;
use ext4kit_fs::journal::fast_commit::{self, FcLog, FcTag};
use ext4kit_fs::journal::recover::{self, Journal, LogBlock, Recovery};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct JournalArgs {
    #[command(subcommand)]
    pub cmd: JournalCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum JournalCmd {
    /// List the live log: transactions, descriptor tags, revoke records,
    /// commit blocks, what a replay would write (like debugfs logdump),
    /// and with fast_commit what the fast-commit area holds (each fast
    /// commit record, decoded). Read-only.
    Dump(DumpArgs),
    /// Replay a dirty journal into the filesystem (scan, revoke, replay, as
    /// the kernel and e2fsck do), then mark the journal empty and clear
    /// needs_recovery. Fast commits after the last full commit are
    /// replayed too (as one more full transaction first); a fast-commit
    /// log of a kind ext4kit does not replay (directories, symlinks and
    /// special files, inline data, block maps, bigalloc, quota) or a
    /// damaged one is refused with one line, nothing written. Refuses
    /// mounted or busy devices.
    Replay(ReplayArgs),
}

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// ext4 image file or block device.
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// ext4 image file or block device.
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,
    /// Report what would be replayed; write nothing.
    #[arg(short = 'n', long = "dry-run")]
    pub dry_run: bool,
}

pub fn run(args: &JournalArgs) -> anyhow::Result<i32> {
    match &args.cmd {
        JournalCmd::Dump(a) => dump(a),
        JournalCmd::Replay(a) => replay(a),
    }
}

fn feature_names(fmt: LogFormat) -> Vec<&'static str> {
    let mut v = Vec::new();
    if fmt.csum_v1() {
        v.push("checksum");
    }
    for (bit, name) in [
        (JBD2_FEATURE_INCOMPAT_REVOKE, "revoke"),
        (JBD2_FEATURE_INCOMPAT_64BIT, "64bit"),
        (JBD2_FEATURE_INCOMPAT_ASYNC_COMMIT, "async_commit"),
        (JBD2_FEATURE_INCOMPAT_CSUM_V2, "csum_v2"),
        (JBD2_FEATURE_INCOMPAT_CSUM_V3, "csum_v3"),
        (JBD2_FEATURE_INCOMPAT_FAST_COMMIT, "fast_commit"),
    ] {
        if fmt.incompat & bit != 0 {
            v.push(name);
        }
    }
    v
}

fn open_journal(dev: &dyn Device, path: &Path) -> anyhow::Result<Journal> {
    Journal::open(dev).with_context(|| format!("{}", path.display()))
}

fn needs_recovery(j: &Journal) -> bool {
    j.sb.s_feature_incompat.get() & Incompat::RECOVER.bits() != 0
}

fn dump(args: &DumpArgs) -> anyhow::Result<i32> {
    let path = &args.device;
    let dev = crate::extjournal::open(path, OpenOptions::read_only())?;
    let j = open_journal(dev.as_ref(), path)?;
    let (rec, res) = recover::analyze(dev.as_ref(), &j);
    let jsb = &j.jsb;
    // The fast commits' records, decoded (a read error or a changed area
    // shows as the error instead).
    let fc_records = fast_commit::records(dev.as_ref(), &j, &rec.fast_commit);
    if args.json {
        let entries: Vec<_> = rec
            .entries
            .iter()
            .map(|e| match &e.kind {
                LogBlock::Descriptor { tags, checksum_ok } => json!({
                    "log_block": e.log_block, "tid": e.tid, "type": "descriptor",
                    "checksum_ok": checksum_ok,
                    "tags": tags.iter().map(|t| json!({
                        "block": t.block, "log_block": t.log_block, "flags": t.flags,
                        "escaped": t.flags & JBD2_FLAG_ESCAPE != 0,
                    })).collect::<Vec<_>>(),
                }),
                LogBlock::Revoke {
                    blocks,
                    checksum_ok,
                } => json!({
                    "log_block": e.log_block, "tid": e.tid, "type": "revoke",
                    "checksum_ok": checksum_ok, "blocks": blocks,
                }),
                LogBlock::Commit {
                    sec,
                    nsec,
                    checksum_ok,
                } => json!({
                    "log_block": e.log_block, "tid": e.tid, "type": "commit",
                    "checksum_ok": checksum_ok, "commit_sec": sec, "commit_nsec": nsec,
                }),
            })
            .collect();
        let v = json!({
            "device": path.display().to_string(),
            "needs_recovery": needs_recovery(&j),
            "block_size": j.block_size,
            "maxlen": jsb.s_maxlen.get(),
            "first": jsb.s_first.get(),
            "external": j.is_external(),
            "start": jsb.s_start.get(),
            "sequence": jsb.s_sequence.get(),
            "errno": jsb.s_errno.get() as i32,
            "features": feature_names(j.fmt),
            "entries": entries,
            "end_tid": rec.end_tid,
            "next_sequence": rec.next_sequence,
            "failed_commit": rec.failed_commit,
            "transactions": rec.transactions(),
            "replay_blocks": rec.writes.len(),
            "replay_tags": rec.nr_replays,
            "revoke_records": rec.nr_revokes,
            "revoked_tags": rec.nr_revoke_hits,
            "fc_blocks": jsb.fc_area_blocks(),
            "fast_commit": fc_json(&rec.fast_commit),
            "fast_commit_records": match &fc_records {
                Ok(r) => json!(r.iter().map(fc_record_json).collect::<Vec<_>>()),
                Err(e) => json!({ "error": e.to_string() }),
            },
            "error": res.as_ref().err().map(|e| e.to_string()),
        });
        outln!("{v}");
        return Ok(0);
    }
    if j.is_external() {
        outln!(
            "Journal on an external journal device (UUID {})",
            recover::fmt_uuid(&j.sb.s_journal_uuid)
        );
    }
    outln!(
        "Journal: {} blocks of {} bytes, first {}, features: {}",
        jsb.s_maxlen.get(),
        j.block_size,
        jsb.s_first.get(),
        match feature_names(j.fmt) {
            v if v.is_empty() => "(none)".to_string(),
            v => v.join(" "),
        }
    );
    outln!(
        "needs_recovery: {}, s_start {}, s_sequence {}, s_errno {}",
        if needs_recovery(&j) { "yes" } else { "no" },
        jsb.s_start.get(),
        jsb.s_sequence.get(),
        jsb.s_errno.get() as i32
    );
    if !rec.dirty {
        outln!("The log is empty.");
        return Ok(0);
    }
    outln!(
        "Journal starts at block {}, transaction {}",
        jsb.s_start.get(),
        jsb.s_sequence.get()
    );
    let bad = |ok: bool| if ok { "" } else { " (bad checksum)" };
    for e in &rec.entries {
        match &e.kind {
            LogBlock::Descriptor { tags, checksum_ok } => {
                outln!(
                    "Found sequence {}, descriptor block at block {}{}",
                    e.tid,
                    e.log_block,
                    bad(*checksum_ok)
                );
                for t in tags {
                    outln!(
                        "  FS block {} logged at journal block {} (flags {:#x})",
                        t.block,
                        t.log_block,
                        t.flags
                    );
                }
            }
            LogBlock::Revoke {
                blocks,
                checksum_ok,
            } => {
                outln!(
                    "Found sequence {}, revoke block at block {}, {} records{}",
                    e.tid,
                    e.log_block,
                    blocks.len(),
                    bad(*checksum_ok)
                );
                for b in blocks {
                    outln!("  Revoke FS block {b}");
                }
            }
            LogBlock::Commit {
                sec,
                nsec,
                checksum_ok,
            } => outln!(
                "Found sequence {}, commit block at block {} (time {sec}.{nsec:09}){}",
                e.tid,
                e.log_block,
                bad(*checksum_ok)
            ),
        }
    }
    outln!("End of log before transaction {}", rec.end_tid);
    if let Some(t) = rec.failed_commit {
        outln!("Transaction {t} has a bad commit checksum");
    }
    if let Some(area) = j.fc_area() {
        match &rec.fast_commit {
            FcLog::Empty => outln!(
                "Fast-commit area: journal blocks {}..{}, nothing to replay for transaction {}",
                area.start,
                area.end,
                rec.end_tid
            ),
            FcLog::Valid {
                tid,
                tags,
                blocks,
                per_tag,
            } => {
                let each: Vec<String> = per_tag
                    .iter()
                    .enumerate()
                    .filter(|&(_, &n)| n > 0)
                    .map(|(t, n)| format!("{} {n}", fast_commit::tag_name(t as u16)))
                    .collect();
                outln!(
                    "Fast-commit area: journal blocks {}..{}, fast commits of transaction {tid}: {tags} tags in {blocks} blocks ({})",
                    area.start,
                    area.end,
                    each.join(", ")
                );
                match &fc_records {
                    Ok(r) => {
                        for t in r {
                            outln!("  {}", fc_record_text(t));
                        }
                    }
                    Err(e) => outln!("  records unreadable: {e}"),
                }
            }
            FcLog::Bad { block, detail, .. } => outln!(
                "Fast-commit area: journal blocks {}..{}, damaged at block {block}: {detail}",
                area.start,
                area.end
            ),
        }
    }
    match res {
        Ok(()) => outln!(
            "Replay: {} transactions, {} blocks ({} tags, {} revoked by {} revoke records), next sequence {}",
            rec.transactions(),
            rec.writes.len(),
            rec.nr_replays,
            rec.nr_revoke_hits,
            rec.nr_revokes,
            rec.next_sequence
        ),
        Err(e) => outln!("Replay would fail: {e}"),
    }
    Ok(0)
}

fn fc_record_json(t: &FcTag) -> serde_json::Value {
    match t {
        FcTag::Head { features, tid } => {
            json!({ "tag": "HEAD", "features": features, "tid": tid })
        }
        FcTag::AddRange {
            ino,
            lblk,
            len,
            unwritten,
            pblk,
        } => json!({
            "tag": "ADD_RANGE", "ino": ino, "lblk": lblk, "len": len,
            "unwritten": unwritten, "pblk": pblk,
        }),
        FcTag::DelRange { ino, lblk, len } => {
            json!({ "tag": "DEL_RANGE", "ino": ino, "lblk": lblk, "len": len })
        }
        FcTag::Dentry {
            tag,
            parent,
            ino,
            name,
        } => json!({
            "tag": fast_commit::tag_name(*tag), "parent": parent, "ino": ino,
            "name": String::from_utf8_lossy(name),
        }),
        FcTag::Inode { ino, raw } => {
            let le32 = |o: usize| {
                raw.get(o..o + 4)
                    .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            };
            json!({
                "tag": "INODE", "ino": ino, "inode_bytes": raw.len(),
                // i_mode (le16 at 0), i_links_count (le16 at 26),
                // i_size_lo/high (4, 108).
                "mode": le32(0) & 0xffff,
                "size": u64::from(le32(4)) | (u64::from(le32(108)) << 32),
                "links": le32(24) >> 16,
            })
        }
        FcTag::Pad => json!({ "tag": "PAD" }),
        FcTag::Tail { tid, crc } => json!({ "tag": "TAIL", "tid": tid, "crc": crc }),
    }
}

fn fc_record_text(t: &FcTag) -> String {
    let v = fc_record_json(t);
    let mut out = v["tag"].as_str().unwrap_or("?").to_string();
    if let Some(m) = v.as_object() {
        for (k, val) in m {
            if k != "tag" {
                out.push_str(&format!(" {k} {val}"));
            }
        }
    }
    out
}

fn fc_json(fc: &FcLog) -> serde_json::Value {
    match fc {
        FcLog::Empty => json!({ "state": "empty" }),
        FcLog::Valid {
            tid,
            tags,
            blocks,
            per_tag,
        } => json!({
            "state": "valid", "tid": tid, "tags": tags, "blocks": blocks,
            "per_tag": per_tag.iter().enumerate().filter(|&(_, &n)| n > 0)
                .map(|(t, &n)| (fast_commit::tag_name(t as u16).to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
        }),
        FcLog::Bad { tid, block, detail } => json!({
            "state": "damaged", "tid": tid, "block": block, "detail": detail,
        }),
    }
}

fn summary(rec: &Recovery) -> String {
    format!(
        "{} transactions ({}..{}), {} blocks, {} revoked tags",
        rec.transactions(),
        rec.start_tid,
        rec.end_tid,
        rec.writes.len(),
        rec.nr_revoke_hits
    )
}

fn replay(args: &ReplayArgs) -> anyhow::Result<i32> {
    let path = &args.device;
    let opts = if args.dry_run {
        OpenOptions::read_only()
    } else {
        OpenOptions::read_write()
    };
    // Refuses a mounted device (or a file behind a mounted loop device)
    // and a device someone else holds exclusively.
    let dev = crate::extjournal::open(path, opts)?;
    let j = open_journal(dev.as_ref(), path)?;
    let p = path.display();
    if !needs_recovery(&j) {
        if j.jsb.s_start.get() != 0 {
            outln!(
                "{p}: needs_recovery is clear but the journal has data; not replaying (the kernel discards such a log)"
            );
        } else {
            outln!("{p}: the journal is clean, nothing to replay");
        }
        return Ok(0);
    }
    let rec = recover::recover(dev.as_ref(), &j).with_context(|| format!("{p}"))?;
    // Fast commits: replayed when ext4kit covers them, else refused with
    // one line before anything is written.
    if args.dry_run {
        let fc = recover::fast_commit_result(dev.as_ref(), &j, &rec)
            .map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
        if matches!(rec.fast_commit, FcLog::Valid { .. }) {
            outln!(
                "{p}: would replay {} and its fast commits ({} blocks change)",
                summary(&rec),
                fc.len()
            );
        } else {
            outln!("{p}: would replay {}", summary(&rec));
        }
        return Ok(0);
    }
    let rec = if matches!(rec.fast_commit, FcLog::Valid { .. }) {
        recover::replay_fast_commits(dev.as_ref(), &j, &rec)
            .map_err(|e| anyhow::anyhow!("{p}: {e}"))?
    } else {
        rec
    };
    let done = recover::apply(dev.as_ref(), &j, &rec).with_context(|| format!("{p}"))?;
    outln!(
        "{p}: replayed {}; journal reset, next transaction {}{}",
        summary(&rec),
        rec.next_sequence,
        if done.marked_error {
            "; the filesystem is marked with errors (run e2fsck)"
        } else {
            ""
        }
    );
    Ok(0)
}
