import { randomBytes } from "node:crypto";
import nacl from "tweetnacl";
import { deriveLabelledKey, masterKeyBytes } from "./event-crypto.js";

/**
 * Encryption of stored objects (uploaded files, workspace checkpoints): tweetnacl
 * secretbox (XSalsa20-Poly1305, as events) under a per-workspace key derived from the
 * master key with a label per kind, in chunks, so objects of any size stream through.
 *
 *     header:  "RBX" | version (1) | key id (1) | nonce prefix (16)
 *     chunk:   length of the sealed chunk (uint32 BE) | secretbox(plaintext ≤ 64 KiB)
 *
 * A chunk's nonce is the prefix, its index (uint32 BE) and a final flag (uint32 BE, 1
 * on the last chunk): chunks cannot be reordered, dropped, repeated or cut off without
 * the read failing. The key id says which master key sealed the object, so the master
 * key can be rotated (objects of an older id are re-sealed or read with the old key).
 */
export const BLOB_MAGIC = Buffer.from("RBX");
const VERSION = 1;
const PREFIX_BYTES = 16;
const HEADER_BYTES = BLOB_MAGIC.length + 2 + PREFIX_BYTES;
export const BLOB_CHUNK_BYTES = 64 * 1024;
const MAX_SEALED = BLOB_CHUNK_BYTES + nacl.secretbox.overheadLength;

export type BlobKind = "files" | "checkpoints";

/** An object could not be opened: wrong key, tampered with, reordered or cut off. */
export class BlobDecryptError extends Error {
  constructor(message = "The stored object could not be decrypted.") {
    super(message);
    this.name = "BlobDecryptError";
  }
}

/** Per-workspace keys for one kind of object, derived from the master key. */
export class BlobKeyring {
  private readonly master: Buffer;
  private readonly cache = new Map<string, Uint8Array>();
  /** The id of the master key in force (1 until a rotation gives it a new one). */
  readonly keyId: number;

  constructor(masterKeyBase64: string, keyId = 1) {
    this.master = masterKeyBytes(masterKeyBase64, "object");
    this.keyId = keyId;
  }

  keyFor(kind: BlobKind, workspaceId: string): Uint8Array {
    const id = `${kind}:${workspaceId}`;
    let key = this.cache.get(id);
    if (!key) {
      key = deriveLabelledKey(this.master, kind, workspaceId);
      if (this.cache.size > 10_000) this.cache.clear();
      this.cache.set(id, key);
    }
    return key;
  }
}

function nonceOf(prefix: Uint8Array, index: number, last: boolean): Uint8Array {
  const nonce = new Uint8Array(nacl.secretbox.nonceLength);
  nonce.set(prefix, 0);
  const view = new DataView(nonce.buffer);
  view.setUint32(PREFIX_BYTES, index);
  view.setUint32(PREFIX_BYTES + 4, last ? 1 : 0);
  return nonce;
}

/** Whether `head` (the first bytes of an object) starts an encrypted object. */
export function isSealedBlob(head: Uint8Array): boolean {
  return head.length >= BLOB_MAGIC.length && Buffer.from(head.subarray(0, BLOB_MAGIC.length)).equals(BLOB_MAGIC);
}

/** Re-chunks `source` into pieces of exactly `size` bytes (the last may be shorter). */
async function* rechunk(source: AsyncIterable<Uint8Array>, size: number): AsyncGenerator<Uint8Array> {
  let pending: Buffer[] = [];
  let length = 0;
  for await (const piece of source) {
    pending.push(Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength));
    length += piece.byteLength;
    while (length >= size) {
      const all = Buffer.concat(pending);
      yield all.subarray(0, size);
      pending = [all.subarray(size)];
      length -= size;
    }
  }
  yield Buffer.concat(pending);
}

/** Seals `source` as one object: the header, then its chunks. */
export async function* sealBlob(key: Uint8Array, keyId: number, source: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  const prefix = randomBytes(PREFIX_BYTES);
  yield Buffer.concat([BLOB_MAGIC, Buffer.from([VERSION, keyId]), prefix]);
  let index = 0;
  let previous: Uint8Array | undefined;
  // One chunk of look-ahead: the last chunk is known only when the source ends.
  for await (const chunk of rechunk(source, BLOB_CHUNK_BYTES)) {
    if (previous) yield frame(nacl.secretbox(previous, nonceOf(prefix, index++, false), key));
    previous = chunk;
  }
  yield frame(nacl.secretbox(previous ?? new Uint8Array(0), nonceOf(prefix, index, true), key));
}

function frame(sealed: Uint8Array): Uint8Array {
  const out = Buffer.alloc(4 + sealed.length);
  out.writeUInt32BE(sealed.length, 0);
  out.set(sealed, 4);
  return out;
}

/** Opens an object sealed by {@link sealBlob}; `keyFor` gives the key of a key id. */
export async function* openBlob(keyFor: (keyId: number) => Uint8Array | undefined, source: AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  let buffer = Buffer.alloc(0);
  let prefix: Uint8Array | undefined;
  let key: Uint8Array | undefined;
  let index = 0;
  let ended = false;
  const take = (n: number): Buffer | undefined => {
    if (buffer.length < n) return undefined;
    const out = buffer.subarray(0, n);
    buffer = buffer.subarray(n);
    return out;
  };
  for await (const piece of source) {
    if (ended) throw new BlobDecryptError("The stored object has data after its last chunk.");
    buffer = Buffer.concat([buffer, Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength)]);
    if (!prefix) {
      const header = take(HEADER_BYTES);
      if (!header) continue;
      if (!isSealedBlob(header) || header[BLOB_MAGIC.length] !== VERSION) throw new BlobDecryptError("The stored object is not an encrypted object.");
      key = keyFor(header[BLOB_MAGIC.length + 1]!);
      if (!key) throw new BlobDecryptError(`The stored object was sealed with key id ${header[BLOB_MAGIC.length + 1]}, which this service does not hold.`);
      prefix = header.subarray(BLOB_MAGIC.length + 2);
    }
    for (;;) {
      if (buffer.length < 4) break;
      const length = buffer.readUInt32BE(0);
      if (length < nacl.secretbox.overheadLength || length > MAX_SEALED) throw new BlobDecryptError("The stored object has a chunk of an impossible size.");
      if (buffer.length < 4 + length) break;
      take(4);
      const sealed = take(length)!;
      // The last chunk opens only with the final flag, the others only without it.
      const plain = nacl.secretbox.open(sealed, nonceOf(prefix, index, false), key!);
      if (plain) {
        index++;
        yield plain;
        continue;
      }
      const last = nacl.secretbox.open(sealed, nonceOf(prefix, index, true), key!);
      if (!last) throw new BlobDecryptError();
      ended = true;
      if (last.length) yield last;
      if (buffer.length) throw new BlobDecryptError("The stored object has data after its last chunk.");
    }
  }
  if (!ended) throw new BlobDecryptError("The stored object is cut off.");
}

/** Collects an async iterable of bytes. */
export async function collect(source: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const piece of source) parts.push(Buffer.from(piece));
  return Buffer.concat(parts);
}

/** Yields `data` once (an in-memory source for {@link sealBlob} / {@link openBlob}). */
export async function* once(data: Uint8Array): AsyncGenerator<Uint8Array> {
  yield data;
}
