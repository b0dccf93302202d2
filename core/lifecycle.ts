/**
 * Long-running parts implement `Service`: `start()` once, `stop()` any
 * number of times (the second call waits for the first). A process runs its
 * parts with core/process_harness.ts.
 */

export interface Service {
  /** `signal`, when given, is aborted if the stop is asked for while this still starts. */
  start(signal?: AbortSignal): Promise<void>;
  stop(): Promise<void>;
}

/** Wraps a stop function so that calling it twice is safe and both calls wait for one stop. */
export function once(stop: () => Promise<void>): () => Promise<void> {
  let stopping: Promise<void> | undefined;
  return () => (stopping ??= stop());
}
