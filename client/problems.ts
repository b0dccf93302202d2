/**
 * What the API's answers mean to a caller: `PoimenProblem` (an error answer,
 * typed by its problem+json `type`), `PoimenNetworkError` (no answer), and
 * `Retry-After`. Shared by `PoimenClient` and poimen's own inbox relay, so
 * both read an answer the same way.
 *
 * @module
 */
import type { Problem, ProblemFieldError } from "../contracts/wire.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { MINUTE, SECOND } from "../core/time.ts";

/** What a `PoimenProblem` is made from. */
export interface PoimenProblemInit {
  /** The poimen error code (the problem `type` after the poimen base URI), or `unexpected-response`. */
  code: string;
  /** The HTTP status (422 for a body refused before it was sent). */
  status: number;
  /** Whether the same request may succeed later. */
  retryable: boolean;
  /** A short summary of the kind of problem. */
  title: string;
  /** What went wrong with this request. */
  detail?: string;
  /** The problem `type` URI as the server sent it (default: poimen's URI of `code`). */
  type?: string;
  /** The failing fields of a schema error. */
  errors?: ProblemFieldError[];
  /** The server's `Retry-After`, in ms. */
  retryAfterMs?: number;
  /** Members of the problem beyond the standard ones (e.g. `run_status` of a 409 `run-finished`). */
  extensions?: Record<string, unknown>;
  /** What caused it, kept as the error's `cause`. */
  cause?: unknown;
}

/**
 * An error answer of the API (RFC 9457 problem+json), typed by its `type`.
 * `code` is poimen's stable error code (`validation`, `unknown-workflow`,
 * `unauthorized`, `not-found`, `database-unavailable`, …); an answer that is
 * not a poimen problem (a proxy's 502 page) has code `unexpected-response`.
 */
export class PoimenProblem extends Error {
  /** Code of an answer that is not a poimen problem. */
  static readonly UNEXPECTED = "unexpected-response";

  /** poimen's stable error code, e.g. `validation`. */
  readonly code: string;
  /** The problem `type` URI, e.g. `https://poimen.dev/problems/validation`. */
  readonly type: string;
  /** The HTTP status. */
  readonly status: number;
  /** Whether the same request may succeed later (as the API says, else by status). */
  readonly retryable: boolean;
  /** The problem's short title. */
  readonly title: string;
  /** What went wrong with this request, when the API says. */
  readonly detail: string | undefined;
  /** The failing fields of a schema error; empty otherwise. */
  readonly errors: ProblemFieldError[];
  /** The server's `Retry-After`, in ms, when it sent one. */
  readonly retryAfterMs: number | undefined;
  /**
   * Members of the problem beyond the standard ones, e.g. `run_status` of
   * a 409 `run-finished` (RFC 9457 extension members).
   */
  readonly extensions: Record<string, unknown>;

  /** Builds a problem; the client does this for every error answer. */
  constructor(init: PoimenProblemInit) {
    const fields = (init.errors ?? []).map((e) => `${e.path || "body"}: ${e.message}`).join("; ");
    super(
      `${init.status} ${init.code}: ${init.detail ?? init.title}${fields ? ` (${fields})` : ""}`,
      init.cause === undefined ? undefined : { cause: init.cause },
    );
    this.name = "PoimenProblem";
    this.code = init.code;
    this.type = init.type ?? PROBLEM_BASE + init.code;
    this.status = init.status;
    this.retryable = init.retryable;
    this.title = init.title;
    this.detail = init.detail;
    this.errors = init.errors ?? [];
    this.retryAfterMs = init.retryAfterMs;
    this.extensions = init.extensions ?? {};
  }
}

/**
 * No answer came back: the connection failed or the attempt timed out. The
 * request may or may not have reached the API.
 */
export class PoimenNetworkError extends Error {
  /** `timeout` when no answer came within `timeoutMs`, else `network`. */
  readonly code: "network" | "timeout";
  /** Always true: a network failure may pass by itself. */
  readonly retryable = true;

  /** Wraps the failure of one attempt. */
  constructor(code: "network" | "timeout", message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PoimenNetworkError";
    this.code = code;
  }
}

