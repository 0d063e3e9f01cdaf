#!/usr/bin/env bash
# Benchmarks Tollgate's reverse proxy and decision API against nginx, on loopback only:
#   (a) admit-all: tollgate proxy vs nginx proxy_pass + limit_req, same tiny upstream
#       (a separate nginx `return 200`), plus the upstream alone as the ceiling;
#   (b) 90% refused: 9 in 10 requests carry an exhausted API key, 1 in 10 a fresh one;
#   (c) POST /v1/check decisions per second with the memory store.
# Needs wrk and nginx (Debian: apt-get install -y wrk nginx-light); installs them when missing
# and running as root.
# Usage: scripts/bench-proxy.sh [SECONDS per run, default 10] [--rounds N] [--wire]
# With --rounds N, the (a) and (b) runs are repeated N times, interleaved (upstream, nginx,
# tollgate, nginx, tollgate, ...), and the medians and the per-round tollgate/nginx ratios are
# printed: on a shared, noisy machine only runs taken side by side compare.
# With --wire, each run is also captured with tcpdump at the port under test, and the latency
# from a request's arrival to its answer's departure is reported "on the wire": the proxy's own
# latency (upstream leg included), without the load generator's. On two shared cores, wrk's p99
# is as much wrk's scheduling as the server's. The capture costs CPU: compare req/s without it.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=10
ROUNDS=1
WIRE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    --rounds=*) ROUNDS="${1#--rounds=}"; shift ;;
    --wire) WIRE=1; shift ;;
    *) DURATION="$1"; shift ;;
  esac
done
THREADS="${BENCH_THREADS:-2}"
CONNS="${BENCH_CONNECTIONS:-64}"
# Ports: override with BENCH_PORT_BASE if these are taken.
BASE="${BENCH_PORT_BASE:-18080}"
UP=$((BASE + 1)); NGX=$((BASE + 2)); TGP=$((BASE + 3)); TGA=$((BASE + 4)); TGM=$((BASE + 5))
TGP90=$((BASE + 6)); TGA90=$((BASE + 7)); TGM90=$((BASE + 8))

# need PACKAGES -- COMMANDS...: installs the Debian PACKAGES when a COMMAND is missing (as root).
need() {
  local pkgs=() c
  while [ "$1" != "--" ]; do pkgs+=("$1"); shift; done
  shift
  for c in "$@"; do
    command -v "$c" >/dev/null && continue
    if [ "$(id -u)" -eq 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
      return
    fi
    echo "bench-proxy: needs $* (apt-get install -y ${pkgs[*]})" >&2
    exit 1
  done
}
need wrk nginx-light -- wrk nginx
[ "$WIRE" = 1 ] && need tcpdump -- tcpdump
NGINX="$(command -v nginx)"

WORK="$(mktemp -d /tmp/tollgate-bench.XXXXXX)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  [ -f "$WORK/upstream.pid" ] && kill "$(cat "$WORK/upstream.pid")" 2>/dev/null || true
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

# The profiling profile: the release build with symbols, so callgrind and perf can read it.
echo "building tollgate (--profile profiling)..."
cargo build --profile profiling -q -p tollgate-cli
BIN="${CARGO_TARGET_DIR:-target}/profiling/tollgate"

# nginx: the upstream (return 200) and the comparison proxy with limit_req, as two instances:
# in one, the proxy's workers would also serve the upstream, and a request could go from proxy
# to upstream without leaving its process, which tollgate's requests cannot. Both proxies talk to
# the same separate upstream.
mkdir -p "$WORK/nginx/logs" "$WORK/upstream/logs"
cat >"$WORK/upstream.conf" <<EOF
worker_processes auto;
pid $WORK/upstream.pid;
error_log $WORK/upstream/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    # reuseport: the kernel spreads the proxies' upstream connections over the upstream's
    # workers. Without it, a proxy that opens its connections in a burst (as both do when wrk
    # starts) can find all of them accepted by one worker: the comparison would measure
    # accept luck.
    listen 127.0.0.1:$UP reuseport;
    location / { return 200 "ok\n"; }
  }
}
EOF
cat >"$WORK/nginx.conf" <<EOF
worker_processes auto;
pid $WORK/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  limit_req_zone \$binary_remote_addr zone=all:10m rate=1000000r/s;
  limit_req_zone \$http_x_api_key zone=perkey:10m rate=1r/m;
  upstream backend { server 127.0.0.1:$UP; keepalive 256; }
  server {
    listen 127.0.0.1:$NGX;
    limit_req_status 429;
    location /refuse {
      limit_req zone=perkey;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_pass http://backend;
    }
    location / {
      limit_req zone=all burst=1000000 nodelay;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_pass http://backend;
    }
  }
}
EOF
"$NGINX" -c "$WORK/upstream.conf" -p "$WORK/upstream" -e "$WORK/upstream/logs/error.log"
"$NGINX" -c "$WORK/nginx.conf" -p "$WORK/nginx" -e "$WORK/nginx/logs/error.log"

