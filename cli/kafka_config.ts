/** The Kafka settings the command-line tools share. */
import { z } from "zod";
import { kafkaEnv, logEnv, processEnv, readEnv } from "../core/config.ts";
import { kafkaConnection, type KafkaSecurity } from "../kafka/security.ts";

export const KafkaCliEnv = z.object({ ...kafkaEnv, ...logEnv });
export type KafkaCliConfig = z.infer<typeof KafkaCliEnv> & {
  brokers: string[];
  security: KafkaSecurity;
};

/**
 * Reads KAFKA_* and LOG_LEVEL once (and the PEM files they name); throws a
 * one-line ConfigError naming a bad variable.
 */
export function readKafkaCliConfig(): KafkaCliConfig {
  const c = readEnv(KafkaCliEnv, processEnv());
  return { ...c, ...kafkaConnection(c) };
}
