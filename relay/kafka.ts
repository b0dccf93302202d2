/**
 * The Kafka client of poimen: the one module that imports a Kafka library
 * (today @platformatic/kafka), behind a small typed interface so the library
 * can be swapped without touching the relays.
 *
 * - `createProducer`: idempotent producer, `send` resolves after the broker
 *   acknowledged every message (acks=all).
 * - `createConsumer`: a consumer group with manual commits only, a topic list
 *   that may change while running (a fixed list, a `RegExp` matched against
 *   the broker's topics, or a function), which survives the broker going
 *   away and coming back.
 * - `createAdmin`: idempotent topic declaration, listing, deletion and the
 *   offsets a lag metric needs.
 *
 * Offsets follow Kafka's convention everywhere: a committed offset is the
 * offset of the NEXT message to read (last processed offset + 1).
 */
import { Buffer } from "node:buffer";
import {
  Admin,
  Consumer,
  findErrorBy,
  type Message,
  type MessagesStream,
  murmur2,
  Producer,
  stringDeserializer,
  stringSerializer,
} from "@platformatic/kafka";
import { type Logger, silentLogger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { tenantTopics } from "../contracts/topics.ts";

export * from "../contracts/topics.ts";

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

/** Options of `createProducer`. */
export interface ProducerOptions extends KafkaClientOptions {
  /**
   * How often one send is retried (network errors, leader changes) before it
   * rejects. Default: without limit, so a send waits out a broker restart;
   * `close()` still ends it.
   */
  retries?: number;
}

/** A message as consumed. */
export interface ConsumedMessage {
  topic: string;
  partition: number;
  offset: bigint;
  /** The key as UTF-8 text ("" when the message has none). */
  key: string;
  value: Uint8Array;
  /** Headers as UTF-8 text; of a repeated header the last value wins. */
  headers: Record<string, string>;
  /** The record's timestamp, ms since the epoch. */
  timestamp: number;
}

/** Which topics a consumer reads; re-evaluated every `topicRefreshMs`. */
export type TopicSelection = string[] | RegExp | (() => string[] | Promise<string[]>);

/** Options of `createConsumer`. */
export interface ConsumerOptions extends KafkaClientOptions {
  groupId: string;
  topics: TopicSelection;
  /** How often the topic selection is re-evaluated, in ms (default 5 s). */
  topicRefreshMs?: number;
  /** Where a partition without a committed offset starts: earliest (default) or latest. */
  startFrom?: "earliest" | "latest";
  /** Consumed but not yet iterated messages held before fetching pauses (default 1000). */
  maxBuffered?: number;
  /** Group session timeout in ms (default 30 s). */
  sessionTimeoutMs?: number;
  /** Heartbeat interval in ms (default 3 s). */
  heartbeatIntervalMs?: number;
  /** Longest a fetch waits on the broker for data, in ms (default 500). */
  maxWaitMs?: number;
}

/**
 * A consumer group member with manual commits. Iterate it (once) to receive
 * messages; the iteration ends when `close()` is called.
 */
export interface KafkaConsumer extends AsyncIterable<ConsumedMessage> {
  /**
   * Commits, for each partition, `offset` = the next offset to read (the last
   * processed message's offset + 1). Retries until committed or closed.
   */
  commit(offsets: TopicPartitionOffset[]): Promise<void>;
  /** Replaces a list selection (a no-op change is free); the group rebalances. */
  subscribe(topics: string[]): void;
  /** The topics currently subscribed. */
  readonly topics: readonly string[];
  /** Stops fetching, ends the iteration and leaves the group. Idempotent. */
  close(): Promise<void>;
}

/** A topic to declare. */
export interface TopicSpec {
  name: string;
  partitions: number;
  replicationFactor: number;
  /** Topic-level configuration, e.g. `{"retention.ms": "604800000"}`. */
  configs?: Record<string, string>;
}

/** Administrative operations. */
export interface KafkaAdmin {
  /**
   * Creates the topics that are missing (one that already exists counts as
   * success) and resolves once the new ones are visible in the metadata.
   */
  createTopics(topics: TopicSpec[]): Promise<{ created: string[]; existing: string[] }>;
  /** Names of all non-internal topics. */
  listTopics(): Promise<string[]>;
  /** Deletes topics; one that does not exist counts as success. */
  deleteTopics(topics: string[]): Promise<void>;
  /** Partition count of each of `topics` that exists. */
  partitionCounts(topics: string[]): Promise<Map<string, number>>;
  /**
   * Committed offsets (next offset to read) of `groupId`, for every partition
   * it has committed on (restricted to `topics` when given), sorted.
   */
  committedOffsets(groupId: string, topics?: string[]): Promise<TopicPartitionOffset[]>;
  /** End (high-water) offset of every partition of `topics` (the next message's offset), sorted. */
  endOffsets(topics: string[]): Promise<TopicPartitionOffset[]>;
  /** Earliest offset still held (after retention) of every partition of `topics`, sorted. */
  startOffsets(topics: string[]): Promise<TopicPartitionOffset[]>;
  close(): Promise<void>;
}

const DEFAULT_REQUEST_TIMEOUT = 10 * SECOND;
const DEFAULT_CONNECT_TIMEOUT = 5 * SECOND;
const RETRY_BASE = 100;
const RETRY_CAP = 5 * SECOND;

// Full jitter spreads the reconnects of many clients that lost the same broker;
// the floor keeps a zero draw from becoming a busy loop.
function retryDelay(_client: unknown, _op: string, attempt: number): number {
  return Math.max(50, backoffWithJitter(attempt, RETRY_BASE, RETRY_CAP));
}

function baseOptions(opts: KafkaClientOptions) {
  return {
    clientId: opts.clientId,
    bootstrapBrokers: opts.brokers,
    timeout: opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT,
    connectTimeout: opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT,
    retryDelay,
  };
}

function toBuffer(value: string | Uint8Array): Buffer {
  if (typeof value === "string") return Buffer.from(value, "utf8");
  // Wrap, don't copy: the library only reads it.
  return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
}

function identityBuffer(data?: Buffer): Buffer | undefined {
  return data;
}

function isApiError(error: unknown, apiId: string): boolean {
  return error instanceof Error && findErrorBy(error, "apiId", apiId) !== null;
}

/** Creates an idempotent (acks=all) producer; connects on first send. */
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
      if (messages.length === 0) return [];
      // Partitions are chosen here, as the Java client does (murmur2 & 0x7fffffff),
      // so that every producer of a key agrees on its partition and so that
      // each message's offset can be told from the per-partition base offsets.
      const topics = [...new Set(messages.map((m) => m.topic))];
      const metadata = await producer.metadata({ topics });
      const partitions = messages.map((m) => {
        if (m.partition !== undefined) return m.partition;
        const count = metadata.topics.get(m.topic)?.partitionsCount ?? 1;
        return (murmur2(Buffer.from(m.key, "utf8")) & 0x7fffffff) % count;
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
    },
    async close() {
      if (closed) return;
      closed = true;
      await producer.close();
    },
  };
}

