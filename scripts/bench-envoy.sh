#!/usr/bin/env bash
# Throughput of the Envoy rate limit service: ShouldRateLimit calls per second over gRPC on
# loopback, with the server in its own process (crates/envoy/examples/bench.rs --serve) and a
# cheap load generator, so the figure reflects the server rather than the client:
#   1. h2load (Debian: nghttp2-client; installed when missing and running as root) sending one
#      pre-encoded request (-d) over CONNECTIONS connections x STREAMS streams, one thread;
#   2. the example's raw-HTTP/2 client (--h2, one thread, 10,000 keys), which also checks every
#      answer: grpc-status != 0 (or a transport error) counts as a failure, and prints p50/p99.
# For each run it prints calls/s, latency, failures and the server's CPU-seconds (from
# /proc/PID/stat) with calls per server CPU-second; then the best and the median of the runs.
#
#   scripts/bench-envoy.sh [--with-redis] [--seconds 10] [--runs 3] [--connections 4] [--streams 64]
#   scripts/bench-envoy.sh --tonic [example flags]          # tonic client and server, one process
#   scripts/bench-envoy.sh --split [example flags]          # tonic client, server in a child
# --with-redis uses RedisStore on a redis-server started here on a free loopback port.
# Example flags (--tonic/--split): --seconds 5 --connections 4 --concurrency 64 --descriptors 1|2
set -euo pipefail
cd "$(dirname "$0")/.."

mode=lean
redis=false
seconds=10
runs=1
conns=4
streams=64
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --with-redis) redis=true ;;
    --tonic) mode=tonic ;;
    --split) mode=tonic; args+=(--split) ;;
    --seconds) seconds="$2"; args+=(--seconds "$2"); shift ;;
    --runs) runs="$2"; shift ;;
    --connections) conns="$2"; args+=(--connections "$2"); shift ;;
    --streams) streams="$2"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

if [ "$mode" = lean ] && ! command -v h2load >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nghttp2-client >/dev/null
  else
    echo "bench-envoy: h2load not found (apt-get install -y nghttp2-client); running the raw-h2 client only" >&2
  fi
fi

# The profiling profile: the release build with symbols, for perf and callgrind.
cargo build --quiet --profile profiling -p tollgate-envoy --example bench
bin="${CARGO_TARGET_DIR:-target}/profiling/examples/bench"

work="$(mktemp -d /tmp/tollgate-bench-envoy.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

redis_args=()
if $redis; then
  command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --daemonize no >/dev/null &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  redis_args=(--redis "redis://127.0.0.1:$port")
fi

echo "load before: $(uptime)"
if [ "$mode" = tonic ]; then
  "$bin" ${args[@]+"${args[@]}"} ${redis_args[@]+"${redis_args[@]}"}
  echo "load after: $(uptime)"
  exit 0
fi

# The server: its own process, stopped by closing its stdin.
mkfifo "$work/stdin"
"$bin" --serve ${redis_args[@]+"${redis_args[@]}"} <"$work/stdin" >"$work/server.out" &
server=$!
pids+=("$server")
exec 3>"$work/stdin"
for _ in $(seq 100); do [ -s "$work/server.out" ] && break; sleep 0.05; done
addr="$(head -n1 "$work/server.out")"
url="http://$addr/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
"$bin" --encode "$work/req.bin"
tck=$(getconf CLK_TCK)
cpu() { awk -v t="$tck" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$server/stat"; }
store=memory; $redis && store=redis
echo "server: $addr ($store store), pid $server; each run ${seconds}s"

h2load_rates=()
h2_rates=()
for run in $(seq "$runs"); do
  if command -v h2load >/dev/null; then
    h2load -D 1 -c "$conns" -m "$streams" -t 1 -d "$work/req.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' "$url" >/dev/null 2>&1 || true
    before=$(cpu)
    h2load -D "$seconds" -c "$conns" -m "$streams" -t 1 -d "$work/req.bin" \
      -H 'content-type: application/grpc' -H 'te: trailers' "$url" >"$work/h2load.out" 2>&1 || true
    after=$(cpu)
    awk -v run="$run" -v c="$conns" -v m="$streams" -v cpu0="$before" -v cpu1="$after" '
      /^finished in/ { gsub(",", ""); rate = $4 }
      /^requests:/ { done = $6; ok = $8; failed = $10; errored = $12; timeout = $14 }
      /^status codes:/ { codes = $0; sub(/^status codes: /, "", codes) }
      /^time for request:/ { mean = $6; sd = $7; max = $5 }
      END {
        cpu = cpu1 - cpu0
        printf "run %d h2load (%d connections x %d streams, 1 thread, one key): %.0f calls/s; %d done, %d succeeded, %d failed, %d errored, %d timeout; HTTP %s; latency mean %s sd %s max %s (h2load gives no percentiles and cannot see grpc-status: the raw-h2 run checks it)\n", run, c, m, rate, done, ok, failed, errored, timeout, codes, mean, sd, max
        if (cpu > 0) printf "run %d h2load: server %.2f CPU-s = %.0f calls per server CPU-second\n", run, cpu, done / cpu
      }' "$work/h2load.out" | tee -a "$work/h2load.sum"
    h2load_rates+=("$(awk '/^finished in/ { gsub(",", ""); printf "%.0f", $4 }' "$work/h2load.out")")
  fi
  before=$(cpu)
  "$bin" --h2 --addr "$addr" --seconds "$seconds" --connections "$conns" \
    --concurrency $((conns * streams)) ${redis_args[@]+"${redis_args[@]}"} >"$work/h2.out"
  after=$(cpu)
  sed "s/^/run $run raw-h2: /" "$work/h2.out"
  rate=$(sed -n 's/.* = \([0-9]*\) calls\/s.*/\1/p' "$work/h2.out" | head -n1)
  h2_rates+=("$rate")
  # The server CPU includes the client's 0.5 s warm-up; the calls counted are the measured ones.
  awk -v cpu0="$before" -v cpu1="$after" -v run="$run" -v s="$seconds" -v r="$rate" 'BEGIN {
    cpu = cpu1 - cpu0
    if (cpu > 0) printf "run %d raw-h2: server %.2f CPU-s over %.1f s = %.0f calls per server CPU-second (warm-up CPU included)\n", run, cpu, s + 0.5, r * s / cpu
  }'
done

summary() {
  local name="$1"; shift
  [ $# -gt 0 ] || return 0
  printf '%s\n' "$@" | sort -n | awk -v name="$name" '
    { v[NR] = $1 }
    END { printf "%s over %d run(s): best %d calls/s, median %d calls/s\n", name, NR, v[NR], v[int((NR + 1) / 2)] }'
}
summary "h2load" ${h2load_rates[@]+"${h2load_rates[@]}"}
summary "raw-h2" ${h2_rates[@]+"${h2_rates[@]}"}
exec 3>&-
wait "$server" 2>/dev/null || true
echo "load after: $(uptime)"
