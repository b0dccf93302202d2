/**
 * What the chaos cluster's workers host (`main.ts worker --workflows
 * dev/chaos/workflows.ts`): a `--workflows` module replaces the built-ins,
 * so the ones the workload uses (echo, for its runs and its poison) are
 * re-exported, beside the limited workflow of dev/chaos/plan.ts' KEYED:
 * at most KEYED.limit running per tenant and `input.group`, each run
 * sleeping its `input.ms`.
 */
import { z } from "zod";
import { delay } from "../../core/time.ts";
import { defineWorkflow, type Workflow } from "../../workflows/define.ts";
import { KEYED } from "./plan.ts";

export { echo, fail, sleep } from "../../workflows/builtin.ts";

/** `chaos.keyed@1`: sleeps `ms`, limited per `group`; returns its group and the time slept. */
export const keyed: Workflow<{ i: number; key: string; group: string; ms: number }> =
  defineWorkflow({
    name: KEYED.workflow,
    version: 1,
    input: z.object({
      i: z.number().int(),
      key: z.string(),
      group: z.string(),
      ms: z.number().int().min(0).max(60_000),
    }),
    concurrency: { limit: KEYED.limit, key: KEYED.pointer },
    async handler({ group, ms }, ctx) {
      await delay(ms, ctx.signal);
      // A lost lease or a shutdown: the attempt ends here, the run is retried elsewhere.
      if (ctx.signal.aborted) throw new Error("chaos.keyed interrupted");
      return { group, slept_ms: ms };
    },
  });
