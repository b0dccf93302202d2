/**
 * The inbox relay over fakes of its narrow interfaces (consumer, producer,
 * admin, API client): what needs no broker to show, such as a hung lag
 * measurement or what a storm of dead letters leaves behind.
 *
 *   deno test -A tests/relay_inbox_test.ts
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { InboxRelay, type InboxRelayOptions } from "../relay/inbox.ts";
import type { AdmitRequest, ApiClient, Outcome } from "../relay/api_client.ts";
import { createRelayMetrics, type RelayMetrics } from "../relay/metrics.ts";
import type { ConsumedMessage, KafkaConsumer, TopicPartition } from "../kafka/consumer.ts";
import type { KafkaAdmin } from "../kafka/admin.ts";
import type { KafkaProducer, ProduceMessage } from "../kafka/producer.ts";
import type { TopicPartitionOffset } from "../kafka/client.ts";
import { dispatchTopic } from "../contracts/topics.ts";
import { createLogger, type Logger, silentLogger } from "../core/log.ts";
import { waitFor } from "./support/db.ts";

const TOPIC = dispatchTopic("unit");

/** A consumer that hands out what the test pushes, and records commits. */
class FakeConsumer implements KafkaConsumer {
  readonly commits: TopicPartitionOffset[][] = [];
  readonly redelivered: { topic: string; partition: number; offset: bigint }[] = [];
  readonly assignment: readonly TopicPartition[] | undefined = undefined;
  readonly joins = 0;
  readonly topics: readonly string[] = [TOPIC];
  #queue: ConsumedMessage[] = [];
  #pushed: ConsumedMessage[] = [];
  #wake: PromiseWithResolvers<void> | undefined;
  #closed = false;

  push(...messages: ConsumedMessage[]): void {
    this.#pushed.push(...messages);
    this.#queue.push(...messages);
    this.#wake?.resolve();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ConsumedMessage> {
    while (!this.#closed) {
      const next = this.#queue.shift();
      if (next) {
        yield next;
        continue;
      }
      this.#wake = Promise.withResolvers<void>();
      await this.#wake.promise;
    }
  }

  commit(offsets: TopicPartitionOffset[]): Promise<void> {
    this.commits.push(offsets);
    return Promise.resolve();
  }

  /** As the real one does: what was not handed out yet goes, everything from `offset` comes again. */
  redeliverFrom(topic: string, partition: number, offset: bigint): void {
    this.redelivered.push({ topic, partition, offset });
    this.#queue = this.#pushed.filter((m) => m.offset >= offset);
    this.#wake?.resolve();
  }

  onRevoked(): void {}
  subscribe(): void {}

  close(): Promise<void> {
    this.#closed = true;
    this.#wake?.resolve();
    return Promise.resolve();
  }
}

