/**
 * Cancelling (`requestCancel`): a queued run is cancelled by the API's own
 * statement; a running one only gets `cancel_requested_at`, and its end is
 * written by the worker's fenced statements, which read the request on the
 * row: the heartbeat reports it (db/leases.ts), and a failed, released or
 * reclaimed attempt of such a run ends it `cancelled` instead of queueing it
 * again (db/attempt_end.ts, db/leases.ts). `notifyCancel` (db/notify.ts)
 * tells the worker to look now.
 */
import type { Sql } from "./pool.ts";
import { runColumns, type RunRow } from "./runs.ts";
import { EVENT_COLUMNS } from "./queue_sql.ts";
import { fanIn } from "./fan_in.ts";
import { cancelledPayload, NULL_JSONB, NULL_TEXT } from "./event_payloads.ts";

const RUN_COLUMNS = runColumns();
// A cancelled queued run leaves its concurrency group's queue; a running one
// keeps its slot until its worker ends it.
// A run cancelled at once is delivered to its waiting parent (db/fan_in.ts),
// and is its parent's `child.finished`, in the one update of the parent.
const CANCELLED_SLOTS = fanIn(
  "upd",
  "0",
  "case when was_queued then -1 else 0 end",
  undefined,
  { childFinished: true },
);
// A queued run ends no attempt: no error, reason or worker.
const CANCELLED_QUEUED = cancelledPayload({
  attempt: "attempts",
  requested_at: "cancel_requested_at",
  error: NULL_JSONB,
  reason: NULL_TEXT,
  worker: NULL_TEXT,
});

/**
 * Cancels a run of one tenant, or asks for it to be cancelled: a queued run
 * (waiting for its first attempt, or for a retry) or a waiting one (a
 * suspended sleep or signal wait, which holds no lease and no slot) becomes
 * `cancelled` at once with a `run.cancelled` event (`requested_at`; `error`,
 * `reason` and `worker` null: no attempt ended; a waiting run keeps its
 * wait_reason and wait_name: what it waited for); a running run
 * gets `cancel_requested_at` (its worker ends it, see `heartbeat` and
 * `failAttempt`). Returns the run as it now is, with its input; undefined
 * when nothing was written: no such run for this tenant, a finished run, or
 * a running run whose cancel was already requested (read it with
 * `selectRun`). Writing nothing in those cases keeps a repeated cancel cheap.
 */
export async function requestCancel(
  sql: Sql,
  tenantId: string,
  runId: string,
): Promise<(RunRow & { input: unknown }) | undefined> {
  const [row] = await sql<(RunRow & { input: unknown })[]>`
    with upd as (
      update runs
         set status = case when status in ('queued', 'waiting') then 'cancelled' else status end,
             cancel_requested_at = coalesce(cancel_requested_at, now()),
             finished_at = case when status in ('queued', 'waiting') then now()
                                else finished_at end,
             updated_at = now(),
             event_seq = case when status in ('queued', 'waiting') then event_seq + 1
                              else event_seq end
       where tenant_id = ${tenantId} and run_id = ${runId}
         and (status in ('queued', 'waiting')
              or (status = 'running' and cancel_requested_at is null))
      returning ${sql.unsafe(RUN_COLUMNS)}, input, event_seq,
                -- Its status before: a queued run leaves its group's queue; a
                -- waiting one (it keeps its wait_reason) was in no count.
                (status = 'cancelled' and wait_reason is null) as was_queued
    ),
    ${sql.unsafe(CANCELLED_SLOTS)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.cancelled', goal_id, dispatch_key,
             ${sql.unsafe(CANCELLED_QUEUED)}, now()
        from upd
       where status = 'cancelled'
    )
    select ${sql.unsafe(RUN_COLUMNS)}, input from upd`;
  return row;
}
