/**
 * A handler's durable calls: the part of its context (`ctx`) whose results
 * survive the worker (docs/workflows.md, "Durable steps, sleeps and
 * signals"). Types (and `ChildRunFailed`): a worker gives each attempt an implementation
 * (worker/durable_context.ts) that stores each call's result in Postgres
 * and, on every later attempt, returns it instead of calling again.
 *
 * ```ts
 * async handler(input, ctx) {
 *   const charge = await ctx.step("charge", () => psp.charge(input, { key: ctx.stepKey }));
 *   const approval = await ctx.waitForSignal<{ ok: boolean }>("approval", { timeout: DAY });
 *   await ctx.sleep("cool-off", 2 * HOUR);
 *   return { charge, approved: approval?.payload.ok ?? false };
 * }
 * ```
 *
 * @module
 */

import type {
  SignalPayload,
  SignalSchemas,
  WorkflowDefinition,
  WorkflowInput,
  WorkflowResult,
} from "../contracts/workflow.ts";

/** Options of `ctx.step`. */
export interface StepOptions {
  /**
   * Tries after the first when `fn` throws, within this attempt (with a
   * short backoff: 200 ms doubling, at most 10 s); then the step fails and
   * so does the attempt. 0 by default; at most 100.
   */
  retries?: number;
}

/** Options of `ctx.waitForSignal`. */
export interface WaitForSignalOptions {
  /** Milliseconds to wait at most (from the first call, by Postgres' clock); unset: no limit. */
  timeout?: number;
}

/** Options of `ctx.start`. */
export interface StartOptions {
  /** The child's priority, -10..10 (higher first within the tenant); 0 by default. */
  priority?: number;
  /**
   * A detached child: cancelling this run (or any of its ancestors) does not
   * cancel it, nor its own children; it keeps its lineage. false by default.
   */
  detached?: boolean;
}

/** Options of `ctx.map`. */
export interface MapOptions {
  /** The children's priority, -10..10 (higher first within the tenant); 0 by default. */
  priority?: number;
  /**
   * At the first child that fails (or is cancelled), wake the parent at
   * once, cancel the children not yet final, and throw its
   * `ChildRunFailed`; unset, the map waits for every child, then throws the
   * first failure in input order.
   */
  failFast?: boolean;
  /**
   * At most this many of the map's children unfinished at once (an integer
   * >= 1; unset: all admitted at once). The parent then waits for half of
   * them to end before admitting more: it is woken about 2n/concurrency
   * times instead of once.
   */
  concurrency?: number;
}

/**
 * A child run a handler started (`ctx.start`). `O` is its workflow's
 * result type.
 */
export interface ChildRun<O = unknown> {
  /** The child's run id: the same on every attempt of the parent. */
  readonly runId: string;
  /**
   * The child's result, once it is final: its output when it succeeded;
   * when it failed or was cancelled, a `ChildRunFailed` is thrown (catch it
   * to go on). While the child runs the parent waits holding no worker
   * slot (`waiting`, as for a long sleep), woken by the child's finishing
   * transaction. Not a call of its own in the call order: it reads the
   * child's outcome, which never changes once final.
   */
  result(): Promise<O>;
}

/**
 * A child that did not succeed, thrown by `result()` and `ctx.map`: it
 * `failed` (`code` and `error` say why) or was `cancelled`.
 */
export class ChildRunFailed extends Error {
  /** The child's run id. */
  readonly runId: string;
  /** Its call name in the parent (`invoice`, or a map's `<name>#c<i>`). */
  readonly child: string;
  /** Its place in the map's inputs; undefined for a `ctx.start` child. */
  readonly index: number | undefined;
  /** `failed` or `cancelled`. */
  readonly status: "failed" | "cancelled";
  /** Its error code (`lease-expired`, `invalid-output`, …), when it failed with one. */
  readonly code: string | undefined;
  /** Its stored error (`{message, code?, …}`); null when cancelled. */
  readonly error: unknown;

  /** Describes a child that did not succeed. */
  constructor(child: {
    runId: string;
    name: string;
    workflow: string;
    status: "failed" | "cancelled";
    error: unknown;
    index?: number;
  }) {
    const err = (child.error ?? {}) as { code?: unknown; message?: unknown };
    const what = `child ${child.name} (run ${child.runId} of ${child.workflow})`;
    super(
      child.status === "failed"
        ? `${what} failed${typeof err.code === "string" ? ` (${err.code})` : ""}: ${
          String(err.message ?? "no message")
        }`
        : `${what} was cancelled`,
    );
    this.name = "ChildRunFailed";
    this.runId = child.runId;
    this.child = child.name;
    this.index = child.index;
    this.status = child.status;
    this.code = typeof err.code === "string" ? err.code : undefined;
    this.error = child.error ?? null;
  }
}

