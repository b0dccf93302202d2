/**
 * `main.ts outbox`: the outbox process. Reads its configuration, opens
 * the pool and the Kafka clients, runs an `OutboxPublisher` and, on the one
 * outbox process elected leader (core/leader.ts), an `OutboxPurger` and a
 * `RunPurger` (retention of finished runs); and its `/metrics`, `/healthz`
 * and `/readyz` endpoint (OUTBOX_METRICS_PORT) until SIGTERM/SIGINT, then
 * lets the batch in flight finish and closes producer, admin and pool
 * (core/process_harness.ts: a second signal forces the exit).
 */
import client from "prom-client";
import { processEnv } from "../core/config.ts";
import { kafkaConnection } from "../kafka/security.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { named, runProcess, stopDeadline } from "../core/process_harness.ts";
import { createLogger, type Logger } from "../core/log.ts";
import { outboxStats } from "../db/outbox.ts";
import { createPool, ping, type Sql } from "../db/pool.ts";
import { guardDriverFaults } from "../db/driver_guard.ts";
import { abortable } from "../core/health.ts";
import { createAdmin } from "../kafka/admin.ts";
import { createProducer } from "../kafka/producer.ts";
import type { KafkaClientOptions } from "../kafka/client.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { type OutboxConfig, outboxEnvSchema, readOutboxConfig } from "./config.ts";
import { createOutboxMetrics } from "./metrics.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { OutboxPublisher } from "./publisher.ts";
import { OutboxPurger } from "./purger.ts";
import {
  type DispatchRetention,
  formatDuration,
  readDispatchRetention,
  retentionProblem,
  RunPurger,
  type RunPurgerHooks,
} from "../retention/run_purger.ts";
import { selectTenants } from "../db/auth.ts";
import { ConfigError } from "../core/errors.ts";
import { SECOND } from "../core/time.ts";
import { LeaderElector } from "../core/leader.ts";

// How often an outbox process tries to become the leader (the purges'
// process), and the leader checks it still is.
const LEADER_RETRY_MS = 5 * SECOND;

// Bounded so a failing send gives up within seconds (the library's default
// for an idempotent producer is to retry forever); the publisher's own loop
// retries with backoff after that.
const PRODUCER_RETRIES = 5;

const COMMAND = {
  name: "outbox",
  synopsis: "",
  description: `
Publishes the outbox's events to each tenant's poimen.<tenant>.events topic,
purges published rows and finished runs past RUN_RETENTION_MS (refusing a
window shorter than the dispatch topics keep messages), until SIGTERM or
SIGINT; serves /metrics, /healthz and /readyz on
OUTBOX_METRICS_HOST:OUTBOX_METRICS_PORT.`,
  env: outboxEnvSchema,
} satisfies CommandSpec;

