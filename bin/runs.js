#!/usr/bin/env node
// The `runs` command: loads the TypeScript sources through tsx.
import { register } from "tsx/esm/api";

register();
await import("../node/cli.ts");
