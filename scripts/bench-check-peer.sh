#!/usr/bin/env bash
# Tollgate's decision API (`POST /v1/check` by policy and key) against throttlecrab-server's
# HTTP transport (`POST /throttle`), in the same run, over HTTP/1.1 keep-alive:
#   scripts/bench-check-peer.sh [SECONDS per run, default 5] [ROUNDS, default 5]
# Environment: BENCH_CONNECTIONS (64), KEYS (100000), THROTTLECRAB_SRC (a throttlecrab
# checkout; default: cloned into $CARGO_TARGET_DIR/throttlecrab-src, built there, never inside
# the repository), CHECK_QUERY (a query string, "?..." appended to Tollgate's path; empty by default).
#
# Both servers get the same quota, one neither reaches in a run, so every decision is admitted:
#   throttlecrab  {"key": K, "max_burst": 1000000, "count_per_period": 1000000, "period": 1,
#                  "quantity": 1}  (GCRA)
#   Tollgate      {"policy": "bench", "key": K, "cost": 1}, the policy a token bucket of
#                  capacity 1,000,000 refilled at 1,000,000/s (GCRA as well)
# Each round runs wrk (one thread, BENCH_CONNECTIONS connections, a Lua script) against both,
# alternating which goes first, with a random key of KEYS per request ("rnd") and with one hot
# key ("one"); and reads each server's CPU time (utime + stime of the whole process, from
# /proc/PID/stat) before and after each run. It prints every run: decisions/s, the share
# answered 2xx, the server's CPU microseconds per decision; then per workload the medians over
# the rounds, and the medians of the per-round ratios: Tollgate's decisions per CPU second over
# throttlecrab's (its CPU per decision over Tollgate's) and the same for decisions/s. Above 1
# favours Tollgate.
# Needs wrk (Debian: apt-get install -y wrk; installed when missing and running as root), and
# protoc to build throttlecrab-server (apt-get install -y protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN="${1:-5}"
ROUNDS="${2:-5}"
CONNS="${BENCH_CONNECTIONS:-64}"
KEYS="${KEYS:-100000}"
QUERY="${CHECK_QUERY:-}"
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"

if ! command -v wrk >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
  else
    echo "bench-check-peer: needs wrk (apt-get install -y wrk)" >&2
    exit 1
  fi
fi

echo "building tollgate (--profile profiling)..." >&2
cargo build --quiet --profile profiling -p tollgate-cli
ours_bin="$target/profiling/tollgate"

# shellcheck source=scripts/throttlecrab.sh
. scripts/throttlecrab.sh

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ours_port="$(free_port)"
admin_port="$(free_port)"
theirs_port="$(free_port)"

WORK="$(mktemp -d /tmp/tollgate-bench-check-peer.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/tollgate.toml" <<EOF
[server]
listen = "127.0.0.1:$ours_port"

[admin]
listen = "127.0.0.1:$admin_port"

[[policy]]
name = "bench"
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/s"
key = ["ip"]
EOF
# Each in a session of its own, so the kernel's autogroup scheduling shares the CPU between the
# servers and the load generator as between separate programs (see bench-proxy.sh).
TOLLGATE_LOG=warn setsid "$ours_bin" serve --config "$WORK/tollgate.toml" >"$WORK/tollgate.log" 2>&1 &
ours_pid=$!
pids+=("$ours_pid")
setsid "$theirs_bin" --http --http-host 127.0.0.1 --http-port "$theirs_port" --log-level error \
  >"$WORK/throttlecrab.log" 2>&1 &
theirs_pid=$!
pids+=("$theirs_pid")
for port in "$ours_port" "$theirs_port"; do
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "no server on $port" >&2; exit 1; }
done

# One Lua script per server and key shape; every request a POST with a JSON body.
lua() { # lua FILE PATH BODY-PREFIX BODY-SUFFIX random|one
  local key
  if [ "$5" = random ]; then key="math.random($KEYS)"; else key="42"; fi
  cat >"$1" <<EOF
math.randomseed(os.time())
request = function()
  local body = '$3' .. $key .. '$4'
  return wrk.format("POST", "$2", { ["content-type"] = "application/json" }, body)
end
EOF
}
for shape in random one; do
  lua "$WORK/tollgate-$shape.lua" "/v1/check$QUERY" \
    '{"policy":"bench","key":"customer-' '","cost":1}' "$shape"
  lua "$WORK/throttlecrab-$shape.lua" /throttle \
    '{"key":"customer-' '","max_burst":1000000,"count_per_period":1000000,"period":1,"quantity":1}' \
    "$shape"
