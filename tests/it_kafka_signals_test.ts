/**
 * Signals over Kafka, end to end with real processes: a run of a durable
 * workflow module (hosted by the stock worker, `--workflows`) waits for a
 * signal; a message on `poimen.<tenant>.signals` (DispatchPublisher.signal)
 * reaches it through the inbox relay and `POST /v1/runs/{id}/signals`, and
 * is one signal however often it is delivered: a second relay group reading
 * the topic again replays every message. A signal to a finished run, to an
 * unknown run, with a payload its declared schema refuses, and malformed
 * messages are dead-lettered while the partition drains on to the valid
 * signals behind them.
 *
 *   deno test -A tests/it_kafka_signals_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { DispatchPublisher } from "../client/dispatch.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { createProducer } from "../kafka/producer.ts";
import { dlqTopic, signalsTopic, tenantTopics } from "../contracts/topics.ts";
import { DLQ_HEADERS } from "../relay/dead_letter.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess, sampleValue } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

await startBroker();

const LONG = 60_000;

// A run waits for its approval (suspended: far longer than the worker's
// suspension threshold) and returns what it got.
const MODULE = `
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const approval = defineWorkflow({
  name: "ks.approval",
  version: 1,
  input: z.object({ order: z.string() }),
  async handler(_input, ctx) {
    const got = await ctx.waitForSignal("approval", { timeout: 600_000 });
    return { payload: got?.payload ?? null, signal_id: got?.signal_id ?? null };
  },
});
// The same, with its signal's payload declared: the API refuses another (422).
export const declared = defineWorkflow({
  name: "ks.declared",
  version: 1,
  input: z.object({ order: z.string() }),
  signals: { approval: z.object({ ok: z.boolean() }) },
  async handler(_input, ctx) {
    const got = await ctx.waitForSignal("approval", { timeout: 600_000 });
    return { payload: got?.payload ?? null, signal_id: got?.signal_id ?? null };
  },
});
`;

interface Ctx {
  db: TestDatabase;
  tenant: string;
  api: ApiProcess;
  token: string;
  publisher: DispatchPublisher;
  startRelay(group: string): PoimenProcess;
  /** Admits a run of `workflow` (ks.approval) and waits until it is suspended, waiting for its signal. */
  waitingRun(order: string, workflow?: string): Promise<string>;
  run(runId: string): Promise<{ status: string; result: unknown }>;
}

