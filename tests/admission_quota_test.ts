/**
 * admission/quota.ts: the token bucket's arithmetic, and the gate against a
 * real Postgres and the real admission kernel: a tenant at its max_queued is
 * refused and nothing is written, this process's admissions count at once
 * (a concurrent burst cannot overshoot), a changed quota or a drained queue
 * is seen at the next refresh, the rate is a bucket per tenant.
 */
import assert from "node:assert/strict";
import { Admission } from "../admission/admit.ts";
import { QuotaGate, type QuotaRefusal, TokenBucket } from "../admission/quota.ts";
import { PoimenError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { insertTenant } from "../db/auth.ts";
import { requestCancel } from "../db/cancellation.ts";
import type { Sql } from "../db/pool.ts";
import { countQueuedRuns, selectTenantQuota, setTenantQuota } from "../db/tenant_quotas.ts";
import { catalogOf } from "./support/catalog.ts";
import { freshDatabase, waitFor } from "./support/db.ts";

Deno.test("quota: a token bucket holds max(1, rate) tokens and says when the next is due", () => {
  const b = new TokenBucket(2, 0);
  assert.equal(b.tokens(0), 2, "full at first: a burst of the rate");
  assert.equal(b.take(0), 0);
  assert.equal(b.take(0), 0);
  assert.equal(b.take(0), 500, "the next token in half a second at 2/s");
  assert.equal(b.take(250), 250);
  assert.equal(b.take(500), 0, "due at 500 ms");
  assert.equal(b.tokens(10_000), 2, "never more than its capacity");

  const slow = new TokenBucket(0.25, 0);
  assert.equal(slow.tokens(0), 1, "a rate below 1 still lets one through");
  assert.equal(slow.take(0), 0);
  assert.equal(slow.take(0), 4000, "one token every 4 s");
  assert.equal(slow.take(1000), 3000);

  const change = new TokenBucket(10, 0);
  change.setRate(3, 0);
  assert.equal(change.tokens(0), 3, "a lower rate cuts the tokens to its capacity");
  change.setRate(100, 0);
  assert.equal(change.tokens(0), 3, "a higher rate keeps the tokens, earns faster");
  assert.equal(change.tokens(10), 4);
  assert.equal(new TokenBucket(5, 100).tokens(50), 5, "a clock going back earns nothing");
});

/** An admission kernel and a gate over `sql`; the gate does not refresh by itself unless told. */
function setup(sql: Sql, opts: { refreshMs?: number; now?: () => number } = {}) {
  const admission = new Admission(sql, catalogOf(), { maxBatch: 16, maxConcurrent: 2 });
  const refused: [string, QuotaRefusal][] = [];
  const gate = new QuotaGate(sql, {
    refreshMs: opts.refreshMs ?? 3_600_000,
    log: silentLogger,
    onRefused: (tenant, reason) => refused.push([tenant, reason]),
    now: opts.now,
  });
  const admit = (tenantId: string, dispatchKey?: string) =>
    gate.admit(tenantId, () =>
      admission.admit(
        { workflow_ref: "echo", input: {}, dispatch_key: dispatchKey },
        { tenantId, source: "test", entry: "http" },
      ));
  return { gate, admit, refused };
}

async function rejection(p: Promise<unknown>): Promise<PoimenError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof PoimenError, String(err));
    return err;
  }
  assert.fail("admitted, expected a refusal");
}

async function runs(sql: Sql, tenant: string): Promise<{ n: number; events: number }> {
  const [r] = await sql<{ n: number; events: number }[]>`
    select (select count(*)::int from runs where tenant_id = ${tenant}) as n,
           (select count(*)::int from work_events where tenant_id = ${tenant}) as events`;
  return r;
}

