/**
 * Watching runs for callers that wait (`Prefer: wait=N`) or follow a run's
 * events (`text/event-stream`), without polling the database per caller.
 *
 * Every state change of a run appends its event in the same transaction and
 * is followed, after the commit, by a coalesced `NOTIFY poimen_outbox` (the
 * outbox's wake-up: the API after admissions, workers after claims and
 * finishes, the reclaimer; `poimen_cancel` after a cancel request). A
 * `RunWatch` listens on both; each notification schedules one check, at
 * most one per `coalesceMs` (longer with many runs watched, so the probes stay
 * under `PROBES_PER_SECOND`), which reads the last event seq of only the runs
 * someone watches (one primary-key probe each) and wakes the watchers whose
 * run has moved past what they saw. A notification lost (a reconnect, a
 * dropped connection) is made up for by a check after each LISTEN and a
 * recheck every `recheckMs` while anyone watches.
 *
 * The watchers an API process holds are bounded (`maxWatchers`): past it,
 * `open` throws a retryable `busy` (503 with Retry-After). So that one tenant
 * cannot take them all, each tenant holds at most `maxPerTenant` of them: past
 * it, `open` throws `too-many-streams` (429 with Retry-After), a limit of the
 * tenant's own, checked first. A caller that goes away closes its slot at once.
 */
import { PoimenError } from "../core/errors.ts";
import { once, type Service } from "../core/lifecycle.ts";
import type { Logger } from "../core/log.ts";
import { MINUTE, SECOND } from "../core/time.ts";
import { Listener } from "../db/listener.ts";
import { CANCEL_CHANNEL, OUTBOX_CHANNEL } from "../db/notify.ts";
import type { Sql } from "../db/pool.ts";
import { selectEventSeqs } from "../db/runs.ts";

/** Options of `RunWatch`. */
export interface RunWatchOptions {
  /** Opens the one-connection pool it LISTENs on (db/listener.ts). */
  listen: () => Sql;
  /** Watchers (waits and streams) held at once; past it, `busy`. */
  maxWatchers: number;
  /**
   * Watchers one tenant holds at once; past it, `too-many-streams`. All of
   * `maxWatchers` by default; the API gives `tenantShare(maxWatchers)`
   * unless RUN_WATCHERS_PER_TENANT says otherwise.
   */
  maxPerTenant?: number;
  /** The longest an event stream stays open (api/run_stream.ts); 15 minutes by default. */
  streamMaxMs?: number;
  /**
   * How long an event stream's buffer may stay full (its reader not reading)
   * before the stream is cut; 30 s by default.
   */
  streamStallMs?: number;
  log: Logger;
  /** Checks start at least this far apart (notifications coalesce); 20 ms by default. */
  coalesceMs?: number;
  /** The safety recheck's interval while anyone watches; 5 s by default. */
  recheckMs?: number;
  /** Watches on `runs` no more than this many at once per check (larger sets are read in slices). */
  checkBatch?: number;
}

/**
 * The most watched runs the checks read per second: 2,000 watched runs are
 * checked every 40 ms at most, 10,000 every 200 ms. A primary-key probe
 * costs Postgres a few µs, so this bounds the watch to a fraction of a core.
 */
const PROBES_PER_SECOND = 50_000;

interface Pending {
  seenSeq: number;
  wake: () => void;
}

interface Watched {
  tenant_id: string;
  run_id: string;
  pending: Set<Pending>;
}

/** A tenant's default share of `maxWatchers` (RUN_WATCHERS_PER_TENANT unset): a tenth, at least 1. */
export function tenantShare(maxWatchers: number): number {
  return Math.max(1, Math.floor(maxWatchers / 10));
}

/** Seconds a tenant past its share is told to wait (`Retry-After`). */
const TENANT_SHARE_RETRY_AFTER_SECONDS = 5;

/** Why an event stream ended: a fixed set, so it can label a metric. */
export type StreamEnd = "final" | "lifetime" | "stalled" | "gone" | "stopped" | "failed";

/**
 * What this process's event streams hold and did (for metrics): the bytes
 * queued for readers that have not taken them yet, the events written, the
 * streams ended by why.
 */
