#!/usr/bin/env bash
# Builds the parts of a real Kubernetes node from Go modules and caches them by version:
#   kubelet, kube-proxy                     (k8s.io/kubernetes, the control plane's wrapper module)
#   containerd, containerd-shim-runc-v2, ctr (github.com/containerd/containerd/v2)
#   runc                                    (github.com/opencontainers/runc, cgo + libseccomp)
#   bridge, loopback, host-local, portmap   (github.com/containernetworking/plugins)
#   kube-router                             (github.com/cloudnativelabs/kube-router/v2, firewall only)
# Output: $CAIRN_CACHE/bin/<component>-<version> (the CNI plugins in $CAIRN_CACHE/bin/cni-<version>/).
# Already-built binaries are kept, so only the first run pays for the build. Prints one
# `component=path` line per part on success.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
RUNC_VERSION="${RUNC_VERSION:-v1.5.3}"
CNI_VERSION="${CNI_VERSION:-v1.10.0}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
BIN="$CAIRN_CACHE/bin"
SRC="$CAIRN_CACHE/src"
mkdir -p "$BIN" "$SRC"

log() { echo "[build-node] $*" >&2; }
# The machine's cores are shared: builds run at a lower priority.
gobuild() { nice -n 10 go "$@"; }

k8s_bins=(kubelet kube-proxy)

# The same wrapper module as build-control-plane.sh (one `replace` per staging module, the
# version ldflags), in a directory of its own so the two scripts never edit one go.mod at once;
# the Go build cache is shared, so most packages are already compiled.
build_kubernetes() {
  local missing=0
  for b in "${k8s_bins[@]}"; do [ -x "$BIN/$b-$K8S_VERSION" ] || missing=1; done
  [ "$missing" = 1 ] || return 0

  local dir="$SRC/kubernetes-node-$K8S_VERSION"
  mkdir -p "$dir"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local patch="${K8S_VERSION##*.}"
  local staging="v0.$minor.$patch"
  log "kubernetes $K8S_VERSION (staging modules $staging) in $dir"

  local modfile
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module cairn.dev/node"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$modfile" |
      sort -u | while read -r m; do echo "	$m => $m $staging"; done
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
EOF
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$dir" && GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)

  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in "${k8s_bins[@]}"; do
    [ -x "$BIN/$b-$K8S_VERSION" ] && continue
    log "go build $b"
    (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 gobuild build -trimpath -ldflags "$ld" \
      -o "$BIN/$b-$K8S_VERSION.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$BIN/$b-$K8S_VERSION.tmp" "$BIN/$b-$K8S_VERSION"
  done
}

# `go install pkg@version` for modules without `replace` directives, into a scratch GOBIN;
# the binary is then moved to `$BIN/<out>`.
install_one() {
  local out="$1" pkg="$2" cgo="$3" tags="$4" ld="${5:-}"
  [ -x "$BIN/$out" ] && return 0
  local gobin="$SRC/gobin-$out"
  rm -rf "$gobin"
  mkdir -p "$gobin" "$(dirname "$BIN/$out")"
  log "go install $pkg"
  CGO_ENABLED="$cgo" GOBIN="$gobin" gobuild install -trimpath -tags "$tags" -ldflags "-s -w $ld" "$pkg"
  mv "$gobin/$(basename "${pkg%@*}")" "$BIN/$out"
  rm -rf "$gobin"
}

build_containerd() {
  local m="github.com/containerd/containerd/v2"
  local ld="-X $m/version.Version=$CONTAINERD_VERSION"
  for b in containerd containerd-shim-runc-v2 ctr; do
    install_one "$b-$CONTAINERD_VERSION" "$m/cmd/$b@$CONTAINERD_VERSION" 0 "no_btrfs,no_devmapper,no_zfs" "$ld"
  done
}

build_runc() {
  # seccomp needs cgo and libseccomp's headers (Debian's libseccomp-dev).
  if ! [ -x "$BIN/runc-$RUNC_VERSION" ] && ! [ -e /usr/include/seccomp.h ]; then
    echo "runc needs libseccomp-dev (apt-get install libseccomp-dev)" >&2
    exit 1
  fi
  install_one "runc-$RUNC_VERSION" "github.com/opencontainers/runc@$RUNC_VERSION" 1 seccomp \
    "-X main.version=${RUNC_VERSION#v}"
}

build_cni() {
  for p in main/bridge main/loopback ipam/host-local meta/portmap; do
    install_one "cni-$CNI_VERSION/$(basename "$p")" \
      "github.com/containernetworking/plugins/plugins/$p@$CNI_VERSION" 0 ""
  done
}

build_kube_router() {
  install_one "kube-router-$KUBE_ROUTER_VERSION" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" 0 ""
}

build_kubernetes
build_containerd
build_runc
build_cni
build_kube_router
for b in "${k8s_bins[@]}"; do echo "$b=$BIN/$b-$K8S_VERSION"; done
for b in containerd containerd-shim-runc-v2 ctr; do echo "$b=$BIN/$b-$CONTAINERD_VERSION"; done
echo "runc=$BIN/runc-$RUNC_VERSION"
echo "cni-bin-dir=$BIN/cni-$CNI_VERSION"
echo "kube-router=$BIN/kube-router-$KUBE_ROUTER_VERSION"
