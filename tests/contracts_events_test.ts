/**
 * The event contract and its documentation agree: docs/runs.md's table
 * lists every event type poimen writes, each with exactly its payload's
 * keys (contracts/events.ts), and nothing else.
 */
import assert from "node:assert/strict";
import type { z } from "zod";
import { RUN_EVENT_PAYLOADS } from "../contracts/events.ts";
import { RUN_EVENT_TYPES } from "../contracts/event_types.ts";
import { section } from "./support/markdown.ts";

const RUNS_MD = new URL("../docs/runs.md", import.meta.url);

/** The table's rows: type → the payload keys it lists. */
function documented(text: string): Map<string, string[]> {
  const rows = new Map<string, string[]>();
  for (const line of section(text, "Events").split("\n")) {
    const m = /^\|\s*`([a-z]+\.[a-z_]+)`\s*\|([^|]*)\|/.exec(line);
    if (m) rows.set(m[1], [...m[2].matchAll(/`([a-z_]+)`/g)].map((k) => k[1]));
  }
  return rows;
}

Deno.test("events: docs/runs.md lists every event type with exactly its payload's keys", async () => {
  const rows = documented(await Deno.readTextFile(RUNS_MD));
  assert.deepEqual([...rows.keys()].sort(), [...RUN_EVENT_TYPES].sort());
  for (const type of RUN_EVENT_TYPES) {
    const schema = RUN_EVENT_PAYLOADS[type] as unknown as z.ZodObject;
    assert.deepEqual(rows.get(type)?.sort(), Object.keys(schema.shape).sort(), type);
  }
});

Deno.test("events: the docs check reads a table, and sees a key missing from it", () => {
  const table = "## Events\n\n| `type` | payload |\n| --- | --- |\n" +
    "| `run.started` | `attempt`, `worker` |\n| `run.failed` | `attempt` |\n";
  const rows = documented(table);
  assert.deepEqual(rows.get("run.started"), ["attempt", "worker"]);
  const failed = RUN_EVENT_PAYLOADS["run.failed"] as unknown as z.ZodObject;
  assert.notDeepEqual(rows.get("run.failed"), Object.keys(failed.shape).sort());
});
