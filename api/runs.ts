/** The runs resource: admission, one run, and a tenant's runs with keyset pagination. */
import { Hono, type MiddlewareHandler } from "hono";
import type { z } from "zod";
import { PoimenError } from "../core/errors.ts";
import { activeTraceparent, validTraceparent } from "../core/tracing.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import type { Sql } from "../db/pool.ts";
import {
  type RunEventRow,
  type RunListRow,
  type RunRow,
  selectRun,
  selectRunEvents,
  selectRuns,
  type WaitingReason,
} from "../db/runs.ts";
import { requestCancel } from "../db/cancellation.ts";
import { notifyCancel, notifyChannels, OUTBOX_CHANNEL } from "../db/notify.ts";
import type { Logger } from "../core/log.ts";
import type { Admission } from "../admission/admit.ts";
import type { QuotaGate } from "../admission/quota.ts";
import {
  HEADERS,
  IdempotencyKeyHeader,
  ListRunsQuery,
  RELAY_KEY_PREFIX,
  type Run,
  RUN_PAGE_MAX_BYTES,
  type RunEvent,
  RunRequest,
  SourceHeader,
  type WaitingFor,
} from "../contracts/runs.ts";
import type { ApiEnv } from "./app.ts";
import type { Principal } from "./auth.ts";
import { limitBody, parseJsonBody, parseQuery, parseWith, requireJson } from "./request.ts";
import type { ApiMetrics } from "./metrics.ts";
import type { BodyBudget } from "./body_budget.ts";
import type { RunWatch } from "./run_watch.ts";
import { preferredWait, readRunWaiting } from "./run_wait.ts";
import { lastEventId, runEventStream } from "./run_stream.ts";

export interface RunsDeps {
  sql: Sql;
  admission: Admission;
  metrics: ApiMetrics;
  log: Logger;
  bodyLimit: number;
  /** Bounds the bodies held at once (see api/body_budget.ts); none in tests that do not say. */
  bodyBudget?: { bytes: BodyBudget; waitMs: number; readTimeoutMs?: number };
  /**
   * Wakes waits (`Prefer: wait=N`) and event streams; without it (tests that
   * do not say) `Prefer` is ignored and events are JSON only.
   */
  watch?: RunWatch;
  /** An idle event stream's comment-line interval (RUN_STREAM_HEARTBEAT_MS). */
  heartbeatMs?: number;
  /** Per-tenant quotas (admission/quota.ts); without it (tests that do not say), none. */
  quota?: QuotaGate;
}

