/**
 * The worker's scrape-time queue gauges: `poimen_runs_waiting_for_worker`
 * has one series per workflow version no live worker hosts, read with the
 * other queue gauges in one collection, and a version that stops waiting
 * disappears; queueStats finds those versions in Postgres. The gauges of
 * limited workflows (`poimen_runs_waiting_on_concurrency`,
 * `poimen_runs_running_limited`) follow the groups' counts.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { insertRuns, type NewRun } from "../db/admission.ts";
import { registerVersions, renewWorker } from "../db/catalog.ts";
import { type QueueStats, queueStats } from "../db/queue_stats.ts";
import { createWorkerMetrics } from "../worker/metrics.ts";
import { completeRun } from "../db/attempt_end.ts";
import { claimLimitedRuns } from "../db/claims.ts";
import { Admission } from "../admission/admit.ts";
import { catalogOf, limitedRegistry } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

const WAITING = /^poimen_runs_waiting_for_worker\{workflow="([^"]+)"\} (\d+)$/gm;

function waitingSeries(text: string): Record<string, number> {
  return Object.fromEntries([...text.matchAll(WAITING)].map((m) => [m[1], Number(m[2])]));
}

Deno.test("worker metrics: poimen_runs_waiting_for_worker follows each scrape, one read per scrape", async () => {
  const answers: (QueueStats | Error)[] = [
    {
      byStatus: { queued: 7, running: 1, waiting: 0 },
      capped: { queued: false, running: false, waiting: false },
      waitingByReason: { sleep: 0, signal: 0, children: 0 },
      oldestQueuedAgeSeconds: 3,
      waitingForWorker: [{ workflow: "a@1", runs: 5 }, { workflow: "b@2", runs: 2 }],
      limited: [],
    },
    {
      byStatus: { queued: 2, running: 0, waiting: 0 },
      capped: { queued: false, running: false, waiting: false },
      waitingByReason: { sleep: 0, signal: 0, children: 0 },
      oldestQueuedAgeSeconds: 0,
      waitingForWorker: [{ workflow: "b@2", runs: 2 }],
      limited: [],
    },
    new Error("postgres went away"),
    {
      byStatus: { queued: 0, running: 0, waiting: 0 },
      capped: { queued: false, running: false, waiting: false },
      waitingByReason: { sleep: 0, signal: 0, children: 0 },
      oldestQueuedAgeSeconds: 0,
      waitingForWorker: [],
      limited: [],
    },
  ];
  let reads = 0;
  const registry = new client.Registry();
  createWorkerMetrics(
    registry,
    () => {
      const a = answers[reads++];
      return a instanceof Error ? Promise.reject(a) : Promise.resolve(a);
    },
    () => 0,
    silentLogger,
  );

  const first = await registry.metrics();
  assert.equal(reads, 1, "the queue gauges share one read");
  assert.deepEqual(waitingSeries(first), { "a@1": 5, "b@2": 2 });
  assert.match(first, /^poimen_runs\{status="queued"\} 7$/m);
  assert.match(first, /^# TYPE poimen_runs_waiting_for_worker gauge$/m);

  // Let the shared read be forgotten (it is, on the next macrotask).
  await new Promise((r) => setTimeout(r, 0));
  const second = await registry.metrics();
  assert.equal(reads, 2);
  assert.deepEqual(waitingSeries(second), { "b@2": 2 }, "a@1 got a worker: gone");

  await new Promise((r) => setTimeout(r, 0));
  const failed = await registry.metrics();
  assert.equal(reads, 3);
  assert.deepEqual(waitingSeries(failed), { "b@2": 2 }, "a failed read keeps the last answer");

  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(waitingSeries(await registry.metrics()), {});
  assert.equal(reads, 4);
});

Deno.test("worker metrics: queueStats counts the queued runs of each version no live worker hosts", async () => {
  const db = await freshDatabase();
  const sql = db.sql;
  try {
    const schema = { type: "object" };
    await registerVersions(sql, [
      { name: "hosted", version: 1, input_schema: schema, max_attempts: null },
      { name: "orphan", version: 1, input_schema: schema, max_attempts: null },
      { name: "orphan", version: 2, input_schema: schema, max_attempts: null },
      { name: "idle", version: 1, input_schema: schema, max_attempts: null },
    ], "test");
    await renewWorker(sql, "w1", ["hosted@1", "orphan@2"], 60_000);
    await renewWorker(sql, "gone", ["orphan@1"], 60_000);
    await sql`update workflow_workers set expires_at = now() - interval '1 second'
               where worker_id = 'gone'`;
    for (const t of ["acme", "globex"]) await insertTenant(sql, t);
    const run = (tenant: string, name: string, version: number, i: number): NewRun => ({
      tenant_id: tenant,
      run_id: crypto.randomUUID(),
      workflow_ref: `${name}@${version}`,
      workflow_name: name,
      workflow_version: version,
      input: { i },
      goal_id: null,
      dispatch_key: null,
      source: "test",
      max_attempts: 3,
      // Scheduled or not, a run no worker hosts waits for one.
      run_after: i % 2 ? new Date(Date.now() + 3600_000).toISOString() : null,
    });
    await insertRuns(sql, [
      ...[0, 1, 2].map((i) => run("acme", "orphan", 1, i)),
      ...[3, 4].map((i) => run("globex", "orphan", 1, i)),
      ...[0, 1].map((i) => run("acme", "orphan", 2, i)),
      ...[0, 1].map((i) => run("acme", "hosted", 1, i)),
    ]);
    // A finished run of an unhosted version is not waiting.
    await sql`update runs set status = 'cancelled', finished_at = now()
               where run_id = (select run_id from runs where workflow_name = 'orphan'
                                  and workflow_version = 1 and tenant_id = 'globex' limit 1)`;
    const s = await queueStats(sql);
    assert.equal(s.byStatus.queued, 8);
    assert.deepEqual([...s.waitingForWorker], [{ workflow: "orphan@1", runs: 4 }]);

    await renewWorker(sql, "w2", ["orphan@1"], 60_000);
    assert.deepEqual([...(await queueStats(sql)).waitingForWorker], []);
  } finally {
    await db.drop();
  }
});

const LIMITED = /^poimen_runs_(waiting_on_concurrency|running_limited)\{([^}]*)\} (\d+)$/gm;

/** `name{tenant,workflow}` → value, of the two gauges of limited workflows. */
function limitedSeries(text: string): Record<string, number> {
  return Object.fromEntries(
    [...text.matchAll(LIMITED)].map((m) => {
      const labels = Object.fromEntries(
        [...m[2].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]),
      );
      return [`${m[1]}{${labels.tenant},${labels.workflow}}`, Number(m[3])];
    }),
  );
}

