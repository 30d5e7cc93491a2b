/**
 * /metrics (decisions §8): one prom-client registry per gateway (a process may hold several
 * in tests), so nothing here is global. Labels are bounded: the route template (never the
 * URL), the method and the status. The usage series name workspaces, so they are kept in a
 * registry of their own, shown only to a scrape that presents the operator's token.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from "prom-client";
import type { FastifyInstance } from "fastify";
import type { UsageRecordDoc } from "../src/index.js";

/** Where the gauges read their values at scrape time. */
export interface MetricSources {
  /** This node's executing and queued turns; absent on a gateway-only node. */
  turns?: () => { active: number; queued: number; recovering: number; recoveriesWaiting: number };
  sseStreams: () => number;
  natsConnected: () => boolean;
  /** Whether the store answers a ping (bounded in time by the caller). */
  storeReachable: () => Promise<boolean>;
}

const LATENCY_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120];

export class GatewayMetrics {
  readonly registry = new Registry();
  /** Series that name tenants (workspace ids and what they spent). */
  private readonly tenantRegistry = new Registry();
  private readonly requests: Counter<"method" | "route" | "status">;
  private readonly latency: Histogram<"method" | "route" | "status">;
  private readonly tokens: Counter<"workspace" | "model" | "kind">;
  private readonly cost: Counter<"workspace" | "model">;

  /**
   * `tenants`: the usage series are kept (RUNS_METRICS_TOKEN set); otherwise nobody may see
   * them, and a label a tenant names (its model) would only grow this node's memory.
   */
  constructor(
    sources: MetricSources,
    private readonly tenants = true,
  ) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry, prefix: "runs_" });
    this.requests = new Counter({ name: "runs_http_requests_total", help: "HTTP answers by method, route template and status.", labelNames: ["method", "route", "status"], registers });
    this.latency = new Histogram({
      name: "runs_http_request_duration_seconds",
      help: "Time from request to the end of the answer, by method, route template and status (an event stream counts until it closes).",
      labelNames: ["method", "route", "status"],
      buckets: LATENCY_BUCKETS_S,
      registers,
    });
    // Usage of the turns this node's actors finished. Labels: workspaces × models, bounded
    // by the tenants a service has (a model label never holds a URL).
    const tenantRegisters = [this.tenantRegistry];
    this.tokens = new Counter({ name: "runs_tokens_total", help: "Tokens used by finished turns, by workspace, model and kind (input, output, cache_read, cache_write).", labelNames: ["workspace", "model", "kind"], registers: tenantRegisters });
    this.cost = new Counter({ name: "runs_cost_usd_total", help: "Cost in USD of finished turns on priced models, by workspace and model.", labelNames: ["workspace", "model"], registers: tenantRegisters });
    // One walk of the node's actors per scrape, whatever the gauges that read it.
    const counts = sources.turns;
    let last: { at: number; value: ReturnType<NonNullable<MetricSources["turns"]>> } | undefined;
    const turns = counts && (() => {
      const now = Date.now();
      if (!last || now - last.at > 100) last = { at: now, value: counts() };
      return last.value;
    });
    if (turns) {
      new Gauge({ name: "runs_active_turns", help: "Turns executing on this node.", registers, collect() { this.set(turns().active); } });
      new Gauge({ name: "runs_queued_turns", help: "Turns queued behind an active turn of a run this node owns.", registers, collect() { this.set(turns().queued); } });
      new Gauge({ name: "runs_recovering_runs", help: "Busy runs of partitions this node gained that it is recovering now (a few at a time).", registers, collect() { this.set(turns().recovering); } });
      new Gauge({ name: "runs_recoveries_waiting", help: "Busy runs of partitions this node gained whose recovery waits its turn.", registers, collect() { this.set(turns().recoveriesWaiting); } });
    }
    new Gauge({ name: "runs_sse_streams", help: "Event streams open on this gateway.", registers, collect() { this.set(sources.sseStreams()); } });
    new Gauge({ name: "runs_nats_up", help: "1 when this node's NATS connection is up.", registers, collect() { this.set(sources.natsConnected() ? 1 : 0); } });
    new Gauge({
      name: "runs_store_up",
      help: "1 when the store answered a ping at this scrape.",
      registers,
      async collect() {
        this.set((await sources.storeReachable()) ? 1 : 0);
      },
    });
  }

  /** Counts every answer of `app`, hijacked event streams included (they end when their socket closes). */
  instrument(app: FastifyInstance): void {
    app.addHook("onRequest", async (request, reply) => {
      const started = process.hrtime.bigint();
      reply.raw.once("close", () => {
        const labels = { method: request.method, route: request.routeOptions.url ?? "unmatched", status: String(reply.raw.statusCode) };
        this.requests.inc(labels);
        this.latency.observe(labels, Number(process.hrtime.bigint() - started) / 1e9);
      });
    });
  }

  /** Counts one finished turn's usage (called once per usage record this process wrote). */
  countUsage(record: UsageRecordDoc): void {
    if (!this.tenants) return;
    // A tenant names its own endpoint's model ids, as many as it likes: one label for them all.
    const model = record.model.startsWith("openai-compatible/") ? "openai-compatible" : record.model;
    const labels = { workspace: record.workspace_id, model };
    for (const kind of ["input", "output", "cache_read", "cache_write"] as const) {
      const n = record[`${kind}_tokens`];
      if (n > 0) this.tokens.inc({ ...labels, kind }, n);
    }
    if (record.cost_usd) this.cost.inc(labels, record.cost_usd);
  }

  /** The exposition: with the series that name workspaces when they are kept (a scrape with the operator's token). */
  async text(): Promise<string> {
    const text = await this.registry.metrics();
    return this.tenants ? `${text}${await this.tenantRegistry.metrics()}` : text;
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
