/**
 * What the plan tests share (tests/db_plans_test.ts: every hot statement keeps
 * its index; tests/db_tenant_scope_test.ts: every statement on runs and
 * work_events names its tenant): the statements as the code issues them,
 * captured through the pool's debug hook, explained as prepared, on bulk
 * rows in the shape production has.
 */
import { runUnfinished } from "../../db/schedules.ts";
import { BUILTIN_HOSTED } from "./catalog.ts";
import postgres from "postgres";
import type { Sql } from "../../db/pool.ts";
import { laneQueuedRuns } from "./db.ts";
import { insertRuns, type NewRun, selectRunsByDispatchKey } from "../../db/admission.ts";
import { admitDebounced } from "../../db/debounce.ts";
import { completeRun, completeRuns, failAttempt, releaseRun } from "../../db/attempt_end.ts";
import { requestCancel } from "../../db/cancellation.ts";
import { claimLimitedRuns, claimRuns } from "../../db/claims.ts";
import { heartbeat, reclaimExpired, renewLeases } from "../../db/leases.ts";
import { queueCounts } from "../../db/queue_stats.ts";
import { selectUnhostedQueues } from "../../db/catalog.ts";
import {
  claimPendingEvents,
  markPublished,
  OUTBOX_SHARDS,
  outboxStats,
  parkEvents,
  purgePublished,
} from "../../db/outbox.ts";
import {
  COUNT_CAP,
  selectAdmissionsPerMinute,
  selectTenantQueue,
  selectTenantWaitingVersions,
} from "../../db/queue_overview.ts";
import { selectRun, selectRunEvents, selectRuns } from "../../db/runs.ts";
import { selectRootRunId } from "../../db/lineage.ts";
import { cancelRuns, selectRunStatus } from "../../db/cascade.ts";
import { lockParents, noteChildrenStarted } from "../../db/child_events.ts";
import { insertChildRuns } from "../../db/child_admission.ts";
import { correctSlot } from "../../db/slot_reconcile.ts";
import { repairLanes } from "../../db/lane_repair.ts";
import { countQueuedRuns } from "../../db/tenant_quotas.ts";
import {
  selectLimitedWorkflowStats,
  selectTenantWaitingGroups,
  selectTenantWaitingTotals,
} from "../../db/concurrency_overview.ts";
import { uuidv7Floor } from "../../core/uuid.ts";
import { purgeFinishedRuns } from "../../db/retention.ts";
import {
  completeStep,
  failStep,
  loadSteps,
  selectStepSummaries,
  settleSleep,
} from "../../db/run_steps.ts";
import { sendSignal, settleSignalWait, signalPending } from "../../db/signals.ts";
import { suspendRun, wakeDueRuns } from "../../db/suspension.ts";
import {
  awaitChildren,
  cancelChildren,
  childGroupState,
  selectChild,
  selectChildOutcomes,
} from "../../db/fan_in.ts";

export const TENANTS = 20;
/** The bulk data's limited workflow (one run in ten), as a worker hosting it claims. */
export const LIMITED_HOSTED = { names: ["keyed"], versions: [1] };

export interface Captured {
  text: string;
  parameters: unknown[];
  types: number[];
}

/** The tables whose scans are checked: a statement not naming one must not read it. */
export const RELATIONS = [
  "runs",
  "work_events",
  "concurrency_slots",
  "queue_lanes",
  "run_steps",
  "run_signals",
] as const;
export type Relation = typeof RELATIONS[number];

/** A statement and where its scans of the tables in `RELATIONS` must go. */
export interface HotStatement {
  name: string;
  /** Issues the statement through `sql` (inside a transaction that is rolled back). */
  call: (sql: Sql) => Promise<unknown>;
  /**
   * Per relation: every scan of it must use one of these indexes, and each is
   * used (by one of the call's statements, when it makes several).
   */
  indexes: Partial<Record<Relation, string[]>>;
  /**
   * The plans it is executed with; both unless said. A statement sent
   * unprepared (`prepare: false`) is planned afresh each call: custom only.
   */
  modes?: PlanMode[];
  /** Checked from this many runs up (a sequential scan of a few pages is right). */
  fromRuns?: number;
}

/** Ids of rows the statements are called with, so custom plans see real values. */
export interface Sample {
  tenant: string;
  runningRun: string;
  owner: string;
  attempt: number;
  pendingEventId: string;
}

