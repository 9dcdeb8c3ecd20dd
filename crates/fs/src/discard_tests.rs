//! Discard at commit through the operations layer, on a memory image
//! behind the latency-injecting [`DelayDevice`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use ext4kit_device::{DelayControl, DelayDevice, Device, MemDevice};
use ext4kit_format::inode::S_IFREG;

use crate::FsError;
use crate::balloc::tests::image;
use crate::discard::{DiscardOptions, Reconcile};
use crate::fs::{Filesystem, NewInode};
use crate::rw::RwOptions;

const ROOT: u32 = 2;

fn opts(workers: usize, reconcile: Reconcile) -> RwOptions {
    RwOptions {
        discard: Some(DiscardOptions {
            workers,
            reconcile,
            reconcile_pace: 0,
            ..DiscardOptions::default()
        }),
        ..RwOptions::default()
    }
}

fn delayed(size: u64) -> (Arc<DelayDevice<MemDevice>>, Arc<DelayControl>) {
    let dev = Arc::new(DelayDevice::new(image(size, &[])));
    let ctl = dev.control();
    (dev, ctl)
}

fn file(fs: &Filesystem, name: &str) -> u32 {
    let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
    fs.create(ROOT, name.as_bytes(), &spec).unwrap().0.ino
}

fn bs(fs: &Filesystem) -> u64 {
    u64::from(fs.rw().geometry().block_size)
}

/// Write `a` and `b` one block at a time in turn: each file's blocks
/// alternate with the other's (two maximally fragmented files).
fn interleaved(fs: &Filesystem, a: u32, b: u32, n: u64) {
    let bs = bs(fs);
    let blk = vec![0x5Au8; bs as usize];
    for i in 0..n {
        fs.write_at(a, i * bs, &blk).unwrap();
        fs.write_at(b, i * bs, &blk).unwrap();
    }
}

/// (physical start, length) of a file's extents.
fn extents(fs: &Filesystem, ino: u32) -> Vec<(u64, u64)> {
    let i = fs.inode(ino).unwrap();
    fs.read(|f| f.file_map(&i))
        .unwrap()
        .iter()
        .map(|m| (m.pblk, u64::from(m.len)))
        .collect()
}

fn any_available(fs: &Filesystem, ext: &[(u64, u64)]) -> bool {
    let rd = fs.rw().blocks();
    ext.iter()
        .flat_map(|&(s, n)| s..s + n)
        .any(|b| fs.block_alloc().is_available(rd, b).unwrap())
}

fn all_available(fs: &Filesystem, ext: &[(u64, u64)]) -> bool {
    let rd = fs.rw().blocks();
    ext.iter()
        .flat_map(|&(s, n)| s..s + n)
        .all(|b| fs.block_alloc().is_available(rd, b).unwrap())
}

