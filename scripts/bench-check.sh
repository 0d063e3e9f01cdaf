#!/usr/bin/env bash
# POST /v1/check by policy over HTTP/2 with prior knowledge (h2load) against HTTP/1.1 (wrk), on
# one `tollgate serve` (memory store, one policy no run exhausts), in interleaved rounds:
#   h1 rnd   wrk, CONNS connections, a random key of 100,000 per request (Lua);
#   h1 one   wrk, CONNS connections, one key;
#   h2 mux   h2load, H2_CONNS connections x STREAMS streams (CONNS requests in flight), one key;
#   h2 1x1   h2load, CONNS connections x 1 stream (as wrk: no multiplexing), one key.
# h2load sends one request body throughout (it cannot vary it), hence the one-key runs of wrk
# beside its random keys: the key shape costs the server the same either way at this level.
# Each run prints decisions/s, the share that were 2xx, and the server's CPU time per decision
# (user + system of the whole process, from /proc/PID/stat); then the medians over the rounds.
# Needs wrk and h2load (Debian: apt-get install -y wrk nghttp2-client): installed when missing
# and running as root.
#
#   scripts/bench-check.sh [SECONDS per run, default 5] [ROUNDS, default 3]
#   BENCH_CONNECTIONS (64), BENCH_H2_CONNECTIONS (4), BENCH_PORT_BASE (18180)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN="${1:-5}"
ROUNDS="${2:-3}"
CONNS="${BENCH_CONNECTIONS:-64}"
H2_CONNS="${BENCH_H2_CONNECTIONS:-4}"
STREAMS=$((CONNS / H2_CONNS))
BASE="${BENCH_PORT_BASE:-18180}"
API=$((BASE + 1)); ADMIN=$((BASE + 2))

for tool in wrk:wrk h2load:nghttp2-client; do
  command -v "${tool%%:*}" >/dev/null && continue
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool#*:}" >/dev/null
  else
    echo "bench-check: needs ${tool%%:*} (apt-get install -y ${tool#*:})" >&2
    exit 1
  fi
done

WORK="$(mktemp -d /tmp/tollgate-bench-check.XXXXXX)"
PID=""
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  sleep 0.2
  rm -rf "$WORK"
}
trap cleanup EXIT

# The profiling profile: the release build with symbols, so callgrind and perf can read it.
echo "building tollgate (--profile profiling)..."
cargo build --profile profiling -q -p tollgate-cli
BIN="${CARGO_TARGET_DIR:-target}/profiling/tollgate"

cat >"$WORK/tollgate.toml" <<EOF
[server]
listen = "127.0.0.1:$API"

[admin]
listen = "127.0.0.1:$ADMIN"

[[policy]]
name = "bench"
algorithm = "sliding_window_counter"
limit = 4000000000
window = "1h"
key = ["ip"]
EOF
# In a session of its own, so the kernel's autogroup scheduling shares the CPU between it and
# the load generator as between two programs (see bench-proxy.sh).
TOLLGATE_LOG=warn setsid "$BIN" serve --config "$WORK/tollgate.toml" >"$WORK/server.log" 2>&1 &
PID=$!
sleep 0.2
if [ "$(cat "/proc/$PID/comm" 2>/dev/null)" != "tollgate" ]; then
  PID="$(pgrep -P "$PID" -x tollgate || echo "$PID")"
fi
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$API") 2>/dev/null && break
  sleep 0.05
done

BODY='{"policy":"bench","key":"customer-42","cost":1}'
printf '%s' "$BODY" >"$WORK/body.json"
cat >"$WORK/random.lua" <<'EOF'
-- POST /v1/check by policy, a random key of 100,000 per request.
math.randomseed(os.time())
request = function()
  local body = '{"policy":"bench","key":"customer-' .. math.random(100000) .. '","cost":1}'
  return wrk.format("POST", "/v1/check", { ["content-type"] = "application/json" }, body)
