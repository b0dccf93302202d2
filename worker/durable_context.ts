/**
 * The durable calls of one attempt (workflows/durable.ts), on the statements
 * of db/run_steps.ts, db/signals.ts and db/suspension.ts; children's in
 * worker/child_runs.ts and worker/child_waits.ts.
 *
 * Replay: the run's stored calls are read once, at the attempt's first
 * durable call. Each call takes its name (`name`, `name#2`… per name, in
 * call order) and its place synchronously, when it is made, then meets the
 * stored call of that name: a completed one returns its stored result; one
 * of another kind, or in another place, or another name in its place, is
 * `non-determinism`, which fails the run for good whatever the handler does.
 *
 * Waiting: a sleep or a signal wait with at most `suspendAfterMs` left waits
 * here; a longer one (or a wait for children) suspends the run. Once
 * suspended the attempt is over: `suspension` resolves (the worker frees the
 * slot at once), the handler's signal is aborted with `RunSuspended`, and
 * every durable call from then on throws it and writes nothing.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { type ErrorCode, PoimenError } from "../core/errors.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { isUnavailable, type Sql } from "../db/pool.ts";
import type { AttemptError } from "../db/attempt_end.ts";
import {
  completeStep,
  failStep,
  loadSteps,
  settleSleep,
  type StepFence,
  type StepKind,
  type StoredStep,
} from "../db/run_steps.ts";
import { settleSignalWait, signalPending } from "../db/signals.ts";
import { suspendRun, type Wait } from "../db/suspension.ts";
import type {
  DurableContext,
  Signal,
  StepOptions,
  WaitForSignalOptions,
} from "../workflows/durable.ts";
import type { WorkflowContext } from "../workflows/define.ts";
import type { Attempt } from "./attempt.ts";
import { type ChildAdmission, startChild } from "./child_runs.ts";
import { childResult, type ChildWaitHost, mapChildren } from "./child_waits.ts";
import type { WorkerHooks } from "./hooks.ts";
import { attemptError, boundError, encodeResult, errorMessage } from "./run_output.ts";

/** What the durable calls need of their worker. */
export interface DurableDeps {
  sql: Sql;
  /** The worker's lease owner id. */
  owner: string;
  /** A sleep or wait with more left than this suspends the run (WORKER_SUSPEND_AFTER_MS). */
  suspendAfterMs: number;
  /** Largest step result, as JSON bytes (RUN_STEP_MAX_BYTES). */
  stepMaxBytes: number;
  /** Largest error stored with a failed step (RUN_RESULT_MAX_BYTES). */
  errorMaxBytes: number;
  hooks: WorkerHooks;
  /** A statement appended events: wake the outbox publisher. */
  eventsWritten(): void;
  /** Admits the children handlers start (`ctx.start`); unset: `ctx.start` throws. */
  children?: ChildAdmission;
}

/** Thrown by every durable call once the run is suspended: the attempt is over. */
export class RunSuspended extends Error {
  constructor() {
    super("the run is suspended until its wait ends; this attempt is over");
    this.name = "RunSuspended";
  }
}

// The step whose fn is running, across its awaits: `ctx.stepKey`.
const currentStep = new AsyncLocalStorage<string>();

