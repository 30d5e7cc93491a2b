export { buildApp, type GatewayContext } from "./app.js";
