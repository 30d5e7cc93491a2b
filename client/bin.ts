#!/usr/bin/env node
/** The `runs` command of the client package: the API commands (the server's own `runs` adds `admin`). */
import { runCli } from "./cli.js";

process.exitCode = await runCli(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, env: process.env });
