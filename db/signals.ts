/**
 * Signals (migration 021, `run_signals`): a run's mailbox. The API stores
 * each signal sent to a run (`sendSignal`), once per (name, signal_id), and
 * wakes the run when it waits for that name; a wait of the run's handler
 * (`ctx.waitForSignal`, worker/durable_context.ts) consumes the first
 * unconsumed signal of its name (`settleSignalWait`), however long before
 * the wait it arrived.
 *
 * No wake-up is lost: the signal's transaction takes the run's row lock
 * before anything else, and so does a suspend (db/suspension.ts), which then
 * checks, in a statement of its own (a snapshot taken under the lock), for
 * an unconsumed signal of the name it would wait for. Either the signal's
 * transaction committed first, and the suspend sees the signal and does not
 * suspend, or the suspend committed first, and the signal's transaction sees
 * a run waiting for it and wakes it (tests/db_durable_test.ts races them).
 */
import { inTransaction, type Sql } from "./pool.ts";
import type { RunStatus } from "./runs.ts";
import { EVENT_COLUMNS, laneMoves, QUEUED_AT, slotCountMoves } from "./queue_sql.ts";
import type { StepFence } from "./run_steps.ts";
import {
  NULL_INT,
  signalReceivedPayload,
  stepCompletedPayload,
  wokenPayload,
} from "./event_payloads.ts";

// The events, from the columns of the statements' CTEs: `a` the signal's
// (or the wait's) own values, `u` the run (`upd`), `r` the wait's outcome
// and result, `d` its deadline.
const RECEIVED = signalReceivedPayload({ name: "a.name", signal_id: "a.signal_id" });
const WOKEN_BY_SIGNAL = wokenPayload({
  by: "'signal'::text",
  reason: "'signal'::text",
  name: "a.name",
  signal_id: "a.signal_id",
});
const WAIT_COMPLETED = stepCompletedPayload({
  name: "a.name",
  seq: "a.seq",
  kind: "'signal'::text",
  size: "octet_length(r.result::text)",
  attempt: "u.attempts",
  duration_ms: NULL_INT,
  until: "d.until",
  // null on a timeout: its result is JSON null.
  signal_id: "r.result ->> 'signal_id'",
  timed_out: "r.outcome = 'timeout'",
});

// A run not woken moves no lane and no concurrency count.
const NOT_WOKEN = "not_woken as (select 1)";
// A woken run is queued: it lowers its lane, or joins its group's queue.
const WOKEN_LANES = laneMoves("upd", QUEUED_AT);
const WOKEN_SLOTS = slotCountMoves(
  "upd",
  "0",
  "case when status = 'queued' then 1 else 0 end",
  QUEUED_AT,
);

/** A signal as stored. */
export interface SignalRow {
  name: string;
  signal_id: string;
  received_at: Date;
  /** The wait (its step name) that consumed it; null while unconsumed. */
  consumed_as: string | null;
}

/** What `sendSignal` did. */
export type SignalOutcome =
  /** No such run for this tenant. */
  | { outcome: "no-run" }
  /** The run is final and the signal was not stored before: nothing written. */
  | { outcome: "final"; status: RunStatus }
  /**
   * `created`: stored now (and the run woken when it waited for it);
   * `replayed`: this (name, signal_id) was stored before, nothing written.
   */
  | {
    outcome: "created" | "replayed";
    signal: SignalRow;
    /** The run was waiting for this signal and is queued now. */
    woken: boolean;
    /** The run's status after this call. */
    status: RunStatus;
  };

const FINAL: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled"]);

/**
 * Stores signal `name` (`signalId`, `payload`) for a run of `tenantId`,
 * appending `signal.received` `{name, signal_id}`; when the run waits for a
 * signal of that name, it is made `queued` in the same transaction, with
 * `run.woken` `{by: 'signal', reason, name, signal_id}`, its lane or
 * concurrency group moved as any statement that queues a run moves them.
 * A (name, signal_id) already stored is a replay (whatever the run's status
 * now); a new signal for a final run is refused (`final`). `check`, given
 * the run's workflow version under the lock, throws to refuse the signal
 * (its payload against the version's schema) before anything is written. Two statements in
 * one transaction, the first taking the run's row lock (see the module
 * comment).
 */
export async function sendSignal(
  sql: Sql,
  tenantId: string,
  runId: string,
  signal: { name: string; signal_id: string; payload: unknown },
  check?: (run: { workflow_name: string; workflow_version: number }) => void,
): Promise<SignalOutcome> {
  return await inTransaction(sql, async (t) => {
    const run = await lockRunForSignal(t, tenantId, runId);
    if (!run) return { outcome: "no-run" } as const;
    // The payload against the run's version (it throws to refuse: nothing is written).
    check?.(run);
    const wake = run.status === "waiting" && run.wait_reason === "signal" &&
      run.wait_name === signal.name;
    return await storeSignal(t, tenantId, runId, signal, {
      open: !FINAL.has(run.status),
      wake,
      status: run.status,
    });
  });
}

