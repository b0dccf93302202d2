/**
 * What Postgres cannot store is refused at the door, over HTTP against a
 * real API process: a `run_after` out of timestamptz's range or offset, a
 * number beyond a double, NUL in a string, a bad query parameter, a
 * repeated `Idempotency-Key`, a dispatch key in the relay's namespace from
 * a tenant: each a 422 naming the field, nothing written, and never a 5xx.
 */
import assert from "node:assert/strict";
import { PROBLEM_BASE } from "../core/errors.ts";
import { HEADERS } from "../contracts/runs.ts";
import { freshDatabase, type TestDatabase } from "./support/db.ts";
import { ApiProcess, newToken } from "./support/processes.ts";

async function written(db: TestDatabase): Promise<number> {
  const [r] = await db.sql`select (select count(*)::int from runs)
                                + (select count(*)::int from work_events) as n`;
  return r.n;
}

/** A 422 `validation` whose errors include `path`, with a message matching `message`. */
async function refusedAt(res: Response, path: string, message?: RegExp): Promise<void> {
  const text = await res.text();
  assert.equal(res.status, 422, text);
  const body = JSON.parse(text);
  assert.equal(body.type, PROBLEM_BASE + "validation", text);
  assert.equal(body.retryable, false);
  const errors = body.errors as { path: string; message: string }[];
  const at = errors.filter((e) => e.path === path);
  assert.ok(at.length > 0, `no error at ${path}: ${text}`);
  if (message) assert.ok(at.some((e) => message.test(e.message)), text);
}

/**
 * One HTTP/1.1 request over a socket of its own, headers written as given
 * (a header may come twice, which fetch would join into one line).
 */
async function rawRequest(url: string, lines: string[], body: string): Promise<Response> {
  const { hostname, port } = new URL(url);
  const conn = await Deno.connect({ hostname, port: Number(port) });
  try {
    const bytes = new TextEncoder().encode(body);
    const head = [...lines, `host: ${hostname}:${port}`, `content-length: ${bytes.length}`];
    await conn.write(new TextEncoder().encode(`${head.join("\r\n")}\r\n\r\n`));
    await conn.write(bytes);
    const text = new TextDecoder().decode(await new Response(conn.readable).arrayBuffer());
    const [headText, ...rest] = text.split("\r\n\r\n");
    const status = Number(headText.split(" ")[1]);
    return new Response(rest.join("\r\n\r\n"), { status });
  } catch (err) {
    conn.close();
    throw err;
  }
}

