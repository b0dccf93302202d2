/** The API process's configuration, read once from the environment. */
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
import { ConfigError } from "../core/errors.ts";
import { MINUTE, SECOND } from "../core/time.ts";

export const ApiEnv = z.object({
  ...databaseEnv,
  ...logEnv,
  PORT: port(8080),
  HOST: z.string().min(1).default("127.0.0.1"),
  /**
   * The operators' listener: `/metrics` with the per-tenant series (the API
   * port's `/metrics` serves only the series that name no tenant), `/healthz`
   * and `/readyz`. Loopback by default, like the other processes'.
   */
  API_METRICS_PORT: port(DEFAULT_METRICS_PORTS.api),
  API_METRICS_HOST: z.string().min(1).default("127.0.0.1"),
  /** Request body limit in bytes (default 1 MiB). */
  BODY_LIMIT_BYTES: positiveInt(1024 * 1024),
  /**
   * Request bodies held at once, in bytes (default 4 MiB): from reading to
   * the response, so what bodies take on the heap is bounded. A request that
   * waits for its share longer than BODY_BUDGET_WAIT_MS gets a 503 (busy).
   */
  BODY_BUDGET_BYTES: positiveInt(4 * 1024 * 1024),
  BODY_BUDGET_WAIT_MS: millis(5 * SECOND),
  /**
   * Most of the budget one tenant's requests hold at once, so that one
   * tenant's slow or idle uploads cannot delay another's (its own further
   * requests wait). Default: a quarter of BODY_BUDGET_BYTES, at least
   * BODY_LIMIT_BYTES (at most BODY_BUDGET_BYTES).
   */
  BODY_BUDGET_TENANT_BYTES: z.coerce.number().int().positive().optional(),
  /**
   * Bytes of the budget tenants' requests leave to service tokens' (the
   * relay's), so HTTP callers cannot starve the relay's admissions. Default:
   * one tenant share, when the budget has room for it beside one.
   */
  BODY_BUDGET_SERVICE_BYTES: z.coerce.number().int().nonnegative().optional(),
  /** A body not all arrived within this is refused (408), giving its share of the budget back. */
  BODY_READ_TIMEOUT_MS: millis(10 * SECOND),
  /** How long a verified token is trusted without asking the database again. */
  AUTH_CACHE_MS: millis(30 * SECOND),
  /** Most admissions coalesced into one statement. */
  ADMISSION_MAX_BATCH: positiveInt(128),
  /**
   * Most admission statements in flight (each holds a pooled connection);
   * beyond the first only while one has taken over 10 ms (admission/admit.ts).
   */
  ADMISSION_MAX_CONCURRENT: positiveInt(2),
  /** Max attempts of a run whose workflow version declares none (`maxAttempts` unset). */
  DEFAULT_MAX_ATTEMPTS: positiveInt(3),
  /**
   * How often the workflow catalog is read again when no NOTIFY came (a
   * registration's NOTIFY normally arrives first, and an unknown workflow
   * reads it at once, at most once a second).
   */
  CATALOG_REFRESH_MS: millis(30 * SECOND),
  /**
   * Mean time between two schedule ticks of this API process (jittered
   * ±25%; admission/schedule_ticker.ts): an occurrence starts within about
   * this long of its time. Every API process ticks; each occurrence still
   * starts once.
   */
  SCHEDULE_TICK_MS: millis(5 * SECOND),
  /**
   * Waits (`Prefer: wait=N`) and event streams one API process holds at
   * once; past it, 503 `busy` with Retry-After.
   */
  RUN_WATCHERS_MAX: positiveInt(10_000),
  /**
   * Of those, what one tenant holds at once (default a tenth of
   * RUN_WATCHERS_MAX, at least 1); past it, a stream is 429
   * `too-many-streams` and a wait is answered without waiting.
   */
  RUN_WATCHERS_PER_TENANT: z.coerce.number().int().positive().optional(),
  /** How often an idle event stream gets a comment line, so proxies keep it open. */
  RUN_STREAM_HEARTBEAT_MS: millis(15 * SECOND),
  /** The longest an event stream stays open; then it ends and the client resumes. */
  RUN_STREAM_MAX_MS: z.coerce.number().int().positive().default(15 * MINUTE),
  /** An event stream whose reader leaves its buffer full this long is disconnected. */
  RUN_STREAM_STALL_MS: z.coerce.number().int().positive().default(30 * SECOND),
  /**
   * How often the tenants' quotas and the queued runs of tenants with a
   * max_queued are read again (admission/quota.ts): a changed quota takes
   * effect within it, and between reads only this process's admissions are
   * added to a tenant's count.
   */
  QUOTA_REFRESH_MS: positiveInt(1 * SECOND),
});
export type ApiConfig = z.infer<typeof ApiEnv> & {
  BODY_BUDGET_TENANT_BYTES: number;
  BODY_BUDGET_SERVICE_BYTES: number;
};

export function readApiConfig(env: Record<string, string | undefined>): ApiConfig {
  const config = readEnv(ApiEnv, env);
  const total = config.BODY_BUDGET_BYTES;
  const tenant = config.BODY_BUDGET_TENANT_BYTES ??
    Math.min(total, Math.max(config.BODY_LIMIT_BYTES, Math.floor(total / 4)));
  if (tenant > total) {
    throw new ConfigError(
      `config: BODY_BUDGET_TENANT_BYTES is invalid: ${tenant} exceeds BODY_BUDGET_BYTES (${total})`,
    );
  }
  const service = config.BODY_BUDGET_SERVICE_BYTES ?? Math.min(tenant, total - tenant);
  if (service > total - tenant) {
    throw new ConfigError(
      `config: BODY_BUDGET_SERVICE_BYTES is invalid: ${service} leaves tenants less than ` +
        `one BODY_BUDGET_TENANT_BYTES (${tenant}) of BODY_BUDGET_BYTES (${total})`,
    );
  }
  return { ...config, BODY_BUDGET_TENANT_BYTES: tenant, BODY_BUDGET_SERVICE_BYTES: service };
}
