/**
 * The runs API's wire format as plain TypeScript, with no dependency: the
 * types of what goes over HTTP and Kafka, and the protocol's header names.
 * The zod schemas in runs.ts validate the same shapes; it re-exports these
 * names and the type checker holds the two together (a field added to a
 * schema and not here, or the other way round, fails `deno check`). The
 * clients (client/) take their types from here, so they load no
 * third-party code and their documentation shows real fields.
 */
import type { RunEventPayloads, RunEventType } from "./event_types.ts";

export type {
  ChildFinishedPayload,
  ChildStartedPayload,
  RunAdmittedPayload,
  RunCancelledPayload,
  RunError,
  RunEventPayloads,
  RunEventType,
  RunFailedPayload,
  RunReleasedPayload,
  RunRetryingPayload,
  RunStartedPayload,
  RunSucceededPayload,
  RunWaitingPayload,
  RunWokenPayload,
  SignalReceivedPayload,
  StepCompletedPayload,
  StepFailedPayload,
} from "./event_types.ts";

/** The admission request: `POST /v1/runs` body and `poimen.<tenant>.dispatch` message value. */
export interface RunRequest {
  /** `name` (its current version, pinned at admission) or `name@version`. */
  workflow_ref: string;
  /** The workflow's input (any JSON); null when absent. */
  input?: unknown;
  /** Groups runs that serve one goal (printable, at most 255 characters). */
  goal_id?: string | null;
  /**
   * Caller-chosen identity of the intended run: the same (tenant,
   * dispatch_key) makes one run (printable, at most 255 characters; the
   * prefix `kafka:` is the inbox relay's own).
   */
  dispatch_key?: string | null;
  /**
   * Start later: no attempt before this time. RFC 3339 with an offset, at
   * most 365 days ahead, a year from 1970 on, an offset within ±15:59; a
   * time in the past means now.
   */
  run_after?: string | null;
  /**
   * An integer from -10 to 10 (default 0): within the tenant, a higher
   * priority starts first. A replay of the dispatch key keeps the first
   * run's priority.
   */
  priority?: number | null;
}

/** Where a run is in its lifecycle. */
export type RunStatus = "queued" | "running" | "waiting" | "succeeded" | "failed" | "cancelled";

/**
 * What a queued run waits for (`waiting_for` of `GET /v1/runs/{run_id}`),
 * checked in this order: `worker`, no running worker hosts its workflow
 * version; `schedule`, its run_after has not come; `concurrency`, its
 * workflow's concurrency limit for its key is reached; `slot`, it is due
 * and hosted, and waits for a free worker slot. What a waiting run
 * (suspended) waits for: `sleep`, the end of a sleep; `signal`, a signal;
 * `children`, its children (`result()`, `ctx.map`).
 */
export interface WaitingFor {
  /**
   * A queued run: `worker`, `schedule`, `concurrency` or `slot`; a waiting
   * run: `sleep` (a long `ctx.sleep`), `signal` (`ctx.waitForSignal`) or
   * `children` (a child's `result()`, `ctx.map`).
   */
  reason: "worker" | "schedule" | "concurrency" | "slot" | "sleep" | "signal" | "children";
  /** On `worker`: the version it waits for, `name@version`. */
  workflow?: string;
  /**
   * On `schedule`: when it is due (its run_after); on `sleep`: when it ends;
   * on `signal`: when the wait times out (absent: never).
   */
  until?: string;
  /** On `sleep`: the sleep's name; on `signal`: the signal's name; on `children`: the call's. */
  name?: string;
  /** On `concurrency`: the run's concurrency key ('' when the limit is per tenant). */
  key?: string;
  /** On `concurrency`: the limit. */
  limit?: number;
  /** On `concurrency`: how many of the key's runs are running now. */
  running?: number;
  /** The same for people. */
  detail: string;
}

