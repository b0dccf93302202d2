/** What a `Worker` reports as it goes (worker/metrics.ts turns it into metrics). */
import type { ReclaimedRun } from "../db/leases.ts";
import type { SlotCorrection } from "../db/slot_reconcile.ts";

/** How one claimed attempt ended, as far as this worker knows. */
export type AttemptOutcome =
  | "succeeded"
  | "retrying"
  | "failed"
  /** Ended on request (POST /v1/runs/{id}/cancel). */
  | "cancelled"
  /** Given back unfinished on shutdown. */
  | "released"
  /** The lease was lost (reclaimed elsewhere): nothing was written. */
  | "lost";

/** The statements fenced by attempt: refused when the lease they speak for is gone. */
export type FencedStatement = "heartbeat" | "complete" | "fail" | "release";

/** Callbacks for metrics; none may throw. */
export interface WorkerHooks {
  onClaimed?(count: number): void;
  onFinished?(outcome: AttemptOutcome): void;
  onReclaimed?(runs: ReclaimedRun[]): void;
  /** A heartbeat or finishing write was refused: its attempt no longer holds the lease. */
  onFenced?(statement: FencedStatement): void;
  /** A heartbeat did not answer within its timeout (the lease is unconfirmed). */
  onHeartbeatTimeout?(): void;
  /** The slot reconciler corrected a concurrency group's drifted counts. */
  onSlotCorrected?(correction: SlotCorrection): void;
}
