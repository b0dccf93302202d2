/**
 * A worker process of durable workflows for tests/it_durable_test.ts, run
 * as a team runs its own (`runWorker`, configured by the environment). Its
 * handlers have side effects outside poimen: each step writes a row through
 * a connection of its own (SIDE_EFFECTS_URL), so the test can count how
 * often each step really ran; `it.three` stops at each step boundary once
 * (a row in `parked`) and hangs there until the test kills the process.
 */
import postgres from "postgres";
import { z } from "zod";
import { defineWorkflow } from "../../workflows/define.ts";
import { runWorker } from "../../worker/run_worker.ts";

const side = postgres(Deno.env.get("SIDE_EFFECTS_URL") ?? "", { max: 2, onnotice: () => {} });

/** A row per step call, through the handler's own connection: the step's side effect. */
async function sideEffect(runId: string, step: string, key: string): Promise<void> {
  await side`insert into side_effects (run_id, step, step_key) values (${runId}, ${step}, ${key})`;
}

/** `it.three@1`: three steps; at each boundary (0: before the first) it hangs, once. */
export const three = defineWorkflow({
  name: "it.three",
  version: 1,
  input: z.object({ order: z.string() }),
  maxAttempts: 10,
  async handler({ order }, ctx) {
    const boundary = async (n: number) => {
      const [first] = await side`
        insert into parked (run_id, boundary, worker) values (${ctx.runId}, ${n}, ${Deno.pid})
        on conflict do nothing returning 1`;
      // The first time here: hang until the test kills this process.
      if (first) await new Promise(() => {});
    };
    await boundary(0);
    const results: string[] = [];
    for (const name of ["reserve", "charge", "ship"]) {
      results.push(
        await ctx.step(name, async () => {
          await sideEffect(ctx.runId, name, ctx.stepKey);
          return `${name}:${order}`;
        }),
      );
      await boundary(results.length);
    }
    return results;
  },
});

/** `it.sleeper@1`: a step, a long sleep, a step; at most one running at once per tenant. */
export const sleeper = defineWorkflow({
  name: "it.sleeper",
  version: 1,
  input: z.object({ ms: z.number().int() }),
  concurrency: { limit: 1 },
  async handler({ ms }, ctx) {
    const before = await ctx.step("before", async () => {
      await sideEffect(ctx.runId, "before", ctx.stepKey);
      return Date.now();
    });
    await ctx.sleep("nap", ms);
    const after = await ctx.step("after", async () => {
      await sideEffect(ctx.runId, "after", ctx.stepKey);
      return Date.now();
    });
    return { slept_ms: after - before };
  },
});

/** `it.quick@1`: returns at once. */
export const quick = defineWorkflow({
  name: "it.quick",
  version: 1,
  input: z.object({ i: z.number() }),
  handler: ({ i }) => Promise.resolve({ i }),
});

/** `it.kid@1`: a child of `it.fan`; takes `ms`, returns its `j`. */
export const kid = defineWorkflow({
  name: "it.kid",
  version: 1,
  input: z.object({ j: z.number().int(), ms: z.number().int() }),
  output: z.object({ j: z.number().int() }),
  maxAttempts: 20,
  async handler({ j, ms }) {
    await new Promise((resolve) => setTimeout(resolve, ms));
    return { j };
  },
});

/**
 * `it.fan@1`: `n` children of `it.kid`, the first half one `ctx.start` at
 * a time (`pause_ms` apart: a window to be killed in while starting), the
 * rest in one `ctx.map`; then every result. Returns each child's `j`, in order.
 */
export const fan = defineWorkflow({
  name: "it.fan",
  version: 1,
  input: z.object({ n: z.number().int(), ms: z.number().int(), pause_ms: z.number().int() }),
  output: z.object({ js: z.array(z.number().int()) }),
  maxAttempts: 20,
  async handler({ n, ms, pause_ms }, ctx) {
    const half = Math.floor(n / 2);
    const started = [];
    for (let j = 0; j < half; j++) {
      started.push(await ctx.start(`one-${j}`, kid, { j, ms }));
      await new Promise((resolve) => setTimeout(resolve, pause_ms));
    }
    const rest = Array.from({ length: n - half }, (_, i) => ({ j: half + i, ms }));
    const mapped = await ctx.map("rest", kid, rest);
    const js: number[] = [];
    for (const child of started) js.push((await child.result()).j);
    for (const out of mapped) js.push(out.j);
    return { js };
  },
});

if (import.meta.main) {
  await runWorker({ workflows: [three, sleeper, quick, kid, fan] });
  await side.end();
}
