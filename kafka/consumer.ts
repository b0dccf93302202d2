/**
 * A consumer group member with manual commits only, a topic list that may
 * change while running (a fixed list, a `RegExp` matched against the broker's
 * topics, or a function), which survives the broker going away and coming
 * back. Its parts: the supervisor (consumer_supervisor.ts) keeps a fetch
 * stream going over a narrow client interface (group_client.ts, adapted to
 * the library in platformatic_group_client.ts); the hand-out buffer
 * (hand_out_buffer.ts); commits fenced by the group generation
 * (fenced_commit.ts, assignment.ts); the topic selection (topic_selection.ts).
 */
import { type Logger, silentLogger } from "../core/log.ts";
import type { KafkaClientOptions, TopicPartitionOffset } from "./client.ts";
import { createAdmin } from "./admin.ts";
import { Assignment } from "./assignment.ts";
import {
  ConsumerSupervisor,
  type SupervisorTimings,
  supervisorTimings,
} from "./consumer_supervisor.ts";
import { FencedCommitter } from "./fenced_commit.ts";
import type { GroupClientFactory } from "./group_client.ts";
import { HandOutBuffer } from "./hand_out_buffer.ts";
import { platformaticGroupClient } from "./platformatic_group_client.ts";
import { type TopicLister, TopicSelector } from "./topic_selection.ts";

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
   * Most bytes one fetch asks for (default 8 MiB; @platformatic/kafka 2.12.1's default,
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

/**
 * Creates a consumer group member with manual commits. It joins on creation,
 * re-subscribes when the topic selection changes, and rebuilds its client
 * with backoff when the broker goes away, without limit until `close()`.
 */
export function createConsumer(opts: ConsumerOptions): KafkaConsumer {
  const log = (opts.logger ?? silentLogger).with({ group: opts.groupId });
  return new GroupConsumer(opts, {
    log,
    clients: (events) => platformaticGroupClient(opts, log, events),
    lister: () => createAdmin({ ...opts, clientId: `${opts.clientId}-topics` }),
  });
}

/** What a `GroupConsumer` is built from besides its options (a test gives fakes). */
export interface ConsumerDependencies {
  log: Logger;
  /** Makes the group client (again after a rebuild). */
  clients: GroupClientFactory;
  /** Makes the lister a `RegExp` selection asks (on first use). */
  lister: () => TopicLister;
  /** Overrides of the supervisor's timings (see `supervisorTimings`). */
  timings?: Partial<SupervisorTimings>;
}

/** `KafkaConsumer` out of its parts; see the module's comment. */
export class GroupConsumer implements KafkaConsumer {
  readonly #stop = new AbortController();
  readonly #topics: TopicSelector;
  readonly #buffer: HandOutBuffer;
  readonly #assignment = new Assignment();
  readonly #supervisor: ConsumerSupervisor;
  readonly #committer: FencedCommitter;
  readonly #revokedListeners: ((partitions: TopicPartition[]) => void)[] = [];
  readonly #log: Logger;
  #iterating = false;
  #closing: Promise<void> | undefined;

  constructor(opts: ConsumerOptions, deps: ConsumerDependencies) {
    this.#log = deps.log;
    const timings = { ...supervisorTimings(opts), ...deps.timings };
    this.#topics = new TopicSelector(opts.topics, {
      newLister: deps.lister,
      timeoutMs: timings.listTopics,
      onTimeout: () => opts.onRecovery?.("list-topics-timeout"),
    }, this.#stop.signal);
    this.#buffer = new HandOutBuffer({
      maxBuffered: opts.maxBuffered ?? 1000,
      maxBufferedBytes: opts.maxBufferedBytes ?? 16 * 1024 * 1024,
    });
    this.#supervisor = new ConsumerSupervisor({
      opts,
      log: deps.log,
      clients: deps.clients,
      topics: this.#topics,
      buffer: this.#buffer,
      assignment: this.#assignment,
      revoked: (partitions) => this.#revoked(partitions),
      stop: this.#stop,
      timings,
    });
    this.#committer = new FencedCommitter(opts, deps.log, {
      assignment: this.#assignment,
      client: () => this.#supervisor.client,
      topics: () => this.#supervisor.subscribed,
    }, this.#stop.signal);
    this.#supervisor.start();
  }

  get topics(): readonly string[] {
    return this.#supervisor.subscribed;
  }

  get joins(): number {
    return this.#supervisor.joins;
  }

  get assignment(): readonly TopicPartition[] | undefined {
    return this.#assignment.partitions;
  }

  onRevoked(listener: (partitions: TopicPartition[]) => void): void {
    this.#revokedListeners.push(listener);
  }

  subscribe(topics: string[]): void {
    this.#topics.set(topics);
    this.#supervisor.recheckTopics();
  }

  redeliverFrom(topic: string, partition: number, offset: bigint): void {
    if (this.#stop.signal.aborted) return;
    // @platformatic/kafka 2.12.1 cannot seek one partition of a stream; a new
    // stream starts from the committed offsets, and the buffer drops what was
    // handed out already.
    if (this.#buffer.redeliverFrom(topic, partition, offset)) this.#supervisor.restartStream();
  }

  commit(offsets: TopicPartitionOffset[]): Promise<void> {
    return this.#committer.commit(offsets);
  }

  [Symbol.asyncIterator](): AsyncIterator<ConsumedMessage> {
    if (this.#iterating) throw new Error("a kafka consumer can be iterated only once");
    this.#iterating = true;
    return {
      next: async (): Promise<IteratorResult<ConsumedMessage>> => {
        while (true) {
          const message = this.#buffer.take();
          if (message) {
            if (this.#buffer.drained) this.#supervisor.resume();
            return { value: message, done: false };
          }
          if (this.#stop.signal.aborted) return { value: undefined, done: true };
          await this.#buffer.waitForMore();
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
      this.#buffer.wake();
      await this.#supervisor.stop();
      await this.#topics.close();
      await this.#committer.close();
    })();
    return this.#closing;
  }

  #revoked(partitions: TopicPartition[]): void {
    for (const listener of this.#revokedListeners) {
      try {
        listener(partitions);
      } catch (error) {
        this.#log.error("a revocation listener failed", { error });
      }
    }
  }
}
