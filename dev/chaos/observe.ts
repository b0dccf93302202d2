/**
 * What the chaos checks look at, read from the outside: the chaos database
 * (runs, unpublished events, concurrency groups) and the topics read back
 * from the broker (dispatch, dead letters, events), plus the relay group's
 * lag for draining.
 * The harness' own queries live here; poimen's runtime SQL stays in db/.
 */
import type { Sql } from "../../db/pool.ts";
import { createAdmin } from "../../kafka/admin.ts";
import { type ConsumedMessage, createConsumer } from "../../kafka/consumer.ts";
import { delay, SECOND } from "../../core/time.ts";

/** A run as the checks need it. */
export interface RunRow {
  tenant: string;
  runId: string;
  dispatchKey: string | null;
  workflowName: string;
  /** The run's concurrency group (null: its workflow declares no limit). */
  concurrencyKey: string | null;
  status: string;
  /** The seq of the last event written for the run. */
  eventSeq: number;
  /** `input.chaos_keyless` of a keyless message's run. */
  marker: string | null;
  attempts: number;
  error: string | null;
}

/** An event row not published (yet). */
export interface UnpublishedEvent {
  tenant: string;
  runId: string;
  seq: number;
  type: string;
  parked: boolean;
}

/** All runs of the chaos database. */
export async function selectRuns(sql: Sql): Promise<RunRow[]> {
  const rows = await sql<
    {
      tenant_id: string;
      run_id: string;
      dispatch_key: string | null;
      workflow_name: string;
      concurrency_key: string | null;
      status: string;
      event_seq: number;
      marker: string | null;
      attempts: number;
      error: string | null;
    }[]
  >`
    select tenant_id, run_id, dispatch_key, workflow_name, concurrency_key, status, event_seq,
           attempts,
           case when jsonb_typeof(input) = 'object' then input ->> 'chaos_keyless' end as marker,
           left(error::text, 300) as error
      from runs`;
  return rows.map((r) => ({
    tenant: r.tenant_id,
    runId: r.run_id,
    dispatchKey: r.dispatch_key,
    workflowName: r.workflow_name,
    concurrencyKey: r.concurrency_key,
    status: r.status,
    eventSeq: r.event_seq,
    marker: r.marker,
    attempts: r.attempts,
    error: r.error,
  }));
}

/** Which of `names` are in the workflow catalog (some worker registered a version). */
export async function registeredWorkflows(sql: Sql, names: string[]): Promise<Set<string>> {
  const rows = await sql<{ name: string }[]>`
    select distinct name from workflow_versions where name = any(${names}::text[])`;
  return new Set(rows.map((r) => r.name));
}

/**
 * One concurrency group (tenant, workflow, concurrency key) at one moment:
 * its runs running and queued as the runs say, beside what its
 * `concurrency_slots` row counts (null: no row).
 */
export interface SlotGroup {
  tenant: string;
  workflow: string;
  key: string;
  running: number;
  queued: number;
  slotRunning: number | null;
  slotQueued: number | null;
  /** The row's limit (null: no row). */
  maxRunning: number | null;
}

/**
 * Every concurrency group that has a `concurrency_slots` row or open runs,
 * counted from the runs and from the row in one statement: one snapshot,
 * so the two agree whenever every statement that moves a limited run moves
 * its group's counts with it (migration 011).
 */
export async function selectSlotGroups(sql: Sql): Promise<SlotGroup[]> {
  const rows = await sql<
    {
      tenant_id: string;
      workflow_name: string;
      concurrency_key: string;
      running: number;
      queued: number;
      slot_running: number | null;
      slot_queued: number | null;
      max_running: number | null;
    }[]
  >`
    with actual as (
      select tenant_id, workflow_name, concurrency_key,
             count(*) filter (where status = 'running')::int as running,
             count(*) filter (where status = 'queued')::int as queued
        from runs
       where concurrency_key is not null and status in ('queued', 'running')
       group by 1, 2, 3
    )
    select coalesce(a.tenant_id, s.tenant_id) as tenant_id,
           coalesce(a.workflow_name, s.workflow_name) as workflow_name,
           coalesce(a.concurrency_key, s.concurrency_key) as concurrency_key,
           coalesce(a.running, 0) as running, coalesce(a.queued, 0) as queued,
           s.running as slot_running, s.queued as slot_queued, s.max_running
      from actual a
      full join concurrency_slots s
        on s.tenant_id = a.tenant_id and s.workflow_name = a.workflow_name
       and s.concurrency_key = a.concurrency_key`;
  return rows.map((r) => ({
    tenant: r.tenant_id,
    workflow: r.workflow_name,
    key: r.concurrency_key,
    running: r.running,
    queued: r.queued,
    slotRunning: r.slot_running,
    slotQueued: r.slot_queued,
    maxRunning: r.max_running,
  }));
}

