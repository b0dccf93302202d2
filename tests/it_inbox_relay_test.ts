/**
 * The inbox relay against a real broker, a real API process and a real relay
 * process: every dispatch message becomes exactly one run, through
 * `POST /v1/runs` only, under redelivery, relay crashes, broker and API
 * outages; malformed messages are dead-lettered and the relay keeps draining.
 *
 *   deno test -A tests/it_inbox_relay_test.ts      (or --filter inbox_relay)
 *
 * Each test has its own database, tenant, topics and consumer group, and its
 * relay only drains its own tenants (RELAY_TENANT_PATTERN), so tests and
 * other files sharing the broker run in any order.
 */
import assert from "node:assert/strict";
import { localModuleGraph } from "./support/module_graph.ts";
import { startBroker } from "../dev/kafka.ts";
import { type ConsumedMessage, createConsumer } from "../kafka/consumer.ts";
import { createAdmin, type KafkaAdmin } from "../kafka/admin.ts";
import { createProducer, type KafkaProducer, type ProduceMessage } from "../kafka/producer.ts";
import { dispatchTopic, dlqTopic, tenantTopics } from "../contracts/topics.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { type TopicPartitionOffset } from "../kafka/client.ts";
import { delay, SECOND } from "../core/time.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import {
  ApiProcess,
  freePort,
  PoimenProcess,
  runCommand,
  runFlags,
  sampleValue,
} from "./support/processes.ts";
import { BROKER, KAFKA_TEST, type PrivateBroker, privateBroker } from "./support/kafka.ts";

const BROKERS = [BROKER];
const TOPICS = { partitions: 3, replicationFactor: 1, retentionMs: 3_600_000 };
const LONG = 120 * SECOND;

await startBroker();

/** An API process on a port chosen here, so a restarted API is found at the same URL. */
class PinnedApi extends ApiProcess {
  override readonly url: string;
  constructor(port: number, env: Record<string, string>) {
    super({ ...env, PORT: String(port) });
    this.url = `http://127.0.0.1:${port}`;
  }
}

function suffix(): string {
  return crypto.randomUUID().slice(0, 8);
}

interface Ctx {
  /** The broker of this test: its own when it asked for one, else the shared one. */
  brokers: string[];
  /** This test's own broker, if it asked for one (`ownBroker`). */
  broker: PrivateBroker | undefined;
  db: TestDatabase;
  tenant: string;
  /** The tenant's own token (for HTTP calls as the tenant). */
  tenantToken: string;
  serviceToken: string;
  groupId: string;
  apiPort: number;
  api: PinnedApi | undefined;
  producer: KafkaProducer;
  admin: KafkaAdmin;
  /** Starts (or restarts) the API on `apiPort`; resolves when ready. */
  startApi(env?: Record<string, string>): Promise<PinnedApi>;
  stopApi(): Promise<void>;
  /** Starts a relay process; its metrics port is `relay.metricsPort`. */
  startRelay(env?: Record<string, string>): Relay;
  /** Creates another tenant (in the database and on the broker) this test's relay drains. */
  newTenant(label: string, opts?: { row?: boolean }): Promise<string>;
  publish(
    messages: Omit<ProduceMessage, "topic">[],
    tenant?: string,
  ): Promise<TopicPartitionOffset[]>;
}

interface Relay extends PoimenProcess {
  metricsPort: number;
}

async function newTenantToken(db: TestDatabase, tenant: string): Promise<string> {
  const out = await runCommand("token", [tenant], { DATABASE_URL: db.url, LOG_LEVEL: "warn" });
  assert.equal(out.code, 0, out.stderr);
  return out.stdout.trim();
}

/**
 * Runs `fn` with a database, a tenant with topics, tokens, and process
 * starters; tears all down. With `ownBroker`, everything talks to a broker
 * of the test's own, which it may take down without disturbing anything else.
 */
