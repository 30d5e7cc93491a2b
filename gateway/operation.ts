/**
 * One declaration per route: what the route is (method, path, scope, rate class,
 * Idempotency-Key, path/query/body schemas and answers) is written once, next to its
 * handler in gateway/routes/, as an {@link Operation}. From it, {@link route} registers
 * the handler with Fastify (URL, the `config` the auth and rate-limit hooks read, and
 * validation of the request by the zod schemas, whose outputs type the handler's request
 * and whose answer schemas type what it returns), and gateway/openapi.ts builds the
 * OpenAPI document.
 */
import type {
  ContextConfigDefault,
  FastifyInstance,
  FastifyTypeProvider,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
  RouteGenericInterface,
  RouteHandlerMethod,
} from "fastify";
import { z } from "zod";
import { ENV_NAME_PATTERN, type ErrorCode, type ParamStyle, pathVersion, queryCursor, queryLimit, requestError } from "../src/index.js";

export type Method = "get" | "post" | "put" | "patch" | "delete";

/** A header the handler reads (documented; headers are not validated by a schema). */
export interface Parameter {
  name: string;
  in: "path" | "query" | "header";
  required?: boolean;
  description?: string;
  schema: Record<string, unknown>;
  style?: string;
  explode?: boolean;
}

export interface Success {
  description: string;
  /** The JSON body: a schema registered in gateway/schema-registry.ts, or "__openapi" for the document itself. */
  json?: z.ZodType | "__openapi";
  /** The answer may instead be a Server-Sent Events stream of Event objects. */
  sse?: boolean;
  /** A plain-text body (Prometheus metrics). */
  text?: string;
  /** Sets Location: /api/v1/runs/{runId}?turn_id={turnId}. */
  location?: boolean;
}

export interface Operation {
  method: Method;
  path: string;
  operationId: string;
  summary: string;
  description?: string;
  tag: string;
  /** Required scope, or `public` (no key, no rate limit). */
  scope: string | "public";
  rate?: "exempt" | "expensive";
  idempotencyKey?: boolean;
  /** Path parameters, validated before the handler runs (each field's description documents it). */
  params?: z.ZodObject;
  /** Query parameters, validated before the handler runs; unknown ones are ignored. */
  query?: z.ZodObject;
  /** Headers the handler reads itself. */
  headers?: Parameter[];
  /**
   * The body, validated before the handler runs (a multipart body is read and checked by
   * its handler as it streams; its schema only documents it). `params: "path"` names the
   * whole dotted path of a fault (nested documents) instead of its top-level field.
   */
  body?: { schema: z.ZodType; required: boolean; multipart?: boolean; params?: ParamStyle };
  success: Record<number, Success>;
  /** Fastify's URL when it differs from `path` (a wildcard for names that may hold `/`). */
  url?: string;
  /** Error codes by status, beyond the ones every authenticated route or body can answer. */
  errors?: Partial<Record<number, ErrorCode[]>>;
}

export const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });

/** Path parameters shared by several routes. */
export const runId = { runId: z.string().describe("Run id (`run_…`).") };
export const turnId = { turnId: z.string().describe("Turn id (`turn_…`).") };
export const agentId = { agentId: z.string().describe("Agent id (`agt_…`).") };
export const version = { version: pathVersion().describe("Deployment version.") };
export const keyId = {
  keyId: z
    .string()
    .regex(/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i, "must be a UUID.")
    .meta({ format: "uuid" })
    .describe("API key id."),
};
export const fileId = { fileId: z.string().describe("File id (`file_…`).") };
/**
 * The name is taken with a wildcard, not a `:name` parameter: Fastify answers 414 for a
 * parameter longer than its maxParamLength, and names may be 128 characters. Its pattern
 * is documented, not checked here: a write refuses a bad name (400), a read finds none (404).
 */
export const envName = { "*": z.string().meta({ pattern: ENV_NAME_PATTERN.source }).describe("Environment value name.") };

