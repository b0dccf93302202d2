/**
 * Batch admission (`POST /v1/runs` with a JSON array), in process on a real
 * Postgres with the tenant quota gate: a batch of 1,000 with duplicates,
 * replays, invalid items of every kind answers each item in order, exactly
 * as the same requests sent one at a time answer, and writes exactly what
 * they write; a tenant over its quota is refused item by item, in order; a
 * batch costs few flushes; the batch-wide refusals write nothing.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { silentLogger } from "../core/log.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { Admission } from "../admission/admit.ts";
import { QuotaGate } from "../admission/quota.ts";
import { catalogOf } from "./support/catalog.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import { setTenantQuota } from "../db/tenant_quotas.ts";
import type { RunBatchResult } from "../contracts/run_batch.ts";
import type { Sql } from "../db/pool.ts";

let db: TestDatabase;
let sql: Sql;
let app: ReturnType<typeof createApp>;
let flushes = 0;

async function token(name: string): Promise<string> {
  const t = newToken();
  await insertTenant(sql, name);
  await insertToken(sql, await hashToken(t), { kind: "tenant", tenant_id: name, name });
  return t;
}

function post(tok: string, body: unknown, headers: Record<string, string> = {}) {
  return app.request("/v1/runs", {
    method: "POST",
    body: typeof body === "string" ? body : JSON.stringify(body),
    headers: { authorization: `Bearer ${tok}`, "content-type": "application/json", ...headers },
  });
}

/** A single admission's answer as a batch item's result would put it. */
async function single(tok: string, item: unknown): Promise<RunBatchResult> {
  // Stringified here: `post` sends a string as it is.
  const r = await post(tok, JSON.stringify(item));
  const body = await r.json();
  if (r.status === 201) return { outcome: "created", status: 201, run: body };
  if (r.status === 200) {
    const result: RunBatchResult = { outcome: "replayed", status: 200, run: body };
    if (r.headers.get("idempotent-body-mismatch") === "true") result.body_mismatch = true;
    return result;
  }
  return { outcome: "problem", status: r.status, problem: body };
}

/** What must be equal between a batch's result and the single answer: no ids, no times. */
function comparable(r: RunBatchResult) {
  const run = r.run &&
    {
      workflow_ref: r.run.workflow_ref,
      workflow_version: r.run.workflow_version,
      dispatch_key: r.run.dispatch_key,
      goal_id: r.run.goal_id,
      priority: r.run.priority,
      status: r.run.status,
      source: r.run.source.replace(/^http:.*/, "http"),
    };
  const problem = r.problem &&
    { type: r.problem.type, status: r.problem.status, retryable: r.problem.retryable };
  return { outcome: r.outcome, status: r.status, body_mismatch: r.body_mismatch, run, problem };
}

/** The 1,000 items: every tenth a kind of invalid, duplicates, replays, keyless runs. */
function items(): unknown[] {
  const out: unknown[] = [];
  const invalid = [
    { workflow_ref: "echo", nope: 1 },
    { workflow_ref: "nowhere", input: 1 },
    { workflow_ref: "sleep", input: { ms: "soon" } },
    { workflow_ref: "echo", dispatch_key: "kafka:t/0/1" },
    { workflow_ref: "echo", priority: 99 },
    42,
    null,
    "echo",
  ];
  for (let i = 0; i < 1000; i++) {
    const kind = i % 10;
    if (kind === 0) out.push(invalid[(i / 10) % invalid.length]);
    // Same key as the item before: the first is created, this one replays it.
    else if (kind === 2) {
      out.push({ workflow_ref: "echo", input: { i }, dispatch_key: `k-${i - 1}` });
    } // A key admitted before the batch: a replay, half of them with another body.
    else if (kind === 3) {
      out.push({
        workflow_ref: "echo",
        input: { pre: i, other: i % 20 === 3 },
        dispatch_key: `pre-${i}`,
      });
    } else if (kind === 4) {
      out.push({ workflow_ref: "echo", input: { i }, priority: (i % 21) - 10 });
    } else {out.push({
        workflow_ref: "echo",
        input: { i },
        dispatch_key: `k-${i}`,
        goal_id: `g-${i % 7}`,
      });}
  }
  return out;
}

