export { buildApp } from "./app.js";
export type { GatewayContext } from "./context.js";
export { renderBudget } from "./routes/usage.js";
