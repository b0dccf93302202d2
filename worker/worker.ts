/**
 * The executor. A `Worker` claims due queued runs from Postgres (woken by
 * LISTEN/NOTIFY, polling as the fallback), runs at most `concurrency` of them
 * at once, keeps their leases alive with heartbeats, and finishes each one:
 * `succeeded`, retried with backoff, or `failed` after its last attempt.
 * A run whose handler returned gives its slot to the next claim while its
 * outcome is written (completions of runs that end together share one
 * statement), so claiming overlaps those writes; at most `concurrency` more
 * runs wait for such a write before claiming stops.
 * A cancel requested of a running run (POST /v1/runs/{id}/cancel) reaches
 * the worker through its heartbeat, which reads the request from the row
 * (a NOTIFY on `poimen_cancel` only makes it beat at once): the handler's
 * `ctx.signal` is aborted, and when the handler then fails (throws, as a
 * handler that honours the signal does), the run ends `cancelled`, written
 * like any attempt's end, fenced by attempt. A handler that ignores the
 * signal and returns a result has done the work: the run succeeds.
 * Beside it runs its `Reclaimer` (worker/reclaimer.ts), which returns runs
 * whose lease expired (their worker died) to the queue, so a worker killed
 * with SIGKILL loses no run: it is executed again elsewhere (execution is
 * at-least-once; a handler with side effects must be idempotent per run id).
 */
import type { Logger } from "../core/log.ts";
import { Waker } from "../core/waker.ts";
import { notifyChannels, OUTBOX_CHANNEL } from "../db/notify.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { backoffWithJitter, delay, MINUTE, SECOND } from "../core/time.ts";
import { isUnavailable, type Sql } from "../db/pool.ts";
import {
  type AttemptError,
  CANCEL_CHANNEL,
  type ClaimedRun,
  claimRuns,
  completeRuns,
  type Completion,
  failAttempt,
  heartbeat,
  notifyQueued,
  QUEUE_CHANNEL,
  type ReclaimedRun,
  releaseRun,
} from "../db/queue.ts";
import type { WorkflowRegistry } from "../workflows/registry.ts";
import { Reclaimer } from "./reclaimer.ts";
import { Batcher } from "../core/batcher.ts";
import {
  attemptError,
  boundError,
  checkResult,
  DEFAULT_RUN_RESULT_MAX_BYTES,
  errorMessage,
} from "./run_output.ts";

/** How one claimed attempt ended, as far as this worker knows. */
export type AttemptOutcome =
  | "succeeded"
  | "retrying"
  | "failed"
  /** Ended on request (POST /v1/runs/{id}/cancel). */
  | "cancelled"
  /** Given back unfinished on shutdown. */
  | "released"
  /** The lease was lost (reclaimed elsewhere): nothing was written. */
  | "lost";

/** The statements fenced by attempt: refused when the lease they speak for is gone. */
export type FencedStatement = "heartbeat" | "complete" | "fail" | "release";

/** Callbacks for metrics; none may throw. */
export interface WorkerHooks {
  onClaimed?(count: number): void;
  onFinished?(outcome: AttemptOutcome): void;
  onReclaimed?(runs: ReclaimedRun[]): void;
  /** A heartbeat or finishing write was refused: its attempt no longer holds the lease. */
  onFenced?(statement: FencedStatement): void;
  /** A heartbeat did not answer within its timeout (the lease is unconfirmed). */
  onHeartbeatTimeout?(): void;
}

