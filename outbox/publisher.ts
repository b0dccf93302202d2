/**
 * The outbox publisher: ships `work_events` rows to `poimen.<tenant>.events`.
 *
 * A batch: read up to `batchSize` pending rows of the shards this process
 * holds (`ShardLocks`, outbox/shard_locks.ts: several publisher processes
 * split the runs between them by session advisory locks), publish them with
 * the idempotent producer, mark them published once the broker acknowledged
 * them. Each statement is its own short transaction: none is open while the
 * publisher waits on Kafka (up to `sendTimeoutMs` per send during an
 * outage), so vacuum of `work_events` and `runs` is never held back by it.
 *
 * Delivery is at least once: if Postgres fails after the broker acknowledged
 * a send, its rows stay pending and are shipped again; consumers dedupe by
 * `(run_id, seq)`. Within a run, order is never broken: a run belongs to one
 * shard, so to one process at a time; its events are sent in seq order in one
 * produce request (one key → one partition, and the idempotent producer keeps
 * order across its retries), and a later send is only made after the earlier
 * one was acknowledged and marked.
 *
 * What cannot go is parked, and the batch goes on: see `BatchDelivery`
 * (outbox/delivery.ts), which sends, bisects and parks; the Kafka side
 * (topics, producer, send deadline) is `KafkaSender` (outbox/kafka_sender.ts).
 *
 * The message format is contracts/events.ts (outbox/event_message.ts).
 * Deleting published rows past retention is not this loop's job: see
 * `OutboxPurger` (outbox/purger.ts).
 */
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, within } from "../core/time.ts";
import { WakeableSleep } from "../core/wakeable_sleep.ts";
import { Listener } from "../db/listener.ts";
import { OUTBOX_CHANNEL } from "../db/notify.ts";
import { claimPendingEvents, markPublished, parkEvents } from "../db/outbox.ts";
import type { Sql } from "../db/pool.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, type TenantTopicOptions } from "../kafka/topics.ts";
import { BatchDelivery, reportParked } from "./delivery.ts";
import { KafkaSender, type OutboxKafka } from "./kafka_sender.ts";
import type { OutboxHooks } from "./metrics.ts";
import { ShardLocks } from "./shard_locks.ts";

export type { OutboxKafka } from "./kafka_sender.ts";

/** Payload bytes of one batch when `batchMaxBytes` is not said. */
const DEFAULT_BATCH_MAX_BYTES = 16 * 1024 * 1024;

/** Options of `OutboxPublisher`. */
export interface OutboxPublisherOptions {
  batchSize: number;
  /**
   * Payload bytes one batch holds at most (its oldest event always goes):
   * with payloads that are run results, 500 of them could otherwise be
   * hundreds of MB in memory at once. 16 MiB when not said.
   */
  batchMaxBytes?: number;
  pollMs: number;
  sendTimeoutMs: number;
  retryMaxMs: number;
  shutdownMs: number;
  topics: TenantTopicOptions;
  log: Logger;
  hooks?: OutboxHooks;
  /**
   * Opens a pool used only to `LISTEN` on OUTBOX_CHANNEL, which the API and
   * the workers notify after writing events: a batch starts then instead of
   * after `pollMs`. postgres.js remembers a failed first LISTEN forever, so
   * the publisher retries with a fresh pool until one succeeds, polling
   * meanwhile. Without it the publisher only polls.
   */
  listener?: () => Sql;
  /**
   * A pool of one connection for the publisher's own session, which holds
   * its shard locks and runs its claims (and nothing else): see `ShardLocks`.
   */
  session: Sql;
  /** How often the shards are shared out again among the publishers; 2 s when not said. */
  rebalanceMs?: number;
}

const DEFAULT_REBALANCE_MS = 2000;

const RETRY_BASE_MS = 200;

type Phase = "kafka" | "database";

/** Tags a failure with the side that failed, for outage logging. */
class PhaseError extends Error {
  constructor(readonly phase: Phase, cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
  }
}

/** Ships pending work_events to Kafka until stopped. */
export class OutboxPublisher implements Service {
  readonly #sql: Sql;
  readonly #sender: KafkaSender;
  readonly #opts: OutboxPublisherOptions;
  readonly #log: Logger;
  /** The events topic's max.message.bytes: a larger event is parked unsent. */
  readonly #maxBytes: number;
  readonly #abort = new AbortController();
  #outage: { phase: Phase; since: number; attempts: number } | undefined;
  #shipping: Promise<void> = Promise.resolve();
  #started = false;
  /** The wait between batches; a notification ends it. */
  readonly #sleep = new WakeableSleep(this.#abort.signal);
  readonly #listener: Listener | undefined;
  readonly #shards: ShardLocks;

