/**
 * Provider credentials come from the workspace's environment values (decisions §3),
 * never from the service's own environment, so one workspace cannot use another's
 * (or the operator's) keys. Three rules keep the operator's credentials away from
 * tenants:
 * - an `openai-compatible` endpoint (any URL a tenant names) gets only the value its
 *   deployment names in `config.model.api_key_env`, never a fallback;
 * - providers that authenticate with the service's ambient credentials (the AWS
 *   credential chain, Google's Application Default Credentials, the operator's Azure or
 *   Cloudflare settings) are offered only when the operator enables them;
 * - the service's own provider variables are removed from its environment at start
 *   ({@link scrubProviderEnvironment}), so no provider client can fall back to them.
 */
import { isHeaderSafe, type ModelRef } from "../src/index.js";

const OPENAI_COMPATIBLE = "openai-compatible";

const PROVIDER_KEY_VARS: Record<string, string[]> = {
  anthropic: ["ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"],
  openai: ["OPENAI_API_KEY"],
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

/**
 * A `getApiKey` for the agent runner over a workspace's decrypted values. A custom
 * endpoint gets the value its model reference names, or nothing.
 */
export function apiKeyResolver(values: Record<string, string>, model: ModelRef): (provider: string) => string | undefined {
  // A value stored before values had to be header-safe is not sent: the HTTP client's
  // refusal would quote it (src/env-values.ts, isHeaderSafe). The turn fails as without one.
  const usable = (name: string) => {
    const value = values[name];
    return value && isHeaderSafe(value) ? value : undefined;
  };
  return (provider) => {
    if (provider === OPENAI_COMPATIBLE) {
      const name = typeof model === "object" ? model.api_key_env : undefined;
      return name ? usable(name) : undefined;
    }
    for (const name of providerKeyVars(provider)) {
      const value = usable(name);
      if (value) return value;
    }
    return undefined;
  };
}

/** Prefixes of variables provider SDKs read credentials or endpoints from. */
const PROVIDER_ENV = /^(AWS_|AMAZON_|AZURE_|GOOGLE_|GCLOUD_|GCP_|CLOUDSDK_|GEMINI_|OPENAI_|ANTHROPIC_|MISTRAL_|GROQ_|XAI_|OPENROUTER_|CEREBRAS_|DEEPSEEK_|FIREWORKS_|HF_|HUGGINGFACE_|COPILOT_|AI_GATEWAY_|MOONSHOT_|KIMI_|CLOUDFLARE_|ZAI_|MINIMAX_|XIAOMI_|OPENCODE_)|^(GH_TOKEN|GITHUB_TOKEN)$/;

/** What an enabled ambient provider needs of the service's environment. */
const AMBIENT_ENV: Record<string, RegExp> = {
  "amazon-bedrock": /^AWS_/,
  "google-vertex": /^(GOOGLE_|GCLOUD_|CLOUDSDK_)/,
  "azure-openai-responses": /^AZURE_/,
  "cloudflare-workers-ai": /^CLOUDFLARE_/,
  "cloudflare-ai-gateway": /^CLOUDFLARE_/,
};

/**
 * Removes provider credential and endpoint variables from `env` (the service's own
 * environment), keeping only what an ambient provider the operator enabled needs.
 * Returns the names removed, for the start-up log.
 */
export function scrubProviderEnvironment(env: NodeJS.ProcessEnv, enabledAmbient: ReadonlySet<string>): string[] {
  const kept = [...enabledAmbient].flatMap((provider) => (AMBIENT_ENV[provider] ? [AMBIENT_ENV[provider]] : []));
  const removed = Object.keys(env).filter((name) => PROVIDER_ENV.test(name) && !kept.some((pattern) => pattern.test(name)));
  for (const name of removed) delete env[name];
  return removed;
}