function relayTest(
  name: string,
  fn: (ctx: Ctx) => Promise<void>,
  { ownBroker = false, pending }: { ownBroker?: boolean; pending?: string } = {},
) {
  Deno.test({
    name: `inbox_relay: ${name}${pending ? ` (PENDING: ${pending})` : ""}`,
    ignore: pending !== undefined,
    ...KAFKA_TEST,
    fn: async () => {
      await using broker = ownBroker ? await privateBroker() : undefined;
      const brokers = broker ? [broker.address] : BROKERS;
      const run = suffix();
      const tenant = `ir-${run}`;
      const db = await freshDatabase();
      const admin = createAdmin({ brokers, clientId: "poimen-test" });
      const producer = createProducer({ brokers, clientId: "poimen-test" });
      const relays: Relay[] = [];
      const tenants = [tenant];
      const ctx: Ctx = {
        brokers,
        broker,
        db,
        tenant,
        tenantToken: await newTenantToken(db, tenant),
        serviceToken: "",
        groupId: `poimen-test-relay-${run}`,
        apiPort: freePort(),
        api: undefined,
        producer,
        admin,
        async startApi(env = {}) {
          await ctx.stopApi();
          ctx.api = new PinnedApi(ctx.apiPort, { DATABASE_URL: db.url, ...env });
          return await ctx.api.ready();
        },
        async stopApi() {
          const api = ctx.api;
          ctx.api = undefined;
          if (!api) return;
          const status = await api.stop();
          assert.equal(status.code, 0, `api did not stop cleanly:\n${api.logs().join("\n")}`);
        },
        startRelay(env = {}) {
          const metricsPort = freePort();
          const relay = new PoimenProcess("relay", {
            KAFKA_BROKERS: brokers.join(","),
            API_URL: `http://127.0.0.1:${ctx.apiPort}`,
            RELAY_TOKEN: ctx.serviceToken,
            RELAY_METRICS_PORT: String(metricsPort),
            RELAY_GROUP_ID: ctx.groupId,
            // This test's tenants only: other tests' topics share the broker.
            RELAY_TENANT_PATTERN: `ir-${run},ir-${run}-*`,
            RELAY_TOPIC_REFRESH_MS: "500",
            RELAY_LAG_INTERVAL_MS: "300",
            RELAY_BACKOFF_BASE_MS: "50",
            RELAY_BACKOFF_CAP_MS: "1000",
            RELAY_SESSION_TIMEOUT_MS: "6000",
            LOG_LEVEL: "info",
            ...env,
          }) as Relay;
          relay.metricsPort = metricsPort;
          relays.push(relay);
          return relay;
        },
        async newTenant(label, { row = true } = {}) {
          const t = `ir-${run}-${label}`;
          // Without a row the API refuses the relay's service token for it (403).
          if (row) await newTenantToken(db, t);
          await ensureTenantTopics(admin, t, TOPICS);
          tenants.push(t);
          return t;
        },
        publish(messages, t = tenant) {
          return producer.send(messages.map((m) => ({ ...m, topic: dispatchTopic(t) })));
        },
      };
      let failed = true;
      try {
        const out = await runCommand("token", ["--service", "relay"], {
          DATABASE_URL: db.url,
          LOG_LEVEL: "warn",
        });
        assert.equal(out.code, 0, out.stderr);
        ctx.serviceToken = out.stdout.trim();
        await ensureTenantTopics(admin, tenant, TOPICS);
        await fn(ctx);
        // A graceful stop of every relay still running exits 0.
        for (const relay of relays) {
          if (relay.exited) continue;
          const status = await relay.stop();
          assert.equal(status.code, 0, `relay did not stop cleanly:\n${relay.logs().join("\n")}`);
        }
        failed = false;
      } finally {
        for (const relay of relays) {
          if (failed) {
            console.error(`--- relay ${relay.pid} logs (last 60 lines) ---`);
            console.error(relay.logs().slice(-60).join("\n"));
          }
          await relay.stop("SIGKILL");
        }
        await ctx.stopApi().catch(() => {});
        await producer.close();
        await admin.deleteTopics(tenants.flatMap((t) => tenantTopics(t))).catch(() => {});
        await admin.close();
        await db.drop();
      }
    },
  });
}

async function countRuns(db: TestDatabase, tenant: string): Promise<number> {
  const [r] = await db.sql`select count(*)::int as n from runs where tenant_id = ${tenant}`;
  return r.n;
}

/** A sample of the relay's /metrics, summed over series whose labels include `labels`. */
async function relayMetric(
  relay: Relay,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${relay.metricsPort}/metrics`);
  return sampleValue(await res.text(), name, labels);
}

/** POSTs to /v1/runs the API saw from the relay (a service token). */
function relayPosts(api: ApiProcess): Promise<number> {
  return api.metric("poimen_http_requests_total", {
    route: "/v1/runs",
    method: "POST",
    caller: "service",
  });
}

/** The dispatch topic's lag as the relay reports it (all partitions); NaN before its first measurement. */
async function lag(relay: Relay, tenant: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${relay.metricsPort}/metrics`)).text();
  // Absent series read as 0: the topic must be listed before its 0 means anything.
  if (!text.includes(`topic="${dispatchTopic(tenant)}"`)) return NaN;
  return sampleValue(text, "poimen_inbox_lag_messages", { topic: dispatchTopic(tenant) });
}

/** Waits until the relay reports every partition of `tenant`'s dispatch topic committed to its end. */
async function caughtUp(relay: Relay, tenant: string) {
  await waitFor(`relay caught up on ${tenant}`, async () => {
    if (relay.exited) throw new Error(`relay exited:\n${relay.logs().join("\n")}`);
    return (await lag(relay, tenant)) === 0;
  }, LONG);
}

const dispatch = (key: string, input: unknown = {}, workflow_ref = "echo") =>
  JSON.stringify({ workflow_ref, input, dispatch_key: key });

relayTest("one message makes exactly one run, through one POST /v1/runs", async (ctx) => {
  const api = await ctx.startApi();
  const relay = ctx.startRelay();
  const key = `k-${suffix()}`;
  const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const [at] = await ctx.publish([{
    key: `${ctx.tenant}/${key}`,
    value: dispatch(key, { hello: "world" }),
    headers: { traceparent },
  }]);

  await waitFor("the run", async () => (await countRuns(ctx.db, ctx.tenant)) === 1, LONG);
  await caughtUp(relay, ctx.tenant);
  assert.equal(await countRuns(ctx.db, ctx.tenant), 1);
  assert.equal(await relayPosts(api), 1, "the API saw exactly one POST /v1/runs from the relay");
  assert.equal(await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "created" }), 1);

  const [run] = await ctx.db.sql`
    select source, dispatch_key, input from runs where tenant_id = ${ctx.tenant}`;
  assert.equal(run.source, `kafka:${dispatchTopic(ctx.tenant)}/${at.partition}/${at.offset}`);
  assert.equal(run.dispatch_key, key);
  assert.deepEqual(run.input, { hello: "world" });

  // A graceful stop commits: the group's offset is past the message.
  assert.equal((await relay.stop()).code, 0, relay.logs().join("\n"));
  assert.deepEqual(
    await ctx.admin.committedOffsets(ctx.groupId),
    [{ topic: dispatchTopic(ctx.tenant), partition: at.partition, offset: at.offset + 1n }],
  );
  assert.ok(
    relay.logs().some((l) => l.includes('"msg":"stopped"')),
    "the relay logged a graceful stop",
  );
});

