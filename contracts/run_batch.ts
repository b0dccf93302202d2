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
