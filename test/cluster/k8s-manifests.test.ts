import test from "ava";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { PROJECT_ROOT } from "../../node/servers.js";

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

test("deploy/k8s - runs pods are unprivileged and get only what bwrap needs", async (t) => {
  const manifest = await k8s("runs.yaml");
  t.regex(manifest, /hostUsers: false/);
  t.regex(manifest, /runAsNonRoot: true/);
  t.regex(manifest, /runAsUser: 10001/);
  t.regex(manifest, /allowPrivilegeEscalation: false/);
  t.regex(manifest, /readOnlyRootFilesystem: true/);
  t.regex(manifest, /capabilities: \{ drop: \[ALL\] \}/);
  t.regex(manifest, /procMount: Unmasked/);
  t.regex(manifest, /# runtimeClassName: gvisor/, "gVisor is offered as the stronger alternative");
  t.notRegex(manifest, /privileged: true/);
  t.notRegex(manifest, /add: \[/, "no capability is added");
});

test("deploy - the image runs as a non-root user with bubblewrap; compose lifts only what bwrap needs", async (t) => {
  const dockerfile = await readFile(path.join(PROJECT_ROOT, "deploy", "Dockerfile"), "utf8");
  t.regex(dockerfile, /^FROM node:26-/m, "the current Node LTS (26, LTS since October 2026)");
  t.regex(dockerfile, /apt-get install[^\n]*bubblewrap[^\n]*socat/);
  t.regex(dockerfile, /^USER 10001:10001$/m);
  const compose = await readFile(path.join(PROJECT_ROOT, "deploy", "compose.yaml"), "utf8");
  t.regex(compose, /cap_drop: \[ALL\]/);
  t.regex(compose, /no-new-privileges:true/);
  t.regex(compose, /read_only: true/);
  t.notRegex(compose, /privileged: true/);
  t.notRegex(compose, /cap_add/);
});

test("deploy - compose has no default secrets, MongoDB with authentication, and publishes only the proxy's port", async (t) => {
  const compose = await readFile(path.join(PROJECT_ROOT, "deploy", "compose.yaml"), "utf8");
  t.notRegex(compose, /change-me/i);
  // Every secret is required (`${VAR:?…}`), never defaulted (`${VAR:-…}`).
  t.notRegex(compose, /\$\{[A-Z_]+:-/);
  for (const name of ["RUNS_MASTER_KEY", "RUNS_NATS_PASSWORD", "RUNS_NATS_TAP_PASSWORD", "RUNS_MONGO_PASSWORD", "RUNS_MONGO_KEYFILE"]) {
    t.regex(compose, new RegExp(`\\$\\{${name}:\\?`), name);
  }
  t.regex(compose, /command: \["mongod", "--replSet", "rs0", "--bind_ip_all", "--keyFile", "\/tmp\/keyfile", "--auth"\]/);
  for (const uri of compose.match(/MONGODB_URI: .+/g) ?? []) t.regex(uri, /mongodb:\/\/root:\$\{RUNS_MONGO_PASSWORD:\?[^}]*\}@/, uri);
  t.true((compose.match(/MONGODB_URI:/g) ?? []).length >= 3);
  // Only the proxy publishes a port.
  t.deepEqual(compose.match(/^\s+ports:.*$/gm), ['    ports: ["8080:8080"]']);
  t.regex(compose.split("  proxy:")[1]!, /ports: \["8080:8080"\]/);
});

test("deploy/k8s - no service-account token in the pods, no NATS monitoring in a Service, network policies", async (t) => {
  const runs = await k8s("runs.yaml");
  const nats = await k8s("nats.yaml");
  t.regex(runs, /automountServiceAccountToken: false/);
  t.regex(nats, /automountServiceAccountToken: false/);
  for (const service of nats.split("\n---\n").filter((doc) => /kind: Service\n/.test(doc))) t.notRegex(service, /8222|monitor/);
  const policies = (await k8s("network-policy.yaml")).split("\n---\n");
  const named = (name: string) => policies.find((doc) => new RegExp(`kind: NetworkPolicy\\n(?:.*\\n)*?  name: ${name}\\n`).test(doc)) ?? "";
  t.regex(named("default-deny"), /policyTypes: \[Ingress, Egress\]/);
  t.notRegex(named("default-deny"), /ingress:|egress:/, "deny all unless another policy allows");
  // NATS clients only from runs pods, routes only between NATS pods, never the monitoring port.
  const natsPolicy = named("nats");
  t.regex(natsPolicy, /from: \[\{ podSelector: \{ matchLabels: \{ app.kubernetes.io\/name: runs \} \} \}\]\n\s+ports: \[\{ port: 4222/);
  t.regex(natsPolicy, /from: \[\{ podSelector: \{ matchLabels: \{ app.kubernetes.io\/name: nats \} \} \}\]\n\s+ports: \[\{ port: 6222/);
  t.notRegex(natsPolicy, /8222/);
  t.regex(named("mongo"), /port: 27017/);
  t.notRegex(named("mongo"), /name: nats \}/, "NATS does not reach the store");
  t.regex(named("runs"), /except: \[10.0.0.0\/8, 172.16.0.0\/12, 192.168.0.0\/16, 100.64.0.0\/10, 169.254.0.0\/16/);
});
