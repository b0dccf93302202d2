/**
 * The outbox relay: ships `work_events` rows to `poimen.<tenant>.events`.
 *
 * One batch is one Postgres transaction: claim up to `batchSize` pending
 * rows with `FOR UPDATE SKIP LOCKED` (see `claimPendingEvents` for per-run
 * order across processes), publish them with the idempotent producer, mark
 * them published after the broker acknowledged them, commit. Holding the
 * row locks while publishing is what keeps two relay processes from shipping
 * one row twice; it is cheap because a batch is small (≤ 500 rows by
 * default) and a publish is bounded by `sendTimeoutMs`. A lease column would
 * survive a crashed process without relying on the transaction, but a
 * crashed process' transaction is rolled back by Postgres anyway, and a
 * lease would need its own reclaim path.
 *
 * Delivery is at least once: if Postgres fails after the broker acknowledged
 * a batch, the rows stay pending and are shipped again; consumers dedupe by
 * `(run_id, seq)`. Within a run, order is never broken: a run's events are
 * sent in seq order in one produce request (one key → one partition, and the
 * idempotent producer keeps order across its retries), and a later batch is
 * only sent after the earlier one was acknowledged.
 *
 * Parking: an event over `maxMessageBytes` (EVENTS_MAX_MESSAGE_BYTES, the
 * events topic's `max.message.bytes`), or one the broker refuses for a
 * permanent reason (MESSAGE_TOO_LARGE, INVALID_RECORD…, see
 * `permanentRecordError`), would fail every retry and stall every batch
 * behind it, of every tenant. It is parked instead (`parked_at`,
 * `parked_reason`; an error log line and `poimen_outbox_parked_events`), and
 * the batch goes on. A send the broker refuses for good is split in halves
 * until the culprit is alone, so the rest of the batch still ships, in order.
 * The broker being away is not permanent: that stays "wait and retry".
 *
 * The later events of a parked event's run are parked behind it ("follows
 * parked seq N"), never shipped: consumers fold a run by `(run_id, seq)` and
 * may rely on seq n+1 never arriving without seq n, which shipping past the
 * gap would break; and once the cause is fixed (e.g. the topic's limit
 * raised), clearing `parked_at` on the run's rows ships all of them, in
 * order. Other runs and other tenants are unaffected either way.
 *
 * The message format is contracts/events.ts. Deleting published rows past
 * retention is not this loop's job: see `OutboxPurger` (outbox/purger.ts).
 */
import type { Service } from "../core/lifecycle.ts";
import { once } from "../core/lifecycle.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, within } from "../core/time.ts";
import { WakeableSleep } from "../core/wakeable_sleep.ts";
import { Listener } from "../db/listener.ts";
import { OUTBOX_CHANNEL } from "../db/notify.ts";
import {
  type ClaimedEvent,
  claimPendingEvents,
  markPublished,
  parkEvents,
  type PendingEvent,
} from "../db/outbox.ts";
import type { TransactionSql } from "../db/pool.ts";
import type { Sql } from "../db/pool.ts";
import { EVENT_HEADERS, type EventMessage } from "../contracts/events.ts";
import { eventMessageKey, eventsTopic } from "../contracts/topics.ts";
import { type KafkaAdmin, type TopicSpec } from "../kafka/admin.ts";
import {
  type KafkaProducer,
  permanentRecordError,
  type ProduceMessage,
  recordBatchBytes,
} from "../kafka/producer.ts";
import {
  DEFAULT_MAX_MESSAGE_BYTES,
  type TenantTopicOptions,
  tenantTopicSpecs,
} from "../kafka/topics.ts";
import type { OutboxHooks } from "./metrics.ts";

/** The Kafka side of the relay: a producer factory (a failed producer is replaced) and an admin. */
export interface OutboxKafka {
  createProducer(): KafkaProducer;
  admin: KafkaAdmin;
}

/** Payload bytes of one batch when `batchMaxBytes` is not said. */
export const DEFAULT_BATCH_MAX_BYTES = 16 * 1024 * 1024;

/** Options of `OutboxRelay`. */
export interface OutboxRelayOptions {
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
   * the relay retries with a fresh pool until one succeeds, polling meanwhile.
   * Without it the relay only polls.
   */
  listener?: () => Sql;
}

// Produce requests are kept well under the topic's max.message.bytes; a
// run's events are split only when they exceed it.
const CHUNK_BYTES = 512 * 1024;
const RETRY_BASE_MS = 200;

type Phase = "kafka" | "database";

