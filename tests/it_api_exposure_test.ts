/**
 * What the API port shows a caller it does not know, against a real API
 * process: hostile HTTP methods cannot grow `/metrics` (every label value is
 * from a fixed set), the port's unauthenticated `/metrics` names no tenant
 * (the per-tenant series are on API_METRICS_HOST:API_METRICS_PORT), and every
 * /v1 answer, success or problem, says `nosniff` and `no-store`.
 */
import assert from "node:assert/strict";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { ApiProcess, newToken, runCommand } from "./support/processes.ts";

/** Sends one raw HTTP/1.1 request line `method path` and returns the status (fetch may refuse odd methods). */
async function rawRequest(url: string, method: string, path: string): Promise<number> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  try {
    const head = `${method} ${path} HTTP/1.1\r\nhost: ${hostname}\r\nconnection: close\r\n\r\n`;
    await conn.write(new TextEncoder().encode(head));
    const chunks: Uint8Array[] = [];
    const buf = new Uint8Array(16 * 1024);
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(buf.slice(0, n));
    }
    const text = new TextDecoder().decode(new Uint8Array(chunks.flatMap((c) => [...c])));
    const status = /^HTTP\/1\.1 (\d{3})/.exec(text);
    assert.ok(status, `not an HTTP answer: ${text.slice(0, 200)}`);
    return Number(status[1]);
  } finally {
    try {
      conn.close();
    } catch { /* closed by the server */ }
  }
}

async function scrape(url: string): Promise<string> {
  const res = await fetch(`${url}/metrics`);
  assert.equal(res.status, 200);
  return await res.text();
}

/** Runs `fn` against a fresh database and an API on it (`setup` first), then stops the API. */
async function withApi(
  fn: (api: ApiProcess, db: TestDatabase) => Promise<void>,
  env: Record<string, string> = {},
  setup: (db: TestDatabase) => Promise<void> = async () => {},
): Promise<void> {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  try {
    await setup(db);
    api = await new ApiProcess({ DATABASE_URL: db.url, ...env }).ready();
    await fn(api, db);
    // Its metrics listener too stops on SIGTERM, cleanly.
    const status = await api.stop();
    assert.equal(status.code, 0, api.logs().join("\n"));
  } catch (err) {
    if (api) console.error(api.logs().join("\n"));
    throw err;
  } finally {
    await api?.stop();
    await db.drop();
  }
}

Deno.test("it: 20 requests with 4,000-byte custom methods leave the API's /metrics the same size, naming no method", async () => {
  await withApi(async (api) => {
    // One odd method first, so "before" already has the series an unknown method collapses to.
    await rawRequest(api.url, "PROBE", "/v1/runs");
    const before = await scrape(api.url);
    const methods = Array.from({ length: 20 }, (_, i) => `M${i}`.padEnd(4_000, "X"));
    for (const [i, method] of methods.entries()) {
      // Routed, unrouted and console paths alike.
      const path = ["/v1/runs", "/nowhere", "/console/runs", "/metrics"][i % 4];
      const status = await rawRequest(api.url, method, path);
      assert.ok(status >= 400 && status < 500, `${path}: ${status}`);
    }
    const after = await scrape(api.url);
    assert.ok(
      after.length - before.length <= 2_048,
      `/metrics grew from ${before.length} to ${after.length} bytes`,
    );
    for (const method of methods) {
      assert.ok(!after.includes(method.slice(0, 64)), "a label holds a request's method");
    }
    for (const m of after.matchAll(/\bmethod="([^"]*)"/g)) {
      assert.ok(
        ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other"].includes(m[1]),
        `method label ${m[1].slice(0, 40)}`,
      );
    }
  });
});

Deno.test("it: the API port's unauthenticated /metrics names no tenant after its admissions and quota refusals; the metrics port does", async () => {
  const tenant = "exposed-tenant-7f3a";
  let token = "";
  await withApi(
    async (api) => {
      const statuses: number[] = [];
      for (let i = 0; i < 3; i++) {
        const res = await fetch(`${api.url}/v1/runs`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({ workflow_ref: "echo", input: {} }),
        });
        await res.body?.cancel();
        statuses.push(res.status);
      }
      assert.deepEqual(statuses, [201, 429, 429]);

      const open = await scrape(api.url);
      assert.ok(open.includes("poimen_admissions_total"), "the API port still serves /metrics");
      assert.ok(!open.includes(tenant), "the API port's /metrics names a tenant");
      assert.doesNotMatch(open, /\btenant="/);

      // Operators still see each tenant, on the metrics listener (127.0.0.1 by default).
      assert.ok(api.metricsUrl, "the API has a metrics listener");
      const operator = await scrape(api.metricsUrl);
      assert.match(
        operator,
        new RegExp(
          `poimen_admission_quota_refusals_total\\{tenant="${tenant}",reason="queue-full"\\} 2`,
        ),
      );
      assert.match(operator, new RegExp(`poimen_tenant_max_queued\\{tenant="${tenant}"\\} 1`));
      assert.ok(operator.includes("poimen_admissions_total"), "and the tenant-free series");
      const ready = await fetch(`${api.metricsUrl}/readyz`);
      assert.equal(ready.status, 200, await ready.text());
    },
    {},
    async (db) => {
      token = await newToken(db.url, tenant);
      const set = await runCommand("tenant", [tenant, "--max-queued", "1"], {
        DATABASE_URL: db.url,
        LOG_LEVEL: "warn",
      });
      assert.equal(set.code, 0, set.stderr);
    },
  );
});

Deno.test("it: every /v1 answer, success, 401, 404 and 422, says nosniff and no-store", async () => {
  await withApi(async (api, db) => {
    const token = await newToken(db.url, "headers-tenant");
    const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const cases: [string, number, Promise<Response>][] = [
      [
        "POST /v1/runs",
        201,
        fetch(`${api.url}/v1/runs`, {
          method: "POST",
          headers: auth,
          body: JSON.stringify({ workflow_ref: "echo", input: {} }),
        }),
      ],
      ["GET /v1/runs", 200, fetch(`${api.url}/v1/runs`, { headers: auth })],
      ["no token", 401, fetch(`${api.url}/v1/runs`)],
      ["junk token", 401, fetch(`${api.url}/v1/runs`, { headers: { authorization: "Bearer x" } })],
      [
        "unknown run",
        404,
        fetch(`${api.url}/v1/runs/01890000-0000-7000-8000-000000000000`, { headers: auth }),
      ],
      ["unknown route", 404, fetch(`${api.url}/v1/nothing`, { headers: auth })],
      [
        "bad body",
        422,
        fetch(`${api.url}/v1/runs`, { method: "POST", headers: auth, body: "{}" }),
      ],
      ["bad query", 422, fetch(`${api.url}/v1/runs?limit=-4`, { headers: auth })],
    ];
    for (const [what, status, pending] of cases) {
      const res = await pending;
      const body = await res.text();
      assert.equal(res.status, status, `${what}: ${body}`);
      assert.equal(res.headers.get("x-content-type-options"), "nosniff", what);
      assert.equal(res.headers.get("cache-control"), "no-store", what);
    }
  });
});
