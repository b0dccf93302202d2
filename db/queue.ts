/**
 * The run queue, on the `runs` table itself. Workers claim due queued runs
 * with `FOR UPDATE SKIP LOCKED` under a lease, heartbeat it, and finish the
 * run with one guarded statement. Every state change appends its
 * `work_events` row in the same statement (a data-modifying CTE), so the
 * change and its event commit together, and the event's `seq` is the run's
 * new `event_seq`, taken under the row lock the update holds.
 *
 * Every statement a worker makes about its claim (heartbeat, completion,
 * failure, release) is fenced by `lease_owner = owner and attempts = attempt
 * and status = 'running'`: a worker that lost its lease (its run reclaimed,
 * maybe claimed again by another worker or by this same worker id under a
 * newer attempt) changes nothing and is told so. The owner alone is not
 * enough: a worker whose lease expired can re-claim the same run, and a late
 * or replayed write for attempt 1 would then finish attempt 2. The attempt
 * number is the fencing token because every claim increments it; the one
 * exception is `releaseRun`, which gives the attempt back, so the number is
 * reused by the next claim. A released attempt belongs to a worker that is
 * shutting down and claims nothing more, and a restarted process has a new
 * default id, so (owner, attempt) still names one claim in practice.
 *
 * Cancelling (`requestCancel`): a queued run is cancelled by the API's own
 * statement; a running one only gets `cancel_requested_at`, and its end is
 * written by the worker's fenced statements, which read the request on the
 * row: the heartbeat reports it, and a failed, released or reclaimed
 * attempt of such a run ends it `cancelled` instead of queueing it again.
 *
 * Wake-ups: workers `LISTEN` on `QUEUE_CHANNEL`; whoever makes runs due calls
 * `notifyQueued` after its transaction committed, never inside it (a NOTIFY in
 * every admission transaction serializes all commits behind one cluster-wide
 * lock). Runs that become due later (retry backoff) are found by polling.
 */
import type postgres from "postgres";
import type { Sql } from "./pool.ts";
import { runColumns, type RunRow, type RunStatus } from "./runs.ts";

