/**
 * Group commit: concurrent callers' items are coalesced into one flush (one
 * statement, one commit) instead of one each. There is no timer: the first
 * item flushes at once, and items that arrive while `maxConcurrent` flushes
 * are in flight wait for the next one, so batches grow exactly as fast as
 * the database is the bottleneck, and an idle system pays no added latency.
 */

export interface BatcherOptions {
  /** Most items in one flush. */
  maxBatch: number;
  /** Most flushes in flight at once (each holds one database connection). */
  maxConcurrent: number;
  /** Called with each flushed batch's size (metrics). */
  onFlush?: (size: number) => void;
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
 * item's fault, each item is retried alone so a bad item fails only itself.
 */
export class Batcher<T, R> {
  readonly #flush: (items: T[]) => Promise<(R | Error)[]>;
  readonly #isolate: (err: unknown) => boolean;
  readonly #opts: BatcherOptions;
  #queue: Pending<T, R>[] = [];
  #inFlight = 0;

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
      this.#pump();
    });
  }

  /** Items queued or in flight. */
  get pending(): number {
    return this.#queue.length + this.#inFlight;
  }

  #pump(): void {
    while (this.#inFlight < this.#opts.maxConcurrent && this.#queue.length > 0) {
      const batch = this.#queue.splice(0, this.#opts.maxBatch);
      this.#inFlight++;
      this.#opts.onFlush?.(batch.length);
      this.#run(batch).finally(() => {
        this.#inFlight--;
        this.#pump();
      });
    }
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
        await Promise.all(batch.map((p) => this.#run([p])));
      } else {
        for (const p of batch) p.reject(err);
      }
    }
  }
}
