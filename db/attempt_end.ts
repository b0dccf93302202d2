/**
 * How a worker ends the attempt it claimed: `succeeded` with a result
 * (`completeRun`, `completeRuns`), failed and retried or failed for good
 * (`failAttempt`), or given back unfinished on shutdown (`releaseRun`). Each
 * is one statement fenced by owner and attempt (see db/queue_sql.ts), and a
 * run whose cancel was requested ends `cancelled` instead of queued again.
 */
import type postgres from "postgres";
import type { Sql } from "./pool.ts";
import type { RunError } from "../contracts/event_types.ts";
import { EVENT_COLUMNS, QUEUED_AT } from "./queue_sql.ts";
import { fanIn } from "./fan_in.ts";
import {
  cancelledPayload,
  failedPayload,
  NULL_JSONB,
  NULL_TEXT,
  releasedPayload,
  retryingPayload,
  succeededPayload,
} from "./event_payloads.ts";

// postgres.js serializes a jsonb parameter itself (JSON.stringify): pass the
// value, never a string of it, or it is stored as a JSON string. Round-trip
// first so undefined fields and toJSON() are handled as JSON would.
function toJson(value: unknown): postgres.JSONValue {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

// A limited run that leaves `running` frees its group's slot; one that goes
// back to the queue is queued in its group again (db/queue_sql.ts). Each
// statement also delivers its final children to their waiting parents
// (db/fan_in.ts), whose wake-ups move counts and lanes with its own.
const SUCCEEDED_MOVES = fanIn("upd", "-1", "0");
// A batch of unlimited runs that are no run's children: no concurrency
// counts to move and no parent to wake, so the statement (prepared apart,
// being another text) skips those CTEs, the completion path of every such
// run staying what it was.
const NO_SLOTS = "no_slots as (select 1)";
// An unlimited run back in the queue lowers its lane (db/queue_sql.ts).
const ENDED_MOVES = fanIn(
  "upd",
  "-1",
  "case when status = 'queued' then 1 else 0 end",
  QUEUED_AT,
);

// The events, from the columns the statements' `upd` CTEs return (`worker`:
// the owner whose attempt ended; `released`: the attempt a release gave back).
const SUCCEEDED = succeededPayload({ attempt: "attempts", result: "result" });
const FAILED = failedPayload({ attempt: "attempts", error: "error" });
const RETRYING_AFTER_FAILURE = retryingPayload({
  attempt: "attempts",
  error: "error",
  reason: NULL_TEXT,
  worker: "worker",
  retry_at: "run_after",
});
const CANCELLED_BY_FAILURE = cancelledPayload({
  attempt: "attempts",
  requested_at: "cancel_requested_at",
  error: "error",
  reason: NULL_TEXT,
  worker: "worker",
});
const RELEASED = releasedPayload({ attempt: "released", worker: "worker", reason: "reason" });
const CANCELLED_BY_RELEASE = cancelledPayload({
  attempt: "released",
  requested_at: "cancel_requested_at",
  error: NULL_JSONB,
  reason: "reason",
  worker: "worker",
});

/** One run's completion in a `completeRuns` batch. */
export interface Completion {
  tenant_id: string;
  run_id: string;
  /** The attempt the result belongs to (the fencing token). */
  attempt: number;
  /**
   * The result as JSON text (worker/run_output.ts's `encodeResult`), written
   * as it is: a result is stringified once, by the worker, and parsed once,
   * by Postgres.
   */
  result_json: string;
  /**
   * false when the run is known not to be limited (its claim said it has no
   * concurrency key): a batch of only such runs is written without the
   * statement's concurrency counts. Unset: it may be, and they are moved.
   */
  limited?: boolean;
  /**
   * false when the run is known to be no run's child (its claim said it has
   * no parent): a batch of only such unlimited runs skips the fan-in
   * (db/fan_in.ts). Unset: it may be one.
   */
  child?: boolean;
}

/**
 * Marks `owner`'s running run `succeeded` with `result` (JSON; undefined is
 * stored as null) and appends `run.succeeded` `{attempt, result}`. False when
 * the lease of attempt `attempt` was lost: nothing was written. The caller
 * bounds the result's size (RUN_RESULT_MAX_BYTES): it is stored and sent in
 * the event as given.
 */
export async function completeRun(
  sql: Sql,
  tenantId: string,
  runId: string,
  owner: string,
  attempt: number,
  result: unknown,
): Promise<boolean> {
  const [done] = await completeRuns(sql, owner, [
    { tenant_id: tenantId, run_id: runId, attempt, result_json: JSON.stringify(result) ?? "null" },
  ]);
  return done;
}

/**
 * `completeRun` for several of `owner`'s runs in one statement, so one
 * commit: a worker finishing many short runs at once pays one WAL flush for
 * them, not one each. Returns, per completion in order, whether it was
 * written (false: that attempt's lease was lost, and nothing of it was
 * written). A run may appear once per batch. Each `result_json` must be
 * JSON text (jsonb can store): one that is not fails the whole statement.
 *
 * Each run is found by a primary-key probe (a lateral subquery with `FOR
 * UPDATE` is never flattened into a join the planner could hash over a scan
 * of `runs`) and updated through `INSERT … ON CONFLICT DO UPDATE`, as in
 * `claimRuns`; the new result rides in the proposed row (`excluded`).
 */
export async function completeRuns(
  sql: Sql,
  owner: string,
  completions: Completion[],
): Promise<boolean[]> {
  if (completions.length === 0) return [];
  // The batch's JSON is put together around each result's text, so no
  // result is parsed or stringified again here.
  const batch = `[${
    completions.map((c, i) => {
      const head = JSON.stringify({
        i,
        tenant_id: c.tenant_id,
        run_id: c.run_id,
        attempt: c.attempt,
      });
      return `${head.slice(0, -1)},"result":${c.result_json}}`;
    }).join(",")
  }]`;
  const rows = await sql<{ i: number }[]>`
    with q as (
      -- The result is taken as it is (jsonb_to_record would turn a JSON null
      -- into SQL NULL).
      select q.i, q.tenant_id, q.run_id, q.attempt, e.x -> 'result' as result
        -- Sent as text: a jsonb parameter is JSON.stringify'd by postgres.js,
        -- which would store the text as one JSON string.
        from jsonb_array_elements(${batch}::text::jsonb) as e(x)
       cross join lateral jsonb_to_record(e.x)
             as q(i integer, tenant_id text, run_id uuid, attempt integer)
    ),
    picked as (
      select (jsonb_populate_record(l.r, jsonb_build_object('result', q.result))).*
        from q
       cross join lateral (
             select r from runs r
              where r.tenant_id = q.tenant_id and r.run_id = q.run_id
                and r.lease_owner = ${owner} and r.attempts = q.attempt
                and r.status = 'running'
              limit 1
                for update) l
    ),
    upd as (
      insert into runs select * from picked
      on conflict (tenant_id, run_id) do update
         set status = 'succeeded',
             result = coalesce(excluded.result, 'null'::jsonb),
             error = null,
             lease_owner = null,
             lease_expires_at = null,
             finished_at = now(),
             updated_at = now(),
             event_seq = runs.event_seq + 1
       where runs.status = 'running'
      returning runs.tenant_id, runs.run_id, runs.goal_id, runs.dispatch_key, runs.event_seq,
                runs.attempts, runs.result, runs.workflow_name, runs.workflow_version,
                runs.concurrency_key, runs.parent_run_id, runs.status
    ),
    ${
    sql.unsafe(
      completions.every((c) => c.limited === false && c.child === false)
        ? NO_SLOTS
        : SUCCEEDED_MOVES,
    )
  },
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.succeeded', goal_id, dispatch_key,
             ${sql.unsafe(SUCCEEDED)}, now()
        from upd
    )
    select q.i from upd join q on q.tenant_id = upd.tenant_id and q.run_id = upd.run_id`;
  const written = completions.map(() => false);
  for (const { i } of rows) written[i] = true;
  return written;
}