// postgres.js serializes a jsonb parameter itself (JSON.stringify): pass the
// value, never a string of it, or it is stored as a JSON string. Round-trip
// first so undefined fields and toJSON() are handled as JSON would.
function toJson(value: unknown): postgres.JSONValue {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

/** The `LISTEN`/`NOTIFY` channel that says "runs are queued". */
export const QUEUE_CHANNEL = "poimen_runs";

/**
 * The `LISTEN`/`NOTIFY` channel that says "a cancel was requested for the
 * running run `<tenant>/<run_id>`" (the payload). Only a hint to look now:
 * the worker reads the request from the row, in a heartbeat fenced by
 * attempt, never from the payload.
 */
export const CANCEL_CHANNEL = "poimen_cancel";

/** A run a worker just claimed: what it needs to execute it. */
export interface ClaimedRun {
  tenant_id: string;
  run_id: string;
  workflow_ref: string;
  workflow_name: string;
  workflow_version: number;
  input: unknown;
  goal_id: string | null;
  dispatch_key: string | null;
  /** This attempt's number, 1 on the first. */
  attempts: number;
  max_attempts: number;
  lease_expires_at: Date;
}

// The event insert shared by every transition: `from` is a CTE returning the
// updated run's tenant_id, run_id, goal_id, dispatch_key and new event_seq.
// Kept as text so each statement stays one round trip with one plan.
const EVENT_COLUMNS = "tenant_id, run_id, seq, type, goal_id, dispatch_key, payload, at";
const RUN_COLUMNS = runColumns();

// The tenants with queued runs, in collation "C" order: a loose index scan
// of runs_queued_tenant_idx, one probe per tenant however long its queue,
// ending with a null row. Collation "C" is the index's: no other index can
// serve the probes (see migrations/003).
const QUEUED_TENANTS = `queued_tenants (tenant_id) as (
      (select tenant_id collate "C" from runs
        where status = 'queued'
        order by tenant_id collate "C" limit 1)
      union all
      select (select r.tenant_id collate "C" from runs r
               where r.status = 'queued' and r.tenant_id collate "C" > t.tenant_id
               order by r.tenant_id collate "C" limit 1)
        from queued_tenants t
       where t.tenant_id is not null
    ),
    -- Each such tenant's oldest due run: its place in line.
    heads as (
      select t.tenant_id, h.run_after
        from queued_tenants t
       cross join lateral (
             select r.run_after from runs r
              where r.tenant_id collate "C" = t.tenant_id and r.status = 'queued'
                and r.run_after <= now()
              order by r.run_after limit 1) h
    )`;

/**
 * Claims up to `limit` due queued runs for `owner`, fairly across tenants:
 * each becomes `running` with a lease of `leaseMs`, its attempt counted, and
 * a `run.started` event `{attempt, worker}` appended.
 *
 * Fair: the tenants with due runs take turns, not the oldest runs of all
 * (one tenant's backlog of 100,000 would make every other tenant wait until
 * it drained). Each of the `limit` slots goes to the tenant it leaves with
 * the fewest runs in flight (ties: the tenant whose oldest due run waited
 * longest): a tenant with nothing running comes first, a tenant with a
 * backlog gets what the others leave, and with more tenants than slots the
 * ones just served wait for the others, round-robin. Each tenant then takes
 * its share oldest first, skipping rows other workers hold (`FOR UPDATE SKIP
 * LOCKED`); a tenant with fewer due runs than its share leaves those slots
 * empty until the next claim. One tenant alone gets every slot. The cost is
 * one index probe per tenant with queued runs, one per run in flight and
 * one per claimed run.
 *
 * The claimed rows are updated through `INSERT … ON CONFLICT (tenant_id,
 * run_id) DO UPDATE`, which always conflicts (each row exists and is locked
 * by this statement): the executor finds each row by probing the primary
 * key. An `UPDATE … FROM` the claimed rows is a join the planner may hash
 * over a sequential scan of `runs` when the table looks small, and a
 * prepared statement keeps that plan as the table grows.
 */
export async function claimRuns(
  sql: Sql,
  owner: string,
  limit: number,
  leaseMs: number,
): Promise<ClaimedRun[]> {
  return await sql<ClaimedRun[]>`
    with recursive ${sql.unsafe(QUEUED_TENANTS)},
    -- Runs in flight per tenant: the running partial index, as long as the
    -- fleet's concurrency plus the entries of runs that left it since the
    -- last vacuum (a bitmap scan reads those again every time). Materialized,
    -- so it is read at most once, and only when it is needed: when more than
    -- one tenant has due runs (one tenant alone gets every slot).
    in_flight as materialized (
      select tenant_id collate "C" as tenant_id, count(*) as running
        from runs
       where status = 'running' and lease_expires_at is not null
       group by 1
    ),
    -- First in line: the tenants with the fewest runs in flight, then the
    -- longest waiting. No more of them than there are slots.
    served as (
      select h.tenant_id, h.run_after,
             case when (select count(*) from heads) > 1
                  then coalesce((select f.running from in_flight f
                                  where f.tenant_id = h.tenant_id), 0)
                  else 0 end as running
        from heads h
       order by 3, 2, 1
       limit ${limit}
    ),
    -- Each slot goes to the tenant it leaves with the fewest runs in flight.
    shares as (
      select tenant_id, count(*) as share
        from (select s.tenant_id from served s
               cross join generate_series(1, ${limit}::int) k
               order by s.running + k, s.run_after, s.tenant_id
               limit ${limit}) slot
       group by tenant_id
    ),
    picked as (
      select c.*
        from shares s
       cross join lateral (
             select r.* from runs r
              where r.tenant_id collate "C" = s.tenant_id and r.status = 'queued'
                and r.run_after <= now()
              order by r.run_after
              limit s.share
              for update skip locked) c
    ),
    claimed as (
      insert into runs select * from picked
      on conflict (tenant_id, run_id) do update
         set status = 'running',
             attempts = runs.attempts + 1,
             lease_owner = ${owner},
             lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond',
             started_at = coalesce(runs.started_at, now()),
             updated_at = now(),
             event_seq = runs.event_seq + 1
       where runs.status = 'queued'
      returning runs.tenant_id, runs.run_id, runs.workflow_ref, runs.workflow_name,
                runs.workflow_version, runs.input, runs.goal_id, runs.dispatch_key,
                runs.attempts, runs.max_attempts, runs.lease_expires_at, runs.event_seq
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.started', goal_id, dispatch_key,
             jsonb_build_object('attempt', attempts, 'worker', ${owner}::text), now()
        from claimed
    )
    select tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input, goal_id,
           dispatch_key, attempts, max_attempts, lease_expires_at
      from claimed`;
}

/** A run whose expired lease `reclaimExpired` took back. */
export interface ReclaimedRun {
  tenant_id: string;
  run_id: string;
  /**
   * `queued` (retried), `failed` (that was its last attempt) or `cancelled`
   * (a cancel was requested while it ran).
   */
  status: RunStatus;
  attempts: number;
  /** The worker that held the lease. */
  previous_owner: string | null;
}

/**
 * Takes back up to `limit` runs whose lease expired (their worker died or
 * hung): back to `queued`, due now, with a `run.retrying` event `{attempt,
 * reason: 'lease expired', worker}`; or `failed` with a `run.failed` event
 * when the expired attempt was the last one; or `cancelled` with a
 * `run.cancelled` event when a cancel was requested meanwhile. The attempt
 * counts: a run that kills its worker every time must not be retried forever.
 */
export async function reclaimExpired(sql: Sql, limit: number): Promise<ReclaimedRun[]> {
  // Updated through an always-conflicting upsert, as in `claimRuns`: each
  // row is found by the primary key's probe, never by a planned join.
  return await sql<ReclaimedRun[]>`
    with expired as (
      select * from runs
       where status = 'running' and lease_expires_at < now()
       order by lease_expires_at
       limit ${limit}
       for update skip locked
    ),
    upd as (
      insert into runs select * from expired
      on conflict (tenant_id, run_id) do update
         set status = case when runs.cancel_requested_at is not null then 'cancelled'
                           when runs.attempts >= runs.max_attempts then 'failed'
                           else 'queued' end,
             run_after = case when runs.cancel_requested_at is null
                                   and runs.attempts < runs.max_attempts
                              then now() else runs.run_after end,
             error = case when runs.cancel_requested_at is null
                               and runs.attempts >= runs.max_attempts
                          then jsonb_build_object('message', 'lease expired', 'code', 'lease-expired',
                                                  'attempt', runs.attempts,
                                                  'worker', runs.lease_owner)
                          else runs.error end,
             finished_at = case when runs.cancel_requested_at is not null
                                  or runs.attempts >= runs.max_attempts then now() end,
             lease_owner = null,
             lease_expires_at = null,
             updated_at = now(),
             event_seq = runs.event_seq + 1
       where runs.status = 'running'
      returning runs.tenant_id, runs.run_id, runs.goal_id, runs.dispatch_key, runs.status,
                runs.attempts, runs.error, runs.event_seq, runs.cancel_requested_at
    ),
    -- Two CTEs joined: no table is read, whatever the plan.
    reclaimed as (
      select u.*, e.lease_owner as previous_owner
        from upd u join expired e on e.tenant_id = u.tenant_id and e.run_id = u.run_id
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'failed' then 'run.failed' when 'cancelled' then 'run.cancelled'
                         else 'run.retrying' end,
             goal_id, dispatch_key,
             case status
               when 'failed' then jsonb_build_object('attempt', attempts, 'error', error)
               when 'cancelled' then jsonb_build_object('attempt', attempts,
                                       'reason', 'lease expired', 'worker', previous_owner,
                                       'requested_at', cancel_requested_at)
               else jsonb_build_object('attempt', attempts, 'reason', 'lease expired',
                                       'worker', previous_owner, 'retry_at', now())
             end,
             now()
        from reclaimed
    )
    select tenant_id, run_id, status, attempts, previous_owner from reclaimed`;
}

/**
 * What a heartbeat learned: the lease is extended (`held`), extended but a
 * cancel was requested (`cancel-requested`: abort the handler, keep beating
 * until it returned), or gone (`lost`: stop working on the run).
 */
export type HeartbeatResult = "held" | "cancel-requested" | "lost";

/**
 * Extends `owner`'s lease on attempt `attempt` of a running run to now +
 * `leaseMs`. `lost` when the lease is lost (reclaimed, finished, owned by
 * another worker or by a newer attempt): the caller must stop working on the
 * run. Not a state change, so no event.
 *
 * `signal` bounds the wait: when it aborts, the statement is cancelled (also
 * on the server, where it may be waiting for a row lock) and the promise
 * rejects with the signal's reason. A heartbeat that timed out may or may
 * not have been written; the caller treats its lease as unconfirmed.
 */
export async function heartbeat(
  sql: Sql,
  tenantId: string,
  runId: string,
  owner: string,
  attempt: number,
  leaseMs: number,
  signal?: AbortSignal,
): Promise<HeartbeatResult> {
  const query = sql<{ cancel_requested: boolean }[]>`
    update runs
       set lease_expires_at = now() + ${leaseMs}::float8 * interval '1 millisecond'
     where tenant_id = ${tenantId} and run_id = ${runId}
       and lease_owner = ${owner} and attempts = ${attempt} and status = 'running'
    returning cancel_requested_at is not null as cancel_requested`;
  const rows = await cancelledOnAbort(query, signal);
  if (rows.length === 0) return "lost";
  return rows[0].cancel_requested ? "cancel-requested" : "held";
}

/**
 * Settles like `query`, or rejects with `signal`'s reason as soon as it
 * aborts, after asking postgres.js to cancel the query (dropped from the
 * queue if not sent yet, a cancel request to the server if running).
 */
function cancelledOnAbort<T>(
  query: Promise<T> & { cancel(): unknown },
  signal: AbortSignal | undefined,
): Promise<T> {
  if (!signal) return query;
  // A postgres.js query is sent on its first then(): one never awaited never runs.
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      // The cancel's own outcome does not matter: the caller has given up.
      Promise.resolve(query.cancel()).catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    query.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

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
                runs.attempts, runs.result
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.succeeded', goal_id, dispatch_key,
             jsonb_build_object('attempt', attempts, 'result', result), now()
        from upd
    )
    select q.i from upd join q on q.tenant_id = upd.tenant_id and q.run_id = upd.run_id`;
  const written = completions.map(() => false);
  for (const { i } of rows) written[i] = true;
  return written;
}

/** Why an attempt failed, stored as the run's `error` and in its event. */
export interface AttemptError {
  message: string;
  /** A stable code for failures poimen itself decides (e.g. `unknown-workflow`). */
  code?: string;
  [key: string]: unknown;
}

/** What `failAttempt` did. */
export interface FailOutcome {
  status: "queued" | "failed" | "cancelled";
  /** When the retry is due (status `queued`). */
  retry_at: Date;
  attempts: number;
}

/**
 * Ends `owner`'s failed attempt: back to `queued`, due in `backoffMs`, with
 * `run.retrying` `{attempt, error, retry_at}`; or, when that was the last
 * attempt or `final` (retrying cannot help, e.g. the input no longer
 * validates), `failed` with `run.failed` `{attempt, error}`; or, when a
 * cancel was requested (whatever made the attempt fail: the aborted handler
 * or its own error), `cancelled` with `run.cancelled` `{attempt, error,
 * requested_at}`. The decision is made on the row, under its lock. Undefined when the lease of attempt
 * `attempt` was lost (also when this very call was already applied and is
 * being retried after a lost reply): nothing was written.
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
                run_after, error, cancel_requested_at
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'failed' then 'run.failed' when 'cancelled' then 'run.cancelled'
                         else 'run.retrying' end,
             goal_id, dispatch_key,
             case status
               when 'failed' then jsonb_build_object('attempt', attempts, 'error', error)
               when 'cancelled' then jsonb_build_object('attempt', attempts, 'error', error,
                                                        'requested_at', cancel_requested_at)
               else jsonb_build_object('attempt', attempts, 'error', error, 'retry_at', run_after)
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
 * ends `cancelled` (`run.cancelled` `{attempt, worker, reason,
 * requested_at}`), its attempt kept. Returns the run's new status;
 * undefined when the lease of attempt `attempt` was already lost.
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
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, status, cancel_requested_at
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq,
             case status when 'cancelled' then 'run.cancelled' else 'run.released' end,
             goal_id, dispatch_key,
             jsonb_build_object('attempt', ${attempt}::int, 'worker', ${owner}::text,
                                'reason', ${reason}::text)
               || case when status = 'cancelled'
                       then jsonb_build_object('requested_at', cancel_requested_at)
                       else '{}'::jsonb end,
             now()
        from upd
    )
    select status from upd`;
  return row?.status;
}

