/** What a `Worker` reports as it goes (worker/metrics.ts turns it into metrics). */
import type { ReclaimedRun } from "../db/leases.ts";
import type { SlotCorrection } from "../db/slot_reconcile.ts";
import type { LaneRepair } from "./lane_repairer.ts";
import type { StepKind } from "../db/run_steps.ts";

/** How one claimed attempt ended, as far as this worker knows. */
export type AttemptOutcome =
  | "succeeded"
  | "retrying"
  | "failed"
  /** Ended on request (POST /v1/runs/{id}/cancel). */
  | "cancelled"
  /** Given back unfinished on shutdown. */
  | "released"
  /** Suspended (a long sleep or wait): `waiting`, its attempt given back. */
  | "suspended"
  /** The lease was lost (reclaimed elsewhere): nothing was written. */
  | "lost";

/** The statements fenced by attempt: refused when the lease they speak for is gone. */
export type FencedStatement = "heartbeat" | "complete" | "fail" | "release";

/** Callbacks for metrics; none may throw. */
export interface WorkerHooks {
  onClaimed?(count: number): void;
  onFinished?(outcome: AttemptOutcome): void;
  onReclaimed?(runs: ReclaimedRun[]): void;
  /** A lease renewal or finishing write was refused: its attempt no longer holds the lease. */
  onFenced?(statement: FencedStatement): void;
  /** A lease renewal did not answer within its timeout (the leases are unconfirmed). */
  onHeartbeatTimeout?(): void;
  /** The slot reconciler corrected a concurrency group's drifted counts. */
  onSlotCorrected?(correction: SlotCorrection): void;
  /** The lane repairer lowered a lane later than its queued runs (worker/lane_repairer.ts). */
  onLaneRepaired?(repair: LaneRepair): void;
  /** This worker became the fleet's leader (true) or stopped being it (false). */
  onLeader?(leader: boolean): void;
  /** A durable call ended (its wait included): its kind, how, and how long it took. */
  onStepFinished?(kind: StepKind, outcome: "completed" | "failed", seconds: number): void;
  /** A run was suspended, waiting for a sleep's end, a signal or its children. */
  onSuspended?(reason: "sleep" | "signal" | "children"): void;
  /** The waker queued runs whose deadline came (worker/run_waker.ts). */
  onWoken?(runs: number): void;
  /** A lease renewal answered: one statement, renewing `runs` runs' leases. */
  onLeasesRenewed?(runs: number): void;
}
