/**
 * The concurrency sampler of a chaos run: from before the first message is
 * published until the drain ends, it reads every concurrency group's runs
 * and slot counts (observe.ts selectSlotGroups) every `intervalMs`, and
 * keeps what it saw for the verdict (`overlimit`, `slotdrift`). A sample
 * that fails (a Postgres fault cut its connection) is counted and skipped:
 * the next one comes an interval later.
 */
import type { Sql } from "../../db/pool.ts";
import { delay } from "../../core/time.ts";
import { selectSlotGroups, type SlotGroup } from "./observe.ts";

/** One sample: the groups with anything running, queued or counted, `at` ms after the start. */
export interface SlotSample {
  at: number;
  groups: SlotGroup[];
}

/** What the sampler saw. */
export interface Sampled {
  samples: SlotSample[];
  /** Samples whose query failed. */
  failed: number;
}

/** A group with nothing in it, as its runs and its row say: not worth keeping. */
function idle(g: SlotGroup): boolean {
  return g.running === 0 && g.queued === 0 && !g.slotRunning && !g.slotQueued;
}

/** Samples `sql` every `intervalMs` until `stop()`, which resolves with the samples. */
export function startSampler(sql: Sql, intervalMs: number): { stop(): Promise<Sampled> } {
  const samples: SlotSample[] = [];
  let failed = 0;
  const stopped = new AbortController();
  const t0 = Date.now();
  const loop = (async () => {
    while (!stopped.signal.aborted) {
      const started = Date.now();
      try {
        const groups = await selectSlotGroups(sql);
        samples.push({ at: started - t0, groups: groups.filter((g) => !idle(g)) });
      } catch {
        failed++;
      }
      await delay(Math.max(0, intervalMs - (Date.now() - started)), stopped.signal);
    }
  })();
  return {
    async stop() {
      stopped.abort();
      await loop;
      return { samples, failed };
    },
  };
}
