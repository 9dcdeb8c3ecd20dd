//! The commit writer (the kernel's `jbd2_journal_commit_transaction`
//! for data=ordered, reduced to what a synchronous writer needs).
//!
//! Order: (0) freeze the running transaction once its handles ended and
//! open the next one; (1) ordered data is already on the device (handles
//! write it before they end); (2) at the log head: revoke blocks, then
//! descriptors with the log copies, and the journal superblock when the
//! log was empty (`s_start`/`s_sequence` of this transaction); (3) flush;
//! (4) the commit block (time, checksum); (5) flush: the transaction is
//! durable. Only then do its blocks become checkpointable, its revoked
//! blocks forgotten and its freed extents handed to the hook. Nothing is
//! written home here: the checkpoint does that, from committed images.
//! When the log has no room for the transaction, a checkpoint runs first.
//! Any I/O error aborts the journal (no further transactions).
//!
//! Without a journal ([`JournalWriter::without_journal`]) the same freeze
//! is followed by: (1) the ordered data, already written, is flushed;
//! (2) the frozen images are written home in place (sorted, neighbours
//! merged); (3) flush. The transaction is then durable and its blocks are
//! clean at once (no checkpoint); revoked blocks are simply forgotten (no
//! log holds a copy of them). A crash between (2) and (3) can leave any
//! part of the transaction home: e2fsck repairs that, as after a crash of
//! the kernel's ext4 without a journal.

use std::time::{SystemTime, UNIX_EPOCH};

use ext4kit_format::jbd2::JBD2_FEATURE_INCOMPAT_REVOKE;

use super::log::{LiveTxn, write_blocks};
use super::txn::{JournalWriter, LogState, Transaction, TxnState, lock};
use crate::{BlockRead, FsError};

/// Largest single write the writer issues, in blocks.
pub(crate) const MAX_RUN: usize = 256;

impl JournalWriter {
    /// Commit the running transaction (waiting for its open handles) and
    /// return its tid, or `None` if it was empty.
    pub fn commit(&self) -> Result<Option<u32>, FsError> {
        let mut log = lock(&self.log);
        let r = self.commit_locked(&mut log);
        if r.is_err() {
            self.record_errno(&mut log);
        }
        r
    }

    pub(crate) fn commit_locked(&self, log: &mut LogState) -> Result<Option<u32>, FsError> {
        let (txn, frozen) = {
            let mut st = lock(&self.state);
            if let Some(a) = &st.aborted {
                return Err(FsError::Aborted(a.clone()));
            }
            if st.running.is_empty() && st.running.updates == 0 {
                return Ok(None);
            }
            st.locked = true;
            while st.running.updates > 0 {
                st = TxnState::wait(st, &self.cond);
            }
            // A handle may have failed (and aborted the journal) while
            // this commit waited for it: its half change must not commit.
            if let Some(a) = st.aborted.clone() {
                st.locked = false;
                st.notify(&self.cond);
                return Err(FsError::Aborted(a));
            }
            if st.running.is_empty() {
                st.locked = false;
                st.notify(&self.cond);
                return Ok(None);
            }
            let next = Transaction {
                tid: st.running.tid.wrapping_add(1),
                ..Default::default()
            };
            let txn = std::mem::replace(&mut st.running, next);
            let blocks: Vec<u64> = txn.buffers.iter().copied().collect();
            let frozen = self.cache.freeze(&blocks);
            st.locked = false;
            st.notify(&self.cond);
            (txn, frozen)
        };
        let tid = txn.tid;
        let blocks: Vec<u64> = frozen.iter().map(|(b, _)| *b).collect();
        if self.journal.is_some() {
            if let Err(e) = self.write_transaction(log, &txn, &frozen) {
                return Err(self.abort(&e));
            }
            // Durable.
            self.cache.committed(tid, &blocks);
            for &r in &txn.revokes {
                self.cache.forget(r);
            }
        } else if let Err(e) = self.write_in_place(tid, &txn, &blocks) {
            return Err(self.abort(&e));
        }
        {
            let mut st = lock(&self.state);
            st.last_committed = tid;
            st.notify(&self.cond);
        }
        for h in lock(&self.hooks).iter() {
            h(tid, &txn.freed);
        }
        lock(&self.stats).commits += 1;
        Ok(Some(tid))
    }

