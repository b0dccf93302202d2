/**
 * A consumer group member with manual commits only, a topic list that may
 * change while running (a fixed list, a `RegExp` matched against the broker's
 * topics, or a function), which survives the broker going away and coming
 * back.
 */
import { Buffer } from "node:buffer";
import {
  ConnectionPool,
  Consumer,
  type GroupAssignment,
  type Message,
  type MessagesStream,
  offsetCommitV8,
  stringDeserializer,
} from "@platformatic/kafka";
import { createAdmin, type KafkaAdmin } from "./admin.ts";
import { type Logger, silentLogger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND, within } from "../core/time.ts";
import {
  baseOptions,
  DEFAULT_REQUEST_TIMEOUT,
  identityBuffer,
  type KafkaClientOptions,
  partitionKey,
  RETRY_BASE,
  RETRY_CAP,
  type TopicPartitionOffset,
} from "./client.ts";

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
  /**
   * Set by the consumer after it handed this message out, when its
   * partition was redelivered from an offset at or before it, or revoked:
   * the message will come again (or go to another member), so a reader that
   * has not taken it in yet must drop it. A reader awaiting `next()` gets the
   * message a few microtasks after it left the buffer, and a redelivery or a
   * revocation may happen in between.
   */
  superseded?: boolean;
}

/** One partition of a topic. */
export interface TopicPartition {
  topic: string;
  partition: number;
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
  /** Bytes of values held the same way before fetching pauses (default 16 MiB). */
  maxBufferedBytes?: number;
  /** Group session timeout in ms (default 30 s). */
  sessionTimeoutMs?: number;
  /** Heartbeat interval in ms (default 3 s). */
  heartbeatIntervalMs?: number;
  /**
   * How long the coordinator waits for the members to rejoin during a
   * rebalance, in ms (default: the session timeout). A join can take that long.
   */
  rebalanceTimeoutMs?: number;
  /** Longest a fetch waits on the broker for data, in ms (default 500). */
  maxWaitMs?: number;
  /**
   * Most bytes one fetch asks for (default 8 MiB; the library's own default,
   * 50 MB, is held in memory per response). The broker still returns a
   * record batch larger than this, so no message is too large to consume.
   */
  maxFetchBytes?: number;
  /**
   * Told each time the consumer works around a library call that hung (see
   * `ConsumerRecovery`), e.g. to count them in a metric.
   */
  onRecovery?: (kind: ConsumerRecovery) => void;
}

/**
 * What the consumer did about a client library call that hung: a join that
 * did not finish (the client is rebuilt), a stream that stopped fetching
 * (restarted; rebuilt on the second in a row), a stream that did not end in
 * time (destroyed), a topic listing that did not finish (retried).
 */
export type ConsumerRecovery =
  | "join-timeout"
  | "stream-stalled"
  | "stream-close-timeout"
  | "list-topics-timeout";

/**
 * A consumer group member with manual commits. Iterate it (once) to receive
 * messages; the iteration ends when `close()` is called.
 */