Deno.test("quota: db: setting creates the tenant, keeps the other quota, none removes one", async () => {
  const db = await freshDatabase();
  try {
    assert.equal(await selectTenantQuota(db.sql, "qa"), undefined);
    assert.deepEqual(await setTenantQuota(db.sql, "qa", { max_queued: 5 }), {
      tenant_id: "qa",
      max_queued: 5,
      admission_rate: null,
    });
    await setTenantQuota(db.sql, "qa", { admission_rate: 2.5 });
    assert.deepEqual(await selectTenantQuota(db.sql, "qa"), {
      tenant_id: "qa",
      max_queued: 5,
      admission_rate: 2.5,
    });
    await setTenantQuota(db.sql, "qa", { max_queued: null });
    assert.deepEqual(await selectTenantQuota(db.sql, "qa"), {
      tenant_id: "qa",
      max_queued: null,
      admission_rate: 2.5,
    });
    await assert.rejects(setTenantQuota(db.sql, "qa", { max_queued: -1 }), /check/);
    await assert.rejects(setTenantQuota(db.sql, "qa", { admission_rate: 0 }), /check/);
  } finally {
    await db.drop();
  }
});

Deno.test("quota: a tenant at its max_queued is refused, nothing written; others are not", async () => {
  const db = await freshDatabase();
  const { gate, admit, refused } = setup(db.sql, { refreshMs: 1500 });
  try {
    await setTenantQuota(db.sql, "full", { max_queued: 3 });
    await insertTenant(db.sql, "free");
    await gate.start();
    for (let i = 0; i < 3; i++) assert.equal((await admit("full")).created, true);
    // No refresh ran (the interval is longer than this): this process's own
    // admissions filled the count.
    const before = await runs(db.sql, "full");
    assert.equal(before.n, 3);
    const err = await rejection(admit("full"));
    assert.equal(err.code, "queue-full");
    assert.equal(err.status, 429);
    assert.equal(err.retryable, true);
    assert.equal(err.retryAfterSeconds, 2, "the refresh interval, rounded up");
    assert.deepEqual(await runs(db.sql, "full"), before, "nothing written");
    assert.deepEqual(refused, [["full", "queue-full"]]);
    // A replay of a key is refused alike (documented: retryable, no read per request).
    const replay = await rejection(admit("full", "k-1"));
    assert.equal(replay.code, "queue-full");
    // Another tenant is admitted meanwhile.
    for (let i = 0; i < 5; i++) assert.equal((await admit("free")).created, true);
    const view = gate.view().find((v) => v.tenantId === "full");
    assert.deepEqual(view, { tenantId: "full", maxQueued: 3, rate: null, queued: 3 });
  } finally {
    await gate.stop();
    await gate.stop();
    await db.drop();
  }
});

Deno.test("quota: a concurrent burst into one process cannot overshoot max_queued", async () => {
  const db = await freshDatabase();
  const { gate, admit } = setup(db.sql);
  try {
    await setTenantQuota(db.sql, "burst", { max_queued: 5 });
    await gate.start();
    const outcomes = await Promise.allSettled(Array.from({ length: 40 }, () => admit("burst")));
    const created = outcomes.filter((o) => o.status === "fulfilled").length;
    const full = outcomes.filter((o) =>
      o.status === "rejected" && (o.reason as PoimenError).code === "queue-full"
    ).length;
    assert.equal(created, 5, "exactly max_queued admitted");
    assert.equal(full, 35);
    assert.equal((await runs(db.sql, "burst")).n, 5);
    // A replay that gets through does not count as a queued run.
    await setTenantQuota(db.sql, "burst", { max_queued: 7 });
    await gate.refresh();
    assert.equal((await admit("burst", "same")).created, true);
    assert.equal((await admit("burst", "same")).created, false);
    assert.equal((await admit("burst", "same")).created, false);
    assert.equal(
      gate.view().find((v) =>
        v.tenantId === "burst"
      )?.queued,
      6,
    );
    assert.equal((await admit("burst")).created, true);
    assert.equal((await rejection(admit("burst"))).code, "queue-full");
  } finally {
    await gate.stop();
    await db.drop();
  }
});

