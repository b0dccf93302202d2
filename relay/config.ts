/** The inbox relay's configuration, read once from the environment at start-up. */
import { z } from "zod";
import {
  DEFAULT_METRICS_PORTS,
  kafkaEnv,
  logEnv,
  millis,
  port,
  positiveInt,
  readEnv,
} from "../core/config.ts";
import { MINUTE, SECOND } from "../core/time.ts";
import { parseTenantScope, type TenantScope } from "../contracts/tenant_scope.ts";

const MIB = 1024 * 1024;

/** The inbox relay's environment variables. */
export const relayEnvSchema = z.object({
  ...kafkaEnv,
  ...logEnv,
  /** Base URL of the poimen API every dispatch and signal message is posted to. */
  API_URL: z.string().url().default("http://127.0.0.1:8080"),
  /** A service token (`deno task token --service relay`); no default: the relay is useless without it. */
  RELAY_TOKEN: z.string({ error: "a service token is required (deno task token --service relay)" })
    .min(1),
  RELAY_GROUP_ID: z.string().min(1).default("poimen-inbox-relay"),
  /**
   * Only these tenants' topics: a tenant scope, tenant ids and prefixes
   * (`acme,beta,team-*`; default `*`, every tenant), never a regular
   * expression; lets several relay groups split the tenants between them.
   */
  RELAY_TENANT_PATTERN: z.string().default("*").superRefine((text, ctx) => {
    const { problem } = parseTenantScope(text);
    if (problem !== undefined) {
      ctx.addIssue({
        code: "custom",
        message: `not a tenant scope (acme,beta,team-*): ${problem}`,
      });
    }
  }),
  /** How often the broker's topic list is re-read, so new tenants are picked up. */
  RELAY_TOPIC_REFRESH_MS: z.coerce.number().int().min(100).default(5 * SECOND),
  /**
   * Messages in flight at once per partition (commits stay in offset order);
   * those of a tenant ready together share a batch request, so many cost few
   * requests (256 drained 5,304/s in the bench where 64 drained 4,003/s).
   */
  RELAY_MAX_IN_FLIGHT: positiveInt(256),
  /** Messages fetched but not yet done, over all partitions, before fetching waits. */
  RELAY_MAX_PENDING: positiveInt(10_000),
  /** Bytes of those messages' values, likewise (a paused partition holds one message). */
  RELAY_MAX_PENDING_BYTES: positiveInt(64 * MIB),
  /**
   * How long a message the API answers `unknown-workflow` is retried before
   * it is dead-lettered: long enough for the first worker hosting a new
   * workflow to start after its producers began sending it.
   */
  RELAY_UNKNOWN_WORKFLOW_GRACE_MS: millis(5 * MINUTE),
  /** Commits are batched: at most this long after a message is done… */
  RELAY_COMMIT_INTERVAL_MS: z.coerce.number().int().min(10).default(200),
  /** …or as soon as this many messages are done and not yet committed. */
  RELAY_COMMIT_BATCH: positiveInt(1000),
  RELAY_BACKOFF_BASE_MS: positiveInt(200),
  RELAY_BACKOFF_CAP_MS: positiveInt(30 * SECOND),
  /**
   * Dispatch messages of one tenant ready together go in one batch request of
   * up to this many (`POST /v1/runs` with an array); 1 sends each alone.
   */
  RELAY_BATCH_MAX: z.coerce.number().int().min(1).max(1000).default(100),
  /** Most bytes of message values in one batch: below the API's BODY_LIMIT_BYTES. */
  RELAY_BATCH_MAX_BYTES: positiveInt(512 * 1024),
  /** Batch requests in flight at once per tenant. */
  RELAY_BATCH_CONCURRENCY: positiveInt(4),
  /** Longest one API call may take before it counts as a (transient) timeout. */
  RELAY_API_TIMEOUT_MS: positiveInt(30 * SECOND),
  /**
   * How often inbox lag is computed from the broker's end and committed
   * offsets; a measurement not answered by then is measured again.
   */
  RELAY_LAG_INTERVAL_MS: z.coerce.number().int().min(100).default(5 * SECOND),
  /** How long a graceful stop waits for API calls in flight. */
  RELAY_SHUTDOWN_MS: millis(10 * SECOND),
  /** Group session timeout: how soon a crashed relay's partitions move to another member. */
  RELAY_SESSION_TIMEOUT_MS: z.coerce.number().int().min(6 * SECOND).default(30 * SECOND),
  /** `/metrics`, `/healthz` and `/readyz`; 0 picks a free port (logged). */
  RELAY_METRICS_PORT: port(DEFAULT_METRICS_PORTS.relay),
  RELAY_METRICS_HOST: z.string().min(1).default("127.0.0.1"),
});

export type RelayConfig = z.infer<typeof relayEnvSchema>;

/** The tenants a relay reads the topics of: RELAY_TENANT_PATTERN, parsed (validated when read). */
export function relayTenants(config: RelayConfig): TenantScope {
  return parseTenantScope(config.RELAY_TENANT_PATTERN).scope!;
}

/** Reads and validates the relay's environment; throws a one-line `ConfigError`. */
export function readRelayConfig(env: Record<string, string | undefined>): RelayConfig {
  return readEnv(relayEnvSchema, env);
}
