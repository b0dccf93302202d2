/**
 * The concurrency slot reconciler, a maintenance service: it walks
 * `concurrency_slots` a few groups per round and sets a group's `running`
 * and `queued` back to the runs they count when they drifted (db/slot_reconcile.ts
 * says how a correction stays exact beside claims and admissions). A
 * correction is a bug somewhere, or a hand edit: each is logged (a warning
 * naming the group and both counts) and counted
 * (`poimen_concurrency_slot_corrections_total`), never silent.
 *
 * Cheap by construction: at most `groupsPerRound` groups a round, one round
 * every `intervalMs`; a cursor carries the walk from round to round, so
 * every group is looked at once per ⌈groups / groupsPerRound⌉ rounds. Each
 * check is one short transaction: lock the group's row (skipping it when a
 * claim holds it), count its runs (two index ranges), fix.
 */
import client from "prom-client";
import type { Logger } from "../core/log.ts";
import { IntervalMaintenance } from "../core/maintenance.ts";
import { SECOND } from "../core/time.ts";
import type { Sql } from "../db/pool.ts";
import {
  correctSlot,
  lockSlot,
  selectSlotGroups,
  type SlotCorrection,
  type SlotGroup,
} from "../db/slot_reconcile.ts";

export type { SlotCorrection } from "../db/slot_reconcile.ts";

/** Options of `SlotReconciler`. */
export interface SlotReconcilerOptions {
  /** Mean time between two rounds (jittered ±25%). */
  intervalMs: number;
  /** Groups checked in one round at most. */
  groupsPerRound: number;
  log: Logger;
  /** After each correction; must not throw. */
  onCorrected?(correction: SlotCorrection): void;
}

// A failing round waits longer each time, up to this.
const DB_RETRY_CAP_MS = 60 * SECOND;

/** Checks `groupsPerRound` concurrency groups every `intervalMs` until stopped. */
export class SlotReconciler extends IntervalMaintenance {
  readonly #sql: Sql;
  readonly #opts: SlotReconcilerOptions;
  #after: SlotGroup | undefined;

  constructor(sql: Sql, opts: SlotReconcilerOptions) {
    super("slot reconciler", opts.log, {
      intervalMs: opts.intervalMs,
      retryCapMs: DB_RETRY_CAP_MS,
      failedMessage: "slot reconcile failed",
    });
    this.#sql = sql;
    this.#opts = opts;
  }

  protected async work(signal: AbortSignal): Promise<void> {
    await this.reconcile(signal);
  }

  /**
   * One round: checks the next `groupsPerRound` groups of the walk (from the
   * first again once it reached the end) and returns the corrections made.
   */
  async reconcile(signal?: AbortSignal): Promise<SlotCorrection[]> {
    const groups = await selectSlotGroups(this.#sql, this.#after, this.#opts.groupsPerRound);
    // Fewer than asked: the walk reached the end; the next round starts over.
    this.#after = groups.length < this.#opts.groupsPerRound ? undefined : groups.at(-1);
    const corrections: SlotCorrection[] = [];
    for (const group of groups) {
      if (signal?.aborted) break;
      const correction = await this.#check(group);
      if (!correction) continue;
      corrections.push(correction);
      this.#opts.log.warn("concurrency slot counts drifted from their runs; corrected", {
        tenant: group.tenant_id,
        workflow: group.workflow_name,
        concurrency_key: group.concurrency_key,
        running_was: correction.was.running,
        running: correction.now.running,
        queued_was: correction.was.queued,
        queued: correction.now.queued,
      });
      this.#opts.onCorrected?.(correction);
    }
    return corrections;
  }

  async #check(group: SlotGroup): Promise<SlotCorrection | undefined> {
    return await this.#sql.begin(async (tx) => {
      const was = await lockSlot(tx, group);
      // Held by a claim (or gone): it comes round again.
      if (!was) return undefined;
      const { counts, corrected } = await correctSlot(tx, group);
      return corrected ? { ...group, was, now: counts } : undefined;
    });
  }
}

/**
 * Registers `poimen_concurrency_slot_corrections_total` in `registry`;
 * returns the hook that counts a correction.
 */
export function slotCorrectionMetric(
  registry: client.Registry,
): (correction: SlotCorrection) => void {
  const corrections = new client.Counter({
    name: "poimen_concurrency_slot_corrections_total",
    help: "Concurrency groups whose running/queued counts had drifted from their runs and were " +
      "corrected by the slot reconciler (each one a bug or a hand edit)",
    registers: [registry],
  });
  return () => corrections.inc();
}
