#!/usr/bin/env bash
# tollgate replay's speed, end to end: a generated combined-format log of LINES lines (default
# 5,000,000, a day of traffic from 5,000 clients) replayed through one policy, timed over RUNS
# runs (default 3) from the command line to the written report. For scale, the same run times
# `wc -l` reading the same file (the floor any log reader pays) and reports the ratio.
#   scripts/bench-replay.sh [LINES] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
lines=${1:-5000000}
runs=${2:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cargo build --release -q -p tollgate-cli -p tollgate-replay --example generate_log
target/release/examples/generate_log "$lines" 86400 5000 >"$work/access.log"
cat >"$work/tollgate.toml" <<'TOML'
[[policy]]
name = "api"
algorithm = "sliding_window_counter"
limit = 100
window = "1m"
key = ["header:x-api-key", "ip"]
match = { path = "/v1/**" }
TOML
echo "log: $lines lines, $(du -h "$work/access.log" | cut -f1); load average: $(cut -d' ' -f1-3 /proc/loadavg)"

now() { date +%s.%N; }
for run in $(seq "$runs"); do
  t0=$(now)
  wc -l "$work/access.log" >/dev/null
  t1=$(now)
  target/release/tollgate replay --config "$work/tollgate.toml" --format combined \
    --out "$work/report" "$work/access.log" >"$work/table.txt"
  t2=$(now)
  awk -v n="$lines" -v t0="$t0" -v t1="$t1" -v t2="$t2" -v run="$run" 'BEGIN {
    w = t1 - t0; r = t2 - t1
    printf "run %d: replay %.2f s = %.0f lines/s; wc -l %.2f s; replay/wc-l time %.1fx\n", run, r, n / r, w, r / w
  }'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
head -12 "$work/table.txt"
