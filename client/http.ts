/**
 * The HTTP client of poimen: start runs and wait for their results, typed
 * by the workflow's definition, or admit, read, page through and cancel
 * runs by name, with the safe thing as the default.
 *
 * `start(definition, input)` takes the input a definition
 * (`defineWorkflow`, `@poimen/poimen/workflow`) declares, pins the run to
 * its `name@version`, and sends a dispatch key with every attempt, so its
 * retries never make a second run; `result(handle)` waits for the run to
 * end and resolves with its result, typed by the definition's `output`, or
 * rejects with a `PoimenRunError`; `run(definition, input)` is both. The
 * producer imports the definitions only, never a handler's code.
 *
 * `admitRun` is the untyped form (any `workflow_ref`, a bare name included:
 * the workflow's current version). It retries what may pass by itself
 * (network errors, 408, 429, 5xx, 503 with its `Retry-After`) with
 * exponential backoff and full jitter, and with a `dispatch_key` sends the
 * same one every time, so retries never make a second run. Errors are
 * `PoimenProblem`s typed from the API's problem+json `type`.
 *
 * `waitForRun` (and `admitRun` with `waitMs`) hold a request open until the
 * run is final (`Prefer: wait=N`), so nobody polls; `followRun` yields a
 * run's events as they commit (`text/event-stream`), resuming a dropped
 * connection with `Last-Event-ID`.
 *
 * It needs nothing but `fetch`: at run time it loads no third-party code
 * (the run types are plain TypeScript, from contracts/wire.ts, and a
 * definition is only read for its name, version and types), so importing
 * it pulls in neither zod nor any Postgres or Kafka code.
 *
 * ```ts
 * import { PoimenClient } from "@poimen/poimen/client";
 * import { invoice } from "./definitions.ts"; // defineWorkflow({ name, version, input, output })
 *
 * const poimen = new PoimenClient({ url: "http://127.0.0.1:8080", token: Deno.env.get("POIMEN_TOKEN")! });
 * const handle = await poimen.start(invoice, { customer_id: "cus_42", amount_cents: 12_500 });
 * const invoiced = await poimen.result(handle); // typed by invoice's output schema
 * console.log(invoiced.total_cents);
 * ```
 *
 * @module
 */
import {
  HEADERS,
  type Problem,
  type ProblemFieldError,
  type Run,
  type RunBatchResult,
  type RunEvent,
  type RunPage,
  type RunRequest,
  type RunStatus,
  type SignalRequest,
  type WaitingFor,
} from "../contracts/wire.ts";
import { SECOND } from "../core/time.ts";
import { followEvents, type FollowRunOptions, openEventStream } from "./follow_run.ts";
import {
  type ApiAnswer,
  PoimenNetworkError,
  PoimenProblem,
  refusedForNow,
  type SendInit,
} from "./problems.ts";
import { jsonAnswer, runsQuery, sendRequest } from "./transport.ts";
import { sendSignal, type SignalResult } from "./signal.ts";
import { type AdmitBatchOptions, sendBatch } from "./batch.ts";
import {
  type RequestOptions,
  retrying,
  type RetryOptions,
  retrySettings,
  transient,
} from "./retry.ts";
import { waitForFinal, type WaitForRunOptions, waitSeconds } from "./wait_for_run.ts";
import type { AdmitOptions, AdmitResult, ListRunsFilter, PoimenClientOptions } from "./options.ts";
import {
  type ResultOptions,
  type RunHandle,
  type RunOptions,
  runResult,
  startAndWait,
  type StartOptions,
  startRun,
} from "./workflow_runs.ts";
import type { WorkflowDefinition } from "../contracts/workflow.ts";

export type {
  Problem,
  ProblemFieldError,
  Run,
  RunEvent,
  RunPage,
  RunRequest,
  RunStatus,
  WaitingFor,
};
export type * from "./types.ts";
export type * from "./options.ts";
export {
  PoimenRunError,
  type ResultOptions,
  type RunHandle,
  type RunOptions,
  type StartOptions,
} from "./workflow_runs.ts";
export type {
  DeclaredSchedule,
  Schema,
  SignalSchemas,
  WorkflowDefinition,
  WorkflowInput,
  WorkflowResult,
} from "../contracts/workflow.ts";
export type { ConcurrencyLimit, DebounceOptions } from "../contracts/workflow.ts";
export {
  type ApiAnswer,
  MAX_RETRY_AFTER_MS,
  parseRetryAfter,
  type PoimenProblemInit,
  problemFromAnswer,
  type SendInit,
} from "./problems.ts";
export { PoimenNetworkError, PoimenProblem };
export { type SignalResult, signalRun } from "./signal.ts";
export * from "./batch.ts";

