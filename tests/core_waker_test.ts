/**
 * core/waker.ts on its own: pokes become NOTIFYs, at most one in flight and
 * at most one follow-up however many pokes arrive meanwhile. The notify here
 * is a recorder whose calls the test finishes one by one.
 */
import assert from "node:assert/strict";
import { Waker } from "../core/waker.ts";

/** A notify the test holds open; `next()` resolves with the next call not yet handed out. */
function heldNotify() {
  const calls: { finish(): void; fail(error: unknown): void }[] = [];
  let handed = 0;
  let wake = () => {};
  const notify = () =>
    new Promise<void>((resolve, reject) => {
      calls.push({ finish: resolve, fail: reject });
      wake();
    });
  return {
    notify,
    calls,
    async next() {
      while (handed >= calls.length) await new Promise<void>((r) => (wake = r));
      return calls[handed++];
    },
  };
}

/** Lets queued promise callbacks (the waker's `finally`) run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

const noErrors = (err: unknown) => assert.fail(`unexpected notify error: ${err}`);

Deno.test("waker: a poke notifies at once", () => {
  const h = heldNotify();
  new Waker(h.notify, noErrors).poke();
  assert.equal(h.calls.length, 1);
  h.calls[0].finish();
});

Deno.test("waker: pokes during a notify coalesce into exactly one follow-up", async () => {
  const h = heldNotify();
  const waker = new Waker(h.notify, noErrors);
  waker.poke();
  for (let i = 0; i < 50; i++) waker.poke();
  await settle();
  assert.equal(h.calls.length, 1, "one notify in flight at a time");

  (await h.next()).finish();
  const followUp = await h.next();
  await settle();
  assert.equal(h.calls.length, 2, "fifty pokes, one follow-up");
  followUp.finish();
  await settle();
  assert.equal(h.calls.length, 2, "nothing more after the follow-up: no poke came meanwhile");
});

Deno.test("waker: a poke after the notify finished notifies again", async () => {
  const h = heldNotify();
  const waker = new Waker(h.notify, noErrors);
  waker.poke();
  (await h.next()).finish();
  await settle();
  waker.poke();
  (await h.next()).finish();
  await settle();
  assert.equal(h.calls.length, 2);
});

Deno.test("waker: a failed notify goes to onError, and later pokes still notify", async () => {
  const h = heldNotify();
  const errors: unknown[] = [];
  const waker = new Waker(h.notify, (err) => errors.push(err));
  waker.poke();
  waker.poke(); // waits for the failing one
  const down = new Error("connection lost");
  (await h.next()).fail(down);
  // The follow-up still happens: a failure must not leave the waker stuck in flight.
  (await h.next()).finish();
  await settle();
  assert.deepEqual(errors, [down]);
  waker.poke();
  (await h.next()).finish();
  await settle();
  assert.equal(h.calls.length, 3);
  assert.deepEqual(errors, [down]);
});

Deno.test("waker: poke never waits for the notify and never throws", () => {
  const waker = new Waker(() => new Promise<void>(() => {}), noErrors);
  // A notify that never settles: poke still returns at once, every time.
  for (let i = 0; i < 3; i++) assert.equal(waker.poke(), undefined);
});

Deno.test("waker: with a minimum interval, the first poke goes at once and the next no sooner than the interval after it", async () => {
  const h = heldNotify();
  const sentAt: number[] = [];
  const notify = () => (sentAt.push(performance.now()), h.notify());
  const waker = new Waker(notify, noErrors, 50);
  waker.poke();
  assert.equal(h.calls.length, 1, "a quiet waker notifies at once");
  (await h.next()).finish();
  await settle();
  for (let i = 0; i < 10; i++) waker.poke();
  await settle();
  assert.equal(h.calls.length, 1, "within the interval: nothing yet");
  // Ten pokes, one notify, sent once the interval since the first has passed.
  (await h.next()).finish();
  await settle();
  assert.equal(h.calls.length, 2);
  assert.ok(sentAt[1] - sentAt[0] >= 49, `${sentAt[1] - sentAt[0]} ms apart`);
});
