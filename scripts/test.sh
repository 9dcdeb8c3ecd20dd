#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit, property and integration
# tests (real e2fsprogs; kernel mounts when run as root with loop devices).
# Ends with one summary line over every test binary: "tests: N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
cargo build --release -p ext4kit-cli
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# --no-fail-fast runs every test binary (one failing binary must not hide
# the others); --show-output prints what passing tests said, e.g. why a root-only test
# skipped.
cargo test --workspace --no-fail-fast -- --show-output 2>&1 | tee "$log" || status=$?
passed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^passed;?$/) s += $(i - 1)} END {print s + 0}' "$log")
failed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^failed;?$/) s += $(i - 1)} END {print s + 0}' "$log")
skipped=$(grep -c '^SKIP' "$log" || true)
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit "$status"
