#!/usr/bin/env bash
# Build and run every fuzz target in fuzz/ for a short time; fails on any crash.
#
#   scripts/fuzz.sh [TARGET...]        (default: every target)
#
# FUZZ_SECONDS: seconds per target (default 20). Each target starts from its
# seed corpus (fuzz/corpus/<target>, read only) and the inputs that once
# crashed it (fuzz/regressions/<target>); what it learns goes to a scratch
# folder that is removed afterwards. A crash leaves its input in
# fuzz/artifacts/<target>/ and the command to replay it in the output.
# Needs a nightly toolchain and cargo-fuzz: both are installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-20}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(stream_split bpf_program oncrpc_wire ninep_wire mux_ops)
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || { echo "fuzz: a nightly toolchain (rustup) is required" >&2; exit 1; }
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

export CARGO_TERM_COLOR=never
summary=()
for t in "${targets[@]}"; do
    cargo +nightly fuzz build "$t"
    work=$(mktemp -d)
    dirs=("$work" "fuzz/corpus/$t")
    [ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")
    log="$work.log"
    set +e
    cargo +nightly fuzz run "$t" "${dirs[@]}" -- \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    rm -rf "$work"
    if [ $rc -ne 0 ]; then
        tail -n 60 "$log" >&2
        rm -f "$log"
        echo "fuzz: target $t failed (exit $rc); the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    rm -f "$log"
    summary+=("$(printf '%-14s %10s runs %8s exec/s in %ss' "$t" "${runs:-?}" "${rate:-?}" "$secs")")
done
printf 'fuzz: %s\n' "${summary[@]}"