Deno.test("worker metrics: the runs a full concurrency group holds back and the limited runs running, per tenant and workflow, from Postgres", async () => {
  const db = await freshDatabase();
  const sql = db.sql;
  try {
    const registry = limitedRegistry();
    for (const t of ["acme", "globex"]) await insertTenant(sql, t);
    const admission = new Admission(sql, catalogOf(registry), { maxBatch: 8, maxConcurrent: 1 });
    const admit = (tenantId: string, customer_id: string, n: number) =>
      admission.admit({ workflow_ref: "shop.sync", input: { customer_id, n } }, {
        tenantId,
        source: "test",
        entry: "http",
      });
    // acme: customer a has 4 runs (1 starts, 3 wait), b has 1 (it starts:
    // its group has room after); globex: c has 2 (1 starts, 1 waits).
    for (let n = 0; n < 4; n++) await admit("acme", "a", n);
    await admit("acme", "b", 0);
    for (let n = 0; n < 2; n++) await admit("globex", "c", n);

    const registryOf = new client.Registry();
    createWorkerMetrics(registryOf, () => queueStats(sql), () => 0, silentLogger);
    const scrape = async () => {
      // Let the last shared read be forgotten (it is, on the next macrotask).
      await new Promise((r) => setTimeout(r, 0));
      return limitedSeries(await registryOf.metrics());
    };
    // Nothing running yet: no group is full, nothing waits on a limit.
    assert.deepEqual(await scrape(), {});

    const claimed = await claimLimitedRuns(
      sql,
      "w1",
      16,
      30_000,
      registry.hostedByLimit().limited,
    );
    assert.equal(claimed.length, 3, "one per customer");
    assert.deepEqual(await scrape(), {
      "waiting_on_concurrency{acme,shop.sync}": 3,
      "running_limited{acme,shop.sync}": 2,
      "waiting_on_concurrency{globex,shop.sync}": 1,
      "running_limited{globex,shop.sync}": 1,
    });

    // globex's run ends: its group has room, its queued run no longer waits
    // on the limit (it waits for a claim).
    const c = claimed.find((r) => r.tenant_id === "globex")!;
    assert.ok(await completeRun(sql, "globex", c.run_id, "w1", c.attempts, null));
    assert.deepEqual(await scrape(), {
      "waiting_on_concurrency{acme,shop.sync}": 3,
      "running_limited{acme,shop.sync}": 2,
    });
  } finally {
    await db.drop();
  }
});

