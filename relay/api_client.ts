/**
 * The relay's calls of `POST /v1/runs` and `POST /v1/runs/{id}/signals`, and
 * the classification of what came back. The relay is an HTTP client of the API like any other caller, and
 * uses the public client's one-attempt call (`PoimenClient.send`) to be one:
 * that is what makes "no bypass" mechanical (the README's "The inbox relay").
 */
import { activeTraceparent, inSpan, remoteContext } from "../core/tracing.ts";
import { HEADERS, RELAY_KEY_PREFIX } from "../contracts/runs.ts";
import { isTraceparent } from "../contracts/trace_context.ts";
import { type ErrorCode, ERRORS } from "../core/errors.ts";
import { backoffWithJitter } from "../core/time.ts";
import { PoimenClient } from "../client/http.ts";
import { type ApiAnswer, PoimenProblem, problemFromAnswer } from "../client/problems.ts";
import { AdmitBatcher, type AdmitBatchOptions } from "./admit_batcher.ts";

/** Longest problem detail kept (it ends up in a Kafka header). */
const MAX_DETAIL = 500;

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
    /** A metric label: one of `TransientReason`. */
    reason: TransientReason;
    status?: number;
    /** The poimen problem code, when the answer was a poimen problem. */
    problem?: string;
    /** From Retry-After, when the API sent one. */
    retryAfterMs?: number;
    detail: string;
  };

/**
 * Why an attempt is retried, in the one vocabulary of codes: the code of the
 * API's problem (a row of the one error table, e.g. `database-unavailable`,
 * `unauthorized`, `unknown-workflow`), or the client's own for an attempt
 * with no poimen answer: `network`, `timeout` (`PoimenNetworkError`) and
 * `unexpected-response` (a proxy, another server, a code this relay does not
 * know). A bounded set, used as a metric label.
 */
export type TransientReason = ErrorCode | "network" | "timeout" | "unexpected-response";

/**
 * The poimen problem codes that make a dispatch message permanently
 * unadmittable as it is: the value itself is wrong (not JSON, not the schema,
 * a value Postgres cannot store, too large, or sent with a type the API
 * refuses), so retrying cannot help
 * and the message is dead-lettered. A code is permanent only when it is on
 * this list AND the problem body says `retryable: false`; anything else is
 * retried. Deliberately NOT here:
 * - `unknown-workflow`: no worker has ever registered the workflow in the
 *   catalog (the API re-reads the catalog before saying so, so an API that
 *   has not heard of a new version is not the cause). A dispatch producer may
 *   start sending a new workflow before the first worker hosting it started:
 *   retried for a grace period, then dead-lettered (see
 *   `InboxRelayOptions.unknownWorkflowGraceMs`).
 * - `unauthorized` / `forbidden`: the relay's token or the tenant row is
 *   wrong, an operator's fix; retried loudly, never shredding the queue.
 * - `not-found`, `database-unavailable`, `internal` and codes added later:
 *   not a verdict on the message.
 */
export const PERMANENT_PROBLEMS: ReadonlySet<string> = new Set<ErrorCode>([
  "bad-json",
  "validation",
  "invalid-data",
  "body-too-large",
  "unsupported-media-type",
]);

/**
 * The poimen problem an error answer stands for, or undefined when it is not
 * one of poimen's (a proxy, another server): only poimen's word on a message
 * may condemn it.
 */
export function poimenProblem(answer: ApiAnswer): PoimenProblem | undefined {
  const problem = problemFromAnswer(answer);
  return problem.code === PoimenProblem.UNEXPECTED ? undefined : problem;
}

/**
 * How an answer is handled (DESIGN.md, Inbox relay): by what the API says,
 * not by the bare status. Permanent only for a poimen problem on
 * `PERMANENT_PROBLEMS` that is not retryable; a 4xx that is not a poimen
 * problem (a wrong `API_URL`, a proxy) is retried, never dead-lettered.
 */
