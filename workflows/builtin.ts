/**
 * Built-in workflows, useful for operating and testing poimen:
 * - `echo@1` returns its input;
 * - `sleep@1` waits `{ms}` (at most ten minutes), then returns `{slept_ms}`;
 * - `fail@1` fails its first `{times}` attempts, then succeeds.
 */
import { z } from "zod";
import { delay, MINUTE } from "../core/time.ts";
import { type Workflow, WorkflowRegistry } from "./registry.ts";

export const echo: Workflow<unknown> = {
  name: "echo",
  version: 1,
  input: z.unknown(),
  handler: (input) => Promise.resolve(input),
};

export const sleep: Workflow<{ ms: number }> = {
  name: "sleep",
  version: 1,
  input: z.object({ ms: z.number().int().min(0).max(10 * MINUTE) }),
  async handler({ ms }, ctx) {
    await delay(ms, ctx.signal);
    if (ctx.signal.aborted) throw new Error("sleep interrupted");
    return { slept_ms: ms };
  },
};

export const fail: Workflow<{ times: number; message?: string }> = {
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
};

/** The registry every poimen process uses: the built-ins (add yours here). */
export function builtinRegistry(defaultMaxAttempts = 3): WorkflowRegistry {
  return new WorkflowRegistry(defaultMaxAttempts).register(echo).register(sleep).register(fail);
}
