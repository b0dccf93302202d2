/** The runs resource: admission (one run, or a batch: api/run_batch.ts), one run, and a tenant's runs with keyset pagination. */
import { Hono, type MiddlewareHandler } from "hono";
import { PoimenError } from "../core/errors.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import type { Sql } from "../db/pool.ts";
import { selectRun, selectRunEvents } from "../db/runs.ts";
import { cancelTree } from "../db/cascade.ts";
import { notifyCancels, notifyChannels, OUTBOX_CHANNEL } from "../db/notify.ts";
import type { Logger } from "../core/log.ts";
import type { Admission } from "../admission/admit.ts";
import type { QuotaGate } from "../admission/quota.ts";
import { HEADERS, IdempotencyKeyHeader, ListRunsQuery, RunRequest } from "../contracts/runs.ts";
import type { ApiEnv } from "./app.ts";
import { admitCaller, admitChecked, debouncedRun, refuseReservedKey } from "./run_admit.ts";
import { answerBatch } from "./run_batch.ts";
import { limitBody, parseJsonBody, parseQuery, parseWith, requireJson } from "./request.ts";
import type { ApiMetrics } from "./metrics.ts";
import type { BodyBudget } from "./body_budget.ts";
import type { RunWatch } from "./run_watch.ts";
import { preferredWait, readRunWaiting } from "./run_wait.ts";
import { lastEventId, runEventStream } from "./run_stream.ts";
import { MAX_RUN_EVENTS, toRun, toRunEvent } from "./run_json.ts";
import { listRunsPage } from "./run_list.ts";
import { answerSignal } from "./run_signals.ts";
import { selectStepSummaries } from "../db/run_steps.ts";

// The children GET /v1/runs/{id} lists; the rest are a page of GET /v1/runs?parent_run_id= away.
const MAX_CHILDREN = 100;

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
function withIdempotencyKey(body: RunRequest, header: string | undefined): RunRequest {
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

/** Routes under /v1/runs. */
export function runsRoutes(deps: RunsDeps): Hono<ApiEnv> {
  const { sql, metrics } = deps;
  const app = new Hono<ApiEnv>();

  // First, so that refusals by content type and size count as rejected
  // admissions too: an error below has become its problem response by the
  // time next() returns.
  const admissionMetrics: MiddlewareHandler<ApiEnv> = async (c, next) => {
    const started = performance.now();
    await next();
    // A wait after admission (Prefer: wait=N) is not admission's latency.
    const ended = c.get("admittedAt") ?? performance.now();
    // A batch (207) counts each of its items itself (api/run_batch.ts).
    if (c.res.status === 207) return;
    const outcome = c.res.status === 201
      ? "created"
      : c.get("debounced")
      ? "debounced"
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
      const raw = await parseJsonBody(c, deps.bodyBudget?.readTimeoutMs);
      if (Array.isArray(raw)) return await answerBatch(deps, c, raw);
      const parsed = parseWith(RunRequest, raw);
      const keyHeader = c.req.header(HEADERS.idempotencyKey);
      const body = withIdempotencyKey(parsed, keyHeader);
      const caller = admitCaller(c);
      const principal = caller.principal;
      refuseReservedKey(body, parsed.dispatch_key == null && keyHeader !== undefined, caller);
      const result = await admitChecked(deps, caller, body);
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
      run = debouncedRun(result, run);
      if (result.created) {
        c.header("Location", `/v1/runs/${run.run_id}`);
        return c.json(run, 201);
      }
      // Joined the pending run of its debounce key: no replay.
      if (result.debounced) {
        c.set("debounced", true);
        return c.json(run, 200);
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
    // Its durable calls, without their results: a short range, bounded.
    const run = toRun(row, await selectStepSummaries(sql, tenantId, runId));
    // Its children: one bounded page of the lineage index, without their values.
    const page = await listRunsPage(sql, tenantId, { parent_run_id: runId, limit: MAX_CHILDREN });
    const children = {
      runs: page.runs.map((r) => ({
        run_id: r.run_id,
        status: r.status,
        dispatch_key: r.dispatch_key ?? "",
      })),
      next_cursor: page.next_cursor,
    };
    return c.json({ ...run, children });
  });

  // A signal for the run: stored once per (name, signal_id), handed to its
  // first wait of that name, waking the run when it waits for it.
  app.post(
    "/:run_id/signals",
    requireJson,
    limitBody(deps.bodyLimit, deps.bodyBudget),
    (c) => answerSignal({ ...deps, readTimeoutMs: deps.bodyBudget?.readTimeoutMs }, c),
  );

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
  // Its unfinished, non-detached descendants are cancelled with it, in the
  // same transaction (db/cascade.ts), also when it was cancelled already.
  app.post("/:run_id/cancel", async (c) => {
    const runId = c.req.param("run_id");
    const tenantId = c.get("principal").tenantId;
    if (!UUID_PATTERN.test(runId)) throw new PoimenError("not-found", `no run ${runId}`);
    const tree = await cancelTree(sql, tenantId, runId);
    const requested = tree.run;
    const row = requested ?? await selectRun(sql, tenantId, runId);
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    if (row.status === "succeeded" || row.status === "failed") {
      throw new PoimenError("run-finished", `run ${runId} already ${row.status}`, {
        extensions: { run_status: row.status },
      });
    }
    // After the commit, as every wake-up: the running runs' workers look at
    // them now; cancelled runs' events are pending for the outbox. Rare enough
    // not to be coalesced; lost, it costs a heartbeat or an outbox poll.
    const running = [...(requested?.status === "running" ? [runId] : []), ...tree.running];
    const outbox = requested?.status === "cancelled" || tree.cancelled > 0;
    await Promise.all([
      notifyCancels(sql, tenantId, running),
      outbox ? notifyChannels(sql, [OUTBOX_CHANNEL]) : undefined,
    ]).catch((error) =>
      deps.log.warn("cancel notify failed", { tenant: tenantId, run_id: runId, error })
    );
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
