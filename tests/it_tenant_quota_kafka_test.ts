/**
 * Tenant quotas over Kafka, with a real broker, API and relay: tenant A at
 * its max-queued (no worker runs, so its runs stay queued) and tenant B
 * unlimited. B's dispatch messages are admitted while A's wait: the API
 * answers A's 429 `queue-full`, the relay retries them with backoff, its lag
 * grows, and nothing of A's is dead-lettered. Raising A's quota with
 * `deno task tenant` lets every one of A's messages through, still without a
 * dead letter.
 *
 *   deno test -A tests/it_tenant_quota_kafka_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { createProducer } from "../kafka/producer.ts";
import { dispatchTopic, tenantTopics } from "../contracts/topics.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { SECOND } from "../core/time.ts";
import { classify, retryDelay } from "../relay/api_client.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import {
  ApiProcess,
  freePort,
  newToken,
  PoimenProcess,
  runCommand,
  sampleValue,
} from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";

const TOPICS = { partitions: 3, replicationFactor: 1, retentionMs: 3_600_000 };
const LONG = 120 * SECOND;

await startBroker();

Deno.test("relay: a 429 quota refusal is retried after its Retry-After, never dead-lettered", () => {
  for (const code of ["queue-full", "rate-limited"]) {
    assert.deepEqual(classify(429, { code, retryable: true }), { kind: "transient", reason: code });
  }
  // Full jitter may draw 0: the server's Retry-After is the floor.
  assert.equal(retryDelay(1, 2_000, 50, 1_000, () => 0), 2_000);
  assert.ok(retryDelay(8, undefined, 50, 1_000, () => 0.999) <= 1_000, "capped backoff");
});

async function countRuns(db: TestDatabase, tenant: string): Promise<number> {
  const [r] = await db.sql`select count(*)::int as n from runs where tenant_id = ${tenant}`;
  return r.n;
}

async function metrics(port: number): Promise<string> {
  return await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
}

/** The dispatch topic's lag as the relay reports it; NaN before its first measurement of it. */
async function lag(port: number, tenant: string): Promise<number> {
  const text = await metrics(port);
  if (!text.includes(`topic="${dispatchTopic(tenant)}"`)) return NaN;
  return sampleValue(text, "poimen_inbox_lag_messages", { topic: dispatchTopic(tenant) });
}

const dispatch = (key: string) =>
  JSON.stringify({ workflow_ref: "echo", input: {}, dispatch_key: key });

