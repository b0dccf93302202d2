/**
 * A consumer group member in a process of its own, for tests that need one
 * to stop answering (SIGSTOP) while staying in the group:
 *
 *   deno run --allow-net --allow-env tests/support/group_member.ts <brokers> <group> <topic> <session ms>
 *
 * Prints "joined" once the group assigned it something and "assigned 0,1"
 * each time its assignment changes, then reads (and drops) until killed.
 * A line "commit <partition> <offset>" on stdin commits that offset and
 * prints "committed" (or "commit gave up"). Its log lines go to stdout
 * prefixed with "log ".
 */
import { createConsumer } from "../../kafka/consumer.ts";
import { createLogger } from "../../core/log.ts";

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
  logger: createLogger("group-member", "info", (line) => console.log(`log ${line}`)),
});
let joined = false;
let assigned = "";
setInterval(() => {
  const now = (consumer.assignment ?? []).map((a) => a.partition).sort().join(",");
  if (now === assigned) return;
  assigned = now;
  if (now !== "" && !joined) {
    joined = true;
    console.log("joined");
  }
  console.log(`assigned ${now}`);
}, 50);
void (async () => {
  let pending = "";
  for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
    pending += chunk;
    const lines = pending.split("\n");
    pending = lines.pop()!;
    for (const line of lines) {
      const [command, partition, offset] = line.split(" ");
      if (command !== "commit") continue;
      consumer.commit([{ topic, partition: Number(partition), offset: BigInt(offset) }]).then(
        () => console.log("committed"),
        () => console.log("commit gave up"),
      );
    }
  }
})();
for await (const _ of consumer) { /* read and drop */ }
