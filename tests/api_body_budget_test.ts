/**
 * api/body_budget.ts on its own: bytes are granted first come, first served,
 * given back once, and a request that cannot get its share in time is
 * refused with a retryable `busy`.
 */
import assert from "node:assert/strict";
import { BodyBudget } from "../api/body_budget.ts";
import { PoimenError } from "../core/errors.ts";

/** Lets queued promise callbacks run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

Deno.test("body budget: requests within it are granted at once, and release gives the bytes back once", async () => {
  const budget = new BodyBudget(100);
  const a = await budget.acquire(60, 1_000);
  const b = await budget.acquire(40, 1_000);
  assert.equal(budget.free, 0);
  a();
  a(); // a second release gives nothing back twice
  assert.equal(budget.free, 60);
  b();
  assert.equal(budget.free, 100);
});

Deno.test("body budget: a request waits for its share and is served in arrival order", async () => {
  const budget = new BodyBudget(100);
  const first = await budget.acquire(90, 1_000);
  const order: string[] = [];
  // The large one arrived first: the small one, which would fit now, waits behind it.
  const large = budget.acquire(80, 5_000).then((r) => (order.push("large"), r));
  const small = budget.acquire(10, 5_000).then((r) => (order.push("small"), r));
  await settle();
  assert.deepEqual(order, []);
  assert.equal(budget.waiting, 2);
  first();
  const releases = await Promise.all([large, small]);
  assert.deepEqual(order, ["large", "small"]);
  assert.equal(budget.free, 10);
  for (const r of releases) r();
  assert.equal(budget.free, 100);
});

Deno.test("body budget: a request that waits too long is refused busy (503, retryable), and those behind it go on", async () => {
  const budget = new BodyBudget(100);
  const held = await budget.acquire(100, 1_000);
  const refused = await budget.acquire(100, 30).then(
    () => assert.fail("granted"),
    (err) => err,
  );
  assert.ok(refused instanceof PoimenError);
  assert.equal(refused.code, "busy");
  assert.equal(refused.status, 503);
  assert.equal(refused.retryable, true);
  assert.equal(budget.waiting, 0);
  assert.equal(budget.free, 0, "a refused request holds nothing");
  held();
  const next = await budget.acquire(100, 1_000);
  assert.equal(budget.free, 0);
  next();
});

Deno.test("body budget: a request larger than the whole budget waits for all of it, not forever", async () => {
  const budget = new BodyBudget(100);
  const release = await budget.acquire(10_000, 1_000);
  assert.equal(budget.free, 0);
  release();
  assert.equal(budget.free, 100);
});