  constructor(sql: Sql, kafka: OutboxKafka, opts: OutboxPublisherOptions) {
    this.#sql = sql;
    this.#shards = new ShardLocks({
      session: opts.session,
      rebalanceMs: opts.rebalanceMs ?? DEFAULT_REBALANCE_MS,
      log: opts.log,
    });
    this.#sender = new KafkaSender(kafka, {
      sendTimeoutMs: opts.sendTimeoutMs,
      topics: opts.topics,
      log: opts.log,
      onPublished: (count, seconds) => opts.hooks?.onPublished(count, seconds),
    });
    this.#opts = opts;
    this.#log = opts.log;
    this.#maxBytes = opts.topics.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    const wake = () => this.#sleep.wake();
    this.#listener = opts.listener &&
      new Listener({
        connect: opts.listener,
        channels: { [OUTBOX_CHANNEL]: wake },
        onListen: wake,
        log: this.#log,
      });
  }

  /**
   * Starts shipping in the background; never waits on Kafka, and on Postgres
   * only for the first LISTEN (so a notification sent after start() returns
   * is not missed), which gives up at once if Postgres is away.
   */
  async start(): Promise<void> {
    if (this.#started) throw new Error("outbox publisher already started");
    this.#started = true;
    await this.#listener?.start();
    this.#shipping = this.#shipLoop();
    this.#log.info("outbox publisher started", {
      batch_size: this.#opts.batchSize,
      poll_ms: this.#opts.pollMs,
    });
  }

  /**
   * Lets the batch in flight finish (abandoning it after `shutdownMs`: what
   * was not acknowledged stays pending), then closes the producer, the admin
   * and the lock session. Safe to call twice.
   */
  readonly stop: () => Promise<void> = once(async () => {
    this.#abort.abort();
    await this.#listener?.stop();
    const finished = await within(this.#shipping, this.#opts.shutdownMs);
    if (!finished) {
      this.#log.warn("batch in flight did not finish in time, abandoning it", {
        shutdown_ms: this.#opts.shutdownMs,
      });
      // Ends the pending send; its rows stay pending.
      await this.#sender.dropProducer();
    }
    await this.#shipping;
    await this.#sender.close();
    // Frees the shards for the other publishers at once.
    await this.#shards.close();
  });

  async #shipLoop(): Promise<void> {
    const signal = this.#abort.signal;
    let attempt = 0;
    while (!signal.aborted) {
      let full: boolean;
      try {
        // Reset before the claim: a notification arriving while it runs is
        // kept and makes the next wait return at once.
        this.#sleep.clear();
        const batch = await this.#shipBatch();
        full = batch.full;
        this.#recovered(batch.published);
        attempt = 0;
      } catch (error) {
        if (signal.aborted) break;
        this.#failed(error);
        const wait = backoffWithJitter(attempt++, RETRY_BASE_MS, this.#opts.retryMaxMs);
        // The floor keeps a zero draw from turning into a busy loop.
        await delay(Math.max(50, wait), signal);
        continue;
      }
      // A full batch means more are probably waiting: go again at once.
      if (!full) await this.#sleep.sleep(this.#opts.pollMs);
    }
  }

  /**
   * Ships one batch: whether it was full, and whether anything was published.
   * No transaction spans it: the claim, each park and each mark is one
   * statement, so an outage of Kafka holds no snapshot and no row lock.
   */
  async #shipBatch(): Promise<{ full: boolean; published: boolean }> {
    const scope = await this.#inPhase("database", () => this.#shards.scope());
    if (scope.shards.length === 0) return { full: false, published: false };
    const events = await this.#inPhase("database", () =>
      claimPendingEvents(
        this.#shards.session,
        this.#opts.batchSize,
        this.#opts.batchMaxBytes ?? DEFAULT_BATCH_MAX_BYTES,
        scope,
      ));
    if (events.length === 0) return { full: false, published: false };
    const delivery = new BatchDelivery({
      send: (messages) => this.#inPhase("kafka", () => this.#sender.send(messages)),
      ledger: {
        park: (list) =>
          this.#inPhase("database", () =>
            parkEvents(
              this.#sql,
              list.map((p) => ({
                tenant_id: p.event.tenant_id,
                event_id: p.event.event_id,
                reason: p.reason,
              })),
            )),
        markPublished: (list) => this.#inPhase("database", () => markPublished(this.#sql, list)),
      },
      maxBytes: this.#maxBytes,
    });
    try {
      const shippable = await this.#inPhase("kafka", () => this.#sender.ensureTopics(events));
      // A failure (Kafka's or Postgres') leaves what was acknowledged and
      // marked, and what was parked, as it is: the rest stays pending and
      // goes again (at least once).
      await delivery.deliver(shippable);
    } finally {
      // Each park committed on its own: reported whatever happened after it.
      reportParked(delivery.parked, this.#log, (n) => this.#opts.hooks?.onParked?.(n));
    }
    this.#log.debug("batch shipped", { events: events.length, published: delivery.published });
    return { full: events[0].more, published: delivery.published };
  }

  async #inPhase<T>(phase: Phase, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (error) {
      throw error instanceof PhaseError ? error : new PhaseError(phase, error);
    }
  }

  // One line when an outage starts and one when it ends, not one per attempt.
  #failed(error: unknown) {
    const phase = error instanceof PhaseError ? error.phase : "database";
    const cause = error instanceof PhaseError ? error.cause : error;
    if (this.#outage?.phase === phase) {
      this.#outage.attempts++;
      this.#log.debug("outbox publish still failing", { phase, error: cause });
      return;
    }
    this.#outage = { phase, since: Date.now(), attempts: 1 };
    // The logger writes the cause chain: the Kafka client wraps the telling
    // error ("connect ECONNREFUSED …") in generic ones ("Producing messages failed.").
    this.#log.warn(`${phase} unavailable, events wait in postgres; retrying with backoff`, {
      phase,
      error: cause,
    });
  }

  #recovered(published: boolean) {
    if (!this.#outage) return;
    // A batch with nothing to send proves Postgres answers, not that Kafka does.
    if (this.#outage.phase === "kafka" && !published) return;
    const { phase, since, attempts } = this.#outage;
    this.#outage = undefined;
    this.#log.info(`${phase} available again, shipping resumed`, {
      phase,
      down_ms: Date.now() - since,
      attempts,
    });
  }
}
