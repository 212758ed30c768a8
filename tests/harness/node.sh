#!/usr/bin/env bash
# PID 1 of a real node's PID namespace (see tests/src/harness/node.rs, which writes node.env
# and the configuration files, wires the network namespace and then creates `net-ready`).
# Starts containerd, the kubelet, kube-proxy and kube-router; on SIGTERM (the harness stops,
# or the harness died and `unshare --kill-child=SIGTERM` passed it on) it kills everything
# in the namespace and removes the node's cgroups, so nothing is left behind.
set -uo pipefail
D="$1"
# shellcheck disable=SC1091
. "$D/node.env"
export PATH="$D/bin:/usr/sbin:/usr/bin:/sbin:/bin"
L="$D/logs"

cleanup() {
  trap - TERM INT
  kill -KILL -1 2>/dev/null
  wait 2>/dev/null
  # Container processes die with their own PID namespaces a moment later; their cgroups can
  # only go once they are empty.
  for _ in $(seq 1 100); do
    left=0
    for h in /sys/fs/cgroup/*/"$CGROUP_ROOT"; do
      [ -d "$h" ] || continue
      find "$h" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$h" ] && left=1
    done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  echo "node stopped" >>"$L/node.log"
  exit 0
}
trap cleanup TERM INT

while [ ! -e "$D/net-ready" ]; do sleep 0.05; done

# This network namespace's sysfs, with the cgroup hierarchies moved back underneath it.
mkdir -p "$D/mnt/cgroup"
mount --rbind /sys/fs/cgroup "$D/mnt/cgroup"
mount -t sysfs sysfs /sys
mount --move "$D/mnt/cgroup" /sys/fs/cgroup
# Runtime state and CNI's cache stay inside this mount namespace.
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=755 tmpfs /var/lib/cni
# The kubelet writes these machine-wide sysctls unless it reads the values it wants.
for f in vm/overcommit_memory kernel/panic kernel/panic_on_oops; do
  mount --bind "$D/sysctl/${f##*/}" "/proc/sys/$f"
done
echo 1 >/proc/sys/net/ipv4/ip_forward

# The kubelet's cgroupRoot, in every v1 hierarchy (cpuset needs its cpus and mems copied).
for h in /sys/fs/cgroup/*/; do
  [ -L "${h%/}" ] && continue
  [ -e "$h/cgroup.procs" ] || continue
  mkdir -p "$h/$CGROUP_ROOT"
  if [ -e "$h/cpuset.cpus" ]; then
    cat "$h/cpuset.cpus" >"$h/$CGROUP_ROOT/cpuset.cpus"
    cat "$h/cpuset.mems" >"$h/$CGROUP_ROOT/cpuset.mems"
  fi
done

containerd --config "$D/containerd/config.toml" >"$L/containerd.log" 2>&1 &
for _ in $(seq 1 200); do [ -S "$D/containerd/containerd.sock" ] && break; sleep 0.05; done

kubelet --config="$D/kubelet/config.yaml" --kubeconfig="$D/kubeconfig" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --root-dir="$D/kubelet/root" \
  --node-labels=cairn.dev/node=real --v=1 >"$L/kubelet.log" 2>&1 &
kube-proxy --config="$D/kube-proxy.yaml" --v=1 >"$L/kube-proxy.log" 2>&1 &

# kube-router exits when its Node object does not exist yet.
(
  until kubectl --kubeconfig="$D/kubeconfig" get node "$NODE_NAME" >/dev/null 2>&1; do sleep 0.2; done
  exec kube-router --kubeconfig="$D/kubeconfig" --hostname-override="$NODE_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --metrics-port=0 --v=1 >"$L/kube-router.log" 2>&1
) &

# Any component exiting ends the node (the harness reports it with the logs).
wait -n
echo "a node component exited" >>"$L/node.log"
cleanup
