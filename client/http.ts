/**
 * The HTTP client of poimen: admit runs, read them, page through them and
 * cancel them, with the safe thing as the default.
 *
 * `admitRun` retries what may pass by itself (network errors, 408, 429, 5xx,
 * 503 with its `Retry-After`) with exponential backoff and full jitter, and
 * always sends the same `dispatch_key`, so retries never make a second run.
 * Errors are `PoimenProblem`s typed from the API's problem+json `type`.
 *
 * It needs nothing but `fetch`: at run time it loads no third-party code
 * (the run types are plain TypeScript, from contracts/wire.ts), so importing
 * it pulls in neither zod nor any Postgres or Kafka code.
 *
 * ```ts
 * import { PoimenClient } from "@poimen/poimen/client";
 *
 * const poimen = new PoimenClient({ url: "http://127.0.0.1:8080", token: Deno.env.get("POIMEN_TOKEN")! });
 * const { run, created } = await poimen.admitRun(
 *   { workflow_ref: "echo", input: { hello: "world" } },
 *   { idempotent: true },
 * );
 * ```
 *
 * @module
 */
import {
  HEADERS,
  type Problem,
  type ProblemFieldError,
  type Run,
  type RunPage,
  type RunRequest,
  type RunStatus,
} from "../contracts/wire.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { backoffWithJitter, MINUTE, SECOND } from "../core/time.ts";

export type { Problem, ProblemFieldError, Run, RunPage, RunRequest, RunStatus };

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

/** How a call retries; every field has a default. */
export interface RetryOptions {
  /** Attempts in all, the first included (default 6; 1 = no retry). */
  maxAttempts?: number;
  /**
   * The call gives up this many ms after it began (default: never): an
   * attempt still waiting then times out, and a retry that could not start
   * before it (a backoff or `Retry-After` past it) is not made.
   */
  deadlineMs?: number;
  /** First backoff ceiling, in ms; it doubles per retry (default 200). */
  baseDelayMs?: number;
  /** Largest backoff ceiling, in ms (default 10 s); a longer `Retry-After` still wins. */
  maxDelayMs?: number;
}

/** What `onRetry` is told before each retry. */
export interface RetryInfo {
  /** The attempt that failed (1 = the first). */
  attempt: number;
  /** How long the client waits before the next attempt. */
  delayMs: number;
  /** Why the attempt failed. */
  error: PoimenProblem | PoimenNetworkError;
}

/** Options of one call. */
export interface RequestOptions extends RetryOptions {
  /** Aborts the call (also while it waits to retry); it rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Longest one attempt may take, in ms (default: the client's, 30 s). */
  timeoutMs?: number;
  /** Called before each retry, e.g. to log it. */
  onRetry?: (info: RetryInfo) => void;
}

/** Options of `admitRun`. */
export interface AdmitOptions extends RequestOptions {
  /**
   * When the body has no `dispatch_key`, generate one (`crypto.randomUUID()`,
   * once per call) so that the call can be retried safely. Without a key and
   * without this, a retry could make a second run, so only answers that say
   * nothing was admitted (408, 429, 503) are retried.
   */
  idempotent?: boolean;
  /** A W3C `traceparent` to pass on (the run's admission joins that trace). */
  traceparent?: string;
}

/** What `admitRun` came to. */
export interface AdmitResult {
  /** The run: the new one, or the one the `dispatch_key` already named. */
  run: Run;
  /**
   * This call made the run: the API answered 201, or 200 for a key this
   * client generated (nobody else knows it, so the run was made by an earlier
   * attempt of this call whose answer was lost).
   */
  created: boolean;
  /** The API answered with an existing run (200, `Idempotent-Replayed: true`). */
  replayed: boolean;
  /**
   * The existing run was asked for with a different body
   * (`Idempotent-Body-Mismatch: true`): the same key was reused for another
   * request, most likely a caller bug.
   */
  bodyMismatch: boolean;
  /** The `dispatch_key` sent (the caller's or the generated one); null when none. */
  dispatchKey: string | null;
  /** How many attempts the call took. */
  attempts: number;
}

