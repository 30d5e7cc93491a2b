/**
 * The address guard at connect time for a tenant's model calls (actors/model-egress.ts):
 * real `fetch`, real loopback servers; only name resolution is injected.
 */
import test from "ava";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer, type Server } from "node:http";
import { createServer as createTlsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { guardModelCalls, MODEL_EGRESS_HEADER } from "../../actors/model-egress.js";
import { checkModelEndpoint, type Lookup, NetworkPolicyError } from "../../src/address-guard.js";

/** The built-in fetch, taken before any guard wraps it. */
const builtinFetch = globalThis.fetch;

interface Counted {
  server: Server;
  port: number;
  hits: string[];
}

/** A loopback server that records each request's path and answers with `answer`. */
async function counted(answer: (res: import("node:http").ServerResponse, port: number) => void = (res) => res.end("{}")): Promise<Counted> {
  const hits: string[] = [];
  const server = createServer((req, res) => {
    hits.push(req.url ?? "");
    req.resume();
    answer(res, port);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return { server, port, hits };
}

/** A name that answers a public address first and loopback from then on (DNS rebinding). */
function rebinding(): { lookup: Lookup; calls: () => number } {
  let calls = 0;
  return {
    lookup: async () => (calls++ === 0 ? [{ address: "93.184.216.34", family: 4 }] : [{ address: "127.0.0.1", family: 4 }]),
    calls: () => calls,
  };
}

/** The NetworkPolicyError under a failed fetch (fetch wraps it as `cause`). */
function policyCause(err: unknown): NetworkPolicyError | undefined {
  for (let e = err, i = 0; e instanceof Error && i < 5; e = e.cause, i++) if (e instanceof NetworkPolicyError) return e;
  return undefined;
}

test("model-egress - a name that passes the check and then resolves to loopback is refused at connect; nothing reaches the server", async (t) => {
  const target = await counted();
  const { lookup, calls } = rebinding();
  const url = `http://rebind.test:${target.port}/v1`;
  const refusals: NetworkPolicyError[] = [];
  const guard = guardModelCalls({ lookup, onRefused: (err) => refusals.push(err) });
  try {
    // The check before the turn sees the public answer.
    await t.notThrowsAsync(checkModelEndpoint(url, { allowPrivate: false, lookup }));
    const err = await t.throwsAsync(fetch(`${url}/chat/completions`, { method: "POST", body: "{}", headers: guard.headers }));
    t.regex(policyCause(err)?.reason ?? "", /loopback address 127\.0\.0\.1/);
    t.is(refusals.length, 1);
    t.is(refusals[0]?.host, "rebind.test");
    t.is(calls(), 2, "the connection resolved the name itself, after the check");
    t.deepEqual(target.hits, []);
  } finally {
    await guard.close();
    target.server.close();
  }
});

test("model-egress - a redirect from an allowed endpoint to a private address is refused; unguarded, fetch would follow it", async (t) => {
  const inside = await counted();
  const outside = await counted((res) => {
    res.writeHead(307, { location: `http://127.0.0.1:${inside.port}/latest/meta-data` });
    res.end();
  });
  const guard = guardModelCalls({ testHosts: new Map([["allowed.test", { host: "127.0.0.1", port: outside.port }]]) });
  try {
    const err = await t.throwsAsync(fetch(`http://allowed.test:${outside.port}/v1/chat/completions`, { method: "POST", body: "{}", headers: guard.headers }));
    t.regex(policyCause(err)?.reason ?? "", /loopback/);
    t.deepEqual(outside.hits, ["/v1/chat/completions"], "the allowed endpoint was reached");
    t.deepEqual(inside.hits, [], "its redirect was not followed");
    // The control: fetch follows the same redirect when no guard holds.
    const followed = await fetch(`http://127.0.0.1:${outside.port}/v1/chat/completions`, { method: "POST", body: "{}" });
    t.is(followed.status, 200);
    t.deepEqual(inside.hits, ["/latest/meta-data"]);
  } finally {
    await guard.close();
    inside.server.close();
    outside.server.close();
  }
});

test("model-egress - marked requests are guarded (address literals too, and after the turn's guard closed) and never carry the mark; other requests are untouched", async (t) => {
  const target = await counted();
  const seen: string[] = [];
  const echo = await counted();
  echo.server.removeAllListeners("request");
  echo.server.on("request", (req, res) => {
    seen.push(...Object.keys(req.headers));
    req.resume();
    res.end("{}");
  });
  const guard = guardModelCalls({ testHosts: new Map([["echo.test", { host: "127.0.0.1", port: echo.port }]]) });
  try {
    for (const url of [`http://127.0.0.1:${target.port}/`, `http://[::1]:${target.port}/`, `http://10.0.0.1:${target.port}/`, `http://169.254.169.254/latest/meta-data`]) {
      const err = await t.throwsAsync(fetch(url, { headers: guard.headers }), undefined, url);
      t.truthy(policyCause(err), url);
    }
    // The header's name in any case, among others, as an SDK sends it.
    const upper = { "X-Runs-Model-Egress": guard.headers[MODEL_EGRESS_HEADER]!, authorization: "Bearer none" };
    t.truthy(policyCause(await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: upper }))));
    t.deepEqual(target.hits, []);
    // An allowed endpoint gets the request without the mark.
    t.is((await fetch(`http://echo.test:${echo.port}/v1`, { headers: upper })).status, 200);
    t.true(seen.includes("authorization"));
    t.false(seen.includes(MODEL_EGRESS_HEADER));
    // Outside the guard (the rest of the process) fetch is untouched.
    t.is((await fetch(`http://127.0.0.1:${target.port}/`)).status, 200);
    t.deepEqual(target.hits, ["/"]);
  } finally {
    await guard.close();
  }
  // A late request of a turn whose guard closed is still guarded.
  t.truthy(policyCause(await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: guard.headers }))));
  t.deepEqual(target.hits, ["/"]);
  target.server.close();
  echo.server.close();
});