/// The freed extents of one commit go out concurrently, after the commit
/// returned, and their blocks stay unallocatable until their discard
/// completed.
#[test]
fn commit_discards_are_parallel_and_off_the_commit_path() {
    let (dev, ctl) = delayed(64 << 20);
    let fs = Filesystem::open(dev.clone(), opts(8, Reconcile::Off)).unwrap();
    let (a, b) = (file(&fs, "a"), file(&fs, "b"));
    interleaved(&fs, a, b, 40);
    fs.sync().unwrap();
    let ea = extents(&fs, a);
    assert!(ea.len() >= 30, "not fragmented: {ea:?}");
    let delay = Duration::from_millis(50);
    ctl.set_discard_delay(delay);
    ctl.reset_counters();
    fs.unlink(ROOT, b"a").unwrap();
    let t = Instant::now();
    fs.sync().unwrap();
    // The commit did not wait: no discard has finished, the blocks are
    // still busy.
    assert_eq!(ctl.discards(), 0, "a discard finished inside the commit");
    assert!(
        !any_available(&fs, &ea),
        "a block was allocatable before its discard"
    );
    // An allocation meanwhile gets none of A's blocks whose discard had
    // not completed by the time it returned.
    let c = file(&fs, "c");
    fs.write_at(c, 0, &vec![1u8; 8 * bs(&fs) as usize]).unwrap();
    let written = Instant::now();
    let ec = extents(&fs, c);
    fs.wait_discards();
    let log = ctl.discard_log();
    let bsz = bs(&fs);
    let busy: std::collections::BTreeSet<u64> = ea.iter().flat_map(|&(s, n)| s..s + n).collect();
    for x in ec.iter().flat_map(|&(s, n)| s..s + n) {
        if busy.contains(&x) {
            let rec = log
                .iter()
                .find(|r| r.offset <= x * bsz && x * bsz < r.offset + r.len)
                .expect("a freed block reused without a discard");
            assert!(
                rec.completed <= written,
                "block {x} reused before its discard completed"
            );
        }
    }
    let all = t.elapsed();
    let st = fs.discard_stats().unwrap();
    let n = ctl.discards();
    assert!(n >= 30, "{n} discards for {} extents", ea.len());
    assert_eq!(st.completed, st.queued);
    assert!(
        ctl.max_in_flight() > 1,
        "max in flight {}",
        ctl.max_in_flight()
    );
    assert!(st.max_in_flight > 1);
    // Issued in parallel: well under the sequential n × 50 ms.
    assert!(
        all < delay * (n as u32) / 2,
        "{n} discards took {all:?} (sequential: {:?})",
        delay * n as u32
    );
    assert!(all_available(&fs, &ea));
    assert_eq!(fs.block_alloc().busy_blocks(), 0);
    fs.close().unwrap();
}

/// Adjacent frees of one transaction become one discard.
#[test]
fn adjacent_frees_are_merged() {
    let (dev, ctl) = delayed(64 << 20);
    let fs = Filesystem::open(dev.clone(), opts(4, Reconcile::Off)).unwrap();
    let (a, b) = (file(&fs, "a"), file(&fs, "b"));
    interleaved(&fs, a, b, 40);
    fs.sync().unwrap();
    let data: u64 = extents(&fs, a)
        .iter()
        .chain(extents(&fs, b).iter())
        .map(|e| e.1)
        .sum();
    assert_eq!(data, 80);
    ctl.reset_counters();
    fs.unlink(ROOT, b"a").unwrap();
    fs.unlink(ROOT, b"b").unwrap();
    fs.sync().unwrap();
    fs.wait_discards();
    let log = ctl.discard_log();
    let bs = bs(&fs);
    // 80 interleaved single blocks (and the two extent-tree leaves): the
    // data is one range.
    assert!(log.len() <= 3, "{} discards: {log:?}", log.len());
    assert!(
        log.iter().any(|r| r.len >= 80 * bs),
        "no merged discard: {log:?}"
    );
    fs.close().unwrap();
}