const DEFAULT_TIMEOUT = 30 * SECOND;

/**
 * A client of one poimen API for one tenant. Every method is safe to call
 * concurrently; the client holds no state between calls.
 */
export class PoimenClient {
  readonly #baseUrl: string;
  readonly #runsUrl: string;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;
  readonly #timeoutMs: number;
  readonly #retry: RetryOptions;

  /** A client of the API at `url`, acting with `token` (and for `tenant`, with a service token). */
  constructor(opts: PoimenClientOptions) {
    // Appended, not resolved: an API behind a path prefix keeps its prefix.
    this.#baseUrl = opts.url.replace(/\/+$/, "");
    this.#runsUrl = this.#baseUrl + "/v1/runs";
    this.#headers = { authorization: `Bearer ${opts.token}`, accept: "application/json" };
    if (opts.tenant !== undefined) this.#headers[HEADERS.tenant] = opts.tenant;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT;
    this.#retry = opts.retry ?? {};
  }

  /**
   * Starts a run of `workflow` with `input` (`POST /v1/runs`), both typed
   * by the definition: an input its schema does not take does not compile.
   * The run is pinned to the definition's `name@version`, whose types these
   * are. A dispatch key (`opts.dispatchKey`, or one generated per call) goes
   * with every attempt, so network errors, 408, 429 and 5xx are retried and
   * the call makes at most one run. Resolves with a handle for `result`;
   * rejects with a `PoimenProblem` (a 422 `validation` names the field), a
   * `PoimenNetworkError` once retries are spent, or the signal's reason.
   */
  start<In, O>(
    workflow: WorkflowDefinition<unknown, O, In, unknown>,
    input: NoInfer<In>,
    opts: StartOptions = {},
  ): Promise<RunHandle<O>> {
    return startRun(this, workflow, input, opts);
  }

  /**
   * Waits for a run to end (as `waitForRun` does, by default for as long as
   * it takes) and resolves with its result, typed by its definition's
   * `output`; rejects with a `PoimenRunError` when it failed, was cancelled
   * or had not ended within `timeoutMs`. Takes the handle `start` gave, or
   * the definition and a run id (a `TypeError` when the run is of another
   * `name@version`).
   */
  result<O>(handle: RunHandle<O>, opts?: ResultOptions): Promise<O>;
  /** The result of run `runId` of `workflow`; see the other form. */
  result<O>(
    workflow: WorkflowDefinition<unknown, O, unknown, unknown>,
    runId: string,
    opts?: ResultOptions,
  ): Promise<O>;
  result<O>(
    target: RunHandle<O> | WorkflowDefinition<unknown, O, unknown, unknown>,
    runIdOrOpts?: string | ResultOptions,
    opts: ResultOptions = {},
  ): Promise<O> {
    if (typeof runIdOrOpts === "string") {
      return runResult(this, target as WorkflowDefinition<unknown, O>, runIdOrOpts, opts);
    }
    const handle = target as RunHandle<O>;
    return runResult(this, handle.workflow, handle.runId, runIdOrOpts ?? {}, handle.run);
  }

  /**
   * Starts a run and waits for its result: `start`, then `result`. Resolves
   * with the result, typed by the definition's `output`; rejects as either.
   */
  run<In, O>(
    workflow: WorkflowDefinition<unknown, O, In, unknown>,
    input: NoInfer<In>,
    opts: RunOptions = {},
  ): Promise<O> {
    return startAndWait(this, workflow, input, opts);
  }

