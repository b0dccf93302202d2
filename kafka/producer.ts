/**
 * The idempotent producer: `send` resolves after the broker acknowledged
 * every message (acks=all), with the offset each got.
 */
import { Buffer } from "node:buffer";
import { murmur2, Producer, stringSerializer } from "@platformatic/kafka";
import {
  baseOptions,
  identityBuffer,
  isApiError,
  type KafkaClientOptions,
  kafkaFailure,
  partitionKey,
  toBuffer,
  type TopicPartitionOffset,
} from "./client.ts";

/** One message to produce. */
export interface ProduceMessage {
  topic: string;
  /** Chooses the partition (murmur2, as the Java client does) unless `partition` is given. */
  key: string;
  value: string | Uint8Array;
  headers?: Record<string, string>;
  partition?: number;
}

/** An idempotent producer. */
export interface KafkaProducer {
  /**
   * Writes `messages` and resolves only after the broker acknowledged all of
   * them (acks=all), with the partition and offset each got (in the order
   * given); rejects when they could not be
   * written (then none, some or all may have been).
   */
  send(messages: ProduceMessage[]): Promise<TopicPartitionOffset[]>;
  close(): Promise<void>;
}

// Broker answers that a record (or a batch of them) can never be written as
// it is: sending it again changes nothing. Everything else (connection
// refused, timeouts, leader changes, unknown topic) may pass by itself.
// CORRUPT_MESSAGE counts: the client already retried it, and the broker also
// uses it for records that exceed a valid size.
const PERMANENT_RECORD_ERRORS = [
  "MESSAGE_TOO_LARGE",
  "RECORD_LIST_TOO_LARGE",
  "INVALID_RECORD",
  "CORRUPT_MESSAGE",
  "INVALID_TIMESTAMP",
] as const;

/**
 * The broker's error code when `error` (from `send`) says the records sent
 * can never be written as they are (e.g. `MESSAGE_TOO_LARGE`), else
 * undefined: the broker being down or busy is not permanent.
 */
export function permanentRecordError(error: unknown): string | undefined {
  // isApiError looks through the causes callers may have wrapped it in.
  return PERMANENT_RECORD_ERRORS.find((id) => isApiError(error, id));
}

/**
 * The size of `m` as one record in a batch of its own: what the topic's
 * `max.message.bytes` is compared with (uncompressed, so an upper bound). The
 * batch header is 61 bytes; each varint is at most 5.
 */
export function recordBatchBytes(m: ProduceMessage): number {
  const bytes = (s: string | Uint8Array) =>
    typeof s === "string" ? utf8.encode(s).byteLength : s.byteLength;
  let size = 61 + 5 * 6 + bytes(m.key) + bytes(m.value);
  for (const [k, v] of Object.entries(m.headers ?? {})) size += 10 + bytes(k) + bytes(v);
  return size;
}

const utf8 = new TextEncoder();

/**
 * The partition of `key` in a topic of `partitions` partitions: murmur2 of
 * its UTF-8 bytes, positive, modulo the count, exactly as Kafka's Java
 * client does, so every producer of a key (this one, the outbox's, a
 * publisher in another language) agrees on where the key lives.
 */
export function partitionFor(key: string, partitions: number): number {
  return (murmur2(Buffer.from(key, "utf8")) & 0x7fffffff) % partitions;
}

/** Options of `createProducer`. */
export interface ProducerOptions extends KafkaClientOptions {
  /**
   * How often one send is retried (network errors, leader changes) before it
   * rejects. Default: without limit, so a send waits out a broker restart;
   * `close()` still ends it.
   */
  retries?: number;
}

export function createProducer(opts: ProducerOptions): KafkaProducer {
  const producer = new Producer<string, Buffer, string, string>({
    ...baseOptions(opts),
    idempotent: true,
    acks: -1,
    // The library treats an unset count on an idempotent producer as "without limit".
    ...(opts.retries === undefined ? {} : { retries: opts.retries }),
    serializers: {
      key: stringSerializer,
      value: identityBuffer,
      headerKey: stringSerializer,
      headerValue: stringSerializer,
    },
  });
  let closed = false;
  return {
    async send(messages) {
      try {
        return await send(messages);
      } catch (error) {
        throw kafkaFailure(
          "kafka produce",
          error,
          permanentRecordError(error) ? "kafka-refused" : "kafka-unavailable",
        );
      }
    },
    async close() {
      if (closed) return;
      closed = true;
      await producer.close();
    },
  };

  async function send(messages: ProduceMessage[]) {
    if (messages.length === 0) return [];
    // Partitions are chosen here, as the Java client does (murmur2 & 0x7fffffff),
    // so that every producer of a key agrees on its partition and so that
    // each message's offset can be told from the per-partition base offsets.
    const topics = [...new Set(messages.map((m) => m.topic))];
    const metadata = await producer.metadata({ topics });
    const partitions = messages.map((m) => {
      if (m.partition !== undefined) return m.partition;
      return partitionFor(m.key, metadata.topics.get(m.topic)?.partitionsCount ?? 1);
    });
    const result = await producer.send({
      messages: messages.map((m, i) => ({
        topic: m.topic,
        key: m.key,
        value: toBuffer(m.value),
        headers: m.headers ? new Map(Object.entries(m.headers)) : undefined,
        partition: partitions[i],
      })),
    });
    const base = new Map<string, bigint>();
    for (const o of result.offsets ?? []) {
      base.set(partitionKey(o.topic, o.partition), BigInt(o.offset));
    }
    // A produce request appends each partition's messages in send order.
    const next = new Map<string, bigint>();
    return messages.map((m, i) => {
      const key = partitionKey(m.topic, partitions[i]);
      const offset = next.get(key) ?? base.get(key) ?? -1n;
      next.set(key, offset + 1n);
      return { topic: m.topic, partition: partitions[i], offset };
    });
  }
}