# Tollgate, admit-all: a policy on every request whose quota is never reached.
cat >"$WORK/admit-all.toml" <<EOF
[server]
listen = "127.0.0.1:$TGA"
[admin]
listen = "127.0.0.1:$TGM"
[proxy]
listen = "127.0.0.1:$TGP"
upstream = "http://127.0.0.1:$UP"
[[policy]]
name = "api"
algorithm = "sliding_window_counter"
limit = 4000000000
window = "1s"
key = ["header:x-api-key", "ip"]
EOF
# Tollgate, refusing: one request per key per hour.
cat >"$WORK/refuse.toml" <<EOF
[server]
listen = "127.0.0.1:$TGA90"
[admin]
listen = "127.0.0.1:$TGM90"
[proxy]
listen = "127.0.0.1:$TGP90"
upstream = "http://127.0.0.1:$UP"
[[policy]]
name = "per-key"
algorithm = "fixed_window"
limit = 1
window = "1h"
key = ["header:x-api-key", "ip"]
EOF
# Each server in a session of its own, as nginx is once it daemonizes. With the kernel's
# autogroup scheduling (on by default on desktop and many server kernels: see
# /proc/sys/kernel/sched_autogroup_enabled), CPU time is shared out between sessions first: a
# Tollgate started from this script would share one session's share with wrk, while nginx, in a
# session of its own, competes with wrk as an equal. That handicap cost Tollgate about a tenth of
# its throughput here and gave it 20-100 ms p99 spikes that nginx never had.
# serve_alone CONFIG: starts tollgate in its own session; prints its PID.
serve_alone() {
  TOLLGATE_LOG=warn setsid "$BIN" serve --config "$1" >/dev/null &
  local pid=$!
  # setsid execs the server in place unless it had to fork; then the server is its child.
  sleep 0.2
  if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != "tollgate" ]; then
    pid="$(pgrep -P "$pid" -x tollgate || echo "$pid")"
  fi
  echo "$pid"
}
TG_PID="$(serve_alone "$WORK/admit-all.toml")"
PIDS+=("$TG_PID")
TG90_PID="$(serve_alone "$WORK/refuse.toml")"
PIDS+=("$TG90_PID")
for port in $UP $NGX $TGP $TGA $TGP90; do
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.05
  done
done

cat >"$WORK/refuse90.lua" <<'EOF'
-- 9 in 10 requests reuse an exhausted key; 1 in 10 brings a fresh key (admitted).
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
-- The servers keep their counts from one round to the next: a fresh key must be new to every
-- run of wrk, or later rounds refuse all requests (Tollgate's window is an hour) or some
-- (nginx's 1r/m) instead of nine in ten.
local run = os.time()
local n = 0
request = function()
  n = n + 1
  local key = "hot"
  if n % 10 == 0 then key = "r" .. run .. "-t" .. id .. "-" .. n end
  return wrk.format("GET", wrk.path, { ["x-api-key"] = key })
end
EOF
cat >"$WORK/check.lua" <<'EOF'
-- POST /v1/check by policy and key, over 10,000 keys.
local n = 0
request = function()
  n = n + 1
  local body = '{"policy":"api","key":"customer-' .. (n % 10000) .. '","cost":1}'
  return wrk.format("POST", "/v1/check", { ["content-type"] = "application/json" }, body)
end
EOF

# Latency as wrk prints it (850.00us, 1.20ms, 2.00s) in milliseconds.
to_ms() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) n = n / 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n = n * 1000
    printf "%.3f", n
  }'
}

