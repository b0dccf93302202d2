/**
 * The inbox lag gauges: every `intervalMs`, the broker's end offsets of the
 * dispatch topics against the group's committed offsets (so messages
 * fetched but stuck behind a dead API count), and the age of the oldest
 * message not done yet.
 *
 * A measurement is bounded: one not answered by the next tick is left to
 * settle by itself and the next tick measures again (KafkaAdmin's calls take
 * no signal to abandon them by). At most `MAX_UNANSWERED` are left like that;
 * past it ticks only age the last view. An answer that comes late still
 * counts, unless a later measurement's came first. While the broker is away
 * the last view is kept and its seconds still age.
 */
import type { Logger } from "../core/log.ts";
import { once } from "../core/lifecycle.ts";
import { delay } from "../core/time.ts";
import type { KafkaAdmin } from "../kafka/admin.ts";
import { partitionKey } from "../kafka/client.ts";
import type { RelayMetrics } from "./metrics.ts";

/** Measurements not settled yet (hung ones included) before another is started. */
const MAX_UNANSWERED = 3;

/** The admin calls a measurement makes. */
export type LagSource = Pick<
  KafkaAdmin,
  "listTopics" | "endOffsets" | "startOffsets" | "committedOffsets"
>;

/** Options of `LagMonitor`. */
export interface LagMonitorOptions {
  groupId: string;
  /** The topics whose lag is measured: the inbox topics the relay drains. */
  isInboxTopic: (topic: string) => boolean;
  /** How often lag is measured; also how long one measurement is waited for. */
  intervalMs: number;
}

/** What the monitor talks to. */
export interface LagMonitorDeps {
  admin: LagSource;
  metrics: Pick<RelayMetrics, "lagMessages" | "lagSeconds">;
  log: Logger;
  /** The timestamp of the oldest message of a partition the relay holds not done yet. */
  oldestPending: (topic: string, partition: number) => number | undefined;
}

type LagView = Map<string, { topic: string; partition: number; lag: bigint }>;

/** Measures lag into the gauges from `start()` to `stop()`. */
export class LagMonitor {
  readonly #opts: LagMonitorOptions;
  readonly #deps: LagMonitorDeps;
  // Last broker view of lag, kept while the broker does not answer.
  #view: LagView = new Map();
  #measuring = false;
  #unanswered = 0;
  #started = 0;
  #applied = 0;
  #wait: AbortController | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #stopped = false;

  constructor(opts: LagMonitorOptions, deps: LagMonitorDeps) {
    this.#opts = opts;
    this.#deps = deps;
  }

  /** Measures now and every `intervalMs`. */
  start(): void {
    if (this.#timer !== undefined || this.#stopped) return;
    this.#timer = setInterval(() => void this.measure(), this.#opts.intervalMs);
    void this.measure();
  }

  /** Stops measuring; a measurement still unanswered is left to settle unheeded. */
  readonly stop: () => Promise<void> = once(() => {
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#wait?.abort();
    return Promise.resolve();
  });

  /** One measurement into the gauges (skipped while the previous one is waited for). */
  async measure(): Promise<void> {
    if (this.#measuring || this.#stopped) return;
    if (this.#unanswered < MAX_UNANSWERED) {
      this.#measuring = true;
      try {
        const answered = await this.#refresh();
        if (!answered) {
          this.#deps.log.debug("lag measurement did not answer in time; measured again next time", {
            within_ms: this.#opts.intervalMs,
          });
        }
      } finally {
        this.#measuring = false;
      }
    } else {
      this.#deps.log.debug("lag measurements still unanswered; the last view is aged", {
        unanswered: this.#unanswered,
      });
    }
    this.#publish();
  }

  /** Refreshes the view; false when it did not answer within the interval. */
  async #refresh(): Promise<boolean> {
    this.#unanswered++;
    const seq = ++this.#started;
    const refreshed = this.#viewNow().then((view) => {
      if (seq > this.#applied) {
        this.#applied = seq;
        this.#view = view;
      }
    }, (error) => {
      // The broker is away: keep the last view, its seconds still age.
      this.#deps.log.debug("lag measurement failed", { error });
    }).finally(() => this.#unanswered--);
    const done = new AbortController();
    this.#wait = done;
    try {
      return await Promise.race([
        refreshed.then(() => true),
        delay(this.#opts.intervalMs, done.signal).then(() => false),
      ]);
    } finally {
      done.abort();
    }
  }

  #publish(): void {
    const { lagMessages, lagSeconds } = this.#deps.metrics;
    const now = Date.now();
    lagMessages.reset();
    lagSeconds.reset();
    for (const { topic, partition, lag } of this.#view.values()) {
      const labels = { topic, partition: String(partition) };
      lagMessages.set(labels, Number(lag));
      const oldest = this.#deps.oldestPending(topic, partition);
      lagSeconds.set(
        labels,
        lag > 0n && oldest !== undefined ? Math.max(0, now - oldest) / 1000 : 0,
      );
    }
  }

  async #viewNow(): Promise<LagView> {
    const { admin } = this.#deps;
    const topics = (await admin.listTopics()).filter(this.#opts.isInboxTopic);
    const [ends, starts, committed] = await Promise.all([
      admin.endOffsets(topics),
      admin.startOffsets(topics),
      admin.committedOffsets(this.#opts.groupId, topics),
    ]);
    const byKey = (offsets: typeof ends) =>
      new Map(offsets.map((o) => [partitionKey(o.topic, o.partition), o.offset]));
    const done = byKey(committed);
    const first = byKey(starts);
    const view: LagView = new Map();
    for (const end of ends) {
      const key = partitionKey(end.topic, end.partition);
      // Waiting: from the committed offset, or from the oldest message retention
      // kept when nothing was committed yet (or the commit points before it).
      const start = first.get(key) ?? 0n;
      const from = done.get(key) ?? start;
      const lag = end.offset - (from > start ? from : start);
      view.set(key, { topic: end.topic, partition: end.partition, lag: lag > 0n ? lag : 0n });
    }
    return view;
  }
}
