//! The log as a writer sees it: the ring of log blocks (head, tail, free
//! space) and the encoding of revoke, descriptor and commit blocks in
//! every form the journal's features call for (tag3 + csum v3, the
//! 32/64-bit tags with csum v2, v1 or none).
//!
//! Encoding follows the kernel's `fs/jbd2/commit.c` and `revoke.c`:
//! descriptors are closed when fewer than `tag_bytes + 16 + tail` bytes
//! are left (so a 4 KiB v3 descriptor holds 253 tags, as the kernel's),
//! the first tag of each descriptor is followed by the journal UUID and
//! every later one carries SAME_UUID, the last LAST_TAG, and a block
//! whose first four bytes are the jbd2 magic is logged with them zeroed
//! and ESCAPE set. Tag checksums are over the log copy (after escaping).

use std::collections::VecDeque;

use ext4kit_format::checksum::{self, jbd2 as jcsum};
use ext4kit_format::jbd2::*;
use zerocopy::{FromZeros, IntoBytes};

/// How to encode a transaction's log blocks.
#[derive(Clone, Debug)]
pub struct LogCodec {
    pub fmt: LogFormat,
    /// `j_csum_seed` (crc32c of the journal UUID).
    pub seed: u32,
    pub block_size: usize,
    pub uuid: [u8; 16],
}

/// The encoded log blocks of one transaction, in log order, without the
/// commit block.
#[derive(Clone, Debug, Default)]
pub struct Encoded {
    pub blocks: Vec<Vec<u8>>,
    /// crc32_be over descriptors and copies (checksum v1), seeded `!0`.
    pub crc32_sum: u32,
}

impl LogCodec {
    fn header(&self, block: &mut [u8], blocktype: u32, tid: u32) {
        block[..12].copy_from_slice(JournalHeader::new(blocktype, tid).as_bytes());
    }

    fn set_tail(&self, block: &mut [u8]) {
        if self.fmt.csum_v2or3() {
            let n = block.len();
            block[n - 4..].fill(0);
            let c = jcsum::block_tail(self.seed, block);
            block[n - 4..].copy_from_slice(&c.to_be_bytes());
        }
    }

    /// Revoke records per revoke block.
    pub fn revokes_per_block(&self) -> usize {
        (self.block_size - self.fmt.tail_bytes() - size_of::<RevokeHeader>())
            / self.fmt.revoke_record_bytes()
    }

    /// Most tags one descriptor block holds (the kernel's rule).
    pub fn tags_per_descriptor(&self) -> usize {
        let tb = self.fmt.tag_bytes();
        let limit = tb + 16 + self.fmt.tail_bytes();
        let mut space = self.block_size - size_of::<JournalHeader>();
        let mut n = 0;
        loop {
            space -= tb + if n == 0 { 16 } else { 0 };
            n += 1;
            if space < limit {
                return n;
            }
        }
    }

    /// Log blocks (commit block included) a transaction of `nblocks`
    /// logged blocks and `nrevokes` revoke records needs.
    pub fn blocks_needed(&self, nblocks: usize, nrevokes: usize) -> usize {
        nrevokes.div_ceil(self.revokes_per_block())
            + nblocks.div_ceil(self.tags_per_descriptor())
            + nblocks
            + 1
    }

    /// Revoke blocks for `revokes` (type 5, `r_count` including the
    /// header, 4- or 8-byte records, tail checksum).
    pub fn revoke_blocks(&self, tid: u32, revokes: &[u64]) -> Vec<Vec<u8>> {
        let rb = self.fmt.revoke_record_bytes();
        revokes
            .chunks(self.revokes_per_block())
            .map(|chunk| {
                let mut b = vec![0u8; self.block_size];
                self.header(&mut b, JBD2_REVOKE_BLOCK, tid);
                let mut off = size_of::<RevokeHeader>();
                for &r in chunk {
                    if rb == 8 {
                        b[off..off + 8].copy_from_slice(&r.to_be_bytes());
                    } else {
                        b[off..off + 4].copy_from_slice(&(r as u32).to_be_bytes());
                    }
                    off += rb;
                }
                b[12..16].copy_from_slice(&(off as u32).to_be_bytes());
                self.set_tail(&mut b);
                b
            })
            .collect()
    }

