import test from "ava";
import { randomBytes } from "node:crypto";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { type ObjectInfo, Objm } from "@nats-io/obj";
import { systemClock } from "../../src/clock.js";
import { connectNats } from "../../src/nats.js";
import { isTransientFailure } from "../../src/transient.js";
import { ObjectReadUnavailableError, readObjectChunks } from "../../src/object-read.js";
import { startTestServers } from "../helpers/servers.js";

/**
 * An object read with back-pressure (src/object-read.ts): a reader that takes its chunks
 * slowly holds a few pulls' bytes, not the object (the object store's own `get` pushes it
 * all); what came is checked against the object's size and digest; a NATS failure is
 * transient. Real nats-server and object store.
 */
test("object read - a slow reader is sent a few pulls' bytes, not the object; read whole, it is the object; a wrong size or digest fails; NATS failing is transient", async (t) => {
  const servers = await startTestServers();
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "object-read-test" });
  try {
    const jsm = await jetstreamManager(nc);
    const bucket = await new Objm(jetstream(nc)).create("object_read_test");
    const data = randomBytes(24 * 1024 * 1024);
    await bucket.putBlob({ name: "big" }, data);
    const info = (await bucket.info("big"))!;

    // The first chunk, then a pause: what arrives meanwhile is bounded.
    const before = nc.stats().inBytes;
    const slow = readObjectChunks(nc, jsm, systemClock, "object_read_test", info);
    const first = await slow.next();
    t.false(first.done);
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const held = nc.stats().inBytes - before;
    t.true(held < 4 * 1024 * 1024, `${held} bytes came while the reader held its first chunk of a 24 MiB object`);
    const parts: Uint8Array[] = [first.value as Uint8Array];
    for await (const chunk of slow) parts.push(chunk);
    t.true(Buffer.concat(parts).equals(data), "read whole, it is the object");
    const consumers = await jsm.consumers.list("OBJ_object_read_test").next();
    t.is(consumers.length, 0, "the read's consumer is removed");

    // Stopped early: the read ends, its consumer is removed.
    const stopped = readObjectChunks(nc, jsm, systemClock, "object_read_test", info);
    await stopped.next();
    await stopped.return(undefined);
    t.is((await jsm.consumers.list("OBJ_object_read_test").next()).length, 0);

    // Not the object the info describes (its fields are getters: copied by name).
    const described = (changes: Partial<ObjectInfo>) => ({ name: info.name, nuid: info.nuid, size: info.size, chunks: info.chunks, digest: info.digest, ...changes }) as ObjectInfo;
    const readAll = async (changes: Partial<ObjectInfo>) => {
      for await (const _ of readObjectChunks(nc, jsm, systemClock, "object_read_test", described(changes)));
    };
    await t.notThrowsAsync(readAll({}), "the copy describes the object");
    const digest = await t.throwsAsync(readAll({ digest: `SHA-256=${randomBytes(32).toString("base64url")}` }));
    t.regex(digest!.message, /corrupt/);
    t.false(isTransientFailure(digest));
    t.regex((await t.throwsAsync(readAll({ size: info.size - 1 })))!.message, /longer than/);
    t.regex((await t.throwsAsync(readAll({ size: info.size + 1 })))!.message, /corrupt/);
    // Its chunks gone (purged): failed at once, not waited for.
    t.regex((await t.throwsAsync(readAll({ nuid: "purgedchunks0000000000" })))!.message, /0 of its 192 chunks are stored/);

    // NATS cannot serve it (no such stream): transient, worth reading again.
    const missing = await t.throwsAsync(async () => {
      for await (const _ of readObjectChunks(nc, jsm, systemClock, "no_such_bucket", info));
    });
    t.true(missing instanceof ObjectReadUnavailableError, String(missing));
    t.true(isTransientFailure(missing));
  } finally {
    await nc.close();
    await servers.stop();
  }
});