/** Which runs `listRuns` returns; all optional. */
export interface ListRunsFilter {
  /** Only the runs of this goal. */
  goal_id?: string;
  /** Only the run asked for with this key. */
  dispatch_key?: string;
  /** Only runs in this status. */
  status?: RunStatus;
  /** Runs per page, 1–500 (default 50). */
  limit?: number;
  /** Start after this cursor (a `next_cursor` of an earlier page). */
  cursor?: string;
}

/** Options of `new PoimenClient`. */
export interface PoimenClientOptions {
  /** Base URL of the API, e.g. `http://127.0.0.1:8080` (a path prefix is kept). */
  url: string;
  /** A tenant token, or a service token together with `tenant`. */
  token: string;
  /** The tenant a service token acts for (sent as `Poimen-Tenant`). */
  tenant?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Longest one attempt may take, in ms (default 30 s). */
  timeoutMs?: number;
  /** Default retry options of every call. */
  retry?: RetryOptions;
}

const DEFAULT_RETRY: Required<Omit<RetryOptions, "deadlineMs">> = {
  maxAttempts: 6,
  baseDelayMs: 200,
  maxDelayMs: 10 * SECOND,
};
const DEFAULT_TIMEOUT = 30 * SECOND;
// A bogus huge Retry-After must not park a caller for days.
const MAX_RETRY_AFTER = 10 * MINUTE;

/** Statuses that say the request was not carried out and may be later. */
function refusedForNow(status: number): boolean {
  return status === 408 || status === 429 || status === 503;
}

/** Whether a failure is worth another attempt of a request that is safe to repeat. */
function transient(error: PoimenProblem | PoimenNetworkError): boolean {
  if (error instanceof PoimenNetworkError) return true;
  return refusedForNow(error.status) || error.status >= 500;
}

/**
 * A client of one poimen API for one tenant. Every method is safe to call
 * concurrently; the client holds no state between calls.
 */
export class PoimenClient {
  readonly #runsUrl: string;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;
  readonly #timeoutMs: number;
  readonly #retry: RetryOptions;

  /** A client of the API at `url`, acting with `token` (and for `tenant`, with a service token). */
  constructor(opts: PoimenClientOptions) {
    // Appended, not resolved: an API behind a path prefix keeps its prefix.
    this.#runsUrl = opts.url.replace(/\/+$/, "") + "/v1/runs";
    this.#headers = { authorization: `Bearer ${opts.token}`, accept: "application/json" };
    if (opts.tenant !== undefined) this.#headers[HEADERS.tenant] = opts.tenant;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT;
    this.#retry = opts.retry ?? {};
  }

