#!/usr/bin/env bash
# Benchmarks the Redis store: decisions/s and p50/p99 latency through RedisStore with 50
# concurrent callers, side by side with redis-benchmark sending the raw EVALSHA of the same
# script at the same concurrency, against one redis-server this script starts (and stops).
#
#   scripts/bench-redis.sh [seconds] [concurrency]
#
# Needs redis-server, redis-cli and redis-benchmark (apt-get install redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-10}
CONCURRENCY=${2:-50}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target-redis}

for tool in redis-server redis-cli redis-benchmark; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y redis-server redis-tools" >&2; exit 1; }
done

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no --logfile "" >/dev/null &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

# The profiling profile: the release build with symbols, for perf and callgrind.
cargo build --profile profiling -q -p tollgate-redis --example bench_redis
BENCH="${CARGO_TARGET_DIR:-target}/profiling/examples/bench_redis"
URL="redis://127.0.0.1:$PORT"

# The exact script call the store makes, with the key's hash tag randomised like the store's.
read -r -a CALL <<<"$("$BENCH" --url "$URL" --print-evalsha)"
redis-cli -p "$PORT" SCRIPT LOAD "$(cat crates/redis/src/script.lua)" >/dev/null

echo "== RedisStore (examples/bench_redis), $CONCURRENCY callers, ${SECONDS_RUN}s"
STORE_OUT=$("$BENCH" --url "$URL" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN")
echo "$STORE_OUT"
STORE_RPS=$(sed -E 's/.*= ([0-9]+) decisions\/s.*/\1/' <<<"$STORE_OUT")

echo "== redis-benchmark raw EVALSHA, -c $CONCURRENCY"
# About as many requests as the store made, so both run for a similar time.
N=$(( STORE_RPS * SECONDS_RUN ))
RAW_OUT=$(redis-benchmark -p "$PORT" -c "$CONCURRENCY" -n "$N" -r 10000 --csv "${CALL[@]}")
echo "$RAW_OUT"
RAW_RPS=$(tail -n 1 <<<"$RAW_OUT" | cut -d, -f2 | tr -d '"')

python3 - "$STORE_RPS" "$RAW_RPS" <<'PY'
import sys
store, raw = float(sys.argv[1]), float(sys.argv[2])
print(f"== ratio store/raw = {store:.0f}/{raw:.0f} = {store / raw:.2f} (target >= 0.8)")
PY
