/**
 * scripts/ensure-tools.sh (run by `npm start`, `npm test` and the bench), driven with a
 * stand-in `go` that records builds instead of compiling: on an empty tools folder it
 * builds all three servers in one run (applying the FerretDB patches to the real module
 * source), writes their stamps, and a second run builds nothing. A missing Go ends in
 * exit 3 and plain words, not a stack trace.
 */
import test, { type ExecutionContext } from "ava";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

const script = path.resolve("scripts/ensure-tools.sh");

function realGo(): string | undefined {
  const found = spawnSync("/bin/bash", ["-c", "command -v go || true"], { encoding: "utf8" }).stdout.trim();
  if (found) return found;
  return existsSync("/usr/local/go/bin/go") ? "/usr/local/go/bin/go" : undefined;
}

/**
 * A `go` that answers the version, asks the real go where a module's source is (the
 * module cache, filled by the bootstrap), and for `build -o OUT PKG` writes OUT and logs
 * the package. The FerretDB source it builds from is the patched copy, so the script's
 * patch step runs for real.
 */
function fakeGo(real: string, log: string, failing = ""): string {
  return `#!/bin/bash
set -e
case "$1" in
  env) echo go1.26.8 ;;
  mod)
    if [[ "$2" == download ]]; then exec "${real}" "$@"; fi
    exit 0 ;;
  build)
    out=""; prev=""
    for a in "$@"; do
      if [[ "$prev" == -o ]]; then out="$a"; fi
      prev="$a"
    done
    echo "build \${@: -1}" >>"${log}"
    if [[ -n "${failing}" && "\${@: -1}" == *"${failing}"* ]]; then echo "compile error" >&2; exit 1; fi
    if [[ -f src/internal/backends/sqlite/pushdown.go ]]; then echo "patched" >>"${log}"; fi
    if grep -q UpdateDocumentDeferred src/internal/handler/common/update.go 2>/dev/null; then echo "updates batched" >>"${log}"; fi
    if grep -q QueueWrites src/internal/util/fsql/db.go 2>/dev/null; then echo "writes queued" >>"${log}"; fi
    printf '#!/bin/sh\\n' >"$out"; chmod +x "$out" ;;
  *) echo "fake go: unexpected $*" >&2; exit 9 ;;
esac
`;
}

function run(env: Record<string, string>) {
  const result = spawnSync("/bin/bash", [script], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/root", ...env },
    encoding: "utf8",
    timeout: 120_000,
  });
  return { code: result.status, stderr: result.stderr };
}

/**
 * Runs `body` with a temp dir holding a stand-in `go` (failing builds of `failing`), its
 * build log and a tools folder; fails the test when this machine has no Go at all.
 */
async function withFakeGo(
  t: ExecutionContext,
  failing: string,
  body: (env: { go: string; fake: string; log: string; tools: string }) => Promise<void>,
): Promise<void> {
  const go = realGo();
  if (!go) {
    t.fail("no go toolchain on this machine: the bootstrap that runs before the tests needs it too");
    return;
  }
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-ensure-tools-"));
  try {
    const log = path.join(dir, "builds.log");
    const fake = path.join(dir, "go");
    await writeFile(fake, fakeGo(go, log, failing), { mode: 0o755 });
    await body({ go, fake, log, tools: path.join(dir, "tools") });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test("ensure-tools - an empty tools folder gets all three servers and stamps in one run; the next run builds nothing", async (t) => {
  await withFakeGo(t, "", async ({ fake, log, tools }) => {

    const first = run({ GO: fake, RUNS_TOOLS_DIR: tools });
    t.is(first.code, 0, first.stderr);
    t.deepEqual((await readdir(path.join(tools, "bin"))).sort(), ["ferretdb", "nats", "nats-server"]);
    t.deepEqual((await readdir(path.join(tools, "stamps"))).sort(), ["ferretdb", "nats", "nats-server"]);
    const builds = (await readFile(log, "utf8")).trim().split("\n");
    t.deepEqual(builds, [
      "build github.com/nats-io/nats-server/v2",
      "build github.com/nats-io/natscli/nats",
      "build github.com/FerretDB/FerretDB/cmd/ferretdb",
      "patched",
      "updates batched",
      "writes queued",
    ]);
    t.regex(first.stderr, /built .*ferretdb/);
    t.false(existsSync(path.join(tools, ".lock")), "the lock is released");
    t.false(existsSync(path.join(tools, "build")), "the build folder is cleaned up");

    const second = run({ GO: fake, RUNS_TOOLS_DIR: tools });
    t.is(second.code, 0, second.stderr);
    t.is(second.stderr, "");
    t.is((await readFile(log, "utf8")).trim().split("\n").length, builds.length, "nothing rebuilt");
  });
});

test("ensure-tools - a build that fails ends in exit 1 naming the tool; no binary or stamp is left for it, the next run tries again", async (t) => {
  await withFakeGo(t, "ferretdb", async ({ go, fake, log, tools }) => {
    const failed = run({ GO: fake, RUNS_TOOLS_DIR: tools });
    t.is(failed.code, 1, failed.stderr);
    t.regex(failed.stderr, /building ferretdb failed/);
    t.notRegex(failed.stderr, /cannot stat/);
    t.deepEqual((await readdir(path.join(tools, "bin"))).sort(), ["nats", "nats-server"]);
    t.deepEqual((await readdir(path.join(tools, "stamps"))).sort(), ["nats", "nats-server"]);
    t.false(existsSync(path.join(tools, ".lock")), "the lock is released");
    t.false(existsSync(path.join(tools, "build")), "the build folder is cleaned up");

    await writeFile(fake, fakeGo(go, log), { mode: 0o755 });
    const retried = run({ GO: fake, RUNS_TOOLS_DIR: tools });
    t.is(retried.code, 0, retried.stderr);
    t.deepEqual((await readdir(path.join(tools, "bin"))).sort(), ["ferretdb", "nats", "nats-server"]);
    t.deepEqual((await readFile(log, "utf8")).trim().split("\n").slice(-4), ["build github.com/FerretDB/FerretDB/cmd/ferretdb", "patched", "updates batched", "writes queued"]);
  });
});

test("ensure-tools - without Go it exits 3 with what to do instead", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-ensure-tools-"));
  try {
    const result = spawnSync("/bin/bash", [script], {
      env: { PATH: "/usr/bin:/bin", GO: path.join(dir, "no-such-go"), RUNS_TOOLS_DIR: path.join(dir, "tools") },
      encoding: "utf8",
      timeout: 30_000,
    });
    t.is(result.status, 3, result.stderr);
    t.regex(result.stderr, /Go 1\.22\+ is needed/);
    t.regex(result.stderr, /docker compose -f deploy\/compose\.yaml up -d/);
    t.notRegex(result.stderr, /\n\s+at /, "no stack trace");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
