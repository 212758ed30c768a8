#!/usr/bin/env bash
# Builds the local control plane from Go modules and caches the binaries by version:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes, wrapper module)
#   kubelet, kube-proxy (the real node's; same module, same `go build`, printed by build-node.sh)
#   etcd                                                     (go.etcd.io/etcd/server/v3, wrapper module)
#   kwok                                                     (sigs.k8s.io/kwok)
# Output: $CAIRN_CACHE/bin/<component>-<version>. Already-built binaries are kept, so only the
# first run pays for the build. Prints one `component=path` line per binary on success.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
BIN="$CAIRN_CACHE/bin"
SRC="$CAIRN_CACHE/src"
mkdir -p "$BIN" "$SRC"

log() { echo "[build-control-plane] $*" >&2; }

# kubectl too: the machine's kubectl may be older than the skew policy allows (an old
# `kubectl explain` cannot render the descriptions of a current API server's OpenAPI v3).
k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
# The real node's two: one `go build` of all six compiles their shared packages once and links
# the binaries in parallel (linking is single-threaded; six in a row left a core idle).
node_bins=(kubelet kube-proxy)

build_kubernetes() {
  local missing=()
  for b in "${k8s_bins[@]}" "${node_bins[@]}"; do [ -x "$BIN/$b-$K8S_VERSION" ] || missing+=("$b"); done
  [ "${#missing[@]}" -gt 0 ] || return 0

  local dir="$SRC/kubernetes-$K8S_VERSION"
  mkdir -p "$dir"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local patch="${K8S_VERSION##*.}"
  local staging="v0.$minor.$patch"
  log "kubernetes $K8S_VERSION (staging modules $staging) in $dir"

  local modfile
  modfile="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module cairn.dev/controlplane"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    # One replace per staging module that upstream pins to ./staging/src/...
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$modfile" |
      sort -u | while read -r m; do echo "	$m => $m $staging"; done
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
EOF
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$dir" && GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)

  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld="$ld -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  local out="$SRC/kubernetes-$K8S_VERSION-out"
  rm -rf "$out"
  mkdir -p "$out"
  log "go build ${missing[*]}"
  (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$out/" \
    "${missing[@]/#/k8s.io/kubernetes/cmd/}")
  for b in "${missing[@]}"; do mv "$out/$b" "$BIN/$b-$K8S_VERSION"; done
  rm -rf "$out"
}

build_etcd() {
  [ -x "$BIN/etcd-$ETCD_VERSION" ] && return 0
  local dir="$SRC/etcd-$ETCD_VERSION"
  mkdir -p "$dir"
  log "etcd $ETCD_VERSION in $dir"
  local modfile
  modfile="$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module cairn.dev/etcd"
    echo
    echo "go 1.26.0"
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo
    echo "replace ("
    # upstream replaces its sibling modules with ../<dir>; pin each to the same release
    sed -n 's#^[[:space:]]*\(go.etcd.io/etcd/[a-z0-9/]*\) => \.\./.*#\1#p' "$modfile" |
      sort -u | while read -r m; do echo "	$m => $m $ETCD_VERSION"; done
    echo ")"
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'EOF'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
EOF
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$dir" && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null)
  log "go build etcd"
  (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$BIN/etcd-$ETCD_VERSION.tmp" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd-$ETCD_VERSION.tmp" "$BIN/etcd-$ETCD_VERSION"
}

build_kwok() {
  [ -x "$BIN/kwok-$KWOK_VERSION" ] && return 0
  log "kwok $KWOK_VERSION"
  local gobin="$SRC/kwok-$KWOK_VERSION"
  mkdir -p "$gobin"
  CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv "$gobin/kwok" "$BIN/kwok-$KWOK_VERSION"
}

# kwok ships its lifecycle stages as YAML in its module; the "fast" set (nodes Ready at once,
# pods Running as soon as they are scheduled, deleted pods removed) is concatenated into one
# config file.
kwok_stages() {
  local out="$BIN/kwok-stages-$KWOK_VERSION.yaml"
  [ -s "$out" ] && return 0
  local dir
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  local s="$dir/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$s/$f"
  done >"$out.tmp"
  mv "$out.tmp" "$out"
}

build_etcd
build_kwok
kwok_stages
build_kubernetes
echo "kwok-stages=$BIN/kwok-stages-$KWOK_VERSION.yaml"
echo "etcd=$BIN/etcd-$ETCD_VERSION"
echo "kwok=$BIN/kwok-$KWOK_VERSION"
for b in "${k8s_bins[@]}"; do echo "$b=$BIN/$b-$K8S_VERSION"; done
