#!/usr/bin/env bash
# Core benchmarks in one run, next to governor 0.10's keyed limiter:
#   1. Limiter::check throughput (polled once, as an embedding app does) of every algorithm
#      against governor on the same workload, interleaved rounds (benches/check.rs): 100,000
#      keys round-robin or one hot key, 1 or 2 threads, every decision admitted or every one
#      denied, String API keys and u64 keys. Prints the ratios (governor's time / Tollgate's:
#      above 1.00 Tollgate is faster) as the issue's table, for the token bucket and for every
#      algorithm against governor's token bucket (and the token bucket through
#      Limiter::check_policy, its policy resolved once), by wall time and by the CPU time the
#      threads used (which background load on a shared machine inflates far less);
#   2. bytes per tracked key at 1,000,000 keys, Tollgate and governor (benches/memory_per_key.rs).
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
rows = {}
cpu_rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 10 and f[0] in ("1", "100k"):
        keys, shape, threads, mode, contender, ns, _, ratio, _, cpu_ratio = f
        rows[(keys, shape, threads, mode, contender)] = float(ratio)
        cpu_rows[(keys, shape, threads, mode, contender)] = float(cpu_ratio)
if not rows:
    sys.exit("bench-core: no results in the check bench's output")
algorithms = ["token_bucket", "fixed_window", "sliding_window_counter", "leaky_bucket",
              "sliding_window_log"]
scenarios = [("100k", "1", "100k keys, 1 thread"), ("100k", "2", "100k keys, 2 threads"),
             ("1", "1", "one hot key, 1 thread"), ("1", "2", "one hot key, 2 threads")]
def cell(table, keys, shape, threads, alg):
    a = table.get((keys, shape, threads, "admit", alg), float("nan"))
    d = table.get((keys, shape, threads, "deny", alg), float("nan"))
    return "%.2f / %.2f" % (a, d)
for table, what in ((rows, "wall time"), (cpu_rows, "CPU time of the threads")):
    print("\nToken bucket: Tollgate / governor throughput by %s, admit / deny "
          "(above 1.00: Tollgate faster)" % what)
    print("%-26s %16s %16s %22s" % ("scenario", "String keys", "u64 keys",
                                     "check_policy: String / u64 (admit/deny)"))
    for keys, threads, label in scenarios:
        resolved = "%s  %s" % (cell(table, keys, "String", threads, "token_bucket_resolved"),
                               cell(table, keys, "u64", threads, "token_bucket_resolved"))
        print("%-26s %16s %16s    %s" % (label, cell(table, keys, "String", threads, "token_bucket"),
                                        cell(table, keys, "u64", threads, "token_bucket"),
                                        resolved))
    print("\nEvery algorithm / governor's token bucket by %s, lowest over the 8 scenarios of "
          "each key shape (admit / deny)" % what)
    print("%-26s %16s %16s" % ("algorithm", "String keys", "u64 keys"))
    for alg in algorithms:
        cells = []
        for shape in ("String", "u64"):
            lows = []
            for mode in ("admit", "deny"):
                vals = [table.get((k, shape, t, mode, alg), float("nan")) for k, t, _ in scenarios]
                lows.append(min(vals))
            cells.append("%.2f / %.2f" % tuple(lows))
        print("%-26s %16s %16s" % (alg, *cells))
PY
echo
cargo bench -q -p tollgate --bench memory_per_key 2>/dev/null | tail -8
