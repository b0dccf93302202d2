/**
 * Start later (`run_after`) with real processes on a database of this
 * file's own: over HTTP a run due in the future is not started before it is
 * due, then runs; a replay returns the first run whatever its run_after; a
 * time in the past means now; bad times are 422s. Over Kafka (the shared
 * broker, the real relay) a dispatch message carries run_after the same way.
 *
 *   deno test -A tests/it_schedule_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { createProducer } from "../kafka/producer.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { dispatchTopic } from "../contracts/topics.ts";
import { MAX_RUN_AFTER_DAYS } from "../contracts/runs.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { DAY, SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, freePort, newToken, PoimenProcess } from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";

const LONG = 60 * SECOND;

await startBroker();

/** `at` as RFC 3339 with a +02:00 offset (not Z), as a caller elsewhere would write it. */
function withOffset(at: Date): string {
  const local = new Date(at.getTime() + 2 * 3600_000).toISOString().replace("Z", "");
  return `${local}+02:00`;
}

Deno.test({
  name: "schedule: run_after over HTTP is honoured, replays keep the first run, bad times are 422",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = `sc-${crypto.randomUUID().slice(0, 8)}`;
    const token = await newToken(db.url, tenant);
    const env = { DATABASE_URL: db.url, LOG_LEVEL: "warn" };
    const api = new ApiProcess(env);
    const worker = new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "100" });
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const post = async (body: unknown) => {
      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
      });
      return { res, body: await res.json() };
    };
    const get = async (id: string) =>
      await (await fetch(`${api.url}/v1/runs/${id}`, { headers })).json();

    try {
      await api.ready();

      // Due in three seconds: queued until then, then run.
      const due = new Date(Date.now() + 3 * SECOND);
      const later = await post({
        workflow_ref: "echo",
        input: { later: true },
        dispatch_key: "later-1",
        run_after: withOffset(due),
      });
      assert.equal(later.res.status, 201);
      assert.equal(later.body.run_after, due.toISOString(), "stored as the instant asked for");
      // A run due now, admitted after it, runs first: the worker is not idle.
      const now = await post({ workflow_ref: "echo", input: { now: true } });
      assert.equal(now.res.status, 201);
      const ranNow = await waitFor("the due-now run succeeded", async () => {
        const r = await get(now.body.run_id);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.equal((await get(later.body.run_id)).status, "queued");
      assert.ok(ranNow.started_at < due.toISOString(), "the worker was running before it was due");

      // A replay, due at once this time: the first run, its run_after unchanged.
      const replay = await post({
        workflow_ref: "echo",
        input: { later: true },
        dispatch_key: "later-1",
        run_after: new Date().toISOString(),
      });
      assert.equal(replay.res.status, 200);
      assert.equal(replay.res.headers.get("idempotent-replayed"), "true");
      assert.equal(replay.res.headers.get("idempotent-body-mismatch"), null);
      assert.equal(replay.body.run_id, later.body.run_id);
      assert.equal(replay.body.run_after, due.toISOString());

      const done = await waitFor("the scheduled run succeeded", async () => {
        const r = await get(later.body.run_id);
        return r.status === "succeeded" ? r : undefined;
      }, LONG);
      assert.ok(
        done.started_at >= due.toISOString(),
        `started ${done.started_at}, due ${due.toISOString()}`,
      );
      assert.deepEqual(done.result, { later: true });
      assert.equal(done.attempts, 1);

      // A time in the past means now.
      const past = await post({ workflow_ref: "echo", run_after: "2001-02-03T04:05:06Z" });
      assert.equal(past.res.status, 201);
      assert.ok(past.body.run_after >= past.body.created_at, past.body.run_after);
      await waitFor("the past-due run succeeded", async () => {
        return (await get(past.body.run_id)).status === "succeeded";
      }, LONG);

      // Refused: no offset, not a time, beyond the limit. Nothing written.
      const [{ n: before }] = await db.sql`select count(*)::int as n from runs`;
      for (
        const bad of [
          new Date(Date.now() + DAY).toISOString().replace("Z", ""), // no offset
          "tomorrow",
          new Date(Date.now() + (MAX_RUN_AFTER_DAYS + 1) * DAY).toISOString(),
          1893456000000,
        ]
      ) {
        const r = await post({ workflow_ref: "echo", run_after: bad });
        assert.equal(r.res.status, 422, JSON.stringify(bad));
        assert.equal(r.body.type, PROBLEM_BASE + "validation");
        assert.deepEqual(r.body.errors.map((e: { path: string }) => e.path), ["run_after"]);
      }
      const [{ n: after }] = await db.sql`select count(*)::int as n from runs`;
      assert.equal(after, before);
      // Within the limit is fine (and stays queued).
      const far = await post({
        workflow_ref: "echo",
        run_after: new Date(Date.now() + (MAX_RUN_AFTER_DAYS - 1) * DAY).toISOString(),
      });
      assert.equal(far.res.status, 201);
      assert.equal(far.body.status, "queued");
    } finally {
      const procs = [api, worker];
      const statuses = await Promise.all(procs.map((p) => p.stop()));
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        const p = procs[i];
        assert.equal(s.code, 0, `${p.command} did not stop cleanly:\n${p.logs().join("\n")}`);
      }
    }
  },
});

