#!/usr/bin/env bash
# The main job: the ONC RPC server driven by rpctest on loopback, beside a
# thread-per-connection baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p connmux-cli
exec target/release/connmux demo "$@"
