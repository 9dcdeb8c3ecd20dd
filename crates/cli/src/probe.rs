//! What is on a target before mkfs overwrites it: the signatures mke2fs's
//! `check_plausibility()` (lib/support/plausible.c, through libblkid)
//! reports, with mke2fs's wording.
//!
//! Filesystems and other superblocks first, in libblkid's probing order
//! (LVM2 PV, LUKS, vfat, swap, xfs, ext4/ext3/ext2/jbd, iso9660, ntfs,
//! squashfs, btrfs, f2fs), then partition tables (GPT, DOS/MBR), as mke2fs
//! asks libblkid for `PTTYPE` only when no filesystem was found. The checks
//! follow libblkid's (magic numbers, and the checksums or sanity checks it
//! uses to reject stale or random matches) for the common cases; they are
//! not a complete libblkid. Reads only; never writes.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// How much of the start of the target is read (btrfs' superblock sits at
/// 64 KiB, swap headers at the end of a page of up to 64 KiB).
const HEAD: usize = 128 * 1024;

/// Times and mount point of an ext2/3/4 superblock (`print_ext2_info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtInfo {
    pub mtime: u32,
    pub wtime: u32,
    pub mkfs_time: u32,
    pub last_mounted: String,
}

/// A signature found on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A filesystem or another superblock (libblkid `TYPE`, `LABEL`).
    Fs {
        fs_type: &'static str,
        label: Option<String>,
        ext: Option<ExtInfo>,
    },
    /// A partition table (libblkid `PTTYPE`).
    PartitionTable(&'static str),
}

impl Found {
    /// What mke2fs prints about it: lines for stdout, lines for stderr.
    pub fn report(&self, device: &str) -> (Vec<String>, Vec<String>) {
        match self {
            Found::PartitionTable(t) => (
                Vec::new(),
                vec![format!("Found a {t} partition table in {device}")],
            ),
            Found::Fs {
                fs_type,
                label,
                ext,
            } => {
                let mut out = vec![match label {
                    Some(l) => format!("{device} contains a {fs_type} file system labelled '{l}'"),
                    None => format!("{device} contains a {fs_type} file system"),
                }];
                if let Some(e) = ext {
                    let t = |s: u32| {
                        ext4kit_device::ctime_local(i64::from(s)).unwrap_or_else(|| s.to_string())
                    };
                    if e.mtime != 0 {
                        if e.last_mounted.is_empty() {
                            out.push(format!("\tlast mounted on {}", t(e.mtime)));
                        } else {
                            out.push(format!(
                                "\tlast mounted on {} on {}",
                                e.last_mounted,
                                t(e.mtime)
                            ));
                        }
                    } else if e.mkfs_time != 0 {
                        out.push(format!("\tcreated on {}", t(e.mkfs_time)));
                    } else if e.wtime != 0 {
                        out.push(format!("\tlast modified on {}", t(e.wtime)));
                    }
                }
                (out, Vec::new())
            }
        }
    }
}

/// Read the start of `path` (without blocking on a FIFO, and only from a
/// regular file or a block device) and look for signatures.
pub fn probe_path(path: &Path) -> io::Result<Option<Found>> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let ft = f.metadata()?.file_type();
    if !(ft.is_file() || ft.is_block_device()) {
        return Ok(None);
    }
    let buf = read_head(&f)?;
    let read = |off: u64, len: usize| {
        let mut v = vec![0u8; len];
        // Unreadable or short: zeros (no label there).
        let _ = f.read_at(&mut v, off);
        v
    };
    Ok(probe_with(&buf, &read))
}

fn read_head(f: &File) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; HEAD];
    let mut pos = 0;
    while pos < HEAD {
        match f.read_at(&mut buf[pos..], pos as u64) {
            Ok(0) => break,
            Ok(n) => pos += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // Past the end reads as zeros (no signature there).
    Ok(buf)
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from(le32(b, o)) | u64::from(le32(b, o + 4)) << 32
}
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be64(b: &[u8], o: usize) -> u64 {
    u64::from(be32(b, o)) << 32 | u64::from(be32(b, o + 4))
}

/// A label as libblkid stores it: up to the first NUL, trailing
/// whitespace removed; empty means none.
fn label(raw: &[u8]) -> Option<String> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let s = String::from_utf8_lossy(&raw[..end]);
    let s = s.trim_end();
    (!s.is_empty()).then(|| s.to_string())
}

/// One signature check over the start of the target.
type Prober = fn(&[u8]) -> Option<Found>;

