#!/usr/bin/env bash
# The long mutation campaign over the read-write tools and the mount
# (crates/cli/tests/fuzz_rw.rs): N mutated images from six seed recipes,
# every rw subcommand on each and, as root with /dev/fuse, a mount with a
# small workload. Prints the counts (panic / signal / hang / refused / ok /
# new damage, per tool) and saves reproducers of every finding to OUT.
#   usage: scripts/fuzz-rw.sh [IMAGES [SEED [OUT [JOBS]]]]
# Defaults: 1000 images, seed 0x5eed20240024, OUT=fuzz-rw-out, 1 job.
# Runs niced (the release build too); exit status 0 when nothing was found.
set -euo pipefail
cd "$(dirname "$0")/.."
images=${1:-1000}
seed=${2:-0x5eed20240024}
out=${3:-fuzz-rw-out}
jobs=${4:-1}
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "fuzz-rw: $images images, seed $seed, jobs $jobs, reproducers in $out"
EXT4KIT_FUZZ_RW_IMAGES=$images EXT4KIT_FUZZ_RW_SEED=$seed \
EXT4KIT_FUZZ_RW_OUT=$out EXT4KIT_FUZZ_RW_JOBS=$jobs \
  nice -n 10 cargo test --release -p ext4kit-cli --test fuzz_rw -- --nocapture 2>&1 |
  tee "$out/log" | grep --line-buffered -E '^(fuzz_rw|FINDING|SKIP|test result)'
