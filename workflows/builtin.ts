/**
 * Built-in workflows, for operating and testing poimen, and examples of the
 * one-call `defineWorkflow` (workflows/define.ts: definition and handler at
 * once, since their handlers load nothing a caller should not; each is
 * also a definition the typed client takes); `deno task worker` hosts them
 * when no `--workflows` module is given:
 * - `echo@1` returns its input;
 * - `sleep@1` waits `{ms}` (at most ten minutes), then returns `{slept_ms}`;
 * - `fail@1` fails its first `{times}` attempts, then succeeds.
 */
import { z } from "zod";
import { delay, MINUTE } from "../core/time.ts";
import { defineWorkflow, type Workflow } from "./define.ts";
import { WorkflowRegistry } from "./registry.ts";

/** `echo@1`: returns its input. */
export const echo: Workflow<unknown> = defineWorkflow({
  name: "echo",
  version: 1,
  input: z.unknown(),
  handler: (input) => Promise.resolve(input),
});

/** `sleep@1`: waits `{ms}`, honouring the abort signal. */
export const sleep: Workflow<{ ms: number }> = defineWorkflow({
  name: "sleep",
  version: 1,
  input: z.object({ ms: z.number().int().min(0).max(10 * MINUTE) }),
  async handler({ ms }, ctx) {
    await delay(ms, ctx.signal);
    if (ctx.signal.aborted) throw new Error("sleep interrupted");
    return { slept_ms: ms };
  },
});

/** `fail@1`: fails its first `{times}` attempts, then succeeds. */
export const fail: Workflow<{ times: number; message?: string }> = defineWorkflow({
  name: "fail",
  version: 1,
  input: z.object({
    times: z.number().int().min(0).max(1000),
    message: z.string().max(1000).optional(),
  }),
  handler({ times, message }, ctx) {
    if (ctx.attempt <= times) {
      return Promise.reject(new Error(message ?? `failing attempt ${ctx.attempt} of ${times}`));
    }
    return Promise.resolve({ failed_attempts: times });
  },
});

/** A registry of the built-ins (the stock worker's without `--workflows`, and the tests'). */
export function builtinRegistry(): WorkflowRegistry {
  return new WorkflowRegistry([echo, sleep, fail]);
}
