/**
 * The schedule tick against a real Postgres with an injected clock: three
 * tickers (each its own admission kernel and pool, as three API processes)
 * tick one schedule through ten minutes and start each occurrence exactly
 * once; `skip` overlap admits nothing while the last run is unfinished;
 * each catch-up policy after a stop; backfill is idempotent.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import {
  admitOccurrence,
  occurrenceKey,
  parseOccurrenceKey,
  ScheduleTicker,
} from "../admission/schedule_ticker.ts";
import { nextOccurrence, occurrencesBetween } from "../core/cron.ts";
import { silentLogger } from "../core/log.ts";
import { MINUTE } from "../core/time.ts";
import { insertTenant } from "../db/auth.ts";
import { createPool, type Sql } from "../db/pool.ts";
import { insertSchedule, type ScheduleFields, selectSchedule } from "../db/schedules.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase } from "./support/db.ts";

function tickerOn(sql: Sql, clock: { now: Date }): ScheduleTicker {
  const admission = new Admission(sql, catalogOf(), { maxBatch: 10, maxConcurrent: 1 });
  return new ScheduleTicker(sql, admission, {
    intervalMs: MINUTE,
    log: silentLogger,
    now: () => Promise.resolve(clock.now),
  });
}

function fields(cron: string, from: Date, more: Partial<ScheduleFields> = {}): ScheduleFields {
  return {
    workflow_ref: "echo",
    cron,
    timezone: "UTC",
    input: { hello: "schedule" },
    overlap: "allow",
    catchup: "skip",
    paused: false,
    // As the API creates one: the first occurrence at or after `from`.
    next_at: nextOccurrence(cron, "UTC", new Date(from.getTime() - 1)),
    ...more,
  };
}

async function scheduledRuns(sql: Sql, tenant: string) {
  return await sql<{ run_id: string; dispatch_key: string; source: string }[]>`
    select run_id, dispatch_key, source from runs where tenant_id = ${tenant}
     order by dispatch_key`;
}

const T0 = new Date("2030-01-01T10:00:00Z");

Deno.test("three tickers through ten minutes of a 1-minute cron: exactly one run per occurrence", async () => {
  const db = await freshDatabase();
  const pools = [0, 1, 2].map(() => createPool({ url: db.url, max: 4, applicationName: "t" }));
  try {
    const tenant = "sched-three";
    await insertTenant(db.sql, tenant);
    await insertSchedule(db.sql, tenant, "every-minute", fields("* * * * *", T0));
    const clock = { now: T0 };
    const tickers = pools.map((p) => tickerOn(p, clock));
    // Every five fake seconds for ten minutes, every ticker ticks at once (and
    // again, some of them), as tickers whose rounds collide would.
    for (let s = 0; s <= 600; s += 5) {
      clock.now = new Date(T0.getTime() + s * 1000);
      await Promise.all([...tickers.map((t) => t.tick()), tickers[s % 3].tick()]);
    }
    const runs = await scheduledRuns(db.sql, tenant);
    const expected = occurrencesBetween("* * * * *", "UTC", T0, clock.now)
      .map((t) => occurrenceKey("every-minute", t));
    assert.equal(expected.length, 11);
    assert.deepEqual(runs.map((r) => r.dispatch_key), expected);
    assert.ok(runs.every((r) => r.source === "schedule:every-minute"));
    assert.deepEqual(parseOccurrenceKey(runs[0].dispatch_key), {
      schedule_id: "every-minute",
      scheduled_for: "2030-01-01T10:00:00.000Z",
    });
    const s = await selectSchedule(db.sql, tenant, "every-minute");
    assert.equal(s?.next_at?.toISOString(), "2030-01-01T10:11:00.000Z");
    assert.equal(s?.last_run_id, runs.at(-1)?.run_id);
  } finally {
    await Promise.all(pools.map((p) => p.end()));
    await db.drop();
  }
});

Deno.test("overlap skip: no new occurrence while the last run is unfinished", async () => {
  const db = await freshDatabase();
  try {
    const tenant = "sched-overlap";
    await insertTenant(db.sql, tenant);
    await insertSchedule(db.sql, tenant, "s", fields("* * * * *", T0, { overlap: "skip" }));
    const clock = { now: T0 };
    const ticker = tickerOn(db.sql, clock);
    for (let m = 0; m <= 3; m++) {
      clock.now = new Date(T0.getTime() + m * MINUTE + 5000);
      await ticker.tick();
    }
    const first = await scheduledRuns(db.sql, tenant);
    assert.deepEqual(first.map((r) => r.dispatch_key), [occurrenceKey("s", T0)]);
    // The run finishes (as its worker would record it), and the next occurrence starts.
    await db.sql`update runs set status = 'succeeded', finished_at = now()
                  where tenant_id = ${tenant} and run_id = ${first[0].run_id}`;
    clock.now = new Date(T0.getTime() + 4 * MINUTE + 5000);
    await ticker.tick();
    const after = await scheduledRuns(db.sql, tenant);
    assert.deepEqual(after.map((r) => r.dispatch_key), [
      occurrenceKey("s", T0),
      occurrenceKey("s", new Date(T0.getTime() + 4 * MINUTE)),
    ]);
  } finally {
    await db.drop();
  }
});

Deno.test("catch-up after a stop: skip admits none of the missed, latest the last, all each", async () => {
  const db = await freshDatabase();
  try {
    const tenant = "sched-catchup";
    await insertTenant(db.sql, tenant);
    for (const catchup of ["skip", "latest", "all"] as const) {
      await insertSchedule(db.sql, tenant, catchup, fields("0 * * * *", T0, { catchup }));
    }
    // Down from before 10:00 until 13:30: 10:00, 11:00, 12:00 and 13:00 were missed.
    // One connection is enough: no transaction stays open while the tick admits.
    const clock = { now: new Date("2030-01-01T13:30:00Z") };
    const one = createPool({ url: db.url, max: 1, applicationName: "t" });
    try {
      await tickerOn(one, clock).tick();
    } finally {
      await one.end();
    }
    const keys = (await scheduledRuns(db.sql, tenant)).map((r) => r.dispatch_key);
    const hours = (id: string, hs: number[]) =>
      hs.map((h) => occurrenceKey(id, new Date(`2030-01-01T${h}:00:00Z`)));
    assert.deepEqual(keys, [...hours("all", [10, 11, 12, 13]), ...hours("latest", [13])]);
    for (const id of ["skip", "latest", "all"]) {
      const s = await selectSchedule(db.sql, tenant, id);
      assert.equal(s?.next_at?.toISOString(), "2030-01-01T14:00:00.000Z", id);
    }
  } finally {
    await db.drop();
  }
});

Deno.test("paused schedules are not ticked; a backfill admits each occurrence once however often", async () => {
  const db = await freshDatabase();
  try {
    const tenant = "sched-backfill";
    await insertTenant(db.sql, tenant);
    const row = await insertSchedule(
      db.sql,
      tenant,
      "b",
      fields("*/15 * * * *", T0, { paused: true, next_at: null }),
    );
    if (!row) throw new Error("not created");
    const schedule = row;
    const clock = { now: new Date(T0.getTime() + 60 * MINUTE) };
    assert.equal(await tickerOn(db.sql, clock).tick(), 0);
    const admission = new Admission(db.sql, catalogOf(), { maxBatch: 10, maxConcurrent: 1 });
    const range = occurrencesBetween(row.cron, row.timezone, T0, clock.now);
    for (let again = 0; again < 2; again++) {
      const results = await Promise.all(range.map((t) => admitOccurrence(admission, schedule, t)));
      assert.deepEqual(results.map((r) => r.created), range.map(() => again === 0));
    }
    assert.equal((await scheduledRuns(db.sql, tenant)).length, 5);
  } finally {
    await db.drop();
  }
});