relayTest(
  "forced redelivery (a duplicate message, a relay killed before commit) keeps one run",
  async (ctx) => {
    const api = await ctx.startApi();
    // It cannot commit in this test's lifetime: a kill loses its progress.
    const first = ctx.startRelay({ RELAY_COMMIT_INTERVAL_MS: "600000" });
    const key = `k-${suffix()}`;
    const message = { key: `${ctx.tenant}/${key}`, value: dispatch(key, { n: 1 }) };

    await ctx.publish([message]);
    await waitFor("the first POST", async () => (await relayPosts(api)) === 1, LONG);
    // The same message again, as a publisher retrying would send it.
    await ctx.publish([message]);
    await waitFor("the second POST", async () => (await relayPosts(api)) === 2, LONG);
    await waitFor(
      "the replay counted",
      async () =>
        (await relayMetric(first, "poimen_inbox_messages_total", { outcome: "replayed" })) === 1,
    );
    assert.equal(await countRuns(ctx.db, ctx.tenant), 1);
    assert.equal(await relayMetric(first, "poimen_inbox_commits_total"), 0);

    // Crash: nothing was committed, so both messages come again to the next relay.
    await first.stop("SIGKILL");
    assert.deepEqual(await ctx.admin.committedOffsets(ctx.groupId), []);
    const second = ctx.startRelay();
    // Both at once, they may share one batch request: counted by replays, not POSTs.
    await waitFor(
      "both messages redelivered",
      async () =>
        (await relayMetric(second, "poimen_inbox_messages_total", { outcome: "replayed" })) === 2,
      LONG,
    );
    await caughtUp(second, ctx.tenant);
    assert.equal(await countRuns(ctx.db, ctx.tenant), 1, "still exactly one run");
    const posts = await relayPosts(api);
    assert.ok(posts === 3 || posts === 4, `${posts} POSTs: 2 before the crash, 1 or 2 after`);
    assert.equal(
      await relayMetric(second, "poimen_inbox_messages_total", { outcome: "replayed" }),
      2,
    );
    const [run] = await ctx.db.sql`
      select count(*)::int as events from work_events where tenant_id = ${ctx.tenant}`;
    assert.equal(run.events, 1, "replays wrote nothing");
  },
);

relayTest("broker down: a queued message is admitted once it is back", async (ctx) => {
  await ctx.startApi();
  const relay = ctx.startRelay();
  const worker = new PoimenProcess("worker", {
    DATABASE_URL: ctx.db.url,
    WORKER_POLL_MS: "200",
    LOG_LEVEL: "warn",
  });
  let sending: Promise<unknown> | undefined;
  try {
    // A run already running is untouched by the broker going away.
    const res = await fetch(`${ctx.api!.url}/v1/runs`, {
      method: "POST",
      headers: { authorization: `Bearer ${ctx.tenantToken}`, "content-type": "application/json" },
      body: JSON.stringify({ workflow_ref: "sleep", input: { ms: 8000 } }),
    });
    assert.equal(res.status, 201);
    const { run_id } = await res.json();
    const status = async () =>
      (await ctx.db.sql`select status from runs where run_id = ${run_id}`)[0].status;
    await waitFor("the sleep run running", async () => (await status()) === "running", LONG);

    // The relay has joined and committed something before the outage.
    const warm = `warm-${suffix()}`;
    await ctx.publish([{ key: `${ctx.tenant}/${warm}`, value: dispatch(warm) }]);
    await caughtUp(relay, ctx.tenant);
    await waitFor("the warm-up run", async () => (await countRuns(ctx.db, ctx.tenant)) === 2, LONG);

    const broker = ctx.broker!;
    assert.equal(await broker.stop(), true, "the broker was running");
    const key = `k-${suffix()}`;
    // The publisher waits out the outage (its send retries until acknowledged).
    let sent = false;
    sending = ctx.publish([{ key: `${ctx.tenant}/${key}`, value: dispatch(key) }])
      .then(() => (sent = true));
    await waitFor("the sleep run done while the broker is down", async () => {
      const s = await status();
      if (s === "failed") throw new Error("the sleep run failed");
      return s === "succeeded";
    }, 30 * SECOND);
    assert.equal(await broker.running(), false, "the broker is still down");
    assert.equal(sent, false, "nothing can be acknowledged while the broker is down");
    assert.ok(!relay.exited, "the relay outlives the broker");

    await broker.start();
    await sending;
    await waitFor(
      "the run of the message published during the outage",
      async () =>
        (await ctx.db.sql`select 1 from runs where tenant_id = ${ctx.tenant}
                          and dispatch_key = ${key}`).length === 1,
      LONG,
    );
    assert.equal(await countRuns(ctx.db, ctx.tenant), 3);
    await caughtUp(relay, ctx.tenant);
    assert.equal(await countRuns(ctx.db, ctx.tenant), 3, "nothing admitted twice");
  } finally {
    // Whatever happened above, the broker is up for the harness's teardown.
    await ctx.broker!.start();
    await sending?.catch(() => {});
    await worker.stop();
  }
}, { ownBroker: true });

