/**
 * A run's events as plain TypeScript, with no dependency: every event type
 * poimen writes and the payload of each, a union discriminated by `type`.
 * `switch (event.type)` narrows `event.payload`. The zod schemas of
 * contracts/events.ts parse the same shapes strictly (the type checker holds
 * the two together), each payload is written by one SQL helper of
 * db/event_payloads.ts, and docs/runs.md lists them.
 *
 * Timestamps in payloads are RFC 3339 with an offset, as Postgres prints a
 * `timestamptz` (`2030-01-01T09:00:00.123456+00:00`).
 *
 * @module
 */

/**
 * Why an attempt failed: a handler's error (its `message` and `name`), or a
 * failure poimen decides under a stable `code` (`invalid-input`,
 * `bad-result`, `result-too-large`, `lease-expired`…: the table of
 * docs/api.md), with what that failure adds (`issues`, `limit`…). Open:
 * read the fields you know.
 */
export interface RunError {
  /** What went wrong, for people. */
  message: string;
  /** A stable code, on failures poimen itself decides. */
  code?: string;
  /** What else the failure says (`name`, `issues`, `truncated`…). */
  [key: string]: unknown;
}

/** `run.admitted`: the run was made (seq 1). */
export interface RunAdmittedPayload {
  /** The workflow as asked (`name` or `name@version`). */
  workflow_ref: string;
  /** The resolved workflow name. */
  workflow: string;
  /** The version pinned at admission. */
  workflow_version: number;
  /** `http:<token name>` or `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  /** When it is due: no attempt starts before. */
  run_after: string;
}

/** `run.started`: a worker claimed the run; an attempt began. */
export interface RunStartedPayload {
  /** The attempt's number, 1 on the first. */
  attempt: number;
  /** The worker that holds it. */
  worker: string;
}

/** `run.succeeded`: the attempt returned; final. */
export interface RunSucceededPayload {
  /** The attempt that succeeded. */
  attempt: number;
  /** What the workflow returned (any JSON; null for nothing). */
  result: unknown;
}

/** `run.retrying`: the attempt ended without a result; the run is queued again. */
export interface RunRetryingPayload {
  /** The attempt that ended. */
  attempt: number;
  /** The attempt's error; null when it did not fail by itself (`reason` says why it ended). */
  error: RunError | null;
  /** `lease expired` when its worker stopped renewing the lease; null when `error` says why. */
  reason: string | null;
  /** The worker that held the attempt. */
  worker: string;
  /** When the next attempt is due. */
  retry_at: string;
}

/** `run.failed`: the last attempt (or one that cannot succeed by retrying) failed; final. */
export interface RunFailedPayload {
  /** The attempt that failed. */
  attempt: number;
  /** Why (`lease-expired` when its worker stopped renewing the lease). */
  error: RunError;
}

/** `run.released`: a stopping worker gave the run back unfinished; queued, the attempt returned. */
export interface RunReleasedPayload {
  /** The attempt given back (the next claim counts it again). */
  attempt: number;
  /** The worker that gave it back. */
  worker: string;
  /** Why (`worker shutdown`). */
  reason: string;
}

/**
 * `run.cancelled`: the run was cancelled; final. A queued run is cancelled at
 * once (`error`, `reason` and `worker` null); a running one when its attempt
 * ends, which says how.
 */
export interface RunCancelledPayload {
  /** Attempts started (the one that ended, for a running run; 0 if it never started). */
  attempt: number;
  /** When the cancel was asked for. */
  requested_at: string;
  /** The ended attempt's error, when it failed (its handler aborted, or failed by itself). */
  error: RunError | null;
  /**
   * Why the attempt ended without failing: `lease expired`, or the reason
   * its worker gave it back (`worker shutdown`); null otherwise.
   */
  reason: string | null;
  /** The worker whose attempt ended; null for a queued run. */
  worker: string | null;
}

/** `run.waiting`: the run suspended (a long sleep or signal wait): its lease, slot and attempt given back. */
export interface RunWaitingPayload {
  /** The attempt that suspended (the claim that resumes the run counts it again). */
  attempt: number;
  /** What it waits for: its sleep's end, a signal, or its children (`result()`, `ctx.map`). */
  reason: "sleep" | "signal" | "children";
  /** A sleep's step name; a wait's signal name. */
  name: string;
  /** The step name of the call that waits (`approval`, `approval#2`…). */
  step: string;
  /** Its deadline (a sleep's end, a wait's timeout); null: none (a wait without a timeout). */
  until: string | null;
}

/** `run.woken`: a waiting run is queued again, due now. */
export interface RunWokenPayload {
  /**
   * What woke it: its signal, its deadline (a sleep's end, a wait's
   * timeout), or a child (the last one it awaited became final, or, with
   * `failFast`, one failed).
   */
  by: "signal" | "deadline" | "child";
  /** What it waited for, as `run.waiting` said. */
  reason: "sleep" | "signal" | "children";
  /** A sleep's step name; a wait's signal name. */
  name: string;
  /** The signal that woke it; null when its deadline did. */
  signal_id: string | null;
}

/**
 * `step.completed`: a durable call's result was stored (by the attempt
 * holding the lease): a step returned, a sleep ended, a wait took its
 * signal or timed out. The result itself is never in the event (`size`).
 */
