import anyTest, { type TestFn } from "ava";
import { startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { artifactPath, browserMissing, launchBrowser } from "../helpers/browser.js";
import { OPERATIONS } from "../../gateway/operations.js";

const test = anyTest as TestFn<{ servers: TestServers; service: RunningService }>;
const missing = browserMissing();

test.before(async (t) => {
  if (missing) return;
  const servers = await startTestServers();
  t.context = { servers, service: await startTestService(servers) };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

if (missing) {
  test(`docs page - skipped: ${missing}`, (t) => {
    t.log(missing);
    t.pass();
  });
} else {
  test("docs page - /docs renders every operation of the served document in Chromium, with nothing refused by its CSP", async (t) => {
    t.timeout(90_000);
    const { context, stop } = await launchBrowser();
    t.teardown(stop);
    const page = await context.newPage();
    const problems: string[] = [];
    page.on("console", (message) => {
      if (message.type() === "error") problems.push(message.text());
    });
    page.on("pageerror", (err) => problems.push(String(err)));
    const external: string[] = [];
    page.on("request", (request) => {
      if (!request.url().startsWith(t.context.service.url!)) external.push(request.url());
    });

    const answer = await page.goto(`${t.context.service.url}/docs`);
    t.is(answer?.status(), 200);
    t.regex(answer?.headers()["content-security-policy"] ?? "", /script-src 'self'/);
    await page.waitForSelector(".opblock", { timeout: 30_000 });
    const shown = await page.$$eval(".opblock .opblock-summary-operation-id", (nodes) => nodes.map((n) => n.textContent?.trim() ?? ""));
    t.deepEqual([...shown].sort(), OPERATIONS.map((op) => op.operationId).sort());
    t.true((await page.textContent(".info .title"))?.includes("Runs API") ?? false);
    // Swagger UI shows what it cannot use of a document in a box of its own: none here.
    t.is(await page.locator(".version-pragma, .errors-wrapper").count(), 0, await page.locator(".version-pragma, .errors-wrapper").allTextContents().then((x) => x.join(" | ")));
    await page.screenshot({ path: await artifactPath("docs.png"), fullPage: false });
    t.deepEqual(problems, [], "no script error or CSP refusal");
    t.deepEqual(external, [], "nothing loaded from another origin");
  });
}
