/**
 * `Idempotency-Key` on `POST /v1/runs`, in process on a real Postgres: the
 * header is the dispatch key, bare or as an sf-string, with the body
 * field's rules and replays; a different key in the body, or a bad value,
 * is a 422 naming the header and writes nothing.
 */
import assert from "node:assert/strict";
import client from "prom-client";
import { freshDatabase } from "./support/db.ts";
import { catalogOf } from "./support/catalog.ts";
import { silentLogger } from "../core/log.ts";
import { PROBLEM_BASE } from "../core/errors.ts";
import { Admission } from "../admission/admit.ts";
import { createApp } from "../api/app.ts";
import { Authenticator } from "../api/auth.ts";
import { hashToken, newToken } from "../contracts/tokens.ts";
import { createApiMetrics } from "../api/metrics.ts";
import { insertTenant, insertToken } from "../db/auth.ts";
import type { Sql } from "../db/pool.ts";

function makeApp(sql: Sql) {
  return createApp({
    sql,
    admission: new Admission(sql, catalogOf(), { maxBatch: 64, maxConcurrent: 4 }),
    auth: new Authenticator(sql, 30_000),
    metrics: createApiMetrics(new client.Registry()),
    log: silentLogger,
    bodyLimit: 4096,
    consoleAssets: { appJs: "", css: "" },
  });
}

