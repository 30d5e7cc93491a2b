/** Canonical API key scopes (spec "Authentication" 3). */
export const SCOPES = [
  "models:read",
  "files:read",
  "files:write",
  "agents:read",
  "agents:write",
  "run:read",
  "run:write",
  "env_vars:read",
  "env_vars:write",
  "env_vars:reveal",
  "api_keys:manage",
  "webhooks:read",
  "webhooks:write",
] as const;
export type Scope = (typeof SCOPES)[number];

const SCOPE_SET: ReadonlySet<string> = new Set(SCOPES);

/** The read scope a write or reveal scope requires, if any. */
export function requiredReadScope(scope: string): string | undefined {
  const [resource, action] = scope.split(":");
  return action === "write" || action === "reveal" ? `${resource}:read` : undefined;
}

/** Why a scope list is not acceptable for a key, or undefined when it is. */
export function scopeListProblem(scopes: readonly string[]): string | undefined {
  if (scopes.length < 1 || scopes.length > SCOPES.length) return `scopes must hold 1 to ${SCOPES.length} items`;
  const seen = new Set<string>();
  for (const scope of scopes) {
    if (!SCOPE_SET.has(scope)) return `unknown scope ${JSON.stringify(scope)}`;
    if (seen.has(scope)) return `scope ${scope} appears twice`;
    seen.add(scope);
  }
  for (const scope of scopes) {
    const read = requiredReadScope(scope);
    if (read && !seen.has(read)) return `scope ${scope} requires ${read}`;
  }
  return undefined;
}
