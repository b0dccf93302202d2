/**
 * kafka/fenced_commit.ts: what a commit sends (over the fake client of
 * tests/support/fake_group_client.ts), and the library behaviour it works
 * around, shown still there against the real broker: when that test fails
 * after an upgrade of @platformatic/kafka, its `commit()` may be fenced now,
 * and `FencedCommitter` may go.
 *
 *   deno test -A tests/kafka_fenced_commit_test.ts
 */
import assert from "node:assert/strict";
import { brokerAddress, startBroker } from "../dev/kafka.ts";
import { createConsumer, GroupConsumer, type KafkaConsumer } from "../kafka/consumer.ts";
import { createAdmin } from "../kafka/admin.ts";
import { silentLogger } from "../core/log.ts";
import { SECOND, within } from "../core/time.ts";
import { waitFor } from "./support/db.ts";
import { childMember, type MemberProcess } from "./support/kafka.ts";
import { fakeClients } from "./support/fake_group_client.ts";

const BROKERS = [brokerAddress()];

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/** A consumer of topic "t" over fake clients whose joins assign `partitions`. */
function fakeConsumer(partitions: number[]) {
  const { factory, clients } = fakeClients();
  const consumer = new GroupConsumer({
    brokers: ["127.0.0.1:1"],
    clientId: "poimen-test",
    groupId: "g",
    topics: ["t"],
  }, {
    log: silentLogger,
    clients: (events) => {
      const client = factory(events);
      client.partitions = partitions;
      return client;
    },
    lister: () => {
      throw new Error("no lister for a list");
    },
  });
  return { consumer, clients };
}

Deno.test("fenced commit: nothing of a partition this member does not own is sent", async () => {
  const { consumer } = fakeConsumer([0]);
  try {
    await waitFor("the assignment", () => consumer.assignment?.length === 1);
    // Owned nothing of it: done at once, no request (the fake coordinator would not answer one).
    const done = consumer.commit([{ topic: "t", partition: 1, offset: 5n }]);
    assert.ok(await within(done, 1000), "returned without sending");
  } finally {
    await consumer.close();
  }
});

Deno.test("fenced commit: a commit waiting for a membership rejects once closed", async () => {
  const { consumer, clients } = fakeConsumer([0]);
  await waitFor("the assignment", () => consumer.assignment?.length === 1);
  // The membership lost (as when the group moved on): nothing owned, so retried.
  clients[0].events.left();
  assert.deepEqual(consumer.assignment, []);
  const done = consumer.commit([{ topic: "t", partition: 0, offset: 5n }]);
  await consumer.close();
  await assert.rejects(done, /closed/);
  await assert.rejects(consumer.commit([]), /closed/);
});

await startBroker();

Deno.test(
  "library quirk (@platformatic/kafka 2.12.1): commit() of a member the group dropped joins again and re-sends under the new generation, over another member's partition",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.librarycommit.${suffix()}`;
    const groupId = `test-${suffix()}`;
    const admin = createAdmin({ brokers: BROKERS, clientId: "poimen-test" });
    await admin.createTopics([{ name: topic, partitions: 2, replicationFactor: 1 }]);
    const committed = async () =>
      (await admin.committedOffsets(groupId, [topic])).map((o) => o.offset);
    // On the bare library: frozen while it owns both partitions, it is
    // dropped after its session (6 s), which gives both to the other member.
    const stale: MemberProcess = childMember(
      new URL("./support/library_member.ts", import.meta.url),
      [BROKERS.join(","), groupId, topic, String(6 * SECOND)],
    );
    let other: KafkaConsumer | undefined;
    try {
      await waitFor("the first member owns both", () => stale.out.some((l) => l.endsWith(" 0,1")));
      Deno.kill(stale.pid, "SIGSTOP");
      other = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId,
        topics: [topic],
        sessionTimeoutMs: 30 * SECOND,
        heartbeatIntervalMs: 300,
      });
      const member = other;
      await waitFor(
        "the other member owns both",
        () => member.assignment?.length === 2,
        60 * SECOND,
      );
      await member.commit([0, 1].map((partition) => ({ topic, partition, offset: 10n })));
      assert.deepEqual(await committed(), [10n, 10n]);

      // Thawed, the dropped member commits what it did before it was dropped.
      await stale.send("commit 3");
      Deno.kill(stale.pid, "SIGCONT");
      const line = await waitFor(
        "the dropped member's commit",
        () => stale.out.find((l) => l.startsWith("commit")),
        60 * SECOND,
      );
      const [, before, after] = line.split(" ");
      assert.match(line, /^committed /, "the library's commit() was not refused");
      assert.ok(Number(after) > Number(before), `re-sent under a new generation (${line})`);
      // Both partitions moved back, though the group now gives one of them
      // to the other member: the reason commits are fenced in fenced_commit.ts.
      await waitFor("the group split", () => member.assignment?.length === 1, 60 * SECOND);
      assert.deepEqual(await committed(), [3n, 3n]);
    } finally {
      await stale.kill();
      await other?.close();
      await admin.deleteTopics([topic]);
      await admin.close();
    }
  },
);
