/**
 * The pool under Postgres connection kills (the vendored, patched
 * postgres.js; vendor/postgres/PATCHES.md): nothing escapes as an uncaught
 * error (which would fail this file), every connection answers again
 * afterwards, and a transaction whose connection died never runs its later
 * statements elsewhere.
 *
 *   deno test -A tests/db_pool_test.ts
 */
import assert from "node:assert/strict";
import { Hono } from "hono";
import { createPool, isRefusedData, type Sql, toDbError } from "../db/pool.ts";
import { PoimenError, PROBLEM_BASE } from "../core/errors.ts";
import { createLogger } from "../core/log.ts";
import { problemResponse } from "../api/problem.ts";
import { ADMIN_URL, freshDatabase, waitFor } from "./support/db.ts";

/** Terminates every backend of `db` whose application_name is `app`; how many. */
async function terminate(admin: Sql, db: string, app: string): Promise<number> {
  const [{ n }] = await admin<{ n: number }[]>`
    select count(*) filter (where pg_terminate_backend(pid))::int as n
      from pg_stat_activity
     where datname = ${db} and application_name = ${app}`;
  return n;
}

Deno.test("pool: a transaction's statement after its connection was killed fails and runs nowhere", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-killer" });
  // One connection: after the kill the pool reconnects that same connection
  // for the next caller, which is where a stale statement would land.
  const sql = createPool({ url: db.url, max: 1, applicationName: "poimen-test-tx" });
  try {
    await sql`create table t (n int)`;
    const body = Promise.withResolvers<string>();
    const tx = sql.begin(async (tx) => {
      await tx`insert into t values (1)`;
      assert.equal(await terminate(admin, db.name, "poimen-test-tx"), 1);
      // Queued behind the transaction; served by a new session once the old one is gone.
      await sql`select 1`;
      try {
        await tx`insert into t values (2)`;
        body.resolve("ran");
      } catch {
        body.resolve("refused");
      }
    }).then(() => "committed", () => "failed");
    assert.equal(await tx, "failed");
    assert.equal(await body.promise, "refused");
    const [{ n }] = await sql<{ n: number }[]>`select count(*)::int as n from t`;
    assert.equal(n, 0, "neither insert outlived the transaction");
  } finally {
    await sql.end({ timeout: 1 });
    await admin.end();
    await db.drop();
  }
});

Deno.test("pool: repeated kills during connects, queries and transactions leave it answering", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-killer" });
  const sql = createPool({ url: db.url, max: 4, applicationName: "poimen-test-pool" });
  let going = true;
  let ok = 0;
  try {
    await sql`create table t (id serial primary key, tags text[])`;
    // Array parameters make every new connection fetch the array types
    // first; transactions hold a connection across statements.
    const load = async (i: number) => {
      while (going) {
        try {
          if (i % 2) await sql`insert into t (tags) values (${[`a${i}`, "b"]})`;
          else {
            await sql.begin(async (tx) => {
              await tx`select count(*) from t where ${"b"} = any(tags)`;
              await tx`select pg_notify('poimen_test', ${String(i)})`;
            });
          }
          ok++;
        } catch {
          await new Promise((r) => setTimeout(r, 10));
        }
      }
    };
    const loops = [...Array(8).keys()].map(load);
    await waitFor("statements flowing", () => ok >= 20);
    let killed = 0;
    const until = Date.now() + 2000;
    while (Date.now() < until) {
      killed += await terminate(admin, db.name, "poimen-test-pool");
      await new Promise((r) => setTimeout(r, Math.random() * 30));
    }
    assert.ok(killed > 20, `only ${killed} backends terminated`);
    const after = ok;
    await waitFor("statements flowing again", () => ok >= after + 50);
    going = false;
    await Promise.all(loops);
    // Every connection of the pool answers: as many concurrent statements as it holds, twice.
    for (let round = 0; round < 2; round++) {
      const rows = await Promise.all(
        [...Array(4).keys()].map(() => sql<{ one: number }[]>`select pg_sleep(0.05), 1 as one`),
      );
      assert.deepEqual(rows.map((r) => r[0].one), [1, 1, 1, 1]);
    }
    const [{ tags }] = await sql<{ tags: string[] }[]>`select tags from t order by id limit 1`;
    assert.ok(Array.isArray(tags), "array types still parsed");
  } finally {
    going = false;
    await sql.end({ timeout: 1 });
    await admin.end();
    await db.drop();
  }
});

