/**
 * db/listener.ts against a real Postgres (a database of this file's own):
 * notifications arrive, a killed connection is listened on again, a first
 * LISTEN that fails is retried on a fresh pool, and stop() is final.
 *
 *   deno test -A tests/db_listener_test.ts
 */
import assert from "node:assert/strict";
import { createLogger } from "../core/log.ts";
import { Listener } from "../db/listener.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { ADMIN_URL, freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

const log = createLogger("db_listener_test", "error");

/** Backends of `db` whose application_name is `app`, terminated when `kill`. */
async function backends(admin: Sql, db: string, app: string, kill = false): Promise<number> {
  const [{ n }] = await admin<{ n: number }[]>`
    select count(*) filter (where not ${kill} or pg_terminate_backend(pid))::int as n
      from pg_stat_activity
     where datname = ${db} and application_name = ${app}`;
  return n;
}

/** A pool factory for `db` under one application name, counting the pools it opened. */
function pools(db: TestDatabase, app: string) {
  const opened = { n: 0 };
  const connect = () => {
    opened.n++;
    return createPool({ url: db.url, max: 1, applicationName: app });
  };
  return { connect, opened };
}

function recorder() {
  const got: Record<string, string[]> = {};
  const on = (channel: string) => (payload: string) => (got[channel] ??= []).push(payload);
  return { got, on };
}

Deno.test("listener: receives each channel's NOTIFYs, and after stop (twice) it is gone and hears nothing", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-admin" });
  const app = `poimen-test-listen-${crypto.randomUUID().slice(0, 8)}`;
  const { connect, opened } = pools(db, app);
  const { got, on } = recorder();
  let listens = 0;
  const listener = new Listener({
    connect,
    channels: { one: on("one"), two: on("two") },
    onListen: () => listens++,
    log,
  });
  try {
    await listener.start();
    assert.equal(listener.listening, true);
    assert.equal(listens, 2, "once per channel");
    // No wait before notifying: start() returned only once both LISTENs took.
    await db.sql`select pg_notify('one', 'a'), pg_notify('two', 'b'), pg_notify('three', 'c')`;
    await waitFor("both notifications", () => got.one?.length === 1 && got.two?.length === 1);
    assert.deepEqual(got, { one: ["a"], two: ["b"] });
    assert.equal(await backends(admin, db.name, app), 1);

    await Promise.all([listener.stop(), listener.stop()]);
    await listener.stop();
    assert.equal(listener.listening, false);
    await waitFor("its connection closed", async () => await backends(admin, db.name, app) === 0);
    await db.sql`select pg_notify('one', 'late')`;
    // A notification round trip on a listener of the test's own bounds the wait.
    const probe = createPool({ url: db.url, max: 1, applicationName: "poimen-test-probe" });
    const heard = Promise.withResolvers<void>();
    const sub = await probe.listen("one", () => heard.resolve());
    await db.sql`select pg_notify('one', 'probe')`;
    await heard.promise;
    await sub.unlisten();
    await probe.end();
    assert.deepEqual(got.one, ["a"], "nothing reached a stopped listener");
    assert.equal(opened.n, 1);
    await assert.rejects(() => listener.start(), /already started/);
  } finally {
    await listener.stop();
    await admin.end();
    await db.drop();
  }
});

Deno.test("listener: after pg_terminate_backend of its connection it listens again and hears later NOTIFYs", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-admin" });
  const app = `poimen-test-listen-${crypto.randomUUID().slice(0, 8)}`;
  const { connect } = pools(db, app);
  const { got, on } = recorder();
  let listens = 0;
  const listener = new Listener({
    connect,
    channels: { c: on("c") },
    onListen: () => listens++,
    log,
  });
  try {
    await listener.start();
    assert.equal(listens, 1);
    for (let kill = 1; kill <= 2; kill++) {
      assert.equal(await backends(admin, db.name, app, true), 1, `kill ${kill}`);
      await waitFor(`listening again after kill ${kill}`, () => listens === kill + 1, 10_000);
      await db.sql`select pg_notify('c', ${`after kill ${kill}`})`;
      await waitFor(`the NOTIFY after kill ${kill}`, () => got.c?.length === kill, 10_000);
    }
    assert.deepEqual(got.c, ["after kill 1", "after kill 2"]);
    assert.equal(listener.listening, true);
  } finally {
    await listener.stop();
    await admin.end();
    await db.drop();
  }
});

