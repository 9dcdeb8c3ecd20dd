#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property and integration
# tests (real e2fsprogs; kernel mounts when run as root with loop devices).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo build --release -p ext4kit-cli
cargo test --workspace 2>&1
