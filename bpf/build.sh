#!/bin/sh
# Build every parser program in this folder with clang.
#
#   bpf/build.sh [OUTDIR]      (default OUTDIR: target/bpf at the repository root)
#
# Each NAME.c gives NAME.v1.o and NAME.v3.o (BPF instruction sets v1 and v3, the
# latter with 32-bit jumps and ALU), and NAME.v4.o where clang knows -mcpu=v4
# (clang 18 and later: sign extension, bswap, gotol). The tests of connmux-bpf
# run this script; it needs the Debian package clang.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../target/bpf}
CLANG=${CLANG:-clang}
if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "bpf/build.sh: '$CLANG' not found: install clang (Debian/Ubuntu: apt-get install clang)" >&2
	exit 127
fi
mkdir -p "$out"
cpus="v1 v3"
if echo 'int x;' | "$CLANG" -target bpf -mcpu=v4 -x c -c -o /dev/null - 2>/dev/null; then
	cpus="$cpus v4"
fi
for src in "$here"/*.c; do
	name=$(basename "$src" .c)
	for cpu in $cpus; do
		obj="$out/$name.$cpu.o"
		# Write beside, then rename: a reader never sees half an object.
		"$CLANG" -target bpf -mcpu="$cpu" -O2 -Wall -Werror -c "$src" -o "$obj.tmp.$$"
		mv "$obj.tmp.$$" "$obj"
	done
done
echo "$out"
