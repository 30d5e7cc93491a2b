/**
 * The web console: a person's view of the public API. The key stays in this tab's
 * sessionStorage and goes out only as the Authorization header; routes live in the
 * URL's fragment (never sent to the server).
 */
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiFailure, call, type Report, storedKey, storeKey } from "./api.js";
import { RunsList, RunView } from "./runs.js";
import { UsagePage } from "./usage.js";
import type { Agent, Deployment, List, Run } from "./types.js";

function useRoute(): string {
  const [hash, setHash] = useState(location.hash || "#/runs");
  useEffect(() => {
    const onChange = () => setHash(location.hash || "#/runs");
    addEventListener("hashchange", onChange);
    return () => removeEventListener("hashchange", onChange);
  }, []);
  return hash;
}

function KeyPanel({ onChange }: { onChange: () => void }) {
  const [draft, setDraft] = useState("");
  const key = storedKey();
  if (key) {
    return (
      <div class="key">
        key …{key.slice(-4)}{" "}
        <button type="button" onClick={() => (storeKey(""), onChange())}>Forget key</button>
      </div>
    );
  }
  return (
    <form
      class="key"
      onSubmit={(e) => {
        e.preventDefault();
        storeKey(draft.trim());
        onChange();
      }}
    >
      <label>
        API key <input name="key" type="password" autocomplete="off" placeholder="rk_live_…" value={draft} onInput={(e) => setDraft((e.target as HTMLInputElement).value)} />
      </label>
      <button type="submit">Use key</button>
      <span class="muted"> kept in this tab only (sessionStorage)</span>
    </form>
  );
}

/** Start a run on an agent, or continue one, and show the answer. */
function StartForm({ report }: { report: Report }) {
  const [agents, setAgents] = useState<Agent[]>([]);
  const [form, setForm] = useState({ agent: "", version: "", run_id: "", input: "", on_busy: "queue", mode: "background" });
  const [answer, setAnswer] = useState<Run | null>(null);
  const [sending, setSending] = useState(false);
  useEffect(() => {
    call<List<Agent>>("GET", "/api/v1/agents?limit=100").then(({ body }) => setAgents(body.data), report);
  }, []);
  const set = (name: keyof typeof form) => (e: Event) => setForm({ ...form, [name]: (e.target as HTMLInputElement).value });
  const submit = async (e: Event) => {
    e.preventDefault();
    setSending(true);
    const body: Record<string, unknown> = { input: form.input };
    if (form.run_id.trim()) Object.assign(body, { run_id: form.run_id.trim(), on_busy: form.on_busy });
    else Object.assign(body, { agent: form.agent, ...(form.version ? { version: Number(form.version) } : {}) });
    if (form.mode === "background") body.background = true;
    try {
      const { body: run } = await call<Run>("POST", "/api/v1/runs", body);
      setAnswer(run);
      location.hash = `#/runs/${run.id}`;
    } catch (err) {
      report(err);
    } finally {
      setSending(false);
    }
  };
  return (
    <section>
      <h2>Start or continue a run</h2>
      <form class="start" onSubmit={submit}>
        <label>
          agent
          <select name="agent" value={form.agent} onChange={set("agent")}>
            <option value="">(choose)</option>
            {agents.map((a) => <option key={a.id} value={a.id}>{a.name} ({a.id}, active {a.active_version ?? "none"})</option>)}
          </select>
        </label>
        <label>version <input name="version" type="number" min={1} placeholder="active" value={form.version} onInput={set("version")} /></label>
        <label>or continue run <input name="run_id" placeholder="run_…" value={form.run_id} onInput={set("run_id")} /></label>
        <label>
          when busy
          <select name="on_busy" value={form.on_busy} onChange={set("on_busy")}>
            <option value="queue">queue</option>
            <option value="steer">steer</option>
            <option value="reject">reject</option>
          </select>
        </label>
        <label>
          answer
          <select name="mode" value={form.mode} onChange={set("mode")}>
            <option value="background">at once (background)</option>
            <option value="wait">when the turn ends (wait)</option>
          </select>
        </label>
        <label class="wide">input <textarea name="input" rows={3} value={form.input} onInput={set("input")} /></label>
        <button type="submit" disabled={sending}>{sending ? "Sending…" : "Send"}</button>
      </form>
      {answer && <p class="muted">{answer.disposition}: run {answer.id}, turn {answer.turn.id} {answer.turn.status}</p>}
    </section>
  );
}

