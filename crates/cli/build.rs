//! Build script: put the git commit into `--version` (see build/version.rs).
//!
//! `EXT4KIT_GIT_COMMIT` overrides the lookup (packagers building from a
//! tarball); without either, the version is just the package version.

#[path = "build/version.rs"]
mod version;

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/version.rs");
    println!("cargo:rerun-if-env-changed=EXT4KIT_GIT_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match std::env::var("EXT4KIT_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => Some(c.trim().to_string()),
        _ => {
            for p in version::watch_paths(&dir) {
                println!("cargo:rerun-if-changed={}", p.display());
            }
            version::git_commit(&dir)
        }
    };
    let pkg = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo:rustc-env=EXT4KIT_VERSION={}",
        version::version_string(&pkg, commit.as_deref())
    );
}