Deno.test("it: values Postgres cannot store, a repeated Idempotency-Key and the relay's key namespace are 422s naming the field, never a 5xx", async (t) => {
  const db = await freshDatabase();
  let api: ApiProcess | undefined;
  try {
    const tenant = await newToken(db.url, "acme");
    const service = await newToken(db.url, "--service", "relay");
    api = await new ApiProcess({ DATABASE_URL: db.url }).ready();
    const url = api.url;
    const post = (body: string, headers: Record<string, string> = {}, token = tenant) =>
      fetch(`${url}/v1/runs`, {
        method: "POST",
        body,
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          ...headers,
        },
      });
    const run = (fields: Record<string, unknown>) =>
      JSON.stringify({ workflow_ref: "echo", input: {}, ...fields });

    await t.step("run_after out of Postgres' range or offset: 422 at run_after", async () => {
      const before = await written(db);
      // A day within the 365 allowed, whatever the clock says.
      const soon = new Date(Date.now() + 2 * 86_400_000).toISOString().slice(0, 10);
      for (
        const [at, message] of [
          ["0000-01-01T00:00:00Z", /year from 1970/],
          ["1969-12-31T23:59:59Z", /year from 1970/],
          [`${soon}T00:00:00+16:00`, /offset within ±15:59/],
          [`${soon}T00:00:00-23:59`, /offset within ±15:59/],
        ] as const
      ) {
        await refusedAt(await post(run({ run_after: at })), "run_after", message);
      }
      assert.equal(await written(db), before, "nothing written");
      // The bounds themselves are times Postgres takes.
      for (
        const at of ["1970-01-01T00:00:00Z", `${soon}T00:00:00+15:59`, `${soon}T00:00:00-15:59`]
      ) {
        const res = await post(run({ run_after: at }));
        assert.equal(res.status, 201, `${at}: ${await res.text()}`);
      }
      const [{ n }] = await db.sql`select count(*)::int as n from runs
                                    where run_after = ${`${soon}T00:00:00+15:59`}::text::timestamptz`;
      assert.equal(n, 1, "+15:59 stored as the same instant");
    });

    await t.step(
      "numbers beyond a double or the column, NUL in strings: 422 at the field",
      async () => {
        const before = await written(db);
        const cases: [string, string][] = [
          ['{"workflow_ref":"echo","priority":1e400}', "priority"],
          ['{"workflow_ref":"echo","priority":-1e400}', "priority"],
          ['{"workflow_ref":"echo","priority":40000}', "priority"],
          ['{"workflow_ref":"echo","input":{"n":1e400}}', "input.n"],
          ['{"workflow_ref":"echo","input":{"s":"a\\u0000b"}}', "input.s"],
          ['{"workflow_ref":"echo","input":{"k\\u0000":1}}', 'input["k\\u0000"]'],
          ['{"workflow_ref":"echo","input":["\\ud800"]}', "input[0]"],
          ['{"workflow_ref":"echo","goal_id":"g\\u0000"}', "goal_id"],
          ['{"workflow_ref":"echo","dispatch_key":"k\\u0000"}', "dispatch_key"],
          ['{"workflow_ref":"ec\\u0000ho"}', "workflow_ref"],
        ];
        for (const [body, path] of cases) await refusedAt(await post(body), path);
        assert.equal(await written(db), before, "nothing written");
      },
    );

    await t.step("query parameters Postgres cannot take: 422 naming the parameter", async () => {
      const get = (query: string) =>
        fetch(`${url}/v1/runs?${query}`, { headers: { authorization: `Bearer ${tenant}` } });
      await refusedAt(await get("goal_id=%00"), "goal_id");
      await refusedAt(await get("dispatch_key=a%00b"), "dispatch_key");
      await refusedAt(await get("limit=1e400"), "limit");
      await refusedAt(await get("limit=99999999999"), "limit");
      await refusedAt(await get(`cursor=${btoa("not-a-uuid\u0000")}`), "cursor");
      await refusedAt(await get("status=%00"), "status");
    });

    await t.step("a repeated Idempotency-Key: 422 at the header, nothing written", async () => {
      const before = await written(db);
      const body = run({});
      const res = await rawRequest(url, [
        "POST /v1/runs HTTP/1.1",
        `authorization: Bearer ${tenant}`,
        "content-type: application/json",
        "Idempotency-Key: a",
        "Idempotency-Key: b",
        "connection: close",
      ], body);
      await refusedAt(res, `header.${HEADERS.idempotencyKey}`, /more than once/);
      // The same joined by hand, and a key with a comma, cannot be told apart from it.
      for (const key of ["a, b", "a,b", '"a,b"']) {
        await refusedAt(
          await post(body, { [HEADERS.idempotencyKey]: key }),
          `header.${HEADERS.idempotencyKey}`,
          /more than once/,
        );
      }
      assert.equal(await written(db), before, "nothing written");
      // One header is still the key.
      const one = await rawRequest(url, [
        "POST /v1/runs HTTP/1.1",
        `authorization: Bearer ${tenant}`,
        "content-type: application/json",
        "Idempotency-Key: once",
        "connection: close",
      ], body);
      assert.equal(one.status, 201, await one.text());
    });

    await t.step(
      "the relay's kafka: keys: refused for a tenant, the relay's own admitted",
      async () => {
        const key = "kafka:poimen.acme.dispatch/0/0";
        const before = await written(db);
        await refusedAt(await post(run({ dispatch_key: key })), "dispatch_key", /reserved/);
        await refusedAt(
          await post(run({}), { [HEADERS.idempotencyKey]: key }),
          `header.${HEADERS.idempotencyKey}`,
          /reserved/,
        );
        await refusedAt(await post(run({ dispatch_key: "kafka:" })), "dispatch_key", /reserved/);
        // A service token too, unless the key is its request's own source.
        const asService = (dispatchKey: string, source?: string) =>
          post(run({ dispatch_key: dispatchKey }), {
            [HEADERS.tenant]: "acme",
            ...(source === undefined ? {} : { [HEADERS.source]: source }),
          }, service);
        await refusedAt(await asService(key), "dispatch_key", /reserved/);
        await refusedAt(
          await asService(key, "kafka:poimen.acme.dispatch/0/7"),
          "dispatch_key",
          /reserved/,
        );
        assert.equal(await written(db), before, "nothing written");
        const admitted = await asService(key, key);
        assert.equal(admitted.status, 201, await admitted.text());
        const replayed = await asService(key, key);
        assert.equal(replayed.status, 200, await replayed.text());
        // Other keys are anyone's, with a colon or not.
        const other = await post(run({ dispatch_key: "kafka-order:1" }));
        assert.equal(other.status, 201, await other.text());
      },
    );

    await t.step("no request above was answered with a 5xx", async () => {
      const text = await (await fetch(`${url}/metrics`)).text();
      const fives = text.split("\n").filter((l) =>
        l.startsWith("poimen_http_requests_total{") && /status="5\d\d"/.test(l) &&
        !l.endsWith(" 0")
      );
      assert.deepEqual(fives, []);
      assert.ok(text.includes('status="422"'), "the 422s were counted");
    });
  } finally {
    const stopped = api;
    const status = stopped ? await stopped.stop() : undefined;
    await db.drop();
    if (stopped && status) assert.equal(status.code, 0, stopped.logs().join("\n"));
  }
});
