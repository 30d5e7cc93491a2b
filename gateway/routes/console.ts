import type { FastifyInstance } from "fastify";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { ApiError } from "../../src/index.js";
import { type Operation, route } from "../operation.js";
import { pagePolicy, withPageHeaders } from "../web-page.js";

/** The routes of this file, declared once: registration and the OpenAPI document come from these. */
export const CONSOLE_OPERATIONS = {
  getConsole: {
    method: "get",
    path: "/",
    operationId: "getConsole",
    summary: "The web console (a page for people; it uses only this API)",
    tag: "console",
    scope: "public",
    errors: { 400: ["invalid_request"] },
    success: { 200: { description: "An HTML page; the API key is given in the page and kept in the tab's sessionStorage.", text: "text/html" } },
  },
  getConsoleAsset: {
    method: "get",
    path: "/console/{asset}",
    operationId: "getConsoleAsset",
    summary: "The console's script or style sheet",
    tag: "console",
    scope: "public",
    params: z.object({ asset: z.string().describe("app.js or app.css.") }),
    errors: { 400: ["invalid_request"], 404: ["not_found"] },
    success: { 200: { description: "The file (JavaScript or CSS).", text: "text/javascript" } },
  },
} satisfies Record<string, Operation>;

/** Only what the console loads from here; no inline script or style, no other origin. */
const CONSOLE_CSP = pagePolicy({ inlineStyles: false });

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>runs console</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/console/app.css">
</head>
<body>
<div id="console"></div>
<script type="module" src="/console/app.js"></script>
</body>
</html>
`;

const SOURCES = fileURLToPath(new URL("../../console/", import.meta.url));

interface Asset {
  type: string;
  body: string;
}

/**
 * The console's bundle, built by esbuild in memory on first request (tens of ms) and kept
 * for the life of the process: a fresh clone needs no build step, and a service that never
 * serves the console never builds it.
 */
function assetBuilder(): (name: string) => Promise<Asset | undefined> {
  let built: Promise<Map<string, Asset>> | undefined;
  const build = async () => {
    const { build: esbuild } = await import("esbuild");
    const result = await esbuild({
      entryPoints: [`${SOURCES}main.tsx`],
      bundle: true,
      write: false,
      format: "esm",
      target: "es2022",
      minify: true,
      jsx: "automatic",
      jsxImportSource: "preact",
      logLevel: "silent",
    });
    const assets = new Map<string, Asset>();
    assets.set("app.js", { type: "text/javascript; charset=utf-8", body: result.outputFiles[0]!.text });
    assets.set("app.css", { type: "text/css; charset=utf-8", body: await readFile(`${SOURCES}style.css`, "utf8") });
    return assets;
  };
  return async (name) => {
    // A failed build is not kept: the next request tries again (and answers 500 meanwhile).
    built ??= build().catch((err) => {
      built = undefined;
      throw err;
    });
    return (await built).get(name);
  };
}

/** `GET /`: the web console (README "Console"). */
export function consoleRoutes() {
  return async function (app: FastifyInstance) {
    route(app, CONSOLE_OPERATIONS.getConsole, async (_request, reply) => withPageHeaders(reply, CONSOLE_CSP).header("cache-control", "no-cache").type("text/html; charset=utf-8").send(PAGE));

    const asset = assetBuilder();
    route(app, CONSOLE_OPERATIONS.getConsoleAsset, async (request, reply) => {
      const found = await asset(request.params.asset);
      if (!found) throw new ApiError("not_found", { message: `No console asset ${request.params.asset}.` });
      return withPageHeaders(reply, CONSOLE_CSP).header("cache-control", "no-cache").type(found.type).send(found.body);
    });
  };
}
