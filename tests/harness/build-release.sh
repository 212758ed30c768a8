#!/usr/bin/env bash
# Builds an earlier release of cairn for the upgrade test: the tree of COMMIT (from this
# repository's history) exported under the cache, its agent and operator binaries, and their
# images tagged with the commit (build-images.sh with CAIRN_IMAGE_BIN_DIR), beside today's.
# Cached per commit.
# The build is the workspace's own command (the dev profile, `--workspace --bins`, so each
# dependency gets the features it has in today's build) with the workspace's build directory
# (Cargo's `build-dir`: `deps/`, fingerprints, build scripts): every dependency the two
# releases share is compiled once, and only the release's own crates are built. Its final
# binaries go to a target directory of their own, removed once they are kept: in the
# workspace's, they would overwrite today's.
# The history is read from CAIRN_SOURCE when set (the clone `.ci/run` was started from; it
# runs the tests in a copy of the work tree without one), else from this repository.
# Usage: build-release.sh COMMIT
# Output: `chart=<the release's charts/cairn>`, `tag=<image tag>` and build-images.sh's
# `name=path` / `name-ref=reference` lines for cairn-agent and cairn-operator.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
COMMIT="${1:?usage: build-release.sh COMMIT}"
GIT_ROOT="${CAIRN_SOURCE:-$ROOT}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
SRC="$CAIRN_CACHE/src/release-$COMMIT"
BIN="$CAIRN_CACHE/bin/release-$COMMIT"

log() { echo "[build-release] $*" >&2; }

git -C "$GIT_ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null || {
  echo "commit $COMMIT is not in this clone's history (a shallow clone?): fetch it with" \
       "\`git fetch --unshallow\`" >&2
  exit 1
}
if [ ! -f "$SRC/.exported" ]; then
  log "export $COMMIT"
  rm -rf "$SRC"
  mkdir -p "$SRC"
  git -C "$GIT_ROOT" archive "$COMMIT" | tar -x -C "$SRC"
  touch "$SRC/.exported"
fi
if [ ! -x "$BIN/cairn-agent" ] || [ ! -x "$BIN/cairn-operator" ]; then
  target_dir="$CAIRN_CACHE/target-release-$COMMIT"
  build_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
  log "cargo build $COMMIT (its workspace's binaries; shared build directory $build_dir)"
  # A clean environment: the variables `cargo test` sets would make it rebuild the tree; those
  # that change what is built are passed on, as build-images.sh does for today's build.
  (cd "$SRC" && env -i PATH="$PATH" HOME="$HOME" CARGO_TARGET_DIR="$target_dir" \
    CARGO_BUILD_BUILD_DIR="$build_dir" CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}" \
    ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} \
    ${RUSTFLAGS:+RUSTFLAGS="$RUSTFLAGS"} \
    nice -n 10 cargo build --quiet --locked --workspace --bins >&2)
  mkdir -p "$BIN.tmp"
  cp "$target_dir/debug/cairn-agent" "$target_dir/debug/cairn-operator" "$BIN.tmp/"
  rm -rf "$BIN"
  mv "$BIN.tmp" "$BIN"
  rm -rf "$target_dir"
fi
echo "chart=$SRC/charts/cairn"
echo "tag=$COMMIT"
CAIRN_IMAGE_BIN_DIR="$BIN" CAIRN_IMAGE_TAG="$COMMIT" bash "$ROOT/tests/harness/build-images.sh" cairn