relayTest(
  "malformed messages are dead-lettered with why and where; the relay keeps draining",
  async (ctx) => {
    // A small body limit makes one message "too large", to redrive once it is raised.
    await ctx.startApi({ BODY_LIMIT_BYTES: "300" });
    // An unknown workflow is retried for a grace period (a rolling deploy), then dead-lettered.
    const relay = ctx.startRelay({ RELAY_UNKNOWN_WORKFLOW_GRACE_MS: "1500" });
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const bigKey = `big-${suffix()}`;
    const bad = [
      { why: "bad-json", status: "none", value: "{not json", key: `${ctx.tenant}/bad-json` },
      {
        why: "validation",
        status: "422",
        value: JSON.stringify({ workflow_ref: 5, dispatch_key: "schema" }),
        key: `${ctx.tenant}/schema`,
      },
      {
        why: "unknown-workflow",
        status: "422",
        value: JSON.stringify({ workflow_ref: "nope", input: {}, dispatch_key: "unknown-wf" }),
        key: `${ctx.tenant}/unknown-wf`,
      },
      {
        why: "body-too-large",
        status: "413",
        value: dispatch(bigKey, { blob: "x".repeat(400) }),
        key: `${ctx.tenant}/${bigKey}`,
      },
    ];
    // One partition for all: the valid messages queue behind the bad ones.
    const badAt = await ctx.publish(bad.map((b) => ({
      key: b.key,
      value: b.value,
      partition: 0,
      headers: { traceparent, "x-origin": "it-test" },
    })));
    const goodKeys = [1, 2, 3].map((i) => `good-${i}-${suffix()}`);
    await ctx.publish(
      goodKeys.map((k) => ({ key: `${ctx.tenant}/${k}`, value: dispatch(k), partition: 0 })),
    );

    await waitFor(
      "the valid messages' runs",
      async () => (await countRuns(ctx.db, ctx.tenant)) === 3,
      LONG,
    );
    await caughtUp(relay, ctx.tenant);
    assert.equal(
      await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" }),
      4,
    );
    // The unknown workflow paused the partition: a valid message already in
    // flight then may come again and replay its run.
    assert.equal(
      (await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "created" })) +
        (await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "replayed" })),
      3,
    );

    // The dead letters, read back from the DLQ topic.
    const letters = await readTopic(dlqTopic(ctx.tenant), bad.length);
    assert.equal(letters.length, bad.length);
    for (const [i, b] of bad.entries()) {
      const m = letters.find((l) => l.key === b.key);
      assert.ok(m, `dead letter of ${b.why}`);
      assert.equal(new TextDecoder().decode(m.value), b.value, "the original value");
      const h = m.headers;
      assert.equal(h.traceparent, traceparent, "original headers kept");
      assert.equal(h["x-origin"], "it-test");
      assert.equal(h["poimen-dlq-reason"], b.why);
      assert.equal(h["poimen-dlq-status"], b.status);
      assert.ok(h["poimen-dlq-detail"].length > 0, "a detail");
      assert.ok(h["poimen-dlq-detail"].length <= 500, "a short detail");
      if (b.why === "unknown-workflow") {
        assert.ok(Number(h["poimen-dlq-attempts"]) > 1, "retried through its grace period");
      } else assert.equal(h["poimen-dlq-attempts"], "1", b.why);
      assert.equal(h["poimen-dlq-topic"], dispatchTopic(ctx.tenant));
      assert.equal(h["poimen-dlq-partition"], String(badAt[i].partition));
      assert.equal(h["poimen-dlq-offset"], String(badAt[i].offset));
      for (
        const t of ["poimen-dlq-first-failure", "poimen-dlq-last-failure", "poimen-dlq-timestamp"]
      ) {
        assert.ok(!Number.isNaN(Date.parse(h[t])), `${t} is a time: ${h[t]}`);
      }
    }
    assert.match(
      letters.find((l) => l.key.endsWith("/schema"))!.headers["poimen-dlq-detail"],
      /workflow_ref/,
      "the failing field is named",
    );

    // The CLI lists them; after the limit is raised, a redrive admits the big one.
    const env = {
      KAFKA_BROKERS: ctx.brokers.join(","),
      API_URL: ctx.api!.url,
      POIMEN_TOKEN: ctx.serviceToken,
      LOG_LEVEL: "warn",
      DLQ_REDRIVE_WAIT_MS: "8000",
    };
    const listed = await runCommand("dlq", [ctx.tenant], env, runFlags("dlq"));
    assert.equal(listed.code, 0, listed.stderr);
    const lines = listed.stdout.trim().split("\n");
    assert.equal(lines.length, bad.length + 1, listed.stdout);
    assert.ok(lines.some((l) => l.includes("reason=bad-json") && l.includes("status=none")));
    assert.ok(lines.some((l) => l.includes("reason=body-too-large") && l.includes("status=413")));

    await ctx.startApi();
    const redrive = await runCommand("dlq", [ctx.tenant, "--redrive"], env, runFlags("dlq"));
    assert.equal(redrive.code, 0, redrive.stderr);
    assert.match(
      redrive.stdout,
      new RegExp(`republished; run [0-9a-f-]{36} created for ${bigKey}`),
    );
    assert.match(redrive.stdout, /no run for unknown-wf yet/);
    assert.equal(await countRuns(ctx.db, ctx.tenant), 4);
    // The others fail again and are dead-lettered again, the relay still draining.
    await waitFor(
      "the redriven bad messages dead-lettered again",
      async () =>
        (await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" })) ===
          7,
      LONG,
    );
    const again = await readTopic(dlqTopic(ctx.tenant), 7);
    assert.equal(again.filter((l) => l.key.endsWith("/schema")).length, 2);
  },
);

