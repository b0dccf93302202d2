/**
 * Leader election (core/leader.ts) against a real Postgres: of two
 * processes' electors exactly one leads and runs the leader-only tasks; when
 * it stops, or its session dies, the other takes over.
 */
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import type { Service } from "../core/lifecycle.ts";
import { LeaderElector } from "../core/leader.ts";
import { leaderBackend } from "../db/leader.ts";
import { createPool } from "../db/pool.ts";
import { freshDatabase, type TestDatabase, waitFor } from "./support/db.ts";

/** An elector on a one-connection pool of its own, and the leader-only task it runs. */
function elector(db: TestDatabase, name: string) {
  const task = { running: 0, starts: 0, stops: 0 };
  const e = new LeaderElector({
    role: "worker",
    connect: () => createPool({ url: db.url, max: 1, applicationName: `leader-test ${name}` }),
    retryMs: 100,
    log: silentLogger,
  });
  e.whileLeader("task", (): Service => ({
    start: () => {
      task.running++;
      task.starts++;
      return Promise.resolve();
    },
    stop: () => {
      task.running--;
      task.stops++;
      return Promise.resolve();
    },
  }));
  return { e, task };
}

Deno.test("leader: of two electors exactly one leads and runs the task; when it stops the other takes over", async () => {
  const db = await freshDatabase();
  const a = elector(db, "a");
  const b = elector(db, "b");
  try {
    await a.e.start();
    await b.e.start();
    await waitFor("a leader", () => a.e.isLeader || b.e.isLeader, 10_000);
    assert.ok(await leaderBackend(db.sql, "worker"));
    assert.equal(Number(a.e.isLeader) + Number(b.e.isLeader), 1);
    assert.equal(a.task.running + b.task.running, 1);
    const [leader, follower] = a.e.isLeader ? [a, b] : [b, a];
    await leader.e.stop();
    assert.equal(leader.task.running, 0, "its task stopped with it");
    await waitFor("the other took over", () => follower.e.isLeader, 10_000);
    assert.equal(follower.task.running, 1);
    assert.equal(follower.task.starts, 1);
  } finally {
    await a.e.stop();
    await b.e.stop();
    await db.drop();
  }
});

Deno.test("leader: when the leader's session dies it steps down and stops its task, and one leader is elected again on another session", async () => {
  const db = await freshDatabase();
  const a = elector(db, "a");
  const b = elector(db, "b");
  try {
    await a.e.start();
    await waitFor("a leads", () => a.e.isLeader, 10_000);
    await b.e.start();
    const pid = await leaderBackend(db.sql, "worker");
    assert.ok(pid);
    await db.sql`select pg_terminate_backend(${pid})`;
    // a finds out on its next check.
    await waitFor("a stepped down and stopped its task", () => a.task.stops === 1, 10_000);
    const next = await waitFor("a leader again", async () => {
      const p = await leaderBackend(db.sql, "worker");
      return p && p !== pid && (a.e.isLeader || b.e.isLeader) ? p : undefined;
    }, 10_000);
    assert.notEqual(next, pid);
    assert.equal(Number(a.e.isLeader) + Number(b.e.isLeader), 1);
    assert.equal(a.task.running + b.task.running, 1);
  } finally {
    await a.e.stop();
    await b.e.stop();
    await db.drop();
  }
});
