import test from "ava";
import { Ids, newId, randomBase62 } from "../../src/ids.js";

test("ids - random base62 strings have the asked length and alphabet, across many refills of the random pool", (t) => {
  const counts = new Map<string, number>();
  let total = 0;
  // 3,000 strings of 43 characters: ~135 KB of random bytes, ~33 refills of the 4 KiB pool.
  for (let i = 0; i < 3_000; i++) {
    const s = randomBase62(43);
    t.is(s.length, 43);
    if (!/^[0-9A-Za-z]{43}$/.test(s)) t.fail(s);
    for (const c of s) counts.set(c, (counts.get(c) ?? 0) + 1);
    total += s.length;
  }
  t.is(counts.size, 62);
  // Uniform: each character ~2,081 times (σ ≈ 45); a modulo bias (the first 8 characters
  // 1.25 times as likely: +21 %) or bytes repeated from the pool would be outside ±15 %.
  const expected = total / 62;
  for (const [c, n] of counts) t.true(Math.abs(n - expected) < expected * 0.15, `${c}: ${n} of ~${expected.toFixed(0)}`);
});

test("ids - no two of 20,000 ids are equal, and ids made later sort after", (t) => {
  const seen = new Set<string>();
  for (let i = 0; i < 10_000; i++) seen.add(Ids.run()).add(Ids.reference());
  t.is(seen.size, 20_000);
  t.true(newId("run", 1_000) < newId("run", 1_001));
  const secrets = new Set(Array.from({ length: 2_000 }, () => Ids.apiKeySecret()));
  t.is(secrets.size, 2_000);
  for (const secret of secrets) if (!/^rk_live_[0-9A-Za-z]{43}$/.test(secret)) t.fail(secret);
  t.is(randomBase62(0), "");
});
