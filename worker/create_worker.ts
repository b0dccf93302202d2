/**
 * A worker for a team's own workflows, embedded in its own process:
 * `createWorker` from `@poimen/poimen/worker`. It opens its own Postgres
 * pools and closes them when it stops, and puts its metrics on the
 * caller's registry; `runWorker` (worker/run_worker.ts) wraps the same
 * worker as a whole process, with the environment, metrics server, health
 * and signals of `deno task worker`.
 */
import type { Registry } from "prom-client";
import type { Logger } from "../core/log.ts";
import { createLogger } from "../core/log.ts";
import { once } from "../core/lifecycle.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { queueStats } from "../db/queue_stats.ts";
import type { Workflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { Worker } from "./worker.ts";
import type { WorkerHooks } from "./hooks.ts";
import { defaultWorkerId, readWorkerConfig } from "./config.ts";
import { createWorkerMetrics } from "./metrics.ts";
import { slotCorrectionMetric } from "./slot_reconciler.ts";
import { laneRepairMetric } from "./lane_repairer.ts";

/**
 * A prom-client `Registry` (`npm:prom-client@15`), seen by what a worker
 * uses of it: its metrics are registered there, and `/metrics` reads it.
 */
export interface MetricsRegistry {
  /** Adds a metric (prom-client's metrics call it themselves). */
  registerMetric(metric: never): void;
  /** The metric of that name, if registered. */
  getSingleMetric(name: string): unknown;
  /** Removes the metric of that name. */
  removeSingleMetric(name: string): void;
  /** The registry's metrics in the Prometheus text format. */
  metrics(): Promise<string>;
  /** The content type of `metrics()`. */
  readonly contentType: string;
}

/** What `createWorker` takes; everything but `workflows` and `databaseUrl` has a default. */
export interface CreateWorkerOptions {
  /**
   * The workflow versions this worker hosts: implementations (`implement`,
   * or `defineWorkflow` with a handler); at least one.
   */
  // deno-lint-ignore no-explicit-any
  workflows: readonly Workflow<any>[];
  /** `postgres://…` of poimen's database (migrated: `deno task migrate` or `@poimen/poimen/migrate`). */
  databaseUrl: string;
  /** Runs executed at once; 4 by default. */
  concurrency?: number;
  /** How long a claim stays valid without a heartbeat; 30 s by default. */
  leaseMs?: number;
  /** Polling interval when no NOTIFY arrives; 1 s by default. */
  pollMs?: number;
  /** Base of the exponential retry backoff; 1 s by default. */
  retryBaseMs?: number;
  /** How long `stop()` waits for runs in flight before aborting and releasing them; 10 s by default. */
  shutdownMs?: number;
  /** Largest result of a run, as JSON bytes; 256 KiB by default. */
  resultMaxBytes?: number;
  /** Largest result of a durable step, as JSON bytes; 256 KiB by default. */
  stepMaxBytes?: number;
  /** A sleep or signal wait with more left than this suspends the run; 5 s by default (at most 5 s). */
  suspendAfterMs?: number;
  /** How often the leader queues waiting runs whose deadline came; 1 s by default. */
  wakeMs?: number;
  /** Unique per process (the lease owner); `<hostname>-<pid>` by default. */
  id?: string;
  /** Postgres connections of the main pool; 10 by default. */
  poolSize?: number;
  /** Where log lines go; JSON lines on stderr at `info` by default. */
  log?: Logger;
  /**
   * A prom-client registry of the caller's to put the worker's metrics on
   * (`poimen_worker_*`, and the queue-wide gauges while it is the fleet's
   * leader: docs/metrics.md); the caller serves it. Unset: no metrics. One
   * worker per registry: a second one's metrics would have the same names.
   */
  metricsRegistry?: MetricsRegistry;
}

/** A running (or startable) worker: `start()` once, `stop()` any number of times. */
export interface PoimenWorker {
  /** Its lease owner id. */
  readonly id: string;
  /** Runs being executed (or finishing) right now. */
  readonly inFlight: number;
  /**
   * Registers its versions in the catalog, then claims and executes runs.
   * Rejects with a `PoimenError` of code `workflow-conflict`, naming the
   * workflow, when a version is registered with another definition. While
   * Postgres is unavailable it waits; `signal` gives up the wait.
   */
  start(signal?: AbortSignal): Promise<void>;
  /** Stops claiming, lets runs in flight finish (up to `shutdownMs`), closes its pools. */
  stop(): Promise<void>;
}

/**
 * A worker's pools: `sql` for its statements (`size` connections), a
 * factory of the one-connection pool it LISTENs on (db/listener.ts) and one
 * of the one-connection pool its leader lock is held on (core/leader.ts),
 * all named after the worker in `pg_stat_activity`.
 */
export function workerPools(
  url: string,
  size: number,
  id: string,
): { sql: Sql; listener: () => Sql; leaderSession: () => Sql } {
  return {
    sql: createPool({ url, max: size, applicationName: `poimen-worker ${id}`.slice(0, 63) }),
    listener: () =>
      createPool({ url, max: 1, applicationName: `poimen-worker-listen ${id}`.slice(0, 63) }),
    leaderSession: () =>
      createPool({ url, max: 1, applicationName: `poimen-worker-leader ${id}`.slice(0, 63) }),
  };
}

/**
 * Makes a worker hosting `options.workflows`. Throws a `TypeError` when no
 * workflow is given, one `name@version` is given twice or one has no
 * handler (a definition not implemented).
 */
export function createWorker(options: CreateWorkerOptions): PoimenWorker {
  const { worker, stop } = assembleWorker(options);
  return {
    id: worker.id,
    get inFlight() {
      return worker.inFlight;
    },
    start: (signal) => worker.start(signal),
    stop,
  };
}

/**
 * The worker `createWorker` makes, with its main pool (a process pings it
 * for readiness) and a `stop` that stops the worker, then ends the pools.
 */
export function assembleWorker(
  options: CreateWorkerOptions,
): { worker: Worker; sql: Sql; stop: () => Promise<void> } {
  if (options.workflows.length === 0) throw new TypeError("createWorker: no workflows given");
  const registry = new WorkflowRegistry(options.workflows);
  const id = options.id ?? defaultWorkerId();
  const log = options.log ?? createLogger("worker", "info");
  // The defaults are those of `deno task worker`'s variables, from the one schema.
  const defaults = readWorkerConfig({});
  const { sql, listener, leaderSession } = workerPools(
    options.databaseUrl,
    options.poolSize ?? defaults.DATABASE_POOL_SIZE,
    id,
  );
  let hooks: WorkerHooks = {};
  // A prom-client Registry by contract (the interface names what is used of it).
  const metricsRegistry = options.metricsRegistry as Registry | undefined;
  if (metricsRegistry) {
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
    hooks = {
      ...metrics.hooks,
      onSlotCorrected: slotCorrectionMetric(metricsRegistry),
      onLaneRepaired: laneRepairMetric(metricsRegistry),
    };
  }
  const worker = new Worker(sql, registry, {
    id,
    concurrency: options.concurrency ?? defaults.WORKER_CONCURRENCY,
    leaseMs: options.leaseMs ?? defaults.WORKER_LEASE_MS,
    pollMs: options.pollMs ?? defaults.WORKER_POLL_MS,
    retryBaseMs: options.retryBaseMs ?? defaults.WORKER_RETRY_BASE_MS,
    shutdownMs: options.shutdownMs ?? defaults.WORKER_SHUTDOWN_MS,
    resultMaxBytes: options.resultMaxBytes ?? defaults.RUN_RESULT_MAX_BYTES,
    stepMaxBytes: options.stepMaxBytes ?? defaults.RUN_STEP_MAX_BYTES,
    suspendAfterMs: options.suspendAfterMs ?? defaults.WORKER_SUSPEND_AFTER_MS,
    wakeMs: options.wakeMs ?? defaults.WORKER_WAKE_MS,
    log,
    hooks,
    listener,
    leaderSession,
  });
  const stop = once(async () => {
    try {
      await worker.stop();
    } finally {
      await sql.end({ timeout: 5 });
    }
  });
  return { worker, sql, stop };
}
