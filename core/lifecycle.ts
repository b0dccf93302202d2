/**
 * Process lifecycle. Long-running parts implement `Service`: `start()` once,
 * `stop()` any number of times (the second call waits for the first).
 * `runUntilSignal` starts a service and stops it on SIGTERM or SIGINT.
 */
import type { Logger } from "./log.ts";

export interface Service {
  start(): Promise<void>;
  stop(): Promise<void>;
}

/** Wraps a stop function so that calling it twice is safe and both calls wait for one stop. */
export function once(stop: () => Promise<void>): () => Promise<void> {
  let stopping: Promise<void> | undefined;
  return () => (stopping ??= stop());
}

/** Starts `service`, then resolves after SIGTERM/SIGINT has stopped it. */
export async function runUntilSignal(service: Service, log: Logger): Promise<void> {
  const signalled = Promise.withResolvers<Deno.Signal>();
  const signals: Deno.Signal[] = ["SIGTERM", "SIGINT"];
  const handlers = signals.map((sig) => {
    const h = () => signalled.resolve(sig);
    Deno.addSignalListener(sig, h);
    return [sig, h] as const;
  });
  try {
    await service.start();
    const sig = await signalled.promise;
    log.info("stopping", { signal: sig });
    await service.stop();
    log.info("stopped");
  } finally {
    for (const [sig, h] of handlers) Deno.removeSignalListener(sig, h);
  }
}
