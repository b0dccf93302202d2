/** Run ids: UUIDv7 that keep admission order even within one millisecond. */
import assert from "node:assert/strict";
import { parse } from "uuid";
import { newRunId, UUID_PATTERN } from "../core/uuid.ts";

/** Runs `fn` with `Date.now` answering `clock()`: time made to stand still or step back. */
function withClock<T>(clock: () => number, fn: () => T): T {
  const real = Date.now;
  Date.now = clock;
  try {
    return fn();
  } finally {
    Date.now = real;
  }
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}

/** The 48-bit millisecond timestamp an id starts with. */
function millisOf(id: string): number {
  return parseInt(id.replaceAll("-", "").slice(0, 12), 16);
}

function assertStrictlyIncreasing(ids: string[]) {
  for (let i = 1; i < ids.length; i++) {
    assert.ok(ids[i - 1] < ids[i], `id ${i} (${ids[i]}) is not after ${ids[i - 1]} as a string`);
    assert.ok(
      compareBytes(parse(ids[i - 1]), parse(ids[i])) < 0,
      `id ${i} (${ids[i]}) is not after ${ids[i - 1]} as bytes`,
    );
  }
}

Deno.test("uuid: 10,000 run ids made within one millisecond are strictly increasing as strings and bytes", () => {
  // Ahead of any id made before, so every id carries exactly this millisecond.
  const ms = Date.now() + 60_000;
  const ids = withClock(() => ms, () => Array.from({ length: 10_000 }, () => newRunId()));
  assert.equal(new Set(ids).size, ids.length);
  assert.ok(ids.every((id) => millisOf(id) === ms), "every id carries the one millisecond");
  assertStrictlyIncreasing(ids);
});

Deno.test("uuid: run ids keep increasing when the clock steps back", () => {
  let ms = Date.now() + 120_000;
  const ids = withClock(() => ms, () => {
    const before = [newRunId(), newRunId()];
    ms -= 5_000;
    return [...before, newRunId(), newRunId()];
  });
  assertStrictlyIncreasing(ids);
});

Deno.test("uuid: a run id is a lowercase version 7, variant 10 UUID", () => {
  const id = newRunId();
  assert.match(id, UUID_PATTERN);
  assert.equal(id[14], "7");
  assert.match(id[19], /[89ab]/);
});