Deno.test({
  name:
    "it: over Kafka, a tenant at its max-queued waits (lag grows, no dead letter) while another " +
    "flows; raising the quota lets all of it through",
  ...KAFKA_TEST,
  fn: async () => {
    const run = crypto.randomUUID().slice(0, 8);
    const a = `qk-${run}-a`;
    const b = `qk-${run}-b`;
    const db = await freshDatabase();
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    const producer = createProducer({ brokers: [BROKER], clientId: "poimen-test" });
    let api: ApiProcess | undefined;
    let relay: PoimenProcess | undefined;
    let failed = true;
    try {
      await newToken(db.url, a);
      await newToken(db.url, b);
      const service = await newToken(db.url, "--service", "relay");
      for (const t of [a, b]) await ensureTenantTopics(admin, t, TOPICS);
      const set = await runCommand("tenant", [a, "--max-queued", "3"], {
        DATABASE_URL: db.url,
        LOG_LEVEL: "warn",
      });
      assert.equal(set.code, 0, set.stderr);

      api = await new ApiProcess({ DATABASE_URL: db.url, QUOTA_REFRESH_MS: "500" }).ready();
      const metricsPort = freePort();
      relay = new PoimenProcess("relay", {
        KAFKA_BROKERS: BROKER,
        API_URL: api.url,
        RELAY_TOKEN: service,
        RELAY_METRICS_PORT: String(metricsPort),
        RELAY_GROUP_ID: `poimen-test-quota-${run}`,
        RELAY_TENANT_PATTERN: `qk-${run}-a,qk-${run}-b`,
        RELAY_TOPIC_REFRESH_MS: "500",
        RELAY_LAG_INTERVAL_MS: "300",
        RELAY_BACKOFF_BASE_MS: "50",
        RELAY_BACKOFF_CAP_MS: "1000",
        RELAY_SESSION_TIMEOUT_MS: "6000",
        LOG_LEVEL: "info",
      });
      const relayMetric = async (name: string, labels: Record<string, string> = {}) =>
        sampleValue(await metrics(metricsPort), name, labels);

      const send = (tenant: string, keys: string[]) =>
        producer.send(keys.map((k, i) => ({
          topic: dispatchTopic(tenant),
          key: `${tenant}/${k}`,
          value: dispatch(k),
          partition: i % TOPICS.partitions,
        })));
      const keysA = Array.from({ length: 12 }, (_, i) => `a-${i}`);
      const keysB = Array.from({ length: 12 }, (_, i) => `b-${i}`);
      await send(a, keysA);
      await send(b, keysB);

      // B flows: every message a run, the topic committed to its end.
      await waitFor("B's runs", async () => (await countRuns(db, b)) === keysB.length, LONG);
      await waitFor("B caught up", async () => {
        if (relay!.exited) throw new Error(`relay exited:\n${relay!.logs().join("\n")}`);
        return (await lag(metricsPort, b)) === 0;
      }, LONG);

      // A waits at its max-queued: refused as queue-full, retried, lag behind.
      await waitFor(
        "A refused as queue-full",
        async () => (await relayMetric("poimen_inbox_retries_total", { reason: "queue-full" })) > 3,
        LONG,
      );
      assert.equal(await countRuns(db, a), 3, "A admitted up to its max-queued");
      // Only A's partitions wait behind their refused message; B's have none to wait on.
      await waitFor(
        "A's three partitions paused",
        async () => (await relayMetric("poimen_inbox_paused_partitions")) === TOPICS.partitions,
        LONG,
      );
      await waitFor("A's lag measured", async () => (await lag(metricsPort, a)) >= 9, LONG);
      // More for A: its lag grows, still nothing more admitted.
      await send(a, ["a-12", "a-13", "a-14"]);
      await waitFor("A's lag grew", async () => (await lag(metricsPort, a)) >= 12, LONG);
      assert.equal(await countRuns(db, a), 3);
      assert.equal(
        await relayMetric("poimen_inbox_messages_total", { outcome: "dead_lettered" }),
        0,
        "nothing dead-lettered",
      );
      assert.ok(
        (await api.metric("poimen_admission_quota_refusals_total", {
          tenant: a,
          reason: "queue-full",
        })) > 0,
      );
      // B still flows while A waits.
      await send(b, ["b-12", "b-13"]);
      await waitFor("B's new runs", async () => (await countRuns(db, b)) === 14, LONG);

      // Raised with the command: every one of A's messages admitted, none dead-lettered.
      const raise = await runCommand("tenant", [a, "--max-queued", "100"], {
        DATABASE_URL: db.url,
        LOG_LEVEL: "warn",
      });
      assert.equal(raise.code, 0, raise.stderr);
      await waitFor("A's runs", async () => (await countRuns(db, a)) === 15, LONG);
      await waitFor("A caught up", async () => (await lag(metricsPort, a)) === 0, LONG);
      await waitFor(
        "A's partitions resumed",
        async () => (await relayMetric("poimen_inbox_paused_partitions")) === 0,
        LONG,
      );
      assert.equal(
        await relayMetric("poimen_inbox_messages_total", { outcome: "dead_lettered" }),
        0,
        "still nothing dead-lettered",
      );
      const [dupes] = await db.sql`
        select count(*)::int as n from (select dispatch_key from runs where tenant_id = ${a}
         group by dispatch_key having count(*) > 1) d`;
      assert.equal(dupes.n, 0, "one run per message");

      assert.equal((await relay.stop()).code, 0, relay.logs().join("\n"));
      failed = false;
    } finally {
      if (relay && failed) console.error(relay.logs().slice(-60).join("\n"));
      await relay?.stop("SIGKILL");
      if (api) await api.stop();
      await producer.close();
      await admin.deleteTopics([a, b].flatMap((t) => tenantTopics(t))).catch(() => {});
      await admin.close();
      await db.drop();
    }
  },
});