# The proxy's own CPU time per request is the figure the machine's noise moves least: wrk, the
# upstream and the proxy share two cores, so a run's req/s also depends on how the scheduler
# happened to share them out.
NGX_WORKERS="$(pgrep -P "$(cat "$WORK/nginx.pid")" | paste -sd' ')"
# cpu_ticks PID...: "total user": clock ticks used so far by the processes PIDS (all threads),
# user + system and user alone.
cpu_ticks() {
  local p t=0 u=0 f
  for p in "$@"; do
    f="$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null)" || continue
    t=$((t + $(awk '{print $12 + $13}' <<<"$f")))
    u=$((u + $(awk '{print $12}' <<<"$f")))
  done
  echo "$t $u"
}
TICK="$(getconf CLK_TCK)"

# wire PCAP PORT: "p50 p99" in ms, from each request reaching PORT to its answer leaving it.
wire() {
  tcpdump -r "$1" -tt -n 2>/dev/null | awk -v port="$2" '
    { split($3, s, "."); split($5, d, "."); sp = s[5]; dp = d[5]; sub(":", "", dp)
      if ($NF + 0 == 0) next
      if (dp == port) at[sp] = $1
      else if (sp == port && (dp in at)) { print ($1 - at[dp]) * 1000; delete at[dp] } }' |
    sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "- -"; else printf "%.3f %.3f\n", a[int(NR * 0.5) + 1], a[int(NR * 0.99) + 1] }'
}

printf '%-44s %12s %10s %10s %10s %10s %10s' "run" "req/s" "p50" "p99" "non-2xx" "cpu/req" "user/req"
[ "$WIRE" = 1 ] && printf ' %10s %10s' "wire p50" "wire p99"
printf '\n'

