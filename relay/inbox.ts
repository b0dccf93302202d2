/**
 * The inbox relay: drains every tenant's `poimen.<tenant>.dispatch` into
 * `POST /v1/runs`, one call per message, at least once.
 *
 * - Partitions are worked concurrently, and within a partition up to
 *   `maxInFlight` calls run at once; an `OffsetTracker` per partition keeps
 *   commits in offset order whatever order the calls finish in.
 * - A message is done once admitted (any 2xx) or once its dead letter was
 *   acknowledged; only done offsets are committed, in batches.
 * - Transient failures are retried without limit and never skipped, with
 *   `max(Retry-After, exponential backoff with full jitter)` between tries.
 * - Failures stay inside their partition: the first transient failure of a
 *   message pauses its partition. Every message after it is let go (queued
 *   ones dropped, the answers of calls in flight ignored, the tracker forgets
 *   those not done yet; those done already are not done twice) and
 *   whatever the consumer hands out for that partition meanwhile is dropped,
 *   so a paused partition holds one message (the probe) of the shared
 *   `maxPending`/`maxPendingBytes` budget, whoever its tenant. Once the probe
 *   is done the consumer hands the partition out again from just after it.
 *   Nothing is skipped: the tracker never commits past the probe, and what was
 *   let go is fetched again.
 * - A keyless message is posted with a dispatch key derived from its topic,
 *   partition and offset (see `prepareBody`), so redelivery, a rebalance or a
 *   second relay never make a second run of it.
 * - Lag is measured from the broker's end offsets against the group's
 *   committed offsets, so messages fetched but stuck behind a dead API count.
 */
import type { Logger } from "../core/log.ts";
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import { backoffWithJitter, delay, SECOND, within } from "../core/time.ts";
import type { ApiClient, Outcome } from "./api_client.ts";
import { derivedDispatchKey, prepareBody, retryDelay } from "./api_client.ts";
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
  /** Messages fetched and not done, over all partitions, before fetching waits. */
  maxPending: number;
  /** Bytes of those messages' values, likewise. */
  maxPendingBytes: number;
  commitIntervalMs: number;
  commitBatch: number;
  backoffBaseMs: number;
  backoffCapMs: number;
  /**
   * How long a message the API answers `unknown-workflow` is retried (a
   * rolling deploy: another API instance may know it already) before it is
   * dead-lettered; counted from its first such answer.
   */
  unknownWorkflowGraceMs: number;
  lagIntervalMs: number;
  shutdownMs: number;
  /** The jitter's source; a test seam (default Math.random). */
  random?: () => number;
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

/** One fetched message on its way through the relay. */
interface Job {
  m: ConsumedMessage;
  bytes: number;
  tracker: OffsetTracker;
  /** Counted in the pending budget until released (once). */
  released: boolean;
  /** Let go by a pause of its partition: fetched again later, never completed from here. */
  evicted: boolean;
  /** Has failed transiently and is being retried (it holds its partition paused). */
  failing: boolean;
  /**
   * Its outcome is decided (admitted, or its dead letter being written) but
   * not yet recorded: never let go, or it would be done twice.
   */
  finishing: boolean;
  /** Cuts its backoff short when it is let go (a call in flight is left to finish). */
  cancel: AbortController;
}

interface Partition {
  topic: string;
  partition: number;
  tenant: string;
  tracker: OffsetTracker;
  // A queue with a moving head: shift() on a long array is O(n).
  queue: Job[];
  head: number;
  /** Calls running (including let-go ones whose call has not returned yet). */
  running: Set<Job>;
  /** Jobs failing and retried, not let go: while > 0 the partition stays paused. */
  failing: number;
  /** Set while paused: where the consumer must hand the partition out again from. */
  resumeFrom: bigint | undefined;
  /** Messages dropped while paused (for the log line at resume). */
  dropped: number;
  /** Taken away by the group: nothing of it is started, retried or committed any more. */
  revoked: boolean;
  /**
   * Offsets after a pause's cut that were already done when it was cut (a
   * fast dead letter, say): when handed out again they are done at once, not
   * admitted or dead-lettered a second time.
   */
  doneAhead: Set<bigint>;
}

type Result = "done" | "abandoned";

