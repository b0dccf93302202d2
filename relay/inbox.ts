/**
 * The inbox relay: drains every tenant's `poimen.<tenant>.dispatch` into
 * `POST /v1/runs`, one call per message, at least once.
 *
 * - Partitions are worked concurrently, and within a partition up to
 *   `maxInFlight` calls run at once; an `OffsetTracker` per partition keeps
 *   commits in offset order whatever order the calls finish in.
 * - A message is done once admitted (any 2xx) or once its dead letter was
 *   acknowledged; only done offsets are committed, in batches.
 * - Transient failures are retried without limit and never skipped; no
 *   dedup here: redelivery is the admission index's job.
 * - Lag is measured from the broker's end offsets against the group's
 *   committed offsets, so messages fetched but stuck behind a dead API count.
 */
import type { Logger } from "../core/log.ts";
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import type { ApiClient, Outcome } from "./api_client.ts";
import { notJson } from "./api_client.ts";
import { deadLetter, type Failure } from "./dead_letter.ts";
import type { ConsumedMessage, KafkaConsumer } from "../kafka/consumer.ts";
import type { KafkaAdmin } from "../kafka/admin.ts";
import type { KafkaProducer } from "../kafka/producer.ts";
import type { RelayMetrics } from "./metrics.ts";
import { OffsetTracker } from "./offsets.ts";
import { DISPATCH_TOPIC_PATTERN } from "../contracts/topics.ts";

/** Tuning of the relay (see relay/config.ts for the variables and defaults). */
export interface InboxRelayOptions {
  groupId: string;
  /** The dispatch topics this relay drains (the consumer's selection must agree). */
  isDispatchTopic: (topic: string) => boolean;
  maxInFlight: number;
  maxPending: number;
  commitIntervalMs: number;
  commitBatch: number;
  backoffBaseMs: number;
  backoffCapMs: number;
  lagIntervalMs: number;
  shutdownMs: number;
}

/** What the relay talks to; built by relay/process.ts (and by tests). */
export interface InboxRelayDeps {
  consumer: KafkaConsumer;
  producer: KafkaProducer;
  admin: KafkaAdmin;
  api: ApiClient;
  metrics: RelayMetrics;
  log: Logger;
}

interface Partition {
  topic: string;
  partition: number;
  tenant: string;
  tracker: OffsetTracker;
  // A queue with a moving head: shift() on a long array is O(n).
  queue: ConsumedMessage[];
  head: number;
  inFlight: number;
}

type Result = "done" | "abandoned";

const STOP = Symbol("stop");
/** Longest the final commit may take at shutdown before the group is left anyway. */
const FINAL_COMMIT_MS = 5 * SECOND;

function partitionKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}

/** The inbox relay as a `Service`: `start()` begins draining, `stop()` is graceful. */
export class InboxRelay implements Service {
  readonly #opts: InboxRelayOptions;
  readonly #deps: InboxRelayDeps;
  readonly #log: Logger;
  readonly #partitions = new Map<string, Partition>();
  // Soft stop: no more fetching, no more retries. Hard stop: abort calls in flight.
  readonly #stopping = new AbortController();
  readonly #hardStop = new AbortController();
  readonly #stopped = Promise.withResolvers<typeof STOP>();
  #pending = 0;
  #inFlight = 0;
  #doneSinceCommit = 0;
  #space: PromiseWithResolvers<void> | undefined;
  #idle: PromiseWithResolvers<void> | undefined;
  #committing: Promise<void> | undefined;
  #reader: Promise<void> | undefined;
  #timers: ReturnType<typeof setInterval>[] = [];
  // Last broker view of lag, kept while the broker does not answer.
  #lagView = new Map<string, { topic: string; partition: number; lag: bigint }>();
  #lagMeasuring = false;

  constructor(opts: InboxRelayOptions, deps: InboxRelayDeps) {
    this.#opts = opts;
    this.#deps = deps;
    this.#log = deps.log;
  }

  /** Messages fetched and not yet done. */
  get pending(): number {
    return this.#pending;
  }

