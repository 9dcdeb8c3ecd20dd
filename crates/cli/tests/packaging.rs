//! What an installed ext4kit ships: man pages and shell completions
//! generated from the clap definition (`ext4kit generate`), `--version`
//! with the git commit (and a clean fallback outside a git checkout),
//! license files matching the declared license, `--help`'s first line,
//! and the release binary's size.

mod common;

#[path = "../build/version.rs"]
mod version;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `ext4kit generate WHAT DIR`: the files it lists, one per line.
fn generate(what: &str, dir: &Path) -> Vec<PathBuf> {
    let out = run_ok(ext4kit().args(["generate", what]).arg(dir)).unwrap();
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

fn names(files: &[PathBuf]) -> Vec<String> {
    let mut n: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn man_pages_generate_and_render() {
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let files = generate("man", &man);
    assert_eq!(
        names(&files),
        [
            "ext4kit-cat.1",
            "ext4kit-chmod.1",
            "ext4kit-chown.1",
            "ext4kit-cp.1",
            "ext4kit-fallocate.1",
            "ext4kit-fstrim.1",
            "ext4kit-info.1",
            "ext4kit-journal.1",
            "ext4kit-lazyinit.1",
            "ext4kit-ln.1",
            "ext4kit-ls.1",
            "ext4kit-mkdir.1",
            "ext4kit-mkfs.1",
            "ext4kit-mount.1",
            "ext4kit-mv.1",
            "ext4kit-rm.1",
            "ext4kit-stat.1",
            "ext4kit-status.1",
            "ext4kit-sync.1",
            "ext4kit-truncate.1",
            "ext4kit.1"
        ]
    );
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            text.contains(&format!(".TH {name} 1")),
            "{}: {text}",
            f.display()
        );
        assert!(
            text.contains(".SH NAME") && text.contains(".SH SYNOPSIS"),
            "{text}"
        );
        assert!(
            !text.contains("generate"),
            "hidden subcommand in {}",
            f.display()
        );
    }
    let mkfs = std::fs::read_to_string(man.join("ext4kit-mkfs.1")).unwrap();
    for opt in ["\\-L", "\\-O", "\\-E", "\\-\\-json"] {
        assert!(mkfs.contains(opt), "ext4kit-mkfs.1 lacks {opt}");
    }
    let journal = std::fs::read_to_string(man.join("ext4kit-journal.1")).unwrap();
    assert!(
        journal.contains("dump") && journal.contains("replay"),
        "ext4kit-journal.1 lacks its subcommands"
    );
    let top = std::fs::read_to_string(man.join("ext4kit.1")).unwrap();
    assert!(top.contains("ext4kit\\-mkfs(1)") && top.contains("ext4kit\\-info(1)"));

    if !have("man") {
        skip(
            "man_pages_generate_and_render (man -l)",
            "man not installed",
        );
        return;
    }
    for f in &files {
        let out = run_ok(
            tool("man")
                .args(["-P", "cat", "--warnings", "-l"])
                .arg(f)
                .env("MANWIDTH", "80"),
        )
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(err.trim().is_empty(), "man -l {}: {err}", f.display());
        assert!(
            shown.contains("NAME") && shown.contains("SYNOPSIS"),
            "{shown}"
        );
    }
}

#[test]
fn completions_generate_and_parse() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate("completions", dir.path());
    assert_eq!(names(&files), ["_ext4kit", "ext4kit.bash", "ext4kit.fish"]);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(text.contains("lazyinit"), "{}", f.display());
        assert!(
            !text.contains("generate"),
            "hidden subcommand in {}",
            f.display()
        );
    }
    let bash = dir.path().join("ext4kit.bash");
    run_ok(Command::new("bash").arg("-n").arg(&bash)).unwrap();
    // Load it and ask for the first word's completions, as bash would.
    let script = format!(
        "source '{}'; COMP_WORDS=(ext4kit ''); COMP_CWORD=1; _ext4kit ext4kit '' ext4kit; \
         echo \"${{COMPREPLY[@]}}\"; COMP_WORDS=(ext4kit info --); COMP_CWORD=2; \
         _ext4kit ext4kit -- info; echo \"${{COMPREPLY[@]}}\"",
        bash.display()
    );
    let out = run_ok(Command::new("bash").arg("-c").arg(script)).unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    let mut lines = got.lines();
    let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    for w in ["mkfs", "lazyinit", "info", "--version"] {
        assert!(first.contains(&w), "bash completion lacks {w}: {got}");
    }
    assert!(lines.next().unwrap_or("").contains("--json"), "{got}");

    for (shell, file) in [("zsh", "_ext4kit"), ("fish", "ext4kit.fish")] {
        if have(shell) {
            run_ok(tool(shell).arg("-n").arg(dir.path().join(file))).unwrap();
        } else {
            skip(
                &format!("completions_generate_and_parse ({shell} -n)"),
                &format!("{shell} not installed"),
            );
        }
    }
}

