//! The tree editor against a block-by-block model, on blocks in memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::*;
use crate::extent::check_node;

/// Tree blocks in memory; blocks handed out from a counter.
struct MemIo {
    bs: u32,
    blocks: HashMap<u64, Vec<u8>>,
    next: u64,
    live: BTreeSet<u64>,
    writes: u64,
    /// Reads that reached `read` (not answered by the memo).
    reads: std::cell::Cell<u64>,
    /// Remember checked nodes, as the engine's handle does.
    use_memo: bool,
    memo: std::cell::RefCell<HashMap<u64, Vec<u8>>>,
}

impl MemIo {
    fn new(bs: u32) -> Self {
        MemIo {
            bs,
            blocks: HashMap::new(),
            next: 1_000_000,
            live: BTreeSet::new(),
            writes: 0,
            reads: std::cell::Cell::new(0),
            use_memo: false,
            memo: std::cell::RefCell::new(HashMap::new()),
        }
    }
}

impl TreeIo for MemIo {
    fn read(&self, blk: u64) -> Result<Vec<u8>, FsError> {
        self.reads.set(self.reads.get() + 1);
        self.blocks
            .get(&blk)
            .cloned()
            .ok_or_else(|| FsError::corrupt("test", format!("block {blk} never written")))
    }
    fn write(&mut self, blk: u64, data: &[u8], new: bool) -> Result<(), FsError> {
        assert!(self.live.contains(&blk), "write of a free block {blk}");
        assert_eq!(new, !self.blocks.contains_key(&blk), "new flag of {blk}");
        assert_eq!(data.len(), self.bs as usize);
        self.blocks.insert(blk, data.to_vec());
        self.writes += 1;
        Ok(())
    }
    fn alloc(&mut self, _goal: u64) -> Result<u64, FsError> {
        self.next += 1;
        self.live.insert(self.next);
        Ok(self.next)
    }
    fn free(&mut self, blk: u64) -> Result<(), FsError> {
        assert!(self.live.remove(&blk), "double free of {blk}");
        self.blocks.remove(&blk);
        self.memo.borrow_mut().remove(&blk);
        Ok(())
    }
    fn checked(&self, blk: u64) -> Option<Vec<u8>> {
        if !self.use_memo {
            return None;
        }
        self.memo.borrow().get(&blk).cloned()
    }
    fn note_checked(&self, blk: u64, data: &[u8]) {
        if self.use_memo {
            self.memo.borrow_mut().insert(blk, data.to_vec());
        }
    }
}

fn params(bs: u32) -> TreeParams {
    TreeParams {
        ino: 12,
        generation: 7,
        csum: Csum {
            metadata: true,
            gdt: false,
            seed: 0x1234_5678,
            uuid: [0; 16],
        },
        block_size: bs,
        first_data_block: 1,
        blocks_count: 1 << 40,
        eof_block: LBLK_END,
    }
}

fn empty_root() -> [u8; 60] {
    let mut r = [0u8; 60];
    r[..12].copy_from_slice(ExtentHeader::new(0, ENTRIES_IN_INODE, 0).as_bytes());
    r
}

