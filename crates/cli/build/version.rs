//! The git commit ext4kit was built from, for `--version`. Shared by
//! `build.rs` and the packaging test (`#[path]`-included by both), so the
//! fallback outside a git checkout is tested, not only hoped for.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `git` in `dir`, with the repository found from `dir` alone (no
/// `GIT_DIR`/`GIT_WORK_TREE` from the environment); stdout on success.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The abbreviated commit of `dir`'s checkout; `None` when `dir` is not in
/// a git checkout, git is missing, or the repository has no commit yet
/// (a source tarball, `cargo install` from a registry, an exported tree).
pub fn git_commit(dir: &Path) -> Option<String> {
    let c = git(
        dir,
        &["rev-parse", "--short=12", "--verify", "-q", "HEAD^{commit}"],
    )?;
    c.bytes().all(|b| b.is_ascii_hexdigit()).then_some(c)
}

/// Files whose change means HEAD moved: HEAD itself (the worktree's own),
/// the branch it points to (or its directory while the branch is only in
/// packed-refs), and packed-refs. Only existing ones.
pub fn watch_paths(dir: &Path) -> Vec<PathBuf> {
    let path = |args: &[&str]| git(dir, args).map(|p| dir.join(p));
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(head) = path(&["rev-parse", "--git-path", "HEAD"]) {
        out.push(head);
    }
    if let Some(r) = git(dir, &["rev-parse", "--symbolic-full-name", "HEAD"])
        && r.starts_with("refs/")
        && let Some(p) = path(&["rev-parse", "--git-path", &r])
    {
        if p.is_file() {
            out.push(p);
        } else if let Some(parent) = p.parent() {
            // Packed for now: the loose file appears there on the next commit.
            out.push(parent.to_path_buf());
        }
    }
    if let Some(packed) = path(&["rev-parse", "--git-path", "packed-refs"]) {
        out.push(packed);
    }
    out.retain(|p| p.exists());
    out.dedup();
    out
}

/// The `--version` text: the package version, plus the commit when known.
pub fn version_string(pkg_version: &str, commit: Option<&str>) -> String {
    match commit {
        Some(c) => format!("{pkg_version} (commit {c})"),
        None => pkg_version.to_string(),
    }
}
