import { errors as natsErrors, type NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { ApiError, type Clock, type CommandReply, type ConnectionState, partitionOf, type RunCommand, Subjects } from "../src/index.js";
import { retryAfterSeconds } from "./unavailable.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Sends a command to the owner of the run's partition through NATS. No responder or
 * a "not owner" answer is retried with backoff for `retryMs`, then answered 503.
 * Commands are idempotent on their ids, so a resend after a timeout is safe.
 */
export class CommandRouter {
  constructor(
    private readonly nc: NatsConnection,
    private readonly partitions: number,
    private readonly retryMs: number,
    private readonly log: Logger,
    private readonly clock: Clock,
    private readonly requestTimeoutMs = 15_000,
    private readonly connection: ConnectionState = { connected: true },
  ) {}

  async send(cmd: RunCommand): Promise<Extract<CommandReply, { ok: true }>> {
    const subject = Subjects.command(partitionOf(cmd.run_id, this.partitions));
    const payload = encoder.encode(JSON.stringify(cmd));
    const deadline = this.clock.nowMs() + this.retryMs;
    let delayMs = 25;
    for (let attempt = 0; attempt < 200; attempt++) {
      if (!this.connection.connected) {
        // NATS is down: wait for the reconnect within the retry budget, never for a request timeout.
        if (this.clock.nowMs() + delayMs > deadline) break;
        await this.clock.sleep(delayMs);
        delayMs = Math.min(500, delayMs * 2);
        continue;
      }
      let reply: CommandReply | undefined;
      try {
        const msg = await this.nc.request(subject, payload, { timeout: this.requestTimeoutMs });
        reply = JSON.parse(decoder.decode(msg.data)) as CommandReply;
      } catch (err) {
        const retryable = err instanceof natsErrors.NoRespondersError || (err instanceof natsErrors.RequestError && err.isNoResponders());
        if (!retryable) {
          this.log.warn({ err: String(err), subject, op: cmd.op }, "command request failed");
          throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
        }
      }
      if (reply && reply.ok) return reply;
      if (reply && "code" in reply && reply.code === "runtime_unavailable") {
        throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
      }
      if (reply && "code" in reply) {
        throw new ApiError(reply.code, { message: reply.message, param: reply.param ?? null });
      }
      if (this.clock.nowMs() + delayMs > deadline) break;
      await this.clock.sleep(delayMs);
      delayMs = Math.min(500, delayMs * 2);
    }
    this.log.warn({ subject, op: cmd.op, run_id: cmd.run_id }, "no owner answered for the run's partition");
    throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
  }
}