export interface StepCompletedPayload {
  /** The call's step name. */
  name: string;
  /** Its place in the run's calls, 1, 2, 3… */
  seq: number;
  /** What call it is: `ctx.step`, `ctx.sleep`/`sleepUntil`, `ctx.waitForSignal`. */
  kind: "step" | "sleep" | "signal";
  /** The stored result's size as JSON, in bytes (0 for a sleep). */
  size: number;
  /** The attempt that stored it. */
  attempt: number;
  /** A step's duration, its last try; null for a sleep or a wait. */
  duration_ms: number | null;
  /** A sleep's end or a wait's timeout; null for a step, or a wait without a timeout. */
  until: string | null;
  /** The signal a wait took; null otherwise (a step, a sleep, a wait that timed out). */
  signal_id: string | null;
  /** A wait's: true when it timed out (its result null); null for a step or a sleep. */
  timed_out: boolean | null;
}

/** `step.failed`: a step threw on its last try; its error is thrown in the handler. */
export interface StepFailedPayload {
  /** The step's name. */
  name: string;
  /** Its place in the run's calls. */
  seq: number;
  /** The attempt whose step failed. */
  attempt: number;
  /** How many times it was tried in this attempt. */
  tries: number;
  /** Its last error. */
  error: RunError;
}

/** `signal.received`: a new signal was stored in the run's mailbox (not on a replay). */
export interface SignalReceivedPayload {
  /** The signal's name. */
  name: string;
  /** Its identity: the sender's, or one the API made. */
  signal_id: string;
}

/**
 * `child.started` (on the parent's timeline): a child run this run's
 * handler started (`ctx.start`) was admitted, in the child's admission
 * transaction (not on a replay).
 */
export interface ChildStartedPayload {
  /** The child's run id. */
  run_id: string;
  /** The call's name in the parent (the child's dispatch key is `child:<parent>:<name>`). */
  name: string;
  /** The child's workflow name. */
  workflow: string;
  /** The child's pinned version. */
  workflow_version: number;
  /** Started with `{ detached: true }`: a cancel of this run does not reach it. */
  detached: boolean;
}

/**
 * `child.finished` (on the parent's timeline): a child run of this run
 * became final, written in the child's finishing transaction.
 */
export interface ChildFinishedPayload {
  /** The child's run id. */
  run_id: string;
  /** The call's name in the parent. */
  name: string;
  /** How it ended. */
  status: "succeeded" | "failed" | "cancelled";
}

/** Each event type's payload, by type. */
export interface RunEventPayloads {
  /** The run was made (seq 1). */
  "run.admitted": RunAdmittedPayload;
  /** A worker claimed it; an attempt began. */
  "run.started": RunStartedPayload;
  /** The attempt returned (final). */
  "run.succeeded": RunSucceededPayload;
  /** The attempt ended without a result; queued again. */
  "run.retrying": RunRetryingPayload;
  /** Failed for good (final). */
  "run.failed": RunFailedPayload;
  /** Given back unfinished by a stopping worker; queued again. */
  "run.released": RunReleasedPayload;
  /** Cancelled (final). */
  "run.cancelled": RunCancelledPayload;
  /** Suspended: a long sleep or signal wait. */
  "run.waiting": RunWaitingPayload;
  /** Woken: queued again by its signal or deadline. */
  "run.woken": RunWokenPayload;
  /** A durable call's result was stored. */
  "step.completed": StepCompletedPayload;
  /** A step threw on its last try. */
  "step.failed": StepFailedPayload;
  /** A new signal was stored in the run's mailbox. */
  "signal.received": SignalReceivedPayload;
  /** A child run it started was admitted. */
  "child.started": ChildStartedPayload;
  /** A child run it started became final. */
  "child.finished": ChildFinishedPayload;
}

/** An event type poimen writes. */
export type RunEventType = keyof RunEventPayloads;

/** Every event type, in the order a run may meet them. */
export const RUN_EVENT_TYPES: readonly RunEventType[] = [
  "run.admitted",
  "signal.received",
  "run.started",
  "step.completed",
  "step.failed",
  "child.started",
  "child.finished",
  "run.waiting",
  "run.woken",
  "run.succeeded",
  "run.retrying",
  "run.failed",
  "run.released",
  "run.cancelled",
];

/** The event types that end a run: its last event is one of them. */
export const FINAL_EVENT_TYPES: ReadonlySet<RunEventType> = new Set<RunEventType>([
  "run.succeeded",
  "run.failed",
  "run.cancelled",
]);

/** `type` and `payload` of an event of type `T`. */
export interface TypedPayload<T extends RunEventType> {
  /** The event type. */
  type: T;
  /** What it carries. */
  payload: RunEventPayloads[T];
}

/** `type` and `payload` of any event: a union discriminated by `type`. */
export type RunEventBody = { [T in RunEventType]: TypedPayload<T> }[RunEventType];

/** The value of one message of type `T` on `poimen.<tenant>.events`. */
export interface EventMessageOf<T extends RunEventType> extends TypedPayload<T> {
  /** Database identity of the event: increasing in insertion order, with gaps. */
  event_id: number;
  /** The run's tenant. */
  tenant_id: string;
  /** The run. */
  run_id: string;
  /** 1, 2, 3… within the run. */
  seq: number;
  /** The run's goal, if any. */
  goal_id: string | null;
  /** The run's dispatch key, if any. */
  dispatch_key: string | null;
  /** When the event was written, ISO 8601 UTC. */
  at: string;
}

/**
 * The value of one message on `poimen.<tenant>.events`: a union
 * discriminated by `type`. Delivery is at least once and in seq order per
 * run: dedupe by `(run_id, seq)`.
 */
export type EventMessage = { [T in RunEventType]: EventMessageOf<T> }[RunEventType];