export function classify(
  status: number,
  problem: Pick<PoimenProblem, "code" | "retryable"> | undefined,
  permanent: ReadonlySet<string> = PERMANENT_PROBLEMS,
): { kind: Outcome["kind"]; reason: string } {
  // The API answers a replayed dispatch_key with 200 and a new run with 201;
  // any other 2xx still admitted the message.
  if (status === 200) return { kind: "replayed", reason: "replayed" };
  if (status >= 200 && status < 300) return { kind: "created", reason: "created" };
  if (
    problem && status >= 400 && status < 500 && permanent.has(problem.code) &&
    problem.retryable === false
  ) {
    return { kind: "permanent", reason: problem.code };
  }
  // Everything else is retried, never dead-lettered, under the code that
  // says why: a misconfigured token or a missing tenant row must not shred
  // the queue (retried, loudly, until fixed), a new workflow may not be known
  // to every API yet, and 1xx/3xx or a stranger's 4xx means API_URL points
  // at something else.
  const known = problem !== undefined && Object.hasOwn(ERRORS, problem.code);
  return {
    kind: "transient",
    reason: known ? problem.code as ErrorCode : PoimenProblem.UNEXPECTED,
  };
}

/**
 * How long to wait before retry `attempt` (1 = the first retry): exponential
 * backoff with full jitter, never shorter than the server's Retry-After. A
 * Retry-After alone would have every in-flight message hammer a struggling
 * API at its fixed pace (the API says `Retry-After: 1` on every 503).
 */
export function retryDelay(
  attempt: number,
  retryAfterMs: number | undefined,
  baseMs: number,
  capMs: number,
  random: () => number = Math.random,
): number {
  return Math.max(retryAfterMs ?? 0, backoffWithJitter(attempt - 1, baseMs, capMs, random));
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

/** A message value made ready to post, or why it can never be. */
export type PreparedBody =
  | {
    body: Uint8Array;
    derivedKey?: string;
    /** Not a JSON object: posted alone, never in a batch, for the API to judge as it is. */
    alone?: true;
  }
  | { error: string };

/** The dispatch key of a keyless message: where it sits in Kafka, which redelivery never changes. */
export function derivedDispatchKey(topic: string, partition: number, offset: bigint): string {
  return `${RELAY_KEY_PREFIX}${topic}/${partition}/${offset}`;
}

/**
 * The body to post for a message value. Not JSON: an error (dead-lettered
 * locally). A JSON object without `dispatch_key` (or with null) gets the key
 * `derivedKey`, so a redelivered keyless message replays its run instead of
 * making another one: exactly one run per dispatch message, keyed or not.
 * The key is appended to the text (not re-serialised), so everything else in
 * the value reaches the API byte for byte; an explicit `"dispatch_key":null`
 * is overridden by the appended member (JSON.parse keeps the last one).
 * Anything else (an array, a string) is posted verbatim for the API to judge.
 */
export function prepareBody(value: Uint8Array, derivedKey: string): PreparedBody {
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(value);
  } catch {
    return { error: "the value is not UTF-8" };
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    return { error: `the value is not JSON: ${(err as Error).message}` };
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    return { body: value, alone: true };
  }
  const obj = parsed as Record<string, unknown>;
  if (Object.hasOwn(obj, "dispatch_key") && obj.dispatch_key !== null) return { body: value };
  const member = `"dispatch_key":${JSON.stringify(derivedKey)}`;
  const end = text.lastIndexOf("}");
  const rest = text.slice(0, end);
  const body = Object.keys(obj).length === 0 ? `{${member}}` : `${rest},${member}}`;
  return { body: new TextEncoder().encode(body), derivedKey };
}

/**
 * What a dead letter's detail says of an error answer: the problem's detail
 * (or title) and its failing fields, or the start of whatever else came back.
 */
