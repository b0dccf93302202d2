/**
 * client/dispatch.ts against the shared broker (its own tenant and topics),
 * a real API and a real relay: a published message lands on the partition
 * its key chooses (the same murmur2 partitioner as the outbox's producer,
 * which is Kafka's Java one), carries its key, value and traceparent, and
 * becomes exactly one run through the relay, also when published twice; a
 * body the API would refuse is never sent.
 *
 *   deno test -A tests/client_dispatch_test.ts
 */
import assert from "node:assert/strict";
import {
  DispatchPublisher,
  type DispatchReceipt,
  isTraceparent,
  newTraceparent,
  PoimenProblem,
} from "../client/dispatch.ts";
import { createAdmin } from "../kafka/admin.ts";
import { partitionFor } from "../kafka/producer.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { dispatchTopic, signalsTopic, tenantTopics } from "../contracts/topics.ts";
import { UUID_PATTERN } from "../core/uuid.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

const PARTITIONS = 6;
const TOPICS = { partitions: PARTITIONS, replicationFactor: 1, retentionMs: 3_600_000 };

/** Runs `fn` with a tenant of its own whose topics exist on the shared broker; deletes them after. */
function dispatchTest(name: string, fn: (tenant: string) => Promise<void>) {
  Deno.test({
    name: `client_dispatch: ${name}`,
    ...KAFKA_TEST,
    fn: async () => {
      const tenant = `cd-${crypto.randomUUID().slice(0, 8)}`;
      const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
      try {
        await ensureTenantTopics(admin, tenant, TOPICS);
        await fn(tenant);
      } finally {
        await admin.deleteTopics(tenantTopics(tenant)).catch(() => {});
        await admin.close();
      }
    },
  });
}

