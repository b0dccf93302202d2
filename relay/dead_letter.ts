/**
 * Dead letters: a dispatch message the API will never admit as it is, or a
 * signal message it will never take, goes to `poimen.<tenant>.dispatch.dlq`
 * (one DLQ per tenant for both) with its original key, value and headers,
 * plus `poimen-dlq-*` headers saying why and where it came from, so it can be
 * inspected and redriven (`deno task dlq`).
 */
import type { ConsumedMessage } from "../kafka/consumer.ts";
import type { ProduceMessage } from "../kafka/producer.ts";
import { dispatchTopic, dlqTopic, signalsTopic } from "../contracts/topics.ts";

/** Prefix of every header the relay adds to a dead letter. */
const DLQ_HEADER_PREFIX = "poimen-dlq-";

/** The headers the relay adds to a dead letter. */
export const DLQ_HEADERS = {
  /** Why: `bad-json`, the API's permanent problem code (`validation`, …), or `unknown-workflow` after its grace. */
  reason: "poimen-dlq-reason",
  /** The HTTP status that made it permanent, or `none` when the API was not asked. */
  status: "poimen-dlq-status",
  /** The problem detail (truncated). */
  detail: "poimen-dlq-detail",
  /** How many times the relay tried it (API calls, or 1 when judged locally). */
  attempts: "poimen-dlq-attempts",
  /** When the first attempt failed (ISO 8601). */
  firstFailure: "poimen-dlq-first-failure",
  /** When the last attempt failed (ISO 8601). */
  lastFailure: "poimen-dlq-last-failure",
  /** Where the original message was: topic, partition, offset. */
  topic: "poimen-dlq-topic",
  partition: "poimen-dlq-partition",
  offset: "poimen-dlq-offset",
  /** The original message's timestamp (ISO 8601). */
  timestamp: "poimen-dlq-timestamp",
} as const;

/** Why a message is dead-lettered. */
export interface Failure {
  reason: string;
  status: number | "none";
  detail: string;
  attempts: number;
  firstFailure: Date;
  lastFailure: Date;
}

/** The dead letter of `message` in its tenant's DLQ topic. */
export function deadLetter(tenant: string, message: ConsumedMessage, why: Failure): ProduceMessage {
  return {
    topic: dlqTopic(tenant),
    key: message.key,
    value: message.value,
    headers: {
      ...withoutDlqHeaders(message.headers),
      [DLQ_HEADERS.reason]: why.reason,
      [DLQ_HEADERS.status]: String(why.status),
      [DLQ_HEADERS.detail]: why.detail,
      [DLQ_HEADERS.attempts]: String(why.attempts),
      [DLQ_HEADERS.firstFailure]: why.firstFailure.toISOString(),
      [DLQ_HEADERS.lastFailure]: why.lastFailure.toISOString(),
      [DLQ_HEADERS.topic]: message.topic,
      [DLQ_HEADERS.partition]: String(message.partition),
      [DLQ_HEADERS.offset]: String(message.offset),
      [DLQ_HEADERS.timestamp]: new Date(message.timestamp).toISOString(),
    },
  };
}

/**
 * The original headers: a redriven message that fails again must describe
 * its latest failure, not carry a stale one.
 */
export function withoutDlqHeaders(headers: Record<string, string>): Record<string, string> {
  return Object.fromEntries(
    Object.entries(headers).filter(([k]) => !k.toLowerCase().startsWith(DLQ_HEADER_PREFIX)),
  );
}

/**
 * The message a dead letter came from, to publish again (redrive): to the
 * tenant's signals topic when it came from there, else to its dispatch topic.
 */
export function redriven(tenant: string, letter: ConsumedMessage): ProduceMessage {
  const signals = signalsTopic(tenant);
  return {
    topic: letter.headers[DLQ_HEADERS.topic] === signals ? signals : dispatchTopic(tenant),
    key: letter.key,
    value: letter.value,
    headers: withoutDlqHeaders(letter.headers),
  };
}