function sortOffsets(offsets: TopicPartitionOffset[]): TopicPartitionOffset[] {
  return offsets.sort((a, b) =>
    a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition
  );
}

/** Creates an admin client; connects on first use. */
export function createAdmin(opts: KafkaClientOptions & { retries?: number }): KafkaAdmin {
  const admin = new Admin({ ...baseOptions(opts), retries: opts.retries ?? 3 });
  let closed = false;

  async function partitionCounts(topics: string[]): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    if (topics.length === 0) return out;
    // Asked one by one: a metadata request naming a missing topic fails as a whole.
    const existing = new Set(await admin.listTopics());
    const wanted = topics.filter((t) => existing.has(t));
    if (wanted.length === 0) return out;
    const metadata = await admin.metadata({ topics: wanted, forceUpdate: true });
    for (const t of wanted) {
      const meta = metadata.topics.get(t);
      if (meta) out.set(t, meta.partitionsCount);
    }
    return out;
  }

  async function offsetsAt(topics: string[], timestamp: bigint): Promise<TopicPartitionOffset[]> {
    const counts = await partitionCounts(topics);
    if (counts.size === 0) return [];
    const listed = await admin.listOffsets({
      topics: [...counts].map(([name, n]) => ({
        name,
        partitions: Array.from({ length: n }, (_, partitionIndex) => ({
          partitionIndex,
          timestamp,
        })),
      })),
    });
    return sortOffsets(
      listed.flatMap((t) =>
        t.partitions.map((p) => ({ topic: t.name, partition: p.partitionIndex, offset: p.offset }))
      ),
    );
  }

  return {
    async createTopics(specs) {
      const created: string[] = [];
      const existing: string[] = [];
      // One request per topic: the library fails a whole batch when any topic
      // of it already exists, and declaration is rare.
      for (const spec of specs) {
        try {
          await admin.createTopics({
            topics: [spec.name],
            partitions: spec.partitions,
            replicas: spec.replicationFactor,
            configs: Object.entries(spec.configs ?? {}).map(([name, value]) => ({ name, value })),
          });
          created.push(spec.name);
        } catch (error) {
          if (!isApiError(error, "TOPIC_ALREADY_EXISTS")) throw error;
          existing.push(spec.name);
        }
      }
      // The controller answers before the brokers' metadata caught up; wait,
      // so that a declared topic can be produced to and listed at once.
      const deadline = Date.now() + 10 * SECOND;
      while (created.length > 0 && Date.now() < deadline) {
        const listed = new Set(await admin.listTopics());
        if (created.every((t) => listed.has(t))) break;
        await delay(50);
      }
      return { created, existing };
    },
    listTopics() {
      return admin.listTopics({ includeInternals: false });
    },
    async deleteTopics(topics) {
      for (const topic of topics) {
        try {
          await admin.deleteTopics({ topics: [topic] });
        } catch (error) {
          if (!isApiError(error, "UNKNOWN_TOPIC_OR_PARTITION")) throw error;
        }
      }
    },
    partitionCounts,
    async committedOffsets(groupId, topics) {
      const groups = await admin.listConsumerGroupOffsets({ groups: [groupId] });
      const wanted = topics ? new Set(topics) : undefined;
      const out: TopicPartitionOffset[] = [];
      for (const group of groups) {
        for (const topic of group.topics) {
          if (wanted && !wanted.has(topic.name)) continue;
          for (const p of topic.partitions) {
            // -1 means "nothing committed on this partition".
            if (p.committedOffset < 0n) continue;
            out.push({ topic: topic.name, partition: p.partitionIndex, offset: p.committedOffset });
          }
        }
      }
      return sortOffsets(out);
    },
    // Timestamp -1 asks for the latest offset (the high-water mark), -2 for the earliest.
    endOffsets: (topics) => offsetsAt(topics, -1n),
    startOffsets: (topics) => offsetsAt(topics, -2n),
    async close() {
      if (closed) return;
      closed = true;
      await admin.close();
    },
  };
}

