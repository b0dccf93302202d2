/**
 * The relay's HTTP client of `POST /v1/runs`, and the classification of what
 * came back. The relay is an HTTP client of the API like any other caller:
 * that is what makes "no bypass" mechanical (see DESIGN.md, Inbox relay).
 */
import { HEADERS } from "../contracts/runs.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { MINUTE } from "../core/time.ts";

/** Longest Retry-After honoured: a bogus huge value must not park a partition for days. */
export const MAX_RETRY_AFTER_MS = 10 * MINUTE;
/** Longest problem detail kept (it ends up in a Kafka header). */
export const MAX_DETAIL = 500;

/** What one attempt at admitting a message came to. */
export type Outcome =
  | { kind: "created"; status: number }
  | { kind: "replayed"; status: number }
  | {
    /** Will never succeed as is: dead-letter it. */
    kind: "permanent";
    reason: string;
    /** The HTTP status, or "none" when the message never reached the API. */
    status: number | "none";
    detail: string;
  }
  | {
    /** May succeed later: retry, never skip. */
    kind: "transient";
    /** A metric label: network, timeout, auth, rate_limited, request_timeout, unavailable, server_error, unexpected_status. */
    reason: string;
    status?: number;
    /** From Retry-After, when the API sent one. */
    retryAfterMs?: number;
    detail: string;
  };

/** How a status is handled, before looking at anything else (DESIGN.md, Inbox relay). */
export function classifyStatus(status: number): { kind: Outcome["kind"]; reason: string } {
  // The API answers a replayed dispatch_key with 200 and a new run with 201;
  // any other 2xx still admitted the message.
  if (status === 200) return { kind: "replayed", reason: "replayed" };
  if (status >= 200 && status < 300) return { kind: "created", reason: "created" };
  // A misconfigured token must not shred the queue: retried, loudly, until fixed.
  if (status === 401 || status === 403) return { kind: "transient", reason: "auth" };
  if (status === 408) return { kind: "transient", reason: "request_timeout" };
  if (status === 429) return { kind: "transient", reason: "rate_limited" };
  if (status === 503) return { kind: "transient", reason: "unavailable" };
  if (status >= 500) return { kind: "transient", reason: "server_error" };
  if (status >= 400) return { kind: "permanent", reason: `http_${status}` };
  // 1xx/3xx from the admission endpoint means API_URL points at something else.
  return { kind: "transient", reason: "unexpected_status" };
}

/** Retry-After (delta-seconds or an HTTP date) in ms from `now`; undefined when absent or bad. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  let ms: number;
  if (/^\d+$/.test(text)) ms = Number(text) * 1000;
  else {
    // An HTTP date names its day; Date.parse alone would read "-1" as a year.
    const at = /[a-z]/i.test(text) ? Date.parse(text) : NaN;
    if (Number.isNaN(at)) return undefined;
    ms = at - now;
  }
  return Math.min(Math.max(0, ms), MAX_RETRY_AFTER_MS);
}

/**
 * Why `value` cannot be a request body, or undefined when it is JSON. Checked
 * locally because such a message can never be admitted; anything subtler
 * (the schema, the workflow) is the API's to judge.
 */
export function notJson(value: Uint8Array): string | undefined {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(value);
  } catch {
    return "the value is not UTF-8";
  }
  try {
    JSON.parse(text);
    return undefined;
  } catch (err) {
    return `the value is not JSON: ${(err as Error).message}`;
  }
}

/** The `reason` and `detail` of a problem+json body (or of whatever else came back). */
export function problemSummary(
  body: string,
  fallback: string,
): { reason?: string; detail: string } {
  try {
    const p = JSON.parse(body) as {
      type?: unknown;
      title?: unknown;
      detail?: unknown;
      errors?: { path?: unknown; message?: unknown }[];
    };
    const reason = typeof p.type === "string" && p.type.startsWith(PROBLEM_BASE)
      ? p.type.slice(PROBLEM_BASE.length)
      : undefined;
    let detail = typeof p.detail === "string"
      ? p.detail
      : typeof p.title === "string"
      ? p.title
      : fallback;
    if (Array.isArray(p.errors) && p.errors.length > 0) {
      detail += ": " + p.errors.map((e) => `${e.path}: ${e.message}`).join("; ");
    }
    return { reason, detail: truncate(detail) };
  } catch {
    return { detail: truncate(body.trim() || fallback) };
  }
}

function truncate(text: string): string {
  return text.length > MAX_DETAIL ? text.slice(0, MAX_DETAIL - 1) + "…" : text;
}

/** One message to admit. */
export interface AdmitRequest {
  tenant: string;
  /** The message value, sent verbatim as the body. */
  body: Uint8Array;
  /** `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  traceparent?: string;
  tracestate?: string;
}

/** Options of `ApiClient`. */
export interface ApiClientOptions {
  apiUrl: string;
  token: string;
  timeoutMs: number;
}

/** Posts dispatch messages to `POST /v1/runs`; never throws, every failure is an `Outcome`. */
export class ApiClient {
  readonly #url: string;
  readonly #token: string;
  readonly #timeoutMs: number;

  constructor(opts: ApiClientOptions) {
    // Appended, not resolved: an API behind a path prefix keeps its prefix.
    this.#url = opts.apiUrl.replace(/\/+$/, "") + "/v1/runs";
    this.#token = opts.token;
    this.#timeoutMs = opts.timeoutMs;
  }

  /** One attempt; `signal` abandons it (shutdown). */
  async admit(req: AdmitRequest, signal?: AbortSignal): Promise<Outcome> {
    const headers: Record<string, string> = {
      "content-type": "application/json",
      authorization: `Bearer ${this.#token}`,
      [HEADERS.tenant]: req.tenant,
      [HEADERS.source]: req.source,
    };
    if (req.traceparent) headers.traceparent = req.traceparent;
    if (req.tracestate) headers.tracestate = req.tracestate;
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    let res: Response;
    let text: string;
    try {
      res = await fetch(this.#url, {
        method: "POST",
        headers,
        // A Kafka value never sits on a SharedArrayBuffer.
        body: req.body as Uint8Array<ArrayBuffer>,
        redirect: "manual",
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
      });
      // Read to the end, also when unused, so the connection can be reused.
      text = await res.text();
    } catch (err) {
      const timedOut = timeout.aborted && !signal?.aborted;
      return {
        kind: "transient",
        reason: timedOut ? "timeout" : "network",
        detail: timedOut
          ? `no answer within ${this.#timeoutMs} ms`
          : (err instanceof Error ? err.message : String(err)),
      };
    }
    const { kind, reason } = classifyStatus(res.status);
    if (kind === "created") return { kind, status: res.status };
    if (kind === "replayed") return { kind, status: res.status };
    const problem = problemSummary(text, `HTTP ${res.status}`);
    if (kind === "permanent") {
      return {
        kind,
        reason: problem.reason ?? reason,
        status: res.status,
        detail: problem.detail,
      };
    }
    return {
      kind: "transient",
      reason,
      status: res.status,
      retryAfterMs: parseRetryAfter(res.headers.get("retry-after")),
      detail: problem.detail,
    };
  }
}
