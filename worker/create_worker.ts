/**
 * A worker for a team's own workflows, embedded in its own process:
 * `createWorker` from `@poimen/poimen/worker`. It opens its own Postgres
 * pools and closes them when it stops; `runWorker` (worker/run_worker.ts)
 * wraps it as a whole process, with the environment, metrics, health and
 * signals of `deno task worker`.
 */
import type { Logger } from "../core/log.ts";
import { createLogger } from "../core/log.ts";
import { once } from "../core/lifecycle.ts";
import { SECOND } from "../core/time.ts";
import { createPool } from "../db/pool.ts";
import type { Workflow } from "../workflows/define.ts";
import { WorkflowRegistry } from "../workflows/registry.ts";
import { DEFAULT_RUN_RESULT_MAX_BYTES } from "./run_output.ts";
import { Worker } from "./worker.ts";
import { defaultWorkerId } from "./config.ts";

/** What `createWorker` takes; everything but `workflows` and `databaseUrl` has a default. */
export interface CreateWorkerOptions {
  /** The workflow versions this worker hosts (made with `defineWorkflow`); at least one. */
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
  /** Unique per process (the lease owner); `<hostname>-<pid>` by default. */
  id?: string;
  /** Postgres connections of the main pool; 10 by default. */
  poolSize?: number;
  /** Where log lines go; JSON lines on stderr at `info` by default. */
  log?: Logger;
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
 * Makes a worker hosting `options.workflows`. Throws a `TypeError` when no
 * workflow is given or one `name@version` is given twice.
 */
export function createWorker(options: CreateWorkerOptions): PoimenWorker {
  if (options.workflows.length === 0) throw new TypeError("createWorker: no workflows given");
  const registry = new WorkflowRegistry(options.workflows);
  const id = options.id ?? defaultWorkerId();
  const log = options.log ?? createLogger("worker", "info");
  const sql = createPool({
    url: options.databaseUrl,
    max: options.poolSize ?? 10,
    applicationName: `poimen-worker ${id}`.slice(0, 63),
  });
  const worker = new Worker(sql, registry, {
    id,
    concurrency: options.concurrency ?? 4,
    leaseMs: options.leaseMs ?? 30 * SECOND,
    pollMs: options.pollMs ?? SECOND,
    retryBaseMs: options.retryBaseMs ?? SECOND,
    shutdownMs: options.shutdownMs ?? 10 * SECOND,
    resultMaxBytes: options.resultMaxBytes ?? DEFAULT_RUN_RESULT_MAX_BYTES,
    log,
    listener: () =>
      createPool({
        url: options.databaseUrl,
        max: 1,
        applicationName: `poimen-worker-listen ${id}`.slice(0, 63),
      }),
  });
  const stop = once(async () => {
    try {
      await worker.stop();
    } finally {
      await sql.end({ timeout: 5 });
    }
  });
  return {
    id,
    get inFlight() {
      return worker.inFlight;
    },
    start: (signal) => worker.start(signal),
    stop,
  };
}