relayTest(
  "a poison message in a batch is dead-lettered while its neighbours are admitted, in one request or few",
  async (ctx) => {
    const api = await ctx.startApi();
    const keys = Array.from({ length: 20 }, (_, i) => `nb-${i}-${suffix()}`);
    const poison = JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, nope: true });
    // All in one partition before the relay starts: its first fetch holds them all.
    const values = keys.map((k) => ({
      key: `${ctx.tenant}/${k}`,
      value: dispatch(k),
      partition: 0,
    }));
    values.splice(10, 0, { key: `${ctx.tenant}/poison`, value: poison, partition: 0 });
    const at = await ctx.publish(values);
    const relay = ctx.startRelay();

    await waitFor("20 runs", async () => (await countRuns(ctx.db, ctx.tenant)) === 20, LONG);
    await caughtUp(relay, ctx.tenant);
    assert.equal(
      await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" }),
      1,
    );
    const posts = await relayPosts(api);
    assert.ok(posts < 21, `batched: ${posts} POST /v1/runs for 21 messages`);
    const [letter] = await readTopic(dlqTopic(ctx.tenant), 1);
    assert.equal(new TextDecoder().decode(letter.value), poison);
    assert.equal(letter.headers["poimen-dlq-reason"], "validation");
    assert.equal(letter.headers["poimen-dlq-status"], "422");
    assert.equal(letter.headers["poimen-dlq-attempts"], "1");
    assert.equal(letter.headers["poimen-dlq-offset"], String(at[10].offset));
    // Each run keyed and sourced by its own message.
    const rows = await ctx.db
      .sql`select dispatch_key, source from runs where tenant_id = ${ctx.tenant}`;
    const sourceOf = new Map(rows.map((r) => [r.dispatch_key, r.source]));
    for (const [i, v] of values.entries()) {
      if (v.value === poison) continue;
      const key = v.key.split("/")[1];
      assert.equal(sourceOf.get(key), `kafka:${dispatchTopic(ctx.tenant)}/0/${at[i].offset}`);
    }
  },
);

relayTest(
  "no bypass: every admission came through HTTP; a new tenant is drained without a restart",
  async (ctx) => {
    const api = await ctx.startApi();
    const relay = ctx.startRelay();
    const keys = Array.from({ length: 10 }, (_, i) => `nb-${i}-${suffix()}`);
    await ctx.publish(keys.map((k) => ({ key: `${ctx.tenant}/${k}`, value: dispatch(k) })));
    await waitFor("10 runs", async () => (await countRuns(ctx.db, ctx.tenant)) === 10, LONG);

    // A tenant created after the relay started.
    const later = await ctx.newTenant("later");
    await ctx.publish([{ key: `${later}/first`, value: dispatch("first") }], later);
    await waitFor("the new tenant's run", async () => (await countRuns(ctx.db, later)) === 1, LONG);
    await caughtUp(relay, ctx.tenant);
    await caughtUp(relay, later);

    const posts = await api.metric("poimen_http_requests_total", {
      route: "/v1/runs",
      method: "POST",
    });
    const http = await api.metric("poimen_admission_calls_total", { entry: "http" });
    const all = await api.metric("poimen_admission_calls_total");
    const runs = (await ctx.db.sql`select count(*)::int as n from runs`)[0].n;
    // A tenant's messages ready together go in one batch request.
    assert.ok(posts >= 2 && posts <= 11, `${posts} POST /v1/runs for two tenants' 11 messages`);
    assert.equal(http, 11, "one admission per message, every one over HTTP");
    assert.equal(all, http, "no admission from any other entry");
    assert.equal(runs, http, "one run per admission");
    const sources = await ctx.db.sql`select source from runs`;
    assert.ok(sources.every((r) => String(r.source).startsWith("kafka:")), "all from the relay");

    // Mechanically: the relay's module graph holds no database or API code.
    const local = await localModuleGraph("relay/process.ts");
    assert.ok(local.includes("relay/inbox.ts"), `the graph was read: ${local}`);
    const forbidden = local.filter((s) => /^(db|api|admission|worker|outbox)\//.test(s));
    assert.deepEqual(forbidden, [], "relay/process.ts must not import these");
  },
);

relayTest("lag: reported while the API is down, back to 0 once it is up", async (ctx) => {
  // No API yet: the relay fetches and retries, nothing is done.
  const first = ctx.startRelay();
  const keys = Array.from({ length: 5 }, (_, i) => `lag-${i}-${suffix()}`);
  await ctx.publish(keys.map((k) => ({ key: `${ctx.tenant}/${k}`, value: dispatch(k) })));
  await waitFor("lag of the 5 messages", async () => (await lag(first, ctx.tenant)) === 5, LONG);
  await waitFor(
    "lag in seconds of the fetched messages",
    async () =>
      (await relayMetric(first, "poimen_inbox_lag_seconds", { topic: dispatchTopic(ctx.tenant) })) >
        0,
    LONG,
  );
  await waitFor(
    "network retries counted",
    async () => (await relayMetric(first, "poimen_inbox_retries_total", { reason: "network" })) > 0,
  );
  assert.ok(!first.exited);

  // A graceful stop in the middle of retrying: quick, clean, nothing committed or lost.
  const stopping = Date.now();
  assert.equal((await first.stop()).code, 0, first.logs().join("\n"));
  assert.ok(Date.now() - stopping < 10 * SECOND, "retries in backoff do not hold up a stop");
  assert.deepEqual(await ctx.admin.committedOffsets(ctx.groupId), []);
  const relay = ctx.startRelay();

  await ctx.startApi();
  await waitFor("lag back to 0", async () => (await lag(relay, ctx.tenant)) === 0, LONG);
  assert.equal(await countRuns(ctx.db, ctx.tenant), 5);
  assert.equal(
    await relayMetric(relay, "poimen_inbox_lag_seconds", { topic: dispatchTopic(ctx.tenant) }),
    0,
  );
  const histogram = await relayMetric(relay, "poimen_inbox_api_call_duration_seconds_count");
  assert.ok(histogram >= 5, `API calls timed: ${histogram}`);
});

relayTest("API down for a stretch: 50 messages, 50 runs, none twice", async (ctx) => {
  await ctx.startApi();
  const relay = ctx.startRelay();
  const warm = `warm-${suffix()}`;
  await ctx.publish([{ key: `${ctx.tenant}/${warm}`, value: dispatch(warm) }]);
  await waitFor("the warm-up run", async () => (await countRuns(ctx.db, ctx.tenant)) === 1, LONG);

  await ctx.stopApi();
  const keys = Array.from({ length: 50 }, (_, i) => `down-${i}-${suffix()}`);
  await ctx.publish(keys.map((k) => ({ key: `${ctx.tenant}/${k}`, value: dispatch(k, { k }) })));
  await waitFor("the relay retrying", async () => (await lag(relay, ctx.tenant)) === 50, LONG);
  assert.equal(await countRuns(ctx.db, ctx.tenant), 1);

  await ctx.startApi();
  await waitFor("51 runs", async () => (await countRuns(ctx.db, ctx.tenant)) === 51, LONG);
  await caughtUp(relay, ctx.tenant);
  const [r] = await ctx.db.sql`
    select count(*)::int as n, count(distinct dispatch_key)::int as keys
      from runs where tenant_id = ${ctx.tenant}`;
  assert.deepEqual({ n: r.n, keys: r.keys }, { n: 51, keys: 51 });
  assert.equal(await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "created" }), 51);
});

