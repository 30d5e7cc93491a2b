// workerThreads: false — on Node 20, `--import=tsx` does not reach ava's worker threads
// (ERR_UNKNOWN_FILE_EXTENSION for .ts); child processes load it.
export default {
  extensions: { ts: "module" },
  nodeArguments: ["--import=tsx"],
  workerThreads: false,
  timeout: "60s",
  files: ["test/**/*.test.ts"],
};
