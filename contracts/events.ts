/**
 * The wire format of run events on `poimen.<tenant>.events`, as a zod
 * schema: the JSON value of each message and its headers. The outbox
 * publisher builds messages of this type; consumers (and the tests that
 * read events back) parse with it. Depends on zod alone.
 *
 * Delivery is at least once and in seq order per run: dedupe by
 * `(run_id, seq)`. The message key is `eventMessageKey` (contracts/topics.ts).
 */
import { z } from "zod";
import { TENANT_ID_PATTERN } from "./topics.ts";

/** The value of one event message. */
export const EventMessage = z.strictObject({
  event_id: z.number().int().nonnegative().describe(
    "Database identity of the event: increasing in insertion order, with gaps",
  ),
  tenant_id: z.string().regex(TENANT_ID_PATTERN),
  run_id: z.uuid(),
  seq: z.number().int().min(1).describe("1, 2, 3… within the run"),
  type: z.string().min(1).describe(
    "run.admitted, run.started, run.retrying, run.succeeded, run.failed, run.released, " +
      "run.cancelled; a durable run's run.waiting, run.woken, step.completed, step.failed, " +
      "signal.received",
  ),
  goal_id: z.string().nullable(),
  dispatch_key: z.string().nullable(),
  payload: z.record(z.string(), z.unknown()).describe("Depends on the type"),
  at: z.iso.datetime().describe("When the event was written, ISO 8601 UTC"),
});
export type EventMessage = z.infer<typeof EventMessage>;

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
export function parseEventMessage(value: Uint8Array | string): EventMessage {
  return EventMessage.parse(JSON.parse(typeof value === "string" ? value : utf8.decode(value)));
}
