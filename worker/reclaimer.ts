/**
 * The lease reclaimer, a maintenance service in the manner of River's: it
 * runs beside the claim loop and returns runs whose lease expired (their
 * worker died or hung) to the queue, or fails them when that was their
 * last attempt. Every worker runs one, so the fleet looks more often than
 * any one of them; `reclaimExpired` skips rows another reclaimer holds.
 */
import type { Logger } from "../core/log.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { type ReclaimedRun, reclaimExpired } from "../db/queue.ts";

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
export class Reclaimer implements Service {
  readonly #sql: Sql;
  readonly #opts: ReclaimerOptions;
  readonly #stopping = new AbortController();
  #loop: Promise<void> = Promise.resolve();
  #started = false;

  constructor(sql: Sql, opts: ReclaimerOptions) {
    this.#sql = sql;
    this.#opts = opts;
  }

  /** Starts looking in the background; the first look is one interval away. */
  start(): Promise<void> {
    if (this.#started) throw new Error("reclaimer already started");
    if (this.#stopping.signal.aborted) throw new Error("reclaimer stopped");
    this.#started = true;
    this.#loop = this.#run();
    return Promise.resolve();
  }

  /** Stops looking; a round in progress finishes first. Safe to call twice. */
  readonly stop: () => Promise<void> = once(async () => {
    this.#stopping.abort();
    await this.#loop;
  });

  async #run(): Promise<void> {
    const signal = this.#stopping.signal;
    let failures = 0;
    while (!signal.aborted) {
      // Jitter keeps a fleet started together from reclaiming in lockstep.
      const wait = this.#opts.intervalMs * (0.75 + Math.random() / 2);
      await delay(failures ? backoffWithJitter(failures, wait, DB_RETRY_CAP_MS) : wait, signal);
      if (signal.aborted) return;
      try {
        const all = await this.#reclaimAll();
        failures = 0;
        if (all.length > 0) this.#opts.onReclaimed?.(all);
      } catch (err) {
        failures++;
        this.#opts.log.warn("reclaim failed", { error: err, failures });
      }
    }
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
