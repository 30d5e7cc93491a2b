import test from "ava";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { PROJECT_ROOT } from "../../src/servers.js";

const k8s = (file: string) => readFile(path.join(PROJECT_ROOT, "deploy", "k8s", file), "utf8");

test("deploy/k8s - the nats-config ConfigMap holds nats.conf verbatim", async (t) => {
  const conf = await readFile(path.join(PROJECT_ROOT, "nats.conf"), "utf8");
  const manifest = await k8s("nats-configmap.yaml");
  const block = manifest.split("  nats.conf: |\n")[1];
  t.truthy(block, "a nats.conf block scalar");
  const embedded = block
    .split("\n")
    .map((line) => (line.startsWith("    ") ? line.slice(4) : line))
    .join("\n");
  t.is(embedded.trimEnd(), conf.trimEnd(), "regenerate deploy/k8s/nats-configmap.yaml from nats.conf (docs/cluster.md)");
});

test("deploy/k8s - runs pods get longer to stop than their drain, and probe /readyz and /healthz", async (t) => {
  const manifest = await k8s("runs.yaml");
  const grace = Number(/terminationGracePeriodSeconds: (\d+)/.exec(manifest)?.[1]);
  const drainMs = Number(/RUNS_DRAIN_MS: "(\d+)"/.exec(manifest)?.[1]);
  t.true(grace * 1000 > drainMs + 30_000, `grace ${grace} s, drain ${drainMs} ms`);
  t.regex(manifest, /readinessProbe:\s+# [^\n]*\n\s+httpGet: \{ path: \/readyz/);
  t.regex(manifest, /livenessProbe:\s+httpGet: \{ path: \/healthz/);
  const nats = await k8s("nats.yaml");
  t.regex(nats, /replicas: 3/);
  t.regex(nats, /--routes/);
});
