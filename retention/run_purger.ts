/**
 * Retention of finished runs, a maintenance service of the outbox process
 * (in the manner of River's job cleaner). Every `intervalMs` it deletes runs
 * that finished more than RUN_RETENTION_MS ago, with their events, in
 * batches of `batchSize`, each batch one short statement that skips rows
 * others hold and never touches a queued or running run.
 *
 * Why it may never purge a run younger than the dispatch topics keep their
 * messages: exactly-once lives in the admission index. A dispatch message
 * redelivered (a relay restarted before committing its offset, a consumer
 * group reset to the earliest offset) must find its run by `dispatch_key`;
 * once the run is purged, the same message would create a second run. So
 * the window must cover the longest a dispatch message stays readable,
 * which is its topic's `retention.ms` plus `segment.ms` (Kafka deletes a
 * whole segment once its newest message is past retention, and the active
 * segment rolls only after segment.ms). That is checked at start-up (a
 * shorter window refuses to start) and again before every round (new
 * tenants, changed topics): a round whose window is too short purges
 * nothing and says so. Each round also deletes the concurrency groups idle
 * that long (`purgeIdleConcurrencyGroups`).
 *
 * It is a retention job, not part of shipping events, hence its own module;
 * it runs in the outbox process because that process already talks to both
 * Postgres and Kafka (the worker never talks to Kafka), and deleting a run's
 * events is safe only once the outbox shipped them. Its statement is
 * `purgeFinishedRuns` (db/retention.ts).
 */
import { MaintenanceService } from "../core/maintenance.ts";
import type { Logger } from "../core/log.ts";
import { DAY } from "../core/time.ts";
import { dispatchTopic } from "../contracts/topics.ts";
import type { KafkaAdmin } from "../kafka/admin.ts";
import { purgeFinishedRuns, purgeIdleConcurrencyGroups } from "../db/retention.ts";
import type { Sql } from "../db/pool.ts";

/** How long dispatch messages stay readable, at most, and which topic says so. */
export interface DispatchRetention {
  /** Milliseconds; Infinity when a topic keeps messages forever (`retention.ms` -1). */
  ms: number;
  /** What sets it: a topic name, or a variable. */
  source: string;
  /** How it was reckoned, for people. */
  detail: string;
}

// Kafka's default segment.ms (log.roll.ms), when a topic reports none.
const DEFAULT_SEGMENT_MS = 7 * DAY;

/** `ms` for people: days when at least one, else hours, minutes, seconds or ms. */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return "forever";
  const units: [number, string][] = [[DAY, "d"], [3_600_000, "h"], [60_000, "min"], [1000, "s"]];
  for (const [size, name] of units) {
    if (ms >= size) return `${Number((ms / size).toFixed(2))}${name}`;
  }
  return `${ms}ms`;
}

/**
 * The longest any of `tenants`' dispatch topics keeps a message
 * (`retention.ms` + `segment.ms`, or forever), read from the broker; topics
 * that do not exist yet are skipped. `floor` (what new tenants' topics will
 * be declared with: TOPIC_RETENTION_MS) counts too.
 */
export async function readDispatchRetention(
  admin: KafkaAdmin,
  tenants: string[],
  floor: DispatchRetention,
): Promise<DispatchRetention> {
  const configs = await admin.topicConfigs(
    tenants.map(dispatchTopic),
    ["retention.ms", "segment.ms"],
  );
  let longest = floor;
  for (const [topic, c] of configs) {
    const retention = Number(c["retention.ms"] ?? NaN);
    const segment = Number(c["segment.ms"] ?? DEFAULT_SEGMENT_MS);
    const forever = retention < 0 || !Number.isFinite(retention);
    const ms = forever ? Infinity : retention + segment;
    if (ms > longest.ms) {
      longest = {
        ms,
        source: topic,
        detail: forever
          ? `${topic} keeps messages forever (retention.ms ${c["retention.ms"] ?? "unset"})`
          : `${topic} may keep a message ${formatDuration(ms)} (retention.ms ${
            formatDuration(retention)
          } + segment.ms ${formatDuration(segment)})`,
      };
    }
  }
  return longest;
}

