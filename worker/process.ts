/**
 * `main.ts worker`: the executor process. Reads its configuration, opens the
 * pool, runs a `Worker` and its `/metrics`, `/healthz` and `/readyz` endpoint
 * (WORKER_METRICS_PORT) until SIGTERM/SIGINT, then stops gracefully and
 * closes the pool (core/process_harness.ts: a second signal forces the exit).
 */
import client from "prom-client";
import { processEnv } from "../core/config.ts";
import { named, runProcess, stopDeadline } from "../core/process_harness.ts";
import { createLogger } from "../core/log.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { abortable } from "../core/health.ts";
import { createPool, ping } from "../db/pool.ts";
import { guardDriverFaults } from "../db/driver_guard.ts";
import { queueStats } from "../db/queue_stats.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { defaultWorkerId, readWorkerConfig, workerEnvSchema } from "./config.ts";
import { createWorkerMetrics } from "./metrics.ts";
import { Worker } from "./worker.ts";

const COMMAND = {
  name: "worker",
  synopsis: "",
  description: `
Claims queued runs and executes them, WORKER_CONCURRENCY at a time, until
SIGTERM or SIGINT; serves /metrics, /healthz and /readyz on
WORKER_METRICS_HOST:WORKER_METRICS_PORT.`,
  env: workerEnvSchema,
} satisfies CommandSpec;

/** Runs the worker until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const cfg = readWorkerConfig(processEnv());
  const id = cfg.WORKER_ID ?? defaultWorkerId();
  const log = createLogger("worker", cfg.LOG_LEVEL);
  const sql = createPool({
    url: cfg.DATABASE_URL,
    max: cfg.DATABASE_POOL_SIZE,
    applicationName: `poimen-worker ${id}`.slice(0, 63),
  });
  const registry = new client.Registry();
  guardDriverFaults(log, registry);
  const metrics = createWorkerMetrics(
    registry,
    () => queueStats(sql),
    // Only called at scrape time, after `worker` exists.
    () => worker.inFlight,
    log,
  );
  const worker = new Worker(sql, builtinRegistry(), {
    id,
    concurrency: cfg.WORKER_CONCURRENCY,
    leaseMs: cfg.WORKER_LEASE_MS,
    pollMs: cfg.WORKER_POLL_MS,
    retryBaseMs: cfg.WORKER_RETRY_BASE_MS,
    shutdownMs: cfg.WORKER_SHUTDOWN_MS,
    resultMaxBytes: cfg.RUN_RESULT_MAX_BYTES,
    log,
    hooks: metrics.hooks,
    listener: () =>
      createPool({
        url: cfg.DATABASE_URL,
        max: 1,
        applicationName: `poimen-worker-listen ${id}`.slice(0, 63),
      }),
  });
  return await runProcess([
    // Closed last: everything above uses it.
    { name: "pool", stop: () => sql.end({ timeout: 5 }) },
    // Served first: readiness must be askable while Postgres is still away.
    metricsPart(registry, cfg.WORKER_METRICS_HOST, cfg.WORKER_METRICS_PORT, log, {
      probes: { postgres: (signal) => abortable(ping(sql), signal) },
    }),
    named("worker", worker),
  ], { log, stopDeadlineMs: stopDeadline(cfg.WORKER_SHUTDOWN_MS) });
}
