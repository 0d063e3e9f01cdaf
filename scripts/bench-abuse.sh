#!/usr/bin/env bash
# What lockouts and allow/deny lists cost the reverse proxy, per request:
#   base        a policy every request passes (the admit-all run of bench-proxy.sh)
#   list100k    the same, with a deny list of 100,000 entries (IPv4 /32s and /24s, IPv6 /64s)
#               that the client is not on: every request is looked up in it
#   ban         the same policy with ban = { after = 5, within = "10m", for = "1h" }
#   refuse      every request on an exhausted key (one an hour): refused by the quota
#   refuse+ban  the same with a ban that never starts (after = 4294967295): every denial is
#               counted in the key's lockout record
#   banned      the same with ban after 5: the key is banned, refused by its ban
#
# Two measures, each against the same binary and upstream:
#   instructions per request: callgrind on the proxy, between two dumps around N requests of a
#   keep-alive client (load-independent: what the ±5% targets are judged by);
#   CPU time per request: wrk against each configuration in interleaved rounds, the proxy's own
#   user+system time from /proc (moves with the machine's load; shown for scale).
# Needs valgrind, wrk, nginx (Debian: apt-get install -y valgrind wrk nginx-light) and python3.
# Usage: scripts/bench-abuse.sh [REQUESTS under callgrind, default 3000] [--rounds N] [--seconds S]
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS=3000
ROUNDS=3
SECONDS_PER_RUN=5
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --seconds) SECONDS_PER_RUN="${2:?}"; shift 2 ;;
    *) REQUESTS="$1"; shift ;;
  esac
done
BASE="${BENCH_PORT_BASE:-19080}"
UP=$((BASE + 1))
for c in valgrind callgrind_control wrk nginx python3; do
  command -v "$c" >/dev/null || { echo "bench-abuse: needs $c" >&2; exit 1; }
done

WORK="$(mktemp -d /tmp/tollgate-abuse.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$WORK/upstream.pid" ] && kill "$(cat "$WORK/upstream.pid")" 2>/dev/null || true
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "building tollgate (--profile profiling)..."
cargo build --profile profiling -q -p tollgate-cli
BIN="${CARGO_TARGET_DIR:-target}/profiling/tollgate"

mkdir -p "$WORK/upstream/logs"
cat >"$WORK/upstream.conf" <<EOF
worker_processes 1;
pid $WORK/upstream.pid;
error_log $WORK/upstream/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$UP; location / { return 200 "ok\n"; } }
}
EOF
nginx -c "$WORK/upstream.conf" -p "$WORK/upstream" -e "$WORK/upstream/logs/error.log"

# config NAME PORT: the configuration of run NAME, its proxy on PORT (admin and API beside it).
config() {
  local name="$1" port="$2" limit=4000000000 window="1s" ban=""
  case "$name" in
    refuse*|banned) limit=1; window="1h" ;;
  esac
  case "$name" in
    ban) ban='ban = { after = 5, within = "10m", for = "1h" }' ;;
    refuse+ban) ban='ban = { after = 4294967295, within = "10m", for = "1h" }' ;;
    banned) ban='ban = { after = 5, within = "10m", for = "1h" }' ;;
  esac
  cat <<EOF
[server]
listen = "127.0.0.1:$((port + 1))"
[admin]
listen = "127.0.0.1:$((port + 2))"
[proxy]
listen = "127.0.0.1:$port"
upstream = "http://127.0.0.1:$UP"
[[policy]]
name = "api"
algorithm = "fixed_window"
limit = $limit
window = "$window"
key = ["header:x-api-key", "ip"]
$ban
EOF
  if [ "$name" = list100k ]; then
    python3 - <<'PY'
import random
random.seed(7)
entries = set()
while len(entries) < 90_000:
    a, b, c, d = 10, random.randrange(256), random.randrange(256), random.randrange(256)
    entries.add(f"{a}.{b}.{c}.{d}" if random.random() < 0.8 else f"{a}.{b}.{c}.0/24")
while len(entries) < 100_000:
    entries.add("2001:db8:%x:%x::/64" % (random.randrange(65536), random.randrange(65536)))