/**
 * Cancels a run of one tenant, or asks for it to be cancelled: a queued run
 * (waiting for its first attempt, or for a retry) becomes `cancelled` at
 * once with a `run.cancelled` event `{attempt, requested_at}`; a running run
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
         set status = case when status = 'queued' then 'cancelled' else status end,
             cancel_requested_at = coalesce(cancel_requested_at, now()),
             finished_at = case when status = 'queued' then now() else finished_at end,
             updated_at = now(),
             event_seq = case when status = 'queued' then event_seq + 1 else event_seq end
       where tenant_id = ${tenantId} and run_id = ${runId}
         and (status = 'queued' or (status = 'running' and cancel_requested_at is null))
      returning ${sql.unsafe(RUN_COLUMNS)}, input, event_seq
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select tenant_id, run_id, event_seq, 'run.cancelled', goal_id, dispatch_key,
             jsonb_build_object('attempt', attempts, 'requested_at', cancel_requested_at), now()
        from upd
       where status = 'cancelled'
    )
    select ${sql.unsafe(RUN_COLUMNS)}, input from upd`;
  return row;
}

/**
 * `NOTIFY poimen_cancel '<tenant>/<run_id>'`: tells the worker running that
 * run to look at it now rather than at its next heartbeat. Sent after the
 * request committed; losing it only delays the cancel by a heartbeat.
 */
