/**
 * What `npm start` prints once it serves: plain lines for a person, apart from the JSON
 * log lines, with the addresses actually in use (a taken default port is replaced).
 */
export interface BannerFacts {
  /** The API's base URL; absent on a node without the gateway role. */
  url?: string;
  /** Whether the gateway serves a console at `/`. */
  console: boolean;
  /** Whether the gateway serves the API reference at `/docs`. */
  docs: boolean;
  dataDir: string;
  /** The embedded NATS server's URL; absent when the service uses servers of its own (NATS_URL). */
  embeddedNatsUrl?: string;
  /** The development workspace made by this start, with its key (shown only this once). */
  created?: { workspaceId: string; plan: string; key: string };
}

export function startupBanner(facts: BannerFacts): string {
  const lines = [""];
  if (facts.url) {
    lines.push(
      `runs is serving on ${facts.url}`,
      `  API        ${facts.url}/api/v1   (document: ${facts.url}/api/v1/openapi.json${facts.docs ? `, reference: ${facts.url}/docs` : ""})`,
    );
    if (facts.console) lines.push(`  console    ${facts.url}/`);
  } else {
    lines.push("runs is running without the gateway role (RUNS_ROLES=actors): no API on this node");
  }
  if (facts.created) {
    lines.push(
      `  workspace  ${facts.created.workspaceId} ("development", plan ${facts.created.plan}), created by this start`,
      "  API key    all scopes, shown only this once:",
      "",
      `  ${facts.created.key}`,
      "",
    );
  } else {
    lines.push("  API key    shown by the start that created the workspace; another: npx runs admin create-workspace --plan solo|business");
  }
  if (facts.embeddedNatsUrl) {
    lines.push(`  live tap   ${facts.embeddedNatsUrl}, user tap, password: "nats_tap_password" in ${facts.dataDir}/secrets.json (subjects runs.live.>)`);
  } else {
    lines.push("  live tap   subjects runs.live.> on your NATS servers (a subscribe-only user: see nats.conf)");
  }
  lines.push(`  data       ${facts.dataDir}`, "");
  return lines.join("\n");
}
