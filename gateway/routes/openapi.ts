import type { FastifyInstance } from "fastify";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { z } from "zod";
import { ApiError } from "../../src/index.js";
import { type Operation, route } from "../operation.js";
import { pagePolicy, withPageHeaders } from "../web-page.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const OPENAPI_OPERATIONS = {
  getOpenApiDocument: {
    method: "get",
    path: "/api/v1/openapi.json",
    operationId: "getOpenApiDocument",
    summary: "This document",
    tag: "operations",
    scope: "public",
    // Only the HTTP layer refuses these (gateway/app.ts answerClientError).
    errors: { 400: ["invalid_request"] },
    success: { 200: { description: "The OpenAPI 3.1 document.", json: "__openapi" } },
  },
  getApiReference: {
    method: "get",
    path: "/docs",
    operationId: "getApiReference",
    summary: "This document for people (Swagger UI, served from the package)",
    tag: "operations",
    scope: "public",
    errors: { 400: ["invalid_request"] },
    success: { 200: { description: "An HTML page that renders /api/v1/openapi.json.", text: "text/html" } },
  },
  getApiReferenceAsset: {
    method: "get",
    path: "/docs/assets/{asset}",
    operationId: "getApiReferenceAsset",
    summary: "A script or style sheet of the reference page",
    tag: "operations",
    scope: "public",
    params: z.object({ asset: z.string().describe("A file name of the page's assets.") }),
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
    success: { 200: { description: "The file (JavaScript or CSS).", text: "text/javascript" } },
  },
} satisfies Record<string, Operation>;

/**
 * The page runs only scripts it loads from here: Swagger UI's bundle and our initializer
 * (no inline script, nothing from another origin). Swagger UI sets style attributes, hence
 * 'unsafe-inline' for styles only.
 */
const DOCS_CSP = pagePolicy({ inlineStyles: true });

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Runs API reference</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
<div id="docs"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/init.js"></script>
</body>
</html>
`;

/** Renders the served document; "Try it out" calls this origin with the key given to Authorize (kept in memory only). */
const INIT = `window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({ url: "/api/v1/openapi.json", dom_id: "#docs", deepLinking: true, persistAuthorization: false, displayOperationId: true });
});
`;

interface Asset {
  type: string;
  body: string | Buffer;
}

/** Swagger UI's files from its package (swagger-ui-dist), read once when first asked for. */
function assetLoader(): (name: string) => Asset | undefined {
  const cache = new Map<string, Asset>();
  // A Map, not an object: a name such as "toString" must not find a property of Object.prototype.
  const files = new Map([
    ["swagger-ui.css", "text/css; charset=utf-8"],
    ["swagger-ui-bundle.js", "text/javascript; charset=utf-8"],
  ]);
  return (name) => {
    if (name === "init.js") return { type: "text/javascript; charset=utf-8", body: INIT };
    const type = files.get(name);
    if (!type) return undefined;
    let asset = cache.get(name);
    if (!asset) {
      const dir = path.dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"));
      asset = { type, body: readFileSync(path.join(dir, name)) };
      cache.set(name, asset);
    }
    return asset;
  };
}

/**
 * `GET /api/v1/openapi.json` (decisions §8): public. The document is built once by the
 * app (gateway/openapi.ts, from every route's declaration) and handed in as JSON.
 * `GET /docs` renders it for people.
 */
export function openapiRoutes(document: string) {
  return async function (app: FastifyInstance) {
    route(app, OPENAPI_OPERATIONS.getOpenApiDocument, async (_request, reply) => reply.type("application/json; charset=utf-8").send(document));

    route(app, OPENAPI_OPERATIONS.getApiReference, async (_request, reply) => withPageHeaders(reply, DOCS_CSP).type("text/html; charset=utf-8").send(PAGE));

    const asset = assetLoader();
    route(app, OPENAPI_OPERATIONS.getApiReferenceAsset, async (request, reply) => {
      const found = asset(request.params.asset);
      if (!found) throw new ApiError("not_found", { message: `No asset ${request.params.asset}.` });
      return withPageHeaders(reply, DOCS_CSP).header("cache-control", "public, max-age=3600").type(found.type).send(found.body);
    });
  };
}