async function preAdmit(tok: string): Promise<void> {
  for (let i = 3; i < 1000; i += 10) {
    const r = await post(tok, {
      workflow_ref: "echo",
      input: { pre: i, other: false },
      dispatch_key: `pre-${i}`,
    });
    assert.equal(r.status, 201);
  }
}

/** A tenant's runs, without ids and times, in a stable order. */
async function runsOf(tenant: string) {
  return await sql`select dispatch_key, input, goal_id, priority, workflow_ref, status,
                          (select count(*)::int from work_events e where e.run_id = r.run_id) as events
                     from runs r where tenant_id = ${tenant}
                    order by dispatch_key nulls last, input::text`;
}

Deno.test("batch admission: each item answered in order, as single admissions, writing what they write", async (t) => {
  db = await freshDatabase();
  sql = db.sql;
  const admission = new Admission(sql, catalogOf(), { maxBatch: 64, maxConcurrent: 4 }, {
    onFlush: () => flushes++,
  });
  const quota = new QuotaGate(sql, { refreshMs: 3_600_000, log: silentLogger });
  app = createApp({
    sql,
    admission,
    quota,
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 1024 * 1024,
    consoleAssets: loadConsoleAssets(),
  });
  try {
    const batched = await token("batched");
    const singly = await token("singly");
    const relay = newToken();
    await insertToken(sql, await hashToken(relay), {
      kind: "service",
      tenant_id: null,
      name: "relay",
    });

    await t.step("a batch of 1,000 answers as 1,000 single requests, in order", async () => {
      await preAdmit(batched);
      await preAdmit(singly);
      const list = items();
      flushes = 0;
      const r = await post(batched, list);
      assert.equal(r.status, 207);
      const { results } = await r.json() as { results: RunBatchResult[] };
      const batchFlushes = flushes;
      assert.equal(results.length, 1000);
      const expected: RunBatchResult[] = [];
      for (const item of list) expected.push(await single(singly, item));
      for (let i = 0; i < 1000; i++) {
        assert.deepEqual(comparable(results[i]), comparable(expected[i]), `item ${i}`);
      }
      // The shapes themselves, a few by hand.
      assert.equal(results[0].problem?.type, PROBLEM_BASE + "validation");
      assert.equal(results[10].problem?.type, PROBLEM_BASE + "unknown-workflow");
      assert.equal(results[1].outcome, "created");
      assert.equal(results[2].outcome, "replayed");
      assert.equal(
        results[2].run?.run_id,
        results[1].run?.run_id,
        "the duplicate is the first's run",
      );
      assert.equal(results[3].outcome, "replayed");
      assert.equal(results[3].body_mismatch, true);
      assert.equal(results[13].body_mismatch, undefined);
      const created = results.filter((x) => x.outcome === "created").length;
      assert.equal(created, 700);
      assert.ok(batchFlushes <= 40, `a batch of 1,000 took ${batchFlushes} flushes`);
      assert.deepEqual(await runsOf("batched"), await runsOf("singly"));
    });

    await t.step("a tenant over its max_queued is refused item by item, in order", async () => {
      const capped = await token("capped");
      const cappedSingly = await token("capped_singly");
      await setTenantQuota(sql, "capped", { max_queued: 10 });
      await setTenantQuota(sql, "capped_singly", { max_queued: 10 });
      await quota.refresh();
      const list = Array.from({ length: 30 }, (_, i) => ({
        workflow_ref: "echo",
        input: { i },
        dispatch_key: i % 3 === 0 ? `q-${i}` : undefined,
      }));
      const r = await post(capped, list);
      assert.equal(r.status, 207);
      const { results } = await r.json() as { results: RunBatchResult[] };
      const expected: RunBatchResult[] = [];
      for (const item of list) expected.push(await single(cappedSingly, item));
      assert.deepEqual(results.map(comparable), expected.map(comparable));
      assert.deepEqual(results.map((x) => x.status), [
        ...Array(10).fill(201),
        ...Array(20).fill(429),
      ]);
      assert.equal(results[29].problem?.type, PROBLEM_BASE + "queue-full");
      assert.equal(results[29].problem?.retryable, true);
      assert.deepEqual(await runsOf("capped"), await runsOf("capped_singly"));
    });

    await t.step(
      "a service token's Poimen-Sources gives each item its source and trace",
      async () => {
        const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        const at = (o: number) => `kafka:poimen.batched.dispatch/2/${o}`;
        const list = [
          // A keyless message as the relay sends it: keyed by its own place.
          { workflow_ref: "echo", input: { n: 1 }, dispatch_key: at(10) },
          { workflow_ref: "echo", input: { n: 2 }, dispatch_key: "own-key-src" },
          // Another item's place is not this one's key.
          { workflow_ref: "echo", input: { n: 3 }, dispatch_key: at(10) + "0" },
        ];
        const sources = `${at(10)} ${traceparent},${at(11)},${at(12)}`;
        const r = await post(relay, list, {
          "poimen-tenant": "batched",
          "poimen-sources": sources,
        });
        assert.equal(r.status, 207);
        const { results } = await r.json() as { results: RunBatchResult[] };
        assert.deepEqual(results.map((x) => x.status), [201, 201, 422]);
        assert.equal(results[2].problem?.type, PROBLEM_BASE + "validation");
        const rows = await sql`select dispatch_key, source, traceparent from runs
                              where tenant_id = 'batched' and source like 'kafka:%'
                              order by source`;
        assert.deepEqual(rows.map((x) => [x.dispatch_key, x.source]), [
          [at(10), at(10)],
          ["own-key-src", at(11)],
        ]);
        assert.equal(rows[0].traceparent, traceparent, "the item's own trace is its run's");
        assert.equal(rows[1].traceparent, null);
      },
    );

    await t.step("a tenant token's Poimen-Sources is not a source", async () => {
      const r = await post(batched, [{ workflow_ref: "echo", dispatch_key: "tenant-src" }], {
        "poimen-sources": "kafka:poimen.batched.dispatch/0/1",
      });
      assert.equal(r.status, 207);
      const [row] = await sql`select source from runs where dispatch_key = 'tenant-src'`;
      assert.equal(row.source, "http:batched");
    });

    await t.step("batch-wide refusals write nothing", async () => {
      const [before] = await sql`select count(*)::int as n from runs`;
      const cases: [unknown, Record<string, string>, number, string, boolean?][] = [
        [[], {}, 422, "validation"],
        [Array(1001).fill({ workflow_ref: "echo" }), {}, 422, "validation"],
        [[{ workflow_ref: "echo" }], { "idempotency-key": "abc" }, 422, "validation"],
        // As the relay sends a message whose value is an array: one source, many runs.
        [[{ workflow_ref: "echo" }], { "poimen-source": "kafka:t/0/1" }, 422, "validation", true],
        // Poimen-Sources must name every item, each entry well-formed.
        [
          [{ workflow_ref: "echo" }, { workflow_ref: "echo" }],
          { "poimen-sources": "kafka:t/0/1" },
          422,
          "validation",
          true,
        ],
        [
          [{ workflow_ref: "echo" }],
          { "poimen-sources": "kafka:t/0/1 tp extra" },
          422,
          "validation",
          true,
        ],
        [
          JSON.stringify(Array(600).fill({ workflow_ref: "echo", input: "x".repeat(2000) })),
          {},
          413,
          "body-too-large",
        ],
      ];
      for (const [body, headers, status, code, asRelay] of cases) {
        const r = asRelay
          ? await post(relay, body, { ...headers, "poimen-tenant": "batched" })
          : await post(batched, body, headers);
        const problem = await r.json();
        assert.equal(r.status, status, JSON.stringify(problem).slice(0, 300));
        assert.equal(problem.type, PROBLEM_BASE + code);
      }
      const [after] = await sql`select count(*)::int as n from runs`;
      assert.equal(after.n, before.n);
    });
  } finally {
    await quota.stop();
    await db.drop();
  }
});
