//! The `ext4kit` command: mkfs, lazyinit and info for ext4 images and
//! block devices.

use clap::{CommandFactory, Parser, Subcommand};

#[macro_use]
mod out;

mod cmd_generate;
mod cmd_info;
mod cmd_journal;
mod cmd_lazyinit;
mod cmd_mkfs;
mod errmsg;

#[derive(Parser, Debug)]
#[command(
    name = "ext4kit",
    // The package version and the git commit (build.rs).
    version = env!("EXT4KIT_VERSION"),
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
#[allow(clippy::large_enum_variant)]
enum Cmd {
    /// Create an ext4 filesystem (mke2fs options).
    Mkfs(cmd_mkfs::MkfsArgs),
    /// Zero the inode tables left for lazy init (offline ext4lazyinit).
    Lazyinit(cmd_lazyinit::LazyinitArgs),
    /// Show an ext4 filesystem's state, counts, times, geometry and lazy-init progress.
    Info(cmd_info::InfoArgs),
    /// Dump or replay the jbd2 journal (offline, like logdump and e2fsck -E journal_only).
    Journal(cmd_journal::JournalArgs),
    /// Write man pages or shell completions (for packaging).
    #[command(hide = true)]
    Generate(cmd_generate::GenerateArgs),
}

fn main() {
    // Diagnostics on stderr, off unless RUST_LOG asks (e.g. RUST_LOG=debug).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let res = match &cli.cmd {
        Cmd::Mkfs(a) => cmd_mkfs::run(a),
        Cmd::Lazyinit(a) => cmd_lazyinit::run(a),
        Cmd::Info(a) => cmd_info::run(a),
        Cmd::Journal(a) => cmd_journal::run(a),
        Cmd::Generate(a) => cmd_generate::run(a, Cli::command()),
    };
    let code = match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ext4kit: {}", errmsg::one_line(&e));
            1
        }
    };
    // A report nobody could read: quiet 141 on a broken pipe, one line
    // for other output errors; the work itself was finished either way.
    match out::status() {
        Some((out_code, msg)) if code == 0 => {
            if let Some(m) = msg {
                eprintln!("ext4kit: {m}");
            }
            std::process::exit(out_code)
        }
        _ => std::process::exit(code),
    }
}
