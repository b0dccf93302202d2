/**
 * Per-tenant quotas at the API's door (migration 012, `deno task tenant`): a
 * tenant's most queued runs (`max_queued`) and its admission rate
 * (`admission_rate`, runs per second). Past either, `POST /v1/runs` is a 429
 * (`queue-full`, `rate-limited`) with `Retry-After`, and nothing is written:
 * the gate answers before the run reaches the admission batcher.
 *
 * What one API process knows, and how stale it may be:
 *
 * - the quota table (the tenants with a quota, a small table) is read every
 *   `refreshMs` (QUOTA_REFRESH_MS), so a changed quota takes effect within
 *   that delay, without a restart;
 * - for each tenant with a `max_queued` that asked for admissions lately, its
 *   queued runs are counted at the same pace, capped at its `max_queued`
 *   (db/tenant_quotas.ts: one range of the queue index, bounded by the cap).
 *   Between two counts, the runs this process admitted since (and those it is
 *   admitting) are added to the count, so a burst into one process cannot
 *   overshoot; what other API processes admit is seen at the next count: the
 *   queue may exceed `max_queued` by at most what the other processes admit
 *   in one interval. Runs that workers claimed meanwhile are likewise seen
 *   late, which refuses for at most an interval more than needed;
 * - the rate is a token bucket per tenant in each process, holding at most
 *   max(1, rate) tokens (the burst): with N API processes behind a balancer a
 *   tenant may be admitted at up to N × rate.
 *
 * A replay of a `dispatch_key` already admitted is refused like a new run
 * when the tenant is over its quota: telling them apart would take a read
 * per request, and a 429 is retryable, so a replay is answered once the
 * tenant is under its quota again. A replay that gets through does not count
 * as a queued run.
 */