Deno.test("api_idempotency_key: Idempotency-Key is the dispatch key, replays, and is refused when it disagrees", async (t) => {
  const db = await freshDatabase();
  const sql = db.sql;
  try {
    const app = makeApp(sql);
    const token = newToken();
    await insertTenant(sql, "acme");
    await insertToken(sql, await hashToken(token), {
      kind: "tenant",
      tenant_id: "acme",
      name: "a",
    });

    const admit = (body: Record<string, unknown>, headers: Record<string, string> = {}, to = app) =>
      to.request("/v1/runs", {
        method: "POST",
        body: JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, ...body }),
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          ...headers,
        },
      });
    const runsWithKey = async (key: string) =>
      (await sql`select count(*)::int as n from runs where dispatch_key = ${key}`)[0].n;
    const allRuns = async () => (await sql`select count(*)::int as n from runs`)[0].n;

    /**
     * A 422 whose errors are all at `header.Idempotency-Key`, and no new row
     * (counted before `send` is called: a request under way could write).
     */
    const refused = async (send: () => Response | Promise<Response>, message: RegExp) => {
      const before = await allRuns();
      const r = await send();
      const body = await r.json();
      assert.equal(r.status, 422, JSON.stringify(body));
      assert.equal(body.type, PROBLEM_BASE + "validation");
      const errors = body.errors as { path: string; message: string }[];
      assert.ok(errors.length > 0);
      assert.ok(errors.every((e) => e.path === "header.Idempotency-Key"), JSON.stringify(errors));
      assert.ok(errors.some((e) => message.test(e.message)), JSON.stringify(errors));
      assert.equal(await allRuns(), before);
    };

    await t.step("the header alone creates a run, then replays it", async () => {
      const first = await admit({}, { "Idempotency-Key": "order-1" });
      assert.equal(first.status, 201);
      const run = await first.json();
      assert.equal(run.dispatch_key, "order-1");
      assert.equal(first.headers.get("location"), `/v1/runs/${run.run_id}`);
      assert.equal(first.headers.get("idempotent-replayed"), null);

      const again = await admit({}, { "Idempotency-Key": "order-1" });
      assert.equal(again.status, 200);
      assert.equal((await again.json()).run_id, run.run_id);
      assert.equal(again.headers.get("idempotent-replayed"), "true");
      assert.equal(again.headers.get("idempotent-body-mismatch"), null);

      // A different body under the same key: the first run, flagged.
      const other = await admit({ input: { n: 2 } }, { "Idempotency-Key": "order-1" });
      assert.equal(other.status, 200);
      assert.equal((await other.json()).run_id, run.run_id);
      assert.equal(other.headers.get("idempotent-body-mismatch"), "true");

      // The body's field and the header are one key: either replays the other.
      const byBody = await admit({ dispatch_key: "order-1" });
      assert.equal(byBody.status, 200);
      assert.equal((await byBody.json()).run_id, run.run_id);
      assert.equal(await runsWithKey("order-1"), 1);
    });

    await t.step('an sf-string is its content: "order-2" is order-2', async () => {
      const first = await admit({}, { "Idempotency-Key": '"order-2"' });
      assert.equal(first.status, 201);
      const run = await first.json();
      assert.equal(run.dispatch_key, "order-2");
      const bare = await admit({}, { "Idempotency-Key": "order-2" });
      assert.equal(bare.status, 200);
      assert.equal((await bare.json()).run_id, run.run_id);
      // Escapes: "a\"b\\c" is a"b\c.
      const escaped = await admit({}, { "Idempotency-Key": '"a\\"b\\\\c"' });
      assert.equal(escaped.status, 201);
      assert.equal((await escaped.json()).dispatch_key, 'a"b\\c');
    });

    await t.step("the header with the same key in the body is fine", async () => {
      const first = await admit({ dispatch_key: "order-3" }, { "Idempotency-Key": "order-3" });
      assert.equal(first.status, 201);
      const run = await first.json();
      const quoted = await admit({ dispatch_key: "order-3" }, { "Idempotency-Key": '"order-3"' });
      assert.equal(quoted.status, 200);
      assert.equal((await quoted.json()).run_id, run.run_id);
      // A null dispatch_key is no key: the header's applies.
      const nulled = await admit({ dispatch_key: null }, { "Idempotency-Key": "order-3" });
      assert.equal(nulled.status, 200);
      assert.equal((await nulled.json()).run_id, run.run_id);
      assert.equal(await runsWithKey("order-3"), 1);
    });

    await t.step("the header with a different key in the body: 422 naming the header", async () => {
      await refused(
        () => admit({ dispatch_key: "order-4" }, { "Idempotency-Key": "order-5" }),
        /differs from the body's dispatch_key/,
      );
      // Even when the body's key already has a run: neither is replayed.
      await refused(
        () => admit({ dispatch_key: "order-1" }, { "Idempotency-Key": "order-6" }),
        /differs/,
      );
      assert.equal(await runsWithKey("order-4") + await runsWithKey("order-5"), 0);
    });

    await t.step("a bad header value: 422 naming the header", async () => {
      const bad: [string, RegExp][] = [
        ["", /1 char|Too small/i],
        ['""', /Too small/i],
        ['"order-7', /sf-string/],
        ['"order-7";p=1', /sf-string/],
        ['"a\\nb"', /sf-string/],
        ['"a", "b"', /more than once/],
        ["x".repeat(256), /Too big|255/],
        ["caf\u00e9", /printable ASCII/],
        ["a\tb", /printable ASCII/],
      ];
      for (const [value, message] of bad) {
        await refused(() => admit({}, { "Idempotency-Key": value }), message).catch((err) => {
          throw new Error(`Idempotency-Key: ${JSON.stringify(value)}: ${err.message}`);
        });
      }
      // The longest key the body allows is the longest the header allows, quoted or not.
      const longest = "k".repeat(255);
      assert.equal((await admit({}, { "Idempotency-Key": `"${longest}"` })).status, 201);
      assert.equal((await admit({}, { "Idempotency-Key": longest })).status, 200);
    });

    await t.step("the header twice: 422 naming the header, whichever the keys", async () => {
      const twice = (a: string, b: string) => () => {
        const headers = new Headers({
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
        });
        headers.append("Idempotency-Key", a);
        headers.append("Idempotency-Key", b);
        return app.request("/v1/runs", {
          method: "POST",
          body: JSON.stringify({ workflow_ref: "echo" }),
          headers,
        });
      };
      // Joined as "a, b" on the way in: no key, not the first or the last.
      await refused(twice("order-9", "order-10"), /more than once/);
      await refused(twice("order-9", "order-9"), /more than once/);
      await refused(twice('"order-9"', '"order-10"'), /more than once/);
      // A key with a comma cannot be told apart from that: it goes in the body.
      await refused(() => admit({}, { "Idempotency-Key": "a,b" }), /comma/);
      assert.equal(await runsWithKey("order-9") + await runsWithKey("order-10"), 0);
      const inBody = await admit({ dispatch_key: "a,b" });
      assert.equal(inBody.status, 201, "a comma is fine in the body's dispatch_key");
    });

    await t.step("concurrent requests with one header make one run", async () => {
      // Two API processes' worth of admission, so the database decides, not one batcher.
      const apps = [app, makeApp(sql)];
      const answers = await Promise.all(
        Array.from(
          { length: 24 },
          (_, i) => admit({ input: { i } }, { "Idempotency-Key": "order-8" }, apps[i % 2]),
        ),
      );
      const bodies = await Promise.all(answers.map((r) => r.json()));
      const statuses = answers.map((r) => r.status).sort();
      assert.deepEqual(statuses, [...Array(23).fill(200), 201], String(statuses));
      assert.equal(new Set(bodies.map((b) => b.run_id)).size, 1);
      assert.equal(await runsWithKey("order-8"), 1);
    });
  } finally {
    await db.drop();
  }
});