/// Short of space only because of blocks waiting for their discard, an
/// allocation waits for the discards instead of failing; with nothing
/// pending it fails with NoSpace.
#[test]
fn enospc_waits_for_pending_discards() {
    let (dev, ctl) = delayed(32 << 20);
    let fs = Filesystem::open(dev.clone(), opts(2, Reconcile::Off)).unwrap();
    let bs = bs(&fs);
    let avail = fs.block_alloc().available_blocks();
    let big = avail * 7 / 10;
    let a = file(&fs, "a");
    fs.write_at(a, 0, &vec![3u8; (big * bs) as usize]).unwrap();
    fs.sync().unwrap();
    let delay = Duration::from_millis(150);
    ctl.set_discard_delay(delay);
    ctl.reset_counters();
    fs.unlink(ROOT, b"a").unwrap();
    fs.sync().unwrap();
    assert!(fs.block_alloc().busy_blocks() > 0);
    let b = file(&fs, "b");
    let t = Instant::now();
    // Needs more than is allocatable now.
    fs.write_at(b, 0, &vec![4u8; (big * bs) as usize]).unwrap();
    assert!(t.elapsed() >= delay / 2, "did not wait: {:?}", t.elapsed());
    assert!(ctl.discards() >= 1);
    let mut got = vec![0u8; (big * bs) as usize];
    fs.read_at(b, 0, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 4));
    fs.wait_discards();
    // Nothing pending: a write larger than the free space fails at once.
    let c = file(&fs, "c");
    let left = fs.block_alloc().available_blocks();
    let t = Instant::now();
    let e = fs
        .write_at(c, 0, &vec![5u8; ((left + 64) * bs) as usize])
        .unwrap_err();
    assert!(matches!(e, FsError::NoSpace { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    fs.crash();
}

/// Discards lost in a crash are found again by the next open's
/// reconciler: the memory device's allocation returns to what it was.
#[test]
fn reconciler_gives_back_what_a_crash_lost() {
    let mem = Arc::new(image(64 << 20, &[]));
    let base = mem.allocated_bytes().unwrap();
    let dev = Arc::new(DelayDevice::new(mem.clone()));
    let ctl = dev.control();
    {
        let fs = Filesystem::open(dev.clone(), RwOptions::default()).unwrap();
        let a = file(&fs, "a");
        fs.write_at(a, 0, &vec![7u8; 16 << 20]).unwrap();
        fs.close().unwrap();
    }
    let full = mem.allocated_bytes().unwrap();
    assert!(full >= base + (15 << 20), "{base} -> {full}");
    // Slow discards, small requests: the crash comes first.
    ctl.set_discard_delay(Duration::from_millis(100));
    let mut o = opts(1, Reconcile::Off);
    if let Some(d) = o.discard.as_mut() {
        d.max_request_blocks = 64;
    }
    {
        let fs = Filesystem::open(dev.clone(), o).unwrap();
        fs.unlink(ROOT, b"a").unwrap();
        fs.sync().unwrap();
        fs.crash();
    }
    let after_crash = mem.allocated_bytes().unwrap();
    assert!(after_crash > base + (14 << 20), "{base} -> {after_crash}");
    ctl.set_discard_delay(Duration::ZERO);
    let fs = Filesystem::open(dev.clone(), opts(4, Reconcile::Auto)).unwrap();
    let r = fs.wait_reconciled().unwrap();
    assert!(r.finished && r.error.is_none(), "{r:?}");
    assert!(r.bytes >= 14 << 20, "{r:?}");
    assert_eq!(fs.block_alloc().busy_blocks(), 0);
    fs.close().unwrap();
    let end = mem.allocated_bytes().unwrap();
    // Back to the empty image, up to the journal blocks written meanwhile.
    assert!(end <= base + (1 << 20), "{base} -> {end}");
    // A second reconcile finds nothing.
    let fs = Filesystem::open(dev.clone(), opts(4, Reconcile::Auto)).unwrap();
    let r = fs.wait_reconciled().unwrap();
    assert!(r.finished && r.bytes < 1 << 20, "{r:?}");
    fs.close().unwrap();
}

/// Online trim discards free space the device holds, skips what it does
/// not, and keeps the blocks out of use while it runs.
#[test]
fn online_trim() {
    let mem = Arc::new(image(64 << 20, &[]));
    let base = mem.allocated_bytes().unwrap();
    let fs = Filesystem::open(mem.clone(), RwOptions::default()).unwrap();
    let a = file(&fs, "a");
    fs.write_at(a, 0, &vec![7u8; 8 << 20]).unwrap();
    fs.sync().unwrap();
    fs.unlink(ROOT, b"a").unwrap();
    fs.sync().unwrap();
    let held = mem.allocated_bytes().unwrap();
    assert!(held >= base + (7 << 20));
    let r = fs.trim(&Default::default()).unwrap();
    assert!(r.allocation_known);
    assert!(r.bytes >= 7 << 20 && r.bytes <= r.free_bytes, "{r:?}");
    assert!(mem.allocated_bytes().unwrap() < held - (7 << 20));
    // Again: nothing but the odd free block sharing a 4 KiB chunk of the
    // memory device with used ones (1 KiB blocks here).
    let again = fs.trim(&Default::default()).unwrap();
    assert!(again.bytes < 1 << 16, "{again:?}");
    assert!(again.groups_skipped > 0);
    // Bad ranges are refused before anything is done.
    let bad = crate::discard::TrimRequest {
        start: 1 << 40,
        ..Default::default()
    };
    assert!(matches!(fs.trim(&bad), Err(FsError::InvalidRequest(_))));
    assert_eq!(fs.block_alloc().busy_blocks(), 0);
    fs.close().unwrap();
}

/// A memory device that cannot report allocation (as a block device).
struct Blind(Arc<MemDevice>);

impl Device for Blind {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> ext4kit_device::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> ext4kit_device::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> ext4kit_device::Result<()> {
        self.0.flush()
    }
    fn zeroout(&self, offset: u64, len: u64) -> ext4kit_device::Result<()> {
        self.0.zeroout(offset, len)
    }
    fn discard(
        &self,
        offset: u64,
        len: u64,
    ) -> ext4kit_device::Result<ext4kit_device::DiscardOutcome> {
        self.0.discard(offset, len)
    }
    fn name(&self) -> String {
        "blind".into()
    }
}

/// Without allocation information every free range is discarded once;
/// a second trim skips the groups that freed nothing since (the kernel's
/// WAS_TRIMMED); the reconciler does nothing in Auto and everything in
/// Full.
#[test]
fn trim_without_allocation_info() {
    let mem = Arc::new(image(64 << 20, &[]));
    let dev = Arc::new(DelayDevice::new(Blind(mem.clone())));
    let ctl = dev.control();
    let fs = Filesystem::open(dev.clone(), RwOptions::default()).unwrap();
    let r = fs.trim(&Default::default()).unwrap();
    assert!(!r.allocation_known);
    assert!(r.bytes > 0 && r.bytes == r.free_bytes, "{r:?}");
    assert_eq!(r.groups_skipped, 0);
    ctl.reset_counters();
    let r2 = fs.trim(&Default::default()).unwrap();
    assert_eq!((r2.bytes, r2.groups_skipped), (0, r2.groups), "{r2:?}");
    assert_eq!(ctl.discards(), 0);
    // Free something: its group is trimmed again, the others not.
    let a = file(&fs, "a");
    fs.write_at(a, 0, &vec![1u8; 1 << 20]).unwrap();
    fs.sync().unwrap();
    fs.unlink(ROOT, b"a").unwrap();
    fs.sync().unwrap();
    let r3 = fs.trim(&Default::default()).unwrap();
    assert!(
        r3.bytes > 0 && r3.groups_skipped >= 1 && r3.groups_skipped < r3.groups,
        "{r3:?}"
    );
    fs.close().unwrap();
    let fs = Filesystem::open(dev.clone(), opts(4, Reconcile::Auto)).unwrap();
    let rs = fs.wait_reconciled().unwrap();
    assert_eq!((rs.mode, rs.bytes), (Reconcile::Off, 0), "{rs:?}");
    fs.close().unwrap();
    let fs = Filesystem::open(dev.clone(), opts(4, Reconcile::Full)).unwrap();
    let rs = fs.wait_reconciled().unwrap();
    assert!(
        rs.mode == Reconcile::Full && rs.finished && rs.bytes > 0,
        "{rs:?}"
    );
    fs.close().unwrap();
}

/// A trim with a smaller minimum than the last whole one trims the
/// groups again (the kernel's `s_last_trim_minblks`), also on a mount
/// without `-o discard`, where every trim runs on a new pool.
#[test]
fn smaller_minimum_trims_again_without_discard_pool() {
    let mem = Arc::new(image(64 << 20, &[]));
    let dev = Arc::new(DelayDevice::new(Blind(mem.clone())));
    let fs = Filesystem::open(dev.clone(), RwOptions::default()).unwrap();
    let big = crate::discard::TrimRequest {
        minlen: 1 << 20,
        ..Default::default()
    };
    let r = fs.trim(&big).unwrap();
    assert!(r.bytes > 0 && r.groups_skipped == 0, "{r:?}");
    // Same minimum: skipped.
    let r = fs.trim(&big).unwrap();
    assert_eq!((r.bytes, r.groups_skipped), (0, r.groups), "{r:?}");
    // Smaller: everything again (extents below 1 MiB were left).
    let r = fs.trim(&Default::default()).unwrap();
    assert!(r.bytes > 0 && r.groups_skipped == 0, "{r:?}");
    let r = fs.trim(&Default::default()).unwrap();
    assert_eq!((r.bytes, r.groups_skipped), (0, r.groups), "{r:?}");
    fs.close().unwrap();
}
