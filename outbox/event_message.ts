/**
 * The Kafka message of one outbox event: the format of contracts/events.ts,
 * keyed by run and with the event's identity in headers.
 */
import { EVENT_HEADERS } from "../contracts/events.ts";
import type { EventMessageOf, RunEventType } from "../contracts/event_types.ts";
import { eventMessageKey, eventsTopic } from "../contracts/topics.ts";
import type { PendingEvent } from "../db/outbox.ts";
import type { ProduceMessage } from "../kafka/producer.ts";

const utf8 = new TextEncoder();

/** The Kafka message of one event: keyed by run, so a run's events share a partition. */
export function toMessage(e: PendingEvent): ProduceMessage & { value: Uint8Array } {
  const headers: Record<string, string> = {
    [EVENT_HEADERS.contentType]: "application/json",
    [EVENT_HEADERS.eventId]: e.event_id,
    [EVENT_HEADERS.tenantId]: e.tenant_id,
    [EVENT_HEADERS.runId]: e.run_id,
    [EVENT_HEADERS.seq]: String(e.seq),
    [EVENT_HEADERS.type]: e.type,
  };
  if (e.goal_id !== null) headers[EVENT_HEADERS.goalId] = e.goal_id;
  if (e.dispatch_key !== null) headers[EVENT_HEADERS.dispatchKey] = e.dispatch_key;
  // W3C Trace Context's own header name, so tracing consumers continue the run's trace.
  if (e.traceparent) headers.traceparent = e.traceparent;
  // Typed by the contract, not parsed with it: the table's constraints
  // guarantee the envelope, the statements of db/ write only the contract's
  // types and payloads (tests/db_events_test.ts parses every one), and a
  // failed parse here would leave the row pending forever and stall every
  // batch behind it. The tests parse what they read back.
  const envelope: Omit<EventMessageOf<RunEventType>, "type" | "payload" | "at"> & {
    type: string;
  } = {
    // Identity values stay far below 2^53; a number is what consumers expect.
    event_id: Number(e.event_id),
    tenant_id: e.tenant_id,
    run_id: e.run_id,
    seq: e.seq,
    type: e.type,
    goal_id: e.goal_id,
    dispatch_key: e.dispatch_key,
  };
  // The payload is Postgres's own JSON text, spliced in as it is: valid JSON
  // (jsonb holds nothing else), never parsed here.
  const head = JSON.stringify(envelope);
  const json = `${head.slice(0, -1)},"payload":${e.payload},"at":${
    JSON.stringify(e.at.toISOString())
  }}`;
  return {
    topic: eventsTopic(e.tenant_id),
    key: eventMessageKey(e.tenant_id, e.run_id),
    value: utf8.encode(json),
    headers,
  };
}
