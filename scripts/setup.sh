#!/usr/bin/env bash
# Installs what the build and the tests need on a fresh Debian machine (run as
# root; does nothing for what is already there).
set -euo pipefail

need=()
command -v clang >/dev/null || need+=(clang)
command -v llvm-objdump >/dev/null || need+=(llvm)
command -v rpcinfo >/dev/null || need+=(rpcbind)
command -v gcc >/dev/null || need+=(gcc)
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing ${need[*]}; run as root or install them" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo (Rust stable) is required" >&2; exit 1; }
