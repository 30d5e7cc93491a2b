import test from "ava";
import nacl from "tweetnacl";
import { open, openText, seal, EventDecryptError } from "../../src/event-crypto.js";
import { naclOpen, openSealed, secretboxBackend, secretboxReady } from "../../src/secretbox-open.js";

const sealedByNacl = (key: Uint8Array, message: Uint8Array) => {
  const nonce = nacl.randomBytes(24);
  return new Uint8Array([...nonce, ...nacl.secretbox(message, nonce, key)]);
};

test.before(async () => {
  await secretboxReady;
});

test("secretbox-open - events are opened by libsodium (WebAssembly), not the slower fallback", (t) => {
  // The fallback is for a machine where the module cannot load; here (and in CI) it must.
  t.is(secretboxBackend(), "libsodium");
});

test("secretbox-open - boxes far past the first scratch area (64 KiB) open, and smaller ones still do after it grew", (t) => {
  const key = nacl.randomBytes(32);
  for (const length of [0, 1, 65_535, 65_536, 65_537, 300_000, 1_048_576, 17]) {
    const message = nacl.randomBytes(length);
    t.deepEqual(Buffer.from(open(key, sealedByNacl(key, message))), Buffer.from(message), `${length} bytes`);
  }
});

test("secretbox-open - open returns its own copy; a later open does not change an earlier result", (t) => {
  const key = nacl.randomBytes(32);
  const first = open(key, seal(key, new TextEncoder().encode("first")));
  open(key, seal(key, new TextEncoder().encode("second, longer")));
  t.is(Buffer.from(first).toString(), "first");
  t.is(openText(key, seal(key, new TextEncoder().encode("héllo wörld"))), "héllo wörld");
});

test("secretbox-open - a change of any byte of nonce, tag or ciphertext, a wrong key or a cut box is refused", (t) => {
  const key = nacl.randomBytes(32);
  const sealed = sealedByNacl(key, nacl.randomBytes(70));
  for (let i = 0; i < sealed.length; i++) {
    const changed = Uint8Array.from(sealed);
    changed[i] = changed[i]! ^ (1 << (i % 8));
    if (openSealed(key, changed) !== null) return t.fail(`byte ${i} changed and still opened`);
    t.throws(() => open(key, changed), { instanceOf: EventDecryptError });
  }
  t.is(openSealed(nacl.randomBytes(32), sealed), null);
  for (const cut of [0, 1, 24, 39, sealed.length - 1]) t.is(openSealed(key, sealed.subarray(0, cut)), null, `cut at ${cut}`);
  // And the untouched box still opens after all those refusals.
  t.not(openSealed(key, sealed), null);
});

test("secretbox-open - the tweetnacl fallback opens and refuses exactly as libsodium does, at every length up to 600 bytes", (t) => {
  const key = nacl.randomBytes(32);
  for (let length = 0; length <= 600; length++) {
    const message = nacl.randomBytes(length);
    const sealed = sealedByNacl(key, message);
    const byFallback = naclOpen(key, sealed);
    const bySodium = openSealed(key, sealed);
    if (!byFallback || !bySodium || Buffer.compare(byFallback, message) !== 0 || Buffer.compare(bySodium, message) !== 0) return t.fail(`${length} bytes`);
    sealed[sealed.length - 1] = sealed[sealed.length - 1]! ^ 0x80;
    if (length > 0 && (naclOpen(key, sealed) !== null || openSealed(key, sealed) !== null)) return t.fail(`changed box of ${length} bytes opened`);
  }
  t.pass();
});

test("secretbox-open - a process without WebAssembly (node --jitless) starts and opens with tweetnacl, small boxes and one past 4 MiB", async (t) => {
  const { execFile } = await import("node:child_process");
  const { fileURLToPath } = await import("node:url");
  const src = (name: string) => fileURLToPath(new URL(`../../src/${name}`, import.meta.url));
  const script = `
    const { open, seal } = await import(${JSON.stringify(src("event-crypto.ts"))});
    const { secretboxReady, secretboxBackend } = await import(${JSON.stringify(src("secretbox-open.ts"))});
    await secretboxReady;
    const key = new Uint8Array(32).fill(3);
    const big = open(key, seal(key, new Uint8Array(4_500_000).fill(7)));
    const small = Buffer.from(open(key, seal(key, new TextEncoder().encode("hi")))).toString();
    console.log(JSON.stringify({ backend: secretboxBackend(), big: big.length, small }));`;
  const out = await new Promise<string>((resolve, reject) =>
    execFile(process.execPath, ["--jitless", "--import", "tsx", "--input-type=module", "-e", script], { timeout: 60_000 }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
    ),
  );
  t.deepEqual(JSON.parse(out.trim().split("\n").at(-1)!), { backend: "tweetnacl", big: 4_500_000, small: "hi" });
});