  /**
   * Asks for a run (`POST /v1/runs`), untyped: any `workflow_ref`, `name`
   * (its current version) or `name@version`; `start` is the typed form.
   * With a `dispatch_key` (given, or
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
    const wait = waitSeconds(opts.waitMs ?? 0);
    if (wait > 0) headers.prefer = `wait=${wait}`;
    const { value: res, attempts } = await this.#retrying(
      wait > 0 ? { ...opts, timeoutMs: (opts.timeoutMs ?? this.#timeoutMs) + wait * SECOND } : opts,
      dispatchKey === null
        ? (e) => e instanceof PoimenProblem && refusedForNow(e.status)
        : transient,
      (signal) => this.#call("POST", this.#runsUrl, signal, { headers, body: payload }),
    );
    const replayed = res.answer.headers.get(HEADERS.replayed) === "true";
    const run = res.json as Run;
    return {
      run,
      // A 200 that joined a debounced run is no replay: this call made no run.
      created: res.answer.status === 201 || (generated && replayed),
      replayed,
      debounced: run.debounced === true,
      bodyMismatch: res.answer.headers.get(HEADERS.bodyMismatch) === "true",
      dispatchKey,
      attempts,
    };
  }

  /**
   * Asks for up to `RUN_BATCH_MAX_ITEMS` runs in one request (`POST /v1/runs`
   * with an array) and resolves with each item's result, in order: its run
   * (`created`, `replayed`) or its problem. See client/batch.ts.
   */
  admitRuns(items: RunRequest[], opts: AdmitBatchOptions = {}): Promise<RunBatchResult[]> {
    return sendBatch(
      items,
      opts,
      (body, headers, retry) =>
        this.#retrying(opts, retry, (s) => this.#call("POST", this.#runsUrl, s, { headers, body })),
    );
  }