/** Retention and layout of the per-tenant topics. */
export interface TenantTopicOptions {
  partitions: number;
  replicationFactor: number;
  retentionMs: number;
}

/**
 * Declares a tenant's `events`, `dispatch` and `dispatch.dlq` topics;
 * idempotent (topics that exist are left as they are). Says which were new.
 */
export function ensureTenantTopics(
  admin: KafkaAdmin,
  tenant: string,
  opts: TenantTopicOptions,
): Promise<{ created: string[]; existing: string[] }> {
  const names = tenantTopics(tenant);
  return admin.createTopics(names.map((name) => ({
    name,
    partitions: opts.partitions,
    replicationFactor: opts.replicationFactor,
    configs: { "retention.ms": String(opts.retentionMs) },
  })));
}

type RawMessage = Message<string, Buffer, string, string>;

function partitionKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

function sameTopics(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((t, i) => t === b[i]);
}

/**
 * Creates a consumer group member with manual commits. It joins on creation,
 * re-subscribes when the topic selection changes, and rebuilds its client
 * with backoff when the broker goes away, without limit until `close()`.
 */
export function createConsumer(opts: ConsumerOptions): KafkaConsumer {
  return new GroupConsumer(opts);
}

class GroupConsumer implements KafkaConsumer {
  readonly #opts: ConsumerOptions;
  readonly #log: Logger;
  readonly #maxBuffered: number;
  readonly #stop = new AbortController();
  #selection: TopicSelection;
  #subscribed: string[] = [];
  #client: Consumer<string, Buffer, string, string> | undefined;
  #stream: MessagesStream<string, Buffer, string, string> | undefined;
  #lister: KafkaAdmin | undefined;
  #buffer: ConsumedMessage[] = [];
  #wake: (() => void) | undefined;
  // The offset after the last message handed out per partition: after a
  // re-subscription or a rebuilt client the group restarts from the committed
  // offsets, and what was already handed out must not be handed out twice.
  #delivered = new Map<string, bigint>();
  #restartRequested = false;
  #iterating = false;
  #closing: Promise<void> | undefined;
  #running: Promise<void>;

