/** The outbox process's configuration, read once from the environment at start-up. */
import { z } from "zod";
import {
  databaseEnv,
  DEFAULT_METRICS_PORTS,
  kafkaEnv,
  logEnv,
  millis,
  port,
  positiveInt,
  readEnv,
} from "../core/config.ts";
import { DAY, MINUTE, SECOND } from "../core/time.ts";

/** The outbox process's environment variables. */
export const outboxEnvSchema = z.object({
  ...databaseEnv,
  ...kafkaEnv,
  ...logEnv,
  /** Most events claimed, published and marked in one batch. */
  OUTBOX_BATCH_SIZE: positiveInt(500),
  /** Payload bytes one batch holds at most (its oldest event always goes); bounds the heap. */
  OUTBOX_BATCH_MAX_BYTES: positiveInt(16 * 1024 * 1024),
  /** Polling interval when the last batch was not full: the fallback when no NOTIFY arrives. */
  OUTBOX_POLL_MS: z.coerce.number().int().min(1).default(200),
  /** How long published rows are kept before the purge deletes them. */
  OUTBOX_RETENTION_MS: millis(7 * DAY),
  /** How often the purge runs. */
  OUTBOX_PURGE_INTERVAL_MS: z.coerce.number().int().min(10).default(MINUTE),
  /** Rows deleted per purge statement (kept small so no statement holds locks for long). */
  OUTBOX_PURGE_BATCH_SIZE: positiveInt(1000),
  /**
   * How long finished runs (succeeded, failed, cancelled) are kept, from
   * when they finished; then they are purged with their events. Never
   * shorter than the dispatch topics keep messages (checked at start-up):
   * a redelivered message must still find its run.
   */
  RUN_RETENTION_MS: z.coerce.number().int().min(1).default(30 * DAY),
  /** How often finished runs are purged; 0 turns the run purge off (runs are kept forever). */
  RUN_PURGE_INTERVAL_MS: millis(MINUTE),
  /** Runs deleted per purge statement (small: each statement is one short transaction). */
  RUN_PURGE_BATCH_SIZE: z.coerce.number().int().min(1).max(10_000).default(500),
  /**
   * Longest one publish may take before it is abandoned (the producer is
   * replaced; what was not acknowledged stays pending): bounds how long a
   * batch keeps its runs while the broker misbehaves (no transaction is open
   * meanwhile).
   */
  OUTBOX_SEND_TIMEOUT_MS: z.coerce.number().int().min(100).default(30 * SECOND),
  /** Cap of the retry backoff while Kafka or Postgres is unavailable. */
  OUTBOX_RETRY_MAX_MS: z.coerce.number().int().min(10).default(5 * SECOND),
  /** How long a graceful stop waits for the batch in flight before abandoning it. */
  OUTBOX_SHUTDOWN_MS: millis(10 * SECOND),
  /** `/metrics`, `/healthz` and `/readyz`; 0 picks a free port (logged). */
  OUTBOX_METRICS_PORT: port(DEFAULT_METRICS_PORTS.outbox),
  /** Metrics endpoint bind address. */
  OUTBOX_METRICS_HOST: z.string().min(1).default("127.0.0.1"),
});

/** The validated outbox configuration. */
export type OutboxConfig = z.infer<typeof outboxEnvSchema>;

/** Reads and validates the outbox environment; throws a one-line `ConfigError`. */
export function readOutboxConfig(env: Record<string, string | undefined>): OutboxConfig {
  return readEnv(outboxEnvSchema, env);
}
