/**
 * The relay's budget of messages fetched and not yet done, over all
 * partitions: a count and the bytes of their values. While it is spent the
 * relay stops taking messages from the consumer, whose own buffer then fills
 * and pauses fetching. A paused partition holds one message of it (its
 * probe), so the budget is spent by partitions that are moving and frees up
 * as they move.
 */

/** Counts what is taken and given back, and wakes a waiter when there is room again. */
export class PendingBudget {
  readonly #maxPending: number;
  readonly #maxBytes: number;
  #pending = 0;
  #bytes = 0;
  #space: PromiseWithResolvers<void> | undefined;

  constructor(maxPending: number, maxBytes: number) {
    this.#maxPending = maxPending;
    this.#maxBytes = maxBytes;
  }

  /** Messages taken and not given back. */
  get pending(): number {
    return this.#pending;
  }

  /** Bytes of those messages' values. */
  get bytes(): number {
    return this.#bytes;
  }

  /** No room for another message. One message always fits, however large: a big value must not deadlock. */
  get full(): boolean {
    return this.#pending >= this.#maxPending ||
      (this.#pending > 0 && this.#bytes >= this.#maxBytes);
  }

  /** A message of `bytes` was taken in. */
  take(bytes: number): void {
    this.#pending++;
    this.#bytes += bytes;
  }

  /** A message of `bytes` is done or let go; the caller gives each share back once. */
  give(bytes: number): void {
    this.#pending--;
    this.#bytes -= bytes;
    if (this.#space && !this.full) {
      this.#space.resolve();
      this.#space = undefined;
    }
  }

  /** Resolves once there is room (at once when there is). */
  room(): Promise<void> {
    if (!this.full) return Promise.resolve();
    this.#space ??= Promise.withResolvers<void>();
    return this.#space.promise;
  }
}