/// Look for signatures in the first bytes of a target (read as zeros past
/// its end).
#[cfg(test)]
pub fn probe(buf: &[u8]) -> Option<Found> {
    let read = |off: u64, len: usize| {
        let mut v = vec![0u8; len];
        if let Ok(o) = usize::try_from(off)
            && o < buf.len()
        {
            let n = len.min(buf.len() - o);
            v[..n].copy_from_slice(&buf[o..o + n]);
        }
        v
    };
    probe_with(buf, &read)
}

/// Reads `len` bytes at an offset (zeros where nothing can be read).
type ReadAt<'a> = &'a dyn Fn(u64, usize) -> Vec<u8>;

/// [`probe()`], with `read` for what lies past the start (FAT root
/// directories).
fn probe_with(buf: &[u8], read: ReadAt<'_>) -> Option<Found> {
    if buf.len() < HEAD {
        let mut b = buf.to_vec();
        b.resize(HEAD, 0);
        return probe_with(&b, read);
    }
    if let Some(f) = lvm2(buf).or_else(|| luks(buf)) {
        return Some(f);
    }
    if is_vfat(buf) == Some(true) {
        return fs("vfat", fat_label(buf, read));
    }
    let probers: [Prober; 10] = [
        swap, xfs, ext, iso9660, ntfs, squashfs, btrfs, f2fs, gpt, dos,
    ];
    probers.iter().find_map(|p| p(buf))
}

fn fs(fs_type: &'static str, label: Option<String>) -> Option<Found> {
    Some(Found::Fs {
        fs_type,
        label,
        ext: None,
    })
}

/// LVM2's own CRC (lib/label/label.c `calc_crc`).
pub fn lvm2_crc(buf: &[u8]) -> u32 {
    const TAB: [u32; 16] = [
        0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4, 0x4db26158,
        0x5005713c, 0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c, 0x9b64c2b0, 0x86d3d2d4,
        0xa00ae278, 0xbdbdf21c,
    ];
    let mut crc: u32 = 0xf597a6cf;
    for &b in buf {
        crc ^= u32::from(b);
        crc = (crc >> 4) ^ TAB[(crc & 0xf) as usize];
        crc = (crc >> 4) ^ TAB[(crc & 0xf) as usize];
    }
    crc
}

fn lvm2(b: &[u8]) -> Option<Found> {
    for sector in 0..4usize {
        let h = &b[sector * 512..sector * 512 + 512];
        if &h[0..8] == b"LABELONE"
            && &h[24..32] == b"LVM2 001"
            && le64(h, 8) == sector as u64
            && lvm2_crc(&h[20..512]) == le32(h, 16)
        {
            return fs("LVM2_member", None);
        }
    }
    None
}

fn luks(b: &[u8]) -> Option<Found> {
    if &b[0..6] != b"LUKS\xba\xbe" {
        return None;
    }
    match be16(b, 6) {
        1 => fs("crypto_LUKS", None),
        2 => fs("crypto_LUKS", label(&b[24..72])),
        _ => None,
    }
}

/// A FAT boot sector (libblkid's vfat magics plus its sanity checks on
/// the BIOS parameter block).
fn is_vfat(b: &[u8]) -> Option<bool> {
    let fat32 = &b[0x52..0x5a] == b"FAT32   " || &b[0x52..0x57] == b"MSWIN";
    let fat16 = matches!(&b[0x36..0x3e], b"FAT12   " | b"FAT16   " | b"FAT     ")
        || &b[0x36..0x3b] == b"MSDOS";
    if !fat32 && !fat16 {
        return None;
    }
    let sector_size = le16(b, 11);
    let cluster = b[13];
    let reserved = le16(b, 14);
    let fats = b[16];
    let media = b[21];
    let ok = sector_size.is_power_of_two()
        && (512..=4096).contains(&sector_size)
        && cluster.is_power_of_two()
        && reserved > 0
        && fats > 0
        && (media >= 0xf8 || media == 0xf0);
    Some(ok)
}