Deno.test("pool: a value Postgres refuses (SQLSTATE 22, 23) is a final 422 invalid-data, no SQL shown; an outage or a unique violation is not", async () => {
  const db = await freshDatabase();
  const lines: string[] = [];
  const log = createLogger("test", "info", (line) => lines.push(line));
  // The one HTTP mapping (api/problem.ts), around real statements.
  const app = new Hono();
  app.onError((err, c) => problemResponse(c, err, log));
  const refusals: [string, string, () => Promise<unknown>][] = [
    ["year 0000", "22008", () => db.sql`select ${"0000-01-01T00:00:00Z"}::text::timestamptz`],
    [
      "offset +16:00",
      "22009",
      () => db.sql`select ${"2030-01-01T00:00:00+16:00"}::text::timestamptz`,
    ],
    ["smallint overflow", "22003", () => db.sql`select ${"40000"}::smallint`],
    ["NUL in text", "22021", () => db.sql`select ${"a\u0000b"}::text`],
    ["\\u0000 in jsonb", "22P05", () => db.sql`select ${'{"a":"\\u0000"}'}::text::jsonb`],
    ["a check constraint", "23514", () => db.sql`insert into tenants values (${"Not An Id"})`],
    [
      "a not-null column",
      "23502",
      () => db.sql`insert into tenants (tenant_id) values (${null})`,
    ],
  ];
  try {
    app.get("/:i", async (c) => {
      await refusals[Number(c.req.param("i"))][2]();
      return new Response("unreachable");
    });
    for (const [i, [what, sqlstate, statement]] of refusals.entries()) {
      const err = await statement().then(() => undefined, (e) => e);
      assert.ok(err instanceof Error, `${what}: refused`);
      assert.equal((err as { code?: string }).code, sqlstate, `${what}: ${err.message}`);
      assert.ok(isRefusedData(err), what);
      const mapped = toDbError(err);
      assert.ok(mapped instanceof PoimenError, what);
      assert.equal(mapped.code, "invalid-data", what);
      assert.equal(mapped.retryable, false, what);

      lines.length = 0;
      const res = await app.request(`/${i}`);
      const body = await res.json();
      assert.equal(res.status, 422, `${what}: ${JSON.stringify(body)}`);
      assert.equal(body.type, PROBLEM_BASE + "invalid-data");
      assert.equal(body.retryable, false);
      assert.match(body.detail, new RegExp(`SQLSTATE ${sqlstate}\\)$`), what);
      // Postgres' own text (which quotes values and SQL) is not shown, nor logged.
      for (const text of [body.detail, ...lines]) {
        assert.ok(!text.includes(err.message), `${what}: ${text}`);
        assert.ok(!/select|insert|tenants|0000-01|40000/.test(text), `${what}: ${text}`);
      }
      assert.equal(lines.length, 1, `${what}: one warning`);
      assert.match(lines[0], new RegExp(`"sqlstate":"${sqlstate}"`));
    }

    // A unique violation (a race, or a bug) and an outage keep their answers.
    await db.sql`insert into tenants (tenant_id) values ('t1')`;
    const dup = await db.sql`insert into tenants (tenant_id) values ('t1')`.then(
      () => {},
      (e) => e,
    );
    assert.equal(dup.code, "23505");
    assert.ok(!isRefusedData(dup));
    assert.ok(!(toDbError(dup) instanceof PoimenError), "a unique violation stays a 500");
    const gone = Object.assign(new Error("terminating connection"), {
      name: "PostgresError",
      code: "57P01",
    });
    assert.equal((toDbError(gone) as PoimenError).code, "database-unavailable");
  } finally {
    await db.drop();
  }
});
