//! Reading ext2/ext3 block maps: 12 direct pointers, then indirect, double
//! and triple indirect blocks. Zero pointers are holes; every other pointer
//! must lie inside the filesystem. Only logical blocks below `limit` are
//! mapped, so a damaged size or pointer cannot make the walk unbounded.

use crate::FsError;
use crate::extent::Mapping;
use crate::inode::InodeInfo;
use crate::sb::Fs;

fn push(out: &mut Vec<Mapping>, lblk: u64, pblk: u64) {
    if let Some(last) = out.last_mut()
        && last.end() == lblk
        && last.pblk + u64::from(last.len) == pblk
        && last.len < u32::MAX
    {
        last.len += 1;
        return;
    }
    out.push(Mapping {
        lblk,
        pblk,
        len: 1,
        unwritten: false,
    });
}

impl Fs<'_> {
    /// The runs of a block-mapped inode below logical block `limit`.
    pub fn block_map(&self, inode: &InodeInfo, limit: u64) -> Result<Vec<Mapping>, FsError> {
        let apb = u64::from(self.info.block_size / 4);
        let w = inode.block_words();
        let mut out = Vec::new();
        for (i, &p) in w.iter().take(12).enumerate() {
            let l = i as u64;
            if l >= limit {
                return Ok(out);
            }
            if p != 0 {
                self.check_ptr(inode, u64::from(p), l)?;
                push(&mut out, l, u64::from(p));
            }
        }
        let mut base = 12u64;
        for (level, &p) in w[12..15].iter().enumerate() {
            let span = apb.pow(level as u32 + 1);
            if base >= limit {
                break;
            }
            if p != 0 {
                self.indirect(inode, u64::from(p), level as u32, base, limit, &mut out)?;
            }
            base += span;
        }
        Ok(out)
    }

    /// The physical block of logical block `lblk` of a block-mapped inode
    /// (`None` in a hole): one pointer path is read.
    pub fn block_map_at(&self, inode: &InodeInfo, lblk: u64) -> Result<Option<u64>, FsError> {
        let apb = u64::from(self.info.block_size / 4);
        let w = inode.block_words();
        if lblk < 12 {
            let p = u64::from(w[lblk as usize]);
            if p != 0 {
                self.check_ptr(inode, p, lblk)?;
            }
            return Ok((p != 0).then_some(p));
        }
        let mut rel = lblk - 12;
        for level in 0..3u32 {
            let span = apb.pow(level + 1);
            if rel < span {
                let mut p = u64::from(w[12 + level as usize]);
                let mut l = level as i64;
                while l >= 0 {
                    if p == 0 {
                        return Ok(None);
                    }
                    self.check_ptr(inode, p, lblk)?;
                    let sub = apb.pow(l as u32);
                    let idx = (rel / sub) as usize;
                    rel %= sub;
                    let b = self.blocks.block(p)?;
                    let o = idx * 4;
                    p = u64::from(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]));
                    l -= 1;
                }
                if p != 0 {
                    self.check_ptr(inode, p, lblk)?;
                }
                return Ok((p != 0).then_some(p));
            }
            rel -= span;
        }
        Ok(None)
    }

    fn check_ptr(&self, inode: &InodeInfo, p: u64, lblk: u64) -> Result<(), FsError> {
        if self.info.range_ok(p, 1) {
            Ok(())
        } else {
            Err(FsError::corrupt(
                "block map",
                format!(
                    "inode {}: logical block {lblk} points at block {p}, outside the filesystem",
                    inode.ino
                ),
            ))
        }
    }

    fn indirect(
        &self,
        inode: &InodeInfo,
        blk: u64,
        level: u32,
        base: u64,
        limit: u64,
        out: &mut Vec<Mapping>,
    ) -> Result<(), FsError> {
        self.check_ptr(inode, blk, base)?;
        let apb = u64::from(self.info.block_size / 4);
        let span = apb.pow(level);
        let b = self.blocks.block(blk)?;
        for i in 0..apb {
            let l = base + i * span;
            if l >= limit {
                break;
            }
            let o = (i * 4) as usize;
            let p = u64::from(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]));
            if p == 0 {
                continue;
            }
            if level == 0 {
                self.check_ptr(inode, p, l)?;
                push(out, l, p);
            } else {
                self.indirect(inode, p, level - 1, l, limit, out)?;
            }
        }
        Ok(())
    }
}
