//! A set of group numbers as a two-level bitmap: one bit per group, and
//! one summary bit per 64-group word that has any bit set. The allocator's
//! index keeps one per order; a filesystem of 131 072 groups costs 16 KiB
//! per order in use (nothing for an order never used), inserting or
//! removing is O(1), and "the first member at or after `g`" looks at one
//! word, then at most `groups / 4096` summary words. Built in one pass at
//! open with no allocation per group, dropped in one free (a `BTreeSet`
//! of every group took a node per eleven groups to build and to free).

/// See the module docs.
#[derive(Debug, Clone)]
pub struct GroupSet {
    /// Groups the set can hold (`0..cap`).
    cap: u32,
    /// One bit per group; empty until the first insert.
    words: Vec<u64>,
    /// Bit `i` set: `words[i] != 0`.
    summary: Vec<u64>,
    len: usize,
}

impl GroupSet {
    /// An empty set for groups `0..cap` (nothing allocated yet).
    pub fn new(cap: u32) -> Self {
        GroupSet {
            cap,
            words: Vec::new(),
            summary: Vec::new(),
            len: 0,
        }
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Add `g` (< cap); true if it was not a member.
    pub fn insert(&mut self, g: u32) -> bool {
        if g >= self.cap {
            return false;
        }
        if self.words.is_empty() {
            let n = self.cap.div_ceil(64) as usize;
            self.words = vec![0; n];
            self.summary = vec![0; n.div_ceil(64)];
        }
        let (w, b) = ((g / 64) as usize, g % 64);
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        self.summary[w / 64] |= 1 << (w % 64);
        if !was {
            self.len += 1;
        }
        !was
    }

    /// Remove `g`; true if it was a member.
    pub fn remove(&mut self, g: u32) -> bool {
        if g >= self.cap || self.words.is_empty() {
            return false;
        }
        let (w, b) = ((g / 64) as usize, g % 64);
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] &= !(1 << b);
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        if was {
            self.len -= 1;
        }
        was
    }

    pub fn contains(&self, g: u32) -> bool {
        g < self.cap
            && !self.words.is_empty()
            && self.words[(g / 64) as usize] & (1 << (g % 64)) != 0
    }

    /// The smallest member at or after `from`.
    pub fn next_from(&self, from: u32) -> Option<u32> {
        if self.len == 0 || from >= self.cap {
            return None;
        }
        let w = (from / 64) as usize;
        let here = self.words[w] & (u64::MAX << (from % 64));
        if here != 0 {
            return Some(w as u32 * 64 + here.trailing_zeros());
        }
        // The next non-empty word, through the summary.
        let first = w + 1;
        if first >= self.words.len() {
            return None;
        }
        let mut s = first / 64;
        let mut bits = self.summary[s] & (u64::MAX << (first % 64));
        loop {
            if bits != 0 {
                let wi = s * 64 + bits.trailing_zeros() as usize;
                return Some(wi as u32 * 64 + self.words[wi].trailing_zeros());
            }
            s += 1;
            if s >= self.summary.len() {
                return None;
            }
            bits = self.summary[s];
        }
    }

    /// The smallest member.
    pub fn first(&self) -> Option<u32> {
        self.next_from(0)
    }

    /// The members from `from` on, then those before it (each once).
    pub fn iter_wrapping(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        let mut at = Some(from.min(self.cap));
        let mut wrapped = false;
        std::iter::from_fn(move || {
            loop {
                let a = at?;
                match self.next_from(a) {
                    Some(g) if !wrapped || g < from => {
                        at = g.checked_add(1);
                        return Some(g);
                    }
                    _ if !wrapped && from > 0 => {
                        wrapped = true;
                        at = Some(0);
                    }
                    _ => {
                        at = None;
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Against a `BTreeSet`, on random operations over odd capacities.
    #[test]
    fn matches_a_btreeset() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for cap in [1u32, 63, 64, 65, 4095, 4096, 4097, 10_000] {
            let mut s = GroupSet::new(cap);
            let mut m = BTreeSet::new();
            assert_eq!(s.first(), None);
            for _ in 0..3000 {
                let g = (next() % u64::from(cap + 2)) as u32;
                match next() % 4 {
                    0 | 1 => assert_eq!(s.insert(g), g < cap && m.insert(g)),
                    2 => assert_eq!(s.remove(g), m.remove(&g)),
                    _ => {
                        assert_eq!(s.contains(g), m.contains(&g));
                        let want = m.range(g..).next().copied();
                        assert_eq!(s.next_from(g), want, "cap {cap} from {g}");
                        let wrap: Vec<u32> = m
                            .range(g.min(cap)..)
                            .chain(m.range(..g.min(cap)))
                            .copied()
                            .collect();
                        assert_eq!(s.iter_wrapping(g).collect::<Vec<_>>(), wrap);
                    }
                }
                assert_eq!(s.len(), m.len());
                assert_eq!(s.first(), m.iter().next().copied());
            }
        }
    }
}