# run KEY NAME PIDS WRK-ARGS...: one wrk run, printed, and recorded under KEY for the summary;
# PIDS (space-separated, may be empty) are the processes whose CPU time per request is shown.
run() {
  local key="$1" name="$2" pids="$3"; shift 3
  local out before after ub ua url="${*: -1}" port tp="" w="- -"
  port="${url#http://127.0.0.1:}"; port="${port%%/*}"
  if [ "$WIRE" = 1 ]; then
    rm -f "$WORK/cap.pcap"
    tcpdump -i lo -s 128 -B 131072 -w "$WORK/cap.pcap" "tcp port $port" >/dev/null 2>&1 &
    tp=$!
    sleep 0.5
  fi
  # shellcheck disable=SC2086
  read -r before ub <<<"$(cpu_ticks $pids)"
  out="$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "$@" 2>&1)"
  # shellcheck disable=SC2086
  read -r after ua <<<"$(cpu_ticks $pids)"
  if [ -n "$tp" ]; then
    sleep 0.2
    kill -INT "$tp" 2>/dev/null || true
    wait "$tp" 2>/dev/null || true
    w="$(wire "$WORK/cap.pcap" "$port")"
  fi
  local rps p50 p99 non2xx reqs cpu="-" user="-"
  rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")"
  p50="$(awk '$1=="50%" {print $2}' <<<"$out")"
  p99="$(awk '$1=="99%" {print $2}' <<<"$out")"
  non2xx="$(awk '/Non-2xx/ {print $NF}' <<<"$out")"
  reqs="$(awk '/requests in/ {print $1}' <<<"$out")"
  if [ -n "$pids" ] && [ "${reqs:-0}" -gt 0 ]; then
    cpu="$(awk -v t=$((after - before)) -v hz="$TICK" -v n="$reqs" 'BEGIN { printf "%.2fus", t * 1e6 / hz / n }')"
    user="$(awk -v t=$((ua - ub)) -v hz="$TICK" -v n="$reqs" 'BEGIN { printf "%.2fus", t * 1e6 / hz / n }')"
  fi
  printf '%-44s %12s %10s %10s %10s %10s %10s' "$name" "$rps" "$p50" "$p99" "${non2xx:-0}" "$cpu" "$user"
  [ "$WIRE" = 1 ] && printf ' %9sms %9sms' ${w}
  printf '\n'
  echo "$out" >>"$WORK/wrk.log"
  echo "${rps:-0} $(to_ms "${p50:-0ms}") $(to_ms "${p99:-0ms}") ${cpu%us} ${w} ${user%us}" >>"$WORK/res.$key"
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# col KEY N: column N of every run recorded under KEY.
col() { awk -v c="$2" '{ print $c }' "$WORK/res.$1"; }
# ratios A B N: per round, column N of A's runs over B's (1 req/s, 3 p99, 4 cpu/req).
ratios() { paste -d' ' <(col "$1" "$3") <(col "$2" "$3") | awk '{ if ($2 > 0) printf "%.3f\n", $1 / $2 }'; }

for round in $(seq 1 "$ROUNDS"); do
  [ "$ROUNDS" -gt 1 ] && echo "# round $round of $ROUNDS"
  echo "# (a) admit-all, ${DURATION}s each, $THREADS threads, $CONNS connections"
  run up "upstream alone (nginx return 200)" "" "http://127.0.0.1:$UP/"
  run ngx "nginx proxy_pass + limit_req" "$NGX_WORKERS" "http://127.0.0.1:$NGX/"
  run tg "tollgate proxy (admit-all policy)" "$TG_PID" "http://127.0.0.1:$TGP/"
  echo "# (b) 90% refused (9 in 10 requests on an exhausted key)"
  run ngx90 "nginx limit_req, 90% refused" "$NGX_WORKERS" -s "$WORK/refuse90.lua" "http://127.0.0.1:$NGX/refuse"
  run tg90 "tollgate proxy, 90% refused" "$TG90_PID" -s "$WORK/refuse90.lua" "http://127.0.0.1:$TGP90/"
done
echo "# (c) decision API"
run check "tollgate POST /v1/check (memory store)" "$TG_PID" -s "$WORK/check.lua" "http://127.0.0.1:$TGA"

if [ "$ROUNDS" -gt 1 ]; then
  echo "# medians over $ROUNDS interleaved rounds (latencies in ms; cpu/req: the proxy's own CPU time per request, user/req: the part of it in user space)"
  printf '%-44s %12s %10s %10s %10s %10s\n' "run" "req/s" "p50" "p99" "cpu/req" "user/req"
  for pair in "up:upstream alone" "ngx:nginx proxy_pass + limit_req" "tg:tollgate proxy (admit-all)" \
              "ngx90:nginx, 90% refused" "tg90:tollgate, 90% refused"; do
    key="${pair%%:*}"
    printf '%-44s %12s %10s %10s %10s %10s\n' "${pair#*:}" "$(col "$key" 1 | median)" \
      "$(col "$key" 2 | median)" "$(col "$key" 3 | median)" "$(col "$key" 4 | median)" "$(col "$key" 7 | median)"
  done
  for pair in "tg:ngx:admit-all" "tg90:ngx90:90% refused"; do
    IFS=: read -r a b label <<<"$pair"
    echo "tollgate/nginx, $label: req/s per round $(ratios "$a" "$b" 1 | paste -sd' ') -> median $(ratios "$a" "$b" 1 | median)"
    echo "  p99 per round $(ratios "$a" "$b" 3 | paste -sd' ') -> median $(ratios "$a" "$b" 3 | median) (below 1: tollgate's tail is shorter)"
    echo "  cpu/req per round $(ratios "$a" "$b" 4 | paste -sd' ') -> median $(ratios "$a" "$b" 4 | median) (below 1: tollgate spends less)"
    echo "  user/req per round $(ratios "$a" "$b" 7 | paste -sd' ') -> median $(ratios "$a" "$b" 7 | median) (the kernel's TCP work, the same for both, is the rest)"
    if [ "$WIRE" = 1 ]; then
      echo "  wire p99 per round $(ratios "$a" "$b" 6 | paste -sd' ') -> median $(ratios "$a" "$b" 6 | median) (tollgate $(col "$a" 6 | median) ms, nginx $(col "$b" 6 | median) ms)"
    fi
  done
fi
echo "(machine: $(nproc) cores; wrk shares them with the servers)"
