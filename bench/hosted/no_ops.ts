/**
 * No-op workflow versions a bench worker hosts beside `echo`, so its claim
 * probes as many versions as a worker of many teams would: `bench.noop@1`
 * to `@n`. Nothing admits runs of them.
 */
import { z } from "zod";
import { defineWorkflow, type Workflow } from "../../workflows/define.ts";

/** `echo` plus `bench.noop@1..n-1`: `n` hosted versions in all. */
export function noOps(n: number): Workflow[] {
  return Array.from({ length: n - 1 }, (_, i) =>
    defineWorkflow({
      name: "bench.noop",
      version: i + 1,
      input: z.unknown(),
      handler: (input) => Promise.resolve(input),
    }));
}
