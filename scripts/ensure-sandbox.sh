#!/usr/bin/env bash
# ensure-sandbox.sh — the host tools tool sandboxes need (README "Sandbox"):
#   bwrap  (package bubblewrap): required unless RUNS_SANDBOX=off
#   socat  (package socat): only for deployments with a network allow list
# Installs them with apt-get when running as root on a Debian/Ubuntu host; otherwise
# stops with one sentence (exit 5) when bwrap is missing. Silent when all is there.
#
# Env:
#   RUNS_SANDBOX=off             skip the bwrap requirement (local development only)
#   RUNS_BOOTSTRAP_NO_INSTALL=1  never install, only check (tests use it)
set -uo pipefail

say() { printf 'runs: %s\n' "$*" >&2; }

have() { command -v "$1" >/dev/null 2>&1; }

missing=()
have bwrap || missing+=(bubblewrap)
have socat || missing+=(socat)
(( ${#missing[@]} == 0 )) && exit 0

can_install=0
if [[ "${RUNS_BOOTSTRAP_NO_INSTALL:-}" != 1 && "$(id -u)" == 0 ]] && have apt-get; then
  can_install=1
fi

if (( can_install )); then
  say "installing ${missing[*]} (tool sandbox)…"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    # A fresh machine may have no package lists yet.
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || true
  fi
fi

if ! have bwrap; then
  if [[ "${RUNS_SANDBOX:-}" == off ]]; then
    say "warning: bubblewrap (bwrap) is not installed; RUNS_SANDBOX=off runs tool commands UNCONFINED (local development only)."
  else
    say "bubblewrap (bwrap) is required to sandbox agent tools: install the package 'bubblewrap' (apt-get install bubblewrap, dnf install bubblewrap, apk add bubblewrap), or set RUNS_SANDBOX=off for local development only."
    exit 5
  fi
fi
if ! have socat; then
  say "warning: socat is not installed: deployments with config.network.allow cannot reach the network (install the package 'socat')."
fi
exit 0
