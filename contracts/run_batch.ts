/**
 * The wire contract of batch admission (`POST /v1/runs` with an array), as
 * zod schemas beside contracts/runs.ts: the body and the answer, one result
 * per item. Depends on zod alone.
 */
import { z } from "zod";
import type * as Wire from "./wire.ts";
import { RUN_BATCH_MAX_ITEMS } from "./wire.ts";
import { Problem, Run, RunRequest } from "./runs.ts";

export { RUN_BATCH_MAX_ITEMS } from "./wire.ts";

/**
 * A batch admission's body: 1 to `RUN_BATCH_MAX_ITEMS` run requests. Only
 * the array is checked here; each item is validated on its own, so that one
 * bad item is that item's problem, not the batch's.
 */
export const RunBatch = z.array(RunRequest).min(1).max(RUN_BATCH_MAX_ITEMS).describe(
  `1 to ${RUN_BATCH_MAX_ITEMS} run requests, each admitted as a single one would be ` +
    "(an invalid item is its own problem, never the batch's)",
);

/** One item's answer in a batch admission. */
export const RunBatchResult = z.object({
  outcome: z.enum(["created", "replayed", "debounced", "problem"]).describe(
    "`debounced`: the item joined the pending run of its debounce key (docs/workflows.md#debounce)",
  ),
  status: z.number().int().describe(
    "What a single admission of the item would have answered: 201, 200 or the problem's status",
  ),
  run: Run.optional().describe("On `created`, `replayed` and `debounced`"),
  body_mismatch: z.boolean().optional().describe(
    "On `replayed`: true when the item differs from the first request's body",
  ),
  problem: Problem.optional().describe("On `problem`: why the item was not admitted"),
});
export type RunBatchResult = z.infer<typeof RunBatchResult>;

/** The answer to a batch admission (207). */
export const RunBatchAnswer = z.object({
  results: z.array(RunBatchResult).describe("One per item, in the items' order"),
});
export type RunBatchAnswer = z.infer<typeof RunBatchAnswer>;

// The plain types of wire.ts and the schemas above must describe the same
// shapes: a difference fails here.
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;
const sameShapes: [
  Same<RunBatchResult, Wire.RunBatchResult>,
  Same<RunBatchAnswer, Wire.RunBatchAnswer>,
] = [true, true];
void sameShapes;

/** Where one batch item came from, as a service token (the relay) says it in `Poimen-Sources`. */
export interface ItemSource {
  /** As a single request's `Poimen-Source`, without spaces or commas: `kafka:<topic>/<partition>/<offset>`. */
  source: string;
  /** The item's own W3C traceparent, when it has one. */
  traceparent?: string;
}

// An entry's source: printable ASCII without the list's separators.
const ENTRY_SOURCE = /^[\x21-\x2b\x2d-\x7e]{1,300}$/;

/**
 * The `Poimen-Sources` header of a batch: `<source>[ <traceparent>]` per
 * item, in the items' order, separated by commas. One header for the whole
 * batch (the relay's: each item is a Kafka message with its own place and
 * trace), kept apart from `Poimen-Source`, which names one request: a
 * message whose value is itself an array stays one request, refused.
 */
export function formatItemSources(items: readonly ItemSource[]): string {
  return items.map((i) => i.traceparent ? `${i.source} ${i.traceparent}` : i.source).join(",");
}

/**
 * The entries of a `Poimen-Sources` header, or why it is not one for `count`
 * items: the count differs, or an entry is malformed. A traceparent is
 * passed on as given; the API keeps only a valid one.
 */
export function parseItemSources(header: string, count: number): ItemSource[] | string {
  const entries = header.split(",");
  if (entries.length !== count) {
    return `${entries.length} entries for ${count} items: one entry per item, in order`;
  }
  const parsed: ItemSource[] = [];
  for (const [i, entry] of entries.entries()) {
    const [source, traceparent, extra] = entry.trim().split(" ");
    if (extra !== undefined || !ENTRY_SOURCE.test(source)) {
      return `entry ${i}: expected "<source>[ <traceparent>]", a source of 1–300 printable characters without spaces or commas`;
    }
    parsed.push(traceparent ? { source, traceparent } : { source });
  }
  return parsed;
}
