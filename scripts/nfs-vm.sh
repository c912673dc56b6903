#!/bin/sh
# The Linux kernel's own NFSv3 client against `connmux nfs-server`, inside the
# kcmvm guest (busybox tools; run by scripts/conformance.sh in the same boot
# as the KCM conformance cases and the 9P mount). Needs the modules sunrpc
# lockd grace nfs nfsv3 and the static connmux binary beside this script in
# /test. Prints one line "NFS PASS|FAIL <check>" per check and
# "NFS SUMMARY ..." at the end; exits non-zero if any check failed.
#
# busybox's mount has no NFS helper: the options go to mount(2) as text and
# the kernel makes the MOUNT call itself (over TCP, to the server's one port).
P=${NFS_PORT:-2049}
EX=/tmp/nfsexport
M=/mnt/nfs
SRC=/tmp/nfssrc
fails=0
checks=0
up() { cut -d" " -f1 /proc/uptime; }
pass() { checks=$((checks + 1)); echo "NFS PASS $1 (at $(up) s)"; }
fail() { checks=$((checks + 1)); fails=$((fails + 1)); echo "NFS FAIL $1 (at $(up) s)"; }
check() { name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }
same_sums() { # $1, $2: directories whose files must have the same sha256
    (cd "$1" && find . -type f | sort | xargs sha256sum) >/tmp/nsums.a
    (cd "$2" && find . -type f | sort | xargs sha256sum) >/tmp/nsums.b
    cmp -s /tmp/nsums.a /tmp/nsums.b
}

mkdir -p $EX $M $SRC/sub/deeper
/test/connmux nfs-server --export $EX --listen 127.0.0.1:$P --stats-socket /tmp/nfs.sock --no-pin -w 2 \
    --max-msg 1126400 >/tmp/nfs.log 2>&1 &
srv=$!
i=0
while ! grep -q listening /tmp/nfs.log 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 200 ] && break; sleep 0.1
done
opts=vers=3,proto=tcp,nolock,port=$P,mountport=$P,mountproto=tcp,addr=127.0.0.1,mountaddr=127.0.0.1
if ! mount -t nfs -o $opts 127.0.0.1:$EX $M; then
    fail mount; cat /tmp/nfs.log; echo "NFS SUMMARY checks=$checks failed=$fails"; exit 1
fi
pass mount

# A tree of files from 0 B to 8 MiB, in and out.
: >$SRC/empty
printf x >$SRC/one
dd if=/dev/urandom of=$SRC/f4095 bs=4095 count=1 2>/dev/null
dd if=/dev/urandom of=$SRC/sub/f65537 bs=65537 count=1 2>/dev/null
dd if=/dev/urandom of=$SRC/sub/f1m bs=1048576 count=1 2>/dev/null
dd if=/dev/urandom of=$SRC/sub/deeper/f8m bs=1048576 count=8 2>/dev/null
cp -r $SRC $M/tree
sync
check "copy in: sha256 through the mount" same_sums $SRC $M/tree
check "copy in: sha256 on the server's disk" same_sums $SRC $EX/tree
# Out through the server, not the client's cache: drop it first.
echo 3 >/proc/sys/vm/drop_caches
cp -r $M/tree /tmp/nback
check "copy out: sha256" same_sums $SRC /tmp/nback
check "ls -lR lists every file" test "$(ls -lR $M/tree | grep -c '^-')" = 6
check "ls -l sizes" test "$(ls -l $M/tree/sub/deeper/f8m | awk '{print $5}')" = 8388608

# Directories: mkdir, rename with contents, rm -r.
mkdir -p $M/d1/d2 && echo hi >$M/d1/d2/file
mv $M/d1 $M/d3
check "rename of a directory" test -f $EX/d3/d2/file -a ! -e $EX/d1
check "read after rename" test "$(cat $M/d3/d2/file)" = hi
mv $M/d3/d2/file $M/d3/moved
check "rename of a file" test -f $EX/d3/moved -a ! -e $EX/d3/d2/file
rm -r $M/d3 $M/tree
check "rm -r" test ! -e $EX/d3 -a ! -e $EX/tree

# Symlinks.
ln -s some/target $M/sl
check "symlink made on the server" test "$(readlink $EX/sl)" = some/target
check "readlink through the mount" test "$(readlink $M/sl)" = some/target
# A link out of the export is the client's to follow (to its own /proc).
ln -s /proc $EX/out
check "a symlink out of the export resolves on the client" test -d $M/out/self

# Append and truncate.
echo a >$M/app
echo b >>$M/app
sync
check "append" test "$(cat $EX/app | tr '\n' ,)" = "a,b,"
cp $SRC/sub/deeper/f8m $M/t
truncate -s 3 $M/t
check "truncate down" test "$(stat -c %s $EX/t)" = 3
truncate -s 100000 $M/t
check "truncate up" test "$(stat -c %s $M/t)" = 100000
head -c 3 $SRC/sub/deeper/f8m >/tmp/nt3
check "truncated contents" test "$(head -c 3 $M/t | sha256sum)" = "$(sha256sum </tmp/nt3)"

# Hard links and chmod.
echo l >$M/hl1
ln $M/hl1 $M/hl2
check "hard link" test "$(stat -c %h $EX/hl1)" = 2
chmod 600 $M/hl1
check "chmod" test "$(stat -c %a $EX/hl1)" = 600

# df.
check "df" sh -c "df $M | grep -q $M"

# 8 readers at once (each bounded: a hang is a failure, not a stuck run).
cp $SRC/sub/f1m $M/big
sync
echo 3 >/proc/sys/vm/drop_caches
want=$(sha256sum <$SRC/sub/f1m)
pids=
for r in 1 2 3 4 5 6 7 8; do (timeout 60 sha256sum <$M/big >/tmp/nr$r) & pids="$pids $!"; done
for p in $pids; do wait $p; done
ok=1
for r in 1 2 3 4 5 6 7 8; do [ "$(cat /tmp/nr$r)" = "$want" ] || ok=0; done
check "8 parallel readers" test $ok = 1

# A restart of the server under the mount: the client's handles, taken from
# the old process, are served by the new one (the page cache dropped, so the
# reads go to the server).
echo 3 >/proc/sys/vm/drop_caches
kill $srv 2>/dev/null
wait $srv 2>/dev/null
/test/connmux nfs-server --export $EX --listen 127.0.0.1:$P --no-stats-socket --no-pin -w 2 \
    --max-msg 1126400 >/tmp/nfs2.log 2>&1 &
srv2=$!
i=0
while ! grep -q listening /tmp/nfs2.log 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 200 ] && break; sleep 0.1
done
check "read through the same mount after a restart" test "$(timeout 120 sha256sum <$M/big)" = "$want"
check "ls through the same mount after a restart" test "$(ls $M | grep -c big)" = 1

umount $M
check "umount" test $? = 0
kill $srv2 2>/dev/null
wait $srv2 2>/dev/null
grep -E '^(calls|nfs_errors|garbage_args|bad_calls|overloads|paused|send_failures)=' /tmp/nfs.log | tr '\n' ' ' | sed 's/^/NFS INFO server totals: /'
echo
echo "NFS SUMMARY checks=$checks failed=$fails"
[ $fails = 0 ]
