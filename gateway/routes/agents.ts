import type { FastifyInstance } from "fastify";
import { activationOf, AgentCreateSchema, DeploymentStatus, type AgentDoc, ApiError, decodeCursor, type DeploymentDoc, encodeCursor, Ids, invalid, list, listModels, parseDeploymentRequest, parseLimit, parseWith, providerOffered, renderAgent, renderDeployment } from "../../src/index.js";
import { authOf, type GatewayContext } from "../context.js";
import { idempotencyKeyOf } from "../idempotency.js";

type AgentParams = { Params: { agentId: string } };
type VersionParams = { Params: { agentId: string; version: string } };

async function loadAgent(ctx: GatewayContext, workspaceId: string, agentId: string): Promise<AgentDoc> {
  const agent = await ctx.store.getAgent(workspaceId, agentId);
  if (!agent) throw new ApiError("agent_not_found", { param: "agentId" });
  return agent;
}

function parseVersion(raw: string): number {
  const version = Number(raw);
  if (!/^[1-9][0-9]{0,15}$/.test(raw) || !Number.isSafeInteger(version)) throw invalid("version", "version must be a positive whole number.");
  return version;
}

async function loadDeployment(ctx: GatewayContext, agent: AgentDoc, raw: string): Promise<DeploymentDoc> {
  const deployment = await ctx.store.getDeployment(agent._id, parseVersion(raw));
  if (!deployment) throw new ApiError("agent_version_not_found", { param: "version" });
  return deployment;
}

export function agentRoutes(ctx: GatewayContext) {
  return async function (app: FastifyInstance) {
    app.get("/api/v1/models", { config: { scope: "models:read" } }, async () => {
      const data = listModels(ctx.config.ambientProviders).map((m) => ({ object: "model", ...m }));
      return list(data, false, null);
    });

    app.post("/api/v1/agents", { config: { scope: "agents:write" } }, async (request, reply) => {
      const auth = authOf(request);
      const body = parseWith(AgentCreateSchema, request.body);
      const agent: AgentDoc = {
        _id: Ids.agent(),
        workspace_id: auth.workspace._id,
        name: body.name,
        description: body.description ?? null,
        active_version: null,
        created_at: ctx.clock.nowMs(),
      };
      await ctx.store.insertAgent(agent);
      return reply.status(201).send(renderAgent(agent));
    });

    app.get<{ Querystring: { limit?: string; after?: string } }>("/api/v1/agents", { config: { scope: "agents:read" } }, async (request) => {
      const auth = authOf(request);
      const limit = parseLimit(request.query.limit, 20, 100);
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

    app.get<AgentParams>("/api/v1/agents/:agentId", { config: { scope: "agents:read" } }, async (request) => {
      const auth = authOf(request);
      return renderAgent(await loadAgent(ctx, auth.workspace._id, request.params.agentId));
    });

    app.post<AgentParams>("/api/v1/agents/:agentId/deployments", { config: { scope: "agents:write", rate: "expensive" } }, async (request, reply) => {
      const auth = authOf(request);
      const key = idempotencyKeyOf(request)!;
      const body = parseDeploymentRequest(request.body);
      const model = body.config.model;
      if (typeof model === "string" && !providerOffered(model.slice(0, model.indexOf("/")), ctx.config.ambientProviders)) {
        throw invalid("config.model", `Model provider "${model.slice(0, model.indexOf("/"))}" authenticates with the service's own credentials and is not enabled on this service (RUNS_AMBIENT_PROVIDERS).`);
      }
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      const claim = await ctx.idempotency.claim<{ version?: number }>(auth.workspace._id, `deployments.create:${agent._id}`, key, body, () => ({}));
      if (claim.kind === "replay" && typeof claim.result.version === "number") {
        const existing = await ctx.store.getDeployment(agent._id, claim.result.version);
        if (existing) return reply.status(201).send(renderDeployment(existing));
      }
      let deployment: DeploymentDoc;
      try {
        deployment = await ctx.store.insertDeployment({
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
      } catch (err) {
        // Nothing was created: the key stays free for a retry.
        await ctx.idempotency.release(claim.id).catch(() => undefined);
        throw err;
      }
      await ctx.idempotency.complete(claim.id, { version: deployment.version });
      ctx.builder.schedule(deployment);
      return reply.status(201).send(renderDeployment(deployment));
    });

    app.get<AgentParams & { Querystring: { limit?: string; after?: string } }>("/api/v1/agents/:agentId/deployments", { config: { scope: "agents:read" } }, async (request) => {
      const auth = authOf(request);
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      const limit = parseLimit(request.query.limit, 20, 100);
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

    app.get<VersionParams>("/api/v1/agents/:agentId/deployments/:version", { config: { scope: "agents:read" } }, async (request) => {
      const auth = authOf(request);
      const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
      return renderDeployment(await loadDeployment(ctx, agent, request.params.version));
    });

    app.post<VersionParams>(
      "/api/v1/agents/:agentId/deployments/:version/activate",
      { config: { scope: "agents:write" } },
      async (request) => {
        const auth = authOf(request);
        const agent = await loadAgent(ctx, auth.workspace._id, request.params.agentId);
        const deployment = await loadDeployment(ctx, agent, request.params.version);
        if (activationOf(deployment) === "when_ready") {
          // Becomes active when the build finishes; if it finished meanwhile, activate now.
          await ctx.store.requestActivation(deployment._id);
          const now = await ctx.store.getDeployment(agent._id, deployment.version);
          if (now?.status === DeploymentStatus.ready) await ctx.store.setActiveVersion(agent._id, deployment.version);
        } else {
          await ctx.store.setActiveVersion(agent._id, deployment.version);
        }
        return renderAgent((await ctx.store.getAgent(auth.workspace._id, agent._id))!);
      },
    );
  };
}
