import test from "ava";
import nacl from "tweetnacl";
import { EventDecryptError, EventKeyring, NONCE_BYTES, deriveWorkspaceKey, open, seal } from "../../src/event-crypto.js";

const MASTER = Buffer.alloc(32, 7).toString("base64");
const enc = (s: string) => new Uint8Array(Buffer.from(s, "utf8"));

test("event-crypto - seal then open returns the plaintext", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  const plain = enc(JSON.stringify({ type: "text_delta", data: { delta: "héllo wörld" } }));
  const sealed = seal(key, plain);
  t.is(sealed.length, NONCE_BYTES + 16 + plain.length);
  t.deepEqual(Buffer.from(open(key, sealed)), Buffer.from(plain));
});

test("event-crypto - empty plaintext round trips", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  t.is(open(key, seal(key, new Uint8Array())).length, 0);
});

test("event-crypto - two seals of the same plaintext differ (random nonce)", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  const plain = enc("same");
  t.notDeepEqual(Buffer.from(seal(key, plain)), Buffer.from(seal(key, plain)));
});

test("event-crypto - any flipped bit is detected", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  const sealed = seal(key, enc("a secret tool result"));
  for (let i = 0; i < sealed.length; i++) {
    const tampered = Uint8Array.from(sealed);
    tampered[i] ^= 0x01;
    t.throws(() => open(key, tampered), { instanceOf: EventDecryptError }, `byte ${i}`);
  }
});

test("event-crypto - truncated or too short input is rejected", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  const sealed = seal(key, enc("payload"));
  t.throws(() => open(key, sealed.subarray(0, sealed.length - 1)), { instanceOf: EventDecryptError });
  t.throws(() => open(key, new Uint8Array(10)), { instanceOf: EventDecryptError });
});

test("event-crypto - another workspace's key cannot open", (t) => {
  const ring = new EventKeyring(MASTER);
  const sealed = seal(ring.keyFor("ws_a"), enc("payload"));
  t.throws(() => open(ring.keyFor("ws_b"), sealed), { instanceOf: EventDecryptError });
});

test("event-crypto - workspaces get different keys; derivation is deterministic and cached", (t) => {
  const ring = new EventKeyring(MASTER);
  const a = ring.keyFor("ws_a");
  t.is(a.length, 32);
  t.notDeepEqual(Buffer.from(a), Buffer.from(ring.keyFor("ws_b")));
  t.is(ring.keyFor("ws_a"), a, "cached instance");
  t.deepEqual(Buffer.from(new EventKeyring(MASTER).keyFor("ws_a")), Buffer.from(a), "same master, same key");
  t.deepEqual(Buffer.from(deriveWorkspaceKey(Buffer.from(MASTER, "base64"), "ws_a")), Buffer.from(a));
  const other = new EventKeyring(Buffer.alloc(32, 8).toString("base64")).keyFor("ws_a");
  t.notDeepEqual(Buffer.from(other), Buffer.from(a), "another master, another key");
});

test("event-crypto - the sealed bytes contain no plaintext", (t) => {
  const key = new EventKeyring(MASTER).keyFor("ws_a");
  const secret = "SECRET-TOOL-OUTPUT-" + "x".repeat(200);
  const sealed = Buffer.from(seal(key, enc(JSON.stringify({ data: secret }))));
  t.false(sealed.includes("SECRET"));
  t.false(sealed.includes("xxxxxxxx"));
  t.false(sealed.toString("latin1").includes("data"));
});

test("event-crypto - the master key must be 32 bytes of base64", (t) => {
  t.throws(() => new EventKeyring(Buffer.alloc(16).toString("base64")));
  t.throws(() => new EventKeyring("not base64 at all!"));
  t.throws(() => new EventKeyring(""));
  t.notThrows(() => new EventKeyring(Buffer.alloc(32, 1).toString("base64")));
});

test("event-crypto - seal and open agree with tweetnacl's secretbox both ways, at every length up to 600 bytes", (t) => {
  const key = nacl.randomBytes(32);
  for (let length = 0; length <= 600; length++) {
    const plaintext = nacl.randomBytes(length);
    const sealed = seal(key, plaintext);
    t.is(sealed.length, 24 + 16 + length);
    const byNacl = nacl.secretbox.open(sealed.subarray(24), sealed.subarray(0, 24), key);
    if (!byNacl || Buffer.compare(Buffer.from(byNacl), Buffer.from(plaintext)) !== 0) return t.fail(`tweetnacl cannot open our box of ${length} bytes`);
    const nonce = nacl.randomBytes(24);
    const theirs = new Uint8Array([...nonce, ...nacl.secretbox(plaintext, nonce, key)]);
    if (Buffer.compare(Buffer.from(open(key, theirs)), Buffer.from(plaintext)) !== 0) return t.fail(`we cannot open tweetnacl's box of ${length} bytes`);
  }
  t.pass();
});

test("event-crypto - open leaves the sealed bytes as they were, and nonces do not repeat", (t) => {
  const key = nacl.randomBytes(32);
  const sealed = seal(key, new TextEncoder().encode("unchanged"));
  const copy = Uint8Array.from(sealed);
  open(key, sealed);
  t.deepEqual(sealed, copy);
  const nonces = new Set<string>();
  for (let i = 0; i < 2_000; i++) nonces.add(Buffer.from(seal(key, new Uint8Array(1)).subarray(0, 24)).toString("hex"));
  t.is(nonces.size, 2_000);
});