export function problemDetail(problem: PoimenProblem): string {
  let detail = problem.detail ?? problem.title;
  if (problem.errors.length > 0) {
    detail += ": " + problem.errors.map((e) => `${e.path}: ${e.message}`).join("; ");
  }
  return truncate(detail);
}

function truncate(text: string): string {
  return text.length > MAX_DETAIL ? text.slice(0, MAX_DETAIL - 1) + "…" : text;
}

const TRACESTATE = /^[\x20-\x7e]{0,512}$/;

/**
 * The trace headers to pass on, from a message's headers: only a valid
 * `traceparent` (contracts/trace_context.ts; and with it a `tracestate` of printable ASCII,
 * at most 512 characters), as W3C Trace Context says a receiver must treat
 * anything else. A publisher's garbage (a newline, a non-Latin-1 character)
 * would otherwise make every attempt fail before it is sent, forever.
 */
export function traceHeaders(
  traceparent: string | undefined,
  tracestate: string | undefined,
): { traceparent?: string; tracestate?: string } {
  if (traceparent === undefined || !isTraceparent(traceparent)) return {};
  return tracestate && TRACESTATE.test(tracestate) ? { traceparent, tracestate } : { traceparent };
}

/** One message to admit. */
export interface AdmitRequest {
  tenant: string;
  /** The message value, sent verbatim as the body. */
  body: Uint8Array;
  /** `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  /** Passed on only when well-formed (see `traceHeaders`). */
  traceparent?: string;
  tracestate?: string;
  /** Never batched (see `PreparedBody`). */
  alone?: boolean;
}

/** One signal message to send: its run, and the signal body (name, payload, signal_id). */
export interface SignalSendRequest extends AdmitRequest {
  runId: string;
}

/**
 * The problem codes that make a signal message permanently unsendable: those
 * of a dispatch message (the body is wrong), and a run that is not there
 * (`not-found`: unknown, purged, or another tenant's) or final
 * (`run-finished`: it takes no signal any more). Whatever the relay retries,
 * neither run comes back to take it.
 */
export const SIGNAL_PERMANENT_PROBLEMS: ReadonlySet<string> = new Set<string>([
  ...PERMANENT_PROBLEMS,
  "not-found" satisfies ErrorCode,
  "run-finished" satisfies ErrorCode,
]);

/** Options of `ApiClient`. */
export interface ApiClientOptions {
  apiUrl: string;
  token: string;
  timeoutMs: number;
  /** Dispatch messages of a tenant sent together as a batch (relay/admit_batcher.ts); alone without. */
  batch?: AdmitBatchOptions;
}

/**
 * Posts dispatch messages to `POST /v1/runs` and signal messages to `POST
 * /v1/runs/{id}/signals`; never throws, every failure is an `Outcome`.
 */
export class ApiClient {
  readonly #client: PoimenClient;
  readonly #timeoutMs: number;
  readonly #batches: AdmitBatcher | undefined;

  constructor(opts: ApiClientOptions) {
    // The tenant differs per message: sent per call, not fixed on the client.
    this.#client = new PoimenClient({ url: opts.apiUrl, token: opts.token });
    this.#timeoutMs = opts.timeoutMs;
    this.#batches = opts.batch && opts.batch.maxItems > 1
      ? new AdmitBatcher(opts.batch, {
        single: (item) =>
          this.#post("/v1/runs", item.req, item.trace, PERMANENT_PROBLEMS, item.signal),
        send: (path, headers, body, signal) => this.#send(path, headers, body, signal),
      })
      : undefined;
  }

  /**
   * One attempt; `signal` abandons it (shutdown). With tracing on, the
   * attempt is a span in the message's trace, and the request carries it.
   */
  admit(req: AdmitRequest, signal?: AbortSignal): Promise<Outcome> {
    return inSpan(
      "poimen relay admit",
      remoteContext(req.traceparent, req.tracestate),
      { "poimen.tenant": req.tenant, "poimen.source": req.source },
      () => {
        // Read here, in the message's span: a batch is sent from another context.
        const trace = messageTrace(req);
        return this.#batches && !req.alone
          ? this.#batches.admit({ req, trace, signal })
          : this.#post("/v1/runs", req, trace, PERMANENT_PROBLEMS, signal);
      },
    );
  }

