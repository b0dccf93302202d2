/**
 * kafka/ (producer, consumer, admin) against the real development broker (no mocks). Expects the
 * broker from `deno task kafka start` and starts it when absent. Every test
 * uses its own random tenant/topic/group names, so they run in any order.
 *
 *   deno test -A tests/kafka_test.ts
 */
import assert from "node:assert/strict";
import { assertNotLogged } from "./support/logs.ts";
import { brokerAddress, startBroker } from "../dev/kafka.ts";
import { type ConsumedMessage, createConsumer, type KafkaConsumer } from "../kafka/consumer.ts";
import { createAdmin, type KafkaAdmin } from "../kafka/admin.ts";
import { createProducer } from "../kafka/producer.ts";
import {
  dispatchTopic,
  dlqTopic,
  eventsTopic,
  signalsTopic,
  tenantOfTopic,
  tenantTopics,
} from "../contracts/topics.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createLogger } from "../core/log.ts";
import { waitFor } from "./support/db.ts";
import { childMember, KAFKA_TEST, type MemberProcess, privateBroker } from "./support/kafka.ts";
import { delay, SECOND, within } from "../core/time.ts";

const BROKERS = [brokerAddress()];

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

/** Collects everything a consumer yields, in the background. */
function collect(consumer: KafkaConsumer): ConsumedMessage[] {
  const got: ConsumedMessage[] = [];
  void (async () => {
    for await (const m of consumer) got.push(m);
  })();
  return got;
}

const text = (m: ConsumedMessage) => new TextDecoder().decode(m.value);

/** A member of `groupId` reading `topic`, quick to notice rebalances. */
function groupMember(groupId: string, topic: string): KafkaConsumer {
  return createConsumer({
    brokers: BROKERS,
    clientId: "poimen-test",
    groupId,
    topics: [topic],
    sessionTimeoutMs: 6000,
    heartbeatIntervalMs: 300,
  });
}

/** A member of `groupId` (tests/support/group_member.ts) in a process of its own, to freeze. */
function memberProcess(groupId: string, topic: string, sessionMs: number): MemberProcess {
  return childMember(new URL("./support/group_member.ts", import.meta.url), [
    BROKERS.join(","),
    groupId,
    topic,
    String(sessionMs),
  ]);
}

async function withAdmin<T>(fn: (admin: KafkaAdmin) => Promise<T>): Promise<T> {
  const admin = createAdmin({ brokers: BROKERS, clientId: "poimen-test" });
  try {
    return await fn(admin);
  } finally {
    await admin.close();
  }
}

await startBroker();

Deno.test("topic names: helpers round-trip and reject bad tenant ids", () => {
  assert.equal(eventsTopic("acme"), "poimen.acme.events");
  assert.equal(dispatchTopic("acme"), "poimen.acme.dispatch");
  assert.equal(dlqTopic("a_b-1"), "poimen.a_b-1.dispatch.dlq");
  for (const t of ["acme", "a_b-1"]) {
    assert.equal(tenantOfTopic(eventsTopic(t)), t);
    assert.equal(tenantOfTopic(dispatchTopic(t)), t);
    assert.equal(tenantOfTopic(dlqTopic(t)), t);
    assert.equal(tenantOfTopic(signalsTopic(t)), t);
  }
  assert.equal(tenantOfTopic("poimen.acme.other"), undefined);
  assert.equal(tenantOfTopic("__consumer_offsets"), undefined);
  for (const bad of ["", "a.b", "ACME", "x".repeat(64), "a b"]) {
    assert.throws(() => dispatchTopic(bad), TypeError);
  }
});

Deno.test("kafka: tenant topic declaration is idempotent", KAFKA_TEST, async () => {
  await withAdmin(async (admin) => {
    const tenant = `decl-${suffix()}`;
    const names = tenantTopics(tenant);
    assert.deepEqual(names, [
      eventsTopic(tenant),
      dispatchTopic(tenant),
      dlqTopic(tenant),
      signalsTopic(tenant),
    ]);
    const opts = { partitions: 3, replicationFactor: 1, retentionMs: 3_600_000 };
    try {
      const first = await ensureTenantTopics(admin, tenant, opts);
      assert.deepEqual(first, { created: names, existing: [] });
      const second = await ensureTenantTopics(admin, tenant, opts);
      assert.deepEqual(second, { created: [], existing: names });

      const listed = new Set(await admin.listTopics());
      for (const n of names) assert.ok(listed.has(n), `${n} listed`);
      const counts = await admin.partitionCounts(names);
      assert.deepEqual(Object.fromEntries(counts), Object.fromEntries(names.map((n) => [n, 3])));
    } finally {
      await admin.deleteTopics(names);
    }
    // Deleting again (already gone) is fine too.
    await admin.deleteTopics(names);
  });
});

