/**
 * The HTTP API (hono). `createApp` wires routes to their dependencies and is
 * what tests call with `app.request()`; `api/process.ts` serves it.
 */
import { type Context, Hono } from "hono";
import { routePath } from "hono/route";
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Sql } from "../db/pool.ts";
import { ping } from "../db/pool.ts";
import type { Admission } from "../admission/admit.ts";
import type { QuotaGate } from "../admission/quota.ts";
import { HEADERS } from "../contracts/runs.ts";
import { type Authenticator, type Principal } from "./auth.ts";
import type { ApiMetrics } from "./metrics.ts";
import type { BodyBudget } from "./body_budget.ts";
import { problemResponse } from "./problem.ts";
import { runsRoutes } from "./runs.ts";
import { schedulesRoutes } from "./schedules.ts";
import { openApiDocument } from "./openapi.ts";
import { abortable, checkReadiness } from "../core/health.ts";
import type { ConsoleAssets } from "./console/assets.ts";
import { consoleRoutes } from "./console/console_routes.tsx";
import type { RunWatch } from "./run_watch.ts";

/** Hono's typing of our context variables. */
export type ApiEnv = {
  Variables: {
    principal: Principal;
    /** Gives a request's body budget share back (api/request.ts `limitBody`); safe twice. */
    releaseBody?: () => void;
    /** When admission answered, for a POST that then waits (`Prefer: wait=N`). */
    admittedAt?: number;
    /** Set when an admission joined a debounced run (its metric outcome). */
    debounced?: boolean;
  };
};

export interface AppDeps {
  sql: Sql;
  admission: Admission;
  auth: Authenticator;
  metrics: ApiMetrics;
  log: Logger;
  bodyLimit: number;
  /** Bounds the request bodies held at once (api/body_budget.ts). */
  bodyBudget?: { bytes: BodyBudget; waitMs: number; readTimeoutMs?: number };
  /** The console's script and stylesheet (`loadConsoleAssets`). */
  consoleAssets: ConsoleAssets;
  /** Wakes waits and event streams (api/run_watch.ts); without it, neither is offered. */
  watch?: RunWatch;
  /** An idle event stream's comment-line interval (RUN_STREAM_HEARTBEAT_MS). */
  heartbeatMs?: number;
  /** Per-tenant quotas on admission (admission/quota.ts); without it, none. */
  quota?: QuotaGate;
}

// The route label of a request: the pattern of the route that matched
// (`/v1/runs/:run_id`), never the raw path, so a scan of random paths cannot
// explode the label cardinality. A request only middleware matched (no route
// for its path and method) is "other".
function routeLabel(c: Context): string {
  const route = routePath(c, -1);
  return route === "" || route.includes("*") ? "other" : route;
}

/** Builds the API application. */
export function createApp(deps: AppDeps): Hono<ApiEnv> {
  const { metrics, log } = deps;
  const app = new Hono<ApiEnv>();

  app.use("*", async (c, next) => {
    const started = performance.now();
    await next();
    metrics.observeRequest(
      c.req.method,
      routeLabel(c),
      c.res.status,
      c.get("principal")?.kind ?? "none",
      (performance.now() - started) / 1000,
    );
  });

  app.get("/healthz", (c) => c.json({ status: "ok" }));
  app.get("/readyz", async (c) => {
    const { ready, checks } = await checkReadiness(
      { postgres: (signal) => abortable(ping(deps.sql), signal) },
      log,
    );
    if (ready) return c.json({ status: "ready", checks });
    throw new PoimenError("database-unavailable", "the database does not answer");
  });
  // Anyone may read it: the series that name no tenant only (the per-tenant
  // ones are on the metrics listener, api/process.ts).
  app.get("/metrics", async (c) => {
    c.header("content-type", metrics.registry.contentType);
    return c.body(await metrics.registry.metrics());
  });
  app.get("/openapi.json", (c) => c.json(openApiDocument()));

  // Every /v1 answer, problems included (set after onError and notFound
  // answered): never sniffed into something else, never kept by a cache.
  app.use("/v1/*", async (c, next) => {
    await next();
    c.res.headers.set("x-content-type-options", "nosniff");
    c.res.headers.set("cache-control", "no-store");
  });
  app.use("/v1/*", async (c, next) => {
    const principal = await deps.auth.authenticate(
      c.req.header("authorization"),
      c.req.header(HEADERS.tenant),
    );
    c.set("principal", principal);
    await next();
  });
  app.route("/v1/runs", runsRoutes(deps));
  app.route("/v1/schedules", schedulesRoutes(deps));
  app.route(
    "/console",
    consoleRoutes({
      sql: deps.sql,
      auth: deps.auth,
      assets: deps.consoleAssets,
      log,
      watch: deps.watch,
      heartbeatMs: deps.heartbeatMs,
    }),
  );

  // Answered rather than thrown: with only the "*" middleware matched, hono
  // lets a thrown not-found skip that middleware's metrics.
  app.notFound((c) => problemResponse(c, new PoimenError("not-found", "no such resource"), log));
  app.onError((err, c) => problemResponse(c, err, log));
  return app;
}
