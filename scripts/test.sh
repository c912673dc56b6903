#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, one release build, the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CARGO_TERM_COLOR=never
# ---- formatting and lints: an unformatted file or a clippy warning fails CI ----
cargo fmt --all --check
(cd fuzz && cargo fmt --check)
cargo clippy --release --workspace --all-targets -- -D warnings
# One build profile for everything: the loopback and load tests need release speed.
cargo build --release --workspace --all-targets
# On a kernel with io_uring (6.0 or later, not disabled by sysctl) the
# io_uring tests must run: a ring that cannot be set up fails them instead
# of skipping them (crates/connmux/tests/common/mod.rs, `available`).
if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = 0 ] \
    && printf '%s\n' 6.0 "$(uname -r | cut -d- -f1)" | sort -V -C; then
    export CONNMUX_TEST_REQUIRE_URING=1
    echo "test.sh: io_uring tests required (kernel $(uname -r))" >&2
else
    echo "test.sh: io_uring not available on this kernel: its tests are skipped (each says SKIPPED)" >&2
fi
cargo test --release --workspace -- --test-threads=2

# ---- AddressSanitizer, when nightly is installed ----
# A sanitized release build with debug assertions on, over the unsafe code
# (connmux-sys) and every test of the runtime built on it (connmux:
# loopback, service, torture, TLS, hostile peers). About 2 minutes.
# Skipped without nightly.
bash scripts/asan.sh

# ---- KCM conformance (connmux-conformance): the §7 acceptance cases against the
# userspace runtime here and against the kernel's AF_KCM in the kcmvm VM (one
# boot, Debian 6.1 under qemu), plus the side-by-side benchmark; fails on any
# FAIL. About 1-3 minutes (static build, emulated VM).
bash scripts/conformance.sh

# ---- fuzzing: every target in fuzz/ for a short run (FUZZ_SECONDS each, default 20) ----
bash scripts/fuzz.sh
