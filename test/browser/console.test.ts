import anyTest, { type ExecutionContext, type TestFn } from "ava";
import type { Page } from "playwright-core";
import { type Api, newWorkspace, startTestServers, startTestService, type TestServers } from "../helpers/servers.js";
import type { RunningService } from "../../node/service.js";
import { artifactPath, browserMissing, launchBrowser } from "../helpers/browser.js";
import { bashThen, gatedBashConfig } from "../helpers/agent-configs.js";

/** The web console in a real Chromium, against a real service: what a person does with it. */
type Ctx = { servers: TestServers; service: RunningService; key: string; api: Api; echo: string; sleeper: string; gated: string };
const test = anyTest as TestFn<Ctx>;
const missing = browserMissing();

test.before(async (t) => {
  if (missing) return;
  const servers = await startTestServers();
  const service = await startTestService(servers, { RUNS_ACTIVE_TURNS_BUSINESS: "1000" });
  const ws = await newWorkspace(service, "business");
  const echo = await ws.api.agentWith({ model: "faux/scripted" }, "echo");
  const sleeper = await ws.api.agentWith({ model: "faux/scripted", tools: ["bash"], script: [{ tool_call: { name: "bash", arguments: { command: "sleep 60" } } }, { text: "woke" }] }, "sleeper");
  // Its bash call waits for a person (config.approval), then it answers.
  const gated = await ws.api.agentWith(gatedBashConfig(bashThen("echo from the console", "approved in the console")), "gated");
  t.context = { servers, service, key: ws.key, api: ws.api, echo, sleeper, gated };
});

test.after.always(async (t) => {
  await t.context.service?.close();
  await t.context.servers?.stop();
});

/**
 * A page of the console with the key given. `clean()` asserts what must hold all along: no
 * script error, the key never in a URL, nothing from another origin.
 */
async function openConsole(t: ExecutionContext<Ctx>): Promise<{ page: Page; clean: () => void }> {
  const { context, stop } = await launchBrowser();
  t.teardown(stop);
  const page = await context.newPage();
  const problems: string[] = [];
  page.on("pageerror", (err) => problems.push(String(err)));
  page.on("request", (request) => {
    if (request.url().includes(t.context.key)) problems.push(`the key is in a URL: ${request.url()}`);
    if (!request.url().startsWith(t.context.service.url!)) problems.push(`another origin: ${request.url()}`);
  });
  const answer = await page.goto(`${t.context.service.url}/`);
  t.is(answer?.status(), 200);
  t.regex(answer?.headers()["content-security-policy"] ?? "", /script-src 'self'/);
  await page.fill("input[name=key]", t.context.key);
  await page.click("text=Use key");
  await page.waitForSelector("[data-testid=runs-table]");
  return { page, clean: () => t.deepEqual(problems, [], "no script error, no key in a URL, nothing from another origin") };
}

