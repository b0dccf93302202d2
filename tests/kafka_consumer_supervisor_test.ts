/**
 * kafka/consumer_supervisor.ts over a fake client (tests/support/
 * fake_group_client.ts) that hangs each way the library was seen to: a join
 * that never finishes, a stream that stops fetching, a stream that never
 * ends, a topic listing that never answers. Each recovery is driven here
 * with short timings instead of waiting for chaos to hit it.
 *
 *   deno test -A tests/kafka_consumer_supervisor_test.ts
 */
import assert from "node:assert/strict";
import {
  type ConsumedMessage,
  type ConsumerOptions,
  type ConsumerRecovery,
  GroupConsumer,
  type TopicPartition,
} from "../kafka/consumer.ts";
import type { SupervisorTimings } from "../kafka/consumer_supervisor.ts";
import { createLogger } from "../core/log.ts";
import { within } from "../core/time.ts";
import { waitFor } from "./support/db.ts";
import {
  type ConsumeScript,
  fakeClients,
  fakeListers,
  message,
} from "./support/fake_group_client.ts";

const TOPIC = "t.a";

// Short enough for a quick test, long enough that a loaded machine does not
// take a slow answer for a hung one.
const TIMINGS: SupervisorTimings = {
  topicRefresh: 60_000,
  listTopics: 300,
  joinBudget: 300,
  stall: 400,
  streamClose: 300,
  clientClose: 300,
};

/** A consumer over fake clients, the n-th following `scripts[n]`. */
function fakeConsumer(
  setup: {
    scripts?: ConsumeScript[][];
    listings?: (string[] | "hang")[];
    opts?: Partial<ConsumerOptions>;
  } = {},
) {
  const recoveries: ConsumerRecovery[] = [];
  const lines: string[] = [];
  const { factory, clients } = fakeClients(setup.scripts);
  const listers = fakeListers(setup.listings ?? []);
  const consumer = new GroupConsumer({
    brokers: ["127.0.0.1:1"],
    clientId: "poimen-test",
    groupId: "g",
    topics: setup.listings ? /^t\./ : [TOPIC],
    onRecovery: (kind) => recoveries.push(kind),
    ...setup.opts,
  }, {
    log: createLogger("test", "debug", (line) => lines.push(line)),
    clients: factory,
    lister: listers.factory,
    timings: TIMINGS,
  });
  return { consumer, clients, listers, recoveries, lines };
}

/** Collects everything a consumer yields, in the background. */
function collect(consumer: AsyncIterable<ConsumedMessage>): ConsumedMessage[] {
  const got: ConsumedMessage[] = [];
  void (async () => {
    for await (const m of consumer) got.push(m);
  })();
  return got;
}

const text = (m: ConsumedMessage) => new TextDecoder().decode(m.value);

Deno.test("supervisor: a join that never finishes rebuilds the client after the join budget", async () => {
  const { consumer, clients, recoveries, lines } = fakeConsumer({ scripts: [["hang"]] });
  try {
    const got = collect(consumer);
    await waitFor("the first client's join", () => clients[0]?.consumes.length === 1);
    const began = Date.now();
    await waitFor("a second client", () => clients.length === 2, 5000);
    assert.ok(Date.now() - began >= TIMINGS.joinBudget - 20, "not before the budget");
    assert.deepEqual(recoveries, ["join-timeout"]);
    assert.deepEqual(clients[0].closes, [true], "the stuck client is closed by force");
    assert.ok(lines.some((l) => l.includes("join did not finish")));

    const stream = await waitFor("the second client's stream", () => clients[1].stream);
    stream.fetched(message(TOPIC, 0, 0n, "a"));
    await waitFor("the message", () => got.length === 1);
    assert.equal(text(got[0]), "a");
    assert.equal(consumer.joins, 1);
    assert.deepEqual(consumer.assignment, [{ topic: TOPIC, partition: 0 }]);
  } finally {
    await consumer.close();
  }
});

Deno.test("supervisor: close() does not wait on a join that hangs", async () => {
  const { consumer, clients, recoveries } = fakeConsumer({ scripts: [["hang"]] });
  await waitFor("the join under way", () => clients[0]?.consumes.length === 1);
  assert.ok(await within(consumer.close(), TIMINGS.joinBudget / 2), "close() came back at once");
  assert.deepEqual(recoveries, []);
  assert.deepEqual(clients[0].closes, [false], "it leaves the group");
  await consumer.close(); // twice is fine
});

Deno.test("supervisor: a stream that stops fetching is restarted in the same membership, and the client rebuilt at the second", async () => {
  const { consumer, clients, recoveries, lines } = fakeConsumer();
  const revoked: TopicPartition[] = [];
  consumer.onRevoked((partitions) => revoked.push(...partitions));
  try {
    const got = collect(consumer);
    const first = await waitFor("a stream", () => clients[0]?.stream);
    first.fetched(message(TOPIC, 0, 0n, "a"));
    await waitFor("the first message", () => got.length === 1);
    // Quiet from here on while owning partition 0: stalled.
    await waitFor("a second stream", () => clients[0].streams.length === 2, 5000);
    assert.deepEqual(recoveries, ["stream-stalled"]);
    assert.equal(first.closes, 1);
    assert.deepEqual(clients[0].holds, [[TOPIC]], "the membership is held across the restart");
    assert.equal(consumer.joins, 1, "no rejoin");
    assert.ok(lines.some((l) => l.includes("kafka stream stopped fetching")));

    // The second stream stalls too: the client itself is suspect.
    await waitFor("a second client", () => clients.length === 2, 5000);
    assert.deepEqual(recoveries, ["stream-stalled", "stream-stalled"]);
    assert.deepEqual(clients[0].closes, [true]);
    // Its membership went with it: a new member starts over from the
    // committed offsets, and what was handed out (not committed) comes again.
    assert.deepEqual(revoked, [{ topic: TOPIC, partition: 0 }]);
    const third = await waitFor("the new client's stream", () => clients[1].stream);
    third.fetched(message(TOPIC, 0, 0n, "a"), message(TOPIC, 0, 1n, "b"));
    await waitFor("the messages again", () => got.length === 3);
    assert.deepEqual(got.map(text), ["a", "a", "b"]);
  } finally {
    await consumer.close();
  }
});