#[test]
fn generate_into_a_file_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = run(ext4kit().args(["generate", "man"]).arg(&file)).unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn version_shows_the_commit() {
    let out = run_ok(ext4kit().arg("--version")).unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let pkg = env!("CARGO_PKG_VERSION");
    // Outside a git checkout: the fallback is the bare version.
    let plain = tempfile::tempdir().unwrap();
    assert_eq!(version::git_commit(plain.path()), None);
    assert!(version::watch_paths(plain.path()).is_empty());
    assert_eq!(version::version_string(pkg, None), pkg);
    if let Ok(c) = std::env::var("EXT4KIT_GIT_COMMIT")
        && !c.trim().is_empty()
    {
        assert_eq!(shown, format!("ext4kit {pkg} (commit {})", c.trim()));
        return;
    }
    match version::git_commit(Path::new(env!("CARGO_MANIFEST_DIR"))) {
        Some(c) => {
            assert_eq!(c.len(), 12);
            assert_eq!(shown, format!("ext4kit {pkg} (commit {c})"));
            assert!(!version::watch_paths(Path::new(env!("CARGO_MANIFEST_DIR"))).is_empty());
        }
        None => {
            skip("version_shows_the_commit", "not built from a git checkout");
            assert_eq!(shown, format!("ext4kit {pkg}"));
        }
    }
}

#[test]
fn license_files_match_the_declared_license() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT OR Apache-2.0\""));
    assert!(
        !manifest.contains("example.invalid"),
        "placeholder repository URL"
    );
    let mit = std::fs::read_to_string(root.join("LICENSE-MIT")).unwrap();
    assert!(mit.starts_with("MIT License") && mit.contains("Permission is hereby granted"));
    let apache = std::fs::read_to_string(root.join("LICENSE-APACHE")).unwrap();
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
}

/// Issue 20, defect 3: `generate --help` names exactly the files that
/// `generate man` and `generate completions` write (on main it listed
/// four man pages of twenty).
#[test]
fn generate_help_lists_the_files_written() {
    let out = run_ok(ext4kit().args(["generate", "--help"])).unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    // The names in the help: words ending in .1, and the completion files.
    let words: Vec<String> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .map(|w| w.trim_end_matches('.').to_string())
        .filter(|w| !w.is_empty())
        .collect();
    let mut listed_man: Vec<String> = words
        .iter()
        .filter(|w| w.ends_with(".1"))
        .cloned()
        .collect();
    listed_man.sort();
    listed_man.dedup();
    let dir = tempfile::tempdir().unwrap();
    let man = names(&generate("man", &dir.path().join("man")));
    assert_eq!(listed_man, man, "man pages in --help vs written:\n{help}");
    for f in names(&generate("completions", &dir.path().join("c"))) {
        assert!(
            words.contains(&f),
            "completion file {f} not in --help:\n{help}"
        );
    }
}

/// Without a command, the one-line error names every command there is
/// (it listed 7 of 19), the hidden `generate` left out.
#[test]
fn missing_command_lists_every_command() {
    let out = run(&mut ext4kit()).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    let dir = tempfile::tempdir().unwrap();
    for page in names(&generate("man", dir.path())) {
        let Some(cmd) = page
            .strip_prefix("ext4kit-")
            .and_then(|p| p.strip_suffix(".1"))
        else {
            continue;
        };
        assert!(
            err.split([' ', ',']).any(|w| w == cmd),
            "{cmd} missing from: {err}"
        );
    }
    assert!(!err.contains("generate"), "{err}");
}

/// `ext4kit --help` (and `-h`) opens with a line describing the whole
/// tool, not only mkfs and lazy init.
#[test]
fn help_first_line_describes_the_whole_tool() {
    for flag in ["--help", "-h"] {
        let out = run_ok(ext4kit().arg(flag)).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or_default();
        for w in ["mkfs", "lazy init", "image tools", "FUSE mount"] {
            assert!(first.contains(w), "{flag}: first line lacks {w:?}: {first}");
        }
    }
}

/// Largest release binary accepted: without debug info it is 6.9 MB
/// (it was 42 MB with `debug = 1`).
const RELEASE_MAX_BYTES: u64 = 12 << 20;

/// The release binary (`scripts/test.sh` builds it before the tests)
/// carries no debug info, so it stays under [`RELEASE_MAX_BYTES`].
/// Skipped when there is no release build.
#[test]
fn release_binary_stays_small() {
    let what = "release_binary_stays_small";
    // target/<profile>/ext4kit of these tests -> target/release/ext4kit.
    let Some(target) = Path::new(ext4kit_path()).parent().and_then(Path::parent) else {
        return skip(what, "no target directory");
    };
    let bin = target.join("release/ext4kit");
    let Ok(md) = std::fs::metadata(&bin) else {
        return skip(
            what,
            "no release build (cargo build --release -p ext4kit-cli)",
        );
    };
    assert!(
        md.len() <= RELEASE_MAX_BYTES,
        "{}: {} bytes, more than {RELEASE_MAX_BYTES} (debug info in the release profile? \
         an old build? cargo build --release -p ext4kit-cli)",
        bin.display(),
        md.len()
    );
}
