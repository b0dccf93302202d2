/**
 * Delivery of one claimed batch of outbox events: send them in chunks, mark
 * what the broker acknowledged, and park what can never go.
 *
 * Parking: an event over `maxBytes` (EVENTS_MAX_MESSAGE_BYTES, the events
 * topic's `max.message.bytes`), or one the broker refuses for a permanent
 * reason (MESSAGE_TOO_LARGE, INVALID_RECORD…, see `permanentRecordError`),
 * would fail every retry and stall every batch behind it, of every tenant.
 * It is parked instead (`parked_at`, `parked_reason`; an error log line and
 * `poimen_outbox_parked_events`), and the batch goes on. A send the broker
 * refuses for good is split in halves until the culprit is alone, so the
 * rest of the batch still ships, in order. The broker being away is not
 * permanent: that failure is thrown, for the caller to wait and retry.
 *
 * The later events of a parked event's run are parked behind it ("follows
 * parked seq N"), never shipped: consumers fold a run by `(run_id, seq)` and
 * may rely on seq n+1 never arriving without seq n, which shipping past the
 * gap would break; and once the cause is fixed (e.g. the topic's limit
 * raised), clearing `parked_at` on the run's rows ships all of them, in
 * order. Other runs and other tenants are unaffected either way.
 *
 * It knows neither Kafka nor Postgres: it is written over a function that
 * sends records and a ledger that parks and marks (each call one short
 * statement: no transaction spans the sends), so bisecting and parking are tested with fakes
 * (tests/outbox_delivery_test.ts).
 */
import type { Logger } from "../core/log.ts";
import type { ClaimedEvent, PendingEvent } from "../db/outbox.ts";
import { permanentRecordError, type ProduceMessage, recordBatchBytes } from "../kafka/producer.ts";
import { toMessage } from "./event_message.ts";

/**
 * Sends `messages` (in the order given, one produce request) and resolves
 * once the broker acknowledged all of them; rejects otherwise (then none,
 * some or all may have been written).
 */
export type SendRecords = (messages: ProduceMessage[]) => Promise<void>;

/** Where a delivery records its outcome: each call commits on its own. */
export interface DeliveryLedger {
  /** Parks these events (they are never sent). */
  park(parked: Parked[]): Promise<unknown>;
  /** Marks these events published: the broker acknowledged them. */
  markPublished(events: ClaimedEvent[]): Promise<unknown>;
}

/** An event parked in this batch, reported once its park committed. */
export interface Parked {
  event: PendingEvent;
  bytes: number | undefined;
  reason: string;
  /** The parked seq of its run it follows, when that is why it was parked. */
  follows?: number;
}

/** Options of `BatchDelivery`. */
export interface DeliveryOptions {
  send: SendRecords;
  ledger: DeliveryLedger;
  /** The events topic's max.message.bytes: a larger event is parked unsent. */
  maxBytes: number;
  /** Bytes of one produce request at most (one event alone may be larger); 512 KiB when not said. */
  chunkBytes?: number;
}

// Produce requests are kept well under the topic's max.message.bytes; a
// run's events are split only when they exceed it.
const CHUNK_BYTES = 512 * 1024;

interface Outgoing {
  event: ClaimedEvent;
  message: ProduceMessage & { value: Uint8Array };
  /** Its size as a record batch of its own (`recordBatchBytes`). */
  bytes: number;
}

/**
 * The delivery of one batch. `deliver` may be called more than once (a run
 * parked by an earlier call stays parked for the later ones); what it parked
 * and whether anything was published are read after.
 */
export class BatchDelivery {
  readonly #opts: DeliveryOptions;
  readonly #chunkBytes: number;
  /** Runs with a parked event in this batch, by run key: the seq parked. */
  readonly #parkedRuns = new Map<string, number>();
  readonly #parked: Parked[] = [];
  #published = false;

  constructor(opts: DeliveryOptions) {
    this.#opts = opts;
    this.#chunkBytes = Math.min(opts.chunkBytes ?? CHUNK_BYTES, opts.maxBytes);
  }

  /** The events parked so far, in the order they were parked. */
  get parked(): readonly Parked[] {
    return this.#parked;
  }

  /** Whether the broker acknowledged at least one send. */
  get published(): boolean {
    return this.#published;
  }

  /**
   * Sends `events` (ordered by run and seq, as claimed) chunk after chunk,
   * each acknowledged before the next, so a run cut in two still arrives in
   * seq order. Rejects with the first failure that is not permanent; what
   * was acknowledged (or parked) before it stays marked.
   */
  async deliver(events: ClaimedEvent[]): Promise<void> {
    const outgoing = events.map((event) => {
      const message = toMessage(event);
      return { event, message, bytes: recordBatchBytes(message) };
    });
    for (const chunk of chunks(outgoing, this.#chunkBytes)) await this.#deliver(chunk);
  }

  /**
   * Sends `items` (in seq order per run) and marks them published; parks
   * those that cannot go. A send the broker refuses for a permanent reason is
   * split in halves, each sent (or split again) in turn, until the refused
   * event is alone and parked: everything before it was acknowledged first
   * and everything after it is sent after, so per-run order holds. Any other
   * failure is thrown: the broker may be down, so wait and retry.
   */
  async #deliver(items: Outgoing[]): Promise<void> {
    const maxBytes = this.#opts.maxBytes;
    const parkedRuns = this.#parkedRuns;
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
      } else if (item.bytes > maxBytes) {
        const reason = `${item.bytes} bytes exceeds EVENTS_MAX_MESSAGE_BYTES ` +
          `(${maxBytes})`;
        stay.push({ event: e, bytes: item.bytes, reason });
        parkedRuns.set(runKey(e), e.seq);
      } else {
        live.push(item);
      }
    }
    if (stay.length > 0) await this.#park(stay);
    if (live.length === 0) return;
    try {
      await this.#opts.send(live.map((o) => o.message));
    } catch (error) {
      const permanent = permanentRecordError(error);
      if (permanent === undefined) throw error;
      if (live.length === 1) {
        const [item] = live;
        await this.#park([{
          event: item.event,
          bytes: item.bytes,
          reason: `broker refused it: ${permanent}`,
        }]);
        return;
      }
      const half = Math.ceil(live.length / 2);
      await this.#deliver(live.slice(0, half));
      await this.#deliver(live.slice(half));
      return;
    }
    // Only what the broker acknowledged is marked; a later chunk's failure
    // leaves its rows (and everything after) pending.
    await this.#opts.ledger.markPublished(live.map((o) => o.event));
    this.#published = true;
  }

  async #park(list: Parked[]): Promise<void> {
    await this.#opts.ledger.park(list);
    for (const p of list) this.#parkedRuns.set(runKey(p.event), p.follows ?? p.event.seq);
    this.#parked.push(...list);
  }
}

/**
 * One log line per parked event, and `onParked` with their count; called
 * once their parks committed (a failed park is no park).
 */
export function reportParked(
  parked: readonly Parked[],
  log: Logger,
  onParked?: (count: number) => void,
): void {
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
      log.error(
        "event parked: it can never be published as it is; its run's later events wait behind it",
        fields,
      );
    } else {
      log.warn("event parked behind an earlier parked event of its run", fields);
    }
  }
  onParked?.(parked.length);
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
