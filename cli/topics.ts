/**
 * `deno task topics <tenant>…`: declares each tenant's `events`, `dispatch`,
 * `dispatch.dlq` and `signals` topics (partitions, replication factor and retention
 * from TOPIC_*), idempotently. Prints one line per topic.
 */
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { isTenantId } from "../contracts/topics.ts";
import { KafkaCliEnv, readKafkaCliConfig } from "./kafka_config.ts";
import { type CommandSpec, parseCommandLine, usageError } from "../core/command_line.ts";

const COMMAND = {
  name: "topics",
  synopsis: "<tenant>…",
  description: `
Declares each tenant's events, dispatch, dispatch.dlq and signals topics
(partitions, replication factor and retention from TOPIC_*, max.message.bytes
from EVENTS_MAX_MESSAGE_BYTES), idempotently. Prints one line per topic.`,
  positionals: { min: 1, max: Infinity },
  env: KafkaCliEnv,
} satisfies CommandSpec;

export async function main(argv: string[]): Promise<number> {
  const line = parseCommandLine(COMMAND, argv);
  if (typeof line === "number") return line;
  const args = line.positionals;
  const bad = args.find((t) => !isTenantId(t));
  if (bad !== undefined) {
    return usageError(
      COMMAND,
      `bad tenant id ${JSON.stringify(bad)}: use a-z, 0-9, _ and -, 1-63 chars`,
    );
  }
  const config = readKafkaCliConfig();
  const admin = createAdmin({
    brokers: config.brokers,
    security: config.security,
    clientId: `${config.KAFKA_CLIENT_ID}-topics`,
  });
  try {
    for (const tenant of args) {
      const { created, existing } = await ensureTenantTopics(admin, tenant, {
        partitions: config.TOPIC_PARTITIONS,
        replicationFactor: config.TOPIC_REPLICATION_FACTOR,
        retentionMs: config.TOPIC_RETENTION_MS,
        maxMessageBytes: config.EVENTS_MAX_MESSAGE_BYTES,
      });
      for (const t of created) console.log(`created ${t}`);
      for (const t of existing) console.log(`exists  ${t}`);
    }
    return 0;
  } finally {
    await admin.close();
  }
}
