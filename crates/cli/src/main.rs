//! The `ext4kit` command: mkfs, lazy init, image tools (info, journal,
//! ls, cat, stat, cp, mkdir, rm, ...) and a FUSE mount for ext4 images and
//! block devices.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use cmd_mkfs::Personality;

#[macro_use]
mod out;

mod cmd_attr;
mod cmd_cat;
mod cmd_cp;
mod cmd_fstrim;
mod cmd_generate;
mod cmd_info;
mod cmd_journal;
mod cmd_lazyinit;
mod cmd_ls;
mod cmd_mkfs;
mod cmd_mount;
mod cmd_ns;
mod cmd_stat;
mod cmd_status;
mod cmd_sync;
mod direct;
mod errmsg;
mod extjournal;
mod jdev;
mod probe;
mod undo;
mod walk;

#[derive(Parser, Debug)]
#[command(
    name = "ext4kit",
    // The package version and the git commit (build.rs).
    version = env!("EXT4KIT_VERSION"),
    about = "ext4 in userspace: mkfs, lazy init, image tools and a journaled FUSE mount",
    long_about = "ext4 in userspace: mkfs, lazy init, image tools and a journaled FUSE mount.\n\n\
                  ext4kit makes ext4 filesystems byte-for-byte like mke2fs 1.47 (skipping \
                  zeros where the storage already reads zero), finishes lazily-initialized \
                  inode tables offline, reads and changes unmounted images (ls, cat, stat, \
                  cp, mkdir, rm, mv, ln, chmod, chown, truncate, fallocate, fstrim, info, \
                  journal), and mounts them read-write through FUSE with the kernel's \
                  journaling (mount, status, sync).\n\n\
                  Encrypted files and directories are handled without keys, as the kernel \
                  does without the key: listed and removed by their no-key names, stat, \
                  chmod, chown and xattrs allowed; contents, new names and renames in \
                  encrypted directories refused (Required key not available). fs-verity \
                  files read up to their size; writes and size changes are refused (EPERM)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The external journal device of the filesystem (`mkfs -O
    /// journal_dev`, attached with `-J device=`): the kernel's
    /// journal_path= mount option, e2fsck's -j. Checked to be the
    /// filesystem's journal before anything is written.
    #[arg(long, global = true, value_name = "PATH")]
    journal_path: Option<std::path::PathBuf>,
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
    /// List a directory of an image (IMG:PATH; read-only).
    Ls(cmd_ls::LsArgs),
    /// Write files of an image to standard output (IMG:PATH...; read-only).
    Cat(cmd_cat::CatArgs),
    /// Show an inode of an image: coreutils stat fields, flags, xattrs (read-only).
    Stat(cmd_stat::StatArgs),
    /// Copy files between an image (IMG:PATH) and the host.
    Cp(cmd_cp::CpArgs),
    /// Make directories in an image (IMG:PATH...).
    Mkdir(cmd_ns::MkdirArgs),
    /// Remove files or directories from an image (IMG:PATH...).
    Rm(cmd_ns::RmArgs),
    /// Move or rename files inside an image.
    Mv(cmd_ns::MvArgs),
    /// Make hard or symbolic links inside an image.
    Ln(cmd_ns::LnArgs),
    /// Change permission bits of files in an image (IMG:PATH...).
    Chmod(cmd_attr::ChmodArgs),
    /// Change the owner and group of files in an image (numeric ids).
    Chown(cmd_attr::ChownArgs),
    /// Shrink or extend files in an image to a size (truncate -s).
    Truncate(cmd_attr::TruncateArgs),
    /// Preallocate, punch or zero file space in an image (util-linux fallocate).
    Fallocate(cmd_attr::FallocateArgs),
    /// Discard the free space of an image, a device or a mounted filesystem (util-linux fstrim).
    Fstrim(cmd_fstrim::FstrimArgs),
    /// Show what an `ext4kit mount` does in the background (online lazy init, discard and its reconciler).
    Status(cmd_status::StatusArgs),
    /// Commit an `ext4kit mount` and return when everything written before is durable.
    Sync(cmd_sync::SyncArgs),
    /// Mount an ext4 image or device with FUSE (journaled read-write, or -o ro).
    #[command(long_about = cmd_mount::LONG_ABOUT)]
    Mount(cmd_mount::MountArgs),
    /// Write man pages or shell completions (for packaging).
    #[command(hide = true)]
    Generate(cmd_generate::GenerateArgs),
}

/// ext4kit installed as `mke2fs` or `mkfs.<type>`: the mkfs options,
/// without the `mkfs` word.
#[derive(Parser, Debug)]
#[command(
    disable_version_flag = true,
    about = "Create an ext2/ext3/ext4 filesystem (ext4kit, mke2fs-compatible options)"
)]
struct MkfsCli {
    #[command(flatten)]
    args: cmd_mkfs::MkfsArgs,
}

