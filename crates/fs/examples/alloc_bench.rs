//! Seed 003's allocation benchmark for the engine's allocators: on a lazily
//! made 1 TiB and a 16 TiB − 4 KiB sparse image, open the allocators and
//! allocate 50 GiB as one file would for `fallocate` (unwritten extents,
//! at most 32767 blocks each), then render what the transaction would
//! journal. Prints times, bitmap blocks read and groups visited.
//!
//! `cargo run --release -p ext4kit-fs --example alloc_bench [DIR] [GiB] [RUNS]`
//! (DIR: where the sparse images go, default the system temp dir; it must
//! take a 16 TiB sparse file, e.g. ext4, xfs or tmpfs).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ext4kit_device::{Device, FileDevice, OpenOptions};
use ext4kit_format::Superblock;
use ext4kit_fs::balloc::{AllocRequest, BlockAlloc};
use ext4kit_fs::groups::{DescTable, DirtySet, Layout};
use ext4kit_fs::ialloc::InodeAlloc;
use ext4kit_fs::{DeviceBlocks, FsError};

fn out(s: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{s}");
}

fn mkfs(img: &Path, size: u64) -> Result<(), String> {
    let f = std::fs::File::create(img).map_err(|e| format!("{}: {e}", img.display()))?;
    f.set_len(size).map_err(|e| {
        format!(
            "{}: cannot make a {size}-byte sparse file: {e}",
            img.display()
        )
    })?;
    drop(f);
    let st = Command::new("mke2fs")
        .args(["-F", "-q", "-t", "ext4", "-E"])
        .arg("lazy_itable_init=1,lazy_journal_init=1,nodiscard")
        .arg(img)
        .status()
        .map_err(|e| format!("mke2fs: {e}"))?;
    if !st.success() {
        return Err(format!("mke2fs failed on {}", img.display()));
    }
    Ok(())
}

/// Peak resident set size so far, from /proc (0 where unavailable).
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn bench(img: &Path, gib: u64) -> Result<(), FsError> {
    let t_open = Instant::now();
    let dev = FileDevice::open(img, OpenOptions::read_only())?;
    let mut buf = vec![0u8; 1024];
    dev.read_at(&mut buf, 1024)?;
    let sb = Superblock::parse(&buf).ok_or_else(|| FsError::corrupt("superblock", "short"))?;
    let layout = Layout::from_superblock(&sb)?;
    let rd = DeviceBlocks::new(&dev, layout.block_size, layout.blocks_count);
    let t_desc = Instant::now();
    let descs = Arc::new(DescTable::read(layout.clone(), &rd)?);
    let desc_ms = ms(t_desc);
    let dirty = Arc::new(DirtySet::default());
    let t_ba = Instant::now();
    let ba = Arc::new(BlockAlloc::open(&rd, descs.clone(), dirty.clone(), false)?);
    let ba_ms = ms(t_ba);
    let t_ia = Instant::now();
    let ia = InodeAlloc::open(&rd, descs.clone(), ba.clone(), dirty)?;
    let ia_ms = ms(t_ia);
    let open_ms = ms(t_open);

    let len = (gib << 30) / u64::from(layout.block_size);
    let t_alloc = Instant::now();
    let ino = ia.alloc(&rd, 2, false)?;
    let mut req = AllocRequest::new(len, ino.group);
    req.max_extent = 32767;
    let a = ba.alloc(&rd, &req)?;
    let alloc_ms = ms(t_alloc);
    // Extents that do not start at a group boundary: continuations of the
    // previous one across a group end (no one-block holes left behind).
    let spanning = a
        .extents
        .iter()
        .filter(|e| (e.0 - layout.first_data_block) % u64::from(layout.blocks_per_group) != 0)
        .count();
    let st = ba.stats();

    let t_render = Instant::now();
    let groups = ba.take_dirty();
    let mut bitmaps = 0;
    let mut desc_blocks = std::collections::BTreeSet::new();
    for d in &groups {
        let im = ia.render(&rd, d)?;
        bitmaps += usize::from(im.block_bitmap.is_some()) + usize::from(im.inode_bitmap.is_some());
        desc_blocks.insert(im.desc_block);
    }
    for &i in &desc_blocks {
        let _ = descs.block_image(&rd, i)?;
    }
    let render_ms = ms(t_render);
    out(&format!(
        "{}: {} groups ({} from the layout), open {open_ms:.1} ms (descriptors {desc_ms:.1}, block allocator {ba_ms:.1}, inode allocator {ia_ms:.1} ms); \
         allocate {gib} GiB: {alloc_ms:.2} ms, {} extents ({spanning} not group-aligned), {} bitmap reads, {} groups visited; \
         render {render_ms:.1} ms: {} groups, {bitmaps} bitmap blocks, {} descriptor blocks; \
         peak RSS {} MiB",
        img.display(),
        layout.group_count,
        st.groups_from_layout,
        a.extents.len(),
        st.bitmap_reads,
        st.groups_visited,
        groups.len(),
        desc_blocks.len(),
        peak_rss_mib()
    ));
    Ok(())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let gib: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let runs: u32 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let sizes = [("1t", 1u64 << 40), ("16t", (16u64 << 40) - 4096)];
    let mut failed = false;
    for (name, size) in sizes {
        let img = dir.join(format!("alloc_bench_{name}.img"));
        // ALLOC_BENCH_KEEP=1: keep the images and reuse them next time.
        let keep = std::env::var_os("ALLOC_BENCH_KEEP").is_some();
        let made = if keep && img.exists() {
            Ok(())
        } else {
            mkfs(&img, size)
        };
        let r = made.and_then(|()| {
            (0..runs)
                .try_for_each(|_| bench(&img, gib))
                .map_err(|e| format!("{}: {e}", img.display()))
        });
        if !keep {
            let _ = std::fs::remove_file(&img);
        }
        if let Err(e) = r {
            let _ = writeln!(std::io::stderr(), "alloc_bench: {e}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}