export class StreamStats {
  readonly #buffered = new Set<() => number>();
  eventsSent = 0;
  readonly ended: Record<StreamEnd, number> = {
    final: 0,
    lifetime: 0,
    stalled: 0,
    gone: 0,
    stopped: 0,
    failed: 0,
  };

  /** Counts `buffered()` (one open stream's queued bytes) until the returned function is called. */
  track(buffered: () => number): () => void {
    this.#buffered.add(buffered);
    return () => this.#buffered.delete(buffered);
  }

  /** Bytes all open streams have queued and their readers not yet taken. */
  get bufferedBytes(): number {
    let sum = 0;
    for (const b of this.#buffered) sum += b();
    return sum;
  }
}

/** A held watcher slot: wait for the run to move, as many times as needed, then close. */
export interface RunWatcher {
  /**
   * Resolves once the run's last event seq is past `seenSeq`, or `signal`
   * aborts, or the watch stops. `epoch` is `RunWatch.epoch` as it was before
   * the read that gave `seenSeq`: a notification since then checks at once,
   * so a change committed between the read and this call is not missed.
   */
  next(seenSeq: number, epoch: number, signal: AbortSignal): Promise<void>;
  /** Gives the slot back; safe to call twice. */
  close(): void;
}

/** See the module comment. */
export class RunWatch implements Service {
  readonly #sql: Sql;
  readonly #opts: Required<Omit<RunWatchOptions, "listen">>;
  readonly #perTenant = new Map<string, number>();
  /** Event streams' counters, read by metrics. */
  readonly streamStats = new StreamStats();
  readonly #listener: Listener;
  readonly #runs = new Map<string, Watched>();
  #slots = 0;
  #epoch = 0;
  #checking: Promise<void> | undefined;
  #again = false;
  #lastCheck = -Infinity;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #recheck: ReturnType<typeof setInterval> | undefined;
  #stopped = false;

