/**
 * Group commit: concurrent callers' items are coalesced into one flush (one
 * statement, one commit) instead of one each. There is no timer: the first
 * item flushes at once, and items that arrive while `maxConcurrent` flushes
 * are in flight wait for the next one, so batches grow exactly as fast as
 * the database is the bottleneck, and an idle system pays no added latency.
 *
 * A failed batch is split in halves, each flushed again through the same
 * `maxConcurrent` slots (ahead of new items), and so on until the bad item
 * fails alone: one poisoned item costs one failed caller and about
 * 2·log2(batch) extra flushes, never a burst of single-item flushes beyond
 * the pool.
 */

import { setImmediate } from "node:timers";

export interface BatcherOptions {
  /** Most items in one flush. */
  maxBatch: number;
  /** Most flushes in flight at once (each holds one database connection). */
  maxConcurrent: number;
  /** Called with each flushed batch's size (metrics). */
  onFlush?: (size: number) => void;
  /**
   * Flush no sooner than the next macrotask: items submitted by callers that
   * resume in the same turn of the event loop (runs a worker claimed together
   * and that end together) share one flush instead of the first going alone.
   */
  gatherTurn?: boolean;
  /**
   * Slots beyond the first open only while a flush in flight has run longer
   * than this: one flush at a time makes the largest batches (the fewest
   * statements and commits for the same items), and a slow or stuck flush
   * still does not hold every item behind it. Without it, every slot is open.
   */
  spareAfterMs?: number;
}

interface Pending<T, R> {
  item: T;
  resolve: (r: R) => void;
  reject: (e: unknown) => void;
}

/**
 * `flush` gets a batch and returns one result per item, in order; it may
 * return an `Error` in an item's place to fail that item alone. When `flush`
 * throws for a batch of several and `isolate(err)` says the error may be one
 * item's fault, the batch is bisected (see above) so a bad item fails only
 * itself. `flush` must therefore throw only when nothing of the batch
 * committed: a thrown batch is flushed again.
 */
export class Batcher<T, R> {
  readonly #flush: (items: T[]) => Promise<(R | Error)[]>;
  readonly #isolate: (err: unknown) => boolean;
  readonly #opts: BatcherOptions;
  #queue: Pending<T, R>[] = [];
  /** Halves of failed batches, flushed as they are, before new items. */
  #split: Pending<T, R>[][] = [];
  #inFlightItems = 0;
  #pumpScheduled = false;
  /** The flushes in flight: when each started (performance.now()), by its batch. */
  readonly #inFlight = new Map<Pending<T, R>[], number>();
  #spareTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    flush: (items: T[]) => Promise<(R | Error)[]>,
    opts: BatcherOptions,
    isolate: (err: unknown) => boolean = () => true,
  ) {
    this.#flush = flush;
    this.#opts = opts;
    this.#isolate = isolate;
  }

  /** Queues `item` and resolves with its own result. */
  submit(item: T): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      this.#queue.push({ item, resolve, reject });
      if (!this.#opts.gatherTurn) this.#pump();
      else if (!this.#pumpScheduled) {
        this.#pumpScheduled = true;
        // Not setTimeout(0): Deno's shortest timer waits about 2 ms (measured),
        // which a worker would pay on every completion batch.
        setImmediate(() => {
          this.#pumpScheduled = false;
          this.#pump();
        });
      }
    });
  }

  /** Items queued or in flight. */
  get pending(): number {
    return this.#queue.length + this.#split.reduce((n, b) => n + b.length, 0) +
      this.#inFlightItems;
  }

  #pump(): void {
    while (
      this.#inFlight.size < this.#opts.maxConcurrent &&
      (this.#split.length > 0 || this.#queue.length > 0)
    ) {
      if (!this.#slotOpen()) return;
      const batch = this.#split.shift() ?? this.#queue.splice(0, this.#opts.maxBatch);
      this.#inFlightItems += batch.length;
      this.#inFlight.set(batch, performance.now());
      this.#opts.onFlush?.(batch.length);
      this.#run(batch).finally(() => {
        this.#inFlightItems -= batch.length;
        this.#inFlight.delete(batch);
        this.#pump();
      });
    }
  }

  /**
   * Whether another flush may start now (see `spareAfterMs`). When not, a
   * timer looks again once the oldest flush in flight turns slow; it is
   * armed once and re-armed when it fires, never cleared per flush (a timer
   * per flush costs measurably at thousands of flushes a second).
   */
  #slotOpen(): boolean {
    const spareAfter = this.#opts.spareAfterMs;
    if (spareAfter === undefined || this.#inFlight.size === 0) return true;
    const oldest = Math.min(...this.#inFlight.values());
    const wait = oldest + spareAfter - performance.now();
    if (wait <= 0) return true;
    this.#spareTimer ??= setTimeout(() => {
      this.#spareTimer = undefined;
      this.#pump();
    }, wait);
    return false;
  }

  async #run(batch: Pending<T, R>[]): Promise<void> {
    try {
      const results = await this.#flush(batch.map((p) => p.item));
      batch.forEach((p, i) => {
        const r = results[i];
        if (r instanceof Error) p.reject(r);
        else p.resolve(r);
      });
    } catch (err) {
      if (batch.length > 1 && this.#isolate(err)) {
        // Queued, not run here: the halves wait for a slot like any flush.
        const half = Math.ceil(batch.length / 2);
        this.#split.unshift(batch.slice(0, half), batch.slice(half));
      } else {
        for (const p of batch) p.reject(err);
      }
    }
  }
}