/** A producer that acknowledges every message at once. */
class FakeProducer implements KafkaProducer {
  readonly sent: ProduceMessage[] = [];
  send(messages: ProduceMessage[]): Promise<TopicPartitionOffset[]> {
    return Promise.resolve(messages.map((m) => {
      this.sent.push(m);
      return { topic: m.topic, partition: 0, offset: BigInt(this.sent.length - 1) };
    }));
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

/** The admin calls the lag monitor makes; `hang` makes the next listTopics calls never answer. */
class FakeAdmin {
  end = 0n;
  committed: bigint | undefined;
  listings = 0;
  hang = 0;
  listTopics(): Promise<string[]> {
    this.listings++;
    if (this.hang > 0) {
      this.hang--;
      return new Promise(() => {});
    }
    return Promise.resolve([TOPIC, "not-a-dispatch-topic"]);
  }
  endOffsets(topics: string[]): Promise<TopicPartitionOffset[]> {
    return Promise.resolve(topics.map((topic) => ({ topic, partition: 0, offset: this.end })));
  }
  startOffsets(topics: string[]): Promise<TopicPartitionOffset[]> {
    return Promise.resolve(topics.map((topic) => ({ topic, partition: 0, offset: 0n })));
  }
  committedOffsets(_group: string, topics: string[]): Promise<TopicPartitionOffset[]> {
    const c = this.committed;
    return Promise.resolve(
      c === undefined ? [] : topics.map((topic) => ({ topic, partition: 0, offset: c })),
    );
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

function message(offset: number, value: string): ConsumedMessage {
  return {
    topic: TOPIC,
    partition: 0,
    offset: BigInt(offset),
    key: "",
    value: new TextEncoder().encode(value),
    headers: {},
    timestamp: Date.now(),
  };
}

const OPTIONS: InboxRelayOptions = {
  groupId: "unit-group",
  isInboxTopic: (t) => t === TOPIC,
  maxInFlight: 8,
  maxPending: 1000,
  maxPendingBytes: 1 << 20,
  commitIntervalMs: 20,
  commitBatch: 100,
  backoffBaseMs: 5,
  backoffCapMs: 20,
  unknownWorkflowGraceMs: 1000,
  lagIntervalMs: 60_000,
  shutdownMs: 1000,
};

const created = (): Promise<Outcome> => Promise.resolve({ kind: "created", status: 201 });

function relayWith(
  opts: Partial<InboxRelayOptions>,
  admin = new FakeAdmin(),
  log: Logger = silentLogger,
  admit: (req: AdmitRequest) => Promise<Outcome> = created,
) {
  const consumer = new FakeConsumer();
  const producer = new FakeProducer();
  const metrics = createRelayMetrics(new client.Registry());
  const api = { admit } as unknown as ApiClient;
  const relay = new InboxRelay({ ...OPTIONS, ...opts }, {
    consumer,
    producer,
    admin: admin as unknown as KafkaAdmin,
    api,
    metrics,
    log,
  });
  return { relay, consumer, producer, admin, metrics };
}

async function lagGauge(metrics: RelayMetrics): Promise<number | undefined> {
  const { values } = await metrics.lagMessages.get();
  return values.find((v) => v.labels.topic === TOPIC)?.value;
}

/**
 * Counts the "abort" listeners registered on every AbortSignal while it is
 * installed (added and not removed, nor fired since they were `once`).
 */
function countAbortListeners() {
  const proto = AbortSignal.prototype;
  const add = proto.addEventListener;
  const remove = proto.removeEventListener;
  const live = new Map<EventTarget, Set<unknown>>();
  proto.addEventListener = function (this: AbortSignal, ...args: Parameters<typeof add>) {
    if (args[0] === "abort" && args[1]) {
      const set = live.get(this) ?? new Set();
      set.add(args[1]);
      live.set(this, set);
    }
    return add.apply(this, args);
  };
  proto.removeEventListener = function (this: AbortSignal, ...args: Parameters<typeof remove>) {
    if (args[0] === "abort") live.get(this)?.delete(args[1]);
    return remove.apply(this, args);
  };
  return {
    /** The most listeners any one signal not aborted yet holds now. */
    most(): number {
      let most = 0;
      for (const [signal, set] of live) {
        if (!(signal as AbortSignal).aborted) most = Math.max(most, set.size);
      }
      return most;
    },
    restore(): void {
      proto.addEventListener = add;
      proto.removeEventListener = remove;
    },
  };
}

const SANITIZED = { sanitizeOps: true, sanitizeResources: true };

Deno.test(
  "relay: a storm of dead letters leaves no abort listener behind on the stop signal",
  SANITIZED,
  async () => {
    const listeners = countAbortListeners();
    const { relay, consumer, producer } = relayWith({});
    try {
      await relay.start();
      const letters = 200;
      for (let i = 0; i < letters; i++) consumer.push(message(i, "not json"));
      await waitFor(
        "every dead letter acknowledged",
        () => producer.sent.length === letters,
        10_000,
      );
      await waitFor(
        "everything committed",
        () => consumer.commits.some((c) => c.some((o) => o.offset === BigInt(letters))),
        10_000,
      );
      assert.ok(
        listeners.most() < 10,
        `after ${letters} dead letters a signal holds ${listeners.most()} abort listeners`,
      );
    } finally {
      await relay.stop();
      listeners.restore();
    }
  },
);

Deno.test(
  "relay: a lag measurement that hangs does not freeze the lag gauges",
  SANITIZED,
  async () => {
    const admin = new FakeAdmin();
    admin.hang = 1;
    admin.end = 7n;
    admin.committed = 2n;
    const { relay, metrics } = relayWith({ lagIntervalMs: 50 }, admin);
    try {
      await relay.start();
      await waitFor(
        "the lag measured after the hung measurement",
        async () => (await lagGauge(metrics)) === 5,
        5_000,
      );
      assert.ok(admin.listings >= 2, "measured again after the hung one");
      // Keeps measuring: the gauge follows the broker.
      admin.committed = 7n;
      await waitFor("the lag back to 0", async () => (await lagGauge(metrics)) === 0, 5_000);
    } finally {
      await relay.stop();
    }
  },
);

Deno.test("relay: lag measurements that never answer are not piled up", SANITIZED, async () => {
  const admin = new FakeAdmin();
  admin.end = 4n;
  const lines: { msg: string }[] = [];
  const log = createLogger("relay", "debug", (line) => lines.push(JSON.parse(line)));
  const { relay, metrics } = relayWith({ lagIntervalMs: 20 }, admin, log);
  try {
    await relay.start();
    await waitFor("the lag measured", async () => (await lagGauge(metrics)) === 4, 5_000);
    admin.hang = Infinity;
    const answered = admin.listings;
    const aged = () =>
      lines.filter((l) => l.msg === "lag measurements still unanswered; the last view is aged")
        .length;
    await waitFor("ten ticks at the cap", () => aged() >= 10, 5_000);
    assert.equal(admin.listings, answered + 3, "three unanswered measurements at most");
    assert.equal(await lagGauge(metrics), 4, "the last view is kept");
  } finally {
    await relay.stop();
  }
});

Deno.test(
  "relay: a failing message pauses its partition, which resumes from it and commits to the end",
  SANITIZED,
  async () => {
    const failures = new Map<string, number>([[`kafka:${TOPIC}/0/3`, 2]]);
    const admitted = new Set<string>();
    const admit = (req: AdmitRequest): Promise<Outcome> => {
      const left = failures.get(req.source) ?? 0;
      if (left > 0) {
        failures.set(req.source, left - 1);
        return Promise.resolve({
          kind: "transient",
          reason: "database-unavailable",
          status: 503,
          detail: "",
        });
      }
      admitted.add(req.source);
      return created();
    };
    const { relay, consumer, metrics } = relayWith({ maxInFlight: 2 }, undefined, undefined, admit);
    try {
      await relay.start();
      const n = 20;
      for (let i = 0; i < n; i++) consumer.push(message(i, `{"workflow":"w","input":{}}`));
      await waitFor(
        "everything committed",
        () => consumer.commits.some((c) => c.some((o) => o.offset === BigInt(n))),
        10_000,
      );
      assert.equal(admitted.size, n, "every message admitted");
      assert.equal(consumer.redelivered.length, 1, "resumed once");
      assert.ok(consumer.redelivered[0].offset >= 4n, "from after the failing message");
      assert.equal((await metrics.partitionPauses.get()).values[0].value, 1);
      assert.equal((await metrics.pausedPartitions.get()).values[0].value, 0);
      assert.equal(relay.pending, 0, "every share of the budget given back");
    } finally {
      await relay.stop();
    }
  },
);