Deno.test("quota: a refresh sees a raised quota and a drained queue; the timer refreshes by itself", async () => {
  const db = await freshDatabase();
  const { gate, admit } = setup(db.sql);
  const timed = setup(db.sql, { refreshMs: 100 });
  try {
    await setTenantQuota(db.sql, "q", { max_queued: 2 });
    await gate.start();
    const first = await admit("q");
    await admit("q");
    assert.equal((await rejection(admit("q"))).code, "queue-full");

    // Raised in the database: refused until the gate reads it again.
    await setTenantQuota(db.sql, "q", { max_queued: 3 });
    assert.equal((await rejection(admit("q"))).code, "queue-full", "the cache holds");
    await gate.refresh();
    assert.equal((await admit("q")).created, true);
    assert.equal((await rejection(admit("q"))).code, "queue-full");

    // A queued run leaves the queue (cancelled here, claimed in life): the next count sees it.
    await requestCancel(db.sql, "q", first.run.run_id);
    assert.equal(await countQueuedRuns(db.sql, "q", 3), 2);
    await gate.refresh();
    assert.equal(gate.view().find((v) => v.tenantId === "q")?.queued, 2);
    assert.equal((await admit("q")).created, true);

    // A quota removed: unlimited again.
    await setTenantQuota(db.sql, "q", { max_queued: null });
    await gate.refresh();
    assert.deepEqual(gate.view(), []);
    assert.equal((await admit("q")).created, true);

    // The timer alone picks up a change within its interval.
    await setTenantQuota(db.sql, "t", { max_queued: 0 });
    await timed.gate.start();
    assert.equal((await rejection(timed.admit("t"))).code, "queue-full");
    await setTenantQuota(db.sql, "t", { max_queued: 1 });
    await waitFor(
      "the raised quota applied",
      async () => {
        try {
          return (await timed.admit("t")).created;
        } catch (err) {
          if (err instanceof PoimenError && err.code === "queue-full") return false;
          throw err;
        }
      },
      5_000,
      20,
    );
  } finally {
    await gate.stop();
    await timed.gate.stop();
    await db.drop();
  }
});

Deno.test("quota: the admission rate is a bucket per tenant, with Retry-After when the next token is due", async () => {
  const db = await freshDatabase();
  let now = 0;
  const { gate, admit, refused } = setup(db.sql, { now: () => now });
  try {
    await setTenantQuota(db.sql, "r", { admission_rate: 2 });
    await setTenantQuota(db.sql, "slow", { admission_rate: 0.2 });
    await gate.start();
    await admit("r");
    await admit("r");
    const err = await rejection(admit("r"));
    assert.equal(err.code, "rate-limited");
    assert.equal(err.status, 429);
    assert.equal(err.retryAfterSeconds, 1, "500 ms, rounded up to a whole second");
    assert.equal((await runs(db.sql, "r")).n, 2, "nothing written");
    now = 500;
    assert.equal((await admit("r")).created, true, "a token earned");
    assert.equal((await rejection(admit("r"))).code, "rate-limited");

    await admit("slow");
    assert.equal((await rejection(admit("slow"))).retryAfterSeconds, 5, "0.2/s: 5 s");
    // Another tenant's bucket is its own.
    assert.equal((await rejection(admit("r"))).code, "rate-limited");
    assert.deepEqual(refused.map(([, r]) => r), Array(4).fill("rate-limited"));

    // A raised rate applies at the next refresh, the tokens earned kept.
    await setTenantQuota(db.sql, "r", { admission_rate: 100 });
    await gate.refresh();
    now = 510;
    assert.equal((await admit("r")).created, true);
  } finally {
    await gate.stop();
    await db.drop();
  }
});

Deno.test("quota: before its first read the gate reads the quotas on the first admission", async () => {
  const db = await freshDatabase();
  const { gate, admit } = setup(db.sql);
  try {
    await setTenantQuota(db.sql, "z", { max_queued: 0 });
    // Not started: the first admission reads the table itself.
    assert.equal((await rejection(admit("z"))).code, "queue-full");
    assert.equal((await runs(db.sql, "z")).n, 0);
  } finally {
    await gate.stop();
    await db.drop();
  }
});