export function hotStatements(s: Sample): HotStatement[] {
  const newRun = (i: number, dispatchKey: string | null): NewRun => ({
    tenant_id: s.tenant,
    run_id: crypto.randomUUID(),
    workflow_ref: "echo",
    workflow_name: "echo",
    workflow_version: 1,
    input: { i },
    goal_id: null,
    dispatch_key: dispatchKey,
    source: "plan-test",
    max_attempts: 3,
    // Every other new run scheduled an hour ahead: the bind must not change the plan.
    run_after: i % 2 ? new Date(Date.now() + 3600_000).toISOString() : null,
  });
  // New keys, keys the bulk data already holds (replays) and keyless runs.
  const batch = [
    ...Array.from({ length: 8 }, (_, i) => newRun(i, `fresh-${crypto.randomUUID()}`)),
    ...Array.from({ length: 4 }, (_, i) => newRun(i, `key-${i * TENANTS}`)),
    ...Array.from({ length: 4 }, (_, i) => newRun(i, null)),
  ];
  const limitedBatch = batch.map((r, i) => ({
    ...r,
    workflow_ref: "keyed",
    workflow_name: "keyed",
    concurrency_key: `k${i % 5}`,
    concurrency_limit: 1,
  }));
  const lease = 30_000;
  const fence = { tenant_id: s.tenant, run_id: s.runningRun, owner: s.owner, attempt: s.attempt };
  const durable = { runs: ["runs_pkey"], run_steps: ["run_steps_pkey"] };
  return [
    {
      name: "admission: insertRuns",
      call: (sql) => insertRuns(sql, batch),
      indexes: { runs: ["runs_dispatch_key_uq"] },
    },
    {
      // A new burst (its debounce key free), a request joining it (the
      // conflict's update, its key recorded), then a replay (its dispatch
      // key held): the holder probes, and the insert whose arbiter is
      // runs_debounce_pending_uq (a conflict probe, not a scan).
      name: "admission: admitDebounced",
      call: async (sql) => {
        const burst = `c-${crypto.randomUUID()}`;
        const debounced = (r: NewRun) => ({
          ...r,
          run_after: null,
          debounce_key: burst,
          period_ms: 60_000,
          max_wait_ms: 600_000,
        });
        await admitDebounced(sql, debounced(batch[0]));
        await admitDebounced(sql, debounced(batch[1]));
        await admitDebounced(sql, { ...debounced(batch[9]), debounce_key: "other" });
      },
      // The runs a request joined are read by their primary key.
      indexes: { runs: ["runs_dispatch_key_uq", "runs_pkey"] },
    },
    {
      name: "admission: selectRunsByDispatchKey",
      call: (sql) => selectRunsByDispatchKey(sql, batch.filter((r) => r.dispatch_key)),
      indexes: { runs: ["runs_dispatch_key_uq"] },
    },
    {
      name: "queue: claimRuns",
      call: (sql) => claimRuns(sql, "plan-test", 16, lease, BUILTIN_HOSTED),
      // Sent unprepared (db/claims.ts claimUnprepared): no generic plan.
      modes: ["force_custom_plan"],
      indexes: {
        runs: ["runs_queued_workflow_idx"],
        queue_lanes: ["queue_lanes_ready_idx", "Tid Scan"],
      },
    },
    {
      name: "queue: claimLimitedRuns",
      call: (sql) => claimLimitedRuns(sql, "plan-test", 16, lease, LIMITED_HOSTED),
      modes: ["force_custom_plan"],
      indexes: {
        runs: ["runs_queued_key_idx"],
        concurrency_slots: ["concurrency_slots_due_idx", "Tid Scan"],
      },
    },
    {
      name: "admission: insertRuns, limited runs",
      call: (sql) => insertRuns(sql, limitedBatch),
      indexes: { runs: ["runs_dispatch_key_uq"] },
    },
    {
      name: "api: selectRun, with what it waits for",
      call: (sql) => selectRun(sql, s.tenant, s.runningRun, { waiting: true }),
      indexes: { runs: ["runs_pkey"], concurrency_slots: ["concurrency_slots_pkey"] },
    },
    {
      name: "api: selectRuns, a parent's children (GET /v1/runs/{id}, ?parent_run_id=)",
      call: (sql) => selectRuns(sql, s.tenant, { parentRunId: s.runningRun, limit: 101 }),
      indexes: { runs: ["runs_parent_idx"] },
    },
    {
      name: "worker: selectRootRunId (a parent's root, for its children)",
      call: (sql) => selectRootRunId(sql, s.tenant, s.runningRun),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "api: selectRuns, a root's tree (?root_run_id=)",
      call: (sql) => selectRuns(sql, s.tenant, { rootRunId: s.runningRun, limit: 51 }),
      indexes: { runs: ["runs_root_idx"] },
    },
    {
      name: "cascade: cancelRuns, a level of a cancelled tree (the children of runs)",
      call: (sql) => cancelRuns(sql, s.tenant, { childrenOf: [s.runningRun] }),
      indexes: { runs: ["runs_parent_idx", "runs_pkey"] },
    },
    {
      name: "cascade: cancelRuns, children admitted under a cancelled parent (by run id)",
      call: (sql) => cancelRuns(sql, s.tenant, { runIds: [s.runningRun] }),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "cascade: selectRunStatus (a finished run's cancel)",
      call: (sql) => selectRunStatus(sql, s.tenant, s.runningRun),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "children: lockParents (in run id order)",
      call: (sql) => lockParents(sql, s.tenant, [s.runningRun, crypto.randomUUID()]),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "children: noteChildrenStarted (child.started, the parent's row lock)",
      call: (sql) =>
        noteChildrenStarted(sql, s.tenant, [
          { run_id: s.runningRun, parent_run_id: s.runningRun, detached: false },
        ]),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "children: insertChildRuns (insertRuns, then the parents' child.started)",
      call: (sql) =>
        insertChildRuns(
          sql,
          batch.slice(0, 4).map((r) => ({
            ...r,
            dispatch_key: `child:${s.runningRun}:${r.dispatch_key}`,
            parent_run_id: s.runningRun,
            root_run_id: s.runningRun,
          })),
        ),
      indexes: { runs: ["runs_dispatch_key_uq", "runs_pkey"] },
    },
    {
      name: "queue: heartbeat",
      call: (sql) => heartbeat(sql, s.tenant, s.runningRun, s.owner, s.attempt, lease),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: renewLeases, a worker's batch (one run of it still its own)",
      call: (sql) =>
        renewLeases(sql, s.owner, [
          { tenant_id: s.tenant, run_id: s.runningRun, attempt: s.attempt },
          ...Array.from({ length: 31 }, (_, i) => ({
            tenant_id: `t${String(i % TENANTS).padStart(2, "0")}`,
            run_id: crypto.randomUUID(),
            attempt: 1,
          })),
        ], lease),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: completeRun",
      call: (sql) => completeRun(sql, s.tenant, s.runningRun, s.owner, s.attempt, { ok: true }),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: completeRuns, a batch (one run of it still running)",
      call: (sql) =>
        completeRuns(sql, s.owner, [
          { tenant_id: s.tenant, run_id: s.runningRun, attempt: s.attempt, result_json: "[1]" },
          ...Array.from({ length: 15 }, () => ({
            tenant_id: s.tenant,
            run_id: crypto.randomUUID(),
            attempt: 1,
            result_json: "null",
          })),
        ]),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: completeRuns, a batch of unlimited runs (no concurrency counts)",
      call: (sql) =>
        completeRuns(
          sql,
          s.owner,
          Array.from({ length: 16 }, (_, i) => ({
            tenant_id: s.tenant,
            run_id: i === 0 ? s.runningRun : crypto.randomUUID(),
            attempt: i === 0 ? s.attempt : 1,
            result_json: "null",
            limited: false,
            child: false,
          })),
        ),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: failAttempt",
      call: (sql) =>
        failAttempt(
          sql,
          s.tenant,
          s.runningRun,
          s.owner,
          s.attempt,
          { message: "plan test" },
          1000,
        ),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: releaseRun",
      call: (sql) => releaseRun(sql, s.tenant, s.runningRun, s.owner, s.attempt, "plan test"),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: requestCancel",
      call: (sql) => requestCancel(sql, s.tenant, s.runningRun),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "queue: reclaimExpired",
      call: (sql) => reclaimExpired(sql, 100),
      // runs_pkey: the parents of the children it fails for good (db/fan_in.ts).
      indexes: { runs: ["runs_running_tenant_idx", "runs_pkey"] },
    },
    {
      // The slot reconciler's count of one group: its queued runs are one
      // range of the group's index, its running ones one of the tenant's.
      name: "maintenance: correctSlot",
      call: (sql) =>
        correctSlot(sql as unknown as postgres.TransactionSql, {
          tenant_id: s.tenant,
          workflow_name: "keyed",
          concurrency_key: "k0",
        }),
      indexes: {
        runs: ["runs_queued_key_idx", "runs_running_tenant_idx"],
        concurrency_slots: ["concurrency_slots_pkey"],
      },
    },
    {
      // The lane repairer's walk: a loose scan of the queued runs' lanes, and
      // each lane's earliest run one probe per priority.
      name: "maintenance: repairLanes",
      call: (sql) => repairLanes(sql, undefined, 100),
      indexes: { runs: ["runs_queued_workflow_idx"] },
    },
    {
      name: "queue: queueCounts",
      call: (sql) => queueCounts(sql),
      indexes: {
        runs: ["runs_queued_workflow_idx", "runs_running_tenant_idx", "runs_waiting_tenant_idx"],
      },
    },
    {
      name: "queue: selectUnhostedQueues",
      call: (sql) => selectUnhostedQueues(sql, COUNT_CAP),
      indexes: { runs: ["runs_queued_workflow_idx"] },
    },
    {
      name: "console: selectTenantQueue",
      call: (sql) => selectTenantQueue(sql, s.tenant),
      indexes: { runs: ["runs_queued_workflow_idx", "runs_running_tenant_idx"] },
    },
    {
      name: "console: selectTenantWaitingVersions",
      call: (sql) => selectTenantWaitingVersions(sql, s.tenant),
      indexes: { runs: ["runs_queued_workflow_idx"] },
    },
    {
      name: "quota: countQueuedRuns (the API's gate, capped at max_queued)",
      call: (sql) => countQueuedRuns(sql, s.tenant, 1000),
      indexes: { runs: ["runs_queued_workflow_idx", "runs_waiting_tenant_idx"] },
    },
    {
      // From concurrency_slots' counts only, never runs: one range of the
      // waiting index, however many groups the tenant has.
      name: "console: selectTenantWaitingGroups",
      call: (sql) => selectTenantWaitingGroups(sql, s.tenant),
      indexes: { concurrency_slots: ["concurrency_slots_waiting_idx"] },
    },
    {
      name: "console: selectTenantWaitingTotals",
      call: (sql) => selectTenantWaitingTotals(sql, s.tenant),
      indexes: { concurrency_slots: ["concurrency_slots_waiting_idx"] },
    },
    {
      // A scrape's aggregate over all of concurrency_slots (one row per
      // group): any plan of it will do, as long as it never reads runs.
      name: "queue: selectLimitedWorkflowStats",
      call: (sql) => selectLimitedWorkflowStats(sql),
      indexes: {},
    },
    {
      name: "console: selectAdmissionsPerMinute",
      call: (sql) => {
        const since = new Date(Date.now() - 60 * 60_000);
        return selectAdmissionsPerMinute(sql, s.tenant, since, uuidv7Floor(since.getTime()));
      },
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "console: selectRunEvents",
      call: (sql) => selectRunEvents(sql, s.tenant, s.runningRun, 1000),
      indexes: { work_events: ["work_events_pkey"] },
    },
    {
      name: "outbox: claimPendingEvents",
      // Every shard; the session named matters not to the plan.
      call: (sql) =>
        claimPendingEvents(sql, 500, 16 << 20, {
          shards: Array.from({ length: OUTBOX_SHARDS }, (_, i) => i),
          pid: 0,
        }),
      // runs by primary key: each event's run's traceparent.
      indexes: {
        work_events: ["work_events_pending_idx", "work_events_pkey"],
        runs: ["runs_pkey"],
      },
    },
    {
      name: "outbox: markPublished",
      call: (sql) =>
        markPublished(sql as unknown as postgres.TransactionSql, [
          { tenant_id: s.tenant, event_id: s.pendingEventId },
        ]),
      indexes: { work_events: ["work_events_pending_idx"] },
    },
    {
      name: "outbox: parkEvents",
      call: (sql) =>
        parkEvents(sql as unknown as postgres.TransactionSql, [
          { tenant_id: s.tenant, event_id: s.pendingEventId, reason: "plan test" },
        ]),
      indexes: { work_events: ["work_events_pending_idx"] },
    },
    {
      name: "outbox: outboxStats",
      call: (sql) => outboxStats(sql),
      indexes: { work_events: ["work_events_pending_idx", "work_events_parked_idx"] },
    },
    {
      // Not a hot path, but it must stay one short range however large the
      // table: candidates from the finished index, deletes by ctid. Sent
      // unprepared: planned for the table as it is at each call.
      name: "retention: purgeFinishedRuns",
      call: (sql) => purgeFinishedRuns(sql, 10 * 60_000, 500),
      modes: ["force_custom_plan"],
      fromRuns: 5_000,
      indexes: {
        runs: ["runs_finished_idx", "runs_pkey", "Tid Scan"],
        work_events: ["work_events_pkey", "Tid Scan"],
        run_steps: ["run_steps_pkey", "Tid Scan"],
        run_signals: ["run_signals_pkey", "Tid Scan"],
      },
    },
    {
      name: "durable: loadSteps",
      call: (sql) => loadSteps(sql, s.tenant, s.runningRun),
      indexes: { run_steps: ["run_steps_pkey"] },
    },
    {
      name: "durable: selectStepSummaries",
      call: (sql) => selectStepSummaries(sql, s.tenant, s.runningRun),
      indexes: { run_steps: ["run_steps_pkey"] },
    },
    {
      name: "durable: completeStep",
      call: (sql) =>
        completeStep(sql, fence, { name: "a", seq: 1, resultJson: "1", size: 1, durationMs: 1 }),
      indexes: durable,
    },
    {
      name: "durable: failStep",
      call: (sql) => failStep(sql, fence, { name: "a", seq: 1, tries: 1, error: { m: 1 } }),
      // run_steps is only written (its insert's conflict is the arbiter's probe).
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "durable: settleSleep",
      call: (sql) => settleSleep(sql, fence, { name: "nap", seq: 1, ms: 60_000 }),
      indexes: durable,
    },
    {
      name: "durable: settleSignalWait",
      call: (sql) =>
        settleSignalWait(sql, fence, {
          name: "w",
          seq: 1,
          signalName: "go",
          timeoutMs: 60_000,
        }),
      indexes: { ...durable, run_signals: ["run_signals_unconsumed_idx", "run_signals_pkey"] },
    },
    {
      // The lock, then the check and the suspend (a signal of the name in the mailbox).
      name: "durable: suspendRun",
      call: (sql) =>
        suspendRun(sql, fence, { reason: "signal", name: "go", step: "w", until: null }),
      fromRuns: 100,
      indexes: { runs: ["runs_pkey"], run_signals: ["run_signals_unconsumed_idx"] },
    },
    {
      // The lock, then the insert, the wake and the replay's read of a stored signal.
      name: "durable: sendSignal",
      call: (sql) =>
        sendSignal(sql, s.tenant, s.runningRun, { name: "go", signal_id: "x", payload: 1 }),
      fromRuns: 100,
      indexes: { runs: ["runs_pkey"], run_signals: ["run_signals_pkey"] },
    },
    {
      name: "durable: signalPending",
      call: (sql) => signalPending(sql, s.tenant, s.runningRun, "go"),
      indexes: { run_signals: ["run_signals_unconsumed_idx"] },
    },
    {
      name: "durable: wakeDueRuns",
      call: (sql) => wakeDueRuns(sql, 100),
      indexes: { runs: ["runs_waiting_tenant_idx"] },
    },
    {
      // The lock, then the count of the group's unfinished children (one
      // range of the parent's children) and the suspend.
      name: "fan-in: awaitChildren",
      call: (sql) => awaitChildren(sql, fence, { group: "m", failFast: true }),
      fromRuns: 100,
      indexes: { runs: ["runs_pkey", "runs_parent_idx"] },
    },
    {
      name: "fan-in: selectChildOutcomes (a map's children, on resume)",
      call: (sql) => selectChildOutcomes(sql, s.tenant, s.runningRun, "m"),
      indexes: { runs: ["runs_parent_idx"] },
    },
    {
      name: "fan-in: childGroupState (a bounded map's counts)",
      call: (sql) => childGroupState(sql, s.tenant, s.runningRun, "m"),
      indexes: { runs: ["runs_parent_idx"] },
    },
    {
      name: "fan-in: selectChild (result() of one child)",
      call: (sql) => selectChild(sql, s.tenant, s.runningRun, s.runningRun),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      // The group's children, then each one's parent by its key (the fan-in).
      name: "fan-in: cancelChildren (failFast)",
      call: (sql) => cancelChildren(sql, s.tenant, s.runningRun, "m"),
      indexes: { runs: ["runs_parent_idx", "runs_pkey"] },
    },
    {
      // The tick's `skip` overlap check: the schedule's last run, by primary key.
      name: "schedules: runUnfinished",
      call: (sql) => runUnfinished(sql, s.tenant, s.runningRun),
      indexes: { runs: ["runs_pkey"] },
    },
    {
      name: "outbox: purgePublished",
      call: (sql) => purgePublished(sql, 24 * 3600_000, 500),
      indexes: { work_events: ["work_events_published_idx"] },
    },
  ];
}