/** Whether a status says the request was not carried out and may be later (408, 429, 503). */
export function refusedForNow(status: number): boolean {
  return status === 408 || status === 429 || status === 503;
}

/** What `PoimenClient.send` passes on. */
export interface SendInit {
  /** Added to the client's own headers (and replacing any of the same name). */
  headers?: Record<string, string>;
  /** The request body, sent as is. */
  body?: string | Uint8Array;
  /** Abandons the attempt. */
  signal?: AbortSignal;
}

/** An answer of the API, whatever its status, read to the end. */
export interface ApiAnswer {
  /** The HTTP status. */
  status: number;
  /** The response headers. */
  headers: Headers;
  /** The body as text. */
  text: string;
}

// A code is a metric label and a log key for callers: a stranger's "type"
// under our URI must not become one.
const CODE = /^[a-z][a-z0-9-]{0,63}$/;

/**
 * The `PoimenProblem` an error answer stands for: typed by its problem+json
 * `type` when it is one of poimen's, else code `unexpected-response` (a
 * proxy's page, another server, a redirect).
 */
export function problemFromAnswer(answer: ApiAnswer): PoimenProblem {
  let body: Partial<Problem> | undefined;
  try {
    const parsed: unknown = JSON.parse(answer.text);
    if (typeof parsed === "object" && parsed !== null) body = parsed as Partial<Problem>;
  } catch { /* not JSON: not a poimen problem */ }
  const type = body?.type;
  const code = typeof type === "string" && type.startsWith(PROBLEM_BASE)
    ? type.slice(PROBLEM_BASE.length)
    : undefined;
  if (code === undefined || !CODE.test(code)) {
    return unexpectedAnswer(answer, `HTTP ${answer.status}`);
  }
  const STANDARD = ["type", "title", "status", "detail", "instance", "retryable", "errors"];
  const extensions = Object.fromEntries(
    Object.entries(body ?? {}).filter(([k]) => !STANDARD.includes(k)),
  );
  const errors = Array.isArray(body?.errors)
    ? body.errors.filter((e) => typeof e?.path === "string" && typeof e?.message === "string")
    : [];
  return new PoimenProblem({
    code,
    type: type as string,
    status: answer.status,
    retryable: typeof body?.retryable === "boolean"
      ? body.retryable
      : refusedForNow(answer.status) || answer.status >= 500,
    title: typeof body?.title === "string" ? body.title : `HTTP ${answer.status}`,
    detail: typeof body?.detail === "string" ? body.detail : undefined,
    errors,
    retryAfterMs: parseRetryAfter(answer.headers.get("retry-after")),
    extensions,
  });
}

/** A `PoimenProblem` of code `unexpected-response` for an answer that is not poimen's. */
export function unexpectedAnswer(answer: ApiAnswer, title: string, cause?: unknown): PoimenProblem {
  const snippet = answer.text.trim().slice(0, 200);
  return new PoimenProblem({
    code: PoimenProblem.UNEXPECTED,
    type: "about:blank",
    status: answer.status,
    retryable: refusedForNow(answer.status) || answer.status >= 500,
    title,
    detail: snippet || undefined,
    retryAfterMs: parseRetryAfter(answer.headers.get("retry-after")),
    cause,
  });
}

/** Longest `Retry-After` honoured: a bogus huge value must not park a caller for days. */
export const MAX_RETRY_AFTER_MS = 10 * MINUTE;

/**
 * `Retry-After` (delta-seconds or an HTTP date) in ms from `now`, at most
 * `MAX_RETRY_AFTER_MS`; undefined when absent or not understood.
 */
export function parseRetryAfter(
  value: string | null,
  now: number = Date.now(),
): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  let ms: number;
  if (/^\d+$/.test(text)) ms = Number(text) * SECOND;
  else {
    // An HTTP date names its day; Date.parse alone would read "-1" as a year.
    const at = /[a-z]/i.test(text) ? Date.parse(text) : NaN;
    if (Number.isNaN(at)) return undefined;
    ms = at - now;
  }
  return Math.min(Math.max(0, ms), MAX_RETRY_AFTER_MS);
}