/**
 * The column that marks an event the outbox gave up on (parked), if the
 * schema has one: any `work_events` column whose name contains "park".
 */
async function parkedColumn(sql: Sql): Promise<{ name: string; type: string } | undefined> {
  const [col] = await sql<{ column_name: string; data_type: string }[]>`
    select column_name, data_type from information_schema.columns
     where table_schema = current_schema() and table_name = 'work_events'
       and column_name like '%park%'
     order by ordinal_position limit 1`;
  return col ? { name: col.column_name, type: col.data_type } : undefined;
}

/** Events not published, each saying whether it is parked. */
export async function selectUnpublished(sql: Sql): Promise<UnpublishedEvent[]> {
  const col = await parkedColumn(sql);
  const parked = col === undefined
    ? sql`false`
    : col.type === "boolean"
    ? sql`coalesce(${sql(col.name)}, false)`
    : sql`${sql(col.name)} is not null`;
  const rows = await sql<
    { tenant_id: string; run_id: string; seq: number; type: string; parked: boolean }[]
  >`
    select tenant_id, run_id, seq, type, ${parked} as parked
      from work_events where published_at is null`;
  return rows.map((r) => ({
    tenant: r.tenant_id,
    runId: r.run_id,
    seq: r.seq,
    type: r.type,
    parked: r.parked,
  }));
}

/** How far the system is from drained: each number must reach 0. */
export interface DrainState {
  /** Dispatch messages not yet committed by the relay group. */
  lag: number;
  /** Runs queued, running or waiting (a waiting run is woken by its deadline). */
  open: number;
  /** Events neither published nor parked. */
  unpublished: number;
}

/** Counts of open runs and of events waiting to be published. */
export async function databaseBacklog(sql: Sql): Promise<{ open: number; unpublished: number }> {
  const [runs] = await sql<{ n: number }[]>`
    select count(*)::int as n from runs where status in ('queued', 'running', 'waiting')`;
  const unpublished = (await selectUnpublished(sql)).filter((e) => !e.parked).length;
  return { open: runs.n, unpublished };
}

/** Per partition, the messages on `topics` the relay group has not committed past. */
export async function relayLag(
  brokers: string[],
  groupId: string,
  topics: string[],
): Promise<Map<string, number>> {
  const admin = createAdmin({ brokers, clientId: "poimen-chaos-lag", retries: 1 });
  try {
    const [ends, committed] = await Promise.all([
      admin.endOffsets(topics),
      admin.committedOffsets(groupId, topics),
    ]);
    const done = new Map(committed.map((c) => [`${c.topic}/${c.partition}`, c.offset]));
    const lag = new Map<string, number>();
    for (const end of ends) {
      const key = `${end.topic}/${end.partition}`;
      const from = done.get(key) ?? 0n;
      if (end.offset > from) lag.set(key, Number(end.offset - from));
    }
    return lag;
  } finally {
    await admin.close().catch(() => {});
  }
}

/**
 * Every message on `topics`, from the earliest offset to the end offset
 * each partition had when this was called, in offset order per partition.
 */
export async function readTopics(
  brokers: string[],
  topics: string[],
  timeoutMs = 120 * SECOND,
): Promise<ConsumedMessage[]> {
  const admin = createAdmin({ brokers, clientId: "poimen-chaos-read" });
  const waiting = new Map<string, bigint>();
  try {
    const [ends, starts] = await Promise.all([
      admin.endOffsets(topics),
      admin.startOffsets(topics),
    ]);
    const first = new Map(starts.map((s) => [`${s.topic}/${s.partition}`, s.offset]));
    for (const e of ends) {
      const key = `${e.topic}/${e.partition}`;
      if (e.offset > (first.get(key) ?? 0n)) waiting.set(key, e.offset);
    }
  } finally {
    await admin.close().catch(() => {});
  }
  const got: ConsumedMessage[] = [];
  if (waiting.size === 0) return got;
  const consumer = createConsumer({
    brokers,
    clientId: "poimen-chaos-read",
    groupId: `poimen-chaos-read-${crypto.randomUUID()}`,
    topics,
    startFrom: "earliest",
    maxBuffered: 5000,
  });
  const timeout = new AbortController();
  const timedOut = delay(timeoutMs, timeout.signal).then(() => undefined);
  const messages = consumer[Symbol.asyncIterator]();
  try {
    while (waiting.size > 0) {
      const next = await Promise.race([messages.next(), timedOut]);
      if (next === undefined || next.done) {
        throw new Error(`reading ${topics.join(", ")} back timed out: ${[...waiting.keys()]}`);
      }
      const m = next.value;
      const key = `${m.topic}/${m.partition}`;
      const end = waiting.get(key);
      if (end === undefined) continue;
      got.push(m);
      if (m.offset + 1n >= end) waiting.delete(key);
    }
  } finally {
    timeout.abort();
    await consumer.close();
  }
  return got;
}