/** A run as the API returns it. */
export interface Run {
  /** The run's id (a UUID). */
  run_id: string;
  /** The tenant it belongs to. */
  tenant_id: string;
  /** The workflow as asked (`name` or `name@version`). */
  workflow_ref: string;
  /** The resolved workflow name. */
  workflow: string;
  /** The version pinned at admission. */
  workflow_version: number;
  /** Where it is in its lifecycle. */
  status: RunStatus;
  /** The goal it serves, if any. */
  goal_id: string | null;
  /** The identity it was asked for with, if any. */
  dispatch_key: string | null;
  /** `http:<token name>` or `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  /** Attempts started so far. */
  attempts: number;
  /** Attempts allowed before it fails for good. */
  max_attempts: number;
  /** The input: on `GET /v1/runs/{run_id}` and a cancel; in a list only with `fields=input`. */
  input?: unknown;
  /**
   * What the workflow returned, once succeeded (null before): always on one
   * run; in a list only with `fields=result`.
   */
  result?: unknown;
  /** Why it failed, once failed. */
  error: unknown;
  /** RFC 3339 timestamps. */
  created_at: string;
  /** When it last changed. */
  updated_at: string;
  /** When its current or last attempt started. */
  started_at: string | null;
  /** When it reached a final status. */
  finished_at: string | null;
  /** When it is due: no attempt starts before. */
  run_after: string;
  /** When a cancel was asked for; a running run ends `cancelled` once its worker sees it. */
  cancel_requested_at: string | null;
  /** -10..10: within the tenant, a higher priority starts first. */
  priority: number;
  /**
   * Its concurrency key when its workflow version declares a concurrency
   * limit ('' for a limit per tenant); null: not limited.
   */
  concurrency_key: string | null;
  /** The run whose handler started this one (a child run); null: a caller admitted it. */
  parent_run_id: string | null;
  /** The root of its tree of runs; null for a run a caller admitted (a root itself). */
  root_run_id: string | null;
  /** A child started with `{ detached: true }`: a cancel of its ancestors does not reach it. */
  detached: boolean;
  /**
   * Only on an admission's answer for a debounced workflow: true when the
   * request joined the pending run of its debounce key (200), false when it
   * made the run (201); absent on a replay.
   */
  debounced?: boolean;
  /** Only on a schedule's occurrence (dispatch key `schedule:<id>:<instant>`): its schedule. */
  schedule_id?: string;
  /** Only on a schedule's occurrence: the occurrence's UTC instant (RFC 3339). */
  scheduled_for?: string;
  /**
   * Only on `GET /v1/runs/{run_id}`: null unless queued or waiting; what the
   * run waits for.
   */
  waiting_for?: WaitingFor | null;
  /**
   * Only on `GET /v1/runs/{run_id}`: its child runs, newest first, the first
   * 100; more by `GET /v1/runs?parent_run_id=<run_id>&cursor=<next_cursor>`.
   */
  children?: {
    runs: { run_id: string; status: RunStatus; dispatch_key: string }[];
    next_cursor: string | null;
  };
  /** Only on `GET /v1/runs/{run_id}`: its durable calls in call order (the first 1,000). */
  steps?: RunStep[];
}

/** One durable call of a run (`ctx.step`, `ctx.sleep`, `ctx.waitForSignal`), without its result. */
export interface RunStep {
  /** Its name: `name`, `name#2`… in call order. */
  name: string;
  /** Its place in the run's call order, from 1. */
  seq: number;
  /** `step`, `sleep` or `signal`. */
  kind: "step" | "sleep" | "signal";
  /** `waiting` (a sleep or wait under way), `completed`, or `failed` (its last try threw). */
  status: "waiting" | "completed" | "failed";
  /** Its result's size as JSON, in bytes (the result itself is not shown). */
  size: number | null;
  /** A sleep's end, a wait's timeout. */
  until: string | null;
  /** A wait's signal name. */
  signal_name: string | null;
  /** The attempt that wrote it last. */
  attempt: number;
  /** A failed step's error message (at most 1,000 characters). */
  error: string | null;
  /** When it was first recorded. */
  started_at: string;
  /** When it completed. */
  completed_at: string | null;
}

/** A signal for a run: `POST /v1/runs/{run_id}/signals`. */
export interface SignalRequest {
  /** The signal's name, what `ctx.waitForSignal(name)` waits for: 1-200 characters, no `#`. */
  name: string;
  /** Any JSON (null when absent). */
  payload?: unknown;
  /**
   * Its identity: the same (run, name, signal_id) is one signal, sent again
   * a replay. 1-255 printable characters; absent: a new signal each call.
   * The prefix `kafka:` is reserved to the inbox relay.
   */
  signal_id?: string | null;
}

/**
 * A message of `poimen.<tenant>.signals`, keyed `<tenant>/<run_id>`: the
 * inbox relay sends it as `POST /v1/runs/{run_id}/signals`, with the
 * `signal_id` `kafka:<topic>/<partition>/<offset>` when it has none.
 */
export interface SignalMessage extends SignalRequest {
  /** The run the signal is for. */
  run_id: string;
}

/** A signal as the run's mailbox holds it. */
export interface SignalReceipt {
  /** The run it was sent to. */
  run_id: string;
  /** Its name. */
  name: string;
  /** Its id: the sender's, or the one the API made. */
  signal_id: string;
  /** When the API stored it (RFC 3339). */
  received_at: string;
  /** The wait (its step name) that consumed it; null while it waits for one. */
  consumed_by: string | null;
  /** The run's status after this call (`queued` when the signal woke it). */
  run_status: RunStatus;
}

