import { errors as natsErrors, type NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { ApiError, COMMAND_ANSWER_WITHIN_MS, randomBase62, type Clock, type CommandReply, type ConnectionState, partitionOf, type RunCommand, Subjects, within } from "../src/index.js";
import { retryAfterSeconds } from "./unavailable.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** How long one attempt waits for the owner's reply before the command is resent. */
export const COMMAND_ATTEMPT_TIMEOUT_MS = 2_000;

export interface RouterOptions {
  nc: NatsConnection;
  partitions: number;
  /** How long no owner, or one in doubt, is asked again before the answer is 503. */
  retryMs: number;
  log: Logger;
  clock: Clock;
  /** The bound on a command's answer (503 past it). */
  answerWithinMs?: number;
  connection?: ConnectionState;
  /** How long one attempt through NATS waits for the reply before the command is resent. */
  attemptTimeoutMs?: number;
  /** This node's actor host, where it runs one: a command (as JSON) for a partition it serves is answered there, not through NATS. */
  here?: (runId: string, command: string) => Promise<CommandReply> | undefined;
}

/**
 * Sends a command to the owner of the run's partition: this node's own actor host when it
 * serves the partition (in process, as the JSON it would send), else through NATS, in
 * both cases refused with 413 when larger than the NATS servers take. No responder, a
 * "not owner" answer or an "in doubt" one (the owner's lease unconfirmed for a moment;
 * the command did not run) is retried with backoff for `retryMs`, then answered 503.
 * A reply that does not come within `attemptTimeoutMs` (lost with a NATS server, or
 * the owner slow) is asked for again by resending the command under the same
 * `command_id`: the owner answers a resend as the first (joining it while it runs),
 * so it runs once; after `answerWithinMs` without a reply the answer is 503.
 */
export class CommandRouter {
  private readonly nc: NatsConnection;
  private readonly partitions: number;
  private readonly retryMs: number;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly answerWithinMs: number;
  private readonly connection: ConnectionState;
  private readonly attemptTimeoutMs: number;
  private readonly here: RouterOptions["here"];

  constructor(options: RouterOptions) {
    this.nc = options.nc;
    this.partitions = options.partitions;
    this.retryMs = options.retryMs;
    this.log = options.log;
    this.clock = options.clock;
    this.here = options.here;
    this.answerWithinMs = options.answerWithinMs ?? COMMAND_ANSWER_WITHIN_MS;
    this.connection = options.connection ?? { connected: true };
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? COMMAND_ATTEMPT_TIMEOUT_MS;
  }

  async send(cmd: RunCommand): Promise<Extract<CommandReply, { ok: true }>> {
    const subject = Subjects.command(partitionOf(cmd.run_id, this.partitions));
    const commandId = cmd.command_id ?? randomBase62(16);
    // Measured against the NATS servers' limit whichever way it goes, so a command is
    // refused alike on every node, not only on those that hand it to another.
    const payload = JSON.stringify({ ...cmd, command_id: commandId });
    const maxPayload = this.nc.info?.max_payload;
    if (maxPayload !== undefined && payload.length > maxPayload / 3 && Buffer.byteLength(payload) > maxPayload) {
      this.log.warn({ op: cmd.op, run_id: cmd.run_id, bytes: Buffer.byteLength(payload), max_payload: maxPayload }, "a command over the NATS servers' max_payload was refused: raise it (nats.conf)");
      throw new ApiError("payload_too_large", { message: "The request is larger than the service can hand to the run; send less input in one turn.", param: "input" });
    }
    const startedMs = this.clock.nowMs();
    const deadline = startedMs + this.retryMs;
    let delayMs = 25;
    let resends = 0;
    let inDoubt = false;
    for (let attempt = 0; attempt < 200; attempt++) {
      if (!this.connection.connected) {
        // NATS is down: wait for the reconnect within the retry budget, never for a request timeout.
        if (this.clock.nowMs() + delayMs > deadline) break;
        await this.clock.sleep(delayMs);
        delayMs = Math.min(500, delayMs * 2);
        continue;
      }
      const reply = await this.ask(cmd, payload, subject, startedMs + this.answerWithinMs - this.clock.nowMs());
      if (reply === NO_REPLY || reply === OUT_OF_TIME) {
        if (reply === OUT_OF_TIME || this.clock.nowMs() - startedMs >= this.answerWithinMs) {
          this.log.warn({ subject, op: cmd.op, run_id: cmd.run_id, command_id: commandId, resends }, "no reply to the command in time");
          throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
        }
        resends++;
        this.log.info({ subject, op: cmd.op, run_id: cmd.run_id, command_id: commandId, resends }, "the command's reply did not come: resending it");
        continue;
      }
      if (reply && reply.ok) return reply;
      if (reply && "code" in reply && reply.code === "runtime_unavailable") {
        throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
      }
      if (reply && "code" in reply) {
        throw new ApiError(reply.code, { message: reply.message, param: reply.param ?? null });
      }
      inDoubt = reply !== undefined && "in_doubt" in reply;
      if (this.clock.nowMs() + delayMs > deadline) break;
      await this.clock.sleep(delayMs);
      delayMs = Math.min(500, delayMs * 2);
    }
    this.log.warn(
      { subject, op: cmd.op, run_id: cmd.run_id },
      inDoubt ? "the owner's lease of the run's partition stayed in doubt" : "no owner answered for the run's partition",
    );
    throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
  }

  /**
   * One attempt: the reply of the partition's owner (this node's actor host when it serves
   * the partition, waited for up to `leftMs`; else through NATS, for one attempt's time),
   * NO_REPLY when none came in an attempt's time (resent), OUT_OF_TIME when this node's
   * host had none by the bound, undefined when no owner listens.
   */
  private async ask(cmd: RunCommand, payload: string, subject: string, leftMs: number): Promise<CommandReply | typeof NO_REPLY | typeof OUT_OF_TIME | undefined> {
    const servedHere = this.here?.(cmd.run_id, payload);
    // Waited for as long as the command may take: a resend would join the same work.
    if (servedHere) return within<CommandReply, typeof OUT_OF_TIME>(servedHere, Math.max(1, leftMs), this.clock, () => OUT_OF_TIME, { keepAlive: false });
    try {
      const msg = await this.nc.request(subject, encoder.encode(payload), { timeout: Math.max(1, Math.min(this.attemptTimeoutMs, leftMs)) });
      return JSON.parse(decoder.decode(msg.data)) as CommandReply;
    } catch (err) {
      if (isTimeout(err)) return NO_REPLY;
      const retryable = err instanceof natsErrors.NoRespondersError || (err instanceof natsErrors.RequestError && err.isNoResponders());
      if (!retryable) {
        this.log.warn({ err: String(err), subject, op: cmd.op }, "command request failed");
        throw new ApiError("runtime_unavailable", { retryAfterS: retryAfterSeconds() });
      }
      return undefined;
    }
  }
}

const NO_REPLY = Symbol("no reply");
const OUT_OF_TIME = Symbol("out of time");

/** A request that got no reply in time (not one refused for want of a responder). */
function isTimeout(err: unknown): boolean {
  if (err instanceof natsErrors.TimeoutError) return true;
  return err instanceof natsErrors.RequestError && err.cause instanceof natsErrors.TimeoutError;
}
