/** Durations in milliseconds, so configuration reads like `5 * SECOND`. */
export const MILLISECOND = 1;
export const SECOND = 1000 * MILLISECOND;
export const MINUTE = 60 * SECOND;
export const HOUR = 60 * MINUTE;
export const DAY = 24 * HOUR;

/** Resolves after `ms`, or early (without throwing) when `signal` aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Waits for `work` at most `ms`: true when it resolved in time, false when
 * the time ran out first (it is not cancelled); rejects when it rejects in
 * time. Unlike racing it against `delay(ms)`, it leaves no timer behind, which
 * would hold a stopping process (or fail a sanitized test) for the rest of `ms`.
 */
export async function within(work: Promise<unknown>, ms: number): Promise<boolean> {
  const done = new AbortController();
  try {
    return await Promise.race([work.then(() => true), delay(ms, done.signal).then(() => false)]);
  } finally {
    done.abort();
  }
}

/**
 * Exponential backoff with full jitter (AWS architecture blog): a uniformly
 * random wait in [0, min(cap, base * 2^attempt)). Full jitter spreads retries
 * of many clients that failed together, which equal jitter does not.
 */
export function backoffWithJitter(
  attempt: number,
  base: number,
  cap: number,
  random: () => number = Math.random,
): number {
  const ceiling = Math.min(cap, base * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * ceiling);
}
