/**
 * Cancel end to end, with real processes (API, worker, outbox) on a database
 * of this file's own and the shared development broker: a queued run is
 * cancelled at once, a running run's handler is aborted mid-run and the run
 * ends cancelled (its attempt's write), a finished run is a 409, another
 * tenant's run a 404; the run.cancelled events reach Kafka through the
 * outbox.
 *
 *   deno test -A tests/it_cancel_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { eventsTopic } from "../contracts/topics.ts";
import { type EventMessage, parseEventMessage } from "../contracts/events.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { SECOND } from "../core/time.ts";
import { freshDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess } from "./support/processes.ts";
import { BROKER, consume, KAFKA_TEST } from "./support/kafka.ts";

const LONG = 60 * SECOND;

await startBroker();

Deno.test({
  name: "cancel: queued at once, running mid-handler, finished refused, other tenants' hidden",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const tenant = `cx-${crypto.randomUUID().slice(0, 8)}`;
    const token = await newToken(db.url, tenant);
    const other = await newToken(db.url, `${tenant}-o`);
    const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER, LOG_LEVEL: "info" };
    const api = new ApiProcess({ ...env, LOG_LEVEL: "warn" });
    // One slot: while the sleep runs, the next run stays queued. A lease of
    // a minute beats every 20 s: the cancel must arrive by NOTIFY or the
    // heartbeat, whichever comes first, and the test waits for either.
    const worker = new PoimenProcess("worker", {
      ...env,
      WORKER_CONCURRENCY: "1",
      WORKER_POLL_MS: "100",
      WORKER_LEASE_MS: String(60 * SECOND),
    });
    const outbox = new PoimenProcess("outbox", { ...env, OUTBOX_POLL_MS: "100" });
    const { got, consumer } = consume(eventsTopic(tenant));
    const headers = (t = token) => ({
      authorization: `Bearer ${t}`,
      "content-type": "application/json",
    });
    const admit = async (body: unknown) => {
      const res = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers: headers(),
        body: JSON.stringify(body),
      });
      assert.equal(res.status, 201);
      return await res.json();
    };
    const get = async (id: string) =>
      await (await fetch(`${api.url}/v1/runs/${id}`, { headers: headers() })).json();
    const cancel = async (id: string, t = token) => {
      const res = await fetch(`${api.url}/v1/runs/${id}/cancel`, {
        method: "POST",
        headers: headers(t),
      });
      return { status: res.status, body: await res.json() };
    };
    const eventsOf = (id: string) =>
      got.map((m) => parseEventMessage(m.value)).filter((e) => e.run_id === id);
    const typesOf = (evs: EventMessage[]) => [...new Set(evs.map((e) => `${e.seq} ${e.type}`))];

    try {
      await api.ready();

      // A run that waits on ctx.signal, far longer than the test.
      const sleeper = await admit({ workflow_ref: "sleep", input: { ms: 600_000 } });
      await waitFor("the sleep run is running", async () => {
        const r = await get(sleeper.run_id);
        return r.status === "running";
      }, LONG);

      // Queued (the only slot is taken): cancelled at once.
      const queued = await admit({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: "q-1" });
      const c1 = await cancel(queued.run_id);
      assert.equal(c1.status, 200);
      assert.equal(c1.body.status, "cancelled");
      assert.ok(c1.body.cancel_requested_at);
      assert.ok(c1.body.finished_at);
      assert.equal(c1.body.attempts, 0);
      // Idempotent: the same run, unchanged.
      const c1again = await cancel(queued.run_id);
      assert.equal(c1again.status, 200);
      assert.equal(c1again.body.status, "cancelled");
      assert.equal(c1again.body.updated_at, c1.body.updated_at);

      // Another tenant cannot see it, nor cancel it; a made-up id is no run either.
      const foreign = await cancel(sleeper.run_id, other);
      assert.equal(foreign.status, 404);
      assert.equal(foreign.body.type, PROBLEM_BASE + "not-found");
      assert.equal((await cancel("not-a-uuid")).status, 404);
      assert.equal((await cancel(crypto.randomUUID())).status, 404);
      assert.equal((await get(sleeper.run_id)).status, "running");

      // Running: the cancel is requested, the handler is aborted, the run
      // ends cancelled by its own attempt.
      const c2 = await cancel(sleeper.run_id);
      assert.equal(c2.status, 200);
      assert.ok(["running", "cancelled"].includes(c2.body.status), c2.body.status);
      assert.ok(c2.body.cancel_requested_at);
      const ended = await waitFor("the sleep run was cancelled", async () => {
        const r = await get(sleeper.run_id);
        return r.status === "cancelled" ? r : undefined;
      }, LONG);
      assert.equal(ended.attempts, 1);
      assert.equal(ended.cancel_requested_at, c2.body.cancel_requested_at);
      // The handler saw its signal aborted: sleep says so when it is cut short.
      assert.equal((ended.error as { message: string }).message, "sleep interrupted");
      const again = await cancel(sleeper.run_id);
      assert.equal(again.status, 200);
      assert.equal(again.body.status, "cancelled");

      // The slot is free again: the cancelled queued run is never started.
      const done = await admit({ workflow_ref: "echo", input: { n: 2 } });
      await waitFor("the echo run succeeded", async () => {
        return (await get(done.run_id)).status === "succeeded";
      }, LONG);
      assert.equal((await get(queued.run_id)).status, "cancelled");
      assert.equal((await get(queued.run_id)).started_at, null);

      // Finished: left as it is.
      const c3 = await cancel(done.run_id);
      assert.equal(c3.status, 409);
      assert.equal(c3.body.type, PROBLEM_BASE + "run-finished");
      assert.equal(c3.body.run_status, "succeeded");
      assert.equal((await get(done.run_id)).status, "succeeded");
      assert.equal((await get(done.run_id)).cancel_requested_at, null);

      // The events, through the outbox, on Kafka.
      await waitFor("the cancelled events on Kafka", () => {
        return eventsOf(queued.run_id).some((e) => e.type === "run.cancelled") &&
          eventsOf(sleeper.run_id).some((e) => e.type === "run.cancelled");
      }, LONG);
      assert.deepEqual(typesOf(eventsOf(queued.run_id)), ["1 run.admitted", "2 run.cancelled"]);
      assert.deepEqual(typesOf(eventsOf(sleeper.run_id)), [
        "1 run.admitted",
        "2 run.started",
        "3 run.cancelled",
      ]);
      const cancelled = eventsOf(sleeper.run_id).find((e) => e.type === "run.cancelled")!;
      assert.equal(cancelled.payload.attempt, 1, "written by attempt 1, the one that held the run");

      // The OpenAPI document names the route.
      const doc = await (await fetch(`${api.url}/openapi.json`)).json();
      assert.ok(doc.paths["/v1/runs/{run_id}/cancel"].post.responses["409"]);
      assert.equal(await api.metric("poimen_run_cancels_total", { status: "cancelled" }), 1);
      assert.equal(await api.metric("poimen_run_cancels_total", { status: "running" }), 1);
    } finally {
      await consumer.close();
      const procs = [api, worker, outbox];
      const statuses = await Promise.all(procs.map((p) => p.stop()));
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        assert.equal(
          s.code,
          0,
          `${procs[i].command} did not stop cleanly:\n${procs[i].logs().join("\n")}`,
        );
      }
    }
  },
});