const STOP = Symbol("stop");
/** Lag measurements not settled yet (hung ones included) before another is started. */
const MAX_LAG_MEASUREMENTS = 3;
/** Longest the final commit may take at shutdown before the group is left anyway. */
const FINAL_COMMIT_MS = 5 * SECOND;

/**
 * `work`, or STOP once `signal` aborts, whichever comes first. The listener
 * goes when `work` settles: one left per call would keep a closure per dead
 * letter on the hard-stop signal for the life of the process.
 */
async function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T | typeof STOP> {
  if (signal.aborted) return STOP;
  const stopped = Promise.withResolvers<typeof STOP>();
  const onAbort = () => stopped.resolve(STOP);
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await Promise.race([work, stopped.promise]);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

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
  #pendingBytes = 0;
  #inFlight = 0;
  #paused = 0;
  #doneSinceCommit = 0;
  #space: PromiseWithResolvers<void> | undefined;
  #idle: PromiseWithResolvers<void> | undefined;
  #committing: Promise<void> | undefined;
  #reader: Promise<void> | undefined;
  #timers: ReturnType<typeof setInterval>[] = [];
  // Last broker view of lag, kept while the broker does not answer.
  #lagView = new Map<string, { topic: string; partition: number; lag: bigint }>();
  #lagMeasuring = false;
  #lagOutstanding = 0;
  #lagStarted = 0;
  #lagApplied = 0;
  #lagWait: AbortController | undefined;

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
    this.#deps.consumer.onRevoked((partitions) => {
      for (const { topic, partition } of partitions) this.#revoke(topic, partition);
    });
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
      for (let i = p.head; i < p.queue.length; i++) this.#release(p.queue[i]);
      dropped += p.queue.length - p.head;
      p.queue = [];
      p.head = 0;
    }
    if (this.#inFlight > 0) {
      this.#log.info("waiting for API calls in flight", {
        in_flight: this.#inFlight,
        within_ms: this.#opts.shutdownMs,
      });
      this.#idle ??= Promise.withResolvers<void>();
      const finished = await within(this.#idle.promise, this.#opts.shutdownMs);
      if (!finished) {
        this.#log.warn("abandoning API calls still in flight", { in_flight: this.#inFlight });
        this.#hardStop.abort();
        await this.#idle.promise;
      }
    }
    this.#hardStop.abort();
    for (const t of this.#timers) clearInterval(t);
    this.#lagWait?.abort();
    const committed = await within(this.#commit().then(() => this.#commit()), FINAL_COMMIT_MS);
    if (!committed) {
      this.#log.warn("final commit did not finish; those messages will be redelivered");
    }
    this.#log.info("relay drained", { not_started: dropped });
    await consumer.close().catch((error) => this.#log.warn("leaving the group failed", { error }));
    await producer.close().catch(() => {});
    await admin.close().catch(() => {});
  });

  #full(): boolean {
    // One message always fits, however large: a big value must not deadlock.
    return this.#pending >= this.#opts.maxPending ||
      (this.#pending > 0 && this.#pendingBytes >= this.#opts.maxPendingBytes);
  }

  async #read(): Promise<void> {
    const messages = this.#deps.consumer[Symbol.asyncIterator]();
    while (!this.#stopping.signal.aborted) {
      if (this.#full()) {
        // Back-pressure: the consumer's own buffer then fills and it pauses
        // fetching. Paused partitions hold one message each, so the budget is
        // spent by partitions that are moving and frees up as they move.
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
    // Its partition was resumed (or revoked) while it was on its way here: it
    // comes again, in order (taking it now would make its redelivery look
    // like offsets going backwards, and do it twice).
    if (m.superseded) return;
    const key = partitionKey(m.topic, m.partition);
    let p = this.#partitions.get(key);
    if (p?.resumeFrom !== undefined) {
      // Paused: fetched again from resumeFrom once it resumes.
      p.dropped++;
      return;
    }
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
      p.doneAhead.clear();
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
        running: new Set(),
        failing: 0,
        resumeFrom: undefined,
        dropped: 0,
        revoked: false,
        doneAhead: new Set(),
      };
      this.#partitions.set(key, p);
    }
    p.tracker.add(m.offset, m.timestamp);
    if (p.doneAhead.delete(m.offset)) {
      p.tracker.complete(m.offset);
      if (++this.#doneSinceCommit >= this.#opts.commitBatch) void this.#commit();
      return;
    }
    const job: Job = {
      m,
      bytes: m.value.byteLength,
      tracker: p.tracker,
      released: false,
      evicted: false,
      failing: false,
      finishing: false,
      cancel: new AbortController(),
    };
    p.queue.push(job);
    this.#pending++;
    this.#pendingBytes += job.bytes;
    this.#gauges();
    this.#pump(p);
  }

  #gauges(): void {
    const { metrics } = this.#deps;
    metrics.pending.set(this.#pending);
    metrics.pendingBytes.set(this.#pendingBytes);
    metrics.pausedPartitions.set(this.#paused);
  }

  /** Gives a job's share of the pending budget back (once). */
  #release(job: Job): void {
    if (job.released) return;
    job.released = true;
    this.#pending--;
    this.#pendingBytes -= job.bytes;
    if (this.#space && !this.#full()) {
      this.#space.resolve();
      this.#space = undefined;
    }
  }

  #pump(p: Partition): void {
    while (
      !p.revoked && p.resumeFrom === undefined && p.running.size < this.#opts.maxInFlight &&
      p.head < p.queue.length && !this.#stopping.signal.aborted
    ) {
      const job = p.queue[p.head++];
      if (p.head === p.queue.length) {
        p.queue = [];
        p.head = 0;
      } else if (p.head > 1024 && p.head * 2 > p.queue.length) {
        p.queue = p.queue.slice(p.head);
        p.head = 0;
      }
      p.running.add(job);
      this.#inFlight++;
      const m = job.m;
      void this.#process(p, job).catch((error): Result => {
        this.#log.error("unexpected failure handling a message; it stays uncommitted", {
          error,
          topic: m.topic,
          partition: m.partition,
          offset: String(m.offset),
        });
        return "abandoned";
      }).then((result) => this.#finished(p, job, result));
    }
  }

  /**
   * Pauses `p` behind `offset`, which just failed: every message after it is
   * let go and will be handed out again once `p` resumes.
   */
  #pause(p: Partition, failed: Job): void {
    const offset = failed.m.offset;
    const wasPaused = p.resumeFrom !== undefined;
    if (wasPaused && p.resumeFrom! <= offset + 1n) return;
    // A message after it whose outcome is decided is finished, not let go:
    // the cut moves past it (those in between keep going).
    let cut = offset;
    for (const job of p.running) {
      if (job.finishing && !job.evicted && job.m.offset > cut) cut = job.m.offset;
    }
    let letGo = 0;
    for (let i = p.head; i < p.queue.length; i++) {
      const job = p.queue[i];
      job.evicted = true;
      this.#release(job);
      letGo++;
    }
    p.queue = [];
    p.head = 0;
    for (const job of p.running) {
      if (job.m.offset <= cut || job.evicted) continue;
      job.evicted = true;
      if (job.failing) {
        job.failing = false;
        p.failing--;
      }
      // Only its backoff is cut short: a call in flight runs to its end (its
      // answer is ignored), since a request abandoned mid-body is an error the
      // API has to log for nothing.
      job.cancel.abort();
      this.#release(job);
      letGo++;
    }
    // A job of a tracker replaced since (the topic was recreated) has nothing to forget there.
    if (failed.tracker === p.tracker && p.tracker.last !== undefined && p.tracker.last > cut) {
      for (const offset of p.tracker.doneAfter(cut)) p.doneAhead.add(offset);
      p.tracker.forgetAfter(cut);
    }
    p.resumeFrom = cut + 1n;
    if (!wasPaused) {
      this.#paused++;
      this.#deps.metrics.partitionPauses.inc();
      this.#log.warn("partition paused until its failing message goes through", {
        tenant: p.tenant,
        topic: p.topic,
        partition: p.partition,
        offset: String(offset),
        let_go: letGo,
      });
    }
    this.#gauges();
  }

  /**
   * The group gave the partition to another member, which starts from the
   * committed offset: messages not started yet are dropped (the new owner
   * admits them), retries stop, calls in flight run to their end unheeded
   * (an admission of theirs is a replay for the new owner, thanks to the
   * dispatch key, derived for a keyless message; a dead letter being written
   * is finished, so that one may be written twice), and nothing of the
   * partition is committed any more. Assigned back later, it starts afresh.
   */
  #revoke(topic: string, partition: number): void {
    const key = partitionKey(topic, partition);
    const p = this.#partitions.get(key);
    if (!p) return;
    this.#partitions.delete(key);
    p.revoked = true;
    let dropped = 0;
    for (let i = p.head; i < p.queue.length; i++) {
      const job = p.queue[i];
      job.evicted = true;
      this.#release(job);
      dropped++;
    }
    p.queue = [];
    p.head = 0;
    for (const job of p.running) {
      if (job.finishing) continue;
      job.evicted = true;
      if (job.failing) {
        job.failing = false;
        p.failing--;
      }
      job.cancel.abort();
      this.#release(job);
    }
    if (p.resumeFrom !== undefined) {
      p.resumeFrom = undefined;
      this.#paused--;
    }
    this.#log.info("partition revoked", {
      tenant: p.tenant,
      topic,
      partition,
      dropped,
      in_flight: p.running.size,
      committable: p.tracker.committable === undefined ? undefined : String(p.tracker.committable),
      last: p.tracker.last === undefined ? undefined : String(p.tracker.last),
    });
    this.#gauges();
  }

  /** Resumes `p` once no message of it is failing: the consumer hands it out again. */
  #maybeResume(p: Partition): void {
    if (p.revoked || p.resumeFrom === undefined || p.failing > 0 || this.#stopping.signal.aborted) {
      return;
    }
    const from = p.resumeFrom;
    p.resumeFrom = undefined;
    this.#paused--;
    this.#deps.consumer.redeliverFrom(p.topic, p.partition, from);
    this.#log.info("partition resumed", {
      tenant: p.tenant,
      topic: p.topic,
      partition: p.partition,
      offset: String(from),
      dropped_while_paused: p.dropped,
    });
    p.dropped = 0;
    this.#gauges();
  }

  #finished(p: Partition, job: Job, result: Result): void {
    p.running.delete(job);
    this.#inFlight--;
    this.#release(job);
    if (job.failing) {
      job.failing = false;
      p.failing--;
    }
    // A let-go message was forgotten by the tracker and comes again.
    if (result === "done" && !job.evicted) {
      job.tracker.complete(job.m.offset);
      if (++this.#doneSinceCommit >= this.#opts.commitBatch) void this.#commit();
    }
    this.#gauges();
    if (this.#inFlight === 0 && this.#idle) {
      this.#idle.resolve();
      this.#idle = undefined;
    }
    this.#maybeResume(p);
    this.#pump(p);
  }

  /** Admits the job's message or dead-letters it; retries transient failures until done, let go or stopped. */
  async #process(p: Partition, job: Job): Promise<Result> {
    const { api, metrics } = this.#deps;
    const { m } = job;
    const tenant = p.tenant;
    const where = { tenant, topic: m.topic, partition: m.partition, offset: String(m.offset) };
    const prepared = prepareBody(m.value, derivedDispatchKey(m.topic, m.partition, m.offset));
    if ("error" in prepared) {
      const now = new Date();
      job.finishing = true;
      return await this.#deadLetter(tenant, m, {
        reason: "bad-json",
        status: "none",
        detail: prepared.error,
        attempts: 1,
        firstFailure: now,
        lastFailure: now,
      });
    }
    const request = {
      tenant,
      body: prepared.body,
      source: `kafka:${m.topic}/${m.partition}/${m.offset}`,
      traceparent: m.headers.traceparent,
      tracestate: m.headers.tracestate,
    };
    const cancelled = this.#hardStop.signal;
    // Made at the first retry only: AbortSignal.any costs a WeakRef and a
    // finalizer, for every message if made up front.
    let waitCancelled: AbortSignal | undefined;
    let firstFailure: Date | undefined;
    let firstUnknownWorkflow: number | undefined;
    for (let attempt = 1;; attempt++) {
      const started = performance.now();
      const outcome: Outcome = await api.admit(request, cancelled);
      metrics.apiDuration.observe({ result: outcome.kind }, (performance.now() - started) / 1000);
      if (outcome.kind === "created" || outcome.kind === "replayed") {
        // A let-go message comes again and is counted then (as replayed).
        if (job.evicted) return "abandoned";
        // Decided: a pause before #finished records it must not let it go.
        job.finishing = true;
        metrics.messages.inc({ outcome: outcome.kind });
        this.#log.debug("admitted", {
          ...where,
          outcome: outcome.kind,
          attempts: attempt,
          derived_key: prepared.derivedKey !== undefined,
        });
        return "done";
      }
      if (job.evicted) return "abandoned";
      const now = new Date();
      firstFailure ??= now;
      if (outcome.kind === "transient" && outcome.reason === "unknown_workflow") {
        firstUnknownWorkflow ??= now.getTime();
      }
      const graceOver = firstUnknownWorkflow !== undefined &&
        outcome.kind === "transient" && outcome.reason === "unknown_workflow" &&
        now.getTime() - firstUnknownWorkflow >= this.#opts.unknownWorkflowGraceMs;
      if (outcome.kind === "permanent" || graceOver) {
        job.finishing = true;
        return await this.#deadLetter(tenant, m, {
          reason: outcome.kind === "permanent" ? outcome.reason : "unknown-workflow",
          status: outcome.status ?? "none",
          detail: outcome.detail,
          attempts: attempt,
          firstFailure,
          lastFailure: now,
        });
      }
      if (this.#stopping.signal.aborted) return "abandoned";
      metrics.retries.inc({ reason: outcome.reason });
      if (!job.failing) {
        job.failing = true;
        p.failing++;
        this.#pause(p, job);
      }
      const wait = retryDelay(
        attempt,
        outcome.retryAfterMs,
        this.#opts.backoffBaseMs,
        this.#opts.backoffCapMs,
        this.#opts.random,
      );
      const fields = {
        ...where,
        reason: outcome.reason,
        status: outcome.status,
        problem: outcome.problem,
        detail: outcome.detail,
        attempt,
        retry_after_ms: outcome.retryAfterMs,
        retry_in_ms: wait,
      };
      if (outcome.reason === "auth") {
        // Loud on purpose: only an operator can fix the token or the tenant.
        this.#log.error("the API refuses the relay's credentials; retrying, not skipping", fields);
      } else if (attempt <= 3 || attempt % 10 === 0) {
        this.#log.warn("admission failed, retrying", fields);
      } else {
        this.#log.debug("admission failed, retrying", fields);
      }
      waitCancelled ??= AbortSignal.any([this.#stopping.signal, job.cancel.signal]);
      await delay(wait, waitCancelled);
      if (this.#stopping.signal.aborted || job.evicted) return "abandoned";
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
        const sent = await untilAborted(producer.send([letter]), this.#hardStop.signal);
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
    // Past the cap the hung ones are left to settle and the last view is aged.
    if (this.#lagOutstanding < MAX_LAG_MEASUREMENTS) {
      this.#lagMeasuring = true;
      this.#lagOutstanding++;
      const seq = ++this.#lagStarted;
      const refreshed = this.#lagViewNow().then((view) => {
        // A late answer still counts, unless a later measurement's came first.
        if (seq > this.#lagApplied) {
          this.#lagApplied = seq;
          this.#lagView = view;
        }
      }, (error) => {
        // The broker is away: keep the last view, the seconds below still age.
        this.#log.debug("lag measurement failed", { error });
      }).finally(() => this.#lagOutstanding--);
      // Bounded: a call that never answers would hold the flag, and freeze the
      // gauges, for good (KafkaAdmin calls take no signal to abandon them by).
      const done = new AbortController();
      this.#lagWait = done;
      try {
        const answered = await Promise.race([
          refreshed.then(() => true),
          delay(this.#opts.lagIntervalMs, done.signal).then(() => false),
        ]);
        if (!answered) {
          this.#log.debug("lag measurement did not answer in time; measured again next time", {
            within_ms: this.#opts.lagIntervalMs,
          });
        }
      } finally {
        done.abort();
        this.#lagMeasuring = false;
      }
    } else {
      this.#log.debug("lag measurements still unanswered; the last view is aged", {
        unanswered: this.#lagOutstanding,
      });
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

  async #lagViewNow(): Promise<Map<string, { topic: string; partition: number; lag: bigint }>> {
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
    return view;
  }
}