  /**
   * Asks for a run (`POST /v1/runs`). With a `dispatch_key` (given, or
   * generated with `{ idempotent: true }`) every attempt sends the same key,
   * so network errors, 408, 429 and 5xx are retried and the call still makes
   * at most one run; without one, only 408, 429 and 503 are. Rejects with a
   * `PoimenProblem` (e.g. 422 `validation` with `errors`), a
   * `PoimenNetworkError` once retries are spent, or the signal's reason.
   */
  async admitRun(body: RunRequest, opts: AdmitOptions = {}): Promise<AdmitResult> {
    const given = body.dispatch_key ?? null;
    const generated = given === null && opts.idempotent === true;
    const dispatchKey = generated ? crypto.randomUUID() : given;
    const payload = JSON.stringify(
      dispatchKey === null ? body : { ...body, dispatch_key: dispatchKey },
    );
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (opts.traceparent !== undefined) headers.traceparent = opts.traceparent;
    const { value: res, attempts } = await this.#retrying(
      opts,
      dispatchKey === null
        ? (e) => e instanceof PoimenProblem && refusedForNow(e.status)
        : transient,
      (signal) => this.#call("POST", this.#runsUrl, signal, { headers, body: payload }),
    );
    const replayed = res.response.headers.get(HEADERS.replayed) === "true";
    return {
      run: res.json as Run,
      created: res.response.status === 201 || (generated && res.response.status === 200),
      replayed,
      bodyMismatch: res.response.headers.get(HEADERS.bodyMismatch) === "true",
      dispatchKey,
      attempts,
    };
  }

  /** One run of the tenant (`GET /v1/runs/{id}`); another tenant's run is a 404 `not-found`. */
  async getRun(runId: string, opts: RequestOptions = {}): Promise<Run> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}`;
    const { value } = await this.#retrying(opts, transient, (s) => this.#call("GET", url, s));
    return value.json as Run;
  }

  /**
   * The tenant's runs, newest first, one page at a time (`GET /v1/runs`),
   * following `next_cursor` until the last page. Each page is fetched when
   * the loop asks for it; stopping the loop stops the fetching.
   *
   * ```ts
   * for await (const page of poimen.listRuns({ goal_id: "g-1", limit: 100 })) {
   *   for (const run of page.runs) console.log(run.run_id, run.status);
   * }
   * ```
   */
  async *listRuns(
    filter: ListRunsFilter = {},
    opts: RequestOptions = {},
  ): AsyncGenerator<RunPage, void, undefined> {
    let cursor = filter.cursor;
    do {
      const query = new URLSearchParams();
      if (filter.goal_id !== undefined) query.set("goal_id", filter.goal_id);
      if (filter.dispatch_key !== undefined) query.set("dispatch_key", filter.dispatch_key);
      if (filter.status !== undefined) query.set("status", filter.status);
      if (filter.limit !== undefined) query.set("limit", String(filter.limit));
      if (cursor !== undefined) query.set("cursor", cursor);
      const url = `${this.#runsUrl}?${query}`;
      const { value } = await this.#retrying(opts, transient, (s) => this.#call("GET", url, s));
      const page = value.json as RunPage;
      yield page;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /**
   * Cancels a run (`POST /v1/runs/{id}/cancel`, idempotent, so retried like
   * a read): resolves with the run, `cancelled` (or still `running` until
   * its handler stops). A run that already finished rejects with a 409
   * `PoimenProblem` and stays as it was.
   */
  async cancelRun(runId: string, opts: RequestOptions = {}): Promise<Run> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}/cancel`;
    const { value } = await this.#retrying(opts, transient, (s) => this.#call("POST", url, s));
    return value.json as Run;
  }

  /** Runs `attempt` until it succeeds, `retry` says no, or the attempts, deadline or signal end it. */
  async #retrying<T>(
    opts: RequestOptions,
    retry: (error: PoimenProblem | PoimenNetworkError) => boolean,
    attempt: (signal: AbortSignal) => Promise<T>,
  ): Promise<{ value: T; attempts: number }> {
    const maxAttempts = opts.maxAttempts ?? this.#retry.maxAttempts ?? DEFAULT_RETRY.maxAttempts;
    const base = opts.baseDelayMs ?? this.#retry.baseDelayMs ?? DEFAULT_RETRY.baseDelayMs;
    const cap = opts.maxDelayMs ?? this.#retry.maxDelayMs ?? DEFAULT_RETRY.maxDelayMs;
    const deadlineMs = opts.deadlineMs ?? this.#retry.deadlineMs;
    const deadline = deadlineMs === undefined ? Infinity : Date.now() + deadlineMs;
    const timeoutMs = opts.timeoutMs ?? this.#timeoutMs;
    for (let n = 1;; n++) {
      opts.signal?.throwIfAborted();
      const timeout = AbortSignal.timeout(Math.max(1, Math.min(timeoutMs, deadline - Date.now())));
      const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
      try {
        return { value: await attempt(signal), attempts: n };
      } catch (err) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        const error = timeout.aborted && !(err instanceof PoimenProblem)
          ? new PoimenNetworkError("timeout", `no answer within ${timeoutMs} ms`, { cause: err })
          : err;
        if (!(error instanceof PoimenProblem || error instanceof PoimenNetworkError)) throw error;
        if (n >= maxAttempts || !retry(error)) throw error;
        // Exponential backoff with full jitter, never shorter than Retry-After:
        // a Retry-After alone would have every client come back at once.
        const retryAfter = error instanceof PoimenProblem ? error.retryAfterMs ?? 0 : 0;
        const delayMs = Math.max(retryAfter, backoffWithJitter(n - 1, base, cap));
        if (Date.now() + delayMs >= deadline) throw error;
        opts.onRetry?.({ attempt: n, delayMs, error });
        await sleep(delayMs, opts.signal);
      }
    }
  }

  /** One attempt: resolves with a 2xx answer and its JSON, rejects with the error it came to. */
  async #call(
    method: "GET" | "POST",
    url: string,
    signal: AbortSignal,
    extra: { headers?: Record<string, string>; body?: string } = {},
  ): Promise<{ response: Response; json: unknown }> {
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(url, {
        method,
        headers: { ...this.#headers, ...extra.headers },
        body: extra.body,
        // A redirected POST would come back as a GET: report it instead.
        redirect: "manual",
        signal,
      });
      // Read to the end, also on errors, so the connection can be reused.
      text = await response.text();
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      throw new PoimenNetworkError("network", `${method} ${url}: ${message}`, { cause: err });
    }
    if (response.status >= 200 && response.status < 300) {
      try {
        return { response, json: JSON.parse(text) };
      } catch (err) {
        throw unexpected(response, text, "the answer is not JSON", err);
      }
    }
    throw problemOf(response, text);
  }
}

/** The `PoimenProblem` an error answer stands for. */
function problemOf(response: Response, text: string): PoimenProblem {
  let body: Partial<Problem> | undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null) body = parsed as Partial<Problem>;
  } catch { /* not JSON: not a poimen problem */ }
  const type = body?.type;
  if (typeof type !== "string" || !type.startsWith(PROBLEM_BASE)) {
    return unexpected(response, text, `HTTP ${response.status}`);
  }
  const STANDARD = ["type", "title", "status", "detail", "instance", "retryable", "errors"];
  const extensions = Object.fromEntries(
    Object.entries(body ?? {}).filter(([k]) => !STANDARD.includes(k)),
  );
  const errors = Array.isArray(body?.errors)
    ? body.errors.filter((e) => typeof e?.path === "string" && typeof e?.message === "string")
    : [];
  return new PoimenProblem({
    code: type.slice(PROBLEM_BASE.length),
    type,
    status: response.status,
    retryable: typeof body?.retryable === "boolean"
      ? body.retryable
      : refusedForNow(response.status) || response.status >= 500,
    title: typeof body?.title === "string" ? body.title : `HTTP ${response.status}`,
    detail: typeof body?.detail === "string" ? body.detail : undefined,
    errors,
    retryAfterMs: parseRetryAfter(response.headers.get("retry-after")),
    extensions,
  });
}

/** An answer that is not poimen's (a proxy, another server, a redirect). */
function unexpected(response: Response, text: string, title: string, cause?: unknown) {
  const snippet = text.trim().slice(0, 200);
  return new PoimenProblem({
    code: PoimenProblem.UNEXPECTED,
    type: "about:blank",
    status: response.status,
    retryable: refusedForNow(response.status) || response.status >= 500,
    title,
    detail: snippet || undefined,
    retryAfterMs: parseRetryAfter(response.headers.get("retry-after")),
    cause,
  });
}

/** Retry-After (delta-seconds or an HTTP date) in ms; undefined when absent or bad. */
function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
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
  return Math.min(Math.max(0, ms), MAX_RETRY_AFTER);
}

/** Resolves after `ms`; rejects with the signal's reason when it aborts first. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, ms);
    function abort() {
      clearTimeout(timer);
      reject(signal!.reason);
    }
    signal?.addEventListener("abort", abort, { once: true });
  });
}