import { PoimenError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { once, type Service } from "../core/lifecycle.ts";
import type { Sql } from "../db/pool.ts";
import { countQueuedRuns, selectTenantQuotas } from "../db/tenant_quotas.ts";

/** Why the gate refused an admission: the problem code and the metric label. */
export type QuotaRefusal = "queue-full" | "rate-limited";

/** Options of `QuotaGate`. */
export interface QuotaGateOptions {
  /** How often the quotas and the counts are read again (QUOTA_REFRESH_MS). */
  refreshMs: number;
  log: Logger;
  /** Each refusal (metrics). */
  onRefused?: (tenantId: string, reason: QuotaRefusal) => void;
  /** The clock, in milliseconds (tests); performance.now() by default. */
  now?: () => number;
}

/** A tenant's quota use as the gate sees it (metrics, tests). */
export interface QuotaView {
  tenantId: string;
  maxQueued: number | null;
  rate: number | null;
  /** Queued runs: the last count plus what this process admitted since; undefined when not counted. */
  queued: number | undefined;
}

/** A count of a tenant's queued runs is dropped after this many refreshes without an admission. */
const IDLE_REFRESHES = 10;
/** Counts read at once during a refresh (each holds a pooled connection). */
const COUNTS_AT_ONCE = 4;

/**
 * A token bucket: `rate` tokens a second, holding at most max(1, rate), full
 * at first. Pure arithmetic on the times it is given.
 */
export class TokenBucket {
  #rate: number;
  #tokens: number;
  #at: number;

  constructor(rate: number, now: number) {
    this.#rate = rate;
    this.#tokens = TokenBucket.capacity(rate);
    this.#at = now;
  }

  /** The most tokens a bucket of `rate` holds: its burst. */
  static capacity(rate: number): number {
    return Math.max(1, rate);
  }

  /** Changes the rate from `now` on (the tokens earned so far are kept, up to the new capacity). */
  setRate(rate: number, now: number): void {
    this.#refill(now);
    this.#rate = rate;
    this.#tokens = Math.min(this.#tokens, TokenBucket.capacity(rate));
  }

  /** Tokens held at `now`. */
  tokens(now: number): number {
    this.#refill(now);
    return this.#tokens;
  }

  /** Takes one token: 0 when taken, else the milliseconds until one is due. */
  take(now: number): number {
    this.#refill(now);
    if (this.#tokens >= 1) {
      this.#tokens -= 1;
      return 0;
    }
    return ((1 - this.#tokens) / this.#rate) * 1000;
  }

  #refill(now: number): void {
    if (now > this.#at) {
      const earned = ((now - this.#at) / 1000) * this.#rate;
      this.#tokens = Math.min(TokenBucket.capacity(this.#rate), this.#tokens + earned);
    }
    this.#at = Math.max(this.#at, now);
  }
}

interface Quota {
  maxQueued: number | null;
  rate: number | null;
}

/** A tenant's queued runs as this process knows them. */
interface QueuedCount {
  /** The last count read from Postgres (capped at max_queued). */
  counted: number;
  /** Runs this process admitted since that count started. */
  admitted: number;
  /** Admissions past the gate whose answer has not come yet. */
  pending: number;
  /** Refreshes since this tenant last asked; dropped at IDLE_REFRESHES. */
  idle: number;
}

/** The per-tenant quota gate of one API process (see the module's comment). */
export class QuotaGate implements Service {
  readonly #sql: Sql;
  readonly #opts: QuotaGateOptions;
  readonly #now: () => number;
  #quotas = new Map<string, Quota>();
  readonly #buckets = new Map<string, TokenBucket>();
  readonly #counts = new Map<string, QueuedCount>();
  /** A tenant's first count, read on its first admission (shared by the callers meanwhile). */
  readonly #firstCounts = new Map<string, Promise<void>>();
  #loaded = false;
  #inFlight: Promise<void> | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #stopped = false;

  constructor(sql: Sql, opts: QuotaGateOptions) {
    this.#sql = sql;
    this.#opts = opts;
    this.#now = opts.now ?? (() => performance.now());
  }

  /** Seconds a queue-full caller is told to wait: the refresh interval, rounded up, at least 1. */
  get queueFullRetryAfter(): number {
    return Math.max(1, Math.ceil(this.#opts.refreshMs / 1000));
  }

  /** Reads the quotas (when Postgres answers; otherwise the first admission or the timer tries again). */
  async start(): Promise<void> {
    await this.refresh().catch((error) =>
      this.#opts.log.warn("tenant quotas not read; retrying", { error })
    );
    this.#schedule();
  }

  /** Stops refreshing; safe to call twice. */
  stop: () => Promise<void> = once(async () => {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#inFlight?.catch(() => {});
  });

  /**
   * Runs `admit` unless the tenant is over a quota, in which case it throws a
   * 429 `PoimenError` and `admit` is never called. A run `admit` says it
   * created counts as queued until the next count.
   */
  async admit<T extends { created: boolean }>(
    tenantId: string,
    admit: () => Promise<T>,
  ): Promise<T> {
    if (!this.#loaded) await this.refresh();
    const quota = this.#quotas.get(tenantId);
    if (quota === undefined) return await admit();
    let count: QueuedCount | undefined;
    if (quota.maxQueued !== null) {
      count = await this.#count(tenantId, quota.maxQueued);
      if (count !== undefined) {
        count.idle = 0;
        if (queuedOf(count) >= quota.maxQueued) {
          throw this.#refuse(tenantId, "queue-full", this.queueFullRetryAfter, quota);
        }
      }
    }
    if (quota.rate !== null) {
      let bucket = this.#buckets.get(tenantId);
      if (bucket === undefined) {
        bucket = new TokenBucket(quota.rate, this.#now());
        this.#buckets.set(tenantId, bucket);
      }
      const waitMs = bucket.take(this.#now());
      if (waitMs > 0) {
        throw this.#refuse(tenantId, "rate-limited", Math.max(1, Math.ceil(waitMs / 1000)), quota);
      }
    }
    if (count === undefined) return await admit();
    // Counted before the answer, so that concurrent admissions see each other.
    count.pending++;
    let created = false;
    try {
      const result = await admit();
      created = result.created;
      return result;
    } finally {
      count.pending--;
      if (created) count.admitted++;
    }
  }

  /** Each tenant with a quota as last read, with its queued count where counted. */
  view(): QuotaView[] {
    return [...this.#quotas].map(([tenantId, q]) => {
      const count = this.#counts.get(tenantId);
      return {
        tenantId,
        maxQueued: q.maxQueued,
        rate: q.rate,
        queued: count === undefined ? undefined : queuedOf(count),
      };
    });
  }

  /**
   * Reads the quota table, then counts the queued runs of the tenants with a
   * `max_queued` that asked lately. One refresh at a time: a call while one
   * runs shares it.
   */
  refresh(): Promise<void> {
    this.#inFlight ??= this.#load().finally(() => this.#inFlight = undefined);
    return this.#inFlight;
  }

  async #load(): Promise<void> {
    const rows = await selectTenantQuotas(this.#sql);
    const quotas = new Map<string, Quota>();
    const now = this.#now();
    for (const row of rows) {
      quotas.set(row.tenant_id, { maxQueued: row.max_queued, rate: row.admission_rate });
      const bucket = this.#buckets.get(row.tenant_id);
      if (row.admission_rate === null) this.#buckets.delete(row.tenant_id);
      else bucket?.setRate(row.admission_rate, now);
    }
    for (const tenantId of this.#buckets.keys()) {
      if (!quotas.has(tenantId)) this.#buckets.delete(tenantId);
    }
    this.#quotas = quotas;
    this.#loaded = true;
    const recount: [string, number, QueuedCount][] = [];
    for (const [tenantId, count] of this.#counts) {
      const max = quotas.get(tenantId)?.maxQueued ?? null;
      if (max === null || ++count.idle > IDLE_REFRESHES) this.#counts.delete(tenantId);
      else recount.push([tenantId, max, count]);
    }
    for (let i = 0; i < recount.length; i += COUNTS_AT_ONCE) {
      await Promise.all(
        recount.slice(i, i + COUNTS_AT_ONCE).map(async ([tenantId, max, count]) => {
          const before = count.admitted;
          try {
            count.counted = await countQueuedRuns(this.#sql, tenantId, max);
            // Admitted before the count started: committed, so in it. Those
            // answered during it may be counted twice until the next count.
            count.admitted -= before;
          } catch (error) {
            this.#opts.log.warn("queued runs not counted", { tenant: tenantId, error });
          }
        }),
      );
    }
  }

  /** The tenant's count, read now if this process has none yet. */
  async #count(tenantId: string, maxQueued: number): Promise<QueuedCount | undefined> {
    const known = this.#counts.get(tenantId);
    if (known !== undefined) return known;
    let first = this.#firstCounts.get(tenantId);
    if (first === undefined) {
      first = countQueuedRuns(this.#sql, tenantId, maxQueued).then((counted) => {
        this.#counts.set(tenantId, { counted, admitted: 0, pending: 0, idle: 0 });
      }).finally(() => this.#firstCounts.delete(tenantId));
      this.#firstCounts.set(tenantId, first);
    }
    await first;
    return this.#counts.get(tenantId);
  }

  #refuse(tenantId: string, reason: QuotaRefusal, retryAfter: number, quota: Quota): PoimenError {
    this.#opts.onRefused?.(tenantId, reason);
    const detail = reason === "queue-full"
      ? `tenant ${tenantId} has ${quota.maxQueued} queued runs, its max_queued`
      : `tenant ${tenantId} may admit ${quota.rate} runs per second`;
    return new PoimenError(reason, detail, { retryAfterSeconds: retryAfter });
  }

  #schedule(): void {
    if (this.#stopped) return;
    this.#timer = setTimeout(async () => {
      try {
        await this.refresh();
      } catch (error) {
        this.#opts.log.warn("tenant quotas not read; retrying", { error });
      }
      this.#schedule();
    }, this.#opts.refreshMs);
  }
}

function queuedOf(count: QueuedCount): number {
  return count.counted + count.admitted + count.pending;
}
