//! `ext4kit info`: geometry and lazy-init state of an ext4 filesystem.

use std::path::PathBuf;

use anyhow::Context;
use ext4kit::image::Image;
use ext4kit::lazyinit;
use ext4kit_device::{OpenOptions, open_device};
use serde_json::json;

/// Show an ext4 filesystem's geometry and how many block groups still lack
/// ITABLE_ZEROED (inode tables left for lazy init). Read-only.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// ext4 image file or block device.
    #[arg(value_name = "DEVICE")]
    pub device: PathBuf,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `ext4kit info`; returns the exit code.
pub fn run(args: &InfoArgs) -> anyhow::Result<i32> {
    let path = &args.device;
    // Device errors name the path themselves.
    let dev = open_device(path, OpenOptions::read_only())?;
    let img = Image::open(dev.as_ref()).with_context(|| format!("{}", path.display()))?;
    let g = img.geometry();
    let st = lazyinit::status(&img);
    let features = img.features().names();
    let allocated = dev.allocated_bytes();
    if args.json {
        let v = json!({
            "device": path.display().to_string(),
            "size": dev.size(),
            "allocated_bytes": allocated,
            "block_size": g.block_size,
            "blocks_count": g.blocks_count,
            "groups": g.group_count,
            "blocks_per_group": g.blocks_per_group,
            "inodes_per_group": g.inodes_per_group,
            "inode_size": g.inode_size,
            "itable_blocks_per_group": g.itable_blocks,
            "desc_size": g.desc_size,
            "desc_blocks": g.desc_blocks,
            "desc_table_block": g.gdt_start,
            "desc_checksum": img.desc_checksum().name(),
            "features": features,
            "needs_recovery": img.needs_recovery(),
            "groups_not_zeroed": st.groups_not_zeroed,
            "groups_inode_uninit": st.groups_inode_uninit,
            "groups_inconsistent": st.groups_inconsistent,
            "bytes_to_zero": st.bytes_to_zero,
        });
        outln!("{v}");
        return Ok(0);
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    outln!("device:              {}", path.display());
    match allocated {
        Some(a) => outln!(
            "size:                {} bytes ({:.1} MiB), {} bytes allocated ({:.1} MiB)",
            dev.size(),
            mib(dev.size()),
            a,
            mib(a)
        ),
        None => outln!(
            "size:                {} bytes ({:.1} MiB)",
            dev.size(),
            mib(dev.size())
        ),
    }
    outln!("block size:          {}", g.block_size);
    outln!("blocks:              {}", g.blocks_count);
    outln!(
        "block groups:        {} ({} blocks, {} inodes per group)",
        g.group_count,
        g.blocks_per_group,
        g.inodes_per_group
    );
    outln!(
        "inode tables:        {} blocks per group ({}-byte inodes)",
        g.itable_blocks,
        g.inode_size
    );
    outln!(
        "group descriptors:   {} bytes, {} block(s) from block {}, checksum {}",
        g.desc_size,
        g.desc_blocks,
        g.gdt_start,
        img.desc_checksum().name()
    );
    outln!("features:            {}", features.join(" "));
    if img.needs_recovery() {
        outln!("journal:             needs recovery");
    }
    outln!(
        "lazy init:           {} of {} groups without ITABLE_ZEROED ({} INODE_UNINIT), {:.1} MiB of inode table to zero",
        st.groups_not_zeroed,
        st.groups,
        st.groups_inode_uninit,
        mib(st.bytes_to_zero)
    );
    if st.groups_inconsistent > 0 {
        outln!(
            "                     {} group(s) with inconsistent counts (lazyinit will refuse)",
            st.groups_inconsistent
        );
    }
    Ok(0)
}
