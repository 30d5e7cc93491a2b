import test from "ava";
import { createConfig, lintFromString } from "@redocly/openapi-core";
import { buildOpenApiDocument } from "../../gateway/openapi.js";

test("openapi - Redocly's recommended rules find nothing to warn about or refuse in the document", async (t) => {
  const config = await createConfig({
    extends: ["recommended"],
    // The package grants no license ("UNLICENSED", npm's word for it): there is no SPDX
    // identifier or license text to point at, so the license object has only its name.
    rules: { "info-license-strict": "off" },
  });
  const problems = await lintFromString({ source: JSON.stringify(buildOpenApiDocument()), absoluteRef: "/api/v1/openapi.json", config });
  t.deepEqual(
    problems.map((p) => `${p.severity} ${p.ruleId}: ${p.message} at ${p.location[0]?.pointer}`),
    [],
  );
});