interface Outgoing {
  event: ClaimedEvent;
  message: ProduceMessage & { value: Uint8Array };
  /** Its size as a record batch of its own (`recordBatchBytes`). */
  bytes: number;
}

/** An event parked in this batch, reported once the batch committed. */
interface Parked {
  event: PendingEvent;
  bytes: number | undefined;
  reason: string;
  /** The parked seq of its run it follows, when that is why it was parked. */
  follows?: number;
}

/** Tags a failure with the side that failed, for outage logging. */
class PhaseError extends Error {
  constructor(readonly phase: Phase, cause: unknown) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
  }
}

/** Ships pending work_events to Kafka until stopped. */
export class OutboxRelay implements Service {
  readonly #sql: Sql;
  readonly #kafka: OutboxKafka;
  readonly #opts: OutboxRelayOptions;
  readonly #log: Logger;
  /** The events topic's max.message.bytes: a larger event is parked unsent. */
  readonly #maxBytes: number;
  readonly #abort = new AbortController();
  readonly #ensured = new Set<string>();
  readonly #invalidTenants = new Set<string>();
  #producer: KafkaProducer | undefined;
  #outage: { phase: Phase; since: number; attempts: number } | undefined;
  #shipping: Promise<void> = Promise.resolve();
  #started = false;
  /** The wait between batches; a notification ends it. */
  readonly #sleep = new WakeableSleep(this.#abort.signal);
  readonly #listener: Listener | undefined;

