/**
 * The consumer's supervisor: keeps one fetch stream of the selected topics
 * going through a `GroupClient` (group_client.ts), and gives up on the
 * client's calls that hang. A join gets a budget, then the client is
 * rebuilt; a stream that stops fetching is started again, and the client
 * rebuilt when the next one stalls too; a stream gets a while to end, then it
 * is destroyed; a topic listing gets a while, then it is tried again. Each
 * such recovery is told to `onRecovery` (see `ConsumerRecovery`).
 */
import { PoimenError } from "../core/errors.ts";
import { type Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND, within } from "../core/time.ts";
import { DEFAULT_REQUEST_TIMEOUT, RETRY_CAP } from "./client.ts";
import type { ConsumerOptions, TopicPartition } from "./consumer.ts";
import type { Assignment } from "./assignment.ts";
import { settleWithin } from "./deadline.ts";
import type { FetchStream, GroupClient, GroupClientFactory, GroupJoin } from "./group_client.ts";
import type { HandOutBuffer } from "./hand_out_buffer.ts";
import { sameTopics, type TopicSelector } from "./topic_selection.ts";

/** How long the supervisor waits on each kind of work, in ms. */
export interface SupervisorTimings {
  /** Between re-evaluations of the topic selection. */
  topicRefresh: number;
  /** A topic listing, then it is taken for hung (see `TopicSelectorOptions.timeoutMs`). */
  listTopics: number;
  /** A join, then it is taken for hung and the client rebuilt. */
  joinBudget: number;
  /** A stream owing fetches without completing one, then it is taken for stalled. */
  stall: number;
  /** A stream asked to end, then it is destroyed. */
  streamClose: number;
  /** A client asked to close (leaving the group), then it is closed by force. */
  clientClose: number;
}

/** The timings `opts` imply (see `ConsumerOptions`). */
export function supervisorTimings(opts: ConsumerOptions): SupervisorTimings {
  const requestTimeout = opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT;
  return {
    topicRefresh: opts.topicRefreshMs ?? 5 * SECOND,
    // Listing topics asks the broker; a library call that never answers
    // (@platformatic/kafka 2.12.1's listTopics was seen to) must not hold
    // the consumer (nor close()) for good.
    listTopics: 3 * requestTimeout,
    // A join waits on the group (at most the rebalance timeout) and on
    // requests that time out and are retried; past that budget it is not
    // coming (@platformatic/kafka 2.12.1 was seen, after broker restarts, to
    // never call a join back), and close() must not wait on it either.
    joinBudget: rebalanceTimeout(opts) + 2 * requestTimeout,
    // A stream fetches without pause while it owns partitions: each fetch
    // answers within the broker's wait (maxWaitMs) or fails within the
    // request timeout.
    stall: (opts.maxWaitMs ?? 500) + requestTimeout + 2 * SECOND,
    streamClose: 5 * SECOND,
    clientClose: 5 * SECOND,
  };
}

function rebalanceTimeout(opts: ConsumerOptions): number {
  const session = opts.sessionTimeoutMs ?? 30 * SECOND;
  return Math.max(opts.rebalanceTimeoutMs ?? session, session);
}

/** What a `ConsumerSupervisor` works with. */
export interface SupervisorParts {
  opts: ConsumerOptions;
  log: Logger;
  /** Makes a client (again after a rebuild). */
  clients: GroupClientFactory;
  topics: TopicSelector;
  /** Where fetched messages go. */
  buffer: HandOutBuffer;
  /** Kept up to date with each join (and the loss of the membership). */
  assignment: Assignment;
  /** Told the partitions a join or a lost membership took away. */
  revoked(partitions: TopicPartition[]): void;
  /** Aborted by `stop()`; whatever shares its signal stops with it. */
  stop: AbortController;
  /** Usually `supervisorTimings(opts)`. */
  timings: SupervisorTimings;
}

/** Keeps a consumer group member fetching until stopped; see the module's comment. */
export class ConsumerSupervisor {
  readonly #parts: SupervisorParts;
  readonly #opts: ConsumerOptions;
  readonly #log: Logger;
  readonly #timings: SupervisorTimings;
  readonly #signal: AbortSignal;
  #subscribed: string[] = [];
  #client: GroupClient | undefined;
  #stream: FetchStream | undefined;
  // Streams being closed: a late batch of theirs must not be handed out (after
  // a redelivery it would move past the offset asked for); the next stream
  // fetches it again.
  readonly #retired = new WeakSet<FetchStream>();
  // Per stream, ends its #pump: #closeStream calls it once the stream was
  // asked to end (or destroyed), whether or not the client says "close".
  readonly #pumpEnds = new WeakMap<FetchStream, () => void>();
  #restartRequested = false;
  #joins = 0;
  // Streams in a row that stopped fetching (see #pump); at two, the client
  // itself is suspect and is rebuilt before the next stream.
  #stalls = 0;
  #running: Promise<void> | undefined;
  #stopping: Promise<void> | undefined;

