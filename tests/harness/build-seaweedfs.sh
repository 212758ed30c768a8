#!/usr/bin/env bash
# Builds SeaweedFS (Apache-2.0) from its Go module and caches the binary by version:
#   weed   (github.com/seaweedfs/seaweedfs/weed: `weed mini` runs master, volume server, filer
#           and the S3 gateway with its STS endpoint and IAM policy engine in one process)
# The tests use it as the S3 server that enforces IAM and session policies (moto does not
# evaluate an AssumeRole session policy). Upstream publishes no module tags, so the version
# is a pseudo-version of one commit; the module proxy serves exactly that one.
# Output: $CAIRN_CACHE/bin/weed-<version>. An already-built binary is kept, so only the first
# run pays for the build (about 10 minutes on 2 cores). Prints `weed=path` on success.
set -euo pipefail

SEAWEEDFS_VERSION="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
BIN="$CAIRN_CACHE/bin"
SRC="$CAIRN_CACHE/src"
mkdir -p "$BIN" "$SRC"

log() { echo "[build-seaweedfs] $*" >&2; }
# The machine's cores are shared: builds run at a lower priority.
gobuild() { nice -n 10 go "$@"; }

out="$BIN/weed-$SEAWEEDFS_VERSION"
if [ ! -x "$out" ]; then
  dir="$SRC/seaweedfs-$SEAWEEDFS_VERSION"
  mkdir -p "$dir"
  log "seaweedfs $SEAWEEDFS_VERSION in $dir"
  modfile="$(gobuild mod download -json "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" |
    sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  goversion="$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$modfile")"
  {
    echo "module cairn.dev/seaweedfs"
    echo
    echo "go $goversion"
    echo
    echo "require github.com/seaweedfs/seaweedfs $SEAWEEDFS_VERSION"
    echo
    # upstream's own replace directives hold for its dependents too
    sed -n 's#^replace \(.*=>.*\)#replace \1#p' "$modfile"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
EOF
  # Every other dependency resolves to the version upstream's go.mod pins (minimal version
  # selection with one requirement), so the build is the same each time.
  (cd "$dir" && GOFLAGS=-mod=mod gobuild mod tidy -e >/dev/null 2>&1 || true)
  log "go build weed"
  (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 gobuild build -trimpath -ldflags "-s -w" \
    -o "$out.tmp" github.com/seaweedfs/seaweedfs/weed)
  mv "$out.tmp" "$out"
fi
echo "weed=$out"
