/**
 * The consumer's hand-out buffer: messages fetched and not yet iterated,
 * bounded in count and bytes, and what was handed out per partition, so that
 * a stream restarted from the committed offsets (after a redelivery, a
 * re-subscription or a rebuilt client) never hands a message out twice.
 */
import { partitionKey } from "./client.ts";
import type { ConsumedMessage, TopicPartition } from "./consumer.ts";

/** Limits of a `HandOutBuffer`. */
export interface HandOutLimits {
  /** Messages held before fetching should pause. */
  maxBuffered: number;
  /** Bytes of values held before fetching should pause. */
  maxBufferedBytes: number;
}

/** Messages waiting for the reader, in fetch order. */
export class HandOutBuffer {
  readonly #limits: HandOutLimits;
  #buffer: ConsumedMessage[] = [];
  #bytes = 0;
  // The offset after the last message handed out (or buffered) per partition.
  readonly #delivered = new Map<string, bigint>();
  // The last message taken: it may still be on its way to the reader when
  // its partition is redelivered or revoked.
  #handedOut: ConsumedMessage | undefined;
  #wake: (() => void) | undefined;

  constructor(limits: HandOutLimits) {
    this.#limits = limits;
  }

  /** Messages held. */
  get length(): number {
    return this.#buffer.length;
  }

  /** Bytes of values held. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * Buffers `m` unless it was handed out already; wakes a reader waiting.
   * Returns whether that filled the buffer, i.e. fetching should pause.
   */
  push(m: ConsumedMessage): boolean {
    const key = partitionKey(m.topic, m.partition);
    const next = this.#delivered.get(key);
    if (next !== undefined && m.offset < next) return false;
    this.#delivered.set(key, m.offset + 1n);
    this.#buffer.push(m);
    this.#bytes += m.value.byteLength;
    this.wake();
    return this.#full();
  }

  #full(): boolean {
    return this.#buffer.length >= this.#limits.maxBuffered ||
      this.#bytes >= this.#limits.maxBufferedBytes;
  }

  /** Below half of both limits: a paused fetch may resume. */
  get drained(): boolean {
    return this.#buffer.length < this.#limits.maxBuffered / 2 &&
      this.#bytes < this.#limits.maxBufferedBytes / 2;
  }

  /** The next message for the reader, if any. */
  take(): ConsumedMessage | undefined {
    const message = this.#buffer.shift();
    if (!message) return undefined;
    this.#handedOut = message;
    this.#bytes -= message.value.byteLength;
    return message;
  }

  /** Resolves at the next `push` or `wake`. */
  waitForMore(): Promise<void> {
    return new Promise<void>((resolve) => (this.#wake = resolve));
  }

  /** Lets a reader waiting in `waitForMore` go on. */
  wake(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  /**
   * Makes `partition` of `topic` come again from `offset` on: what was
   * buffered of it from there is dropped, the last message handed out is
   * marked superseded when it is at or after `offset`, and its fetch, from
   * the committed offset, hands out again from `offset`. Returns false when
   * nothing at or after `offset` was handed out or buffered.
   */
  redeliverFrom(topic: string, partition: number, offset: bigint): boolean {
    const key = partitionKey(topic, partition);
    const next = this.#delivered.get(key);
    if (next !== undefined && next <= offset) return false;
    this.#delivered.set(key, offset);
    const last = this.#handedOut;
    if (last && last.topic === topic && last.partition === partition && last.offset >= offset) {
      last.superseded = true;
    }
    this.#keep((m) => m.topic !== topic || m.partition !== partition || m.offset < offset);
    return true;
  }

  /**
   * Forgets `partitions`, revoked: their buffered messages are dropped, the
   * last message handed out is superseded when it is theirs, and assigned
   * again, they start over from their committed offsets.
   */
  revoke(partitions: readonly TopicPartition[]): void {
    const keys = new Set(partitions.map((p) => partitionKey(p.topic, p.partition)));
    for (const key of keys) this.#delivered.delete(key);
    const last = this.#handedOut;
    if (last && keys.has(partitionKey(last.topic, last.partition))) last.superseded = true;
    this.#keep((m) => !keys.has(partitionKey(m.topic, m.partition)));
  }

  /**
   * Forgets what was handed out of topics not in `topics`: a topic that left
   * the selection may be deleted and created anew, with offsets from 0 again.
   */
  forgetTopicsNotIn(topics: readonly string[]): void {
    const keep = new Set(topics);
    for (const key of this.#delivered.keys()) {
      if (!keep.has(key.slice(0, key.indexOf("\u0000")))) this.#delivered.delete(key);
    }
  }

  #keep(wanted: (m: ConsumedMessage) => boolean): void {
    const kept = this.#buffer.filter(wanted);
    if (kept.length === this.#buffer.length) return;
    this.#buffer = kept;
    this.#bytes = kept.reduce((n, m) => n + m.value.byteLength, 0);
  }
}