print('[[list]]\nname = "blocked"\naction = "deny"\nips = [')
print(",\n".join(f'  "{e}"' for e in sorted(entries)))
print("]")
PY
  fi
}

wait_port() {
  for _ in $(seq 1 3000); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return
    sleep 0.1
  done
  echo "bench-abuse: nothing listens on $1" >&2
  exit 1
}

# A keep-alive client sending N requests with an API key (the refuse runs' exhausted key).
cat >"$WORK/client.py" <<'PY'
import http.client, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
for _ in range(n):
    c.request("GET", "/", headers={"x-api-key": "hot"})
    c.getresponse().read()
PY

RUNS=(base list100k ban refuse refuse+ban banned)
# What each run is compared with: the same traffic without the feature.
against() { case "$1" in refuse+ban|banned) echo refuse ;; base|refuse) echo "$1" ;; *) echo base ;; esac; }
echo "# instructions per proxied request (callgrind, $REQUESTS requests after 200 to warm up)"
printf '%-12s %14s %10s\n' run "instr/req" "vs without"
declare -A INSTR
port=$((BASE + 10))
for name in "${RUNS[@]}"; do
  config "$name" "$port" >"$WORK/$name.toml"
  TOLLGATE_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$name.%p" \
    "$BIN" serve --config "$WORK/$name.toml" >/dev/null 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_port "$port"
  python3 "$WORK/client.py" "$port" 200
  callgrind_control -z "$pid" >/dev/null
  python3 "$WORK/client.py" "$port" "$REQUESTS"
  callgrind_control -d "$pid" >/dev/null
  sleep 0.5
  dump="$(ls -t "$WORK"/cg."$name".* | head -1)"
  total="$(awk '/^summary:/ {print $2}' "$dump")"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  INSTR[$name]=$((total / REQUESTS))
  printf '%-12s %14s %10s\n' "$name" "${INSTR[$name]}" \
    "$(awk -v a="${INSTR[$name]}" -v b="${INSTR[$(against "$name")]}" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }')"
  port=$((port + 10))
done

# The same configurations served natively, for wrk.
declare -A PORT PID
port=$((BASE + 100))
for name in "${RUNS[@]}"; do
  TOLLGATE_LOG=warn setsid "$BIN" serve --config "$WORK/$name.toml" >/dev/null 2>&1 &
  PID[$name]=$!
  PIDS+=("${PID[$name]}")
  PORT[$name]="$(awk -F'[":]' '/^\[proxy\]/ {p = 1} p && /^listen/ {print $(NF-1); exit}' "$WORK/$name.toml")"
done
for name in "${RUNS[@]}"; do wait_port "${PORT[$name]}"; done
cat >"$WORK/key.lua" <<'EOF'
request = function() return wrk.format("GET", "/", { ["x-api-key"] = "hot" }) end
EOF
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
HZ="$(getconf CLK_TCK)"
echo "# CPU per request (the proxy's user+system time), wrk 2 threads 32 connections, ${SECONDS_PER_RUN}s, $ROUNDS interleaved rounds; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  for name in "${RUNS[@]}"; do
    before="$(ticks "${PID[$name]}")"
    out="$(wrk -t2 -c32 -d"${SECONDS_PER_RUN}s" -s "$WORK/key.lua" "http://127.0.0.1:${PORT[$name]}/" 2>&1)"
    after="$(ticks "${PID[$name]}")"
    reqs="$(awk '/requests in/ {print $1}' <<<"$out")"
    awk -v t=$((after - before)) -v hz="$HZ" -v n="$reqs" -v name="$name" \
      'BEGIN { printf "%.3f\n", t * 1e6 / hz / n }' >>"$WORK/cpu.$name"
  done
done
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
printf '%-12s %14s %10s %s\n' run "cpu µs/req" "vs without" "(per round)"
for name in "${RUNS[@]}"; do
  m="$(median <"$WORK/cpu.$name")"
  ref="$(median <"$WORK/cpu.$(against "$name")")"
  printf '%-12s %14s %10s (%s)\n' "$name" "$m" \
    "$(awk -v a="$m" -v b="$ref" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }')" \
    "$(paste -sd' ' "$WORK/cpu.$name")"
done