/**
 * The run's status and what it waits for, its row locked until the
 * transaction ends (`FOR NO KEY UPDATE`, as any update of it takes).
 */
async function lockRunForSignal(sql: Sql, tenantId: string, runId: string) {
  const [row] = await sql<
    {
      status: RunStatus;
      wait_reason: string | null;
      wait_name: string | null;
      workflow_name: string;
      workflow_version: number;
    }[]
  >`
    select status, wait_reason, wait_name, workflow_name, workflow_version from runs
     where tenant_id = ${tenantId} and run_id = ${runId}
       for no key update`;
  return row;
}

/**
 * Inserts the signal unless stored already (and only while the run is
 * `open`), moves the run's event seq (and wakes it when `wake`) when it was
 * new; `wake` and `open` were read under the row lock the transaction holds.
 */
async function storeSignal(
  sql: Sql,
  tenantId: string,
  runId: string,
  signal: { name: string; signal_id: string; payload: unknown },
  run: { open: boolean; wake: boolean; status: RunStatus },
): Promise<SignalOutcome> {
  // As text: a jsonb parameter of JSON null would be SQL NULL.
  const payload = JSON.stringify(signal.payload ?? null);
  const [row] = await sql<
    {
      created: boolean;
      received_at: Date | null;
      consumed_as: string | null;
      woken: boolean;
      status: RunStatus | null;
    }[]
  >`
    with a as (select ${signal.name}::text as name, ${signal.signal_id}::text as signal_id),
    ins as (
      insert into run_signals (tenant_id, run_id, name, signal_id, payload)
      select ${tenantId}, ${runId}, ${signal.name}, ${signal.signal_id}, ${payload}::text::jsonb
       where ${run.open}::boolean
      on conflict (tenant_id, run_id, name, signal_id) do nothing
      returning received_at
    ),
    upd as (
      update runs
         set event_seq = event_seq + case when ${run.wake}::boolean then 2 else 1 end,
             status = case when ${run.wake}::boolean then 'queued' else status end,
             run_after = case when ${run.wake}::boolean then now() else run_after end,
             wait_reason = case when ${run.wake}::boolean then null else wait_reason end,
             wait_name = case when ${run.wake}::boolean then null else wait_name end,
             updated_at = now()
       where tenant_id = ${tenantId} and run_id = ${runId} and exists (select 1 from ins)
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, status, run_after,
                workflow_name, workflow_version, concurrency_key
    ),
    ${sql.unsafe(run.wake ? `${WOKEN_LANES},\n${WOKEN_SLOTS}` : NOT_WOKEN)},
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id,
             u.event_seq - case when ${run.wake}::boolean then 1 else 0 end,
             'signal.received', u.goal_id, u.dispatch_key, ${sql.unsafe(RECEIVED)}, now()
        from upd u cross join a
      union all
      select u.tenant_id, u.run_id, u.event_seq, 'run.woken', u.goal_id, u.dispatch_key,
             ${sql.unsafe(WOKEN_BY_SIGNAL)}, now()
        from upd u cross join a
       where ${run.wake}::boolean
    )
    select exists (select 1 from ins) as created,
           coalesce((select received_at from ins), p.received_at) as received_at,
           p.consumed_as, exists (select 1 from upd) and ${run.wake}::boolean as woken,
           (select status from upd) as status
      from (select 1) one
      left join run_signals p
        on p.tenant_id = ${tenantId} and p.run_id = ${runId} and p.name = ${signal.name}
       and p.signal_id = ${signal.signal_id}`;
  if (!row.created && row.received_at === null) return { outcome: "final", status: run.status };
  return {
    outcome: row.created ? "created" : "replayed",
    signal: {
      name: signal.name,
      signal_id: signal.signal_id,
      received_at: row.received_at!,
      consumed_as: row.consumed_as,
    },
    woken: row.woken,
    status: row.status ?? run.status,
  };
}

/** Where a signal wait stands after `settleSignalWait`. */
export type SignalWaitState =
  | {
    outcome: "signal";
    /** The signal consumed (now, or by this wait before). */
    signal: { name: string; signal_id: string; payload: unknown; received_at: string };
  }
  | { outcome: "timeout" }
  | {
    outcome: "waiting";
    /** Its timeout, computed once (the first call), by Postgres' clock; null: none. */
    until: Date | null;
    /** Postgres' clock now. */
    now: Date;
  }
  /** The attempt no longer holds the lease: nothing was written. */
  | { outcome: "lost" };

/**
 * A signal wait's row (step `name`, kind `signal`): made on its first call
 * with its timeout's deadline (now + `timeoutMs`, computed once; none when
 * null); then, in the same fenced statement, the first unconsumed signal
 * `signalName` of the run is consumed (`consumed_as` the wait's name, the
 * signal stored as the step's result), or, when the deadline has passed, the
 * wait times out (result null); either appends `step.completed` (`kind`
 * `signal`, its `until`, `signal_id` or `timed_out`). Else it stays
 * `waiting`.
 */
