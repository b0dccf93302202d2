/**
 * The run purger's decision before each round, on a real Postgres: it
 * purges only while the window covers how long dispatch messages live, as
 * read before that round; a window that became too short, or a retention it
 * cannot read, holds the purge (nothing deleted) until that changes.
 * (The broker read itself is tested with real processes in it_retention.)
 */
import assert from "node:assert/strict";
import { insertTenant } from "../db/auth.ts";
import { silentLogger } from "../core/log.ts";
import { DAY } from "../core/time.ts";
import {
  type DispatchRetention,
  formatDuration,
  retentionProblem,
  RunPurger,
} from "../retention/run_purger.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

const SHORT: DispatchRetention = { ms: 7 * DAY, source: "t", detail: "t keeps 7d" };
const LONG: DispatchRetention = { ms: 60 * DAY, source: "poimen.acme.dispatch", detail: "60d" };

Deno.test("run purger: the window is checked against the dispatch retention before every round", async () => {
  const db = await freshDatabase();
  let dispatch: () => Promise<DispatchRetention> = () => Promise.resolve(LONG);
  const held: boolean[] = [];
  let purged = 0;
  const purger = new RunPurger(db.sql, {
    retentionMs: 30 * DAY,
    intervalMs: 20,
    batchSize: 10,
    dispatchRetention: () => dispatch(),
    log: silentLogger,
    hooks: { onHeld: (h) => held.push(h), onPurged: (n) => purged += n },
  });
  try {
    await insertTenant(db.sql, "acme");
    await db.sql`
      insert into runs (tenant_id, run_id, workflow_ref, workflow_name, workflow_version, input,
                        source, status, max_attempts, finished_at)
      select 'acme', gen_random_uuid(), 'echo', 'echo', 1, 'null', 'test', 'succeeded', 3,
             now() - interval '40 days'
        from generate_series(1, 25)`;
    const left = async () => (await db.sql`select count(*)::int as n from runs`)[0].n;

    // Messages may live 60 days: a 30-day window is held.
    await purger.start();
    await waitFor("a few held rounds", () => held.length >= 3);
    assert.ok(held.every((h) => h));
    assert.equal(await left(), 25);

    // Unreadable: held too.
    dispatch = () => Promise.reject(new Error("broker away"));
    const n = held.length;
    await waitFor("more held rounds", () => held.length >= n + 3);
    assert.ok(held.every((h) => h));
    assert.equal(await left(), 25);

    // The topic's retention lowered: the next round purges, in batches.
    dispatch = () => Promise.resolve(SHORT);
    await waitFor("everything purged", async () => (await left()) === 0);
    assert.equal(purged, 25);
    assert.equal(held.at(-1), false);
  } finally {
    await purger.stop();
    await purger.stop();
    await db.drop();
  }
});

Deno.test("run purger: the refusal is one line naming RUN_RETENTION_MS and what keeps messages longer", () => {
  assert.equal(retentionProblem(30 * DAY, SHORT), undefined);
  assert.equal(retentionProblem(7 * DAY, SHORT), undefined, "equal is enough");
  const line = retentionProblem(30 * DAY, LONG)!;
  assert.match(line, /^config: RUN_RETENTION_MS is invalid: 30d is shorter than .*60d/);
  assert.ok(!line.includes("\n"));
  const forever = retentionProblem(365 * DAY, { ms: Infinity, source: "x", detail: "x forever" });
  assert.match(forever!, /RUN_PURGE_INTERVAL_MS=0/);
  assert.equal(formatDuration(90 * 60_000), "1.5h");
});
