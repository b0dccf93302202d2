/**
 * The claim loop of a worker: claims due queued runs (SKIP LOCKED, under a
 * lease) into its free slots, then sleeps until the poll interval is over or
 * something wakes it (a NOTIFY, a freed slot, a retry falling due).
 *
 * Slots: at most `concurrency` handlers run at once, and as many runs again
 * may be held while their outcome is written, so a slow database bounds how
 * many finish in memory. A claim costs about the same for one run as for
 * sixteen (its commit and the tenant scan dominate): while runs are
 * finishing, a few slots are let free up before claiming, for at most
 * CLAIM_COALESCE_MS.
 */
import type { Logger } from "../core/log.ts";
import { backoffWithJitter, delay, SECOND } from "../core/time.ts";
import type { WakeableSleep } from "../core/wakeable_sleep.ts";
import type { Sql } from "../db/pool.ts";
import { type ClaimedRun, claimLimitedRuns, claimRuns, type HostedVersions } from "../db/claims.ts";

/** What the claim loop needs of its worker. */
export interface ClaimLoopContext {
  sql: Sql;
  /** The worker's lease owner id. */
  owner: string;
  concurrency: number;
  leaseMs: number;
  pollMs: number;
  /** The versions the worker hosts without a concurrency limit: it claims runs of these only. */
  hosted: HostedVersions;
  /** The versions it hosts that declare a concurrency limit (claimed by `claimLimitedRuns`). */
  limited?: HostedVersions;
  log: Logger;
  /** The wait between claims; the worker wakes it. */
  sleep: WakeableSleep;
  /** Ends the loop. */
  stopping: AbortSignal;
  /** Handlers running now. */
  handlers(): number;
  /** Runs held now: running, or writing their outcome. */
  held(): number;
  /** Hands over the runs a claim sent at `claimedAt` returned (maybe none). */
  claimed(runs: ClaimedRun[], claimedAt: number): void;
}

const CLAIM_COALESCE_MS = 5;
// A failing claim backs off from this to ten seconds.
const CLAIM_RETRY_BASE_MS = 100;
const CLAIM_RETRY_CAP_MS = 10 * SECOND;

/** Claims until `ctx.stopping` aborts; see the module comment. */
export async function claimLoop(ctx: ClaimLoopContext): Promise<void> {
  const { concurrency, owner, leaseMs, pollMs, sleep, stopping } = ctx;
  let failures = 0;
  const minClaim = Math.max(1, Math.floor(concurrency / 4));
  let coalescingSince: number | undefined;
  const unlimited = ctx.hosted.names.length > 0;
  const limited = ctx.limited !== undefined && ctx.limited.names.length > 0;
  // Limited and unlimited runs are two statements (db/claims.ts); which
  // goes first alternates, so when both have more due than there are free
  // slots, each gets half the claims.
  let limitedFirst = false;
  const claimBoth = async (free: number): Promise<ClaimedRun[]> => {
    const one = (kind: "limited" | "unlimited", n: number) =>
      kind === "limited"
        ? claimLimitedRuns(ctx.sql, owner, n, leaseMs, ctx.limited!)
        : claimRuns(ctx.sql, owner, n, leaseMs, ctx.hosted);
    if (!limited) return await one("unlimited", free);
    if (!unlimited) return await one("limited", free);
    limitedFirst = !limitedFirst;
    const [first, second] = limitedFirst
      ? ["limited", "unlimited"] as const
      : ["unlimited", "limited"] as const;
    const got = await one(first, free);
    if (got.length >= free) return got;
    try {
      return got.concat(await one(second, free - got.length));
    } catch (err) {
      // The first claim committed: its runs must run (or wait for their
      // lease to expire), so a failure of the second only delays its own.
      ctx.log.warn("claim failed", { error: err, kind: second });
      return got;
    }
  };
  while (!stopping.aborted) {
    const handlers = ctx.handlers();
    const free = Math.min(concurrency - handlers, 2 * concurrency - ctx.held());
    if (free > 0 && free < minClaim && handlers > 0) {
      coalescingSince ??= Date.now();
      const left = coalescingSince + CLAIM_COALESCE_MS - Date.now();
      if (left > 0) {
        await sleep.sleep(left);
        continue;
      }
    }
    coalescingSince = undefined;
    if (free > 0) {
      // Cleared before the claim: a wake-up arriving while it runs is kept
      // and makes the next wait return at once.
      sleep.clear();
      const claimedAt = Date.now();
      let claimed: ClaimedRun[];
      try {
        claimed = await claimBoth(free);
        failures = 0;
      } catch (err) {
        failures++;
        ctx.log.warn("claim failed", { error: err, failures });
        await delay(
          backoffWithJitter(failures, CLAIM_RETRY_BASE_MS, CLAIM_RETRY_CAP_MS),
          stopping,
        );
        continue;
      }
      ctx.claimed(claimed, claimedAt);
      // A full batch suggests more are due: claim again without waiting.
      if (claimed.length === free) continue;
    }
    await sleep.sleep(pollMs);
  }
}
