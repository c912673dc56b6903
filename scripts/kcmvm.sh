#!/usr/bin/env bash
# kcmvm: run a program on a Linux kernel that has AF_KCM, inside a small qemu
# VM, and print what the program printed.
#
#   scripts/kcmvm.sh [options] PROGRAM [ARGS...]
#   scripts/kcmvm.sh --prepare
#
# PROGRAM is a static binary or a `#!/bin/sh` script (the guest has busybox and
# no libc). It runs as root in /test, with env KCMVM=1, beside the files given
# with -a. Its stdout and stderr go to the guest's second serial port, so the
# kernel's console (first port) stays out of them; they are printed here on
# stdout when the VM has stopped. The exit status is the program's.
#
# The kernel is Debian's stock one (the `linux-image-*-amd64` that
# `linux-image-amd64` depends on), which builds KCM as a module. It is fetched
# with `apt-get download` and unpacked with `dpkg-deb -x` into the cache:
# nothing is installed on this machine. The initramfs is busybox-static, the
# modules named in KCMVM_MODULES (with what they depend on, from modules.dep
# made by depmod on the unpacked tree) and a small /init.
#
# Options:
#   -t SECS        kill the program after SECS (default 300); the VM as a
#                  whole gets SECS plus KCMVM_BOOT_SECS (default 180)
#   -a FILE        copy FILE into the guest's /test/ (repeatable)
#   -m SIZE        guest memory (default 1G)
#   -s N           guest CPUs (default 2)
#   -v             copy the kernel console to stderr after the run
#   -q             no summary line on stderr
#   --console FILE keep the kernel console in FILE
#   --accel MODE   auto (default), kvm or tcg
#   --prepare      fetch the kernel and build the initramfs, then stop
#   -h, --help
#
# Environment:
#   KCMVM_CACHE       cache directory (default /var/cache/connmux-kcmvm)
#   KCMVM_KERNEL_PKG  the Debian kernel package (default: resolved from
#                     linux-image-amd64 once, then kept in the cache)
#   KCMVM_MODULES     modules to load, in order (default "kcm")
#   KCMVM_ACCEL       default of --accel
#   KCMVM_BOOT_SECS   time allowed for boot and power-off (default 180)
#
# Exit status: the program's; 124 when it ran past -t; 125 when the harness
# itself failed (no kernel, no qemu, no result from the guest).
set -euo pipefail
# depmod lives in sbin, which a user's PATH may lack.
PATH=$PATH:/usr/sbin:/sbin

cache=${KCMVM_CACHE:-/var/cache/connmux-kcmvm}
modules=${KCMVM_MODULES:-kcm}
accel_mode=${KCMVM_ACCEL:-auto}
boot_secs=${KCMVM_BOOT_SECS:-180}
timeout_s=300
mem=1G
smp=2
verbose=0
quiet=0
console_keep=
prepare_only=0
extra=()

fail() { echo "kcmvm: $*" >&2; exit 125; }
say() { [ "$quiet" = 1 ] || echo "kcmvm: $*" >&2; }
help() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

while [ $# -gt 0 ]; do
    case $1 in
        -t) [ $# -ge 2 ] || fail "-t wants seconds"; timeout_s=$2; shift 2 ;;
        -a) [ $# -ge 2 ] || fail "-a wants a file"; extra+=("$2"); shift 2 ;;
        -m) [ $# -ge 2 ] || fail "-m wants a size"; mem=$2; shift 2 ;;
        -s) [ $# -ge 2 ] || fail "-s wants a count"; smp=$2; shift 2 ;;
        -v) verbose=1; shift ;;
        -q) quiet=1; shift ;;
        --console) [ $# -ge 2 ] || fail "--console wants a file"; console_keep=$2; shift 2 ;;
        --accel) [ $# -ge 2 ] || fail "--accel wants auto, kvm or tcg"; accel_mode=$2; shift 2 ;;
        --prepare) prepare_only=1; shift ;;
        -h|--help) help; exit 0 ;;
        --) shift; break ;;
        -*) fail "unknown option $1 (see --help)" ;;
        *) break ;;
    esac