/** What a queued run waits for, for people and programs; null for any other run. */
export function waitingFor(
  row: Pick<RunRow, "workflow_name" | "workflow_version" | "run_after" | "concurrency_key"> & {
    slot_limit?: number | null;
    slot_running?: number | null;
  },
  reason: WaitingReason | null,
): WaitingFor | null {
  switch (reason) {
    case null:
      return null;
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
 * (selectRun's `waiting`).
 */
export function toRun(
  row: RunListRow & {
    waiting_reason?: WaitingReason | null;
    slot_limit?: number | null;
    slot_running?: number | null;
  },
): Run {
  const iso = (d: Date | null) => (d === null ? null : new Date(d).toISOString());
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
    ...("waiting_reason" in row && row.waiting_reason !== undefined
      ? { waiting_for: waitingFor(row, row.waiting_reason) }
      : {}),
  };
}

/** Most events one run's timeline returns. */
export const MAX_RUN_EVENTS = 1000;

/** A work_events row as JSON. */
export function toRunEvent(row: RunEventRow): RunEvent {
  const iso = (d: Date | null) => (d === null ? null : new Date(d).toISOString());
  return {
    seq: row.seq,
    type: row.type,
    payload: row.payload,
    at: iso(row.at)!,
    published_at: iso(row.published_at),
    parked_at: iso(row.parked_at),
  };
}

/** One page of `GET /v1/runs`, and the same as the JSON text the API answers with. */
export interface ListedPage {
  runs: Run[];
  next_cursor: string | null;
  /** `{"runs":[…],"next_cursor":…}`, each run serialized once, while it was measured. */
  json: string;
}

// Rows read at a time: small while a run may carry its input and result (each
// up to about 1 MiB), so that what is read past a full page stays small too.
const CHUNK_ROWS = { plain: 64, fields: 4 };

/**
 * One page of a tenant's runs, newest first, by keyset: at most `q.limit`
 * runs and at most `maxBytes` of JSON (RUN_PAGE_MAX_BYTES), whichever comes
 * first; a first run over `maxBytes` alone is a page of one. Rows are read
 * a few at a time and the reading stops with the page, so neither the API
 * nor Postgres handles much past it; one row more than the page tells
 * whether there is a next one. `input` and `result` only with `q.fields`.
 * Shared by `GET /v1/runs` and the console (which never asks for them).
 */
export async function listRunsPage(
  sql: Sql,
  tenant: string,
  q: z.infer<typeof ListRunsQuery>,
  maxBytes: number = RUN_PAGE_MAX_BYTES,
): Promise<ListedPage> {
  const fields = q.fields ?? [];
  const query = selectRuns(sql, tenant, {
    fields,
    goalId: q.goal_id,
    dispatchKey: q.dispatch_key,
    status: q.status,
    before: q.cursor === undefined ? undefined : decodeCursor(q.cursor),
    limit: q.limit + 1,
  });
  const runs: Run[] = [];
  const texts: string[] = [];
  // The page's frame: `{"runs":[`, `],"next_cursor":` and a cursor (a uuid in base64url).
  let bytes = '{"runs":[],"next_cursor":""}'.length + 48;
  let more = false;
  const chunk = Math.min(q.limit + 1, fields.length > 0 ? CHUNK_ROWS.fields : CHUNK_ROWS.plain);
  reading: for await (const rows of query.cursor(chunk)) {
    for (const row of rows) {
      const run = toRun(row);
      const text = JSON.stringify(run);
      const size = utf8Length(text) + (texts.length > 0 ? 1 : 0);
      if (runs.length === q.limit || (runs.length > 0 && bytes + size > maxBytes)) {
        more = true;
        break reading;
      }
      runs.push(run);
      texts.push(text);
      bytes += size;
    }
  }
  const next = more ? encodeCursor(runs[runs.length - 1].run_id) : null;
  const json = `{"runs":[${texts.join(",")}],"next_cursor":${JSON.stringify(next)}}`;
  return { runs, next_cursor: next, json };
}

/**
 * The UTF-8 length of a JSON text: `JSON.stringify` escapes lone
 * surrogates, so each surrogate here is half of a 4-byte pair.
 */
function utf8Length(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    n += c < 0x800 || (c >= 0xd800 && c <= 0xdfff) ? 1 : 2;
  }
  return n;
}

/** The cursor is opaque to clients: base64url of the last run id of a page. */
export function encodeCursor(runId: string): string {
  return btoa(runId).replaceAll("=", "");
}
/** The run id of a cursor; a validation error when it is not one of ours. */
export function decodeCursor(cursor: string): string {
  let runId = "";
  try {
    runId = atob(cursor);
  } catch { /* reported below */ }
  if (!UUID_PATTERN.test(runId)) {
    throw new PoimenError("validation", "bad cursor", {
      errors: [{ path: "cursor", message: "not a cursor returned by this API" }],
    });
  }
  return runId;
}

/**
 * A run's events as a server-sent event stream answering `req` (its
 * `Last-Event-ID`, its client going away): `GET /v1/runs/{id}/events` and
 * the console's live run page. The run must be the caller's (checked
 * before). Takes the watcher slot first, so a full API answers 503 `busy`
 * before any stream starts.
 */
export function runEventsResponse(
  deps: Pick<RunsDeps, "sql" | "log" | "heartbeatMs"> & { watch: RunWatch },
  tenantId: string,
  runId: string,
  req: Request,
): Response {
  const watcher = deps.watch.open(tenantId, runId);
  return runEventStream(
    {
      sql: deps.sql,
      watch: deps.watch,
      log: deps.log,
      toEvent: toRunEvent,
      heartbeatMs: deps.heartbeatMs,
    },
    tenantId,
    runId,
    lastEventId(req.headers.get("last-event-id")),
    watcher,
    req.signal,
  );
}

/** Whether an Accept header asks for a server-sent event stream (JSON stays the default). */
export function wantsEventStream(accept: string | undefined): boolean {
  return accept !== undefined && /(^|,)\s*text\/event-stream\s*(;|,|$)/i.test(accept);
}

/**
 * The request with its dispatch key from `Idempotency-Key`, when given: the
 * same key as the body's, or one in its place (absent or null there); a key
 * different from the body's is a 422 naming the header, since either could
 * be the caller's intent.
 */
export function withIdempotencyKey(body: RunRequest, header: string | undefined): RunRequest {
  if (header === undefined) return body;
  const path = `header.${HEADERS.idempotencyKey}`;
  const key = parseWith(IdempotencyKeyHeader, header, path);
  if (body.dispatch_key != null && body.dispatch_key !== key) {
    throw new PoimenError("validation", "the request does not match the schema", {
      errors: [{ path, message: "differs from the body's dispatch_key (give one, or the same)" }],
    });
  }
  return { ...body, dispatch_key: key };
}

/**
 * Refuses a dispatch key in the relay's reserved namespace (`kafka:`, see
 * `RELAY_KEY_PREFIX`) unless a service token sends it as the key of its own
 * `Poimen-Source`, as the relay does for a keyless message: 422 naming the
 * field the key came from.
 */
export function refuseReservedKey(
  body: RunRequest,
  fromHeader: boolean,
  principal: Pick<Principal, "kind">,
  source: string,
): void {
  const key = body.dispatch_key;
  if (key == null || !key.startsWith(RELAY_KEY_PREFIX)) return;
  if (principal.kind === "service" && key === source) return;
  throw new PoimenError("validation", "the request does not match the schema", {
    errors: [{
      path: fromHeader ? `header.${HEADERS.idempotencyKey}` : "dispatch_key",
      message: `the prefix ${RELAY_KEY_PREFIX} is reserved for the keys the inbox relay derives`,
    }],
  });
}

/** Routes under /v1/runs. */
export function runsRoutes(deps: RunsDeps): Hono<ApiEnv> {
  const { sql, admission, metrics } = deps;
  const app = new Hono<ApiEnv>();

  // First, so that refusals by content type and size count as rejected
  // admissions too: an error below has become its problem response by the
  // time next() returns.
  const admissionMetrics: MiddlewareHandler<ApiEnv> = async (c, next) => {
    const started = performance.now();
    await next();
    // A wait after admission (Prefer: wait=N) is not admission's latency.
    const ended = c.get("admittedAt") ?? performance.now();
    const outcome = c.res.status === 201
      ? "created"
      : c.res.status === 200
      ? "deduplicated"
      : "rejected";
    metrics.observeAdmission(outcome, (ended - started) / 1000);
  };

  app.post(
    "/",
    admissionMetrics,
    requireJson,
    limitBody(deps.bodyLimit, deps.bodyBudget),
    async (c) => {
      const parsed = parseWith(RunRequest, await parseJsonBody(c, deps.bodyBudget?.readTimeoutMs));
      const keyHeader = c.req.header(HEADERS.idempotencyKey);
      const body = withIdempotencyKey(parsed, keyHeader);
      const principal = c.get("principal");
      // Only a service token (the relay) may say where a request came from.
      const claimed = principal.kind === "service" ? c.req.header(HEADERS.source) : undefined;
      const source = claimed === undefined
        ? `http:${principal.name}`
        : parseWith(SourceHeader, claimed, `header.${HEADERS.source}`);
      refuseReservedKey(
        body,
        parsed.dispatch_key == null && keyHeader !== undefined,
        principal,
        source,
      );
      const admit = () =>
        admission.admit(body, {
          tenantId: principal.tenantId,
          source,
          entry: "http",
          // The API's request span when tracing is on, else the caller's trace.
          traceparent: activeTraceparent() ?? validTraceparent(c.req.header("traceparent")),
        });
      // Over a quota: a 429 before the run reaches the batcher, nothing written.
      const result = deps.quota ? await deps.quota.admit(principal.tenantId, admit) : await admit();
      let run = toRun(result.run);
      const wait = deps.watch && preferredWait(c.req.header("prefer"));
      if (deps.watch && wait !== undefined) {
        c.set("admittedAt", performance.now());
        // The body is parsed: its share of the budget goes back before the wait.
        c.get("releaseBody")?.();
        const { row, applied } = await readRunWaiting(
          sql,
          deps.watch,
          principal.tenantId,
          run.run_id,
          wait,
          c.req.raw.signal,
        );
        if (applied) c.header("Preference-Applied", `wait=${wait}`);
        if (row) run = toRun(row);
      }
      if (result.created) {
        c.header("Location", `/v1/runs/${run.run_id}`);
        return c.json(run, 201);
      }
      c.header(HEADERS.replayed, "true");
      if (!result.sameBody) {
        metrics.replayBodyMismatch.inc();
        c.header(HEADERS.bodyMismatch, "true");
      }
      return c.json(run, 200);
    },
  );

  app.get("/:run_id", async (c) => {
    const runId = c.req.param("run_id");
    // Not a uuid cannot be anyone's run: 404, not 422, so ids reveal nothing.
    const tenantId = c.get("principal").tenantId;
    const wait = deps.watch && preferredWait(c.req.header("prefer"));
    if (!UUID_PATTERN.test(runId)) throw new PoimenError("not-found", `no run ${runId}`);
    const { row, applied } = deps.watch && wait !== undefined
      ? await readRunWaiting(sql, deps.watch, tenantId, runId, wait, c.req.raw.signal)
      : { row: await selectRun(sql, tenantId, runId, { waiting: true }), applied: false };
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    if (applied) c.header("Preference-Applied", `wait=${wait}`);
    return c.json(toRun(row));
  });

  app.get("/:run_id/events", async (c) => {
    const runId = c.req.param("run_id");
    const tenantId = c.get("principal").tenantId;
    // The run first: its events may all be purged, and "no such run" must
    // stay a 404 (another tenant's run included), not an empty list.
    const row = UUID_PATTERN.test(runId) ? await selectRun(sql, tenantId, runId) : undefined;
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    if (deps.watch && wantsEventStream(c.req.header("accept"))) {
      return runEventsResponse({ ...deps, watch: deps.watch }, tenantId, runId, c.req.raw);
    }
    const events = await selectRunEvents(sql, tenantId, runId, MAX_RUN_EVENTS);
    return c.json({ events: events.map(toRunEvent) });
  });

  // Cancel: idempotent. A queued run is cancelled at once; a running run's
  // cancel is requested and its worker is told (a NOTIFY after the commit;
  // its heartbeat finds the request anyway). Finished runs are left alone.
  app.post("/:run_id/cancel", async (c) => {
    const runId = c.req.param("run_id");
    const tenantId = c.get("principal").tenantId;
    if (!UUID_PATTERN.test(runId)) throw new PoimenError("not-found", `no run ${runId}`);
    const requested = await requestCancel(sql, tenantId, runId);
    const row = requested ?? await selectRun(sql, tenantId, runId);
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    if (row.status === "succeeded" || row.status === "failed") {
      throw new PoimenError("run-finished", `run ${runId} already ${row.status}`, {
        extensions: { run_status: row.status },
      });
    }
    // After the commit, as every wake-up: the running run's worker looks at
    // it now; a cancelled run's event is pending for the outbox. Rare enough
    // not to be coalesced; lost, it costs a heartbeat or an outbox poll.
    if (requested) {
      await (requested.status === "running"
        ? notifyCancel(sql, tenantId, runId)
        : notifyChannels(sql, [OUTBOX_CHANNEL]))
        .catch((error) =>
          deps.log.warn("cancel notify failed", { tenant: tenantId, run_id: runId, error })
        );
    }
    if (requested) metrics.cancels.inc({ status: requested.status });
    return c.json(toRun(row));
  });

  app.get("/", async (c) => {
    const q = parseQuery(c, ListRunsQuery);
    const page = await listRunsPage(sql, c.get("principal").tenantId, q);
    // Serialized once, while the page was measured.
    return c.body(page.json, 200, { "content-type": "application/json" });
  });

  return app;
}
