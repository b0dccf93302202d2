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
import { type ErrorCode, nextCause, PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, SECOND } from "../core/time.ts";
import { type KafkaSecurity, libraryTlsSasl } from "./security.ts";

export type { KafkaSecurity } from "./security.ts";

/** What every client needs to reach the cluster. */
export interface KafkaClientOptions {
  /** Bootstrap brokers as `host:port` (see `brokerList` in kafka/security.ts). */
  brokers: string[];
  /** Sent to the broker; shows up in its logs and quotas. */
  clientId: string;
  /** Timeout of one request, in ms (default 10 s). */
  requestTimeoutMs?: number;
  /** Timeout of opening one connection, in ms (default 5 s). */
  connectTimeoutMs?: number;
  /** TLS and SASL (kafka/security.ts); absent: plaintext, unauthenticated. */
  security?: KafkaSecurity;
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
    ...libraryTlsSasl(opts.security),
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

/** Whether the broker answered `error` (or an error it wraps as a cause) with `apiId`. */
export function isApiError(error: unknown, apiId: string): boolean {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (findErrorBy(e, "apiId", apiId) !== null) return true;
  }
  return false;
}

/** The key of one partition of one topic in a Map. */
export function partitionKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

/**
 * A Kafka failure as poimen reports every failure: a `PoimenError`, code
 * `kafka-unavailable` (retryable: the broker away, slow or busy; the
 * long-running processes retry with backoff, a command exits 1) unless told
 * otherwise, its message naming `what` failed and the root cause (one line a
 * command can print), the library's error kept as its `cause` (the logger
 * writes the chain; `isApiError` and `permanentRecordError` look through it).
 */
export function kafkaFailure(
  what: string,
  error: unknown,
  code: ErrorCode = "kafka-unavailable",
): PoimenError {
  if (error instanceof PoimenError) return error;
  const root = rootError(error);
  const message = root instanceof Error ? root.message : String(root);
  const tlsCode = (root as { code?: unknown } | null)?.code;
  const hint = tlsCode === "ERR_TLS_CERT_ALTNAME_INVALID"
    ? " (the broker's TLS certificate does not name the host of KAFKA_BROKERS)"
    : TLS_VERIFY_CODES.has(tlsCode as string)
    ? " (the broker's TLS certificate is not trusted: is KAFKA_SSL_CA_FILE, or DENO_CERT, its CA?)"
    : "";
  return new PoimenError(code, `${what}: ${message}${hint}`, { cause: error });
}

// node:tls's codes of a broker certificate that does not verify (chain or name).
const TLS_VERIFY_CODES = new Set([
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_SIGNATURE_FAILURE",
]);

// The library wraps the telling error ("connect ECONNREFUSED …") in generic
// ones ("Producing messages failed."), as an AggregateError's last one or a cause.
function rootError(error: unknown): unknown {
  let current = error;
  for (let depth = 0; depth < 8 && current instanceof Error; depth++) {
    const next = nextCause(current);
    if (!(next instanceof Error) || !next.message) break;
    current = next;
  }
  return current;
}

/**
 * `client` with every method but `close` reporting its failures as
 * `kafkaFailure(`${what} ${method}`)`: the boundary where the library's
 * errors become poimen's.
 */
export function reportingFailures<T extends { close(): Promise<void> }>(
  what: string,
  client: T,
): T {
  const out = { ...client };
  for (const [name, method] of Object.entries(client)) {
    if (name === "close" || typeof method !== "function") continue;
    (out as Record<string, unknown>)[name] = async (...args: unknown[]) => {
      try {
        return await (method as (...a: unknown[]) => Promise<unknown>).apply(client, args);
      } catch (error) {
        throw kafkaFailure(`${what} ${name}`, error);
      }
    };
  }
  return out;
}