  constructor(sql: Sql, kafka: OutboxKafka, opts: OutboxRelayOptions) {
    this.#sql = sql;
    this.#kafka = kafka;
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
    if (this.#started) throw new Error("outbox relay already started");
    this.#started = true;
    await this.#listener?.start();
    this.#shipping = this.#shipLoop();
    this.#log.info("outbox relay started", {
      batch_size: this.#opts.batchSize,
      poll_ms: this.#opts.pollMs,
    });
  }

  /**
   * Lets the batch in flight finish (abandoning it, rolled back, after
   * `shutdownMs`), then closes the producer and the admin. Safe to call twice.
   */
  readonly stop: () => Promise<void> = once(async () => {
    this.#abort.abort();
    await this.#listener?.stop();
    const finished = await within(this.#shipping, this.#opts.shutdownMs);
    if (!finished) {
      this.#log.warn("batch in flight did not finish in time, abandoning it", {
        shutdown_ms: this.#opts.shutdownMs,
      });
      // Ends the pending send; its transaction rolls back and the rows stay pending.
      await this.#dropProducer();
    }
    await this.#shipping;
    await this.#dropProducer();
    await this.#kafka.admin.close().catch(() => {});
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

  /** Ships one batch: whether it was full, and whether anything was published. */
  async #shipBatch(): Promise<{ full: boolean; published: boolean }> {
    let failure: unknown;
    const batch = { published: false, parked: [] as Parked[] };
    const full = await this.#inPhase("database", () =>
      this.#sql.begin(async (tx) => {
        const events = await claimPendingEvents(
          tx,
          this.#opts.batchSize,
          this.#opts.batchMaxBytes ?? DEFAULT_BATCH_MAX_BYTES,
        );
        if (events.length === 0) return false;
        try {
          const shippable = await this.#ensureTopics(events);
          const outgoing = shippable.map((event) => {
            const message = toMessage(event);
            return { event, message, bytes: recordBatchBytes(message) };
          });
          const chunkBytes = Math.min(CHUNK_BYTES, this.#maxBytes);
          // Runs with a parked event in this batch, by run key: the seq parked.
          const parkedRuns = new Map<string, number>();
          for (const chunk of chunks(outgoing, chunkBytes)) {
            await this.#deliver(tx, chunk, parkedRuns, batch);
          }
        } catch (error) {
          // Kafka failed: commit what was acknowledged (and parked), then
          // report. A database error instead rolls the whole batch back
          // (what was sent goes again: at least once).
          if (!(error instanceof PhaseError && error.phase === "kafka")) throw error;
          failure = error;
        }
        this.#log.debug("batch shipped", { events: events.length, published: batch.published });
        return events[0].more;
      }));
    // Reached only when the transaction committed: a rolled-back park is no park.
    this.#reportParked(batch.parked);
    if (failure !== undefined) throw failure;
    return { full, published: batch.published };
  }

  /**
   * Sends `items` (in seq order per run) and marks them published; parks
   * those that cannot go. A send the broker refuses for a permanent reason is
   * split in halves, each sent (or split again) in turn, until the refused
   * event is alone and parked: everything before it was acknowledged first
   * and everything after it is sent after, so per-run order holds. Any other
   * failure is thrown: the broker may be down, so wait and retry.
   */
  async #deliver(
    tx: TransactionSql,
    items: Outgoing[],
    parkedRuns: Map<string, number>,
    batch: { published: boolean; parked: Parked[] },
  ): Promise<void> {
    const park = async (list: Parked[]) => {
      await this.#inPhase("database", () =>
        parkEvents(
          tx,
          list.map((p) => ({
            tenant_id: p.event.tenant_id,
            event_id: p.event.event_id,
            reason: p.reason,
          })),
        ));
      for (const p of list) parkedRuns.set(runKey(p.event), p.follows ?? p.event.seq);
      batch.parked.push(...list);
    };
    const live: Outgoing[] = [];
    const stay: Parked[] = [];
    for (const item of items) {
      const e = item.event;
      const follows = parkedRuns.get(runKey(e)) ??
        (e.parked_seq !== null && e.seq > e.parked_seq ? e.parked_seq : undefined);
      if (follows !== undefined) {
        stay.push({
          event: e,
          bytes: item.bytes,
          reason: `follows parked seq ${follows}`,
          follows,
        });
        // Parked at once, so the next item of its run sees it.
        parkedRuns.set(runKey(e), follows);
      } else if (item.bytes > this.#maxBytes) {
        const reason = `${item.bytes} bytes exceeds EVENTS_MAX_MESSAGE_BYTES ` +
          `(${this.#maxBytes})`;
        stay.push({ event: e, bytes: item.bytes, reason });
        parkedRuns.set(runKey(e), e.seq);
      } else {
        live.push(item);
      }
    }
    if (stay.length > 0) await park(stay);
    if (live.length === 0) return;
    try {
      await this.#publish(live.map((o) => o.message));
    } catch (error) {
      const permanent = permanentRecordError(error);
      if (permanent === undefined) throw error;
      if (live.length === 1) {
        const [item] = live;
        await park([{
          event: item.event,
          bytes: item.bytes,
          reason: `broker refused it: ${permanent}`,
        }]);
        return;
      }
      const half = Math.ceil(live.length / 2);
      await this.#deliver(tx, live.slice(0, half), parkedRuns, batch);
      await this.#deliver(tx, live.slice(half), parkedRuns, batch);
      return;
    }
    // Only what the broker acknowledged is marked; a later chunk's failure
    // leaves its rows (and everything after) pending.
    await markPublished(tx, live.map((o) => o.event));
    batch.published = true;
  }

  /** One log line per parked event, and the metric, after its batch committed. */
  #reportParked(parked: Parked[]) {
    if (parked.length === 0) return;
    for (const p of parked) {
      const fields = {
        tenant: p.event.tenant_id,
        run_id: p.event.run_id,
        seq: p.event.seq,
        event_id: p.event.event_id,
        type: p.event.type,
        bytes: p.bytes,
        reason: p.reason,
      };
      if (p.follows === undefined) {
        this.#log.error(
          "event parked: it can never be published as it is; its run's later events wait behind it",
          fields,
        );
      } else {
        this.#log.warn("event parked behind an earlier parked event of its run", fields);
      }
    }
    this.#opts.hooks?.onParked?.(parked.length);
  }

  /** Declares the events topic of every tenant not seen yet; returns the events that may be sent. */
  async #ensureTopics(events: ClaimedEvent[]): Promise<ClaimedEvent[]> {
    const tenants = new Set(events.map((e) => e.tenant_id));
    for (const tenant of tenants) {
      if (this.#ensured.has(tenant) || this.#invalidTenants.has(tenant)) continue;
      let topic: TopicSpec;
      try {
        // The events topic only: dispatch topics are the publishers' to declare.
        topic = tenantTopicSpecs(tenant, this.#opts.topics)[0];
      } catch (error) {
        // Cannot be a topic name: leave its rows pending rather than fail every batch.
        this.#invalidTenants.add(tenant);
        this.#log.error("tenant id is not a valid topic name; its events stay pending", {
          tenant,
          error,
        });
        continue;
      }
      await this.#inPhase("kafka", () => this.#kafka.admin.createTopics([topic]));
      this.#ensured.add(tenant);
    }
    if (this.#invalidTenants.size === 0) return events;
    return events.filter((e) => !this.#invalidTenants.has(e.tenant_id));
  }

  /** Sends `events` and resolves once the broker acknowledged all of them. */
  async #publish(messages: ProduceMessage[]): Promise<void> {
    const producer = this.#producer ??= this.#kafka.createProducer();
    const started = performance.now();
    const timeout = new AbortController();
    try {
      await this.#inPhase("kafka", () =>
        Promise.race([
          producer.send(messages),
          delay(this.#opts.sendTimeoutMs, timeout.signal).then(() => {
            if (!timeout.signal.aborted) {
              throw new Error(`publish not acknowledged within ${this.#opts.sendTimeoutMs} ms`);
            }
          }),
        ]));
    } catch (error) {
      // After a failed or abandoned send the producer's sequence state is
      // unknown; a fresh producer (new producer id) starts clean.
      if (this.#producer === producer) await this.#dropProducer();
      // A topic deleted behind our back fails every send: declare again
      // (idempotent, one request per tenant) on the next try.
      this.#ensured.clear();
      throw error;
    } finally {
      timeout.abort();
    }
    this.#opts.hooks?.onPublished(messages.length, (performance.now() - started) / 1000);
  }

  async #dropProducer(): Promise<void> {
    const producer = this.#producer;
    this.#producer = undefined;
    if (!producer) return;
    // Closing needs no broker, but don't let a wedged client hold up a stop.
    await within(producer.close().catch(() => {}), 5000);
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
      this.#log.debug("outbox publish still failing", { phase, error: describe(cause) });
      return;
    }
    this.#outage = { phase, since: Date.now(), attempts: 1 };
    this.#log.warn(`${phase} unavailable, events wait in postgres; retrying with backoff`, {
      phase,
      error: describe(cause),
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

