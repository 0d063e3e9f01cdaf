#!/usr/bin/env bash
# Throughput of the Envoy rate limit service (ShouldRateLimit over gRPC on loopback): concurrent
# client tasks over several HTTP/2 connections. Prints calls/s and calls per CPU-second.
#   scripts/bench-envoy.sh                 # memory store, client and server in one process
#   scripts/bench-envoy.sh --split         # server in its own process: calls per server CPU-second
#   scripts/bench-envoy.sh --with-redis [--split]   # RedisStore on a redis-server started here
# Other flags go to the example: --seconds 5 --connections 4 --concurrency 64 --descriptors 1|2
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
redis=false
for a in "$@"; do
  if [ "$a" = "--with-redis" ]; then redis=true; else args+=("$a"); fi
done
cargo build --quiet --release -p tollgate-envoy --example bench
bin="${CARGO_TARGET_DIR:-target}/release/examples/bench"
if $redis; then
  command -v redis-server >/dev/null || { echo "redis-server not found (apt-get install redis-server)" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  dir=$(mktemp -d)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize no >/dev/null &
  rpid=$!
  trap 'kill $rpid 2>/dev/null; wait $rpid 2>/dev/null; rm -rf "$dir"' EXIT
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  args+=(--redis "redis://127.0.0.1:$port")
fi
"$bin" ${args[@]+"${args[@]}"}
