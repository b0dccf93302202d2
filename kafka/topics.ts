/** Declaration of the per-tenant topics (names live in contracts/topics.ts). */
import { dispatchTopic, dlqTopic, eventsTopic, signalsTopic } from "../contracts/topics.ts";
import type { KafkaAdmin, TopicSpec } from "./admin.ts";

export interface TenantTopicOptions {
  partitions: number;
  replicationFactor: number;
  retentionMs: number;
  /**
   * `max.message.bytes` of the events, dispatch and signals topics
   * (EVENTS_MAX_MESSAGE_BYTES): the largest record batch the broker accepts.
   * Set explicitly so the limit the outbox checks events against is the
   * topic's, not whatever the broker's default happens to be. Default 1 MiB.
   */
  maxMessageBytes?: number;
}

/** `max.message.bytes` of the events, dispatch and signals topics unless told otherwise (1 MiB). */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024;

// A dead letter is the dispatch (or signal) message plus the relay's reason headers: room
// for those, so a dispatch message at the limit can still be dead-lettered.
const DLQ_HEADROOM_BYTES = 64 * 1024;

/** The specs of a tenant's `events`, `dispatch`, `dispatch.dlq` and `signals` topics. */
export function tenantTopicSpecs(tenant: string, opts: TenantTopicOptions): TopicSpec[] {
  const max = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const spec = (name: string, maxMessageBytes: number): TopicSpec => ({
    name,
    partitions: opts.partitions,
    replicationFactor: opts.replicationFactor,
    configs: {
      "retention.ms": String(opts.retentionMs),
      "max.message.bytes": String(maxMessageBytes),
    },
  });
  return [
    spec(eventsTopic(tenant), max),
    spec(dispatchTopic(tenant), max),
    spec(dlqTopic(tenant), max + DLQ_HEADROOM_BYTES),
    spec(signalsTopic(tenant), max),
  ];
}

/**
 * Declares a tenant's `events`, `dispatch`, `dispatch.dlq` and `signals` topics;
 * idempotent (topics that exist are left as they are, limits included). Says
 * which were new.
 */
export function ensureTenantTopics(
  admin: KafkaAdmin,
  tenant: string,
  opts: TenantTopicOptions,
): Promise<{ created: string[]; existing: string[] }> {
  return admin.createTopics(tenantTopicSpecs(tenant, opts));
}
