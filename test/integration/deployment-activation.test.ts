import anyTest, { type TestFn } from "ava";
import pino from "pino";
import { newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { DeploymentBuilder } from "../../actors/deployment-builder.js";
import { activateVersion, DeploymentStatus, type DeploymentDoc, type MongoStore, systemClock } from "../../src/index.js";

/**
 * decisions §3: "A deployment activated while building becomes active when ready." The
 * activate route and the build's end are written by different nodes; every interleaving
 * of their store calls, on the real store, must leave the version active and ready.
 */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService }>;

test.before(async (t) => {
  const servers = await startTestServers();
  t.context = { servers, service: await startTestService(servers) };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

type Side = "B" | "R";

/**
 * Runs two sequential actors' store calls one at a time in the order `schedule` names
 * (B: the build, R: the route); once one side is done, the other goes on alone.
 */
function interleaving(schedule: string) {
  let position = 0;
  const done: Record<Side, boolean> = { B: false, R: false };
  const waiters: Array<() => void> = [];
  const wake = () => {
    for (const waiter of waiters.splice(0)) waiter();
  };
  const mayGo = (side: Side) => position >= schedule.length || schedule[position] === side || done[side === "B" ? "R" : "B"];
  return {
    store(store: MongoStore, side: Side): MongoStore {
      return new Proxy(store, {
        get(target, property, receiver) {
          const value = Reflect.get(target, property, receiver);
          if (typeof value !== "function") return value;
          return async (...args: unknown[]) => {
            for (let i = 0; i < 1_000 && !mayGo(side); i++) await new Promise<void>((resolve) => waiters.push(resolve));
            try {
              return await value.apply(target, args);
            } finally {
              position++;
              wake();
            }
          };
        },
      });
    },
    async run(side: Side, work: () => Promise<void>): Promise<void> {
      try {
        await work();
      } finally {
        done[side] = true;
        wake();
      }
    },
  };
}

/** Every way to place `r` R's among `b` B's. */
function schedules(b: number, r: number): string[] {
  if (b === 0) return ["R".repeat(r)];
  if (r === 0) return ["B".repeat(b)];
  return [...schedules(b - 1, r).map((s) => `B${s}`), ...schedules(b, r - 1).map((s) => `R${s}`)];
}

test("deployments - a version activated while it builds becomes active when ready, whichever order the activation's and the build's store calls land in (every interleaving)", async (t) => {
  t.timeout(180_000);
  const { service } = t.context;
  const store = service.store;
  const ws = await newWorkspace(service);
  const agentId = await ws.api.agentWith({ model: "faux/scripted" });
  const quiet = pino({ level: "silent" });
  // The build makes at most 4 store calls, the route at most 3.
  const all = schedules(4, 3);
  t.is(all.length, 35);
  for (const schedule of all) {
    const building: DeploymentDoc = await store.insertDeployment({
      workspace_id: ws.id, agent_id: agentId, status: DeploymentStatus.building, upgrade_policy: "pinned" as DeploymentDoc["upgrade_policy"],
      config: { model: "faux/scripted" } as DeploymentDoc["config"], activate: false, error: null, created_at: Date.now(), ready_at: null,
    });
    const order = interleaving(schedule);
    const builder = new DeploymentBuilder(order.store(store, "B"), systemClock, quiet);
    await Promise.all([
      order.run("B", () => builder.build(building)),
      order.run("R", () => activateVersion(order.store(store, "R"), building)),
    ]);
    const after = await store.getDeployment(agentId, building.version);
    t.is(after?.status, DeploymentStatus.ready, schedule);
    const agent = (await ws.api.get(`/api/v1/agents/${agentId}`)).body;
    t.is(agent.active_version, building.version, `schedule ${schedule}: the activation was lost`);
  }
});