/// Check the whole tree: headers, checksums, index keys equal to their
/// child's first key, extents inside their parent's range, the live
/// blocks exactly the tree's, e2fsck's "could be shorter" rule at the
/// root; returns (extents, depth).
fn check(io: &MemIo, p: &TreeParams, root: &[u8; 60]) -> (Vec<Mapping>, u16) {
    #[allow(clippy::too_many_arguments)]
    fn walk(
        io: &MemIo,
        p: &TreeParams,
        buf: &[u8],
        pblk: u64,
        depth: Option<u16>,
        lo: u64,
        hi: u64,
        out: &mut Vec<Mapping>,
        seen: &mut BTreeSet<u64>,
    ) -> u16 {
        let csum = (pblk != 0).then_some(&p.csum);
        let (d, n, _) = check_node(buf, pblk, depth, p.ino, p.generation, csum).unwrap();
        let node = Node {
            pblk,
            buf: buf.to_vec(),
        };
        if pblk != 0 {
            assert!(n > 0, "empty node {pblk}");
            assert!(seen.insert(pblk));
            assert_eq!(u64::from(node.key(0)), lo, "first key of {pblk}");
        }
        for i in 0..usize::from(n) {
            if d == 0 {
                let m = node.ext(i);
                assert!(
                    m.lblk >= lo && m.end() <= hi,
                    "extent {m:?} outside {lo}..{hi}"
                );
                if let Some(prev) = out.last() {
                    assert!(prev.end() <= m.lblk, "order");
                }
                out.push(m);
            } else {
                let k = u64::from(node.key(i));
                let next = if i + 1 < usize::from(n) {
                    u64::from(node.key(i + 1))
                } else {
                    hi
                };
                let child = io.read(node.child(i)).unwrap();
                walk(
                    io,
                    p,
                    &child,
                    node.child(i),
                    Some(d - 1),
                    k,
                    next,
                    out,
                    seen,
                );
            }
        }
        d
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    let d = walk(io, p, root, 0, None, 0, LBLK_END, &mut out, &mut seen);
    assert_eq!(seen, io.live, "tree blocks and live blocks");
    if d > 0 {
        let r = Node {
            pblk: 0,
            buf: root.to_vec(),
        };
        let kids: usize = (0..r.entries())
            .map(|i| {
                let c = io.read(r.child(i)).unwrap();
                usize::from(u16::from_le_bytes([c[2], c[3]]))
            })
            .sum();
        assert!(
            kids > 4,
            "the root's children ({kids} entries) fit in the inode"
        );
    }
    (out, d)
}

fn blockmap(v: &[Mapping]) -> BTreeMap<u64, (u64, bool)> {
    let mut m = BTreeMap::new();
    for e in v {
        for k in 0..u64::from(e.len) {
            m.insert(e.lblk + k, (e.pblk + k, e.unwritten));
        }
    }
    m
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn appends_fill_leaves_and_grow_to_depth_three() {
    let p = params(1024);
    let mut io = MemIo::new(1024);
    let mut root = empty_root();
    // 84 extents per 1 KiB leaf: depth 3 past 4 * 84 * 84.
    let n = 4 * 84 * 84 + 10;
    for k in 0..n as u64 {
        let w0 = io.writes;
        let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
        t.insert(&Mapping {
            lblk: 2 * k,
            pblk: 10 + 2 * k,
            len: 1,
            unwritten: k % 3 == 0,
        })
        .unwrap();
        root = *t.root();
        let w = io.writes - w0;
        // O(depth): never more than a split per level plus the root.
        assert!(w <= 8, "insert {k} wrote {w} blocks");
    }
    let (exts, d) = check(&io, &p, &root);
    assert_eq!(d, 3);
    assert_eq!(exts.len(), n);
    // Appends leave every leaf but the last full (the kernel's split).
    assert_eq!(
        io.live.len(),
        n.div_ceil(84) + n.div_ceil(84).div_ceil(84) + 1
    );
    // Remove everything from the end in pieces: back to an empty root.
    let mut hi = 2 * n as u64;
    while hi > 0 {
        let lo = hi.saturating_sub(5000);
        let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
        let r = t.remove(lo, hi).unwrap();
        assert_eq!(r.len() as u64, (hi - lo).div_ceil(2));
        root = *t.root();
        hi = lo;
        check(&io, &p, &root);
    }
    assert!(io.live.is_empty());
    assert_eq!(root, empty_root());
}

#[test]
fn merges_splits_and_conversions_match_a_block_model() {
    for (bs, seed) in [(1024u32, 1u64), (1024, 2), (4096, 3)] {
        let p = params(bs);
        let mut io = MemIo::new(bs);
        let mut root = empty_root();
        let mut model: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
        let mut rng = Rng(0x9E37_79B9 ^ seed);
        let space = 8_000u64;
        let mut max_depth = 0;
        let mut delta = 0i64;
        for step in 0..600 {
            let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
            let a = rng.below(space);
            let big = rng.below(4) == 0;
            let len = 1 + rng.below(if big { 400 } else { 8 });
            let b = (a + len).min(space);
            match rng.below(3) {
                0 | 1 => {
                    // Map the holes of [a, b), physically contiguous with
                    // the logical block (so neighbours merge), in one state.
                    let unwritten = rng.below(2) == 0;
                    let mut l = a;
                    while l < b {
                        if model.contains_key(&l) {
                            l += 1;
                            continue;
                        }
                        let mut e = l;
                        while e < b && !model.contains_key(&e) {
                            e += 1;
                        }
                        let max = if unwritten {
                            UNWRITTEN_MAX
                        } else {
                            EXT_INIT_MAX_LEN
                        };
                        let len = (e - l).min(u64::from(max)) as u32;
                        let m = Mapping {
                            lblk: l,
                            pblk: 5000 + l,
                            len,
                            unwritten,
                        };
                        t.insert(&m)
                            .unwrap_or_else(|e| panic!("step {step} {m:?}: {e}"));
                        for k in l..l + u64::from(len) {
                            model.insert(k, (5000 + k, unwritten));
                        }
                        l += u64::from(len);
                    }
                }
                _ => {
                    // Remove, or convert (remove + insert in the other state).
                    let got = t.remove(a, b).unwrap();
                    let want: Vec<u64> = model.range(a..b).map(|(k, _)| *k).collect();
                    assert_eq!(
                        got.iter().map(|m| u64::from(m.len)).sum::<u64>(),
                        want.len() as u64,
                        "step {step}: removed"
                    );
                    for k in &want {
                        model.remove(k);
                    }
                    if rng.below(2) == 0 {
                        for mut m in got {
                            m.unwritten = !m.unwritten;
                            t.insert(&m).unwrap();
                            for k in m.lblk..m.end() {
                                model.insert(k, (m.pblk + (k - m.lblk), m.unwritten));
                            }
                        }
                    }
                }
            }
            delta += t.blocks_delta;
            root = *t.root();
            if step % 10 != 0 && step < 599 {
                continue;
            }
            let (exts, d) = check(&io, &p, &root);
            max_depth = max_depth.max(d);
            assert_eq!(blockmap(&exts), model, "bs {bs} step {step}");
            assert_eq!(delta, io.live.len() as i64);
            // Neighbours in one leaf are merged.
            if step % 100 == 0 {
                let t = ExtentTree::new(&mut io, p, &root).unwrap();
                assert_eq!(t.all().unwrap(), exts);
                for probe in [0, a, b, space / 2] {
                    let want = model.get(&probe).copied();
                    let got = t
                        .lookup(probe)
                        .unwrap()
                        .map(|m| (m.pblk + (probe - m.lblk), m.unwritten));
                    assert_eq!(got, want, "lookup {probe}");
                }
            }
        }
        assert!(max_depth >= 1, "bs {bs}: depth {max_depth}");
    }
}

#[test]
fn a_bad_node_is_refused_not_followed() {
    let p = params(1024);
    let mut io = MemIo::new(1024);
    let mut root = empty_root();
    for k in 0..200u64 {
        let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
        t.insert(&Mapping {
            lblk: 2 * k,
            pblk: 10 + 2 * k,
            len: 1,
            unwritten: false,
        })
        .unwrap();
        root = *t.root();
    }
    let leaf = *io.live.iter().next().unwrap();
    io.blocks.get_mut(&leaf).unwrap()[30] ^= 1;
    let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
    let e = t.remove(0, 10).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    // An overlapping insert is refused.
    let mut io2 = MemIo::new(1024);
    let mut t = ExtentTree::new(&mut io2, p, &empty_root()).unwrap();
    let m = Mapping {
        lblk: 10,
        pblk: 100,
        len: 5,
        unwritten: false,
    };
    t.insert(&m).unwrap();
    assert!(t.insert(&Mapping { lblk: 12, ..m }).is_err());
}

/// e2fsck's pass-1E rule on hand-made shapes (1 KiB blocks: 84 entries a
/// block, 4 in the inode).
#[test]
fn rebuild_rule_matches_e2fsck() {
    let node = |pblk: u64, depth: u16, entries: u16, max: u16| NodeInfo {
        pblk,
        depth,
        entries,
        max,
    };
    let leaves = |n: &[u16]| -> Vec<NodeInfo> {
        n.iter()
            .enumerate()
            .map(|(i, &e)| node(100 + i as u64, 0, e, 84))
            .collect()
    };
    // Depth 0: never.
    assert!(!tree_wants_rebuild(&[node(0, 0, 3, 4)], 1024));
    // Depth 1 with three extents in one leaf: they fit in the inode.
    let mut t = vec![node(0, 1, 1, 4)];
    t.extend(leaves(&[3]));
    assert!(tree_wants_rebuild(&t, 1024));
    // Four extents: e2fsck's test is strict (4 < 4 fails): kept.
    let mut t = vec![node(0, 1, 1, 4)];
    t.extend(leaves(&[4]));
    assert!(!tree_wants_rebuild(&t, 1024));
    // Two half-full leaves: 2 x 83 - 84 = 82 free, not more than a block.
    let mut t = vec![node(0, 1, 2, 4)];
    t.extend(leaves(&[42, 42]));
    assert!(!tree_wants_rebuild(&t, 1024));
    // Three half-full leaves: 3 x 83 - 126 = 123 free: narrower.
    let mut t = vec![node(0, 1, 3, 4)];
    t.extend(leaves(&[42, 42, 42]));
    assert!(tree_wants_rebuild(&t, 1024));
    // Depth 2 over three leaves: they fit under the root directly.
    let mut t = vec![node(0, 2, 1, 4), node(50, 1, 3, 84)];
    t.extend(leaves(&[84, 84, 84]));
    assert!(tree_wants_rebuild(&t, 1024));
    // Depth 2 over five full leaves: packed.
    let mut t = vec![node(0, 2, 1, 4), node(50, 1, 5, 84)];
    t.extend(leaves(&[84, 84, 84, 84, 84]));
    assert!(!tree_wants_rebuild(&t, 1024));
    // Depth 2 over five leaves with 60 extents each: 5 x 83 - 300 = 115.
    let mut t = vec![node(0, 2, 1, 4), node(50, 1, 5, 84)];
    t.extend(leaves(&[60, 60, 60, 60, 60]));
    assert!(tree_wants_rebuild(&t, 1024));
}

/// A 4 KiB write into the middle of an unwritten extent, as the engine's
/// write handle does it (range, then remove + insert of the converted
/// piece): with the handle's memo each block is read and checked once,
/// not once per walk, and the tree is the same as without it.
#[test]
fn a_conversion_reads_and_checks_each_block_once_with_the_memo() {
    let p = params(4096);
    let mut trees = Vec::new();
    let mut reads = Vec::new();
    for use_memo in [false, true] {
        let mut io = MemIo::new(4096);
        let mut root = empty_root();
        for k in 0..400u64 {
            let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
            t.insert(&Mapping {
                lblk: 20 * k,
                pblk: 100_000 + 20 * k,
                len: 10,
                unwritten: true,
            })
            .unwrap();
            root = *t.root();
        }
        io.use_memo = use_memo;
        io.memo.borrow_mut().clear();
        io.reads.set(0);
        let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
        assert_eq!(t.depth(), 1);
        let at = 20 * 200 + 4;
        let r = t.range(at, at + 1).unwrap();
        assert_eq!(r.len(), 1);
        let piece = clip(&r[0], at, at + 1);
        t.remove(piece.lblk, piece.end()).unwrap();
        t.insert(&Mapping {
            unwritten: false,
            ..piece
        })
        .unwrap();
        root = *t.root();
        reads.push(io.reads.get());
        let (exts, _) = check(&io, &p, &root);
        trees.push(blockmap(&exts));
    }
    // Without the memo every walk reads (and checks) the leaf again;
    // with it each block once (the leaf and the sibling a merge looks at).
    assert!(reads[0] >= 4, "{reads:?}");
    assert!(reads[1] <= 2, "{reads:?}");
    assert_eq!(trees[0], trees[1]);
    assert_eq!(trees[1][&(20 * 200 + 4)], (100_000 + 20 * 200 + 4, false));
}

/// e2fsck's pass-1 bounds (`scan_extent_node` over the extents
/// `ext2fs_extent_get` returns: an index entry's length runs to the next
/// key, or to its node's end, the root's end being `eof`, i_size's block
/// count, all in 32 bits): the first entry below the root that ends past
/// its node's range, where e2fsck says "end of extent exceeds allowed
/// value" (an uninit extent past `eof` is allowed).
fn e2fsck_bounds_error(io: &MemIo, root: &[u8; 60], eof: u64) -> Option<String> {
    fn walk(io: &MemIo, buf: &[u8], end_blk: u64, end_block: u64, eof: u64) -> Option<String> {
        let node = Node {
            pblk: 0,
            buf: buf.to_vec(),
        };
        let n = node.entries();
        let leaf = node.depth() == 0;
        let eof_block = eof.wrapping_sub(1);
        for i in 0..n {
            let (lblk, len, uninit) = if leaf {
                let m = node.ext(i);
                (m.lblk, u64::from(m.len), m.unwritten)
            } else {
                let k = u64::from(node.key(i));
                let next = if i + 1 < n {
                    u64::from(node.key(i + 1))
                } else {
                    end_blk
                };
                (k, u64::from(next.wrapping_sub(k) as u32), false)
            };
            let last = (lblk + len).wrapping_sub(1);
            if end_block != 0 && last > end_block && !(last > eof_block && uninit) {
                return Some(format!(
                    "entry {i} ({lblk}+{len}) of a depth-{} node ends past {end_block}",
                    node.depth()
                ));
            }
            if !leaf {
                let next = if i + 1 < n {
                    u64::from(node.key(i + 1))
                } else {
                    end_blk
                };
                let child = io.read(node.child(i)).unwrap();
                if let Some(e) = walk(io, &child, next, last, eof) {
                    return Some(e);
                }
            }
        }
        None
    }
    walk(io, root, eof, 0, eof)
}

#[test]
fn pack_bounds_keeps_node_starts_inside_eof() {
    let keys: Vec<u64> = (0..10).map(|k| 10 * k).collect();
    // Nothing past eof, or the front packing fine: from the front.
    assert_eq!(pack_bounds(&keys, 4, 1000), [(0, 4), (4, 8), (8, 10)]);
    assert_eq!(pack_bounds(&keys, 4, 80), [(0, 4), (4, 8), (8, 10)]);
    // Keys 80 and 90 past eof 75: the last node starts at 70 instead.
    assert_eq!(pack_bounds(&keys, 4, 75), [(0, 2), (2, 6), (6, 10)]);
    // More past eof than a node holds: nothing helps, from the front.
    assert_eq!(pack_bounds(&keys, 4, 5), [(0, 4), (4, 8), (8, 10)]);
    assert_eq!(pack_bounds(&[], 4, 5), []);
}

/// A depth-2 tree of written extents up to i_size, then KEEP_SIZE
/// preallocations past it (and punches in them), as a file with 1000
/// extents and `fallocate -n` of 1 MiB past its end: no leaf starts past
/// i_size's blocks, so e2fsck finds every index entry inside its range
/// (the kernel's split starts a new leaf with the preallocation, and
/// e2fsck says "end of extent exceeds allowed value").
#[test]
fn preallocation_past_eof_stays_inside_e2fsck_bounds() {
    for (extents, gap) in [(1008u64, 10u64), (960, 0), (1000, 3), (4 * 84 - 1, 40)] {
        let mut p = params(1024);
        let mut io = MemIo::new(1024);
        let mut root = empty_root();
        for k in 0..extents {
            p.eof_block = 2 * k + 1;
            let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
            t.insert(&Mapping {
                lblk: 2 * k,
                pblk: 100 + 2 * k,
                len: 1,
                unwritten: false,
            })
            .unwrap();
            root = *t.root();
        }
        let eof = p.eof_block;
        let ctx = format!("{extents} extents, gap {gap}");
        // Preallocations past eof, with holes between them (fragmented
        // free space).
        for k in 0..40u64 {
            let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
            t.insert(&Mapping {
                lblk: eof + gap + 4 * k,
                pblk: 1_000_000 + 4 * k,
                len: 1 + (k % 3) as u32,
                unwritten: true,
            })
            .unwrap();
            root = *t.root();
            if let Some(e) = e2fsck_bounds_error(&io, &root, eof) {
                panic!("{ctx}: prealloc {k}: {e}");
            }
        }
        // Punch some (splits the three-block ones) and write others
        // (converted, i_size grows to cover them).
        let mut rng = Rng(extents ^ gap);
        for step in 0..30 {
            let l = eof + gap + rng.below(160);
            let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
            let got = t.remove(l, l + 1).unwrap();
            root = *t.root();
            if step % 3 == 0 {
                for mut m in got {
                    m.unwritten = false;
                    p.eof_block = p.eof_block.max(m.end());
                    let mut t = ExtentTree::new(&mut io, p, &root).unwrap();
                    t.insert(&m).unwrap();
                    root = *t.root();
                }
            }
            if let Some(e) = e2fsck_bounds_error(&io, &root, p.eof_block) {
                panic!("{ctx}: step {step}: {e}");
            }
        }
        let (_, d) = check(&io, &p, &root);
        assert!(d >= 1, "{ctx}: depth {d}");
    }
}