/** Why an attempt failed, stored as the run's `error` and in its event (contracts/event_types.ts). */
export type AttemptError = RunError;

/** What `failAttempt` did. */
export interface FailOutcome {
  status: "queued" | "failed" | "cancelled";
  /** When the retry is due (status `queued`). */
  retry_at: Date;
  attempts: number;
}

/**
 * Ends `owner`'s failed attempt: back to `queued`, due in `backoffMs`, with
 * `run.retrying` (its `error`, `worker` and `retry_at`); or, when that was
 * the last attempt or `final` (retrying cannot help, e.g. the input no
 * longer validates), `failed` with `run.failed` `{attempt, error}`; or, when
 * a cancel was requested (whatever made the attempt fail: the aborted
 * handler or its own error), `cancelled` with `run.cancelled` (its `error`
 * and `worker`). The decision is made on the row, under its lock. Undefined
 * when the lease of attempt `attempt` was lost (also when this very call
 * was already applied and is being retried after a lost reply): nothing was
 * written.
 */
export async function failAttempt(
  sql: Sql,
  tenantId: string,
  runId: string,
  owner: string,
  attempt: number,
  error: AttemptError,
  backoffMs: number,
  final = false,
): Promise<FailOutcome | undefined> {
  const [row] = await sql<FailOutcome[]>`
    with upd as (
      update runs
         set status = case when cancel_requested_at is not null then 'cancelled'
                           when ${final}::boolean or attempts >= max_attempts then 'failed'
                           else 'queued' end,
             run_after = case when cancel_requested_at is not null
                                or ${final}::boolean or attempts >= max_attempts then run_after
                              else now() + ${backoffMs}::float8 * interval '1 millisecond' end,
             finished_at = case when cancel_requested_at is not null
                                  or ${final}::boolean or attempts >= max_attempts then now() end,
             error = ${sql.json(toJson(error))}::jsonb,
             lease_owner = null,
             lease_expires_at = null,
             updated_at = now(),
             event_seq = event_seq + 1
       where tenant_id = ${tenantId} and run_id = ${runId}
         and lease_owner = ${owner} and attempts = ${attempt} and status = 'running'
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, status, attempts,
                run_after, error, cancel_requested_at, workflow_name, workflow_version,
                concurrency_key, parent_run_id, ${owner}::text as worker
    ),
    ${sql.unsafe(ENDED_MOVES)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'failed' then 'run.failed' when 'cancelled' then 'run.cancelled'
                         else 'run.retrying' end,
             goal_id, dispatch_key,
             case status
               when 'failed' then ${sql.unsafe(FAILED)}
               when 'cancelled' then ${sql.unsafe(CANCELLED_BY_FAILURE)}
               else ${sql.unsafe(RETRYING_AFTER_FAILURE)}
             end,
             now()
        from upd
    )
    select status, run_after as retry_at, attempts from upd`;
  return row;
}

