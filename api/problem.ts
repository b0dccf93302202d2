/** Errors to RFC 9457 problem+json: the one place where errors become HTTP. */
import type { Context } from "hono";
import { ERRORS, PoimenError, PROBLEM_BASE } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { toDbError } from "../db/pool.ts";
import type { Problem } from "../contracts/runs.ts";

/** Seconds a client should wait before retrying a 503. */
export const RETRY_AFTER_SECONDS = 1;

/**
 * The problem body for `err` (what a response's body, or a batch item's
 * `problem`, says); unexpected errors are logged and hidden. `where` names
 * the request in the log.
 */
export function problemOf(
  err: unknown,
  log: Logger,
  where: { method: string; path: string },
): { problem: Problem; error: PoimenError } {
  const e = toDbError(err);
  const pe = e instanceof PoimenError ? e : new PoimenError("internal", "internal error");
  if (!(e instanceof PoimenError) || pe.status >= 500) {
    log.error("request failed", {
      ...where,
      code: pe.code,
      error: e instanceof Error ? e.message : String(e),
    });
  } else if (pe.code === "invalid-data") {
    // A value the door let through and Postgres refused: a check to add.
    // Its SQLSTATE only: Postgres' message may quote the caller's data.
    log.warn("request data refused by the database", {
      ...where,
      code: pe.code,
      sqlstate: (pe.cause as { code?: string } | undefined)?.code,
    });
  }
  const problem: Problem = {
    ...(e instanceof PoimenError ? pe.extensions : undefined),
    type: PROBLEM_BASE + pe.code,
    title: ERRORS[pe.code].title,
    status: pe.status,
    // Internal errors say nothing about internals.
    detail: e instanceof PoimenError ? pe.message : undefined,
    retryable: pe.retryable,
    errors: pe.errors,
  };
  return { problem, error: pe };
}

/** Builds the problem response for `err`; unexpected errors are logged and hidden. */
export function problemResponse(c: Context, err: unknown, log: Logger): Response {
  const { problem: body, error: pe } = problemOf(err, log, {
    method: c.req.method,
    path: c.req.path,
  });
  const headers: Record<string, string> = { "content-type": "application/problem+json" };
  // A 429 knows when to come back (admission/quota.ts); a 503 does not.
  if (pe.retryAfterSeconds !== undefined) {
    headers["retry-after"] = String(Math.max(1, Math.ceil(pe.retryAfterSeconds)));
  } else if (pe.code === "database-unavailable" || pe.code === "busy") {
    headers["retry-after"] = String(RETRY_AFTER_SECONDS);
  }
  if (pe.code === "unauthorized") headers["www-authenticate"] = 'Bearer realm="poimen"';
  return new Response(JSON.stringify(body), { status: pe.status, headers });
}
