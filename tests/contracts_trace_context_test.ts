/**
 * One rule for a `traceparent` (contracts/trace_context.ts), W3C Trace
 * Context's for a receiver, and every part of poimen that reads one applies
 * it: the API and the worker (core/tracing.ts), the relay
 * (relay/api_client.ts) and the dispatch client (client/dispatch.ts).
 */
import assert from "node:assert/strict";
import { isTraceparent } from "../contracts/trace_context.ts";
import { validTraceparent } from "../core/tracing.ts";
import { traceHeaders } from "../relay/api_client.ts";
import { isTraceparent as clientIsTraceparent, newTraceparent } from "../client/dispatch.ts";

const PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

const VALID = [
  PARENT,
  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
  // A later version may append fields after a dash.
  `01${PARENT.slice(2)}`,
  `01${PARENT.slice(2)}-x`,
  `cc${PARENT.slice(2)}-what-the-future-will-be-like`,
];

const INVALID = [
  "",
  "garbage",
  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
  PARENT.toUpperCase(),
  ` ${PARENT}`,
  `${PARENT} `,
  `${PARENT}\n`,
  `${PARENT}\r\nx-evil: 1`,
  `${PARENT}\u0000`,
  // Version 00 has exactly four fields.
  `${PARENT}-extra`,
  `${PARENT}-`,
  // Version ff is invalid.
  `ff${PARENT.slice(2)}`,
  `ff${PARENT.slice(2)}-x`,
  `00-${"0".repeat(32)}-b7ad6b7169203331-01`,
  `00-0af7651916cd43dd8448eb211c80319c-${"0".repeat(16)}-01`,
  `01${PARENT.slice(2)}-é`,
  "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
  "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
  "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
  "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
  "💩",
  "x".repeat(10_000),
];

Deno.test("traceparent: the rule accepts a receiver's valid values and refuses the rest", () => {
  for (const v of VALID) assert.equal(isTraceparent(v), true, JSON.stringify(v));
  for (const v of INVALID) assert.equal(isTraceparent(v), false, JSON.stringify(v.slice(0, 80)));
  for (let i = 0; i < 100; i++) {
    const made = newTraceparent();
    assert.ok(isTraceparent(made), made);
  }
});

Deno.test("traceparent: the API, the worker, the relay and the dispatch client apply that one rule", () => {
  for (const v of [...VALID, ...INVALID]) {
    const valid = isTraceparent(v);
    const shown = JSON.stringify(v.slice(0, 80));
    assert.equal(validTraceparent(v), valid ? v : undefined, `core/tracing.ts: ${shown}`);
    assert.deepEqual(
      traceHeaders(v, undefined),
      valid ? { traceparent: v } : {},
      `relay: ${shown}`,
    );
    assert.equal(clientIsTraceparent(v), valid, `client/dispatch.ts: ${shown}`);
  }
});
