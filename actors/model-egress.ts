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
 * it on every request) loses the header and is made by undici's own `fetch` through its
 * turn's guarded agent: every connection, redirects' included, is made with a lookup that
 * answers only allowed addresses (and address literals are checked first), and TLS
 * presents and verifies the endpoint's name as usual. Every other call goes to the
 * process's `fetch` as it came. Not a global undici dispatcher: which slot Node's bundled
 * fetch reads, and which handler API it speaks, change between Node and undici versions.
 * Not an AsyncLocalStorage scope either: on Node 20 one in use makes every promise in the
 * process several times dearer.
 */
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";
import net from "node:net";
import type { Agent } from "undici";
import { guardedLookup, type Lookup, NetworkPolicyError, refusedAddressReason } from "../src/index.js";

/** Marks a call as a guarded model call; never sent. */
export const MODEL_EGRESS_HEADER = "x-runs-model-egress";

export interface ModelEgressOptions {
  /** Called with each refusal (the turn reports it as `network_policy_denied`). */
  onRefused?: (error: NetworkPolicyError) => void;
  /** TEST ONLY (no configuration reaches it): how names resolve; the system resolver otherwise. */
  lookup?: Lookup;
  /** TEST ONLY (no configuration reaches it): host names connected to a loopback server without the check. */
  testHosts?: ReadonlyMap<string, { host: string; port: number }>;
}

export interface ModelEgressGuard {
  /** Headers for the turn's model (`model.headers`): its calls go through the guard. */
  readonly headers: Readonly<Record<string, string>>;
  /** At the turn's end: forgets the guard and drops its connections. */
  close(): Promise<void>;
}

type Fetch = typeof globalThis.fetch;
type Undici = typeof import("undici");

/** The guarded agents of the turns running now, by their header's value. */
const guards = new Map<string, Agent>();
/** For a marked call whose turn has ended: still guarded, never let through. */
let lateGuard: Agent | undefined;
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

/** Wraps `globalThis.fetch` once, for the rest of the process. */
function install(): void {
  if (guardedFetchInstalled) return;
  let next: Fetch = globalThis.fetch;
  const wrapper: Fetch = (input, init) => guardedFetch(next, input, init);
  Object.defineProperty(globalThis, "fetch", {
    get: () => wrapper,
    // Someone else's fetch becomes what unmarked calls use; marked ones stay guarded.
    set: (fetch: Fetch) => {
      if (fetch !== wrapper) next = fetch;
    },
    enumerable: true,
    configurable: false,
  });
  guardedFetchInstalled = true;
}
let guardedFetchInstalled = false;

/** A marked call through its guard; anything else to `next`, as it came. */
function guardedFetch(next: Fetch, input: Parameters<Fetch>[0], init?: RequestInit): Promise<Response> {
  const headers = init?.headers === undefined ? undefined : new Headers(init.headers);
  if (!headers?.has(MODEL_EGRESS_HEADER)) {
    // The SDKs pass a URL and init; a marked Request object is refused rather than sent unguarded.
    if (input instanceof Request && input.headers.has(MODEL_EGRESS_HEADER)) return Promise.reject(new TypeError("a guarded model call must pass its headers in init"));
    return next(input, init);
  }
  const token = headers.get(MODEL_EGRESS_HEADER)!;
  headers.delete(MODEL_EGRESS_HEADER);
  const dispatcher = guards.get(token) ?? (lateGuard ??= guardedAgent({}));
  const { fetch } = loadUndici();
  return fetch(input as Parameters<Undici["fetch"]>[0], { ...(init as object), headers: [...headers], dispatcher } as Parameters<Undici["fetch"]>[1]) as unknown as Promise<Response>;
}

/** An agent whose every connection goes to addresses the guard allowed. */
function guardedAgent(options: ModelEgressOptions): Agent {
  const { Agent, buildConnector } = loadUndici();
  const connect = buildConnector({ lookup: guardedLookup({ lookup: options.lookup, onRefused: options.onRefused }) });
  return new Agent({
    connect: (target, callback) => {
      const host = target.hostname.replace(/^\[|\]$/g, "").toLowerCase();
      const mapped = options.testHosts?.get(host);
      if (mapped) return connect({ ...target, hostname: mapped.host, port: String(mapped.port) }, callback);
      // A socket connects to an address literal without a lookup: it is checked here.
      const reason = net.isIP(host) ? refusedAddressReason(host) : undefined;
      if (reason) {
        const refused = new NetworkPolicyError(host, `${reason} address ${host}`);
        options.onRefused?.(refused);
        return callback(refused, null);
      }
      connect(target, callback);
    },
  });
}

/** A guard for one turn's model calls. */
export function guardModelCalls(options: ModelEgressOptions): ModelEgressGuard {
  install();
  const token = randomUUID();
  const agent = guardedAgent(options);
  guards.set(token, agent);
  return {
    headers: { [MODEL_EGRESS_HEADER]: token },
    close: async () => {
      guards.delete(token);
      // Nothing of the turn runs any more: its connections go now, not when bodies drain.
      await agent.destroy();
    },
  };
}