/** Runs the outbox process until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const cfg = readOutboxConfig(processEnv());
  const log = createLogger("outbox", cfg.LOG_LEVEL);
  const id = `${Deno.hostname()}-${Deno.pid}`;
  const sql = createPool({
    url: cfg.DATABASE_URL,
    max: cfg.DATABASE_POOL_SIZE,
    applicationName: `poimen-outbox ${id}`.slice(0, 63),
  });
  const kafkaClient = {
    ...kafkaConnection(cfg),
    clientId: `${cfg.KAFKA_CLIENT_ID}-outbox`,
    logger: log,
  };
  const registry = new client.Registry();
  guardDriverFaults(log, registry);
  const metrics = createOutboxMetrics(registry, () => outboxStats(sql), log);
  const publisher = new OutboxPublisher(sql, {
    createProducer: () => createProducer({ ...kafkaClient, retries: PRODUCER_RETRIES }),
    admin: createAdmin(kafkaClient),
  }, {
    batchSize: cfg.OUTBOX_BATCH_SIZE,
    batchMaxBytes: cfg.OUTBOX_BATCH_MAX_BYTES,
    pollMs: cfg.OUTBOX_POLL_MS,
    sendTimeoutMs: cfg.OUTBOX_SEND_TIMEOUT_MS,
    retryMaxMs: cfg.OUTBOX_RETRY_MAX_MS,
    shutdownMs: cfg.OUTBOX_SHUTDOWN_MS,
    topics: {
      partitions: cfg.TOPIC_PARTITIONS,
      replicationFactor: cfg.TOPIC_REPLICATION_FACTOR,
      retentionMs: cfg.TOPIC_RETENTION_MS,
      maxMessageBytes: cfg.EVENTS_MAX_MESSAGE_BYTES,
    },
    log,
    hooks: metrics.hooks,
    listener: () =>
      createPool({
        url: cfg.DATABASE_URL,
        max: 1,
        applicationName: `poimen-outbox-listen ${id}`.slice(0, 63),
      }),
    // Its own session: it holds the shard locks between statements, which
    // a pooled connection shared with the purgers must not.
    session: createPool({
      url: cfg.DATABASE_URL,
      max: 1,
      applicationName: `poimen-outbox-shards ${id}`.slice(0, 63),
    }),
  });
  // The purges run on one outbox process of the fleet: each round scans
  // across tenants, once is enough.
  const leader = new LeaderElector({
    role: "outbox",
    connect: () =>
      createPool({
        url: cfg.DATABASE_URL,
        max: 1,
        applicationName: `poimen-outbox-leader ${id}`.slice(0, 63),
      }),
    retryMs: LEADER_RETRY_MS,
    log,
  });
  leader.whileLeader("outbox purger", () =>
    new OutboxPurger(sql, {
      retentionMs: cfg.OUTBOX_RETENTION_MS,
      intervalMs: cfg.OUTBOX_PURGE_INTERVAL_MS,
      batchSize: cfg.OUTBOX_PURGE_BATCH_SIZE,
      log,
    }));
  const runPurger = await createRunPurger(cfg, sql, kafkaClient, metrics.runPurgerHooks, log);
  if (runPurger) leader.whileLeader("run purger", runPurger.make);
  return await runProcess([
    // Closed last: everything else uses it.
    { name: "pool", stop: () => sql.end({ timeout: 5 }) },
    // Served first: readiness must be askable while Postgres is still away.
    metricsPart(registry, cfg.OUTBOX_METRICS_HOST, cfg.OUTBOX_METRICS_PORT, log, {
      probes: { postgres: (signal) => abortable(ping(sql), signal) },
    }),
    // Independent of each other: stopped together, the stop takes the longest
    // of their waits, not the sum.
    [
      named("outbox publisher", publisher),
      named("outbox leader (purges)", {
        start: () => leader.start(),
        stop: once(async () => {
          await leader.stop();
          await runPurger?.close();
        }),
      }),
    ],
  ], { log, stopDeadlineMs: stopDeadline(cfg.OUTBOX_SHUTDOWN_MS) });
}

// Reading the dispatch topics' retention gives up after this before a purge
// round, and sooner at start-up (the health endpoint is not served yet): a
// broker or database that does not answer holds the purge, never the outbox.
const DISPATCH_RETENTION_TIMEOUT_MS = 10 * SECOND;
const STARTUP_DISPATCH_RETENTION_TIMEOUT_MS = 5 * SECOND;

/**
 * A maker of run purgers (one per leadership term) and what closes the
 * admin client they share, or undefined when RUN_PURGE_INTERVAL_MS is 0. Refuses
 * (ConfigError, exit 2) a RUN_RETENTION_MS shorter than TOPIC_RETENTION_MS
 * or than a dispatch topic of this database's tenants keeps messages. When
 * Postgres or the broker cannot be asked at start-up, it starts anyway: the
 * purger asks again before every round and purges nothing until it knows.
 */
async function createRunPurger(
  cfg: OutboxConfig,
  sql: Sql,
  kafkaClient: KafkaClientOptions,
  hooks: RunPurgerHooks,
  log: Logger,
): Promise<{ make: () => Service; close: () => Promise<void> } | undefined> {
  if (cfg.RUN_PURGE_INTERVAL_MS === 0) {
    log.info("run purge off (RUN_PURGE_INTERVAL_MS=0): finished runs are kept");
    return undefined;
  }
  // What the dispatch topics of tenants still to come are declared with.
  const declared: DispatchRetention = {
    ms: cfg.TOPIC_RETENTION_MS,
    source: "TOPIC_RETENTION_MS",
    detail: `TOPIC_RETENTION_MS, the retention.ms dispatch topics are declared with, is ${
      formatDuration(cfg.TOPIC_RETENTION_MS)
    }`,
  };
  const configured = retentionProblem(cfg.RUN_RETENTION_MS, declared);
  if (configured) throw new ConfigError(configured);
  const admin = createAdmin(kafkaClient);
  const dispatchRetention = async (timeoutMs = DISPATCH_RETENTION_TIMEOUT_MS) =>
    await abortable(
      (async () => readDispatchRetention(admin, await selectTenants(sql), declared))(),
      AbortSignal.timeout(timeoutMs),
    );
  try {
    const problem = retentionProblem(
      cfg.RUN_RETENTION_MS,
      await dispatchRetention(STARTUP_DISPATCH_RETENTION_TIMEOUT_MS),
    );
    if (problem) {
      await admin.close();
      throw new ConfigError(problem);
    }
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    log.warn("dispatch topics' retention unreadable at start-up; the run purge waits for it", {
      error,
    });
  }
  return {
    make: () =>
      new RunPurger(sql, {
        retentionMs: cfg.RUN_RETENTION_MS,
        intervalMs: cfg.RUN_PURGE_INTERVAL_MS,
        batchSize: cfg.RUN_PURGE_BATCH_SIZE,
        dispatchRetention: () => dispatchRetention(),
        log,
        hooks,
      }),
    // The admin client the purgers read topics with, closed once they are stopped.
    close: once(() => admin.close()),
  };
}
