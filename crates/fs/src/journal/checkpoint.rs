//! Checkpoint: write every block's last committed image home, flush,
//! then move the journal's tail (`s_start` = head, `s_sequence` = the next
//! tid: the log is empty from there), flush. Runs when a commit finds too
//! little room in the log, on request, and at clean close, where the
//! journal is then marked empty (`s_start = 0`).

use super::commit::MAX_RUN;
use super::log::write_blocks;
use super::txn::{JournalWriter, LogState, lock};
use crate::{BlockRead, FsError};

impl JournalWriter {
    /// Checkpoint everything committed so far.
    pub fn checkpoint(&self) -> Result<(), FsError> {
        if let Some(a) = self.aborted() {
            return Err(FsError::Aborted(a));
        }
        let mut log = lock(&self.log);
        let next = self.running_tid();
        let r = self
            .checkpoint_locked(&mut log, next)
            .map_err(|e| self.abort(&e));
        if r.is_err() {
            self.record_errno(&mut log);
        }
        r
    }

    /// `next_tid`: the first transaction that will be logged after this.
    pub(crate) fn checkpoint_locked(
        &self,
        log: &mut LogState,
        next_tid: u32,
    ) -> Result<(), FsError> {
        let list = self.cache.checkpoint_list();
        if list.is_empty() && log.ring.live.is_empty() {
            return Ok(());
        }
        // `list` is sorted by block: neighbours merge into one write.
        write_blocks(
            &*self.dev,
            self.cache.block_size(),
            list.iter().map(|(b, _, img)| (*b, &img[..])),
            MAX_RUN,
        )?;
        self.dev.flush()?;
        log.ring.clear();
        if !log.jsb_empty {
            let head = log.ring.head;
            log.jsb.s_start.set(head);
            log.jsb.s_sequence.set(next_tid);
            self.write_jsb(log)?;
            self.dev.flush()?;
        }
        self.cache.checkpointed(&list);
        let mut s = lock(&self.stats);
        s.checkpoints += 1;
        s.home_blocks_written += list.len() as u64;
        Ok(())
    }

    /// Clean shutdown of the journal: commit, checkpoint all, then mark
    /// the journal empty (`s_start = 0`, `s_sequence` = next tid, `s_head`
    /// = head, as the kernel's `jbd2_mark_journal_empty`), flush. Returns
    /// the next tid. The writer accepts no handle afterwards.
    pub fn shutdown(&self) -> Result<u32, FsError> {
        self.commit()?;
        let mut log = lock(&self.log);
        let next = self.running_tid();
        let r = (|| {
            self.checkpoint_locked(&mut log, next)?;
            if self.journal.is_none() {
                // Every commit wrote its blocks home already.
                return Ok(());
            }
            log.jsb.s_start.set(0);
            log.jsb.s_sequence.set(next);
            let head = log.ring.head;
            log.jsb.s_head.set(head);
            self.write_jsb(&mut log)?;
            self.dev.flush()?;
            log.jsb_empty = true;
            Ok(())
        })();
        if let Err(e) = r {
            let e = self.abort(&e);
            self.record_errno(&mut log);
            return Err(e);
        }
        lock(&self.state).aborted = Some("the journal was shut down".into());
        Ok(next)
    }
}
