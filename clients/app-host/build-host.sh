#!/usr/bin/env bash
# Build the MCP App test host (tests/integration/test_app_card_host.py) from pinned npm packages:
# host.js plus the ext-apps app-bridge bundled by esbuild into dist/host.js, axe-core copied beside it.
# Installs from package-lock.json when it changed (CI runs this from nothing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# One build at a time: each pytest-xdist worker that collects the host test runs this script.
exec 9>"$here/.build.lock"
flock 9
stamp="$here/node_modules/.installed-from-package-lock.json"
if ! cmp -s "$here/package-lock.json" "$stamp" 2>/dev/null; then
    echo "== npm ci (pinned: clients/app-host/package-lock.json)"
    npm ci --prefix "$here" --no-audit --no-fund --loglevel=error
    cp "$here/package-lock.json" "$stamp"
fi
mkdir -p "$here/dist"
"$here/node_modules/.bin/esbuild" "$here/host.js" --bundle --format=iife --platform=browser \
    --target=es2022 --log-level=warning --outfile="$here/dist/host.js"
cp "$here/node_modules/axe-core/axe.min.js" "$here/dist/axe.min.js"
echo "== MCP App test host built: $here/dist"
