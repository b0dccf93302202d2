/**
 * core/time.ts: `within` bounds a wait without leaving its timer behind.
 * These tests run with the op sanitizer on, which fails a test that ends
 * with a timer still pending (racing against a bare `delay` would).
 */
import assert from "node:assert/strict";
import { HOUR, within } from "../core/time.ts";

const SANITIZED = { sanitizeOps: true, sanitizeResources: true };

Deno.test(
  "time: within is true when the work finishes in time, and clears its timer",
  SANITIZED,
  async () => {
    assert.equal(await within(Promise.resolve("done"), HOUR), true);
  },
);

Deno.test("time: within is false when the time runs out first", SANITIZED, async () => {
  assert.equal(await within(new Promise(() => {}), 10), false);
});

Deno.test(
  "time: within rejects with the work's error when it fails in time",
  SANITIZED,
  async () => {
    const boom = new Error("boom");
    await assert.rejects(within(Promise.reject(boom), HOUR), (e) => e === boom);
  },
);
