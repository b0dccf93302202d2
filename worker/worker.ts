/**
 * The executor. A `Worker` claims due queued runs from Postgres (woken by
 * LISTEN/NOTIFY, polling as the fallback), runs at most `concurrency` of them
 * at once, keeps their leases alive (one renewal for all), and finishes each one:
 * `succeeded`, retried with backoff, or `failed` after its last attempt.
 * A run whose handler returned gives its slot to the next claim while its
 * outcome is written (completions of runs that end together share one
 * statement), so claiming overlaps those writes; at most `concurrency` more
 * runs wait for such a write before claiming stops.
 * Its `LeaseRenewer` renews the leases of all its runs in one statement
 * every third of a lease (worker/heartbeat.ts).
 * A cancel requested of a running run (POST /v1/runs/{id}/cancel) reaches
 * the worker through that renewal, which reads the request from the row
 * (a NOTIFY on `poimen_cancel` only makes it renew at once): the handler's
 * `ctx.signal` is aborted, and when the handler then fails (throws, as a
 * handler that honours the signal does), the run ends `cancelled`, written
 * like any attempt's end, fenced by attempt. A handler that ignores the
 * signal and returns a result has done the work: the run succeeds.
 * The workers elect a leader (core/leader.ts), which runs the `Reclaimer`
 * (worker/reclaimer.ts) and whatever else is registered with `whileLeader`:
 * the reclaimer returns runs whose lease expired (their worker died) to the
 * queue, so a worker killed
 * with SIGKILL loses no run: it is executed again elsewhere (execution is
 * at-least-once; a handler with side effects must be idempotent per run id).
 *
 * The parts, each in a file of its own: claim_loop.ts (claiming into free
 * slots), attempt.ts (one attempt's state and its handler call),
 * durable_context.ts (the handler's durable calls: steps replayed from
 * their stored results, sleeps and signal waits that suspend the run and
 * free its slot), heartbeat.ts (lease renewal and cancel requests),
 * finish.ts (the writes that end an attempt, and the release on shutdown),
 * leader_tasks.ts (the leader's maintenance: reclaimer, waker of waiting
 * runs, lane repairer, slot reconciler). This file holds them
 * together: which runs are in flight, start and stop.
 */
import type { Logger } from "../core/log.ts";
import { Waker } from "../core/waker.ts";
import { WakeableSleep } from "../core/wakeable_sleep.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { delay, MINUTE, SECOND } from "../core/time.ts";
import { Listener } from "../db/listener.ts";
import { ChildAdmission } from "./child_runs.ts";
import {
  CANCEL_CHANNEL,
  notifyChannels,
  notifyQueued,
  OUTBOX_CHANNEL,
  QUEUE_CHANNEL,
} from "../db/notify.ts";
import type { Sql } from "../db/pool.ts";
import type { ClaimedRun } from "../db/claims.ts";
import type { WorkflowRegistry } from "../workflows/registry.ts";
import { type Attempt, type AttemptResult, newAttempt, runHandler } from "./attempt.ts";
import { claimLoop } from "./claim_loop.ts";
import { Finisher } from "./finish.ts";
import { LeaseRenewer } from "./heartbeat.ts";
import type { WorkerHooks } from "./hooks.ts";
import { registerLeaderTasks } from "./leader_tasks.ts";
import { LeaderElector } from "../core/leader.ts";
import { WorkerPresence } from "./presence.ts";
import { DEFAULT_RUN_RESULT_MAX_BYTES } from "./run_output.ts";
import type { DurableDeps } from "./durable_context.ts";
import { DEFAULT_RUN_STEP_MAX_BYTES, DEFAULT_SUSPEND_AFTER_MS } from "./durable_defaults.ts";

