#!/usr/bin/env bash
# What a policy feature costs the reverse proxy: CPU time per request of `tollgate serve` with
# one policy against another, under the same wrk load, on loopback.
#
#   scripts/bench-policy-cost.sh [SECONDS per run, default 10] [--rounds N, default 3] PAIR...
#
# PAIR names a comparison (the first variant is the baseline):
#   concurrency   one token_bucket policy        vs one concurrency policy (limit never reached)
#   usage         fixed_window, charged up front vs charge = "response" with cost_from =
#                 "json:usage.total_tokens", on a 4 KiB JSON answer
#   usage-stream  the same, the answer an event stream of 64 events (first byte timing too)
#   traces        traces off vs [telemetry] exporting 1% of decisions to an OTLP receiver
#                 (crates/server/examples/otlp_sink.rs, started here)
#
# Each variant runs in its own tollgate process; rounds interleave the variants, and the figure
# is the median over rounds of CPU microseconds per request (the process's user + system time
# from /proc, over the requests wrk completed), with the ratio to the baseline. Needs wrk and
# nginx (the upstream); installs them when missing and running as root.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10
ROUNDS=3
PAIRS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    [0-9]*) DURATION="$1"; shift ;;
    *) PAIRS+=("$1"); shift ;;
  esac
done
[ ${#PAIRS[@]} -eq 0 ] && PAIRS=(concurrency usage usage-stream traces)
CONNS="${BENCH_CONNECTIONS:-32}"
BASE="${BENCH_PORT_BASE:-19080}"
UP=$((BASE + 1))

for tool in wrk nginx; do
  if ! command -v "$tool" >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light >/dev/null
    else
      echo "bench-policy-cost: needs wrk and nginx (apt-get install -y wrk nginx-light)" >&2
      exit 1
    fi
  fi
done

WORK="$(mktemp -d /tmp/tollgate-policy-cost.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$WORK/upstream.pid" ] && kill "$(cat "$WORK/upstream.pid")" 2>/dev/null || true
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "building tollgate (release)..."
cargo build --release -q -p tollgate-cli
BIN="${CARGO_TARGET_DIR:-target}/release/tollgate"
SINK_PORT=$((BASE + 2))
if printf '%s\n' "${PAIRS[@]}" | grep -qx traces; then
  cargo build --release -q -p tollgate-server --example otlp_sink
  "${CARGO_TARGET_DIR:-target}/release/examples/otlp_sink" "127.0.0.1:$SINK_PORT" 2>"$WORK/sink.log" &
  PIDS+=("$!")
fi

# The upstream: a JSON answer of 4 KiB with the usage at its end, and an event stream of 64
# events whose last carries it (as an LLM API answers).
python3 - "$WORK" <<'EOF'
import json, sys
work = sys.argv[1]
filler = "x" * 60
body = {"id": "chatcmpl-1", "choices": [{"index": i, "text": filler} for i in range(48)]}
text = json.dumps(body)[:-1]
text = text + ', "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}}'
text = text + " " * max(0, 4096 - len(text))
open(f"{work}/answer.json", "w").write(text)
events = "".join(f'data: {{"choices":[{{"delta":{{"content":"{filler}"}}}}]}}\n\n' for _ in range(63))
events += 'data: {"choices":[],"usage":{"total_tokens":30}}\n\ndata: [DONE]\n\n'
open(f"{work}/answer.sse", "w").write(events)
EOF
mkdir -p "$WORK/upstream/logs"
cat >"$WORK/upstream.conf" <<EOF
worker_processes 1;
pid $WORK/upstream.pid;
error_log $WORK/upstream/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$UP reuseport;
    location /json { default_type application/json; alias $WORK/answer.json; }
    location /sse { default_type text/event-stream; alias $WORK/answer.sse; }
    location / { return 200 "ok\n"; }
  }
}
EOF
nginx -c "$WORK/upstream.conf" -p "$WORK/upstream" -e "$WORK/upstream/logs/error.log"

