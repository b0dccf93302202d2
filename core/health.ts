/**
 * Readiness, the same way in every process: `/readyz` runs the process's
 * own dependency probes (Postgres for api/worker/outbox; the broker and the
 * API for the relay) at once, each bounded by `AbortSignal.timeout`, and is
 * ready only when all of them answer. `/healthz` (alive) never probes.
 */
import type { Logger } from "./log.ts";
import { SECOND } from "./time.ts";

/** How long one probe may take before it counts as failed. */
export const PROBE_TIMEOUT_MS = 2 * SECOND;

/** One dependency probe: resolves when the dependency answers; should give up when `signal` aborts. */
export type Probe = (signal: AbortSignal) => Promise<unknown>;

/** What `/readyz` reports: per probe, "ok" or why not ("timeout", "unavailable"). */
export interface Readiness {
  ready: boolean;
  checks: Record<string, "ok" | "timeout" | "unavailable">;
}

/**
 * Settles like `promise`, or rejects with the signal's reason as soon as
 * `signal` aborts; for calls that take no signal of their own (a postgres.js
 * query, a Kafka admin request). Removes its listener either way, so nothing
 * is left behind per probe. The abandoned call still settles on its own
 * timeouts; its outcome is swallowed.
 */
export function abortable<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    promise.catch(() => {});
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** Runs every probe at once, each with its own `AbortSignal.timeout(timeoutMs)`. */
export async function checkReadiness(
  probes: Record<string, Probe>,
  log: Logger,
  timeoutMs = PROBE_TIMEOUT_MS,
): Promise<Readiness> {
  const names = Object.keys(probes);
  const results = await Promise.all(names.map(async (name) => {
    const signal = AbortSignal.timeout(timeoutMs);
    try {
      await probes[name](signal);
      return "ok" as const;
    } catch (err) {
      // Why it failed goes to the log, not the response: the endpoint may be
      // reachable by more people than the logs are.
      log.debug("readiness probe failed", { probe: name, error: err });
      return signal.aborted ? "timeout" as const : "unavailable" as const;
    }
  }));
  const checks = Object.fromEntries(names.map((n, i) => [n, results[i]]));
  return { ready: results.every((r) => r === "ok"), checks };
}

/** A probe that GETs `url` and wants a 2xx. */
export function httpProbe(url: string): Probe {
  return async (signal) => {
    const res = await fetch(url, { signal });
    await res.body?.cancel();
    if (!res.ok) throw new Error(`${url} answered ${res.status}`);
  };
}
