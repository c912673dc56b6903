#!/usr/bin/env bash
# The KCM conformance run: the acceptance cases of kcm-semantics §7 against the
# userspace runtime on this machine, then against the kernel's AF_KCM (and the
# userspace runtime again) inside the kcmvm VM (scripts/kcmvm.sh: Debian's kernel under qemu), which boots once; then the
# side-by-side benchmarks (receive, echo by one and two application threads) in the same boot, the C API's checks on
# AF_KCM (crates/connmux-capi/tests/c/backend.c), then the kernel's own 9P
# client mounting `connmux 9p-server` (scripts/ninep-vm.sh) and its NFSv3
# client mounting `connmux nfs-server` (scripts/nfs-vm.sh). Prints one table,
# exits non-zero if any case, C API, 9P or NFS check FAILed or the VM gave no result.
#
#   scripts/conformance.sh            # everything
#   CONFORMANCE_NO_VM=1 scripts/conformance.sh   # this machine only
#   CONFORMANCE_BENCH="20000 3"       # messages and repetitions of the benchmark
#   CONFORMANCE_NO_9P=1               # leave out the 9P and NFS mounts in the VM
#   KCMVM_RUN=PATH                    # another harness with scripts/kcmvm.sh's interface
#
# Without the VM (CONFORMANCE_NO_VM=1) the kernel column is not filled and the
# run says SKIPPED for it; a harness that fails (no qemu, no kernel package) is
# a failure of the run, never a pass.
#
# Both backends are driven through connmux's public API (Mux/KcmSocket with
# Backend::Userspace and Backend::Kernel); cases 44-46 check the backend choice,
# the calls the kernel backend refuses, and bad input reported alike.
# The guest has no libc: the runner is linked statically (glibc, +crt-static,
# no extra Rust target needed; x86_64-unknown-linux-musl builds it too).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The VM harness: the project's own (scripts/kcmvm.sh), or KCMVM_RUN names another.
harness=${KCMVM_RUN:-$root/scripts/kcmvm.sh}
if [ "${CONFORMANCE_NO_VM:-0}" != 1 ] && [ ! -x "$harness" ]; then
    echo "conformance: the kcmvm harness $harness is missing or not executable" >&2
    exit 1
fi
target=${CONFORMANCE_TARGET_DIR:-${CARGO_TARGET_DIR:-$root/target}/static}
bench=${CONFORMANCE_BENCH:-20000 3}
t0=$(date +%s)

echo "conformance: building the static runner (target dir $target)" >&2
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target" \
    cargo build --release --target x86_64-unknown-linux-gnu -p connmux-conformance >&2
bin="$target/x86_64-unknown-linux-gnu/release/connmux-conformance"
ninep=${CONFORMANCE_NO_9P:-0}
vm_files=(-a "$bin")
# The C API on AF_KCM: crates/connmux-capi/tests/c/backend.c linked
# statically with libconnmux.a, run in the VM as `backend kernel` (on this
# machine `cargo test -p connmux-capi` runs it as `backend here`).
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target" \
    cargo build --release --target x86_64-unknown-linux-gnu -p connmux-capi >&2
capi_bin="$target/connmux-capi-backend"
"${CC:-cc}" -static -s -std=c11 -O1 -Wall -Wextra -Werror -pthread -I "$root/crates/connmux-capi/include" \
    -o "$capi_bin" "$root/crates/connmux-capi/tests/c/backend.c" \
    "$target/x86_64-unknown-linux-gnu/release/libconnmux.a" -ldl -lm -lrt 2>"$target/capi-link.log" \
    || { cat "$target/capi-link.log" >&2; exit 1; }
vm_files+=(-a "$capi_bin")
if [ "$ninep" != 1 ]; then
    RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$target" \
        cargo build --release --target x86_64-unknown-linux-gnu -p connmux-cli --bin connmux >&2
    vm_files+=(-a "$target/x86_64-unknown-linux-gnu/release/connmux" -a "$root/scripts/ninep-vm.sh")
    vm_files+=(-a "$root/scripts/nfs-vm.sh")
    # What busybox cannot do on the 9P mount (xattrs as `cp -a` copies them,
    # fcntl byte-range locks from two processes): scripts/ninep-vm-check.c.
    "${CC:-cc}" -static -s -std=c11 -O1 -Wall -Wextra -Werror -o "$target/ninep-vm-check" \
        "$root/scripts/ninep-vm-check.c"
    vm_files+=(-a "$target/ninep-vm-check")
    # The guest's tmpfs keeps no user.* xattrs (Linux 6.1): an ext4 disk for
    # the export, with values larger than a block (ea_inode), 8 KiB gzipped.
    rm -f "$target/ninep-xattr.img"
    PATH=$PATH:/usr/sbin:/sbin mkfs.ext4 -q -F -b 4096 -O ^has_journal,^metadata_csum,ea_inode -N 256 \
        -E root_owner=0:0 "$target/ninep-xattr.img" 8M >/dev/null
    gzip -9 -f "$target/ninep-xattr.img"
    vm_files+=(-a "$target/ninep-xattr.img.gz")
    # The kernel's 9P client: the fd (TCP) transport and the file system;
    # its NFSv3 client: sunrpc, lockd, grace, nfs, nfsv3; the xattr disk:
    # loop, crc32c_generic (ea_inode's checksums), ext4.
    export KCMVM_MODULES="${KCMVM_MODULES:-kcm 9pnet 9pnet_fd 9p sunrpc lockd grace nfs nfsv3 loop crc32c_generic ext4}"