// The Kafka client wraps the telling error ("connect ECONNREFUSED …") in
// generic ones ("Producing messages failed."); a log line should show both.
function describe(error: unknown): string {
  const messages: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 6 && current instanceof Error; depth++) {
    if (current.message && !messages.includes(current.message)) messages.push(current.message);
    const nested = (current as { errors?: unknown[] }).errors;
    current = Array.isArray(nested) && nested.length > 0
      ? nested[nested.length - 1]
      : current.cause;
  }
  return messages.length > 0 ? messages.join(": ") : String(error);
}

const utf8 = new TextEncoder();

/** The Kafka message of one event: keyed by run, so a run's events share a partition. */
export function toMessage(e: PendingEvent): ProduceMessage & { value: Uint8Array } {
  const headers: Record<string, string> = {
    [EVENT_HEADERS.contentType]: "application/json",
    [EVENT_HEADERS.eventId]: e.event_id,
    [EVENT_HEADERS.tenantId]: e.tenant_id,
    [EVENT_HEADERS.runId]: e.run_id,
    [EVENT_HEADERS.seq]: String(e.seq),
    [EVENT_HEADERS.type]: e.type,
  };
  if (e.goal_id !== null) headers[EVENT_HEADERS.goalId] = e.goal_id;
  if (e.dispatch_key !== null) headers[EVENT_HEADERS.dispatchKey] = e.dispatch_key;
  // Typed by the contract, not parsed with it: the table's constraints
  // already guarantee the shape, and a failed parse here would leave the
  // row pending forever and stall every batch behind it. The tests parse
  // what they read back.
  const envelope: Omit<EventMessage, "payload" | "at"> = {
    // Identity values stay far below 2^53; a number is what consumers expect.
    event_id: Number(e.event_id),
    tenant_id: e.tenant_id,
    run_id: e.run_id,
    seq: e.seq,
    type: e.type,
    goal_id: e.goal_id,
    dispatch_key: e.dispatch_key,
  };
  // The payload is Postgres's own JSON text, spliced in as it is: valid JSON
  // (jsonb holds nothing else), never parsed here.
  const head = JSON.stringify(envelope);
  const json = `${head.slice(0, -1)},"payload":${e.payload},"at":${
    JSON.stringify(e.at.toISOString())
  }}`;
  return {
    topic: eventsTopic(e.tenant_id),
    key: eventMessageKey(e.tenant_id, e.run_id),
    value: utf8.encode(json),
    headers,
  };
}

function runKey(e: PendingEvent): string {
  return `${e.tenant_id}/${e.run_id}`;
}

/**
 * Splits a batch into sends of at most about `limit` bytes. They are sent one
 * after another, each acknowledged before the next, so a run cut in two
 * still arrives in seq order.
 */
function chunks(items: Outgoing[], limit: number): Outgoing[][] {
  const out: Outgoing[][] = [];
  let current: Outgoing[] = [];
  let bytes = 0;
  for (const item of items) {
    const size = item.bytes;
    if (current.length > 0 && bytes + size > limit) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(item);
    bytes += size;
  }
  if (current.length > 0) out.push(current);
  return out;
}