    /// Descriptor blocks, each followed by the log copies of its blocks.
    pub fn descriptor_blocks(&self, tid: u32, blocks: &[(u64, &[u8])]) -> Encoded {
        let mut out = Encoded {
            blocks: Vec::with_capacity(blocks.len() + blocks.len() / 64 + 1),
            crc32_sum: !0,
        };
        let tb = self.fmt.tag_bytes();
        for chunk in blocks.chunks(self.tags_per_descriptor()) {
            let mut d = vec![0u8; self.block_size];
            self.header(&mut d, JBD2_DESCRIPTOR_BLOCK, tid);
            let mut off = size_of::<JournalHeader>();
            let mut copies = Vec::with_capacity(chunk.len());
            for (i, (home, data)) in chunk.iter().enumerate() {
                let mut copy = data.to_vec();
                let mut flags = if i == 0 { 0 } else { JBD2_FLAG_SAME_UUID };
                if copy.len() >= 4 && copy[..4] == JBD2_MAGIC.to_be_bytes() {
                    copy[..4].fill(0);
                    flags |= JBD2_FLAG_ESCAPE;
                }
                if i + 1 == chunk.len() {
                    flags |= JBD2_FLAG_LAST_TAG;
                }
                let checksum = if self.fmt.csum_v3() {
                    jcsum::tag(self.seed, tid, &copy)
                } else if self.fmt.csum_v2() {
                    jcsum::tag(self.seed, tid, &copy) & 0xFFFF
                } else {
                    0
                };
                Tag {
                    blocknr: *home,
                    flags,
                    checksum,
                }
                .write(&mut d[off..], self.fmt);
                off += tb;
                if i == 0 {
                    d[off..off + 16].copy_from_slice(&self.uuid);
                    off += 16;
                }
                copies.push(copy);
            }
            self.set_tail(&mut d);
            if self.fmt.csum_v1() {
                out.crc32_sum = checksum::crc32_be(out.crc32_sum, &d);
                for c in &copies {
                    out.crc32_sum = checksum::crc32_be(out.crc32_sum, c);
                }
            }
            out.blocks.push(d);
            out.blocks.extend(copies);
        }
        out
    }

    /// The commit block (time, checksum by the journal's features).
    pub fn commit_block(&self, tid: u32, sec: u64, nsec: u32, crc32_sum: u32) -> Vec<u8> {
        let mut b = vec![0u8; self.block_size];
        let mut h = CommitHeader::new_zeroed();
        h.h_header = JournalHeader::new(JBD2_COMMIT_BLOCK, tid);
        h.h_commit_sec.set(sec);
        h.h_commit_nsec.set(nsec);
        if self.fmt.csum_v1() {
            h.h_chksum_type = JBD2_CRC32_CHKSUM;
            h.h_chksum_size = JBD2_CRC32_CHKSUM_SIZE;
            h.h_chksum[0].set(crc32_sum);
        }
        b[..size_of::<CommitHeader>()].copy_from_slice(h.as_bytes());
        if self.fmt.csum_v2or3() {
            let c = jcsum::commit(self.seed, &b);
            b[16..20].copy_from_slice(&c.to_be_bytes());
        }
        b
    }
}

/// Write `blocks` (physical block, one block of data), merging runs of
/// consecutive physical blocks into single writes (at most `max_run`
/// blocks each). Order between runs is irrelevant: a flush follows.
pub fn write_blocks<'a>(
    dev: &dyn ext4kit_device::Device,
    block_size: u32,
    blocks: impl IntoIterator<Item = (u64, &'a [u8])>,
    max_run: usize,
) -> Result<u64, ext4kit_device::DeviceError> {
    let bs = u64::from(block_size);
    let mut run: Vec<u8> = Vec::new();
    let mut run_start = 0u64;
    let mut run_len = 0u64;
    let mut writes = 0;
    let mut flush = |run: &mut Vec<u8>, start: u64, len: &mut u64| {
        if *len == 0 {
            return Ok(());
        }
        writes += 1;
        let r = dev.write_at(run, start * bs);
        run.clear();
        *len = 0;
        r
    };
    for (p, data) in blocks {
        if run_len > 0 && (p != run_start + run_len || run_len as usize >= max_run) {
            flush(&mut run, run_start, &mut run_len)?;
        }
        if run_len == 0 {
            run_start = p;
        }
        run.extend_from_slice(data);
        run_len += 1;
    }
    flush(&mut run, run_start, &mut run_len)?;
    Ok(writes)
}

/// A transaction in the live part of the log (committed, not yet
/// checkpointed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveTxn {
    pub tid: u32,
    /// First log block.
    pub start: u32,
    /// Log blocks used, commit block included.
    pub len: u32,
}

/// The circular log `first..last` (log block numbers).
#[derive(Clone, Debug)]
pub struct LogRing {
    pub first: u32,
    pub last: u32,
    /// Next log block to write.
    pub head: u32,
    /// Live transactions, oldest first.
    pub live: VecDeque<LiveTxn>,
    used: u32,
}

impl LogRing {
    /// An empty log whose next write goes to `head`.
    pub fn new(first: u32, last: u32, head: u32) -> Self {
        let head = if (first..last).contains(&head) {
            head
        } else {
            first
        };
        LogRing {
            first,
            last,
            head,
            live: VecDeque::new(),
            used: 0,
        }
    }