export interface KafkaConsumer extends AsyncIterable<ConsumedMessage> {
  /**
   * Commits, for each partition, `offset` = the next offset to read (the last
   * processed message's offset + 1), of the partitions this member owns.
   * Retries until committed or closed. Each attempt is sent under the group
   * generation that assigned those partitions to this member, so the broker
   * refuses it once the group has moved on: a partition given to another
   * member meanwhile is never committed from here (which could move the new
   * owner's committed offset back over work it did not redo).
   */
  commit(offsets: TopicPartitionOffset[]): Promise<void>;
  /**
   * Hands out `partition` of `topic` again from `offset` on, whatever was
   * handed out or buffered after it: the next message of that partition the
   * iteration yields is the first at or after `offset`. The caller dropped
   * those messages (e.g. to pause one partition without stopping the others)
   * and must not have committed past `offset`. Fetching restarts from the
   * committed offsets (the group rejoins); other partitions never see a
   * message twice.
   */
  redeliverFrom(topic: string, partition: number, offset: bigint): void;
  /**
   * Calls `listener` with the partitions this member no longer owns, each
   * time some are taken away: a rebalance gave them to another member (the
   * library reports each new assignment once the group is joined; the
   * difference from the previous one is what was revoked), or the membership
   * was lost with a rebuilt client. By then their buffered messages are
   * dropped, and whatever is fetched for them later is never handed out nor
   * committed (`commit` leaves them out); assigned again, a partition is
   * handed out again from its committed offset. Revocation is learnt once
   * the group is joined again, at the moment the new owner gets the
   * partition: the new owner starts from the committed offset, so what this
   * member did but had not committed yet, and its work still under way, may
   * be done by both (the reader's idempotence must cover that).
   */
  onRevoked(listener: (partitions: TopicPartition[]) => void): void;
  /** The partitions the group last assigned to this member; undefined until it first joined. */
  readonly assignment: readonly TopicPartition[] | undefined;
  /**
   * How many times this member joined the group (each join is a rebalance,
   * which stops every member of the group for its duration).
   */
  readonly joins: number;
  /** Replaces a list selection (a no-op change is free); the group rebalances. */
  subscribe(topics: string[]): void;
  /** The topics currently subscribed. */
  readonly topics: readonly string[];
  /** Stops fetching, ends the iteration and leaves the group. Idempotent. */
  close(): Promise<void>;
}
type RawMessage = Message<string, Buffer, string, string>;

// How long a stream gets to end once asked to; then it is destroyed.
const STREAM_CLOSE_TIMEOUT = 5 * SECOND;

/** What waiting on library work with a deadline came to. */
type Settled<T> = { value: T } | "timed-out" | "stopped";

/**
 * Waits for `work` at most `ms`, or until `signal` aborts; what it yields
 * after that goes to `orphan` (e.g. a stream nobody will read is closed).
 */