fi
t1=$(date +%s)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0
echo "conformance: this machine ($(uname -r))" >&2
"$bin" --backend all >"$work/host.txt" || rc=1
t2=$(date +%s)

vm_rc=skipped
if [ "${CONFORMANCE_NO_VM:-0}" != 1 ]; then
    cat >"$work/driver.sh" <<DRIVER
#!/bin/sh
/test/connmux-conformance --backend all; rc=\$?
/test/connmux-conformance --bench $bench || rc=1
/test/connmux-capi-backend kernel || rc=1
if [ -x /test/ninep-vm.sh ]; then sh /test/ninep-vm.sh || rc=1; fi
if [ -x /test/nfs-vm.sh ]; then sh /test/nfs-vm.sh || rc=1; fi
exit \$rc
DRIVER
    echo "conformance: kcmvm ($harness)" >&2
    vm_rc=0
    "$harness" -t 600 "${vm_files[@]}" "$work/driver.sh" >"$work/vm.txt" || vm_rc=$?
    [ "$vm_rc" = 0 ] || rc=1
fi
t3=$(date +%s)
touch "$work/vm.txt"

# The table: one row per case, the three runs side by side, the kernel's note.
awk -v H="$work/host.txt" -v V="$work/vm.txt" '
function load(file, tag,   line, f, n, note) {
    while ((getline line < file) > 0) {
        if (line !~ /^CASE /) continue
        n = split(line, f, " ")
        c = f[2] + 0; res[c, tag f[3]] = f[4]
        note = line; sub(/^CASE +[0-9]+ +[a-z]+ +[A-Z]+ +/, "", note); sub(/ \[[^]]*\]$/, "", note)
        notes[c, tag f[3]] = note
        if (line ~ /\[/) { t = line; sub(/.*\[/, "", t); sub(/;.*/, "", t); title[c] = t }
        if (c > max) max = c
    }
}
BEGIN {
    load(H, "host-"); load(V, "vm-")
    printf "%-4s %-14s %-12s %-9s  %-80s %s\n", "case", "userspace/host", "userspace/vm", "kernel/vm", "name", "kernel note"
    for (c = 1; c <= max; c++) {
        printf "%-4s %-14s %-12s %-9s  %-80s %s\n", c, \
            (((c, "host-userspace") in res) ? res[c, "host-userspace"] : "-"), \
            (((c, "vm-userspace") in res) ? res[c, "vm-userspace"] : "-"), \
            (((c, "vm-kernel") in res) ? res[c, "vm-kernel"] : "-"), \
            title[c], notes[c, "vm-kernel"]
    }
}'
echo
grep -h '^SKIP\|^INFO\|^SUMMARY' "$work/host.txt" | sed 's/^/host: /'
grep -h '^SKIP\|^INFO\|^SUMMARY\|^BENCH\|^FAILED\|^NINEP\|^NFS \|^CAPI\|^FAIL ' "$work/vm.txt" | sed 's/^/vm:   /' || true
if [ "$vm_rc" != skipped ] && ! grep -q '^CAPI SUMMARY passed=[1-9][0-9]* failed=0$' "$work/vm.txt"; then
    echo "the C API on AF_KCM in the VM did not pass"; rc=1
fi
if [ "$ninep" != 1 ] && [ "$vm_rc" != skipped ] && ! grep -q '^NINEP SUMMARY .* failed=0$' "$work/vm.txt"; then
    echo "9P in the VM did not pass"; rc=1
fi
if [ "$ninep" != 1 ] && [ "$vm_rc" != skipped ] && ! grep -q '^NFS SUMMARY .* failed=0$' "$work/vm.txt"; then
    echo "NFS in the VM did not pass"; rc=1
fi
if [ "$vm_rc" = skipped ]; then
    echo "conformance: the VM part was SKIPPED (CONFORMANCE_NO_VM=1): the kernel backend, the C API on AF_KCM and 9P were not checked"
elif ! grep -q '^CASE .* kernel ' "$work/vm.txt"; then
    echo "no kernel case reported a result in the VM"; rc=1
fi
if grep -qh '^CASE .* FAIL ' "$work/host.txt" "$work/vm.txt"; then
    echo; echo "FAILED cases:"; grep -h '^CASE .* FAIL ' "$work/host.txt" "$work/vm.txt"
    rc=1
fi
[ "$vm_rc" = 0 ] || [ "$vm_rc" = skipped ] || { echo "kcmvm exit $vm_rc; its output:"; cat "$work/vm.txt"; }
echo "conformance: build $((t1 - t0)) s, host run $((t2 - t1)) s, VM boot+run $((t3 - t2)) s (vm rc $vm_rc), total $((t3 - t0)) s"
exit $rc
