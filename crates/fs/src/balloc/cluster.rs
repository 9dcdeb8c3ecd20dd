//! The cluster rules of bigalloc (issue 20), as pure functions over a
//! file's extents: what the kernel keeps (`ext4_ext_map_blocks` with
//! `get_implied_cluster_alloc`, the `partial_cluster` of
//! `ext4_ext_remove_space`) and e2fsck checks (pass 1's
//! `has_unaligned_cluster_map` and its cluster count for `i_blocks`).
//! Without bigalloc the ratio is 1 and every rule is the plain one.
//!
//! The engine's writer (behind the internal switch, ARCHITECTURE
//! "bigalloc") follows them: `implied` and whole-cluster allocation in
//! `Filesystem::fill_in`, `released_all` in its unmap and delete.

use std::ops::Range;

/// Cluster arithmetic: `2^bits` blocks per cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clusters {
    bits: u32,
}

/// One extent as the rules see it: logical block, physical block, length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub lblk: u32,
    pub pblk: u64,
    pub len: u32,
}

impl Run {
    /// The last logical block (`len` > 0).
    fn last_lblk(&self) -> u64 {
        u64::from(self.lblk) + u64::from(self.len.max(1)) - 1
    }

    /// The last physical block (`len` > 0).
    fn last_pblk(&self) -> u64 {
        self.pblk + u64::from(self.len.max(1)) - 1
    }
}

impl Clusters {
    /// No bigalloc: one block per cluster.
    pub const ONE: Clusters = Clusters { bits: 0 };

    /// `s_log_cluster_size - s_log_block_size` (0 without bigalloc);
    /// `None` past what a 32-bit logical block number can hold.
    pub fn new(bits: u32) -> Option<Clusters> {
        (bits < 32).then_some(Clusters { bits })
    }

    /// Blocks per cluster.
    pub fn ratio(&self) -> u64 {
        1 << self.bits
    }

    /// The offset-in-cluster mask (`EXT4_CLUSTER_MASK`).
    pub fn mask(&self) -> u64 {
        self.ratio() - 1
    }

    /// The cluster holding block `b` (`EXT4_B2C`).
    pub fn b2c(&self, b: u64) -> u64 {
        b >> self.bits
    }

    /// The first block of cluster `c` (`EXT4_C2B`).
    pub fn c2b(&self, c: u64) -> u64 {
        c << self.bits
    }

    /// Clusters needed for `blocks` blocks starting on a cluster boundary
    /// (`EXT4_NUM_B2C`).
    pub fn num_b2c(&self, blocks: u64) -> u64 {
        blocks.div_ceil(self.ratio())
    }

    /// Does `next` (the extent after `prev` in logical order, if any) map
    /// as e2fsck demands: a block's offset in its logical cluster is its
    /// offset in its physical cluster, and a logical cluster does not
    /// continue into another physical cluster
    /// (`has_unaligned_cluster_map`; `PR_1_MISALIGNED_CLUSTER`).
    pub fn aligned(&self, prev: Option<Run>, next: Run) -> bool {
        let m = self.mask();
        if u64::from(next.lblk) & m != next.pblk & m {
            return false;
        }
        match prev {
            Some(p) if u64::from(next.lblk) & m != 0 => {
                self.b2c(u64::from(next.lblk)) != self.b2c(p.last_lblk())
                    || self.b2c(next.pblk) == self.b2c(p.last_pblk())
            }
            _ => true,
        }
    }

    /// The physical block of logical block `lblk` when a neighbouring
    /// extent of the same file already holds its logical cluster (`left`:
    /// the nearest extent before `lblk`, `right`: the nearest after), and
    /// how many blocks from `lblk` on can take that cluster: up to its end
    /// or to where `right` begins (`get_implied_cluster_alloc`). `None`:
    /// the logical cluster is new, a cluster must be allocated.
    pub fn implied(&self, lblk: u32, left: Option<Run>, right: Option<Run>) -> Option<(u64, u32)> {
        let l = u64::from(lblk);
        let c = self.b2c(l);
        let off = l & self.mask();
        let cluster_end = self.c2b(c + 1);
        let stop = match right {
            Some(r) => cluster_end.min(u64::from(r.lblk)),
            None => cluster_end,
        };
        let len = u32::try_from(stop.saturating_sub(l)).unwrap_or(u32::MAX);
        if let Some(p) = left
            && p.len > 0
            && p.last_lblk() < l
            && self.b2c(p.last_lblk()) == c
        {
            return Some((self.c2b(self.b2c(p.last_pblk())) + off, len));
        }
        if let Some(r) = right
            && r.len > 0
            && u64::from(r.lblk) > l
            && self.b2c(u64::from(r.lblk)) == c
        {
            return Some((self.c2b(self.b2c(r.pblk)) + off, len));
        }
        None
    }

