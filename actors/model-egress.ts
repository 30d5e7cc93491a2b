/**
 * The address guard held at connect time for calls to a tenant's model endpoint (an
 * `openai-compatible` `base_url`). The providers' SDKs call the global `fetch`, which
 * resolves the endpoint's name again when it connects and follows redirects: checking the
 * `base_url` once before the turn (agent-runner.ts, for a clear error) cannot stop a name
 * that answers a public address to the check and a private one to the connection (DNS
 * rebinding), nor a public endpoint that redirects to a private one.
 *
 * How: from the first guard on, `globalThis.fetch` reads as a wrapper for good (assigning
 * it replaces what the wrapper calls, not the wrapper). A call that carries
 * {@link MODEL_EGRESS_HEADER} (the turn's model has it among its headers, so the SDK sends
 * it on every request) loses the header and is made by undici's own `fetch` through the
 * guarded agent (one for the process, so connections are kept between turns): every
 * connection, redirects' included, is made with a lookup that answers only allowed
 * addresses (and address literals are checked first), and TLS presents and verifies the
 * endpoint's name as usual. A refusal, and an answer, are reported to the turn whose mark
 * the call carried. Every other call goes to the process's `fetch` as it came.
 *
 * Not a global undici dispatcher: which slot Node's bundled fetch reads, and which handler
 * API it speaks, change between Node and undici versions. Not an AsyncLocalStorage scope
 * either: on Node 20 one in use makes every promise in the process several times dearer.
 */
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";
import net from "node:net";
import type { Agent } from "undici";
import { allowedAddresses, guardedLookup, type Lookup, NetworkPolicyError } from "../src/index.js";

/** Marks a call as a guarded model call; never sent. */
export const MODEL_EGRESS_HEADER = "x-runs-model-egress";

export interface ModelEgressOptions {
  /** Called with each refusal (the turn reports it as `network_policy_denied`). */
  onRefused?: (error: NetworkPolicyError) => void;
  /** Called when a guarded call gets an answer (an SDK's retry after a refusal may). */
  onResponse?: () => void;
  /** TEST ONLY (no configuration reaches it): how names resolve; the system resolver otherwise. */
  lookup?: Lookup;
  /** TEST ONLY (no configuration reaches it): host names connected to a loopback server without the check. */
  testHosts?: ReadonlyMap<string, { host: string; port: number }>;
}

export interface ModelEgressGuard {
  /** Headers for the turn's model (`model.headers`): its calls go through the guard. */
  readonly headers: Readonly<Record<string, string>>;
  /** At the turn's end: forgets the turn (a late call with its mark is still guarded). */
  close(): Promise<void>;
}

type Fetch = typeof globalThis.fetch;
type Undici = typeof import("undici");

interface Guard {
  agent: Agent;
  onRefused?: (error: NetworkPolicyError) => void;
  onResponse?: () => void;
}

/** The guards of the turns running now, by their header's value. */
const guards = new Map<string, Guard>();
/** The agent every turn shares (connections are kept between turns; the policy is one). */
let sharedAgent: Agent | undefined;
let undici: Undici | undefined;

/**
 * undici, loaded at the first guard. Loading it claims the process's global dispatcher
 * slot when that is still empty; Node's own fetch claims it first (synchronously, with a
 * call that sends nothing), so every unmarked call keeps Node's dispatcher.
 */
function loadUndici(): Undici {
  if (!undici) {
    if ((globalThis as Record<symbol, unknown>)[Symbol.for("undici.globalDispatcher.1")] === undefined) void globalThis.fetch("data:,").catch(() => undefined);
    undici = createRequire(import.meta.url)("undici") as Undici;
  }
  return undici;
}

let installed = false;
/** The inits the wrapper handed to `next`: a call that comes back with one came from `next`. */
const forwarded = new WeakSet<object>();

