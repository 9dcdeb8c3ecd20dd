//! File contents: the block mapping of an inode (extents, block map or
//! inline data), reads with holes and unwritten extents as zeros, and
//! symbolic link targets (fast, slow and inline).

use crate::FsError;
use crate::extent::Mapping;
use crate::inode::InodeInfo;
use crate::sb::Fs;

/// Longest symlink target (`PATH_MAX` less the terminating NUL).
pub const MAX_LINK: u64 = 4095;

/// Where a file's bytes are.
#[derive(Clone, Debug)]
pub enum Content {
    /// Block-mapped or extent-mapped data, sorted by logical block.
    Blocks(Vec<Mapping>),
    /// Inline data (i_block and the `system.data` attribute), already
    /// cut to the file's size.
    Inline(Vec<u8>),
}

impl Fs<'_> {
    /// The mapping of an inode's data (inline data included).
    pub fn content(&self, inode: &InodeInfo) -> Result<Content, FsError> {
        if inode.has_inline_data() {
            return Ok(Content::Inline(self.inline_data(inode)?));
        }
        Ok(Content::Blocks(self.file_map(inode)?))
    }

    /// The block mapping of an inode without inline data.
    pub fn file_map(&self, inode: &InodeInfo) -> Result<Vec<Mapping>, FsError> {
        if inode.has_inline_data() {
            return Ok(Vec::new());
        }
        let bs = u64::from(self.info.block_size);
        if inode.has_extents() {
            self.extents(inode)
        } else {
            self.block_map(inode, inode.size.div_ceil(bs).min(1 << 32))
        }
    }

    /// The bytes of an inline-data inode: `i_block` then the value of
    /// `system.data`, cut to `i_size`. A regular file may be larger than
    /// that (mke2fs -d leaves a file of zeros inline and empty, whatever
    /// its size; e2fsck and the kernel accept it): the rest reads as
    /// zeros ([`Fs::read_at`]), not padded here.
    pub fn inline_data(&self, inode: &InodeInfo) -> Result<Vec<u8>, FsError> {
        if !self
            .info
            .features
            .incompat
            .contains(ext4kit_format::Incompat::INLINE_DATA)
        {
            return Err(FsError::corrupt(
                "inode",
                format!(
                    "inode {} has inline data on a filesystem without inline_data",
                    inode.ino
                ),
            ));
        }
        let mut data = inode.i_block.to_vec();
        if let Some(v) = self.inline_data_xattr(inode)? {
            data.extend_from_slice(&v);
        }
        let size = usize::try_from(inode.size).unwrap_or(usize::MAX);
        if size > data.len() && !inode.is_regular() {
            return Err(FsError::corrupt(
                "inode",
                format!(
                    "inode {}: size {} is larger than its inline data ({} bytes)",
                    inode.ino,
                    inode.size,
                    data.len()
                ),
            ));
        }
        data.truncate(size);
        Ok(data)
    }

    /// Read up to `buf.len()` bytes at `off` of a file whose content is
    /// `content`; returns the number of bytes read (0 at end of file).
    pub fn read_at(
        &self,
        inode: &InodeInfo,
        content: &Content,
        off: u64,
        buf: &mut [u8],
    ) -> Result<usize, FsError> {
        crate::sb::need_key_for_contents(inode)?;
        // An fs-verity file's Merkle tree lies past i_size: never read.
        if off >= inode.size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(inode.size - off) as usize;
        let buf = &mut buf[..n];
        match content {
            Content::Inline(d) => {
                // Past the inline bytes (a regular file's i_size may be
                // larger): zeros.
                let s = (off as usize).min(d.len());
                let have = (d.len() - s).min(n);
                buf[..have].copy_from_slice(&d[s..s + have]);
                buf[have..].fill(0);
            }
            Content::Blocks(maps) => {
                let bs = u64::from(self.info.block_size);
                let mut done = 0usize;
                let mut blockbuf = vec![0u8; bs as usize];
                while done < n {
                    let pos = off + done as u64;
                    let lblk = pos / bs;
                    let in_blk = (pos % bs) as usize;
                    let take = (bs as usize - in_blk).min(n - done);
                    let dst = &mut buf[done..done + take];
                    let i = maps.partition_point(|m| m.end() <= lblk);
                    match maps.get(i) {
                        Some(m) if m.lblk <= lblk && !m.unwritten => {
                            let p = m.pblk + (lblk - m.lblk);
                            self.blocks.read_block(p, &mut blockbuf)?;
                            dst.copy_from_slice(&blockbuf[in_blk..in_blk + take]);
                        }
                        _ => dst.fill(0),
                    }
                    done += take;
                }
            }
        }
        Ok(n)
    }

    /// Call `sink` with the whole content, in order, in pieces of at most
    /// 1 MiB. `sink` returns `false` to stop early.
    pub fn read_each(
        &self,
        inode: &InodeInfo,
        sink: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), FsError> {
        let content = self.content(inode)?;
        let chunk = (1u64 << 20).min(inode.size) as usize;
        let mut buf = vec![0u8; chunk];
        let mut off = 0u64;
        while off < inode.size {
            let n = self.read_at(inode, &content, off, &mut buf)?;
            if n == 0 {
                break;
            }
            if !sink(&buf[..n]) {
                break;
            }
            off += n as u64;
        }
        Ok(())
    }

    /// The whole content of a small file (directories, symlinks); refuses
    /// more than `max` bytes.
    pub fn read_all(&self, inode: &InodeInfo, max: u64) -> Result<Vec<u8>, FsError> {
        if inode.size > max {
            return Err(FsError::corrupt(
                "inode",
                format!("inode {}: size {} is above {max}", inode.ino, inode.size),
            ));
        }
        let mut out = Vec::with_capacity(inode.size as usize);
        self.read_each(inode, &mut |b| {
            out.extend_from_slice(b);
            true
        })?;
        Ok(out)
    }

    /// Is this a fast symlink (target in `i_block`)? The kernel's rule:
    /// no inline data and no blocks other than an xattr block.
    pub fn is_fast_symlink(&self, inode: &InodeInfo) -> bool {
        if !inode.is_symlink() || inode.has_inline_data() {
            return false;
        }
        if self
            .info
            .features
            .incompat
            .contains(ext4kit_format::Incompat::EA_INODE)
        {
            return inode.size > 0 && inode.size < 60;
        }
        let ea = if inode.file_acl != 0 {
            u64::from(self.info.block_size / 512)
        } else {
            0
        };
        inode.blocks_512.saturating_sub(ea) == 0 && inode.size < 60
    }

    /// The target of a symbolic link.
    pub fn read_link(&self, inode: &InodeInfo) -> Result<Vec<u8>, FsError> {
        if !inode.is_symlink() {
            return Err(FsError::NotASymlink);
        }
        let bad = |d: String| FsError::corrupt("symlink", format!("inode {}: {d}", inode.ino));
        if inode.size == 0 || inode.size > MAX_LINK {
            return Err(bad(format!("target length {}", inode.size)));
        }
        let target = if self.is_fast_symlink(inode) {
            inode.i_block[..inode.size as usize].to_vec()
        } else {
            let t = self.read_all(inode, MAX_LINK)?;
            if inode.size > u64::from(self.info.block_size) {
                return Err(bad("a slow symlink longer than one block".into()));
            }
            t
        };
        if inode.flags & ext4kit_format::fscrypt::ENCRYPT_FL != 0 {
            // `fscrypt_get_symlink` without the key: the stored
            // ciphertext (after its 2-byte length) as a no-key name with
            // hash words 0.
            let len = match target.get(..2) {
                Some(l) => usize::from(u16::from_le_bytes([l[0], l[1]])),
                None => 0,
            };
            if len == 0 || len + 2 > target.len() {
                return Err(bad(format!("encrypted target length {len}")));
            }
            return Ok(ext4kit_format::fscrypt::nokey_name(
                &target[2..2 + len],
                0,
                0,
            ));
        }
        if target.contains(&0) {
            return Err(bad("the target contains a NUL byte".into()));
        }
        Ok(target)
    }
}
