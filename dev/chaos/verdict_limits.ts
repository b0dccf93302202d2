/**
 * The concurrency limit's chaos invariants (dev/chaos/plan.ts' KEYED), held
 * against the runs and the samples of its groups. Pure, like
 * dev/chaos/verdict.ts, whose summary they join.
 */
import type { Flag, LimitInfo, Observed } from "./verdict.ts";
import type { Plan } from "./plan.ts";
import type { SlotGroup } from "./observe.ts";

/**
 * The concurrency limit: no sample with more of a group's runs running
 * than the limit, every run of the limited workflow in its planned group,
 * and the slot counts equal to the runs (each sample is one snapshot, so
 * they must agree at every one, not only after the drain).
 */
export function checkLimits(plan: Plan, seen: Observed, flag: Flag): LimitInfo {
  const { workflow, limit } = plan.limited;
  const planned = new Map<string, string>();
  for (const m of plan.messages) {
    if (m.group !== undefined) planned.set(`${m.tenant}/${m.dispatchKey}`, m.group);
  }
  for (const r of seen.runs) {
    if (r.workflowName !== workflow) continue;
    const expected = planned.get(`${r.tenant}/${r.dispatchKey}`);
    if (r.concurrencyKey === null || (expected !== undefined && r.concurrencyKey !== expected)) {
      flag(
        "overlimit",
        r.tenant,
        `run ${r.runId} (${r.dispatchKey}) of ${workflow} has concurrency key ` +
          `${r.concurrencyKey}, expected ${expected ?? "one"}`,
      );
    }
  }

  const { samples, failed, final } = seen.slots;
  if (samples.length === 0) {
    flag(
      "overlimit",
      "",
      `no sample of the concurrency groups (${failed} failed): the limit went unchecked`,
    );
  }
  const label = (g: SlotGroup) => `${g.workflow}/${g.key}`;
  const drift = (g: SlotGroup, when: string) => {
    if (g.running === (g.slotRunning ?? 0) && g.queued === (g.slotQueued ?? 0)) return;
    flag(
      "slotdrift",
      g.tenant,
      `${label(g)} ${when}: runs say ${g.running} running, ${g.queued} queued; ` +
        (g.slotRunning === null
          ? "no concurrency_slots row"
          : `concurrency_slots says ${g.slotRunning} running, ${g.slotQueued} queued`),
    );
  };
  const groups = new Set<string>();
  let maxRunning = 0, contended = 0;
  for (const sample of samples) {
    const when = `at +${(sample.at / 1000).toFixed(1)} s`;
    let full = false;
    for (const g of sample.groups) {
      drift(g, when);
      if (g.workflow !== workflow) continue;
      groups.add(`${g.tenant}/${g.key}`);
      maxRunning = Math.max(maxRunning, g.running);
      if (g.running >= limit && g.queued > 0) full = true;
      if (g.running > limit) {
        flag("overlimit", g.tenant, `${label(g)} ${when}: ${g.running} running (limit ${limit})`);
      }
    }
    if (full) contended++;
  }
  for (const g of final) {
    drift(g, "after the drain");
    if (g.workflow === workflow && g.maxRunning !== null && g.maxRunning !== limit) {
      flag(
        "slotdrift",
        g.tenant,
        `${
          label(g)
        }: concurrency_slots.max_running is ${g.maxRunning}, the definition says ${limit}`,
      );
    }
  }
  return {
    samples: samples.length,
    failedSamples: failed,
    maxRunning,
    contended,
    groups: groups.size,
  };
}
