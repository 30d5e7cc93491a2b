/**
 * The address guard held at connect time for calls to a tenant's model endpoint (an
 * `openai-compatible` `base_url`). The providers' SDKs call the global `fetch`, which
 * resolves the endpoint's name again when it connects and follows redirects: checking the
 * `base_url` once before the turn (agent-runner.ts, for a clear error) cannot stop a name
 * that answers a public address to the check and a private one to the connection (DNS
 * rebinding), nor a public endpoint that redirects to a private one. Inside
 * {@link guardModelCalls}, every connection `fetch` opens is made to an address the guard
 * has just allowed (the name's TLS identity is still the one verified); outside it, fetch
 * is untouched.
 *
 * How: the process's global undici dispatcher (which Node's `fetch` uses) is wrapped once
 * by one that sends a request through the guarded agent of the current async scope
 * ({@link AsyncLocalStorage}), else through the dispatcher it wrapped.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { Agent, buildConnector, Dispatcher, getGlobalDispatcher, setGlobalDispatcher } from "undici";
import { type Lookup, NetworkPolicyError, resolveAllowed } from "../src/index.js";

export interface ModelEgressOptions {
  /** Called with each refusal (the turn reports it as `network_policy_denied`). */
  onRefused?: (error: NetworkPolicyError) => void;
  /** TEST ONLY: how names resolve (the address guard's default: the system resolver). */
  lookup?: Lookup;
  /** TEST ONLY: host names connected to a loopback server without the check. */
  testHosts?: ReadonlyMap<string, { host: string; port: number }>;
}

const scope = new AsyncLocalStorage<Dispatcher>();

/** Sends each request through the current scope's dispatcher, else the one it wraps. */
class ScopedDispatcher extends Dispatcher {
  constructor(readonly wrapped: Dispatcher) {
    super();
  }

  override dispatch(options: Dispatcher.DispatchOptions, handler: Dispatcher.DispatchHandler): boolean {
    return (scope.getStore() ?? this.wrapped).dispatch(options, handler);
  }

  override close(...args: unknown[]): any {
    return (this.wrapped.close as (...a: unknown[]) => unknown)(...args);
  }

  override destroy(...args: unknown[]): any {
    return (this.wrapped.destroy as (...a: unknown[]) => unknown)(...args);
  }
}

/** Installs the scoped dispatcher, again if something replaced it since (never fail open). */
function ensureInstalled(): void {
  const current = getGlobalDispatcher();
  if (!(current instanceof ScopedDispatcher)) setGlobalDispatcher(new ScopedDispatcher(current));
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

/**
 * A guard for one turn's model calls: `run(call)` runs `call`, and every fetch it starts
 * however late, with the address guard held at connect time; `close()` (at the turn's
 * end) closes the guard's connections.
 */
export function guardModelCalls(options: ModelEgressOptions): { run: <T>(call: () => T) => T; close: () => Promise<void> } {
  ensureInstalled();
  const agent = guardedAgent(options);
  return {
    run: (call) => {
      ensureInstalled();
      return scope.run(agent, call);
    },
    close: () => agent.close(),
  };
}