done

clk_tck="$(getconf CLK_TCK)"
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }

# run SERVER SHAPE: one wrk run; prints and records "round shape server decisions/s 2xx cpu-us".
run() {
  local server="$1" shape="$2" port pid path before after out rps done bad
  if [ "$server" = tollgate ]; then
    port="$ours_port"; pid="$ours_pid"; path="/v1/check$QUERY"
  else
    port="$theirs_port"; pid="$theirs_pid"; path=/throttle
  fi
  before="$(ticks "$pid")"
  out="$(wrk -t1 -c"$CONNS" -d"${SECONDS_PER_RUN}s" -s "$WORK/$server-$shape.lua" \
    "http://127.0.0.1:$port$path" 2>&1)"
  after="$(ticks "$pid")"
  rps="$(awk '/Requests\/sec/ { print $2 }' <<<"$out")"
  done="$(awk '/requests in/ { print $1 }' <<<"$out")"
  bad="$(awk '/Non-2xx/ { print $NF }' <<<"$out" | grep . || echo 0)"
  awk -v round="$round" -v s="$server" -v k="$shape" -v r="${rps:-0}" -v d="${done:-0}" \
    -v bad="$bad" -v t=$((after - before)) -v hz="$clk_tck" 'BEGIN {
    cpu = d > 0 ? t * 1e6 / hz / d : 0
    ok = d > 0 ? (d - bad) / d * 100 : 0
    printf "%-5s %-6s %-12s %10.0f decisions/s %6.1f%% 2xx %7.2f us server CPU a decision\n", round, k, s, r, ok, cpu
    printf "%s %s %s %.0f %.2f %.3f\n", round, k, s, r, ok, cpu >> "'"$WORK"'/results"
  }'
}

echo "load before: $(uptime)"
echo "tollgate pid $ours_pid on :$ours_port, throttlecrab pid $theirs_pid on :$theirs_port;" \
  "$ROUNDS rounds of ${SECONDS_PER_RUN}s runs, wrk -t1 -c$CONNS; $(nproc) cores shared by both servers and wrk"
# Warm-up: connections, the stores' tables, the allocators.
for server in tollgate throttlecrab; do
  round=0
  run "$server" random >/dev/null
done
: >"$WORK/results"
echo "round keys server"
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order="tollgate throttlecrab"; else order="throttlecrab tollgate"; fi
  for shape in random one; do
    for server in $order; do run "$server" "$shape"; done
  done
done
echo "load after: $(uptime)"

echo
echo "medians over $ROUNDS rounds (wrk -t1 -c$CONNS, ${SECONDS_PER_RUN}s runs; $KEYS random keys, or one):"
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
for shape in random one; do
  col() { awk -v k="$shape" -v s="$1" -v c="$2" '$2 == k && $3 == s { print $c }' "$WORK/results"; }
  ratio() { # per round: tollgate's column $1 over throttlecrab's, or the inverse with "inv"
    awk -v k="$shape" -v c="$1" -v inv="${2:-}" '$2 == k { v[$1, $3] = $c; r[$1] = 1 }
      END { for (i in r) if (v[i, "tollgate"] > 0 && v[i, "throttlecrab"] > 0)
        print (inv ? v[i, "throttlecrab"] / v[i, "tollgate"] : v[i, "tollgate"] / v[i, "throttlecrab"]) }' "$WORK/results"
  }
  awk -v k="$shape" \
    -v orps="$(col tollgate 4 | median)" -v ocpu="$(col tollgate 6 | median)" \
    -v trps="$(col throttlecrab 4 | median)" -v tcpu="$(col throttlecrab 6 | median)" \
    -v cpu_ratio="$(ratio 6 inv | median)" -v rps_ratio="$(ratio 4 | median)" \
    -v cpu_lo="$(ratio 6 inv | sort -g | head -n1)" -v cpu_hi="$(ratio 6 inv | sort -g | tail -n1)" 'BEGIN {
    printf "%-6s tollgate %8.0f/s %6.2f us CPU | throttlecrab %8.0f/s %6.2f us CPU | decisions per CPU second x%.2f (rounds %.2f-%.2f), decisions/s x%.2f\n",
      k, orps, ocpu, trps, tcpu, cpu_ratio, cpu_lo, cpu_hi, rps_ratio
  }'
done
