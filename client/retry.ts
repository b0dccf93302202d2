/**
 * How `PoimenClient` retries a call: exponential backoff with full jitter,
 * never shorter than the server's `Retry-After`, bounded by attempts, a
 * deadline and the caller's signal.
 *
 * @module
 */
import { backoffWithJitter, SECOND } from "../core/time.ts";
import { PoimenNetworkError, PoimenProblem, refusedForNow } from "./problems.ts";

/** How a call retries; every field has a default. */
export interface RetryOptions {
  /** Attempts in all, the first included (default 6; 1 = no retry). */
  maxAttempts?: number;
  /**
   * The call gives up this many ms after it began (default: never): an
   * attempt still waiting then times out, and a retry that could not start
   * before it (a backoff or `Retry-After` past it) is not made.
   */
  deadlineMs?: number;
  /** First backoff ceiling, in ms; it doubles per retry (default 200). */
  baseDelayMs?: number;
  /** Largest backoff ceiling, in ms (default 10 s); a longer `Retry-After` still wins. */
  maxDelayMs?: number;
}

/** What `onRetry` is told before each retry. */
export interface RetryInfo {
  /** The attempt that failed (1 = the first). */
  attempt: number;
  /** How long the client waits before the next attempt. */
  delayMs: number;
  /** Why the attempt failed. */
  error: PoimenProblem | PoimenNetworkError;
}

/** Options of one call. */
export interface RequestOptions extends RetryOptions {
  /** Aborts the call (also while it waits to retry); it rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Longest one attempt may take, in ms (default: the client's, 30 s). */
  timeoutMs?: number;
  /** Called before each retry, e.g. to log it. */
  onRetry?: (info: RetryInfo) => void;
}

/** The retry settings every call has, from the call's options, else the client's, else these. */
export const DEFAULT_RETRY: Required<Omit<RetryOptions, "deadlineMs">> = {
  maxAttempts: 6,
  baseDelayMs: 200,
  maxDelayMs: 10 * SECOND,
};

/** Whether a failure is worth another attempt of a request that is safe to repeat. */
export function transient(error: unknown): error is PoimenProblem | PoimenNetworkError {
  if (error instanceof PoimenNetworkError) return true;
  return error instanceof PoimenProblem && (refusedForNow(error.status) || error.status >= 500);
}

/** The retry settings of one call: its own, else the client's, else the defaults. */
export function retrySettings(
  opts: RetryOptions,
  client: RetryOptions,
): Required<Omit<RetryOptions, "deadlineMs">> & { deadlineMs: number | undefined } {
  return {
    maxAttempts: opts.maxAttempts ?? client.maxAttempts ?? DEFAULT_RETRY.maxAttempts,
    baseDelayMs: opts.baseDelayMs ?? client.baseDelayMs ?? DEFAULT_RETRY.baseDelayMs,
    maxDelayMs: opts.maxDelayMs ?? client.maxDelayMs ?? DEFAULT_RETRY.maxDelayMs,
    deadlineMs: opts.deadlineMs ?? client.deadlineMs,
  };
}

/**
 * Runs `attempt` until it succeeds, `retry` says no, or the attempts,
 * deadline or signal end it. `client` holds the client's retry defaults and
 * `timeoutMs` its per-attempt timeout (both overridden by `opts`).
 */
export async function retrying<T>(
  opts: RequestOptions,
  client: RetryOptions,
  timeoutMs: number,
  retry: (error: PoimenProblem | PoimenNetworkError) => boolean,
  attempt: (signal: AbortSignal) => Promise<T>,
): Promise<{ value: T; attempts: number }> {
  const { maxAttempts, baseDelayMs, maxDelayMs, deadlineMs } = retrySettings(opts, client);
  const deadline = deadlineMs === undefined ? Infinity : Date.now() + deadlineMs;
  const attemptMs = opts.timeoutMs ?? timeoutMs;
  for (let n = 1;; n++) {
    opts.signal?.throwIfAborted();
    const timeout = AbortSignal.timeout(Math.max(1, Math.min(attemptMs, deadline - Date.now())));
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    try {
      return { value: await attempt(signal), attempts: n };
    } catch (err) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      const error = timeout.aborted && !(err instanceof PoimenProblem)
        ? new PoimenNetworkError("timeout", `no answer within ${attemptMs} ms`, { cause: err })
        : err;
      if (!(error instanceof PoimenProblem || error instanceof PoimenNetworkError)) throw error;
      if (n >= maxAttempts || !retry(error)) throw error;
      // Exponential backoff with full jitter, never shorter than Retry-After:
      // a Retry-After alone would have every client come back at once.
      const retryAfter = error instanceof PoimenProblem ? error.retryAfterMs ?? 0 : 0;
      const delayMs = Math.max(retryAfter, backoffWithJitter(n - 1, baseDelayMs, maxDelayMs));
      if (Date.now() + delayMs >= deadline) throw error;
      opts.onRetry?.({ attempt: n, delayMs, error });
      await sleep(delayMs, opts.signal);
    }
  }
}

/** Resolves after `ms`; rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, ms);
    function abort() {
      clearTimeout(timer);
      reject(signal!.reason);
    }
    signal?.addEventListener("abort", abort, { once: true });
  });
}
