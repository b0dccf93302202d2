/**
 * Waiting on Kafka client library work with a deadline: some of its calls
 * have been seen never to call back (see `ConsumerRecovery` in consumer.ts),
 * and nothing of the consumer may wait on one for good.
 */
import { delay } from "../core/time.ts";

/** What waiting on library work with a deadline came to. */
export type Settled<T> = { value: T } | "timed-out" | "stopped";

/**
 * Waits for `work` at most `ms`, or until `signal` aborts; what it yields
 * after that goes to `orphan` (e.g. a stream nobody will read is closed).
 * Rejects when `work` rejects in time.
 */
export async function settleWithin<T>(
  work: Promise<T>,
  ms: number,
  signal: AbortSignal,
  orphan: (value: T) => unknown = () => {},
): Promise<Settled<T>> {
  const done = new AbortController();
  const stopped = AbortSignal.any([signal, done.signal]);
  try {
    const outcome = await Promise.race<Settled<T>>([
      work.then((value) => ({ value })),
      delay(ms, stopped).then(() => signal.aborted ? "stopped" : "timed-out"),
    ]);
    if (typeof outcome === "string") work.then(orphan).catch(() => {});
    return outcome;
  } finally {
    done.abort();
  }
}
