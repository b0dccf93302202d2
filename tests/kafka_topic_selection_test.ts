/**
 * kafka/topic_selection.ts: resolving a selection, and the periodic refresh
 * when the broker's topic listing hangs (over the fake client of
 * tests/support/fake_group_client.ts; no broker).
 *
 *   deno test -A tests/kafka_topic_selection_test.ts
 */
import assert from "node:assert/strict";
import { type ConsumerRecovery, GroupConsumer } from "../kafka/consumer.ts";
import { TopicSelector } from "../kafka/topic_selection.ts";
import { silentLogger } from "../core/log.ts";
import { delay } from "../core/time.ts";
import { waitFor } from "./support/db.ts";
import { fakeClients, fakeListers } from "./support/fake_group_client.ts";

Deno.test("topic selection: the periodic refresh lists one at a time and gives a hung listing up after its bound", async () => {
  const LIST_BOUND = 600;
  const REFRESH = 20;
  const recoveries: ConsumerRecovery[] = [];
  const { factory, clients } = fakeClients();
  // The first listing answers, every later one hangs (as the library's was seen to).
  const listers = fakeListers([["t.a"], "hang"]);
  const consumer = new GroupConsumer({
    brokers: ["127.0.0.1:1"],
    clientId: "poimen-test",
    groupId: "g",
    topics: /^t\./,
    onRecovery: (kind) => recoveries.push(kind),
  }, {
    log: silentLogger,
    clients: factory,
    lister: listers.factory,
    timings: {
      topicRefresh: REFRESH,
      listTopics: LIST_BOUND,
      joinBudget: 60_000,
      stall: 60_000,
      streamClose: 1000,
      clientClose: 1000,
    },
  });
  try {
    await waitFor("a stream", () => clients[0]?.stream);
    await waitFor("a refresh under way", () => listers.calls.length >= 2);
    const hungAt = listers.calls[1];
    // Half the bound is some 15 refresh ticks: time passing is what is
    // tested here, not a stand-in for a condition.
    await delay(LIST_BOUND / 2);
    assert.equal(listers.calls.length, 2, "one listing at a time, however many ticks");
    assert.deepEqual(recoveries, []);

    await waitFor("a listing after the bound", () => listers.calls.length === 3, 5000);
    assert.ok(listers.calls[2] - hungAt >= LIST_BOUND - 20, "not before the bound");
    assert.deepEqual(recoveries, ["list-topics-timeout"]);
    // The lister whose call hung is let go; the next listing has a new one.
    assert.equal(listers.listers.length, 2);
    assert.equal(listers.listers[0].closed, true);
    // Meanwhile the stream went on.
    assert.equal(clients[0].streams.length, 1);
    assert.deepEqual(consumer.topics, ["t.a"]);
  } finally {
    await consumer.close();
  }
});

/** A selector of `selection` over fake listers answering `listings`. */
function selector(
  selection: ConstructorParameters<typeof TopicSelector>[0],
  listings: (string[] | "hang")[] = [],
  timeoutMs = 300,
) {
  const listers = fakeListers(listings);
  const stop = new AbortController();
  let timeouts = 0;
  const topics = new TopicSelector(selection, {
    newLister: listers.factory,
    timeoutMs,
    onTimeout: () => timeouts++,
  }, stop.signal);
  return { topics, listers, stop, timeouts: () => timeouts };
}

Deno.test("topic selection: a list is sorted without duplicates, and set() replaces it", async () => {
  const { topics, listers } = selector(["b", "a", "b"]);
  assert.deepEqual(await topics.resolve(), { value: ["a", "b"] });
  topics.set(["c"]);
  assert.deepEqual(await topics.resolve(), { value: ["c"] });
  assert.equal(listers.listers.length, 0, "a list asks nobody");
  await topics.close();
});

Deno.test("topic selection: a RegExp filters the broker's topics through one lister, closed at the end", async () => {
  const { topics, listers } = selector(/^t\./, [["t.b", "x", "t.a"], ["t.a"]]);
  assert.deepEqual(await topics.resolve(), { value: ["t.a", "t.b"] });
  assert.deepEqual(await topics.resolve(), { value: ["t.a"] });
  assert.equal(listers.listers.length, 1);
  await topics.close();
  assert.equal(listers.listers[0].closed, true);
});

Deno.test("topic selection: callers while a listing is under way share it; a selection replaced meanwhile is not held by it", async () => {
  const { topics, listers, timeouts } = selector(/^t\./, ["hang", ["t.a"]], 300);
  const first = topics.resolve();
  const second = topics.resolve();
  assert.equal(listers.calls.length, 1);
  topics.set(["u"]);
  assert.deepEqual(await topics.resolve(), { value: ["u"] });
  assert.equal(await first, "timed-out");
  assert.equal(await second, "timed-out");
  assert.equal(timeouts(), 1, "one listing given up on, counted once");
  await topics.close();
});

Deno.test("topic selection: a function that hangs is given up on, and asked again next time", async () => {
  let calls = 0;
  const { topics, listers, timeouts } = selector(
    () => ++calls === 1 ? new Promise<string[]>(() => {}) : ["b", "a"],
    [],
    200,
  );
  assert.equal(await topics.resolve(), "timed-out");
  assert.equal(timeouts(), 1);
  assert.deepEqual(await topics.resolve(), { value: ["a", "b"] });
  assert.equal(calls, 2);
  assert.equal(listers.listers.length, 0);
  await topics.close();
});

Deno.test("topic selection: a failed listing rejects, and the next one asks again", async () => {
  let calls = 0;
  const { topics } = selector(() => {
    if (++calls === 1) throw new Error("no broker");
    return ["a"];
  });
  await assert.rejects(topics.resolve(), /no broker/);
  assert.deepEqual(await topics.resolve(), { value: ["a"] });
  await topics.close();
});

Deno.test("topic selection: a listing under way when stopped comes back at once as stopped", async () => {
  const { topics, stop, timeouts } = selector(/^t\./, ["hang"], 60_000);
  const listing = topics.resolve();
  stop.abort();
  assert.equal(await listing, "stopped");
  assert.equal(timeouts(), 0);
  await topics.close();
});
