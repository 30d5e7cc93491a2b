/**
 * The address guard held at connect time for calls to a tenant's model endpoint (an
 * `openai-compatible` `base_url`). The providers' SDKs call the global `fetch`, which
 * resolves the endpoint's name again when it connects and follows redirects: checking the
 * `base_url` once before the turn (agent-runner.ts, for a clear error) cannot stop a name
 * that answers a public address to the check and a private one to the connection (DNS
 * rebinding), nor a public endpoint that redirects to a private one.
 *
 * How: the global `fetch` is wrapped once. A call that carries {@link MODEL_EGRESS_HEADER}
 * (the turn's model has it among its headers, so the SDK sends it on every request) loses
 * the header and is made by undici's own `fetch` through its turn's guarded agent, whose
 * every connection, redirects' included, goes to an address the guard has just allowed
 * (TLS still presents and verifies the endpoint's name). Every other call goes to the
 * `fetch` that was wrapped, untouched. Not a global undici dispatcher: which slot Node's
 * bundled fetch reads, and which handler API it speaks, changes between Node and undici
 * versions. Not an AsyncLocalStorage scope either: on Node 20 one in use makes every
 * promise in the process several times dearer.
 */
import { randomUUID } from "node:crypto";
import { Agent, buildConnector, fetch as undiciFetch } from "undici";
import { type Lookup, NetworkPolicyError, resolveAllowed } from "../src/index.js";

/** Marks a call as a guarded model call; never sent. */
export const MODEL_EGRESS_HEADER = "x-runs-model-egress";

export interface ModelEgressOptions {
  /** Called with each refusal (the turn reports it as `network_policy_denied`). */
  onRefused?: (error: NetworkPolicyError) => void;
  /** TEST ONLY: how names resolve (the address guard's default: the system resolver). */
  lookup?: Lookup;
  /** TEST ONLY: host names connected to a loopback server without the check. */
  testHosts?: ReadonlyMap<string, { host: string; port: number }>;
}

export interface ModelEgressGuard {
  /** Headers for the turn's model (`model.headers`): its calls go through the guard. */
  readonly headers: Readonly<Record<string, string>>;
  /** Makes sure the guard is in place (again, if something replaced `fetch`); call before each model call. */
  ensure(): void;
  /** At the turn's end: forgets the guard and closes its connections. */
  close(): Promise<void>;
}

/** The guarded agents of the turns running now, by their header's value. */
const guards = new Map<string, Agent>();
/** For a marked call whose turn has ended: still guarded, never let through. */
let lateGuard: Agent | undefined;
const WRAPPER = Symbol("runs.modelEgress");

type Fetch = typeof globalThis.fetch;

/** A marked call through its guard; anything else to `next`, as it came. */
function guardedFetch(next: Fetch, input: Parameters<Fetch>[0], init?: RequestInit): Promise<Response> {
  const marked = init?.headers !== undefined && new Headers(init.headers).has(MODEL_EGRESS_HEADER);
  if (!marked) {
    // The SDKs pass a URL and init; a marked Request object is refused rather than sent unguarded.
    if (input instanceof Request && input.headers.has(MODEL_EGRESS_HEADER)) return Promise.reject(new TypeError("a guarded model call must pass its headers in init"));
    return next(input, init);
  }
  const headers = new Headers(init.headers);
  const token = headers.get(MODEL_EGRESS_HEADER)!;
  headers.delete(MODEL_EGRESS_HEADER);
  const dispatcher = guards.get(token) ?? (lateGuard ??= guardedAgent({}));
  return undiciFetch(input as Parameters<typeof undiciFetch>[0], { ...(init as object), headers: [...headers], dispatcher } as Parameters<typeof undiciFetch>[1]) as unknown as Promise<Response>;
}

/** Wraps the global fetch, again if something replaced the wrapper since (never fail open). */
function ensureInstalled(): void {
  const current = globalThis.fetch as Fetch & { [WRAPPER]?: true };
  if (current[WRAPPER]) return;
  globalThis.fetch = Object.assign((input: Parameters<Fetch>[0], init?: RequestInit) => guardedFetch(current, input, init), { [WRAPPER]: true as const });
}

/** An agent whose every new connection goes to an address the guard allowed. */
function guardedAgent(options: ModelEgressOptions): Agent {
  const connect = buildConnector({});
  return new Agent({
    connect: (target, callback) => {
      const mapped = options.testHosts?.get(target.hostname.toLowerCase());
      if (mapped) return connect({ ...target, hostname: mapped.host, port: String(mapped.port) }, callback);
      resolveAllowed(target.hostname, { lookup: options.lookup }).then(
        // `host` keeps the name: TLS sends it and verifies the certificate against it.
        ({ address }) => connect({ ...target, hostname: address }, callback),
        (err: unknown) => {
          if (err instanceof NetworkPolicyError) options.onRefused?.(err);
          callback(err instanceof Error ? err : new Error(String(err)), null);
        },
      );
    },
  });
}

/** A guard for one turn's model calls. */
export function guardModelCalls(options: ModelEgressOptions): ModelEgressGuard {
  ensureInstalled();
  const token = randomUUID();
  const agent = guardedAgent(options);
  guards.set(token, agent);
  return {
    headers: { [MODEL_EGRESS_HEADER]: token },
    ensure: ensureInstalled,
    close: async () => {
      guards.delete(token);
      await agent.close();
    },
  };
}
