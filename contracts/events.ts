/**
 * A run's events as zod schemas: each event type's payload, parsed strictly
 * (a key too many or too few fails), and the wire format of run events on
 * `poimen.<tenant>.events`, the JSON value of each message and its headers.
 * The plain types are contracts/event_types.ts (the type checker holds the
 * two together); each payload is written by one SQL helper of
 * db/event_payloads.ts, and tests/db_events_test.ts parses every event the
 * statements write with these. Depends on zod alone.
 *
 * Delivery is at least once and in seq order per run: dedupe by
 * `(run_id, seq)`. The message key is `eventMessageKey` (contracts/topics.ts).
 * The package's `./events` entry (contracts/event_consumer.ts) exports what
 * a consumer needs of this module, with no zod type in its signatures.
 */
import { z } from "zod";
import { TENANT_ID_PATTERN } from "./topics.ts";
import type * as Plain from "./event_types.ts";
import type { RunEventPayloads, RunEventType } from "./event_types.ts";

// A timestamp as Postgres prints a timestamptz in JSON.
const timestamp = () => z.iso.datetime({ offset: true });
// Any JSON, but present: `z.unknown()` alone would let a missing key through.
const present = () => z.custom<unknown>((v) => v !== undefined, "required");
const attempt = () => z.number().int().nonnegative();

const waitReason = z.enum(["sleep", "signal", "children"]);
const runError = z.looseObject({ message: z.string(), code: z.string().optional() });

// The payloads, unannotated (their inferred types are checked against the
// plain ones below), then exported under the plain types.
const payloads = {
  "run.admitted": z.strictObject({
    workflow_ref: z.string().min(1),
    workflow: z.string().min(1),
    workflow_version: z.number().int().min(1),
    source: z.string(),
    run_after: timestamp(),
  }),
  "run.started": z.strictObject({ attempt: attempt(), worker: z.string() }),
  "run.succeeded": z.strictObject({ attempt: attempt(), result: present() }),
  "run.retrying": z.strictObject({
    attempt: attempt(),
    error: runError.nullable(),
    reason: z.string().nullable(),
    worker: z.string(),
    retry_at: timestamp(),
  }),
  "run.failed": z.strictObject({ attempt: attempt(), error: runError }),
  "run.released": z.strictObject({ attempt: attempt(), worker: z.string(), reason: z.string() }),
  "run.cancelled": z.strictObject({
    attempt: attempt(),
    requested_at: timestamp(),
    error: runError.nullable(),
    reason: z.string().nullable(),
    worker: z.string().nullable(),
  }),
  "run.waiting": z.strictObject({
    attempt: attempt(),
    reason: waitReason,
    name: z.string(),
    step: z.string(),
    until: timestamp().nullable(),
  }),
  "run.woken": z.strictObject({
    by: z.enum(["signal", "deadline", "child"]),
    reason: waitReason,
    name: z.string(),
    signal_id: z.string().nullable(),
  }),
  "step.completed": z.strictObject({
    name: z.string(),
    seq: z.number().int().min(1),
    kind: z.enum(["step", "sleep", "signal"]),
    size: z.number().int().nonnegative(),
    attempt: attempt(),
    duration_ms: z.number().int().nonnegative().nullable(),
    until: timestamp().nullable(),
    signal_id: z.string().nullable(),
    timed_out: z.boolean().nullable(),
  }),
  "step.failed": z.strictObject({
    name: z.string(),
    seq: z.number().int().min(1),
    attempt: attempt(),
    tries: z.number().int().min(1),
    error: runError,
  }),
  "signal.received": z.strictObject({ name: z.string(), signal_id: z.string() }),
  "child.started": z.strictObject({
    run_id: z.uuid(),
    name: z.string(),
    workflow: z.string(),
    workflow_version: z.number().int().min(1),
    detached: z.boolean(),
  }),
  "child.finished": z.strictObject({
    run_id: z.uuid(),
    name: z.string(),
    status: z.enum(["succeeded", "failed", "cancelled"]),
  }),
};

/** Each event type's payload schema, strict: an unknown key or a missing one fails. */
export const RUN_EVENT_PAYLOADS: { readonly [T in RunEventType]: z.ZodType<RunEventPayloads[T]> } =
  payloads;

function typed<T extends RunEventType, S extends z.ZodRawShape>(type: T, shape: S) {
  return z.strictObject({ ...shape, type: z.literal(type), payload: payloads[type] });
}

