/** The worker's configuration, read once from the environment at start-up. */
import { z } from "zod";
import {
  databaseEnv,
  DEFAULT_METRICS_PORTS,
  logEnv,
  millis,
  port,
  positiveInt,
  readEnv,
} from "../core/config.ts";
import { SECOND } from "../core/time.ts";
import { DEFAULT_RUN_RESULT_MAX_BYTES } from "./run_output.ts";
import { DEFAULT_RUN_STEP_MAX_BYTES, DEFAULT_SUSPEND_AFTER_MS } from "./durable_defaults.ts";

/** Default worker id: unique per process on a host, readable in `lease_owner`. */
export function defaultWorkerId(): string {
  return `${Deno.hostname()}-${Deno.pid}`;
}

/** The worker's environment variables. */
export const workerEnvSchema = z.object({
  ...databaseEnv,
  ...logEnv,
  /** Runs executed at once by this process. */
  WORKER_CONCURRENCY: positiveInt(4),
  /** How long a claim stays valid without a heartbeat. */
  WORKER_LEASE_MS: z.coerce.number().int().min(100).default(30 * SECOND),
  /** Polling interval: the fallback when no NOTIFY arrives (retries that fall due, lost wake-ups). */
  WORKER_POLL_MS: z.coerce.number().int().min(10).default(SECOND),
  /** Base of the exponential retry backoff. */
  WORKER_RETRY_BASE_MS: millis(SECOND),
  /** How long a graceful stop waits for runs in flight before aborting and releasing them. */
  WORKER_SHUTDOWN_MS: millis(10 * SECOND),
  WORKER_ID: z.string().min(1).max(200).optional(),
  /**
   * Largest result (and error) a run may store, as JSON bytes. Both travel in
   * the run's terminal event, so the ceiling keeps every event under the
   * events topic's message limit (1 MiB by default, with room for the
   * envelope). A larger result fails the run with `result-too-large`.
   */
  RUN_RESULT_MAX_BYTES: z.coerce.number().int().min(1024).max(960 * 1024).default(
    DEFAULT_RUN_RESULT_MAX_BYTES,
  ),
  /**
   * Largest result of a durable step (`ctx.step`), as JSON bytes: stored in
   * Postgres and read back by every replay, never sent in an event (which
   * carries its size). A larger one fails the run with `step-too-large`.
   */
  RUN_STEP_MAX_BYTES: z.coerce.number().int().min(1024).max(16 * 1024 * 1024).default(
    DEFAULT_RUN_STEP_MAX_BYTES,
  ),
  /**
   * A durable sleep or signal wait with more time left than this suspends
   * the run (its worker slot, lease and concurrency slot given back); one
   * with less waits in the worker. At most 5 s.
   */
  WORKER_SUSPEND_AFTER_MS: z.coerce.number().int().min(0).max(5 * SECOND).default(
    DEFAULT_SUSPEND_AFTER_MS,
  ),
  /**
   * How often the leader looks for waiting runs whose deadline came (a
   * sleep's end, a wait's timeout) and queues them: how late they may start.
   */
  WORKER_WAKE_MS: z.coerce.number().int().min(50).max(60 * SECOND).default(SECOND),
  /** `/metrics`, `/healthz` and `/readyz`; 0 picks a free port (logged). */
  WORKER_METRICS_PORT: port(DEFAULT_METRICS_PORTS.worker),
  WORKER_METRICS_HOST: z.string().min(1).default("127.0.0.1"),
});

export type WorkerEnv = z.infer<typeof workerEnvSchema>;

/** Reads and validates the worker's environment; throws a one-line `ConfigError`. */
export function readWorkerConfig(env: Record<string, string | undefined>): WorkerEnv {
  return readEnv(workerEnvSchema, env);
}
