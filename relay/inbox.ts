/**
 * The inbox relay: drains every tenant's `poimen.<tenant>.dispatch` into
 * `POST /v1/runs` and `poimen.<tenant>.signals` into `POST
 * /v1/runs/{id}/signals`, one call per message, at least once. This module
 * reads the consumer, works each message's call and wires the parts:
 *
 * - inbox_messages.ts: what call a message is, by its topic (or its poison);
 * - partition_state.ts: per partition (pure), up to `maxInFlight` calls at
 *   once, the pause behind a failing message and the resume after it;
 * - pending_budget.ts: messages fetched and not done, before fetching waits;
 * - offset_committer.ts: done offsets committed in offset order, in batches;
 * - dead_letter_writer.ts: dead letters written until acknowledged;
 * - lag_monitor.ts: the lag gauges.
 *
 * A message is done once sent (any 2xx) or once its dead letter was
 * acknowledged. Transient failures are retried without limit and never
 * skipped, with `max(Retry-After, exponential backoff with full jitter)`
 * between tries; the first one pauses the message's partition, and only it.
 * A keyless message is posted with a dispatch key (a signal id) derived
 * from its topic, partition and offset (see `prepareBody`), so redelivery, a
 * rebalance or a second relay never make a second run (signal) of it.
 */
import type { Logger } from "../core/log.ts";
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import { delay, within } from "../core/time.ts";
import type { ApiClient, Outcome } from "./api_client.ts";
import { retryDelay } from "./api_client.ts";
import type { ConsumedMessage, KafkaConsumer } from "../kafka/consumer.ts";
import type { KafkaAdmin } from "../kafka/admin.ts";
import type { KafkaProducer } from "../kafka/producer.ts";
import { partitionKey } from "../kafka/client.ts";
import type { RelayMetrics } from "./metrics.ts";
import { inboxTopic, prepareMessage } from "./inbox_messages.ts";
import { type Job, PartitionState, type Result } from "./partition_state.ts";
import { PendingBudget } from "./pending_budget.ts";
import { OffsetCommitter } from "./offset_committer.ts";
import { DeadLetterWriter } from "./dead_letter_writer.ts";
import type { Failure } from "./dead_letter.ts";
import { LagMonitor } from "./lag_monitor.ts";

/** Tuning of the relay (see relay/config.ts for the variables and defaults). */
export interface InboxRelayOptions {
  groupId: string;
  /** The dispatch and signals topics this relay drains (the consumer's selection must agree). */
  isInboxTopic: (topic: string) => boolean;
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
   * How long a message the API answers `unknown-workflow` is retried (no
   * worker has registered the workflow yet: its producers may have started
   * before its first worker) before it is dead-lettered; counted from its
   * first such answer.
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

type Partition = PartitionState<ConsumedMessage>;
type RelayJob = Job<ConsumedMessage>;

const STOP = Symbol("stop");
const FAILED = { dispatch: "admission failed, retrying", signal: "signal failed, retrying" };

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
  readonly #budget: PendingBudget;
  readonly #committer: OffsetCommitter;
  readonly #deadLetters: DeadLetterWriter;
  readonly #lag: LagMonitor;
  #inFlight = 0;
  #paused = 0;
  #idle: PromiseWithResolvers<void> | undefined;
  #reader: Promise<void> | undefined;