  /**
   * One run of the tenant (`GET /v1/runs/{id}`), with `input` and `waiting_for`;
   * another tenant's run is a 404 `not-found`.
   */
  async getRun(runId: string, opts: RequestOptions = {}): Promise<Run> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}`;
    const { value } = await this.#retrying(opts, transient, (s) => this.#call("GET", url, s));
    return value.json as Run;
  }

  /**
   * Waits for a run to be final (succeeded, failed or cancelled), asking the
   * API to hold each `GET /v1/runs/{id}` until it is (`Prefer: wait=N`, up
   * to 60 s each, again until `timeoutMs` passed). Resolves with the run as
   * last seen, final or not: when the time ran out first it is still
   * `queued` or `running`, so check `status`. Network errors, 408, 429 and
   * 5xx are retried by the client's rules (a `busy` 503's `Retry-After`
   * included); a deadline reached while waiting or retrying resolves with
   * the run last seen. Rejects with a `PoimenProblem` (e.g. 404
   * `not-found`), a `PoimenNetworkError` once retries are spent (or when
   * not even one read succeeded), or the signal's reason.
   *
   * ```ts
   * const run = await poimen.waitForRun(runId, { timeoutMs: 5 * 60_000 });
   * if (run.status === "succeeded") console.log(run.result);
   * else if (run.status === "failed") console.error(run.error);
   * else console.log("still", run.status);
   * ```
   */
  async waitForRun(runId: string, opts: WaitForRunOptions): Promise<Run> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}`;
    const { maxAttempts } = retrySettings(opts, this.#retry);
    return await waitForFinal(opts, maxAttempts, async (wait, request, counted) => {
      const headers = wait > 0 ? { prefer: `wait=${wait}` } : undefined;
      const { value } = await this.#retrying(
        { ...request, timeoutMs: this.#timeoutMs + wait * SECOND },
        transient,
        (s) => counted(this.#call("GET", url, s, { headers })),
      );
      return { run: value.json as Run, waited: value.answer.headers.has("preference-applied") };
    });
  }

  /**
   * The run's events as they happen (`GET /v1/runs/{id}/events` as
   * `text/event-stream`): first those it already has, then each as it
   * commits, each yielded once and in order; the iteration ends after the
   * run's final event (`run.succeeded`, `run.failed`, `run.cancelled`).
   * A connection that drops (or sends nothing, not even its keep-alive, for
   * `idleTimeoutMs`) is replaced after the client's backoff, with
   * `Last-Event-ID` set to the last seq yielded, so nothing is missed or
   * repeated; opening each connection is retried like `getRun` (a `busy`
   * 503's `Retry-After` included), and the iteration rejects once that
   * fails for good (a 404 `not-found` at once). Events the API purged
   * (published, after a while) are not there to yield. `break` ends it and
   * closes the connection; the signal aborts it with its reason.
   *
   * ```ts
   * for await (const event of poimen.followRun(runId)) {
   *   console.log(event.seq, event.type, event.payload);
   * }
   * ```
   */
  followRun(runId: string, opts: FollowRunOptions = {}): AsyncIterableIterator<RunEvent> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}`;
    const request: RequestOptions = { ...opts, timeoutMs: opts.connectTimeoutMs };
    const { baseDelayMs, maxDelayMs } = retrySettings(opts, this.#retry);
    return followEvents({
      open: async (after, signal) => {
        const headers: Record<string, string> = { ...this.#headers, accept: "text/event-stream" };
        if (after > 0) headers["last-event-id"] = String(after);
        const open = (attempt: AbortSignal) =>
          openEventStream(this.#fetch, `${url}/events`, headers, signal, attempt);
        return (await this.#retrying({ ...request, signal }, transient, open)).value;
      },
      getRun: (signal) => this.getRun(runId, { ...request, signal }),
      baseDelayMs,
      maxDelayMs,
    }, opts);
  }

  /**
   * The tenant's runs, newest first, one page at a time (`GET /v1/runs`),
   * following `next_cursor` until the last page. A page holds at most
   * `limit` runs and at most 1 MiB of JSON; runs come without `input` and
   * `result` unless `fields` asks for them. Each page is fetched when
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
      const url = `${this.#runsUrl}?${runsQuery(filter, cursor)}`;
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

  /**
   * Sends signal `body.name` (with `payload`) to run `runId`
   * (`POST /v1/runs/{id}/signals`): resolves once the run's mailbox holds
   * it (a wait of its handler takes it; a run waiting for it is woken), with
   * `created` (this call stored it) and `replayed` (the API had this
   * `signal_id` already). One `signal_id` (given, or generated per call)
   * goes with every attempt, so network errors, 408, 429 and 5xx are
   * retried and the call makes at most one signal. Rejects with a
   * `PoimenProblem` (404 `not-found`; 409 `run-finished`: the run is final;
   * 422 `validation`), a `PoimenNetworkError` once retries are spent, or
   * the signal's reason.
   *
   * ```ts
   * await poimen.signal(runId, { name: "approval", payload: { ok: true } });
   * ```
   */
  signal(runId: string, body: SignalRequest, opts: RequestOptions = {}): Promise<SignalResult> {
    const url = `${this.#runsUrl}/${encodeURIComponent(runId)}/signals`;
    const headers = { "content-type": "application/json" };
    return sendSignal(
      body,
      (json) =>
        this.#retrying(opts, transient, (s) => this.#call("POST", url, s, { headers, body: json })),
    );
  }

  /** Runs `attempt` until it succeeds, `retry` says no, or the attempts, deadline or signal end it. */
  #retrying<T>(
    opts: RequestOptions,
    retry: (error: PoimenProblem | PoimenNetworkError) => boolean,
    attempt: (signal: AbortSignal) => Promise<T>,
  ): Promise<{ value: T; attempts: number }> {
    return retrying(opts, this.#retry, this.#timeoutMs, retry, attempt);
  }

  /**
   * One attempt at a request to the API, with no retry and no timeout of its
   * own (`signal` bounds it): the building block of the methods above, public
   * for callers that classify answers themselves (poimen's inbox relay does).
   * `path` is appended to the client's URL (e.g. `/v1/runs`); the client's
   * `authorization` (and `Poimen-Tenant`) headers are sent, `init.headers`
   * added to them. Resolves with any answer the API gave, whatever its
   * status, read to the end; rejects with a `PoimenNetworkError` when none
   * came, or with the signal's reason.
   */
  send(method: string, path: string, init: SendInit = {}): Promise<ApiAnswer> {
    return sendRequest(this.#fetch, this.#baseUrl + path, this.#headers, method, init);
  }

  /** One attempt: resolves with a 2xx answer and its JSON, rejects with the error it came to. */
  #call(
    method: "GET" | "POST",
    url: string,
    signal: AbortSignal,
    extra: { headers?: Record<string, string>; body?: string } = {},
  ): Promise<{ answer: ApiAnswer; json: unknown }> {
    const path = url.slice(this.#baseUrl.length);
    return jsonAnswer(
      `${method} ${url}`,
      signal,
      () => this.send(method, path, { ...extra, signal }),
    );
  }
}
