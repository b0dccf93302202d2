/**
 * Retention with real processes (API, worker, outbox) on a database of this
 * file's own and the shared development broker: the outbox purges finished
 * runs older than RUN_RETENTION_MS with their events and keeps young and
 * unfinished ones; and it refuses to start when RUN_RETENTION_MS is shorter
 * than a dispatch topic keeps messages (read from the broker) or than
 * TOPIC_RETENTION_MS, with one line naming the variable and exit code 2.
 *
 *   deno test -A tests/it_retention_test.ts
 */
import assert from "node:assert/strict";
import { startBroker } from "../dev/kafka.ts";
import { createAdmin } from "../kafka/admin.ts";
import { ensureTenantTopics } from "../kafka/topics.ts";
import { dispatchTopic } from "../contracts/topics.ts";
import { DAY, HOUR, SECOND } from "../core/time.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, PoimenProcess, runCommand, sampleValue } from "./support/processes.ts";
import { BROKER, KAFKA_TEST } from "./support/kafka.ts";

const LONG = 60 * SECOND;

await startBroker();

async function tenantWithTopics(
  db: TestDatabase,
  prefix: string,
  retentionMs: number,
): Promise<{ tenant: string; token: string }> {
  const tenant = `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
  const tok = await runCommand("token", [tenant], { DATABASE_URL: db.url });
  assert.equal(tok.code, 0, tok.stderr);
  const admin = createAdmin({ brokers: [BROKER], clientId: "poimen-test" });
  try {
    await ensureTenantTopics(admin, tenant, { partitions: 1, replicationFactor: 1, retentionMs });
  } finally {
    await admin.close();
  }
  return { tenant, token: tok.stdout.trim() };
}

async function counts(db: TestDatabase, ids: string[]) {
  const [r] = await db.sql<{ runs: number; events: number }[]>`
    select (select count(*) from runs where run_id = any(${ids}::uuid[]))::int as runs,
           (select count(*) from work_events where run_id = any(${ids}::uuid[]))::int as events`;
  return r;
}

Deno.test({
  name:
    "retention: the outbox purges finished runs past RUN_RETENTION_MS with their events; young and unfinished runs stay",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    const { token } = await tenantWithTopics(db, "rt", HOUR);
    const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER, LOG_LEVEL: "info" };
    const api = new ApiProcess({ ...env, LOG_LEVEL: "warn" });
    const worker = new PoimenProcess("worker", { ...env, WORKER_POLL_MS: "100" });
    let outbox: PoimenProcess | undefined;
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
    try {
      await api.ready();
      const finished = await Promise.all(
        Array.from({ length: 16 }, (_, i) => admit({ workflow_ref: "echo", input: { i } })),
      );
      const failed = await admit({ workflow_ref: "fail", input: { times: 100 } });
      await waitFor("every run finished", async () => {
        const [r] = await db.sql<{ n: number }[]>`
          select count(*)::int as n from runs where status in ('succeeded', 'failed')`;
        return r.n === 17;
      }, LONG);
      // Scheduled far ahead: queued, and as old as the oldest.
      const queued = await admit({
        workflow_ref: "echo",
        run_after: new Date(Date.now() + 300 * DAY).toISOString(),
      });
      const cancelled = await admit({
        workflow_ref: "echo",
        run_after: new Date(Date.now() + 300 * DAY).toISOString(),
      });
      const res = await fetch(`${api.url}/v1/runs/${cancelled}/cancel`, {
        method: "POST",
        headers,
      });
      assert.equal(res.status, 200);
      await res.body?.cancel();

      // 12 finished runs (one failed, one cancelled) finished 40 days ago;
      // 6 finished today; one queued run created 40 days ago.
      const old = [...finished.slice(0, 10), failed, cancelled];
      const young = finished.slice(10);
      await db.sql`update runs set finished_at = now() - interval '40 days',
                                   created_at = now() - interval '40 days'
                    where run_id = any(${old}::uuid[])`;
      await db.sql`update runs set created_at = now() - interval '40 days'
                    where run_id = ${queued}`;
      const before = await counts(db, old);
      assert.equal(before.runs, 12);

      outbox = new PoimenProcess("outbox", {
        ...env,
        OUTBOX_POLL_MS: "100",
        RUN_PURGE_INTERVAL_MS: "200",
        RUN_PURGE_BATCH_SIZE: "5",
      });
      await waitFor("the old finished runs purged", async () => {
        return (await counts(db, old)).runs === 0;
      }, LONG);
      assert.deepEqual(await counts(db, old), { runs: 0, events: 0 }, "their events went too");
      // The young ones are kept, with every event (shipped by now or not).
      assert.equal((await counts(db, young)).runs, 6);
      assert.equal((await counts(db, young)).events, 6 * 3);
      assert.deepEqual(await counts(db, [queued]), { runs: 1, events: 1 });
      const gone = await fetch(`${api.url}/v1/runs/${old[0]}`, { headers });
      assert.equal(gone.status, 404);
      await gone.body?.cancel();
      const metrics = await (await fetch(`${outbox.metricsUrl}/metrics`)).text();
      assert.equal(sampleValue(metrics, "poimen_outbox_runs_purged_total", {}), 12);
      assert.equal(sampleValue(metrics, "poimen_outbox_run_purge_held", {}), 0);
      assert.ok(
        outbox.logs().some((l) => l.includes("purged finished runs")),
        outbox.logs().join("\n"),
      );
    } finally {
      const procs = [api, worker, ...outbox ? [outbox] : []];
      const statuses = await Promise.all(procs.map((p) => p.stop()));
      await db.drop();
      for (const [i, s] of statuses.entries()) {
        const p = procs[i];
        assert.equal(s.code, 0, `${p.command} did not stop cleanly:\n${p.logs().join("\n")}`);
      }
    }
  },
});

/** Starts the outbox with `env` and waits for it to exit on its own. */
async function refusedOutbox(env: Record<string, string>): Promise<string> {
  const outbox = new PoimenProcess("outbox", { LOG_LEVEL: "info", ...env });
  try {
    await waitFor("the outbox exited", () => outbox.exited, LONG);
    const status = await outbox.status();
    assert.equal(status.code, 2, outbox.logs().join("\n"));
    const lines = outbox.logs().filter((l) => l.trim() !== "");
    const refusal = lines.filter((l) => l.startsWith("config:"));
    assert.equal(refusal.length, 1, lines.join("\n"));
    return refusal[0];
  } finally {
    await outbox.stop();
  }
}

Deno.test({
  name:
    "retention: a purge window shorter than a dispatch topic keeps messages is refused at start-up",
  ...KAFKA_TEST,
  async fn() {
    const db = await freshDatabase();
    try {
      // Kept 10 days, plus a segment's life (7 days by default) before deletion.
      const { tenant } = await tenantWithTopics(db, "rtr", 10 * DAY);
      const env = { DATABASE_URL: db.url, KAFKA_BROKERS: BROKER, TOPIC_RETENTION_MS: String(DAY) };
      const line = await refusedOutbox({ ...env, RUN_RETENTION_MS: String(12 * DAY) });
      assert.match(line, /^config: RUN_RETENTION_MS is invalid: /);
      assert.ok(line.includes(dispatchTopic(tenant)), line);
      assert.ok(line.includes("retention.ms 10d"), line);

      // What new tenants' topics get counts too, before any topic is read.
      const configured = await refusedOutbox({
        ...env,
        TOPIC_RETENTION_MS: String(7 * DAY),
        RUN_RETENTION_MS: String(DAY),
      });
      assert.match(configured, /^config: RUN_RETENTION_MS is invalid: .*TOPIC_RETENTION_MS/);

      // Long enough: it starts, and is ready.
      const outbox = new PoimenProcess("outbox", {
        ...env,
        LOG_LEVEL: "warn",
        RUN_RETENTION_MS: String(30 * DAY),
      });
      try {
        await waitFor("the outbox ready", async () => {
          if (outbox.exited) throw new Error(outbox.logs().join("\n"));
          const res = await fetch(`${outbox.metricsUrl}/readyz`);
          await res.body?.cancel();
          return res.status === 200;
        }, LONG);
      } finally {
        assert.equal((await outbox.stop()).code, 0, outbox.logs().join("\n"));
      }
      // Off: nothing to check, it starts whatever the window.
      const off = new PoimenProcess("outbox", {
        ...env,
        LOG_LEVEL: "warn",
        RUN_RETENTION_MS: String(HOUR),
        RUN_PURGE_INTERVAL_MS: "0",
      });
      try {
        await waitFor("the outbox with the run purge off ready", async () => {
          if (off.exited) throw new Error(off.logs().join("\n"));
          const res = await fetch(`${off.metricsUrl}/readyz`);
          await res.body?.cancel();
          return res.status === 200;
        }, LONG);
      } finally {
        assert.equal((await off.stop()).code, 0, off.logs().join("\n"));
      }
    } finally {
      await db.drop();
    }
  },
});