  /** One attempt at sending a signal message; as `admit`, but a gone or final run is permanent. */
  signal(req: SignalSendRequest, signal?: AbortSignal): Promise<Outcome> {
    const path = `/v1/runs/${encodeURIComponent(req.runId)}/signals`;
    return inSpan(
      "poimen relay signal",
      remoteContext(req.traceparent, req.tracestate),
      { "poimen.tenant": req.tenant, "poimen.source": req.source, "poimen.run_id": req.runId },
      () => this.#post(path, req, messageTrace(req), SIGNAL_PERMANENT_PROBLEMS, signal),
    );
  }

  async #post(
    path: string,
    req: AdmitRequest,
    trace: TraceHeaders,
    permanent: ReadonlySet<string>,
    signal?: AbortSignal,
  ): Promise<Outcome> {
    const headers: Record<string, string> = {
      "content-type": "application/json",
      [HEADERS.tenant]: req.tenant,
      [HEADERS.source]: req.source,
      ...trace,
    };
    const answer = await this.#send(path, headers, req.body, signal);
    return "kind" in answer ? answer : outcomeOf(answer, permanent);
  }

  /** One request; a failure to get any answer is a transient `Outcome`. */
  async #send(
    path: string,
    headers: Record<string, string>,
    body: Uint8Array,
    signal?: AbortSignal,
  ): Promise<ApiAnswer | Outcome> {
    // One controller per attempt, its timer cleared with the answer: an
    // AbortSignal.timeout() would outlive the call by the whole timeout
    // (holding the request and its response until then: at a few thousand
    // calls a second, tens of thousands of them), and AbortSignal.any()
    // costs a WeakRef and a finalizer per call.
    const abort = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      abort.abort();
    }, this.#timeoutMs);
    const onAbort = () => abort.abort();
    if (signal?.aborted) abort.abort();
    else signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await this.#client.send("POST", path, { headers, body, signal: abort.signal });
    } catch (err) {
      timedOut &&= !signal?.aborted;
      return {
        kind: "transient",
        reason: timedOut ? "timeout" : "network",
        detail: timedOut
          ? `no answer within ${this.#timeoutMs} ms`
          : (err instanceof Error ? err.message : String(err)),
      };
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }
}

/** The trace headers a message's request carries. */
export type TraceHeaders = { traceparent?: string; tracestate?: string };

/** The relay's span when tracing is on, else the message's own trace. */
function messageTrace(req: AdmitRequest): TraceHeaders {
  const traced = activeTraceparent();
  return traced ? { traceparent: traced } : traceHeaders(req.traceparent, req.tracestate);
}

/** What an answer to one message's request comes to (a batch item's too: relay/admit_batcher.ts). */
export function outcomeOf(answer: ApiAnswer, permanent: ReadonlySet<string>): Outcome {
  if (answer.status >= 200 && answer.status < 300) {
    return { kind: answer.status === 200 ? "replayed" : "created", status: answer.status };
  }
  const problem = problemFromAnswer(answer);
  const poimen = problem.code === PoimenProblem.UNEXPECTED ? undefined : problem;
  const verdict = classify(answer.status, poimen, permanent);
  if (verdict.kind === "permanent") {
    return {
      kind: "permanent",
      reason: verdict.reason,
      status: answer.status,
      detail: problemDetail(problem),
    };
  }
  return {
    kind: "transient",
    reason: verdict.reason as TransientReason,
    status: answer.status,
    problem: poimen?.code,
    retryAfterMs: problem.retryAfterMs,
    detail: problemDetail(problem),
  };
}