test.serial("model-egress - a fetch put in place by someone else after the guard does not open it", async (t) => {
  const target = await counted();
  const guard = guardModelCalls({});
  try {
    // As a library that installs its own fetch would: the built-in one again.
    globalThis.fetch = builtinFetch;
    t.not(globalThis.fetch, builtinFetch);
    const err = await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: guard.headers }));
    t.truthy(policyCause(err));
    t.deepEqual(target.hits, []);
    // Unmarked calls go to the fetch that was put in place.
    t.is((await fetch(`http://127.0.0.1:${target.port}/`)).status, 200);
  } finally {
    await guard.close();
    target.server.close();
  }
});

test("model-egress - over TLS the connection to the checked address still presents and verifies the endpoint's name", async (t) => {
  const names: string[] = [];
  const fixture = (file: string) => readFileSync(new URL(`../fixtures/tls/${file}`, import.meta.url));
  const server = createTlsServer({
    key: fixture("models-test.key"),
    cert: fixture("models-test.crt"),
    SNICallback: (name, callback) => {
      names.push(name);
      callback(null);
    },
  }, (_req, res) => res.end("{}"));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  const guard = guardModelCalls({ testHosts: new Map([["models.test", { host: "127.0.0.1", port }]]) });
  try {
    // The fixture's certificate is self-signed (CN and SAN models.test): verification runs and refuses it.
    const err = await t.throwsAsync(fetch(`https://models.test:${port}/v1/models`, { headers: guard.headers }));
    t.is((err?.cause as { code?: string } | undefined)?.code, "DEPTH_ZERO_SELF_SIGNED_CERT");
    t.deepEqual(names, ["models.test"]);
  } finally {
    await guard.close();
    server.close();
  }
});

