/** What the Kafka-facing tests share: the broker, sanitizer settings, a collecting consumer. */
import { brokerAddress } from "../../dev/kafka.ts";
import { type ConsumedMessage, createConsumer, type KafkaConsumer } from "../../kafka/consumer.ts";

/** The development broker the tests use (`deno task kafka start`; CI starts it). */
export const BROKER = brokerAddress();

/**
 * Options of a test that uses the Kafka client: it keeps sockets and retry
 * timers a moment past close(), which the sanitizers would flag, though
 * nothing the test does leaks.
 */
export const KAFKA_TEST = { sanitizeOps: false, sanitizeResources: false };

/**
 * A consumer of `topic` from the earliest offset, in a group of its own,
 * collecting into `got` in the background until `consumer.close()`.
 */
export function consume(topic: string): { got: ConsumedMessage[]; consumer: KafkaConsumer } {
  const consumer = createConsumer({
    brokers: [BROKER],
    clientId: "poimen-test",
    groupId: `test-${crypto.randomUUID()}`,
    topics: [topic],
    startFrom: "earliest",
  });
  const got: ConsumedMessage[] = [];
  void (async () => {
    for await (const m of consumer) got.push(m);
  })();
  return { got, consumer };
}