/** A signal as a wait returns it: sent to the run with `POST /v1/runs/{id}/signals`. */
export interface Signal<T = unknown> {
  /** The signal's name: the name the wait was given. */
  name: string;
  /** Its id: the sender's `signal_id`, or one the API made. */
  signal_id: string;
  /** What the sender sent (JSON). */
  payload: T;
  /** When the API stored it (RFC 3339). */
  received_at: string;
}

/**
 * The durable calls of a handler's context. Each is identified by its name:
 * a name used twice in one run is `name#2`, `name#3`… in call order, and the
 * order of the calls must be the same on every attempt (it may only grow at
 * its end): a stored name met as another kind of call, or another name in
 * a stored call's place, fails the run with `non-determinism`, for good.
 * Names are 1–200 characters, without `#` or control characters.
 */
export interface DurableContext<S extends SignalSchemas = SignalSchemas> {
  /**
   * Runs `fn` once per run: its result (JSON, at most RUN_STEP_MAX_BYTES)
   * is stored when it returns, and every later attempt gets the stored
   * result without calling `fn`. What it returns is the stored JSON (a Date
   * comes back as a string, undefined as null), on the first call as on a
   * replay. A worker that dies while `fn` runs calls it again on the next
   * attempt: make its side effects idempotent with `ctx.stepKey`.
   */
  step<T>(name: string, fn: (stepKey: string) => Promise<T> | T, options?: StepOptions): Promise<T>;
  /**
   * `<tenant>:<run_id>:<name>` of the step whose `fn` is running (read it
   * inside `fn`, also after an await): the same on every attempt, an
   * idempotency key for the APIs the step calls. Read outside a step's `fn`,
   * it throws a TypeError.
   */
  readonly stepKey: string;
  /**
   * Resolves once `ms` have passed since the first call (its end is computed
   * once, by Postgres' clock, and stored). A sleep with more than
   * WORKER_SUSPEND_AFTER_MS left suspends the run: its worker slot, lease
   * and concurrency slot are given back, and the run is resumed by any
   * worker hosting its version at its end.
   */
  sleep(name: string, ms: number): Promise<void>;
  /** `sleep` until `until` (a Date or an RFC 3339 time). */
  sleepUntil(name: string, until: Date | string): Promise<void>;
  /**
   * The first unconsumed signal `name` sent to this run, including one sent
   * before the wait started (signals are kept until a wait consumes them);
   * or null once `timeout` has passed. Each signal is returned to one wait
   * only. A wait longer than WORKER_SUSPEND_AFTER_MS suspends the run until
   * the signal arrives (or the timeout). A signal the workflow declares
   * (`signals` of `defineWorkflow`) is typed by its schema (the API checked
   * its payload against it); name another with its payload's type
   * (`waitForSignal<{ ok: boolean }>("approval")`).
   */
  waitForSignal<N extends keyof S & string>(
    name: N,
    options?: WaitForSignalOptions,
  ): Promise<Signal<SignalPayload<S, N>> | null>;
  /** A signal the workflow does not declare, its payload of type `T`; see the other form. */
  waitForSignal<T = unknown>(
    name: string,
    options?: WaitForSignalOptions,
  ): Promise<Signal<T> | null>;
  /**
   * Starts a child run of `definition` (its `name@version`) with `input`,
   * for this run's tenant, through admission (the child's catalog schema,
   * concurrency limit and priority apply), once per run: its dispatch key is
   * `child:<this run_id>:<name>`, so a replay, or a retried attempt that
   * died while starting it, gets the same child, never a second one. The
   * child records this run as its parent and this run's root as its root.
   * A workflow no worker registered, or an input its schema refuses, fails
   * the call (a failed step of `name`) with the admission's error.
   */
  // deno-lint-ignore no-explicit-any
  start<W extends WorkflowDefinition<any, any, any, any, any>>(
    name: string,
    definition: W,
    input: WorkflowInput<W>,
    options?: StartOptions,
  ): Promise<ChildRun<WorkflowResult<W>>>;
  /**
   * Starts one child of `definition` per input (named `<name>#c<i>`, each
   * once per run as `start`'s), admitted in batches, and resolves with
   * their outputs in input order once all are final. The parent waits
   * once, holding no slot, and is woken once, by the last child's finishing
   * transaction (or, with `failFast`, the first failure's). A child that
   * did not succeed makes it throw its `ChildRunFailed` (the first in input
   * order; with `failFast`, the rest are cancelled). Each child's output is
   * kept with the child and read on resume, not stored as a step result.
   */
  // deno-lint-ignore no-explicit-any
  map<W extends WorkflowDefinition<any, any, any, any, any>>(
    name: string,
    definition: W,
    inputs: readonly WorkflowInput<W>[],
    options?: MapOptions,
  ): Promise<WorkflowResult<W>[]>;
}
