/**
 * Request ids: every answer carries `x-request-id`, and the request's log lines carry it as
 * `reqId`. A client's own id is kept when it is a plain token (it then ties the client's
 * logs to ours); anything else is replaced, so a header never writes arbitrary text into
 * our logs or answers.
 */
const CLIENT_REQUEST_ID = /^[A-Za-z0-9._:/+=-]{1,128}$/;

export const REQUEST_ID_HEADER = "x-request-id";

/** The client's request id when it is acceptable, else undefined. */
export function acceptedRequestId(header: string | string[] | undefined): string | undefined {
  return typeof header === "string" && CLIENT_REQUEST_ID.test(header) ? header : undefined;
}
