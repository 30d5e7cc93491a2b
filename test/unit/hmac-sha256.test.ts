import test from "ava";
import { createHmac, randomBytes } from "node:crypto";
import { HmacSha256 } from "../../src/hmac-sha256.js";

test("hmac-sha256 - the same tags as node:crypto for every message length over three blocks, bytes and strings", (t) => {
  for (const keyLength of [0, 1, 32, 63, 64]) {
    const key = randomBytes(keyLength);
    const mac = new HmacSha256(key);
    for (let n = 0; n <= 200; n++) {
      const message = randomBytes(n);
      t.deepEqual(Buffer.from(mac.digest(message)), createHmac("sha256", key).update(message).digest(), `key ${keyLength}, ${n} bytes`);
      const ascii = message.toString("base64").slice(0, n);
      t.deepEqual(Buffer.from(mac.digest(ascii)), createHmac("sha256", key).update(ascii).digest(), `key ${keyLength}, ascii ${n}`);
    }
  }
});

test("hmac-sha256 - non-ASCII strings are hashed as UTF-8; a longer key is refused, not silently truncated", (t) => {
  const key = randomBytes(32);
  const mac = new HmacSha256(key);
  for (const text of ["é", "tag:ünïcødé;", "€".repeat(40), "😀 a😀b", "\u0000\u007f\u0080"]) {
    t.deepEqual(Buffer.from(mac.digest(text)), createHmac("sha256", key).update(text, "utf8").digest(), text);
  }
  t.throws(() => new HmacSha256(randomBytes(65)), { instanceOf: RangeError });
});

test("hmac-sha256 - each digest is its own array: a later one does not overwrite an earlier result", (t) => {
  const mac = new HmacSha256(randomBytes(32));
  const first = mac.digest("one");
  const copy = Buffer.from(first);
  mac.digest("two");
  t.deepEqual(Buffer.from(first), copy);
});
