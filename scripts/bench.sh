#!/usr/bin/env bash
# The benchmarks: `connmux bench MODE` (rpc, uneven, scale, size, instructions,
# all; default all). Each prints a table of medians over interleaved rounds,
# with ratios to baselines measured in the same run. Not run by CI.
#   scripts/bench.sh rpc --rounds 5
#   scripts/bench.sh instructions --annotate 20
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p connmux-cli
[ $# -eq 0 ] && set -- all
exec "$target/release/connmux" bench "$@"
