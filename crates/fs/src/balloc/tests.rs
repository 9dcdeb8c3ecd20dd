//! The allocators against a naive model (sets of block and inode numbers),
//! on real mkfs layouts in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ext4kit::testing::MemImage;
use ext4kit_device::{Device, MemDevice};
use ext4kit_format::Superblock;
use proptest::prelude::*;
use zerocopy::IntoBytes;

use super::*;
use crate::DeviceBlocks;
use crate::groups::{DescTable, DirtySet, Layout};
use crate::ialloc::InodeAlloc;

/// A fresh ext4 in memory (1 KiB blocks: 8 MiB groups).
pub(crate) fn image(size: u64, extra: &[&str]) -> MemDevice {
    let mut m = MemImage::new(size, 1024, 16384);
    m.features = extra.iter().map(|s| s.to_string()).collect();
    m.make().unwrap()
}

/// One shared image per configuration: the allocators never write.
fn cached(
    slot: &'static std::sync::OnceLock<MemDevice>,
    size: u64,
    extra: &[&str],
) -> &'static MemDevice {
    slot.get_or_init(|| image(size, extra))
}

static FLEX40: std::sync::OnceLock<MemDevice> = std::sync::OnceLock::new();
static NOFLEX24: std::sync::OnceLock<MemDevice> = std::sync::OnceLock::new();

pub(crate) struct Open {
    pub layout: Layout,
    pub descs: Arc<DescTable>,
    pub ba: Arc<BlockAlloc>,
    pub ia: InodeAlloc,
}

pub(crate) fn open(dev: &MemDevice, discard: bool) -> Open {
    let mut buf = vec![0u8; 1024];
    dev.read_at(&mut buf, 1024).unwrap();
    let sb = Superblock::parse(&buf).unwrap();
    let layout = Layout::from_superblock(&sb).unwrap();
    let rd = DeviceBlocks::new(dev, layout.block_size, layout.blocks_count);
    let descs = Arc::new(DescTable::read(layout.clone(), &rd).unwrap());
    let dirty = Arc::new(DirtySet::default());
    let ba = Arc::new(BlockAlloc::open(&rd, descs.clone(), dirty.clone(), discard).unwrap());
    let ia = InodeAlloc::open(&rd, descs.clone(), ba.clone(), dirty).unwrap();
    Open {
        layout,
        descs,
        ba,
        ia,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { len: u32, goal: Option<u16> },
    Free { pick: u16, skip: u16, len: u16 },
    DoubleFree { pick: u16 },
    Commit,
    Discard { pick: u16 },
    GiveBack { pick: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..20_000, proptest::option::of(any::<u16>()))
            .prop_map(|(len, goal)| Op::Alloc { len, goal }),
        3 => (any::<u16>(), any::<u16>(), 1u16..5000)
            .prop_map(|(pick, skip, len)| Op::Free { pick, skip, len }),
        1 => any::<u16>().prop_map(|pick| Op::DoubleFree { pick }),
        2 => Just(Op::Commit),
        2 => any::<u16>().prop_map(|pick| Op::Discard { pick }),
        1 => any::<u16>().prop_map(|pick| Op::GiveBack { pick }),
    ]
}

fn blocks_of(ext: &[(u64, u32)]) -> impl Iterator<Item = u64> + '_ {
    ext.iter().flat_map(|&(s, n)| s..s + u64::from(n))
}