/** Reads `topic` from the start with a throwaway group until `count` messages came. */
async function readTopic(topic: string, count: number): Promise<ConsumedMessage[]> {
  const consumer = createConsumer({
    brokers: BROKERS,
    clientId: "poimen-test",
    groupId: `poimen-test-read-${suffix()}`,
    topics: [topic],
  });
  const got: ConsumedMessage[] = [];
  const done = (async () => {
    for await (const m of consumer) {
      got.push(m);
      if (got.length >= count) break;
    }
  })();
  try {
    await waitFor(`${count} messages on ${topic}`, () => got.length >= count, LONG);
    return got;
  } finally {
    await consumer.close();
    await done;
  }
}

relayTest(
  "a tenant the API keeps refusing (403: no tenant row) stalls only its own partitions",
  async (ctx) => {
    await ctx.startApi();
    // Topics on the broker, no tenant in the database: the API refuses the relay for it.
    const bad = await ctx.newTenant("bad", { row: false });
    const relay = ctx.startRelay({
      RELAY_MAX_PENDING: "20",
      RELAY_MAX_IN_FLIGHT: "8",
      RELAY_BACKOFF_BASE_MS: "100",
      RELAY_BACKOFF_CAP_MS: "2000",
    });
    // More than RELAY_MAX_PENDING, on every partition of the bad tenant.
    const badKeys = Array.from({ length: 60 }, (_, i) => `bad-${i}`);
    await ctx.publish(
      badKeys.map((k, i) => ({ key: `${bad}/${k}`, value: dispatch(k), partition: i % 3 })),
      bad,
    );
    await waitFor(
      "the bad tenant refused",
      async () =>
        (await relayMetric(relay, "poimen_inbox_retries_total", { reason: "forbidden" })) >
          0,
      LONG,
    );
    await waitFor(
      "the bad tenant's partitions paused",
      async () => (await relayMetric(relay, "poimen_inbox_paused_partitions")) === 3,
      LONG,
    );

    const goodKeys = Array.from({ length: 40 }, (_, i) => `good-${i}-${suffix()}`);
    await ctx.publish(goodKeys.map((k) => ({ key: `${ctx.tenant}/${k}`, value: dispatch(k) })));
    await waitFor(
      "every good message a run",
      async () => (await countRuns(ctx.db, ctx.tenant)) === 40,
      LONG,
    );
    await caughtUp(relay, ctx.tenant);

    // The bad tenant is still stuck, whole: nothing committed, nothing dead-lettered.
    assert.equal(await lag(relay, bad), 60);
    assert.equal(await countRuns(ctx.db, bad), 0);
    assert.equal(
      await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" }),
      0,
    );
    assert.equal(await relayMetric(relay, "poimen_inbox_paused_partitions"), 3);
    assert.ok(
      relay.logs().some((l) =>
        l.includes("the API refuses the relay's credentials") && l.includes(`"tenant":"${bad}"`)
      ),
      "loud about it, naming the tenant",
    );
  },
);