async function settleWithin<T>(
  work: Promise<T>,
  ms: number,
  signal: AbortSignal,
  orphan: (value: T) => unknown = () => {},
): Promise<Settled<T>> {
  const done = new AbortController();
  const stopped = AbortSignal.any([signal, done.signal]);
  try {
    const outcome = await Promise.race<Settled<T>>([
      work.then((value) => ({ value })),
      delay(ms, stopped).then(() => signal.aborted ? "stopped" : "timed-out"),
    ]);
    if (typeof outcome === "string") work.then(orphan).catch(() => {});
    return outcome;
  } finally {
    done.abort();
  }
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
  #bufferedBytes = 0;
  readonly #maxBufferedBytes: number;
  // Streams being closed: a late batch of theirs must not be handed out (after
  // a redelivery it would move past the offset asked for); the next stream
  // fetches it again.
  readonly #retired = new WeakSet<object>();
  // Per stream, ends its #pump: #closeStream calls it once the stream was
  // asked to end (or destroyed), whether or not the library says "close".
  readonly #pumpEnds = new WeakMap<object, () => void>();
  #wake: (() => void) | undefined;
  // The offset after the last message handed out per partition: after a
  // re-subscription or a rebuilt client the group restarts from the committed
  // offsets, and what was already handed out must not be handed out twice.
  #delivered = new Map<string, bigint>();
  #restartRequested = false;
  // Topics kept tracked on the client across a stream restart that is not a
  // re-subscription: the library joins the group again when a consume tracks
  // a topic anew, and a rejoin stops every member of the group (a Postgres
  // outage that pauses and resumes partitions would otherwise rebalance the
  // group each time). Held, the next consume reuses the membership and its
  // assignment, and only fetches again from the committed offsets.
  #held: { client: object; topics: string[] } | undefined;
  // The last message the iteration handed out: it may still be on its way to
  // the reader when its partition is redelivered or revoked.
  #handedOut: ConsumedMessage | undefined;
  // The group's last assignment to this member (by partitionKey); undefined
  // before the first join, when nothing can have been revoked.
  #owned: Map<string, TopicPartition> | undefined;
  // The membership #owned was assigned under: commits are sent as it (see commit()).
  #member: { generationId: number; memberId: string } | undefined;
  // Commits go over their own connection, not through the client (see #commitAs).
  #commitPool: ConnectionPool | undefined;
  readonly #revokedListeners: ((partitions: TopicPartition[]) => void)[] = [];
  #iterating = false;
  #joins = 0;
  // Streams in a row that stopped fetching (see #pump); at two, the client
  // itself is suspect and is rebuilt before the next stream.
  #stalls = 0;
  #closing: Promise<void> | undefined;
  #running: Promise<void>;

  constructor(opts: ConsumerOptions) {
    this.#opts = opts;
    this.#selection = opts.topics;
    this.#log = (opts.logger ?? silentLogger).with({ group: opts.groupId });
    this.#maxBuffered = opts.maxBuffered ?? 1000;
    this.#maxBufferedBytes = opts.maxBufferedBytes ?? 16 * 1024 * 1024;
    this.#running = this.#run();
  }

  get topics(): readonly string[] {
    return this.#subscribed;
  }

  get joins(): number {
    return this.#joins;
  }

  get assignment(): readonly TopicPartition[] | undefined {
    return this.#owned && [...this.#owned.values()];
  }

  onRevoked(listener: (partitions: TopicPartition[]) => void): void {
    this.#revokedListeners.push(listener);
  }

  subscribe(topics: string[]): void {
    this.#selection = [...topics];
    void this.#checkTopics();
  }

  redeliverFrom(topic: string, partition: number, offset: bigint): void {
    if (this.#stop.signal.aborted) return;
    const key = partitionKey(topic, partition);
    const next = this.#delivered.get(key);
    if (next !== undefined && next <= offset) return;
    this.#delivered.set(key, offset);
    const last = this.#handedOut;
    if (last && last.topic === topic && last.partition === partition && last.offset >= offset) {
      last.superseded = true;
    }
    const kept = this.#buffer.filter((m) =>
      m.topic !== topic || m.partition !== partition || m.offset < offset
    );
    this.#buffer = kept;
    this.#bufferedBytes = kept.reduce((n, m) => n + m.value.byteLength, 0);
    // The library cannot seek one partition; a new stream starts from the
    // committed offsets, and #delivered drops what was handed out already.
    this.#restartStream();
  }

  async commit(offsets: TopicPartitionOffset[]): Promise<void> {
    for (let attempt = 0;; attempt++) {
      if (this.#stop.signal.aborted) throw new Error("kafka consumer is closed");
      // Re-checked on every attempt: a retry may come after a rebalance, and
      // is sent under the generation that assigned what it commits. Before
      // the first join (or after the membership was lost) nothing is owned.
      const owned = this.#owned;
      const member = this.#member;
      const client = this.#client;
      if (owned && member && client) {
        const mine = offsets.filter((o) => owned.has(partitionKey(o.topic, o.partition)));
        if (mine.length === 0) return;
        try {
          await this.#commitAs(client, member, mine);
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

  /**
   * One OffsetCommit request as `member`, to the group's coordinator. Not
   * `client.commit()`: on a generation error the library joins the group
   * again and sends the same offsets under the new generation, whatever the
   * new assignment says (seen in chaos runs: a relay's late commit moved a
   * partition's offset back after its new owner had committed past it, and
   * the messages in between were never read again). OffsetCommit v8 needs
   * Kafka 2.4 or later (Kafka 4 serves v2 to v9).
   */
  async #commitAs(
    client: Consumer<string, Buffer, string, string>,
    member: { generationId: number; memberId: string },
    offsets: TopicPartitionOffset[],
  ): Promise<void> {
    const requestTimeout = this.#opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT;
    const work = (async () => {
      const coordinator = await client.findGroupCoordinator();
      const metadata = await client.metadata({ topics: this.#subscribed });
      const broker = metadata.brokers.get(coordinator);
      if (!broker) {
        throw new Error(`the group coordinator (node ${coordinator}) is not in the metadata`);
      }
      // close() closes the pool it finds; none is opened after it.
      if (this.#stop.signal.aborted) throw new Error("kafka consumer is closed");
      this.#commitPool ??= new ConnectionPool(`${this.#opts.clientId}-commits`, {
        connectTimeout: this.#opts.connectTimeoutMs,
        requestTimeout,
      });
      const connection = await this.#commitPool.get(broker);
      const topics = new Map<string, offsetCommitV8.OffsetCommitRequestTopic>();
      for (const o of offsets) {
        let topic = topics.get(o.topic);
        if (!topic) topics.set(o.topic, topic = { name: o.topic, partitions: [] });
        topic.partitions.push({
          partitionIndex: o.partition,
          committedOffset: o.offset,
          committedLeaderEpoch: -1,
        });
      }
      await offsetCommitV8.api.async(
        connection,
        this.#opts.groupId,
        member.generationId,
        member.memberId,
        null,
        [...topics.values()],
      );
    })();
    // Each step is bounded by the request timeout; together they must be too.
    const done = await settleWithin(work, 3 * requestTimeout, this.#stop.signal)
      .catch((error) => ({ error }));
    if (typeof done === "object" && "value" in done) return;
    // The next attempt connects afresh: a connection to a broker that went
    // away is not always noticed by the pool.
    const pool = this.#commitPool;
    this.#commitPool = undefined;
    void pool?.close().catch(() => {});
    if (done === "stopped") throw new Error("kafka consumer is closed");
    throw done === "timed-out" ? new Error("the commit did not finish in time") : done.error;
  }

  [Symbol.asyncIterator](): AsyncIterator<ConsumedMessage> {
    if (this.#iterating) throw new Error("a kafka consumer can be iterated only once");
    this.#iterating = true;
    return {
      next: async (): Promise<IteratorResult<ConsumedMessage>> => {
        while (true) {
          const message = this.#buffer.shift();
          if (message) {
            this.#handedOut = message;
            this.#bufferedBytes -= message.value.byteLength;
            if (
              this.#buffer.length < this.#maxBuffered / 2 &&
              this.#bufferedBytes < this.#maxBufferedBytes / 2 && this.#stream?.isPaused()
            ) {
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
      await this.#commitPool?.close().catch(() => {});
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
    const requestTimeout = this.#opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT;
    let attempt = 0;
    try {
      while (!this.#stop.signal.aborted) {
        let failed = false;
        try {
          // Listing topics asks the broker; a library call that never answers
          // must not hold the consumer (nor close()) for good.
          const listed = await settleWithin(
            this.#resolveTopics(),
            3 * requestTimeout,
            this.#stop.signal,
          );
          if (listed === "stopped") break;
          if (listed === "timed-out") {
            this.#opts.onRecovery?.("list-topics-timeout");
            throw new Error("listing topics did not finish");
          }
          const topics = listed.value;
          if (topics.length === 0) {
            this.#subscribed = [];
            await delay(refresh, this.#stop.signal);
            continue;
          }
          if (this.#stalls >= 2) {
            this.#stalls = 0;
            await this.#dropClient(true);
          }
          const client = this.#client ??= this.#newClient();
          this.#restartRequested = false;
          // Holding other topics than these would subscribe the group to them.
          if (this.#held && !sameTopics(this.#held.topics, topics)) this.#releaseHeld();
          const sessionTimeout = this.#opts.sessionTimeoutMs ?? 30 * SECOND;
          const rebalanceTimeout = Math.max(
            this.#opts.rebalanceTimeoutMs ?? sessionTimeout,
            sessionTimeout,
          );
          const joining = client.consume({
            topics,
            mode: "committed",
            fallbackMode: this.#opts.startFrom ?? "earliest",
            autocommit: false,
            maxWaitTime: this.#opts.maxWaitMs ?? 500,
            maxBytes: this.#opts.maxFetchBytes ?? 8 * 1024 * 1024,
            sessionTimeout,
            // The library's default (102 s) would let one member that never
            // rejoins hold every other member's join that long.
            rebalanceTimeout,
            heartbeatInterval: this.#opts.heartbeatIntervalMs ?? 3 * SECOND,
          }).catch((error) => {
            // A consume that failed (e.g. its join) leaves its topics tracked;
            // the next one would then see no change, skip the join and fetch
            // without being a member.
            client.topics.untrackAll(...topics);
            throw error;
          });
          // A join waits on the group (at most the rebalance timeout) and on
          // requests that time out and are retried; past that budget it is
          // not coming, and close() must not wait on it either.
          const joinBudget = rebalanceTimeout + 2 * requestTimeout;
          const joined = await settleWithin(
            joining,
            joinBudget,
            this.#stop.signal,
            (stream) => stream.close(),
          ).finally(() => this.#releaseHeld());
          if (joined === "stopped") break;
          if (joined === "timed-out") {
            // A fresh client next: this one's group state is stuck.
            this.#opts.onRecovery?.("join-timeout");
            await this.#dropClient(true);
            throw new Error(
              `kafka consumer join did not finish in ${joinBudget} ms; the client was rebuilt`,
            );
          }
          const stream = joined.value;
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
    // Ours are the first listeners (the library's streams register theirs
    // when created): the assignment is known here before anything of a new
    // one is fetched.
    client.on(
      "consumer:group:join",
      (event: { generationId?: number; memberId?: string; assignments?: GroupAssignment[] }) => {
        if (client !== this.#client) return;
        this.#joins++;
        this.#member = event.generationId !== undefined && event.memberId
          ? { generationId: event.generationId, memberId: event.memberId }
          : undefined;
        this.#assigned(event.assignments ?? []);
      },
    );
    client.on("consumer:group:leave", () => {
      if (client === this.#client) this.#assigned([]);
    });
    client.on(
      "consumer:heartbeat:error",
      (payload: { error: Error }) =>
        this.#log.debug("kafka heartbeat failed", { error: payload.error }),
    );
    return client;
  }

  /** Records the group's new assignment to this member and reports what it took away. */
  #assigned(assignments: GroupAssignment[]): void {
    if (assignments.length === 0) this.#member = undefined;
    const now = new Map<string, TopicPartition>();
    for (const { topic, partitions } of assignments) {
      for (const partition of partitions) {
        now.set(partitionKey(topic, partition), { topic, partition });
      }
    }
    const before = this.#owned;
    this.#owned = now;
    // Leaving the group at close() is no news to whoever closed it.
    if (!before || this.#stop.signal.aborted) return;
    const revoked = [...before].filter(([key]) => !now.has(key));
    if (revoked.length === 0) return;
    const keys = new Set(revoked.map(([key]) => key));
    // Assigned again later, the partition starts over from its committed
    // offset: what was handed out of it and dropped must come again.
    for (const key of keys) this.#delivered.delete(key);
    const last = this.#handedOut;
    if (last && keys.has(partitionKey(last.topic, last.partition))) last.superseded = true;
    const kept = this.#buffer.filter((m) => !keys.has(partitionKey(m.topic, m.partition)));
    if (kept.length !== this.#buffer.length) {
      this.#buffer = kept;
      this.#bufferedBytes = kept.reduce((n, m) => n + m.value.byteLength, 0);
    }
    const partitions = revoked.map(([, tp]) => tp);
    this.#log.info("kafka partitions revoked", {
      revoked: partitions.length,
      assigned: now.size,
    });
    for (const listener of this.#revokedListeners) {
      try {
        listener(partitions);
      } catch (error) {
        this.#log.error("a revocation listener failed", { error });
      }
    }
  }

  /** Ends the current stream for #run to start another, in the same membership (see #held). */
  #restartStream(): void {
    if (!this.#stream) return;
    this.#restartRequested = true;
    const client = this.#client;
    if (client && !this.#held) {
      client.topics.trackAll(...this.#subscribed);
      this.#held = { client, topics: [...this.#subscribed] };
    }
    void this.#closeStream();
  }

  /** Lets go of the topics a restart kept tracked (see #held). */
  #releaseHeld(): void {
    const held = this.#held;
    this.#held = undefined;
    if (held && held.client === this.#client) this.#client?.topics.untrackAll(...held.topics);
  }

  async #dropClient(force: boolean): Promise<void> {
    const client = this.#client;
    this.#held = undefined;
    // Its membership goes with it: a new client joins as a new member.
    if (client) this.#assigned([]);
    this.#client = undefined;
    if (!client) return;
    // Leaving the group needs the broker; when it is gone, don't wait for it.
    const closing = client.close(force).catch(() => {});
    if (!await within(closing, 5 * SECOND)) await client.close(true).catch(() => {});
  }

  async #closeStream(): Promise<void> {
    const stream = this.#stream;
    this.#stream = undefined;
    if (!stream) return;
    this.#retired.add(stream);
    try {
      await this.#endStream(stream);
    } finally {
      // The stream's "close" event waits on the library tearing down its
      // connections, which has been seen never to finish: #run must go on
      // regardless.
      this.#pumpEnds.get(stream)?.();
    }
  }

  async #endStream(stream: MessagesStream<string, Buffer, string, string>): Promise<void> {
    if (stream.destroyed) return;
    // Ending waits on the fetch under way; one that never answers must not
    // hold a restart (or close()) for good.
    const closed = await within(stream.close(), STREAM_CLOSE_TIMEOUT).catch(() => true);
    if (!closed) {
      this.#opts.onRecovery?.("stream-close-timeout");
      this.#log.warn("kafka stream did not end in time, destroying it", {
        waited_ms: STREAM_CLOSE_TIMEOUT,
      });
      stream.destroy();
    }
  }

  /** Whether this member owns a partition of the topics it reads: then its stream must fetch. */
  #owesFetches(): boolean {
    const subscribed = new Set(this.#subscribed);
    for (const { topic } of this.#owned?.values() ?? []) if (subscribed.has(topic)) return true;
    return false;
  }

  // Resolves when the stream ends: closed for a re-subscription or close(),
  // or failed (then rejects).
  #pump(stream: MessagesStream<string, Buffer, string, string>): Promise<void> {
    // A stream fetches without pause while it owns partitions: each fetch
    // answers within the broker's wait (maxWaitMs) or fails within the
    // request timeout. One that goes quiet for longer has lost a callback
    // inside the library (seen after broker restarts amid rebalances: it never
    // fetched again, with no error); it is started again, and when the next
    // one stalls too, the client is rebuilt.
    const stallMs = (this.#opts.maxWaitMs ?? 500) +
      (this.#opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT) + 2 * SECOND;
    let lastFetch = Date.now();
    const watchdog = setInterval(() => {
      if (this.#retired.has(stream)) return;
      // Paused by #pump (a full buffer), or nothing to fetch: not a stall.
      if (stream.isPaused() || !this.#owesFetches()) lastFetch = Date.now();
      if (Date.now() - lastFetch < stallMs) return;
      clearInterval(watchdog);
      this.#stalls++;
      this.#opts.onRecovery?.("stream-stalled");
      this.#log.warn("kafka stream stopped fetching, starting it again", {
        quiet_ms: Date.now() - lastFetch,
        stalls: this.#stalls,
      });
      if (stream === this.#stream) this.#restartStream();
    }, Math.min(SECOND, stallMs / 4));
    stream.on("fetch", () => {
      lastFetch = Date.now();
      this.#stalls = 0;
    });
    return new Promise<void>((resolve, reject) => {
      this.#pumpEnds.set(stream, resolve);
      stream.once("error", (error: Error) => reject(error));
      stream.once("close", () => resolve());
      stream.on("data", (m: RawMessage) => {
        if (this.#retired.has(stream)) return;
        const key = partitionKey(m.topic, m.partition);
        // A fetch that was under way when the partition was revoked.
        if (this.#owned && !this.#owned.has(key)) return;
        const next = this.#delivered.get(key);
        if (next !== undefined && m.offset < next) return;
        this.#delivered.set(key, m.offset + 1n);
        const headers: Record<string, string> = {};
        for (const [k, v] of m.headerEntries) headers[k] = v ?? "";
        const value = m.value ?? new Uint8Array(0);
        this.#buffer.push({
          topic: m.topic,
          partition: m.partition,
          offset: m.offset,
          key: m.key ?? "",
          value,
          headers,
          timestamp: Number(m.timestamp),
        });
        this.#bufferedBytes += value.byteLength;
        if (
          this.#buffer.length >= this.#maxBuffered || this.#bufferedBytes >= this.#maxBufferedBytes
        ) stream.pause();
        this.#wakeReader();
      });
    }).finally(() => clearInterval(watchdog));
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
