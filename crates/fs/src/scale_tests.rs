//! Open cost and memory that must not grow with the filesystem's size:
//! the descriptor table is read in large sequential requests (not block by
//! block), is not kept (nor left in the block cache), and the allocators
//! hold per-group ranges and bitmaps only for the groups used.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ext4kit_device::{Device, DiscardOutcome, MemDevice, Result as DevResult};
use ext4kit_format::inode::S_IFREG;

use crate::balloc::tests::image;
use crate::fs::{Falloc, Filesystem, NewInode};
use crate::rw::RwOptions;

/// A device that counts its reads.
struct Counting {
    inner: Arc<MemDevice>,
    reads: AtomicU64,
}

impl Device for Counting {
    fn name(&self) -> String {
        "counting".into()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        self.inner.flush()
    }
    fn zeroout(&self, offset: u64, len: u64) -> DevResult<()> {
        self.inner.zeroout(offset, len)
    }
    fn discard(&self, offset: u64, len: u64) -> DevResult<DiscardOutcome> {
        self.inner.discard(offset, len)
    }
}

/// Reads of `Filesystem::open` + close on a fresh image of `size` bytes
/// (1 KiB blocks: 8 MiB groups, 16 descriptors per block), the cache's
/// resident blocks right after open, and the materialized groups.
fn open_cost(size: u64) -> (u64, usize, usize, usize) {
    let dev = Arc::new(Counting {
        inner: Arc::new(image(size, &[])),
        reads: AtomicU64::new(0),
    });
    let fs = Filesystem::open(dev.clone() as Arc<dyn Device>, RwOptions::default()).unwrap();
    let resident = fs.rw().blocks().resident();
    let (mb, mi) = (
        fs.block_alloc().materialized_groups(),
        fs.inode_alloc().materialized_groups(),
    );
    fs.close().unwrap();
    (dev.reads.load(Ordering::Relaxed), resident, mb, mi)
}

#[test]
fn open_and_close_do_not_read_the_table_block_by_block() {
    // 32 and 512 groups: 2 and 32 descriptor blocks.
    let (small, res_small, ..) = open_cost(256 << 20);
    let (big, res_big, mb, mi) = open_cost(4 << 30);
    // Block by block, the big one would need 30 more reads per pass over
    // the table (and there are four: the allocators' three and close's).
    assert!(
        big <= small + 4,
        "reads: {small} for 32 groups, {big} for 512 groups"
    );
    // The table does not stay in the cache.
    assert!(
        res_big <= res_small + 2,
        "resident blocks after open: {res_small} vs {res_big}"
    );
    // Nothing per group is materialized by the open alone.
    assert_eq!((mb, mi), (0, 0));
}

#[test]
fn allocators_hold_ranges_only_for_groups_used() {
    let dev = Arc::new(image(4 << 30, &[]));
    let fs = Filesystem::open(dev.clone() as Arc<dyn Device>, RwOptions::default()).unwrap();
    let groups = fs.block_alloc().layout().group_count as usize;
    assert_eq!(groups, 512);
    let mut op = fs.begin(2, 2).unwrap();
    let spec = NewInode {
        mode: S_IFREG | 0o644,
        uid: 0,
        gid: 0,
        links: 1,
        time: None,
        rdev: None,
    };
    let ino = fs.create_inode(&mut op, 2, &spec).unwrap().ino;
    fs.finish(op).unwrap();
    // 40 MiB: five 8 MiB groups.
    fs.fallocate(ino, 0, 40 << 20, Falloc::default()).unwrap();
    let mb = fs.block_alloc().materialized_groups();
    let mi = fs.inode_alloc().materialized_groups();
    assert!(mb <= 12, "{mb} of {groups} groups' block ranges held");
    assert!(mi <= 2, "{mi} of {groups} groups' inode bitmaps held");
    assert_eq!(fs.inode(ino).unwrap().size, 40 << 20);
    fs.close().unwrap();
    // And what was written is right.
    let fs = Filesystem::open(dev as Arc<dyn Device>, RwOptions::default()).unwrap();
    assert_eq!(fs.inode(ino).unwrap().size, 40 << 20);
    fs.close().unwrap();
}
