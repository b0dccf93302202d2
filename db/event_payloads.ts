/**
 * The SQL of each event type's payload: one helper per type, returning the
 * `jsonb_build_object(…)` the statements that write that type embed. A
 * helper takes one SQL expression per key of the type's payload
 * (contracts/event_types.ts), by key: a key left out or one too many does
 * not type-check, so the keys written are the type's, defined once.
 * tests/db_events_test.ts runs runs through every state and parses each
 * event written strictly (contracts/events.ts), which checks the values.
 */
import type {
  ChildFinishedPayload,
  ChildStartedPayload,
  RunAdmittedPayload,
  RunCancelledPayload,
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
} from "../contracts/event_types.ts";

/** One SQL expression per key of payload `P` (a column of the statement's CTE, a literal). */
type Exprs<P> = { readonly [K in keyof P]-?: string };

function jsonbObject(exprs: Record<string, string>): string {
  const pairs = Object.entries(exprs).map(([key, expr]) => `'${key}', ${expr}`);
  return `jsonb_build_object(${pairs.join(", ")})`;
}

/** `run.admitted`: `{workflow_ref, workflow, workflow_version, source, run_after}`. */
export function admittedPayload(e: Exprs<RunAdmittedPayload>): string {
  return jsonbObject(e);
}

/** `run.started`: `{attempt, worker}`. */
export function startedPayload(e: Exprs<RunStartedPayload>): string {
  return jsonbObject(e);
}

/** `run.succeeded`: `{attempt, result}`. */
export function succeededPayload(e: Exprs<RunSucceededPayload>): string {
  return jsonbObject(e);
}

/** `run.retrying`: `{attempt, error, reason, worker, retry_at}`. */
export function retryingPayload(e: Exprs<RunRetryingPayload>): string {
  return jsonbObject(e);
}

/** `run.failed`: `{attempt, error}`. */
export function failedPayload(e: Exprs<RunFailedPayload>): string {
  return jsonbObject(e);
}

/** `run.released`: `{attempt, worker, reason}`. */
export function releasedPayload(e: Exprs<RunReleasedPayload>): string {
  return jsonbObject(e);
}

/** `run.cancelled`: `{attempt, requested_at, error, reason, worker}`. */
export function cancelledPayload(e: Exprs<RunCancelledPayload>): string {
  return jsonbObject(e);
}

/** `run.waiting`: `{attempt, reason, name, step, until}`. */
export function waitingPayload(e: Exprs<RunWaitingPayload>): string {
  return jsonbObject(e);
}

/** `run.woken`: `{by, reason, name, signal_id}`. */
export function wokenPayload(e: Exprs<RunWokenPayload>): string {
  return jsonbObject(e);
}

/**
 * `step.completed`: `{name, seq, kind, size, attempt, duration_ms, until,
 * signal_id, timed_out}`.
 */
export function stepCompletedPayload(e: Exprs<StepCompletedPayload>): string {
  return jsonbObject(e);
}

/** `step.failed`: `{name, seq, attempt, tries, error}`. */
export function stepFailedPayload(e: Exprs<StepFailedPayload>): string {
  return jsonbObject(e);
}

/** `signal.received`: `{name, signal_id}`. */
export function signalReceivedPayload(e: Exprs<SignalReceivedPayload>): string {
  return jsonbObject(e);
}

/** `child.started`: `{run_id, name, workflow, workflow_version, detached}`. */
export function childStartedPayload(e: Exprs<ChildStartedPayload>): string {
  return jsonbObject(e);
}

/** `child.finished`: `{run_id, name, status}`. */
export function childFinishedPayload(e: Exprs<ChildFinishedPayload>): string {
  return jsonbObject(e);
}

/** A SQL null of jsonb, for a payload key that is null in this statement. */
export const NULL_JSONB = "null::jsonb";
/** A SQL null of text, for a payload key that is null in this statement. */
export const NULL_TEXT = "null::text";
/** A SQL null of int, for a payload key that is null in this statement. */
export const NULL_INT = "null::int";
/** A SQL null of timestamptz, for a payload key that is null in this statement. */
export const NULL_TIMESTAMP = "null::timestamptz";
/** A SQL null of boolean, for a payload key that is null in this statement. */
export const NULL_BOOLEAN = "null::boolean";
