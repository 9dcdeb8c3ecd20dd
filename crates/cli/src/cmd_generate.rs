//! `ext4kit generate man|completions DIR` (hidden): man pages and shell
//! completions generated from the clap definition itself, so they cannot
//! drift from the options the binary accepts. For packagers and
//! `make install`-style steps; see the README's install section.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::CommandFactory;
use clap::builder::PossibleValue;
use clap_complete::{Generator, Shell};

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

/// What `generate` writes. The help of each value is made from the same
/// lists the writers use ([`man_page_list`], [`SHELLS`]), so `--help`
/// names exactly the files written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    Man,
    Completions,
}

impl clap::ValueEnum for What {
    fn value_variants<'a>() -> &'a [Self] {
        &[What::Man, What::Completions]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            What::Man => {
                // The definition of the binary itself (not built here: a
                // build checks these values again).
                let pages = man_page_list(&crate::Cli::command());
                let names: Vec<&str> = pages.iter().map(|(_, f)| f.as_str()).collect();
                PossibleValue::new("man").help(format!(
                    "{} man pages: {}",
                    names.len(),
                    names.join(", ")
                ))
            }
            What::Completions => {
                let names: Vec<String> = SHELLS
                    .iter()
                    .map(|&(sh, what)| format!("{} ({what})", sh.file_name("ext4kit")))
                    .collect();
                PossibleValue::new("completions").help(names.join(", "))
            }
        })
    }
}

/// The shells completions are written for, with the help's word for each.
const SHELLS: [(Shell, &str); 3] = [
    (Shell::Bash, "bash"),
    (Shell::Zsh, "zsh"),
    (Shell::Fish, "fish"),
];

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

/// The man pages of `cmd` (not built): one per visible subcommand,
/// `ext4kit-SUB.1`, then `ext4kit.1`, each with its subcommand's name
/// (`None`: the top level). What `generate man` writes and its help lists.
fn man_page_list(cmd: &clap::Command) -> Vec<(Option<String>, String)> {
    let top = cmd.get_name();
    let mut out: Vec<(Option<String>, String)> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| {
            (
                Some(s.get_name().to_string()),
                format!("{top}-{}.1", s.get_name()),
            )
        })
        .collect();
    out.push((None, format!("{top}.1")));
    out
}

/// Write the pages of [`man_page_list`] into `dir`, under the names it
/// gives (the command is built first, so each page shows its full name,
/// synopsis and the --help/--version flags).
fn man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let pages = man_page_list(&cmd);
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let source = format!("ext4kit {}", cmd.get_version().unwrap_or_default());
    let mut out = Vec::new();
    for (sub, file) in pages {
        let c = match &sub {
            Some(name) => cmd
                .find_subcommand(name)
                .cloned()
                .ok_or_else(|| std::io::Error::other(format!("no subcommand {name} for {file}")))?,
            None => cmd.clone(),
        };
        let mut text = Vec::new();
        clap_mangen::Man::new(c)
            .source(source.clone())
            .manual("ext4kit")
            .render(&mut text)?;
        let path = dir.join(&file);
        std::fs::write(&path, text)?;
        out.push(path);
    }
    Ok(out)
}

/// Completions for [`SHELLS`], without hidden subcommands.
fn completions(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut cmd = public(cmd);
    SHELLS
        .iter()
        .map(|&(sh, _)| clap_complete::generate_to(sh, &mut cmd, "ext4kit", dir))
        .collect()
}
