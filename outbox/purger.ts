/**
 * The outbox purger, a maintenance service in the manner of River's: every
 * `intervalMs` it deletes `work_events` rows published more than
 * `retentionMs` ago, in batches of `batchSize` so no statement holds its
 * locks for long. Pending and parked rows are never deleted, however old. It shares
 * nothing with publishing but the pool, so it runs beside the publisher
 * rather than inside its loop.
 */
import { MaintenanceService } from "../core/maintenance.ts";
import type { Logger } from "../core/log.ts";
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

/** Deletes published events past retention until stopped; the first round at once. */
export class OutboxPurger extends MaintenanceService {
  readonly #sql: Sql;
  readonly #opts: OutboxPurgerOptions;
  #failing = false;

  constructor(sql: Sql, opts: OutboxPurgerOptions) {
    super("outbox purger", opts.log);
    this.#sql = sql;
    this.#opts = opts;
  }

  protected nextWaitMs(first: boolean): number {
    return first ? 0 : this.#opts.intervalMs;
  }

  protected async round(signal: AbortSignal): Promise<void> {
    const { retentionMs, batchSize, log } = this.#opts;
    try {
      let total = 0;
      for (let i = 0; i < MAX_PURGE_BATCHES && !signal.aborted; i++) {
        const n = await purgePublished(this.#sql, retentionMs, batchSize);
        total += n;
        if (n < batchSize) break;
      }
      if (total > 0) log.info("purged published events", { count: total });
      if (this.#failing) log.info("purge works again");
      this.#failing = false;
    } catch (error) {
      if (!this.#failing) log.warn("purge failed; retrying next interval", { error });
      this.#failing = true;
    }
  }
}