export type { AttemptOutcome, FencedStatement, WorkerHooks } from "./hooks.ts";

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
  /** Mean time between two rounds of the slot reconciler; 30 s by default, 0: off. */
  slotReconcileMs?: number;
  /** Concurrency groups the slot reconciler checks per round; 100 by default. */
  slotReconcileGroups?: number;
  /** Mean time between two rounds of the lane repairer; a minute by default, 0: off. */
  laneRepairMs?: number;
  /** Lanes of queued runs the lane repairer walks per round; 1,000 by default. */
  laneRepairLanes?: number;
  /**
   * Largest result (and error) of a run, as JSON bytes (RUN_RESULT_MAX_BYTES);
   * a larger result fails the attempt with `result-too-large`.
   */
  resultMaxBytes?: number;
  /**
   * A durable sleep or signal wait with more time left than this suspends
   * the run (WORKER_SUSPEND_AFTER_MS, 5 s by default, at most 5 s); one
   * with less waits in the worker.
   */
  suspendAfterMs?: number;
  /** Largest result of a durable step, as JSON bytes (RUN_STEP_MAX_BYTES). */
  stepMaxBytes?: number;
  /**
   * Mean time between two looks of the leader's waker for waiting runs whose
   * deadline came (WORKER_WAKE_MS, 1 s by default): how late a long sleep ends.
   */
  wakeMs?: number;
  log: Logger;
  hooks?: WorkerHooks;
  /**
   * How often a worker tries to become the leader, and the leader checks it
   * still is; by default the reclaim interval.
   */
  leaderRetryMs?: number;
  /**
   * Opens a one-connection pool the leader's lock is held on (ended when
   * leadership ends): `workerPools` makes it.
   */
  leaderSession: () => Sql;
  /**
   * Opens a pool used only for LISTEN, so a failed LISTEN is retried on a
   * fresh pool (db/listener.ts); without it, the worker listens on the main
   * pool once and, if that fails, only polls.
   */
  listener?: () => Sql;
}

// NOTIFYs from one worker start at least this far apart: a busy worker would
// otherwise send one per claim and per completion batch, each a commit of its
// own (0.40 statements per run against 0.15, measured at 6,600 runs/s).
const WAKE_MIN_INTERVAL_MS = 10;

/** Claims and executes runs; see the module comment. */
export class Worker implements Service {
  readonly #sql: Sql;
  readonly #registry: WorkflowRegistry;
  readonly #opts:
    & Required<Omit<WorkerOptions, "hooks" | "listener" | "leaderRetryMs">>
    & Pick<WorkerOptions, "listener" | "leaderRetryMs">
    & { hooks: WorkerHooks };
  readonly #log: Logger;
  readonly #inFlight = new Map<string, Attempt>();
  /** Runs in `#inFlight` whose handler has not settled yet. */
  #handlers = 0;
  readonly #stopping = new AbortController();
  /** The wait between claims: a NOTIFY, a freed slot or a retry falling due ends it. */
  readonly #sleep = new WakeableSleep(this.#stopping.signal);
  readonly #loops: Promise<void>[] = [];
  readonly #notify: () => void;
  readonly #eventsWritten: () => void;
  readonly #timers = new Set<ReturnType<typeof setTimeout>>();
  readonly #leader: LeaderElector;
  readonly #listener: Listener;
  readonly #finisher: Finisher;
  readonly #presence: WorkerPresence;
  readonly #renewer: LeaseRenewer;
  readonly #durable: DurableDeps;
  #started = false;