/**
 * Records every statement a pool sends (the postgres.js debug hook sees the
 * final text and the serialized parameters), so the test explains exactly
 * what the code issues.
 */
export function capturingPool(url: string) {
  let log: Captured[] = [];
  const sql = postgres(url, {
    max: 1,
    onnotice: () => {},
    debug: (_conn, text, parameters, types) => {
      log.push({ text, parameters: parameters as unknown[], types: types as number[] });
    },
  });
  return {
    sql,
    /** The statements `call` issues, run in a transaction that is rolled back. */
    async capture(call: (sql: Sql) => Promise<unknown>): Promise<Captured[]> {
      // The driver's own first query (it reads the array types) is not ours.
      await sql`select 1`;
      const rollback = new Error("rollback");
      log = [];
      await sql.begin(async (tx) => {
        await call(tx as unknown as Sql);
        throw rollback;
      }).catch((err) => {
        if (err !== rollback) throw err;
      });
      return log.filter((c) => !/^\s*(begin|rollback|commit|savepoint|release)\b/i.test(c.text));
    },
  };
}

export type PlanMode = "force_generic_plan" | "force_custom_plan";

export interface PlanNode {
  "Node Type": string;
  "Relation Name"?: string;
  "Index Name"?: string;
  Plans?: PlanNode[];
}

