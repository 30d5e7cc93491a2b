import { z } from "zod";

/**
 * zod schemas of every request and response body the gateway serves, registered under
 * the names they take in the OpenAPI document's `components.schemas` (gateway/openapi.ts).
 *
 * Request schemas are the validators themselves: routes declare them (gateway/operation.ts)
 * and Fastify validates with them. Those the runtime also needs outside a route live in
 * src/ (RunRequestBodySchema, DeploymentRequestSchema, AgentCreateSchema, TagSchema) and are
 * registered here under their document names.
 *
 * Response schemas describe what `src/render.ts`, `src/api-keys.ts` and the route files
 * send, field for field: a handler's answer is typed by them (the compiler refuses a
 * renderer that drifts), they are emitted in zod's output mode, so objects carry
 * `additionalProperties: false`, and the integration test validates real answers against
 * them.
 */
export const schemas = z.registry<{ id: string; description?: string }>();

export function named<T extends z.ZodType>(id: string, schema: T, description?: string): T {
  schemas.add(schema, description === undefined ? { id } : { id, description });
  return schema;
}

export const unixSeconds = () => z.int().min(0).describe("Unix seconds");
