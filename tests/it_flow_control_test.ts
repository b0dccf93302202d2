/**
 * Flow control end to end, with real processes: runs admitted over HTTP to
 * the API, executed by stock worker processes hosting a team's module
 * (`--workflows`). A workflow limited to one run per customer never runs two
 * of one customer at once across two workers, and every run finishes; on a
 * worker with one slot, a run admitted at priority 10 starts before the
 * queued runs at priority 0.
 */
import assert from "node:assert/strict";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";
import { ApiProcess, newToken, PoimenProcess } from "./support/processes.ts";

const TENANT = "acme";

/** A team's module of workflows, outside the checkout. */
async function workflowModule(source: string): Promise<{ path: string; remove(): Promise<void> }> {
  const dir = await Deno.makeTempDir({ prefix: "poimen-flow-" });
  const path = `${dir}/workflows.ts`;
  await Deno.writeTextFile(path, source);
  return { path, remove: () => Deno.remove(dir, { recursive: true }) };
}

// Each run reports when its handler started and ended, by the worker's clock
// (both workers run on this machine): the intervals of one customer must not
// overlap.
const MODULE = `
import { z } from "zod";
import { defineWorkflow } from "@poimen/poimen/workflow";
export const sync = defineWorkflow({
  name: "shop.sync",
  version: 1,
  input: z.object({ customer_id: z.string(), n: z.number(), ms: z.number() }),
  concurrency: { limit: 1, key: "/customer_id" },
  async handler(input) {
    const start = performance.timeOrigin + performance.now();
    await new Promise((r) => setTimeout(r, input.ms));
    return { start, end: performance.timeOrigin + performance.now() };
  },
});
export const slow = defineWorkflow({
  name: "shop.slow",
  version: 1,
  input: z.object({ n: z.number() }),
  async handler() {
    await new Promise((r) => setTimeout(r, 40));
    return null;
  },
});
export const all = [sync, slow];
`;