Deno.test("worker metrics: with more queued runs than the cap, queueStats and the gauge report the cap and the overflow flag", async () => {
  const db = await freshDatabase();
  const sql = db.sql;
  try {
    // Two tenants, so the cap stops the count across tenants, not in one.
    for (const t of ["acme", "globex"]) await insertTenant(sql, t);
    const runs = (tenant: string, n: number): NewRun[] =>
      Array.from({ length: n }, (_, i) => ({
        tenant_id: tenant,
        run_id: crypto.randomUUID(),
        workflow_ref: "echo",
        workflow_name: "echo",
        workflow_version: 1,
        input: { i },
        goal_id: null,
        dispatch_key: null,
        source: "test",
        max_attempts: 3,
        run_after: null,
      }));
    await insertRuns(sql, [...runs("acme", 4), ...runs("globex", 4)]);
    const under = await queueStats(sql, 20);
    assert.deepEqual(under.byStatus, { queued: 8, running: 0, waiting: 0 });
    assert.deepEqual(under.capped, { queued: false, running: false, waiting: false });
    const over = await queueStats(sql, 5);
    assert.deepEqual(over.byStatus, { queued: 5, running: 0, waiting: 0 });
    assert.deepEqual(over.capped, { queued: true, running: false, waiting: false });

    const registry = new client.Registry();
    createWorkerMetrics(registry, () => queueStats(sql, 5), () => 0, silentLogger);
    const text = await registry.metrics();
    assert.match(text, /^poimen_runs\{status="queued"\} 5$/m);
    assert.match(text, /^poimen_runs_at_cap\{status="queued"\} 1$/m);
    assert.match(text, /^poimen_runs_at_cap\{status="running"\} 0$/m);
  } finally {
    await db.drop();
  }
});

Deno.test("worker metrics: a worker that is not the leader reports no queue-wide gauges and reads nothing for them", async () => {
  let reads = 0;
  let leader = false;
  const registry = new client.Registry();
  createWorkerMetrics(
    registry,
    () => {
      if (!leader) return Promise.resolve(null);
      reads++;
      return Promise.resolve({
        byStatus: { queued: 3, running: 1, waiting: 0 },
        capped: { queued: false, running: false, waiting: false },
        waitingByReason: { sleep: 0, signal: 0, children: 0 },
        oldestQueuedAgeSeconds: 2,
        waitingForWorker: [{ workflow: "a@1", runs: 3 }],
        limited: [],
      });
    },
    () => 0,
    silentLogger,
    () => leader,
  );
  const follower = await registry.metrics();
  assert.equal(reads, 0);
  assert.match(follower, /^poimen_worker_leader 0$/m);
  assert.doesNotMatch(follower, /^poimen_runs\{/m);
  assert.deepEqual(waitingSeries(follower), {});

  leader = true;
  await new Promise((r) => setTimeout(r, 0));
  const led = await registry.metrics();
  assert.equal(reads, 1);
  assert.match(led, /^poimen_worker_leader 1$/m);
  assert.match(led, /^poimen_runs\{status="queued"\} 3$/m);
  assert.deepEqual(waitingSeries(led), { "a@1": 3 });

  // Leadership lost: its last answer is not repeated.
  leader = false;
  await new Promise((r) => setTimeout(r, 0));
  const after = await registry.metrics();
  assert.doesNotMatch(after, /^poimen_runs\{/m);
  assert.deepEqual(waitingSeries(after), {});
});