export interface WorkerOptions {
  /** Written as `lease_owner`: unique per process. */
  id: string;
  /**
   * Most handlers running at once. A run whose handler returned keeps its
   * lease until its outcome is written; up to this many such runs may be
   * waiting for that write, so a worker holds at most twice this many leases.
   */
  concurrency: number;
  leaseMs: number;
  pollMs: number;
  retryBaseMs: number;
  /** Ceiling of one retry's backoff; 5 minutes by default. */
  retryCapMs?: number;
  shutdownMs: number;
  /** How often expired leases are looked for; by default from the lease and poll interval. */
  reclaimMs?: number;
  /**
   * Largest result (and error) of a run, as JSON bytes (RUN_RESULT_MAX_BYTES);
   * a larger result fails the attempt with `result-too-large`.
   */
  resultMaxBytes?: number;
  log: Logger;
  hooks?: WorkerHooks;
  /**
   * Opens a pool used only for LISTEN. postgres.js remembers a failed first
   * LISTEN forever, so with this the worker retries with a fresh pool; without
   * it, it listens on the main pool once and, if that fails, only polls.
   */
  listener?: () => Sql;
}

// SQLSTATE of a cancelled statement (cancel request or statement_timeout).
const QUERY_CANCELED = "57014";

// Database errors in the loops back off from this to ten seconds.
const DB_RETRY_BASE_MS = 100;
const DB_RETRY_CAP_MS = 10 * SECOND;
// Completions per statement, and statements at once (each holds a connection).
const COMPLETION_BATCH = 64;
const COMPLETION_FLUSHES = 2;
const CLAIM_COALESCE_MS = 5;
// NOTIFYs from one worker start at least this far apart: a busy worker would
// otherwise send one per claim and per completion batch, each a commit of its
// own (0.40 statements per run against 0.15, measured at 6,600 runs/s).
const WAKE_MIN_INTERVAL_MS = 10;

interface InFlight {
  run: ClaimedRun;
  /** Aborted (the handler's signal) on lease loss or shutdown. */
  abort: AbortController;
  /** Aborted when this worker stops caring about the run: stops its heartbeat. */
  done: AbortController;
  /** Aborted to make the heartbeat beat now (a cancel notification); replaced each beat. */
  nudge: AbortController;
  /** A heartbeat found a cancel requested: the handler's signal is aborted. */
  cancelRequested: boolean;
  /** Set on shutdown timeout: the release writes the run back, the attempt writes nothing. */
  abandoned: boolean;
  lost: boolean;
  /** The handler returned or threw; only the finishing write is left. */
  settled: boolean;
  finished: Promise<void>;
}

type AttemptResult =
  | { ok: true; result: unknown }
  | { ok: false; error: AttemptError; final: boolean };

/** Claims and executes runs; see the module comment. */
export class Worker implements Service {
  readonly #sql: Sql;
  readonly #registry: WorkflowRegistry;
  readonly #opts:
    & Required<Omit<WorkerOptions, "hooks" | "listener">>
    & Pick<WorkerOptions, "listener">
    & { hooks: WorkerHooks };
  readonly #log: Logger;
  readonly #inFlight = new Map<string, InFlight>();
  /** Runs in `#inFlight` whose handler has not settled yet. */
  #handlers = 0;
  readonly #stopping = new AbortController();
  readonly #loops: Promise<void>[] = [];
  readonly #notify: () => void;
  readonly #eventsWritten: () => void;
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();
  readonly #reclaimer: Reclaimer;
  readonly #completions: Batcher<Completion, boolean>;
  #started = false;
  #woken = false;
  #wakeup: AbortController | undefined;
  #unlisten: (() => Promise<void>) | undefined;

