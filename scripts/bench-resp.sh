#!/usr/bin/env bash
# Tollgate's Redis-protocol door against throttlecrab-server's, in the same run:
#   scripts/bench-resp.sh [rounds]          (default 3)
# Environment: REQUESTS (default 200000 per measurement), CLIENTS (50), KEYS (100000),
# PIPELINES ("1 16"), THROTTLECRAB_SRC (a throttlecrab checkout; default: cloned into
# $CARGO_TARGET_DIR/throttlecrab-src, built there, never inside the repository).
#
# Each round runs redis-benchmark against both servers for every pipeline depth, alternating
# which goes first, with the same command (Tollgate: CL.THROTTLE, throttlecrab: its THROTTLE,
# same arguments, random keys):
#   redis-benchmark -p PORT -n REQUESTS -c CLIENTS -P DEPTH -r KEYS --csv \
#     CL.THROTTLE key:__rand_int__ 100 1000000 1 1
# and reads each server's CPU time (utime + stime in /proc/PID/stat) before and after. It
# prints every measurement, then per depth the medians: decisions per second, server CPU
# microseconds per decision, and Tollgate's ratios to throttlecrab (rps above 1 and CPU
# below 1 favour Tollgate).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
requests="${REQUESTS:-200000}"
clients="${CLIENTS:-50}"
keys="${KEYS:-100000}"
pipelines="${PIPELINES:-1 16}"
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"

for tool in redis-benchmark redis-cli; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install redis-tools)" >&2; exit 1; }
done

echo "building tollgate-resp's example server (profiling profile)" >&2
cargo build --quiet --profile profiling -p tollgate-resp --example resp_server
ours_bin="$target/profiling/examples/resp_server"

# shellcheck source=scripts/throttlecrab.sh
. scripts/throttlecrab.sh

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ours_port="$(free_port)"
theirs_port="$(free_port)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

"$ours_bin" --listen "127.0.0.1:$ours_port" >/dev/null &
ours_pid=$!
pids+=("$ours_pid")
"$theirs_bin" --redis --redis-host 127.0.0.1 --redis-port "$theirs_port" --log-level error \
  >/dev/null 2>&1 &
theirs_pid=$!
pids+=("$theirs_pid")
for port in "$ours_port" "$theirs_port"; do
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
  [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] || { echo "no server on $port" >&2; exit 1; }
done

clk_tck="$(getconf CLK_TCK)"
# utime and stime of a process, in clock ticks.
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }

# One measurement: prints "rps cpu_us user_us sys_us", the CPU times per decision.
measure() {
  local name=$1 port=$2 pid=$3 depth=$4 cmd
  if [ "$name" = tollgate ]; then cmd=CL.THROTTLE; else cmd=THROTTLE; fi
  local before after rps
  before="$(cpu_ticks "$pid")"
  # stderr dropped: throttlecrab answers no CONFIG GET, and redis-benchmark warns about it.
  rps="$(redis-benchmark -p "$port" -n "$requests" -c "$clients" -P "$depth" -r "$keys" --csv \
    "$cmd" 'key:__rand_int__' 100 1000000 1 1 2>/dev/null | awk -F'"' 'NR==2 {print $4}')"
  after="$(cpu_ticks "$pid")"
  echo "$before $after" | awk -v rps="$rps" -v hz="$clk_tck" -v n="$requests" \
    '{u = ($3 - $1) / hz * 1e6 / n; s = ($4 - $2) / hz * 1e6 / n;
      printf "%.0f %.3f %.3f %.3f\n", rps, u + s, u, s}'
}

results="$(mktemp)"
echo "round depth server decisions/s cpu_us/decision (user sys)"
for round in $(seq "$rounds"); do
  for depth in $pipelines; do
    if [ $((round % 2)) -eq 1 ]; then order="tollgate throttlecrab"; else order="throttlecrab tollgate"; fi
    for server in $order; do
      if [ "$server" = tollgate ]; then
        m="$(measure tollgate "$ours_port" "$ours_pid" "$depth")"
      else
        m="$(measure throttlecrab "$theirs_port" "$theirs_pid" "$depth")"
      fi
      echo "$round P$depth $server $m" | tee -a "$results"
    done
  done
done

echo
echo "medians over $rounds rounds ($requests requests, $clients clients, $keys keys; $(nproc) CPUs)"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
for depth in $pipelines; do
  ours_rps="$(awk -v d="P$depth" '$2==d && $3=="tollgate" {print $4}' "$results" | median)"
  theirs_rps="$(awk -v d="P$depth" '$2==d && $3=="throttlecrab" {print $4}' "$results" | median)"
  ours_cpu="$(awk -v d="P$depth" '$2==d && $3=="tollgate" {print $5}' "$results" | median)"
  theirs_cpu="$(awk -v d="P$depth" '$2==d && $3=="throttlecrab" {print $5}' "$results" | median)"
  awk -v d="$depth" -v orps="$ours_rps" -v trps="$theirs_rps" -v ocpu="$ours_cpu" -v tcpu="$theirs_cpu" \
    'BEGIN {
      printf "P%-3s tollgate %9.0f/s %7.3f us CPU | throttlecrab %9.0f/s %7.3f us CPU | rps x%.2f, CPU/decision x%.2f\n",
        d, orps, ocpu, trps, tcpu, orps / trps, (tcpu > 0 ? ocpu / tcpu : 0)
    }'
done
rm -f "$results"
