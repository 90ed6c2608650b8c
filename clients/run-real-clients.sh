#!/usr/bin/env bash
# Real MCP clients against `pollwarden serve`: the MCP Inspector CLI (stdio and streamable HTTP,
# both protocol eras) and the conformance suite's server scenarios. The npm packages, and the
# Node 22 they need, are pinned in package-lock.json and installed from it here. (`npm install
# --no-save`, not `npm ci`: vite, under the Inspector, names an optional Windows-only package the
# registry does not serve, which `npm ci` takes for a lock out of sync; the locked tree is the same.)
# Usage: clients/run-real-clients.sh   (uses .venv/bin/python, or $PYTHON)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"

stamp="$here/node_modules/.installed-from-package-lock.json"
if ! cmp -s "$here/package-lock.json" "$stamp" 2>/dev/null; then
    echo "== npm install (pinned: package-lock.json)"
    npm install --prefix "$here" --no-save --no-audit --no-fund --loglevel=error
    cp "$here/package-lock.json" "$stamp"
fi
export PATH="$here/node_modules/.bin:$PATH"
echo "== real clients (Node $(node --version))"
exec "$python" "$here/run_real_clients.py"
