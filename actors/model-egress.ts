/**
 * The address guard held at connect time for calls to a tenant's model endpoint (an
 * `openai-compatible` `base_url`). The providers' SDKs call the global `fetch`, which
 * resolves the endpoint's name again when it connects and follows redirects: checking the
 * `base_url` once before the turn (agent-runner.ts, for a clear error) cannot stop a name
 * that answers a public address to the check and a private one to the connection (DNS
 * rebinding), nor a public endpoint that redirects to a private one.
 *
 * How: the process's global undici dispatcher (the one Node's `fetch` uses) is wrapped
 * once. A request that carries {@link MODEL_EGRESS_HEADER} (the turn's model has it among
 * its headers, so the SDK sends it on every request, redirects included) loses the header
 * and goes through its turn's guarded agent, whose every connection is made to an address
 * the guard has just allowed (TLS still presents and verifies the endpoint's name). Every
 * other request goes through the dispatcher that was wrapped, untouched. (Not an
 * AsyncLocalStorage scope: on Node 20 one in use makes every promise in the process
 * several times dearer.)
 */
import { randomUUID } from "node:crypto";
import { Agent, buildConnector, Dispatcher, getGlobalDispatcher, setGlobalDispatcher } from "undici";
import { type Lookup, NetworkPolicyError, resolveAllowed } from "../src/index.js";

/** Marks a request as a guarded model call; never sent. */
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
  /** Headers for the turn's model (`model.headers`): its requests go through the guard. */
  readonly headers: Readonly<Record<string, string>>;
  /** Makes sure the guard is in place (again, if another dispatcher replaced it); call before each model call. */
  ensure(): void;
  /** At the turn's end: forgets the guard and closes its connections. */
  close(): Promise<void>;
}

/** The guarded agents of the turns running now, by their header's value. */
const guards = new Map<string, Agent>();
/** For a marked request whose turn has ended: still guarded, never let through. */
let lateGuard: Agent | undefined;

/** Sends a marked request through its guard, anything else through the wrapped dispatcher. */
class GuardingDispatcher extends Dispatcher {
  constructor(readonly wrapped: Dispatcher) {
    super();
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    const marked = takeMarker(options.headers);
    if (!marked) return this.wrapped.dispatch(options, handler);
    const agent = guards.get(marked.token) ?? (lateGuard ??= guardedAgent({}));
    return agent.dispatch({ ...options, headers: marked.headers }, handler);
  }

  override close(...args: unknown[]): any {
    return (this.wrapped.close as (...a: unknown[]) => unknown)(...args);
  }

  override destroy(...args: unknown[]): any {
    return (this.wrapped.destroy as (...a: unknown[]) => unknown)(...args);
  }
}

/** The marker's value and the headers without it; undefined when the request is not marked. */
function takeMarker(headers: Dispatcher.DispatchOptions["headers"]): { token: string; headers: Record<string, string | string[]> | string[] } | undefined {
  if (headers == null) return undefined;
  const isMarker = (name: unknown) => typeof name === "string" && name.toLowerCase() === MODEL_EGRESS_HEADER;
  if (Array.isArray(headers)) {
    // Flat [name, value, name, value, …].
    const at = headers.findIndex((v, i) => i % 2 === 0 && isMarker(v));
    if (at < 0) return undefined;
    return { token: String(headers[at + 1]), headers: [...headers.slice(0, at), ...headers.slice(at + 2)] as string[] };
  }
  const entries: [string, string | string[]][] =
    typeof (headers as Iterable<unknown>)[Symbol.iterator] === "function"
      ? [...(headers as Iterable<[string, string | string[] | undefined]>)].filter((e): e is [string, string | string[]] => e[1] !== undefined)
      : Object.entries(headers as Record<string, string | string[] | undefined>).filter((e): e is [string, string | string[]] => e[1] !== undefined);
  const marker = entries.find(([name]) => isMarker(name));
  if (!marker) return undefined;
  return { token: String(marker[1]), headers: Object.fromEntries(entries.filter(([name]) => !isMarker(name))) };
}

/** Installs the guarding dispatcher, again if something replaced it since (never fail open). */
function ensureInstalled(): void {
  const current = getGlobalDispatcher();
  if (!(current instanceof GuardingDispatcher)) setGlobalDispatcher(new GuardingDispatcher(current));
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