/** One page of `GET /v1/runs`. */
export interface RunPage {
  /**
   * The runs of the page, newest first: at most `limit`, fewer when the page
   * would pass 1 MiB of JSON (`next_cursor` continues either way).
   */
  runs: Run[];
  /** Pass as `cursor` for the next page; null at the end. */
  next_cursor: string | null;
}

/**
 * One event of type `T` of a run (`GET /v1/runs/{run_id}/events`, and each
 * event of its stream).
 */
export interface RunEventOf<T extends RunEventType> {
  /** Per-run sequence number, from 1. */
  seq: number;
  /** The event type. */
  type: T;
  /** What the event carries: the type's payload (contracts/event_types.ts). */
  payload: RunEventPayloads[T];
  /** When it happened (RFC 3339). */
  at: string;
  /** When the outbox shipped it to Kafka. */
  published_at: string | null;
  /** Set aside by the outbox: it can never be shipped. */
  parked_at: string | null;
}

/**
 * One event of a run, a union discriminated by `type`: `switch (event.type)`
 * narrows `event.payload` to that type's.
 */
export type RunEvent = { [T in RunEventType]: RunEventOf<T> }[RunEventType];

/** One failing field of a schema error. */
export interface ProblemFieldError {
  /** Where in the body, dot-separated (`input.items.0`), or `(body)`. */
  path: string;
  /** What is wrong with it. */
  message: string;
}

/** RFC 9457 problem details, as the API sends them (`application/problem+json`). */
export interface Problem {
  /** `https://poimen.dev/problems/<code>`. */
  type: string;
  /** A short summary of the kind of problem. */
  title: string;
  /** The HTTP status. */
  status: number;
  /** What went wrong with this request. */
  detail?: string;
  /** Whether the same request may succeed later. */
  retryable: boolean;
  /** The failing fields of a schema error. */
  errors?: ProblemFieldError[];
  /** On `run-finished` (409): the status of the run a cancel found finished. */
  run_status?: RunStatus;
}

/** Most run requests one batch (`POST /v1/runs` with a JSON array) may hold. */
export const RUN_BATCH_MAX_ITEMS = 1000;

/**
 * One item's answer in a batch admission (`POST /v1/runs` with an array,
 * answered 207): what a single admission of that item would have answered.
 */
export interface RunBatchResult {
  /**
   * `created` (a new run), `replayed` (its dispatch key was seen: the first
   * run), `debounced` (it joined the pending run of its debounce key) or
   * `problem`.
   */
  outcome: "created" | "replayed" | "debounced" | "problem";
  /** The status a single admission would have answered: 201, 200 or the problem's. */
  status: number;
  /** On `created`, `replayed` and `debounced`: the run. */
  run?: Run;
  /** On `replayed`: true when this item differs from the first request's body. */
  body_mismatch?: boolean;
  /** On `problem`: why this item was not admitted (its `retryable` says whether to send it again). */
  problem?: Problem;
}

/** The answer to a batch admission: one result per item, in the items' order. */
export interface RunBatchAnswer {
  /** One per item of the batch, in the items' order. */
  results: RunBatchResult[];
}

/** Headers of the admission protocol. */
export const HEADERS = {
  /** A service token names the tenant it acts for. */
  tenant: "Poimen-Tenant",
  /** A service token says where the request came from (the relay: `kafka:<topic>/<partition>/<offset>`). */
  source: "Poimen-Source",
  /**
   * On a batch, a service token says where each item came from: one entry
   * per item, in order (contracts/run_batch.ts `formatItemSources`).
   */
  sources: "Poimen-Sources",
  /**
   * The dispatch key as a header (the IETF httpapi draft's, as Stripe uses
   * it): the same as `dispatch_key` in the body.
   */
  idempotencyKey: "Idempotency-Key",
  /** On 200: this dispatch key was seen, the body is the first run. */
  replayed: "Idempotent-Replayed",
  /** On a replay whose body differs from the original's. */
  bodyMismatch: "Idempotent-Body-Mismatch",
} as const;

/** The statuses a run never leaves. */
export const FINAL_STATUSES: ReadonlySet<string> = new Set<RunStatus>([
  "succeeded",
  "failed",
  "cancelled",
]);

/**
 * The longest `Prefer: wait=N` the API grants, in seconds: a longer wait is
 * cut to it (and `Preference-Applied` says so).
 */
export const MAX_WAIT_SECONDS = 60;

/**
 * The comment line (`: reconnect…`) the API ends a run's event stream with
 * when the stream reached its lifetime (RUN_STREAM_MAX_MS): the run goes
 * on, and a follower connects again at once with `Last-Event-ID`.
 */
export const RECONNECT_COMMENT = "reconnect";