    /// The commit of a writer without a journal (see the module docs).
    fn write_in_place(&self, tid: u32, txn: &Transaction, blocks: &[u64]) -> Result<(), FsError> {
        self.cache.committed(tid, blocks);
        for &r in &txn.revokes {
            self.cache.forget(r);
        }
        // The data this transaction orders is durable before any of its
        // metadata reaches its home.
        self.dev.flush()?;
        let list = self.cache.checkpoint_list();
        write_blocks(
            &*self.dev,
            self.cache.block_size(),
            list.iter().map(|(b, _, img)| (*b, &img[..])),
            MAX_RUN,
        )?;
        self.dev.flush()?;
        self.cache.checkpointed(&list);
        lock(&self.stats).home_blocks_written += list.len() as u64;
        Ok(())
    }

    fn write_transaction(
        &self,
        log: &mut LogState,
        txn: &Transaction,
        frozen: &[(u64, std::sync::Arc<[u8]>)],
    ) -> Result<(), FsError> {
        let tid = txn.tid;
        let revokes: Vec<u64> = txn.revokes.iter().copied().collect();
        if !revokes.is_empty()
            && log.jsb.s_feature_incompat.get() & JBD2_FEATURE_INCOMPAT_REVOKE == 0
        {
            // jbd2 sets REVOKE before it writes the first revoke record.
            let f = log.jsb.s_feature_incompat.get() | JBD2_FEATURE_INCOMPAT_REVOKE;
            log.jsb.s_feature_incompat.set(f);
            log.codec.fmt.incompat = f;
            log.jsb_dirty = true;
        }
        let rblocks = log.codec.revoke_blocks(tid, &revokes);
        let refs: Vec<(u64, &[u8])> = frozen.iter().map(|(b, d)| (*b, &d[..])).collect();
        let enc = log.codec.descriptor_blocks(tid, &refs);
        let needed = (rblocks.len() + enc.blocks.len() + 1) as u32;
        if needed > log.ring.capacity() - 1 {
            return Err(FsError::TooBig {
                wanted: needed,
                max: log.ring.capacity() - 1,
            });
        }
        if log.ring.free() < needed {
            self.checkpoint_locked(log, tid)?;
        }
        let Some(journal) = self.journal.as_ref() else {
            return Err(FsError::Unsupported("no journal to log into".into()));
        };
        let bs = u64::from(journal.block_size);
        let start = log.ring.head;
        let mut placed = Vec::with_capacity(rblocks.len() + enc.blocks.len());
        for b in rblocks.iter().chain(enc.blocks.iter()) {
            let pos = log.ring.take();
            let p = journal.phys(u64::from(pos)).ok_or_else(|| {
                FsError::corrupt("journal inode", format!("log block {pos} is not mapped"))
            })?;
            placed.push((p, &b[..]));
        }
        write_blocks(&*self.dev, journal.block_size, placed, MAX_RUN)?;
        if log.jsb_empty {
            log.jsb.s_start.set(start);
            log.jsb.s_sequence.set(tid);
            log.jsb_dirty = true;
        }
        if log.jsb_dirty {
            self.write_jsb(log)?;
            log.jsb_empty = false;
        }
        self.dev.flush()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let cb = log
            .codec
            .commit_block(tid, now.as_secs(), now.subsec_nanos(), enc.crc32_sum);
        let pos = log.ring.take();
        let p = journal.phys(u64::from(pos)).ok_or_else(|| {
            FsError::corrupt("journal inode", format!("log block {pos} is not mapped"))
        })?;
        self.dev.write_at(&cb, p * bs)?;
        self.dev.flush()?;
        log.ring.push(LiveTxn {
            tid,
            start,
            len: needed,
        });
        lock(&self.stats).log_blocks_written += u64::from(needed);
        Ok(())
    }
}