Deno.test("supervisor: a stream that keeps fetching, is paused for a full buffer, or owns nothing is not stalled", async () => {
  const { consumer, clients, recoveries } = fakeConsumer({ opts: { maxBuffered: 2 } });
  try {
    const stream = await waitFor("a stream", () => clients[0]?.stream);
    // Fetching (empty answers) for two stall windows.
    const fetching = setInterval(() => stream.fetched(), 50);
    const until = Date.now() + 2 * TIMINGS.stall;
    await waitFor("two stall windows of fetches", () => Date.now() >= until, 5000).finally(() =>
      clearInterval(fetching)
    );
    // Nobody reads: the buffer fills and the stream is paused, then quiet.
    stream.fetched(message(TOPIC, 0, 0n), message(TOPIC, 0, 1n));
    assert.equal(stream.paused, true);
    const pausedUntil = Date.now() + 2 * TIMINGS.stall;
    await waitFor("two stall windows paused", () => Date.now() >= pausedUntil, 5000);
    // Resumed, but the group took partition 0 away: nothing to fetch.
    clients[0].rejoined([]);
    stream.resume();
    const idleUntil = Date.now() + 2 * TIMINGS.stall;
    await waitFor("two stall windows owning nothing", () => Date.now() >= idleUntil, 5000);
    assert.deepEqual(recoveries, []);
    assert.equal(clients[0].streams.length, 1);
  } finally {
    await consumer.close();
  }
});

Deno.test("supervisor: a stream that never ends is destroyed after its close timeout, and the next one starts", async () => {
  const { consumer, clients, recoveries, lines } = fakeConsumer();
  try {
    const messages = consumer[Symbol.asyncIterator]();
    const first = await waitFor("a stream", () => clients[0]?.stream);
    first.hangOnClose = true;
    first.fetched(message(TOPIC, 0, 0n, "a"), message(TOPIC, 0, 1n, "b"));
    const a = (await messages.next()).value as ConsumedMessage;
    assert.equal(text(a), "a");
    // Redelivered from "a": the stream restarts, and its end hangs.
    consumer.redeliverFrom(TOPIC, 0, 0n);
    assert.equal(a.superseded, true);
    await waitFor("a second stream", () => clients[0].streams.length === 2, 5000);
    assert.deepEqual(recoveries, ["stream-close-timeout"]);
    assert.equal(first.destroyed, true);
    assert.ok(lines.some((l) => l.includes("kafka stream did not end in time")));
    // The next stream fetches from the committed offset: "a" comes again.
    clients[0].stream!.fetched(message(TOPIC, 0, 0n, "a"), message(TOPIC, 0, 1n, "b"));
    const again = (await messages.next()).value as ConsumedMessage;
    assert.deepEqual([text(again), again.offset, again.superseded], ["a", 0n, undefined]);
    assert.equal(text((await messages.next()).value as ConsumedMessage), "b");

    // close() does not wait on a stream that never ends either.
    clients[0].stream!.hangOnClose = true;
    assert.ok(await within(consumer.close(), TIMINGS.streamClose + 2000), "close() came back");
    assert.deepEqual(recoveries, ["stream-close-timeout", "stream-close-timeout"]);
    assert.equal(clients[0].stream!.destroyed, true);
  } finally {
    await consumer.close();
  }
});

Deno.test("supervisor: a topic listing that never answers is given up on and tried again", async () => {
  const { consumer, clients, listers, recoveries, lines } = fakeConsumer({
    listings: ["hang", [TOPIC, "other"]],
  });
  try {
    await waitFor("the first listing", () => listers.calls.length === 1);
    const stream = await waitFor("a stream", () => clients[0]?.stream, 5000);
    assert.deepEqual(recoveries, ["list-topics-timeout"]);
    assert.ok(listers.calls[1] - listers.calls[0] >= TIMINGS.listTopics - 20);
    assert.deepEqual(clients[0].consumes.map((c) => c.topics), [[TOPIC]]);
    assert.ok(lines.some((l) => l.includes("listing topics did not finish")));
    assert.deepEqual(stream.topics, [TOPIC]);
    assert.deepEqual(consumer.topics, [TOPIC]);
  } finally {
    await consumer.close();
  }
});

Deno.test("supervisor: a stream that fails is started again on the same client", async () => {
  const { consumer, clients, recoveries, lines } = fakeConsumer();
  try {
    const first = await waitFor("a stream", () => clients[0]?.stream);
    first.fail(new Error("broker went away"));
    await waitFor("a second stream", () => clients[0].streams.length === 2, 5000);
    assert.equal(clients.length, 1);
    assert.deepEqual(recoveries, []);
    assert.ok(lines.some((l) => l.includes("kafka consumer failed, reconnecting")));
  } finally {
    await consumer.close();
  }
});
