/**
 * api/body_budget.ts on its own: bytes are granted first come, first served,
 * given back once, and a request that cannot get its share in time is
 * refused with a retryable `busy`; one tenant holds at most its share,
 * tenants leave the service reserve, and a caller waits only behind its own.
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

Deno.test("body budget: one tenant holds at most its share; its further requests wait, another tenant's are granted at once", async () => {
  const budget = new BodyBudget(400, { tenantBytes: 100 });
  // Four uploads of tenant a, each declaring its whole share.
  const first = budget.tryAcquire(100, "a");
  assert.ok(first);
  const queued = [1, 2, 3].map(() => budget.acquire(100, 5_000, "a"));
  await settle();
  assert.equal(budget.waiting, 3);
  assert.equal(budget.heldBy("a"), 100);
  // Tenant b's small body is not held back by them.
  const b = budget.tryAcquire(40, "b");
  assert.ok(b, "tenant b granted at once");
  assert.equal(budget.heldBy("b"), 40);
  b();
  // Tenant a's requests go on one at a time, in order, as its own give theirs back.
  first();
  const second = await queued[0];
  assert.equal(budget.waiting, 2);
  second();
  (await queued[1])();
  (await queued[2])();
  assert.equal(budget.free, 400);
  assert.equal(budget.heldBy("a"), 0);
});

Deno.test("body budget: a small request is not queued behind another caller's larger waiting one", async () => {
  const budget = new BodyBudget(300, { tenantBytes: 200 });
  const a = budget.tryAcquire(200, "a")!;
  const b = budget.tryAcquire(50, "b")!;
  // Tenant c's 200 wait for a's or b's bytes; d's 40 fit now and go ahead.
  let large = false;
  const c = budget.acquire(200, 5_000, "c").then((r) => (large = true, r));
  await settle();
  assert.equal(budget.waiting, 1);
  const d = budget.tryAcquire(40, "d");
  assert.ok(d, "tenant d is not behind tenant c");
  assert.equal(large, false);
  d();
  a();
  (await c)();
  b();
  assert.equal(budget.free, 300);
});

Deno.test("body budget: tenants together leave the service reserve, so a service token's request is granted while tenants wait", async () => {
  const budget = new BodyBudget(400, { tenantBytes: 100, serviceBytes: 100 });
  const held = ["a", "b", "c"].map((t) => budget.tryAcquire(100, t)!);
  assert.equal(budget.free, 100);
  // A fourth tenant finds the tenants' part full and waits …
  const d = budget.acquire(10, 5_000, "d");
  await settle();
  assert.equal(budget.waiting, 1);
  // … the relay (a service token, no tenant) does not.
  const relay = budget.tryAcquire(100);
  assert.ok(relay, "the service reserve is free");
  relay();
  held[0]();
  (await d)();
  for (const r of held.slice(1)) r();
  assert.equal(budget.free, 400);
});

Deno.test("body budget: waiting tenants take turns as bytes come back", async () => {
  const budget = new BodyBudget(100, { tenantBytes: 100 });
  const all = budget.tryAcquire(100, "x")!;
  const order: string[] = [];
  const waits = [["a", 1], ["a", 2], ["b", 1], ["a", 3], ["b", 2]].map(([t, n]) =>
    budget.acquire(50, 5_000, t as string).then((r) => (order.push(`${t}${n}`), r))
  );
  await settle();
  all();
  // 100 bytes back: a's first and b's first, not a's first two.
  await settle();
  assert.deepEqual(order, ["a1", "b1"]);
  const [a1, b1] = await Promise.all([waits[0], waits[2]]);
  a1();
  b1();
  await settle();
  assert.deepEqual(order, ["a1", "b1", "a2", "b2"]);
  const [a2, b2] = await Promise.all([waits[1], waits[4]]);
  a2();
  b2();
  (await waits[3])();
  assert.deepEqual(order, ["a1", "b1", "a2", "b2", "a3"]);
  assert.equal(budget.free, 100);
  assert.equal(budget.waiting, 0);
});

Deno.test("body budget: a waiting request whose client goes away leaves the queue, and those behind it go on", async () => {
  const budget = new BodyBudget(100, { tenantBytes: 100 });
  const held = budget.tryAcquire(100, "a")!;
  const gone = new AbortController();
  const left = budget.acquire(100, 5_000, "a", gone.signal).then(
    () => assert.fail("granted"),
    (err) => err,
  );
  const next = budget.acquire(50, 5_000, "a");
  await settle();
  assert.equal(budget.waiting, 2);
  gone.abort();
  const err = await left;
  assert.ok(err instanceof PoimenError);
  assert.equal(err.code, "body-unreadable");
  assert.equal(budget.waiting, 1);
  held();
  (await next)();
  assert.equal(budget.free, 100);
});

Deno.test("body budget: however tenants and service tokens mix, what is held stays within the total and each share", async () => {
  const budget = new BodyBudget(1000, { tenantBytes: 300, serviceBytes: 200 });
  const tenants = ["a", "b", "c", "d", undefined];
  let seed = 27;
  const random = (n: number) => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % n;
  const held: (() => void)[] = [];
  const pending: Promise<void>[] = [];
  let granted = 0;
  const check = () => {
    assert.ok(budget.free >= 0 && budget.free <= budget.total, `free ${budget.free}`);
    let tenantsHeld = 0;
    for (const t of tenants.slice(0, 4)) {
      assert.ok(budget.heldBy(t!) <= budget.tenantShare, `${t} holds ${budget.heldBy(t!)}`);
      tenantsHeld += budget.heldBy(t!);
    }
    assert.ok(tenantsHeld <= budget.total - budget.serviceReserve, `tenants hold ${tenantsHeld}`);
  };
  for (let i = 0; i < 2_000; i++) {
    if (held.length > 0 && random(3) === 0) {
      held.splice(random(held.length), 1)[0]();
    } else {
      pending.push(
        budget.acquire(1 + random(400), 60_000, tenants[random(tenants.length)]).then((r) => {
          granted++;
          held.push(r);
          check();
        }),
      );
    }
    check();
    await settle();
  }
  while (held.length > 0 || budget.waiting > 0) {
    held.pop()?.();
    await settle();
  }
  await Promise.all(pending);
  assert.equal(granted, pending.length, "every request was granted in the end");
  assert.equal(budget.free, budget.total);
});