    /// The clusters a file's extents hold (in logical order), counted as
    /// e2fsck's pass 1 counts them: an extent's first cluster is not
    /// counted again when the extent before it ended in that cluster.
    /// `i_blocks` (in 512-byte units) is this × cluster size / 512 (plus
    /// a whole cluster for every extent-tree or xattr block).
    pub fn clusters_held(&self, runs: &[Run]) -> u64 {
        let mut n = 0;
        let mut prev_last: Option<u64> = None;
        for r in runs.iter().filter(|r| r.len > 0) {
            let first = self.b2c(r.pblk);
            let last = self.b2c(r.last_pblk());
            let from = match prev_last {
                Some(p) if p == first => first + 1,
                _ => first,
            };
            n += (last + 1).saturating_sub(from);
            prev_last = Some(last);
        }
        n
    }

    /// The physical clusters to release when `removed` (a part of one
    /// extent) is unmapped, `left` and `right` being the extents that stay
    /// on either side of it in logical order (which may be what remains of
    /// the same extent): a cluster is released only when neither of them
    /// still uses it (the kernel's `partial_cluster`).
    pub fn released(&self, removed: Run, left: Option<Run>, right: Option<Run>) -> Range<u64> {
        if removed.len == 0 {
            return 0..0;
        }
        let mut first = self.b2c(removed.pblk);
        let mut end = self.b2c(removed.last_pblk()) + 1;
        if left.is_some_and(|p| p.len > 0 && self.b2c(p.last_pblk()) == first) {
            first += 1;
        }
        if right.is_some_and(|r| r.len > 0 && self.b2c(r.pblk) == end - 1) {
            end -= 1;
        }
        if first >= end { 0..0 } else { first..end }
    }

