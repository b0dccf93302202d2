/**
 * The client's typed verbs, `start`, `result` and `run` of `PoimenClient`:
 * runs of a workflow definition (`defineWorkflow`, `@poimen/poimen/workflow`),
 * with the input typed by its input schema and the result by its output
 * schema. They send what `admitRun` and `waitForRun` send (`POST /v1/runs`,
 * `GET /v1/runs/{id}`); nothing on the wire is new. Only the definition's
 * name, version and types are used: no schema is run here, so this loads
 * no zod (the API checks the input, the worker the result).
 *
 * @module
 */
import type { Run, RunRequest, RunStatus } from "../contracts/wire.ts";
import type { WorkflowDefinition } from "../contracts/workflow.ts";
import type { PoimenClient } from "./http.ts";
import { FINAL_STATUSES } from "../contracts/wire.ts";
import type { RequestOptions } from "./retry.ts";

/** Options of `start`: the run's own fields, and how the call retries. */
export interface StartOptions extends RequestOptions {
  /**
   * The run's identity (printable, at most 255 characters): the same key
   * gives the same run, however often it is sent. Unset: one is generated
   * per call, so the call's own retries never make a second run.
   */
  dispatchKey?: string;
  /** Groups runs that serve one goal (printable, at most 255 characters). */
  goalId?: string;
  /** No attempt before this time (at most 365 days ahead; a time past means now). */
  runAfter?: Date;
  /** -10 to 10 (default 0): within the tenant, a higher priority starts first. */
  priority?: number;
  /** A W3C `traceparent` to pass on (the run's admission joins that trace). */
  traceparent?: string;
}

/** Options of `result`: how long to wait, and how each read retries. */
export interface ResultOptions extends Omit<RequestOptions, "timeoutMs" | "deadlineMs"> {
  /**
   * How long to wait for the run to end, in ms; unset: as long as it takes
   * (each read is held by the API up to 60 s, so nothing polls).
   */
  timeoutMs?: number;
}

/** Options of `run`: those of `start`, and how long to wait for the result. */
export interface RunOptions extends StartOptions {
  /** How long to wait for the run to end once started, in ms; unset: as long as it takes. */
  resultTimeoutMs?: number;
}

/**
 * A run started by `start`: its id and what the API answered, typed by its
 * definition, so `client.result(handle)` is typed `O` (the output schema's
 * type; `unknown` when the definition declares none).
 */
export interface RunHandle<O = unknown> {
  /** The run's id. */
  readonly runId: string;
  /** The definition it was started with; the run is pinned to its `name@version`. */
  readonly workflow: WorkflowDefinition<unknown, O, unknown, unknown>;
  /** The run as the API answered the start (`queued`, or later for a replayed key). */
  readonly run: Run;
  /** This call made the run (not an earlier call with the same `dispatchKey`). */
  readonly created: boolean;
  /** The API answered with a run the `dispatchKey` already named. */
  readonly replayed: boolean;
  /** It joined the pending run of its debounce key (docs/workflows.md#debounce). */
  readonly debounced: boolean;
  /** That run was asked for with another input: the key was reused, most likely a bug. */
  readonly bodyMismatch: boolean;
  /** The dispatch key sent (the caller's or the generated one). */
  readonly dispatchKey: string;
  /** How many attempts the call took. */
  readonly attempts: number;
}

/**
 * A run that did not succeed: it `failed` (`code` and `error` say why) or
 * was `cancelled`, or it had not ended when `result` stopped waiting
 * (`status` `queued` or `running`). `run` is the run as last read.
 */
export class PoimenRunError extends Error {
  /** The run as last read. */
  readonly run: Run;
  /** Its status: `failed`, `cancelled`, or `queued`/`running` when the wait ran out. */
  readonly status: RunStatus;
  /** The run's error code (`invalid-input`, `invalid-output`, …), when it failed with one. */
  readonly code: string | undefined;