test("model-egress - loading the guard leaves the rest of the process on Node's own fetch dispatcher", async (t) => {
  const guard = guardModelCalls({});
  try {
    const slot = (globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")];
    const npmUndici = createRequire(import.meta.url)("undici") as typeof import("undici");
    t.truthy(slot);
    t.false(slot instanceof npmUndici.Agent);
  } finally {
    await guard.close();
  }
});

test.serial("model-egress - a library that wraps fetch the usual way (calling the one it found) neither loops nor opens the guard; bad input rejects, as fetch does", async (t) => {
  const target = await counted();
  const guard = guardModelCalls({});
  const found = globalThis.fetch;
  let wrapped = 0;
  try {
    globalThis.fetch = (input, init) => {
      wrapped++;
      return found(input, init);
    };
    t.is((await fetch(`http://127.0.0.1:${target.port}/`)).status, 200);
    t.is(wrapped, 1);
    t.truthy(policyCause(await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: guard.headers }))));
    t.deepEqual(target.hits, ["/"]);
    // Put back: the fetch it found.
    globalThis.fetch = found;
    t.is((await fetch(`http://127.0.0.1:${target.port}/`)).status, 200);
    t.is(wrapped, 1);
    // One that waits before calling the fetch it found: the call comes back later, still no loop.
    globalThis.fetch = async (input, init) => {
      wrapped++;
      await null;
      return found(input, init);
    };
    t.is((await fetch(`http://127.0.0.1:${target.port}/`)).status, 200);
    t.is(wrapped, 2);
    globalThis.fetch = found;
    // A malformed header: a rejected promise, not a throw.
    const call = fetch(`http://127.0.0.1:${target.port}/`, { headers: [["bad name", "x"]] });
    t.true(call instanceof Promise);
    await t.throwsAsync(call);
  } finally {
    await guard.close();
    target.server.close();
  }
});

test("model-egress - a refusal is reported to the turn whose mark the call carried, and to no other", async (t) => {
  const target = await counted();
  const seenA: string[] = [];
  const seenB: string[] = [];
  const a = guardModelCalls({ onRefused: (err) => seenA.push(err.reason) });
  const b = guardModelCalls({ onRefused: (err) => seenB.push(err.reason) });
  try {
    await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: a.headers }));
    t.deepEqual(seenA, ["loopback address 127.0.0.1"]);
    t.deepEqual(seenB, []);
  } finally {
    await a.close();
    await b.close();
  }
  // After its turn ended, a late call is refused but reported to nobody.
  await t.throwsAsync(fetch(`http://127.0.0.1:${target.port}/`, { headers: a.headers }));
  t.is(seenA.length, 1);
  t.deepEqual(target.hits, []);
  target.server.close();
});

test("model-egress - headers given as a one-shot iterable reach the server whole; a marked Map is guarded; an answer is reported to its turn", async (t) => {
  const seen: string[] = [];
  const echo = await counted();
  echo.server.removeAllListeners("request");
  echo.server.on("request", (req, res) => {
    seen.push(String(req.headers.authorization));
    req.resume();
    res.end("{}");
  });
  let answers = 0;
  const guard = guardModelCalls({ testHosts: new Map([["echo.test", { host: "127.0.0.1", port: echo.port }]]), onResponse: () => answers++ });
  try {
    function* once(): Generator<[string, string]> {
      yield ["authorization", "Bearer one-shot"];
    }
    t.is((await fetch(`http://127.0.0.1:${echo.port}/`, { headers: once() as unknown as HeadersInit })).status, 200);
    t.deepEqual(seen, ["Bearer one-shot"]);
    const marked = new Map([["X-Runs-Model-Egress", guard.headers[MODEL_EGRESS_HEADER]!], ["authorization", "Bearer marked"]]);
    t.truthy(policyCause(await t.throwsAsync(fetch(`http://127.0.0.1:${echo.port}/`, { headers: marked as unknown as HeadersInit }))));
    t.is(answers, 0);
    t.is((await fetch(`http://echo.test:${echo.port}/`, { headers: marked as unknown as HeadersInit })).status, 200);
    t.is(answers, 1);
    t.deepEqual(seen, ["Bearer one-shot", "Bearer marked"]);
  } finally {
    await guard.close();
    echo.server.close();
  }
});
