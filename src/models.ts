/**
 * The model catalogue tenants may choose from: pi-ai's registry, minus the providers
 * that would authenticate with the operator's ambient credentials unless the operator
 * enables them, plus our `faux/scripted` model. The gateway lists it; the actors
 * resolve a deployment's model against the same rules.
 */
import { getModels, getProviders } from "@mariozechner/pi-ai";
import { SCRIPTED_MODEL } from "./domain.js";

/**
 * Providers whose client authenticates (or is configured) from the service's
 * environment, files or instance metadata rather than from the credential passed to it.
 */
export const AMBIENT_PROVIDERS: readonly string[] = ["amazon-bedrock", "google-vertex", "azure-openai-responses", "cloudflare-workers-ai", "cloudflare-ai-gateway"];

/** Whether tenants may use `provider`: ambient ones only when the operator enabled them. */
export function providerOffered(provider: string, enabledAmbient: ReadonlySet<string>): boolean {
  return !AMBIENT_PROVIDERS.includes(provider) || enabledAmbient.has(provider);
}

/** How `faux/scripted` (actors/scripted-model.ts) is listed. */
export const SCRIPTED_LISTING = { provider: "faux", name: "Scripted model (development and tests)", input: ["text", "image"] } as const;

export interface ModelListing {
  /** The reference to use as `model` in an agent config: `<provider>/<model-id>`. */
  id: string;
  provider: string;
  name: string;
  input: string[];
}

/** The registry's models of the providers offered, plus `faux/scripted`, for GET /api/v1/models. */
export function listModels(ambientProviders: ReadonlySet<string> = new Set()): ModelListing[] {
  const listing: ModelListing[] = [{ id: SCRIPTED_MODEL, provider: SCRIPTED_LISTING.provider, name: SCRIPTED_LISTING.name, input: [...SCRIPTED_LISTING.input] }];
  for (const provider of getProviders()) {
    if (!providerOffered(provider, ambientProviders)) continue;
    for (const model of getModels(provider)) {
      listing.push({ id: `${provider}/${model.id}`, provider, name: model.name, input: [...model.input] });
    }
  }
  return listing;
}
