#!/usr/bin/env bash
# A throwaway local control plane for the operator's cluster and scale tests, for use until
# (or beside) the project's harness in tests/harness: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok with two fake nodes, all as plain
# processes. Binaries come from $CAIRN_BIN (default /root/.cache/cairn/bin, as built by the
# harness).
#
#   operator/tests/support/dev-cluster.sh up     # prints the KUBECONFIG to export
#   operator/tests/support/dev-cluster.sh down
#
# Settings that matter for the tests: the service CIDR is a /16 (each session has a ClusterIP
# Service), the fake nodes hold 320 CPUs (1,000 agent pods request 100 CPUs), the
# controller-manager may send 200 requests/s, and client certificates are X.509 v3 (rustls
# refuses v1 certificates).
set -euo pipefail

BIN=${CAIRN_BIN:-/root/.cache/cairn/bin}
DIR=${CAIRN_DEV_CLUSTER_DIR:-/tmp/cairn-dev-cluster}
K8S=${CAIRN_K8S_VERSION:-v1.37.2}
ETCD=${CAIRN_ETCD_VERSION:-v3.6.16}
KWOK=${CAIRN_KWOK_VERSION:-v0.8.0}
PORT=${CAIRN_APISERVER_PORT:-16443}
ETCD_PORT=${CAIRN_ETCD_PORT:-12379}

down() {
  local pids=()
  for name in kwok scheduler controller-manager apiserver etcd; do
    if [[ -f "$DIR/$name.pid" ]]; then
      pids+=("$(cat "$DIR/$name.pid")")
      kill "${pids[-1]}" 2>/dev/null || true
      rm -f "$DIR/$name.pid"
    fi
  done
  # The ports are reused by the next `up`: wait for the processes to be gone.
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  done
}

certs() {
  cd "$DIR"
  [[ -f ca.crt ]] && return
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=cairn-dev-ca" 2>/dev/null
  printf "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc,IP:10.0.0.1\n" > server.ext
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 30 -extfile server.ext 2>/dev/null
  printf "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n" > client.ext
  openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/CN=admin/O=system:masters" 2>/dev/null
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 30 -extfile client.ext 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
}

start() { # name, command...
  local name=$1; shift
  "$@" > "$DIR/$name.log" 2>&1 &
  echo $! > "$DIR/$name.pid"
}

up() {
  mkdir -p "$DIR"
  down
  certs
  cd "$DIR"
  cat > kubeconfig <<KC
apiVersion: v1
kind: Config
clusters:
- cluster: {certificate-authority: $DIR/ca.crt, server: https://127.0.0.1:$PORT}
  name: dev
users:
- name: admin
  user: {client-certificate: $DIR/admin.crt, client-key: $DIR/admin.key}
contexts:
- context: {cluster: dev, user: admin}
  name: dev
current-context: dev
KC
  rm -rf "$DIR/etcd"
  start etcd "$BIN/etcd-$ETCD" --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))"
  start apiserver "$BIN/kube-apiserver-$K8S" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --secure-port "$PORT" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
    --endpoint-reconciler-type none --tls-cert-file apiserver.crt --tls-private-key-file apiserver.key \
    --client-ca-file ca.crt --service-account-key-file sa.pub --service-account-signing-key-file sa.key \
    --service-account-issuer https://kubernetes.default.svc --authorization-mode RBAC,Node \
    --service-cluster-ip-range 10.0.0.0/16
  local kubectl="$BIN/kubectl-$K8S --kubeconfig $DIR/kubeconfig"
  for _ in $(seq 1 120); do $kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.5; done
  start controller-manager "$BIN/kube-controller-manager-$K8S" --kubeconfig kubeconfig --leader-elect=false \
    --secure-port 0 --controllers '*' --use-service-account-credentials=false \
    --service-account-private-key-file sa.key --root-ca-file ca.crt \
    --cluster-signing-cert-file ca.crt --cluster-signing-key-file ca.key \
    --kube-api-qps 200 --kube-api-burst 400 --concurrent-statefulset-syncs 20
  start scheduler "$BIN/kube-scheduler-$K8S" --kubeconfig kubeconfig --leader-elect=false --secure-port 0
  start kwok "$BIN/kwok-$KWOK" --kubeconfig kubeconfig --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake --manage-nodes-with-label-selector= \
    --config "$BIN/kwok-stages-$KWOK.yaml" --server-address 127.0.0.1:$((PORT + 1))
  for node in 0 1; do
    cat <<NODE | $kubectl apply -f - >/dev/null
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$node
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$node}
status:
  allocatable: {cpu: "160", memory: 1Ti, pods: "2000"}
  capacity: {cpu: "160", memory: 1Ti, pods: "2000"}
NODE
  done
  $kubectl get ns cairn-system >/dev/null 2>&1 || $kubectl create ns cairn-system >/dev/null
  echo "export KUBECONFIG=$DIR/kubeconfig"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