/**
 * Gives back a run `owner` claimed but will not finish (graceful shutdown):
 * `queued`, due now, with a `run.released` event `{attempt, worker, reason}`.
 * The attempt is given back too (attempts - 1): the run did not fail, its
 * worker went away on purpose, and a deploy must not use up a run's
 * attempts. (A worker that dies without releasing does use one up: see
 * `reclaimExpired`.) A run whose cancel was requested is not given back but
 * ends `cancelled` (`run.cancelled` with the `worker` and `reason`), its
 * attempt kept. Returns the run's new status; undefined when the lease of
 * attempt `attempt` was already lost.
 */
export async function releaseRun(
  sql: Sql,
  tenantId: string,
  runId: string,
  owner: string,
  attempt: number,
  reason: string,
): Promise<"queued" | "cancelled" | undefined> {
  const [row] = await sql<{ status: "queued" | "cancelled" }[]>`
    with upd as (
      update runs
         set status = case when cancel_requested_at is null then 'queued' else 'cancelled' end,
             attempts = case when cancel_requested_at is null then greatest(attempts - 1, 0)
                             else attempts end,
             run_after = case when cancel_requested_at is null then now() else run_after end,
             finished_at = case when cancel_requested_at is null then null else now() end,
             lease_owner = null,
             lease_expires_at = null,
             updated_at = now(),
             event_seq = event_seq + 1
       where tenant_id = ${tenantId} and run_id = ${runId}
         and lease_owner = ${owner} and attempts = ${attempt} and status = 'running'
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, status, cancel_requested_at,
                run_after, workflow_name, workflow_version, concurrency_key, parent_run_id,
                ${attempt}::int as released, ${owner}::text as worker, ${reason}::text as reason
    ),
    ${sql.unsafe(ENDED_MOVES)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'cancelled' then 'run.cancelled' else 'run.released' end,
             goal_id, dispatch_key,
             case status when 'cancelled' then ${sql.unsafe(CANCELLED_BY_RELEASE)}
                         else ${sql.unsafe(RELEASED)} end,
             now()
        from upd
    )
    select status from upd`;
  return row?.status;
}
