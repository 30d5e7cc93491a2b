#!/usr/bin/env node
/** The `runs` command of the client package: the API commands (the server's own `runs` adds `admin`). */
import { endQuietlyWhenReaderCloses, runCli } from "./cli.js";

endQuietlyWhenReaderCloses(process.stdout);

process.exitCode = await runCli(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, stdin: process.stdin, env: process.env });