Deno.test(
  "kafka: a key lands on the Java client's partition; offsets per message",
  KAFKA_TEST,
  async () => {
    const topic = `test.partition.${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 2, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      try {
        // murmur2("abc") = 479470107 and murmur2("a-little-bit-long-string") =
        // -985981536 (Kafka's own test vectors); positive part modulo 2: 1 and 0.
        const acked = await producer.send([
          { topic, key: "abc", value: "1" },
          { topic, key: "a-little-bit-long-string", value: "2" },
          { topic, key: "abc", value: "3" },
          { topic, key: "abc", value: "4", partition: 0 },
        ]);
        assert.deepEqual(acked.map((o) => [o.partition, o.offset]), [[1, 0n], [0, 0n], [1, 1n], [
          0,
          1n,
        ]]);
        assert.deepEqual(
          (await admin.endOffsets([topic])).map((o) => [o.partition, o.offset]),
          [[0, 2n], [1, 2n]],
        );
      } finally {
        await producer.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: round trip with keys and headers; commits survive a consumer restart",
  KAFKA_TEST,
  async () => {
    const topic = `test.roundtrip.${suffix()}`;
    const group = `g-roundtrip-${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 1, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const binary = new Uint8Array([0, 1, 2, 254, 255]);
      try {
        const acked = await producer.send([
          { topic, key: "acme/k0", value: "zero", headers: { traceparent: "00-abc-def-01" } },
          { topic, key: "acme/k1", value: binary },
          { topic, key: "acme/k2", value: "two", headers: { a: "1", b: "ü" } },
        ]);
        assert.deepEqual(acked.map((o) => [o.topic, o.partition, o.offset]), [
          [topic, 0, 0n],
          [topic, 0, 1n],
          [topic, 0, 2n],
        ]);
      } finally {
        await producer.close();
      }

      const first = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId: group,
        topics: [topic],
      });
      try {
        const got = collect(first);
        await waitFor("3 messages", () => got.length >= 3);
        assert.deepEqual(got.map((m) => [m.key, m.offset]), [["acme/k0", 0n], ["acme/k1", 1n], [
          "acme/k2",
          2n,
        ]]);
        assert.equal(text(got[0]), "zero");
        assert.deepEqual(got[0].headers, { traceparent: "00-abc-def-01" });
        assert.deepEqual([...got[1].value], [...binary]);
        assert.deepEqual(got[1].headers, {});
        assert.deepEqual(got[2].headers, { a: "1", b: "ü" });
        assert.ok(
          Math.abs(got[0].timestamp - Date.now()) < 60 * SECOND,
          "timestamp is ms since epoch",
        );
        // Processed k0 and k1 only: the next offset to read is 2.
        await first.commit([{ topic, partition: 0, offset: got[1].offset + 1n }]);
      } finally {
        await first.close();
      }

      assert.deepEqual(await admin.committedOffsets(group), [{ topic, partition: 0, offset: 2n }]);
      assert.deepEqual(await admin.endOffsets([topic]), [{ topic, partition: 0, offset: 3n }]);
      assert.deepEqual(await admin.startOffsets([topic]), [{ topic, partition: 0, offset: 0n }]);

      const second = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId: group,
        topics: [topic],
      });
      try {
        const got = collect(second);
        await waitFor("the uncommitted message", () => got.length >= 1);
        assert.deepEqual(got.map((m) => [m.key, m.offset]), [["acme/k2", 2n]]);
      } finally {
        await second.close();
      }
      await admin.deleteTopics([topic]);
    });
  },
);