  constructor(parts: SupervisorParts) {
    this.#parts = parts;
    this.#opts = parts.opts;
    this.#log = parts.log;
    this.#timings = parts.timings;
    this.#signal = parts.stop.signal;
  }

  /** The topics currently subscribed. */
  get subscribed(): readonly string[] {
    return this.#subscribed;
  }

  /** How many times this member joined the group. */
  get joins(): number {
    return this.#joins;
  }

  /** The client of the current membership, if one is up. */
  get client(): GroupClient | undefined {
    return this.#client;
  }

  /** Starts supervising (once; again is a no-op). */
  start(): void {
    this.#running ??= this.#run();
  }

  /** Stops fetching and leaves the group. Idempotent. */
  stop(): Promise<void> {
    this.#stopping ??= (async () => {
      this.#parts.stop.abort();
      await this.#closeStream();
      await this.#running?.catch(() => {});
      await this.#dropClient(false);
    })();
    return this.#stopping;
  }

  /** Resumes a stream paused for a full buffer. */
  resume(): void {
    if (this.#stream?.isPaused()) this.#stream.resume();
  }

  /**
   * Ends the current stream for another to start from the committed offsets,
   * in the same membership (see `GroupClient.holdMembership`).
   */
  restartStream(): void {
    if (!this.#stream) return;
    this.#restartRequested = true;
    this.#client?.holdMembership(this.#subscribed);
    void this.#closeStream();
  }

  /** Re-evaluates the topic selection now (re-subscribing when it changed). */
  recheckTopics(): void {
    void this.#checkTopics();
  }

  async #run(): Promise<void> {
    const { topicRefresh } = this.#timings;
    const watcher = setInterval(() => void this.#checkTopics(), topicRefresh);
    let attempt = 0;
    try {
      while (!this.#signal.aborted) {
        let failed = false;
        try {
          // Bounded (see topic_selection.ts): a listing that hangs is counted
          // there, and tried again here after the backoff.
          const listed = await this.#parts.topics.resolve();
          if (listed === "stopped") break;
          if (listed === "timed-out") {
            throw new PoimenError("kafka-unavailable", "listing topics did not finish");
          }
          const topics = listed.value;
          if (topics.length === 0) {
            this.#subscribed = [];
            await delay(topicRefresh, this.#signal);
            continue;
          }
          if (this.#stalls >= 2) {
            this.#stalls = 0;
            await this.#dropClient(true);
          }
          const client = this.#client ??= this.#newClient();
          this.#restartRequested = false;
          const stream = await this.#join(client, topics);
          if (!stream) break;
          this.#parts.buffer.forgetTopicsNotIn(topics);
          this.#stream = stream;
          this.#subscribed = topics;
          this.#log.info("kafka consumer subscribed", { topics: topics.length });
          attempt = 0;
          await this.#pump(stream);
        } catch (error) {
          if (this.#signal.aborted) break;
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
          await delay(backoffWithJitter(attempt++, 200, RETRY_CAP) + 50, this.#signal);
        }
      }
    } finally {
      clearInterval(watcher);
    }
  }

  /** A stream of `topics`, joined within the budget; undefined when stopped meanwhile. */
  async #join(client: GroupClient, topics: string[]): Promise<FetchStream | undefined> {
    const opts = this.#opts;
    const sessionTimeout = opts.sessionTimeoutMs ?? 30 * SECOND;
    const joining = client.consume({
      topics,
      startFrom: opts.startFrom ?? "earliest",
      maxWaitMs: opts.maxWaitMs ?? 500,
      maxFetchBytes: opts.maxFetchBytes ?? 8 * 1024 * 1024,
      sessionTimeoutMs: sessionTimeout,
      rebalanceTimeoutMs: rebalanceTimeout(opts),
      heartbeatIntervalMs: opts.heartbeatIntervalMs ?? 3 * SECOND,
    });
    const budget = this.#timings.joinBudget;
    const joined = await settleWithin(joining, budget, this.#signal, (s) => s.close());
    if (joined === "stopped") return undefined;
    if (joined === "timed-out") {
      // A fresh client next: this one's group state is stuck.
      this.#opts.onRecovery?.("join-timeout");
      await this.#dropClient(true);
      throw new PoimenError(
        "kafka-unavailable",
        `kafka consumer join did not finish in ${budget} ms; the client was rebuilt`,
      );
    }
    return joined.value;
  }

  #newClient(): GroupClient {
    const client: GroupClient = this.#parts.clients({
      joined: (join) => {
        if (client !== this.#client) return;
        this.#joins++;
        this.#assigned(join);
      },
      left: () => {
        if (client === this.#client) this.#assigned(undefined);
      },
    });
    return client;
  }

  /** Records a join's assignment (or the membership's loss) and reports what it took away. */
  #assigned(join: GroupJoin | undefined): void {
    const { assignment } = this.#parts;
    const revoked = join ? assignment.joined(join) : assignment.lost();
    // Leaving the group at close() is no news to whoever closed it.
    if (revoked.length === 0 || this.#signal.aborted) return;
    this.#parts.buffer.revoke(revoked);
    this.#log.info("kafka partitions revoked", {
      revoked: revoked.length,
      assigned: assignment.partitions?.length ?? 0,
    });
    this.#parts.revoked(revoked);
  }

  async #dropClient(force: boolean): Promise<void> {
    const client = this.#client;
    // Its membership goes with it: a new client joins as a new member.
    if (client) this.#assigned(undefined);
    this.#client = undefined;
    if (!client) return;
    // Leaving the group needs the broker; when it is gone, don't wait for it.
    const closing = client.close(force).catch(() => {});
    if (!await within(closing, this.#timings.clientClose)) await client.close(true).catch(() => {});
  }

  async #closeStream(): Promise<void> {
    const stream = this.#stream;
    this.#stream = undefined;
    if (!stream) return;
    this.#retired.add(stream);
    try {
      await this.#endStream(stream);
    } finally {
      // The library's stream "close" event waits on it tearing down its
      // connections, which has been seen never to finish (@platformatic/kafka
      // 2.12.1, after broker restarts): #run must go on regardless.
      this.#pumpEnds.get(stream)?.();
    }
  }

  async #endStream(stream: FetchStream): Promise<void> {
    if (stream.destroyed) return;
    // Ending waits on the fetch under way; one that never answers must not
    // hold a restart (or close()) for good.
    const ms = this.#timings.streamClose;
    const closed = await within(stream.close(), ms).catch(() => true);
    if (!closed) {
      this.#opts.onRecovery?.("stream-close-timeout");
      this.#log.warn("kafka stream did not end in time, destroying it", { waited_ms: ms });
      stream.destroy();
    }
  }

  // Resolves when the stream ends: closed for a re-subscription or close(),
  // or failed (then rejects).
  #pump(stream: FetchStream): Promise<void> {
    // One that goes quiet for longer than the stall window has lost a
    // callback inside the library (@platformatic/kafka 2.12.1, seen after
    // broker restarts amid rebalances: it never fetched again, with no
    // error); it is started again, and when the next one stalls too, the
    // client is rebuilt.
    const stallMs = this.#timings.stall;
    const { assignment, buffer } = this.#parts;
    let lastFetch = Date.now();
    const watchdog = setInterval(() => {
      if (this.#retired.has(stream)) return;
      // Paused by #pump (a full buffer), or nothing to fetch: not a stall.
      if (stream.isPaused() || !assignment.ownsAnyOf(this.#subscribed)) lastFetch = Date.now();
      if (Date.now() - lastFetch < stallMs) return;
      clearInterval(watchdog);
      this.#stalls++;
      this.#opts.onRecovery?.("stream-stalled");
      this.#log.warn("kafka stream stopped fetching, starting it again", {
        quiet_ms: Date.now() - lastFetch,
        stalls: this.#stalls,
      });
      if (stream === this.#stream) this.restartStream();
    }, Math.min(SECOND, stallMs / 4));
    stream.on("fetch", () => {
      lastFetch = Date.now();
      this.#stalls = 0;
    });
    return new Promise<void>((resolve, reject) => {
      this.#pumpEnds.set(stream, resolve);
      stream.once("error", (error: Error) => reject(error));
      stream.once("close", () => resolve());
      stream.on("data", (m) => {
        if (this.#retired.has(stream)) return;
        // A fetch that was under way when the partition was revoked.
        if (assignment.known && !assignment.owns(m.topic, m.partition)) return;
        if (buffer.push(m)) stream.pause();
      });
    }).finally(() => clearInterval(watchdog));
  }

  // Every tick of the refresh, and on subscribe(): a listing still under way
  // is joined, not started again (see topic_selection.ts).
  async #checkTopics(): Promise<void> {
    if (this.#signal.aborted || !this.#stream) return;
    let listed;
    try {
      listed = await this.#parts.topics.resolve();
    } catch (error) {
      this.#log.debug("kafka topic refresh failed", { error });
      return;
    }
    if (listed === "timed-out") {
      this.#log.warn("kafka topic refresh did not finish in time", {
        waited_ms: this.#timings.listTopics,
      });
    }
    if (typeof listed === "string") return;
    const topics = listed.value;
    if (sameTopics(topics, this.#subscribed) || !this.#stream) return;
    this.#log.info("kafka consumer topics changed, resubscribing", {
      before: this.#subscribed.length,
      after: topics.length,
    });
    this.#restartRequested = true;
    await this.#closeStream();
  }
}
