import test from "ava";
import { randomBytes } from "node:crypto";
import { BLOB_CHUNK_BYTES, BlobDecryptError, BlobKeyring, collect, isSealedBlob, once, openBlob, sealBlob } from "../../src/blob-crypto.js";

const ring = new BlobKeyring(Buffer.alloc(32, 9).toString("base64"));
const key = ring.keyFor("files", "ws_a");
const keys = (id: number) => (id === 1 ? key : undefined);
const seal = (data: Uint8Array) => collect(sealBlob(key, 1, once(data)));
const open = (sealed: Uint8Array, keyFor = keys) => collect(openBlob(keyFor, once(sealed)));

/** Splits `data` into pieces of varied sizes, as an object store's chunks would. */
async function* pieces(data: Uint8Array, size: number): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < data.length; i += size) yield data.subarray(i, i + size);
}

test("blob-crypto - round trip at the chunk edges, read back in pieces of any size", async (t) => {
  for (const length of [0, 1, BLOB_CHUNK_BYTES - 1, BLOB_CHUNK_BYTES, BLOB_CHUNK_BYTES + 1, 3 * BLOB_CHUNK_BYTES + 17]) {
    const data = randomBytes(length);
    const sealed = await seal(data);
    t.true(isSealedBlob(sealed));
    t.false(sealed.includes(data.subarray(0, Math.min(32, length))) && length >= 32, "no plaintext in the object");
    for (const size of [1, 7, 4096, 1 << 20]) {
      if (size === 1 && length > BLOB_CHUNK_BYTES) continue; // slow, and covered by 7
      t.deepEqual(await collect(openBlob(keys, pieces(sealed, size))), data, `${length} bytes in pieces of ${size}`);
    }
  }
});

test("blob-crypto - a flipped byte anywhere, a cut, a dropped, repeated or swapped chunk, another workspace's key: all refused", async (t) => {
  const data = randomBytes(2 * BLOB_CHUNK_BYTES + 100);
  const sealed = await seal(data);
  const refused = async (bytes: Uint8Array, why: string, keyFor = keys) => {
    await t.throwsAsync(open(bytes, keyFor), { instanceOf: BlobDecryptError }, why);
  };
  for (const at of [0, 3, 4, 5, 21, 22, 25, 30, 1000, BLOB_CHUNK_BYTES + 40, sealed.length - 1]) {
    const edited = Buffer.from(sealed);
    edited[at] ^= 0x01;
    await refused(edited, `byte ${at}`);
  }
  // Chunks: header 21 bytes, then [4 + 65552] [4 + 65552] [4 + 116].
  const header = sealed.subarray(0, 21);
  const c = (i: number) => sealed.subarray(21 + i * (4 + BLOB_CHUNK_BYTES + 16), 21 + (i + 1) * (4 + BLOB_CHUNK_BYTES + 16));
  const last = sealed.subarray(21 + 2 * (4 + BLOB_CHUNK_BYTES + 16));
  t.deepEqual(await open(Buffer.concat([header, c(0), c(1), last])), data, "the chunks as cut here are the object");
  await refused(Buffer.concat([header, c(0), c(1)]), "last chunk dropped (truncated)");
  await refused(Buffer.concat([header, c(0), last]), "middle chunk dropped");
  await refused(Buffer.concat([header, c(1), c(0), last]), "chunks swapped");
  await refused(Buffer.concat([header, c(0), c(0), c(1), last]), "chunk repeated");
  await refused(Buffer.concat([header, c(0), c(1), last, last]), "data after the last chunk");
  await refused(sealed.subarray(0, sealed.length - 1), "cut by one byte");
  await refused(sealed.subarray(0, 10), "header only");
  await refused(sealed, "another workspace's key", () => ring.keyFor("files", "ws_b"));
  await refused(sealed, "the same workspace, another kind", () => ring.keyFor("checkpoints", "ws_a"));
  await refused(sealed, "an unknown key id", () => undefined);
  await refused(Buffer.from("plain text, never sealed"), "not an encrypted object");
});
