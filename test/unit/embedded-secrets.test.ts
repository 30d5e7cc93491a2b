import test from "ava";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { loadOrCreateSecrets, natsPassword, natsReadsAsString } from "../../node/embedded.js";
import { TOOLS_BIN } from "../../node/servers.js";

/** nats-server's own verdict on a password given through the environment, as nats.conf takes it. */
async function natsAccepts(password: string, dir: string): Promise<boolean> {
  const conf = path.join(dir, "t.conf");
  await writeFile(conf, "port: -1\nauthorization { users: [ { user: a, password: $PW } ] }\n");
  try {
    await promisify(execFile)(path.join(TOOLS_BIN, "nats-server"), ["-c", conf, "-t"], { env: { ...process.env, PW: password }, timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
}

test("embedded secrets - NATS passwords are strings nats-server reads; an earlier unreadable one is replaced, the master key kept", async (t) => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "runs-secrets-"));
  t.teardown(() => rm(dir, { recursive: true, force: true }));
  // What broke `npm start` about once in 32 data folders: a base64url password starting with "-".
  t.false(await natsAccepts("-Cabc", dir));
  t.false(natsReadsAsString("-Cabc"));
  t.false(natsReadsAsString("2MB"));
  for (let i = 0; i < 2_000; i++) t.true(natsReadsAsString(natsPassword()));
  for (let i = 0; i < 3; i++) t.true(await natsAccepts(natsPassword(), dir));

  const data = path.join(dir, "data");
  const created = await loadOrCreateSecrets(data);
  t.deepEqual(await loadOrCreateSecrets(data), created, "kept across starts");
  await writeFile(path.join(data, "secrets.json"), JSON.stringify({ ...created, nats_tap_password: "-Cabc" }));
  const repaired = await loadOrCreateSecrets(data);
  t.true(natsReadsAsString(repaired.nats_tap_password) && natsReadsAsString(repaired.nats_password));
  t.is(repaired.master_key, created.master_key, "the data stays readable");
  t.deepEqual(JSON.parse(await readFile(path.join(data, "secrets.json"), "utf8")), repaired);
});
