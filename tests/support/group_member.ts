/**
 * A consumer group member in a process of its own, for tests that need one
 * to stop answering (SIGSTOP) while staying in the group:
 *
 *   deno run --allow-net --allow-env tests/support/group_member.ts <brokers> <group> <topic> <session ms>
 *
 * Prints "joined" once the group assigned it something, then reads until
 * killed.
 */
import { createConsumer } from "../../kafka/consumer.ts";

const [brokers, groupId, topic, session] = Deno.args;
const sessionTimeoutMs = Number(session);
const consumer = createConsumer({
  brokers: brokers.split(","),
  clientId: "poimen-test-member",
  groupId,
  topics: [topic],
  sessionTimeoutMs,
  rebalanceTimeoutMs: sessionTimeoutMs,
  heartbeatIntervalMs: 300,
});
const joined = setInterval(() => {
  if (!consumer.assignment?.length) return;
  clearInterval(joined);
  console.log("joined");
}, 50);
for await (const _ of consumer) { /* read and drop */ }