/**
 * Prepares `stmt` as the driver would (parameter types it left open are
 * inferred by the server), then explains its execution in `mode`.
 */
export async function explain(sql: Sql, stmt: Captured, mode: PlanMode): Promise<PlanNode> {
  const conn = await sql.reserve();
  try {
    await conn.unsafe(`set plan_cache_mode = ${mode}`);
    const declared = stmt.types.map((t) => t ? `${t}::regtype` : "'unknown'::regtype");
    const [{ types }] = await conn.unsafe<{ types: string }[]>(
      `select array_to_string(array[${
        declared.join(", ") || "null::regtype"
      }]::regtype[], ',') as types`,
    );
    await conn.unsafe(
      `prepare plan_check${stmt.types.length ? `(${types})` : ""} as ${stmt.text}`,
    );
    try {
      const [{ inferred }] = await conn.unsafe<{ inferred: string[] }[]>(
        `select parameter_types::text[] as inferred from pg_prepared_statements
          where name = 'plan_check'`,
      );
      const args = stmt.parameters.map((v, i) =>
        v === null || v === undefined
          ? `null::${inferred[i]}`
          : `'${String(v).replaceAll("'", "''")}'::${inferred[i]}`
      );
      const [row] = await conn.unsafe(
        `explain (format json) execute plan_check${args.length ? `(${args.join(", ")})` : ""}`,
      );
      return (row["QUERY PLAN"] as { Plan: PlanNode }[])[0].Plan;
    } finally {
      await conn.unsafe(`deallocate plan_check`);
      await conn.unsafe(`reset plan_cache_mode`);
    }
  } finally {
    conn.release();
  }
}