/** Query parameters of every list. */
export const page = (max: number, fallback: number) => ({ limit: queryLimit(max, fallback), after: queryCursor() });

export const idempotencyKey: Parameter = {
  name: "Idempotency-Key",
  in: "header",
  required: true,
  description:
    "1 to 255 printable ASCII characters; missing or malformed: 400 invalid_request, param Idempotency-Key. A retry with the same key returns the first answer; the same key with a different request: 409.",
  schema: { type: "string", minLength: 1, maxLength: 255, pattern: "^[\\x20-\\x7E]+$" },
};

export const RUN_READS: Partial<Record<number, ErrorCode[]>> = { 404: ["run_not_found"], 410: ["run_expired"] };

/** A path in OpenAPI form (`/runs/{runId}`) in Fastify's (`/runs/:runId`). */
export function fastifyUrl(op: Pick<Operation, "path" | "url">): string {
  return op.url ?? op.path.replace(/\{([^}]+)\}/g, ":$1");
}

/** Request parts typed by their zod schemas (Fastify's type provider interface). */
export interface ZodTypeProvider extends FastifyTypeProvider {
  validator: this["schema"] extends z.ZodType ? z.output<this["schema"]> : unknown;
  serializer: this["schema"] extends z.ZodType ? z.input<this["schema"]> : unknown;
}

type BodyOf<O extends Operation> = O["body"] extends { schema: infer S extends z.ZodType } ? S : undefined;
type AnswersOf<O extends Operation> = {
  [Status in keyof O["success"]]: O["success"][Status] extends { json: infer S extends z.ZodType } ? S : unknown;
};

/** The handler of `O`: its request typed by the declared params, query and body, its answers by the declared bodies. */
export type Handler<O extends Operation> = RouteHandlerMethod<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  RouteGenericInterface,
  ContextConfigDefault,
  { params: O["params"]; querystring: O["query"]; body: BodyOf<O>; response: AnswersOf<O> },
  ZodTypeProvider
>;

/**
 * The body of a POST that declares none (activate, revoke, a webhook's test): nothing, or `{}`.
 * A field sent is refused as on every other body (400 naming it), not ignored: it had
 * answered 200 to `{"version": 2}` on an activation of version 1 (README probe).
 */
const NO_BODY: NonNullable<Operation["body"]> = { schema: z.object({}).strict(), required: false };

/**
 * Registers `handler` as the route `op` declares: URL, the `config` the auth and
 * rate-limit hooks read, and validation of its path, query and body by their schemas. A
 * refused part is answered as {@link requestError} says (400 naming the parameter, or 413),
 * after authentication and before the handler; the handler receives what the schemas output.
 */
export function route<O extends Operation>(app: FastifyInstance, op: O, handler: Handler<O>): void {
  const body = op.body ? (op.body.multipart ? undefined : op.body) : op.method === "post" ? NO_BODY : undefined;
  const schema: Record<string, z.ZodType> = {};
  if (op.params) schema.params = op.params;
  if (op.query) schema.querystring = op.query;
  if (body) schema.body = body.schema;
  app.route({
    method: op.method.toUpperCase() as "GET" | "POST" | "PUT" | "PATCH" | "DELETE",
    url: fastifyUrl(op),
    config: op.scope === "public" ? { public: true } : { scope: op.scope, ...(op.rate ? { rate: op.rate } : {}), ...(op.body?.multipart ? { multipart: true } : {}) },
    schema,
    validatorCompiler: ({ schema: part, httpPart }) => {
      const zod = part as unknown as z.ZodType;
      const style = httpPart === "body" ? body?.params : undefined;
      // Fastify hands an absent part over as null; an optional body reads as {}.
      const absent = httpPart === "body" && !body?.required ? {} : undefined;
      return (data: unknown) => {
        const parsed = zod.safeParse(data === null && absent ? absent : data);
        return parsed.success ? { value: parsed.data } : { error: requestError(parsed.error, style) };
      };
    },
    handler: handler as never,
  });
}
