import test from "ava";
import { createHash, randomBytes } from "node:crypto";
import { jetstream, jetstreamManager, JetStreamApiError } from "@nats-io/jetstream";
import { type ObjectInfo, Objm } from "@nats-io/obj";
import { systemClock } from "../../src/clock.js";
import { connectNats } from "../../src/nats.js";
import { isTransientFailure } from "../../src/transient.js";
import { ObjectCorruptError, ObjectReadUnavailableError, readObjectChunks } from "../../src/object-read.js";
import { startTestServers } from "../helpers/servers.js";

/**
 * An object read with back-pressure (src/object-read.ts): a reader that takes its chunks
 * slowly holds a few pulls' bytes, not the object (the object store's own `get` pushes it
 * all); what came is checked against the object's size and digest; an object whose chunks
 * went (saved again, deleted) while it was read is read again, one that is not whole is
 * corrupt; NATS failing is transient, JetStream refusing is not. Real nats-server and
 * object store.
 */
test("object read - a slow reader is sent a few pulls' bytes, not the object; read whole, it is the object; stopped, its consumer goes", async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "object-read-test" });
  try {
    const jsm = await jetstreamManager(nc);
    const bucket = await new Objm(jetstream(nc)).create("object_read_test");
    const r = { nc, jsm, clock: systemClock, bucket: "object_read_test", current: (name: string) => bucket.info(name) };
    const data = randomBytes(24 * 1024 * 1024);
    await bucket.putBlob({ name: "big" }, data);
    const info = (await bucket.info("big"))!;

    // The first chunk, then a pause: what arrives meanwhile is bounded.
    const before = nc.stats().inBytes;
    const slow = readObjectChunks(r, info);
    const first = await slow.next();
    t.false(first.done);
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const held = nc.stats().inBytes - before;
    t.log(`${held} bytes received while the reader held its first chunk`);
    t.true(held < 4 * 1024 * 1024, `${held} bytes came while the reader held its first chunk of a 24 MiB object`);
    const parts: Uint8Array[] = [first.value as Uint8Array];
    for await (const chunk of slow) parts.push(chunk);
    t.true(Buffer.concat(parts).equals(data), "read whole, it is the object");
    t.deepEqual(await jsm.consumers.list("OBJ_object_read_test").next(), [], "the read's consumer is removed");

    // Stopped early: the read ends, its consumer is removed.
    const stopped = readObjectChunks(r, info);
    await stopped.next();
    await stopped.return(undefined);
    t.deepEqual(await jsm.consumers.list("OBJ_object_read_test").next(), []);
  } finally {
    await nc.close();
    await servers.stop();
  }
});

test("object read - what is not the object it is said to be fails: corrupt when its size, digest or chunks are wrong, read again when it changed meanwhile; NATS away is transient, JetStream refusing is not", async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "object-read-test" });
  try {
    const jsm = await jetstreamManager(nc);
    const bucket = await new Objm(jetstream(nc)).create("object_read_test");
    const r = { nc, jsm, clock: systemClock, bucket: "object_read_test", current: (name: string) => bucket.info(name), stallMs: 500 };
    const data = randomBytes(4 * 1024 * 1024);
    await bucket.putBlob({ name: "obj" }, data);
    const info = (await bucket.info("obj"))!;
    // Its fields are getters: copied by name.
    const described = (changes: Partial<ObjectInfo>) => ({ name: info.name, nuid: info.nuid, size: info.size, chunks: info.chunks, digest: info.digest, ...changes }) as ObjectInfo;
    const readAll = async (changes: Partial<ObjectInfo>, over = r) => {
      const parts: Uint8Array[] = [];
      for await (const chunk of readObjectChunks(over, described(changes))) parts.push(chunk);
      return Buffer.concat(parts);
    };
    t.true((await readAll({})).equals(data), "the copy describes the object");
    t.true((await readAll({ digest: `SHA-256=${createHash("sha256").update(data).digest("hex")}` })).equals(data), "a digest in hex is the same digest");

    const corrupt = async (changes: Partial<ObjectInfo>, pattern: RegExp, over = r) => {
      const error = await t.throwsAsync(readAll(changes, over));
      t.true(error instanceof ObjectCorruptError, String(error));
      t.false(isTransientFailure(error));
      t.regex(error!.message, pattern);
    };
    await corrupt({ digest: `SHA-256=${randomBytes(32).toString("base64url")}` }, /size or digest does not match/);
    await corrupt({ digest: "MD5=abc" }, /unknown kind/);
    await corrupt({ size: info.size - 1 }, /longer than/);
    await corrupt({ size: info.size + 1 }, /size or digest does not match/);
    // Its chunks are gone, and its metadata still names them: not whole.
    await corrupt({ nuid: "gonechunks000000000000" }, /0 of its 32 chunks are stored/, { ...r, current: async () => described({ nuid: "gonechunks000000000000" }) });
    // Its metadata names other chunks now (saved again): read again.
    const changed = await t.throwsAsync(readAll({ nuid: "gonechunks000000000000" }));
    t.true(changed instanceof ObjectReadUnavailableError && isTransientFailure(changed), String(changed));
    t.regex(changed!.message, /changed while it was read/);

    // Deleted while it is read: its chunks go under the read, which ends (not waits forever).
    const reading = readObjectChunks(r, info);
    await reading.next();
    await bucket.delete("obj");
    const started = Date.now();
    const deleted = await t.throwsAsync(async () => {
      for await (const _ of reading);
    });
    t.true(deleted instanceof ObjectReadUnavailableError, String(deleted));
    t.regex(deleted!.message, /changed while it was read/);
    t.true(Date.now() - started < 20_000, `${Date.now() - started} ms`);

    // JetStream refuses (no such bucket): as it is, not transient.
    const refused = await t.throwsAsync(readAll({}, { ...r, bucket: "no_such_bucket" }));
    t.true(refused instanceof JetStreamApiError && !isTransientFailure(refused), String(refused));

    // NATS away mid-read (the connection closed): transient.
    await bucket.putBlob({ name: "again" }, data);
    const other = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "object-read-closing" });
    const closing = readObjectChunks({ ...r, nc: other, jsm: await jetstreamManager(other) }, (await bucket.info("again"))!);
    await closing.next();
    await other.close();
    const away = await t.throwsAsync(async () => {
      for await (const _ of closing);
    });
    t.true(away instanceof ObjectReadUnavailableError && isTransientFailure(away), String(away));
  } finally {
    await nc.close();
    await servers.stop();
  }
});
