/**
 * One claimed attempt of a run: what this worker knows of it while it holds
 * the run (`Attempt`), and executing it: resolving the pinned workflow
 * version, validating the stored input again, calling the handler with its
 * context, whose `signal` is aborted when the lease is lost, a cancel is
 * requested or the worker shuts down, and checking its result against the
 * version's output schema.
 */
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { AttemptError } from "../db/attempt_end.ts";
import type { ClaimedRun } from "../db/claims.ts";
import type { WorkflowRegistry } from "../workflows/registry.ts";
import { attemptError, errorMessage } from "./run_output.ts";
import { inSpan, remoteContext } from "../core/tracing.ts";
import { DurableCalls, type DurableDeps } from "./durable_context.ts";

/** A claimed attempt while this worker holds it (from the claim to its finishing write). */
export interface Attempt {
  run: ClaimedRun;
  /** `<tenant>/<run_id>`: a worker holds one attempt of a run at a time. */
  key: string;
  /** The worker's logger with the run's tenant, id and attempt. */
  log: Logger;
  /**
   * Until when this worker is sure it holds the lease: measured from before
   * the claim was sent, then from before each lease renewal that answered, so
   * never later than the database's own expiry.
   */
  lease: { until: number };
  /** Aborted (the handler's signal) on lease loss, cancel or shutdown. */
  abort: AbortController;
  /** Aborted when this worker stops caring about the run: its lease is renewed no more. */
  done: AbortController;
  /** A lease renewal found a cancel requested: the handler's signal is aborted. */
  cancelRequested: boolean;
  /** Set on shutdown timeout: the release writes the run back, the attempt writes nothing. */
  abandoned: boolean;
  lost: boolean;
  /** The handler returned or threw; only the finishing write is left. */
  settled: boolean;
  /**
   * The run was suspended by a durable call (a long sleep or wait): its
   * state is written, the attempt is over and has nothing left to write.
   */
  suspended: boolean;
  /** Settles once the attempt is over and written (or given up). */
  finished: Promise<void>;
}

/** How the handler (or what precedes it) ended. */
export type AttemptResult =
  | { ok: true; result: unknown }
  | { ok: false; error: AttemptError; final: boolean };

/** The state of an attempt claimed at `claimedAt` (before the claim was sent). */
export function newAttempt(
  run: ClaimedRun,
  claimedAt: number,
  leaseMs: number,
  log: Logger,
): Attempt {
  return {
    run,
    key: `${run.tenant_id}/${run.run_id}`,
    log: log.with({ tenant: run.tenant_id, run_id: run.run_id, attempt: run.attempts }),
    lease: { until: claimedAt + leaseMs },
    abort: new AbortController(),
    done: new AbortController(),
    cancelRequested: false,
    abandoned: false,
    lost: false,
    settled: false,
    suspended: false,
    finished: Promise.resolve(),
  };
}

/** The lease is gone: whatever the handler does now is not written. */
export function loseLease(attempt: Attempt, why: string): void {
  attempt.lost = true;
  attempt.log.warn(`${why}; aborting the run`);
  attempt.abort.abort(new Error(why));
}

/**
 * Resolves the pinned version, validates the input again, runs the handler
 * with its durable calls (worker/durable_context.ts). Returns as soon as
 * the run is suspended (the attempt's `suspended` is then set), even when
 * the handler has not settled yet: the slot is free, and whatever the
 * handler does next writes nothing.
 */
export async function runHandler(
  registry: WorkflowRegistry,
  workerId: string,
  attempt: Attempt,
  deps: DurableDeps,
): Promise<AttemptResult> {
  const { run } = attempt;
  const ref = `${run.workflow_name}@${run.workflow_version}`;
  const wf = registry.resolve(ref);
  if (!wf) {
    // Claims take only hosted versions, so this is a bug; not final: a
    // worker hosting the version may run it.
    return {
      ok: false,
      final: false,
      error: attemptError(
        "unknown-workflow",
        `workflow ${ref} is not registered in worker ${workerId} (known: ${
          registry.list().join(", ")
        })`,
      ),
    };
  }
  const parsed = wf.input.safeParse(run.input);
  if (!parsed.success) {
    // Final: the stored input will never validate against this version. The
    // API checked it against the catalog's JSON Schema; what that cannot say
    // (refinements, transforms) is checked here, with the full zod schema.
    return {
      ok: false,
      final: true,
      error: attemptError("invalid-input", `input does not match ${ref}`, {
        issues: issuesOf(parsed.error.issues),
      }),
    };
  }
  const durable = new DurableCalls(deps, attempt);
  // A span of the run's trace (a no-op unless tracing is on): what the
  // handler fetches carries it on.
  const handled = inSpan(
    `poimen run ${ref}`,
    remoteContext(run.traceparent),
    {
      "poimen.tenant": run.tenant_id,
      "poimen.run_id": run.run_id,
      "poimen.attempt": run.attempts,
    },
    async () =>
      await wf.handler(
        parsed.data,
        durable.context({
          tenantId: run.tenant_id,
          runId: run.run_id,
          attempt: run.attempts,
          signal: attempt.abort.signal,
          log: attempt.log,
        }),
      ),
  ).then((result) => ({ result }), (error: unknown) => ({ error }));
  const suspended = durable.suspension.then(() => undefined);
  const ended = await Promise.race([handled, suspended]);
  if (durable.suspended || ended === undefined) {
    attempt.suspended = true;
    return { ok: true, result: undefined };
  }
  if ("result" in ended) await durable.verifyEnd().catch(() => {});
  // Final, whatever the handler made of it: a replay that diverged, a step
  // too large.
  if (durable.failure) return { ok: false, final: true, error: durable.failure };
  if (!("result" in ended)) {
    const err = ended.error;
    return {
      ok: false,
      final: false,
      // A PoimenError (ctx.start's admission, its quota gate) keeps its code.
      error: {
        message: errorMessage(err),
        name: err instanceof Error ? err.name : undefined,
        ...(err instanceof PoimenError ? { code: err.code } : {}),
      },
    };
  }
  const result = ended.result;
  if (!wf.output) return { ok: true, result };
  const checked = wf.output.safeParse(result);
  if (!checked.success) {
    // Final, like a result that is not JSON: the handler broke its
    // definition's promise to callers, and the same code would break it again.
    const issues = issuesOf(checked.error.issues);
    return {
      ok: false,
      final: true,
      error: attemptError(
        "invalid-output",
        `the result of ${ref} does not match its output schema: ${
          issues.slice(0, 3).map((i) => `${i.path || "(result)"}: ${i.message}`).join("; ")
        }`,
        { issues },
      ),
    };
  }
  // The parsed value is stored: unknown keys dropped, transforms applied, as typed for callers.
  return { ok: true, result: checked.data };
}

/** A zod error's issues as a run's error carries them: a dotted path and zod's message. */
function issuesOf(
  issues: readonly { path: PropertyKey[]; message: string }[],
): { path: string; message: string }[] {
  return issues.map((i) => ({ path: i.path.map(String).join("."), message: i.message }));
}
