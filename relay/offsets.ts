/**
 * In-order offset tracking for one partition. Messages are handed out in
 * offset order but finish in any order (several API calls are in flight per
 * partition); the committable offset only moves past a message once it and
 * every message before it are done, so a crash never skips an unfinished one.
 *
 * Offsets follow Kafka's convention: the committable offset is the NEXT offset
 * to read (last done offset + 1). Gaps in offsets (compaction, transaction
 * markers) are fine: only offsets actually added are waited for.
 */

interface Entry {
  offset: bigint;
  /** The message's timestamp (ms since the epoch), for lag in seconds. */
  timestamp: number;
  done: boolean;
}

/** Tracks one partition's messages from fetch to done; not thread-safe (no need in JS). */
export class OffsetTracker {
  // A queue in offset order with a moving head: shift() on a large array is O(n).
  #entries: Entry[] = [];
  #head = 0;
  #byOffset = new Map<bigint, Entry>();
  #last: bigint | undefined;
  #committable: bigint | undefined;
  #committed: bigint | undefined;

  /** Records a fetched message; offsets must increase (throws otherwise). */
  add(offset: bigint, timestamp: number): void {
    if (this.#last !== undefined && offset <= this.#last) {
      throw new RangeError(`offset ${offset} is not after ${this.#last}`);
    }
    const entry = { offset, timestamp, done: false };
    this.#entries.push(entry);
    this.#byOffset.set(offset, entry);
    this.#last = offset;
  }

  /** Marks a message done (admitted or dead-lettered); unknown offsets are ignored. */
  complete(offset: bigint): void {
    const entry = this.#byOffset.get(offset);
    if (!entry || entry.done) return;
    entry.done = true;
    this.#byOffset.delete(offset);
    while (this.#head < this.#entries.length && this.#entries[this.#head].done) {
      this.#committable = this.#entries[this.#head].offset + 1n;
      this.#head++;
    }
    if (this.#head > 1024 && this.#head * 2 > this.#entries.length) {
      this.#entries = this.#entries.slice(this.#head);
      this.#head = 0;
    }
  }

  /**
   * Forgets every message after `offset` (done or not), as if never fetched:
   * they will be fetched again. For a partition that is paused while
   * `offset` is retried. Throws when that would forget a message already in
   * the committable prefix (the offset must not be before the oldest one not
   * done). Returns how many messages not yet done were forgotten.
   */
  forgetAfter(offset: bigint): number {
    if (this.#committable !== undefined && offset + 1n < this.#committable) {
      throw new RangeError(`offset ${offset} is before the committable ${this.#committable}`);
    }
    let forgotten = 0;
    while (this.#entries.length > this.#head) {
      const entry = this.#entries[this.#entries.length - 1];
      if (entry.offset <= offset) break;
      this.#entries.pop();
      if (!entry.done) {
        this.#byOffset.delete(entry.offset);
        forgotten++;
      }
    }
    const tail = this.#entries[this.#entries.length - 1];
    if (this.#last !== undefined && this.#last > offset) {
      this.#last = tail?.offset ??
        (this.#committable !== undefined ? this.#committable - 1n : undefined);
    }
    return forgotten;
  }

  /** The offsets after `offset` that are done but not yet in the committable prefix. */
  doneAfter(offset: bigint): bigint[] {
    const done: bigint[] = [];
    for (let i = this.#head; i < this.#entries.length; i++) {
      const e = this.#entries[i];
      if (e.offset > offset && e.done) done.push(e.offset);
    }
    return done;
  }

  /** The next offset to read once everything done so far is committed; undefined before any. */
  get committable(): bigint | undefined {
    return this.#committable;
  }

  /** The offset to commit now, or undefined when nothing new is committable. */
  toCommit(): bigint | undefined {
    const c = this.#committable;
    if (c === undefined || (this.#committed !== undefined && c <= this.#committed)) {
      return undefined;
    }
    return c;
  }

  /** Records that `offset` was committed (acknowledged by the broker). */
  committed(offset: bigint): void {
    if (this.#committed === undefined || offset > this.#committed) this.#committed = offset;
  }

  /** Messages added and not yet done. */
  get pending(): number {
    return this.#byOffset.size;
  }

  /** Timestamp of the oldest message not yet done, or undefined when all are done. */
  oldestPendingTimestamp(): number | undefined {
    return this.#head < this.#entries.length ? this.#entries[this.#head].timestamp : undefined;
  }

  /** The highest offset added so far. */
  get last(): bigint | undefined {
    return this.#last;
  }
}
