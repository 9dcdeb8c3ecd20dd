//! A set of block ranges inside one group: sorted, disjoint, never two
//! adjacent ranges (they are merged), offsets relative to the group start.
//! A fresh group holds one to three ranges, a fragmented one up to half
//! its blocks; operations are a binary search plus a vector move.

/// Free (or busy) ranges of one group, as `(start, len)` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtentSet {
    v: Vec<(u32, u32)>,
    total: u64,
}

impl ExtentSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Build from sorted, disjoint ranges (adjacent ones are merged).
    pub fn from_sorted(runs: impl IntoIterator<Item = (u32, u32)>) -> Self {
        let mut s = Self::new();
        for (a, n) in runs {
            if n == 0 {
                continue;
            }
            match s.v.last_mut() {
                Some(last) if last.0 + last.1 == a => last.1 += n,
                _ => s.v.push((a, n)),
            }
            s.total += u64::from(n);
        }
        s
    }

    /// The clear bits `0..nbits` of a bitmap as ranges.
    pub fn from_clear_bits(bitmap: &[u8], nbits: u32) -> Self {
        let mut runs = Vec::new();
        let mut i = 0u32;
        while i < nbits {
            // Skip set bits a byte at a time where possible.
            let byte = bitmap.get((i / 8) as usize).copied().unwrap_or(0xFF);
            if i.is_multiple_of(8) && byte == 0xFF {
                i += 8;
                continue;
            }
            if byte & (1 << (i % 8)) != 0 {
                i += 1;
                continue;
            }
            let start = i;
            while i < nbits {
                let b = bitmap.get((i / 8) as usize).copied().unwrap_or(0xFF);
                if i.is_multiple_of(8) && b == 0 && i + 8 <= nbits {
                    i += 8;
                    continue;
                }
                if b & (1 << (i % 8)) != 0 {
                    break;
                }
                i += 1;
            }
            runs.push((start, i - start));
        }
        Self::from_sorted(runs)
    }

    pub fn is_empty(&self) -> bool {
        self.v.is_empty()
    }

    /// Number of blocks in the set.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Longest range.
    pub fn largest(&self) -> u32 {
        self.v.iter().map(|r| r.1).max().unwrap_or(0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.v.iter().copied()
    }

    /// Number of ranges.
    pub fn len(&self) -> usize {
        self.v.len()
    }

    /// Does any block of `[s, s+n)` lie in the set?
    pub fn overlaps(&self, s: u32, n: u32) -> bool {
        let end = u64::from(s) + u64::from(n);
        let i = self
            .v
            .partition_point(|r| u64::from(r.0) + u64::from(r.1) <= u64::from(s));
        self.v.get(i).is_some_and(|r| u64::from(r.0) < end)
    }

    /// Is all of `[s, s+n)` in the set?
    pub fn contains(&self, s: u32, n: u32) -> bool {
        let i = self.v.partition_point(|r| r.0 <= s);
        i > 0 && {
            let r = self.v[i - 1];
            u64::from(s) + u64::from(n) <= u64::from(r.0) + u64::from(r.1)
        }
    }

    /// Add `[s, s+n)`; refuses (returns false, set unchanged) if any of it
    /// is already in the set.
    pub fn insert(&mut self, s: u32, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        if self.overlaps(s, n) {
            return false;
        }
        let i = self.v.partition_point(|r| r.0 < s);
        let join_prev = i > 0 && self.v[i - 1].0 + self.v[i - 1].1 == s;
        let join_next = i < self.v.len() && s + n == self.v[i].0;
        match (join_prev, join_next) {
            (true, true) => {
                let next = self.v.remove(i);
                self.v[i - 1].1 += n + next.1;
            }
            (true, false) => self.v[i - 1].1 += n,
            (false, true) => {
                self.v[i].0 = s;
                self.v[i].1 += n;
            }
            (false, false) => self.v.insert(i, (s, n)),
        }
        self.total += u64::from(n);
        true
    }

    /// Remove `[s, s+n)`, which must lie inside one range of the set;
    /// returns false (set unchanged) otherwise.
    pub fn remove(&mut self, s: u32, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        if !self.contains(s, n) {
            return false;
        }
        let i = self.v.partition_point(|r| r.0 <= s) - 1;
        let (rs, rn) = self.v[i];
        let head = s - rs;
        let tail = rs + rn - (s + n);
        match (head, tail) {
            (0, 0) => {
                self.v.remove(i);
            }
            (0, t) => self.v[i] = (s + n, t),
            (h, 0) => self.v[i].1 = h,
            (h, t) => {
                self.v[i].1 = h;
                self.v.insert(i + 1, (s + n, t));
            }
        }
        self.total -= u64::from(n);
        true
    }

    /// The parts of `[s, s+n)` that are in the set.
    pub fn intersect(&self, s: u32, n: u32) -> Vec<(u32, u32)> {
        let end = s + n;
        let i = self.v.partition_point(|r| r.0 + r.1 <= s);
        let mut out = Vec::new();
        for &(rs, rn) in &self.v[i..] {
            if rs >= end {
                break;
            }
            let a = rs.max(s);
            let b = (rs + rn).min(end);
            if a < b {
                out.push((a, b - a));
            }
        }
        out
    }

    /// The range containing block `b`, if any.
    pub fn range_at(&self, b: u32) -> Option<(u32, u32)> {
        let i = self.v.partition_point(|r| r.0 <= b);
        (i > 0)
            .then(|| self.v[i - 1])
            .filter(|r| u64::from(b) < u64::from(r.0) + u64::from(r.1))
    }

    /// First range of at least `want` blocks starting at or after `from`,
    /// else the first such range before it.
    pub fn first_fit(&self, from: u32, want: u32) -> Option<(u32, u32)> {
        let i = self.v.partition_point(|r| r.0 < from);
        self.v[i..]
            .iter()
            .chain(self.v[..i].iter())
            .find(|r| r.1 >= want)
            .copied()
    }

    /// The (first) longest range.
    pub fn largest_range(&self) -> Option<(u32, u32)> {
        let mut best: Option<(u32, u32)> = None;
        for &r in &self.v {
            if best.is_none_or(|b| r.1 > b.1) {
                best = Some(r);
            }
        }
        best
    }

    /// Bigalloc: the whole clusters of `1 << cluster_bits` blocks inside
    /// the set's ranges, in cluster numbers (a cluster is free only when
    /// all of its blocks are).
    pub fn whole_clusters(&self, cluster_bits: u32) -> ExtentSet {
        if cluster_bits == 0 {
            return self.clone();
        }
        let r = 1u64 << cluster_bits;
        let runs = self.v.iter().filter_map(|&(s, n)| {
            let a = u64::from(s).div_ceil(r);
            let b = (u64::from(s) + u64::from(n)) / r;
            (a < b).then(|| (a as u32, (b - a) as u32))
        });
        ExtentSet::from_sorted(runs.collect::<Vec<_>>())
    }

    /// Bigalloc: cluster ranges as block ranges (`<< cluster_bits`),
    /// clipped to `nblocks`.
    pub fn expand_clusters(&self, cluster_bits: u32, nblocks: u32) -> ExtentSet {
        if cluster_bits == 0 {
            return self.clone();
        }
        let runs = self.v.iter().filter_map(|&(s, n)| {
            let a = u64::from(s) << cluster_bits;
            let b = ((u64::from(s) + u64::from(n)) << cluster_bits).min(u64::from(nblocks));
            (a < b).then(|| (a as u32, (b - a) as u32))
        });
        ExtentSet::from_sorted(runs.collect::<Vec<_>>())
    }

    /// Clear the bits of the set's blocks in `bitmap` (others untouched).
    /// Whole bytes at a time inside a range (a group's free space is
    /// rendered into its bitmap at the end of every allocating handle:
    /// bit by bit, that was the engine's largest cost per create).
    pub fn clear_bits(&self, bitmap: &mut [u8]) {
        let nbits = bitmap.len() as u64 * 8;
        let clear = |bitmap: &mut [u8], b: u64| bitmap[(b / 8) as usize] &= !(1 << (b % 8));
        for &(s, n) in &self.v {
            let mut b = u64::from(s);
            let end = (b + u64::from(n)).min(nbits);
            while b < end && !b.is_multiple_of(8) {
                clear(bitmap, b);
                b += 1;
            }
            let whole = end & !7;
            if b < whole {
                bitmap[(b / 8) as usize..(whole / 8) as usize].fill(0);
                b = whole;
            }
            while b < end {
                clear(bitmap, b);
                b += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {

    /// Bigalloc: a cluster is free only when all its blocks are; clusters
    /// expand back to blocks, clipped to the group.
    #[test]
    fn whole_clusters_and_back() {
        let s = ExtentSet::from_sorted([(1, 1), (3, 9), (16, 4), (22, 1)]);
        let c = s.whole_clusters(2);
        assert_eq!(c.iter().collect::<Vec<_>>(), vec![(1, 2), (4, 1)]);
        let b = c.expand_clusters(2, 18);
        assert_eq!(b.iter().collect::<Vec<_>>(), vec![(4, 8), (16, 2)]);
        assert_eq!(s.whole_clusters(0), s);
        assert_eq!(s.expand_clusters(0, 4), s);
    }
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn blocks(s: &ExtentSet) -> BTreeSet<u32> {
        s.iter().flat_map(|(a, n)| a..a + n).collect()
    }

    proptest! {
        #[test]
        fn matches_a_set_of_blocks(ops in proptest::collection::vec((any::<bool>(), 0u32..200, 1u32..20), 1..200)) {
            let mut s = ExtentSet::new();
            let mut m = BTreeSet::new();
            for (ins, a, n) in ops {
                let r: BTreeSet<u32> = (a..a + n).collect();
                if ins {
                    let ok = r.is_disjoint(&m);
                    prop_assert_eq!(s.insert(a, n), ok);
                    if ok { m.extend(r); }
                } else {
                    let ok = r.is_subset(&m) && s.contains(a, n);
                    let removed = s.remove(a, n);
                    prop_assert_eq!(removed, ok);
                    if ok { for b in r { m.remove(&b); } }
                }
                prop_assert_eq!(blocks(&s), m.clone());
                prop_assert_eq!(s.total(), m.len() as u64);
                for w in s.v.windows(2) {
                    prop_assert!(w[0].0 + w[0].1 < w[1].0);
                }
            }
            let mut bm = vec![0xFFu8; 32];
            s.clear_bits(&mut bm);
            prop_assert_eq!(ExtentSet::from_clear_bits(&bm, 256), s.clone());
            // A bitmap shorter than the set: the bits past it are ignored.
            let mut short = vec![0xFFu8; 9];
            s.clear_bits(&mut short);
            prop_assert_eq!(&short[..], &bm[..9]);
        }
    }

    #[test]
    fn bitmap_runs() {
        let mut bm = vec![0u8; 8];
        bm[0] = 0b0000_0101;
        bm[7] = 0x80;
        let s = ExtentSet::from_clear_bits(&bm, 64);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(1, 1), (3, 60)]);
        let s = ExtentSet::from_clear_bits(&bm, 20);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(1, 1), (3, 17)]);
    }
}
