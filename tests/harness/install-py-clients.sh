#!/usr/bin/env bash
# Installs the official agent-framework clients the API tests drive a session with, pinned,
# into one virtualenv cached by the pin set: the OpenAI Python SDK, the OpenAI Agents SDK and
# LangChain's ChatOpenAI, all from PyPI. Prints the venv's python.
set -euo pipefail

PINS=(openai==3.57.0 openai-agents==0.24.0 langchain-openai==1.7.4)
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"
tag="$(printf '%s\n' "${PINS[@]}" | sha256sum | cut -c1-12)"
VENV="$CAIRN_CACHE/py-clients-$tag"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import agents, openai, langchain_openai' 2>/dev/null; then
  rm -rf "$VENV.tmp"
  python3 -m venv "$VENV.tmp"
  "$VENV.tmp/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}" >&2
  rm -rf "$VENV"
  mv "$VENV.tmp" "$VENV"
  # A venv records its own path: recreate the launcher scripts' paths after the move.
  sed -i "s#$VENV.tmp#$VENV#g" "$VENV"/bin/* 2>/dev/null || true
fi
echo "$VENV/bin/python"
