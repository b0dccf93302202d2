/**
 * Commits the relay's done offsets in batches: every `intervalMs`, or as
 * soon as `batch` messages are done since the last commit, each partition's
 * done prefix (its `OffsetTracker` never lets a commit pass a message not
 * done). One commit at a time; a call while one runs joins it.
 */
import type { Logger } from "../core/log.ts";
import { once } from "../core/lifecycle.ts";
import { SECOND, within } from "../core/time.ts";
import type { KafkaConsumer } from "../kafka/consumer.ts";
import type { RelayMetrics } from "./metrics.ts";
import type { OffsetTracker } from "./offsets.ts";

/** Longest the final commit may take at stop before the group is left anyway. */
const FINAL_COMMIT_MS = 5 * SECOND;

/** A partition whose done prefix is committed. */
export interface Committable {
  readonly topic: string;
  readonly partition: number;
  readonly tracker: OffsetTracker;
}

/** What the committer talks to. */
export interface OffsetCommitterDeps {
  consumer: Pick<KafkaConsumer, "commit">;
  metrics: Pick<RelayMetrics, "commits">;
  log: Logger;
}

/** Batched, one-at-a-time commits of what `partitions()` holds done. */
export class OffsetCommitter {
  readonly #deps: OffsetCommitterDeps;
  readonly #intervalMs: number;
  readonly #batch: number;
  readonly #partitions: () => Iterable<Committable>;
  #doneSinceCommit = 0;
  #committing: Promise<void> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(
    opts: { intervalMs: number; batch: number },
    deps: OffsetCommitterDeps,
    partitions: () => Iterable<Committable>,
  ) {
    this.#deps = deps;
    this.#intervalMs = opts.intervalMs;
    this.#batch = opts.batch;
    this.#partitions = partitions;
  }

  /** Commits every `intervalMs` from now on. */
  start(): void {
    this.#timer ??= setInterval(() => void this.commit(), this.#intervalMs);
  }

  /** A message was done: commits now once a batch of them is. */
  done(): void {
    if (++this.#doneSinceCommit >= this.#batch) void this.commit();
  }

  /** Commits every partition's done prefix; one commit at a time, a later call joins the one running. */
  commit(): Promise<void> {
    if (this.#committing) return this.#committing;
    const batch: { tracker: OffsetTracker; topic: string; partition: number; offset: bigint }[] =
      [];
    for (const { topic, partition, tracker } of this.#partitions()) {
      const offset = tracker.toCommit();
      if (offset !== undefined) batch.push({ tracker, topic, partition, offset });
    }
    if (batch.length === 0) return Promise.resolve();
    this.#doneSinceCommit = 0;
    this.#committing = this.#deps.consumer.commit(
      batch.map(({ topic, partition, offset }) => ({ topic, partition, offset })),
    ).then(() => {
      for (const { tracker, offset } of batch) tracker.committed(offset);
      this.#deps.metrics.commits.inc();
    }, (error) => {
      // Only after close(); the offsets stay committable for the next try.
      this.#deps.log.debug("commit failed", { error });
    }).finally(() => {
      this.#committing = undefined;
    });
    return this.#committing;
  }

  /**
   * Stops the timer and makes the final commit (the one running, then one of
   * what is done by now), waiting at most `FINAL_COMMIT_MS`.
   */
  readonly stop: () => Promise<void> = once(async () => {
    clearInterval(this.#timer);
    const committed = await within(this.commit().then(() => this.commit()), FINAL_COMMIT_MS);
    if (!committed) {
      this.#deps.log.warn("final commit did not finish; those messages will be redelivered");
    }
  });
}
