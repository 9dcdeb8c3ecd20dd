//! Small helpers for sorted, disjoint lists of half-open byte ranges
//! `(start, end)`, as returned by [`crate::Device::known_zero_ranges`].

/// Append `[s, e)` to a sorted list whose last range starts at or before
/// `s`, merging with it when they touch or overlap.
pub(crate) fn push_merge(out: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    if s >= e {
        return;
    }
    match out.last_mut() {
        Some(last) if last.1 >= s => last.1 = last.1.max(e),
        _ => out.push((s, e)),
    }
}

/// Add `[s, e)` to the set.
pub(crate) fn union(ranges: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    if s >= e {
        return;
    }
    let mut out = Vec::with_capacity(ranges.len() + 1);
    let mut inserted = false;
    for &(a, b) in ranges.iter() {
        if !inserted && s <= a {
            push_merge(&mut out, s, e);
            inserted = true;
        }
        push_merge(&mut out, a, b);
    }
    if !inserted {
        push_merge(&mut out, s, e);
    }
    *ranges = out;
}

/// Remove `[s, e)` from the set.
pub(crate) fn subtract(ranges: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    if s >= e {
        return;
    }
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(a, b) in ranges.iter() {
        if b <= s || a >= e {
            out.push((a, b));
            continue;
        }
        if a < s {
            out.push((a, s));
        }
        if b > e {
            out.push((e, b));
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_and_subtract() {
        let mut r = vec![(10, 20), (30, 40)];
        union(&mut r, 0, 5);
        assert_eq!(r, vec![(0, 5), (10, 20), (30, 40)]);
        union(&mut r, 20, 30);
        assert_eq!(r, vec![(0, 5), (10, 40)]);
        union(&mut r, 50, 60);
        assert_eq!(r, vec![(0, 5), (10, 40), (50, 60)]);
        union(&mut r, 3, 55);
        assert_eq!(r, vec![(0, 60)]);
        subtract(&mut r, 10, 20);
        assert_eq!(r, vec![(0, 10), (20, 60)]);
        subtract(&mut r, 0, 5);
        assert_eq!(r, vec![(5, 10), (20, 60)]);
        subtract(&mut r, 8, 100);
        assert_eq!(r, vec![(5, 8)]);
        subtract(&mut r, 0, 100);
        assert!(r.is_empty());
        union(&mut r, 7, 7);
        assert!(r.is_empty());
    }
}
