/** Reading runs: by id and by filters with keyset pagination, always tenant-scoped. */
import type postgres from "postgres";
import type { z } from "zod";
import type { RunListField, RunStatus as RunStatusSchema } from "../contracts/runs.ts";
import type { Sql } from "./pool.ts";
import { noLiveHost } from "./catalog.ts";

/** A run as the API returns it (without its input, which only `selectRun` reads). */
export interface RunRow {
  run_id: string;
  tenant_id: string;
  workflow_ref: string;
  workflow_name: string;
  workflow_version: number;
  goal_id: string | null;
  dispatch_key: string | null;
  source: string;
  status: RunStatus;
  attempts: number;
  max_attempts: number;
  result: unknown;
  error: unknown;
  created_at: Date;
  updated_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
  /** When the run is due: not claimed before. */
  run_after: Date;
  /** When a cancel was asked for (a running run ends `cancelled` once its worker sees it). */
  cancel_requested_at: Date | null;
  /** -10..10: higher first within the tenant. */
  priority: number;
  /** Its concurrency group when its version declares a limit; null: not limited. */
  concurrency_key: string | null;
  /** The run whose handler started it (`ctx.start`, migration 024); null: a caller admitted it. */
  parent_run_id: string | null;
  /** The root of its tree of runs; null for a run a caller admitted (a root itself). */
  root_run_id: string | null;
  /** A child that a cancel of its ancestors does not reach (migration 030); false for a root. */
  detached: boolean;
}

/** A run's status; the set is a wire contract (contracts/runs.ts). */
export type RunStatus = z.infer<typeof RunStatusSchema>;

const RUN_COLUMN_NAMES = [
  "run_id",
  "tenant_id",
  "workflow_ref",
  "workflow_name",
  "workflow_version",
  "goal_id",
  "dispatch_key",
  "source",
  "status",
  "attempts",
  "max_attempts",
  "result",
  "error",
  "created_at",
  "updated_at",
  "started_at",
  "finished_at",
  "run_after",
  "cancel_requested_at",
  "priority",
  "concurrency_key",
  "parent_run_id",
  "root_run_id",
  "detached",
] as const;

/** The columns of `RunRow` as a SQL list, qualified by `alias` when given. */
export function runColumns(alias?: string): string {
  return RUN_COLUMN_NAMES.map((c) => alias ? `${alias}.${c}` : c).join(", ");
}

/** What a queued or waiting run waits for, as `selectRun` finds it (contracts/runs.ts `WaitingReason`). */
export type WaitingReason =
  | "worker"
  | "schedule"
  | "concurrency"
  | "slot"
  | "sleep"
  | "signal"
  | "children";

/** A run as `selectRun` reads it: with its input, and what it waits for when asked. */
export type RunDetailRow = RunRow & {
  input: unknown;
  /** The seq of the run's last event: what a watcher compares (api/run_watch.ts). */
  event_seq: number;
  waiting_reason?: WaitingReason | null;
  /** With `waiting`, for a limited run: its group's limit and runs running now. */
  slot_limit?: number | null;
  slot_running?: number | null;
  /** With `waiting`, for a waiting run: the sleep's or the signal's name. */
  wait_name?: string | null;
};

/**
 * One run of one tenant, with its input; undefined when absent or another
 * tenant's. With `waiting`, also `waiting_reason`: for a waiting run what it
 * waits for (`sleep`, `signal`, with `wait_name`), null unless queued or
 * waiting, and for a queued run, checked in this order in the same statement: `worker` when no live worker
 * hosts its version (db/catalog.ts), `schedule` when its run_after has not
 * come, `concurrency` when its concurrency group (migration 011) has as
 * many runs running as its limit, else `slot`. The hosting probe reads
 * workflow_workers, one row per live worker, and only for a queued run; the
 * group is one primary-key probe, only for a limited run.
 */
export async function selectRun(
  sql: Sql,
  tenantId: string,
  runId: string,
  opts: { waiting?: boolean } = {},
): Promise<RunDetailRow | undefined> {
  const [row] = await sql<RunDetailRow[]>`
    select ${sql.unsafe(runColumns("r"))}, r.input, r.event_seq
           ${
    opts.waiting
      ? sql`, case when status = 'waiting' then r.wait_reason
                   when status <> 'queued' then null
                   when ${sql.unsafe(noLiveHost("r.workflow_name", "r.workflow_version"))}
                     then 'worker'
                   when run_after > now() then 'schedule'
                   when g.running >= g.max_running then 'concurrency'
                   else 'slot' end as waiting_reason,
             g.max_running as slot_limit, g.running as slot_running,
             case when status = 'waiting' then r.wait_name end as wait_name`
      : sql``
  }
      from runs r
      ${
    opts.waiting
      ? sql`left join lateral (
              select s.running, s.max_running from concurrency_slots s
               where s.tenant_id = r.tenant_id and s.workflow_name = r.workflow_name
                 and s.concurrency_key = r.concurrency_key and r.status = 'queued') g on true`
      : sql``
  }
     where r.tenant_id = ${tenantId} and r.run_id = ${runId}`;
  return row;
}