function Agents({ report }: { report: Report }) {
  const [agents, setAgents] = useState<Array<Agent & { deployments: Deployment[] }>>([]);
  useEffect(() => {
    (async () => {
      const { body } = await call<List<Agent>>("GET", "/api/v1/agents?limit=100");
      const withDeployments = await Promise.all(
        body.data.map(async (agent) => ({ ...agent, deployments: (await call<List<Deployment>>("GET", `/api/v1/agents/${agent.id}/deployments?limit=100`)).body.data })),
      );
      setAgents(withDeployments);
    })().catch(report);
  }, []);
  return (
    <section>
      <h2>Agents and deployments</h2>
      {agents.length === 0 && <p class="muted">No agents yet.</p>}
      {agents.map((agent) => (
        <article key={agent.id} class="agent" data-agent-id={agent.id}>
          <h3>{agent.name} <span class="muted">{agent.id} · active version {agent.active_version ?? "none"}</span></h3>
          <table>
            <thead><tr><th>version</th><th>status</th><th>upgrade policy</th><th>created</th><th>error</th></tr></thead>
            <tbody>
              {agent.deployments.map((d) => (
                <tr key={d.version} class={d.version === agent.active_version ? "active" : ""}>
                  <td>{d.version}{d.version === agent.active_version ? " (active)" : ""}</td>
                  <td>{d.status}</td>
                  <td>{d.upgrade_policy}</td>
                  <td>{new Date(d.created_at * 1000).toLocaleString()}</td>
                  <td>{d.error ? `${d.error.code}: ${d.error.message}` : ""}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </article>
      ))}
    </section>
  );
}

function App() {
  const route = useRoute();
  const [, setKeyVersion] = useState(0);
  const [problem, setProblem] = useState<ApiFailure | Error | null>(null);
  const report: Report = (err) => setProblem(err instanceof Error ? err : new Error(String(err)));
  useEffect(() => setProblem(null), [route]);
  // Only a run id (run_ and base62): the id goes into API paths, so a link whose fragment
  // names another path (`#/runs/..%2Fenvironment-values%2FX%3Freveal%3Dtrue`) opens nothing.
  const runMatch = /^#\/runs\/(run_[0-9A-Za-z]{1,64})$/.exec(route);
  const hasKey = storedKey() !== "";
  return (
    <>
      <header>
        <h1>runs</h1>
        <nav>
          <a href="#/runs" class={route === "#/runs" ? "here" : ""}>Runs</a>
          <a href="#/start" class={route === "#/start" ? "here" : ""}>Start</a>
          <a href="#/agents" class={route === "#/agents" ? "here" : ""}>Agents</a>
          <a href="#/usage" class={route === "#/usage" ? "here" : ""}>Usage</a>
          <a href="/docs">API reference</a>
        </nav>
        <KeyPanel onChange={() => setKeyVersion((v) => v + 1)} />
      </header>
      {problem && (
        <p class="error" role="alert" data-testid="api-error">
          {problem instanceof ApiFailure ? (
            <>
              <strong>{problem.code}</strong> ({problem.status}{problem.param ? `, ${problem.param}` : ""}): {problem.message}
            </>
          ) : (
            problem.message
          )}{" "}
          <button type="button" onClick={() => setProblem(null)}>dismiss</button>
        </p>
      )}
      <main>
        {!hasKey ? (
          <p>Give an API key above to see this workspace.</p>
        ) : runMatch ? (
          <RunView key={runMatch[1]} runId={runMatch[1]!} report={report} />
        ) : route === "#/start" ? (
          <StartForm report={report} />
        ) : route === "#/agents" ? (
          <Agents report={report} />
        ) : route === "#/usage" ? (
          <UsagePage report={report} />
        ) : (
          <RunsList report={report} />
        )}
      </main>
    </>
  );
}

render(<App />, document.getElementById("console")!);