Deno.test(
  "kafka: a RegExp subscription picks up new tenants' topics without a restart",
  KAFKA_TEST,
  async () => {
    const run = suffix();
    const [t1, t2] = [`sub-${run}-a`, `sub-${run}-b`];
    const opts = { partitions: 2, replicationFactor: 1, retentionMs: 3_600_000 };
    await withAdmin(async (admin) => {
      await ensureTenantTopics(admin, t1, opts);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const consumer = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId: `g-sub-${run}`,
        topics: new RegExp(`^poimen\\.sub-${run}-[a-z]\\.dispatch$`),
        topicRefreshMs: 300,
      });
      try {
        const got = collect(consumer);
        await producer.send([{ topic: dispatchTopic(t1), key: `${t1}/d1`, value: "{}" }]);
        await waitFor("the first tenant's message", () => got.length >= 1);
        assert.deepEqual(consumer.topics, [dispatchTopic(t1)]);

        await ensureTenantTopics(admin, t2, opts);
        await producer.send([{ topic: dispatchTopic(t2), key: `${t2}/d1`, value: "{}" }]);
        await waitFor("the second tenant's message", () => got.length >= 2);
        assert.deepEqual(got.map((m) => tenantOfTopic(m.topic)), [t1, t2]);
        assert.deepEqual(consumer.topics, [dispatchTopic(t1), dispatchTopic(t2)]);

        // Still consuming the first tenant after the rebalance, with no redelivery.
        await producer.send([{ topic: dispatchTopic(t1), key: `${t1}/d2`, value: "{}" }]);
        await waitFor("the first tenant's second message", () => got.length >= 3);
        assert.deepEqual(got.map((m) => m.key), [`${t1}/d1`, `${t2}/d1`, `${t1}/d2`]);
      } finally {
        await consumer.close();
        await producer.close();
        await admin.deleteTopics(
          [t1, t2].flatMap((t) => [eventsTopic(t), dispatchTopic(t), dlqTopic(t)]),
        );
      }
    });
  },
);

Deno.test(
  "kafka: messages and the consumer survive a broker stop and start",
  KAFKA_TEST,
  async () => {
    // A broker of this test's own: stopping the shared one would break
    // whatever else is using it meanwhile.
    await using broker = await privateBroker();
    const brokers = [broker.address];
    const run = suffix();
    const tenant = `restart-${run}`;
    const topic = dispatchTopic(tenant);
    const lines: string[] = [];
    const logger = createLogger("test", "debug", (line) => lines.push(line));
    try {
      const admin = createAdmin({ brokers, clientId: "poimen-test" });
      await ensureTenantTopics(admin, tenant, {
        partitions: 1,
        replicationFactor: 1,
        retentionMs: 3_600_000,
      })
        .finally(() => admin.close());

      const producer = createProducer({ brokers, clientId: "poimen-test" });
      const survivor = createConsumer({
        brokers,
        clientId: "poimen-test",
        groupId: `g-survivor-${run}`,
        topics: [topic],
        logger,
      });
      try {
        const survived = collect(survivor);
        await producer.send([{ topic, key: `${tenant}/before`, value: "before" }]);
        await waitFor("the message before the stop", () => survived.length >= 1);

        assert.equal(await broker.stop(), true);
        // Keep the broker down until the consumer noticed (its fetch retries ran
        // out), so what follows exercises its reconnect, not a brief hiccup.
        await waitFor(
          "the consumer to notice the outage",
          () => lines.some((l) => l.includes("kafka consumer failed")),
          90 * SECOND,
        );
        await broker.start();

        // The message written before the stop is still there for a new group.
        const fresh = createConsumer({
          brokers,
          clientId: "poimen-test",
          groupId: `g-fresh-${run}`,
          topics: [topic],
        });
        try {
          const got = collect(fresh);
          await waitFor("the pre-stop message in a new group", () => got.length >= 1, 60 * SECOND);
          assert.equal(text(got[0]), "before");
        } finally {
          await fresh.close();
        }

        // The consumer that lived through the outage carries on, without redelivery.
        await producer.send([{ topic, key: `${tenant}/after`, value: "after" }]);
        await waitFor(
          "the post-start message in the surviving consumer",
          () => survived.length >= 2,
          90 * SECOND,
        );
        assert.deepEqual(survived.map(text), ["before", "after"]);
      } finally {
        await survivor.close();
        await producer.close();
      }
    } catch (error) {
      if (Deno.env.get("KAFKA_TEST_DEBUG")) console.error(lines.join("\n"));
      throw error;
    }
  },
);

