/**
 * The lane repairer, a maintenance service on the leader worker: it walks
 * the lanes of the queued runs a few at a time and lowers a lane that is
 * missing or later than its earliest queued run (db/lane_repair.ts says
 * when that can happen and why lowering is always safe). A repair means a
 * run the claims could not see: each is logged (a warning naming the lane)
 * and counted (`poimen_queue_lane_repairs_total`), never silent.
 *
 * Cheap by construction: at most `lanesPerRound` lanes a round, one round
 * every `intervalMs`, a cursor carrying the walk from round to round; each
 * lane costs one probe of the queued-runs index to find it and one per
 * priority to find its earliest run, however many runs wait in it.
 */
import client from "prom-client";
import type { Logger } from "../core/log.ts";
import { IntervalMaintenance } from "../core/maintenance.ts";
import { SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { type LaneKey, type LaneRepairRound, repairLanes } from "../db/lane_repair.ts";

/** A lane the repairer lowered. */
export type LaneRepair = LaneRepairRound["repaired"][number];

/** Options of `LaneRepairer`. */
export interface LaneRepairerOptions {
  /** Mean time between two rounds (jittered ±25%). */
  intervalMs: number;
  /** Lanes walked in one round at most. */
  lanesPerRound: number;
  log: Logger;
  /** After each repair; must not throw. */
  onRepaired?(repair: LaneRepair): void;
}

// A failing round waits longer each time, up to this.
const DB_RETRY_CAP_MS = 60 * SECOND;

/** Walks `lanesPerRound` lanes every `intervalMs` until stopped. */
export class LaneRepairer extends IntervalMaintenance {
  readonly #sql: Sql;
  readonly #opts: LaneRepairerOptions;
  #after: LaneKey | undefined;

  constructor(sql: Sql, opts: LaneRepairerOptions) {
    super("lane repairer", opts.log, {
      intervalMs: opts.intervalMs,
      retryCapMs: DB_RETRY_CAP_MS,
      failedMessage: "lane repair failed",
    });
    this.#sql = sql;
    this.#opts = opts;
  }

  protected async work(): Promise<void> {
    await this.repair();
  }

  /**
   * One round: walks the next `lanesPerRound` lanes (from the first again
   * once the walk reached the end) and returns the lanes it lowered.
   */
  async repair(): Promise<LaneRepair[]> {
    const round = await repairLanes(this.#sql, this.#after, this.#opts.lanesPerRound);
    this.#after = round.last;
    for (const lane of round.repaired) {
      this.#opts.log.warn("a lane was later than its queued runs; lowered", {
        tenant: lane.tenant_id,
        workflow: `${lane.workflow_name}@${lane.workflow_version}`,
        ready_at: lane.ready_at.toISOString(),
      });
      this.#opts.onRepaired?.(lane);
    }
    return round.repaired;
  }
}

/**
 * Registers `poimen_queue_lane_repairs_total` in `registry`; returns the
 * hook that counts a repair.
 */
export function laneRepairMetric(registry: client.Registry): (repair: LaneRepair) => void {
  const repairs = new client.Counter({
    name: "poimen_queue_lane_repairs_total",
    help: "Lanes of queued runs the lane repairer found missing or later than their earliest " +
      "run and lowered (runs no claim could see: a rolling deploy across migration 016, a bug)",
    registers: [registry],
  });
  return () => repairs.inc();
}
