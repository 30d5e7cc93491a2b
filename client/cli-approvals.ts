/**
 * `runs approve` and `runs deny`: a person's decision on the tool call a turn waits for
 * (the deployment's `config.approval` gates it; `runs get RUN_ID` shows it as the turn's
 * pending action). approve runs the call; deny gives the model the tool's error with the reason.
 */
import { exactly, parseArgs, str, UsageError, type Parsed } from "./cli-args.js";
import { actionLine } from "./cli-output.js";
import type { RunsClient } from "./client.js";
import type { ActionDecision } from "./types.js";

interface Out {
  json(p: Parsed): boolean;
  line(text: string): void;
  document(value: unknown): void;
}

export async function decideAction(client: () => RunsClient, decision: ActionDecision, args: string[], out: Out): Promise<number> {
  const p = parseArgs(args, { reason: "string", "idempotency-key": "string" });
  const [runId, actionId] = p.positionals;
  if (!runId) throw new UsageError("RUN_ID is required");
  if (!actionId) throw new UsageError(`ACTION_ID is required (act_…: runs get ${runId} shows the action the turn waits for)`);
  exactly(p, 2, "");
  const reason = str(p, "reason");
  const action = await client().decideAction(runId, actionId, reason === undefined ? { decision } : { decision, reason }, { idempotencyKey: str(p, "idempotency-key") });
  out.json(p) ? out.document(action) : out.line(actionLine(action));
  return 0;
}
