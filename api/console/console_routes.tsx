/**
 * The console at /console, served by the API process. Pages are shells
 * without tenant data (no token travels on a navigation); their data comes
 * from /console/fragments/*, behind the same bearer tokens as /v1, fetched
 * by /console/app.js; an open run's page follows /console/live/runs/{id},
 * the run's event stream (api/run_stream.ts) behind the same tokens, and
 * reloads its fragment on each event. Every response carries a strict
 * Content-Security-Policy:
 * only same-origin script, style and fetches, no inline script or style, no
 * framing, no form posts elsewhere.
 */
import { Hono, type MiddlewareHandler } from "hono";
import { z } from "zod";
import { PoimenError } from "../../core/errors.ts";
import { UUID_PATTERN, uuidv7Floor } from "../../core/uuid.ts";
import { HEADERS, ListRunsQuery } from "../../contracts/runs.ts";
import type { Sql } from "../../db/pool.ts";
import { selectRun, selectRunEvents } from "../../db/runs.ts";
import { selectStepSummaries } from "../../db/run_steps.ts";
import {
  selectAdmissionsPerMinute,
  selectTenantQueue,
  selectTenantWaitingVersions,
} from "../../db/queue_overview.ts";
import { selectTenantQuota } from "../../db/tenant_quotas.ts";
import {
  selectTenantWaitingGroups,
  selectTenantWaitingTotals,
} from "../../db/concurrency_overview.ts";
import type { ApiEnv } from "../app.ts";
import type { Authenticator } from "../auth.ts";
import type { Logger } from "../../core/log.ts";
import type { RunWatch } from "../run_watch.ts";
import { parseQuery } from "../request.ts";
import { runEventsResponse } from "../runs.ts";
import { MAX_RUN_EVENTS, toRun, toRunEvent } from "../run_json.ts";
import { listRunsPage } from "../run_list.ts";
import type { ConsoleAssets } from "./assets.ts";
import { QueueFragment, RunFragment, RunsFragment } from "./fragments.tsx";
import { tenantVersions, WorkflowsFragment } from "./workflows.tsx";
import { selectVersionListing } from "../../db/workflow_current.ts";
import { loginShell, renderShell } from "./pages.tsx";
import { CONSOLE_SCHEDULES, SchedulesFragment } from "./schedules.tsx";
import { selectSchedules } from "../../db/schedules.ts";
import { toSchedule } from "../schedules.ts";

/** The console's Content-Security-Policy. */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "form-action 'self'",
  "frame-ancestors 'none'",
  "base-uri 'none'",
].join("; ");

/** What the console's routes need. */
export interface ConsoleDeps {
  sql: Sql;
  auth: Authenticator;
  assets: ConsoleAssets;
  log: Logger;
  /** Wakes a run page's event stream; without it, run pages are not live (503). */
  watch?: RunWatch;
  /** An idle event stream's comment-line interval (RUN_STREAM_HEARTBEAT_MS). */
  heartbeatMs?: number;
}

const securityHeaders: MiddlewareHandler<ApiEnv> = async (c, next) => {
  await next();
  c.res.headers.set("content-security-policy", CONSOLE_CSP);
  c.res.headers.set("x-content-type-options", "nosniff");
  c.res.headers.set("referrer-policy", "no-referrer");
  c.res.headers.set("x-frame-options", "DENY");
  // Tenant data must not linger in a shared cache or the back-forward cache.
  c.res.headers.set("cache-control", "no-store");
};

// A run page lists this many of its children; the rest are a link away.
const CHILDREN_SHOWN = 50;

// The /v1/runs query, except that the filter form sends its empty fields,
// which mean "any".
const ConsoleRunsQuery = z.preprocess(
  (q) =>
    Object.fromEntries(Object.entries(q as Record<string, string>).filter(([, v]) => v !== "")),
  ListRunsQuery,
);