if (missing) {
  test(`console - skipped: ${missing}`, (t) => {
    t.log(missing);
    t.pass();
  });
} else {
  test.serial("console - start a run from the form, watch its events arrive live, and find them again after a reload", async (t) => {
    t.timeout(90_000);
    const { page, clean } = await openConsole(t);
    await page.click("text=Start");
    await page.selectOption("select[name=agent]", t.context.echo);
    await page.fill("textarea[name=input]", "hello from the console");
    await page.click("button:has-text('Send')");
    await page.waitForSelector("[data-testid=run-view]");
    const runId = /#\/runs\/(run_\w+)/.exec(page.url())?.[1];
    t.truthy(runId, page.url());
    await page.waitForSelector("[data-testid=timeline] li[data-type='turn.completed']", { timeout: 30_000 });
    t.is(await page.textContent("[data-testid=event-text]"), "hello from the console");
    await page.waitForSelector("[data-testid=turn-status]:has-text('completed')");
    t.is((await page.textContent("[data-testid=turn-output]"))?.trim(), "hello from the console");
    t.is(await page.textContent("[data-testid=history-status]"), "history: complete");
    t.is(await page.textContent("[data-testid=live-state]"), "live");
    const types = await page.$$eval("[data-testid=timeline] li.platform", (items) => items.map((i) => i.getAttribute("data-type")));
    t.deepEqual(types, ["run.created", "turn.queued", "turn.started", "turn.completed"].filter((type) => types.includes(type)));
    t.true(types.includes("turn.started") && types.at(-1) === "turn.completed", types.join(","));

    // A reload keeps the key (this tab's sessionStorage) and the run's events, and resumes the stream.
    await page.reload();
    await page.waitForSelector("[data-testid=timeline] li[data-type='turn.completed']");
    t.is(await page.locator("[data-testid=timeline] li[data-type='turn.completed']").count(), 1, "no event shown twice");
    t.is(await page.textContent("[data-testid=live-state]"), "live");
    // A continuation sent through the API arrives in the open page.
    const continued = await t.context.api.post("/api/v1/runs", { run_id: runId, input: "and again" });
    t.is(continued.status, 200);
    await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=event-text]")].some((e) => e.textContent === "and again"), undefined, { timeout: 20_000 });
    await page.screenshot({ path: await artifactPath("console-run.png"), fullPage: true });
    clean();
  });

  test.serial("console - cancel a long turn: the answer says cancelling, then the turn shows cancelled", async (t) => {
    t.timeout(90_000);
    const started = await t.context.api.post("/api/v1/runs", { agent: t.context.sleeper, input: "nap", background: true });
    t.is(started.status, 202);
    const { page, clean } = await openConsole(t);
    await page.goto(`${t.context.service.url}/#/runs/${started.body.id}`);
    await page.waitForSelector("[data-testid=timeline] li[data-type='turn.started']", { timeout: 30_000 });
    await page.click("text=Cancel turn");
    await page.waitForSelector("[data-testid=outcome]:has-text('cancel: 202 cancelling')");
    await page.waitForSelector("[data-testid=turn-status]:has-text('cancelled')", { timeout: 30_000 });
    const types = await page.$$eval("[data-testid=timeline] li.platform", (items) => items.map((i) => i.getAttribute("data-type")));
    t.true(types.indexOf("turn.cancelling") >= 0 && types.indexOf("turn.cancelling") < types.indexOf("turn.cancelled"), types.join(","));
    // The run's state comes with its own event, after the turn's: waited for, not read at once.
    await page.waitForSelector("[data-testid=run-state]:has-text('idle')", { timeout: 10_000 }).catch(() => undefined);
    t.is(await page.textContent("[data-testid=run-state]"), "idle");
    clean();
  });

  test.serial("console - a tool call waiting for approval: shown with its arguments and expiry; a refused decision shows the API's error; Approve runs it and the turn completes", async (t) => {
    t.timeout(90_000);
    const { api, gated, service } = t.context;
    const started = await api.post("/api/v1/runs", { agent: gated, input: "go", background: true });
    t.is(started.status, 202);
    const runId: string = started.body.id;
    const action = (await api.waitRun(runId, (r) => r.turn?.pending_action != null)).turn.pending_action;
    const { page, clean } = await openConsole(t);
    await page.goto(`${service.url}/#/runs/${runId}`);
    await page.waitForSelector(`[data-testid=pending-action][data-action-id='${action.id}']`, { timeout: 30_000 });
    t.is(await page.textContent("[data-testid=pending-tool]"), "bash");
    t.deepEqual(JSON.parse((await page.textContent("[data-testid=pending-arguments]")) ?? ""), { command: "echo from the console" });
    t.is(await page.textContent("[data-testid=pending-expires]"), await page.evaluate((s) => new Date(s * 1000).toLocaleString(), action.expires_at));
    t.regex((await page.textContent("[data-testid=turn-waiting]")) ?? "", /waiting for approval of bash/);
    t.is(await page.textContent("[data-testid=turn-status]"), "in_progress");
    // The live events say what was asked, and the tool call waits.
    const requested = await page.waitForSelector(`[data-testid=timeline] li[data-type='tool.approval_requested'][data-action-id='${action.id}']`);
    t.regex((await requested.textContent()) ?? "", /approval requested: tool bash, waiting for a person until .+"command": "echo from the console"/s);
    t.regex((await page.textContent("[data-testid=timeline] li.tool summary")) ?? "", /tool bash waiting for approval…/);
    await page.screenshot({ path: await artifactPath("console-approval.png"), fullPage: true });
    // The runs list says it waits, and its filter finds it.
    await page.goto(`${service.url}/#/runs`);
    await page.check("input[name=pending_action]");
    await page.click("form.filters button[type=submit]");
    // The table shows the filtered page (the unfiltered one stays in view until it arrives).
    await page.waitForSelector("[data-testid=runs-table][data-query*='pending_action=true'][aria-busy=false]", { timeout: 30_000 });
    await page.waitForSelector(`[data-testid=runs-table] tr[data-run-id='${runId}'] [data-testid=run-waiting]`, { timeout: 30_000 });
    t.regex((await page.textContent(`[data-testid=runs-table] tr[data-run-id='${runId}']`)) ?? "", /waiting for approval of bash/);
    t.false((await page.$$eval("[data-testid=runs-table] tr[data-run-id]", (rows) => rows.map((r) => r.textContent ?? ""))).some((text) => !text.includes("waiting for approval")), "only waiting runs are listed");
    await page.goto(`${service.url}/#/runs/${runId}`);
    await page.waitForSelector(`[data-testid=pending-action][data-action-id='${action.id}']`, { timeout: 30_000 });

    // A decision the API refuses (a reason over 2000 characters) shows its code and message; the call still waits.
    await page.fill("[data-testid=pending-action] input[name=reason]", "x".repeat(2001));
    await page.click("[data-testid=pending-action] button.approve");
    const refused = await page.waitForSelector("[data-testid=decision-error]");
    t.regex((await refused.textContent()) ?? "", /invalid_request \(400, reason\): .*2000/);
    t.is(await page.locator(`[data-testid=pending-action][data-action-id='${action.id}']`).count(), 1);
    t.is((await api.get(`/api/v1/runs/${runId}`)).body.turn.pending_action.id, action.id, "nothing was decided");

    await page.fill("[data-testid=pending-action] input[name=reason]", "fine by me");
    await page.click("[data-testid=pending-action] button.approve");
    await page.waitForSelector(`[data-testid=outcome]:has-text('approve: 200 approved bash (${action.id})')`);
    t.is(await page.locator("[data-testid=decision-error]").count(), 0, "the earlier refusal is cleared");
    await page.waitForSelector("[data-testid=pending-action]", { state: "detached" });
    await page.waitForSelector("[data-testid=turn-status]:has-text('completed')", { timeout: 30_000 });
    t.is((await page.textContent("[data-testid=turn-output]"))?.trim(), "approved in the console");
    const decided = await page.waitForSelector(`[data-testid=timeline] li[data-type='tool.approval_decided'][data-decision='approve']`);
    t.regex((await decided.textContent()) ?? "", /approved by a person: fine by me/);
    t.regex((await page.textContent("[data-testid=timeline] li.tool summary")) ?? "", /tool bash done \(approved\)/);
    t.is(await page.locator("[data-testid=api-error]").count(), 0);
    // The service agrees: decided once, by a person, with the reason.
    const events = (await api.get(`/api/v1/runs/${runId}/events?limit=1000`)).body.data;
    t.deepEqual(
      events.filter((e: any) => e.type === "tool.approval_decided").map((e: any) => [e.data.action_id, e.data.decision, e.data.decided_by, e.data.reason]),
      [[action.id, "approve", "person", "fine by me"]],
    );
    clean();
  });

  test.serial("console - filter the list by a tag; edit a run's tags", async (t) => {
    t.timeout(60_000);
    const blue = await t.context.api.post("/api/v1/runs", { agent: t.context.echo, input: "b", tags: ["blue"] });
    const red = await t.context.api.post("/api/v1/runs", { agent: t.context.echo, input: "r", tags: ["red"] });
    const { page, clean } = await openConsole(t);
    await page.waitForSelector(`tr[data-run-id='${red.body.id}']`);
    await page.fill("input[name=tags]", "blue");
    await page.click("button:has-text('Filter')");
    await page.waitForSelector(`tr[data-run-id='${red.body.id}']`, { state: "detached" });
    const rows = await page.$$eval("[data-testid=runs-table] tbody tr", (trs) => trs.map((tr) => tr.getAttribute("data-run-id")));
    t.deepEqual(rows, [blue.body.id]);

    await page.click(`a[href='#/runs/${blue.body.id}']`);
    await page.fill("input[name=tag]", "reviewed");
    await page.click("button:has-text('Add')");
    await page.waitForSelector("[data-testid=outcome]:has-text('tags now: blue, reviewed')");
    t.deepEqual((await t.context.api.get(`/api/v1/runs/${blue.body.id}`)).body.tags, ["blue", "reviewed"]);
    await page.click("button[title='remove blue']");
    await page.waitForSelector("[data-testid=outcome]:has-text('tags now: reviewed')");
    clean();
  });

  test.serial("console - an API error is shown as its message and code, never a blank page; the agents page lists deployments", async (t) => {
    t.timeout(60_000);
    const { page, clean } = await openConsole(t);
    await page.goto(`${t.context.service.url}/#/runs/run_doesnotexist00`);
    const error = await page.waitForSelector("[data-testid=api-error]");
    t.regex((await error.textContent()) ?? "", /run_not_found \(404, runId\): No such run\./);

    await page.goto(`${t.context.service.url}/#/agents`);
    await page.waitForSelector(`article[data-agent-id='${t.context.echo}']`);
    t.regex((await page.textContent(`article[data-agent-id='${t.context.echo}']`)) ?? "", /active version 1[\s\S]*1 \(active\)\s*ready/);

    // A continuation refused by the API shows the refusal.
    await page.goto(`${t.context.service.url}/#/start`);
    await page.fill("input[name=run_id]", "run_doesnotexist00");
    await page.fill("textarea[name=input]", "x");
    await page.click("button:has-text('Send')");
    t.regex((await (await page.waitForSelector("[data-testid=api-error]")).textContent()) ?? "", /run_not_found \(404, run_id\)/);

    // Forgetting the key leaves nothing behind in the tab.
    await page.click("text=Forget key");
    t.is(await page.evaluate(() => sessionStorage.getItem("runs.console.key")), null);
    t.is(await page.evaluate(() => localStorage.length), 0, "nothing in localStorage");
    clean();
  });

  test.serial("console - the usage page shows this month by day and the budget; a run and its turns show their usage", async (t) => {
    t.timeout(60_000);
    const counting = await t.context.api.agentWith({ model: "faux/scripted", tools: [], script: [{ text: "counted", usage: { input: 40, output: 2, cache_read: 3 } }] }, "counting");
    const run = await t.context.api.post("/api/v1/runs", { agent: counting, input: "count" });
    t.is(run.body.turn.status, "completed");
    t.is((await t.context.api.request("PUT", "/api/v1/usage/budget", { body: { monthly_tokens: 40 } })).status, 200);
    const { page, clean } = await openConsole(t);
    await page.click("header >> text=Usage");
    await page.waitForSelector("[data-testid=usage-days]");
    t.is(await page.textContent("[data-testid=usage-total]"), "1 turns · 45 tokens (40 in, 2 out, 3 cache) · no price");
    const today = new Date().toISOString().slice(0, 10);
    t.deepEqual(await page.$$eval("[data-testid=usage-days] tbody tr", (rows) => rows.map((r) => [...r.querySelectorAll("td")].slice(0, 4).map((td) => td.textContent))), [[today, "1", "45", "no price"]]);
    t.regex((await page.textContent("[data-testid=budget]")) ?? "", /Budget this month: 45 of 40 tokens — spent \(tokens\): new turns are refused until \d{4}-\d{2}-01\./);
    await page.screenshot({ path: await artifactPath("console-usage.png") });

    await page.goto(`${t.context.service.url}/#/runs/${run.body.id}`);
    await page.waitForSelector("[data-testid=run-usage]");
    t.is(await page.textContent("[data-testid=run-usage]"), "usage: 45 tokens (40 in, 2 out, 3 cache) · no price");
    t.is(await page.textContent("[data-testid=turn-usage]"), " · 45 tokens (40 in, 2 out, 3 cache) · no price");
    // The spent budget's refusal is shown as the API's error.
    await page.goto(`${t.context.service.url}/#/start`);
    await page.selectOption("select[name=agent]", counting);
    await page.fill("textarea[name=input]", "one more");
    await page.click("button:has-text('Send')");
    t.regex((await (await page.waitForSelector("[data-testid=api-error]")).textContent()) ?? "", /quota_exceeded \(429\): The workspace's monthly budget of 40 tokens is spent/);
    await t.context.api.request("DELETE", "/api/v1/usage/budget");
    clean();
  });

  test.serial("console - abuse: a link whose run id names another API path (../environment-values/X?reveal=true) makes no request with the key outside a run's paths; the list is shown instead", async (t) => {
    t.timeout(60_000);
    await t.context.api.request("PUT", "/api/v1/environment-values/CONSOLE_SECRET", { body: { value: "not-for-links" } });
    const { page, clean } = await openConsole(t);
    const asked: string[] = [];
    page.on("request", (request) => asked.push(new URL(request.url()).pathname + new URL(request.url()).search));
    await page.goto(`${t.context.service.url}/#/runs/..%2Fenvironment-values%2FCONSOLE_SECRET%3Freveal%3Dtrue%26x%3D`);
    await page.waitForSelector("[data-testid=runs-table]");
    await page.waitForTimeout(3_500); // past a run view's 3 s poll
    t.deepEqual(asked.filter((url) => url.includes("environment-values")), []);
    t.false((await page.content()).includes("not-for-links"));
    clean();
  });
}
