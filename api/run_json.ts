/**
 * A run and its events as the API answers with them (`GET /v1/runs/{id}`,
 * lists, event timelines, the console): from the rows db/runs.ts reads to
 * the shapes of contracts/runs.ts.
 */
import { parseOccurrenceKey } from "../admission/schedule_ticker.ts";
import type { RunEventRow, RunListRow, RunRow, WaitingReason } from "../db/runs.ts";
import type { StepSummary } from "../db/run_steps.ts";
import type { Run, RunEvent, RunStep, WaitingFor } from "../contracts/runs.ts";

/** What a queued or waiting run waits for, for people and programs; null for any other run. */
export function waitingFor(
  row: Pick<RunRow, "workflow_name" | "workflow_version" | "run_after" | "concurrency_key"> & {
    slot_limit?: number | null;
    slot_running?: number | null;
    wait_name?: string | null;
  },
  reason: WaitingReason | null,
): WaitingFor | null {
  switch (reason) {
    case null:
      return null;
    case "sleep": {
      const until = iso(row.run_after)!;
      const name = row.wait_name ?? "";
      return { reason, name, until, detail: `sleeping (${name}) until ${until}` };
    }
    case "signal": {
      const until = iso(row.run_after)!;
      const name = row.wait_name ?? "";
      return until === "infinity"
        ? { reason, name, detail: `waiting for signal ${JSON.stringify(name)}` }
        : {
          reason,
          name,
          until,
          detail: `waiting for signal ${JSON.stringify(name)}, at most until ${until}`,
        };
    }
    case "children": {
      const name = row.wait_name ?? "";
      return { reason, name, detail: `waiting for its children (${name})` };
    }
    case "worker": {
      const workflow = `${row.workflow_name}@${row.workflow_version}`;
      return { reason, workflow, detail: `no running worker hosts ${workflow}` };
    }
    case "schedule": {
      const until = new Date(row.run_after).toISOString();
      return { reason, until, detail: `scheduled: not due before ${until}` };
    }
    case "concurrency": {
      const key = row.concurrency_key ?? "";
      const limit = row.slot_limit ?? 0;
      const running = row.slot_running ?? 0;
      const per = key === "" ? "for this tenant" : `for key ${JSON.stringify(key)}`;
      return {
        reason,
        key,
        limit,
        running,
        detail: `waiting on ${row.workflow_name}'s concurrency limit: ${running} of ${limit} ` +
          `running ${per}`,
      };
    }
    case "slot":
      return { reason, detail: "due; waiting for a free worker slot" };
  }
}

/**
 * A run row as JSON: `input` and `result` when the row has them (a list's
 * only when asked for), `waiting_for` when the row says what it waits for
 * (selectRun's `waiting`), `steps` when given (one run's GET).
 */
export function toRun(
  row: RunListRow & {
    waiting_reason?: WaitingReason | null;
    slot_limit?: number | null;
    slot_running?: number | null;
    wait_name?: string | null;
  },
  steps?: StepSummary[],
): Run {
  // A schedule's occurrence says which, from its dispatch key (admission/schedule_ticker.ts).
  const occurrence = parseOccurrenceKey(row.dispatch_key);
  return {
    run_id: row.run_id,
    tenant_id: row.tenant_id,
    workflow_ref: row.workflow_ref,
    workflow: row.workflow_name,
    workflow_version: row.workflow_version,
    status: row.status,
    goal_id: row.goal_id,
    dispatch_key: row.dispatch_key,
    source: row.source,
    attempts: row.attempts,
    max_attempts: row.max_attempts,
    ...("input" in row ? { input: row.input } : {}),
    ...("result" in row ? { result: row.result ?? null } : {}),
    error: row.error ?? null,
    created_at: iso(row.created_at)!,
    updated_at: iso(row.updated_at)!,
    started_at: iso(row.started_at),
    finished_at: iso(row.finished_at),
    run_after: iso(row.run_after)!,
    cancel_requested_at: iso(row.cancel_requested_at),
    priority: row.priority,
    concurrency_key: row.concurrency_key,
    parent_run_id: row.parent_run_id ?? null,
    root_run_id: row.root_run_id ?? null,
    detached: row.detached ?? false,
    ...(occurrence ?? {}),
    ...("waiting_reason" in row && row.waiting_reason !== undefined
      ? { waiting_for: waitingFor(row, row.waiting_reason) }
      : {}),
    ...(steps ? { steps: steps.map(toRunStep) } : {}),
  };
}

/** A durable call as `GET /v1/runs/{id}` shows it. */
export function toRunStep(s: StepSummary): RunStep {
  return {
    name: s.name,
    seq: s.seq,
    kind: s.kind,
    status: s.status,
    size: s.size,
    until: iso(s.until),
    signal_name: s.signal_name,
    attempt: s.attempt,
    error: s.error_message,
    started_at: iso(s.started_at)!,
    completed_at: iso(s.completed_at),
  };
}

/**
 * A timestamp as RFC 3339; `infinity` for Postgres' infinity (the
 * `run_after` of a run waiting for a signal without a timeout), which
 * postgres.js reads as an invalid Date.
 */
function iso(d: Date | null): string | null {
  if (d === null) return null;
  const t = new Date(d);
  return Number.isNaN(t.getTime()) ? "infinity" : t.toISOString();
}

/** Most events one run's timeline returns. */
export const MAX_RUN_EVENTS = 1000;

/** A work_events row as JSON. */
export function toRunEvent(row: RunEventRow): RunEvent {
  const iso = (d: Date | null) => (d === null ? null : new Date(d).toISOString());
  // Typed, not parsed again: the statements of db/ write only the
  // contract's types and payloads (tests/db_events_test.ts parses each).
  return {
    seq: row.seq,
    type: row.type,
    payload: row.payload,
    at: iso(row.at)!,
    published_at: iso(row.published_at),
    parked_at: iso(row.parked_at),
  } as RunEvent;
}
