/**
 * How several outbox publisher processes split the work without holding a
 * transaction open while they wait on Kafka.
 *
 * Every run's events belong to one of `OUTBOX_SHARDS` shards (db/outbox.ts).
 * A publisher ships the runs of the shards whose session-level advisory lock
 * it holds, on a connection of its own that holds nothing else (no
 * transaction, no snapshot: vacuum is never held back by it). One run is
 * thus shipped by one process at a time, in seq order, each batch after the
 * previous one was acknowledged and marked — the guarantee `FOR UPDATE SKIP
 * LOCKED` held in the batch's transaction used to give.
 *
 * Sharing: each publisher also holds one shared lock, so `pg_locks` counts
 * the publishers of the database; each keeps about its fair share
 * (⌈shards / publishers⌉), giving back extra shards and taking free ones
 * every `rebalanceMs`, between batches (never while a batch of them is in
 * flight). A publisher that stops or dies frees its locks with its session,
 * and the others take its shards at their next rebalance.
 *
 * A session that dropped (Postgres restarted, the connection killed, the
 * pool's idle timeout) takes its locks with it; the pool opens a new one.
 * Claims name the session that took the locks (`ShardScope.pid`), so a claim
 * on the new session reads nothing until the next rebalance sees the change
 * and takes shards again. In the moments between, another process may take
 * a shard whose batch this one still sends: the run's events then go twice,
 * each copy in seq order — at least once, as documented; consumers dedupe by
 * `(run_id, seq)`.
 */
import type { Logger } from "../core/log.ts";
import {
  countPublishers,
  joinPublishers,
  OUTBOX_SHARDS,
  type ShardScope,
  tryLockShards,
  unlockShards,
} from "../db/outbox.ts";
import type { Sql } from "../db/pool.ts";

/** Options of `ShardLocks`. */
export interface ShardLocksOptions {
  /** A pool of one connection, used for nothing else (its session holds the locks). */
  session: Sql;
  /** How often the shards are shared out again among the publishers. */
  rebalanceMs: number;
  log: Logger;
}

/** One publisher's shard locks; see the module comment. */
export class ShardLocks {
  readonly #opts: ShardLocksOptions;
  readonly #held = new Set<number>();
  #pid: number | undefined;
  #balancedAt = -Infinity;
  // Where this process starts looking for free shards: processes starting
  // at different places contend less for the same ones.
  readonly #offset = Math.floor(Math.random() * OUTBOX_SHARDS);

  constructor(opts: ShardLocksOptions) {
    this.#opts = opts;
  }

  /** The connection claims must run on: the one holding the locks. */
  get session(): Sql {
    return this.#opts.session;
  }

  /**
   * The shards this publisher may claim now (maybe none, while the others
   * have yet to give theirs back), rebalanced first when due. Call it between
   * batches only.
   */
  async scope(): Promise<ShardScope> {
    const due = performance.now() - this.#balancedAt >= this.#opts.rebalanceMs;
    if (due || this.#pid === undefined) await this.#balance();
    return { shards: [...this.#held], pid: this.#pid ?? 0 };
  }

  async #balance(): Promise<void> {
    const sql = this.#opts.session;
    let { pid, publishers, joined } = await countPublishers(sql);
    if (!joined) {
      // A new session: whatever the old one held went with it.
      if (this.#held.size > 0) {
        this.#opts.log.warn("outbox lock session was replaced; taking shards again", {
          shards: this.#held.size,
        });
      }
      this.#held.clear();
      await joinPublishers(sql);
      publishers++;
    }
    this.#pid = pid;
    const share = Math.ceil(OUTBOX_SHARDS / Math.max(1, publishers));
    if (this.#held.size > share) {
      const extra = [...this.#held].sort((a, b) => a - b).slice(share);
      await unlockShards(sql, extra);
      for (const s of extra) this.#held.delete(s);
    } else if (this.#held.size < share) {
      const candidates: number[] = [];
      for (let i = 0; i < OUTBOX_SHARDS; i++) {
        const s = (this.#offset + i) % OUTBOX_SHARDS;
        if (!this.#held.has(s)) candidates.push(s);
      }
      const taken = await tryLockShards(sql, candidates, share - this.#held.size);
      for (const s of taken) this.#held.add(s);
    }
    this.#balancedAt = performance.now();
    this.#opts.log.debug("outbox shards balanced", {
      publishers,
      shards: this.#held.size,
    });
  }

  /** Closes the session, which frees every lock it holds. */
  async close(): Promise<void> {
    this.#held.clear();
    this.#pid = undefined;
    await this.#opts.session.end({ timeout: 5 });
  }
}