  constructor(sql: Sql, registry: WorkflowRegistry, opts: WorkerOptions) {
    this.#sql = sql;
    this.#registry = registry;
    this.#opts = {
      retryCapMs: 5 * MINUTE,
      // Half a lease bounds how long a dead worker's run waits beyond its
      // lease; every worker reclaims, so the fleet looks more often still.
      reclaimMs: Math.max(opts.pollMs, Math.min(opts.leaseMs / 2, 5 * SECOND)),
      resultMaxBytes: DEFAULT_RUN_RESULT_MAX_BYTES,
      hooks: {},
      ...opts,
    };
    this.#log = opts.log.with({ worker: opts.id });
    // Completions of runs that end together share one statement and commit
    // (group commit): short runs would otherwise pay a WAL flush each.
    this.#completions = new Batcher(
      (batch) => completeRuns(sql, opts.id, batch),
      { maxBatch: COMPLETION_BATCH, maxConcurrent: COMPLETION_FLUSHES, gatherTurn: true },
      // A batch that failed for the database's sake is retried by each
      // caller's own #write; bisecting it would only fail it again.
      (err) => !isUnavailable(err),
    );
    const waker = new Waker(
      () => notifyQueued(sql),
      (err) => this.#log.warn("notify failed", { error: err }),
      WAKE_MIN_INTERVAL_MS,
    );
    this.#notify = () => waker.poke();
    // Every claim, finish, release and reclaim appends events: wake the
    // outbox relay after they commit, coalesced like the queue wake-ups.
    const eventsWaker = new Waker(
      () => notifyChannels(sql, [OUTBOX_CHANNEL]),
      (err) => this.#log.warn("outbox notify failed", { error: err }),
      WAKE_MIN_INTERVAL_MS,
    );
    this.#eventsWritten = () => eventsWaker.poke();
    this.#reclaimer = new Reclaimer(sql, {
      intervalMs: this.#opts.reclaimMs,
      log: this.#log,
      onReclaimed: (runs) => {
        this.#opts.hooks.onReclaimed?.(runs);
        if (runs.length > 0) this.#eventsWritten();
        // Requeued runs are due now: this worker and the others may take them.
        if (runs.some((r) => r.status === "queued")) {
          this.#wake();
          this.#notify();
        }
      },
    });
  }

  /** This worker's lease owner id. */
  get id(): string {
    return this.#opts.id;
  }

  /** Runs being executed (or finishing) right now. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /** Subscribes to wake-ups and starts claiming and reclaiming. */
  async start(): Promise<void> {
    if (this.#started) throw new Error("worker already started");
    if (this.#stopping.signal.aborted) throw new Error("worker stopped");
    this.#started = true;
    // Waiting for the first LISTEN means a NOTIFY sent after start() returns
    // is not missed; if Postgres is down, polling carries on meanwhile.
    if (!await this.#listen()) this.#loops.push(this.#listenLoop());
    this.#loops.push(this.#claimLoop());
    await this.#reclaimer.start();
    this.#log.info("worker started", {
      concurrency: this.#opts.concurrency,
      lease_ms: this.#opts.leaseMs,
      poll_ms: this.#opts.pollMs,
    });
  }

  /**
   * Stops claiming, waits up to `shutdownMs` for runs in flight, then aborts
   * and releases the rest. Safe to call twice; does not close the pool.
   */
  stop(): Promise<void> {
    return this.#stop();
  }

  readonly #stop = once(async () => {
    this.#stopping.abort();
    this.#wakeup?.abort();
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await Promise.all([...this.#loops, this.#reclaimer.stop()]);
    try {
      await this.#unlisten?.();
    } catch (err) {
      this.#log.warn("unlisten failed", { error: err });
    }
    if (this.#inFlight.size > 0) {
      this.#log.info("waiting for runs in flight", { runs: this.#inFlight.size });
      const all = Promise.all([...this.#inFlight.values()].map((f) => f.finished));
      const timeout = new AbortController();
      await Promise.race([all, delay(this.#opts.shutdownMs, timeout.signal)]);
      timeout.abort();
    }
    await this.#releaseUnfinished();
  });

  // ---- claiming ----

  async #claimLoop(): Promise<void> {
    const { concurrency, id, leaseMs, pollMs } = this.#opts;
    let failures = 0;
    // A claim costs about the same for one run as for sixteen (its commit
    // and the tenant scan dominate): while runs are finishing, a few slots
    // are let free up before claiming, for at most CLAIM_COALESCE_MS.
    const minClaim = Math.max(1, Math.floor(concurrency / 4));
    let coalescingSince: number | undefined;
    while (!this.#stopping.signal.aborted) {
      // At most `concurrency` handlers, and as many runs again whose outcome
      // is being written: a slow database bounds how many finish in memory.
      const free = Math.min(
        concurrency - this.#handlers,
        2 * concurrency - this.#inFlight.size,
      );
      if (free > 0 && free < minClaim && this.#handlers > 0) {
        coalescingSince ??= Date.now();
        const left = coalescingSince + CLAIM_COALESCE_MS - Date.now();
        if (left > 0) {
          await this.#sleep(left);
          continue;
        }
      }
      coalescingSince = undefined;
      if (free > 0) {
        // Reset before the claim: a wake-up arriving while it runs is kept
        // and makes the next wait return at once.
        this.#woken = false;
        const claimedAt = Date.now();
        let claimed: ClaimedRun[];
        try {
          claimed = await claimRuns(this.#sql, id, free, leaseMs);
          failures = 0;
        } catch (err) {
          failures++;
          this.#log.warn("claim failed", { error: err, failures });
          await delay(
            backoffWithJitter(failures, DB_RETRY_BASE_MS, DB_RETRY_CAP_MS),
            this.#stopping.signal,
          );
          continue;
        }
        if (claimed.length > 0) {
          this.#opts.hooks.onClaimed?.(claimed.length);
          this.#eventsWritten();
        }
        for (const run of claimed) this.#execute(run, claimedAt);
        // A full batch suggests more are due: claim again without waiting.
        if (claimed.length === free) continue;
      }
      await this.#sleep(pollMs);
    }
  }

  /** Waits `ms`, or less if woken (NOTIFY, a free slot, a retry falling due) or stopping. */
  async #sleep(ms: number): Promise<void> {
    if (this.#woken) {
      this.#woken = false;
      return;
    }
    this.#wakeup = new AbortController();
    await delay(ms, AbortSignal.any([this.#wakeup.signal, this.#stopping.signal]));
    this.#wakeup = undefined;
    this.#woken = false;
  }

  #wake(): void {
    this.#woken = true;
    this.#wakeup?.abort();
  }

  /** Wakes this worker at `at` (a retry it scheduled), so it need not wait for a poll. */
  #wakeAt(at: Date): void {
    if (this.#stopping.signal.aborted) return;
    const ms = Math.max(0, at.getTime() - Date.now());
    if (ms > this.#opts.pollMs * 10) return; // polling will find it soon enough
    const t = setTimeout(() => {
      this.#timers.delete(t);
      this.#wake();
    }, ms);
    this.#timers.add(t);
  }

  async #listen(): Promise<boolean> {
    const own = this.#opts.listener?.();
    const sql = own ?? this.#sql;
    try {
      // onlisten also fires after postgres.js re-connects the listener:
      // NOTIFYs sent while it was down are lost, so claim once then.
      const sub = await sql.listen(QUEUE_CHANNEL, () => this.#wake(), () => this.#wake());
      const cancels = await sql.listen(CANCEL_CHANNEL, (payload) => this.#onCancelNotice(payload))
        .catch(async (err) => {
          await sub.unlisten().catch(() => {});
          throw err;
        });
      // Both settle before stop() returns, even when one fails: a stopped
      // worker must not have a statement of its own still on the wire.
      const unlistenBoth = async () => {
        const results = await Promise.allSettled([sub.unlisten(), cancels.unlisten()]);
        const failed = results.find((r) => r.status === "rejected");
        if (failed) throw (failed as PromiseRejectedResult).reason;
      };
      this.#unlisten = own
        ? async () => {
          await unlistenBoth();
          await own.end({ timeout: 1 });
        }
        : async () => {
          await unlistenBoth();
        };
      return true;
    } catch (err) {
      await own?.end({ timeout: 0 }).catch(() => {});
      this.#log.warn(
        own ? "listen failed; polling until it succeeds" : "listen failed; polling only",
        { error: err },
      );
      return false;
    }
  }

  async #listenLoop(): Promise<void> {
    if (!this.#opts.listener) return;
    for (let n = 1; !this.#stopping.signal.aborted; n++) {
      await delay(backoffWithJitter(n, SECOND, 30 * SECOND), this.#stopping.signal);
      if (this.#stopping.signal.aborted) return;
      if (await this.#listen()) {
        if (this.#stopping.signal.aborted) await this.#unlisten?.();
        return;
      }
    }
  }

  // ---- executing ----

  #execute(run: ClaimedRun, claimedAt: number): void {
    const key = `${run.tenant_id}/${run.run_id}`;
    const entry: InFlight = {
      run,
      abort: new AbortController(),
      done: new AbortController(),
      nudge: new AbortController(),
      cancelRequested: false,
      abandoned: false,
      lost: false,
      settled: false,
      finished: Promise.resolve(),
    };
    this.#inFlight.set(key, entry);
    this.#handlers++;
    entry.finished = this.#runOne(entry, claimedAt)
      .catch((err) => {
        this.#log.error("run bookkeeping failed", {
          tenant: run.tenant_id,
          run_id: run.run_id,
          error: err,
        });
      })
      .finally(() => {
        this.#settle(entry);
        entry.done.abort();
        this.#inFlight.delete(key);
        this.#wake();
      });
  }

  /**
   * The handler is done: its slot is free for the next claim while its
   * outcome is written, so claiming overlaps the finishing writes instead of
   * waiting for them.
   */
  #settle(entry: InFlight): void {
    if (entry.settled) return;
    entry.settled = true;
    this.#handlers--;
    this.#wake();
  }

  async #runOne(entry: InFlight, claimedAt: number): Promise<void> {
    const { run } = entry;
    const { leaseMs } = this.#opts;
    const log = this.#log.with({
      tenant: run.tenant_id,
      run_id: run.run_id,
      attempt: run.attempts,
    });
    // Measured from before the claim was sent: never later than the
    // database's own expiry, so this worker gives up no later than it must.
    const lease = { until: claimedAt + leaseMs };
    const beat = this.#heartbeatLoop(entry, lease, log);
    try {
      log.debug("run started", { workflow: `${run.workflow_name}@${run.workflow_version}` });
      let outcome: AttemptResult;
      try {
        outcome = await this.#attempt(entry, log);
      } finally {
        this.#settle(entry);
      }
      if (entry.abandoned) return; // stop() releases it
      if (entry.lost) {
        log.warn("lease lost; result discarded", { ok: outcome.ok });
        this.#opts.hooks.onFinished?.("lost");
        return;
      }
      if (outcome.ok) {
        // Checked here, where it can fail the run, not in the write: the
        // same result would fail every attempt, so the failure is final.
        const bad = checkResult(outcome.result, this.#opts.resultMaxBytes);
        if (bad) return await this.#fail(entry, lease, bad, true, log);
        if (entry.cancelRequested) {
          log.info("cancel requested, but the handler returned a result: the run succeeds");
        }
        const ok = await this.#write(
          lease,
          () =>
            this.#completions.submit({
              tenant_id: run.tenant_id,
              run_id: run.run_id,
              attempt: run.attempts,
              result: outcome.result,
            }),
        );
        this.#opts.hooks.onFinished?.(ok ? "succeeded" : "lost");
        if (ok) log.debug("run succeeded");
        else {
          this.#opts.hooks.onFenced?.("complete");
          log.warn("lease lost before completion (fenced); result discarded");
        }
      } else {
        await this.#fail(entry, lease, outcome.error, outcome.final, log);
      }
    } finally {
      entry.done.abort();
      await beat;
    }
  }

  async #fail(
    entry: InFlight,
    lease: { until: number },
    error: AttemptError,
    final: boolean,
    log: Logger,
  ): Promise<void> {
    const { run } = entry;
    const { id, retryBaseMs, retryCapMs } = this.#opts;
    // attempts - 1: the first retry waits at most the base.
    const backoff = backoffWithJitter(run.attempts - 1, retryBaseMs, retryCapMs);
    const bounded = boundError(error, this.#opts.resultMaxBytes);
    const res = await this.#write(
      lease,
      () =>
        failAttempt(
          this.#sql,
          run.tenant_id,
          run.run_id,
          id,
          run.attempts,
          bounded,
          backoff,
          final,
        ),
    );
    if (!res) {
      // Also what a retried write sees when its first send committed but the
      // reply was lost: the attempt is over either way.
      log.warn("lease lost before the failure was recorded (fenced)", {
        error: bounded.message,
      });
      this.#opts.hooks.onFenced?.("fail");
      this.#opts.hooks.onFinished?.("lost");
    } else if (res.status === "cancelled") {
      log.info("run cancelled", { attempts: res.attempts });
      this.#opts.hooks.onFinished?.("cancelled");
    } else if (res.status === "queued") {
      log.info("attempt failed; retrying", { error: error.message, retry_at: res.retry_at });
      this.#opts.hooks.onFinished?.("retrying");
      this.#wakeAt(res.retry_at);
    } else {
      log.warn("run failed", { error: error.message, code: error.code, attempts: res.attempts });
      this.#opts.hooks.onFinished?.("failed");
    }
  }

  /** Resolves the pinned version, validates the input again, runs the handler. */
  async #attempt(entry: InFlight, log: Logger): Promise<AttemptResult> {
    const { run } = entry;
    const ref = `${run.workflow_name}@${run.workflow_version}`;
    const wf = this.#registry.resolve(ref);
    if (!wf) {
      // Not final: in a rolling deploy another worker may know this version.
      return {
        ok: false,
        final: false,
        error: attemptError(
          "unknown-workflow",
          `workflow ${ref} is not registered in worker ${this.#opts.id} (known: ${
            this.#registry.list().join(", ")
          })`,
        ),
      };
    }
    const parsed = wf.workflow.input.safeParse(run.input);
    if (!parsed.success) {
      // Final: the stored input will never validate against this version.
      return {
        ok: false,
        final: true,
        error: attemptError("validation", `input does not match ${ref}`, {
          issues: parsed.error.issues.map((i) => ({
            path: i.path.map(String).join("."),
            message: i.message,
          })),
        }),
      };
    }
    try {
      const result = await wf.workflow.handler(parsed.data, {
        tenantId: run.tenant_id,
        runId: run.run_id,
        attempt: run.attempts,
        signal: entry.abort.signal,
        log,
      });
      return { ok: true, result };
    } catch (err) {
      return {
        ok: false,
        final: false,
        error: { message: errorMessage(err), name: err instanceof Error ? err.name : undefined },
      };
    }
  }

  /**
   * Extends the lease every third of it until the run is done; aborts the
   * handler when lost. Each beat is bounded by a timeout (a third of the
   * lease, and never past the lease this worker last confirmed) and then
   * cancelled: a beat stuck on a row lock or a dead connection must not keep
   * the handler running on a lease that has run out. A beat that timed out
   * counts as failed (it may or may not have been written): the lease is only
   * extended by a beat that answered.
   */
  async #heartbeatLoop(entry: InFlight, lease: { until: number }, log: Logger): Promise<void> {
    const { run } = entry;
    const { id, leaseMs } = this.#opts;
    const every = leaseMs / 3;
    const stop = entry.done.signal;
    while (!stop.aborted) {
      // After a failed beat, try again sooner, but not in a tight loop.
      entry.nudge = new AbortController();
      await delay(
        Math.max(0, Math.min(every, lease.until - Date.now() - every)),
        AbortSignal.any([stop, entry.nudge.signal]),
      );
      if (stop.aborted) return;
      const sentAt = Date.now();
      const timeout = AbortSignal.timeout(Math.max(1, Math.min(every, lease.until - sentAt)));
      try {
        const held = await heartbeat(
          this.#sql,
          run.tenant_id,
          run.run_id,
          id,
          run.attempts,
          leaseMs,
          // Not `stop`: a beat in flight when the run ends is left to finish.
          // Cancelling is a request to the backend, which may by then run
          // the connection's next statement; only a beat that hangs is worth it.
          timeout,
        );
        if (stop.aborted) return;
        if (held === "lost") {
          this.#opts.hooks.onFenced?.("heartbeat");
          return this.#loseLease(entry, log, "lease lost (heartbeat fenced)");
        }
        lease.until = sentAt + leaseMs;
        // Beating goes on: the lease must outlive the handler winding down.
        if (held === "cancel-requested" && !entry.cancelRequested) {
          entry.cancelRequested = true;
          log.info("cancel requested; aborting the run");
          entry.abort.abort(new DOMException("run cancelled on request", "AbortError"));
        }
      } catch (err) {
        if (stop.aborted) return;
        if (timeout.aborted && err === timeout.reason) {
          this.#opts.hooks.onHeartbeatTimeout?.();
          log.warn("heartbeat timed out; lease unconfirmed", {
            lease_left_ms: lease.until - Date.now(),
          });
        } else log.warn("heartbeat failed", { error: err });
        if (Date.now() >= lease.until) return this.#loseLease(entry, log, "lease expired");
        await delay(Math.min(every, 250), stop);
      }
    }
  }

  /** A cancel notification (`<tenant>/<run_id>`): that run's heartbeat looks now. */
  #onCancelNotice(payload: string): void {
    this.#inFlight.get(payload)?.nudge.abort();
  }

  #loseLease(entry: InFlight, log: Logger, why: string): void {
    entry.lost = true;
    log.warn(`${why}; aborting the run`);
    entry.abort.abort(new Error(why));
  }

  /**
   * Runs a finishing write, retrying while Postgres is unavailable (or the
   * statement was cancelled: a statement timeout, an operator, a heartbeat's
   * cancel that reached the connection's next statement) and the lease
   * lasts; after that the run is someone else's (the reclaimer's). A retry
   * is safe because every finishing write is fenced by attempt: one that was
   * applied but whose reply was lost is refused the second time.
   */
  async #write<T>(lease: { until: number }, fn: () => Promise<T>): Promise<T | undefined> {
    for (let n = 1;; n++) {
      try {
        const written = await fn();
        // A fenced write wrote nothing; waking the relay for it is harmless.
        this.#eventsWritten();
        return written;
      } catch (err) {
        const transient = isUnavailable(err) || (err as { code?: string }).code === QUERY_CANCELED;
        if (!transient || Date.now() >= lease.until) throw err;
        this.#log.warn("finishing write failed; retrying", { error: err });
        await delay(backoffWithJitter(n, DB_RETRY_BASE_MS, SECOND));
      }
    }
  }

  /** After the shutdown wait: aborts the handlers still running and gives their runs back. */
  async #releaseUnfinished(): Promise<void> {
    const stuck = [...this.#inFlight.values()].filter((f) => !f.settled);
    const writing = [...this.#inFlight.values()].filter((f) => f.settled).map((f) => f.finished);
    let released = 0;
    await Promise.all(stuck.map(async (f) => {
      f.abandoned = true;
      f.done.abort();
      f.abort.abort(new Error("worker shutting down"));
      const { run } = f;
      try {
        const status = await releaseRun(
          this.#sql,
          run.tenant_id,
          run.run_id,
          this.#opts.id,
          run.attempts,
          "worker shutdown",
        );
        if (status === "queued") released++;
        if (!status) this.#opts.hooks.onFenced?.("release");
        this.#opts.hooks.onFinished?.(
          status === "queued" ? "released" : status === "cancelled" ? "cancelled" : "lost",
        );
        this.#log.info(
          status === "queued"
            ? "run released"
            : status === "cancelled"
            ? "run cancelled"
            : "run already lost",
          {
            tenant: run.tenant_id,
            run_id: run.run_id,
            attempt: run.attempts,
          },
        );
      } catch (err) {
        // Its lease will expire and the reclaimer of another worker takes it.
        this.#log.warn("release failed", { tenant: run.tenant_id, run_id: run.run_id, error: err });
      }
    }));
    // Runs whose handler finished are only writing their outcome: let them.
    await Promise.all(writing);
    // Released runs are due now: wake the workers still running.
    if (released > 0) {
      await notifyChannels(this.#sql, [QUEUE_CHANNEL, OUTBOX_CHANNEL])
        .catch((err) => this.#log.warn("notify failed", { error: err }));
    }
  }
}
