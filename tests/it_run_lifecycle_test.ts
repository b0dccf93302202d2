/**
 * The whole path with real processes: a run admitted over HTTP is executed
 * by the worker, and its events reach `poimen.<tenant>.events` through the
 * outbox publisher, in seq order, with the right key and headers. Then the
 * broker goes down: admissions and execution go on, events wait in
 * Postgres, and all of them are shipped once it is back.
 */
import assert from "node:assert/strict";
import { type ConsumedMessage } from "../kafka/consumer.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { eventsTopic } from "../contracts/topics.ts";
import { type EventMessage, parseEventMessage } from "../contracts/events.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand } from "./support/processes.ts";
import { consume, KAFKA_TEST, privateBroker } from "./support/kafka.ts";

const LONG = 90 * SECOND;

// Parsed with the wire contract: a message off the contract fails the test.
const decode = (m: ConsumedMessage): EventMessage => parseEventMessage(m.value);

Deno.test({
  name:
    "queue outbox_publisher: a run admitted over HTTP runs, and its events reach Kafka in order",
  ...KAFKA_TEST,
  async fn() {
    // A broker of this test's own, so taking it down disturbs nothing else.
    await using broker = await privateBroker();

    const db = await freshDatabase();
    const tenant = `life-${crypto.randomUUID().slice(0, 8)}`;
    const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url });
    assert.equal(tok.code, 0, tok.stderr);
    const token = tok.stdout.trim();
    const admin = createAdmin({ brokers: [broker.address], clientId: "poimen-test" });
    await ensureTenantTopics(admin, tenant, {
      partitions: 3,
      replicationFactor: 1,
      retentionMs: 3_600_000,
    });
    await admin.close();

    const env = { DATABASE_URL: db.url, KAFKA_BROKERS: broker.address, LOG_LEVEL: "warn" };
    const api = new ApiProcess(env);
    const worker = new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "200" });
    const outbox = new PoimenProcess("outbox", { ...env, OUTBOX_POLL_MS: "100" });
    const { got, consumer } = consume(eventsTopic(tenant), broker.address);
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const admit = async (body: unknown) => {
      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
      });
      assert.equal(res.status, 201);
      return (await res.json()).run_id as string;
    };
    const run = async (id: string) =>
      await (await fetch(`${api.url}/v1/runs/${id}`, { headers })).json();

    try {
      await api.ready();

      // One run, end to end.
      const id = await admit({
        workflow_ref: "echo",
        input: { hello: "world" },
        goal_id: "g-1",
        dispatch_key: "d-1",
      });
      const done = await waitFor("the run succeeded", async () => {
        const r = await run(id);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.deepEqual(done.result, { hello: "world" });
      assert.equal(done.attempts, 1);

      const mine = await waitFor("its three events on Kafka", () => {
        const m = got.filter((x) => decode(x).run_id === id);
        return m.length >= 3 ? m : undefined;
      }, LONG);
      assert.deepEqual(
        mine.map((m) => [decode(m).seq, decode(m).type]),
        [[1, "run.admitted"], [2, "run.started"], [3, "run.succeeded"]],
      );
      for (const m of mine) {
        assert.equal(m.key, `${tenant}/${id}`);
        assert.equal(m.headers["poimen-run-id"], id);
        assert.equal(m.headers["poimen-seq"], String(decode(m).seq));
        assert.equal(m.headers["poimen-type"], decode(m).type);
        assert.equal(m.headers["poimen-goal-id"], "g-1");
        assert.equal(m.headers["poimen-dispatch-key"], "d-1");
      }
      assert.equal(new Set(mine.map((m) => m.partition)).size, 1, "one run, one partition");

      // The broker goes down: admission and execution go on, events wait.
      assert.equal(await broker.stop(), true, "the broker was running");
      try {
        const ids = await Promise.all(
          Array.from({ length: 20 }, (_, i) => admit({ workflow_ref: "echo", input: { i } })),
        );
        await waitFor("the 20 runs succeeded while Kafka is down", async () => {
          const [r] = await db.sql`
            select count(*)::int as n from runs
             where tenant_id = ${tenant} and status = 'succeeded' and run_id = any(${ids}::uuid[])`;
          return r.n === 20;
        }, LONG);
        const [pending] = await db.sql`
          select count(*)::int as n from work_events
           where tenant_id = ${tenant} and published_at is null`;
        assert.equal(pending.n, 60, "3 events per run wait in Postgres");
      } finally {
        await broker.start();
      }

      // Back: every event shipped; deduped by (run_id, seq), each run has 1, 2, 3.
      const all = await waitFor("all 63 events after the outage", () => {
        const keys = new Set(got.map((m) => `${decode(m).run_id}/${decode(m).seq}`));
        return keys.size >= 63 ? got.map(decode) : undefined;
      }, LONG);
      const byRun = new Map<string, number[]>();
      for (const e of all) {
        const seqs = byRun.get(e.run_id) ?? [];
        if (!seqs.includes(e.seq)) seqs.push(e.seq);
        byRun.set(e.run_id, seqs);
      }
      assert.equal(byRun.size, 21);
      for (const seqs of byRun.values()) assert.deepEqual(seqs, [1, 2, 3]);
      await waitFor("the outbox marked everything published", async () => {
        const [r] = await db.sql`
          select count(*)::int as n from work_events
           where tenant_id = ${tenant} and published_at is null`;
        return r.n === 0;
      }, LONG);
    } finally {
      await consumer.close();
      const statuses = await Promise.all([api.stop(), worker.stop(), outbox.stop()]);
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        const p = [api, worker, outbox][i];
        assert.equal(s.code, 0, `${p.command} did not stop cleanly:\n${p.logs().join("\n")}`);
      }
    }
  },
});
