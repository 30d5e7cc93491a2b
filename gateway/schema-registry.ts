import { z } from "zod";

/**
 * zod schemas of every request and response body the gateway serves, registered under
 * the names they take in the OpenAPI document's `components.schemas` (gateway/openapi.ts).
 *
 * Response schemas describe what `src/render.ts`, `src/api-keys.ts` and the route files
 * send today, field for field: they are emitted in zod's output mode, so objects carry
 * `additionalProperties: false`, and the integration test validates real answers against
 * them, which catches a renderer and this file drifting apart.
 *
 * Request schemas describe what the parsers accept. Where a parser's own zod schema is
 * exported it is reused (AgentCreateSchema, AgentConfigSchema, DeploymentRequestSchema); the
 * API key and environment value request schemas are private to their modules, so they
 * are mirrored here (test/unit/openapi-schemas.test.ts checks the mirrors against the
 * parsers).
 */
export const schemas = z.registry<{ id: string; description?: string }>();

export function named<T extends z.ZodType>(id: string, schema: T, description?: string): T {
  schemas.add(schema, description === undefined ? { id } : { id, description });
  return schema;
}

export const unixSeconds = () => z.int().min(0).describe("Unix seconds");
