/**
 * A bound on the request bodies the API holds at once. The body limit caps
 * one request; this caps their sum, from the moment a body is read until its
 * response is ready (the raw bytes, the parsed JSON, the admission batch that
 * carries it). Without it, a few dozen concurrent 1 MiB requests make the
 * heap as large as they like (parsed JSON can take about 40 times its size:
 * 64 clients took an API to 2.8 GB); with it, what bodies take is bounded.
 *
 * A request takes its declared size up front (taking bytes as they arrive
 * instead lets bodies that are all half read hold the whole budget and wait
 * for each other until they time out). So that no caller can take the budget
 * from the others by declaring large bodies and sending them slowly, it is
 * shared out: one tenant holds at most `tenantShare` of it (its further
 * requests wait for its own to finish), tenants together leave
 * `serviceReserve` for service tokens (the relay), and a request waits only
 * behind requests of its own caller, never behind another caller's larger
 * one. Idle uploads thus delay only their own tenant, until
 * BODY_READ_TIMEOUT_MS ends them.
 */
import { PoimenError } from "../core/errors.ts";

interface Waiter {
  bytes: number;
  tenant: string | undefined;
  grant: () => void;
}

/** How the budget is shared out; each defaults to no limit beyond the total. */
export interface BodyBudgetShares {
  /** Most bytes one tenant's requests hold at once (at most the total). */
  tenantBytes?: number;
  /** Bytes tenants' requests leave for service tokens' (at most the total less one tenant share). */
  serviceBytes?: number;
}

// The queue key of service tokens' requests (tenant ids are strings).
const SERVICE = Symbol("service");

/**
 * Bytes of request bodies granted at once, shared out between callers: a
 * tenant's requests (`tenant` given) hold at most `tenantShare` and, all
 * tenants together, `total - serviceReserve`; service tokens' requests
 * (`tenant` undefined) may use the whole. Each caller's requests are served in
 * arrival order; callers take turns.
 */
export class BodyBudget {
  readonly total: number;
  readonly tenantShare: number;
  readonly serviceReserve: number;
  #free: number;
  #tenantsHeld = 0;
  readonly #held = new Map<string, number>();
  // One queue per waiting caller, in the order callers started waiting.
  readonly #queues = new Map<string | symbol, Waiter[]>();
  #waiting = 0;

  constructor(totalBytes: number, shares: BodyBudgetShares = {}) {
    this.total = totalBytes;
    this.tenantShare = Math.min(shares.tenantBytes ?? totalBytes, totalBytes);
    this.serviceReserve = Math.min(shares.serviceBytes ?? 0, totalBytes - this.tenantShare);
    this.#free = totalBytes;
  }

  /** Bytes not granted right now. */
  get free(): number {
    return this.#free;
  }

  /** Requests waiting for bytes. */
  get waiting(): number {
    return this.#waiting;
  }

  /** Bytes `tenant`'s requests hold now. */
  heldBy(tenant: string): number {
    return this.#held.get(tenant) ?? 0;
  }

  /**
   * Waits up to `waitMs` for `bytes` for a request of `tenant` (undefined: a
   * service token's) and returns the function that gives them back (calling
   * it again does nothing). A request never waits for more than its caller's
   * whole share. Rejects with a retryable `busy` error when the wait runs
   * out. A caller's requests are served in order (its large body is not
   * passed over forever by its small ones); another caller's small request
   * that fits goes ahead. A request whose `signal` aborts (its client went
   * away) leaves the queue at once.
   */
  async acquire(
    bytes: number,
    waitMs: number,
    tenant?: string,
    signal?: AbortSignal,
  ): Promise<() => void> {
    return this.tryAcquire(bytes, tenant) ??
      await this.#wait(
        { bytes: this.#clamp(bytes, tenant), tenant, grant: () => {} },
        waitMs,
        signal,
      );
  }

  /** `acquire` when the bytes are free now (and none of the caller's requests waits): no promise, no timer. */
  tryAcquire(bytes: number, tenant?: string): (() => void) | undefined {
    const want = this.#clamp(bytes, tenant);
    if (this.#waiting > 0 && this.#queues.has(tenant ?? SERVICE)) return undefined;
    if (!this.#fits(want, tenant)) return undefined;
    this.#take(want, tenant);
    return this.#releaser(want, tenant);
  }

  #clamp(bytes: number, tenant: string | undefined): number {
    return Math.min(Math.max(0, bytes), tenant === undefined ? this.total : this.tenantShare);
  }

  #fits(want: number, tenant: string | undefined): boolean {
    if (want > this.#free) return false;
    if (tenant === undefined) return true;
    return this.heldBy(tenant) + want <= this.tenantShare &&
      this.#tenantsHeld + want <= this.total - this.serviceReserve;
  }

  #take(want: number, tenant: string | undefined): void {
    this.#free -= want;
    if (tenant === undefined) return;
    this.#tenantsHeld += want;
    this.#held.set(tenant, this.heldBy(tenant) + want);
  }

  async #wait(waiter: Waiter, waitMs: number, signal?: AbortSignal): Promise<() => void> {
    const granted = Promise.withResolvers<void>();
    waiter.grant = granted.resolve;
    const key = waiter.tenant ?? SERVICE;
    const queue = this.#queues.get(key);
    if (queue) queue.push(waiter);
    else this.#queues.set(key, [waiter]);
    this.#waiting++;
    const leave = (err: unknown) => {
      const queue = this.#queues.get(key);
      const i = queue?.indexOf(waiter) ?? -1;
      if (i < 0) return; // granted meanwhile
      queue!.splice(i, 1);
      if (queue!.length === 0) this.#queues.delete(key);
      this.#waiting--;
      // It may have been the head that held back those behind it.
      this.#grant();
      granted.reject(err);
    };
    // A timer only for a request that has to wait: the common path sets none.
    const timer = setTimeout(
      () =>
        leave(
          new PoimenError("busy", "too many request bodies are being processed; retry later"),
        ),
      waitMs,
    );
    // What the client, gone, never sees; a 400 in the metrics, not a 500 in the logs.
    const gone = () =>
      leave(new PoimenError("body-unreadable", "the client went away before its body was read"));
    if (signal?.aborted) gone();
    else signal?.addEventListener("abort", gone, { once: true });
    try {
      await granted.promise;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", gone);
    }
    return this.#releaser(waiter.bytes, waiter.tenant);
  }

  #releaser(bytes: number, tenant: string | undefined): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#free += bytes;
      if (tenant !== undefined) {
        this.#tenantsHeld -= bytes;
        const held = this.heldBy(tenant) - bytes;
        if (held > 0) this.#held.set(tenant, held);
        else this.#held.delete(tenant);
      }
      if (this.#waiting > 0) this.#grant();
    };
  }

  /**
   * Grants what now fits: each waiting caller's first request in turn (a
   * caller served goes to the back, so callers take turns), skipping a
   * caller whose first request does not fit, so one caller's large request
   * holds back only its own.
   */
  #grant(): void {
    // Map iteration visits a key deleted and set again during it once more, at the end.
    for (const [key, queue] of this.#queues) {
      const w = queue[0];
      if (!this.#fits(w.bytes, w.tenant)) continue;
      queue.shift();
      this.#waiting--;
      this.#take(w.bytes, w.tenant);
      this.#queues.delete(key);
      if (queue.length > 0) this.#queues.set(key, queue);
      w.grant();
    }
  }
}