end
EOF
cat >"$WORK/one.lua" <<EOF
-- POST /v1/check by policy, one key: the request h2load sends.
request = function()
  return wrk.format("POST", "/v1/check", { ["content-type"] = "application/json" }, '$BODY')
end
EOF

URL="http://127.0.0.1:$API/v1/check"
TICK="$(getconf CLK_TCK)"
ticks() { sed 's/.*) //' "/proc/$PID/stat" | awk '{ print $12 + $13 }'; }

# run NAME KIND ARGS...: one run; prints and records "decisions/s 2xx-share cpu-us/decision".
run() {
  local name="$1" kind="$2"; shift 2
  local before after out rps done ok
  before="$(ticks)"
  out="$("$@" 2>&1)"
  after="$(ticks)"
  if [ "$kind" = wrk ]; then
    rps="$(awk '/Requests\/sec/ { print $2 }' <<<"$out")"
    done="$(awk '/requests in/ { print $1 }' <<<"$out")"
    ok=$((done - $(awk '/Non-2xx/ { print $NF }' <<<"$out" | grep . || echo 0)))
  else
    rps="$(awk '/^finished in/ { gsub(",", ""); print $4 }' <<<"$out")"
    done="$(awk '/^requests:/ { print $8 }' <<<"$out")"
    ok="$(awk '/^status codes:/ { print $3 }' <<<"$out")"
  fi
  echo "$out" >>"$WORK/$kind.log"
  awk -v n="$name" -v r="${rps:-0}" -v d="${done:-0}" -v ok="${ok:-0}" -v t=$((after - before)) -v hz="$TICK" 'BEGIN {
    cpu = d > 0 ? t * 1e6 / hz / d : 0
    share = d > 0 ? ok / d : 0
    printf "%-8s %12.0f decisions/s %7.1f%% 2xx %8.2f us server CPU a decision\n", n, r, share * 100, cpu
    printf "%s %.0f %.4f %.3f\n", n, r, share, cpu >> "'"$WORK"'/results"
  }'
}

wrk_run() { wrk -t1 -c"$CONNS" -d"${SECONDS_PER_RUN}s" -s "$WORK/$1.lua" "$URL"; }
h2_run() {
  h2load -t1 -c "$1" -m "$2" -D "$SECONDS_PER_RUN" -d "$WORK/body.json" \
    -H 'content-type: application/json' "$URL"
}

echo "load before: $(uptime)"
echo "tollgate pid $PID on 127.0.0.1:$API; $ROUNDS rounds of ${SECONDS_PER_RUN}s runs; $(nproc) cores shared by server and load generator"
# Warm-up: connections, the store's tables, the allocator.
wrk -t1 -c"$CONNS" -d1s -s "$WORK/random.lua" "$URL" >/dev/null 2>&1 || true
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round"
  run "h1-rnd" wrk wrk_run random
  run "h2-mux" h2 h2_run "$H2_CONNS" "$STREAMS"
  run "h1-one" wrk wrk_run one
  run "h2-1x1" h2 h2_run "$CONNS" 1
done
echo "load after: $(uptime)"

echo
echo "medians over $ROUNDS rounds (h1: wrk, $CONNS connections; h2 mux: h2load, $H2_CONNS x $STREAMS streams; h2 1x1: $CONNS x 1):"
for name in h1-rnd h1-one h2-mux h2-1x1; do
  rates="$(awk -v n="$name" '$1 == n { print $2 }' "$WORK/results" | sort -g)"
  cpus="$(awk -v n="$name" '$1 == n { print $4 }' "$WORK/results" | sort -g)"
  paste <(echo "$rates") <(echo "$cpus") | awk -v n="$name" '
    { r[NR] = $1; c[NR] = $2 }
    END {
      m = int((NR + 1) / 2)
      printf "%-8s %9.0f decisions/s (runs %.0f-%.0f)  %6.2f us server CPU a decision (runs %.2f-%.2f)\n", n, r[m], r[1], r[NR], c[m], c[1], c[NR]
    }'
done
