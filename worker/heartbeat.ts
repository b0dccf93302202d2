/**
 * A worker's lease renewal: one statement every third of a lease renews the
 * leases of all the runs it holds (db/leases.ts's `renewLeases`, one commit
 * however many runs), and carries each run's cancel request (read from its
 * row) to its handler. A run found lost (fenced: reclaimed, claimed by
 * another worker or a newer attempt) has its handler aborted and nothing of
 * the attempt is written; the others go on.
 *
 * Each renewal is bounded by a timeout (a third of the lease, and never past
 * the latest lease this worker last confirmed) and then cancelled: a renewal
 * stuck on a lock or a dead connection must not keep handlers running on
 * leases that have run out. A renewal that timed out counts as failed (it
 * may or may not have been written): a lease is only extended by a renewal
 * that answered. Each run's own lease is watched apart: when it runs out
 * unconfirmed (renewals failing, timing out, or its row held by another
 * statement), that run's handler is aborted, whatever the batch does.
 */
import type { Logger } from "../core/log.ts";
import { once, type Service } from "../core/lifecycle.ts";
import { delay } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import { renewLeases } from "../db/leases.ts";
import { type Attempt, loseLease } from "./attempt.ts";
import type { WorkerHooks } from "./hooks.ts";

/** What the renewer needs of its worker. */
export interface LeaseRenewerOptions {
  sql: Sql;
  /** The worker's lease owner id. */
  owner: string;
  leaseMs: number;
  hooks: WorkerHooks;
  log: Logger;
}

// After a failed renewal (or a run skipped as busy), try again sooner, but
// not in a tight loop.
const RETRY_MS = 250;

/** Renews the leases of the attempts `add`ed until they are `remove`d; see the module comment. */
export class LeaseRenewer implements Service {
  readonly #opts: LeaseRenewerOptions;
  readonly #every: number;
  readonly #held = new Map<string, Attempt>();
  /** Per held attempt, the timer that aborts it when its lease runs out unconfirmed. */
  readonly #expiry = new Map<string, ReturnType<typeof setTimeout>>();
  readonly #stopping = new AbortController();
  #nudge = new AbortController();
  #loop: Promise<void> = Promise.resolve();
  #started = false;

  constructor(opts: LeaseRenewerOptions) {
    this.#opts = opts;
    this.#every = opts.leaseMs / 3;
  }

  /** Attempts whose leases it renews. */
  get size(): number {
    return this.#held.size;
  }

  /** Renews `attempt`'s lease from now on, until `remove` (or its lease is lost). */
  add(attempt: Attempt): void {
    this.#held.set(attempt.key, attempt);
    this.#watch(attempt);
  }

  /** Stops renewing `attempt`'s lease (its run is over, or given up). */
  remove(attempt: Attempt): void {
    if (this.#held.get(attempt.key) !== attempt) return;
    this.#held.delete(attempt.key);
    clearTimeout(this.#expiry.get(attempt.key));
    this.#expiry.delete(attempt.key);
  }

  /** Renews at once (a cancel notification: the handler learns of it sooner). */
  nudge(): void {
    this.#nudge.abort();
  }

  start(): Promise<void> {
    if (this.#started) throw new Error("lease renewer already started");
    this.#started = true;
    this.#loop = this.#run();
    return Promise.resolve();
  }

  /**
   * Stops renewing, after the renewal in flight; the attempts still held
   * keep their expiry watch until removed. Safe to call twice.
   */
  readonly stop: () => Promise<void> = once(async () => {
    this.#stopping.abort();
    await this.#loop;
    for (const t of this.#expiry.values()) clearTimeout(t);
    this.#expiry.clear();
  });

  /** (Re)arms the timer that aborts `attempt` when its confirmed lease runs out. */
  #watch(attempt: Attempt): void {
    clearTimeout(this.#expiry.get(attempt.key));
    const t = setTimeout(() => {
      if (this.#held.get(attempt.key) !== attempt) return;
      this.remove(attempt);
      if (!attempt.done.signal.aborted) loseLease(attempt, "lease expired");
    }, Math.max(0, attempt.lease.until - Date.now()));
    this.#expiry.set(attempt.key, t);
  }

  async #run(): Promise<void> {
    const stop = this.#stopping.signal;
    let wait = this.#every;
    while (!stop.aborted) {
      this.#nudge = new AbortController();
      await delay(wait, AbortSignal.any([stop, this.#nudge.signal]));
      if (stop.aborted) return;
      wait = await this.#renew();
    }
  }

  /** One renewal of every lease held; resolves with the wait before the next. */
  async #renew(): Promise<number> {
    const { sql, owner, leaseMs, hooks, log } = this.#opts;
    const batch = [...this.#held.values()].filter((a) => !a.done.signal.aborted);
    if (batch.length === 0) return this.#every;
    const sentAt = Date.now();
    const latest = Math.max(...batch.map((a) => a.lease.until));
    const timeout = AbortSignal.timeout(Math.max(1, Math.min(this.#every, latest - sentAt)));
    let results;
    try {
      results = await renewLeases(
        sql,
        owner,
        batch.map((a) => ({
          tenant_id: a.run.tenant_id,
          run_id: a.run.run_id,
          attempt: a.run.attempts,
        })),
        leaseMs,
        // Not the stop signal: a renewal in flight when the worker stops is
        // left to finish. Cancelling is a request to the backend, which may
        // by then run the connection's next statement; only one that hangs
        // is worth it.
        timeout,
      );
    } catch (err) {
      if (timeout.aborted && err === timeout.reason) {
        hooks.onHeartbeatTimeout?.();
        log.warn("lease renewal timed out; leases unconfirmed", {
          runs: batch.length,
          lease_left_ms: latest - Date.now(),
        });
      } else log.warn("lease renewal failed", { error: err, runs: batch.length });
      return Math.min(this.#every, RETRY_MS);
    }
    hooks.onLeasesRenewed?.(batch.length);
    let busy = false;
    batch.forEach((attempt, i) => {
      // Over meanwhile (finished, or its lease ran out): nothing to learn.
      if (this.#held.get(attempt.key) !== attempt || attempt.done.signal.aborted) return;
      const held = results[i];
      if (held === "lost") {
        this.remove(attempt);
        hooks.onFenced?.("heartbeat");
        return loseLease(attempt, "lease lost (heartbeat fenced)");
      }
      if (held === "busy") {
        // Its row is held by another statement (its own finishing write, a
        // cancel): unconfirmed, asked again soon; its expiry watch stands.
        busy = true;
        return;
      }
      attempt.lease.until = sentAt + leaseMs;
      this.#watch(attempt);
      // Renewal goes on: the lease must outlive the handler winding down.
      if (held === "cancel-requested" && !attempt.cancelRequested) {
        attempt.cancelRequested = true;
        attempt.log.info("cancel requested; aborting the run");
        attempt.abort.abort(new DOMException("run cancelled on request", "AbortError"));
      }
    });
    return busy ? Math.min(this.#every, RETRY_MS) : this.#every;
  }
}
