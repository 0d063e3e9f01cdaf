#!/usr/bin/env bash
# Benchmarks the Redis store against one redis-server this script starts (and stops).
#
# Per algorithm, in rounds that alternate the three so a noisy machine hurts each alike:
#   store    decisions/s through RedisStore (examples/bench_redis), CONCURRENCY callers,
#            10,000 keys, nothing denied
#   own      redis-benchmark -P 16 -c 50 sending the store's own script call: its ceiling
#   minimal  redis-benchmark -P 16 -c 50 sending the least Lua that makes the same decision
#            with Redis TIME (crates/redis/examples/bench_redis/minimal/<algorithm>.lua)
# and the ratios store/minimal (the target: >= 0.8), own/minimal and store/own, per round and
# as the median over the rounds; and Redis's own time per script call in each of the three
# (INFO commandstats usec_per_call of EVALSHA: far less noisy than throughput on a busy machine),
# and the store's client CPU time per decision (the bench process, every thread). Then one hot
# key decided by 3 instances, without and with
# leases (decisions/s, admitted, over-admitted).
#
#   scripts/bench-redis.sh [seconds per run, default 5] [rounds, default 3] [concurrency, 50]
#
# BENCH=path/to/bench_redis runs that build of the example instead of building this tree's (to
# compare two builds in alternating runs).
#
# Needs redis-server, redis-cli and redis-benchmark (apt-get install redis-server redis-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_RUN=${1:-5}
ROUNDS=${2:-3}
CONCURRENCY=${3:-50}
ALGORITHMS=(fixed_window sliding_window_log sliding_window_counter token_bucket leaky_bucket)

for tool in redis-server redis-cli redis-benchmark python3; do
  command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install -y redis-server redis-tools python3" >&2; exit 1; }
done

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no --logfile "" >/dev/null &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

# The profiling profile: the release build with symbols, for perf and callgrind.
if [ -z "${BENCH:-}" ]; then
  cargo build --profile profiling -q -p tollgate-redis --example bench_redis
  BENCH="${CARGO_TARGET_DIR:-target}/profiling/examples/bench_redis"
fi
URL="redis://127.0.0.1:$PORT"
MINIMAL=crates/redis/examples/bench_redis/minimal

# Redis's time per EVALSHA since the last reset, µs.
usec() { redis-cli -p "$PORT" INFO commandstats | sed -nE 's/^cmdstat_evalsha:.*usec_per_call=([0-9.]+).*/\1/p'; }
reset() { redis-cli -p "$PORT" CONFIG RESETSTAT >/dev/null; }

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=$(mktemp)
for round in $(seq "$ROUNDS"); do
  for alg in "${ALGORITHMS[@]}"; do
    # The store's exact call for a key whose hash tag redis-benchmark randomises.
    read -r -a OWN <<<"$("$BENCH" --url "$URL" --algorithm "$alg" --print-command)"
    MIN_SHA=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$MINIMAL/$alg.lua")")
    read -r -a MIN_ARGS <<<"$("$BENCH" --url "$URL" --algorithm "$alg" --print-minimal-args)"
    reset
    STORE_OUT=$("$BENCH" --url "$URL" --algorithm "$alg" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN")
    STORE=$(sed -E 's/.*= ([0-9]+) decisions\/s.*/\1/' <<<"$STORE_OUT")
    STORE_CPU=$(sed -E 's/.*client CPU ([0-9.]+) us.*/\1/' <<<"$STORE_OUT")
    STORE_US=$(usec)
    # Enough requests for about as long a run as the store's at twice its rate.
    N=$(( STORE * SECONDS_RUN * 2 ))
    reset
    OWN_RPS=$(redis-benchmark -p "$PORT" -c 50 -P 16 -n "$N" -r 10000 --csv "${OWN[@]}" | tail -n 1 | cut -d, -f2 | tr -d '"')
    OWN_US=$(usec)
    reset
    MIN_RPS=$(redis-benchmark -p "$PORT" -c 50 -P 16 -n "$N" -r 10000 --csv EVALSHA "$MIN_SHA" 1 'tg:{__rand_int__}:minimal' "${MIN_ARGS[@]}" | tail -n 1 | cut -d, -f2 | tr -d '"')
    MIN_US=$(usec)
    echo "$round $alg $STORE $OWN_RPS $MIN_RPS $STORE_US $OWN_US $MIN_US $STORE_CPU" | tee -a "$RESULTS"
    redis-cli -p "$PORT" FLUSHALL >/dev/null
  done
done
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
algs = list(dict.fromkeys(r[1] for r in rows))
print(f"{'algorithm':24} {'store/s':>9} {'own/s':>9} {'minimal/s':>9} {'store/min':>9} {'own/min':>8} {'store/own':>9}   store/min per round")
for a in algs:
    rs = [(float(r[2]), float(r[3]), float(r[4])) for r in rows if r[1] == a]
    med = lambda xs: statistics.median(xs)
    per = " ".join(f"{s / m:.2f}" for s, o, m in rs)
    s, o, m = med([x[0] for x in rs]), med([x[1] for x in rs]), med([x[2] for x in rs])
    print(f"{a:24} {s:9.0f} {o:9.0f} {m:9.0f} {med([x[0] / x[2] for x in rs]):9.2f} "
          f"{med([x[1] / x[2] for x in rs]):8.2f} {med([x[0] / x[1] for x in rs]):9.2f}   {per}")
print()
print(f"{'client CPU us/decision':24} {'median':>9}   per round")
for a in algs:
    cpu = [float(r[8]) for r in rows if r[1] == a]
    print(f"{a:24} {statistics.median(cpu):9.2f}   " + " ".join(f"{c:.2f}" for c in cpu))
print()
print(f"{'usec_per_call':24} {'store':>9} {'own':>9} {'minimal':>9} {'own/min':>9}   own/min per round")
for a in algs:
    us = [(float(r[5]), float(r[6]), float(r[7])) for r in rows if r[1] == a]
    med = lambda xs: statistics.median(xs)
    per = " ".join(f"{o / m:.2f}" for s, o, m in us)
    print(f"{a:24} {med([x[0] for x in us]):9.2f} {med([x[1] for x in us]):9.2f} "
          f"{med([x[2] for x in us]):9.2f} {med([x[1] / x[2] for x in us]):9.2f}   {per}")
PY
rm -f "$RESULTS"

echo "== one hot key, 3 instances x $CONCURRENCY callers (bench_redis --hot-key): a limit the"
echo "   run does not reach (decisions/s), then one it reaches every window (over-admission)"
for round in $(seq "$ROUNDS"); do
  "$BENCH" --url "$URL" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN" --hot-key
  "$BENCH" --url "$URL" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN" --hot-key --lease
done
"$BENCH" --url "$URL" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN" --hot-key --limit 200000
"$BENCH" --url "$URL" --concurrency "$CONCURRENCY" --seconds "$SECONDS_RUN" --hot-key --limit 200000 --lease
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