/// A command-line error as one line on stderr ("ext4kit mkfs: unexpected
/// argument '--bogus' (see --help)"), or clap's own output for --help and
/// --version. Returns the exit status.
fn usage_error(prog: &str, e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            // Every visible command, from the definition itself.
            let cmd = Cli::command();
            let names: Vec<&str> = cmd
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .map(|c| c.get_name())
                .collect();
            let list = match names.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
                _ => names.join(""),
            };
            eprintln!("{prog}: missing command: {list} (see --help)");
            return 2;
        }
        _ => {}
    }
    // clap's first paragraph is the message (it may list arguments on the
    // following lines); tips and usage come after a blank line.
    let text = e.render().to_string();
    let para: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let msg = para.join(" ");
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
    let msg = if msg.is_empty() {
        "invalid command line"
    } else {
        msg
    };
    eprintln!("{prog}: {msg} (see --help)");
    2
}

fn main() {
    // Diagnostics on stderr, off unless RUST_LOG asks (e.g. RUST_LOG=debug).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let program = argv
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let personality = Personality::from_program_name(&program);
    let prefix = if personality.is_some() {
        program.clone()
    } else {
        "ext4kit".to_string()
    };
    let res = if let Some(who) = personality {
        // Installed as mke2fs / mkfs.extN.
        let mut argv = argv;
        if let Some(first) = argv.first_mut() {
            *first = program.clone().into();
        }
        let parsed = MkfsCli::command()
            .try_get_matches_from(argv)
            .and_then(|m| MkfsCli::from_arg_matches(&m).map(|cli| (cli, m)));
        match parsed {
            Ok((mut cli, m)) => {
                cli.args.order_extended(&m);
                cmd_mkfs::run(&cli.args, &who)
            }
            // mke2fs's usage() exits 1.
            Err(e) => std::process::exit(usage_error(&program, &e).min(1)),
        }
    } else {
        let parsed = Cli::command()
            .try_get_matches_from(&argv)
            .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
        let cli = match parsed {
            Ok((mut cli, m)) => {
                if let (Cmd::Mkfs(a), Some(sub)) = (&mut cli.cmd, m.subcommand_matches("mkfs")) {
                    a.order_extended(sub);
                }
                cli
            }
            Err(e) => {
                // Name the subcommand the error is about, when there is one.
                let sub = argv
                    .get(1)
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| {
                        [
                            "mkfs",
                            "lazyinit",
                            "info",
                            "journal",
                            "ls",
                            "cat",
                            "stat",
                            "chmod",
                            "chown",
                            "truncate",
                            "fallocate",
                            "fstrim",
                            "status",
                            "sync",
                            "mount",
                        ]
                        .contains(&s.as_str())
                    });
                let prog = match sub {
                    Some(s) => format!("ext4kit {s}"),
                    None => "ext4kit".to_string(),
                };
                std::process::exit(usage_error(&prog, &e));
            }
        };
        extjournal::set(cli.journal_path.clone());
        match &cli.cmd {
            Cmd::Mkfs(_) if cli.journal_path.is_some() => {
                eprintln!(
                    "ext4kit mkfs: --journal-path names the journal device of an existing filesystem; mkfs attaches one with -J device= (see --help)"
                );
                std::process::exit(1);
            }
            Cmd::Mkfs(a) => cmd_mkfs::run(a, &Personality::Ext4kit),
            Cmd::Lazyinit(a) => cmd_lazyinit::run(a),
            Cmd::Info(a) => cmd_info::run(a),
            Cmd::Journal(a) => cmd_journal::run(a),
            Cmd::Ls(a) => cmd_ls::run(a),
            Cmd::Cat(a) => cmd_cat::run(a),
            Cmd::Stat(a) => cmd_stat::run(a),
            Cmd::Cp(a) => cmd_cp::run(a),
            Cmd::Mkdir(a) => cmd_ns::mkdir(a),
            Cmd::Rm(a) => cmd_ns::rm(a),
            Cmd::Mv(a) => cmd_ns::mv(a),
            Cmd::Ln(a) => cmd_ns::ln(a),
            Cmd::Chmod(a) => cmd_attr::chmod(a),
            Cmd::Chown(a) => cmd_attr::chown(a),
            Cmd::Truncate(a) => cmd_attr::truncate(a),
            Cmd::Fallocate(a) => cmd_attr::fallocate(a),
            Cmd::Fstrim(a) => cmd_fstrim::run(a),
            Cmd::Status(a) => cmd_status::run(a),
            Cmd::Sync(a) => cmd_sync::run(a),
            Cmd::Mount(a) => cmd_mount::run(a),
            Cmd::Generate(a) => cmd_generate::run(a, Cli::command()),
        }
    };
    let code = match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{prefix}: {}", errmsg::one_line(&e));
            1
        }
    };
    // A report nobody could read: quiet 141 on a broken pipe, one line
    // for other output errors; the work itself was finished either way.
    match out::status() {
        Some((out_code, msg)) if code == 0 => {
            if let Some(m) = msg {
                eprintln!("{prefix}: {m}");
            }
            std::process::exit(out_code)
        }
        _ => std::process::exit(code),
    }
}