done
[[ $timeout_s =~ ^[0-9]+$ ]] || fail "-t wants whole seconds, not '$timeout_s'"
[[ $boot_secs =~ ^[0-9]+$ ]] || fail "KCMVM_BOOT_SECS wants whole seconds"
if [ "$prepare_only" = 0 ]; then
    [ $# -ge 1 ] || { help >&2; exit 125; }
    prog=$1
    shift
    [ -f "$prog" ] || fail "no such program: $prog"
fi

# ---------------------------------------------------------------- host tools
missing=()
for t in qemu-system-x86_64:qemu-system-x86 cpio:cpio depmod:kmod readelf:binutils \
         dpkg-deb:dpkg apt-get:apt flock:util-linux zstd:zstd xz:xz-utils; do
    command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
done
busybox=$(command -v busybox || true)
if [ -z "$busybox" ] || LC_ALL=C readelf -lW "$busybox" 2>/dev/null | grep -q 'program interpreter'; then
    busybox=
    for b in /bin/busybox /usr/bin/busybox; do
        if [ -x "$b" ] && ! LC_ALL=C readelf -lW "$b" 2>/dev/null | grep -q 'program interpreter'; then
            busybox=$b
            break
        fi
    done
    [ -n "$busybox" ] || missing+=(busybox-static)
fi
if [ ${#missing[@]} -gt 0 ]; then
    fail "missing host packages: ${missing[*]} (scripts/setup.sh installs them: apt-get install ${missing[*]})"
fi

mkdir -p "$cache/debs" "$cache/runs" 2>/dev/null || fail "cannot create the cache $cache (set KCMVM_CACHE)"
[ -w "$cache" ] || fail "the cache $cache is not writable (set KCMVM_CACHE)"

# ---------------------------------------------------------------- the kernel
# Everything below up to the per-run part holds the cache lock: two runs that
# both find the cache empty build it once.
exec 8>"$cache/lock"
flock -w 600 8 || fail "the cache $cache stayed locked for 10 min"

kernel_pkg() {
    if [ -n "${KCMVM_KERNEL_PKG:-}" ]; then
        echo "$KCMVM_KERNEL_PKG"
        return
    fi
    if [ -s "$cache/kernel-pkg" ]; then
        cat "$cache/kernel-pkg"
        return
    fi
    local p
    p=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
    if [ -z "$p" ]; then
        say "apt knows no linux-image-amd64; running apt-get update"
        apt-get update -qq >/dev/null 2>&1 || true
        p=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
    fi
    [ -n "$p" ] || fail "cannot tell which kernel linux-image-amd64 depends on (set KCMVM_KERNEL_PKG)"
    echo "$p" >"$cache/kernel-pkg"
    echo "$p"
}

pkg=$(kernel_pkg)
kdir=$cache/kernel/$pkg

# The .deb, downloaded once.
deb_of() {
    find "$cache/debs" -maxdepth 1 -name "${pkg}_*.deb" | sort -V | tail -n1
}
deb=$(deb_of)
if [ -z "$deb" ]; then
    say "downloading $pkg with apt-get download into $cache/debs"
    if ! (cd "$cache/debs" && apt-get download -q "$pkg" >"$cache/debs/download.log" 2>&1); then
        (cd "$cache/debs" && apt-get update -qq >/dev/null 2>&1 && apt-get download -q "$pkg" >"$cache/debs/download.log" 2>&1) \
            || { cat "$cache/debs/download.log" >&2; fail "apt-get download $pkg failed"; }
    fi
    deb=$(deb_of)
    [ -n "$deb" ] || fail "apt-get download $pkg left no .deb in $cache/debs"
fi

# The unpacked kernel: vmlinuz, config, release, and the module tree with a
# modules.dep (the .deb has none: depmod runs when a package is installed, so
# it is run here on the unpacked tree).
if [ ! -s "$kdir/release" ] || [ ! -s "$kdir/vmlinuz" ]; then
    say "unpacking $(basename "$deb")"
    rm -rf "$kdir"
    tmp=$(mktemp -d "$cache/runs/unpack.XXXXXX")
    dpkg-deb -x "$deb" "$tmp/root" || fail "dpkg-deb -x $deb failed"
    vmlinuz=$(find "$tmp/root/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n1)
    [ -n "$vmlinuz" ] || fail "$deb has no /boot/vmlinuz-*"
    krel=${vmlinuz##*/vmlinuz-}
    grep -q '^CONFIG_AF_KCM=[ym]' "$tmp/root/boot/config-$krel" \
        || fail "$pkg is built without CONFIG_AF_KCM (choose another with KCMVM_KERNEL_PKG)"
    depmod -b "$tmp/root" "$krel" || fail "depmod on the unpacked $pkg failed"
    mkdir -p "$tmp/k"
    cp "$vmlinuz" "$tmp/k/vmlinuz"
    cp "$tmp/root/boot/config-$krel" "$tmp/k/config"
    mv "$tmp/root/lib/modules/$krel" "$tmp/k/modules"
    echo "$krel" >"$tmp/k/release"
    mkdir -p "$(dirname "$kdir")"
    mv "$tmp/k" "$kdir"
    rm -rf "$tmp"
fi
krel=$(cat "$kdir/release")

# ---------------------------------------------------------------- initramfs
# The guest's /init. Part of the initramfs's cache key.
read -r -d '' init_script <<'INIT' || true
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/test:/bin HOME=/tmp TMPDIR=/tmp KCMVM=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/shm /sys/fs/bpf /mnt
mount -t tmpfs tmpfs /dev/shm
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
hostname kcmvm
ip link set lo up
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/kcmvm/$m" || echo "KCMVM_WARN insmod $m failed"
done </lib/kcmvm/order
stty -F /dev/ttyS1 raw -echo 2>/dev/null
if [ -f /test/.kcmvm-run ]; then
    . /test/.kcmvm-run
    cd /test
    echo "KCMVM_BEGIN $(cut -d' ' -f1 /proc/uptime)"
    timeout -s KILL "$KCMVM_TIMEOUT" "/test/$KCMVM_PROG" "$@" >/dev/ttyS1 2>&1 </dev/null
    rc=$?
    echo "KCMVM_END rc=$rc at $(cut -d' ' -f1 /proc/uptime)"
else
    echo "KCMVM_END rc=125 at 0 (no program in the initramfs)"
fi
sync
poweroff -f
INIT

# Resolve module NAME (and, first, what it depends on) through modules.dep;
# appends paths relative to the module tree to the array `order`.
declare -A seen=()
order=()
add_module() {
    local name=$1 rel dep line
    # Module names treat - and _ alike.
    local pat=${name//[-_]/[-_]}
    line=$(grep -E "(^|/)${pat}\.ko(\.[a-z]+)?:" "$kdir/modules/modules.dep" | head -n1 || true)
    if [ -z "$line" ]; then
        if grep -qE "(^|/)${pat}\.ko$" "$kdir/modules/modules.builtin" 2>/dev/null; then
            return 0
        fi
        fail "module $name is not in $pkg (nor built in)"
    fi
    rel=${line%%:*}
    [ -z "${seen[$rel]:-}" ] || return 0
    seen[$rel]=1
    # modules.dep lists every dependency, transitively, nearest first: load
    # them from the far end.
    local deps=(${line#*:})
    local i
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        dep=${deps[$i]}
        [ -n "${seen[$dep]:-}" ] && continue
        seen[$dep]=1
        order+=("$dep")
    done
    order+=("$rel")
}

for m in $modules; do add_module "$m"; done
key=$( { printf '%s\n' "$init_script" "${order[@]}"; sha256sum <"$busybox"; } | sha256sum | cut -c1-16)
base=$kdir/initramfs-$key.cpio
if [ ! -s "$base" ]; then
    tmp=$(mktemp -d "$cache/runs/initramfs.XXXXXX")
    mkdir -p "$tmp"/{bin,dev,proc,sys,tmp,run,test,lib/kcmvm}
    cp "$busybox" "$tmp/bin/busybox"
    ln -s busybox "$tmp/bin/sh"
    printf '%s\n' "$init_script" >"$tmp/init"
    chmod 755 "$tmp/init"
    : >"$tmp/lib/kcmvm/order"
    for rel in "${order[@]}"; do
        f=$kdir/modules/$rel
        out=$(basename "$rel")
        case $rel in
            *.ko.xz) out=${out%.xz}; xz -dc "$f" >"$tmp/lib/kcmvm/$out" ;;
            *.ko.zst) out=${out%.zst}; zstd -qdc "$f" >"$tmp/lib/kcmvm/$out" ;;
            *.ko.gz) out=${out%.gz}; gzip -dc "$f" >"$tmp/lib/kcmvm/$out" ;;
            *) cp "$f" "$tmp/lib/kcmvm/$out" ;;
        esac
        echo "$out" >>"$tmp/lib/kcmvm/order"
    done
    (cd "$tmp" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$base.tmp" \
        || fail "cpio failed building the initramfs"
    mv "$base.tmp" "$base"
    rm -rf "$tmp"
    say "initramfs $(basename "$base"): busybox, modules: $(tr '\n' ' ' <<<"$(printf '%s\n' "${order[@]##*/}")")"
fi
flock -u 8

if [ "$prepare_only" = 1 ]; then
    say "ready: $pkg ($krel), $base"
    exit 0
fi

# ---------------------------------------------------------------- one run
if LC_ALL=C readelf -lW "$prog" 2>/dev/null | grep -q 'program interpreter'; then
    fail "$prog is linked dynamically; the guest has no libc (link it statically)"
fi
run=$(mktemp -d "$cache/runs/run.XXXXXX")
qpid=
finish() {
    if [ -n "$qpid" ]; then kill "$qpid" 2>/dev/null || true; fi
    rm -rf "$run"
}
trap finish EXIT
trap 'exit 130' INT TERM

mkdir -p "$run/root/test"
name=$(basename "$prog")
for f in "${extra[@]+"${extra[@]}"}"; do
    [ -f "$f" ] || fail "-a: no such file $f"
    cp "$f" "$run/root/test/"
done
cp "$prog" "$run/root/test/$name"
chmod 755 "$run/root/test/$name"
# The program's name, its timeout and its arguments, as sh reads them
# (each argument in single quotes).
quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }
{
    printf 'KCMVM_PROG=%s\nKCMVM_TIMEOUT=%s\nset --' "$(quote "$name")" "$timeout_s"
    for a in "$@"; do printf ' %s' "$(quote "$a")"; done
    printf '\n'
} >"$run/root/test/.kcmvm-run"
(cd "$run/root" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$run/test.cpio"
cat "$base" "$run/test.cpio" >"$run/initrd"

# KVM only where it can run a stock kernel: /dev/kvm usable and the CPU shows
# hardware virtualization. A /dev/kvm from kvm_pvm (nested PVM, no vmx/svm)
# cannot: it would emulate the guest instruction by instruction and fail.
case $accel_mode in
    kvm) accel=kvm ;;
    tcg) accel=tcg ;;
    auto)
        if [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] \
           && grep -qwE 'vmx|svm' /proc/cpuinfo; then
            accel=kvm
        else
            accel=tcg
        fi
        ;;
    *) fail "--accel wants auto, kvm or tcg, not '$accel_mode'" ;;
esac
if [ "$accel" = kvm ]; then
    accel_args=(-accel kvm -cpu host)
else
    accel_args=(-accel tcg,thread=multi -cpu max)
fi

: >"$run/console"
: >"$run/out"
t0=$(date +%s.%N)
timeout -k 10 $((timeout_s + boot_secs)) qemu-system-x86_64 \
    -nodefaults -no-user-config -nographic -monitor none -no-reboot \
    -machine pc "${accel_args[@]}" -m "$mem" -smp "$smp" \
    -kernel "$kdir/vmlinuz" -initrd "$run/initrd" \
    -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init" \
    -serial "file:$run/console" -serial "file:$run/out" \
    </dev/null >"$run/qemu.log" 2>&1 &
qpid=$!
qrc=0
wait "$qpid" || qrc=$?
qpid=
t1=$(date +%s.%N)

tr -d '\r' <"$run/out"
if [ -n "$console_keep" ]; then tr -d '\r' <"$run/console" >"$console_keep"; fi
if [ "$verbose" = 1 ]; then tr -d '\r' <"$run/console" >&2; fi

end=$(tr -d '\r' <"$run/console" | grep -ao 'KCMVM_END rc=[0-9]* at [0-9.]*' | tail -n1 || true)
begin=$(tr -d '\r' <"$run/console" | grep -ao 'KCMVM_BEGIN [0-9.]*' | tail -n1 || true)
if [ -z "$end" ]; then
    if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        echo "kcmvm: the VM did not finish within $((timeout_s + boot_secs)) s (qemu killed); console tail:" >&2
    else
        echo "kcmvm: no result from the guest (qemu exit $qrc); console tail:" >&2
    fi
    tr -d '\r' <"$run/console" | tail -n 30 >&2
    cat "$run/qemu.log" >&2
    exit 125
fi
tr -d '\r' <"$run/console" | grep -a 'KCMVM_WARN' >&2 || true
rc=${end#KCMVM_END rc=}
rc=${rc%% *}
t_end=${end##* at }
t_begin=${begin#KCMVM_BEGIN }
if [ "$rc" = 137 ]; then
    echo "kcmvm: $name ran past ${timeout_s} s and was killed" >&2
    rc=124
fi
say "$(awk -v k="$krel" -v a="$accel" -v b="${t_begin:-0}" -v e="${t_end:-0}" -v t0="$t0" -v t1="$t1" -v rc="$rc" \
    'BEGIN { printf "kernel %s, %s, boot %.1f s, program %.1f s, wall %.1f s, exit %s", k, a, b, e - b, t1 - t0, rc }')"
exit "$rc"
