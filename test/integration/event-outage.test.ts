import test from "ava";
import { newWorkspace, restartNats, startTestServers, startTestService } from "../helpers/servers.js";
import { MAX_PUBLISH_SPAN_MS } from "../../src/js-publisher.js";

/**
 * NATS away for longer than the event publisher retries (20 s) while a turn streams its
 * text: the fault probe of 2026-11-28 found the run then answered every later command 503
 * with the first lost event ("Event 10 could not be stored") for as long as its actor
 * lived, and the turn's stream ended every 10 s with event_history_unavailable.
 */
test("event outage - NATS away past the publisher's retries mid-turn: the turn fails event_stream_write_failed with its output kept, its final event is stored once NATS is back (its stream ends with it), and the run takes new turns whose events are whole", async (t) => {
  t.timeout(150_000);
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_ROUTE_RETRY_MS: "1500" });
  try {
    const { api } = await newWorkspace(service);
    const agent = await api.agentWith({ model: "faux/scripted", tokens_per_second: 3 });
    // ~100 tokens at 3 a second: the turn streams for ~33 s, through the outage and after it.
    const text = "word ".repeat(80).trim();
    const start = await api.post("/api/v1/runs", { agent, input: text, background: true });
    t.is(start.status, 202, JSON.stringify(start.body));
    const runId: string = start.body.id;
    const turnId: string = start.body.turn.id;
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const port = servers.nats.port;
    await servers.nats.stop();
    // Past the publisher's retry budget (MAX_PUBLISH_SPAN_MS less the last ack's wait).
    await new Promise((resolve) => setTimeout(resolve, MAX_PUBLISH_SPAN_MS - 1_000));
    await restartNats(servers, port);

    const first = (await api.waitTurn(runId, turnId, 60_000)).turn;
    t.is(first.status, "failed");
    t.is(first.error.code, "event_stream_write_failed");
    t.true(first.error.retryable);
    t.deepEqual(first.output, [{ type: "output_text", text }], "the result is kept");

    const firstEvents = await api.get(`/api/v1/runs/${runId}/events?turn_id=${turnId}&limit=1000`);
    t.is(firstEvents.status, 200, JSON.stringify(firstEvents.body));
    const types: string[] = firstEvents.body.data.map((e: { type: string }) => e.type);
    t.is(types[0], "turn.started");
    t.is(types.at(-1), "turn.failed", "the final event is stored once NATS answers");
    t.true(types.filter((type) => type === "text_delta").length < 100, "some of the turn's events are lost, as its error says");

    // The turn's stream ends with its final event (it had ended with event: error every 10 s).
    const stream = await fetch(`${api.baseUrl}/api/v1/runs/${runId}/events?turn_id=${turnId}&stream=true`, {
      headers: { authorization: `Bearer ${api.key}` },
      signal: AbortSignal.timeout(20_000),
    });
    t.is(stream.status, 200);
    const frames = await stream.text();
    t.regex(frames, /event: turn\.failed\n/);
    t.notRegex(frames, /event: error\n/);

    // The run takes new turns, on the same node and actor, and their events are whole.
    let next: Awaited<ReturnType<typeof api.post>> | undefined;
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      next = await api.post("/api/v1/runs", { run_id: runId, input: "after the outage" });
      if (next.status !== 503) break;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
    t.is(next!.status, 200, JSON.stringify(next!.body));
    t.is(next!.body.turn.status, "completed");
    const nextEvents = await api.get(`/api/v1/runs/${runId}/events?turn_id=${next!.body.turn.id}&limit=1000`);
    t.is(nextEvents.body.history.status, "complete");
    const sequences: number[] = nextEvents.body.data.map((e: { sequence: number }) => e.sequence);
    t.deepEqual(sequences, sequences.map((_, i) => sequences[0]! + i), "no gap in the new turn's events");
    t.is(nextEvents.body.data[0].type, "turn.started");
    t.is(nextEvents.body.data.at(-1).type, "turn.completed");
    t.true(sequences[0]! > firstEvents.body.data.at(-1).sequence, "numbered after the failed turn's");
  } finally {
    await service.close();
    await servers.stop();
  }
});