async function admit(api: ApiProcess, token: string, body: unknown): Promise<string> {
  const res = await fetch(`${api.url}/v1/runs`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const json = await res.json();
  assert.equal(res.status, 201, JSON.stringify(json));
  return json.run_id;
}

function workerEnv(db: TestDatabase, concurrency: number, id: string): Record<string, string> {
  return {
    DATABASE_URL: db.url,
    LOG_LEVEL: "warn",
    WORKER_POLL_MS: "50",
    WORKER_CONCURRENCY: String(concurrency),
    WORKER_ID: id,
  };
}

Deno.test("flow control: two workers with 16 slots each run 500 runs limited to one per customer_id across 20 customers — never two of one customer at once, all finish", async () => {
  const db = await freshDatabase();
  const mod = await workflowModule(MODULE);
  const token = await newToken(db.url, TENANT);
  const api = new ApiProcess({ DATABASE_URL: db.url, LOG_LEVEL: "warn" });
  const workers = ["w-a", "w-b"].map((id) =>
    new PoimenProcess("worker", workerEnv(db, 16, id), ["--workflows", mod.path])
  );
  let sampling = true;
  let worst = 0;
  let samples = 0;
  try {
    await api.ready();
    await waitFor("both workers registered shop.sync", async () => {
      for (const w of workers) {
        if (w.exited) throw new Error(`worker exited:\n${w.logs().join("\n")}`);
      }
      const [row] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from workflow_workers
         where 'shop.sync@1' = any (workflows) and expires_at > now()`;
      return row.n === 2;
    }, 30_000);
    const sampler = (async () => {
      while (sampling) {
        const [row] = await db.sql<{ worst: number | null }[]>`
          select max(n)::int as worst from (
            select count(*) as n from runs
             where tenant_id = ${TENANT} and status = 'running'
             group by concurrency_key) g`;
        worst = Math.max(worst, row.worst ?? 0);
        samples++;
      }
    })();
    const total = 500;
    for (let i = 0; i < total; i += 50) {
      await Promise.all(
        Array.from({ length: 50 }, (_, j) =>
          admit(api, token, {
            workflow_ref: "shop.sync",
            input: { customer_id: `c${(i + j) % 20}`, n: i + j, ms: 2 + ((i + j) * 7) % 9 },
          })),
      );
    }
    await waitFor(
      "all 500 runs succeeded",
      async () => {
        const [row] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = ${TENANT} and status = 'succeeded'`;
        return row.n === total;
      },
      120_000,
      200,
    );
    sampling = false;
    await sampler;
    assert.ok(samples > 10, `sampled ${samples} times`);
    assert.equal(worst <= 1, true, `${worst} runs of one customer were running at once`);

    const rows = await db.sql<
      { key: string; result: { start: number; end: number }; owner: string }[]
    >`
      select r.concurrency_key as key, r.result,
             (select e.payload ->> 'worker' from work_events e
               where e.tenant_id = r.tenant_id and e.run_id = r.run_id and e.type = 'run.started'
               order by e.seq desc limit 1) as owner
        from runs r where r.tenant_id = ${TENANT}`;
    assert.equal(rows.length, total);
    const byKey = new Map<string, { start: number; end: number }[]>();
    for (const r of rows) byKey.set(r.key, [...(byKey.get(r.key) ?? []), r.result]);
    assert.equal(byKey.size, 20);
    for (const [key, spans] of byKey) {
      spans.sort((a, b) => a.start - b.start);
      for (let i = 1; i < spans.length; i++) {
        assert.ok(
          spans[i].start >= spans[i - 1].end,
          `customer ${key}: a run started at ${spans[i].start} before the one before ended ` +
            `(${spans[i - 1].end})`,
        );
      }
    }
    const owners = new Set(rows.map((r) => r.owner));
    assert.deepEqual([...owners].sort(), ["w-a", "w-b"], "both workers ran runs");
    const [slots] = await db.sql<{ running: number; queued: number }[]>`
      select sum(running)::int as running, sum(queued)::int as queued from concurrency_slots
       where tenant_id = ${TENANT}`;
    assert.deepEqual({ ...slots }, { running: 0, queued: 0 });
  } finally {
    sampling = false;
    await Promise.all(workers.map((w) => w.stop()));
    await api.stop();
    await mod.remove();
    await db.drop();
  }
});

Deno.test("flow control: on a worker with one slot and 50 queued runs at priority 0, a run admitted at priority 10 is the next to start", async () => {
  const db = await freshDatabase();
  const mod = await workflowModule(MODULE);
  const token = await newToken(db.url, TENANT);
  const api = new ApiProcess({ DATABASE_URL: db.url, LOG_LEVEL: "warn" });
  let worker: PoimenProcess | undefined;
  try {
    await api.ready();
    worker = new PoimenProcess("worker", workerEnv(db, 1, "w-one"), ["--workflows", mod.path]);
    await waitFor("the worker registered shop.slow", async () => {
      if (worker!.exited) throw new Error(`worker exited:\n${worker!.logs().join("\n")}`);
      const [row] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from workflow_workers where 'shop.slow@1' = any (workflows)`;
      return row.n === 1;
    }, 30_000);
    for (let n = 0; n < 50; n++) {
      await admit(api, token, { workflow_ref: "shop.slow", input: { n } });
    }
    const started = async () => {
      const [row] = await db.sql<{ n: number }[]>`
        select count(*)::int as n from runs where tenant_id = ${TENANT} and started_at is not null`;
      return row.n;
    };
    await waitFor("the worker is busy with the queue", async () => (await started()) >= 2, 30_000);
    const urgent = await admit(api, token, {
      workflow_ref: "shop.slow",
      input: { n: 999 },
      priority: 10,
    });
    // Runs claimed before the urgent one committed may start before it; none after.
    const before = await started();
    const [run] = await waitFor("the urgent run started", async () => {
      const rows = await db.sql<{ started_at: Date | null }[]>`
        select started_at from runs where tenant_id = ${TENANT} and run_id = ${urgent}`;
      return rows[0]?.started_at ? rows : undefined;
    }, 30_000);
    const [rank] = await db.sql<{ n: number; queued: number }[]>`
      select count(*) filter (where started_at < ${run.started_at})::int as n,
             count(*) filter (where status = 'queued')::int as queued
        from runs where tenant_id = ${TENANT}`;
    assert.ok(
      rank.n <= before,
      `${rank.n} runs started before the urgent one; ${before} had started when it was admitted`,
    );
    assert.ok(rank.queued > 30, `${rank.queued} runs of priority 0 still queued behind it`);
    const res = await fetch(`${api.url}/v1/runs/${urgent}`, {
      headers: { authorization: `Bearer ${token}` },
    });
    assert.equal((await res.json()).priority, 10);
    // Out of range, or not an integer: a 422 naming the field, nothing admitted.
    for (const priority of [11, -11, 1.5, "high"]) {
      const bad = await fetch(`${api.url}/v1/runs`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ workflow_ref: "shop.slow", input: { n: 0 }, priority }),
      });
      const problem = await bad.json();
      assert.equal(bad.status, 422, JSON.stringify(problem));
      assert.deepEqual(problem.errors.map((e: { path: string }) => e.path), ["priority"]);
    }
    const [total] = await db.sql<{ n: number }[]>`select count(*)::int as n from runs`;
    assert.equal(total.n, 51);
  } finally {
    await worker?.stop();
    await api.stop();
    await mod.remove();
    await db.drop();
  }
});
