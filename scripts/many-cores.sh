#!/usr/bin/env bash
# Multi-core figures: NULL-RPC scaling by workers (epoll and io_uring), and
# uneven work on 8 CPUs; with a second binary, the two versions alternated in
# the same run (A/B); with an external ceiling server, it too at every step.
set -euo pipefail
# usage: scripts/many-cores.sh DIR [BASE]
#   DIR holds connmux; optionally also an external C ceiling server
#   `limit_server` (run as "yardstick" rows when present) and its load
#   generator `rpc_load` (used when present; else `connmux rpctest`). BASE, a
#   connmux binary to compare (run in turn with DIR/connmux at every step).
#   Needs 16 CPUs: servers on 0..W-1, the load on 8-15 (with 16 workers it
#   shares all 16). Log in $OUT/scale.log. Knobs (environment): ROUNDS (3),
#   DUR seconds per run (3), WORKERS ("1 2 4 8 16"), INFLIGHT ("32"; "1 32"
#   adds one call in flight per connection), UNEVEN (1; 0 skips bench uneven),
#   LOAD_CPUS (the load's CPUs, "8-15").
#   About 4 minutes with the defaults and no BASE; BASE doubles the connmux part.
D=$(cd "${1:?directory with connmux (and optionally limit_server, rpc_load)}" && pwd); BASE=${2:-}
[ -x "$D/connmux" ] || { echo "many-cores: no connmux in $D" >&2; exit 1; }
O=${OUT:-/tmp/many-cores}; mkdir -p "$O"
exec > >(tee "$O/scale.log") 2>&1
echo "== $(uname -r) nproc=$(nproc) $(grep -m1 'model name' /proc/cpuinfo)"; uptime
ROUNDS=${ROUNDS:-3}; DUR=${DUR:-3}; WORKERS=${WORKERS:-1 2 4 8 16}; INFLIGHT=${INFLIGHT:-32}
BINS="$D/connmux${BASE:+ $BASE}"
# Ports above the ephemeral range (32768-60999): a listener there never
# collides with a load connection's local port. One per server and step.
port=61000
load() { # port label loadcpus inflight
  if [ -x "$D/rpc_load" ]; then
    echo "$2 $(timeout 20 taskset -c $3 $D/rpc_load -j 32 -a $4 -d $DUR -p $1 2>&1 | tail -1 || true)"
  else
    echo "$2 $(timeout 20 taskset -c $3 $D/connmux rpctest -j 32 -a $4 -d $DUR -i 1 127.0.0.1:$1 2>&1 | tail -1 || true)"
  fi
}
yard=0
if [ -x "$D/limit_server" ]; then yard=1; else echo "many-cores: no limit_server in $D: no yardstick rows"; fi
for W in $WORKERS; do
  C=$(seq -s, 0 $((W-1))); L=${LOAD_CPUS:-8-15}; [ "$W" -gt 8 ] && [ -z "${LOAD_CPUS:-}" ] && L=0-15
  for A in $INFLIGHT; do
    for r in $(seq 1 $ROUNDS); do
      for b in $BINS; do
        name=$([ "$b" = "$D/connmux" ] && echo connmux || echo base)
        for drv in epoll uring; do
          port=$((port+1))
          $b rpc-server -l 127.0.0.1:$port --cpus $C --attach in-turn --no-stats-socket --driver $drv --stats-every 10 >"$O/server.out" 2>&1 & S=$!
          sleep 0.5; load $port "$name-$drv W=$W -a$A r=$r" $L $A; kill $S; wait $S 2>/dev/null || true
        done
      done
      if [ $yard = 1 ]; then
        port=$((port+1))
        taskset -c 0-$((W-1)) $D/limit_server -t $W -p $port -q -T 600 >/dev/null 2>&1 & S=$!
        sleep 0.5; load $port "yardstick W=$W -a$A r=$r" $L $A; kill $S; wait $S 2>/dev/null || true
      fi
    done
  done
done
if [ "${UNEVEN:-1}" = 1 ]; then
  for b in $BINS; do
    U="$b bench uneven --cpus 0,1,2,3,4,5,6,7 -i $ROUNDS -d 2"
    echo "== $b: uneven heavy only -a64"; timeout 120 $U --heavy-conns 1 --light-conns 0 -a 64 || true
    echo "== $b: uneven 1 heavy + 1 light -a32"; timeout 120 $U --heavy-conns 1 --light-conns 1 -a 32 || true
    echo "== $b: uneven defaults (1 heavy + 7 light -a4)"; timeout 120 $U || true
  done
fi
echo "== done"; uptime