relayTest(
  "a keyless message makes exactly one run under forced redelivery and a second group",
  async (ctx) => {
    const api = await ctx.startApi();
    // It cannot commit in this test's lifetime: a kill loses its progress.
    const first = ctx.startRelay({ RELAY_COMMIT_INTERVAL_MS: "600000" });
    const [at] = await ctx.publish([{
      key: `${ctx.tenant}/keyless`,
      value: JSON.stringify({ workflow_ref: "echo", input: { n: 1 } }),
    }]);
    await waitFor("the run", async () => (await countRuns(ctx.db, ctx.tenant)) === 1, LONG);
    assert.equal(await relayMetric(first, "poimen_inbox_commits_total"), 0);

    // Crash before the commit: the message comes again, to the group's next
    // member; and a second relay group on the same topic admits it too.
    await first.stop("SIGKILL");
    const second = ctx.startRelay();
    const other = ctx.startRelay({ RELAY_GROUP_ID: `${ctx.groupId}-other` });
    await waitFor("both redeliveries posted", async () => (await relayPosts(api)) === 3, LONG);
    await caughtUp(second, ctx.tenant);
    await caughtUp(other, ctx.tenant);
    assert.equal(await countRuns(ctx.db, ctx.tenant), 1, "still exactly one run");
    for (const relay of [second, other]) {
      assert.equal(
        await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "replayed" }),
        1,
      );
    }
    const [run] = await ctx.db.sql`
      select dispatch_key, source from runs where tenant_id = ${ctx.tenant}`;
    const where = `${dispatchTopic(ctx.tenant)}/${at.partition}/${at.offset}`;
    assert.equal(run.dispatch_key, `kafka:${where}`, "the key derived from where the message is");
    assert.equal(run.source, `kafka:${where}`);
  },
);

relayTest(
  "a 503 with Retry-After: 1 is retried ever more slowly, never sooner than it says",
  async (ctx) => {
    // A stand-in API that is always unavailable, as poimen says it during a database outage.
    let calls = 0;
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        await req.body?.cancel();
        calls++;
        return new Response(
          JSON.stringify({
            type: `${PROBLEM_BASE}database-unavailable`,
            title: "Database unavailable",
            status: 503,
            retryable: true,
          }),
          {
            status: 503,
            headers: { "retry-after": "1", "content-type": "application/problem+json" },
          },
        );
      },
    );
    const relay = ctx.startRelay({
      API_URL: `http://127.0.0.1:${server.addr.port}`,
      RELAY_BACKOFF_BASE_MS: "1000",
      RELAY_BACKOFF_CAP_MS: "16000",
      LOG_LEVEL: "debug",
    });
    try {
      await ctx.publish([{ key: `${ctx.tenant}/slow`, value: dispatch("slow") }]);
      const retries = () =>
        relay.logs().filter((l) => l.includes('"msg":"admission failed, retrying"'))
          .map((l) =>
            JSON.parse(l) as { attempt: number; retry_after_ms: number; retry_in_ms: number }
          );
      await waitFor(
        "a retry waiting longer than Retry-After",
        () => retries().some((r) => r.retry_in_ms > 1000),
        LONG,
      );
      const seen = retries();
      assert.deepEqual(
        seen.map((r) => r.attempt),
        seen.map((_, i) => i + 1),
        "one message's tries",
      );
      for (const r of seen) {
        assert.equal(r.retry_after_ms, 1000);
        assert.ok(r.retry_in_ms >= 1000, `never sooner than Retry-After: ${r.retry_in_ms}`);
      }
      assert.ok(calls >= seen.length);
    } finally {
      await relay.stop();
      await server.shutdown();
    }
  },
);

