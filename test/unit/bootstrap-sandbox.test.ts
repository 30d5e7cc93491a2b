/**
 * scripts/ensure-sandbox.sh (run by `npm start`, `npm test` and the bench): with
 * bwrap hidden from PATH, it installs through apt-get as root, or stops with one
 * sentence; RUNS_SANDBOX=off only warns.
 */
import test from "ava";
import { spawnSync } from "node:child_process";
import { mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";

const script = path.resolve("scripts/ensure-sandbox.sh");

/** A PATH with only `id` (and whatever `extra` adds): bwrap and socat are missing. */
async function bareBin(extra: Record<string, string> = {}): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-bootstrap-"));
  await symlink("/usr/bin/id", path.join(dir, "id"));
  for (const [name, body] of Object.entries(extra)) await writeFile(path.join(dir, name), body, { mode: 0o755 });
  return dir;
}

function run(bin: string, env: Record<string, string> = {}) {
  const result = spawnSync("/bin/bash", [script], { env: { PATH: bin, ...env }, encoding: "utf8", timeout: 30_000 });
  return { code: result.status, stderr: result.stderr.trim() };
}

test("bootstrap - without bwrap and unable to install, it stops with exit 5 and one sentence", async (t) => {
  const bin = await bareBin();
  try {
    const { code, stderr } = run(bin, { RUNS_BOOTSTRAP_NO_INSTALL: "1" });
    t.is(code, 5);
    t.is(stderr.split("\n").length, 1, stderr);
    t.regex(stderr, /^runs: bubblewrap \(bwrap\) is required .*'bubblewrap'.*RUNS_SANDBOX=off/);
  } finally {
    await rm(bin, { recursive: true, force: true });
  }
});

test("bootstrap - RUNS_SANDBOX=off without bwrap warns and goes on", async (t) => {
  const bin = await bareBin();
  try {
    const { code, stderr } = run(bin, { RUNS_BOOTSTRAP_NO_INSTALL: "1", RUNS_SANDBOX: "off" });
    t.is(code, 0);
    t.regex(stderr, /UNCONFINED/);
    t.regex(stderr, /socat is not installed/);
  } finally {
    await rm(bin, { recursive: true, force: true });
  }
});

test("bootstrap - as root with apt-get, it installs bubblewrap and socat (after an update when the lists are missing)", async (t) => {
  if (process.getuid?.() !== 0) return t.pass("needs root to take the install path");
  const log = path.join(os.tmpdir(), `runs-apt-${process.pid}.log`);
  // A stand-in apt-get: the first install fails (no lists), update, then install "installs" by creating the tools.
  const bin = await bareBin({
    "apt-get": `#!/bin/bash\necho "$*" >> ${log}\nif [ "$1" = install ] && [ ! -f ${log}.updated ]; then exit 100; fi\nif [ "$1" = update ]; then /usr/bin/touch ${log}.updated; exit 0; fi\nfor t in bwrap socat; do printf '#!/bin/sh\\n' > "\${0%/*}/$t"; /bin/chmod +x "\${0%/*}/$t"; done\n`,
  });
  try {
    const { code, stderr } = run(bin);
    t.is(code, 0, stderr);
    t.is(stderr, "runs: installing bubblewrap socat (tool sandbox)…");
    const calls = (await readFile(log, "utf8")).trim().split("\n");
    t.is(calls.length, 3);
    t.regex(calls[0]!, /^install .*bubblewrap socat/);
    t.regex(calls[1]!, /^update/);
    t.regex(calls[2]!, /^install .*bubblewrap socat/);
    // Everything present: silent.
    t.deepEqual(run(bin), { code: 0, stderr: "" });
  } finally {
    await rm(bin, { recursive: true, force: true });
    await rm(log, { force: true });
    await rm(`${log}.updated`, { force: true });
  }
});

test("config - a placeholder secret from an example file refuses to start, in one sentence", async (t) => {
  const { loadConfig } = await import("../../src/config.js");
  for (const [name, value] of [
    ["NATS_PASSWORD", "change-me-service"],
    ["RUNS_MASTER_KEY", "REPLACE-with-32-random-bytes-base64"],
    ["MONGODB_URI", "mongodb://root:change-me@mongo:27017/"],
  ] as const) {
    const err = t.throws(() => loadConfig({ [name]: value }));
    t.is(err!.message, `configuration: ${name}: holds a placeholder from an example file (change-me, REPLACE…); set a random secret`);
  }
  t.notThrows(() => loadConfig({ NATS_PASSWORD: "a3f9c0d1e2", RUNS_MASTER_KEY: Buffer.alloc(32, 1).toString("base64") }));
});