Deno.test(
  "kafka: a message handed out and then redelivered is marked superseded and comes again",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.supersede.${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 1, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const consumer = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId: `test-${suffix()}`,
        topics: [topic],
      });
      try {
        await producer.send(["a", "b", "c"].map((value) => ({ topic, key: "k", value })));
        const messages = consumer[Symbol.asyncIterator]();
        const a = (await messages.next()).value as ConsumedMessage;
        const b = (await messages.next()).value as ConsumedMessage;
        assert.deepEqual([text(a), text(b)], ["a", "b"]);
        // As if b were still on its way to the reader: redelivered from it.
        consumer.redeliverFrom(topic, 0, b.offset);
        assert.equal(b.superseded, true, "the reader is told to drop it");
        assert.equal(a.superseded, undefined, "what came before is untouched");
        const again = (await messages.next()).value as ConsumedMessage;
        assert.deepEqual([text(again), again.offset, again.superseded], ["b", b.offset, undefined]);
        assert.equal(text((await messages.next()).value as ConsumedMessage), "c");
      } finally {
        await consumer.close();
        await producer.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: a redelivered partition comes again without a rebalance of the group",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.norebalance.${suffix()}`;
    const groupId = `test-${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 2, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const member = () => groupMember(groupId, topic);
      const first = member();
      const second = member();
      try {
        const got = [collect(first), collect(second)];
        await waitFor(
          "both members assigned a partition",
          () => first.assignment?.length === 1 && second.assignment?.length === 1,
          30 * SECOND,
        );
        await producer.send(
          [0, 1].map((partition) => ({ topic, key: "k", value: "a", partition })),
        );
        await waitFor("one message each", () => got[0].length === 1 && got[1].length === 1);
        const joins = [first.joins, second.joins];
        const [m] = got[0];
        first.redeliverFrom(m.topic, m.partition, m.offset);
        await waitFor("the message again", () => got[0].length === 2, 30 * SECOND);
        assert.deepEqual([got[0][1].partition, got[0][1].offset], [m.partition, m.offset]);
        // New messages still flow to both, and nobody joined again.
        await producer.send(
          [0, 1].map((partition) => ({ topic, key: "k", value: "b", partition })),
        );
        await waitFor("the next messages", () => got[0].length === 3 && got[1].length === 2);
        assert.deepEqual([first.joins, second.joins], joins);
      } finally {
        await second.close();
        await first.close();
        await producer.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: a commit from a member the group moved on from is refused, not sent again under a new generation",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.stalecommit.${suffix()}`;
    const groupId = `test-${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 2, replicationFactor: 1 }]);
      const committedAt = async (partition: number) =>
        (await admin.committedOffsets(groupId, [topic])).find((o) => o.partition === partition)
          ?.offset;
      // Frozen while it owns both partitions, the first member is dropped by
      // the group after its session (6 s), which gives both to the second.
      const first = memberProcess(groupId, topic, 6 * SECOND);
      let second: MemberProcess | undefined;
      try {
        await waitFor("the first member owns both", () => first.out.includes("assigned 0,1"));
        Deno.kill(first.pid, "SIGSTOP");
        const other = second = memberProcess(groupId, topic, 120 * SECOND);
        await waitFor(
          "the second member owns both",
          () => other.out.includes("assigned 0,1"),
          60 * SECOND,
        );
        await other.send("commit 1 10");
        await waitFor("the second member's commit", () => other.out.includes("committed"));
        assert.equal(await committedAt(1), 10n);
        // Frozen too, the second member holds any rejoin for two minutes: the
        // first one, thawed, still believes it owns partition 1 meanwhile, and
        // commits what it did before it was dropped.
        Deno.kill(other.pid, "SIGSTOP");
        await first.send("commit 1 3");
        Deno.kill(first.pid, "SIGCONT");
        await waitFor(
          "the late commit refused",
          () => first.out.some((l) => l.includes("kafka commit failed")),
        );
        assert.equal(await committedAt(1), 10n);
        assert.ok(!first.out.includes("committed"));
      } finally {
        await first.kill();
        await second?.kill();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: an idle consumer keeps fetching and is never taken for a stalled one",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.idle.${suffix()}`;
    const lines: string[] = [];
    const recoveries: string[] = [];
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 1, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const consumer = createConsumer({
        brokers: BROKERS,
        clientId: "poimen-test",
        groupId: `test-${suffix()}`,
        topics: [topic],
        // A stream is taken for stalled after 0.5 + 1 + 2 s without a fetch.
        maxWaitMs: 500,
        requestTimeoutMs: 1000,
        logger: createLogger("test", "debug", (line) => lines.push(line)),
        onRecovery: (kind) => recoveries.push(kind),
      });
      try {
        const got = collect(consumer);
        await waitFor("an assignment", () => consumer.assignment?.length === 1, 30 * SECOND);
        // Idleness is what is tested here (three stall windows of it), not a
        // stand-in for a condition; then a message still comes at once.
        await delay(10 * SECOND);
        await producer.send([{ topic, key: "k", value: "late" }]);
        await waitFor("the late message", () => got.length === 1, 10 * SECOND);
        assertNotLogged(lines, "kafka stream stopped fetching, starting it again");
        assert.deepEqual(recoveries, []);
        assert.equal(consumer.joins, 1);
      } finally {
        await consumer.close();
        await producer.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: partitions given to a second member are reported revoked, and never handed out again",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.revoke.${suffix()}`;
    const groupId = `test-${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 4, replicationFactor: 1 }]);
      const producer = createProducer({ brokers: BROKERS, clientId: "poimen-test" });
      const member = () => groupMember(groupId, topic);
      const first = member();
      const revoked: { topic: string; partition: number }[] = [];
      first.onRevoked((ps) => revoked.push(...ps));
      let second: KafkaConsumer | undefined;
      try {
        const got = collect(first);
        await producer.send(
          [0, 1, 2, 3].map((partition) => ({ topic, key: "k", value: "x", partition })),
        );
        await waitFor("all four partitions", () => got.length === 4, 30 * SECOND);
        assert.equal(first.assignment?.length, 4);

        second = member();
        const gotSecond = collect(second);
        await waitFor("a partition revoked", () => revoked.length > 0, 30 * SECOND);
        await waitFor("the assignment split", () => first.assignment?.length === 2, 30 * SECOND);
        const kept = new Set(first.assignment!.map((a) => a.partition));
        assert.deepEqual(
          revoked.map((r) => r.partition).sort(),
          [0, 1, 2, 3].filter((p) => !kept.has(p)),
        );
        assert.ok(revoked.every((r) => r.topic === topic));

        // New messages of a revoked partition go to the second member only.
        const before = got.length;
        await producer.send(
          [0, 1, 2, 3].map((partition) => ({ topic, key: "k", value: "y", partition })),
        );
        await waitFor(
          "the second member's share",
          () => gotSecond.some((m) => text(m) === "y"),
          30 * SECOND,
        );
        await waitFor("the first member's share", () => got.length === before + 2, 30 * SECOND);
        assert.ok(got.slice(before).every((m) => kept.has(m.partition)));
      } finally {
        await second?.close();
        await first.close();
        await producer.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);

Deno.test(
  "kafka: close() returns while a join waits on a member that stopped answering",
  { sanitizeOps: false, sanitizeResources: false },
  async () => {
    const topic = `test.frozen.${suffix()}`;
    const groupId = `test-${suffix()}`;
    await withAdmin(async (admin) => {
      await admin.createTopics([{ name: topic, partitions: 2, replicationFactor: 1 }]);
      // A member whose session outlasts the test: frozen, it holds every
      // other member's join until the coordinator gives up on it.
      const frozen = memberProcess(groupId, topic, 120 * SECOND);
      let joining: KafkaConsumer | undefined;
      try {
        await waitFor("the member joined", () => frozen.out.includes("joined"));
        Deno.kill(frozen.pid, "SIGSTOP");
        joining = createConsumer({
          brokers: BROKERS,
          clientId: "poimen-test",
          groupId,
          topics: [topic],
          sessionTimeoutMs: 6 * SECOND,
          heartbeatIntervalMs: 300,
        });
        collect(joining);
        await waitFor("a rebalance waiting on the frozen member", async () => {
          const group = await admin.groupState(groupId);
          return group.state === "PREPARING_REBALANCE" || group.state === "PreparingRebalance";
        }, 30 * SECOND);
        assert.equal(joining.assignment, undefined, "the join is still waiting");
        const closed = await within(joining.close(), 10 * SECOND);
        assert.ok(closed, "close() came back without waiting for the join");
      } finally {
        await frozen.kill();
        await joining?.close();
        await admin.deleteTopics([topic]);
      }
    });
  },
);
