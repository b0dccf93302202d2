/**
 * The worker as a whole process: `@poimen/poimen/worker`.
 *
 * ```ts
 * import { runWorker } from "@poimen/poimen/worker";
 * import { invoice, refund } from "./workflows.ts";
 *
 * await runWorker({ workflows: [invoice, refund] });
 * ```
 *
 * `runWorker` reads the same environment as `deno task worker`
 * (DATABASE_URL, WORKER_CONCURRENCY, …; docs/configuration.md), registers
 * the workflows in the catalog, serves `/metrics`, `/healthz` and `/readyz`,
 * and runs until SIGTERM or SIGINT, then stops gracefully. It resolves with
 * the process's exit code, also set as `Deno.exitCode`: 0 after a graceful
 * stop, 2 when the configuration is wrong or a workflow version is
 * registered with another definition (one line on stderr), 1 otherwise. For
 * a worker inside a process of your own, use `createWorker`.
 *
 * Permissions: `--allow-net` (Postgres, the metrics port), `--allow-env`,
 * `--allow-sys=hostname` (the default worker id), plus what your handlers
 * use. Handlers get every permission the process has; to keep the worker's
 * variables from them, give `workflows` as a function that revokes env
 * access before it imports their code (see `RunWorkerOptions.workflows`).
 *
 * @module
 */
import client from "prom-client";
import { processEnv } from "../core/config.ts";
import { isRefusal } from "../core/errors.ts";
import { named, runProcess, stopDeadline } from "../core/process_harness.ts";
import { createLogger } from "../core/log.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { abortable } from "../core/health.ts";
import { ping } from "../db/pool.ts";
import { guardDriverFaults } from "../db/driver_guard.ts";
import { queueStats } from "../db/queue_stats.ts";
import type { Workflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { defaultWorkerId, readWorkerConfig } from "./config.ts";
import { createWorkerMetrics } from "./metrics.ts";
import { slotCorrectionMetric } from "./slot_reconciler.ts";
import { laneRepairMetric } from "./lane_repairer.ts";
import { Worker } from "./worker.ts";

export { createWorker, type CreateWorkerOptions, type PoimenWorker } from "./create_worker.ts";
import { workerPools } from "./create_worker.ts";
export type {
  ConcurrencyLimit,
  DurableContext,
  Fields,
  InputSchema,
  Logger,
  Signal,
  StepOptions,
  WaitForSignalOptions,
  Workflow,
  WorkflowContext,
  WorkflowOptions,
} from "../workflows/define.ts";

/** What `runWorker` takes. */
export interface RunWorkerOptions {
  /**
   * The workflow versions this process hosts (made with `defineWorkflow`);
   * at least one. Or a function returning them, called once the
   * configuration has been read: it may give up permissions the handlers
   * must not have (`Deno.permissions.revoke({ name: "env" })`) and then
   * import their code, so not even a module's top-level code sees them.
   */
  workflows:
    // deno-lint-ignore no-explicit-any
    | readonly Workflow<any>[]
    // deno-lint-ignore no-explicit-any
    | (() => readonly Workflow<any>[] | Promise<readonly Workflow<any>[]>);
  /** The environment to read; `Deno.env` by default. */
  env?: Record<string, string | undefined>;
}

/**
 * Runs a worker process hosting `workflows` until SIGTERM/SIGINT; resolves
 * with the exit code (and sets `Deno.exitCode`). See the module comment.
 */
export async function runWorker(options: RunWorkerOptions): Promise<number> {
  let code: number;
  try {
    code = await serve(options);
  } catch (err) {
    if (!isRefusal(err) && !(err instanceof TypeError)) throw err;
    console.error(err.message);
    code = 2;
  }
  Deno.exitCode = code;
  return code;
}

async function serve(options: RunWorkerOptions): Promise<number> {
  const cfg = readWorkerConfig(options.env ?? processEnv());
  const registry = new WorkflowRegistry(
    typeof options.workflows === "function" ? await options.workflows() : options.workflows,
  );
  if (registry.list().length === 0) throw new TypeError("runWorker: no workflows given");
  const id = cfg.WORKER_ID ?? defaultWorkerId();
  const log = createLogger("worker", cfg.LOG_LEVEL);
  const { sql, listener, leaderSession } = workerPools(
    cfg.DATABASE_URL,
    cfg.DATABASE_POOL_SIZE,
    id,
  );
  const metricsRegistry = new client.Registry();
  guardDriverFaults(log, metricsRegistry);
  const metrics = createWorkerMetrics(
    metricsRegistry,
    // The queue-wide gauges are the leader's to report: one process reads
    // the queue per scrape interval, not every worker. Only called at
    // scrape time, after `worker` exists.
    () => worker.isLeader ? queueStats(sql) : Promise.resolve(null),
    () => worker.inFlight,
    log,
    () => worker.isLeader,
  );
  const worker = new Worker(sql, registry, {
    id,
    concurrency: cfg.WORKER_CONCURRENCY,
    leaseMs: cfg.WORKER_LEASE_MS,
    pollMs: cfg.WORKER_POLL_MS,
    retryBaseMs: cfg.WORKER_RETRY_BASE_MS,
    shutdownMs: cfg.WORKER_SHUTDOWN_MS,
    resultMaxBytes: cfg.RUN_RESULT_MAX_BYTES,
    stepMaxBytes: cfg.RUN_STEP_MAX_BYTES,
    suspendAfterMs: cfg.WORKER_SUSPEND_AFTER_MS,
    wakeMs: cfg.WORKER_WAKE_MS,
    log,
    hooks: {
      ...metrics.hooks,
      onSlotCorrected: slotCorrectionMetric(metricsRegistry),
      onLaneRepaired: laneRepairMetric(metricsRegistry),
    },
    listener,
    leaderSession,
  });
  return await runProcess([
    // Closed last: everything above uses it.
    { name: "pool", stop: () => sql.end({ timeout: 5 }) },
    // Served first: readiness must be askable while Postgres is still away.
    metricsPart(metricsRegistry, cfg.WORKER_METRICS_HOST, cfg.WORKER_METRICS_PORT, log, {
      probes: { postgres: (signal) => abortable(ping(sql), signal) },
    }),
    named("worker", worker),
  ], { log, stopDeadlineMs: stopDeadline(cfg.WORKER_SHUTDOWN_MS) });
}
