#!/usr/bin/env bash
# Core benchmarks: check() throughput of every algorithm next to governor's keyed limiter in the
# same run, and bytes per tracked key at 1,000,000 keys. Prints a table of ratios to governor
# (higher is better for Tollgate). Usage: scripts/bench-core.sh [criterion filter]
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-}"
cargo bench -p tollgate --bench check -- ${filter:+"$filter"} >/tmp/tollgate-bench-check.log 2>&1 \
  || { tail -20 /tmp/tollgate-bench-check.log; exit 1; }
python3 - <<'PY'
import json, os, glob
root = "target/criterion"
rows = {}
for path in glob.glob(f"{root}/check_*/*/new/estimates.json"):
    group = path.split("/")[2]
    name = path.split("/")[3]
    mean = json.load(open(path))["mean"]["point_estimate"]
    rows.setdefault(group, {})[name] = mean
print(f"{'scenario':<22}{'algorithm':<26}{'ns/iter':>10}{'Mdecisions/s':>14}{'vs governor':>13}")
for group in sorted(rows):
    threads = int(group.split("_")[1].rstrip("t"))
    gov = rows[group].get("governor_keyed")
    for name, ns in sorted(rows[group].items()):
        rate = threads * 1e3 / ns
        ratio = (gov / ns) if gov else float("nan")
        print(f"{group:<22}{name:<26}{ns:>10.1f}{rate:>14.2f}{ratio:>13.2f}")
PY
cargo bench -p tollgate --bench memory_per_key 2>/dev/null | tail -8
