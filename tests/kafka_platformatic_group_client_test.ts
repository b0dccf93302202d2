/**
 * kafka/platformatic_group_client.ts against the real broker: the
 * behaviours of @platformatic/kafka 2.12.1 its workarounds exist for, shown
 * still there on the bare library, and the adapter working around them. When
 * a "library quirk" test fails after an upgrade, the workaround it names may
 * go.
 *
 *   deno test -A tests/kafka_platformatic_group_client_test.ts
 */
import assert from "node:assert/strict";
import type { Buffer } from "node:buffer";
import type { ConsumeOptions } from "@platformatic/kafka";
import { brokerAddress, startBroker } from "../dev/kafka.ts";
import { createAdmin, type KafkaAdmin } from "../kafka/admin.ts";
import type { ConsumeSettings } from "../kafka/group_client.ts";
import {
  type LibraryConsumer,
  newLibraryConsumer,
  platformaticGroupClient,
} from "../kafka/platformatic_group_client.ts";
import { silentLogger } from "../core/log.ts";
import { SECOND } from "../core/time.ts";

const BROKERS = [brokerAddress()];
const SANITIZERS_OFF = { sanitizeOps: false, sanitizeResources: false };

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

async function withTopic(fn: (topic: string, admin: KafkaAdmin) => Promise<void>): Promise<void> {
  const topic = `test.quirk.${suffix()}`;
  const admin = createAdmin({ brokers: BROKERS, clientId: "poimen-test" });
  try {
    await admin.createTopics([{ name: topic, partitions: 1, replicationFactor: 1 }]);
    await fn(topic, admin);
  } finally {
    await admin.deleteTopics([topic]).catch(() => {});
    await admin.close();
  }
}

/** A bare library consumer of a group of its own, counting its joins. */
function libraryConsumer(): { client: LibraryConsumer; joins: () => number } {
  const client = newLibraryConsumer({
    brokers: BROKERS,
    clientId: "poimen-test",
    groupId: `test-${suffix()}`,
  });
  client.on("error", () => {});
  let joins = 0;
  client.on("consumer:group:join", () => joins++);
  return { client, joins: () => joins };
}

function consumeOptions(
  topic: string,
  session = 6 * SECOND,
): ConsumeOptions<string, Buffer, string, string> {
  return {
    topics: [topic],
    mode: "committed",
    fallbackMode: "earliest",
    autocommit: false,
    sessionTimeout: session,
    rebalanceTimeout: session,
    heartbeatInterval: Math.min(300, session),
  };
}

await startBroker();

Deno.test(
  "library quirk (@platformatic/kafka 2.12.1): a consume of a topic not tracked joins the group again, and a stream's end untracks its topics",
  SANITIZERS_OFF,
  async () => {
    await withTopic(async (topic) => {
      const { client, joins } = libraryConsumer();
      try {
        const first = await client.consume(consumeOptions(topic));
        // Reported before the stream exists: the adapter learns the
        // assignment before anything of it is fetched.
        assert.equal(joins(), 1);
        await first.close();
        assert.equal(client.topics.has(topic), false, "the stream's end untracked its topic");
        const second = await client.consume(consumeOptions(topic));
        assert.equal(joins(), 2, "a restarted stream rejoined the group");

        // Kept tracked across the end, the next consume reuses the membership
        // (what GroupClient.holdMembership does).
        client.topics.trackAll(topic);
        await second.close();
        const third = await client.consume(consumeOptions(topic));
        assert.equal(joins(), 2, "no rejoin with the topic held");
        client.topics.untrackAll(topic);
        await third.close();
      } finally {
        await client.close(true);
      }
    });
  },
);

Deno.test(
  "library quirk (@platformatic/kafka 2.12.1): a consume whose join failed leaves its topics tracked",
  SANITIZERS_OFF,
  async () => {
    await withTopic(async (topic) => {
      const { client } = libraryConsumer();
      try {
        // Below the broker's group.min.session.timeout.ms (6 s by default):
        // the join is refused with INVALID_SESSION_TIMEOUT, not retried.
        await assert.rejects(client.consume(consumeOptions(topic, 1000)));
        assert.equal(client.topics.has(topic), true);
      } finally {
        await client.close(true);
      }
    });
  },
);

/** The adapter over its own group, counting the joins it reports. */
function adapter() {
  let joins = 0;
  const client = platformaticGroupClient(
    { brokers: BROKERS, clientId: "poimen-test", groupId: `test-${suffix()}` },
    silentLogger,
    { joined: () => joins++, left: () => {} },
  );
  return { client, joins: () => joins };
}

function settings(topic: string, session = 6 * SECOND): ConsumeSettings {
  return {
    topics: [topic],
    startFrom: "earliest",
    maxWaitMs: 500,
    maxFetchBytes: 1024 * 1024,
    sessionTimeoutMs: session,
    rebalanceTimeoutMs: session,
    heartbeatIntervalMs: Math.min(300, session),
  };
}

Deno.test(
  "platformatic group client: a stream restarted with the membership held does not rejoin",
  SANITIZERS_OFF,
  async () => {
    await withTopic(async (topic) => {
      const { client, joins } = adapter();
      try {
        const first = await client.consume(settings(topic));
        assert.equal(joins(), 1);
        client.holdMembership([topic]);
        client.holdMembership([topic]); // again: a no-op
        await first.close();
        const second = await client.consume(settings(topic));
        assert.equal(joins(), 1, "the same membership");
        // Let go once the new stream tracks its own: ending it and consuming
        // again without holding rejoins, as the bare library does.
        await second.close();
        const third = await client.consume(settings(topic));
        assert.equal(joins(), 2);
        await third.close();
        const coordinator = await client.coordinator([topic]);
        assert.equal(`${coordinator.host}:${coordinator.port}`, BROKERS[0]);
      } finally {
        await client.close(true);
      }
    });
  },
);

Deno.test(
  "platformatic group client: a consume whose join failed does not leave its topics tracked",
  SANITIZERS_OFF,
  async () => {
    await withTopic(async (topic, admin) => {
      const other = `${topic}.b`;
      await admin.createTopics([{ name: other, partitions: 1, replicationFactor: 1 }]);
      const assigned: string[][] = [];
      const client = platformaticGroupClient(
        { brokers: BROKERS, clientId: "poimen-test", groupId: `test-${suffix()}` },
        silentLogger,
        {
          joined: (join) => assigned.push(join.assignments.map((a) => a.topic).sort()),
          left: () => {},
        },
      );
      const both = [topic, other].sort();
      try {
        const first = await client.consume(settings(topic));
        assert.deepEqual(assigned, [[topic]]);
        await first.close();
        await assert.rejects(client.consume({ ...settings(topic, 1000), topics: both }));
        // Left tracked, the next consume would see no new topic, skip its
        // join and fetch the other topic without the group assigning it.
        const second = await client.consume({ ...settings(topic), topics: both });
        assert.deepEqual(assigned.at(-1), both);
        await second.close();
      } finally {
        await client.close(true);
        await admin.deleteTopics([other]);
      }
    });
  },
);