export interface RunFilter {
  /** Columns beyond `RunListRow`'s, read only when asked for (`GET /v1/runs?fields=`). */
  fields?: readonly RunListField[];
  goalId?: string;
  dispatchKey?: string;
  status?: RunStatus;
  /** Only the children of this run (runs_parent_idx, migration 025). */
  parentRunId?: string;
  /** Only the runs of this root's tree, the root excluded (runs_root_idx). */
  rootRunId?: string;
  /** Exclusive: return runs older than this run id (UUIDv7 order is admission order). */
  before?: string;
  limit: number;
}

/**
 * A run as a list reads it: without `input` and `result` unless asked for
 * (they are a run's large values, up to the body limit and
 * RUN_RESULT_MAX_BYTES each), so that Postgres does not even detoast them.
 */
export type RunListRow = Omit<RunRow, "result"> & { input?: unknown; result?: unknown };

const LIST_COLUMNS = RUN_COLUMN_NAMES.filter((c) => c !== "result").join(", ");
// The column of each field: what reaches the SQL text is one of these, never the request's.
const FIELD_COLUMNS: Record<RunListField, string> = { input: "input", result: "result" };

/**
 * A page of a tenant's runs, newest first. Awaited, all at once; with
 * `.cursor(n)`, `n` rows at a time, so that a caller stopping early (a
 * page full by bytes) leaves the rest unread: Postgres produces a portal's
 * rows only as they are fetched.
 */
export function selectRuns(
  sql: Sql,
  tenantId: string,
  f: RunFilter,
): postgres.PendingQuery<RunListRow[]> {
  const extra = [...new Set(f.fields ?? [])].map((c) => `, ${FIELD_COLUMNS[c]}`).join("");
  return sql<RunListRow[]>`
    select ${sql.unsafe(LIST_COLUMNS + extra)} from runs
     where tenant_id = ${tenantId}
       ${f.goalId === undefined ? sql`` : sql`and goal_id = ${f.goalId}`}
       ${
    // The tenant again in collation "C": what lets runs_dispatch_key_uq serve it.
    f.dispatchKey === undefined
      ? sql``
      : sql`and tenant_id collate "C" = ${tenantId} and dispatch_key = ${f.dispatchKey}`}
       ${f.status === undefined ? sql`` : sql`and status = ${f.status}`}
       ${
    // Collation "C" again: what lets the partial lineage indexes serve it.
    f.parentRunId === undefined
      ? sql``
      : sql`and tenant_id collate "C" = ${tenantId} and parent_run_id = ${f.parentRunId}
            and parent_run_id is not null`}
       ${
    f.rootRunId === undefined
      ? sql``
      : sql`and tenant_id collate "C" = ${tenantId} and root_run_id = ${f.rootRunId}
            and root_run_id is not null`
  }
       ${f.before === undefined ? sql`` : sql`and run_id < ${f.before}`}
     order by run_id desc
     limit ${f.limit}`;
}

/** One event of a run's timeline, as `work_events` holds it. */
export interface RunEventRow {
  seq: number;
  type: string;
  payload: unknown;
  at: Date;
  published_at: Date | null;
  parked_at: Date | null;
}

/**
 * A run's events still in `work_events` after `afterSeq`, oldest first, at
 * most `limit`.
 * Published events are purged after a while, so an old run's timeline may
 * be short or empty; the run row stays the source of truth. The primary key
 * (tenant_id, run_id, seq) serves it.
 */
export async function selectRunEvents(
  sql: Sql,
  tenantId: string,
  runId: string,
  limit: number,
  afterSeq = 0,
): Promise<RunEventRow[]> {
  return await sql<RunEventRow[]>`
    select seq, type, payload, at, published_at, parked_at from work_events
     where tenant_id = ${tenantId} and run_id = ${runId} and seq > ${afterSeq}
     order by seq
     limit ${limit}`;
}

/** A watched run's last event seq; null when the run is gone (purged). */
export interface WatchedRun {
  tenant_id: string;
  run_id: string;
  event_seq: number | null;
}

/**
 * The last event seq of each of `runs`: what the API's watchers of those
 * runs wake on (api/run_watch.ts). One primary-key probe per run, each
 * naming its tenant: a scalar subquery, not a join, so no plan can hash
 * `runs` whatever its statistics say.
 */
export async function selectEventSeqs(
  sql: Sql,
  runs: readonly { tenant_id: string; run_id: string }[],
): Promise<WatchedRun[]> {
  return await sql<WatchedRun[]>`
    select k.tenant_id, k.run_id,
           (select r.event_seq from runs r
             where r.tenant_id = k.tenant_id and r.run_id = k.run_id) as event_seq
      from unnest(${runs.map((r) => r.tenant_id)}::text[], ${
    runs.map((r) => r.run_id)
  }::uuid[]) as k(tenant_id, run_id)`;
}