/** The fields of a message besides its type and payload. */
const ENVELOPE = {
  event_id: z.number().int().nonnegative().describe(
    "Database identity of the event: increasing in insertion order, with gaps",
  ),
  tenant_id: z.string().regex(TENANT_ID_PATTERN),
  run_id: z.uuid(),
  seq: z.number().int().min(1).describe("1, 2, 3… within the run"),
  goal_id: z.string().nullable(),
  dispatch_key: z.string().nullable(),
  at: z.iso.datetime().describe("When the event was written, ISO 8601 UTC"),
};

const typedPayload = z.discriminatedUnion("type", [
  typed("run.admitted", {}),
  typed("run.started", {}),
  typed("run.succeeded", {}),
  typed("run.retrying", {}),
  typed("run.failed", {}),
  typed("run.released", {}),
  typed("run.cancelled", {}),
  typed("run.waiting", {}),
  typed("run.woken", {}),
  typed("step.completed", {}),
  typed("step.failed", {}),
  typed("signal.received", {}),
  typed("child.started", {}),
  typed("child.finished", {}),
]);

const eventMessage = z.discriminatedUnion("type", [
  typed("run.admitted", ENVELOPE),
  typed("run.started", ENVELOPE),
  typed("run.succeeded", ENVELOPE),
  typed("run.retrying", ENVELOPE),
  typed("run.failed", ENVELOPE),
  typed("run.released", ENVELOPE),
  typed("run.cancelled", ENVELOPE),
  typed("run.waiting", ENVELOPE),
  typed("run.woken", ENVELOPE),
  typed("step.completed", ENVELOPE),
  typed("step.failed", ENVELOPE),
  typed("signal.received", ENVELOPE),
  typed("child.started", ENVELOPE),
  typed("child.finished", ENVELOPE),
]);

/** `type` and `payload` of any event: a union discriminated by `type`. */
export type RunEventBody = Plain.RunEventBody;

/**
 * `{type, payload}` of any event, strict: a type poimen does not write, or
 * a payload off its type's shape, fails.
 */
export const RunEventBody: z.ZodType<Plain.RunEventBody> = typedPayload;

/** The value of one event message: a union discriminated by `type`. */
export type EventMessage = Plain.EventMessage;

/** The value of one event message, strict as `RunEventBody` is. */
export const EventMessage: z.ZodType<EventMessage> = eventMessage;

/** Headers of an event message: the value's identity fields, readable without parsing it. */
export const EVENT_HEADERS = {
  contentType: "content-type",
  eventId: "poimen-event-id",
  tenantId: "poimen-tenant-id",
  runId: "poimen-run-id",
  seq: "poimen-seq",
  type: "poimen-type",
  /** Only when the run has one. */
  goalId: "poimen-goal-id",
  /** Only when the run has one. */
  dispatchKey: "poimen-dispatch-key",
} as const;

const utf8 = new TextDecoder();

/** Parses an event message value (bytes or text); throws a `ZodError` when it is not one. */
export function parseEventMessage(value: Uint8Array | string): Plain.EventMessage {
  return EventMessage.parse(JSON.parse(typeof value === "string" ? value : utf8.decode(value)));
}

// The plain types (what users see) and the schemas above must describe the
// same shapes: a difference fails here.
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
type Parsed<T extends RunEventType> = z.infer<(typeof payloads)[T]>;
const sameShapes: [
  Same<Parsed<"run.admitted">, Plain.RunAdmittedPayload>,
  Same<Parsed<"run.started">, Plain.RunStartedPayload>,
  Same<Parsed<"run.succeeded">, Plain.RunSucceededPayload>,
  Same<Parsed<"run.retrying">, Plain.RunRetryingPayload>,
  Same<Parsed<"run.failed">, Plain.RunFailedPayload>,
  Same<Parsed<"run.released">, Plain.RunReleasedPayload>,
  Same<Parsed<"run.cancelled">, Plain.RunCancelledPayload>,
  Same<Parsed<"run.waiting">, Plain.RunWaitingPayload>,
  Same<Parsed<"run.woken">, Plain.RunWokenPayload>,
  Same<Parsed<"step.completed">, Plain.StepCompletedPayload>,
  Same<Parsed<"step.failed">, Plain.StepFailedPayload>,
  Same<Parsed<"signal.received">, Plain.SignalReceivedPayload>,
  Same<Parsed<"child.started">, Plain.ChildStartedPayload>,
  Same<Parsed<"child.finished">, Plain.ChildFinishedPayload>,
  Same<z.infer<typeof typedPayload>, Plain.RunEventBody>,
  Same<z.infer<typeof eventMessage>, Plain.EventMessage>,
] = [
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
  true,
];
void sameShapes;