/**
 * Prepares `stmt` as the driver would and runs it under `EXPLAIN (ANALYZE,
 * BUFFERS)` with its custom plan, in a transaction rolled back: the plan
 * with its actual row and buffer counts, and how many rows it returned.
 */
export async function explainAnalyze(
  sql: Sql,
  stmt: Captured,
): Promise<{ plan: PlanNode; result: number }> {
  const conn = await sql.reserve();
  try {
    await conn.unsafe("begin");
    const declared = stmt.types.map((t) => t ? `${t}::regtype` : "'unknown'::regtype");
    const [{ types }] = await conn.unsafe<{ types: string }[]>(
      `select array_to_string(array[${
        declared.join(", ") || "null::regtype"
      }]::regtype[], ',') as types`,
    );
    await conn.unsafe(`prepare plan_check${stmt.types.length ? `(${types})` : ""} as ${stmt.text}`);
    const [{ inferred }] = await conn.unsafe<{ inferred: string[] }[]>(
      `select parameter_types::text[] as inferred from pg_prepared_statements
        where name = 'plan_check'`,
    );
    const args = stmt.parameters.map((v, i) =>
      v === null || v === undefined
        ? `null::${inferred[i]}`
        : `'${String(v).replaceAll("'", "''")}'::${inferred[i]}`
    );
    const [row] = await conn.unsafe(
      `explain (analyze, buffers, format json) execute plan_check${
        args.length ? `(${args.join(", ")})` : ""
      }`,
    );
    const plan = (row["QUERY PLAN"] as { Plan: PlanNode }[])[0].Plan;
    return { plan, result: (plan as PlanNode & { "Actual Rows": number })["Actual Rows"] };
  } finally {
    await conn.unsafe("rollback").catch(() => {});
    await conn.unsafe("deallocate plan_check").catch(() => {});
    conn.release();
  }
}

