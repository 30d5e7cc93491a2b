/**
 * A deployment's model reference resolved to a pi-ai model: `faux/scripted`, a model of
 * pi-ai's registry (`<provider>/<model-id>`), or an `openai-compatible` endpoint.
 */
import type { StreamFn } from "@mariozechner/pi-agent-core";
import { getModels, getProviders, type KnownProvider, type Model } from "@mariozechner/pi-ai";
import { type ModelRef, SCRIPTED_MODEL } from "../src/index.js";
import { createScriptedStreamFn, scriptedModel, type ScriptedModelOptions } from "./scripted-model.js";

export type ResolvedModel = { model: Model<any>; streamFn?: StreamFn } | { error: string };

/**
 * Resolves a config model reference: `faux/scripted` (with a fresh scripted stream
 * function built from `scripted`; one per turn), `<provider>/<model-id>` from pi-ai's
 * registry (the model id may itself contain `/`), or an `openai-compatible` endpoint.
 * An unknown model answers `{error}` naming it.
 */
export function resolveModel(ref: ModelRef, scripted: ScriptedModelOptions = {}): ResolvedModel {
  if (typeof ref !== "string") {
    if (ref.provider !== "openai-compatible") return { error: `Unknown model provider "${String(ref.provider)}"` };
    if (!ref.model) return { error: "An openai-compatible model needs a model name" };
    try {
      new URL(ref.base_url);
    } catch {
      // Not quoted: the turn's error is read by everyone with run:read.
      return { error: "The base_url of the openai-compatible model is not a URL" };
    }
    const model: Model<"openai-completions"> = {
      id: ref.model,
      name: ref.model,
      api: "openai-completions",
      provider: OPENAI_COMPATIBLE,
      baseUrl: ref.base_url,
      reasoning: false,
      input: ["text"],
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
      contextWindow: 128_000,
      maxTokens: 16_384,
    };
    return { model };
  }
  if (ref === SCRIPTED_MODEL) return { model: scriptedModel, streamFn: createScriptedStreamFn(scripted) };
  const slash = ref.indexOf("/");
  if (slash <= 0 || slash === ref.length - 1) {
    return { error: `Unknown model "${ref}": expected "<provider>/<model-id>"` };
  }
  const provider = ref.slice(0, slash);
  const modelId = ref.slice(slash + 1);
  if (!(getProviders() as string[]).includes(provider)) {
    return { error: `Unknown model "${ref}": no registry holds provider "${provider}"` };
  }
  const model = getModels(provider as KnownProvider).find((candidate) => candidate.id === modelId);
  if (!model) return { error: `Unknown model "${ref}": provider "${provider}" has no model "${modelId}"` };
  return { model };
}

export const OPENAI_COMPATIBLE = "openai-compatible";
/** Sent to openai-compatible endpoints when no key is configured (local servers ignore it). */
export const PLACEHOLDER_API_KEY = "none";
