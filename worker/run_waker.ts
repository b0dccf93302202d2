/**
 * The run waker, a maintenance service on the leader worker: it makes the
 * waiting runs whose deadline came (a sleep's end, a signal wait's timeout)
 * `queued` again (db/suspension.ts `wakeDueRuns`), in batches, every
 * `intervalMs`, and says so (`onWoken`: the worker then wakes its claim
 * loop and NOTIFYs the others). A run woken by its signal needs none of it:
 * the signal's own transaction queues it.
 *
 * Its cost is one probe per tenant with waiting runs and one per run woken
 * (a loose scan of runs_waiting_tenant_idx, as the reclaimer's of running
 * runs); a run waiting for a signal without a timeout is never read. The
 * interval is how late a long sleep may end: WORKER_WAKE_MS, a second by
 * default (jittered ±25%).
 */
import type { Logger } from "../core/log.ts";
import { IntervalMaintenance } from "../core/maintenance.ts";
import { SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { wakeDueRuns, type WokenRun } from "../db/suspension.ts";

/** Options of `RunWaker`. */
export interface RunWakerOptions {
  /** Mean time between two rounds (jittered ±25%). */
  intervalMs: number;
  log: Logger;
  /** After a round that woke runs; must not throw. */
  onWoken?(runs: WokenRun[]): void;
}

// Runs one statement wakes at most; more are taken by looping.
const WAKE_BATCH = 500;
// A failing round waits longer each time, up to this.
const DB_RETRY_CAP_MS = 10 * SECOND;

/** Queues the waiting runs whose deadline came, every `intervalMs` until stopped. */
export class RunWaker extends IntervalMaintenance {
  readonly #sql: Sql;
  readonly #opts: RunWakerOptions;

  constructor(sql: Sql, opts: RunWakerOptions) {
    super("run waker", opts.log, {
      intervalMs: opts.intervalMs,
      retryCapMs: DB_RETRY_CAP_MS,
      failedMessage: "waking due runs failed",
    });
    this.#sql = sql;
    this.#opts = opts;
  }

  protected async work(): Promise<void> {
    await this.wake();
  }

  /** One round: wakes every waiting run whose deadline came; returns them. */
  async wake(): Promise<WokenRun[]> {
    const all: WokenRun[] = [];
    for (;;) {
      const batch = await wakeDueRuns(this.#sql, WAKE_BATCH);
      all.push(...batch);
      if (batch.length < WAKE_BATCH) break;
    }
    if (all.length > 0) {
      this.#opts.log.debug("woke runs at their deadline", { runs: all.length });
      this.#opts.onWoken?.(all);
    }
    return all;
  }
}
