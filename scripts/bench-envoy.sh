#!/usr/bin/env bash
# Throughput of the Envoy rate limit service (ShouldRateLimit over gRPC, loopback, memory
# store): concurrent client tasks over several HTTP/2 connections, in one process with the
# server. Prints calls/s and calls per CPU-second (client and server share the cores).
#   scripts/bench-envoy.sh [--seconds 5] [--connections 4] [--concurrency 64] [--descriptors 1|2]
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--seconds 5 --connections 4 --concurrency 64)
cargo run --quiet --release -p tollgate-envoy --example bench -- "${args[@]}"
