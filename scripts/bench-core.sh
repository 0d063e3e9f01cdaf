#!/usr/bin/env bash
# Core benchmarks in one run, next to governor 0.10's keyed limiter:
#   1. Limiter::check throughput (polled once, as an embedding app does) of every algorithm
#      against governor on the same workload, interleaved rounds (benches/check.rs): 100,000
#      keys visited in order (0, 1, 2, ...) or scattered, or one hot key; 1 or 2 threads; every
#      decision admitted with the state kept (admit), admitted with each key's quota back by
#      its next visit (renew: buckets only), or denied (deny); String API keys and u64 keys.
#      Prints the ratios (governor's time / Tollgate's in each round, where they ran side by
#      side: their median, and their middle half; above 1.00 Tollgate is faster), for the
#      token bucket (also through Limiter::check_policy, its policy resolved once, and through
#      the synchronous Limiter::check_now) and the lowest of every algorithm against governor's
#      token bucket, by wall time and by the CPU time the threads used (which background load
#      on a shared machine inflates far less);
#   2. what the way of calling costs (benches/calling.rs): the token bucket through
#      Limiter::check_now, Limiter::check polled once, check(..).await under a tokio runtime and
#      futures' block_on around each check, against governor, on one hot key and on 100,000
#      String keys in order;
#   3. bytes per tracked key at 1,000,000 keys, Tollgate and governor (benches/memory_per_key.rs).
# Usage: scripts/bench-core.sh            (TOLLGATE_BENCH_ROUNDS, TOLLGATE_BENCH_OPS as in check.rs)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG="$(mktemp /tmp/tollgate-bench-core.XXXXXX)"
trap 'rm -f "$LOG"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
cargo bench -q -p tollgate --bench check >"$LOG" 2>&1 || { tail -20 "$LOG"; exit 1; }
echo "load average after the throughput run: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$LOG" <<'PY'
import sys
wall, cpu = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 14 and f[0] in ("seq", "rnd", "hot"):
        keys, shape, threads, mode, contender = f[:5]
        key = (keys, shape, threads, mode, contender)
        wall[key] = tuple(float(x) for x in f[7:10])
        cpu[key] = tuple(float(x) for x in f[11:14])
if not wall:
    sys.exit("bench-core: no results in the check bench's output")
algorithms = ["token_bucket", "fixed_window", "sliding_window_counter", "leaky_bucket",
              "sliding_window_log"]
scenarios = [("seq", "1", "100k keys in order, 1 thread"), ("seq", "2", "100k keys in order, 2 threads"),
             ("rnd", "1", "100k keys scattered, 1 thread"), ("rnd", "2", "100k keys scattered, 2 threads"),
             ("hot", "1", "one hot key, 1 thread"), ("hot", "2", "one hot key, 2 threads")]
modes = ["admit", "renew", "deny"]
def cell(table, keys, shape, threads, mode, alg):
    r = table.get((keys, shape, threads, mode, alg))
    if r is None:
        return "-"
    return "%.2f (%.2f-%.2f)" % r
for table, what in ((wall, "wall time"), (cpu, "CPU time of the threads")):
    for alg, label in (("token_bucket", "Limiter::check"),
                       ("token_bucket_resolved", "Limiter::check_policy, policy resolved once"),
                       ("token_bucket_now", "Limiter::check_now, synchronous")):
        print("\nToken bucket through %s: governor's time / Tollgate's by %s, median over the "
              "rounds (middle half); above 1.00 Tollgate is faster" % (label, what))
        for shape in ("String", "u64"):
            print("%-32s %18s %18s %18s" % ("%s keys" % shape, *modes))
            for keys, threads, name in scenarios:
                print("%-32s %18s %18s %18s" % (name, *(cell(table, keys, shape, threads, m, alg) for m in modes)))
    print("\nEvery algorithm / governor's token bucket by %s, lowest median ratio over the "
          "scenarios of each key shape and mode" % what)
    print("%-26s %22s %22s" % ("algorithm", "String admit/renew/deny", "u64 admit/renew/deny"))
    for alg in algorithms:
        cells = []
        for shape in ("String", "u64"):
            lows = []
            for mode in modes:
                vals = [table[(k, shape, t, mode, alg)][0] for k, t, _ in scenarios
                        if (k, shape, t, mode, alg) in table]
                lows.append("%.2f" % min(vals) if vals else "-")
            cells.append(" / ".join(lows))
        print("%-26s %22s %22s" % (alg, *cells))
PY
echo
cargo bench -q -p tollgate --bench calling
echo
cargo bench -q -p tollgate --bench memory_per_key 2>/dev/null | tail -8
