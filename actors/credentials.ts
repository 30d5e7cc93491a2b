/**
 * Provider credentials come from the workspace's environment values (decisions §3),
 * never from the service's own environment, so one workspace cannot use another's
 * (or the operator's) keys.
 */

const PROVIDER_KEY_VARS: Record<string, string[]> = {
  anthropic: ["ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"],
  openai: ["OPENAI_API_KEY"],
  "openai-compatible": ["OPENAI_COMPATIBLE_API_KEY", "OPENAI_API_KEY"],
  "azure-openai-responses": ["AZURE_OPENAI_API_KEY"],
  google: ["GEMINI_API_KEY", "GOOGLE_API_KEY"],
  "google-vertex": ["GOOGLE_CLOUD_API_KEY"],
  "github-copilot": ["COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"],
  huggingface: ["HF_TOKEN"],
  "vercel-ai-gateway": ["AI_GATEWAY_API_KEY"],
  moonshotai: ["MOONSHOT_API_KEY"],
  "kimi-coding": ["KIMI_API_KEY"],
  "cloudflare-workers-ai": ["CLOUDFLARE_API_KEY"],
};

/** Environment value names that may hold a provider's key, most specific first. */
export function providerKeyVars(provider: string): string[] {
  return PROVIDER_KEY_VARS[provider] ?? [`${provider.toUpperCase().replace(/[^A-Z0-9]+/g, "_")}_API_KEY`];
}

/** A `getApiKey` for the agent runner over a workspace's decrypted values. */
export function apiKeyResolver(values: Record<string, string>): (provider: string) => string | undefined {
  return (provider) => {
    for (const name of providerKeyVars(provider)) if (values[name]) return values[name];
    return undefined;
  };
}
