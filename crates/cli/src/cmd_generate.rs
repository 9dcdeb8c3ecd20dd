//! `ext4kit generate man|completions DIR` (hidden): man pages and shell
//! completions generated from the clap definition itself, so they cannot
//! drift from the options the binary accepts. For packagers and
//! `make install`-style steps; see the README's install section.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap_complete::Shell;

/// Write man pages or shell completions into a directory.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// What to write.
    #[arg(value_enum)]
    pub what: What,

    /// Directory to write into (created if missing).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// ext4kit.1, ext4kit-mkfs.1, ext4kit-lazyinit.1, ext4kit-info.1.
    Man,
    /// ext4kit.bash, _ext4kit (zsh), ext4kit.fish.
    Completions,
}

/// Run `ext4kit generate`; returns the exit code.
pub fn run(args: &GenerateArgs, cmd: clap::Command) -> anyhow::Result<i32> {
    let dir = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = match args.what {
        What::Man => man_pages(cmd, dir),
        What::Completions => completions(cmd, dir),
    }
    .with_context(|| format!("writing into {}", dir.display()))?;
    for f in files {
        outln!("{}", f.display());
    }
    Ok(0)
}

/// `cmd` without its hidden subcommands (clap_complete lists them, and
/// clap has no way to remove a subcommand, so the top level is rebuilt;
/// it has no arguments of its own besides --help and --version).
fn public(cmd: clap::Command) -> clap::Command {
    let mut out = clap::Command::new("ext4kit")
        .version(env!("EXT4KIT_VERSION"))
        .subcommand_required(cmd.is_subcommand_required_set())
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        out = out.long_about(a.clone());
    }
    out
}

/// One page per visible command: `ext4kit` and `ext4kit-SUB` for each
/// subcommand (clap names them so once the command is built).
fn man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let source = format!("ext4kit {}", cmd.get_version().unwrap_or_default());
    let mut out = Vec::new();
    let page = |c: clap::Command| {
        clap_mangen::Man::new(c)
            .source(source.clone())
            .manual("ext4kit")
            .generate_to(dir)
    };
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out.push(page(sub.clone())?);
    }
    out.push(page(cmd.clone())?);
    Ok(out)
}

/// Completions for bash, zsh and fish, without hidden subcommands.
fn completions(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut cmd = public(cmd);
    [Shell::Bash, Shell::Zsh, Shell::Fish]
        .into_iter()
        .map(|sh| clap_complete::generate_to(sh, &mut cmd, "ext4kit", dir))
        .collect()
}
