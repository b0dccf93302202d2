/**
 * core/batcher.ts on its own: which items go into which flush, how many
 * flushes run at once, and who fails when a flush fails. The flush here is a
 * recorder whose calls the test finishes one by one, so every interleaving
 * is chosen by the test, not by timing.
 */
import assert from "node:assert/strict";
import { Batcher, type BatcherOptions } from "../core/batcher.ts";

/** A flush call the test holds open until it calls `finish` or `fail`. */
interface Call<T, R> {
  items: T[];
  finish(results: (R | Error)[]): void;
  fail(error: unknown): void;
}

/**
 * A flush that records its calls and answers only when told; `next()`
 * resolves with the next call not yet handed out (already made or future).
 */
function heldFlush<T, R>() {
  const calls: Call<T, R>[] = [];
  let handed = 0;
  let wake = () => {};
  let inFlight = 0;
  let maxInFlight = 0;
  const flush = (items: T[]) =>
    new Promise<(R | Error)[]>((resolve, reject) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      const done = () => inFlight--;
      calls.push({
        items,
        finish: (r) => (done(), resolve(r)),
        fail: (e) => (done(), reject(e)),
      });
      wake();
    });
  return {
    flush,
    calls,
    get maxInFlight() {
      return maxInFlight;
    },
    async next(): Promise<Call<T, R>> {
      while (handed >= calls.length) await new Promise<void>((r) => (wake = r));
      return calls[handed++];
    },
  };
}

/** Lets queued promise callbacks (the batcher's `finally` and re-pump) run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

/** How `p` ended, without throwing. */
function outcome<R>(p: Promise<R>): Promise<{ value: R } | { error: unknown }> {
  return p.then((value) => ({ value }), (error) => ({ error }));
}

const double = (items: number[]) => items.map((n) => n * 2);

Deno.test("batcher: the first item flushes at once, alone, with no timer to wait for", async () => {
  const h = heldFlush<number, number>();
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 });
  const result = batcher.submit(1);
  // Synchronously: submit() started the flush before returning.
  assert.deepEqual(h.calls.map((c) => c.items), [[1]]);
  (await h.next()).finish([2]);
  assert.equal(await result, 2);
  await settle();
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: with gatherTurn, items submitted in one turn of the event loop share one flush", async () => {
  const h = heldFlush<number, number>();
  const sizes: number[] = [];
  const batcher = new Batcher(h.flush, {
    maxBatch: 10,
    maxConcurrent: 2,
    gatherTurn: true,
    onFlush: (n) => sizes.push(n),
  });
  // Callers resuming in the same turn, some after a few awaits of their own
  // (like runs a worker claimed together, each finishing its handler).
  const results = [1, 2, 3, 4].map(async (n) => {
    for (let i = 0; i < n * 3; i++) await Promise.resolve();
    return await batcher.submit(n);
  });
  await settle();
  assert.equal(h.calls.length, 0, "nothing flushes in the turn the items were submitted");

  const only = await h.next();
  assert.deepEqual(only.items, [1, 2, 3, 4], "one flush, though a second slot was free");
  only.finish(double(only.items));
  assert.deepEqual(await Promise.all(results), [2, 4, 6, 8]);
  assert.deepEqual(sizes, [4]);

  // A later turn's item gets a flush of its own, and is not left waiting.
  const later = batcher.submit(5);
  (await h.next()).finish([10]);
  assert.equal(await later, 10);
});

Deno.test("batcher: with spareAfterMs, a second flush starts only once the one in flight has taken longer", async () => {
  const h = heldFlush<number, number>();
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 2, spareAfterMs: 40 });
  const started = performance.now();
  const one = batcher.submit(1);
  const first = await h.next();
  const two = batcher.submit(2);
  await settle();
  assert.equal(h.calls.length, 1, "the spare slot stays shut while the first flush is young");
  // The first flush is slow: the spare slot opens for the item behind it.
  const second = await h.next();
  assert.ok(performance.now() - started >= 39, `opened after ${performance.now() - started} ms`);
  assert.deepEqual(second.items, [2]);
  second.finish([4]);
  assert.equal(await two, 4);
  first.finish([2]);
  assert.equal(await one, 2);

  // A quick flush: the item behind it waits for it, not for the spare slot.
  const three = batcher.submit(3);
  const quick = await h.next();
  const four = batcher.submit(4);
  const five = batcher.submit(5);
  await settle();
  assert.equal(h.calls.length, 3);
  quick.finish([6]);
  const next = await h.next();
  assert.deepEqual(next.items, [4, 5], "one batch after the quick flush");
  next.finish([8, 10]);
  assert.deepEqual(await Promise.all([three, four, five]), [6, 8, 10]);
});

