/**
 * The bench's limited workflow, hosted by a stock worker process with
 * `--workflows bench/keyed_workflows.ts`: at most one run at a time per
 * value of `k` (the bench admits 1,000 keys), each run as cheap as `echo`.
 */
import { z } from "zod";
import { defineWorkflow } from "../workflows/define.ts";

export const keyed = defineWorkflow({
  name: "bench.keyed",
  version: 1,
  input: z.object({ k: z.number().int(), n: z.number().int() }),
  concurrency: { limit: 1, key: "/k" },
  handler: (input) => Promise.resolve(input),
});
