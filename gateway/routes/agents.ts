import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { activateVersion, DeploymentStatus, type AgentDoc, ApiError, decodeCursor, type DeploymentDoc, encodeCursor, invalid, list, listModels, providerOffered, renderAgent, renderDeployment, toDeploymentRequest } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { requireScope } from "../auth.js";
import { idempotencyKeyOf } from "../idempotency.js";
import { type Operation, page, route, agentId, version } from "../operation.js";
import { AgentCreateRequestSchema, AgentListSchema, AgentSchema, DeploymentListSchema, DeploymentRequestSchema, DeploymentSchema, ModelListSchema } from "../schemas.js";

async function loadAgent(ctx: GatewayContext, workspaceId: string, agentId: string): Promise<AgentDoc> {
  const agent = await ctx.store.getAgent(workspaceId, agentId);
  if (!agent) throw new ApiError("agent_not_found", { param: "agentId" });
  return agent;
}

async function loadDeployment(ctx: GatewayContext, agent: AgentDoc, version: number): Promise<DeploymentDoc> {
  const deployment = await ctx.store.getDeployment(agent._id, version);
  if (!deployment) throw new ApiError("agent_version_not_found", { param: "version" });
  return deployment;
}

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const AGENT_OPERATIONS = {
  listModels: {
    method: "get",
    path: "/api/v1/models",
    operationId: "listModels",
    summary: "Models an agent config may name",
    tag: "agents",
    scope: "models:read",
    success: { 200: { description: "The registry's models plus faux/scripted.", json: ModelListSchema } },
  },
  createAgent: {
    method: "post",
    path: "/api/v1/agents",
    operationId: "createAgent",
    summary: "Create an agent",
    tag: "agents",
    scope: "agents:write",
    body: { schema: AgentCreateRequestSchema, required: true },
    success: { 201: { description: "The agent (no active version yet).", json: AgentSchema } },
  },
  listAgents: {
    method: "get",
    path: "/api/v1/agents",
    operationId: "listAgents",
    summary: "List agents",
    tag: "agents",
    scope: "agents:read",
    query: z.object(page(100, 20)),
    success: { 200: { description: "Agents.", json: AgentListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"] },
  },
  getAgent: {
    method: "get",
    path: "/api/v1/agents/{agentId}",
    operationId: "getAgent",
    summary: "Retrieve an agent",
    tag: "agents",
    scope: "agents:read",
    params: z.object(agentId),
    success: { 200: { description: "The agent.", json: AgentSchema } },
    errors: { 404: ["agent_not_found"] },
  },
  createDeployment: {
    method: "post",
    path: "/api/v1/agents/{agentId}/deployments",
    operationId: "createDeployment",
    summary: "Deploy a configuration as the next version",
    description:
      "Answers at once with status building; the build makes it ready (activated when activate is true) or failed. An openai-compatible model also needs run:read (403, param config.model): the endpoint it names is sent the agent's turns; so does a network.allow list (403, param config.network.allow): commands may send the workspace there; with api_key_env, env_vars:reveal too (403, param config.model.api_key_env): it is sent that value.",
    tag: "agents",
    scope: "agents:write",
    rate: "expensive",
    idempotencyKey: true,
    params: z.object(agentId),
    body: { schema: DeploymentRequestSchema, required: true, params: "path" },
    success: { 201: { description: "The deployment.", json: DeploymentSchema } },
    errors: { 404: ["agent_not_found"], 409: ["idempotency_conflict"] },
  },
  listDeployments: {
    method: "get",
    path: "/api/v1/agents/{agentId}/deployments",
    operationId: "listDeployments",
    summary: "List an agent's deployments",
    description: "By version, oldest first; `limit` (1–100, default 20) and `after` (a `next_cursor`) page through them.",
    tag: "agents",
    scope: "agents:read",
    params: z.object(agentId),
    query: z.object(page(100, 20)),
    success: { 200: { description: "Deployments, one page.", json: DeploymentListSchema } },
    errors: { 400: ["invalid_request", "invalid_cursor"], 404: ["agent_not_found"] },
  },
  getDeployment: {
    method: "get",
    path: "/api/v1/agents/{agentId}/deployments/{version}",
    operationId: "getDeployment",
    summary: "Retrieve a deployment",
    tag: "agents",
    scope: "agents:read",
    params: z.object({ ...agentId, ...version }),
    success: { 200: { description: "The deployment.", json: DeploymentSchema } },
    errors: { 400: ["invalid_request"], 404: ["agent_not_found", "agent_version_not_found"] },
  },
  activateDeployment: {
    method: "post",
    path: "/api/v1/agents/{agentId}/deployments/{version}/activate",
    operationId: "activateDeployment",
    summary: "Make a version the agent's active one",
    description: "A building version becomes active when ready; a failed one: 409 agent_version_not_ready.",
    tag: "agents",
    scope: "agents:write",
    params: z.object({ ...agentId, ...version }),
    success: { 200: { description: "The agent.", json: AgentSchema } },
    errors: { 400: ["invalid_request"], 404: ["agent_not_found", "agent_version_not_found"], 409: ["agent_version_not_ready"] },
  },
} satisfies Record<string, Operation>;

export function agentRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    route(app, AGENT_OPERATIONS.listModels, async () => {
      const data = listModels(ctx.config.ambientProviders).map((m) => ({ object: "model" as const, ...m }));
      return list(data, false, null);
    });

    route(app, AGENT_OPERATIONS.createAgent, async (request, reply) => {
      const auth = authOf(request);
      const body = request.body;
      const agent: AgentDoc = {
        _id: ctx.ids.agent(),
        workspace_id: auth.workspace._id,
        name: body.name,
        description: body.description ?? null,
        active_version: null,
        created_at: ctx.clock.nowMs(),
      };
      await ctx.store.insertAgent(agent);
      return reply.status(201).send(renderAgent(agent));
    });

    route(app, AGENT_OPERATIONS.listAgents, async (request) => {
      const auth = authOf(request);
      const limit = request.query.limit;
      const after = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "agents", auth.workspace._id);
      const agents = await ctx.store.listAgents(
        auth.workspace._id,
        limit + 1,
        after ? { createdAt: Number(after.k), id: after.id } : undefined,
      );
      const page = agents.slice(0, limit);
      const last = page[page.length - 1];
      const next = last ? encodeCursor({ s: "agents", o: auth.workspace._id, k: String(last.created_at), id: last._id }) : null;
      return list(page.map(renderAgent), agents.length > limit, next);
    });

    route(app, AGENT_OPERATIONS.getAgent, async (request) => {
      const auth = authOf(request);
      return renderAgent(await loadAgent(ctx, auth.workspace._id, request.params.agentId));
    });

    route(app, AGENT_OPERATIONS.createDeployment, async (request, reply) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      const body = toDeploymentRequest(request.body);
      const model = body.config.model;
      if (typeof model === "string" && !providerOffered(model.slice(0, model.indexOf("/")), ctx.config.ambientProviders)) {
        throw invalid("config.model", `Model provider "${model.slice(0, model.indexOf("/"))}" authenticates with the service's own credentials and is not enabled on this service (RUNS_AMBIENT_PROVIDERS).`);
      }
      // An endpoint the request itself names is sent every turn of the agent (its inputs, its
      // transcript): sending data to an address of one's choosing is reading it, so it takes
      // run:read, as a webhook does (found by a review: agents:write alone could).
      if (typeof model === "object") {
        requireScope(auth, "run:read", { param: "config.model", why: "an openai-compatible endpoint is sent the turns of the agent (their inputs and transcripts), so deploying one needs it" });
      }
      // So is a network allow list: the agent's commands may send the workspace (its files,
      // inputs placed there) to the hosts it names (found by a second review).
      if ((body.config.network?.allow?.length ?? 0) > 0) {
        requireScope(auth, "run:read", { param: "config.network.allow", why: "the agent's commands may send its runs' workspaces to the hosts network.allow names, so deploying one needs it" });
      }
      // It is also sent the value api_key_env names: sending a value to an address of one's
      // choosing is reading it, so it takes reading's scope.
      if (typeof model === "object" && model.api_key_env !== undefined) {
        requireScope(auth, "env_vars:reveal", { param: "config.model.api_key_env", why: `a deployment that sends the environment value ${model.api_key_env} to an endpoint it names needs it (the value could be read there)` });
      }
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      let created: DeploymentDoc | undefined;
      const { result } = await ctx.idempotency.once<{ version?: number }>(
        // Scoped to the workspace and the operation (decisions §4), as cancel's and delete's
        // keys are: the agent is part of the request, so a key reused on another agent is 409.
        { workspaceId: auth.workspace._id, operation: "deployments.create", key, fingerprint: { agent_id: agent._id, ...body }, fresh: () => ({}) },
        async () => {
          created = await ctx.store.insertDeployment({
            workspace_id: auth.workspace._id,
            agent_id: agent._id,
            status: DeploymentStatus.building,
            upgrade_policy: body.upgrade_policy,
            config: body.config,
            activate: body.activate,
            error: null,
            created_at: ctx.clock.nowMs(),
            ready_at: null,
          });
          return { version: created.version };
        },
        // Nothing was created when the insert failed: the key stays free for a retry.
        { releaseOn: () => true, quietRelease: true },
      );
      if (created) {
        ctx.builder.schedule(created);
        return reply.status(201).send(renderDeployment(created));
      }
      const existing = result.version === undefined ? null : await ctx.store.getDeployment(agent._id, result.version);
      if (!existing) throw new ApiError("runtime_unavailable", { retryAfterS: 1, message: "The deployment made under this Idempotency-Key cannot be read right now." });
      return reply.status(201).send(renderDeployment(existing));
    });

    route(app, AGENT_OPERATIONS.listDeployments, async (request) => {
      const auth = authOf(request);
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      const limit = request.query.limit;
      const after = request.query.after === undefined ? undefined : decodeCursor(request.query.after, "deployments", agent._id);
      const afterVersion = after ? Number(after.k) : 0;
      if (!Number.isSafeInteger(afterVersion) || afterVersion < 0) throw new ApiError("invalid_cursor", { param: "after", message: "The cursor is not valid." });
      const deployments = await ctx.store.listDeployments(agent._id, limit + 1, afterVersion);
      const page = deployments.slice(0, limit);
      const last = page[page.length - 1];
      const more = deployments.length > limit;
      const next = more && last ? encodeCursor({ s: "deployments", o: agent._id, k: String(last.version), id: String(last.version) }) : null;
      return list(page.map(renderDeployment), more, next);
    });

    route(app, AGENT_OPERATIONS.getDeployment, async (request) => {
      const auth = authOf(request);
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      return renderDeployment(await loadDeployment(ctx, agent, request.params.version));
    });

    route(app, AGENT_OPERATIONS.activateDeployment,
      async (request) => {
        const auth = authOf(request);
        const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
        // A building version becomes active when its build finishes.
        await activateVersion(ctx.store, await loadDeployment(ctx, agent, request.params.version));
        return renderAgent((await ctx.store.getAgent(auth.workspace._id, agent._id))!);
      },
    );
  };
}
