#!/usr/bin/env bash
# ensure-tools.sh — build the local dev/test servers into .tools/bin/:
#   nats-server  (deploy/tools/nats-server)
#   nats         (deploy/tools/natscli)
#   ferretdb     (deploy/tools/ferretdb, MongoDB wire protocol on SQLite)
#
# Versions are pinned by the `tool` directives in deploy/tools/*/go.mod.
# A binary is (re)built only when it is missing or its go.mod changed
# (.tools/stamps/<tool> holds the hash of go.mod + the build recipe).
# Idempotent and safe to run concurrently (mkdir lock, bounded wait).
#
# Exit codes: 0 ok, 3 no usable Go toolchain, 4 lock wait timed out,
# other non-zero: a build failed (go's own output is shown).
#
# Env:
#   RUNS_TOOLS_DIR        install prefix (default: <repo>/.tools)
#   RUNS_TOOLS_LOCK_WAIT  max seconds to wait for another build (default 1200)
#   GO                    go binary to use (default: go on PATH, then /usr/local/go/bin/go)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${RUNS_TOOLS_DIR:-$ROOT/.tools}"
BIN_DIR="$TOOLS_DIR/bin"
STAMP_DIR="$TOOLS_DIR/stamps"
LOCK_DIR="$TOOLS_DIR/.lock"
MOD_ROOT="$ROOT/deploy/tools"

# Bump when the way a tool is built changes (flags, patching), to force rebuilds.
RECIPE="3"

# name | module dir (under deploy/tools) | module path | main package
TOOLS=(
  "nats-server|nats-server|github.com/nats-io/nats-server/v2|github.com/nats-io/nats-server/v2"
  "nats|natscli|github.com/nats-io/natscli|github.com/nats-io/natscli/nats"
  "ferretdb|ferretdb|github.com/FerretDB/FerretDB|github.com/FerretDB/FerretDB/cmd/ferretdb"
)

say() { printf 'runs: %s\n' "$*" >&2; }

hash_stdin() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then shasum -a 256 | cut -d' ' -f1
  else cksum | tr ' ' '-'
  fi
}

