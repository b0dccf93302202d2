/**
 * The cancel cascade (issue 31): cancelling a run cancels its unfinished,
 * non-detached descendants, in the cancel's own transaction
 * (`cancelTree`), one level of the tree per statement (`cancelRuns`).
 *
 * Why no child escapes a cancel, whatever commits first: a child is
 * admitted in a transaction that also updates its parent's row
 * (`noteChildrenStarted`, db/child_events.ts: its `child.started` event),
 * and the cancel updates each run before it looks for that run's children,
 * in a later statement (a new snapshot, READ COMMITTED). So either the
 * child's transaction took the parent's row first, the cancel waits for it
 * on that row and its next statement sees the child; or the cancel took it
 * first, the admission waits, then reads the cancel on the parent and
 * cancels the child itself (`cancelRuns` by run id), before committing.
 * Descendants are walked through finished runs too (a child that outlived
 * its finished parent is still in the tree), never into a detached child.
 */
import type { Sql } from "./pool.ts";
import { inTransaction } from "./pool.ts";
import { runColumns } from "./runs.ts";
import { EVENT_COLUMNS, slotCountMoves } from "./queue_sql.ts";
import { cancelledPayload, NULL_JSONB, NULL_TEXT } from "./event_payloads.ts";
import { childFinishedMoves } from "./child_events.ts";
import { requestCancel } from "./cancellation.ts";

const RUN_COLUMNS = runColumns("r");
const CANCELLED_SLOTS = slotCountMoves("upd", "0", "case when was_queued then -1 else 0 end");
const CANCELLED_QUEUED = cancelledPayload({
  attempt: "attempts",
  requested_at: "cancel_requested_at",
  error: NULL_JSONB,
  reason: NULL_TEXT,
  worker: NULL_TEXT,
});
const CHILD_FINISHED = childFinishedMoves("finished");

/** Which runs `cancelRuns` cancels: the children of these runs, or these runs. */
export type CancelTarget = { childrenOf: string[] } | { runIds: string[] };

/** What one `cancelRuns` statement did. */
export interface CancelledLevel {
  /** The runs it looked at (all the non-detached children, for `childrenOf`): the next level. */
  runIds: string[];
  /** Runs whose cancel it requested: running, their workers to be told. */
  running: string[];
  /** How many it made `cancelled` at once (queued or waiting). */
  cancelled: number;
}

/**
 * Cancels, as `requestCancel` does, each unfinished run of `target` for
 * one tenant: queued or waiting ones become `cancelled` now (`run.cancelled`,
 * their parent's `child.finished`), running ones get `cancel_requested_at`.
 * `childrenOf` reads a parent's non-detached children through
 * `runs_parent_idx`, whatever their status, so the caller can walk on.
 */
export async function cancelRuns(
  sql: Sql,
  tenantId: string,
  target: CancelTarget,
): Promise<CancelledLevel> {
  const byParent = "childrenOf" in target;
  const ids = byParent ? target.childrenOf : target.runIds;
  if (ids.length === 0) return { runIds: [], running: [], cancelled: 0 };
  const pick = byParent
    ? sql`select run_id as kid from runs
           where tenant_id collate "C" = ${tenantId} and parent_run_id = any(${ids}::uuid[])
             and parent_run_id is not null and not detached`
    : sql`select unnest(${ids}::uuid[]) as kid`;
  const [row] = await sql<{ kids: string[] | null; running: string[] | null; n: number }[]>`
    with kids as (${pick}),
    upd as (
      update runs r
         set status = case when r.status in ('queued', 'waiting') then 'cancelled'
                           else r.status end,
             cancel_requested_at = coalesce(r.cancel_requested_at, now()),
             finished_at = case when r.status in ('queued', 'waiting') then now()
                                else r.finished_at end,
             updated_at = now(),
             event_seq = case when r.status in ('queued', 'waiting') then r.event_seq + 1
                              else r.event_seq end
        from kids k
       where r.tenant_id = ${tenantId} and r.run_id = k.kid
         and (r.status in ('queued', 'waiting')
              or (r.status = 'running' and r.cancel_requested_at is null))
      returning ${sql.unsafe(RUN_COLUMNS)}, r.event_seq,
                (r.status = 'cancelled' and r.wait_reason is null) as was_queued
    ),
    ${sql.unsafe(CANCELLED_SLOTS)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.cancelled', goal_id, dispatch_key,
             ${sql.unsafe(CANCELLED_QUEUED)}, now()
        from upd
       where status = 'cancelled'
    ),
    finished as (
      select tenant_id, run_id, parent_run_id, dispatch_key, status from upd
       where status = 'cancelled'
    ),
    ${sql.unsafe(CHILD_FINISHED)}
    select (select array_agg(kid) from kids) as kids,
           (select array_agg(run_id) from upd where status = 'running') as running,
           (select count(*)::int from upd where status = 'cancelled') as n`;
  return { runIds: row.kids ?? [], running: row.running ?? [], cancelled: row.n };
}

/** Run `runId`'s status; undefined when the tenant has no such run. One probe of the primary key. */
export async function selectRunStatus(
  sql: Sql,
  tenantId: string,
  runId: string,
): Promise<string | undefined> {
  const [row] = await sql<{ status: string }[]>`
    select status from runs where tenant_id = ${tenantId} and run_id = ${runId}`;
  return row?.status;
}

/** What `cancelTree` did. */
export interface CancelledTree {
  /** The run as `requestCancel` returned it: undefined when it wrote nothing to it. */
  run: Awaited<ReturnType<typeof requestCancel>>;
  /** Descendants whose cancel was requested (running): their workers to be told. */
  running: string[];
  /** Descendants made `cancelled` at once. */
  cancelled: number;
}

// A tree deeper than this is a bug (a handler starting itself without end).
const MAX_DEPTH = 1_000;
// The cascade locks a run, then its children; a finishing child may lock
// itself, then its parent (child.finished), and an admission batch its
// parents in no set order: a deadlock Postgres breaks by failing one. The
// cascade's transaction is then tried again from the start.
const DEADLOCK = "40P01";
const MAX_TRIES = 3;

/**
 * Cancels run `runId` (`requestCancel`) and, unless it succeeded or failed,
 * its unfinished non-detached descendants, in one transaction: one
 * statement per level of the tree, each in a new snapshot (see the module
 * comment). A run already cancelled (or whose cancel was requested) is
 * walked again: a repeated cancel re-applies the cascade.
 */
export async function cancelTree(
  sql: Sql,
  tenantId: string,
  runId: string,
): Promise<CancelledTree> {
  for (let tries = 1;; tries++) {
    try {
      return await cancelTreeOnce(sql, tenantId, runId);
    } catch (err) {
      if ((err as { code?: string }).code !== DEADLOCK || tries >= MAX_TRIES) throw err;
    }
  }
}

async function cancelTreeOnce(sql: Sql, tenantId: string, runId: string): Promise<CancelledTree> {
  return await inTransaction(sql, async (tx) => {
    const run = await requestCancel(tx, tenantId, runId);
    const now = run?.status ?? await selectRunStatus(tx, tenantId, runId);
    const out: CancelledTree = { run, running: [], cancelled: 0 };
    if (now === undefined || now === "succeeded" || now === "failed") return out;
    let level = [runId];
    for (let depth = 0; level.length > 0 && depth < MAX_DEPTH; depth++) {
      const done = await cancelRuns(tx, tenantId, { childrenOf: level });
      out.running.push(...done.running);
      out.cancelled += done.cancelled;
      level = done.runIds;
    }
    return out;
  });
}