Deno.test("client_dispatch: partitionFor is Kafka's murmur2 partitioner (Java client vectors)", () => {
  // Kafka's UtilsTest.testMurmur2 vectors. Modulo 2^31-1, a positive hash
  // below it is itself, so the partition shows the hash & 0x7fffffff.
  const vectors: [string, number][] = [
    ["21", -973932308],
    ["foobar", -790332482],
    ["a-little-bit-long-string", -985981536],
    ["a-little-bit-longer-string", -1486304829],
    ["lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971],
    ["abc", 479470107],
  ];
  for (const [key, hash] of vectors) {
    assert.equal(partitionFor(key, 0x7fffffff), (hash & 0x7fffffff) % 0x7fffffff, key);
  }
});

dispatchTest(
  "a message lands on the partition its key chooses, with its key, value and traceparent",
  async (tenant) => {
    const { got, consumer } = consume(dispatchTopic(tenant));
    const publisher = new DispatchPublisher({ brokers: [BROKER] });
    try {
      const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
      const keys = Array.from({ length: 12 }, (_, i) => `order-${i}-${crypto.randomUUID()}`);
      const receipts: DispatchReceipt[] = [];
      for (const [i, key] of keys.entries()) {
        receipts.push(
          await publisher.publish(
            tenant,
            { workflow_ref: "echo", input: { i }, dispatch_key: key, goal_id: "g" },
            i === 0 ? { traceparent, tracestate: "vendor=1" } : {},
          ),
        );
      }
      // Keyless: a key is generated for this call, in the value and the message key.
      const keyless = await publisher.publish(tenant, { workflow_ref: "echo", input: null });
      receipts.push(keyless);
      assert.equal(keyless.generatedKey, true);
      assert.match(keyless.dispatchKey, UUID_PATTERN);

      await waitFor("every message consumed", () => got.length === receipts.length);
      const partitions = new Set<number>();
      for (const r of receipts) {
        const expected = partitionFor(`${tenant}/${r.dispatchKey}`, PARTITIONS);
        assert.equal(r.key, `${tenant}/${r.dispatchKey}`);
        assert.equal(r.partition, expected, r.key);
        const m = got.find((m) => m.partition === r.partition && m.offset === r.offset);
        assert.ok(m, `no message at ${r.partition}/${r.offset}`);
        assert.equal(m.key, r.key);
        assert.equal(m.headers.traceparent, r.traceparent);
        assert.ok(isTraceparent(m.headers.traceparent), m.headers.traceparent);
        assert.equal(JSON.parse(new TextDecoder().decode(m.value)).dispatch_key, r.dispatchKey);
        partitions.add(m.partition);
      }
      assert.ok(partitions.size > 1, "12 keys over 6 partitions use more than one");
      assert.equal(receipts[0].traceparent, traceparent);
      assert.equal(receipts[0].generatedKey, false);
      const first = got.find((m) => m.key === receipts[0].key)!;
      assert.equal(first.headers.tracestate, "vendor=1");
      assert.deepEqual(JSON.parse(new TextDecoder().decode(first.value)), {
        workflow_ref: "echo",
        input: { i: 0 },
        dispatch_key: keys[0],
        goal_id: "g",
      });
      assert.notEqual(receipts[1].traceparent, receipts[2].traceparent, "a new trace each");
    } finally {
      await publisher.close();
      await publisher.close();
      await consumer.close();
    }
  },
);

dispatchTest("a body the API would refuse is refused before anything is sent", async (tenant) => {
  const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
  const publisher = new DispatchPublisher({ brokers: [BROKER] });
  try {
    const bad = await publisher.publish(tenant, {
      workflow_ref: "Not A Ref",
      dispatch_key: "",
      // deno-lint-ignore no-explicit-any
    } as any).catch((e) => e);
    assert.ok(bad instanceof PoimenProblem, String(bad));
    assert.equal(bad.code, "validation");
    assert.equal(bad.status, 422);
    assert.equal(bad.retryable, false);
    assert.deepEqual(
      new Set(bad.errors.map((e) => e.path)),
      new Set(["dispatch_key", "workflow_ref"]),
    );

    await assert.rejects(
      publisher.publish(tenant, { workflow_ref: "echo" }, {
        traceparent: `00-${"0".repeat(32)}-b7ad6b7169203331-01`,
      }),
      TypeError,
    );
    await assert.rejects(publisher.publish("Not.A.Tenant", { workflow_ref: "echo" }), TypeError);

    const ends = await admin.endOffsets([dispatchTopic(tenant)]);
    assert.equal(ends.length, PARTITIONS);
    assert.ok(ends.every((o) => o.offset === 0n), "nothing was written");
  } finally {
    await publisher.close();
    await admin.close();
  }
});

dispatchTest(
  "a signal lands on the tenant's signals topic keyed <tenant>/<run_id>; a bad one is never sent",
  async (tenant) => {
    const { got, consumer } = consume(signalsTopic(tenant));
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    const publisher = new DispatchPublisher({ brokers: [BROKER] });
    try {
      const runId = crypto.randomUUID();
      const given = await publisher.signal(tenant, {
        run_id: runId,
        name: "approval",
        payload: { ok: true },
        signal_id: "approval-1",
      });
      const derived = await publisher.signal(tenant, { run_id: runId, name: "ping" });
      for (const r of [given, derived]) {
        assert.equal(r.topic, signalsTopic(tenant));
        assert.equal(r.key, `${tenant}/${runId}`);
        assert.equal(r.partition, partitionFor(r.key, PARTITIONS));
      }
      assert.equal(given.signalId, "approval-1");
      assert.equal(
        derived.signalId,
        `kafka:${derived.topic}/${derived.partition}/${derived.offset}`,
      );
      await waitFor("both consumed", () => got.length === 2);
      const values = got.map((m) => JSON.parse(new TextDecoder().decode(m.value)));
      assert.deepEqual(values, [
        { run_id: runId, name: "approval", payload: { ok: true }, signal_id: "approval-1" },
        { run_id: runId, name: "ping" },
      ]);
      assert.ok(got.every((m) => m.key === given.key && isTraceparent(m.headers.traceparent)));

      const bad = await publisher.signal(tenant, {
        run_id: "nope",
        name: "a#b",
        // deno-lint-ignore no-explicit-any
      } as any).catch((e) => e);
      assert.ok(bad instanceof PoimenProblem, String(bad));
      assert.equal(bad.status, 422);
      assert.deepEqual(new Set(bad.errors.map((e) => e.path)), new Set(["run_id", "name"]));
      // The relay's namespace: the API would refuse it, so it is never sent.
      const reserved = await publisher.signal(tenant, {
        run_id: runId,
        name: "a",
        signal_id: "kafka:poimen.x.signals/0/0",
      }).catch((e) => e);
      assert.ok(reserved instanceof PoimenProblem, String(reserved));
      assert.deepEqual(reserved.errors.map((e) => e.path), ["signal_id"]);
      const badTenant = await publisher.signal("Not.A.Tenant", { run_id: runId, name: "a" })
        .catch((e) => e);
      assert.ok(badTenant instanceof TypeError);
      const ends = await admin.endOffsets([signalsTopic(tenant)]);
      assert.equal(ends.reduce((n, o) => n + o.offset, 0n), 2n, "nothing more was written");
    } finally {
      await publisher.close();
      await consumer.close();
      await admin.close();
    }
  },
);

Deno.test("client_dispatch: newTraceparent makes valid, distinct W3C traceparents", () => {
  const seen = new Set<string>();
  for (let i = 0; i < 100; i++) {
    const t = newTraceparent();
    assert.ok(isTraceparent(t), t);
    seen.add(t);
  }
  assert.equal(seen.size, 100);
  for (
    const bad of [
      "",
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
      "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
      `00-${"0".repeat(32)}-b7ad6b7169203331-01`,
      `00-0af7651916cd43dd8448eb211c80319c-${"0".repeat(16)}-01`,
      "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ]
  ) assert.equal(isTraceparent(bad), false, bad);
});

dispatchTest(
  "a published message becomes one run through the relay, also when published twice",
  async (tenant) => {
    const db = await freshDatabase();
    const api = new ApiProcess({ DATABASE_URL: db.url });
    let relay: PoimenProcess | undefined;
    const publisher = new DispatchPublisher({ brokers: [BROKER] });
    let failed = true;
    try {
      const tokens = await Promise.all([
        runCommand("token", [tenant], { DATABASE_URL: db.url, LOG_LEVEL: "warn" }),
        runCommand("token", ["--service", "relay"], { DATABASE_URL: db.url, LOG_LEVEL: "warn" }),
      ]);
      for (const t of tokens) assert.equal(t.code, 0, t.stderr);
      await api.ready();
      relay = new PoimenProcess("relay", {
        KAFKA_BROKERS: BROKER,
        API_URL: api.url,
        RELAY_TOKEN: tokens[1].stdout.trim(),
        RELAY_GROUP_ID: `poimen-test-relay-${tenant}`,
        // This test's tenant only: other tests' topics share the broker.
        RELAY_TENANT_PATTERN: tenant,
        RELAY_TOPIC_REFRESH_MS: "500",
        RELAY_BACKOFF_BASE_MS: "50",
        RELAY_BACKOFF_CAP_MS: "1000",
        RELAY_SESSION_TIMEOUT_MS: "6000",
        LOG_LEVEL: "info",
      });

      const key = `spawn-${crypto.randomUUID()}`;
      const body = { workflow_ref: "echo", input: { twice: true }, dispatch_key: key };
      const first = await publisher.publish(tenant, body);
      // A publisher retrying after a lost acknowledgement sends it again.
      const second = await publisher.publish(tenant, body);
      assert.equal(second.partition, first.partition, "one key, one partition");
      assert.equal(second.offset, first.offset + 1n);

      // Both admitted: the second one answered with the first one's run.
      await waitFor("both messages admitted", async () => {
        if (relay!.exited) throw new Error("relay exited");
        const created = await api.metric("poimen_admissions_total", { outcome: "created" });
        const replayed = await api.metric("poimen_admissions_total", { outcome: "deduplicated" });
        return created === 1 && replayed === 1;
      }, 120_000);
      const rows = await db.sql<{ source: string; tenant_id: string }[]>`
        select source, tenant_id from runs where dispatch_key = ${key}`;
      assert.equal(rows.length, 1);
      assert.equal(rows[0].tenant_id, tenant);
      // The relay posts a partition's messages concurrently: either copy may
      // be the one that made the run.
      const at = (r: DispatchReceipt) => `kafka:${r.topic}/${r.partition}/${r.offset}`;
      assert.ok([at(first), at(second)].includes(rows[0].source), rows[0].source);
      failed = false;
    } finally {
      if (failed && relay) console.error(relay.logs().slice(-40).join("\n"));
      await relay?.stop();
      await publisher.close();
      await api.stop("SIGKILL");
      await db.drop();
    }
  },
);
