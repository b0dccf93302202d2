/**
 * What the Kafka clients of poimen share: connection options, retry pacing
 * and buffer helpers. `kafka/` is the one folder that imports a Kafka library
 * (today @platformatic/kafka), behind a small typed interface
 * (`producer.ts`, `consumer.ts`, `admin.ts`, `topics.ts`) so the library can
 * be swapped without touching the processes. Of the consumer's parts, only
 * `platformatic_group_client.ts` and `fenced_commit.ts` use the library.
 *
 * Offsets follow Kafka's convention everywhere: a committed offset is the
 * offset of the NEXT message to read (last processed offset + 1).
 */
import { Buffer } from "node:buffer";
import { findErrorBy } from "@platformatic/kafka";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, SECOND } from "../core/time.ts";

/** What every client needs to reach the cluster. */
export interface KafkaClientOptions {
  /** Bootstrap brokers as `host:port` (see `brokerList` in core/config.ts). */
  brokers: string[];
  /** Sent to the broker; shows up in its logs and quotas. */
  clientId: string;
  /** Timeout of one request, in ms (default 10 s). */
  requestTimeoutMs?: number;
  /** Timeout of opening one connection, in ms (default 5 s). */
  connectTimeoutMs?: number;
  logger?: Logger;
}

/** A position in a partition. */
export interface TopicPartitionOffset {
  topic: string;
  partition: number;
  offset: bigint;
}

/** Timeout of one request when `requestTimeoutMs` is not given. */
export const DEFAULT_REQUEST_TIMEOUT = 10 * SECOND;
const DEFAULT_CONNECT_TIMEOUT = 5 * SECOND;
export const RETRY_BASE = 100;
export const RETRY_CAP = 5 * SECOND;

// Full jitter spreads the reconnects of many clients that lost the same broker;
// the floor keeps a zero draw from becoming a busy loop.
export function retryDelay(_client: unknown, _op: string, attempt: number): number {
  return Math.max(50, backoffWithJitter(attempt, RETRY_BASE, RETRY_CAP));
}

export function baseOptions(opts: KafkaClientOptions) {
  return {
    clientId: opts.clientId,
    bootstrapBrokers: opts.brokers,
    timeout: opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT,
    connectTimeout: opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT,
    retryDelay,
  };
}

export function toBuffer(value: string | Uint8Array): Buffer {
  if (typeof value === "string") return Buffer.from(value, "utf8");
  // Wrap, don't copy: the library only reads it.
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

export function identityBuffer(data?: Buffer): Buffer | undefined {
  return data;
}

export function isApiError(error: unknown, apiId: string): boolean {
  return error instanceof Error && findErrorBy(error, "apiId", apiId) !== null;
}

/** The key of one partition of one topic in a Map. */
export function partitionKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}
