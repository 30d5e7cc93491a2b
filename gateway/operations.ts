/** Every route the gateway serves, in the order of the OpenAPI document: each declared once in its route file. */
import type { Operation } from "./operation.js";
import { ACTION_OPERATIONS } from "./routes/actions.js";
import { AGENT_OPERATIONS } from "./routes/agents.js";
import { CONSOLE_OPERATIONS } from "./routes/console.js";
import { API_KEY_OPERATIONS } from "./routes/api-keys.js";
import { ENV_VALUE_OPERATIONS } from "./routes/env-values.js";
import { EVENT_OPERATIONS } from "./routes/events.js";
import { FILE_OPERATIONS } from "./routes/files.js";
import { HEALTH_OPERATIONS } from "./routes/health.js";
import { OPENAPI_OPERATIONS } from "./routes/openapi.js";
import { RUN_OPERATIONS } from "./routes/runs.js";
import { TAG_OPERATIONS } from "./routes/tags.js";
import { TURN_OPERATIONS } from "./routes/turns.js";
import { USAGE_OPERATIONS } from "./routes/usage.js";
import { WEBHOOK_OPERATIONS } from "./routes/webhooks.js";

export const OPERATIONS: Operation[] = [
  RUN_OPERATIONS,
  TAG_OPERATIONS,
  ACTION_OPERATIONS,
  TURN_OPERATIONS,
  EVENT_OPERATIONS,
  AGENT_OPERATIONS,
  API_KEY_OPERATIONS,
  FILE_OPERATIONS,
  ENV_VALUE_OPERATIONS,
  USAGE_OPERATIONS,
  WEBHOOK_OPERATIONS,
  OPENAPI_OPERATIONS,
  HEALTH_OPERATIONS,
  CONSOLE_OPERATIONS,
].flatMap((declared) => Object.values(declared));
