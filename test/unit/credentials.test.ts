import test from "ava";
import { apiKeyResolver, providerKeyVars } from "../../actors/credentials.js";
import { isHeaderSafe } from "../../src/env-values.js";

test("credentials - a stored value that is not header-safe (stored before values were checked) is never handed to a provider; the next name's value is", (t) => {
  const values = { ANTHROPIC_API_KEY: "sk-ant\nsecond-line", ANTHROPIC_OAUTH_TOKEN: "tok-fine", OPENAI_API_KEY: "sk\r\nX: y", MINE: "k\u0000" };
  const resolve = apiKeyResolver(values, "anthropic/claude-x" as never);
  t.is(resolve("anthropic"), "tok-fine");
  t.is(resolve("openai"), undefined);
  t.is(apiKeyResolver(values, { provider: "openai-compatible", base_url: "https://x.example", model: "m", api_key_env: "MINE" } as never)("openai-compatible"), undefined);
  t.is(apiKeyResolver({ MINE: "fine\tvalue" }, { provider: "openai-compatible", base_url: "https://x.example", model: "m", api_key_env: "MINE" } as never)("openai-compatible"), "fine\tvalue");
  t.deepEqual(providerKeyVars("anthropic"), ["ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"]);
});

test("credentials - header-safe is every character but the controls other than tab, checked over all 128 ASCII characters and beyond", (t) => {
  for (let code = 0; code < 0x100; code++) {
    const expected = code === 9 || (code >= 0x20 && code !== 0x7f);
    t.is(isHeaderSafe(`a${String.fromCharCode(code)}b`), expected, `U+${code.toString(16).padStart(4, "0")}`);
  }
  t.true(isHeaderSafe("é✓🙂"));
});
