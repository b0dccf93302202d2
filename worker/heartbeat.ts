/**
 * The heartbeat of one attempt: extends its lease every third of it until
 * the run is done, and carries a cancel request (read from the row) to the
 * handler. Each beat is bounded by a timeout (a third of the lease, and never
 * past the lease this worker last confirmed) and then cancelled: a beat stuck
 * on a row lock or a dead connection must not keep the handler running on a
 * lease that has run out. A beat that timed out counts as failed (it may or
 * may not have been written): the lease is only extended by a beat that
 * answered. When the lease is lost (fenced) or runs out, the handler's
 * signal is aborted and nothing of the attempt is written.
 */
import { delay } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { heartbeat } from "../db/leases.ts";
import { type Attempt, loseLease } from "./attempt.ts";
import type { WorkerHooks } from "./hooks.ts";

/** What a heartbeat needs of its worker. */
export interface HeartbeatContext {
  sql: Sql;
  /** The worker's lease owner id. */
  owner: string;
  leaseMs: number;
  hooks: WorkerHooks;
}

/** Beats for `attempt` until its `done` signal aborts or its lease is lost. */
export async function heartbeatLoop(attempt: Attempt, ctx: HeartbeatContext): Promise<void> {
  const { run, lease, log } = attempt;
  const { owner, leaseMs } = ctx;
  const every = leaseMs / 3;
  const stop = attempt.done.signal;
  while (!stop.aborted) {
    // After a failed beat, try again sooner, but not in a tight loop.
    attempt.nudge = new AbortController();
    await delay(
      Math.max(0, Math.min(every, lease.until - Date.now() - every)),
      AbortSignal.any([stop, attempt.nudge.signal]),
    );
    if (stop.aborted) return;
    const sentAt = Date.now();
    const timeout = AbortSignal.timeout(Math.max(1, Math.min(every, lease.until - sentAt)));
    try {
      const held = await heartbeat(
        ctx.sql,
        run.tenant_id,
        run.run_id,
        owner,
        run.attempts,
        leaseMs,
        // Not `stop`: a beat in flight when the run ends is left to finish.
        // Cancelling is a request to the backend, which may by then run
        // the connection's next statement; only a beat that hangs is worth it.
        timeout,
      );
      if (stop.aborted) return;
      if (held === "lost") {
        ctx.hooks.onFenced?.("heartbeat");
        return loseLease(attempt, "lease lost (heartbeat fenced)");
      }
      lease.until = sentAt + leaseMs;
      // Beating goes on: the lease must outlive the handler winding down.
      if (held === "cancel-requested" && !attempt.cancelRequested) {
        attempt.cancelRequested = true;
        log.info("cancel requested; aborting the run");
        attempt.abort.abort(new DOMException("run cancelled on request", "AbortError"));
      }
    } catch (err) {
      if (stop.aborted) return;
      if (timeout.aborted && err === timeout.reason) {
        ctx.hooks.onHeartbeatTimeout?.();
        log.warn("heartbeat timed out; lease unconfirmed", {
          lease_left_ms: lease.until - Date.now(),
        });
      } else log.warn("heartbeat failed", { error: err });
      if (Date.now() >= lease.until) return loseLease(attempt, "lease expired");
      await delay(Math.min(every, 250), stop);
    }
  }
}
