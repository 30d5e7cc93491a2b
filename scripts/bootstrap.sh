#!/usr/bin/env bash
# bootstrap.sh — everything a fresh clone needs; cheap and silent when done.
#   1. npm dependencies: `npm ci` (or `npm install` without a lockfile) when
#      node_modules is missing or package-lock.json is newer than
#      node_modules/.package-lock.json.
#   2. local servers (nats-server, nats, ferretdb) via scripts/ensure-tools.sh,
#      unless RUNS_SKIP_TOOLS=1 (e.g. when NATS_URL / MONGODB_URI point at
#      existing servers).
#   3. the tool sandbox's host tools (bwrap, socat) via scripts/ensure-sandbox.sh.
# Exit code is that of the failing step (ensure-tools.sh: 3 = no Go;
# ensure-sandbox.sh: 5 = no bwrap).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'runs: %s\n' "$*" >&2; }

need_npm=0
if [[ ! -d node_modules ]]; then
  need_npm=1
elif [[ -f package-lock.json ]]; then
  if [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]; then
    need_npm=1
  fi
fi

if (( need_npm )); then
  if ! command -v npm >/dev/null 2>&1; then
    say "npm not found: install Node.js 20+ (it ships npm), then run scripts/bootstrap.sh again."
    exit 2
  fi
  if [[ -f package-lock.json ]]; then
    say "installing npm dependencies (npm ci)…"
    npm ci --no-audit --no-fund >&2
  else
    say "installing npm dependencies (npm install; no package-lock.json)…"
    npm install --no-audit --no-fund >&2
  fi
fi

# npm runs it after every install; here too, for a node_modules installed before it existed.
node "$ROOT/scripts/patch-pi-ai.mjs" >/dev/null

if [[ "${RUNS_SKIP_TOOLS:-}" != 1 ]]; then
  "$ROOT/scripts/ensure-tools.sh"
fi

"$ROOT/scripts/ensure-sandbox.sh"
