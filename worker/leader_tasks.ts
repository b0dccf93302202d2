/**
 * The fleet-wide maintenance a worker runs while it is the leader
 * (core/leader.ts): the reclaimer of expired leases, the waker of waiting
 * runs whose deadline came, the lane repairer and the slot reconciler. Each
 * is made when this worker becomes the leader and stopped when it stops
 * being it, so the fleet does each once per interval, not once per worker.
 */
import type { Logger } from "../core/log.ts";
import type { LeaderElector } from "../core/leader.ts";
import type { Sql } from "../db/pool.ts";
import type { WorkerHooks } from "./hooks.ts";
import { LaneRepairer } from "./lane_repairer.ts";
import { Reclaimer } from "./reclaimer.ts";
import { RunWaker } from "./run_waker.ts";
import { SlotReconciler } from "./slot_reconciler.ts";

/** What the leader's tasks need of their worker. */
export interface LeaderTaskOptions {
  reclaimMs: number;
  /** 0: no lane repairer. */
  laneRepairMs: number;
  laneRepairLanes: number;
  /** 0: no slot reconciler. */
  slotReconcileMs: number;
  slotReconcileGroups: number;
  wakeMs: number;
  hooks: WorkerHooks;
  log: Logger;
  /** A task appended events: wake the outbox publisher. */
  eventsWritten(): void;
  /** A task made runs due (queued them, lowered their lane): claim now, and tell the others. */
  due(): void;
}

/** Registers the leader's tasks on `leader` (before it starts). */
export function registerLeaderTasks(leader: LeaderElector, sql: Sql, o: LeaderTaskOptions): void {
  // One reclaimer for the fleet: its loose scan of every tenant with
  // running runs is done once per interval, not once per worker.
  leader.whileLeader("reclaimer", () =>
    new Reclaimer(sql, {
      intervalMs: o.reclaimMs,
      log: o.log,
      onReclaimed: (runs) => {
        o.hooks.onReclaimed?.(runs);
        if (runs.length > 0) o.eventsWritten();
        // Requeued runs are due now.
        if (runs.some((r) => r.status === "queued")) o.due();
      },
    }));
  // Waiting runs whose deadline came (a sleep's end, a wait's timeout).
  leader.whileLeader("run-waker", () =>
    new RunWaker(sql, {
      intervalMs: o.wakeMs,
      log: o.log,
      onWoken: (runs) => {
        o.hooks.onWoken?.(runs.length);
        o.eventsWritten();
        o.due();
      },
    }));
  // Lanes later than their queued runs are lowered by the leader alone.
  if (o.laneRepairMs > 0) {
    leader.whileLeader("lane-repairer", () =>
      new LaneRepairer(sql, {
        intervalMs: o.laneRepairMs,
        lanesPerRound: o.laneRepairLanes,
        log: o.log,
        onRepaired: (r) => {
          o.hooks.onLaneRepaired?.(r);
          // A lowered lane may be due now.
          o.due();
        },
      }));
  }
  // Slot counts are checked by the leader alone: one cursor for the fleet.
  if (o.slotReconcileMs > 0) {
    leader.whileLeader("slot-reconciler", () =>
      new SlotReconciler(sql, {
        intervalMs: o.slotReconcileMs,
        groupsPerRound: o.slotReconcileGroups,
        log: o.log,
        onCorrected: (c) => o.hooks.onSlotCorrected?.(c),
      }));
  }
}