# Stamp content for a tool: hash of its go.mod, its patches and the recipe revision.
# Patches a tool's build applies (deploy/tools/<tool>/*.patch) are part of it.
# (No patch is not a failure: under `set -e -o pipefail` a failing cat here ended
# the script silently, right after the first unpatched tool was built.)
want_stamp() {
  local p
  {
    printf 'recipe=%s\n' "$RECIPE"
    cat "$MOD_ROOT/$1/go.mod"
    for p in "$MOD_ROOT/$1"/*.patch; do
      if [[ -f "$p" ]]; then cat "$p"; fi
    done
  } | hash_stdin
}

# Pinned version of module $2 from deploy/tools/$1/go.mod (no go needed).
pinned_version() {
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }
                 $1 == "require" && $2 == m { print $3; exit }' "$MOD_ROOT/$1/go.mod"
}

# Which tools need building? (fast path: no go invocation at all)
stale_tools() {
  local t name dir
  for t in "${TOOLS[@]}"; do
    IFS='|' read -r name dir _ _ <<<"$t"
    if [[ ! -x "$BIN_DIR/$name" || ! -f "$STAMP_DIR/$name" ]] ||
       [[ "$(cat "$STAMP_DIR/$name")" != "$(want_stamp "$dir")" ]]; then
      printf '%s\n' "$t"
    fi
  done
}

STALE="$(stale_tools)"
[[ -z "$STALE" ]] && exit 0

# ---- need a Go toolchain from here on ----------------------------------
no_go() {
  cat >&2 <<'EOF'
runs: cannot build the local servers (nats-server, nats, ferretdb): Go 1.22+ is needed.
runs: Install Go from https://go.dev/dl/ (any 1.22+ works; it fetches the newer
runs: toolchain the pins need by itself), then run scripts/ensure-tools.sh again.
runs: Alternatively, point the service at existing servers instead:
runs:   export NATS_URL=nats://127.0.0.1:4222
runs:   export MONGODB_URI=mongodb://127.0.0.1:27017/runs
runs: or start them with docker:  docker compose -f deploy/compose.yaml up -d
EOF
  exit 3
}

GO_BIN="${GO:-}"
if [[ -z "$GO_BIN" ]]; then
  if command -v go >/dev/null 2>&1; then GO_BIN="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then GO_BIN=/usr/local/go/bin/go
  else no_go
  fi
fi
[[ -x "$GO_BIN" ]] || command -v "$GO_BIN" >/dev/null 2>&1 || no_go
# `go env GOVERSION` exists since 1.16; older or broken installs fail here.
# (run outside our modules and with GOTOOLCHAIN=local to see the installed version)
GOV="$(cd / && GOTOOLCHAIN=local "$GO_BIN" env GOVERSION 2>/dev/null || true)"
if [[ ! "$GOV" =~ ^go1\.([0-9]+) ]] || (( BASH_REMATCH[1] < 22 )); then
  say "found ${GOV:-an unusable go} at $GO_BIN"
  no_go
fi

# ---- lock ----------------------------------------------------------------
mkdir -p "$BIN_DIR" "$STAMP_DIR"
LOCK_WAIT="${RUNS_TOOLS_LOCK_WAIT:-1200}"
# Breaking a stale lock is not perfectly race-free, but the worst case is two
# concurrent builds: each writes its own temp files and renames atomically.
waited=0
nopid=0
announced=0
while ! mkdir "$LOCK_DIR" 2>/dev/null; do
  holder="$(cat "$LOCK_DIR/pid" 2>/dev/null || true)"
  if [[ -n "$holder" ]] && ! kill -0 "$holder" 2>/dev/null; then
    # Holder died without cleaning up: break the stale lock.
    rm -rf "$LOCK_DIR"
    continue
  fi
  if [[ -z "$holder" ]]; then nopid=$((nopid + 1)); else nopid=0; fi
  if (( nopid > 10 )); then
    # Lock dir without pid for 10s: its creator died between mkdir and write.
    rm -rf "$LOCK_DIR"
    nopid=0
    continue
  fi
  if (( announced == 0 )); then
    say "waiting for another ensure-tools.sh (pid ${holder:-?}) to finish building…"
    announced=1
  fi
  if (( waited >= LOCK_WAIT )); then
    say "gave up waiting after ${LOCK_WAIT}s for the lock $LOCK_DIR (remove it if no build is running)"
    exit 4
  fi
  sleep 1
  waited=$((waited + 1))
done
echo $$ >"$LOCK_DIR/pid"
BUILD_TMP=""
cleanup() {
  [[ -n "$BUILD_TMP" ]] && rm -rf "$BUILD_TMP"
  rm -rf "$LOCK_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Another process may have built everything while we waited.
STALE="$(stale_tools)"
[[ -z "$STALE" ]] && exit 0

# ---- build ---------------------------------------------------------------
export CGO_ENABLED=0
# Don't let a caller's GOFLAGS (e.g. -mod=vendor) change what the pins mean.
export GOFLAGS="-mod=readonly"
BUILD_FLAGS=(-trimpath -buildvcs=false -ldflags=-s\ -w)

# FerretDB 1.24's SQLite backend answers only a bare `_id` from an index (and even that
# spelled differently from the index, so it scanned), and its concurrent writes wait for
# SQLite's write lock by sleeping. The patches in deploy/tools/ferretdb (see
# deploy/tools/README.md) make `_id` lookups use their index, let SQLite's indexes
# narrow and order rows for equality, $in and range filters (typed-pushdown.patch),
# commit the one-document statements of an update command together (update-batch.patch),
# and queue transactions in FerretDB (write-queue.patch). A patch that does not apply fails
# the build.
patch_ferretdb() { # $1 module source dir
  local patch
  for patch in "$MOD_ROOT"/ferretdb/*.patch; do
    # GIT_CEILING_DIRECTORIES: apply as a plain patch, not inside this checkout's repository.
    if command -v git >/dev/null 2>&1; then
      (cd "$1" && GIT_CEILING_DIRECTORIES="$(dirname "$1")" git apply --whitespace=nowarn "$patch")
    elif command -v patch >/dev/null 2>&1; then
      (cd "$1" && patch -p1 -s <"$patch")
    else
      say "applying $patch needs git or patch (the Debian package 'patch'); neither is installed"; return 1
    fi || { say "FerretDB patch $patch did not apply"; return 1; }
  done
}

build_ferretdb() { # $1 module dir, $2 module path, $3 pkg, $4 version, $5 out
  # See deploy/tools/ferretdb/go.mod for why: FerretDB needs
  # build/version/version.txt, which its module zip lacks.
  local src
  src="$(cd "$1" && "$GO_BIN" mod download -json "$2" |
         sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -n "$src" && -d "$src" ]] || { say "could not locate $2 in the module cache"; return 1; }
  BUILD_TMP="$TOOLS_DIR/build/ferretdb.$$"
  rm -rf "$BUILD_TMP"
  mkdir -p "$BUILD_TMP"
  cp "$1/go.mod" "$1/go.sum" "$BUILD_TMP/"
  cp -R "$src" "$BUILD_TMP/src"
  chmod -R u+w "$BUILD_TMP/src"
  printf '%s\n' "$4" >"$BUILD_TMP/src/build/version/version.txt"
  patch_ferretdb "$BUILD_TMP/src" || return 1
  local status=0
  (cd "$BUILD_TMP" &&
    "$GO_BIN" mod edit -replace "$2=./src" &&
    "$GO_BIN" build "${BUILD_FLAGS[@]}" -o "$5" "$3") || status=$?
  rm -rf "$BUILD_TMP"
  rmdir "$TOOLS_DIR/build" 2>/dev/null || true
  BUILD_TMP=""
  return "$status"
}

# Said once, before the long part: the first build takes minutes, later starts none.
if [[ "$(printf '%s\n' "$STALE" | grep -c .)" == "${#TOOLS[@]}" ]]; then
  say "building the local servers once (nats-server, nats, ferretdb into .tools/bin): about 3 minutes; later starts take under a second"
fi

while IFS='|' read -r name dir modpath pkg; do
  [[ -n "$name" ]] || continue
  ver="$(pinned_version "$dir" "$modpath")"
  why="first run only"
  if [[ -x "$BIN_DIR/$name" ]]; then
    why="pinned version or patch changed"
    [[ -f "$STAMP_DIR/$name" ]] || why="no build stamp"
  fi
  say "building $name ${ver:-?} ($why)…"
  start=$SECONDS
  out="$BIN_DIR/.$name.tmp.$$"
  rm -f "$out"
  if [[ "$name" == ferretdb ]]; then
    build_ferretdb "$MOD_ROOT/$dir" "$modpath" "$pkg" "$ver" "$out" || { rm -f "$out"; say "building $name failed"; exit 1; }
  else
    (cd "$MOD_ROOT/$dir" && "$GO_BIN" build "${BUILD_FLAGS[@]}" -o "$out" "$pkg") ||
      { rm -f "$out"; say "building $name failed"; exit 1; }
  fi
  mv -f "$out" "$BIN_DIR/$name"
  want_stamp "$dir" >"$STAMP_DIR/$name"
  say "built $BIN_DIR/$name in $((SECONDS - start))s"
done <<<"$STALE"