Deno.test({
  name:
    "schedule: a dispatch message's run_after reaches the run through the relay; a redelivery with another keeps the first",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = `sck-${crypto.randomUUID().slice(0, 8)}`;
    const token = await newToken(db.url, tenant);
    const relayToken = await newToken(db.url, "--service", "relay");
    const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
    await ensureTenantTopics(admin, tenant, {
      partitions: 1,
      replicationFactor: 1,
      retentionMs: 3_600_000,
    });
    await admin.close();
    const producer = createProducer({ brokers: [BROKER], clientId: "poimen-test" });
    const api = new ApiProcess({ DATABASE_URL: db.url });
    const relay = new PoimenProcess("relay", {
      KAFKA_BROKERS: BROKER,
      API_URL: api.url,
      RELAY_TOKEN: relayToken,
      RELAY_METRICS_PORT: String(freePort()),
      RELAY_GROUP_ID: `poimen-test-${tenant}`,
      RELAY_TENANT_PATTERN: tenant,
      RELAY_TOPIC_REFRESH_MS: "500",
      LOG_LEVEL: "warn",
    });
    const headers = { authorization: `Bearer ${token}` };
    try {
      await api.ready();
      const due = new Date(Date.now() + 30 * DAY);
      const send = (runAfter: string) =>
        producer.send([{
          topic: dispatchTopic(tenant),
          key: `${tenant}/k-1`,
          value: JSON.stringify({ workflow_ref: "echo", dispatch_key: "k-1", run_after: runAfter }),
        }]);
      await send(withOffset(due));
      const run = await waitFor("the run admitted through the relay", async () => {
        const page = await (await fetch(`${api.url}/v1/runs?dispatch_key=k-1`, { headers }))
          .json();
        return page.runs[0];
      }, LONG);
      assert.equal(run.run_after, due.toISOString());
      assert.equal(run.status, "queued");
      assert.match(run.source, /^kafka:/);

      // Redelivered (or republished) with another time: still the first run.
      await send(new Date().toISOString());
      await waitFor("the redelivery admitted (a replay)", async () => {
        const text = await (await fetch(`${relay.metricsUrl}/metrics`)).text();
        return /poimen_inbox_messages_total\{outcome="replayed"\} 1/.test(text);
      }, LONG);
      const [{ n, run_after }] = await db.sql<{ n: number; run_after: Date }[]>`
        select count(*)::int as n, min(run_after) as run_after from runs
         where tenant_id = ${tenant}`;
      assert.equal(n, 1);
      assert.equal(run_after.toISOString(), due.toISOString());
    } finally {
      await producer.close();
      const procs = [relay, api];
      const statuses = await Promise.all(procs.map((p) => p.stop()));
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        const p = procs[i];
        assert.equal(s.code, 0, `${p.command} did not stop cleanly:\n${p.logs().join("\n")}`);
      }
    }
  },
});
