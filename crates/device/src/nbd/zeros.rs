//! The known-zero cache: byte ranges of the export this client knows read
//! as zeros (BLOCK_STATUS said `NBD_STATE_ZERO`, or we zeroed them), so
//! that a later BLOCK_STATUS question or read inside them is answered
//! without a round trip.
//!
//! Exactness: a range is only ever in the cache while it reads as zeros.
//! - every data write and every TRIM removes its range (before it is
//!   sent or queued), and bumps the generation;
//! - something learnt from a reply is added only when no removal happened
//!   since the question was asked ([`Zeros::generation`] then
//!   [`Zeros::learn_since`]): a write racing a BLOCK_STATUS reply from
//!   another thread is never papered over;
//! - the cache assumes this client is the only writer of the export while
//!   it is open (what mkfs, lazyinit and a mount need anyway).
//!
//! The list is bounded ([`MAX_RANGES`]): beyond it the cache is emptied,
//! which only costs round trips, never exactness.

use crate::ranges;

/// Ranges kept at most (beyond: the cache is emptied).
pub(crate) const MAX_RANGES: usize = 4096;

/// Sorted, disjoint, non-touching half-open ranges known to read as zero.
#[derive(Default, Debug)]
pub(crate) struct Zeros {
    ranges: Vec<(u64, u64)>,
    /// Bumped by every [`Zeros::forget`].
    epoch: u64,
}

impl Zeros {
    /// The generation to pass to [`Zeros::learn_since`] for a question
    /// asked now.
    pub(crate) fn generation(&self) -> u64 {
        self.epoch
    }

    /// `[s, e)` reads as zero, as learnt by a question asked at
    /// generation `epoch`: added only if nothing was forgotten since.
    pub(crate) fn learn_since(&mut self, epoch: u64, s: u64, e: u64) {
        if epoch != self.epoch || s >= e {
            return;
        }
        ranges::union(&mut self.ranges, s, e);
        if self.ranges.len() > MAX_RANGES {
            self.ranges.clear();
        }
    }

    /// `[s, e)` may no longer read as zero (a write, a TRIM).
    pub(crate) fn forget(&mut self, s: u64, e: u64) {
        self.epoch += 1;
        if s < e {
            ranges::subtract(&mut self.ranges, s, e);
        }
    }

    /// Does all of `[s, e)` read as zero?
    pub(crate) fn covers(&self, s: u64, e: u64) -> bool {
        if s >= e {
            return true;
        }
        // The last range starting at or before s.
        let i = self.ranges.partition_point(|r| r.0 <= s);
        i > 0 && self.ranges[i - 1].1 >= e
    }

    #[cfg(test)]
    pub(crate) fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// Learn [s, s+n) with a generation taken `stale` ops ago.
        Learn(u64, u64, bool),
        Forget(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..200, 0u64..60, any::<bool>()).prop_map(|(s, n, st)| Op::Learn(s, n, st)),
            (0u64..200, 0u64..40).prop_map(|(s, n)| Op::Forget(s, n)),
        ]
    }

    proptest! {
        /// The cache against a model (one bool per byte): after every
        /// operation, `covers` agrees with the model for every
        /// small range, and a stale learn adds nothing.
        #[test]
        fn cache_matches_a_byte_model(ops in proptest::collection::vec(op(), 1..60)) {
            const N: usize = 260;
            let mut z = Zeros::default();
            let mut model = [false; N];
            let mut prev_epoch = z.generation();
            for o in ops {
                match o {
                    Op::Learn(s, n, stale) => {
                        let g = if stale { prev_epoch } else { z.generation() };
                        let applies = g == z.generation();
                        z.learn_since(g, s, s + n);
                        if applies {
                            for b in &mut model[s as usize..(s + n) as usize] {
                                *b = true;
                            }
                        }
                    }
                    Op::Forget(s, n) => {
                        prev_epoch = z.generation();
                        z.forget(s, s + n);
                        for b in &mut model[s as usize..(s + n) as usize] {
                            *b = false;
                        }
                    }
                }
                // Sorted, disjoint, not touching.
                for w in z.ranges().windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
                for s in (0..N as u64).step_by(7) {
                    for e in (s..=N as u64).step_by(5) {
                        let want = model[s as usize..e as usize].iter().all(|&b| b);
                        prop_assert_eq!(z.covers(s, e), want, "covers {}..{}", s, e);
                    }
                }
            }
        }
    }

    #[test]
    fn too_many_ranges_empty_the_cache() {
        let mut z = Zeros::default();
        for i in 0..=MAX_RANGES as u64 {
            z.learn_since(z.generation(), i * 10, i * 10 + 5);
        }
        assert!(z.ranges().is_empty());
        assert!(!z.covers(0, 5));
    }
}
