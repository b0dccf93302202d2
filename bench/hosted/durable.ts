/**
 * The durable section's workflows (bench/durable_section.ts), hosted beside
 * `echo`: `bench.steps@1` makes ten `ctx.step` calls of an echo each, and
 * `bench.signal@1` waits for a signal `go` (suspended: no timeout) between
 * two steps; `bench.fanout@1` maps its input's `n` children of `echo`.
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

/** A fan-out: `n` children of `echo` through one `ctx.map`, the parent waiting once for them all. */
export const fanout = defineWorkflow({
  name: "bench.fanout",
  version: 1,
  input: z.object({ n: z.number().int(), tag: z.string() }),
  handler: async ({ n, tag }, ctx) => {
    const outs = await ctx.map("c", echo, Array.from({ length: n }, (_, i) => ({ tag, i })));
    return { n: outs.length };
  },
});

export const hosted = [echo, steps, signalled, fanout];
