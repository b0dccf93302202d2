/** The outbox process's Prometheus metrics, on a registry of its own (never prom-client's global one). */
import client from "prom-client";
import type { Logger } from "../core/log.ts";
import type { OutboxStats } from "../db/outbox.ts";
import type { RunPurgerHooks } from "../retention/run_purger.ts";

/** What the publisher reports as it ships. */
export interface OutboxHooks {
  /** After a publish the broker acknowledged: how many events and how long it took. */
  onPublished(count: number, seconds: number): void;
  /** After a batch that parked events committed: how many it parked. */
  onParked?(count: number): void;
}

// A scrape reads both backlog gauges; one query serves both, and a burst of
// scrapes within this window shares it too.
const STATS_TTL_MS = 500;

/**
 * Creates the outbox metrics on `registry`. The backlog gauges are read from
 * Postgres at scrape time via `stats`; when that fails the last values stay.
 */
export function createOutboxMetrics(
  registry: client.Registry,
  stats: () => Promise<OutboxStats>,
  log: Logger,
) {
  const registers = [registry];
  let last: OutboxStats = { pending: 0, oldestAgeSeconds: 0, parked: 0 };
  let cached: { at: number; value: Promise<OutboxStats> } | undefined;
  let failing = false;

  const current = (): Promise<OutboxStats> => {
    if (!cached || Date.now() - cached.at > STATS_TTL_MS) {
      cached = {
        at: Date.now(),
        value: stats().then((s) => {
          if (failing) log.info("outbox stats readable again");
          failing = false;
          return (last = s);
        }, (error) => {
          if (!failing) log.warn("outbox stats unavailable", { error });
          failing = true;
          return last;
        }),
      };
    }
    return cached.value;
  };

  const pending = new client.Gauge({
    name: "poimen_outbox_pending_events",
    help: "work_events rows not yet published",
    registers,
    async collect() {
      this.set((await current()).pending);
    },
  });
  const oldestAge = new client.Gauge({
    name: "poimen_outbox_oldest_pending_age_seconds",
    help: "Age of the oldest unpublished work_events row (0 when none)",
    registers,
    async collect() {
      this.set((await current()).oldestAgeSeconds);
    },
  });
  const parked = new client.Gauge({
    name: "poimen_outbox_parked_events",
    help: "work_events rows parked: refused for good by the broker or over " +
      "EVENTS_MAX_MESSAGE_BYTES (or behind such an event of their run); never published",
    registers,
    async collect() {
      this.set((await current()).parked);
    },
  });
  const parkedTotal = new client.Counter({
    name: "poimen_outbox_parked_events_total",
    help: "Events this process parked",
    registers,
  });
  const shipped = new client.Counter({
    name: "poimen_outbox_events_shipped_total",
    help: "Events published to Kafka and acknowledged by the broker",
    registers,
  });
  const publishDuration = new client.Histogram({
    name: "poimen_outbox_publish_duration_seconds",
    help: "Time from sending a chunk of events to the broker's acknowledgement",
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
    registers,
  });

  const runsPurged = new client.Counter({
    name: "poimen_outbox_runs_purged_total",
    help: "Finished runs (with their events) this process purged after RUN_RETENTION_MS",
    registers,
  });
  const runPurgeHeld = new client.Gauge({
    name: "poimen_outbox_run_purge_held",
    help: "1 while the run purge is held back: RUN_RETENTION_MS shorter than a dispatch " +
      "topic keeps messages, or that retention unreadable",
    registers,
  });

  const hooks: OutboxHooks = {
    onPublished(count, seconds) {
      shipped.inc(count);
      publishDuration.observe(seconds);
    },
    onParked(count) {
      parkedTotal.inc(count);
    },
  };
  const runPurgerHooks: RunPurgerHooks = {
    onPurged: (runs) => runsPurged.inc(runs),
    onHeld: (held) => runPurgeHeld.set(held ? 1 : 0),
  };
  return {
    registry,
    pending,
    oldestAge,
    parked,
    parkedTotal,
    shipped,
    publishDuration,
    hooks,
    runPurgerHooks,
  };
}
