#!/usr/bin/env bash
# For machines with Docker: a kind cluster, cairn's images built and loaded, the chart
# installed, and the cluster e2e suite run against it.
#   tests/e2e/kind.sh            create, install, test, delete
#   KEEP=1 tests/e2e/kind.sh     leave the cluster up afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER="${CLUSTER:-cairn-e2e}"
TAG="${TAG:-dev}"

export KUBECONFIG="${TMPDIR:-/tmp}/kind-$CLUSTER.kubeconfig"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 120s
[ -n "${KEEP:-}" ] || trap 'kind delete cluster --name "$CLUSTER"' EXIT

for target in agent operator; do
  docker build -f deploy/Dockerfile --target "$target" -t "ghcr.io/cairn-dev/cairn-$target:$TAG" .
  kind load docker-image --name "$CLUSTER" "ghcr.io/cairn-dev/cairn-$target:$TAG"
done

helm install cairn charts/cairn --namespace cairn-system --create-namespace --wait \
  --set image.tag="$TAG" --set image.pullPolicy=Never \
  --set agent.image="ghcr.io/cairn-dev/cairn-agent:$TAG"

# The operator's cluster tests take any cluster through KUBECONFIG.
cargo test -p cairn-operator --test cluster -- --include-ignored