/// The FAT volume label, as libblkid takes it: from the volume-label entry
/// of the root directory only (not the boot sector's copy).
fn fat_label(b: &[u8], read: ReadAt<'_>) -> Option<String> {
    let sector = u64::from(le16(b, 11));
    let reserved = u64::from(le16(b, 14));
    let fats = u64::from(b[16]);
    let fat16_len = u64::from(le16(b, 22));
    let search = |off: u64, entries: u64| -> Option<String> {
        let dir = read(off, usize::try_from(entries.min(65536) * 32).ok()?);
        for e in dir.chunks_exact(32) {
            if e[0] == 0 {
                break;
            }
            let attr = e[11];
            if e[0] == 0xE5 || le16(e, 20) != 0 || le16(e, 26) != 0 || attr & 0x3f == 0x0f {
                continue;
            }
            if attr & (0x08 | 0x10) == 0x08 {
                let mut name = e[0..11].to_vec();
                if name[0] == 0x05 {
                    name[0] = 0xE5;
                }
                return Some(label(&name).unwrap_or_default());
            }
        }
        None
    };
    let found = if fat16_len != 0 {
        let root = (reserved + fat16_len * fats) * sector;
        search(root, u64::from(le16(b, 17)))
    } else {
        let fat32_len = u64::from(le32(b, 36));
        let cluster = u64::from(b[13]);
        let data = reserved + fat32_len * fats;
        let entries = fat32_len * sector / 4;
        let mut next = u64::from(le32(b, 44));
        let mut found = None;
        for _ in 0..99 {
            if next < 2 || next >= entries {
                break;
            }
            let off = (data + (next - 2) * cluster) * sector;
            found = search(off, cluster * sector / 32);
            if found.is_some() {
                break;
            }
            let fat = read(reserved * sector + next * 4, 4);
            next = u64::from(le32(&fat, 0) & 0x0fff_ffff);
        }
        found
    };
    found.filter(|l| !l.is_empty())
}

fn swap(b: &[u8]) -> Option<Found> {
    for page in [4096usize, 8192, 16384, 32768, 65536] {
        let m = &b[page - 10..page];
        if m == b"SWAP-SPACE" {
            return fs("swap", None);
        }
        if m == b"SWAPSPACE2" {
            let v = le32(b, 1024);
            if (v != 1 && v.swap_bytes() != 1) || le32(b, 1028) == 0 {
                return None;
            }
            // "Is there any garbage down there?" (padding[32..34]).
            let l = if le32(b, 1196) == 0 && le32(b, 1200) == 0 {
                label(&b[1052..1068])
            } else {
                None
            };
            return fs("swap", l);
        }
    }
    None
}

/// libblkid's `xfs_verify_sb()`: the magic and a consistent geometry;
/// version 5 superblocks also need their CRC.
fn xfs(b: &[u8]) -> Option<Found> {
    if &b[0..4] != b"XFSB" {
        return None;
    }
    let blocksize = u64::from(be32(b, 4));
    let dblocks = be64(b, 8);
    let rextsize = u64::from(be32(b, 80));
    let agblocks = u64::from(be32(b, 84));
    let agcount = u64::from(be32(b, 88));
    let versionnum = be16(b, 100);
    let sectsize = u32::from(be16(b, 102));
    let inodesize = u32::from(be16(b, 104));
    let (blocklog, sectlog, inodelog, inopblog) = (
        u32::from(b[120]),
        u32::from(b[121]),
        u32::from(b[122]),
        u32::from(b[123]),
    );
    let imax_pct = b[127];
    let ok = agcount > 0
        && (512..=32768).contains(&sectsize)
        && (9..=15).contains(&sectlog)
        && sectsize == 1 << sectlog
        && (512..=65536).contains(&blocksize)
        && (9..=16).contains(&blocklog)
        && blocksize == 1 << blocklog
        && (256..=2048).contains(&inodesize)
        && (8..=11).contains(&inodelog)
        && inodesize == 1 << inodelog
        && blocklog.checked_sub(inodelog) == Some(inopblog)
        && (4096..=1 << 30).contains(&rextsize.saturating_mul(blocksize))
        && imax_pct <= 100
        && dblocks != 0
        && dblocks <= agcount * agblocks
        && dblocks >= (agcount - 1) * agblocks + 64;
    if !ok {
        return None;
    }
    if versionnum & 0x0f == 5 {
        if versionnum & 0x8000 == 0 || be32(b, 200) & 0x100 == 0 {
            return None;
        }
        let mut sb = b[..sectsize as usize].to_vec();
        sb[224..228].fill(0);
        let crc = !ext4kit_format::checksum::crc32c_raw(!0, &sb);
        if crc != le32(b, 224) {
            return None;
        }
    }
    fs("xfs", label(&b[108..120]))
}

