//! What online lazy init needs from the operations layer: the group
//! interlock with the kernel's checks, and `ITABLE_ZEROED` through a
//! journal handle. The worker itself (plan, zero, pace) is
//! `ext4kit::lazyinit::online`.

use std::sync::Arc;

use ext4kit_device::Device;
use ext4kit_format::group_desc::GroupDesc;

use super::Filesystem;
use crate::FsError;
use crate::groups::Layout;
use crate::ialloc::ZeroingGuard;

impl Filesystem {
    /// The static layout of the block groups.
    pub fn layout(&self) -> &Layout {
        self.descs.layout()
    }

    /// Group `g`'s descriptor as last rendered (the allocators' state may
    /// be newer until the running operation ends).
    pub fn group_desc(&self, g: u32) -> Result<GroupDesc, FsError> {
        self.descs.get(self.rw.blocks(), g)
    }

    /// The device underneath.
    pub fn device(&self) -> &Arc<dyn Device> {
        self.rw.blocks().device()
    }

    /// Lock group `g` for zeroing its inode table
    /// ([`crate::ialloc::InodeAlloc::lock_group_for_zeroing`]: waits for
    /// an allocation in the group, then keeps allocation out of it), and
    /// check the kernel's contract for the range it gives: no inode in use
    /// at or past its first slot (a block holding a live inode is never
    /// zeroed; such a bitmap contradicts `bg_itable_unused`: refused as
    /// corrupt). Call it without holding an operation: allocations wait
    /// for the guard while holding the operations mutex.
    pub fn lock_group_for_zeroing(&self, g: u32) -> Result<ZeroingGuard<'_>, FsError> {
        let guard = self.ialloc.lock_group_for_zeroing(self.rw.blocks(), g)?;
        if !guard.already_zeroed
            && guard.zero_from < guard.zero_end
            && let Some(ino) = self
                .ialloc
                .first_used_from(self.rw.blocks(), g, guard.first_slot)?
        {
            return Err(FsError::corrupt(
                "inode bitmap",
                format!(
                    "group {g}: inode {ino} is in use past the bg_itable_unused watermark (inode table blocks {}..{} would be zeroed)",
                    guard.zero_from, guard.zero_end
                ),
            ));
        }
        Ok(guard)
    }

    /// The zeros of the guard's range are written (and flushed): record
    /// `ITABLE_ZEROED` and release the group, then journal the descriptor
    /// (rendered with its checksum by [`Filesystem::finish`], like every
    /// allocator change). Returns the tid that holds the flag; it reaches
    /// the disk with that commit, whose first flush also makes the zeros
    /// durable before its commit block. (An operation that ends first may
    /// render the flag into its own, earlier transaction: also after the
    /// zeros.) The group is released before the operations mutex is taken,
    /// so an allocation waiting for it under that mutex cannot deadlock
    /// with us.
    pub fn mark_itable_zeroed(&self, guard: ZeroingGuard<'_>) -> Result<u32, FsError> {
        guard.mark_zeroed();
        let op = self.begin(0, 1)?;
        self.finish(op)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;

    use ext4kit_format::inode::S_IFREG;

    use super::*;
    use crate::balloc::tests::image;
    use crate::fs::NewInode;
    use crate::rw::RwOptions;

    /// Three threads create files (each in its own directory, so that
    /// they meet in the allocator only) as fast as they can while the group
    /// they allocate from is locked and released again and again: the
    /// lock's range never holds an inode in use, not even after a while
    /// under the lock (allocation stays out), and allocations did meet it.
    #[test]
    fn zeroing_lock_keeps_allocations_out_of_its_range() {
        let dev = Arc::new(image(40 << 20, &[]));
        let fs = Filesystem::open(dev, RwOptions::default()).unwrap();
        let ipg = fs.layout().inodes_per_group;
        let stop = AtomicBool::new(false);
        let last = AtomicU32::new(12);
        let dirs: Vec<u32> = (0..3)
            .map(|t| {
                let spec = NewInode::new(ext4kit_format::inode::S_IFDIR | 0o755, 0, 0);
                fs.mkdir(2, format!("d{t}").as_bytes(), &spec)
                    .unwrap()
                    .0
                    .ino
            })
            .collect();
        let made: u32 = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|t| {
                    let (fs, stop, last, dir) = (&fs, &stop, &last, dirs[t]);
                    s.spawn(move || {
                        let spec = NewInode::new(S_IFREG | 0o644, 0, 0);
                        let mut n = 0;
                        while !stop.load(Ordering::Relaxed) {
                            match fs.create(dir, format!("f{n}").as_bytes(), &spec) {
                                Ok((i, _)) => last.store(i.ino, Ordering::Relaxed),
                                Err(FsError::NoSpace { .. }) => break,
                                Err(e) => panic!("{e}"),
                            }
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            for _ in 0..100 {
                let g = (last.load(Ordering::Relaxed) - 1) / ipg;
                let guard = fs.lock_group_for_zeroing(g).unwrap();
                assert!(guard.zero_from <= guard.zero_end);
                std::thread::sleep(Duration::from_micros(300));
                let used = fs
                    .inode_alloc()
                    .first_used_from(fs.rw().blocks(), g, guard.first_slot)
                    .unwrap();
                assert_eq!(used, None, "an inode was handed out in the range");
                drop(guard);
                std::thread::sleep(Duration::from_micros(100));
            }
            stop.store(true, Ordering::Relaxed);
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert!(made > 50, "{made}");
        assert!(fs.inode_alloc().zeroing_skips() > 0);
        fs.close().unwrap();
    }
}
