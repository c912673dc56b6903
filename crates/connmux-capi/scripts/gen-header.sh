#!/bin/sh
# Regenerate include/connmux.h from src/ with cbindgen (a dev-dependency: no
# cbindgen binary is needed), then commit it.
set -eu
cd "$(dirname "$0")/.."
CONNMUX_BLESS_HEADER=1 cargo test -p connmux-capi --test header --quiet
echo "wrote $(pwd)/include/connmux.h"