const EXT_HAS_JOURNAL: u32 = 0x0004;
const EXT_JOURNAL_DEV: u32 = 0x0008;
const EXT_METADATA_CSUM: u32 = 0x0400;
const EXT_TEST_FILESYS: u32 = 0x0004;
/// ro_compat features ext2 and ext3 understand (sparse_super, large_file,
/// btree_dir).
const EXT3_RO_SUPP: u32 = 0x0001 | 0x0002 | 0x0004;
/// incompat features ext2 understands (filetype, meta_bg).
const EXT2_INCOMPAT_SUPP: u32 = 0x0002 | 0x0010;
/// incompat features ext3 understands (filetype, recover, meta_bg).
const EXT3_INCOMPAT_SUPP: u32 = 0x0002 | 0x0004 | 0x0010;

/// libblkid's ext probers: jbd, ext4dev, ext4, ext3, ext2.
fn ext(b: &[u8]) -> Option<Found> {
    let sb = &b[1024..2048];
    if le16(sb, 56) != 0xEF53 {
        return None;
    }
    let compat = le32(sb, 92);
    let incompat = le32(sb, 96);
    let ro = le32(sb, 100);
    if ro & EXT_METADATA_CSUM != 0 {
        let crc = ext4kit_format::checksum::crc32c_raw(!0, &sb[..1020]);
        if crc != le32(sb, 1020) {
            return None;
        }
    } else if le32(sb, 24) >= 256 {
        return None;
    }
    let test_fs = le32(sb, 352) & EXT_TEST_FILESYS != 0;
    let fs_type = if incompat & EXT_JOURNAL_DEV != 0 {
        "jbd"
    } else if test_fs {
        "ext4dev"
    } else if ro & !EXT3_RO_SUPP != 0 || incompat & !EXT3_INCOMPAT_SUPP != 0 {
        "ext4"
    } else if compat & EXT_HAS_JOURNAL != 0 {
        "ext3"
    } else if ro & !EXT3_RO_SUPP == 0 && incompat & !EXT2_INCOMPAT_SUPP == 0 {
        "ext2"
    } else {
        return None;
    };
    let lab = if sb[120] != 0 {
        label(&sb[120..136])
    } else {
        None
    };
    let ext = (fs_type != "jbd").then(|| {
        let lm = &sb[136..200];
        let end = lm.iter().position(|&c| c == 0).unwrap_or(lm.len());
        ExtInfo {
            mtime: le32(sb, 44),
            wtime: le32(sb, 48),
            mkfs_time: le32(sb, 264),
            last_mounted: String::from_utf8_lossy(&lm[..end]).into_owned(),
        }
    });
    Some(Found::Fs {
        fs_type,
        label: lab,
        ext,
    })
}

fn iso9660(b: &[u8]) -> Option<Found> {
    let pvd = &b[32768..34816];
    if &pvd[1..6] != b"CD001" {
        return None;
    }
    fs("iso9660", label(&pvd[40..72]))
}

fn ntfs(b: &[u8]) -> Option<Found> {
    let sector_size = le16(b, 11);
    (&b[3..11] == b"NTFS    " && sector_size.is_power_of_two() && sector_size >= 256)
        .then_some(())?;
    fs("ntfs", None)
}

fn squashfs(b: &[u8]) -> Option<Found> {
    // Version 4 (little endian) with a plausible block size.
    if &b[0..4] != b"hsqs" || le16(b, 28) != 4 {
        return None;
    }
    fs("squashfs", None)
}

fn btrfs(b: &[u8]) -> Option<Found> {
    let sb = &b[65536..65536 + 4096];
    if &sb[64..72] != b"_BHRfS_M" {
        return None;
    }
    if le32(sb, 144) == 0 {
        return None; // no sector size
    }
    // csum_type 0 (crc32c) is checked, as libblkid does.
    if le16(sb, 0xc4) == 0 {
        let crc = !ext4kit_format::checksum::crc32c_raw(!0, &sb[32..4096]);
        if crc != le32(sb, 0) {
            return None;
        }
    }
    fs("btrfs", label(&sb[299..299 + 256]))
}

fn f2fs(b: &[u8]) -> Option<Found> {
    if le32(b, 1024) != 0xF2F5_2010 {
        return None;
    }
    fs("f2fs", None)
}

