#!/usr/bin/env bash
# Builds the container images of the real-node tier without a daemon and without pulling
# anything from a registry, as docker-archive tarballs for `ctr images import`:
#   harness.local/pause:cairn           the pod sandbox (tests/harness/pause, static Go)
#   harness.local/busybox:cairn         a client pod's shell and nc (Debian's busybox-static)
#   ghcr.io/cairn-dev/cairn-agent:V     the `agent` stage of deploy/Dockerfile
#   ghcr.io/cairn-dev/cairn-operator:V  the `operator` stage of deploy/Dockerfile
#   ghcr.io/cairn-dev/cairn-gateway:V   the `gateway` stage of deploy/Dockerfile
# The cairn images follow deploy/Dockerfile's final stages: the binary at the path its COPY
# names, its USER and ENTRYPOINT, and what the distroless base provides that the binaries
# use (CA certificates, /etc/passwd with nonroot, PATH). The binaries are the workspace's own
# dev build (`cargo build --workspace --bins` into $CARGO_TARGET_DIR/debug: the build `make
# test` and `make demo` have just done, so cargo finds nothing to do), with their shared
# libraries copied in; CAIRN_IMAGE_PROFILE=release builds them statically instead
# (x86_64-unknown-linux-musl, release), as deploy/Dockerfile does; CAIRN_IMAGE_BIN_DIR names
# a directory that holds them already (dynamically linked ones get their libraries too).
# CAIRN_IMAGE_TAG tags the cairn images (default: the workspace's version), so binaries of
# another release can be imported beside today's.
# Usage: build-images.sh [pause] [busybox] [cairn] (none: all).
# Output: $CAIRN_CACHE/images/<name>-<content hash>.tar, one `name=path` line and one
# `name-ref=image reference` line per image.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
OUT="$CAIRN_CACHE/images"
WORK="$CAIRN_CACHE/src/images"
mkdir -p "$OUT" "$WORK"
VERSION="${CAIRN_IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)}"
MUSL=x86_64-unknown-linux-musl

log() { echo "[build-images] $*" >&2; }

for tool in umoci skopeo; do
  command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install $tool)" >&2; exit 1; }
done

# image NAME REF ROOTFS USER ENTRYPOINT-JSON: an OCI image of one layer holding ROOTFS,
# converted to a docker-archive. Cached by the hash of everything that goes in.
image() {
  local name="$1" ref="$2" rootfs="$3" user="$4" entrypoint="$5"
  local hash
  hash="$( (cd "$rootfs" && find . -print0 | LC_ALL=C sort -z | xargs -0 sha256sum 2>/dev/null; \
            find . | LC_ALL=C sort; echo "$ref $user $entrypoint") | sha256sum | cut -c1-16)"
  local tar="$OUT/$name-$hash.tar"
  if [ ! -s "$tar" ]; then
    log "image $ref"
    local layout="$WORK/oci-$name"
    rm -rf "$layout"
    umoci init --layout "$layout" >&2
    umoci new --image "$layout:build" >&2
    umoci insert --rootless --image "$layout:build" "$rootfs" / >&2
    local args=(--image "$layout:build" --config.user "$user"
      --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      --config.workingdir /)
    local e
    while read -r e; do args+=(--config.entrypoint "$e"); done < <(echo "$entrypoint" | python3 -c 'import json,sys; [print(a) for a in json.load(sys.stdin)]')
    umoci config "${args[@]}" >&2
    rm -f "$tar.tmp"
    skopeo copy --quiet "oci:$layout:build" "docker-archive:$tar.tmp:$ref" >&2
    mv "$tar.tmp" "$tar"
    rm -rf "$layout"
    # Every change of a binary makes a new tarball: the four newest of each image stay (a
    # test running beside this one may still import one of them), older ones go.
    ls -t "$OUT/$name"-*.tar 2>/dev/null | tail -n +5 | xargs -r rm -f
  fi
  echo "$name=$tar"
  echo "$name-ref=$ref"
}

# The files of a distroless base that the binaries rely on.
base_rootfs() {
  local r="$1"
  rm -rf "$r"
  mkdir -p "$r/etc/ssl/certs" "$r/tmp" "$r/home/nonroot" "$r/usr/local/bin"
  chmod 1777 "$r/tmp"
  cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$r/etc/group"
}

# Copies BINARY to DEST inside ROOTFS, with its shared libraries when it has any.
install_binary() {
  local r="$1" bin="$2" dest="$3"
  mkdir -p "$r$(dirname "$dest")"
  cp "$bin" "$r$dest"
  if ldd "$bin" >/dev/null 2>&1; then
    local lib
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
      mkdir -p "$r$(dirname "$lib")"
      cp -L "$lib" "$r$lib"
    done
  fi
}