const NAME = /^[^#\p{Cc}]{1,200}$/u;
const MAX_RETRIES = 100;
// A short wait looks for its signal this often (a read, nothing written).
const SIGNAL_POLL_MS = 200;
// SQLSTATE of a cancelled statement: retried like an unavailable database.
const QUERY_CANCELED = "57014";

/** The durable calls of one attempt; see the module comment. */
export class DurableCalls {
  readonly #deps: DurableDeps;
  readonly #attempt: Attempt;
  readonly #fence: StepFence;
  #stored: Promise<{ byName: Map<string, StoredStep>; bySeq: Map<number, StoredStep> }> | undefined;
  #calls = 0;
  readonly #uses = new Map<string, number>();
  #suspended = false;
  readonly #onSuspended = Promise.withResolvers<void>();
  /** A final failure the durable calls decided: the attempt's outcome, whatever the handler does. */
  failure: AttemptError | undefined;

  constructor(deps: DurableDeps, attempt: Attempt) {
    this.#deps = deps;
    this.#attempt = attempt;
    const { run } = attempt;
    this.#fence = {
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      owner: deps.owner,
      attempt: run.attempts,
    };
  }

  /** Whether the run was suspended: the attempt ended there, its outcome is written. */
  get suspended(): boolean {
    return this.#suspended;
  }

  /** Resolves when the run is suspended (never otherwise). */
  get suspension(): Promise<void> {
    return this.#onSuspended.promise;
  }

  /** The handler's context: `base` (who it runs for) and the durable calls. */
  context(base: Omit<WorkflowContext, keyof DurableContext>): WorkflowContext {
    const calls: DurableContext = {
      step: (name, fn, options) => this.#step(name, fn, options),
      get stepKey(): string {
        const key = currentStep.getStore();
        if (key === undefined) {
          throw new TypeError("ctx.stepKey is read inside a ctx.step function");
        }
        return key;
      },
      sleep: (name, ms) => this.#sleep(name, ms),
      sleepUntil: (name, until) => this.#sleepUntil(name, until),
      waitForSignal: <T>(name: string, options?: WaitForSignalOptions) =>
        this.#waitForSignal<T>(name, options),
      start: (name, definition, input, options) =>
        startChild(
          this.#deps.children,
          this.#attempt.run,
          (fn) => this.#step(name, fn),
          { name, definition, input, options },
          (runId) => childResult(this.#childHost(), runId),
        ),
      map: (name, definition, inputs, options) =>
        mapChildren(this.#childHost(), { name, definition, inputs, options }),
    };
    return Object.defineProperties({ ...base } as WorkflowContext, {
      ...Object.getOwnPropertyDescriptors(calls),
    });
  }

  /**
   * After the handler returned: a replay that stopped before the calls
   * stored (code that now skips a stored call at its end) is
   * `non-determinism` too.
   */
  async verifyEnd(): Promise<void> {
    if (!this.#stored || this.failure) return;
    const { bySeq } = await this.#stored;
    const beyond = [...bySeq.values()].filter((s) => s.seq > this.#calls);
    if (beyond.length > 0) {
      this.failure = attemptError(
        "non-determinism",
        `the handler returned after ${this.#calls} durable calls; the run has ${bySeq.size} ` +
          `stored (the first not made: ${beyond[0].name}, a ${beyond[0].kind})`,
      );
    }
  }

  async #step<T>(
    base: string,
    fn: (stepKey: string) => Promise<T> | T,
    options: StepOptions = {},
  ): Promise<T> {
    const retries = options.retries ?? 0;
    if (!Number.isInteger(retries) || retries < 0 || retries > MAX_RETRIES) {
      throw new TypeError(`ctx.step ${base}: retries must be an integer from 0 to ${MAX_RETRIES}`);
    }
    if (typeof fn !== "function") throw new TypeError(`ctx.step ${base}: fn must be a function`);
    const { name, seq, stored } = await this.#call(base, "step");
    if (stored?.status === "completed") return stored.result as T;
    const { run } = this.#attempt;
    const key = `${run.tenant_id}:${run.run_id}:${name}`;
    const started = performance.now();
    for (let tries = 1;; tries++) {
      let value: T;
      try {
        value = await currentStep.run(key, () => fn(key));
      } catch (err) {
        this.#live();
        if (tries <= retries && !this.#attempt.abort.signal.aborted) {
          this.#attempt.log.info("step failed; trying again", { step: name, tries, error: err });
          await delay(backoffWithJitter(tries, 200, 10 * SECOND), this.#attempt.abort.signal);
          continue;
        }
        this.#finished("step", "failed", started);
        const error = boundError({ message: errorMessage(err) }, this.#deps.errorMaxBytes);
        await this.#write(() => failStep(this.#deps.sql, this.#fence, { name, seq, tries, error }))
          .catch((e) => this.#attempt.log.warn("step failure not recorded", { error: e }));
        throw err;
      }
      this.#live();
      const json = this.#encode(name, value);
      const write = await this.#write(() =>
        completeStep(this.#deps.sql, this.#fence, {
          name,
          seq,
          resultJson: json,
          size: new TextEncoder().encode(json).length,
          durationMs: performance.now() - started,
        })
      );
      if (write === "lost") throw this.#lost();
      this.#finished("step", "completed", started);
      // What a replay returns: the stored JSON, not the value as fn made it.
      return JSON.parse(json) as T;
    }
  }

  #sleep(base: string, ms: number): Promise<void> {
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) {
      return Promise.reject(new TypeError(`ctx.sleep ${base}: ms must be a finite number >= 0`));
    }
    return this.#sleepTo(base, { ms });
  }

  #sleepUntil(base: string, until: Date | string): Promise<void> {
    const at = new Date(until);
    if (Number.isNaN(at.getTime())) {
      return Promise.reject(new TypeError(`ctx.sleepUntil ${base}: until must be a valid time`));
    }
    return this.#sleepTo(base, { until: at });
  }

  async #sleepTo(base: string, end: { ms?: number; until?: Date }): Promise<void> {
    const { name, seq, stored } = await this.#call(base, "sleep");
    if (stored?.status === "completed") return;
    const started = performance.now();
    for (;;) {
      const state = await this.#write(() =>
        settleSleep(this.#deps.sql, this.#fence, { name, seq, ...end })
      );
      if (!state.held) throw this.#lost();
      if (state.done) return this.#finished("sleep", "completed", started);
      const left = state.until.getTime() - state.now.getTime();
      if (left <= this.#deps.suspendAfterMs) {
        await delay(left, this.#attempt.abort.signal);
        this.#live();
        continue;
      }
      await this.#suspend({ reason: "sleep", name, step: name, until: state.until });
    }
  }

  async #waitForSignal<T>(
    base: string,
    options: WaitForSignalOptions = {},
  ): Promise<Signal<T> | null> {
    const timeout = options.timeout;
    if (timeout !== undefined && (!Number.isFinite(timeout) || timeout < 0)) {
      throw new TypeError(`ctx.waitForSignal ${base}: timeout must be a finite number >= 0`);
    }
    const { name, seq, stored } = await this.#call(base, "signal");
    if (stored?.status === "completed") return stored.result as Signal<T> | null;
    const started = performance.now();
    for (;;) {
      const state = await this.#write(() =>
        settleSignalWait(this.#deps.sql, this.#fence, {
          name,
          seq,
          signalName: base,
          timeoutMs: timeout ?? null,
        })
      );
      if (state.outcome === "lost") throw this.#lost();
      if (state.outcome !== "waiting") {
        this.#finished("signal", "completed", started);
        return state.outcome === "signal" ? state.signal as Signal<T> : null;
      }
      const left = state.until === null ? Infinity : state.until.getTime() - state.now.getTime();
      if (left <= this.#deps.suspendAfterMs) {
        await this.#pollSignal(base, left);
        continue;
      }
      await this.#suspend({ reason: "signal", name: base, step: name, until: state.until });
    }
  }

  /** Takes the call's name and place, reads the stored calls once, and checks it against them. */
  async #call(base: string, kind: StepKind) {
    this.#live();
    if (typeof base !== "string" || !NAME.test(base)) {
      throw new TypeError(
        `a durable call's name is 1-200 characters without # or control characters: ${
          JSON.stringify(base)
        }`,
      );
    }
    const uses = (this.#uses.get(base) ?? 0) + 1;
    this.#uses.set(base, uses);
    const name = uses === 1 ? base : `${base}#${uses}`;
    const seq = ++this.#calls;
    const { byName, bySeq } = await (this.#stored ??= this.#load());
    this.#live();
    const stored = byName.get(name);
    const other = bySeq.get(seq);
    if (other && other.name !== name) {
      this.#diverged(
        `call ${seq} is stored as ${other.name} (a ${other.kind}), and made as ${name} (a ${kind})`,
      );
    }
    if (stored && stored.kind !== kind) {
      this.#diverged(`${name} is stored as a ${stored.kind}, and called as a ${kind}`);
    }
    if (stored && stored.seq !== seq) {
      this.#diverged(`${name} is stored as call ${stored.seq}, and made as call ${seq}`);
    }
    return { name, seq, stored };
  }

  async #load() {
    const { run } = this.#attempt;
    const steps = await this.#write(
      () => loadSteps(this.#deps.sql, run.tenant_id, run.run_id),
      false,
    );
    return {
      byName: new Map(steps.map((s) => [s.name, s])),
      bySeq: new Map(steps.map((s) => [s.seq, s])),
    };
  }

  #diverged(detail: string): never {
    const ref = `${this.#attempt.run.workflow_name}@${this.#attempt.run.workflow_version}`;
    const message = `non-deterministic replay of ${ref}: ${detail}`;
    this.failure ??= attemptError("non-determinism", message);
    throw new PoimenError("non-determinism", message);
  }

  /** The step's JSON text, or the final failure it is. */
  #encode(name: string, value: unknown): string {
    const encoded = encodeResult(value, this.#deps.stepMaxBytes);
    if (encoded.json !== undefined) return encoded.json;
    const error = encoded.error.code === "result-too-large"
      ? attemptError(
        "step-too-large",
        `step ${name}: its result is ${encoded.error.bytes} bytes as JSON, over ` +
          `RUN_STEP_MAX_BYTES (${this.#deps.stepMaxBytes})`,
        { step: name, bytes: encoded.error.bytes, limit: this.#deps.stepMaxBytes },
      )
      : { ...encoded.error, message: `step ${name}: ${encoded.error.message}`, step: name };
    this.failure ??= error;
    throw new PoimenError(
      error.code === "bad-result" ? "bad-result" : "step-too-large",
      error.message,
    );
  }

  /** What the waits for children need (worker/child_waits.ts). */
  #childHost(): ChildWaitHost {
    return {
      sql: this.#deps.sql,
      fence: this.#fence,
      run: this.#attempt.run,
      children: this.#deps.children,
      live: () => this.#live(),
      write: (fn, events) => this.#write(fn, events),
      suspend: (fn, wait) =>
        this.#suspend({ reason: "children", name: wait.name, step: wait.step, until: null }, fn),
      diverged: (detail) => this.#diverged(detail),
      step: (name, fn) => this.#step(name, fn),
    };
  }

  /** Suspends the run, or returns when its wait has already ended (the caller looks again). */
  async #suspend(
    wait: Omit<Wait, "reason"> & { reason: Wait["reason"] | "children" },
    suspend = () => suspendRun(this.#deps.sql, this.#fence, wait as Wait),
  ): Promise<void> {
    const outcome = await this.#write(suspend);
    if (outcome === "ready") return;
    if (outcome === "lost") throw this.#lost();
    if (outcome === "cancel-requested") throw new Error("cancel requested while waiting");
    this.#suspended = true;
    this.#deps.hooks.onSuspended?.(wait.reason);
    this.#attempt.log.debug("run suspended", {
      reason: wait.reason,
      name: wait.name,
      until: wait.until?.toISOString() ?? null,
    });
    // The lease is gone with the suspend: nothing renews or expires it now.
    this.#attempt.done.abort();
    this.#onSuspended.resolve();
    this.#attempt.abort.abort(new RunSuspended());
    throw new RunSuspended();
  }

  /** Waits up to `ms` for signal `name` to arrive (or the handler's signal to abort). */
  async #pollSignal(name: string, ms: number): Promise<void> {
    const until = performance.now() + ms;
    const { run } = this.#attempt;
    for (;;) {
      const left = until - performance.now();
      if (left <= 0) return;
      await delay(Math.min(left, SIGNAL_POLL_MS), this.#attempt.abort.signal);
      this.#live();
      if (await signalPending(this.#deps.sql, run.tenant_id, run.run_id, name)) return;
    }
  }

  /** Throws when the attempt is over for the durable calls (suspended, failed, aborted). */
  #live(): void {
    if (this.#suspended) throw new RunSuspended();
    if (this.failure) {
      throw new PoimenError(
        (this.failure.code ?? "non-determinism") as ErrorCode,
        this.failure.message,
      );
    }
    const signal = this.#attempt.abort.signal;
    if (signal.aborted) throw signal.reason ?? new Error("aborted");
  }

  #lost(): Error {
    return new Error("lease lost: the run is no longer this attempt's");
  }

  #finished(kind: StepKind, outcome: "completed" | "failed", started: number): void {
    this.#deps.hooks.onStepFinished?.(kind, outcome, (performance.now() - started) / 1000);
  }

  /**
   * Runs a durable statement, again while Postgres is unavailable (or the
   * statement was cancelled) and the lease lasts: every one is fenced and
   * idempotent, so a write whose reply was lost is refused or recognised.
   */
  async #write<T>(fn: () => Promise<T>, events = true): Promise<T> {
    for (let n = 1;; n++) {
      try {
        const done = await fn();
        // Most append an event: wake the outbox (coalesced by the worker).
        if (events) this.#deps.eventsWritten();
        return done;
      } catch (err) {
        const transient = isUnavailable(err) || (err as { code?: string }).code === QUERY_CANCELED;
        if (!transient || Date.now() >= this.#attempt.lease.until) throw err;
        this.#attempt.log.warn("durable call's statement failed; retrying", { error: err });
        await delay(backoffWithJitter(n, 100, SECOND));
      }
    }
  }
}
