#!/usr/bin/env bash
# `make demo`: installs what the demo uses (`.ci/install.sh demo`), builds the workspace's
# binaries, runs `cairn-demo` (arguments are passed on). Every step prints the seconds since
# the start.
#
# The build happens in one copy of the work tree per machine, $CAIRN_CACHE/src/workspace
# (tests/harness/sync-tree.py copies only the files whose content changed), with the target
# directory CI uses, $CAIRN_CACHE/target: a new clone of the same commit finds everything
# built. One demo at a time uses that copy (a lock).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"

export CAIRN_CACHE="${CAIRN_CACHE:-$HOME/.cache/cairn}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CAIRN_CACHE/target}"
# As in CI (.ci/run), so the two share their artifacts.
export CARGO_INCREMENTAL=0
CARGO="${CARGO:-cargo}"
WORKSPACE="$CAIRN_CACHE/src/workspace"

say() { printf '[demo %4ds] %s\n' "$SECONDS" "$*"; }

mkdir -p "$CAIRN_CACHE/src"
exec 9>"$WORKSPACE.lock"
flock -n 9 || { say "waiting for another demo or CI run using $WORKSPACE"; flock 9; }
say "copying the work tree to $WORKSPACE (changed files only)"
python3 tests/harness/sync-tree.py "$ROOT" "$WORKSPACE" >/dev/null

# The install's Go builds and the Rust build each keep both cores busy: side by side they only
# slow each other down (two cores oversubscribed, the Go build of the control plane more than
# twice as long), so they run one after the other. What is only a download runs beside the
# install: Cargo fetches the crates while apt and Go fetch theirs.
fetch_log="$CAIRN_CACHE/demo-fetch.log"
(cd "$WORKSPACE" && "$CARGO" fetch -q --locked) >"$fetch_log" 2>&1 &
fetch=$!
trap 'kill "$fetch" 2>/dev/null || true' EXIT
say "installing what the demo uses (.ci/install.sh demo); the crates download beside it"
bash .ci/install.sh demo
wait "$fetch" || { cat "$fetch_log" >&2; say "fetching the crates failed"; exit 1; }
trap - EXIT
build_log="$CAIRN_CACHE/demo-build.log"
say "building the workspace's binaries (cargo build --workspace --bins); its output: $build_log"
(cd "$WORKSPACE" && "$CARGO" build -q --locked --workspace --bins) >"$build_log" 2>&1 ||
  { cat "$build_log" >&2; say "the build failed"; exit 1; }
say "built"
say "running cairn-demo"
"$CARGO_TARGET_DIR/debug/cairn-demo" "$@"
say "done"