# The `COPY --from=build SRC DEST`, `USER` and `ENTRYPOINT` of a deploy/Dockerfile stage.
stage() {
  local target="$1" what="$2"
  awk -v t="$target" -v w="$what" '
    /^FROM / { in_stage = ($NF == t) }
    in_stage && w == "dest" && /^COPY --from=build/ { print $NF }
    in_stage && w == "user" && /^USER / { print $2 }
    in_stage && w == "entrypoint" && /^ENTRYPOINT / { sub(/^ENTRYPOINT /, ""); print }
  ' "$ROOT/deploy/Dockerfile"
}

build_pause() {
  local bin="$CAIRN_CACHE/bin/pause-cairn"
  if [ ! -x "$bin" ] || [ "$ROOT/tests/harness/pause/main.go" -nt "$bin" ]; then
    log "go build pause"
    (cd "$ROOT/tests/harness/pause" && CGO_ENABLED=0 GO111MODULE=off nice -n 10 go build -trimpath -ldflags "-s -w" -o "$bin.tmp" main.go)
    mv "$bin.tmp" "$bin"
  fi
  local r="$WORK/rootfs-pause"
  rm -rf "$r"; mkdir -p "$r"
  cp "$bin" "$r/pause"
  image pause harness.local/pause:cairn "$r" 65535:65535 '["/pause"]'
}

build_busybox() {
  local r="$WORK/rootfs-busybox"
  base_rootfs "$r"
  mkdir -p "$r/bin"
  cp /bin/busybox "$r/bin/busybox"
  local a
  for a in sh cat echo id touch sleep nc grep ls rm mkdir printf head tr wc; do ln -sf busybox "$r/bin/$a"; done
  image busybox harness.local/busybox:cairn "$r" 65532:65532 '["/bin/sh"]'
}

build_cairn() {
  local bindir="${CAIRN_IMAGE_BIN_DIR:-}"
  if [ -z "$bindir" ]; then
    local target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
    # The same command as `make test`'s and `make demo`'s build, so its features and
    # artifacts are theirs: cargo rebuilds only what changed since.
    local args=(build --quiet --locked --workspace --bins)
    case "${CAIRN_IMAGE_PROFILE:-dev}" in
      dev) bindir="$target_dir/debug" ;;
      release)
        rustup target list --installed 2>/dev/null | grep -qx "$MUSL" || rustup target add "$MUSL" >&2
        command -v musl-gcc >/dev/null || { echo "musl-gcc is required (apt-get install musl-tools)" >&2; exit 1; }
        bindir="$target_dir/$MUSL/release"
        args=(build --quiet --locked --release --target "$MUSL" -p cairn-agent -p cairn-operator -p cairn-gateway) ;;
      *) echo "CAIRN_IMAGE_PROFILE is dev or release, not ${CAIRN_IMAGE_PROFILE}" >&2; exit 2 ;;
    esac
    log "cargo ${args[*]}"
    # A clean environment: the variables `cargo test` sets for its tests would make cargo
    # rebuild the tree; those that change what is built are passed on.
    (cd "$ROOT" && env -i PATH="$PATH" HOME="$HOME" CARGO_TARGET_DIR="$target_dir" \
      ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} \
      ${CARGO_INCREMENTAL:+CARGO_INCREMENTAL="$CARGO_INCREMENTAL"} ${RUSTFLAGS:+RUSTFLAGS="$RUSTFLAGS"} \
      nice -n 10 cargo "${args[@]}" >&2)
  fi
  local c cs=(agent operator)
  # The gateway's image when its binary is there (a CAIRN_IMAGE_BIN_DIR may predate it).
  [ -x "$bindir/cairn-gateway" ] && cs+=(gateway)
  for c in "${cs[@]}"; do
    local dest user entrypoint r="$WORK/rootfs-$c"
    dest="$(stage "$c" dest)"; user="$(stage "$c" user)"; entrypoint="$(stage "$c" entrypoint)"
    [ -n "$dest" ] && [ -n "$user" ] && [ -n "$entrypoint" ] ||
      { echo "deploy/Dockerfile: stage $c lacks COPY, USER or ENTRYPOINT" >&2; exit 1; }
    base_rootfs "$r"
    install_binary "$r" "$bindir/cairn-$c" "$dest"
    image "cairn-$c" "ghcr.io/cairn-dev/cairn-$c:$VERSION" "$r" "$user" "$entrypoint"
  done
}

# Arguments pick images (pause, busybox, cairn); none: all of them.
want=("$@")
[ "${#want[@]}" -gt 0 ] || want=(pause busybox cairn)
for w in "${want[@]}"; do
  case "$w" in
    pause) build_pause ;;
    busybox) build_busybox ;;
    cairn) build_cairn ;;
    *) echo "unknown image set: $w (pause, busybox, cairn)" >&2; exit 2 ;;
  esac
done
