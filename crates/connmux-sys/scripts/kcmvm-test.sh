#!/usr/bin/env bash
# Runs connmux-sys's unit tests inside the kcmvm harness (scripts/kcmvm.sh: Debian's kernel, which has
# AF_KCM), where the kcm tests check our wrappers and tcp_check_attachable against the
# real kernel instead of asserting EAFNOSUPPORT. Extra arguments go to the test binary
# (default: the kcm tests, verbose).
#   crates/connmux-sys/scripts/kcmvm-test.sh            # kcm:: tests
#   crates/connmux-sys/scripts/kcmvm-test.sh ''         # every test of the crate
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
# The VM harness: the project's own (scripts/kcmvm.sh), or KCMVM_RUN names another.
harness=${KCMVM_RUN:-$root/scripts/kcmvm.sh}
[ -x "$harness" ] || { echo "kcmvm-test: no kcmvm harness at $harness" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$root/target}/static
cd "$root"
# The guest has no libc: link the test binary statically.
bin=$(RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target" \
    cargo test -p connmux-sys --no-run --target x86_64-unknown-linux-gnu --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1) || bin=
[ -n "$bin" ] || { echo "build failed" >&2; exit 1; }
if [ $# -eq 0 ]; then set -- kcm:: --nocapture --test-threads=1; fi
exec "$harness" -t 200 "$bin" "$@"
