/**
 * A consumer group member on the bare @platformatic/kafka consumer (no
 * poimen workaround), in a process of its own so a test can freeze it
 * (SIGSTOP) while it stays in the group:
 *
 *   deno run --allow-net --allow-env --allow-read tests/support/library_member.ts <brokers> <group> <topic> <session ms>
 *
 * Prints "assigned <generation> <partitions>" at each join (partitions
 * comma-separated). A line "commit <offset>" on stdin commits that offset on
 * every partition of the topic it was last assigned or had before (with the
 * library's own commit()), and prints "committed <generation before>
 * <generation after>" or "commit failed <message>".
 */
import { newLibraryConsumer } from "../../kafka/platformatic_group_client.ts";

const [brokers, groupId, topic, session] = Deno.args;
const sessionTimeout = Number(session);
const client = newLibraryConsumer({
  brokers: brokers.split(","),
  clientId: "poimen-test-library-member",
  groupId,
});
client.on("error", () => {});
const partitions = new Set<number>();
client.on(
  "consumer:group:join",
  (event: { generationId: number; assignments: { topic: string; partitions: number[] }[] }) => {
    const mine = event.assignments.filter((a) => a.topic === topic).flatMap((a) => a.partitions);
    for (const p of mine) partitions.add(p);
    console.log(`assigned ${event.generationId} ${mine.sort().join(",")}`);
  },
);
const stream = await client.consume({
  topics: [topic],
  mode: "committed",
  fallbackMode: "earliest",
  autocommit: false,
  sessionTimeout,
  rebalanceTimeout: sessionTimeout,
  heartbeatInterval: 300,
});
stream.on("data", () => {});
let pending = "";
for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
  pending += chunk;
  const lines = pending.split("\n");
  pending = lines.pop()!;
  for (const line of lines) {
    const [command, offset] = line.split(" ");
    if (command !== "commit") continue;
    const before = client.generationId;
    const offsets = [...partitions].map((partition) => ({
      topic,
      partition,
      offset: BigInt(offset),
      leaderEpoch: -1,
    }));
    client.commit({ offsets }).then(
      () => console.log(`committed ${before} ${client.generationId}`),
      (error: Error) => console.log(`commit failed ${error.message}`),
    );
  }
}
