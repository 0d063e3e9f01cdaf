# Sourced by the scripts that measure Tollgate against throttlecrab-server (bench-resp.sh,
# bench-check-peer.sh): builds it, in release, from THROTTLECRAB_SRC or a clone made into
# $target/throttlecrab-src (never inside the repository), and sets `theirs_bin`.
# Needs `target` (an absolute target directory) set, and protoc: throttlecrab-server compiles
# its gRPC protos with it and fails to build without it.
command -v protoc >/dev/null || { echo "needs protoc (apt-get install protobuf-compiler)" >&2; exit 1; }
src="${THROTTLECRAB_SRC:-$target/throttlecrab-src}"
if [ ! -d "$src" ]; then
  echo "cloning throttlecrab into $src" >&2
  git clone --quiet --depth 1 https://github.com/lazureykis/throttlecrab "$src"
fi
echo "building throttlecrab-server ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?'))" >&2
CARGO_TARGET_DIR="$target/throttlecrab-target" \
  cargo build --quiet --release --manifest-path "$src/Cargo.toml" -p throttlecrab-server
theirs_bin="$target/throttlecrab-target/release/throttlecrab-server"