relayTest(
  "input the API rejects as invalid (a NUL) is dead-lettered as validation; the relay moves on",
  async (ctx) => {
    await ctx.startApi();
    const relay = ctx.startRelay();
    const value = '{"workflow_ref":"echo","input":"\\u0000","dispatch_key":"k"}';
    const good = `after-${suffix()}`;
    await ctx.publish([
      { key: `${ctx.tenant}/k`, value, partition: 0 },
      { key: `${ctx.tenant}/${good}`, value: dispatch(good), partition: 0 },
    ]);
    await waitFor(
      "the dead letter",
      async () =>
        (await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" })) ===
          1,
      LONG,
    );
    await caughtUp(relay, ctx.tenant);
    assert.equal(await countRuns(ctx.db, ctx.tenant), 1);
    const [letter] = await readTopic(dlqTopic(ctx.tenant), 1);
    assert.equal(new TextDecoder().decode(letter.value), value);
    assert.equal(letter.headers["poimen-dlq-reason"], "validation");
    assert.equal(letter.headers["poimen-dlq-status"], "422");
  },
);

relayTest(
  "values Postgres cannot store and a claimed relay key are dead-lettered; the partition drains on",
  async (ctx) => {
    await ctx.startApi();
    const relay = ctx.startRelay();
    const topic = dispatchTopic(ctx.tenant);
    // A day within the 365 allowed, whatever the clock says.
    const soon = new Date(Date.now() + 2 * 86_400_000).toISOString().slice(0, 10);
    const first = `first-${suffix()}`;
    // One partition: everything after a bad message queues behind it.
    const ahead = await ctx.publish([
      { key: `${ctx.tenant}/${first}`, value: dispatch(first), partition: 0 },
      {
        key: `${ctx.tenant}/year-0`,
        value: JSON.stringify({
          workflow_ref: "echo",
          dispatch_key: "year-0",
          run_after: "0000-01-01T00:00:00Z",
        }),
        partition: 0,
      },
      {
        key: `${ctx.tenant}/offset-16`,
        value: JSON.stringify({
          workflow_ref: "echo",
          dispatch_key: "offset-16",
          run_after: `${soon}T00:00:00+16:00`,
        }),
        partition: 0,
      },
    ]);
    // A message taking the key the relay will derive for the keyless message after it.
    const claimAt = ahead[2].offset + 1n;
    const stolen = `kafka:${topic}/0/${claimAt + 1n}`;
    const last = `last-${suffix()}`;
    const behind = await ctx.publish([
      {
        key: `${ctx.tenant}/claim`,
        value: JSON.stringify({ workflow_ref: "echo", input: "claim", dispatch_key: stolen }),
        partition: 0,
      },
      {
        key: `${ctx.tenant}/keyless`,
        value: JSON.stringify({ workflow_ref: "echo", input: "keyless" }),
        partition: 0,
      },
      { key: `${ctx.tenant}/${last}`, value: dispatch(last), partition: 0 },
    ]);
    assert.deepEqual(behind.map((b) => b.offset), [claimAt, claimAt + 1n, claimAt + 2n]);

    await waitFor("the three good messages' runs", async () => {
      if (relay.exited) throw new Error(`relay exited:\n${relay.logs().join("\n")}`);
      return (await countRuns(ctx.db, ctx.tenant)) === 3;
    }, LONG);
    await caughtUp(relay, ctx.tenant);
    assert.equal(
      await relayMetric(relay, "poimen_inbox_messages_total", { outcome: "dead_lettered" }),
      3,
    );
    const runs = await ctx.db.sql<{ dispatch_key: string; input: unknown }[]>`
      select dispatch_key, input from runs where tenant_id = ${ctx.tenant}`;
    assert.deepEqual(runs.map((r) => r.dispatch_key).sort(), [first, stolen, last].sort());
    assert.equal(
      runs.find((r) => r.dispatch_key === stolen)!.input,
      "keyless",
      "the keyless message's own run, not the claimer's",
    );

    const letters = await readTopic(dlqTopic(ctx.tenant), 3);
    for (
      const [key, field] of [["year-0", "run_after"], ["offset-16", "run_after"], [
        "claim",
        "dispatch_key",
      ]]
    ) {
      const letter = letters.find((l) => l.key === `${ctx.tenant}/${key}`);
      assert.ok(letter, `the dead letter of ${key}`);
      assert.equal(letter.headers["poimen-dlq-reason"], "validation", key);
      assert.equal(letter.headers["poimen-dlq-status"], "422", key);
      assert.equal(letter.headers["poimen-dlq-attempts"], "1", `${key}: never retried`);
      assert.match(letter.headers["poimen-dlq-detail"], new RegExp(`${field}: `), key);
    }
  },
);

relayTest(
  "two relays in one group: a partition revoked mid-backlog is left to its new owner, one run per message",
  async (ctx) => {
    await ctx.startApi();
    // The API behind a delay, so the backlog takes a while to drain: the
    // second relay joins while the first still holds most of it.
    const server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      async (req) => {
        await delay(25);
        const url = new URL(req.url);
        const res = await fetch(`${ctx.api!.url}${url.pathname}${url.search}`, {
          method: req.method,
          headers: req.headers,
          body: await req.arrayBuffer(),
        });
        return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
      },
    );
    const env = {
      API_URL: `http://127.0.0.1:${server.addr.port}`,
      RELAY_MAX_IN_FLIGHT: "2",
      LOG_LEVEL: "debug",
    };
    try {
      const n = 1500;
      // Every 10th keyless: its derived key must hold across the move too.
      const values = Array.from(
        { length: n },
        (_, i) =>
          i % 10 === 0
            ? JSON.stringify({ workflow_ref: "echo", input: { i } })
            : dispatch(`rv-${i}`, { i }),
      );
      await ctx.publish(
        values.map((value, i) => ({ key: `${ctx.tenant}/${i}`, value, partition: i % 3 })),
      );
      const first = ctx.startRelay(env);
      await waitFor(
        "the first relay draining",
        async () => (await countRuns(ctx.db, ctx.tenant)) >= 100,
        LONG,
      );
      const second = ctx.startRelay(env);
      const revoked = () =>
        first.logs().filter((l) => l.includes('"msg":"partition revoked"'))
          .map((l) => JSON.parse(l) as { partition: number; dropped: number });
      await waitFor("a partition of the first relay revoked", () => revoked().length > 0, LONG);
      assert.ok(
        (await countRuns(ctx.db, ctx.tenant)) < n,
        "the second relay joined while the first was still draining",
      );
      assert.ok(revoked().some((r) => r.dropped > 0), "queued messages were dropped");

      await waitFor(`${n} runs`, async () => (await countRuns(ctx.db, ctx.tenant)) === n, LONG);
      await caughtUp(second, ctx.tenant);
      await caughtUp(first, ctx.tenant);
      const [r] = await ctx.db.sql`
        select count(*)::int as runs, count(distinct dispatch_key)::int as keys
          from runs where tenant_id = ${ctx.tenant}`;
      assert.deepEqual({ runs: r.runs, keys: r.keys }, { runs: n, keys: n }, "one run per message");
      assert.ok(
        (await relayMetric(second, "poimen_inbox_messages_total", { outcome: "created" })) > 0,
        "the new owner admitted what the first relay let go",
      );

      // After giving a partition up, the first relay admits nothing more of it.
      const lines = first.logs();
      for (const { partition } of revoked()) {
        const at = lines.findIndex((l) =>
          l.includes('"msg":"partition revoked"') && l.includes(`"partition":${partition},`)
        );
        const late = lines.slice(at).filter((l) =>
          l.includes('"msg":"admitted"') && l.includes(`"partition":${partition},`)
        );
        assert.deepEqual(late, [], `partition ${partition} admitted after its revocation`);
      }
    } finally {
      await server.shutdown();
    }
  },
);
