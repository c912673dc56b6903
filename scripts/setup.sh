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
command -v mkfs.ext4 >/dev/null || [ -x /usr/sbin/mkfs.ext4 ] || [ -x /sbin/mkfs.ext4 ] || need+=(e2fsprogs)
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
# rustfmt and clippy: CI checks formatting and lints.
for c in rustfmt clippy; do
    cargo "$([ $c = rustfmt ] && echo fmt || echo clippy)" --version >/dev/null 2>&1 \
        || rustup component add "$c" >/dev/null 2>&1 \
        || { echo "setup: the Rust component $c is required (rustup component add $c)" >&2; exit 1; }
done

# ---- TLS (crates/connmux-cli/tests/tls.rs): `openssl` for s_client and for a
# certificate made outside connmux; python3's ssl module is the other peer.
tls_need=()
command -v openssl >/dev/null || tls_need+=(openssl)
command -v python3 >/dev/null || tls_need+=(python3)
if [ ${#tls_need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing ${tls_need[*]}; run as root or install them" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${tls_need[@]}" >/dev/null
fi

# ---- 9P (crates/connmux-cli/tests/ninep.rs, `connmux bench 9p`): diod's
# clients (diodcat, diodls) read the 9p-server, and diod is the baseline server.
if ! command -v diodcat >/dev/null || ! command -v diod >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing diod; run as root or install it" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends diod >/dev/null
fi

# ---- NFS (crates/connmux-cli/tests/nfs.rs): libnfs's clients (nfs-ls,
# nfs-cat, nfs-cp) read and write the nfs-server.
if ! command -v nfs-cp >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing libnfs-utils; run as root or install it" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libnfs-utils >/dev/null
fi

# ---- gVisor's 9P client (crates/connmux-cli/tests/ninep_p9client.rs builds
# tests/p9client with Go): Go 1.20 or later (github.com/hugelgupf/p9 v0.3.0
# needs it). Debian 12's golang-go is 1.19, so when no Go of 1.20 or later is
# found (on the PATH or in /usr/local/go), the official release is unpacked
# into /usr/local/go. Its modules come from the Go module proxy at the first
# build and from the module cache after.
go_ok() {
    local v
    v=$("$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
    [ -n "$v" ] && set -- $v && { [ "$1" -gt 1 ] || [ "$2" -ge 20 ]; }
}
if ! { [ -x /usr/local/go/bin/go ] && go_ok /usr/local/go/bin/go; } \
    && ! { command -v go >/dev/null && go_ok "$(command -v go)"; }; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: Go 1.20 or later is missing (for tests/p9client); run as root or install it" >&2
        exit 1
    fi
    command -v curl >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null; }
    go_tar=go1.22.12.linux-$(dpkg --print-architecture).tar.gz
    curl -fsSL "https://go.dev/dl/$go_tar" -o "/tmp/$go_tar"
    rm -rf /usr/local/go && tar -C /usr/local -xzf "/tmp/$go_tar" && rm -f "/tmp/$go_tar"
fi

# ---- KCM conformance (scripts/conformance.sh): qemu and the tools the kcmvm
# harness (scripts/kcmvm.sh) uses to fetch and boot Debian's kernel (apt-get
# download, dpkg-deb, depmod, a static busybox for the guest), and glibc's
# static libraries for the static runner the guest needs.
vm_need=()
command -v qemu-system-x86_64 >/dev/null || vm_need+=(qemu-system-x86)
command -v cpio >/dev/null || vm_need+=(cpio)
command -v modinfo >/dev/null || vm_need+=(kmod)
command -v zstd >/dev/null || vm_need+=(zstd)
command -v xz >/dev/null || vm_need+=(xz-utils)
command -v readelf >/dev/null || vm_need+=(binutils)
# The guest has no libc: busybox must be the static build.
if [ ! -x /bin/busybox ] || LC_ALL=C readelf -lW /bin/busybox 2>/dev/null | grep -q 'program interpreter'; then
    vm_need+=(busybox-static)
fi
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || vm_need+=(libc6-dev)
if [ ${#vm_need[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing ${vm_need[*]}; run as root or install them" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${vm_need[@]}" >/dev/null
fi
