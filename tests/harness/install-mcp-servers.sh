#!/usr/bin/env bash
# Installs the real MCP servers the agent's MCP tests start, pinned and cached by the pin set
# under ~/.cache/cairn: the reference servers from npm (@modelcontextprotocol/server-filesystem
# over stdio, @modelcontextprotocol/server-everything over streamable HTTP) and the official
# Python MCP SDK from PyPI (for tests/mcp/compact_server.py). Prints two lines:
#   node_modules=DIR  (DIR/.bin holds mcp-server-filesystem and mcp-server-everything)
#   python=PATH       (a python with the `mcp` package)
set -euo pipefail

NPM_PINS=(@modelcontextprotocol/server-filesystem@2026.8.31 @modelcontextprotocol/server-everything@2026.8.31)
PY_PINS=(mcp==2.3.0)
CAIRN_CACHE="${CAIRN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn}"

tag="$(printf '%s\n' "${NPM_PINS[@]}" | sha256sum | cut -c1-12)"
NODE_DIR="$CAIRN_CACHE/mcp-node-$tag"
if [ ! -x "$NODE_DIR/node_modules/.bin/mcp-server-filesystem" ] || [ ! -x "$NODE_DIR/node_modules/.bin/mcp-server-everything" ]; then
  rm -rf "$NODE_DIR.tmp"
  mkdir -p "$NODE_DIR.tmp"
  (cd "$NODE_DIR.tmp" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund "${NPM_PINS[@]}" >&2)
  rm -rf "$NODE_DIR"
  mv "$NODE_DIR.tmp" "$NODE_DIR"
fi

tag="$(printf '%s\n' "${PY_PINS[@]}" | sha256sum | cut -c1-12)"
VENV="$CAIRN_CACHE/mcp-py-$tag"
# The module tests/mcp/compact_server.py imports, as a file: importing the SDK takes seconds,
# and every test binary that starts an MCP server asks.
if [ ! -x "$VENV/bin/python" ] || ! compgen -G "$VENV/lib/python3*/site-packages/mcp/server/mcpserver/__init__.py" >/dev/null; then
  rm -rf "$VENV.tmp"
  python3 -m venv "$VENV.tmp"
  "$VENV.tmp/bin/python" -m pip install -q --disable-pip-version-check "${PY_PINS[@]}" >&2
  rm -rf "$VENV"
  mv "$VENV.tmp" "$VENV"
  sed -i "s#$VENV.tmp#$VENV#g" "$VENV"/bin/* 2>/dev/null || true
fi
echo "node_modules=$NODE_DIR/node_modules"
echo "python=$VENV/bin/python"
