/** Declaration of the per-tenant topics (names live in contracts/topics.ts). */
import { tenantTopics } from "../contracts/topics.ts";
import type { KafkaAdmin } from "./admin.ts";

export interface TenantTopicOptions {
  partitions: number;
  replicationFactor: number;
  retentionMs: number;
}

/**
 * Declares a tenant's `events`, `dispatch` and `dispatch.dlq` topics;
 * idempotent (topics that exist are left as they are). Says which were new.
 */
export function ensureTenantTopics(
  admin: KafkaAdmin,
  tenant: string,
  opts: TenantTopicOptions,
): Promise<{ created: string[]; existing: string[] }> {
  const names = tenantTopics(tenant);
  return admin.createTopics(names.map((name) => ({
    name,
    partitions: opts.partitions,
    replicationFactor: opts.replicationFactor,
    configs: { "retention.ms": String(opts.retentionMs) },
  })));
}