Deno.test("batcher: items arriving while a flush is in flight coalesce into the next one", async () => {
  const h = heldFlush<number, number>();
  const sizes: number[] = [];
  const opts: BatcherOptions = { maxBatch: 10, maxConcurrent: 1, onFlush: (n) => sizes.push(n) };
  const batcher = new Batcher(h.flush, opts);
  const results = [1, 2, 3, 4, 5, 6].map((n) => batcher.submit(n));
  assert.equal(batcher.pending, 6);

  const first = await h.next();
  assert.deepEqual(first.items, [1]);
  await settle();
  assert.equal(h.calls.length, 1, "nothing else flushes while the only slot is taken");
  first.finish(double(first.items));

  const second = await h.next();
  assert.deepEqual(second.items, [2, 3, 4, 5, 6], "the waiting items, in order, as one batch");
  second.finish(double(second.items));

  // Each caller gets its own item's result.
  assert.deepEqual(await Promise.all(results), [2, 4, 6, 8, 10, 12]);
  assert.deepEqual(sizes, [1, 5]);
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: no flush holds more than maxBatch items", async () => {
  const h = heldFlush<number, number>();
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 });
  const results = Array.from({ length: 26 }, (_, i) => batcher.submit(i));
  const batches: number[][] = [];
  while (batches.flat().length < 26) {
    const call = await h.next();
    batches.push(call.items);
    call.finish(double(call.items));
  }
  assert.deepEqual(batches.map((b) => b.length), [1, 10, 10, 5]);
  assert.deepEqual(batches.flat(), Array.from({ length: 26 }, (_, i) => i), "submission order");
  assert.deepEqual(await Promise.all(results), Array.from({ length: 26 }, (_, i) => i * 2));
});

Deno.test("batcher: at most maxConcurrent flushes are in flight; a freed slot is used at once", async () => {
  const h = heldFlush<number, number>();
  const batcher = new Batcher(h.flush, { maxBatch: 2, maxConcurrent: 3 });
  const results = Array.from({ length: 12 }, (_, i) => batcher.submit(i));
  await settle();
  // The first three found a free slot each; the other nine wait.
  assert.deepEqual(h.calls.map((c) => c.items), [[0], [1], [2]]);
  assert.equal(batcher.pending, 12);

  // Finishing one flush starts exactly one more, with the next maxBatch items.
  const first = await h.next();
  first.finish(double(first.items));
  await settle();
  assert.deepEqual(h.calls.slice(3).map((c) => c.items), [[3, 4]]);

  let flushed = 1;
  while (flushed < 12) {
    const call = await h.next();
    flushed += call.items.length;
    call.finish(double(call.items));
  }
  assert.deepEqual(await Promise.all(results), Array.from({ length: 12 }, (_, i) => i * 2));
  assert.equal(h.maxInFlight, 3);
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: an Error in one item's place fails that item only", async () => {
  const h = heldFlush<string, string>();
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 });
  const blocker = batcher.submit("first");
  const results = ["a", "b", "c"].map((s) => outcome(batcher.submit(s)));
  (await h.next()).finish(["first!"]);
  await blocker;
  const call = await h.next();
  assert.deepEqual(call.items, ["a", "b", "c"]);
  const refused = new Error("b is refused");
  call.finish(["a!", refused, "c!"]);
  assert.deepEqual(await Promise.all(results), [
    { value: "a!" },
    { error: refused },
    { value: "c!" },
  ]);
  assert.equal(h.calls.length, 2, "no retry: the flush itself succeeded");
});