    /// Blocks the ring holds in all.
    pub fn capacity(&self) -> u32 {
        self.last - self.first
    }

    /// Blocks in live transactions.
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Free blocks; one is always kept so that the head never reaches
    /// the tail.
    pub fn free(&self) -> u32 {
        self.capacity() - self.used - 1
    }

    /// Oldest live block (`head` when the log is empty).
    pub fn tail(&self) -> u32 {
        self.live.front().map_or(self.head, |t| t.start)
    }

    /// The log block after `pos`, wrapping at `last`.
    pub fn next(&self, pos: u32) -> u32 {
        if pos + 1 >= self.last {
            self.first
        } else {
            pos + 1
        }
    }

    /// Take the block at the head and advance it.
    pub fn take(&mut self) -> u32 {
        let p = self.head;
        self.head = self.next(p);
        p
    }

    /// A transaction of `len` blocks from `start` is now live.
    pub fn push(&mut self, txn: LiveTxn) {
        self.used += txn.len;
        self.live.push_back(txn);
    }

    /// Everything is checkpointed: the log is empty from the head on.
    pub fn clear(&mut self) {
        self.live.clear();
        self.used = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(incompat: u32, compat: u32, bs: usize) -> LogCodec {
        LogCodec {
            fmt: LogFormat { compat, incompat },
            seed: jcsum::seed(&[7; 16]),
            block_size: bs,
            uuid: [7; 16],
        }
    }

    #[test]
    fn descriptor_capacity_matches_the_kernel() {
        let v3 = JBD2_FEATURE_INCOMPAT_CSUM_V3 | JBD2_FEATURE_INCOMPAT_64BIT;
        assert_eq!(codec(v3, 0, 4096).tags_per_descriptor(), 253);
        // Without checksums, 32-bit tags of 8 bytes: (4084-24-16)/8 + 1.
        let c = codec(0, 0, 4096);
        let n = c.tags_per_descriptor();
        let used = 12 + 8 * n + 16;
        assert!(4096 - used < 8 + 16 && 4096 - (used - 8) >= 8 + 16, "{n}");
        assert_eq!(codec(v3, 0, 1024).revokes_per_block(), (1024 - 4 - 16) / 8);
    }

    #[test]
    fn escape_and_flags() {
        let c = codec(JBD2_FEATURE_INCOMPAT_CSUM_V3, 0, 1024);
        let mut magic = vec![1u8; 1024];
        magic[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let plain = vec![2u8; 1024];
        let e = c.descriptor_blocks(9, &[(100, &magic), (101, &plain)]);
        assert_eq!(e.blocks.len(), 3);
        let d = &e.blocks[0];
        let t0 = Tag::parse(&d[12..], c.fmt).unwrap();
        assert_eq!(t0.flags, JBD2_FLAG_ESCAPE);
        assert_eq!(&d[28..44], &[7; 16]);
        let t1 = Tag::parse(&d[44..], c.fmt).unwrap();
        assert_eq!(t1.flags, JBD2_FLAG_SAME_UUID | JBD2_FLAG_LAST_TAG);
        assert_eq!(t1.blocknr, 101);
        assert_eq!(&e.blocks[1][..4], &[0; 4]);
        assert_eq!(t0.checksum, jcsum::tag(c.seed, 9, &e.blocks[1]));
        assert_eq!(
            jcsum::block_tail(c.seed, d),
            u32::from_be_bytes(d[1020..].try_into().unwrap())
        );
    }

    #[test]
    fn neighbouring_blocks_merge_into_one_write() {
        use ext4kit_device::{Device, FaultDevice, MemDevice};
        let dev = FaultDevice::new(MemDevice::new(64 * 1024));
        let (a, b, c) = (vec![1u8; 1024], vec![2u8; 1024], vec![3u8; 1024]);
        let n = write_blocks(
            &dev,
            1024,
            [
                (5, &a[..]),
                (6, &b[..]),
                (9, &c[..]),
                (10, &a[..]),
                (11, &b[..]),
            ],
            2,
        )
        .unwrap();
        assert_eq!(n, 3);
        assert_eq!(dev.pending_ops(), 3);
        let mut r = vec![0u8; 1024];
        dev.read_at(&mut r, 11 * 1024).unwrap();
        assert_eq!(r, b);
    }

    #[test]
    fn ring_wraps_and_keeps_one_block() {
        let mut r = LogRing::new(1, 5, 9);
        assert_eq!(r.head, 1);
        assert_eq!(r.free(), 3);
        let s = r.take();
        r.take();
        r.take();
        r.push(LiveTxn {
            tid: 1,
            start: s,
            len: 3,
        });
        assert_eq!(r.free(), 0);
        assert_eq!(r.head, 4);
        assert_eq!(r.take(), 4);
        assert_eq!(r.head, 1);
        r.clear();
        assert_eq!(r.tail(), 1);
    }
}
