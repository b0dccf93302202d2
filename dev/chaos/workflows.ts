/**
 * What the chaos cluster's workers host (`main.ts worker --workflows
 * dev/chaos/workflows.ts`): a `--workflows` module replaces the built-ins,
 * so the ones the workload uses (echo, for its runs and its poison) are
 * re-exported, beside the limited workflow of dev/chaos/plan.ts' KEYED:
 * at most KEYED.limit running per tenant and `input.group`, each run
 * sleeping its `input.ms`; and the durable workflow of DURABLE.
 */
import { z } from "zod";
import { delay } from "../../core/time.ts";
import { defineWorkflow, type Workflow } from "../../workflows/define.ts";
import { createPool, type Sql } from "../../db/pool.ts";
import { DURABLE, KEYED, PARENT } from "./plan.ts";
import { echo } from "../../workflows/builtin.ts";
import { insertStepCall } from "./step_calls.ts";

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

// The steps' own connections to the chaos database, by URL: handlers get
// no environment, so each run's input names it.
const pools = new Map<string, Sql>();
function callsPool(url: string): Sql {
  let pool = pools.get(url);
  if (pool === undefined) {
    pool = createPool({ url, max: 4, applicationName: "poimen-chaos-steps" });
    pools.set(url, pool);
  }
  return pool;
}

/**
 * `chaos.durable@1`: a step, a sleep of `sleep_ms` (long enough to suspend
 * the run), two more steps. Each step records its call (the side effect
 * that must happen once) and returns the call's id; the result holds them.
 */
export const durable: Workflow<
  { i: number; key: string; sleep_ms: number; calls_url: string }
> = defineWorkflow({
  name: DURABLE.workflow,
  version: 1,
  input: z.object({
    i: z.number().int(),
    key: z.string(),
    sleep_ms: z.number().int().min(0).max(60_000),
    calls_url: z.string().min(1),
  }),
  async handler({ key, sleep_ms, calls_url }, ctx) {
    const [first, ...rest] = DURABLE.steps;
    const call = (step: string) =>
      ctx.step(
        step,
        (stepKey) =>
          insertStepCall(callsPool(calls_url), {
            runId: ctx.runId,
            step,
            stepKey,
            attempt: ctx.attempt,
          }),
        // A Postgres fault breaks the insert: tried again within the attempt.
        { retries: 5 },
      );
    const result: Record<string, unknown> = { key };
    result[first] = await call(first);
    await ctx.sleep(DURABLE.sleep, sleep_ms);
    for (const step of rest) result[step] = await call(step);
    return result;
  },
});

/**
 * `chaos.parent@1`: `children` children of echo through `ctx.map`, then one
 * more through `ctx.start` and its `result()`; returns every child's `j`,
 * read from the children's outputs.
 */
export const parent: Workflow<{ i: number; key: string; children: number }> = defineWorkflow({
  name: PARENT.workflow,
  version: 1,
  input: z.object({
    i: z.number().int(),
    key: z.string(),
    children: z.number().int().min(1).max(100),
  }),
  async handler({ key, children }, ctx) {
    const inputs = Array.from({ length: children }, (_, j) => ({ parent: key, j }));
    const parts = await ctx.map(PARENT.map, echo, inputs) as { j: number }[];
    const solo = await ctx.start(PARENT.solo, echo, { parent: key, j: children });
    const last = await solo.result() as { j: number };
    return { key, js: [...parts.map((p) => p.j), last.j] };
  },
});