Deno.test("batcher: a failed batch is bisected until the bad item fails alone", async () => {
  const h = heldFlush<string, string>();
  const isolated: unknown[] = [];
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 }, (err) => {
    isolated.push(err);
    return true;
  });
  const blocker = batcher.submit("first");
  const results = ["a", "bad", "c"].map((s) => outcome(batcher.submit(s)));
  (await h.next()).finish(["first!"]);
  await blocker;

  const batchError = new Error("check constraint violated by one row");
  const batch = await h.next();
  assert.deepEqual(batch.items, ["a", "bad", "c"]);
  batch.fail(batchError);

  // Halves, one at a time through the one slot: [a, bad] fails again and is halved too.
  const badError = new Error("bad violates the check");
  const seen: string[][] = [];
  while (seen.length < 4) {
    const call = await h.next();
    seen.push(call.items);
    if (call.items.includes("bad")) call.fail(badError);
    else call.finish(call.items.map((s) => `${s}!`));
  }
  assert.deepEqual(seen, [["a", "bad"], ["a"], ["bad"], ["c"]]);
  assert.deepEqual(isolated, [batchError, badError], "isolate() was asked about each failure");
  assert.deepEqual(await Promise.all(results), [
    { value: "a!" },
    { error: badError },
    { value: "c!" },
  ]);
  assert.equal(h.calls.length, 6);
  await settle();
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: isolating a poisoned item stays within maxConcurrent and costs one caller", async () => {
  const h = heldFlush<number, number>();
  const maxConcurrent = 2;
  const batcher = new Batcher(h.flush, { maxBatch: 64, maxConcurrent });
  // Two blockers take both slots; 64 items behind them form one batch with one poisoned item.
  const blockers = [batcher.submit(-1), batcher.submit(-2)];
  const results = Array.from({ length: 64 }, (_, i) => outcome(batcher.submit(i)));
  for (let i = 0; i < 2; i++) {
    const call = await h.next();
    call.finish(double(call.items));
  }
  await Promise.all(blockers);
  const poison = new Error("item 37 is poisoned");
  let answered = 0;
  while (answered < 64) {
    const call = await h.next();
    // Answer asynchronously, so several flushes may be in flight if the batcher let them.
    await settle();
    if (call.items.includes(37)) call.fail(poison);
    else {
      answered += call.items.length;
      call.finish(double(call.items));
    }
    if (call.items.length === 1 && call.items[0] === 37) answered++;
  }
  const got = await Promise.all(results);
  assert.deepEqual(got.filter((r) => "error" in r), [{ error: poison }], "one caller fails");
  assert.equal(got.filter((r) => "value" in r).length, 63);
  assert.ok(h.maxInFlight <= maxConcurrent, `${h.maxInFlight} flushes in flight at once`);
  // 2 blockers + the batch + 2 per halving level (log2 64 = 6): not 64 singles.
  assert.ok(h.calls.length <= 2 + 1 + 2 * 6, `${h.calls.length} flushes`);
  await settle();
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: an error isolate() rules out fails the whole batch, without retries", async () => {
  const h = heldFlush<string, string>();
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 }, () => false);
  const blocker = batcher.submit("first");
  const results = ["a", "b"].map((s) => outcome(batcher.submit(s)));
  (await h.next()).finish(["first!"]);
  await blocker;
  const down = new Error("connection refused");
  (await h.next()).fail(down);
  assert.deepEqual(await Promise.all(results), [{ error: down }, { error: down }]);
  await settle();
  assert.equal(h.calls.length, 2, "no item was retried");
  assert.equal(batcher.pending, 0);
});

Deno.test("batcher: a failed flush of one item fails it without a retry", async () => {
  const h = heldFlush<string, string>();
  let asked = 0;
  const batcher = new Batcher(h.flush, { maxBatch: 10, maxConcurrent: 1 }, () => (asked++, true));
  const result = outcome(batcher.submit("only"));
  const error = new Error("refused");
  (await h.next()).fail(error);
  assert.deepEqual(await result, { error });
  await settle();
  assert.equal(h.calls.length, 1);
  assert.equal(asked, 0, "nothing to isolate in a batch of one");
});