  constructor(opts: ConsumerOptions) {
    this.#opts = opts;
    this.#selection = opts.topics;
    this.#log = (opts.logger ?? silentLogger).with({ group: opts.groupId });
    this.#maxBuffered = opts.maxBuffered ?? 1000;
    this.#running = this.#run();
  }

  get topics(): readonly string[] {
    return this.#subscribed;
  }

  subscribe(topics: string[]): void {
    this.#selection = [...topics];
    void this.#checkTopics();
  }

  async commit(offsets: TopicPartitionOffset[]): Promise<void> {
    if (offsets.length === 0) return;
    const request = {
      offsets: offsets.map((o) => ({ ...o, leaderEpoch: -1 })),
    };
    for (let attempt = 0;; attempt++) {
      if (this.#stop.signal.aborted) throw new Error("kafka consumer is closed");
      const client = this.#client;
      if (client) {
        try {
          await client.commit(request);
          return;
        } catch (error) {
          if (this.#stop.signal.aborted) throw error;
          this.#log.warn("kafka commit failed, retrying", { error, attempt });
        }
      }
      await delay(
        Math.max(50, backoffWithJitter(attempt, RETRY_BASE, RETRY_CAP)),
        this.#stop.signal,
      );
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<ConsumedMessage> {
    if (this.#iterating) throw new Error("a kafka consumer can be iterated only once");
    this.#iterating = true;
    return {
      next: async (): Promise<IteratorResult<ConsumedMessage>> => {
        while (true) {
          const message = this.#buffer.shift();
          if (message) {
            if (this.#buffer.length < this.#maxBuffered / 2 && this.#stream?.isPaused()) {
              this.#stream.resume();
            }
            return { value: message, done: false };
          }
          if (this.#stop.signal.aborted) return { value: undefined, done: true };
          await new Promise<void>((resolve) => (this.#wake = resolve));
        }
      },
      return: (): Promise<IteratorResult<ConsumedMessage>> => {
        return this.close().then(() => ({ value: undefined, done: true }));
      },
    };
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#stop.abort();
      this.#wakeReader();
      await this.#closeStream();
      await this.#running.catch(() => {});
      await this.#dropClient(false);
      await this.#lister?.close().catch(() => {});
    })();
    return this.#closing;
  }

  #wakeReader() {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  async #run(): Promise<void> {
    const refresh = this.#opts.topicRefreshMs ?? 5 * SECOND;
    const watcher = setInterval(() => void this.#checkTopics(), refresh);
    let attempt = 0;
    try {
      while (!this.#stop.signal.aborted) {
        let failed = false;
        try {
          const topics = await this.#resolveTopics();
          if (topics.length === 0) {
            this.#subscribed = [];
            await delay(refresh, this.#stop.signal);
            continue;
          }
          const client = this.#client ??= this.#newClient();
          this.#restartRequested = false;
          const stream = await client.consume({
            topics,
            mode: "committed",
            fallbackMode: this.#opts.startFrom ?? "earliest",
            autocommit: false,
            maxWaitTime: this.#opts.maxWaitMs ?? 500,
            sessionTimeout: this.#opts.sessionTimeoutMs ?? 30 * SECOND,
            heartbeatInterval: this.#opts.heartbeatIntervalMs ?? 3 * SECOND,
          }).catch((error) => {
            // A consume that failed (e.g. its join) leaves its topics tracked;
            // the next one would then see no change, skip the join and fetch
            // without being a member.
            client.topics.untrackAll(...topics);
            throw error;
          });
          if (this.#stop.signal.aborted) {
            await stream.close();
            break;
          }
          this.#forgetTopicsNotIn(topics);
          this.#stream = stream;
          this.#subscribed = topics;
          this.#log.info("kafka consumer subscribed", { topics: topics.length });
          attempt = 0;
          await this.#pump(stream);
        } catch (error) {
          if (this.#stop.signal.aborted) break;
          if (this.#restartRequested) continue;
          failed = true;
          this.#log.warn("kafka consumer failed, reconnecting", { error, attempt });
        } finally {
          await this.#closeStream();
        }
        if (failed) {
          // The same client first: it rejoins under its member id, which the
          // coordinator (which keeps members across its own restart) accepts at
          // once, whereas a new member waits for the old one's session to
          // expire. Only when that keeps failing, start over with a fresh one.
          if (attempt >= 10) await this.#dropClient(true);
          await delay(backoffWithJitter(attempt++, 200, RETRY_CAP) + 50, this.#stop.signal);
        }
      }
    } finally {
      clearInterval(watcher);
    }
  }

  #newClient(): Consumer<string, Buffer, string, string> {
    const client = new Consumer<string, Buffer, string, string>({
      ...baseOptions(this.#opts),
      retries: 5,
      groupId: this.#opts.groupId,
      autocommit: false,
      deserializers: {
        key: stringDeserializer,
        value: identityBuffer,
        headerKey: stringDeserializer,
        headerValue: stringDeserializer,
      },
    });
    // Without a listener an emitted 'error' would crash the process.
    client.on("error", (error: Error) => this.#log.warn("kafka consumer error", { error }));
    client.on(
      "consumer:heartbeat:error",
      (payload: { error: Error }) =>
        this.#log.debug("kafka heartbeat failed", { error: payload.error }),
    );
    return client;
  }

  async #dropClient(force: boolean): Promise<void> {
    const client = this.#client;
    this.#client = undefined;
    if (!client) return;
    // Leaving the group needs the broker; when it is gone, don't wait for it.
    const closing = client.close(force).catch(() => {});
    const timedOut = await Promise.race([
      closing.then(() => false),
      delay(5 * SECOND).then(() => true),
    ]);
    if (timedOut) await client.close(true).catch(() => {});
  }

  async #closeStream(): Promise<void> {
    const stream = this.#stream;
    this.#stream = undefined;
    if (stream && !stream.destroyed) await stream.close().catch(() => {});
  }

  // Resolves when the stream ends: closed for a re-subscription or close(),
  // or failed (then rejects).
  #pump(stream: MessagesStream<string, Buffer, string, string>): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      stream.on("data", (m: RawMessage) => {
        const key = partitionKey(m.topic, m.partition);
        const next = this.#delivered.get(key);
        if (next !== undefined && m.offset < next) return;
        this.#delivered.set(key, m.offset + 1n);
        const headers: Record<string, string> = {};
        for (const [k, v] of m.headerEntries) headers[k] = v ?? "";
        this.#buffer.push({
          topic: m.topic,
          partition: m.partition,
          offset: m.offset,
          key: m.key ?? "",
          value: m.value ?? new Uint8Array(0),
          headers,
          timestamp: Number(m.timestamp),
        });
        if (this.#buffer.length >= this.#maxBuffered) stream.pause();
        this.#wakeReader();
      });
      stream.once("error", (error: Error) => reject(error));
      stream.once("close", () => resolve());
    });
  }

  #forgetTopicsNotIn(topics: string[]) {
    const keep = new Set(topics);
    for (const key of this.#delivered.keys()) {
      // A topic that left the selection may be deleted and created anew, with
      // offsets from 0 again.
      if (!keep.has(key.slice(0, key.indexOf("\u0000")))) this.#delivered.delete(key);
    }
  }

  async #resolveTopics(): Promise<string[]> {
    const selection = this.#selection;
    let topics: string[];
    if (Array.isArray(selection)) topics = selection;
    else if (selection instanceof RegExp) {
      this.#lister ??= createAdmin({ ...this.#opts, clientId: `${this.#opts.clientId}-topics` });
      topics = (await this.#lister.listTopics()).filter((t) => selection.test(t));
    } else topics = await selection();
    return [...new Set(topics)].sort();
  }

  async #checkTopics(): Promise<void> {
    if (this.#stop.signal.aborted || !this.#stream) return;
    let topics: string[];
    try {
      topics = await this.#resolveTopics();
    } catch (error) {
      this.#log.debug("kafka topic refresh failed", { error });
      return;
    }
    if (sameTopics(topics, this.#subscribed) || !this.#stream) return;
    this.#log.info("kafka consumer topics changed, resubscribing", {
      before: this.#subscribed.length,
      after: topics.length,
    });
    this.#restartRequested = true;
    await this.#closeStream();
  }
}
