/**
 * A bound on the request bodies the API holds at once. The body limit caps
 * one request; this caps their sum, from the moment a body is read until its
 * response is ready (the raw bytes, the parsed JSON, the admission batch that
 * carries it). Without it, a few dozen concurrent 1 MiB requests make the
 * heap as large as they like (parsed JSON can take about 40 times its size:
 * 64 clients took an API to 2.8 GB); with it, what bodies take is bounded.
 */
import { PoimenError } from "../core/errors.ts";

interface Waiter {
  bytes: number;
  grant: () => void;
}

/** Bytes of request bodies granted at once, handed out first come, first served. */
export class BodyBudget {
  readonly total: number;
  #free: number;
  readonly #waiters: Waiter[] = [];

  constructor(totalBytes: number) {
    this.total = totalBytes;
    this.#free = totalBytes;
  }

  /** Bytes not granted right now. */
  get free(): number {
    return this.#free;
  }

  /** Requests waiting for bytes. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /**
   * Waits up to `waitMs` for `bytes` (at most the whole budget) and returns
   * the function that gives them back (calling it again does nothing).
   * Rejects with a retryable `busy` error when the wait runs out. Waiters are
   * served in order: a large body is not passed over forever by small ones.
   */
  async acquire(bytes: number, waitMs: number): Promise<() => void> {
    return this.tryAcquire(bytes) ?? await this.#wait(this.#clamp(bytes), waitMs);
  }

  /** `acquire` when the bytes are free now (and nobody waits before): no promise, no timer. */
  tryAcquire(bytes: number): (() => void) | undefined {
    const want = this.#clamp(bytes);
    if (this.#waiters.length > 0 || want > this.#free) return undefined;
    this.#free -= want;
    return this.#releaser(want);
  }

  /** A request never waits for more than the whole budget. */
  #clamp(bytes: number): number {
    return Math.min(Math.max(0, bytes), this.total);
  }

  async #wait(want: number, waitMs: number): Promise<() => void> {
    const granted = Promise.withResolvers<void>();
    const waiter: Waiter = { bytes: want, grant: granted.resolve };
    this.#waiters.push(waiter);
    // A timer only for a request that has to wait: the common path sets none.
    const timer = setTimeout(() => {
      const i = this.#waiters.indexOf(waiter);
      if (i < 0) return; // granted meanwhile
      this.#waiters.splice(i, 1);
      // It may have been the head that held back those behind it.
      this.#grant();
      granted.reject(
        new PoimenError("busy", "too many request bodies are being processed; retry later"),
      );
    }, waitMs);
    try {
      await granted.promise;
    } finally {
      clearTimeout(timer);
    }
    return this.#releaser(want);
  }

  #releaser(bytes: number): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#free += bytes;
      this.#grant();
    };
  }

  #grant(): void {
    while (this.#waiters.length > 0 && this.#waiters[0].bytes <= this.#free) {
      const w = this.#waiters.shift()!;
      this.#free -= w.bytes;
      w.grant();
    }
  }
}
