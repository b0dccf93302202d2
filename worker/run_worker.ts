/**
 * The worker as a whole process: `@poimen/poimen/worker`.
 *
 * ```ts
 * import { runWorker } from "@poimen/poimen/worker";
 * import { invoice, refund } from "./worker_impls.ts"; // implement(definition, handler)
 *
 * Deno.exitCode = await runWorker({ workflows: [invoice, refund] });
 * ```
 *
 * `runWorker` reads the same environment as `deno task worker`
 * (DATABASE_URL, WORKER_CONCURRENCY, …; docs/configuration.md), registers
 * the workflows in the catalog, serves `/metrics`, `/healthz` and `/readyz`,
 * and runs until SIGTERM or SIGINT, then stops gracefully. It resolves with
 * the process's exit code, for the caller to set (`Deno.exitCode`): 0 after
 * a graceful stop, 2 when the configuration is wrong or a workflow version
 * is registered with another definition (one line on stderr), 1 otherwise.
 * For a worker inside a process of your own, use `createWorker`.
 *
 * Permissions: `--allow-net` (Postgres, the metrics port), `--allow-env`,
 * `--allow-sys=hostname` (the default worker id), plus what your handlers
 * use. Handlers get every permission the process has; to keep the worker's
 * variables from them, give `workflows` as a function that revokes env
 * access before it imports their code (see `RunWorkerOptions.workflows`).
 *
 * @module
 */
import { Registry } from "prom-client";
import { processEnv } from "../core/config.ts";
import { isRefusal } from "../core/errors.ts";
import { named, runProcess, stopDeadline } from "../core/process_harness.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { abortable } from "../core/health.ts";
import { ping } from "../db/pool.ts";
import { guardDriverFaults } from "../db/driver_guard.ts";
import type { Workflow } from "../workflows/define.ts";
import { defaultWorkerId, readWorkerConfig } from "./config.ts";
import { assembleWorker, type MetricsRegistry } from "./create_worker.ts";

export {
  createWorker,
  type CreateWorkerOptions,
  type MetricsRegistry,
  type PoimenWorker,
} from "./create_worker.ts";
export type {
  ChildRun,
  ConcurrencyLimit,
  DebounceOptions,
  DeclaredSchedule,
  DefinitionOptions,
  DurableContext,
  Fields,
  InputSchema,
  Logger,
  MapOptions,
  ScheduleDeclaration,
  Schema,
  Signal,
  SignalPayload,
  SignalSchemas,
  StartOptions,
  StepOptions,
  WaitForSignalOptions,
  Workflow,
  WorkflowContext,
  WorkflowDefinition,
  WorkflowHandler,
  WorkflowInput,
  WorkflowOptions,
  WorkflowResult,
} from "../workflows/define.ts";
export { ChildRunFailed } from "../workflows/define.ts";

/** What `runWorker` takes. */
export interface RunWorkerOptions {
  /**
   * The workflow versions this process hosts: implementations (`implement`,
   * or `defineWorkflow` with a handler); at least one. Or a function
   * returning them, called once the configuration has been read: it may
   * give up permissions the handlers must not have
   * (`Deno.permissions.revoke({ name: "env" })`) and then import their
   * code, so not even a module's top-level code sees them.
   */
  workflows:
    // deno-lint-ignore no-explicit-any
    | readonly Workflow<any>[]
    // deno-lint-ignore no-explicit-any
    | (() => readonly Workflow<any>[] | Promise<readonly Workflow<any>[]>);
  /** The environment to read; `Deno.env` by default. */
  env?: Record<string, string | undefined>;
  /** Where log lines go; JSON lines on stderr at LOG_LEVEL by default. */
  log?: Logger;
  /**
   * The prom-client registry `/metrics` serves, with the worker's metrics
   * put on it beside the caller's own; a registry of its own by default.
   */
  metricsRegistry?: MetricsRegistry;
}

/**
 * Runs a worker process hosting `workflows` until SIGTERM/SIGINT; resolves
 * with the exit code, which it leaves to the caller to set. See the module
 * comment.
 */
export async function runWorker(options: RunWorkerOptions): Promise<number> {
  try {
    return await serve(options);
  } catch (err) {
    if (!isRefusal(err) && !(err instanceof TypeError)) throw err;
    // The process's one line saying why it will not start (exit 2).
    console.error(err.message);
    return 2;
  }
}

async function serve(options: RunWorkerOptions): Promise<number> {
  const cfg = readWorkerConfig(options.env ?? processEnv());
  const workflows = typeof options.workflows === "function"
    ? await options.workflows()
    : options.workflows;
  if (workflows.length === 0) throw new TypeError("runWorker: no workflows given");
  const log = options.log ?? createLogger("worker", cfg.LOG_LEVEL);
  const metricsRegistry = (options.metricsRegistry ?? new Registry()) as Registry;
  guardDriverFaults(log, metricsRegistry);
  const { worker, sql } = assembleWorker({
    workflows,
    databaseUrl: cfg.DATABASE_URL,
    concurrency: cfg.WORKER_CONCURRENCY,
    leaseMs: cfg.WORKER_LEASE_MS,
    pollMs: cfg.WORKER_POLL_MS,
    retryBaseMs: cfg.WORKER_RETRY_BASE_MS,
    shutdownMs: cfg.WORKER_SHUTDOWN_MS,
    resultMaxBytes: cfg.RUN_RESULT_MAX_BYTES,
    id: cfg.WORKER_ID ?? defaultWorkerId(),
    poolSize: cfg.DATABASE_POOL_SIZE,
    stepMaxBytes: cfg.RUN_STEP_MAX_BYTES,
    suspendAfterMs: cfg.WORKER_SUSPEND_AFTER_MS,
    wakeMs: cfg.WORKER_WAKE_MS,
    log,
    metricsRegistry,
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