  start(): Promise<void> {
    this.#reader = this.#read().catch((error) => {
      // The consumer survives broker outages itself; reaching this is a bug.
      this.#log.error("relay reader failed", { error });
    });
    this.#timers.push(
      setInterval(() => void this.#commit(), this.#opts.commitIntervalMs),
      setInterval(() => void this.#measureLag(), this.#opts.lagIntervalMs),
    );
    void this.#measureLag();
    return Promise.resolve();
  }

  readonly stop: () => Promise<void> = once(async () => {
    const { consumer, producer, admin } = this.#deps;
    this.#stopping.abort();
    this.#stopped.resolve(STOP);
    await this.#reader;
    // Not started yet: left for the next owner of the partition.
    let dropped = 0;
    for (const p of this.#partitions.values()) {
      dropped += p.queue.length - p.head;
      this.#pending -= p.queue.length - p.head;
      p.queue = [];
      p.head = 0;
    }
    if (this.#inFlight > 0) {
      this.#log.info("waiting for API calls in flight", {
        in_flight: this.#inFlight,
        within_ms: this.#opts.shutdownMs,
      });
      this.#idle ??= Promise.withResolvers<void>();
      const finished = await Promise.race([
        this.#idle.promise.then(() => true),
        delay(this.#opts.shutdownMs).then(() => false),
      ]);
      if (!finished) {
        this.#log.warn("abandoning API calls still in flight", { in_flight: this.#inFlight });
        this.#hardStop.abort();
        await this.#idle.promise;
      }
    }
    this.#hardStop.abort();
    for (const t of this.#timers) clearInterval(t);
    const committed = await Promise.race([
      this.#commit().then(() => this.#commit()).then(() => true),
      delay(FINAL_COMMIT_MS).then(() => false),
    ]);
    if (!committed) {
      this.#log.warn("final commit did not finish; those messages will be redelivered");
    }
    this.#log.info("relay drained", { not_started: dropped });
    await consumer.close().catch((error) => this.#log.warn("leaving the group failed", { error }));
    await producer.close().catch(() => {});
    await admin.close().catch(() => {});
  });

  async #read(): Promise<void> {
    const messages = this.#deps.consumer[Symbol.asyncIterator]();
    while (!this.#stopping.signal.aborted) {
      if (this.#pending >= this.#opts.maxPending) {
        // Back-pressure: the consumer's own buffer then fills and it pauses fetching.
        this.#space ??= Promise.withResolvers<void>();
        await Promise.race([this.#space.promise, this.#stopped.promise]);
        continue;
      }
      const next = await Promise.race([messages.next(), this.#stopped.promise]);
      if (next === STOP || next.done) break;
      this.#accept(next.value);
    }
  }

  #accept(m: ConsumedMessage): void {
    const key = partitionKey(m.topic, m.partition);
    let p = this.#partitions.get(key);
    if (p && p.tracker.last !== undefined && m.offset <= p.tracker.last) {
      // The topic was deleted and created anew (offsets from 0 again): start a
      // new tracker; calls in flight finish against the old one they hold.
      this.#log.warn("offsets went backwards, tracking the partition anew", {
        topic: m.topic,
        partition: m.partition,
        offset: String(m.offset),
        last: String(p.tracker.last),
      });
      p.tracker = new OffsetTracker();
    }
    if (!p) {
      const tenant = DISPATCH_TOPIC_PATTERN.exec(m.topic)?.[1];
      if (tenant === undefined) {
        // The subscription only matches dispatch topics; never commit past it blindly either.
        this.#log.error("message from a topic that is not a dispatch topic", { topic: m.topic });
        return;
      }
      p = {
        topic: m.topic,
        partition: m.partition,
        tenant,
        tracker: new OffsetTracker(),
        queue: [],
        head: 0,
        inFlight: 0,
      };
      this.#partitions.set(key, p);
    }
    p.tracker.add(m.offset, m.timestamp);
    p.queue.push(m);
    this.#pending++;
    this.#deps.metrics.inFlight.set(this.#pending);
    this.#pump(p);
  }

  #pump(p: Partition): void {
    while (
      p.inFlight < this.#opts.maxInFlight && p.head < p.queue.length &&
      !this.#stopping.signal.aborted
    ) {
      const m = p.queue[p.head++];
      if (p.head === p.queue.length) {
        p.queue = [];
        p.head = 0;
      } else if (p.head > 1024 && p.head * 2 > p.queue.length) {
        p.queue = p.queue.slice(p.head);
        p.head = 0;
      }
      p.inFlight++;
      this.#inFlight++;
      const tracker = p.tracker;
      void this.#process(p.tenant, m).catch((error): Result => {
        this.#log.error("unexpected failure handling a message; it stays uncommitted", {
          error,
          topic: m.topic,
          partition: m.partition,
          offset: String(m.offset),
        });
        return "abandoned";
      }).then((result) => this.#finished(p, tracker, m, result));
    }
  }

  #finished(p: Partition, tracker: OffsetTracker, m: ConsumedMessage, result: Result): void {
    p.inFlight--;
    this.#inFlight--;
    this.#pending--;
    this.#deps.metrics.inFlight.set(this.#pending);
    if (result === "done") {
      tracker.complete(m.offset);
      if (++this.#doneSinceCommit >= this.#opts.commitBatch) void this.#commit();
    }
    if (this.#space && this.#pending < this.#opts.maxPending) {
      this.#space.resolve();
      this.#space = undefined;
    }
    if (this.#inFlight === 0 && this.#idle) {
      this.#idle.resolve();
      this.#idle = undefined;
    }
    this.#pump(p);
  }

  /** Admits `m` or dead-letters it; retries transient failures until done or stopped. */
  async #process(tenant: string, m: ConsumedMessage): Promise<Result> {
    const { api, metrics } = this.#deps;
    const where = { tenant, topic: m.topic, partition: m.partition, offset: String(m.offset) };
    const badValue = notJson(m.value);
    if (badValue !== undefined) {
      const now = new Date();
      return await this.#deadLetter(tenant, m, {
        reason: "bad-json",
        status: "none",
        detail: badValue,
        attempts: 1,
        firstFailure: now,
        lastFailure: now,
      });
    }
    const request = {
      tenant,
      body: m.value,
      source: `kafka:${m.topic}/${m.partition}/${m.offset}`,
      traceparent: m.headers.traceparent,
      tracestate: m.headers.tracestate,
    };
    let firstFailure: Date | undefined;
    for (let attempt = 1;; attempt++) {
      const started = performance.now();
      const outcome: Outcome = await api.admit(request, this.#hardStop.signal);
      metrics.apiDuration.observe({ result: outcome.kind }, (performance.now() - started) / 1000);
      if (outcome.kind === "created" || outcome.kind === "replayed") {
        metrics.messages.inc({ outcome: outcome.kind });
        this.#log.debug("admitted", { ...where, outcome: outcome.kind, attempts: attempt });
        return "done";
      }
      const now = new Date();
      firstFailure ??= now;
      if (outcome.kind === "permanent") {
        return await this.#deadLetter(tenant, m, {
          reason: outcome.reason,
          status: outcome.status,
          detail: outcome.detail,
          attempts: attempt,
          firstFailure,
          lastFailure: now,
        });
      }
      if (this.#stopping.signal.aborted) return "abandoned";
      metrics.retries.inc({ reason: outcome.reason });
      const wait = outcome.retryAfterMs !== undefined
        ? outcome.retryAfterMs +
          backoffWithJitter(0, this.#opts.backoffBaseMs, this.#opts.backoffCapMs)
        : backoffWithJitter(attempt - 1, this.#opts.backoffBaseMs, this.#opts.backoffCapMs);
      const fields = {
        ...where,
        reason: outcome.reason,
        status: outcome.status,
        detail: outcome.detail,
        attempt,
        retry_in_ms: wait,
      };
      if (outcome.reason === "auth") {
        // Loud on purpose: only an operator can fix the token or the tenant.
        this.#log.error("the API refuses the relay's credentials; retrying, not skipping", fields);
      } else if (attempt === 1 || attempt % 10 === 0) {
        this.#log.warn("admission failed, retrying", fields);
      } else {
        this.#log.debug("admission failed, retrying", fields);
      }
      await delay(wait, this.#stopping.signal);
      if (this.#stopping.signal.aborted) return "abandoned";
    }
  }

  /** Writes the dead letter, retrying until the broker acknowledged it (or a hard stop). */
  async #deadLetter(tenant: string, m: ConsumedMessage, why: Failure): Promise<Result> {
    const { producer, metrics } = this.#deps;
    const letter = deadLetter(tenant, m, why);
    const where = { tenant, topic: m.topic, partition: m.partition, offset: String(m.offset) };
    for (let attempt = 0;; attempt++) {
      if (this.#hardStop.signal.aborted) return "abandoned";
      try {
        const sent = await Promise.race([
          producer.send([letter]),
          new Promise<typeof STOP>((resolve) => {
            if (this.#hardStop.signal.aborted) resolve(STOP);
            this.#hardStop.signal.addEventListener("abort", () => resolve(STOP), { once: true });
          }),
        ]);
        if (sent === STOP) return "abandoned";
        metrics.messages.inc({ outcome: "dead_lettered" });
        this.#log.warn("dead-lettered", {
          ...where,
          reason: why.reason,
          status: why.status,
          detail: why.detail,
          attempts: why.attempts,
          dlq: letter.topic,
          dlq_offset: String(sent[0]?.offset),
        });
        return "done";
      } catch (error) {
        metrics.retries.inc({ reason: "dead_letter_write" });
        this.#log.warn("dead letter write failed, retrying", { ...where, error, attempt });
        await delay(
          backoffWithJitter(attempt, this.#opts.backoffBaseMs, this.#opts.backoffCapMs),
          this.#hardStop.signal,
        );
      }
    }
  }

  /** Commits every partition's done prefix; one commit at a time, later calls join the next. */
  #commit(): Promise<void> {
    if (this.#committing) return this.#committing;
    const batch: { p: Partition; tracker: OffsetTracker; offset: bigint }[] = [];
    for (const p of this.#partitions.values()) {
      const offset = p.tracker.toCommit();
      if (offset !== undefined) batch.push({ p, tracker: p.tracker, offset });
    }
    if (batch.length === 0) return Promise.resolve();
    this.#doneSinceCommit = 0;
    this.#committing = this.#deps.consumer.commit(
      batch.map(({ p, offset }) => ({ topic: p.topic, partition: p.partition, offset })),
    ).then(() => {
      for (const { tracker, offset } of batch) tracker.committed(offset);
      this.#deps.metrics.commits.inc();
    }, (error) => {
      // Only after close(); the offsets stay committable for the next try.
      this.#log.debug("commit failed", { error });
    }).finally(() => {
      this.#committing = undefined;
    });
    return this.#committing;
  }

  async #measureLag(): Promise<void> {
    if (this.#lagMeasuring) return;
    this.#lagMeasuring = true;
    try {
      await this.#refreshLagView();
    } catch (error) {
      // The broker is away: keep the last view, the seconds below still age.
      this.#log.debug("lag measurement failed", { error });
    } finally {
      this.#lagMeasuring = false;
    }
    const { lagMessages, lagSeconds } = this.#deps.metrics;
    const now = Date.now();
    lagMessages.reset();
    lagSeconds.reset();
    for (const [key, { topic, partition, lag }] of this.#lagView) {
      const labels = { topic, partition: String(partition) };
      lagMessages.set(labels, Number(lag));
      const oldest = this.#partitions.get(key)?.tracker.oldestPendingTimestamp();
      lagSeconds.set(
        labels,
        lag > 0n && oldest !== undefined ? Math.max(0, now - oldest) / 1000 : 0,
      );
    }
  }

  async #refreshLagView(): Promise<void> {
    const { admin } = this.#deps;
    const topics = (await admin.listTopics()).filter(this.#opts.isDispatchTopic);
    const [ends, starts, committed] = await Promise.all([
      admin.endOffsets(topics),
      admin.startOffsets(topics),
      admin.committedOffsets(this.#opts.groupId, topics),
    ]);
    const byKey = (offsets: typeof ends) =>
      new Map(offsets.map((o) => [partitionKey(o.topic, o.partition), o.offset]));
    const done = byKey(committed);
    const first = byKey(starts);
    const view = new Map<string, { topic: string; partition: number; lag: bigint }>();
    for (const end of ends) {
      const key = partitionKey(end.topic, end.partition);
      // Waiting: from the committed offset, or from the oldest message retention
      // kept when nothing was committed yet (or the commit points before it).
      const start = first.get(key) ?? 0n;
      const from = done.get(key) ?? start;
      const lag = end.offset - (from > start ? from : start);
      view.set(key, { topic: end.topic, partition: end.partition, lag: lag > 0n ? lag : 0n });
    }
    this.#lagView = view;
  }
}