/** A database, a tenant with topics of one partition, an API, a worker hosting MODULE; torn down after. */
function signalsTest(name: string, fn: (ctx: Ctx) => Promise<void>) {
  Deno.test({
    name: `kafka signals: ${name}`,
    ...KAFKA_TEST,
    fn: async () => {
      const tenant = `ks-${crypto.randomUUID().slice(0, 8)}`;
      const db = await freshDatabase();
      const dir = await Deno.makeTempDir({ prefix: "poimen-signals-" });
      const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
      const publisher = new DispatchPublisher({ brokers: [BROKER] });
      const processes: PoimenProcess[] = [];
      let failed = true;
      try {
        await Deno.writeTextFile(`${dir}/workflows.ts`, MODULE);
        // One partition: the order of the messages is the order they are relayed in.
        await ensureTenantTopics(admin, tenant, {
          partitions: 1,
          replicationFactor: 1,
          retentionMs: 3_600_000,
        });
        const token = await newToken(db.url, tenant);
        const serviceToken = await newToken(db.url, "--service", "relay");
        const api = new ApiProcess({ DATABASE_URL: db.url });
        processes.push(api);
        const worker = new PoimenProcess("worker", {
          DATABASE_URL: db.url,
          LOG_LEVEL: "warn",
          WORKER_POLL_MS: "50",
          WORKER_ID: `w-${tenant}`,
        }, ["--workflows", `${dir}/workflows.ts`]);
        processes.push(worker);
        await api.ready();
        await waitFor("the worker registered its workflows", async () => {
          if (worker.exited) throw new Error(`worker exited:\n${worker.logs().join("\n")}`);
          const [row] = await db.sql<{ n: number }[]>`
            select count(*)::int as n from workflow_workers
             where workflows @> array['ks.approval@1', 'ks.declared@1'] and expires_at > now()`;
          return row.n === 1;
        }, LONG);
        const call = async (path: string, body?: unknown) => {
          const res = await fetch(`${api.url}${path}`, {
            method: body === undefined ? "GET" : "POST",
            headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
          return { status: res.status, json: await res.json() };
        };
        const ctx: Ctx = {
          db,
          tenant,
          api,
          token,
          publisher,
          startRelay(group) {
            const relay = new PoimenProcess("relay", {
              KAFKA_BROKERS: BROKER,
              API_URL: api.url,
              RELAY_TOKEN: serviceToken,
              RELAY_GROUP_ID: `poimen-test-${group}-${tenant}`,
              // This test's tenant only: other tests' topics share the broker.
              RELAY_TENANT_PATTERN: tenant,
              RELAY_TOPIC_REFRESH_MS: "500",
              RELAY_LAG_INTERVAL_MS: "300",
              RELAY_BACKOFF_BASE_MS: "50",
              RELAY_BACKOFF_CAP_MS: "1000",
              RELAY_SESSION_TIMEOUT_MS: "6000",
              LOG_LEVEL: "info",
            });
            processes.push(relay);
            return relay;
          },
          async waitingRun(order, workflow = "ks.approval") {
            const admitted = await call("/v1/runs", {
              workflow_ref: workflow,
              input: { order },
            });
            assert.equal(admitted.status, 201, JSON.stringify(admitted.json));
            const runId = admitted.json.run_id as string;
            await waitFor(`run ${order} waits for its signal`, async () => {
              const { json } = await call(`/v1/runs/${runId}`);
              return json.status === "waiting" && json.waiting_for?.name === "approval";
            }, LONG);
            return runId;
          },
          async run(runId) {
            return (await call(`/v1/runs/${runId}`)).json;
          },
        };
        await fn(ctx);
        // Every relay still running stops gracefully (exit 0).
        for (const p of processes) {
          if (p.command !== "relay" || p.exited) continue;
          const status = await p.stop();
          assert.equal(status.code, 0, `relay did not stop cleanly:\n${p.logs().join("\n")}`);
        }
        failed = false;
      } finally {
        for (const p of processes.reverse()) {
          if (failed) {
            console.error(`--- ${p.command} ${p.pid} logs (last 40 lines) ---`);
            console.error(p.logs().slice(-40).join("\n"));
          }
          await p.stop("SIGKILL");
        }
        await publisher.close();
        await admin.deleteTopics(tenantTopics(tenant)).catch(() => {});
        await admin.close();
        await Deno.remove(dir, { recursive: true });
        await db.drop();
      }
    },
  });
}

/** Messages the relay finished, by outcome (created, replayed, dead_lettered). */
async function relayed(relay: PoimenProcess, outcome: string): Promise<number> {
  if (relay.exited) throw new Error(`relay exited:\n${relay.logs().join("\n")}`);
  const text = await (await fetch(`${relay.metricsUrl}/metrics`)).text();
  return sampleValue(text, "poimen_inbox_messages_total", { outcome });
}

async function signalRows(db: TestDatabase, runId: string): Promise<string[]> {
  const rows = await db.sql<{ signal_id: string }[]>`
    select signal_id from run_signals where run_id = ${runId} order by signal_id`;
  return rows.map((r) => r.signal_id);
}

signalsTest(
  "a signal over Kafka wakes its waiting run, and is one signal however often it is delivered",
  async ({ db, tenant, publisher, startRelay, waitingRun, run }) => {
    const [first, second] = [await waitingRun("o-1"), await waitingRun("o-2")];
    const relay = startRelay("a");
    // Without an id: the relay gives it the message's place in Kafka.
    const derived = await publisher.signal(tenant, {
      run_id: first,
      name: "approval",
      payload: { ok: true },
    });
    assert.equal(derived.signalId, `kafka:${signalsTopic(tenant)}/0/${derived.offset}`);
    // With an id, published twice (a producer's retry): one signal.
    const given = { run_id: second, name: "approval", payload: { by: "ana" }, signal_id: "ok-2" };
    await publisher.signal(tenant, given);
    await publisher.signal(tenant, given);
    for (
      const [runId, payload, signalId] of [
        [first, { ok: true }, derived.signalId],
        [second, { by: "ana" }, "ok-2"],
      ] as const
    ) {
      const done = await waitFor(`run ${runId} succeeded`, async () => {
        const r = await run(runId);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.deepEqual(done.result, { payload, signal_id: signalId });
    }
    await waitFor(
      "relay a finished the three messages",
      async () => await relayed(relay, "created") === 2 && await relayed(relay, "replayed") === 1,
      LONG,
    );

    // Redelivery: another group reads the topic again from its start; each
    // message is a replay of its signal (the derived id included), and the
    // final runs take no second one (not dead-lettered: a replay is a 200).
    const again = startRelay("b");
    await waitFor(
      "relay b replayed the three messages",
      async () => await relayed(again, "replayed") === 3,
      LONG,
    );
    assert.equal(await relayed(again, "created"), 0);
    assert.equal(await relayed(again, "dead_lettered"), 0);
    assert.deepEqual(await signalRows(db, first), [derived.signalId]);
    assert.deepEqual(await signalRows(db, second), ["ok-2"]);
    const [{ n }] = await db.sql<{ n: number }[]>`
      select count(*)::int as n from work_events
       where tenant_id = ${tenant} and type = 'signal.received'`;
    assert.equal(n, 2, "one signal.received per signal");
  },
);

signalsTest(
  "a signal to a finished or unknown run, a payload its schema refuses and malformed messages are dead-lettered; the partition drains on",
  async ({ db, tenant, api, token, publisher, startRelay, waitingRun, run }) => {
    const cancelled = await waitingRun("o-cancelled");
    const res = await fetch(`${api.url}/v1/runs/${cancelled}/cancel`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal(res.status, 200, await res.text());
    await waitFor(
      "the waiting run is cancelled",
      async () => (await run(cancelled)).status === "cancelled",
      LONG,
    );
    const waiting = await waitingRun("o-waiting");
    const strict = await waitingRun("o-strict", "ks.declared");
    const unknown = crypto.randomUUID();
    // In this order on the one partition: five that can never be sent, then good ones.
    const poison = [
      { value: "{not json" },
      { value: JSON.stringify({ name: "approval", payload: 1 }) },
    ];
    const producer = createProducer({ brokers: [BROKER], clientId: "poimen-test" });
    try {
      await producer.send(poison.map((p) => ({
        topic: signalsTopic(tenant),
        key: `${tenant}/x`,
        value: p.value,
      })));
    } finally {
      await producer.close();
    }
    await publisher.signal(tenant, { run_id: cancelled, name: "approval", signal_id: "late" });
    await publisher.signal(tenant, { run_id: unknown, name: "approval" });
    await publisher.signal(tenant, { run_id: strict, name: "approval", payload: { ok: "no" } });
    await publisher.signal(tenant, { run_id: waiting, name: "approval", payload: "yes" });
    await publisher.signal(tenant, { run_id: strict, name: "approval", payload: { ok: true } });

    const { got, consumer } = consume(dlqTopic(tenant));
    try {
      const relay = startRelay("a");
      const done = await waitFor("the run behind the dead letters succeeded", async () => {
        const r = await run(waiting);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.deepEqual((done.result as { payload: unknown }).payload, "yes");
      const approved = await waitFor("the declared run took its valid signal", async () => {
        const r = await run(strict);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.deepEqual((approved.result as { payload: unknown }).payload, { ok: true });
      await waitFor("five dead letters", () => got.length === 5, LONG);
      // Written as each was judged (calls run side by side): in their source's order here.
      got.sort((a, b) =>
        Number(a.headers[DLQ_HEADERS.offset]) - Number(b.headers[DLQ_HEADERS.offset])
      );
      assert.deepEqual(
        got.map((m) => [m.headers[DLQ_HEADERS.reason], m.headers[DLQ_HEADERS.status]]),
        [
          ["bad-json", "none"],
          ["validation", "none"],
          ["run-finished", "409"],
          ["not-found", "404"],
          ["validation", "422"],
        ],
      );
      for (const m of got) {
        assert.equal(m.headers[DLQ_HEADERS.topic], signalsTopic(tenant));
        assert.equal(m.headers[DLQ_HEADERS.partition], "0");
      }
      assert.equal(
        JSON.parse(new TextDecoder().decode(got[2].value)).signal_id,
        "late",
        "the dead letter is the original message",
      );
      await waitFor(
        "the relay counted them",
        async () =>
          await relayed(relay, "dead_lettered") === 5 && await relayed(relay, "created") === 2,
        LONG,
      );
      assert.deepEqual(await signalRows(db, cancelled), []);
      assert.equal((await signalRows(db, strict)).length, 1, "the refused payload stored nothing");
    } finally {
      await consumer.close();
    }
  },
);
