#!/usr/bin/env bash
# AddressSanitizer run of the crate that holds all the unsafe code
# (connmux-sys) and of the runtime built on it (connmux: loopback, service,
# torture, TLS and hostile-peer tests), optimized, with debug
# assertions and overflow checks on (below). Needs the nightly toolchain
# (rustup toolchain install nightly); the standard library is not rebuilt
# with ASAN (no -Zbuild-std), so what is checked is connmux's own code and
# what it hands to libc and the kernel. Separate target dir: sanitized and
# plain builds must not mix.
#
#   bash scripts/asan.sh            # both crates
#   bash scripts/asan.sh -p connmux-sys
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "asan.sh: no nightly toolchain (rustup toolchain install nightly); skipped" >&2
    exit 0
fi
# connmux_asan: tests of glibc-only behaviour skip under ASan's allocator.
# debug-assertions=on: the release build below would leave them out (and
# the overflow checks that follow them); no other run of the tests has them.
export RUSTFLAGS="-Zsanitizer=address --cfg connmux_asan -C debug-assertions=on"
export RUSTDOCFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/asan}"
pkgs=("$@")
if [ ${#pkgs[@]} -eq 0 ]; then
    pkgs=(-p connmux-sys -p connmux)
fi
# --lib --tests: doctests do not take the sanitizer flags reliably.
# --release: the runtime's tests are bound in time (the torture test's
# receivers have a deadline; a handler that runs slow makes its connection
# heavy, which the lane tests do not expect), and a sanitized
# debug build runs them too slowly for that. ASan checks optimized code
# as well.
cargo +nightly test --release --no-fail-fast --target x86_64-unknown-linux-gnu "${pkgs[@]}" --lib --tests -- --test-threads=2