# variant NAME: the policy text of a variant.
variant() {
  case "$1" in
    token_bucket) printf 'algorithm = "token_bucket"\ncapacity = 1000000000\nrefill = "1000000/s"\n' ;;
    concurrency) printf 'algorithm = "concurrency"\nlimit = 100000\n' ;;
    up_front) printf 'algorithm = "fixed_window"\nlimit = 2000000000\nwindow = "1h"\n' ;;
    by_response) printf 'algorithm = "fixed_window"\nlimit = 2000000000\nwindow = "1h"\ncharge = "response"\ncost_from = "json:usage.total_tokens"\n' ;;
    untraced|traced_1pct) printf 'algorithm = "token_bucket"\ncapacity = 1000000000\nrefill = "1000000/s"\n' ;;
  esac
}

# telemetry NAME: the [telemetry] section of a variant.
telemetry() {
  case "$1" in
    traced_1pct) printf '[telemetry]\notlp_endpoint = "http://127.0.0.1:%s"\nsample_ratio = 0.01\n' "$SINK_PORT" ;;
  esac
}

# start NAME PORT: a tollgate proxy on PORT with variant NAME; prints its pid.
start() {
  local name="$1" port="$2" conf="$WORK/$1.toml"
  cat >"$conf" <<EOF
[server]
listen = "127.0.0.1:$((port + 100))"
[admin]
listen = "127.0.0.1:$((port + 200))"
[proxy]
listen = "127.0.0.1:$port"
upstream = "http://127.0.0.1:$UP"
$(telemetry "$name")
[[policy]]
name = "api"
key = ["header:x-api-key", "ip"]
$(variant "$name")
EOF
  TOLLGATE_LOG=warn "$BIN" serve --config "$conf" >/dev/null 2>&1 &
  echo $!
}

# cpu_ticks PID: user + system clock ticks so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run PORT PID PATH: CPU µs per request for one wrk run.
run() {
  local port="$1" pid="$2" path="$3" before after out reqs
  before=$(cpu_ticks "$pid")
  out=$(wrk -t2 -c"$CONNS" -d"${DURATION}s" -H 'x-api-key: bench' "http://127.0.0.1:$port$path")
  after=$(cpu_ticks "$pid")
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  awk -v t=$((after - before)) -v r="$reqs" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.2f", t / hz * 1e6 / r }'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

compare() {
  local pair="$1" a b path
  case "$pair" in
    concurrency) a=token_bucket; b=concurrency; path=/ ;;
    usage) a=up_front; b=by_response; path=/json ;;
    usage-stream) a=up_front; b=by_response; path=/sse ;;
    traces) a=untraced; b=traced_1pct; path=/ ;;
    *) echo "unknown pair $pair" >&2; exit 1 ;;
  esac
  local pa=$((BASE + 10)) pb=$((BASE + 11)) ida idb
  ida=$(start "$a" $pa); PIDS+=("$ida")
  idb=$(start "$b" $pb); PIDS+=("$idb")
  for p in $pa $pb; do
    for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$p$path" && break; sleep 0.1; done
  done
  local ra=() rb=() ratios=()
  for r in $(seq "$ROUNDS"); do
    local x y
    x=$(run $pa "$ida" "$path"); y=$(run $pb "$idb" "$path")
    ra+=("$x"); rb+=("$y")
    ratios+=("$(awk -v x="$x" -v y="$y" 'BEGIN { printf "%.3f", y / x }')")
    echo "  round $r: $a $x µs/req, $b $y µs/req"
  done
  printf '%s: %s %s µs/req, %s %s µs/req, ratio %s (median of per-round ratios)\n' "$pair" \
    "$a" "$(printf '%s\n' "${ra[@]}" | median)" "$b" "$(printf '%s\n' "${rb[@]}" | median)" \
    "$(printf '%s\n' "${ratios[@]}" | median)"
  if [ "$pair" = usage-stream ]; then
    for v in "$a:$pa" "$b:$pb"; do
      local t
      t=$(for _ in $(seq 200); do curl -s -o /dev/null -w '%{time_starttransfer}\n' "http://127.0.0.1:${v#*:}$path"; done | median)
      echo "  ${v%%:*}: time to first byte, median of 200: ${t}s"
    done
  fi
  kill "$ida" "$idb" 2>/dev/null || true
  sleep 0.5
}

for pair in "${PAIRS[@]}"; do
  echo "== $pair (${DURATION}s runs, $ROUNDS rounds, $CONNS connections)"
  compare "$pair"
done
