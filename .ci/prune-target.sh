#!/usr/bin/env bash
# Keeps the shared Cargo target dir under a cap (GB, first argument): when it is over, removes
# the incremental caches and every artifact of this workspace's own targets (libraries, test
# and bench binaries, build-script outputs), which the next build remakes from the sources.
# Artifacts of registry crates, the expensive part of a cold build, are kept.
set -euo pipefail
cap_gb="${1:-40}"
target="${CARGO_TARGET_DIR:?CARGO_TARGET_DIR must be set}"
[ -d "$target" ] || exit 0
used_gb=$(( $(du -sk "$target" | cut -f1) / 1024 / 1024 ))
if [ "$used_gb" -lt "$cap_gb" ]; then
  exit 0
fi
echo "target dir $target holds ${used_gb} GB (cap ${cap_gb} GB): dropping this workspace's artifacts"
# Target names of this workspace, minus any a registry crate also uses (its artifacts stay).
names=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, re, sys
meta = json.load(sys.stdin)
own = {p["name"] for p in meta["packages"]}
names = set()
for p in meta["packages"]:
    names.add(p["name"])
    names.update(t["name"] for t in p["targets"])
with open("Cargo.lock") as f:
    registry = set(re.findall(r"^name = \"([^\"]+)\"", f.read(), re.M)) - own
taken = {n.replace("-", "_") for n in registry}
print("\n".join(sorted({n.replace("-", "_") for n in names} - taken)))
')
for profile in "$target"/debug "$target"/release "$target"/*/debug "$target"/*/release; do
  [ -d "$profile" ] || continue
  rm -rf "$profile/incremental"
  while read -r n; do
    [ -n "$n" ] || continue
    rm -rf "$profile"/deps/"$n"-* "$profile"/deps/lib"$n"-* "$profile"/.fingerprint/"$n"-* \
      "$profile"/build/"$n"-*
  done <<< "$names"
done
echo "target dir now holds $(( $(du -sk "$target" | cut -f1) / 1024 / 1024 )) GB"
