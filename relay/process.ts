/**
 * `deno task relay`: the inbox relay process. Its own failure domain: it
 * talks to Kafka and to the API over HTTP, never to Postgres (this module
 * graph holds no db/ or api/ code), and outlives outages of either with
 * retries. Stops gracefully on SIGTERM/SIGINT (core/process_harness.ts: a
 * second signal forces the exit).
 */
import client from "prom-client";
import { processEnv } from "../core/config.ts";
import { kafkaConnection } from "../kafka/security.ts";
import { type Part, runProcess, stopDeadline } from "../core/process_harness.ts";
import { createLogger } from "../core/log.ts";
import { ApiClient } from "./api_client.ts";
import { type CommandSpec, parseCommandLine } from "../core/command_line.ts";
import { readRelayConfig, type RelayConfig, relayEnvSchema, relayTenants } from "./config.ts";
import { InboxRelay } from "./inbox.ts";
import { createAdmin } from "../kafka/admin.ts";
import { createConsumer } from "../kafka/consumer.ts";
import { createProducer } from "../kafka/producer.ts";
import { createRelayMetrics } from "./metrics.ts";
import { metricsPart } from "../core/metrics_server.ts";
import { inboxTopic } from "./inbox_messages.ts";
import { abortable, httpProbe, PROBE_TIMEOUT_MS } from "../core/health.ts";

const COMMAND = {
  name: "relay",
  synopsis: "",
  description: `
Consumes every tenant's poimen.<tenant>.dispatch and poimen.<tenant>.signals
topics and posts each message to the API's POST /v1/runs (a signal to POST
/v1/runs/{id}/signals) with its service token (RELAY_TOKEN), dead-lettering
what can never succeed, until SIGTERM or SIGINT; serves /metrics, /healthz and
/readyz on RELAY_METRICS_HOST:RELAY_METRICS_PORT.`,
  env: relayEnvSchema,
} satisfies CommandSpec;

/** Runs the relay until a signal; returns the exit code. */
export async function main(args: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, args);
  if (typeof line === "number") return line;
  const config = readRelayConfig(processEnv());
  const log = createLogger("relay", config.LOG_LEVEL);
  return await runProcess(relayParts(config, log), {
    log,
    stopDeadlineMs: stopDeadline(config.RELAY_SHUTDOWN_MS),
  });
}

/** The probes' admin client, the metrics server, then the inbox relay: stopped in reverse. */
function relayParts(config: RelayConfig, log: ReturnType<typeof createLogger>): Part[] {
  const registry = new client.Registry();
  const metrics = createRelayMetrics(registry);
  const kafka = {
    ...kafkaConnection(config),
    clientId: `${config.KAFKA_CLIENT_ID}-relay`,
    logger: log,
  };
  const tenants = relayTenants(config);
  // Dispatch and signals topics alike, of the tenants this relay serves.
  const isInboxTopic = (topic: string) => {
    const tenant = inboxTopic(topic)?.tenant;
    return tenant !== undefined && tenants.allows(tenant);
  };
  let relay: InboxRelay | undefined;
  // Its own client, failing fast: the relay's admin retries, which would
  // make a probe outlast its timeout and pile up behind it.
  const probeAdmin = createAdmin({
    ...kafka,
    clientId: `${kafka.clientId}-readyz`,
    retries: 0,
    requestTimeoutMs: PROBE_TIMEOUT_MS,
    connectTimeoutMs: PROBE_TIMEOUT_MS,
  });
  const inbox: Part = {
    name: "inbox relay",
    async start() {
      const admin = createAdmin({ ...kafka, clientId: `${kafka.clientId}-admin` });
      relay = new InboxRelay({
        groupId: config.RELAY_GROUP_ID,
        isInboxTopic,
        maxInFlight: config.RELAY_MAX_IN_FLIGHT,
        maxPending: config.RELAY_MAX_PENDING,
        maxPendingBytes: config.RELAY_MAX_PENDING_BYTES,
        unknownWorkflowGraceMs: config.RELAY_UNKNOWN_WORKFLOW_GRACE_MS,
        commitIntervalMs: config.RELAY_COMMIT_INTERVAL_MS,
        commitBatch: config.RELAY_COMMIT_BATCH,
        backoffBaseMs: config.RELAY_BACKOFF_BASE_MS,
        backoffCapMs: config.RELAY_BACKOFF_CAP_MS,
        lagIntervalMs: config.RELAY_LAG_INTERVAL_MS,
        shutdownMs: config.RELAY_SHUTDOWN_MS,
      }, {
        consumer: createConsumer({
          ...kafka,
          groupId: config.RELAY_GROUP_ID,
          // Re-read every refresh: a new tenant's topic is picked up without a restart.
          topics: async () => (await admin.listTopics()).filter(isInboxTopic),
          topicRefreshMs: config.RELAY_TOPIC_REFRESH_MS,
          startFrom: "earliest",
          // Enough to keep every partition's calls busy while the next fetch runs.
          maxBuffered: Math.min(config.RELAY_MAX_PENDING, 5000),
          maxBufferedBytes: Math.min(config.RELAY_MAX_PENDING_BYTES, 16 * 1024 * 1024),
          sessionTimeoutMs: config.RELAY_SESSION_TIMEOUT_MS,
          heartbeatIntervalMs: Math.floor(config.RELAY_SESSION_TIMEOUT_MS / 10),
          onRecovery: (kind) => metrics.consumerRecoveries.inc({ kind }),
        }),
        producer: createProducer(kafka),
        admin,
        api: new ApiClient({
          apiUrl: config.API_URL,
          token: config.RELAY_TOKEN,
          timeoutMs: config.RELAY_API_TIMEOUT_MS,
          batch: {
            maxItems: config.RELAY_BATCH_MAX,
            maxBytes: config.RELAY_BATCH_MAX_BYTES,
            maxConcurrent: config.RELAY_BATCH_CONCURRENCY,
          },
        }),
        metrics,
        log,
      });
      await relay.start();
      log.info("relay started", {
        api: config.API_URL,
        brokers: config.KAFKA_BROKERS,
        group: config.RELAY_GROUP_ID,
      });
    },
    stop: async () => await relay?.stop(),
  };
  return [
    { name: "readiness admin", stop: () => probeAdmin.close() },
    // Metrics first: lag must be visible while Kafka or the API is still away.
    metricsPart(registry, config.RELAY_METRICS_HOST, config.RELAY_METRICS_PORT, log, {
      health: () => ({ pending: relay?.pending ?? 0 }),
      probes: {
        kafka: (signal) => abortable(probeAdmin.listTopics(), signal),
        api: httpProbe(`${config.API_URL.replace(/\/+$/, "")}/healthz`),
      },
    }),
    inbox,
  ];
}
