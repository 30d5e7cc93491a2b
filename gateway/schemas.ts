/**
 * Every body schema of the OpenAPI document, in the order they are registered
 * (gateway/schema-registry.ts explains what they describe): errors, runs, turns and
 * events, then the other resources, then the lists of them.
 */
import { z } from "zod";
import { ERROR_CATALOGUE, errorTypeForStatus } from "../src/index.js";
import { named, schemas } from "./schema-registry.js";
import { EventHistorySchema, EventSchema, RunSummarySchema, TurnSchema } from "./schemas-runs.js";
import { AgentSchema, ApiKeySchema, DeploymentSchema, EnvValueSchema, ModelSchema, WebhookDeliverySchema, WebhookSchema } from "./schemas-resources.js";

export { schemas };
export * from "./schemas-runs.js";
export * from "./schemas-resources.js";

// ---------------------------------------------------------------------------------
// Lists

function listOf(id: string, item: z.ZodType, description: string) {
  return named(
    id,
    z.object({
      object: z.literal("list"),
      data: z.array(item),
      has_more: z.boolean(),
      next_cursor: z.string().nullable().describe("Opaque; pass as after for the next page. null when has_more is false."),
    }),
    description,
  );
}

export const RunListSchema = listOf("RunList", RunSummarySchema, "Run summaries, most recent activity first.");
export const TurnListSchema = listOf("TurnList", TurnSchema, "Turns, oldest first.");
export const AgentListSchema = listOf("AgentList", AgentSchema, "Agents.");
export const DeploymentListSchema = listOf("DeploymentList", DeploymentSchema, "Deployments of one agent.");
export const ModelListSchema = listOf("ModelList", ModelSchema, "Models of the registry plus faux/scripted.");
export const ApiKeyListSchema = listOf("ApiKeyList", ApiKeySchema, "API keys of the workspace (no secrets).");
export const EnvValueListSchema = listOf("EnvironmentValueList", EnvValueSchema, "Names and timestamps; never values.");
export const WebhookListSchema = listOf("WebhookList", WebhookSchema, "Webhooks, newest first (no secrets).");
export const WebhookDeliveryListSchema = listOf("WebhookDeliveryList", WebhookDeliverySchema, "Deliveries of one webhook, newest first.");
export const EventListSchema = named(
  "EventList",
  z.object({
    object: z.literal("list"),
    data: z.array(EventSchema),
    has_more: z.boolean(),
    next_cursor: z.string().nullable().describe("The last event's id when has_more, else null."),
    history: EventHistorySchema,
  }),
  "Retained events in run sequence order, with their history.",
);

/** Every catalogued API error code with its status, for the document's x-error-codes. */
export function errorCatalogue(): { code: string; status: number; type: string; retryable: boolean; message: string }[] {
  return Object.entries(ERROR_CATALOGUE).map(([code, entry]) => ({
    code,
    status: entry.status,
    type: errorTypeForStatus(entry.status),
    retryable: entry.retryable,
    message: entry.message,
  }));
}
