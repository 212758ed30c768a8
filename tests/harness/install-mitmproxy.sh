#!/usr/bin/env bash
# Installs mitmproxy (a TLS-intercepting proxy nobody here wrote), pinned, into a virtualenv
# cached by its pin under ~/.cache/cairn. Prints the path of its mitmdump.
set -euo pipefail

PIN=mitmproxy==11.0.2
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
tag="$(printf '%s\n' "$PIN" | sha256sum | cut -c1-12)"
VENV="$CAIRN_CACHE/mitmproxy-$tag"

if [ ! -x "$VENV/bin/mitmdump" ] || ! "$VENV/bin/mitmdump" --version >/dev/null 2>&1; then
  rm -rf "$VENV.tmp"
  python3 -m venv "$VENV.tmp"
  "$VENV.tmp/bin/python" -m pip install -q --disable-pip-version-check "$PIN" >&2
  rm -rf "$VENV"
  mv "$VENV.tmp" "$VENV"
  # A venv records its own path: recreate the launcher scripts' paths after the move.
  sed -i "s#$VENV.tmp#$VENV#g" "$VENV"/bin/* 2>/dev/null || true
fi
echo "$VENV/bin/mitmdump"