/** Every node of the plan that reads a table or an index. */
export function scans(node: PlanNode, out: PlanNode[] = []): PlanNode[] {
  if (node["Relation Name"] !== undefined || node["Index Name"] !== undefined) out.push(node);
  for (const child of node.Plans ?? []) scans(child, out);
  return out;
}

/**
 * Bulk rows in the shape production has: many tenants (one much larger),
 * mostly finished runs, some queued, due or not, some running (a few with
 * expired leases); two thirds carry a dispatch key (`key-<n>`); ~2 events per
 * run, mostly published (a few long ago), the rest pending.
 */
export async function addRuns(sql: Sql, from: number, to: number): Promise<void> {
  await sql`
    insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                      goal_id, dispatch_key, source, status, attempts, max_attempts, run_after,
                      lease_owner, lease_expires_at, started_at, finished_at, event_seq,
                      concurrency_key)
    select 't' || lpad((case when g % 3 = 0 then 0 else g % ${TENANTS} end)::text, 2, '0'),
           gen_random_uuid(), case when g % 10 = 5 then 'keyed' else 'echo' end,
           case when g % 10 = 5 then 'keyed' else 'echo' end, 1, jsonb_build_object('n', g),
           case when g % 7 = 0 then 'goal-' || (g % 100) end,
           case when g % 3 <> 1 then 'key-' || g end,
           'plan-test', st, case when st = 'queued' then 0 else 1 end, 3,
           now() - interval '1 hour' + (g % 10) * interval '15 minutes',
           case when st = 'running' then 'worker-' || (g % 4) end,
           case when st = 'running' then now() + (g % 3 - 1) * interval '1 minute' end,
           case when st <> 'queued' then now() - interval '1 hour' end,
           case when st in ('succeeded', 'failed') then now() - interval '30 minutes' end,
           case when st = 'queued' then 1 else 2 end,
           case when g % 10 = 5 then 'k' || (g % 997) end
      from generate_series(${from}::int, ${to}::int) g,
           lateral (select (array['succeeded', 'succeeded', 'succeeded', 'succeeded', 'succeeded',
                                  'succeeded', 'failed', 'queued', 'queued', 'running'])
                           [1 + (g * 7) % 10] as st) s`;
  // Concurrency groups with no runs behind them, one per 5 runs (most idle,
  // some full with a backlog, some with room): the console's statements read
  // only these counts.
  await sql`
    insert into concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running,
                                   running, queued)
    select 't' || lpad((case when g % 3 = 0 then 0 else g % ${TENANTS} end)::text, 2, '0'),
           'limited', 'customer-' || g, 1 + g % 2,
           case when g % 4 = 0 then 1 + g % 2 else 0 end,
           case when g % 4 in (0, 1) then g % 7 else 0 end
      from generate_series(${from}::int, ${to}::int) g
     where g % 5 = 0`;
  // Waiting runs (one in 40), a sleep's end or a signal wait's timeout
  // around now, some with none ('infinity').
  await sql`
    insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                      source, status, attempts, max_attempts, run_after, started_at, event_seq,
                      wait_reason, wait_name)
    select 't' || lpad((g % ${TENANTS})::text, 2, '0'), gen_random_uuid(), 'echo', 'echo', 1,
           '{}', 'plan-test', 'waiting', 0, 3,
           case when g % 3 = 0 then 'infinity'
                else now() + (g % 7 - 3) * interval '1 hour' end,
           now() - interval '1 hour', 3, case when g % 2 = 0 then 'sleep' else 'signal' end, 'w'
      from generate_series(${from}::int, ${to}::int) g
     where g % 40 = 3`;
  // Steps of one run in four (three each), signals of one in four (one
  // consumed, one not).
  await sql`
    insert into run_steps (tenant_id, run_id, name, seq, kind, status, result, size, attempt)
    select r.tenant_id, r.run_id, 'step-' || k, k, 'step', 'completed', '{"ok":true}', 11, 1
      from runs r cross join generate_series(1, 3) k
     where r.source = 'plan-test' and (hashtext(r.run_id::text) & 7) < 2
       and not exists (select 1 from run_steps x
                        where x.tenant_id = r.tenant_id and x.run_id = r.run_id)`;
  await sql`
    insert into run_signals (tenant_id, run_id, name, signal_id, payload, consumed_as)
    select r.tenant_id, r.run_id, 'go', 'sig-' || k, '{}', case when k = 1 then 'w' end
      from runs r cross join generate_series(1, 2) k
     where r.source = 'plan-test' and (hashtext(r.run_id::text) & 7) in (3, 4)
       and not exists (select 1 from run_signals x
                        where x.tenant_id = r.tenant_id and x.run_id = r.run_id)`;
  await sql`
    insert into work_events (tenant_id, run_id, seq, type, payload, at, published_at)
    select r.tenant_id, r.run_id, e.seq, 'run.x', '{}', now() - interval '2 days',
           case when (hashtext(r.run_id::text) & 15) = 0 then null
                when (hashtext(r.run_id::text) & 3) = 1 then now() - interval '2 days'
                else now() - interval '1 minute' end
      from runs r
     cross join lateral generate_series(1, r.event_seq) e(seq)
     where r.source = 'plan-test'
       and not exists (select 1 from work_events w
                        where w.tenant_id = r.tenant_id and w.run_id = r.run_id)`;
}

