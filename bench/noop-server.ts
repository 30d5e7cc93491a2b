/**
 * Baseline HTTP server in its own process, built like the gateway (Fastify 5, same
 * logger off, keep-alive): `GET /noop` answers `{}`; `GET /read/:id` answers the run
 * document read by `_id` through the MongoDB driver with the service's client options.
 * Configured by BENCH_MONGO_URI / BENCH_MONGO_DB; sends {ready, url} over IPC.
 */
import Fastify from "fastify";
import { MongoClient } from "mongodb";

const client = new MongoClient(process.env.BENCH_MONGO_URI!, { serverSelectionTimeoutMS: 3_000, connectTimeoutMS: 3_000, maxPoolSize: 50 });
await client.connect();
const runs = client.db(process.env.BENCH_MONGO_DB!).collection<{ _id: string }>("runs");

const app = Fastify({ logger: false });
app.get("/noop", async () => ({}));
app.get<{ Params: { id: string } }>("/read/:id", async (request, reply) => {
  const doc = await runs.findOne({ _id: request.params.id });
  if (!doc) return reply.status(404).send({});
  return doc;
});
await app.listen({ port: 0, host: "127.0.0.1" });
const address = app.server.address();
const port = typeof address === "object" && address ? address.port : 0;

process.on("disconnect", () => process.exit(1));
process.on("message", async (msg: { op: string }) => {
  if (msg.op === "stop") {
    await app.close();
    await client.close();
    process.exit(0);
  }
});
process.send!({ ready: true, url: `http://127.0.0.1:${port}` });
