/**
 * The durable section's workflows (bench/durable_section.ts), hosted beside
 * `echo`: `bench.steps@1` makes ten `ctx.step` calls of an echo each, and
 * `bench.signal@1` waits for a signal `go` (suspended: no timeout) between
 * two steps.
 */
import { z } from "zod";
import { defineWorkflow } from "../../workflows/define.ts";
import { echo } from "../../workflows/builtin.ts";

/** Ten durable steps, each returning its number. */
export const steps = defineWorkflow({
  name: "bench.steps",
  version: 1,
  input: z.object({ n: z.number() }),
  handler: async ({ n }, ctx) => {
    let sum = 0;
    for (let i = 0; i < 10; i++) sum += await ctx.step("s", () => i);
    return { n, sum };
  },
});

/** A step, a suspended wait for signal `go`, then the step whose end the bench times. */
export const signalled = defineWorkflow({
  name: "bench.signal",
  version: 1,
  input: z.object({ n: z.number() }),
  handler: async ({ n }, ctx) => {
    await ctx.step("before", () => n);
    const go = await ctx.waitForSignal("go");
    return { n, after: await ctx.step("after", () => go?.signal_id ?? null) };
  },
});

export const hosted = [echo, steps, signalled];
