import test from "ava";
import { decideUpload, decisionError, uploadFingerprint, UploadState, type FileUploadDoc } from "../../src/upload-decisions.js";

const NOW = 1_000_000;
const TAKEOVER = 30_000;
const FP = uploadFingerprint({ filename: "a.txt", media_type: "text/plain" });
const OTHER = uploadFingerprint({ filename: "b.txt", media_type: "text/plain" });
const record = (state: UploadState, heartbeatAgoMs = 0): FileUploadDoc => ({
  _id: "k",
  workspace_id: "ws",
  fingerprint: FP,
  state,
  file_id: "file_1",
  heartbeat_at: NOW - heartbeatAgoMs,
  started_at: 0,
  created_at: 0,
  expires_at: NOW + 1,
});

test("upload decisions - every record state × same or other file × fresh or silent", (t) => {
  t.deepEqual(decideUpload(null, undefined, NOW, TAKEOVER), { kind: "start" });
  t.deepEqual(decideUpload(null, FP, NOW, TAKEOVER), { kind: "start" });
  for (const state of Object.values(UploadState)) {
    for (const silent of [false, true]) {
      const r = record(state, silent ? TAKEOVER : TAKEOVER - 5_000);
      for (const fingerprint of [FP, OTHER, undefined]) {
        const got = decideUpload(r, fingerprint, NOW, TAKEOVER);
        let want: unknown;
        if (state === "uploading" && !silent) want = { kind: "in_progress", retryAfterS: 5 };
        else if (state === "expired") want = { kind: "conflict", reason: "expired" };
        else if (fingerprint === undefined) want = { kind: "need_fingerprint" };
        else if (state === "failed") want = { kind: "restart", previous: r };
        else if (fingerprint !== FP) want = { kind: "conflict", reason: "other_file" };
        else if (state === "done") want = { kind: "replay", fileId: "file_1" };
        else want = { kind: "takeover", previous: r };
        t.deepEqual(got, want, `${state} ${silent ? "silent" : "fresh"} ${fingerprint === FP ? "same" : fingerprint ? "other" : "unknown"}`);
      }
    }
  }
});

test("upload decisions - Retry-After of a running upload is 1 to 30 s", (t) => {
  t.like(decideUpload(record("uploading", 0), FP, NOW, 120_000), { kind: "in_progress", retryAfterS: 30 });
  t.like(decideUpload(record("uploading", TAKEOVER - 1), FP, NOW, TAKEOVER), { kind: "in_progress", retryAfterS: 1 });
});

test("upload decisions - refusals answer 429 upload_in_progress or 409 conflict naming the key", (t) => {
  t.like(decisionError({ kind: "in_progress", retryAfterS: 4 }), { code: "upload_in_progress", param: "Idempotency-Key", retryAfterS: 4 });
  t.like(decisionError({ kind: "conflict", reason: "other_file" }), { code: "conflict", param: "Idempotency-Key" });
  t.regex(decisionError({ kind: "conflict", reason: "expired" })!.message, /expired/);
  t.is(decisionError({ kind: "start" }), undefined);
  // Filename and media type are kept apart: moving characters between them is another file.
  t.not(uploadFingerprint({ filename: "a", media_type: "b/c" }), uploadFingerprint({ filename: "ab", media_type: "/c" }));
  t.is(uploadFingerprint({ filename: "a", media_type: "b/c" }), uploadFingerprint({ filename: "a", media_type: "b/c" }));
});
