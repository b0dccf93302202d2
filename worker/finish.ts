/**
 * Finishing attempts: the writes that end an attempt, each fenced by
 * attempt (db/attempt_end.ts). A result is written as `succeeded`; completions of
 * runs that end together share one statement and commit (group commit:
 * short runs would otherwise pay a WAL flush each). A failure is written as
 * a retry with backoff, `failed` after the last attempt, or `cancelled` when
 * a cancel was requested. On shutdown, attempts whose handler is still
 * running are released: given back to the queue unfinished.
 */
import { Batcher } from "../core/batcher.ts";
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import { notifyChannels, OUTBOX_CHANNEL, QUEUE_CHANNEL } from "../db/notify.ts";
import { isUnavailable, type Sql } from "../db/pool.ts";
import {
  type AttemptError,
  completeRuns,
  type Completion,
  failAttempt,
  releaseRun,
} from "../db/attempt_end.ts";
import type { Attempt, AttemptResult } from "./attempt.ts";
import type { WorkerHooks } from "./hooks.ts";
import { boundError, encodeResult } from "./run_output.ts";

/** Options of `Finisher`. */
export interface FinisherOptions {
  sql: Sql;
  /** The worker's lease owner id. */
  owner: string;
  retryBaseMs: number;
  retryCapMs: number;
  /** Largest result (and error) of a run, as JSON bytes (RUN_RESULT_MAX_BYTES). */
  resultMaxBytes: number;
  hooks: WorkerHooks;
  log: Logger;
  /** Called after every finishing write: it appended events (the outbox publisher's wake-up). */
  eventsWritten(): void;
  /** A retry this worker wrote falls due at `at`. */
  retryAt(at: Date): void;
}

// SQLSTATE of a cancelled statement (cancel request or statement_timeout).
const QUERY_CANCELED = "57014";
// A finishing write that failed for the database's sake is retried after this.
const WRITE_RETRY_BASE_MS = 100;
// Completions per statement, and statements at once (each holds a connection).
const COMPLETION_BATCH = 64;
const COMPLETION_FLUSHES = 2;

/** Writes how attempts ended; see the module comment. */
export class Finisher {
  readonly #opts: FinisherOptions;
  readonly #completions: Batcher<Completion, boolean>;

