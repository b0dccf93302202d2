/**
 * Debounce over HTTP (`POST /v1/runs`, single and batch), in process on a
 * real Postgres: the request that makes a debounced run is a 201 with
 * `debounced: false`, one that joins it a 200 with `debounced: true` and no
 * replay header, a replay of a dispatch key a replay; a batch's items say
 * `debounced`; a `run_after` is a 422.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { z } from "zod";
import { freshDatabase } from "./support/db.ts";
import { silentLogger } from "../core/log.ts";
import { Admission } from "../admission/admit.ts";
import { StaticCatalog } from "../admission/catalog.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { loadConsoleAssets } from "../api/console/assets.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import type { RunBatchResult } from "../contracts/run_batch.ts";
import { builtinRegistry } from "../workflows/builtin.ts";
import { defineWorkflow } from "../workflows/define.ts";
import { PoimenClient } from "../client/http.ts";

const digest = defineWorkflow({
  name: "notify.digest",
  version: 1,
  input: z.object({ customer_id: z.string(), n: z.number() }),
  debounce: { key: "/customer_id", period: 60_000, maxWait: 600_000 },
  handler: () => Promise.resolve(null),
});

Deno.test("debounce over HTTP: created, joined, replayed and batched answers", async () => {
  const db = await freshDatabase();
  const sql = db.sql;
  const catalog = new StaticCatalog(builtinRegistry().register(digest).catalogVersions());
  const registry = new client.Registry();
  const app = createApp({
    sql,
    admission: new Admission(sql, catalog, { maxBatch: 64, maxConcurrent: 2 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(registry),
    log: silentLogger,
    bodyLimit: 1024 * 1024,
    consoleAssets: loadConsoleAssets(),
  });
  const tok = newToken();
  await insertTenant(sql, "deb-http");
  await insertToken(sql, await hashToken(tok), {
    kind: "tenant",
    tenant_id: "deb-http",
    name: "deb-http",
  });
  const post = (body: unknown) =>
    app.request("/v1/runs", {
      method: "POST",
      body: JSON.stringify(body),
      headers: { authorization: `Bearer ${tok}`, "content-type": "application/json" },
    });
  const item = (n: number, extra: object = {}) => ({
    workflow_ref: "notify.digest",
    input: { customer_id: "c1", n },
    ...extra,
  });
  try {
    const first = await post(item(1, { dispatch_key: "d1" }));
    assert.equal(first.status, 201);
    const made = await first.json();
    assert.equal(made.debounced, false);

    const second = await post(item(2));
    assert.equal(second.status, 200);
    assert.equal(second.headers.get("idempotent-replayed"), null);
    const joined = await second.json();
    assert.equal(joined.run_id, made.run_id);
    assert.equal(joined.debounced, true);
    assert.equal(Date.parse(joined.run_after) - Date.parse(joined.updated_at), 60_000);

    const replay = await post(item(3, { dispatch_key: "d1" }));
    assert.equal(replay.status, 200);
    assert.equal(replay.headers.get("idempotent-replayed"), "true");
    assert.equal(replay.headers.get("idempotent-body-mismatch"), "true");
    const replayed = await replay.json();
    assert.equal(replayed.run_id, made.run_id);
    assert.equal(replayed.debounced, undefined);

    const batch = await post([item(4), item(5), {
      ...item(6),
      input: { customer_id: "c2", n: 6 },
    }]);
    assert.equal(batch.status, 207);
    const { results } = await batch.json() as { results: RunBatchResult[] };
    assert.deepEqual(results.map((r) => [r.outcome, r.status, r.run?.debounced]), [
      ["debounced", 200, true],
      ["debounced", 200, true],
      ["created", 201, false],
    ]);
    assert.equal(results[0].run?.run_id, made.run_id);

    const got = await app.request(`/v1/runs/${made.run_id}`, {
      headers: { authorization: `Bearer ${tok}` },
    });
    assert.deepEqual((await got.json()).input, { customer_id: "c1", n: 5 });

    const refused = await post(item(7, { run_after: "2030-01-01T00:00:00Z" }));
    assert.equal(refused.status, 422);
    assert.equal((await refused.json()).errors[0].path, "run_after");

    const metrics = await registry.getSingleMetricAsString("poimen_admissions_total");
    assert.match(metrics, /outcome="debounced"\} 3/);

    // The typed client (a key of its own per call): made, then joined, never "created" twice.
    const poimen = new PoimenClient({
      url: "http://poimen.test",
      token: tok,
      fetch: (input, init) => Promise.resolve(app.request(input as string, init)),
    });
    const made2 = await poimen.start(digest, { customer_id: "c3", n: 1 });
    const joined2 = await poimen.start(digest, { customer_id: "c3", n: 2 });
    assert.deepEqual([made2.created, made2.replayed, made2.debounced], [true, false, false]);
    assert.deepEqual([joined2.created, joined2.replayed, joined2.debounced], [false, false, true]);
    assert.equal(joined2.runId, made2.runId);
  } finally {
    await db.drop();
  }
});