  constructor(opts: InboxRelayOptions, deps: InboxRelayDeps) {
    this.#opts = opts;
    this.#deps = deps;
    this.#log = deps.log;
    this.#budget = new PendingBudget(opts.maxPending, opts.maxPendingBytes);
    this.#committer = new OffsetCommitter(
      { intervalMs: opts.commitIntervalMs, batch: opts.commitBatch },
      deps,
      () => this.#partitions.values(),
    );
    this.#deadLetters = new DeadLetterWriter(
      { baseMs: opts.backoffBaseMs, capMs: opts.backoffCapMs },
      deps,
      this.#hardStop.signal,
    );
    this.#lag = new LagMonitor(
      {
        groupId: opts.groupId,
        isInboxTopic: opts.isInboxTopic,
        intervalMs: opts.lagIntervalMs,
      },
      {
        ...deps,
        oldestPending: (topic, partition) =>
          this.#partitions.get(partitionKey(topic, partition))?.tracker.oldestPendingTimestamp(),
      },
    );
  }

  /** Messages fetched and not yet done. */
  get pending(): number {
    return this.#budget.pending;
  }

  start(): Promise<void> {
    this.#deps.consumer.onRevoked((partitions) => {
      for (const { topic, partition } of partitions) this.#revoke(topic, partition);
    });
    this.#reader = this.#read().catch((error) => {
      // The consumer survives broker outages itself; reaching this is a bug.
      this.#log.error("relay reader failed", { error });
    });
    this.#committer.start();
    this.#lag.start();
    return Promise.resolve();
  }

  readonly stop: () => Promise<void> = once(async () => {
    const { consumer, producer, admin } = this.#deps;
    this.#stopping.abort();
    this.#stopped.resolve(STOP);
    for (const p of this.#partitions.values()) p.halt();
    await this.#reader;
    // Not started yet: left for the next owner of the partition.
    let dropped = 0;
    for (const p of this.#partitions.values()) {
      const letGo = p.dropQueued();
      for (const job of letGo) this.#budget.give(job.bytes);
      dropped += letGo.length;
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
    await this.#lag.stop();
    await this.#committer.stop();
    this.#log.info("relay drained", { not_started: dropped });
    await consumer.close().catch((error) => this.#log.warn("leaving the group failed", { error }));
    await producer.close().catch(() => {});
    await admin.close().catch(() => {});
  });

  async #read(): Promise<void> {
    const messages = this.#deps.consumer[Symbol.asyncIterator]();
    while (!this.#stopping.signal.aborted) {
      if (this.#budget.full) {
        // Back-pressure: the consumer's own buffer then fills and it pauses fetching.
        await Promise.race([this.#budget.room(), this.#stopped.promise]);
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
    if (!p) {
      const tenant = inboxTopic(m.topic)?.tenant;
      if (tenant === undefined) {
        // The subscription only matches inbox topics; never commit past it blindly either.
        this.#log.error("message from a topic that is not an inbox topic", { topic: m.topic });
        return;
      }
      p = new PartitionState(m.topic, m.partition, tenant, this.#opts.maxInFlight);
      if (this.#stopping.signal.aborted) p.halt();
      this.#partitions.set(key, p);
    }
    const offered = p.offer(m);
    if (offered.kind === "dropped") return;
    if (offered.kind === "done-ahead") {
      this.#committer.done();
      return;
    }
    if (offered.retrackedAfter !== undefined) {
      this.#log.warn("offsets went backwards, tracking the partition anew", {
        topic: m.topic,
        partition: m.partition,
        offset: String(m.offset),
        last: String(offered.retrackedAfter),
      });
    }
    this.#budget.take(offered.job.bytes);
    this.#gauges();
    this.#launch(p, offered.start);
  }

  #gauges(): void {
    const { metrics } = this.#deps;
    metrics.pending.set(this.#budget.pending);
    metrics.pendingBytes.set(this.#budget.bytes);
    metrics.pausedPartitions.set(this.#paused);
  }

  /** Gives the budget shares of let-go jobs back and cuts their backoff short. */
  #letGo(jobs: RelayJob[]): void {
    for (const job of jobs) {
      job.cancel.abort();
      this.#budget.give(job.bytes);
    }
  }

  #launch(p: Partition, jobs: RelayJob[]): void {
    for (const job of jobs) {
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

  /** The job failed transiently: its first failure pauses `p` behind it. */
  #failed(p: Partition, job: RelayJob): void {
    const paused = p.failed(job);
    if (!paused) return;
    this.#letGo(paused.letGo);
    if (paused.newlyPaused) {
      this.#paused++;
      this.#deps.metrics.partitionPauses.inc();
      this.#log.warn("partition paused until its failing message goes through", {
        tenant: p.tenant,
        topic: p.topic,
        partition: p.partition,
        offset: String(job.m.offset),
        let_go: paused.letGo.length,
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
    const revoked = p.revoke();
    this.#letGo(revoked.letGo);
    if (revoked.wasPaused) this.#paused--;
    this.#log.info("partition revoked", {
      tenant: p.tenant,
      topic,
      partition,
      dropped: revoked.dropped,
      in_flight: p.running,
      committable: p.tracker.committable === undefined ? undefined : String(p.tracker.committable),
      last: p.tracker.last === undefined ? undefined : String(p.tracker.last),
    });
    this.#gauges();
  }

  #finished(p: Partition, job: RelayJob, result: Result): void {
    this.#inFlight--;
    const finished = p.finished(job, result);
    if (finished.release) this.#budget.give(job.bytes);
    if (finished.completed) this.#committer.done();
    if (finished.resumeFrom !== undefined) {
      // Resumed once no message of it is failing: the consumer hands it out again.
      this.#paused--;
      this.#deps.consumer.redeliverFrom(p.topic, p.partition, finished.resumeFrom);
      this.#log.info("partition resumed", {
        tenant: p.tenant,
        topic: p.topic,
        partition: p.partition,
        offset: String(finished.resumeFrom),
        dropped_while_paused: finished.droppedWhilePaused,
      });
    }
    this.#gauges();
    if (this.#inFlight === 0 && this.#idle) {
      this.#idle.resolve();
      this.#idle = undefined;
    }
    this.#launch(p, finished.start);
  }

  /** Sends the job's message or dead-letters it; retries transient failures until done, let go or stopped. */
  async #process(p: Partition, job: RelayJob): Promise<Result> {
    const { api, metrics } = this.#deps;
    const { m } = job;
    const tenant = p.tenant;
    const where = { tenant, topic: m.topic, partition: m.partition, offset: String(m.offset) };
    const prepared = prepareMessage(m, tenant);
    if ("reason" in prepared) {
      const now = new Date();
      p.decided(job);
      return await this.#deadLetter(tenant, m, {
        reason: prepared.reason,
        status: "none",
        detail: prepared.detail,
        attempts: 1,
        firstFailure: now,
        lastFailure: now,
      });
    }
    const cancelled = this.#hardStop.signal;
    // Made at the first retry only: AbortSignal.any costs a WeakRef and a
    // finalizer, for every message if made up front.
    let waitCancelled: AbortSignal | undefined;
    let firstFailure: Date | undefined;
    let firstUnknownWorkflow: number | undefined;
    for (let attempt = 1;; attempt++) {
      const started = performance.now();
      const outcome: Outcome = await prepared.call(api, cancelled);
      metrics.apiDuration.observe({ result: outcome.kind }, (performance.now() - started) / 1000);
      if (outcome.kind === "created" || outcome.kind === "replayed") {
        // A let-go message comes again and is counted then (as replayed).
        if (job.evicted) return "abandoned";
        // Decided: a pause before #finished records it must not let it go.
        p.decided(job);
        metrics.messages.inc({ outcome: outcome.kind });
        this.#log.debug(prepared.kind === "dispatch" ? "admitted" : "signal sent", {
          ...where,
          outcome: outcome.kind,
          attempts: attempt,
          derived_key: prepared.derived,
        });
        return "done";
      }
      if (job.evicted) return "abandoned";
      const now = new Date();
      firstFailure ??= now;
      if (outcome.kind === "transient" && outcome.reason === "unknown-workflow") {
        firstUnknownWorkflow ??= now.getTime();
      }
      const graceOver = firstUnknownWorkflow !== undefined &&
        outcome.kind === "transient" && outcome.reason === "unknown-workflow" &&
        now.getTime() - firstUnknownWorkflow >= this.#opts.unknownWorkflowGraceMs;
      if (outcome.kind === "permanent" || graceOver) {
        p.decided(job);
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
      this.#failed(p, job);
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
      if (outcome.reason === "unauthorized" || outcome.reason === "forbidden") {
        // Loud on purpose: only an operator can fix the token or the tenant.
        this.#log.error("the API refuses the relay's credentials; retrying, not skipping", fields);
      } else if (attempt <= 3 || attempt % 10 === 0) {
        this.#log.warn(FAILED[prepared.kind], fields);
      } else {
        this.#log.debug(FAILED[prepared.kind], fields);
      }
      waitCancelled ??= AbortSignal.any([this.#stopping.signal, job.cancel.signal]);
      await delay(wait, waitCancelled);
      if (this.#stopping.signal.aborted || job.evicted) return "abandoned";
    }
  }

  async #deadLetter(tenant: string, m: ConsumedMessage, why: Failure): Promise<Result> {
    return await this.#deadLetters.write(tenant, m, why) ? "done" : "abandoned";
  }
}