    /// [`Clusters::released`] for several removed pieces at once (in any
    /// order; pieces of one unmapped range, e.g. the extents a truncate or
    /// a delete takes), `left` and `right` the extents that stay around
    /// the whole range: every cluster of a piece, once, except the one the
    /// left extent ends in and the one the right extent begins in. As
    /// ranges of clusters, sorted and merged.
    pub fn released_all(
        &self,
        removed: &[Run],
        left: Option<Run>,
        right: Option<Run>,
    ) -> Vec<Range<u64>> {
        let mut cs: Vec<u64> = Vec::new();
        for r in removed.iter().filter(|r| r.len > 0) {
            cs.extend(self.b2c(r.pblk)..=self.b2c(r.last_pblk()));
        }
        cs.sort_unstable();
        cs.dedup();
        let keep_l = left.filter(|p| p.len > 0).map(|p| self.b2c(p.last_pblk()));
        let keep_r = right.filter(|r| r.len > 0).map(|r| self.b2c(r.pblk));
        let mut out: Vec<Range<u64>> = Vec::new();
        for c in cs
            .into_iter()
            .filter(|&c| Some(c) != keep_l && Some(c) != keep_r)
        {
            match out.last_mut() {
                Some(r) if r.end == c => r.end = c + 1,
                _ => out.push(c..c + 1),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lblk: u32, pblk: u64, len: u32) -> Run {
        Run { lblk, pblk, len }
    }

    const C16: Clusters = Clusters { bits: 4 };

    #[test]
    fn arithmetic() {
        assert!(Clusters::new(32).is_none());
        let c = Clusters::new(2).unwrap();
        assert_eq!((c.ratio(), c.mask()), (4, 3));
        assert_eq!((c.b2c(7), c.c2b(2), c.num_b2c(9)), (1, 8, 3));
        let one = Clusters::new(0).unwrap();
        assert_eq!((one.b2c(7), one.c2b(7), one.num_b2c(9)), (7, 7, 9));
    }

    /// A file of 5 blocks in cluster 100 (blocks 1600..1605): block 5
    /// goes to 1605, and 11 blocks can follow before the cluster ends;
    /// block 16 is a new logical cluster.
    #[test]
    fn implied_by_the_left_extent() {
        let left = Some(run(0, 1600, 5));
        assert_eq!(C16.implied(5, left, None), Some((1605, 11)));
        assert_eq!(C16.implied(9, left, None), Some((1609, 7)));
        assert_eq!(C16.implied(16, left, None), None);
        // Stopped by an extent to the right in the same cluster.
        let right = Some(run(12, 1612, 2));
        assert_eq!(C16.implied(7, left, right), Some((1607, 5)));
    }

    /// An extent starting at logical 20 in physical cluster 200 (offset 4):
    /// logical 17 maps to 3201, up to the extent (3 blocks).
    #[test]
    fn implied_by_the_right_extent() {
        let right = Some(run(20, 3204, 3));
        assert_eq!(C16.implied(17, None, right), Some((3201, 3)));
        assert_eq!(C16.implied(15, None, right), None);
        // A right extent in the next logical cluster implies nothing.
        assert_eq!(C16.implied(17, None, Some(run(40, 3208, 1))), None);
        // Without bigalloc nothing is ever implied.
        let one = Clusters::new(0).unwrap();
        assert_eq!(one.implied(5, Some(run(0, 100, 5)), None), None);
    }

    #[test]
    fn alignment_as_e2fsck_checks_it() {
        assert!(C16.aligned(None, run(3, 1603, 2)));
        assert!(!C16.aligned(None, run(3, 1604, 2)));
        // Continuing logical cluster 0 in the same physical cluster: fine;
        // in another one: misaligned.
        let prev = Some(run(0, 1600, 3));
        assert!(C16.aligned(prev, run(5, 1605, 4)));
        assert!(!C16.aligned(prev, run(5, 3205, 4)));
        // A new logical cluster may go anywhere aligned.
        assert!(C16.aligned(prev, run(16, 4800, 4)));
    }

    /// What e2fsck counts: a 100-byte file holds one cluster; two extents
    /// sharing a cluster (a hole inside it) hold it once; a hole of whole
    /// clusters holds none.
    #[test]
    fn clusters_held_as_pass1_counts() {
        assert_eq!(C16.clusters_held(&[run(0, 1600, 1)]), 1);
        assert_eq!(C16.clusters_held(&[run(0, 1600, 3), run(9, 1609, 2)]), 1);
        assert_eq!(C16.clusters_held(&[run(0, 1600, 20)]), 2);
        assert_eq!(
            C16.clusters_held(&[run(0, 1600, 5), run(20, 3204, 30)]),
            1 + 3
        );
        // Ending in cluster 101 then continuing there: 101 once.
        assert_eq!(C16.clusters_held(&[run(0, 1600, 20), run(20, 1620, 12)]), 2);
        assert_eq!(C16.clusters_held(&[]), 0);
    }

    /// Truncates and punches keep a cluster that an extent still uses.
    #[test]
    fn released_keeps_shared_clusters() {
        // 20 blocks in clusters 100-101, truncated to 5: 101 goes, 100
        // stays (the remaining 5 blocks use it).
        assert_eq!(
            C16.released(run(5, 1605, 15), Some(run(0, 1600, 5)), None),
            101..102
        );
        // Truncated to 16: exactly cluster 101 goes.
        assert_eq!(
            C16.released(run(16, 1616, 4), Some(run(0, 1600, 16)), None),
            101..102
        );
        // Deleted whole: both.
        assert_eq!(C16.released(run(0, 1600, 20), None, None), 100..102);
        // A punch inside one cluster with data on both sides: nothing.
        assert_eq!(
            C16.released(
                run(3, 1603, 4),
                Some(run(0, 1600, 3)),
                Some(run(7, 1607, 9))
            ),
            0..0
        );
        // A punch of 50 blocks from the middle of cluster 100 to the
        // middle of 103: 101 and 102 go.
        assert_eq!(
            C16.released(
                run(8, 1608, 50),
                Some(run(0, 1600, 8)),
                Some(run(58, 1658, 6))
            ),
            101..103
        );
        // A neighbour in another cluster does not keep anything.
        assert_eq!(
            C16.released(
                run(16, 1616, 16),
                Some(run(0, 1600, 16)),
                Some(run(32, 4800, 1))
            ),
            101..102
        );
    }
    /// Several pieces: a cluster two of them share goes once; the
    /// neighbours' clusters stay.
    #[test]
    fn released_all_dedups_and_keeps_neighbours() {
        let removed = [run(5, 1605, 3), run(10, 1610, 10), run(40, 4808, 8)];
        assert_eq!(
            C16.released_all(&removed, Some(run(0, 1600, 2)), None),
            vec![101..102, 300..301]
        );
        assert_eq!(
            C16.released_all(&removed, None, None),
            vec![100..102, 300..301]
        );
        assert_eq!(
            C16.released_all(&removed, None, Some(run(48, 4816, 4))),
            vec![100..102, 300..301]
        );
        assert_eq!(
            C16.released_all(&removed, None, Some(run(44, 4812, 4))),
            vec![100..102]
        );
        assert!(C16.released_all(&[], None, None).is_empty());
    }
}
