#!/usr/bin/env bash
# What the tower layer costs an axum hello-world, measured with wrk (an efficient load generator
# in its own process): four servers, each in its own process with 2 runtime workers (plain; with
# only the five header lines the layer adds, as fixed values; with the layer and the memory
# store through `Router::layer`; with the layer wrapped around the whole router), loaded in turns
# for several rounds. Reports per round and as medians:
#   - requests/s: what wrk got; wrk shares the 2 cores, so this moves with the machine's load;
#   - server CPU µs per request (user + system, from /proc): what a server whose clients are
#     elsewhere pays per request, and so the throughput it would lose; steadier than req/s when
#     the machine is shared.
# Usage: scripts/bench-layer.sh [SECONDS per turn, default 3] [ROUNDS, default 7]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-3}"
ROUNDS="${2:-7}"
CONNS="${BENCH_CONNECTIONS:-32}"

if ! command -v wrk >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
  else
    echo "bench-layer: needs wrk (apt-get install -y wrk)" >&2
    exit 1
  fi
fi

cargo bench -q -p tollgate-http --bench tcp --no-run 2>/dev/null
BIN="$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/tcp-* | grep -v '\.d$' | head -1)"
WORK="$(mktemp -d /tmp/tollgate-bench-layer.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

declare -A URL PID
for v in plain headers layer outer; do
  TOLLGATE_BENCH_SERVE=$v "$BIN" --bench >"$WORK/$v.url" &
  PID[$v]=$!
  PIDS+=($!)
done
for v in plain headers layer outer; do
  for _ in $(seq 100); do [ -s "$WORK/$v.url" ] && break; sleep 0.05; done
  URL[$v]="$(head -1 "$WORK/$v.url")"
done

# 1,000 API keys in turn, the same request bytes for all three servers.
cat >"$WORK/keys.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", nil, { ["x-api-key"] = "customer-" .. (n % 1000) })
end
LUA

TICK="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Prints "req/s cpu-µs-per-request" for one turn against variant $1.
turn() {
  local before after out rps reqs
  before="$(cpu_ticks "${PID[$1]}")"
  out="$(wrk -t2 -c"$CONNS" -d"${SECS}s" -s "$WORK/keys.lua" "${URL[$1]}")"
  after="$(cpu_ticks "${PID[$1]}")"
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  reqs="$(awk '/requests in/ {print $1}' <<<"$out")"
  if grep -q "Non-2xx" <<<"$out"; then echo "bench-layer: $1 answered non-2xx" >&2; exit 1; fi
  awk -v r="$rps" -v n="$reqs" -v t="$((after - before))" -v hz="$TICK" \
    'BEGIN { printf "%.0f %.2f\n", r, t / hz * 1e6 / n }'
}

VARIANTS=(plain headers layer outer)
for v in "${VARIANTS[@]}"; do turn "$v" >/dev/null; done # warm-up
echo "req/s and server CPU µs per request; layer = Router::layer, outer = around the router"
printf '%-6s %8s %8s %8s %8s | %7s %7s %7s %7s\n' round plain headers layer outer plain headers layer outer
: >"$WORK/rounds"
for r in $(seq 1 "$ROUNDS"); do
  order=("${VARIANTS[@]}")
  # Rotate the order, so that none always gets the quieter moment.
  for _ in $(seq 1 $((r % 4))); do order=("${order[@]:1}" "${order[0]}"); done
  declare -A RPS CPU
  for v in "${order[@]}"; do
    read -r RPS[$v] CPU[$v] < <(turn "$v")
  done
  printf '%-6s %8s %8s %8s %8s | %7s %7s %7s %7s\n' "$r" "${RPS[plain]}" "${RPS[headers]}" \
    "${RPS[layer]}" "${RPS[outer]}" "${CPU[plain]}" "${CPU[headers]}" "${CPU[layer]}" "${CPU[outer]}"
  echo "${RPS[plain]} ${RPS[headers]} ${RPS[layer]} ${RPS[outer]} ${CPU[plain]} ${CPU[headers]} ${CPU[layer]} ${CPU[outer]}" >>"$WORK/rounds"
done
python3 - "$WORK/rounds" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
med = statistics.median
names = ["headers only", "layer", "outer"]
print("median req/s: plain %.0f, " % med([r[0] for r in rows])
      + ", ".join("%s %.0f" % (n, med([r[i + 1] for r in rows])) for i, n in enumerate(names)))
print("median server CPU per request: plain %.2f µs, " % med([r[4] for r in rows])
      + ", ".join("%s %.2f µs" % (n, med([r[i + 5] for r in rows])) for i, n in enumerate(names)))
print("throughput lost (median of per-round ratios): "
      + ", ".join("%s %.1f%%" % (n, med([100 * (1 - r[i + 1] / r[0]) for r in rows])) for i, n in enumerate(names)))
print("server CPU added per request (median of per-round ratios): "
      + ", ".join("%s %.1f%%" % (n, med([100 * (r[i + 5] / r[4] - 1) for r in rows])) for i, n in enumerate(names)))
PY
