//! The `ext4kit` command: mkfs, lazyinit and info for ext4 images and
//! block devices.

use clap::{Parser, Subcommand};

mod cmd_mkfs;

#[derive(Parser, Debug)]
#[command(
    name = "ext4kit",
    version,
    about = "ext4 formatting and deferred initialization, in userspace",
    long_about = "ext4kit makes ext4 filesystems byte-for-byte like mke2fs 1.47, skips \
                  writing zeros where the storage already reads zero, and finishes \
                  lazily-initialized inode tables offline."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create an ext4 filesystem (mke2fs options).
    Mkfs(cmd_mkfs::MkfsArgs),
}

fn main() {
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::Mkfs(a) => cmd_mkfs::run(a),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let msg = format!("{e:#}");
            eprintln!("ext4kit: {}", msg.replace('\n', " "));
            std::process::exit(1);
        }
    }
}
