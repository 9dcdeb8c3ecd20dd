//! `ext4kit stat IMG:PATH... [--json]`: an inode of an unmounted image, as
//! coreutils' stat shows it (times in UTC), plus ext4's own fields (flags,
//! generation, extended attributes). Read-only.

use std::ffi::OsString;

use ext4kit_fs::inode::{FileType, InodeInfo, Timestamp};
use ext4kit_fs::sb::Fs;
use ext4kit_fs::xattr::XattrPlace;
use serde_json::json;

use crate::cmd_ls::{access_error, full_time, mode_string, open_image, open_volume, parse_target};

/// Show the inode behind IMG:PATH (does not follow a final symlink unless
/// -L), with ext4's extra fields and extended attributes.
#[derive(clap::Args, Debug)]
pub struct StatArgs {
    /// Follow a symbolic link named last.
    #[arg(short = 'L', long = "dereference")]
    pub dereference: bool,
    /// Print one JSON object per operand (one per line).
    #[arg(long)]
    pub json: bool,
    /// IMG:PATH (e2tools' spelling; a plain IMG means its root directory).
    #[arg(value_name = "IMG:PATH", required = true)]
    pub targets: Vec<OsString>,
}

fn type_name(i: &InodeInfo) -> &'static str {
    match i.file_type() {
        FileType::Regular if i.size == 0 => "regular empty file",
        FileType::Regular => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::CharDev => "character special file",
        FileType::BlockDev => "block special file",
        FileType::Fifo => "fifo",
        FileType::Socket => "socket",
        FileType::Unknown => "weird file",
    }
}

fn ts_json(t: Timestamp) -> serde_json::Value {
    json!({ "sec": t.sec, "nsec": t.nsec })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn one(fs: &Fs<'_>, spec: &str, path: &[u8], follow: bool, as_json: bool) -> anyhow::Result<()> {
    let i = fs
        .resolve(path, follow)
        .map_err(|e| access_error(spec, &e))?;
    let link = if i.is_symlink() {
        Some(
            fs.read_link(&i)
                .map_err(|e| anyhow::anyhow!("'{spec}': {e}"))?,
        )
    } else {
        None
    };
    let xattrs = fs
        .xattrs(&i)
        .map_err(|e| anyhow::anyhow!("'{spec}': {e}"))?;
    let name = String::from_utf8_lossy(path).into_owned();
    let (major, minor) = i.rdev();
    let is_dev = matches!(i.file_type(), FileType::CharDev | FileType::BlockDev);
    if as_json {
        let v = json!({
            "path": name,
            "inode": i.ino,
            "type": type_name(&i),
            "mode": format!("{:04o}", i.perm()),
            "mode_raw": i.mode,
            "links": i.links,
            "uid": i.uid,
            "gid": i.gid,
            "size": i.size,
            "blocks": i.blocks_512,
            "io_block": fs.info.block_size,
            "rdev": if is_dev { json!({"major": major, "minor": minor}) } else { json!(null) },
            "atime": ts_json(i.atime),
            "mtime": ts_json(i.mtime),
            "ctime": ts_json(i.ctime),
            "crtime": i.crtime.map(ts_json),
            "flags": i.flags,
            "generation": i.generation,
            "file_acl": i.file_acl,
            "projid": i.projid,
            "extra_isize": i.extra_isize,
            "symlink": link.as_ref().map(|l| String::from_utf8_lossy(l).into_owned()),
            "xattrs": xattrs.iter().map(|x| json!({
                "name": x.name_lossy(),
                "value_hex": hex(&x.value),
                "value": std::str::from_utf8(&x.value).ok(),
                "in_inode": x.place == XattrPlace::Inode,
            })).collect::<Vec<_>>(),
        });
        outln!("{v}");
        return Ok(());
    }
    match &link {
        Some(l) => outln!("  File: {name} -> {}", String::from_utf8_lossy(l)),
        None => outln!("  File: {name}"),
    }
    outln!(
        "  Size: {:<10}\tBlocks: {:<10} IO Block: {:<6} {}",
        i.size,
        i.blocks_512,
        fs.info.block_size,
        type_name(&i)
    );
    if is_dev {
        outln!(
            "Inode: {:<11} Links: {:<5} Device type: {major},{minor}",
            i.ino,
            i.links
        );
    } else {
        outln!("Inode: {:<11} Links: {}", i.ino, i.links);
    }
    outln!(
        "Access: ({:04o}/{})  Uid: ({:>5})   Gid: ({:>5})",
        i.perm(),
        mode_string(&i),
        i.uid,
        i.gid
    );
    outln!("Access: {}", full_time(i.atime));
    outln!("Modify: {}", full_time(i.mtime));
    outln!("Change: {}", full_time(i.ctime));
    match i.crtime {
        Some(t) => outln!(" Birth: {}", full_time(t)),
        None => outln!(" Birth: -"),
    }
    outln!(
        " Flags: {:#x}  Generation: {}  File ACL: {}",
        i.flags,
        i.generation,
        i.file_acl
    );
    for x in &xattrs {
        let v = match std::str::from_utf8(&x.value) {
            Ok(s) if !s.chars().any(char::is_control) => format!("\"{s}\""),
            _ => format!("0x{}", hex(&x.value)),
        };
        outln!(" Xattr: {} ({} bytes) = {v}", x.name_lossy(), x.value.len());
    }
    Ok(())
}

/// Run `ext4kit stat`.
pub fn run(args: &StatArgs) -> anyhow::Result<i32> {
    let mut failed = false;
    for arg in &args.targets {
        let t = parse_target(arg);
        let res = (|| -> anyhow::Result<()> {
            let dev = open_image(&t)?;
            let vol = open_volume(&t, dev.as_ref())?;
            one(&vol.fs(), &t.spec, &t.path, args.dereference, args.json)
        })();
        if let Err(e) = res {
            eprintln!("ext4kit: {}", crate::errmsg::one_line(&e));
            failed = true;
        }
    }
    Ok(i32::from(failed))
}
