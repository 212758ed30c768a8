#!/usr/bin/env bash
# Builds CoreDNS from its Go module for the real-node tier's cluster DNS (Service names such
# as cairn-<session>.<namespace>.svc resolve inside pods), with only the plugins the node
# uses: bind, errors, ready, kubernetes. A wrapper module with its own main, as CoreDNS
# documents for compile-time plugin selection.
# Output: $CAIRN_CACHE/bin/coredns-<version>, cached; prints one `coredns=path` line.
set -euo pipefail

COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
BIN="$CAIRN_CACHE/bin"
SRC="$CAIRN_CACHE/src/coredns-$COREDNS_VERSION"
OUT="$BIN/coredns-$COREDNS_VERSION"
mkdir -p "$BIN" "$SRC"

if [ ! -x "$OUT" ]; then
  echo "[build-coredns] coredns $COREDNS_VERSION in $SRC" >&2
  cat >"$SRC/go.mod" <<MOD
module cairn.dev/coredns

go 1.26.0

require github.com/coredns/coredns $COREDNS_VERSION
MOD
  cat >"$SRC/main.go" <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins of this build, in CoreDNS's own order.
func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
GO
  (cd "$SRC" && GOFLAGS=-mod=mod go mod tidy >/dev/null)
  (cd "$SRC" && GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" .)
  mv "$OUT.tmp" "$OUT"
fi
echo "coredns=$OUT"
