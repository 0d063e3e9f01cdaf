#!/usr/bin/env bash
# What the tower layer costs an axum hello-world, next to tower_governor on the same app, measured
# with wrk (an efficient load generator in its own process). Each variant is its own server
# process with 2 runtime workers, loaded in turns (order rotated) for several rounds:
#   plain        the hello-world alone
#   governor     tower_governor 0.8, use_headers(), token bucket of 10,000 an hour per x-api-key
#   layer-tb-2h  Tollgate's layer, the same token bucket and key, configured to send the same two
#                header lines (reset_format = "none", ietf = false)
#   layer-tb     the same, with the five-line default (X-RateLimit-* and RateLimit-Policy/RateLimit)
#   layer        the sliding window counter (10,000 an hour), five lines: the recommended default
# The layer variants keep axum's body type (`inner_body()`, as the docs advise for axum).
# (BENCH_VARIANTS picks others: headers = the five lines as fixed values and no limiter; outer =
# the layer around the whole router; layer-2h = sliding window counter, two lines;
# layer-tb-2h-wrap = layer-tb-2h with the default body shape, which axum boxes.)
# Reports per round and as medians:
#   - server CPU µs per request (user + system, from /proc): what a server whose clients are
#     elsewhere pays per request; steadier than req/s when the machine is shared;
#   - what each adds over plain, and the layer's added CPU over governor's (the issue's target:
#     layer-tb-2h adds no more than governor), with the middle half of the per-round
#     differences (how far to trust the median) and the user CPU alone (the kernel's share is
#     the same sockets and syscalls for every variant, so it moves with scheduling, not code);
#   - requests/s: what wrk got; wrk shares the 2 cores, so this moves with the machine's load.
# Usage: [BENCH_PIN=1] [BENCH_VARIANTS="..."] scripts/bench-layer.sh [SECONDS per turn, default 3]
#        [ROUNDS, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${1:-3}"
ROUNDS="${2:-5}"
CONNS="${BENCH_CONNECTIONS:-32}"
read -r -a VARIANTS <<<"${BENCH_VARIANTS:-plain governor layer-tb-2h layer-tb layer}"
# BENCH_PIN=1: the servers on CPU 0 and wrk (one thread) on CPU 1, so that the server's workers
# never wait for wrk's: fewer context switches, and a kernel share that moves less.
SERVER_PIN="" WRK_PIN="" WRK_THREADS=2
if [ "${BENCH_PIN:-0}" = 1 ]; then
  SERVER_PIN="taskset -c 0" WRK_PIN="taskset -c 1" WRK_THREADS=1
fi

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
for v in "${VARIANTS[@]}"; do
  TOLLGATE_BENCH_SERVE=$v $SERVER_PIN "$BIN" --bench >"$WORK/$v.url" &
  PID[$v]=$!
  PIDS+=($!)
done
for v in "${VARIANTS[@]}"; do
  for _ in $(seq 100); do [ -s "$WORK/$v.url" ] && break; sleep 0.05; done
  URL[$v]="$(head -1 "$WORK/$v.url")"
done

# 1,000 API keys in turn, the same request bytes for every server.
cat >"$WORK/keys.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", nil, { ["x-api-key"] = "customer-" .. (n % 1000) })
end
LUA

TICK="$(getconf CLK_TCK)"
# User and system ticks of a process.
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
# Prints "req/s cpu-µs-per-request user-µs-per-request" for one turn against variant $1.
turn() {
  local user0 sys0 user1 sys1 out rps reqs
  read -r user0 sys0 < <(cpu_ticks "${PID[$1]}")
  out="$($WRK_PIN wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SECS}s" -s "$WORK/keys.lua" "${URL[$1]}")"
  read -r user1 sys1 < <(cpu_ticks "${PID[$1]}")
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  reqs="$(awk '/requests in/ {print $1}' <<<"$out")"
  if grep -q "Non-2xx" <<<"$out"; then echo "bench-layer: $1 answered non-2xx" >&2; exit 1; fi
  awk -v r="$rps" -v n="$reqs" -v u="$((user1 - user0))" -v s="$((sys1 - sys0))" -v hz="$TICK" \
    'BEGIN { printf "%.0f %.3f %.3f\n", r, (u + s) / hz * 1e6 / n, u / hz * 1e6 / n }'
}

for v in "${VARIANTS[@]}"; do turn "$v" >/dev/null; done # warm-up
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "server CPU µs per request (req/s), per round"
printf '%-6s' round; for v in "${VARIANTS[@]}"; do printf ' %20s' "$v"; done; echo
: >"$WORK/rounds"
for r in $(seq 1 "$ROUNDS"); do
  order=("${VARIANTS[@]}")
  # Rotate the order, so that none always gets the quieter moment.
  for _ in $(seq 1 $((r % ${#VARIANTS[@]}))); do order=("${order[@]:1}" "${order[0]}"); done
  declare -A RPS CPU USR
  for v in "${order[@]}"; do
    read -r RPS[$v] CPU[$v] USR[$v] < <(turn "$v")
  done
  printf '%-6s' "$r"
  line=""
  for v in "${VARIANTS[@]}"; do
    printf ' %11s (%6s)' "${CPU[$v]}" "${RPS[$v]}"
    line+="$v ${CPU[$v]} ${RPS[$v]} ${USR[$v]} "
  done
  echo
  echo "$line" >>"$WORK/rounds"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$WORK/rounds" <<'PY'
import statistics, sys
rounds = []
for line in open(sys.argv[1]):
    f = line.split()
    rounds.append({f[i]: tuple(map(float, f[i + 1:i + 4])) for i in range(0, len(f), 4)})
names = list(rounds[0])
med = statistics.median
print("\nmedians over %d rounds (added = this variant's CPU per request minus plain's, same round)" % len(rounds))
print("%-14s %12s %12s %14s %10s" % ("variant", "CPU µs/req", "added µs", "added user µs", "req/s"))
for n in names:
    cpu = med(r[n][0] for r in rounds)
    added = med(r[n][0] - r["plain"][0] for r in rounds) if "plain" in names else float("nan")
    user = med(r[n][2] - r["plain"][2] for r in rounds) if "plain" in names else float("nan")
    print("%-14s %12.2f %12.2f %14.2f %10.0f" % (n, cpu, added, user, med(r[n][1] for r in rounds)))
if "governor" in names and "plain" in names:
    gov = [r["governor"][0] - r["plain"][0] for r in rounds]
    for n in names:
        if n.startswith("layer"):
            ours = [r[n][0] - r["plain"][0] for r in rounds]
            diffs = sorted(o - g for o, g in zip(ours, gov))
            user = med(r[n][2] - r["governor"][2] for r in rounds)
            print("%s adds %.2f µs per request where governor adds %.2f (median per round); "
                  "difference %+.2f µs (median of per-round differences; middle half %+.2f to %+.2f), "
                  "user CPU alone %+.2f µs"
                  % (n, med(ours), med(gov), med(diffs), diffs[len(diffs) // 4],
                     diffs[(3 * len(diffs)) // 4], user))
PY