  constructor(sql: Sql, registry: WorkflowRegistry, opts: WorkerOptions) {
    this.#sql = sql;
    this.#registry = registry;
    this.#opts = {
      retryCapMs: 5 * MINUTE,
      // Half a lease bounds how long a dead worker's run waits beyond its
      // lease (the leader reclaims for the fleet).
      reclaimMs: Math.max(opts.pollMs, Math.min(opts.leaseMs / 2, 5 * SECOND)),
      resultMaxBytes: DEFAULT_RUN_RESULT_MAX_BYTES,
      slotReconcileMs: 30 * SECOND,
      slotReconcileGroups: 100,
      laneRepairMs: MINUTE,
      laneRepairLanes: 1000,
      suspendAfterMs: DEFAULT_SUSPEND_AFTER_MS,
      stepMaxBytes: DEFAULT_RUN_STEP_MAX_BYTES,
      wakeMs: SECOND,
      hooks: {},
      ...opts,
    };
    this.#log = opts.log.with({ worker: opts.id });
    const waker = new Waker(
      () => notifyQueued(sql),
      (err) => this.#log.warn("notify failed", { error: err }),
      WAKE_MIN_INTERVAL_MS,
    );
    this.#notify = () => waker.poke();
    // Every claim, finish, release and reclaim appends events: wake the
    // outbox publisher after they commit, coalesced like the queue wake-ups.
    const eventsWaker = new Waker(
      () => notifyChannels(sql, [OUTBOX_CHANNEL]),
      (err) => this.#log.warn("outbox notify failed", { error: err }),
      WAKE_MIN_INTERVAL_MS,
    );
    this.#eventsWritten = () => eventsWaker.poke();
    this.#finisher = new Finisher({
      sql,
      owner: opts.id,
      retryBaseMs: this.#opts.retryBaseMs,
      retryCapMs: this.#opts.retryCapMs,
      resultMaxBytes: this.#opts.resultMaxBytes,
      hooks: this.#opts.hooks,
      log: this.#log,
      eventsWritten: this.#eventsWritten,
      retryAt: (at) => this.#wakeAt(at),
    });
    const wake = () => this.#sleep.wake();
    this.#listener = new Listener({
      ...(opts.listener ? { connect: opts.listener } : { pool: sql }),
      channels: {
        [QUEUE_CHANNEL]: wake,
        // A cancel notification (`<tenant>/<run_id>`) of a run it holds: renew now.
        [CANCEL_CHANNEL]: (key) => {
          if (this.#inFlight.has(key)) this.#renewer.nudge();
        },
      },
      // NOTIFYs sent while the listener was down are lost: claim once then.
      onListen: wake,
      log: this.#log,
    });
    this.#presence = new WorkerPresence(sql, opts.id, registry, this.#log);
    this.#renewer = new LeaseRenewer({
      sql,
      owner: opts.id,
      leaseMs: this.#opts.leaseMs,
      hooks: this.#opts.hooks,
      log: this.#log,
    });
    this.#leader = new LeaderElector({
      role: "worker",
      connect: opts.leaderSession,
      retryMs: opts.leaderRetryMs ?? this.#opts.reclaimMs,
      log: this.#log,
      onChange: (leader) => this.#opts.hooks.onLeader?.(leader),
    });
    this.#durable = {
      sql,
      owner: opts.id,
      suspendAfterMs: Math.min(this.#opts.suspendAfterMs, DEFAULT_SUSPEND_AFTER_MS),
      stepMaxBytes: this.#opts.stepMaxBytes,
      errorMaxBytes: this.#opts.resultMaxBytes,
      hooks: this.#opts.hooks,
      eventsWritten: this.#eventsWritten,
      // Children it admits are due now: wake the claimers and the outbox.
      children: new ChildAdmission(sql, this.#log, () => {
        this.#sleep.wake();
        this.#notify();
        this.#eventsWritten();
      }),
    };
    registerLeaderTasks(this.#leader, sql, {
      ...this.#opts,
      log: this.#log,
      eventsWritten: this.#eventsWritten,
      // Runs became due: this worker and the others may take them.
      due: () => {
        this.#sleep.wake();
        this.#notify();
      },
    });
  }

  /** This worker's lease owner id. */
  get id(): string {
    return this.#opts.id;
  }

  /** Whether this worker is the fleet's leader now (runs the reclaimer and the queue gauges). */
  get isLeader(): boolean {
    return this.#leader.isLeader;
  }

  /**
   * Runs a service made by `make` on the leader only: made and started when
   * this worker becomes the leader, stopped when it stops being it (the
   * place for fleet-wide maintenance: reclaiming, reconciling counts).
   * Register before `start()`.
   */
  whileLeader(name: string, make: () => Service): void {
    this.#leader.whileLeader(name, make);
  }

  /** Runs being executed (or finishing) right now. */
  get inFlight(): number {
    return this.#inFlight.size;
  }

  /**
   * Registers its workflow versions in the catalog (a `workflow-conflict`
   * error when one is registered with another definition; while Postgres is
   * away it waits, until `signal` is aborted), subscribes to wake-ups and
   * starts claiming and reclaiming.
   */
  async start(signal?: AbortSignal): Promise<void> {
    if (this.#started) throw new Error("worker already started");
    if (this.#stopping.signal.aborted) throw new Error("worker stopped");
    this.#started = true;
    await this.#presence.start(
      signal ? AbortSignal.any([signal, this.#stopping.signal]) : this.#stopping.signal,
    );
    if (!this.#presence.registered) return; // stopped before Postgres came

    // Waiting for the first LISTEN means a NOTIFY sent after start() returns
    // is not missed; if Postgres is down, polling carries on meanwhile.
    await this.#listener.start();
    await this.#renewer.start();
    const { id, concurrency, leaseMs, pollMs } = this.#opts;
    const hosted = this.#registry.hostedByLimit();
    this.#loops.push(claimLoop({
      sql: this.#sql,
      owner: id,
      concurrency,
      leaseMs,
      pollMs,
      hosted: hosted.unlimited,
      limited: hosted.limited,
      log: this.#log,
      sleep: this.#sleep,
      stopping: this.#stopping.signal,
      handlers: () => this.#handlers,
      held: () => this.#inFlight.size,
      claimed: (runs, claimedAt) => {
        if (runs.length === 0) return;
        this.#opts.hooks.onClaimed?.(runs.length);
        this.#eventsWritten();
        for (const run of runs) this.#execute(run, claimedAt);
      },
    }));
    await this.#leader.start();
    this.#log.info("worker started", {
      workflows: this.#registry.list(),
      concurrency,
      lease_ms: leaseMs,
      poll_ms: pollMs,
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
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    await Promise.all([...this.#loops, this.#leader.stop()]);
    await this.#listener.stop();
    if (this.#inFlight.size > 0) {
      this.#log.info("waiting for runs in flight", { runs: this.#inFlight.size });
      const all = Promise.all([...this.#inFlight.values()].map((a) => a.finished));
      const timeout = new AbortController();
      await Promise.race([all, delay(this.#opts.shutdownMs, timeout.signal)]);
      timeout.abort();
    }
    await this.#finisher.releaseUnfinished([...this.#inFlight.values()]);
    await this.#renewer.stop();
    await this.#presence.stop();
  });

  /** Wakes this worker at `at` (a retry it scheduled), so it need not wait for a poll. */
  #wakeAt(at: Date): void {
    if (this.#stopping.signal.aborted) return;
    const ms = Math.max(0, at.getTime() - Date.now());
    if (ms > this.#opts.pollMs * 10) return; // polling will find it soon enough
    const t = setTimeout(() => {
      this.#timers.delete(t);
      this.#sleep.wake();
    }, ms);
    this.#timers.add(t);
  }

  #execute(run: ClaimedRun, claimedAt: number): void {
    // Measured from before the claim was sent: never later than the
    // database's own expiry, so this worker gives up no later than it must.
    const attempt = newAttempt(run, claimedAt, this.#opts.leaseMs, this.#log);
    this.#inFlight.set(attempt.key, attempt);
    this.#renewer.add(attempt);
    this.#handlers++;
    attempt.finished = this.#runOne(attempt)
      .catch((err) => {
        this.#log.error("run bookkeeping failed", {
          tenant: run.tenant_id,
          run_id: run.run_id,
          error: err,
        });
      })
      .finally(() => {
        this.#settle(attempt);
        attempt.done.abort();
        this.#renewer.remove(attempt);
        this.#inFlight.delete(attempt.key);
        this.#sleep.wake();
      });
  }

  /**
   * The handler is done: its slot is free for the next claim while its
   * outcome is written, so claiming overlaps the finishing writes instead of
   * waiting for them.
   */
  #settle(attempt: Attempt): void {
    if (attempt.settled) return;
    attempt.settled = true;
    this.#handlers--;
    this.#sleep.wake();
  }

  /** Executes one claimed attempt (its lease renewed meanwhile), then the finishing write. */
  async #runOne(attempt: Attempt): Promise<void> {
    const { run } = attempt;
    const { id } = this.#opts;
    try {
      attempt.log.debug("run started", {
        workflow: `${run.workflow_name}@${run.workflow_version}`,
      });
      let outcome: AttemptResult;
      try {
        outcome = await runHandler(this.#registry, id, attempt, this.#durable);
      } finally {
        this.#settle(attempt);
      }
      await this.#finisher.finish(attempt, outcome);
    } finally {
      attempt.done.abort();
      this.#renewer.remove(attempt);
    }
  }
}
