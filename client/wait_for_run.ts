/**
 * `PoimenClient.waitForRun`: reads of a run that the API holds until it is
 * final (`Prefer: wait=N`, RFC 7240), again until the caller's deadline.
 *
 * @module
 */
import { FINAL_STATUSES, MAX_WAIT_SECONDS, type Run } from "../contracts/wire.ts";
import { SECOND } from "../core/time.ts";
import { type RequestOptions, sleep, transient } from "./retry.ts";

/** Options of `waitForRun`. */
export interface WaitForRunOptions extends Omit<RequestOptions, "timeoutMs" | "deadlineMs"> {
  /**
   * How long to wait for the run to be final, in ms. Requests ask for whole
   * seconds, so the call resolves within about half a second of it (more
   * when the API is slow to answer).
   */
  timeoutMs: number;
}

/** The `Prefer: wait` seconds of `ms`: rounded up, at most `MAX_WAIT_SECONDS`. */
export function waitSeconds(ms: number): number {
  return Math.min(MAX_WAIT_SECONDS, Math.max(0, Math.ceil(ms / SECOND)));
}

/**
 * One read of the run asking the API to wait `wait` seconds (none when 0),
 * retried by `request`; `counted` wraps each attempt, so that the loop
 * knows whether its retries were spent. `waited`: the API applied the wait.
 */
export type WaitingRead = (
  wait: number,
  request: RequestOptions,
  counted: <T>(attempt: Promise<T>) => Promise<T>,
) => Promise<{ run: Run; waited: boolean }>;

/**
 * Reads the run until it is final or `opts.timeoutMs` passed; resolves with
 * the run as last seen. The first read is bounded by the retry rules alone
 * (without a run there is nothing to resolve with); later ones also by the
 * deadline, and a deadline that comes first, mid-wait or before a retry,
 * resolves with the run last seen.
 */
export async function waitForFinal(
  opts: WaitForRunOptions,
  maxAttempts: number,
  read: WaitingRead,
): Promise<Run> {
  const deadline = Date.now() + opts.timeoutMs;
  let run: Run | undefined;
  for (;;) {
    const remaining = deadline - Date.now();
    // Whole seconds: the nearest keeps the end within half a second of the deadline.
    const wait = Math.min(MAX_WAIT_SECONDS, Math.max(0, Math.round(remaining / SECOND)));
    if (run && (FINAL_STATUSES.has(run.status) || wait === 0)) return run;
    let attempts = 0;
    try {
      const request = {
        ...opts,
        timeoutMs: undefined,
        deadlineMs: run === undefined ? undefined : remaining + SECOND,
      };
      const answer = await read(wait, request, (attempt) => (attempts++, attempt));
      run = answer.run;
      // An API that does not wait (it does not say it applied it) is asked once a second.
      if (wait > 0 && !answer.waited && !FINAL_STATUSES.has(run.status)) {
        await sleep(Math.min(SECOND, Math.max(0, deadline - Date.now())), opts.signal);
      }
    } catch (err) {
      const late = attempts < maxAttempts || Date.now() >= deadline;
      if (run && !opts.signal?.aborted && transient(err) && late) return run;
      throw err;
    }
  }
}
