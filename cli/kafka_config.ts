/** The Kafka settings the command-line tools share. */
import { z } from "zod";
import { brokerList, kafkaEnv, logEnv, processEnv, readEnv } from "../core/config.ts";

export const KafkaCliEnv = z.object({ ...kafkaEnv, ...logEnv });
export type KafkaCliConfig = z.infer<typeof KafkaCliEnv> & { brokers: string[] };

/** Reads KAFKA_* and LOG_LEVEL once; throws a one-line ConfigError naming a bad variable. */
export function readKafkaCliConfig(): KafkaCliConfig {
  const c = readEnv(KafkaCliEnv, processEnv());
  return { ...c, brokers: brokerList(c.KAFKA_BROKERS) };
}
