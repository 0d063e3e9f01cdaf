#!/usr/bin/env bash
# Builds Tollgate's OCI image with podman (or buildah) from this machine alone, pulling nothing
# from any registry:
#   scripts/image.sh                            # release build -> localhost/tollgate:<version>
#   scripts/image.sh --tag NAME --no-build      # the existing release build, tagged NAME
#   scripts/image.sh --profile dev              # another cargo profile (dev: debug info stripped)
#   scripts/image.sh --no-build --rootfs DIR    # only lay the image's files out in DIR (the
#                                               # Containerfile's build stage does this)
# The image is FROM scratch: /usr/bin/tollgate, exactly the shared libraries it links (as ldd
# lists them) and the dynamic loader, /etc/passwd and /etc/group with the tollgate user
# (10001:10001), /etc/nsswitch.conf, and /etc/tollgate/tollgate.toml (deploy/container/, which
# listens on 0.0.0.0). Its metadata (user, entrypoint, ports) is the last stage of
# ./Containerfile, built here from those files. Needs podman or buildah, ldd and strip.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
build=1
tag=""
rootfs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --tag) tag="$2"; shift 2 ;;
    --rootfs) rootfs="$2"; shift 2 ;;
    *) echo "usage: scripts/image.sh [--profile P] [--no-build] [--tag NAME] [--rootfs DIR]" >&2; exit 2 ;;
  esac
done

if [ "$build" -eq 1 ]; then
  "${CARGO:-cargo}" build --locked --profile "$profile" -p tollgate-cli
fi
dir="${CARGO_TARGET_DIR:-target}/$([ "$profile" = dev ] && echo debug || echo "$profile")"
bin="$dir/tollgate"
[ -x "$bin" ] || { echo "no $bin: build it first, or drop --no-build" >&2; exit 1; }

# The image's files under $1, which must not exist yet.
lay_out() {
  local root="$1" libs lib
  [ ! -e "$root" ] || { echo "$root exists: give a new folder" >&2; return 1; }
  install -d -m 755 "$root/usr/bin" "$root/etc/tollgate"
  # Debug info out (a dev build carries line tables); the symbol table stays, so a panic's
  # backtrace still names functions, as in the Debian package.
  strip --strip-debug -o "$root/usr/bin/tollgate" "$bin"
  chmod 755 "$root/usr/bin/tollgate"
  # Every library the loader maps, and the loader itself, at the paths ldd resolved them to
  # (those are the loader's default search paths, so no ld.so.cache is needed).
  libs="$(ldd "$bin")" || { echo "ldd $bin failed: a static binary needs no libraries" >&2; libs=""; }
  if grep -q 'not found' <<<"$libs"; then
    echo "$bin links libraries that are missing here:" >&2
    echo "$libs" >&2
    return 1
  fi
  while read -r lib; do
    install -d -m 755 "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    chmod 755 "$root$lib"
  done < <(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$libs")
  # The user the image runs as; root and nobody for tools that expect them.
  cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
tollgate:x:10001:10001:tollgate:/nonexistent:/sbin/nologin
EOF
  cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
tollgate:x:10001:
EOF
  # /etc/hosts first (a container runtime's --add-host, Kubernetes' hostAliases), then DNS:
  # glibc's default without this file asks DNS first.
  cat >"$root/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
  chmod 644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"
  install -m 644 deploy/container/tollgate.toml "$root/etc/tollgate/tollgate.toml"
}

if [ -n "$rootfs" ]; then
  lay_out "$rootfs"
  echo "laid out $rootfs from $bin"
  exit 0
fi

if command -v podman >/dev/null 2>&1; then
  engine=(podman build)
elif command -v buildah >/dev/null 2>&1; then
  engine=(buildah build)
else
  echo "neither podman nor buildah is installed: apt-get install podman" >&2
  exit 1
fi
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
tag="${tag:-localhost/tollgate:$version}"

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
lay_out "$context/rootfs"
# The Containerfile's last stage, taking its files from this context instead of its build stage.
sed -n '/^FROM scratch$/,$p' Containerfile \
  | sed 's|^COPY --from=build /rootfs/ /$|COPY rootfs/ /|' >"$context/Containerfile"
grep -qx 'COPY rootfs/ /' "$context/Containerfile" || {
  echo "Containerfile: its last stage no longer starts with FROM scratch and COPY --from=build /rootfs/ /" >&2
  exit 1
}
"${engine[@]}" --pull=never --layers=false --tag "$tag" --file "$context/Containerfile" "$context"
size=""
if [ "${engine[0]}" = podman ]; then
  size="$(podman image inspect --format '{{.Size}}' "$tag")"
fi
echo "built $tag from $bin${size:+: $size bytes ($((size / 1000000)) MB), uncompressed}"
