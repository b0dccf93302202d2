/**
 * `deno task topics <tenant>…`: declares each tenant's `events`, `dispatch`
 * and `dispatch.dlq` topics (partitions, replication factor and retention
 * from TOPIC_*), idempotently. Prints one line per topic.
 */
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { isTenantId } from "../contracts/topics.ts";
import { readKafkaCliConfig } from "./kafka_config.ts";

export async function main(args: string[]): Promise<number> {
  if (args.length === 0) {
    console.error("usage: topics <tenant>…");
    return 64;
  }
  const bad = args.find((t) => !isTenantId(t));
  if (bad !== undefined) {
    console.error(
      `topics: bad tenant id ${JSON.stringify(bad)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
    return 64;
  }
  const config = readKafkaCliConfig();
  const admin = createAdmin({
    brokers: config.brokers,
    clientId: `${config.KAFKA_CLIENT_ID}-topics`,
  });
  try {
    for (const tenant of args) {
      const { created, existing } = await ensureTenantTopics(admin, tenant, {
        partitions: config.TOPIC_PARTITIONS,
        replicationFactor: config.TOPIC_REPLICATION_FACTOR,
        retentionMs: config.TOPIC_RETENTION_MS,
      });
      for (const t of created) console.log(`created ${t}`);
      for (const t of existing) console.log(`exists  ${t}`);
    }
    return 0;
  } finally {
    await admin.close();
  }
}