  constructor(opts: FinisherOptions) {
    this.#opts = opts;
    this.#completions = new Batcher(
      (batch) => completeRuns(opts.sql, opts.owner, batch),
      { maxBatch: COMPLETION_BATCH, maxConcurrent: COMPLETION_FLUSHES, gatherTurn: true },
      // A batch that failed for the database's sake is retried by each
      // caller's own #write; bisecting it would only fail it again.
      (err) => !isUnavailable(err),
    );
  }

  /** Writes the end of `attempt`, whose handler ended with `outcome` (unless abandoned or lost). */
  async finish(attempt: Attempt, outcome: AttemptResult): Promise<void> {
    const { hooks } = this.#opts;
    const { run, log } = attempt;
    if (attempt.abandoned) return; // releaseUnfinished() gives it back
    if (attempt.suspended) {
      // The suspend wrote the run's state (waiting, its attempt given back).
      hooks.onFinished?.("suspended");
      return;
    }
    if (attempt.lost) {
      log.warn("lease lost; result discarded", { ok: outcome.ok });
      hooks.onFinished?.("lost");
      return;
    }
    if (!outcome.ok) return await this.#fail(attempt, outcome.error, outcome.final);
    // Encoded here, where it can fail the run, not in the write: the same
    // result would fail every attempt, so the failure is final.
    const encoded = encodeResult(outcome.result, this.#opts.resultMaxBytes);
    if (encoded.error) return await this.#fail(attempt, encoded.error, true);
    if (attempt.cancelRequested) {
      log.info("cancel requested, but the handler returned a result: the run succeeds");
    }
    const completion: Completion = {
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      attempt: run.attempts,
      result_json: encoded.json,
      limited: run.concurrency_key != null,
      child: run.parent_run_id != null,
    };
    const ok = await this.#write(attempt, () => this.#completions.submit(completion));
    hooks.onFinished?.(ok ? "succeeded" : "lost");
    if (ok) log.debug("run succeeded");
    else {
      hooks.onFenced?.("complete");
      log.warn("lease lost before completion (fenced); result discarded");
    }
  }

  async #fail(attempt: Attempt, error: AttemptError, final: boolean): Promise<void> {
    const { sql, owner, retryBaseMs, retryCapMs, resultMaxBytes, hooks } = this.#opts;
    const { run, log } = attempt;
    // attempts - 1: the first retry waits at most the base.
    const backoff = backoffWithJitter(run.attempts - 1, retryBaseMs, retryCapMs);
    const bounded = boundError(error, resultMaxBytes);
    const res = await this.#write(
      attempt,
      () =>
        failAttempt(sql, run.tenant_id, run.run_id, owner, run.attempts, bounded, backoff, final),
    );
    if (!res) {
      // Also what a retried write sees when its first send committed but the
      // reply was lost: the attempt is over either way.
      log.warn("lease lost before the failure was recorded (fenced)", {
        error: bounded.message,
      });
      hooks.onFenced?.("fail");
      hooks.onFinished?.("lost");
    } else if (res.status === "cancelled") {
      log.info("run cancelled", { attempts: res.attempts });
      hooks.onFinished?.("cancelled");
    } else if (res.status === "queued") {
      log.info("attempt failed; retrying", { error: error.message, retry_at: res.retry_at });
      hooks.onFinished?.("retrying");
      this.#opts.retryAt(res.retry_at);
    } else {
      log.warn("run failed", { error: error.message, code: error.code, attempts: res.attempts });
      hooks.onFinished?.("failed");
    }
  }

  /**
   * Runs a finishing write, retrying while Postgres is unavailable (or the
   * statement was cancelled: a statement timeout, an operator, a heartbeat's
   * cancel that reached the connection's next statement) and the lease
   * lasts; after that the run is someone else's (the reclaimer's). A retry
   * is safe because every finishing write is fenced by attempt: one that was
   * applied but whose reply was lost is refused the second time.
   */
  async #write<T>(attempt: Attempt, fn: () => Promise<T>): Promise<T | undefined> {
    for (let n = 1;; n++) {
      try {
        const written = await fn();
        // A fenced write wrote nothing; waking the relay for it is harmless.
        this.#opts.eventsWritten();
        return written;
      } catch (err) {
        const transient = isUnavailable(err) || (err as { code?: string }).code === QUERY_CANCELED;
        if (!transient || Date.now() >= attempt.lease.until) throw err;
        attempt.log.warn("finishing write failed; retrying", { error: err });
        await delay(backoffWithJitter(n, WRITE_RETRY_BASE_MS, SECOND));
      }
    }
  }

  /**
   * After the shutdown wait: aborts the handlers still running, gives their
   * runs back, and waits for the attempts that are only writing their outcome.
   */
  async releaseUnfinished(attempts: Attempt[]): Promise<void> {
    const { sql, owner, hooks, log } = this.#opts;
    const stuck = attempts.filter((a) => !a.settled);
    const writing = attempts.filter((a) => a.settled).map((a) => a.finished);
    let released = 0;
    await Promise.all(stuck.map(async (a) => {
      a.abandoned = true;
      a.done.abort();
      a.abort.abort(new Error("worker shutting down"));
      const { run } = a;
      try {
        const status = await releaseRun(
          sql,
          run.tenant_id,
          run.run_id,
          owner,
          run.attempts,
          "worker shutdown",
        );
        if (status === "queued") released++;
        if (!status) hooks.onFenced?.("release");
        hooks.onFinished?.(
          status === "queued" ? "released" : status === "cancelled" ? "cancelled" : "lost",
        );
        log.info(
          status === "queued"
            ? "run released"
            : status === "cancelled"
            ? "run cancelled"
            : "run already lost",
          { tenant: run.tenant_id, run_id: run.run_id, attempt: run.attempts },
        );
      } catch (err) {
        // Its lease will expire and the reclaimer of another worker takes it.
        log.warn("release failed", { tenant: run.tenant_id, run_id: run.run_id, error: err });
      }
    }));
    // Runs whose handler finished are only writing their outcome: let them.
    await Promise.all(writing);
    // Released runs are due now: wake the workers still running.
    if (released > 0) {
      await notifyChannels(sql, [QUEUE_CHANNEL, OUTBOX_CHANNEL])
        .catch((err) => log.warn("notify failed", { error: err }));
    }
  }
}