/**
 * The concurrency groups' counts as the bulk runs make them, limit 2 (some
 * full, some not), and the lanes of their unlimited queued runs.
 */
export async function countSlots(sql: Sql): Promise<void> {
  await laneQueuedRuns(sql);
  await sql`
    insert into concurrency_slots (tenant_id, workflow_name, concurrency_key, max_running,
                                   running, queued)
    select tenant_id, workflow_name, concurrency_key, 2,
           count(*) filter (where status = 'running'), count(*) filter (where status = 'queued')
      from runs where concurrency_key is not null group by 1, 2, 3
    on conflict (tenant_id, workflow_name, concurrency_key) do update
       set running = excluded.running, queued = excluded.queued`;
}

export async function sample(sql: Sql): Promise<Sample> {
  const [run] = await sql<
    { tenant_id: string; run_id: string; lease_owner: string; attempts: number }[]
  >`select tenant_id, run_id, lease_owner, attempts from runs where status = 'running' limit 1`;
  const [event] = await sql<{ event_id: string }[]>`
    select event_id from work_events
     where published_at is null and tenant_id = ${run?.tenant_id ?? "t00"} limit 1`;
  return {
    tenant: run?.tenant_id ?? "t00",
    runningRun: run?.run_id ?? crypto.randomUUID(),
    owner: run?.lease_owner ?? "worker-0",
    attempt: run?.attempts ?? 1,
    pendingEventId: event?.event_id ?? "1",
  };
}
