/**
 * The inbox relay's Prometheus metrics, on a registry of its own (never
 * prom-client's global one), and the small server exposing them.
 */
import client from "prom-client";

/** The relay's metrics. */
export type RelayMetrics = ReturnType<typeof createRelayMetrics>;

/** Creates the relay's metrics on `registry`. */
export function createRelayMetrics(registry: client.Registry) {
  const registers = [registry];
  return {
    registry,
    lagMessages: new client.Gauge({
      name: "poimen_inbox_lag_messages",
      help:
        "Dispatch messages not yet committed by the relay's group: end offset - committed offset",
      labelNames: ["topic", "partition"] as const,
      registers,
    }),
    lagSeconds: new client.Gauge({
      name: "poimen_inbox_lag_seconds",
      help: "Age of the oldest dispatch message not yet done (0 when caught up)",
      labelNames: ["topic", "partition"] as const,
      registers,
    }),
    messages: new client.Counter({
      name: "poimen_inbox_messages_total",
      help: "Dispatch and signal messages finished, by outcome: created, replayed, dead_lettered",
      labelNames: ["outcome"] as const,
      registers,
    }),
    retries: new client.Counter({
      name: "poimen_inbox_retries_total",
      help: "Retried attempts, by reason: the code of the API's problem (e.g. " +
        "database-unavailable, unauthorized, unknown-workflow), network, timeout or " +
        "unexpected-response (no poimen answer), kafka-unavailable (a dead letter not written)",
      labelNames: ["reason"] as const,
      registers,
    }),
    apiDuration: new client.Histogram({
      name: "poimen_inbox_api_call_duration_seconds",
      help: "Duration of one API call by the relay (POST /v1/runs or a signal), by result kind",
      labelNames: ["result"] as const,
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30],
      registers,
    }),
    pending: new client.Gauge({
      name: "poimen_inbox_pending_messages",
      help: "Dispatch messages fetched and not yet done",
      registers,
    }),
    pendingBytes: new client.Gauge({
      name: "poimen_inbox_pending_bytes",
      help: "Bytes of the values of dispatch messages fetched and not yet done",
      registers,
    }),
    pausedPartitions: new client.Gauge({
      name: "poimen_inbox_paused_partitions",
      help: "Partitions paused behind a message whose admission keeps failing",
      registers,
    }),
    partitionPauses: new client.Counter({
      name: "poimen_inbox_partition_pauses_total",
      help: "Times a partition was paused behind a failing message",
      registers,
    }),
    consumerRecoveries: new client.Counter({
      name: "poimen_inbox_consumer_recoveries_total",
      help: "Kafka client calls that hung and were worked around, by kind (join-timeout, " +
        "stream-stalled, stream-close-timeout, list-topics-timeout)",
      labelNames: ["kind"] as const,
      registers,
    }),
    commits: new client.Counter({
      name: "poimen_inbox_commits_total",
      help: "Offset commits acknowledged by the broker",
      registers,
    }),
  };
}
