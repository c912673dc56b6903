#!/bin/bash
# Multi-core figures: NULL-RPC scaling by workers (1-16, epoll and io_uring) vs the yardstick, and uneven work on 8 CPUs.
set -u
# usage: scripts/many-cores.sh DIR  (DIR holds connmux, and the yardstick's limit_server
# and rpc_load; needs 16 CPUs: servers on 0..W-1, the load on 8-15). Log in $OUT.
D=$(cd "${1:?directory with connmux, limit_server, rpc_load}" && pwd); O=${OUT:-/tmp/many-cores}; mkdir -p "$O"
exec > >(tee "$O/scale.log") 2>&1
echo "== $(uname -r) nproc=$(nproc) $(grep -m1 'model name' /proc/cpuinfo)"; uptime
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-3}
run_load() { # port label loadcpus
  for r in $(seq 1 $ROUNDS); do
    echo "$2 r=$r $(timeout 20 taskset -c $3 $D/rpc_load -j 32 -a 32 -d $DUR -p $1 2>&1 | tail -1)"
  done
}
# Up to 8 workers the load has CPUs 8-15 to itself; with 16 it shares all 16.
for W in 1 2 4 8 16; do
  C=$(seq -s, 0 $((W-1))); L=8-15; [ "$W" -gt 8 ] && L=0-15
  for drv in epoll uring; do
    $D/connmux rpc-server -l 127.0.0.1:62049 --cpus $C --attach in-turn --no-stats-socket --driver $drv >/dev/null 2>&1 & S=$!
    sleep 0.5; run_load 62049 "connmux-$drv W=$W" $L; kill $S; wait $S 2>/dev/null
  done
  $D/connmux rpc-server -l 127.0.0.1:62049 --cpus $C --attach in-turn --no-stats-socket --driver epoll --no-lease >/dev/null 2>&1 & S=$!
  sleep 0.5; run_load 62049 "connmux-nolease W=$W" $L; kill $S; wait $S 2>/dev/null
  taskset -c 0-$((W-1)) $D/limit_server -t $W -p 20049 -q -T 600 >/dev/null 2>&1 & S=$!
  sleep 0.5; run_load 20049 "yardstick W=$W" $L; kill $S; wait $S 2>/dev/null
done
U="$D/connmux bench uneven --cpus 0,1,2,3,4,5,6,7 -i 3 -d 2"
echo "== uneven heavy only -a64"; timeout 120 $U --heavy-conns 1 --light-conns 0 -a 64
echo "== uneven 1 heavy + 1 light -a32"; timeout 120 $U --heavy-conns 1 --light-conns 1 -a 32
echo "== uneven defaults (1 heavy + 7 light -a4)"; timeout 120 $U
echo "== uneven 2 heavy + 6 light -a32"; timeout 120 $U --heavy-conns 2 --light-conns 6 -a 32
echo "== done"; uptime
