#!/usr/bin/env bash
# Builds the parts of a real Kubernetes node from Go modules and caches them by version:
#   kubelet, kube-proxy                     (k8s.io/kubernetes: build-control-plane.sh builds them)
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

# kubelet and kube-proxy come from the control plane's wrapper module, built by the same
# `go build` as the control plane's binaries (build-control-plane.sh), which shares their
# packages and links all six side by side.
build_kubernetes() {
  local missing=0
  for b in "${k8s_bins[@]}"; do [ -x "$BIN/$b-$K8S_VERSION" ] || missing=1; done
  [ "$missing" = 1 ] || return 0
  K8S_VERSION="$K8S_VERSION" CAIRN_CACHE="$CAIRN_CACHE" bash "$(dirname "$0")/build-control-plane.sh" >/dev/null
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