/** Wraps `globalThis.fetch` once, for the rest of the process. */
function install(): void {
  if (installed) return;
  const original: Fetch = globalThis.fetch;
  let next = original;
  let depth = 0;
  const wrapper: Fetch = (input, init) => {
    try {
      const read = readMarker(init);
      if (read.token !== null) return guardedCall(read.token, input, read.init!);
      // The SDKs pass a URL and init; a marked Request object is refused rather than sent unguarded.
      if (input instanceof Request && input.headers.has(MODEL_EGRESS_HEADER)) return Promise.reject(new TypeError("a guarded model call must pass its headers in init"));
      // Back from `next` (someone's fetch that calls the one it found, which is this one, at
      // once or after an await): to the original, or the two would call each other forever.
      if (depth > 0 || (read.init !== undefined && forwarded.has(read.init))) return original(input, read.init);
      const passed: RequestInit = { ...read.init };
      forwarded.add(passed);
      depth++;
      try {
        return next(input, passed);
      } finally {
        depth--;
      }
    } catch (err) {
      // As fetch does with bad input: a rejected promise, not a throw.
      return Promise.reject(err);
    }
  };
  Object.defineProperty(globalThis, "fetch", {
    get: () => wrapper,
    // Someone else's fetch becomes what unmarked calls use; marked ones stay guarded.
    set: (fetch: Fetch) => {
      next = fetch === wrapper ? original : fetch;
    },
    enumerable: true,
    configurable: false,
  });
  installed = true;
}

/**
 * The marker's value among `init`'s headers (null when there is none), and the init to
 * pass on: the same one, unless its headers were an iterable that reading used up (then
 * with those headers as read).
 */
function readMarker(init: RequestInit | undefined): { token: string | null; init: RequestInit | undefined } {
  const headers = init?.headers;
  if (headers == null) return { token: null, init };
  if (headers instanceof Headers) return { token: headers.get(MODEL_EGRESS_HEADER), init };
  const find = (pairs: Iterable<readonly [string, string]>) => {
    for (const [name, value] of pairs) if (name.toLowerCase() === MODEL_EGRESS_HEADER) return value;
    return null;
  };
  if (Array.isArray(headers)) return { token: find(headers as [string, string][]), init };
  if (Symbol.iterator in headers) {
    const pairs = [...(headers as Iterable<[string, string]>)];
    return { token: find(pairs), init: { ...init, headers: pairs } };
  }
  return { token: find(Object.entries(headers)), init };
}

/** A marked call, through the guard. */
function guardedCall(token: string, input: Parameters<Fetch>[0], init: RequestInit): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.delete(MODEL_EGRESS_HEADER);
  // A marked call whose turn has ended is still guarded, never let through.
  const guard = guards.get(token);
  const { fetch } = loadUndici();
  const call = fetch(input as Parameters<Undici["fetch"]>[0], { ...(init as object), headers: [...headers], dispatcher: guard?.agent ?? shared() } as Parameters<Undici["fetch"]>[1]);
  return (call as unknown as Promise<Response>).then(
    (response) => {
      // An answer came (a retry may follow a refusal): the call did not fail for the guard.
      guard?.onResponse?.();
      return response;
    },
    (err: unknown) => {
      const refused = policyError(err);
      if (refused) guard?.onRefused?.(refused);
      throw err;
    },
  );
}

/** The NetworkPolicyError under a failed fetch (fetch wraps the connection's error). */
function policyError(err: unknown): NetworkPolicyError | undefined {
  for (let e = err, i = 0; e instanceof Error && i < 5; e = e.cause, i++) if (e instanceof NetworkPolicyError) return e;
  return undefined;
}

function shared(): Agent {
  return (sharedAgent ??= guardedAgent({}));
}

/** An agent whose every connection goes to addresses the guard allowed. */
function guardedAgent(options: Pick<ModelEgressOptions, "lookup" | "testHosts">): Agent {
  const { Agent, buildConnector } = loadUndici();
  const lookup = guardedLookup({ lookup: options.lookup });
  const connect = buildConnector({ lookup });
  return new Agent({
    connect: (target, callback) => {
      const host = target.hostname.replace(/^\[|\]$/g, "").toLowerCase();
      const mapped = options.testHosts?.get(host);
      if (mapped) return connect({ ...target, hostname: mapped.host, port: String(mapped.port) }, callback);
      if (!net.isIP(host)) return connect(target, callback);
      // A socket connects to an address literal without a lookup: it is checked here.
      allowedAddresses(host).then(
        () => connect(target, callback),
        (err: Error) => callback(err, null),
      );
    },
  });
}

/** A guard for one turn's model calls. */
export function guardModelCalls(options: ModelEgressOptions): ModelEgressGuard {
  install();
  const token = randomUUID();
  // Tests resolve names their own way: their guards get agents of their own.
  const own = options.lookup || options.testHosts ? guardedAgent(options) : undefined;
  guards.set(token, { agent: own ?? shared(), onRefused: options.onRefused, onResponse: options.onResponse });
  return {
    headers: { [MODEL_EGRESS_HEADER]: token },
    close: async () => {
      guards.delete(token);
      await own?.destroy();
    },
  };
}
