/**
 * The outbox purger, a maintenance service in the manner of River's: every
 * `intervalMs` it deletes `work_events` rows published more than
 * `retentionMs` ago, in batches of `batchSize` so no statement holds its
 * locks for long. Pending and parked rows are never deleted, however old. It shares
 * nothing with publishing but the pool, so it runs beside the publisher
 * rather than inside its loop.
 */
import { once, type Service } from "../core/lifecycle.ts";
import type { Logger } from "../core/log.ts";
import { delay } from "../core/time.ts";
import { purgePublished } from "../db/outbox.ts";
import type { Sql } from "../db/pool.ts";

/** Options of `OutboxPurger`. */
export interface OutboxPurgerOptions {
  /** How long published rows are kept. */
  retentionMs: number;
  /** Time between two purge rounds. */
  intervalMs: number;
  /** Rows deleted per statement. */
  batchSize: number;
  log: Logger;
}

// One purge round deletes at most this many batches, then yields to the next interval.
const MAX_PURGE_BATCHES = 100;

/** Deletes published events past retention until stopped. */
export class OutboxPurger implements Service {
  readonly #sql: Sql;
  readonly #opts: OutboxPurgerOptions;
  readonly #abort = new AbortController();
  #loop: Promise<void> = Promise.resolve();
  #started = false;

  constructor(sql: Sql, opts: OutboxPurgerOptions) {
    this.#sql = sql;
    this.#opts = opts;
  }

  /** Starts purging in the background, the first round at once; never waits on Postgres. */
  start(): Promise<void> {
    if (this.#started) throw new Error("outbox purger already started");
    this.#started = true;
    this.#loop = this.#run();
    return Promise.resolve();
  }

  /** Stops after the statement in flight. Safe to call twice. */
  readonly stop: () => Promise<void> = once(async () => {
    this.#abort.abort();
    await this.#loop;
  });

  async #run(): Promise<void> {
    const signal = this.#abort.signal;
    const { retentionMs, batchSize, intervalMs, log } = this.#opts;
    let failing = false;
    while (!signal.aborted) {
      try {
        let total = 0;
        for (let i = 0; i < MAX_PURGE_BATCHES && !signal.aborted; i++) {
          const n = await purgePublished(this.#sql, retentionMs, batchSize);
          total += n;
          if (n < batchSize) break;
        }
        if (total > 0) log.info("purged published events", { count: total });
        if (failing) log.info("purge works again");
        failing = false;
      } catch (error) {
        if (!failing) log.warn("purge failed; retrying next interval", { error });
        failing = true;
      }
      await delay(intervalMs, signal);
    }
  }
}