/// The CRC-32 of GPT headers (IEEE 802.3, reflected).
pub fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn gpt(b: &[u8]) -> Option<Found> {
    // A protective (or hybrid) MBR, and a valid header at LBA 1.
    if le16(b, 510) != 0xAA55 || !(0..4).any(|i| b[446 + 16 * i + 4] == 0xEE) {
        return None;
    }
    // LBA 1 of 512-byte or 4 KiB sectors (libblkid uses the device's).
    let valid = |sector: usize| {
        let h = &b[sector..sector + 512];
        let size = le32(h, 12) as usize;
        if &h[0..8] != b"EFI PART" || !(92..=512).contains(&size) || le64(h, 24) != 1 {
            return false;
        }
        let mut hdr = h[..size].to_vec();
        hdr[16..20].fill(0);
        crc32_ieee(&hdr) == le32(h, 16)
    };
    (valid(512) || valid(4096)).then_some(Found::PartitionTable("gpt"))
}

fn dos(b: &[u8]) -> Option<Found> {
    if le16(b, 510) != 0xAA55 {
        return None;
    }
    let entries = (0..4).map(|i| &b[446 + 16 * i..446 + 16 * i + 16]);
    if entries.clone().any(|p| p[0] != 0 && p[0] != 0x80) {
        return None;
    }
    if entries.clone().any(|p| p[4] == 0xEE) {
        return None;
    }
    if is_vfat(b) == Some(true) || &b[3..11] == b"NTFS    " {
        return None;
    }
    Some(Found::PartitionTable("dos"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blank() -> Vec<u8> {
        vec![0u8; HEAD]
    }

    #[test]
    fn nothing_on_zeros_or_random_data() {
        assert_eq!(probe(&blank()), None);
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let noise: Vec<u8> = (0..HEAD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(probe(&noise), None);
    }

    #[test]
    fn ext_types_follow_libblkid() {
        let mut b = blank();
        b[1024 + 56..1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
        // ext2 features only.
        b[1024 + 96] = 0x02;
        assert!(matches!(
            probe(&b),
            Some(Found::Fs {
                fs_type: "ext2",
                ..
            })
        ));
        // has_journal: ext3.
        b[1024 + 92] = 0x04;
        assert!(matches!(
            probe(&b),
            Some(Found::Fs {
                fs_type: "ext3",
                ..
            })
        ));
        // extents: ext4.
        b[1024 + 96] |= 0x40;
        b[1024 + 120..1024 + 128].copy_from_slice(b"precious");
        match probe(&b) {
            Some(Found::Fs {
                fs_type: "ext4",
                label: Some(l),
                ext: Some(_),
            }) => assert_eq!(l, "precious"),
            other => panic!("{other:?}"),
        }
        // metadata_csum with a wrong checksum: not an ext superblock.
        b[1024 + 100] |= 0x04;
        b[1024 + 101] |= 0x04;
        assert_eq!(probe(&b), None);
        let crc = ext4kit_format::checksum::crc32c_raw(!0, &b[1024..2044]);
        b[2044..2048].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            probe(&b),
            Some(Found::Fs {
                fs_type: "ext4",
                ..
            })
        ));
    }

    #[test]
    fn report_wording() {
        let f = Found::Fs {
            fs_type: "swap",
            label: None,
            ext: None,
        };
        assert_eq!(
            f.report("x.img").0,
            vec!["x.img contains a swap file system".to_string()]
        );
        assert_eq!(
            Found::PartitionTable("dos").report("x.img").1,
            vec!["Found a dos partition table in x.img".to_string()]
        );
    }

    #[test]
    fn mbr_and_gpt() {
        let mut b = blank();
        b[510] = 0x55;
        b[511] = 0xAA;
        assert_eq!(probe(&b), Some(Found::PartitionTable("dos")));
        b[446] = 0x12; // bad boot indicator
        assert_eq!(probe(&b), None);
        b[446] = 0;
        b[446 + 4] = 0xEE;
        // Protective MBR without a valid header: neither.
        assert_eq!(probe(&b), None);
        b[512..520].copy_from_slice(b"EFI PART");
        b[512 + 12..512 + 16].copy_from_slice(&92u32.to_le_bytes());
        b[512 + 24..512 + 32].copy_from_slice(&1u64.to_le_bytes());
        let crc = crc32_ieee(&b[512..604]);
        b[512 + 16..512 + 20].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(probe(&b), Some(Found::PartitionTable("gpt")));
        // The same header at LBA 1 of a 4 KiB-sector disk.
        let hdr = b[512..1024].to_vec();
        b[512..1024].fill(0);
        assert_eq!(probe(&b), None);
        b[4096..4608].copy_from_slice(&hdr);
        assert_eq!(probe(&b), Some(Found::PartitionTable("gpt")));
    }
}
