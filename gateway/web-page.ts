/**
 * What every page for people (the console at `/`, the reference at `/docs`) answers with:
 * a Content-Security-Policy that allows its own files only, and no sniffing or referrer.
 */
import type { FastifyReply } from "fastify";

/** A CSP that refuses everything but the page's own scripts and styles and calls to its own origin. */
export function pagePolicy(options: { inlineStyles: boolean }): string {
  return [
    "default-src 'none'",
    "script-src 'self'",
    options.inlineStyles ? "style-src 'self' 'unsafe-inline'" : "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join("; ");
}

export function withPageHeaders(reply: FastifyReply, policy: string): FastifyReply {
  return reply.header("content-security-policy", policy).header("x-content-type-options", "nosniff").header("referrer-policy", "no-referrer");
}