Deno.test("listener: a first LISTEN that fails is retried on a fresh pool until Postgres lets it in", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-admin" });
  const app = `poimen-test-listen-${crypto.randomUUID().slice(0, 8)}`;
  const { connect, opened } = pools(db, app);
  const { got, on } = recorder();
  const listener = new Listener({
    connect,
    channels: { c: on("c") },
    log,
    retryBaseMs: 20,
    retryCapMs: 100,
  });
  // Superusers too are refused: the listener's connects fail as with Postgres away.
  await admin.unsafe(`alter database ${db.name} allow_connections false`);
  try {
    await listener.start();
    assert.equal(listener.listening, false, "start() returns though the LISTEN failed");
    await waitFor("a few retries", () => opened.n >= 3, 10_000);
    assert.equal(listener.listening, false);
    await admin.unsafe(`alter database ${db.name} allow_connections true`);
    await waitFor("listening", () => listener.listening, 10_000);
    await db.sql`select pg_notify('c', 'in')`;
    await waitFor("the NOTIFY", () => got.c?.length === 1, 10_000);
    // The failed pools were ended: only the one that listens is connected.
    assert.equal(await backends(admin, db.name, app), 1);
  } finally {
    await admin.unsafe(`alter database ${db.name} allow_connections true`);
    await listener.stop();
    await admin.end();
    await db.drop();
  }
});

Deno.test("listener: stop() during retries ends them, and nothing listens afterwards", async () => {
  const db = await freshDatabase(false);
  const admin = createPool({ url: ADMIN_URL, max: 1, applicationName: "poimen-test-admin" });
  const app = `poimen-test-listen-${crypto.randomUUID().slice(0, 8)}`;
  const { connect, opened } = pools(db, app);
  const listener = new Listener({
    connect,
    channels: { c: () => {} },
    log,
    retryBaseMs: 20,
    retryCapMs: 20,
  });
  await admin.unsafe(`alter database ${db.name} allow_connections false`);
  try {
    await listener.start();
    await waitFor("a retry", () => opened.n >= 2, 10_000);
    await listener.stop();
    const tries = opened.n;
    await admin.unsafe(`alter database ${db.name} allow_connections true`);
    // Ten first-retry ceilings: a retry loop still going would have opened a pool.
    const since = Date.now();
    await waitFor("ten retry intervals", () => opened.n > tries || Date.now() - since > 200);
    assert.equal(opened.n, tries, "no try after stop()");
    assert.equal(listener.listening, false);
    assert.equal(await backends(admin, db.name, app), 0);
  } finally {
    await admin.unsafe(`alter database ${db.name} allow_connections true`);
    await listener.stop();
    await admin.end();
    await db.drop();
  }
});

Deno.test("listener: on a shared pool it listens once, gives up without retrying, and leaves the pool open", async () => {
  const db = await freshDatabase(false);
  const { got, on } = recorder();
  const shared = createPool({ url: db.url, max: 2, applicationName: "poimen-test-shared" });
  const listener = new Listener({ pool: shared, channels: { c: on("c") }, log });
  // Nothing listens on this port: the only try fails.
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = l.addr as Deno.NetAddr;
  l.close();
  const away = new URL(db.url);
  away.port = String(port);
  const unreachable = createPool({ url: away.href, max: 1, applicationName: "poimen-test-away" });
  const failing = new Listener({ pool: unreachable, channels: { c: () => {} }, log });
  try {
    await listener.start();
    await db.sql`select pg_notify('c', 'x')`;
    await waitFor("the NOTIFY", () => got.c?.length === 1);
    await listener.stop();
    const [{ one }] = await shared<{ one: number }[]>`select 1 as one`;
    assert.equal(one, 1, "the shared pool still answers");

    await failing.start();
    assert.equal(failing.listening, false);
    await failing.stop();
  } finally {
    await listener.stop();
    await shared.end();
    await unreachable.end({ timeout: 0 });
    await db.drop();
  }
});