/**
 * Why a purge window of `runRetentionMs` is not allowed with `dispatch`, as
 * one line naming RUN_RETENTION_MS; undefined when it is.
 */
export function retentionProblem(
  runRetentionMs: number,
  dispatch: DispatchRetention,
): string | undefined {
  if (runRetentionMs >= dispatch.ms) return undefined;
  return `config: RUN_RETENTION_MS is invalid: ${
    formatDuration(runRetentionMs)
  } is shorter than dispatch messages live (${dispatch.detail}); a redelivered message must ` +
    `still find its run. Raise RUN_RETENTION_MS, or set RUN_PURGE_INTERVAL_MS=0 to keep runs`;
}

/** What the purger reports; none may throw. */
export interface RunPurgerHooks {
  /** After a round: runs and events it deleted. */
  onPurged?(runs: number, events: number): void;
  /** Whether purging is held back (window shorter than the dispatch retention, or that unknown). */
  onHeld?(held: boolean): void;
}

/** Options of `RunPurger`. */
export interface RunPurgerOptions {
  /** RUN_RETENTION_MS: finished runs older than this are deleted. */
  retentionMs: number;
  /** Time between two rounds. */
  intervalMs: number;
  /** Runs deleted per statement. */
  batchSize: number;
  /** How long dispatch messages live now; asked before every round. */
  dispatchRetention: () => Promise<DispatchRetention>;
  log: Logger;
  hooks?: RunPurgerHooks;
}

// One round deletes at most this many batches, then yields to the next interval.
const MAX_BATCHES_PER_ROUND = 100;

/** Deletes finished runs past retention until stopped; see the module comment. */
export class RunPurger extends MaintenanceService {
  readonly #sql: Sql;
  readonly #opts: RunPurgerOptions;
  // What the last round logged, so a lasting state is logged once.
  #held: string | undefined;
  #failing = false;

  constructor(sql: Sql, opts: RunPurgerOptions) {
    super("run purger", opts.log);
    this.#sql = sql;
    this.#opts = opts;
  }

  protected nextWaitMs(first: boolean): number {
    return first ? 0 : this.#opts.intervalMs;
  }

  /** One round: check the window, then purge batch after batch. */
  protected async round(signal: AbortSignal): Promise<void> {
    const { retentionMs, batchSize, log, hooks } = this.#opts;
    let dispatch: DispatchRetention;
    try {
      dispatch = await this.#opts.dispatchRetention();
    } catch (error) {
      this.#hold("the dispatch topics' retention cannot be read; purging nothing until it can", {
        error,
      });
      return;
    }
    const problem = retentionProblem(retentionMs, dispatch);
    if (problem) {
      this.#hold(`${problem}; purging nothing`, { topic: dispatch.source });
      return;
    }
    if (this.#held !== undefined) log.info("run purge resumes", { window: retentionMs });
    this.#held = undefined;
    hooks?.onHeld?.(false);
    try {
      let runs = 0, events = 0;
      for (let i = 0; i < MAX_BATCHES_PER_ROUND && !signal.aborted; i++) {
        const n = await purgeFinishedRuns(this.#sql, retentionMs, batchSize);
        runs += n.runs;
        events += n.events;
        if (n.runs < batchSize) break;
      }
      hooks?.onPurged?.(runs, events);
      if (runs > 0) log.info("purged finished runs", { runs, events });
      // Concurrency groups idle as long as a finished run is kept: their
      // keys are not in use any more.
      const groups = await purgeIdleConcurrencyGroups(this.#sql, retentionMs, batchSize);
      if (groups > 0) log.info("purged idle concurrency groups", { groups });
      if (this.#failing) log.info("run purge works again");
      this.#failing = false;
    } catch (error) {
      if (!this.#failing) log.warn("run purge failed; retrying next interval", { error });
      this.#failing = true;
    }
  }

  #hold(why: string, fields: Record<string, unknown>): void {
    // Logged when it starts or its reason changes, not every interval.
    if (this.#held !== why) this.#opts.log.error(why, fields);
    this.#held = why;
    this.#opts.hooks?.onHeld?.(true);
  }
}