  /** Describes `run`, which did not succeed. */
  constructor(run: Run) {
    const error = (run.error ?? {}) as { code?: unknown; message?: unknown };
    const what = `run ${run.run_id} of ${run.workflow}@${run.workflow_version}`;
    super(
      run.status === "failed"
        ? `${what} failed${typeof error.code === "string" ? ` (${error.code})` : ""}: ${
          String(error.message ?? "no message")
        }`
        : run.status === "cancelled"
        ? `${what} was cancelled`
        : `${what} has not ended: still ${run.status}`,
    );
    this.name = "PoimenRunError";
    this.run = run;
    this.status = run.status;
    this.code = typeof error.code === "string" ? error.code : undefined;
  }
}

/** `PoimenClient.start`. */
export async function startRun<O>(
  client: PoimenClient,
  workflow: WorkflowDefinition<unknown, O, unknown, unknown>,
  input: unknown,
  opts: StartOptions,
): Promise<RunHandle<O>> {
  const { dispatchKey, goalId, runAfter, priority, traceparent, ...request } = opts;
  const body: RunRequest = { workflow_ref: `${workflow.name}@${workflow.version}`, input };
  if (dispatchKey !== undefined) body.dispatch_key = dispatchKey;
  if (goalId !== undefined) body.goal_id = goalId;
  if (runAfter !== undefined) body.run_after = runAfter.toISOString();
  if (priority !== undefined) body.priority = priority;
  const admitted = await client.admitRun(body, { ...request, idempotent: true, traceparent });
  checkRunOf(workflow, admitted.run);
  return {
    runId: admitted.run.run_id,
    workflow,
    run: admitted.run,
    created: admitted.created,
    replayed: admitted.replayed,
    debounced: admitted.debounced,
    bodyMismatch: admitted.bodyMismatch,
    // Always set: `idempotent` generates one when the caller gave none.
    dispatchKey: admitted.dispatchKey ?? "",
    attempts: admitted.attempts,
  };
}

/**
 * `PoimenClient.result`: waits for the run to end; its result when it
 * succeeded, else a `PoimenRunError`. `known` is the run as last read, when
 * the caller has it (a handle's), else the run is read first, to check that
 * it is a run of `workflow` before waiting on it.
 */
export async function runResult<O>(
  client: PoimenClient,
  workflow: WorkflowDefinition<unknown, O, unknown, unknown>,
  runId: string,
  opts: ResultOptions,
  known?: Run,
): Promise<O> {
  const { timeoutMs, ...request } = opts;
  let run = known;
  if (run === undefined) {
    run = await client.getRun(runId, request);
    checkRunOf(workflow, run);
  }
  if (!FINAL_STATUSES.has(run.status)) {
    run = await client.waitForRun(runId, { ...request, timeoutMs: timeoutMs ?? Infinity });
  }
  // The worker parsed the result with the definition's output schema before
  // it completed the run, and the version is pinned: the result is an `O`.
  if (run.status === "succeeded") return run.result as O;
  throw new PoimenRunError(run);
}

/** `PoimenClient.run`: `startRun`, then `runResult`. */
export async function startAndWait<O>(
  client: PoimenClient,
  workflow: WorkflowDefinition<unknown, O, unknown, unknown>,
  input: unknown,
  opts: RunOptions,
): Promise<O> {
  const { resultTimeoutMs, ...start } = opts;
  const handle = await startRun(client, workflow, input, start);
  // The wait shares the call's signal and retry rules; not its per-attempt timeout.
  const { signal, maxAttempts, baseDelayMs, maxDelayMs, onRetry } = opts;
  const wait = {
    timeoutMs: resultTimeoutMs,
    signal,
    maxAttempts,
    baseDelayMs,
    maxDelayMs,
    onRetry,
  };
  return await runResult(client, workflow, handle.runId, wait, handle.run);
}

/**
 * Refuses a run of another `name@version` than `workflow`: its result would
 * not be of the definition's type (a run id of another workflow, or a
 * dispatch key reused for another workflow).
 */
function checkRunOf(workflow: WorkflowDefinition<unknown, unknown>, run: Run): void {
  if (run.workflow !== workflow.name || run.workflow_version !== workflow.version) {
    throw new TypeError(
      `run ${run.run_id} is a run of ${run.workflow}@${run.workflow_version}, not of ` +
        `${workflow.name}@${workflow.version}`,
    );
  }
}
