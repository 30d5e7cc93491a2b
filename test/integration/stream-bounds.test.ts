import anyTest, { type TestFn } from "ava";
import { Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { eventStreamName } from "../../src/nats.js";
import { jetstreamManager } from "@nats-io/jetstream";
import { connectNats } from "../../src/nats.js";

/**
 * RUNS_EVENT_STREAM_MAX_BYTES bounds each event stream: once full, new events are
 * refused (never the oldest dropped), the turn that could not store them fails visibly,
 * and no request answers 5xx other than a retryable 503.
 */
const test = anyTest as TestFn<{ servers: TestServers; service: RunningService; api: Api; echo: string }>;

const MAX = 256 * 1024;

test.before(async (t) => {
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_EVENT_STREAM_MAX_BYTES: String(MAX) });
  const ws = await newWorkspace(service);
  const echo = await ws.api.agentWith({ model: "faux/scripted" });
  t.context = { servers, service, api: ws.api, echo };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

test("stream bounds - a full event stream refuses new events: old runs keep theirs, new turns fail event_stream_write_failed or are refused 503, never 500", async (t) => {
  t.timeout(120_000);
  const { servers, api, echo } = t.context;
  const nc = await connectNats({ url: servers.natsUrl, user: "runs", password: servers.servicePassword, name: "bounds" });
  const jsm = await jetstreamManager(nc);
  const info = await jsm.streams.info(eventStreamName("solo"));
  t.is(info.config.max_bytes, MAX);
  t.is(info.config.discard, "new");
  const first = await api.post("/api/v1/runs", { agent: echo, input: "the first run" });
  t.is(first.body.turn.status, "completed");
  const firstEvents = (await api.get(`/api/v1/runs/${first.body.id}/events`)).body.data.length;
  const outcomes = new Map<string, number>();
  for (let i = 0; i < 8; i++) {
    const res = await api.post("/api/v1/runs", { agent: echo, input: "x".repeat(40_000) });
    const outcome = res.status === 200 ? `200/${res.body.turn.status}/${res.body.turn.error?.code ?? ""}` : `${res.status}/${res.body.error?.code}`;
    outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    t.true(res.status < 500 || res.status === 503, outcome);
  }
  t.log(JSON.stringify([...outcomes]));
  t.true([...outcomes.keys()].some((o) => /event_stream_write_failed|503/.test(o)), "the bound was reached");
  // The first run's events are all still there: nothing was dropped to make room.
  t.is((await api.get(`/api/v1/runs/${first.body.id}/events`)).body.data.length, firstEvents);
  t.true((await jsm.streams.info(eventStreamName("solo"))).state.bytes <= MAX);
  await nc.close();
});
