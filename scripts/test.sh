#!/usr/bin/env bash
# The whole test suite, on a fresh Debian/Ubuntu machine with Rust installed:
#   scripts/test.sh
# Installs what the tests need when it is missing (redis-server and redis-cli: the Redis tests
# start their own servers on free loopback ports; python3 with urllib3 for the Retry-After
# client test; openssl for the Redis TLS test; chromium for the replay report's browser test), then runs every test, example and benchmark build of the workspace, and the
# doc tests.
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
# The replay's HTML report is opened in headless Chromium (crates/replay/tests/browser.rs).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo test --workspace --all-targets --no-fail-fast
cargo test --workspace --doc
# rediss:// against a TLS redis-server with a private CA (openssl): the `tls` feature.
cargo test -p tollgate-redis --features tls --test tls
