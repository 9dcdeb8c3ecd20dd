//! A set of used block ranges: the planner's model of the block bitmap.
//!
//! mke2fs keeps a full in-memory bitmap; a formatter only ever marks a few
//! ranges per group, so a map of disjoint ranges is O(groups) in memory even
//! for a 16 TiB filesystem, and the searches below mirror libext2fs's
//! `ext2fs_get_free_blocks2` and `ext2fs_new_block2` exactly.

/// Disjoint, sorted used ranges `[start, end)`, touching ranges merged.
///
/// A sorted vector with binary search: the planner inserts mostly in
/// ascending order, so inserts rarely move more than a few entries.
#[derive(Clone, Debug, Default)]
pub struct BlockSet {
    ranges: Vec<(u64, u64)>,
}

impl BlockSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Index of the first range whose end is > `b` (the range containing
    /// `b`, or the next one after it).
    fn first_ending_after(&self, b: u64) -> usize {
        self.ranges.partition_point(|&(_, e)| e <= b)
    }

    /// Is any block of `[start, start+len)` used?
    pub fn any_used(&self, start: u64, len: u64) -> bool {
        let i = self.first_ending_after(start);
        self.ranges.get(i).is_some_and(|&(s, _)| s < start + len)
    }

    pub fn is_used(&self, b: u64) -> bool {
        self.any_used(b, 1)
    }

    /// Mark `[start, start+len)` used (it may overlap existing ranges).
    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut s, mut e) = (start, start + len);
        // First range that ends at or after `s` (touching counts).
        let i = self.ranges.partition_point(|&(_, re)| re < s);
        // Ranges starting at or before `e` (touching counts) merge.
        let mut j = i;
        while j < self.ranges.len() && self.ranges[j].0 <= e {
            s = s.min(self.ranges[j].0);
            e = e.max(self.ranges[j].1);
            j += 1;
        }
        match j - i {
            0 => self.ranges.insert(i, (s, e)),
            1 => self.ranges[i] = (s, e),
            _ => {
                self.ranges[i] = (s, e);
                self.ranges.drain(i + 1..j);
            }
        }
    }

    /// The first free block at or after `b` (may be past the device end).
    pub fn next_free(&self, b: u64) -> u64 {
        let i = self.first_ending_after(b);
        match self.ranges.get(i) {
            Some(&(s, e)) if s <= b => e,
            _ => b,
        }
    }

    /// The first used block at or after `b`, if any.
    pub fn next_used(&self, b: u64) -> Option<u64> {
        let i = self.first_ending_after(b);
        self.ranges.get(i).map(|&(s, _)| s.max(b))
    }

    /// Used ranges intersecting `[start, end)`, clipped to it.
    pub fn ranges_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let i = self.first_ending_after(start);
        self.ranges[i..]
            .iter()
            .take_while(move |&&(s, _)| s < end)
            .map(move |&(s, e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
    }

    /// The same set with every range widened to whole clusters of
    /// `1 << bits` blocks (a block bitmap converted to a cluster bitmap).
    pub fn round_out(&self, bits: u32) -> BlockSet {
        let mask = (1u64 << bits) - 1;
        let mut out = BlockSet::new();
        for &(s, e) in &self.ranges {
            let s = s & !mask;
            out.insert(s, ((e + mask) & !mask) - s);
        }
        out
    }

    /// Number of used blocks in `[start, end)`.
    pub fn count_in(&self, start: u64, end: u64) -> u64 {
        self.ranges_in(start, end).map(|(s, e)| e - s).sum()
    }

    /// `ext2fs_get_free_blocks2`: candidates `b` run from `start` upward
    /// (wrapping to `first_data` once `b + num` passes the end, unless
    /// `finish > start`), stopping when `b` reaches `finish`; the first `b`
    /// with `[b, b+num)` free wins. Runs of used blocks are skipped at once.
    pub fn get_free_blocks(
        &self,
        start: u64,
        finish: u64,
        num: u64,
        first_data: u64,
        blocks: u64,
    ) -> Option<u64> {
        let mut b = if start == 0 { first_data } else { start };
        let finish = if finish == 0 { start } else { finish };
        // First candidate whose range would pass the end of the filesystem.
        let wrap_at = (blocks + 1).saturating_sub(num);
        let mut wraps = 0;
        loop {
            if b >= wrap_at {
                if finish > start || wraps > 1 {
                    return None;
                }
                wraps += 1;
                b = first_data;
            }
            let Some(u) = self.next_used(b).filter(|&u| u < b + num) else {
                return Some(b);
            };
            let nb = self.next_free(u);
            if nb >= wrap_at {
                // Candidates b+1 ..= wrap_at are all checked against finish.
                if finish > b && finish <= wrap_at {
                    return None;
                }
                b = wrap_at;
            } else {
                if finish > b && finish <= nb {
                    return None;
                }
                b = nb;
            }
        }
    }

    /// `ext2fs_new_block2`: first free block at or after `goal`, wrapping.
    pub fn new_block(&self, goal: u64, first_data: u64, blocks: u64) -> Option<u64> {
        let goal = if goal == 0 || goal >= blocks {
            first_data
        } else {
            goal
        };
        let b = self.next_free(goal);
        if b < blocks {
            return Some(b);
        }
        let b = self.next_free(first_data);
        (b < goal).then_some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn insert_merge_and_query() {
        let mut s = BlockSet::new();
        s.insert(10, 5);
        s.insert(20, 5);
        s.insert(15, 5);
        assert!(s.any_used(14, 1));
        assert!(!s.any_used(25, 10));
        assert_eq!(s.next_free(10), 25);
        assert_eq!(s.count_in(0, 100), 15);
        assert_eq!(s.get_free_blocks(10, 100, 3, 0, 100), Some(25));
        assert_eq!(s.new_block(12, 0, 100), Some(25));
    }

    proptest! {
        #[test]
        fn matches_bitmap(ops in proptest::collection::vec((0u64..200, 1u64..20), 0..20), start in 1u64..200, num in 1u64..10, finish in 0u64..200) {
            let blocks = 220u64;
            let mut s = BlockSet::new();
            let mut bm = vec![false; blocks as usize + 40];
            for (a, l) in ops {
                s.insert(a, l);
                for x in a..a + l { bm[x as usize] = true; }
            }
            for b in 0..blocks { prop_assert_eq!(s.is_used(b), bm[b as usize]); }
            // Reference get_free_blocks2.
            let reference = {
                let mut b = start;
                let fin = if finish == 0 { start } else { finish };
                let mut out = None;
                let mut guard = 0;
                loop {
                    guard += 1;
                    if guard > 10_000 { break; }
                    if b + num > blocks {
                        if fin > start { break; }
                        b = 0;
                    }
                    if (b..b + num).all(|x| !bm[x as usize]) { out = Some(b); break; }
                    b += 1;
                    if b == fin { break; }
                }
                out
            };
            prop_assert_eq!(s.get_free_blocks(start, finish, num, 0, blocks), reference);
        }
    }
}