export async function settleSignalWait(
  sql: Sql,
  f: StepFence,
  step: { name: string; seq: number; signalName: string; timeoutMs: number | null },
): Promise<SignalWaitState> {
  const [row] = await sql<
    {
      outcome: "signal" | "timeout" | "waiting";
      until: Date | null;
      now: Date;
      held: boolean;
      result: unknown;
    }[]
  >`
    with a as (select ${step.name}::text as name, ${step.seq}::int as seq),
    cur as (
      select s.until from run_steps s
       where s.tenant_id = ${f.tenant_id} and s.run_id = ${f.run_id} and s.name = ${step.name}
    ),
    d as (
      select case when exists (select 1 from cur) then (select until from cur)
                  else now() + ${step.timeoutMs}::float8 * interval '1 millisecond' end as until
    ),
    -- The first unconsumed signal of the name: one probe of
    -- run_signals_unconsumed_idx (the tenant in collation "C", migration 021).
    sig as (
      select s.signal_id, s.payload, s.received_at from run_signals s
       where s.tenant_id collate "C" = ${f.tenant_id} and s.run_id = ${f.run_id}
         and s.name = ${step.signalName} and s.consumed_as is null
       order by s.n
       limit 1
         for update
    ),
    o as (
      select case when exists (select 1 from sig) then 'signal'
                  when (select until from d) <= now() then 'timeout'
                  else 'waiting' end as outcome
    ),
    upd as (
      update runs
         set event_seq = event_seq + case when (select outcome from o) = 'waiting' then 0 else 1 end,
             updated_at = now()
       where tenant_id = ${f.tenant_id} and run_id = ${f.run_id}
         and lease_owner = ${f.owner} and attempts = ${f.attempt} and status = 'running'
      returning tenant_id, run_id, goal_id, dispatch_key, event_seq, attempts
    ),
    used as (
      update run_signals set consumed_as = ${step.name}, consumed_at = now()
       where tenant_id = ${f.tenant_id} and run_id = ${f.run_id} and name = ${step.signalName}
         and signal_id = (select signal_id from sig) and exists (select 1 from upd)
    ),
    res as (
      select case o.outcome
               when 'signal' then jsonb_build_object(
                 'name', ${step.signalName}::text, 'signal_id', g.signal_id,
                 'payload', g.payload, 'received_at', g.received_at)
               when 'timeout' then 'null'::jsonb
             end as result,
             o.outcome
        from o left join sig g on true
    ),
    st as (
      insert into run_steps (tenant_id, run_id, name, seq, kind, status, result, size, until,
                             signal_name, attempt, completed_at)
      select u.tenant_id, u.run_id, ${step.name}, ${step.seq}, 'signal',
             case when r.outcome = 'waiting' then 'waiting' else 'completed' end, r.result,
             octet_length(r.result::text), d.until, ${step.signalName}, u.attempts,
             case when r.outcome <> 'waiting' then now() end
        from upd u cross join d cross join res r
      on conflict (tenant_id, run_id, name) do update
         set status = excluded.status, result = excluded.result, size = excluded.size,
             attempt = excluded.attempt, updated_at = now(), completed_at = excluded.completed_at
       where run_steps.status <> 'completed'
    ),
    ev as (
      insert into work_events (${sql.unsafe(EVENT_COLUMNS)})
      select u.tenant_id, u.run_id, u.event_seq, 'step.completed', u.goal_id, u.dispatch_key,
             ${sql.unsafe(WAIT_COMPLETED)}, now()
        from upd u cross join res r cross join d cross join a
       where r.outcome <> 'waiting'
    )
    select r.outcome, d.until, now() as now, exists (select 1 from upd) as held, r.result
      from res r cross join d`;
  if (!row.held) return { outcome: "lost" };
  if (row.outcome === "signal") {
    return {
      outcome: "signal",
      signal: row.result as {
        name: string;
        signal_id: string;
        payload: unknown;
        received_at: string;
      },
    };
  }
  if (row.outcome === "timeout") return { outcome: "timeout" };
  return { outcome: "waiting", until: row.until, now: row.now };
}

/**
 * Whether the run holds an unconsumed signal `name`: what a short wait in
 * the worker looks for between its settles (one probe of
 * run_signals_unconsumed_idx, nothing written).
 */
export async function signalPending(
  sql: Sql,
  tenantId: string,
  runId: string,
  name: string,
): Promise<boolean> {
  const [row] = await sql<{ pending: boolean }[]>`
    select exists (
      select 1 from run_signals s
       where s.tenant_id collate "C" = ${tenantId} and s.run_id = ${runId} and s.name = ${name}
         and s.consumed_as is null) as pending`;
  return row.pending;
}