export async function notifyCancel(sql: Sql, tenantId: string, runId: string): Promise<void> {
  await sql`select pg_notify(${CANCEL_CHANNEL}, ${`${tenantId}/${runId}`})`;
}

/**
 * `NOTIFY poimen_runs`: wakes listening workers. Call it after the
 * transaction that queued runs committed, not inside it, and coalesce calls
 * (see `Waker` in core/waker.ts).
 */
export async function notifyQueued(sql: Sql): Promise<void> {
  await sql`select pg_notify(${QUEUE_CHANNEL}, '')`;
}

/** The queue at a glance, for metrics. */
export interface QueueStats {
  /** Runs waiting and runs being executed (all tenants). */
  byStatus: { queued: number; running: number };
  /** Seconds since the oldest due queued run became due; 0 when none is due. */
  oldestQueuedAgeSeconds: number;
}

/**
 * Counts queued and running runs and measures the age of the oldest due
 * queued run. Each reads a partial index, so the cost follows the live
 * queue, not the table: finished runs pile up by the million and are counted
 * by the workers' completion counters instead. A run is running exactly
 * while it holds a lease (a check constraint says so); the oldest due run is
 * the oldest of the tenants' heads, one probe per tenant with queued runs.
 */
export async function queueStats(sql: Sql): Promise<QueueStats> {
  const [r] = await sql<{ queued: number; running: number; oldest: number | null }[]>`
    with recursive ${sql.unsafe(QUEUED_TENANTS)}
    select (select count(*) from runs where status = 'queued')::int as queued,
           (select count(*) from runs
             where status = 'running' and lease_expires_at is not null)::int as running,
           (select extract(epoch from now() - min(run_after)) from heads)::float8 as oldest`;
  return {
    byStatus: { queued: r.queued, running: r.running },
    oldestQueuedAgeSeconds: Math.max(0, r.oldest ?? 0),
  };
}
