/**
 * `deno task api`: serves the HTTP API until SIGTERM/SIGINT, then finishes
 * the requests in flight and closes the pool (core/process_harness.ts: a
 * second signal forces the exit).
 */
import client from "prom-client";
import { processEnv } from "../core/config.ts";
import { createLogger } from "../core/log.ts";
import { named, runProcess } from "../core/process_harness.ts";
import { abortable } from "../core/health.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { createPool, ping } from "../db/pool.ts";
import { guardDriverFaults } from "../db/driver_guard.ts";
import { notifyChannels, OUTBOX_CHANNEL, QUEUE_CHANNEL } from "../db/notify.ts";
import { Admission } from "../admission/admit.ts";
import { Waker } from "../core/waker.ts";
import { WorkflowCatalog } from "../admission/catalog.ts";
import { QuotaGate } from "../admission/quota.ts";
import { ScheduleTicker } from "../admission/schedule_ticker.ts";
import { RunWatch, tenantShare } from "./run_watch.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { ApiEnv, readApiConfig } from "./config.ts";
import { createApp } from "./app.ts";
import { Authenticator } from "./auth.ts";
import { createApiMetrics } from "./metrics.ts";
import { BodyBudget } from "./body_budget.ts";
import { loadConsoleAssets } from "./console/assets.ts";

const COMMAND = {
  name: "api",
  synopsis: "",
  description: `
Serves the HTTP API (POST/GET /v1/runs, /openapi.json, /metrics, /healthz,
/readyz) and the web console (/console) on HOST:PORT until SIGTERM or SIGINT;
its /metrics there has only the series that name no tenant. Every series, per
tenant too, with /healthz and /readyz, on API_METRICS_HOST:API_METRICS_PORT.
Validates run input against the workflow catalog the workers register in; it
loads no workflow code.`,
  env: ApiEnv,
} satisfies CommandSpec;

/** Serves the API until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readApiConfig(processEnv());
  const log = createLogger("api", config.LOG_LEVEL);
  const sql = createPool({
    url: config.DATABASE_URL,
    max: config.DATABASE_POOL_SIZE,
    applicationName: "poimen-api",
  });
  const metrics = createApiMetrics(new client.Registry());
  guardDriverFaults(log, metrics.registry);
  // One NOTIFY after admissions commit wakes both the workers (runs queued)
  // and the outbox publisher (their run.admitted events are pending).
  const waker = new Waker(
    () => notifyChannels(sql, [QUEUE_CHANNEL, OUTBOX_CHANNEL]),
    (err) => log.warn("wake-up failed", { error: err }),
  );
  // What workers registered: the API validates input against it and loads
  // no workflow code.
  const catalog = new WorkflowCatalog(sql, {
    refreshMs: config.CATALOG_REFRESH_MS,
    listen: () =>
      createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-api-listen" }),
    log,
  });
  const admission = new Admission(sql, catalog, {
    maxBatch: config.ADMISSION_MAX_BATCH,
    maxConcurrent: config.ADMISSION_MAX_CONCURRENT,
    defaultMaxAttempts: config.DEFAULT_MAX_ATTEMPTS,
  }, {
    onCreated: () => waker.poke(),
    onCall: (entry) => metrics.admissionCalls.inc({ entry }),
    onFlush: (size) => metrics.admissionBatch.observe(size),
  });
  // Schedules tick in every API process, which has the admission kernel and
  // the catalog already: no process to add, no leader; the occurrence's
  // dispatch key makes each one start once however many APIs tick.
  const ticker = new ScheduleTicker(sql, admission, {
    intervalMs: config.SCHEDULE_TICK_MS,
    log,
  });
  // Per-tenant quotas: a 429 before admission for a tenant over one.
  const quota = new QuotaGate(sql, {
    refreshMs: config.QUOTA_REFRESH_MS,
    log,
    onRefused: (tenant, reason) => metrics.quotaRefused(tenant, reason),
  });
  metrics.watchQuotas(() => quota.view());
  const auth = new Authenticator(sql, config.AUTH_CACHE_MS, {
    onFailure: (reason) => metrics.authFailures.inc({ reason }),
    log,
  });
  // Wakes waits and event streams on the commits that change runs.
  const watch = new RunWatch(sql, {
    listen: () =>
      createPool({ url: config.DATABASE_URL, max: 1, applicationName: "poimen-api-watch" }),
    maxWatchers: config.RUN_WATCHERS_MAX,
    maxPerTenant: config.RUN_WATCHERS_PER_TENANT ?? tenantShare(config.RUN_WATCHERS_MAX),
    streamMaxMs: config.RUN_STREAM_MAX_MS,
    streamStallMs: config.RUN_STREAM_STALL_MS,
    log,
  });
  metrics.watchRunWatchers(() => watch.watchers);
  metrics.watchRunStreams(watch.streamStats);
  const app = createApp({
    sql,
    admission,
    auth,
    metrics,
    log,
    bodyLimit: config.BODY_LIMIT_BYTES,
    bodyBudget: {
      bytes: metrics.watchBodyBudget(
        new BodyBudget(config.BODY_BUDGET_BYTES, {
          tenantBytes: config.BODY_BUDGET_TENANT_BYTES,
          serviceBytes: config.BODY_BUDGET_SERVICE_BYTES,
        }),
      ),
      waitMs: config.BODY_BUDGET_WAIT_MS,
      readTimeoutMs: config.BODY_READ_TIMEOUT_MS,
    },
    watch,
    heartbeatMs: config.RUN_STREAM_HEARTBEAT_MS,
    quota,
    consoleAssets: loadConsoleAssets(),
  });

  let server: Deno.HttpServer | undefined;
  return await runProcess([
    // Closed last, once the requests in flight have finished (their admissions commit).
    { name: "pool", stop: () => sql.end({ timeout: 5 }) },
    // The operators' scrape: the tenant-free series and the per-tenant ones,
    // which the API port never serves.
    metricsPart(metrics.everySeries, config.API_METRICS_HOST, config.API_METRICS_PORT, log, {
      probes: { postgres: (signal) => abortable(ping(sql), signal) },
    }),
    named("workflow catalog", catalog),
    named("tenant quotas", quota),
    named("schedule ticker", ticker),
    {
      name: "http server",
      start() {
        const listening = Promise.withResolvers<void>();
        server = Deno.serve({
          port: config.PORT,
          hostname: config.HOST,
          onListen: ({ hostname, port }) => {
            log.info("listening", { url: `http://${hostname}:${port}` });
            listening.resolve();
          },
        }, app.fetch);
        return listening.promise;
      },
      stop: async () => await server?.shutdown(),
    },
    // Stopped before the server: waits answer with what they have and
    // streams end, so the server's shutdown does not wait out a minute-long wait.
    named("run watch", watch),
  ], { log });
}