/** Routes under /console. */
export function consoleRoutes(deps: ConsoleDeps): Hono<ApiEnv> {
  const { sql, assets } = deps;
  const app = new Hono<ApiEnv>();
  app.use("*", securityHeaders);

  app.get("/app.js", (c) => {
    c.header("content-type", "text/javascript; charset=utf-8");
    return c.body(assets.appJs);
  });
  app.get("/console.css", (c) => {
    c.header("content-type", "text/css; charset=utf-8");
    return c.body(assets.css);
  });

  app.get("/", (c) => c.redirect("/console/runs", 303));
  app.get("/login", async (c) => c.html(await loginShell()));
  // Only reached when the script did not take the form over: the token is
  // not read, and the person is sent back to the form.
  app.post("/login", (c) => c.redirect("/console/login", 303));
  app.get(
    "/runs",
    async (c) =>
      c.html(
        await renderShell({ page: "runs", title: "Runs", fragment: "/console/fragments/runs" }),
      ),
  );
  app.get("/runs/:run_id", async (c) => {
    const runId = c.req.param("run_id");
    if (!UUID_PATTERN.test(runId)) throw new PoimenError("not-found", "no such run");
    return c.html(
      await renderShell({
        page: "run",
        title: "Run",
        fragment: `/console/fragments/runs/${runId}`,
        live: `/console/live/runs/${runId}`,
      }),
    );
  });
  app.get("/queue", async (c) =>
    c.html(
      await renderShell({ page: "queue", title: "Queue", fragment: "/console/fragments/queue" }),
    ));

  app.get("/workflows", async (c) =>
    c.html(
      await renderShell({
        page: "workflows",
        title: "Workflows",
        fragment: "/console/fragments/workflows",
      }),
    ));

  app.get("/schedules", async (c) =>
    c.html(
      await renderShell({
        page: "schedules",
        title: "Schedules",
        fragment: "/console/fragments/schedules",
      }),
    ));

  // Fragments and streams: bearer tokens (app.js sends the tab's), as /v1.
  const authenticated: MiddlewareHandler<ApiEnv> = async (c, next) => {
    c.set(
      "principal",
      await deps.auth.authenticate(c.req.header("authorization"), c.req.header(HEADERS.tenant)),
    );
    await next();
  };
  app.use("/fragments/*", authenticated);
  app.use("/live/*", authenticated);

  app.get("/fragments/whoami", (c) => c.json({ tenant: c.get("principal").tenantId }));

  app.get("/fragments/runs", async (c) => {
    const q = parseQuery(c, ConsoleRunsQuery);
    const tenant = c.get("principal").tenantId;
    // The list shows neither input nor result: never read them (a run's page does).
    const { runs, next_cursor: next } = await listRunsPage(sql, tenant, { ...q, fields: [] });
    return c.html(
      <RunsFragment
        tenant={tenant}
        filter={{
          status: q.status,
          parent_run_id: q.parent_run_id,
          goal_id: q.goal_id,
          dispatch_key: q.dispatch_key,
          limit: c.req.query("limit") ? q.limit : undefined,
        }}
        runs={runs}
        nextCursor={next}
        paged={q.cursor !== undefined}
      />,
    );
  });

  app.get("/fragments/runs/:run_id", async (c) => {
    const runId = c.req.param("run_id");
    const tenant = c.get("principal").tenantId;
    const row = UUID_PATTERN.test(runId)
      ? await selectRun(sql, tenant, runId, { waiting: true })
      : undefined;
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    const [events, steps, children] = await Promise.all([
      selectRunEvents(sql, tenant, runId, MAX_RUN_EVENTS),
      selectStepSummaries(sql, tenant, runId),
      listRunsPage(sql, tenant, { parent_run_id: runId, limit: CHILDREN_SHOWN }),
    ]);
    return c.html(
      <RunFragment
        tenant={tenant}
        run={toRun(row, steps)}
        events={events.map(toRunEvent)}
        eventSeq={row.event_seq}
        tree={{ children: children.runs, more: children.next_cursor !== null }}
      />,
    );
  });

  // The run's event stream, as GET /v1/runs/{id}/events sends it with
  // Accept: text/event-stream. Fetched (not EventSource, which cannot send
  // the bearer token; the console has no cookie to send instead), so it
  // answers the stream whatever the Accept header.
  app.get("/live/runs/:run_id", async (c) => {
    const runId = c.req.param("run_id");
    const tenant = c.get("principal").tenantId;
    const row = UUID_PATTERN.test(runId) ? await selectRun(sql, tenant, runId) : undefined;
    if (!row) throw new PoimenError("not-found", `no run ${runId}`);
    if (!deps.watch) {
      throw new PoimenError("busy", "this API process does not offer live updates");
    }
    // A full API answers 503 (busy) and the page falls back to reloads.
    return runEventsResponse({ ...deps, sql, watch: deps.watch }, tenant, runId, c.req.raw);
  });

  app.get("/fragments/queue", async (c) => {
    const tenant = c.get("principal").tenantId;
    const now = new Date();
    const since = new Date(now.getTime() - 60 * 60_000);
    // A minute of slack below the id bound: ids come from the API's clock,
    // created_at from the database's.
    const [queue, waiting, perMinute, quota, limitedGroups, limitedTotals] = await Promise.all([
      selectTenantQueue(sql, tenant),
      selectTenantWaitingVersions(sql, tenant),
      selectAdmissionsPerMinute(sql, tenant, since, uuidv7Floor(since.getTime() - 60_000)),
      selectTenantQuota(sql, tenant),
      selectTenantWaitingGroups(sql, tenant),
      selectTenantWaitingTotals(sql, tenant),
    ]);
    return c.html(
      <QueueFragment
        tenant={tenant}
        queue={queue}
        waiting={waiting}
        perMinute={perMinute}
        now={now}
        quota={quota}
        limited={{ groups: limitedGroups, totals: limitedTotals }}
      />,
    );
  });

  app.get("/fragments/workflows", async (c) => {
    const tenant = c.get("principal").tenantId;
    const versions = tenantVersions(await selectVersionListing(sql), tenant);
    return c.html(<WorkflowsFragment tenant={tenant} versions={versions} />);
  });

  app.get("/fragments/schedules", async (c) => {
    const tenant = c.get("principal").tenantId;
    const rows = await selectSchedules(sql, tenant, { limit: CONSOLE_SCHEDULES + 1 });
    return c.html(
      <SchedulesFragment
        tenant={tenant}
        schedules={rows.slice(0, CONSOLE_SCHEDULES).map(toSchedule)}
        more={rows.length > CONSOLE_SCHEDULES}
      />,
    );
  });

  return app;
}
