export { buildApp } from "./app.js";
export type { GatewayContext } from "./context.js";