/// Run `ops` on the allocator and on the model; check after every step.
fn run_model(dev: &MemDevice, discard: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let o = open(dev, discard);
    let l = &o.layout;
    let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
    // The model: allocatable, busy per tid, discarding, and what we own.
    let mut avail: BTreeSet<u64> = BTreeSet::new();
    for g in 0..l.group_count {
        for (s, n) in o.ba.free_ranges(&rd, g).unwrap() {
            avail.extend(s..s + u64::from(n));
        }
    }
    let mut busy: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    let mut discarding: Vec<(u64, u32)> = Vec::new();
    let mut owned: Vec<(u64, u32)> = Vec::new();
    // Start near the wrap of tids.
    let mut tid: u32 = u32::MAX - 3;
    for op in ops {
        match *op {
            Op::Alloc { len, goal } => {
                let goal = goal.map(|x| l.blocks_count * u64::from(x) / 65536);
                let mut req = AllocRequest::new(u64::from(len), 0);
                req.goal = goal;
                req.max_extent = if len % 2 == 0 { 32768 } else { 32767 };
                let r = o.ba.alloc(&rd, &req);
                let busy_n: usize = busy.values().map(|s| s.len()).sum::<usize>()
                    + discarding.iter().map(|d| d.1 as usize).sum::<usize>();
                match r {
                    Ok(a) => {
                        prop_assert!(avail.len() as u64 >= u64::from(len));
                        let got: Vec<u64> = blocks_of(&a.extents).collect();
                        prop_assert_eq!(got.len() as u64, u64::from(len));
                        for b in &got {
                            prop_assert!(avail.remove(b), "block {} handed out but not free", b);
                        }
                        for &(s, n) in &a.extents {
                            prop_assert!(n <= req.max_extent);
                            prop_assert!(a.dirty.contains(&l.group_of(s)));
                        }
                        owned.extend(a.extents);
                    }
                    Err(FsError::NoSpace { .. }) => {
                        prop_assert!((avail.len() as u64) < u64::from(len));
                        prop_assert!(
                            busy_n == 0 || ((avail.len() + busy_n) as u64) < u64::from(len)
                        );
                    }
                    Err(FsError::SpaceBusy { .. }) => {
                        prop_assert!((avail.len() as u64) < u64::from(len));
                        prop_assert!(((avail.len() + busy_n) as u64) >= u64::from(len));
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("alloc: {e}"))),
                }
            }
            Op::Free { pick, skip, len } => {
                if owned.is_empty() {
                    continue;
                }
                let i = usize::from(pick) % owned.len();
                let (s, n) = owned[i];
                let skip = u32::from(skip) % n;
                let len = u32::from(len).min(n - skip);
                let fs = s + u64::from(skip);
                o.ba.free(&rd, tid, fs, len).unwrap();
                // Keep what is left owned.
                owned.swap_remove(i);
                if skip > 0 {
                    owned.push((s, skip));
                }
                if skip + len < n {
                    owned.push((fs + u64::from(len), n - skip - len));
                }
                busy.entry(tid).or_default().extend(fs..fs + u64::from(len));
            }
            Op::DoubleFree { pick } => {
                // A range that is free (allocatable or busy) must be refused.
                let Some(&b) = avail.iter().nth(usize::from(pick) % avail.len().max(1)) else {
                    continue;
                };
                let before = o.ba.free_blocks();
                prop_assert!(o.ba.free(&rd, tid, b, 1).is_err());
                prop_assert_eq!(o.ba.free_blocks(), before);
            }
            Op::Commit => {
                let got = o.ba.committed(tid);
                let mut want: BTreeSet<u64> = BTreeSet::new();
                for (_, s) in std::mem::take(&mut busy) {
                    want.extend(s);
                }
                let got_blocks: BTreeSet<u64> = blocks_of(&got).collect();
                prop_assert_eq!(&got_blocks, &want);
                if discard {
                    discarding.extend(got);
                } else {
                    avail.extend(want);
                }
                tid = tid.wrapping_add(1);
            }
            Op::GiveBack { pick } => {
                if owned.is_empty() {
                    continue;
                }
                let i = usize::from(pick) % owned.len();
                let (s, n) = owned.swap_remove(i);
                o.ba.give_back(&rd, &[(s, n)]).unwrap();
                // Twice is refused.
                prop_assert!(o.ba.give_back(&rd, &[(s, n)]).is_err());
                avail.extend(s..s + u64::from(n));
            }
            Op::Discard { pick } => {
                if discarding.is_empty() {
                    continue;
                }
                let i = usize::from(pick) % discarding.len();
                let (s, n) = discarding.swap_remove(i);
                // Release it in two halves, as a discard split by the
                // device's limit would.
                let h = n / 2;
                if h > 0 {
                    o.ba.discarded(s, h).unwrap();
                }
                o.ba.discarded(s + u64::from(h), n - h).unwrap();
                avail.extend(s..s + u64::from(n));
            }
        }
        let busy_n: u64 = busy.values().map(|s| s.len() as u64).sum::<u64>()
            + discarding.iter().map(|d| u64::from(d.1)).sum::<u64>();
        prop_assert_eq!(o.ba.available_blocks(), avail.len() as u64);
        prop_assert_eq!(o.ba.busy_blocks(), busy_n);
    }
    // Rendered bitmaps and descriptors agree with the model.
    let mut disk_free = avail.clone();
    for s in busy.values() {
        disk_free.extend(s);
    }
    for &(s, n) in &discarding {
        disk_free.extend(s..s + u64::from(n));
    }
    let dirty = o.ba.take_dirty();
    for d in &dirty {
        let imgs = o.ia.render(&rd, d).unwrap();
        prop_assert!(imgs.desc.checksum_ok(&l.csum, d.group, l.desc_size));
        let gs = l.group_start(d.group);
        let n = l.blocks_in_group(d.group);
        let want_free = (gs..gs + u64::from(n))
            .filter(|b| disk_free.contains(b))
            .count();
        prop_assert_eq!(imgs.desc.free_blocks() as usize, want_free);
        if let Some((blk, img)) = imgs.block_bitmap {
            prop_assert_eq!(blk, imgs.desc.block_bitmap());
            for i in 0..l.block_size * 8 {
                let set = img[(i / 8) as usize] & (1 << (i % 8)) != 0;
                let free = i < n && disk_free.contains(&(gs + u64::from(i)));
                prop_assert_eq!(set, !free, "group {} bit {}", d.group, i);
            }
            prop_assert_eq!(
                imgs.desc.block_bitmap_csum(),
                l.bitmap_csum(&img[..l.block_bitmap_bytes()])
            );
        }
    }
    for g in 0..l.group_count {
        if !dirty.iter().any(|d| d.group == g) {
            // Untouched groups: what is on disk is still right.
            let gs = l.group_start(g);
            let n = l.blocks_in_group(g);
            let want_free = (gs..gs + u64::from(n))
                .filter(|b| disk_free.contains(b))
                .count();
            prop_assert_eq!(
                o.descs.get(&rd, g).unwrap().free_blocks() as usize,
                want_free
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn blocks_match_the_model(ops in proptest::collection::vec(op(), 1..60), discard in any::<bool>()) {
        run_model(cached(&FLEX40, 40 << 20, &[]), discard, &ops)?;
    }

    #[test]
    fn blocks_match_the_model_without_flex_bg(ops in proptest::collection::vec(op(), 1..40)) {
        run_model(cached(&NOFLEX24, 24 << 20, &["^flex_bg"]), false, &ops)?;
    }
}

/// A fresh filesystem: large requests get whole free groups, one extent
/// each, and no bitmap is read for them.
#[test]
fn large_request_takes_whole_groups() {
    let dev = image(200 << 20, &[]);
    let o = open(&dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
    let before = o.ba.stats();
    let a =
        o.ba.alloc(
            &rd,
            &AllocRequest::new(10 * u64::from(l.blocks_per_group), 0),
        )
        .unwrap();
    let st = o.ba.stats();
    assert_eq!(st.bitmap_reads, before.bitmap_reads);
    assert!(a.extents.len() <= 12, "{:?}", a.extents);
    // Whole groups, merged where they are adjacent (up to 32768).
    assert!(
        a.extents
            .iter()
            .all(|e| e.1.is_multiple_of(l.blocks_per_group)),
        "{:?}",
        a.extents
    );
    // Every group visited gave an extent, or was the goal group.
    assert!(st.groups_visited - before.groups_visited <= 3 * a.extents.len() as u64 + 2);
}

/// No space, and busy space, are told apart.
#[test]
fn enospc_versus_wait_for_commit() {
    let dev = image(16 << 20, &[]);
    let o = open(&dev, true);
    let l = &o.layout;
    let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
    let all = o.ba.available_blocks();
    // Reserved blocks stay free for an unprivileged caller.
    let mut req = AllocRequest::new(all - 100, 0);
    req.keep_free = 101;
    assert!(matches!(
        o.ba.alloc(&rd, &req),
        Err(FsError::NoSpace { .. })
    ));
    let a = o.ba.alloc(&rd, &AllocRequest::new(all, 0)).unwrap();
    assert!(matches!(
        o.ba.alloc(&rd, &AllocRequest::new(1, 0)),
        Err(FsError::NoSpace { .. })
    ));
    let (s, n) = a.extents[0];
    o.ba.free(&rd, 7, s, n).unwrap();
    assert!(matches!(
        o.ba.alloc(&rd, &AllocRequest::new(1, 0)),
        Err(FsError::SpaceBusy { .. })
    ));
    let freed = o.ba.committed(7);
    assert_eq!(freed, vec![(s, n)]);
    // Discard on: still busy until the discard completes.
    assert!(matches!(
        o.ba.alloc(&rd, &AllocRequest::new(1, 0)),
        Err(FsError::SpaceBusy { .. })
    ));
    o.ba.discarded(s, n).unwrap();
    let b =
        o.ba.alloc(&rd, &AllocRequest::new(u64::from(n), 0))
            .unwrap();
    assert_eq!(b.extents, vec![(s, n)]);
}

#[derive(Clone, Debug)]
enum IOp {
    Alloc { parent: u16, dir: bool },
    Free { pick: u16 },
}

fn iop() -> impl Strategy<Value = IOp> {
    prop_oneof![
        3 => (any::<u16>(), any::<bool>()).prop_map(|(parent, dir)| IOp::Alloc { parent, dir }),
        1 => any::<u16>().prop_map(|pick| IOp::Free { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Inodes: never handed out twice, never past the watermark of an
    /// unzeroed table, counts and rendered bitmaps/descriptors as the
    /// model says.
    #[test]
    fn inodes_match_the_model(ops in proptest::collection::vec(iop(), 1..300)) {
        let dev = cached(&FLEX40, 40 << 20, &[]);
        let o = open(dev, false);
        let l = &o.layout;
        let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
        let ipg = l.inodes_per_group;
        let mut used: BTreeMap<u32, bool> = BTreeMap::new(); // ino -> is_dir
        let mut dirs: Vec<u32> = vec![2];
        let base_free = o.ia.free_inodes();
        for op in &ops {
            match *op {
                IOp::Alloc { parent, dir } => {
                    let p = dirs[usize::from(parent) % dirs.len()];
                    let a = o.ia.alloc(&rd, p, dir).unwrap();
                    prop_assert!(a.ino >= l.first_ino);
                    prop_assert!(used.insert(a.ino, dir).is_none(), "inode {} twice", a.ino);
                    prop_assert_eq!(a.group, (a.ino - 1) / ipg);
                    if dir { dirs.push(a.ino); }
                }
                IOp::Free { pick } => {
                    let files: Vec<u32> = used.keys().copied().collect();
                    if files.is_empty() { continue; }
                    let ino = files[usize::from(pick) % files.len()];
                    let dir = used[&ino];
                    if dir && dirs.len() > 1 {
                        dirs.retain(|&d| d != ino);
                    } else if dir {
                        continue;
                    }
                    o.ia.free(&rd, ino, dir).unwrap();
                    used.remove(&ino);
                    prop_assert!(o.ia.free(&rd, ino, dir).is_err());
                }
            }
            prop_assert_eq!(o.ia.free_inodes(), base_free - used.len() as u64);
        }
        for d in o.ba.take_dirty() {
            let g = d.group;
            let imgs = o.ia.render_group(&rd, g).unwrap();
            prop_assert!(imgs.desc.checksum_ok(&l.csum, g, l.desc_size));
            let mine: Vec<u32> = used.keys().copied().filter(|i| (i - 1) / ipg == g).collect();
            if let Some((_, img)) = &imgs.inode_bitmap {
                for i in 0..ipg {
                    let ino = g * ipg + i + 1;
                    let set = img[(i / 8) as usize] & (1 << (i % 8)) != 0;
                    // mkfs used 1..=11 (reserved inodes and lost+found).
                    let want = used.contains_key(&ino) || (g == 0 && ino <= l.first_ino);
                    prop_assert_eq!(set, want, "inode {}", ino);
                }
                prop_assert_eq!(
                    imgs.desc.inode_bitmap_csum(),
                    l.bitmap_csum(&img[..l.inode_bitmap_bytes()])
                );
            }
            // Every used inode lies below the watermark.
            let wm = ipg - imgs.desc.itable_unused();
            for ino in &mine {
                prop_assert!((ino - 1) % ipg < wm);
            }
            prop_assert_eq!(imgs.desc.flags() & ext4kit_format::group_desc::BG_INODE_UNINIT, 0);
            let ndirs = mine.iter().filter(|i| used[i]).count() as u32;
            let base_dirs = if g == 0 { 2 } else { 0 }; // root, lost+found
            prop_assert_eq!(imgs.desc.used_dirs(), ndirs + base_dirs);
        }
    }
}

/// While a group is being zeroed, allocation keeps out of it.
#[test]
fn zeroing_lock_keeps_allocation_out() {
    let dev = image(40 << 20, &[]);
    let o = open(&dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
    let guard = o.ia.lock_group_for_zeroing(&rd, 0).unwrap();
    assert!(guard.zero_from > o.descs.get(&rd, 0).unwrap().inode_table());
    for _ in 0..50 {
        let a = o.ia.alloc(&rd, 12, false).unwrap();
        assert_ne!(a.group, 0);
    }
    guard.mark_zeroed();
    let a = o.ia.alloc(&rd, 12, false).unwrap();
    assert_eq!(a.group, 0);
    let imgs = o.ia.render_group(&rd, 0).unwrap();
    assert_ne!(
        imgs.desc.flags() & ext4kit_format::group_desc::BG_INODE_ZEROED,
        0
    );
}

/// Several threads allocating and freeing at once never share a block.
#[test]
fn concurrent_allocations_are_disjoint() {
    let dev = cached(&FLEX40, 40 << 20, &[]);
    let o = open(dev, false);
    let l = o.layout.clone();
    let before = o.ba.available_blocks();
    let results: Vec<Vec<(u64, u32)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u32)
            .map(|t| {
                let ba = o.ba.clone();
                let l = l.clone();
                s.spawn(move || {
                    let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
                    let mut kept = Vec::new();
                    for i in 0..200u32 {
                        let len = u64::from(1 + (i * 37 + t * 11) % 40);
                        let a = ba.alloc(&rd, &AllocRequest::new(len, t)).unwrap();
                        if i % 3 == 0 {
                            for &(b, n) in &a.extents {
                                ba.free(&rd, t, b, n).unwrap();
                            }
                        } else {
                            kept.extend(a.extents);
                        }
                    }
                    kept
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<(u64, u32)> = results.into_iter().flatten().collect();
    all.sort_unstable();
    for w in all.windows(2) {
        assert!(
            w[0].0 + u64::from(w[0].1) <= w[1].0,
            "{:?} overlaps {:?}",
            w[0],
            w[1]
        );
    }
    let kept: u64 = all.iter().map(|e| u64::from(e.1)).sum();
    for t in 0..4 {
        o.ba.committed(t);
    }
    assert_eq!(o.ba.available_blocks(), before - kept);
    assert_eq!(o.ba.busy_blocks(), 0);
}

/// Consecutive allocations with the previous end as goal are contiguous;
/// a file's first blocks come from its inode's group when it has room.
#[test]
fn goal_locality() {
    let dev = cached(&FLEX40, 40 << 20, &[]);
    let o = open(dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
    let a = o.ba.alloc(&rd, &AllocRequest::new(10, 3)).unwrap();
    assert_eq!(l.group_of(a.extents[0].0), 3);
    let mut end = a.extents[0].0 + 10;
    for len in [1u64, 5, 100, 17] {
        let mut req = AllocRequest::new(len, 0);
        req.goal = Some(end);
        let b = o.ba.alloc(&rd, &req).unwrap();
        assert_eq!(b.extents, vec![(end, len as u32)]);
        end += len;
    }
}

#[test]
fn inode_goals_follow_the_kernel() {
    let dev = cached(&FLEX40, 40 << 20, &[]);
    let o = open(dev, false);
    let l = &o.layout;
    assert_eq!(l.flex_size, 16);
    assert_eq!(o.ba.goal_for_inode(3, true), l.group_start(1));
    assert_eq!(o.ba.goal_for_inode(3, false), l.group_start(0));
    let dev = cached(&NOFLEX24, 24 << 20, &["^flex_bg"]);
    let o = open(dev, false);
    assert_eq!(o.ba.goal_for_inode(2, true), o.layout.group_start(2));
}

/// Top-level directories spread over flex groups; files stay with their
/// parent's group.
#[test]
fn orlov_spreads_top_level_directories() {
    let dev = image(200 << 20, &["^flex_bg"]);
    let o = open(&dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
    let groups: BTreeSet<u32> = (0..8)
        .map(|_| o.ia.alloc(&rd, 2, true).unwrap().group)
        .collect();
    assert!(groups.len() >= 4, "{groups:?}");
    let d = o.ia.alloc(&rd, 2, true).unwrap();
    for _ in 0..5 {
        let f = o.ia.alloc(&rd, d.ino, false).unwrap();
        assert_eq!(f.group, d.group);
    }
    // A subdirectory stays in its parent's group while it has room.
    let sub = o.ia.alloc(&rd, d.ino, true).unwrap();
    assert_eq!(sub.group, d.group);
}

/// Write every changed group's bitmaps and descriptor block to `dev`
/// (test-only, unjournaled).
fn write_back(dev: &MemDevice, o: &Open) {
    let l = &o.layout;
    let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
    let mut blocks = BTreeSet::new();
    for d in o.ba.take_dirty() {
        let im = o.ia.render(&rd, &d).unwrap();
        for (b, img) in [im.block_bitmap, im.inode_bitmap].into_iter().flatten() {
            dev.write_at(&img, b * u64::from(l.block_size)).unwrap();
        }
        blocks.insert(im.desc_block);
    }
    for i in blocks {
        let (b, img) = o.descs.block_image(&rd, i).unwrap();
        dev.write_at(&img, b * u64::from(l.block_size)).unwrap();
    }
}

/// Groups that need their bitmap are read only when a search wants them:
/// not for a request they cannot hold, and once for one they can.
#[test]
fn unread_groups_are_read_only_when_useful() {
    let dev = image(40 << 20, &[]);
    {
        let o = open(&dev, false);
        let l = &o.layout;
        let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
        // Leave groups 2 and 3 partly used (so their free count no longer
        // matches the layout).
        for g in [2u32, 3] {
            o.ba.alloc(&rd, &AllocRequest::new(3000, g)).unwrap();
        }
        write_back(&dev, &o);
    }
    let o = open(&dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
    let unread = u64::from(l.group_count) - o.ba.stats().groups_from_layout;
    assert!(unread >= 2, "{unread}");
    // 8000 blocks fit no partly used group: served by a free one, no read.
    let a = o.ba.alloc(&rd, &AllocRequest::new(8000, 2)).unwrap();
    assert_eq!(o.ba.stats().bitmap_reads, 0);
    assert_eq!(a.extents.len(), 1);
    // A small request with goal group 3: its bitmap is read, once.
    let b = o.ba.alloc(&rd, &AllocRequest::new(10, 3)).unwrap();
    assert_eq!(l.group_of(b.extents[0].0), 3);
    o.ba.alloc(&rd, &AllocRequest::new(10, 3)).unwrap();
    assert_eq!(o.ba.stats().bitmap_reads, 1);
    // The bitmap on disk was what we rendered: allocated blocks are taken.
    let gs = l.group_start(3);
    let free = o.ba.free_ranges(&rd, 3).unwrap();
    let free_n: u64 = free.iter().map(|r| u64::from(r.1)).sum();
    assert_eq!(
        free_n,
        u64::from(l.blocks_in_group(3)) - 3000 - 20 - u64::from(l.base_meta_blocks(3))
    );
    assert!(free.iter().all(|r| r.0 >= gs));
}

/// The search does not grow with the number of groups: the same request
/// on a 32x larger fresh filesystem visits as many groups and reads no
/// bitmap either.
#[test]
fn search_cost_is_flat_in_the_group_count() {
    let visits = |size: u64| {
        let dev = image(size, &[]);
        let o = open(&dev, false);
        let l = &o.layout;
        let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count);
        let mut req = AllocRequest::new(40_000, 0);
        req.max_extent = 32767;
        let a = o.ba.alloc(&rd, &req).unwrap();
        let st = o.ba.stats();
        assert_eq!(st.bitmap_reads, 0);
        (st.groups_visited, a.extents.len())
    };
    // 8 groups against 256 (1 KiB blocks).
    let small = visits(64 << 20);
    let large = visits(2 << 30);
    assert_eq!(small.1, large.1);
    assert!(large.0 <= small.0 + 2, "{small:?} {large:?}");
}

/// Creating a file in group 0 (whose block bitmap is not known from the
/// layout) renders its inode side only: no block bitmap read or written.
#[test]
fn inode_only_change_reads_no_block_bitmap() {
    let dev = cached(&FLEX40, 40 << 20, &[]);
    let o = open(dev, false);
    let l = &o.layout;
    let rd = DeviceBlocks::new(dev, l.block_size, l.blocks_count);
    let a = o.ia.alloc(&rd, 2, false).unwrap();
    assert_eq!(a.group, 0);
    let dirty = o.ba.take_dirty();
    assert_eq!(dirty.len(), 1);
    assert!(!dirty[0].block_bitmap && dirty[0].inode_bitmap);
    let im = o.ia.render(&rd, &dirty[0]).unwrap();
    assert!(im.block_bitmap.is_none());
    assert!(im.inode_bitmap.is_some());
    assert_eq!(o.ba.stats().bitmap_reads, 0);
    assert!(im.desc.checksum_ok(&l.csum, 0, l.desc_size));
    assert_eq!(
        im.desc.free_blocks(),
        o.descs.get(&rd, 0).unwrap().free_blocks()
    );
}

static PLAIN24: std::sync::OnceLock<MemDevice> = std::sync::OnceLock::new();

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Corrupt superblock fields, descriptors and bitmaps (on a filesystem
    /// without checksums, so the damage gets past the reads) never make the
    /// allocators panic: they refuse or allocate from what they were told.
    #[test]
    fn corrupt_metadata_never_panics(
        edits in proptest::collection::vec((0u8..8, any::<u16>(), any::<u8>()), 1..12),
        lens in proptest::collection::vec(1u64..5000, 1..6),
    ) {
        let base = cached(&PLAIN24, 24 << 20, &["^metadata_csum", "^uninit_bg"]);
        let dev = base.snapshot();
        let mut sbuf = vec![0u8; 1024];
        dev.read_at(&mut sbuf, 1024).unwrap();
        let sb = Superblock::parse(&sbuf).unwrap();
        let l = Layout::from_superblock(&sb).unwrap();
        let bs = u64::from(l.block_size);
        let d0 = crate::groups::read_descriptors(&l, &DeviceBlocks::new(&dev, l.block_size, l.blocks_count)).unwrap();
        for (what, off, val) in edits {
            let at = match what {
                // Superblock: the first 0x60 bytes hold the geometry.
                0 => 1024 + u64::from(off % 0x60),
                // The descriptors.
                1..=4 => l.desc_block(0) * bs + u64::from(off) % (u64::from(l.group_count) * l.desc_size as u64),
                // Some group's block or inode bitmap.
                5 | 6 => d0[(u32::from(off) % l.group_count) as usize].block_bitmap() * bs + u64::from(off >> 4) % bs,
                _ => d0[(u32::from(off) % l.group_count) as usize].inode_bitmap() * bs + u64::from(off >> 4) % bs,
            };
            dev.write_at(&[val], at).unwrap();
        }
        dev.read_at(&mut sbuf, 1024).unwrap();
        let Some(sb) = Superblock::parse(&sbuf) else { return Ok(()) };
        let Ok(l) = Layout::from_superblock(&sb) else { return Ok(()) };
        if l.blocks_count > (64 << 20) {
            // Absurdly large claimed sizes: reads fail, fine; keep it fast.
            return Ok(());
        }
        let rd = DeviceBlocks::new(&dev, l.block_size, l.blocks_count.min(dev.size() / u64::from(l.block_size)));
        let Ok(descs) = DescTable::read(l.clone(), &rd) else { return Ok(()) };
        let descs = Arc::new(descs);
        let dirty = Arc::new(DirtySet::default());
        let Ok(ba) = BlockAlloc::open(&rd, descs.clone(), dirty.clone(), false) else { return Ok(()) };
        let ba = Arc::new(ba);
        let Ok(ia) = InodeAlloc::open(&rd, descs.clone(), ba.clone(), dirty) else { return Ok(()) };
        for (i, len) in lens.into_iter().enumerate() {
            if let Ok(a) = ba.alloc(&rd, &AllocRequest::new(len, i as u32)) {
                for &(s, n) in &a.extents {
                    let _ = ba.free(&rd, 1, s, n);
                }
            }
            let _ = ia.alloc(&rd, 2, i % 2 == 0);
        }
        let _ = ba.committed(1);
        for d in ba.take_dirty() {
            let _ = ia.render(&rd, &d);
        }
    }
}

/// With fewer than 11 inodes per group (8: `-N` small) the reserved
/// inodes 1..=10 reach into group 1: allocation never hands one out, even
/// where the bitmap does not mark it, and the first free inode is 12
/// (lost+found is 11, in group 1's table).
#[test]
fn reserved_inodes_past_group_0_are_never_allocated() {
    let mut m = MemImage::new(64 << 20, 1024, 4 << 20);
    m.features = vec!["^metadata_csum".into()];
    let dev = m.make().unwrap();
    let mut buf = vec![0u8; 1024];
    dev.read_at(&mut buf, 1024).unwrap();
    let sb = Superblock::parse(&buf).unwrap();
    let layout = Layout::from_superblock(&sb).unwrap();
    assert_eq!(layout.inodes_per_group, 8);
    // Clear inodes 9 and 10 (group 1's slots 0 and 1) in the bitmap and
    // the counts, as a formatter that marks only group 0's reserved
    // inodes leaves them (no checksums on this image).
    let rd = DeviceBlocks::new(&dev, layout.block_size, layout.blocks_count);
    let descs = DescTable::read(layout.clone(), &rd).unwrap();
    let mut d = descs.get(&rd, 1).unwrap();
    let at = d.inode_bitmap() * u64::from(layout.block_size);
    dev.read_at(&mut buf[..1], at).unwrap();
    assert_eq!(buf[0] & 0b111, 0b111, "mkfs marks 9, 10 and 11");
    dev.write_at(&[buf[0] & !0b11], at).unwrap();
    d.set_free_inodes(d.free_inodes() + 2);
    let bs = u64::from(layout.block_size);
    let at = layout.desc_block(0) * bs + layout.desc_size as u64;
    dev.write_at(&d.as_bytes()[..layout.desc_size], at).unwrap();
    let free = sb.s_free_inodes_count.get() + 2;
    dev.write_at(&free.to_le_bytes(), 1024 + 0x10).unwrap();
    let o = open(&dev, false);
    let rd = DeviceBlocks::new(&dev, o.layout.block_size, o.layout.blocks_count);
    let first = o.ia.alloc(&rd, 2, false).unwrap();
    assert_eq!((first.ino, first.group), (12, 1));
    for _ in 0..20 {
        let a = o.ia.alloc(&rd, 2, false).unwrap();
        assert!(a.ino >= 12, "reserved inode {} handed out", a.ino);
    }
}

/// Bigalloc behind the engine's switch: the allocator's cluster
/// primitives hand out and take back whole clusters only, and the
/// rendered cluster bitmap and count follow them; the block-granular
/// `alloc`/`free` refuse (the extent writer does not use clusters yet).
#[test]
fn bigalloc_alloc_and_free_whole_clusters() {
    let mut m = MemImage::new(32 << 20, 1024, 16384);
    m.features = vec!["bigalloc".into()];
    let dev = m.make().unwrap();
    let mut buf = vec![0u8; 1024];
    dev.read_at(&mut buf, 1024).unwrap();
    let sb = Superblock::parse(&buf).unwrap();
    let layout = Layout::from_superblock(&sb).unwrap();
    let cb = layout.cluster_bits;
    assert_eq!(cb, 4);
    let r = 1u64 << cb;
    let rd = DeviceBlocks::new(&dev, layout.block_size, layout.blocks_count);
    let descs = Arc::new(DescTable::read(layout.clone(), &rd).unwrap());
    let ba = BlockAlloc::open(&rd, descs.clone(), Arc::new(DirtySet::default()), false).unwrap();
    let free0 = ba.free_blocks();
    assert_eq!(free0, sb.free_blocks_count());
    assert!(matches!(
        ba.alloc(&rd, &AllocRequest::new(1, 0)),
        Err(FsError::InvalidRequest(_))
    ));
    // 1 block, 17 blocks, and a goal inside a cluster.
    let mut got = Vec::new();
    for (len, mid_goal) in [(1u64, false), (17, false), (5, true)] {
        let mut req = AllocRequest::new(len, 0);
        // Three blocks into the cluster after the last allocation.
        let goal = mid_goal.then(|| {
            let &(s, n): &(u64, u32) = got.last().unwrap();
            s + u64::from(n) + 3
        });
        req.goal = goal;
        let a = ba.alloc_clusters(&rd, &req).unwrap();
        let total: u64 = a.extents.iter().map(|e| u64::from(e.1)).sum();
        assert_eq!(total, len.div_ceil(r) * r, "{len}");
        for &(s, n) in &a.extents {
            assert_eq!(s % r, 0, "{s}");
            assert_eq!(u64::from(n) % r, 0, "{n}");
        }
        if let Some(g) = goal {
            assert_eq!(a.extents[0].0, g & !(r - 1));
        }
        got.extend(a.extents);
    }
    assert_eq!(ba.free_blocks(), free0 - 16 - 32 - 16);
    // The rendered bitmap: one bit per cluster, set for each allocated
    // cluster; the count in clusters.
    let side = ba.render(&rd, 0, true).unwrap();
    let (_, img, _) = side.bitmap.expect("group 0 has a bitmap");
    let bit = |c: u64| img[(c / 8) as usize] >> (c % 8) & 1;
    for &(s, n) in &got {
        for c in s / r..(s + u64::from(n)) / r {
            assert_eq!(bit(c), 1, "cluster {c}");
        }
    }
    let cpg = u64::from(layout.blocks_per_group) >> cb;
    let clear = (0..cpg.min(layout.blocks_count >> cb))
        .filter(|&c| bit(c) == 0)
        .count() as u32;
    assert_eq!(side.free_blocks, clear);
    assert_eq!(u64::from(clear) << cb, ba.free_blocks());
    // Frees: whole clusters only.
    let (s, _) = got[1];
    assert!(matches!(
        ba.free_clusters(&rd, 1, s + 1, 16),
        Err(FsError::InvalidRequest(_))
    ));
    assert!(matches!(
        ba.free(&rd, 1, s, 16),
        Err(FsError::InvalidRequest(_))
    ));
    ba.free_clusters(&rd, 1, s, 32).unwrap();
    assert_eq!(ba.free_blocks(), free0 - 32);
    let side = ba.render(&rd, 0, true).unwrap();
    let (_, img, _) = side.bitmap.unwrap();
    assert_eq!(img[(s / r / 8) as usize] >> (s / r % 8) & 1, 0);
    assert_eq!(u64::from(side.free_blocks) << cb, ba.free_blocks());
}
