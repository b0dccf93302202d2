/**
 * The lease reclaimer, a maintenance service in the manner of River's: it
 * runs beside the claim loop and returns runs whose lease expired (their
 * worker died or hung) to the queue, or fails them when that was their
 * last attempt. Only the workers' elected leader runs one (core/leader.ts):
 * its loose scan of every tenant with running runs is done once per
 * interval for the fleet. Two for a moment (a leader that has not noticed
 * it lost the lock) do no harm: `reclaimExpired` skips rows another
 * reclaimer holds.
 */
import type { Logger } from "../core/log.ts";
import { IntervalMaintenance } from "../core/maintenance.ts";
import { SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { type ReclaimedRun, reclaimExpired } from "../db/leases.ts";

/** Options of `Reclaimer`. */
export interface ReclaimerOptions {
  /** Mean time between two looks for expired leases (jittered ±25%). */
  intervalMs: number;
  log: Logger;
  /** After a round that reclaimed something; must not throw. */
  onReclaimed?(runs: ReclaimedRun[]): void;
}

// Runs one reclaim statement takes at most; more are taken by looping.
const RECLAIM_BATCH = 100;
// A failing round waits longer each time, up to this.
const DB_RETRY_CAP_MS = 10 * SECOND;

/** Returns expired-lease runs to the queue every `intervalMs` until stopped. */
export class Reclaimer extends IntervalMaintenance {
  readonly #sql: Sql;
  readonly #opts: ReclaimerOptions;

  constructor(sql: Sql, opts: ReclaimerOptions) {
    super("reclaimer", opts.log, {
      intervalMs: opts.intervalMs,
      retryCapMs: DB_RETRY_CAP_MS,
      failedMessage: "reclaim failed",
    });
    this.#sql = sql;
    this.#opts = opts;
  }

  protected async work(): Promise<void> {
    const all = await this.#reclaimAll();
    if (all.length > 0) this.#opts.onReclaimed?.(all);
  }

  /** One round: reclaims every expired lease, logging each run. */
  async #reclaimAll(): Promise<ReclaimedRun[]> {
    const all: ReclaimedRun[] = [];
    for (;;) {
      const batch = await reclaimExpired(this.#sql, RECLAIM_BATCH);
      all.push(...batch);
      if (batch.length < RECLAIM_BATCH) break;
    }
    for (const r of all) {
      this.#opts.log.warn("lease expired", {
        tenant: r.tenant_id,
        run_id: r.run_id,
        attempt: r.attempts,
        previous_worker: r.previous_owner,
        status: r.status,
      });
    }
    return all;
  }
}
