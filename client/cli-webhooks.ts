/** `runs webhooks …`: create, list, inspect, test, rotate and delete webhooks, and read their deliveries. */
import { exactly, multi, parseArgs, str, suggestion, UsageError, type Parsed } from "./cli-args.js";
import type { RunsClient } from "./client.js";
import type { Webhook, WebhookDelivery, WebhookEventType } from "./types.js";

interface Out {
  json(p: Parsed): boolean;
  line(text: string): void;
  note(text: string): void;
  document(value: unknown): void;
}

const SUBCOMMANDS = ["list", "create", "get", "enable", "disable", "delete", "test", "rotate-secret", "deliveries", "redeliver"];

const webhookLine = (w: Webhook) =>
  `${w.id}  ${w.enabled ? "enabled" : `disabled${w.disabled_reason ? ` (${w.disabled_reason})` : ""}`}  ${w.event_types.join(",")}${w.agent_id ? `  agent ${w.agent_id}` : ""}  ${w.url}`;

const deliveryLine = (d: WebhookDelivery) =>
  `${d.id}  ${d.event_type}  ${d.status}  attempts ${d.attempts}${d.last_attempt ? `  last ${d.last_attempt.status_code ?? d.last_attempt.error}` : ""}${d.run_id ? `  ${d.run_id}` : ""}`;

export async function webhooks(client: () => RunsClient, args: string[], out: Out): Promise<number> {
  const [sub = "list", ...rest] = args[0]?.startsWith("--") ? ["list", ...args] : args;
  const show = (p: Parsed, w: Webhook) => {
    if (out.json(p)) return out.document(w);
    out.line(webhookLine(w));
    if (w.secret) out.note(`secret (shown once): ${w.secret}`);
  };
  switch (sub) {
    case "list": {
      const p = parseArgs(rest, {});
      exactly(p, 0, "");
      const c = client();
      const all: Webhook[] = [];
      for await (const w of c.paginate((after) => c.listWebhooks({ limit: 100, after }))) all.push(w);
      if (out.json(p)) out.document({ object: "list", data: all, has_more: false, next_cursor: null });
      else for (const w of all) out.line(webhookLine(w));
      return 0;
    }
    case "create": {
      const p = parseArgs(rest, { event: "multi", agent: "string", description: "string", disabled: "boolean" });
      const [url] = exactly(p, 1, "URL");
      const events = (multi(p, "event") ?? ["*"]) as WebhookEventType[];
      show(p, await client().createWebhook({ url, event_types: events, agent_id: str(p, "agent") ?? null, description: str(p, "description") ?? null, enabled: p.flags.disabled !== true }));
      return 0;
    }
    case "get":
    case "enable":
    case "disable":
    case "rotate-secret": {
      const p = parseArgs(rest, {});
      const [id] = exactly(p, 1, "WEBHOOK_ID");
      const c = client();
      const w = sub === "get" ? await c.getWebhook(id) : sub === "rotate-secret" ? await c.rotateWebhookSecret(id) : await c.updateWebhook(id, { enabled: sub === "enable" });
      show(p, w);
      return 0;
    }
    case "delete": {
      const p = parseArgs(rest, {});
      const [id] = exactly(p, 1, "WEBHOOK_ID");
      const deleted = await client().deleteWebhook(id);
      out.json(p) ? out.document(deleted) : out.line(`${deleted.id} deleted`);
      return 0;
    }
    case "test":
    case "redeliver": {
      const p = parseArgs(rest, {});
      const [id, deliveryId] = exactly(p, sub === "test" ? 1 : 2, sub === "test" ? "WEBHOOK_ID" : "WEBHOOK_ID and DELIVERY_ID");
      const d = sub === "test" ? await client().testWebhook(id) : await client().redeliverWebhook(id, deliveryId!);
      out.json(p) ? out.document(d) : out.line(deliveryLine(d));
      return 0;
    }
    case "deliveries": {
      const p = parseArgs(rest, { limit: "string" });
      const [id] = exactly(p, 1, "WEBHOOK_ID");
      const page = await client().listWebhookDeliveries(id, { limit: Number(str(p, "limit") ?? 20) || 20 });
      if (out.json(p)) out.document(page);
      else for (const d of page.data) out.line(deliveryLine(d));
      return 0;
    }
    default:
      throw new UsageError(`unknown command: webhooks ${sub}${suggestion(sub, SUBCOMMANDS, "webhooks ")}`);
  }
}