  constructor(sql: Sql, opts: RunWatchOptions) {
    this.#sql = sql;
    this.#opts = {
      coalesceMs: 20,
      recheckMs: 5 * SECOND,
      checkBatch: 5000,
      maxWatchers: opts.maxWatchers,
      maxPerTenant: opts.maxPerTenant ?? opts.maxWatchers,
      streamMaxMs: opts.streamMaxMs ?? 15 * MINUTE,
      streamStallMs: opts.streamStallMs ?? 30 * SECOND,
      log: opts.log,
    };
    const poke = () => this.#notified();
    this.#listener = new Listener({
      connect: opts.listen,
      channels: { [OUTBOX_CHANNEL]: poke, [CANCEL_CHANNEL]: poke },
      onListen: poke,
      log: opts.log,
    });
  }

  /** Watchers held now (for metrics). */
  get watchers(): number {
    return this.#slots;
  }

  /** An event stream's limits: its lifetime and how long its reader may stall. */
  get streamLimits(): { maxMs: number; stallMs: number } {
    return { maxMs: this.#opts.streamMaxMs, stallMs: this.#opts.streamStallMs };
  }

  /** Counts notifications: see `RunWatcher.next`. */
  get epoch(): number {
    return this.#epoch;
  }

  /** Whether it stopped: streams end, waits answer with what they have. */
  get stopped(): boolean {
    return this.#stopped;
  }

  async start(): Promise<void> {
    await this.#listener.start();
    this.#recheck = setInterval(() => {
      if (this.#runs.size > 0) this.#notified();
    }, this.#opts.recheckMs);
  }

  /** Wakes every watcher (they answer with what they have) and stops listening; safe twice. */
  stop: () => Promise<void> = once(async () => {
    this.#stopped = true;
    clearInterval(this.#recheck);
    clearTimeout(this.#timer);
    for (const w of this.#runs.values()) for (const p of w.pending) p.wake();
    await this.#listener.stop();
    await this.#checking;
  });

  /**
   * Takes a watcher slot for one run; throws `too-many-streams` when the
   * tenant holds its share, `busy` when all are taken.
   */
  open(tenantId: string, runId: string): RunWatcher {
    const held = this.#perTenant.get(tenantId) ?? 0;
    // A share that is the whole process (the default without the API's
    // share) is the process's bound: `busy`, below.
    if (held >= this.#opts.maxPerTenant && this.#opts.maxPerTenant < this.#opts.maxWatchers) {
      throw new PoimenError(
        "too-many-streams",
        `tenant ${tenantId} holds ${this.#opts.maxPerTenant} waits and streams on this API ` +
          `process (RUN_WATCHERS_PER_TENANT); close one or retry later`,
        { retryAfterSeconds: TENANT_SHARE_RETRY_AFTER_SECONDS },
      );
    }
    if (this.#slots >= this.#opts.maxWatchers) {
      throw new PoimenError(
        "busy",
        `this API process holds ${this.#opts.maxWatchers} waits and streams (RUN_WATCHERS_MAX); retry later`,
      );
    }
    this.#slots++;
    this.#perTenant.set(tenantId, held + 1);
    const key = `${tenantId}/${runId}`;
    let closed = false;
    return {
      next: (seenSeq, epoch, signal) => this.#next(key, tenantId, runId, seenSeq, epoch, signal),
      close: () => {
        if (closed) return;
        closed = true;
        this.#slots--;
        const left = (this.#perTenant.get(tenantId) ?? 1) - 1;
        if (left > 0) this.#perTenant.set(tenantId, left);
        else this.#perTenant.delete(tenantId);
      },
    };
  }

  #next(
    key: string,
    tenantId: string,
    runId: string,
    seenSeq: number,
    epoch: number,
    signal: AbortSignal,
  ): Promise<void> {
    if (this.#stopped || signal.aborted) return Promise.resolve();
    const done = Promise.withResolvers<void>();
    let watched = this.#runs.get(key);
    if (!watched) {
      watched = { tenant_id: tenantId, run_id: runId, pending: new Set() };
      this.#runs.set(key, watched);
    }
    const w = watched;
    const pending: Pending = {
      seenSeq,
      wake: () => {
        signal.removeEventListener("abort", pending.wake);
        w.pending.delete(pending);
        if (w.pending.size === 0 && this.#runs.get(key) === w) this.#runs.delete(key);
        done.resolve();
      },
    };
    w.pending.add(pending);
    signal.addEventListener("abort", pending.wake, { once: true });
    if (this.#epoch !== epoch) this.#notified();
    return done.promise;
  }

  /** A notification (or a recheck): one check soon, coalesced. */
  #notified(): void {
    this.#epoch++;
    if (this.#stopped || this.#runs.size === 0) return;
    if (this.#checking) {
      this.#again = true;
      return;
    }
    if (this.#timer !== undefined) return;
    // Busy workers notify continuously: with many runs watched, checks are
    // spaced so that they probe at most PROBES_PER_SECOND runs a second.
    const spacing = Math.max(this.#opts.coalesceMs, (this.#runs.size / PROBES_PER_SECOND) * SECOND);
    const wait = Math.max(0, this.#lastCheck + spacing - performance.now());
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#checking = this.#check().finally(() => {
        this.#checking = undefined;
        if (this.#again) {
          this.#again = false;
          this.#notified();
        }
      });
    }, wait);
  }

  async #check(): Promise<void> {
    this.#lastCheck = performance.now();
    const all = [...this.#runs.values()];
    try {
      for (let i = 0; i < all.length; i += this.#opts.checkBatch) {
        const slice = all.slice(i, i + this.#opts.checkBatch);
        const seqs = await selectEventSeqs(this.#sql, slice);
        for (const [j, row] of seqs.entries()) {
          const w = slice[j];
          for (const p of [...w.pending]) {
            // Gone (purged) counts as moved: the caller reads again and finds out.
            if (row.event_seq === null || row.event_seq > p.seenSeq) p.wake();
          }
        }
      }
    } catch (err) {
      // The recheck tries again; waits end at their deadline meanwhile.
      this.#opts.log.warn("run watch check failed", { error: err });
    }
  }
}
